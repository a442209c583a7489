"""Read the NUMA, CPU and PCI layout of a host from sysfs and procfs.

``read_host(root)`` reads a tree that holds ``sys/`` and ``proc/``: ``/`` on
the live host, or a copy of the relevant files (support bundles, captured
fixtures, synthetic test trees). Only the files discovery needs are opened:

* ``sys/devices/system/node/node<N>/{cpulist,cpumap,meminfo,distance}``
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
attribute, ``numa_balancing``, ``cpu/online``. A PCI ``numa_node`` naming a
node the host does not have is also ``None`` with a warning (``raw_numa_node``
keeps what the file said). Files that are routinely absent
on real hosts (link attributes of integrated devices, ``net/`` of a GPU,
``numa_balancing`` on kernels built without it) are ``None`` or ``[]``
without a warning; a missing node ``meminfo`` or ``distance``, which a NUMA
kernel always provides, warns.
"""

from __future__ import annotations

import errno
import os
import re

from ansible.module_utils.gpunuma.cpulist import format_cpulist, parse_cpulist, parse_cpumask
from ansible.module_utils.gpunuma.errors import CpuListError, SysfsError

NVIDIA_VENDOR = "0x10de"

_NODE_DIR_RE = re.compile(r"^node(\d+)$")
_CPU_DIR_RE = re.compile(r"^cpu(\d+)$")
# Domains are 4 hex digits on most hosts; Intel VMD exposes 5-digit ones.
_BDF_RE = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_HEX_RE = re.compile(r"^0x[0-9a-f]+$")
_INT_RE = re.compile(r"^-?\d+$")
_MEMINFO_NODE_RE = re.compile(r"^Node\s+(\d+)\s+(\S+):\s+(\d+)(?:\s+kB)?\s*$")
_MEMINFO_RE = re.compile(r"^(\S+):\s+(\d+)(?:\s+kB)?\s*$")
_SPEED_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s")

_MISSING_ERRNOS = (errno.ENOENT, errno.ENOTDIR)

# PCIe generation by per-lane transfer rate (GT/s), as the kernel writes it in
# max_link_speed / current_link_speed ("2.5 GT/s PCIe", "32.0 GT/s PCIe").
_GEN_BY_SPEED = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}

