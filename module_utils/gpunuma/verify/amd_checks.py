"""Platform checks for nodes with AMD Instinct GPUs, from AMD's MI300X system optimization guide.

AMD's guide (ROCm/amdgpu-docs, docs/system-optimization/mi300x.rst; :data:`GUIDE_URL`)
gives the settings an Instinct node is validated with. What a running node
shows of them is checked here, read-only, beside node_checks' own checks:

* ``amd_nps``: "NUMA nodes per socket: Auto = NPS1. At this time, the other
  options for NUMA nodes per socket should not be used." More than one
  CPU-bearing NUMA node on a socket is NPS2/NPS4 (or L3-as-NUMA): a warning.
* ``amd_iommu``: ``iommu=pt`` on the kernel command line ("enables IOMMU
  pass-through mode ... which can improve performance"; Intel hosts
  ``intel_iommu=on iommu=pt``): a warning when it is missing.
* ``amd_c2_state``: "Disabling C2 is important for running with a high
  performance, low-latency network" (``cpupower idle-set -d 2``): a warning
  naming the CPUs whose cpuidle state ``C2`` is enabled.
* ``amd_numa_balancing``: the guide disables NUMA balancing in general but
  says to measure both values on the workload: an info finding while it is on
  (gpunuma's own rule for bound workers stays node_checks' ``numa_balancing``).

AMD Instinct GPUs are what discovery counts as such
(``discovery.sysfs.host.is_amd_instinct``). A node without one gets none of these
findings. Findings are returned as plain tuples
``(check, severity, subject, message, [(file, value)], fix)``;
node_checks turns them into its records.
"""

from __future__ import annotations

import os
import re

GUIDE_URL = "https://instinct.docs.amd.com/projects/amdgpu-docs/en/latest/system-optimization/mi300x.html"
CHECKS = ("amd_nps", "amd_iommu", "amd_c2_state", "amd_numa_balancing")
_NODE_RE = re.compile(r"node(0|[1-9][0-9]{0,3})", re.ASCII)
_CPU_RE = re.compile(r"cpu(0|[1-9][0-9]{0,5})", re.ASCII)
_STATE_RE = re.compile(r"state([0-9]{1,2})", re.ASCII)
_MAX_LISTED = 8


def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def read_amd(reader, gpus):
    """What the checks need besides node_checks' facts: ``{"gpus", "nodes_by_socket", "c2_enabled", "files"}``.

    ``reader`` is node_checks' bounded reader (``path``, ``text``); ``gpus`` the Instinct bus ids found."""
    if not gpus:
        return None
    node_dir = os.path.join("sys", "devices", "system", "node")
    cpu_dir = os.path.join("sys", "devices", "system", "cpu")
    nodes_by_socket = {}
    for name in _listdir(reader.path(node_dir)):
        match = _NODE_RE.fullmatch(name)
        if not match:
            continue
        cpulist = (reader.text(os.path.join(node_dir, name, "cpulist")) or "").strip()
        if not cpulist:
            continue  # a CPU-less memory node is not a socket's NPS split
        first = re.match(r"[0-9]+", cpulist)
        package = reader.text(os.path.join(cpu_dir, "cpu%s" % first.group(0), "topology", "physical_package_id")) \
            if first else None
        socket = package.strip() if package and package.strip().isdigit() else "?"
        nodes_by_socket.setdefault(socket, []).append(int(match.group(1)))
    c2_enabled = []
    for name in _listdir(reader.path(cpu_dir)):
        match = _CPU_RE.fullmatch(name)
        if not match:
            continue
        idle = os.path.join(cpu_dir, name, "cpuidle")
        for state in _listdir(reader.path(idle)):
            if not _STATE_RE.fullmatch(state):
                continue
            if (reader.text(os.path.join(idle, state, "name")) or "").strip() != "C2":
                continue
            if (reader.text(os.path.join(idle, state, "disable")) or "").strip() == "0":
                c2_enabled.append(int(match.group(1)))
    return {"gpus": sorted(gpus), "nodes_by_socket": dict((k, sorted(v)) for k, v in nodes_by_socket.items()),
            "c2_enabled": sorted(c2_enabled)}


def _passthrough(cmdline):
    words = (cmdline or "").split()
    return "iommu=pt" in words or "iommu.passthrough=1" in words


def _listed(values):
    shown = ", ".join(str(v) for v in values[:_MAX_LISTED])
    return shown + (" and %d more" % (len(values) - _MAX_LISTED) if len(values) > _MAX_LISTED else "")


def findings(amd, cmdline, numa_balancing, shown):
    """The AMD findings for ``amd`` (:func:`read_amd`; None: no Instinct GPU, no finding)."""
    if not amd:
        return []
    out = []
    subject = "host"
    split = dict((socket, nodes) for socket, nodes in amd["nodes_by_socket"].items() if len(nodes) > 1)
    if split:
        per = sorted(set(len(n) for n in split.values()))
        out.append(("amd_nps", "warning", subject,
                    "AMD Instinct GPUs (%s) on sockets split into %s NUMA nodes (%s): AMD's MI300X guide validates "
                    "NUMA nodes per socket Auto = NPS1 and says the other options should not be used (%s)"
                    % (_listed(amd["gpus"]), "/".join(str(n) for n in per),
                       "; ".join("socket %s: nodes %s" % (s, _listed(n)) for s, n in sorted(split.items())), GUIDE_URL),
                    [(shown(os.path.join("sys", "devices", "system", "node")), dict(amd["nodes_by_socket"]))],
                    "Set AMD CBS / DF common options / memory addressing / NUMA nodes per socket to Auto (NPS1) in "
                    "the BIOS, then rediscover the topology (the plan follows the nodes it finds)."))
    if not _passthrough(cmdline):
        out.append(("amd_iommu", "warning", subject,
                    "AMD Instinct GPUs and no iommu=pt on the kernel command line: AMD's MI300X guide asks for IOMMU "
                    "pass-through, which spares DMA the translation (%s)" % GUIDE_URL,
                    [(shown(os.path.join("proc", "cmdline")), cmdline)],
                    "Add iommu=pt (Intel hosts: intel_iommu=on iommu=pt) to GRUB_CMDLINE_LINUX, update GRUB and "
                    "reboot; keep the BIOS IOMMU enabled (with 256 or more CPU threads it keeps x2APIC on)."))
    if amd["c2_enabled"]:
        out.append(("amd_c2_state", "warning", subject,
                    "the C2 idle state is enabled on %d CPUs (%s): AMD's MI300X guide says disabling C2 is important "
                    "for a high-performance, low-latency network (%s)"
                    % (len(amd["c2_enabled"]), _listed(amd["c2_enabled"]), GUIDE_URL),
                    [(shown(os.path.join("sys", "devices", "system", "cpu", "cpu%d" % amd["c2_enabled"][0], "cpuidle")),
                      "C2 disable=0")],
                    "cpupower idle-set -d 2 (package linux-tools-common, cpupowerutils or cpupower), made persistent "
                    "by a boot-time unit."))
    if numa_balancing is not None and numa_balancing & 1:
        out.append(("amd_numa_balancing", "info", subject,
                    "kernel.numa_balancing=%d on a node with AMD Instinct GPUs: AMD's MI300X guide disables it in "
                    "general and asks to compare 0 and 1 on the workload (%s)" % (numa_balancing, GUIDE_URL),
                    [(shown(os.path.join("proc", "sys", "kernel", "numa_balancing")), numa_balancing)],
                    "Measure the workload with 0 and with 1 (autonuma_numa_balancing), keep the faster."))
    return out
