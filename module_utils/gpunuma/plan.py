"""The binding planner: topology + profile + instances -> ``gpunuma.plan/v1``.

This is the only code in gpunuma that decides which CPUs and which memory
nodes an inference worker gets; roles and templates only render its output
(``docs/plan-v1.md`` describes the document and every rule below).

The planner is pure: the same topology, profile, instances and options give a
byte-identical plan (``json.dumps`` of it), so a rerun on an unchanged node
changes nothing. Every problem in the input is collected and reported at
once in one :class:`PlanError`, each as ``<variable path>: <problem>;
allowed: <...>``.
"""

from __future__ import annotations

import itertools
import math
import re

from ansible.module_utils.gpunuma.cpulist import format_cpulist, parse_cpulist
from ansible.module_utils.gpunuma import sizes
from ansible.module_utils.gpunuma.errors import CpuListError, GpunumaError
from ansible.module_utils.gpunuma.limits import LimitError, parse_limit
from ansible.module_utils.gpunuma.profiles import ProfileError, validate_profile

SCHEMA = "gpunuma.plan/v1"
TOPOLOGY_SCHEMA = "gpunuma.topology/v1"
INSTANCES_VAR = "gpunuma_instances"
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
    "memory",
    "cpus",
    "share_cpus",
    "binding_method",
    "memlock",
)
PLACEMENT_KEYS = ("gpus", "gpus_per_instance", "numa_node")
DEFAULT_SERVICE_USER = "root"
GPU_ENVIRONMENT = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")

# Names are checked with fullmatch, never match + "$": "$" also matches
# before a final newline, and systemd silently drops an Environment= key
# such as "FOO\n" while systemd-analyze verify still passes.
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_UNIT_RE = re.compile(r"[A-Za-z0-9:_.\\-]+(@[A-Za-z0-9:_.\\-]*)?\.service")
_ACCOUNT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]{1,10}")
_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_UUID_RE = re.compile(r"(GPU|MIG)-[A-Za-z0-9-]{1,80}")
APPLIED_PLAN_SOURCE = "/etc/gpunuma/plan.json"
# systemd reads these as ExecStart= prefixes even inside quotes, and refuses
# quotes, backslashes and control characters in the executable name.
_EXEC_PREFIX_CHARS = "-@:+!|"
_EXEC_NAME_FORBIDDEN = set("\"'\\")
_NVLINK_RE = re.compile(r"NV([0-9]{1,4})")
_LINK_RANK = {"PIX": 6, "PXB": 5, "PHB": 4, "NODE": 3, "SYS": 2, "SOC": 2}
# Above this many candidate GPU groups the planner grows groups greedily
# from each seed GPU instead of scoring every combination.
_MAX_GROUP_COMBINATIONS = 5000
_GIB = float(1 << 30)


class PlanError(GpunumaError):
    """The plan input has problems; ``problems`` lists each one.

    The message holds one problem per line, each naming the variable path
    and what is allowed.
    """

    def __init__(self, problems):
        if isinstance(problems, str):
            problems = [problems]
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


# --------------------------------------------------------------------------
# Small public helpers


def parse_size(value, what="memory"):
    """Bytes from an int or a size string (``32G``, ``512M``, ``1Ti``, ``1.5GiB``).

    The grammar is :func:`sizes.parse_size` (shared with ``limits``); this
    wrapper raises :class:`PlanError`.
    """
    try:
        return sizes.parse_size(value, what)
    except sizes.SizeError as exc:
        raise PlanError(str(exc))


def _format_bytes(count):
    return "%.1f GiB" % (count / _GIB)


def exec_name_problem(executable):
    """Why ``executable`` cannot be the first word of ``ExecStart=``, or None."""
    if not isinstance(executable, str) or not executable:
        return "the executable must be a non-empty string"
    if executable[0] in _EXEC_PREFIX_CHARS:
        return "%r starts with %r, which systemd reads as an ExecStart= prefix even when quoted" % (
            executable,
            executable[0],
        )
    bad = sorted(set(c for c in executable if c in _EXEC_NAME_FORBIDDEN or ord(c) < 0x20 or ord(c) == 0x7F))
    if bad:
        return "%r contains %s, which systemd refuses in an executable name" % (
            executable,
            ", ".join(repr(c) for c in bad),
        )
    return None


def _systemd_word(text, expand_dollar):
    """``text`` as one double-quoted systemd word (systemd.syntax).

    Backslash and double quote are backslash-escaped, control characters use
    C escapes, ``%`` becomes ``%%`` (specifier expansion) and, where systemd
    expands variables (``expand_dollar``), ``$`` becomes ``$$``.
    """
    out = ['"']
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif char == '"':
            out.append('\\"')
        elif char == "%":
            out.append("%%")
        elif char == "$" and expand_dollar:
            out.append("$$")
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif char == "\r":
            out.append("\\r")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append("\\x%02x" % ord(char))
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def systemd_quote(arg, executable=False):
    """Quote one argument for ``ExecStart=`` (systemd.syntax / systemd.service).

    Except in the executable name (where systemd performs no variable
    expansion), ``$`` becomes ``$$``.
    """
    if not isinstance(arg, str):
        raise PlanError("ExecStart argument %r is not a string; allowed: strings" % (arg,))
    if "\x00" in arg:
        raise PlanError("ExecStart argument %r contains a NUL byte; allowed: text without NUL" % (arg,))
    if executable:
        problem = exec_name_problem(arg)
        if problem:
            raise PlanError("ExecStart executable: %s" % problem)
    return _systemd_word(arg, expand_dollar=not executable)


def systemd_environment_assignment(name, value):
    """One ``Environment=`` word, ``"NAME=value"`` quoted for systemd.

    ``Environment=`` expands specifiers but no ``$`` variables, so ``$`` is
    kept as it is.
    """
    text = "%s=%s" % (name, value)
    if "\x00" in text:
        raise PlanError("Environment %s contains a NUL byte; allowed: text without NUL" % name)
    return _systemd_word(text, expand_dollar=False)


