"""Who else sets a sysctl key: sysctl.d files and tuned profiles.

gpunuma owns one sysctl.d file for ``kernel.numa_balancing``; whether its
value holds depends on every other file systemd-sysctl reads and on the
active tuned profile, which applies its ``[sysctl]`` section again each time
tuned starts. The functions here work on text the autonuma role collects on
the node (file lists and ``grep -H`` output), so they run on the controller
and are tested without a node.
"""

from __future__ import annotations

import os
import re

from ansible.module_utils.gpunuma.common.errors import GpunumaError

DEFAULT_KEY = "kernel.numa_balancing"

# systemd-sysctl reads these directories; a file name in an earlier one hides
# the same name in a later one (sysctl.d(5)).
SYSCTL_DIR_PRECEDENCE = (
    "/etc/sysctl.d",
    "/run/sysctl.d",
    "/usr/local/lib/sysctl.d",
    "/usr/lib/sysctl.d",
    "/lib/sysctl.d",
)
# Read after every sysctl.d file, so it wins over all of them.
SYSCTL_CONF = "/etc/sysctl.conf"
# The profile directory tuned prefers over the shipped profiles.
TUNED_LOCAL_DIR = "/etc/tuned"

_KEY_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*(?:[./][A-Za-z0-9_-]+)*$")
_SECTION_RE = re.compile(r"^\s*\[([^\]]+)\]\s*$")
_INCLUDE_RE = re.compile(r"^\s*include\s*=\s*(.*?)\s*$")
_ACTIVE_RE = re.compile(r"^Current active profile:\s*(.*?)\s*$", re.MULTILINE)


def _check_key(key):
    if not isinstance(key, str) or not _KEY_NAME_RE.match(key):
        raise GpunumaError(
            "sysctl key: %r is not a sysctl name; allowed: dotted or slashed words such as kernel.numa_balancing"
            % (key,)
        )


def _check_lines(lines, what):
    if lines is None:
        return []
    if isinstance(lines, str) or not all(isinstance(line, str) for line in lines):
        raise GpunumaError(
            "%s: %r is not a list of lines; allowed: a list of strings (grep -H output lines)" % (what, lines)
        )
    return list(lines)


def _key_re(key):
    # sysctl accepts both kernel.numa_balancing and kernel/numa_balancing; a
    # leading '-' only tells systemd-sysctl to ignore a failure.
    _check_key(key)
    dotted = re.escape(key.replace("/", ".")).replace(r"\.", "[./]")
    return re.compile(r"^\s*-?\s*" + dotted + r"\s*=\s*(.*?)\s*$")


def _dir_rank(path):
    directory = os.path.normpath(os.path.dirname(path))
    for rank, candidate in enumerate(SYSCTL_DIR_PRECEDENCE):
        if directory == candidate:
            return rank
    # Directories outside the standard list (tests, custom layouts) rank
    # after the standard ones, in the order they were listed.
    return len(SYSCTL_DIR_PRECEDENCE)


def grep_lines_by_path(grep_lines):
    """``grep -H`` output lines (``path:line``) grouped by path, in order.

    Returns ``{path: [line, ...]}``. A line without a ``:`` carries no path
    and is dropped. The first ``:`` ends the path, so the setting itself may
    contain colons.
    """
    by_path = {}
    for entry in _check_lines(grep_lines, "grep lines"):
        path, sep, line = entry.partition(":")
        if sep:
            by_path.setdefault(path, []).append(line)
    return by_path


def sysctl_apply_order(conf_paths):
    """The files systemd-sysctl reads, in the order it applies them.

    Files are applied by file name across all directories; a name in an
    earlier directory of :data:`SYSCTL_DIR_PRECEDENCE` hides the same name in
    a later one; ``/etc/sysctl.conf`` comes last. Of two paths with the same
    name in directories of equal rank the first listed is kept.
    """
    effective = {}
    late = []
    for path in _check_lines(conf_paths, "sysctl file paths"):
        if os.path.normpath(path) == SYSCTL_CONF:
            if path not in late:
                late.append(path)
            continue
        name = os.path.basename(path)
        current = effective.get(name)
        if current is None or _dir_rank(path) < _dir_rank(current):
            effective[name] = path
    return [effective[name] for name in sorted(effective)] + late


def sysctl_writers(conf_paths, grep_lines, key=DEFAULT_KEY):
    """The files that set ``key`` at boot, in the order systemd-sysctl applies them.

    ``conf_paths``: every ``*.conf`` found in the sysctl.d directories (and
    /etc/sysctl.conf when present), because a file that does not set the key
    can still hide a same-named file that does. ``grep_lines``: ``grep -H``
    output over those files. Returns ``[{"path", "value"}]`` (the last
    assignment within a file counts); the last entry wins at boot.
    """
    matcher = _key_re(key)
    lines = grep_lines_by_path(grep_lines)
    writers = []
    for path in sysctl_apply_order(conf_paths):
        value = None
        for line in lines.get(path, []):
            match = matcher.match(line)
            if match:
                value = match.group(1)
        if value is not None:
            writers.append({"path": path, "value": value})
    return writers


