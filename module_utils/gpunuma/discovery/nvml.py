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
import json
import re

from ansible.module_utils.gpunuma.common import bounded
from ansible.module_utils.gpunuma.common.errors import NvmlError
from ansible.module_utils.gpunuma.discovery.sysfs import read_bounded
from ansible.module_utils.gpunuma.common import schemas

DUMP_SCHEMA = schemas.NVML_DUMP
CPU_WORD_BITS = 64
# Enough 64-bit words for 4096 CPUs; NVML fills what exists.
CPU_AFFINITY_WORDS = 64
# A dump of 64 GPUs with 64 affinity words and 18 NVLinks each is about
# 400 KiB as written by record_nvml_dump; 16 MiB bounds what a wrong file costs.
MAX_DUMP_BYTES = 16 << 20

# nvmlGpuTopologyLevel_t -> nvidia-smi topo -m code (INTERNAL: two GPUs on one
# board, e.g. a K80, which nvidia-smi shows as PIX)
TOPOLOGY_LEVEL_CODES = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_NVLINK_MAX_LINKS = 18


# DOMAIN:BUS:DEVICE.FUNCTION in hex: a 4-digit domain (sysfs) or NVML's
# 8-digit one, 2-digit bus, device 00-1f, function 0-7 (PCI allows 32
# devices of 8 functions per bus).
_BUS_ID_RE = re.compile(r"([0-9a-f]{4,8}):([0-9a-f]{2}):([01][0-9a-f])\.([0-7])", re.ASCII)
BUS_ID_ALLOWED = ("DOMAIN:BUS:DEVICE.FUNCTION in hex with the full domain, e.g. 0000:18:00.0 "
                  "(NVML's 00000000:18:00.0 is accepted)")


def normalize_bus_id(bus_id):
    """NVML writes ``00000000:18:00.0``; sysfs ``0000:18:00.0``. Return the latter, lower-case.

    The whole text must be a bus id (no white space, no short forms).
    Raises :class:`NvmlError` saying what was found and what is allowed.
    """
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode("ascii", "replace")
    match = _BUS_ID_RE.fullmatch(bus_id.lower()) if isinstance(bus_id, str) else None
    if not match:
        raise NvmlError("PCI bus id %s is not of the form %s" % (_shown(bus_id), BUS_ID_ALLOWED))
    return "%04x:%s:%s.%s" % (int(match.group(1), 16), match.group(2), match.group(3), match.group(4))


def is_error(value):
    return isinstance(value, dict) and "nvml_error" in value


def _text(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


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
            where = "GPU %d" % index
            handle = q.essential("%s nvmlDeviceGetHandleByIndex" % where, nvml.nvmlDeviceGetHandleByIndex, index)
            handles.append(handle)
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
            dump["gpus"].append(gpu)
        for i, first in enumerate(handles):
            row = []
            for j, second in enumerate(handles):
                if i == j:
                    row.append(0)
                    continue
                level = q.optional(nvml.nvmlDeviceGetTopologyCommonAncestor, first, second)
                row.append(level if is_error(level) else int(level))
            dump["topology_levels"].append(row)
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


# -- schema of gpunuma.nvml-dump/v1 -------------------------------------------

# nvmlGpuTopologyLevel_t values (nvml.h); nothing else is a level.
_LEVELS_ALLOWED = "one of %s (nvmlGpuTopologyLevel_t) or {\"nvml_error\": \"<name>\"}" % ", ".join(
    str(level) for level in sorted(TOPOLOGY_LEVEL_CODES))
# The bits of one nvmlDeviceGetCpuAffinity word: a C unsigned long.
_WORD_BITS_ALLOWED = (32, 64)
# Affinity words bound the CPU ids they can name: 1024 words of 64 bits is
# 65,536 CPUs, eight times the kernel's largest NR_CPUS (8192).
_MAX_AFFINITY_WORDS = 1024
# Linux MAX_NUMNODES is 1 << NODES_SHIFT, NODES_SHIFT at most 10.
_MAX_NODE_ID = 1023
_MAX_NVLINKS = _NVLINK_MAX_LINKS  # NVML_NVLINK_MAX_LINKS
# NVIDIA GPU UUIDs are "GPU-" and a dash-separated hex UUID; CUDA_VISIBLE_DEVICES
# reads a GPU-prefixed word as a UUID (anything else as an index or a MIG
# name), and units carry it into their environment: letters, digits and
# dashes only, no white space, comma or quote.
_UUID_RE = re.compile(r"GPU-[0-9A-Za-z][0-9A-Za-z-]{0,95}", re.ASCII)
_UUID_ALLOWED = "\"GPU-\" followed by 1-96 letters, digits or dashes (NVML's GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"
# Free text NVML returns (names, versions): printable, NVML's buffer sizes.
_TEXT_RE = re.compile(r"[ -~\u00a0-\uffff]{0,96}")
_MAX_ERRORS_LISTED = 20


def _clip(message, limit=300):
    if len(message) > limit:
        return "%s... (%d characters)" % (message[:limit], len(message))
    return message


def _shown(value):
    """A value found in a dump, as a message quotes it: JSON names, cut short."""
    if value is True or value is False:
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (str, bytes)):
        return _clip(repr(value), 80)
    if isinstance(value, (int, float)):
        return _clip(repr(value), 40)
    if isinstance(value, (list, tuple)):
        return "a list (%s)" % _clip(json.dumps(value, default=repr), 60)
    if isinstance(value, dict):
        return "an object (%s)" % _clip(json.dumps(value, default=repr), 60)
    return "a %s" % type(value).__name__


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


