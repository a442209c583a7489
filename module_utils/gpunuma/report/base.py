"""The fleet report's shared parts (report/page.py): the schemas it reads, its limits and colours,
its errors, escaping, and CPU lists."""

from __future__ import annotations

import html
import json
import re

from ansible.module_utils.gpunuma.common import schemas

SCHEMAS = {
    schemas.TOPOLOGY: "topology",
    schemas.PLAN: "plan",
    schemas.STATE: "state",
    schemas.AUDIT: "audit",
    schemas.VALIDATION: "validation",
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
