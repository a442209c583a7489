"""containerd's memlock drop-in and restart need the operator's consent.

On a systemd container with a containerd stand-in (a unit of that name whose
process only sleeps): by default the memlock role writes no drop-in and never
restarts containerd; `memlock_containerd: true` writes the drop-in and says a
restart is pending, still without restarting; only with
`memlock_restart_containerd: true` as well is containerd restarted, and then
its process runs with the limit.
"""

import os
import subprocess

import pytest
import yaml

from ansible_run import BINDIR, ansible_env
from conftest import REPO_ROOT
from containers import UNIT_DIR, Node, needs_docker

pytestmark = [pytest.mark.container, needs_docker]

DROPIN = UNIT_DIR + "/containerd.service.d/50-gpunuma-memlock.conf"


@pytest.fixture(scope="module")
def node():
    created = Node()
    created.sh("printf '[Unit]\\nDescription=Stand-in for containerd\\n[Service]\\nExecStart=/bin/sleep infinity\\n"
               "[Install]\\nWantedBy=multi-user.target\\n' > %s/containerd.service"
               " && systemctl daemon-reload && systemctl enable --now containerd.service" % UNIT_DIR)
    yield created
    created.remove()


def run_memlock(node, tmp_path, **role_vars):
    host_vars = {"ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3",
                 "memlock_limit": "4M", "memlock_groups": ["gpunuma"]}
    host_vars.update(role_vars)
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {node.name: host_vars}}}))
    playbook = tmp_path / "memlock.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "roles": ["memlock"]}]))
    proc = subprocess.run([os.path.join(BINDIR, "ansible-playbook"), "-i", str(inventory), str(playbook)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=ansible_env())
    assert proc.returncode == 0, proc.stdout[-4000:]
    return " ".join(proc.stdout.split())


def test_containerd_is_left_alone_without_consent(node, tmp_path):
    pid = node.main_pid("containerd.service")
    run_memlock(node, tmp_path)
    assert node.sh("test -e %s && echo present || echo absent" % DROPIN).strip() == "absent"
    assert node.main_pid("containerd.service") == pid

    out = run_memlock(node, tmp_path, memlock_containerd=True)
    assert "LimitMEMLOCK=4194304" in node.sh("cat %s" % DROPIN)
    assert "containerd's memlock drop-in changed but memlock_restart_containerd is false" in out
    assert node.main_pid("containerd.service") == pid

    run_memlock(node, tmp_path, memlock_containerd=True, memlock_restart_containerd=True, memlock_limit="6M")
    new_pid = node.main_pid("containerd.service")
    assert new_pid != pid
    limits = node.sh("grep 'Max locked memory' /proc/%d/limits" % new_pid).split()
    assert limits[3:5] == ["6291456", "6291456"]  # 6 MiB: neither systemd's default nor the 4M before
