# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The programs instances run: present, executable by their account, and not replaceable by another account.

``systemd-analyze verify`` checks a unit's ExecStart= program, but with the
numactl binding method that program is numactl: a missing server behind it
shows only when the unit starts (and fails, and is rolled back: two
restarts of a healthy instance). So, before anything is written, the
validation play reads each instance's ``command[0]`` (and its readiness
command's, which runs as the same account) on the node
(``gpunuma_node_info``'s ``programs`` section, :func:`program_states`) and
refuses a program that is missing, not a regular file, or not executable
by the instance's account (:func:`program_problems`).

An instance that runs as root runs whatever its program file holds: a
program, or a directory above it, that an account other than root can
write would let that account run code as root. That is refused too.

Three sides, one file: :func:`program_requests` (controller: what to read,
from the inventory's instances), :func:`program_states` (node: what is
there), :func:`program_problems` (controller: what is wrong, from the plan).
Standard library only.
"""

from __future__ import annotations

import os
import stat

DEFAULT_USER = "gpunuma"
ROOT_NAMES = ("root", "0")


def _instance_user(instance):
    user = instance.get("user")
    return str(user) if isinstance(user, (str, int)) and not isinstance(user, bool) and str(user) else DEFAULT_USER


def _programs(instance):
    """``[(path, field)]``: the programs an instance's account runs, ``command[0]`` and its readiness command's
    (``ready.command[0]``, run as the same account by gpunuma_apply), any junk skipped."""
    out = []
    command = instance.get("command")
    if isinstance(command, list) and command and isinstance(command[0], str):
        out.append((command[0], "command[0]"))
    ready = instance.get("ready")
    ready_command = ready.get("command") if isinstance(ready, dict) else None
    if isinstance(ready_command, list) and ready_command and isinstance(ready_command[0], str):
        out.append((ready_command[0], "ready.command[0]"))
    return out


def program_requests(instances, extra_paths=()):
    """[{"path", "user"}] to read: each instance's programs (command[0], ready.command[0]) with its account
    (inventory form, any junk skipped)."""
    out = []
    seen = set()
    if not isinstance(instances, list):
        return out
    for instance in instances:
        if not isinstance(instance, dict):
            continue
        for path, _field in _programs(instance):
            key = (path, _instance_user(instance))
            if os.path.isabs(path) and key not in seen:
                seen.add(key)
                out.append({"path": path, "user": key[1]})
    return out


def _account(user):
    """(uid, gids) of an account; (None, set()) when the node has no such account yet."""
    import grp
    import pwd

    if str(user).isdigit():
        return int(user), set()
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return None, set()
    gids = {entry.pw_gid} | {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}
    return entry.pw_uid, gids


def _may(meta, uid, gids, owner_bit, group_bit, other_bit):
    if uid == 0:
        return True
    if uid is not None and meta.st_uid == uid:
        return bool(meta.st_mode & owner_bit)
    if meta.st_gid in gids:
        return bool(meta.st_mode & group_bit)
    return bool(meta.st_mode & other_bit)


def _other_writers(path):
    """Why an account other than root could replace ``path``: the first file or directory on its way that a
    non-root account owns, or that is group- or world-writable (a sticky directory only guards others' files)."""
    current = path
    while True:
        try:
            meta = os.lstat(current)
        except OSError:
            return None
        if stat.S_ISLNK(meta.st_mode):
            # A link's own mode (always 0777) and owner change nothing: replacing it takes write access to its
            # directory (checked next), and its target is checked on its own.
            parent = os.path.dirname(current)
            if parent == current:
                return None
            current = parent
            continue
        if meta.st_uid != 0:
            return "%s is owned by uid %d" % (current, meta.st_uid)
        if meta.st_mode & stat.S_IWGRP and meta.st_gid != 0:
            return "%s is writable by group gid %d" % (current, meta.st_gid)
        if meta.st_mode & stat.S_IWOTH and not (stat.S_ISDIR(meta.st_mode) and meta.st_mode & stat.S_ISVTX):
            return "%s is writable by every account" % current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def program_states(requests):
    """{path: {"exists", "regular", "executable": {user: bool}, "other_writers": str or None}} on this node.

    ``executable`` follows the path as the account would: every directory
    searchable, the file executable (owner, group or other bits, as the
    kernel checks them; an account that does not exist yet gets the other
    bits). ``other_writers`` is filled in for programs run as root.
    """
    out = {}
    for item in requests or ():
        path, user = item.get("path"), item.get("user") or DEFAULT_USER
        if not isinstance(path, str) or not os.path.isabs(path):
            continue
        entry = out.setdefault(path, {"exists": False, "regular": False, "executable": {}, "other_writers": None})
        real = os.path.realpath(path)
        try:
            meta = os.stat(path)
        except OSError:
            entry["executable"][user] = False
            continue
        entry["exists"] = True
        entry["regular"] = stat.S_ISREG(meta.st_mode)
        uid, gids = _account(user)
        ok = entry["regular"] and _may(meta, uid, gids, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)
        directory = os.path.dirname(real)
        while ok:
            try:
                dmeta = os.stat(directory)
            except OSError:
                ok = False
                break
            ok = _may(dmeta, uid, gids, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)
            parent = os.path.dirname(directory)
            if parent == directory:
                break
            directory = parent
        entry["executable"][user] = ok
        if user in ROOT_NAMES:
            entry["other_writers"] = _other_writers(path) or (_other_writers(real) if real != path else None)
    return out


def program_problems(plan, states, host, start=True):
    """One message per started instance whose program the node cannot run as planned (nothing when the node
    was not read: ``states`` None)."""
    if states is None or not start:
        return []
    problems = []
    for instance in (plan or {}).get("instances") or []:
        user = _instance_user(instance)
        for path, field in _programs(instance):
            state = states.get(path)
            if state is None:
                continue
            where = "%s: gpunuma_instances entry '%s' %s %s" % (
                host, instance.get("name"), "runs" if field == "command[0]" else "checks its readiness with", path)
            if not state.get("exists"):
                problems.append("%s, which does not exist on the node; install it first, or correct %s (an "
                                "absolute path to an executable file on the node)" % (where, field))
            elif not state.get("regular"):
                problems.append("%s, which is not a regular file on the node; %s must be an executable file"
                                % (where, field))
            elif not (state.get("executable") or {}).get(user, False):
                problems.append("%s as %s, who cannot execute it (the file or a directory above it lacks the "
                                "execute permission for that account); fix the permissions or run the instance as "
                                "another `user`" % (where, user))
            elif user in ROOT_NAMES and state.get("other_writers"):
                problems.append("%s as root, but %s: that account could run anything as root; make the program "
                                "and every directory above it owned by root and not group- or world-writable, or "
                                "run the instance as an unprivileged `user`" % (where, state["other_writers"]))
    return problems
