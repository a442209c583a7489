"""Plans from a topo text (with or without lscpu) and from sysfs of one machine model.

``tests/machine_model.py`` writes a sysfs tree, the ``nvidia-smi topo -m``
text and ``lscpu -p`` of one machine. The text lists only the NUMA nodes of
its GPUs (as on a DGX A100 in NPS4); gpunuma must infer the others or
refuse, never plan housekeeping and workers as if they did not exist.
"""

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible.module_utils.gpunuma.common.cpulist import parse_cpulist
from ansible.module_utils.gpunuma.discovery import cpu_layout
from ansible.module_utils.gpunuma.common import errors
from ansible.module_utils.gpunuma.discovery.discover import discover
from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.plan.model import PlanError
from ansible.module_utils.gpunuma.plan.planner import build_plan
from conftest import FIXTURES, examples
from machine_model import Machine
from test_plan import profile

pytestmark = pytest.mark.unit

# What a plan decides; memory sizes, distances and the topology's fingerprint are not in a topo text.
DECIDED = ("housekeeping", "worker_cpus", "instances", "profile", "options")


@st.composite
def machines(draw):
    cores = draw(st.sampled_from([4, 6, 8, 12, 16]))
    l3 = draw(st.sampled_from([d for d in (2, 3, 4, 6, 8, 12, 16) if cores % d == 0]))
    sockets = draw(st.integers(1, 2))
    per_socket = draw(st.sampled_from([1, 2, 4]))
    nodes = sockets * per_socket
    gpus = draw(st.lists(st.integers(0, nodes - 1), min_size=1, max_size=8))
    return Machine(sockets, per_socket, cores, draw(st.sampled_from([1, 2])), l3, gpus)


def _captures(machine, tmp, with_l3):
    root = os.path.join(tmp, "root")
    machine.sysfs(root, with_l3=with_l3)
    topo = os.path.join(tmp, "topo.txt")
    lscpu = os.path.join(tmp, "lscpu.txt")
    with open(topo, "w") as handle:
        handle.write(machine.topo_text())
    with open(lscpu, "w") as handle:
        handle.write(machine.lscpu_parse())
    return root, topo, lscpu


def _instances(machine):
    return [{"name": "w%d" % i, "gpus": [i], "command": ["/usr/bin/serve"]} for i in range(len(machine.gpu_nodes))]


def _plan(topology, instances):
    try:
        return build_plan(topology, profile("strict"), instances)
    except PlanError as exc:
        return exc


def _decided(plan):
    return dict((key, plan[key]) for key in DECIDED)


@settings(max_examples=examples(40), deadline=None)
@given(machine=machines())
def test_text_with_lscpu_plans_what_sysfs_plans_l3_included(tmp_path_factory, machine):
    root, topo, lscpu = _captures(machine, str(tmp_path_factory.mktemp("m")), with_l3=True)
    from_sysfs = discover("m", sysfs_root=root, sources=["sysfs"])["topology"]
    from_text = discover("m", topo_file=topo, lscpu_file=lscpu)["topology"]
    assert [n["cpus"] for n in from_text["numa_nodes"]] == [n["cpus"] for n in from_sysfs["numa_nodes"]]
    assert [n.get("l3_groups") for n in from_text["numa_nodes"]] == [n.get("l3_groups") for n in from_sysfs["numa_nodes"]]
    assert from_text["sockets"] == machine.sockets
    # No memory declared: a text has no node sizes, so a declared size would bind from sysfs
    # and prefer from text (docs/plan-v1.md); the CPU layout is what the captures share.
    instances = _instances(machine)
    a, b = _plan(from_sysfs, instances), _plan(from_text, instances)
    if isinstance(a, PlanError):  # e.g. more GPUs on a node than it has worker cores
        assert isinstance(b, PlanError) and str(b) == str(a)
        return
    assert _decided(b) == _decided(a)


