"""Drift audit: compare a node's live state with its applied plan.

Pure functions over text (unit files, ``/proc/<pid>/status``,
``/proc/<pid>/numa_maps``, ``/proc/<pid>/limits``) and the plan; the module
``library/gpunuma_audit_info.py`` reads the files and hands them over. The
report is ``gpunuma.audit/v1`` (docs/audit.md). Each finding has a stable
``id`` so that scheduled jobs and metrics can key on it.
"""

from __future__ import annotations

from ansible.module_utils.gpunuma.node import autonuma
from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, parse_cpulist
from ansible.module_utils.gpunuma.common import schemas
# The texts it reads.
from ansible.module_utils.gpunuma.verify.proc_texts import (
    expected_numa_args, memlock_bytes, parse_memlock, parse_numa_maps, parse_status, parse_unit)

SCHEMA = schemas.AUDIT
SEVERITIES = ("error", "warning", "info")
# The share of an instance's own (anonymous) pages expected on its planned nodes: 98-100 % is what a bound
# engine reaches (docs/audit.md); less means pages were placed or migrated elsewhere.
MIN_LOCAL_SHARE = 0.98
# Threads named in a thread-affinity finding (the count says how many more).
SHOWN_THREADS = 5

# Finding ids (docs/audit.md).
FINDING_IDS = (
    "plan-missing",
    "plan-unreadable",
    "plan-edited",
    "topology-edited",
    "state-edited",
    "topology-changed",
    "topology-unverified",
    "unit-missing",
    "unit-binding",
    "unit-extra-dropin",
    "unit-reload-pending",
    "instance-not-running",
    "cpu-affinity",
    "thread-affinity",
    "mem-policy",
    "mem-local-share",
    "memlock",
    "memlock-unit",
    "memlock-at-limit",
    "pinned-over-budget",
    "container-memlock",
    "numa-balancing-live",
    "numa-balancing-file",
    "profile-state",
    "kubelet-setting",
    "kubelet-checkpoint",
    "kubelet-unreadable",
    "kubelet-dra-checkpoint",
    "kubelet-resource-slice",
)


class Finding(dict):
    """One finding: ``id``, ``severity``, ``instance`` (or null), ``expected``, ``actual``, ``message``."""

    def __init__(self, fid, severity, message, instance=None, expected=None, actual=None):
        if fid not in FINDING_IDS or severity not in SEVERITIES:
            raise ValueError("finding %r with severity %r: allowed ids %s, severities %s"
                             % (fid, severity, ", ".join(FINDING_IDS), ", ".join(SEVERITIES)))
        super().__init__(id=fid, severity=severity, instance=instance, expected=expected, actual=actual,
                         message=message)


def _same_nodes(a, b):
    return sorted(a or []) == sorted(b or [])


def _unit_binding(item, unit, parsed):
    """Findings where the unit file's binding (systemd keys, or numactl and the command in ExecStart) is not the plan's."""
    name, findings = item.get("name"), []
    if item.get("binding_method") == "systemd":
        want = item.get("systemd") or {}
        for key in ("CPUAffinity", "NUMAPolicy", "NUMAMask"):
            if (parsed.get(key) or None) != (want.get(key) or None):
                findings.append(Finding("unit-binding", "error", "%s: %s= in %s is %r, the plan says %r"
                                        % (name, key, unit.get("path"), parsed.get(key), want.get(key)),
                                        name, want.get(key), parsed.get(key)))
    elif item.get("mode") == "service":
        got = expected_numa_args(parsed["exec"])
        want = list(item.get("numactl_args") or [])
        if got != want:
            findings.append(Finding("unit-binding", "error", "%s: ExecStart in %s binds with %s, the plan says %s"
                                    % (name, unit.get("path"), got or "nothing", want or "nothing"),
                                    name, want, got))
        command = item.get("command")
        if command and parsed["exec"] is not None and parsed["exec"][len(got) + (1 if got else 0):] != list(command):
            findings.append(Finding("unit-binding", "error", "%s: ExecStart in %s runs %s, the plan says %s"
                                    % (name, unit.get("path"), parsed["exec"], command), name, command,
                                    parsed["exec"]))
    return findings


