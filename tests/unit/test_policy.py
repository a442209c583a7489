"""Policy rules as data: every shipped rule has a passing and a failing case;
waivers apply by host or group until they expire; bad files name the file and field."""

import copy
import datetime
import json
import os

import pytest
import yaml

from ansible.module_utils.gpunuma.gate import policy
from ansible.module_utils.gpunuma.gate import checks as policy_checks
from ansible.module_utils.gpunuma.plan.planner import build_plan
from ansible.module_utils.gpunuma.plan.profiles import load_profile
from conftest import REPO_ROOT, plant

pytestmark = pytest.mark.unit

RULES_DIR = os.path.join(REPO_ROOT, "policies", "rules")
RULES = {r["id"]: r for r in policy.load_rules(RULES_DIR, yaml.safe_load)}
TODAY = datetime.date(2026, 6, 1)

TOPO = {"numa_nodes": [
    {"id": 0, "cpus": "0-7", "has_cpus": True, "memory_free_bytes": 100 << 30, "cores": ["0,4", "1,5", "2,6", "3,7"]},
    {"id": 1, "cpus": "8-15", "has_cpus": True, "memory_free_bytes": 100 << 30,
     "cores": ["8,12", "9,13", "10,14", "11,15"]},
    {"id": 2, "cpus": "", "has_cpus": False, "memory_free_bytes": 90 << 30, "cores": []},
]}


def inst(name="llm0", **kw):
    item = {"name": name, "unit": "gpunuma-%s.service" % name, "numa_nodes": [0], "cpus": "1-3,5-7",
            "mem_policy": "bind", "mem_nodes": [0], "memory_bytes": 10 << 30, "memlock": None, "limit_memlock": 4 << 20,
            "share_cpus": False}
    item.update(kw)
    return item


def plan(*instances, profile="strict", housekeeping=None, hk_cores=1, capacity=None):
    return {"profile": profile, "options": {"housekeeping_cores_per_node": hk_cores},
            "housekeeping": housekeeping if housekeeping is not None else {"0": "0,4", "1": "8,12"},
            "memory_capacity": capacity if capacity is not None else {"0": 96 << 30, "1": 96 << 30},
            "instances": list(instances)}


SETTINGS = {"memlock_limit": "4M", "memlock_users": ["svc"], "numa_balancing": 0}


def status(rule_id, the_plan, settings=None, topology=TOPO, live=None):
    ctx = policy.Context("gpu-a01", topology, the_plan, dict(SETTINGS, **(settings or {})), live)
    results, _ = policy.evaluate([RULES[rule_id]], ctx, [], [], TODAY)
    return results[0]["status"], results[0]["violations"]


KUBELET = {"enabled": True, "topology_manager_policy": "single-numa-node"}

CASES = {
    "GN-MEM-001": (
        (plan(inst()), {}),
        (plan(inst(memory_bytes=60 << 30), inst("llm1", memory_bytes=60 << 30)), {}),
    ),
    "GN-LIM-001": (
        (plan(inst()), {}),
        (plan(inst(limit_memlock="infinity")), {}),
    ),
    "GN-NB-001": (
        (plan(inst()), {}),
        (plan(inst()), {"numa_balancing": 1}),
    ),
    "GN-CPU-001": (
        (plan(inst()), {}),
        (plan(inst(numa_nodes=[2])), {}),
    ),
    "GN-SPAN-001": (
        (plan(inst(numa_nodes=[0, 1], mem_policy="interleave", mem_nodes=[0, 1])), {}),
        (plan(inst(numa_nodes=[0, 1])), {}),
    ),
    "GN-K8S-001": (
        (plan(inst()), {"kubelet": KUBELET}),
        (plan(inst()), {"kubelet": dict(KUBELET, max_allowable_numa_nodes=2)}),
    ),
    "GN-K8S-002": (
        (plan(inst()), {"kubelet": KUBELET}),
        (plan(inst()), {"kubelet": dict(KUBELET, topology_manager_policy="none")}),
    ),
    "GN-HK-001": (
        (plan(inst()), {}),
        (plan(inst(), housekeeping={"0": "0", "1": "8,12"}), {}),
    ),
}


