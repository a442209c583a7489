"""Read the NUMA, CPU and PCI layout of a host from sysfs and procfs.

``read_host(root)`` reads a tree that holds ``sys/`` and ``proc/``: ``/`` on
the live host, or a copy of the relevant files (support bundles, captured
fixtures, synthetic test trees). Only the files discovery needs are opened:

* ``sys/devices/system/node/node<N>/{cpulist,cpumap,meminfo,distance}`` and
  ``node<N>/hugepages/hugepages-<size>kB/nr_hugepages``
* ``sys/devices/system/cpu/online`` and
  ``sys/devices/system/cpu/cpu<N>/topology/{core_id,thread_siblings_list}``
  once per core, ``{physical_package_id,package_cpus_list}`` (or
  ``core_siblings_list``) once per package
* ``sys/bus/pci/devices/<bdf>/{vendor,device,class,numa_node,local_cpulist
  (else local_cpus),max_link_speed,max_link_width,current_link_speed,
  current_link_width,_realpath}`` and the names under ``net/`` (or
  ``virtio<N>/net/``), ``infiniband/`` and ``nvme/``
* ``proc/meminfo`` (only for a kernel without NUMA) and
  ``proc/sys/kernel/numa_balancing``

On a live host ``sys/bus/pci/devices/<bdf>`` are symlinks into
``sys/devices/pci<domain>:<bus>/...``; copies that could not keep symlinks hold
the link target in a ``_realpath`` file instead. Both are read.

Errors versus warnings
----------------------

Files that define which CPUs belong to which NUMA node and which CPUs are
hyperthread siblings are what every binding is computed from; a wrong or
partial answer there would be presented as a complete topology and produce
wrong bindings. So these raise :class:`SysfsError` naming the file when they
exist but cannot be read or hold garbage:

* ``node<N>/cpulist`` (and ``node<N>/cpumap`` when ``cpulist`` is absent; a
  node with neither also raises);
* two node lists claiming the same CPU;
* ``cpu<N>/topology/{physical_package_id,core_id,thread_siblings_list}``
  (a CPU without ``topology/``, as an offline one, gets ``None`` values);
* ``cpu/online`` when it is the only source of CPUs (kernel without NUMA);
* ``sys/devices/system/node`` itself when it exists but cannot be listed.

``root`` that does not exist, is not a directory or has no ``sys/`` also
raises. A missing ``sys/devices/system/node`` (kernel without NUMA) does not:
one node 0 holding every online CPU, with the memory of ``proc/meminfo``, is
reported with a warning.

Everything else degrades: an unreadable or malformed file adds a warning
naming the file to ``warnings`` and its value becomes ``None`` (``[]`` for
distances and device name lists): node ``meminfo`` and ``distance``, every PCI
attribute, ``numa_balancing``, ``cpu/online``, ``cpu<N>/cache/index3/shared_cpu_list``
(the CPU's L3 group, read when ``index3/level`` is 3; absent: no ``l3``). A PCI ``numa_node`` naming a
node the host does not have is also ``None`` with a warning (``raw_numa_node``
keeps what the file said). Files that are routinely absent
on real hosts (link attributes of integrated devices, ``net/`` of a GPU,
``numa_balancing`` on kernels built without it) are ``None`` or ``[]``
without a warning; a missing node ``meminfo`` or ``distance``, which a NUMA
kernel always provides, warns.

Bounds and completeness
-----------------------

Every file is read through :func:`read_bounded`: a regular file that is not
a symbolic link, of at most ``MAX_ATTRIBUTE_BYTES`` (64 KiB: a sysfs
attribute holds at most one page), its type checked before ``open()`` so a
FIFO, a device node or a link to ``/dev/zero`` is never opened. A refused
file is unreadable, and the rule above applies (error for topology-defining
files, warning naming the file otherwise). A ``bus/pci/devices`` entry must
be a directory inside the tree's ``sys/devices``; a loop, a dangling link or
a link elsewhere loses the device with one warning.

``lost`` lists every path whose value was lost: present but unreadable,
refused or malformed, a directory that could not be listed, an entry that is
not a bus id or device name, a PCI function without ``vendor``, ``device``
or ``class``, a missing node ``meminfo``/``distance``. Discovery reports
``complete: false`` when it is not empty. Warnings that lose nothing (a
kernel without NUMA) are not listed.
"""

from __future__ import annotations

import errno
import os
import re
import stat

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, parse_cpulist, parse_cpumask
from ansible.module_utils.gpunuma.common import bounded
from ansible.module_utils.gpunuma.common.bounded import file_kind as _file_kind
from ansible.module_utils.gpunuma.common.bounded import read_bounded  # noqa: F401 (public here too)
from ansible.module_utils.gpunuma.common.errors import CpuListError, SysfsError

