"""The binding planner (gpunuma.plan/v1) on hand-made gpunuma.topology/v1 documents.

Fixtures (tests/fixtures/topologies/):

* hgx-h200-8gpu-2socket-ht.json: 2 sockets with hyperthreads (siblings i, i+96),
  GPUs 0-3 on node 0 and 4-7 on node 1, NV18 all-to-all, UUIDs known;
* dgxa100-nps4-8node.json: AMD EPYC in NPS4, 8 NUMA nodes of 16 cores
  (siblings i, i+128), GPUs on nodes 3,3,1,1,7,7,5,5;
* gb200-4gpu-34numa.json: Grace, CPU nodes 0 and 1, 32 CPU-less nodes, GPU
  memory nodes 2, 10, 18, 26;
* pcie-8gpu-plx-2socket.json: no UUIDs, PIX pairs 0-2, 1-3, 4-6, 5-7;
* pcie-8gpu-numa-unknown.json: every GPU's numa_node is null;
* h200-1gpu-vm.json: one node of 16 CPUs without SMT, 3.8 GiB free.
"""

import copy
import json
import os
import shutil
import subprocess

import pytest

from ansible.module_utils.gpunuma.plan import planner
from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, parse_cpulist
from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.plan.model import PlanError
from ansible.module_utils.gpunuma.plan.planner import build_plan
from ansible.module_utils.gpunuma.plan.systemd_words import systemd_exec_line
from ansible.module_utils.gpunuma.plan.profiles import load_profile
from conftest import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.unit

PROFILES_DIR = os.path.join(REPO_ROOT, "policies", "profiles")
GIB = 1 << 30


def topology(name):
    with open(os.path.join(FIXTURES, "topologies", name + ".json")) as handle:
        return json.load(handle)


def profile(name):
    return load_profile(name, PROFILES_DIR)


def make_plan(topo, profile_name, instances, **options):
    """The allocation tests below are written for one housekeeping core per node unless they say otherwise."""
    if isinstance(topo, str):
        topo = topology(topo)
    options.setdefault("housekeeping_cores_per_node", 1)
    return build_plan(topo, profile(profile_name), instances, **options)


def per_gpu(gpus, **extra):
    out = []
    for index in gpus:
        item = {
            "name": "w%d" % index,
            "gpus": [index],
            "command": ["/usr/bin/vllm", "serve", "--port", str(8000 + index)],
        }
        item.update(extra)
        out.append(item)
    return out


def problems_of(topo, instances, profile_name="strict", **options):
    with pytest.raises(PlanError) as info:
        make_plan(topo, profile_name, instances, **options)
    assert isinstance(info.value, GpunumaError)
    assert str(info.value).splitlines() == info.value.problems
    return info.value.problems


def node_of(topo, node_id):
    return [n for n in topo["numa_nodes"] if n["id"] == node_id][0]


def sibling_groups(topo):
    groups = {}
    for node in topo["numa_nodes"]:
        for core in node["cores"]:
            cpus = parse_cpulist(core)
            for cpu in cpus:
                groups[cpu] = cpus
    return groups


# --------------------------------------------------------------------------
# 2-socket, 8 GPUs, hyperthreads


