"""remap_dump: replaying a recorded NVML dump against another machine's PCI layout."""

import copy
import json
import os

import pytest

from conftest import FIXTURES
from ansible.module_utils.gpunuma.discovery import topology
from ansible.module_utils.gpunuma.discovery.nvidia import nvml
from ansible.module_utils.gpunuma.discovery.nvidia import nvml_dump
from ansible.module_utils.gpunuma.common.errors import NvmlError

pytestmark = pytest.mark.unit

RECORDED_DUMP = os.path.join(FIXTURES, "recorded", "h200-vm", "nvml-dump.json")
RECORDED_BUS = "0000:00:06.0"
STANDIN_BUS = "0000:21:02.0"
NOT_MAPPED = {"nvml_error": "NotMapped"}


def recorded_dump():
    with open(RECORDED_DUMP) as handle:
        return json.load(handle)


def two_node_host(standin_bus=STANDIN_BUS):
    """What sysfs.read_host returns on the numa_vm guest: two nodes, a stand-in device on node 1."""
    return {
        "numa_nodes": [
            {"id": 0, "cpus": "0-1", "memory_total_bytes": 1 << 30, "memory_free_bytes": 800 << 20,
             "distances": [10, 20]},
            {"id": 1, "cpus": "2-3", "memory_total_bytes": 1 << 30, "memory_free_bytes": 900 << 20,
             "distances": [20, 10]},
        ],
        "cpus": [{"id": cpu, "siblings": str(cpu)} for cpu in range(4)],
        "sockets": 2,
        "pci": [{
            "pci_bus_id": standin_bus, "vendor": "0x1b36", "device": "0x0005", "class": "0x00ff00",
            "numa_node": 1, "raw_numa_node": 1, "local_cpulist": "2-3",
            "max_link_speed": None, "max_link_width": None, "current_link_speed": None,
            "current_link_width": None, "netdevs": [], "rdma": [], "nvme": [],
            "realpath": "/sys/devices/pci0000:20/0000:20:00.0/" + standin_bus,
        }],
        "numa_balancing": 1,
        "warnings": [],
    }


def nvlinked_dump():
    """Two GPUs with 2 direct NVLinks each way and 4 links each to NVSwitch ports."""
    dump = recorded_dump()
    first = dump["gpus"][0]
    second = copy.deepcopy(first)
    second.update(index=1, uuid="GPU-00000000-0000-0000-0000-000000000001", pci_bus_id="0000:00:07.0")
    switch = ["0000:%02x:00.0" % bus for bus in (0x80, 0x81, 0x82, 0x83)]
    first["nvlinks"] = ([{"link": 0, "remote_pci_bus_id": "0000:00:07.0"},
                         {"link": 1, "remote_pci_bus_id": "0000:00:07.0"}]
                        + [{"link": 2 + k, "remote_pci_bus_id": bus} for k, bus in enumerate(switch)])
    second["nvlinks"] = ([{"link": 0, "remote_pci_bus_id": RECORDED_BUS},
                          {"link": 1, "remote_pci_bus_id": RECORDED_BUS}]
                         + [{"link": 2 + k, "remote_pci_bus_id": bus} for k, bus in enumerate(switch)])
    dump["gpus"].append(second)
    dump["topology_levels"] = [[0, 50], [50, 0]]
    return dump


def test_recorded_gpu_moves_to_the_new_bus_id_and_keeps_its_identity():
    original = recorded_dump()
    pristine = copy.deepcopy(original)
    out = nvml.remap_dump(original, {RECORDED_BUS: STANDIN_BUS})

    assert original == pristine, "remap_dump must not modify its input"
    gpu, recorded = out["gpus"][0], pristine["gpus"][0]
    assert gpu["pci_bus_id"] == STANDIN_BUS
    for key in ("index", "uuid", "name", "memory_total_bytes", "pcie", "mig_mode", "nvlinks"):
        assert gpu[key] == recorded[key], key
    assert out["driver_version"] == pristine["driver_version"]
    assert out["topology_levels"] == pristine["topology_levels"]
    assert out["remapped"] == {"bus_ids": {RECORDED_BUS: STANDIN_BUS},
                               "dropped": ["cpu_affinity_words", "numa_node_id"]}


