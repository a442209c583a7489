"""The policy gate's checks (gate/policy.py): each takes a :class:`gate.policy.Context` and the rule's
params and returns violation sentences (empty: pass) or None (not applicable); their parameter and kubelet
setting checks."""

from __future__ import annotations

from ansible.module_utils.gpunuma.node import autonuma
from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, parse_cpulist
from ansible.module_utils.gpunuma.common.errors import ProblemsError
from ansible.module_utils.gpunuma.plan.profiles import base_profile
from ansible.module_utils.gpunuma.plan import capacity as capacity_rule

# The Topology Manager's policies (kubernetes.io, "Control Topology
# Management Policies on a node").
TOPOLOGY_MANAGER_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
INFINITY = ("infinity", "unlimited", -1)


class PolicyError(ProblemsError):
    """A rule or waiver file/entry is malformed; ``problems`` lists each one."""


# --------------------------------------------------------------------------
# Checks


def _is_infinity(value):
    return value in INFINITY or (isinstance(value, str) and value.strip().lower() in ("infinity", "unlimited"))


def check_strict_membind_fits(ctx, params):
    """The memory declared under membind fits what each node holds for instances.

    The verdict is the planner's own (plan/capacity.overcommitted_nodes, by
    the rule check_capacity binds with) against the plan's
    ``memory_capacity`` (MemTotal minus the reserve, docs/plan-v1.md), never
    free memory: page cache filled by a loaded model must not turn an
    unchanged node into a violation on the next run. A node of unknown size
    is not judged here, as the planner does not judge it; the plan carries
    its warning.
    """
    if not any(i.get("mem_policy") == "bind" for i in ctx.instances):
        return None
    return ["instances %s declare %d bytes under membind on node %s, which holds %d bytes for instances"
            % (", ".join(names), need, node_id, capacity)
            for node_id, names, need, capacity in capacity_rule.overcommitted_nodes(ctx.plan)]


def check_memlock_unlimited_named(ctx, params):
    allowed = set(ctx.settings.get("memlock_unlimited_services") or [])
    problems = []
    if _is_infinity(ctx.settings.get("memlock_limit")) and "*" in (ctx.settings.get("memlock_users") or []):
        problems.append("memlock_limit is unlimited for every login user (memlock_users contains '*')")
    for item in ctx.instances:
        # The plan's decision (plan/planner.unit_memlock): what the unit's LimitMEMLOCK= will be.
        if _is_infinity(item.get("limit_memlock")) and item.get("name") not in allowed and item.get("unit") not in allowed:
            problems.append("instance %s runs with LimitMEMLOCK=infinity but is not in gpunuma_policy_memlock_unlimited_services"
                            % item.get("name"))
    if ctx.live:
        for inst in ctx.live.get("instances") or []:
            live = inst.get("live") or {}
            if live.get("memlock") == "infinity" and inst.get("name") not in allowed and inst.get("unit") not in allowed:
                problems.append("running instance %s has unlimited memlock but is not a named service" % inst.get("name"))
    return sorted(set(problems))


def check_numa_balancing_off_with_bind(ctx, params):
    bound = [i["name"] for i in ctx.instances if i.get("mem_policy") == "bind"]
    if not bound:
        return None
    problems = []
    # "0"/"1" from an inventory are the numbers; auto, null and anything else stay as given.
    wanted = autonuma.setting_of(ctx.settings.get("numa_balancing"))
    live = (ctx.live or {}).get("numa_balancing") or {}
    if wanted == autonuma.AUTO:
        # auto (gpunuma.autonuma.decide, for a profile with bound instances):
        # 0 on a kernel before 5.12 or of unreadable release, checked as 0; on
        # 5.12 or later the node is left alone, and no longer a violation:
        # instances with an explicit memory policy are neither scanned nor
        # migrated by NUMA balancing there (MPOL_F_NUMA_BALANCING opts in).
        release = ctx.settings.get("kernel_release") or live.get("kernel_release")
        if release is None and not live:
            # Before a change nothing says which kernel the node runs: the
            # autonuma role decides on the node, and the audit checks it.
            return None
        # The plan's own profile (a -cpu-only plan is still bound); "off" plans bind nothing. The decider's
        # own default stands for a plan that names none.
        wanted = autonuma.value(autonuma.AUTO, base_profile((ctx.plan or {}).get("profile")), release)
        if wanted is None:
            return []
    if wanted is None and not live:
        # autonuma_numa_balancing: null leaves the node's value alone; only
        # the audit, reading the node, can tell.
        return None
    if wanted is not None and wanted != 0:
        problems.append("instances %s use membind but autonuma_numa_balancing is %s, not 0" % (", ".join(bound), wanted))
    if live.get("file") not in (None, "0"):
        problems.append("the node's sysctl file sets kernel.numa_balancing = %s" % live.get("file"))
    if wanted is None and live.get("live") not in (None, "0"):
        problems.append("kernel.numa_balancing is %s on the node" % live.get("live"))
    return problems