def _memory_policy(item, unit, proc, min_local_share, live):
    """Findings on the process's memory policy (numa_maps) and where its pages are."""
    name, findings = item.get("name"), []
    policy, nodes, pages = parse_numa_maps(proc["numa_maps"])
    live["mem_policy"], live["mem_nodes"] = policy, nodes
    want = item.get("mem_policy") or "default"
    if policy is not None and (policy != want or (want != "default" and not _same_nodes(nodes, item.get("mem_nodes")))):
        findings.append(Finding("mem-policy", "error", "%s: PID %s has memory policy %s%s, the plan says %s%s"
                                % (name, unit.get("pid"), policy, (" on " + format_cpulist(nodes)) if nodes else "",
                                   want, (" on " + format_cpulist(item["mem_nodes"])) if item.get("mem_nodes") else ""),
                                name, {"policy": want, "nodes": item.get("mem_nodes") or []},
                                {"policy": policy, "nodes": nodes}))
    if proc.get("pids"):
        live["processes"] = len(proc["pids"])
    findings.extend(_local_share(item, unit, proc, pages, want, min_local_share, live))
    return findings


def audit_instance(item, unit, proc, min_local_share):
    """Findings for one plan instance.

    ``unit``: {"text": file text or None, "extra_dropins": [...], "need_reload": bool,
    "active": str, "pid": int}. ``proc``: {"status", "numa_maps", "limits"} texts or None.
    """
    name = item.get("name")
    findings = []
    live = {"active": unit.get("active"), "pid": unit.get("pid")}
    text = unit.get("text")
    if text is None:
        findings.append(Finding("unit-missing", "error", "%s: %s is missing" % (name, unit.get("path")), name,
                                unit.get("path"), None))
    else:
        parsed = parse_unit(text)
        findings.extend(_unit_binding(item, unit, parsed))
        live["unit_memlock"] = parsed.get("LimitMEMLOCK")
        findings.extend(_unit_memlock(item, unit, parsed))
        if parsed.get("AllowedCPUs"):
            live["allowed_cpus"] = parsed["AllowedCPUs"]
    for extra in unit.get("extra_dropins") or []:
        findings.append(Finding("unit-extra-dropin", "warning", "%s: drop-in %s is not gpunuma's and may override the binding"
                                % (name, extra), name, None, extra))
    if unit.get("need_reload"):
        findings.append(Finding("unit-reload-pending", "warning", "%s: %s changed on disk since systemd loaded it "
                                "(NeedDaemonReload=yes)" % (name, unit.get("unit")), name, False, True))
    if unit.get("check_running", True) and (unit.get("active") != "active" or not unit.get("pid")):
        findings.append(Finding("instance-not-running", "error", "%s: %s is %s" % (name, unit.get("unit"), unit.get("active")),
                                name, "active", unit.get("active")))
        return findings, live
    if not proc:
        return findings, live

    status = parse_status(proc.get("status") or "")
    live["cpus"] = status.get("Cpus_allowed_list")
    live["mems_allowed"] = status.get("Mems_allowed_list")
    if item.get("cpus") and live["cpus"] != format_cpulist(parse_cpulist(item["cpus"])):
        findings.append(Finding("cpu-affinity", "error", "%s: PID %s runs on CPUs %s, the plan binds it to %s%s"
                                % (name, unit.get("pid"), live["cpus"], item["cpus"],
                                   " (re-pinned by hand, or reset by a unit started with AllowedCPUs=, a systemd/cgroup "
                                   "behaviour seen on Debian 12)" if live["cpus"] else ""),
                                name, item["cpus"], live["cpus"]))
    if proc.get("numa_maps") is not None:
        findings.extend(_memory_policy(item, unit, proc, min_local_share, live))
    findings.extend(_thread_affinity(item, unit, proc, live))
    for key in ("locked_bytes", "pinned_bytes"):
        if status.get(key) is not None:
            live[key] = status[key]
    if proc.get("limits") is not None:
        got = parse_memlock(proc["limits"])
        if live.get("unit_memlock") is not None:
            live["memlock"] = got
            want = memlock_bytes(live["unit_memlock"])
            if got != want:
                findings.append(Finding("memlock", "error", "%s: PID %s runs with memlock %s, its unit sets LimitMEMLOCK=%s"
                                        % (name, unit.get("pid"), got, live["unit_memlock"]), name, want, got))
        findings.extend(_memlock_at_limit(name, unit, got, status))
    findings.extend(_over_budget(item, unit, status))
    return findings, live


