"""The CPU layout where sysfs is not read: ``lscpu`` output, and the NUMA nodes a topo text leaves out.

``nvidia-smi topo -m`` lists only the NUMA nodes that hold a GPU (a DGX A100
in NPS4 shows nodes 1, 3, 5 and 7 of 8). The CPU ids it leaves out still
prove that the other nodes exist: ``infer_missing_nodes`` places them when
the layout allows exactly one reading, and otherwise names the CPUs that
cannot be placed, so that the planner refuses to bind CPUs rather than put
housekeeping and workers on the wrong nodes.

``parse_lscpu`` reads the CPU layout a user captured with ``lscpu`` beside the
topo text: every node's CPUs, the hyperthread siblings and the L3 domains
(``lscpu -p`` / ``lscpu --parse=CPU,CORE,SOCKET,NODE,CACHE`` and
``lscpu -e``), or only the nodes and sockets (the summary ``lscpu`` prints).
Its result has the shape of the sysfs reader's host, so one function turns
either into the topology's nodes.
"""

from __future__ import annotations

import re

from ansible.module_utils.gpunuma.common.cpulist import (
    MAX_CPUS,
    MAX_NUMA_NODES,
    format_cpulist,
    infer_sibling_offset,
    parse_cpulist,
    runs,
)
from ansible.module_utils.gpunuma.common.errors import CpuListError, LscpuError

#: An lscpu capture larger than this is not lscpu output (8192 CPUs of
#: ``lscpu -e`` are under 1 MiB).
MAX_LSCPU_CHARS = 2 * 1024 * 1024

_SUMMARY_NODE_RE = re.compile(r"NUMA node(\d{1,4}) CPU\(s\):\s*(\S*)\s*$")
_SUMMARY_SOCKETS_RE = re.compile(r"Socket\(s\):\s*(\d{1,4})\s*$")
_SUMMARY_THREADS_RE = re.compile(r"Thread\(s\) per core:\s*(\d{1,2})\s*$")


def infer_missing_nodes(known):
    """Nodes the topo text leaves out, from the CPU ids it leaves out.

    ``known``: ``{node_id: frozenset(cpus)}`` of the CPU-bearing nodes the
    text lists. Returns ``(inferred, unplaced)``: ``inferred`` a list of
    ``(node_id, frozenset(cpus))``, ``unplaced`` the CPU ids that exist but
    cannot be placed on a node (empty when nothing is missing or everything
    was placed).

    The CPUs that exist: ``0..2d-1`` when every listed node is the standard
    x86 two-range layout with sibling offset ``d`` (``infer_sibling_offset``),
    else ``0..`` the highest listed CPU. The missing ones are placed only
    when (a) every listed node holds the same number of cores as one block
    of consecutive ids (and its siblings ``d`` above), (b) node ids rise with
    CPU ids, as the kernel numbers the nodes of an x86 machine from the
    firmware's proximity domains, and (c) every gap between listed nodes
    holds exactly as many such blocks as node ids are missing there (after
    the last listed node, any whole number of blocks). Anything else is
    ``unplaced``.
    """
    known = dict((n, frozenset(c)) for n, c in known.items() if c)
    if not known:
        return [], frozenset()
    every = frozenset().union(*known.values())
    offset = infer_sibling_offset(known)
    top = 2 * offset if offset is not None else max(every) + 1
    missing = frozenset(range(top)) - every
    if not missing:
        return [], frozenset()
    low_end = offset if offset is not None else top
    low = dict((n, frozenset(c for c in cpus if c < low_end)) for n, cpus in known.items())
    low_missing = frozenset(c for c in missing if c < low_end)
    if offset is not None and missing != low_missing | frozenset(c + offset for c in low_missing):
        return [], missing
    if any(len(runs(cpus)) != 1 for cpus in low.values()):
        return [], missing
    sizes = set(len(cpus) for cpus in low.values())
    if len(sizes) != 1:
        return [], missing
    size = sizes.pop()
    order = sorted(known, key=lambda n: min(low[n]))
    if order != sorted(known):
        return [], missing
    inferred = _fill_gaps(order, low, size, low_end, offset)
    if inferred is None or any(node_id >= MAX_NUMA_NODES for node_id, _unused in inferred):
        return [], missing
    return inferred, frozenset()


def _fill_gaps(order, low, size, low_end, offset):
    """``[(node_id, cpus)]`` for the blocks between (and after) the listed nodes, or None when a gap does not fit."""
    inferred = []
    previous_id = -1
    previous_end = -1
    for node_id in order + [None]:
        start = min(low[node_id]) if node_id is not None else low_end
        gap = start - previous_end - 1
        if gap % size:
            return None
        count = gap // size
        if node_id is not None and count != node_id - previous_id - 1:
            return None
        for k in range(count):
            first = previous_end + 1 + k * size
            block = frozenset(range(first, first + size))
            if offset is not None:
                block |= frozenset(c + offset for c in block)
            inferred.append((previous_id + 1 + k, block))
        if node_id is not None:
            previous_id = node_id
            previous_end = max(low[node_id])
    return inferred


def _int(text, what, limit, source, lineno):
    if not text.isdigit() or len(text) > 6 or int(text) >= limit:
        raise LscpuError("%s line %d: %s %r is not a whole number below %d" % (source, lineno, what, text, limit))
    return int(text)


