# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The CUDA driver API (``libcuda.so.1``) through ctypes, as the H2D probe uses it.

Part of the probe (``verify/h2d/probe.py``).
Standard library only.
"""

from __future__ import annotations

import ctypes

from ansible.module_utils.gpunuma.common.errors import GpunumaError

# CUDA driver API result codes the probe explains (cuda.h, CUresult).
CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_INSUFFICIENT_DRIVER = 35
CUDA_ERROR_DEVICES_UNAVAILABLE = 46  # exclusive-process compute mode, GPU held by another process
CUDA_ERROR_DEVICE_UNAVAILABLE = 46
CUDA_ERROR_NOT_SUPPORTED = 801
BUSY_CODES = (46,)

CU_STREAM_NON_BLOCKING = 0x1
CU_EVENT_DEFAULT = 0x0
CU_MEMHOSTALLOC_PORTABLE = 0x1
CU_MEMHOSTREGISTER_PORTABLE = 0x1
CU_DEVICE_ATTRIBUTE_COMPUTE_MODE = 20
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}


class CudaError(GpunumaError):
    """A CUDA driver call failed; ``code`` is the CUresult."""

    def __init__(self, call, code, name, text):
        self.call, self.code, self.name, self.text = call, code, name, text
        super().__init__("%s failed: %s (%d): %s" % (call, name, code, text))


class DriverMissing(GpunumaError):
    """libcuda could not be loaded: no NVIDIA driver on this node."""


# ---------------------------------------------------------------- CUDA driver


# The pointer and size arguments ctypes must not guess (the same for both runtimes' calls).
_ARGTYPES = {
    "cuMemcpyHtoDAsync": [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p],
    "cuMemcpyDtoHAsync": [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p],
    "cuEventRecord": [ctypes.c_void_p, ctypes.c_void_p],
    "cuMemHostRegister": [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint],
    "cuMemHostUnregister": [ctypes.c_void_p],
}


class Runtime:
    """What the probe asks of a GPU runtime, answered through ``call`` with the CUDA driver API's names
    (CudaDriver; h2d_hip.HipRuntime maps them onto HIP)."""

    def call(self, short, *args):
        raise NotImplementedError

    def bind(self, names):
        """``self.fn[short]`` for each ``{short: symbol}`` of the loaded library (returning int, with the
        argument types of :data:`_ARGTYPES`); the symbols it lacks."""
        self.fn = {}
        missing = []
        for short, symbol in names.items():
            try:
                f = getattr(self.lib, symbol)
            except AttributeError:
                missing.append(symbol)
                continue
            f.restype = ctypes.c_int
            f.argtypes = _ARGTYPES.get(short)
            self.fn[short] = f
        return missing

    def init(self):
        self.call("cuInit", 0)

    def device_count(self):
        n = ctypes.c_int(0)
        self.call("cuDeviceGetCount", ctypes.byref(n))
        return n.value

    def device(self, ordinal):
        dev = ctypes.c_int(0)
        self.call("cuDeviceGet", ctypes.byref(dev), ordinal)
        return dev.value

    def name_and_bus(self, dev):
        """The device's name and normalised PCI bus id."""
        name = ctypes.create_string_buffer(256)
        self.call("cuDeviceGetName", name, 256, dev)
        bus = ctypes.create_string_buffer(64)
        self.call("cuDeviceGetPCIBusId", bus, 64, dev)
        return name.value.decode(errors="replace"), normalise_bus_id(bus.value.decode())


class CudaDriver(Runtime):
    """ctypes wrapper over the libcuda entry points the probe uses."""

    kind = "cuda"

    def __init__(self, path="libcuda.so.1"):
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as exc:
            raise DriverMissing("cannot load the CUDA driver library %r (%s): no NVIDIA driver on this node?" % (path, exc))
        self.path = path
        self._bind()

    def _bind(self):
        names = {
            "cuInit": "cuInit", "cuDeviceGetCount": "cuDeviceGetCount", "cuDeviceGet": "cuDeviceGet",
            "cuDeviceGetName": "cuDeviceGetName", "cuDeviceGetPCIBusId": "cuDeviceGetPCIBusId",
            "cuDeviceGetUuid": "cuDeviceGetUuid", "cuDeviceGetAttribute": "cuDeviceGetAttribute",
            "cuCtxCreate": "cuCtxCreate_v2", "cuCtxDestroy": "cuCtxDestroy_v2",
            "cuStreamCreate": "cuStreamCreate", "cuStreamDestroy": "cuStreamDestroy_v2",
            "cuStreamSynchronize": "cuStreamSynchronize",
            "cuEventCreate": "cuEventCreate", "cuEventDestroy": "cuEventDestroy_v2",
            "cuEventRecord": "cuEventRecord", "cuEventSynchronize": "cuEventSynchronize",
            "cuEventElapsedTime": "cuEventElapsedTime",
            "cuMemAlloc": "cuMemAlloc_v2", "cuMemFree": "cuMemFree_v2",
            "cuMemHostAlloc": "cuMemHostAlloc", "cuMemFreeHost": "cuMemFreeHost",
            "cuMemHostRegister": "cuMemHostRegister_v2", "cuMemHostUnregister": "cuMemHostUnregister",
            "cuMemcpyHtoDAsync": "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync": "cuMemcpyDtoHAsync_v2",
            "cuGetErrorName": "cuGetErrorName", "cuGetErrorString": "cuGetErrorString",
            "cuDriverGetVersion": "cuDriverGetVersion",
        }
        missing = self.bind(names)
        if missing:
            raise DriverMissing("the CUDA driver library %r lacks %s: driver too old or not libcuda"
                                % (self.path, ", ".join(missing)))

    def error_text(self, code):
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        if self.fn["cuGetErrorName"](code, ctypes.byref(name)) != 0 or not name.value:
            return "CUDA_ERROR_%d" % code, "unknown CUDA error"
        self.fn["cuGetErrorString"](code, ctypes.byref(text))
        return name.value.decode(), (text.value or b"").decode()

    def call(self, short, *args):
        code = self.fn[short](*args)
        if code != CUDA_SUCCESS:
            name, text = self.error_text(code)
            raise CudaError(short, code, name, text)

    def describe(self, dev):
        name, bus = self.name_and_bus(dev)
        uuid = (ctypes.c_ubyte * 16)()
        self.call("cuDeviceGetUuid", uuid, dev)
        mode = ctypes.c_int(0)
        self.call("cuDeviceGetAttribute", ctypes.byref(mode), CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, dev)
        h = bytes(uuid).hex()
        return {
            "name": name,
            "pci_bus_id": bus,
            "uuid": "GPU-%s-%s-%s-%s-%s" % (h[0:8], h[8:12], h[12:16], h[16:20], h[20:32]),
            "compute_mode": COMPUTE_MODES.get(mode.value, str(mode.value)),
        }

    def driver_version(self):
        v = ctypes.c_int(0)
        self.call("cuDriverGetVersion", ctypes.byref(v))
        return "%d.%d" % (v.value // 1000, v.value % 1000 // 10)


def normalise_bus_id(text):
    """``00000000:06:00.0`` / ``0000:06:00.0`` → ``0000:06:00.0`` (lower case, 4-digit domain)."""
    text = text.strip().lower()
    parts = text.split(":")
    if len(parts) == 3:
        return "%04x:%s:%s" % (int(parts[0], 16), parts[1], parts[2])
    if len(parts) == 2:
        return "0000:" + text
    return text
