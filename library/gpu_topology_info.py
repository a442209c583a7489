#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# gpunuma: GPU <-> NUMA <-> NIC topology discovery.
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_topology_info
short_description: Discover which CPUs, memory and NICs each GPU is close to
description:
  - Builds a C(gpunuma.topology/v1) document for one node, listing its NUMA nodes (CPUs, memory,
    distances, hyperthread sibling groups), its NVIDIA GPUs with the CPU-bearing NUMA node
    each one should be bound to, the GPU x GPU and GPU x NIC link matrices, and the NICs
    and NVMe controllers with their NUMA nodes.
  - Sources are tried in order of trust, each optional; which ones contributed is returned
    in RV(topology.sources) and every problem in RV(topology.warnings).
    NVML (the C(nvidia-ml-py) package) gives GPU identity, CPU affinity, NUMA id and links;
    C(nvidia-smi topo -m) gives links, affinities and NIC names when NVML is missing;
    sysfs (C(/sys/devices/system/node), C(/sys/bus/pci/devices)) gives NUMA nodes, PCI
    placement, NICs and NVMe.
  - A GPU's binding node comes from the NVML NUMA id, else sysfs C(numa_node), else the
    nvidia-smi NUMA affinity, else the node whose CPUs hold the GPU's CPU affinity (sysfs
    C(numa_node) is -1 in many VMs). A CPU-less node (Grace HBM) is never the binding node;
    it is reported as the GPU's C(gpu_numa_id) (in each of RV(topology.gpus)).
  - A node without GPUs returns C(gpus=[]); that is not an error.
  - Every file discovery reads is bounded. sysfs and procfs attributes must be regular files (a FIFO, a
    socket, a device node or a symbolic link such as one to C(/dev/zero) is refused without being opened)
    of at most 64 KiB (a sysfs attribute holds at most one page, 64 KiB on arm64 with 64K pages). The
    files a user names may be symbolic links to regular files outside C(/dev), of at most 1 MiB
    (O(nvidia_smi_topo_file)), 2 MiB (O(lscpu_file)) and 16 MiB (O(nvml_dump)).
  - Files that define NUMA nodes and hyperthread siblings (C(node<N>/cpulist), C(cpu<N>/topology/*)) fail
    the task, naming the file, when unreadable or malformed; PCI attributes, node C(meminfo) and
    C(distance), C(numa_balancing) degrade to a warning naming the file. Any such loss makes
    RV(topology.complete) false.
  - Offline inputs make the same discovery run anywhere - O(sysfs_root), O(nvidia_smi_topo_file),
    O(nvml_dump) - for support bundles, tests and CI.
version_added: "0.1.0"
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpunuma_attributes
author: gpunuma maintainers (@gpunuma)
options:
  node_info:
    description:
      - A node read made in the same round trip, after the discovery, with the options of
        M(gpunuma.fleet.gpunuma_node_info) (C(files), C(paths), C(units), C(inspect_units), C(commands),
        C(pid1_proc_dir), C(programs), C(accounts), C(autonuma)), checked as that module checks them (a bad one
        fails the task naming C(node_info.<option>)). Returns RV(gpunuma_node). Read on the host the module
        runs on.
    type: dict
  read_files:
    description:
      - Files to read in the same round trip, as a mapping of a name to a path (e.g. the persisted
        C(/etc/gpunuma/topology.json)); returns C(files.<name>) with C(exists), and C(content) (base64, as slurp
        returns it) or C(problem). Read on the host the module runs on.
    type: dict
  sysfs_root:
    description:
      - Directory holding C(sys/) and C(proc/) to read instead of the live host (a support
        bundle or a test tree). When set, live NVML and nvidia-smi are not queried.
    type: path
  nvidia_smi_topo_file:
    description:
      - A saved C(nvidia-smi topo -m) output. Given alone (without O(sysfs_root) or
        O(nvml_dump)), the topology is built from that text only and nothing local is read.
    type: path
  amd_smi_topology_file:
    description:
      - A saved C(amd-smi topology --json) output of the node, read with sysfs (live or O(sysfs_root)) for the
        XGMI links of its AMD GPUs, matched by bus id. Takes precedence over O(rocm_smi_topo_file).
      - Live, without it, C(amd-smi topology --json) and then C(rocm-smi --showtopo --json) are run on nodes with
        AMD GPUs (per O(sources)); the KFD topology in sysfs gives partitions and links without either tool.
    type: path
  rocm_smi_topo_file:
    description:
      - A saved C(rocm-smi --showtopo) output (text or C(--json), or any of its C(--showtopoweight),
        C(--showtopotype), C(--showtoponuma) sections) for the AMD GPUs' links and NUMA nodes; its C(GPU[i])
        are the node's AMD GPUs in ROCm's order.
    type: path
  lscpu_file:
    description:
      - A saved C(lscpu) output of the same machine, read with O(nvidia_smi_topo_file) alone (the topo text
        lists only the NUMA nodes of its GPUs and no hyperthread siblings nor L3 caches). C(lscpu -p=CPU,CORE,SOCKET,NODE,CACHE)
        and C(lscpu -e) give every node, the siblings and the L3 domains; the C(lscpu) summary gives the nodes
        and sockets only.
      - Without it, the nodes a topo text leaves out are inferred from the CPU ids it leaves out where exactly
        one reading fits (with a warning), else those CPUs are returned as RV(topology.unplaced_cpus) and the
        planner binds no CPUs (docs/topology-v1.md).
    type: path
  nvml_dump:
    description:
      - A recorded NVML dump (C(gpunuma.nvml-dump/v1), see O(record_nvml_dump)) replayed instead of
        live NVML.
      - The dump is checked field by field before it is used (bus ids in full domain form, C(GPU-) UUIDs
        without control characters, unique bus ids and UUIDs, NUMA ids, affinity words that fit
        C(cpu_word_bits) of 32 or 64, object and list shapes); the task fails listing every problem with its
        field path, for example C(gpus[3].pci_bus_id), what was found and what is allowed.
    type: path
  record_nvml_dump:
    description:
      - Query NVML live on the node and write the dump to this path (mode 0644), so it can be
        replayed elsewhere with O(nvml_dump). Not written in check mode.
    type: path
  sources:
    description:
      - Which sources may be used. Removing one skips it (for example C(nvml) on a node where
        the driver is being upgraded).
    type: list
    elements: str
    choices: [nvml, nvidia_smi, sysfs, amd_smi, rocm_smi]
    default: [nvml, nvidia_smi, sysfs, amd_smi, rocm_smi]
  nvidia_smi_path:
    description: Path to C(nvidia-smi); by default it is looked up on C(PATH).
    type: path
  hostname:
    description: Name recorded in the topology; defaults to the node's host name.
    type: str
notes:
  - Needs no GPU; a node without NVIDIA or AMD Instinct GPUs returns an empty C(gpus) list.
  - AMD GPUs (docs/amd.md) come from sysfs and the KFD topology (partitions, XGMI links), with C(amd-smi) or
    C(rocm-smi) output where present; XGMI pairs are written C(XGMI<hops>) in RV(topology.gpu_links).
  - NVML is used only when the C(pynvml) module (package C(nvidia-ml-py)) imports on the node.
seealso:
  - name: gpunuma topology contract
    description: Every field of C(gpunuma.topology/v1).
    link: https://github.com/gpunuma/gpunuma/blob/main/docs/topology-v1.md
"""

EXAMPLES = r"""
- name: Discover the live topology
  gpunuma.fleet.gpu_topology_info:
  register: topo

- name: Bind to the node of GPU 0
  ansible.builtin.debug:
    msg: "GPU 0 sits on NUMA node {{ topo.topology.gpus[0].numa_node }}"

- name: Parse a pasted nvidia-smi topo -m output (nothing local is read)
  gpunuma.fleet.gpu_topology_info:
    nvidia_smi_topo_file: /tmp/topo.txt
  delegate_to: localhost

- name: Record NVML on a GPU node for later replay
  gpunuma.fleet.gpu_topology_info:
    record_nvml_dump: /var/tmp/nvml-dump.json

- name: Replay a support bundle
  gpunuma.fleet.gpu_topology_info:
    sysfs_root: /srv/bundles/gpu-a01
    nvml_dump: /srv/bundles/gpu-a01/nvml-dump.json
    hostname: gpu-a01
"""

RETURN = r"""
gpunuma_node:
  description: The node read asked for in O(node_info), as M(gpunuma.fleet.gpunuma_node_info) returns it.
  returned: when O(node_info) is set
  type: dict
topology:
  description: The node's topology (C(gpunuma.topology/v1)); see docs/topology-v1.md for every field.
  returned: success
  type: dict
  contains:
    schema:
      description: Always C(gpunuma.topology/v1).
      type: str
    hostname:
      description: The node.
      type: str
    fingerprint:
      description: C(sha256:) hash of the hardware layout only (nodes, CPUs, GPU placement, links, NICs, driver major).
      type: str
    sources:
      description: Which of C(nvml), C(nvidia_smi), C(sysfs) contributed.
      type: list
      elements: str
    warnings:
      description: Every problem met, with the fallback taken.
      type: list
      elements: str
    complete:
      description: >-
        True only when nothing was lost. False when a source failed and what it would have given is missing
        (NVML failing while GPUs are visible), or when a sysfs file or directory exists but could not be read
        or held a malformed value (a GPU whose C(class) holds binary bytes, a symlink loop in
        C(bus/pci/devices), an unreadable C(numa_node)); a warning then names each path.
      type: bool
    numa_nodes:
      description: C(id), C(cpus) (canonical list), C(has_cpus), C(memory_total_bytes), C(memory_free_bytes), C(distances), C(cores).
      type: list
      elements: dict
    gpus:
      description: >-
        Ordered by index: C(index), C(uuid), C(name), C(pci_bus_id), C(cpu_affinity), C(numa_affinity),
        C(gpu_numa_id), C(numa_node), C(numa_node_source), C(pcie), C(mig_enabled), C(memory_total_bytes).
      type: list
      elements: dict
    unplaced_cpus:
      description:
        - CPUs the sources name but place on no NUMA node (a text-only reading that fits no layout).
        - The planner refuses CPU binding while any are listed.
      type: str
      sample: "64-127"
    gpu_links:
      description: GPU x GPU link codes (C(X), C(NV#), C(PIX), C(PXB), C(PHB), C(NODE), C(SYS)).
      type: list
      elements: list
    nics:
      description: C(name), C(netdevs), C(pci_bus_id), C(numa_node).
      type: list
      elements: dict
    gpu_nic_links:
      description: One row per GPU, one column per NIC.
      type: list
      elements: list
    nvme:
      description: C(name), C(pci_bus_id), C(numa_node).
      type: list
      elements: dict
    numa_balancing:
      description: The live C(kernel.numa_balancing), or null.
      type: int
    driver_version:
      description: NVIDIA driver version, or null.
      type: str
  sample:
    schema: gpunuma.topology/v1
    hostname: gpu-a01
    sources: [nvml, sysfs]
    gpus:
      - index: 0
        pci_bus_id: "0000:18:00.0"
        numa_node: 0
        numa_node_source: nvml
nvml_dump_path:
  description: Where the NVML dump was written, when O(record_nvml_dump) was given and not in check mode.
  returned: when recorded
  type: str
"""

import json
import os
import traceback

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpunuma.discovery.module_run import discover_with
from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.node.probe import node_read_params, probe_with, read_file


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type="path"),
            nvidia_smi_topo_file=dict(type="path"),
            lscpu_file=dict(type="path"),
            nvml_dump=dict(type="path"),
            record_nvml_dump=dict(type="path"),
            amd_smi_topology_file=dict(type="path"),
            rocm_smi_topo_file=dict(type="path"),
            sources=dict(type="list", elements="str", choices=["nvml", "nvidia_smi", "sysfs", "amd_smi", "rocm_smi"],
                         default=["nvml", "nvidia_smi", "sysfs", "amd_smi", "rocm_smi"]),
            nvidia_smi_path=dict(type="path"),
            hostname=dict(type="str"),
            read_files=dict(type="dict"),
            node_info=dict(type="dict"),
        ),
        mutually_exclusive=[("nvml_dump", "record_nvml_dump")],
        supports_check_mode=True,
    )
    params = module.params
    node_info = None
    if params["node_info"] is not None:
        node_info = node_read_params(params["node_info"])
        if isinstance(node_info, str):
            module.fail_json(msg=node_info)

    try:
        result = discover_with(module, params)
    except GpunumaError as exc:
        module.fail_json(msg=str(exc))
    except Exception as exc:  # a defect: still a task failure with a message, not a module crash
        module.fail_json(msg="gpu_topology_info failed unexpectedly (%s: %s); this is a gpunuma bug, please report "
                         "it with the inputs" % (type(exc).__name__, exc), exception=traceback.format_exc())

    out = dict(changed=False, topology=result["topology"])
    if params["read_files"]:
        # In the same round trip: files the caller compares with the discovery
        # (the persisted inventory), as gpunuma_node_info returns them.
        out["files"] = dict((name, read_file(path)) for name, path in params["read_files"].items())
    if node_info is not None:
        out["gpunuma_node"] = probe_with(module, node_info)
    dest = params["record_nvml_dump"]
    if dest:
        dump = result.get("nvml_dump")
        if dump is None:
            module.fail_json(msg="record_nvml_dump=%s: NVML could not be queried on this node: %s"
                             % (dest, result.get("nvml_error") or "not attempted"), topology=result["topology"])
        if not module.check_mode:
            tmp = dest + ".tmp"
            try:
                with open(tmp, "w") as handle:
                    json.dump(dump, handle, indent=1, sort_keys=True)
                    handle.write("\n")
                os.chmod(tmp, 0o644)
                module.atomic_move(tmp, dest)
            except (IOError, OSError) as exc:
                module.fail_json(msg="record_nvml_dump=%s cannot be written: %s" % (dest, exc))
            out["nvml_dump_path"] = dest
            out["changed"] = True
    module.exit_json(**out)


if __name__ == "__main__":
    main()
