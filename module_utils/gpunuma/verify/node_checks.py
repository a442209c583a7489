"""Platform checks for a GPU node: read-only findings, each with evidence and a fix.

``read_node(root)`` reads a tree holding ``sys/`` and ``proc/`` (``/`` on the
live host, or a support bundle / test tree) into a :class:`NodeFacts`;
``evaluate(facts, profile, ...)`` turns it into :class:`Finding` records.
Nothing here writes anywhere: ``plan_fixes`` only *describes* the safe fixes
(CPU frequency governor of the GPU nodes' CPUs, GPU persistence mode) that
``node_checks_fix`` applies when the operator opts in.

Files read (all through :func:`sysfs.read_bounded`: regular files only, at
most 64 KiB; ``config`` at most 4096 bytes):

* ``sys/bus/pci/devices/<bdf>/{vendor,class,current_link_speed,current_link_width,
  max_link_speed,max_link_width,config,iommu_group}`` of each NVIDIA GPU and of
  each bridge above it (the chain comes from the device symlink, or from the
  ``_realpath`` file support bundles keep);
* ``sys/devices/system/cpu/cpu<N>/cpufreq/{scaling_governor,scaling_available_governors}``;
* ``sys/kernel/mm/transparent_hugepage/{enabled,defrag}``;
* ``proc/cmdline``, ``proc/sys/kernel/numa_balancing`` and ``proc/sys/kernel/osrelease``
  (the kernel release, ``uname -r``).

A file that is absent is a fact (``None``); a file that exists but cannot be
read or holds a value outside its grammar becomes a ``warning`` finding
named ``unreadable`` that quotes the file and what it held. Only a root that
is missing or has no ``sys/`` raises :class:`NodeChecksError`.
"""

from __future__ import annotations

import os

from ansible.module_utils.gpunuma.node import autonuma
from ansible.module_utils.gpunuma.verify import amd_checks
# The ACS bits and the facts' model.
from ansible.module_utils.gpunuma.verify.pci_acs import ACS_CR, ACS_EC, ACS_RR, acs_bits
from ansible.module_utils.gpunuma.verify.node_facts import Evidence, Finding, NodeChecksError, parse_cmdline_iommu
from ansible.module_utils.gpunuma.discovery.sysfs.reader import quote

SEVERITIES = ("info", "warning", "error")
PROFILES = ("strict", "preferred", "interleave", "off")
# The profiles whose memory policy binds (the planner's mem_policy: bind).
BINDING_PROFILES = ("strict",)
CHECKS = ("pcie_link", "acs", "iommu", "cpu_governor", "persistence_mode", "thp", "numa_balancing",
          "unreadable") + amd_checks.CHECKS

KERNEL_NUMA_BALANCING_URL = "https://docs.kernel.org/admin-guide/sysctl/kernel.html#numa-balancing"
NCCL_ACS_URL = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html#pci-access-control-services-acs"


def apply_persistence(facts, modes, source):
    """Attach persistence modes ``{bus_id: bool}`` (from NVML or nvidia-smi -q) to the GPUs."""
    for gpu in facts.gpus:
        if gpu.link.bdf in modes and gpu.persistence_mode is None:
            gpu.persistence_mode = modes[gpu.link.bdf]
            gpu.persistence_source = source


def apply_nvml_pcie(facts, dump):
    """Attach the NVML PCIe fields of a ``gpunuma.nvml-dump/v1`` (validated) to the GPUs."""
    by_bus = {gpu.get("pci_bus_id"): gpu.get("pcie") for gpu in dump.get("gpus", [])}
    for gpu in facts.gpus:
        if by_bus.get(gpu.link.bdf):
            gpu.nvml_pcie = by_bus[gpu.link.bdf]


def validate_profile(profile):
    if profile is None:
        return None
    if not isinstance(profile, str) or profile not in PROFILES:
        raise NodeChecksError("profile is %s; allowed: %s, or null when no profile applies"
                              % (quote(profile), ", ".join(PROFILES)))
    return profile


# -- evaluation ----------------------------------------------------------------

IDLE_NOTE = ("NVIDIA GPUs lower the PCIe link generation while idle to save power (nvidia-smi documents "
             "pcie.link.gen.current as 'may be reduced when the GPU is not in use'); re-run the check "
             "while the GPU is busy (pcie_expect_full_speed: true) before treating it as a fault")