def _over_budget(item, unit, status):
    """The pinned-over-budget finding (warning): the main process locks or pins more than the instance's budget."""
    budget = item.get("pinned_bytes")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget <= 0:
        return []
    held = _held(status)
    if held <= budget:
        return []
    message = ("%s: PID %s holds %d bytes locked or pinned (VmLck + VmPin), more than its pinned budget of %d: "
               "raise pinned, or find what the worker pins beyond it" % (item.get("name"), unit.get("pid"), held, budget))
    return [Finding("pinned-over-budget", "warning", message, item.get("name"), budget, held)]


def _unit_memlock(item, unit, parsed):
    """The memlock-unit finding: the unit's LimitMEMLOCK= against the plan's decision (``limit_memlock``, plan
    schema 1.4; a drop-in without one leaves the vendor's limit, so the drop-in sets none). Plans written before
    1.4 carry no decision and are not judged here."""
    if "limit_memlock" not in item:
        return []
    want = memlock_bytes(item["limit_memlock"])
    have = memlock_bytes(parsed.get("LimitMEMLOCK"))
    if want == have:
        return []
    return [Finding("memlock-unit", "error", "%s: %s sets LimitMEMLOCK=%s, the plan decided %s"
                    % (item.get("name"), unit.get("path"), parsed.get("LimitMEMLOCK") or "nothing",
                       item["limit_memlock"] if item["limit_memlock"] is not None else "none (the vendor unit's own)"),
                    item.get("name"), want, have)]


# A process whose locked and pinned memory reaches this share of its soft RLIMIT_MEMLOCK is at its limit: its next
# mlock(2) or RDMA memory registration fails (both count against RLIMIT_MEMLOCK: getrlimit(2), proc(5) VmLck/VmPin).
AT_LIMIT_SHARE = 0.95


def _held(status):
    """Bytes a process holds locked or pinned (VmLck + VmPin): what counts against its RLIMIT_MEMLOCK."""
    return (status.get("locked_bytes") or 0) + (status.get("pinned_bytes") or 0)


def _memlock_at_limit(name, unit, limit, status):
    """The memlock-at-limit finding (warning): VmLck + VmPin of the main process at AT_LIMIT_SHARE of its limit."""
    if not isinstance(limit, int) or limit <= 0:
        return []
    held = _held(status)
    if held < AT_LIMIT_SHARE * limit:
        return []
    return [Finding("memlock-at-limit", "warning",
                    "%s: PID %s holds %d bytes locked or pinned (VmLck + VmPin) of its %d-byte memlock limit: a "
                    "further pinned buffer or RDMA registration will fail; raise its memlock (LimitMEMLOCK=)"
                    % (name, unit.get("pid"), held, limit), name, limit, held)]


def _share(by_node, nodes):
    total = sum(by_node.values())
    return round(float(sum(by_node.get(n, 0) for n in nodes)) / total, 4) if total else None


def _local_share(item, unit, proc, pages, want, min_local_share, live):
    """The mem-local-share finding: the share of the instance's pages on its planned nodes, over every process of
    its unit (``proc["pages"]``: anon and file bytes per node) or, without them, the main process's pages."""
    nodes = item.get("mem_nodes")
    if not nodes or want not in ("bind", "preferred"):
        return []
    kinds = proc.get("pages")
    if kinds:
        every = {}
        for by_node in kinds.values():
            for node, nbytes in by_node.items():
                every[node] = every.get(node, 0) + nbytes
        live["local_share"] = _share(every, nodes)
        live["local_share_anon"] = _share(kinds.get("anon") or {}, nodes)
        live["local_share_file"] = _share(kinds.get("file") or {}, nodes)
    else:
        live["local_share"] = _share(pages, nodes)
    # What the instance allocated decides; the page cache it maps was placed by whoever read the file first.
    judged, what = live.get("local_share_anon"), "anonymous"
    if judged is None:
        judged, what = live.get("local_share"), "resident"
    if judged is None or judged >= min_local_share:
        return []
    return [Finding("mem-local-share", "warning", "%s: %.1f%% of the %s pages of %s are on node %s (at least "
                    "%.0f%% expected; pages placed elsewhere or migrated since start)" % (
                        name_of(item), judged * 100, what,
                        "its %d processes" % live["processes"] if live.get("processes", 1) > 1
                        else "PID %s" % unit.get("pid"), format_cpulist(nodes), min_local_share * 100),
                    name_of(item), min_local_share, judged)]