class _Schema(object):
    """Collects every problem of a dump, each naming its field path."""

    def __init__(self):
        self.errors = []

    def bad(self, path, value, allowed):
        self.errors.append("%s is %s; allowed: %s" % (path, _shown(value), allowed))

    def error_marker(self, path, value):
        """True when value is a well-formed {"nvml_error": name}; a malformed marker is an error."""
        if not (isinstance(value, dict) and "nvml_error" in value):
            return False
        name = value.get("nvml_error")
        if len(value) != 1 or not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_ :.,()'-]{1,200}", name):
            self.bad(path, value, '{"nvml_error": "<name of the NVML error>"} and no other key')
        return True

    def optional(self, mapping, key, path, check, allowed):
        """A field NVML may not answer: absent, null or an error marker are fine."""
        if key not in mapping or mapping[key] is None:
            return
        value = mapping[key]
        if self.error_marker(path, value):
            return
        if not check(value):
            self.bad(path, value, allowed + ", null or {\"nvml_error\": \"<name>\"}")

    def int_range(self, low, high):
        return lambda value: _is_int(value) and low <= value <= high


def _check_schema(data, source):
    if not isinstance(data, dict):
        raise NvmlError("%s: schema must be %r, found %s instead of a JSON object"
                        % (source, DUMP_SCHEMA, _shown(data)))
    if data.get("schema") != DUMP_SCHEMA:
        raise NvmlError("%s: schema must be %r, found %s" % (source, DUMP_SCHEMA, _shown(data.get("schema"))))


