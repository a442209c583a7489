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

import re

from ansible.module_utils.gpunuma.errors import CpuListError

_MAX_CPU = 1 << 20  # far above any real machine; guards against absurd ranges
_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


def parse_cpulist(text, what="CPU list"):
    """Parse a kernel CPU list (``0-3,8,10-11``) into a frozenset of ints.

    An empty string (or only whitespace) is the empty set, as the kernel
    writes for a CPU-less NUMA node. ``a-b:s`` strides are accepted.
    """
    if text is None:
        raise CpuListError("%s is missing" % what)
    if not isinstance(text, str):
        raise CpuListError("%s must be a string, got %s" % (what, type(text).__name__))
    cleaned = text.strip()
    if not cleaned:
        return frozenset()
    cpus = set()
    for part in cleaned.split(","):
        part = part.strip()
        match = _RANGE_RE.match(part)
        if not match:
            raise CpuListError(
                "%s %r: %r is not a CPU id or range; allowed: ids and ranges like 0-3,8,10-11"
                % (what, text, part)
            )
        start = int(match.group(1))
        end = int(match.group(2)) if match.group(2) is not None else start
        step = int(match.group(3)) if match.group(3) is not None else 1
        if end < start or step < 1:
            raise CpuListError("%s %r: range %r is empty or reversed" % (what, text, part))
        if end >= _MAX_CPU:
            raise CpuListError("%s %r: CPU id %d is out of range" % (what, text, end))
        cpus.update(range(start, end + 1, step))
    return frozenset(cpus)


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
    """Parse a kernel hex mask (``ffff,00000000``; words MSB first) into CPU ids."""
    if text is None:
        raise CpuListError("%s is missing" % what)
    cleaned = text.strip().replace(",", "")
    if cleaned.startswith(("0x", "0X")):
        cleaned = cleaned[2:]
    if not cleaned:
        return frozenset()
    try:
        value = int(cleaned, 16)
    except ValueError:
        raise CpuListError(
            "%s %r is not a hexadecimal mask; allowed: comma-separated hex words like 00000000,0000ffff"
            % (what, text)
        )
    cpus = set()
    bit = 0
    while value:
        if value & 1:
            cpus.add(bit)
        value >>= 1
        bit += 1
    return frozenset(cpus)


def cpus_from_affinity_words(words, word_bits=64, what="NVML CPU affinity"):
    """CPU ids from NVML affinity words (least significant word first)."""
    if words is None:
        raise CpuListError("%s is missing" % what)
    cpus = set()
    for index, word in enumerate(words):
        try:
            value = int(word)
        except (TypeError, ValueError):
            raise CpuListError("%s word %d (%r) is not an integer" % (what, index, word))
        if value < 0 or value >= (1 << word_bits):
            raise CpuListError(
                "%s word %d (%r) does not fit in %d bits" % (what, index, word, word_bits)
            )
        base = index * word_bits
        bit = 0
        while value:
            if value & 1:
                cpus.add(base + bit)
            value >>= 1
            bit += 1
    return frozenset(cpus)


def affinity_words_from_cpus(cpus, word_bits=64, nwords=None):
    """Inverse of :func:`cpus_from_affinity_words` (used to write NVML replays)."""
    cpus = sorted(set(cpus))
    needed = (cpus[-1] // word_bits + 1) if cpus else 1
    count = max(needed, nwords or 0)
    words = [0] * count
    for cpu in cpus:
        words[cpu // word_bits] |= 1 << (cpu % word_bits)
    return words
