"""Input checks of one instance, part one (plan/inputs.py runs them in order): its keys, name, placement, GPUs,
NUMA node, unit, command, binding method, accounts, environment, memory and memlock. Each check appends
``<variable path>: <problem>; allowed: <...>`` to ``problems`` and fills ``spec``."""

from __future__ import annotations

import re

from ansible.module_utils.gpunuma.common import sizes
from ansible.module_utils.gpunuma.common.cpulist import format_cpulist
from ansible.module_utils.gpunuma.common.secrets import SYSTEMD_LINE_MAX
from ansible.module_utils.gpunuma.node.limits import LimitError, parse_limit
from ansible.module_utils.gpunuma.plan.model import DEFAULT_SERVICE_USER, PLACEMENT_KEYS, is_int, type_name
from ansible.module_utils.gpunuma.plan.systemd_words import (
    EXEC_PREFIX_CHARS, exec_name_problem, systemd_environment_assignment)

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
    "pinned",
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
                "%s.environment.%s: is %s; allowed: strings only (quote numbers and booleans in YAML; the value "
                "is not shown, it may be a secret)" % (spec.path, key, type_name(value))
            )
        elif "\x00" in value:
            problems.append("%s.environment.%s: contains a NUL byte; allowed: text without NUL" % (spec.path, key))
        elif len("Environment=" + systemd_environment_assignment(key, value)) + 1 >= SYSTEMD_LINE_MAX:
            problems.append("%s.environment.%s: %d characters, longer than systemd reads a line of a unit file "
                            "(LONG_LINE_MAX, 1 MiB): systemd would drop the line; allowed: a shorter value, or a file "
                            "the engine reads" % (spec.path, key, len(value)))
    spec.environment = dict(environment)


def _positive_size(raw, key, spec, problems, zero, example):
    """Bytes of ``raw[key]``, a size of 1 byte or more; None when absent, or with its problem named (``zero``: what
    0 would mean, ``example``: a size to show)."""
    if raw.get(key) is None:
        return None
    try:
        value = sizes.parse_size(raw[key], "%s.%s" % (spec.path, key))
    except sizes.SizeError as exc:
        problems.append(str(exc))
        return None
    if value == 0:
        problems.append("%s.%s: %r %s; allowed: 1 byte or more (a size like %s), or leave %s out"
                        % (spec.path, key, raw[key], zero, example, key))
        return None
    return value


def _check_memory(raw, spec, topo, problems):
    spec.memory_bytes = _positive_size(raw, "memory", spec, problems, "declares no memory", "32G")


def _check_pinned(raw, spec, topo, problems):
    """``pinned``: the instance's pinned host memory budget, 1 byte or more and within its ``memory``."""
    pinned = _positive_size(raw, "pinned", spec, problems, "pins nothing", "16G")
    if pinned is None:
        return
    if spec.memory_bytes is not None and pinned > spec.memory_bytes:
        problems.append("%s.pinned: %s is more than the instance's memory (%s); allowed: at most its memory (pinned "
                        "pages are part of what the instance uses)" % (spec.path, raw["pinned"], raw.get("memory")))
        return
    spec.pinned_bytes = pinned


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
