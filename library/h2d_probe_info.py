#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# gpunuma: host-to-device copy probe through the CUDA driver API.
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: h2d_probe_info
short_description: Measure host-to-device copy bandwidth and latency per GPU, bound and unbound
description:
  - Measures, per GPU (NVIDIA, or AMD through HIP) and per placement, the bandwidth of large host-to-device copies from
    pinned and from pageable memory, of device-to-host copies to pinned memory, and the latency
    distribution (p50, p99, max) of small pinned host-to-device copies.
  - Uses the CUDA driver API in C(libcuda.so.1) through ctypes, or on AMD nodes the HIP runtime in
    C(libamdhip64.so) (O(runtime)); needs neither PyTorch nor a CUDA toolkit on the node.
  - Each placement runs in its own child process - C(local) binds CPUs and memory to the GPU's NUMA
    node, C(remote) to another CPU-bearing node (the farthest by SLIT distance, or O(remote_node)),
    C(unbound) changes nothing. The binding is read back from C(/proc/self/status) and
    C(get_mempolicy), and the buffers' pages from C(move_pages); all are reported.
  - Pinned and device copies are timed with CUDA events on a dedicated non-blocking stream after
    O(warmup) copies; pageable copies on the wall clock around copy and stream synchronise.
  - No driver, no GPU, or every GPU busy (exclusive-process compute mode held by another process)
    returns RV(probe.status=skipped) with the reason; a busy GPU among others is skipped by name.
    A CUDA failure on a GPU (allocation, copy) fails the task with the GPU's index, UUID, PCI bus
    id, the CUDA call and its error; the child process that failed is gone, so nothing stays allocated.
version_added: "0.2.0"
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpunuma_attributes
author: gpunuma maintainers (@gpunuma)
options:
  gpus:
    description: GPUs to probe, by index (PCI bus order), UUID or PCI bus id. All when omitted.
    type: list
    elements: str
  placements:
    description: Placements to measure (any of C(local), C(remote), C(unbound)).
    type: list
    elements: str
    default: [local, remote, unbound]
  large_bytes:
    description: Size of the large copies (bandwidth), in bytes.
    type: int
    default: 268435456
  small_bytes:
    description: Size of the small copies (latency), in bytes.
    type: int
    default: 4096
  repeats:
    description: Timed large copies per kind and placement; the median and best are reported.
    type: int
    default: 10
  small_repeats:
    description: Timed small copies per placement (each event-timed), and the length of the back-to-back loop.
    type: int
    default: 1000
  warmup:
    description: Untimed copies before each timed series.
    type: int
    default: 3
  rounds:
    description:
      - Rounds per placement, interleaved (local, remote, unbound; then remote, unbound, local; ...), each in
        a fresh child process. Every round adds one figure per metric to the placement's C(rounds); the
        verdict compares these (docs/probe.md). At least 4 are needed for a verdict at the default alpha 0.05.
    type: int
    default: 5
  warmup_round:
    description: Measure every placement once before the rounds and discard it (first-touch and clock ramp-up).
    type: bool
    default: true
  pinned_alloc:
    description:
      - How pinned host memory is made. C(register) maps anonymous memory, touches it under the
        placement's memory policy and pins it with C(cuMemHostRegister), so its NUMA node is the
        placement's and can be verified. C(host_alloc) uses C(cuMemHostAlloc).
    type: str
    choices: [register, host_alloc]
    default: register
  remote_node:
    description: NUMA node for the C(remote) placement instead of the farthest CPU-bearing node.
    type: int
  timeout_s:
    description: Seconds one GPU placement may take before its process is killed and the GPU reported as failed.
    type: int
    default: 120
  libcuda_path:
    description: The CUDA driver library to load (a test stand-in, or a driver outside the loader path).
    type: str
    default: libcuda.so.1
  runtime:
    description:
      - The GPU runtime to measure with - C(cuda) (the CUDA driver API), C(hip) (ROCm's HIP runtime, AMD GPUs;
        same copies, events, placements and statistics), or C(auto), CUDA where O(libcuda_path) loads, else HIP.
      - On a node with both vendors, C(auto) measures the NVIDIA GPUs; run again with C(hip) for the AMD ones.
    type: str
    choices: [auto, cuda, hip]
    default: auto
  libhip_path:
    description: The HIP runtime library to load with O(runtime) C(hip) or C(auto).
    type: str
    default: libamdhip64.so
  load:
    description:
      - Load while measuring (module_utils/gpunuma/verify/h2d/load.py, docs/probe.md) - C(idle); C(copies), every
        probed GPU copying host to device at once from a pinned buffer, one process each; C(memory),
        O(load_memory_workers) DRAM copy loops bound to O(load_memory_node) (default the node farthest from the
        first GPU); C(both). The stressors are confined to O(load_cpus), stop themselves after
        O(load_max_seconds), die with the probe, and are always stopped when it has measured; the result's
        C(load) says what ran and the GB/s each achieved.
    type: str
    choices: [idle, copies, memory, both]
    default: idle
  load_memory_workers:
    description: Memory stressors (processes) for O(load) C(memory) and C(both).
    type: int
    default: 4
  load_max_seconds:
    description: The longest a stressor runs, whatever happens to the probe.
    type: int
    default: 900
  load_memory_node:
    description: NUMA node the memory stressors' buffers are bound to (default the node farthest from the first GPU).
    type: int
  load_cpus:
    description:
      - CPUs the stressors run on, as a CPU list (C(0-3,64-67)). Default the housekeeping CPUs of the applied plan
        (O(plan_path), the CPUs the plan gives non-instance work), else the memory node's CPUs.
    type: str
  allow_busy:
    description:
      - Load a node whose gpunuma instances are running (an active C(gpunuma-*.service)). Off by default - the
        stressors would slow the instances, and the instances would load the measurement - so such a node is
        refused, naming its running units.
    type: bool
    default: false
  plan_path:
    description: The applied plan, read for its housekeeping CPUs when O(load) is not C(idle).
    type: path
    default: /etc/gpunuma/plan.json
  output:
    description: Also write the result as JSON to this path on the node (mode 0644, atomically). Not written in check mode.
    type: path