@settings(max_examples=examples(40), deadline=None)
@given(machine=machines())
def test_text_alone_plans_what_sysfs_plans_or_refuses_naming_why(tmp_path_factory, machine):
    root, topo, _ = _captures(machine, str(tmp_path_factory.mktemp("m")), with_l3=False)
    from_sysfs = discover("m", sysfs_root=root, sources=["sysfs"])["topology"]
    from_text = discover("m", topo_file=topo)["topology"]
    instances = _instances(machine)
    a, b = _plan(from_sysfs, instances), _plan(from_text, instances)
    if machine.smt == 2 and machine.node_count > 1:
        # The standard x86 two-range layout proves every node and every sibling pair: nothing is refused.
        # (One node of SMT CPUs prints as one range, 0-7, which says nothing about siblings.)
        assert [n["cpus"] for n in from_text["numa_nodes"]] == [n["cpus"] for n in from_sysfs["numa_nodes"]]
        if isinstance(a, PlanError):
            assert isinstance(b, PlanError) and str(b) == str(a)
            return
        assert not isinstance(b, PlanError), b
    if isinstance(b, PlanError):
        why = str(b)
        assert isinstance(a, PlanError) or "hyperthread siblings" in why or "topology.unplaced_cpus" in why, why
        return
    assert not isinstance(a, PlanError), a
    assert _decided(b) == _decided(a)


def _known(layout):
    return dict((node, parse_cpulist(cpus)) for node, cpus in layout.items())


def test_dgx_a100_nps4_text_gets_its_four_gpu_less_nodes():
    result = discover("dgx", topo_file=os.path.join(FIXTURES, "published", "dgxa100-epyc7742-nps4-10nic.topo.txt"))
    topology = result["topology"]
    nodes = dict((n["id"], n) for n in topology["numa_nodes"])
    assert sorted(nodes) == list(range(8))
    for node_id in range(8):
        first = 16 * node_id
        assert nodes[node_id]["cpus"] == "%d-%d,%d-%d" % (first, first + 15, first + 128, first + 143)
        assert bool(nodes[node_id].get("inferred")) == (node_id % 2 == 0)
    assert "unplaced_cpus" not in topology
    assert any("NUMA nodes 0, 2, 4, 6 are not in the nvidia-smi topo text" in w for w in topology["warnings"])
    plan = build_plan(topology, profile("strict"), [{"name": "w%d" % i, "gpus": [i], "command": ["/x"]}
                                                     for i in range(8)])
    # housekeeping on the GPU-less nodes only, as from sysfs; every GPU node's 16 cores go to its two workers
    assert sorted(int(n) for n, cpus in plan["housekeeping"].items() if cpus) == [0, 2, 4, 6]
    by_name = dict((i["name"], i) for i in plan["instances"])
    assert by_name["w0"]["cpus"] == "48-55,176-183" and by_name["w1"]["cpus"] == "56-63,184-191"


@pytest.mark.parametrize("layout, inferred", [
    # GPUs on the first node only: the nodes after it, whole blocks of its size
    ({0: "0-7,32-39"}, [(1, "8-15,40-47"), (2, "16-23,48-55"), (3, "24-31,56-63")]),
    # a gap before the first listed node
    ({2: "16-23,48-55", 3: "24-31,56-63"}, [(0, "0-7,32-39"), (1, "8-15,40-47")]),
    # nothing missing
    ({0: "0-7,16-23", 1: "8-15,24-31"}, []),
])
def test_missing_nodes_inferred(layout, inferred):
    found, unplaced = cpu_layout.infer_missing_nodes(_known(layout))
    assert [(n, c) for n, c in found] == [(n, parse_cpulist(c)) for n, c in inferred]
    assert not unplaced


@pytest.mark.parametrize("layout, unplaced", [
    # the gap holds two blocks but one node id is missing there
    ({0: "0-7,32-39", 2: "24-31,56-63"}, "8-23,40-55"),
    # node ids fall as CPU ids rise
    ({3: "0-7,32-39", 1: "16-23,48-55"}, "8-15,24-31,40-47,56-63"),
    # listed nodes of different sizes
    ({1: "8-15,40-47", 3: "24-27,56-59"}, "0-7,16-23,28-31,32-39,48-55,60-63"),
    # no SMT: CPUs below the highest listed one are missing, and a gap of 8 is not a whole 6-CPU node
    ({1: "6-11", 3: "20-25"}, "0-5,12-19"),
])
def test_missing_nodes_not_inferable_are_unplaced(layout, unplaced):
    found, left = cpu_layout.infer_missing_nodes(_known(layout))
    assert found == []
    assert left == parse_cpulist(unplaced)


