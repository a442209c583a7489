"""NUMA facts of the numa_vm guest that every gpunuma role test builds on.

The VM is started by scripts/vm/numa-vm.sh with two NUMA nodes (CPUs 0-1 and
2-3, one socket each, 1 GiB each) and its only NIC behind a PCI expander
bridge on node 1. If any of these fail, the role tests on this VM prove
nothing about NUMA, so they are checked first and on live kernel state.
"""

import json

import pytest

import gpunuma_probe as probe

NODE_CPUS = {0: "0-1", 1: "2-3"}
NIC_NODE = 1


def _status_field(status_text, field):
    for line in status_text.splitlines():
        key, _, value = line.partition(":")
        if key == field:
            return value.strip()
    raise AssertionError(f"{field} missing from /proc/<pid>/status:\n{status_text}")


def _default_route_nic(host):
    routes = json.loads(host.check_output("ip -json route show default"))
    assert routes, "the guest has no default route"
    return routes[0]["dev"]


def test_exactly_two_nodes_online(host):
    assert host.file("/sys/devices/system/node/online").content_string.strip() == "0-1"
    assert host.file("/sys/devices/system/node/has_cpu").content_string.strip() == "0-1"


@pytest.mark.parametrize("node,cpus", sorted(NODE_CPUS.items()))
def test_node_cpulist(host, node, cpus):
    cpulist = host.file(f"/sys/devices/system/node/node{node}/cpulist")
    assert cpulist.content_string.strip() == cpus


@pytest.mark.parametrize("node", sorted(NODE_CPUS))
def test_node_has_its_own_memory(host, node):
    meminfo = host.file(f"/sys/devices/system/node/node{node}/meminfo").content_string
    total_kb = int(
        next(line for line in meminfo.splitlines() if "MemTotal:" in line).split()[3]
    )
    # 1 GiB per node, less what firmware and the kernel reserve.
    assert 600 * 1024 < total_kb <= 1024 * 1024


@pytest.mark.parametrize("node,distances", [(0, "10 20"), (1, "20 10")])
def test_node_distances(host, node, distances):
    distance = host.file(f"/sys/devices/system/node/node{node}/distance")
    assert distance.content_string.strip() == distances


@pytest.mark.parametrize("cpu,package", [(0, 0), (1, 0), (2, 1), (3, 1)])
def test_each_node_is_one_socket(host, cpu, package):
    package_id = host.file(f"/sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id")
    assert int(package_id.content_string) == package


def test_nic_sits_on_node_1(host):
    # Like a physical NIC (and unlike virtio-net), the vmxnet3 netdev's
    # `device` link is the PCI function itself, where numa_node lives.
    nic = _default_route_nic(host)
    device = f"/sys/class/net/{nic}/device"
    assert int(host.file(f"{device}/numa_node").content_string) == NIC_NODE
    assert host.file(f"{device}/local_cpulist").content_string.strip() == NODE_CPUS[NIC_NODE]


def test_nic_hangs_off_the_expander_bridge(host):
    nic = _default_route_nic(host)
    pci_path = host.check_output(f"readlink -f /sys/class/net/{nic}/device")
    # The pxb host bridge owns root bus 0x20 (bus_nr=32); everything on
    # node 0 sits under root bus 0.
    assert pci_path.startswith("/sys/devices/pci0000:20/"), pci_path


@pytest.mark.parametrize("node,cpus", sorted(NODE_CPUS.items()))
def test_numactl_binds_cpus_and_memory(host, node, cpus):
    # Mems_allowed_list is the cpuset (see the systemd test below);
    # --membind sets the memory policy, visible per mapping in numa_maps.
    out = host.check_output(
        f"numactl --cpunodebind={node} --membind={node} "
        "sh -c 'cat /proc/self/status; echo ---; cat /proc/self/numa_maps'"
    )
    status_text, _, numa_maps = out.partition("---")
    assert _status_field(status_text, "Cpus_allowed_list") == cpus
    policies = {line.split()[1] for line in numa_maps.strip().splitlines()}
    assert policies == {f"bind:{node}"}


# Starting a unit with AllowedCPUs= makes systemd switch the cpuset
# controller on (and off again) above it, and Linux 6.1 then resets the CPU
# affinity of every task below to all CPUs: it undoes the running gpunuma
# instances' numactl --physcpubind / CPUAffinity= binding (their memory policy
# stays). This file therefore runs after test_gpunuma_binding.py (pytest
# takes files in name order), and test_reboot.py reboots the guest before
# checking the bindings again.
@pytest.mark.parametrize("node,cpus", sorted(NODE_CPUS.items()))
def test_systemd_cpuset_confines_cpus_and_memory(host, node, cpus):
    status_text = host.check_output(
        f"systemd-run --quiet --wait --pipe -p AllowedCPUs={cpus} "
        f"-p AllowedMemoryNodes={node} cat /proc/self/status"
    )
    assert _status_field(status_text, "Cpus_allowed_list") == cpus
    assert _status_field(status_text, "Mems_allowed_list") == str(node)


@pytest.mark.parametrize("name", sorted(probe.INSTANCES))
def test_fenced_instances_keep_their_cpus_after_a_cpuset_change(host, name):
    """The trap above (a unit started with AllowedCPUs= resets the affinity of
    running tasks to their cgroup's CPUs) is harmless to a fenced instance: its
    cgroup's CPUs are its binding."""
    host.check_output("systemd-run --quiet --wait --pipe -p AllowedCPUs=0 true")
    pid = probe.main_pid(host, name)
    assert probe.status_field(host, pid, "Cpus_allowed_list") == probe.node_cpulist(host, probe.NODE)


def test_unbound_process_sees_both_nodes(host):
    status_text = host.check_output("cat /proc/self/status")
    assert _status_field(status_text, "Cpus_allowed_list") == "0-3"
    assert _status_field(status_text, "Mems_allowed_list") == "0-1"


def test_systemd_limit_memlock_reaches_the_process(host):
    limits = host.check_output(
        "systemd-run --quiet --wait --pipe -p LimitMEMLOCK=infinity cat /proc/self/limits"
    )
    memlock = next(line for line in limits.splitlines() if line.startswith("Max locked memory"))
    assert memlock.split()[3:5] == ["unlimited", "unlimited"], memlock


def test_numa_balancing_is_readable(host):
    proc_value = host.file("/proc/sys/kernel/numa_balancing").content_string.strip()
    assert proc_value in {"0", "1", "2", "3"}
    assert host.check_output("sysctl -n kernel.numa_balancing") == proc_value
