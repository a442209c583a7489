"""Loading a directory of gpunuma artefacts into hosts, and the shape checks that turn a document gpunuma does not
write into a problem of its host (report/page.py)."""

from __future__ import annotations

import json
import os
import urllib.parse

from ansible.module_utils.gpunuma.common.bounded import open_regular
from ansible.module_utils.gpunuma.report.base import (
    MAX_FILE_BYTES, MAX_FILES, SCHEMAS, _STEM_SUFFIXES, ReportError, ShapeError, _q, parse_cpulist, shown)

# ---------------------------------------------------------------- loading


def _stem(path):
    """The host a controller file names: its stem, %XX decoded (gpunuma names them with host_file_stem)."""
    name = os.path.basename(path)
    if name.lower().endswith(".json"):
        name = name[:-5]
    for suffix in _STEM_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[:-len(suffix)]
            break
    return urllib.parse.unquote(name)


def _read_json(path):
    """The JSON object in the regular file ``path`` (no link, FIFO or device: common/bounded.open_regular), or
    None for anything else, a file over MAX_FILE_BYTES included."""
    try:
        fd, st = open_regular(path, what="a gpunuma artefact")
    except OSError:
        return None
    try:
        if st.st_size > MAX_FILE_BYTES:
            return None
        with os.fdopen(fd, "rb") as handle:
            fd = None
            if handle.read(64).lstrip()[:1] != b"{":     # every gpunuma artefact is a JSON object
                return None
            handle.seek(0)
            raw = handle.read(MAX_FILE_BYTES + 1)
        return json.loads(raw.decode("utf-8")) if len(raw) <= MAX_FILE_BYTES else None
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None
    finally:
        if fd is not None:
            os.close(fd)


def load_fleet(path):
    """Hosts and their artefacts under ``path``: one directory, or a list of them (the playbook's topology,
    audit and validation directories).

    Returns ``{"root": path, "hosts": {name: host}, "files": n}``; a host is
    ``{"name", "topology", "plan", "state", "audit", "validation", "files": {kind: path},
    "problems": [...], "notes": [...]}``. Raises ReportError for a missing or
    empty directory or one without any gpunuma artefact.
    """
    roots = [path] if isinstance(path, str) else list(path) if isinstance(path, (list, tuple)) else None
    if not roots or not all(isinstance(root, str) and root for root in roots):
        raise ReportError("no directory given")
    path = ", ".join(roots)
    files = []
    for root in roots:
        if not os.path.exists(root):
            raise ReportError("%s does not exist" % root)
        if not os.path.isdir(root):
            raise ReportError("%s is not a directory" % root)
        # With several directories a file is named from the one above them all.
        base = root if len(roots) == 1 else os.path.dirname(os.path.abspath(root))
        for top, dirs, names in os.walk(root, followlinks=False):
            dirs.sort()
            for name in sorted(names):
                file_path = os.path.join(top, name)
                files.append((file_path, os.path.relpath(file_path, base)))
                if len(files) > MAX_FILES:
                    raise ReportError("%s holds more than %d files; point the report at the artefact directories"
                                      % (root, MAX_FILES))
    if not files:
        raise ReportError("%s is empty: no gpunuma artefacts (topology, plan, state, audit or validation JSON)" % path)
    hosts = {}
    for file_path, rel in files:
        doc = _read_json(file_path)
        if not isinstance(doc, dict):
            continue
        kind = SCHEMAS.get(doc.get("schema")) if isinstance(doc.get("schema"), str) else None
        if kind is None:
            continue
        name = doc.get("hostname")
        if not isinstance(name, str) or not name.strip():
            name = _stem(file_path)
        host = hosts.setdefault(name, {"name": name, "files": {}, "problems": [], "notes": []})
        if kind == "topology" and os.path.basename(file_path).endswith(".pending.json"):
            host["notes"].append("%s: a pending topology change (fingerprint %s) waits for "
                                 "gpu_topology_accept_changes" % (rel, shown(doc.get("fingerprint"), 80)))
            continue
        if kind in host["files"]:
            host["notes"].append("%s artefact found twice: %s and %s; %s is shown"
                                 % (kind, host["files"][kind], rel, rel if _newer(doc, host.get(kind), kind) else
                                    host["files"][kind]))
            if not _newer(doc, host.get(kind), kind):
                continue
        try:
            CHECKS[kind](doc)
        except ShapeError as exc:
            host["problems"].append("%s (%s): %s" % (rel, kind, exc))
            host.pop(kind, None)
            host["files"][kind] = rel
            continue
        host[kind] = doc
        host["files"][kind] = rel
    if not hosts:
        raise ReportError("%s holds no gpunuma artefact (JSON with schema gpunuma.topology/v1, plan/v1, state/v1, "
                          "audit/v1 or validation/v1) in its %d files" % (path, len(files)))
    return {"root": path, "hosts": hosts, "files": len(files)}


