"""The four kubelet managers' settings of one plan (CPU, Topology, Memory; the policies first).

Each function takes the ``_Run`` of a :func:`kubelet.plan.plan_kubelet` call
(what it has read and decided so far), checks the desired settings against
the kubelet's rules (:mod:`kubelet.values`) and the node's topology, and
records the result in ``run.settings`` or a problem in ``run.problems``.
"""

from __future__ import annotations

import decimal

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, parse_cpulist
from ansible.module_utils.gpunuma.common.errors import CpuListError
from ansible.module_utils.gpunuma.kubelet.config import plain
from ansible.module_utils.gpunuma.kubelet.values import (
    CPU_POLICIES, CPU_POLICY_OPTIONS, DEFAULTS, EVICTION_HARD_DEFAULTS, HUGEPAGES_RE, KUBELET_MAX_NUMA_NODES, MAX_NUMA_NODES_OPTION, MEMORY_POLICIES,
    MEMORY_STATIC_SINCE, TOPOLOGY_POLICIES, TOPOLOGY_POLICY_OPTIONS, TOPOLOGY_SCOPES, KubeletPlanError,
    format_quantity, normalise_options, option_problem, parse_quantity)


def memory_totals(config, topology_total, problems, source):
    """Per resource: kube-reserved + system-reserved + hard eviction threshold, in bytes."""
    totals = {}
    for key in ("kubeReserved", "systemReserved"):
        block = config.get(key)
        if block is None:
            continue
        if not isinstance(block, dict):
            problems.append("%s.%s: %r is not a mapping; allowed: resource name -> quantity" % (source, key, block))
            continue
        for resource, raw in block.items():
            resource = str(resource)
            if resource == "memory" or HUGEPAGES_RE.match(resource):
                try:
                    totals[resource] = totals.get(resource, 0) + parse_quantity(raw, "%s.%s.%s" % (source, key, resource))
                except KubeletPlanError as exc:
                    problems.extend(exc.problems)
    eviction = config.get("evictionHard")
    threshold = EVICTION_HARD_DEFAULTS["memory.available"] if eviction is None else (
        eviction.get("memory.available") if isinstance(eviction, dict) else None)
    if threshold is not None:
        text = str(threshold).strip()
        if text.endswith("%"):
            try:
                threshold_bytes = decimal.Decimal(text[:-1]) / 100 * topology_total
            except decimal.InvalidOperation:
                problems.append("%s.evictionHard.memory.available: %r is not a quantity or percentage" % (source, threshold))
                threshold_bytes = 0
            problems.append(
                "%s.evictionHard.memory.available: %r is a percentage of the node's memory, which gpunuma cannot "
                "reproduce to the byte for the Memory Manager sum rule (about %s here); allowed: an absolute quantity "
                "such as 500Mi" % (source, threshold, format_quantity(int(threshold_bytes)))
            )
        else:
            try:
                totals["memory"] = totals.get("memory", 0) + parse_quantity(threshold, "%s.evictionHard.memory.available" % source)
            except KubeletPlanError as exc:
                problems.extend(exc.problems)
    return dict((k, v) for k, v in totals.items() if v)


def spread(totals, nodes, spread):
    """reservedMemory entries: each resource's total on the first node, or split over ``nodes``."""
    targets = nodes[:1] if spread == "first_node" else nodes
    entries = []
    for pos, node in enumerate(targets):
        limits = {}
        for resource in sorted(totals, key=lambda r: (r != "memory", r)):
            total = int(totals[resource])
            share, rest = divmod(total, len(targets))
            amount = share + (rest if pos == 0 else 0)
            if amount:
                limits[resource] = format_quantity(amount)
        if limits:
            entries.append({"numaNode": node, "limits": limits})
    return entries


