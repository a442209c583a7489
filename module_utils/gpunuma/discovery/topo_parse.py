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

Device columns are GPUs (``GPU<n>``, n from 0 to 255, no sign or leading
zero) or NICs (``NIC<n>`` or an RDMA device name, see ``_NIC_NAME_RE``); any
other label is an error, never guessed to be a NIC. GPUs are returned ordered
by index, with their link matrices in that order.

Input is capped (``MAX_TEXT_CHARS``, ``MAX_LINES``, ``MAX_LINE_CHARS``,
``MAX_DEVICE_COLUMNS``, CPU and node ids as in :mod:`cpulist`); the cell
search is iterative and has a step budget for the whole text, so no input
recurses deeply or runs long (docs/topology-v1.md, "Input limits").

Anything that cannot be read completely raises :class:`TopoParseError` with
the source, the line and what was expected; a result is never returned with
rows or columns missing.
"""

from __future__ import annotations

import re

from ansible.module_utils.gpunuma.common.cpulist import (
    MAX_NUMA_NODES, canonical_cpulist, parse_cpulist, parse_nodelist, shown)
from ansible.module_utils.gpunuma.common.errors import CpuListError, TopoParseError

__all__ = ["parse_topo_matrix", "LINK_CODES", "AFFINITY_COLUMNS", "MAX_TEXT_CHARS", "MAX_LINE_CHARS",
           "MAX_LINES", "MAX_DEVICE_COLUMNS"]

# Input caps. A real ``nvidia-smi topo -m`` of 16 GPUs and 18 NICs is a few
# KiB; these leave room for text around the matrix and for long CPU lists
# (every other CPU of 8192 listed alone) while keeping every parse short.
#: Characters of the whole text.
MAX_TEXT_CHARS = 1 << 20
#: Characters of one line.
MAX_LINE_CHARS = 1 << 17
#: Lines of the whole text.
MAX_LINES = 20000
#: GPU and NIC columns of the matrix (and so its rows). nvidia-smi numbers
#: GPUs 0..N-1, so GPU labels run from GPU0 to GPU255.
MAX_DEVICE_COLUMNS = 256
#: Matrices tried in one text (the first that is not ``topo -p2p`` output is read).
_MAX_BLOCKS = 8
#: Lines reported one by one when they are skipped as not being matrix rows.
_MAX_SKIP_WARNINGS = 10

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
_WHOLE_CODES = dict(_PLAIN_CODES, X="X")
_NV_RE = re.compile(r"NV[0-9]{1,%d}\Z" % 3)
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
_CAPTION_RE = re.compile(r"^[^\t:]*:\s*(?=GPU0(?![0-9]))")
_GLUED_LABEL_RE = re.compile(r"(?:GPU|NIC)[0-9]+")
_LABEL_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.:\-]*\Z")
# GPU<n> as nvidia-smi prints it: no sign, no leading zero (GPU01 would repeat GPU1).
_GPU_LABEL_RE = re.compile(r"GPU(0|[1-9][0-9]{0,2})\Z")
_NIC_LEGEND_LABEL_RE = re.compile(r"NIC(?:0|[1-9][0-9]{0,2})\Z")
# NIC columns named directly (drivers before the NIC Legend): RDMA device
# names as the kernel's drivers/infiniband/hw drivers register them (mlx4_0,
# mlx5_0, mlx5_bond_0, mthca0, bnxt_re0, irdma0, i40iw0, cxgb4_0, efa_0,
# hfi1_0, qib0, qedr0, ocrdma0, usnic_0, vmw_pvrdma0, hns_0, ionic_0, erdma_0,
# mana_0, rxe0, siw0) or as rdma-core's udev rules rename them (rocep59s0f0,
# ibp59s0, iwp59s0f1).
_NIC_NAME_RE = re.compile(
    r"(?:mlx[45]_(?:bond_)?[0-9]+|mthca[0-9]+|bnxt_re(?:_bond)?[0-9]+|irdma[0-9]+|i40iw[0-9]+|cxgb4_[0-9]+"
    r"|efa_?[0-9]+|hfi1_[0-9]+|qib[0-9]+|qedr[0-9]+|ocrdma[0-9]+|usnic_[0-9]+|vmw_pvrdma[0-9]+|hns_?[0-9]+"
    r"|ionic_[0-9]+|erdma_?[0-9]+|mana_[0-9]+|rxe[0-9]+|siw[0-9]+|(?:roce|ib|iw)[ps][0-9][a-z0-9]*)\Z"
)
_NIC_NAME_HELP = (
    "NIC<n> (resolved through the NIC Legend) or an RDMA device name such as mlx5_0, mlx4_0, mlx5_bond_0, "
    "bnxt_re0, irdma0, efa_0, hfi1_0, qedr0, ionic_0, erdma_0, rocep59s0f0"
)
_LEGEND_DEVICE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,63}\Z")
_NIC_LEGEND_ENTRY_RE = re.compile(r"^\s*(NIC[0-9]+)\s*:\s*(\S+)\s*$")
_LEGEND_RE = re.compile(r"^(?:NIC\s+)?Legend\b", re.IGNORECASE)

_LIST_RE = re.compile(r"[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*\Z")
_NUMERIC_RUN_RE = re.compile(r"[0-9,\-]+")
# What a cell (or several glued cells) can be made of at all.
_KNOWN_PIECES_RE = re.compile(r"(?:X|SYS|SOC|NODE|PHB|PXB|PIX|NV[0-9]+|[Nn]/[Aa]|[0-9,\-]+)+\Z")
_ROW_LIKE_RE = re.compile(r"(GPU[0-9]+|NIC[0-9]+)")
_DIGITS = "0123456789"
# NVLink counts are one or two digits (NV18 on H100/H200); three leave room.
_MAX_NV_DIGITS = 3

_MAX_CANDIDATES = 8
# Steps of the cell search: per row, and for the whole text.
_MAX_STEPS = 200000
_MAX_TOTAL_STEPS = 1000000


class _NotTopoMatrix(TopoParseError):
    """The matrix found is another nvidia-smi matrix (``topo -p2p``)."""


# --------------------------------------------------------------------------
# text clean-up and header


def _clean_lines(text):
    # NUL marks the affinity titles found in a header (_MARK): none may come from the text
    text = _INVISIBLE_RE.sub("", text).replace(_MARK, "")
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
    words = marked.split()
    if not words or not words[0].startswith("GPU0"):
        return None
    tokens = []
    for word in words:
        if word.startswith(_MARK) and word.endswith(_MARK) and word.strip(_MARK) in _COLUMN_TITLE:
            tokens.append(("affinity", word.strip(_MARK)))
            continue
        for piece in _split_label_token(word):
            # a "label" made only of link codes and numbers is a glued data row: stop at the first
            if not _LABEL_RE.match(piece) or _KNOWN_PIECES_RE.match(piece):
                return None
            tokens.append(("device", piece))
    if not tokens or tokens[0] != ("device", "GPU0"):
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
        while j < len(s) and j < i + 2 + _MAX_NV_DIGITS and s[j] in _DIGITS:
            j += 1
            out.append(("NV%d" % int(s[i + 2 : j]), j))
    return out


class _CodeReader(object):
    """Reads a link code; ``own_column`` is the row's own column, where only X may stand."""

    __slots__ = ("own_column",)

    def __init__(self, own_column):
        self.own_column = own_column

    def __call__(self, s, i):
        return _code_candidates(s, i, self.own_column)


