"""Property-based tests of the planner (Hypothesis).

Any instance list, built from valid values and hostile ones (wrong types,
trailing newlines, absurd sizes and CPU counts, overlapping CPU lists), on
any topology of ``tests/fixtures/topologies/``, under any profile and
options, gives either

* a plan whose invariants hold (``plan_invariants.check_plan``: disjoint
  CPU shares within their nodes, housekeeping untouched, CPU-less nodes
  never bound, every CPU of an instance on its nodes, siblings whole) and
  that is byte-identical when computed again, or
* a ``PlanError`` listing every problem,

never another exception and never a hang (each example runs under an alarm
and a Hypothesis deadline). The ``ci`` profile (tests/conftest.py) keeps
runs repeatable; ``HYPOTHESIS_PROFILE=deep`` explores longer.
"""

import copy
import json
import os

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ansible.module_utils.gpunuma.plan.profiles import load_profile
from conftest import examples, FIXTURES, REPO_ROOT
from plan_invariants import check_deterministic, check_plan, plan_or_error

pytestmark = pytest.mark.unit

TOPOLOGY_DIR = os.path.join(FIXTURES, "topologies")
TOPOLOGIES = {}
for _name in sorted(os.listdir(TOPOLOGY_DIR)):
    if _name.endswith(".json"):
        with open(os.path.join(TOPOLOGY_DIR, _name)) as _handle:
            TOPOLOGIES[_name[: -len(".json")]] = json.load(_handle)
PROFILES = {
    name: load_profile(name, os.path.join(REPO_ROOT, "policies", "profiles"))
    for name in ("strict", "preferred", "interleave", "off")
}

SETTINGS = settings(
    max_examples=examples(150),
    deadline=2000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

HOSTILE_TEXT = st.sampled_from(
    ["", " ", "\n", "a\n", "x\x00y", "-x", ".x", "a b", "é", "\u212a", "0" * 70, "$HOME", "%n", "a" * 65, "GPU-\n"]
)
NAMES = st.one_of(
    st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,8}", fullmatch=True),
    HOSTILE_TEXT,
    st.integers(-2, 3),
    st.none(),
    st.lists(st.just("a"), max_size=2),
)
SIZES = st.one_of(
    st.integers(-1, 1 << 66),
    st.builds(
        lambda n, frac, unit, i, b: "%d%s%s%s%s" % (n, frac, unit, i, b),
        st.integers(0, 10**12),
        st.sampled_from(["", ".5", ".25", ".0"]),
        st.sampled_from(["", "K", "M", "G", "T", "P", "E", "k", "g", "Q"]),
        st.sampled_from(["", "i"]),
        st.sampled_from(["", "B", "b"]),
    ),
    HOSTILE_TEXT,
    st.sampled_from(["1.5", "99999999999E", "0", "0G", "1" * 300, "unlimited", "infinity", " 64G ", "64G\n"]),
    st.booleans(),
    st.floats(allow_nan=True),
    st.none(),
)
CPU_LISTS = st.one_of(
    st.builds(lambda a, n: "%d-%d" % (a, a + n), st.integers(0, 200), st.integers(0, 40)),
    st.builds(lambda a: str(a), st.integers(0, 200)),
    st.sampled_from(["0-1048575", "0-8191", "5-2", "x", "", "1,,2", "1-3:2", "0-3\n"]),
)
CPUS = st.one_of(st.integers(-1, 300), st.just(1048575), CPU_LISTS, st.floats(0, 4), st.booleans())
GPUS = st.one_of(
    st.lists(st.integers(-1, 9), max_size=4),
    st.lists(st.sampled_from(["0", None, 1.0, True]), max_size=2),
    st.just("0"),
    st.just({}),
)
COMMANDS = st.one_of(
    st.just(["/usr/bin/vllm", "serve"]),
    st.lists(st.one_of(st.text(max_size=6), st.integers(0, 9)), max_size=3),
    st.sampled_from(["vllm serve", ["-/bin/x"], ["/bin/\"x\""], ["/bin/x\n"], ["@x"], None]),
)
ENVIRONMENT = st.one_of(
    st.dictionaries(st.one_of(st.from_regex(r"[A-Z_][A-Z0-9_]{0,5}", fullmatch=True), HOSTILE_TEXT),
                    st.one_of(st.text(max_size=5), st.integers(0, 3)), max_size=3),
    st.just({"CUDA_VISIBLE_DEVICES": "0"}),
    st.just(["A=1"]),
)
HOSTILE = {
    "memory": SIZES,
    "memlock": SIZES,
    "cpus": CPUS,
    "share_cpus": st.one_of(st.just("yes"), st.none()),
    "environment": ENVIRONMENT,
    "user": NAMES,
    "group": NAMES,
    "unit": st.sampled_from(["vllm", "vllm.service\n", "a b.service", 5]),
    "binding_method": st.sampled_from(["taskset", None, 1]),
    "gpu": st.just(1),
    "engine": st.sampled_from(["tgi", None, 1, "VLLM"]),
    "nic_environment": st.sampled_from(["UCX_NET_DEVICES", ["X"], [1], None]),
    "engine_version": st.sampled_from([0.3, "latest", "", None, "1.2.3.4.5"]),
}
VALID = {
    "memory": st.one_of(st.builds("{}G".format, st.integers(1, 600)), st.integers(1, 1 << 40),
                        st.sampled_from(["1.5G", "64GiB", "512M"])),
    "memlock": st.sampled_from(["infinity", "unlimited", "64G", 1 << 30]),
    "cpus": st.one_of(st.integers(1, 24), CPU_LISTS),
    "share_cpus": st.booleans(),
    "environment": st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,5}", fullmatch=True), st.text(max_size=5),
                                   max_size=2),
    "user": st.just("vllm"),
    "group": st.just("vllm"),
    "unit": st.sampled_from(["vllm.service", "w@1.service"]),
    "binding_method": st.sampled_from(["numactl", "systemd"]),
    "engine": st.sampled_from(["generic", "vllm", "sglang"]),
    "engine_version": st.sampled_from(["0.20.0", "0.23.0"]),
    "nic_environment": st.sampled_from([["UCX_NET_DEVICES"], ["NCCL_IB_HCA", "UCX_NET_DEVICES"]]),
}


