"""CPU list parsing and canonical formatting.

Three spellings of a CPU set reach gpunuma:

* kernel CPU lists (``cpulist``, ``local_cpulist``, ``nvidia-smi topo -m``):
  ``0-47,96-143``; ``nvidia-smi`` on some drivers also writes strides such as
  ``0-31:2`` is not used, but ranges, singles and comma lists are;
* kernel hex masks (``cpumap``, ``local_cpus``): 32-bit words, most
  significant first, separated by commas: ``00000000,0000ffff``;
* NVML affinity words (``nvmlDeviceGetCpuAffinity``): a list of unsigned
  integers, least significant word first, ``word_bits`` bits each (64 on
  Linux x86_64 and aarch64).

All of them become a ``frozenset`` of CPU ids; ``format_cpulist`` writes the
canonical form of DESIGN.md: sorted, duplicates removed, runs of two or more
consecutive ids written ``a-b``.
"""

from __future__ import annotations

import itertools
import re

from ansible.module_utils.gpunuma.common.errors import CpuListError

#: Largest CPU count a Linux kernel can be built for: ``NR_CPUS`` is at most
#: 8192 (arch/x86/Kconfig ``NR_CPUS_RANGE_END``: 8192 with
#: ``CPUMASK_OFFSTACK``/``MAXSMP``; arm64 allows 4096, powerpc 8192). CPU ids
#: run from 0 to ``MAX_CPUS - 1``; anything above cannot be a real CPU.
MAX_CPUS = 8192
#: Largest NUMA node count: ``MAX_NUMNODES = 1 << NODES_SHIFT`` with
#: ``NODES_SHIFT`` at most 10 (arch/x86/Kconfig, arch/arm64/Kconfig).
MAX_NUMA_NODES = 1024
#: A kernel CPU list for ``MAX_CPUS`` CPUs is far shorter (every other CPU
#: listed alone is under 20,000 characters); longer text is refused unread.
MAX_LIST_CHARS = 65536
#: ``cpumap``/``local_cpus`` print ``nr_cpu_ids`` bits as 32-bit hex words:
#: at most ``MAX_CPUS / 4`` hex digits.
MAX_MASK_DIGITS = MAX_CPUS // 4
#: NVML's ``nvmlDeviceGetCpuAffinity`` fills ``unsigned long`` words: 64 bits on
#: 64-bit Linux, 32 on 32-bit.
AFFINITY_WORD_BITS = (32, 64)

_RANGE_RE = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")
_MASK_WORD_RE = re.compile(r"[0-9a-fA-F]{1,8}")
_MASK_SINGLE_RE = re.compile(r"[0-9a-fA-F]+")
_SHOWN_CHARS = 60


def shown(text, limit=_SHOWN_CHARS):
    """``repr`` of user text, shortened so that an error never repeats megabytes."""
    if isinstance(text, str) and len(text) > limit:
        return "%r... (%d characters)" % (text[:limit], len(text))
    return repr(text)


def _check_text(text, what, noun):
    if text is None:
        raise CpuListError("%s is missing" % what)
    if not isinstance(text, str):
        raise CpuListError("%s must be a string, got %s" % (what, type(text).__name__))


def _bounded_int(digits, text, what, limit, noun):
    # int() of thousands of digits is slow (and refused past 4300 digits):
    # a number longer than the limit's own digits is out of range unread.
    if len(digits.lstrip("0")) > len(str(limit)) or int(digits) >= limit:
        raise CpuListError(
            "%s %s: %s %s is out of range; allowed: %ss 0-%d"
            % (what, shown(text), noun, shown(digits, 12), noun, limit - 1)
        )
    return int(digits)


