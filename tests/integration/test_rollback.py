"""rollback.yml and the node's state file on a systemd container: a node
gpunuma never provisioned is refused and left untouched; a corrupt state file
is kept as a backup and the history restarts; a state file from a newer
gpunuma stops the run and is left alone. The ladder itself (strict -> down ->
previous -> off -> strict with live bindings, the refusals on a provisioned
node, and site.yml keeping a rolled-back node where it is) is the molecule
`rollback` scenario."""

import json
import os
import pwd
import subprocess

import pytest
import yaml

from ansible_run import BINDIR, ansible_env
from conftest import REPO_ROOT
from containers import Node, needs_docker

pytestmark = [pytest.mark.container, needs_docker]

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


def play(inventory, playbook, node, *extra, env=None):
    cmd = [os.path.join(BINDIR, "ansible-playbook"), "-i", inventory, playbook, "--limit", node.name]
    for item in extra:
        cmd += ["-e", item]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                          env=env or ansible_env(SUDO_USER="oncall"))
    return proc.returncode, proc.stdout + proc.stderr


def state(node):
    return json.loads(node.sh("cat /etc/gpunuma/state.json"))


def test_never_provisioned_node_is_refused(node, inventory):
    rc, out = play(inventory, "playbooks/rollback.yml", node, "gpunuma_rollback=down")
    assert rc != 0 and "never provisioned" in out and "Nothing was changed" in out, out[-3000:]
    assert node.sh("ls /etc/gpunuma 2>/dev/null || true").strip() == ""


def test_corrupt_state_is_kept_as_backup(node, inventory):
    node.sh("mkdir -p /etc/gpunuma && echo '{broken' > /etc/gpunuma/state.json")
    rc, out = play(inventory, "playbooks/site.yml", node)
    assert rc == 0, out[-4000:]
    assert "/etc/gpunuma/state.json is corrupt" in out
    assert node.sh("cat /etc/gpunuma/state.json.corrupt-*").strip() == "{broken"
    assert state(node)["profile"] == "strict"


def test_a_hand_pinned_profile_without_its_checksum_is_not_obeyed(node, inventory):
    """Deleting a sealed state's checksum is an edit: the node is not moved to the pinned profile; the file is kept
    as a backup and the node follows the inventory."""
    rc, out = play(inventory, "playbooks/site.yml", node)
    assert rc == 0, out[-4000:]
    forged = {k: v for k, v in state(node).items() if k != "checksum"}
    forged.update(profile="off", pinned=True)
    node.sh("rm -f /etc/gpunuma/state.json.corrupt-* && cat > /etc/gpunuma/state.json <<'EOF'\n%s\nEOF"
            % json.dumps(forged))
    rc, out = play(inventory, "playbooks/site.yml", node)
    assert rc == 0, out[-4000:]
    assert "carries no checksum" in out, out[-4000:]
    assert state(node)["profile"] == "strict" and "checksum" in state(node)
    assert json.loads(node.sh("cat /etc/gpunuma/state.json.corrupt-*"))["profile"] == "off"
    assert json.loads(node.sh("cat /etc/gpunuma/plan.json"))["profile"] == "strict"


def test_newer_state_is_refused_and_left_alone(node, inventory):
    node.sh("""echo '{"schema": "gpunuma.state/v9"}' > /etc/gpunuma/state.json""")
    rc, out = play(inventory, "playbooks/site.yml", node)
    assert rc != 0 and "newer gpunuma" in out and "/etc/gpunuma/state.json" in out, out[-3000:]
    assert "v9" in node.sh("cat /etc/gpunuma/state.json")


def test_history_names_the_uid_when_no_user_variable_is_set(node, inventory):
    """cron and CI set no SUDO_USER, USER or LOGNAME: the history names the controller's uid, never 'unknown'."""
    node.sh("rm -f /etc/gpunuma/state.json")
    env = ansible_env()
    for name in ("SUDO_USER", "USER", "LOGNAME"):
        env.pop(name, None)
    rc, out = play(inventory, "playbooks/site.yml", node, env=env)
    assert rc == 0, out[-4000:]
    rc, out = play(inventory, "playbooks/rollback.yml", node, "gpunuma_rollback=down", "gpunuma_reason=cron", env=env)
    assert rc == 0, out[-4000:]
    history = state(node)["history"]
    assert history[-1]["to"] == "preferred" and history[-1]["reason"] == "cron", history
    assert {h["user"] for h in history} == {pwd.getpwuid(os.getuid()).pw_name}, history
