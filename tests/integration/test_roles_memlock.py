"""The memlock role on localhost, writing into a temporary directory.

The containerd drop-in needs a systemd host and is covered by the molecule
fleet (a containerd stand-in whose /proc/<pid>/limits is checked); here
containerd is absent, as on this controller.
"""

import os
import sys

import pytest
import yaml

from ansible_run import run_playbook

pytestmark = pytest.mark.ansible


def _run(tmp_path, check=False, **role_vars):
    limits = tmp_path / "limits.d" / "90-gpunuma-memlock.conf"
    limits.parent.mkdir(exist_ok=True)
    playbook = tmp_path / "memlock.yml"
    variables = {
        "memlock_limits_path": str(limits),
        "memlock_containerd_dropin_path": str(tmp_path / "containerd.service.d" / "50-gpunuma-memlock.conf"),
        "ansible_managed": "Managed by gpunuma; local edits are overwritten",
    }
    variables.update(role_vars)
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False, "vars": variables,
        "roles": ["memlock"],
        "post_tasks": [{"name": "Show the systemd limit", "ansible.builtin.debug": {"msg": "SYSTEMD={{ memlock_systemd_limit }}"}}],
    }]))
    proc = run_playbook(str(playbook), "localhost,", check=check,
                        extra=["-c", "local", "-e", "ansible_python_interpreter=" + sys.executable])
    return proc, limits


def _entries(path):
    return [line.split() for line in path.read_text().splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize(
    "limit,pam,systemd",
    [("64G", "67108864", "68719476736"), ("512M", "524288", "536870912"), ("unlimited", "unlimited", "infinity"),
     ("infinity", "unlimited", "infinity"), (1048576, "1024", "1048576"), ("8k", "8", "8192")],
)
def test_limit_in_each_unit(tmp_path, limit, pam, systemd):
    proc, limits = _run(tmp_path, memlock_limit=limit, memlock_users=["svc"], memlock_groups=["gpu"])
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert _entries(limits) == [["svc", "-", "memlock", pam], ["@gpu", "-", "memlock", pam]]
    assert '"msg": "SYSTEMD=%s"' % systemd in proc.stdout
    assert limits.read_text().startswith("#\n# Managed by gpunuma; local edits are overwritten\n")
    assert oct(limits.stat().st_mode & 0o777) == "0o644"


def test_second_run_changes_nothing(tmp_path):
    first, _ = _run(tmp_path, memlock_users=["svc"])
    second, _ = _run(tmp_path, memlock_users=["svc"])
    assert first.returncode == 0 and second.returncode == 0
    assert "changed=1" in first.stdout
    assert "changed=0" in second.stdout


def test_check_mode_writes_nothing(tmp_path):
    proc, limits = _run(tmp_path, check=True, memlock_users=["svc"])
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "changed=1" in proc.stdout
    assert not limits.exists()


@pytest.mark.parametrize(
    "limit,message",
    [
        ("lots", "memlock_limit: 'lots' is invalid; allowed: unlimited, infinity, or a size such as 64G"),
        ("64 G", "memlock_limit: '64 G' is invalid; allowed: unlimited, infinity, or a size such as 64G"),
        ("-1", "memlock_limit: '-1' is invalid"),
        ("1000", "memlock_limit: '1000' bytes is not a whole number of KiB"),
    ],
)
def test_bad_limit_fails_before_any_change(tmp_path, limit, message):
    proc, limits = _run(tmp_path, memlock_limit=limit, memlock_users=["svc"])
    assert proc.returncode != 0
    assert message in proc.stdout
    assert not limits.exists()


def test_wildcard_needs_consent(tmp_path):
    proc, limits = _run(tmp_path, memlock_users=["*"])
    assert proc.returncode != 0
    assert "memlock_users: '*' would give every user on the node the limit" in proc.stdout
    assert not limits.exists()
    proc, limits = _run(tmp_path, memlock_users=["*"], memlock_allow_wildcard=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert _entries(limits) == [["*", "-", "memlock", "unlimited"]]


@pytest.mark.parametrize(
    "users,groups,message",
    [
        (["bad name"], [], "memlock_users: ['bad name'] are not valid user names"),
        (["ok", "x\ny"], [], "are not valid user names"),
        ([], ["@gpu"], "memlock_groups: ['@gpu'] are not valid group names"),
        ("svc", [], 'memlock_users: "svc" is not a list'),
    ],
)
def test_bad_names_fail(tmp_path, users, groups, message):
    proc, limits = _run(tmp_path, memlock_users=users, memlock_groups=groups)
    assert proc.returncode != 0
    assert message in proc.stdout
    assert not limits.exists()


def test_file_removed_when_nobody_is_listed(tmp_path):
    proc, limits = _run(tmp_path, memlock_users=["svc"])
    assert proc.returncode == 0 and limits.exists()
    proc, limits = _run(tmp_path, memlock_users=[])
    assert proc.returncode == 0
    assert not limits.exists()
