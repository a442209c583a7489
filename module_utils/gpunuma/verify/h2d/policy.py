"""The validation policy (``gpunuma.validation-policy/v1``, policies/validation/h2d.yml) of the H2D report
(verify/h2d/report.py): its controls, verdict keys and ladder, and ``load_policy``, which names every bad field."""

from __future__ import annotations

import re

from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.common import schemas

POLICY_SCHEMA = schemas.VALIDATION_POLICY

CHECKS = {
    "pinned_link_fraction": {"min_fraction": (float, 0.0, 1.0)},
    "local_not_slower_than_remote": {"tolerance": (float, 0.0, 1.0)},
    "binding_verified": {},
    "pageable_reported": {},
}
VERDICT_KEYS = {"bandwidth_tolerance": (float, 0.0, 1.0), "latency_tolerance": (float, 0.0, 10.0)}
# Optional verdict keys and their defaults (docs/probe.md, "The verdict"):
# alpha, the significance level of the rank test of per-round figures; and
# max_round_spread, how far one placement's per-round bandwidths may spread
# ((max - min) / median) before the run says the node was not quiet.
VERDICT_OPTIONAL = {"alpha": ((float, 0.001, 0.5), 0.05), "max_round_spread": ((float, 0.0, 10.0), 0.25)}
DEFAULT_LADDER = ["strict", "preferred", "interleave", "off"]


class PolicyError(GpunumaError):
    """A validation policy is malformed; the message lists every problem."""


class ReportError(GpunumaError):
    """A probe result cannot be turned into a report."""


def _number(value, kind, low, high):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return low <= value <= high


def _control(control, where, seen, problems):
    """One entry of ``controls``, checked (its id added to ``seen``); None when it is not a mapping or its check unknown."""
    if not isinstance(control, dict):
        problems.append("%s is %r; it must be a mapping with id, title and check" % (where, control))
        return None
    cid, check = control.get("id"), control.get("check")
    if not isinstance(cid, str) or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", cid):
        problems.append("%s.id is %r; it must be a control id of a-z, 0-9 and '-' (e.g. gpunuma-h2d-01)" % (where, cid))
    elif cid in seen:
        problems.append("%s.id %r is used twice" % (where, cid))
    else:
        seen.add(cid)
    if not isinstance(control.get("title"), str) or not control.get("title"):
        problems.append("%s.title is %r; it must be a non-empty string" % (where, control.get("title")))
    if not isinstance(check, str) or check not in CHECKS:
        problems.append("%s.check is %r; allowed: %s" % (where, check, ", ".join(sorted(CHECKS))))
        return None
    params = CHECKS[check]
    for key in control:
        if key not in ("id", "title", "check", "enabled") and key not in params:
            problems.append("%s has unknown key %r; allowed for check %s: %s"
                            % (where, key, check, ", ".join(["id", "title", "check", "enabled"] + sorted(params))))
    for key, (kind, low, high) in params.items():
        if not _number(control.get(key), kind, low, high):
            problems.append("%s.%s is %r; it must be a number from %s to %s" % (where, key, control.get(key), low, high))
    if "enabled" in control and not isinstance(control["enabled"], bool):
        problems.append("%s.enabled is %r; it must be true or false" % (where, control["enabled"]))
    return dict(control)


def _verdict(verdict, source, problems):
    """The verdict rule, checked, with its optional keys' defaults filled in."""
    if not isinstance(verdict, dict):
        problems.append("%s: verdict is %r; it must be a mapping with %s" % (source, verdict, ", ".join(VERDICT_KEYS)))
        verdict = {}
    for key, (kind, low, high) in VERDICT_KEYS.items():
        if not _number(verdict.get(key), kind, low, high):
            problems.append("%s: verdict.%s is %r; it must be a number from %s to %s" % (source, key, verdict.get(key), low, high))
    verdict = dict(verdict)
    for key, ((kind, low, high), default) in VERDICT_OPTIONAL.items():
        if key not in verdict:
            verdict[key] = default
        elif not _number(verdict.get(key), kind, low, high):
            problems.append("%s: verdict.%s is %r; it must be a number from %s to %s" % (source, key, verdict.get(key), low, high))
    allowed = list(VERDICT_KEYS) + list(VERDICT_OPTIONAL)
    for key in verdict:
        if key not in allowed:
            problems.append("%s: verdict has unknown key %r; allowed: %s" % (source, key, ", ".join(allowed)))
    return verdict


def _waivers(waivers, source, seen, problems):
    """The waivers, checked against the policy's control ids."""
    if not isinstance(waivers, list):
        problems.append("%s: waivers is %r; it must be a list" % (source, waivers))
        return []
    for i, waiver in enumerate(waivers):
        where = "%s: waivers[%d]" % (source, i)
        if not isinstance(waiver, dict):
            problems.append("%s is %r; it must be a mapping with control, hosts and justification" % (where, waiver))
            continue
        if not isinstance(waiver.get("control"), str) or waiver["control"] not in seen:
            problems.append("%s.control is %r; allowed: a control id of this policy (%s)" % (where, waiver.get("control"), ", ".join(sorted(seen))))
        if not isinstance(waiver.get("justification"), str) or len(waiver.get("justification", "").strip()) < 10:
            problems.append("%s.justification is %r; a waiver needs a justification of at least 10 characters" % (where, waiver.get("justification")))
        hosts = waiver.get("hosts", ["all"])
        if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
            problems.append("%s.hosts is %r; it must be a list of host names (or ['all'])" % (where, hosts))
    return waivers


def load_policy(data, source="policy"):
    """Validate a policy document; return it normalised. Raises PolicyError naming each bad field."""
    problems = []
    if not isinstance(data, dict):
        raise PolicyError("%s: the policy must be a mapping with schema, controls and verdict; got %s"
                          % (source, type(data).__name__))
    if data.get("schema") != POLICY_SCHEMA:
        problems.append("%s: schema is %r; allowed: %s" % (source, data.get("schema"), POLICY_SCHEMA))
    if "name" in data and (not isinstance(data["name"], str) or not data["name"].strip()
                           or any(ord(c) < 32 for c in data["name"])):
        problems.append("%s: name is %r; it must be a non-empty string on one line" % (source, data["name"]))
    controls = data.get("controls")
    if not isinstance(controls, list) or not controls:
        problems.append("%s: controls is %r; it must be a non-empty list" % (source, controls))
        controls = []
    seen = set()
    out_controls = [c for c in (_control(control, "%s: controls[%d]" % (source, i), seen, problems)
                                for i, control in enumerate(controls)) if c is not None]
    verdict = _verdict(data.get("verdict"), source, problems)
    waivers = _waivers(data.get("waivers") or [], source, seen, problems)
    if problems:
        raise PolicyError("; ".join(problems))
    return {"schema": POLICY_SCHEMA, "name": data.get("name", source), "controls": out_controls,
            "verdict": dict(verdict), "waivers": list(waivers)}