def reserved_memory_sums(entries, field, node_ids, problems):
    sums = {}
    if not isinstance(entries, list):
        problems.append("%s: %r is not a list; allowed: a list of {numaNode: N, limits: {memory: Q}}" % (field, entries))
        return sums
    for pos, entry in enumerate(entries):
        where = "%s[%d]" % (field, pos)
        if not isinstance(entry, dict):
            problems.append("%s: %r is not a mapping; allowed: {numaNode: N, limits: {memory: Q}}" % (where, entry))
            continue
        node = entry.get("numaNode")
        if isinstance(node, bool) or not isinstance(node, int) or node not in node_ids:
            problems.append("%s.numaNode: %r is not a NUMA node of this host; allowed: %s"
                            % (where, node, ", ".join(str(n) for n in sorted(node_ids))))
        limits = entry.get("limits")
        if not isinstance(limits, dict) or not limits:
            problems.append("%s.limits: %r is not a mapping of resource -> quantity; allowed: e.g. {memory: 1Gi}"
                            % (where, limits))
            continue
        for resource, raw in limits.items():
            resource = str(resource)
            if resource != "memory" and not HUGEPAGES_RE.match(resource):
                problems.append("%s.limits.%s: unknown resource; allowed: memory, hugepages-<size>" % (where, resource))
                continue
            try:
                sums[resource] = sums.get(resource, 0) + parse_quantity(raw, "%s.limits.%s" % (where, resource))
            except KubeletPlanError as exc:
                problems.extend(exc.problems)
    return sums


def policies(run):
    """The four manager policies, each one the kubelet accepts, into ``run.settings``."""
    desired, problems = run.desired, run.problems
    cpu_policy = desired.get("cpuManagerPolicy", DEFAULTS["cpuManagerPolicy"])
    memory_policy = desired.get("memoryManagerPolicy", DEFAULTS["memoryManagerPolicy"])
    topology_policy = desired.get("topologyManagerPolicy", DEFAULTS["topologyManagerPolicy"])
    topology_scope = desired.get("topologyManagerScope", DEFAULTS["topologyManagerScope"])
    if cpu_policy not in CPU_POLICIES:
        problems.append("cpuManagerPolicy: %r is not a CPU Manager policy; allowed: %s (lower case)"
                        % (cpu_policy, ", ".join(CPU_POLICIES)))
    if memory_policy not in MEMORY_POLICIES:
        hint = " (the case matters)" if str(memory_policy).lower() in ("none", "static") else ""
        problems.append("memoryManagerPolicy: %r is not a Memory Manager policy%s; allowed: %s"
                        % (memory_policy, hint, ", ".join(MEMORY_POLICIES)))
    if topology_policy not in TOPOLOGY_POLICIES:
        problems.append("topologyManagerPolicy: %r is not a Topology Manager policy; allowed: %s"
                        % (topology_policy, ", ".join(TOPOLOGY_POLICIES)))
    if topology_scope not in TOPOLOGY_SCOPES:
        problems.append("topologyManagerScope: %r is not a Topology Manager scope; allowed: %s"
                        % (topology_scope, ", ".join(TOPOLOGY_SCOPES)))
    run.gates = run.current.get("featureGates") if isinstance(run.current.get("featureGates"), dict) else {}
    run.settings.update({
        "cpuManagerPolicy": cpu_policy,
        "topologyManagerPolicy": topology_policy,
        "topologyManagerScope": topology_scope,
        "memoryManagerPolicy": memory_policy,
    })


