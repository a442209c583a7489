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

import dataclasses
import errno
import os
import re

from ansible.module_utils.gpunuma.node import autonuma
from ansible.module_utils.gpunuma.common.cpulist import parse_cpulist
from ansible.module_utils.gpunuma.common.errors import CpuListError, GpunumaError
from ansible.module_utils.gpunuma.discovery.sysfs import (
    is_amd_instinct, is_nvidia_gpu, pcie_gen_from_speed, quote, read_bounded)
from ansible.module_utils.gpunuma.discovery.sysfs_reader import BDF_RE
from ansible.module_utils.gpunuma.verify import amd_checks

SEVERITIES = ("info", "warning", "error")
PROFILES = ("strict", "preferred", "interleave", "off")
# The profiles whose memory policy binds (the planner's mem_policy: bind).
BINDING_PROFILES = ("strict",)
CHECKS = ("pcie_link", "acs", "iommu", "cpu_governor", "persistence_mode", "thp", "numa_balancing",
          "unreadable") + amd_checks.CHECKS

NCCL_ACS_URL = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html#pci-access-control-services-acs"
KERNEL_NUMA_BALANCING_URL = "https://docs.kernel.org/admin-guide/sysctl/kernel.html#numa-balancing"

# PCI config space: extended capabilities start at 0x100; ACS is id 0x000d.
_EXT_CAP_START = 0x100
_ACS_CAP_ID = 0x000D
_CONFIG_LIMIT = 4096
# ACS control bits (PCIe base spec 7.7.11.3): P2P Request Redirect and
# P2P Completion Redirect send peer TLPs up to the root complex; Egress
# Control can block or redirect them too.
ACS_RR = 0x0004
ACS_CR = 0x0008
ACS_EC = 0x0020
_ACS_BITS = ((0x0001, "SrcValid"), (0x0002, "TransBlk"), (ACS_RR, "ReqRedir"), (ACS_CR, "CmpltRedir"),
             (0x0010, "UpstreamFwd"), (ACS_EC, "EgressCtrl"), (0x0040, "DirectTrans"))

_WIDTH_RE = re.compile(r"[0-9]{1,2}", re.ASCII)
_INT_RE = re.compile(r"[0-9]{1,3}", re.ASCII)
_GOVERNOR_RE = re.compile(r"[a-z][a-z0-9_-]{0,31}", re.ASCII)
_THP_RE = re.compile(r"(?:\[?[a-z+]{1,24}\]? ?){1,8}", re.ASCII)
_CPU_DIR_RE = re.compile(r"cpu(0|[1-9][0-9]{0,5})", re.ASCII)
_IOMMU_ARG_RE = re.compile(r"(iommu|intel_iommu|amd_iommu|iommu\.passthrough|iommu\.strict|pci)=(\S*)", re.ASCII)
_SMI_GPU_RE = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_SMI_PM_RE = re.compile(r"^\s+Persistence Mode\s+:\s+(\S.*?)\s*$")


class NodeChecksError(GpunumaError):
    """The tree to read is missing, or an input (profile, replay file) is invalid."""


@dataclasses.dataclass
class Evidence:
    file: str
    value: object

    def as_dict(self):
        return {"file": self.file, "value": self.value}


@dataclasses.dataclass
class Finding:
    check: str
    severity: str
    subject: str  # "host", "gpu 0000:18:00.0", "bridge 0000:17:00.0 above gpu ..."
    message: str
    evidence: list
    fix: str
    gpu: object = None  # the GPU bus id the finding is about, or None for the host

    def as_dict(self):
        return {"check": self.check, "severity": self.severity, "subject": self.subject, "gpu": self.gpu,
                "message": self.message, "evidence": [e.as_dict() for e in self.evidence], "fix": self.fix}


@dataclasses.dataclass
class PciLink:
    bdf: str
    path: str  # the device directory, relative to the root ("sys/bus/pci/devices/<bdf>")
    current_gen: object = None
    max_gen: object = None
    current_width: object = None
    max_width: object = None
    raw: dict = dataclasses.field(default_factory=dict)  # attribute -> text read
    acs_ctrl: object = None  # int, or None when config space holds no ACS or was unreadable
    acs_readable: bool = False
    iommu_group: object = None


