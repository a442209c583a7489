"""The hand-over to the inference engine: per-GPU worker shares, the engine's own binding flags and variables.

gpunuma binds an instance as a whole (``numactl --physcpubind=<share>`` and
its memory policy, plus the cgroup fence ``AllowedCPUs=<share>``). Engines
then start one worker per GPU and may bind those themselves; what gpunuma
hands them is decided here, per engine and version, from the engines' own
released source (docs/plan-v1.md, "Engines", cites each):

* ``vllm`` (``vllm/utils/numa_utils.py``): ``--numa-bind --numa-bind-nodes
  <node per GPU>`` from 0.20.0, where the flags appeared; ``--numa-bind-cpus
  <list per GPU>`` only from 0.23.0: from 0.20.0 to 0.22.x the EngineCore
  process is started under the first rank's list and every other rank's
  ``--physcpubind`` then fails ("cpu argument out of range"). Workers and,
  from 0.23.0, the EngineCore use ``numactl --cpunodebind=<nodes>`` where no
  list is given, which widens to every CPU of the node: the flags are
  written only where the fence holds the instance to its share. The
  binding works only under ``VLLM_WORKER_MULTIPROC_METHOD=spawn``.
* ``sglang`` (``python/sglang/srt/utils/numa_utils.py``): ``--numa-node
  <node per rank>``, each rank then bound to its node's part of the CPUs it
  may use (no per-rank list exists, so no ``worker_cpus`` are recorded for
  it); SGLang binds every rank by itself unless
  ``SGLANG_AUTO_NUMA_BIND=0``, which gpunuma sets wherever it binds the
  instance, so that only the ranks gpunuma names are bound, inside the fence.
* ``trtllm``: TensorRT-LLM pins its workers itself unless
  ``TLLM_NUMA_AWARE_WORKER_AFFINITY`` is set to anything but ``1``; gpunuma
  sets ``0`` wherever it binds the instance (the binding comes from outside).

A command that already carries the engine's binding flags binds its workers
itself: gpunuma adds none, says so, and (with the fence) holds the instance
to its share with the fence alone instead of binding it twice.
"""

from __future__ import annotations

import re

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist
from ansible.module_utils.gpunuma.plan import partition

ENGINES = ("generic", "vllm", "sglang", "trtllm")
# Flags gpunuma writes for an engine; a command that has one binds its workers itself.
ENGINE_FLAGS = {
    "vllm": ("--numa-bind", "--numa-bind-nodes", "--numa-bind-cpus"),
    "sglang": ("--numa-node",),
}
# vLLM runs an API server and an engine-core process besides one worker per
# GPU and asks for at least 2 + N physical cores (docs/plan-v1.md cites it).
VLLM_EXTRA_CORES = 2
# vLLM releases whose numa_utils.py was read: what each range accepts.
VLLM_FIRST_NUMA_BIND = (0, 20, 0)
VLLM_FIRST_RANK_CPUS = (0, 23, 0)
VLLM_NEWEST_READ = (0, 34, 0)
# Variables gpunuma sets where it binds the instance, and the value.
ENGINE_ENVIRONMENT = {
    "sglang": ("SGLANG_AUTO_NUMA_BIND", "0"),
    "trtllm": ("TLLM_NUMA_AWARE_WORKER_AFFINITY", "0"),
}
VERSION_RE = re.compile(r"v?([0-9]{1,4})\.([0-9]{1,4})(?:\.([0-9]{1,6}))?(?:[.+-]?[A-Za-z0-9.+_-]{0,40})?")


