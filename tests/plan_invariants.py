"""Invariants every ``gpunuma.plan/v1`` must hold, checked from the outside.

Shared by the property-based tests (``tests/unit/test_props_plan.py``) and
the hostile-input corpus (``tests/unit/test_hostile_plan.py``). Only the
plan document and the topology it was made from are read, so the checks do
not trust any of the planner's own data structures.
"""

import copy
import json
import signal

from ansible.module_utils.gpunuma.common.cpulist import parse_cpulist
from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.gate import policy
from ansible.module_utils.gpunuma.gate import checks as policy_checks
from ansible.module_utils.gpunuma.plan.model import PlanError
from ansible.module_utils.gpunuma.plan.planner import build_plan


class Overran(Exception):
    """build_plan took longer than the time bound of one input."""


def _timeout(signum, frame):
    raise Overran("build_plan ran past its time bound")


def plan_or_error(topology, profile, instances, time_limit_s=5, **options):
    """``("plan", plan)`` or ``("error", PlanError)``; anything else propagates.

    The planner must not hang: an alarm interrupts it after ``time_limit_s``.
    """
    old = signal.signal(signal.SIGALRM, _timeout)
    signal.setitimer(signal.ITIMER_REAL, time_limit_s)
    try:
        return "plan", build_plan(topology, profile, instances, **options)
    except GpunumaError as exc:
        assert isinstance(exc, PlanError), "the planner raised %r, not a PlanError" % (exc,)
        assert exc.problems, "a PlanError without problems"
        assert str(exc) == "\n".join(exc.problems)
        for problem in exc.problems:
            assert isinstance(problem, str) and problem.strip(), exc.problems
            assert "Traceback" not in problem
        return "error", exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _cores_of(node):
    groups = []
    for text in node.get("cores") or []:
        try:
            groups.append(parse_cpulist(text))
        except GpunumaError:
            pass
    return groups


