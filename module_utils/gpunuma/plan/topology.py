"""The planner's view of a topology: checked NUMA nodes, their cores and housekeeping, GPUs, links.

``PlanTopology`` reads a ``gpunuma.topology/v1`` mapping, refuses what
cannot be planned on (NUMA nodes sharing CPUs, duplicate GPU indexes, fields
of the wrong type: each a problem naming the field), and splits every
CPU-bearing node into housekeeping cores and worker cores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, parse_cpulist
from ansible.module_utils.gpunuma.common.errors import CpuListError
from ansible.module_utils.gpunuma.node.housekeeping import irq_target, socket_mates
from ansible.module_utils.gpunuma.plan import partition
from ansible.module_utils.gpunuma.plan.model import TOPOLOGY_SCHEMA, PlanError, is_int
# The document's readers and the link ranks.
from ansible.module_utils.gpunuma.plan.topology_readers import _UUID_RE, TopologyReaders


AUTO_HOUSEKEEPING = "auto"
# One housekeeping core per this many cores of a node (at least one): the
# kernel, kubelet/containerd, NIC and GPU driver interrupts, and the
# engines' own API/tokenizer threads grow with the node (docs/plan-v1.md).
CORES_PER_HOUSEKEEPING_CORE = 24
# Device interrupt vectors one x86 CPU can take: vectors 0x20 (FIRST_EXTERNAL_VECTOR) up to the system
# vectors (FIRST_SYSTEM_VECTOR, 0xec on x86-64) in arch/x86/include/asm/irq_vectors.h, about 200; an
# smp_affinity write that would exceed a CPU's vector space fails (ENOSPC).
IRQ_VECTORS_PER_CPU = 200


def auto_housekeeping_cores(cores):
    """Housekeeping cores of a node of ``cores`` cores under ``auto``: ceil(cores / 24), at least 1."""
    if cores <= 0:
        return 0
    return max(1, -(-cores // CORES_PER_HOUSEKEEPING_CORE))


@dataclass
class PlanNode:
    """One NUMA node: its CPUs as whole cores, split into housekeeping and worker cores."""

    id: int
    cpus: frozenset
    free: Optional[int] = None
    total: Optional[int] = None
    hugetlb: int = 0  # bytes of persistent HugeTLB pools: in MemTotal, but not for ordinary allocations
    distance: dict = field(default_factory=dict)  # other node id -> SLIT distance; {} when unknown
    cores: List[frozenset] = field(default_factory=list)  # sibling groups, by lowest CPU
    # Where the sibling groups come from: "topology" (sysfs thread_siblings),
    # "inferred" (the standard x86 enumeration, see infer_siblings) or
    # "unknown" (each CPU planned as a core); "none" for a CPU-less node.
    siblings: str = "none"
    # L3 cache domains (sysfs cache/index3/shared_cpu_list), each a set of
    # this node's CPUs; [] when unknown or when the node has a single one.
    l3_groups: List[frozenset] = field(default_factory=list)
    housekeeping: List[frozenset] = field(default_factory=list)
    worker_cores: List[frozenset] = field(default_factory=list)
    worker_cpus: frozenset = frozenset()


@dataclass
class PlanGpu:
    index: int
    uuid: Optional[str]
    node: Optional[int]  # CPU-bearing binding node, or None when unknown
    mig: bool = False
    vendor: str = "nvidia"  # the topology's ``vendor`` (absent: nvidia)


# The vendors a topology's GPUs may name, and the variable that selects an instance's GPUs for each
# (docs/plan-v1.md, "GPU environment").
GPU_VENDORS = ("nvidia", "amd")


class PlanTopology(TopologyReaders):
    """The parts of a ``gpunuma.topology/v1`` document the planner uses, checked."""

    def __init__(self, topology, housekeeping_cores, warnings, housekeeping_cpus=None, irq_pin=False):
        """``housekeeping_cores``: a count per node or ``"auto"``; ``housekeeping_cpus``: an explicit
        CPU set (reservedSystemCPUs / CpuSpecList style) that overrides the count."""
        problems = []
        self._check_document(topology, warnings, problems)
        self.nodes = {}
        owners = {}
        for pos, raw in enumerate(topology["numa_nodes"]):
            node = self._read_node(raw, "topology.numa_nodes[%d]" % pos, owners, warnings, problems)
            if node is not None:
                self.nodes[node.id] = node
        self.cpu_node_ids = sorted(n for n in self.nodes if self.nodes[n].cpus)
        self.all_cpus = frozenset(owners)
        self._distances(topology["numa_nodes"])
        # Threads per core a user's lscpu summary states (explicit evidence where siblings are not listed).
        tpc = topology.get("threads_per_core")
        self.threads_per_core = tpc if is_int(tpc) and tpc > 0 else None
        # CPUs a text-only discovery proved to exist but could not place on a node.
        self.unplaced_cpus = frozenset()
        if topology.get("unplaced_cpus"):
            try:
                self.unplaced_cpus = parse_cpulist(topology["unplaced_cpus"], "topology.unplaced_cpus")
            except CpuListError as exc:
                problems.append(str(exc))
        self._resolve_siblings(warnings)
        self.usable_cpus, self.ungranted_nodes = self._narrow(topology, warnings, problems)

        self.gpus = {}
        gpu_rows = {}
        for pos, raw in enumerate(topology["gpus"]):
            gpu = self._read_gpu(raw, "topology.gpus[%d]" % pos, warnings, problems)
            if gpu is not None:
                self.gpus[gpu.index] = gpu
                gpu_rows[gpu.index] = pos
        self.nics = self._nics(topology.get("nics"), problems)
        self.nic_links = self._nic_links(topology.get("gpu_nic_links"), gpu_rows, len(topology["gpus"]), warnings)
        if problems:
            raise PlanError(problems)
        self.irq_vectors = self._irq_vectors(topology)
        self._split_housekeeping(topology, housekeeping_cores, housekeeping_cpus, warnings, irq_pin)
        self.gpu_ids = sorted(self.gpus)
        self.links = self._links(topology.get("gpu_links"), warnings)

    def _check_document(self, topology, warnings, problems):
        """The document's schema, its two lists and its host name (``hostname``, ``fingerprint`` set)."""
        if not isinstance(topology, dict):
            raise PlanError("topology: must be a %s mapping, got %s" % (TOPOLOGY_SCHEMA, type(topology).__name__))
        if topology.get("schema") != TOPOLOGY_SCHEMA:
            raise PlanError(
                "topology.schema: %r is not supported; allowed: %s" % (topology.get("schema"), TOPOLOGY_SCHEMA)
            )
        for key in ("numa_nodes", "gpus"):
            if not isinstance(topology.get(key), list):
                problems.append("topology.%s: must be a list" % key)
        if problems:
            raise PlanError(problems)
        self.hostname = topology.get("hostname") or "this host"
        self.fingerprint = topology.get("fingerprint")
        if topology.get("complete") is False:
            warnings.append(
                "topology of %s is incomplete (a discovery source failed); the plan may miss GPUs or nodes"
                % self.hostname
            )
        hostname = topology.get("hostname")
        if hostname is not None and not isinstance(hostname, str):
            problems.append("topology.hostname: %r is not a host name; allowed: a string or null" % (hostname,))
            self.hostname = "this host"

    def _read_node(self, raw, where, owners, warnings, problems):
        """One ``numa_nodes`` entry as a PlanNode (its CPUs added to ``owners``), or None with a problem."""
        if not isinstance(raw, dict) or isinstance(raw.get("id"), bool) or not isinstance(raw.get("id"), int):
            problems.append("%s: must be a mapping with an integer id" % where)
            return None
        try:
            cpus = parse_cpulist(raw.get("cpus") or "", "%s.cpus" % where)
        except CpuListError as exc:
            problems.append(str(exc))
            return None
        if raw["id"] in self.nodes:
            problems.append("%s.id: node %d appears twice" % (where, raw["id"]))
            return None
        shared = cpus & frozenset(owners)
        if shared:
            problems.append(
                "%s.cpus: CPUs %s also belong to NUMA node %s; allowed: NUMA nodes with disjoint CPU sets "
                "(each CPU on exactly one node, as /sys/devices/system/node/node*/cpulist lists them); "
                "discover the topology again or repair the file"
                % (where, format_cpulist(shared), ", ".join(str(n) for n in sorted(set(owners[c] for c in shared))))
            )
            return None
        owners.update((cpu, raw["id"]) for cpu in cpus)
        bad_bytes = False
        for key in ("memory_total_bytes", "memory_free_bytes", "hugetlb_bytes"):
            value = raw.get(key)
            if value is not None and (not is_int(value) or value < 0):
                problems.append("%s.%s: %r is not a byte count; allowed: an integer 0 or more, or null" % (where, key, value))
                bad_bytes = True
        if raw.get("cores") is not None and not isinstance(raw.get("cores"), list):
            problems.append(
                "%s.cores: %r is not a list of hyperthread sibling groups; allowed: a list of CPU list strings, or null"
                % (where, raw.get("cores"))
            )
            return None
        if bad_bytes:
            return None
        node = PlanNode(
            id=raw["id"],
            cpus=cpus if raw.get("has_cpus", True) is not False else frozenset(),
            free=raw.get("memory_free_bytes"),
            total=raw.get("memory_total_bytes"),
            hugetlb=raw.get("hugetlb_bytes") or 0,
        )
        node.cores = self._cores(raw, node, where, warnings, problems)
        node.l3_groups = self._l3_groups(raw, node, where, problems)
        return node

    def _narrow(self, topology, warnings, problems):
        """``(usable CPUs, ids of nodes left without one)``: each node keeps only the CPUs the node grants its
        services (``cpus_granted``) that are not isolated (``cpus_isolated``); its cores and L3 groups follow."""
        narrowing = {}
        for key in ("cpus_granted", "cpus_isolated"):
            if topology.get(key) is not None:
                try:
                    narrowing[key] = parse_cpulist(topology[key], "topology." + key)
                except CpuListError as exc:
                    problems.append(str(exc))
        granted = narrowing.get("cpus_granted", self.all_cpus) & self.all_cpus
        isolated = narrowing.get("cpus_isolated", frozenset()) & granted
        usable = granted - isolated
        if usable == self.all_cpus:
            return usable, frozenset()
        said = []
        if granted != self.all_cpus:
            said.append("CPUs %s are outside what the node grants its services (cpus_granted %s: the cpuset above "
                        "PID 1's cgroup, or PID 1's Cpus_allowed_list); numactl refuses them, so they are not "
                        "planned" % (format_cpulist(self.all_cpus - granted), format_cpulist(granted)))
        if isolated:
            said.append("isolated CPUs %s (isolcpus=domain) are not planned: the scheduler does not balance a "
                        "worker's threads across them, and services started outside an explicit affinity never run "
                        "there (Documentation/admin-guide/kernel-parameters.txt, isolcpus)" % format_cpulist(isolated))
        emptied = set()
        for node in self.nodes.values():
            if not node.cpus or node.cpus <= usable:
                continue
            if not node.cpus & usable:
                emptied.add(node.id)
            node.cpus &= usable
            node.cores = [core & usable for core in node.cores if core & usable]
            node.l3_groups = [group & usable for group in node.l3_groups if group & usable]
        if emptied:
            said.append("NUMA node %s keeps no CPU to plan on" % ", ".join(str(n) for n in sorted(emptied)))
        self.cpu_node_ids = sorted(n for n in self.nodes if self.nodes[n].cpus)
        warnings.append("%s: %s" % (self.hostname, "; ".join(said)))
        return usable, frozenset(emptied)

    def _read_gpu(self, raw, where, warnings, problems):
        """One ``gpus`` entry as a PlanGpu (a node that is not CPU-bearing becomes None), or None with a problem."""
        if not isinstance(raw, dict) or isinstance(raw.get("index"), bool) or not isinstance(raw.get("index"), int):
            problems.append("%s: must be a mapping with an integer index" % where)
            return None
        index = raw["index"]
        if index in self.gpus:
            problems.append("%s.index: GPU %d appears twice; allowed: each index once" % (where, index))
            return None
        node_id = raw.get("numa_node")
        uuid = raw.get("uuid") or None
        if uuid is not None and (not isinstance(uuid, str) or not _UUID_RE.fullmatch(uuid)):
            problems.append(
                "%s.uuid: %r is not a GPU UUID; allowed: GPU-<hex digits and dashes> as NVML reports it, or null"
                % (where, uuid)
            )
            return None
        if node_id is not None and not is_int(node_id):
            problems.append("%s.numa_node: %r is not a node id; allowed: an integer node id, or null" % (where, node_id))
            return None
        if node_id in self.ungranted_nodes:
            warnings.append(
                "GPU %d is on NUMA node %d, which keeps no CPU the node grants its services (cpus_granted, "
                "cpus_isolated); the GPU is treated as having no known node" % (index, node_id)
            )
            node_id = None
        elif node_id is not None and (node_id not in self.nodes or not self.nodes[node_id].cpus):
            warnings.append(
                "topology gives GPU %d numa_node %r, which is not a CPU-bearing node; the GPU is treated as having no known node"
                % (index, node_id)
            )
            node_id = None
        vendor = raw.get("vendor", "nvidia")
        if vendor not in GPU_VENDORS:
            problems.append("%s.vendor: %r is not a GPU vendor; allowed: %s (absent: nvidia)"
                            % (where, vendor, ", ".join(GPU_VENDORS)))
            return None
        return PlanGpu(index=index, uuid=uuid, node=node_id, mig=bool(raw.get("mig_enabled")), vendor=vendor)

    def nics_near_gpu(self, index):
        """``(names, how)``: the NICs nearest GPU ``index``: PIX, else PXB, else the GPU's node; ``([], None)``."""
        row = self.nic_links.get(index)
        if row:
            for code in ("PIX", "PXB"):
                names = [nic.name for nic, link in zip(self.nics, row) if link == code and nic.name]
                if names:
                    return names, code
        node_id = self.gpus[index].node
        if node_id is not None:
            names = [nic.name for nic in self.nics if nic.numa_node == node_id and nic.name]
            if names:
                return names, "NODE"
        return [], None

    def nics_on_node(self, node_id):
        return [nic.name for nic in self.nics if nic.numa_node == node_id and nic.name]

    def nic(self, name):
        for nic in self.nics:
            if nic.name == name:
                return nic
        return None

    def _irq_vectors(self, topology):
        """``{node id: MSI/MSI-X vectors}`` of the GPUs and NICs on each node (topology ``irq_vectors``)."""
        found = {}
        for key in ("gpus", "nics"):
            for raw in topology.get(key) or []:
                if not isinstance(raw, dict):
                    continue
                count, node_id = raw.get("irq_vectors"), raw.get("numa_node")
                if is_int(count) and count > 0 and is_int(node_id) and node_id in self.nodes:
                    found[node_id] = found.get(node_id, 0) + count
        return found

    def _auto_sizes(self, topology, irq_pin, warnings):
        """Housekeeping cores per node under ``auto``: ceil(cores / 24) on the nodes that keep it, 0 on GPU nodes
        where GPU-less nodes exist; with IRQ pinning, at least enough CPUs for the vectors pinned there."""
        gpu_nodes = set(g.node for g in self.gpus.values() if g.node is not None)
        gpu_less = [n for n in self.cpu_node_ids if n not in gpu_nodes]
        sizes = {}
        for node_id in self.cpu_node_ids:
            if gpu_nodes and node_id in gpu_nodes and self._gpu_less_mate(topology, node_id, gpu_less):
                sizes[node_id] = 0  # the system runs on the GPU-less nodes of its socket
            else:
                sizes[node_id] = auto_housekeeping_cores(len(self.nodes[node_id].cores))
        if not irq_pin:
            return sizes
        pinned = {}
        keeping = dict((str(n), size) for n, size in sizes.items())
        for node_id, count in self.irq_vectors.items():
            # The node whose housekeeping takes them: the one rule IRQ pinning itself follows (own node, else the
            # nearest socket mate that keeps some, never another socket).
            _unused, target = irq_target(topology, keeping, node_id)
            if target is not None:
                pinned[target] = pinned.get(target, 0) + count
        for node_id, count in sorted(pinned.items()):
            cores = self.nodes[node_id].cores
            threads = max(len(core) for core in cores) if cores else 1
            need_cpus = -(-count // IRQ_VECTORS_PER_CPU)
            need = -(-need_cpus // threads)
            if need > sizes[node_id] and len(cores) > 1:
                grown = min(need, len(cores) - 1)
                warnings.append(
                    "housekeeping on NUMA node %d: %d cores instead of %d, for the %d interrupt vectors IRQ pinning "
                    "puts there (x86 gives each CPU about %d vectors for devices: arch/x86/include/asm/irq_vectors.h; "
                    "set housekeeping_cores_per_node to choose)" % (node_id, grown, sizes[node_id], count,
                                                                    IRQ_VECTORS_PER_CPU))
                sizes[node_id] = grown
        return sizes

    def _gpu_less_mate(self, topology, node_id, gpu_less):
        """Whether a GPU-less node on ``node_id``'s socket keeps the housekeeping for it (NPS/SNC: the GPU node
        then keeps none). Each node its own socket (``sockets`` = CPU-bearing nodes): never, so a socket that holds
        every GPU keeps housekeeping of its own for its interrupts. Sockets that cannot be told apart (no
        distances): any GPU-less node, as before sockets were read."""
        if not gpu_less:
            return False
        mates = socket_mates(topology, node_id)
        if len(mates) > 1:
            return any(mate in gpu_less for mate in mates[1:])
        return topology.get("sockets") != len([n for n in topology.get("numa_nodes") or []
                                               if isinstance(n, dict) and n.get("has_cpus")])

    def _split_housekeeping(self, topology, count, cpus, warnings, irq_pin=False):
        """Each CPU-bearing node's housekeeping cores (whole cores, lowest first) and worker cores."""
        sizes = self._auto_sizes(topology, irq_pin, warnings) if count == AUTO_HOUSEKEEPING and cpus is None else {}
        for node_id in self.cpu_node_ids:
            node = self.nodes[node_id]
            if cpus is not None:
                node.housekeeping = [core for core in node.cores if core & cpus]
                split = [core for core in node.housekeeping if not core <= cpus]
                if split:
                    warnings.append(
                        "housekeeping_cpus %s split hyperthread sibling groups %s on NUMA node %d; the whole cores "
                        "are kept for housekeeping" % (format_cpulist(cpus & node.cpus), ", ".join(
                            format_cpulist(core) for core in split), node_id)
                    )
                why = "housekeeping_cpus: %s" % (format_cpulist(cpus) or '""')
            elif count == AUTO_HOUSEKEEPING:
                node.housekeeping = partition.take(node.cores, node.l3_groups, sizes[node_id])
                why = "housekeeping_cores_per_node: auto"
            else:
                node.housekeeping = partition.take(node.cores, node.l3_groups, count)
                why = "housekeeping_cores_per_node: %d" % count
            kept = set(node.housekeeping)
            node.worker_cores = [core for core in node.cores if core not in kept]
            node.worker_cpus = frozenset().union(*node.worker_cores) if node.worker_cores else frozenset()
            if not node.worker_cores:
                warnings.append(
                    "numa node %d has %d cores, all kept for housekeeping (%s); no worker can bind there"
                    % (node.id, len(node.cores), why)
                )

    def link(self, a, b):
        return self.links[(a, b) if a < b else (b, a)]