def sysctl_conflicts(writers, own_path, wanted, key=DEFAULT_KEY):
    """Split ``writers`` into files that override ``own_path`` at boot with
    another value (``overriding``) and files it overrides (``overridden``).

    ``writers``: :func:`sysctl_writers` output. Files that set ``wanted``
    are neither. When ``own_path`` is not among the writers every other
    value overrides it. Each entry gains ``reason``, a sentence for the
    report. Returns ``{"overriding": [...], "overridden": [...]}``.
    """
    _check_key(key)
    if isinstance(wanted, bool) or not isinstance(wanted, (str, int)):
        raise GpunumaError("wanted value: %r is not a sysctl value; allowed: a string or an integer" % (wanted,))
    if not isinstance(own_path, str) or not own_path:
        raise GpunumaError(
            "own sysctl file: %r is not a path; allowed: the path of gpunuma's sysctl.d file" % (own_path,)
        )
    bad = [w for w in writers or [] if not isinstance(w, dict) or "path" not in w or "value" not in w]
    if bad:
        raise GpunumaError("sysctl writers: %r lack path or value; allowed: sysctl_writers() entries" % (bad,))
    wanted = str(wanted)
    own_path = os.path.normpath(own_path)
    paths = [os.path.normpath(w["path"]) for w in writers or []]
    position = paths.index(own_path) if own_path in paths else None
    overriding, overridden = [], []
    for index, writer in enumerate(writers or []):
        if paths[index] == own_path or str(writer["value"]) == wanted:
            continue
        entry = dict(writer)
        if position is None or index > position:
            entry["reason"] = "%s sets %s=%s and is applied after %s, so it wins at boot" % (
                writer["path"],
                key,
                writer["value"],
                own_path,
            )
            overriding.append(entry)
        else:
            entry["reason"] = "%s sets %s=%s; %s is applied after it and wins" % (
                writer["path"],
                key,
                writer["value"],
                own_path,
            )
            overridden.append(entry)
    return {"overriding": overriding, "overridden": overridden}


def tuned_active_profiles(text):
    """Profile names from ``tuned-adm active`` output ([] when none is active).

    tuned can stack profiles (``Current active profile: a b``); they apply
    in that order.
    """
    if text is not None and not isinstance(text, str):
        raise GpunumaError("tuned-adm active output: %r is not text; allowed: the command's stdout" % (text,))
    match = _ACTIVE_RE.search(text or "")
    if not match:
        return []
    return match.group(1).split()


def tuned_profiles(grep_lines):
    """``{profile: [lines]}`` from ``grep -H`` over ``<dir>/<profile>/tuned.conf`` files.

    A profile under /etc/tuned replaces the shipped one of the same name, as
    tuned itself resolves them; between other directories the first listed
    is kept.
    """
    chosen = {}
    for path, lines in grep_lines_by_path(grep_lines).items():
        profile = os.path.basename(os.path.dirname(path))
        local = os.path.normpath(path).startswith(TUNED_LOCAL_DIR + "/")
        if profile not in chosen or (local and not chosen[profile][0]):
            chosen[profile] = (local, lines)
    return {name: lines for name, (_unused, lines) in chosen.items()}


def tuned_setting(grep_lines, active, key=DEFAULT_KEY):
    """What the active tuned profile(s) set ``key`` to, following ``include=``.

    ``grep_lines``: ``grep -H`` over every tuned.conf, keeping section
    headers, ``include=`` lines and lines naming the key. ``active``: the
    :func:`tuned_active_profiles` names. Returns ``{"value", "profile",
    "chain"}`` (``chain``: active profile down to the one that sets it) or
    None when no active profile sets it. Included profiles apply first and
    the including one overrides them; of several active profiles the last
    one wins; an include loop is followed once.
    """
    if active is not None and (isinstance(active, str) or not all(isinstance(a, str) for a in active)):
        raise GpunumaError(
            "active tuned profiles: %r is not a list of names; allowed: tuned_active_profiles() output" % (active,)
        )
    profiles = tuned_profiles(grep_lines)
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


def tuned_conflict(setting, wanted, key=DEFAULT_KEY):
    """The report sentence when ``setting`` (:func:`tuned_setting`) fights ``wanted``, else None."""
    _check_key(key)
    if setting is None:
        return None
    if not isinstance(setting, dict) or not setting.get("chain") or "value" not in setting:
        raise GpunumaError(
            "tuned setting: %r is not a tuned_setting() result; allowed: None or {value, profile, chain}" % (setting,)
        )
    if str(setting["value"]) == str(wanted):
        return None
    chain = setting["chain"]
    through = " (through %s)" % " -> ".join(chain[1:]) if len(chain) > 1 else ""
    return (
        "tuned profile %s%s sets %s=%s and applies it again whenever tuned starts; "
        "set it in a custom tuned profile, or switch profiles" % (chain[0], through, key, setting["value"])
    )
