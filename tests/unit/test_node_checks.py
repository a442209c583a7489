"""node_checks core: findings from synthetic sysfs trees and from the recorded H200 VM."""

import json
import os

import pytest

from ansible.module_utils.gpunuma.verify import node_checks as nc
from ansible.module_utils.gpunuma.verify import node_facts
from ansible.module_utils.gpunuma.verify import pci_acs
from ansible.module_utils.gpunuma.discovery.nvidia.nvml_dump import validate_dump
from conftest import FIXTURES
from sysfs_factory import NVIDIA, build_tree, node_platform

pytestmark = pytest.mark.unit

GPU = "0000:18:00.0"
ROOT_PORT, SWITCH_UP, SWITCH_DOWN = "0000:15:01.0", "0000:16:00.0", "0000:17:00.0"
GEN4, GEN5, GEN1 = "16.0 GT/s PCIe", "32.0 GT/s PCIe", "2.5 GT/s PCIe"
RECORDED = os.path.join(FIXTURES, "recorded", "h200-vm")
SMI_Q = os.path.join(FIXTURES, "node_checks", "nvidia-smi-q-h200.txt")


def _bridge(bdf, parents, speed=GEN5, width=16, current_speed=None, current_width=None):
    return {"bdf": bdf, "vendor": "0x8086", "device": "0x1234", "class": "0x060400", "numa_node": 1,
            "parents": parents, "max_link_speed": speed, "max_link_width": width,
            "current_link_speed": current_speed or speed, "current_link_width": current_width or width}


def make_tree(root, gpu_speed=GEN5, gpu_width=16, cur_speed=None, cur_width=None, down_port=None,
              numa_balancing=1, **platform):
    nodes = [{"id": 0, "cpus": "0-3", "mem_kb": 1024, "free_kb": 512},
             {"id": 1, "cpus": "4-7", "mem_kb": 1024, "free_kb": 512}]
    gpu = {"bdf": GPU, "vendor": NVIDIA, "device": "0x2330", "class": "0x030200", "numa_node": 1,
           "parents": [ROOT_PORT, SWITCH_UP, SWITCH_DOWN],
           "max_link_speed": gpu_speed, "max_link_width": gpu_width,
           "current_link_speed": cur_speed or gpu_speed, "current_link_width": cur_width or gpu_width}
    pci = [_bridge(ROOT_PORT, []), _bridge(SWITCH_UP, [ROOT_PORT]),
           down_port or _bridge(SWITCH_DOWN, [ROOT_PORT, SWITCH_UP]), gpu]
    build_tree(str(root), nodes, pci=pci, numa_balancing=numa_balancing)
    defaults = {"governors": {cpu: "performance" for cpu in range(8)}}
    defaults.update(platform)
    node_platform(str(root), **defaults)
    return str(root)


def findings(root, profile=None, expect_full_speed=False, check=None, severity=None):
    facts = node_facts.read_node(root)
    out = nc.evaluate(facts, profile, expect_full_speed)
    return [f for f in out if (check is None or f.check == check) and (severity is None or f.severity == severity)]


def test_healthy_node_has_no_warning(tmp_path):
    root = make_tree(tmp_path, numa_balancing=0)
    assert [f.as_dict() for f in findings(root, "strict") if f.severity != "info"] == []


def test_downtrained_width_is_a_warning_with_the_files_read(tmp_path):
    root = make_tree(tmp_path, cur_width=8)
    (finding,) = findings(root, check="pcie_link")
    assert finding.severity == "warning" and finding.gpu == GPU
    assert "x8 is below the x16" in finding.message
    files = {e.file: e.value for e in finding.evidence}
    assert files[os.path.join(root, "sys/bus/pci/devices", GPU, "current_link_width")] == "8"
    assert files[os.path.join(root, "sys/bus/pci/devices", GPU, "max_link_width")] == "16"
    assert "bifurcation" in finding.fix


def test_generation_downshift_is_info_when_idle_and_warning_under_load(tmp_path):
    root = make_tree(tmp_path, cur_speed=GEN1)
    (idle,) = findings(root, check="pcie_link")
    assert idle.severity == "info"
    assert "Gen1, below the Gen5" in idle.message and "idle" in idle.message
    (busy,) = findings(root, expect_full_speed=True, check="pcie_link")
    assert busy.severity == "warning"


