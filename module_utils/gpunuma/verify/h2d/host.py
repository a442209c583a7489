# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The host side of the H2D probe: PCIe link figures, NUMA nodes, and the libc calls a placement child binds with.

Part of the probe (``verify/h2d/probe.py``).
Standard library only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import platform

from ansible.module_utils.gpunuma.common.cpulist import parse_cpulist
from ansible.module_utils.gpunuma.common.errors import GpunumaError


class ProbeError(GpunumaError):
    """Bad probe options, or a failure that stops the whole probe."""


MPOL_DEFAULT = 0
MPOL_BIND = 2

# PCIe per-lane transfer rate (GT/s) and line-code efficiency by generation
# (PCI-SIG base specifications: 8b/10b for Gen1-2, 128b/130b for Gen3-5,
# 1b/1b FLIT mode with 242/256 payload for Gen6).
PCIE_LANE_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
PCIE_ENCODING = {1: 0.8, 2: 0.8, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256}

# syscall numbers by architecture (asm/unistd.h)
_SYSCALLS = {
    "x86_64": {"set_mempolicy": 238, "get_mempolicy": 239, "move_pages": 279},
    "aarch64": {"set_mempolicy": 237, "get_mempolicy": 236, "move_pages": 239},
    "ppc64le": {"set_mempolicy": 261, "get_mempolicy": 260, "move_pages": 301},
}


# ---------------------------------------------------------------- PCIe


def pcie_theoretical_gbps(gen, width):
    """Return (raw, after line encoding) one-direction bandwidth in GB/s (1e9 bytes/s), or (None, None)."""
    if gen not in PCIE_LANE_GTS or not isinstance(width, int) or width <= 0:
        return None, None
    raw = PCIE_LANE_GTS[gen] * width / 8.0
    return raw, raw * PCIE_ENCODING[gen]


def _sysfs_pcie(bus_id, root="/"):
    """PCIe generation/width of a device from sysfs (fallback when NVML is missing)."""
    base = os.path.join(root, "sys/bus/pci/devices", bus_id)
    gts_to_gen = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
    out = {}
    for prefix, key in (("max_link", "max"), ("current_link", "current")):
        try:
            with open(os.path.join(base, prefix + "_speed")) as fh:
                speed = float(fh.read().split()[0])
            with open(os.path.join(base, prefix + "_width")) as fh:
                width = int(fh.read().strip())
        except (OSError, ValueError, IndexError):
            continue
        out[key] = {"gen": gts_to_gen.get(speed), "width": width}
    return out


def pcie_link(bus_id, nvml=None, root="/"):
    """PCIe link of a GPU: NVML first (``nvidia-ml-py``), else sysfs. Returns a dict."""
    link = {"source": None, "gen_max": None, "width_max": None, "gen_current": None, "width_current": None}
    if nvml is not None:
        try:
            handle = nvml.nvmlDeviceGetHandleByPciBusId(bus_id.encode() if isinstance(bus_id, str) else bus_id)
            link.update(gen_max=nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle),
                        width_max=nvml.nvmlDeviceGetMaxPcieLinkWidth(handle),
                        gen_current=nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle),
                        width_current=nvml.nvmlDeviceGetCurrPcieLinkWidth(handle), source="nvml")
        except Exception:  # NVML is optional; any failure falls back to sysfs
            pass
    if link["source"] is None:
        sysfs = _sysfs_pcie(bus_id, root)
        if sysfs:
            link["source"] = "sysfs"
            link.update(gen_max=sysfs.get("max", {}).get("gen"), width_max=sysfs.get("max", {}).get("width"),
                        gen_current=sysfs.get("current", {}).get("gen"), width_current=sysfs.get("current", {}).get("width"))
    raw, encoded = pcie_theoretical_gbps(link["gen_max"], link["width_max"])
    link["theoretical_raw_gbps"] = raw
    link["theoretical_gbps"] = round(encoded, 3) if encoded else None
    return link


# ---------------------------------------------------------------- NUMA / host


def read_numa_nodes(root="/"):
    """{node id: {"cpus": set, "distances": [..]}} from sysfs; one node 0 with all CPUs when sysfs has no NUMA."""
    base = os.path.join(root, "sys/devices/system/node")
    nodes = {}
    try:
        names = os.listdir(base)
    except OSError:
        names = []
    for name in names:
        if not (name.startswith("node") and name[4:].isdigit()):
            continue
        nid = int(name[4:])
        try:
            with open(os.path.join(base, name, "cpulist")) as fh:
                cpus = parse_cpulist(fh.read().strip(), what="%s/%s/cpulist" % (base, name))
        except OSError:
            cpus = set()
        try:
            with open(os.path.join(base, name, "distance")) as fh:
                distances = [int(x) for x in fh.read().split()]
        except (OSError, ValueError):
            distances = []
        nodes[nid] = {"cpus": set(cpus), "distances": distances}
    if not nodes:
        nodes[0] = {"cpus": set(os.sched_getaffinity(0)), "distances": [10]}
    return nodes


