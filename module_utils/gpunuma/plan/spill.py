"""Where memory goes past an instance's nodes: ranks an engine binds node by node, spill, Grace HBM.

``capacity.py`` fits each instance's declared memory on its node under the
instance's own policy. This module follows the memory further: the ranks
of an engine whose flags bind each one to its GPU's node (checked node by
node), what ``preferred`` and ``interleave`` do with what does not fit
(spill, only where another node has memory), and where a ``preferred``
spill lands on Grace machines, whose GPU memory is a NUMA node of its own.
"""

from __future__ import annotations

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist
from ansible.module_utils.gpunuma.common.sizes import format_gib


def _rank_membind(spec):
    """Whether the engine flags gpunuma added bind each rank's memory to its GPU's node (engines.py)."""
    return bool(spec.engine_args) and spec.engine in ("vllm", "sglang")


def check_rank_capacity(specs, topo, capacity, strict_capacity, problems):
    """The memory of instances whose ranks the engine binds node by node, against each node's capacity.

    vLLM's ``--numa-bind`` runs every worker under ``--membind=<its node>``
    and SGLang's ``--numa-node`` does the same, whatever the instance-wide
    policy: an instance that spans nodes and is planned ``interleave`` (which
    can spill) then holds ``memory`` / ranks on each rank's node, and cannot
    spill. Each node's share (ranks there x memory per rank) is checked
    against its capacity minus what instances bound there already declared.
    One that does not fit: refused with ``strict_capacity: error``, else the
    engine flags are dropped (the ranks then follow the instance's policy,
    which can spill), with a warning. ``capacity``: ``{node id: bytes or None}``.
    """
    # Each instance's memory is counted once: as the instance (bound to its node) or, where the engine binds its
    # ranks node by node, as its ranks' shares; never both.
    committed = {}
    for spec in specs:
        if spec.mem_policy == "bind" and spec.memory_bytes and spec.mem_nodes and not _rank_membind(spec):
            committed[spec.mem_nodes[0]] = committed.get(spec.mem_nodes[0], 0) + spec.memory_bytes
    for spec in specs:
        if not _rank_membind(spec):
            continue
        nodes = [topo.gpus[g].node for g in spec.gpus]
        if spec.memory_bytes is None:
            # Ranks bound node by node follow the rule of an instance bound to its node: unsized, never bound.
            why = ("engine %s binds each rank's memory to its GPU's node (--membind, which cannot spill), and no "
                   "memory is declared, so what each node must hold cannot be checked" % spec.engine)
            if strict_capacity == "error":
                problems.append("%s.memory: missing: %s; allowed: the instance's memory (a size like 64G, split "
                                "over its ranks), or strict_capacity: fallback to leave the ranks to the "
                                "instance's %s policy" % (spec.path, why, spec.mem_policy))
                continue
            spec.engine_args = []
            spec.warnings.append("%s: the engine's binding flags are not added, and the ranks follow the instance's "
                                 "%s policy; declare memory (the instance's total) to bind them" % (why, spec.mem_policy))
            continue
        per_rank = spec.memory_bytes // len(nodes)
        demand = dict((n, per_rank * nodes.count(n)) for n in sorted(set(nodes)))
        over = []
        for node_id, need in demand.items():
            room = capacity.get(node_id)
            if room is None:
                continue
            free = room - committed.get(node_id, 0)
            if need > free:
                over.append("%s on NUMA node %d (%d rank%s x %s; %s left of the %s it holds for instances)" % (
                    format_gib(need), node_id, nodes.count(node_id), "s" if nodes.count(node_id) > 1 else "",
                    format_gib(per_rank), format_gib(max(free, 0)), format_gib(room)))
        if not over:
            for node_id, need in demand.items():
                committed[node_id] = committed.get(node_id, 0) + need
            continue
        why = ("engine %s binds each rank's memory to its GPU's node (--membind, which cannot spill): memory %s "
               "declared means %s" % (spec.engine, format_gib(spec.memory_bytes), "; ".join(over)))
        if strict_capacity == "error":
            problems.append("%s.memory: %s; allowed: less memory per rank, or strict_capacity: fallback to leave the "
                            "ranks to the instance's %s policy" % (spec.path, why, spec.mem_policy))
            continue
        spec.engine_args = []
        spec.warnings.append("%s: the engine's binding flags are not added, and the ranks follow the instance's %s "
                             "policy (%s)" % (why, spec.mem_policy, spill_phrase(spec, topo)))