def test_port_above_a_slower_gpu_is_not_a_fault(tmp_path):
    # Gen5 switch port, Gen4 GPU: the shared link trains to Gen4, as it should.
    root = make_tree(tmp_path, gpu_speed=GEN4,
                     down_port=_bridge(SWITCH_DOWN, [ROOT_PORT, SWITCH_UP], current_speed=GEN4))
    assert findings(root, expect_full_speed=True, check="pcie_link") == []


def test_downtrained_upstream_bridge_is_reported_against_the_gpu(tmp_path):
    root = make_tree(tmp_path, down_port=None)
    # The switch's upstream link (root port <-> switch) trained at x4.
    path = os.path.join(root, "sys/bus/pci/devices", SWITCH_UP, "current_link_width")
    with open(path, "w") as handle:
        handle.write("4\n")
    (finding,) = findings(root, check="pcie_link")
    assert finding.subject == "bridge %s above gpu %s" % (SWITCH_UP, GPU)
    assert finding.severity == "warning" and finding.gpu == GPU


def test_acs_redirect_on_a_bridge_is_a_warning_citing_nccl(tmp_path):
    root = make_tree(tmp_path, acs={SWITCH_DOWN: pci_acs.ACS_RR | pci_acs.ACS_CR | 0x1, SWITCH_UP: 0x0, ROOT_PORT: 0x0})
    (finding,) = findings(root, check="acs")
    assert finding.severity == "warning"
    assert finding.subject == "bridge %s above gpu %s" % (SWITCH_DOWN, GPU)
    assert "ReqRedir" in finding.message and "CmpltRedir" in finding.message
    assert nc.NCCL_ACS_URL in finding.message
    assert finding.evidence[0].value == "ACSCtl=0x000d"


def test_acs_without_redirect_bits_is_fine(tmp_path):
    root = make_tree(tmp_path, acs={SWITCH_DOWN: 0x1, SWITCH_UP: 0x0, ROOT_PORT: 0x0})
    assert findings(root, check="acs") == []


def test_acs_unreadable_without_root_is_info(tmp_path):
    root = make_tree(tmp_path)
    (finding,) = findings(root, check="acs")
    assert finding.severity == "info" and "readable only by root" in finding.message


def test_acs_capability_list_that_loops_is_a_finding_naming_the_file(tmp_path):
    root = make_tree(tmp_path, acs={SWITCH_UP: 0})
    config = os.path.join(root, "sys/bus/pci/devices", SWITCH_UP, "config")
    data = bytearray(4096)
    data[0x100:0x104] = (0x0001 | (0x100 << 20)).to_bytes(4, "little")  # next points to itself
    with open(config, "wb") as handle:
        handle.write(bytes(data))
    (problem,) = findings(root, check="unreadable")
    assert config in problem.message and "looping" in problem.message


@pytest.mark.parametrize("cmdline,severity", [
    ("ro quiet intel_iommu=on", "warning"),
    ("ro amd_iommu=on iommu=force", "warning"),
    ("ro intel_iommu=on iommu=pt", None),
    ("ro quiet", None),
])
def test_kernel_command_line_iommu(tmp_path, cmdline, severity):
    root = make_tree(tmp_path, cmdline=cmdline)
    found = findings(root, check="iommu")
    if severity is None:
        assert found == []
    else:
        (finding,) = found
        assert finding.severity == severity and "iommu=pt" in finding.fix
        assert finding.evidence[0].value == cmdline


def test_iommu_groups_without_mode_argument_is_info(tmp_path):
    root = make_tree(tmp_path, iommu_groups={GPU: 42})
    (finding,) = findings(root, check="iommu")
    assert finding.severity == "info" and "42" in finding.message


def test_governor_only_on_the_gpu_nodes_cpus(tmp_path):
    governors = {cpu: "powersave" if cpu in (0, 5, 6) else "performance" for cpu in range(8)}
    root = make_tree(tmp_path, governors=governors)
    (finding,) = findings(root, check="cpu_governor")
    assert finding.severity == "warning"
    assert "2 of the GPU nodes' CPUs (5-6)" in finding.message  # CPU 0 is on the GPU-less node
    assert [e.value for e in finding.evidence] == ["powersave", "powersave"]
    facts = node_facts.read_node(root)
    assert [f["cpu"] for f in nc.plan_fixes(facts, fix_governor=True)] == [5, 6]
    assert nc.plan_fixes(facts) == []


