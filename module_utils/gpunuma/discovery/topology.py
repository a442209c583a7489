"""Build a ``gpunuma.topology/v1`` document from the available sources.

Inputs (each optional):

* ``host``: what :func:`gpunuma.sysfs.read_host` returned (NUMA nodes, CPUs,
  PCI functions, ``numa_balancing``);
* ``nvml``: a ``gpunuma.nvml-dump/v1`` (live or replayed);
* ``smi``: what :func:`gpunuma.topo_parse.parse_topo_matrix` returned.

Trust order is NVML, then ``nvidia-smi topo -m``, then sysfs. The binding
node of a GPU (``numa_node``) is derived, in order, from: the NVML NUMA id,
sysfs ``numa_node``, the ``nvidia-smi`` NUMA affinity, and finally the node
whose CPUs hold the GPU's CPU affinity (sysfs ``numa_node`` is -1 in many
VMs). A CPU-less node (Grace HBM) is never the binding node: it becomes the
GPU's ``gpu_numa_id``.

NUMA nodes whose CPU sets overlap, from sysfs or inferred from the topo
text, are refused (:func:`check_disjoint_nodes`), never repaired; the same
warning from two sources is listed once.
"""

from __future__ import annotations

import hashlib
import json

from ansible.module_utils.gpunuma.common import cpulist
from ansible.module_utils.gpunuma.common.errors import TopologyError
from ansible.module_utils.gpunuma.discovery.nodes import (
    NodeIndex,
    check_disjoint_nodes,
    nodes_from_host,
    nodes_from_layout,
    nodes_from_smi,
)
from ansible.module_utils.gpunuma.discovery.amd.topology import amd_identities, overlay as _overlay
from ansible.module_utils.gpunuma.discovery.nvidia.nvml import gpu_link_matrix
from ansible.module_utils.gpunuma.discovery.nvidia.nvml_dump import is_error
from ansible.module_utils.gpunuma.discovery.sysfs.pci import (
    NVIDIA_VENDOR, gpu_functions, nic_functions, nvme_functions, pcie_gen_from_speed)
from ansible.module_utils.gpunuma.common import schemas

SCHEMA = schemas.TOPOLOGY
LINK_CODES = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")


def _value(field):
    """A dump field, or None when NVML answered with an error."""
    return None if is_error(field) else field


def _labels(indexes):
    return " ".join("GPU%d" % i for i in indexes)


def _pci_chain(pci):
    """Bridges above a PCI function (from its sysfs realpath), root complex first."""
    path = pci.get("realpath")
    if not path:
        return None
    parts = [p for p in path.split("/") if p]
    try:
        start = next(i for i, p in enumerate(parts) if p.startswith("pci"))
    except StopIteration:
        return None
    return parts[start:]


def pci_link_code(first, second, first_node, second_node):
    """nvidia-smi style link code between two PCI functions from their sysfs paths."""
    chain_a, chain_b = _pci_chain(first), _pci_chain(second)
    if chain_a is None or chain_b is None:
        if first_node is not None and second_node is not None:
            return "NODE" if first_node == second_node else "SYS"
        return None
    if chain_a[0] != chain_b[0]:
        if first_node is not None and first_node == second_node:
            return "NODE"
        return "SYS"
    common = 0
    for a, b in zip(chain_a, chain_b):
        if a != b:
            break
        common += 1
    # chain[0] is the root complex (pciDDDD:BB). Sharing only it: via the host bridge.
    if common <= 1:
        return "PHB"
    # Below the shared bridge each side crosses its own downstream port: one
    # switch between them is PIX; more bridges on either side is PXB.
    if len(chain_a) - common <= 2 and len(chain_b) - common <= 2:
        return "PIX"
    return "PXB"


def _select_node(candidates, nodes, warnings, label):
    """First candidate (source, node) that names a CPU-bearing node.

    Returns (node, source, cpuless_node_seen).
    """
    cpuless = None
    for source, node in candidates:
        if node is None:
            continue
        if nodes.has_cpus(node):
            return node, source, cpuless
        if node in nodes.by_id:
            cpuless = node if cpuless is None else cpuless
        elif nodes.nodes:
            warnings.append("%s: %s names NUMA node %s, which this host does not have" % (label, source, node))
    return None, None, cpuless


