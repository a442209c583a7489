"""Validation report and fleet table, replaying the probe recorded on a real H200."""

import copy
import json
import os

import pytest
import yaml

from ansible.module_utils.gpunuma.verify.h2d import report as h2d_report
from ansible.module_utils.gpunuma.verify.h2d import policy as h2d_policy
from conftest import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.unit

RECORDED = os.path.join(FIXTURES, "recorded", "h200-probe", "run2", "h2d-probe.json")
POLICY_FILE = os.path.join(REPO_ROOT, "policies", "validation", "h2d.yml")


@pytest.fixture
def probe():
    with open(RECORDED) as fh:
        return json.load(fh)


@pytest.fixture
def policy():
    with open(POLICY_FILE) as fh:
        return h2d_policy.load_policy(yaml.safe_load(fh), POLICY_FILE)


# Round-to-round jitter of a quiet node: bandwidth within 0.6 %, p99 within 5 %.
BW_JITTER = (0.997, 1.004, 0.999, 1.006, 0.995, 1.002, 1.0, 0.998)
P99_JITTER = (1.03, 0.97, 1.0, 1.05, 0.96, 1.01, 0.99, 1.02)


def with_rounds(place, gbps, p99, rounds, shift=0):
    place["rounds"] = [{"h2d_pinned_gbps": round(gbps * BW_JITTER[(i + shift) % 8], 3),
                        "small_p99_us": round(p99 * P99_JITTER[(i + shift) % 8], 3),
                        "small_p50_us": 4.6} for i in range(rounds)]


def two_node(probe, local_gbps=55.4, remote_gbps=48.0, local_p99=5.8, remote_p99=7.9, unbound_gbps=None, unbound_p99=None,
             rounds=0):
    """The recorded GPU as if on a two-socket host: a remote placement derived from the local one.

    ``rounds``: per-round figures around the given values (a quiet node's jitter), as the probe writes them.
    """
    p = copy.deepcopy(probe)
    gpu = p["gpus"][0]
    local = gpu["placements"]["local"]
    remote = copy.deepcopy(local)
    remote["node"] = 1
    remote["binding"]["mempolicy_nodes"] = [1]
    gpu["remote_node"] = 1
    gpu["placements"]["remote"] = remote
    local["measurement"]["h2d_pinned"]["gbps_median"] = local_gbps
    local["measurement"]["small_h2d_pinned"]["us_p99"] = local_p99
    remote["measurement"]["h2d_pinned"]["gbps_median"] = remote_gbps
    remote["measurement"]["small_h2d_pinned"]["us_p99"] = remote_p99
    unbound = gpu["placements"]["unbound"]["measurement"]
    if unbound_gbps is not None:
        unbound["h2d_pinned"]["gbps_median"] = unbound_gbps
    if unbound_p99 is not None:
        unbound["small_h2d_pinned"]["us_p99"] = unbound_p99
    if rounds:
        with_rounds(local, local_gbps, local_p99, rounds)
        with_rounds(remote, remote_gbps, remote_p99, rounds, shift=3)
        with_rounds(gpu["placements"]["unbound"], unbound["h2d_pinned"]["gbps_median"],
                    unbound["small_h2d_pinned"]["us_p99"], rounds, shift=5)
    return p


def hurt_before(report):
    """A previous report of the same host whose every GPU said binding hurts."""
    previous = copy.deepcopy(report)
    for gpu in previous["gpus"]:
        gpu["verdict"] = "binding hurts"
    return previous


def controls(report, gpu=0):
    return {c["id"]: c for c in report["gpus"][gpu]["controls"]}


def test_recorded_h200_report(probe, policy):
    report = h2d_report.build_report(probe, policy, profile="strict", generated_at="2026-12-01T03:15:00Z")
    assert report["schema"] == "gpunuma.validation/v1" and report["status"] == "passed"
    gpu = report["gpus"][0]
    assert gpu["uuid"] == "GPU-17feaaa1-be79-190b-6694-75d1b3c48504"
    assert gpu["link"] == {"gen": 5, "width": 16, "source": "nvml", "theoretical_gbps": 63.015, "theoretical_raw_gbps": 64.0}
    local = gpu["placements"]["local"]
    assert local["h2d_pinned_gbps"] == 55.446 and local["link_fraction"] == round(55.446 / 63.015, 4)
    assert local["h2d_pageable_gbps"] == 8.647  # pageable reported on its own
    assert gpu["placements"]["remote"]["status"] == "skipped"
    c = controls(report)
    assert c["gpunuma-h2d-01"]["status"] == "pass"
    assert "pageable copies are not counted" in c["gpunuma-h2d-01"]["detail"]
    assert c["gpunuma-h2d-02"]["status"] == "not_applicable"
    assert "no other CPU-bearing NUMA node" in c["gpunuma-h2d-02"]["detail"]
    assert c["gpunuma-h2d-03"]["status"] == "pass" and c["gpunuma-h2d-04"]["status"] == "pass"
    # One sample per placement: no verdict is drawn from it.
    assert gpu["verdict"] == "no measurable difference"
    assert "1 round(s) per placement cannot show a difference at alpha 0.05" in gpu["verdict_reason"]