@dataclasses.dataclass
class Gpu:
    link: PciLink
    bridges: list  # PciLink, the root port first
    local_cpus: object = None  # frozenset or None
    persistence_mode: object = None  # True / False / None (unknown)
    persistence_source: object = None
    nvml_pcie: object = None  # {"gen_current", ...} from NVML, or None


@dataclasses.dataclass
class CpuGovernor:
    cpu: int
    file: str
    governor: object  # str, or None when cpufreq is absent
    available: object = None  # list of governors, or None


@dataclasses.dataclass
class NodeFacts:
    root: str
    gpus: list
    governors: list  # CpuGovernor for the GPU nodes' CPUs
    governor_scope: str  # "gpu_local_cpus" or "all_cpus"
    thp_enabled: object = None
    thp_defrag: object = None
    cmdline: object = None
    numa_balancing: object = None
    kernel_release: object = None  # str (uname -r), or None when unknown
    iommu_groups_present: bool = False
    problems: list = dataclasses.field(default_factory=list)  # Finding (check "unreadable")
    amd: object = None  # amd_checks.read_amd's facts on a node with AMD Instinct GPUs, else None

    def shown(self, rel):
        """A path under the root as the user should see it."""
        return "/" + rel if self.root in ("/", "") else os.path.join(self.root, rel)


# -- parsers: text in, value out; ValueError names what is allowed -------------

def parse_link_speed(text):
    gen = pcie_gen_from_speed(text)
    if gen is None:
        raise ValueError("a PCIe link speed such as '16.0 GT/s PCIe' (2.5, 5, 8, 16, 32 or 64 GT/s) was expected")
    return gen


def parse_link_width(text):
    if not _WIDTH_RE.fullmatch(text) or int(text) not in (1, 2, 4, 8, 12, 16, 32):
        raise ValueError("a PCIe link width of 1, 2, 4, 8, 12, 16 or 32 lanes was expected")
    return int(text)


def parse_governor(text):
    if not _GOVERNOR_RE.fullmatch(text):
        raise ValueError("a cpufreq governor name (lower-case letters, digits, '_' or '-') was expected")
    return text


def parse_thp(text):
    """``always [madvise] never`` -> ``madvise`` (the bracketed, selected choice)."""
    if not _THP_RE.fullmatch(text):
        raise ValueError("a choice list such as 'always [madvise] never' was expected")
    chosen = re.findall(r"\[([a-z+]+)\]", text)
    if len(chosen) != 1:
        raise ValueError("exactly one bracketed choice, as in 'always [madvise] never', was expected")
    return chosen[0]


def parse_numa_balancing(text):
    if not _INT_RE.fullmatch(text) or int(text) > 3:
        raise ValueError("0, 1, 2 or 3 (NUMA_BALANCING_DISABLED/NORMAL/MEMORY_TIERING bits) was expected")
    return int(text)


def parse_cmdline_iommu(text):
    """The IOMMU-related arguments of a kernel command line, in order: ``[(key, value)]``."""
    return [(m.group(1), m.group(2)) for word in text.split() for m in [_IOMMU_ARG_RE.fullmatch(word)] if m]