def _gpu_links(gpus, amd_count, amd_words, nvml, smi, pci_by_bus, warnings):
    """The GPU link matrix: NVML, else topo text, else sysfs PCI paths; AMD pairs from amd-smi, rocm-smi or KFD."""
    nvidia = len(gpus) - amd_count
    nv_links = gpu_link_matrix(nvml) if nvml is not None else None
    if nv_links is None and smi is not None and len(smi["gpu_links"]) == nvidia:
        nv_links = [list(r) for r in smi["gpu_links"]]
    if nv_links is not None and not amd_count:
        return nv_links
    gpu_links = _pci_matrix(gpus, gpus, pci_by_bus, same_list=True)
    for i, row in enumerate(nv_links or []):
        gpu_links[i][:nvidia] = list(row)
    _overlay(gpu_links, amd_words)
    unseen = (("NVLinks", nvidia, nv_links is not None), ("XGMI links", amd_count, amd_words is not None))
    fabrics = [name for name, count, known in unseen if count > 1 and not known]
    if fabrics:
        warnings.append("GPU links derived from PCIe paths in sysfs; %s are not visible there" % " and ".join(fabrics))
    return gpu_links


def build_topology(hostname, host=None, nvml=None, smi=None, warnings=None, sources=None, cpu_layout_host=None,
                   amd=None):
    """Combine the sources into a topology/v1 dict (see docs/topology-v1.md).

    ``cpu_layout_host``: a user's lscpu capture (``cpu_layout.parse_lscpu``), read in place of
    sysfs's CPU layout where sysfs is not a source. ``amd``: ``{"kfd": amd.read_kfd(), "smi": a parsed
    amd-smi or rocm-smi document}`` (each optional) for AMD GPUs (:mod:`gpunuma.discovery.amd.sources`).
    """
    warnings = list(warnings or [])
    sources = list(sources or [])
    amd = amd or {}
    if host is None and nvml is None and smi is None and not amd.get("kfd") and not amd.get("smi"):
        raise TopologyError("no topology source: give sysfs, an NVML dump or nvidia-smi topo text")
    numa_nodes, extra = _numa_nodes(host, smi, cpu_layout_host, warnings)
    nodes = NodeIndex(numa_nodes)
    pci_by_bus = dict((p["pci_bus_id"], p) for p in (host or {}).get("pci") or [])
    sysfs_gpus = gpu_functions(host) if host else []
    gpus = _gpu_identities(nvml, smi, [p for p in sysfs_gpus if p["vendor"] == NVIDIA_VENDOR], warnings)
    amd_gpus, amd_words = amd_identities(amd, [p for p in sysfs_gpus if p["vendor"] != NVIDIA_VENDOR],
                                         [n["id"] for n in numa_nodes if n["cpus"]], len(gpus), warnings)
    gpus.extend(amd_gpus)
    smi_rows = dict((row["index"], row) for row in (smi or {}).get("gpus", []))
    for gpu in gpus:
        _place_gpu(gpu, nvml, host, pci_by_bus, smi_rows.get(gpu["index"], {}), nodes, warnings)
    nics, nvme = _devices(host, smi, nodes)

    gpu_links = _gpu_links(gpus, len(amd_gpus), amd_words, nvml, smi, pci_by_bus, warnings)
    gpu_nic_links = _gpu_nic_links(gpus, nics, smi, pci_by_bus)

    driver = (nvml or {}).get("driver_version")
    topology = {
        "schema": SCHEMA,
        "hostname": hostname,
        "fingerprint": None,
        "sources": sources,
        # the same problem reported by two sources (or twice by one) is shown once
        "warnings": list(dict.fromkeys(warnings)),
        "complete": True,
        "driver_version": _value(driver),
        "numa_balancing": (host or {}).get("numa_balancing"),
        "sockets": extra.pop("sockets"),
        "numa_nodes": numa_nodes,
        "gpus": gpus,
        "gpu_links": gpu_links,
        "nics": nics,
        "gpu_nic_links": gpu_nic_links,
        "nvme": nvme,
    }
    topology.update((key, value) for key, value in extra.items() if value)
    topology["fingerprint"] = fingerprint(topology)
    return topology