def test_governor_fix_skips_cpus_without_the_performance_governor(tmp_path):
    root = make_tree(tmp_path, governors={cpu: "schedutil" for cpu in range(8)}, available="schedutil")
    assert nc.plan_fixes(node_facts.read_node(root), fix_governor=True) == []


def test_absent_cpufreq_is_info(tmp_path):
    root = make_tree(tmp_path, governors={})
    (finding,) = findings(root, check="cpu_governor")
    assert finding.severity == "info" and "cpufreq is absent" in finding.message


@pytest.mark.parametrize("enabled,defrag,severity", [
    ("[always] madvise never", "[always] defer defer+madvise madvise never", "warning"),
    ("[always] madvise never", "always defer defer+madvise [madvise] never", "info"),
    ("always madvise [never]", "always defer defer+madvise [madvise] never", "info"),
])
def test_thp(tmp_path, enabled, defrag, severity):
    root = make_tree(tmp_path, thp_enabled=enabled, thp_defrag=defrag)
    (finding,) = findings(root, check="thp")
    assert finding.severity == severity


@pytest.mark.parametrize("profile,value,severity", [
    ("strict", 1, "warning"), ("strict", 0, "info"), ("preferred", 1, "info"), ("off", 1, "info"), (None, 1, "info"),
])
def test_numa_balancing_against_the_profile(tmp_path, profile, value, severity):
    root = make_tree(tmp_path, numa_balancing=value)
    (finding,) = findings(root, profile, check="numa_balancing")
    assert finding.severity == severity
    if severity == "warning":
        assert nc.KERNEL_NUMA_BALANCING_URL in finding.message


def _with_release(root, release):
    with open(os.path.join(root, "proc/sys/kernel/osrelease"), "w", encoding="ascii") as handle:
        handle.write(release + "\n")
    return root


@pytest.mark.parametrize("release", ["5.12.0", "6.1.0-28-amd64", "6.8.0-1015-nvidia"])
def test_numa_balancing_1_with_strict_on_5_12_or_later_is_info_with_the_reason(tmp_path, release):
    # autonuma_numa_balancing auto leaves the key there: membind workers are neither scanned nor migrated.
    root = _with_release(make_tree(tmp_path, numa_balancing=1), release)
    (finding,) = findings(root, "strict", check="numa_balancing")
    assert finding.severity == "info"
    assert "on kernel %s (5.12 or later)" % release in finding.message
    assert "MPOL_F_NUMA_BALANCING" in finding.message and "bda420b98505" in finding.message
    files = {e.file: e.value for e in finding.evidence}
    assert files[os.path.join(root, "proc/sys/kernel/osrelease")] == release
    assert files[os.path.join(root, "proc/sys/kernel/numa_balancing")] == 1


@pytest.mark.parametrize("release,shown", [
    ("5.11.22", "kernel 5.11.22 (older than 5.12)"),
    ("4.18.0-553.el8_10.x86_64", "kernel 4.18.0-553.el8_10.x86_64 (older than 5.12)"),
    ("garbage", "kernel of unknown release"),
    (None, "kernel of unknown release"),
])
def test_numa_balancing_1_with_strict_before_5_12_or_unknown_stays_a_warning(tmp_path, release, shown):
    root = make_tree(tmp_path, numa_balancing=1)
    if release is not None:
        _with_release(root, release)
    (finding,) = findings(root, "strict", check="numa_balancing")
    assert finding.severity == "warning"
    assert shown in finding.message and nc.KERNEL_NUMA_BALANCING_URL in finding.message
    assert node_facts.read_node(root).kernel_release == release


def test_kernel_release_does_not_change_the_other_numa_balancing_findings(tmp_path):
    root = _with_release(make_tree(tmp_path, numa_balancing=0), "4.19.0")
    assert [f.severity for f in findings(root, "strict", check="numa_balancing")] == ["info"]
    root = _with_release(make_tree(tmp_path / "pref", numa_balancing=1), "4.19.0")
    assert [f.severity for f in findings(root, "preferred", check="numa_balancing")] == ["info"]


@pytest.mark.parametrize("profile", ["strickt", "", 1, "STRICT", ["strict"]])
def test_unknown_profile_is_an_error_listing_the_choices(tmp_path, profile):
    root = make_tree(tmp_path)
    with pytest.raises(node_facts.NodeChecksError) as err:
        findings(root, profile)
    assert "strict, preferred, interleave, off" in str(err.value)