def test_the_cost_of_pinning_is_carried_per_placement(probe, policy):
    p = copy.deepcopy(probe)
    local = p["gpus"][0]["placements"]["local"]["measurement"]
    # A probe from before pinning was timed: not measured, never a crash.
    assert "pinning" not in local
    before = h2d_report.build_report(p, policy)["gpus"][0]["placements"]["local"]
    assert before["pin_alloc_s_per_gib"] is None and before["pin_register_s_per_gib"] is None
    local["pinning"] = {"bytes": 1 << 28, "host_alloc": {"seconds": 0.0625, "s_per_gib": 0.25},
                        "register": {"error": "cuMemHostRegister failed with CUDA_ERROR_OUT_OF_MEMORY (2)"}}
    after = h2d_report.build_report(p, policy)["gpus"][0]["placements"]["local"]
    assert after["pin_alloc_s_per_gib"] == 0.25 and after["pin_register_s_per_gib"] is None
    local["pinning"]["host_alloc"] = "fast"
    assert h2d_report.build_report(p, policy)["gpus"][0]["placements"]["local"]["pin_alloc_s_per_gib"] is None


def test_link_fraction_uses_pinned_never_pageable(probe, policy):
    p = copy.deepcopy(probe)
    for place in p["gpus"][0]["placements"].values():
        if place["status"] == "ok":
            place["measurement"]["h2d_pinned"]["gbps_median"] = 40.0  # 63% of the link
            place["measurement"]["h2d_pageable"]["gbps_median"] = 60.0
    c = controls(h2d_report.build_report(p, policy))
    assert c["gpunuma-h2d-01"]["status"] == "fail"
    assert "reached 63.5% of the 63.0 GB/s link" in c["gpunuma-h2d-01"]["detail"]


def test_binding_pays_on_two_nodes(probe, policy):
    report = h2d_report.build_report(two_node(probe, unbound_gbps=50.0, unbound_p99=7.0, rounds=6), policy,
                                     profile="strict")
    gpu = report["gpus"][0]
    assert gpu["verdict"] == "binding pays" and gpu["suggested_rollback"] is None
    assert "bound beats unbound and remote beyond the tolerance at alpha 0.05" in gpu["verdict_reason"]
    assert gpu["comparisons"]["remote"]["bandwidth"]["outcome"] == "better"
    assert gpu["comparisons"]["remote"]["bandwidth"]["p"] < 0.05
    assert len(gpu["placements"]["local"]["rounds"]) == 6
    assert controls(report)["gpunuma-h2d-02"]["status"] == "pass"


def test_one_sample_never_gives_a_verdict(probe, policy):
    """The same gap as above, one sample per placement: a single batch cannot tell it from noise."""
    report = h2d_report.build_report(two_node(probe, unbound_gbps=50.0, unbound_p99=7.0), policy, profile="strict")
    assert report["gpus"][0]["verdict"] == "no measurable difference"
    assert report["gpus"][0]["suggested_rollback"] is None


def test_binding_hurts_twice_suggests_next_rung(probe, policy):
    hurting = two_node(probe, local_gbps=45.0, remote_gbps=55.0, local_p99=9.0, remote_p99=5.0,
                       unbound_gbps=55.0, unbound_p99=5.5, rounds=6)
    first = h2d_report.build_report(hurting, policy, profile="strict")
    gpu = first["gpus"][0]
    # One run never advises a rollback.
    assert gpu["verdict"] == "binding hurts" and gpu["suggested_rollback"] is None
    assert "no rollback is suggested yet: validate again" in gpu["verdict_reason"]
    second = h2d_report.build_report(hurting, policy, profile="strict", previous=first)
    gpu = second["gpus"][0]
    assert gpu["verdict"] == "binding hurts" and gpu["suggested_rollback"] == "preferred"
    assert controls(second)["gpunuma-h2d-02"]["status"] == "fail" and second["status"] == "failed"
    table = "\n".join(h2d_report.fleet_table([second]))
    assert "binding hurts (roll back to preferred)" in table and "fail: gpunuma-h2d-01,gpunuma-h2d-02" in table


