"""Who else sets kernel.numa_balancing: sysctl.d files and tuned profiles.

Pure functions over text the role collected on the node (file lists and grep
output), so they run on the controller and are unit-tested without a node.
"""

from __future__ import annotations

import os
import re

# systemd-sysctl reads these directories; a file name in an earlier one hides
# the same name in a later one (sysctl.d(5)).
SYSCTL_DIR_PRECEDENCE = ("/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d", "/lib/sysctl.d")
# Read after every sysctl.d file, so it wins over all of them.
SYSCTL_CONF = "/etc/sysctl.conf"

_SECTION_RE = re.compile(r"^\s*\[([^\]]+)\]\s*$")
_INCLUDE_RE = re.compile(r"^\s*include\s*=\s*(.*?)\s*$")
_ACTIVE_RE = re.compile(r"^Current active profile:\s*(.*?)\s*$", re.MULTILINE)


def _key_re(key):
    # sysctl accepts both kernel.numa_balancing and kernel/numa_balancing; a
    # leading '-' only tells systemd-sysctl to ignore a failure.
    dotted = re.escape(key).replace(r"\.", "[./]")
    return re.compile(r"^\s*-?\s*" + dotted + r"\s*=\s*(.*?)\s*$")


def _dir_rank(path):
    directory = os.path.dirname(path)
    for rank, candidate in enumerate(SYSCTL_DIR_PRECEDENCE):
        if os.path.normpath(directory) == candidate:
            return rank
    return len(SYSCTL_DIR_PRECEDENCE)


def _grep_lines_by_path(grep_lines):
    """``grep -H`` output lines (``path:line``) grouped by path, in order."""
    by_path = {}
    for entry in grep_lines or []:
        path, sep, line = entry.partition(":")
        if sep:
            by_path.setdefault(path, []).append(line)
    return by_path


def sysctl_writers(conf_paths, grep_lines, key="kernel.numa_balancing"):
    """The files that set ``key`` at boot, in the order systemd-sysctl applies them.

    ``conf_paths``: every ``*.conf`` found in the sysctl.d directories (and
    /etc/sysctl.conf when present), because a file that does not set the key
    can still hide a same-named file that does. ``grep_lines``: ``grep -H``
    output over those files. Returns ``[{"path", "value"}]``; the last entry
    wins at boot.
    """
    matcher = _key_re(key)
    lines = _grep_lines_by_path(grep_lines)
    effective = {}
    late = []
    for path in conf_paths or []:
        if os.path.normpath(path) == SYSCTL_CONF:
            late.append(path)
            continue
        name = os.path.basename(path)
        current = effective.get(name)
        if current is None or _dir_rank(path) < _dir_rank(current):
            effective[name] = path
    ordered = [effective[name] for name in sorted(effective)] + late
    writers = []
    for path in ordered:
        value = None
        for line in lines.get(path, []):
            match = matcher.match(line)
            if match:
                value = match.group(1)
        if value is not None:
            writers.append({"path": path, "value": value})
    return writers


def sysctl_conflicts(writers, own_path, wanted, key="kernel.numa_balancing"):
    """Split ``writers`` into files that override ``own_path`` at boot with
    another value (``overriding``) and files it overrides (``overridden``).

    Each entry gains ``reason``, a sentence for the report.
    """
    wanted = str(wanted)
    own_path = os.path.normpath(own_path)
    paths = [os.path.normpath(w["path"]) for w in writers]
    position = paths.index(own_path) if own_path in paths else None
    overriding, overridden = [], []
    for index, writer in enumerate(writers):
        if paths[index] == own_path or writer["value"] == wanted:
            continue
        entry = dict(writer)
        if position is None or index > position:
            entry["reason"] = "%s sets %s=%s and is applied after %s, so it wins at boot" % (
                writer["path"], key, writer["value"], own_path)
            overriding.append(entry)
        else:
            entry["reason"] = "%s sets %s=%s; %s is applied after it and wins" % (
                writer["path"], key, writer["value"], own_path)
            overridden.append(entry)
    return {"overriding": overriding, "overridden": overridden}


def tuned_active_profiles(text):
    """Profile names from ``tuned-adm active`` output ([] when none is active)."""
    match = _ACTIVE_RE.search(text or "")
    if not match:
        return []
    return match.group(1).split()


def _tuned_profiles(grep_lines):
    """``{profile: [lines]}`` from ``grep -H`` over tuned.conf files.

    A profile under /etc/tuned replaces the shipped one of the same name, as
    tuned itself resolves them.
    """
    chosen = {}
    for path, lines in _grep_lines_by_path(grep_lines).items():
        profile = os.path.basename(os.path.dirname(path))
        local = os.path.normpath(path).startswith("/etc/tuned/")
        if profile not in chosen or (local and not chosen[profile][0]):
            chosen[profile] = (local, lines)
    return {name: lines for name, (_, lines) in chosen.items()}


def tuned_setting(grep_lines, active, key="kernel.numa_balancing"):
    """What the active tuned profile(s) set ``key`` to, following ``include=``.

    ``grep_lines``: ``grep -H`` over every tuned.conf, keeping section
    headers, ``include=`` lines and lines naming the key. Returns
    ``{"value", "profile", "chain"}`` (``chain``: active profile down to the
    one that sets it) or None when no active profile sets it. Included
    profiles apply first and the including one overrides them; of several
    active profiles the last one wins.
    """
    profiles = _tuned_profiles(grep_lines)
    matcher = _key_re(key)

    def resolve(name, chain):
        if name in chain or name not in profiles:
            return None
        chain = chain + [name]
        inherited = None
        own = None
        section = None
        for line in profiles[name]:
            header = _SECTION_RE.match(line)
            if header:
                section = header.group(1).strip()
                continue
            include = _INCLUDE_RE.match(line)
            if include and section == "main":
                for included in re.split(r"[\s,]+", include.group(1)):
                    # ${variables} are resolved by tuned at run time; an
                    # include through one cannot be followed here.
                    if included and "$" not in included:
                        found = resolve(included, chain)
                        if found is not None:
                            inherited = found
                continue
            match = matcher.match(line)
            if match and section == "sysctl":
                own = {"value": match.group(1), "profile": name, "chain": chain}
        return own if own is not None else inherited

    setting = None
    for name in active or []:
        found = resolve(name, [])
        if found is not None:
            setting = found
    return setting


class FilterModule:
    def filters(self):
        return {
            "autonuma_sysctl_writers": sysctl_writers,
            "autonuma_sysctl_conflicts": sysctl_conflicts,
            "autonuma_tuned_active_profiles": tuned_active_profiles,
            "autonuma_tuned_setting": tuned_setting,
        }