def _numa_nodes(host, smi, cpu_layout_host, warnings):
    """``(numa_nodes, extra)``: the nodes from sysfs, else a user's lscpu, else the topo text; ``extra`` holds
    ``sockets`` and the optional ``unplaced_cpus`` and ``threads_per_core``."""
    extra = {"sockets": (host or {}).get("sockets"), "unplaced_cpus": None, "threads_per_core": None}
    if host is not None:
        numa_nodes = nodes_from_host(host)
        check_disjoint_nodes(numa_nodes, "sysfs")
        warnings.extend(host.get("warnings") or [])
        extra.update(_narrowed(host, numa_nodes, warnings))
    elif cpu_layout_host is not None:
        numa_nodes = nodes_from_layout(cpu_layout_host, smi)
        extra["sockets"] = cpu_layout_host.get("sockets")
        extra["threads_per_core"] = cpu_layout_host.get("threads_per_core")
        warnings.append("NUMA nodes from gpu_topology_lscpu_file (lscpu %s format): memory sizes and distances "
                        "unknown" % cpu_layout_host.get("format"))
    elif smi is not None:
        numa_nodes, unplaced = nodes_from_smi(smi, warnings)
        extra["unplaced_cpus"] = cpulist.format_cpulist(unplaced) if unplaced else None
        warnings.append("NUMA nodes inferred from nvidia-smi topo text alone: memory sizes and distances unknown")
    else:
        numa_nodes = []
        warnings.append("no sysfs source: NUMA nodes unknown")
    return numa_nodes, extra


def _narrowed(host, numa_nodes, warnings):
    """``cpus_granted`` (only when it leaves out a node's CPU) and ``cpus_isolated`` (only when it names one)."""
    present = frozenset()
    for node in numa_nodes:
        present |= cpulist.parse_cpulist(node["cpus"] or "")
    found = {}
    granted = host.get("cpus_granted")
    if granted is not None:
        cpus = cpulist.parse_cpulist(granted)
        if not cpus & present:
            warnings.append("the node grants its services no CPU of its NUMA nodes (%s); the granted CPUs are "
                            "treated as unknown" % (granted or "an empty list"))
        elif present - cpus:
            found["cpus_granted"] = cpulist.format_cpulist(cpus & present)
    isolated = host.get("cpus_isolated")
    if isolated:
        cpus = cpulist.parse_cpulist(isolated) & present
        if cpus:
            found["cpus_isolated"] = cpulist.format_cpulist(cpus)
    return found


def _gpu_identities(nvml, smi, sysfs_gpus, warnings):
    """The NVIDIA GPUs (index, uuid, name, bus id): NVML, else topo text rows, else sysfs PCI functions (PCI
    order). ``sysfs_gpus``: sysfs's NVIDIA GPU functions only (nvidia-smi and NVML number NVIDIA GPUs only)."""
    gpus = []
    smi_labels = sorted(row["index"] for row in smi["gpus"]) if smi is not None else []
    if nvml is not None:
        for entry in nvml["gpus"]:
            gpus.append({"index": entry["index"], "uuid": entry["uuid"], "name": _value(entry.get("name")),
                         "pci_bus_id": entry["pci_bus_id"], "_nvml": entry})
        if smi is not None and len(smi["gpus"]) != len(gpus):
            warnings.append("nvidia-smi topo lists %d GPUs but NVML %d; using NVML" % (len(smi["gpus"]), len(gpus)))
        elif smi is not None and smi_labels != sorted(g["index"] for g in gpus):
            warnings.append("nvidia-smi topo labels its GPUs %s but NVML indexes them %s; topo rows are used "
                            "only for the GPUs whose index matches" % (_labels(smi_labels),
                                                                       _labels(g["index"] for g in gpus)))
    elif smi is not None:
        ordered = sorted(sysfs_gpus, key=lambda p: p["pci_bus_id"])
        if ordered and len(ordered) != len(smi["gpus"]):
            warnings.append("nvidia-smi topo lists %d GPUs but sysfs %d NVIDIA GPUs; PCI placement not used"
                            % (len(smi["gpus"]), len(ordered)))
            ordered = []
        elif ordered and smi_labels != list(range(len(ordered))):
            # nvidia-smi numbers GPUs 0..N-1 in PCI order: only then does GPU<n> name the n-th PCI GPU.
            warnings.append("nvidia-smi topo labels its GPUs %s, not GPU0..GPU%d: they cannot be matched to the "
                            "%d NVIDIA GPUs of sysfs in PCI order; PCI placement not used"
                            % (_labels(smi_labels), len(ordered) - 1, len(ordered)))
            ordered = []
        for row in smi["gpus"]:
            bus = ordered[row["index"]]["pci_bus_id"] if ordered else None
            gpus.append({"index": row["index"], "uuid": None, "name": None, "pci_bus_id": bus})
    else:
        for index, pci in enumerate(sorted(sysfs_gpus, key=lambda p: p["pci_bus_id"])):
            gpus.append({"index": index, "uuid": None, "name": None, "pci_bus_id": pci["pci_bus_id"]})
    return gpus