def test_unplaced_cpus_refuse_cpu_binding_naming_them(tmp_path):
    text = Machine(2, 2, 8, 2, 8, [0, 2]).topo_text().replace("\t0\n", "\t1\n", 1)
    # GPU0's NUMA Affinity says node 1 although its CPUs are the first block: ids no longer rise with CPUs
    path = tmp_path / "topo.txt"
    path.write_text(text)
    topology = discover("odd", topo_file=str(path))["topology"]
    assert topology["unplaced_cpus"]
    with pytest.raises(PlanError) as caught:
        build_plan(topology, profile("strict"), [{"name": "a", "gpus": [0], "command": ["/x"]}])
    message = str(caught.value)
    assert "topology.unplaced_cpus: CPUs %s" % topology["unplaced_cpus"] in message
    assert "gpu_topology_lscpu_file" in message


LSCPU_E = """\
CPU NODE SOCKET CORE L1d:L1i:L2:L3 ONLINE    MAXMHZ   MINMHZ
  0    0      0    0 0:0:0:0          yes 3400.0000 800.0000
  1    0      0    1 1:1:1:0          yes 3400.0000 800.0000
  2    1      1    2 2:2:2:1          yes 3400.0000 800.0000
  3    1      1    3 3:3:3:1          yes 3400.0000 800.0000
  4    0      0    0 0:0:0:0          yes 3400.0000 800.0000
  5    0      0    1 1:1:1:0          yes 3400.0000 800.0000
  6    1      1    2 2:2:2:1          yes 3400.0000 800.0000
  7    -      -    - :::               no 3400.0000 800.0000
"""

LSCPU_P_DEFAULT = """\
# The following is the parsable format, which can be fed to other
# programs. Each different item in every column has an unique ID
# starting from zero.
# CPU,Core,Socket,Node,,L1d,L1i,L2,L3
0,0,0,0,,0,0,0,0
1,1,0,0,,1,1,1,0
2,0,0,0,,0,0,0,0
3,1,0,0,,1,1,1,0
"""


def test_lscpu_extended_format():
    layout = cpu_layout.parse_lscpu(LSCPU_E)
    assert layout["format"] == "extended"
    assert layout["numa_nodes"] == [{"id": 0, "cpus": "0-1,4-5"}, {"id": 1, "cpus": "2-3,6"}]
    by_id = dict((c["id"], c) for c in layout["cpus"])
    assert by_id[0]["siblings"] == "0,4" and by_id[2]["l3"] == "2-3,6"
    assert layout["sockets"] == 2


def test_lscpu_default_parse_format():
    layout = cpu_layout.parse_lscpu(LSCPU_P_DEFAULT)
    assert layout["format"] == "parse"
    assert layout["numa_nodes"] == [{"id": 0, "cpus": "0-3"}]
    by_id = dict((c["id"], c) for c in layout["cpus"])
    assert by_id[1]["siblings"] == "1,3" and by_id[1]["l3"] == "0-3"


def test_lscpu_summary_of_the_dgx_a100_gives_every_node_and_no_siblings():
    with open(os.path.join(FIXTURES, "hosts", "dgxa100-epyc7742-nps4.lscpu.txt")) as handle:
        layout = cpu_layout.parse_lscpu(handle.read())
    assert layout["format"] == "summary" and layout["sockets"] == 2 and layout["cpus"] == []
    assert [n["id"] for n in layout["numa_nodes"]] == list(range(8))
    topology = discover("dgx", topo_file=os.path.join(FIXTURES, "published", "dgxa100-epyc7742-nps4-10nic.topo.txt"),
                        lscpu_file=os.path.join(FIXTURES, "hosts", "dgxa100-epyc7742-nps4.lscpu.txt"))["topology"]
    assert all(n["cores"] is None for n in topology["numa_nodes"])
    assert not any(n.get("inferred") for n in topology["numa_nodes"])