@st.composite
def instances(draw, topology, hostile):
    cpu_nodes = [n["id"] for n in topology["numa_nodes"] if n.get("cpus")]
    all_nodes = [n["id"] for n in topology["numa_nodes"]]
    gpu_count = len(topology["gpus"])
    def maybe_hostile(valid, bad):
        return draw(bad) if hostile and draw(st.integers(0, 2)) == 0 else draw(valid)

    out = []
    if gpu_count and draw(st.integers(0, 3)) == 0:
        # one instance per GPU, the most common inventory
        return [{"name": "g%d" % g, "gpus": [g], "command": ["/usr/bin/vllm"]} for g in range(gpu_count)]
    for pos in range(draw(st.integers(0, 6))):
        item = {"name": maybe_hostile(st.just("i%d" % pos), NAMES)}
        placement = draw(st.sampled_from(["gpus", "gpus", "gpus_per_instance", "numa_node"] + ["two"] * hostile))
        if placement in ("gpus", "two"):
            item["gpus"] = maybe_hostile(
                st.lists(st.integers(0, gpu_count - 1), min_size=1, max_size=3, unique=True) if gpu_count
                else st.just([0]),
                GPUS,
            )
        if placement in ("gpus_per_instance", "two"):
            item["gpus_per_instance"] = maybe_hostile(
                st.integers(1, max(gpu_count, 1)), st.one_of(st.integers(-1, gpu_count + 2), st.just(True))
            )
        if placement == "numa_node":
            item["numa_node"] = maybe_hostile(
                st.sampled_from(cpu_nodes), st.one_of(st.sampled_from(all_nodes[:3]), st.integers(-1, 40), st.just("0"))
            )
        item["command"] = maybe_hostile(st.just(["/usr/bin/vllm", "serve"]), COMMANDS)
        for key in sorted(VALID):
            if draw(st.integers(0, 5)) == 0:
                item[key] = maybe_hostile(VALID[key], HOSTILE[key])
        if item.get("unit") is not None and draw(st.booleans()):
            del item["command"]
        if hostile and draw(st.integers(0, 9)) == 0:
            item["gpu"] = 1
        out.append(item)
    if hostile and draw(st.integers(0, 9)) == 0:
        out.append(draw(st.one_of(st.just("a"), st.none(), st.integers())))
    return out


