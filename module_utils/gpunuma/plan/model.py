"""The planner's shared vocabulary: its error, its constants and the per-instance record.

``InstanceSpec`` is what one ``gpunuma_instances`` entry becomes once its
input is checked (``plan_inputs``), and what each later step fills in:
GPU assignment and nodes (``plan_alloc``), CPUs (``plan_alloc``), memory
policy after the capacity check (``plan_capacity``). The field names say
which is which: ``requested_*`` is what the user wrote, ``allocated_*`` /
``assigned_*`` what the planner decided.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist
from ansible.module_utils.gpunuma.common.errors import ProblemsError
from ansible.module_utils.gpunuma.common import node_paths, schemas

SCHEMA = schemas.PLAN
# Additive fields raise the minor version; readers of v1 ignore fields they
# do not know. 1: siblings, memory_capacity, options.allow_unknown_siblings,
# options.memory_reserve_per_node, options.housekeeping_cpus, instance nics,
# gpu_nics, engine, worker_cpus, engine_args; 2: secret_environment; 3:
# instance engine_version, options.fence; 4: instance limit_memlock,
# options.limit_memlock; 5: instance pinned_source (docs/plan-v1.md, Versions).
SCHEMA_MINOR = 5
TOPOLOGY_SCHEMA = schemas.TOPOLOGY
INSTANCES_VAR = "gpunuma_instances"
APPLIED_PLAN_SOURCE = node_paths.PLAN
DEFAULT_SERVICE_USER = "gpunuma"
# The variables that select GPUs, CUDA's and ROCm's (ROCm docs, "GPU isolation techniques": ROCR_VISIBLE_DEVICES,
# GPU_DEVICE_ORDINAL, HIP_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES).
GPU_ENVIRONMENT = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                   "GPU_DEVICE_ORDINAL")
PLACEMENT_KEYS = ("gpus", "gpus_per_instance", "numa_node")
# Variables the planner can fill with an instance's nearest NICs (opt-in).
NIC_ENVIRONMENT = ("UCX_NET_DEVICES", "NCCL_IB_HCA")


class PlanError(ProblemsError):
    """The plan input has problems; ``problems`` lists each one.

    The message holds one problem per line, each naming the variable path
    and what is allowed.
    """


def is_int(value):
    """An int that is not a bool (YAML ``true`` is not 1 here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def type_name(value):
    """``a str``, ``an int``: the type of a value for messages."""
    name = type(value).__name__
    return ("an " if name[0] in "aeiou" else "a ") + name


@dataclass
class InstanceSpec:
    """One checked instance and the planner's decisions about it."""

    # Where it came from, for messages.
    pos: int
    path: str
    name: str
    # The input, checked.
    placement: str  # one of PLACEMENT_KEYS
    requested_gpus: Optional[List[int]] = None
    requested_gpu_count: Optional[int] = None
    requested_node: Optional[int] = None
    unit: str = ""
    mode: str = "service"  # service | dropin
    command: Optional[List[str]] = None
    binding_method: str = "numactl"
    user: Optional[str] = None
    group: Optional[str] = None
    environment: dict = field(default_factory=dict)
    secret_environment: List[str] = field(default_factory=list)  # names the instance marks secret
    secret_names: List[str] = field(default_factory=list)  # every secret name: marked or matching a pattern
    memory_bytes: Optional[int] = None
    memlock: object = None  # "infinity", bytes, or None
    pinned_bytes: Optional[int] = None  # the instance's pinned host memory budget
    pinned_source: Optional[str] = None  # "pinned" (declared), the engine options it was derived from, or None
    ready: Optional[dict] = None  # {url|command, timeout, interval}
    share_cpus: bool = False
    requested_cpu_count: Optional[int] = None
    requested_cpu_list: Optional[frozenset] = None
    nic_environment: List[str] = field(default_factory=list)
    engine: str = "generic"
    engine_version: Optional[tuple] = None  # (major, minor, patch) of engine_version
    engine_self_binds: List[str] = field(default_factory=list)  # the engine's binding flags the command has
    # Decisions.
    gpus: List[int] = field(default_factory=list)  # assigned GPUs, in the order given
    numa_nodes: List[int] = field(default_factory=list)  # binding nodes
    numa_bind_nodes: List[Optional[int]] = field(default_factory=list)  # per GPU
    cpu_binding: bool = False
    mem_policy: str = "default"
    mem_nodes: List[int] = field(default_factory=list)
    fallback: Optional[str] = None
    preferred_many: Optional[list] = None  # nodes of MPOL_PREFERRED_MANY when used instead of preferred
    cpu_list_rejected: bool = False  # the explicit list lies outside its nodes (a problem was reported)
    allocated_cpus: set = field(default_factory=set)
    worker_cpus: Optional[list] = None  # per GPU (engines that bind their own workers)
    engine_args: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)

    @property
    def cpus_text(self):
        """The allocated CPUs as a canonical list, or None when nothing is bound."""
        if not self.cpu_binding or not self.allocated_cpus:
            return None
        return format_cpulist(self.allocated_cpus)
