"""Kubelet topology settings: preset + topology + existing KubeletConfiguration -> merged config.

Pure: text and mappings in, a :class:`KubeletPlan` out; nothing is read from
or written to a node. docs/kubelet.md gives every rule with its Kubernetes
source. In short:

* The keys gpunuma owns (:data:`OWNED_KEYS`) come from the preset of the
  node's binding profile (``policies/kubelet/<profile>.yml``), then per-key
  overrides; every other key of the file is kept as it was.
* ``reservedSystemCPUs`` under the ``static`` CPU policy is the union of the
  housekeeping cores the binding planner keeps away from workers
  (:func:`plan.build_plan`), never a choice made here.
* ``reservedMemory`` under the ``Static`` Memory Manager policy is computed so
  that, per resource, its sum equals kube-reserved + system-reserved + the
  hard eviction threshold (100Mi for memory while ``evictionHard`` is absent).
* ``max-allowable-numa-nodes`` is set exactly when the node has more than 8
  NUMA nodes (CPU-less memory nodes count, as the kubelet counts them) and the
  Topology Manager policy is not ``none``.
* A checkpoint file (``cpu_manager_state``, ``memory_manager_state``) is
  removed exactly when the kubelet would refuse to restore it: its recorded
  policy differs from the new one, or the reservation it was built with
  changed.

Every problem is collected and raised at once in :class:`KubeletPlanError`,
each line naming the field, the value and what is allowed.
"""

from __future__ import annotations

import copy
import decimal
import re

from ansible.module_utils.gpunuma.common import bounded
from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, parse_cpulist
from ansible.module_utils.gpunuma.common.errors import CpuListError, GpunumaError, ProblemsError
from ansible.module_utils.gpunuma.kubelet.dra import DRA_STATE_FILE, MEMORY_DRIFT_GATE, apply_dra, dra_checkpoint
from ansible.module_utils.gpunuma.kubelet.config import (
    KubeletConfigError,
    dump_config,
    parse_config,
    plain,
)
from ansible.module_utils.gpunuma.plan.model import PlanError
from ansible.module_utils.gpunuma.plan.planner import housekeeping_cpu_set
from ansible.module_utils.gpunuma.plan.profiles import ProfileError, validate_profile

CPU_POLICIES = ("none", "static")
MEMORY_POLICIES = ("None", "Static")
TOPOLOGY_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
TOPOLOGY_SCOPES = ("container", "pod")
MEMORY_SPREADS = ("first_node", "cpu_nodes")
PRESET_KEYS = (
    "cpuManagerPolicy",
    "cpuManagerPolicyOptions",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "topologyManagerPolicyOptions",
    "memoryManagerPolicy",
)
OWNED_KEYS = PRESET_KEYS + ("reservedMemory", "reservedSystemCPUs")
RESERVATION_KEYS = ("kubeReserved", "systemReserved", "evictionHard")
DEFAULTS = {
    "cpuManagerPolicy": "none",
    "topologyManagerPolicy": "none",
    "topologyManagerScope": "container",
    "memoryManagerPolicy": "None",
}
# The kubelet's hard eviction defaults on Linux; they apply only while
# evictionHard is absent from the config (kubernetes.io, Node-pressure Eviction).
EVICTION_HARD_DEFAULTS = {
    "memory.available": "100Mi",
    "nodefs.available": "10%",
    "imagefs.available": "15%",
    "nodefs.inodesFree": "5%",
}
MAX_NUMA_NODES_OPTION = "max-allowable-numa-nodes"
KUBELET_MAX_NUMA_NODES = 8
DEFAULT_STATE_DIR = "/var/lib/kubelet"
CPU_STATE_FILE = "cpu_manager_state"
MEMORY_STATE_FILE = "memory_manager_state"