def _valid_list(piece):
    if not _LIST_RE.match(piece):
        return False
    try:
        parse_cpulist(piece)
    except CpuListError:
        return False
    return True


def _value_candidates(kind, s, i):
    """A value is ``N/A`` or the whole run of digits, commas and dashes at ``s[i]``.

    A shorter prefix of the run is never a reading: what follows it (a
    digit, comma or dash) can start no cell, since two numbers are never
    split apart. Trying only the whole run keeps a long CPU list linear.
    """
    out = []
    if s[i : i + 3].upper() == "N/A":
        out.append(("N/A", i + 3))
    run = _NUMERIC_RUN_RE.match(s, i)
    if run:
        piece = run.group()
        if kind == "gpu_numa_id":
            ok = piece.isdigit()
        else:
            ok = _valid_list(piece)
        if ok:
            out.append((piece, run.end()))
    return out


def _read_cells(chunks, readers, budget):
    """Every way of reading ``chunks`` as exactly the cells ``readers`` describe.

    A chunk (whitespace-separated text) holds one cell or several glued
    cells; a cell never spans two chunks. Two numbers are never split apart
    inside a chunk (see the module docstring). Returns up to
    ``_MAX_CANDIDATES`` distinct readings. A depth-first search with an
    explicit stack: its depth is the number of cells, which the input sets,
    so it must not be Python recursion.
    """
    total = len(readers)
    if len(chunks) == total:
        # One chunk per cell (the undamaged row) is the only reading possible:
        # every chunk holds at least one cell. Check each chunk whole.
        budget[0] -= total
        budget[1] -= total
        reading = []
        for chunk, (kind, reader) in zip(chunks, readers):
            if kind == "code":
                code = _WHOLE_CODES.get(chunk)
                if code is None and _NV_RE.match(chunk):
                    code = "NV%d" % int(chunk[2:])
                if code is None or (code == "X") != reader.own_column:
                    return []
                reading.append(code)
                continue
            whole = [value for value, end in reader(chunk, 0) if end == len(chunk)]
            if not whole:
                return []
            reading.append(whole[0])
        return [tuple(reading)]
    results = []
    # (chunk index, position in chunk, cell index, previous value ended in a digit, cells so far)
    stack = [(0, 0, 0, False, ())]
    while stack:
        ci, pos, k, prev_numeric, acc = stack.pop()
        budget[0] -= 1
        budget[1] -= 1
        if budget[0] < 0 or budget[1] < 0 or len(results) >= _MAX_CANDIDATES:
            break
        if ci == len(chunks):
            if k == total:
                results.append(acc)
            continue
        if k == total or len(chunks) - ci > total - k:
            continue
        s = chunks[ci]
        kind, reader = readers[k]
        following = []
        for value, end in reader(s, pos):
            starts_numeric = s[pos] in _DIGITS
            if pos > 0 and prev_numeric and kind != "code" and starts_numeric:
                continue
            numeric_end = kind != "code" and s[end - 1] in _DIGITS
            if end == len(s):
                following.append((ci + 1, 0, k + 1, False, acc + (value,)))
            else:
                following.append((ci, end, k + 1, numeric_end, acc + (value,)))
        # pushed in reverse so that readings come out in the reader's order
        stack.extend(reversed(following))
    return results


