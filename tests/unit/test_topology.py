"""Topology builder: derivation rules, source merging, fingerprint."""

import copy

import pytest

import sysfs_factory as factory
from ansible.module_utils.gpunuma.common import cpulist
from ansible.module_utils.gpunuma.discovery import nodes as nodes_lib, topology
from ansible.module_utils.gpunuma.discovery.sysfs import host as sysfs
from ansible.module_utils.gpunuma.discovery.sysfs import pci as sysfs_pci
from ansible.module_utils.gpunuma.common.errors import TopologyError
from ansible.module_utils.gpunuma.discovery.nvidia.nvml_dump import DUMP_SCHEMA

pytestmark = pytest.mark.unit


_TREES = {}


def host_of(builder, tmp_path, **kwargs):
    """Read a synthetic tree; each tree is built once per session (building is the slow part)."""
    key = (builder.__name__, tuple(sorted(kwargs.items())))
    if key not in _TREES:
        _TREES[key] = builder(str(tmp_path), **kwargs)
    return sysfs.read_host(_TREES[key])


def affinity_words(cpus, word_bits=64):
    """NVML's CPU affinity words for ``cpus`` (word 0 holds CPUs 0..word_bits-1)."""
    words = [0] * ((max(cpus) // word_bits + 1) if cpus else 1)
    for cpu in cpus:
        words[cpu // word_bits] |= 1 << (cpu % word_bits)
    return words


def nvml_dump_for(host, numa_ids=None, mig=None, affinity=True, links=None):
    """An NVML dump consistent with a sysfs tree's GPUs (as a real node would give)."""
    gpus = []
    for index, pci in enumerate(sorted(sysfs_pci.gpu_functions(host), key=lambda p: p["pci_bus_id"])):
        numa = (numa_ids or {}).get(index, pci["numa_node"])
        words = {"nvml_error": "NotSupported"}
        if affinity and pci["local_cpulist"]:
            words = affinity_words(cpulist.parse_cpulist(pci["local_cpulist"]))
        gpus.append({
            "index": index, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-%08d" % index,
            "pci_bus_id": pci["pci_bus_id"],
            "numa_node_id": {"nvml_error": "NotSupported"} if numa is None else numa,
            "cpu_affinity_words": words,
            "pcie": {"gen_max": 5, "width_max": 16, "gen_current": 5, "width_current": 16},
            "mig_mode": {"current": 1 if index in (mig or ()) else 0, "pending": 0},
            "memory_total_bytes": 85899345920, "nvlinks": [],
        })
    n = len(gpus)
    levels = links or [[0 if i == j else 50 for j in range(n)] for i in range(n)]
    return {"schema": DUMP_SCHEMA, "driver_version": "580.159.04", "cpu_word_bits": 64,
            "gpus": gpus, "topology_levels": levels}


def test_two_socket_eight_gpus_from_sysfs(tmp_path):
    host = host_of(factory.two_socket_8gpu_ht, tmp_path)
    topo = topology.build_topology("gpu-a01", host=host, sources=["sysfs"])
    assert topo["schema"] == "gpunuma.topology/v1"
    assert [g["numa_node"] for g in topo["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {g["numa_node_source"] for g in topo["gpus"]} == {"sysfs"}
    assert topo["gpus"][0]["cpu_affinity"] == "0-47,96-143"
    assert topo["sockets"] == 2
    node0 = topo["numa_nodes"][0]
    assert node0["cpus"] == "0-47,96-143" and node0["has_cpus"]
    assert node0["cores"][:2] == ["0,96", "1,97"] and len(node0["cores"]) == 48
    # PCIe-derived links: same socket NODE, across sockets SYS; each mlx5 sits beside its GPU.
    assert topo["gpu_links"][0][:5] == ["X", "NODE", "NODE", "NODE", "SYS"]
    rdma = [n for n in topo["nics"] if n["name"] and n["name"].startswith("mlx5_")]
    assert len(rdma) == 8
    pix = [topo["nics"][k]["name"] for k, code in enumerate(topo["gpu_nic_links"][0]) if code == "PIX"]
    assert len(pix) == 1 and pix[0].startswith("mlx5_")
    assert any("NVLinks are not visible" in w for w in topo["warnings"])


def test_vm_numa_minus_one_derives_node_from_cpu_affinity(tmp_path):
    host = host_of(factory.vm_numa_minus_one, tmp_path)
    topo = topology.build_topology("vm", host=host, sources=["sysfs"])
    gpu = topo["gpus"][0]
    assert gpu["numa_node"] == 0 and gpu["numa_node_source"] == "cpu_affinity"
    assert any("numa_node is -1" in w for w in topo["warnings"])


def test_captured_h200_vm(tmp_path):
    from conftest import FIXTURES

    host = sysfs.read_host(FIXTURES + "/captured/h200-1gpu-vm/sysfs")
    dump = nvml_dump_for(host, numa_ids={0: None})
    topo = topology.build_topology("h200", host=host, nvml=dump, sources=["nvml", "sysfs"])
    gpu = topo["gpus"][0]
    assert gpu["pci_bus_id"] == "0000:00:06.0"
    assert gpu["uuid"] == "GPU-00000000"
    # NVML NumaNodeId is NotSupported and sysfs says -1: the CPU affinity decides.
    assert (gpu["numa_node"], gpu["numa_node_source"]) == (0, "cpu_affinity")
    assert gpu["cpu_affinity"] == "0-15"


def test_grace_gpu_memory_node_is_never_the_binding_node(tmp_path):
    host = host_of(factory.grace_cpuless, tmp_path, superchips=2)
    cpuless = [n["id"] for n in host["numa_nodes"] if not n["has_cpus"]]
    # NVML reports the GPU's own (CPU-less) memory node, as on GB200/GH200 without CDMM.
    dump = nvml_dump_for(host, numa_ids={0: 2, 1: 10})
    assert 2 in cpuless and 10 in cpuless
    topo = topology.build_topology("gh200", host=host, nvml=dump, sources=["nvml", "sysfs"])
    first, second = topo["gpus"]
    assert first["pci_bus_id"].startswith("0009:") and second["pci_bus_id"].startswith("0019:")
    assert (first["numa_node"], first["gpu_numa_id"]) == (0, 2)
    assert (second["numa_node"], second["gpu_numa_id"]) == (1, 10)
    assert first["numa_node_source"] == "sysfs"


def test_no_gpu_node_is_valid(tmp_path):
    host = host_of(factory.no_gpu, tmp_path)
    topo = topology.build_topology("cpu-only", host=host, sources=["sysfs"])
    assert topo["gpus"] == [] and topo["gpu_links"] == [] and topo["gpu_nic_links"] == []
    assert len(topo["numa_nodes"]) == 2 and topo["complete"]


def test_nps4_gpus_land_on_their_quadrant_nodes(tmp_path):
    host = host_of(factory.amd_nps4_8node, tmp_path)
    topo = topology.build_topology("dgx-a100", host=host, nvml=nvml_dump_for(host), sources=["nvml", "sysfs"])
    assert [g["numa_node"] for g in topo["gpus"]] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert {g["numa_node_source"] for g in topo["gpus"]} == {"nvml"}
    assert len(topo["numa_nodes"]) == 8


def test_mig_keeps_parent_placement_and_says_so(tmp_path):
    host = host_of(factory.single_socket, tmp_path)
    topo = topology.build_topology("l40s", host=host, nvml=nvml_dump_for(host, mig={0}), sources=["nvml", "sysfs"])
    assert topo["gpus"][0]["mig_enabled"] is True
    assert topo["gpus"][0]["numa_node"] == 0
    assert any("MIG is enabled" in w for w in topo["warnings"])


def test_nvml_gpu_missing_from_sysfs_is_reported(tmp_path):
    host = host_of(factory.single_socket, tmp_path)
    dump = nvml_dump_for(host)
    dump["gpus"][0]["pci_bus_id"] = "0000:77:00.0"
    topo = topology.build_topology("odd", host=host, nvml=dump, sources=["nvml", "sysfs"])
    assert any("not found in sysfs" in w for w in topo["warnings"])


def test_unknown_node_is_null_with_a_warning(tmp_path):
    host = host_of(factory.two_socket_8gpu_ht, tmp_path)
    for pci in host["pci"]:
        pci["numa_node"], pci["local_cpulist"] = None, None
    topo = topology.build_topology("blind", host=host, sources=["sysfs"])
    assert all(g["numa_node"] is None for g in topo["gpus"])
    assert sum("NUMA node unknown" in w for w in topo["warnings"]) == 8


def test_no_source_at_all_is_an_error():
    with pytest.raises(TopologyError):
        topology.build_topology("nothing")


class TestFingerprint:
    def test_stable_across_memory_and_load(self, tmp_path):
        host = host_of(factory.two_socket_8gpu_ht, tmp_path)
        first = topology.build_topology("a", host=host, sources=["sysfs"])
        changed = copy.deepcopy(host)
        for node in changed["numa_nodes"]:
            node["memory_free_bytes"] = 1
        changed["numa_balancing"] = 0
        second = topology.build_topology("a", host=changed, sources=["sysfs"])
        assert first["fingerprint"] == second["fingerprint"]
        assert first["fingerprint"].startswith("sha256:") and len(first["fingerprint"]) == 7 + 64

    def test_changes_when_a_gpu_moves_or_nodes_split(self, tmp_path):
        host = host_of(factory.two_socket_8gpu_ht, tmp_path)
        base = topology.build_topology("a", host=host, sources=["sysfs"])["fingerprint"]
        moved = copy.deepcopy(host)
        next(p for p in moved["pci"] if p["pci_bus_id"] == "0000:18:00.0")["numa_node"] = 1
        assert topology.build_topology("a", host=moved, sources=["sysfs"])["fingerprint"] != base
        nps = host_of(factory.amd_nps4_8node, tmp_path / "nps")
        assert topology.build_topology("a", host=nps, sources=["sysfs"])["fingerprint"] != base

    def test_driver_major_counts_minor_does_not(self, tmp_path):
        host = host_of(factory.single_socket, tmp_path)
        dump = nvml_dump_for(host)
        base = topology.build_topology("a", host=host, nvml=dump)["fingerprint"]
        dump["driver_version"] = "580.200.01"
        assert topology.build_topology("a", host=host, nvml=dump)["fingerprint"] == base
        dump["driver_version"] = "590.10.01"
        assert topology.build_topology("a", host=host, nvml=dump)["fingerprint"] != base


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ("/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:00.0/0000:1a:00.0",
         "/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:01.0/0000:1b:00.0", "PIX"),
        ("/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:00.0/0000:1a:00.0/0000:1b:00.0/0000:1c:00.0",
         "/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:01.0/0000:1d:00.0", "PXB"),
        ("/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0",
         "/sys/devices/pci0000:17/0000:17:01.0/0000:19:00.0", "PHB"),
        ("/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0",
         "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0", "NODE"),
    ],
)
def test_pci_link_codes(a, b, expected):
    assert topology.pci_link_code({"realpath": a}, {"realpath": b}, 0, 0) == expected


def test_pci_link_code_across_sockets_is_sys():
    a = {"realpath": "/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0"}
    b = {"realpath": "/sys/devices/pci0000:97/0000:97:00.0/0000:98:00.0"}
    assert topology.pci_link_code(a, b, 0, 1) == "SYS"


# --- NUMA nodes are disjoint wherever they come from (docs/topology-v1.md, "Disjoint NUMA nodes")


def topo_text(rows):
    """A small ``nvidia-smi topo -m`` text: rows of (label, cpu affinity, numa affinity)."""
    labels = [label for label, _, _ in rows]
    lines = ["\t" + "\t".join(labels) + "\tCPU Affinity\tNUMA Affinity"]
    for i, (label, cpus, node) in enumerate(rows):
        codes = ["X" if i == j else "SYS" for j in range(len(rows))]
        lines.append("\t".join([label] + codes + [cpus, node]))
    return "\n".join(lines) + "\n"


OVERLAPS = [
    pytest.param(("0-31", "0-31"), "nodes 0 and 1 share CPUs 0-31", id="identical"),
    pytest.param(("0-15", "8-23"), "nodes 0 and 1 share CPUs 8-15", id="partial"),
]


def smi_of(cpus):
    from ansible.module_utils.gpunuma.discovery.nvidia.topo_parse import parse_topo_matrix

    return parse_topo_matrix(topo_text([("GPU0", cpus[0], "0"), ("GPU1", cpus[1], "1")]))


@pytest.mark.parametrize("cpus, shared", OVERLAPS)
def test_overlapping_nodes_from_topo_text_are_refused(cpus, shared):
    with pytest.raises(TopologyError) as err:
        topology.build_topology("t", smi=smi_of(cpus), sources=["nvidia_smi"])
    message = str(err.value)
    assert message.startswith("nvidia-smi topo -m output: NUMA node CPU sets overlap: " + shared)
    # the rows that gave each node its CPUs are named
    assert "node 0: GPU0 CPU Affinity %s; node 1: GPU1 CPU Affinity %s" % cpus in message


@pytest.mark.parametrize("cpus, shared", OVERLAPS)
def test_overlapping_nodes_from_sysfs_are_refused(tmp_path, cpus, shared):
    host = copy.deepcopy(host_of(factory.no_gpu, tmp_path))
    host["numa_nodes"][0]["cpus"], host["numa_nodes"][1]["cpus"] = cpus
    with pytest.raises(TopologyError) as err:
        topology.build_topology("s", host=host, sources=["sysfs"])
    assert str(err.value).startswith("sysfs: NUMA node CPU sets overlap: " + shared)


@pytest.mark.parametrize("cpus, shared", OVERLAPS)
def test_overlapping_nodes_with_nvml_are_refused(tmp_path, cpus, shared):
    # NVML names GPUs but gives no node CPU sets: the nodes come from sysfs or the text, and are checked there.
    host = copy.deepcopy(host_of(factory.two_socket_8gpu_ht, tmp_path))
    dump = nvml_dump_for(host)
    host["numa_nodes"][0]["cpus"], host["numa_nodes"][1]["cpus"] = cpus
    with pytest.raises(TopologyError) as err:
        topology.build_topology("n", host=host, nvml=dump, sources=["nvml", "sysfs"])
    assert "sysfs: NUMA node CPU sets overlap: " + shared in str(err.value)
    two = copy.deepcopy(dump)
    two["gpus"], two["topology_levels"] = two["gpus"][:2], [[0, 50], [50, 0]]
    with pytest.raises(TopologyError) as err:
        topology.build_topology("n", nvml=two, smi=smi_of(cpus), sources=["nvml", "nvidia_smi"])
    assert "nvidia-smi topo -m output: NUMA node CPU sets overlap: " + shared in str(err.value)


def test_overlap_between_several_nodes_lists_every_pair(tmp_path):
    host = copy.deepcopy(host_of(factory.amd_nps4_8node, tmp_path))
    host["numa_nodes"][2]["cpus"] = host["numa_nodes"][1]["cpus"]
    host["numa_nodes"][5]["cpus"] = "0-3"
    with pytest.raises(TopologyError) as err:
        topology.build_topology("n", host=host, sources=["sysfs"])
    message = str(err.value)
    assert "nodes 1 and 2 share CPUs" in message and "nodes 0 and 5 share CPUs 0-3" in message


def test_disjoint_text_nodes_still_build():
    topo = topology.build_topology("t", smi=smi_of(("0-15", "16-31")), sources=["nvidia_smi"])
    assert [(n["id"], n["cpus"]) for n in topo["numa_nodes"]] == [(0, "0-15"), (1, "16-31")]


def test_repeated_node_id_is_refused(tmp_path):
    host = copy.deepcopy(host_of(factory.no_gpu, tmp_path))
    host["numa_nodes"][1]["id"] = 0
    host["numa_nodes"][1]["cpus"] = ""
    with pytest.raises(TopologyError) as err:
        topology.build_topology("s", host=host, sources=["sysfs"])
    assert "NUMA node 0 is listed twice" in str(err.value)


# --- GPU labels with gaps (GPU0, GPU5) next to sysfs


def test_topo_gpu_label_gap_with_sysfs_is_a_warning_not_an_index_error(tmp_path):
    from ansible.module_utils.gpunuma.discovery.nvidia.topo_parse import parse_topo_matrix

    host = copy.deepcopy(host_of(factory.two_socket_8gpu_ht, tmp_path))
    keep = sorted(p["pci_bus_id"] for p in sysfs_pci.gpu_functions(host))[:2]
    host["pci"] = [p for p in host["pci"] if p["pci_bus_id"] in keep or p not in sysfs_pci.gpu_functions(host)]
    smi = parse_topo_matrix(topo_text([("GPU0", "0-47,96-143", "0"), ("GPU5", "48-95,144-191", "1")]))
    topo = topology.build_topology("gap", host=host, smi=smi, sources=["nvidia_smi", "sysfs"])
    assert [g["index"] for g in topo["gpus"]] == [0, 5]
    assert [g["pci_bus_id"] for g in topo["gpus"]] == [None, None]
    assert [g["numa_node"] for g in topo["gpus"]] == [0, 1]
    assert any("labels its GPUs GPU0 GPU5, not GPU0..GPU1" in w and "PCI placement not used" in w
               for w in topo["warnings"])


def test_topo_gpu_label_gap_with_nvml_says_which_rows_are_unused(tmp_path):
    from ansible.module_utils.gpunuma.discovery.nvidia.topo_parse import parse_topo_matrix

    host = host_of(factory.two_socket_8gpu_ht, tmp_path)
    dump = nvml_dump_for(host)
    dump["gpus"], dump["topology_levels"] = dump["gpus"][:2], [[0, 50], [50, 0]]
    smi = parse_topo_matrix(topo_text([("GPU0", "0-47,96-143", "0"), ("GPU5", "48-95,144-191", "1")]))
    topo = topology.build_topology("gap", host=host, nvml=dump, smi=smi, sources=["nvml", "nvidia_smi", "sysfs"])
    assert [g["index"] for g in topo["gpus"]] == [0, 1]
    assert any("labels its GPUs GPU0 GPU5 but NVML indexes them GPU0 GPU1" in w for w in topo["warnings"])


def test_each_warning_appears_once(tmp_path):
    host = copy.deepcopy(host_of(factory.two_socket_8gpu_ht, tmp_path))
    repeated = "nvidia-smi topo lists 8 GPUs but sysfs 7 NVIDIA GPUs"
    host["warnings"] = [repeated, "x", repeated]
    topo = topology.build_topology("w", host=host, warnings=[repeated], sources=["sysfs"])
    assert topo["warnings"].count(repeated) == 1 and topo["warnings"].count("x") == 1
    assert len(topo["warnings"]) == len(set(topo["warnings"]))


def test_overlap_of_many_nodes_is_listed_shortly_and_fast():
    import time

    nodes = [{"id": i, "cpus": "0-8191"} for i in range(256)]
    start = time.monotonic()
    with pytest.raises(TopologyError) as err:
        nodes_lib.check_disjoint_nodes(nodes, "t.txt")
    assert time.monotonic() - start < 5
    message = str(err.value)
    assert "nodes 0 and 1 share CPUs 0-8191" in message and "more nodes overlap (not listed)" in message
    assert message.count(" share CPUs ") == 10 and len(message) < 1500