def _fmt_link(gen, width):
    return "Gen%s x%s" % (gen if gen is not None else "?", width if width is not None else "?")


def _link_findings(gpu, link, role, expect_full_speed, shown, cap_gen=None, cap_width=None):
    """Findings for one link: ``role`` is 'gpu' or 'bridge'; caps limit the expected maximum."""
    out = []
    max_gen = link.max_gen if cap_gen is None or link.max_gen is None else min(link.max_gen, cap_gen)
    max_width = link.max_width if cap_width is None or link.max_width is None else min(link.max_width, cap_width)
    subject = "gpu %s" % link.bdf if role == "gpu" else "bridge %s above gpu %s" % (link.bdf, gpu.link.bdf)
    evidence = [Evidence(os.path.join(shown(link.path), attr), link.raw.get(attr))
                for attr in ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width")
                if attr in link.raw]
    if link.current_width is not None and max_width is not None and link.current_width < max_width:
        out.append(Finding(
            check="pcie_link", severity="warning", subject=subject, gpu=gpu.link.bdf,
            message="PCIe link width x%d is below the x%d the link supports: host-to-device bandwidth drops "
                    "in proportion (x8 halves it)" % (link.current_width, max_width),
            evidence=evidence,
            fix="Reseat the card or riser, check the slot's lane sharing (bifurcation) in the BIOS, and check "
                "'lspci -vv' LnkSta for this device; a width does not recover without a retrain or reboot."))
    if link.current_gen is not None and max_gen is not None and link.current_gen < max_gen:
        severity = "warning" if expect_full_speed else "info"
        message = "PCIe link runs at Gen%d, below the Gen%d it supports" % (link.current_gen, max_gen)
        if not expect_full_speed:
            message += "; " + IDLE_NOTE
        out.append(Finding(
            check="pcie_link", severity=severity, subject=subject, gpu=gpu.link.bdf, message=message,
            evidence=evidence,
            fix="Under load, a generation below the maximum is a fault: check the BIOS slot speed setting "
                "(Auto/GenN), risers and retimers, and the kernel log for link retraining."))
    return out


def _nvml_link_findings(gpu, expect_full_speed):
    pcie = gpu.nvml_pcie or {}
    values = {k: pcie.get(k) for k in ("gen_current", "gen_max", "width_current", "width_max")}
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values.values()):
        return []
    out = []
    evidence = [Evidence("nvml:%s" % k, v) for k, v in sorted(values.items())]
    subject = "gpu %s" % gpu.link.bdf
    if values["width_current"] < values["width_max"]:
        out.append(Finding(check="pcie_link", severity="warning", subject=subject, gpu=gpu.link.bdf,
                           message="NVML reports PCIe width x%d below the maximum x%d"
                                   % (values["width_current"], values["width_max"]),
                           evidence=evidence,
                           fix="Reseat the card or riser and check the slot's bifurcation setting in the BIOS."))
    if values["gen_current"] < values["gen_max"]:
        message = "NVML reports PCIe Gen%d below the maximum Gen%d" % (values["gen_current"], values["gen_max"])
        if not expect_full_speed:
            message += "; " + IDLE_NOTE
        out.append(Finding(check="pcie_link", severity="warning" if expect_full_speed else "info",
                           subject=subject, gpu=gpu.link.bdf, message=message, evidence=evidence,
                           fix="Re-check under load; if the generation stays low, check the BIOS slot speed, "
                               "risers and retimers."))
    return out