def test_hgx_one_instance_per_gpu():
    topo = topology("hgx-h200-8gpu-2socket-ht")
    plan = make_plan(topo, "strict", per_gpu(range(8), memory="64G"))
    assert plan["schema"] == "gpunuma.plan/v1"
    assert plan["hostname"] == "gpu-a01"
    assert plan["topology_fingerprint"] == topo["fingerprint"]
    assert plan["housekeeping"] == {"0": "0,96", "1": "48,144"}
    assert plan["worker_cpus"] == {"0": "1-47,97-143", "1": "49-95,145-191"}
    siblings = sibling_groups(topo)
    seen = set()
    for inst, gpu in zip(plan["instances"], topo["gpus"]):
        node = gpu["numa_node"]
        cpus = parse_cpulist(inst["cpus"])
        node_cpus = parse_cpulist(node_of(topo, node)["cpus"])
        housekeeping = parse_cpulist(plan["housekeeping"][str(node)])
        assert inst["numa_nodes"] == [node]
        assert inst["mem_nodes"] == [node]
        assert inst["mem_policy"] == "bind"
        assert inst["fallback"] is None
        assert cpus <= node_cpus
        assert not cpus & housekeeping
        assert not cpus & seen, "CPU sets of instances overlap"
        seen |= cpus
        for cpu in cpus:
            assert siblings[cpu] <= cpus, "hyperthread siblings of %d split" % cpu
        assert inst["environment"]["CUDA_VISIBLE_DEVICES"] == gpu["uuid"]
        assert "CUDA_DEVICE_ORDER" not in inst["environment"]
        assert inst["gpu_uuids"] == [gpu["uuid"]]
        assert inst["numactl_args"] == ["--physcpubind=%s" % inst["cpus"], "--membind=%d" % node]
        assert inst["exec_prefix"] == ["numactl"] + inst["numactl_args"]
        assert inst["systemd"] == {}
        assert inst["unit"] == "gpunuma-%s.service" % inst["name"]
        assert inst["mode"] == "service"
        assert inst["user"] == "gpunuma"
    # every worker CPU is handed out: 47 worker cores per node over 4 GPUs
    for node in ("0", "1"):
        on_node = [i for i in plan["instances"] if i["numa_nodes"] == [int(node)]]
        union = set().union(*[parse_cpulist(i["cpus"]) for i in on_node])
        assert union == parse_cpulist(plan["worker_cpus"][node])
        assert sorted(len(parse_cpulist(i["cpus"])) // 2 for i in on_node) == [11, 12, 12, 12]
    assert plan["warnings"] == []


@pytest.mark.parametrize("cores, expected", [(0, ""), (2, "0-1,96-97"), (3, "0-2,96-98")])
def test_housekeeping_cores_per_node(cores, expected):
    plan = make_plan("hgx-h200-8gpu-2socket-ht", "strict", per_gpu([0]), housekeeping_cores_per_node=cores)
    assert plan["housekeeping"]["0"] == expected
    cpus = parse_cpulist(plan["instances"][0]["cpus"])
    assert not cpus & parse_cpulist(expected)
    # a lone instance gets every worker CPU of its node
    assert cpus == parse_cpulist("0-47,96-143") - parse_cpulist(expected)


def test_gpu_order_given_is_kept_and_uuids_follow_it():
    topo = topology("hgx-h200-8gpu-2socket-ht")
    plan = make_plan(topo, "strict", [{"name": "pair", "gpus": [3, 1], "command": ["/bin/srv"]}])
    inst = plan["instances"][0]
    assert inst["gpus"] == [3, 1]
    assert inst["environment"]["CUDA_VISIBLE_DEVICES"] == "%s,%s" % (topo["gpus"][3]["uuid"], topo["gpus"][1]["uuid"])


# --------------------------------------------------------------------------
# AMD NPS4: 8 nodes


def test_amd_nps4_eight_nodes():
    topo = topology("dgxa100-nps4-8node")
    plan = make_plan(topo, "strict", per_gpu(range(8), memory="32G"))
    assert sorted(plan["housekeeping"]) == [str(n) for n in range(8)]
    for node in range(8):
        assert plan["housekeeping"][str(node)] == "%d,%d" % (16 * node, 16 * node + 128)
    by_node = {}
    for inst, gpu in zip(plan["instances"], topo["gpus"]):
        assert inst["numa_nodes"] == [gpu["numa_node"]]
        assert inst["numactl_args"][1] == "--membind=%d" % gpu["numa_node"]
        by_node.setdefault(gpu["numa_node"], []).append(parse_cpulist(inst["cpus"]))
    assert sorted(by_node) == [1, 3, 5, 7]
    for node, sets in by_node.items():
        first, second = sets
        assert not first & second
        assert first | second == parse_cpulist(plan["worker_cpus"][str(node)])
        assert (len(first), len(second)) == (16, 14)  # 15 worker cores: 8 + 7


# --------------------------------------------------------------------------
# Grace: CPU-less GPU memory nodes


def test_grace_binds_to_cpu_node_never_gpu_memory_node():
    topo = topology("gb200-4gpu-34numa")
    plan = make_plan(topo, "strict", per_gpu(range(4), memory="100G"))
    assert sorted(plan["housekeeping"]) == ["0", "1"]
    for inst, gpu in zip(plan["instances"], topo["gpus"]):
        assert gpu["gpu_numa_id"] not in inst["numa_nodes"] + inst["mem_nodes"]
        assert inst["numa_nodes"] == [gpu["numa_node"]]
        assert inst["numactl_args"][-1] == "--membind=%d" % gpu["numa_node"]
        assert parse_cpulist(inst["cpus"]) <= parse_cpulist(node_of(topo, gpu["numa_node"])["cpus"])
    assert plan["instances"][0]["cpus"] == "1-36"
    assert plan["instances"][1]["cpus"] == "37-71"


def _gb200(grace_distance=40):
    topo = copy.deepcopy(topology("gb200-4gpu-34numa"))
    for node in topo["numa_nodes"][:2]:
        other = 1 - node["id"]
        node["distances"][other] = grace_distance
    return topo


def test_grace_preferred_spill_is_said_and_kept_on_cpu_memory_where_it_can():
    one = [{"name": "g0", "gpus": [0], "command": ["/bin/srv"], "memory": "8G"}]
    # GB200 as shipped: the other Grace (40) is nearer than the GPU's HBM (80): nothing to say
    plan = make_plan(_gb200(), "preferred", one, preferred_many=True)
    assert plan["instances"][0]["numactl_args"][-1] == "--preferred=0"
    assert not any("HBM" in w for w in plan["instances"][0]["warnings"])
    # HBM nearer than the other CPU node: MPOL_PREFERRED_MANY over the CPU nodes where the node accepts it
    plan = make_plan(_gb200(120), "preferred", one, preferred_many=True)
    inst = plan["instances"][0]
    assert inst["numactl_args"][-1] == "--preferred-many=0-1"
    assert any("before GPU memory nodes 2,10 (HBM, SLIT distance 80)" in w for w in inst["warnings"])
    for known, words in ((False, "the node did not accept it"), (None, "not known to the planner")):
        inst = make_plan(_gb200(120), "preferred", one, preferred_many=known)["instances"][0]
        assert inst["numactl_args"][-1] == "--preferred=0"
        assert any("go to GPU memory nodes 2,10 (HBM" in w and words in w for w in inst["warnings"])


def test_gh200_preferred_spill_can_only_go_to_hbm_and_says_so():
    topo = _gb200()
    # one Grace node: drop node 1's CPUs and memory
    topo["numa_nodes"][1].update(cpus="", has_cpus=False, memory_total_bytes=0, memory_free_bytes=0, cores=[])
    topo["gpus"] = [g for g in topo["gpus"] if g["numa_node"] == 0]
    topo["gpu_links"] = [row[:2] for row in topo["gpu_links"][:2]]
    topo["gpu_nic_links"] = topo["gpu_nic_links"][:2]
    inst = make_plan(topo, "preferred", [{"name": "g0", "gpus": [0], "command": ["/bin/srv"], "memory": "8G"}],
                     preferred_many=True)["instances"][0]
    assert inst["numactl_args"][-1] == "--preferred=0"
    assert any("allocations go to GPU memory node" in w and "can only land in GPU memory" in w
               for w in inst["warnings"])


def test_grace_interleave_skips_cpu_less_nodes():
    plan = make_plan("gb200-4gpu-34numa", "interleave", per_gpu(range(4)))
    for inst in plan["instances"]:
        assert inst["mem_policy"] == "interleave"
        assert inst["mem_nodes"] == [0, 1]
        assert inst["numactl_args"][-1] == "--interleave=0-1"
        assert inst["fallback"] is None


def test_grace_cpu_less_node_is_not_a_binding_node():
    problems = problems_of("gb200-4gpu-34numa", [{"name": "tok", "numa_node": 10, "command": ["/bin/tok"]}])
    assert problems == [
        "gpunuma_instances[0].numa_node: node 10 has no CPUs on gb200-n17 (a memory-only or GPU-memory node); allowed: 0, 1"
    ]


def test_topology_gpu_on_cpu_less_node_is_treated_as_unknown():
    topo = topology("gb200-4gpu-34numa")
    topo["gpus"][0]["numa_node"] = 2
    plan = make_plan(topo, "strict", per_gpu([0]))
    inst = plan["instances"][0]
    assert inst["mem_policy"] == "default"
    assert inst["cpus"] is None
    assert any("numa_node 2, which is not a CPU-bearing node" in w for w in plan["warnings"])


# --------------------------------------------------------------------------
# Unknown GPU nodes


def test_unknown_gpu_node_falls_back_to_no_binding():
    plan = make_plan("pcie-8gpu-numa-unknown", "strict", per_gpu([0, 1]))
    for inst in plan["instances"]:
        assert inst["cpus"] is None
        assert inst["mem_policy"] == "default"
        assert inst["mem_nodes"] == []
        assert inst["numactl_args"] == []
        assert inst["exec_prefix"] == []
        assert inst["numa_nodes"] == []
        assert inst["numa_bind_nodes"] == [None]
        assert "no known CPU-bearing NUMA node" in inst["fallback"]
        assert inst["environment"]["CUDA_VISIBLE_DEVICES"].startswith("GPU-")
    assert "GPUs 2-7 of pcie-b04 are not used by any instance" in plan["warnings"]


def test_unknown_gpu_node_under_off_is_no_fallback():
    plan = make_plan("pcie-8gpu-numa-unknown", "off", per_gpu([0]))
    inst = plan["instances"][0]
    assert inst["fallback"] is None
    assert any("no known CPU-bearing NUMA node" in w for w in inst["warnings"])


# --------------------------------------------------------------------------
# Memory capacity under strict


def test_capacity_fallback_to_preferred():
    plan = make_plan("h200-1gpu-vm", "strict", [{"name": "big", "gpus": [0], "command": ["/bin/srv"], "memory": "8G"}])
    inst = plan["instances"][0]
    assert inst["memory_bytes"] == 8 * GIB
    assert inst["mem_policy"] == "preferred"
    assert inst["profile"] == "strict"
    assert inst["numactl_args"] == ["--physcpubind=1-15", "--preferred=0"]
    assert inst["fallback"].startswith(
        "memory 8.0 GiB declared exceeds the 4.7 GiB NUMA node 0 holds for instances "
        "(6.1 GiB MemTotal minus a 1.4 GiB reserve); membind fails"
    )
    assert "planned as preferred" in inst["fallback"]


@pytest.mark.parametrize("memory", ["8G", "3G"])
def test_capacity_fallback_text_does_not_move_with_free_memory(memory):
    # The reason lands in plan.json and the unit file: a different free
    # amount (the instance's own pages, page cache) must not rewrite them.
    instances = [{"name": "big", "gpus": [0], "command": ["/bin/srv"], "memory": memory}]
    first = make_plan("h200-1gpu-vm", "strict", instances)
    topo = topology("h200-1gpu-vm")
    topo["numa_nodes"][0]["memory_free_bytes"] //= 2
    second = make_plan(topo, "strict", instances)
    assert second["instances"][0]["mem_policy"] == ("preferred" if memory == "8G" else "bind")
    assert json.dumps(second, sort_keys=True) == json.dumps(first, sort_keys=True)


def test_page_cache_never_changes_a_plan():
    """MemFree near zero after the weights were read (page cache) gives a byte-identical plan."""
    topo = topology("hgx-h200-8gpu-2socket-ht")
    instances = per_gpu(range(8), memory="200G")
    first = make_plan(topo, "strict", instances)
    assert all(i["mem_policy"] == "bind" for i in first["instances"])
    cached = copy.deepcopy(topo)
    for node in cached["numa_nodes"]:
        node["memory_free_bytes"] = 200 << 20  # 200 MiB: the rest is page cache
    assert json.dumps(make_plan(cached, "strict", instances)) == json.dumps(first)
    unknown = copy.deepcopy(topo)
    for node in unknown["numa_nodes"]:
        node["memory_free_bytes"] = None
    assert json.dumps(make_plan(unknown, "strict", instances)) == json.dumps(first)


@pytest.mark.parametrize(
    "total, reserve",
    [
        (512 << 20, 255 << 20),
        (4 * GIB, GIB),
        (8 * GIB, GIB + 4 * GIB // 5),
        (16 * GIB, GIB + 4 * GIB // 5 + 8 * GIB // 10),
        (128 * GIB, GIB + 4 * GIB // 5 + 8 * GIB // 10 + 112 * GIB * 6 // 100),
        (1024 * GIB, GIB + 4 * GIB // 5 + 8 * GIB // 10 + 112 * GIB * 6 // 100 + 896 * GIB * 2 // 100),
    ],
)
def test_auto_reserve_follows_gke_tiers(total, reserve):
    from ansible.module_utils.gpunuma.plan.capacity import auto_reserve

    assert abs(auto_reserve(total) - reserve) <= 4


def test_memory_reserve_per_node_option():
    instances = [{"name": "a", "gpus": [0], "command": ["/bin/a"], "memory": "5G"}]
    assert make_plan("h200-1gpu-vm", "strict", instances)["instances"][0]["mem_policy"] == "preferred"
    plan = make_plan("h200-1gpu-vm", "strict", instances, memory_reserve_per_node="512M")
    assert plan["instances"][0]["mem_policy"] == "bind"
    assert plan["options"]["memory_reserve_per_node"] == 512 << 20
    assert plan["memory_capacity"] == {"0": 6538379264 - (512 << 20)}
    problems = problems_of("h200-1gpu-vm", instances, memory_reserve_per_node="lots")
    assert problems == [
        "memory_reserve_per_node: 'lots' is not a size; allowed: auto, bytes as an integer, or a size like 16G"
    ]


def test_auto_reserve_is_per_machine_and_spread_by_node_size():
    """GKE's tiers are per machine: a two-node 2 TiB host keeps ~47 GiB in all, not ~27 GiB on each node."""
    from ansible.module_utils.gpunuma.plan.capacity import auto_reserve

    topo = topology("hgx-h200-8gpu-2socket-ht")
    totals = dict((n["id"], n["memory_total_bytes"]) for n in topo["numa_nodes"] if n["cpus"])
    plan = make_plan(topo, "strict", [])
    whole = sum(totals.values())
    kept = dict((n, totals[n] - plan["memory_capacity"][str(n)]) for n in totals)
    assert abs(sum(kept.values()) - auto_reserve(whole)) <= len(kept)
    assert sum(kept.values()) < sum(auto_reserve(t) for t in totals.values()) * 0.9
    # each node keeps its share in proportion to its size
    for node, total in totals.items():
        assert abs(kept[node] - auto_reserve(whole) * total // whole) <= 1
    # an explicit size is still kept on every node
    plan = make_plan(topo, "strict", [], memory_reserve_per_node="16G")
    assert all(totals[n] - plan["memory_capacity"][str(n)] == 16 * GIB for n in totals)


def test_hugetlb_pools_are_not_capacity(tmp_path):
    """Persistent HugeTLB pages count in MemTotal but serve only hugetlbfs mappings: read per node, kept back."""
    from ansible.module_utils.gpunuma.discovery.discover import discover
    from sysfs_factory import GIB_KB, build_tree

    nodes = [{"id": 0, "cpus": "0-7", "mem_kb": 64 * GIB_KB, "free_kb": 60 * GIB_KB,
              "hugepages": {2048: 4096, 1048576: 16}},
             {"id": 1, "cpus": "8-15", "mem_kb": 64 * GIB_KB, "free_kb": 60 * GIB_KB}]
    root = build_tree(str(tmp_path), nodes)
    topo = discover("huge", sysfs_root=root, sources=["sysfs"])["topology"]
    assert topo["numa_nodes"][0]["hugetlb_bytes"] == 4096 * (2 << 20) + 16 * GIB
    assert "hugetlb_bytes" not in topo["numa_nodes"][1]
    plan = make_plan(topo, "strict", [], allow_unknown_siblings=True)
    capacity = plan["memory_capacity"]
    assert capacity["1"] - capacity["0"] == 24 * GIB
    instances = [{"name": "a", "numa_node": 0, "memory": capacity["0"] + 1, "command": ["/bin/a"]}]
    (inst,) = make_plan(topo, "strict", instances, allow_unknown_siblings=True)["instances"]
    assert inst["mem_policy"] == "preferred"
    assert "reserve and 24.0 GiB of HugeTLB pools)" in inst["fallback"]


def test_identical_instances_get_one_capacity_decision():
    topo = topology("hgx-h200-8gpu-2socket-ht")
    capacity = make_plan(topo, "strict", [])["memory_capacity"]["0"]
    each = capacity // 4 + GIB  # three fit, four do not
    instances = [{"name": "r%d" % i, "gpus": [i], "command": ["/bin/serve"], "memory": each} for i in range(4)]
    plan = make_plan(topo, "strict", instances)
    assert [i["mem_policy"] for i in plan["instances"]] == ["preferred"] * 4
    assert len(set(i["fallback"] for i in plan["instances"])) == 1
    assert "declared by each of 4 identical instances (r0, r1, r2, r3" in plan["instances"][0]["fallback"]
    problems = problems_of(topo, instances, strict_capacity="error")
    assert len(problems) == 1
    assert problems[0].startswith("gpunuma_instances[0].memory, gpunuma_instances[1].memory, "
                                  "gpunuma_instances[2].memory, gpunuma_instances[3].memory: ")
    assert "for the group (equal instances get one decision)" in problems[0]
    # three that fit all bind; a different size is its own decision
    plan = make_plan(topo, "strict", instances[:3] + [dict(instances[3], memory=capacity)])
    assert [i["mem_policy"] for i in plan["instances"]] == ["bind", "bind", "bind", "preferred"]


def test_capacity_that_fits_stays_strict():
    plan = make_plan(
        "h200-1gpu-vm", "strict", [{"name": "small", "gpus": [0], "command": ["/bin/srv"], "memory": "3G"}]
    )
    assert plan["instances"][0]["mem_policy"] == "bind"
    assert plan["instances"][0]["fallback"] is None


def test_capacity_is_cumulative_per_node():
    instances = [
        {"name": "a", "gpus": [0], "command": ["/bin/a"], "memory": "3G"},
        {"name": "b", "numa_node": 0, "command": ["/bin/b"], "memory": "2G"},
    ]
    plan = make_plan("h200-1gpu-vm", "strict", instances)
    assert plan["instances"][0]["mem_policy"] == "bind"
    assert plan["instances"][1]["mem_policy"] == "preferred"
    assert "plus 3.0 GiB by earlier instances" in plan["instances"][1]["fallback"]


def test_capacity_error_mode():
    instances = [{"name": "big", "gpus": [0], "command": ["/bin/srv"], "memory": 8 * GIB}]
    problems = problems_of("h200-1gpu-vm", instances, strict_capacity="error")
    assert len(problems) == 1
    assert problems[0].startswith(
        "gpunuma_instances[0].memory: memory 8.0 GiB declared exceeds the 4.7 GiB NUMA node 0 holds for instances "
        "(6.1 GiB MemTotal minus a 1.4 GiB reserve)"
    )
    assert "allowed: at most 4.7 GiB on this node, or strict_capacity: fallback" in problems[0]


@pytest.mark.parametrize("strict_capacity", ["fallback", "error"])
def test_bind_without_declared_memory_is_not_a_blind_membind(strict_capacity):
    instances = [{"name": "a", "gpus": [0], "command": ["/bin/a"]}]
    if strict_capacity == "error":
        assert problems_of("h200-1gpu-vm", instances, strict_capacity="error") == [
            "gpunuma_instances[0].memory: missing, so membind to NUMA node 0 cannot be checked against the node's "
            "capacity (a full node then means allocation failures and OOM kills, not spill); allowed: the memory the "
            "instance needs on its node (a size like 64G), or strict_capacity: fallback to plan it as preferred"
        ]
        return
    plan = make_plan("h200-1gpu-vm", "strict", instances)
    inst = plan["instances"][0]
    assert inst["mem_policy"] == "preferred"
    assert inst["numactl_args"] == ["--physcpubind=1-15", "--preferred=0"]
    assert inst["fallback"].startswith("no memory declared, so membind to NUMA node 0 cannot be checked")
    assert any(w.startswith("a: no memory declared") for w in plan["warnings"])
    # preferred and interleave need no capacity reasoning: nothing changes
    assert make_plan("h200-1gpu-vm", "preferred", instances)["instances"][0]["fallback"] is None


def test_capacity_unknown_node_memory_warns_only():
    topo = topology("h200-1gpu-vm")
    topo["numa_nodes"][0]["memory_total_bytes"] = None
    plan = make_plan(
        topo,
        "strict",
        [{"name": "big", "gpus": [0], "command": ["/bin/srv"], "memory": "1Ti"}],
        strict_capacity="error",
    )
    inst = plan["instances"][0]
    assert inst["mem_policy"] == "bind"
    assert inst["fallback"] is None
    assert any("memory size of NUMA node 0 is unknown" in w for w in inst["warnings"])


def test_capacity_under_preferred_warns_about_spill():
    plan = make_plan(
        "h200-1gpu-vm", "preferred", [{"name": "big", "gpus": [0], "command": ["/bin/srv"], "memory": "8G"}]
    )
    inst = plan["instances"][0]
    assert inst["mem_policy"] == "preferred"
    assert inst["fallback"] is None
    # one node: there is nowhere to spill, and the warning says so instead of promising spill
    assert not any("will spill" in w for w in inst["warnings"])
    assert any("no other NUMA node has memory to spill to, so allocations past them fail (OOM)" in w
               for w in inst["warnings"])
    # two nodes: the rest goes to the other one
    plan = make_plan("hgx-h200-8gpu-2socket-ht", "preferred",
                     [{"name": "big", "gpus": [0], "command": ["/bin/srv"], "memory": "1500G"}])
    assert any("allocations will spill to other nodes (1)" in w for w in plan["instances"][0]["warnings"])


# --------------------------------------------------------------------------
# gpus_per_instance grouping


def test_gpus_per_instance_prefers_pix_pairs_over_index_order():
    topo = topology("pcie-8gpu-plx-2socket")
    instances = [{"name": "tp%d" % k, "gpus_per_instance": 2, "command": ["/bin/srv"]} for k in range(4)]
    plan = make_plan(topo, "strict", instances)
    assert [i["gpus"] for i in plan["instances"]] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert [i["numa_nodes"] for i in plan["instances"]] == [[0], [0], [1], [1]]
    for inst in plan["instances"]:
        # sysfs/nvidia-smi-only topology: no UUIDs, so indexes in PCI order
        assert inst["gpu_uuids"] == [None, None]
        assert inst["environment"]["CUDA_VISIBLE_DEVICES"] == ",".join(str(g) for g in inst["gpus"])
        assert inst["environment"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_gpus_per_instance_keeps_groups_on_one_node():
    plan = make_plan(
        "hgx-h200-8gpu-2socket-ht",
        "strict",
        [
            {"name": "a", "gpus_per_instance": 4, "command": ["/bin/srv"]},
            {"name": "b", "gpus_per_instance": 4, "command": ["/bin/srv"]},
        ],
    )
    assert [i["gpus"] for i in plan["instances"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [i["mem_nodes"] for i in plan["instances"]] == [[0], [1]]
    assert plan["instances"][0]["cpus"] == "1-47,97-143"


def test_gpus_per_instance_avoids_gpus_named_explicitly():
    plan = make_plan(
        "hgx-h200-8gpu-2socket-ht",
        "strict",
        [
            {"name": "tp", "gpus_per_instance": 4, "command": ["/bin/srv"]},
            {"name": "solo", "gpus": [0], "command": ["/bin/srv"]},
        ],
    )
    # GPU 0 is taken, so node 0 has three left; the group moves to node 1
    assert plan["instances"][0]["gpus"] == [4, 5, 6, 7]


@pytest.mark.parametrize(
    "codes, expected",
    [
        ({(0, 1): "PIX", (2, 3): "NV4"}, [2, 3]),
        ({(0, 1): "NV12", (2, 3): "NV18"}, [2, 3]),
        ({(0, 1): "PXB", (2, 3): "PHB"}, [0, 1]),
        ({(0, 1): "SYS", (2, 3): "NODE"}, [2, 3]),
        ({}, [0, 1]),
    ],
)
def test_link_ranking(codes, expected):
    topo = topology("hgx-h200-8gpu-2socket-ht")
    topo["gpus"] = topo["gpus"][:4]
    links = [["X" if i == j else "SYS" for j in range(4)] for i in range(4)]
    for (a, b), code in codes.items():
        links[a][b] = links[b][a] = code
    topo["gpu_links"] = links
    plan = make_plan(topo, "strict", [{"name": "tp", "gpus_per_instance": 2, "command": ["/bin/srv"]}])
    assert plan["instances"][0]["gpus"] == expected


def test_weakest_link_decides_before_the_sum():
    # {0,1,2}: two NV18 pairs but 1-2 only SYS; {3,4,5}: all PIX. A
    # tensor-parallel group runs at the pace of its slowest pair.
    topo = topology("hgx-h200-8gpu-2socket-ht")
    topo["gpus"] = topo["gpus"][:6]
    for gpu in topo["gpus"]:
        gpu["numa_node"] = 0
    links = [["X" if i == j else "SYS" for j in range(6)] for i in range(6)]
    for (a, b), code in {(0, 1): "NV18", (0, 2): "NV18", (3, 4): "PIX", (3, 5): "PIX", (4, 5): "PIX"}.items():
        links[a][b] = links[b][a] = code
    topo["gpu_links"] = links
    plan = make_plan(topo, "strict", [{"name": "tp", "gpus_per_instance": 3, "command": ["/bin/srv"]}])
    assert plan["instances"][0]["gpus"] == [3, 4, 5]


def synthetic_16gpu():
    """Two nodes of 8 GPUs; inside each node NV8 pairs, PXB otherwise."""
    topo = topology("hgx-h200-8gpu-2socket-ht")
    gpus = []
    for index in range(16):
        gpu = copy.deepcopy(topo["gpus"][0])
        gpu.update(
            index=index, uuid="GPU-%02d" % index, numa_node=index // 8, pci_bus_id="0000:%02x:00.0" % (16 + index)
        )
        gpus.append(gpu)
    topo["gpus"] = gpus
    topo["gpu_links"] = [
        ["X" if i == j else ("SYS" if i // 8 != j // 8 else ("NV8" if i // 2 == j // 2 else "PXB")) for j in range(16)]
        for i in range(16)
    ]
    return topo


def test_gpu_grouping_on_many_gpus_uses_greedy_search_and_stays_local():
    topo = synthetic_16gpu()
    plan = make_plan(
        topo,
        "strict",
        [
            {"name": "a", "gpus_per_instance": 8, "command": ["/bin/srv"]},
            {"name": "b", "gpus_per_instance": 8, "command": ["/bin/srv"]},
        ],
    )
    assert plan["instances"][0]["gpus"] == list(range(8))
    assert plan["instances"][1]["gpus"] == list(range(8, 16))
    plan = make_plan(
        topo, "strict", [{"name": "p%d" % k, "gpus_per_instance": 2, "command": ["/bin/srv"]} for k in range(8)]
    )
    assert [i["gpus"] for i in plan["instances"]] == [[2 * k, 2 * k + 1] for k in range(8)]


def test_not_enough_gpus_left():
    problems = problems_of(
        "hgx-h200-8gpu-2socket-ht",
        [
            {"name": "a", "gpus_per_instance": 6, "command": ["/bin/srv"]},
            {"name": "b", "gpus_per_instance": 4, "command": ["/bin/srv"]},
        ],
    )
    assert problems == [
        "gpunuma_instances[1].gpus_per_instance: needs 4 GPUs but only 2 are left on gpu-a01 "
        "(0-5 taken by other instances); allowed: at most 2"
    ]


# --------------------------------------------------------------------------
# Instances spanning nodes


def test_spanning_instance_interleaves_over_its_nodes():
    plan = make_plan(
        "hgx-h200-8gpu-2socket-ht", "strict", [{"name": "all8", "gpus_per_instance": 8, "command": ["/bin/srv"]}]
    )
    inst = plan["instances"][0]
    assert inst["gpus"] == list(range(8))
    assert inst["numa_nodes"] == [0, 1]
    assert inst["numa_bind_nodes"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert inst["mem_policy"] == "interleave"
    assert inst["mem_nodes"] == [0, 1]
    assert inst["cpus"] == "1-47,49-95,97-143,145-191"
    assert inst["numactl_args"] == ["--physcpubind=1-47,49-95,97-143,145-191", "--interleave=0-1"]
    assert "span NUMA nodes 0, 1" in inst["fallback"]
    assert any("gpus_per_instance: 4 or fewer" in w for w in inst["warnings"])
    assert any(w.startswith("all8: GPUs 0-7 span NUMA nodes 0, 1") for w in plan["warnings"])


def test_spanning_instance_shares_nodes_with_local_ones():
    plan = make_plan(
        "hgx-h200-8gpu-2socket-ht",
        "strict",
        [
            {"name": "span", "gpus": [3, 4], "command": ["/bin/srv"]},
            {"name": "local0", "gpus": [0], "command": ["/bin/srv"]},
            {"name": "local1", "gpus": [5], "command": ["/bin/srv"]},
        ],
    )
    span, local0, local1 = plan["instances"]
    assert span["numa_bind_nodes"] == [0, 1]
    span_cpus = parse_cpulist(span["cpus"])
    assert span_cpus & parse_cpulist("0-47,96-143") and span_cpus & parse_cpulist("48-95,144-191")
    assert not span_cpus & parse_cpulist(local0["cpus"])
    assert not span_cpus & parse_cpulist(local1["cpus"])


def test_spanning_instance_under_off_and_interleave():
    instances = [{"name": "all8", "gpus_per_instance": 8, "command": ["/bin/srv"]}]
    off = make_plan("hgx-h200-8gpu-2socket-ht", "off", instances)["instances"][0]
    assert off["fallback"] is None and off["cpus"] is None and off["numactl_args"] == []
    assert off["numa_bind_nodes"] == [0, 0, 0, 0, 1, 1, 1, 1]
    inter = make_plan("hgx-h200-8gpu-2socket-ht", "interleave", instances)["instances"][0]
    assert inter["fallback"] is None and inter["mem_nodes"] == [0, 1]


# --------------------------------------------------------------------------
# CPU-only instances, explicit CPUs, sharing


def test_cpu_only_instance_on_a_node():
    topo = topology("hgx-h200-8gpu-2socket-ht")
    instances = per_gpu(range(4)) + [{"name": "tokenizer", "numa_node": 0, "cpus": 8, "command": ["/opt/tok/bin/tok"]}]
    plan = make_plan(topo, "strict", instances)
    tok = plan["instances"][-1]
    assert tok["gpus"] == [] and tok["gpu_uuids"] == [] and tok["numa_bind_nodes"] == []
    assert "CUDA_VISIBLE_DEVICES" not in tok["environment"]
    assert tok["numa_nodes"] == [0] and tok["mem_nodes"] == [0]
    assert tok["cpus"] == "1-4,97-100"
    workers = [parse_cpulist(i["cpus"]) for i in plan["instances"][:4]]
    assert set().union(*workers) == parse_cpulist("5-47,101-143")
    assert sorted(len(w) // 2 for w in workers) == [10, 11, 11, 11]


def test_cpu_count_rounds_up_to_whole_cores():
    plan = make_plan(
        "hgx-h200-8gpu-2socket-ht", "strict", [{"name": "tok", "numa_node": 1, "cpus": 3, "command": ["/bin/tok"]}]
    )
    inst = plan["instances"][0]
    assert inst["cpus"] == "49-50,145-146"
    assert any("rounded up to 4 CPUs (2 whole cores)" in w for w in inst["warnings"])


def test_explicit_cpu_list_is_honoured_and_avoided_by_others():
    plan = make_plan(
        "hgx-h200-8gpu-2socket-ht",
        "strict",
        [
            {"name": "w0", "gpus": [0], "command": ["/bin/srv"], "cpus": "2-5,98-101", "memory": "8G"},
            {"name": "w1", "gpus": [1], "command": ["/bin/srv"], "memory": "8G"},
        ],
    )
    w0, w1 = plan["instances"]
    assert w0["cpus"] == "2-5,98-101"
    assert w0["warnings"] == []
    assert not parse_cpulist(w1["cpus"]) & parse_cpulist(w0["cpus"])
    assert parse_cpulist(w1["cpus"]) == parse_cpulist("1,6-47,97,102-143")


def test_explicit_cpu_list_splitting_siblings_warns():
    plan = make_plan(
        "hgx-h200-8gpu-2socket-ht", "strict", [{"name": "w0", "gpus": [0], "command": ["/bin/srv"], "cpus": "2-5"}]
    )
    assert any("split hyperthread sibling groups 2,98, 3,99" in w for w in plan["instances"][0]["warnings"])


def test_share_cpus_overlaps_and_takes_no_share():
    plan = make_plan(
        "hgx-h200-8gpu-2socket-ht",
        "strict",
        [
            {"name": "w0", "gpus": [0], "command": ["/bin/srv"]},
            {"name": "side", "numa_node": 0, "share_cpus": True, "command": ["/bin/side"]},
        ],
    )
    w0, side = plan["instances"]
    assert w0["cpus"] == "1-47,97-143"
    assert side["cpus"] == "1-47,97-143"
    assert side["share_cpus"] is True


def test_not_enough_cores_names_node_and_counts():
    instances = [{"name": "t%02d" % k, "numa_node": 0, "command": ["/bin/t"]} for k in range(16)]
    problems = problems_of("h200-1gpu-vm", instances)
    assert len(problems) == 1
    assert problems[0].startswith(
        "gpunuma_instances (NUMA node 0): not enough whole cores: 15 worker cores after 1 housekeeping core, "
        "but 16 instances with CPUs of their own need more"
    )


def test_cpu_counts_exceeding_node():
    problems = problems_of(
        "h200-1gpu-vm",
        [
            {"name": "a", "numa_node": 0, "cpus": 10, "command": ["/bin/t"]},
            {"name": "b", "numa_node": 0, "cpus": 10, "command": ["/bin/t"]},
        ],
    )
    assert "(a: cpus 10, b: cpus 10)" in problems[0]


def test_off_profile_ignores_cpus_with_a_warning():
    plan = make_plan("h200-1gpu-vm", "off", [{"name": "a", "gpus": [0], "cpus": 4, "command": ["/bin/t"]}])
    inst = plan["instances"][0]
    assert inst["cpus"] is None
    assert "cpus is ignored: profile off binds no CPUs" in inst["warnings"]


# --------------------------------------------------------------------------
# Profiles and binding methods


@pytest.mark.parametrize(
    "profile_name, args, systemd",
    [
        (
            "strict",
            ["--physcpubind=1-47,97-143", "--membind=0"],
            {"CPUAffinity": "1-47,97-143", "NUMAPolicy": "bind", "NUMAMask": "0"},
        ),
        (
            "preferred",
            ["--physcpubind=1-47,97-143", "--preferred=0"],
            {"CPUAffinity": "1-47,97-143", "NUMAPolicy": "preferred", "NUMAMask": "0"},
        ),
        (
            "interleave",
            ["--physcpubind=1-47,97-143", "--interleave=0-1"],
            {"CPUAffinity": "1-47,97-143", "NUMAPolicy": "interleave", "NUMAMask": "0-1"},
        ),
        ("off", [], {}),
    ],
)
def test_profile_arguments(profile_name, args, systemd):
    instances = [{"name": "w0", "gpus": [0], "command": ["/bin/srv"], "memory": "64G"}]
    inst = make_plan("hgx-h200-8gpu-2socket-ht", profile_name, instances)["instances"][0]
    assert inst["profile"] == profile_name
    assert inst["numactl_args"] == args
    assert inst["exec_prefix"] == (["numactl"] + args if args else [])
    assert inst["systemd"] == {}
    instances[0]["binding_method"] = "systemd"
    inst = make_plan("hgx-h200-8gpu-2socket-ht", profile_name, instances)["instances"][0]
    assert inst["exec_prefix"] == []
    assert inst["numactl_args"] == args
    assert inst["systemd"] == systemd


def test_dropin_for_an_existing_unit():
    topo = topology("hgx-h200-8gpu-2socket-ht")
    plan = make_plan(topo, "strict", [{"name": "vllm", "unit": "vllm.service", "gpus": [4], "memory": "64G"}])
    inst = plan["instances"][0]
    assert inst["mode"] == "dropin"
    assert inst["unit"] == "vllm.service"
    assert inst["binding_method"] == "systemd"
    assert inst["command"] is None
    assert inst["user"] is None
    assert inst["systemd"] == {"CPUAffinity": "49-95,145-191", "NUMAPolicy": "bind", "NUMAMask": "1"}
    assert inst["environment"] == {"CUDA_VISIBLE_DEVICES": topo["gpus"][4]["uuid"]}


def test_user_environment_memlock_and_group_pass_through():
    plan = make_plan(
        "h200-1gpu-vm",
        "strict",
        [
            {
                "name": "llm",
                "gpus": [0],
                "command": ["/bin/srv"],
                "user": "vllm",
                "group": "vllm",
                "environment": {"HF_HOME": "/srv/hf", "A_FIRST": "1"},
                "memlock": "unlimited",
            }
        ],
    )
    inst = plan["instances"][0]
    assert (inst["user"], inst["group"], inst["memlock"]) == ("vllm", "vllm", "infinity")
    assert list(inst["environment"]) == ["A_FIRST", "CUDA_VISIBLE_DEVICES", "HF_HOME"]
    assert (
        make_plan("h200-1gpu-vm", "strict", [{"name": "llm", "gpus": [0], "command": ["/bin/srv"], "memlock": "64G"}])[
            "instances"
        ][0]["memlock"]
        == 64 * GIB
    )


def test_shared_gpu_and_mig_warnings():
    topo = topology("hgx-h200-8gpu-2socket-ht")
    topo["gpus"][0]["mig_enabled"] = True
    plan = make_plan(
        topo,
        "strict",
        [
            {"name": "a", "gpus": [0], "command": ["/bin/srv"]},
            {"name": "b", "gpus": [0], "command": ["/bin/srv"]},
        ],
    )
    assert "b: GPU 0 is also used by instance 'a'; both run on it" in plan["warnings"]
    # Each warning is printed once, however many steps noticed it.
    assert plan["warnings"].count("b: GPU 0 is also used by instance 'a'; both run on it") == 1
    assert any("MIG enabled" in w for w in plan["instances"][0]["warnings"])
    mig = make_plan(
        topo,
        "strict",
        [
            {"name": "m", "gpus": [0], "command": ["/bin/srv"], "environment": {"CUDA_VISIBLE_DEVICES": "MIG-abc"}},
        ],
    )["instances"][0]
    assert mig["environment"]["CUDA_VISIBLE_DEVICES"] == "MIG-abc"
    assert any("kept as given ('MIG-abc')" in w for w in mig["warnings"])


def test_empty_instances_give_an_empty_plan():
    plan = make_plan("hgx-h200-8gpu-2socket-ht", "strict", [])
    assert plan["instances"] == []
    assert plan["housekeeping"] == {"0": "0,96", "1": "48,144"}
    assert plan["warnings"] == ["gpunuma_instances is empty: nothing to bind on gpu-a01"]


@pytest.mark.parametrize("cores", [None, []], ids=["absent", "empty"])
def test_topology_without_cores_is_refused_unless_allowed(cores):
    """Siblings unknown (absent or []: a node with CPUs has cores) and not inferable: no silent plan."""
    topo = topology("h200-1gpu-vm")
    topo["numa_nodes"][0]["cores"] = cores
    problems = problems_of(topo, per_gpu([0]))
    assert problems == [
        "topology.numa_nodes: hyperthread siblings of NUMA node 0 on h200-vm are unknown and cannot be inferred, "
        "so instances 'w0' could share physical cores with each other or with housekeeping; allowed: a topology "
        "discovered with sysfs (gpu_topology_info on the node reads the cores), or allow_unknown_siblings: true "
        "to plan each CPU as a core"
    ]
    plan = make_plan(topo, "strict", per_gpu([0]), allow_unknown_siblings=True)
    assert plan["housekeeping"] == {"0": "0"}
    assert plan["siblings"] == {"0": "unknown"}
    assert plan["options"]["allow_unknown_siblings"] is True
    assert any("hyperthread siblings of NUMA node 0 are unknown" in w and "each CPU is planned as a core" in w
               for w in plan["warnings"])
    # nothing to refuse when no CPU is bound
    assert make_plan(topo, "off", per_gpu([0]))["instances"][0]["cpus"] is None


def test_known_siblings_are_reported_as_from_the_topology():
    plan = make_plan("hgx-h200-8gpu-2socket-ht", "strict", per_gpu([0]))
    assert plan["siblings"] == {"0": "topology", "1": "topology"}
    assert plan["schema_minor"] == 5


@pytest.mark.parametrize(
    "layout, offset",
    [
        ({0: "0-47,96-143", 1: "48-95,144-191"}, 96),  # HGX H200, 2x48 cores
        ({1: "16-31,144-159", 3: "48-63,176-191"}, 128),  # DGX A100 NPS4 text: only the GPUs' nodes
        ({0: "0-11,24-35", 1: "12-23,36-47"}, 24),  # DGX-1 (published text), 2x12 cores
        ({0: "0-15"}, None),  # one node, one range: a VM without SMT looks the same
        ({0: "0-71", 1: "72-143"}, None),  # Grace: one range per node
        ({0: "0-47,96-143", 1: "48-95"}, None),  # not every node has the shape
        ({0: "0-47,96-143", 1: "48-95,150-197"}, None),  # offsets differ
        ({0: "0-47,96-140", 1: "48-95,144-191"}, None),  # unequal ranges
        ({0: "0-3,100-103", 1: "4-7,104-107", 2: "8-9,200-201"}, None),
    ],
)
def test_sibling_offset_is_inferred_only_from_unambiguous_layouts(layout, offset):
    from ansible.module_utils.gpunuma.common.cpulist import infer_sibling_offset

    assert infer_sibling_offset({n: parse_cpulist(c) for n, c in layout.items()}) == offset


def _sysfs_tree_of(root, topo):
    """A sysfs tree with the text topology's NUMA layout and siblings c, c+T/2 (Linux x86 numbering)."""
    import sysfs_factory

    nodes = [n for n in topo["numa_nodes"] if n["cpus"]]
    total = max(max(parse_cpulist(n["cpus"])) for n in nodes) + 1
    half = total // 2
    # every node of the machine, also those the text does not show (NPS4)
    layout = {}
    for node in nodes:
        cpus = parse_cpulist(node["cpus"])
        width = len(cpus) // 2
        first = min(cpus)
        for k in range(half // width):
            guess = node["id"] - first // width + k
            layout.setdefault(guess, set()).update(
                c for c in range(k * width, (k + 1) * width)
            )
            layout[guess].update(c + half for c in range(k * width, (k + 1) * width))
    layout.update({n["id"]: set(parse_cpulist(n["cpus"])) for n in nodes})
    cpu_map = {}
    for cpus in layout.values():
        for cpu in cpus:
            base = cpu % half
            cpu_map[cpu] = (0, base, format_cpulist([base, base + half]))
    node_list = [{"id": n, "cpus": sorted(c), "mem_kb": 64 << 20, "free_kb": 60 << 20} for n, c in sorted(layout.items())]
    return sysfs_factory.build_tree(root, node_list, cpus=cpu_map)


PUBLISHED_HT = ["hgx-h200-8gpu-10nic-tabs", "dgxa100-epyc7742-nps4-10nic", "dgx1-v100-hybridcube-mlx5-spaces"]


@pytest.mark.parametrize("name", PUBLISHED_HT)
def test_text_only_plan_of_published_ht_fixture_equals_the_sysfs_plan(name, tmp_path):
    """nvidia-smi topo -m alone gives the same CPU shares as sysfs on the same layout (siblings inferred)."""
    from ansible.module_utils.gpunuma.discovery.discover import discover

    text = os.path.join(FIXTURES, "published", name + ".topo.txt")
    text_topo = discover("text", topo_file=text)["topology"]
    # the text shows no siblings: unknown (null), not "none" ([])
    assert all(n["cores"] is None for n in text_topo["numa_nodes"] if n["cpus"])
    sysfs_topo = discover("text", sysfs_root=_sysfs_tree_of(str(tmp_path), text_topo), topo_file=text)["topology"]
    assert all(n["cores"] for n in sysfs_topo["numa_nodes"] if n["cpus"])
    instances = per_gpu(range(len(text_topo["gpus"])))
    from_text = make_plan(text_topo, "strict", instances)
    from_sysfs = make_plan(sysfs_topo, "strict", instances)
    keys = ("name", "gpus", "numa_nodes", "cpus", "mem_policy", "mem_nodes", "numactl_args")
    assert [{k: i[k] for k in keys} for i in from_text["instances"]] == [
        {k: i[k] for k in keys} for i in from_sysfs["instances"]
    ]
    for node in from_text["housekeeping"]:
        assert from_text["housekeeping"][node] == from_sysfs["housekeeping"][node]
        assert from_text["worker_cpus"][node] == from_sysfs["worker_cpus"][node]
    assert set(from_text["siblings"].values()) == {"inferred"}
    assert any("inferred as CPU N and N+" in w for w in from_text["warnings"])
    # no worker holds the sibling of a housekeeping CPU, nor half of a core
    half = (max(max(parse_cpulist(n["cpus"])) for n in text_topo["numa_nodes"] if n["cpus"]) + 1) // 2
    assert half in (96, 128, 24)
    housekeeping = set().union(*[parse_cpulist(v) for v in from_text["housekeeping"].values()])
    for inst in from_text["instances"]:
        cpus = parse_cpulist(inst["cpus"])
        assert not cpus & housekeeping
        assert all((c + half in cpus) if c < half else (c - half in cpus) for c in cpus)


# --------------------------------------------------------------------------
# Bad input: each problem named with its path and what is allowed


@pytest.mark.parametrize(
    "instance, expected",
    [
        (
            {"name": "a", "gpus": [9], "command": ["/bin/x"]},
            "gpunuma_instances[0].gpus[0]: GPU 9 does not exist on gpu-a01; allowed: 0-7",
        ),
        (
            {"name": "a", "gpus": ["0"], "command": ["/bin/x"]},
            "gpunuma_instances[0].gpus[0]: '0' is not a GPU index; allowed: integers from 0-7",
        ),
        (
            {"name": "a", "gpus": [1, 1], "command": ["/bin/x"]},
            "gpunuma_instances[0].gpus[1]: GPU 1 is listed twice; allowed: each GPU once",
        ),
        (
            {"name": "a", "gpus": [], "command": ["/bin/x"]},
            "gpunuma_instances[0].gpus: [] is not a non-empty list of GPU indexes; allowed: indexes from 0-7",
        ),
        (
            {"name": "a", "gpus_per_instance": 9, "command": ["/bin/x"]},
            "gpunuma_instances[0].gpus_per_instance: 9 is not a GPU count for gpu-a01; allowed: 1-8",
        ),
        (
            {"name": "a", "numa_node": 5, "command": ["/bin/x"]},
            "gpunuma_instances[0].numa_node: node 5 does not exist on gpu-a01; allowed: 0, 1",
        ),
        (
            {"name": "a", "gpus": [0], "numa_node": 0, "command": ["/bin/x"]},
            "gpunuma_instances[0]: gives gpus and numa_node together; allowed: exactly one of gpus, gpus_per_instance, numa_node",
        ),
        (
            {"name": "a", "command": ["/bin/x"]},
            "gpunuma_instances[0]: names no GPUs or node; allowed: exactly one of gpus, gpus_per_instance, numa_node",
        ),
        (
            {"name": "a b", "gpus": [0], "command": ["/bin/x"]},
            "gpunuma_instances[0].name: 'a b' is not a valid instance name; allowed: 1-64 characters from A-Z a-z 0-9 _ . -",
        ),
        (
            {"name": "-a", "gpus": [0], "command": ["/bin/x"]},
            "gpunuma_instances[0].name: '-a' is not a valid instance name",
        ),
        ({"gpus": [0], "command": ["/bin/x"]}, "gpunuma_instances[0].name: None is not a valid instance name"),
        (
            {"name": "a", "gpus": [0], "command": "vllm serve"},
            "gpunuma_instances[0].command: 'vllm serve' is not a list of strings",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x", "--port", 8000]},
            "gpunuma_instances[0].command[2]: 8000 is an int; allowed: strings only (quote numbers in YAML)",
        ),
        (
            {"name": "a", "gpus": [0]},
            "gpunuma_instances[0].command: missing; allowed: a list of strings (required unless unit names an existing unit)",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["-/bin/x"]},
            "gpunuma_instances[0].command[0]: '-/bin/x' starts with '-', which systemd reads as an ExecStart= prefix",
        ),
        ({"name": "a", "gpus": [0], "command": ['/bin/"x"']}, "which systemd refuses in an executable name"),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "environment": {"PORT": 8000}},
            "gpunuma_instances[0].environment.PORT: is an int; allowed: strings only",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "environment": ["A=1"]},
            "gpunuma_instances[0].environment: must be a mapping of strings to strings, got a list",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "environment": {"1A": "x"}},
            "gpunuma_instances[0].environment: key '1A' is not a variable name",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "memory": "32 gallons"},
            "gpunuma_instances[0].memory: '32 gallons' is not a size; allowed: bytes as an integer, or a string like 512M, 32G, 1Ti",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "memory": -1},
            "gpunuma_instances[0].memory: -1 is negative",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "memlock": "lots"},
            "gpunuma_instances[0].memlock: 'lots' is not a memlock limit; allowed: infinity, unlimited",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "ready": "http://x"},
            "gpunuma_instances[0].ready: 'http://x' is not a mapping",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "ready": {"url": "ftp://x"}},
            "gpunuma_instances[0].ready.url: 'ftp://x' is not an http:// or https:// URL",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "ready": {"url": "http://x", "command": ["/bin/true"]}},
            "gpunuma_instances[0].ready: give exactly one of url and command",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "ready": {"command": ["curl", "x"]}},
            "gpunuma_instances[0].ready.command: ['curl', 'x'] is not an argv list starting with an absolute path",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "ready": {"url": "http://x", "timeout": 0}},
            "gpunuma_instances[0].ready.timeout: 0 is not allowed; allowed: whole seconds from 1 to 3600",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "ready": {"url": "http://x", "every": 3}},
            "gpunuma_instances[0].ready.every: unknown key; allowed: url, command, timeout, interval",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "cpus": "0-3"},
            "gpunuma_instances[0].cpus: CPUs 0 are not worker CPUs of NUMA node 0 (housekeeping: 0); allowed: 1-47,97-143",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "cpus": "60-62"},
            "gpunuma_instances[0].cpus: CPUs 60-62 are not worker CPUs of NUMA node 0; allowed: 1-47,97-143",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "cpus": "2-x"},
            "gpunuma_instances[0].cpus '2-x': '2-x' is not a CPU id or range",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "cpus": 0},
            "gpunuma_instances[0].cpus: 0 is not a CPU count",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "cpus": 4, "share_cpus": True},
            "gpunuma_instances[0].cpus: a count (4) needs CPUs of its own",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "share_cpus": "yes"},
            "gpunuma_instances[0].share_cpus: 'yes' is not a boolean; allowed: true, false",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "binding_method": "taskset"},
            "gpunuma_instances[0].binding_method: 'taskset' is not allowed; allowed: numactl, systemd",
        ),
        (
            {"name": "a", "gpus": [0], "unit": "vllm.service", "binding_method": "numactl"},
            "gpunuma_instances[0].binding_method: numactl wraps the command, but vllm.service has no command to wrap",
        ),
        (
            {"name": "a", "gpus": [0], "unit": "vllm", "command": ["/bin/x"]},
            "gpunuma_instances[0].unit: 'vllm' is not a service unit name",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "user": "bad user"},
            "gpunuma_instances[0].user: 'bad user' is not a user name",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "gpu": 1},
            "gpunuma_instances[0].gpu: unknown key; allowed: name, gpus, gpus_per_instance, numa_node",
        ),
        ("a", "gpunuma_instances[0]: must be a mapping, got a str"),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "environment": {"CUDA_VISIBLE_DEVICES": "1"}},
            "gpunuma_instances[0].environment.CUDA_VISIBLE_DEVICES: set by gpunuma from the instance's GPUs",
        ),
        (
            {"name": "a", "gpus": [0], "command": ["/bin/x"], "environment": {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}},
            "gpunuma_instances[0].environment.CUDA_DEVICE_ORDER: set by gpunuma",
        ),
    ],
)
def test_bad_instance(instance, expected):
    problems = problems_of("hgx-h200-8gpu-2socket-ht", [instance])
    assert any(p.startswith(expected) or expected in p for p in problems), problems