NVIDIA_VENDOR = "0x10de"
# AMD Instinct GPUs: vendor 0x1002 with the class of a processing accelerator (0x1200, MI300 series), a
# display controller (0x0380, MI100/MI200) or a 3D controller (0x0302); a VGA controller (0x0300) of
# that vendor is an APU's or a workstation card, not counted.
AMD_VENDOR = "0x1002"
AMD_INSTINCT_CLASSES = ("0x1200", "0x0380", "0x0302")
_AMD_UNIQUE_ID_RE = re.compile(r"(?:0x)?([0-9a-fA-F]{1,16})", re.ASCII)


def is_nvidia_gpu(vendor, pci_class):
    """A PCI function's vendor and class (sysfs text) name an NVIDIA GPU: class 0x0300xx (VGA) or 0x0302xx (3D)."""
    return vendor == NVIDIA_VENDOR and bool(pci_class) and pci_class[:6] in ("0x0300", "0x0302")


def is_amd_instinct(vendor, pci_class):
    """A PCI function's vendor and class (sysfs text) name an AMD Instinct GPU."""
    return vendor == AMD_VENDOR and bool(pci_class) and pci_class[:6] in AMD_INSTINCT_CLASSES


def amd_gpu_uuid(unique_id):
    """The UUID ROCm gives an AMD GPU (``GPU-<hex>``, what ROCR_VISIBLE_DEVICES takes) from its
    ``unique_id`` sysfs attribute, or None when there is none."""
    match = _AMD_UNIQUE_ID_RE.fullmatch((unique_id or "").strip())
    if not match or int(match.group(1), 16) == 0:
        return None
    return "GPU-%s" % match.group(1).lower().rjust(16, "0")


# Every pattern is matched in full (fullmatch: "$" would accept a final
# newline) and with ASCII digits only: int() also takes "\u0661", and
# isdigit() is true for "\u00b2", which int() refuses.
_NODE_DIR_RE = re.compile(r"node([0-9]+)", re.ASCII)
_CPU_DIR_RE = re.compile(r"cpu([0-9]+)", re.ASCII)
# Node and CPU directory ids as the kernel writes them: no leading zeros,
# below MAX_NUMNODES (1 << NODES_SHIFT, NODES_SHIFT at most 10) and NR_CPUS
# (at most 8192), the limits the CPU list parser applies too.
_DIR_ID_RE = re.compile(r"0|[1-9][0-9]{0,3}", re.ASCII)
_MAX_DIR_ID = {"node": 1023, "cpu": 8191}
# Domains are 4 hex digits on most hosts; Intel VMD exposes 5-digit ones.
_BDF_RE = re.compile(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", re.ASCII)
_HEX_RE = re.compile(r"0x[0-9a-f]{1,8}", re.ASCII)
# 18 digits fit any 64-bit value and stay clear of Python's int() digit limit.
_INT_RE = re.compile(r"-?[0-9]{1,18}", re.ASCII)
_HUGEPAGES_DIR_RE = re.compile(r"hugepages-([0-9]{1,10})kB", re.ASCII)
_MEMINFO_NODE_RE = re.compile(r"Node\s+([0-9]{1,7})\s+(\S+):\s+([0-9]{1,18})(?:\s+kB)?\s*", re.ASCII)
_MEMINFO_RE = re.compile(r"(\S+):\s+([0-9]{1,18})(?:\s+kB)?\s*", re.ASCII)
_DISTANCE_RE = re.compile(r"[0-9]{1,9}", re.ASCII)
_SPEED_RE = re.compile(r"\s*([0-9]{1,4}(?:\.[0-9]{1,4})?)\s*GT/s", re.ASCII)
# A netdev, RDMA or NVMe name as the kernel allows them (dev_valid_name():
# no "/", ":" or white space; IB_DEVICE_NAME_MAX is 64), printable.
_DEVICE_NAME_RE = re.compile(r"[^\s/:\x00-\x1f\x7f]{1,64}")

_MISSING_ERRNOS = (errno.ENOENT, errno.ENOTDIR)

# PCIe generation by per-lane transfer rate (GT/s), as the kernel writes it in
# max_link_speed / current_link_speed ("2.5 GT/s PCIe", "32.0 GT/s PCIe").
_GEN_BY_SPEED = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}

_MISSING = object()

# Read bounds. A sysfs attribute holds at most one page (PAGE_SIZE: 4 KiB on
# x86_64, up to 64 KiB on arm64 kernels built with 64K pages, as on many
# Grace hosts), and the CPU list and mask files that became binary attributes
# in Linux 5.14 stay below CPULIST_FILE_MAX_BYTES = NR_CPUS * 7 / 2 (28 KiB
# for NR_CPUS = 8192). proc/meminfo is about 1.5 KiB. One cap covers them all.
MAX_ATTRIBUTE_BYTES = bounded.MAX_ATTRIBUTE_BYTES
# How much of an unexpected value a warning or error quotes.
_QUOTE_CHARS = 60


