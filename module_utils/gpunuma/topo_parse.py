"""Parser for the text of ``nvidia-smi topo -m``.

The matrix has looked much the same since the 3xx drivers, but the text
users save or paste varies a lot:

* cells separated by tabs (as printed) or by spaces (tabs expanded when the
  text went through a terminal, a web page or an issue tracker), so columns
  rarely line up under their headers and the empty cells nvidia-smi prints
  (``0\\t\\tN/A``) vanish or multiply; cells are therefore read in order,
  never by position;
* ANSI underline codes around the header (``\\x1b[4m ... \\x1b[0m``), kept or
  with the escape character lost (``[4mGPU0``);
* NICs as ``NIC0..N`` columns resolved through the ``NIC Legend`` (which may
  be non-contiguous, ``NIC2: mlx5_4``), or named directly (``mlx5_0``,
  ``mlx4_0``) on older drivers; NIC rows with or without trailing empty
  affinity cells;
* affinity columns: only ``CPU Affinity`` on old drivers, then
  ``NUMA Affinity``, then ``GPU NUMA ID`` (filled on Grace systems); any of
  them ``N/A``; CPU lists as ranges or comma lists, NUMA affinity as a
  number, range or list;
* the legacy ``SOC`` link code (read as ``SYS``), ``NV#`` with any count;
* CRLF line endings, trailing blanks, indented (markdown-quoted) blocks,
  shell prompts, comments and other text around the matrix;
* rows damaged in copying: two cells glued together (``NV18NV18``,
  ``SYS0-47``, ``0N/A``) are split again when exactly one reading fits the
  header (the row's own ``X`` on the diagonal, link codes then the affinity
  values in order) and agrees with the mirror cells of the symmetric matrix,
  which settle how many digits belong to a glued ``NV#`` and expose a
  "repair" that only fits because a cell is missing. Two numbers glued
  together (``0-470``) are never guessed at: the same text also reads as a
  CPU list with a missing NUMA cell.

Anything that cannot be read completely raises :class:`TopoParseError` with
the source, the line and what was expected; a result is never returned with
rows or columns missing.
"""

from __future__ import annotations

import re

from ansible.module_utils.gpunuma.cpulist import canonical_cpulist, parse_cpulist
from ansible.module_utils.gpunuma.errors import CpuListError, TopoParseError

__all__ = ["parse_topo_matrix", "LINK_CODES", "AFFINITY_COLUMNS"]

#: Link codes a parse can contain (``NV#`` stands for ``NV`` + a link count).
LINK_CODES = ("X", "NV#", "PIX", "PXB", "PHB", "NODE", "SYS")

#: Affinity columns, in the order nvidia-smi prints them, with their header text.
AFFINITY_COLUMNS = (
    ("cpu_affinity", "CPU Affinity"),
    ("numa_affinity", "NUMA Affinity"),
    ("gpu_numa_id", "GPU NUMA ID"),
)
_COLUMN_TITLE = dict(AFFINITY_COLUMNS)
_VALUE_HELP = {
    "cpu_affinity": "a CPU list such as 0-23,48-71 or N/A",
    "numa_affinity": "a NUMA node id, range or list such as 0, 0-1 or N/A",
    "gpu_numa_id": "a NUMA node id or N/A",
}
_ALLOWED_CODES = "X, NV# (e.g. NV12), PIX, PXB, PHB, NODE, SYS (legacy SOC is read as SYS)"

# No code is a prefix of another; NV# is matched apart because its digit
# count is what glued cells blur.
_PLAIN_CODES = {"SYS": "SYS", "SOC": "SYS", "NODE": "NODE", "PHB": "PHB", "PXB": "PXB", "PIX": "PIX"}
_P2P_CODES = {"OK", "CNS", "GNS", "TNS", "NS", "DR", "U"}

