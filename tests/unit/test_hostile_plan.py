"""The planner over the hostile-input corpus: a clear error or a sound plan, in bounded time.

``tests/fixtures/hostile/plan/*.json`` each describe one hostile or damaged
planner input:

* ``topology``: a fixture name from ``tests/fixtures/topologies/``;
  ``damage``: ``[[path, value], ...]`` set into a copy of it (``value``
  null removes the key);
* ``profile``, ``instances``, ``options`` (``build_plan`` keywords) and
  ``applied_plan`` (the string ``"@fingerprint"`` inside it stands for the
  topology's fingerprint);
* ``expect``: ``error`` (a ``PlanError`` whose problems contain every
  string of ``needles``) or ``plan`` (a plan whose invariants hold and whose
  warnings contain every needle).

Never another exception, never a hang: each case runs under an alarm.
"""

import copy
import json
import os

import pytest

from ansible.module_utils.gpunuma.plan.profiles import load_profile
from conftest import FIXTURES, REPO_ROOT
from plan_invariants import check_deterministic, check_plan, plan_or_error

pytestmark = pytest.mark.unit

CORPUS = os.path.join(FIXTURES, "hostile", "plan")
PROFILES_DIR = os.path.join(REPO_ROOT, "policies", "profiles")


def _cases():
    for name in sorted(os.listdir(CORPUS)):
        if name.endswith(".json"):
            with open(os.path.join(CORPUS, name), encoding="utf-8") as handle:
                yield pytest.param(json.load(handle), id=name[: -len(".json")])


def _topology(case):
    with open(os.path.join(FIXTURES, "topologies", case["topology"] + ".json")) as handle:
        topology = json.load(handle)
    for path, value in case.get("damage", []):
        target = topology
        for key in path[:-1]:
            target = target[key]
        if value is None and isinstance(target, dict):
            target.pop(path[-1], None)
        else:
            target[path[-1]] = value
    return topology


def _with_fingerprint(value, fingerprint):
    if value == "@fingerprint":
        return fingerprint
    if isinstance(value, dict):
        return {k: _with_fingerprint(v, fingerprint) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_fingerprint(v, fingerprint) for v in value]
    return value


def test_corpus_is_there():
    assert len(list(_cases())) >= 40


@pytest.mark.parametrize("case", list(_cases()))
def test_hostile_plan_input(case):
    topology = _topology(case)
    profile = load_profile(case.get("profile", "strict"), PROFILES_DIR)
    instances = case["instances"]
    options = dict(case.get("options", {}))
    if "applied_plan" in case:
        options["applied_plan"] = _with_fingerprint(case["applied_plan"], topology.get("fingerprint"))
    outcome, result = plan_or_error(copy.deepcopy(topology), profile, copy.deepcopy(instances), **options)
    assert outcome == case["expect"], (case["description"], result)
    if outcome == "error":
        text = "\n".join(result.problems)
        for needle in case["needles"]:
            assert needle in text, (needle, result.problems)
        # the value is shown as the user wrote it, and what is allowed is said
        assert all("allowed" in p or p.startswith("internal error") for p in result.problems), result.problems
    else:
        check_plan(result, topology, instances)
        check_deterministic(result, topology, profile, instances, **options)
        for needle in case["needles"]:
            assert any(needle in w for w in result["warnings"]), (needle, result["warnings"])