def systemd_exec_line(argv):
    """The value of ``ExecStart=`` that runs ``argv`` verbatim, with no shell.

    Shell metacharacters (``;``, ``|``, ``$HOME``, quotes, spaces) reach the
    program as literal argument text.
    """
    if not isinstance(argv, (list, tuple)) or not argv:
        raise PlanError(
            'ExecStart argv: %r is not a non-empty list of strings; allowed: a list like ["/usr/bin/vllm", "serve"]'
            % (argv,)
        )
    words = [systemd_quote(argv[0], executable=True)]
    words.extend(systemd_quote(arg) for arg in argv[1:])
    return " ".join(words)


def link_rank(code):
    """Rank of a GPU link code: NV# (more links better) > PIX > PXB > PHB > NODE > SYS."""
    if not isinstance(code, str):
        return 0
    code = code.strip().upper()
    match = _NVLINK_RE.fullmatch(code)
    if match:
        return 100 + int(match.group(1))
    return _LINK_RANK.get(code, 0)


# --------------------------------------------------------------------------
# Topology model


class _Node(object):
    __slots__ = ("id", "cpus", "cores", "housekeeping", "worker_cores", "worker_cpus", "free", "total")


class _Topology(object):
    def __init__(self, topology, housekeeping_cores, warnings):
        problems = []
        if not isinstance(topology, dict):
            raise PlanError("topology: must be a %s mapping, got %s" % (TOPOLOGY_SCHEMA, type(topology).__name__))
        if topology.get("schema") != TOPOLOGY_SCHEMA:
            raise PlanError(
                "topology.schema: %r is not supported; allowed: %s" % (topology.get("schema"), TOPOLOGY_SCHEMA)
            )
        for key in ("numa_nodes", "gpus"):
            if not isinstance(topology.get(key), list):
                problems.append("topology.%s: must be a list" % key)
        if problems:
            raise PlanError(problems)
        self.hostname = topology.get("hostname") or "this host"
        self.fingerprint = topology.get("fingerprint")
        if topology.get("complete") is False:
            warnings.append(
                "topology of %s is incomplete (a discovery source failed); the plan may miss GPUs or nodes"
                % self.hostname
            )

        hostname = topology.get("hostname")
        if hostname is not None and not isinstance(hostname, str):
            problems.append("topology.hostname: %r is not a host name; allowed: a string or null" % (hostname,))
            self.hostname = "this host"
        self.nodes = {}
        owners = {}
        for pos, raw in enumerate(topology["numa_nodes"]):
            where = "topology.numa_nodes[%d]" % pos
            if not isinstance(raw, dict) or isinstance(raw.get("id"), bool) or not isinstance(raw.get("id"), int):
                problems.append("%s: must be a mapping with an integer id" % where)
                continue
            try:
                cpus = parse_cpulist(raw.get("cpus") or "", "%s.cpus" % where)
            except CpuListError as exc:
                problems.append(str(exc))
                continue
            if raw["id"] in self.nodes:
                problems.append("%s.id: node %d appears twice" % (where, raw["id"]))
                continue
            shared = cpus & frozenset(owners)
            if shared:
                problems.append(
                    "%s.cpus: CPUs %s also belong to NUMA node %s; allowed: NUMA nodes with disjoint CPU sets "
                    "(each CPU on exactly one node, as /sys/devices/system/node/node*/cpulist lists them); "
                    "discover the topology again or repair the file"
                    % (where, format_cpulist(shared), ", ".join(str(n) for n in sorted(set(owners[c] for c in shared))))
                )
                continue
            owners.update((cpu, raw["id"]) for cpu in cpus)
            bad_bytes = False
            for key in ("memory_total_bytes", "memory_free_bytes"):
                value = raw.get(key)
                if value is not None and (not _is_int(value) or value < 0):
                    problems.append("%s.%s: %r is not a byte count; allowed: an integer 0 or more, or null" % (where, key, value))
                    bad_bytes = True
            if raw.get("cores") is not None and not isinstance(raw.get("cores"), list):
                problems.append(
                    "%s.cores: %r is not a list of hyperthread sibling groups; allowed: a list of CPU list strings, or null"
                    % (where, raw.get("cores"))
                )
                continue
            if bad_bytes:
                continue
            node = _Node()
            node.id = raw["id"]
            node.cpus = cpus if raw.get("has_cpus", True) is not False else frozenset()
            node.free = raw.get("memory_free_bytes")
            node.total = raw.get("memory_total_bytes")
            node.cores = self._cores(raw, node, where, warnings, problems)
            node.housekeeping = node.cores[:housekeeping_cores]
            node.worker_cores = node.cores[housekeeping_cores:]
            node.worker_cpus = frozenset().union(*node.worker_cores) if node.worker_cores else frozenset()
            if node.cpus and not node.worker_cores:
                warnings.append(
                    "numa node %d has %d cores, all kept for housekeeping (housekeeping_cores_per_node: %d); no worker can bind there"
                    % (node.id, len(node.cores), housekeeping_cores)
                )
            self.nodes[node.id] = node
        self.cpu_node_ids = sorted(n for n in self.nodes if self.nodes[n].cpus)
        self.all_cpus = frozenset(owners)

        self.gpus = {}
        for pos, raw in enumerate(topology["gpus"]):
            where = "topology.gpus[%d]" % pos
            if not isinstance(raw, dict) or isinstance(raw.get("index"), bool) or not isinstance(raw.get("index"), int):
                problems.append("%s: must be a mapping with an integer index" % where)
                continue
            index = raw["index"]
            if index in self.gpus:
                problems.append("%s.index: GPU %d appears twice; allowed: each index once" % (where, index))
                continue
            node_id = raw.get("numa_node")
            uuid = raw.get("uuid") or None
            if uuid is not None and (not isinstance(uuid, str) or not _UUID_RE.fullmatch(uuid)):
                problems.append(
                    "%s.uuid: %r is not a GPU UUID; allowed: GPU-<hex digits and dashes> as NVML reports it, or null"
                    % (where, uuid)
                )
                continue
            if node_id is not None and not _is_int(node_id):
                problems.append("%s.numa_node: %r is not a node id; allowed: an integer node id, or null" % (where, node_id))
                continue
            if node_id is not None and (node_id not in self.nodes or not self.nodes[node_id].cpus):
                warnings.append(
                    "topology gives GPU %d numa_node %r, which is not a CPU-bearing node; the GPU is treated as having no known node"
                    % (index, node_id)
                )
                node_id = None
            self.gpus[index] = {
                "index": index,
                "uuid": uuid,
                "node": node_id,
                "mig": bool(raw.get("mig_enabled")),
            }
        if problems:
            raise PlanError(problems)
        self.gpu_ids = sorted(self.gpus)
        self.links = self._links(topology.get("gpu_links"), warnings)

    @staticmethod
    def _cores(raw, node, where, warnings, problems):
        if not node.cpus:
            return []
        groups = []
        listed = raw.get("cores")
        if not isinstance(listed, list):
            warnings.append(
                "numa node %d has no cores list in the topology; hyperthread siblings are unknown, so each CPU is treated as a core"
                % node.id
            )
            listed = []
        seen = set()
        for pos, text in enumerate(listed):
            try:
                group = parse_cpulist(text, "%s.cores[%d]" % (where, pos)) & node.cpus
            except CpuListError as exc:
                problems.append(str(exc))
                continue
            group = group - seen
            if group:
                groups.append(frozenset(group))
                seen |= group
        if listed and seen != node.cpus:
            warnings.append(
                "numa node %d: CPUs %s are in no cores group of the topology; each is treated as a core"
                % (node.id, format_cpulist(node.cpus - seen))
            )
        groups.extend(frozenset([cpu]) for cpu in sorted(node.cpus - seen))
        groups.sort(key=min)
        return groups

    def _links(self, matrix, warnings):
        count = len(self.gpu_ids)
        positions = dict((index, pos) for pos, index in enumerate(self.gpu_ids))
        ranks = {}
        shaped = (
            isinstance(matrix, list)
            and len(matrix) == count
            and all(isinstance(row, list) and len(row) == count for row in matrix)
        )
        if count > 1 and not shaped:
            warnings.append(
                "topology.gpu_links is missing or not a %dx%d matrix; GPU groups are chosen by NUMA node only"
                % (count, count)
            )
        for a in self.gpu_ids:
            for b in self.gpu_ids:
                if a < b:
                    rank = 0
                    if shaped:
                        rank = min(
                            link_rank(matrix[positions[a]][positions[b]]), link_rank(matrix[positions[b]][positions[a]])
                        )
                    ranks[(a, b)] = rank
        return ranks

    def link(self, a, b):
        return self.links[(a, b) if a < b else (b, a)]


