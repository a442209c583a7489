"""Kubelet topology settings: preset + topology + existing KubeletConfiguration -> merged config.

Pure: text and mappings in, a :class:`KubeletPlan` out; nothing is read from
or written to a node. docs/kubelet.md gives every rule with its Kubernetes
source. :func:`plan_kubelet` runs the sections in order: the preset and
overrides (here), the DRA mode (:mod:`kubelet.dra`), the manager policies and
their options and reservations (:mod:`kubelet.managers`, with the kubelet's
value rules of :mod:`kubelet.values`), the merge and the checkpoints (here).
In short:

* The keys gpunuma owns (:data:`OWNED_KEYS`) come from the preset of the
  node's binding profile (``policies/kubelet/<profile>.yml``), then per-key
  overrides; every other key of the file is kept as it was.
* ``reservedSystemCPUs`` under the ``static`` CPU policy is the union of the
  housekeeping cores the binding planner keeps away from workers
  (:func:`plan.planner.housekeeping_cpu_set`), never a choice made here.
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
from typing import Any, Optional

from ansible.module_utils.gpunuma.common import bounded
from ansible.module_utils.gpunuma.common.cpulist import parse_cpulist
from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.kubelet.dra import DRA_STATE_FILE, MEMORY_DRIFT_GATE, apply_dra, dra_checkpoint
from ansible.module_utils.gpunuma.kubelet.config import (
    KubeletConfigError,
    dump_config,
    parse_config,
    plain,
)
from ansible.module_utils.gpunuma.kubelet.managers import (
    cpu_manager, memory_manager, mixed_pod_shapes, policies, topology_manager)
from ansible.module_utils.gpunuma.kubelet.values import (
    DEFAULTS, EVICTION_HARD_DEFAULTS, KubeletPlanError, comparable, parse_version)
from ansible.module_utils.gpunuma.plan.model import PlanError
from ansible.module_utils.gpunuma.plan.planner import housekeeping_cpu_set
from ansible.module_utils.gpunuma.plan.profiles import ProfileError, validate_profile

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

DEFAULT_STATE_DIR = "/var/lib/kubelet"

CPU_STATE_FILE = "cpu_manager_state"

MEMORY_STATE_FILE = "memory_manager_state"


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


def checkpoint_policy(text):
    """The ``policyName`` a checkpoint file records, or None when it cannot be read."""
    try:
        data = bounded.loads_json(text)
    except (TypeError, ValueError):
        return None
    if isinstance(data, dict) and isinstance(data.get("policyName"), str):
        return data["policyName"]
    return None


def housekeeping_cpus(topology, profile, housekeeping_cores_per_node, explicit_cpus=None, binding_plan=None):
    """The CPUs the kubelet reserves (a frozenset): the binding plan's housekeeping where the node has a plan
    (:func:`planned_housekeeping`: the plan decided them, IRQ sizing included), else
    ``planner.housekeeping_cpu_set`` for a kubelet configured without a binding plan: the code that decides them
    for the binding plan, so the reserved CPUs are exactly the cores no worker gets. ``profile`` is checked as
    build_plan checks it (a bad one is a problem here too)."""
    problems = []
    try:
        validate_profile(profile)
    except ProfileError as exc:
        problems.extend(exc.problems)
    try:
        if binding_plan is not None:
            cpus = planned_housekeeping(binding_plan, topology)
        else:
            cpus = housekeeping_cpu_set(topology, housekeeping_cores_per_node, explicit_cpus)
    except PlanError as exc:
        raise PlanError(problems + list(exc.problems))
    if problems:
        raise PlanError(problems)
    return cpus


def planned_housekeeping(binding_plan: dict, topology: dict) -> frozenset:
    """The housekeeping CPUs of the node's binding plan (its ``housekeeping`` map, as one set).

    The plan must describe this topology (same fingerprint): a plan of other
    hardware would reserve CPUs the node does not have.
    """
    if not isinstance(binding_plan, dict) or not isinstance(binding_plan.get("housekeeping"), dict):
        raise PlanError(["plan: not a gpunuma.plan/v1 document with a housekeeping map"])
    if binding_plan.get("topology_fingerprint") != topology.get("fingerprint"):
        raise PlanError(["plan: made for topology %s, not this node's %s; plan the binding again"
                         % (binding_plan.get("topology_fingerprint"), topology.get("fingerprint"))])
    cpus: frozenset = frozenset()
    for node_id, text in sorted(binding_plan["housekeeping"].items()):
        cpus |= parse_cpulist(text or "", "plan.housekeeping[%s]" % node_id)
    return cpus


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


def plan_kubelet(topology: dict, profile: Any, preset: Any, config_text: Optional[str],
                 kubelet_version: Optional[str] = None, housekeeping_cores_per_node: Any = "auto",
                 housekeeping_cpus_list: Any = None, binding_plan: Optional[dict] = None, overrides: Any = None,
                 memory_spread: str = "first_node", manage_reservations: bool = False, cpu_state: Any = None,
                 memory_state: Any = None, state_dir: str = DEFAULT_STATE_DIR, config_source: str = "config",
                 pod_gpu_counts: Any = None, dra: str = "off", dra_state: Any = None) -> KubeletPlan:
    """Merge the preset, the topology's reservations and ``overrides`` into ``config_text``.

    ``profile`` is the binding profile mapping (it names the preset and gives
    the planner its housekeeping cores); ``preset`` the mapping of
    ``policies/kubelet/<profile>.yml``. ``cpu_state``/``memory_state`` are
    the checkpoint files' text, None when absent or unread. ``pod_gpu_counts``:
    the GPUs per pod of the workloads the node's pool runs (a warning when
    ``single-numa-node`` meets more than one count). Raises
    :class:`KubeletPlanError` listing every problem; returns a
    :class:`KubeletPlan`. ``dra`` is one of :data:`DRA_MODES`; ``dra_state``
    the ``dra_manager_state`` text (read, never planned away). ``binding_plan``:
    the node's ``gpunuma.plan/v1``, when one was made; its ``housekeeping`` is
    then the reserved CPUs, as decided (the IRQ CPUs of ``irq_pin`` included),
    never decided again here.
    """
    problems: list = []
    warnings: list = []
    hostname = topology.get("hostname") if isinstance(topology, dict) else None
    version, counts = _options(kubelet_version, memory_spread, manage_reservations, pod_gpu_counts, problems, warnings)
    try:
        reserved = housekeeping_cpus(topology, profile, housekeeping_cores_per_node, housekeeping_cpus_list,
                                     binding_plan)
    except GpunumaError as exc:
        raise KubeletPlanError(list(getattr(exc, "problems", [str(exc)])) + problems)
    run = _Run(topology, version, hostname or "this host", problems, warnings)
    reservations = _desired(run, profile, preset, overrides, manage_reservations)
    apply_dra(run, dra, overrides, reserved)
    try:
        parsed = parse_config(config_text, config_source)
    except KubeletConfigError as exc:
        raise KubeletPlanError([str(exc)] + problems)
    run.current = plain(parsed.doc)
    reservations = _reservation_overrides(run, reservations)
    policies(run)
    run.final_reservations = dict(run.current)
    run.final_reservations.update(reservations)
    cpu_manager(run, reserved, housekeeping_cores_per_node)
    topology_manager(run)
    mixed_pod_shapes(run, counts)
    memory_manager(run, memory_spread)
    if problems:
        raise KubeletPlanError(problems)
    changes, config_text = _merge(run, parsed, reservations)
    new_config = plain(parsed.doc)
    remove = _stale_checkpoints(run, new_config, changes, cpu_state, memory_state, state_dir)
    return KubeletPlan(new_config, config_text, [plain(c) for c in changes], remove, warnings, len(run.node_ids),
                       run.settings["reservedSystemCPUs"], parsed.fmt, plain(run.settings),
                       _dra_result(new_config, dra, dra_state, state_dir, warnings))


def _options(kubelet_version, memory_spread, manage_reservations, pod_gpu_counts, problems, warnings):
    """``(version tuple or None, pod GPU counts)``: the plain options checked, each problem named."""
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
    return version, counts


def _dra_result(new_config, dra, dra_state, state_dir, warnings):
    """The plan's DRA part: the mode, whether the kubelet unit checks its memory checkpoint first (Static without
    KEP-6232's tolerance gate), and the DRA checkpoint (its problem also a warning)."""
    gates = new_config.get("featureGates") if isinstance(new_config.get("featureGates"), dict) else {}
    result = {
        "mode": dra,
        "memory_checkpoint_guard": new_config.get("memoryManagerPolicy") == "Static" and gates.get(MEMORY_DRIFT_GATE) is not True,
        "dra_checkpoint": dra_checkpoint(dra_state, "%s/%s" % (state_dir.rstrip("/") or "", DRA_STATE_FILE)),
    }
    if result["dra_checkpoint"] and result["dra_checkpoint"]["problem"]:
        warnings.append(result["dra_checkpoint"]["problem"])
    return result


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
        if comparable(key, DEFAULTS.get(key) if old is None else old) == comparable(key, new):
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