def test_duplicate_names_and_units():
    problems = problems_of(
        "hgx-h200-8gpu-2socket-ht",
        [
            {"name": "a", "gpus": [0], "command": ["/bin/x"]},
            {"name": "a", "gpus": [1], "command": ["/bin/x"]},
            {"name": "b", "gpus": [2], "unit": "vllm.service"},
            {"name": "c", "gpus": [3], "unit": "vllm.service"},
        ],
    )
    assert problems == [
        "gpunuma_instances[1].name: 'a' is already the name of gpunuma_instances[0]; allowed: unique names",
        "gpunuma_instances[3].unit: vllm.service is already bound by gpunuma_instances[2]; allowed: one instance per unit",
    ]


def test_every_problem_reported_at_once():
    problems = problems_of(
        "hgx-h200-8gpu-2socket-ht",
        [
            {"name": "ok", "gpus": [0], "command": ["/bin/x"]},
            {"name": "a", "gpus": [9], "command": ["/bin/x"]},
            {"name": "b", "numa_node": 3, "command": ["/bin/x"], "memory": "lots"},
            {"name": "ok", "gpus": [1], "command": ["/bin/x"]},
        ],
        housekeeping_cores_per_node=-1,
        strict_capacity="sometimes",
    )
    assert problems == [
        "housekeeping_cores_per_node: -1 is not a core count; allowed: auto, or an integer 0 or more",
        "strict_capacity: 'sometimes' is not allowed; allowed: fallback, error",
        "gpunuma_instances[1].gpus[0]: GPU 9 does not exist on gpu-a01; allowed: 0-7",
        "gpunuma_instances[2].numa_node: node 3 does not exist on gpu-a01; allowed: 0, 1",
        "gpunuma_instances[2].memory: 'lots' is not a size; allowed: bytes as an integer, or a string like 512M, 32G, 1Ti",
        "gpunuma_instances[3].name: 'ok' is already the name of gpunuma_instances[0]; allowed: unique names",
    ]