def _newer(doc, old, kind):
    key = {"state": "updated", "audit": "time", "validation": "generated_at"}.get(kind)
    if not isinstance(old, dict) or not key:
        return not isinstance(old, dict)
    return isinstance(doc.get(key), str) and isinstance(old.get(key), str) and doc[key] > old[key]


# ---------------------------------------------------------------- shape checks


def _int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _need(cond, message):
    if not cond:
        raise ShapeError(message)


def _list_of_dicts(doc, key, what=None):
    value = doc.get(key)
    _need(isinstance(value, list), "%s is %s, not a list" % (what or key, _q(value, 60)))
    for i, item in enumerate(value):
        _need(isinstance(item, dict), "%s[%d] is %s, not an object" % (what or key, i, _q(item, 60)))
    return value


def _opt_str(value):
    return value is None or isinstance(value, str)


def check_topology(doc):
    nodes = _list_of_dicts(doc, "numa_nodes")
    seen = set()
    for i, node in enumerate(nodes):
        _need(_int(node.get("id")) and 0 <= node["id"] <= 1023, "numa_nodes[%d].id is %s, not a node id 0-1023"
              % (i, _q(node.get("id"), 60)))
        _need(node["id"] not in seen, "numa_nodes[%d].id %d is listed twice" % (i, node["id"]))
        seen.add(node["id"])
        parse_cpulist(node.get("cpus"), "numa_nodes[%d].cpus" % i)
        mem = node.get("memory_total_bytes")
        _need(mem is None or (_int(mem) and mem >= 0), "numa_nodes[%d].memory_total_bytes is %s, not bytes or null"
              % (i, _q(mem, 60)))
        dist = node.get("distances")
        _need(dist is None or (isinstance(dist, list) and all(_int(d) for d in dist)),
              "numa_nodes[%d].distances is %s, not a list of integers" % (i, _q(dist, 60)))
    gpus = _list_of_dicts(doc, "gpus")
    indexes = set()
    for i, gpu in enumerate(gpus):
        _need(_int(gpu.get("index")) and gpu["index"] >= 0, "gpus[%d].index is %s, not a GPU index"
              % (i, _q(gpu.get("index"), 60)))
        _need(gpu["index"] not in indexes, "gpus[%d].index %d is listed twice" % (i, gpu["index"]))
        indexes.add(gpu["index"])
        for key in ("numa_node", "gpu_numa_id"):
            _need(gpu.get(key) is None or _int(gpu.get(key)), "gpus[%d].%s is %s, not a node id or null"
                  % (i, key, _q(gpu.get(key), 60)))
        _need(_opt_str(gpu.get("name")) and _opt_str(gpu.get("uuid")), "gpus[%d].name/uuid is not text" % i)
    nics = doc.get("nics", [])
    _need(isinstance(nics, list), "nics is %s, not a list" % _q(nics, 60))
    for i, nic in enumerate(nics):
        _need(isinstance(nic, dict), "nics[%d] is %s, not an object" % (i, _q(nic, 60)))
        _need(nic.get("numa_node") is None or _int(nic.get("numa_node")), "nics[%d].numa_node is %s, not a node id"
              % (i, _q(nic.get("numa_node"), 60)))
        _need(_opt_str(nic.get("name")), "nics[%d].name is %s, not text" % (i, _q(nic.get("name"), 60)))
        _need(nic.get("netdevs") is None or (isinstance(nic["netdevs"], list)
                                             and all(isinstance(n, str) for n in nic["netdevs"])),
              "nics[%d].netdevs is %s, not a list of names" % (i, _q(nic.get("netdevs"), 60)))
    for key, rows, cols in (("gpu_links", len(gpus), len(gpus)), ("gpu_nic_links", len(gpus), len(nics))):
        links = doc.get(key, [])
        _need(isinstance(links, list) and all(isinstance(r, list) and all(isinstance(c, str) for c in r)
                                              for r in links), "%s is not a matrix of link codes" % key)
        if links:
            _need(len(links) == rows and all(len(r) == cols for r in links),
                  "%s is %d x %s, expected %d x %d" % (key, len(links), sorted({len(r) for r in links}), rows, cols))
    _need(doc.get("sockets") is None or _int(doc.get("sockets")), "sockets is %s, not an integer or null"
          % _q(doc.get("sockets"), 60))
    _need(_opt_str(doc.get("fingerprint")), "fingerprint is not text")
    warnings = doc.get("warnings", [])
    _need(isinstance(warnings, list), "warnings is not a list")


