"""Policies as data: rules (``policies/rules/*.yml``), waivers, evaluation.

A rule file is one mapping::

    id: GN-NB-001                      # control id, unique, [A-Z]+(-[A-Z0-9]+)+
    title: numa_balancing is 0 on nodes with strict binding
    severity: error                    # error (blocks a change) | warning (reported)
    rationale: >-                      # why, in a sentence or two
      ...
    source: https://docs.kernel.org/...    # where the judgement comes from
    check: numa_balancing_off_with_bind    # one of CHECKS below
    params: {}                          # the check's parameters (optional)

A waiver (inventory ``gpunuma_policy_waivers``)::

    - control: GN-SPAN-001
      hosts: [gpu-a01]                  # and/or groups: [...]
      justification: "tensor-parallel server over both sockets, measured"
      owner: alice@example.com
      expires: 2026-06-30               # an expired waiver no longer applies and is reported

Each check takes a :class:`Context` (the host's topology, plan, settings
and, in the audit, the live report) and returns a list of violation
sentences (empty: pass) or None (not applicable).
"""

from __future__ import annotations

import datetime
import os
import re
from typing import Any, Tuple

# The checks and their parameters.
from ansible.module_utils.gpunuma.common import bounded
from ansible.module_utils.gpunuma.gate.checks import CHECKS, PolicyError, _params_problems

RULE_FIELDS = ("id", "title", "severity", "rationale", "source", "check", "params")
REQUIRED_RULE_FIELDS = ("id", "title", "severity", "rationale", "source", "check")
SEVERITIES = ("error", "warning")
WAIVER_FIELDS = ("control", "hosts", "groups", "justification", "owner", "expires")
# Matched with fullmatch: "$" would also accept a final newline.
_ID_RE = re.compile(r"[A-Z]+(-[A-Z0-9]+)+")
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")


class Context(object):
    def __init__(self, host, topology=None, plan=None, settings=None, live=None):
        self.host = host
        self.topology = topology or {}
        self.plan = plan or {}
        self.settings = settings or {}
        self.live = live

    @property
    def instances(self):
        return [i for i in self.plan.get("instances") or [] if isinstance(i, dict)]

    def node(self, node_id):
        for node in self.topology.get("numa_nodes") or []:
            if node.get("id") == node_id:
                return node
        return None


# --------------------------------------------------------------------------
# Rules and waivers


def validate_rule(data, source):
    """Check one rule mapping read from ``source``; return it normalised."""
    if not isinstance(data, dict):
        raise PolicyError("%s: a rule must be a mapping with %s" % (source, ", ".join(REQUIRED_RULE_FIELDS)))
    problems = []
    for key in sorted(data, key=str):
        if key not in RULE_FIELDS:
            problems.append("%s: %s: unknown field; allowed: %s" % (source, key, ", ".join(RULE_FIELDS)))
    for key in REQUIRED_RULE_FIELDS:
        if key not in data:
            problems.append("%s: %s: missing; it is required" % (source, key))
        elif key != "severity" and key != "check" and key != "id" and (not isinstance(data[key], str) or not data[key].strip()):
            problems.append("%s: %s: must be a non-empty string" % (source, key))
    if "id" in data and (not isinstance(data["id"], str) or not _ID_RE.fullmatch(data["id"])):
        problems.append("%s: id: %r is not a control id; allowed: upper-case words joined by '-', e.g. GN-NB-001"
                        % (source, data["id"]))
    if "severity" in data and data["severity"] not in SEVERITIES:
        problems.append("%s: severity: %r is not allowed; allowed: %s" % (source, data["severity"], ", ".join(SEVERITIES)))
    if "check" in data and (not isinstance(data["check"], str) or data["check"] not in CHECKS):
        problems.append("%s: check: %r is not a known check; allowed: %s"
                        % (source, data["check"], ", ".join(sorted(CHECKS))))
    if "source" in data and isinstance(data["source"], str) and not re.match(r"^(https?://|man:|doc:)", data["source"]):
        problems.append("%s: source: %r must be a URL (https://...) or man:/doc: reference" % (source, data["source"]))
    params = data.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        problems.append("%s: params: must be a mapping" % source)
    elif isinstance(data.get("check"), str) and data["check"] in CHECKS:
        problems.extend(_params_problems(data["check"], params, "%s: params" % source))
    if problems:
        raise PolicyError(problems)
    rule = dict((k, data.get(k)) for k in REQUIRED_RULE_FIELDS)
    rule["params"] = params
    rule["file"] = source
    return rule


# A rule file is a page of YAML; a bigger one (or a FIFO, a device) is refused, never read to its end.
MAX_RULE_BYTES = 1 << 20


