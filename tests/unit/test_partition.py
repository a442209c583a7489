"""The partitioner (gpunuma.plan.partition) and the plans it makes on an L3-partitioned machine.

Properties over generated nodes (L3 domains x cores per domain x SMT), and
the expert's cases on a dual-socket host whose sockets each hold six 8-core
CCDs (as an EPYC 9004 with 48 cores per socket): tensor-parallel rank slices
inside one CCD each, counted instances on whole CCDs, instance shares on
whole CCDs.
"""

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible.module_utils.gpunuma.common.cpulist import parse_cpulist
from ansible.module_utils.gpunuma.plan import partition
from conftest import examples
from test_plan import make_plan, topology

pytestmark = pytest.mark.unit


def machine(domains, per_domain, smt):
    """(cores, l3_groups): ``domains`` L3 domains of ``per_domain`` cores, ``smt`` threads per core."""
    total = domains * per_domain
    cores = [frozenset(c + t * total for t in range(smt)) for c in range(total)]
    l3 = [frozenset().union(*cores[d * per_domain:(d + 1) * per_domain]) for d in range(domains)]
    return cores, l3


def domains_of(cores, l3):
    return {i for i, group in enumerate(l3) for core in cores if core <= group}


@st.composite
def nodes(draw):
    domains = draw(st.integers(1, 8))
    per_domain = draw(st.integers(1, 8))
    smt = draw(st.sampled_from([1, 2]))
    cores, l3 = machine(domains, per_domain, smt)
    # Some cores already taken (housekeeping, explicit lists): a random subset stays free.
    keep = draw(st.lists(st.booleans(), min_size=len(cores), max_size=len(cores)))
    free = [c for c, k in zip(cores, keep) if k] or cores[:1]
    return free, l3


@given(nodes(), st.integers(1, 6))
@settings(max_examples=examples(150), deadline=None)
def test_split_covers_every_core_once_and_aligned_parts_hold_whole_domains(node, count):
    free, l3 = node
    parts, aligned = partition.split(free, l3, count)
    assert len(parts) == count
    flat = [c for p in parts for c in p]
    assert sorted(flat, key=min) == sorted(free, key=min) and len(set(flat)) == len(flat)
    if aligned:
        for part in parts:
            for other in parts:
                if other is not part:
                    assert not domains_of(part, l3) & domains_of(other, l3)


@given(nodes(), st.integers(1, 24))
@settings(max_examples=examples(150), deadline=None)
def test_take_touches_the_fewest_domains(node, want):
    free, l3 = node
    got = partition.take(free, l3, want)
    assert len(got) == min(want, len(free)) and len(set(got)) == len(got) and set(got) <= set(free)
    if want <= len(free):
        # Independent minimum: the largest free runs first until they hold want cores.
        sizes = sorted((len([c for c in free if c <= g]) for g in l3), reverse=True)
        fewest, total = 0, 0
        while total < want:
            total += sizes[fewest]
            fewest += 1
        assert len(domains_of(got, l3)) == fewest


@given(nodes(), st.integers(1, 8))
@settings(max_examples=examples(150), deadline=None)
def test_rank_slices_are_disjoint_and_aligned_slices_stay_in_their_domains(node, count):
    free, l3 = node
    slices, aligned = partition.rank_slices(free, l3, count)
    assert len(slices) == count
    flat = [c for s in slices for c in s]
    assert len(set(flat)) == len(flat) and set(flat) <= set(free)
    if aligned:
        assert all(slices)
        runs = len(domains_of(free, l3))
        if runs >= count:
            for s in slices:  # whole domains, none shared
                for other in slices:
                    if other is not s:
                        assert not domains_of(s, l3) & domains_of(other, l3)
        else:
            assert all(len(domains_of(s, l3)) == 1 for s in slices)
            assert len({len(s) for s in slices}) == 1
    elif len(free) >= count:
        assert flat == list(free)


# ------------------------------------------------------------ plans on six 8-core CCDs per socket

def _ccds(topo):
    """Each 48-core socket of the HGX fixture as six 8-core CCDs sharing an L3 (siblings +96)."""
    topo = copy.deepcopy(topo)
    for node in topo["numa_nodes"]:
        first = node["id"] * 48
        node["l3_groups"] = ["%d-%d,%d-%d" % (first + 8 * j, first + 8 * j + 7, first + 8 * j + 96,
                                              first + 8 * j + 103) for j in range(6)]
    return topo


