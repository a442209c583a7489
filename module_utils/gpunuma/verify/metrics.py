"""gpunuma node metrics for the Prometheus node_exporter textfile collector.

Standard library only, and no process started: the gpunuma_metrics role
installs this file on the node as ``gpunuma_metrics_collect.py`` beside its
entry script (``roles/gpunuma_metrics/files/gpunuma_metrics.py``, run by a
systemd timer, which asks systemctl for a unit's MainPID where no cgroup
names its processes and writes the file); gpunuma_audit_info imports it as a
module.  It reads

- the H2D probe result (``gpunuma.h2d-probe/v1``, written by validate.yml),
- the applied plan (``/etc/gpunuma/plan.json``, ``gpunuma.plan/v1``),
- the audit state (a JSON with ``status`` ``compliant``/``drifted``),
- the kernel: ``/sys/devices/system/node/node*/numastat`` and, per planned
  instance, ``/proc/<pid>/numa_maps`` of every process of its unit,

and renders the Prometheus text exposition format.  Every metric is
documented in docs/metrics.md.
"""

from __future__ import annotations

import calendar
import json
import math
import os
import re
import stat
import time

NUMASTAT_COUNTERS = ("numa_hit", "numa_miss", "numa_foreign", "interleave_hit", "local_node", "other_node")
PROBE_SERIES = {
    # probe key: (direction, memory kind)
    "h2d_pinned": ("h2d", "pinned"),
    "d2h_pinned": ("d2h", "pinned"),
    "h2d_pageable": ("h2d", "pageable"),
    "small_h2d_pinned": ("h2d", "pinned"),
}


