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