def test_hurts_after_a_different_verdict_suggests_nothing(probe, policy):
    hurting = two_node(probe, local_gbps=45.0, remote_gbps=55.0, remote_p99=5.8, unbound_gbps=55.0, unbound_p99=5.8, rounds=6)
    before = h2d_report.build_report(two_node(probe, rounds=6), policy, profile="strict")
    assert before["gpus"][0]["verdict"] != "binding hurts"
    report = h2d_report.build_report(hurting, policy, profile="strict", previous=before)
    assert report["gpus"][0]["verdict"] == "binding hurts" and report["gpus"][0]["suggested_rollback"] is None


def test_hurts_at_bottom_of_ladder_has_no_rung(probe, policy):
    hurting = two_node(probe, local_gbps=45.0, remote_gbps=55.0, remote_p99=5.8, unbound_gbps=55.0, unbound_p99=5.8, rounds=6)
    first = h2d_report.build_report(hurting, policy, profile="off")
    report = h2d_report.build_report(hurting, policy, profile="off", previous=hurt_before(first))
    assert report["gpus"][0]["verdict"] == "binding hurts" and report["gpus"][0]["suggested_rollback"] is None


def test_within_tolerance_is_neutral(probe, policy):
    report = h2d_report.build_report(two_node(probe, local_gbps=55.4, remote_gbps=55.0, local_p99=5.8, remote_p99=5.9,
                                              rounds=6), policy)
    assert report["gpus"][0]["verdict"] == "no measurable difference"


def test_better_on_one_metric_worse_on_the_other_is_inconclusive(probe, policy):
    report = h2d_report.build_report(two_node(probe, local_gbps=55.4, remote_gbps=48.0, local_p99=9.0, remote_p99=5.0,
                                              unbound_gbps=55.4, unbound_p99=9.0, rounds=6), policy)
    assert report["gpus"][0]["verdict"] == "inconclusive"
    assert "better on one metric and worse on the other" in report["gpus"][0]["verdict_reason"]


def test_rounds_that_disagree_are_inconclusive(probe, policy):
    p = two_node(probe, unbound_gbps=50.0, unbound_p99=7.0, rounds=6)
    p["gpus"][0]["placements"]["local"]["rounds"][2]["h2d_pinned_gbps"] = 30.0  # a busy round
    gpu = h2d_report.build_report(p, policy)["gpus"][0]
    assert gpu["verdict"] == "inconclusive" and "the node was not quiet" in gpu["verdict_reason"]


def test_verdict_settings_default_and_are_checked(policy):
    assert policy["verdict"]["alpha"] == 0.05 and policy["verdict"]["max_round_spread"] == 0.25
    with open(POLICY_FILE) as fh:
        data = yaml.safe_load(fh)
    data["verdict"]["alpha"] = 0.9
    with pytest.raises(h2d_policy.PolicyError, match=r"verdict.alpha is 0.9; it must be a number from 0.001 to 0.5"):
        h2d_policy.load_policy(data, POLICY_FILE)


def test_unverified_binding_fails(probe, policy):
    p = copy.deepcopy(probe)
    p["gpus"][0]["placements"]["local"]["binding"]["pages_verified"] = False
    c = controls(h2d_report.build_report(p, policy))
    assert c["gpunuma-h2d-03"]["status"] == "fail" and "local" in c["gpunuma-h2d-03"]["detail"]


