"""Validation of H2D probe results against policy thresholds kept as data.

``load_policy`` checks a ``gpunuma.validation-policy/v1`` document
(policies/validation/h2d.yml); ``build_report`` turns one host's
``gpunuma.h2d-probe/v1`` result into a ``gpunuma.validation/v1`` report
with one verdict per GPU; ``fleet_table`` prints the fleet.  Pure data in,
data out: no Ansible, no I/O.
"""

from __future__ import annotations

import statistics

from ansible.module_utils.gpunuma.common import schemas
from ansible.module_utils.gpunuma.verify import stats
# The policy and its loader.
from ansible.module_utils.gpunuma.verify.h2d.policy import DEFAULT_LADDER, VERDICT_OPTIONAL, ReportError

REPORT_SCHEMA = schemas.VALIDATION
PROBE_SCHEMA = schemas.H2D_PROBE

VERDICT_PAYS = "binding pays"
VERDICT_NEUTRAL = "no measurable difference"
VERDICT_HURTS = "binding hurts"
VERDICT_INCONCLUSIVE = "inconclusive"
VERDICT_UNKNOWN = "not measured"


def _m(placement, key, sub):
    m = (placement or {}).get("measurement") or {}
    return (m.get(key) or {}).get(sub)


def _pinning(placement, method):
    """Seconds per GiB to pin memory by ``method`` on a placement, or None (not measured, refused, malformed)."""
    figure = _m(placement, "pinning", method)
    value = figure.get("s_per_gib") if isinstance(figure, dict) else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _rounds(placement):
    """The per-round figures of a placement (``rounds`` of the probe), each with a bandwidth and a p99; [] for none."""
    out = []
    for item in placement.get("rounds") or []:
        if not isinstance(item, dict):
            raise ValueError("a round of placement %s is %r, not a mapping" % (placement.get("node"), item))
        gbps, p99 = item.get("h2d_pinned_gbps"), item.get("small_p99_us")
        if isinstance(gbps, (int, float)) and isinstance(p99, (int, float)) \
                and not isinstance(gbps, bool) and not isinstance(p99, bool):
            out.append({"h2d_pinned_gbps": gbps, "small_p99_us": p99, "small_p50_us": item.get("small_p50_us"),
                        "h2d_pinned_cpu_s_per_gb": item.get("h2d_pinned_cpu_s_per_gb"),
                        "small_cpu_us_per_copy": item.get("small_cpu_us_per_copy")})
    return out


def _median(rounds, key):
    values = [r[key] for r in rounds if isinstance(r.get(key), (int, float))]
    return round(statistics.median(values), 3) if values else None


def _summarise_placement(name, placement, link_gbps):
    if not placement or placement.get("status") != "ok":
        return {"status": (placement or {}).get("status", "not_requested"), "reason": (placement or {}).get("reason")}
    binding = placement.get("binding") or {}
    rounds = _rounds(placement)
    pinned = _median(rounds, "h2d_pinned_gbps") if rounds else _m(placement, "h2d_pinned", "gbps_median")
    p50 = _median(rounds, "small_p50_us") if rounds else _m(placement, "small_h2d_pinned", "us_p50")
    p99 = _median(rounds, "small_p99_us") if rounds else _m(placement, "small_h2d_pinned", "us_p99")
    return {
        "status": "ok",
        "node": placement.get("node"),
        "h2d_pinned_gbps": pinned,
        "d2h_pinned_gbps": _m(placement, "d2h_pinned", "gbps_median"),
        "h2d_pageable_gbps": _m(placement, "h2d_pageable", "gbps_median"),
        "small_p50_us": p50,
        "small_p99_us": p99,
        "rounds": rounds,
        "small_max_us": _m(placement, "small_h2d_pinned", "us_max"),
        "small_loop_us_per_copy": _m(placement, "small_h2d_pinned", "loop_us_per_copy"),
        # CPU overhead: the copying thread's CPU time per GB (large pinned and pageable copies) and per small copy.
        "h2d_pinned_cpu_s_per_gb": _median(rounds, "h2d_pinned_cpu_s_per_gb") if rounds
        else _m(placement, "h2d_pinned", "cpu_s_per_gb"),
        "h2d_pageable_cpu_s_per_gb": _m(placement, "h2d_pageable", "cpu_s_per_gb"),
        "small_cpu_us_per_copy": _median(rounds, "small_cpu_us_per_copy") if rounds
        else _m(placement, "small_h2d_pinned", "cpu_us_per_copy"),
        "link_fraction": round(pinned / link_gbps, 4) if pinned and link_gbps else None,
        # What pinning costs on this placement: seconds per GiB to allocate pinned memory, and to register pages.
        "pin_alloc_s_per_gib": _pinning(placement, "host_alloc"),
        "pin_register_s_per_gib": _pinning(placement, "register"),
        "binding_verified": bool(binding.get("cpus_verified") and binding.get("mem_verified") and binding.get("pages_verified")),
        "cpus_allowed": binding.get("cpus_allowed"),
        "mempolicy": binding.get("mempolicy"),
        "mempolicy_nodes": binding.get("mempolicy_nodes"),
    }


