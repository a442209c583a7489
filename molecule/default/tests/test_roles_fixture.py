"""Units rendered for the captured 8-GPU layout (fixture-8gpu): written,
verified, never started, each instance on its GPUs' NUMA node.
"""

import json

import pytest

from fleet import UNIT_DIR, cpu_set, plan_of

testinfra_hosts = ["ansible://fixture-8gpu"]


def test_fixture_units_written_but_not_started(host):
    for instance in plan_of(host)["instances"]:
        service = host.service(instance["unit"])
        assert not service.is_enabled and not service.is_running, instance["unit"]


@pytest.mark.parametrize("name,node", [("llm0", 0), ("llm1", 0), ("llm2", 0), ("llm3", 0), ("tp", 1)])
def test_fixture_instance_on_its_gpus_node(host, name, node):
    instance = next(i for i in plan_of(host)["instances"] if i["name"] == name)
    topology = json.loads(host.file("/etc/gpunuma/topology.json").content_string)
    gpu_nodes = {g["index"]: g["numa_node"] for g in topology["gpus"]}
    assert {gpu_nodes[g] for g in instance["gpus"]} == {node}
    assert instance["numa_nodes"] == [node] and instance["mem_nodes"] == [node]
    node_cpus = cpu_set(next(n["cpus"] for n in topology["numa_nodes"] if n["id"] == node))
    assert cpu_set(instance["cpus"]) <= node_cpus
    text = host.file(f"{UNIT_DIR}/{instance['unit']}").content_string
    assert f'"--membind={node}"' in text
    # Topology from nvidia-smi text has no UUIDs: indexes in PCI order.
    assert f'Environment="CUDA_VISIBLE_DEVICES={",".join(str(g) for g in instance["gpus"])}"' in text
    assert 'Environment="CUDA_DEVICE_ORDER=PCI_BUS_ID"' in text


def test_fixture_instances_do_not_share_cpus(host):
    seen = set()
    for instance in plan_of(host)["instances"]:
        cpus = cpu_set(instance["cpus"])
        assert not cpus & seen, instance["name"]
        seen |= cpus
    housekeeping = set().union(*(cpu_set(c) for c in plan_of(host)["housekeeping"].values()))
    assert not housekeeping & seen
