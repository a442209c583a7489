"""LimitMEMLOCK= is decided once, in the plan (plan/planner.unit_memlock): every instance carries ``limit_memlock``,
and the unit template and the policy gate read that value, never a default of their own."""

from __future__ import annotations

import datetime
import json
import os

import jinja2
import pytest
import yaml
from hypothesis import given, settings, strategies as st

from ansible.module_utils.gpunuma.gate import policy
from ansible.module_utils.gpunuma.plan.model import PlanError
from ansible.module_utils.gpunuma.plan.planner import build_plan
from ansible.module_utils.gpunuma.plan.profiles import load_profile
from conftest import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.unit

PROFILES = os.path.join(REPO_ROOT, "policies", "profiles")
RULES = {r["id"]: r for r in policy.load_rules(os.path.join(REPO_ROOT, "policies", "rules"), yaml.safe_load)}
with open(os.path.join(FIXTURES, "topologies", "hgx-h200-8gpu-2socket-ht.json"), encoding="utf-8") as _handle:
    HGX = json.load(_handle)
TEMPLATE = os.path.join(REPO_ROOT, "roles", "numa_binding", "templates", "instance.service.j2")
LIMITS = ["64G", "512M", "unlimited", "infinity", 1048576, "8k", "64GiB", "1.5G"]
SYSTEMD = {"64G": 68719476736, "512M": 536870912, "unlimited": "infinity", "infinity": "infinity", 1048576: 1048576,
           "8k": 8192, "64GiB": 68719476736, "1.5G": 1610612736}


def plan_with(instances, **options):
    options.setdefault("housekeeping_cores_per_node", 1)
    return build_plan(HGX, load_profile("strict", PROFILES), instances, **options)


def worker(name="w0", gpu=0, **extra):
    return dict({"name": name, "gpus": [gpu], "memory": "8G", "command": ["/usr/bin/vllm", "serve"]}, **extra)


@pytest.mark.parametrize("limit", LIMITS)
def test_the_default_is_written_as_limitmemlock_takes_it(limit):
    plan = plan_with([worker()], limit_memlock=limit)
    assert plan["instances"][0]["limit_memlock"] == SYSTEMD[limit]
    assert plan["options"]["limit_memlock"] == SYSTEMD[limit]


def test_an_instance_memlock_wins_over_the_default():
    plan = plan_with([worker(memlock="64G"), worker("w1", 1)], limit_memlock="4M")
    assert [i["limit_memlock"] for i in plan["instances"]] == [64 << 30, 4 << 20]
    assert [i["memlock"] for i in plan["instances"]] == [64 << 30, None]


def test_a_drop_in_keeps_the_vendor_limit_unless_the_instance_sets_one():
    dropins = [{"name": "svc", "unit": "vendor.service", "gpus": [0], "memory": "8G"},
               {"name": "own", "unit": "other.service", "gpus": [1], "memory": "8G", "memlock": "1G"}]
    plan = plan_with(dropins, limit_memlock="infinity")
    assert [(i["mode"], i["limit_memlock"]) for i in plan["instances"]] == [("dropin", None), ("dropin", 1 << 30)]
    # Nothing gpunuma writes makes the first unlimited, so the gate does not name it.
    assert _gate_names(plan) == []


def test_without_a_default_units_are_unlimited():
    assert plan_with([worker()])["instances"][0]["limit_memlock"] == "infinity"


@pytest.mark.parametrize("bad", ["lots", 0, "0", -1, True, "64 G B"])
def test_a_bad_default_is_named(bad):
    with pytest.raises(PlanError) as info:
        plan_with([worker()], limit_memlock=bad)
    assert any(p.startswith("limit_memlock") for p in info.value.problems), info.value.problems


def _unit_limit(item):
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    source = open(TEMPLATE, encoding="utf-8").read()
    line = next(l for l in source.splitlines() if l.startswith("LimitMEMLOCK="))
    return env.from_string(line).render(item=item).split("=", 1)[1]


def _gate_names(plan, allowed=()):
    ctx = policy.Context("gpu-a01", HGX, plan, {"memlock_limit": "4M", "memlock_users": [],
                                                "memlock_unlimited_services": list(allowed), "numa_balancing": 0}, None)
    results, _ = policy.evaluate([RULES["GN-LIM-001"]], ctx, [], [], datetime.date(2026, 12, 7))
    return sorted(v.split()[1] for v in results[0]["violations"])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([None] + LIMITS), min_size=1, max_size=4), st.sampled_from(LIMITS),
       st.sets(st.integers(0, 3)))
def test_units_and_gate_read_the_plans_value(own, default, allowed_index):
    instances = [worker("w%d" % i, i, **({} if m is None else {"memlock": m})) for i, m in enumerate(own)]
    plan = plan_with(instances, limit_memlock=default)
    allowed = ["w%d" % i for i in allowed_index if i < len(own)]
    for item, mine in zip(plan["instances"], own):
        decided = SYSTEMD[mine] if mine is not None else SYSTEMD[default]
        assert item["limit_memlock"] == decided
        # The unit file says what the plan decided.
        assert _unit_limit(item) == str(decided)
    # The gate names exactly the unlimited instances not allowed, by the plan's value.
    unlimited = sorted(i["name"] for i in plan["instances"] if i["limit_memlock"] == "infinity" and i["name"] not in allowed)
    assert _gate_names(plan, allowed) == unlimited


def test_no_template_or_task_spells_a_memlock_default():
    """The rule lives in the planner: no role task or template falls back to a default of its own."""
    found = []
    for base in ("roles/numa_binding", "playbooks"):
        for directory, _, files in os.walk(os.path.join(REPO_ROOT, base)):
            for name in files:
                if name.endswith((".yml", ".j2")) and "defaults" not in directory and "meta" not in directory:
                    text = open(os.path.join(directory, name), encoding="utf-8").read()
                    if "LimitMEMLOCK={{" in text and "LimitMEMLOCK={{ item.limit_memlock }}" not in text:
                        found.append(name)
                    if "memlock_systemd_limit" in text:
                        found.append(name)
    assert found == []
