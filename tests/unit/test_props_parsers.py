"""Property-based tests of the parsers and the topology builder (Hypothesis).

Whatever text or data they are given, the CPU list, node list, hex mask and
NVML affinity word parsers, the ``nvidia-smi topo -m`` parser and the
topology builder either return a result whose invariants hold or raise
:class:`GpunumaError` - never another exception, never a hang:

* CPU sets hold ids within the Linux limits and their canonical spelling
  round-trips;
* a parsed matrix keeps every GPU row, ordered by index; the GPU link matrix
  is square with X on the diagonal, and symmetric unless a warning says
  which cells disagree; the GPU x NIC matrix has one row per GPU and one
  column per NIC; every affinity is canonical;
* a built topology has disjoint NUMA nodes and keeps every GPU of the text.

Inputs are arbitrary text and data, and mutations (cut, repeat, glue,
replace, insert) of the published and captured outputs under
``tests/fixtures/published`` and ``tests/fixtures/topo``. Each example runs
under a hard time bound (SIGALRM) besides Hypothesis' deadline; the whole
file stays well under 30 s.
"""

import os
import signal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import examples, FIXTURES
from ansible.module_utils.gpunuma.common import cpulist
from ansible.module_utils.gpunuma.discovery import topology
from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.discovery.nvidia.topo_parse import parse_topo_matrix

pytestmark = pytest.mark.unit