@pytest.mark.parametrize("rel,garbage", [
    ("sys/bus/pci/devices/%s/current_link_width" % GPU, "banana"),
    ("sys/bus/pci/devices/%s/max_link_speed" % GPU, "Unknown"),
    ("sys/bus/pci/devices/%s/current_link_speed" % SWITCH_DOWN, "999 GT/s PCIe"),
    ("sys/kernel/mm/transparent_hugepage/enabled", "[always] [never]"),
    ("sys/kernel/mm/transparent_hugepage/defrag", "\u00e9t\u00e9"),
    ("proc/sys/kernel/numa_balancing", "-1"),
    ("sys/devices/system/cpu/cpu5/cpufreq/scaling_governor", "Perf Ormance!"),
])
def test_garbage_in_a_file_is_a_finding_naming_it(tmp_path, rel, garbage):
    root = make_tree(tmp_path)
    with open(os.path.join(root, rel), "w", encoding="utf-8") as handle:
        handle.write(garbage + "\n")
    problems = findings(root, "strict", check="unreadable")
    assert len(problems) == 1
    assert problems[0].severity == "warning"
    assert os.path.join(root, rel) in problems[0].message


def test_attribute_that_is_a_fifo_or_directory_is_refused(tmp_path):
    root = make_tree(tmp_path)
    path = os.path.join(root, "proc/sys/kernel/numa_balancing")
    os.unlink(path)
    os.mkfifo(path)
    (problem,) = findings(root, check="unreadable")
    assert path in problem.message


def test_missing_root_and_root_without_sys(tmp_path):
    with pytest.raises(node_facts.NodeChecksError, match="does not exist or is not a directory"):
        node_facts.read_node(str(tmp_path / "nope"))
    with pytest.raises(node_facts.NodeChecksError, match="has no sys/ directory"):
        node_facts.read_node(str(tmp_path))


def test_parse_nvidia_smi_q_persistence():
    with open(SMI_Q) as handle:
        assert node_facts.parse_nvidia_smi_q(handle.read()) == {"0000:00:06.0": False}
    text = "GPU 00000000:18:00.0\n    Persistence Mode                      : Enabled\n"
    assert node_facts.parse_nvidia_smi_q(text) == {"0000:18:00.0": True}
    with pytest.raises(ValueError, match="Enabled, Disabled or N/A"):
        node_facts.parse_nvidia_smi_q("GPU 00000000:18:00.0\n    Persistence Mode : Maybe\n")
    with pytest.raises(ValueError, match="no 'GPU 0000:18:00.0' section"):
        node_facts.parse_nvidia_smi_q("NVSMI LOG\n")


def test_acs_control_from_config_bounds():
    assert pci_acs.acs_control_from_config(b"\0" * 64) is None  # unprivileged read: 64 bytes
    data = bytearray(4096)
    data[0x100:0x104] = (0x0001 | (0xFFC << 20)).to_bytes(4, "little")
    with pytest.raises(ValueError, match="outside"):
        pci_acs.acs_control_from_config(bytes(data))


# -- the recorded H200 VM ------------------------------------------------------

def _recorded():
    facts = node_facts.read_node(os.path.join(RECORDED, "sysfs"))
    with open(os.path.join(RECORDED, "nvml-dump.json")) as handle:
        nc.apply_nvml_pcie(facts, validate_dump(json.load(handle)))
    with open(SMI_Q) as handle:
        nc.apply_persistence(facts, node_facts.parse_nvidia_smi_q(handle.read()), "nvidia_smi_q_file " + SMI_Q)
    return facts


def test_recorded_h200_vm():
    facts = _recorded()
    assert [g.link.bdf for g in facts.gpus] == ["0000:00:06.0"]
    out = nc.evaluate(facts, "strict")
    by_check = {}
    for finding in out:
        by_check.setdefault(finding.check, []).append(finding)
    # Gen5 x16 in sysfs and NVML alike; numa_balancing 0; no cpufreq in the VM.
    assert "pcie_link" not in by_check and "unreadable" not in by_check
    assert [f.severity for f in by_check["numa_balancing"]] == ["info"]
    assert by_check["cpu_governor"][0].message.startswith("cpufreq is absent")
    (persistence,) = by_check["persistence_mode"]
    assert persistence.severity == "warning" and persistence.gpu == "0000:00:06.0"
    assert "nvidia-smi -i 0000:00:06.0 -pm 1" in persistence.fix
    assert nc.plan_fixes(facts, fix_persistence=True) == [
        {"kind": "persistence", "target": "0000:00:06.0", "before": "Disabled", "after": "Enabled",
         "argv": ["-i", "0000:00:06.0", "-pm", "1"]}]


