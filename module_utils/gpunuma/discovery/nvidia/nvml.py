"""NVML adapter: query live NVML (nvidia-ml-py) into a replayable dump.

The dump (``gpunuma.nvml-dump/v1``) is plain JSON, so the same topology code
runs on a GPU node (live) and anywhere else (replay: tests, CI, support
bundles). A field NVML could not answer holds ``{"nvml_error": "<name>"}``
instead of a value: ``NotSupported`` for ``nvmlDeviceGetNumaNodeId`` is
normal on many machines (VMs, older drivers) and is not a failure.

What NVML must answer for a GPU to be usable (its handle, PCI bus id, UUID)
is essential: a failure there raises :class:`NvmlError`, and the caller falls
back to the other sources rather than presenting a half-filled topology.
"""

from __future__ import annotations

import copy

from ansible.module_utils.gpunuma.common import bounded
from ansible.module_utils.gpunuma.common.errors import NvmlError
from ansible.module_utils.gpunuma.common.bounded import read_bounded
# The dump's document (constants, bus ids, the check).
from ansible.module_utils.gpunuma.discovery.nvidia.nvml_dump import (
    CPU_AFFINITY_WORDS, CPU_WORD_BITS, DUMP_SCHEMA, MAX_DUMP_BYTES, TOPOLOGY_LEVEL_CODES, _NVLINK_MAX_LINKS,
    _check_schema, _clip, _text, is_error, normalize_bus_id, validate_dump)


class _Query(object):
    """Wraps pynvml so non-essential calls record errors instead of raising."""

    def __init__(self, nvml):
        self.nvml = nvml

    def error_name(self, exc):
        name = type(exc).__name__
        if name.startswith("NVMLError_"):
            return name[len("NVMLError_"):]
        return "%s: %s" % (name, exc)

    def optional(self, func, *args):
        try:
            return func(*args)
        except Exception as exc:  # pynvml raises a family of NVMLError subclasses
            if isinstance(exc, self.nvml.NVMLError) or isinstance(exc, (AttributeError, TypeError)):
                return {"nvml_error": self.error_name(exc)}
            raise

    def essential(self, what, func, *args):
        try:
            return func(*args)
        except Exception as exc:
            raise NvmlError("NVML failed during %s: %s" % (what, self.error_name(exc)))


