"""The binding planner: topology + profile + instances -> ``gpunuma.plan/v1``.

This is the only code in gpunuma that decides which CPUs and which memory
nodes an inference worker gets; roles and templates only render its output
(``docs/plan-v1.md`` describes the document and every rule below).

The planner is pure: the same topology, profile, instances and options give a
byte-identical plan (``json.dumps`` of it), so a rerun on an unchanged node
changes nothing. Every problem in the input is collected and reported at
once in one :class:`PlanError`, each as ``<variable path>: <problem>;
allowed: <...>``.

The work is split along its seams, one module each:

* ``plan_model``: ``PlanError``, constants, the ``InstanceSpec`` record;
* ``plan_topology``: the checked topology, cores and housekeeping;
* ``plan_inputs``: one check per instance key, options, the applied plan;
* ``plan_alloc``: GPU groups, nodes and policy, CPU shares, their invariants;
* ``plan_capacity``: declared memory against the node;
* ``render``: one instance's plan entry (binding, GPU and NIC environment);
* ``systemd_words``: ``ExecStart=``/``Environment=`` quoting;
* ``sizes``: the one size grammar (shared with ``limits``).

This module wires them together and keeps the public names other code
imports from it (``build_plan``, ``PlanError``, ``parse_size``,
``systemd_exec_line``, ``systemd_quote``, ``systemd_environment_assignment``,
``exec_name_problem``, ``link_rank``, ``choose_gpu_group``).
"""

from __future__ import annotations

from typing import Any, Optional, Union

from ansible.module_utils.gpunuma.common import secrets, sizes
from ansible.module_utils.gpunuma.common.cpulist import format_cpulist
from ansible.module_utils.gpunuma.node.limits import LimitError, systemd_limit
from ansible.module_utils.gpunuma.plan.alloc import (
    allocate_cpus, apply_profile, check_shares, check_cpus_placed, check_siblings_known)
from ansible.module_utils.gpunuma.plan.gpu_groups import assign_gpus
from ansible.module_utils.gpunuma.plan.engines import engine_arguments, split_worker_shares
from ansible.module_utils.gpunuma.plan import pinned as pinnedlib
from ansible.module_utils.gpunuma.plan.capacity import parse_reserve, stable_capacity
from ansible.module_utils.gpunuma.plan.spill import check_preferred_spill, check_rank_capacity
from ansible.module_utils.gpunuma.plan.inputs import (
    check_gpu_environment, check_unique, parse_housekeeping_cpus, validate_applied_plan, validate_instance,
    validate_options)
from ansible.module_utils.gpunuma.plan.model import INSTANCES_VAR, SCHEMA, SCHEMA_MINOR, PlanError, is_int, type_name
from ansible.module_utils.gpunuma.plan.topology import PlanTopology
from ansible.module_utils.gpunuma.plan.profiles import ProfileError, validate_profile
from ansible.module_utils.gpunuma.plan.render import render_instance


def parse_size(value, what="memory"):
    """Bytes from an int or a size string (``32G``, ``512M``, ``1Ti``, ``1.5GiB``).

    The grammar is :func:`sizes.parse_size` (shared with ``limits``); this
    wrapper raises :class:`PlanError`.
    """
    try:
        return sizes.parse_size(value, what)
    except sizes.SizeError as exc:
        raise PlanError(str(exc))


# --------------------------------------------------------------------------
# Entry point


def _plan_topology(topology, housekeeping_cores_per_node, housekeeping_cpus, irq_pin, warnings, problems):
    """``(PlanTopology, reserved CPUs or None)``: the topology with each node's housekeeping cores decided."""
    housekeeping = (
        housekeeping_cores_per_node
        if housekeeping_cores_per_node == "auto"
        or (is_int(housekeeping_cores_per_node) and housekeeping_cores_per_node >= 0)
        else "auto"
    )
    reserved_cpus = parse_housekeeping_cpus(housekeeping_cpus, problems)
    topo = PlanTopology(topology, housekeeping, warnings, reserved_cpus, irq_pin=irq_pin)
    if reserved_cpus is not None and not reserved_cpus <= topo.all_cpus:
        problems.append(
            "housekeeping_cpus: CPUs %s do not exist on %s; allowed: %s"
            % (format_cpulist(reserved_cpus - topo.all_cpus), topo.hostname, format_cpulist(topo.all_cpus) or "none")
        )
    elif reserved_cpus is not None and not reserved_cpus <= topo.usable_cpus:
        problems.append(
            "housekeeping_cpus: CPUs %s are not granted to services or are isolated on %s (topology cpus_granted, "
            "cpus_isolated); allowed: CPUs of %s"
            % (format_cpulist(reserved_cpus - topo.usable_cpus), topo.hostname, format_cpulist(topo.usable_cpus) or "none")
        )
    return topo, reserved_cpus


