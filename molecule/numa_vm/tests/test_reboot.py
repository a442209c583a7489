"""After a reboot of the guest, gpunuma's settings hold without a converge.

kernel.numa_balancing must come back at the configured value from the
sysctl.d file (the kernel command line still says numa_balancing=enable),
and the instance units must start at boot with the same binding.

pytest collects files in name order, so this runs after the other test
files have checked the converged guest.
"""

import time

import pytest

import gpunuma_probe as probe

REBOOT_TIMEOUT_S = 420
POLL_S = 5


@pytest.fixture(scope="module")
def rebooted(host):
    before = probe.boot_id(host)
    assert before, "cannot read the guest's boot id before the reboot"
    # Deferred by a second so that this SSH command returns before the
    # guest goes down.
    host.check_output("systemd-run --on-active=1 --timer-property=AccuracySec=100ms systemctl reboot")
    deadline = time.monotonic() + REBOOT_TIMEOUT_S
    now = None
    while time.monotonic() < deadline:
        time.sleep(POLL_S)
        now = probe.boot_id(host)
        if now and now != before:
            break
    assert now and now != before, f"the guest did not come back from a reboot within {REBOOT_TIMEOUT_S} s"
    state = host.run("systemctl is-system-running --wait").stdout.strip()
    assert state in ("running", "degraded"), f"systemctl is-system-running: {state}"
    return now


def test_numa_balancing_holds_across_the_reboot(host, rebooted):
    assert "numa_balancing=enable" in probe.read(host, "/proc/cmdline").split()
    assert probe.read(host, "/proc/sys/kernel/numa_balancing").strip() == probe.NUMA_BALANCING


@pytest.mark.parametrize("check", probe.INSTANCE_CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", sorted(probe.INSTANCES))
def test_instance_after_the_reboot(host, rebooted, name, check):
    check(host, name)
