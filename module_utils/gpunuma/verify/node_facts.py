"""A node's platform facts for the node checks (verify/node_checks.py): the model, the parsers (text in, value
out; ValueError names what is allowed) and the reading of a tree."""

from __future__ import annotations

import dataclasses
import errno
import os
import re

from ansible.module_utils.gpunuma.common.cpulist import parse_cpulist
from ansible.module_utils.gpunuma.common.errors import CpuListError, GpunumaError
from ansible.module_utils.gpunuma.discovery.sysfs.pci import is_amd_instinct, is_nvidia_gpu, pcie_gen_from_speed
from ansible.module_utils.gpunuma.discovery.sysfs.reader import quote
from ansible.module_utils.gpunuma.common.bounded import read_bounded
from ansible.module_utils.gpunuma.discovery.sysfs.reader import BDF_RE
from ansible.module_utils.gpunuma.verify import amd_checks
from ansible.module_utils.gpunuma.verify.pci_acs import CONFIG_LIMIT, acs_control_from_config


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
    config = reader.raw(os.path.join(rel, "config"), CONFIG_LIMIT)
    if config is not None and len(config) >= CONFIG_LIMIT:
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


def _read_gpus(reader):
    """``(NVIDIA GPUs, AMD Instinct bus ids)`` on the PCI bus, each NVIDIA GPU with its links and local CPUs."""
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
    return gpus, instinct


def _read_governors(reader, gpus):
    """``(governors, scope)``: the cpufreq governor of the GPUs' local CPUs (every CPU when none is known)."""
    cpu_dir = os.path.join("sys", "devices", "system", "cpu")
    try:
        cpus = sorted(int(m.group(1)) for name in os.listdir(reader.path(cpu_dir))
                      for m in [_CPU_DIR_RE.fullmatch(name)] if m)
    except OSError:
        cpus = []
    wanted = set()
    for gpu in gpus:
        wanted |= gpu.local_cpus or set()
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
    return governors, "gpu_local_cpus" if wanted else "all_cpus"


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
    gpus, instinct = _read_gpus(reader)
    governors, scope = _read_governors(reader, gpus)
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
