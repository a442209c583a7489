"""The ``gpunuma.nvml-dump/v1`` document (discovery/nvidia/nvml.py): its constants, bus ids, and the check that names
every bad field."""

from __future__ import annotations

import json
import re

from ansible.module_utils.gpunuma.common.errors import NvmlError
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
    schema.optional(data, "driver_version", "driver_version", _printable, "a printable string of at most 96 characters")
    schema.optional(data, "nvml_version", "nvml_version", _printable, "a printable string of at most 96 characters")
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
    owners = {"bus": {}, "uuid": {}}
    for position, gpu in enumerate(gpus or []):
        _check_gpu(schema, gpu, position, word_bits, owners)
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


def _printable(value):
    return isinstance(value, str) and bool(_TEXT_RE.fullmatch(value))


def _check_identity(schema, gpu, where, position, owners):
    """index, uuid and pci_bus_id: present, in order and unique (the bus id normalised in place)."""
    missing = [key for key in ("index", "uuid", "pci_bus_id") if gpu.get(key) is None or is_error(gpu[key])]
    for key in missing:
        schema.errors.append("%s.%s is missing; NVML failed mid-query (allowed: %s)" % (
            where, key, {"index": "the GPU's position in gpus", "uuid": _UUID_ALLOWED,
                         "pci_bus_id": BUS_ID_ALLOWED}[key]))
    if "index" not in missing and not (_is_int(gpu["index"]) and gpu["index"] == position):
        schema.bad(where + ".index", gpu["index"], "%d (GPUs are listed in index order, from 0)" % position)
    if "uuid" not in missing:
        uuid, uuid_owner = gpu["uuid"], owners["uuid"]
        if not (isinstance(uuid, str) and _UUID_RE.fullmatch(uuid)):
            schema.bad(where + ".uuid", uuid, _UUID_ALLOWED)
        elif uuid in uuid_owner:
            schema.bad(where + ".uuid", uuid, "a UUID of its own (gpus[%d] has this UUID as well)" % uuid_owner[uuid])
        else:
            uuid_owner[uuid] = position
    if "pci_bus_id" not in missing:
        bus, bus_owner = _normalized_bus(schema, where + ".pci_bus_id", gpu["pci_bus_id"]), owners["bus"]
        if bus is not None and bus in bus_owner:
            schema.bad(where + ".pci_bus_id", gpu["pci_bus_id"], "a bus id of its own (gpus[%d] is at %s "
                       "as well)" % (bus_owner[bus], bus))
        elif bus is not None:
            bus_owner[bus] = position
            gpu["pci_bus_id"] = bus


def _check_gpu(schema, gpu, position, word_bits, owners):
    """One entry of ``gpus``, every problem added to ``schema``."""
    where = "gpus[%d]" % position
    if not isinstance(gpu, dict):
        schema.bad(where, gpu, "an object with index, uuid, pci_bus_id...")
        return
    _check_identity(schema, gpu, where, position, owners)
    schema.optional(gpu, "name", where + ".name", _printable, "a printable string of at most 96 characters")
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