def parse_cpulist(text, what="CPU list", limit=MAX_CPUS, noun="CPU id"):
    """Parse a kernel CPU list (``0-3,8,10-11``) into a frozenset of ints.

    An empty string (or only whitespace) is the empty set, as the kernel
    writes for a CPU-less NUMA node. ``a-b:s`` strides are accepted. Ids are
    ASCII digits below ``limit`` (``MAX_CPUS``; ``MAX_NUMA_NODES`` for node
    lists); text over ``MAX_LIST_CHARS`` is refused before it is read.
    """
    _check_text(text, what, noun)
    if len(text) > MAX_LIST_CHARS:
        raise CpuListError(
            "%s %s is too long (%d characters); allowed: at most %d characters (a kernel list "
            "for %d CPUs is far shorter)" % (what, shown(text), len(text), MAX_LIST_CHARS, MAX_CPUS)
        )
    cleaned = text.strip()
    if not cleaned:
        return frozenset()
    ranges = []
    top = -1
    for part in cleaned.split(","):
        part = part.strip()
        match = _RANGE_RE.fullmatch(part)
        if not match:
            raise CpuListError(
                "%s %s: %s is not a %s or range; allowed: ids and ranges like 0-3,8,10-11"
                % (what, shown(text), shown(part, 20), noun)
            )
        start = _bounded_int(match.group(1), text, what, limit, noun)
        end = _bounded_int(match.group(2), text, what, limit, noun) if match.group(2) is not None else start
        step = 1
        if match.group(3) is not None:
            # any stride of limit or more keeps only the start
            step_digits = match.group(3).lstrip("0")
            step = int(step_digits or "0") if len(step_digits) <= len(str(limit)) else limit
        if end < start or not step:
            raise CpuListError("%s %s: range %s is empty or reversed" % (what, shown(text), shown(part, 30)))
        ranges.append((start, end, step))
        top = max(top, end)
    # A flag per id, set by slices: a list repeating 0-8191 thousands of times
    # costs memset time, not millions of set insertions.
    flags = bytearray(top + 1)
    for start, end, step in ranges:
        count = len(range(start, end + 1, step))
        flags[start : end + 1 : step] = b"\x01" * count
    return frozenset(itertools.compress(range(top + 1), flags))


def parse_nodelist(text, what="NUMA node list"):
    """A NUMA node list (``0``, ``0-1``, ``0,2``): ids below ``MAX_NUMA_NODES``."""
    return parse_cpulist(text, what, limit=MAX_NUMA_NODES, noun="NUMA node id")


def format_cpulist(cpus):
    """Canonical CPU list: ``[0, 1, 2, 3, 8]`` -> ``0-3,8``; ``[0, 2, 4]`` -> ``0,2,4``."""
    ordered = sorted(set(int(c) for c in cpus))
    parts = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        if j > i:
            parts.append("%d-%d" % (ordered[i], ordered[j]))
        else:
            parts.append("%d" % ordered[i])
        i = j + 1
    return ",".join(parts)


def canonical_cpulist(text, what="CPU list"):
    """Parse then format: the canonical spelling of any accepted CPU list."""
    return format_cpulist(parse_cpulist(text, what))


def parse_cpumask(text, what="CPU mask"):
    """Parse a kernel hex mask (``ffff,00000000``; words MSB first) into CPU ids.

    The kernel prints 32-bit words of 8 hex digits separated by commas, the
    first word possibly shorter (``%*pb``, lib/vsprintf.c). A mask without
    commas is one hex number. Longer than ``MAX_MASK_DIGITS`` digits, or with
    a bit at or above ``MAX_CPUS``, it is refused.
    """
    _check_text(text, what, "mask")
    if len(text) > MAX_LIST_CHARS:
        raise CpuListError(
            "%s %s is too long (%d characters); allowed: at most %d hex digits (%d CPUs)"
            % (what, shown(text), len(text), MAX_MASK_DIGITS, MAX_CPUS)
        )
    cleaned = text.strip()
    if cleaned.startswith(("0x", "0X")):
        cleaned = cleaned[2:]
    if not cleaned:
        return frozenset()
    words = cleaned.split(",")
    if len(words) == 1:
        well_formed = _MASK_SINGLE_RE.fullmatch(cleaned) is not None
    else:
        well_formed = _MASK_WORD_RE.fullmatch(words[0]) is not None and all(
            len(w) == 8 and _MASK_WORD_RE.fullmatch(w) for w in words[1:]
        )
    if not well_formed:
        raise CpuListError(
            "%s %s is not a hexadecimal mask; allowed: comma-separated 32-bit hex words like 00000000,0000ffff"
            % (what, shown(text))
        )
    digits = "".join(words)
    if len(digits) > MAX_MASK_DIGITS:
        raise CpuListError(
            "%s %s has %d hex digits; allowed: at most %d (%d CPUs, the largest NR_CPUS of Linux)"
            % (what, shown(text), len(digits), MAX_MASK_DIGITS, MAX_CPUS)
        )
    value = int(digits, 16)
    # bin() lists the bits in one C call; the top bit is at len - 1.
    bits = bin(value)[2:]
    width = len(bits)
    return frozenset(width - 1 - i for i, bit in enumerate(bits) if bit == "1") if value else frozenset()


