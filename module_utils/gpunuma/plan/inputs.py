"""Input checks of the planner: one small check per instance key, the options, the applied plan.

Every check appends ``<variable path>: <problem>; allowed: <...>`` to the
shared ``problems`` list and never raises, so one run reports every problem.
Values are shown with ``repr`` (a trailing newline is visible) and names are
matched with ``re.fullmatch`` (``$`` would also match before a final
newline, and systemd silently drops an ``Environment=`` key such as
``FOO\\n`` while ``systemd-analyze verify`` still passes).
"""

from __future__ import annotations

import re

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, parse_cpulist
from ansible.module_utils.gpunuma.common.errors import CpuListError
from ansible.module_utils.gpunuma.plan.instance_checks import (
    NAME_RE, STRICT_CAPACITY_CHOICES, _check_accounts, _check_binding_method, _check_command, _check_environment,
    _check_gpu_count, _check_gpus, _check_keys, _check_memlock, _check_memory, _check_name, _check_numa_node,
    _check_pinned, _check_placement, _check_unit)
from ansible.module_utils.gpunuma.plan.model import (
    APPLIED_PLAN_SOURCE, GPU_ENVIRONMENT, INSTANCES_VAR, PLACEMENT_KEYS, SCHEMA, InstanceSpec, is_int, type_name)
from ansible.module_utils.gpunuma.plan.runtime_checks import (
    _check_cpus, _check_engine, _check_nic_environment, _check_ready, _check_secret_environment, _check_share_cpus)

# In this order: problems are reported in it.
INSTANCE_CHECKS = (
    _check_keys,
    _check_name,
    _check_placement,
    _check_gpus,
    _check_gpu_count,
    _check_numa_node,
    _check_unit,
    _check_command,
    _check_binding_method,
    _check_accounts,
    _check_environment,
    _check_secret_environment,
    _check_memory,
    _check_pinned,
    _check_memlock,
    _check_ready,
    _check_share_cpus,
    _check_cpus,
    _check_nic_environment,
    _check_engine,
)


def validate_instance(raw, pos, topo, problems):
    """An :class:`InstanceSpec` for ``gpunuma_instances[pos]``, or None when it has problems."""
    path = "%s[%d]" % (INSTANCES_VAR, pos)
    if not isinstance(raw, dict):
        problems.append(
            "%s: must be a mapping, got %s; allowed: a mapping with name and one of %s"
            % (path, type_name(raw), ", ".join(PLACEMENT_KEYS))
        )
        return None
    before = len(problems)
    spec = InstanceSpec(pos=pos, path=path, name=None, placement=None)
    for check in INSTANCE_CHECKS:
        check(raw, spec, topo, problems)
    if len(problems) > before:
        return None
    return spec


def check_unique(instances, problems):
    """Names and units appear once in the instance list."""
    names = {}
    units = {}
    for pos, raw in enumerate(instances):
        if not isinstance(raw, dict):
            continue
        name = raw.get("name")
        if isinstance(name, str) and NAME_RE.fullmatch(name):
            if name in names:
                problems.append(
                    "%s[%d].name: %r is already the name of %s[%d]; allowed: unique names"
                    % (INSTANCES_VAR, pos, name, INSTANCES_VAR, names[name])
                )
                continue
            names[name] = pos
            unit = raw.get("unit") if isinstance(raw.get("unit"), str) else "gpunuma-%s.service" % name
            if unit in units:
                problems.append(
                    "%s[%d].unit: %s is already bound by %s[%d]; allowed: one instance per unit"
                    % (INSTANCES_VAR, pos, unit, INSTANCES_VAR, units[unit])
                )
            else:
                units[unit] = pos


def check_gpu_environment(specs, topo, problems):
    """GPU identity belongs to the planner, except where MIG needs MIG-<uuid>; an instance's GPUs are of one vendor."""
    for spec in specs:
        vendors = sorted(set(topo.gpus[g].vendor for g in spec.gpus))
        if len(vendors) > 1:
            problems.append("%s.gpus: %s are of vendors %s; allowed: GPUs of one vendor per instance (one runtime "
                            "selects them: CUDA_VISIBLE_DEVICES or ROCR_VISIBLE_DEVICES)"
                            % (spec.path, format_cpulist(spec.gpus), ", ".join(vendors)))
        if spec.placement == "numa_node" or any(topo.gpus[g].mig for g in spec.gpus):
            continue
        for key in GPU_ENVIRONMENT:
            if key in spec.environment:
                problems.append(
                    "%s.environment.%s: set by gpunuma from the instance's GPUs (by UUID, or by index with "
                    "CUDA_DEVICE_ORDER=PCI_BUS_ID); allowed: leave it out, or give it only for MIG-enabled GPUs"
                    % (spec.path, key)
                )


