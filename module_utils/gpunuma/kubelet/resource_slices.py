"""A node's DRA ResourceSlices against its discovered topology (the audit's ``kubelet-resource-slice`` findings).

Under DRA a pod's GPU is aligned with its NIC or CPUs only by a ResourceClaim
constraint (``matchAttribute`` on ``resource.kubernetes.io/numaNode`` or
``resource.kubernetes.io/pcieRoot``, docs/kubelet.md "DRA"): the claim is only
as right as the attributes the drivers publish. This compares them, per GPU
device of a GPU driver (dra.DRA_GPU_DRIVERS), with what gpunuma
discovered on the node:

- ``numaNode`` (a scalar ``int``, or ``ints`` where the cluster has
  DRAListTypeAttributes: the device's node must be among them) against the
  GPU's NUMA node; absent where the kernel reports no node (sysfs -1, as
  KEP-6072 says), and a missing attribute is a warning otherwise;
- a ``numaNode`` equal to the GPU's own memory node on a coherent platform
  (GB200: ``gpu_numa_id``) instead of its CPU node (dra-driver-nvidia-gpu#1242):
  a claim matching it with a CPU or NIC never matches;
- ``pcieRoot``: absent (info), or shared by GPUs gpunuma found on different
  NUMA nodes (a warning: a pcieRoot constraint would then pair across nodes);
- devices the topology does not have, and GPUs no slice publishes (info).

The input is ``kubectl get resourceslices -o json`` (a List) or one slice.
Attribute values are typed as the resource.k8s.io API writes them:
``{"int": n}``, ``{"ints": [...]}``, ``{"string": s}``, ``{"strings": [...]}``,
``{"bool": b}``, ``{"version": v}``.
"""

from __future__ import annotations

import json

from ansible.module_utils.gpunuma.common.errors import NvmlError, ProblemsError
from ansible.module_utils.gpunuma.discovery.nvidia.nvml_dump import normalize_bus_id
from ansible.module_utils.gpunuma.kubelet.dra import DRA_GPU_DRIVERS

NUMA_NODE = "resource.kubernetes.io/numaNode"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
_VALUE_KEYS = ("int", "ints", "string", "strings", "bool", "version")


class ResourceSliceError(ProblemsError):
    """The document is not a ResourceSlice or a List of them; ``problems`` names the field."""


def _value(attribute):
    if not isinstance(attribute, dict):
        return None
    for key in _VALUE_KEYS:
        if key in attribute:
            return attribute[key]
    return None


def _attr(attributes, name, driver):
    """An attribute by its qualified name, or by its short name in the driver's own domain."""
    if name in attributes:
        return _value(attributes[name])
    short = name.rsplit("/", 1)[-1]
    for key in (short, "%s/%s" % (driver, short)):
        if key in attributes:
            return _value(attributes[key])
    return None


def _bus_id(value):
    """A PCI address as the topology writes it (``discovery.nvidia.nvml.normalize_bus_id``), or None when it is not one."""
    try:
        return normalize_bus_id(value)
    except NvmlError:
        return None


def slices(document):
    """The ResourceSlice objects of ``document`` (a List or one slice); raises :class:`ResourceSliceError`."""
    if not isinstance(document, dict):
        raise ResourceSliceError(["resource slices: not a JSON object; allowed: kubectl get resourceslices -o json"])
    if document.get("kind") == "ResourceSlice":
        items = [document]
    elif isinstance(document.get("items"), list):
        items = document["items"]
    else:
        raise ResourceSliceError(["resource slices: kind %r without items; allowed: a ResourceSliceList or List "
                                  "(kubectl get resourceslices -o json) or one ResourceSlice" % (document.get("kind"),)])
    problems = []
    for index, item in enumerate(items):
        spec = item.get("spec") if isinstance(item, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("driver"), str):
            problems.append("resource slices: items[%d].spec.driver is missing; allowed: ResourceSlice objects" % index)
        elif not isinstance(spec.get("devices", []), list):
            problems.append("resource slices: items[%d].spec.devices is not a list" % index)
        else:
            problems.extend("resource slices: items[%d].spec.devices[%d] is %s, not a device mapping"
                            % (index, pos, type(device).__name__)
                            for pos, device in enumerate(spec.get("devices") or []) if not isinstance(device, dict))
    if problems:
        raise ResourceSliceError(problems)
    return items


def _finding(severity, message, device=None, expected=None, actual=None):
    return {"severity": severity, "message": message, "device": device, "expected": expected, "actual": actual}