# --------------------------------------------------------------------------
# Input validation


def _type_name(value):
    name = type(value).__name__
    return ("an " if name[0] in "aeiou" else "a ") + name


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _allowed_gpus(topo):
    if not topo.gpu_ids:
        return "none (%s has no GPUs)" % topo.hostname
    return format_cpulist(topo.gpu_ids)


def _validate_instance(raw, pos, topo, problems):
    path = "%s[%d]" % (INSTANCES_VAR, pos)
    if not isinstance(raw, dict):
        problems.append(
            "%s: must be a mapping, got %s; allowed: a mapping with name and one of %s"
            % (path, _type_name(raw), ", ".join(PLACEMENT_KEYS))
        )
        return None
    before = len(problems)
    for key in sorted(raw, key=str):
        if key not in INSTANCE_KEYS:
            problems.append("%s.%s: unknown key; allowed: %s" % (path, key, ", ".join(INSTANCE_KEYS)))

    spec = {"pos": pos, "path": path, "warnings": []}
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        problems.append(
            "%s.name: %r is not a valid instance name; allowed: 1-64 characters from A-Z a-z 0-9 _ . - "
            "(not starting with . or -), used in the unit name gpunuma-<name>.service" % (path, name)
        )
    spec["name"] = name

    given = [key for key in PLACEMENT_KEYS if raw.get(key) is not None]
    if len(given) != 1:
        problems.append(
            "%s: %s; allowed: exactly one of %s"
            % (
                path,
                "gives %s together" % " and ".join(given) if given else "names no GPUs or node",
                ", ".join(PLACEMENT_KEYS),
            )
        )
    spec["kind"] = given[0] if len(given) == 1 else None

    if raw.get("gpus") is not None:
        gpus = raw["gpus"]
        if not isinstance(gpus, list) or not gpus:
            problems.append(
                "%s.gpus: %r is not a non-empty list of GPU indexes; allowed: indexes from %s"
                % (path, gpus, _allowed_gpus(topo))
            )
        else:
            seen = set()
            for gpos, index in enumerate(gpus):
                where = "%s.gpus[%d]" % (path, gpos)
                if not _is_int(index):
                    problems.append(
                        "%s: %r is not a GPU index; allowed: integers from %s" % (where, index, _allowed_gpus(topo))
                    )
                elif index not in topo.gpus:
                    problems.append(
                        "%s: GPU %d does not exist on %s; allowed: %s"
                        % (where, index, topo.hostname, _allowed_gpus(topo))
                    )
                elif index in seen:
                    problems.append("%s: GPU %d is listed twice; allowed: each GPU once" % (where, index))
                seen.add(index)
        spec["gpus"] = gpus
    if raw.get("gpus_per_instance") is not None:
        count = raw["gpus_per_instance"]
        if not _is_int(count) or count < 1 or count > len(topo.gpu_ids):
            problems.append(
                "%s.gpus_per_instance: %r is not a GPU count for %s; allowed: %s"
                % (
                    path,
                    count,
                    topo.hostname,
                    "1-%d" % len(topo.gpu_ids) if topo.gpu_ids else "none (%s has no GPUs)" % topo.hostname,
                )
            )
        spec["gpus_per_instance"] = count
    if raw.get("numa_node") is not None:
        node_id = raw["numa_node"]
        allowed = ", ".join(str(n) for n in topo.cpu_node_ids) or "none"
        if not _is_int(node_id):
            problems.append("%s.numa_node: %r is not a node id; allowed: %s" % (path, node_id, allowed))
        elif node_id not in topo.nodes:
            problems.append(
                "%s.numa_node: node %d does not exist on %s; allowed: %s" % (path, node_id, topo.hostname, allowed)
            )
        elif not topo.nodes[node_id].cpus:
            problems.append(
                "%s.numa_node: node %d has no CPUs on %s (a memory-only or GPU-memory node); allowed: %s"
                % (path, node_id, topo.hostname, allowed)
            )
        spec["numa_node"] = node_id

    unit = raw.get("unit")
    if unit is not None and (not isinstance(unit, str) or not _UNIT_RE.fullmatch(unit)):
        problems.append(
            "%s.unit: %r is not a service unit name; allowed: an existing unit such as vllm.service or worker@1.service"
            % (path, unit)
        )
    spec["mode"] = "dropin" if unit is not None else "service"
    spec["unit"] = unit if unit is not None else "gpunuma-%s.service" % name

    command = raw.get("command")
    if command is None:
        if unit is None:
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
                    % (path, cpos, arg, _type_name(arg))
                )
            elif "\x00" in arg:
                problems.append("%s.command[%d]: contains a NUL byte; allowed: text without NUL" % (path, cpos))
        if isinstance(command[0], str):
            problem = exec_name_problem(command[0])
            if problem:
                problems.append(
                    "%s.command[0]: %s; allowed: a path or program name without quotes, backslashes or control characters, not starting with %s"
                    % (path, problem, " ".join(_EXEC_PREFIX_CHARS))
                )
    spec["command"] = list(command) if isinstance(command, list) else None

    method = raw.get("binding_method")
    if method is None:
        method = "systemd" if (unit is not None and command is None) else "numactl"
    elif method not in BINDING_METHODS:
        problems.append(
            "%s.binding_method: %r is not allowed; allowed: %s" % (path, method, ", ".join(BINDING_METHODS))
        )
    elif method == "numactl" and unit is not None and command is None:
        problems.append(
            "%s.binding_method: numactl wraps the command, but %s has no command to wrap; allowed: systemd "
            "(CPUAffinity=/NUMAPolicy= in the drop-in), or give command" % (path, unit)
        )
    spec["binding_method"] = method

    for key, default in (("user", DEFAULT_SERVICE_USER if unit is None else None), ("group", None)):
        value = raw.get(key)
        if value is not None and (not isinstance(value, str) or not _ACCOUNT_RE.fullmatch(value)):
            problems.append(
                "%s.%s: %r is not a %s name; allowed: a POSIX account name or numeric id" % (path, key, value, key)
            )
        spec[key] = value if value is not None else default

    environment = raw.get("environment")
    if environment is None:
        environment = {}
    if not isinstance(environment, dict):
        problems.append(
            "%s.environment: must be a mapping of strings to strings, got %s" % (path, _type_name(environment))
        )
        environment = {}
    for key in sorted(environment, key=str):
        value = environment[key]
        if not isinstance(key, str) or not _ENV_KEY_RE.fullmatch(key):
            problems.append(
                "%s.environment: key %r is not a variable name; allowed: letters, digits and _, not starting with a digit"
                % (path, key)
            )
        elif not isinstance(value, str):
            problems.append(
                "%s.environment.%s: %r is %s; allowed: strings only (quote numbers and booleans in YAML)"
                % (path, key, value, _type_name(value))
            )
        elif "\x00" in value:
            problems.append("%s.environment.%s: contains a NUL byte; allowed: text without NUL" % (path, key))
    spec["environment"] = environment

    spec["memory_bytes"] = None
    if raw.get("memory") is not None:
        try:
            memory = sizes.parse_size(raw["memory"], "%s.memory" % path)
        except sizes.SizeError as exc:
            problems.append(str(exc))
        else:
            if memory == 0:
                problems.append(
                    "%s.memory: %r declares no memory; allowed: 1 byte or more (a size like 32G), "
                    "or leave memory out" % (path, raw["memory"])
                )
            spec["memory_bytes"] = memory

    memlock = raw.get("memlock")
    spec["memlock"] = None
    if memlock is not None:
        try:
            limit = parse_limit(memlock, "%s.memlock" % path)
        except LimitError as exc:
            if exc.malformed:
                problems.append(
                    "%s.memlock: %r is not a memlock limit; allowed: infinity, unlimited, bytes as an integer, or a size like 64G"
                    % (path, memlock)
                )
            else:
                problems.append(str(exc))
        else:
            spec["memlock"] = "infinity" if limit is None else limit

    share = raw.get("share_cpus", False)
    if share is None:
        share = False
    if not isinstance(share, bool):
        problems.append("%s.share_cpus: %r is not a boolean; allowed: true, false" % (path, share))
        share = False
    spec["share_cpus"] = share

    spec["cpus_count"] = None
    spec["cpus_set"] = None
    cpus = raw.get("cpus")
    if cpus is not None:
        if _is_int(cpus):
            if cpus < 1:
                problems.append(
                    '%s.cpus: %d is not a CPU count; allowed: 1 or more, or a CPU list string like "2-5"' % (path, cpus)
                )
            elif cpus > len(topo.all_cpus):
                problems.append(
                    "%s.cpus: %d is more CPUs than %s has; allowed: 1-%d" % (path, cpus, topo.hostname, len(topo.all_cpus))
                )
            elif share:
                problems.append(
                    "%s.cpus: a count (%d) needs CPUs of its own, which share_cpus: true does not reserve; "
                    'allowed with share_cpus: an explicit CPU list string like "2-5", or no cpus' % (path, cpus)
                )
            spec["cpus_count"] = cpus
        elif isinstance(cpus, str):
            try:
                parsed = parse_cpulist(cpus, "%s.cpus" % path)
            except CpuListError as exc:
                problems.append(str(exc))
            else:
                if not parsed:
                    problems.append("%s.cpus: %r is empty; allowed: a CPU count or a non-empty CPU list" % (path, cpus))
                elif not parsed <= topo.all_cpus:
                    problems.append(
                        "%s.cpus: CPUs %s do not exist on %s; allowed: %s"
                        % (path, format_cpulist(parsed - topo.all_cpus), topo.hostname, format_cpulist(topo.all_cpus) or "none")
                    )
                spec["cpus_set"] = parsed
        else:
            problems.append(
                '%s.cpus: %r is %s; allowed: a CPU count (integer) or a CPU list string like "2-5"'
                % (path, cpus, _type_name(cpus))
            )

    if len(problems) > before:
        return None
    return spec


