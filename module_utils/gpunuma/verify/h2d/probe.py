"""Host-to-device probe through the CUDA driver API (``libcuda.so.1``) or HIP (``libamdhip64.so``) with ctypes.

No PyTorch, no CUDA toolkit: every NVIDIA driver installs ``libcuda.so.1``.
Each (GPU, placement) pair is measured in a forked child process that first
binds itself (``sched_setaffinity`` + ``set_mempolicy``), verifies the
binding from ``/proc/self/status`` and ``get_mempolicy``, then initialises
CUDA and measures.  The parent never initialises CUDA, so forking is safe,
and whatever a child allocated is gone when it exits even if it crashed.

Copies are timed with CUDA events on a dedicated non-blocking stream after
warm-up, like NVIDIA's ``bandwidthTest``/``nvbandwidth``; pageable copies
are timed on the wall clock around copy + stream synchronise, because the
driver stages pageable memory on the CPU before the DMA starts.

Result schema: ``gpunuma.h2d-probe/v1`` (docs/probe.md).
"""

from __future__ import annotations

import platform
import time

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist
from ansible.module_utils.gpunuma.verify.h2d import load as h2d_load
from ansible.module_utils.gpunuma.verify.h2d.cuda import CUDA_ERROR_INSUFFICIENT_DRIVER, DriverMissing
from ansible.module_utils.gpunuma.verify.h2d.hip import open_runtime
from ansible.module_utils.gpunuma.verify.h2d.host import choose_remote, gpu_numa_node, pcie_link, read_numa_nodes
# The probe's parts: options, one placement's measurement, rounds in child processes.
from ansible.module_utils.gpunuma.verify.h2d.options import SCHEMA, check_options
from ansible.module_utils.gpunuma.verify.h2d.rounds import (
    _enumerate_child, _library, _measure_rounds, run_in_child, select_gpus)


def probe(options, root="/", nvml=None, hostname=None):
    """Probe every selected GPU in every placement. Returns a ``gpunuma.h2d-probe/v1`` dict."""
    opts = check_options(options)
    started = time.time()
    report = {"schema": SCHEMA, "hostname": hostname or platform.node(), "status": "ok", "reason": None,
              "options": {k: opts[k] for k in ("placements", "large_bytes", "small_bytes", "repeats",
                                               "small_repeats", "warmup", "rounds", "warmup_round", "pinned_alloc",
                                               "load")},
              "driver_version": None, "numa_nodes": {}, "gpus": []}
    nodes = read_numa_nodes(root)
    report["numa_nodes"] = {str(n): {"cpus": format_cpulist(nodes[n]["cpus"]), "distances": nodes[n]["distances"]}
                            for n in sorted(nodes)}
    try:
        runtime = open_runtime(_library(opts)).kind  # load test only: the parent never calls cuInit
    except DriverMissing as exc:
        report.update(status="skipped", reason=str(exc))
        return report
    report["runtime"] = runtime
    what = "the CUDA driver" if runtime == "cuda" else "the HIP runtime"
    listing = run_in_child(_enumerate_child, (_library(opts),), opts["timeout_s"])
    if "ok" not in listing:
        err = listing.get("cuda_error")
        if err:
            report.update(status="skipped" if err["code"] in (CUDA_ERROR_INSUFFICIENT_DRIVER,) else "error",
                          reason="%s could not list GPUs: %s failed with %s (%d): %s" % (
                              what, err["call"], err["name"], err["code"], err["text"]))
        else:
            report.update(status="error", reason="%s could not list GPUs: %s" % (what, listing["error"]))
        return report
    report["driver_version"] = listing["ok"]["driver_version"]
    if not listing["ok"]["gpus"]:
        report.update(status="skipped", reason="no %s GPU on this node (%s reports none)"
                      % ("NVIDIA" if runtime == "cuda" else "AMD", what))
        return report
    gpus = select_gpus(listing["ok"]["gpus"], opts["gpus"])
    if opts["load"] == "idle":
        report["load"] = {"kind": "idle"}
        _probe_gpus(report, gpus, nodes, opts, root, nvml)
    else:
        first = gpu_numa_node(gpus[0]["pci_bus_id"], nodes, root)[0] if gpus else None
        memory_node = opts["load_memory_node"]
        if memory_node is None and first is not None:
            far = choose_remote(first, nodes, None)
            memory_node = first if far is None else far
        cpus = opts["load_cpus"] or (sorted(nodes[memory_node]["cpus"]) if memory_node in nodes else None)
        with h2d_load.Load(opts["load"], [g["index"] for g in gpus], _library(opts), memory_node, cpus,
                           opts["load_memory_workers"], opts["load_max_seconds"]) as load:
            _probe_gpus(report, gpus, nodes, opts, root, nvml)
        report["load"] = load.describe()
    statuses = {g["status"] for g in report["gpus"]}
    if "error" in statuses:
        report["status"] = "error"
        report["reason"] = "; ".join(g["reason"] for g in report["gpus"] if g["status"] == "error")
    elif statuses == {"skipped"}:
        report["status"] = "skipped"
        report["reason"] = "; ".join(g["reason"] for g in report["gpus"])
    report["seconds"] = round(time.time() - started, 3)
    return report


def _probe_gpus(report, gpus, nodes, opts, root, nvml):
    """Measure every GPU of ``gpus`` in every placement into ``report["gpus"]``."""
    for gpu in gpus:
        entry = dict(gpu)
        node, how = gpu_numa_node(gpu["pci_bus_id"], nodes, root)
        entry.update(numa_node=node, numa_node_source=how, pcie=pcie_link(gpu["pci_bus_id"], nvml, root),
                     status="ok", reason=None, placements={})
        remote = choose_remote(node, nodes, opts["remote_node"])
        entry["remote_node"] = remote
        if gpu.get("compute_mode") == "prohibited":
            entry.update(status="skipped", reason="GPU %d (%s, %s) is in compute mode Prohibited: no process may use it"
                         % (gpu["index"], gpu["uuid"], gpu["pci_bus_id"]))
            report["gpus"].append(entry)
            continue
        targets = {}
        for placement in opts["placements"]:
            if placement == "local":
                if node is None:
                    entry["placements"][placement] = {"status": "skipped", "reason": "the GPU's NUMA node is unknown"}
                    continue
                cpus, mems = sorted(nodes[node]["cpus"]), [node]
            elif placement == "remote":
                if remote is None:
                    entry["placements"][placement] = {"status": "skipped",
                                                      "reason": "no other CPU-bearing NUMA node on this host"}
                    continue
                cpus, mems = sorted(nodes[remote]["cpus"]), [remote]
            else:
                cpus, mems = None, None
            targets[placement] = (cpus, mems)
        _measure_rounds(gpu, entry, targets, opts)
        report["gpus"].append(entry)
