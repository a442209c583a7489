"""Allocation: which GPUs a ``gpus_per_instance`` instance gets, its nodes and policy, its CPUs.

The planner's decisions on checked :class:`InstanceSpec` records, in the
order ``build_plan`` calls them: :func:`assign_gpus`, :func:`apply_profile`,
:func:`allocate_cpus` (whole cores, siblings together, disjoint between
instances), then :func:`check_shares`, which refuses a finished allocation
that breaks the invariants whatever the allocator did.
"""

from __future__ import annotations

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist
from ansible.module_utils.gpunuma.plan import partition
from ansible.module_utils.gpunuma.plan.model import INSTANCES_VAR, PlanError


# --------------------------------------------------------------------------
# Policy per instance


def _spans_nodes(spec, topo, nodes, gpu_nodes):
    """An instance whose GPUs span NUMA nodes: warn, and interleave what would bind or prefer one node.

    Returns True when its memory nodes are set here (interleaved over ``nodes``).
    """
    advice = ""
    most_per_node = max([sum(1 for g in topo.gpu_ids if topo.gpus[g].node == n) for n in topo.cpu_node_ids] or [0])
    if most_per_node and len(spec.gpus) > most_per_node:
        advice = (
            "; one instance per NUMA node (gpus_per_instance: %d or fewer) behind a load balancer keeps every worker local"
            % most_per_node
        )
    spec.warnings.append(
        "GPUs %s span NUMA nodes %s, so no single node can hold this instance; engines that bind their own "
        "per-GPU workers can use numa_bind_nodes %s%s"
        % (format_cpulist(spec.gpus), ", ".join(str(n) for n in nodes), ",".join(str(n) for n in gpu_nodes), advice)
    )
    if spec.mem_policy in ("bind", "preferred"):
        spec.fallback = (
            "GPUs %s span NUMA nodes %s: memory interleaved over those nodes instead of %s to one node"
            % (format_cpulist(spec.gpus), ", ".join(str(n) for n in nodes), spec.mem_policy)
        )
        spec.mem_policy = "interleave"
        spec.mem_nodes = list(nodes)
        return True
    return False


def _has_no_memory(topo, node_id):
    """Whether a node is known to hold no memory (MemTotal 0: empty DIMM channels, some NPS/CXL layouts)."""
    return topo.nodes[node_id].total == 0


def _memory_home(topo, node_id):
    """The CPU-bearing node with memory nearest to ``node_id`` by SLIT (lowest id on a tie), or None when its
    distances are unknown or no such node exists."""
    distance = topo.nodes[node_id].distance
    candidates = [n for n in topo.cpu_node_ids if n != node_id and not _has_no_memory(topo, n) and n in distance]
    return min(candidates, key=lambda n: (distance[n], n)) if candidates else None


def _memory_nodes(spec, topo, nodes, problems):
    """``nodes`` with each memory-less node replaced by the nearest CPU node that has memory.

    numactl refuses a node without memory in ``--membind``/``--preferred``/``--interleave`` ("node argument out
    of range"), and a cpuset cannot be given it in ``cpuset.mems``: the instance would never start. The CPUs stay on
    the node; memory comes from the nearest node with memory, the node the kernel itself allocates from for a
    memory-less node's CPUs (Documentation/mm/numa.rst, "memoryless nodes"), and capacity is checked there.
    """
    out = []
    for node_id in nodes:
        if not _has_no_memory(topo, node_id):
            if node_id not in out:
                out.append(node_id)
            continue
        home = _memory_home(topo, node_id)
        if home is None:
            problems.append(
                "%s: NUMA node %d has CPUs but no memory, and no node with memory is known to be near it (the "
                "topology has no SLIT distances for it); numactl would refuse the node; allowed: a topology with "
                "node distances, or an instance on a node with memory" % (spec.path, node_id))
            continue
        spec.warnings.append(
            "NUMA node %d has CPUs but no memory: the CPUs stay there and memory is taken from node %d, the nearest "
            "node with memory (SLIT %d), where its capacity is checked" % (node_id, home, topo.nodes[node_id].distance[home]))
        if home not in out:
            out.append(home)
    return sorted(out)