def _validate_options(housekeeping_cores_per_node, strict_capacity, problems):
    if not _is_int(housekeeping_cores_per_node) or housekeeping_cores_per_node < 0:
        problems.append(
            "housekeeping_cores_per_node: %r is not a core count; allowed: an integer 0 or more"
            % (housekeeping_cores_per_node,)
        )
    if strict_capacity not in STRICT_CAPACITY_CHOICES:
        problems.append(
            "strict_capacity: %r is not allowed; allowed: %s" % (strict_capacity, ", ".join(STRICT_CAPACITY_CHOICES))
        )


# --------------------------------------------------------------------------
# GPU grouping


def _group_key(group, topo):
    nodes = set(topo.gpus[g]["node"] for g in group)
    ranks = [topo.link(a, b) for a, b in itertools.combinations(group, 2)]
    return (
        len(nodes),
        None in nodes,
        -(min(ranks) if ranks else 0),
        -sum(ranks),
        tuple(group),
    )


def _grow_group(seed, pool, size, topo):
    group = [seed]
    seed_node = topo.gpus[seed]["node"]
    rest = [g for g in pool if g != seed]
    while len(group) < size:
        best = min(
            rest,
            key=lambda g: (
                topo.gpus[g]["node"] != seed_node,
                -min(topo.link(g, m) for m in group),
                -sum(topo.link(g, m) for m in group),
                g,
            ),
        )
        group.append(best)
        rest.remove(best)
    return sorted(group)


