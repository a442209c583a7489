"""The rows of an ``nvidia-smi topo -m`` matrix (discovery/nvidia/topo_parse.py): each row's readings, the one reading
of the whole matrix, symmetry, the NIC legend and a GPU's entry."""

from __future__ import annotations

from ansible.module_utils.gpunuma.common.cpulist import MAX_NUMA_NODES, canonical_cpulist, parse_nodelist, shown
from ansible.module_utils.gpunuma.common.errors import CpuListError
from ansible.module_utils.gpunuma.discovery.nvidia.topo_text import (
    _ALLOWED_CODES, _code_candidates, _CodeReader, _COLUMN_TITLE, _GPU_LABEL_RE, _header_tokens, _KNOWN_PIECES_RE,
    _LEGEND_DEVICE_RE, _MAX_SKIP_WARNINGS, _MAX_STEPS, _NIC_LEGEND_ENTRY_RE, _NIC_LEGEND_LABEL_RE, _P2P_CODES,
    _read_cells, _span, _value_candidates, _VALUE_HELP)


def _row_candidates(ctx, label, chunks, devices, column, affinity, lineno):
    own = column[label]
    readers = []
    for j in range(len(devices)):
        readers.append(("code", _CodeReader(j == own)))
    is_gpu = _GPU_LABEL_RE.match(label) is not None
    # NIC rows carry no affinity values on most drivers and empty ones on some.
    counts = [len(affinity)] if is_gpu else list(range(0, len(affinity) + 1))
    budget = [_MAX_STEPS, ctx.steps_left]
    found = []
    seen = set()
    for count in counts:
        value_readers = [
            (kind, (lambda s, i, kind=kind: _value_candidates(kind, s, i))) for kind in affinity[:count]
        ]
        for reading in _read_cells(chunks, readers + value_readers, budget):
            codes = reading[: len(devices)]
            values = reading[len(devices) :] if is_gpu else ()
            key = (codes, values)
            if key in seen:
                continue
            seen.add(key)
            found.append((list(codes), list(values), len(chunks) != len(reading)))
    ctx.steps_left = budget[1]
    if budget[1] < 0:
        raise ctx.error(
            "the text is too damaged to read (too many ways to split glued cells across its rows); "
            "expected cells separated by tabs or spaces",
            lineno,
            label,
        )
    if budget[0] < 0:
        raise ctx.error(
            "the row is too damaged to read (too many ways to split its glued cells); "
            "expected cells separated by tabs or spaces",
            lineno,
            label,
        )
    return found


def _cells_shown(chunks):
    text = " ".join(chunks)
    if not text:
        return "(none)"
    return text if len(text) <= 200 else "%s... (%d characters)" % (text[:200], len(text))


def _skip_warning(ctx, skipped, lineno, stripped):
    """One warning per skipped line, up to a few; then one line counting the rest."""
    skipped.append(lineno)
    if len(skipped) <= _MAX_SKIP_WARNINGS:
        ctx.warnings.append("line %d ignored: not a row of the matrix: %r" % (lineno, stripped[:80]))
    elif len(skipped) == _MAX_SKIP_WARNINGS + 1:
        ctx.warnings.append("more lines ignored as not rows of the matrix (not listed one by one)")


def _diagnose(label, chunks, devices, column, affinity):
    """Say what is wrong with a row no reading fits: (message, looks_like_p2p)."""
    own = column[label]
    is_gpu = _GPU_LABEL_RE.match(label) is not None
    if is_gpu and affinity:
        expected = "%d link code(s) (columns %s) then %d value(s) (%s)" % (
            len(devices),
            _span(devices),
            len(affinity),
            ", ".join(_COLUMN_TITLE[k] for k in affinity),
        )
        positional = len(chunks) == len(devices) + len(affinity)
    else:
        expected = "%d link code(s) (columns %s)" % (len(devices), _span(devices))
        positional = len(devices) <= len(chunks) <= len(devices) + (0 if is_gpu else len(affinity))
    for idx, cell in enumerate(chunks):
        if not _KNOWN_PIECES_RE.match(cell):
            where = "in column %s" % devices[idx] if idx < len(devices) else "after the link codes"
            if cell in _P2P_CODES:
                return (
                    "%s %s is a peer-to-peer status, not a link code: this is `nvidia-smi topo -p2p` "
                    "output; expected `nvidia-smi topo -m` link codes (%s)" % (shown(cell), where, _ALLOWED_CODES),
                    True,
                )
            return "%s %s is not a link code; allowed: %s" % (shown(cell), where, _ALLOWED_CODES), False
    if positional:
        for j, title in enumerate(devices):
            cell = chunks[j]
            if j == own:
                if cell != "X":
                    return "expected X (the row's own column) in column %s, found %s" % (title, shown(cell)), False
            elif cell == "X":
                return "found X in column %s; X may only mark the row's own column %s" % (title, label), False
            elif not any(end == len(cell) for _unused, end in _code_candidates(cell, 0, False)):
                return (
                    "expected a link code (%s) in column %s, found %s" % (_ALLOWED_CODES, title, shown(cell)),
                    False,
                )
        for kind, cell in zip(affinity, chunks[len(devices) :]):
            if not any(end == len(cell) for _unused, end in _value_candidates(kind, cell, 0)):
                return "expected %s (%s), found %s" % (_COLUMN_TITLE[kind], _VALUE_HELP[kind], shown(cell)), False
    return (
        "expected %s, found %d cell(s): %s; cells are missing, extra, or glued together in a way "
        "that cannot be read unambiguously" % (expected, len(chunks), _cells_shown(chunks)),
        False,
    )


