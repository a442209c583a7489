"""Placements measured in child processes, in interleaved rounds, and the GPUs a probe selects (verify/h2d/probe.py)."""

from __future__ import annotations

import json
import os
import select
import signal
import time

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, parse_cpulist
from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.verify.h2d.cuda import (
    BUSY_CODES, CUDA_ERROR_NO_DEVICE, CudaError)
from ansible.module_utils.gpunuma.verify.h2d.hip import open_runtime
from ansible.module_utils.gpunuma.verify.h2d.host import (
    MPOL_BIND, MPOL_DEFAULT, ProbeError, Libc, read_status_binding)
from ansible.module_utils.gpunuma.verify.h2d.measure import measure_device

# ---------------------------------------------------------------- placements in children


def _child_measure(ordinal, placement, cpus, mem_nodes, opts):
    """Runs in the forked child: bind, verify, init CUDA, measure. Returns a JSON-able dict."""
    libc = Libc()
    binding = {"placement": placement, "requested_cpus": format_cpulist(cpus) if cpus else None,
               "requested_mem_nodes": list(mem_nodes) if mem_nodes else None}
    # a binding the kernel refuses (seccomp, gVisor) is measured anyway and reported unverified
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as exc:
            binding["cpu_bind_error"] = "sched_setaffinity: %s" % exc
    if mem_nodes:
        try:
            libc.set_mempolicy(MPOL_BIND, mem_nodes)
        except OSError as exc:
            binding["mem_bind_error"] = str(exc)
    status = read_status_binding()
    binding["cpus_allowed"] = status.get("Cpus_allowed_list")
    binding["mems_allowed"] = status.get("Mems_allowed_list")
    try:
        mode, nodes = libc.get_mempolicy()
        binding["mempolicy"] = {0: "default", 1: "preferred", 2: "bind", 3: "interleave"}.get(mode, str(mode))
        binding["mempolicy_nodes"] = nodes if mode != MPOL_DEFAULT else []
    except OSError as exc:
        binding["mempolicy"] = "unknown (%s)" % exc
        binding["mempolicy_nodes"] = []
    allowed = set(parse_cpulist(binding["cpus_allowed"])) if binding["cpus_allowed"] else set()
    binding["cpus_verified"] = (not cpus) or allowed == set(cpus)
    binding["mem_verified"] = (not mem_nodes) or (binding["mempolicy"] == "bind" and set(binding["mempolicy_nodes"]) == set(mem_nodes))
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    cuda = open_runtime(_library(opts))
    cuda.init()
    measured = measure_device(cuda, ordinal, opts, libc=libc)
    pages = measured.pop("buffer_pages", {})
    binding["buffer_pages"] = pages
    if mem_nodes:
        want = {str(n) for n in mem_nodes}
        ok = True
        for counts in pages.values():
            total = sum(v for k, v in counts.items() if k != "error")
            on = sum(v for k, v in counts.items() if k in want)
            ok = ok and total > 0 and on == total
        binding["pages_verified"] = ok
    else:
        binding["pages_verified"] = True
    return {"binding": binding, "measurement": measured}


