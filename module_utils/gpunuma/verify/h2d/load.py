# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Load for the H2D probe: measure placements while the node is busy, as it is under inference.

The trap binding avoids shows when the socket interconnect and the memory
controllers are busy; an idle node hides it. ``load`` (the probe option,
``gpu_validate_load``) is one of

* ``idle``: nothing (the default);
* ``copies``: every probed GPU copying host to device at once, one process
  each, from a pinned buffer (``COPY_BYTES``), as a fleet of engines does;
* ``memory``: DRAM-bandwidth stressors, ``memory_workers`` processes copying
  between two buffers (``MEMORY_BYTES``) bound (``set_mempolicy``) to one
  node: the node farthest from the first GPU (``choose_remote``), or
  ``memory_node``, so the remote placement meets a busy interconnect;
* ``both``.

Stressors are small processes of the standard library and libcuda only,
bounded in time (each stops itself after ``max_seconds``) and in memory
(the buffers above), confined to ``cpus`` (the CPUs the plan gives
non-instance work, passed by the gpu_validate role; else the memory node's
CPUs). They are always stopped: the probe stops them when it has measured
(SIGTERM, then SIGKILL), each one dies with the probe (``PR_SET_PDEATHSIG``:
a probe killed, or its Ctrl-C, kills them), and each stops itself at its
deadline. Each reports what it achieved (GB/s), and the probe report says
which load ran and how hard it pushed (``Load.describe``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import mmap
import os
import select
import signal
import time

from ansible.module_utils.gpunuma.verify.h2d.cuda import CU_MEMHOSTALLOC_PORTABLE, CudaError
from ansible.module_utils.gpunuma.verify.h2d.hip import open_runtime
from ansible.module_utils.gpunuma.verify.h2d.host import MPOL_BIND, Libc

LOADS = ("idle", "copies", "memory", "both")
MiB = 1024 * 1024
COPY_BYTES = 64 * MiB
MEMORY_BYTES = 128 * MiB  # per buffer; a memory stressor holds two
DEFAULT_MEMORY_WORKERS = 4
DEFAULT_MAX_SECONDS = 900
PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 5.0
# How long the stressors may take to allocate and start (the measurement starts under full load, not before).
READY_TIMEOUT_S = 60.0
READY = b"R"


def check(load, memory_workers, max_seconds, memory_node, cpus):
    """Problems with the load options, each naming the option and what is allowed."""
    errors = []
    if load not in LOADS:
        errors.append("load is %r; allowed: %s" % (load, ", ".join(LOADS)))
    if isinstance(memory_workers, bool) or not isinstance(memory_workers, int) or not 1 <= memory_workers <= 64:
        errors.append("load_memory_workers is %r; it must be an integer from 1 to 64" % (memory_workers,))
    if isinstance(max_seconds, bool) or not isinstance(max_seconds, int) or not 10 <= max_seconds <= 7200:
        errors.append("load_max_seconds is %r; it must be an integer from 10 to 7200" % (max_seconds,))
    if memory_node is not None and (isinstance(memory_node, bool) or not isinstance(memory_node, int)
                                    or memory_node < 0):
        errors.append("load_memory_node is %r; it must be a NUMA node id (integer >= 0)" % (memory_node,))
    if cpus is not None and (not isinstance(cpus, (list, tuple)) or not cpus
                             or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in cpus)):
        errors.append("load_cpus is %r; it must be a non-empty list of CPU ids" % (cpus,))
    return errors


def _die_with_parent():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _copies(library, ordinal, stop, deadline, ready):
    """Host-to-device copies from a pinned buffer on GPU ``ordinal`` until told to stop: bytes copied.
    ``library``: a libcuda path, or the probe's runtime options (h2d_hip.open_runtime)."""
    cuda = open_runtime(library)
    cuda.init()
    dev = cuda.device(ordinal)
    ctx, stream, host, dptr = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint64(0)
    cuda.call("cuCtxCreate", ctypes.byref(ctx), 0, dev)
    cuda.call("cuStreamCreate", ctypes.byref(stream), 1)
    cuda.call("cuMemAlloc", ctypes.byref(dptr), COPY_BYTES)
    cuda.call("cuMemHostAlloc", ctypes.byref(host), COPY_BYTES, CU_MEMHOSTALLOC_PORTABLE)
    ctypes.memset(host, 1, COPY_BYTES)
    ready()
    copied = 0
    while not stop() and time.monotonic() < deadline:
        cuda.call("cuMemcpyHtoDAsync", dptr.value, host.value, COPY_BYTES, stream)
        cuda.call("cuStreamSynchronize", stream)
        copied += COPY_BYTES
    return copied