def housekeeping_cpu_set(topology: dict, housekeeping_cores_per_node: Any = "auto", housekeeping_cpus: Any = None,
                         irq_pin: bool = False) -> frozenset:
    """The CPUs :func:`build_plan` keeps away from workers (its ``housekeeping`` map, as one frozenset), decided by
    the same code without planning any instance: the kubelet's reserved CPUs are these. Raises
    :class:`PlanError` on bad options or topology."""
    problems: list = []
    validate_options(housekeeping_cores_per_node, "fallback", problems)
    topo, _reserved = _plan_topology(topology, housekeeping_cores_per_node, housekeeping_cpus, irq_pin, [], problems)
    if problems:
        raise PlanError(problems)
    cpus: frozenset = frozenset()
    for node_id in topo.cpu_node_ids:
        for core in topo.nodes[node_id].housekeeping:
            cpus |= frozenset(core)
    return cpus


def build_plan(topology: dict, profile: Any, instances: Any, housekeeping_cores_per_node: Any = "auto",
               strict_capacity: str = "fallback", applied_plan: Optional[dict] = None,
               allow_unknown_siblings: bool = False, memory_reserve_per_node: Any = "auto",
               housekeeping_cpus: Any = None, secret_patterns: Any = secrets.DEFAULT_PATTERNS,
               fence: Optional[bool] = None, preferred_many: Optional[bool] = None, irq_pin: bool = False,
               limit_memlock: Any = "infinity", pinned_headroom: Any = pinnedlib.DEFAULT_HEADROOM,
               pinned_page_cache_percent: Any = pinnedlib.DEFAULT_PAGE_CACHE_PERCENT) -> dict:
    """Compute the ``gpunuma.plan/v1`` document (see ``docs/plan-v1.md``).

    ``topology`` is a ``gpunuma.topology/v1`` mapping, ``profile`` a profile mapping (``profiles.load_profile``),
    ``instances`` the inventory's ``gpunuma_instances`` list. ``applied_plan`` is the plan the node runs now
    (``/etc/gpunuma/plan.json``), if any; it is checked, and its ``memory_capacity`` is kept while MemTotal drifts
    without changing any fit (``capacity.stable_capacity``); what the running instances use never counts.
    ``memory_reserve_per_node`` is ``auto`` or a size kept back on every node for the kernel and daemons. A plan
    that binds CPUs on a node whose hyperthread siblings are unknown (and cannot be inferred) is refused unless
    ``allow_unknown_siblings``. ``fence``: whether the node's units get the cgroup fence (True/False; None when not
    known), which engines' own binding flags need (``engines.py``); ``preferred_many``: whether the node accepts
    ``numactl --preferred-many`` (None: not known), used where a ``preferred`` spill would land in GPU memory
    (``capacity.check_preferred_spill``); ``irq_pin``: the node's GPU and NIC interrupts are pinned to
    housekeeping CPUs, which ``auto`` then sizes for their vectors (``PlanTopology._auto_sizes``).
    ``limit_memlock``: ``LimitMEMLOCK=`` of the units whose instance sets no ``memlock`` of its own; each instance's
    ``limit_memlock`` is decided here (:func:`unit_memlock`) and is what the units, the policy gate and the dry run
    read. ``pinned_headroom`` and ``pinned_page_cache_percent``: the pinned budgets' limit headroom and the share of
    a node kept for page cache (plan/pinned.py). Raises :class:`PlanError` listing every problem found.
    """
    problems: list = []
    warnings: list = []
    validate_options(housekeeping_cores_per_node, strict_capacity, problems)
    problems.extend(secrets.pattern_problems(secret_patterns, "secret_patterns"))
    reserve = parse_reserve(memory_reserve_per_node, problems)
    default_memlock = _default_memlock(limit_memlock, problems)
    headroom = pinnedlib.parse_headroom(pinned_headroom, problems)
    page_cache_percent = pinnedlib.check_page_cache_percent(pinned_page_cache_percent, problems)
    reserve_option = memory_reserve_per_node if reserve is None else reserve
    try:
        profile = validate_profile(profile)
    except ProfileError as exc:
        problems.extend(exc.problems)
        profile = None
    # With bad options or profile the instances are still checked, so that
    # one run reports every problem.
    topo, reserved_cpus = _plan_topology(topology, housekeeping_cores_per_node, housekeeping_cpus, irq_pin, warnings,
                                         problems)
    applied_plan = validate_applied_plan(applied_plan, problems)

    instances = [] if instances is None else instances
    specs = _instance_specs(instances, topo, problems)
    if problems and profile is None:
        raise PlanError(problems)
    specs, capacity = _allocate(specs, topo, profile, warnings, problems, secret_patterns=secret_patterns,
                                allow_unknown_siblings=allow_unknown_siblings, strict_capacity=strict_capacity,
                                reserve=reserve, applied_plan=applied_plan, reserve_option=reserve_option,
                                fence=fence, preferred_many=preferred_many)
    pinned_budget = pinnedlib.check_pinned(specs, capacity, page_cache_percent, strict_capacity, problems)
    if problems:
        raise PlanError(problems)
    if not instances:
        warnings.append("%s is empty: nothing to bind on %s" % (INSTANCES_VAR, topo.hostname))

    rendered = [render_instance(spec, topo, profile, fence) for spec in specs]
    for item in rendered:
        item["limit_memlock"] = unit_memlock(item["memlock"], default_memlock, item["mode"], item["pinned_bytes"],
                                             headroom)
        warnings.extend("%s: %s" % (item["name"], w) for w in item["warnings"])
    plan = {
        "schema": SCHEMA,
        "schema_minor": SCHEMA_MINOR,
        "hostname": topology.get("hostname"),
        "topology_fingerprint": topo.fingerprint,
        "profile": profile["name"],
        "options": _options(housekeeping_cores_per_node, reserved_cpus, strict_capacity, allow_unknown_siblings,
                            reserve_option, fence, preferred_many, irq_pin, default_memlock, headroom,
                            page_cache_percent),
    }
    plan.update(_node_sections(topo, capacity))
    plan.update(instances=rendered, warnings=warnings,
                pinned_budget={str(n): b for n, b in sorted(pinned_budget.items())})
    return plan