def test_waiver_with_justification(probe):
    raw = yaml.safe_load(open(POLICY_FILE))
    raw["controls"][0]["min_fraction"] = 0.95
    raw["waivers"] = [{"control": "gpunuma-h2d-01", "hosts": ["vm"], "justification": "Gen5 riser swap pending, ticket 77"}]
    report = h2d_report.build_report(probe, h2d_policy.load_policy(raw))
    c = controls(report)
    assert c["gpunuma-h2d-01"]["status"] == "waived" and "ticket 77" in c["gpunuma-h2d-01"]["detail"]
    assert report["status"] == "passed" and report["summary"]["waived"] == 1
    other = h2d_report.build_report(probe, h2d_policy.load_policy(raw), hostname="gpu-b")
    assert controls(other)["gpunuma-h2d-01"]["status"] == "fail"


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(schema="v0"), "schema is 'v0'; allowed: gpunuma.validation-policy/v1"),
    (lambda d: d["controls"][0].update(min_fraction=1.5), "controls[0].min_fraction is 1.5; it must be a number from 0.0 to 1.0"),
    (lambda d: d["controls"][0].update(min_fraction="0.8"), "controls[0].min_fraction is '0.8'"),
    (lambda d: d["controls"][1].update(check="faster"), "controls[1].check is 'faster'; allowed:"),
    (lambda d: d["controls"][2].update(id="Bad ID"), "controls[2].id is 'Bad ID'"),
    (lambda d: d["controls"][3].update(id="gpunuma-h2d-01"), "controls[3].id 'gpunuma-h2d-01' is used twice"),
    (lambda d: d["controls"][0].update(tolerance=0.1), "controls[0] has unknown key 'tolerance'"),
    (lambda d: d["verdict"].pop("latency_tolerance"), "verdict.latency_tolerance is None"),
    (lambda d: d.update(waivers=[{"control": "gpunuma-h2d-09", "justification": "long enough text"}]),
     "waivers[0].control is 'gpunuma-h2d-09'; allowed: a control id"),
    (lambda d: d.update(waivers=[{"control": "gpunuma-h2d-01", "justification": "no"}]), "waivers[0].justification is 'no'"),
    (lambda d: d.update(controls=[]), "controls is []"),
])
def test_bad_policy_is_named(mutate, message):
    raw = yaml.safe_load(open(POLICY_FILE))
    mutate(raw)
    with pytest.raises(h2d_policy.PolicyError) as err:
        h2d_policy.load_policy(raw, "h2d.yml")
    assert message in str(err.value) and "h2d.yml" in str(err.value)


def test_policy_not_a_mapping():
    with pytest.raises(h2d_policy.PolicyError, match="the policy must be a mapping"):
        h2d_policy.load_policy(["x"])


def test_not_a_probe_is_refused(policy):
    with pytest.raises(h2d_policy.ReportError, match="not a gpunuma.h2d-probe/v1 document"):
        h2d_report.build_report({"schema": "x"}, policy, hostname="h1")


def test_skipped_host_and_error_gpu(policy):
    skipped = {"schema": "gpunuma.h2d-probe/v1", "status": "skipped", "reason": "no NVIDIA GPU on this node", "gpus": []}
    report = h2d_report.build_report(skipped, policy, hostname="cpu-1")
    assert report["status"] == "skipped"
    errored = {"schema": "gpunuma.h2d-probe/v1", "status": "error", "reason": "GPU 0 ... out of memory",
               "gpus": [{"index": 0, "uuid": "GPU-x", "pci_bus_id": "0000:01:00.0", "status": "error",
                         "reason": "GPU 0 (GPU-x, 0000:01:00.0): out of memory", "placements": {}}]}
    report2 = h2d_report.build_report(errored, policy, hostname="gpu-9")
    assert report2["status"] == "failed" and report2["gpus"][0]["verdict"] == "not measured"
    lines = h2d_report.fleet_table([report, report2])
    assert lines[0].split()[:3] == ["host", "gpu", "node"]
    assert "no NVIDIA GPU on this node" in lines[1]
    assert lines[2].split()[11:15] == ["-", "error", "not", "measured:"] and lines[2].endswith("GPU 0 (GPU-x, 0000:01:00.0): out of memory")


def test_fleet_table_columns(probe, policy):
    lines = h2d_report.fleet_table([h2d_report.build_report(probe, policy)])
    assert len(lines) == 2
    cells = lines[1].split()
    assert cells[:8] == ["vm", "0", "0", "63.0", "55.45", "-", "55.32", "6.46"]


@pytest.mark.parametrize("damage", [
    lambda p: p.update(gpus=["x"]),
    lambda p: p["gpus"][0].update(placements={"local": {"status": "ok", "measurement": {"h2d_pinned": {"gbps_median": "fast"}}}}),
    lambda p: p["gpus"][0].update(pcie="gen5"),
])
def test_malformed_replay_is_a_report_error(probe, policy, damage):
    damage(probe)
    with pytest.raises(h2d_policy.ReportError, match="the probe result for h1 is malformed"):
        h2d_report.build_report(probe, policy, hostname="h1")


