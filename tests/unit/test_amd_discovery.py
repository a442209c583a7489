"""AMD Instinct GPUs from sysfs: discovery, the plan's ROCR_VISIBLE_DEVICES, one vendor per instance.

The host is tests/sysfs_factory.py's mi300x_8gpu_2socket: 8 MI300X (PCI class 0x1200,
vendor 0x1002) on two NPS1 sockets, GPUs 0-3 on node 0 and 4-7 on node 1 as ROCm SMI
prints it for such a host. No AMD GPU has been available to run discovery on; amd-smi
and rocm-smi are not read yet (sysfs only).
"""

import copy
import re
import os

import pytest

from ansible.module_utils.gpunuma.common.cpulist import parse_cpulist
from ansible.module_utils.gpunuma.discovery.sysfs import host as sysfs
from ansible.module_utils.gpunuma.discovery.sysfs import pci as sysfs_pci
from ansible.module_utils.gpunuma.discovery.topology import build_topology
from ansible.module_utils.gpunuma.plan.model import PlanError
from ansible.module_utils.gpunuma.plan.planner import build_plan
from ansible.module_utils.gpunuma.plan.profiles import load_profile
from conftest import REPO_ROOT
from sysfs_factory import MI300X_GPUS, mi300x_8gpu_2socket

pytestmark = pytest.mark.unit

PROFILES = os.path.join(REPO_ROOT, "policies", "profiles")


def mi300x(tmp_path):
    return build_topology("mi300x-a01", host=sysfs.read_host(mi300x_8gpu_2socket(str(tmp_path))), sources=["sysfs"])


def test_mi300x_gpus_are_discovered_on_their_nodes_with_their_rocm_uuids(tmp_path):
    topo = mi300x(tmp_path)
    assert [(g["pci_bus_id"], g["numa_node"], g["vendor"], g["uuid"]) for g in topo["gpus"]] == [
        (bdf, node, "amd", "GPU-" + uid) for bdf, node, uid in MI300X_GPUS]
    assert [g["index"] for g in topo["gpus"]] == list(range(8))
    # GPU-to-GPU links are PCIe paths here, and the warning says which fabric sysfs does not show.
    assert "GPU links derived from PCIe paths in sysfs; XGMI links are not visible there" in topo["warnings"]


@pytest.mark.parametrize("unique_id, uuid", [("0x5b4ac59a0da2a6a0", "GPU-5b4ac59a0da2a6a0"), ("ABC", "GPU-0000000000000abc"),
                                             ("0", None), ("", None), ("not hex", None), (None, None)])
def test_amd_uuid_from_unique_id(unique_id, uuid):
    assert sysfs_pci.amd_gpu_uuid(unique_id) == uuid


def test_one_instance_per_gpu_is_local_exclusive_and_selected_by_rocr(tmp_path):
    topo = mi300x(tmp_path)
    instances = [{"name": "llm%d" % i, "gpus": [i], "command": ["/usr/bin/true"]} for i in range(8)]
    plan = build_plan(topo, load_profile("strict", PROFILES), instances)
    seen = set()
    for inst, (_bdf, node, uid) in zip(plan["instances"], MI300X_GPUS):
        assert inst["numa_nodes"] == [node] and inst["mem_nodes"] == [node]
        assert inst["environment"]["ROCR_VISIBLE_DEVICES"] == "GPU-" + uid
        assert "CUDA_VISIBLE_DEVICES" not in inst["environment"] and "HIP_VISIBLE_DEVICES" not in inst["environment"]
        cpus = set(parse_cpulist(inst["cpus"]))
        node_cpus = set(range(48 * node, 48 * node + 48)) | set(range(96 + 48 * node, 96 + 48 * node + 48))
        assert cpus <= node_cpus and not cpus & seen, inst
        seen |= cpus


def test_without_unique_ids_rocr_takes_indexes_with_a_warning(tmp_path):
    topo = mi300x(tmp_path)
    for gpu in topo["gpus"]:
        gpu["uuid"] = None
    plan = build_plan(topo, load_profile("strict", PROFILES), [{"name": "llm", "gpus": [2, 3], "command": ["/usr/bin/true"]}])
    assert plan["instances"][0]["environment"]["ROCR_VISIBLE_DEVICES"] == "2,3"
    assert any(re.search("ROCR_VISIBLE_DEVICES uses ROCm.s ordinals 2,3", w) for w in plan["warnings"])


@pytest.mark.parametrize("key", ["ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL"])
def test_the_gpu_selection_is_the_planners(tmp_path, key):
    topo = mi300x(tmp_path)
    with pytest.raises(PlanError) as caught:
        build_plan(topo, load_profile("strict", PROFILES),
                   [{"name": "llm", "gpus": [0], "command": ["/usr/bin/true"], "environment": {key: "0"}}])
    assert "environment.%s: set by gpunuma from the instance's GPUs" % key in str(caught.value)


