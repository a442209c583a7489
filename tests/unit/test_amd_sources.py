"""AMD sources (discovery/amd/sources.py, amd_topology.py): the KFD topology, rocm-smi and amd-smi, on published captures.

Fixtures (tests/fixtures/published/amd/, each naming its source):
* kfd-*.json: KFD topology trees captured on real nodes, published as ROCm/k8s-device-plugin test data
  (8x MI300X in CPX mode, 8x MI308X in 4 partitions, 8x MI210 in two XGMI groups of four);
* rocm-smi-*.txt: rocm-smi outputs pasted in public issues;
* amd-smi-topology-mi210-xgmi-pcie.derived.json: the MI210 host written in amd-smi's JSON shape
  (no amd-smi capture is published).
"""

import collections
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible.module_utils.gpunuma.discovery.amd import sources as amd
from ansible.module_utils.gpunuma.discovery.discover import discover
from ansible.module_utils.gpunuma.plan.planner import build_plan
from ansible.module_utils.gpunuma.plan.profiles import load_profile
from conftest import REPO_ROOT
from sysfs_factory import CPX_DEVICES, kfd_tree, mi300x_8gpu_2socket, mi300x_cpx_host

pytestmark = pytest.mark.unit

AMD = os.path.join(REPO_ROOT, "tests", "fixtures", "published", "amd")
PROFILES = os.path.join(REPO_ROOT, "policies", "profiles")


def fixture(name):
    return os.path.join(AMD, name)


def text(name):
    with open(fixture(name)) as handle:
        return handle.read()


def kfd(tmp_path, name):
    kfd_tree(str(tmp_path), fixture(name))
    return amd.read_kfd(str(tmp_path))


# ------------------------------------------------------------------ KFD captures


def test_mi300x_cpx_capture_partitions_and_nodes(tmp_path):
    topo = kfd(tmp_path, "kfd-mi300x-cpx-8gpu.json")
    assert topo["cpu_nodes"] == [0, 1] and not topo["warnings"]
    gpus = amd.kfd_gpus(topo)
    assert len(gpus) == 63  # the capture holds 63 of the 64 partitions
    assert dict((g["pci_bus_id"], g["cpu_node"]) for g in gpus) == CPX_DEVICES
    per_device = collections.Counter(g["pci_bus_id"] for g in gpus)
    assert sorted(per_device.values()) == [7] + [8] * 7
    for bus in CPX_DEVICES:
        parts = [g["partition"] for g in gpus if g["pci_bus_id"] == bus]
        assert [p["index"] for p in parts] == list(range(len(parts)))
        assert set(p["count"] for p in parts) == {per_device[bus]}
        assert len(set(g["unique_id"] for g in gpus if g["pci_bus_id"] == bus)) == 1
    words = amd.kfd_links(topo, gpus)
    for (i, j), word in words.items():
        assert word == ("XGMI0" if gpus[i]["pci_bus_id"] == gpus[j]["pci_bus_id"] else "XGMI1"), (i, j)
    # every pair of partitions is linked: MI300X's fabric joins all eight GPUs directly
    assert len(words) == 63 * 62


def test_mi308x_four_partitions_over_two_pci_domains(tmp_path):
    topo = kfd(tmp_path, "kfd-mi308x-4part-8gpu.json")
    gpus = amd.kfd_gpus(topo)
    assert len(gpus) == 32
    devices = collections.OrderedDict()
    for g in gpus:
        devices.setdefault(g["pci_bus_id"], set()).add(g["cpu_node"])
    assert list(devices) == ["0000:0a:00.0", "0000:80:00.0", "0000:a4:00.0", "0000:c8:00.0",
                             "0001:0b:00.0", "0001:81:00.0", "0001:a5:00.0", "0001:c9:00.0"]
    assert [nodes for nodes in devices.values()] == [{0}] * 4 + [{1}] * 4
    assert all(g["partition"]["count"] == 4 for g in gpus)


def test_mi210_xgmi_groups_are_the_cliques_kfd_links(tmp_path):
    topo = kfd(tmp_path, "kfd-mi210-xgmi-pcie-8gpu.json")
    gpus = amd.kfd_gpus(topo)
    assert [g["partition"] for g in gpus] == [None] * 8
    words = amd.kfd_links(topo, gpus)
    assert set(words.values()) == {"XGMI1"}
    peers = dict((i, frozenset(j for (a, j) in words if a == i)) for i in range(8))
    cliques = set(peers[i] | {i} for i in range(8))
    assert len(cliques) == 2 and all(len(c) == 4 for c in cliques)
    # each XGMI group of four sits on one CPU node
    for clique in cliques:
        assert len(set(gpus[i]["cpu_node"] for i in clique)) == 1


