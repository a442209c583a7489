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
"""

from __future__ import annotations

import re

AUTO = "auto"
UNBOUND_PROFILE = "off"
BOUND_PROFILES = ("strict", "preferred", "interleave")
# The first release in which an explicit memory policy opts in to NUMA
# balancing only with MPOL_F_NUMA_BALANCING (kernel commit bda420b98505).
MOF_OPT_IN_RELEASE = (5, 12)

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


def _setting(setting):
    """0, 1, None or AUTO; anything else stays as given (the role's validation refuses it)."""
    if setting is None or isinstance(setting, bool):
        return setting
    text = str(setting).strip()
    if text in ("0", "1"):
        return int(text)
    return AUTO if text == AUTO else setting


def decide(setting, profile_name, kernel_release):
    """(value, reason): the kernel.numa_balancing gpunuma sets on this node.

    ``value`` is 0 or 1 (persist it and set it live) or None (hand the key
    back: remove gpunuma's sysctl file, leave the live value). ``setting`` is
    autonuma_numa_balancing (0, 1, None or ``auto``), ``profile_name`` the
    applied profile, ``kernel_release`` the node's ``uname -r`` (None or
    anything unreadable: unknown). ``reason`` is one sentence.
    """
    setting = _setting(setting)
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