def parse_version(text):
    """``"0.23.1rc2"`` -> ``(0, 23, 1)``; None for anything that is not a release number."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        return None
    match = VERSION_RE.fullmatch(str(text).strip())
    if not match:
        return None
    return tuple(int(part or 0) for part in match.groups())


def _flag_name(engine, arg):
    """The option name of ``arg`` as the engine reads it: vLLM's FlexibleArgumentParser (vllm/utils) takes
    ``--numa_bind`` for ``--numa-bind``, so its underscores count as dashes."""
    name = arg.split("=", 1)[0]
    if engine == "vllm" and name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return name


def self_binding_flags(engine, command):
    """The engine binding flags already in ``command`` (the engine then binds its workers itself)."""
    flags = ENGINE_FLAGS.get(engine, ())
    return [arg for arg in command or [] if isinstance(arg, str) and _flag_name(engine, arg) in flags]


def split_worker_shares(spec, topo):
    """``spec.worker_cpus``: one CPU set per GPU (in ``spec.gpus`` order) from the instance's share, or None."""
    spec.worker_cpus = None
    # Only vLLM takes a CPU list per rank (--numa-bind-cpus); SGLang binds each rank to its node's part of the
    # instance's CPUs, so slices recorded for it would be applied by nothing.
    if (spec.engine != "vllm" or len(spec.gpus) < 2 or not spec.cpu_binding or not spec.allocated_cpus
            or spec.engine_self_binds):
        return
    shares = {}
    keep = VLLM_EXTRA_CORES if spec.engine == "vllm" else 0
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
        if node_id == spec.numa_nodes[0]:
            slices = _leave_cores(slices, len(cores), keep)
        left = len(cores) - sum(len(s) for s in slices)
        if left:
            spec.warnings.append(
                "engine %s: the %d GPU workers on NUMA node %d get %sslices of %s cores; the other %d cores of the "
                "instance stay for the API server and engine core"
                % (spec.engine, len(gpus_here), node_id, "L3-aligned " if aligned else "",
                   "/".join(sorted(set(str(len(s)) for s in slices))), left))
        for gpu, cores_of_rank in zip(gpus_here, slices):
            shares[gpu] = frozenset().union(*cores_of_rank)
    spec.worker_cpus = [shares[g] for g in spec.gpus]


def _leave_cores(slices, total, keep):
    """Trim the largest slices by whole cores (from their end, so each stays in its L3 domain) until ``keep`` are left."""
    slices = [list(s) for s in slices]
    while total - sum(len(s) for s in slices) < keep:
        largest = max(range(len(slices)), key=lambda i: (len(slices[i]), -i))
        if len(slices[largest]) <= 1:
            break
        slices[largest].pop()
    return slices


def engine_arguments(spec, topo, specs, fence):
    """The flags appended to the command for ``spec.engine`` (possibly none); sets the engine's variables, warns.

    ``fence``: whether the instance's unit gets the cgroup fence (True, False, or None when not known).
    """
    if spec.engine == "generic":
        return []
    binds = bool(spec.cpu_binding and spec.allocated_cpus)
    _engine_environment(spec, binds)
    if spec.engine_self_binds:
        spec.warnings.append(
            "engine %s: the command binds its workers itself (%s); gpunuma adds no binding flags and %s"
            % (spec.engine, ", ".join(spec.engine_self_binds),
               "holds the instance to its CPUs with the cgroup fence alone (no numactl around the engine)"
               if fence else "keeps its own binding around the engine; without the cgroup fence "
               "(numa_binding_fence) the engine's numactl can widen its workers past the instance's CPUs"))
        return []
    if spec.engine == "vllm":
        return _vllm_arguments(spec, topo, fence, binds)
    if spec.engine == "sglang":
        return _sglang_arguments(spec, topo, specs, fence, binds)
    return []  # trtllm: its variable only


def _engine_environment(spec, binds):
    """The engine's own binding switched off where gpunuma binds from outside; spawn for vLLM's own binding."""
    if spec.engine == "vllm":
        if spec.engine_self_binds:
            _set_spawn(spec)
        return
    wanted = ENGINE_ENVIRONMENT.get(spec.engine)
    if wanted is None or not binds:
        return
    name, value = wanted
    if name in spec.environment and spec.environment[name] != value:
        spec.warnings.append(
            "engine %s: environment.%s kept as given (%r); gpunuma sets %r where it binds the instance from "
            "outside, so that the engine does not re-pin its workers" % (spec.engine, name, spec.environment[name], value))
        return
    spec.environment[name] = value


def _set_spawn(spec):
    """vLLM applies its NUMA binding only to workers it spawns (numa_utils: "NUMA binding requires spawn method")."""
    name, value = "VLLM_WORKER_MULTIPROC_METHOD", "spawn"
    if name in spec.environment and spec.environment[name] != value:
        spec.warnings.append(
            "engine vllm: environment.%s is %r, but vLLM applies --numa-bind only to spawned workers (it logs "
            "\"NUMA binding requires spawn method\" and binds nothing); set spawn or leave it to gpunuma"
            % (name, spec.environment[name]))
        return
    spec.environment[name] = value


