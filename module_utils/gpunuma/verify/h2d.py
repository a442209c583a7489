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

import ctypes
import json
import mmap
import os
import platform
import select
import signal
import statistics
import time

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, parse_cpulist
from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.common import schemas
from ansible.module_utils.gpunuma.verify import h2d_load
from ansible.module_utils.gpunuma.verify.h2d_cuda import (  # noqa: F401 (the probe's API, re-exported)  # pylint: disable=unused-import
    BUSY_CODES, COMPUTE_MODES, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, CU_EVENT_DEFAULT, CU_MEMHOSTALLOC_PORTABLE,
    CU_MEMHOSTREGISTER_PORTABLE, CU_STREAM_NON_BLOCKING, CUDA_ERROR_DEVICE_UNAVAILABLE, CUDA_ERROR_DEVICES_UNAVAILABLE,
    CUDA_ERROR_INSUFFICIENT_DRIVER, CUDA_ERROR_NO_DEVICE, CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_SUCCESS, CudaDriver, CudaError, DriverMissing, normalise_bus_id)
from ansible.module_utils.gpunuma.verify.h2d_hip import DEFAULT_PATH as HIP_DEFAULT_PATH, RUNTIMES, open_runtime
from ansible.module_utils.gpunuma.verify.h2d_host import (  # noqa: F401 (the probe's API, re-exported)  # pylint: disable=unused-import
    MPOL_BIND, MPOL_DEFAULT, PCIE_ENCODING, ProbeError, PCIE_LANE_GTS, Libc, choose_remote, gpu_numa_node, pcie_link,
    pcie_theoretical_gbps, read_numa_nodes, read_status_binding)

SCHEMA = schemas.H2D_PROBE
PLACEMENTS = ("local", "remote", "unbound")
PINNED_ALLOCS = ("register", "host_alloc")
# Small copies made, and discarded, before the small-copy figures (at least; ``warmup`` when larger).
SMALL_WARMUP_COPIES = 100
MiB = 1024 * 1024

DEFAULTS = {
    "placements": list(PLACEMENTS),
    "large_bytes": 256 * MiB,
    "small_bytes": 4096,
    "repeats": 10,
    "small_repeats": 1000,
    "warmup": 3,
    # Interleaved rounds per placement (A B C, B C A, ...), after one warm-up
    # round that is measured and discarded (verify/stats.py).
    "rounds": 5,
    "warmup_round": True,
    "pinned_alloc": "register",
    "timeout_s": 120,
    "libcuda_path": "libcuda.so.1",
    # CUDA's driver API or HIP (verify/h2d_hip.py); auto: CUDA where libcuda loads, else HIP.
    "runtime": "auto",
    "libhip_path": HIP_DEFAULT_PATH,
    "remote_node": None,
    "gpus": None,
    # Load while measuring (verify/h2d_load.py): idle, copies, memory or both.
    "load": "idle",
    "load_memory_workers": h2d_load.DEFAULT_MEMORY_WORKERS,
    "load_max_seconds": h2d_load.DEFAULT_MAX_SECONDS,
    "load_memory_node": None,
    "load_cpus": None,
}


# ---------------------------------------------------------------- options


def check_options(opts):
    """Validate every option up front; return a complete option dict or raise ProbeError listing all problems."""
    out = dict(DEFAULTS)
    errors = []
    for key in opts:
        if key not in DEFAULTS:
            errors.append("unknown option %r; allowed: %s" % (key, ", ".join(sorted(DEFAULTS))))
    out.update({k: v for k, v in opts.items() if k in DEFAULTS and v is not None})

    def positive_int(name, low, high):
        value = out[name]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            errors.append("%s is %r; it must be an integer from %d to %d" % (name, value, low, high))

    positive_int("large_bytes", 4096, 16 * 1024 * MiB)
    positive_int("small_bytes", 1, 64 * MiB)
    positive_int("repeats", 1, 10000)
    positive_int("small_repeats", 10, 1000000)
    positive_int("warmup", 0, 1000)
    positive_int("timeout_s", 1, 3600)
    positive_int("rounds", 1, 50)
    if not isinstance(out["warmup_round"], bool):
        errors.append("warmup_round is %r; it must be true or false" % (out["warmup_round"],))
    if not errors and out["small_bytes"] > out["large_bytes"]:
        errors.append("small_bytes is %d, larger than large_bytes (%d); the small copies reuse the large device buffer"
                      % (out["small_bytes"], out["large_bytes"]))
    placements = out["placements"]
    if not isinstance(placements, (list, tuple)) or not placements:
        errors.append("placements is %r; it must be a non-empty list of %s" % (placements, ", ".join(PLACEMENTS)))
    else:
        bad = [p for p in placements if p not in PLACEMENTS]
        if bad:
            errors.append("placements has %s; allowed: %s" % (", ".join(repr(b) for b in bad), ", ".join(PLACEMENTS)))
        elif len(set(placements)) != len(placements):
            errors.append("placements %r lists a placement twice" % (placements,))
        else:
            out["placements"] = [p for p in PLACEMENTS if p in placements]
    if out["pinned_alloc"] not in PINNED_ALLOCS:
        errors.append("pinned_alloc is %r; allowed: %s" % (out["pinned_alloc"], ", ".join(PINNED_ALLOCS)))
    remote = out["remote_node"]
    if remote is not None and (isinstance(remote, bool) or not isinstance(remote, int) or remote < 0):
        errors.append("remote_node is %r; it must be a NUMA node id (integer >= 0)" % (remote,))
    gpus = out["gpus"]
    if gpus is not None:
        if not isinstance(gpus, (list, tuple)) or not all(isinstance(g, (str, int)) and not isinstance(g, bool) for g in gpus):
            errors.append("gpus is %r; it must be a list of GPU indices, UUIDs or PCI bus ids" % (gpus,))
    errors.extend(h2d_load.check(out["load"], out["load_memory_workers"], out["load_max_seconds"],
                                 out["load_memory_node"], out["load_cpus"]))
    for key in ("libcuda_path", "libhip_path"):
        if not isinstance(out[key], str) or not out[key]:
            errors.append("%s is %r; it must be a library name or path" % (key, out[key]))
    if out["runtime"] not in RUNTIMES:
        errors.append("runtime is %r; allowed: %s" % (out["runtime"], ", ".join(RUNTIMES)))
    if errors:
        raise ProbeError("; ".join(errors))
    return out


