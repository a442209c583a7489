"""Self-contained HTML fleet report from a directory of gpunuma artefacts.

``load_fleet(path)`` reads every JSON document under ``path`` (recursively)
and sorts the gpunuma ones by their ``schema`` field (topology, plan, state,
audit, validation) into hosts; ``render_html(fleet)`` draws one HTML page
(inline CSS and SVG, no script, nothing fetched) with a fleet table, the
drift and rollback history of every node, and per host the topology picture
with each instance's CPUs, memory nodes and GPUs. ``build_report(path)``
does both. Standard library only: the report is rendered on a controller or
on a laptop holding a copied directory.

Every text taken from an artefact is HTML-escaped. An artefact with a known
schema but a shape gpunuma does not write is listed as a problem of its host,
never a traceback; a missing or empty directory is a ``ReportError``.
"""

from __future__ import annotations

import html
import json
import os
import re
import stat
import urllib.parse

SCHEMAS = {
    "gpunuma.topology/v1": "topology",
    "gpunuma.plan/v1": "plan",
    "gpunuma.state/v1": "state",
    "gpunuma.audit/v1": "audit",
    "gpunuma.validation/v1": "validation",
}
KINDS = ("topology", "plan", "state", "audit", "validation")
MAX_FILE_BYTES = 32 << 20          # a 64-GPU topology or plan is well under 1 MiB
MAX_FILES = 100000
MAX_CPU = 8191                     # NR_CPUS at most 8192 (docs/topology-v1.md)
_STEM_SUFFIXES = (".plan", ".state", ".audit", ".validation", ".topology", ".pending")

# Instance colours: distinct, readable on white, none of them the CPU greys.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#bcbd22", "#393b79", "#637939", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354")
HOUSEKEEPING_FILL = "#222222"
FREE_FILL = "#e4e4e4"
CROSS_COLOUR = "#d00000"
LINK_COLOURS = (
    ("NV", "#1a9850", "NVLink (NV#: number of links)"),
    ("PIX", "#66bd63", "PIX: one PCIe switch"),
    ("PXB", "#a6d96a", "PXB: several PCIe switches"),
    ("PHB", "#fee08b", "PHB: through the CPU's PCIe host bridge"),
    ("NODE", "#fdae61", "NODE: across host bridges of one NUMA node"),
    ("SYS", "#d73027", "SYS: across the socket interconnect (QPI/UPI/xGMI)"),
    ("X", "#ffffff", "X: itself"),
    ("?", "#bbbbbb", "unknown"),
)


class ReportError(Exception):
    """The directory cannot give a report (missing, not a directory, no gpunuma artefact)."""


class ShapeError(Exception):
    """An artefact with a known schema whose fields are not what gpunuma writes."""