def cpu_manager(run, reserved, housekeeping_cores_per_node):
    """CPU Manager options and reservation (``reservedSystemCPUs``: the planner's housekeeping CPUs)."""
    desired, problems, warnings, host = run.desired, run.problems, run.warnings, run.host
    cpu_policy = run.settings["cpuManagerPolicy"]
    cpu_options = normalise_options("cpuManagerPolicyOptions", desired.get("cpuManagerPolicyOptions"), problems)
    if cpu_options and cpu_policy != "static":
        problems.append("cpuManagerPolicyOptions: %r is set under cpuManagerPolicy %r, which stops the kubelet; "
                        "allowed: options only with cpuManagerPolicy: static" % (cpu_options, cpu_policy))
    for name, value in sorted(cpu_options.items()):
        line = option_problem("cpuManagerPolicyOptions", name, value, CPU_POLICY_OPTIONS, run.version, run.gates,
                              "CPUManagerPolicyAlphaOptions", "CPUManagerPolicyBetaOptions")
        if line:
            problems.append(line)
    run.settings["cpuManagerPolicyOptions"] = cpu_options or None

    reserved_cpus = None
    if "reservedSystemCPUs" in desired and desired["reservedSystemCPUs"] is not None:
        try:
            user_cpus = parse_cpulist(str(desired["reservedSystemCPUs"]), "reservedSystemCPUs")
        except CpuListError as exc:
            problems.append("%s; allowed: a CPU list of %s such as %s" % (exc, host, format_cpulist(reserved) or "0"))
            user_cpus = None
        if user_cpus is not None:
            missing = user_cpus - run.all_cpus
            if missing:
                problems.append("reservedSystemCPUs: %r names CPUs %s that %s does not have; allowed: CPUs in %s"
                                % (desired["reservedSystemCPUs"], format_cpulist(missing), host,
                                   format_cpulist(run.all_cpus)))
            elif user_cpus != reserved:
                warnings.append("reservedSystemCPUs: %s is set by override and differs from the planner's housekeeping "
                                "CPUs %s; pods and gpunuma workers may share CPUs"
                                % (format_cpulist(user_cpus), format_cpulist(reserved) or "(none)"))
            reserved_cpus = format_cpulist(user_cpus) if user_cpus else None
    elif cpu_policy == "static":
        reserved_cpus = format_cpulist(reserved) if reserved else None
    final_reservations = run.final_reservations
    if cpu_policy == "static" and not reserved_cpus:
        cpu_reserved = 0
        for key in ("kubeReserved", "systemReserved"):
            block = final_reservations.get(key)
            if isinstance(block, dict) and block.get("cpu") is not None:
                try:
                    cpu_reserved += parse_quantity(block["cpu"], "%s.cpu" % key)
                except KubeletPlanError as exc:
                    problems.extend(exc.problems)
        if not cpu_reserved:
            problems.append(
                "reservedSystemCPUs: the static CPU policy needs a CPU reservation greater than zero and "
                "housekeeping_cores_per_node is %r, so there are no housekeeping cores to reserve; allowed: "
                "housekeeping_cores_per_node of 1 or more, or kubeReserved/systemReserved cpu" % (housekeeping_cores_per_node,)
            )
    if reserved_cpus:
        for key in ("systemReservedCgroup", "kubeReservedCgroup"):
            if final_reservations.get(key):
                problems.append("reservedSystemCPUs: cannot be combined with %s (%r) in the kubelet config; allowed: "
                                "remove %s from the config, or cpuManagerPolicy none" % (key, final_reservations[key], key))
    run.settings["reservedSystemCPUs"] = reserved_cpus


def mixed_pod_shapes(run, counts):
    """A warning for single-numa-node on a pool whose pods ask for different GPU counts.

    Pods of 1, 2 and 4 GPUs on one node fragment it so that a larger pod finds
    no single NUMA node with enough free GPUs and is rejected at admission
    (TopologyAffinityError), again and again while the scheduler, which does
    not see NUMA, keeps sending it there (pytorch/ci-infra#696: four 4-GPU pods
    rejected for about 90 s on one node).
    """
    shapes = sorted(set(c for c in counts if c > 0))
    if run.settings["topologyManagerPolicy"] == "single-numa-node" and len(shapes) > 1:
        run.warnings.append(
            "topologyManagerPolicy single-numa-node on %s, whose pool runs pods of %s GPUs: mixed GPU counts fragment "
            "the node's NUMA nodes and a larger pod is rejected at admission (TopologyAffinityError) while the "
            "scheduler keeps placing it here (pytorch/ci-infra#696); consider restricted with the "
            "prefer-closest-numa-nodes option (GA in 1.32), one GPU count per node pool, or a NUMA-aware scheduler"
            % (run.host, ", ".join(str(c) for c in shapes)))