def _waived(policy, control_id, hostname):
    for waiver in policy["waivers"]:
        if waiver["control"] == control_id and ("all" in waiver.get("hosts", ["all"]) or hostname in waiver.get("hosts", [])):
            return waiver["justification"]
    return None


# Loads whose stressors copy over the GPUs' own links (verify/h2d/load.py): the link is shared by design.
LINK_SHARING_LOADS = ("copies", "both")


def _evaluate(control, gpu, places, hostname, policy, load="idle"):
    check = control["check"]
    local = places.get("local", {})
    if check == "pinned_link_fraction":
        if load in LINK_SHARING_LOADS:
            return "not_applicable", ("under load %s the GPU's link is shared with the load's copies by design; the "
                                      "fraction of the link is judged on an idle run, the placements are compared "
                                      "by the verdict" % load)
        link = gpu["link"]["theoretical_gbps"]
        if not link:
            return "not_applicable", "the PCIe link of this GPU is unknown (no NVML, no sysfs link speed)"
        measured = [(n, p["link_fraction"]) for n, p in places.items() if p.get("status") == "ok"]
        if not measured:
            return "not_applicable", "no placement was measured"
        worst = min(measured, key=lambda x: x[1])
        status = "pass" if worst[1] >= control["min_fraction"] else "fail"
        return status, "pinned H2D %s reached %.1f%% of the %.1f GB/s link (at least %.0f%% required; pageable copies are not counted)" % (
            worst[0], worst[1] * 100, link, control["min_fraction"] * 100)
    if check == "local_not_slower_than_remote":
        remote = places.get("remote", {})
        if local.get("status") != "ok" or remote.get("status") != "ok":
            return "not_applicable", "local and remote were not both measured (%s)" % (
                remote.get("reason") or local.get("reason") or "placement not requested")
        tol = control["tolerance"]
        detail = "local %.2f GB/s p99 %.2f us, remote %.2f GB/s p99 %.2f us (tolerance %.0f%%)" % (
            local["h2d_pinned_gbps"], local["small_p99_us"], remote["h2d_pinned_gbps"], remote["small_p99_us"], tol * 100)
        rules = _rules(policy["verdict"])
        rounds = min(len(local.get("rounds") or []), len(remote.get("rounds") or []))
        if rounds and stats.min_p_value(rounds, rounds) < rules["alpha"]:
            # Per-round figures: slower only when significant and beyond the tolerance (as the verdict).
            comparison = _compare(local, remote, dict(rules, bandwidth_tolerance=tol, latency_tolerance=tol))
            worse = [m for m, c in comparison.items() if c["outcome"] == "worse"]
            return ("fail" if worse else "pass"), "%s; %d rounds each, alpha %g: %s" % (
                detail, rounds, rules["alpha"], ("worse on " + " and ".join(worse)) if worse else "not slower")
        slow = local["h2d_pinned_gbps"] < remote["h2d_pinned_gbps"] * (1 - tol)
        late = local["small_p99_us"] > remote["small_p99_us"] * (1 + tol)
        return ("fail" if slow or late else "pass"), detail + "; one sample each, so noise can decide this"
    if check == "binding_verified":
        bad = [n for n, p in places.items() if p.get("status") == "ok" and not p["binding_verified"]]
        if not [p for p in places.values() if p.get("status") == "ok"]:
            return "not_applicable", "no placement was measured"
        return ("fail", "binding not verified for %s (CPUs, memory policy or buffer pages differ from the request)" % ", ".join(bad)) \
            if bad else ("pass", "CPUs, memory policy and buffer pages match every placement")
    if check == "pageable_reported":
        ok = [n for n, p in places.items() if p.get("status") == "ok" and p.get("h2d_pageable_gbps")]
        if not [p for p in places.values() if p.get("status") == "ok"]:
            return "not_applicable", "no placement was measured"
        return ("pass", "pageable H2D measured separately for %s" % ", ".join(ok)) if ok else \
            ("fail", "no pageable H2D figure in the probe")
    raise ReportError("unknown check %r" % check)


