"""Memory capacity: whether an instance's declared ``memory`` fits the node it is bound to.

Under ``bind`` an allocation fails once the node is full, so an instance
that does not fit is planned as ``preferred`` (``strict_capacity:
fallback``) or refused (``error``). Messages name no free amount, which
moves with every allocation on the node: a re-run on an unchanged node
writes the same plan and restarts nothing.
"""

from __future__ import annotations

from ansible.module_utils.gpunuma.cpulist import format_cpulist
from ansible.module_utils.gpunuma.plan_model import is_int

_GIB = float(1 << 30)


def format_gib(count):
    return "%.1f GiB" % (count / _GIB)


def held_by_applied(applied_plan, topo, specs):
    """Memory the applied plan's instances already hold, per node.

    Re-planning a node that runs its instances sees their own memory as used:
    without adding it back, a strict instance that fitted at its first start
    would be re-planned as preferred (and restarted) on the next run. Only
    instances still in the inventory and applied under ``bind`` count, and
    only when the applied plan was made for the same hardware.
    """
    held = {}
    if not isinstance(applied_plan, dict) or applied_plan.get("topology_fingerprint") != topo.fingerprint:
        return held
    names = set(spec.name for spec in specs)
    for item in applied_plan.get("instances") or []:
        if not isinstance(item, dict) or item.get("name") not in names:
            continue
        memory, nodes = item.get("memory_bytes"), item.get("mem_nodes") or []
        # Only membind instances: one that already fell back to preferred
        # must not be re-planned as fitting (and flip back and forth).
        if is_int(memory) and len(nodes) == 1 and item.get("mem_policy") == "bind":
            held[nodes[0]] = held.get(nodes[0], 0) + memory
    return held


def check_capacity(specs, topo, strict_capacity, problems, applied_plan=None):
    committed = {}
    held = held_by_applied(applied_plan, topo, specs)
    for spec in specs:
        memory = spec.memory_bytes
        if memory is None or spec.mem_policy == "default" or not spec.mem_nodes:
            continue
        frees = [topo.nodes[n].free for n in spec.mem_nodes]
        nodes_text = format_cpulist(spec.mem_nodes)
        if any(not is_int(f) for f in frees):
            spec.warnings.append(
                "free memory of NUMA node %s is unknown; the %s declared for %s binding was not checked"
                % (nodes_text, format_gib(memory), spec.mem_policy)
            )
            continue
        # Warnings and fallback reasons are kept in the plan (plan.json, unit
        # comments): they name no free amount, which moves with every
        # allocation on the node, so that a re-run on an unchanged node
        # writes the same plan and restarts nothing.
        if spec.mem_policy != "bind":
            free = sum(frees)
            if memory > free:
                spec.warnings.append(
                    "memory %s declared exceeds the free memory of NUMA node %s; allocations will spill to other nodes"
                    % (format_gib(memory), nodes_text)
                )
            continue
        node_id = spec.mem_nodes[0]
        free = frees[0] + held.get(node_id, 0)
        earlier = committed.get(node_id, 0)
        if earlier + memory <= free:
            committed[node_id] = earlier + memory
            continue
        declared = "memory %s declared%s" % (
            format_gib(memory),
            " (plus %s by earlier instances bound there)" % format_gib(earlier) if earlier else "",
        )
        if strict_capacity == "error":
            problems.append(
                "%s.memory: %s exceeds the %s free on NUMA node %d; membind fails allocations once the node is full; "
                "allowed: at most %s on this node, or strict_capacity: fallback to plan it as preferred"
                % (spec.path, declared, format_gib(free), node_id, format_gib(max(free - earlier, 0)))
            )
            continue
        spec.mem_policy = "preferred"
        spec.fallback = (
            "%s exceeds the free memory of NUMA node %d; membind fails allocations once the node is full: "
            "planned as preferred (memory spills to other nodes instead of failing)" % (declared, node_id)
        )
        spec.warnings.append(spec.fallback)
