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

from ansible.module_utils.gpunuma.common import sizes
from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, parse_cpulist
from ansible.module_utils.gpunuma.common.errors import CpuListError
from ansible.module_utils.gpunuma.node.limits import LimitError, parse_limit
from ansible.module_utils.gpunuma.plan.engines import ENGINES, parse_version, self_binding_flags
from ansible.module_utils.gpunuma.plan.model import (
    APPLIED_PLAN_SOURCE,
    DEFAULT_SERVICE_USER,
    GPU_ENVIRONMENT,
    INSTANCES_VAR,
    NIC_ENVIRONMENT,
    PLACEMENT_KEYS,
    SCHEMA,
    InstanceSpec,
    is_int,
    type_name,
)
from ansible.module_utils.gpunuma.plan.systemd_words import EXEC_PREFIX_CHARS, exec_name_problem

STRICT_CAPACITY_CHOICES = ("fallback", "error")
BINDING_METHODS = ("numactl", "systemd")
INSTANCE_KEYS = (
    "name",
    "gpus",
    "gpus_per_instance",
    "numa_node",
    "command",
    "unit",
    "user",
    "group",
    "environment",
    "secret_environment",
    "memory",
    "cpus",
    "share_cpus",
    "binding_method",
    "memlock",
    "nic_environment",
    "engine",
    "engine_version",
    "ready",
)
READY_KEYS = ("url", "command", "timeout", "interval")
MAX_READY_TIMEOUT = 3600

NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_UNIT_RE = re.compile(r"[A-Za-z0-9:_.\\-]+(@[A-Za-z0-9:_.\\-]*)?\.service")
_ACCOUNT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]{1,10}")
_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _allowed_gpus(topo):
    if not topo.gpu_ids:
        return "none (%s has no GPUs)" % topo.hostname
    return format_cpulist(topo.gpu_ids)


# --------------------------------------------------------------------------
# One check per key. Each reads ``raw``, records problems, fills ``spec``.


def _check_keys(raw, spec, topo, problems):
    for key in sorted(raw, key=str):
        if key not in INSTANCE_KEYS:
            problems.append("%s.%s: unknown key; allowed: %s" % (spec.path, key, ", ".join(INSTANCE_KEYS)))


def _check_name(raw, spec, topo, problems):
    name = raw.get("name")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        problems.append(
            "%s.name: %r is not a valid instance name; allowed: 1-64 characters from A-Z a-z 0-9 _ . - "
            "(not starting with . or -), used in the unit name gpunuma-<name>.service" % (spec.path, name)
        )
    spec.name = name


def _check_placement(raw, spec, topo, problems):
    given = [key for key in PLACEMENT_KEYS if raw.get(key) is not None]
    if len(given) != 1:
        problems.append(
            "%s: %s; allowed: exactly one of %s"
            % (
                spec.path,
                "gives %s together" % " and ".join(given) if given else "names no GPUs or node",
                ", ".join(PLACEMENT_KEYS),
            )
        )
    spec.placement = given[0] if len(given) == 1 else None


def _check_gpus(raw, spec, topo, problems):
    gpus = raw.get("gpus")
    if gpus is None:
        return
    if not isinstance(gpus, list) or not gpus:
        problems.append(
            "%s.gpus: %r is not a non-empty list of GPU indexes; allowed: indexes from %s"
            % (spec.path, gpus, _allowed_gpus(topo))
        )
        return
    seen = set()
    for gpos, index in enumerate(gpus):
        where = "%s.gpus[%d]" % (spec.path, gpos)
        if not is_int(index):
            problems.append("%s: %r is not a GPU index; allowed: integers from %s" % (where, index, _allowed_gpus(topo)))
        elif index not in topo.gpus:
            problems.append(
                "%s: GPU %d does not exist on %s; allowed: %s" % (where, index, topo.hostname, _allowed_gpus(topo))
            )
        elif index in seen:
            problems.append("%s: GPU %d is listed twice; allowed: each GPU once" % (where, index))
        else:
            seen.add(index)
    spec.requested_gpus = list(gpus)