def _affinity(nv, nvml, pci, row):
    """A GPU's local CPUs: NVML's affinity words, else sysfs local_cpulist, else the topo text's column."""
    affinity = None
    words = _value(nv.get("cpu_affinity_words"))
    if words:
        affinity = cpulist.cpus_from_affinity_words(words, nvml.get("cpu_word_bits", 64))
    if not affinity and pci and pci.get("local_cpulist"):
        affinity = cpulist.parse_cpulist(pci["local_cpulist"])
    if not affinity and row.get("cpu_affinity"):
        affinity = cpulist.parse_cpulist(row["cpu_affinity"])
    return affinity


def _pcie(nv, pci):
    """A GPU's PCIe generation and width, maximum and current: NVML's, else sysfs's link attributes."""
    pcie = dict((k, _value(v)) for k, v in (nv.get("pcie") or {}).items())
    if not pcie and pci:
        pcie = {"gen_max": pcie_gen_from_speed(pci.get("max_link_speed")), "width_max": pci.get("max_link_width"),
                "gen_current": pcie_gen_from_speed(pci.get("current_link_speed")),
                "width_current": pci.get("current_link_width")}
    return dict((k, pcie.get(k)) for k in ("gen_max", "width_max", "gen_current", "width_current"))


def _place_gpu(gpu, nvml, host, pci_by_bus, row, nodes, warnings):
    """A GPU's CPU affinity, binding node (NVML, sysfs, topo text, then its CPUs' node), PCIe link and MIG."""
    label = "GPU %d" % gpu["index"]
    nv = gpu.pop("_nvml", None) or {}
    pci = pci_by_bus.get(gpu["pci_bus_id"]) if gpu["pci_bus_id"] else None
    if nvml is not None and host is not None and pci is None:
        warnings.append("%s (%s): not found in sysfs; its PCI placement comes from NVML only"
                        % (label, gpu["pci_bus_id"]))

    affinity = _affinity(nv, nvml, pci, row)
    gpu["cpu_affinity"] = cpulist.format_cpulist(affinity) if affinity else None

    nvml_node = _value(nv.get("numa_node_id"))
    if nvml_node is not None and int(nvml_node) < 0:
        nvml_node = None
    sysfs_node = pci.get("numa_node") if pci else None
    smi_affinity = row.get("numa_affinity") or []
    smi_node = smi_affinity[0] if len(smi_affinity) == 1 else None
    candidates = [
        ("nvml", nvml_node),
        ("sysfs", sysfs_node),
        ("nvidia_smi", smi_node),
    ] + gpu.pop("_amd_nodes", []) + [
        ("cpu_affinity", nodes.node_of_cpus(affinity) if affinity else None),
    ]
    node, node_source, cpuless = _select_node(candidates, nodes, warnings, label)
    gpu_numa_id = row.get("gpu_numa_id")
    if gpu_numa_id is None:
        gpu_numa_id = cpuless
    if gpu_numa_id is None and node is not None and nvml_node is not None and nvml_node != node:
        gpu_numa_id = nvml_node
    gpu["numa_node"] = node
    gpu["numa_node_source"] = node_source
    gpu["gpu_numa_id"] = gpu_numa_id
    if smi_affinity:
        gpu["numa_affinity"] = sorted(smi_affinity)
    elif node is not None:
        gpu["numa_affinity"] = [node]
    else:
        gpu["numa_affinity"] = []
    if node is None:
        warnings.append("%s%s: NUMA node unknown (no NVML NUMA id, sysfs numa_node, nvidia-smi affinity "
                        "or CPU affinity within one node); it cannot be bound"
                        % (label, " (%s)" % gpu["pci_bus_id"] if gpu["pci_bus_id"] else ""))
    elif node_source == "cpu_affinity" and pci is not None and pci.get("raw_numa_node") == -1:
        warnings.append("%s (%s): sysfs numa_node is -1 (common in VMs); node %d derived from its CPU affinity"
                        % (label, gpu["pci_bus_id"], node))

    gpu["pcie"] = _pcie(nv, pci)
    mig = _value(nv.get("mig_mode"))
    gpu["mig_enabled"] = bool(mig and mig.get("current"))
    if gpu["mig_enabled"]:
        warnings.append("%s: MIG is enabled; its MIG instances keep this GPU's placement (node %s)"
                        % (label, node))
    gpu["memory_total_bytes"] = _value(nv.get("memory_total_bytes"))
    if pci and pci.get("msi_vectors"):
        gpu["irq_vectors"] = pci["msi_vectors"]