def test_invalid_profile_is_reported_with_instance_problems():
    bad = dict(profile("strict"), mem_policy="membind")
    with pytest.raises(PlanError) as info:
        build_plan(topology("h200-1gpu-vm"), bad, [{"name": "a", "gpus": [3], "command": ["/bin/x"]}])
    assert info.value.problems == [
        "profile.mem_policy: 'membind' is not allowed; allowed: bind, preferred, interleave, default",
        "gpunuma_instances[0].gpus[0]: GPU 3 does not exist on h200-vm; allowed: 0",
    ]


@pytest.mark.parametrize(
    "topo, expected",
    [
        ("not a dict", "topology: must be a gpunuma.topology/v1 mapping, got str"),
        (
            {"schema": "gpunuma.topology/v0"},
            "topology.schema: 'gpunuma.topology/v0' is not supported; allowed: gpunuma.topology/v1",
        ),
        ({"schema": "gpunuma.topology/v1", "numa_nodes": {}, "gpus": []}, "topology.numa_nodes: must be a list"),
    ],
)
def test_bad_topology(topo, expected):
    with pytest.raises(PlanError) as info:
        build_plan(topo, profile("strict"), [])
    assert str(info.value) == expected


def test_instances_must_be_a_list():
    with pytest.raises(PlanError) as info:
        make_plan("h200-1gpu-vm", "strict", {"name": "a"})
    assert str(info.value).startswith("gpunuma_instances: must be a list of instance mappings, got a dict")