def _series(place, key):
    return [r[key] for r in place.get("rounds") or []]


def _compare(local, ref, rules):
    """Bandwidth and p99 of ``local`` against ``ref`` (stats.compare on their rounds)."""
    return {
        "bandwidth": stats.compare(_series(local, "h2d_pinned_gbps"), _series(ref, "h2d_pinned_gbps"), True,
                                   rules["alpha"], rules["bandwidth_tolerance"]),
        "p99": stats.compare(_series(local, "small_p99_us"), _series(ref, "small_p99_us"), False,
                             rules["alpha"], rules["latency_tolerance"]),
    }


def _said(name, comparison):
    bw, p99 = comparison["bandwidth"], comparison["p99"]
    return "%s: bandwidth x%.3f (p=%.3g), p99 x%.3f (p=%.3g)" % (name, bw["ratio"], bw["p"], p99["ratio"], p99["p"])


def _verdict(places, rules, profile, ladder, previous=None):
    """(verdict, reason, suggested rung, comparisons) of the bound-to-local placement.

    The rule (docs/probe.md, "The verdict"): per-round figures of local
    against unbound and remote, each metric by the exact two-sided
    Mann-Whitney U test at ``alpha`` and the practical tolerance together.
    ``binding hurts``: worse than unbound on a metric and better on none.
    ``binding pays``: better than unbound or remote on a metric and worse on
    none. ``inconclusive``: better on one metric and worse on another, or a
    placement whose rounds spread beyond ``max_round_spread``. Otherwise, or
    with too few rounds to reach ``alpha``, ``no measurable difference``. A
    rollback is suggested only when the previous validation of the same GPU
    (``previous``, its verdict) also said ``binding hurts``.
    """
    local, unbound, remote = places.get("local", {}), places.get("unbound", {}), places.get("remote", {})
    if local.get("status") != "ok":
        return VERDICT_UNKNOWN, "the bound-to-local placement was not measured", None, {}
    refs = [(n, p) for n, p in (("unbound", unbound), ("remote", remote)) if p.get("status") == "ok"]
    if not refs:
        return VERDICT_UNKNOWN, "nothing to compare the bound placement with", None, {}
    measured = [("local", local)] + refs
    counts = {n: len(p.get("rounds") or []) for n, p in measured}
    fewest = min(counts.values())
    if fewest == 0 or stats.min_p_value(fewest, fewest) >= rules["alpha"]:
        need = 1
        while stats.min_p_value(need, need) >= rules["alpha"]:
            need += 1
        return VERDICT_NEUTRAL, ("%s round(s) per placement cannot show a difference at alpha %g (at least %d "
                                 "needed: gpu_validate_rounds); no verdict is drawn from single samples"
                                 % (max(fewest, 1), rules["alpha"], need)), None, {}
    for name, place in measured:
        spread = stats.spread(_series(place, "h2d_pinned_gbps"))
        if spread > rules["max_round_spread"]:
            return VERDICT_INCONCLUSIVE, ("the %d rounds of %s disagree: their bandwidths spread %.0f%% of the median "
                                          "(more than %.0f%%), so the node was not quiet; validate again"
                                          % (len(place["rounds"]), name, spread * 100,
                                             rules["max_round_spread"] * 100)), None, {}
    comparisons = {name: _compare(local, place, rules) for name, place in refs}
    outcomes = {name: {c["outcome"] for c in comp.values()} for name, comp in comparisons.items()}
    detail = "; ".join(_said(name, comp) for name, comp in comparisons.items())
    if any({"better", "worse"} <= o for o in outcomes.values()):
        return VERDICT_INCONCLUSIVE, "better on one metric and worse on the other: " + detail, None, comparisons
    if "unbound" in outcomes and "worse" in outcomes["unbound"]:
        rung = None
        confirmed = previous == VERDICT_HURTS
        if confirmed and profile in ladder and ladder.index(profile) + 1 < len(ladder):
            rung = ladder[ladder.index(profile) + 1]
        why = "bound is worse than unbound beyond the tolerance at alpha %g: %s" % (rules["alpha"], detail)
        if not confirmed:
            why += "; the previous validation did not say so, so no rollback is suggested yet: validate again"
        return VERDICT_HURTS, why, rung, comparisons
    gains = [n for n, o in outcomes.items() if "better" in o and "worse" not in o]
    if gains:
        return VERDICT_PAYS, "bound beats %s beyond the tolerance at alpha %g: %s" % (
            " and ".join(gains), rules["alpha"], detail), None, comparisons
    return VERDICT_NEUTRAL, "no difference both significant at alpha %g and beyond %.0f%% bandwidth / %.0f%% p99: %s" % (
        rules["alpha"], rules["bandwidth_tolerance"] * 100, rules["latency_tolerance"] * 100, detail), None, comparisons


