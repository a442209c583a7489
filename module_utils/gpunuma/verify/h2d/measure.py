"""One placement measured on one GPU: the copies, their figures and the resources they hold (verify/h2d/probe.py)."""

from __future__ import annotations

import ctypes
import mmap
import statistics
import time

from ansible.module_utils.gpunuma.verify.h2d.cuda import (
    CU_EVENT_DEFAULT, CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTREGISTER_PORTABLE, CU_STREAM_NON_BLOCKING, CudaError)
from ansible.module_utils.gpunuma.verify.h2d.options import SMALL_WARMUP_COPIES

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


def _pin(cuda, res, method, nbytes):
    """``(address, seconds)`` of a pinned host buffer of ``nbytes``, released by ``res``: ``host_alloc``
    (cuMemHostAlloc, its pages touched; timed with the touch) or ``register`` (an mmap touched first, then
    cuMemHostRegister; timed: the registration alone). A refused call raises CudaError naming the buffer."""
    if method == "host_alloc":
        ptr = ctypes.c_void_p()
        t0 = time.perf_counter()
        try:
            cuda.call("cuMemHostAlloc", ctypes.byref(ptr), nbytes, CU_MEMHOSTALLOC_PORTABLE)
        except CudaError as exc:
            exc.what = "pinned host buffer of %d bytes" % nbytes
            raise
        res.push(cuda.call, "cuMemFreeHost", ptr)
        ctypes.memset(ptr, 1, nbytes)
        return ptr.value, time.perf_counter() - t0
    buf, addr = _host_buffer(nbytes)
    res.push(buf.close)
    t0 = time.perf_counter()
    try:
        cuda.call("cuMemHostRegister", ctypes.c_void_p(addr), nbytes, CU_MEMHOSTREGISTER_PORTABLE)
    except CudaError as exc:
        exc.what = "pinned (registered) host buffer of %d bytes" % nbytes
        raise
    res.push(cuda.call, "cuMemHostUnregister", ctypes.c_void_p(addr))
    return addr, time.perf_counter() - t0


class _Copies:
    """One GPU's context, stream, events and buffers (each released by ``res``), and the copies timed on them."""

    def __init__(self, cuda, ordinal, opts, res):
        self.cuda, self.opts, self.res = cuda, opts, res
        dev = cuda.device(ordinal)
        ctx = ctypes.c_void_p()
        cuda.call("cuCtxCreate", ctypes.byref(ctx), 0, dev)
        res.push(cuda.call, "cuCtxDestroy", ctx)
        self.stream = ctypes.c_void_p()
        cuda.call("cuStreamCreate", ctypes.byref(self.stream), CU_STREAM_NON_BLOCKING)
        res.push(cuda.call, "cuStreamDestroy", self.stream)
        self.ev_start, self.ev_end = ctypes.c_void_p(), ctypes.c_void_p()
        for ev in (self.ev_start, self.ev_end):
            cuda.call("cuEventCreate", ctypes.byref(ev), CU_EVENT_DEFAULT)
            res.push(cuda.call, "cuEventDestroy", ev)
        self.large, self.small = opts["large_bytes"], opts["small_bytes"]
        self.dptr = ctypes.c_uint64(0)
        try:
            cuda.call("cuMemAlloc", ctypes.byref(self.dptr), self.large)
        except CudaError as exc:
            exc.what = "device buffer of %d bytes" % self.large
            raise
        res.push(cuda.call, "cuMemFree", ctypes.c_uint64(self.dptr.value))
        self.pinned_large = self.pinned(self.large)
        self.pinned_small = self.pinned(self.small)
        self.pageable_buf, self.pageable_large = _host_buffer(self.large)
        res.push(self.pageable_buf.close)
        # CPU time of the copying thread per timed series (series(key=...)).
        self.cpu = {}

    def pinned(self, nbytes):
        """A pinned host buffer of ``nbytes`` by the pinned_alloc option, held until the measurement ends."""
        return _pin(self.cuda, self.res, self.opts["pinned_alloc"], nbytes)[0]

    def pinning_cost(self):
        """What pinning host memory costs here, each way, for a buffer of the large copies' size: wall seconds and
        seconds per GiB of ``cuMemHostAlloc`` (its pages touched, as a pool is before use) and of
        ``cuMemHostRegister`` on pages already touched (the registration alone). An allocation the node refuses
        is reported, not raised: the copies measured above did not need it."""
        out = {"bytes": self.large}
        for method in ("host_alloc", "register"):
            res = _Resources(self.cuda)
            try:
                seconds = _pin(self.cuda, res, method, self.large)[1]
                out[method] = {"seconds": round(seconds, 6), "s_per_gib": round(seconds * (1 << 30) / self.large, 6)}
            except CudaError as exc:
                out[method] = {"error": str(exc)}
            finally:
                res.close()
        return out

    def _elapsed_ms(self):
        ms = ctypes.c_float(0)
        self.cuda.call("cuEventElapsedTime", ctypes.byref(ms), self.ev_start, self.ev_end)
        return ms.value

    def event_copy(self, direction, host, nbytes):
        """Seconds of one copy between events on the stream."""
        cuda = self.cuda
        cuda.call("cuEventRecord", self.ev_start, self.stream)
        if direction == "h2d":
            cuda.call("cuMemcpyHtoDAsync", self.dptr.value, host, nbytes, self.stream)
        else:
            cuda.call("cuMemcpyDtoHAsync", host, self.dptr.value, nbytes, self.stream)
        cuda.call("cuEventRecord", self.ev_end, self.stream)
        cuda.call("cuEventSynchronize", self.ev_end)
        return self._elapsed_ms() / 1000.0

    def wall_copy(self, host, nbytes):
        """Wall seconds of one copy and its stream synchronisation (a pageable copy is staged by the driver)."""
        t0 = time.perf_counter()
        self.cuda.call("cuMemcpyHtoDAsync", self.dptr.value, host, nbytes, self.stream)
        self.cuda.call("cuStreamSynchronize", self.stream)
        return time.perf_counter() - t0

    def series(self, fn, count, warmup=None, key=None):
        """``count`` timings of ``fn`` after ``warmup`` untimed calls (default: the warmup option)."""
        for _unused in range(self.opts["warmup"] if warmup is None else warmup):
            fn()
        # CPU time of this (the copying) thread over the measured copies: what a copy costs the host,
        # the wait included as the CUDA context does it (a spin or a yield).
        t0 = time.thread_time()
        out = [fn() for _unused in range(count)]
        if key:
            self.cpu[key] = time.thread_time() - t0
        return out

    def queued_us_per_copy(self, count, warmup):
        """Back-to-back async small copies: the per-copy cost when the queue is kept full (microseconds)."""
        cuda, dptr, stream = self.cuda, self.dptr, self.stream
        for _unused in range(warmup):
            cuda.call("cuMemcpyHtoDAsync", dptr.value, self.pinned_small, self.small, stream)
        cuda.call("cuStreamSynchronize", stream)
        cuda.call("cuEventRecord", self.ev_start, stream)
        for _unused in range(count):
            cuda.call("cuMemcpyHtoDAsync", dptr.value, self.pinned_small, self.small, stream)
        cuda.call("cuEventRecord", self.ev_end, stream)
        cuda.call("cuEventSynchronize", self.ev_end)
        return round(self._elapsed_ms() * 1000.0 / count, 3)