def gpu_numa_node(bus_id, nodes, root="/"):
    """The CPU-bearing node of a GPU: sysfs numa_node, else the node holding most of its local CPUs."""
    base = os.path.join(root, "sys/bus/pci/devices", bus_id)
    try:
        with open(os.path.join(base, "numa_node")) as fh:
            nid = int(fh.read().strip())
        if nid in nodes and nodes[nid]["cpus"]:
            return nid, "sysfs numa_node"
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(base, "local_cpulist")) as fh:
            local = parse_cpulist(fh.read().strip(), what="%s/local_cpulist" % base)
        best = max(sorted(nodes), key=lambda n: len(nodes[n]["cpus"] & set(local)))
        if nodes[best]["cpus"] & set(local):
            return best, "sysfs local_cpulist"
    except (OSError, GpunumaError, ValueError):
        pass
    cpu_nodes = [n for n in sorted(nodes) if nodes[n]["cpus"]]
    if len(cpu_nodes) == 1:
        return cpu_nodes[0], "only CPU-bearing node"
    return None, "unknown"


def choose_remote(local, nodes, override=None):
    """The remote CPU-bearing node: ``override`` if given, else the farthest from ``local`` (lowest id on ties)."""
    cpu_nodes = [n for n in sorted(nodes) if nodes[n]["cpus"]]
    if override is not None:
        if override not in cpu_nodes:
            raise ProbeError("remote_node is %r; it must be a CPU-bearing NUMA node of this host (%s)"
                             % (override, ", ".join(str(n) for n in cpu_nodes) or "none"))
        if override == local:
            raise ProbeError("remote_node is %r, the GPU's own node; choose another CPU-bearing node" % override)
        return override
    others = [n for n in cpu_nodes if n != local]
    if local is None or not others:
        return None
    dist = nodes[local]["distances"]

    def distance(n):
        return dist[n] if n < len(dist) else 0

    return sorted(others, key=lambda n: (-distance(n), n))[0]


class Libc:
    """The few libc/syscall entry points the placement child needs."""

    def __init__(self):
        self.lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.lib.syscall.restype = ctypes.c_long
        self.nr = _SYSCALLS.get(platform.machine())

    def _syscall(self, name, *args):
        if not self.nr:
            raise OSError(38, "%s: no syscall number known for %s" % (name, platform.machine()))
        res = self.lib.syscall(ctypes.c_long(self.nr[name]), *args)
        if res < 0:
            err = ctypes.get_errno()
            raise OSError(err, "%s: %s" % (name, os.strerror(err)))
        return res

    def set_mempolicy(self, mode, node_ids):
        maxnode = max(list(node_ids) + [0]) + 2
        words = (maxnode + 63) // 64
        mask = (ctypes.c_ulong * words)()
        for n in node_ids:
            mask[n // 64] |= 1 << (n % 64)
        if mode == MPOL_DEFAULT:
            return self._syscall("set_mempolicy", ctypes.c_int(mode), None, ctypes.c_ulong(0))
        return self._syscall("set_mempolicy", ctypes.c_int(mode), mask, ctypes.c_ulong(words * 64))

    def get_mempolicy(self):
        mode = ctypes.c_int(0)
        words = 16
        mask = (ctypes.c_ulong * words)()
        self._syscall("get_mempolicy", ctypes.byref(mode), mask, ctypes.c_ulong(words * 64), None, ctypes.c_ulong(0))
        nodes = [w * 64 + b for w in range(words) for b in range(64) if mask[w] >> b & 1]
        return mode.value, nodes

    def page_nodes(self, address, length, samples=256):
        """Count sampled pages of [address, address+length) by NUMA node with move_pages(nodes=NULL)."""
        page = mmap.PAGESIZE
        npages = max(1, length // page)
        step = max(1, npages // samples)
        idx = list(range(0, npages, step))
        pages = (ctypes.c_void_p * len(idx))(*[address + i * page for i in idx])
        status = (ctypes.c_int * len(idx))()
        self._syscall("move_pages", ctypes.c_int(0), ctypes.c_ulong(len(idx)), pages, None, status, ctypes.c_int(0))
        counts = {}
        for s in status:
            key = str(s) if s >= 0 else "error%d" % -s
            counts[key] = counts.get(key, 0) + 1
        return counts


def read_status_binding(path="/proc/self/status"):
    out = {}
    with open(path) as fh:
        for line in fh:
            key, _unused, value = line.partition(":")
            if key in ("Cpus_allowed_list", "Mems_allowed_list"):
                out[key] = value.strip()
    return out
