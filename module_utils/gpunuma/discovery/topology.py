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
from ansible.module_utils.gpunuma.discovery import cpu_layout
from ansible.module_utils.gpunuma.discovery.nvml import gpu_link_matrix, is_error
from ansible.module_utils.gpunuma.discovery.sysfs import gpu_functions, nic_functions, nvme_functions, pcie_gen_from_speed
from ansible.module_utils.gpunuma.common import schemas

SCHEMA = schemas.TOPOLOGY
_MAX_LISTED = 10
LINK_CODES = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")


def _value(field):
    """A dump field, or None when NVML answered with an error."""
    return None if is_error(field) else field


class _Nodes(object):
    """NUMA node lookup: which node holds which CPUs."""

    def __init__(self, numa_nodes):
        self.nodes = numa_nodes
        self.by_id = dict((n["id"], n) for n in numa_nodes)
        self.cpusets = dict((n["id"], cpulist.parse_cpulist(n["cpus"])) for n in numa_nodes)

    def has_cpus(self, node_id):
        node = self.by_id.get(node_id)
        return bool(node and node["has_cpus"])

    def node_of_cpus(self, cpus):
        """The single CPU-bearing node whose CPUs hold ``cpus``; None if none or several."""
        if not cpus:
            return None
        holders = [nid for nid, cset in self.cpusets.items() if cset and cpus <= cset]
        if len(holders) == 1:
            return holders[0]
        overlapping = [nid for nid, cset in self.cpusets.items() if cset & cpus]
        if len(overlapping) == 1:
            return overlapping[0]
        return None


def check_disjoint_nodes(numa_nodes, source, evidence=None):
    """Refuse NUMA nodes that share CPUs (TopologyError naming the nodes and the CPUs).

    The kernel places every CPU on exactly one node (``cpu_to_node``; the
    ``node<N>/cpulist`` files partition the CPUs), so an overlap means the
    input is damaged or edited. Which node really holds a shared CPU cannot
    be told from such input, and a guess would bind a worker to a remote
    node while reporting it local, or give two workers the same CPUs: no
    repair is attempted (docs/topology-v1.md, "Disjoint NUMA nodes").
    ``evidence`` maps a node id to the text that gave it its CPUs.
    """
    seen = set()
    owner = {}
    shared = {}
    more = False
    for node in numa_nodes:
        node_id = node["id"]
        if node_id in seen:
            raise TopologyError("%s: NUMA node %s is listed twice; allowed: each node id once" % (source, node_id))
        seen.add(node_id)
        # each node against the CPUs claimed so far, never a pairwise product of nodes
        cpus = cpulist.parse_cpulist(node["cpus"], "%s: NUMA node %s cpus" % (source, node_id))
        if len(shared) < _MAX_LISTED:
            for cpu in cpus & owner.keys():
                shared.setdefault((owner[cpu], node_id), []).append(cpu)
        elif cpus & owner.keys():
            more = True
        owner.update(dict.fromkeys(cpus - owner.keys(), node_id))
    if shared:
        pairs = sorted(shared)
        problems = ["nodes %s and %s share CPUs %s" % (a, b, cpulist.format_cpulist(shared[(a, b)]))
                    for a, b in pairs[:_MAX_LISTED]]
        if more or len(pairs) > _MAX_LISTED:
            problems.append("more nodes overlap (not listed)")
        involved = set(a for a, b in pairs) | set(b for a, b in pairs)
        detail = ""
        if evidence:
            detail = " (%s)" % "; ".join("node %s: %s" % (nid, evidence[nid])
                                         for nid in sorted(evidence) if nid in involved)
            if len(detail) > 1000:
                detail = detail[:1000] + "...)"
        raise TopologyError(
            "%s: NUMA node CPU sets overlap: %s%s; every CPU belongs to exactly one NUMA node, so the input "
            "is damaged or edited, and which node holds a shared CPU cannot be told from it; fix the input "
            "(or discover from the live host)" % (source, "; ".join(problems), detail)
        )