@pytest.mark.parametrize(
    "value, expected",
    [
        (1024, 1024),
        ("1024", 1024),
        ("512M", 512 << 20),
        ("32G", 32 << 30),
        ("32GiB", 32 << 30),
        ("32gb", 32 << 30),
        ("1Ti", 1 << 40),
        ("1.5G", 3 << 29),
        ("100B", 100),
    ],
)
def test_parse_size(value, expected):
    assert planner.parse_size(value) == expected


@pytest.mark.parametrize("value", ["", "G", "12Q", "1.2.3G", True, None, 3.5, "-1G", "5i"])
def test_parse_size_rejects(value):
    with pytest.raises(PlanError) as info:
        planner.parse_size(value, "x.memory")
    assert str(info.value).startswith("x.memory: ")


# --------------------------------------------------------------------------
# Determinism


def test_plan_is_deterministic_and_does_not_touch_its_input():
    topo = topology("dgxa100-nps4-8node")
    instances = per_gpu(range(4)) + [
        {
            "name": "tp",
            "gpus_per_instance": 3,
            "command": ["/bin/srv", "; rm -rf /"],
            "memory": "16G",
            "environment": {"Z": "1", "A": "2"},
        },
        {"name": "tok", "numa_node": 0, "cpus": 5, "command": ["/bin/tok"]},
    ]
    snapshot = copy.deepcopy((topo, instances))
    first = json.dumps(make_plan(topo, "strict", instances))
    second = json.dumps(make_plan(copy.deepcopy(topo), "strict", copy.deepcopy(instances)))
    assert first == second
    assert (topo, instances) == snapshot
    reordered = json.loads(json.dumps(topo), object_pairs_hook=lambda pairs: dict(reversed(pairs)))
    assert json.dumps(make_plan(reordered, "strict", instances)) == first


# --------------------------------------------------------------------------
# systemd ExecStart quoting

METACHAR_ARGV = [
    "/usr/bin/vllm",
    "; rm -rf /",
    "$HOME",
    "a b",
    "100%",
    'say "hi"',
    "back\\slash",
    "tab\there",
    "line\nbreak",
    ";",
    "`id`",
    "|",
    "",
]


def test_systemd_exec_line_exact():
    assert systemd_exec_line(METACHAR_ARGV) == (
        '"/usr/bin/vllm" "; rm -rf /" "$$HOME" "a b" "100%%" "say \\"hi\\"" "back\\\\slash" '
        '"tab\\there" "line\\nbreak" ";" "`id`" "|" ""'
    )


def systemd_unquote(line):
    """Split an ExecStart= value the way systemd does for double-quoted words.

    Written from systemd.syntax(7) / systemd.service(5): specifiers (%%)
    first, then words split on whitespace with C escapes inside double
    quotes, then $$ -> $ in every word but the executable.
    """
    line = line.replace("%%", "\x00PCT\x00")
    assert "%" not in line, "unescaped specifier"
    line = line.replace("\x00PCT\x00", "%")
    words, pos = [], 0
    escapes = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"'}
    while pos < len(line):
        if line[pos] == " ":
            pos += 1
            continue
        assert line[pos] == '"', "unquoted word at %d" % pos
        pos += 1
        word = []
        while line[pos] != '"':
            if line[pos] == "\\":
                if line[pos + 1] == "x":
                    word.append(chr(int(line[pos + 2 : pos + 4], 16)))
                    pos += 4
                    continue
                word.append(escapes[line[pos + 1]])
                pos += 2
            else:
                word.append(line[pos])
                pos += 1
        pos += 1
        words.append("".join(word))
    for index in range(1, len(words)):
        assert "$" not in words[index].replace("$$", ""), "unescaped $ in %r" % words[index]
        words[index] = words[index].replace("$$", "$")
    return words


def test_systemd_exec_line_round_trips():
    argv = METACHAR_ARGV + ["ctl\x01char", "$$", "%%", '\\"']
    assert systemd_unquote(systemd_exec_line(argv)) == argv


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["-/bin/x"], "starts with '-'"),
        (["@/bin/x", "name"], "starts with '@'"),
        (['/bin/"x"'], "refuses in an executable name"),
        (["/bin/x", "a\x00b"], "contains a NUL byte"),
        (["/bin/x", 3], "is not a string"),
        ([], "is not a non-empty list of strings"),
        ("vllm serve", "is not a non-empty list of strings"),
    ],
)
def test_systemd_exec_line_rejects(argv, needle):
    with pytest.raises(PlanError) as info:
        systemd_exec_line(argv)
    assert needle in str(info.value)


SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


def verify_unit(tmp_path, exec_start):
    unit = tmp_path / "gpunuma-quoting-test.service"
    unit.write_text("[Unit]\nDescription=quoting test\n[Service]\nExecStart=%s\n" % exec_start)
    return subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_quoted_line(tmp_path):
    argv = [shutil.which("echo") or "/bin/echo"] + METACHAR_ARGV[1:] + ["%Q"]
    result = verify_unit(tmp_path, systemd_exec_line(argv))
    assert result.returncode == 0, result.stderr
    # the same words joined without quoting are rejected: verify can fail here
    naive = verify_unit(tmp_path, " ".join(argv[:1] + ["%Q"]))
    assert naive.returncode != 0
    assert "%Q" in naive.stderr


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
def test_systemd_reads_the_quoted_executable_verbatim(tmp_path):
    executable = "/nonexistent/dir with space/100%/a$b;c"
    result = verify_unit(tmp_path, systemd_exec_line([executable, "x"]))
    assert "Command %s is not executable" % executable in result.stderr


def test_format_of_plan_cpu_lists_is_canonical():
    plan = make_plan("dgxa100-nps4-8node", "strict", per_gpu(range(8)))
    for inst in plan["instances"]:
        assert inst["cpus"] == format_cpulist(parse_cpulist(inst["cpus"]))


class TestCapacityOfARunningNode:
    """A running instance's own memory (and the page cache) never moves its plan."""

    def setup_method(self):
        import copy

        self.topology = copy.deepcopy(_capacity_topology())
        self.instance = {"name": "llm", "numa_node": 0, "memory": "6G", "command": ["/bin/true"]}

    def plan(self, applied=None):
        from ansible.module_utils.gpunuma.plan.planner import build_plan
        from ansible.module_utils.gpunuma.plan.profiles import validate_profile

        profile = validate_profile({"name": "strict", "description": "x", "cpu_binding": "node",
                                    "mem_policy": "bind", "next": None})
        return build_plan(self.topology, profile, [self.instance], housekeeping_cores_per_node=0,
                          applied_plan=applied)["instances"][0]

    def test_fits_at_first_then_stays_bound_while_it_holds_its_memory(self):
        first = self.plan()
        assert first["mem_policy"] == "bind" and first["fallback"] is None
        applied = {"topology_fingerprint": self.topology["fingerprint"], "instances": [first]}
        # The instance now holds its 6 GiB: only 2 GiB are left free on node 0.
        self.topology["numa_nodes"][0]["memory_free_bytes"] = 2 << 30
        assert self.plan() == first
        assert self.plan(applied) == first

    def test_applied_plan_of_other_hardware_or_instances_changes_nothing(self):
        first = self.plan()
        self.topology["numa_nodes"][0]["memory_free_bytes"] = 2 << 30
        other_hw = {"topology_fingerprint": "sha256:" + "0" * 64, "instances": [first]}
        assert self.plan(other_hw) == first
        renamed = {"topology_fingerprint": self.topology["fingerprint"], "instances": [dict(first, name="gone")]}
        assert self.plan(renamed) == first


def _capacity_topology():
    return {
        "schema": "gpunuma.topology/v1", "hostname": "cap", "fingerprint": "sha256:" + "c" * 64,
        "sources": ["sysfs"], "warnings": [], "complete": True, "driver_version": None,
        "numa_balancing": 0, "sockets": 1,
        "numa_nodes": [{"id": 0, "cpus": "0-3", "has_cpus": True, "memory_total_bytes": 16 << 30,
                        "memory_free_bytes": 8 << 30, "distances": [10], "cores": ["0", "1", "2", "3"]}],
        "gpus": [], "gpu_links": [], "nics": [], "gpu_nic_links": [], "nvme": [],
    }


def test_fallen_back_instance_does_not_flip_back_to_bind():
    case = TestCapacityOfARunningNode()
    case.setup_method()
    case.instance["memory"] = "15G"  # more than 16 GiB minus the reserve: preferred from the start
    first = case.plan()
    assert first["mem_policy"] == "preferred"
    applied = {"topology_fingerprint": case.topology["fingerprint"], "instances": [first]}
    case.topology["numa_nodes"][0]["memory_free_bytes"] = 1 << 30
    assert case.plan(applied)["mem_policy"] == "preferred"