def validate_dump(data, source="NVML dump"):
    """Check a ``gpunuma.nvml-dump/v1`` field by field before it is replayed.

    Every problem is collected, then one :class:`NvmlError` lists them, each
    naming its field path (``gpus[3].pci_bus_id``), what was found and what
    is allowed. Checked: the schema name; ``gpus`` a list of objects listed
    by ``index``; ``uuid`` (``GPU-`` form, no control characters) and
    ``pci_bus_id`` (full domain form, hex) present and unique across GPUs;
    ``numa_node_id`` an integer from -1 to 1023; ``cpu_word_bits`` 32 or
    64; ``cpu_affinity_words`` a list of integers that fit in it; ``pcie``,
    ``mig_mode`` objects of small integers; ``nvlinks`` a list of
    ``{link: 0-17, remote_pci_bus_id}``; ``topology_levels`` an N x N matrix
    of NVML topology levels. Fields NVML may not answer may be null or
    ``{"nvml_error": "<name>"}``; keys not listed are ignored. Bus ids are
    normalised in place (``0000:18:00.0``). Returns ``data``.
    """
    _check_schema(data, source)
    schema = _Schema()

    def text(value):
        return isinstance(value, str) and bool(_TEXT_RE.fullmatch(value))

    schema.optional(data, "driver_version", "driver_version", text, "a printable string of at most 96 characters")
    schema.optional(data, "nvml_version", "nvml_version", text, "a printable string of at most 96 characters")
    schema.optional(data, "cuda_driver_version", "cuda_driver_version", schema.int_range(0, 10 ** 9),
                    "a non-negative integer")
    word_bits = data.get("cpu_word_bits", CPU_WORD_BITS)
    if not (_is_int(word_bits) and word_bits in _WORD_BITS_ALLOWED):
        schema.bad("cpu_word_bits", word_bits, "32 or 64 (the bits of one nvmlDeviceGetCpuAffinity word, "
                                               "a C unsigned long)")
        word_bits = None

    gpus = data.get("gpus")
    if not isinstance(gpus, list):
        schema.bad("gpus", gpus, "a list of GPU objects ordered by index ([] for none)")
        gpus = None
    bus_owner = {}
    uuid_owner = {}
    for position, gpu in enumerate(gpus or []):
        where = "gpus[%d]" % position
        if not isinstance(gpu, dict):
            schema.bad(where, gpu, "an object with index, uuid, pci_bus_id...")
            continue
        missing = [key for key in ("index", "uuid", "pci_bus_id") if gpu.get(key) is None or is_error(gpu[key])]
        for key in missing:
            schema.errors.append("%s.%s is missing; NVML failed mid-query (allowed: %s)" % (
                where, key, {"index": "the GPU's position in gpus", "uuid": _UUID_ALLOWED,
                             "pci_bus_id": BUS_ID_ALLOWED}[key]))
        if "index" not in missing and not (_is_int(gpu["index"]) and gpu["index"] == position):
            schema.bad(where + ".index", gpu["index"], "%d (GPUs are listed in index order, from 0)" % position)
        if "uuid" not in missing:
            uuid = gpu["uuid"]
            if not (isinstance(uuid, str) and _UUID_RE.fullmatch(uuid)):
                schema.bad(where + ".uuid", uuid, _UUID_ALLOWED)
            elif uuid in uuid_owner:
                schema.bad(where + ".uuid", uuid, "a UUID of its own (gpus[%d] has this UUID as well)"
                           % uuid_owner[uuid])
            else:
                uuid_owner[uuid] = position
        if "pci_bus_id" not in missing:
            bus = _normalized_bus(schema, where + ".pci_bus_id", gpu["pci_bus_id"])
            if bus is not None and bus in bus_owner:
                schema.bad(where + ".pci_bus_id", gpu["pci_bus_id"], "a bus id of its own (gpus[%d] is at %s "
                           "as well)" % (bus_owner[bus], bus))
            elif bus is not None:
                bus_owner[bus] = position
                gpu["pci_bus_id"] = bus
        schema.optional(gpu, "name", where + ".name", text, "a printable string of at most 96 characters")
        schema.optional(gpu, "numa_node_id", where + ".numa_node_id", schema.int_range(-1, _MAX_NODE_ID),
                        "an integer from -1 (none) to %d (Linux MAX_NUMNODES is at most 1024)" % _MAX_NODE_ID)
        _check_affinity(schema, gpu, where, word_bits)
        _check_pcie(schema, gpu, where)
        schema.optional(gpu, "mig_mode", where + ".mig_mode",
                        lambda v: isinstance(v, dict) and all(v.get(k) in (0, 1) and _is_int(v.get(k))
                                                              for k in ("current", "pending")),
                        '{"current": 0 or 1, "pending": 0 or 1}')
        schema.optional(gpu, "memory_total_bytes", where + ".memory_total_bytes", schema.int_range(0, 2 ** 64 - 1),
                        "a non-negative integer of bytes")
        _check_nvlinks(schema, gpu, where)
    if gpus is not None:
        _check_levels(schema, data, len(gpus))
    if schema.errors:
        listed = schema.errors[:_MAX_ERRORS_LISTED]
        more = len(schema.errors) - len(listed)
        if len(schema.errors) == 1:
            raise NvmlError("%s: %s" % (source, listed[0]))
        raise NvmlError("%s: %d problems: %s%s" % (source, len(schema.errors), "; ".join(listed),
                                                   "; and %d more" % more if more else ""))
    return data


def _normalized_bus(schema, path, value):
    try:
        return normalize_bus_id(value)
    except NvmlError:
        schema.bad(path, value, BUS_ID_ALLOWED)
        return None