def _nodes_from_smi(smi, warnings):
    """NUMA nodes inferred from topo text alone: CPUs from the affinities, memory unknown."""
    cpus_by_node = {}
    evidence = {}
    cpuless = set()
    for gpu in smi["gpus"]:
        affinity = gpu.get("numa_affinity") or []
        if len(affinity) == 1 and gpu.get("cpu_affinity"):
            cpus_by_node.setdefault(affinity[0], set()).update(cpulist.parse_cpulist(gpu["cpu_affinity"]))
            evidence.setdefault(affinity[0], []).append("GPU%d CPU Affinity %s" % (gpu["index"], gpu["cpu_affinity"]))
        for node in affinity:
            cpus_by_node.setdefault(node, set())
        if gpu.get("gpu_numa_id") is not None:
            cpuless.add(gpu["gpu_numa_id"])
    for node in cpuless:
        cpus_by_node.setdefault(node, set())
    if not cpus_by_node:
        # Drivers before NUMA Affinity existed print only CPU Affinity. Two or
        # more disjoint affinity groups are the sockets' nodes, numbered by
        # their lowest CPU as the kernel does; one group says nothing.
        groups = []
        for gpu in smi["gpus"]:
            if gpu.get("cpu_affinity"):
                cpus = cpulist.parse_cpulist(gpu["cpu_affinity"])
                if cpus not in groups:
                    groups.append(cpus)
        disjoint = all(not (a & b) for k, a in enumerate(groups) for b in groups[k + 1:])
        if len(groups) > 1 and disjoint:
            for node_id, cpus in enumerate(sorted(groups, key=min)):
                cpus_by_node[node_id] = set(cpus)
            warnings.append("nvidia-smi topo text has no NUMA Affinity: node ids inferred from %d disjoint "
                            "CPU affinity groups, numbered by lowest CPU" % len(groups))
        elif len(groups) > 1:
            warnings.append("nvidia-smi topo text has no NUMA Affinity and its GPUs' CPU affinities overlap "
                            "without being equal (%s): no NUMA node is inferred, the GPUs cannot be bound"
                            % ", ".join(cpulist.format_cpulist(g) for g in groups[:4]))
    nodes = []
    for node_id in sorted(cpus_by_node):
        cpus = cpus_by_node[node_id]
        nodes.append({
            "id": node_id,
            "cpus": cpulist.format_cpulist(cpus),
            "has_cpus": bool(cpus),
            "memory_total_bytes": None,
            "memory_free_bytes": None,
            "distances": [],
            # The text shows no hyperthread siblings: null says "unknown"
            # (the planner infers or refuses), [] only "no CPUs".
            "cores": None if cpus else [],
        })
    check_disjoint_nodes(nodes, smi.get("source") or "nvidia-smi topo text",
                         dict((nid, ", ".join(texts)) for nid, texts in evidence.items()))
    inferred, unplaced = cpu_layout.infer_missing_nodes(
        dict((n["id"], cpulist.parse_cpulist(n["cpus"])) for n in nodes if n["has_cpus"]))
    taken = set(n["id"] for n in nodes)
    if any(node_id in taken for node_id, _ in inferred):
        # a CPU-less node of the text already holds the id: the reading is not unique
        unplaced = frozenset().union(*[cpus for _, cpus in inferred])
        inferred = []
    for node_id, cpus in inferred:
        nodes.append({"id": node_id, "cpus": cpulist.format_cpulist(cpus), "has_cpus": True,
                      "memory_total_bytes": None, "memory_free_bytes": None, "distances": [],
                      "cores": None, "inferred": True})
    nodes.sort(key=lambda n: n["id"])
    if inferred:
        warnings.append(
            "NUMA node%s %s %s not in the nvidia-smi topo text (it lists only the nodes of its GPUs); inferred "
            "from the CPU ids it leaves out: %s (equal blocks of consecutive CPUs, node ids rising with CPU ids, "
            "as Linux numbers an x86 machine's nodes). Discover with sysfs, or give gpu_topology_lscpu_file, "
            "to read them" % ("s" if len(inferred) > 1 else "", ", ".join(str(n) for n, _ in inferred),
                              "are" if len(inferred) > 1 else "is",
                              "; ".join("node %d %s" % (n, cpulist.format_cpulist(c)) for n, c in inferred)))
    if unplaced:
        warnings.append(
            "CPUs %s are not in the nvidia-smi topo text, which lists only the nodes of its GPUs, and the NUMA "
            "nodes holding them cannot be inferred from it: instances are not bound to CPUs (unplaced_cpus). "
            "Discover with sysfs, or give gpu_topology_lscpu_file (`lscpu -p=CPU,CORE,SOCKET,NODE,CACHE`)"
            % cpulist.format_cpulist(unplaced))
    return nodes, unplaced


