"""The text side of the ``nvidia-smi topo -m`` parser (discovery/nvidia/topo_parse.py): input caps, the words and
patterns of the matrix, line clean-up, the header, and the cell readers (each returns ``[(value, end), ...]`` for
text starting at ``s[i]``)."""

from __future__ import annotations

import re

from ansible.module_utils.gpunuma.common.cpulist import parse_cpulist
from ansible.module_utils.gpunuma.common.errors import CpuListError, TopoParseError

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


def _read_whole(chunks, readers):
    """``[cells]`` when each chunk reads whole as its one cell, else ``[]``."""
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
        return _read_whole(chunks, readers)
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


def _span(labels):
    if len(labels) <= 3:
        return " ".join(labels)
    return "%s..%s" % (labels[0], labels[-1])