def test_unquoted_off_profile_is_off(probe, policy):
    report = h2d_report.build_report(two_node(probe, local_gbps=45.0, unbound_gbps=55.0), policy, profile=False)
    assert report["profile"] == "off" and report["gpus"][0]["suggested_rollback"] is None


ROUNDS_DIR = os.path.join(FIXTURES, "recorded", "h200-probe-rounds")


def test_recorded_idle_runs_agree_and_never_say_hurts(policy):
    """Five idle probes of one real H200 in a row (README in the fixture): one verdict for all, not "hurts"."""
    verdicts = []
    for run in range(1, 6):
        with open(os.path.join(ROUNDS_DIR, "idle-%d.json" % run)) as fh:
            probe = json.load(fh)
        assert len(probe["gpus"][0]["placements"]["local"]["rounds"]) == 5
        report = h2d_report.build_report(probe, policy, profile="strict")
        gpu = report["gpus"][0]
        assert report["status"] == "passed", report
        assert gpu["suggested_rollback"] is None
        verdicts.append(gpu["verdict"])
    assert verdicts == ["no measurable difference"] * 5


def test_recorded_idle_runs_flip_under_one_sample_per_placement(policy):
    """The same runs judged on their first round alone, as a single batch was: the verdicts disagree."""
    old = []
    for run in range(1, 6):
        with open(os.path.join(ROUNDS_DIR, "idle-%d.json" % run)) as fh:
            probe = json.load(fh)
        places = probe["gpus"][0]["placements"]
        local, unbound = places["local"]["rounds"][0], places["unbound"]["rounds"][0]
        tol = policy["verdict"]
        if local["small_p99_us"] > unbound["small_p99_us"] * (1 + tol["latency_tolerance"]):
            old.append("hurts")
        elif local["small_p99_us"] < unbound["small_p99_us"] * (1 - tol["latency_tolerance"]):
            old.append("pays")
        else:
            old.append("same")
    assert "hurts" in old and len(set(old)) > 1


CPU_DIR = os.path.join(FIXTURES, "recorded", "h200-probe-cpu")


