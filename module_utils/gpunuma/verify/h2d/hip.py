# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The HIP runtime (``libamdhip64.so``) through ctypes, behind the interface the probe uses for CUDA.

:class:`HipRuntime` answers the probe's driver-API calls (``cuMemAlloc``, ``cuMemcpyHtoDAsync``, ...) with
their HIP counterparts (``hipMalloc``, ``hipMemcpyHtoDAsync``, ...), so the measurement, placements,
binding checks and statistics of ``verify/h2d/probe.py`` are the same code for both vendors. HIP has no context
object: ``cuCtxCreate`` is ``hipSetDevice`` and ``cuCtxDestroy`` has nothing to release. HIP keeps CUDA's
numbers for the errors the probe explains (2 out of memory, 35 insufficient driver, 100 no device).
A failing call raises :class:`~gpunuma.verify.h2d.cuda.CudaError` naming the HIP function and error.

Part of the probe; standard library only.
"""

from __future__ import annotations

import ctypes

from ansible.module_utils.gpunuma.verify.h2d.cuda import CudaDriver, CudaError, DriverMissing, Runtime

HIP_SUCCESS = 0
DEFAULT_PATH = "libamdhip64.so"
RUNTIMES = ("auto", "cuda", "hip")


def open_runtime(library):
    """The GPU runtime the probe measures with. ``library``: a libcuda path (CUDA), or the probe's options
    ``{"runtime": auto|cuda|hip, "libcuda_path", "libhip_path"}``; ``auto`` takes CUDA's driver API where
    libcuda loads, else HIP. Raises DriverMissing naming every library tried."""
    if isinstance(library, str):
        return CudaDriver(library)
    runtime = library.get("runtime", "auto")
    missing = []
    if runtime in ("auto", "cuda"):
        try:
            return CudaDriver(library["libcuda_path"])
        except DriverMissing as exc:
            if runtime == "cuda":
                raise
            missing.append(str(exc))
    try:
        return HipRuntime(library.get("libhip_path") or DEFAULT_PATH)
    except DriverMissing as exc:
        raise DriverMissing("; ".join(missing + [str(exc)]))

# The probe's call -> (HIP symbol, argument adapter). ``_same`` passes the arguments through.


def _same(*args):
    return args


def _ptr(value):
    """A device or host pointer given as ``c_uint64``/``c_void_p``/int, as HIP's ``void *``."""
    return (ctypes.c_void_p(value.value) if isinstance(value, (ctypes.c_uint64, ctypes.c_void_p))
            else ctypes.c_void_p(value),)


_CALLS = {
    "cuInit": ("hipInit", _same),
    "cuDeviceGetCount": ("hipGetDeviceCount", _same),
    "cuDeviceGet": ("hipDeviceGet", _same),
    "cuDeviceGetName": ("hipDeviceGetName", _same),
    "cuDeviceGetPCIBusId": ("hipDeviceGetPCIBusId", _same),
    "cuDeviceGetUuid": ("hipDeviceGetUuid", _same),
    "cuDriverGetVersion": ("hipDriverGetVersion", _same),
    "cuCtxCreate": ("hipSetDevice", lambda ctx, flags, dev: (dev,)),
    "cuStreamCreate": ("hipStreamCreateWithFlags", _same),
    "cuStreamDestroy": ("hipStreamDestroy", _same),
    "cuStreamSynchronize": ("hipStreamSynchronize", _same),
    "cuEventCreate": ("hipEventCreateWithFlags", _same),
    "cuEventDestroy": ("hipEventDestroy", _same),
    "cuEventRecord": ("hipEventRecord", _same),
    "cuEventSynchronize": ("hipEventSynchronize", _same),
    "cuEventElapsedTime": ("hipEventElapsedTime", _same),
    "cuMemAlloc": ("hipMalloc", _same),
    "cuMemFree": ("hipFree", _ptr),
    "cuMemHostAlloc": ("hipHostMalloc", _same),  # hipHostMallocPortable is 0x1, as CU_MEMHOSTALLOC_PORTABLE
    "cuMemFreeHost": ("hipHostFree", _same),
    "cuMemHostRegister": ("hipHostRegister", _same),  # hipHostRegisterPortable is 0x1, as CUDA's
    "cuMemHostUnregister": ("hipHostUnregister", _same),
    "cuMemcpyHtoDAsync": ("hipMemcpyHtoDAsync", _same),
    "cuMemcpyDtoHAsync": ("hipMemcpyDtoHAsync", _same),
}
# Calls with nothing to do in HIP.
_NOTHING = ("cuCtxDestroy",)


class HipRuntime(Runtime):
    """ctypes wrapper over the libamdhip64 entry points the probe uses, answering the CUDA names."""

    kind = "hip"

    def __init__(self, path=DEFAULT_PATH):
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as exc:
            raise DriverMissing("cannot load the HIP runtime library %r (%s): no ROCm on this node?" % (path, exc))
        self.path = path
        missing = self.bind(dict((short, symbol) for short, (symbol, _adapt) in _CALLS.items()))
        for symbol in ("hipGetErrorName", "hipGetErrorString"):
            try:
                getattr(self.lib, symbol).restype = ctypes.c_char_p
            except AttributeError:
                missing.append(symbol)
        if missing:
            raise DriverMissing("the HIP runtime library %r lacks %s: ROCm too old or not libamdhip64"
                                % (path, ", ".join(missing)))
        self.fn["cuMemFree"].argtypes = [ctypes.c_void_p]  # hipFree takes a pointer, cuMemFree a CUdeviceptr

    def error_text(self, code):
        name = self.lib.hipGetErrorName(code)
        text = self.lib.hipGetErrorString(code)
        return ((name or b"hipError%d" % code).decode(errors="replace"),
                (text or b"unknown HIP error").decode(errors="replace"))

    def call(self, short, *args):
        if short in _NOTHING:
            return
        symbol, adapt = _CALLS[short]
        code = self.fn[short](*adapt(*args))
        if code != HIP_SUCCESS:
            name, text = self.error_text(code)
            raise CudaError(symbol, code, name, text)

    def describe(self, dev):
        """Name, bus id, UUID and compute mode. hipDeviceGetUuid gives the 16 characters of the GPU's
        unique_id (ROCm's ``GPU-<unique_id>``); AMD GPUs have no compute modes ("default")."""
        name, bus = self.name_and_bus(dev)
        uuid = ctypes.create_string_buffer(17)
        self.call("cuDeviceGetUuid", uuid, dev)
        raw = uuid.raw[:16].rstrip(b"\0").decode("ascii", "replace")
        return {"name": name, "pci_bus_id": bus, "uuid": "GPU-%s" % raw if raw else "GPU-unknown",
                "compute_mode": "default"}

    def driver_version(self):
        v = ctypes.c_int(0)
        self.call("cuDriverGetVersion", ctypes.byref(v))
        return "hip %d" % v.value
