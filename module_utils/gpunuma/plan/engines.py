"""Per-GPU worker shares for tensor-parallel instances, and the engines' own binding flags.

Inference engines bind their own per-GPU worker processes: vLLM takes
``--numa-bind --numa-bind-nodes <node per GPU> --numa-bind-cpus <CPU list
per GPU>`` (each worker then runs under ``numactl --physcpubind=<its list>
--membind=<its node>``), SGLang ``--numa-node <node per rank>``. For an
instance of several GPUs the planner splits the instance's CPU share into
one sub-share per GPU (on that GPU's node, whole cores, disjoint, inside the
instance's share) and, for the engines it knows, appends the flags to the
command. ``engine: generic`` keeps the instance-wide binding.
"""

from __future__ import annotations

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist
from ansible.module_utils.gpunuma.plan import partition

ENGINES = ("generic", "vllm", "sglang")
# Flags gpunuma writes; a command that already has one is refused, so the
# engine never gets two different bindings.
ENGINE_FLAGS = {
    "vllm": ("--numa-bind", "--numa-bind-nodes", "--numa-bind-cpus"),
    "sglang": ("--numa-node",),
}
# vLLM runs an API server and an engine-core process besides one worker per
# GPU and asks for at least 2 + N physical cores (docs/plan-v1.md cites it).
VLLM_EXTRA_CORES = 2


def split_worker_shares(spec, topo):
    """``spec.worker_cpus``: one CPU set per GPU (in ``spec.gpus`` order) from the instance's share, or None."""
    spec.worker_cpus = None
    if spec.engine == "generic" or len(spec.gpus) < 2 or not spec.cpu_binding or not spec.allocated_cpus:
        return
    shares = {}
    for node_id in spec.numa_nodes:
        gpus_here = [g for g in spec.gpus if topo.gpus[g].node == node_id]
        cores = [core for core in topo.nodes[node_id].worker_cores if core <= spec.allocated_cpus]
        if len(cores) < len(gpus_here):
            spec.warnings.append(
                "engine %s: %d whole cores of this instance on NUMA node %d for %d GPU workers; the workers "
                "share the instance's CPUs instead of one core set each" % (spec.engine, len(cores), node_id, len(gpus_here))
            )
            return
        slices, aligned = partition.rank_slices(cores, topo.nodes[node_id].l3_groups, len(gpus_here))
        if aligned and sum(len(s) for s in slices) < len(cores):
            spec.warnings.append(
                "engine %s: the %d GPU workers on NUMA node %d get L3-aligned slices of %d cores each; the other %d "
                "cores of the instance stay for the API server and engine core"
                % (spec.engine, len(gpus_here), node_id, len(slices[0]), len(cores) - sum(len(s) for s in slices)))
        for gpu, cores_of_rank in zip(gpus_here, slices):
            shares[gpu] = frozenset().union(*cores_of_rank)
    spec.worker_cpus = [shares[g] for g in spec.gpus]


def engine_arguments(spec, topo, specs):
    """The flags appended to the command for ``spec.engine`` (possibly none), with warnings."""
    if spec.engine == "generic" or len(spec.gpus) < 2:
        return []
    if spec.command is None:
        spec.warnings.append(
            "engine %s: the unit's own command is not known (a drop-in without command), so no per-GPU binding "
            "flags are added; give command to have them" % spec.engine
        )
        return []
    nodes = [topo.gpus[g].node for g in spec.gpus]
    if any(n is None for n in nodes) or not spec.cpu_binding:
        spec.warnings.append("engine %s: no per-GPU binding flags (the instance binds no CPUs)" % spec.engine)
        return []
    if spec.engine == "vllm":
        if spec.worker_cpus is None:
            return []
        cores = sum(len([c for c in topo.nodes[n].worker_cores if c <= spec.allocated_cpus]) for n in spec.numa_nodes)
        want = len(spec.gpus) + VLLM_EXTRA_CORES
        if cores < want:
            spec.warnings.append(
                "engine vllm: %d physical cores for %d GPU workers, below vLLM's minimum of %d (one per worker "
                "plus the API server and engine core); expect CPU contention" % (cores, len(spec.gpus), want)
            )
        return (
            ["--numa-bind", "--numa-bind-nodes"]
            + [str(n) for n in nodes]
            + ["--numa-bind-cpus"]
            + [format_cpulist(cpus) for cpus in spec.worker_cpus]
        )
    # SGLang binds each rank to its whole node: only safe when no other
    # instance has CPUs on those nodes.
    others = [s.name for s in specs if s is not spec and s.cpu_binding and set(s.numa_nodes) & set(spec.numa_nodes)]
    if others:
        spec.warnings.append(
            "engine sglang: --numa-node binds each rank to its whole NUMA node, which instances %s also use; "
            "the instance-wide binding is kept and no flag is added" % ", ".join(repr(o) for o in sorted(others))
        )
        return []
    return ["--numa-node"] + [str(n) for n in nodes]