def _ccd(cpu):
    return (cpu % 96) // 8


def _ccds_of(cpus):
    return {_ccd(c) for c in cpus}


def test_tp4_rank_slices_each_stay_in_one_ccd_and_leave_the_rest_to_the_engine():
    # Two TP4 vLLM instances on socket 0 (GPUs 0-3 then 4-7 would be socket 1: use 0-3 twice via share).
    instances = [{"name": "tp-a", "gpus": [0, 1, 2, 3], "engine": "vllm", "engine_version": "0.23.0", "memory": "64G",
                  "command": ["/opt/vllm/bin/vllm", "serve", "m"]},
                 {"name": "cpu-side", "numa_node": 0, "memory": "8G", "command": ["/bin/tok"]}]
    plan = make_plan(_ccds(topology("hgx-h200-8gpu-2socket-ht")), "strict", instances)
    tp = plan["instances"][0]
    share = parse_cpulist(tp["cpus"])
    slices = [parse_cpulist(s) for s in tp["worker_cpus"]]
    assert len(slices) == 4
    for s in slices:
        assert len(_ccds_of(s)) == 1, tp["worker_cpus"]
        assert s <= share
    assert len({len(s) for s in slices}) == 1
    assert len(set().union(*slices)) < len(share)  # cores left for the API server and engine core
    assert any("L3-aligned slices" in w for w in tp["warnings"])


def test_counted_instances_take_whole_ccds_while_whole_ones_are_free():
    instances = [{"name": "small", "numa_node": 0, "cpus": 6, "memory": "1G", "command": ["/bin/a"]},
                 {"name": "ccd", "numa_node": 0, "cpus": 16, "memory": "1G", "command": ["/bin/b"]}]
    plan = make_plan(_ccds(topology("hgx-h200-8gpu-2socket-ht")), "strict", instances)
    small, ccd = [parse_cpulist(i["cpus"]) for i in plan["instances"]]
    assert len(small) == 6 and len(_ccds_of(small)) == 1
    assert len(ccd) == 16 and len(_ccds_of(ccd)) == 1  # 8 cores: one whole CCD, not the rest of the first
    assert not _ccds_of(small) & _ccds_of(ccd)


def test_without_l3_data_counted_cores_come_in_core_order():
    instances = [{"name": "small", "numa_node": 0, "cpus": 6, "memory": "1G", "command": ["/bin/a"]},
                 {"name": "next", "numa_node": 0, "cpus": 16, "memory": "1G", "command": ["/bin/b"]}]
    plan = make_plan("hgx-h200-8gpu-2socket-ht", "strict", instances)
    small, nxt = [parse_cpulist(i["cpus"]) for i in plan["instances"]]
    assert min(nxt) == max(c for c in small if c < 96) + 1


def test_housekeeping_goes_through_the_partitioner():
    """Housekeeping is a carve-out like any other: its cores share one L3 domain, the smallest that holds them."""
    topo = _ccds(topology("hgx-h200-8gpu-2socket-ht"))
    plan = make_plan(topo, "strict", [], housekeeping_cores_per_node=3)
    for node, cpus in plan["housekeeping"].items():
        assert len(_ccds_of(parse_cpulist(cpus))) == 1, (node, cpus)
    # equal domains: the first one, which holds CPU 0
    assert parse_cpulist(plan["housekeeping"]["0"]) == parse_cpulist("0-2,96-98")
    # a smaller domain that holds them takes them, leaving the whole 8-core CCDs to workers
    node0 = topo["numa_nodes"][0]
    node0["l3_groups"] = ["0-9,96-105", "10-15,106-111"] + node0["l3_groups"][2:]
    plan = make_plan(topo, "strict", [], housekeeping_cores_per_node=3)
    assert parse_cpulist(plan["housekeeping"]["0"]) == parse_cpulist("10-12,106-108")
    # more than a domain holds: whole domains first, the fewest domains touched
    plan = make_plan(_ccds(topology("hgx-h200-8gpu-2socket-ht")), "strict", [], housekeeping_cores_per_node=10)
    assert len(_ccds_of(parse_cpulist(plan["housekeeping"]["0"]))) == 2