def choose_gpu_group(pool, size, topo):
    """The best ``size`` GPUs out of ``pool``: fewest NUMA nodes, then best links.

    Links compare by the weakest pair first, then by the sum over all
    pairs; ties go to the lowest indexes, so the choice is deterministic.
    """
    pool = sorted(pool)
    if math.comb(len(pool), size) <= _MAX_GROUP_COMBINATIONS:
        candidates = itertools.combinations(pool, size)
    else:
        candidates = (_grow_group(seed, pool, size, topo) for seed in pool)
    return list(min(candidates, key=lambda group: _group_key(group, topo)))


def _assign_gpus(specs, topo, warnings, problems):
    claimed = {}
    for spec in specs:
        if spec["kind"] != "gpus":
            continue
        for index in spec["gpus"]:
            if index in claimed:
                other = claimed[index]
                message = "GPU %d is also used by instance %r; both run on it" % (index, other["name"])
                spec["warnings"].append(message)
                warnings.append("%s: %s" % (spec["name"], message))
            else:
                claimed[index] = spec
    pool = [g for g in topo.gpu_ids if g not in claimed]
    for spec in specs:
        if spec["kind"] != "gpus_per_instance":
            continue
        size = spec["gpus_per_instance"]
        if size > len(pool):
            problems.append(
                "%s.gpus_per_instance: needs %d GPUs but only %d are left on %s (%s taken by other instances); allowed: at most %d"
                % (
                    spec["path"],
                    size,
                    len(pool),
                    topo.hostname,
                    format_cpulist(set(topo.gpu_ids) - set(pool)) or "none",
                    len(pool),
                )
            )
            spec["gpus"] = None
            continue
        group = choose_gpu_group(pool, size, topo)
        spec["gpus"] = group
        pool = [g for g in pool if g not in group]
        claimed.update((g, spec) for g in group)
    unused = [g for g in topo.gpu_ids if g not in claimed]
    if unused and specs:
        warnings.append("GPUs %s of %s are not used by any instance" % (format_cpulist(unused), topo.hostname))


def _check_gpu_environment(specs, topo, problems):
    """GPU identity belongs to the planner, except where MIG needs MIG-<uuid>."""
    for spec in specs:
        if spec["kind"] == "numa_node" or any(topo.gpus[g]["mig"] for g in spec["gpus"]):
            continue
        for key in GPU_ENVIRONMENT:
            if key in spec["environment"]:
                problems.append(
                    "%s.environment.%s: set by gpunuma from the instance's GPUs (by UUID, or by index with "
                    "CUDA_DEVICE_ORDER=PCI_BUS_ID); allowed: leave it out, or give it only for MIG-enabled GPUs"
                    % (spec["path"], key)
                )


# --------------------------------------------------------------------------
# Policy per instance


def _apply_profile(spec, topo, profile):
    """Set nodes, CPU binding and memory policy (before CPUs and capacity)."""
    if spec["kind"] == "numa_node":
        gpu_nodes = []
        nodes = [spec["numa_node"]]
        unknown = []
    else:
        gpu_nodes = [topo.gpus[g]["node"] for g in spec["gpus"]]
        nodes = sorted(set(n for n in gpu_nodes if n is not None))
        unknown = [g for g, n in zip(spec["gpus"], gpu_nodes) if n is None]
    spec["numa_nodes"] = nodes
    spec["numa_bind_nodes"] = gpu_nodes
    spec["cpu_binding"] = profile["cpu_binding"] == "node"
    spec["mem_policy"] = profile["mem_policy"]
    spec["fallback"] = None
    binds = spec["cpu_binding"] or spec["mem_policy"] != "default"
    if not spec["cpu_binding"] and (spec["cpus_count"] is not None or spec["cpus_set"] is not None):
        spec["warnings"].append("cpus is ignored: profile %s binds no CPUs" % profile["name"])
    if unknown:
        reason = (
            "GPU %s has no known CPU-bearing NUMA node in the topology; planned without CPU or memory binding"
            % ", ".join(str(g) for g in unknown)
        )
        spec["warnings"].append(reason)
        if binds:
            spec["fallback"] = reason
        spec["cpu_binding"] = False
        spec["mem_policy"] = "default"
    elif len(nodes) > 1:
        advice = ""
        most_per_node = max(
            [sum(1 for g in topo.gpu_ids if topo.gpus[g]["node"] == n) for n in topo.cpu_node_ids] or [0]
        )
        if most_per_node and len(spec["gpus"]) > most_per_node:
            advice = (
                "; one instance per NUMA node (gpus_per_instance: %d or fewer) behind a load balancer keeps every worker local"
                % most_per_node
            )
        spec["warnings"].append(
            "GPUs %s span NUMA nodes %s, so no single node can hold this instance; engines that bind their own "
            "per-GPU workers can use numa_bind_nodes %s%s"
            % (
                format_cpulist(spec["gpus"]),
                ", ".join(str(n) for n in nodes),
                ",".join(str(n) for n in gpu_nodes),
                advice,
            )
        )
        if spec["mem_policy"] in ("bind", "preferred"):
            spec["fallback"] = (
                "GPUs %s span NUMA nodes %s: memory interleaved over those nodes instead of %s to one node"
                % (
                    format_cpulist(spec["gpus"]),
                    ", ".join(str(n) for n in nodes),
                    spec["mem_policy"],
                )
            )
            spec["mem_policy"] = "interleave"
            spec["mem_nodes"] = list(nodes)
            return
    if spec["mem_policy"] == "default":
        spec["mem_nodes"] = []
    elif spec["mem_policy"] == "interleave" and profile["mem_scope"] == "all_cpu_nodes":
        spec["mem_nodes"] = list(topo.cpu_node_ids)
    else:
        spec["mem_nodes"] = list(nodes)