def _rules(verdict):
    """The verdict settings of a loaded policy, with the optional keys' defaults."""
    out = dict(verdict)
    for key, (_unused, default) in VERDICT_OPTIONAL.items():
        out.setdefault(key, default)
    return out


def _previous_verdicts(previous):
    """``{GPU uuid or index: verdict}`` of a previous gpunuma.validation/v1 report (None or damaged: {})."""
    out = {}
    if not isinstance(previous, dict) or previous.get("schema") != REPORT_SCHEMA:
        return out
    for gpu in previous.get("gpus") or []:
        if isinstance(gpu, dict) and isinstance(gpu.get("verdict"), str):
            out[gpu.get("uuid") or gpu.get("index")] = gpu["verdict"]
    return out


def build_report(probe, policy, hostname=None, profile=None, ladder=None, generated_at=None, previous=None):
    """One host's ``gpunuma.validation/v1`` report from its probe result and a loaded policy.

    ``previous`` is this host's previous report, if any: a rollback is
    suggested only when it said ``binding hurts`` for the same GPU too.

    A damaged result (a replayed file edited by hand, a wrong type in a field) raises ReportError
    naming the host and what was wrong, never a bare TypeError.
    """
    try:
        return _build_report(probe, policy, hostname, profile, ladder, generated_at, previous)
    except (TypeError, KeyError, AttributeError, ValueError, ZeroDivisionError) as exc:
        raise ReportError("the probe result for %s is malformed (%s: %s); expected the fields of %s (docs/probe.md)"
                          % (hostname or "this host", type(exc).__name__, exc, PROBE_SCHEMA))


def _build_report(probe, policy, hostname, profile, ladder, generated_at, previous=None):
    if profile is False:  # an unquoted `off` in YAML reaches Ansible as the boolean false
        profile = "off"
    if not isinstance(probe, dict) or probe.get("schema") != PROBE_SCHEMA:
        raise ReportError("the probe result for %s is not a %s document (schema %r)"
                          % (hostname or "this host", PROBE_SCHEMA, probe.get("schema") if isinstance(probe, dict) else probe))
    ladder = list(ladder or DEFAULT_LADDER)
    hostname = hostname or probe.get("hostname")
    report = {"schema": REPORT_SCHEMA, "hostname": hostname, "generated_at": generated_at,
              "policy": policy.get("name"), "profile": profile, "probe_status": probe.get("status"),
              "probe_reason": probe.get("reason"), "driver_version": probe.get("driver_version"),
              "probe_options": probe.get("options"), "load": probe.get("load") or {"kind": "idle"}, "gpus": []}
    counts = {"pass": 0, "fail": 0, "waived": 0, "not_applicable": 0}
    no_load = load_not_run(report["load"])
    if no_load:
        report["load"] = dict(report["load"], ran=False, problem=no_load)
    before = _previous_verdicts(previous)
    for gpu in probe.get("gpus", []):
        pcie = gpu.get("pcie") or {}
        link = {"gen": pcie.get("gen_max"), "width": pcie.get("width_max"), "source": pcie.get("source"),
                "theoretical_gbps": pcie.get("theoretical_gbps"), "theoretical_raw_gbps": pcie.get("theoretical_raw_gbps")}
        entry = {"index": gpu.get("index"), "uuid": gpu.get("uuid"), "pci_bus_id": gpu.get("pci_bus_id"),
                 "name": gpu.get("name"), "numa_node": gpu.get("numa_node"), "remote_node": gpu.get("remote_node"),
                 "status": gpu.get("status"), "reason": gpu.get("reason"), "link": link, "placements": {},
                 "controls": []}
        for name in ("local", "remote", "unbound"):
            entry["placements"][name] = _summarise_placement(name, gpu.get("placements", {}).get(name), link["theoretical_gbps"])
        places = {n: p for n, p in entry["placements"].items() if p.get("status") != "not_requested"}
        if gpu.get("status") == "ok":
            for control in policy["controls"]:
                if control.get("enabled", True) is False:
                    continue
                status, detail = _evaluate(control, entry, places, hostname, policy, report["load"].get("kind", "idle"))
                justification = _waived(policy, control["id"], hostname) if status == "fail" else None
                if justification:
                    status, detail = "waived", "%s; waived: %s" % (detail, justification)
                counts[status] += 1
                entry["controls"].append({"id": control["id"], "title": control["title"], "status": status, "detail": detail})
            verdict, why, rung, comparisons = _verdict(
                entry["placements"], _rules(policy["verdict"]), profile, ladder,
                before.get(gpu.get("uuid") or gpu.get("index")))
        else:
            verdict, why, rung, comparisons = VERDICT_UNKNOWN, gpu.get("reason") or "the GPU was not measured", None, {}
        if no_load:
            # Asked under load, measured without it (or with part of it): no verdict of this run stands for one
            # under load.
            verdict, why, rung = VERDICT_UNKNOWN, "not measured under load: %s" % no_load, None
        entry.update(verdict=verdict, verdict_reason=why, suggested_rollback=rung, comparisons=comparisons)
        report["gpus"].append(entry)
    report["summary"] = counts
    if probe.get("status") == "skipped" and not report["gpus"]:
        report["status"] = "skipped"
    elif counts["fail"] or probe.get("status") == "error" or any(g["status"] == "error" for g in report["gpus"]) \
            or no_load:
        report["status"] = "failed"
    else:
        report["status"] = "passed"
    return report