@st.composite
def topologies(draw):
    """A fixture topology, sometimes damaged the way real inputs are."""
    topology = TOPOLOGIES[draw(st.sampled_from(sorted(TOPOLOGIES)))]
    damage = draw(st.sampled_from(["none"] * 12 + ["overlap", "overlap", "partial-overlap", "no-cores", "low-memory", "gpu-node", "l3", "l3", "memoryless", "memoryless"]))
    event("topology damage: %s" % damage)
    if damage == "none":
        return topology
    topology = copy.deepcopy(topology)
    gpu_nodes = set(g.get("numa_node") for g in topology["gpus"])
    nodes = [n for n in topology["numa_nodes"] if n.get("cpus")]
    # nodes with GPUs first: overlapping them is what hands one CPU to two workers
    nodes = [n for n in nodes if n["id"] in gpu_nodes] + [n for n in nodes if n["id"] not in gpu_nodes]
    if damage in ("overlap", "partial-overlap") and len(nodes) > 1:
        first, second = draw(st.permutations(nodes[:3] if len(nodes) > 2 else nodes))[:2]
        if damage == "overlap":
            second["cpus"], second["cores"] = first["cpus"], list(first.get("cores") or [])
        else:
            second["cpus"] = second["cpus"] + "," + first["cpus"].split(",")[0]
    elif damage == "no-cores":
        for node in nodes:
            node.pop("cores", None)
    elif damage == "l3":
        # L3 groups of a few whole cores each (CCX-like), as sysfs cache/index3 reports them
        width = draw(st.integers(1, 8))
        for node in nodes:
            cores = list(node.get("cores") or [])
            node["l3_groups"] = [",".join(cores[k:k + width]) for k in range(0, len(cores), width)]
    elif damage == "low-memory":
        for node in topology["numa_nodes"]:
            node["memory_free_bytes"] = draw(st.sampled_from([0, 1 << 20, None]))
    elif damage == "memoryless":
        # A CPU node with no memory (empty DIMM channels, some NPS/CXL layouts), sometimes one holding GPUs.
        node = draw(st.sampled_from(nodes))
        node["memory_total_bytes"] = node["memory_free_bytes"] = 0
    elif damage == "gpu-node" and topology["gpus"]:
        gpu = draw(st.sampled_from(topology["gpus"]))
        gpu["numa_node"] = draw(st.sampled_from([None, 2, 99, -1]))
    return topology


@st.composite
def cases(draw):
    topology = draw(topologies())
    # A quarter of the cases carry hostile values; the rest are well-formed
    # (though they may still not fit), so that many examples reach the
    # allocator and give a plan whose invariants are checked.
    hostile = draw(st.integers(0, 3)) == 0
    event("hostile values: %s" % hostile)
    housekeeping = st.one_of(st.just("auto"), st.integers(0, 3))
    capacity = st.sampled_from(["fallback", "error"])
    if hostile:
        housekeeping = st.one_of(housekeeping, st.just(-1), st.just(64), st.just("1"))
        capacity = st.sampled_from(["fallback", "error", "sometimes", None])
    return {
        "topology": topology,
        "profile": PROFILES[draw(st.sampled_from(sorted(PROFILES)))],
        "instances": draw(instances(topology, hostile)),
        "options": {
            "housekeeping_cores_per_node": draw(housekeeping),
            "strict_capacity": draw(capacity),
            "allow_unknown_siblings": draw(st.booleans()),
            "housekeeping_cpus": draw(st.one_of(st.none(), st.none(), CPU_LISTS) if hostile else st.none()),
            # The cgroup fence: engines get per-rank flags only with it.
            "fence": draw(st.sampled_from([True, False, None])),
        },
    }