def check_no_worker_on_cpuless_node(ctx, params):
    problems = []
    for item in ctx.instances:
        for node_id in item.get("numa_nodes") or []:
            node = ctx.node(node_id)
            if node is not None and not node.get("has_cpus", True):
                problems.append("instance %s is bound to node %s, which has no CPUs" % (item.get("name"), node_id))
    return problems


def check_no_span_without_interleave(ctx, params):
    problems = []
    for item in ctx.instances:
        nodes = item.get("numa_nodes") or []
        if len(nodes) > 1 and item.get("mem_policy") != "interleave":
            problems.append("instance %s spans NUMA nodes %s with memory policy %s (not interleave)"
                            % (item.get("name"), format_cpulist(nodes), item.get("mem_policy")))
    return problems


def _kubelet(ctx):
    kubelet = ctx.settings.get("kubelet")
    return kubelet if isinstance(kubelet, dict) and kubelet.get("enabled") else None


def check_topology_manager_node_limit(ctx, params):
    kubelet = _kubelet(ctx)
    if kubelet is None or kubelet.get("topology_manager_policy") in (None, "none"):
        return None
    limit = kubelet.get("max_allowable_numa_nodes") or params.get("default_limit", 8)
    count = len(ctx.topology.get("numa_nodes") or [])
    if count > limit:
        return ["the node has %d NUMA nodes; the kubelet's Topology Manager allows %d (max-allowable-numa-nodes)"
                % (count, limit)]
    return []


def check_kubelet_preset_matches_profile(ctx, params):
    kubelet = _kubelet(ctx)
    if kubelet is None:
        return None
    presets = params.get("presets") or {}
    profile = base_profile(ctx.plan.get("profile")) or ""
    allowed = presets.get(profile)
    got = kubelet.get("topology_manager_policy")
    if allowed is not None and got not in allowed:
        return ["profile %s needs topologyManagerPolicy %s; the kubelet has %s" % (profile, " or ".join(allowed), got)]
    return []


def check_housekeeping_whole_cores(ctx, params):
    housekeeping = ctx.plan.get("housekeeping") or {}
    options = ctx.plan.get("options") or {}
    problems = []
    count = options.get("housekeeping_cores_per_node", 1)
    # A count keeps cores on every CPU node. auto (at least 1 per node, on the
    # GPU-less CPU nodes first, docs/plan-v1.md) and an explicit CPU list may
    # leave GPU nodes without any: then the machine needs some, somewhere.
    per_node = isinstance(count, int) and not isinstance(count, bool) and not options.get("housekeeping_cpus")
    if per_node and count < params.get("min_cores", 1):
        problems.append("housekeeping_cores_per_node is %s; at least %d whole core(s) per node are kept for the system"
                        % (count, params.get("min_cores", 1)))
    if not per_node and not any(text for text in housekeeping.values()):
        problems.append("the plan keeps no housekeeping CPUs on any node (housekeeping_cores_per_node %s, "
                        "housekeeping_cpus %s)" % (count, options.get("housekeeping_cpus")))
    for node in ctx.topology.get("numa_nodes") or []:
        if not node.get("has_cpus", True):
            continue
        text = housekeeping.get(str(node.get("id")), "")
        if not text:
            if per_node and not problems:
                problems.append("node %s has no housekeeping CPUs" % node.get("id"))
            continue
        cpus = set(parse_cpulist(text))
        node_cpus = set(parse_cpulist(node.get("cpus") or ""))
        if not cpus <= node_cpus:
            problems.append("housekeeping CPUs %s of node %s are not all on that node" % (text, node.get("id")))
        for core in node.get("cores") or []:
            siblings = set(parse_cpulist(core))
            if siblings & cpus and not siblings <= cpus:
                problems.append("housekeeping CPUs %s of node %s split core %s" % (text, node.get("id"), core))
        for item in ctx.instances:
            overlap = cpus & set(parse_cpulist(item.get("cpus") or ""))
            if overlap and not item.get("share_cpus"):
                problems.append("instance %s uses housekeeping CPUs %s" % (item.get("name"), format_cpulist(overlap)))
    return problems


