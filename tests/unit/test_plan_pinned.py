"""Pinned host memory budgets (plan/pinned.py): checked per instance, placed where first touch puts them, counted
per NUMA node against what the node holds less a page-cache share, and turned into each unit's LimitMEMLOCK=."""

from __future__ import annotations

import datetime
import json
import os

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from ansible.module_utils.gpunuma.gate import policy
from ansible.module_utils.gpunuma.plan.model import PlanError
from ansible.module_utils.gpunuma.plan.planner import build_plan
from ansible.module_utils.gpunuma.plan.profiles import load_profile
from conftest import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.unit

GIB = 1 << 30
PROFILES = os.path.join(REPO_ROOT, "policies", "profiles")
with open(os.path.join(FIXTURES, "topologies", "hgx-h200-8gpu-2socket-ht.json"), encoding="utf-8") as _handle:
    HGX = json.load(_handle)


def plan_with(instances, profile="strict", **options):
    options.setdefault("housekeeping_cores_per_node", 1)
    return build_plan(HGX, load_profile(profile, PROFILES), instances, **options)


def worker(name="w0", gpu=0, **extra):
    return dict({"name": name, "gpus": [gpu], "memory": "64G", "command": ["/usr/bin/vllm", "serve"]}, **extra)


def problems(instances, **options):
    with pytest.raises(PlanError) as info:
        plan_with(instances, **options)
    return info.value.problems


@pytest.mark.parametrize("pinned, said", [
    ("lots", "gpunuma_instances[0].pinned"), (0, "pins nothing"), ("128G", "more than the instance's memory")])
def test_a_bad_budget_is_named(pinned, said):
    assert any(said in p for p in problems([worker(pinned=pinned)])), problems([worker(pinned=pinned)])


@pytest.mark.parametrize("option, value", [("pinned_headroom", "x"), ("pinned_page_cache_percent", 95),
                                           ("pinned_page_cache_percent", "10"), ("pinned_page_cache_percent", True)])
def test_bad_options_are_named(option, value):
    assert any(p.startswith(option) for p in problems([worker()], **{option: value}))


def test_the_unit_may_lock_its_budget_plus_headroom():
    plan = plan_with([worker(pinned="16G"), worker("w1", 1, pinned="16G", memlock="infinity"), worker("w2", 2)],
                     limit_memlock="4M")
    assert [i["limit_memlock"] for i in plan["instances"]] == [17 * GIB, "infinity", 4 << 20]
    assert [i["pinned_bytes"] for i in plan["instances"]] == [16 * GIB, 16 * GIB, None]
    assert plan_with([worker(pinned="16G")], pinned_headroom=0)["instances"][0]["limit_memlock"] == 16 * GIB


def test_budgets_are_counted_on_the_node_that_first_touches_them():
    # GPUs 0-3 sit on node 0, 4-7 on node 1 (the fixture).
    plan = plan_with([worker(pinned="16G"), worker("w1", 1, pinned="8G"), worker("w4", 4, pinned="4G")])
    assert plan["pinned_budget"] == {"0": 24 * GIB, "1": 4 * GIB}
    spread = plan_with([dict(worker(pinned="10G"), gpus=[0, 4])], profile="interleave")
    assert sum(spread["pinned_budget"].values()) == 10 * GIB and len(spread["pinned_budget"]) == 2


def test_a_node_over_its_pinned_room_is_refused_or_warned():
    capacity = plan_with([worker()])["memory_capacity"]["0"]
    room = capacity - capacity * 10 // 100
    each = room // 2 + GIB
    big = [worker("w%d" % g, g, memory=each, pinned=each) for g in (0, 1)]
    found = problems(big, strict_capacity="error")
    assert len(found) == 1 and "gpunuma_instances[0].pinned, gpunuma_instances[1].pinned" in found[0], found
    assert "never reclaimed" in found[0]
    # Fallback: planned, and both instances say why.
    plan = plan_with(big, strict_capacity="fallback")
    assert all(any("pinned memory is never reclaimed" in w for w in i["warnings"]) for i in plan["instances"])
    # A smaller page-cache share makes room.
    assert plan_with(big, strict_capacity="error", pinned_page_cache_percent=0)["pinned_budget"]["0"] == 2 * each


def test_the_gate_does_not_name_a_budgeted_instance_as_unlimited():
    plan = plan_with([worker(pinned="16G"), worker("w1", 1)], limit_memlock="infinity")
    rules = {r["id"]: r for r in policy.load_rules(os.path.join(REPO_ROOT, "policies", "rules"), yaml.safe_load)}
    ctx = policy.Context("gpu-a01", HGX, plan, {"memlock_limit": "4M", "memlock_users": [], "numa_balancing": 0}, None)
    (result,), _ = policy.evaluate([rules["GN-LIM-001"]], ctx, [], [], datetime.date(2026, 12, 7))
    assert [v.split()[1] for v in result["violations"]] == ["w1"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(1, 400)), min_size=1, max_size=8), st.integers(0, 90))