def _collect_gpu(nvml, q, index, handle):
    """One GPU's entry of the dump: identity, PCIe, affinity, MIG, memory and active NVLinks."""
    where = "GPU %d" % index
    pci = q.essential("%s nvmlDeviceGetPciInfo" % where, nvml.nvmlDeviceGetPciInfo, handle)
    gpu = {
        "index": index,
        "name": _text(q.optional(nvml.nvmlDeviceGetName, handle)),
        "uuid": _text(q.essential("%s nvmlDeviceGetUUID" % where, nvml.nvmlDeviceGetUUID, handle)),
        "pci_bus_id": normalize_bus_id(pci.busId),
        "numa_node_id": q.optional(getattr(nvml, "nvmlDeviceGetNumaNodeId", None), handle),
        "pcie": {
            "gen_max": q.optional(nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
            "width_max": q.optional(nvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
            "gen_current": q.optional(nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
            "width_current": q.optional(nvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
        },
        "mig_mode": None,
        "memory_total_bytes": None,
        "nvlinks": [],
    }
    words = q.optional(nvml.nvmlDeviceGetCpuAffinity, handle, CPU_AFFINITY_WORDS)
    gpu["cpu_affinity_words"] = words if is_error(words) else [int(w) for w in words]
    mig = q.optional(nvml.nvmlDeviceGetMigMode, handle)
    gpu["mig_mode"] = mig if is_error(mig) else {"current": int(mig[0]), "pending": int(mig[1])}
    mem = q.optional(nvml.nvmlDeviceGetMemoryInfo, handle)
    gpu["memory_total_bytes"] = mem if is_error(mem) else int(mem.total)
    for link in range(_NVLINK_MAX_LINKS):
        state = q.optional(nvml.nvmlDeviceGetNvLinkState, handle, link)
        if is_error(state):
            break  # NotSupported / InvalidArgument: no (more) links
        if state != getattr(nvml, "NVML_FEATURE_ENABLED", 1):
            continue
        remote = q.optional(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        if is_error(remote):
            continue
        gpu["nvlinks"].append({"link": link, "remote_pci_bus_id": normalize_bus_id(remote.busId)})
    return gpu


def _collect_levels(nvml, q, handles):
    """The N x N matrix of nvmlDeviceGetTopologyCommonAncestor levels (0 on the diagonal)."""
    levels = []
    for i, first in enumerate(handles):
        row = []
        for j, second in enumerate(handles):
            if i == j:
                row.append(0)
                continue
            level = q.optional(nvml.nvmlDeviceGetTopologyCommonAncestor, first, second)
            row.append(level if is_error(level) else int(level))
        levels.append(row)
    return levels


def collect(nvml=None):
    """Query NVML live and return a ``gpunuma.nvml-dump/v1`` dict.

    ``nvml`` is the ``pynvml`` module (injectable for tests). Raises
    :class:`NvmlError` when NVML is missing, cannot initialise, fails on an
    essential query mid-way, or answers something :func:`validate_dump`
    refuses.
    """
    if nvml is None:
        try:
            import pynvml as nvml  # nvidia-ml-py
        except ImportError:
            raise NvmlError("NVML unavailable: the Python package nvidia-ml-py (pynvml) is not installed")
    q = _Query(nvml)
    try:
        nvml.nvmlInit()
    except Exception as exc:
        raise NvmlError("NVML unavailable: nvmlInit failed: %s" % q.error_name(exc))
    try:
        dump = {
            "schema": DUMP_SCHEMA,
            "driver_version": _text(q.optional(nvml.nvmlSystemGetDriverVersion)),
            "nvml_version": _text(q.optional(nvml.nvmlSystemGetNVMLVersion)),
            "cuda_driver_version": q.optional(nvml.nvmlSystemGetCudaDriverVersion),
            "cpu_word_bits": CPU_WORD_BITS,
            "gpus": [],
            "topology_levels": [],
        }
        count = q.essential("nvmlDeviceGetCount", nvml.nvmlDeviceGetCount)
        handles = []
        for index in range(count):
            handle = q.essential("GPU %d nvmlDeviceGetHandleByIndex" % index, nvml.nvmlDeviceGetHandleByIndex, index)
            handles.append(handle)
            dump["gpus"].append(_collect_gpu(nvml, q, index, handle))
        dump["topology_levels"] = _collect_levels(nvml, q, handles)
        # What NVML answered goes through the same schema as a replayed
        # dump: an answer no real GPU gives is an NvmlError (discovery then
        # falls back to nvidia-smi and sysfs with a warning), not bad data.
        return validate_dump(dump, source="live NVML")
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def load_dump(path):
    """Read and validate a recorded dump; raise :class:`NvmlError` naming the file.

    The file must be a regular file (a link to one is followed, never into
    ``/dev``) of at most ``MAX_DUMP_BYTES``.
    """
    try:
        raw = read_bounded(path, MAX_DUMP_BYTES, follow_symlinks=True, what="an NVML dump")
    except (IOError, OSError) as exc:
        raise NvmlError("nvml_dump %s cannot be read: %s" % (path, exc.strerror or exc))
    try:
        data = bounded.loads_json(raw)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, too many digits
        raise NvmlError("nvml_dump %s is not valid JSON: %s" % (path, _clip(str(exc))))
    except RecursionError:
        raise NvmlError("nvml_dump %s is not a usable JSON document: its arrays or objects nest too deeply "
                        "(a gpunuma.nvml-dump/v1 nests 4 levels)" % path)
    return validate_dump(data, source="nvml_dump %s" % path)


def gpu_link_matrix(dump):
    """GPU x GPU link codes from a dump (NV# from NVLinks, else the PCIe level).

    NVLinks whose far end is not a GPU lead to an NVSwitch: two GPUs that both
    reach switches talk over ``min(links_i, links_j)`` of them, which is what
    ``nvidia-smi topo -m`` prints (``NV18`` on an 8-GPU HGX H100/H200).
    Returns ``None`` when the dump has no topology levels.
    """
    gpus = dump["gpus"]
    levels = dump.get("topology_levels") or []
    if len(gpus) > 1 and not levels:
        return None
    by_bus = dict((gpu["pci_bus_id"], gpu["index"]) for gpu in gpus)
    direct = {}
    switch_links = {}
    for gpu in gpus:
        for link in gpu.get("nvlinks") or []:
            peer = by_bus.get(link["remote_pci_bus_id"])
            if peer is None:
                switch_links[gpu["index"]] = switch_links.get(gpu["index"], 0) + 1
            elif peer != gpu["index"]:
                key = (gpu["index"], peer)
                direct[key] = direct.get(key, 0) + 1
    matrix = []
    for i in range(len(gpus)):
        row = []
        for j in range(len(gpus)):
            if i == j:
                row.append("X")
                continue
            nv = direct.get((i, j), 0)
            if switch_links.get(i) and switch_links.get(j):
                nv += min(switch_links[i], switch_links[j])
            if nv:
                row.append("NV%d" % nv)
                continue
            level = levels[i][j]
            row.append(None if is_error(level) else TOPOLOGY_LEVEL_CODES.get(level))
        matrix.append(row)
    return matrix


# What a remapped dump holds instead of recorded placement: NVML answered on
# another machine, so its CPU affinity and NUMA id say nothing about this one.
NOT_MAPPED = {"nvml_error": "NotMapped"}


def remap_dump(dump, bus_map, drop_cpu_affinity=True, drop_numa_node=True):
    """Return a copy of ``dump`` whose GPUs sit at other PCI bus ids.

    Replays a dump recorded on one machine against another machine's PCI
    layout (a test VM with stand-in devices): GPU identity (index, UUID,
    name, links) stays the recorded one, while the topology looks each GPU
    up in the local sysfs by its new bus id for placement.

    ``bus_map`` maps recorded bus ids to new ones (either spelling,
    ``00000000:18:00.0`` or ``0000:18:00.0``). Every GPU of the dump must be
    mapped, and no two to the same id. NVLink remote ids are rewritten too
    when they are mapped (the peer GPUs always are); the others are NVSwitch
    ports and are kept, unless one would collide with a new GPU bus id.

    ``drop_cpu_affinity`` replaces ``cpu_affinity_words`` and
    ``drop_numa_node`` replaces ``numa_node_id`` with
    ``{"nvml_error": "NotMapped"}``: both describe the recording machine's
    CPUs and NUMA nodes, and NVML's answers would otherwise outrank the new
    machine's sysfs. The returned dump records what was remapped under
    ``remapped``. The input is not modified. Raises :class:`NvmlError`.
    """
    _check_schema(dump, "remap_dump: dump")
    for position, gpu in enumerate(dump.get("gpus") if isinstance(dump.get("gpus"), list) else []):
        links = gpu.get("nvlinks") if isinstance(gpu, dict) else None
        for k, link in enumerate(links if isinstance(links, list) else []):
            if not isinstance(link, dict) or not link.get("remote_pci_bus_id"):
                raise NvmlError("remap_dump: dump gpus[%d].nvlinks[%d] has no remote_pci_bus_id" % (position, k))
    out = validate_dump(copy.deepcopy(dump), source="remap_dump: dump")
    mapping = _bus_mapping(bus_map)
    gpu_ids = [gpu["pci_bus_id"] for gpu in out["gpus"]]
    remote_ids = set()
    for gpu in out["gpus"]:
        for position, link in enumerate(gpu.get("nvlinks") or []):
            if not isinstance(link, dict) or not link.get("remote_pci_bus_id"):
                raise NvmlError("remap_dump: dump gpus[%d].nvlinks[%d] has no remote_pci_bus_id"
                                % (gpu["index"], position))
            link["remote_pci_bus_id"] = normalize_bus_id(link["remote_pci_bus_id"])
            remote_ids.add(link["remote_pci_bus_id"])
    new_gpu_ids = _check_mapping(mapping, gpu_ids, remote_ids)

    for gpu in out["gpus"]:
        gpu["pci_bus_id"] = mapping[gpu["pci_bus_id"]]
        for link in gpu.get("nvlinks") or []:
            remote = link["remote_pci_bus_id"]
            if remote in mapping:
                link["remote_pci_bus_id"] = mapping[remote]
            elif remote in new_gpu_ids:
                raise NvmlError("remap_dump: GPU %d NVLink %s leads to %s, which is not remapped but is the new bus id "
                                "of a GPU; map %s as well" % (gpu["index"], link.get("link"), remote, remote))
        if drop_cpu_affinity:
            gpu["cpu_affinity_words"] = dict(NOT_MAPPED)
        if drop_numa_node:
            gpu["numa_node_id"] = dict(NOT_MAPPED)
    dropped = [name for name, flag in (("cpu_affinity_words", drop_cpu_affinity), ("numa_node_id", drop_numa_node))
               if flag]
    out["remapped"] = {"bus_ids": dict((old, mapping[old]) for old in sorted(mapping)), "dropped": dropped}
    return out


def _bus_mapping(bus_map):
    """``{recorded bus id: new bus id}``, both normalised; a bad key or value, or one mapped twice, raises."""
    if not isinstance(bus_map, dict):
        raise NvmlError("remap_dump: bus_map must be a mapping of recorded PCI bus id to new PCI bus id, got %s"
                        % type(bus_map).__name__)
    mapping = {}
    for old, new in bus_map.items():
        try:
            old_id = normalize_bus_id(old)
        except NvmlError as exc:
            raise NvmlError("remap_dump: bus_map key: %s" % exc)
        if not isinstance(new, (str, bytes)):
            raise NvmlError("remap_dump: bus_map[%r] must be a PCI bus id string, got %r" % (old, new))
        try:
            new_id = normalize_bus_id(new)
        except NvmlError as exc:
            raise NvmlError("remap_dump: bus_map[%r]: %s" % (old, exc))
        if old_id in mapping and mapping[old_id] != new_id:
            raise NvmlError("remap_dump: bus_map maps %s twice (to %s and %s)" % (old_id, mapping[old_id], new_id))
        mapping[old_id] = new_id
    return mapping


def _check_mapping(mapping, gpu_ids, remote_ids):
    """The GPUs' new bus ids: every GPU mapped, each to its own id, and nothing mapped the dump does not hold."""
    unknown = sorted(set(mapping) - set(gpu_ids) - remote_ids)
    if unknown:
        raise NvmlError("remap_dump: bus_map names %s, which the dump does not hold; allowed: its GPUs' bus ids %s"
                        "%s" % (", ".join(unknown), ", ".join(gpu_ids) or "(none)",
                                " and NVLink remote ids %s" % ", ".join(sorted(remote_ids)) if remote_ids else ""))
    missing = [bus for bus in gpu_ids if bus not in mapping]
    if missing:
        raise NvmlError("remap_dump: bus_map does not map GPU bus id(s) %s; every GPU of the dump needs a new bus id"
                        % ", ".join(missing))
    new_gpu_ids = [mapping[bus] for bus in gpu_ids]
    doubled = sorted(set(bus for bus in new_gpu_ids if new_gpu_ids.count(bus) > 1))
    if doubled:
        raise NvmlError("remap_dump: bus_map maps several GPUs to %s; each GPU needs its own bus id" % ", ".join(doubled))
    return new_gpu_ids
