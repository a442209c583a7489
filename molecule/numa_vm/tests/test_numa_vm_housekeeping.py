"""Housekeeping confinement and irqbalance's ban on the guest, where cgroups are real.

site.yml (the real playbook, molecule's inventory) with
numa_binding_housekeeping_confine and numa_binding_irqbalance_ban on and node
0's CPUs as the housekeeping set: system.slice, user.slice and init.scope end
up on node 0's CPUs (the kernel's cpuset.cpus.effective, and what a new
service and PID 1 are allowed), the instances run in gpunuma.slice on node
1's CPUs, irqbalance runs with node 1's CPUs banned. Then the same run with
both options off puts the node back: no drop-in left, every slice on every
CPU again, irqbalance without the ban. The instances' own bindings (llm0 on
node 1, membind) hold throughout.

pytest collects files in name order: this runs after test_numa_vm.py and ends
on the converged settings, before test_numa_vm_rollback.py and the reboot.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

import gpunuma_probe as probe

REPO = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[3]))
INVENTORY = os.environ.get("MOLECULE_INVENTORY_FILE")
UNIT_DIR = "/etc/systemd/system"
DROPINS = [f"{UNIT_DIR}/{unit}.d/50-gpunuma-housekeeping.conf" for unit in ("system.slice", "user.slice", "init.scope")]
IRQ_DROPIN = f"{UNIT_DIR}/irqbalance.service.d/50-gpunuma-banned-cpus.conf"

pytestmark = pytest.mark.skipif(INVENTORY is None, reason="run by molecule (MOLECULE_INVENTORY_FILE)")


def site(**extra):
    cmd = ["ansible-playbook", "-i", os.path.dirname(INVENTORY), str(REPO / "playbooks" / "site.yml"),
           "--limit", "numa-vm", "-e", json.dumps(extra)]
    env = dict(os.environ, ANSIBLE_LIBRARY=str(REPO / "library"), ANSIBLE_MODULE_UTILS=str(REPO / "module_utils"),
               ANSIBLE_FILTER_PLUGINS=str(REPO / "filter_plugins"), ANSIBLE_ROLES_PATH=str(REPO / "roles"),
               ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True, timeout=1200, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return proc.stdout


def effective(host, cgroup):
    path = f"/sys/fs/cgroup/{cgroup}/cpuset.cpus.effective"
    return probe.read(host, path).strip() if host.file(path).exists else None


def new_service_cpus(host):
    """The CPUs a unit started now in system.slice may use."""
    out = host.check_output("systemd-run --quiet --wait --pipe -p Type=oneshot grep Cpus_allowed_list /proc/self/status")
    return out.split(":", 1)[1].strip()


def irqbalance_env(host):
    pid = int(host.check_output("systemctl show --property=MainPID --value irqbalance.service"))
    assert pid > 0, "irqbalance is not running"
    raw = host.check_output(f"tr '\\0' '\\n' < /proc/{pid}/environ")
    return dict(line.split("=", 1) for line in raw.splitlines() if "=" in line)


def test_housekeeping_confinement_and_irqbalance_ban_then_back(host):
    housekeeping = probe.node_cpulist(host, probe.OTHER_NODE)
    workers = probe.node_cpulist(host, probe.NODE)
    every = probe.read(host, "/sys/devices/system/cpu/online").strip()
    assert host.service("irqbalance").is_running
    assert "IRQBALANCE_BANNED_CPULIST" not in irqbalance_env(host)

    site(numa_binding_housekeeping_confine=True, numa_binding_irqbalance_ban=True,
         gpunuma_housekeeping_cpus=housekeeping)
    for path in DROPINS + [IRQ_DROPIN, f"{UNIT_DIR}/gpunuma.slice"]:
        assert host.file(path).exists, path
    for cgroup in ("system.slice", "user.slice", "init.scope"):
        assert effective(host, cgroup) == housekeeping, cgroup
    assert probe.status_field(host, 1, "Cpus_allowed_list") == housekeeping
    assert new_service_cpus(host) == housekeeping
    # The instances run beside system.slice, on node 1, still bound.
    for name in probe.INSTANCES:
        unit = f"gpunuma-{name}.service"
        assert host.check_output(f"systemctl show --property=Slice --value {unit}") == "gpunuma.slice"
        pid = probe.main_pid(host, name)
        assert host.file(f"/proc/{pid}/cgroup").content_string.strip().endswith(f"/gpunuma.slice/{unit}")
        assert probe.status_field(host, pid, "Cpus_allowed_list") == workers
    assert probe.numa_maps(host, probe.main_pid(host, "llm0"))[0][0] == f"bind:{probe.NODE}"
    env = irqbalance_env(host)
    assert env.get("IRQBALANCE_BANNED_CPULIST") == workers
    # The same run again changes nothing.
    assert "changed=0" in site(numa_binding_housekeeping_confine=True, numa_binding_irqbalance_ban=True,
                               gpunuma_housekeeping_cpus=housekeeping).split("PLAY RECAP", 1)[1]

    # Both options off: the drop-ins go, every CPU is everyone's again.
    site()
    for path in DROPINS + [IRQ_DROPIN, f"{UNIT_DIR}/gpunuma.slice"]:
        assert not host.file(path).exists, path
    for cgroup in ("system.slice", "user.slice", "init.scope"):
        assert effective(host, cgroup) in (None, every), cgroup
    assert probe.status_field(host, 1, "Cpus_allowed_list") == every
    assert new_service_cpus(host) == every
    assert "IRQBALANCE_BANNED_CPULIST" not in irqbalance_env(host)
    for name in probe.INSTANCES:
        assert host.check_output(f"systemctl show --property=Slice --value gpunuma-{name}.service") == "system.slice"
    assert probe.status_field(host, probe.main_pid(host, "llm0"), "Cpus_allowed_list") == workers
