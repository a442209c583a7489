"""NUMA nodes and CPUs as sysfs and procfs describe them (discovery/sysfs/host.py's reader)."""

from __future__ import annotations

import os
import re

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist
from ansible.module_utils.gpunuma.common.errors import CpuListError, SysfsError
from ansible.module_utils.gpunuma.discovery.sysfs.reader import (
    _CPU_DIR_RE, _DIR_ID_RE, _DISTANCE_RE, _HUGEPAGES_DIR_RE, _MAX_DIR_ID, _MEMINFO_NODE_RE, _MEMINFO_RE, _MISSING,
    _MISSING_ERRNOS, _NODE_DIR_RE, Reader, _lkind, quote)


# The affinity line of /proc/<pid>/status (fs/proc/array.c, task_cpus_allowed).
_CPUS_ALLOWED_RE = re.compile(r"^Cpus_allowed_list:[ \t]*(\S*)[ \t]*$", re.M)
# PID 1's cgroup v2 membership (/proc/<pid>/cgroup, "0::<path>").
_UNIFIED_RE = re.compile(r"^0::(/[^\n]*)$", re.M)


class NodeReader(Reader):
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

    def core_of(self, topo, cpu_id, present, known):
        """``(core_id, siblings text)`` of ``cpu_id``, read once per core (its siblings' entries filled in)."""
        if cpu_id in known:
            return known[cpu_id]
        core = self.required_int(topo + "core_id")
        parsed = self.required_cpus(topo + "thread_siblings_list")
        siblings = None if parsed is None else parsed[1]
        if parsed is not None and cpu_id in parsed[0]:
            for other in parsed[0]:
                if other in present:
                    known[other] = (core, siblings)
        return core, siblings

    def package_of(self, topo, cpu_id, present, known):
        """The physical package id of ``cpu_id``, read once per package (its members' entries filled in)."""
        if cpu_id in known:
            return known[cpu_id]
        package = self.required_int(topo + "physical_package_id")
        if package is not None:
            for other in self.package_members(topo, cpu_id):
                if other in present:
                    known[other] = package
        return package

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
            core, siblings = self.core_of(topo, cpu_id, present, core_of)
            package = self.package_of(topo, cpu_id, present, package_of)
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

    # -- what the node grants ------------------------------------------------

    def optional_cpus(self, path, what):
        """A CPU list file that narrows the CPUs gpunuma may plan on: a frozenset (empty for an empty list or
        ``(null)``), or None when absent or unreadable (a warning naming the file, ``what`` unknown)."""
        text = self.read_text(path)
        if text is _MISSING or text is None:
            return None
        return self._cpus_of(text.strip(), path, what)

    def _cpus_of(self, text, path, what):
        if text in ("", "(null)"):
            return frozenset()
        try:
            return self.parse_cpus(text, path)[0]
        except CpuListError as exc:
            self.warn_lost(path, "%s; %s treated as unknown" % (exc, what))
            return None

    def read_granted(self):
        """The CPUs the node lets its services run on, or None when nothing says.

        With the cgroup v2 cpuset controller (``sys/fs/cgroup/cgroup.controllers`` lists it): the effective cpuset
        of the cgroup that holds PID 1's (``init.scope``, ``system.slice``, ``gpunuma.slice`` are its children): a
        system container's or a parent's cpuset. Not PID 1's own affinity nor ``system.slice``'s: gpunuma's
        housekeeping confinement narrows both to the housekeeping CPUs (node/housekeeping.py), and reading them
        back would shrink every later plan to those. Without it (cgroup v1, where gpunuma never confines): PID 1's
        ``Cpus_allowed_list``, which a container's ``--cpuset-cpus`` or a boot ``CPUAffinity=`` sets."""
        controllers = self.read_text(self.path("sys", "fs", "cgroup", "cgroup.controllers"))
        if isinstance(controllers, str) and "cpuset" in controllers.split():
            path = self.path("proc", "1", "cgroup")
            text = self.read_text(path)
            match = _UNIFIED_RE.search(text) if isinstance(text, str) else None
            if match is None:
                return None
            parent = os.path.dirname(match.group(1).rstrip("/")) if match.group(1) != "/" else "/"
            parts = [p for p in parent.split("/") if p]
            if any(p in (".", "..") for p in parts):
                self.warn_lost(path, "%s names cgroup %s, not a path under /sys/fs/cgroup; the CPUs the node "
                                     "grants are unknown" % (path, quote(match.group(1))))
                return None
            return self.optional_cpus(self.path("sys", "fs", "cgroup", *(parts + ["cpuset.cpus.effective"])),
                                      "the cpuset of PID 1's parent cgroup")
        path = self.path("proc", "1", "status")
        text = self.read_text(path)
        if text is _MISSING or text is None:
            return None
        match = _CPUS_ALLOWED_RE.search(text)
        if match is None:
            self.warn_lost(path, "%s has no Cpus_allowed_list line; the CPUs PID 1 may run on are unknown" % path)
            return None
        return self._cpus_of(match.group(1), path, "the CPUs PID 1 may run on")