def _agreeing(label, candidates, known, column):
    """The readings of row ``label`` whose cells mirror those of the rows already read."""
    own = column[label]
    kept = []
    for candidate in candidates:
        codes = candidate[0]
        if all(codes[column[other]] == known[other][0][own] for other in known if other != label):
            kept.append(candidate)
    return kept


def _splits(row):
    """How many cells a row's first reading split out of glued chunks."""
    _lineno, candidates, chunks = row
    return len(candidates[0][0]) + len(candidates[0][1]) - len(chunks)


def _resolve(ctx, rows, devices, column, affinity):
    """Pick one reading per row.

    Rows read as printed are trusted. A row that needed glued cells split
    again must agree with the mirror cells of the trusted rows (the matrix
    is symmetric): that settles how many digits belong to a glued ``NV#``,
    and rejects a "repair" that only fits because a cell is missing.
    """
    trusted = {}
    for label, (lineno, candidates, chunks) in rows.items():
        if len(candidates) == 1 and not candidates[0][2]:
            trusted[label] = candidates[0]

    chosen = dict(trusted)
    # the least damaged rows first: once read, they check the others too
    pending = sorted(
        (label for label in devices if label not in trusted),
        key=lambda label: (len(rows[label][1]) > 1, _splits(rows[label])),
    )
    for label in pending:
        lineno, candidates, chunks = rows[label]
        kept = _agreeing(label, candidates, chosen, column)
        if len(kept) == 1:
            chosen[label] = kept[0]
            continue
        if not kept:
            message, _p2p = _diagnose(label, chunks, devices, column, affinity)
            raise ctx.error(
                message + " (the only readings found disagree with the matching cells of the other rows)",
                lineno,
                label,
            )
        shown = " | ".join(" ".join(c[0]) + (" " + " ".join(c[1]) if c[1] else "") for c in kept[:3])
        raise ctx.error(
            "cells glued together can be read in more than one way (%s); expected cells separated "
            "by tabs or spaces" % shown,
            lineno,
            label,
        )
    result = {}
    for label in devices:
        codes, values, glued = chosen[label]
        if glued:
            ctx.warnings.append(
                "line %d: row %s had cells glued together; read as %s"
                % (rows[label][0], label, _cells_shown(list(codes) + list(values)))
            )
        result[label] = (codes, values)
    return result


def _check_symmetry(ctx, chosen, devices, column):
    for a_index, a in enumerate(devices):
        for b in devices[a_index + 1 :]:
            ab = chosen[a][0][column[b]]
            ba = chosen[b][0][column[a]]
            if ab != ba:
                ctx.warnings.append(
                    "link %s-%s is %s in row %s but %s in row %s; row values are used" % (a, b, ab, a, ba, b)
                )


def _nic_names(ctx, lines, end_index, nic_labels):
    legend = {}
    for line in lines[end_index:]:
        if _header_tokens(line) is not None:
            break
        match = _NIC_LEGEND_ENTRY_RE.match(line)
        if match:
            name, device = match.groups()
            if not _LEGEND_DEVICE_RE.match(device):
                # IB_DEVICE_NAME_MAX is 64: anything else is not a device name
                ctx.warnings.append(
                    "NIC Legend entry %s names %s, not an RDMA device name (letters, digits, _ . : -, at most "
                    "64); ignored" % (name, shown(device, 30))
                )
                continue
            if name in legend and legend[name] != device:
                ctx.warnings.append(
                    "NIC Legend names %s twice (%s, %s); the first is used" % (name, legend[name], device)
                )
                continue
            legend.setdefault(name, device)
    names = []
    unresolved = []
    for label in nic_labels:
        if _NIC_LEGEND_LABEL_RE.match(label):
            if label in legend:
                names.append(legend[label])
            else:
                names.append(label)
                unresolved.append(label)
        else:
            names.append(label)
    if unresolved:
        ctx.warnings.append(
            "NIC Legend %s: %s kept as named in the matrix, not resolved to device names"
            % ("missing" if not legend else "incomplete", ", ".join(unresolved))
        )
    extra = sorted(set(legend) - set(nic_labels))
    if extra and nic_labels:
        ctx.warnings.append("NIC Legend lists %s, which the matrix has no column for" % ", ".join(extra))
    return names


def _gpu_entry(ctx, label, lineno, affinity, values):
    by_kind = dict(zip(affinity, values))
    entry = {
        "index": int(_GPU_LABEL_RE.match(label).group(1)),
        "cpu_affinity": None,
        "numa_affinity": [],
        "gpu_numa_id": None,
    }
    try:
        cpu = by_kind.get("cpu_affinity", "N/A")
        if cpu != "N/A":
            entry["cpu_affinity"] = canonical_cpulist(cpu, "CPU Affinity")
        numa = by_kind.get("numa_affinity", "N/A")
        if numa != "N/A":
            entry["numa_affinity"] = sorted(parse_nodelist(numa, "NUMA Affinity"))
    except CpuListError as exc:
        raise ctx.error(str(exc), lineno, label)
    gpu_numa = by_kind.get("gpu_numa_id", "N/A")
    if gpu_numa != "N/A":
        if len(gpu_numa.lstrip("0")) > len(str(MAX_NUMA_NODES)) or int(gpu_numa) >= MAX_NUMA_NODES:
            raise ctx.error(
                "GPU NUMA ID %s is out of range; allowed: NUMA node ids 0-%d or N/A"
                % (shown(gpu_numa, 12), MAX_NUMA_NODES - 1),
                lineno,
                label,
            )
        entry["gpu_numa_id"] = int(gpu_numa)
    return entry