@pytest.mark.parametrize("run", ["idle-1.json", "idle-2.json", "idle-3.json"])
def test_recorded_h200_cpu_overhead_is_summarised_per_placement(run, policy):
    """On the real H200 the copying thread spins for the whole pinned copy: CPU seconds per GB equal the wall
    seconds per GB (1 / GB/s) within 10 %; the report carries the median over the rounds."""
    with open(os.path.join(CPU_DIR, run)) as handle:
        probe = json.load(handle)
    report = h2d_report.build_report(probe, policy, hostname="h200")
    [gpu] = report["gpus"]
    for name in ("local", "unbound"):
        place = gpu["placements"][name]
        assert place["h2d_pinned_cpu_s_per_gb"] == pytest.approx(1.0 / place["h2d_pinned_gbps"], rel=0.1), place
        assert place["h2d_pageable_cpu_s_per_gb"] == pytest.approx(1.0 / place["h2d_pageable_gbps"], rel=0.25), place
        per_round = sorted(r["small_cpu_us_per_copy"] for r in place["rounds"])
        assert place["small_cpu_us_per_copy"] == per_round[len(per_round) // 2]
        # More than the copy itself takes on the GPU: launch, events and the wait.
        assert place["small_cpu_us_per_copy"] > place["small_p50_us"]


PINNING_DIR = os.path.join(FIXTURES, "recorded", "h100-probe-pinning")


def test_recorded_h100_pinning_cost_is_carried_per_placement(policy):
    """Five runs on a real H100: every placement carries both figures; allocating pinned memory (pages touched)
    costs several times registering touched pages, in every run."""
    alloc, register = [], []
    for run in range(1, 6):
        with open(os.path.join(PINNING_DIR, "idle-%d.json" % run)) as handle:
            probe = json.load(handle)
        [gpu] = h2d_report.build_report(probe, policy, hostname="h100")["gpus"]
        for name in ("local", "unbound"):
            place = gpu["placements"][name]
            assert place["pin_alloc_s_per_gib"] > 3 * place["pin_register_s_per_gib"] > 0, place
            alloc.append(place["pin_alloc_s_per_gib"])
            register.append(place["pin_register_s_per_gib"])
    assert 0.4 < sorted(alloc)[5] < 0.8 and 0.03 < sorted(register)[5] < 0.06


def test_the_load_a_probe_ran_under_is_in_the_report_and_the_fleet_table(policy):
    with open(os.path.join(ROUNDS_DIR, "idle-1.json")) as fh:
        probe = json.load(fh)
    idle = h2d_report.build_report(probe, policy, profile="strict")
    assert idle["load"] == {"kind": "idle"}  # a probe from before the load option ran idle
    assert "under load" not in "\n".join(h2d_report.fleet_table([idle]))
    load = {"kind": "memory", "cpus": [0, 1], "memory_node": 0,
            "stressors": [{"kind": "memory", "node": 0, "gbps": 9.5}], "gbps": {"memory": 9.5}}
    report = h2d_report.build_report(dict(probe, load=load), policy, profile="strict")
    assert report["load"] == load
    assert "[under load: memory]" in "\n".join(h2d_report.fleet_table([report]))


LOAD_DIR = os.path.join(FIXTURES, "recorded", "h200-probe-load")


def test_recorded_runs_idle_and_under_every_load_agree_and_never_say_hurts(policy):
    """One real H200 (README in the fixture): five idle runs and three under each load kind. The load is real
    (the GPU's own copy stressor takes a third of the link and p99 rises from about 10 us to about 1 ms; the
    memory stressors copy about 20 GB/s), yet every run gives the same verdict, none says hurts, none suggests a
    rollback, and the link-fraction control is judged only where the link is not shared by design."""
    runs = [os.path.join(ROUNDS_DIR, "idle-%d.json" % n) for n in range(1, 6)]
    runs += [os.path.join(LOAD_DIR, "%s-%d.json" % (kind, n)) for kind in ("copies", "memory", "both")
             for n in range(1, 4)]
    verdicts = {}
    for path in runs:
        with open(path) as fh:
            probe = json.load(fh)
        report = h2d_report.build_report(probe, policy, profile="strict")
        kind = report["load"]["kind"]
        gpu = report["gpus"][0]
        assert report["status"] == "passed", (path, [c for c in gpu["controls"] if c["status"] == "fail"])
        assert gpu["suggested_rollback"] is None
        verdicts[os.path.basename(path)] = gpu["verdict"]
        link = {c["id"]: c for c in gpu["controls"]}["gpunuma-h2d-01"]
        assert link["status"] == ("not_applicable" if kind in ("copies", "both") else "pass"), (path, link)
        local = gpu["placements"]["local"]
        if kind in ("copies", "both"):
            # What the load did: the link shared, the small copies queued behind the stressor's.
            assert local["h2d_pinned_gbps"] < 40 and local["small_p99_us"] > 500, (path, local)
            assert probe["load"]["gbps"]["copies"] > 40
        if kind in ("memory", "both"):
            assert probe["load"]["gbps"]["memory"] > 10
        assert not [s for s in (probe.get("load") or {}).get("stressors", []) if s.get("error")]
    assert set(verdicts.values()) == {"no measurable difference"}, verdicts
    assert len(verdicts) == 14


@pytest.mark.parametrize("load, why", [
    ({"kind": "memory", "stressors": [], "gbps": {}}, "no stressor of load memory ran"),
    ({"kind": "memory"}, "no stressor of load memory ran"),
    ({"kind": "both", "stressors": [{"kind": "copies", "gpu": 0, "error": "cuInit failed"},
                                    {"kind": "memory", "node": 0, "gbps": 9.5}], "gbps": {"memory": 9.5}},
     "1 of 2 stressors of load both did not run (copies on GPU 0: cuInit failed)"),
    ({"kind": "copies", "stressors": [{"kind": "copies", "gpu": 0, "gbps": 0}], "gbps": {}},
     "copies on GPU 0: no throughput"),
])
def test_a_probe_asked_under_load_whose_stressors_did_not_run_gives_no_verdict(policy, load, why):
    """Verdicts only from what ran: "under load" needs the stressors' own measured load."""
    with open(os.path.join(ROUNDS_DIR, "idle-1.json")) as fh:
        probe = json.load(fh)
    report = h2d_report.build_report(dict(probe, load=load), policy, profile="strict")
    assert report["status"] == "failed" and report["load"]["ran"] is False and why in report["load"]["problem"]
    for gpu in report["gpus"]:
        assert gpu["verdict"] == h2d_report.VERDICT_UNKNOWN and gpu["suggested_rollback"] is None
        assert gpu["verdict_reason"].startswith("not measured under load: ")