def quote(value, limit=_QUOTE_CHARS):
    """``repr`` of a value read from a file, cut to ``limit`` characters with its full length."""
    if isinstance(value, (str, bytes)) and len(value) > limit:
        return "%r... (%d characters)" % (value[:limit], len(value))
    return repr(value)


def _lkind(path):
    """What sits at ``path`` (not following a final link), for messages."""
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        return "unreadable (%s)" % (exc.strerror or exc)
    if stat.S_ISLNK(mode):
        try:
            return "a symbolic link to %s" % os.readlink(path)
        except OSError:
            return "a symbolic link"
    return "a regular file" if stat.S_ISREG(mode) else _file_kind(mode)


def _clip(message, limit=600):
    """Messages quote what they read; keep one from growing with the input."""
    if len(message) > limit:
        return "%s... (%d characters in all)" % (message[:limit], len(message))
    return message


def pcie_gen_from_speed(speed):
    """PCIe generation for a sysfs link speed: ``"32.0 GT/s PCIe"`` -> ``5``.

    2.5 -> 1, 5 -> 2, 8 -> 3, 16 -> 4, 32 -> 5, 64 -> 6 GT/s. Anything else
    (``None``, ``"Unknown"``, an unlisted rate) is ``None``.
    """
    if not isinstance(speed, str):
        return None
    match = _SPEED_RE.match(speed)
    if not match:
        return None
    return _GEN_BY_SPEED.get(float(match.group(1)))


def gpu_functions(host):
    """PCI functions of GPUs: NVIDIA's (:func:`is_nvidia_gpu`) and AMD Instinct ones (:func:`is_amd_instinct`)."""
    return [
        dev
        for dev in host["pci"]
        if is_nvidia_gpu(dev["vendor"], dev["class"]) or is_amd_instinct(dev["vendor"], dev["class"])
    ]


def nic_functions(host):
    """PCI functions of network controllers: class 0x02xxxx (Ethernet, InfiniBand, other)."""
    return [dev for dev in host["pci"] if dev["class"] is not None and dev["class"][:4] == "0x02"]


def nvme_functions(host):
    """PCI functions of NVMe controllers: class 0x010802."""
    return [dev for dev in host["pci"] if dev["class"] == "0x010802"]


def read_host(root="/"):
    """Read NUMA nodes, CPUs, PCI devices and AutoNUMA state under ``root``.

    ``root`` holds ``sys/`` and ``proc/`` (``"/"`` for the live host). Returns::

        {"numa_nodes": [{"id", "cpus", "has_cpus", "memory_total_bytes",
                         "memory_free_bytes", "distances"}],   # by id
         "cpus": [{"id", "node", "package", "core", "siblings", "online", "l3"}],  # by id
         # node: the NUMA node whose cpulist holds the CPU, or None;
         # package/core: ints or None (absent, or -1); siblings: canonical
         # thread_siblings_list or None; online: per cpu/online, None if unknown;
         # l3 (only when known): canonical cache/index3/shared_cpu_list
         "sockets": int | None,
         "pci": [{"pci_bus_id", "vendor", "device", "class", "numa_node",
                  "raw_numa_node", "local_cpulist", "max_link_speed",
                  "max_link_width", "current_link_speed", "current_link_width",
                  "netdevs", "rdma", "nvme", "realpath"}],      # by pci_bus_id
         "numa_balancing": int | None,
         "warnings": [str],
         "lost": [str]}   # sorted paths whose value was lost (see the module docstring)

    Raises :class:`SysfsError` naming the path when ``root`` is not a
    directory holding ``sys/``, or when a file listed in the module docstring
    as topology-defining is unreadable or malformed.
    """
    if not isinstance(root, (str, bytes, os.PathLike)):
        raise SysfsError("sysfs root must be a path, got %s" % type(root).__name__)
    root = os.fsdecode(os.fspath(root))
    if not os.path.isdir(root):
        if os.path.exists(root):
            raise SysfsError("sysfs root %s is not a directory; expected a directory holding sys/ and proc/" % root)
        raise SysfsError("sysfs root %s does not exist; expected a directory holding sys/ and proc/" % root)
    if not os.path.isdir(os.path.join(root, "sys")):
        raise SysfsError(
            "sysfs root %s has no sys/ directory; expected a directory holding sys/ and proc/ "
            "(\"/\" on the live host)" % root
        )
    return _HostReader(root).read()