def spill_phrase(spec, topo):
    """What happens to allocations past the instance's nodes under its policy: said only as the policy allows.

    ``preferred`` and ``interleave`` fall back to other nodes (the kernel's
    zonelist, nearest first; Documentation/admin-guide/mm/numa_memory_policy.rst),
    but only to nodes that have memory; ``bind`` never does.
    """
    if spec.mem_policy == "bind":
        return "membind does not spill: allocations past its nodes fail (OOM)"
    others = sorted(n for n, node in topo.nodes.items()
                    if n not in spec.mem_nodes and (node.total is None or node.total > 0))
    if not others:
        return "no other NUMA node has memory to spill to, so allocations past them fail (OOM)"
    return "allocations will spill to other nodes (%s)" % format_cpulist(others)


def _has_memory(node):
    return node.total is None or node.total > 0


def check_preferred_spill(specs, topo, preferred_many):
    """Where a ``preferred`` instance's memory goes when its node is full, when that is a GPU's memory.

    The kernel falls back along the preferred node's zonelist, nearest node
    first by SLIT (Documentation/admin-guide/mm/numa_memory_policy.rst). On
    Grace machines the GPUs' HBM is a CPU-less NUMA node: where it is nearer
    than every other CPU node with memory, the spill lands in GPU memory.
    ``MPOL_PREFERRED_MANY`` (set_mempolicy(2), Linux 5.15; ``numactl
    --preferred-many``) over the instance's node and the other CPU nodes keeps
    it on CPU memory first; it is used where ``preferred_many`` says the node
    accepts it (the role probes ``numactl --preferred-many``), else a warning
    says where the spill goes. With no other CPU node with memory (GH200: one
    Grace node and its HBM) a warning says that the spill can only go to HBM.
    """
    for spec in specs:
        spec.preferred_many = None
        if spec.mem_policy != "preferred" or not spec.mem_nodes:
            continue
        home = topo.nodes[spec.mem_nodes[0]]
        if not home.distance:
            continue
        others = [n for n in sorted(home.distance, key=lambda n: (home.distance[n], n))
                  if n != home.id and _has_memory(topo.nodes[n])]
        if not others or topo.nodes[others[0]].cpus:
            continue  # the nearest other memory is a CPU node's: spill goes there first
        gpu_memory = [n for n in others if not topo.nodes[n].cpus and home.distance[n] <= home.distance[others[0]]]
        cpu_nodes = [n for n in others if topo.nodes[n].cpus]
        where = ("GPU memory node%s %s (HBM, SLIT distance %d)" % (
            "s" if len(gpu_memory) > 1 else "", format_cpulist(gpu_memory), home.distance[others[0]]))
        if not cpu_nodes:
            spec.warnings.append(
                "preferred: when NUMA node %d is full, allocations go to %s: no other CPU node has memory, so a "
                "spill can only land in GPU memory; declare memory and keep it within the node's capacity to keep "
                "the instance in CPU memory" % (home.id, where))
            continue
        if preferred_many and spec.binding_method == "numactl":
            spec.preferred_many = [home.id] + cpu_nodes
            spec.warnings.append(
                "preferred-many: NUMA node %d first, then CPU node%s %s, before %s (MPOL_PREFERRED_MANY, Linux 5.15+)"
                % (home.id, "s" if len(cpu_nodes) > 1 else "", format_cpulist(cpu_nodes), where))
            continue
        spec.warnings.append(
            "preferred: when NUMA node %d is full, allocations go to %s before CPU node%s %s; numactl "
            "--preferred-many (MPOL_PREFERRED_MANY, Linux 5.15+) would keep them on CPU memory, but %s"
            % (home.id, where, "s" if len(cpu_nodes) > 1 else "", format_cpulist(cpu_nodes),
               "the node did not accept it" if preferred_many is False else
               "binding_method systemd has no such policy" if spec.binding_method != "numactl" else
               "whether the node accepts it is not known to the planner"))