def _flags_need(spec, fence, what):
    """None when the engine may bind inside the instance's share, else the warning that says why not."""
    if not spec.command:
        return ("engine %s: the unit's own command is not known (a drop-in without command), so no per-GPU binding "
                "flags are added; give command to have them" % spec.engine)
    if not spec.cpu_binding or not spec.allocated_cpus:
        return "engine %s: no per-GPU binding flags (the instance binds no CPUs)" % spec.engine
    if not fence:
        return ("engine %s: %s would let the engine's numactl widen its workers to whole NUMA nodes past the "
                "instance's CPUs; they are added only with the cgroup fence (numa_binding_fence%s), so the "
                "instance-wide binding is kept" % (spec.engine, what, ": not on for this node" if fence is False
                                                   else " unknown to the planner"))
    return None


def _rank_nodes(spec, topo, fence, what):
    """Each rank's NUMA node, or None (with the warning why) when the engine may not bind its ranks here."""
    why_not = _flags_need(spec, fence, what)
    if why_not:
        spec.warnings.append(why_not)
        return None
    nodes = [topo.gpus[g].node for g in spec.gpus]
    return None if any(n is None for n in nodes) else nodes


def _below_vllm_minimum(spec, topo):
    """Warn where the instance has fewer physical cores than vLLM asks for: one per GPU worker plus 2."""
    cores = sum(len([c for c in topo.nodes[n].worker_cores if c <= spec.allocated_cpus]) for n in spec.numa_nodes)
    want = len(spec.gpus) + VLLM_EXTRA_CORES
    if cores < want:
        spec.warnings.append(
            "engine vllm: %d physical cores for %s, below vLLM's minimum of %d (one per worker plus the API server "
            "and engine core); expect CPU contention"
            % (cores, "one GPU worker" if len(spec.gpus) == 1 else "%d GPU workers" % len(spec.gpus), want))


def _vllm_arguments(spec, topo, fence, binds):
    if len(spec.gpus) < 2:
        if binds:
            _below_vllm_minimum(spec, topo)
        return []
    version = spec.engine_version
    if version is None:
        spec.warnings.append(
            "engine vllm: engine_version is not given, so no per-GPU binding flags are added (what vLLM accepts "
            "depends on its release: docs/plan-v1.md, Engines); give the installed vLLM version, e.g. "
            "engine_version: \"0.23.0\"")
        return []
    if version < VLLM_FIRST_NUMA_BIND:
        spec.warnings.append(
            "engine vllm: vLLM %s has no --numa-bind (added in 0.20.0); the instance-wide binding is kept"
            % _shown(version))
        return []
    nodes = _rank_nodes(spec, topo, fence, "--numa-bind")
    if nodes is None or spec.worker_cpus is None:
        return []
    _below_vllm_minimum(spec, topo)
    flags = ["--numa-bind", "--numa-bind-nodes"] + [str(n) for n in nodes]
    if version < VLLM_FIRST_RANK_CPUS:
        spec.warnings.append(
            "engine vllm: vLLM %s starts its EngineCore under the first rank's --numa-bind-cpus list and the other "
            "ranks then fail to start (fixed in 0.23.0): only --numa-bind-nodes is given, each worker is bound to "
            "its node and held to the instance's CPUs by the fence" % _shown(version))
    else:
        flags += ["--numa-bind-cpus"] + [format_cpulist(cpus) for cpus in spec.worker_cpus]
    if version[:2] > VLLM_NEWEST_READ[:2]:
        spec.warnings.append(
            "engine vllm: %s is newer than the newest vLLM whose NUMA binding gpunuma was checked against (%s); "
            "the flags of that release are used" % (_shown(version), _shown(VLLM_NEWEST_READ)))
    _set_spawn(spec)
    return flags


def _sglang_arguments(spec, topo, specs, fence, binds):
    if len(spec.gpus) < 2:
        return []
    nodes = _rank_nodes(spec, topo, fence, "--numa-node")
    if nodes is None:
        return []
    # SGLang binds each rank to its node: only where no other instance has CPUs on those nodes.
    others = [s.name for s in specs if s is not spec and s.cpu_binding and set(s.numa_nodes) & set(spec.numa_nodes)]
    if others:
        spec.warnings.append(
            "engine sglang: --numa-node binds each rank to its whole NUMA node, which instances %s also use; "
            "the instance-wide binding is kept and no flag is added" % ", ".join(repr(o) for o in sorted(others))
        )
        return []
    return ["--numa-node"] + [str(n) for n in nodes]


def _shown(version):
    return ".".join(str(part) for part in version)
