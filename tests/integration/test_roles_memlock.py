"""The memlock role on localhost, writing into a temporary directory.

The containerd drop-in needs a systemd host and is covered by the molecule
fleet (a containerd stand-in whose /proc/<pid>/limits is checked); here
containerd is absent, as on this controller. The ceiling check reads copies
of PID 1's /proc files: the captured PID 1 of a systemd container under
Docker's defaults (hard memlock 8 MiB, no CAP_SYS_RESOURCE), and variants of
it.
"""

import os
import shutil
import sys

import pytest
import yaml

from ansible_run import run_playbook
from conftest import FIXTURES

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
        "post_tasks": [
            {"name": "Show the effective limit",
             "ansible.builtin.debug": {"msg": "EFFECTIVE={{ memlock_effective_limit }}"}},
        ],
    }]))
    proc = run_playbook(str(playbook), "localhost,", check=check,
                        extra=["-c", "local", "-e", "ansible_python_interpreter=" + sys.executable])
    return proc, limits


def _entries(path):
    return [line.split() for line in path.read_text().splitlines() if line and not line.startswith("#")]


# The units' LimitMEMLOCK= for the same limits: tests/unit/test_plan_memlock.py (the planner decides it).
@pytest.mark.parametrize(
    "limit,pam",
    [("64G", "67108864"), ("512M", "524288"), ("unlimited", "unlimited"), ("infinity", "unlimited"),
     (1048576, "1024"), ("8k", "8"),
     # The grammar instance memory uses (limits.parse_limit): binary suffixes and fractions.
     ("64GiB", "67108864"), ("1.5G", "1572864")],
)
def test_limit_in_each_unit(tmp_path, limit, pam):
    proc, limits = _run(tmp_path, memlock_limit=limit, memlock_users=["svc"], memlock_groups=["gpu"])
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert _entries(limits) == [["svc", "-", "memlock", pam], ["@gpu", "-", "memlock", pam]]
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
        # The grammar is limits.parse_limit's (the code that converts the
        # limit), so the message names the value and what is allowed.
        ("lots", ["memlock_limit: 'lots'", "allowed: unlimited, infinity"]),
        ("64X", ["memlock_limit: '64X'", "allowed:"]),
        ("-1", ["memlock_limit: '-1'", "allowed:"]),
        ("1000", ['memlock_limit: "1000" is 1000 bytes, not a whole number of KiB']),
        ("1.5K", ['memlock_limit: "1.5K" is 1536 bytes, not a whole number of KiB']),
        # 0 locks nothing: refused with the allowed range, string or number.
        ("0", ["memlock_limit: '0'", "allowed:"]),
        (0, ["memlock_limit: 0", "allowed:"]),
        ("99999999999E", ["memlock_limit: '99999999999E'", "allowed:"]),
    ],
)
def test_bad_limit_fails_before_any_change(tmp_path, limit, message):
    proc, limits = _run(tmp_path, memlock_limit=limit, memlock_users=["svc"])
    assert proc.returncode != 0
    for needle in message:
        assert needle in proc.stdout, (needle, proc.stdout[-2000:])
    assert "argument_spec_data" not in proc.stdout
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
        (["bad name"], [], 'memlock_users: ["bad name"] is not valid user names'),
        (["ok", "x\ny"], [], 'memlock_users: ["x\\ny"] is not valid user names'),
        # Full match: a trailing newline is not part of a name ($ would match before it).
        (["svc\n"], [], 'memlock_users: ["svc\\n"] is not valid user names'),
        ([], ["gpu\n"], 'memlock_groups: ["gpu\\n"] is not valid group names'),
        ([], ["@gpu"], 'memlock_groups: ["@gpu"] is not valid group names'),
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


# ------------------------------------------------------------ PID 1's ceiling

DOCKER_PID1 = os.path.join(FIXTURES, "captured", "docker-systemd-pid1")
CAP_SYS_RESOURCE = 1 << 24


def _pid1(tmp_path, add_sys_resource=False, uid_map=None, drop=()):
    """A copy of the captured container PID 1's /proc files, optionally changed."""
    proc = tmp_path / "proc1"
    shutil.copytree(DOCKER_PID1, proc)
    if add_sys_resource:
        status = proc / "status"
        lines = []
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                line = "CapEff:\t%016x" % (int(line.split()[1], 16) | CAP_SYS_RESOURCE)
            lines.append(line)
        status.write_text("\n".join(lines) + "\n")
    if uid_map is not None:
        (proc / "uid_map").write_text(uid_map)
    for name in drop:
        (proc / name).unlink()
    return str(proc)