def _l3_groups(cpus, l3_of):
    """The node's L3 cache groups (canonical lists), or None unless every CPU's L3 is known."""
    if not cpus or any(cpu not in l3_of for cpu in cpus):
        return None
    groups = []
    for cpu in sorted(cpus):
        group = cpulist.format_cpulist(cpulist.parse_cpulist(l3_of[cpu]) & cpus)
        if group not in groups:
            groups.append(group)
    return groups


def _nodes_from_host(host):
    l3_of = dict((cpu["id"], cpu["l3"]) for cpu in host.get("cpus") or [] if cpu.get("l3"))
    siblings_of = {}
    for cpu in host.get("cpus") or []:
        if cpu.get("siblings"):
            siblings_of[cpu["id"]] = cpu["siblings"]
    nodes = []
    for node in host["numa_nodes"]:
        cpus = cpulist.parse_cpulist(node["cpus"])
        cores = []
        seen = set()
        for cpu in sorted(cpus):
            if cpu in seen:
                continue
            group = cpulist.parse_cpulist(siblings_of.get(cpu, str(cpu))) & cpus or frozenset([cpu])
            seen.update(group)
            cores.append(cpulist.format_cpulist(group))
        nodes.append({
            "id": node["id"],
            "cpus": cpulist.format_cpulist(cpus),
            "has_cpus": bool(cpus),
            "memory_total_bytes": node.get("memory_total_bytes"),
            "memory_free_bytes": node.get("memory_free_bytes"),
            "distances": list(node.get("distances") or []),
            "cores": cores,
        })
        l3_groups = _l3_groups(cpus, l3_of)
        if l3_groups is not None:
            nodes[-1]["l3_groups"] = l3_groups
        if node.get("hugetlb_bytes"):
            nodes[-1]["hugetlb_bytes"] = node["hugetlb_bytes"]
    return nodes


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


def _nodes_from_layout(layout, smi):
    """NUMA nodes from a user's lscpu capture (no memory, no distances), checked against the topo text's GPUs."""
    nodes = _nodes_from_host(layout)
    for node in nodes:
        node["memory_total_bytes"] = None
        node["memory_free_bytes"] = None
        if node["cpus"] and not layout.get("cpus"):
            node["cores"] = None  # the lscpu summary names no CPU's core
    check_disjoint_nodes(nodes, "gpu_topology_lscpu_file")
    by_id = dict((n["id"], cpulist.parse_cpulist(n["cpus"])) for n in nodes)
    for gpu in (smi or {}).get("gpus", []):
        affinity = gpu.get("numa_affinity") or []
        if len(affinity) != 1 or not gpu.get("cpu_affinity"):
            continue
        cpus = cpulist.parse_cpulist(gpu["cpu_affinity"])
        if affinity[0] not in by_id or not cpus <= by_id[affinity[0]]:
            raise TopologyError(
                "gpu_topology_lscpu_file: GPU%d's CPU Affinity %s on NUMA node %d (nvidia-smi topo text) is not "
                "within that node's CPUs in the lscpu capture (%s); the two captures are not of one machine"
                % (gpu["index"], gpu["cpu_affinity"], affinity[0],
                   cpulist.format_cpulist(by_id[affinity[0]]) if affinity[0] in by_id else "no such node"))
    return nodes