# --------------------------------------------------------------------------
# CPU allocation


def _allocate_cpus(specs, topo, problems):
    binding = [s for s in specs if s["cpu_binding"]]
    for spec in binding:
        spec["cpu_set"] = set()
        if spec["cpus_set"] is not None:
            allowed = frozenset().union(*[topo.nodes[n].worker_cpus for n in spec["numa_nodes"]])
            outside = spec["cpus_set"] - allowed
            if outside:
                housekeeping = frozenset().union(*[c for n in spec["numa_nodes"] for c in topo.nodes[n].housekeeping])
                problems.append(
                    "%s.cpus: CPUs %s are not worker CPUs of NUMA node %s%s; allowed: %s"
                    % (
                        spec["path"],
                        format_cpulist(outside),
                        format_cpulist(spec["numa_nodes"]),
                        (
                            " (housekeeping: %s)" % format_cpulist(outside & housekeeping)
                            if outside & housekeeping
                            else ""
                        ),
                        format_cpulist(allowed) or "none",
                    )
                )
                spec["cpus_set"] = None
                spec["invalid"] = True
    for node_id in topo.cpu_node_ids:
        node = topo.nodes[node_id]
        members = [s for s in binding if node_id in s["numa_nodes"] and not s.get("invalid")]
        if members:
            _allocate_node(node, members, problems)
    for spec in binding:
        spec["cpus"] = format_cpulist(spec["cpu_set"]) if spec["cpu_set"] else None