def _thread_affinity(item, unit, proc, live):
    """The thread-affinity finding: threads of the unit's processes (the main thread aside: cpu-affinity) whose
    Cpus_allowed_list is not the plan's CPU set (an engine or library that re-pinned itself after start)."""
    threads = proc.get("threads") or {}
    if not item.get("cpus") or not threads:
        return []
    want = parse_cpulist(item["cpus"])
    off = {}
    for tid, cpus in sorted(threads.items()):
        try:
            got = parse_cpulist(cpus)
        except ValueError:
            got = None
        if got != want:
            off[tid] = cpus
    live["threads"] = len(threads)
    live["threads_off_plan"] = len(off)
    off.pop(unit.get("pid"), None)
    if not off:
        return []
    shown = ", ".join("%s on %s" % (tid, cpus) for tid, cpus in list(off.items())[:SHOWN_THREADS])
    more = len(off) - SHOWN_THREADS
    return [Finding("thread-affinity", "error", "%s: %d of %d threads may run on other CPUs than the plan's %s: %s%s "
                    "(re-pinned after start: an engine's or library's own sched_setaffinity, or a launcher's "
                    "affinity restored)" % (name_of(item), len(off), len(threads), item["cpus"], shown,
                                            " and %d more" % more if more > 0 else ""),
                    name_of(item), item["cpus"], {str(t): c for t, c in off.items()})]


def name_of(item):
    return item.get("name")


def numa_balancing_setting(value):
    """autonuma_numa_balancing as the audit takes it: 0, 1, ``auto`` or None; ValueError otherwise."""
    if value is None:
        return None
    if not isinstance(value, bool):
        text = str(value).strip()
        if text in ("0", "1"):
            return int(text)
        if text == autonuma.AUTO:
            return autonuma.AUTO
    raise ValueError("numa_balancing: %r is not allowed; allowed: auto, 0, 1, or null (not checked)" % (value,))


def numa_balancing_expected(setting, profile, kernel_release):
    """(value, reason): what the audit holds kernel.numa_balancing to, or None to leave it unchecked.

    The autonuma role's decision (:func:`gpunuma.autonuma.decide`) with the
    release the audit read on the node: ``auto`` with a bound profile expects
    0 on a kernel before 5.12 or of unknown release and leaves the key
    unchecked on 5.12 or later; ``auto`` with profile off, and null, leave it
    unchecked; 0 and 1 are expected as they are.
    """
    setting = numa_balancing_setting(setting)
    if setting is None:
        return None, "autonuma_numa_balancing is null: kernel.numa_balancing is not managed"
    return autonuma.decide(setting, profile, kernel_release)


def numa_balancing_findings(expected, live_value, file_value, file_path, check_live):
    """Findings for kernel.numa_balancing held to ``expected`` (0 or 1; None: none).

    ``file_value`` is the value gpunuma's sysctl file ``file_path`` sets (None:
    missing or no line), ``live_value`` the text of the live key (None: absent),
    ``check_live`` whether the live value is the node's own (not a container's).
    """
    if expected is None:
        return []
    findings = []
    if file_value != str(expected):
        findings.append(Finding("numa-balancing-file", "error", "%s sets kernel.numa_balancing to %s, expected %d"
                                % (file_path, file_value if file_value is not None else "nothing (missing)", expected),
                                None, expected, file_value))
    if check_live and live_value is not None and live_value != str(expected):
        findings.append(Finding("numa-balancing-live", "error", "kernel.numa_balancing is %s, expected %d"
                                % (live_value, expected), None, expected, live_value))
    return findings


# Container processes the audit reads at most (each a few small /proc files).
MAX_CONTAINER_PROCESSES = 4096