def build_topology(hostname, host=None, nvml=None, smi=None, warnings=None, sources=None, cpu_layout_host=None):
    """Combine the sources into a topology/v1 dict (see docs/topology-v1.md).

    ``cpu_layout_host``: a user's lscpu capture (``cpu_layout.parse_lscpu``), read in place of
    sysfs's CPU layout where sysfs is not a source.
    """
    warnings = list(warnings or [])
    sources = list(sources or [])
    if host is None and nvml is None and smi is None:
        raise TopologyError("no topology source: give sysfs, an NVML dump or nvidia-smi topo text")

    unplaced = frozenset()
    threads_per_core = None
    sockets = (host or {}).get("sockets")
    if host is not None:
        numa_nodes = _nodes_from_host(host)
        check_disjoint_nodes(numa_nodes, "sysfs")
        warnings.extend(host.get("warnings") or [])
    elif cpu_layout_host is not None:
        numa_nodes = _nodes_from_layout(cpu_layout_host, smi)
        sockets = cpu_layout_host.get("sockets")
        threads_per_core = cpu_layout_host.get("threads_per_core")
        warnings.append("NUMA nodes from gpu_topology_lscpu_file (lscpu %s format): memory sizes and distances "
                        "unknown" % cpu_layout_host.get("format"))
    elif smi is not None:
        numa_nodes, unplaced = _nodes_from_smi(smi, warnings)
        warnings.append("NUMA nodes inferred from nvidia-smi topo text alone: memory sizes and distances unknown")
    else:
        numa_nodes = []
        warnings.append("no sysfs source: NUMA nodes unknown")
    nodes = _Nodes(numa_nodes)

    host_pci = (host or {}).get("pci") or []
    pci_by_bus = dict((p["pci_bus_id"], p) for p in host_pci)
    sysfs_gpus = gpu_functions(host) if host else []

    # --- GPU identity: NVML, else topo text rows, else sysfs PCI functions (PCI order)
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
    smi_rows = dict((row["index"], row) for row in (smi or {}).get("gpus", []))

    for gpu in gpus:
        label = "GPU %d" % gpu["index"]
        nv = gpu.pop("_nvml", None) or {}
        pci = pci_by_bus.get(gpu["pci_bus_id"]) if gpu["pci_bus_id"] else None
        if nvml is not None and host is not None and pci is None:
            warnings.append("%s (%s): not found in sysfs; its PCI placement comes from NVML only"
                            % (label, gpu["pci_bus_id"]))
        row = smi_rows.get(gpu["index"], {})

        affinity = None
        words = _value(nv.get("cpu_affinity_words"))
        if words:
            affinity = cpulist.cpus_from_affinity_words(words, nvml.get("cpu_word_bits", 64))
        if not affinity and pci and pci.get("local_cpulist"):
            affinity = cpulist.parse_cpulist(pci["local_cpulist"])
        if not affinity and row.get("cpu_affinity"):
            affinity = cpulist.parse_cpulist(row["cpu_affinity"])
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

        pcie = dict((k, _value(v)) for k, v in (nv.get("pcie") or {}).items())
        if not pcie and pci:
            pcie = {"gen_max": pcie_gen_from_speed(pci.get("max_link_speed")), "width_max": pci.get("max_link_width"),
                    "gen_current": pcie_gen_from_speed(pci.get("current_link_speed")),
                    "width_current": pci.get("current_link_width")}
        gpu["pcie"] = dict((k, pcie.get(k)) for k in ("gen_max", "width_max", "gen_current", "width_current"))
        mig = _value(nv.get("mig_mode"))
        gpu["mig_enabled"] = bool(mig and mig.get("current"))
        if gpu["mig_enabled"]:
            warnings.append("%s: MIG is enabled; its MIG instances keep this GPU's placement (node %s)"
                            % (label, node))
        gpu["memory_total_bytes"] = _value(nv.get("memory_total_bytes"))
        if pci and pci.get("msi_vectors"):
            gpu["irq_vectors"] = pci["msi_vectors"]

    # --- NICs and NVMe from sysfs, or NIC names from the topo text
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

    # --- link matrices: NVML, else topo text, else sysfs PCI paths
    gpu_links = gpu_link_matrix(nvml) if nvml is not None else None
    if gpu_links is None and smi is not None and len(smi["gpu_links"]) == len(gpus):
        gpu_links = [list(r) for r in smi["gpu_links"]]
    if gpu_links is None:
        gpu_links = _pci_matrix(gpus, gpus, pci_by_bus, same_list=True)
        if len(gpus) > 1:
            warnings.append("GPU links derived from PCIe paths in sysfs; NVLinks are not visible there")
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
        "sockets": sockets,
        "numa_nodes": numa_nodes,
        "gpus": gpus,
        "gpu_links": gpu_links,
        "nics": nics,
        "gpu_nic_links": gpu_nic_links,
        "nvme": nvme,
    }
    if unplaced:
        topology["unplaced_cpus"] = cpulist.format_cpulist(unplaced)
    if threads_per_core:
        topology["threads_per_core"] = threads_per_core
    topology["fingerprint"] = fingerprint(topology)
    return topology


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
    return str(version).split(".")[0]


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