CHECKS = {
    "strict_membind_fits": check_strict_membind_fits,
    "memlock_unlimited_named": check_memlock_unlimited_named,
    "numa_balancing_off_with_bind": check_numa_balancing_off_with_bind,
    "no_worker_on_cpuless_node": check_no_worker_on_cpuless_node,
    "no_span_without_interleave": check_no_span_without_interleave,
    "topology_manager_node_limit": check_topology_manager_node_limit,
    "kubelet_preset_matches_profile": check_kubelet_preset_matches_profile,
    "housekeeping_whole_cores": check_housekeeping_whole_cores,
}


def _int_from(low, high):
    def check(value):
        return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    return check, "an integer from %d to %d" % (low, high)


def _presets(value):
    return isinstance(value, dict) and all(
        isinstance(name, str) and isinstance(allowed, list) and allowed
        and all(isinstance(word, str) and word in TOPOLOGY_MANAGER_POLICIES for word in allowed)
        for name, allowed in value.items())


# Each check's params: name -> (test, what is allowed). A check not listed
# takes none.
PARAMS = {
    "housekeeping_whole_cores": {"min_cores": _int_from(0, 64)},
    "topology_manager_node_limit": {"default_limit": _int_from(1, 1024)},
    "kubelet_preset_matches_profile": {
        "presets": (_presets, "a mapping of profile name to a non-empty list of Topology Manager policies (%s)"
                    % ", ".join(TOPOLOGY_MANAGER_POLICIES))},
}


def _params_problems(check, params, where):
    allowed = PARAMS.get(check, {})
    problems = []
    for key in sorted(params, key=str):
        if key not in allowed:
            problems.append("%s.%s: unknown parameter of check %s; allowed: %s"
                            % (where, key, check, ", ".join(sorted(allowed)) or "none"))
        elif not allowed[key][0](params[key]):
            problems.append("%s.%s: %r is not allowed; allowed: %s" % (where, key, params[key], allowed[key][1]))
    return problems


KUBELET_SETTINGS = {
    "enabled": (lambda v: isinstance(v, bool), "true or false"),
    "topology_manager_policy": (lambda v: v is None or (isinstance(v, str) and v in TOPOLOGY_MANAGER_POLICIES),
                                ", ".join(TOPOLOGY_MANAGER_POLICIES)),
    "max_allowable_numa_nodes": (lambda v: v is None or _int_from(1, 1024)[0](v), "an integer from 1 to 1024"),
}


def validate_kubelet(kubelet, what="gpunuma_policy_kubelet"):
    """The node's kubelet as the rules see it, checked field by field; ``{}`` for none."""
    if kubelet is None:
        return {}
    if not isinstance(kubelet, dict):
        raise PolicyError("%s: must be a mapping with %s, got %s"
                          % (what, ", ".join(KUBELET_SETTINGS), type(kubelet).__name__))
    problems = []
    for key in sorted(kubelet, key=str):
        if key not in KUBELET_SETTINGS:
            problems.append("%s.%s: unknown field; allowed: %s" % (what, key, ", ".join(KUBELET_SETTINGS)))
        elif not KUBELET_SETTINGS[key][0](kubelet[key]):
            problems.append("%s.%s: %r is not allowed; allowed: %s" % (what, key, kubelet[key], KUBELET_SETTINGS[key][1]))
    if problems:
        raise PolicyError(problems)
    return dict(kubelet)