class _HostReader:
    def __init__(self, root):
        self.root = root
        self.warnings = []
        # Paths whose value was lost: present but unreadable, malformed or
        # refused (see read_bounded), or a directory that could not be listed.
        self.lost = []
        self.node_ids = None
        # Many files repeat the same CPU list text (sibling pairs, a node's
        # local_cpulist on each of its devices): parse each spelling once.
        self._cpu_cache = {}
        self._cpu_ids = None
        self._devices_dir = None

    # -- low-level reading -------------------------------------------------

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    @staticmethod
    def _read_raw(path):
        # os.open/os.read rather than file objects: on large hosts this runs
        # a thousand times. read_bounded refuses anything but a small regular file.
        return read_bounded(path).decode("utf-8", "replace")

    def warn_lost(self, path, message):
        """A warning for a value that existed but could not be used: the result is incomplete."""
        self.warnings.append(message)
        self.lost.append(path)

    def read_text(self, path, required=False, warn_missing=False):
        """File text, or ``_MISSING`` when absent, or ``None`` after a warning.

        ``required`` turns unreadable files (not absent ones) into SysfsError.
        """
        try:
            return self._read_raw(path)
        except OSError as exc:
            if exc.errno in _MISSING_ERRNOS:
                if warn_missing:
                    self.warn_lost(path, "%s is missing" % path)
                return _MISSING
            message = "cannot read %s: %s" % (path, exc.strerror or exc)
            if required:
                raise SysfsError(message)
            self.warn_lost(path, message + "; value treated as unknown")
            return None

    def listdir(self, path, what):
        """Sorted entries of a directory; [] when absent; [] and a warning when unreadable."""
        try:
            return sorted(os.listdir(path))
        except OSError as exc:
            if exc.errno in _MISSING_ERRNOS and not os.path.lexists(path):
                return []
            if exc.errno in _MISSING_ERRNOS:
                why = "it is %s, not a directory" % _lkind(path)
            else:
                why = exc.strerror or str(exc)
            self.warn_lost(path, "cannot list %s (%s): %s" % (path, what, why))
            return []

    def device_names(self, path, what):
        """Entries of a net/, infiniband/ or nvme/ directory that are valid kernel device names."""
        names = []
        for name in self.listdir(path, what):
            if _DEVICE_NAME_RE.fullmatch(name):
                names.append(name)
            else:
                self.warn_lost(path, "%s: entry %s is not a device name (1-64 printable characters without "
                                     "white space, '/' or ':'); skipped" % (path, quote(name)))
        return names

    def optional_int(self, path, allow_negative=True, warn_missing=False):
        text = self.read_text(path, warn_missing=warn_missing)
        if text is _MISSING or text is None:
            return None
        value = text.strip()
        if not _INT_RE.fullmatch(value) or (not allow_negative and value.startswith("-")):
            self.warn_lost(
                path,
                "%s holds %s, not %s; value treated as unknown"
                % (path, quote(value), "an integer" if allow_negative else "a non-negative integer"),
            )
            return None
        return int(value)

    def required_int(self, path):
        """Integer from a topology-defining file: None when absent, SysfsError when bad."""
        text = self.read_text(path, required=True)
        if text is _MISSING:
            return None
        value = text.strip()
        if not _INT_RE.fullmatch(value):
            raise SysfsError("%s holds %s; expected an integer" % (path, quote(value)))
        return int(value)

    def parse_cpus(self, text, path, mask=False):
        """(frozenset, canonical list) for a CPU list or mask text; CpuListError when bad."""
        key = (text, mask)
        hit = self._cpu_cache.get(key)
        if hit is None:
            try:
                cpus = parse_cpumask(text, path) if mask else parse_cpulist(text, path)
            except CpuListError as exc:
                raise CpuListError(_clip(str(exc)))
            except (ValueError, OverflowError, MemoryError) as exc:
                # int() refuses more than 4300 decimal digits with a plain ValueError.
                raise CpuListError("%s %s is not a %s: %s" % (
                    path, quote(text.strip()), "CPU mask" if mask else "CPU list", _clip(str(exc))))
            hit = (cpus, format_cpulist(cpus))
            self._cpu_cache[key] = hit
        return hit

    def required_cpus(self, path, mask=False):
        """(set, canonical) from a topology-defining list or mask: None when absent, SysfsError when bad."""
        text = self.read_text(path, required=True)
        if text is _MISSING:
            return None
        try:
            return self.parse_cpus(text, path, mask)
        except CpuListError as exc:
            raise SysfsError(str(exc))

    # -- NUMA nodes ----------------------------------------------------------

    def read_nodes(self):
        node_root = self.path("sys", "devices", "system", "node")
        try:
            entries = os.listdir(node_root)
        except OSError as exc:
            if exc.errno not in _MISSING_ERRNOS:
                raise SysfsError("cannot list %s: %s" % (node_root, exc.strerror or exc))
            if os.path.lexists(node_root):
                # A file or a link where the directory belongs: not a kernel without NUMA.
                raise SysfsError("cannot list %s: it is %s, not a directory" % (node_root, _lkind(node_root)))
            return None
        ids = sorted(self.dir_ids(node_root, entries, _NODE_DIR_RE, "node"))
        if not ids:
            return None

        nodes = []
        for node_id in ids:
            node_dir = os.path.join(node_root, "node%d" % node_id)
            parsed = self.required_cpus(os.path.join(node_dir, "cpulist"))
            if parsed is None:
                parsed = self.required_cpus(os.path.join(node_dir, "cpumap"), mask=True)
            if parsed is None:
                raise SysfsError(
                    "%s has neither cpulist nor cpumap; cannot tell which CPUs node %d holds"
                    % (node_dir, node_id)
                )
            total, free = self.read_node_meminfo(os.path.join(node_dir, "meminfo"), node_id)
            distances = self.read_distances(os.path.join(node_dir, "distance"), len(ids))
            cpus, canonical = parsed
            nodes.append(
                {
                    "id": node_id,
                    "cpus": canonical,
                    "has_cpus": bool(cpus),
                    "memory_total_bytes": total,
                    "memory_free_bytes": free,
                    "distances": distances,
                    "_cpuset": cpus,
                }
            )
            hugetlb = self.read_node_hugetlb(os.path.join(node_dir, "hugepages"))
            if hugetlb:
                nodes[-1]["hugetlb_bytes"] = hugetlb
        return nodes

    def read_node_hugetlb(self, path):
        """Bytes of the node's persistent HugeTLB pools (``hugepages-<size>kB/nr_hugepages``), 0 when none.

        HugeTLB pages are counted in MemTotal but only a hugetlbfs or
        ``MAP_HUGETLB`` mapping can use them (Documentation/admin-guide/mm/hugetlbpage.rst).
        """
        pooled = 0
        for entry in self.listdir(path, "HugeTLB pools"):
            match = _HUGEPAGES_DIR_RE.fullmatch(entry)
            if not match:
                continue
            count = self.optional_int(os.path.join(path, entry, "nr_hugepages"), allow_negative=False)
            if count:
                pooled += count * int(match.group(1)) * 1024
        return pooled

    def read_node_meminfo(self, path, node_id):
        text = self.read_text(path, warn_missing=True)
        if text is _MISSING or text is None:
            return None, None
        values = {}
        for line in text.splitlines():
            match = _MEMINFO_NODE_RE.fullmatch(line)
            if match and int(match.group(1)) == node_id:
                values[match.group(2)] = int(match.group(3)) * 1024
        total = values.get("MemTotal")
        free = values.get("MemFree")
        for key, value in (("MemTotal", total), ("MemFree", free)):
            if value is None:
                self.warn_lost(
                    path, "%s has no 'Node %d %s: <n> kB' line; value treated as unknown" % (path, node_id, key)
                )
        return total, free

    def read_distances(self, path, node_count):
        text = self.read_text(path, warn_missing=True)
        if text is _MISSING or text is None:
            return []
        fields = text.split()
        if not fields or not all(_DISTANCE_RE.fullmatch(f) for f in fields):
            self.warn_lost(
                path,
                "%s holds %s, not space-separated distances; distances treated as unknown"
                % (path, quote(text.strip())),
            )
            return []
        distances = [int(f) for f in fields]
        if len(distances) != node_count:
            self.warn_lost(
                path, "%s lists %d distances for %d NUMA nodes" % (path, len(distances), node_count)
            )
        return distances

    def synthesise_node(self, online):
        """One node 0 for a kernel without NUMA: all online CPUs, memory from proc/meminfo."""
        cpus = online
        if cpus is None:
            cpus = frozenset(self.cpu_dir_ids())
        if not cpus:
            raise SysfsError(
                "%s is missing and neither %s nor cpu<N> directories list any CPU"
                % (self.path("sys", "devices", "system", "node"), self.path("sys", "devices", "system", "cpu", "online"))
            )
        total = free = None
        meminfo_path = self.path("proc", "meminfo")
        text = self.read_text(meminfo_path, warn_missing=True)
        if isinstance(text, str):
            values = {}
            for line in text.splitlines():
                match = _MEMINFO_RE.fullmatch(line)
                if match:
                    values[match.group(1)] = int(match.group(2)) * 1024
            total = values.get("MemTotal")
            free = values.get("MemFree")
            if total is None or free is None:
                self.warn_lost(meminfo_path, "%s lacks MemTotal or MemFree; memory treated as unknown" % meminfo_path)
        self.warnings.append(
            "%s is missing (kernel without NUMA support): the host is treated as one NUMA node 0 "
            "holding CPUs %s" % (self.path("sys", "devices", "system", "node"), format_cpulist(cpus))
        )
        return [
            {
                "id": 0,
                "cpus": format_cpulist(cpus),
                "has_cpus": True,
                "memory_total_bytes": total,
                "memory_free_bytes": free,
                # LOCAL_DISTANCE: what numactl reports for the only node.
                "distances": [10],
                "_cpuset": cpus,
            }
        ]

    # -- CPUs ------------------------------------------------------------------

    def cpu_dir_ids(self):
        if self._cpu_ids is None:
            cpu_root = self.path("sys", "devices", "system", "cpu")
            self._cpu_ids = sorted(self.dir_ids(cpu_root, self.listdir(cpu_root, "CPU directories"), _CPU_DIR_RE, "cpu"))
        return self._cpu_ids

    def dir_ids(self, parent, entries, pattern, prefix):
        """Ids of ``node<N>`` / ``cpu<N>`` entries; an id the kernel could not have written warns."""
        ids = []
        for entry in entries:
            match = pattern.fullmatch(entry)
            if not match:
                continue  # online, possible, cpufreq, power, uevent...
            if _DIR_ID_RE.fullmatch(match.group(1)) and int(match.group(1)) <= _MAX_DIR_ID[prefix]:
                ids.append(int(match.group(1)))
            else:
                self.warn_lost(parent, "%s: entry %s is not a %s<N> directory the kernel writes (N from 0 to %d, "
                                       "without leading zeros); skipped"
                               % (parent, quote(entry), prefix, _MAX_DIR_ID[prefix]))
        return ids

    def read_online(self, required):
        path = self.path("sys", "devices", "system", "cpu", "online")
        if required:
            parsed = self.required_cpus(path)
            return None if parsed is None else parsed[0]
        text = self.read_text(path)
        if text is _MISSING or text is None:
            return None
        try:
            return self.parse_cpus(text, path)[0]
        except CpuListError as exc:
            self.warn_lost(path, "%s; online state of CPUs treated as unknown" % exc)
            return None

    def read_cpus(self, node_of_cpu, online):
        """One entry per ``cpu<N>`` directory.

        Hyperthread siblings share their core and package, and all CPUs of a
        package share its id, so ``core_id``/``thread_siblings_list`` are read
        once per core and ``physical_package_id`` once per package (with
        ``package_cpus_list``, else ``core_siblings_list``, naming its CPUs):
        on a 192-CPU host that is a third of the files.
        """
        cpu_root = self.path("sys", "devices", "system", "cpu")
        ids = self.cpu_dir_ids()
        present = set(ids)
        core_of = {}
        package_of = {}
        l3_of = {}
        cpus = []
        no_topology = []
        for cpu_id in ids:
            topo = "%s/cpu%d/topology/" % (cpu_root, cpu_id)
            if cpu_id in core_of:
                core, siblings = core_of[cpu_id]
            else:
                core = self.required_int(topo + "core_id")
                parsed = self.required_cpus(topo + "thread_siblings_list")
                siblings = None if parsed is None else parsed[1]
                if parsed is not None and cpu_id in parsed[0]:
                    for other in parsed[0]:
                        if other in present:
                            core_of[other] = (core, siblings)
            if cpu_id in package_of:
                package = package_of[cpu_id]
            else:
                package = self.required_int(topo + "physical_package_id")
                if package is not None:
                    for other in self.package_members(topo, cpu_id):
                        if other in present:
                            package_of[other] = package
            if cpu_id not in l3_of:
                self.read_l3(cpu_root, cpu_id, present, l3_of)
            is_online = None if online is None else cpu_id in online
            if siblings is None and is_online is not False:
                no_topology.append(cpu_id)
            cpus.append(
                {
                    "id": cpu_id,
                    "node": node_of_cpu.get(cpu_id),
                    # -1: the firmware did not say (seen on some arm64 hosts).
                    "package": package if package is None or package >= 0 else None,
                    "core": core if core is None or core >= 0 else None,
                    "siblings": siblings,
                    "online": is_online,
                }
            )
            if l3_of.get(cpu_id):
                cpus[-1]["l3"] = l3_of[cpu_id]
        if no_topology:
            self.warn_lost(
                cpu_root,
                "CPUs %s have no %s/cpu<N>/topology/thread_siblings_list; their hyperthread "
                "siblings are unknown" % (format_cpulist(no_topology), cpu_root)
            )
        return cpus

    def read_l3(self, cpu_root, cpu_id, present, l3_of):
        """``cpu<N>/cache/index3/shared_cpu_list``: the CPUs sharing its L3 (optional; once per L3).

        Only read when ``index3/level`` says 3. Absent: None (unknown);
        malformed: None and a loss warning naming the file.
        """
        base = "%s/cpu%d/cache/index3/" % (cpu_root, cpu_id)
        l3_of[cpu_id] = None
        level = self.read_text(base + "level")
        if level is _MISSING or level is None or level.strip() != "3":
            return
        text = self.read_text(base + "shared_cpu_list")
        if text is _MISSING or text is None:
            return
        try:
            shared, canonical = self.parse_cpus(text, base + "shared_cpu_list")
        except CpuListError as exc:
            self.warn_lost(base + "shared_cpu_list", "%s; its L3 group is unknown" % exc)
            return
        for other in shared:
            if other in present:
                l3_of.setdefault(other, canonical)
        l3_of[cpu_id] = canonical

    def package_members(self, topo, cpu_id):
        """CPUs sharing ``cpu_id``'s package, or () when the kernel does not say.

        Only a shortcut: every CPU not covered here has its own
        ``physical_package_id`` read, so an absent or odd list costs reads,
        not correctness.
        """
        for name in ("package_cpus_list", "core_siblings_list"):
            try:
                text = self._read_raw(topo + name)
            except OSError as exc:
                if exc.errno in _MISSING_ERRNOS:
                    continue
                return ()  # an odd shortcut file costs reads, not correctness
            try:
                members = self.parse_cpus(text, topo + name)[0]
            except CpuListError:
                return ()
            return members if cpu_id in members else ()
        return ()

    # -- PCI ---------------------------------------------------------------------

    def read_pci(self):
        pci_root = self.path("sys", "bus", "pci", "devices")
        devices = []
        for name in self.listdir(pci_root, "PCI devices"):
            match = _BDF_RE.fullmatch(name)
            if not match:
                self.warn_lost(
                    pci_root,
                    "%s: %s is not a PCI bus id (domain:bus:device.function); skipped" % (pci_root, quote(name)),
                )
                continue
            dev_dir = pci_root + "/" + name
            if self.usable_device_dir(dev_dir):
                devices.append(self.read_pci_device(dev_dir, name.lower()))
        devices.sort(key=lambda dev: dev["pci_bus_id"])
        return devices

    def usable_device_dir(self, dev_dir):
        """False, after a warning, for an entry that is not a directory inside this tree's sys/devices.

        On a live host ``bus/pci/devices/<bdf>`` links into ``sys/devices``;
        in a copy it is a plain directory. A dangling link, a symlink loop or
        a link leading elsewhere (into ``/dev``) loses the device: one
        warning, not one per attribute.
        """
        try:
            info = os.stat(dev_dir)
        except OSError as exc:
            self.warn_lost(dev_dir, "cannot read PCI device %s: %s; device skipped" % (dev_dir, exc.strerror or exc))
            return False
        if not stat.S_ISDIR(info.st_mode):
            self.warn_lost(dev_dir, "PCI device %s is %s, not a directory; device skipped"
                           % (dev_dir, _file_kind(info.st_mode)))
            return False
        try:
            target = os.readlink(dev_dir)
        except OSError:
            return True  # a plain directory: a copy, or a capture
        # As in read_realpath: the kernel's links are relative and cross real
        # directories, so normalising the joined path resolves them.
        target = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(dev_dir)), target))
        if self._devices_dir is None:
            self._devices_dir = os.path.abspath(self.path("sys", "devices")) + os.sep
        if not target.startswith(self._devices_dir):
            self.warn_lost(dev_dir, "PCI device %s leads to %s, outside %s; device skipped"
                           % (dev_dir, target, self._devices_dir.rstrip(os.sep)))
            return False
        return True

    def hex_attr(self, path, width=None, essential=False):
        """A 0x-prefixed hex attribute; ``essential`` ones (vendor, device, class) exist for every PCI function."""
        text = self.read_text(path)
        if text is _MISSING and essential:
            self.warn_lost(path, "%s is missing; every PCI function has one, so the device cannot be identified"
                           % path)
            return None
        if text is _MISSING or text is None:
            return None
        value = text.strip().lower()
        if not _HEX_RE.fullmatch(value):
            self.warn_lost(path, "%s holds %s, not a 0x-prefixed hex number of at most 8 digits; value treated "
                                 "as unknown" % (path, quote(value)))
            return None
        if width:
            return "0x%0*x" % (width, int(value, 16))
        return value

    def str_attr(self, path):
        text = self.read_text(path)
        if text is _MISSING or text is None:
            return None
        return text.strip() or None

    def read_pci_device(self, dev_dir, bus_id):
        base = dev_dir + "/"
        raw_node = self.optional_int(base + "numa_node")
        numa_node = raw_node if raw_node is not None and raw_node >= 0 else None
        if numa_node is not None and self.node_ids is not None and numa_node not in self.node_ids:
            self.warn_lost(
                base + "numa_node",
                "%s says %d, which is not a NUMA node of this host (%s); node treated as unknown"
                % (base + "numa_node", numa_node, ",".join(str(n) for n in sorted(self.node_ids)))
            )
            numa_node = None
        pci_class = self.hex_attr(base + "class", width=6, essential=True)
        if pci_class is not None and pci_class.startswith("0x0604"):
            # A PCI bridge's directory holds its children, never net/,
            # infiniband/ or nvme/: skip three lookups on every bridge.
            netdevs, rdma, nvme = [], [], []
        else:
            netdevs = self.device_names(base + "net", "network interfaces")
            if not netdevs and pci_class is not None and pci_class.startswith("0x02"):
                netdevs = self.virtio_netdevs(base)
            rdma = self.device_names(base + "infiniband", "RDMA devices")
            nvme = self.device_names(base + "nvme", "NVMe controllers")
        vendor = self.hex_attr(base + "vendor", essential=True)
        device = {
            "pci_bus_id": bus_id,
            "vendor": vendor,
            "device": self.hex_attr(base + "device", essential=True),
            "class": pci_class,
            "numa_node": numa_node,
            "raw_numa_node": raw_node,
            "local_cpulist": self.read_local_cpus(base),
            "max_link_speed": self.str_attr(base + "max_link_speed"),
            "max_link_width": self.optional_int(base + "max_link_width", allow_negative=False),
            "current_link_speed": self.str_attr(base + "current_link_speed"),
            "current_link_width": self.optional_int(base + "current_link_width", allow_negative=False),
            "netdevs": netdevs,
            "rdma": rdma,
            "nvme": nvme,
            "realpath": self.read_realpath(dev_dir),
            # MSI/MSI-X vectors of NICs and GPUs (msi_irqs/<irq>): what IRQ pinning puts on housekeeping CPUs.
            "msi_vectors": self.msi_vectors(base) if pci_class is not None and pci_class[:4] in ("0x02", "0x03", "0x12")
            else None,
        }
        if is_amd_instinct(vendor, pci_class):
            # amdgpu's unique_id: the GPU's identity ROCm shows as GPU-<hex>.
            device["unique_id"] = self.str_attr(base + "unique_id")
            # amdgpu's partition modes (MI300 series): SPX/DPX/QPX/CPX and NPS1/NPS2/NPS4.
            device["compute_partition"] = self.str_attr(base + "current_compute_partition")
            device["memory_partition"] = self.str_attr(base + "current_memory_partition")
        return device

    def msi_vectors(self, base):
        """How many MSI/MSI-X vectors the function has allocated (entries of ``msi_irqs/``), None without it."""
        if not os.path.isdir(base + "msi_irqs"):
            return None
        return sum(1 for name in self.listdir(base + "msi_irqs", "MSI vectors") if name.isdigit())

    def virtio_netdevs(self, base):
        """Netdevs of a virtio-net function: they sit under ``virtio<N>/net/``, not ``net/``."""
        names = []
        for entry in self.listdir(base, "PCI device directory"):
            if entry.startswith("virtio") and entry[6:].isdigit():
                names.extend(self.device_names(base + entry + "/net", "network interfaces"))
        return sorted(names)

    def read_local_cpus(self, base):
        for name, mask in (("local_cpulist", False), ("local_cpus", True)):
            path = base + name
            text = self.read_text(path)
            if text is None:
                return None
            if text is _MISSING:
                continue
            try:
                return self.parse_cpus(text, path, mask)[1]
            except CpuListError as exc:
                self.warn_lost(path, "%s; local CPUs treated as unknown" % exc)
                return None
        return None

    def read_realpath(self, dev_dir):
        """Where the device sits in the PCI hierarchy (``/sys/devices/pci.../<bdf>``)."""
        try:
            target = os.readlink(dev_dir)
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: not a symlink (a capture)
                self.warn_lost(dev_dir, "cannot read link %s: %s" % (dev_dir, exc.strerror or exc))
                return None
            return self.str_attr(dev_dir + "/_realpath")
        # The kernel's links are relative and the directories they cross are
        # real, so normalising the joined path resolves them without a
        # realpath() walk over every component.
        target = os.path.normpath(os.path.join(os.path.abspath(os.path.dirname(dev_dir)), target))
        if self.root.rstrip(os.sep):
            root = os.path.abspath(self.root)
            if target == root or target.startswith(root + os.sep):
                # Report the path as the host sees it, not under an offline root.
                target = os.sep + os.path.relpath(target, root)
        return target

    # -- everything ------------------------------------------------------------

    def read(self):
        nodes = self.read_nodes()
        online = self.read_online(required=nodes is None)
        if nodes is None:
            nodes = self.synthesise_node(online)

        node_of_cpu = {}
        for node in nodes:
            for cpu in node["_cpuset"]:
                if cpu in node_of_cpu:
                    raise SysfsError(
                        "CPU %d is listed by both node%d and node%d under %s; NUMA CPU lists must not overlap"
                        % (cpu, node_of_cpu[cpu], node["id"], self.path("sys", "devices", "system", "node"))
                    )
                node_of_cpu[cpu] = node["id"]
        self.node_ids = frozenset(node["id"] for node in nodes)

        cpus = self.read_cpus(node_of_cpu, online)
        packages = {cpu["package"] for cpu in cpus if cpu["package"] is not None}

        pci = self.read_pci()
        numa_balancing = self.optional_int(
            self.path("proc", "sys", "kernel", "numa_balancing"), allow_negative=False
        )
        for node in nodes:
            del node["_cpuset"]
        return {
            "numa_nodes": nodes,
            "cpus": cpus,
            "sockets": len(packages) if packages else None,
            "pci": pci,
            "numa_balancing": numa_balancing,
            "warnings": self.warnings,
            "lost": sorted(set(self.lost)),
        }
