"""Live state of every member of the systemd container fleet.

Runs through testinfra's Ansible backend against molecule's inventory, so each
test runs once per fleet member (docker exec into the container).
"""

import pytest

testinfra_hosts = ["ansible://gpunuma_fleet"]

# Bits of /proc/<pid>/status CapEff (linux/capability.h).
CAPABILITY_BITS = {"CAP_SYS_ADMIN": 21, "CAP_SYS_NICE": 23}


def _status_field(host, pid, field):
    for line in host.file(f"/proc/{pid}/status").content_string.splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return value.strip()
    raise AssertionError(f"/proc/{pid}/status has no {field} field")


def test_systemd_is_pid_1(host):
    assert host.file("/proc/1/comm").content_string.strip() == "systemd"


def test_system_finished_booting(host):
    state = host.run("systemctl is-system-running")
    failed = host.run("systemctl --failed --no-legend --plain").stdout
    assert state.stdout.strip() in ("running", "degraded"), (
        f"systemctl is-system-running: {state.stdout.strip()!r}; failed units:\n{failed}"
    )


@pytest.mark.parametrize("capability", sorted(CAPABILITY_BITS))
def test_pid_1_holds_fleet_capability(host, capability):
    cap_eff = int(_status_field(host, 1, "CapEff"), 16)
    assert cap_eff & (1 << CAPABILITY_BITS[capability]), (
        f"{capability} missing from PID 1 CapEff {cap_eff:#x}"
    )


def test_numactl_membind_sets_bind_policy(host):
    # set_mempolicy is refused without CAP_SYS_NICE under Docker's seccomp
    # profile; a successful --membind shows up as the child's policy.
    result = host.run("numactl --membind=0 --cpunodebind=0 numactl --show")
    assert result.rc == 0, f"numactl --membind=0 failed: {result.stderr}"
    show = dict(
        line.split(":", 1) for line in result.stdout.splitlines() if ":" in line
    )
    assert show["policy"].strip() == "bind"
    assert show["membind"].split() == ["0"]
    assert show["cpubind"].split() == ["0"]


def test_unbound_process_has_default_policy(host):
    # Guards the test above: the bind policy must come from numactl, not from
    # the container's defaults.
    result = host.run_expect([0], "numactl --show")
    assert "policy: default" in result.stdout


@pytest.mark.parametrize(
    "unit", ["console-getty.service", "apt-daily.timer", "apt-daily-upgrade.timer"]
)
def test_unit_masked_by_base_image(host, unit):
    assert host.run(f"systemctl is-enabled {unit}").stdout.strip() == "masked"


def test_gpunuma_config_directory(host):
    directory = host.file("/etc/gpunuma")
    assert directory.is_directory
    assert directory.user == "root"
    assert directory.group == "root"
    assert directory.mode == 0o755