notes:
  - A probe takes a few seconds per GPU with the defaults and allocates O(large_bytes) on the GPU and
    about twice that in host memory; inference workers on the GPU are not stopped, so run it before
    they start or expect their traffic in the numbers.
  - PCIe generation and width come from NVML (C(nvidia-ml-py)) when it imports, else from sysfs.
seealso:
  - name: gpunuma probe documentation
    description: Every field of C(gpunuma.h2d-probe/v1).
    link: https://github.com/gpunuma/gpunuma/blob/main/docs/probe.md
"""

EXAMPLES = r"""
- name: Probe every GPU in every placement
  gpunuma.fleet.h2d_probe_info:
  register: h2d

- name: Quick probe of GPU 0, unbound only, and keep the result on the node
  gpunuma.fleet.h2d_probe_info:
    gpus: ["0"]
    placements: [unbound]
    large_bytes: 67108864
    output: /var/lib/gpunuma/h2d-probe.json
"""

RETURN = r"""
probe:
  description: The measurements (C(gpunuma.h2d-probe/v1)); see docs/probe.md.
  returned: always
  type: dict
  contains:
    schema:
      description: Always C(gpunuma.h2d-probe/v1).
      type: str
    status:
      description: C(ok), C(skipped) (no driver, no GPU, all GPUs busy) or C(error).
      type: str
    reason:
      description: Why the probe was skipped or failed; null when ok.
      type: str
    runtime:
      description: C(cuda) or C(hip), the runtime measured with; absent when no runtime library loads.
      type: str
    gpus:
      description: One entry per probed GPU with C(index), C(uuid), C(pci_bus_id), C(numa_node), C(pcie), C(status) and C(placements).
      type: list
      elements: dict
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpunuma.common import commands
from ansible.module_utils.gpunuma.common import atomic, documents, node_paths
from ansible.module_utils.gpunuma.common.cpulist import parse_cpulist
from ansible.module_utils.gpunuma.plan import state as statelib
from ansible.module_utils.gpunuma.verify.h2d import probe as h2d
from ansible.module_utils.gpunuma.verify.h2d import hip as h2d_hip
from ansible.module_utils.gpunuma.verify.h2d import options as h2d_options
from ansible.module_utils.gpunuma.verify.h2d import load as h2d_load
from ansible.module_utils.gpunuma.common.errors import GpunumaError