def test_an_instance_across_vendors_is_refused(tmp_path):
    topo = mi300x(tmp_path)
    mixed = copy.deepcopy(topo)
    del mixed["gpus"][1]["vendor"]  # absent: nvidia
    with pytest.raises(PlanError) as caught:
        build_plan(mixed, load_profile("strict", PROFILES), [{"name": "llm", "gpus": [0, 1], "command": ["/usr/bin/true"]}])
    assert "gpus: 0-1 are of vendors amd, nvidia; allowed: GPUs of one vendor per instance" in str(caught.value)
    bad = copy.deepcopy(topo)
    bad["gpus"][0]["vendor"] = "intel"
    with pytest.raises(PlanError) as caught:
        build_plan(bad, load_profile("strict", PROFILES), [])
    assert "vendor: 'intel' is not a GPU vendor; allowed: nvidia, amd (absent: nvidia)" in str(caught.value)


def test_the_fleet_report_draws_the_mi300x_host(tmp_path):
    """The controller's fleet report on an AMD host: every GPU drawn in its instance's colour, each instance local."""
    import html
    import json
    import re

    from ansible.module_utils.gpunuma.report import base as report_base, page as report

    topo = mi300x(tmp_path / "sys")
    plan = build_plan(topo, load_profile("strict", PROFILES),
                      [{"name": "llm%d" % i, "gpus": [i], "command": ["/usr/bin/true"]} for i in range(8)])
    out = tmp_path / "fleet"
    (out / "topology").mkdir(parents=True)
    (out / "topology" / "mi300x-a01.json").write_text(json.dumps(topo))
    (out / "topology" / "mi300x-a01.plan.json").write_text(json.dumps(plan))
    page, fleet = report.build_report(str(out))
    assert fleet["hosts"]["mi300x-a01"]["problems"] == []
    start = page.index('<section class="host" id="%s"' % html.escape(report._anchor("mi300x-a01")))
    sec = page[start:page.index("</section>", start)]
    assert re.findall(r'<tr class="instance" data-instance="([^"]*)"', sec) == ["llm%d" % i for i in range(8)]
    for gpu in range(8):
        assert re.search(r'data-gpu="%d"><rect [^>]*fill="%s"' % (gpu, report_base.PALETTE[gpu]), sec), gpu
    # No instance crosses a node or socket (the markers test_report.py checks on a host that does).
    assert "cross-badge" not in sec and '<line class="cross"' not in sec


def test_one_instance_per_gpu_is_l3_aligned_or_says_why(tmp_path):
    """Each worker's cores touch the fewest L3 caches (CCDs of eight cores) its core count needs, or the plan
    says the node's shares cannot follow its L3 groups."""
    topo = mi300x(tmp_path)
    assert [len(n["l3_groups"]) for n in topo["numa_nodes"]] == [6, 6]
    instances = [{"name": "llm%d" % i, "gpus": [i], "command": ["/usr/bin/true"]} for i in range(8)]
    plan = build_plan(topo, load_profile("strict", PROFILES), instances)
    for inst in plan["instances"]:
        cores = set(c % 96 for c in parse_cpulist(inst["cpus"]))
        touched = set(c // 8 for c in cores)
        fewest = -(-len(cores) // 8)
        node = inst["numa_nodes"][0]
        assert len(touched) == fewest or any("cannot follow its" in w and "NUMA node %d" % node in w
                                             for w in plan["warnings"]), (inst["name"], inst["cpus"])


def test_a_node_with_both_vendors(tmp_path):
    """NVIDIA and AMD GPUs on one node: NVIDIA first (their CUDA order), AMD after with vendor amd; an AMD
    instance without UUIDs is selected by its ordinal among the AMD GPUs, not by its topology index."""
    from sysfs_factory import NVIDIA, build_tree

    nodes = [{"id": n, "cpus": "%d-%d" % (8 * n, 8 * n + 7), "mem_kb": 64 << 20, "free_kb": 60 << 20} for n in range(2)]
    pci = [dict(bdf="0000:%02x:00.0" % bus, vendor=vendor, device="0x2335", numa_node=node, **{"class": cls})
           for bus, vendor, cls, node in ((0x05, "0x1002", "0x120000", 0), (0x18, NVIDIA, "0x030200", 0),
                                          (0x85, "0x1002", "0x120000", 1), (0x98, NVIDIA, "0x030200", 1))]
    topo = build_topology("mixed", host=sysfs.read_host(build_tree(str(tmp_path), nodes, pci=pci)), sources=["sysfs"])
    assert [(g["index"], g["pci_bus_id"], g.get("vendor", "nvidia")) for g in topo["gpus"]] == [
        (0, "0000:18:00.0", "nvidia"), (1, "0000:98:00.0", "nvidia"), (2, "0000:05:00.0", "amd"), (3, "0000:85:00.0", "amd")]
    assert "GPU links derived from PCIe paths in sysfs; NVLinks and XGMI links are not visible there" in topo["warnings"]
    plan = build_plan(topo, load_profile("strict", PROFILES),
                      [{"name": "cuda", "gpus": [1], "command": ["/usr/bin/true"]},
                       {"name": "rocm", "gpus": [3], "command": ["/usr/bin/true"]}])
    cuda, rocm = plan["instances"]
    assert cuda["environment"]["CUDA_VISIBLE_DEVICES"] == "1" and "ROCR_VISIBLE_DEVICES" not in cuda["environment"]
    assert rocm["environment"]["ROCR_VISIBLE_DEVICES"] == "1" and rocm["numa_nodes"] == [1]