# ESC-introduced CSI sequences, plus the bare "[4m" left when a paste lost the ESC.
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[@-Z\\-_]|\[[0-9;]*m")
_INVISIBLE_RE = re.compile("[\ufeff\u200b\u200c\u200d\u2060]")
_LINE_SPLIT_RE = re.compile(r"\r\n|\r|\n")

_HEADER_PHRASES = (
    # "GPU NUMA ID" first: it contains "NUMA" and must not be taken for part of another title.
    ("gpu_numa_id", re.compile(r"GPU\s*NUMA\s*ID", re.IGNORECASE)),
    ("cpu_affinity", re.compile(r"CPU\s*Affinity", re.IGNORECASE)),
    ("numa_affinity", re.compile(r"NUMA\s*Affinity", re.IGNORECASE)),
)
_MARK = "\x00"
_CAPTION_RE = re.compile(r"^[^\t:]*:\s*(?=GPU0(?!\d))")
_GLUED_LABEL_RE = re.compile(r"(?:GPU|NIC)\d+")
_LABEL_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.:\-]*\Z")
_GPU_LABEL_RE = re.compile(r"GPU(\d+)\Z")
_NIC_LEGEND_LABEL_RE = re.compile(r"NIC\d+\Z")
_NIC_LEGEND_ENTRY_RE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_LEGEND_RE = re.compile(r"^(?:NIC\s+)?Legend\b", re.IGNORECASE)

