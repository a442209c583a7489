"""Memory capacity: whether an instance's declared ``memory`` fits the node it is bound to.

Under ``bind`` an allocation fails once the node is full, so an instance
that does not fit is planned as ``preferred`` (``strict_capacity:
fallback``) or refused (``error``); one that declares no ``memory`` cannot
be checked at all and is planned as ``preferred`` too (or refused).

Capacity comes from figures that do not move while the node runs: the
node's ``memory_total_bytes`` (MemTotal) minus a reserve for the kernel and
system daemons, minus the memory declared by the instances planned before it
on that node. Free memory (MemFree) is never used: it counts reclaimable page
cache as used, so after a model's weights are read it drops to near zero and
a re-run would demote a strict instance to preferred (and restart it).
Page cache is reclaimable and is counted as available. Messages name the
capacity, which is fixed for the hardware and options, so a re-run on an
unchanged node writes the same plan and restarts nothing.
"""

from __future__ import annotations

from ansible.module_utils.gpunuma.common import sizes
from ansible.module_utils.gpunuma.common.cpulist import format_cpulist
from ansible.module_utils.gpunuma.plan.model import is_int

_GIB = float(1 << 30)
GIB = 1 << 30
MIB = 1 << 20
AUTO = "auto"
# GKE's memory reservation for system daemons and the kernel, by tier of the
# memory it applies to (docs/plan-v1.md cites it): 25% of the first 4 GiB,
# 20% of the next 4, 10% of the next 8, 6% of the next 112, 2% above 128 GiB.
_RESERVE_TIERS = ((4 * GIB, 25), (4 * GIB, 20), (8 * GIB, 10), (112 * GIB, 6), (None, 2))


def format_gib(count):
    return "%.1f GiB" % (count / _GIB)


def auto_reserve(total):
    """The default reserve of a node of ``total`` bytes (GKE's tiers; 255 MiB below 1 GiB)."""
    if total < GIB:
        return min(total, 255 * MIB)
    reserve = 0
    rest = total
    for size, percent in _RESERVE_TIERS:
        part = rest if size is None else min(rest, size)
        reserve += part * percent // 100
        rest -= part
        if rest <= 0:
            break
    return reserve


def parse_reserve(value, problems):
    """``memory_reserve_per_node``: ``auto`` (None here) or bytes; problems for anything else."""
    if value is None or value == AUTO:
        return None
    try:
        return sizes.parse_size(value, "memory_reserve_per_node", allowed="auto, bytes as an integer, or a size like 16G")
    except sizes.SizeError as exc:
        problems.append(str(exc))
        return None


def node_capacity(node, reserve):
    """``(capacity, reserve)`` of a node for bound memory, or ``(None, None)`` when MemTotal is unknown."""
    if not is_int(node.total):
        return None, None
    kept = auto_reserve(node.total) if reserve is None else reserve
    return max(node.total - kept, 0), kept


def check_capacity(specs, topo, strict_capacity, problems, reserve=None):
    """Fit declared memory under ``bind``; loosen or refuse what does not fit or cannot be checked."""
    committed = {}
    for spec in specs:
        memory = spec.memory_bytes
        if spec.mem_policy == "default" or not spec.mem_nodes:
            continue
        if memory is None:
            if spec.mem_policy == "bind":
                _unsized_bind(spec, strict_capacity, problems)
            continue
        nodes_text = format_cpulist(spec.mem_nodes)
        capacities = [node_capacity(topo.nodes[n], reserve) for n in spec.mem_nodes]
        if any(cap is None for cap, _ in capacities):
            spec.warnings.append(
                "memory size of NUMA node %s is unknown; the %s declared for %s binding was not checked"
                % (nodes_text, format_gib(memory), spec.mem_policy)
            )
            continue
        if spec.mem_policy != "bind":
            if memory > sum(cap for cap, _ in capacities):
                spec.warnings.append(
                    "memory %s declared exceeds what NUMA node %s holds for instances; allocations will spill to other nodes"
                    % (format_gib(memory), nodes_text)
                )
            continue
        node_id = spec.mem_nodes[0]
        capacity, kept = capacities[0]
        earlier = committed.get(node_id, 0)
        if earlier + memory <= capacity:
            committed[node_id] = earlier + memory
            continue
        declared = "memory %s declared%s" % (
            format_gib(memory),
            " (plus %s by earlier instances bound there)" % format_gib(earlier) if earlier else "",
        )
        room = "the %s NUMA node %d holds for instances (%s MemTotal minus a %s reserve)" % (
            format_gib(capacity),
            node_id,
            format_gib(topo.nodes[node_id].total),
            format_gib(kept),
        )
        if strict_capacity == "error":
            problems.append(
                "%s.memory: %s exceeds %s; membind fails allocations once the node is full; "
                "allowed: at most %s on this node, or strict_capacity: fallback to plan it as preferred"
                % (spec.path, declared, room, format_gib(max(capacity - earlier, 0)))
            )
            continue
        spec.mem_policy = "preferred"
        spec.fallback = (
            "%s exceeds %s; membind fails allocations once the node is full: "
            "planned as preferred (memory spills to other nodes instead of failing)" % (declared, room)
        )
        spec.warnings.append(spec.fallback)


def _unsized_bind(spec, strict_capacity, problems):
    """``bind`` with no declared memory: no capacity reasoning is possible, so a full node means OOM kills."""
    if strict_capacity == "error":
        problems.append(
            "%s.memory: missing, so membind to NUMA node %s cannot be checked against the node's capacity "
            "(a full node then means allocation failures and OOM kills, not spill); allowed: the memory the "
            "instance needs on its node (a size like 64G), or strict_capacity: fallback to plan it as preferred"
            % (spec.path, format_cpulist(spec.mem_nodes))
        )
        return
    spec.mem_policy = "preferred"
    spec.fallback = (
        "no memory declared, so membind to NUMA node %s cannot be checked against the node's capacity "
        "(a full node would mean allocation failures and OOM kills, not spill): planned as preferred; "
        "declare memory (e.g. memory: 64G) to bind" % format_cpulist(spec.mem_nodes)
    )
    spec.warnings.append(spec.fallback)