def load_rules(rules_dir, yaml_load):
    """Every ``*.yml`` of ``rules_dir`` as validated rules, sorted by id; ``yaml_load(text)`` parses YAML."""
    if not os.path.isdir(rules_dir):
        raise PolicyError("rules_dir: %r is not a directory" % rules_dir)
    rules, problems, seen = [], [], {}
    for entry in sorted(os.listdir(rules_dir)):
        if not entry.endswith((".yml", ".yaml")) or entry.startswith("."):
            continue
        path = os.path.join(rules_dir, entry)
        try:
            data = yaml_load(bounded.read_bounded(path, MAX_RULE_BYTES, follow_symlinks=True,
                                                  what="a policy rule file").decode("utf-8"))
        except Exception as exc:  # YAML errors and unreadable files both name the file
            problems.append("%s: cannot be read as YAML: %s" % (path, str(exc).splitlines()[0] if str(exc) else exc))
            continue
        try:
            rule = validate_rule(data, path)
        except PolicyError as exc:
            problems.extend(exc.problems)
            continue
        if rule["id"] in seen:
            problems.append("%s: id: %s is already used by %s; allowed: a unique control id" % (path, rule["id"], seen[rule["id"]]))
            continue
        seen[rule["id"]] = path
        rules.append(rule)
    if problems:
        raise PolicyError(problems)
    return sorted(rules, key=lambda r: r["id"])


def _as_date(value):
    if isinstance(value, datetime.datetime):
        return value.date()
    if isinstance(value, datetime.date):
        return value
    if isinstance(value, str) and _DATE_RE.fullmatch(value.strip()):
        try:
            return datetime.date(*[int(x) for x in value.strip().split("-")])
        except ValueError:
            return None
    return None


def validate_waivers(waivers, rule_ids, what="gpunuma_policy_waivers"):
    """Check the inventory's waivers; return them normalised (``expires`` a date)."""
    if waivers is None:
        return []
    if not isinstance(waivers, list):
        raise PolicyError("%s: must be a list of waivers, got %s" % (what, type(waivers).__name__))
    problems, out = [], []
    for index, waiver in enumerate(waivers):
        where = "%s[%d]" % (what, index)
        if not isinstance(waiver, dict):
            problems.append("%s: must be a mapping with control, hosts or groups, justification, owner, expires" % where)
            continue
        for key in sorted(waiver, key=str):
            if key not in WAIVER_FIELDS:
                problems.append("%s.%s: unknown field; allowed: %s" % (where, key, ", ".join(WAIVER_FIELDS)))
        control = waiver.get("control")
        if not isinstance(control, str) or control not in rule_ids:
            problems.append("%s.control: %r is not a known control id; allowed: %s" % (where, control, ", ".join(sorted(rule_ids))))
        for key in ("justification", "owner"):
            if not isinstance(waiver.get(key), str) or not waiver[key].strip():
                problems.append("%s.%s: missing or empty; a waiver says why and who owns it" % (where, key))
        targets = {}
        for key in ("hosts", "groups"):
            value = waiver.get(key, [])
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                problems.append("%s.%s: must be a list of names" % (where, key))
                value = []
            targets[key] = value
        if not targets["hosts"] and not targets["groups"]:
            problems.append("%s: names no hosts or groups; allowed: hosts: [...] and/or groups: [...]" % where)
        expires = _as_date(waiver.get("expires"))
        if expires is None:
            problems.append("%s.expires: %r is not a date; allowed: YYYY-MM-DD" % (where, waiver.get("expires")))
        out.append({"index": index, "control": control, "hosts": targets["hosts"], "groups": targets["groups"],
                    "justification": waiver.get("justification"), "owner": waiver.get("owner"), "expires": expires})
    if problems:
        raise PolicyError(problems)
    return out


def evaluate(rules: list, ctx: Any, waivers: Any, groups: Any, today: Any) -> Tuple[list, list]:
    """Results per rule: ``{id, title, severity, status, violations, waiver, source}``.

    ``status``: pass | fail | waived | not_applicable. Also returns the
    expired waivers that would have matched this host.
    """
    results, expired = [], []
    mine = [w for w in waivers if ctx.host in w["hosts"] or set(w["groups"]) & set(groups or [])]
    for rule in rules:
        found = CHECKS[rule["check"]](ctx, rule["params"])
        status = "not_applicable" if found is None else ("fail" if found else "pass")
        waiver = None
        if status == "fail":
            for w in mine:
                if w["control"] != rule["id"]:
                    continue
                if w["expires"] < today:
                    expired.append(dict(w, expires=w["expires"].isoformat()))
                    continue
                waiver = dict(w, expires=w["expires"].isoformat())
                status = "waived"
                break
        results.append({"id": rule["id"], "title": rule["title"], "severity": rule["severity"], "status": status,
                        "violations": found or [], "waiver": waiver, "source": rule["source"], "file": rule["file"]})
    return results, expired


def violation_message(host, result):
    return ("%s: policy %s (%s) fails: %s. Why: see %s. To waive it, add to gpunuma_policy_waivers: "
            "{control: %s, hosts: [%s], justification: ..., owner: ..., expires: YYYY-MM-DD}"
            % (host, result["id"], result["title"], "; ".join(result["violations"]), result["source"],
               result["id"], host))