def test_unreadable_kfd_node_is_left_out_with_a_warning(tmp_path):
    kfd_tree(str(tmp_path), fixture("kfd-mi210-xgmi-pcie-8gpu.json"))
    props = tmp_path / "sys/class/kfd/kfd/topology/nodes/3/properties"
    props.unlink()
    props.mkdir()
    topo = amd.read_kfd(str(tmp_path))
    assert len(topo["gpus"]) == 7
    assert any("KFD node 3" in w and "left out" in w for w in topo["warnings"])


@pytest.mark.parametrize("alias", ["0003", "\u00b3", "3a"])
def test_a_kfd_node_directory_named_twice_is_read_once(tmp_path, alias):
    """0003 beside 3 names node 3 again (int() reads both as 3), and str.isdigit() takes a superscript: only
    canonical decimal names are KFD nodes."""
    kfd_tree(str(tmp_path), fixture("kfd-mi210-xgmi-pcie-8gpu.json"))
    nodes = tmp_path / "sys/class/kfd/kfd/topology/nodes"
    (nodes / alias).mkdir()
    for entry in (nodes / "3").iterdir():
        if entry.is_file():
            (nodes / alias / entry.name).write_bytes(entry.read_bytes())
    assert len(amd.read_kfd(str(tmp_path))["gpus"]) == 8


def test_no_kfd_is_none(tmp_path):
    assert amd.read_kfd(str(tmp_path)) is None


# ------------------------------------------------------------------ the topology of a host with the capture


def cpx_host(tmp_path, numa_node=None):
    return mi300x_cpx_host(str(tmp_path), numa_node=numa_node)


def test_cpx_host_topology_has_every_partition_on_its_node(tmp_path):
    topo = discover("mi300x-cpx", sysfs_root=cpx_host(tmp_path))["topology"]
    assert "kfd" in topo["sources"]
    assert len(topo["gpus"]) == 63 and [g["index"] for g in topo["gpus"]] == list(range(63))
    for gpu in topo["gpus"]:
        assert gpu["vendor"] == "amd" and gpu["uuid"] is None  # partitions share their GPU's unique_id
        assert gpu["numa_node"] == CPX_DEVICES[gpu["pci_bus_id"]] and gpu["numa_node_source"] == "sysfs"
        assert gpu["partition"]["compute"] == "CPX" and gpu["partition"]["memory"] == "NPS1"
    links = topo["gpu_links"]
    for i, a in enumerate(topo["gpus"]):
        for j, b in enumerate(topo["gpus"]):
            expected = "X" if i == j else "XGMI0" if a["pci_bus_id"] == b["pci_bus_id"] else "XGMI1"
            assert links[i][j] == expected, (i, j)
    assert not any("GPU links derived from PCIe" in w for w in topo["warnings"])


def test_kfd_places_partitions_where_sysfs_numa_node_is_minus_one(tmp_path):
    topo = discover("mi300x-cpx", sysfs_root=cpx_host(tmp_path, numa_node=-1))["topology"]
    for gpu in topo["gpus"]:
        assert gpu["numa_node"] == CPX_DEVICES[gpu["pci_bus_id"]] and gpu["numa_node_source"] == "kfd", gpu


def test_cpx_plan_one_instance_per_partition_local_and_selected_by_ordinal(tmp_path):
    topo = discover("mi300x-cpx", sysfs_root=cpx_host(tmp_path))["topology"]
    instances = [{"name": "llm%d" % i, "gpus": [i], "command": ["/usr/bin/true"]} for i in range(63)]
    plan = build_plan(topo, load_profile("strict", PROFILES), instances)
    seen = set()
    for inst, gpu in zip(plan["instances"], topo["gpus"]):
        assert inst["numa_nodes"] == [gpu["numa_node"]] and inst["mem_nodes"] == [gpu["numa_node"]]
        assert inst["environment"]["ROCR_VISIBLE_DEVICES"] == str(gpu["index"])
        cpus = set(inst["cpus_list"]) if "cpus_list" in inst else None
        if cpus:
            assert not cpus & seen
            seen |= cpus
    assert any("partitions share their GPU's" in w for w in plan["warnings"])