def check_plan(doc):
    instances = _list_of_dicts(doc, "instances")
    for key in ("housekeeping", "worker_cpus"):
        value = doc.get(key, {})
        _need(isinstance(value, dict), "%s is %s, not a mapping of node to CPU list" % (key, _q(value, 60)))
        for node, cpus in value.items():
            parse_cpulist(cpus, "%s[%s]" % (key, node))
    _need(_opt_str(doc.get("profile")), "profile is %s, not text" % _q(doc.get("profile"), 60))
    for i, inst in enumerate(instances):
        what = "instances[%d]" % i
        _need(isinstance(inst.get("name"), str), "%s.name is %s, not text" % (what, _q(inst.get("name"), 60)))
        for key in ("gpus", "numa_nodes", "mem_nodes"):
            value = inst.get(key, [])
            _need(isinstance(value, list) and all(_int(v) for v in value), "%s.%s is %s, not a list of integers"
                  % (what, key, _q(value, 60)))
        if inst.get("cpus") is not None:
            parse_cpulist(inst.get("cpus"), what + ".cpus")
        for key in ("mem_policy", "profile", "fallback"):
            _need(_opt_str(inst.get(key)), "%s.%s is %s, not text" % (what, key, _q(inst.get(key), 60)))
        _need(isinstance(inst.get("warnings", []), list), "%s.warnings is not a list" % what)
        pinned = inst.get("pinned_bytes")
        _need(pinned is None or _int(pinned), "%s.pinned_bytes is %s, not a byte count" % (what, _q(pinned, 60)))
        limit = inst.get("limit_memlock")
        _need(limit is None or _int(limit) or isinstance(limit, str),
              "%s.limit_memlock is %s, not a limit" % (what, _q(limit, 60)))
    _need(isinstance(doc.get("warnings", []), list), "warnings is not a list")
    budget = doc.get("pinned_budget", {})
    _need(isinstance(budget, dict) and all(_int(v) for v in budget.values()),
          "pinned_budget is %s, not a mapping of node to bytes" % _q(budget, 60))


def check_state(doc):
    _need(_opt_str(doc.get("profile")), "profile is %s, not text" % _q(doc.get("profile"), 60))
    history = _list_of_dicts(doc, "history")
    for i, entry in enumerate(history):
        for key in ("time", "from", "to", "action", "reason", "user"):
            _need(_opt_str(entry.get(key)), "history[%d].%s is %s, not text" % (i, key, _q(entry.get(key), 60)))


def check_audit(doc):
    _need(isinstance(doc.get("status"), str), "status is %s, not text" % _q(doc.get("status"), 60))
    findings = _list_of_dicts(doc, "findings")
    for i, finding in enumerate(findings):
        for key in ("id", "severity"):
            _need(isinstance(finding.get(key), str), "findings[%d].%s is %s, not text"
                  % (i, key, _q(finding.get(key), 60)))
    _need(isinstance(doc.get("profile", {}), dict), "profile is not an object")
    _need(isinstance(doc.get("instances", []), list), "instances is not a list")
    pol = doc.get("policy")
    _need(pol is None or isinstance(pol, dict), "policy is %s, not an object" % _q(pol))
    for key in ("violations", "warnings"):
        value = (pol or {}).get(key) or []
        _need(isinstance(value, list) and all(isinstance(v, str) for v in value),
              "policy.%s is %s, not a list of messages" % (key, _q(value)))


def check_validation(doc):
    _need(isinstance(doc.get("status"), str), "status is %s, not text" % _q(doc.get("status"), 60))
    gpus = _list_of_dicts(doc, "gpus")
    for i, gpu in enumerate(gpus):
        _need(_opt_str(gpu.get("verdict")), "gpus[%d].verdict is %s, not text" % (i, _q(gpu.get("verdict"), 60)))
    _need(isinstance(doc.get("summary", {}), dict), "summary is not an object")


CHECKS = {"topology": check_topology, "plan": check_plan, "state": check_state, "audit": check_audit,
          "validation": check_validation}