def run_in_child(target, args, timeout_s):
    """Fork, run ``target(*args)`` in the child, return its JSON result or raise ProbeError/CudaError-like dict."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(rfd)
        code = 0
        try:
            payload = {"ok": target(*args)}
        except CudaError as exc:
            payload = {"cuda_error": {"call": exc.call, "code": exc.code, "name": exc.name, "text": exc.text,
                                      "what": getattr(exc, "what", None)}}
        except GpunumaError as exc:
            payload = {"error": str(exc), "type": type(exc).__name__}
        except BaseException as exc:  # the child must always answer
            payload = {"error": "%s: %s" % (type(exc).__name__, exc), "type": type(exc).__name__}
        try:
            data = json.dumps(payload).encode()
            view = memoryview(data)
            while view:
                n = os.write(wfd, view)
                view = view[n:]
        except BaseException:
            code = 3
        finally:
            os._exit(code)
    os.close(wfd)
    chunks = []
    deadline = time.monotonic() + timeout_s
    timed_out = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _unused, _unused = select.select([rfd], [], [], left)
            if not ready:
                continue
            chunk = os.read(rfd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(rfd)
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _unused, status = os.waitpid(pid, 0)
    if timed_out:
        return {"error": "no answer within %d s (timeout_s); the measuring process was killed" % timeout_s, "type": "timeout"}
    if not chunks:
        how = ("killed by signal %d" % os.WTERMSIG(status)) if os.WIFSIGNALED(status) else ("exit status %d" % os.WEXITSTATUS(status))
        return {"error": "the measuring process died without an answer (%s)" % how, "type": "crash"}
    try:
        return json.loads(b"".join(chunks).decode())
    except ValueError:
        return {"error": "the measuring process answered garbage", "type": "crash"}


def _library(opts):
    """What open_runtime opens: the runtime option and both library paths."""
    return {"runtime": opts["runtime"], "libcuda_path": opts["libcuda_path"], "libhip_path": opts["libhip_path"]}


def _enumerate_child(library):
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    cuda = open_runtime(library)
    try:
        cuda.init()
    except CudaError as exc:
        if exc.code == CUDA_ERROR_NO_DEVICE:
            return {"driver_version": None, "gpus": []}
        raise
    gpus = []
    for ordinal in range(cuda.device_count()):
        info = cuda.describe(cuda.device(ordinal))
        info["index"] = ordinal
        gpus.append(info)
    return {"driver_version": cuda.driver_version(), "runtime": cuda.kind, "gpus": gpus}


def select_gpus(gpus, wanted):
    if wanted is None:
        return list(gpus)
    chosen, unknown = [], []
    for w in wanted:
        match = [g for g in gpus if w == g["index"] or str(w) == str(g["index"]) or str(w).lower() in (g["uuid"].lower(), g["pci_bus_id"])]
        if not match:
            unknown.append(str(w))
        for g in match:
            if g not in chosen:
                chosen.append(g)
    if unknown:
        raise ProbeError("gpus names %s, not on this node; it has %s" % (
            ", ".join(unknown), ", ".join("%d (%s, %s)" % (g["index"], g["uuid"], g["pci_bus_id"]) for g in gpus) or "no GPUs"))
    return chosen


def _cuda_error_message(gpu, placement, err):
    label = "GPU %s (%s, %s)" % (gpu["index"], gpu["uuid"], gpu["pci_bus_id"])
    what = (" allocating the %s" % err["what"]) if err.get("what") else ""
    return "%s, placement %s: %s%s failed with %s (%d): %s" % (
        label, placement, err["call"], what, err["name"], err["code"], err["text"])


def _round_figures(result):
    """The figures one round contributes per placement: the medians its statistics compare."""
    m = result.get("measurement") or {}
    return {"h2d_pinned_gbps": (m.get("h2d_pinned") or {}).get("gbps_median"),
            "small_p50_us": (m.get("small_h2d_pinned") or {}).get("us_p50"),
            "small_p99_us": (m.get("small_h2d_pinned") or {}).get("us_p99"),
            "h2d_pinned_cpu_s_per_gb": (m.get("h2d_pinned") or {}).get("cpu_s_per_gb"),
            "small_cpu_us_per_copy": (m.get("small_h2d_pinned") or {}).get("cpu_us_per_copy")}


def _measure_rounds(gpu, entry, targets, opts):
    """Measure every placement of ``targets`` in interleaved rounds into ``entry["placements"]``.

    One warm-up round first (measured, discarded: the first copies of a
    process pay for page faults, TLB and clock ramp-up), then ``rounds``
    rounds, each in rotated order (A B C, B C A, C A B, ...) so a drift of
    the node over the run hits every placement alike. A placement's entry is
    its first measured round in full (binding, every statistic) plus
    ``rounds``: the figures of every measured round. A busy GPU or an error
    stops the GPU's measurement, as a single round did.
    """
    order = list(targets)
    if not order:
        return
    schedule = [("warmup", order)] if opts["warmup_round"] else []
    schedule += [(r, order[r % len(order):] + order[:r % len(order)]) for r in range(opts["rounds"])]
    for round_no, placements in schedule:
        for placement in placements:
            cpus, mems = targets[placement]
            t0 = time.monotonic()
            out = run_in_child(_child_measure, (gpu["index"], placement, cpus, mems, opts), opts["timeout_s"])
            elapsed = round(time.monotonic() - t0, 3)
            if "ok" in out:
                if round_no == "warmup":
                    continue
                place = entry["placements"].get(placement)
                if place is None:
                    place = entry["placements"][placement] = dict(
                        status="ok", reason=None, seconds=0.0, node=mems[0] if mems else None, rounds=[], **out["ok"])
                place["seconds"] = round(place["seconds"] + elapsed, 3)
                place["rounds"].append(_round_figures(out["ok"]))
                continue
            err = out.get("cuda_error")
            if err and err["code"] in BUSY_CODES:
                reason = "GPU %d (%s, %s) is busy: another process holds it (compute mode %s); %s failed with %s" % (
                    gpu["index"], gpu["uuid"], gpu["pci_bus_id"], gpu.get("compute_mode"), err["call"], err["name"])
                entry.update(status="skipped", reason=reason)
                entry["placements"][placement] = {"status": "skipped", "reason": reason}
                return
            if err:
                reason = _cuda_error_message(gpu, placement, err)
            else:
                reason = "GPU %d (%s, %s), placement %s: %s" % (gpu["index"], gpu["uuid"], gpu["pci_bus_id"], placement, out["error"])
            entry["placements"][placement] = {"status": "error", "reason": reason}
            entry.update(status="error", reason=reason)
            return