def test_a_tensor_parallel_group_stays_on_one_gpus_partitions(tmp_path):
    topo = discover("mi300x-cpx", sysfs_root=cpx_host(tmp_path))["topology"]
    # GPU 0's partitions 0-5 are taken: in index order the next four (6, 7, 8, 9) would span two GPUs.
    plan = build_plan(topo, load_profile("strict", PROFILES),
                      [{"name": "small", "gpus": [0, 1, 2, 3, 4, 5], "command": ["/usr/bin/true"]},
                       {"name": "tp4", "gpus_per_instance": 4, "command": ["/usr/bin/true"]}])
    chosen = plan["instances"][1]["gpus"]
    assert len(set(topo["gpus"][g]["pci_bus_id"] for g in chosen)) == 1, chosen


@pytest.mark.parametrize("better, worse", [("XGMI0", "XGMI1"), ("XGMI1", "XGMI2"), ("XGMI3", "PIX"), ("XGMI1", "SYS")])
def test_xgmi_link_ranks(better, worse):
    from ansible.module_utils.gpunuma.plan.topology_readers import link_rank
    assert link_rank(better) > link_rank(worse)


# ------------------------------------------------------------------ rocm-smi


def test_rocm_smi_numa_capture_maps_gpus_to_nodes():
    doc = amd.parse_rocm_smi(text("rocm-smi-showtoponuma-8gpu-2node.txt"))
    assert doc["numa"] == dict((g, 0 if g < 4 else 1) for g in range(8))
    assert doc["affinity"] == doc["numa"] and doc["count"] == 8


def test_rocm_smi_pcie_capture_is_through_both_sockets():
    doc = amd.parse_rocm_smi(text("rocm-smi-showtopo-4gpu-pcie.txt"))
    pairs = [(i, j) for i in range(4) for j in range(4) if i != j]
    assert doc["types"] == dict((p, "PCIE") for p in pairs)
    assert doc["hops"] == dict((p, 3) for p in pairs) and doc["weights"] == dict((p, 52) for p in pairs)
    assert set(amd.smi_words(doc, dict((i, i) for i in range(4))).values()) == {"SYS"}


def test_rocm_smi_mi250_weights_rank_as_hops():
    doc = amd.parse_rocm_smi(text("rocm-smi-showtopoweight-mi250-8gcd.txt"))
    assert doc["weights"][(0, 1)] == 15 and doc["weights"][(0, 3)] == 30 and doc["weights"][(1, 7)] == 45
    # the weights alone say no link type: with XGMI (what the hops table of that paste shows) they rank 1/2/3
    doc["types"] = dict((pair, "XGMI") for pair in doc["weights"])
    words = amd.smi_words(doc, dict((i, i) for i in range(8)))
    assert words[(0, 1)] == "XGMI1" and words[(0, 3)] == "XGMI2" and words[(1, 7)] == "XGMI3"


