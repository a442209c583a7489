"""What site.yml did to the numa_vm guest, checked on live kernel state.

Discovery must have placed the GPU (the recorded H200, mapped onto the
stand-in device behind node 1's expander bridge) and the NIC on node 1 from
the guest's own sysfs; the planner must have bound both instances to node
1; and the running processes must show it: CPU affinity, memory policy,
where their pages really are, the locked-memory limit. kernel.numa_balancing
must be off although the kernel booted with it on.

Each instance is also fenced by its cgroup (AllowedCPUs=, and
AllowedMemoryNodes= for the bind policy): a process inside cannot widen its
CPU affinity past the fence, and a bind instance's Mems_allowed_list is its
node. A preferred instance keeps every node allowed: its policy prefers node
1 and may spill, by design.

test_reboot.py runs after this file and reboots the guest.
"""

import json
import os

import pytest

import gpunuma_probe as probe

SCENARIO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDED_DUMP = os.path.join(
    SCENARIO_DIR, "..", "..", "tests", "fixtures", "recorded", "h200-vm", "nvml-dump.json"
)
NAMES = sorted(probe.INSTANCES)


@pytest.fixture(scope="module")
def topology(host):
    return probe.load_json(host, "/etc/gpunuma/topology.json")


@pytest.fixture(scope="module")
def plan(host):
    return probe.load_json(host, "/etc/gpunuma/plan.json")


@pytest.fixture(scope="module")
def recorded_gpu():
    with open(RECORDED_DUMP) as handle:
        return json.load(handle)["gpus"][0]


def _plan_instance(plan, name):
    matches = [i for i in plan["instances"] if i["name"] == name]
    assert len(matches) == 1, f"plan.json has {len(matches)} instances named {name}"
    return matches[0]


# -- discovery ----------------------------------------------------------------


def test_topology_has_the_guests_two_nodes(host, topology):
    nodes = {n["id"]: n["cpus"] for n in topology["numa_nodes"]}
    assert nodes == {0: probe.node_cpulist(host, 0), 1: probe.node_cpulist(host, 1)}
    assert topology["sockets"] == 2


def test_gpu_identity_comes_from_the_recorded_dump(topology, recorded_gpu):
    assert topology["sources"] == ["nvml", "sysfs"]
    assert [(g["index"], g["uuid"], g["name"]) for g in topology["gpus"]] == [
        (0, recorded_gpu["uuid"], recorded_gpu["name"])
    ]


def test_gpu_sits_on_the_standin_and_node_1_from_sysfs(host, topology):
    standins = probe.standin_bus_ids(host)
    assert len(standins) == 1, standins
    bus = standins[0]
    sysfs_node = int(probe.read(host, f"/sys/bus/pci/devices/{bus}/numa_node"))
    assert sysfs_node == probe.NODE
    gpu = topology["gpus"][0]
    assert gpu["pci_bus_id"] == bus
    assert (gpu["numa_node"], gpu["numa_node_source"]) == (sysfs_node, "sysfs")
    assert gpu["cpu_affinity"] == probe.node_cpulist(host, probe.NODE)


def test_nic_is_placed_on_node_1(host, topology):
    route = json.loads(host.check_output("ip -json route show default"))[0]["dev"]
    nics = [n for n in topology["nics"] if route in n["netdevs"]]
    assert len(nics) == 1, topology["nics"]
    sysfs_node = int(probe.read(host, f"/sys/class/net/{route}/device/numa_node"))
    assert nics[0]["numa_node"] == sysfs_node == probe.NODE


def test_topology_warns_about_nothing(topology):
    assert topology["warnings"] == []
    assert topology["complete"] is True


# -- the plan -----------------------------------------------------------------


def test_plan_has_exactly_the_instances(plan):
    assert sorted(i["name"] for i in plan["instances"]) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_plan_binds_the_instance_to_node_1(host, plan, name):
    instance = _plan_instance(plan, name)
    assert instance["numa_nodes"] == [probe.NODE]
    assert instance["mem_nodes"] == [probe.NODE]
    assert instance["cpus"] == plan["worker_cpus"][str(probe.NODE)] == probe.node_cpulist(host, probe.NODE)
    assert instance["binding_method"] == probe.INSTANCES[name]["method"]