@pytest.mark.parametrize("text, words", [
    ("", "neither `lscpu -p`"),
    ("# CPU,Core,Socket,Node\n0,0,0,x\n", "line 2: node 'x'"),
    ("# CPU,Core,Socket,Node\n0,0,0\n", "line 2: 3 columns, the header names 4"),
    ("# CPU,Core,Socket,Node\n0,0,0,0\n0,1,0,0\n", "CPU 0 is listed twice"),
    ("NUMA node0 CPU(s): 0-3,x\n", "lscpu line 1"),
])
def test_lscpu_bad_text_is_refused_naming_the_line(text, words):
    with pytest.raises(errors.LscpuError) as caught:
        cpu_layout.parse_lscpu(text)
    assert words in str(caught.value)


def test_lscpu_of_another_machine_is_refused(tmp_path):
    machine = Machine(2, 1, 8, 2, 8, [0, 1])
    other = Machine(2, 1, 12, 2, 12, [0, 1])
    (tmp_path / "topo.txt").write_text(machine.topo_text())
    (tmp_path / "lscpu.txt").write_text(other.lscpu_parse())
    with pytest.raises(GpunumaError) as caught:
        discover("m", topo_file=str(tmp_path / "topo.txt"), lscpu_file=str(tmp_path / "lscpu.txt"))
    assert "GPU0's CPU Affinity 0-7,16-23 on NUMA node 0" in str(caught.value)
    assert "not of one machine" in str(caught.value)


def test_lscpu_needs_the_topo_text_alone(tmp_path):
    (tmp_path / "lscpu.txt").write_text(LSCPU_P_DEFAULT)
    with pytest.raises(GpunumaError) as caught:
        discover("m", sysfs_root=str(tmp_path), lscpu_file=str(tmp_path / "lscpu.txt"))
    assert "only read with nvidia_smi_topo_file alone" in str(caught.value)


POWER9_SUMMARY = """\
Architecture:                    ppc64le
Thread(s) per core:              4
Core(s) per socket:              20
Socket(s):                       2
NUMA node(s):                    2
NUMA node0 CPU(s):               0-79
NUMA node8 CPU(s):               80-159
"""


def test_smt4_summary_refuses_planning_each_cpu_as_a_core(tmp_path):
    """POWER9 numbers a core's four threads consecutively: 0-79 says nothing of siblings, lscpu says SMT4."""
    machine = Machine(2, 1, 80, 1, 80, [0, 1])
    text = machine.topo_text().replace("\t1\n", "\t8\n")
    (tmp_path / "topo.txt").write_text(text)
    (tmp_path / "lscpu.txt").write_text(POWER9_SUMMARY)
    topology = discover("p9", topo_file=str(tmp_path / "topo.txt"),
                        lscpu_file=str(tmp_path / "lscpu.txt"))["topology"]
    assert topology["threads_per_core"] == 4
    instances = [{"name": "w%d" % i, "gpus": [i], "command": ["/x"]} for i in range(2)]
    with pytest.raises(PlanError) as caught:
        build_plan(topology, profile("strict"), instances, allow_unknown_siblings=True)
    assert "states 4 threads per core (lscpu)" in str(caught.value)
    # without the opt-in the unknown siblings are refused as before; without lscpu the opt-in is the user's word
    with pytest.raises(PlanError) as caught:
        build_plan(topology, profile("strict"), instances)
    assert "hyperthread siblings of NUMA node" in str(caught.value)
    bare = discover("p9", topo_file=str(tmp_path / "topo.txt"))["topology"]
    assert "threads_per_core" not in bare
    assert build_plan(bare, profile("strict"), instances, allow_unknown_siblings=True)["instances"]