def _acs_findings(facts, gpu, shown):
    out = []
    for bridge in gpu.bridges:
        if not bridge.acs_readable or bridge.acs_ctrl is None:
            continue
        redirect = bridge.acs_ctrl & (ACS_RR | ACS_CR | ACS_EC)
        if redirect:
            out.append(Finding(
                check="acs", severity="warning", subject="bridge %s above gpu %s" % (bridge.bdf, gpu.link.bdf),
                gpu=gpu.link.bdf,
                message="ACS control 0x%04x (%s) on this bridge redirects peer-to-peer traffic to the root "
                        "complex: GPU-GPU and GPU-NIC (GPUDirect RDMA) transfers below it lose bandwidth or "
                        "hang (NVIDIA NCCL troubleshooting, 'PCI Access Control Services (ACS)': %s)"
                        % (bridge.acs_ctrl, ", ".join(acs_bits(bridge.acs_ctrl)), NCCL_ACS_URL),
                evidence=[Evidence(os.path.join(shown(bridge.path), "config"), "ACSCtl=0x%04x" % bridge.acs_ctrl)],
                fix="On bare metal, disable ACS in the BIOS or clear the redirect bits at boot "
                    "('setpci -s %s ECAP_ACS+0x6.w=0000', as NCCL's troubleshooting guide shows); keep ACS in "
                    "VMs that pass GPUs through, where it provides isolation." % bridge.bdf))
    unreadable = [b.bdf for b in gpu.bridges if not b.acs_readable]
    if gpu.bridges and unreadable and len(unreadable) == len(gpu.bridges):
        out.append(Finding(
            check="acs", severity="info", subject="gpu %s" % gpu.link.bdf, gpu=gpu.link.bdf,
            message="ACS control of the bridges above this GPU (%s) could not be read: their extended PCI "
                    "config space is readable only by root" % ", ".join(unreadable),
            evidence=[Evidence(os.path.join(shown(gpu.bridges[0].path), "config"), None)],
            fix="Run the check as root (become: true) or inspect 'lspci -vvv' ACSCtl on these bridges."))
    return out


def _iommu_findings(facts, shown):
    out = []
    args = parse_cmdline_iommu(facts.cmdline or "")
    evidence = [Evidence(shown(os.path.join("proc", "cmdline")), facts.cmdline)]
    translated = [("%s=%s" % kv) for kv in args if kv in (("intel_iommu", "on"), ("amd_iommu", "on"), ("iommu", "force"),
                                                          ("iommu.passthrough", "0"), ("iommu", "nopt"))]
    passthrough = any(kv in (("iommu", "pt"), ("iommu.passthrough", "1")) for kv in args)
    if facts.gpus and translated and not passthrough:
        out.append(Finding(
            check="iommu", severity="warning", subject="host",
            message="the kernel command line turns the IOMMU on in translated mode (%s) without iommu=pt: "
                    "the kernel then enables ACS redirection on bridges and DMA goes through IOMMU translation, "
                    "which NCCL's troubleshooting guide names as a cause of slow or hanging peer traffic (%s)"
                    % (", ".join(translated), NCCL_ACS_URL),
            evidence=evidence,
            fix="Add iommu=pt to the kernel command line (GRUB_CMDLINE_LINUX) unless the node needs DMA "
                "isolation (device pass-through to VMs), then reboot."))
    elif facts.gpus and facts.iommu_groups_present:
        groups = sorted({g.link.iommu_group for g in facts.gpus if g.link.iommu_group is not None})
        out.append(Finding(
            check="iommu", severity="info", subject="host",
            message="an IOMMU is active (sys/kernel/iommu_groups is populated; GPU groups: %s); %s"
                    % (", ".join(groups) or "unknown",
                       "iommu=pt is set" if passthrough else "no iommu= argument selects its mode"),
            evidence=evidence + [Evidence(shown(os.path.join("sys", "kernel", "iommu_groups")), "present")],
            fix="No action if peer bandwidth is as expected; otherwise see the ACS findings and consider iommu=pt."))
    return out


def _governor_findings(facts):
    if not facts.governors:
        return [Finding(check="cpu_governor", severity="info", subject="host",
                        message="no CPU directories found under sys/devices/system/cpu",
                        evidence=[Evidence(facts.shown(os.path.join("sys", "devices", "system", "cpu")), None)],
                        fix="Nothing to do.")]
    absent = [g for g in facts.governors if g.governor is None]
    slow = [g for g in facts.governors if g.governor is not None and g.governor != "performance"]
    out = []
    if slow:
        names = sorted({g.governor for g in slow})
        out.append(Finding(
            check="cpu_governor", severity="warning", subject="host",
            message="%d of the %s CPUs (%s) run the cpufreq governor %s, not performance: the CPU threads "
                    "that feed the GPUs (tokenizer, launch, H2D copies) ramp their clock on demand"
                    % (len(slow), "GPU nodes'" if facts.governor_scope == "gpu_local_cpus" else "host's",
                       _cpu_ranges([g.cpu for g in slow]), "/".join(names)),
            evidence=[Evidence(g.file, g.governor) for g in slow[:8]],
            fix=("Set node_checks_fix_governor: true to write 'performance' to scaling_governor of these CPUs "
                        "(live only; persist it with tuned or cpupower), or accept the power saving."
                        if facts.governor_scope == "gpu_local_cpus" else
                        "No GPU's local CPU list is known, so node_checks_fix_governor does not change them (it would "
                        "be node-wide); set the governor with tuned or cpupower if that is wanted.")))
    if absent and len(absent) == len(facts.governors):
        out.append(Finding(check="cpu_governor", severity="info", subject="host",
                           message="cpufreq is absent (no scaling_governor): frequency is managed by the "
                                   "hypervisor or firmware, or the driver is not loaded",
                           evidence=[Evidence(absent[0].file, None)], fix="Nothing to do from the OS."))
    return out


