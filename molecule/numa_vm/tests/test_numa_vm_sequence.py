"""Housekeeping confinement, irqbalance's ban, IRQ pinning and the rollback ladder on the guest.

One test, one sequence of playbook runs on the same guest, each run proving
the next step from the state the last one left (a playbook run is the
expensive part of this scenario: about a minute under TCG).

Housekeeping, where cgroups are real:

site.yml (the real playbook, molecule's inventory) with
numa_binding_housekeeping_confine and numa_binding_irqbalance_ban on and node
0's CPUs as the housekeeping set: system.slice, user.slice and init.scope end
up on node 0's CPUs (the kernel's cpuset.cpus.effective, and what a new
service and PID 1 are allowed), the instances run in gpunuma.slice on node
1's CPUs, irqbalance runs with node 1's CPUs banned. Then the same run with
both options off (and IRQ pinning on) puts the node back: no drop-in left,
every slice on every CPU again, irqbalance without the ban. The instances'
own bindings (llm0 on node 1, membind) hold throughout.

Both runs change both instances' units (they move between slices), which
proves the rolling restart live: with numa_binding_restart_batch 1 the
second instance becomes active only after the first settled (at least
numa_binding_settle_seconds later); with 2 they restart together.

IRQ pinning, the alternative to the ban, with irqbalance stopped: the
interrupts of llm0's NIC (the vmxnet3 behind node 1's bridge) go to the
housekeeping CPU of node 1, its own node (housekeeping for this run: node
0's CPUs and node 1's first; each node of the guest is a socket of its own,
so node 0's CPUs, on the other socket, are never used for them), and back
to the kernel's default when a plain site.yml run (the inventory's
settings) turns the option off. The ladder starts from that run.

The rollback ladder, where the binding is real: strict -> down -> off ->
strict with playbooks/rollback.yml (the real playbook, molecule's
inventory), checking after every step the live binding of llm0 on node 1
(memory policy from /proc/<pid>/numa_maps, CPUs from /proc/<pid>/status;
off: every CPU of both nodes), the node's state history, and that spill,
whose binding is the same under strict and preferred (its declared memory
exceeds node 1, so strict plans it preferred), kept its PID. The `previous`
action, whose live result is strict's again, is walked on the container of
molecule `rollback` (strict -> down -> previous -> off -> strict).

pytest collects files in name order: this runs after test_numa_vm.py and
ends on strict with the converged settings, so the reboot checks
(test_reboot.py) see the converged bindings.
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
SETTLE = 8

pytestmark = pytest.mark.skipif(INVENTORY is None, reason="run by molecule (MOLECULE_INVENTORY_FILE)")


def playbook(name, *extra, env_extra=None):
    cmd = ["ansible-playbook", "-i", os.path.dirname(INVENTORY), str(REPO / "playbooks" / name), "--limit", "numa-vm"]
    for item in extra:
        cmd += ["-e", json.dumps(item)]
    env = dict(os.environ, ANSIBLE_LIBRARY=str(REPO / "library"), ANSIBLE_MODULE_UTILS=str(REPO / "module_utils"),
               ANSIBLE_FILTER_PLUGINS=str(REPO / "filter_plugins"),
               ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_ROLES_PATH=str(REPO / "roles"),
               ANSIBLE_NOCOLOR="1", **(env_extra or {}))
    proc = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True, timeout=1200, env=env)
    return proc.returncode, proc.stdout + proc.stderr


def site(**extra):
    rc, out = playbook("site.yml", extra)
    assert rc == 0, out[-6000:]
    return out


def rollback(*extra):
    return playbook("rollback.yml", *extra, env_extra={"SUDO_USER": "oncall"})


def live(host, name):
    pid = probe.main_pid(host, name)
    policy = probe.read(host, f"/proc/{pid}/numa_maps").splitlines()[0].split()[1]
    return pid, policy, probe.status_field(host, pid, "Cpus_allowed_list")


def history(host):
    state = probe.load_json(host, "/etc/gpunuma/state.json")
    return state, [(h["from"], h["to"], h["action"]) for h in state["history"]]


def effective(host, cgroup):
    path = f"/sys/fs/cgroup/{cgroup}/cpuset.cpus.effective"
    return probe.read(host, path).strip() if host.file(path).exists else None


def new_service_cpus(host):
    """The CPUs a unit started now in system.slice may use."""
    out = host.check_output("systemd-run --quiet --wait --pipe -p Type=oneshot grep Cpus_allowed_list /proc/self/status")
    return out.split(":", 1)[1].strip()


def active_since(host, name):
    """When the instance last became active, in microseconds of CLOCK_MONOTONIC."""
    return int(host.check_output(
        f"systemctl show --property=ActiveEnterTimestampMonotonic --value gpunuma-{name}.service"))


def restart_gap_s(host, before):
    """Seconds between the two instances becoming active; both must have restarted since ``before``."""
    llm0, spill = active_since(host, "llm0"), active_since(host, "spill")
    assert llm0 > before["llm0"] and spill > before["spill"], "both instances restart when they change slice"
    return abs(spill - llm0) / 1e6


def irqbalance_env(host):
    pid = int(host.check_output("systemctl show --property=MainPID --value irqbalance.service"))
    assert pid > 0, "irqbalance is not running"
    raw = host.check_output(f"tr '\\0' '\\n' < /proc/{pid}/environ")
    return dict(line.split("=", 1) for line in raw.splitlines() if "=" in line)


def test_housekeeping_irq_pinning_and_the_rollback_ladder(host):
    housekeeping = probe.node_cpulist(host, probe.OTHER_NODE)
    workers = probe.node_cpulist(host, probe.NODE)
    every = probe.read(host, "/sys/devices/system/cpu/online").strip()
    assert host.service("irqbalance").is_running
    assert "IRQBALANCE_BANNED_CPULIST" not in irqbalance_env(host)

    # 1. Confinement and the ban; the instances move to gpunuma.slice one at a time.
    before = {name: active_since(host, name) for name in probe.INSTANCES}
    site(numa_binding_housekeeping_confine=True, numa_binding_irqbalance_ban=True,
         gpunuma_housekeeping_cpus=housekeeping, numa_binding_restart_batch=1, numa_binding_settle_seconds=SETTLE)
    assert restart_gap_s(host, before) >= SETTLE
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
    assert irqbalance_env(host).get("IRQBALANCE_BANNED_CPULIST") == workers

    # 2. Confinement and the ban off, IRQ pinning on (irqbalance stopped: it
    # would move pinned interrupts). The instances go back in one batch.
    host.check_output("systemctl stop irqbalance.service")
    try:
        # Every CPU first, so the pinning is what puts them on the housekeeping CPUs.
        host.check_output(f"for f in /proc/irq/*/smp_affinity_list; do echo {every} > $f 2>/dev/null; done; true")
        before = {name: active_since(host, name) for name in probe.INSTANCES}
        node1 = cpus_of(workers)
        own = str(node1[0])  # node 1's housekeeping CPU for this run; the rest of node 1 stays the workers'
        site(numa_binding_irq_pin=True, gpunuma_housekeeping_cpus=cpulist(cpus_of(housekeeping) + [node1[0]]),
             numa_binding_restart_batch=2, numa_binding_settle_seconds=SETTLE)
        assert restart_gap_s(host, before) < SETTLE
        for path in DROPINS + [IRQ_DROPIN, f"{UNIT_DIR}/gpunuma.slice"]:
            assert not host.file(path).exists, path
        for cgroup in ("system.slice", "user.slice", "init.scope"):
            assert effective(host, cgroup) in (None, every), cgroup
        assert probe.status_field(host, 1, "Cpus_allowed_list") == every
        assert new_service_cpus(host) == every
        for name in probe.INSTANCES:
            assert host.check_output(f"systemctl show --property=Slice --value gpunuma-{name}.service") == "system.slice"
        assert probe.status_field(host, probe.main_pid(host, "llm0"), "Cpus_allowed_list") == cpulist(node1[1:])
        assert host.service("gpunuma-irq-affinity.service").is_enabled
        assert host.check_output("systemctl is-active gpunuma-irq-affinity.service") == "active"
        # The NIC's own node's housekeeping CPU, never node 0's (another socket).
        assert set(nic_irqs(host).values()) == {own}

        # 3. site.yml with the inventory's settings: IRQ pinning is off, so its
        # unit stops and the interrupts get the default back; node 1's CPU
        # returns to the instances. The ladder starts from there.
        site()
        assert not host.file(f"{UNIT_DIR}/gpunuma-irq-affinity.service").exists
        assert not host.file("/usr/local/libexec/gpunuma/irq-affinity").exists
        assert set(nic_irqs(host).values()) == {every}
    finally:
        host.check_output("systemctl start irqbalance.service")
    assert "IRQBALANCE_BANNED_CPULIST" not in irqbalance_env(host)

    # 4. The ladder, with irqbalance running again.
    for _ in rollback_ladder(host, workers, every):
        pass


def rollback_ladder(host, cpus, every):
    """Run the ladder strict -> down -> off -> strict, checking each step; yields after each."""
    assert live(host, "llm0")[1:] == (f"bind:{probe.NODE}", cpus)
    spill_pid = live(host, "spill")[0]
    _, start = history(host)
    steps = [
        ({"gpunuma_rollback": "down", "gpunuma_reason": "P99 spike"}, (f"prefer:{probe.NODE}", cpus),
         ("strict", "preferred", "down")),
        ({"gpunuma_profile": "off"}, ("default", every), ("preferred", "off", "profile")),
        ({"gpunuma_profile": "strict"}, (f"bind:{probe.NODE}", cpus), ("off", "strict", "profile")),
    ]
    for count, (extra, want, entry) in enumerate(steps, start=len(start) + 1):
        rc, out = rollback(extra)
        assert rc == 0, out[-4000:]
        assert live(host, "llm0")[1:] == want, (extra, live(host, "llm0"))
        state, hist = history(host)
        assert len(hist) == count and hist[-1] == entry, hist
        assert state["profile"] == entry[1] and state["pinned"] is True
        assert state["history"][-1]["user"] == "oncall"
        if entry[0] in ("strict", "preferred") and entry[1] in ("strict", "preferred"):
            assert live(host, "spill")[0] == spill_pid, "spill's binding did not change: it must not restart"
        else:
            spill_pid = live(host, "spill")[0]
        yield entry
    assert history(host)[0]["history"][len(start)]["reason"] == "P99 spike"


def cpus_of(text):
    """The CPU ids of a kernel CPU list ("0-1,4")."""
    out = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    return out


def cpulist(cpus):
    """The kernel's canonical CPU list of ids."""
    cpus, parts, start = sorted(set(cpus)), [], None
    for i, cpu in enumerate(cpus):
        if start is None:
            start = cpu
        if i + 1 == len(cpus) or cpus[i + 1] != cpu + 1:
            parts.append(str(start) if start == cpu else "%d-%d" % (start, cpu))
            start = None
    return ",".join(parts)


def nic_irqs(host):
    bdf = host.check_output("basename $(readlink -f /sys/class/net/$(ls /sys/class/net | grep -v lo | head -1)/device)")
    irqs = host.check_output(f"ls /sys/bus/pci/devices/{bdf}/msi_irqs").split()
    assert irqs, f"{bdf} has no MSI interrupts"
    return {irq: probe.read(host, f"/proc/irq/{irq}/smp_affinity_list").strip() for irq in irqs}