def _columns_row(names, values, source, lineno):
    """One CPU row of ``lscpu -p``/``-e``: id, node, socket, core and the L3 id (None when absent)."""
    if len(values) < len(names):
        raise LscpuError("%s line %d: %d columns, the header names %d" % (source, lineno, len(values), len(names)))
    # "-" is what lscpu -e prints for an offline CPU's node, socket, core and caches.
    row = dict((name, "" if value == "-" else value) for name, value in zip(names, values))
    cpu = _int(row["cpu"], "CPU", MAX_CPUS, source, lineno)
    node = _int(row["node"], "node", MAX_NUMA_NODES, source, lineno) if row.get("node", "") != "" else None
    socket = _int(row["socket"], "socket", MAX_CPUS, source, lineno) if row.get("socket", "") != "" else None
    core = _int(row["core"], "core", MAX_CPUS, source, lineno) if row.get("core", "") != "" else None
    l3 = row.get("l3")
    if l3:
        l3 = _int(l3, "L3", MAX_CPUS, source, lineno)
    else:
        l3 = None
    online = row.get("online", "yes").lower() != "no"
    return cpu, node, socket, core, l3, online


def _header(line):
    """Column names of a ``lscpu -p`` comment header or an ``lscpu -e`` header, lower case; caches split."""
    if line.startswith("#"):
        names = [n.strip().lower() for n in line[1:].split(",")]
        sep = ","
    else:
        names = line.lower().split()
        sep = None
    out = []
    for name in names:
        if ":" in name:
            out.extend(name.split(":"))
        else:
            out.append(name)
    return out, sep


def _split(line, sep):
    values = line.split(sep) if sep else line.split()
    out = []
    for value in values:
        value = value.strip()
        if ":" in value:
            out.extend(value.split(":"))
        else:
            out.append(value)
    return out


def _summary_layout(summary_nodes, sockets, threads, source):
    """The layout the lscpu summary gives: nodes and their CPUs, sockets, threads per core (no CPU rows)."""
    if not summary_nodes:
        raise LscpuError("%s: no NUMA node lines" % source)
    nodes = [{"id": n, "cpus": format_cpulist(c)} for n, c in sorted(summary_nodes.items())]
    return {"numa_nodes": nodes, "cpus": [], "sockets": sockets, "threads_per_core": threads, "format": "summary"}


def parse_lscpu(text, source="lscpu"):
    """The CPU layout of an ``lscpu`` capture, as a host mapping ``nodes.nodes_from_host`` reads.

    Returns ``{"numa_nodes": [{"id", "cpus"}], "cpus": [{"id", "siblings", "l3"}], "sockets": int|None,
    "format": "parse"|"extended"|"summary"}``; ``cpus`` is empty for the summary (it lists no CPU's
    core nor cache), which gives ``threads_per_core`` instead. Raises ``LscpuError`` naming the line.
    """
    if not isinstance(text, str) or len(text) > MAX_LSCPU_CHARS:
        raise LscpuError("%s: not lscpu text (more than %d characters)" % (source, MAX_LSCPU_CHARS))
    lines = text.splitlines()
    names = sep = None
    rows = []
    summary_nodes = {}
    sockets = None
    threads = None
    fmt = None
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        match = _SUMMARY_NODE_RE.match(line)
        if match and fmt in (None, "summary"):
            fmt = "summary"
            try:
                summary_nodes[int(match.group(1))] = parse_cpulist(match.group(2), "%s line %d" % (source, lineno))
            except CpuListError as exc:
                raise LscpuError(str(exc))
            continue
        match = _SUMMARY_SOCKETS_RE.match(line)
        if match:
            sockets = int(match.group(1))
            continue
        match = _SUMMARY_THREADS_RE.match(line)
        if match:
            threads = int(match.group(1)) or None
            continue
        if fmt == "summary":
            continue
        if line.startswith("#"):
            candidate, candidate_sep = _header(line)
            if "cpu" in candidate and "node" in candidate:
                names, sep, fmt = candidate, candidate_sep, "parse"
            continue
        if names is None and line.split()[0].upper() == "CPU" and "NODE" in line.upper():
            names, sep = _header(line)
            fmt = "extended"
            continue
        if names is not None:
            values = _split(line, sep)
            if not values or not values[0].isdigit():
                continue  # not a CPU row: a shell prompt, an exit status, a note around the capture
            rows.append(_columns_row(names, values, source, lineno))
    if fmt == "summary":
        return _summary_layout(summary_nodes, sockets, threads, source)
    if not rows:
        raise LscpuError("%s: neither `lscpu -p`, `lscpu -e` nor the lscpu summary (NUMA nodeN CPU(s): lines)"
                         % source)
    return _layout_from_rows(rows, source, fmt)


def _layout_from_rows(rows, source, fmt):
    node_cpus = {}
    by_core = {}
    by_l3 = {}
    socket_ids = set()
    seen = set()
    for cpu, node, socket, core, l3, online in rows:
        if cpu in seen:
            raise LscpuError("%s: CPU %d is listed twice" % (source, cpu))
        seen.add(cpu)
        if not online:
            continue
        if node is None:
            raise LscpuError("%s: CPU %d has no NUMA node; capture with `lscpu -p=CPU,CORE,SOCKET,NODE,CACHE`"
                             % (source, cpu))
        node_cpus.setdefault(node, set()).add(cpu)
        if socket is not None:
            socket_ids.add(socket)
        if core is not None:
            # lscpu numbers cores uniquely across the machine in -p; -e as well.
            by_core.setdefault((socket, core), set()).add(cpu)
        if l3 is not None:
            by_l3.setdefault(l3, set()).add(cpu)
    cpus = []
    for cpu in sorted(seen):
        entry = {"id": cpu}
        for group in by_core.values():
            if cpu in group:
                entry["siblings"] = format_cpulist(group)
        for group in by_l3.values():
            if cpu in group:
                entry["l3"] = format_cpulist(group)
        cpus.append(entry)
    nodes = [{"id": n, "cpus": format_cpulist(c)} for n, c in sorted(node_cpus.items())]
    return {"numa_nodes": nodes, "cpus": cpus, "sockets": len(socket_ids) or None, "format": fmt}