# Static CPU policy options: (alpha since, beta since, GA since), from the
# kubelet's CPU management policies page (kubernetes.io, "Control CPU
# Management Policies on the Node": strict-cpu-reservation GA in 1.35,
# prefer-align-cpus-by-uncorecache GA in 1.36). Alpha options need the feature gate
# CPUManagerPolicyAlphaOptions; beta ones CPUManagerPolicyBetaOptions (on by
# default).
CPU_POLICY_OPTIONS = {
    "full-pcpus-only": ((1, 22), (1, 23), (1, 33)),
    "distribute-cpus-across-numa": ((1, 23), (1, 33), None),
    "align-by-socket": ((1, 25), None, None),
    "distribute-cpus-across-cores": ((1, 31), None, None),
    "strict-cpu-reservation": ((1, 31), (1, 32), (1, 35)),
    "prefer-align-cpus-by-uncorecache": ((1, 32), (1, 34), (1, 36)),
}
TOPOLOGY_POLICY_OPTIONS = {
    "prefer-closest-numa-nodes": ((1, 26), (1, 28), (1, 32)),
    MAX_NUMA_NODES_OPTION: ((1, 31), (1, 31), (1, 35)),
}
BOOLEAN_OPTION_VALUES = ("true", "false")
# The Topology Manager's pod scope and the policies used here exist since 1.18.
OLDEST_KUBELET = (1, 18)
# The Memory Manager's Static policy is beta (on by default) since 1.22.
MEMORY_STATIC_SINCE = (1, 22)

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?$")
_QUANTITY_RE = re.compile(r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"m": -1, "": 0, "k": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}
_HUGEPAGES_RE = re.compile(r"^hugepages-[0-9]+(Ki|Mi|Gi)$")


class KubeletPlanError(ProblemsError):
    """The inputs have problems; ``problems`` lists each, one per line of the message."""


class KubeletPlan(object):
    """What the kubelet_topology role applies; :meth:`as_dict` is the module's result."""

    def __init__(self, config, config_text, changes, remove_checkpoints, warnings, numa_nodes, reserved_cpus,
                 fmt, settings, dra=None):
        self.config = config
        self.config_text = config_text
        self.changes = changes
        self.remove_checkpoints = remove_checkpoints
        self.warnings = warnings
        self.numa_nodes = numa_nodes
        self.reserved_cpus = reserved_cpus
        self.fmt = fmt
        self.settings = settings
        # {"mode", "memory_checkpoint_guard", "dra_checkpoint"}: what DRA and the boot-time check decided.
        self.dra = dra or {"mode": "off", "memory_checkpoint_guard": False, "dra_checkpoint": None}

    @property
    def transition_needed(self):
        return bool(self.changes or self.remove_checkpoints)

    def as_dict(self):
        return {
            "config": self.config,
            "config_text": self.config_text,
            "config_format": self.fmt,
            "changes": self.changes,
            "remove_checkpoints": self.remove_checkpoints,
            "transition_needed": self.transition_needed,
            "settings": self.settings,
            "numa_node_count": self.numa_nodes,
            "reserved_cpus": self.reserved_cpus,
            "warnings": self.warnings,
            "dra_mode": self.dra["mode"],
            "memory_checkpoint_guard": self.dra["memory_checkpoint_guard"],
            "dra_checkpoint": self.dra["dra_checkpoint"],
        }


# --------------------------------------------------------------------------
# Small public helpers


def parse_version(text, what="kubelet_version"):
    """``(major, minor)`` from ``"1.31"``, ``"v1.31.2"``, ``"1.31.0-eks-1"``; None stays None."""
    if text is None:
        return None
    match = _VERSION_RE.match(str(text).strip())
    if not match or isinstance(text, bool):
        raise KubeletPlanError("%s: %r is not a Kubernetes version; allowed: MAJOR.MINOR such as \"1.31\" or v1.31.2"
                               % (what, text))
    version = int(match.group(1)), int(match.group(2))
    if version < OLDEST_KUBELET:
        raise KubeletPlanError(
            "%s: %r is older than any kubelet gpunuma supports; allowed: %d.%d or later, as a quoted string (YAML reads "
            "an unquoted 1.30 as the number 1.3)" % ((what, text) + OLDEST_KUBELET))
    return version