def topology_manager(run):
    """Topology Manager options (``max-allowable-numa-nodes`` where the machine has more than 8 nodes)."""
    problems, host, version = run.problems, run.host, run.version
    topology_policy = run.settings["topologyManagerPolicy"]
    topo_options = normalise_options("topologyManagerPolicyOptions", run.desired.get("topologyManagerPolicyOptions"),
                                     problems)
    count = len(run.node_ids)
    if MAX_NUMA_NODES_OPTION in topo_options:
        # A value the user gave is checked even where gpunuma then replaces or drops it.
        line = option_problem("topologyManagerPolicyOptions", MAX_NUMA_NODES_OPTION, topo_options[MAX_NUMA_NODES_OPTION],
                              TOPOLOGY_POLICY_OPTIONS, None, run.gates, "", "")
        if line:
            problems.append(line)
            topo_options.pop(MAX_NUMA_NODES_OPTION)
    if count > KUBELET_MAX_NUMA_NODES and topology_policy != "none":
        if version is not None and version < TOPOLOGY_POLICY_OPTIONS[MAX_NUMA_NODES_OPTION][0]:
            problems.append(
                "topologyManagerPolicy: %r on %s, which has %d NUMA nodes: kubelet %d.%d refuses more than %d and has no "
                "%s option (1.31+); allowed: topologyManagerPolicy none, or kubelet 1.31 or later"
                % (topology_policy, host, count, version[0], version[1], KUBELET_MAX_NUMA_NODES, MAX_NUMA_NODES_OPTION)
            )
        topo_options[MAX_NUMA_NODES_OPTION] = str(max(count, int(topo_options.get(MAX_NUMA_NODES_OPTION, "0"))
                                                      if str(topo_options.get(MAX_NUMA_NODES_OPTION, "0")).isdigit() else count))
        if count > 16:
            run.warnings.append("%s has %d NUMA nodes (CPU-less memory nodes included, as the kubelet counts them); "
                                "the Topology Manager's hint calculation grows with the node count and admission can "
                                "be slow" % (host, count))
    else:
        topo_options.pop(MAX_NUMA_NODES_OPTION, None)
    if topo_options and topology_policy == "none":
        problems.append("topologyManagerPolicyOptions: %r is set under topologyManagerPolicy none; allowed: options "
                        "only with best-effort, restricted or single-numa-node" % (topo_options,))
    for name, value in sorted(topo_options.items()):
        line = option_problem("topologyManagerPolicyOptions", name, value, TOPOLOGY_POLICY_OPTIONS, version, run.gates,
                              "TopologyManagerPolicyAlphaOptions", "TopologyManagerPolicyBetaOptions")
        if line:
            problems.append(line)
    run.settings["topologyManagerPolicyOptions"] = topo_options or None


def memory_manager(run, memory_spread):
    """Memory Manager reservation (``reservedMemory`` summing to the reservations, as Static insists)."""
    problems, version, desired = run.problems, run.version, run.desired
    memory_policy = run.settings["memoryManagerPolicy"]
    reserved_memory = None
    if memory_policy == "Static":
        if version is not None and version < MEMORY_STATIC_SINCE:
            problems.append("memoryManagerPolicy: Static needs kubelet %d.%d or later (kubelet_version is %d.%d); "
                            "allowed: None, or upgrade" % (MEMORY_STATIC_SINCE + version))
        totals = memory_totals(run.final_reservations, run.memory_total, problems, "config")
        if "reservedMemory" in desired and desired["reservedMemory"] is not None:
            reserved_memory = plain(desired["reservedMemory"])
            sums = reserved_memory_sums(reserved_memory, "reservedMemory", set(run.node_ids), problems)
            for resource in sorted(set(sums) | set(totals)):
                if sums.get(resource, 0) != totals.get(resource, 0):
                    problems.append(
                        "reservedMemory: %s sums to %s, but kubeReserved + systemReserved + evictionHard give %s; the "
                        "Memory Manager (Static) refuses to start; allowed: reservedMemory summing to %s"
                        % (resource, format_quantity(int(sums.get(resource, 0))), format_quantity(int(totals.get(resource, 0))),
                           format_quantity(int(totals.get(resource, 0))))
                    )
        else:
            if not totals:
                problems.append("reservedMemory: the Static Memory Manager needs a memory reservation, and "
                                "kubeReserved + systemReserved + evictionHard reserve no memory; allowed: a memory "
                                "reservation or evictionHard memory.available")
            elif not run.cpu_nodes:
                problems.append("reservedMemory: %s has no CPU-bearing NUMA node to reserve memory on" % run.host)
            else:
                reserved_memory = spread(totals, run.cpu_nodes, memory_spread)
    elif desired.get("reservedMemory"):
        problems.append("reservedMemory: is set under memoryManagerPolicy %r; allowed: reservedMemory only with Static"
                        % (memory_policy,))
    run.settings["reservedMemory"] = reserved_memory