@settings(max_examples=examples(60), deadline=None)
@given(machine=machines())
def test_every_plan_is_local_exclusive_on_true_cores_and_l3_minimal_or_says_why(tmp_path_factory, machine):
    """The sysfs plan of a generated machine: each worker on its GPU's node, whole cores, no CPU twice (nor a
    housekeeping one), housekeeping where it is planned, and each share touching the fewest L3 domains its
    core count needs, or a warning that the node's shares cannot follow its L3 groups."""
    root, _, _ = _captures(machine, str(tmp_path_factory.mktemp("m")), with_l3=True)
    topology = discover("m", sysfs_root=root, sources=["sysfs"])["topology"]
    plan = _plan(topology, _instances(machine))
    if isinstance(plan, PlanError):
        assert "not enough whole cores" in str(plan), plan
        return
    housekeeping = set().union(*[parse_cpulist(c) for c in plan["housekeeping"].values() if c])
    # the system runs on the GPU-less nodes of each socket that has them; a GPU node whose socket has none keeps its own
    gpu_less = set(range(machine.node_count)) - set(machine.gpu_nodes)
    keeping = sorted(int(n) for n, c in plan["housekeeping"].items() if c)
    assert keeping == sorted(n for n in range(machine.node_count) if n in gpu_less or not any(
        machine.socket_of(m) == machine.socket_of(n) for m in gpu_less))
    taken = set()
    for inst, node in zip(plan["instances"], machine.gpu_nodes):
        cpus = parse_cpulist(inst["cpus"])
        assert cpus <= set(machine.node_cpus(node))  # local
        assert not cpus & housekeeping and not cpus & taken  # exclusive
        taken |= cpus
        cores = set(c % machine.core_count for c in cpus)
        assert cpus == set(t for c in cores for t in machine.threads(c))  # true cores, siblings together
        touched = set(machine.l3_of_core(c) for c in cores)
        fewest = -(-len(cores) // machine.l3_cores)
        if len(touched) > fewest:
            assert any("cannot follow its" in w and "NUMA node %d" % node in w for w in plan["warnings"]), (
                inst["name"], inst["cpus"], plan["warnings"])


def test_irq_pinning_sizes_housekeeping_for_the_vectors_it_pins(tmp_path):
    """Each x86 CPU holds about 200 device vectors: IRQ pinning onto too few housekeeping CPUs would fail."""
    from sysfs_factory import GIB_KB, MELLANOX, build_tree

    nodes = [{"id": n, "cpus": "%d-%d,%d-%d" % (16 * n, 16 * n + 15, 32 + 16 * n, 32 + 16 * n + 15),
              "mem_kb": 64 * GIB_KB, "free_kb": 60 * GIB_KB} for n in (0, 1)]
    cpus = dict((c, (c % 32 // 16, c % 32, [c % 32, c % 32 + 32])) for c in range(64))
    pci = [dict(bdf="0000:%02x:00.0" % (0x10 + i), vendor=MELLANOX, device="0x1021", numa_node=0, msi=130,
                rdma=["mlx5_%d" % i], **{"class": "0x020700"}) for i in range(4)]
    root = build_tree(str(tmp_path), nodes, distances=[[10, 20], [20, 10]], cpus=cpus, pci=pci)
    topology = discover("nics", sysfs_root=root, sources=["sysfs"])["topology"]
    assert [n["irq_vectors"] for n in topology["nics"]] == [130] * 4
    plain = build_plan(topology, profile("strict"), [])
    pinned = build_plan(topology, profile("strict"), [], irq_pin=True)
    # 520 vectors on node 0: 3 CPUs' worth, 2 cores of 2 threads, where auto keeps 1
    assert plain["housekeeping"]["0"] == "0,32" and pinned["housekeeping"]["0"] == "0-1,32-33"
    assert pinned["housekeeping"]["1"] == plain["housekeeping"]["1"]
    assert any("2 cores instead of 1, for the 520 interrupt vectors" in w for w in pinned["warnings"])
    assert pinned["options"]["irq_pin"] is True


H200_RAW = os.path.join(FIXTURES, "captured", "h200-1gpu-vm", "raw")


@pytest.mark.parametrize("name", ["lscpu_e.txt", "lscpu.txt"])
def test_recorded_lscpu_of_the_h200_vm_reads_as_its_sysfs(name):
    """Both lscpu captures of the lent H200 VM (lscpu -e and the summary, as recorded) give its sysfs layout."""
    from ansible.module_utils.gpunuma.discovery.sysfs import host as sysfs

    with open(os.path.join(H200_RAW, name)) as handle:
        layout = cpu_layout.parse_lscpu(handle.read())
    host = sysfs.read_host(os.path.join(FIXTURES, "captured", "h200-1gpu-vm", "sysfs"))
    assert [(n["id"], n["cpus"]) for n in layout["numa_nodes"]] == [(n["id"], n["cpus"]) for n in host["numa_nodes"]]
    assert layout["sockets"] == 1
    if layout["format"] == "extended":
        assert [(c["id"], c["siblings"]) for c in layout["cpus"]] == [(c["id"], c["siblings"]) for c in host["cpus"]]
    else:
        assert layout["threads_per_core"] == 1
