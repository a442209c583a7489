"""site.yml on a two-node fleet: bad input on one node stops the whole run
before any node changes, with a message naming the host, the variable and
what is allowed."""

import os
import subprocess

import pytest
import yaml

from ansible_run import BINDIR, ansible_env
from conftest import REPO_ROOT
from containers import Node, needs_docker



pytestmark = [pytest.mark.container, needs_docker]

GOOD = [{"name": "worker", "numa_node": 0, "share_cpus": True, "command": ["/bin/sleep", "infinity"]}]


@pytest.fixture(scope="module")
def fleet():
    nodes = [Node(), Node()]
    yield nodes
    for node in nodes:
        node.remove()


def run_site(fleet, tmp_path, bad_vars):
    good, bad = fleet
    common = {
        "ansible_connection": "community.docker.docker",
        "ansible_python_interpreter": "/usr/bin/python3",
        "gpu_topology_controller_dir": str(tmp_path / "topology"),
        "numa_binding_settle_seconds": 2,
        "memlock_limit": "4M",
        "memlock_users": ["root"],
        "gpunuma_instances": GOOD,
    }
    inventory = {"all": {"vars": common, "hosts": {good.name: {}, bad.name: bad_vars}}}
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inventory))
    return subprocess.run([os.path.join(BINDIR, "ansible-playbook"), "-i", str(path), "playbooks/site.yml"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, env=ansible_env())


def untouched(node):
    return node.sh("ls /etc/gpunuma/topology.json /etc/gpunuma/plan.json /etc/systemd/system/gpunuma-*.service "
                   "/etc/security/limits.d/90-gpunuma-memlock.conf /etc/sysctl.d/60-gpunuma-* 2>/dev/null || true").strip() == ""


@pytest.mark.parametrize(
    "bad_vars, needles",
    [
        ({"gpunuma_profile": "fastest"}, ["gpunuma_profile", "fastest", "allowed", "strict"]),
        ({"gpunuma_instances": [{"name": "llm", "gpus": [3], "command": ["/bin/true"]}]},
         ["gpunuma_instances[0].gpus[0]", "GPU 3", "allowed"]),
        ({"gpunuma_instances": [{"name": "w", "numa_node": 0, "cpus": "4096-4097", "command": ["/bin/true"]}]},
         ["gpunuma_instances[0].cpus", "allowed"]),
        ({"gpunuma_instances": GOOD + GOOD}, ["gpunuma_instances[1].name", "unique names"]),
        ({"gpunuma_instances": [{"name": "w", "numa_node": 0, "command": "/bin/sleep infinity"}]},
         ["gpunuma_instances[0].command", "list"]),
        ({"memlock_limit": "lots"}, ["memlock_limit", "lots", "allowed"]),
    ],
    ids=["unknown-profile", "missing-gpu", "cpus-outside-node", "duplicate-names", "command-not-list", "memlock-lots"],
)
def test_bad_input_on_one_node_changes_no_node(fleet, tmp_path, bad_vars, needles):
    proc = run_site(fleet, tmp_path, bad_vars)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert fleet[1].name in out
    for needle in needles:
        assert needle in out, (needle, out[-4000:])
    assert untouched(fleet[0]) and untouched(fleet[1])