def _devices(host, smi, nodes):
    """``(nics, nvme)``: NICs and NVMe from sysfs, or NIC names from the topo text."""
    def device_node(pci):
        # Same rule as GPUs: a -1 numa_node (VMs) falls back to the node holding local_cpulist.
        if pci.get("numa_node") is not None:
            return pci["numa_node"]
        if pci.get("local_cpulist"):
            return nodes.node_of_cpus(cpulist.parse_cpulist(pci["local_cpulist"]))
        return None

    nics = []
    for pci in sorted((nic_functions(host) if host else []), key=lambda p: p["pci_bus_id"]):
        name = (pci.get("rdma") or [None])[0] or (pci.get("netdevs") or [None])[0]
        nics.append({"name": name, "netdevs": list(pci.get("netdevs") or []),
                     "pci_bus_id": pci["pci_bus_id"], "numa_node": device_node(pci)})
        if pci.get("msi_vectors"):
            nics[-1]["irq_vectors"] = pci["msi_vectors"]
    if not nics and smi is not None and host is None:
        nics = [{"name": name, "netdevs": [], "pci_bus_id": None, "numa_node": None} for name in smi["nics"]]
    nvme = []
    for pci in sorted((nvme_functions(host) if host else []), key=lambda p: p["pci_bus_id"]):
        nvme.append({"name": (pci.get("nvme") or [None])[0], "pci_bus_id": pci["pci_bus_id"],
                     "numa_node": device_node(pci)})
    return nics, nvme


def _pci_matrix(rows, cols, pci_by_bus, same_list=False):
    matrix = []
    for i, row in enumerate(rows):
        out = []
        for j, col in enumerate(cols):
            if same_list and i == j:
                out.append("X")
                continue
            a = pci_by_bus.get(row.get("pci_bus_id") or "")
            b = pci_by_bus.get(col.get("pci_bus_id") or "")
            if a is None or b is None:
                out.append(None)
                continue
            out.append(pci_link_code(a, b, row.get("numa_node"), col.get("numa_node")))
        matrix.append(out)
    return matrix


def _gpu_nic_links(gpus, nics, smi, pci_by_bus):
    if smi is not None and smi.get("nics"):
        names = [n["name"] for n in nics]
        if names == list(smi["nics"]) or not any(n["pci_bus_id"] for n in nics):
            return [list(r) for r in smi["gpu_nic_links"]]
        columns = dict((name, k) for k, name in enumerate(smi["nics"]))
        if all(name in columns for name in names):
            return [[row[columns[name]] for name in names] for row in smi["gpu_nic_links"]]
    return _pci_matrix(gpus, nics, pci_by_bus)


def _driver_major(version):
    if not version:
        return None
    return str(version).split(".", maxsplit=1)[0]


def fingerprint(topology):
    """Stable hash of the hardware layout (never memory, load or time)."""
    layout = {
        "numa_nodes": [[n["id"], n["cpus"]] for n in topology["numa_nodes"]],
        "gpus": [[g["pci_bus_id"] or g["index"], g["numa_node"], g["gpu_numa_id"]] for g in topology["gpus"]],
        "gpu_links": topology["gpu_links"],
        "nics": [[n["name"], n["pci_bus_id"], n["numa_node"]] for n in topology["nics"]],
        "driver_major": _driver_major(topology.get("driver_version")),
    }
    blob = json.dumps(layout, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()