def test_housekeeping_auto_is_checked_not_compared_as_a_number():
    # auto may keep housekeeping on some nodes only (GPU-less nodes first); whole cores still required.
    assert status("GN-HK-001", plan(inst(), hk_cores="auto"), {}) == ("pass", [])
    assert status("GN-HK-001", plan(inst(), hk_cores="auto", housekeeping={"0": "0,4", "1": ""}), {}) == ("pass", [])
    state, problems = status("GN-HK-001", plan(inst(), hk_cores="auto", housekeeping={"0": "0", "1": ""}), {})
    assert state != "pass" and any("split core" in p for p in problems), problems
    state, problems = status("GN-HK-001", plan(inst(), hk_cores="auto", housekeeping={"0": "", "1": ""}), {})
    assert state != "pass" and any("no housekeeping CPUs on any node" in p for p in problems), problems


def test_membind_capacity_is_the_plans_not_free_memory():
    # Page cache filled the node (MemFree near zero): what it holds for instances is unchanged.
    cached = {"numa_nodes": [dict(n, memory_free_bytes=64 << 20) for n in TOPO["numa_nodes"]]}
    assert status("GN-MEM-001", plan(inst(memory_bytes=90 << 30)), {}, topology=cached) == ("pass", [])
    state, problems = status("GN-MEM-001", plan(inst(memory_bytes=90 << 30), capacity={"0": 80 << 30}), {})
    assert state == "fail" and problems == [
        "instances llm0 declare %d bytes under membind on node 0, which holds %d bytes for instances"
        % (90 << 30, 80 << 30)]
    # A node of unknown size (offline topology) is not judged, as the planner binds there with a warning.
    assert status("GN-MEM-001", plan(inst(memory_bytes=90 << 30), capacity={"0": None, "1": None}), {}) == (
        "pass", [])


def test_membind_gate_reaches_the_planners_verdict_on_its_plans():
    """Whatever the planner binds, the gate passes; a node shrunk below what is bound there, the gate refuses."""
    with open(os.path.join(REPO_ROOT, "tests", "fixtures", "topologies", "hgx-h200-8gpu-2socket-ht.json")) as handle:
        base = json.load(handle)
    profile = load_profile("strict", os.path.join(REPO_ROOT, "policies", "profiles"))
    for total_gib, unknown in ((64, False), (256, False), (0, True)):
        topology = copy.deepcopy(base)
        for node in topology["numa_nodes"]:
            node["memory_total_bytes"] = None if unknown else total_gib << 30
        for memory in ("8G", "40G", "56G", "200G"):
            instances = [{"name": "a", "gpus": [0], "memory": memory, "command": ["/bin/true"]},
                         {"name": "b", "gpus": [1], "memory": memory, "command": ["/bin/true"]}]
            made = build_plan(topology, profile, instances, strict_capacity="fallback")
            verdict = status("GN-MEM-001", made, {}, topology=topology)
            bound = [i for i in made["instances"] if i["mem_policy"] == "bind"]
            assert verdict == (("pass", []) if bound else ("not_applicable", [])), (total_gib, memory, verdict)
            assert bound or not unknown  # an unknown size binds (with the planner's warning)
            if bound and not unknown:
                node = str(bound[0]["mem_nodes"][0])
                shrunk = dict(made, memory_capacity=dict(made["memory_capacity"], **{node: bound[0]["memory_bytes"] - 1}))
                assert status("GN-MEM-001", shrunk, {}, topology=topology)[0] == "fail", (total_gib, memory)


def test_every_shipped_rule_has_cases():
    assert sorted(CASES) == sorted(RULES)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_passes(rule_id):
    the_plan, settings = CASES[rule_id][0]
    assert status(rule_id, the_plan, settings) == ("pass", [])


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_fails(rule_id):
    the_plan, settings = CASES[rule_id][1]
    state, violations = status(rule_id, the_plan, settings)
    assert state == "fail" and violations


def test_kubelet_rules_do_not_apply_without_kubelet():
    assert status("GN-K8S-002", plan(inst()))[0] == "not_applicable"


def test_numa_balancing_left_alone_is_checked_only_live():
    assert status("GN-NB-001", plan(inst()), {"numa_balancing": None})[0] == "not_applicable"
    live = {"numa_balancing": {"live": "1", "file": None}, "instances": []}
    assert status("GN-NB-001", plan(inst()), {"numa_balancing": None}, live=live)[0] == "fail"