def _load_cpus(module):
    """The stressors' CPUs: O(load_cpus), else the applied plan's housekeeping CPUs, else None (the probe's
    default: the memory node's CPUs)."""
    text = module.params["load_cpus"]
    if text is None:
        # The reader of the applied plan the state step uses (bounded, a regular file), checked by its schema.
        raw = statelib.read_text(module.params["plan_path"])
        plan = documents.load_text(documents.Plan, raw, module.params["plan_path"])[0] if isinstance(raw, str) else None
        housekeeping = plan.data.get("housekeeping") if plan is not None else None
        text = ",".join(v for v in (housekeeping or {}).values() if isinstance(v, str) and v) or None
        if text is None:
            return None
    try:
        return sorted(parse_cpulist(text))
    except ValueError as exc:
        module.fail_json(msg="load_cpus: %r is not a CPU list such as 0-3,64-67 (%s)" % (text, exc))


def _running_instances(module):
    """The gpunuma instance units running on the node."""
    rc, out, _unused = commands.runner(module)(["systemctl", "list-units", "--type=service",
                                                "--state=active,activating,reloading", "--no-legend", "--plain",
                                                "gpunuma-*.service"])
    return sorted(line.split()[0] for line in out.splitlines() if line.strip()) if rc == 0 else []


def _nvml():
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


ARGUMENT_SPEC = dict(
    gpus=dict(type="list", elements="str"),
    placements=dict(type="list", elements="str", default=list(h2d_options.PLACEMENTS)),
    large_bytes=dict(type="int", default=h2d_options.DEFAULTS["large_bytes"]),
    small_bytes=dict(type="int", default=h2d_options.DEFAULTS["small_bytes"]),
    repeats=dict(type="int", default=h2d_options.DEFAULTS["repeats"]),
    small_repeats=dict(type="int", default=h2d_options.DEFAULTS["small_repeats"]),
    warmup=dict(type="int", default=h2d_options.DEFAULTS["warmup"]),
    rounds=dict(type="int", default=h2d_options.DEFAULTS["rounds"]),
    warmup_round=dict(type="bool", default=h2d_options.DEFAULTS["warmup_round"]),
    pinned_alloc=dict(type="str", default="register", choices=list(h2d_options.PINNED_ALLOCS)),
    remote_node=dict(type="int"),
    timeout_s=dict(type="int", default=h2d_options.DEFAULTS["timeout_s"]),
    libcuda_path=dict(type="str", default="libcuda.so.1"),
    runtime=dict(type="str", default="auto", choices=list(h2d_hip.RUNTIMES)),
    libhip_path=dict(type="str", default=h2d_options.DEFAULTS["libhip_path"]),
    load=dict(type="str", default="idle", choices=list(h2d_load.LOADS)),
    load_memory_workers=dict(type="int", default=h2d_load.DEFAULT_MEMORY_WORKERS),
    load_max_seconds=dict(type="int", default=h2d_load.DEFAULT_MAX_SECONDS),
    load_memory_node=dict(type="int"),
    load_cpus=dict(type="str"),
    allow_busy=dict(type="bool", default=False),
    plan_path=dict(type="path", default=node_paths.PLAN),
    output=dict(type="path"),
)


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        supports_check_mode=True,
    )
    params = {k: v for k, v in module.params.items() if k not in ("output", "allow_busy", "plan_path")}
    if params["load"] != "idle":
        params["load_cpus"] = _load_cpus(module)
        busy = _running_instances(module)
        if busy and not module.params["allow_busy"]:
            module.fail_json(msg="load %s would load a node whose gpunuma instances are running (%s): the stressors "
                                 "would slow them and they would load the measurement; validate a drained node, or "
                                 "set gpu_validate_allow_busy: true" % (params["load"], ", ".join(busy)))
    else:
        params["load_cpus"] = None
    if params["gpus"] is not None:
        params["gpus"] = [int(g) if g.isdigit() else g for g in params["gpus"]]
    try:
        h2d_options.check_options(params)
    except GpunumaError as exc:
        module.fail_json(msg=str(exc))
    nvml = _nvml()
    try:
        result = h2d.probe(params, nvml=nvml)
    except GpunumaError as exc:
        module.fail_json(msg=str(exc))
    finally:
        if nvml is not None:
            try:
                nvml.nvmlShutdown()
            except Exception:
                pass
    if module.params["output"] and not module.check_mode:
        path = module.params["output"]
        directory = os.path.dirname(path) or "."
        try:
            atomic.write_atomic(path, json.dumps(result, indent=1, sort_keys=True), 0o644, prefix=".h2d-probe.")
        except OSError as exc:
            module.fail_json(msg="cannot write output %s: %s" % (path, exc), probe=result)
    if result["status"] == "error":
        module.fail_json(msg=result["reason"], probe=result)
    module.exit_json(changed=False, probe=result)


if __name__ == "__main__":
    main()