def parse_quantity(value, what):
    """A Kubernetes resource quantity (``100Mi``, ``1G``, ``512``, ``1.5Gi``) as a Decimal."""
    if isinstance(value, bool) or value is None:
        raise KubeletPlanError("%s: %r is not a quantity; allowed: a Kubernetes quantity such as 100Mi, 1Gi, 500M"
                               % (what, value))
    text = str(value).strip()
    match = _QUANTITY_RE.match(text)
    if not match:
        raise KubeletPlanError("%s: %r is not a quantity; allowed: a Kubernetes quantity such as 100Mi, 1Gi, 500M"
                               % (what, value))
    number = decimal.Decimal(match.group(1))
    if number < 0:
        raise KubeletPlanError("%s: %r is negative; allowed: a quantity of 0 or more" % (what, value))
    suffix = match.group(2) or ""
    if suffix in _BINARY:
        return number * (1024 ** _BINARY[suffix])
    if suffix in _DECIMAL:
        return number * (decimal.Decimal(1000) ** _DECIMAL[suffix])
    return number * (decimal.Decimal(10) ** int(suffix[1:]))


def format_quantity(count):
    """Bytes as the largest binary suffix that divides them exactly (``1073741824`` -> ``1Gi``)."""
    count = int(count)
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = 1024 ** _BINARY[suffix]
        if count and count % unit == 0:
            return "%d%s" % (count // unit, suffix)
    return str(count)


def checkpoint_policy(text):
    """The ``policyName`` a checkpoint file records, or None when it cannot be read."""
    try:
        data = bounded.loads_json(text)
    except (TypeError, ValueError):
        return None
    if isinstance(data, dict) and isinstance(data.get("policyName"), str):
        return data["policyName"]
    return None


def housekeeping_cpus(topology, profile, housekeeping_cores_per_node, explicit_cpus=None):
    """The planner's housekeeping CPUs (a frozenset): ``planner.housekeeping_cpu_set``, the code that decides
    them for the binding plan, so the kubelet's reserved CPUs are exactly the cores no worker gets. ``profile``
    is checked as build_plan checks it (a bad one is a problem here too)."""
    problems = []
    try:
        validate_profile(profile)
    except ProfileError as exc:
        problems.extend(exc.problems)
    try:
        cpus = housekeeping_cpu_set(topology, housekeeping_cores_per_node, explicit_cpus)
    except PlanError as exc:
        raise PlanError(problems + list(exc.problems))
    if problems:
        raise PlanError(problems)
    return cpus


# --------------------------------------------------------------------------
# Validation of the desired settings


def _option_problem(field, name, value, table, version, gates, alpha_gate, beta_gate):
    """One problem line for a policy option, or None."""
    if name not in table:
        return "%s: option %r is unknown; allowed: %s" % (field, name, ", ".join(sorted(table)))
    if name == MAX_NUMA_NODES_OPTION:
        text = str(value) if not isinstance(value, bool) else ""
        if not text.isdigit() or int(text) < KUBELET_MAX_NUMA_NODES:
            return "%s.%s: %r is not allowed; allowed: an integer of at least %d, as a string (\"16\"), never true" % (
                field, name, value, KUBELET_MAX_NUMA_NODES)
    elif str(value) not in BOOLEAN_OPTION_VALUES:
        return "%s.%s: %r is not allowed; allowed: \"true\" or \"false\"" % (field, name, value)
    if version is None:
        return None
    alpha, beta, ga = table[name]
    if version < alpha:
        return "%s.%s: needs kubelet %d.%d or later (kubelet_version is %d.%d); allowed: remove the option or upgrade" % (
            field, name, alpha[0], alpha[1], version[0], version[1])
    if ga is not None and version >= ga:
        return None
    if beta is not None and version >= beta:
        if gates.get(beta_gate) is False:
            return "%s.%s: is beta in kubelet %d.%d and featureGates.%s is false; allowed: that gate on (its default)" % (
                field, name, version[0], version[1], beta_gate)
        return None
    if gates.get(alpha_gate) is not True:
        return "%s.%s: is alpha in kubelet %d.%d and needs featureGates.%s: true; allowed: set that gate, or remove the option" % (
            field, name, version[0], version[1], alpha_gate)
    return None


def _normalise_options(field, value, problems):
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append("%s: %r is not a mapping; allowed: a mapping of option name to string value" % (field, value))
        return {}
    out = {}
    for key, item in value.items():
        # The kubelet reads these as map[string]string: a YAML true would not decode.
        out[str(key)] = ("true" if item else "false") if isinstance(item, bool) else str(item)
    return out


def _memory_totals(config, topology_total, problems, source):
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
            if resource == "memory" or _HUGEPAGES_RE.match(resource):
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


def _spread(totals, nodes, spread):
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


def _reserved_memory_sums(entries, field, node_ids, problems):
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
            if resource != "memory" and not _HUGEPAGES_RE.match(resource):
                problems.append("%s.limits.%s: unknown resource; allowed: memory, hugepages-<size>" % (where, resource))
                continue
            try:
                sums[resource] = sums.get(resource, 0) + parse_quantity(raw, "%s.limits.%s" % (where, resource))
            except KubeletPlanError as exc:
                problems.extend(exc.problems)
    return sums


def _comparable(key, value):
    """Value of an owned key for change detection: equal meaning compares equal."""
    value = plain(value)
    if key == "reservedMemory" and isinstance(value, list):
        out = []
        for entry in value:
            if isinstance(entry, dict) and isinstance(entry.get("limits"), dict):
                limits = {}
                for resource, raw in entry["limits"].items():
                    try:
                        limits[resource] = str(parse_quantity(raw, resource).normalize())
                    except KubeletPlanError:
                        limits[resource] = raw
                out.append((repr(entry.get("numaNode")), sorted(limits.items())))
            else:
                out.append(repr(entry))
        return sorted(out)
    if key == "reservedSystemCPUs" and isinstance(value, str):
        try:
            return format_cpulist(parse_cpulist(value, key))
        except CpuListError:
            return value
    if key in ("cpuManagerPolicyOptions", "topologyManagerPolicyOptions") and value == {}:
        return None
    return value


# --------------------------------------------------------------------------
# Entry point


class _Run(object):
    """What one plan_kubelet call has read and decided so far (its sections below share it)."""

    def __init__(self, topology, version, host, problems, warnings):
        self.topology = topology
        self.version = version
        self.host = host
        self.problems = problems
        self.warnings = warnings
        self.node_ids = sorted(n["id"] for n in topology["numa_nodes"])
        self.cpu_nodes = sorted(n["id"] for n in topology["numa_nodes"] if n.get("has_cpus", True) and n.get("cpus"))
        self.all_cpus = frozenset()
        for node in topology["numa_nodes"]:
            if node.get("cpus"):
                self.all_cpus |= parse_cpulist(node["cpus"], "topology.numa_nodes[%s].cpus" % node["id"])
        self.memory_total = sum(int(n.get("memory_total_bytes") or 0) for n in topology["numa_nodes"])
        self.desired = {}
        self.current = {}
        self.gates = {}
        self.final_reservations = {}
        self.settings = {}


def plan_kubelet(topology, profile, preset, config_text, kubelet_version=None, housekeeping_cores_per_node="auto",
                 housekeeping_cpus_list=None,
                 overrides=None, memory_spread="first_node", manage_reservations=False, cpu_state=None,
                 memory_state=None, state_dir=DEFAULT_STATE_DIR, config_source="config", pod_gpu_counts=None,
                 dra="off", dra_state=None):
    """Merge the preset, the topology's reservations and ``overrides`` into ``config_text``.

    ``profile`` is the binding profile mapping (it names the preset and gives
    the planner its housekeeping cores); ``preset`` the mapping of
    ``policies/kubelet/<profile>.yml``. ``cpu_state``/``memory_state`` are
    the checkpoint files' text, None when absent or unread. ``pod_gpu_counts``:
    the GPUs per pod of the workloads the node's pool runs (a warning when
    ``single-numa-node`` meets more than one count). Raises
    :class:`KubeletPlanError` listing every problem; returns a
    :class:`KubeletPlan`. ``dra`` is one of :data:`DRA_MODES`; ``dra_state``
    the ``dra_manager_state`` text (read, never planned away).
    """
    problems = []
    warnings = []
    hostname = topology.get("hostname") if isinstance(topology, dict) else None
    host = hostname or "this host"
    try:
        version = parse_version(kubelet_version)
    except KubeletPlanError as exc:
        problems.extend(exc.problems)
        version = None
    if kubelet_version is None:
        warnings.append("kubelet_version is not set: the minimum kubelet versions of policy options were not checked")
    if memory_spread not in MEMORY_SPREADS:
        problems.append("memory_spread: %r is not allowed; allowed: %s" % (memory_spread, ", ".join(MEMORY_SPREADS)))
    if not isinstance(manage_reservations, bool):
        problems.append("manage_reservations: %r is not a boolean; allowed: true, false" % (manage_reservations,))
    counts = list(pod_gpu_counts or [])
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts):
        problems.append("pod_gpu_counts: %r is not allowed; allowed: a list of GPU counts per pod (integers, 0 or more)"
                        % (pod_gpu_counts,))
        counts = []

    try:
        reserved = housekeeping_cpus(topology, profile, housekeeping_cores_per_node, housekeeping_cpus_list)
    except GpunumaError as exc:
        raise KubeletPlanError(list(getattr(exc, "problems", [str(exc)])) + problems)
    run = _Run(topology, version, host, problems, warnings)
    reservations = _desired(run, profile, preset, overrides, manage_reservations)
    apply_dra(run, dra, overrides, reserved)
    try:
        parsed = parse_config(config_text, config_source)
    except KubeletConfigError as exc:
        raise KubeletPlanError([str(exc)] + problems)
    run.current = plain(parsed.doc)
    reservations = _reservation_overrides(run, reservations)
    _policies(run)
    run.final_reservations = dict(run.current)
    run.final_reservations.update(reservations)
    _cpu_manager(run, reserved, housekeeping_cores_per_node)
    _topology_manager(run)
    _mixed_pod_shapes(run, counts)
    _memory_manager(run, memory_spread)
    if problems:
        raise KubeletPlanError(problems)
    changes, config_text = _merge(run, parsed, reservations)
    new_config = plain(parsed.doc)
    remove = _stale_checkpoints(run, new_config, changes, cpu_state, memory_state, state_dir)
    gates = new_config.get("featureGates") if isinstance(new_config.get("featureGates"), dict) else {}
    dra_result = {
        "mode": dra,
        # Static Memory Manager without KEP-6232's tolerance: the kubelet unit checks its checkpoint first.
        "memory_checkpoint_guard": new_config.get("memoryManagerPolicy") == "Static" and gates.get(MEMORY_DRIFT_GATE) is not True,
        "dra_checkpoint": dra_checkpoint(dra_state, "%s/%s" % (state_dir.rstrip("/") or "", DRA_STATE_FILE)),
    }
    if dra_result["dra_checkpoint"] and dra_result["dra_checkpoint"]["problem"]:
        warnings.append(dra_result["dra_checkpoint"]["problem"])
    return KubeletPlan(new_config, config_text, [plain(c) for c in changes], remove, warnings, len(run.node_ids),
                       run.settings["reservedSystemCPUs"], parsed.fmt, plain(run.settings), dra_result)