def load_not_run(load):
    """Why a probe asked to measure under load did not (None when it ran idle, or under the load it asked for):
    every stressor must have answered with the throughput it drove (verify/h2d/load.py, ``describe``)."""
    if not isinstance(load, dict) or load.get("kind", "idle") == "idle":
        return None
    stressors = load.get("stressors")
    if not isinstance(stressors, list) or not stressors:
        return "no stressor of load %s ran" % load.get("kind")
    failed = [s for s in stressors if not isinstance(s, dict) or s.get("error")
              or not isinstance(s.get("gbps"), (int, float)) or isinstance(s.get("gbps"), bool) or s["gbps"] <= 0]
    if failed:
        words = ["%s%s: %s" % (s.get("kind"), " on GPU %s" % s["gpu"] if s.get("gpu") is not None else "",
                               s.get("error") or "no throughput") if isinstance(s, dict) else repr(s) for s in failed]
        return "%d of %d stressors of load %s did not run (%s)" % (
            len(failed), len(stressors), load.get("kind"), "; ".join(words[:4]))
    return None


def _fmt(value, pattern):
    return pattern % value if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def fleet_table(reports):
    """Lines of the fleet table: per GPU the local/remote/unbound pinned GB/s, p99 small-copy latency and verdict."""
    header = ("host", "gpu", "node", "link GB/s", "local GB/s", "remote GB/s", "unbound GB/s",
              "local p99us", "remote p99us", "unbound p99us", "pageable GB/s", "rounds", "controls", "verdict")
    rows = []
    for report in reports:
        if not report.get("gpus"):
            rows.append((str(report.get("hostname")), "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-",
                         report.get("status", "-"), report.get("probe_reason") or "no GPU measured"))
            continue
        for gpu in report["gpus"]:
            p = gpu["placements"]
            fails = [c["id"] for c in gpu["controls"] if c["status"] == "fail"]
            verdict = gpu["verdict"]
            if gpu.get("status") != "ok":
                verdict += ": %s" % gpu.get("reason")
            load = (report.get("load") or {}).get("kind", "idle")
            if load != "idle":
                verdict += " [under load: %s]" % load
            if gpu.get("suggested_rollback"):
                verdict += " (roll back to %s)" % gpu["suggested_rollback"]
            elif gpu["verdict"] == VERDICT_HURTS:
                verdict += " (first time: validate again before rolling back)"
            rows.append((
                str(report.get("hostname")), str(gpu["index"]), _fmt(gpu["numa_node"], "%d"),
                _fmt(gpu["link"]["theoretical_gbps"], "%.1f"),
                _fmt(p["local"].get("h2d_pinned_gbps"), "%.2f"), _fmt(p["remote"].get("h2d_pinned_gbps"), "%.2f"),
                _fmt(p["unbound"].get("h2d_pinned_gbps"), "%.2f"),
                _fmt(p["local"].get("small_p99_us"), "%.2f"), _fmt(p["remote"].get("small_p99_us"), "%.2f"),
                _fmt(p["unbound"].get("small_p99_us"), "%.2f"),
                _fmt(p["local"].get("h2d_pageable_gbps") or p["unbound"].get("h2d_pageable_gbps"), "%.2f"),
                _fmt(len(p["local"].get("rounds") or []) or None, "%d"),
                ("fail: " + ",".join(fails)) if fails else ("ok" if gpu.get("status") == "ok" else gpu.get("status")),
                verdict))
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    return ["  ".join(str(c).ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in [header] + rows]