def _check_gpu_count(raw, spec, topo, problems):
    count = raw.get("gpus_per_instance")
    if count is None:
        return
    if not is_int(count) or count < 1 or count > len(topo.gpu_ids):
        problems.append(
            "%s.gpus_per_instance: %r is not a GPU count for %s; allowed: %s"
            % (
                spec.path,
                count,
                topo.hostname,
                "1-%d" % len(topo.gpu_ids) if topo.gpu_ids else "none (%s has no GPUs)" % topo.hostname,
            )
        )
    spec.requested_gpu_count = count


def _check_numa_node(raw, spec, topo, problems):
    node_id = raw.get("numa_node")
    if node_id is None:
        return
    allowed = ", ".join(str(n) for n in topo.cpu_node_ids) or "none"
    if not is_int(node_id):
        problems.append("%s.numa_node: %r is not a node id; allowed: %s" % (spec.path, node_id, allowed))
    elif node_id not in topo.nodes:
        problems.append(
            "%s.numa_node: node %d does not exist on %s; allowed: %s" % (spec.path, node_id, topo.hostname, allowed)
        )
    elif not topo.nodes[node_id].cpus:
        problems.append(
            "%s.numa_node: node %d has no CPUs on %s (a memory-only or GPU-memory node); allowed: %s"
            % (spec.path, node_id, topo.hostname, allowed)
        )
    spec.requested_node = node_id


def _check_unit(raw, spec, topo, problems):
    unit = raw.get("unit")
    if unit is not None and (not isinstance(unit, str) or not _UNIT_RE.fullmatch(unit)):
        problems.append(
            "%s.unit: %r is not a service unit name; allowed: an existing unit such as vllm.service or worker@1.service"
            % (spec.path, unit)
        )
    spec.mode = "dropin" if unit is not None else "service"
    spec.unit = unit if unit is not None else "gpunuma-%s.service" % spec.name


def _check_command(raw, spec, topo, problems):
    command = raw.get("command")
    path = spec.path
    if command is None:
        if raw.get("unit") is None:
            problems.append(
                "%s.command: missing; allowed: a list of strings (required unless unit names an existing unit)" % path
            )
    elif not isinstance(command, list) or not command:
        problems.append(
            '%s.command: %r is not a list of strings; allowed: a non-empty list like ["/usr/bin/vllm", "serve"]'
            % (path, command)
        )
    else:
        for cpos, arg in enumerate(command):
            if not isinstance(arg, str):
                problems.append(
                    "%s.command[%d]: %r is %s; allowed: strings only (quote numbers in YAML)"
                    % (path, cpos, arg, type_name(arg))
                )
            elif "\x00" in arg:
                problems.append("%s.command[%d]: contains a NUL byte; allowed: text without NUL" % (path, cpos))
        if isinstance(command[0], str):
            problem = exec_name_problem(command[0])
            if problem:
                problems.append(
                    "%s.command[0]: %s; allowed: a path or program name without quotes, backslashes or control "
                    "characters, not starting with %s" % (path, problem, " ".join(EXEC_PREFIX_CHARS))
                )
    spec.command = list(command) if isinstance(command, list) else None


def _check_binding_method(raw, spec, topo, problems):
    method = raw.get("binding_method")
    unit, command = raw.get("unit"), raw.get("command")
    if method is None:
        method = "systemd" if (unit is not None and command is None) else "numactl"
    elif method not in BINDING_METHODS:
        problems.append(
            "%s.binding_method: %r is not allowed; allowed: %s" % (spec.path, method, ", ".join(BINDING_METHODS))
        )
    elif method == "numactl" and unit is not None and command is None:
        problems.append(
            "%s.binding_method: numactl wraps the command, but %s has no command to wrap; allowed: systemd "
            "(CPUAffinity=/NUMAPolicy= in the drop-in), or give command" % (spec.path, unit)
        )
    spec.binding_method = method


def _check_accounts(raw, spec, topo, problems):
    defaults = (("user", DEFAULT_SERVICE_USER if raw.get("unit") is None else None), ("group", None))
    for key, default in defaults:
        value = raw.get(key)
        if value is not None and (not isinstance(value, str) or not _ACCOUNT_RE.fullmatch(value)):
            problems.append(
                "%s.%s: %r is not a %s name; allowed: a POSIX account name or numeric id" % (spec.path, key, value, key)
            )
        setattr(spec, key, value if value is not None else default)