def _desired(run, profile, preset, overrides, manage_reservations):
    """The owned settings wanted (the preset, then overrides) in ``run.desired``; returns the reservation overrides."""
    problems = run.problems
    if not isinstance(preset, dict):
        raise KubeletPlanError(["preset: %r is not a mapping; allowed: the content of policies/kubelet/<profile>.yml"
                                % (preset,)] + problems)
    desired = run.desired
    for key, value in preset.items():
        if key in ("profile", "description"):
            continue
        if key not in PRESET_KEYS:
            problems.append("preset.%s: is not a preset key; allowed: %s" % (key, ", ".join(PRESET_KEYS)))
            continue
        desired[key] = value
    if preset.get("profile") not in (None, profile.get("name") if isinstance(profile, dict) else None):
        problems.append("preset.profile: %r is not the binding profile %r; allowed: the preset of that profile"
                        % (preset.get("profile"), profile.get("name")))
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, dict):
        problems.append("overrides: %r is not a mapping; allowed: owned KubeletConfiguration key -> value" % (overrides,))
        overrides = {}
    reservations = {}
    for key, value in overrides.items():
        if key in OWNED_KEYS:
            desired[key] = value
        elif key in RESERVATION_KEYS:
            if manage_reservations is True:
                reservations[key] = value
            else:
                problems.append("overrides.%s: is written only with manage_reservations: true; allowed: that, or "
                                "set %s in the kubelet config yourself" % (key, key))
        else:
            problems.append("overrides.%s: is not a key gpunuma manages; allowed: %s"
                            % (key, ", ".join(OWNED_KEYS + RESERVATION_KEYS)))
    return reservations