def acs_control_from_config(data):
    """The ACS control register from PCI config space bytes, or ``None`` when absent.

    Raises ``ValueError`` when the extended capability list is malformed.
    Returns ``None`` for config space shorter than 4 KiB (an unprivileged
    reader sees only the first 64 or 256 bytes).
    """
    if len(data) < _CONFIG_LIMIT:
        return None
    offset, seen = _EXT_CAP_START, set()
    while offset:
        if offset < _EXT_CAP_START or offset > _CONFIG_LIMIT - 8 or offset & 3 or offset in seen:
            raise ValueError("the extended capability list points to offset 0x%x, outside 0x100-0xff8 "
                             "or looping" % offset)
        seen.add(offset)
        header = int.from_bytes(data[offset:offset + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == _ACS_CAP_ID:
            return int.from_bytes(data[offset + 6:offset + 8], "little")
        offset = (header >> 20) & 0xFFC
    return None


def acs_bits(ctrl):
    return [name for bit, name in _ACS_BITS if ctrl & bit]


def parse_nvidia_smi_q(text):
    """Persistence mode per GPU from ``nvidia-smi -q``: ``{bus_id: True/False}``.

    Bus ids are normalised to sysfs form (``0000:18:00.0``). Raises
    ``ValueError`` when no GPU section is found or a value is not
    Enabled/Disabled (N/A is read as unknown and left out).
    """
    result, current = {}, None
    for line in text.splitlines():
        match = _SMI_GPU_RE.match(line)
        if match:
            domain, bus, devfn = match.group(1).lower().split(":")
            current = "%04x:%s:%s" % (int(domain, 16), bus, devfn)
            continue
        match = _SMI_PM_RE.match(line)
        if match and current is not None:
            value = match.group(1)
            if value == "Enabled":
                result[current] = True
            elif value == "Disabled":
                result[current] = False
            elif value != "N/A":
                raise ValueError("GPU %s: 'Persistence Mode' is %s; Enabled, Disabled or N/A was expected"
                                 % (current, quote(value)))
    if current is None:
        raise ValueError("no 'GPU 0000:18:00.0' section found; a full 'nvidia-smi -q' output was expected")
    return result


def validate_profile(profile):
    if profile is None:
        return None
    if not isinstance(profile, str) or profile not in PROFILES:
        raise NodeChecksError("profile is %s; allowed: %s, or null when no profile applies"
                              % (quote(profile), ", ".join(PROFILES)))
    return profile


# -- reading a tree ------------------------------------------------------------

class _Reader:
    def __init__(self, root):
        self.root = root
        self.problems = []

    def path(self, rel):
        return os.path.join(self.root, rel)

    def shown(self, rel):
        return "/" + rel if self.root in ("/", "") else os.path.join(self.root, rel)

    def raw(self, rel, limit=65536):
        """Bytes of a file, ``None`` when absent; unreadable -> problem + ``None``."""
        try:
            return read_bounded(self.path(rel), limit)
        except (IOError, OSError) as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            if exc.errno in (errno.EACCES, errno.EPERM):
                return None
            self._problem(rel, None, "cannot be read: %s" % (exc.strerror or exc))
            return None

    def text(self, rel):
        data = self.raw(rel)
        if data is None:
            return None
        try:
            return data.decode("ascii").strip()
        except UnicodeDecodeError:
            self._problem(rel, quote(data[:80]), "holds bytes that are not ASCII text")
            return None

    def value(self, rel, parser):
        text = self.text(rel)
        if text is None:
            return None, None
        try:
            return parser(text), text
        except ValueError as exc:
            self._problem(rel, text, "holds %s; %s" % (quote(text), exc))
            return None, text

    def _problem(self, rel, value, what):
        self.problems.append(Finding(
            check="unreadable", severity="warning", subject="host",
            message="%s %s" % (self.shown(rel), what),
            evidence=[Evidence(self.shown(rel), value)],
            fix="Check the file on the node (or the copy in the support bundle); the related check was skipped."))


def _chain(reader, bdf):
    """Bus ids from the root port down to ``bdf`` (inclusive)."""
    dev = os.path.join("sys", "bus", "pci", "devices", bdf)
    target = None
    if os.path.islink(reader.path(dev)):
        target = os.readlink(reader.path(dev))
    else:
        target = reader.text(os.path.join(dev, "_realpath"))
    if not target:
        return [bdf]
    chain = [part for part in target.split("/") if BDF_RE.fullmatch(part)]
    return chain if chain and chain[-1] == bdf else [bdf]


def _read_link(reader, bdf):
    rel = os.path.join("sys", "bus", "pci", "devices", bdf)
    link = PciLink(bdf=bdf, path=rel)
    for attr, parser, field in (("current_link_speed", parse_link_speed, "current_gen"),
                                ("max_link_speed", parse_link_speed, "max_gen"),
                                ("current_link_width", parse_link_width, "current_width"),
                                ("max_link_width", parse_link_width, "max_width")):
        value, text = reader.value(os.path.join(rel, attr), parser)
        setattr(link, field, value)
        if text is not None:
            link.raw[attr] = text
    config = reader.raw(os.path.join(rel, "config"), _CONFIG_LIMIT)
    if config is not None and len(config) >= _CONFIG_LIMIT:
        link.acs_readable = True
        try:
            link.acs_ctrl = acs_control_from_config(config)
        except ValueError as exc:
            link.acs_readable = False
            reader._problem(os.path.join(rel, "config"), None, "is not usable PCI config space: %s" % exc)
    group = reader.path(os.path.join(rel, "iommu_group"))
    if os.path.islink(group):
        link.iommu_group = os.path.basename(os.readlink(group))
    return link


def read_node(root="/"):
    """Read what the checks need from ``root``; raise :class:`NodeChecksError` for an unusable root."""
    if not isinstance(root, str) or not root:
        raise NodeChecksError("sysfs_root is %s; a directory holding sys/ and proc/ was expected" % quote(root))
    if not os.path.isdir(root):
        raise NodeChecksError("sysfs_root %s does not exist or is not a directory; a directory holding "
                              "sys/ and proc/ was expected" % root)
    if not os.path.isdir(os.path.join(root, "sys")):
        raise NodeChecksError("sysfs_root %s has no sys/ directory; a directory holding sys/ and proc/ "
                              "(a copy of the node's /sys and /proc) was expected" % root)
    reader = _Reader(root)
    gpus = []
    bus = reader.path(os.path.join("sys", "bus", "pci", "devices"))
    try:
        names = sorted(os.listdir(bus))
    except OSError:
        names = []
    instinct = []
    for bdf in names:
        if not BDF_RE.fullmatch(bdf):
            continue
        rel = os.path.join("sys", "bus", "pci", "devices", bdf)
        vendor = reader.text(os.path.join(rel, "vendor"))
        klass = reader.text(os.path.join(rel, "class")) or ""
        if is_amd_instinct(vendor, klass):
            instinct.append(bdf)
            continue
        if not is_nvidia_gpu(vendor, klass):
            continue
        chain = _chain(reader, bdf)
        local = None
        text = reader.text(os.path.join(rel, "local_cpulist"))
        if text:
            try:
                local = frozenset(parse_cpulist(text))
            except CpuListError as exc:
                reader._problem(os.path.join(rel, "local_cpulist"), text, "holds %s; %s" % (quote(text), exc))
        gpus.append(Gpu(link=_read_link(reader, bdf), bridges=[_read_link(reader, b) for b in chain[:-1]],
                        local_cpus=local))

    cpu_dir = os.path.join("sys", "devices", "system", "cpu")
    try:
        cpus = sorted(int(m.group(1)) for name in os.listdir(reader.path(cpu_dir))
                      for m in [_CPU_DIR_RE.fullmatch(name)] if m)
    except OSError:
        cpus = []
    wanted = set()
    for gpu in gpus:
        wanted |= gpu.local_cpus or set()
    scope = "gpu_local_cpus" if wanted else "all_cpus"
    governors = []
    for cpu in cpus:
        if wanted and cpu not in wanted:
            continue
        rel = os.path.join(cpu_dir, "cpu%d" % cpu, "cpufreq", "scaling_governor")
        governor, _unused = reader.value(rel, parse_governor)
        available = None
        text = reader.text(os.path.join(cpu_dir, "cpu%d" % cpu, "cpufreq", "scaling_available_governors"))
        if text is not None:
            available = text.split()
        governors.append(CpuGovernor(cpu=cpu, file=reader.shown(rel), governor=governor, available=available))

    thp = os.path.join("sys", "kernel", "mm", "transparent_hugepage")
    facts = NodeFacts(root=root, gpus=gpus, governors=governors, governor_scope=scope)
    facts.thp_enabled, _unused = reader.value(os.path.join(thp, "enabled"), parse_thp)
    facts.thp_defrag, _unused = reader.value(os.path.join(thp, "defrag"), parse_thp)
    facts.cmdline = reader.text(os.path.join("proc", "cmdline"))
    facts.numa_balancing, _unused = reader.value(os.path.join("proc", "sys", "kernel", "numa_balancing"),
                                                 parse_numa_balancing)
    facts.kernel_release = reader.text(os.path.join("proc", "sys", "kernel", "osrelease")) or None
    facts.iommu_groups_present = bool(_listdir(reader.path(os.path.join("sys", "kernel", "iommu_groups"))))
    facts.amd = amd_checks.read_amd(reader, instinct)
    facts.problems = reader.problems
    return facts


def _listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


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