def _allocate(specs, topo, profile, warnings, problems, secret_patterns, allow_unknown_siblings, strict_capacity,
              reserve, applied_plan, reserve_option, fence, preferred_many):
    """``(specs, capacity)``: GPUs, profile, CPUs, memory and engine flags decided for every instance.

    Raises PlanError with every problem found (those collected before included).
    """
    assign_gpus(specs, topo, warnings, problems)
    specs = [s for s in specs if s.placement == "numa_node" or s.gpus]
    check_gpu_environment(specs, topo, problems)
    pinnedlib.derive_budgets(specs, problems)
    patterns = secret_patterns if isinstance(secret_patterns, (list, tuple)) else ()
    for spec in specs:
        apply_profile(spec, topo, profile, problems)
        spec.secret_names = sorted(k for k in spec.environment if secrets.is_secret(k, patterns, spec.secret_environment))
        flags = secrets.command_secret_flags(spec.command, patterns)
        if flags:
            spec.warnings.append(
                "command option %s carries a secret: it is written into the unit (mode 0644), plan.json and "
                "systemctl show, readable by every account. Pass it in environment where the engine reads one "
                "(vLLM: VLLM_API_KEY, vllm/envs.py): a secret environment value goes to the instance's 0600 "
                "environment file (docs/security.md)" % ", ".join(flags))
    allocate_cpus(specs, topo, problems)
    check_siblings_known(specs, topo, allow_unknown_siblings, problems)
    check_cpus_placed(specs, topo, problems)
    capacity = stable_capacity(specs, topo, strict_capacity, problems, reserve, applied_plan, reserve_option)
    if problems:
        raise PlanError(problems)
    check_shares(specs, topo)
    for spec in specs:
        split_worker_shares(spec, topo)
    for spec in specs:
        spec.engine_args = engine_arguments(spec, topo, specs, fence)
    check_rank_capacity(specs, topo, capacity, strict_capacity, problems)
    check_preferred_spill(specs, topo, preferred_many)
    if problems:
        raise PlanError(problems)
    return specs, capacity


