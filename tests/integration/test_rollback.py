"""rollback.yml on a systemd container: strict -> down -> previous -> off ->
strict, with the live binding of each instance read from /proc, the state
history checked after every step, and an instance whose binding did not
change proven not restarted (same PID). Refused rollbacks change nothing."""

import json
import os
import subprocess

import pytest
import yaml

from ansible_run import BINDIR, ansible_env
from conftest import REPO_ROOT
from containers import Node, needs_docker

pytestmark = [pytest.mark.molecule, needs_docker]

INSTANCES = [
    {"name": "small", "numa_node": 0, "share_cpus": True, "memory": "256M", "command": ["/bin/sleep", "infinity"]},
    # Declares more than any node has: planned as preferred under strict
    # (strict_capacity: fallback), so strict <-> preferred leaves it alone.
    {"name": "big", "numa_node": 0, "share_cpus": True, "memory": "64T", "command": ["/bin/sleep", "infinity"]},
]


@pytest.fixture(scope="module")
def node():
    n = Node()
    yield n
    n.remove()


@pytest.fixture(scope="module")
def inventory(node, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rollback")
    hostvars = {
        "ansible_connection": "community.docker.docker",
        "ansible_python_interpreter": "/usr/bin/python3",
        "gpu_topology_controller_dir": str(tmp / "topology"),
        "numa_binding_settle_seconds": 1,
        "gpunuma_housekeeping_cores_per_node": 0,
        "gpunuma_profile": "strict",
        "memlock_limit": "4M",
        "gpunuma_instances": INSTANCES,
        "autonuma_numa_balancing": None,
    }
    path = tmp / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": {node.name: hostvars}}}))
    return str(path)


def play(inventory, playbook, node, *extra):
    cmd = [os.path.join(BINDIR, "ansible-playbook"), "-i", inventory, playbook, "--limit", node.name]
    for item in extra:
        cmd += ["-e", item]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                          env=ansible_env(SUDO_USER="oncall"))
    return proc.returncode, proc.stdout + proc.stderr


def live(node, unit):
    pid = node.main_pid(unit)
    maps = node.sh("head -n 3 /proc/%d/numa_maps" % pid)
    policy = maps.split()[1] if maps.strip() else ""
    return pid, policy


def state(node):
    return json.loads(node.sh("cat /etc/gpunuma/state.json"))


def test_never_provisioned_node_is_refused(node, inventory):
    rc, out = play(inventory, "playbooks/rollback.yml", node, "gpunuma_rollback=down")
    assert rc != 0 and "never provisioned" in out and "Nothing was changed" in out, out[-3000:]
    assert node.sh("ls /etc/gpunuma 2>/dev/null || true").strip() == ""


def test_ladder_round_trip(node, inventory):
    rc, out = play(inventory, "playbooks/site.yml", node)
    assert rc == 0, out[-4000:]
    assert live(node, "gpunuma-small.service")[1] == "bind:0"
    big_pid, big_policy = live(node, "gpunuma-big.service")
    assert big_policy == "prefer:0"
    st = state(node)
    assert st["profile"] == "strict" and not st["pinned"] and st["history"][-1]["action"] == "site"

    rc, out = play(inventory, "playbooks/rollback.yml", node, "gpunuma_rollback=down", json.dumps({"gpunuma_reason": "P99 spike"}))
    assert rc == 0, out[-4000:]
    small_pid, policy = live(node, "gpunuma-small.service")
    assert policy == "prefer:0"
    assert live(node, "gpunuma-big.service") == (big_pid, "prefer:0")
    st = state(node)
    assert st["profile"] == "preferred" and st["pinned"]
    assert {k: st["history"][-1][k] for k in ("from", "to", "action", "reason", "user")} == {
        "from": "strict", "to": "preferred", "action": "down", "reason": "P99 spike", "user": "oncall"}

    # A later site.yml keeps the node on its rolled-back profile and says so.
    rc, out = play(inventory, "playbooks/site.yml", node)
    assert rc == 0, out[-4000:]
    assert "stays on profile preferred" in out
    assert live(node, "gpunuma-small.service") == (small_pid, "prefer:0")
    assert len(state(node)["history"]) == 2

    rc, out = play(inventory, "playbooks/rollback.yml", node, "gpunuma_rollback=previous")
    assert rc == 0, out[-4000:]
    assert live(node, "gpunuma-small.service")[1] == "bind:0"
    assert live(node, "gpunuma-big.service") == (big_pid, "prefer:0")
    assert [(h["from"], h["to"]) for h in state(node)["history"]][-1] == ("preferred", "strict")

    rc, out = play(inventory, "playbooks/rollback.yml", node, "gpunuma_profile=off")
    assert rc == 0, out[-4000:]
    assert live(node, "gpunuma-small.service")[1] == "default"
    assert state(node)["profile"] == "off"

    before = node.sh("cat /etc/gpunuma/state.json")
    rc, out = play(inventory, "playbooks/rollback.yml", node, "gpunuma_rollback=down")
    assert rc != 0 and "bottom rung" in out, out[-3000:]
    rc, out = play(inventory, "playbooks/rollback.yml", node, "gpunuma_profile=fastest")
    assert rc != 0 and "'fastest' is not a known profile" in out, out[-3000:]
    assert node.sh("cat /etc/gpunuma/state.json") == before

    rc, out = play(inventory, "playbooks/rollback.yml", node, "gpunuma_profile=strict")
    assert rc == 0, out[-4000:]
    assert live(node, "gpunuma-small.service")[1] == "bind:0"
    assert [h["to"] for h in state(node)["history"]] == ["strict", "preferred", "strict", "off", "strict"]


def test_corrupt_state_is_kept_as_backup(node, inventory):
    node.sh("echo '{broken' > /etc/gpunuma/state.json")
    rc, out = play(inventory, "playbooks/site.yml", node)
    assert rc == 0, out[-4000:]
    assert "/etc/gpunuma/state.json is corrupt" in out
    assert node.sh("cat /etc/gpunuma/state.json.corrupt-*").strip() == "{broken"
    assert state(node)["profile"] == "strict"


def test_newer_state_is_refused_and_left_alone(node, inventory):
    node.sh("""echo '{"schema": "gpunuma.state/v9"}' > /etc/gpunuma/state.json""")
    rc, out = play(inventory, "playbooks/site.yml", node)
    assert rc != 0 and "newer gpunuma" in out and "/etc/gpunuma/state.json" in out, out[-3000:]
    assert "v9" in node.sh("cat /etc/gpunuma/state.json")
