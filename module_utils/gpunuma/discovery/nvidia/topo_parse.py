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

from ansible.module_utils.gpunuma.common.cpulist import shown
from ansible.module_utils.gpunuma.common.errors import TopoParseError
from ansible.module_utils.gpunuma.discovery.nvidia.topo_text import (
    AFFINITY_COLUMNS, _clean_lines, _COLUMN_TITLE, _GPU_LABEL_RE, _header_tokens, _KNOWN_PIECES_RE, _LABEL_RE,
    _LEGEND_RE, _MARK, _MAX_BLOCKS, MAX_DEVICE_COLUMNS, MAX_LINE_CHARS, MAX_LINES, _MAX_SKIP_WARNINGS,
    MAX_TEXT_CHARS, _MAX_TOTAL_STEPS, _NIC_LEGEND_LABEL_RE, _NIC_NAME_HELP, _NIC_NAME_RE, _NotTopoMatrix,
    _ROW_LIKE_RE, _span, _split_label_token)
from ansible.module_utils.gpunuma.discovery.nvidia.topo_rows import (
    _check_symmetry, _diagnose, _gpu_entry, _nic_names, _resolve, _row_candidates, _skip_warning)


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


def _checked_lines(text, source):
    """The text's lines, once it is text within the size limits (else TopoParseError names the limit)."""
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
    return lines


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
    lines = _checked_lines(text, source)
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


def _header_columns(ctx, lines, header_index):
    """``(devices, affinity)``: the header's GPU and NIC labels (repaired, checked) and its affinity columns."""
    header_lineno = header_index + 1
    devices = []
    affinity = []
    for kind, value in _header_tokens(lines[header_index]):
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
    return devices, affinity


def _row_labels(ctx, chunks, devices, column, label_lengths, skipped, lineno, stripped):
    """The labels a row's first chunk may start with ([] for a line that is skipped with a warning)."""
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
    return labels


def _read_row(ctx, labels, chunks, rows, devices, column, affinity, lineno):
    """``(label, candidates, rest)`` of one row; candidates are (codes, values, glued)."""
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
                "row %s appears twice (first on line %d); expected one row per column" % (label, rows[label][0]),
                lineno,
            )
        found = _row_candidates(ctx, label, rest, devices, column, affinity, lineno)
        if found:
            return label, [(codes, values, glued or glued_label) for codes, values, glued in found], rest
        if failure is None:
            failure = (label, rest)
    if failure is None:
        raise ctx.error(
            "row %s appears twice (first on line %d); expected one row per column" % (labels[0], rows[labels[0]][0]),
            lineno,
        )
    label, rest = failure
    message, p2p = _diagnose(label, rest, devices, column, affinity)
    raise ctx.error(message, lineno, label, cls=_NotTopoMatrix if p2p else TopoParseError)


def _read_rows(ctx, lines, header_index, devices, column, affinity):
    """``(rows, end_index)``: label -> (lineno, [candidates], rest), and where the matrix ends.

    Every column has a row, or the error names the missing ones and the lines that could not be read.
    """
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
        labels = _row_labels(ctx, chunks, devices, column, label_lengths, skipped, lineno, stripped)
        if labels:
            label, candidates, rest = _read_row(ctx, labels, chunks, rows, devices, column, affinity, lineno)
            rows[label] = (lineno, candidates, rest)

    missing = [d for d in devices if d not in rows]
    if missing:
        message = (
            "the matrix is incomplete: the header (line %d) lists %d column(s) (%s) but there is "
            "no row for %s; expected one row per GPU and NIC column (output truncated?)"
            % (header_index + 1, len(devices), _span(devices), ", ".join(missing))
        )
        if skipped:
            message += "; line(s) %s%s could not be read as rows" % (
                ", ".join(str(n) for n in skipped[:_MAX_SKIP_WARNINGS]),
                " and %d more" % (len(skipped) - _MAX_SKIP_WARNINGS) if len(skipped) > _MAX_SKIP_WARNINGS else "",
            )
        raise ctx.error(message)
    return rows, end_index


def _parse_block(ctx, lines, header_index):
    devices, affinity = _header_columns(ctx, lines, header_index)
    # nvidia-smi prints GPU0..GPU<N-1> in order; output is ordered by index whatever the column order.
    gpu_labels = sorted((d for d in devices if _GPU_LABEL_RE.match(d)), key=lambda d: int(d[3:]))
    nic_labels = [d for d in devices if not _GPU_LABEL_RE.match(d)]
    column = dict((label, i) for i, label in enumerate(devices))
    rows, end_index = _read_rows(ctx, lines, header_index, devices, column, affinity)

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