def test_recorded_h200_nvml_downshift_is_info():
    facts = _recorded()
    facts.gpus[0].nvml_pcie = dict(facts.gpus[0].nvml_pcie, gen_current=1)
    (finding,) = [f for f in nc.evaluate(facts) if f.check == "pcie_link"]
    assert finding.severity == "info" and "NVML reports PCIe Gen1 below the maximum Gen5" in finding.message
    assert {e.file for e in finding.evidence} == {"nvml:gen_current", "nvml:gen_max", "nvml:width_current",
                                                  "nvml:width_max"}


def test_governor_fix_is_never_node_wide(tmp_path):
    # No GPU: the governors of every CPU are reported, and the fix plans nothing.
    nodes = [{"id": 0, "cpus": "0-3", "mem_kb": 1024, "free_kb": 512}]
    root = build_tree(str(tmp_path), nodes, pci=[])
    node_platform(root, governors={cpu: "powersave" for cpu in range(4)})
    facts = node_facts.read_node(root)
    (finding,) = [f for f in nc.evaluate(facts) if f.check == "cpu_governor"]
    assert finding.severity == "warning" and "host's CPUs (0-3)" in finding.message
    assert "would be node-wide" in finding.fix
    assert nc.plan_fixes(facts, fix_governor=True) == []


def test_real_nvidia_smi_q_of_an_h200():
    with open(os.path.join(FIXTURES, "node_checks", "h200-nvidia-smi-q.txt")) as handle:
        modes = node_facts.parse_nvidia_smi_q(handle.read())
    assert modes == {"0000:00:06.0": True}
    facts = node_facts.read_node(os.path.join(RECORDED, "sysfs"))
    nc.apply_persistence(facts, modes, "nvidia-smi -q")
    assert [f for f in nc.evaluate(facts) if f.check == "persistence_mode"] == []
    assert nc.plan_fixes(facts, fix_persistence=True) == []


# -- hostile trees: every file node_checks reads, every kind of damage ---------

_READ_FILES = [
    "sys/bus/pci/devices/%s/%s" % (bdf, attr)
    for bdf in (GPU, SWITCH_DOWN)
    for attr in ("vendor", "class", "current_link_speed", "max_link_speed", "current_link_width",
                 "max_link_width", "config", "local_cpulist", "_realpath", "iommu_group")
] + ["sys/devices/system/cpu/cpu5/cpufreq/scaling_governor",
     "sys/devices/system/cpu/cpu5/cpufreq/scaling_available_governors",
     "sys/kernel/mm/transparent_hugepage/enabled", "sys/kernel/mm/transparent_hugepage/defrag",
     "proc/cmdline", "proc/sys/kernel/numa_balancing", "proc/sys/kernel/osrelease", "sys/bus/pci/devices/%s" % GPU]

_DAMAGE = [
    {"op": "write", "hex": "ff00fe80"},
    {"op": "write", "text": ""},
    {"op": "write", "text": "9", "repeat": 70000},
    {"op": "write", "text": "16\n16\n"},
    {"op": "fifo"},
    {"op": "mkdir"},
    {"op": "symlink", "target": "/dev/zero"},
    {"op": "remove"},
]


@pytest.mark.parametrize("damage", _DAMAGE, ids=lambda d: d["op"] + ("-" + d.get("hex", d.get("text", ""))[:6]))
def test_damaged_files_never_raise_or_hang(tmp_path, damage):
    from sysfs_factory import apply_damage
    for index, rel in enumerate(_READ_FILES):
        root = make_tree(tmp_path / str(index), acs={SWITCH_DOWN: 0x1}, iommu_groups={GPU: 3},
                         governors={cpu: "powersave" for cpu in range(8)})
        apply_damage(root, dict(damage, path=rel))
        facts = node_facts.read_node(root)
        out = nc.evaluate(facts, "strict")
        assert all(f.severity in nc.SEVERITIES and f.check in nc.CHECKS for f in out), rel
        for finding in out:
            if finding.check == "unreadable":
                assert root in finding.message
        nc.plan_fixes(facts, True, True)