@SETTINGS
@given(cases())
def test_any_instance_list_gives_a_sound_plan_or_a_plan_error(case):
    topology, profile, items, options = case["topology"], case["profile"], case["instances"], case["options"]
    snapshot = copy.deepcopy((topology, profile, items))
    outcome, result = plan_or_error(topology, profile, items, **options)
    assert (topology, profile, items) == snapshot, "the planner changed its input"
    event("outcome: %s" % outcome)
    if outcome == "plan":
        check_plan(result, topology, items)
        check_deterministic(result, topology, profile, items, **options)


@SETTINGS
@given(cases(), st.data())
def test_any_applied_plan_gives_a_plan_or_a_plan_error(case, data):
    topology = case["topology"]
    applied = data.draw(
        st.one_of(
            st.none(),
            st.text(max_size=5),
            st.lists(st.integers(), max_size=2),
            st.fixed_dictionaries(
                {
                    "schema": st.sampled_from(["gpunuma.plan/v1", "gpunuma.plan/v0", None, 1]),
                    "topology_fingerprint": st.sampled_from([topology.get("fingerprint"), "x", None, 5]),
                    "instances": st.one_of(
                        st.lists(
                            st.one_of(
                                st.fixed_dictionaries(
                                    {
                                        "name": st.one_of(st.sampled_from(["i0", "i1", "i2"]), NAMES),
                                        "mem_nodes": st.one_of(
                                            st.lists(st.integers(-1, 40), max_size=2),
                                            st.integers(),
                                            st.just([[0]]),
                                            st.just(["0"]),
                                        ),
                                        "memory_bytes": st.one_of(st.none(), st.integers(-1, 1 << 70), st.just("6G")),
                                        "mem_policy": st.sampled_from(["bind", "preferred", None, 3]),
                                    }
                                ),
                                st.integers(),
                                st.text(max_size=2),
                            ),
                            max_size=3,
                        ),
                        st.integers(),
                        st.text(max_size=3),
                        st.none(),
                    ),
                }
            ),
        )
    )
    outcome, result = plan_or_error(topology, case["profile"], case["instances"], applied_plan=applied,
                                    **case["options"])
    if outcome == "plan":
        check_plan(result, topology, case["instances"])


@st.composite
def engine_cases(draw):
    """Tensor-parallel instances of engines that bind their ranks node by node, with or without declared memory,
    beside instances bound to a node: where capacity is counted and unsized binds are made."""
    name = draw(st.sampled_from(sorted(n for n, t in TOPOLOGIES.items() if len(t["gpus"]) >= 2)))
    topology = copy.deepcopy(TOPOLOGIES[name])
    gpus = [g["index"] for g in topology["gpus"]]
    cpu_nodes = [n["id"] for n in topology["numa_nodes"] if n.get("cpus")]
    items = []
    for pos in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["vllm", "sglang", "bound"]))
        memory = draw(st.one_of(st.none(), st.builds("{}G".format, st.integers(1, 1500))))
        if kind == "bound":
            item = {"name": "b%d" % pos, "numa_node": draw(st.sampled_from(cpu_nodes)), "command": ["/bin/x"]}
        else:
            item = {"name": "e%d" % pos, "engine": kind, "engine_version": "0.23.0", "command": ["/usr/bin/vllm"],
                    "gpus": draw(st.lists(st.sampled_from(gpus), min_size=2, max_size=min(8, len(gpus)), unique=True))}
        if memory is not None:
            item["memory"] = memory
        items.append(item)
    return {"topology": topology, "profile": PROFILES[draw(st.sampled_from(["strict", "preferred", "interleave"]))],
            "instances": items,
            "options": {"strict_capacity": draw(st.sampled_from(["fallback", "error"])), "fence": True,
                        "housekeeping_cores_per_node": 1}}


@SETTINGS
@given(engine_cases())
def test_ranks_bound_node_by_node_are_sized_and_counted_once(case):
    outcome, result = plan_or_error(case["topology"], case["profile"], case["instances"], **case["options"])
    event("outcome: %s" % outcome)
    if outcome == "plan":
        event("ranks bound: %s" % any(i["engine_args"] for i in result["instances"]))
        check_plan(result, case["topology"], case["instances"])