def _cpu_ranges(cpus):
    from ansible.module_utils.gpunuma.common.cpulist import format_cpulist
    return format_cpulist(cpus)


def _persistence_findings(facts):
    out = []
    for gpu in facts.gpus:
        if gpu.persistence_mode is False:
            out.append(Finding(
                check="persistence_mode", severity="warning", subject="gpu %s" % gpu.link.bdf, gpu=gpu.link.bdf,
                message="persistence mode is off: the driver tears the GPU state down when the last client "
                        "exits, so the next start pays the initialisation again",
                evidence=[Evidence(gpu.persistence_source, "Disabled")],
                fix="Run nvidia-persistenced (preferred by NVIDIA), or set node_checks_fix_persistence: true "
                    "to run 'nvidia-smi -i %s -pm 1' (not kept across reboots)." % gpu.link.bdf))
        elif gpu.persistence_mode is None:
            out.append(Finding(
                check="persistence_mode", severity="info", subject="gpu %s" % gpu.link.bdf, gpu=gpu.link.bdf,
                message="persistence mode unknown: neither NVML nor an nvidia-smi -q output answered",
                evidence=[], fix="Install nvidia-ml-py on the node or pass nvidia_smi_q_file."))
    return out


def _thp_findings(facts):
    base = os.path.join("sys", "kernel", "mm", "transparent_hugepage")
    if facts.thp_enabled is None:
        return [Finding(check="thp", severity="info", subject="host",
                        message="%s/enabled is absent (kernel without THP, or a bundle that did not copy it)" % base,
                        evidence=[Evidence(facts.shown(os.path.join(base, "enabled")), None)], fix="Nothing to do.")]
    evidence = [Evidence(facts.shown(os.path.join(base, "enabled")), facts.thp_enabled),
                Evidence(facts.shown(os.path.join(base, "defrag")), facts.thp_defrag)]
    if facts.thp_enabled == "always" and facts.thp_defrag in ("always",):
        return [Finding(check="thp", severity="warning", subject="host",
                        message="THP enabled=always with defrag=always: page faults stall in direct compaction, "
                                "which shows as latency spikes in host-side workers",
                        evidence=evidence,
                        fix="Use defrag=madvise (or defer+madvise) so only madvise()d regions compact "
                            "synchronously (kernel docs admin-guide/mm/transhuge.rst).")]
    return [Finding(check="thp", severity="info", subject="host",
                    message="THP enabled=%s, defrag=%s" % (facts.thp_enabled, facts.thp_defrag),
                    evidence=evidence, fix="Nothing to do.")]


