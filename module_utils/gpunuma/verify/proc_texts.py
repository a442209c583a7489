"""The texts the drift audit reads (verify/audit.py): ``/proc/<pid>/status``, ``numa_maps`` and ``limits``, a unit
file, and the numactl options at the head of an ExecStart."""

from __future__ import annotations

import re
import shlex

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, parse_cpulist
from ansible.module_utils.gpunuma.verify.metrics import status_bytes

_POLICY_WORDS = {"bind": "bind", "prefer": "preferred", "interleave": "interleave", "default": "default",
                 "local": "default", "preferred": "preferred", "prefer (many)": "preferred"}


def parse_status(text):
    """``Cpus_allowed_list`` and ``Mems_allowed_list`` of ``/proc/<pid>/status`` as canonical lists, and
    ``locked_bytes``/``pinned_bytes`` from ``VmLck``/``VmPin`` (``<n> kB``; proc(5))."""
    out = {}
    for line in text.splitlines():
        key, _unused, value = line.partition(":")
        if key in ("Cpus_allowed_list", "Mems_allowed_list"):
            out[key] = format_cpulist(parse_cpulist(value.strip()))
    out.update(status_bytes(text))
    return out


def parse_numa_maps(text):
    """(policy, nodes, pages per node) of a process from ``/proc/<pid>/numa_maps``.

    Each line is one mapping: ``<addr> <policy>[:<nodes>] ... N<node>=<pages>``.
    The process's policy is the most common policy over its mappings (a
    mapping with its own mbind() policy is the exception, not the rule).
    """
    counts = {}
    pages = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        policy = parts[1]
        counts[policy] = counts.get(policy, 0) + 1
        for word in parts[2:]:
            match = re.match(r"^N(\d+)=(\d+)$", word)
            if match:
                node = int(match.group(1))
                pages[node] = pages.get(node, 0) + int(match.group(2))
    if not counts:
        return None, [], pages
    raw = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    word, _unused, nodes = raw.partition(":")
    policy = _POLICY_WORDS.get(word, word)
    node_list = sorted(parse_cpulist(nodes)) if nodes else []
    return policy, node_list, pages


def parse_memlock(text):
    """Soft limit of ``Max locked memory`` in ``/proc/<pid>/limits``: bytes, or ``"infinity"``."""
    for line in text.splitlines():
        if line.startswith("Max locked memory"):
            fields = line[len("Max locked memory"):].split()
            if fields:
                return "infinity" if fields[0] == "unlimited" else int(fields[0])
    return None


def memlock_bytes(value):
    """A LimitMEMLOCK= value (``infinity``, bytes, ``64M``...) as bytes or ``"infinity"``."""
    if value is None:
        return None
    value = str(value).strip()
    if value in ("infinity", "unlimited"):
        return "infinity"
    match = re.match(r"^(\d+)\s*([KMGTPE]?)i?B?$", value, re.I)
    if not match:
        return value
    power = " KMGTPE".index(match.group(2).upper() or " ")
    return int(match.group(1)) * 1024 ** power


def parse_unit(text):
    """The binding-relevant settings of a unit file or drop-in: ExecStart argv, systemd NUMA directives, LimitMEMLOCK."""
    out = {"exec": None, "CPUAffinity": None, "NUMAPolicy": None, "NUMAMask": None, "LimitMEMLOCK": None,
           "AllowedCPUs": None}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;[":
            continue
        key, _unused, value = line.partition("=")
        key = key.strip()
        if key == "ExecStart" and value.strip():
            try:
                out["exec"] = shlex.split(value.strip().lstrip("@-:+!"))
            except ValueError:
                out["exec"] = [value.strip()]
        elif key in out:
            out[key] = value.strip()
    return out


def expected_numa_args(argv):
    """The numactl options at the head of an ExecStart argv ([] when it is not numactl)."""
    if not argv or not argv[0].endswith("numactl"):
        return []
    args = []
    for word in argv[1:]:
        if not word.startswith("--"):
            break
        args.append(word)
    return args
