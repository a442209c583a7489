"""The files that make the kubelet unit check its Memory Manager checkpoint before it starts.

``guard_files`` decides them for kubelet_topology: where the plan runs the
Static Memory Manager without KEP-6232's tolerance (``memory_checkpoint_guard``
of :func:`kubelet.plan.plan_kubelet`) and the inventory keeps the check on,
the script (kubelet/memory_checkpoint.py) and a drop-in of the kubelet unit
whose ``ExecStartPre=-`` runs it; otherwise both are removed. A drop-in, not a
unit of its own: it runs before every start of the kubelet (boot or restart)
with nothing to enable, and the ``-`` keeps any failure of the check from
keeping the kubelet down (systemd.service(5), ExecStartPre=).
"""

from __future__ import annotations

import re

from ansible.module_utils.gpunuma.common.errors import ProblemsError

SCRIPT_NAME = "kubelet-memory-checkpoint"
DROPIN_NAME = "50-gpunuma-memory-checkpoint.conf"
# Written into ExecStartPre= inside double quotes: no quote, backslash, specifier or variable characters.
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+@:-]*\Z")
_UNIT = re.compile(r"^[A-Za-z0-9@._:-]+\.service\Z")


class GuardError(ProblemsError):
    """A path or name the drop-in cannot carry; ``problems`` names each variable."""


def input_problems(python, libexec_dir, unit_dir, service, state_dir, backup_dir, tolerance_mib):
    """What the check's script and drop-in cannot carry, one problem a variable (``kubelet_topology_*``); the plan
    step asks it too (kubelet_topology_plan's ``guard_settings``), so a bad value stops the run before any change."""
    problems = []
    for name, value in (("kubelet_topology_python", python), ("kubelet_topology_libexec_dir", libexec_dir),
                        ("kubelet_topology_unit_dir", unit_dir), ("kubelet_topology_state_dir", state_dir),
                        ("kubelet_topology_backup_dir", backup_dir)):
        if not isinstance(value, str) or not _SAFE_PATH.match(value):
            problems.append("%s is %r; allowed: an absolute path of A-Z a-z 0-9 . _ / + @ : - (it is written into "
                            "the kubelet unit's ExecStartPre=)" % (name, value))
    if not isinstance(service, str) or not _UNIT.match(service):
        problems.append("kubelet_topology_service is %r; allowed: a systemd service name such as kubelet.service"
                        % (service,))
    if isinstance(tolerance_mib, bool) or not isinstance(tolerance_mib, int) or tolerance_mib < 0:
        problems.append("kubelet_topology_memory_drift_tolerance_mib is %r; allowed: a whole number of MiB, 0 or more"
                        % (tolerance_mib,))
    return problems


def guard_files(guard, enabled, script_text, python, libexec_dir, unit_dir, service, state_dir, backup_dir,
                tolerance_mib, header=""):
    """``{"files": [...], "absent": [...]}`` for gpunuma_apply (nothing restarts: the check runs at the next start)."""
    problems = input_problems(python, libexec_dir, unit_dir, service, state_dir, backup_dir, tolerance_mib)
    if problems:
        raise GuardError(problems)
    script_path = "%s/%s" % (libexec_dir.rstrip("/"), SCRIPT_NAME)
    dropin_path = "%s/%s.d/%s" % (unit_dir.rstrip("/"), service, DROPIN_NAME)
    if not (guard and enabled):
        return {"files": [], "absent": [dropin_path, script_path]}
    dropin = (
        "%s"
        "# Managed by gpunuma (kubelet_topology): before the kubelet starts, move memory_manager_state aside when a\n"
        "# reboot moved the kernel image between NUMA nodes and the Static Memory Manager would refuse it\n"
        "# (kubernetes#131253; docs/kubelet.md). The leading - keeps a failed check from stopping the kubelet.\n"
        "[Service]\n"
        "ExecStartPre=-\"%s\" \"%s\" --state-dir \"%s\" --backup-dir \"%s/stale\" --tolerance %d\n"
        % (header, python, script_path, state_dir.rstrip("/") or "/", backup_dir.rstrip("/"),
           tolerance_mib * 1024 * 1024))
    return {
        "files": [
            {"path": script_path, "content": script_text, "owner": "root", "group": "root", "mode": "0755"},
            {"path": dropin_path, "content": dropin, "owner": "root", "group": "root", "mode": "0644"},
        ],
        "absent": [],
    }