def esc(value):
    """HTML text of any value (None as an empty string)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        value = json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)
    return html.escape(value, quote=True)


def _q(value, limit=60):
    """A value as JSON text, for messages (cut to ``limit`` characters with its length)."""
    try:
        text = json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + "... (%d characters)" % len(text)


def shown(value, limit=200):
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[:limit] + "... (%d characters)" % len(text)


# ---------------------------------------------------------------- CPU lists


def parse_cpulist(text, what):
    """Set of ids of a kernel CPU list ("0-3,8"); ShapeError naming ``what`` otherwise."""
    if not isinstance(text, str):
        raise ShapeError("%s is %s, not a CPU list" % (what, _q(text)))
    out = set()
    text = text.strip()
    if not text:
        return out
    if len(text) > 65536:
        raise ShapeError("%s is %d characters long (at most 65536)" % (what, len(text)))
    for part in text.split(","):
        m = re.fullmatch(r"([0-9]{1,5})(?:-([0-9]{1,5}))?", part.strip(), re.ASCII)
        if not m:
            raise ShapeError("%s: %s is not a CPU list (e.g. 0-3,8)" % (what, _q(text)))
        low = int(m.group(1))
        high = int(m.group(2)) if m.group(2) is not None else low
        if high < low or high > MAX_CPU:
            raise ShapeError("%s: range %s is not allowed (ids 0-%d, low-high)" % (what, part, MAX_CPU))
        out.update(range(low, high + 1))
    return out


def format_ids(ids):
    ids = sorted(ids)
    parts = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else "%d-%d" % (ids[i], ids[j]))
        i = j + 1
    return ",".join(parts)


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
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:
        return None
    try:
        with open(path, "rb") as handle:
            if handle.read(64).lstrip()[:1] != b"{":     # every gpunuma artefact is a JSON object
                return None
            handle.seek(0)
            raw = handle.read(MAX_FILE_BYTES + 1)
        return json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None


def load_fleet(path):
    """Hosts and their artefacts under ``path``.

    Returns ``{"root": path, "hosts": {name: host}, "files": n}``; a host is
    ``{"name", "topology", "plan", "state", "audit", "validation", "files": {kind: path},
    "problems": [...], "notes": [...]}``. Raises ReportError for a missing or
    empty directory or one without any gpunuma artefact.
    """
    if not isinstance(path, str) or not path:
        raise ReportError("no directory given")
    if not os.path.exists(path):
        raise ReportError("%s does not exist" % path)
    if not os.path.isdir(path):
        raise ReportError("%s is not a directory" % path)
    files = []
    for top, dirs, names in os.walk(path, followlinks=False):
        dirs.sort()
        for name in sorted(names):
            files.append(os.path.join(top, name))
            if len(files) > MAX_FILES:
                raise ReportError("%s holds more than %d files; point the report at the artefact directories"
                                  % (path, MAX_FILES))
    if not files:
        raise ReportError("%s is empty: no gpunuma artefacts (topology, plan, state, audit or validation JSON)" % path)
    hosts = {}
    for file_path in files:
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
        rel = os.path.relpath(file_path, path)
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
    _need(isinstance(doc.get("warnings", []), list), "warnings is not a list")


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


# ---------------------------------------------------------------- model for drawing


def _node_sockets(topo):
    """(socket label per node id, whether the grouping is known)."""
    nodes = topo["numa_nodes"]
    cpu_nodes = [n for n in nodes if parse_cpulist(n.get("cpus"), "cpus")]
    pos = {n["id"]: i for i, n in enumerate(nodes)}

    def dist(a, b):
        row = a.get("distances") or []
        j = pos[b["id"]]
        return row[j] if j < len(row) else None

    sockets = topo.get("sockets")
    group = {}
    known = False
    have_dist = all(len(n.get("distances") or []) == len(nodes) for n in nodes) and nodes
    if have_dist and cpu_nodes:
        # CPU-bearing nodes of one package sit at SLIT distance below 20 (remote sockets are 20 or more).
        next_socket = 0
        for node in cpu_nodes:
            for other in cpu_nodes:
                if other["id"] in group and dist(node, other) is not None and dist(node, other) < 20:
                    group[node["id"]] = group[other["id"]]
                    break
            else:
                group[node["id"]] = next_socket
                next_socket += 1
        known = sockets is None or sockets == next_socket
    elif cpu_nodes and sockets == len(cpu_nodes):
        for i, node in enumerate(cpu_nodes):
            group[node["id"]] = i
        known = True
    elif cpu_nodes and sockets == 1:
        for node in cpu_nodes:
            group[node["id"]] = 0
        known = True
    else:
        for i, node in enumerate(cpu_nodes):
            group[node["id"]] = i
    # Memory-only nodes: with the GPU whose memory they are, else the nearest CPU node.
    gpu_mem = {}
    for gpu in topo["gpus"]:
        if _int(gpu.get("gpu_numa_id")) and gpu.get("numa_node") in group:
            gpu_mem[gpu["gpu_numa_id"]] = group[gpu["numa_node"]]
    for node in nodes:
        if node["id"] in group:
            continue
        if node["id"] in gpu_mem:
            group[node["id"]] = gpu_mem[node["id"]]
        elif have_dist and cpu_nodes:
            best = min(cpu_nodes, key=lambda c: (dist(node, c) if dist(node, c) is not None else 1 << 30, c["id"]))
            group[node["id"]] = group[best["id"]]
        else:
            group[node["id"]] = None
    return group, known


def _host_model(host):
    """Everything the picture and the tables need, computed once (may raise; the caller reports it)."""
    topo = host.get("topology")
    plan = host.get("plan")
    model = {"instances": [], "node_of_cpu": {}, "cpus": {}, "hk": {}, "colour": {}, "socket": {}, "sockets_known": False}
    if topo:
        for node in topo["numa_nodes"]:
            cpus = parse_cpulist(node.get("cpus"), "cpus")
            model["cpus"][node["id"]] = cpus
            for cpu in cpus:
                model["node_of_cpu"][cpu] = node["id"]
        model["socket"], model["sockets_known"] = _node_sockets(topo)
    if plan:
        for node, cpus in (plan.get("housekeeping") or {}).items():
            model["hk"][str(node)] = parse_cpulist(cpus, "housekeeping")
        gpu_node = {}
        gpu_mem_node = {}
        if topo:
            for gpu in topo["gpus"]:
                gpu_node[gpu["index"]] = gpu.get("numa_node")
                if _int(gpu.get("gpu_numa_id")):
                    gpu_mem_node[gpu["gpu_numa_id"]] = gpu["index"]
        for i, inst in enumerate(plan["instances"]):
            colour = PALETTE[i % len(PALETTE)] if i < len(PALETTE) else "hsl(%d,65%%,45%%)" % ((i * 137) % 360)
            cpus = parse_cpulist(inst.get("cpus"), "cpus") if inst.get("cpus") is not None else set()
            cpu_nodes = sorted({model["node_of_cpu"][c] for c in cpus if c in model["node_of_cpu"]})
            gpu_nodes = sorted({gpu_node.get(g) for g in inst.get("gpus") or [] if _int(gpu_node.get(g))})
            mem_nodes = sorted(set(inst.get("mem_nodes") or []))
            # A GPU's own memory node (Grace C2C) counts as that GPU's node.
            mem_cmp = sorted({gpu_node.get(gpu_mem_node[m], m) if m in gpu_mem_node else m for m in mem_nodes})
            # Crossing: any of the instance's CPUs or memory on a node other than one of its GPUs' node
            # (a single-GPU instance bound elsewhere, or a multi-GPU instance spanning nodes).
            used = set(cpu_nodes + mem_cmp)
            away = sorted((used | set(gpu_nodes)) - {gpu_nodes[0]}) if gpu_nodes and len(used | set(gpu_nodes)) > 1 else []
            cross = None
            if away:
                sock = model["socket"]
                socks = {sock.get(n) for n in used | set(gpu_nodes)}
                same_socket = model["sockets_known"] and None not in socks and len(socks) == 1
                cross = {"away": away, "gpu_nodes": gpu_nodes, "cpu_nodes": cpu_nodes, "mem_nodes": mem_nodes,
                         "label": "crosses NUMA nodes" if same_socket else "crosses sockets"}
            model["instances"].append({"doc": inst, "colour": colour, "cpus": cpus, "cpu_nodes": cpu_nodes,
                                       "gpu_nodes": gpu_nodes, "mem_nodes": mem_nodes, "cross": cross})
            model["colour"][inst.get("name")] = colour
    return model


# ---------------------------------------------------------------- SVG


def _link_colour(code):
    code = code or "?"
    if code.startswith("NV"):
        return LINK_COLOURS[0][1]
    if code == "SOC":
        code = "SYS"
    for key, colour, _ in LINK_COLOURS:
        if code == key:
            return colour
    return LINK_COLOURS[-1][1]


def _text(x, y, text, size=12, anchor="start", weight="normal", fill="#111", cls=None):
    return ('<text x="%d" y="%d" font-size="%d" text-anchor="%s" font-weight="%s" fill="%s"%s>%s</text>'
            % (x, y, size, anchor, weight, fill, ' class="%s"' % cls if cls else "", esc(text)))


def _gib(value):
    if not _int(value):
        return "memory unknown"
    if value == 0:
        return "no memory online"
    return "%.1f GiB" % (value / float(1 << 30))


def topology_svg(host, model):
    """The host's topology picture: sockets as bands, NUMA nodes wrapped into rows inside them."""
    topo = host["topology"]
    plan = host.get("plan")
    width = 1160
    pad = 12
    gpus_by_node = {}
    unplaced_gpus = []
    for gpu in topo["gpus"]:
        if _int(gpu.get("numa_node")) and gpu["numa_node"] in model["cpus"]:
            gpus_by_node.setdefault(gpu["numa_node"], []).append(gpu)
        else:
            unplaced_gpus.append(gpu)
    nics_by_node = {}
    unplaced_nics = []
    for nic in topo.get("nics") or []:
        if _int(nic.get("numa_node")) and nic["numa_node"] in model["cpus"]:
            nics_by_node.setdefault(nic["numa_node"], []).append(nic)
        else:
            unplaced_nics.append(nic)
    gpu_mem_of = {g["gpu_numa_id"]: g for g in topo["gpus"] if _int(g.get("gpu_numa_id"))}
    gpu_owner = {}
    mem_owners = {}
    cpu_owner = {}
    for inst in model["instances"]:
        for g in inst["doc"].get("gpus") or []:
            gpu_owner.setdefault(g, inst)
        for m in inst["mem_nodes"]:
            mem_owners.setdefault(m, []).append(inst)
        for c in inst["cpus"]:
            cpu_owner.setdefault(c, inst)
    hk_all = set()
    for cpus in model["hk"].values():
        hk_all |= cpus

    nodes = sorted(topo["numa_nodes"], key=lambda n: n["id"])
    bands = {}
    for node in nodes:
        bands.setdefault(model["socket"].get(node["id"]), []).append(node)
    order = sorted(bands, key=lambda s: (s is None, s if s is not None else 0))

    parts = []
    gpu_pos = {}
    node_box = {}
    y = pad
    inner = width - 2 * pad
    for sock in order:
        band_nodes = bands[sock]
        band_top = y
        y += 22
        x = pad + 8
        row_h = 0
        row_y = y
        right = pad + 260
        for node in band_nodes:
            cpus = sorted(model["cpus"].get(node["id"], ()))
            has_cpus = bool(cpus)
            if has_cpus:
                box_w = 370
                cell = 12 if len(cpus) <= 192 else (8 if len(cpus) <= 640 else 5)
                per_row = max(1, (box_w - 16) // cell)
                grid_h = ((len(cpus) + per_row - 1) // per_row) * cell
                gpus_here = gpus_by_node.get(node["id"], [])
                nics_here = nics_by_node.get(node["id"], [])
                per_dev_row = 5
                dev_rows = (len(gpus_here) + per_dev_row - 1) // per_dev_row + (len(nics_here) + 5) // 6
                mem_rows = len(mem_owners.get(node["id"], []))
                box_h = 40 + grid_h + 20 + 14 * mem_rows + 34 * dev_rows + 8
            else:
                box_w = 132
                box_h = 58 + 14 * len(mem_owners.get(node["id"], []))
            if x + box_w > pad + inner - 8 and x > pad + 8:
                x = pad + 8
                row_y += row_h + 10
                row_h = 0
            node_box[node["id"]] = (x, row_y, box_w, box_h)
            cls = "node cpu-node" if has_cpus else "node memory-node"
            parts.append('<g class="%s" data-node="%d">' % (cls, node["id"]))
            parts.append('<rect x="%d" y="%d" width="%d" height="%d" rx="6" fill="%s" stroke="#555" stroke-width="1.2"%s/>'
                         % (x, row_y, box_w, box_h, "#ffffff" if has_cpus else "#f3f0ff",
                            "" if has_cpus else ' stroke-dasharray="4 3"'))
            if has_cpus:
                parts.append(_text(x + 8, row_y + 16, "NUMA node %d" % node["id"], 13, weight="bold"))
                parts.append(_text(x + box_w - 8, row_y + 16, "%s, %d CPUs" % (_gib(node.get("memory_total_bytes")),
                                                                                len(cpus)), 11, anchor="end"))
                parts.append(_text(x + 8, row_y + 31, "CPUs %s" % format_ids(cpus), 10, fill="#444"))
                gy = row_y + 38
                for k, cpu in enumerate(cpus):
                    cx = x + 8 + (k % per_row) * cell
                    cy = gy + (k // per_row) * cell
                    if cpu in hk_all:
                        parts.append('<rect class="cpu housekeeping" x="%d" y="%d" width="%d" height="%d" fill="%s">'
                                     '<title>CPU %d: housekeeping</title></rect>'
                                     % (cx, cy, cell - 1, cell - 1, HOUSEKEEPING_FILL, cpu))
                    elif cpu in cpu_owner:
                        owner = cpu_owner[cpu]
                        parts.append('<rect class="cpu" x="%d" y="%d" width="%d" height="%d" fill="%s">'
                                     '<title>CPU %d: %s</title></rect>'
                                     % (cx, cy, cell - 1, cell - 1, owner["colour"], cpu, esc(owner["doc"].get("name"))))
                    else:
                        parts.append('<rect class="cpu" x="%d" y="%d" width="%d" height="%d" fill="%s">'
                                     '<title>CPU %d: free</title></rect>' % (cx, cy, cell - 1, cell - 1, FREE_FILL, cpu))
                ty = gy + grid_h + 14
                hk_here = model["hk"].get(str(node["id"]))
                parts.append(_text(x + 8, ty, "housekeeping: %s" % (format_ids(hk_here) if hk_here else
                                                                    ("none" if plan else "no plan")), 10, fill="#333"))
                ty += 4
            else:
                parts.append(_text(x + 6, row_y + 15, "node %d" % node["id"], 12, weight="bold"))
                parts.append(_text(x + 6, row_y + 29, "memory only, no CPUs", 10, fill="#553399"))
                owner_gpu = gpu_mem_of.get(node["id"])
                label = ("GPU%d memory" % owner_gpu["index"]) if owner_gpu else _gib(node.get("memory_total_bytes"))
                if owner_gpu and _int(node.get("memory_total_bytes")):
                    label += ", " + _gib(node["memory_total_bytes"])
                parts.append(_text(x + 6, row_y + 43, label, 10, fill="#333"))
                ty = row_y + 46
            for inst in mem_owners.get(node["id"], []):
                parts.append('<rect x="%d" y="%d" width="%d" height="11" fill="%s"/>' % (x + 6, ty + 1, 10, inst["colour"]))
                parts.append(_text(x + 20, ty + 10, "memory: %s (%s)" % (inst["doc"].get("name"),
                                                                        inst["doc"].get("mem_policy")), 10))
                ty += 14
            if has_cpus:
                ty += 6
                for k, gpu in enumerate(gpus_by_node.get(node["id"], [])):
                    gx = x + 8 + (k % 5) * 71
                    gyy = ty + (k // 5) * 34
                    gpu_pos[gpu["index"]] = (gx + 32, gyy + 13)
                    parts.append(_gpu_rect(gx, gyy, gpu, gpu_owner.get(gpu["index"])))
                rows = (len(gpus_by_node.get(node["id"], [])) + 4) // 5
                ty += rows * 34
                for k, nic in enumerate(nics_by_node.get(node["id"], [])):
                    nx = x + 8 + (k % 6) * 59
                    ny = ty + (k // 6) * 34
                    parts.append(_nic_rect(nx, ny, nic))
            parts.append("</g>")
            right = max(right, x + box_w + 8)
            x += box_w + 10
            row_h = max(row_h, box_h)
        y = row_y + row_h + 10
        if sock is None:
            label = "nodes of unknown socket"
        elif model["sockets_known"]:
            label = "socket %d" % sock
        else:
            label = "socket unknown (NUMA node %s)" % format_ids(n["id"] for n in band_nodes if model["cpus"].get(n["id"]))
        parts.insert(0, '<rect class="socket" x="%d" y="%d" width="%d" height="%d" rx="10" fill="#f6f8fb" '
                        'stroke="#8899aa" stroke-width="1.5"/>%s' % (pad, band_top, right - pad, y - band_top,
                                                                    _text(pad + 10, band_top + 16, label, 13, weight="bold",
                                                                          fill="#334")))
        y += 8
    if unplaced_gpus or unplaced_nics or not nodes:
        band_top = y
        y += 22
        k = 0
        for gpu in unplaced_gpus:
            gx = pad + 8 + (k % 15) * 71
            gy = y + (k // 15) * 34
            gpu_pos[gpu["index"]] = (gx + 32, gy + 13)
            parts.append(_gpu_rect(gx, gy, gpu, gpu_owner.get(gpu["index"])))
            k += 1
        y += ((k + 14) // 15) * 34
        for k, nic in enumerate(unplaced_nics):
            parts.append(_nic_rect(pad + 8 + (k % 18) * 59, y + (k // 18) * 34, nic))
        y += ((len(unplaced_nics) + 17) // 18) * 34 + 6
        parts.append('<rect x="%d" y="%d" width="%d" height="%d" rx="10" fill="none" stroke="#bb7700" '
                     'stroke-dasharray="6 4"/>' % (pad, band_top, inner, y - band_top))
        parts.append(_text(pad + 10, band_top + 16, "NUMA node unknown: GPUs and NICs that cannot be placed"
                           if nodes else "no NUMA nodes in the topology", 13, weight="bold", fill="#884400"))
        y += 8
    # Instances whose CPUs or memory are away from their GPUs: a red dashed line from GPU to that node.
    for inst in model["instances"]:
        cross = inst["cross"]
        if not cross:
            continue
        gpu_node = {gpu["index"]: gpu.get("numa_node") for gpu in topo["gpus"]}
        labelled = False
        for g in inst["doc"].get("gpus") or []:
            if g not in gpu_pos:
                continue
            for n in sorted(set(inst["cpu_nodes"]) | set(inst["mem_nodes"])):
                if n == gpu_node.get(g) or gpu_mem_of.get(n, {}).get("index") == g:
                    continue
                if n not in node_box:
                    continue
                bx, by, bw, bh = node_box[n]
                x1, y1 = gpu_pos[g]
                x2, y2 = bx + bw // 2, by + 24
                parts.append('<line class="cross" x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3" '
                             'stroke-dasharray="8 5"/>' % (x1, y1, x2, y2, CROSS_COLOUR))
                if not labelled:
                    labelled = True
                    parts.append('<text class="cross-label" x="%d" y="%d" font-size="12" font-weight="bold" fill="%s">'
                                 '%s %s</text>' % (x1 + 34, y1 + 4, CROSS_COLOUR, esc(inst["doc"].get("name")),
                                                   esc(cross["label"])))
    height = y + pad
    return ('<svg class="topology" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="100%%" '
            'style="max-width:%dpx" role="img" aria-label="%s">%s</svg>'
            % (width, height, width, esc("topology of %s" % host["name"]), "".join(parts)))


def _gpu_rect(x, y, gpu, owner):
    fill = owner["colour"] if owner else "#ffffff"
    text_fill = "#ffffff" if owner else "#111111"
    title = "GPU%s %s%s" % (gpu.get("index"), gpu.get("name") or "", (" - instance %s" % owner["doc"].get("name"))
                            if owner else " - no instance")
    return ('<g class="gpu" data-gpu="%s"><rect x="%d" y="%d" width="64" height="28" rx="4" fill="%s" stroke="#000" '
            'stroke-width="1.5"/><title>%s</title>%s%s</g>'
            % (esc(gpu.get("index")), x, y, fill, esc(title),
               _text(x + 32, y + 12, "GPU%s" % gpu.get("index"), 11, "middle", "bold", text_fill),
               _text(x + 32, y + 24, shown(owner["doc"].get("name"), 10) if owner else "free", 9, "middle",
                     fill=text_fill)))


def _nic_rect(x, y, nic):
    return ('<g class="nic"><rect x="%d" y="%d" width="54" height="26" rx="3" fill="#fff8e0" stroke="#aa8800"/>'
            '<title>%s</title>%s%s</g>'
            % (x, y, esc("NIC %s %s" % (nic.get("name"), " ".join(str(n) for n in nic.get("netdevs") or []))),
               _text(x + 27, y + 11, "NIC", 9, "middle", fill="#775500"),
               _text(x + 27, y + 22, shown(nic.get("name") or "?", 9), 9, "middle", weight="bold")))


def matrix_svg(title, rows, row_labels, col_labels):
    """A link-class matrix (GPU x GPU or GPU x NIC) as coloured cells."""
    if not rows or not col_labels:
        return ""
    cell = 30 if len(col_labels) <= 12 else 22
    left = 64
    top = 64
    width = left + cell * len(col_labels) + 10
    height = top + cell * len(rows) + 10
    parts = [_text(4, 14, title, 12, weight="bold")]
    for j, label in enumerate(col_labels):
        cx = left + j * cell + cell // 2
        parts.append('<text x="%d" y="%d" font-size="10" transform="rotate(-60 %d %d)">%s</text>'
                     % (cx, top - 4, cx, top - 4, esc(shown(label, 12))))
    for i, row in enumerate(rows):
        parts.append(_text(left - 4, top + i * cell + cell // 2 + 4, row_labels[i], 10, "end"))
        for j, code in enumerate(row):
            parts.append('<rect x="%d" y="%d" width="%d" height="%d" fill="%s" stroke="#999"><title>%s - %s: %s</title></rect>'
                         % (left + j * cell, top + i * cell, cell, cell, _link_colour(code), esc(row_labels[i]),
                            esc(col_labels[j]), esc(code)))
            parts.append(_text(left + j * cell + cell // 2, top + i * cell + cell // 2 + 4, shown(code, 5),
                               8 if cell < 30 or len(code) > 3 else 10, "middle"))
    return ('<svg class="links" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d">%s</svg>'
            % (width, height, width, height, "".join(parts)))


def legend_html():
    items = "".join('<span class="lg"><i style="background:%s"></i>%s</span>' % (colour, esc(label))
                    for code, colour, label in LINK_COLOURS if code != "X")
    items += ('<span class="lg"><i style="background:%s"></i>housekeeping CPU</span>'
              '<span class="lg"><i style="background:%s"></i>free CPU</span>'
              '<span class="lg"><i style="background:#f3f0ff;border:1px dashed #555"></i>memory-only node</span>'
              '<span class="lg"><i style="background:%s"></i>instance crossing sockets</span>'
              % (HOUSEKEEPING_FILL, FREE_FILL, CROSS_COLOUR))
    return '<div class="legend">%s</div>' % items


# ---------------------------------------------------------------- tables


def _violations(audit):
    return list((audit.get("policy") or {}).get("violations") or [])


def compliance(host):
    """``ok``, ``no audit``, or ``<status>: N findings (E error, W warning)[, V policy violations]``."""
    audit = host.get("audit")
    if not audit:
        return "no audit"
    counts = {}
    for finding in audit["findings"]:
        counts[finding["severity"]] = counts.get(finding["severity"], 0) + 1
    violations = len(_violations(audit))
    if not audit["findings"] and not violations:
        return "ok" if audit["status"] == "compliant" else audit["status"]
    order = ["error", "warning", "info"] + sorted(k for k in counts if k not in ("error", "warning", "info"))
    text = "%s: %d finding%s" % (audit["status"], len(audit["findings"]), "" if len(audit["findings"]) == 1 else "s")
    if counts:
        text += " (%s)" % ", ".join("%d %s" % (counts[k], k) for k in order if k in counts)
    if violations:
        text += ", %d policy violation%s" % (violations, "" if violations == 1 else "s")
    return text


def probe_verdict(host):
    report = host.get("validation")
    if not report:
        return "no probe"
    verdicts = []
    for gpu in report["gpus"]:
        v = gpu.get("verdict") or gpu.get("status") or "?"
        if v not in verdicts:
            verdicts.append(v)
    text = report["status"]
    if verdicts:
        text += ": " + "; ".join(str(v) for v in verdicts)
    elif report.get("probe_reason"):
        text += ": " + str(report["probe_reason"])
    return text


def _profile(host):
    plan = host.get("plan") or {}
    state = host.get("state") or {}
    out = plan.get("profile") or state.get("profile") or "-"
    if state.get("profile") and plan.get("profile") and state["profile"] != plan["profile"].replace("-cpu-only", ""):
        out += " (state: %s)" % state["profile"]
    if state.get("pinned"):
        out += " (pinned by rollback)"
    return out


def _fingerprint(host):
    topo = host.get("topology") or {}
    plan = host.get("plan") or {}
    fp = topo.get("fingerprint") or plan.get("topology_fingerprint")
    if not isinstance(fp, str):
        return "-"
    short = fp.split(":", 1)[-1][:12]
    if topo.get("fingerprint") and plan.get("topology_fingerprint") and topo["fingerprint"] != plan["topology_fingerprint"]:
        short += " (plan made for %s)" % plan["topology_fingerprint"].split(":", 1)[-1][:12]
    return short


def host_summary(host):
    """One terminal/table row: host, profile, instances, compliance, probe verdict."""
    plan = host.get("plan")
    return {
        "host": host["name"],
        "profile": _profile(host),
        "fingerprint": _fingerprint(host),
        "instances": len(plan["instances"]) if plan else None,
        "compliance": compliance(host),
        "probe": probe_verdict(host),
        "problems": len(host["problems"]),
    }


def _anchor(name):
    return "host-" + "".join(c if c.isascii() and c.isalnum() else "_%x_" % ord(c) for c in name)


CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:18px;color:#111;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 6px;border-bottom:2px solid #ccd}
h3{font-size:14px;margin:14px 0 4px}
table{border-collapse:collapse;margin:6px 0 12px;font-size:13px} th,td{border:1px solid #ccc;padding:3px 7px;
text-align:left;vertical-align:top} th{background:#eef1f5}
.meta{color:#555;font-size:12px} .problem{background:#fff0f0;border:2px solid #d00000;padding:6px 10px;margin:6px 0}
.problem li{color:#900}
.note{background:#fffbe6;border:1px solid #c9a400;padding:4px 10px;margin:6px 0;font-size:13px}
.sw{display:inline-block;width:14px;height:14px;border:1px solid #333;vertical-align:middle;margin-right:4px}
.cross-badge{color:#fff;background:#d00000;font-weight:bold;padding:1px 6px;border-radius:3px}
.ok{color:#176c2a;font-weight:bold} .bad{color:#b00000;font-weight:bold}
.legend{font-size:12px;margin:6px 0} .lg{display:inline-block;margin-right:12px}
.lg i{display:inline-block;width:14px;height:12px;border:1px solid #666;vertical-align:middle;margin-right:4px}
.matrices{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start}
section.host{margin-bottom:30px}
td.warn{font-size:12px;color:#7a4b00;max-width:520px}
"""


def _cls_status(text):
    return "ok" if text == "ok" or text.startswith("passed") else ("bad" if text.startswith(("drifted", "failed"))
                                                                   else "")


def render_html(fleet, title="gpunuma fleet report", only=None):
    """The HTML page; ``only``: host names to include (default every host)."""
    hosts = [fleet["hosts"][k] for k in sorted(fleet["hosts"]) if only is None or k in only]
    out = ['<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
           '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'; '
           'img-src data:">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           "<title>%s</title><style>%s</style></head><body>" % (esc(title), CSS),
           "<h1>%s</h1>" % esc(title),
           '<p class="meta">%d host%s, from %s</p>' % (len(hosts), "" if len(hosts) == 1 else "s", esc(fleet["root"]))]
    summaries = {}
    for host in hosts:
        try:
            summaries[host["name"]] = host_summary(host)
        except Exception as exc:  # an artefact shape the checks let through: a problem, never a traceback
            host["problems"].append("summary: %s: %s" % (type(exc).__name__, exc))
            summaries[host["name"]] = {"host": host["name"], "profile": "-", "fingerprint": "-", "instances": None,
                                       "compliance": "-", "probe": "-", "problems": len(host["problems"])}
    sections = [_host_section(host, summaries[host["name"]]) for host in hosts]
    for host in hosts:
        summaries[host["name"]]["problems"] = len(host["problems"])
    out.append('<h2>Fleet</h2><table class="fleet"><thead><tr><th>host</th><th>profile</th><th>fingerprint</th>'
               "<th>instances</th><th>compliance</th><th>probe verdict</th><th>drift found</th><th>problems</th>"
               "</tr></thead><tbody>")
    for host in hosts:
        s = summaries[host["name"]]
        drift = ""
        audit = host.get("audit")
        if audit:
            drift = ", ".join([esc("%s%s" % (f["id"], " (%s)" % f["instance"] if f.get("instance") else ""))
                               for f in audit["findings"]] + ["policy"] * bool(_violations(audit))) or "none"
        out.append('<tr data-host="%s"><td><a href="#%s">%s</a></td><td>%s</td><td><code>%s</code></td><td>%s</td>'
                   '<td class="%s">%s</td><td class="%s">%s</td><td>%s</td><td class="%s">%s</td></tr>'
                   % (esc(host["name"]), esc(_anchor(host["name"])), esc(host["name"]), esc(s["profile"]),
                      esc(s["fingerprint"]), "-" if s["instances"] is None else s["instances"],
                      _cls_status(s["compliance"]), esc(s["compliance"]), _cls_status(s["probe"]), esc(s["probe"]),
                      drift or "-", "bad" if s["problems"] else "", s["problems"] or "none"))
    out.append("</tbody></table>")

    out.append('<h2>Drift found</h2>')
    rows = []
    for host in hosts:
        for f in (host.get("audit") or {}).get("findings") or []:
            rows.append("<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>"
                        % (esc(host["name"]), esc(f.get("severity")), esc(f.get("id")), esc(f.get("instance")),
                           esc(shown(f.get("expected"))), esc(shown(f.get("actual"))), esc(f.get("message"))))
        for message in _violations(host.get("audit") or {}):
            rows.append("<tr><td>%s</td><td>error</td><td>policy</td><td></td><td></td><td></td><td>%s</td></tr>"
                        % (esc(host["name"]), esc(message)))
    audited = sum(1 for h in hosts if h.get("audit"))
    if rows:
        out.append('<table class="drift"><thead><tr><th>host</th><th>severity</th><th>finding</th><th>instance</th>'
                   "<th>expected</th><th>actual</th><th>message</th></tr></thead><tbody>%s</tbody></table>"
                   % "".join(rows))
    else:
        out.append("<p>%s</p>" % ("No drift in %d audit report%s." % (audited, "" if audited == 1 else "s")
                                   if audited else "No audit reports in this directory."))

    out.append("<h2>Rollback history</h2>")
    rows = []
    for host in hosts:
        state = host.get("state")
        if not state:
            continue
        for entry in state["history"]:
            rows.append("<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>"
                        % (esc(host["name"]), esc(entry.get("time")), esc(entry.get("from") or "(first provisioning)"),
                           esc(entry.get("to")), esc(entry.get("action")), esc(entry.get("user")),
                           esc(entry.get("reason"))))
    if rows:
        out.append('<table class="history"><thead><tr><th>host</th><th>time (UTC)</th><th>from</th><th>to</th>'
                   "<th>action</th><th>user</th><th>reason</th></tr></thead><tbody>%s</tbody></table>" % "".join(rows))
    else:
        out.append("<p>No node state files in this directory.</p>")

    out.extend(sections)
    out.append("</body></html>\n")
    return "".join(out)


def _host_section(host, summary):
    out = ['<section class="host" id="%s" data-host="%s"><h2>%s</h2>'
           % (esc(_anchor(host["name"])), esc(host["name"]), esc(host["name"]))]
    files = ", ".join("%s: %s" % (k, host["files"][k]) for k in KINDS if k in host["files"])
    out.append('<p class="meta">profile %s, fingerprint %s; compliance %s; probe %s<br>%s</p>'
               % (esc(summary["profile"]), esc(summary["fingerprint"]), esc(summary["compliance"]),
                  esc(summary["probe"]), esc(files)))
    body = []
    try:
        model = _host_model(host)
        topo = host.get("topology")
        if topo:
            body.append(topology_svg(host, model))
            body.append(legend_html())
            gpus = topo["gpus"]
            labels = ["GPU%s" % g.get("index") for g in gpus]
            nic_labels = [str(n.get("name") or "NIC%d" % i) for i, n in enumerate(topo.get("nics") or [])]
            body.append('<div class="matrices">%s%s</div>'
                        % (matrix_svg("GPU - GPU links", topo.get("gpu_links") or [], labels, labels),
                           matrix_svg("GPU - NIC links", topo.get("gpu_nic_links") or [], labels, nic_labels)))
            if topo.get("warnings"):
                body.append("<h3>Topology warnings</h3><ul>%s</ul>"
                            % "".join("<li>%s</li>" % esc(w) for w in topo["warnings"]))
        else:
            body.append('<p class="note">No topology for this host in the directory: nothing to draw.</p>')
        if host.get("plan"):
            body.append(_instances_table(host, model))
        else:
            body.append('<p class="note">No plan for this host in the directory.</p>')
        if host.get("validation"):
            body.append(_validation_table(host["validation"]))
    except Exception as exc:  # a shape the checks let through: reported with the host, never a traceback
        host["problems"].append("could not draw this host: %s: %s" % (type(exc).__name__, exc))
        body = []
    if host["problems"]:
        out.append('<div class="problem"><b>Problems with this host\'s artefacts</b><ul>%s</ul></div>'
                   % "".join("<li>%s</li>" % esc(p) for p in host["problems"]))
    for note in host["notes"]:
        out.append('<p class="note">%s</p>' % esc(note))
    out.extend(body)
    out.append("</section>")
    return "".join(out)


def _instances_table(host, model):
    plan = host["plan"]
    rows = []
    for inst in model["instances"]:
        doc = inst["doc"]
        cross = inst["cross"]
        cross_html = ""
        if cross:
            cross_html = ('<br><span class="cross-badge cross-socket">%s</span> CPUs on node %s, memory on node %s, '
                          "GPU on node %s" % (esc(cross["label"]), esc(format_ids(cross["cpu_nodes"]) or "-"),
                                             esc(format_ids(cross["mem_nodes"]) or "-"),
                                             esc(format_ids(cross["gpu_nodes"]))))
        warnings = "".join("<li>%s</li>" % esc(w) for w in doc.get("warnings") or [])
        rows.append('<tr class="instance" data-instance="%s"><td><span class="sw" style="background:%s"></span>%s%s</td>'
                    "<td>%s</td><td>%s</td><td><code>%s</code></td><td>%s %s</td><td>%s</td><td>%s</td>"
                    '<td class="warn"><ul>%s</ul></td></tr>'
                    % (esc(doc.get("name")), inst["colour"], esc(doc.get("name")), cross_html,
                       esc(", ".join("GPU%s" % g for g in doc.get("gpus") or []) or "none"),
                       esc(format_ids(inst["cpu_nodes"]) or "-"), esc(doc.get("cpus") or "not bound"),
                       esc(doc.get("mem_policy")), esc(format_ids(inst["mem_nodes"])), esc(doc.get("profile")),
                       esc(doc.get("fallback") or "-"), warnings))
    head = ("<h3>Instances (plan profile %s)</h3><table class=\"instances\"><thead><tr><th>instance</th><th>GPUs</th>"
            "<th>CPU nodes</th><th>CPUs</th><th>mem policy</th><th>profile</th><th>fallback</th><th>warnings</th>"
            "</tr></thead><tbody>" % esc(plan.get("profile")))
    plan_warn = ""
    own = {"%s: " % i["doc"].get("name") for i in model["instances"]}
    extra = [w for w in plan.get("warnings") or [] if not any(str(w).startswith(p) for p in own)]
    if extra:
        plan_warn = "<ul>%s</ul>" % "".join("<li>%s</li>" % esc(w) for w in extra)
    return head + "".join(rows) + "</tbody></table>" + plan_warn


def _validation_table(report):
    rows = []
    for gpu in report["gpus"]:
        places = gpu.get("placements") if isinstance(gpu.get("placements"), dict) else {}

        def gbps(name):
            p = places.get(name)
            if not isinstance(p, dict):
                return "-"
            return p.get("h2d_pinned_gbps") if p.get("h2d_pinned_gbps") is not None else (p.get("status") or "-")
        rows.append("<tr><td>GPU%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>"
                    % (esc(gpu.get("index")), esc(gpu.get("numa_node")), esc(gpu.get("status")), esc(gbps("local")),
                       esc(gbps("remote")), esc(gbps("unbound")), esc(gpu.get("verdict")),
                       esc(gpu.get("suggested_rollback") or "-")))
    return ("<h3>H2D probe (%s, status %s)</h3><table class=\"validation\"><thead><tr><th>GPU</th><th>node</th>"
            "<th>status</th><th>local GB/s</th><th>remote GB/s</th><th>unbound GB/s</th><th>verdict</th>"
            "<th>suggested rollback</th></tr></thead><tbody>%s</tbody></table>"
            % (esc(report.get("policy")), esc(report.get("status")), "".join(rows)))


def build_report(path, title="gpunuma fleet report", only=None):
    """(html, fleet) for the artefacts under ``path``; ReportError when there are none, or when a host
    named in ``only`` has no artefact there."""
    fleet = load_fleet(path)
    if only is not None:
        unknown = [h for h in only if h not in fleet["hosts"]]
        if unknown:
            raise ReportError("%s has no artefacts for host %s; hosts there: %s"
                              % (path, ", ".join(unknown), ", ".join(sorted(fleet["hosts"]))))
    return render_html(fleet, title, only), fleet