def in_pod(cgroup):
    """Whether a process's ``/proc/<pid>/cgroup`` text puts it in a Kubernetes pod (the kubelet names the pods'
    cgroups ``kubepods`` under both cgroup drivers)."""
    return "kubepods" in (cgroup or "")


def container_memlock(processes, expected=None):
    """``(summary, findings)`` of the memlock limits container processes run with (a Kubernetes node's pods).

    ``processes``: ``[(pid, cgroup text, limits text)]`` of the node's processes; those :func:`in_pod` are the
    pods'. ``expected``: the soft limit (bytes or ``"infinity"``) gpunuma gave containerd, which every container
    inherits, or None when gpunuma set none. A container process whose soft limit is below it was started before
    the change or by another runtime: its pinned allocations past the limit fail, or an engine falls back to
    pageable copies without a word (``IPC_LOCK`` does not lift the limit of a non-root process)."""
    held = [(pid, parse_memlock(text or "")) for pid, cgroup, text in processes if in_pod(cgroup)]
    held = [(pid, got) for pid, got in held if got is not None]
    counts, lowest = {}, None
    for pid, got in held:
        counts[str(got)] = counts.get(str(got), 0) + 1
        if got != "infinity" and (lowest is None or got < lowest[0]):
            lowest = (got, pid)
    summary = {"processes": len(held), "memlock": dict(sorted(counts.items())),
               "lowest": lowest[0] if lowest else None}
    below = sorted(pid for pid, got in held if got != "infinity" and (expected == "infinity" or got < expected)) \
        if expected is not None else []
    findings = []
    if below:
        findings.append(Finding(
            "container-memlock", "warning",
            "%d container process%s run%s with a memlock limit below the %s gpunuma gave containerd (lowest %d bytes, "
            "PID %s): pinned allocations past it fail or fall back to pageable copies; restart those pods"
            % (len(below), "es" if len(below) > 1 else "", "" if len(below) > 1 else "s", expected, lowest[0],
               lowest[1]), None, expected, lowest[0]))
    return summary, findings


def kubelet_findings(changes, remove_checkpoints=(), problem=None, profile=None, dra_checkpoint=None):
    """Findings for a kubelet node: each owned setting whose live value is not
    what the node's profile asks for (the kubelet plan's ``changes``), each
    checkpoint the kubelet would refuse to restore, the DRA checkpoint
    (``dra_checkpoint`` of the plan: its claims, or why the kubelet would
    refuse it), or the reason the kubelet settings could not be read or
    planned."""
    if problem:
        return [Finding("kubelet-unreadable", "error", "kubelet settings cannot be checked: %s" % problem)]
    findings = []
    for change in changes or []:
        findings.append(Finding(
            "kubelet-setting", "error",
            "kubelet %s is %s, profile %s asks for %s" % (change.get("key"), _shown(change.get("old")), profile,
                                                          _shown(change.get("new"))),
            None, change.get("new"), change.get("old")))
    for path in remove_checkpoints or []:
        findings.append(Finding("kubelet-checkpoint", "warning",
                                "kubelet checkpoint %s does not match the configured policy: the kubelet would refuse "
                                "to start until it is removed" % path, None, None, path))
    if dra_checkpoint:
        if dra_checkpoint.get("problem"):
            findings.append(Finding("kubelet-dra-checkpoint", "warning", dra_checkpoint["problem"], None, None,
                                    dra_checkpoint.get("path")))
        else:
            findings.append(Finding("kubelet-dra-checkpoint", "info",
                                    "%s records %d prepared claim(s)%s" % (
                                        dra_checkpoint.get("path"), dra_checkpoint.get("claims") or 0,
                                        " of %s" % ", ".join(dra_checkpoint["drivers"]) if dra_checkpoint.get("drivers")
                                        else ""), None, None, dra_checkpoint.get("claims")))
    return findings


def _shown(value):
    return "absent" if value is None else repr(value)


def status_of(findings):
    """``drifted`` when any finding is an error or a warning, else ``compliant`` (info findings only inform)."""
    if any(f["severity"] in ("error", "warning") for f in findings):
        return "drifted"
    return "compliant"
