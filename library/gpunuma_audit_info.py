#!/usr/bin/python
# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Read-only drift audit of one node against its applied plan (gpunuma.audit/v1)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpunuma_audit_info
short_description: Compare a node's live NUMA binding with the plan gpunuma applied
description:
  - Reads, in one round trip, the applied plan (C(/etc/gpunuma/plan.json)), the persisted topology and state, every
    planned instance's unit file or drop-in, what systemd loaded (one C(systemctl show) for all units), each running
    instance's C(/proc/<pid>/status), C(/proc/<pid>/numa_maps) and C(/proc/<pid>/limits), C(kernel.numa_balancing),
    the kernel release and gpunuma's sysctl.d file, and re-discovers the topology to compare its fingerprint.
  - Returns a C(gpunuma.audit/v1) report (docs/audit.md) with one finding per difference. Never changes anything;
    safe in check mode.
options:
  hostname:
    description: The inventory name written into the report.
    type: str
    required: true
  plan_path: {description: The applied plan., type: path, default: /etc/gpunuma/plan.json}
  topology_path: {description: The persisted topology., type: path, default: /etc/gpunuma/topology.json}
  state_path: {description: The node's profile state., type: path, default: /etc/gpunuma/state.json}
  unit_dir: {description: Where the units and drop-ins are., type: path, default: /etc/systemd/system}
  dropin_name: {description: File name of gpunuma's drop-ins., type: str, default: 50-gpunuma.conf}
  proc_root: {description: procfs mount (a copy for tests)., type: path, default: /proc}
  check_running:
    description: Expect the instances to run (false for nodes that only get unit files, numa_binding_start false).
    type: bool
    default: true
  numa_balancing:
    description:
      - autonuma_numa_balancing; null skips the check. 0 or 1 is expected as it is.
      - C(auto) is decided as the autonuma role decides it, with the kernel release read here (C(os.uname()), or
        C(sys/kernel/osrelease) under a copied O(proc_root)) - a bound O(numa_balancing_profile) expects 0 on a
        kernel before 5.12 or of unknown release and is not checked on 5.12 or later; profile C(off) is not checked.
    type: raw
  numa_balancing_profile:
    description: The profile C(auto) follows (the autonuma role's - gpunuma_effective_profile, else gpunuma_profile).
    type: raw
    default: strict
  numa_balancing_file:
    description: gpunuma's sysctl.d file for kernel.numa_balancing.
    type: path
    default: /etc/sysctl.d/60-gpunuma-numa-balancing.conf
  numa_balancing_live:
    description:
      - Compare the live value too. C(auto) skips it in a container (the test the autonuma role uses, gpunuma.node.autonuma.detect_container),
        whose kernel.numa_balancing is the host's.
    type: str
    choices: [auto, "yes", "no"]
    default: auto
  containers:
    description:
      - Read the memlock limit every container process runs with (processes whose cgroup path holds C(kubepods)),
        at most 4096 of them; the report's C(containers) section counts them by soft limit. For Kubernetes nodes.
    type: bool
    default: false
  container_memlock:
    description:
      - The memlock limit gpunuma gave containerd (C(memlock_limit) with C(memlock_containerd)); a container process
        below it is a C(container-memlock) finding. Null reports the limits without judging them.
    type: raw
  min_local_share:
    description:
      - Share (0-1) of a bind/preferred instance's anonymous resident pages (what its processes allocated; all
        pages when it has none) that should be on its planned nodes, summed over every process of its unit
        (C(/proc/PID/numa_maps)). Below it is a C(mem-local-share) finding.
    type: float
    default: 0.98
  rediscover:
    description: Re-discover the topology and compare its fingerprint with the persisted one.
    type: bool
    default: true
  sysfs_root:
    description: Discover from this copy of sys/ and proc/ instead of the live node.
    type: path
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpunuma_attributes
author: gpunuma maintainers (@gpunuma)
"""

EXAMPLES = r"""
- name: Audit the node
  gpunuma.fleet.gpunuma_audit_info:
    hostname: "{{ inventory_hostname }}"
    numa_balancing: auto
    numa_balancing_profile: strict
  register: audit
"""

RETURN = r"""
audit:
  description: The gpunuma.audit/v1 report (docs/audit.md).
  returned: always
  type: dict
  contains:
    schema: {description: gpunuma.audit/v1, type: str}
    status: {description: compliant or drifted., type: str}
    findings: {description: "Each: id, severity, instance, expected, actual, message.", type: list}
    numa_balancing:
      description: "expected (null: not checked), live, file, kernel_release (the node's, null when unreadable), reason."
      type: dict
    instances: {description: "Per planned instance, what was expected and what runs.", type: list}
    containers:
      description: "With O(containers): processes (how many container processes were read), memlock (their count
        by soft limit, bytes or infinity), lowest (the lowest finite soft limit, or null). Null without O(containers)."
      type: dict
applied_plan: {description: The applied plan read (for the policy rules)., returned: always, type: dict}
persisted_topology: {description: The persisted topology read (for the policy rules)., returned: always, type: dict}
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpunuma.common import bounded, documents, node_paths, seal
from ansible.module_utils.gpunuma.common import commands
from ansible.module_utils.gpunuma.node import autonuma as autonumalib
from ansible.module_utils.gpunuma.node import limits as limitslib
from ansible.module_utils.gpunuma.node import systemctl
from ansible.module_utils.gpunuma.verify import metrics as metricslib
from ansible.module_utils.gpunuma.plan.profiles import base_profile
from ansible.module_utils.gpunuma.verify import audit as auditlib
from ansible.module_utils.gpunuma.verify import proc_texts
from ansible.module_utils.gpunuma.verify.audit import Finding
from ansible.module_utils.gpunuma.common import schemas

BINDING_KEYS = ("ExecStart", "CPUAffinity", "NUMAPolicy", "NUMAMask", "LimitMEMLOCK", "AllowedCPUs")

MAX_READ_BYTES = 16 * 1024 * 1024


def _read(path):
    """A file's text (a regular file of at most 16 MiB), or None when absent or unreadable."""
    try:
        return bounded.read_bounded(path, MAX_READ_BYTES, follow_symlinks=True,
                                    what="a file the audit reads").decode("utf-8", "replace")
    except OSError:
        return None


def _json(path):
    text = _read(path)
    if text is None:
        return None, None
    try:
        return bounded.loads_json(text), None
    except ValueError as exc:
        return None, "%s: not valid JSON (%s)" % (path, exc)


# At most this many processes of one unit are read (an engine has a handful: API server, engine cores, workers).
MAX_UNIT_PIDS = 256


def _unit_pids(control_group, main_pid, cgroup_root="/sys/fs/cgroup"):
    """The processes of a unit: its cgroup's ``cgroup.procs`` (cgroup v2, or the v1 systemd hierarchy), else its
    main PID alone; at most MAX_UNIT_PIDS, the main PID first."""
    pids = []
    if control_group and control_group.startswith("/") and ".." not in control_group.split("/"):
        for base in (cgroup_root, os.path.join(cgroup_root, "systemd")):
            text = _read(os.path.join(base + control_group, "cgroup.procs"))
            if text:
                pids = [int(w) for w in text.split() if w.isdigit()]
                break
    ordered = ([main_pid] if main_pid else []) + sorted(set(pids) - {main_pid})
    return ordered[:MAX_UNIT_PIDS]


def _sysctl_value(text, key="kernel.numa_balancing"):
    value = None
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        name, _unused, raw = line.partition("=")
        if name.strip().replace("/", ".") == key:
            value = raw.strip()
    return value


def _kernel_release(proc_root):
    """The node's kernel release: os.uname() for /proc, else the copy's sys/kernel/osrelease (None when missing)."""
    if os.path.normpath(proc_root) == "/proc":
        return os.uname().release
    text = _read(os.path.join(proc_root, "sys/kernel/osrelease"))
    return (text or "").strip() or None


ARGUMENT_SPEC = dict(
    hostname=dict(type="str", required=True),
    plan_path=dict(type="path", default=node_paths.PLAN),
    topology_path=dict(type="path", default=node_paths.TOPOLOGY),
    state_path=dict(type="path", default=node_paths.STATE),
    unit_dir=dict(type="path", default="/etc/systemd/system"),
    dropin_name=dict(type="str", default="50-gpunuma.conf"),
    proc_root=dict(type="path", default="/proc"),
    check_running=dict(type="bool", default=True),
    numa_balancing=dict(type="raw"),
    numa_balancing_profile=dict(type="raw", default="strict"),
    numa_balancing_file=dict(type="path", default="/etc/sysctl.d/60-gpunuma-numa-balancing.conf"),
    numa_balancing_live=dict(type="str", choices=["auto", "yes", "no"], default="auto"),
    min_local_share=dict(type="float", default=auditlib.MIN_LOCAL_SHARE),
    rediscover=dict(type="bool", default=True),
    sysfs_root=dict(type="path"),
    containers=dict(type="bool", default=False),
    container_memlock=dict(type="raw"),
)

# What to do about one of gpunuma's own files edited by hand (common/seal.py).
RECOVERY = {
    "plan": "site.yml writes the plan again (the edited file kept as a backup)",
    "topology": "re-run site.yml with gpu_topology_accept_changes: true to replace it with a fresh discovery "
                "(the edited file kept as a backup)",
    "state": "the next recorded switch keeps it as a backup and starts a new history",
}


def _plan(p, findings):
    """The applied plan through its one schema (common/documents.py): a damaged one names its fields."""
    plan_text = _read(p["plan_path"])
    plan, plan_error = None, None
    if plan_text is not None:
        plan_doc, plan_error = documents.load_text(documents.Plan, plan_text, p["plan_path"])
        plan = plan_doc.data if plan_doc is not None else None
    if plan_error:
        findings.append(Finding("plan-unreadable", "error", plan_error, expected=schemas.PLAN))
    elif plan is None:
        findings.append(Finding("plan-missing", "error", "%s does not exist: gpunuma has not provisioned this node"
                                % p["plan_path"], expected=p["plan_path"]))
    return plan if isinstance(plan, dict) else {}


def _state(p, plan, report, findings):
    state, _state_error = _json(p["state_path"])
    if isinstance(state, dict):
        report["profile"]["state"] = state.get("profile")
        report["profile"]["pinned"] = bool(state.get("pinned"))
        planned = base_profile(plan.get("profile")) or ""
        if plan and state.get("profile") and state.get("profile") != planned:
            findings.append(Finding("profile-state", "error", "the node's state says profile %s, the applied plan is %s"
                                    % (state.get("profile"), plan.get("profile")), None, state.get("profile"),
                                    plan.get("profile")))
    return state


def _topology(p, plan, report, findings):
    """The persisted topology, and findings when it, the live discovery and the plan's fingerprint disagree."""
    topology, _topo_error = _json(p["topology_path"])
    fingerprint = report["fingerprint"]
    if isinstance(topology, dict):
        fingerprint["persisted"] = topology.get("fingerprint")
    if p["rediscover"]:
        try:
            from ansible.module_utils.gpunuma.discovery.discover import discover

            live_topo = discover(p["hostname"], sysfs_root=p["sysfs_root"])["topology"]
            fingerprint["live"] = live_topo.get("fingerprint")
        except Exception as exc:  # discovery problems are findings, not crashes
            findings.append(Finding("topology-unverified", "warning", "the topology could not be re-discovered: %s" % exc))
        persisted = fingerprint["persisted"]
        if fingerprint["live"] and persisted and fingerprint["live"] != persisted:
            findings.append(Finding("topology-changed", "error", "the hardware layout changed since it was persisted in %s "
                                    "(a BIOS NPS/SNC change, a moved GPU): re-plan with site.yml and "
                                    "gpu_topology_accept_changes: true" % p["topology_path"], None, persisted,
                                    fingerprint["live"]))
    if plan and fingerprint["persisted"] and plan.get("topology_fingerprint") not in (None, fingerprint["persisted"]):
        findings.append(Finding("topology-changed", "error", "the applied plan was made for topology %s, %s holds %s"
                                % (plan.get("topology_fingerprint"), p["topology_path"], fingerprint["persisted"]),
                                None, plan.get("topology_fingerprint"), fingerprint["persisted"]))
    return topology


def _unit_view(p, item, props):
    """What the audit compares of one instance's unit: its own file, other drop-ins that bind, its state."""
    unit_name = item.get("unit")
    own = os.path.join(p["unit_dir"], unit_name if item.get("mode") != "dropin"
                       else "%s.d/%s" % (unit_name, p["dropin_name"]))
    extra = []
    for path in (props.get("DropInPaths") or "").split():
        if path != own:
            text = _read(path) or ""
            keys = ("CPUAffinity", "NUMAPolicy", "NUMAMask", "LimitMEMLOCK", "AllowedCPUs", "exec")
            if any(proc_texts.parse_unit(text).get(k) for k in keys):
                extra.append(path)
    try:
        pid = int(props.get("MainPID") or 0)
    except ValueError:
        pid = 0
    return {"unit": unit_name, "path": own, "text": _read(own), "extra_dropins": extra,
            "need_reload": props.get("NeedDaemonReload") == "yes", "active": props.get("ActiveState"),
            "pid": pid, "check_running": p["check_running"]}


def _process_view(p, pid, control_group):
    """The main process's status, numa_maps and limits, with pages and thread CPUs of every process of the unit."""
    if not pid:
        return None
    base = os.path.join(p["proc_root"], str(pid))
    proc = {"status": _read(os.path.join(base, "status")), "numa_maps": _read(os.path.join(base, "numa_maps")),
            "limits": _read(os.path.join(base, "limits"))}
    # Every process of the unit and every thread: an engine's workers are child processes, and a
    # library that re-pins one thread (late sched_setaffinity) shows only there.
    pages, threads, pids = {"anon": {}, "file": {}}, {}, _unit_pids(control_group, pid)
    for each in pids:
        maps = proc["numa_maps"] if each == pid else _read(os.path.join(p["proc_root"], str(each), "numa_maps"))
        metricslib.add_numa_maps(pages, maps or "")
        threads.update(metricslib.thread_cpus(each, p["proc_root"]))
    proc.update(pages=pages, threads=threads, pids=pids)
    return proc


def _instances(module, p, plan, findings):
    """One report entry per planned instance, its findings added to ``findings``."""
    instances = [i for i in plan.get("instances") or [] if isinstance(i, dict)]
    props = ("Id", "ActiveState", "MainPID", "NeedDaemonReload", "DropInPaths", "ControlGroup")
    shown = systemctl.show(commands.runner(module), [i.get("unit") for i in instances if i.get("unit")], props)[2]
    out = []
    for item in instances:
        props = shown.get(item.get("unit"), {})
        unit = _unit_view(p, item, props)
        proc = _process_view(p, unit["pid"], props.get("ControlGroup"))
        item_findings, live = auditlib.audit_instance(item, unit, proc, p["min_local_share"])
        findings.extend(item_findings)
        out.append({
            "name": item.get("name"), "unit": item.get("unit"),
            "expected": {"cpus": item.get("cpus"), "mem_policy": item.get("mem_policy"),
                         "mem_nodes": item.get("mem_nodes") or []},
            "live": live,
        })
    return out


def _containers(p, findings):
    """The memlock limits of the node's container processes (auditlib.container_memlock), or None when not asked."""
    if not p["containers"]:
        return None
    expected = None
    if p["container_memlock"] not in (None, ""):
        try:
            expected = limitslib.parse_limit(p["container_memlock"], "container_memlock")
        except limitslib.LimitError as exc:
            raise ValueError(str(exc))
        expected = "infinity" if expected is None else expected
    try:
        names = sorted(n for n in os.listdir(p["proc_root"]) if n.isdigit())
    except OSError:
        names = []
    processes = []
    for name in names[:auditlib.MAX_CONTAINER_PROCESSES * 4]:
        cgroup = _read(os.path.join(p["proc_root"], name, "cgroup"))
        if auditlib.in_pod(cgroup):
            processes.append((int(name), cgroup, _read(os.path.join(p["proc_root"], name, "limits"))))
            if len(processes) >= auditlib.MAX_CONTAINER_PROCESSES:
                break
    summary, found = auditlib.container_memlock(processes, expected)
    findings.extend(found)
    return summary


def _numa_balancing(module, p, report, findings):
    live_text = _read(os.path.join(p["proc_root"], "sys/kernel/numa_balancing"))
    live_value = live_text.strip() if live_text else None
    section = report["numa_balancing"]
    section["live"] = live_value
    if section["expected"] is not None:
        file_value = _sysctl_value(_read(p["numa_balancing_file"]))
        section["file"] = file_value
        # The same container test and live-write rule as the autonuma role (gpunuma_node_info).
        in_container, _unused = autonumalib.detect_container(commands.runner(module))
        check_live, _unused = autonumalib.write_live(p["numa_balancing_live"], in_container)
        findings.extend(auditlib.numa_balancing_findings(section["expected"], live_value, file_value,
                                                         p["numa_balancing_file"], check_live))


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    if not 0 <= p["min_local_share"] <= 1:
        module.fail_json(msg="min_local_share: %r is not allowed; allowed: a number from 0 to 1" % p["min_local_share"])
    kernel_release = _kernel_release(p["proc_root"])
    try:
        expected, reason = auditlib.numa_balancing_expected(p["numa_balancing"], p["numa_balancing_profile"],
                                                            kernel_release)
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    findings = []
    report = {
        "schema": auditlib.SCHEMA,
        "hostname": p["hostname"],
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "profile": {"plan": None, "state": None, "pinned": False},
        "fingerprint": {"persisted": None, "live": None, "plan": None},
        "numa_balancing": {"expected": expected, "live": None, "file": None, "kernel_release": kernel_release,
                           "reason": reason},
        "instances": [],
    }
    plan = _plan(p, findings)
    report["profile"]["plan"] = plan.get("profile")
    report["fingerprint"]["plan"] = plan.get("topology_fingerprint")
    state = _state(p, plan, report, findings)
    topology = _topology(p, plan, report, findings)
    for kind, doc, path in (("plan", plan, p["plan_path"]), ("topology", topology, p["topology_path"]),
                            ("state", state, p["state_path"])):
        edited = seal.problem(doc) if isinstance(doc, dict) and doc else None
        if edited:
            findings.append(Finding("%s-edited" % kind, "error", "%s %s: %s" % (path, edited, RECOVERY[kind])))
    report["instances"] = _instances(module, p, plan, findings)
    try:
        report["containers"] = _containers(p, findings)
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    _numa_balancing(module, p, report, findings)
    report["findings"] = findings
    report["status"] = auditlib.status_of(findings)
    # The documents compared, for the policy rules on live state (not part of the report).
    module.exit_json(changed=False, audit=report, applied_plan=plan,
                     persisted_topology=topology if isinstance(topology, dict) else {})


if __name__ == "__main__":
    main()