@pytest.mark.parametrize("release", ["6.1.0-28-amd64", "5.12.0"])
def test_numa_balancing_auto_on_5_12_or_later_is_no_violation(release):
    # Bound instances are neither scanned nor migrated there: auto leaves the node alone, live 1 included.
    live = {"numa_balancing": {"live": "1", "file": None, "kernel_release": release}, "instances": []}
    assert status("GN-NB-001", plan(inst()), {"numa_balancing": "auto"}, live=live) == ("pass", [])
    assert status("GN-NB-001", plan(inst()), {"numa_balancing": "auto", "kernel_release": release}) == ("pass", [])


@pytest.mark.parametrize("release", ["5.4.0-1234-aws", "4.18.0-553.el8_10.x86_64", None, "garbage"])
def test_numa_balancing_auto_before_5_12_or_unknown_is_checked_as_0(release):
    settings = {"numa_balancing": "auto", "kernel_release": release}
    # Before a change with no release known, auto is decided on the node (the audit checks it).
    assert status("GN-NB-001", plan(inst()), settings) == (("pass", []) if release else ("not_applicable", []))
    # auto wrote 0 there: gpunuma's file saying 1 is a violation, its absence is not.
    live = {"numa_balancing": {"live": "1", "file": "1", "kernel_release": release}, "instances": []}
    state, problems = status("GN-NB-001", plan(inst()), {"numa_balancing": "auto"}, live=live)
    assert state == "fail" and problems == ["the node's sysctl file sets kernel.numa_balancing = 1"]
    live = {"numa_balancing": {"live": "0", "file": None}, "instances": []}
    assert status("GN-NB-001", plan(inst()), {"numa_balancing": "auto"}, live=live) == ("pass", [])


@pytest.mark.parametrize("release", [None, ""])
def test_numa_balancing_auto_at_the_gate_without_a_release_is_decided_on_the_node(release):
    # site.yml's gate runs before the autonuma role reads the node: no violation, not even a pass.
    settings = {"numa_balancing": "auto", "kernel_release": release}
    assert status("GN-NB-001", plan(inst()), settings) == ("not_applicable", [])
    assert status("GN-NB-001", plan(inst()), {"numa_balancing": "auto"}) == ("not_applicable", [])
    # The audit's report carries the release it read: the same setting is judged there.
    live = {"numa_balancing": {"live": "1", "file": "1", "kernel_release": "5.10.0-30-amd64"}, "instances": []}
    state, problems = status("GN-NB-001", plan(inst()), settings, live=live)
    assert state == "fail" and problems == ["the node's sysctl file sets kernel.numa_balancing = 1"]
    live["numa_balancing"]["kernel_release"] = "6.12.9"
    assert status("GN-NB-001", plan(inst()), settings, live=live) == ("pass", [])


@pytest.mark.parametrize("setting,expected", [("0", ("pass", [])), (" 1 ", ("fail", [
    "instances llm0 use membind but autonuma_numa_balancing is 1, not 0"]))])
def test_numa_balancing_given_as_text_is_the_number(setting, expected):
    assert status("GN-NB-001", plan(inst()), {"numa_balancing": setting}) == expected


def test_numa_balancing_explicit_values_keep_their_meaning_on_new_kernels():
    settings = {"numa_balancing": 1, "kernel_release": "6.8.0"}
    state, problems = status("GN-NB-001", plan(inst()), settings)
    assert state == "fail" and problems == ["instances llm0 use membind but autonuma_numa_balancing is 1, not 0"]
    live = {"numa_balancing": {"live": "1", "file": None, "kernel_release": "6.8.0"}, "instances": []}
    assert status("GN-NB-001", plan(inst()), {"numa_balancing": None}, live=live)[0] == "fail"
    assert status("GN-NB-001", plan(inst(mem_policy="interleave")), {"numa_balancing": "auto"})[0] == "not_applicable"


def test_live_numa_balancing_file_is_checked():
    live = {"numa_balancing": {"file": "1"}, "instances": []}
    assert status("GN-NB-001", plan(inst()), live=live)[0] == "fail"


def waiver(**kw):
    w = {"control": "GN-SPAN-001", "hosts": ["gpu-a01"], "justification": "measured", "owner": "alice",
         "expires": "2026-12-31"}
    w.update(kw)
    return w