def test_recorded_placement_is_replaced_by_not_mapped():
    original = recorded_dump()
    assert original["gpus"][0]["cpu_affinity_words"][0] == 0xFFFF  # CPUs 0-15 of the recording VM
    out = nvml.remap_dump(original, {RECORDED_BUS: STANDIN_BUS})
    assert out["gpus"][0]["cpu_affinity_words"] == NOT_MAPPED
    assert out["gpus"][0]["numa_node_id"] == NOT_MAPPED
    assert nvml_dump.is_error(out["gpus"][0]["cpu_affinity_words"])


def test_keeping_recorded_placement_on_request():
    dump = recorded_dump()
    dump["gpus"][0]["numa_node_id"] = 3
    out = nvml.remap_dump(dump, {RECORDED_BUS: STANDIN_BUS}, drop_cpu_affinity=False, drop_numa_node=False)
    assert out["gpus"][0]["cpu_affinity_words"] == dump["gpus"][0]["cpu_affinity_words"]
    assert out["gpus"][0]["numa_node_id"] == 3
    assert out["remapped"]["dropped"] == []
    only_affinity = nvml.remap_dump(dump, {RECORDED_BUS: STANDIN_BUS}, drop_numa_node=False)
    assert only_affinity["gpus"][0]["numa_node_id"] == 3
    assert only_affinity["gpus"][0]["cpu_affinity_words"] == NOT_MAPPED


def test_topology_places_the_remapped_gpu_from_local_sysfs():
    out = nvml.remap_dump(recorded_dump(), {RECORDED_BUS: STANDIN_BUS})
    topo = topology.build_topology("numa-vm", host=two_node_host(), nvml=out, sources=["nvml", "sysfs"])
    gpu = topo["gpus"][0]
    assert gpu["uuid"] == "GPU-ff97f1ea-2bfe-fe86-12dd-89277ffeabfc"
    assert gpu["pci_bus_id"] == STANDIN_BUS
    assert (gpu["numa_node"], gpu["numa_node_source"]) == (1, "sysfs")
    assert gpu["cpu_affinity"] == "2-3"
    assert gpu["numa_affinity"] == [1]
    assert not [w for w in topo["warnings"] if "GPU 0" in w], topo["warnings"]


def test_without_remapping_the_recorded_gpu_is_not_placed():
    # Why the remap exists: the recorded bus id is not on this machine and the
    # recorded affinity (CPUs 0-15) spans both of its nodes.
    topo = topology.build_topology("numa-vm", host=two_node_host(), nvml=recorded_dump(), sources=["nvml", "sysfs"])
    gpu = topo["gpus"][0]
    assert gpu["numa_node"] is None
    assert gpu["cpu_affinity"] == "0-15"
    assert any("not found in sysfs" in w for w in topo["warnings"])


def test_nvml_spelling_and_case_are_accepted():
    out = nvml.remap_dump(recorded_dump(), {"00000000:00:06.0": "0000:21:0A.0"})
    assert out["gpus"][0]["pci_bus_id"] == "0000:21:0a.0"
    assert out["remapped"]["bus_ids"] == {RECORDED_BUS: "0000:21:0a.0"}


def test_nvlink_peers_follow_their_gpus_and_switch_ports_stay():
    dump = nvlinked_dump()
    before = nvml.gpu_link_matrix(nvml_dump.validate_dump(copy.deepcopy(dump)))
    out = nvml.remap_dump(dump, {RECORDED_BUS: "0000:21:02.0", "0000:00:07.0": "0000:21:03.0"})
    first, second = out["gpus"]
    assert [link["remote_pci_bus_id"] for link in first["nvlinks"][:2]] == ["0000:21:03.0"] * 2
    assert [link["remote_pci_bus_id"] for link in second["nvlinks"][:2]] == ["0000:21:02.0"] * 2
    assert [link["remote_pci_bus_id"] for link in first["nvlinks"][2:]] == [
        "0000:80:00.0", "0000:81:00.0", "0000:82:00.0", "0000:83:00.0"]
    # 2 direct links + min(4, 4) through the switches, before and after.
    assert before == [["X", "NV6"], ["NV6", "X"]]
    assert nvml.gpu_link_matrix(out) == before


