"""Policy, waiver, kubelet-setting and validation-policy input of the wrong type.

* The corpus ``tests/fixtures/hostile/policy/cases.json``: each case is
  refused with a message naming the field and what is allowed.
* A sweep over every field of every shipped document (the rule files, the
  validation policy, a waiver, the kubelet settings): each field replaced by
  a value of every other YAML type, or by its own text with a newline, gives
  a result or a named policy error, never another exception.
"""

import copy
import datetime
import glob
import json
import os
import shutil

import pytest
import yaml

from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.gate import policy
from ansible.module_utils.gpunuma.gate import checks as policy_checks
from ansible.module_utils.gpunuma.verify.h2d import policy as h2d_policy
from conftest import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.unit

CASES = json.load(open(os.path.join(FIXTURES, "hostile", "policy", "cases.json")))["cases"]
RULE_FILES = sorted(glob.glob(os.path.join(REPO_ROOT, "policies", "rules", "*.yml")))
RULE_IDS = {os.path.basename(p)[:-4] for p in RULE_FILES}
VALIDATION = os.path.join(REPO_ROOT, "policies", "validation", "h2d.yml")
WAIVER = {"control": "GN-SPAN-001", "hosts": ["gpu-a"], "groups": ["rack1"], "justification": "a reason",
          "owner": "sre", "expires": "2027-01-01"}
KUBELET = {"enabled": True, "topology_manager_policy": "restricted", "max_allowable_numa_nodes": 8}
CONFUSERS = [["x"], {"x": 1}, "two", "8", 8, -1, 2.5, True, None, ""]


def load(kind, value, tmp_path):
    """Run the reader of ``kind`` on ``value``; what it returns."""
    if kind == "rule" and not isinstance(value, str):
        return policy.validate_rule(value, "rule.yml")  # what load_rules does with each file's YAML
    if kind == "rule":
        rules = tmp_path / "rules"
        shutil.rmtree(str(rules), ignore_errors=True)
        rules.mkdir()
        (rules / "rule.yml").write_text(value)
        return policy.load_rules(str(rules), yaml.safe_load)
    if kind == "waivers":
        return policy.validate_waivers(value, RULE_IDS)
    if kind == "kubelet":
        return policy_checks.validate_kubelet(value)
    if kind == "validation":
        return h2d_policy.load_policy(value, "h2d.yml")
    raise AssertionError(kind)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_hostile_policy_input_is_refused_naming_the_field(case, tmp_path):
    with pytest.raises(GpunumaError) as info:
        load(case["kind"], case.get("text", case.get("data")), tmp_path)
    message = str(info.value)
    for needle in case["expect"]:
        assert needle in message, (needle, message)
    assert "Traceback" not in message and "<class" not in message


def test_every_corpus_kind_is_used():
    assert {c["kind"] for c in CASES} == {"rule", "waivers", "kubelet", "validation"}
    assert len({c["name"] for c in CASES}) == len(CASES)


def paths(doc, prefix=()):
    """Every (path) to a value inside ``doc``: mapping keys and list indexes."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        out.append(prefix + (key,))
        out.extend(paths(value, prefix + (key,)))
    return out


def replaced(doc, path, value):
    out = copy.deepcopy(doc)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


def documents():
    for path in RULE_FILES:
        yield "rule", os.path.basename(path), yaml.safe_load(open(path))
    yield "validation", "h2d.yml", yaml.safe_load(open(VALIDATION))
    yield "waivers", "waiver", [WAIVER]
    yield "kubelet", "kubelet", KUBELET


def sweep():
    for kind, name, doc in documents():
        for path in paths(doc):
            original = doc
            for key in path:
                original = original[key]
            values = [v for v in CONFUSERS if type(v) is not type(original) or v != original]
            if isinstance(original, str):
                values.append(original + "\n")
            for value in values:
                yield kind, name, doc, path, value


SWEEP = list(sweep())


def test_the_sweep_reaches_every_document():
    names = {name for _, name, _, _, _ in SWEEP}
    assert names >= {os.path.basename(p) for p in RULE_FILES} | {"h2d.yml", "waiver", "kubelet"}
    assert len(SWEEP) > 300


@pytest.mark.parametrize("kind", ["rule", "validation", "waivers", "kubelet"])
def test_any_field_of_the_wrong_type_is_a_named_error_never_a_traceback(kind, tmp_path):
    failures, refused = [], 0
    for kind_, name, doc, path, value in SWEEP:
        if kind_ != kind:
            continue
        try:
            load(kind, replaced(doc, path, value), tmp_path)
        except GpunumaError as exc:
            refused += 1
            if "Traceback" in str(exc) or not str(exc).strip():
                failures.append((name, path, value, str(exc)))
        except Exception as exc:  # the defect this test exists for
            failures.append((name, path, value, "%s: %s" % (type(exc).__name__, exc)))
    assert not failures, failures[:10]
    assert refused, "no replacement was refused: the sweep did not reach the readers"


@pytest.mark.parametrize("field", ["id", "check", "severity"])
def test_rule_fields_with_a_trailing_newline_are_refused(field, tmp_path):
    doc = yaml.safe_load(open(os.path.join(REPO_ROOT, "policies", "rules", "GN-SPAN-001.yml")))
    doc[field] = doc[field] + "\n"
    with pytest.raises(policy_checks.PolicyError) as info:
        load("rule", doc, tmp_path)
    assert "%s:" % field in str(info.value)


def test_checked_kubelet_settings_reach_the_rules():
    ctx = policy.Context("gpu-a", {"numa_nodes": [{"id": n} for n in range(9)]}, {"profile": "strict"},
                         {"kubelet": policy_checks.validate_kubelet(dict(KUBELET, max_allowable_numa_nodes=16))})
    rules = policy.load_rules(os.path.join(REPO_ROOT, "policies", "rules"), yaml.safe_load)
    results, _ = policy.evaluate(rules, ctx, [], [], datetime.date(2026, 6, 1))
    [limit] = [r for r in results if r["id"] == "GN-K8S-001"]
    assert limit["status"] == "pass"
    ctx.settings["kubelet"] = policy_checks.validate_kubelet(KUBELET)
    results, _ = policy.evaluate(rules, ctx, [], [], datetime.date(2026, 6, 1))
    [limit] = [r for r in results if r["id"] == "GN-K8S-001"]
    assert limit["status"] == "fail" and "9 NUMA nodes" in limit["violations"][0]
