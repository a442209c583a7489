"""A node lost in the middle of its converge, on two systemd containers.

The first node is killed (``docker kill``: power lost, nothing shuts down)
while its gpunuma_apply step is between writing the instance's unit and
starting it. The window is held open deterministically: for that run only,
the node has a ``systemctl`` in /usr/local/bin (ahead of /usr/bin in PATH)
that, on ``daemon-reload`` while a gpunuma unit file exists, drops a flag
and waits before running the real one; the test kills the node when the
flag appears. Then:

- the run lists the lost node as NOT PROVISIONED and the other node's
  instance runs;
- after ``docker start`` no temporary or half-written file is left under
  /etc/systemd/system or /etc/gpunuma, and a plain re-run of site.yml
  converges the node (its instance active with the planned CPUs, plan.json
  written), with no manual repair;
- a third run changes nothing (on the lost node; the other node changed
  nothing in the second run already).

A unit that fails its readiness check after a change is rolled back, with
the instance and the reason in the run's output:
tests/integration/test_roles_numa_binding.py::test_restart_settles_only_when_ready_else_rolls_back.
"""

import json
import os
import re
import subprocess
import time

import pytest
import yaml

from ansible_run import BINDIR, ansible_env
from conftest import REPO_ROOT
from containers import Node, needs_docker

pytestmark = [pytest.mark.container, needs_docker]

INSTANCE = {"name": "steady", "numa_node": 0, "share_cpus": True, "command": ["/bin/sleep", "infinity"]}
UNIT = "gpunuma-steady.service"
FLAG = "/run/gpunuma-test-window"

# Waits on daemon-reload once a gpunuma unit is on disk (the apply wrote it
# and has not started it yet); any other call goes straight through.
HOLD_SHIM = """#!/bin/sh
if [ "$1" = daemon-reload ] && ls /etc/systemd/system/gpunuma-*.service >/dev/null 2>&1; then
    touch %s
    sleep 120
fi
exec /usr/bin/systemctl "$@"
""" % FLAG


@pytest.fixture
def nodes():
    created = sorted([Node(), Node()], key=lambda n: n.name)
    yield created
    for node in created:
        node.remove()


def _playbook(tmp_path, nodes):
    hosts = {}
    for node in nodes:
        hosts[node.name] = {
            "ansible_connection": "community.docker.docker",
            "ansible_python_interpreter": "/usr/bin/python3",
            "gpu_topology_controller_dir": str(tmp_path / "topology"),
            "numa_binding_settle_seconds": 1,
            "gpunuma_profile": "preferred",
            "memlock_limit": "4M",
            "autonuma_numa_balancing": None,
            "gpunuma_instances": [INSTANCE],
        }
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return [os.path.join(BINDIR, "ansible-playbook"), "-i", str(inventory), "playbooks/site.yml"]


def _site(cmd):
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=ansible_env())
    return proc.returncode, proc.stdout + proc.stderr


def _recap(out, host):
    match = re.search(r"^%s\s*:\s*(.*)$" % re.escape(host), out, re.M)
    assert match, out[-3000:]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(1))}


def _cpus(text):
    cpus = set()
    for part in text.strip().split(","):
        if part:
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def _leftovers(node):
    """Anything under the unit and gpunuma directories that is not a finished file of gpunuma's."""
    return node.sh("find /etc/systemd/system /etc/gpunuma -name '.gpunuma-*' -o -name '*.tmp' 2>/dev/null || true")


def _wait_booted(node, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        state = node.sh("systemctl is-system-running --wait", check=False).strip()
        if state in ("running", "degraded"):
            return
        time.sleep(1)
    raise AssertionError("%s did not boot again" % node.name)


def test_node_lost_between_unit_write_and_start_converges_on_a_plain_rerun(nodes, tmp_path):
    lost, other = nodes
    lost.sh("cat > /usr/local/bin/systemctl <<'EOF'\n%sEOF\nchmod 755 /usr/local/bin/systemctl" % HOLD_SHIM)
    cmd = _playbook(tmp_path, nodes)

    log = open(tmp_path / "first.log", "w+")
    run = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, text=True, env=ansible_env())
    try:
        deadline = time.time() + 300
        while lost.sh("test -e %s && echo held || true" % FLAG).strip() != "held":
            assert run.poll() is None, "the run ended before the window: " + open(log.name).read()[-3000:]
            assert time.time() < deadline, "the apply never reached daemon-reload"
            time.sleep(0.3)
        # The unit is on disk, the instance never started: the node dies here.
        assert lost.sh("ls /etc/systemd/system/%s" % UNIT).strip()
        assert lost.sh("systemctl is-active %s || true" % UNIT).strip() != "active"
        subprocess.run(["docker", "kill", lost.name], check=True, capture_output=True)
        run.wait(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    log.seek(0)
    first = log.read()
    assert run.returncode != 0
    assert "NOT PROVISIONED in this run (failed or unreachable; a plain re-run converges them): %s" % lost.name \
        in first, first[-4000:]
    assert other.name not in first.split("NOT PROVISIONED in this run", 1)[1].splitlines()[0]
    assert other.sh("systemctl is-active %s" % UNIT, check=False).strip() == "active", first[-4000:]
    assert _recap(first, other.name)["failed"] == 0

    # Power back: the node boots; nothing half-written is left behind.
    subprocess.run(["docker", "start", lost.name], check=True, capture_output=True)
    _wait_booted(lost)
    lost.sh("rm /usr/local/bin/systemctl")
    assert _leftovers(lost).strip() == ""

    rc, second = _site(cmd)
    assert rc == 0, second[-6000:]
    assert "NOT PROVISIONED in this run" not in second
    assert _recap(second, lost.name)["changed"] > 0
    assert _recap(second, other.name)["changed"] == 0, second[-6000:]
    plan = json.loads(lost.sh("cat /etc/gpunuma/plan.json"))
    [planned] = [i for i in plan["instances"] if i["name"] == INSTANCE["name"]]
    assert lost.sh("systemctl is-active %s" % UNIT, check=False).strip() == "active"
    assert lost.sh("systemctl is-enabled %s" % UNIT, check=False).strip() == "enabled"
    pid = lost.main_pid(UNIT)
    allowed = lost.sh("grep Cpus_allowed_list /proc/%d/status" % pid).split(":", 1)[1]
    assert _cpus(allowed) == _cpus(planned["cpus"]), (allowed, planned["cpus"])
    assert _leftovers(lost).strip() == ""

    # The other node already changed nothing in the second run.
    rc, third = _site(cmd + ["--limit", lost.name])
    assert rc == 0, third[-6000:]
    assert _recap(third, lost.name)["changed"] == 0, third[-6000:]
    assert lost.main_pid(UNIT) == pid