def test_switch_ports_may_be_mapped_too():
    out = nvml.remap_dump(nvlinked_dump(), {RECORDED_BUS: "0000:21:02.0", "0000:00:07.0": "0000:21:03.0",
                                            "0000:80:00.0": "0000:30:00.0"})
    assert out["gpus"][0]["nvlinks"][2]["remote_pci_bus_id"] == "0000:30:00.0"
    assert out["gpus"][1]["nvlinks"][2]["remote_pci_bus_id"] == "0000:30:00.0"


def test_remapped_dump_round_trips_through_load_dump(tmp_path):
    out = nvml.remap_dump(recorded_dump(), {RECORDED_BUS: STANDIN_BUS})
    path = tmp_path / "nvml-dump.json"
    path.write_text(json.dumps(out))
    assert nvml.load_dump(str(path)) == out


@pytest.mark.parametrize("bus_map,message", [
    ({}, "does not map GPU bus id(s) 0000:00:06.0"),
    ({RECORDED_BUS: STANDIN_BUS, "0000:00:09.0": "0000:21:03.0"},
     "names 0000:00:09.0, which the dump does not hold; allowed: its GPUs' bus ids 0000:00:06.0"),
    ({RECORDED_BUS: "21:02.0"}, "bus_map['0000:00:06.0']: PCI bus id '21:02.0' is not of the form"),
    ({RECORDED_BUS: None}, "bus_map['0000:00:06.0'] must be a PCI bus id string, got None"),
    ({"not-a-bus": STANDIN_BUS}, "bus_map key: PCI bus id 'not-a-bus' is not of the form"),
    ({RECORDED_BUS: STANDIN_BUS, "00000000:00:06.0": "0000:21:03.0"},
     "maps 0000:00:06.0 twice (to 0000:21:02.0 and 0000:21:03.0)"),
    ([(RECORDED_BUS, STANDIN_BUS)], "bus_map must be a mapping of recorded PCI bus id to new PCI bus id, got list"),
])
def test_bad_bus_maps_are_refused(bus_map, message):
    with pytest.raises(NvmlError) as excinfo:
        nvml.remap_dump(recorded_dump(), bus_map)
    assert message in str(excinfo.value)
    assert str(excinfo.value).startswith("remap_dump: ")


def test_two_gpus_cannot_share_a_bus_id():
    with pytest.raises(NvmlError, match="maps several GPUs to 0000:21:02.0"):
        nvml.remap_dump(nvlinked_dump(), {RECORDED_BUS: STANDIN_BUS, "0000:00:07.0": STANDIN_BUS})


def test_unmapped_switch_port_colliding_with_a_new_gpu_id_is_refused():
    with pytest.raises(NvmlError, match="leads to 0000:80:00.0, which is not remapped but is the new bus id of a GPU"):
        nvml.remap_dump(nvlinked_dump(), {RECORDED_BUS: "0000:80:00.0", "0000:00:07.0": "0000:21:03.0"})


def test_an_invalid_dump_is_refused():
    with pytest.raises(NvmlError, match="remap_dump: dump: schema must be 'gpunuma.nvml-dump/v1'"):
        nvml.remap_dump({"gpus": []}, {})
    dump = nvlinked_dump()
    del dump["gpus"][1]["nvlinks"][0]["remote_pci_bus_id"]
    with pytest.raises(NvmlError, match=r"dump gpus\[1\].nvlinks\[0\] has no remote_pci_bus_id"):
        nvml.remap_dump(dump, {RECORDED_BUS: "0000:21:02.0", "0000:00:07.0": "0000:21:03.0"})