def test_gpu_instance_is_strict(plan, topology):
    llm0 = _plan_instance(plan, "llm0")
    assert llm0["gpus"] == [0]
    assert llm0["environment"] == {"CUDA_VISIBLE_DEVICES": topology["gpus"][0]["uuid"]}
    assert (llm0["profile"], llm0["mem_policy"], llm0["fallback"]) == ("strict", "bind", None)


def test_oversized_instance_falls_back_to_preferred(host, plan):
    spill = _plan_instance(plan, "spill")
    node_total = int(
        next(line for line in probe.read(host, f"/sys/devices/system/node/node{probe.NODE}/meminfo").splitlines()
             if "MemTotal:" in line).split()[3]
    ) * 1024
    assert spill["memory_bytes"] == 4 * 1024**3 > node_total
    assert (spill["profile"], spill["mem_policy"]) == ("strict", "preferred")
    assert spill["fallback"] and "exceeds" in spill["fallback"] and f"NUMA node {probe.NODE}" in spill["fallback"]
    assert spill["systemd"] == {"CPUAffinity": spill["cpus"], "NUMAPolicy": "preferred", "NUMAMask": "1"}


# -- the running instances ----------------------------------------------------


@pytest.mark.parametrize("check", probe.INSTANCE_CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", NAMES)
def test_instance(host, name, check):
    check(host, name)


# -- the cgroup fences (numa_binding_fence: auto; the guest has cgroup v2 with cpuset)


@pytest.mark.parametrize("name", NAMES)
def test_instance_unit_is_fenced(host, name):
    """AllowedCPUs= on every bound instance; AllowedMemoryNodes= only where the
    policy is bind (a preferred instance may still spill, by design)."""
    unit = f"gpunuma-{name}.service"
    shown = host.check_output(f"systemctl show --property=AllowedCPUs,AllowedMemoryNodes -- {unit}")
    values = dict(line.split("=", 1) for line in shown.splitlines())
    cpus = probe.node_cpulist(host, probe.NODE)
    assert values["AllowedCPUs"] == cpus
    pid = probe.main_pid(host, name)
    if probe.INSTANCES[name]["policy"] == "bind":
        assert values["AllowedMemoryNodes"] == str(probe.NODE)
        assert probe.status_field(host, pid, "Mems_allowed_list") == str(probe.NODE)
    else:
        assert values["AllowedMemoryNodes"] == ""
        assert probe.status_field(host, pid, "Mems_allowed_list") == "0-1"


@pytest.mark.parametrize("name", NAMES)
def test_process_cannot_widen_itself_past_the_fence(host, name):
    """sched_setaffinity from inside (taskset here, an engine's own numactl in
    production) is clamped to the fence: asking for every CPU leaves it on node
    1's, and asking for node 0's alone is refused."""
    pid = probe.main_pid(host, name)
    cpus = probe.node_cpulist(host, probe.NODE)
    every = probe.read(host, "/sys/devices/system/cpu/online").strip()
    host.run(f"taskset -a -p -c {every} {pid}")
    assert probe.status_field(host, pid, "Cpus_allowed_list") == cpus
    other = probe.node_cpulist(host, 1 - probe.NODE)
    refused = host.run(f"taskset -a -p -c {other} {pid}")
    assert refused.rc != 0, refused.stdout + refused.stderr
    assert probe.status_field(host, pid, "Cpus_allowed_list") == cpus


# -- AutoNUMA -----------------------------------------------------------------


def test_numa_balancing_is_off_although_the_kernel_booted_with_it(host):
    assert "numa_balancing=enable" in probe.read(host, "/proc/cmdline").split()
    assert probe.read(host, "/proc/sys/kernel/numa_balancing").strip() == probe.NUMA_BALANCING