def _check_environment(raw, spec, topo, problems):
    environment = raw.get("environment")
    if environment is None:
        environment = {}
    if not isinstance(environment, dict):
        problems.append(
            "%s.environment: must be a mapping of strings to strings, got %s" % (spec.path, type_name(environment))
        )
        environment = {}
    for key in sorted(environment, key=str):
        value = environment[key]
        if not isinstance(key, str) or not _ENV_KEY_RE.fullmatch(key):
            problems.append(
                "%s.environment: key %r is not a variable name; allowed: letters, digits and _, not starting with a digit"
                % (spec.path, key)
            )
        elif not isinstance(value, str):
            problems.append(
                "%s.environment.%s: %r is %s; allowed: strings only (quote numbers and booleans in YAML)"
                % (spec.path, key, value, type_name(value))
            )
        elif "\x00" in value:
            problems.append("%s.environment.%s: contains a NUL byte; allowed: text without NUL" % (spec.path, key))
    spec.environment = dict(environment)


def _check_memory(raw, spec, topo, problems):
    if raw.get("memory") is None:
        return
    try:
        memory = sizes.parse_size(raw["memory"], "%s.memory" % spec.path)
    except sizes.SizeError as exc:
        problems.append(str(exc))
        return
    if memory == 0:
        problems.append(
            "%s.memory: %r declares no memory; allowed: 1 byte or more (a size like 32G), or leave memory out"
            % (spec.path, raw["memory"])
        )
    spec.memory_bytes = memory


def _check_memlock(raw, spec, topo, problems):
    memlock = raw.get("memlock")
    if memlock is None:
        return
    try:
        limit = parse_limit(memlock, "%s.memlock" % spec.path)
    except LimitError as exc:
        if exc.malformed:
            problems.append(
                "%s.memlock: %r is not a memlock limit; allowed: infinity, unlimited, bytes as an integer, or a size like 64G"
                % (spec.path, memlock)
            )
        else:
            problems.append(str(exc))
        return
    spec.memlock = "infinity" if limit is None else limit


def _check_ready(raw, spec, topo, problems):
    """``ready``: when a (re)started instance counts as settled (docs/plan-v1.md).

    ``{url: http://127.0.0.1:8000/health}`` (an HTTP 2xx answer) or
    ``{command: [argv...]}`` (exit 0), with ``timeout`` (seconds, default
    300) and ``interval`` (seconds between tries, default 5).
    """
    ready = raw.get("ready")
    if ready is None:
        return
    where = "%s.ready" % spec.path
    if not isinstance(ready, dict):
        problems.append("%s: %r is not a mapping; allowed: {url: http://...} or {command: [argv...]}, with timeout "
                        "and interval in seconds" % (where, ready))
        return
    unknown = [k for k in ready if k not in READY_KEYS]
    if unknown:
        problems.append("%s.%s: unknown key; allowed: %s" % (where, unknown[0], ", ".join(READY_KEYS)))
        return
    url, command = ready.get("url"), ready.get("command")
    if (url is None) == (command is None):
        problems.append("%s: give exactly one of url and command" % where)
        return
    out = {}
    if url is not None:
        if not isinstance(url, str) or not re.fullmatch(r"https?://[^\s]{1,2000}", url):
            problems.append("%s.url: %r is not an http:// or https:// URL" % (where, url))
            return
        out["url"] = url
    else:
        if not isinstance(command, list) or not command or not all(isinstance(w, str) and w for w in command) \
                or not command[0].startswith("/"):
            problems.append("%s.command: %r is not an argv list starting with an absolute path" % (where, command))
            return
        out["command"] = list(command)
    for key, default in (("timeout", 300), ("interval", 5)):
        value = ready.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_READY_TIMEOUT:
            problems.append("%s.%s: %r is not allowed; allowed: whole seconds from 1 to %d"
                            % (where, key, value, MAX_READY_TIMEOUT))
            return
        out[key] = value
    spec.ready = out


def _check_share_cpus(raw, spec, topo, problems):
    share = raw.get("share_cpus", False)
    if share is None:
        share = False
    if not isinstance(share, bool):
        problems.append("%s.share_cpus: %r is not a boolean; allowed: true, false" % (spec.path, share))
        share = False
    spec.share_cpus = share


