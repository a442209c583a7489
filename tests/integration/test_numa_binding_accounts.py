"""The account instances run as, on a real systemd container.

Instances without `user` run as the dedicated system account gpunuma, which
the role creates (no login shell, member of the GPU device groups the node
has); root only when an instance says so; an account that does not exist is
refused before anything is written.
"""

import pytest

from containers import UNIT_DIR, Node, needs_docker
from test_roles_numa_binding import apply

pytestmark = [pytest.mark.container, needs_docker]

SLEEPER = {"name": "steady", "numa_node": 0, "share_cpus": True, "command": ["/bin/sleep", "infinity"]}


@pytest.fixture
def node():
    created = Node()
    yield created
    created.remove()


def test_default_account_is_created_and_root_only_when_asked(node, tmp_path):
    assert node.sh("getent passwd gpunuma || true").strip() == ""
    node.sh("groupadd --system render")  # the node has render; video is in the base image's /etc/group
    proc = apply(node, tmp_path, [SLEEPER, dict(SLEEPER, name="admin", user="root")])
    assert proc.returncode == 0, proc.stdout[-4000:]
    entry = node.sh("getent passwd gpunuma").strip().split(":")
    assert int(entry[2]) < 1000 and entry[5] == "/var/lib/gpunuma-instances" and entry[6] == "/usr/sbin/nologin"
    assert entry[4] == "gpunuma inference instances"
    # Created with its home (by the apply step: gpunuma_apply's account option).
    assert node.sh("stat -c %U /var/lib/gpunuma-instances").strip() == "gpunuma"
    groups = set(node.sh("id -nG gpunuma").split())
    assert {"render", "video"} <= groups
    steady = node.main_pid("gpunuma-steady.service")
    assert node.sh("ps -o user= -p %d" % steady).strip() == "gpunuma"
    assert node.sh("ps -o user= -p %d" % node.main_pid("gpunuma-admin.service")).strip() == "root"
    # A second run creates nothing and restarts nothing.
    again = apply(node, tmp_path, [SLEEPER, dict(SLEEPER, name="admin", user="root")])
    assert again.returncode == 0 and "changed=0" in again.stdout.split("PLAY RECAP", 1)[1], again.stdout[-3000:]
    assert node.main_pid("gpunuma-steady.service") == steady


def test_missing_account_is_refused_before_anything_is_written(node, tmp_path):
    before = node.sh("ls -A %s" % UNIT_DIR)
    proc = apply(node, tmp_path, [dict(SLEEPER, user="svc-llm")])
    assert proc.returncode != 0
    assert "no account svc-llm on the node" in proc.stdout and "instances steady" in proc.stdout
    assert node.sh("ls -A %s" % UNIT_DIR) == before
    assert node.sh("test -e /etc/gpunuma/plan.json && echo yes || echo no").strip() == "no"


def test_default_account_not_created_without_consent(node, tmp_path):
    proc = apply(node, tmp_path, [SLEEPER], numa_binding_create_user=False)
    assert proc.returncode != 0
    assert "no account gpunuma on the node" in proc.stdout and "numa_binding_create_user: true" in proc.stdout
    assert node.sh("getent passwd gpunuma || true").strip() == ""