_MISSING = object()
_CHUNK = 65536


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
    """PCI functions of NVIDIA GPUs: vendor 0x10de, class 0x0300xx (VGA) or 0x0302xx (3D)."""
    return [
        dev
        for dev in host["pci"]
        if dev["vendor"] == NVIDIA_VENDOR
        and dev["class"] is not None
        and dev["class"][:6] in ("0x0300", "0x0302")
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
         "cpus": [{"id", "node", "package", "core", "siblings", "online"}],  # by id
         # node: the NUMA node whose cpulist holds the CPU, or None;
         # package/core: ints or None (absent, or -1); siblings: canonical
         # thread_siblings_list or None; online: per cpu/online, None if unknown
         "sockets": int | None,
         "pci": [{"pci_bus_id", "vendor", "device", "class", "numa_node",
                  "raw_numa_node", "local_cpulist", "max_link_speed",
                  "max_link_width", "current_link_speed", "current_link_width",
                  "netdevs", "rdma", "nvme", "realpath"}],      # by pci_bus_id
         "numa_balancing": int | None,
         "warnings": [str]}

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
        self.node_ids = None
        # Many files repeat the same CPU list text (sibling pairs, a node's
        # local_cpulist on each of its devices): parse each spelling once.
        self._cpu_cache = {}

    # -- low-level reading -------------------------------------------------

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    @staticmethod
    def _read_raw(path):
        # os.open/os.read: sysfs attributes are small, and on large hosts
        # this runs a thousand times, where file objects cost more. A sysfs
        # attribute arrives in one read; only procfs files may need more.
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.read(fd, _CHUNK)
            if len(data) == _CHUNK:
                chunks = [data]
                while True:
                    chunk = os.read(fd, _CHUNK)
                    if not chunk:
                        break
                    chunks.append(chunk)
                data = b"".join(chunks)
        finally:
            os.close(fd)
        return data.decode("utf-8", "replace")

    def read_text(self, path, required=False, warn_missing=False):
        """File text, or ``_MISSING`` when absent, or ``None`` after a warning.

        ``required`` turns unreadable files (not absent ones) into SysfsError.
        """
        try:
            return self._read_raw(path)
        except OSError as exc:
            if exc.errno in _MISSING_ERRNOS:
                if warn_missing:
                    self.warnings.append("%s is missing" % path)
                return _MISSING
            message = "cannot read %s: %s" % (path, exc.strerror or exc)
            if required:
                raise SysfsError(message)
            self.warnings.append(message + "; value treated as unknown")
            return None

    def listdir(self, path, what):
        """Sorted entries of a directory; [] when absent; [] and a warning when unreadable."""
        try:
            return sorted(os.listdir(path))
        except OSError as exc:
            if exc.errno in _MISSING_ERRNOS:
                return []
            self.warnings.append("cannot list %s (%s): %s" % (path, what, exc.strerror or exc))
            return []

    def optional_int(self, path, allow_negative=True, warn_missing=False):
        text = self.read_text(path, warn_missing=warn_missing)
        if text is _MISSING or text is None:
            return None
        value = text.strip()
        if not _INT_RE.match(value) or (not allow_negative and value.startswith("-")):
            self.warnings.append(
                "%s holds %r, not %s; value treated as unknown"
                % (path, value, "an integer" if allow_negative else "a non-negative integer")
            )
            return None
        return int(value)

    def required_int(self, path):
        """Integer from a topology-defining file: None when absent, SysfsError when bad."""
        text = self.read_text(path, required=True)
        if text is _MISSING:
            return None
        value = text.strip()
        if not _INT_RE.match(value):
            raise SysfsError("%s holds %r; expected an integer" % (path, value))
        return int(value)

    def parse_cpus(self, text, path, mask=False):
        """(frozenset, canonical list) for a CPU list or mask text; CpuListError when bad."""
        key = (text, mask)
        hit = self._cpu_cache.get(key)
        if hit is None:
            cpus = parse_cpumask(text, path) if mask else parse_cpulist(text, path)
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
            return None
        ids = sorted(int(m.group(1)) for m in map(_NODE_DIR_RE.match, entries) if m)
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
        return nodes

    def read_node_meminfo(self, path, node_id):
        text = self.read_text(path, warn_missing=True)
        if text is _MISSING or text is None:
            return None, None
        values = {}
        for line in text.splitlines():
            match = _MEMINFO_NODE_RE.match(line)
            if match and int(match.group(1)) == node_id:
                values[match.group(2)] = int(match.group(3)) * 1024
        total = values.get("MemTotal")
        free = values.get("MemFree")
        for key, value in (("MemTotal", total), ("MemFree", free)):
            if value is None:
                self.warnings.append(
                    "%s has no 'Node %d %s: <n> kB' line; value treated as unknown" % (path, node_id, key)
                )
        return total, free

    def read_distances(self, path, node_count):
        text = self.read_text(path, warn_missing=True)
        if text is _MISSING or text is None:
            return []
        fields = text.split()
        if not fields or not all(f.isdigit() for f in fields):
            self.warnings.append(
                "%s holds %r, not space-separated distances; distances treated as unknown"
                % (path, text.strip())
            )
            return []
        distances = [int(f) for f in fields]
        if len(distances) != node_count:
            self.warnings.append(
                "%s lists %d distances for %d NUMA nodes" % (path, len(distances), node_count)
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
                match = _MEMINFO_RE.match(line)
                if match:
                    values[match.group(1)] = int(match.group(2)) * 1024
            total = values.get("MemTotal")
            free = values.get("MemFree")
            if total is None or free is None:
                self.warnings.append("%s lacks MemTotal or MemFree; memory treated as unknown" % meminfo_path)
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
        cpu_root = self.path("sys", "devices", "system", "cpu")
        return sorted(
            int(m.group(1)) for m in map(_CPU_DIR_RE.match, self.listdir(cpu_root, "CPU directories")) if m
        )

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
            self.warnings.append("%s; online state of CPUs treated as unknown" % exc)
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
        if no_topology:
            self.warnings.append(
                "CPUs %s have no %s/cpu<N>/topology/thread_siblings_list; their hyperthread "
                "siblings are unknown" % (format_cpulist(no_topology), cpu_root)
            )
        return cpus

    def package_members(self, topo, cpu_id):
        """CPUs sharing ``cpu_id``'s package, or () when the kernel does not say.

        Only a shortcut: every CPU not covered here has its own
        ``physical_package_id`` read, so an absent or odd list costs reads,
        not correctness.
        """
        for name in ("package_cpus_list", "core_siblings_list"):
            try:
                text = self._read_raw(topo + name)
            except OSError:
                continue
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
            match = _BDF_RE.match(name)
            if not match:
                self.warnings.append(
                    "%s: %r is not a PCI bus id (domain:bus:device.function); skipped" % (pci_root, name)
                )
                continue
            devices.append(self.read_pci_device(pci_root + "/" + name, name.lower()))
        devices.sort(key=lambda dev: dev["pci_bus_id"])
        return devices

    def hex_attr(self, path, width=None):
        text = self.read_text(path)
        if text is _MISSING or text is None:
            return None
        value = text.strip().lower()
        if not _HEX_RE.match(value):
            self.warnings.append("%s holds %r, not a 0x-prefixed hex number; value treated as unknown" % (path, value))
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
            self.warnings.append(
                "%s says %d, which is not a NUMA node of this host (%s); node treated as unknown"
                % (base + "numa_node", numa_node, ",".join(str(n) for n in sorted(self.node_ids)))
            )
            numa_node = None
        pci_class = self.hex_attr(base + "class", width=6)
        if pci_class is not None and pci_class.startswith("0x0604"):
            # A PCI bridge's directory holds its children, never net/,
            # infiniband/ or nvme/: skip three lookups on every bridge.
            netdevs, rdma, nvme = [], [], []
        else:
            netdevs = self.listdir(base + "net", "network interfaces")
            if not netdevs and pci_class is not None and pci_class.startswith("0x02"):
                netdevs = self.virtio_netdevs(base)
            rdma = self.listdir(base + "infiniband", "RDMA devices")
            nvme = self.listdir(base + "nvme", "NVMe controllers")
        return {
            "pci_bus_id": bus_id,
            "vendor": self.hex_attr(base + "vendor"),
            "device": self.hex_attr(base + "device"),
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
        }

    def virtio_netdevs(self, base):
        """Netdevs of a virtio-net function: they sit under ``virtio<N>/net/``, not ``net/``."""
        names = []
        for entry in self.listdir(base, "PCI device directory"):
            if entry.startswith("virtio") and entry[6:].isdigit():
                names.extend(self.listdir(base + entry + "/net", "network interfaces"))
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
                self.warnings.append("%s; local CPUs treated as unknown" % exc)
                return None
        return None

    def read_realpath(self, dev_dir):
        """Where the device sits in the PCI hierarchy (``/sys/devices/pci.../<bdf>``)."""
        try:
            target = os.readlink(dev_dir)
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: not a symlink (a capture)
                self.warnings.append("cannot read link %s: %s" % (dev_dir, exc.strerror or exc))
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
        }