def _check_cpus(raw, spec, topo, problems):
    cpus = raw.get("cpus")
    path = spec.path
    if cpus is None:
        return
    if is_int(cpus):
        if cpus < 1:
            problems.append(
                '%s.cpus: %d is not a CPU count; allowed: 1 or more, or a CPU list string like "2-5"' % (path, cpus)
            )
        elif cpus > len(topo.all_cpus):
            problems.append(
                "%s.cpus: %d is more CPUs than %s has; allowed: 1-%d" % (path, cpus, topo.hostname, len(topo.all_cpus))
            )
        elif spec.share_cpus:
            problems.append(
                "%s.cpus: a count (%d) needs CPUs of its own, which share_cpus: true does not reserve; "
                'allowed with share_cpus: an explicit CPU list string like "2-5", or no cpus' % (path, cpus)
            )
        spec.requested_cpu_count = cpus
    elif isinstance(cpus, str):
        try:
            parsed = parse_cpulist(cpus, "%s.cpus" % path)
        except CpuListError as exc:
            problems.append(str(exc))
            return
        if not parsed:
            problems.append("%s.cpus: %r is empty; allowed: a CPU count or a non-empty CPU list" % (path, cpus))
        elif not parsed <= topo.all_cpus:
            problems.append(
                "%s.cpus: CPUs %s do not exist on %s; allowed: %s"
                % (path, format_cpulist(parsed - topo.all_cpus), topo.hostname, format_cpulist(topo.all_cpus) or "none")
            )
        spec.requested_cpu_list = parsed
    else:
        problems.append(
            '%s.cpus: %r is %s; allowed: a CPU count (integer) or a CPU list string like "2-5"'
            % (path, cpus, type_name(cpus))
        )


def _check_secret_environment(raw, spec, topo, problems):
    names = raw.get("secret_environment")
    if names is None:
        return
    where = "%s.secret_environment" % spec.path
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        problems.append("%s: %r is not a list of variable names; allowed: names of this instance's environment "
                        "whose values are secret" % (where, names))
        return
    for pos, name in enumerate(names):
        if name not in spec.environment:
            problems.append("%s[%d]: %r is not a variable of this instance's environment; allowed: one of %s"
                            % (where, pos, name, ", ".join(sorted(spec.environment)) or "(none: environment is empty)"))
    spec.secret_environment = list(names)


def _check_nic_environment(raw, spec, topo, problems):
    names = raw.get("nic_environment")
    if names is None:
        return
    allowed = ", ".join(NIC_ENVIRONMENT)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        problems.append(
            "%s.nic_environment: %r is not a list of variable names; allowed: a list of %s" % (spec.path, names, allowed)
        )
        return
    for pos, name in enumerate(names):
        where = "%s.nic_environment[%d]" % (spec.path, pos)
        if name not in NIC_ENVIRONMENT:
            problems.append("%s: %r is not a variable gpunuma fills with NICs; allowed: %s" % (where, name, allowed))
        elif names.index(name) != pos:
            problems.append("%s: %s is listed twice; allowed: each once" % (where, name))
        elif name in spec.environment:
            problems.append(
                "%s: %s is also given in environment; allowed: one of them (environment keeps your value, "
                "nic_environment sets the instance's nearest NICs)" % (where, name)
            )
    spec.nic_environment = list(names)


def _check_engine(raw, spec, topo, problems):
    engine = raw.get("engine")
    version = raw.get("engine_version")
    if version is not None:
        spec.engine_version = parse_version(version)
        if spec.engine_version is None:
            problems.append("%s.engine_version: %r is not a release number; allowed: the installed engine's version "
                            "such as \"0.23.0\"" % (spec.path, version))
    if engine is None:
        if version is not None:
            problems.append("%s.engine_version: given without engine; allowed: engine_version with engine: %s"
                            % (spec.path, ", ".join(e for e in ENGINES if e != "generic")))
        return
    if engine not in ENGINES:
        problems.append("%s.engine: %r is not allowed; allowed: %s" % (spec.path, engine, ", ".join(ENGINES)))
        return
    spec.engine = engine
    # The command binds the engine's workers itself: gpunuma does not bind them twice (engines.py).
    spec.engine_self_binds = self_binding_flags(engine, spec.command)


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