_LIST_RE = re.compile(r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*\Z")
_NUMERIC_RUN_RE = re.compile(r"[\d,\-]+")
# What a cell (or several glued cells) can be made of at all.
_KNOWN_PIECES_RE = re.compile(r"(?:X|SYS|SOC|NODE|PHB|PXB|PIX|NV\d+|[Nn]/[Aa]|[\d,\-]+)+\Z")

_MAX_CANDIDATES = 8
_MAX_STEPS = 200000


class _NotTopoMatrix(TopoParseError):
    """The matrix found is another nvidia-smi matrix (``topo -p2p``)."""


# --------------------------------------------------------------------------
# text clean-up and header


def _clean_lines(text):
    text = _INVISIBLE_RE.sub("", text)
    lines = []
    for line in _LINE_SPLIT_RE.split(text):
        line = _ANSI_RE.sub("", line).replace("\xa0", " ")
        lines.append(line.rstrip())
    return lines


def _split_label_token(token):
    """Split labels glued when their separators were lost (``GPU6GPU7mlx5_0``)."""
    pieces = []
    pos = 0
    for match in _GLUED_LABEL_RE.finditer(token):
        if match.start() > pos:
            pieces.append(token[pos : match.start()])
        pieces.append(match.group())
        pos = match.end()
    if pos < len(token):
        pieces.append(token[pos:])
    return pieces


def _header_tokens(line):
    """Column titles of a header line, or None when the line is not a header.

    Returns a list of ("device", label) and ("affinity", key) in order.
    """
    caption = _CAPTION_RE.match(line)
    if caption:
        # "GPU Topology: GPU0 GPU1 ..." when a report printed its caption on the header line
        line = line[caption.end() :]
    marked = line
    for key, phrase in _HEADER_PHRASES:
        marked = phrase.sub(" %s%s%s " % (_MARK, key, _MARK), marked)
    tokens = []
    for word in marked.split():
        if word.startswith(_MARK) and word.endswith(_MARK) and len(word) > 2:
            tokens.append(("affinity", word.strip(_MARK)))
            continue
        for piece in _split_label_token(word):
            tokens.append(("device", piece))
    if not tokens or tokens[0] != ("device", "GPU0"):
        return None
    for kind, value in tokens:
        # a "label" made only of link codes and numbers is a glued data row
        if kind == "device" and (not _LABEL_RE.match(value) or _KNOWN_PIECES_RE.match(value)):
            return None
    return tokens


# --------------------------------------------------------------------------
# cell readers: each returns [(value, end), ...] for text starting at s[i]


def _code_candidates(s, i, own_column):
    if own_column:
        return [("X", i + 1)] if s.startswith("X", i) else []
    out = []
    for word, code in _PLAIN_CODES.items():
        if s.startswith(word, i):
            out.append((code, i + len(word)))
    if s.startswith("NV", i):
        j = i + 2
        while j < len(s) and s[j].isdigit():
            j += 1
            out.append(("NV%d" % int(s[i + 2 : j]), j))
    return out


def _valid_list(piece):
    if not _LIST_RE.match(piece):
        return False
    try:
        parse_cpulist(piece)
    except CpuListError:
        return False
    return True


def _value_candidates(kind, s, i):
    out = []
    if s[i : i + 3].upper() == "N/A":
        out.append(("N/A", i + 3))
    run = _NUMERIC_RUN_RE.match(s, i)
    if run:
        text = run.group()
        for end in range(len(text), 0, -1):
            piece = text[:end]
            if kind == "gpu_numa_id":
                ok = piece.isdigit()
            else:
                ok = _valid_list(piece)
            if ok:
                out.append((piece, i + end))
    return out


def _read_cells(chunks, readers, budget):
    """Every way of reading ``chunks`` as exactly the cells ``readers`` describe.

    A chunk (whitespace-separated text) holds one cell or several glued
    cells; a cell never spans two chunks. Two numbers are never split apart
    inside a chunk (see the module docstring). Returns up to
    ``_MAX_CANDIDATES`` distinct readings.
    """
    results = []
    total = len(readers)

    def rec(ci, pos, k, acc, prev_numeric):
        budget[0] -= 1
        if budget[0] < 0 or len(results) >= _MAX_CANDIDATES:
            return
        if ci == len(chunks):
            if k == total:
                results.append(tuple(acc))
            return
        if k == total or len(chunks) - ci > total - k:
            return
        s = chunks[ci]
        kind, reader = readers[k]
        for value, end in reader(s, pos):
            starts_numeric = s[pos].isdigit()
            if pos > 0 and prev_numeric and kind != "code" and starts_numeric:
                continue
            acc.append(value)
            numeric_end = kind != "code" and s[end - 1].isdigit()
            if end == len(s):
                rec(ci + 1, 0, k + 1, acc, False)
            else:
                rec(ci, end, k + 1, acc, numeric_end)
            acc.pop()

    rec(0, 0, 0, [], False)
    return results


# --------------------------------------------------------------------------
# the parser


class _Ctx:
    def __init__(self, source):
        self.source = source
        self.warnings = []

    def error(self, message, lineno=None, row=None, cls=TopoParseError):
        where = self.source
        if lineno is not None:
            where += ": line %d" % lineno
        if row is not None:
            where += ": row %s" % row
        return cls("%s: %s" % (where, message))


def parse_topo_matrix(text, source="nvidia-smi topo -m output"):
    """Parse the text of ``nvidia-smi topo -m``.

    Returns ``{"gpus": [{"index", "cpu_affinity", "numa_affinity",
    "gpu_numa_id"}], "nics": [names], "gpu_links": [[code]],
    "gpu_nic_links": [[code]], "warnings": [str]}``; ``source`` names the
    input in error and warning messages. Everything before the header line
    (the one whose first column is ``GPU0``) is skipped; reading stops at
    ``Legend:``. Raises :class:`TopoParseError` when the text cannot be read
    completely.
    """
    if not isinstance(source, str) or not source:
        source = "nvidia-smi topo -m output"
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        raise TopoParseError(
            "%s: expected the text of `nvidia-smi topo -m`, got %s" % (source, type(text).__name__)
        )
    if not text.strip():
        raise TopoParseError(
            "%s: the text is empty; expected the output of `nvidia-smi topo -m` "
            "(a header line whose first column is GPU0, then one row per GPU and NIC)" % source
        )
    lines = _clean_lines(text)
    headers = [i for i, line in enumerate(lines) if _header_tokens(line) is not None]
    if not headers:
        raise TopoParseError(
            "%s: no topology header found in %d line(s); expected a line whose first column "
            "is GPU0 (e.g. '\\tGPU0\\tGPU1\\t...\\tCPU Affinity\\tNUMA Affinity'), followed by one "
            "row per GPU and NIC" % (source, len(lines))
        )
    first_error = None
    for header_index in headers:
        ctx = _Ctx(source)
        try:
            result = _parse_block(ctx, lines, header_index)
        except _NotTopoMatrix as exc:
            first_error = first_error or exc
            continue
        if first_error is not None:
            result["warnings"].insert(0, "%s (skipped)" % first_error)
        return result
    raise first_error


def _parse_block(ctx, lines, header_index):
    header_lineno = header_index + 1
    tokens = _header_tokens(lines[header_index])
    devices = []
    affinity = []
    for kind, value in tokens:
        if kind == "device":
            if affinity:
                raise ctx.error(
                    "column %r comes after the affinity columns; expected GPU and NIC columns "
                    "first, then %s" % (value, ", ".join(t for _, t in AFFINITY_COLUMNS)),
                    header_lineno,
                )
            devices.append(value)
        else:
            if value in affinity:
                raise ctx.error("column %r appears twice in the header" % _COLUMN_TITLE[value], header_lineno)
            affinity.append(value)

    devices = _repair_header_labels(ctx, lines, header_index, devices)
    if len(set(devices)) != len(devices):
        dup = sorted(set(d for d in devices if devices.count(d) > 1))
        raise ctx.error("column(s) %s appear more than once in the header" % ", ".join(dup), header_lineno)
    gpu_labels = [d for d in devices if _GPU_LABEL_RE.match(d)]
    nic_labels = [d for d in devices if not _GPU_LABEL_RE.match(d)]
    column = dict((label, i) for i, label in enumerate(devices))

    # rows: label -> (lineno, [candidates]); candidates are (codes, values, glued)
    rows = {}
    skipped = []
    end_index = len(lines)
    labels_by_length = sorted(devices, key=len, reverse=True)
    for index in range(header_index + 1, len(lines)):
        lineno = index + 1
        stripped = lines[index].strip()
        if len(rows) == len(devices):
            end_index = index
            break
        if not stripped:
            continue
        if _LEGEND_RE.match(stripped) or _header_tokens(stripped) is not None:
            end_index = index
            break
        chunks = stripped.split()
        first = chunks[0]
        labels = [l for l in labels_by_length if first == l or first.startswith(l)]
        if first in devices:
            labels = [first]
        if not labels:
            row_like = re.match(r"(GPU\d+|NIC\d+)", first)
            if row_like and _KNOWN_PIECES_RE.match("".join(chunks[1:]) or "-"):
                raise ctx.error(
                    "row %s is not among the header's columns (%s); the header or the row is damaged"
                    % (row_like.group(1), " ".join(devices)),
                    lineno,
                )
            skipped.append(lineno)
            ctx.warnings.append("line %d ignored: not a row of the matrix: %r" % (lineno, stripped[:80]))
            continue
        candidates = []
        failure = None
        for label in labels:
            rest = list(chunks)
            glued_label = rest[0] != label
            if glued_label:
                rest[0] = rest[0][len(label) :]
            else:
                rest = rest[1:]
            if label in rows:
                if glued_label:
                    continue
                raise ctx.error(
                    "row %s appears twice (first on line %d); expected one row per column"
                    % (label, rows[label][0]),
                    lineno,
                )
            found = _row_candidates(ctx, label, rest, devices, column, affinity, lineno)
            if found:
                candidates = [(codes, values, glued or glued_label) for codes, values, glued in found]
                break
            if failure is None:
                failure = (label, rest)
        if not candidates:
            if failure is None:
                raise ctx.error(
                    "row %s appears twice (first on line %d); expected one row per column"
                    % (labels[0], rows[labels[0]][0]),
                    lineno,
                )
            label, rest = failure
            message, p2p = _diagnose(label, rest, devices, column, affinity)
            raise ctx.error(message, lineno, label, cls=_NotTopoMatrix if p2p else TopoParseError)
        rows[label] = (lineno, candidates, rest)

    missing = [d for d in devices if d not in rows]
    if missing:
        message = (
            "the matrix is incomplete: the header (line %d) lists %d column(s) (%s) but there is "
            "no row for %s; expected one row per GPU and NIC column (output truncated?)"
            % (header_lineno, len(devices), _span(devices), ", ".join(missing))
        )
        if skipped:
            message += "; line(s) %s could not be read as rows" % ", ".join(str(n) for n in skipped)
        raise ctx.error(message)

    chosen = _resolve(ctx, rows, devices, column, affinity)
    _check_symmetry(ctx, chosen, devices, column)

    nics = _nic_names(ctx, lines, end_index, nic_labels)
    gpus = []
    gpu_links = []
    gpu_nic_links = []
    for label in gpu_labels:
        codes, values = chosen[label]
        gpus.append(_gpu_entry(ctx, label, rows[label][0], affinity, values))
        gpu_links.append([codes[column[g]] for g in gpu_labels])
        gpu_nic_links.append([codes[column[n]] for n in nic_labels])

    indexes = [g["index"] for g in gpus]
    if indexes != list(range(len(indexes))):
        ctx.warnings.append(
            "GPU columns are %s, not GPU0..GPU%d in order; indexes are taken from the labels"
            % (" ".join(gpu_labels), len(gpu_labels) - 1)
        )
    if any("SOC" in line for line in lines[header_index + 1 : end_index]):
        ctx.warnings.append("legacy link code SOC read as SYS")
    return {
        "gpus": gpus,
        "nics": nics,
        "gpu_links": gpu_links,
        "gpu_nic_links": gpu_nic_links,
        "warnings": ctx.warnings,
    }


def _span(labels):
    if len(labels) <= 3:
        return " ".join(labels)
    return "%s..%s" % (labels[0], labels[-1])


def _repair_header_labels(ctx, lines, header_index, devices):
    """Use the row labels when header titles were glued together beyond repair.

    The matrix is square: its rows carry the same labels as its device
    columns, in the same order, so ``mlx5_0mlx5_1`` in a header whose rows
    start ``mlx5_0`` and ``mlx5_1`` is two columns.
    """
    row_labels = []
    for line in lines[header_index + 1 :]:
        stripped = line.strip()
        if not stripped:
            if row_labels:
                break
            continue
        if _LEGEND_RE.match(stripped) or _header_tokens(stripped) is not None:
            break
        chunks = stripped.split()
        if len(chunks) > 1 and _LABEL_RE.match(chunks[0]) and _KNOWN_PIECES_RE.match(chunks[1]):
            row_labels.append(chunks[0])
    if row_labels != devices and "".join(row_labels) == "".join(devices):
        ctx.warnings.append(
            "line %d: header titles were glued together; columns read from the row labels: %s"
            % (header_index + 1, " ".join(row_labels))
        )
        return row_labels
    original = lines[header_index].split()
    if any(len(_split_label_token(w)) > 1 for w in original if _MARK not in w):
        ctx.warnings.append(
            "line %d: header titles were glued together; split into %s"
            % (header_index + 1, " ".join(devices))
        )
    return devices


def _row_candidates(ctx, label, chunks, devices, column, affinity, lineno):
    own = column[label]
    readers = []
    for j in range(len(devices)):
        readers.append(("code", (lambda s, i, own_col=(j == own): _code_candidates(s, i, own_col))))
    is_gpu = _GPU_LABEL_RE.match(label) is not None
    # NIC rows carry no affinity values on most drivers and empty ones on some.
    counts = [len(affinity)] if is_gpu else list(range(0, len(affinity) + 1))
    budget = [_MAX_STEPS]
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
    if budget[0] < 0:
        raise ctx.error(
            "the row is too damaged to read (too many ways to split its glued cells); "
            "expected cells separated by tabs or spaces",
            lineno,
            label,
        )
    return found


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
                    "%r %s is a peer-to-peer status, not a link code: this is `nvidia-smi topo -p2p` "
                    "output; expected `nvidia-smi topo -m` link codes (%s)" % (cell, where, _ALLOWED_CODES),
                    True,
                )
            return "%r %s is not a link code; allowed: %s" % (cell, where, _ALLOWED_CODES), False
    if positional:
        for j, title in enumerate(devices):
            cell = chunks[j]
            if j == own:
                if cell != "X":
                    return "expected X (the row's own column) in column %s, found %r" % (title, cell), False
            elif cell == "X":
                return "found X in column %s; X may only mark the row's own column %s" % (title, label), False
            elif not any(end == len(cell) for _, end in _code_candidates(cell, 0, False)):
                return (
                    "expected a link code (%s) in column %s, found %r" % (_ALLOWED_CODES, title, cell),
                    False,
                )
        for kind, cell in zip(affinity, chunks[len(devices) :]):
            if not any(end == len(cell) for _, end in _value_candidates(kind, cell, 0)):
                return "expected %s (%s), found %r" % (_COLUMN_TITLE[kind], _VALUE_HELP[kind], cell), False
    return (
        "expected %s, found %d cell(s): %s; cells are missing, extra, or glued together in a way "
        "that cannot be read unambiguously" % (expected, len(chunks), " ".join(chunks) or "(none)"),
        False,
    )


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

    def agreeing(label, candidates, known):
        own = column[label]
        kept = []
        for candidate in candidates:
            codes = candidate[0]
            if all(codes[column[other]] == known[other][0][own] for other in known if other != label):
                kept.append(candidate)
        return kept

    def splits(label):
        lineno, candidates, chunks = rows[label]
        return len(candidates[0][0]) + len(candidates[0][1]) - len(chunks)

    chosen = dict(trusted)
    # the least damaged rows first: once read, they check the others too
    pending = sorted(
        (label for label in devices if label not in trusted),
        key=lambda label: (len(rows[label][1]) > 1, splits(label)),
    )
    for label in pending:
        lineno, candidates, chunks = rows[label]
        kept = agreeing(label, candidates, chosen)
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
                % (rows[label][0], label, " ".join(list(codes) + list(values)))
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
            entry["numa_affinity"] = sorted(parse_cpulist(numa, "NUMA Affinity"))
    except CpuListError as exc:
        raise ctx.error(str(exc), lineno, label)
    gpu_numa = by_kind.get("gpu_numa_id", "N/A")
    if gpu_numa != "N/A":
        entry["gpu_numa_id"] = int(gpu_numa)
    return entry