def test_every_node_holds_its_pools_or_the_plan_says_so(pinned_gib, percent):
    instances = [worker("w%d" % g, g, memory="400G", **({} if p is None else {"pinned": "%dG" % p}))
                 for g, p in enumerate(pinned_gib)]
    try:
        plan = plan_with(instances, strict_capacity="error", pinned_page_cache_percent=percent)
    except PlanError as exc:
        # Refused only for a node whose pools do not fit (or memory that does not fit under bind).
        assert all("pinned" in p or ".memory" in p for p in exc.problems), exc.problems
        return
    for node, budget in plan["pinned_budget"].items():
        capacity = plan["memory_capacity"][node]
        assert budget <= capacity - capacity * percent // 100
        on_node = [i for i in plan["instances"] if i["pinned_bytes"] and i["mem_nodes"] == [int(node)]]
        assert budget == sum(i["pinned_bytes"] for i in on_node)
    for item, p in zip(plan["instances"], pinned_gib):
        assert item["limit_memlock"] == ("infinity" if p is None else p * GIB + GIB)


# -- budgets the engine's own options state --------------------------------------------------------------------


def engine_worker(name, gpus, engine, command, **extra):
    return dict({"name": name, "gpus": gpus, "memory": "400G", "engine": engine, "command": command}, **extra)


@pytest.mark.parametrize("engine, args, environment, gpus, budget", [
    # vLLM --cpu-offload-gb: GiB per GPU (vllm/config, UVAOffloadConfig: "per GPU", CPU-pinned).
    ("vllm", ["--cpu-offload-gb", "10"], {}, [0, 1], 20 * GIB),
    ("vllm", ["--cpu_offload_gb=2.5"], {}, [0], int(2.5 * GIB)),
    # --kv-offloading-size: GiB across the ranks (vLLM splits it between them); only the native backend.
    ("vllm", ["--kv-offloading-size", "64", "--tensor-parallel-size", "2"], {}, [0, 1], 64 * GIB),
    ("vllm", ["--kv-offloading-size", "64", "--kv-offloading-backend", "lmcache"], {}, [0], None),
    # SGLang --hicache-size: GB (10^9 bytes) per rank, with the hierarchical cache on.
    ("sglang", ["--enable-hierarchical-cache", "--hicache-size", "30"], {}, [0, 1], 60 * 10**9),
    ("sglang", ["--hicache-size", "30"], {}, [0, 1], None),
    # LMCache: GiB per worker (lmcache/v1/cache_engine.py, max_local_cpu_size * 1024**3), unless local CPU is off.
    ("vllm", [], {"LMCACHE_MAX_LOCAL_CPU_SIZE": "20"}, [0, 1], 40 * GIB),
    ("vllm", [], {"LMCACHE_MAX_LOCAL_CPU_SIZE": "20", "LMCACHE_LOCAL_CPU": "False"}, [0, 1], None),
    ("generic", ["--cpu-offload-gb", "10"], {"LMCACHE_MAX_LOCAL_CPU_SIZE": "20"}, [0], None),
    # Summed where an instance uses several.
    ("vllm", ["--cpu-offload-gb", "1"], {"LMCACHE_MAX_LOCAL_CPU_SIZE": "2"}, [0, 1], 6 * GIB),
    ("vllm", ["--cpu-offload-gb", "nan"], {}, [0], None),
])
def test_the_engine_options_state_the_budget(engine, args, environment, gpus, budget):
    instance = engine_worker("e", gpus, engine, ["/usr/bin/" + engine, "serve", "m"] + args, environment=environment)
    (planned,) = plan_with([instance])["instances"]
    assert planned["pinned_bytes"] == budget
    if budget is None:
        assert planned["pinned_source"] is None and planned["limit_memlock"] == "infinity"
    else:
        # The source is named in the plan, and the unit may lock the budget plus the headroom.
        assert planned["pinned_source"] and planned["limit_memlock"] == budget + GIB


def test_a_declared_budget_wins_over_the_engine_options():
    instance = engine_worker("e", [0], "vllm", ["/usr/bin/vllm", "serve", "m", "--cpu-offload-gb", "10"], pinned="4G")
    (planned,) = plan_with([instance])["instances"]
    assert (planned["pinned_bytes"], planned["pinned_source"]) == (4 * GIB, "pinned")


def test_a_derived_budget_over_the_memory_is_refused_naming_the_option():
    instance = engine_worker("e", [0, 1], "vllm", ["/usr/bin/vllm", "serve", "m", "--cpu-offload-gb", "100"],
                             memory="64G")
    (problem,) = problems([instance])
    assert problem.startswith("gpunuma_instances[0].command: vLLM --cpu-offload-gb 100") and "200" in problem


def test_a_pool_whose_size_is_not_stated_is_said_unknown():
    instance = engine_worker("e", [0], "sglang", ["/usr/bin/sglang", "serve", "--enable-hierarchical-cache"])
    (planned,) = plan_with([instance])["instances"]
    assert planned["pinned_bytes"] is None
    assert any("pinned budget unknown" in w and "--hicache-ratio" in w for w in planned["warnings"])


def test_derived_budgets_count_on_the_node_like_declared_ones():
    """Two workers on one node deriving more than it holds for pinned pools: refused under strict_capacity error,
    naming both instances, as declared budgets are."""
    capacity = plan_with([worker()])["memory_capacity"]["0"]
    room = capacity - capacity * 10 // 100
    gib = (room // 2) // GIB + 1
    big = ["/usr/bin/vllm", "serve", "m", "--kv-offloading-size", str(gib)]
    instances = [engine_worker("w%d" % g, [g], "vllm", big, memory=gib * GIB) for g in (0, 1)]
    found = problems(instances, strict_capacity="error")
    assert len(found) == 1 and "exceeds" in found[0] and "never reclaimed" in found[0], found
