"""Run the discovery sources in order of trust and build the topology.

Kept free of Ansible: the module passes a callable that runs
``nvidia-smi topo -m`` so tests (and the benchmark) can drive every path.
"""

from __future__ import annotations

import os

from ansible.module_utils.gpunuma.discovery.amd import sources as amd_source
from ansible.module_utils.gpunuma.discovery.nvidia import nvml as nvml_source
from ansible.module_utils.gpunuma.discovery.sysfs import host as sysfs_source
from ansible.module_utils.gpunuma.common import bounded
from ansible.module_utils.gpunuma.discovery.sysfs import pci as sysfs_pci
from ansible.module_utils.gpunuma.discovery.cpu_layout import MAX_LSCPU_CHARS, parse_lscpu
from ansible.module_utils.gpunuma.common.errors import LscpuError
from ansible.module_utils.gpunuma.common.errors import NvmlError, SysfsError, TopoParseError
from ansible.module_utils.gpunuma.discovery.nvidia.topo_parse import parse_topo_matrix
from ansible.module_utils.gpunuma.discovery.topology import build_topology

ALL_SOURCES = ("nvml", "nvidia_smi", "sysfs", "amd_smi", "rocm_smi")
# The AMD tools, most trusted first: source name, the option naming a saved output, what each is run as, its
# parser (docs/amd.md).
AMD_TOOLS = (("amd_smi", "amd_smi_topology_file", ("amd-smi", "topology", "--json"), amd_source.parse_amd_smi),
             ("rocm_smi", "rocm_smi_topo_file", ("rocm-smi", "--showtopo", "--json"), amd_source.parse_rocm_smi))

# nvidia-smi topo -m for 64 GPUs and 64 NICs is about 130 KiB; 1 MiB leaves
# room for any real node and bounds what a wrong file can cost.
MAX_TOPO_TEXT_BYTES = 1 << 20
# How many lost sysfs paths the completeness warning names (each also has
# its own warning).
_LOST_NAMED = 5


def _read_text(path, option, limit, error, what):
    try:
        raw = bounded.read_bounded(path, limit, follow_symlinks=True, what=what)
    except (IOError, OSError) as exc:
        raise error("%s %s cannot be read: %s" % (option, path, exc.strerror or exc))
    return raw.decode("utf-8", "replace")


def _read_topo_file(path):
    return _read_text(path, "nvidia_smi_topo_file", MAX_TOPO_TEXT_BYTES, TopoParseError, "an nvidia-smi topo -m text")


def _lost_warning(lost):
    named = ", ".join(lost[:_LOST_NAMED])
    more = " and %d more" % (len(lost) - _LOST_NAMED) if len(lost) > _LOST_NAMED else ""
    return ("topology incomplete: %d sysfs path(s) could not be read or held malformed values (%s%s; see the "
            "warnings naming each); devices or values behind them may be missing" % (len(lost), named, more))


def _nvml_absent(message):
    """NVML missing or without a driver: normal on CPU nodes, not worth a warning by itself."""
    return "not installed" in message or "nvmlInit" in message


def _amd_tool_doc(amd_smi_file, rocm_smi_file, sources, offline, run_tool, warnings, used):
    """The parsed amd-smi or rocm-smi document: a file the user gave (errors raise), else the first tool of
    ``sources`` that runs on this node (failures warn). Called only where AMD GPUs are present."""
    files = {"amd_smi": amd_smi_file, "rocm_smi": rocm_smi_file}
    for name, option, _argv, parse in AMD_TOOLS:
        path = files[name]
        if path is not None:
            doc = parse(_read_text(path, option, amd_source.MAX_SMI_CHARS, amd_source.AmdSourceError,
                                   "an amd-smi/rocm-smi output"), source="%s %s" % (option, path))
            used.append(name)
            return doc
    if offline or run_tool is None:
        return None
    for name, _option, argv, parse in AMD_TOOLS:
        if name not in sources:
            continue
        text, problem = run_tool(argv)
        if text is None:
            if problem:
                warnings.append(problem)
            continue
        try:
            doc = parse(text, source=" ".join(argv))
        except amd_source.AmdSourceError as exc:
            warnings.append("%s; ignoring %s" % (exc, argv[0]))
            continue
        used.append(name)
        return doc
    return None