def measure_device(cuda, ordinal, opts, libc=None):
    """Measure one GPU in the current process (already bound). Returns the measurement dict.

    Raises CudaError; every allocation made here is released before it returns or raises.
    """
    res = _Resources(cuda)
    try:
        c = _Copies(cuda, ordinal, opts, res)
        large, small = c.large, c.small
        # Small copies reach their steady state (clocks up, the copy path's
        # caches and TLB entries warm) only after tens of copies: a few large
        # ones do not warm them, so the first measured small copy was a cold one.
        small_warmup = max(opts["warmup"], SMALL_WARMUP_COPIES)
        result = {
            "h2d_pinned": bandwidth_stats(large, c.series(lambda: c.event_copy("h2d", c.pinned_large, large),
                                                          opts["repeats"], key="h2d_pinned")),
            "d2h_pinned": bandwidth_stats(large, c.series(lambda: c.event_copy("d2h", c.pinned_large, large),
                                                          opts["repeats"])),
            "h2d_pageable": bandwidth_stats(large, c.series(lambda: c.wall_copy(c.pageable_large, large),
                                                            opts["repeats"], key="h2d_pageable")),
            "small_h2d_pinned": latency_stats(c.series(lambda: c.event_copy("h2d", c.pinned_small, small),
                                                       opts["small_repeats"], small_warmup, key="small")),
        }
        for key in ("h2d_pinned", "h2d_pageable"):
            result[key]["cpu_s_per_gb"] = cpu_per_gb(c.cpu[key], large, opts["repeats"])
        result["small_h2d_pinned"]["cpu_us_per_copy"] = cpu_per_copy_us(c.cpu["small"], opts["small_repeats"])
        result["small_h2d_pinned"]["loop_us_per_copy"] = c.queued_us_per_copy(opts["small_repeats"], small_warmup)
        result["pinning"] = c.pinning_cost()
        if libc is not None:
            pages = {}
            for kind, addr in (("pinned", c.pinned_large), ("pageable", c.pageable_large)):
                try:
                    pages[kind] = libc.page_nodes(addr, large)
                except OSError as exc:
                    pages[kind] = {"error": str(exc)}
            result["buffer_pages"] = pages
        return result
    finally:
        # A failed release is reported by the caller's process exit; nothing more can be done here.
        res.close()
