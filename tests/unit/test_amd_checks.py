"""node_checks on nodes with AMD Instinct GPUs: the MI300X guide's NPS1, iommu=pt, C2 and NUMA balancing advice.

Trees are laid out like sysfs (tests/sysfs_factory.py): 8 GPUs of PCI class 0x1200
(processing accelerator, as MI300X functions are) from vendor 0x1002 on a 2-socket host,
in NPS1 (2 nodes) or NPS4 (8 nodes). A node with NVIDIA GPUs only gets none of these
findings.
"""

import os

import pytest

from ansible.module_utils.gpunuma.verify import amd_checks
from ansible.module_utils.gpunuma.verify import node_checks as nc
from ansible.module_utils.gpunuma.verify import node_facts
from sysfs_factory import NVIDIA, build_tree, node_platform

pytestmark = pytest.mark.unit

AMD = "0x1002"
GOOD_CMDLINE = "BOOT_IMAGE=/vmlinuz ro quiet iommu=pt"


def mi300x_host(root, nps=1, cmdline=GOOD_CMDLINE, c2_enabled=(), numa_balancing=0, gpu_class="0x120000",
                vendor=AMD):
    """2 sockets of 8 cores, ``nps`` NUMA nodes per socket, 4 GPUs per socket; cpuidle C2 on every CPU."""
    per_node = 8 // nps
    nodes, cpus = [], {}
    for node in range(2 * nps):
        first = list(range(per_node * node, per_node * node + per_node))
        nodes.append({"id": node, "cpus": first, "mem_kb": 1 << 20, "free_kb": 1 << 19})
        for cpu in first:
            cpus[cpu] = (node // nps, cpu, [cpu])
    pci = [{"bdf": "0000:%02x:00.0" % (0x05 + 0x10 * i), "vendor": vendor, "device": "0x74a1", "class": gpu_class,
            "numa_node": (i // 4) * nps, "parents": [], "max_link_speed": "32.0 GT/s PCIe", "max_link_width": 16,
            "current_link_speed": "32.0 GT/s PCIe", "current_link_width": 16} for i in range(8)]
    build_tree(str(root), nodes, cpus=cpus, pci=pci, numa_balancing=numa_balancing)
    node_platform(str(root), governors={cpu: "performance" for cpu in range(16)}, cmdline=cmdline)
    for cpu in range(16):
        for index, name in enumerate(("POLL", "C1", "C2")):
            state = root / "sys/devices/system/cpu" / ("cpu%d" % cpu) / "cpuidle" / ("state%d" % index)
            state.mkdir(parents=True, exist_ok=True)
            (state / "name").write_text(name + "\n")
            (state / "disable").write_text("0\n" if (name != "C2" or cpu in c2_enabled) else "1\n")
    return str(root)


def amd_findings(root, profile="strict"):
    facts = node_facts.read_node(root)
    return [f for f in nc.evaluate(facts, profile) if f.check in amd_checks.CHECKS]


def test_a_node_set_up_as_the_guide_says_has_no_amd_finding(tmp_path):
    root = mi300x_host(tmp_path)
    assert [f.as_dict() for f in amd_findings(root)] == []
    assert node_facts.read_node(root).amd["gpus"][0] == "0000:05:00.0"


def test_nps4_is_a_warning_naming_each_split_socket_and_citing_the_guide(tmp_path):
    root = mi300x_host(tmp_path, nps=4)
    (finding,) = amd_findings(root)
    assert (finding.check, finding.severity) == ("amd_nps", "warning")
    assert "split into 4 NUMA nodes (socket 0: nodes 0, 1, 2, 3; socket 1: nodes 4, 5, 6, 7)" in finding.message
    assert amd_checks.GUIDE_URL in finding.message and "NPS1" in finding.fix


@pytest.mark.parametrize("cmdline, found", [
    ("BOOT_IMAGE=/vmlinuz ro quiet", True),
    ("BOOT_IMAGE=/vmlinuz ro amd_iommu=on", True),
    ("BOOT_IMAGE=/vmlinuz ro iommu=pt", False),
    ("BOOT_IMAGE=/vmlinuz ro intel_iommu=on iommu=pt", False),
    ("BOOT_IMAGE=/vmlinuz ro iommu.passthrough=1", False),
])
def test_iommu_pass_through_is_asked_for(tmp_path, cmdline, found):
    root = mi300x_host(tmp_path, cmdline=cmdline)
    checks = [f.check for f in amd_findings(root)]
    assert ("amd_iommu" in checks) is found
    if found:
        (finding,) = [f for f in amd_findings(root) if f.check == "amd_iommu"]
        assert finding.evidence[0].value == cmdline and "intel_iommu=on iommu=pt" in finding.fix


def test_c2_enabled_cpus_are_named(tmp_path):
    root = mi300x_host(tmp_path, c2_enabled=range(16))
    (finding,) = [f for f in amd_findings(root) if f.check == "amd_c2_state"]
    assert finding.severity == "warning"
    assert "enabled on 16 CPUs (0, 1, 2, 3, 4, 5, 6, 7 and 8 more)" in finding.message
    assert "cpupower idle-set -d 2" in finding.fix


def test_numa_balancing_on_is_measured_advice(tmp_path):
    root = mi300x_host(tmp_path, numa_balancing=1)
    (finding,) = [f for f in amd_findings(root) if f.check == "amd_numa_balancing"]
    assert finding.severity == "info" and "compare 0 and 1" in finding.message


@pytest.mark.parametrize("gpu_class, vendor, instinct", [
    ("0x120000", AMD, True), ("0x038000", AMD, True), ("0x030200", AMD, True),
    ("0x030000", AMD, False),  # a VGA controller (an APU's or a BMC's), not an accelerator
    ("0x030200", NVIDIA, False),
])
def test_only_amd_accelerators_count(tmp_path, gpu_class, vendor, instinct):
    root = mi300x_host(tmp_path, nps=4, cmdline="ro", gpu_class=gpu_class, vendor=vendor)
    assert bool(amd_findings(root)) is instinct
    assert (node_facts.read_node(root).amd is not None) is instinct


def test_the_findings_are_known_checks_of_node_checks():
    assert set(amd_checks.CHECKS) <= set(nc.CHECKS)