def discover(hostname, sysfs_root=None, topo_file=None, nvml_dump=None, sources=ALL_SOURCES,
             run_nvidia_smi=None, nvml_module=None, keep_nvml_dump=False, lscpu_file=None,
             amd_smi_file=None, rocm_smi_file=None, run_tool=None):
    """Return ``{"topology": ..., "nvml_dump": dump-or-None, "nvml_error": str-or-None}``.

    Explicit offline inputs that are broken (a missing ``sysfs_root``, an
    unreadable or garbage topo file, a bad NVML dump) raise: the user asked
    for them. Live sources that fail (NVML mid-query, nvidia-smi missing) add
    a warning and discovery continues with the next source.

    ``complete`` is true only when nothing was lost: a sysfs file or
    directory that exists but could not be read, or held a malformed value
    (``host["lost"]``), makes it false with a warning naming the paths, as
    does NVML failing while GPUs are visible.
    """
    sources = tuple(sources or ALL_SOURCES)
    warnings = []
    used = []
    offline = sysfs_root is not None or nvml_dump is not None or topo_file is not None
    text_only = topo_file is not None and sysfs_root is None and nvml_dump is None

    dump, nvml_error = _nvml(nvml_dump, nvml_module, "nvml" in sources and (not offline or keep_nvml_dump),
                             warnings, used)
    smi, smi_problem = _nvidia_smi(topo_file, run_nvidia_smi if "nvidia_smi" in sources and not offline
                                   and dump is None else None, warnings, used)

    layout = None
    if lscpu_file is not None:
        if not text_only:
            raise LscpuError("lscpu_file %s: only read with nvidia_smi_topo_file alone (no sysfs_root, no "
                             "nvml_dump); sysfs has the CPU layout itself" % lscpu_file)
        layout = parse_lscpu(_read_text(lscpu_file, "lscpu_file", MAX_LSCPU_CHARS, LscpuError, "an lscpu capture"),
                             source="lscpu_file %s" % lscpu_file)
        used.append("lscpu")

    host = None
    if "sysfs" in sources and not text_only:
        root = sysfs_root if sysfs_root is not None else "/"
        if sysfs_root is not None and not os.path.isdir(sysfs_root):
            raise SysfsError("sysfs_root %s does not exist or is not a directory" % sysfs_root)
        host = sysfs_source.read_host(root)
        used.append("sysfs")

    amd = {}
    if host is not None and any(sysfs_pci.is_amd_instinct(p["vendor"], p["class"])
                                for p in sysfs_pci.gpu_functions(host)):
        amd["kfd"] = amd_source.read_kfd(sysfs_root if sysfs_root is not None else "/")
        if amd["kfd"] is not None:
            used.append("kfd")
    if amd or amd_smi_file is not None or rocm_smi_file is not None:
        amd["smi"] = _amd_tool_doc(amd_smi_file, rocm_smi_file, sources, offline, run_tool, warnings, used)
    topology = build_topology(hostname, host=host, nvml=dump, smi=smi, warnings=warnings, sources=used,
                              cpu_layout_host=layout, amd=amd)
    _mark_incomplete(topology, host, dump, nvml_error, smi_problem, used)
    return {"topology": topology, "nvml_dump": dump if keep_nvml_dump else None, "nvml_error": nvml_error}


def _nvml(nvml_dump, nvml_module, live, warnings, used):
    """``(dump, error)``: the NVML dump given, else NVML asked live when ``live`` (a failure is a warning)."""
    dump = None
    nvml_error = None
    if nvml_dump is not None:
        dump = nvml_source.load_dump(nvml_dump)
    elif live:
        try:
            dump = nvml_source.collect(nvml_module)
        except NvmlError as exc:
            nvml_error = str(exc)
            if not _nvml_absent(nvml_error):
                # NVML is there but broke mid-way: that is worth a loud warning.
                warnings.append("%s; GPU facts taken from nvidia-smi and sysfs instead" % nvml_error)
    if dump is not None:
        used.append("nvml")
    return dump, nvml_error


def _nvidia_smi(topo_file, run_nvidia_smi, warnings, used):
    """``(matrix, problem)``: the topo file given (broken: raises), else ``nvidia-smi topo -m`` run when asked."""
    smi = None
    smi_problem = None
    if topo_file is not None:
        smi = parse_topo_matrix(_read_topo_file(topo_file), source="nvidia_smi_topo_file %s" % topo_file)
    elif run_nvidia_smi is not None:
        text, problem = run_nvidia_smi()
        if text is not None:
            try:
                smi = parse_topo_matrix(text, source="nvidia-smi topo -m")
            except TopoParseError as exc:
                warnings.append("%s; ignoring nvidia-smi" % exc)
        else:
            smi_problem = problem
    if smi is not None:
        used.append("nvidia_smi")
        warnings.extend(smi.get("warnings") or [])
    return smi, smi_problem


def _mark_incomplete(topology, host, dump, nvml_error, smi_problem, used):
    """``complete`` false, with a warning, when NVML failed with GPUs visible or sysfs lost a file."""
    if nvml_error and dump is None and any(g["uuid"] is None for g in topology["gpus"]):
        # GPUs are visible but NVML could not name them: say why, once.
        topology["complete"] = False
        why = [nvml_error] + ([smi_problem] if smi_problem else [])
        topology["warnings"].append("GPU UUIDs and NVLinks unknown (%s); placement from %s"
                                    % ("; ".join(why), " and ".join(used) or "nothing"))
    elif not topology["gpus"] and nvml_error and not _nvml_absent(nvml_error):
        topology["complete"] = False
    if host is not None and host.get("lost"):
        # A GPU whose class or vendor could not be read is not in the
        # topology at all: nothing may be lost from a complete one.
        topology["complete"] = False
        topology["warnings"].append(_lost_warning(host["lost"]))