def apply_profile(spec, topo, profile, problems=None):
    """Set nodes, CPU binding and memory policy (before CPUs and capacity)."""
    problems = [] if problems is None else problems
    if spec.placement == "numa_node":
        gpu_nodes = []
        nodes = [spec.requested_node]
        unknown = []
    else:
        gpu_nodes = [topo.gpus[g].node for g in spec.gpus]
        nodes = sorted(set(n for n in gpu_nodes if n is not None))
        unknown = [g for g, n in zip(spec.gpus, gpu_nodes) if n is None]
    spec.numa_nodes = nodes
    spec.numa_bind_nodes = gpu_nodes
    spec.cpu_binding = profile["cpu_binding"] == "node"
    spec.mem_policy = profile["mem_policy"]
    spec.fallback = None
    binds = spec.cpu_binding or spec.mem_policy != "default"
    if not spec.cpu_binding and (spec.requested_cpu_count is not None or spec.requested_cpu_list is not None):
        spec.warnings.append("cpus is ignored: profile %s binds no CPUs" % profile["name"])
    if unknown:
        reason = (
            "GPU %s has no known CPU-bearing NUMA node in the topology; planned without CPU or memory binding"
            % ", ".join(str(g) for g in unknown)
        )
        spec.warnings.append(reason)
        if binds:
            spec.fallback = reason
        spec.cpu_binding = False
        spec.mem_policy = "default"
    elif len(nodes) > 1 and _spans_nodes(spec, topo, nodes, gpu_nodes):
        spec.mem_nodes = _memory_nodes(spec, topo, spec.mem_nodes, problems)
        return
    if spec.mem_policy == "default":
        spec.mem_nodes = []
    elif spec.mem_policy == "interleave" and profile["mem_scope"] == "all_cpu_nodes":
        # Interleaving over every CPU node skips those without memory (nothing to spread there).
        spec.mem_nodes = [n for n in topo.cpu_node_ids if not _has_no_memory(topo, n)]
    else:
        spec.mem_nodes = _memory_nodes(spec, topo, nodes, problems)


# --------------------------------------------------------------------------
# CPU allocation


def allocate_cpus(specs, topo, problems):
    """``spec.allocated_cpus`` of every instance that binds CPUs, node by node."""
    binding = [s for s in specs if s.cpu_binding]
    for spec in binding:
        spec.allocated_cpus = set()
        if spec.requested_cpu_list is not None:
            allowed = frozenset().union(*[topo.nodes[n].worker_cpus for n in spec.numa_nodes])
            outside = spec.requested_cpu_list - allowed
            if outside:
                housekeeping = frozenset().union(*[c for n in spec.numa_nodes for c in topo.nodes[n].housekeeping])
                problems.append(
                    "%s.cpus: CPUs %s are not worker CPUs of NUMA node %s%s; allowed: %s"
                    % (
                        spec.path,
                        format_cpulist(outside),
                        format_cpulist(spec.numa_nodes),
                        (
                            " (housekeeping: %s)" % format_cpulist(outside & housekeeping)
                            if outside & housekeeping
                            else ""
                        ),
                        format_cpulist(allowed) or "none",
                    )
                )
                spec.cpu_list_rejected = True
    for node_id in topo.cpu_node_ids:
        node = topo.nodes[node_id]
        members = [s for s in binding if node_id in s.numa_nodes and not s.cpu_list_rejected]
        if members:
            allocate_node(node, members, problems)


def _take_explicit(node, explicit, problems):
    """CPUs named by ``cpus`` lists; returns ``{cpu: spec}`` of those taken (a CPU named twice is a problem)."""
    taken = {}
    for spec in explicit:
        mine = spec.requested_cpu_list & node.worker_cpus
        for cpu in sorted(mine):
            if cpu in taken:
                problems.append(
                    "%s.cpus: CPU %d is also given to instance %r; allowed: disjoint CPU lists, or share_cpus: true"
                    % (spec.path, cpu, taken[cpu].name)
                )
                break
        for cpu in mine:
            taken.setdefault(cpu, spec)
        split = [g for g in node.worker_cores if (g & mine) and not g <= mine]
        if split:
            spec.warnings.append(
                "cpus %s split hyperthread sibling groups %s on NUMA node %d"
                % (format_cpulist(spec.requested_cpu_list), ", ".join(format_cpulist(g) for g in split), node.id)
            )
        spec.allocated_cpus.update(mine)
    return taken


