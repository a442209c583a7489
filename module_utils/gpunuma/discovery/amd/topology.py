# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The AMD GPUs of a topology: which GPUs (partitions included), their NUMA candidates and link words.

Called by :func:`gpunuma.discovery.topology.build_topology` with what :mod:`gpunuma.discovery.amd.sources`
read; the rules are documented in docs/amd.md.
"""

from __future__ import annotations

from ansible.module_utils.gpunuma.discovery.amd.sources import kfd_gpus, kfd_links, same_gpu, smi_words
from ansible.module_utils.gpunuma.discovery.sysfs.pci import amd_gpu_uuid


def _record(bus, unique_id=None):
    """An AMD GPU no KFD node describes: its bus id (and sysfs's unique_id), whole, no CPU link."""
    return {"pci_bus_id": bus, "unique_id": unique_id, "kfd_node": None, "cpu_node": None, "partition": None}


def _records(kfd, doc, functions, warnings):
    """The AMD GPUs in the order ROCm enumerates them: KFD's agents (partitions included), else the
    amd-smi document's bus ids where sysfs has none, else sysfs's AMD functions in PCI order."""
    buses = [f["pci_bus_id"] for f in functions]
    if kfd and kfd["gpus"]:
        warnings.extend(kfd["warnings"])
        records = kfd_gpus(kfd, buses)
        seen = set(r["pci_bus_id"] for r in records)
        for bus in buses:
            if bus not in seen:
                warnings.append("AMD GPU %s is in sysfs but has no KFD node (amdgpu without KFD?); ROCm will not "
                                "show it, its index is after the KFD ones" % bus)
                records.append(_record(bus))
        return records
    if doc is not None and doc.get("bdf") and not buses:
        return [_record(bus) for _gpu, bus in sorted(doc["bdf"].items())]
    return [_record(f["pci_bus_id"], f.get("unique_id")) for f in sorted(functions, key=lambda f: f["pci_bus_id"])]


def _kfd_numa(kfd, cpu_nodes, warnings):
    """KFD CPU node -> NUMA node: amdkfd makes one CPU node per online NUMA node that has CPUs, in node order
    (kfd_crat.c, kfd_create_vcrat_image_cpu), so the k-th of each pair up."""
    if not kfd or not kfd["cpu_nodes"]:
        return {}
    if cpu_nodes and len(cpu_nodes) != len(kfd["cpu_nodes"]):
        warnings.append("KFD has %d CPU nodes but sysfs %d NUMA nodes with CPUs; KFD's GPU-to-CPU links are not used "
                        "for placement" % (len(kfd["cpu_nodes"]), len(cpu_nodes)))
        return {}
    return dict(zip(kfd["cpu_nodes"], cpu_nodes or range(len(kfd["cpu_nodes"]))))


def _positions(doc, records, warnings):
    """The tool's GPU number -> position in ``records``: amd-smi by bus id, rocm-smi by order."""
    if doc is None:
        return {}
    if doc.get("bdf"):
        where = {}
        for i, r in enumerate(records):
            where.setdefault(r.get("location_bus_id") or r["pci_bus_id"], i)
            where.setdefault(r["pci_bus_id"], i)
        positions = dict((gpu, where[bus]) for gpu, bus in doc["bdf"].items() if bus in where)
        missing = sorted(bus for bus in doc["bdf"].values() if bus not in where)
        if missing:
            warnings.append("%s names GPU(s) %s that discovery did not find; their links are not used"
                            % (doc["source"], ", ".join(missing)))
        return positions
    if doc["count"] != len(records):
        warnings.append("%s lists %d GPUs but discovery found %d AMD GPUs; its NUMA nodes and links are not used"
                        % (doc["source"], doc["count"], len(records)))
        return {}
    return dict((i, i) for i in range(len(records)))


def amd_identities(amd, functions, cpu_nodes, first_index, warnings):
    """``(gpus, words)``: the topology entries of the AMD GPUs (indexes from ``first_index``, each with its
    ``_amd_nodes`` placement candidates) and ``{(i, j): link word}`` over all GPUs, None when no AMD source
    knows the links (sysfs PCI paths then stand alone)."""
    kfd, doc = amd.get("kfd"), amd.get("smi")
    if not functions and not (kfd and kfd["gpus"]) and not (doc and doc.get("bdf")):
        return [], None
    records = _records(kfd, doc, functions, warnings)
    by_bus = dict((f["pci_bus_id"], f) for f in functions)
    kfd_numa = _kfd_numa(kfd, cpu_nodes, warnings)
    positions = _positions(doc, records, warnings)
    smi_numa = dict((positions[g], n) for g, n in (doc or {}).get("numa", {}).items()
                    if g in positions and n is not None and n >= 0)
    gpus = []
    for k, rec in enumerate(records):
        function = by_bus.get(rec["pci_bus_id"], {})
        gpu = {"index": first_index + k, "name": None, "pci_bus_id": rec["pci_bus_id"], "vendor": "amd",
               "uuid": None if rec["partition"] else amd_gpu_uuid(rec["unique_id"] or function.get("unique_id"))}
        if rec["partition"]:
            gpu["partition"] = dict(rec["partition"], compute=function.get("compute_partition"),
                                    memory=function.get("memory_partition"))
        gpu["_amd_nodes"] = [((doc or {}).get("kind"), smi_numa.get(k)), ("kfd", kfd_numa.get(rec["cpu_node"]))]
        gpus.append(gpu)
    if doc is not None and positions:
        local = smi_words(doc, positions)
        local.update(((i, j), "XGMI0") for i, a in enumerate(records) for j, b in enumerate(records)
                     if i != j and same_gpu(a, b))
    elif kfd and kfd["gpus"]:
        local = kfd_links(kfd, records)
    else:
        return gpus, None
    return gpus, dict(((first_index + i, first_index + j), word) for (i, j), word in local.items())


def overlay(matrix, words):
    """Write AMD link words into the GPU matrix: XGMI words always, PCIe words only where sysfs had no path."""
    for (i, j), word in (words or {}).items():
        if word is None:
            continue
        if word.startswith("XGMI") or matrix[i][j] is None:
            matrix[i][j] = word
