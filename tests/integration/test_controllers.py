"""The supported controllers: plan.yml and site.yml on every ansible-core gpunuma claims, either fact setting.

meta/runtime.yml's ``requires_ansible`` names the oldest ansible-core
gpunuma supports; scripts/setup-venv.sh installs it beside the newest
(.venv/cores/<version>, requirements-core-<version>.txt). On each, against
one systemd container: the dry run, a first converge, and a re-run that ends
at the converge check. The project's ansible.cfg keeps facts under
``ansible_facts`` (``inject_facts_as_vars = False``, as many sites set it);
the oldest core also runs with facts injected (ansible-core's default), so
both settings are proven. No run prints a deprecation warning.
"""

import os
import re
import subprocess

import pytest
import yaml

from ansible_run import BINDIR, ansible_env
from conftest import REPO_ROOT
from containers import Node, needs_docker

pytestmark = [pytest.mark.container, needs_docker]

RUNTIME = os.path.join(REPO_ROOT, "collections", "ansible_collections", "gpunuma", "fleet", "meta", "runtime.yml")
NEWEST = os.path.join(REPO_ROOT, ".venv", "bin")


def oldest_core():
    with open(RUNTIME, encoding="utf-8") as handle:
        (floor,) = re.findall(r"^>=(\d+\.\d+)\.0$", yaml.safe_load(handle)["requires_ansible"])
    return floor


def controllers():
    floor = oldest_core()
    return [("newest", NEWEST, None, "False"), (floor, os.path.join(REPO_ROOT, ".venv", "cores", floor, "bin"), floor, "True")]


def core_version(bindir):
    out = subprocess.run([os.path.join(bindir, "ansible"), "--version"], capture_output=True, text=True, check=True).stdout
    return re.search(r"\[core (\d+\.\d+)\.\d+\]", out).group(1)


def test_the_claimed_floor_is_installed_and_the_newest_is_newer():
    floor = oldest_core()
    assert core_version(os.path.join(REPO_ROOT, ".venv", "cores", floor, "bin")) == floor
    newest = core_version(NEWEST)
    assert tuple(map(int, newest.split("."))) > tuple(map(int, floor.split(".")))
    with open(os.path.join(REPO_ROOT, "ansible.cfg"), encoding="utf-8") as handle:
        assert re.search(r"^inject_facts_as_vars = False$", handle.read(), re.M)


@pytest.fixture(scope="module")
def node():
    created = Node()
    yield created
    created.remove()


def run(bindir, inject, playbook, inventory, *extra):
    env = ansible_env(PATH=bindir + os.pathsep + os.environ.get("PATH", ""), ANSIBLE_INJECT_FACT_VARS=inject)
    proc = subprocess.run([os.path.join(bindir, "ansible-playbook"), "-i", inventory, playbook, *extra],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, env=env)
    out = proc.stdout + proc.stderr
    assert "DEPRECATION WARNING" not in out, out[-6000:]
    return proc.returncode, out


@pytest.mark.parametrize("label,bindir,expected,inject", controllers(), ids=lambda v: str(v) if v else "")
def test_plan_and_site_on_every_supported_core(node, tmp_path, label, bindir, expected, inject):
    if expected:
        assert core_version(bindir) == expected
    inventory = tmp_path / "inventory.yml"
    host = {
        "ansible_connection": "community.docker.docker",
        "ansible_python_interpreter": "/usr/bin/python3",
        "gpu_topology_controller_dir": str(tmp_path / "topology"),
        "gpunuma_profile": "preferred",
        "memlock_limit": "4M",
        "memlock_groups": ["gpunuma"],
        "gpunuma_instances": [{"name": "worker", "numa_node": 0, "share_cpus": True,
                               "command": ["/bin/sleep", "infinity"]}],
    }
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {node.name: host}}}))
    rc, out = run(bindir, inject, "playbooks/plan.yml", str(inventory))
    assert rc == 0, out[-6000:]
    assert re.search(r"%s\s+worker\s+preferred" % re.escape(node.name), out), out[-4000:]
    rc, out = run(bindir, inject, "playbooks/site.yml", str(inventory))
    assert rc == 0, out[-6000:]
    assert node.sh("systemctl is-active gpunuma-worker.service").strip() == "active"
    # The memlock part of the one node read reached the node read (it came back as a fact of the input step).
    assert "LimitMEMLOCK=4194304" in node.sh("cat /etc/systemd/system/gpunuma-worker.service")
    rc, out = run(bindir, inject, "playbooks/site.yml", str(inventory))
    recap = re.search(r"%s\s*: ok=(\d+)\s+changed=(\d+) " % re.escape(node.name), out)
    assert rc == 0 and recap, out[-4000:]
    # The re-run ended at the converge check (its one task on the host; a whole run executes dozens), and the
    # summary still lists the host's instance, from the record.
    assert int(recap.group(1)) <= 2 and recap.group(2) == "0", out[-4000:]
    assert re.search(r"%s\s+worker\s+preferred" % re.escape(node.name), out), out[-4000:]
