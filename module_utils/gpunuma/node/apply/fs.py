# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The file system side of gpunuma_apply and gpunuma_copy: how a file is written (atomic, with a backup of the file
it replaces, named as Ansible's own modules name them), restored, removed, and how old backups go.
``node/apply/reconcile.py`` decides what is written; this writes it."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time

from ansible.module_utils.gpunuma.common import atomic
from ansible.module_utils.gpunuma.node.apply.files import TEMP_PREFIX, backup_stamp


def _uid(name):
    import pwd
    return pwd.getpwnam(name).pw_uid


def _gid(name):
    import grp
    return grp.getgrnam(name).gr_gid


class NodeFiles:
    """The files of a node (or the controller): atomic writes with backups, restores, removals, backup pruning.

    ``run_command``: AnsibleModule.run_command's shape, for the validation commands of file requests."""

    def __init__(self, run_command=None):
        self.run_command = run_command

    def meta(self, path):
        return os.stat(path)

    def attrs_differ(self, path, mode, owner, group, meta):
        if mode is not None and stat.S_IMODE(meta.st_mode) != mode:
            return True
        if owner is not None and meta.st_uid != _uid(owner):
            return True
        if group is not None and meta.st_gid != _gid(group):
            return True
        return False

    def validate(self, entry):
        tmpdir = tempfile.mkdtemp(prefix="gpunuma-validate-")
        try:
            candidate = os.path.join(tmpdir, os.path.basename(entry["path"]))
            with open(candidate, "wb") as stream:
                stream.write(entry["data"])
            argv = [word.replace("%s", candidate) for word in entry["validate"]]
            return self.run_command(argv)
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)

    def _atomic_write(self, path, data, mode, owner, group, dir_mode):
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            os.makedirs(directory, mode=dir_mode if dir_mode is not None else 0o755)
        atomic.write_atomic(path, data, mode if mode is not None else 0o644,
                            _uid(owner) if owner is not None else -1, _gid(group) if group is not None else -1,
                            prefix=TEMP_PREFIX)

    def _backup(self, path):
        """A copy of path named as AnsibleModule.backup_local names them, written atomically like every file
        here (backup_local copies in place: a run that dies half way would leave half a backup)."""
        backup = "%s.%s.%s" % (path, os.getpid(), time.strftime("%Y-%m-%d@%H:%M:%S~", time.localtime()))
        st = os.stat(path)
        with open(path, "rb") as stream:
            data = stream.read()
        self._atomic_write(backup, data, stat.S_IMODE(st.st_mode), None, None, None)
        if (st.st_uid, st.st_gid) != (os.getuid(), os.getgid()):
            os.chown(backup, st.st_uid, st.st_gid)
        return backup

    def write(self, entry):
        backup = None
        if os.path.exists(entry["path"]):
            if entry["backup"]:
                backup = self._backup(entry["path"])
            if entry["before"] == entry["data"]:
                # Only the mode or owner differ.
                os.chmod(entry["path"], entry["mode"])
                if entry["owner"] is not None or entry["group"] is not None:
                    os.chown(entry["path"], _uid(entry["owner"]) if entry["owner"] is not None else -1,
                             _gid(entry["group"]) if entry["group"] is not None else -1)
                return backup
        self._atomic_write(entry["path"], entry["data"], entry["mode"], entry["owner"], entry["group"],
                           entry["dir_mode"])
        return backup

    def remove(self, path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def remove_empty_dir(self, path):
        """Remove directory path when it is empty (never a link); whether it was removed."""
        if os.path.islink(path):
            return False
        try:
            os.rmdir(path)
        except OSError:
            return False
        return True

    @staticmethod
    def backups(path):
        """``[(stamp, backup path)]`` of path's backups (``<path>.<pid>.<YYYY-mm-dd@HH:MM:SS>~``, regular files, no
        links), oldest first."""
        directory, name = os.path.split(path)
        try:
            entries = os.listdir(directory)
        except OSError:
            return []
        found = []
        for entry in entries:
            stamp = backup_stamp(name, entry)
            full = os.path.join(directory, entry)
            if stamp is not None and os.path.isfile(full) and not os.path.islink(full):
                found.append((stamp, full))
        return sorted(found)

    def prune_backups(self, path, keep):
        """Remove all but the newest ``keep`` backups of path (0: all of them); their paths."""
        backups = self.backups(path)
        removed = [full for _unused, full in backups[:max(len(backups) - keep, 0)]]
        for full in removed:
            self.remove(full)
        return removed

    def restrict_backups(self, path):
        """Make every backup of path readable by its owner alone (group and other bits cleared); their paths.

        A backup is for rolling back, never for reading: one kept by an older gpunuma may hold a unit or plan
        with secret values written before they moved to the 0600 environment files."""
        changed = []
        for _unused, full in self.backups(path):
            mode = stat.S_IMODE(os.stat(full).st_mode)
            if mode & 0o077:
                os.chmod(full, mode & 0o700)
                changed.append(full)
        return changed

    def restore(self, backup, path):
        with open(backup, "rb") as stream:
            data = stream.read()
        st = os.stat(backup)
        self._atomic_write(path, data, stat.S_IMODE(st.st_mode), None, None, None)
        os.chown(path, st.st_uid, st.st_gid)
