"""site.yml on a Kubernetes node (a systemd container running the STAND-IN kubelet of molecule/kubelet): the
validation play plans the kubelet settings once, from the run's one node read, the apply play applies that plan in
one gpunuma_apply step (restart mode stop) - the stand-in stopped, its stale CPU checkpoint removed, the config
written, started and healthy - and a re-run ends at the converge check; a hand edit of the config is found by the
check and changed back."""

import base64
import importlib.util
import json
import os
import subprocess

import pytest
import yaml

from ansible_run import BINDIR, ansible_env
from conftest import REPO_ROOT
from containers import Node, needs_docker

pytestmark = [pytest.mark.container, needs_docker]

# The stand-in node of the fleet benchmark (benchmarks/fleet_bench.py --kubelet): one place says what it is.
_spec = importlib.util.spec_from_file_location("fleet_bench", os.path.join(REPO_ROOT, "benchmarks", "fleet_bench.py"))
fleet_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fleet_bench)
CONFIG = fleet_bench.KUBELET_CONFIG
FRESH_CONFIG = fleet_bench.FRESH_KUBELET_CONFIG
STARTS = "/var/lib/kubelet-standin/starts"


@pytest.fixture(scope="module")
def node():
    created = Node()
    try:
        fleet_bench.start_kubelets([created.name])
    except Exception:
        created.remove()
        raise
    yield created
    created.remove()


def _site(tmp_path, node):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {node.name: dict({
        "ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3",
        "gpu_topology_controller_dir": str(tmp_path / "topology"), "gpunuma_profile": "preferred",
        "autonuma_numa_balancing": None,
        "gpunuma_instances": [{"name": "worker", "numa_node": 0, "share_cpus": True,
                               "command": ["/bin/sleep", "infinity"]}]}, **yaml.safe_load(fleet_bench.KUBELET_VARS))}}}))
    proc = subprocess.run([os.path.join(BINDIR, "ansible-playbook"), "-i", str(inventory), "playbooks/site.yml"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
                          env=ansible_env(ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"))
    data = json.loads(proc.stdout[proc.stdout.index("{"):])
    ran = [(play["play"]["name"], task["task"]["name"], result) for play in data["plays"] for task in play["tasks"]
           for host, result in task["hosts"].items() if host == node.name and not result.get("skipped")]
    return proc, ran


def test_site_applies_the_kubelet_plan_of_its_validation_play(node, tmp_path):
    proc, ran = _site(tmp_path, node)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    # Planned once, in the validation play; the apply play changes the node to that plan.
    planned = [play for play, task, _result in ran if task == "kubelet_topology : Plan the kubelet settings"]
    assert len(planned) == 1 and planned[0].startswith("Validate"), [(p, t) for p, t, _r in ran]
    # Its config and checkpoints came with the run's one node read (the discovery's round trip), not a read of
    # its own.
    assert not [t for _p, t, _r in ran if t == "kubelet_topology : Read the kubelet config and checkpoints"]
    (discovery,) = [r for _p, t, r in ran if t == "gpu_topology : Discover the topology"]
    assert json.loads(base64.b64decode(discovery["gpunuma_node"]["files"]["kubelet_config"]["content"])) == FRESH_CONFIG
    assert discovery["gpunuma_node"]["files"]["kubelet_cpu_manager_state"]["exists"] is True
    (applied,) = [result for _play, task, result in ran
                  if task == "kubelet_topology : Write the kubelet settings, the kubelet stopped for a change and started after"]
    assert applied["changed"] and applied["stopped_for_change"] == ["kubelet.service"], applied
    assert applied["started"] == ["kubelet.service"] and applied["removed"] == ["/var/lib/kubelet/cpu_manager_state"]
    config = json.loads(node.sh("cat %s" % CONFIG))
    assert config["cpuManagerPolicy"] == "static" and config["reservedSystemCPUs"], config
    # The stand-in accepted it: healthy, and its checkpoint rewritten under the new policy.
    assert json.loads(node.sh("cat /var/lib/kubelet/cpu_manager_state"))["policyName"] == "static"
    assert node.sh("systemctl is-active kubelet.service").strip() == "active"
    assert len(node.sh("cat %s" % STARTS).splitlines()) == 2  # the fixture's start and the change's
    # The checkpoints as they were before the stop (the stand-in keeps no DRA manager state).
    assert node.sh("ls /var/lib/gpunuma/kubelet-backup").split() == ["cpu_manager_state", "memory_manager_state"]
    assert json.loads(node.sh("cat /var/lib/gpunuma/kubelet-backup/cpu_manager_state"))["policyName"] == "none"
    # A re-run ends at the converge check (the kubelet's reads and writes are in the record): nothing written,
    # the kubelet not restarted.
    proc, ran = _site(tmp_path, node)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert not [task for _play, task, result in ran if result.get("changed")], ran
    (check,) = [r for _p, t, r in ran if t == "Check the node against its converge record"][:1]
    assert check["converged"] is True, check.get("reasons")
    assert not [t for _p, t, _r in ran if t.startswith("kubelet_topology")]
    assert len(node.sh("cat %s" % STARTS).splitlines()) == 2
    # Drift: the CPU Manager policy edited by hand on the node. The check names the read that differs, the full
    # run changes it back (the stand-in restarted once more), and the run after ends at the check again.
    node.sh("sed -i 's/\"static\"/\"none\"/' %s" % CONFIG)
    proc, ran = _site(tmp_path, node)
    assert proc.returncode == 0, proc.stdout[-6000:]
    (check,) = [r for _p, t, r in ran if t == "Check the node against its converge record"][:1]
    assert check["converged"] is False and CONFIG + " differs from what gpunuma wrote" in check["reasons"], check
    assert json.loads(node.sh("cat %s" % CONFIG))["cpuManagerPolicy"] == "static"
    assert len(node.sh("cat %s" % STARTS).splitlines()) == 3
    proc, ran = _site(tmp_path, node)
    (check,) = [r for _p, t, r in ran if t == "Check the node against its converge record"][:1]
    assert check["converged"] is True, check.get("reasons")