HARD_LIMIT_S = 5
PROPS = settings(
    deadline=3000,
    max_examples=examples(150),
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FEW = settings(PROPS, max_examples=examples(60))

LINK_CODE_CHARS = "XNVSYOCDEPIHB"


class Overran(Exception):
    pass


def _alarm(signum, frame):
    raise Overran("ran past %d s" % HARD_LIMIT_S)


def bounded(call, *args):
    """The call's result, or the GpunumaError it raised; anything else fails the test."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, HARD_LIMIT_S)
    try:
        return call(*args)
    except GpunumaError as exc:
        return exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _published_texts():
    texts = []
    for folder in ("published", "topo"):
        base = os.path.join(FIXTURES, folder)
        for name in sorted(os.listdir(base)):
            if name.endswith(".topo.txt"):
                with open(os.path.join(base, name), "rb") as handle:
                    texts.append(handle.read().decode("utf-8"))
    return texts


PUBLISHED = _published_texts()


# --------------------------------------------------------------------------
# CPU lists, node lists, masks, affinity words

cpu_ids = st.integers(min_value=0, max_value=cpulist.MAX_CPUS - 1)
cpu_sets = st.frozensets(cpu_ids, max_size=200) | st.builds(
    lambda start, length, step: frozenset(range(start, min(start + length, cpulist.MAX_CPUS), step)),
    cpu_ids, st.integers(1, cpulist.MAX_CPUS), st.integers(1, 4))
list_like = st.text(alphabet="0123456789,-: \n\t", max_size=60)
mask_like = st.text(alphabet="0123456789abcdefABCDEFx, \n", max_size=80)


def check_cpus(result, limit=cpulist.MAX_CPUS):
    if isinstance(result, GpunumaError):
        return
    assert isinstance(result, frozenset)
    assert all(isinstance(c, int) and 0 <= c < limit for c in result)
    text = cpulist.format_cpulist(result)
    assert cpulist.parse_cpulist(text) == result
    assert cpulist.canonical_cpulist(text) == text


@PROPS
@given(st.text(max_size=80) | list_like)
def test_parse_cpulist_any_text(text):
    check_cpus(bounded(cpulist.parse_cpulist, text, "cpus"))


@PROPS
@given(st.text(max_size=80) | list_like)
def test_parse_nodelist_any_text(text):
    check_cpus(bounded(cpulist.parse_nodelist, text, "nodes"), cpulist.MAX_NUMA_NODES)


@PROPS
@given(st.text(max_size=80) | mask_like)
def test_parse_cpumask_any_text(text):
    check_cpus(bounded(cpulist.parse_cpumask, text, "mask"))


@PROPS
@given(st.one_of(st.none(), st.integers(), st.text(max_size=5), st.lists(
    st.one_of(st.integers(min_value=-(1 << 70), max_value=1 << 70), st.text(max_size=3), st.none(), st.floats(),
              st.booleans()), max_size=140)),
       st.one_of(st.sampled_from([32, 64]), st.integers(-100, 200), st.booleans(), st.none(), st.text(max_size=2)))
def test_affinity_words_any_data(words, word_bits):
    check_cpus(bounded(cpulist.cpus_from_affinity_words, words, word_bits))


def kernel_mask(cpus, nbits):
    """What the kernel's %*pb prints for ``cpus`` over ``nbits`` bits (lib/vsprintf.c bitmap_string)."""
    value = sum(1 << c for c in cpus)
    words = []
    for start in range(0, nbits, 32):
        width = min(32, nbits - start)
        words.append((value >> start) & ((1 << width) - 1))
    chunks = ["%08x" % w for w in reversed(words)]
    first = nbits % 32 or 32
    chunks[0] = "%0*x" % ((first + 3) // 4, words[-1])
    return ",".join(chunks)


@PROPS
@given(cpu_sets, st.integers(0, 64))
def test_canonical_list_and_mask_round_trip(cpus, spare):
    text = cpulist.format_cpulist(cpus)
    assert cpulist.parse_cpulist(text) == cpus
    nbits = min(cpulist.MAX_CPUS, (max(cpus) + 1 if cpus else 1) + spare)
    assert cpulist.parse_cpumask(kernel_mask(cpus, nbits)) == cpus


# --------------------------------------------------------------------------
# nvidia-smi topo -m text


def check_matrix(result):
    if isinstance(result, GpunumaError):
        return
    gpus, links, nic_links, nics = result["gpus"], result["gpu_links"], result["gpu_nic_links"], result["nics"]
    indexes = [g["index"] for g in gpus]
    assert indexes == sorted(set(indexes))
    assert len(links) == len(gpus) and all(len(row) == len(gpus) for row in links)
    assert len(nic_links) == len(gpus) and all(len(row) == len(nics) for row in nic_links)
    asymmetric = any(w.startswith("link ") and " in row " in w for w in result["warnings"])
    for i, row in enumerate(links):
        assert row[i] == "X"
        for j, code in enumerate(row):
            assert code == "X" if i == j else code in ("SYS", "NODE", "PHB", "PXB", "PIX") or code.startswith("NV")
            if not asymmetric:
                assert code == links[j][i]
    for gpu in gpus:
        if gpu["cpu_affinity"] is not None:
            assert cpulist.canonical_cpulist(gpu["cpu_affinity"]) == gpu["cpu_affinity"] != ""
        assert gpu["numa_affinity"] == sorted(set(gpu["numa_affinity"]))
        assert all(0 <= n < cpulist.MAX_NUMA_NODES for n in gpu["numa_affinity"])
        assert gpu["gpu_numa_id"] is None or 0 <= gpu["gpu_numa_id"] < cpulist.MAX_NUMA_NODES
    assert all(isinstance(w, str) and len(w) < 5000 for w in result["warnings"])


def check_topology(smi):
    """The builder on a parse: disjoint nodes and every GPU kept, or a GpunumaError."""
    if isinstance(smi, GpunumaError):
        return
    topo = bounded(lambda: topology.build_topology("prop", smi=smi, sources=["nvidia_smi"]))
    if isinstance(topo, GpunumaError):
        return
    assert [g["index"] for g in topo["gpus"]] == [g["index"] for g in smi["gpus"]]
    seen = set()
    ids = [n["id"] for n in topo["numa_nodes"]]
    assert ids == sorted(set(ids))
    for node in topo["numa_nodes"]:
        cpus = cpulist.parse_cpulist(node["cpus"])
        assert not cpus & seen
        seen |= cpus
    for gpu in topo["gpus"]:
        assert gpu["numa_node"] is None or gpu["numa_node"] in ids


cells = st.sampled_from(["X", " X ", "SYS", "NODE", "PHB", "PXB", "PIX", "NV12", "NV1", "SOC", "N/A", "0-7", "8-15",
                         "0", "1", "0-1", "", "OK", "GPU0", "GPU1", "NIC0", "mlx5_0", "CPU Affinity",
                         "NUMA Affinity", "GPU NUMA ID", "Legend:", "NIC0: mlx5_0", "\x1b[4m", "\x00"])
separators = st.sampled_from(["\t", " ", "  ", "\t\t", ""])
matrix_like = st.lists(st.lists(st.tuples(cells, separators), max_size=12), max_size=10).map(
    lambda rows: "\n".join("".join(c + s for c, s in row) for row in rows))


@PROPS
@given(st.text(max_size=300) | matrix_like)
def test_topo_parser_any_text(text):
    result = bounded(parse_topo_matrix, text, "prop")
    check_matrix(result)
    check_topology(result)


@st.composite
def mutated_published(draw):
    text = draw(st.sampled_from(PUBLISHED))
    for _ in range(draw(st.integers(1, 4))):
        if not text:
            break
        kind = draw(st.sampled_from(["cut", "repeat", "glue", "replace", "insert", "swap_lines", "truncate"]))
        a = draw(st.integers(0, len(text) - 1))
        b = min(len(text), a + draw(st.integers(1, 40)))
        if kind == "cut":
            text = text[:a] + text[b:]
        elif kind == "repeat":
            text = text[:b] + text[a:b] * draw(st.integers(1, 3)) + text[b:]
        elif kind == "glue":
            # separators lost in copying: a tab or run of spaces disappears
            text = text[:a] + text[a:b].replace("\t", "", 1).replace("  ", "", 1) + text[b:]
        elif kind == "replace":
            text = text[:a] + draw(st.sampled_from(LINK_CODE_CHARS + "0123456789-,/ \t\n")) + text[a + 1:]
        elif kind == "insert":
            text = text[:a] + draw(st.text(max_size=12) | cells) + text[a:]
        elif kind == "swap_lines":
            lines = text.split("\n")
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
        else:
            text = text[:b]
    return text


@FEW
@given(mutated_published())
def test_topo_parser_mutated_published_outputs(text):
    result = bounded(parse_topo_matrix, text, "mutated")
    check_matrix(result)
    check_topology(result)


def test_published_outputs_parse_unmutated():
    # the base of the mutations: every one parses and builds as is
    for text in PUBLISHED:
        result = parse_topo_matrix(text)
        check_matrix(result)
        check_topology(result)


# --------------------------------------------------------------------------
# the builder on GPU affinities: refused exactly when the nodes they imply overlap


@PROPS
@given(st.lists(st.tuples(st.integers(0, 3), st.frozensets(st.integers(0, 40), min_size=1, max_size=12)),
                min_size=1, max_size=6))
def test_builder_refuses_exactly_the_overlapping_nodes(gpus):
    lines = ["\t" + "\t".join("GPU%d" % i for i in range(len(gpus))) + "\tCPU Affinity\tNUMA Affinity"]
    for i, (node, cpus) in enumerate(gpus):
        codes = ["X" if i == j else "SYS" for j in range(len(gpus))]
        lines.append("\t".join(["GPU%d" % i] + codes + [cpulist.format_cpulist(cpus), str(node)]))
    smi = parse_topo_matrix("\n".join(lines) + "\n")
    by_node = {}
    for node, cpus in gpus:
        by_node.setdefault(node, set()).update(cpus)
    overlap = any(by_node[a] & by_node[b] for a in by_node for b in by_node if a < b)
    topo = bounded(lambda: topology.build_topology("prop", smi=smi, sources=["nvidia_smi"]))
    if overlap:
        assert isinstance(topo, GpunumaError) and "NUMA node CPU sets overlap" in str(topo)
    else:
        assert not isinstance(topo, GpunumaError), topo
        assert {n["id"]: cpulist.parse_cpulist(n["cpus"]) for n in topo["numa_nodes"]} == by_node


@pytest.fixture(scope="module")
def eight_gpu_host(tmp_path_factory):
    """Built once, outside the examples (building a tree is the slow part)."""
    import sysfs_factory
    from ansible.module_utils.gpunuma.discovery.sysfs import host as sysfs

    return sysfs.read_host(sysfs_factory.two_socket_8gpu_ht(str(tmp_path_factory.mktemp("host"))))


@FEW
@given(st.frozensets(st.integers(0, 12), min_size=1, max_size=8), st.integers(0, 8))
def test_builder_with_sysfs_keeps_every_text_gpu_whatever_the_labels(eight_gpu_host, labels, sysfs_gpus):
    import copy

    from ansible.module_utils.gpunuma.discovery.sysfs import pci as sysfs_pci

    host = copy.deepcopy(eight_gpu_host)
    gpus = sorted(p["pci_bus_id"] for p in sysfs_pci.gpu_functions(host))
    host["pci"] = [p for p in host["pci"] if p["pci_bus_id"] not in set(gpus[sysfs_gpus:])]
    order = sorted(labels)
    lines = ["\t" + "\t".join("GPU%d" % i for i in order) + "\tCPU Affinity\tNUMA Affinity"]
    for i in order:
        codes = ["X" if i == j else "SYS" for j in order]
        node = 0 if i % 2 == 0 else 1
        lines.append("\t".join(["GPU%d" % i] + codes + ["0-47,96-143" if node == 0 else "48-95,144-191", str(node)]))
    text = "\n".join(lines) + "\n"
    smi = bounded(parse_topo_matrix, text)
    if 0 not in labels:
        assert isinstance(smi, GpunumaError)  # a header starts with GPU0
        return
    topo = bounded(lambda: topology.build_topology("prop", host=host, smi=smi, sources=["nvidia_smi", "sysfs"]))
    assert not isinstance(topo, GpunumaError), topo
    assert [g["index"] for g in topo["gpus"]] == order
    matched = order == list(range(sysfs_gpus))
    assert all((g["pci_bus_id"] is not None) == matched for g in topo["gpus"])
    assert [g["numa_node"] for g in topo["gpus"]] == [0 if i % 2 == 0 else 1 for i in order] or matched