# --------------------------------------------------------------------------
# Doubtful and damaged input: refused with the field, the value and the range


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("name", "vllm0\n", "gpunuma_instances[0].name: 'vllm0\\n' is not a valid instance name"),
        ("user", "vllm\n", "gpunuma_instances[0].user: 'vllm\\n' is not a user name"),
        ("group", "vllm\n", "gpunuma_instances[0].group: 'vllm\\n' is not a group name"),
        ("unit", "vllm.service\n", "gpunuma_instances[0].unit: 'vllm.service\\n' is not a service unit name"),
        ("environment", {"FOO\n": "1"}, "gpunuma_instances[0].environment: key 'FOO\\n' is not a variable name"),
    ],
)
def test_trailing_newline_is_refused_in_every_name(field, value, expected):
    instance = {"name": "a", "gpus": [0], "command": ["/bin/x"], field: value}
    problems = problems_of("hgx-h200-8gpu-2socket-ht", [instance])
    assert any(p.startswith(expected) for p in problems), problems


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("memory", "1.5", "gpunuma_instances[0].memory: '1.5' has a fraction but no unit"),
        ("memory", "1.5B", "gpunuma_instances[0].memory: '1.5B' has a fraction but no unit"),
        ("memory", "99999999999E", "gpunuma_instances[0].memory: '99999999999E' is "),
        ("memory", 0, "gpunuma_instances[0].memory: 0 declares no memory; allowed: 1 byte"),
        ("memory", "1" * 5000, "gpunuma_instances[0].memory: '111"),
        ("memory", "32\u212a", "gpunuma_instances[0].memory: '32\u212a' is not a size"),
        ("memlock", 0, "gpunuma_instances[0].memlock: 0 locks no memory"),
        ("memlock", "0G", "gpunuma_instances[0].memlock: '0G' locks no memory"),
        ("memlock", "99999999999E", "gpunuma_instances[0].memlock: '99999999999E' is more than any limit"),
        ("cpus", 1048575, "gpunuma_instances[0].cpus: 1048575 is more CPUs than gpu-a01 has; allowed: 1-192"),
        ("cpus", "0-4095", "gpunuma_instances[0].cpus: CPUs 192-4095 do not exist on gpu-a01; allowed: 0-191"),
        ("cpus", "0-1048575", "gpunuma_instances[0].cpus '0-1048575': "),
    ],
)
def test_values_that_cannot_be_meant_are_refused_with_the_range(key, value, expected):
    instance = {"name": "a", "gpus": [0], "command": ["/bin/x"], key: value}
    problems = problems_of("hgx-h200-8gpu-2socket-ht", [instance])
    assert any(p.startswith(expected) for p in problems), problems


def test_sizes_mean_the_same_in_planner_and_limits():
    from ansible.module_utils.gpunuma.node import limits

    for text in ("64GiB", "1.5G", "64gb", "8k", "1Ti", "4194304"):
        assert planner.parse_size(text) == limits.parse_limit(text)
    plan = make_plan("h200-1gpu-vm", "strict", [{"name": "a", "gpus": [0], "command": ["/bin/x"], "memlock": "1.5G"}])
    assert plan["instances"][0]["memlock"] == limits.parse_limit("1.5G") == 3 << 29


def _overlapping(second_cpus):
    topo = topology("hgx-h200-8gpu-2socket-ht")
    node1 = node_of(topo, 1)
    node1["cpus"] = second_cpus
    node1["cores"] = [format_cpulist([c]) for c in sorted(parse_cpulist(second_cpus))]
    return topo


@pytest.mark.parametrize("second", ["0-47,96-143", "40-60"])
def test_overlapping_numa_nodes_are_refused_not_shared(second):
    problems = problems_of(_overlapping(second), per_gpu(range(8)))
    assert any(
        p.startswith("topology.numa_nodes[1].cpus: CPUs ")
        and "also belong to NUMA node 0" in p
        and "allowed: NUMA nodes with disjoint CPU sets" in p
        for p in problems
    ), problems


def test_plan_shares_are_checked_before_the_plan_is_returned(monkeypatch):
    """A defect in the allocator that handed one CPU twice is caught, not returned."""
    from ansible.module_utils.gpunuma.plan import alloc as plan_alloc

    real = plan_alloc.allocate_node

    def broken(node, members, problems):
        real(node, members, problems)
        if len(members) > 1:
            members[1].allocated_cpus.update(members[0].allocated_cpus)

    monkeypatch.setattr(plan_alloc, "allocate_node", broken)
    problems = problems_of("hgx-h200-8gpu-2socket-ht", per_gpu(range(2)))
    assert problems[0].startswith("internal error: instances 'w0' and 'w1' share CPUs")


@pytest.mark.parametrize(
    "applied, expected",
    [
        ("plan.json", "applied_plan: must be a gpunuma.plan/v1 mapping, got a str"),
        ({"schema": "gpunuma.plan/v0", "instances": []}, "applied_plan.schema: 'gpunuma.plan/v0' is not supported"),
        ({"schema": "gpunuma.plan/v1", "instances": 5}, "applied_plan.instances: 5 is not a list"),
        ({"schema": "gpunuma.plan/v1", "instances": "abc"}, "applied_plan.instances: 'abc' is not a list"),
        ({"schema": "gpunuma.plan/v1", "instances": [7]}, "applied_plan.instances[0]: 7 is not a mapping"),
        (
            {"schema": "gpunuma.plan/v1", "instances": [{"name": "llm", "mem_nodes": 0, "mem_policy": "bind",
                                                           "memory_bytes": 1}]},
            "applied_plan.instances[0].mem_nodes: 0 is not a list of node ids",
        ),
        (
            {"schema": "gpunuma.plan/v1", "instances": [{"name": "llm", "mem_nodes": [[0]], "mem_policy": "bind",
                                                           "memory_bytes": 1}]},
            "applied_plan.instances[0].mem_nodes: [[0]] is not a list of node ids",
        ),
        (
            {"schema": "gpunuma.plan/v1", "instances": [{"name": "llm", "mem_nodes": [0], "mem_policy": "bind",
                                                           "memory_bytes": "6G"}]},
            "applied_plan.instances[0].memory_bytes: '6G' is not a byte count",
        ),
        (
            {"schema": "gpunuma.plan/v1", "instances": [{"name": ["llm"], "mem_nodes": [0], "mem_policy": "bind",
                                                           "memory_bytes": 1}]},
            "applied_plan.instances[0].name: ['llm'] is not an instance name",
        ),
    ],
)
def test_malformed_applied_plan_is_a_clear_error(applied, expected):
    topo = topology("h200-1gpu-vm")
    if isinstance(applied, dict):
        applied = dict(applied, topology_fingerprint=topo["fingerprint"])
    instances = [{"name": "llm", "numa_node": 0, "memory": "1G", "command": ["/bin/true"]}]
    problems = problems_of(topo, instances, applied_plan=applied)
    assert any(p.startswith(expected) for p in problems), problems
    assert any("/etc/gpunuma/plan.json" in p for p in problems), problems


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda t: t["gpus"][0].update(numa_node=[0]), "topology.gpus[0].numa_node: [0] is not a node id"),
        (lambda t: t["gpus"][0].update(uuid=5), "topology.gpus[0].uuid: 5 is not a GPU UUID"),
        (lambda t: t["gpus"][0].update(uuid="GPU-1\n"), "topology.gpus[0].uuid: 'GPU-1\\n' is not a GPU UUID"),
        (lambda t: t["numa_nodes"][0].update(cores="0-15"), "topology.numa_nodes[0].cores: '0-15' is not a list"),
        (lambda t: t["numa_nodes"][0].update(memory_free_bytes="lots"),
         "topology.numa_nodes[0].memory_free_bytes: 'lots' is not a byte count"),
        (lambda t: t["numa_nodes"][0].update(memory_total_bytes=-5),
         "topology.numa_nodes[0].memory_total_bytes: -5 is not a byte count"),
    ],
)
def test_damaged_topology_fields_are_named(mutate, expected):
    topo = topology("h200-1gpu-vm")
    mutate(topo)
    problems = problems_of(topo, [{"name": "a", "gpus": [0], "command": ["/bin/x"]}])
    assert any(p.startswith(expected) for p in problems), problems


# --------------------------------------------------------------------------
# Housekeeping: size follows the node, GPU-less nodes first, explicit lists


@pytest.mark.parametrize(
    "name, expected",
    [
        ("hgx-h200-8gpu-2socket-ht", {"0": "0-1,96-97", "1": "48-49,144-145"}),  # 48 cores: 2
        ("gb200-4gpu-34numa", {"0": "0-2", "1": "72-74"}),  # 72 cores: 3
        ("h200-1gpu-vm", {"0": "0"}),  # 16 cores: 1
        # NPS4: GPUs on nodes 1,3,5,7; the system runs on the GPU-less nodes
        ("dgxa100-nps4-8node", {"0": "0,128", "1": "", "2": "32,160", "3": "", "4": "64,192", "5": "",
                                "6": "96,224", "7": ""}),
    ],
)
def test_auto_housekeeping_follows_the_node(name, expected):
    plan = build_plan(topology(name), profile("strict"), [])
    assert plan["options"]["housekeeping_cores_per_node"] == "auto"
    assert plan["housekeeping"] == expected


def test_auto_housekeeping_on_nps4_leaves_gpu_nodes_whole():
    plan = build_plan(topology("dgxa100-nps4-8node"), profile("strict"), per_gpu(range(8), memory="16G"))
    for inst in plan["instances"]:
        assert len(parse_cpulist(inst["cpus"])) == 16  # 16 cores per node, 2 GPUs: 8 cores each
    # a CPU-only service on a GPU-less node still gets that node's worker cores
    plan = build_plan(topology("dgxa100-nps4-8node"), profile("strict"),
                      [{"name": "tok", "numa_node": 0, "command": ["/bin/tok"], "memory": "1G"}])
    assert plan["instances"][0]["cpus"] == "1-15,129-143"


@pytest.mark.parametrize("cores, expected", [(1, 1), (16, 1), (24, 1), (25, 2), (48, 2), (64, 3), (72, 3), (128, 6)])
def test_auto_housekeeping_size(cores, expected):
    from ansible.module_utils.gpunuma.plan.topology import auto_housekeeping_cores

    assert auto_housekeeping_cores(cores) == expected


def test_explicit_housekeeping_cpus_like_reserved_system_cpus():
    plan = build_plan(topology("hgx-h200-8gpu-2socket-ht"), profile("strict"), per_gpu([0, 4], memory="8G"),
                      housekeeping_cpus="0-1,96-97")
    assert plan["housekeeping"] == {"0": "0-1,96-97", "1": ""}
    assert plan["options"]["housekeeping_cpus"] == "0-1,96-97"
    assert plan["instances"][1]["cpus"] == "48-95,144-191"
    # a list that splits a core keeps the whole core, with a warning
    plan = build_plan(topology("hgx-h200-8gpu-2socket-ht"), profile("strict"), [], housekeeping_cpus="0")
    assert plan["housekeeping"]["0"] == "0,96"
    assert any("housekeeping_cpus 0 split hyperthread sibling groups 0,96" in w for w in plan["warnings"])


@pytest.mark.parametrize(
    "value, expected",
    [
        ("0-1,500", "housekeeping_cpus: CPUs 500 do not exist on gpu-a01; allowed: 0-191"),
        (5, "housekeeping_cpus: 5 is an int; allowed: a CPU list string"),
        ("x", "housekeeping_cpus 'x': 'x' is not a CPU id or range"),
    ],
)
def test_bad_housekeeping_cpus(value, expected):
    with pytest.raises(PlanError) as info:
        build_plan(topology("hgx-h200-8gpu-2socket-ht"), profile("strict"), [], housekeeping_cpus=value)
    assert any(p.startswith(expected) for p in info.value.problems), info.value.problems


# --------------------------------------------------------------------------
# NIC locality


def test_nics_nearest_each_gpu_pix_first():
    plan = make_plan("hgx-h200-8gpu-2socket-ht", "strict", per_gpu(range(8), memory="8G"))
    for inst in plan["instances"]:
        gpu = inst["gpus"][0]
        assert inst["gpu_nics"] == [["mlx5_%d" % gpu]]  # GPU i -> mlx5_i behind the same PCIe switch
        assert inst["nics"] == ["mlx5_%d" % gpu]
        assert "UCX_NET_DEVICES" not in inst["environment"]  # opt-in only


