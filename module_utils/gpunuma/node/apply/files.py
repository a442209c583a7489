"""The files of gpunuma_apply: requests checked, what each write would change, and what is stale.

Pure reading and deciding, no change to the node: ``normalise_files`` and
``normalise_absent`` check what the controller asked for (paths, modes,
validation commands, restart modes), ``plan_files`` reads each target and
decides what would change (with a diff), ``find_stale`` lists the files
gpunuma wrote that the plan no longer has. ``node/apply/reconcile.py`` then makes the
changes (``Apply``).
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re

from ansible.module_utils.gpunuma.common import bounded
from ansible.module_utils.gpunuma.common.secrets import REDACTED

MAX_FILE_BYTES = 4 * 1024 * 1024
# Name prefix of the temporary file of an atomic write (same directory as
# the file); one left by an interrupted run is removed by the next.
TEMP_PREFIX = ".gpunuma-"
# What follows a file's name in its backups: ".<pid>.<YYYY-mm-dd@HH:MM:SS>~", as AnsibleModule.backup_local names them.
BACKUP_SUFFIX_RE = r"\.([0-9]+)\.([0-9]{4}-[0-9]{2}-[0-9]{2}@[0-9]{2}:[0-9]{2}:[0-9]{2})~$"


def backup_stamp(name, entry):
    """``(time, pid)`` when directory entry ``entry`` is a backup of file ``name``, else None (a sort key)."""
    match = re.match(re.escape(name) + BACKUP_SUFFIX_RE, entry)
    return (match.group(2), int(match.group(1))) if match else None


class ApplyError(Exception):
    """A request the module refuses, or a step that failed before any unit was touched."""


def read_file(path):
    """Current bytes of path, or None when it does not exist (bounded.read_bounded: a regular file, not a link)."""
    try:
        return bounded.read_bounded(path, MAX_FILE_BYTES, what="a file gpunuma manages")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise ApplyError("%s: %s; move it aside and run again" % (path, exc.strerror or exc))


def _mode_int(mode, field):
    if mode is None:
        return None
    if isinstance(mode, int):
        return mode
    text = str(mode)
    try:
        value = int(text, 8)
    except ValueError:
        raise ApplyError("%s: mode %r is not an octal mode such as '0644'" % (field, mode))
    if not 0 <= value <= 0o7777:
        raise ApplyError("%s: mode %r is out of range (0000-7777)" % (field, mode))
    return value


def normalise_files(files, field="files"):
    """Check the file requests; return them as dicts with bytes content and int modes."""
    seen = set()
    out = []
    for index, entry in enumerate(files or []):
        where = "%s[%d]" % (field, index)
        if not isinstance(entry, dict):
            raise ApplyError("%s must be a mapping with path and content, got %r" % (where, entry))
        path = entry.get("path")
        if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
            raise ApplyError("%s.path must be an absolute path, got %r" % (where, path))
        path = os.path.normpath(path)
        if path in seen:
            raise ApplyError("%s.path %s is listed twice" % (where, path))
        seen.add(path)
        content = entry.get("content")
        if not isinstance(content, str):
            raise ApplyError("%s.content must be text, got %r" % (where, type(content).__name__))
        data = content.encode("utf-8")
        if len(data) > MAX_FILE_BYTES:
            raise ApplyError("%s.content is %d bytes; at most %d" % (where, len(data), MAX_FILE_BYTES))
        validate = entry.get("validate")
        if validate is not None:
            if not isinstance(validate, list) or not validate or not all(isinstance(w, str) for w in validate) \
                    or not any("%s" in w for w in validate):
                raise ApplyError("%s.validate must be a command as a list of words, one holding %%s "
                                 "(the file to check), got %r" % (where, validate))
        out.append({
            "path": path,
            "data": data,
            "mode": _mode_int(entry.get("mode", "0644"), where + ".mode"),
            "dir_mode": _mode_int(entry.get("dir_mode", "0755"), where + ".dir_mode"),
            "owner": entry.get("owner"),
            "group": entry.get("group"),
            "backup": bool(entry.get("backup", True)),
            "validate": validate,
            "unit": entry.get("unit"),
            "restart": _restart_mode(entry.get("restart"), where),
            # A file holding secrets: its diff shows REDACTED, never the text (common/secrets.py).
            "secret": bool(entry.get("secret", False)),
        })
    return out


RESTART_MODES = ("changed", "if-running", "never", "stop")
ABSENT_RESTART_MODES = ("if-running", "stop")


def _restart_mode(value, where):
    """A file's restart mode: ``changed`` (default: the unit restarts when the file changed; an instance
    service listed in units.services even when stopped), ``if-running`` (only a running unit restarts),
    ``never`` (written, systemd reloaded, nothing restarted), ``stop`` (a running unit stops before the first
    write and starts once every file is written, put back when it does not come back: node/apply/stop.py)."""
    if value is None:
        return "changed"
    if value not in RESTART_MODES:
        raise ApplyError("%s.restart: %r is not allowed; allowed: %s" % (where, value, ", ".join(RESTART_MODES)))
    return value


def normalise_absent(absent, field="absent"):
    """``absent`` entries as ``(paths, {path: unit}, {path: unit})``: a path, or ``{path, unit, restart}``. With
    ``restart: if-running`` (the default) the unit restarts, when running, once the path is removed (a drop-in of
    a service gpunuma does not own, e.g. irqbalance); with ``restart: stop`` the unit is stopped before the path
    goes and started after (node/apply/stop.py; a checkpoint the kubelet must not read under a new policy)."""
    paths, units, stops = [], {}, {}
    for index, entry in enumerate(absent or []):
        where = "%s[%d]" % (field, index)
        unit, restart = None, "if-running"
        if isinstance(entry, dict):
            unknown = sorted(set(entry) - {"path", "unit", "restart"})
            if unknown:
                raise ApplyError("%s: %s not allowed; allowed: path, unit, restart" % (where, ", ".join(unknown)))
            path, unit = entry.get("path"), entry.get("unit")
            if unit is not None and (not isinstance(unit, str) or not unit.endswith(UNIT_SUFFIXES)):
                raise ApplyError("%s.unit must be a systemd unit name, got %r" % (where, unit))
            restart = entry.get("restart") or "if-running"
            if restart not in ABSENT_RESTART_MODES:
                raise ApplyError("%s.restart: %r is not allowed; allowed: %s" % (
                    where, restart, ", ".join(ABSENT_RESTART_MODES)))
            if restart == "stop" and not unit:
                raise ApplyError("%s.restart: stop needs the unit to stop (%s.unit)" % (where, where))
        else:
            path = entry
        if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
            raise ApplyError("%s must be an absolute path, got %r" % (where, path))
        paths.append(path)
        if unit:
            (stops if restart == "stop" else units)[os.path.normpath(path)] = unit
    return paths, units, stops


def os_error_text(exc):
    """``cannot write <path>: [Errno 28] ENOSPC: No space left on device`` from an OSError."""
    name = errno.errorcode.get(exc.errno, "") if exc.errno else ""
    path = exc.filename or "a file"
    return "cannot write %s: [Errno %s] %s%s" % (path, exc.errno, (name + ": ") if name else "", exc.strerror or exc)


# gpunuma's own state documents (plan, topology, state, the converge record): machine-written JSON whose text a
# reviewer does not read in a diff; --diff shows them in full only with -v (the plan tables show the plan).
STATE_SUFFIX = ".json"


def quiet_state_diff(entry: dict) -> dict:
    """A --diff entry (file_diff's) with a JSON state file's text cut to one line giving its size."""
    path = str(entry.get("after_header") or entry.get("before_header") or "").split(" (absent)", maxsplit=1)[0]
    if not path.endswith(STATE_SUFFIX):
        return entry
    out = dict(entry)
    for side in ("before", "after"):
        if out.get(side):
            out[side] = "(gpunuma JSON state, %d bytes; -v shows it)\n" % len(out[side].encode("utf-8"))
    return out


def file_diff(path, before, after, secret=False):
    def text(data):
        if data is None:
            return ""
        if secret:
            return "%s (%d bytes)\n" % (REDACTED, len(data))
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return "(binary content, %d bytes)\n" % len(data)
    return {"before_header": path if before is not None else "%s (absent)" % path,
            "after_header": path if after is not None else "%s (absent)" % path,
            "before": text(before), "after": text(after)}


def plan_files(files, fs):
    """Compare the wanted files with the node: a list of per-file decisions."""
    decisions = []
    for entry in files:
        current = read_file(entry["path"])
        meta = fs.meta(entry["path"]) if current is not None else None
        content_changed = current != entry["data"]
        attrs_changed = (current is not None and not content_changed
                         and fs.attrs_differ(entry["path"], entry["mode"], entry["owner"], entry["group"], meta))
        decisions.append(dict(entry, existed=current is not None, before=current,
                              content_changed=content_changed, changed=content_changed or attrs_changed))
    return decisions


def find_stale(prune, keep_units, keep_dropins, listdir=os.listdir, read=read_file):
    """Files gpunuma wrote (marker line) that the plan no longer names.

    Returns (stale unit names, stale drop-in target unit names), each sorted.
    A gpunuma-*.service without the marker (someone else's) is never listed.
    """
    unit_dir = prune["unit_dir"]
    try:
        names = sorted(listdir(unit_dir))
    except FileNotFoundError:
        return [], []
    stale_units, stale_dropins = [], []
    for name in names:
        path = os.path.join(unit_dir, name)
        if fnmatch.fnmatch(name, prune["unit_pattern"]) and name not in keep_units:
            try:
                data = read(path)
            except ApplyError:
                continue
            if data is not None and prune["unit_marker"].encode() in data:
                stale_units.append(name)
        if name.endswith(".d") and name[:-2] not in keep_dropins:
            dropin = os.path.join(path, prune["dropin_name"])
            try:
                data = read(dropin) if os.path.isdir(path) and not os.path.islink(path) else None
            except ApplyError:
                continue
            if data is not None and prune["dropin_marker"].encode() in data:
                stale_dropins.append(name[:-2])
    return stale_units, stale_dropins


UNIT_SUFFIXES = (".service", ".socket", ".timer", ".target", ".mount", ".slice", ".scope", ".path")


def is_systemd_path(path):
    """A unit file or a unit's drop-in (``<unit>.d/*.conf``): removing one needs a daemon-reload."""
    parent = os.path.basename(os.path.dirname(path))
    return path.endswith(UNIT_SUFFIXES) or (parent.endswith(".d") and parent[:-2].endswith(UNIT_SUFFIXES))