def _default_memlock(value, problems):
    """``limit_memlock`` as ``LimitMEMLOCK=`` takes it (``infinity`` or bytes), or None with a problem named."""
    try:
        return systemd_limit(value, "limit_memlock")
    except LimitError as exc:
        problems.append(str(exc))
        return None


def unit_memlock(own: Union[int, str, None], default: Union[int, str, None], mode: str = "service",
                 pinned: Optional[int] = None, headroom: Optional[int] = 0) -> Union[int, str, None]:
    """``LimitMEMLOCK=`` gpunuma writes for an instance: its own ``memlock`` where it sets one; else its pinned
    budget plus ``headroom`` (plan/pinned.py) where it states one; else, for a unit gpunuma writes whole, the plan's
    default (``limit_memlock``, from ``numa_binding_limit_memlock``, itself the memlock role's ``memlock_limit``);
    else None: a drop-in leaves the vendor unit's own limit alone."""
    if own is not None:
        return own
    if pinned:
        return pinned + (headroom or 0)
    return None if mode == "dropin" else default


def _options(housekeeping_cores_per_node, reserved_cpus, strict_capacity, allow_unknown_siblings, reserve_option,
             fence, preferred_many, irq_pin, limit_memlock, pinned_headroom, pinned_page_cache_percent):
    """The plan's ``options``: what it was computed with (a tri-state stays None when not known)."""
    return {
        "housekeeping_cores_per_node": housekeeping_cores_per_node,
        "housekeeping_cpus": format_cpulist(reserved_cpus) if reserved_cpus is not None else None,
        "strict_capacity": strict_capacity,
        "allow_unknown_siblings": bool(allow_unknown_siblings),
        "memory_reserve_per_node": reserve_option,
        "fence": fence if fence is None else bool(fence),
        "preferred_many": preferred_many if preferred_many is None else bool(preferred_many),
        "irq_pin": bool(irq_pin),
        "limit_memlock": limit_memlock,
        "pinned_headroom": pinned_headroom,
        "pinned_page_cache_percent": pinned_page_cache_percent,
    }


def _instance_specs(instances, topo, problems):
    """One checked InstanceSpec per good entry of ``gpunuma_instances`` (problems collected), names unique."""
    if not isinstance(instances, list):
        raise PlanError(
            "%s: must be a list of instance mappings, got %s; allowed: a list (empty for no instances)"
            % (INSTANCES_VAR, type_name(instances))
        )
    specs = []
    for pos, raw in enumerate(instances):
        spec = validate_instance(raw, pos, topo, problems)
        if spec is not None:
            specs.append(spec)
    check_unique(instances, problems)
    return specs


def _node_sections(topo, capacity):
    """The plan's per-node sections: memory capacity, housekeeping, worker CPUs and siblings."""
    nodes = topo.cpu_node_ids
    return {
        "memory_capacity": dict((str(n), capacity[n]) for n in nodes),
        "housekeeping": dict(
            (str(n), format_cpulist(frozenset().union(*topo.nodes[n].housekeeping)) if topo.nodes[n].housekeeping else "")
            for n in nodes
        ),
        "worker_cpus": dict((str(n), format_cpulist(topo.nodes[n].worker_cpus)) for n in nodes),
        "siblings": dict((str(n), topo.nodes[n].siblings) for n in nodes),
    }