def test_nics_pxb_pairs_and_tensor_parallel_union():
    plan = make_plan("dgxa100-nps4-8node", "strict",
                     [{"name": "tp", "gpus": [0, 1], "command": ["/bin/x"], "memory": "8G",
                       "nic_environment": ["UCX_NET_DEVICES", "NCCL_IB_HCA"]}])
    inst = plan["instances"][0]
    assert inst["gpu_nics"] == [["mlx5_0", "mlx5_1"], ["mlx5_0", "mlx5_1"]]
    assert inst["nics"] == ["mlx5_0", "mlx5_1"]
    assert inst["environment"]["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1"
    assert inst["environment"]["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1"


def test_nics_fall_back_to_the_gpus_node_and_cpu_only_instances():
    plan = make_plan("gb200-4gpu-34numa", "strict",
                     per_gpu([2], memory="8G") + [{"name": "tok", "numa_node": 0, "command": ["/bin/t"],
                                                   "memory": "1G"}])
    gpu2, tok = plan["instances"]
    assert gpu2["nics"] == ["mlx5_4", "mlx5_5"]  # NODE links only: the NICs on the GPU's node
    assert tok["gpu_nics"] == [] and tok["nics"] == ["mlx5_0", "mlx5_1"]


def test_nic_environment_without_nics_warns():
    plan = make_plan("h200-1gpu-vm", "strict", per_gpu([0], memory="1G", nic_environment=["UCX_NET_DEVICES"]))
    inst = plan["instances"][0]
    assert inst["nics"] == [] and "UCX_NET_DEVICES" not in inst["environment"]
    assert any("nic_environment: no NIC is near GPU 0 on h200-vm" in w for w in inst["warnings"])


@pytest.mark.parametrize(
    "value, expected",
    [
        ("UCX_NET_DEVICES", "gpunuma_instances[0].nic_environment: 'UCX_NET_DEVICES' is not a list of variable names"),
        (["NCCL_SOCKET_IFNAME"], "gpunuma_instances[0].nic_environment[0]: 'NCCL_SOCKET_IFNAME' is not a variable "
                                 "gpunuma fills with NICs; allowed: UCX_NET_DEVICES, NCCL_IB_HCA"),
        (["NCCL_IB_HCA", "NCCL_IB_HCA"], "gpunuma_instances[0].nic_environment[1]: NCCL_IB_HCA is listed twice"),
    ],
)
def test_bad_nic_environment(value, expected):
    problems = problems_of("hgx-h200-8gpu-2socket-ht", per_gpu([0], nic_environment=value))
    assert any(p.startswith(expected) for p in problems), problems


def test_nic_environment_conflicts_with_environment():
    problems = problems_of("hgx-h200-8gpu-2socket-ht",
                           per_gpu([0], nic_environment=["UCX_NET_DEVICES"], environment={"UCX_NET_DEVICES": "all"}))
    assert any("nic_environment[0]: UCX_NET_DEVICES is also given in environment" in p for p in problems), problems


# --------------------------------------------------------------------------
# Tensor-parallel instances: per-GPU worker shares and engine flags


VLLM_CMD = ["/opt/vllm/bin/vllm", "serve", "/m", "-tp", "8"]


def _tp8(version="0.23.0", fence=True, **extra):
    item = {"name": "tp8", "gpus": list(range(8)), "engine": "vllm", "memory": "64G", "command": list(VLLM_CMD)}
    if version is not None:
        item["engine_version"] = version
    item.update(extra)
    topo = topology("hgx-h200-8gpu-2socket-ht")
    return topo, make_plan(topo, "strict", [item], fence=fence)["instances"][0]


def test_vllm_spanning_instance_gets_a_local_share_per_gpu():
    topo, inst = _tp8()
    whole = parse_cpulist(inst["cpus"])
    shares = [parse_cpulist(c) for c in inst["worker_cpus"]]
    siblings = sibling_groups(topo)
    seen = set()
    for gpu, share in zip(inst["gpus"], shares):
        node = topo["gpus"][gpu]["numa_node"]
        assert share <= whole and share <= parse_cpulist(node_of(topo, node)["cpus"])
        assert not share & seen
        seen |= share
        assert all(siblings[c] <= share for c in share)
    assert inst["engine_args"] == (["--numa-bind", "--numa-bind-nodes", "0", "0", "0", "0", "1", "1", "1", "1",
                                    "--numa-bind-cpus"] + inst["worker_cpus"])
    assert inst["command"] == VLLM_CMD + inst["engine_args"]
    assert inst["engine_version"] == "0.23.0"
    assert inst["environment"]["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    # two whole cores of the share stay outside every rank's slice: vLLM's API server and EngineCore
    assert len(whole - set().union(*shares)) >= 2
    assert any("stay for the API server and engine core" in w for w in inst["warnings"])


@pytest.mark.parametrize("version, flags", [
    ("0.19.1", None),
    ("0.20.0", ["--numa-bind", "--numa-bind-nodes"]),
    ("0.22.1", ["--numa-bind", "--numa-bind-nodes"]),
    ("0.23.0", ["--numa-bind", "--numa-bind-nodes", "--numa-bind-cpus"]),
    ("0.34.0rc1", ["--numa-bind", "--numa-bind-nodes", "--numa-bind-cpus"]),
])
def test_vllm_flags_follow_what_each_release_accepts(version, flags):
    _, inst = _tp8(version)
    given = [a for a in inst["engine_args"] if a.startswith("--")]
    if flags is None:
        assert inst["engine_args"] == [] and any("has no --numa-bind" in w for w in inst["warnings"])
        return
    assert given == flags
    if "--numa-bind-cpus" not in flags:
        assert any("first rank's --numa-bind-cpus list" in w for w in inst["warnings"])


def test_vllm_flags_need_a_version_and_the_fence():
    _, inst = _tp8(version=None)
    assert inst["engine_args"] == [] and any("engine_version is not given" in w for w in inst["warnings"])
    for fence, words in ((False, "not on for this node"), (None, "unknown to the planner")):
        _, inst = _tp8(fence=fence)
        assert inst["engine_args"] == []
        assert any("added only with the cgroup fence" in w and words in w for w in inst["warnings"])
        assert inst["exec_prefix"][0] == "numactl"  # the instance-wide binding is kept
    _, inst = _tp8(version="0.40.0")
    assert any("newer than the newest vLLM" in w for w in inst["warnings"])


@pytest.mark.parametrize("flag", ["--numa_bind", "--numa_bind_nodes=0", "--numa-bind_cpus"])
def test_vllm_reads_underscores_as_dashes_so_does_the_planner(flag):
    """vLLM's FlexibleArgumentParser takes --numa_bind for --numa-bind: a command with it binds its own workers."""
    _, inst = _tp8(command=VLLM_CMD + [flag])
    assert inst["engine_args"] == [] and any("binds its workers itself (%s)" % flag in w for w in inst["warnings"])


def test_command_that_binds_itself_is_fenced_not_bound_twice():
    _, inst = _tp8(command=VLLM_CMD + ["--numa-bind"])
    assert inst["engine_args"] == [] and inst["worker_cpus"] is None
    assert inst["exec_prefix"] == [] and inst["cpus"]  # the fence (AllowedCPUs=) holds it to its share
    assert any("binds its workers itself (--numa-bind)" in w and "fence alone" in w for w in inst["warnings"])
    assert inst["environment"]["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    _, inst = _tp8(command=VLLM_CMD + ["--numa-bind"], fence=False)
    assert inst["exec_prefix"][0] == "numactl"
    assert any("without the cgroup fence" in w for w in inst["warnings"])


def test_engines_that_pin_themselves_are_told_not_to_where_gpunuma_binds():
    plan = make_plan("hgx-h200-8gpu-2socket-ht", "strict",
                     [{"name": "trt", "gpus": [0], "engine": "trtllm", "memory": "8G", "command": ["/bin/trt"]},
                      {"name": "sg", "gpus": [1], "engine": "sglang", "memory": "8G", "command": ["/bin/sg"]},
                      {"name": "sg2", "gpus": [2], "engine": "sglang", "memory": "8G", "command": ["/bin/sg"],
                       "environment": {"SGLANG_AUTO_NUMA_BIND": "1"}}], fence=True)
    trt, sg, sg2 = plan["instances"]
    assert trt["environment"]["TLLM_NUMA_AWARE_WORKER_AFFINITY"] == "0"
    assert sg["environment"]["SGLANG_AUTO_NUMA_BIND"] == "0"
    assert sg2["environment"]["SGLANG_AUTO_NUMA_BIND"] == "1"
    assert any("environment.SGLANG_AUTO_NUMA_BIND kept as given" in w for w in sg2["warnings"])
    # profile off binds nothing: the engines keep their own defaults
    off = make_plan("hgx-h200-8gpu-2socket-ht", "off",
                    [{"name": "trt", "gpus": [0], "engine": "trtllm", "command": ["/bin/trt"]}], fence=True)
    assert "TLLM_NUMA_AWARE_WORKER_AFFINITY" not in off["instances"][0]["environment"]


def test_ranks_bound_node_by_node_are_checked_per_node():
    """vLLM's --numa-bind puts each worker under --membind=<its node>: interleave cannot spill for them."""
    topo, inst = _tp8(memory="1100G")  # 137.5 GiB a rank, 550 GiB a node: fits
    assert inst["engine_args"][:2] == ["--numa-bind", "--numa-bind-nodes"]
    topo, inst = _tp8(memory="2200G")  # 275 GiB a rank x 4 = 1100 GiB a node: does not
    assert inst["engine_args"] == [] and inst["mem_policy"] == "interleave"
    (why,) = [w for w in inst["warnings"] if "binds each rank's memory" in w]
    assert "1100.0 GiB on NUMA node 0 (4 ranks x 275.0 GiB" in why
    assert "engine's binding flags are not added" in why
    # a two-node machine: interleave over both has nowhere to spill, and says so
    assert not any("will spill" in w for w in inst["warnings"])
    assert any("no other NUMA node has memory to spill to" in w for w in inst["warnings"])
    item = {"name": "tp8", "gpus": list(range(8)), "engine": "vllm", "engine_version": "0.23.0", "memory": "2200G",
            "command": list(VLLM_CMD)}
    problems = problems_of(topo, [item], strict_capacity="error", fence=True)
    assert any(p.startswith("gpunuma_instances[0].memory: engine vllm binds each rank's memory") for p in problems)
    # memory already bound on a node by another instance counts against the ranks there
    other = {"name": "big", "numa_node": 0, "memory": "600G", "command": ["/bin/x"]}
    plan = make_plan(topo, "strict", [other, dict(item, memory="1100G")], fence=True)
    big, tp = plan["instances"]
    assert big["mem_policy"] == "bind" and tp["engine_args"] == []
    assert any("384.0 GiB left of the 984.0 GiB" in w for w in tp["warnings"])


def test_an_instance_whose_ranks_are_bound_node_by_node_is_counted_once():
    """A TP2 instance on one node, bound there: its memory is the ranks' memory, not that plus the ranks' again.
    Declaring more than half of what the node holds must still bind it (and pass the error setting)."""
    topo = topology("hgx-h200-8gpu-2socket-ht")
    item = {"name": "tp2", "gpus": [0, 1], "engine": "vllm", "engine_version": "0.23.0", "memory": "600G",
            "command": list(VLLM_CMD)}  # node 0 holds 984 GiB for instances
    for strict in ("fallback", "error"):
        [inst] = make_plan(topo, "strict", [item], fence=True, strict_capacity=strict)["instances"]
        assert inst["mem_policy"] == "bind" and inst["engine_args"][:2] == ["--numa-bind", "--numa-bind-nodes"]
        assert not any("binds each rank's memory" in w for w in inst["warnings"]), inst["warnings"]
    # Another instance bound there still counts against the ranks: 600 + 400 GiB do not fit 984.
    other = {"name": "big", "numa_node": 0, "memory": "400G", "command": ["/bin/x"]}
    big, tp = make_plan(topo, "strict", [other, item], fence=True)["instances"]
    assert big["mem_policy"] == "bind"
    assert tp["mem_policy"] == "preferred" or tp["engine_args"] == [], tp


def test_ranks_are_never_bound_without_declared_memory():
    """vLLM binds each rank's memory to its node: with no memory declared that is a bind nothing checked, so the
    rule of an unsized instance bind applies (dropped under fallback, refused under error)."""
    topo, inst = _tp8(memory=None)
    assert inst["engine_args"] == []
    assert any("no memory is declared" in w and "engine's binding flags are not added" in w for w in inst["warnings"])
    item = {"name": "tp8", "gpus": list(range(8)), "engine": "vllm", "engine_version": "0.23.0",
            "command": list(VLLM_CMD)}
    problems = problems_of(topo, [item], strict_capacity="error", fence=True)
    assert any(p.startswith("gpunuma_instances[0].memory: missing: engine vllm binds each rank's memory")
               for p in problems), problems


def test_single_gpu_vllm_below_three_cores_warns():
    plan = make_plan("hgx-h200-8gpu-2socket-ht", "strict",
                     [{"name": "one", "gpus": [0], "engine": "vllm", "cpus": 4, "memory": "8G", "command": ["/bin/v"]}])
    assert any("2 physical cores for one GPU worker, below vLLM's minimum of 3" in w
               for w in plan["instances"][0]["warnings"])


def test_generic_engine_keeps_the_instance_wide_binding():
    plan = make_plan("hgx-h200-8gpu-2socket-ht", "strict",
                     [{"name": "tp8", "gpus": list(range(8)), "memory": "64G", "command": ["/bin/srv"]}])
    inst = plan["instances"][0]
    assert inst["engine"] == "generic" and inst["worker_cpus"] is None and inst["engine_args"] == []
    assert inst["command"] == ["/bin/srv"]
    assert any("numa_bind_nodes" in w for w in inst["warnings"])


def test_sglang_flags_only_when_alone_on_its_nodes():
    alone = make_plan("hgx-h200-8gpu-2socket-ht", "strict",
                      [{"name": "sg", "gpus": [0, 1, 4, 5], "engine": "sglang", "memory": "8G", "command": ["/bin/sg"]}],
                      fence=True)
    assert alone["instances"][0]["engine_args"] == ["--numa-node", "0", "0", "1", "1"]
    # SGLang takes no CPU list per rank: no slices are recorded that nothing would apply
    assert alone["instances"][0]["worker_cpus"] is None
    shared = make_plan("hgx-h200-8gpu-2socket-ht", "strict",
                       [{"name": "sg", "gpus": [0, 1, 4, 5], "engine": "sglang", "memory": "8G", "command": ["/bin/sg"]},
                        {"name": "w2", "gpus": [2], "memory": "8G", "command": ["/bin/x"]}], fence=True)
    sg = shared["instances"][0]
    assert sg["engine_args"] == [] and any("whole NUMA node, which instances 'w2'" in w for w in sg["warnings"])


def test_vllm_below_its_minimum_cores_warns():
    plan = make_plan("hgx-h200-8gpu-2socket-ht", "strict",
                     [{"name": "tp", "gpus": [0, 1], "engine": "vllm", "engine_version": "0.23.0", "cpus": 6,
                       "memory": "8G", "command": ["/bin/v"]}], fence=True)
    inst = plan["instances"][0]
    assert any("engine vllm: 3 physical cores for 2 GPU workers, below vLLM's minimum of 4" in w
               for w in inst["warnings"])


@pytest.mark.parametrize(
    "instance, expected",
    [
        ({"engine": "tgi"}, "gpunuma_instances[0].engine: 'tgi' is not allowed; allowed: generic, vllm, sglang, trtllm"),
        ({"engine": "vllm", "engine_version": "latest"},
         "gpunuma_instances[0].engine_version: 'latest' is not a release number"),
        ({"engine_version": "0.23.0"}, "gpunuma_instances[0].engine_version: given without engine"),
    ],
)
def test_bad_engine(instance, expected):
    item = {"name": "a", "gpus": [0, 1], "command": ["/bin/v"]}
    item.update(instance)
    problems = problems_of("hgx-h200-8gpu-2socket-ht", [item])
    assert any(p.startswith(expected) for p in problems), problems


# --------------------------------------------------------------------------
# L3 cache domains


def _with_ccx(topo):
    """DGX A100 (EPYC 7742): 4-core CCXs sharing one L3 (cache/index3/shared_cpu_list)."""
    for node in topo["numa_nodes"]:
        first = node["id"] * 16
        node["l3_groups"] = ["%d-%d,%d-%d" % (first + 4 * j, first + 4 * j + 3, first + 4 * j + 128,
                                              first + 4 * j + 131) for j in range(4)]
    return topo


def _ccxs_of(cpus):
    return set((c % 128) // 4 for c in cpus)


def test_shares_follow_l3_groups_when_housekeeping_shifts_the_split():
    instances = per_gpu([2, 3], memory="8G")  # both on node 1: CPUs 16-31,144-159
    plain = make_plan("dgxa100-nps4-8node", "strict", instances)
    first, second = [parse_cpulist(i["cpus"]) for i in plain["instances"]]
    assert len(_ccxs_of(first)) == 3 and _ccxs_of(first) & _ccxs_of(second)  # today's defect, without L3 data
    plan = make_plan(_with_ccx(topology("dgxa100-nps4-8node")), "strict", instances)
    first, second = [parse_cpulist(i["cpus"]) for i in plan["instances"]]
    assert not _ccxs_of(first) & _ccxs_of(second)
    assert (len(first) // 2, len(second) // 2) == (7, 8)  # CCX of housekeeping core 16 (3 left) + one, then two
    assert any("follows its L3 cache groups" in w for w in plan["instances"][0]["warnings"])


def test_l3_split_that_cannot_be_whole_says_so():
    instances = per_gpu([2, 3], memory="8G") + [{"name": "tok%d" % k, "numa_node": 1, "command": ["/bin/t"],
                                                 "memory": "1G"} for k in range(3)]
    plan = make_plan(_with_ccx(topology("dgxa100-nps4-8node")), "strict", instances)
    assert any("cannot follow its 4 L3 cache groups" in w for w in plan["warnings"])


def test_bad_l3_groups_are_named():
    topo = _with_ccx(topology("dgxa100-nps4-8node"))
    topo["numa_nodes"][1]["l3_groups"] = ["16-23", "20-27"]
    problems = problems_of(topo, per_gpu([2], memory="8G"))
    assert any(p.startswith("topology.numa_nodes[1].l3_groups[1]: CPUs 20-23 are also in an earlier group") for p in problems)


def test_l3_groups_discovered_from_sysfs_cache_index3(tmp_path):
    """cache/index3/shared_cpu_list of an EPYC NPS4 tree becomes l3_groups, and the plan follows them."""
    import sysfs_factory
    from ansible.module_utils.gpunuma.discovery.discover import discover

    root = sysfs_factory.amd_nps4_8node(str(tmp_path))
    cpu_root = os.path.join(root, "sys", "devices", "system", "cpu")
    for cpu in range(256):
        base = cpu % 128 // 4 * 4
        index3 = os.path.join(cpu_root, "cpu%d" % cpu, "cache", "index3")
        os.makedirs(index3, exist_ok=True)
        with open(os.path.join(index3, "level"), "w") as handle:
            handle.write("3\n")
        with open(os.path.join(index3, "shared_cpu_list"), "w") as handle:
            handle.write("%d-%d,%d-%d\n" % (base, base + 3, base + 128, base + 131))
    topo = discover("dgx", sysfs_root=root)["topology"]
    node1 = [n for n in topo["numa_nodes"] if n["id"] == 1][0]
    assert node1["l3_groups"] == ["16-19,144-147", "20-23,148-151", "24-27,152-155", "28-31,156-159"]
    gpus = [g["index"] for g in topo["gpus"] if g["numa_node"] == 1]
    plan = make_plan(topo, "strict", per_gpu(gpus, memory="8G"))
    first, second = [parse_cpulist(i["cpus"]) for i in plan["instances"]]
    assert not _ccxs_of(first) & _ccxs_of(second)


def test_readiness_check_is_carried_into_the_plan_with_its_defaults():
    plan = build_plan(topology("h200-1gpu-vm"), profile("strict"), [
        {"name": "a", "gpus": [0], "command": ["/bin/x"], "ready": {"url": "http://127.0.0.1:8000/health"}},
        {"name": "b", "numa_node": 0, "share_cpus": True, "command": ["/bin/x"],
         "ready": {"command": ["/usr/bin/curl", "-sf", "http://127.0.0.1:8001/v1/models"], "timeout": 900}},
        {"name": "c", "numa_node": 0, "share_cpus": True, "command": ["/bin/x"]},
    ], housekeeping_cores_per_node=0)
    ready = {i["name"]: i["ready"] for i in plan["instances"]}
    assert ready["a"] == {"url": "http://127.0.0.1:8000/health", "timeout": 300, "interval": 5}
    assert ready["b"] == {"command": ["/usr/bin/curl", "-sf", "http://127.0.0.1:8001/v1/models"],
                          "timeout": 900, "interval": 5}
    assert ready["c"] is None


# ------------------------------------------------- MemTotal drift (ballooned or hot-plugged VM memory)

def _with_total(topo_name, total):
    topo = topology(topo_name)
    topo["numa_nodes"][0]["memory_total_bytes"] = total
    return topo


DRIFT_INSTANCES = [
    {"name": "fits", "gpus": [0], "command": ["/bin/a"], "memory": "2G"},
    {"name": "huge", "numa_node": 0, "command": ["/bin/b"], "memory": "64T"},
]


def _plan_on(total, applied=None, instances=DRIFT_INSTANCES, **options):
    return build_plan(_with_total("h200-1gpu-vm", total), profile("strict"), copy.deepcopy(instances),
                      applied_plan=applied, **options)


def test_memtotal_drift_that_decides_nothing_keeps_the_applied_plan_byte_for_byte():
    applied = _plan_on(7 * GIB)
    again = _plan_on(9 * GIB, applied=json.loads(json.dumps(applied)))
    assert json.dumps(again, sort_keys=True) == json.dumps(applied, sort_keys=True)
    assert again["instances"][1]["mem_policy"] == "preferred" and again["instances"][0]["mem_policy"] == "bind"


def test_memtotal_drift_without_an_applied_plan_uses_todays_figures():
    assert _plan_on(7 * GIB)["memory_capacity"] != _plan_on(9 * GIB)["memory_capacity"]


def test_memtotal_drift_that_changes_a_fit_takes_todays_figures():
    instances = [{"name": "edge", "gpus": [0], "command": ["/bin/a"], "memory": "6G"}]
    applied = _plan_on(7 * GIB, instances=instances)
    assert applied["instances"][0]["mem_policy"] == "preferred"
    grown = _plan_on(9 * GIB, applied=applied, instances=instances)
    assert grown["instances"][0]["mem_policy"] == "bind"
    assert grown["memory_capacity"] == _plan_on(9 * GIB, instances=instances)["memory_capacity"]


def test_applied_capacity_counts_only_for_the_same_topology_and_reserve():
    applied = _plan_on(7 * GIB)
    other = dict(copy.deepcopy(applied), topology_fingerprint="sha256:" + "0" * 64)
    assert _plan_on(9 * GIB, applied=other)["memory_capacity"] == _plan_on(9 * GIB)["memory_capacity"]
    reserved = _plan_on(9 * GIB, applied=applied, memory_reserve_per_node="1G")
    assert reserved["memory_capacity"] == {"0": 8 * GIB}


def test_kept_capacity_messages_match_the_applied_plan():
    applied = _plan_on(7 * GIB)
    kept = _plan_on(12 * GIB, applied=applied)
    assert kept["instances"][1]["fallback"] == applied["instances"][1]["fallback"]
    assert "MemTotal minus a" in kept["instances"][1]["fallback"]


@pytest.mark.parametrize("total", [0, 100 << 20, 255 << 20, GIB - 1, GIB, 3 * GIB + 12345, 4 * GIB, 7 * GIB + 1,
                                   16 * GIB, 200 * GIB + 7, 2048 * GIB])
def test_totals_for_inverts_the_auto_reserve(total):
    from ansible.module_utils.gpunuma.plan.capacity import _totals_for, auto_reserve

    capacity = max(total - auto_reserve(total), 0)
    (back,) = _totals_for({0: capacity}, None).values()
    assert max(back - auto_reserve(back), 0) == capacity
    if total < 2 * GIB:
        return  # below 1 GiB the reserve is a flat 255 MiB, and machines of two nodes are larger
    # two nodes of one machine: the machine's reserve spread by size, recovered node by node
    halves = {0: total // 3, 1: total - total // 3}
    reserve = auto_reserve(total)
    capacities = dict((n, t - (reserve * t // total if total else 0)) for n, t in halves.items())
    back = _totals_for(capacities, None)
    for node, node_total in halves.items():
        assert abs(back[node] - node_total) <= 2 + node_total // (1 << 30)


@pytest.mark.parametrize("name", ["dgxa100-nps4-8node", "gb200-4gpu-34numa", "h200-1gpu-vm", "hgx-h200-8gpu-2socket-ht",
                                  "pcie-8gpu-plx-2socket"])
@pytest.mark.parametrize("cores", ["auto", 0, 1, 3])
@pytest.mark.parametrize("irq_pin", [False, True])
def test_housekeeping_cpu_set_is_the_plans_housekeeping(name, cores, irq_pin):
    """The kubelet's reserved CPUs come from planner.housekeeping_cpu_set, without planning instances: it must be
    exactly the union of build_plan's housekeeping map for the same options (one decider)."""
    topo = topology(name)
    plan = build_plan(topo, load_profile("strict", os.path.join(REPO_ROOT, "policies", "profiles")), [],
                      housekeeping_cores_per_node=cores, irq_pin=irq_pin)
    expected = frozenset()
    for text in plan["housekeeping"].values():
        if text:
            expected |= parse_cpulist(text)
    assert planner.housekeeping_cpu_set(topo, cores, irq_pin=irq_pin) == expected


def test_housekeeping_cpu_set_names_bad_options():
    with pytest.raises(PlanError) as caught:
        planner.housekeeping_cpu_set(topology("h200-1gpu-vm"), -1, housekeeping_cpus="0,4000")
    text = str(caught.value)
    assert "housekeeping_cores_per_node: -1 is not a core count" in text and "housekeeping_cpus: CPUs 4000 do not exist" in text


def _memoryless(node_id, distances=True):
    topo = copy.deepcopy(topology("dgxa100-nps4-8node"))
    for node in topo["numa_nodes"]:
        if node["id"] == node_id:
            node["memory_total_bytes"] = node["memory_free_bytes"] = 0
        if not distances:
            node.pop("distances", None)
    return topo


def test_a_node_with_cpus_and_no_memory_keeps_its_cpus_and_takes_memory_from_the_nearest_node():
    """numactl refuses a memory-less node in --membind/--preferred/--interleave: the instance would never start."""
    topo = _memoryless(1)
    gpu = next(g["index"] for g in topo["gpus"] if g["numa_node"] == 1)
    for profile_name, flag in (("strict", "--membind"), ("preferred", "--preferred")):
        plan = make_plan(topo, profile_name, [{"name": "w", "gpus": [gpu], "memory": "8G", "command": ["/bin/x"]}])
        [inst] = plan["instances"]
        assert inst["numa_nodes"] == [1] and inst["mem_nodes"] == [0], inst
        assert parse_cpulist(inst["cpus"]) <= parse_cpulist(node_of(topo, 1)["cpus"])
        assert "%s=0" % flag in inst["numactl_args"]
        assert any("NUMA node 1 has CPUs but no memory" in w and "from node 0" in w for w in inst["warnings"])
    # Interleave over every CPU node leaves the memory-less one out.
    plan = make_plan(topo, "interleave", [{"name": "w", "gpus": [gpu], "command": ["/bin/x"]}])
    assert 1 not in plan["instances"][0]["mem_nodes"]
    # Capacity is checked where the memory comes from: node 0 holds about 119 GiB for instances.
    problems = problems_of(topo, [{"name": "w", "gpus": [gpu], "memory": "200G", "command": ["/bin/x"]}],
                           strict_capacity="error")
    assert any("NUMA node 0" in p for p in problems), problems


def test_a_memoryless_node_without_distances_is_refused_naming_it():
    topo = _memoryless(1, distances=False)
    gpu = next(g["index"] for g in topo["gpus"] if g["numa_node"] == 1)
    problems = problems_of(topo, [{"name": "w", "gpus": [gpu], "memory": "8G", "command": ["/bin/x"]}])
    assert any("NUMA node 1 has CPUs but no memory" in p and "no SLIT distances" in p for p in problems), problems


@pytest.mark.parametrize("version", [0.30, 1.10, 1, 0.3])
def test_an_unquoted_engine_version_is_refused_not_reread(version):
    """YAML reads engine_version: 0.30 as the number 0.3: planned as vLLM 0.3.0 it would lose the release's flags."""
    problems = problems_of("hgx-h200-8gpu-2socket-ht", [{"name": "v", "gpus": [0], "engine": "vllm",
                                                          "engine_version": version, "command": ["/x"]}])
    assert any(p.startswith("gpunuma_instances[0].engine_version: %r is a number, not a release" % version)
               and '"0.23.0"' in p for p in problems), problems

