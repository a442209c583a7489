"""What the autonuma role does with kernel.numa_balancing on one node.

``autonuma_numa_balancing`` is 0 (AutoNUMA off), 1 (on), null (gpunuma
hands the key back: its sysctl.d file is removed and the live value left as
it is) or ``auto``, the default, which follows the node's applied profile and
its kernel release:

* profile ``off`` (no binding): hand the node back, as null does.
* a bound profile (strict, preferred, interleave) on Linux 5.12 or later:
  hand the node back too. Instances started with an explicit memory policy
  (``numactl --membind/--preferred/--interleave``) are neither scanned nor
  migrated by NUMA balancing; only a policy set with MPOL_F_NUMA_BALANCING
  (set_mempolicy(2)) is, since kernel commit bda420b98505 ("numa balancing:
  migrate on fault among multiple bound nodes", Linux 5.12). A node-wide 0
  would mostly change the node's other workloads.
* a bound profile on an older kernel, or one whose release cannot be read:
  0, as the kernel's Documentation/admin-guide/sysctl/kernel.rst
  (numa_balancing) says for workloads already bound to NUMA nodes.

:func:`decide` is pure: the role probes the release on the node
(``gpunuma_node_info``) and decides on the controller.

Whether the live value is written at all is :func:`write_live`, from
:func:`detect_container`: in a container ``/proc/sys`` belongs to the host's
kernel. The role (through ``gpunuma_node_info``) and the audit
(``gpunuma_audit_info``) both ask these two functions, so they cannot
disagree about a node.
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional, Tuple

from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.node import sysctl_owners

AUTO = "auto"
UNBOUND_PROFILE = "off"
BOUND_PROFILES = ("strict", "preferred", "interleave")
# The first release in which an explicit memory policy opts in to NUMA
# balancing only with MPOL_F_NUMA_BALANCING (kernel commit bda420b98505).
MOF_OPT_IN_RELEASE = (5, 12)

# Files container engines and systemd leave in a container: systemd's own
# marker (systemd-detect-virt(1), written by systemd as PID 1 in any engine),
# Docker's and Podman's. systemd-detect-virt --container is asked as well.
CONTAINER_MARKERS = ("/run/systemd/container", "/.dockerenv", "/run/.containerenv")

KERNEL_DOC = ("the kernel's Documentation/admin-guide/sysctl/kernel.rst (numa_balancing): "
              "\"If the target workload is already bound to NUMA nodes then this feature should be disabled\"")

# "6.1.0-28-amd64", "5.12.0", "4.18.0-553.el8_10.x86_64", "5.4.0-1234-aws", "6.8-rc1"
_RELEASE_RE = re.compile(r"([0-9]{1,4})\.([0-9]{1,4})(?:[.\-+_~].*)?", re.ASCII | re.DOTALL)


def parse_kernel_release(release):
    """(major, minor) of a kernel release string, or None when it is not one."""
    if not isinstance(release, str):
        return None
    match = _RELEASE_RE.fullmatch(release.strip())
    if not match:
        return None
    return int(match.group(1)), int(match.group(2))


def _profile_name(profile_name):
    # An unquoted `off` in YAML is the boolean false: read it as the profile off.
    if profile_name is False:
        return UNBOUND_PROFILE
    return str(profile_name).strip() if profile_name is not None else "strict"


def setting_of(setting: Any) -> Any:
    """autonuma_numa_balancing as decided on: 0, 1, None or AUTO; anything else stays as given (the role's
    validation refuses it)."""
    if setting is None or isinstance(setting, bool):
        return setting
    text = str(setting).strip()
    if text in ("0", "1"):
        return int(text)
    return AUTO if text == AUTO else setting


def decide(setting: Any, profile_name: Any, kernel_release: Optional[str]) -> Tuple[Optional[int], str]:
    """(value, reason): the kernel.numa_balancing gpunuma sets on this node.

    ``value`` is 0 or 1 (persist it and set it live) or None (hand the key
    back: remove gpunuma's sysctl file, leave the live value). ``setting`` is
    autonuma_numa_balancing (0, 1, None or ``auto``), ``profile_name`` the
    applied profile, ``kernel_release`` the node's ``uname -r`` (None or
    anything unreadable: unknown). ``reason`` is one sentence.
    """
    setting = setting_of(setting)
    if setting is None:
        return None, "autonuma_numa_balancing is null: kernel.numa_balancing is not managed"
    if setting != AUTO:
        return setting, "autonuma_numa_balancing is %s" % setting
    profile = _profile_name(profile_name)
    if profile == UNBOUND_PROFILE:
        return None, ("autonuma_numa_balancing is auto and the profile is off (no binding): "
                      "gpunuma hands kernel.numa_balancing back to the node and leaves its live value")
    release = parse_kernel_release(kernel_release)
    shown = kernel_release.strip() if isinstance(kernel_release, str) and release else None
    if release is not None and release >= MOF_OPT_IN_RELEASE:
        return None, (
            "autonuma_numa_balancing is auto, profile %s, kernel %s: kernel.numa_balancing is left as it is, "
            "because instances launched with an explicit memory policy (numactl --membind/--preferred/--interleave) "
            "are neither scanned nor migrated by NUMA balancing (only policies with MPOL_F_NUMA_BALANCING are: "
            "set_mempolicy(2), kernel commit bda420b98505, Linux 5.12), so a node-wide 0 would mostly change the "
            "node's other workloads; set autonuma_numa_balancing: 0 to turn it off anyway" % (profile, shown))
    return 0, "autonuma_numa_balancing is auto, profile %s, kernel %s: 0, following %s" % (
        profile, ("%s (older than 5.12)" % shown) if release else "release unknown", KERNEL_DOC)


def value(setting, profile_name, kernel_release):
    """The value of :func:`decide` alone."""
    return decide(setting, profile_name, kernel_release)[0]


def detect_container(runner: Any = None, markers: Any = CONTAINER_MARKERS) -> Tuple[bool, list]:
    """``(in_container, evidence)``: whether this node is a container, and what says so.

    ``evidence`` lists the marker files found and ``systemd-detect-virt``
    when ``runner(argv) -> (rc, out, err)`` is given and it answers 0.
    """
    evidence = [marker for marker in markers if os.path.lexists(marker)]
    if runner is not None:
        rc, _unused, _unused = runner(["systemd-detect-virt", "--container"])
        if rc == 0:
            evidence.append("systemd-detect-virt")
    return bool(evidence), evidence


def write_live(apply_live: Any, in_container: Optional[bool]) -> Tuple[bool, str]:
    """``(write, reason)``: whether gpunuma writes (or checks) the live kernel.numa_balancing.

    ``apply_live`` is ``autonuma_apply_live``: None or ``auto`` (the default:
    yes, except in a container, whose /proc/sys is the host kernel's), or a
    boolean (``yes``/``no`` as well).
    """
    text = None if apply_live is None else str(apply_live).strip().lower()
    if text in (None, "", AUTO):
        if in_container:
            return False, ("this node is a container, and /proc/sys belongs to the host kernel; "
                           "set it on the host, or autonuma_apply_live: true")
        return True, "not a container"
    if text in ("true", "yes", "1", "on"):
        return True, "autonuma_apply_live is true"
    if text in ("false", "no", "0", "off"):
        return False, "autonuma_apply_live is false"
    raise GpunumaError("autonuma_apply_live: %r is not allowed; allowed: null (auto), true, false" % (apply_live,))


def role_plan(setting: Any, profile_name: Any, node: Optional[dict], apply_live: Any, sysctl_file: str,
              on_conflict: str, hostname: str, proc_path: str, key: str = "kernel.numa_balancing") -> dict:
    """Everything the autonuma role does on a node, decided at once from one read of it.

    ``node``: ``gpunuma_node_info``'s ``autonuma`` section (None when it was not read: ``setting`` null).
    Returns ``{value, notes, problem, write_file, remove_file, write_live}``: ``notes`` are the sentences the
    role prints (why auto chose, what gpunuma overrides, conflicts under ``on_conflict: warn``, what is left
    alone); ``problem`` stops the host before anything is written (``on_conflict: fail``); ``write_live`` is
    set only where the live value may be written (:func:`write_live`) and differs.
    """
    node = node or {}
    value, reason = decide(setting, profile_name, node.get("kernel_release"))
    out: dict = {"value": value, "notes": [], "problem": None, "write_file": False, "remove_file": value is None,
                 "write_live": False}
    if value is None:
        out["notes"].append(reason + ("; its live value is left as it is." if setting_of(setting) is None else "."))
        return out
    if setting_of(setting) == AUTO:
        out["notes"].append(reason + ".")
    live = node.get("live_value")
    write, why = write_live(apply_live, node.get("in_container"))
    active = sysctl_owners.tuned_active_profiles(node.get("tuned_active")) if node.get("tuned_active_rc") == 0 else []
    tuned = sysctl_owners.tuned_setting(node.get("tuned_lines") or [], active, key)
    paths = list(dict.fromkeys(list(node.get("sysctl_paths") or []) + [sysctl_file]))
    lines = list(node.get("sysctl_lines") or []) + ["%s:%s=%s" % (sysctl_file, key, value)]
    files = sysctl_owners.sysctl_conflicts(sysctl_owners.sysctl_writers(paths, lines, key), sysctl_file, value, key)
    tuned_conflict = sysctl_owners.tuned_conflict(tuned, value, key)
    conflicts = ([tuned_conflict] if tuned_conflict else []) + [f["reason"] for f in files["overriding"]]
    out["notes"].extend(f["reason"] for f in files["overridden"])
    if on_conflict == "warn":
        out["notes"].extend("WARNING %s: %s" % (hostname, c) for c in conflicts)
    elif conflicts:
        out["problem"] = ("%s: %s=%s would not hold: %s (autonuma_on_conflict is fail; set it to warn to go on "
                          "anyway)" % (hostname, key, value, "; ".join(conflicts)))
        return out
    if live is None:
        out["notes"].append("%s does not exist: this kernel has no automatic NUMA balancing (CONFIG_NUMA_BALANCING "
                            "off or a single-node build), so there is nothing to set." % proc_path)
        return out
    out["write_file"] = True
    out["write_live"] = bool(write) and str(live) != str(value)
    if not write:
        out["notes"].append("%s=%s is persisted in %s but the live value (%s) was not written: %s."
                            % (key, value, sysctl_file, live, why))
    return out