def _memory(node, stop, deadline, ready):
    """Copies between two buffers bound to NUMA node ``node`` until told to stop: bytes copied."""
    if node is not None:
        Libc().set_mempolicy(MPOL_BIND, [node])
    bufs = []
    for _unused in range(2):
        buf = mmap.mmap(-1, MEMORY_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        buf.write(b"\1" * MEMORY_BYTES)
        bufs.append(buf)
    src, dst = (ctypes.addressof(ctypes.c_char.from_buffer(b)) for b in bufs)
    ready()
    copied = 0
    while not stop() and time.monotonic() < deadline:
        ctypes.memmove(dst, src, MEMORY_BYTES)
        copied += MEMORY_BYTES
    return copied


def _stressor(spec, cpus, deadline, wfd):
    """The child: confine, run ``spec`` until SIGTERM or the deadline, write {"bytes", "seconds"} and exit."""
    _die_with_parent()
    stopped = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopped.append(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the probe decides; Ctrl-C reaches it, and it stops us
    answer = {}
    try:
        if cpus:
            os.sched_setaffinity(0, cpus)
        started = []

        def ready():
            os.write(wfd, READY)
            started.append(time.monotonic())

        if spec["kind"] == "copies":
            copied = _copies(spec["libcuda_path"], spec["gpu"], lambda: bool(stopped), deadline, ready)
        else:
            copied = _memory(spec.get("node"), lambda: bool(stopped), deadline, ready)
        answer = {"bytes": copied, "seconds": round(time.monotonic() - started[0], 3)}
    except CudaError as exc:
        answer = {"error": "%s failed with %s" % (exc.call, exc.name)}
    except BaseException as exc:  # the stressor always answers
        answer = {"error": "%s: %s" % (type(exc).__name__, exc)}
    try:
        os.write(wfd, json.dumps(answer).encode())
    finally:
        os._exit(0)


class Load:
    """The stressors of one probe run: ``with Load(...) as load:`` measure, then ``load.describe()``."""

    def __init__(self, kind, gpus, libcuda_path, memory_node=None, cpus=None, memory_workers=DEFAULT_MEMORY_WORKERS,
                 max_seconds=DEFAULT_MAX_SECONDS):
        self.kind, self.gpus, self.libcuda_path = kind, list(gpus), libcuda_path
        self.memory_node, self.cpus = memory_node, sorted(cpus) if cpus else None
        self.memory_workers, self.max_seconds = memory_workers, max_seconds
        self.children = []  # (pid, read fd, spec)
        self.results = []

    def specs(self):
        out = []
        if self.kind in ("copies", "both"):
            out += [{"kind": "copies", "gpu": g, "libcuda_path": self.libcuda_path} for g in self.gpus]
        if self.kind in ("memory", "both"):
            out += [{"kind": "memory", "node": self.memory_node} for _unused in range(self.memory_workers)]
        return out

    def __enter__(self):
        deadline = time.monotonic() + self.max_seconds
        try:
            for spec in self.specs():
                rfd, wfd = os.pipe()
                pid = os.fork()
                if pid == 0:
                    os.close(rfd)
                    _stressor(spec, self.cpus, deadline, wfd)
                os.close(wfd)
                self.children.append((pid, rfd, spec))
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self):
        """Until every stressor has allocated and started (or answered with its error), READY_TIMEOUT_S at most:
        the measurement then meets the whole load."""
        self._early = {}
        waiting = {rfd: pid for pid, rfd, _unused in self.children}
        end = time.monotonic() + READY_TIMEOUT_S
        while waiting and time.monotonic() < end:
            ready, _unused, _unused = select.select(list(waiting), [], [], max(0.0, end - time.monotonic()))
            for rfd in ready:
                chunk = os.read(rfd, 1)
                if chunk != READY:
                    self._early[rfd] = chunk  # an error answer (or EOF) instead of READY: kept for stop()
                del waiting[rfd]

    def __exit__(self, *exc):
        self.stop()
        return False

    def pids(self):
        return [pid for pid, _unused, _unused in self.children]

    def stop(self):
        """SIGTERM every stressor, wait up to STOP_GRACE_S for its answer, SIGKILL what is left; reap all."""
        for pid, _unused, _unused in self.children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        end = time.monotonic() + STOP_GRACE_S
        for pid, rfd, spec in self.children:
            data = getattr(self, "_early", {}).get(rfd, b"")
            while time.monotonic() < end:
                ready, _unused, _unused = select.select([rfd], [], [], max(0.0, end - time.monotonic()))
                if not ready:
                    break
                chunk = os.read(rfd, 1 << 16)
                if not chunk:
                    break
                data += chunk
            os.close(rfd)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            try:
                answer = json.loads(data.decode() or "{}")
            except ValueError:
                answer = {}
            if not answer:
                answer = {"error": "no answer (killed)"}
            self.results.append(dict(spec, **answer))
        self.children = []

    def describe(self):
        """What ran and how hard it pushed, for the probe report."""
        stressors = []
        for r in self.results:
            item = {"kind": r["kind"]}
            item.update({"gpu": r["gpu"]} if r["kind"] == "copies" else {"node": r.get("node")})
            if r.get("error"):
                item["error"] = r["error"]
            else:
                item["gbps"] = round(r["bytes"] / r["seconds"] / 1e9, 3) if r.get("seconds") else None
            stressors.append(item)
        total = {}
        for item in stressors:
            if item.get("gbps") is not None:
                total[item["kind"]] = round(total.get(item["kind"], 0.0) + item["gbps"], 3)
        return {"kind": self.kind, "cpus": self.cpus, "memory_node": self.memory_node,
                "stressors": stressors, "gbps": total}