def _numa_balancing_findings(facts, profile):
    rel = os.path.join("proc", "sys", "kernel", "numa_balancing")
    evidence = [Evidence(facts.shown(rel), facts.numa_balancing)]
    if facts.numa_balancing is None:
        return [Finding(check="numa_balancing", severity="info", subject="host",
                        message="kernel.numa_balancing is absent (kernel built without NUMA balancing)",
                        evidence=evidence, fix="Nothing to do.")]
    if profile in BINDING_PROFILES and facts.numa_balancing & 1:
        # What autonuma_numa_balancing auto decides for this profile and kernel (one decider).
        release_rel = os.path.join("proc", "sys", "kernel", "osrelease")
        evidence.append(Evidence(facts.shown(release_rel), facts.kernel_release))
        release = autonuma.parse_kernel_release(facts.kernel_release)
        if autonuma.value(autonuma.AUTO, profile, facts.kernel_release) is None:
            return [Finding(
                check="numa_balancing", severity="info", subject="host",
                message="kernel.numa_balancing=%d with profile %s on kernel %s (5.12 or later): instances started "
                        "with an explicit memory policy (numactl --membind) are neither scanned nor migrated by NUMA "
                        "balancing; only a policy set with MPOL_F_NUMA_BALANCING is (set_mempolicy(2), kernel commit "
                        "bda420b98505, Linux 5.12), so the bound workers are not moved"
                        % (facts.numa_balancing, profile, facts.kernel_release.strip()),
                evidence=evidence,
                fix="Nothing to do (autonuma_numa_balancing auto leaves it so); autonuma_numa_balancing: 0 turns "
                    "it off node-wide anyway.")]
        return [Finding(
            check="numa_balancing", severity="warning", subject="host",
            message="profile %s binds workers to their node while kernel.numa_balancing=%d on kernel %s: the kernel "
                    "documentation says the feature should be disabled when the workload is already bound to "
                    "NUMA nodes (%s)" % (profile, facts.numa_balancing,
                                         ("%s (older than 5.12)" % facts.kernel_release.strip()) if release
                                         else "of unknown release", KERNEL_NUMA_BALANCING_URL),
            evidence=evidence,
            fix="Run the autonuma role (autonuma_numa_balancing auto or 0 sets 0 on this kernel).")]
    return [Finding(check="numa_balancing", severity="info", subject="host",
                    message="kernel.numa_balancing=%d with profile %s" % (facts.numa_balancing, profile or "none"),
                    evidence=evidence, fix="Nothing to do.")]


def evaluate(facts, profile=None, expect_full_speed=False):
    """All findings for ``facts``: a list of :class:`Finding`, host findings first."""
    profile = validate_profile(profile)
    shown = facts.shown
    findings = list(facts.problems)
    findings += _iommu_findings(facts, shown)
    findings += _governor_findings(facts)
    findings += _thp_findings(facts)
    findings += _numa_balancing_findings(facts, profile)
    for check, severity, subject, message, evidence, fix in amd_checks.findings(
            facts.amd, facts.cmdline, facts.numa_balancing, shown):
        findings.append(Finding(check=check, severity=severity, subject=subject, message=message,
                                evidence=[Evidence(f, v) for f, v in evidence], fix=fix))
    for gpu in facts.gpus:
        findings += _link_findings(gpu, gpu.link, "gpu", expect_full_speed, shown)
        for position, bridge in enumerate(gpu.bridges):
            # The port right above the GPU shares its link: its maximum is capped by the GPU's.
            last = position == len(gpu.bridges) - 1
            findings += _link_findings(gpu, bridge, "bridge", expect_full_speed, shown,
                                       cap_gen=gpu.link.max_gen if last else None,
                                       cap_width=gpu.link.max_width if last else None)
        findings += _nvml_link_findings(gpu, expect_full_speed)
        findings += _acs_findings(facts, gpu, shown)
    findings += _persistence_findings(facts)
    return findings


def plan_fixes(facts, fix_governor=False, fix_persistence=False):
    """The safe fixes the operator opted into: ``[{"kind", "target", "before", "after", ...}]``."""
    fixes = []
    # Without a GPU's local CPU list the GPU nodes' CPUs are unknown: the
    # governor fix would be node-wide, so it is not planned.
    if fix_governor and facts.governor_scope == "gpu_local_cpus":
        for gov in facts.governors:
            if gov.governor is None or gov.governor == "performance":
                continue
            if gov.available is not None and "performance" not in gov.available:
                continue
            fixes.append({"kind": "governor", "target": gov.file, "cpu": gov.cpu,
                          "before": gov.governor, "after": "performance"})
    if fix_persistence:
        for gpu in facts.gpus:
            if gpu.persistence_mode is False:
                fixes.append({"kind": "persistence", "target": gpu.link.bdf, "before": "Disabled",
                              "after": "Enabled", "argv": ["-i", gpu.link.bdf, "-pm", "1"]})
    return fixes


def summarize(findings):
    counts = {s: 0 for s in SEVERITIES}
    for finding in findings:
        counts[finding.severity] += 1
    worst = "error" if counts["error"] else "warning" if counts["warning"] else "info" if counts["info"] else "ok"
    return {"counts": counts, "worst": worst}
