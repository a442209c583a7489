"""playbooks/node-checks.yml on a real systemd host (container): live /sys and /proc, nothing changed."""

import os
import subprocess

import pytest
import yaml

from ansible_run import BINDIR, ansible_env
from conftest import REPO_ROOT
from containers import Node, needs_docker

pytestmark = [pytest.mark.container, needs_docker]

# What a careless check could touch: sysctl, THP, governors, unit files, /etc.
SNAPSHOT = ("cat /proc/sys/kernel/numa_balancing /sys/kernel/mm/transparent_hugepage/enabled "
            "/sys/kernel/mm/transparent_hugepage/defrag /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor "
            "2>/dev/null; find /etc /run/systemd/system -xdev -type f -newer /proc/1 2>/dev/null | sort; "
            "find /etc -xdev -type f -exec md5sum {} + 2>/dev/null | sort | md5sum")


@pytest.fixture
def node():
    created = Node()
    yield created
    created.remove()


def _run(node, tmp_path, check=False, **variables):
    inventory = tmp_path / "inventory.yml"
    host_vars = {"ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3"}
    host_vars.update(variables)
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {node.name: host_vars}}}))
    cmd = [os.path.join(BINDIR, "ansible-playbook"), "-i", str(inventory),
           os.path.join(REPO_ROOT, "playbooks", "node-checks.yml"), "--diff"]
    if check:
        cmd.append("--check")
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=ansible_env())


def test_live_checks_change_nothing_and_check_mode_agrees(node, tmp_path):
    before = node.sh(SNAPSHOT, check=False)
    real = _run(node, tmp_path, node_checks_profile="strict")
    assert real.returncode == 0, real.stdout[-4000:]
    assert "changed=0" in real.stdout and "failed=0" in real.stdout
    # The container has no GPU: host findings only, each with its evidence file.
    assert "| host | numa_balancing:" in real.stdout
    assert "| host | thp:" in real.stdout
    assert "| host | cpu_governor:" in real.stdout
    assert "| gpu " not in real.stdout
    dry = _run(node, tmp_path, check=True, node_checks_profile="strict")
    assert dry.returncode == 0, dry.stdout[-4000:]
    assert "changed=0" in dry.stdout
    assert node.sh(SNAPSHOT, check=False) == before
