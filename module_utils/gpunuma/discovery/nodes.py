"""The NUMA nodes of a topology, from whichever source has them: sysfs, a user's lscpu, or the topo text.

sysfs lists every node with its CPUs, memory and distances; a user's
``lscpu`` capture gives nodes, siblings and L3 domains; ``nvidia-smi topo
-m`` gives only the nodes of its GPUs, from each GPU's CPU and NUMA
Affinity, and the nodes it leaves out are inferred or their CPUs named
(``cpu_layout.infer_missing_nodes``). Whatever the source, NUMA nodes whose
CPU sets overlap are refused (:func:`check_disjoint_nodes`), never repaired.
"""

from __future__ import annotations

from ansible.module_utils.gpunuma.common import cpulist
from ansible.module_utils.gpunuma.common.errors import TopologyError
from ansible.module_utils.gpunuma.discovery import cpu_layout

_MAX_LISTED = 10


class NodeIndex(object):
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


def nodes_from_smi(smi, warnings):
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
    unplaced = _add_missing_nodes(nodes, warnings)
    return nodes, unplaced


def _add_missing_nodes(nodes, warnings):
    """Add to ``nodes`` (from a topo text) the nodes its missing CPU ids prove, with a warning; return the CPUs
    that exist but cannot be placed (``cpu_layout.infer_missing_nodes``)."""
    inferred, unplaced = cpu_layout.infer_missing_nodes(
        dict((n["id"], cpulist.parse_cpulist(n["cpus"])) for n in nodes if n["has_cpus"]))
    taken = set(n["id"] for n in nodes)
    if any(node_id in taken for node_id, _unused in inferred):
        # a CPU-less node of the text already holds the id: the reading is not unique
        unplaced = frozenset().union(*[cpus for _unused, cpus in inferred])
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
            "to read them" % ("s" if len(inferred) > 1 else "", ", ".join(str(n) for n, _unused in inferred),
                              "are" if len(inferred) > 1 else "is",
                              "; ".join("node %d %s" % (n, cpulist.format_cpulist(c)) for n, c in inferred)))
    if unplaced:
        warnings.append(
            "CPUs %s are not in the nvidia-smi topo text, which lists only the nodes of its GPUs, and the NUMA "
            "nodes holding them cannot be inferred from it: instances are not bound to CPUs (unplaced_cpus). "
            "Discover with sysfs, or give gpu_topology_lscpu_file (`lscpu -p=CPU,CORE,SOCKET,NODE,CACHE`)"
            % cpulist.format_cpulist(unplaced))
    return unplaced


def l3_groups(cpus, l3_of):
    """The node's L3 cache groups (canonical lists), or None unless every CPU's L3 is known."""
    if not cpus or any(cpu not in l3_of for cpu in cpus):
        return None
    groups = []
    for cpu in sorted(cpus):
        group = cpulist.format_cpulist(cpulist.parse_cpulist(l3_of[cpu]) & cpus)
        if group not in groups:
            groups.append(group)
    return groups


def nodes_from_host(host):
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
        groups = l3_groups(cpus, l3_of)
        if groups is not None:
            nodes[-1]["l3_groups"] = groups
        if node.get("hugetlb_bytes"):
            nodes[-1]["hugetlb_bytes"] = node["hugetlb_bytes"]
    return nodes


def nodes_from_layout(layout, smi):
    """NUMA nodes from a user's lscpu capture (no memory, no distances), checked against the topo text's GPUs."""
    nodes = nodes_from_host(layout)
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