def escape_label(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


class Exposition:
    """Collects families in order and renders the text format (one HELP/TYPE per family)."""

    def __init__(self):
        self.families = {}

    def add(self, name, kind, help_text, value, labels=None, suffix=""):
        fam = self.families.setdefault(name, {"type": kind, "help": help_text, "samples": []})
        fam["samples"].append((name + suffix, labels or {}, value))

    def render(self):
        lines = []
        for name, fam in self.families.items():
            lines.append("# HELP %s %s" % (name, fam["help"].replace("\\", "\\\\").replace("\n", " ")))
            lines.append("# TYPE %s %s" % (name, fam["type"]))
            for sample, labels, value in fam["samples"]:
                if labels:
                    body = ",".join('%s="%s"' % (k, escape_label(v)) for k, v in labels.items())
                    lines.append("%s{%s} %s" % (sample, body, _fmt(value)))
                else:
                    lines.append("%s %s" % (sample, _fmt(value)))
        return "\n".join(lines) + "\n"


# The most the collector reads of a document gpunuma keeps (plan.json, the probe and audit reports).
MAX_DOCUMENT_BYTES = 16 << 20


def _read_json(path, what, errors):
    """A JSON document gpunuma keeps, or None (absent) or None with the error said: a regular file of at most
    MAX_DOCUMENT_BYTES, opened without blocking (a FIFO planted at the path never hangs the collector), parsed
    without a traceback (a document nested past Python's recursion limit is an error like any malformed one).
    The collector runs alone on the node, so it carries this read itself (common/bounded.py is the core's)."""
    if not path:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        errors.append("%s %s: %s" % (what, path, exc))
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            errors.append("%s %s: not a regular file" % (what, path))
            return None
        data = os.read(fd, MAX_DOCUMENT_BYTES + 1)
        chunk = data
        while chunk and len(data) <= MAX_DOCUMENT_BYTES:
            chunk = os.read(fd, MAX_DOCUMENT_BYTES + 1 - len(data))
            data += chunk
        if len(data) > MAX_DOCUMENT_BYTES:
            errors.append("%s %s: larger than %d bytes" % (what, path, MAX_DOCUMENT_BYTES))
            return None
        return json.loads(data.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        errors.append("%s %s: %s" % (what, path, "nested too deep" if isinstance(exc, RecursionError) else exc))
        return None
    finally:
        os.close(fd)


def _quantile(values, q):
    ordered = sorted(values)
    rank = max(1, -(-int(q * 1000) * len(ordered) // 1000))
    return ordered[min(rank, len(ordered)) - 1]


def probe_metrics(expo, probe, mtime=None):
    """H2D bandwidth gauges, copy-duration summaries and link figures from a probe result."""
    ok = isinstance(probe, dict) and probe.get("schema") == "gpunuma.h2d-probe/v1"
    expo.add("gpunuma_h2d_probe_success", "gauge",
             "1 when the last H2D probe result is present and its status is ok.",
             1 if ok and probe.get("status") == "ok" else 0)
    if not ok:
        return
    if mtime is not None:
        expo.add("gpunuma_h2d_probe_timestamp_seconds", "gauge",
                 "When the H2D probe result was written (Unix time).", mtime)
    for gpu in probe.get("gpus", []):
        base = {"gpu": gpu.get("index"), "gpu_uuid": gpu.get("uuid"), "pci_bus_id": gpu.get("pci_bus_id")}
        pcie = gpu.get("pcie") or {}
        if pcie.get("theoretical_gbps"):
            expo.add("gpunuma_gpu_pcie_link_bandwidth_bytes_per_second", "gauge",
                     "One-direction PCIe bandwidth of the GPU's link after line encoding (max generation x width).",
                     pcie["theoretical_gbps"] * 1e9, base)
        if pcie.get("gen_max"):
            expo.add("gpunuma_gpu_pcie_link_generation", "gauge", "PCIe generation the GPU's link is capable of.",
                     pcie["gen_max"], base)
        if pcie.get("width_max"):
            expo.add("gpunuma_gpu_pcie_link_width_lanes", "gauge", "PCIe lanes of the GPU's link.", pcie["width_max"], base)
        for placement, result in sorted((gpu.get("placements") or {}).items()):
            if not isinstance(result, dict) or result.get("status") != "ok":
                continue
            node = result.get("node")
            labels = dict(base, numa_node="" if gpu.get("numa_node") is None else gpu["numa_node"], placement=placement,
                          bound_node="" if node is None else node)
            measurement = result.get("measurement") or {}
            options = probe.get("options") or {}
            for key, (direction, memory) in PROBE_SERIES.items():
                m = measurement.get(key)
                if not isinstance(m, dict):
                    continue
                size = options.get("small_bytes" if key.startswith("small") else "large_bytes")
                series = dict(labels, direction=direction, memory=memory, size_bytes=size if size is not None else "")
                if m.get("gbps_median") is not None:
                    expo.add("gpunuma_h2d_copy_bandwidth_bytes_per_second", "gauge",
                             "Median copy bandwidth measured by the H2D probe.", m["gbps_median"] * 1e9, series)
                cpu = m.get("cpu_s_per_gb")
                if isinstance(cpu, (int, float)) and not isinstance(cpu, bool):
                    expo.add("gpunuma_h2d_copy_cpu_seconds_per_byte", "gauge",
                             "CPU time of the probe's copying thread per byte copied (large copies).", cpu / 1e9, series)
                cpu = m.get("cpu_us_per_copy")
                if isinstance(cpu, (int, float)) and not isinstance(cpu, bool):
                    expo.add("gpunuma_h2d_copy_cpu_seconds", "gauge",
                             "CPU time of the probe's copying thread per small copy.", cpu / 1e6, series)
                seconds = [s for s in (m.get("seconds") or []) if isinstance(s, (int, float))]
                if seconds:
                    for q in (0.5, 0.99):
                        expo.add("gpunuma_h2d_copy_duration_seconds", "summary",
                                 "Duration of one copy measured by the H2D probe (CUDA events; pageable: wall clock).",
                                 _quantile(seconds, q), dict(series, quantile=q))
                    expo.add("gpunuma_h2d_copy_duration_seconds", "summary", "", sum(seconds), series, "_sum")
                    expo.add("gpunuma_h2d_copy_duration_seconds", "summary", "", len(seconds), series, "_count")
                    expo.add("gpunuma_h2d_copy_duration_max_seconds", "gauge",
                             "Longest single copy of the probe's series.", max(seconds), series)


def numastat_metrics(expo, sysfs_root="/"):
    base = os.path.join(sysfs_root, "sys/devices/system/node")
    try:
        names = sorted(n for n in os.listdir(base) if n.startswith("node") and n[4:].isdigit())
    except OSError:
        names = []
    helps = {
        "numa_hit": "Pages allocated on this node as intended (numastat numa_hit).",
        "numa_miss": "Pages allocated on this node although another was preferred (numastat numa_miss).",
        "numa_foreign": "Pages intended for this node but allocated elsewhere (numastat numa_foreign).",
        "interleave_hit": "Interleaved pages allocated on this node as intended (numastat interleave_hit).",
        "local_node": "Pages allocated on this node by a process running on it (numastat local_node).",
        "other_node": "Pages allocated on this node by a process running on another node - remote NUMA access (numastat other_node).",
    }
    for name in names:
        try:
            with open(os.path.join(base, name, "numastat")) as fh:
                values = dict(line.split() for line in fh if len(line.split()) == 2)
        except (OSError, ValueError):
            continue
        for key in NUMASTAT_COUNTERS:
            if key in values and values[key].isdigit():
                expo.add("gpunuma_numa_%s_pages_total" % key.replace("numa_", ""), "counter", helps[key],
                         int(values[key]), {"node": name[4:]})


_UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.\\@-]{1,255}\.(service|scope)\Z")
_NUMA_MAPS_NODE = re.compile(r"\bN(\d+)=(\d+)")
_NUMA_MAPS_PAGESIZE = re.compile(r"\bkernelpagesize_kB=(\d+)")


def numa_maps_kinds(text):
    """{"anon": {node: bytes}, "file": {node: bytes}} resident per NUMA node from a numa_maps text.

    A file-backed mapping (``file=``: libraries, model weights read through the page cache) is ``file``; every
    other mapping (heap, stack, anonymous and shared memory: what the process allocated) is ``anon``. The page
    cache is placed by whichever process read the file first, so only ``anon`` says where the instance's own
    memory went.
    """
    out = {"anon": {}, "file": {}}
    for line in text.splitlines():
        kind = out["file" if " file=" in line else "anon"]
        size = _NUMA_MAPS_PAGESIZE.search(line)
        page = int(size.group(1)) * 1024 if size else 4096
        for node, pages in _NUMA_MAPS_NODE.findall(line):
            kind[int(node)] = kind.get(int(node), 0) + int(pages) * page
    return out


def add_numa_maps(kinds, text):
    """Add a numa_maps text's bytes per node, by kind (numa_maps_kinds), into ``kinds``; returns ``kinds``."""
    for kind, by_node in numa_maps_kinds(text).items():
        into = kinds.setdefault(kind, {})
        for node, nbytes in by_node.items():
            into[node] = into.get(node, 0) + nbytes
    return kinds


def numa_maps_bytes(text):
    """{node: bytes} resident per NUMA node from a numa_maps text (both kinds)."""
    out = {}
    for kind in numa_maps_kinds(text).values():
        for node, nbytes in kind.items():
            out[node] = out.get(node, 0) + nbytes
    return out


def planned_ratio(resident, planned):
    """Share of ``resident`` ({node: bytes}) on the ``planned`` nodes, or None when nothing is resident."""
    total = sum(resident.values())
    if not total or not planned:
        return None
    return sum(v for n, v in resident.items() if n in set(planned)) / float(total)


# At most this many threads of one process are read (an engine has a few hundred; a runaway one is cut short).
MAX_THREADS = 4096


def thread_cpus(pid, proc="/proc", limit=MAX_THREADS):
    """{tid: Cpus_allowed_list} of every thread of ``pid`` (``/proc/PID/task/*/status``), at most ``limit``."""
    out = {}
    task = os.path.join(proc, str(pid), "task")
    try:
        tids = sorted(int(t) for t in os.listdir(task) if t.isdigit())[:limit]
    except OSError:
        return out
    for tid in tids:
        try:
            with open(os.path.join(task, str(tid), "status")) as fh:
                text = fh.read(65536)
        except OSError:
            continue  # the thread ended
        for line in text.splitlines():
            if line.startswith("Cpus_allowed_list:"):
                out[tid] = line.split(":", 1)[1].strip()
    return out


def cpu_set(text):
    """The CPU ids of a kernel CPU list (``0-3,8``), or None when it is not one."""
    cpus = set()
    try:
        for part in str(text).split(","):
            part = part.strip()
            if not part:
                continue
            low, _unused, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    except ValueError:
        return None
    return cpus


def unit_pids(unit, sysfs_root="/", main_pid=None):
    """PIDs of a systemd unit: its cgroup (v2, or v1's systemd hierarchy) first, else ``main_pid(unit)``.

    ``main_pid`` (a callable: the unit's MainPID, or None) is the caller's way
    to ask systemd; without it a unit outside these cgroups has no PIDs here.
    """
    for cg in ("sys/fs/cgroup/system.slice/%s/cgroup.procs" % unit,
               "sys/fs/cgroup/systemd/system.slice/%s/cgroup.procs" % unit):
        try:
            with open(os.path.join(sysfs_root, cg)) as fh:
                pids = [int(x) for x in fh.read().split()]
            if pids:
                return pids
        except (OSError, ValueError):
            continue
    if sysfs_root != "/" or main_pid is None:
        return []
    pid = main_pid(unit)
    return [pid] if isinstance(pid, int) and pid > 0 else []


_STATUS_BYTES = {"VmLck": "locked_bytes", "VmPin": "pinned_bytes"}
_KB_RE = re.compile(r"([0-9]{1,18}) kB")


def status_bytes(text):
    """``{"locked_bytes", "pinned_bytes"}`` from the ``VmLck``/``VmPin`` lines of ``/proc/PID/status`` text
    (``<n> kB``; proc(5)); a line in another form is left out. The audit reads them with this function too."""
    out = {}
    for line in text.splitlines():
        key, _sep, value = line.partition(":")
        match = _KB_RE.fullmatch(" ".join(value.split())) if key in _STATUS_BYTES else None
        if match:
            out[_STATUS_BYTES[key]] = int(match.group(1)) * 1024
    return out


def locked_and_pinned(pid, proc="/proc"):
    """``(VmLck, VmPin)`` bytes of a process (:func:`status_bytes`), None where unreadable."""
    try:
        with open(os.path.join(proc, str(pid), "status")) as fh:
            found = status_bytes(fh.read(65536))
    except OSError:
        return None, None
    return found.get("locked_bytes"), found.get("pinned_bytes")


def plan_metrics(expo, plan, probe=None, sysfs_root="/", main_pid=None):
    ok = isinstance(plan, dict) and plan.get("schema") == "gpunuma.plan/v1"
    if not ok:
        return
    expo.add("gpunuma_node_profile_info", "gauge", "The binding profile applied on this node (label profile).", 1,
             {"profile": plan.get("profile") or "", "topology_fingerprint": plan.get("topology_fingerprint") or ""})
    for inst in plan.get("instances") or []:
        if not isinstance(inst, dict) or not inst.get("name"):
            continue
        unit = inst.get("unit") or "gpunuma-%s.service" % inst["name"]
        if not isinstance(unit, str) or not _UNIT_NAME.match(unit):
            raise ValueError("instance %r has unit %r, not a systemd unit name" % (inst["name"], unit))
        mem_nodes = [n for n in inst.get("mem_nodes") or [] if isinstance(n, int)]
        planned = [n for n in (inst.get("numa_nodes") or []) if isinstance(n, int)]
        expo.add("gpunuma_instance_info", "gauge",
                 "One per planned instance: its profile, CPU set, memory policy, GPUs and the topology fingerprint.", 1, {
                     "instance": inst["name"], "unit": unit, "profile": inst.get("profile") or plan.get("profile") or "",
                     "cpus": inst.get("cpus") or "", "mem_policy": inst.get("mem_policy") or "",
                     "mem_nodes": ",".join(str(n) for n in mem_nodes),
                     "numa_nodes": ",".join(str(n) for n in planned),
                     "gpu_uuids": ",".join(str(u) for u in (inst.get("gpu_uuids") or []) if u),
                     "topology_fingerprint": plan.get("topology_fingerprint") or "",
                 })
        pids = unit_pids(unit, sysfs_root, main_pid)
        kinds = {"anon": {}, "file": {}}
        threads = {}
        held = {"locked": None, "pinned": None}
        for pid in pids:
            for kind, value in zip(("locked", "pinned"), locked_and_pinned(pid, os.path.join(sysfs_root, "proc"))):
                if value is not None:
                    held[kind] = (held[kind] or 0) + value
            try:
                with open(os.path.join(sysfs_root, "proc", str(pid), "numa_maps")) as fh:
                    add_numa_maps(kinds, fh.read())
            except OSError:
                continue
            threads.update(thread_cpus(pid, os.path.join(sysfs_root, "proc")))
        resident = {}
        for by_node in kinds.values():
            for node, nbytes in by_node.items():
                resident[node] = resident.get(node, 0) + nbytes
        expo.add("gpunuma_instance_up", "gauge", "1 when the instance's unit has a running process.",
                 1 if pids else 0, {"instance": inst["name"]})
        for node in sorted(resident):
            expo.add("gpunuma_instance_memory_resident_bytes", "gauge",
                     "Resident memory of the instance's processes on each NUMA node (numa_maps).", resident[node],
                     {"instance": inst["name"], "node": node})
        for kind, what in (("locked", "mlock(2)ed (VmLck)"), ("pinned", "pinned, e.g. RDMA-registered (VmPin)")):
            if pids and held[kind] is not None:
                expo.add("gpunuma_instance_%s_bytes" % kind, "gauge",
                         "Memory the instance's processes hold %s, summed over its processes; it counts against "
                         "RLIMIT_MEMLOCK." % what, held[kind], {"instance": inst["name"]})
        budget = inst.get("pinned_bytes")
        if isinstance(budget, int) and not isinstance(budget, bool):
            expo.add("gpunuma_instance_pinned_budget_bytes", "gauge",
                     "The instance's pinned host memory budget (its plan entry's pinned_bytes).", budget,
                     {"instance": inst["name"]})
        limit = inst.get("limit_memlock")
        if isinstance(limit, int) and not isinstance(limit, bool):
            expo.add("gpunuma_instance_memlock_limit_bytes", "gauge",
                     "LimitMEMLOCK= the plan decided for the instance's unit (absent when unlimited).", limit,
                     {"instance": inst["name"]})
        target = sorted(set(planned or mem_nodes))
        for kind, by_node in (("anon", kinds["anon"]), ("file", kinds["file"]), ("all", resident)):
            ratio = planned_ratio(by_node, target)
            if ratio is not None:
                expo.add("gpunuma_instance_local_pages_ratio", "gauge",
                         "Share of the instance's resident pages on its planned NUMA node(s), by kind: anon (what "
                         "it allocated), file (page cache it maps), all.", ratio,
                         {"instance": inst["name"], "kind": kind,
                          "planned_nodes": ",".join(str(n) for n in target)})
        want = cpu_set(inst.get("cpus")) if inst.get("cpus") else None
        if want and threads:
            expo.add("gpunuma_instance_cpus_match", "gauge",
                     "1 when every thread of every process of the instance may run on exactly its planned CPUs "
                     "(Cpus_allowed_list); 0 when one was re-pinned.",
                     1 if all(cpu_set(c) == want for c in threads.values()) else 0, {"instance": inst["name"]})


def audit_metrics(expo, audit):
    state = "unknown"
    if isinstance(audit, dict) and audit.get("status") in ("compliant", "drifted"):
        state = audit["status"]
    for name in ("compliant", "drifted", "unknown"):
        expo.add("gpunuma_audit_state", "gauge",
                 "The last audit's verdict for this node: 1 on the label of the current state.",
                 1 if name == state else 0, {"state": name})
    when = audit.get("timestamp") if isinstance(audit, dict) else None
    if isinstance(audit, dict) and isinstance(audit.get("time"), str):  # a gpunuma.audit/v1 report: UTC ISO 8601
        try:
            when = calendar.timegm(time.strptime(audit["time"], "%Y-%m-%dT%H:%M:%SZ"))
        except ValueError:
            when = None
    if isinstance(when, (int, float)) and not isinstance(when, bool):
        expo.add("gpunuma_audit_timestamp_seconds", "gauge", "When the last audit ran (Unix time).", when)


def _guarded(expo, errors, what, function, *args):
    """Render one source into a scratch exposition; merge it only when the source was well-formed."""
    scratch = Exposition()
    try:
        function(scratch, *args)
    except (TypeError, KeyError, AttributeError, ValueError) as exc:
        errors.append("%s: malformed (%s: %s)" % (what, type(exc).__name__, exc))
        return False
    for name, fam in scratch.families.items():
        target = expo.families.setdefault(name, {"type": fam["type"], "help": fam["help"], "samples": []})
        target["samples"].extend(fam["samples"])
    return True


def collect(probe_path=None, plan_path=None, audit_path=None, sysfs_root="/", now=None, main_pid=None):
    """Render the whole textfile; returns (text, errors). ``main_pid``: as for :func:`unit_pids`."""
    errors = []
    expo = Exposition()
    probe = _read_json(probe_path, "probe result", errors)
    mtime = None
    if probe is not None:
        try:
            mtime = os.stat(probe_path).st_mtime
        except OSError:
            pass
    if not _guarded(expo, errors, "probe result %s" % probe_path, probe_metrics, probe, mtime):
        probe = None
        expo.add("gpunuma_h2d_probe_success", "gauge",
                 "1 when the last H2D probe result is present and its status is ok.", 0)
    numastat_metrics(expo, sysfs_root)
    plan = _read_json(plan_path, "plan", errors)
    if plan is not None and not (isinstance(plan, dict) and plan.get("schema") == "gpunuma.plan/v1"):
        errors.append("plan %s: not a gpunuma.plan/v1 document" % plan_path)
    if not _guarded(expo, errors, "plan %s" % plan_path, plan_metrics, plan, probe, sysfs_root, main_pid):
        plan = None
    audit_metrics(expo, _read_json(audit_path, "audit state", errors))
    for src, path, data in (("probe", probe_path, probe), ("plan", plan_path, plan)):
        expo.add("gpunuma_metrics_source_up", "gauge", "1 when the source file was read and understood.",
                 1 if data is not None and not any(e.startswith(("probe result" if src == "probe" else src) + " ") for e in errors) else 0,
                 {"source": src})
    expo.add("gpunuma_metrics_errors", "gauge", "Problems met while collecting (see the collector's log).", len(errors))
    expo.add("gpunuma_metrics_last_run_timestamp_seconds", "gauge", "When the collector last wrote this file (Unix time).",
             time.time() if now is None else now)
    return expo.render(), errors
