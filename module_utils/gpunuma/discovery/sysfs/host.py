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
* what the node grants its services: with cgroup v2's cpuset
  (``sys/fs/cgroup/cgroup.controllers``), ``proc/1/cgroup`` and the
  ``cpuset.cpus.effective`` of PID 1's parent cgroup; else ``proc/1/status``
  (``Cpus_allowed_list``); and ``sys/devices/system/cpu/isolated``

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

import os

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist
from ansible.module_utils.gpunuma.common.errors import SysfsError
from ansible.module_utils.gpunuma.discovery.sysfs.nodes import NodeReader
from ansible.module_utils.gpunuma.discovery.sysfs.pci import PciReader

# The reader's parts, one file each: reader (bounded reads, errors and warnings), nodes (NUMA nodes
# and CPUs), pci (PCI functions).


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
         "cpus_granted": str | None,   # CPUs services may run on (NodeReader.read_granted); None: unknown
         "cpus_isolated": str | None,  # cpu/isolated (isolcpus=domain); None: unknown
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


class _HostReader(NodeReader, PciReader):
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
        granted = self.read_granted()
        isolated = self.optional_cpus(self.path("sys", "devices", "system", "cpu", "isolated"), "the isolated CPUs")
        for node in nodes:
            del node["_cpuset"]
        return {
            "numa_nodes": nodes,
            "cpus": cpus,
            "sockets": len(packages) if packages else None,
            "pci": pci,
            "numa_balancing": numa_balancing,
            "cpus_granted": None if granted is None else format_cpulist(granted),
            "cpus_isolated": None if isolated is None else format_cpulist(isolated),
            "warnings": self.warnings,
            "lost": sorted(set(self.lost)),
        }