def _check_affinity(schema, gpu, where, word_bits):
    path = where + ".cpu_affinity_words"
    words = gpu.get("cpu_affinity_words")
    if words is None or schema.error_marker(path, words):
        return
    bits = word_bits or CPU_WORD_BITS
    if not isinstance(words, list) or len(words) > _MAX_AFFINITY_WORDS:
        schema.bad(path, words, "a list of at most %d integers (one per %d CPUs, least significant first), "
                                "null or {\"nvml_error\": \"<name>\"}" % (_MAX_AFFINITY_WORDS, bits))
        return
    for k, word in enumerate(words):
        if not (_is_int(word) and 0 <= word < (1 << bits)):
            schema.bad("%s[%d]" % (path, k), word, "an integer from 0 to 2**%d - 1 (cpu_word_bits)" % bits)
            return  # one per list is enough


def _check_pcie(schema, gpu, where):
    path = where + ".pcie"
    pcie = gpu.get("pcie")
    if pcie is None or schema.error_marker(path, pcie):
        return
    if not isinstance(pcie, dict):
        schema.bad(path, pcie, "an object {gen_max, width_max, gen_current, width_current}")
        return
    for key, high, what in (("gen_max", 16, "PCIe generation"), ("gen_current", 16, "PCIe generation"),
                            ("width_max", 64, "lane count"), ("width_current", 64, "lane count")):
        schema.optional(pcie, key, "%s.%s" % (path, key), schema.int_range(0, high),
                        "an integer from 0 to %d (%s)" % (high, what))


def _check_nvlinks(schema, gpu, where):
    path = where + ".nvlinks"
    links = gpu.get("nvlinks")
    if links is None:
        return
    if not isinstance(links, list) or len(links) > _MAX_NVLINKS:
        schema.bad(path, links, "a list of at most %d {\"link\": n, \"remote_pci_bus_id\": id} objects"
                   % _MAX_NVLINKS)
        return
    seen = set()
    for k, link in enumerate(links):
        at = "%s[%d]" % (path, k)
        if not isinstance(link, dict):
            schema.bad(at, link, '{"link": 0-%d, "remote_pci_bus_id": "<bus id>"}' % (_MAX_NVLINKS - 1))
            continue
        number = link.get("link")
        if number is not None and not (_is_int(number) and 0 <= number < _MAX_NVLINKS):
            schema.bad(at + ".link", number, "an integer from 0 to %d (NVML_NVLINK_MAX_LINKS is %d)"
                       % (_MAX_NVLINKS - 1, _MAX_NVLINKS))
        elif number is not None and number in seen:
            schema.bad(at + ".link", number, "a link number listed once per GPU")
        else:
            seen.add(number)
        if link.get("remote_pci_bus_id") is None:
            schema.errors.append("%s.remote_pci_bus_id is missing (allowed: %s)" % (at, BUS_ID_ALLOWED))
            continue
        remote = _normalized_bus(schema, at + ".remote_pci_bus_id", link["remote_pci_bus_id"])
        if remote is not None:
            link["remote_pci_bus_id"] = remote


def _check_levels(schema, data, count):
    levels = data.get("topology_levels")
    if levels is None or levels == []:
        return
    shape = "an empty list or a %dx%d list of lists (one row per GPU)" % (count, count)
    if not isinstance(levels, list) or len(levels) != count or not all(
            isinstance(row, list) and len(row) == count for row in levels):
        schema.bad("topology_levels", levels, shape)
        return
    for i, row in enumerate(levels):
        for j, level in enumerate(row):
            at = "topology_levels[%d][%d]" % (i, j)
            if schema.error_marker(at, level):
                continue
            if not (_is_int(level) and level in TOPOLOGY_LEVEL_CODES):
                schema.bad(at, level, _LEVELS_ALLOWED)
                return


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

    gpu_ids = [gpu["pci_bus_id"] for gpu in out["gpus"]]
    remote_ids = set()
    for gpu in out["gpus"]:
        for position, link in enumerate(gpu.get("nvlinks") or []):
            if not isinstance(link, dict) or not link.get("remote_pci_bus_id"):
                raise NvmlError("remap_dump: dump gpus[%d].nvlinks[%d] has no remote_pci_bus_id"
                                % (gpu["index"], position))
            link["remote_pci_bus_id"] = normalize_bus_id(link["remote_pci_bus_id"])
            remote_ids.add(link["remote_pci_bus_id"])
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