def _reservation_overrides(run, reservations):
    """The reservation overrides checked; evictionHard keeps the kubelet's defaults it would otherwise drop."""
    for key, value in reservations.items():
        if not isinstance(value, dict):
            run.problems.append("overrides.%s: %r is not a mapping; allowed: resource -> quantity" % (key, value))
            reservations[key] = None
        elif key == "evictionHard" and "evictionHard" not in run.current:
            # evictionHard replaces the defaults as a whole: keep disk-pressure eviction on.
            merged = dict(EVICTION_HARD_DEFAULTS)
            merged.update(dict((str(k), str(v)) for k, v in value.items()))
            missing = sorted(set(EVICTION_HARD_DEFAULTS) - set(value))
            if missing:
                run.warnings.append("evictionHard: written with the kubelet's defaults for %s as well, since an "
                                    "evictionHard without them switches those evictions off" % ", ".join(missing))
            reservations[key] = merged
    return dict((k, v) for k, v in reservations.items() if v is not None)


def _policies(run):
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


def _cpu_manager(run, reserved, housekeeping_cores_per_node):
    """CPU Manager options and reservation (``reservedSystemCPUs``: the planner's housekeeping CPUs)."""
    desired, problems, warnings, host = run.desired, run.problems, run.warnings, run.host
    cpu_policy = run.settings["cpuManagerPolicy"]
    cpu_options = _normalise_options("cpuManagerPolicyOptions", desired.get("cpuManagerPolicyOptions"), problems)
    if cpu_options and cpu_policy != "static":
        problems.append("cpuManagerPolicyOptions: %r is set under cpuManagerPolicy %r, which stops the kubelet; "
                        "allowed: options only with cpuManagerPolicy: static" % (cpu_options, cpu_policy))
    for name, value in sorted(cpu_options.items()):
        line = _option_problem("cpuManagerPolicyOptions", name, value, CPU_POLICY_OPTIONS, run.version, run.gates,
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


def _mixed_pod_shapes(run, counts):
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


def _topology_manager(run):
    """Topology Manager options (``max-allowable-numa-nodes`` where the machine has more than 8 nodes)."""
    problems, host, version = run.problems, run.host, run.version
    topology_policy = run.settings["topologyManagerPolicy"]
    topo_options = _normalise_options("topologyManagerPolicyOptions", run.desired.get("topologyManagerPolicyOptions"),
                                      problems)
    count = len(run.node_ids)
    if MAX_NUMA_NODES_OPTION in topo_options:
        # A value the user gave is checked even where gpunuma then replaces or drops it.
        line = _option_problem("topologyManagerPolicyOptions", MAX_NUMA_NODES_OPTION, topo_options[MAX_NUMA_NODES_OPTION],
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
        line = _option_problem("topologyManagerPolicyOptions", name, value, TOPOLOGY_POLICY_OPTIONS, version, run.gates,
                               "TopologyManagerPolicyAlphaOptions", "TopologyManagerPolicyBetaOptions")
        if line:
            problems.append(line)
    run.settings["topologyManagerPolicyOptions"] = topo_options or None


def _memory_manager(run, memory_spread):
    """Memory Manager reservation (``reservedMemory`` summing to the reservations, as Static insists)."""
    problems, version, desired = run.problems, run.version, run.desired
    memory_policy = run.settings["memoryManagerPolicy"]
    reserved_memory = None
    if memory_policy == "Static":
        if version is not None and version < MEMORY_STATIC_SINCE:
            problems.append("memoryManagerPolicy: Static needs kubelet %d.%d or later (kubelet_version is %d.%d); "
                            "allowed: None, or upgrade" % (MEMORY_STATIC_SINCE + version))
        totals = _memory_totals(run.final_reservations, run.memory_total, problems, "config")
        if "reservedMemory" in desired and desired["reservedMemory"] is not None:
            reserved_memory = plain(desired["reservedMemory"])
            sums = _reserved_memory_sums(reserved_memory, "reservedMemory", set(run.node_ids), problems)
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
                reserved_memory = _spread(totals, run.cpu_nodes, memory_spread)
    elif desired.get("reservedMemory"):
        problems.append("reservedMemory: is set under memoryManagerPolicy %r; allowed: reservedMemory only with Static"
                        % (memory_policy,))
    run.settings["reservedMemory"] = reserved_memory


def _merge(run, parsed, reservations):
    """``(changes, text)``: the settings merged into the parsed document, only keys whose value changes."""
    changes = []
    doc = parsed.doc
    new_values = dict(run.settings)
    new_values.update(reservations)
    for key in OWNED_KEYS + tuple(sorted(reservations)):
        new = new_values.get(key)
        old = run.current.get(key)
        # An absent policy key is the kubelet's default: writing the default out is no change.
        if _comparable(key, DEFAULTS.get(key) if old is None else old) == _comparable(key, new):
            continue
        changes.append({"key": key, "old": old, "new": new})
        if new is None:
            if key in doc:
                del doc[key]
        else:
            doc[key] = copy.deepcopy(new)
    return changes, dump_config(parsed, [c["key"] for c in changes]) if changes else parsed.text


def _stale_checkpoints(run, new_config, changes, cpu_state, memory_state, state_dir):
    """The checkpoint files the new config would not restore (the kubelet refuses to start with them)."""
    remove = []
    state_dir = state_dir.rstrip("/") or "/"
    changed_keys = set(c["key"] for c in changes)
    for name, text, key, extra in (
        (CPU_STATE_FILE, cpu_state, "cpuManagerPolicy", "reservedSystemCPUs"),
        (MEMORY_STATE_FILE, memory_state, "memoryManagerPolicy", "reservedMemory"),
    ):
        path = "%s/%s" % (state_dir, name)
        old_policy = run.current.get(key, DEFAULTS[key])
        new_policy = new_config.get(key, DEFAULTS[key])
        if text is not None:
            recorded = checkpoint_policy(text)
            if recorded is None:
                run.warnings.append("%s cannot be read as a kubelet checkpoint; it is removed so the kubelet can start"
                                    % path)
                remove.append(path)
                continue
            old_policy = recorded
        if old_policy != new_policy or (new_policy in ("static", "Static") and extra in changed_keys):
            if text is not None or key in changed_keys or extra in changed_keys:
                remove.append(path)
    return remove