def test_rocm_smi_json_form():
    data = {"card%d" % g: {"(Topology) Numa Node": str(g // 2), "(Topology) Numa Affinity": str(g // 2)}
            for g in range(4)}
    data["system"] = {"(Topology) Link type between DRM devices 0 and 1": "XGMI",
                      "(Topology) Weight between DRM devices 0 and 1": "15",
                      "(Topology) Hops between DRM devices 0 and 1": "1"}
    doc = amd.parse_rocm_smi(json.dumps(data))
    assert doc["numa"] == {0: 0, 1: 0, 2: 1, 3: 1}
    assert amd.smi_words(doc, {0: 0, 1: 1}) == {(0, 1): "XGMI1"}


@pytest.mark.parametrize("bad, message", [
    ("", "is empty"),
    ("{not json", "is not JSON"),
    ("[1, 2]", "a JSON object of cards"),
    ("hello\nworld\n", "no GPU found"),
    ("=== Weight between two GPUs ===\n       GPU0  GPU1\nGPU0   0  15 15\n", "row GPU0"),
])
def test_rocm_smi_errors_name_the_source(bad, message):
    with pytest.raises(amd.AmdSourceError) as caught:
        amd.parse_rocm_smi(bad, source="rocm_smi_topo_file /x")
    assert "rocm_smi_topo_file /x" in str(caught.value) and message in str(caught.value)


# ------------------------------------------------------------------ amd-smi


def test_amd_smi_document_matches_by_bus_id_and_agrees_with_kfd(tmp_path):
    derived = json.loads(text("amd-smi-topology-mi210-xgmi-pcie.derived.json"))
    doc = amd.parse_amd_smi(json.dumps(derived["output"]))
    topo = kfd(tmp_path, "kfd-mi210-xgmi-pcie-8gpu.json")
    gpus = amd.kfd_gpus(topo)
    positions = dict((g, [x["pci_bus_id"] for x in gpus].index(bus)) for g, bus in doc["bdf"].items())
    words = amd.smi_words(doc, positions)
    xgmi = dict((k, v) for k, v in words.items() if v.startswith("XGMI"))
    assert xgmi == amd.kfd_links(topo, gpus)
    for (i, j), word in words.items():
        if not word.startswith("XGMI"):
            assert word == ("NODE" if gpus[i]["cpu_node"] == gpus[j]["cpu_node"] else "SYS"), (i, j)


@pytest.mark.parametrize("bad, message", [
    ("{}", "a JSON list of GPUs"),
    ('[{"gpu": "0", "bdf": "0000:05:00.0"}]', "entry 0 has no integer"),
    ('[{"gpu": 0, "bdf": "05:00.0"}]', "gpu 0: PCI bus id"),
])
def test_amd_smi_errors_name_the_source(bad, message):
    with pytest.raises(amd.AmdSourceError) as caught:
        amd.parse_amd_smi(bad, source="amd_smi_topology_file /y")
    assert "amd_smi_topology_file /y" in str(caught.value) and message in str(caught.value)


def test_rocm_smi_file_places_gpus_where_sysfs_cannot(tmp_path):
    root = mi300x_8gpu_2socket(str(tmp_path / "h"), numa_node=-1)
    path = fixture("rocm-smi-showtoponuma-8gpu-2node.txt")
    topo = discover("mi300x", sysfs_root=root, rocm_smi_file=path)["topology"]
    assert "rocm_smi" in topo["sources"]
    assert [(g["numa_node"], g["numa_node_source"]) for g in topo["gpus"]] == [(0, "rocm_smi")] * 4 + [(1, "rocm_smi")] * 4


def test_a_tool_document_of_another_host_is_not_used(tmp_path):
    root = mi300x_8gpu_2socket(str(tmp_path / "h"))
    topo = discover("mi300x", sysfs_root=root, rocm_smi_file=fixture("rocm-smi-showtopo-4gpu-pcie.txt"))["topology"]
    assert any("lists 4 GPUs but discovery found 8 AMD GPUs" in w for w in topo["warnings"])


def test_live_tools_run_in_order_only_on_amd_hosts(tmp_path):
    ran = []

    def run_tool(argv):
        ran.append(argv[0])
        if argv[0] == "amd-smi":
            return None, "amd-smi topology --json exited 1: no GPU"
        return text("rocm-smi-showtoponuma-8gpu-2node.txt"), None

    from ansible.module_utils.gpunuma.discovery import discover as discover_module
    doc = discover_module._amd_tool_doc(None, None, discover_module.ALL_SOURCES, False, run_tool, warnings := [], used := [])
    assert ran == ["amd-smi", "rocm-smi"] and used == ["rocm_smi"] and doc["numa"][7] == 1
    assert warnings == ["amd-smi topology --json exited 1: no GPU"]
    ran.clear()
    assert discover_module._amd_tool_doc(None, None, ("sysfs",), False, run_tool, [], []) is None and ran == []


# ------------------------------------------------------------------ properties


pairs = st.dictionaries(st.tuples(st.integers(0, 7), st.integers(0, 7)).filter(lambda p: p[0] != p[1]),
                        st.tuples(st.integers(1, 200) | st.none(), st.integers(0, 5) | st.none(), st.booleans()),
                        max_size=30)


@settings(max_examples=200, deadline=None)
@given(pairs, st.integers(2, 9))
def test_xgmi_words_rank_weights_and_ignore_their_scale(spec, scale):
    words = amd.xgmi_words(spec)
    assert set(words) == set(spec)
    for key, (weight, _hops, same) in spec.items():
        assert (words[key] == "XGMI0") == same
    scaled = dict((k, (w * scale if w else w, h, s)) for k, (w, h, s) in spec.items())
    assert amd.xgmi_words(scaled) == words
    weighted = [(w, int(words[k][4:])) for k, (w, _h, s) in spec.items() if w and not s]
    for (w1, h1) in weighted:
        for (w2, h2) in weighted:
            assert (w1 < w2) == (h1 < h2) or w1 == w2 or h1 == h2 == amd.MAX_HOPS


def _published_rocm_smi():
    return [text(n) for n in sorted(os.listdir(AMD)) if n.startswith("rocm-smi-")]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(_published_rocm_smi()), st.integers(0, 4000), st.integers(1, 60),
       st.sampled_from(["cut", "repeat", "junk", "truncate"]), st.text(max_size=10))
def test_rocm_smi_mutations_parse_or_fail_by_name(base, at, size, kind, junk):
    at = at % len(base)
    if kind == "cut":
        mutated = base[:at] + base[at + size:]
    elif kind == "repeat":
        mutated = base[:at + size] + base[at:at + size] + base[at + size:]
    elif kind == "junk":
        mutated = base[:at] + junk + base[at:]
    else:
        mutated = base[:at]
    try:
        doc = amd.parse_rocm_smi(mutated, source="mutated")
    except amd.AmdSourceError as exc:
        assert str(exc).startswith("mutated")
        return
    assert doc["count"] >= 1
    for key in ("weights", "hops", "types"):
        assert all(i != j and i < doc["count"] and j < doc["count"] for i, j in doc[key])


def test_published_rocm_smi_parse_unmutated():
    for body in _published_rocm_smi():
        assert amd.parse_rocm_smi(body)["count"] in (4, 8)


def _tree(root):
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = ("link", os.readlink(path))
            elif os.path.isfile(path):
                with open(path, "rb") as handle:
                    out[rel] = ("file", handle.read())
            else:
                out[rel] = ("dir", None)
    return out


def test_the_demo_hosts_archive_is_what_the_factory_builds(tmp_path):
    """tests/fixtures/hosts/mi300x-cpx-sysfs.tar.gz (scripts/gen-amd-demo-host.py) cannot drift from the
    factory and the published capture it is built from."""
    import tarfile
    with tarfile.open(os.path.join(REPO_ROOT, "tests", "fixtures", "hosts", "mi300x-cpx-sysfs.tar.gz")) as tar:
        tar.extractall(str(tmp_path / "archive"))
    built = mi300x_cpx_host(str(tmp_path / "built"))
    assert _tree(str(tmp_path / "archive")) == _tree(built)


def test_kubelet_plan_on_the_cpx_host(tmp_path):
    """The kubelet role's decisions work unchanged on an AMD topology: strict gives single-numa-node and
    reserves housekeeping CPUs on both sockets' nodes."""
    from ansible.module_utils.gpunuma.kubelet.plan import plan_kubelet
    from ansible.module_utils.gpunuma.plan.profiles import parse_profile_text
    topo = discover("mi300x-cpx", sysfs_root=cpx_host(tmp_path))["topology"]
    with open(os.path.join(REPO_ROOT, "policies", "kubelet", "strict.yml")) as handle:
        preset = parse_profile_text(handle.read())
    with open(os.path.join(REPO_ROOT, "tests", "fixtures", "kubelet", "kubeadm-config.yaml")) as handle:
        config = handle.read()
    result = plan_kubelet(topo, load_profile("strict", PROFILES), preset, config, kubelet_version="1.34")
    assert result.config["topologyManagerPolicy"] == "single-numa-node"
    reserved = set(sysfs_cpus(result.config["reservedSystemCPUs"]))
    assert reserved & set(range(0, 48)) and reserved & set(range(48, 96)), result.config["reservedSystemCPUs"]


def sysfs_cpus(text):
    from ansible.module_utils.gpunuma.common.cpulist import parse_cpulist
    return parse_cpulist(text)


_MI210 = json.loads(text("kfd-mi210-xgmi-pcie-8gpu.json"))["files"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(_MI210)), st.sampled_from(["drop", "garbage", "truncate", "dir"]),
                          st.text(max_size=20)), max_size=6))