def check_plan(plan, topology, instances):
    """Assert the invariants of a finished plan made from ``topology``."""
    nodes = {n["id"]: n for n in topology["numa_nodes"]}
    node_cpus = {i: parse_cpulist(n.get("cpus") or "") if n.get("has_cpus", True) is not False else frozenset()
                 for i, n in nodes.items()}
    # Only what the node grants its services and does not isolate is planned on (docs/plan-v1.md).
    every = frozenset().union(*node_cpus.values()) if node_cpus else frozenset()
    usable = (parse_cpulist(topology["cpus_granted"]) if topology.get("cpus_granted") is not None else every) \
        - (parse_cpulist(topology["cpus_isolated"]) if topology.get("cpus_isolated") else frozenset())
    node_cpus = {i: cpus & usable for i, cpus in node_cpus.items()}
    cpu_nodes = set(i for i, cpus in node_cpus.items() if cpus)
    assert plan["schema"] == "gpunuma.plan/v1"
    # One capacity verdict: the policy gate's membind rule passes whatever the planner bound.
    gate = policy.Context("host", topology, plan, {}, None)
    assert not policy_checks.check_strict_membind_fits(gate, {}), "the gate refuses what the planner bound"
    duplicated = sorted(set(w for w in plan["warnings"] if plan["warnings"].count(w) > 1))
    assert not duplicated, "warnings listed more than once: %r" % duplicated
    # housekeeping and worker CPUs: per CPU-bearing node, disjoint, on the node
    assert set(plan["housekeeping"]) == set(str(i) for i in cpu_nodes)
    assert set(plan["worker_cpus"]) == set(str(i) for i in cpu_nodes)
    housekeeping = {}
    workers = {}
    for key in plan["housekeeping"]:
        hk = parse_cpulist(plan["housekeeping"][key])
        wk = parse_cpulist(plan["worker_cpus"][key])
        assert not hk & wk, "node %s: housekeeping CPUs are worker CPUs" % key
        assert hk | wk <= node_cpus[int(key)], "node %s: CPUs outside the node" % key
        housekeeping[int(key)] = hk
        workers[int(key)] = wk
    all_housekeeping = frozenset().union(*housekeeping.values()) if housekeeping else frozenset()

    given = [i for i in instances if isinstance(i, dict)]
    assert len(plan["instances"]) <= len(given)
    exclusive_owner = {}
    for inst in plan["instances"]:
        name = inst["name"]
        # CPU-less nodes are never bound, for CPUs or memory; nodes without memory never for memory
        for node_id in inst["numa_nodes"] + inst["mem_nodes"]:
            assert node_id in cpu_nodes, "%s: bound to CPU-less or unknown node %r" % (name, node_id)
        for node_id in inst["mem_nodes"]:
            assert nodes[node_id].get("memory_total_bytes") != 0, "%s: memory bound to node %d, which has none" % (
                name, node_id)
        if inst["cpus"] is None:
            assert not any(a.startswith("--physcpubind") for a in inst["numactl_args"])
            continue
        cpus = parse_cpulist(inst["cpus"])
        assert cpus, "%s: empty CPU list rendered" % name
        allowed = frozenset().union(*[workers[n] for n in inst["numa_nodes"]])
        assert cpus <= allowed, "%s: CPUs %s outside the worker CPUs of its nodes" % (name, sorted(cpus - allowed))
        assert not cpus & all_housekeeping, "%s: housekeeping CPUs handed to a worker" % name
        assert inst["numactl_args"][0] == "--physcpubind=%s" % inst["cpus"]
        if inst.get("worker_cpus") is not None:
            gpu_node = dict((g["index"], g.get("numa_node")) for g in topology["gpus"])
            taken = set()
            assert len(inst["worker_cpus"]) == len(inst["gpus"])
            for gpu, text in zip(inst["gpus"], inst["worker_cpus"]):
                share = parse_cpulist(text)
                assert share and share <= cpus, "%s: worker share of GPU %d outside the instance" % (name, gpu)
                assert share <= workers[gpu_node[gpu]], "%s: worker share of GPU %d off its node" % (name, gpu)
                assert not share & taken, "%s: worker shares overlap" % name
                taken |= share
        if inst["share_cpus"]:
            continue
        for cpu in cpus:
            assert cpu not in exclusive_owner, "%s and %s share CPU %d" % (exclusive_owner[cpu], name, cpu)
            exclusive_owner[cpu] = name
        # shares the planner chose itself keep hyperthread siblings together
        source = [i for i in given if i.get("name") == name]
        if source and not isinstance(source[0].get("cpus"), str):
            for node_id in inst["numa_nodes"]:
                for core in _cores_of(nodes[node_id]):
                    core = core & workers[node_id]
                    assert not (core & cpus) or core <= cpus, "%s: sibling group %s split" % (name, sorted(core))
    # Ranks an engine binds node by node (--membind each): never without declared memory, and the memory each node
    # must hold counts every instance once (as bound there, or as its ranks' shares) within what it holds.
    capacity = plan.get("memory_capacity") or {}
    held = {}
    for inst in plan["instances"]:
        ranks = any(a in ("--numa-bind", "--numa-node") for a in inst.get("engine_args") or [])
        if ranks:
            assert inst.get("memory_bytes"), "%s: ranks bound node by node without declared memory" % inst["name"]
            gpu_node = dict((g["index"], g.get("numa_node")) for g in topology["gpus"])
            rank_nodes = [gpu_node[g] for g in inst["gpus"]]
            for node_id in set(rank_nodes):
                held[node_id] = held.get(node_id, 0) + inst["memory_bytes"] // len(rank_nodes) * rank_nodes.count(node_id)
        elif inst["mem_policy"] == "bind" and inst.get("memory_bytes") and len(inst["mem_nodes"]) == 1:
            held[inst["mem_nodes"][0]] = held.get(inst["mem_nodes"][0], 0) + inst["memory_bytes"]
    for node_id, need in held.items():
        room = capacity.get(str(node_id))
        assert not isinstance(room, int) or need <= room, "node %s: %d bytes bound, %d held for instances" % (
            node_id, need, room)
    warnings = plan["warnings"]
    assert isinstance(warnings, list) and all(isinstance(w, str) for w in warnings)


def check_deterministic(plan, topology, profile, instances, **options):
    """The same input (copied) gives a byte-identical plan."""
    again = build_plan(copy.deepcopy(topology), copy.deepcopy(profile), copy.deepcopy(instances), **options)
    assert json.dumps(again, sort_keys=False) == json.dumps(plan, sort_keys=False)
