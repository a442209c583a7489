"""Live kernel state of the numa_vm guest's gpunuma instances, read over SSH.

Shared by the verifier's test files; every value comes from the guest's
/proc and /sys at the time of the call, never from what gpunuma wrote.
"""

import json
import re
import time

# What the scenario converges (molecule.yml host_vars): both instances on
# node 1, `llm0` strict (membind), `spill` falling back to preferred.
NODE = 1
OTHER_NODE = 0
INSTANCES = {
    "llm0": {"policy": "bind", "method": "numactl"},
    "spill": {"policy": "prefer", "method": "systemd"},
}
# Each instance allocates and writes 64 MiB before it waits.
ARENA_BYTES = 64 << 20
ARENA_WAIT_S = 60
# memlock_limit: 2G
MEMLOCK_BYTES = 2 * 1024**3
# autonuma_numa_balancing: 0
NUMA_BALANCING = "0"
STANDIN_VENDOR_DEVICE = "0x1b36:0x0005"

_NODE_PAGES = re.compile(r"\bN(\d+)=(\d+)\b")
_PAGE_KB = re.compile(r"\bkernelpagesize_kB=(\d+)\b")


def read(host, path):
    return host.file(path).content_string


def node_cpulist(host, node):
    """The CPUs the guest kernel puts on ``node``."""
    return read(host, f"/sys/devices/system/node/node{node}/cpulist").strip()


def main_pid(host, name):
    unit = f"gpunuma-{name}.service"
    pid = int(host.check_output(f"systemctl show --property=MainPID --value {unit}"))
    assert pid > 0, f"{unit} has no main process (systemctl show MainPID=0)"
    return pid


def status_field(host, pid, field):
    status = read(host, f"/proc/{pid}/status")
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key == field:
            return value.strip()
    raise AssertionError(f"{field} missing from /proc/{pid}/status")


def numa_maps(host, pid):
    """``/proc/<pid>/numa_maps`` as (policy, line) pairs."""
    text = read(host, f"/proc/{pid}/numa_maps")
    return [(line.split()[1], line) for line in text.splitlines() if line.strip()]


def anon_bytes_by_node(host, pid):
    """Bytes of the process's anonymous mappings (heap, arena, stack) per node.

    File mappings are left out: their N<node>= counts include page-cache
    pages that whichever process read the file first put on its own node.
    """
    totals = {}
    for _, line in numa_maps(host, pid):
        if " anon=" not in line or " file=" in line:
            continue
        page = int(_PAGE_KB.search(line).group(1)) * 1024
        for node, pages in _NODE_PAGES.findall(line):
            totals[int(node)] = totals.get(int(node), 0) + int(pages) * page
    return totals


def memlock_limits(host, pid):
    """(soft, hard, unit) of the ``Max locked memory`` row of /proc/<pid>/limits."""
    for line in read(host, f"/proc/{pid}/limits").splitlines():
        if line.startswith("Max locked memory"):
            return tuple(line[len("Max locked memory"):].split())
    raise AssertionError(f"/proc/{pid}/limits has no Max locked memory row")


def load_json(host, path):
    return json.loads(read(host, path))


def standin_bus_ids(host):
    """Bus ids of the guest's GPU stand-ins (QEMU pci-testdev), from sysfs."""
    out = host.check_output(
        "for d in /sys/bus/pci/devices/*; do "
        '[ "$(cat "$d/vendor"):$(cat "$d/device")" = %s ] && echo "${d##*/}"; done; true'
        % STANDIN_VENDOR_DEVICE
    )
    return out.split()


def unit_state(host, name):
    out = host.check_output(
        f"systemctl show --property=ActiveState,SubState,NRestarts -- gpunuma-{name}.service"
    )
    return dict(line.split("=", 1) for line in out.splitlines())


def boot_id(host):
    """The guest's boot id, or None while it cannot be reached (rebooting)."""
    try:
        result = host.run("cat /proc/sys/kernel/random/boot_id")
    except RuntimeError:
        # testinfra raises on SSH's own failures (exit status 255).
        return None
    return result.stdout.strip() if result.rc == 0 else None


# -- checks of one running instance, used before and after the reboot -------


def check_running(host, name):
    state = unit_state(host, name)
    assert (state["ActiveState"], state["SubState"]) == ("active", "running"), state


def check_cpus(host, name):
    """The process may run on node 1's CPUs and nowhere else.

    No housekeeping cores are reserved in this scenario, so node 1's worker
    CPUs are all of node 1's CPUs as the kernel lists them.
    """
    pid = main_pid(host, name)
    assert status_field(host, pid, "Cpus_allowed_list") == node_cpulist(host, NODE)


def check_policy(host, name):
    """Every mapping of the process carries the planned policy on node 1."""
    expected = f"{INSTANCES[name]['policy']}:{NODE}"
    policies = {policy for policy, _ in numa_maps(host, main_pid(host, name))}
    assert policies == {expected}


def check_memory_placement(host, name):
    """The process's anonymous memory (its 64 MiB arena included) is on node 1.

    bind: not one page on node 0. prefer: node 0 may hold some (the
    policy allows it) but node 1, with room to spare, holds nearly all.
    """
    # Right after a boot the process may still be writing its arena.
    deadline = time.monotonic() + ARENA_WAIT_S
    while True:
        by_node = anon_bytes_by_node(host, main_pid(host, name))
        if sum(by_node.values()) >= ARENA_BYTES or time.monotonic() > deadline:
            break
        time.sleep(2)
    on_node = by_node.get(NODE, 0)
    elsewhere = sum(size for node, size in by_node.items() if node != NODE)
    assert on_node >= ARENA_BYTES, f"only {on_node} bytes of anonymous memory on node {NODE}: {by_node}"
    if INSTANCES[name]["policy"] == "bind":
        assert elsewhere == 0, f"membind instance has {elsewhere} bytes off node {NODE}: {by_node}"
    else:
        assert elsewhere <= on_node // 10, f"preferred instance mostly off node {NODE}: {by_node}"


def check_memlock(host, name):
    soft, hard, unit = memlock_limits(host, main_pid(host, name))
    assert (soft, hard, unit) == (str(MEMLOCK_BYTES), str(MEMLOCK_BYTES), "bytes")


INSTANCE_CHECKS = [check_running, check_cpus, check_policy, check_memory_placement, check_memlock]
