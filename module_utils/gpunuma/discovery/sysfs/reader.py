# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The low-level reading of sysfs and procfs discovery rests on (discovery/sysfs/host.py's reader, whose
docstring states the rules: bounded reads, errors for the files that define the topology, warnings and
``lost`` for the rest)."""

from __future__ import annotations

import errno
import os
import re
import stat

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, parse_cpulist, parse_cpumask
from ansible.module_utils.gpunuma.common import bounded
from ansible.module_utils.gpunuma.common.bounded import file_kind as _file_kind
from ansible.module_utils.gpunuma.common.bounded import read_bounded
from ansible.module_utils.gpunuma.common.errors import CpuListError, SysfsError

# Every pattern is matched in full (fullmatch: "$" would accept a final
# newline) and with ASCII digits only: int() also takes "\u0661", and
# isdigit() is true for "\u00b2", which int() refuses.
_NODE_DIR_RE = re.compile(r"node([0-9]+)", re.ASCII)
_CPU_DIR_RE = re.compile(r"cpu([0-9]+)", re.ASCII)
# Node and CPU directory ids as the kernel writes them: no leading zeros,
# below MAX_NUMNODES (1 << NODES_SHIFT, NODES_SHIFT at most 10) and NR_CPUS
# (at most 8192), the limits the CPU list parser applies too.
_DIR_ID_RE = re.compile(r"0|[1-9][0-9]{0,3}", re.ASCII)
_MAX_DIR_ID = {"node": 1023, "cpu": 8191}
# Domains are 4 hex digits on most hosts; Intel VMD exposes 5-digit ones.
BDF_RE = re.compile(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", re.ASCII)
_HEX_RE = re.compile(r"0x[0-9a-f]{1,8}", re.ASCII)
# 18 digits fit any 64-bit value and stay clear of Python's int() digit limit.
_INT_RE = re.compile(r"-?[0-9]{1,18}", re.ASCII)
_HUGEPAGES_DIR_RE = re.compile(r"hugepages-([0-9]{1,10})kB", re.ASCII)
_MEMINFO_NODE_RE = re.compile(r"Node\s+([0-9]{1,7})\s+(\S+):\s+([0-9]{1,18})(?:\s+kB)?\s*", re.ASCII)
_MEMINFO_RE = re.compile(r"(\S+):\s+([0-9]{1,18})(?:\s+kB)?\s*", re.ASCII)
_DISTANCE_RE = re.compile(r"[0-9]{1,9}", re.ASCII)
# A netdev, RDMA or NVMe name as the kernel allows them (dev_valid_name():
# no "/", ":" or white space; IB_DEVICE_NAME_MAX is 64), printable.
_DEVICE_NAME_RE = re.compile(r"[^\s/:\x00-\x1f\x7f]{1,64}")

_MISSING_ERRNOS = (errno.ENOENT, errno.ENOTDIR)


_MISSING = object()

# Read bounds. A sysfs attribute holds at most one page (PAGE_SIZE: 4 KiB on
# x86_64, up to 64 KiB on arm64 kernels built with 64K pages, as on many
# Grace hosts), and the CPU list and mask files that became binary attributes
# in Linux 5.14 stay below CPULIST_FILE_MAX_BYTES = NR_CPUS * 7 / 2 (28 KiB
# for NR_CPUS = 8192). proc/meminfo is about 1.5 KiB. One cap covers them all.
MAX_ATTRIBUTE_BYTES = bounded.MAX_ATTRIBUTE_BYTES
# How much of an unexpected value a warning or error quotes.
_QUOTE_CHARS = 60


def quote(value, limit=_QUOTE_CHARS):
    """``repr`` of a value read from a file, cut to ``limit`` characters with its full length."""
    if isinstance(value, (str, bytes)) and len(value) > limit:
        return "%r... (%d characters)" % (value[:limit], len(value))
    return repr(value)


def _lkind(path):
    """What sits at ``path`` (not following a final link), for messages."""
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        return "unreadable (%s)" % (exc.strerror or exc)
    if stat.S_ISLNK(mode):
        try:
            return "a symbolic link to %s" % os.readlink(path)
        except OSError:
            return "a symbolic link"
    return "a regular file" if stat.S_ISREG(mode) else _file_kind(mode)


def _clip(message, limit=600):
    """Messages quote what they read; keep one from growing with the input."""
    if len(message) > limit:
        return "%s... (%d characters in all)" % (message[:limit], len(message))
    return message


class Reader:
    def __init__(self, root):
        self.root = root
        self.warnings = []
        # Paths whose value was lost: present but unreadable, malformed or
        # refused (see read_bounded), or a directory that could not be listed.
        self.lost = []
        self.node_ids = None
        # Many files repeat the same CPU list text (sibling pairs, a node's
        # local_cpulist on each of its devices): parse each spelling once.
        self._cpu_cache = {}
        self._cpu_ids = None
        self._devices_dir = None

    # -- low-level reading -------------------------------------------------

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    @staticmethod
    def _read_raw(path):
        # os.open/os.read rather than file objects: on large hosts this runs
        # a thousand times. read_bounded refuses anything but a small regular file.
        return read_bounded(path).decode("utf-8", "replace")

    def warn_lost(self, path, message):
        """A warning for a value that existed but could not be used: the result is incomplete."""
        self.warnings.append(message)
        self.lost.append(path)

    def read_text(self, path, required=False, warn_missing=False):
        """File text, or ``_MISSING`` when absent, or ``None`` after a warning.

        ``required`` turns unreadable files (not absent ones) into SysfsError.
        """
        try:
            return self._read_raw(path)
        except OSError as exc:
            if exc.errno in _MISSING_ERRNOS:
                if warn_missing:
                    self.warn_lost(path, "%s is missing" % path)
                return _MISSING
            message = "cannot read %s: %s" % (path, exc.strerror or exc)
            if required:
                raise SysfsError(message)
            self.warn_lost(path, message + "; value treated as unknown")
            return None

    def listdir(self, path, what):
        """Sorted entries of a directory; [] when absent; [] and a warning when unreadable."""
        try:
            return sorted(os.listdir(path))
        except OSError as exc:
            if exc.errno in _MISSING_ERRNOS and not os.path.lexists(path):
                return []
            if exc.errno in _MISSING_ERRNOS:
                why = "it is %s, not a directory" % _lkind(path)
            else:
                why = exc.strerror or str(exc)
            self.warn_lost(path, "cannot list %s (%s): %s" % (path, what, why))
            return []

    def device_names(self, path, what):
        """Entries of a net/, infiniband/ or nvme/ directory that are valid kernel device names."""
        names = []
        for name in self.listdir(path, what):
            if _DEVICE_NAME_RE.fullmatch(name):
                names.append(name)
            else:
                self.warn_lost(path, "%s: entry %s is not a device name (1-64 printable characters without "
                                     "white space, '/' or ':'); skipped" % (path, quote(name)))
        return names

    def optional_int(self, path, allow_negative=True, warn_missing=False):
        text = self.read_text(path, warn_missing=warn_missing)
        if text is _MISSING or text is None:
            return None
        value = text.strip()
        if not _INT_RE.fullmatch(value) or (not allow_negative and value.startswith("-")):
            self.warn_lost(
                path,
                "%s holds %s, not %s; value treated as unknown"
                % (path, quote(value), "an integer" if allow_negative else "a non-negative integer"),
            )
            return None
        return int(value)

    def required_int(self, path):
        """Integer from a topology-defining file: None when absent, SysfsError when bad."""
        text = self.read_text(path, required=True)
        if text is _MISSING:
            return None
        value = text.strip()
        if not _INT_RE.fullmatch(value):
            raise SysfsError("%s holds %s; expected an integer" % (path, quote(value)))
        return int(value)

    def parse_cpus(self, text, path, mask=False):
        """(frozenset, canonical list) for a CPU list or mask text; CpuListError when bad."""
        key = (text, mask)
        hit = self._cpu_cache.get(key)
        if hit is None:
            try:
                cpus = parse_cpumask(text, path) if mask else parse_cpulist(text, path)
            except CpuListError as exc:
                raise CpuListError(_clip(str(exc)))
            except (ValueError, OverflowError, MemoryError) as exc:
                # int() refuses more than 4300 decimal digits with a plain ValueError.
                raise CpuListError("%s %s is not a %s: %s" % (
                    path, quote(text.strip()), "CPU mask" if mask else "CPU list", _clip(str(exc))))
            hit = (cpus, format_cpulist(cpus))
            self._cpu_cache[key] = hit
        return hit

    def required_cpus(self, path, mask=False):
        """(set, canonical) from a topology-defining list or mask: None when absent, SysfsError when bad."""
        text = self.read_text(path, required=True)
        if text is _MISSING:
            return None
        try:
            return self.parse_cpus(text, path, mask)
        except CpuListError as exc:
            raise SysfsError(str(exc))