# --------------------------------------------------------------------------
# Options


def count_or_word(value):
    """A count that reached a module as text (templated "2") becomes the int it says."""
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,6}", value):
        return int(value)
    return value


def validate_options(housekeeping_cores_per_node, strict_capacity, problems):
    if housekeeping_cores_per_node != "auto" and (
        not is_int(housekeeping_cores_per_node) or housekeeping_cores_per_node < 0
    ):
        problems.append(
            "housekeeping_cores_per_node: %r is not a core count; allowed: auto, or an integer 0 or more"
            % (housekeeping_cores_per_node,)
        )
    if strict_capacity not in STRICT_CAPACITY_CHOICES:
        problems.append(
            "strict_capacity: %r is not allowed; allowed: %s" % (strict_capacity, ", ".join(STRICT_CAPACITY_CHOICES))
        )


def parse_housekeeping_cpus(value, problems):
    """``housekeeping_cpus``: None, or a non-empty CPU set; problems for anything else."""
    if value is None:
        return None
    if not isinstance(value, str):
        problems.append(
            'housekeeping_cpus: %r is %s; allowed: a CPU list string like "0-1,96-97", or null'
            % (value, type_name(value))
        )
        return None
    try:
        cpus = parse_cpulist(value, "housekeeping_cpus")
    except CpuListError as exc:
        problems.append(str(exc))
        return None
    return cpus


# --------------------------------------------------------------------------
# Applied plan (re-planning a node that runs its instances)

_RECOVER = (
    "If that file is damaged, restore its backup or remove it: the next run then plans from scratch"
)


def _applied_problem(where, value, what):
    return "%s: %r is not %s; allowed: the plan gpunuma wrote (%s). %s" % (
        where,
        value,
        what,
        APPLIED_PLAN_SOURCE,
        _RECOVER,
    )


def validate_applied_plan(applied_plan, problems):
    """The applied plan when its fields the capacity check reads are sound, else None (with problems)."""
    if applied_plan is None:
        return None
    if not isinstance(applied_plan, dict):
        problems.append(
            "applied_plan: must be a %s mapping, got %s; allowed: the plan gpunuma wrote (%s), or null. %s"
            % (SCHEMA, type_name(applied_plan), APPLIED_PLAN_SOURCE, _RECOVER)
        )
        return None
    before = len(problems)
    schema = applied_plan.get("schema")
    if schema is not None and schema != SCHEMA:
        problems.append(
            "applied_plan.schema: %r is not supported; allowed: %s, the plan gpunuma wrote (%s). %s"
            % (schema, SCHEMA, APPLIED_PLAN_SOURCE, _RECOVER)
        )
    fingerprint = applied_plan.get("topology_fingerprint")
    if fingerprint is not None and not isinstance(fingerprint, str):
        problems.append(_applied_problem("applied_plan.topology_fingerprint", fingerprint, "a fingerprint string"))
    items = applied_plan.get("instances")
    if items is None:
        items = []
    if not isinstance(items, list):
        problems.append(_applied_problem("applied_plan.instances", items, "a list"))
        items = []
    for pos, item in enumerate(items):
        where = "applied_plan.instances[%d]" % pos
        if not isinstance(item, dict):
            problems.append(_applied_problem(where, item, "a mapping"))
            continue
        if not isinstance(item.get("name"), str):
            problems.append(_applied_problem(where + ".name", item.get("name"), "an instance name"))
        nodes = item.get("mem_nodes")
        if nodes is not None and (not isinstance(nodes, list) or not all(is_int(n) for n in nodes)):
            problems.append(_applied_problem(where + ".mem_nodes", nodes, "a list of node ids"))
        memory = item.get("memory_bytes")
        if memory is not None and (not is_int(memory) or memory < 0):
            problems.append(_applied_problem(where + ".memory_bytes", memory, "a byte count"))
        policy = item.get("mem_policy")
        if policy is not None and not isinstance(policy, str):
            problems.append(_applied_problem(where + ".mem_policy", policy, "a memory policy name"))
    if len(problems) > before:
        return None
    return applied_plan