def cpus_from_affinity_words(words, word_bits=64, what="NVML CPU affinity"):
    """CPU ids from NVML affinity words (least significant word first)."""
    if words is None:
        raise CpuListError("%s is missing" % what)
    if isinstance(word_bits, bool) or word_bits not in AFFINITY_WORD_BITS:
        raise CpuListError(
            "%s: word size %r is not allowed; allowed: %s (bits of a C unsigned long)"
            % (what, word_bits, " or ".join(str(b) for b in AFFINITY_WORD_BITS))
        )
    if not isinstance(words, (list, tuple)):
        raise CpuListError("%s must be a list of integers, got %s" % (what, type(words).__name__))
    cpus = set()
    for index, word in enumerate(words):
        if isinstance(word, bool) or not isinstance(word, int):
            raise CpuListError("%s word %d (%s) is not an integer" % (what, index, shown(word)))
        if word < 0 or word >= (1 << word_bits):
            raise CpuListError(
                "%s word %d (%s) does not fit in %d bits" % (what, index, shown(word), word_bits)
            )
        if not word:
            continue
        base = index * word_bits
        if base + word.bit_length() > MAX_CPUS:
            raise CpuListError(
                "%s word %d sets CPU %d; allowed: CPU ids 0-%d (the largest NR_CPUS of Linux)"
                % (what, index, base + word.bit_length() - 1, MAX_CPUS - 1)
            )
        bits = bin(word)[2:]
        width = len(bits)
        cpus.update(base + width - 1 - i for i, bit in enumerate(bits) if bit == "1")
    return frozenset(cpus)


def runs(cpus):
    """Maximal runs of consecutive ids: ``{0,1,2,8,9}`` -> ``[(0, 2), (8, 9)]``."""
    found = []
    for cpu in sorted(cpus):
        if found and cpu == found[-1][1] + 1:
            found[-1] = (found[-1][0], cpu)
        else:
            found.append((cpu, cpu))
    return found


def infer_sibling_offset(node_cpus):
    """The sibling offset (half the machine's CPU count) when the layout shows it unambiguously, else None.

    Linux numbers x86 hyperthreads so that the second thread of core ``c``
    is CPU ``c + T/2`` (``T`` CPUs in all): each socket/NUMA node then holds
    two equal ranges ``a..b`` and ``a+T/2..b+T/2``, as ``nvidia-smi topo -m``
    prints them (``0-47,96-143``). Only that exact shape counts as evidence:
    every CPU-bearing node two equal ranges, one offset ``d`` for all nodes,
    every first range below ``d`` and every second below ``2d`` (so ``d`` is
    half the CPU count; a text that shows only the GPUs' nodes, as on a DGX
    A100 in NPS4, still qualifies). A single range per node (no SMT, SMT
    numbered otherwise, a VM's ``0-15``) is no evidence.
    """
    offset = None
    lows = []
    highs = []
    for cpus in node_cpus.values():
        pieces = runs(cpus)
        if len(pieces) != 2:
            return None
        (a, b), (c, d) = pieces
        if b - a != d - c:
            return None
        if offset is None:
            offset = c - a
        elif c - a != offset:
            return None
        lows.append(b)
        highs.append(d)
    if offset is None or max(lows) >= offset or max(highs) >= 2 * offset:
        return None
    return offset