def _gpu_index(topology):
    by_uuid, by_bus = {}, {}
    for gpu in topology.get("gpus") or []:
        if gpu.get("uuid"):
            by_uuid[str(gpu["uuid"])] = gpu
        bus = _bus_id(gpu.get("pci_bus_id"))
        if bus:
            by_bus[bus] = gpu
    return by_uuid, by_bus


def resource_slice_findings(document, topology, node_name, gpu_drivers=DRA_GPU_DRIVERS):
    """Findings (``severity``, ``message``, ``device``, ``expected``, ``actual``) for ``node_name``'s GPU devices."""
    by_uuid, by_bus = _gpu_index(topology)
    findings = []
    seen = set()
    roots = {}
    node_slices = [s for s in slices(document)
                   if (s.get("spec") or {}).get("nodeName") == node_name and s["spec"]["driver"] in gpu_drivers]
    if not node_slices:
        return [_finding("info", "no ResourceSlice of %s publishes GPUs of node %s (device plugins, or no DRA driver)"
                         % (" or ".join(gpu_drivers), node_name))]
    for item in node_slices:
        driver = item["spec"]["driver"]
        for device in item["spec"].get("devices") or []:
            attributes = device.get("attributes") if isinstance(device.get("attributes"), dict) else {}
            label = "%s/%s" % (driver, device.get("name"))
            if str(_attr(attributes, "type", driver) or "gpu") not in ("gpu", "mig"):
                continue
            uuid = _attr(attributes, "parentUUID", driver) or _attr(attributes, "uuid", driver)
            gpu = by_uuid.get(str(uuid)) or by_bus.get(_bus_id(_attr(attributes, PCI_BUS_ID, driver)))
            if gpu is None:
                findings.append(_finding("warning", "%s (uuid %s, pciBusID %s) is not a GPU gpunuma discovered on %s"
                                         % (label, uuid, _attr(attributes, PCI_BUS_ID, driver), node_name), label))
                continue
            seen.add(gpu.get("pci_bus_id"))
            findings.extend(_numa_findings(label, attributes, driver, gpu))
            root = _attr(attributes, PCIE_ROOT, driver)
            if root is None:
                findings.append(_finding("info", "%s publishes no pcieRoot: claims cannot pair it with a NIC by "
                                         "pcieRoot" % label, label))
            else:
                for one in root if isinstance(root, list) else [root]:
                    roots.setdefault(str(one), {})[label] = gpu.get("numa_node")
    for root, members in sorted(roots.items()):
        nodes = sorted(set(n for n in members.values() if n is not None))
        if len(nodes) > 1:
            findings.append(_finding("warning", "pcieRoot %s is published for %s, which sit on NUMA nodes %s: a "
                                     "pcieRoot constraint would pair devices across nodes"
                                     % (root, ", ".join(sorted(members)), ", ".join(str(n) for n in nodes)),
                                     None, None, root))
    for gpu in topology.get("gpus") or []:
        if gpu.get("pci_bus_id") not in seen:
            findings.append(_finding("info", "GPU %s (%s) is in no ResourceSlice of %s" % (
                gpu.get("index"), gpu.get("pci_bus_id"), node_name), None, gpu.get("pci_bus_id")))
    return findings


def _numa_findings(label, attributes, driver, gpu):
    want = gpu.get("numa_node")
    got = _attr(attributes, NUMA_NODE, driver)
    if got is None:
        if want is None:
            return []
        return [_finding("warning", "%s publishes no numaNode, but the GPU is on NUMA node %s: a claim's "
                         "matchAttribute on numaNode cannot align it" % (label, want), label, want, None)]
    listed = got if isinstance(got, list) else [got]
    odd = [n for n in listed if isinstance(n, bool) or not isinstance(n, int)]
    if odd:
        # true is no node 1: a value that is no node number aligns nothing.
        return [_finding("error", "%s publishes numaNode %s, which is not a NUMA node number (an integer): a claim "
                         "matching numaNode cannot align it" % (label, json.dumps(got, default=str)[:60]),
                         label, want, got)]
    if want is None:
        return [_finding("warning", "%s publishes numaNode %s, but the kernel reports no NUMA node for the GPU"
                         % (label, got), label, None, got)]
    if want in listed:
        return []
    memory_node = gpu.get("gpu_numa_id")
    if memory_node is not None and memory_node in listed:
        return [_finding("error", "%s publishes numaNode %s, the GPU's own memory node, not its CPU node %s "
                         "(dra-driver-nvidia-gpu#1242): a claim matching numaNode with CPUs or a NIC never matches"
                         % (label, got, want), label, want, got)]
    return [_finding("error", "%s publishes numaNode %s, but gpunuma found the GPU on NUMA node %s"
                     % (label, got, want), label, want, got)]