def test_damaged_kfd_trees_read_without_crashing(tmp_path_factory, damage):
    """A KFD tree with files lost, truncated, replaced by garbage or by directories: read_kfd never raises,
    every GPU it returns has a bus id and links only to nodes, and the link words are XGMI words."""
    root = tmp_path_factory.mktemp("kfd")
    base = root / "sys/class/kfd/kfd/topology"
    files = dict(_MI210)
    for rel, kind, junk in damage:
        if kind == "drop":
            files.pop(rel, None)
        elif kind == "garbage":
            files[rel] = junk
        elif kind == "truncate" and files.get(rel) is not None:
            files[rel] = files[rel][:len(files[rel]) // 2]
        else:
            files[rel] = None
    for rel, body in files.items():
        path = base / rel
        if body is None:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
    topo = amd.read_kfd(str(root))
    gpus = amd.kfd_gpus(topo)
    assert all(isinstance(g["pci_bus_id"], str) and len(g["pci_bus_id"]) == 12 for g in gpus)
    for (i, j), word in amd.kfd_links(topo, gpus).items():
        assert 0 <= i < len(gpus) and 0 <= j < len(gpus) and i != j and word.startswith("XGMI")


def test_metrics_of_the_cpx_plan(tmp_path):
    """The metrics collector reads an AMD node's plan unchanged: one info series per instance, no error."""
    from ansible.module_utils.gpunuma.verify import metrics
    topo = discover("mi300x-cpx", sysfs_root=cpx_host(tmp_path / "host"))["topology"]
    plan = build_plan(topo, load_profile("strict", PROFILES),
                      [{"name": "tp8", "gpus_per_instance": 8, "command": ["/usr/bin/true"]},
                       {"name": "one", "gpus_per_instance": 1, "command": ["/usr/bin/true"]}])
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    text, errors = metrics.collect(plan_path=str(path), sysfs_root=str(tmp_path / "host"))
    assert errors == []
    info = [line for line in text.splitlines() if line.startswith("gpunuma_instance_info{")]
    assert len(info) == 2 and 'instance="tp8"' in info[0] + info[1]
    assert "gpunuma_metrics_errors 0" in text


# -- hostile tool output: a named refusal, never a crash, a hang or a GPU number nobody has ----------------------


@pytest.mark.parametrize("parse, text, needle", [
    (amd.parse_rocm_smi, "[" * 5000 + "]" * 5000, "nested deeper"),
    (amd.parse_rocm_smi, json.dumps({"card" + "9" * 5000: {"(Topology) Numa Node": "0"}}), "no GPU found"),
    (amd.parse_rocm_smi, json.dumps({"card99999": {"(Topology) Numa Node": "0"}}), "no GPU found"),
    (amd.parse_rocm_smi, json.dumps({"card0": {"(Topology) Weight between DRM devices 0 and 4096": 15}}),
     "4096 is not a GPU number"),
    (amd.parse_rocm_smi, "GPU[5000]\t\t: (Topology) Numa Node: 0\n", "5000 is not a GPU number"),
    (amd.parse_rocm_smi, "===== Weight between two GPUs =====\n       GPU0  GPU" + "9" * 4000 + "\nGPU0 0 15\n",
     "is not a GPU number"),
    (amd.parse_amd_smi, json.dumps([{"gpu": True, "bdf": "0000:01:00.0", "links": []}]), "true is not a GPU number"),
    (amd.parse_amd_smi, json.dumps([{"gpu": 10 ** 30, "bdf": "0000:01:00.0", "links": []}]), "is not a GPU number"),
    (amd.parse_amd_smi, json.dumps([{"gpu": 0, "bdf": "0000:01:00.0", "links": [{"gpu": [], "num_hops": 1}]}]),
     "names gpu [] is not a GPU number"),
    (amd.parse_amd_smi, json.dumps([{"gpu": 0, "bdf": "0000:01:00.0", "links": "x"}]), "\"links\" is str"),
    (amd.parse_amd_smi, "[" * 5000 + "]" * 5000, "nested deeper"),
])
def test_hostile_tool_output_is_refused_naming_what(parse, text, needle):
    with pytest.raises(amd.AmdSourceError) as caught:
        parse(text)
    assert needle in str(caught.value), str(caught.value)[:300]


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10 ** 40, 10 ** 40), st.floats(),
                              st.text(max_size=8)),
                    lambda children: st.one_of(st.lists(children, max_size=4),
                                               st.dictionaries(st.sampled_from(["gpu", "bdf", "links", "num_hops",
                                                                                "weight", "link_type", "card0"]),
                                                               children, max_size=4)),
                    max_leaves=20))
def test_any_json_shape_is_parsed_or_refused_never_a_crash(data):
    text = json.dumps(data)
    for parse in (amd.parse_rocm_smi, amd.parse_amd_smi):
        try:
            doc = parse(text)
        except amd.AmdSourceError:
            continue
        assert 0 < doc["count"] <= amd.MAX_GPU_NUMBER + 1
