"""ResourceSlices derived from a topology fixture, shaped as the published one (tests/fixtures/kubelet/resourceslices)."""

import copy
import json
import os

from conftest import FIXTURES

PUBLISHED = os.path.join(FIXTURES, "kubelet", "resourceslices", "nvidia-gke-a100.json")


def derived_slices(topo, node_name, numa=lambda gpu: {"int": gpu["numa_node"]}, drop=()):
    """One gpu.nvidia.com slice of ``topo``'s GPUs, attributes shaped as the published one."""
    with open(PUBLISHED, encoding="utf-8") as handle:
        published = json.load(handle)["items"][0]
    item = copy.deepcopy(published)
    item["spec"]["nodeName"] = node_name
    item["spec"]["pool"]["name"] = node_name
    template = item["spec"]["devices"][0]
    devices = []
    for gpu in topo["gpus"]:
        device = copy.deepcopy(template)
        device["name"] = "gpu-%d" % gpu["index"]
        attrs = device["attributes"]
        attrs["uuid"] = {"string": gpu["uuid"]}
        attrs["resource.kubernetes.io/pciBusID"] = {"string": gpu["pci_bus_id"]}
        attrs["resource.kubernetes.io/pcieRoot"] = {"string": "pci%s:%s" % tuple(gpu["pci_bus_id"].split(":")[:2])}
        value = numa(gpu)
        if value is not None:
            attrs["resource.kubernetes.io/numaNode"] = value
        for name in drop:
            attrs.pop(name, None)
        devices.append(device)
    item["spec"]["devices"] = devices
    return {"apiVersion": "v1", "kind": "List", "items": [item]}
