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

MemTotal itself drifts on some nodes: a VM whose hypervisor balloons or
hot-plugs memory (virtio-balloon, virtio-mem), or memory onlined late. A
drift that changes no decision must not rewrite the plan (and its backup)
on every run, so :func:`stable_capacity` keeps the capacity of the plan the
node runs (``applied_plan.memory_capacity``, same topology fingerprint and
reserve option) as long as every fit it decides is the one today's MemTotal
decides: the same instances bound, the same ones loosened to preferred,
nothing refused. Any decision that differs takes today's figures.
"""

from __future__ import annotations

import copy

from ansible.module_utils.gpunuma.common import sizes
from ansible.module_utils.gpunuma.common.sizes import format_gib
from ansible.module_utils.gpunuma.common.cpulist import format_cpulist
from ansible.module_utils.gpunuma.plan.model import is_int
from ansible.module_utils.gpunuma.plan.spill import spill_phrase

GIB = 1 << 30
MIB = 1 << 20
AUTO = "auto"
# GKE's memory reservation for system daemons and the kernel, by tier of the
# memory it applies to (docs/plan-v1.md cites it): 25% of the first 4 GiB,
# 20% of the next 4, 10% of the next 8, 6% of the next 112, 2% above 128 GiB.
_RESERVE_TIERS = ((4 * GIB, 25), (4 * GIB, 20), (8 * GIB, 10), (112 * GIB, 6), (None, 2))


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


def machine_memory(topo):
    """MemTotal of the machine: the sum over its CPU-bearing nodes whose size is known (0 when none is)."""
    return sum(topo.nodes[n].total for n in topo.cpu_node_ids if is_int(topo.nodes[n].total))


def node_capacity(node, reserve, machine_total=None):
    """``(capacity, reserve)`` of a node for bound memory, or ``(None, None)`` when MemTotal is unknown.

    ``reserve`` None (``auto``): GKE's tiers apply to the machine's memory
    (``machine_total``, the CPU-bearing nodes' MemTotal together; the node's
    own when not given), and each node keeps its share in proportion to its
    MemTotal. A size is kept back on every node.
    """
    if not is_int(node.total):
        return None, None
    if reserve is not None:
        kept = reserve
    else:
        whole = machine_total if machine_total and machine_total >= node.total else node.total
        kept = auto_reserve(whole) * node.total // whole if whole else 0
    # HugeTLB pools are in MemTotal but serve only hugetlbfs/MAP_HUGETLB mappings
    # (Documentation/admin-guide/mm/hugetlbpage.rst): never capacity for instances.
    kept += node.hugetlb
    return max(node.total - kept, 0), kept


def _totals_for(capacities, reserve):
    """The MemTotals whose capacities are ``capacities`` (``{node: bytes}``): the inverse of node_capacity."""
    if reserve is not None:
        return dict((n, c + reserve) for n, c in capacities.items())
    wanted = sum(capacities.values())
    low, high = wanted, 2 * wanted + GIB
    while low < high:
        mid = (low + high) // 2
        if mid - auto_reserve(mid) < wanted:
            low = mid + 1
        else:
            high = mid
    if not wanted:
        return dict((n, 0) for n in capacities)
    return dict((n, c * low // wanted) for n, c in capacities.items())


def applied_capacities(applied_plan, topo, reserve_option):
    """``{node id: (capacity, reserve, total)}`` from the plan the node runs, when it describes this topology.

    Only a plan for the same topology fingerprint and the same
    ``memory_reserve_per_node`` option, with a whole-byte capacity for every
    CPU-bearing node, counts; otherwise None.
    """
    if not isinstance(applied_plan, dict) or applied_plan.get("topology_fingerprint") != topo.fingerprint:
        return None
    options = applied_plan.get("options") if isinstance(applied_plan.get("options"), dict) else {}
    if options.get("memory_reserve_per_node", AUTO) != reserve_option:
        return None
    capacities = applied_plan.get("memory_capacity")
    if not isinstance(capacities, dict) or set(capacities) != set(str(n) for n in topo.cpu_node_ids):
        return None
    known = {}
    for node_id in topo.cpu_node_ids:
        value = capacities[str(node_id)]
        if value is None:
            if is_int(topo.nodes[node_id].total):
                return None
            continue
        if not is_int(value) or value < 0:
            return None
        known[node_id] = value
    kept = reserve_option if is_int(reserve_option) else None
    # the reserve is found from capacity plus the node's HugeTLB pools, which node_capacity took off
    totals = _totals_for(dict((n, c + topo.nodes[n].hugetlb) for n, c in known.items()), kept)
    return dict((n, (c, totals[n] - c, totals[n])) for n, c in known.items())


def _decisions(specs):
    return [(s.name, s.mem_policy, s.fallback is not None) for s in specs]


def stable_capacity(specs, topo, strict_capacity, problems, reserve, applied_plan, reserve_option):
    """check_capacity with the applied plan's capacities when they decide exactly as today's MemTotal does.

    Returns ``{node id: capacity}`` of the figures used (for the plan's
    ``memory_capacity``).
    """
    whole = machine_memory(topo)
    today = {n: node_capacity(topo.nodes[n], reserve, whole)[0] for n in topo.cpu_node_ids}
    kept = applied_capacities(applied_plan, topo, reserve_option)
    if kept and any(kept[n][0] != today[n] for n in kept):
        now_specs, now_problems = copy.deepcopy(specs), []
        check_capacity(now_specs, topo, strict_capacity, now_problems, reserve)
        old_specs, old_problems = copy.deepcopy(specs), []
        check_capacity(old_specs, topo, strict_capacity, old_problems, reserve, kept)
        if not now_problems and not old_problems and _decisions(now_specs) == _decisions(old_specs):
            check_capacity(specs, topo, strict_capacity, problems, reserve, kept)
            today.update((n, kept[n][0]) for n in kept)
            return today
    check_capacity(specs, topo, strict_capacity, problems, reserve)
    return today


def check_capacity(specs, topo, strict_capacity, problems, reserve=None, overrides=None):
    """Fit declared memory under ``bind``; loosen or refuse what does not fit or cannot be checked.

    ``overrides`` (``{node id: (capacity, reserve, total)}``) replaces a
    node's MemTotal-based figures (stable_capacity).
    """
    overrides = overrides or {}
    whole = machine_memory(topo)

    def figures(node_id):
        if node_id in overrides:
            return overrides[node_id]
        capacity, kept = node_capacity(topo.nodes[node_id], reserve, whole)
        return capacity, kept, topo.nodes[node_id].total

    groups = {}
    for spec in specs:
        memory = spec.memory_bytes
        if spec.mem_policy == "default" or not spec.mem_nodes:
            continue
        if memory is None:
            if spec.mem_policy == "bind":
                _unsized_bind(spec, strict_capacity, problems)
            continue
        nodes_text = format_cpulist(spec.mem_nodes)
        capacities = [figures(n) for n in spec.mem_nodes]
        if any(cap is None for cap, _unused, _unused in capacities):
            spec.warnings.append(
                "memory size of NUMA node %s is unknown; the %s declared for %s binding was not checked"
                % (nodes_text, format_gib(memory), spec.mem_policy)
            )
            continue
        if spec.mem_policy != "bind":
            if memory > sum(cap for cap, _unused, _unused in capacities):
                spec.warnings.append(
                    "memory %s declared exceeds what NUMA node %s holds for instances; %s"
                    % (format_gib(memory), nodes_text, spill_phrase(spec, topo))
                )
            continue
        groups.setdefault((spec.mem_nodes[0], memory), []).append((spec, capacities[0]))
    committed = {}
    for (node_id, memory), members in groups.items():
        _fit_group(node_id, memory, members, committed, strict_capacity, problems, topo.nodes[node_id].hugetlb)


def fits(capacity, need):
    """Whether ``need`` bytes under ``bind`` fit a node that holds ``capacity`` bytes for instances.

    The one capacity rule: the planner binds by it (check_capacity) and the
    policy gate judges a plan by it (overcommitted_nodes). A node whose size
    is unknown (``capacity`` None: an offline topology without node memory)
    is not judged: the planner binds there with a warning that the size was
    not checked, and the gate passes what the planner bound.
    """
    return capacity is None or need <= capacity


def overcommitted_nodes(plan: dict) -> list:
    """``[(node id, [instance names], bytes declared, capacity)]``: nodes of a plan whose bound memory does not fit.

    Sums the ``memory_bytes`` of the instances bound (``mem_policy: bind``) to
    one node and judges the sum by :func:`fits` against the plan's own
    ``memory_capacity``. A plan the planner made never has one: this is the
    verdict the planner reached, read back from the plan.
    """
    capacities: dict = plan["memory_capacity"] if isinstance(plan.get("memory_capacity"), dict) else {}
    per_node: dict = {}
    for item in plan.get("instances") or []:
        if not isinstance(item, dict) or item.get("mem_policy") != "bind":
            continue
        nodes = item.get("mem_nodes") or []
        if len(nodes) != 1 or not is_int(item.get("memory_bytes")):
            continue
        per_node.setdefault(nodes[0], []).append(item)
    over = []
    for node_id, items in sorted(per_node.items(), key=lambda pair: str(pair[0])):
        capacity = capacities.get(str(node_id))
        capacity = capacity if is_int(capacity) else None
        need = sum(i["memory_bytes"] for i in items)
        if not fits(capacity, need):
            over.append((node_id, [str(i.get("name")) for i in items], need, capacity))
    return over


def _fit_group(node_id, memory, members, committed, strict_capacity, problems, hugetlb):
    """Bind every instance of a group (same node, same declared memory) or none: identical instances, one decision."""
    capacity, kept, total = members[0][1]
    earlier = committed.get(node_id, 0)
    need = memory * len(members)
    if fits(capacity, earlier + need):
        committed[node_id] = earlier + need
        return
    specs = [spec for spec, _unused in members]
    if len(specs) == 1:
        declared = "memory %s declared" % format_gib(memory)
    else:
        declared = "memory %s declared by each of %d identical instances (%s: %s together)" % (
            format_gib(memory), len(specs), ", ".join(s.name for s in specs), format_gib(need))
    if earlier:
        declared += " (plus %s by earlier instances bound there)" % format_gib(earlier)
    room = "the %s NUMA node %d holds for instances (%s MemTotal minus a %s reserve%s)" % (
        format_gib(capacity),
        node_id,
        format_gib(total),
        format_gib(kept - hugetlb),
        " and %s of HugeTLB pools" % format_gib(hugetlb) if hugetlb else "",
    )
    if strict_capacity == "error":
        paths = ", ".join("%s.memory" % s.path for s in specs)
        problems.append(
            "%s: %s exceeds %s; membind fails allocations once the node is full; "
            "allowed: at most %s on this node%s, or strict_capacity: fallback to plan %s as preferred"
            % (paths, declared, room, format_gib(max(capacity - earlier, 0)),
               " for the group (equal instances get one decision)" if len(specs) > 1 else "",
               "them" if len(specs) > 1 else "it")
        )
        return
    for spec in specs:
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