def evaluate_span(waivers, groups=()):
    ws = policy.validate_waivers(waivers, set(RULES))
    ctx = policy.Context("gpu-a01", TOPO, plan(inst(numa_nodes=[0, 1])), SETTINGS)
    results, expired = policy.evaluate([RULES["GN-SPAN-001"]], ctx, ws, list(groups), TODAY)
    return results[0], expired


def test_waiver_by_host_and_group():
    result, _ = evaluate_span([waiver()])
    assert result["status"] == "waived" and result["waiver"]["owner"] == "alice"
    result, _ = evaluate_span([waiver(hosts=[], groups=["h100"])], groups=["h100"])
    assert result["status"] == "waived"
    result, _ = evaluate_span([waiver(hosts=["other"])])
    assert result["status"] == "fail"


def test_expired_waiver_no_longer_applies_and_is_reported():
    result, expired = evaluate_span([waiver(expires=datetime.date(2026, 1, 1))])
    assert result["status"] == "fail" and expired[0]["control"] == "GN-SPAN-001" and expired[0]["expires"] == "2026-01-01"


@pytest.mark.parametrize("bad, needle", [
    ({"control": "GN-NOPE-001"}, "gpunuma_policy_waivers[0].control: 'GN-NOPE-001' is not a known control id"),
    ({"expires": "next year"}, "gpunuma_policy_waivers[0].expires: 'next year' is not a date"),
    ({"expires": "2026-02-30"}, "is not a date"),
    ({"justification": ""}, "gpunuma_policy_waivers[0].justification"),
    ({"hosts": [], "groups": []}, "names no hosts or groups"),
    ({"color": "red"}, "gpunuma_policy_waivers[0].color: unknown field"),
])
def test_bad_waivers_name_the_field(bad, needle):
    with pytest.raises(policy_checks.PolicyError) as err:
        policy.validate_waivers([waiver(**bad)], set(RULES))
    assert needle in str(err.value)


def test_waivers_must_be_a_list():
    with pytest.raises(policy_checks.PolicyError):
        policy.validate_waivers({"control": "x"}, set(RULES))


@pytest.mark.parametrize("text, needle", [
    ("id: GN-X-1\ntitle: t\nseverity: fatal\nrationale: r\nsource: https://x\ncheck: no_span_without_interleave\n",
     "severity: 'fatal' is not allowed"),
    ("id: gn-x\ntitle: t\nseverity: error\nrationale: r\nsource: https://x\ncheck: no_span_without_interleave\n",
     "id: 'gn-x' is not a control id"),
    ("id: GN-X-1\ntitle: t\nseverity: error\nrationale: r\nsource: https://x\ncheck: magic\n", "check: 'magic'"),
    ("id: GN-X-1\ntitle: t\nseverity: error\nsource: https://x\ncheck: no_span_without_interleave\n",
     "rationale: missing"),
    ("id: GN-X-1\ntitle: t\nseverity: error\nrationale: r\nsource: my head\ncheck: no_span_without_interleave\n",
     "source: 'my head'"),
    ("id: [unclosed\n", "cannot be read as YAML"),
    ("- a list\n", "a rule must be a mapping"),
])
def test_bad_rule_files_name_the_file_and_field(tmp_path, text, needle):
    (tmp_path / "bad.yml").write_text(text)
    with pytest.raises(policy_checks.PolicyError) as err:
        policy.load_rules(str(tmp_path), yaml.safe_load)
    assert str(tmp_path / "bad.yml") in str(err.value) and needle in str(err.value)


def test_duplicate_ids_are_refused(tmp_path):
    text = "id: GN-X-1\ntitle: t\nseverity: error\nrationale: r\nsource: https://x\ncheck: no_span_without_interleave\n"
    (tmp_path / "a.yml").write_text(text)
    (tmp_path / "b.yml").write_text(text)
    with pytest.raises(policy_checks.PolicyError) as err:
        policy.load_rules(str(tmp_path), yaml.safe_load)
    assert "already used" in str(err.value)


@pytest.mark.parametrize("kind", ["fifo", "huge"])
def test_a_rule_file_that_is_no_page_of_yaml_is_named_never_read_to_its_end(tmp_path, kind):
    path = tmp_path / "GN-X-001.yml"
    plant(path, kind, policy.MAX_RULE_BYTES)
    with pytest.raises(policy_checks.PolicyError) as caught:
        policy.load_rules(str(tmp_path), yaml.safe_load)
    assert "%s: cannot be read as YAML" % path in str(caught.value)
