"""How :class:`plan.topology.PlanTopology` reads the topology document's parts: NICs and GPU-NIC links, SLIT
distances, hyperthread siblings, L3 groups, cores and GPU links (each problem names the field); the link ranks."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, infer_sibling_offset, parse_cpulist
from ansible.module_utils.gpunuma.common.errors import CpuListError
from ansible.module_utils.gpunuma.plan.model import is_int

_UUID_RE = re.compile(r"(GPU|MIG)-[A-Za-z0-9-]{1,80}")
_NIC_NAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_NVLINK_RE = re.compile(r"NV([0-9]{1,4})")
_XGMI_RE = re.compile(r"XGMI([0-9])")
_LINK_RANK = {"PIX": 6, "PXB": 5, "PHB": 4, "NODE": 3, "SYS": 2, "SOC": 2}


def link_rank(code):
    """Rank of a GPU link code: NV# (more links better) and XGMI<hops> (fewer hops better, XGMI0 between
    partitions of one GPU) > PIX > PXB > PHB > NODE > SYS. NVIDIA and AMD codes never meet in one pair."""
    if not isinstance(code, str):
        return 0
    code = code.strip().upper()
    match = _NVLINK_RE.fullmatch(code)
    if match:
        return 100 + int(match.group(1))
    match = _XGMI_RE.fullmatch(code)
    if match:
        return 100 - int(match.group(1))
    return _LINK_RANK.get(code, 0)


@dataclass
class PlanNic:
    name: str
    numa_node: Optional[int]
    rdma: bool  # an RDMA device (mlx5_0), not a plain netdev


class TopologyReaders:
    """The readers :class:`plan.topology.PlanTopology` builds itself with."""

    @staticmethod
    def _nics(raw_nics, problems):
        nics = []
        if raw_nics is None:
            return nics
        if not isinstance(raw_nics, list):
            problems.append("topology.nics: %r is not a list; allowed: a list of NIC mappings, or null" % (raw_nics,))
            return nics
        for pos, raw in enumerate(raw_nics):
            where = "topology.nics[%d]" % pos
            if not isinstance(raw, dict):
                problems.append("%s: %r is not a mapping; allowed: {name, netdevs, pci_bus_id, numa_node}" % (where, raw))
                continue
            name, node_id, netdevs = raw.get("name"), raw.get("numa_node"), raw.get("netdevs") or []
            if name is not None and (not isinstance(name, str) or not _NIC_NAME_RE.fullmatch(name)):
                problems.append(
                    "%s.name: %r is not a NIC name; allowed: letters, digits, _ . : - (mlx5_0, ens9f0np0), or null"
                    % (where, name)
                )
                continue
            if node_id is not None and not is_int(node_id):
                problems.append("%s.numa_node: %r is not a node id; allowed: an integer node id, or null" % (where, node_id))
                continue
            if not isinstance(netdevs, list):
                netdevs = []
            nics.append(PlanNic(name=name, numa_node=node_id, rdma=bool(name) and name not in netdevs))
        return nics

    def _nic_links(self, matrix, gpu_rows, gpu_count, warnings):
        """GPU index -> its row of GPU-NIC link codes (same order as ``self.nics``), when the matrix fits."""
        shaped = (
            isinstance(matrix, list)
            and len(matrix) == gpu_count
            and all(isinstance(row, list) and len(row) == len(self.nics) for row in matrix)
        )
        if not shaped:
            if self.nics and gpu_count:
                warnings.append(
                    "topology.gpu_nic_links is missing or not a %dx%d matrix; NICs are matched to GPUs by NUMA node only"
                    % (gpu_count, len(self.nics))
                )
            return {}
        return dict(
            (index, [code.strip().upper() if isinstance(code, str) else None for code in matrix[row]])
            for index, row in gpu_rows.items()
        )

    def _distances(self, raw_nodes):
        """Each node's SLIT row as ``{node id: distance}`` where the row has one whole number per listed node."""
        ids = [raw.get("id") if isinstance(raw, dict) else None for raw in raw_nodes]
        for raw in raw_nodes:
            if not isinstance(raw, dict) or raw.get("id") not in self.nodes:
                continue
            row = raw.get("distances")
            if isinstance(row, list) and len(row) == len(ids) and all(is_int(d) and d > 0 for d in row):
                self.nodes[raw["id"]].distance = dict((i, d) for i, d in zip(ids, row) if i in self.nodes)

    def _resolve_siblings(self, warnings):
        """Infer the sibling groups of nodes whose topology has none, or say they are unknown."""
        unknown = [n for n in self.cpu_node_ids if self.nodes[n].siblings == "unknown"]
        if not unknown:
            return
        half = infer_sibling_offset(dict((n, self.nodes[n].cpus) for n in self.cpu_node_ids))
        if half is not None and any(min(g) + half not in g for n in self.cpu_node_ids if self.nodes[n].siblings == "topology"
                                    for g in self.nodes[n].cores if len(g) == 2):
            # known cores elsewhere on the machine contradict the inferred pairing
            half = None
        nodes_text = ", ".join(str(n) for n in unknown)
        if half is not None:
            for node_id in unknown:
                node = self.nodes[node_id]
                node.cores = [frozenset([cpu, cpu + half]) for cpu in sorted(node.cpus) if cpu < half]
                node.siblings = "inferred"
            warnings.append(
                "hyperthread siblings of NUMA node %s are not in the topology (built without sysfs, e.g. from "
                "nvidia-smi topo -m alone); inferred as CPU N and N+%d: every node's CPUs are two equal ranges %d "
                "apart, the standard Linux x86 enumeration that NVIDIA's bind scripts assume. Discover the "
                "topology with sysfs to read them" % (nodes_text, half, half)
            )
            return
        warnings.append(
            "hyperthread siblings of NUMA node %s are unknown (no cores in the topology, e.g. built from "
            "nvidia-smi topo -m alone, and the CPU lists are not the two-ranges layout they can be inferred from): "
            "each CPU is planned as a core, so two workers may share a physical core and a worker may get the "
            "sibling of a housekeeping CPU. Discover the topology with sysfs to read them" % nodes_text
        )

    @staticmethod
    def _l3_groups(raw, node, where, problems):
        listed = raw.get("l3_groups")
        if listed is None or not node.cpus:
            return []
        if not isinstance(listed, list):
            problems.append(
                "%s.l3_groups: %r is not a list of CPU lists; allowed: a list like [\"0-3,128-131\"], or null"
                % (where, listed)
            )
            return []
        groups = []
        seen = frozenset()
        for pos, text in enumerate(listed):
            try:
                group = parse_cpulist(text, "%s.l3_groups[%d]" % (where, pos)) & node.cpus
            except CpuListError as exc:
                problems.append(str(exc))
                return []
            if group & seen:
                problems.append(
                    "%s.l3_groups[%d]: CPUs %s are also in an earlier group; allowed: disjoint L3 groups"
                    % (where, pos, format_cpulist(group & seen))
                )
                return []
            if group:
                groups.append(group)
                seen |= group
        return sorted(groups, key=min) if len(groups) > 1 else []

    @staticmethod
    def _cores(raw, node, where, warnings, problems):
        if not node.cpus:
            return []
        groups = []
        listed = raw.get("cores")
        if not listed:
            # null/absent and [] alike: a node with CPUs has at least one
            # core, so an empty list says "not known", never "none".
            node.siblings = "unknown"
            return [frozenset([cpu]) for cpu in sorted(node.cpus)]
        node.siblings = "topology"
        seen = set()
        for pos, text in enumerate(listed):
            try:
                group = parse_cpulist(text, "%s.cores[%d]" % (where, pos)) & node.cpus
            except CpuListError as exc:
                problems.append(str(exc))
                continue
            group = group - seen
            if group:
                groups.append(frozenset(group))
                seen |= group
        if listed and seen != node.cpus:
            warnings.append(
                "numa node %d: CPUs %s are in no cores group of the topology; each is treated as a core"
                % (node.id, format_cpulist(node.cpus - seen))
            )
        groups.extend(frozenset([cpu]) for cpu in sorted(node.cpus - seen))
        groups.sort(key=min)
        return groups

    def _links(self, matrix, warnings):
        count = len(self.gpu_ids)
        positions = dict((index, pos) for pos, index in enumerate(self.gpu_ids))
        ranks = {}
        shaped = (
            isinstance(matrix, list)
            and len(matrix) == count
            and all(isinstance(row, list) and len(row) == count for row in matrix)
        )
        if count > 1 and not shaped:
            warnings.append(
                "topology.gpu_links is missing or not a %dx%d matrix; GPU groups are chosen by NUMA node only"
                % (count, count)
            )
        for a in self.gpu_ids:
            for b in self.gpu_ids:
                if a < b:
                    rank = 0
                    if shaped:
                        rank = min(
                            link_rank(matrix[positions[a]][positions[b]]), link_rank(matrix[positions[b]][positions[a]])
                        )
                    ranks[(a, b)] = rank
        return ranks
