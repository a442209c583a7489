"""Replay the discovery run recorded on a real H200 node."""

import json
import os

import pytest

from conftest import FIXTURES
from ansible.module_utils.gpunuma.discovery.discover import discover
from ansible.module_utils.gpunuma.discovery.nvidia.topo_parse import parse_topo_matrix

pytestmark = pytest.mark.unit

RECORDED = os.path.join(FIXTURES, "recorded", "h200-vm")


@pytest.fixture(scope="module")
def live():
    with open(os.path.join(RECORDED, "topology.json")) as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def replay():
    return discover("h200-vm", sysfs_root=os.path.join(RECORDED, "sysfs"),
                    nvml_dump=os.path.join(RECORDED, "nvml-dump.json"))["topology"]


def test_live_run_used_nvml_and_sysfs(live):
    assert live["sources"] == ["nvml", "sysfs"]
    assert live["driver_version"] == "580.159.04"
    gpu = live["gpus"][0]
    assert gpu["name"] == "NVIDIA H200" and gpu["uuid"].startswith("GPU-")
    assert gpu["pci_bus_id"] == "0000:00:06.0"
    assert (gpu["numa_node"], gpu["numa_node_source"]) == (0, "cpu_affinity")
    assert gpu["pcie"] == {"gen_max": 5, "width_max": 16, "gen_current": 5, "width_current": 16}


def test_replay_reproduces_the_live_topology(live, replay):
    assert replay["fingerprint"] == live["fingerprint"]
    assert replay["sources"] == live["sources"]
    assert replay["gpus"] == live["gpus"]
    assert replay["gpu_links"] == live["gpu_links"] and replay["gpu_nic_links"] == live["gpu_nic_links"]
    assert replay["nics"] == live["nics"]
    # Memory figures move between two reads (this node ran under gVisor, whose
    # node meminfo follows its own accounting); the layout does not.
    strip = lambda nodes: [dict(n, memory_free_bytes=None, memory_total_bytes=None) for n in nodes]  # noqa: E731
    assert strip(replay["numa_nodes"]) == strip(live["numa_nodes"])
    assert replay["warnings"] == live["warnings"]


def test_nvidia_smi_text_agrees_with_nvml(replay):
    with open(os.path.join(RECORDED, "nvidia-smi-topo-m.txt")) as handle:
        smi = parse_topo_matrix(handle.read())
    row = smi["gpus"][0]
    gpu = replay["gpus"][0]
    assert row["cpu_affinity"] == gpu["cpu_affinity"] == "0-15"
    assert row["numa_affinity"] == [gpu["numa_node"]]
    assert smi["gpu_links"] == replay["gpu_links"] == [["X"]]