# --------------------------------------------------------------------------
# the parser


class _Ctx:
    def __init__(self, source, steps_left=_MAX_TOTAL_STEPS):
        self.source = source
        self.warnings = []
        # the cell search budget left for the whole text, shared by its blocks
        self.steps_left = steps_left

    def error(self, message, lineno=None, row=None, cls=TopoParseError):
        where = self.source
        if lineno is not None:
            where += ": line %d" % lineno
        if row is not None:
            where += ": row %s" % row
        return cls("%s: %s" % (where, message))


def parse_topo_matrix(text, source="nvidia-smi topo -m output"):
    """Parse the text of ``nvidia-smi topo -m``.

    Returns ``{"source": source, "gpus": [{"index", "cpu_affinity",
    "numa_affinity", "gpu_numa_id"}], "nics": [names], "gpu_links": [[code]],
    "gpu_nic_links": [[code]], "warnings": [str]}``; ``source`` names the
    input in error and warning messages (the builder's too). Everything before the header line
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
    if len(text) > MAX_TEXT_CHARS:
        raise TopoParseError(
            "%s: the text is %d characters long; allowed: at most %d (MAX_TEXT_CHARS); pass only the output "
            "of `nvidia-smi topo -m`" % (source, len(text), MAX_TEXT_CHARS)
        )
    if not text.strip():
        raise TopoParseError(
            "%s: the text is empty; expected the output of `nvidia-smi topo -m` "
            "(a header line whose first column is GPU0, then one row per GPU and NIC)" % source
        )
    lines = _clean_lines(text)
    if len(lines) > MAX_LINES:
        raise TopoParseError(
            "%s: the text has %d lines; allowed: at most %d (MAX_LINES); pass only the output of "
            "`nvidia-smi topo -m`" % (source, len(lines), MAX_LINES)
        )
    for lineno, line in enumerate(lines, 1):
        if len(line) > MAX_LINE_CHARS:
            raise TopoParseError(
                "%s: line %d is %d characters long; allowed: at most %d (MAX_LINE_CHARS)"
                % (source, lineno, len(line), MAX_LINE_CHARS)
            )
    headers = [i for i, line in enumerate(lines) if _header_tokens(line) is not None]
    if not headers:
        raise TopoParseError(
            "%s: no topology header found in %d line(s); expected a line whose first column "
            "is GPU0 (e.g. '\\tGPU0\\tGPU1\\t...\\tCPU Affinity\\tNUMA Affinity'), followed by one "
            "row per GPU and NIC" % (source, len(lines))
        )
    first_error = None
    steps_left = _MAX_TOTAL_STEPS
    for header_index in headers[:_MAX_BLOCKS]:
        ctx = _Ctx(source, steps_left)
        try:
            result = _parse_block(ctx, lines, header_index)
        except _NotTopoMatrix as exc:
            first_error = first_error or exc
            steps_left = ctx.steps_left
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
                    "column %s comes after the affinity columns; expected GPU and NIC columns "
                    "first, then %s" % (shown(value), ", ".join(t for _unused, t in AFFINITY_COLUMNS)),
                    header_lineno,
                )
            devices.append(value)
        else:
            if value in affinity:
                raise ctx.error("column %r appears twice in the header" % _COLUMN_TITLE[value], header_lineno)
            affinity.append(value)

    if len(devices) > MAX_DEVICE_COLUMNS:
        raise ctx.error(
            "the header lists %d GPU and NIC columns (%s); allowed: at most %d (MAX_DEVICE_COLUMNS)"
            % (len(devices), _span(devices), MAX_DEVICE_COLUMNS),
            header_lineno,
        )
    devices = _repair_header_labels(ctx, lines, header_index, devices)
    if len(set(devices)) != len(devices):
        dup = sorted(set(d for d in devices if devices.count(d) > 1))
        raise ctx.error("column(s) %s appear more than once in the header" % ", ".join(dup), header_lineno)
    _check_labels(ctx, devices, header_lineno)
    # nvidia-smi prints GPU0..GPU<N-1> in order; output is ordered by index whatever the column order.
    gpu_labels = sorted((d for d in devices if _GPU_LABEL_RE.match(d)), key=lambda d: int(d[3:]))
    nic_labels = [d for d in devices if not _GPU_LABEL_RE.match(d)]
    column = dict((label, i) for i, label in enumerate(devices))

    # rows: label -> (lineno, [candidates]); candidates are (codes, values, glued)
    rows = {}
    skipped = []
    end_index = len(lines)
    label_lengths = sorted(set(len(d) for d in devices), reverse=True)
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
        labels = [first[:n] for n in label_lengths if first[:n] in column]
        if first in devices:
            labels = [first]
        if not labels:
            row_like = _ROW_LIKE_RE.match(first)
            if row_like and _KNOWN_PIECES_RE.match("".join(chunks[1:]) or "-"):
                raise ctx.error(
                    "row %s is not among the header's columns (%s); the header or the row is damaged"
                    % (row_like.group(1)[:24], _span(devices)),
                    lineno,
                )
            _skip_warning(ctx, skipped, lineno, stripped)
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
            message += "; line(s) %s%s could not be read as rows" % (
                ", ".join(str(n) for n in skipped[:_MAX_SKIP_WARNINGS]),
                " and %d more" % (len(skipped) - _MAX_SKIP_WARNINGS) if len(skipped) > _MAX_SKIP_WARNINGS else "",
            )
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

    in_header_order = [d for d in devices if _GPU_LABEL_RE.match(d)]
    if [g["index"] for g in gpus] != list(range(len(gpus))) or in_header_order != gpu_labels:
        ctx.warnings.append(
            "GPU columns are %s, not GPU0..GPU%d in order; indexes are taken from the labels and GPUs "
            "listed by index" % (_span(in_header_order) if len(gpus) > 8 else " ".join(in_header_order), len(gpus) - 1)
        )
    if any("SOC" in line for line in lines[header_index + 1 : end_index]):
        ctx.warnings.append("legacy link code SOC read as SYS")
    return {
        "source": ctx.source,
        "gpus": gpus,
        "nics": nics,
        "gpu_links": gpu_links,
        "gpu_nic_links": gpu_nic_links,
        "warnings": ctx.warnings,
    }


def _check_labels(ctx, devices, header_lineno):
    """Every device column is a GPU (GPU<n>) or a NIC; anything else is refused, not guessed."""
    for label in devices:
        if _GPU_LABEL_RE.match(label) and int(label[3:]) < MAX_DEVICE_COLUMNS:
            continue
        if label[:3].upper() == "GPU":
            raise ctx.error(
                "column %s is not a GPU label; allowed: GPU<n> with n from 0 to %d and no sign or leading "
                "zero (GPU0, GPU1, ...), as nvidia-smi prints them" % (shown(label, 30), MAX_DEVICE_COLUMNS - 1),
                header_lineno,
            )
        if _NIC_LEGEND_LABEL_RE.match(label) or _NIC_NAME_RE.match(label):
            continue
        raise ctx.error(
            "column %s is neither a GPU (GPU<n>) nor a NIC (%s)" % (shown(label, 30), _NIC_NAME_HELP),
            header_lineno,
        )


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