# ---------------------------------------------------------------- measurement


def percentile(values, q):
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    rank = max(1, int(-(-q * len(ordered) // 100)))  # ceil(q/100*n)
    return ordered[min(rank, len(ordered)) - 1]


def bandwidth_stats(nbytes, seconds):
    """GB/s (1e9 bytes/s) median/best/worst from per-copy durations."""
    rates = [nbytes / s / 1e9 for s in seconds if s > 0]
    if not rates:
        return {"gbps_median": None, "gbps_best": None, "gbps_worst": None, "samples": 0}
    return {"gbps_median": round(statistics.median(rates), 3), "gbps_best": round(max(rates), 3),
            "gbps_worst": round(min(rates), 3), "samples": len(rates),
            "seconds_median": statistics.median(seconds), "seconds": [round(s, 9) for s in seconds]}


def cpu_per_gb(cpu_seconds, nbytes, count):
    """CPU seconds of the copying thread per GB (1e9 bytes) copied, or None when nothing was copied."""
    total = nbytes * count
    return round(cpu_seconds / (total / 1e9), 6) if total > 0 else None


def cpu_per_copy_us(cpu_seconds, count):
    """CPU microseconds of the copying thread per copy, or None when nothing was copied."""
    return round(cpu_seconds * 1e6 / count, 3) if count > 0 else None


def latency_stats(seconds):
    us = [s * 1e6 for s in seconds]
    return {"us_p50": round(percentile(us, 50), 3), "us_p99": round(percentile(us, 99), 3),
            "us_max": round(max(us), 3), "us_min": round(min(us), 3), "samples": len(us),
            "seconds": [round(s, 9) for s in seconds]}


class _Resources:
    """Everything one measurement allocated, released in reverse order whatever happens."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.stack = []

    def push(self, release, *args):
        self.stack.append((release, args))

    def close(self):
        errors = []
        while self.stack:
            release, args = self.stack.pop()
            try:
                release(*args)
            except Exception as exc:  # keep releasing the rest
                errors.append(str(exc))
        return errors


def _host_buffer(nbytes):
    """Anonymous page-aligned mapping, touched so its pages land under the current memory policy."""
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    page = mmap.PAGESIZE
    for off in range(0, nbytes, page):
        buf[off] = 1
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    return buf, addr


def measure_device(cuda, ordinal, opts, libc=None):
    """Measure one GPU in the current process (already bound). Returns the measurement dict.

    Raises CudaError; every allocation made here is released before it returns or raises.
    """
    res = _Resources(cuda)
    views = []
    try:
        dev = cuda.device(ordinal)
        ctx = ctypes.c_void_p()
        cuda.call("cuCtxCreate", ctypes.byref(ctx), 0, dev)
        res.push(cuda.call, "cuCtxDestroy", ctx)
        stream = ctypes.c_void_p()
        cuda.call("cuStreamCreate", ctypes.byref(stream), CU_STREAM_NON_BLOCKING)
        res.push(cuda.call, "cuStreamDestroy", stream)
        ev_start, ev_end = ctypes.c_void_p(), ctypes.c_void_p()
        for ev in (ev_start, ev_end):
            cuda.call("cuEventCreate", ctypes.byref(ev), CU_EVENT_DEFAULT)
            res.push(cuda.call, "cuEventDestroy", ev)
        large, small = opts["large_bytes"], opts["small_bytes"]
        dptr = ctypes.c_uint64(0)
        try:
            cuda.call("cuMemAlloc", ctypes.byref(dptr), large)
        except CudaError as exc:
            exc.what = "device buffer of %d bytes" % large
            raise
        res.push(cuda.call, "cuMemFree", ctypes.c_uint64(dptr.value))

        def pinned(nbytes):
            if opts["pinned_alloc"] == "host_alloc":
                ptr = ctypes.c_void_p()
                try:
                    cuda.call("cuMemHostAlloc", ctypes.byref(ptr), nbytes, CU_MEMHOSTALLOC_PORTABLE)
                except CudaError as exc:
                    exc.what = "pinned host buffer of %d bytes" % nbytes
                    raise
                res.push(cuda.call, "cuMemFreeHost", ptr)
                ctypes.memset(ptr, 1, nbytes)
                return ptr.value
            buf, addr = _host_buffer(nbytes)
            res.push(buf.close)
            try:
                cuda.call("cuMemHostRegister", ctypes.c_void_p(addr), nbytes, CU_MEMHOSTREGISTER_PORTABLE)
            except CudaError as exc:
                exc.what = "pinned (registered) host buffer of %d bytes" % nbytes
                raise
            res.push(cuda.call, "cuMemHostUnregister", ctypes.c_void_p(addr))
            return addr

        pinned_large = pinned(large)
        pinned_small = pinned(small)
        pageable_buf, pageable_large = _host_buffer(large)
        res.push(pageable_buf.close)
        views.append(pageable_buf)

        def event_copy(direction, host, nbytes):
            cuda.call("cuEventRecord", ev_start, stream)
            if direction == "h2d":
                cuda.call("cuMemcpyHtoDAsync", dptr.value, host, nbytes, stream)
            else:
                cuda.call("cuMemcpyDtoHAsync", host, dptr.value, nbytes, stream)
            cuda.call("cuEventRecord", ev_end, stream)
            cuda.call("cuEventSynchronize", ev_end)
            ms = ctypes.c_float(0)
            cuda.call("cuEventElapsedTime", ctypes.byref(ms), ev_start, ev_end)
            return ms.value / 1000.0

        def wall_copy(host, nbytes):
            t0 = time.perf_counter()
            cuda.call("cuMemcpyHtoDAsync", dptr.value, host, nbytes, stream)
            cuda.call("cuStreamSynchronize", stream)
            return time.perf_counter() - t0

        cpu = {}

        def series(fn, count, warmup=opts["warmup"], key=None):
            for _unused in range(warmup):
                fn()
            # CPU time of this (the copying) thread over the measured copies: what a copy costs the host,
            # the wait included as the CUDA context does it (a spin or a yield).
            t0 = time.thread_time()
            out = [fn() for _unused in range(count)]
            if key:
                cpu[key] = time.thread_time() - t0
            return out

        # Small copies reach their steady state (clocks up, the copy path's
        # caches and TLB entries warm) only after tens of copies: a few large
        # ones do not warm them, so the first measured small copy was a cold one.
        small_warmup = max(opts["warmup"], SMALL_WARMUP_COPIES)

        result = {
            "h2d_pinned": bandwidth_stats(large, series(lambda: event_copy("h2d", pinned_large, large), opts["repeats"],
                                                        key="h2d_pinned")),
            "d2h_pinned": bandwidth_stats(large, series(lambda: event_copy("d2h", pinned_large, large), opts["repeats"])),
            "h2d_pageable": bandwidth_stats(large, series(lambda: wall_copy(pageable_large, large), opts["repeats"],
                                                          key="h2d_pageable")),
            "small_h2d_pinned": latency_stats(series(lambda: event_copy("h2d", pinned_small, small), opts["small_repeats"],
                                                     small_warmup, key="small")),
        }
        for key in ("h2d_pinned", "h2d_pageable"):
            result[key]["cpu_s_per_gb"] = cpu_per_gb(cpu[key], large, opts["repeats"])
        result["small_h2d_pinned"]["cpu_us_per_copy"] = cpu_per_copy_us(cpu["small"], opts["small_repeats"])
        # back-to-back async small copies: per-copy cost when the queue is kept full
        n = opts["small_repeats"]
        for _unused in range(small_warmup):
            cuda.call("cuMemcpyHtoDAsync", dptr.value, pinned_small, small, stream)
        cuda.call("cuStreamSynchronize", stream)
        cuda.call("cuEventRecord", ev_start, stream)
        for _unused in range(n):
            cuda.call("cuMemcpyHtoDAsync", dptr.value, pinned_small, small, stream)
        cuda.call("cuEventRecord", ev_end, stream)
        cuda.call("cuEventSynchronize", ev_end)
        ms = ctypes.c_float(0)
        cuda.call("cuEventElapsedTime", ctypes.byref(ms), ev_start, ev_end)
        result["small_h2d_pinned"]["loop_us_per_copy"] = round(ms.value * 1000.0 / n, 3)
        if libc is not None:
            pages = {}
            for kind, addr, nbytes in (("pinned", pinned_large, large), ("pageable", pageable_large, large)):
                try:
                    pages[kind] = libc.page_nodes(addr, nbytes)
                except OSError as exc:
                    pages[kind] = {"error": str(exc)}
            result["buffer_pages"] = pages
        return result
    finally:
        errors = res.close()
        if errors:
            # a failed release is reported by the caller's process exit; nothing more can be done here
            pass


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
