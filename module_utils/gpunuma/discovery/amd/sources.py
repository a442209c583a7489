# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""AMD Instinct GPUs: partitions, XGMI links and NUMA nodes from the KFD topology, amd-smi and rocm-smi.

Sources, most trusted first (docs/amd.md):

* ``amd-smi topology --json``: one entry per GPU with its ``bdf`` and a ``links`` list (``link_type``
  ``XGMI``/``PCIE``, ``weight``, ``num_hops``), the shape of ``amdsmi_cli/amdsmi_commands.py``;
* ``rocm-smi --showtopo`` (text or ``--json``): weight, hops and link type matrices and each GPU's
  ``(Topology) Numa Node``;
* the KFD topology under ``/sys/class/kfd/kfd/topology/nodes``, which both tools read: one node per CPU
  NUMA node and per GPU *partition* (an MI300X in CPX mode is eight KFD nodes), with ``io_links`` of
  type 2 (PCIe, to the CPU node) and 11 (XGMI) and their ``weight``.

The link words (the topology's ``gpu_links``) for AMD GPUs: ``XGMI<h>`` for a pair joined by XGMI,
``h`` the hops (``XGMI0`` for partitions of one GPU), and the PCIe codes from sysfs paths otherwise.
The hops come from the weights (:func:`xgmi_words`), never from the tools' hop count: both tools report
``num_hops`` 1 for any XGMI pair, direct or not (ROCm/rocm-systems#5763, open-mpi/hwloc#775).

Standard library only; every reader is bounded.
"""

from __future__ import annotations

import json
import os
import re

from ansible.module_utils.gpunuma.common.errors import GpunumaError, NvmlError
from ansible.module_utils.gpunuma.discovery.nvidia.nvml_dump import normalize_bus_id
from ansible.module_utils.gpunuma.common.bounded import loads_json, read_bounded

KFD_NODES = "sys/class/kfd/kfd/topology/nodes"
# kfd_crat.h: CRAT_IOLINK_TYPE_XGMI (PCIe links are type 2).
IOLINK_XGMI = 11
MAX_HOPS = 9
# A KFD properties file is about 1 KiB; a host has a few hundred nodes and links at most.
MAX_PROPERTIES_BYTES = 64 << 10
MAX_KFD_NODES = 1024
MAX_IO_LINKS = 1024
# An 8-GPU showtopo text is about 5 KiB and 64 partitions' JSON under 1 MiB.
MAX_SMI_CHARS = 4 << 20

_CANONICAL_NUMBER = re.compile(r"0|[1-9][0-9]{0,6}")
# GPU numbers the tools may name: a node holds at most a few hundred GPU partitions; a bigger number is no GPU.
MAX_GPU_NUMBER = 1023
_PAIR_KEY = re.compile(r"\(Topology\) (Weight|Hops|Link type) between DRM devices (\d{1,4}) and (\d{1,4})", re.I)
_NUMA_LINE = re.compile(r"GPU\[(\d{1,4})\]\s*:\s*\(Topology\) Numa (Node|Affinity):\s*(-?\d{1,6})", re.I)
_SECTION = re.compile(r"^=+\s*(.*?)\s*=+$")
_MATRIX_SECTIONS = {"weight between two gpus": "weights", "hops between two gpus": "hops",
                    "link type between two gpus": "types"}


class AmdSourceError(GpunumaError):
    """An amd-smi or rocm-smi document that cannot be read; the message names the source."""


# ------------------------------------------------------------------ link words


def xgmi_words(pairs):
    """Link words of XGMI pairs ``{(i, j): (weight, hops, same_gpu)}``: ``XGMI0`` for partitions of one GPU,
    else ``XGMI<h>`` with ``h`` the dense rank of the pair's weight among the host's XGMI weights between
    different GPUs (the lowest is 1).

    amdkfd weighs an XGMI link ``KFD_CRAT_XGMI_WEIGHT`` (15) per hop on MI200 (15/30/45), but partitions of
    an MI300X in CPX mode weigh 41 to every other GPU, directly linked; the rank reads both right, as hwloc
    reads the weights (open-mpi/hwloc#775). A pair with no weight takes the tool's hop count, else 1."""
    weights = sorted(set(w for w, _hops, same in pairs.values() if not same and isinstance(w, int) and w > 0))
    rank = dict((w, n + 1) for n, w in enumerate(weights))
    words = {}
    for key, (weight, hops, same) in pairs.items():
        if same:
            words[key] = "XGMI0"
            continue
        count = rank.get(weight) or (hops if isinstance(hops, int) and hops > 0 else 1)
        words[key] = "XGMI%d" % min(count, MAX_HOPS)
    return words


def pcie_word(hops):
    """A PCIe pair known only from a tool's hop count (no sysfs paths): 2 is through one CPU socket
    (``NODE``), 3 or more through both (``SYS``), as AMD's MI200 guide reads the hops table."""
    if isinstance(hops, int) and hops >= 3:
        return "SYS"
    if isinstance(hops, int) and hops >= 1:
        return "NODE"
    return None


# ------------------------------------------------------------------ KFD topology


def _read_properties(path):
    """``{key: int}`` of a KFD ``properties`` file (``name value`` lines), None when unreadable."""
    try:
        raw = read_bounded(path, MAX_PROPERTIES_BYTES, follow_symlinks=True, what="a KFD properties file")
    except (IOError, OSError):
        return None
    values = {}
    for line in raw.decode("ascii", "replace").splitlines():
        parts = line.split()
        if len(parts) == 2 and re.fullmatch(r"-?\d{1,30}", parts[1]):
            values[parts[0]] = int(parts[1])
    return values


def _numbered(path, limit):
    """The numbered entries of a KFD directory, as numbers: canonical decimal names only (``2``, never ``0002``
    beside it, which would read node 2 twice, nor ``²``, which str.isdigit() takes)."""
    try:
        names = os.listdir(path)
    except OSError:
        return []
    return sorted(int(n) for n in names if _CANONICAL_NUMBER.fullmatch(n))[:limit]


def bus_id_from_location(domain, location_id):
    """``dddd:bb:dd.f`` of KFD's ``domain`` and ``location_id`` (bus << 8 | device << 3 | function)."""
    return "%04x:%02x:%02x.%x" % (domain & 0xFFFF, (location_id >> 8) & 0xFF, (location_id >> 3) & 0x1F,
                                  location_id & 0x7)


def read_kfd(root="/"):
    """The KFD topology under ``root``: ``{"cpu_nodes": [ids], "gpus": [...], "warnings": [...]}``, None without it.

    Each GPU agent (a node with ``simd_count`` > 0, in KFD node order, the order ROCm enumerates
    them) has ``kfd_node``, ``pci_bus_id`` (from ``domain``/``location_id``), ``unique_id``,
    ``cpu_node`` (the KFD CPU node of its PCIe/intra-socket link) and ``links`` ``{kfd node: (type,
    weight)}``. A node whose properties cannot be read is left out with a warning."""
    base = os.path.join(root, KFD_NODES)
    if not os.path.isdir(base):
        return None
    cpu_nodes, agents, warnings = [], [], []
    for node in _numbered(base, MAX_KFD_NODES):
        props = _read_properties(os.path.join(base, str(node), "properties"))
        if props is None:
            warnings.append("KFD node %d: %s/%d/properties cannot be read; left out" % (node, base, node))
            continue
        if props.get("cpu_cores_count", 0) > 0 and props.get("simd_count", 0) == 0:
            cpu_nodes.append(node)
            continue
        if props.get("simd_count", 0) <= 0:
            continue
        links = {}
        link_dir = os.path.join(base, str(node), "io_links")
        for link in _numbered(link_dir, MAX_IO_LINKS):
            lp = _read_properties(os.path.join(link_dir, str(link), "properties"))
            if lp is None or "node_to" not in lp:
                warnings.append("KFD node %d: io_link %d cannot be read; left out" % (node, link))
                continue
            links[lp["node_to"]] = (lp.get("type"), lp.get("weight"))
        agents.append({
            "kfd_node": node,
            "pci_bus_id": bus_id_from_location(props.get("domain", 0), props.get("location_id", 0)),
            "unique_id": props.get("unique_id") or None,
            "links": links,
        })
    for agent in agents:
        to_cpu = [n for n in agent["links"] if n in cpu_nodes]
        agent["cpu_node"] = min(to_cpu, key=lambda n: (agent["links"][n][1] or 0, n)) if to_cpu else None
    return {"cpu_nodes": cpu_nodes, "gpus": agents, "warnings": warnings}


def kfd_gpus(kfd, sysfs_bus_ids=()):
    """The topology's AMD GPUs from a :func:`read_kfd` result, partitions included, in KFD order.

    Partitions of one GPU share its device and ``unique_id``; amdkfd writes each partition's number
    into the function bits of its ``location_id``, so a bus id that is no PCI function of sysfs but
    whose function 0 is, or a group of agents with one device and unique id, is one GPU's partitions.
    Each entry: ``pci_bus_id``, ``unique_id`` (hex), ``kfd_node``, ``cpu_node`` and ``partition``
    (``{"index", "count"}``, None for a whole GPU)."""
    known = set(sysfs_bus_ids)

    def device_of(bus):
        """Function 0 of the bus id, unless the bus id is itself a PCI function sysfs has and function 0 is not."""
        device = bus[:-1] + "0"
        return bus if bus in known and device not in known else device

    keys = [(device_of(agent["pci_bus_id"]), agent["unique_id"]) for agent in kfd["gpus"]]
    groups = {}
    for key, agent in zip(keys, kfd["gpus"]):
        groups.setdefault(key, []).append(agent)
    out = []
    for key, agent in zip(keys, kfd["gpus"]):
        group, device = groups[key], key[0]
        whole = len(group) == 1
        out.append({
            "pci_bus_id": agent["pci_bus_id"] if whole and (agent["pci_bus_id"] in known or not known) else device,
            "location_bus_id": agent["pci_bus_id"],
            "unique_id": "%016x" % agent["unique_id"] if agent["unique_id"] else None,
            "kfd_node": agent["kfd_node"],
            "cpu_node": agent["cpu_node"],
            "partition": None if whole else {"index": group.index(agent), "count": len(group)},
        })
    return out


def same_gpu(a, b):
    """Two entries of :func:`kfd_gpus` are partitions of one GPU."""
    return a["partition"] is not None and a["pci_bus_id"] == b["pci_bus_id"]


def kfd_links(kfd, gpus):
    """``{(i, j): word}`` for the pairs of ``gpus`` (:func:`kfd_gpus`, by position) that KFD joins by XGMI."""
    by_node = dict((g["kfd_node"], i) for i, g in enumerate(gpus))
    pairs = {}
    for agent in kfd["gpus"]:
        i = by_node.get(agent["kfd_node"])
        if i is None:
            continue
        for to, (kind, weight) in agent["links"].items():
            j = by_node.get(to)
            if j is None or j == i or kind != IOLINK_XGMI:
                continue
            pairs[(i, j)] = (weight, None, same_gpu(gpus[i], gpus[j]))
    return xgmi_words(pairs)


# ------------------------------------------------------------------ rocm-smi


def _as_int(text):
    text = str(text).strip()
    return int(text) if re.fullmatch(r"-?\d{1,12}", text) else None


def _gpu_number(value, source, what):
    """A GPU number the tool gave (an int, not a boolean, 0 to MAX_GPU_NUMBER), or AmdSourceError naming it."""
    if isinstance(value, str) and re.fullmatch(r"\d{1,4}", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GPU_NUMBER:
        raise AmdSourceError("%s: %s %s is not a GPU number; allowed: 0 to %d"
                             % (source, what, json.dumps(value, default=str)[:40], MAX_GPU_NUMBER))
    return value


def _check_text(text, source):
    if not isinstance(text, str) or not text.strip():
        raise AmdSourceError("%s is empty" % source)
    if len(text) > MAX_SMI_CHARS:
        raise AmdSourceError("%s is %d characters; at most %d are read" % (source, len(text), MAX_SMI_CHARS))


def parse_rocm_smi(text, source="rocm-smi --showtopo"):
    """``rocm-smi --showtopo`` (or any of its sections, text or ``--json``) as
    ``{"numa": {gpu: node}, "weights"|"hops"|"types": {(i, j): value}, "count": n}``.

    GPU numbers are rocm-smi's (``GPU[i]``, ``card<i>``), the order of the DRM devices."""
    _check_text(text, source)
    doc = {"kind": "rocm_smi", "numa": {}, "affinity": {}, "weights": {}, "hops": {}, "types": {}, "source": source}
    if text.lstrip()[:1] in ("{", "["):
        _rocm_smi_json(text, source, doc)
    else:
        _rocm_smi_text(text, source, doc)
    gpus = set(doc["numa"]) | set(doc["affinity"])
    for key in ("weights", "hops", "types"):
        for i, j in doc[key]:
            gpus.update((i, j))
    if not gpus:
        raise AmdSourceError("%s: no GPU found (no Numa Node line and no weight, hops or link type matrix)" % source)
    doc["count"] = max(gpus) + 1
    return doc


def _rocm_smi_json(text, source, doc):
    try:
        data = loads_json(text)
    except ValueError as exc:
        raise AmdSourceError("%s is not JSON: %s" % (source, exc))
    if not isinstance(data, dict):
        raise AmdSourceError("%s: a JSON object of cards was expected, got %s" % (source, type(data).__name__))
    for card, fields in data.items():
        if not isinstance(fields, dict):
            continue
        match = re.fullmatch(r"card(\d{1,4})", str(card))
        for key, value in fields.items():
            pair = _PAIR_KEY.fullmatch(str(key).strip())
            if pair:
                _store_pair(doc, pair.group(1).lower(), _gpu_number(pair.group(2), source, "DRM device"),
                            _gpu_number(pair.group(3), source, "DRM device"), value)
            elif match and str(key).strip().lower() == "(topology) numa node":
                doc["numa"][_gpu_number(match.group(1), source, "card")] = _as_int(value)
            elif match and str(key).strip().lower() == "(topology) numa affinity":
                doc["affinity"][_gpu_number(match.group(1), source, "card")] = _as_int(value)


def _store_pair(doc, what, i, j, value):
    if what == "link type":
        doc["types"][(i, j)] = str(value).strip().upper()
    else:
        doc["weights" if what == "weight" else "hops"][(i, j)] = _as_int(value)


def _rocm_smi_text(text, source, doc):
    section, header = None, None
    for line in text.splitlines():
        stripped = line.strip()
        heading = _SECTION.match(stripped)
        if heading:
            section, header = _MATRIX_SECTIONS.get(heading.group(1).lower()), None
            continue
        numa = _NUMA_LINE.search(stripped)
        if numa:
            target = doc["numa"] if numa.group(2).lower() == "node" else doc["affinity"]
            target[_gpu_number(numa.group(1), source, "GPU")] = int(numa.group(3))
            continue
        if section is None or not stripped:
            continue
        cells = stripped.split()
        if header is None:
            if all(re.fullmatch(r"GPU\d+", c) for c in cells):
                header = [_gpu_number(c[3:], source, "column") for c in cells]
            continue
        if not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        row = _gpu_number(cells[0][3:], source, "row")
        if len(cells) - 1 != len(header):
            raise AmdSourceError("%s: row GPU%d of %r has %d values for %d columns"
                                 % (source, row, section, len(cells) - 1, len(header)))
        for col, value in zip(header, cells[1:]):
            if col != row:
                _store_pair(doc, {"weights": "weight", "hops": "hops", "types": "link type"}[section], row, col, value)


# ------------------------------------------------------------------ amd-smi


def parse_amd_smi(text, source="amd-smi topology --json"):
    """``amd-smi topology --json`` as ``{"bdf": {gpu: bus id}, "weights"|"hops"|"types": {(i, j): value},
    "count": n}``; GPU numbers are amd-smi's (``gpu``), matched to the topology by ``bdf``."""
    _check_text(text, source)
    try:
        data = loads_json(text)
    except ValueError as exc:
        raise AmdSourceError("%s is not JSON: %s" % (source, exc))
    if isinstance(data, dict):
        data = [v for v in data.values() if isinstance(v, dict)]
    if not isinstance(data, list) or not data:
        raise AmdSourceError("%s: a JSON list of GPUs with \"gpu\", \"bdf\" and \"links\" was expected" % source)
    doc = {"kind": "amd_smi", "bdf": {}, "numa": {}, "affinity": {}, "weights": {}, "hops": {}, "types": {},
           "source": source}
    for n, entry in enumerate(data):
        gpu = entry.get("gpu") if isinstance(entry, dict) else None
        if not isinstance(gpu, int) or not isinstance(entry.get("bdf"), str):
            raise AmdSourceError("%s: entry %d has no integer \"gpu\" and string \"bdf\"" % (source, n))
        gpu = _gpu_number(gpu, source, "entry %d gpu" % n)
        try:
            doc["bdf"][gpu] = normalize_bus_id(entry["bdf"])
        except NvmlError as exc:
            raise AmdSourceError("%s: gpu %d: %s" % (source, gpu, exc))
        links = entry.get("links") or []
        if not isinstance(links, list):
            raise AmdSourceError("%s: gpu %d: \"links\" is %s, not a list" % (source, gpu, type(links).__name__))
        for link in links:
            other = link.get("gpu") if isinstance(link, dict) else None
            if other is None or other == gpu:
                continue
            other = _gpu_number(other, source, "a link of gpu %d names gpu" % gpu)
            if "link_type" in link:
                doc["types"][(gpu, other)] = str(link["link_type"]).strip().upper()
            if "weight" in link:
                doc["weights"][(gpu, other)] = _as_int(link["weight"])
            if "num_hops" in link:
                doc["hops"][(gpu, other)] = _as_int(link["num_hops"])
    doc["count"] = len(doc["bdf"])
    return doc


# ------------------------------------------------------------------ one link rule for the tools


def smi_words(doc, positions):
    """``{(i, j): word}`` from a parsed rocm-smi/amd-smi document; ``positions`` maps the tool's GPU
    number to the topology's position. XGMI pairs get :func:`xgmi_words`, PCIe pairs :func:`pcie_word`
    (used only where sysfs has no PCI path for them)."""
    words, pairs = {}, {}
    for (a, b), kind in doc["types"].items():
        i, j = positions.get(a), positions.get(b)
        if i is None or j is None:
            continue
        if kind == "XGMI":
            pairs[(i, j)] = (doc["weights"].get((a, b)), doc["hops"].get((a, b)), False)
        elif kind in ("PCIE", "PCIEXPRESS"):
            words[(i, j)] = pcie_word(doc["hops"].get((a, b)))
    words.update(xgmi_words(pairs))
    return words