def _take_counted(node, counted, rest):
    """Whole cores for each ``cpus: <count>`` instance, from ``rest``; returns ``(rest, shortfall)``."""
    shortfall = False
    for spec in counted:
        want = -(-spec.requested_cpu_count // len(spec.numa_nodes))
        # Whole cores (sibling groups) covering want CPUs, as few L3 domains as the count allows.
        cores_needed, cpus = 0, 0
        for group in rest:
            if cpus >= want:
                break
            cpus += len(group)
            cores_needed += 1
        if cpus < want:
            shortfall = True
            rest = []
            continue
        got = partition.take(rest, node.l3_groups, cores_needed)
        rest = [g for g in rest if g not in got]
        have = sum(len(g) for g in got)
        if have > want:
            spec.warnings.append(
                "cpus %d rounded up to %d CPUs (%d whole cores) on NUMA node %d to keep hyperthread siblings together"
                % (want, have, len(got), node.id)
            )
        for group in got:
            spec.allocated_cpus.update(group)
    return rest, shortfall


def _shortfall_problem(node, counted, auto, free):
    asks = ["%s: %s" % (s.name, "cpus %d" % s.requested_cpu_count) for s in counted]
    asks += ["%s: 1 core or more" % s.name for s in auto]
    held = len(node.worker_cores) - len(free)
    return (
        "%s (NUMA node %d): not enough whole cores: %d worker cores after %d housekeeping core%s%s, "
        "but %d instances with CPUs of their own need more (%s); allowed: fewer instances or smaller cpus counts "
        "on node %d, share_cpus: true, or a lower housekeeping_cores_per_node"
        % (INSTANCES_VAR, node.id, len(node.worker_cores), len(node.housekeeping),
           "" if len(node.housekeeping) == 1 else "s",
           " and %d cores held by explicit cpus lists" % held if held else "",
           len(counted) + len(auto), ", ".join(asks), node.id)
    )


def _split_auto(node, auto, rest):
    """The free cores split among the instances without a CPU request, following L3 groups where they allow."""
    parts, aligned = partition.split(rest, node.l3_groups, len(auto))
    if not aligned:
        if node.l3_groups and len(auto) > 1:
            for spec in auto:
                spec.warnings.append(
                    "the CPU shares on NUMA node %d cannot follow its %d L3 cache groups (%d instances share %d "
                    "free cores); shares may span or share an L3 group" % (node.id, len(node.l3_groups), len(auto), len(rest))
                )
    elif len(auto) > 1:
        for spec in auto:
            spec.warnings.append(
                "CPU share on NUMA node %d follows its L3 cache groups (whole groups per instance)" % node.id
            )
    for spec, cores in zip(auto, parts):
        for group in cores:
            spec.allocated_cpus.update(group)


def allocate_node(node, members, problems):
    """The worker CPUs of ``node`` for its ``members``: explicit lists, then counts, then even shares; sharers last."""
    exclusive = [s for s in members if not s.share_cpus]
    explicit = [s for s in exclusive if s.requested_cpu_list is not None]
    counted = [s for s in exclusive if s.requested_cpu_list is None and s.requested_cpu_count is not None]
    auto = [s for s in exclusive if s.requested_cpu_list is None and s.requested_cpu_count is None]

    taken = _take_explicit(node, explicit, problems)
    free = [g for g in node.worker_cores if g.isdisjoint(taken)]
    rest, shortfall = _take_counted(node, counted, list(free))
    if shortfall or (auto and len(rest) < len(auto)):
        problems.append(_shortfall_problem(node, counted, auto, free))
        return
    if auto:
        _split_auto(node, auto, rest)
    for spec in members:
        if spec.share_cpus:
            if spec.requested_cpu_list is not None:
                spec.allocated_cpus.update(spec.requested_cpu_list & node.worker_cpus)
            else:
                spec.allocated_cpus.update(node.worker_cpus)


def check_siblings_known(specs, topo, allow_unknown_siblings, problems):
    """Refuse to bind CPUs where hyperthread siblings are unknown, unless allowed.

    With siblings unknown every CPU is planned as a core, so two workers may
    get the two threads of one physical core, and a worker the sibling of a
    housekeeping CPU. A text-only topology of a machine whose layout shows
    the siblings gets them inferred instead (``plan_topology``).
    """
    unknown = set(n for n in topo.cpu_node_ids if topo.nodes[n].siblings == "unknown")
    if allow_unknown_siblings:
        smt = topo.threads_per_core or 1
        if smt > 1 and unknown and any(spec.cpu_binding for spec in specs):
            # SMT4/SMT8 (POWER) number a core's threads consecutively: planning each CPU as a core would
            # split cores between workers and housekeeping. Only explicit evidence is used: lscpu's count.
            problems.append(
                "allow_unknown_siblings: the topology of %s states %d threads per core (lscpu), so planning each CPU "
                "of NUMA node %s as a core would split physical cores between instances and housekeeping; "
                "allowed: a topology that lists the cores (sysfs, or gpu_topology_lscpu_file from "
                "lscpu -p=CPU,CORE,SOCKET,NODE,CACHE), or allow_unknown_siblings: false"
                % (topo.hostname, smt, format_cpulist(unknown)))
        return
    users = {}
    for spec in specs:
        if spec.cpu_binding:
            for node_id in spec.numa_nodes:
                if node_id in unknown:
                    users.setdefault(node_id, []).append(spec.name)
    for node_id in sorted(users):
        problems.append(
            "topology.numa_nodes: hyperthread siblings of NUMA node %d on %s are unknown and cannot be inferred, "
            "so instances %s could share physical cores with each other or with housekeeping; "
            "allowed: a topology discovered with sysfs (gpu_topology_info on the node reads the cores), "
            "or allow_unknown_siblings: true to plan each CPU as a core"
            % (node_id, topo.hostname, ", ".join(repr(n) for n in users[node_id]))
        )


def check_cpus_placed(specs, topo, problems):
    """Refuse to bind CPUs where the topology proves CPUs exist whose NUMA node it cannot tell.

    A text-only topology lists only the nodes of its GPUs; where the nodes of
    the CPU ids it leaves out cannot be inferred (``discovery/cpu_layout``),
    housekeeping would land on GPU nodes and shares would be cut without the
    other nodes in view.
    """
    if not topo.unplaced_cpus:
        return
    users = [spec.name for spec in specs if spec.cpu_binding]
    if users:
        problems.append(
            "topology.unplaced_cpus: CPUs %s of %s exist but their NUMA nodes are not in the topology (a "
            "nvidia-smi topo text lists only the nodes of its GPUs, and these could not be inferred), so instances "
            "%s cannot be bound to CPUs; allowed: a topology discovered with sysfs, or gpu_topology_lscpu_file "
            "(lscpu -p=CPU,CORE,SOCKET,NODE,CACHE of the same machine) beside the topo text"
            % (format_cpulist(topo.unplaced_cpus), topo.hostname, ", ".join(repr(n) for n in users))
        )


def check_shares(specs, topo):
    """Refuse a plan whose CPU shares break the invariants (a planner defect).

    Every bound CPU of an instance is a worker CPU of one of its nodes (so
    never a housekeeping CPU, never a CPU of another node) and, unless
    ``share_cpus``, no other instance has it. Checked on the finished
    allocation so that no future change to the allocator can hand one CPU
    to two workers without the plan failing.
    """
    problems = []
    owner = {}
    for spec in specs:
        if not spec.cpu_binding or not spec.allocated_cpus:
            continue
        cpus = frozenset(spec.allocated_cpus)
        allowed = frozenset().union(*[topo.nodes[n].worker_cpus for n in spec.numa_nodes])
        if not cpus <= allowed:
            problems.append(
                "internal error: instance %r gets CPUs %s, which are not worker CPUs of its NUMA node %s; "
                "the plan is refused (please report this with the topology and instances)"
                % (spec.name, format_cpulist(cpus - allowed), format_cpulist(spec.numa_nodes))
            )
        if spec.share_cpus:
            continue
        clashes = {}
        for cpu in cpus:
            if cpu in owner:
                clashes.setdefault(owner[cpu], set()).add(cpu)
            else:
                owner[cpu] = spec.name
        for other in sorted(clashes):
            problems.append(
                "internal error: instances %r and %r share CPUs %s; the plan is refused "
                "(please report this with the topology and instances)"
                % (other, spec.name, format_cpulist(clashes[other]))
            )
    if problems:
        raise PlanError(problems)