def _allocate_node(node, members, problems):
    exclusive = [s for s in members if not s["share_cpus"]]
    explicit = [s for s in exclusive if s["cpus_set"] is not None]
    counted = [s for s in exclusive if s["cpus_set"] is None and s["cpus_count"] is not None]
    auto = [s for s in exclusive if s["cpus_set"] is None and s["cpus_count"] is None]

    taken = {}
    for spec in explicit:
        mine = spec["cpus_set"] & node.worker_cpus
        for cpu in sorted(mine):
            if cpu in taken:
                problems.append(
                    "%s.cpus: CPU %d is also given to instance %r; allowed: disjoint CPU lists, or share_cpus: true"
                    % (spec["path"], cpu, taken[cpu]["name"])
                )
                break
        for cpu in mine:
            taken.setdefault(cpu, spec)
        split = [g for g in node.worker_cores if (g & mine) and not g <= mine]
        if split:
            spec["warnings"].append(
                "cpus %s split hyperthread sibling groups %s on NUMA node %d"
                % (format_cpulist(spec["cpus_set"]), ", ".join(format_cpulist(g) for g in split), node.id)
            )
        spec["cpu_set"].update(mine)

    free = [g for g in node.worker_cores if g.isdisjoint(taken)]
    spans = {}
    need_total = 0
    pos = 0
    shortfall = False
    for spec in counted:
        want = -(-spec["cpus_count"] // len(spec["numa_nodes"]))
        got = []
        while sum(len(g) for g in got) < want and pos < len(free):
            got.append(free[pos])
            pos += 1
        spans[spec["name"]] = len(got)
        need_total += len(got)
        if sum(len(g) for g in got) < want:
            shortfall = True
            continue
        have = sum(len(g) for g in got)
        if have > want:
            spec["warnings"].append(
                "cpus %d rounded up to %d CPUs (%d whole cores) on NUMA node %d to keep hyperthread siblings together"
                % (want, have, len(got), node.id)
            )
        for group in got:
            spec["cpu_set"].update(group)
    rest = free[pos:]
    if auto and len(rest) < len(auto):
        shortfall = True
    if shortfall:
        asks = ["%s: %s" % (s["name"], "cpus %d" % s["cpus_count"]) for s in counted]
        asks += ["%s: 1 core or more" % s["name"] for s in auto]
        problems.append(
            "%s (NUMA node %d): not enough whole cores: %d worker cores after %d housekeeping core%s%s, "
            "but %d instances with CPUs of their own need more (%s); allowed: fewer instances or smaller cpus counts "
            "on node %d, share_cpus: true, or a lower housekeeping_cores_per_node"
            % (
                INSTANCES_VAR,
                node.id,
                len(node.worker_cores),
                len(node.housekeeping),
                "" if len(node.housekeeping) == 1 else "s",
                (
                    " and %d cores held by explicit cpus lists" % (len(node.worker_cores) - len(free))
                    if len(free) < len(node.worker_cores)
                    else ""
                ),
                len(counted) + len(auto),
                ", ".join(asks),
                node.id,
            )
        )
        return
    if auto:
        base, extra = divmod(len(rest), len(auto))
        start = 0
        for rank, spec in enumerate(auto):
            size = base + (1 if rank < extra else 0)
            for group in rest[start : start + size]:
                spec["cpu_set"].update(group)
            start += size
    for spec in members:
        if spec["share_cpus"]:
            if spec["cpus_set"] is not None:
                spec["cpu_set"].update(spec["cpus_set"] & node.worker_cpus)
            else:
                spec["cpu_set"].update(node.worker_cpus)


def _check_shares(specs, topo):
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
        if not spec["cpu_binding"] or not spec.get("cpu_set"):
            continue
        cpus = frozenset(spec["cpu_set"])
        allowed = frozenset().union(*[topo.nodes[n].worker_cpus for n in spec["numa_nodes"]])
        if not cpus <= allowed:
            problems.append(
                "internal error: instance %r gets CPUs %s, which are not worker CPUs of its NUMA node %s; "
                "the plan is refused (please report this with the topology and instances)"
                % (spec["name"], format_cpulist(cpus - allowed), format_cpulist(spec["numa_nodes"]))
            )
        if spec["share_cpus"]:
            continue
        clashes = {}
        for cpu in cpus:
            if cpu in owner:
                clashes.setdefault(owner[cpu], set()).add(cpu)
            else:
                owner[cpu] = spec["name"]
        for other in sorted(clashes):
            problems.append(
                "internal error: instances %r and %r share CPUs %s; the plan is refused "
                "(please report this with the topology and instances)"
                % (other, spec["name"], format_cpulist(clashes[other]))
            )
    if problems:
        raise PlanError(problems)


# --------------------------------------------------------------------------
# Applied plan (re-planning a node that runs its instances)


def _applied_problem(where, value, what):
    return (
        "%s: %r is not %s; allowed: the plan gpunuma wrote (%s). If that file is damaged, restore its backup "
        "or remove it: the next run then plans from scratch" % (where, value, what, APPLIED_PLAN_SOURCE)
    )


def _validate_applied_plan(applied_plan, problems):
    """The applied plan's fields the capacity check reads, or None (with problems)."""
    if applied_plan is None:
        return None
    if not isinstance(applied_plan, dict):
        problems.append(
            "applied_plan: must be a %s mapping, got %s; allowed: the plan gpunuma wrote (%s), or null. "
            "If that file is damaged, restore its backup or remove it: the next run then plans from scratch"
            % (SCHEMA, _type_name(applied_plan), APPLIED_PLAN_SOURCE)
        )
        return None
    before = len(problems)
    schema = applied_plan.get("schema")
    if schema is not None and schema != SCHEMA:
        problems.append(
            "applied_plan.schema: %r is not supported; allowed: %s, the plan gpunuma wrote (%s). If that file is "
            "damaged, restore its backup or remove it: the next run then plans from scratch"
            % (schema, SCHEMA, APPLIED_PLAN_SOURCE)
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
        if nodes is not None and (not isinstance(nodes, list) or not all(_is_int(n) for n in nodes)):
            problems.append(_applied_problem(where + ".mem_nodes", nodes, "a list of node ids"))
        memory = item.get("memory_bytes")
        if memory is not None and (not _is_int(memory) or memory < 0):
            problems.append(_applied_problem(where + ".memory_bytes", memory, "a byte count"))
        policy = item.get("mem_policy")
        if policy is not None and not isinstance(policy, str):
            problems.append(_applied_problem(where + ".mem_policy", policy, "a memory policy name"))
    if len(problems) > before:
        return None
    return applied_plan


# --------------------------------------------------------------------------
# Memory capacity


def _held_by_applied(applied_plan, topo, specs):
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
    names = set(spec["name"] for spec in specs)
    for item in applied_plan.get("instances") or []:
        if not isinstance(item, dict) or item.get("name") not in names:
            continue
        memory, nodes = item.get("memory_bytes"), item.get("mem_nodes") or []
        # Only membind instances: one that already fell back to preferred
        # must not be re-planned as fitting (and flip back and forth).
        if _is_int(memory) and len(nodes) == 1 and item.get("mem_policy") == "bind":
            held[nodes[0]] = held.get(nodes[0], 0) + memory
    return held


def _check_capacity(specs, topo, strict_capacity, problems, applied_plan=None):
    committed = {}
    held = _held_by_applied(applied_plan, topo, specs)
    for spec in specs:
        memory = spec["memory_bytes"]
        if memory is None or spec["mem_policy"] == "default" or not spec["mem_nodes"]:
            continue
        frees = [topo.nodes[n].free for n in spec["mem_nodes"]]
        nodes_text = format_cpulist(spec["mem_nodes"])
        if any(not _is_int(f) for f in frees):
            spec["warnings"].append(
                "free memory of NUMA node %s is unknown; the %s declared for %s binding was not checked"
                % (nodes_text, _format_bytes(memory), spec["mem_policy"])
            )
            continue
        # Warnings and fallback reasons are kept in the plan (plan.json, unit
        # comments): they name no free amount, which moves with every
        # allocation on the node, so that a re-run on an unchanged node
        # writes the same plan and restarts nothing.
        if spec["mem_policy"] != "bind":
            free = sum(frees)
            if memory > free:
                spec["warnings"].append(
                    "memory %s declared exceeds the free memory of NUMA node %s; allocations will spill to other nodes"
                    % (_format_bytes(memory), nodes_text)
                )
            continue
        node_id = spec["mem_nodes"][0]
        free = frees[0] + held.get(node_id, 0)
        earlier = committed.get(node_id, 0)
        if earlier + memory <= free:
            committed[node_id] = earlier + memory
            continue
        declared = "memory %s declared%s" % (
            _format_bytes(memory),
            " (plus %s by earlier instances bound there)" % _format_bytes(earlier) if earlier else "",
        )
        if strict_capacity == "error":
            problems.append(
                "%s.memory: %s exceeds the %s free on NUMA node %d; membind fails allocations once the node is full; "
                "allowed: at most %s on this node, or strict_capacity: fallback to plan it as preferred"
                % (spec["path"], declared, _format_bytes(free), node_id, _format_bytes(max(free - earlier, 0)))
            )
            continue
        spec["mem_policy"] = "preferred"
        spec["fallback"] = (
            "%s exceeds the free memory of NUMA node %d; membind fails allocations once the node is full: "
            "planned as preferred (memory spills to other nodes instead of failing)" % (declared, node_id)
        )
        spec["warnings"].append(spec["fallback"])


# --------------------------------------------------------------------------
# Rendering


def _render(spec, topo, profile):
    gpus = list(spec["gpus"]) if spec["kind"] != "numa_node" else []
    uuids = [topo.gpus[g]["uuid"] for g in gpus]
    cpus = spec.get("cpus") if spec["cpu_binding"] else None
    mem_nodes = list(spec["mem_nodes"]) if spec["mem_policy"] != "default" else []
    nodes_text = format_cpulist(mem_nodes)

    args = []
    if cpus:
        args.append("--physcpubind=%s" % cpus)
    if spec["mem_policy"] == "bind":
        args.append("--membind=%s" % nodes_text)
    elif spec["mem_policy"] == "preferred":
        args.append("--preferred=%d" % mem_nodes[0])
    elif spec["mem_policy"] == "interleave":
        args.append("--interleave=%s" % nodes_text)

    systemd = {}
    exec_prefix = []
    if spec["binding_method"] == "systemd":
        if cpus:
            systemd["CPUAffinity"] = cpus
        if spec["mem_policy"] != "default":
            systemd["NUMAPolicy"] = spec["mem_policy"]
            systemd["NUMAMask"] = nodes_text
    elif args:
        exec_prefix = ["numactl"] + args

    environment = dict(spec["environment"])
    if gpus:
        mig = [g for g in gpus if topo.gpus[g]["mig"]]
        if "CUDA_VISIBLE_DEVICES" in environment:
            spec["warnings"].append(
                "environment.CUDA_VISIBLE_DEVICES kept as given (%r) because GPU %s has MIG enabled"
                % (environment["CUDA_VISIBLE_DEVICES"], format_cpulist(mig))
            )
        elif all(uuids):
            environment["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
        else:
            environment["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
            environment["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            spec["warnings"].append(
                "GPU %s has no UUID in the topology; CUDA_VISIBLE_DEVICES uses indexes with CUDA_DEVICE_ORDER=PCI_BUS_ID"
                % format_cpulist([g for g, u in zip(gpus, uuids) if not u])
            )
        if mig and "CUDA_VISIBLE_DEVICES" not in spec["environment"]:
            spec["warnings"].append(
                "GPU %s has MIG enabled; CUDA_VISIBLE_DEVICES names the whole GPU, set MIG-<uuid> in environment to pick MIG instances"
                % format_cpulist(mig)
            )

    return {
        "name": spec["name"],
        "unit": spec["unit"],
        "mode": spec["mode"],
        "binding_method": spec["binding_method"],
        "gpus": gpus,
        "gpu_uuids": uuids,
        "numa_nodes": list(spec["numa_nodes"]),
        "numa_bind_nodes": list(spec["numa_bind_nodes"]),
        "cpus": cpus,
        "share_cpus": spec["share_cpus"],
        "mem_policy": spec["mem_policy"],
        "mem_nodes": mem_nodes,
        "profile": profile["name"],
        "fallback": spec["fallback"],
        "numactl_args": args,
        "exec_prefix": exec_prefix,
        "systemd": systemd,
        "environment": dict(sorted(environment.items())),
        "command": list(spec["command"]) if spec["command"] is not None else None,
        "user": spec["user"],
        "group": spec["group"],
        "memory_bytes": spec["memory_bytes"],
        "memlock": spec["memlock"],
        "warnings": list(spec["warnings"]),
    }


# --------------------------------------------------------------------------
# Entry point


def build_plan(topology, profile, instances, housekeeping_cores_per_node=1, strict_capacity="fallback",
               applied_plan=None):
    """Compute the ``gpunuma.plan/v1`` document (see ``docs/plan-v1.md``).

    ``topology`` is a ``gpunuma.topology/v1`` mapping, ``profile`` a profile
    mapping (``profiles.load_profile``), ``instances`` the inventory's
    ``gpunuma_instances`` list. ``applied_plan`` is the plan the node runs
    now (``/etc/gpunuma/plan.json``), if any: the memory its instances hold
    counts as available to them in the capacity check. Raises
    :class:`PlanError` listing every problem found.
    """
    problems = []
    warnings = []
    _validate_options(housekeeping_cores_per_node, strict_capacity, problems)
    try:
        profile = validate_profile(profile)
    except ProfileError as exc:
        problems.extend(exc.problems)
        profile = None
    # With bad options or profile the instances are still checked, so that
    # one run reports every problem.
    housekeeping = (
        housekeeping_cores_per_node if _is_int(housekeeping_cores_per_node) and housekeeping_cores_per_node >= 0 else 1
    )
    topo = _Topology(topology, housekeeping, warnings)
    applied_plan = _validate_applied_plan(applied_plan, problems)

    if instances is None:
        instances = []
    if not isinstance(instances, list):
        raise PlanError(
            "%s: must be a list of instance mappings, got %s; allowed: a list (empty for no instances)"
            % (INSTANCES_VAR, _type_name(instances))
        )
    specs = []
    for pos, raw in enumerate(instances):
        spec = _validate_instance(raw, pos, topo, problems)
        if spec is not None:
            specs.append(spec)
    _check_unique(instances, problems)

    if problems and profile is None:
        raise PlanError(problems)
    _assign_gpus(specs, topo, warnings, problems)
    specs = [s for s in specs if s["kind"] == "numa_node" or s.get("gpus")]
    _check_gpu_environment(specs, topo, problems)
    for spec in specs:
        _apply_profile(spec, topo, profile)
    _allocate_cpus(specs, topo, problems)
    _check_capacity(specs, topo, strict_capacity, problems, applied_plan)
    if problems:
        raise PlanError(problems)
    _check_shares(specs, topo)
    if not instances:
        warnings.append("%s is empty: nothing to bind on %s" % (INSTANCES_VAR, topo.hostname))

    rendered = [_render(spec, topo, profile) for spec in specs]
    for item in rendered:
        warnings.extend("%s: %s" % (item["name"], w) for w in item["warnings"])
    return {
        "schema": SCHEMA,
        "hostname": topology.get("hostname"),
        "topology_fingerprint": topo.fingerprint,
        "profile": profile["name"],
        "options": {
            "housekeeping_cores_per_node": housekeeping_cores_per_node,
            "strict_capacity": strict_capacity,
        },
        "housekeeping": dict(
            (
                str(n),
                format_cpulist(frozenset().union(*topo.nodes[n].housekeeping)) if topo.nodes[n].housekeeping else "",
            )
            for n in topo.cpu_node_ids
        ),
        "worker_cpus": dict((str(n), format_cpulist(topo.nodes[n].worker_cpus)) for n in topo.cpu_node_ids),
        "instances": rendered,
        "warnings": warnings,
    }


def _check_unique(instances, problems):
    names = {}
    units = {}
    for pos, raw in enumerate(instances):
        if not isinstance(raw, dict):
            continue
        name = raw.get("name")
        if isinstance(name, str) and _NAME_RE.fullmatch(name):
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