def _warning(proc):
    return [line for line in proc.stdout.splitlines() if "WARNING localhost: memlock_limit asks for" in line]


def test_limit_above_the_container_ceiling_warns_with_numbers_and_fix(tmp_path):
    proc, limits = _run(tmp_path, memlock_limit="64M", memlock_users=["svc"], memlock_pid1_proc_dir=_pid1(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:]
    warning = _warning(proc)
    assert len(warning) == 1, proc.stdout[-3000:]
    assert "asks for 64 MiB of locked memory but systemd units on this node get 8 MiB" in warning[0]
    assert "PID 1's hard memlock limit is 8 MiB and PID 1 lacks CAP_SYS_RESOURCE" in warning[0]
    assert "docker run --ulimit memlock=-1" in warning[0]
    # The requested limit is still what gets written; the fact says what units get.
    assert '"msg": "EFFECTIVE=8388608"' in proc.stdout
    assert _entries(limits) == [["svc", "-", "memlock", "65536"]]


def test_unlimited_is_clamped_too(tmp_path):
    proc, _ = _run(tmp_path, memlock_limit="unlimited", memlock_pid1_proc_dir=_pid1(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "asks for unlimited of locked memory but systemd units on this node get 8 MiB" in _warning(proc)[0]
    assert '"msg": "EFFECTIVE=8388608"' in proc.stdout


@pytest.mark.parametrize("limit,effective", [("4M", "4194304"), ("8M", "8388608")])
def test_limit_within_the_ceiling_is_quiet(tmp_path, limit, effective):
    proc, _ = _run(tmp_path, memlock_limit=limit, memlock_on_clamp="fail", memlock_pid1_proc_dir=_pid1(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert _warning(proc) == []
    assert '"msg": "EFFECTIVE=%s"' % effective in proc.stdout


def test_pid1_with_sys_resource_has_no_ceiling(tmp_path):
    proc, _ = _run(tmp_path, memlock_limit="64G", memlock_on_clamp="fail",
                   memlock_pid1_proc_dir=_pid1(tmp_path, add_sys_resource=True))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert '"msg": "EFFECTIVE=68719476736"' in proc.stdout


def test_sys_resource_in_a_user_namespace_does_not_lift_the_ceiling(tmp_path):
    pid1 = _pid1(tmp_path, add_sys_resource=True, uid_map="         0     100000      65536\n")
    proc, _ = _run(tmp_path, memlock_limit="64G", memlock_pid1_proc_dir=pid1)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "runs in a user namespace" in _warning(proc)[0]
    assert '"msg": "EFFECTIVE=8388608"' in proc.stdout


@pytest.mark.parametrize("check", [False, True], ids=["apply", "check-mode"])
def test_fail_on_clamp_stops_before_any_change(tmp_path, check):
    proc, limits = _run(tmp_path, check=check, memlock_limit="64M", memlock_users=["svc"], memlock_on_clamp="fail",
                        memlock_pid1_proc_dir=_pid1(tmp_path))
    assert proc.returncode != 0
    assert ("localhost: memlock_limit asks for 64 MiB of locked memory but systemd units on this node get 8 MiB"
            in proc.stdout)
    assert "(memlock_on_clamp is fail; set it to warn to go on with the lower limit)" in proc.stdout
    assert not limits.exists()


def test_unreadable_pid1_files_are_reported_not_fatal(tmp_path):
    proc, _ = _run(tmp_path, memlock_limit="64M", memlock_on_clamp="fail",
                   memlock_pid1_proc_dir=_pid1(tmp_path, drop=["limits"]))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "/limits or /status could not be read: whether systemd can give units LimitMEMLOCK=67108864 is not checked" \
        in proc.stdout
    assert '"msg": "EFFECTIVE=67108864"' in proc.stdout


def test_missing_uid_map_counts_as_the_initial_namespace(tmp_path):
    pid1 = _pid1(tmp_path, add_sys_resource=True, drop=["uid_map"])
    proc, _ = _run(tmp_path, memlock_limit="64G", memlock_on_clamp="fail", memlock_pid1_proc_dir=pid1)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert '"msg": "EFFECTIVE=68719476736"' in proc.stdout


def test_bad_on_clamp_value_fails(tmp_path):
    proc, limits = _run(tmp_path, memlock_on_clamp="ignore", memlock_users=["svc"])
    assert proc.returncode != 0
    assert "memlock_on_clamp must be one of: warn, fail, got: ignore" in proc.stdout
    assert not limits.exists()
