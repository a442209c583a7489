"""Reconcile a node's gpunuma files and units in one step (one round trip).

The controller renders every file (units, drop-ins, limits, sysctl, the
applied plan) and hands the whole set to ``gpunuma_apply``, which:

1. validates every changed file first (a command run on a temporary copy):
   one file that fails validation stops the run before any file is written;
2. writes each changed file atomically (temporary file in the same
   directory, then rename), keeping a backup of the file it replaces, and
   removes the files no longer wanted (prune: only files carrying gpunuma's
   marker line);
3. enables the instance units that are not (``systemctl enable
   --no-reload``), reloads systemd once when a unit or drop-in changed or a
   unit was enabled, restarts only the units whose file changed (drop-in
   targets only when running), starts the instance units, waits
   ``settle_seconds`` and checks that every unit it started is still active
   with the same invocation;
4. on a failure rolls the failed units' files back (previous file from the
   backup, or removed when new), reloads, restarts the restored units, and
   reports each failed unit's state and journal;
5. writes the ``after_success`` files (the applied plan) only when every unit
   settled.

A run can die anywhere (the host loses power, the connection drops, the
module is killed). Two things make a plain re-run finish the job:

- Temporary files of the atomic writes (``.gpunuma-*`` in the directory of
  the file) are never half of a wanted file; a run removes the ones an
  earlier, interrupted run left in the directories it writes to.
- Pending restarts (``pending_path``): before the first file is written, the
  units whose file (or drop-in) is about to change are recorded in a small
  JSON list, written atomically; the list is cleared once every batch
  settled (after a rollback it keeps only the units still running an older
  file than the one on disk). A run that finds units listed there reloads
  systemd and restarts them (drop-in targets and removed units only when
  running) even though their files no longer differ: a run that died between
  writing a unit and restarting it would otherwise leave the old process
  running on the new file, reported unchanged for ever.

A run whose controller went away (``alive`` says why: a signal such as
Ctrl-C, or the connection that would read the answer closed) does no work
after it at the next step boundary: before any live change it puts back the
files it wrote and stops; between rolling-restart batches it puts the node
back on the files it ran before this run (restarting what it had restarted,
recreating what it had pruned); once every batch settled it finishes, writing
the applied plan (and the state record) in the same step, so the node ends
on the old plan or the new one, never between. A failure to write the
``after_success`` files after the restarts is undone the same way.

Check mode computes the same changes and diffs and touches nothing.

The systemd and validation commands go through ``runner(argv) -> (rc, out,
err)`` and the clock through ``sleep``, so the logic is tested without a node.
"""

from __future__ import annotations

import json
import os
import stat

from ansible.module_utils.gpunuma.common import bounded
from ansible.module_utils.gpunuma.node import accounts
from ansible.module_utils.gpunuma.node.apply.files import (
    TEMP_PREFIX,
    ApplyError,
    backup_stamp,
    file_diff,
    find_stale,
    is_systemd_path,
    normalise_absent,
    normalise_files,
    os_error_text,
    plan_files,
    read_file,
)
# The unit steps (start, batches, settle, readiness, rollback).
from ansible.module_utils.gpunuma.node.apply.units import UnitSteps, _http_get
from ansible.module_utils.gpunuma.node.apply.stop import StopSteps, check_stop_units


class Apply(UnitSteps, StopSteps):
    """One reconciliation. fs writes files (atomic, backups); runner runs commands."""

    def __init__(self, fs, runner, sleep, check_mode=False, http_get=None, alive=None):
        self.fs = fs
        # alive() -> None while the controller waits for this step's answer, else why it went away.
        self.alive = alive or (lambda: None)
        # What this run removed: path -> (bytes, stat), so an abandoned run can put them back.
        self._removed = {}
        self.runner = runner
        self.sleep = sleep
        self.check_mode = check_mode
        self.http_get = http_get or _http_get
        self.result = {"changed": False, "files": [], "removed": [], "restarted": [], "started": [],
                       "enabled": [], "stopped": [], "not_started": [], "failed_units": [], "rolled_back": [], "diff": [],
                       "pruned_backups": []}

    # ------------------------------------------------------------- files
    def _validate(self, decisions):
        problems = []
        for entry in decisions:
            if not entry["content_changed"] or not entry["validate"]:
                continue
            rc, out, err = self.fs.validate(entry)
            if rc != 0:
                problems.append("%s failed to validate (%s): %s" % (
                    entry["path"], " ".join(entry["validate"]), (err or out or "").strip() or "rc %s" % rc))
        if problems:
            raise ApplyError("; ".join(problems) + "; nothing was written")

    def _write(self, decisions):
        for entry in decisions:
            record = {"path": entry["path"], "changed": entry["changed"], "created": not entry["existed"]}
            if entry["changed"]:
                self.result["changed"] = True
                if entry["content_changed"]:
                    self.result["diff"].append(file_diff(entry["path"], entry["before"], entry["data"], entry["secret"]))
                if not self.check_mode:
                    try:
                        backup = self.fs.write(entry)
                    except OSError as exc:
                        # Named by the file gpunuma meant to write, not a temporary one.
                        raise OSError(exc.errno, exc.strerror or str(exc), entry["path"]) from exc
                    if backup:
                        record["backup"] = backup
            entry["record"] = record
            self.result["files"].append(record)

    def _undo_writes(self, decisions):
        """Put back what ``_write`` wrote of ``decisions`` (backups, the bytes read before, or removal of what was
        new); the number of files put back."""
        undone = 0
        for d in reversed(decisions):
            record = d.get("record")
            if not record or not d["changed"] or self.check_mode:
                continue
            try:
                self._put_back(d)
                undone += 1
            except OSError:
                continue
        return undone

    def _put_back(self, d):
        """The file of decision ``d`` as it was before ``_write``: its backup, the bytes read before (no backup
        kept), or no file when it was new."""
        backup = d["record"].get("backup")
        if d["existed"] and backup:
            self.fs.restore(backup, d["path"])
        elif d["existed"]:
            self.fs.write(dict(d, data=d["before"], before=d["data"], backup=False))
        else:
            self.fs.remove(d["path"])

    def _remove(self, paths, secret=()):
        removed = []
        for path in paths:
            before = read_file(path)
            if before is None:
                continue
            removed.append(path)
            self.result["changed"] = True
            self.result["diff"].append(file_diff(path, before, None, path in secret))
            if not self.check_mode:
                self._removed[path] = (before, os.lstat(path))
                self.fs.remove(path)
        self.result["removed"].extend(removed)
        return removed

    # ------------------------------------------------------------- units
    def _systemctl(self, *words):
        rc, out, err = self.runner(["systemctl"] + list(words))
        return rc, (err or out or "").strip()

    def _clean_temps(self, directories):
        """Remove the temporary files an interrupted run left in the directories this run writes to."""
        found = []
        for directory in sorted(set(directories)):
            try:
                names = sorted(os.listdir(directory))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for name in names:
                path = os.path.join(directory, name)
                if name.startswith(TEMP_PREFIX) and stat.S_ISREG(os.lstat(path).st_mode):
                    found.append(path)
        if found:
            self.result["changed"] = True
            self.result["removed_temp"] = found
            if not self.check_mode:
                for path in found:
                    self.fs.remove(path)

    def _read_pending(self, path):
        return self._read_unit_list(path, "list of pending restarts")

    def _write_pending(self, path, pending):
        self._write_unit_list(path, pending, "pending")

    def _read_unit_list(self, path, what):
        """The unit names gpunuma kept in ``path`` (a JSON list; [] when there is none); ApplyError naming ``what``
        when the file is not one."""
        data = read_file(path)
        if data is None:
            return []
        try:
            units = bounded.loads_json(data.decode("utf-8"))
        except ValueError:
            units = None
        if not isinstance(units, list) or not all(isinstance(u, str) for u in units):
            raise ApplyError("%s is not gpunuma's %s; move it aside and run again" % (path, what))
        return units

    def _write_unit_list(self, path, units, field):
        """Keep ``units`` in ``path`` (atomically), or remove it when there are none; nothing in check mode."""
        if self.check_mode:
            return
        if not units:
            if read_file(path) is not None:
                self.fs.remove(path)
            return
        entry = normalise_files([{"path": path, "content": json.dumps(sorted(set(units))) + "\n",
                                  "mode": "0644", "backup": False}], field)
        [decision] = plan_files(entry, self.fs)
        if decision["changed"]:
            self.fs.write(decision)

    def run(self, files, absent=(), prune=None, units=None, after_success=(), pending_path=None, backups_keep=5,
            secret_absent=(), account=None, stopped_path=None):
        """Reconcile; on success keep only the newest ``backups_keep`` backups of each file (0: keep all).

        ``secret_absent``: files holding secrets that must go, with every backup of them. ``account``: the account
        the units run as, created when missing (node/accounts.py) before any file is validated or written.
        ``stopped_path``: the list of units stopped for a change in restart mode ``stop`` (node/apply/stop.py)."""
        units, (absent, removal_units, self._absent_stops) = units or {}, normalise_absent(absent)
        if isinstance(backups_keep, bool) or not isinstance(backups_keep, int) or backups_keep < 0:
            raise ApplyError("backups_keep: %r is not allowed; allowed: 0 (keep every backup) or the number of "
                             "backups kept per file" % (backups_keep,))
        decisions = plan_files(files, self.fs)
        after = normalise_files(after_success, "after_success")
        # Planned now: a target that cannot be read stops the run before anything changes.
        after_decisions = plan_files(after, self.fs)
        stops = self._stops_wanted(decisions, self._absent_stops)
        check_stop_units(decisions, units)
        self._ensure_account(account)
        self._validate(decisions)
        if not units.get("start", False):
            pending_path = None  # nothing is restarted, so nothing is pending

        self._clean_temps([os.path.dirname(e["path"]) for e in list(files) + after]
                          + [os.path.dirname(os.path.normpath(p)) for p in absent]
                          + ([prune["unit_dir"]] if prune else [])
                          + ([os.path.dirname(pending_path)] if pending_path else []))
        pending = self._read_pending(pending_path) if pending_path else []

        stale_units, stale_dropins = [], []
        if prune:
            stale_units, stale_dropins = find_stale(prune, set(prune.get("keep_units") or []),
                                                    set(prune.get("keep_dropins") or []))
        try:
            self._stop_before_write(stops, units, stopped_path)
            self._write_all_or_nothing(decisions, pending_path, pending, stale_dropins)
            removed = self._remove_stale(prune, stale_units, stale_dropins, absent, secret_absent)
            self._enable(units)
            self._reload(decisions, units, pending, removed)
        except (ApplyError, OSError) as exc:
            raise self._start_after_error(decisions, exc)
        if not self._start_after_write(decisions, units, stopped_path):
            return self.result
        if not self._restart_and_start(decisions, units, removal_units, removed, stale_dropins, pending, pending_path):
            return self.result
        try:
            self._write(after_decisions)
        except OSError as exc:
            self._undo_writes(after_decisions)
            # The applied plan (and state) and the units stay one transaction.
            self._still_pending = [u for u in pending if u not in self._live]
            self._abandon(decisions, units, os_error_text(exc) + " (writing the applied plan)")
            if pending_path and units.get("start", False):
                self._write_pending(pending_path, self._still_pending)
            self.result["msg"] += "; free the space (or fix the directory) and run again"
            return self.result
        self._tidy(list(files) + after, backups_keep, secret_absent, prune, stale_dropins)
        return self.result

    def _restart_and_start(self, decisions, units, removal_units, removed, stale_dropins, pending, pending_path):
        """The restarts the written files ask for and, with units.start, the instance units; False when one failed."""
        self._live = []
        # Services gpunuma does not own whose drop-in went: restarted when running, to read their settings again.
        lost = [removal_units[os.path.normpath(p)] for p in removed if os.path.normpath(p) in removal_units]
        if not units.get("start", False):
            # Without units to start, only what asked for it restarts: a removed drop-in's unit, and the unit of a
            # changed file in mode if-running (a service gpunuma does not own, such as containerd).
            self._restart_running(lost + [d["unit"] for d in decisions
                                          if d["content_changed"] and d["unit"] and d["restart"] == "if-running"])
            return True
        ok = self._start(decisions, units, stale_dropins + lost, pending)
        if pending_path:
            self._write_pending(pending_path, self._still_pending)
        return ok

    def _ensure_account(self, account):
        if not account:
            return
        try:
            done = accounts.ensure(self.runner, account, self.check_mode)
        except accounts.AccountError as exc:
            raise ApplyError(str(exc))
        self.result["account"] = done
        self.result["changed"] = self.result["changed"] or done["changed"]

    def _write_all_or_nothing(self, decisions, pending_path, pending, stale_dropins):
        """Every file, or none: a failed write (or a controller gone) puts back what was written and stops."""
        # Recorded before the first change: a run that dies before the
        # restarts leaves them to the next run.
        touching = [d["unit"] for d in decisions if d["content_changed"] and d["unit"]] + stale_dropins
        gone = self._gone()
        if gone:
            raise ApplyError("stopped before writing anything: the controller went away (%s)" % gone)
        if pending_path and set(touching) - set(pending):
            self._write_pending(pending_path, pending + touching)
        # Every file first: a write that fails (a full disk, a read-only
        # directory) puts back what this run wrote and stops before anything
        # live changes: no unit stopped, reloaded or restarted.
        try:
            self._write(decisions)
        except OSError as exc:
            undone = self._undo_writes(decisions)
            if pending_path and set(touching) - set(pending):
                self._write_pending(pending_path, pending)
            raise ApplyError("%s; %s, nothing was stopped, reloaded or restarted" % (
                os_error_text(exc), "the %d file(s) written before it were put back" % undone if undone
                else "no file had been written"))
        gone = self._gone()
        if gone:
            undone = self._undo_writes(decisions)
            if pending_path and set(touching) - set(pending):
                self._write_pending(pending_path, pending)
            raise ApplyError("stopped before any live change: the controller went away (%s); the %d file(s) "
                             "written were put back, nothing was stopped, reloaded or restarted" % (gone, undone))

    def _remove_stale(self, prune, stale_units, stale_dropins, absent, secret_absent):
        """Stale instance units stop before their file goes; then every path to remove. Returns the removed."""
        for unit in stale_units:
            self.result["stopped"].append(unit)
            self.result["changed"] = True
            if not self.check_mode:
                self._systemctl("disable", "--now", "--", unit)
        stale_paths = []
        if prune:
            stale_paths = ([os.path.join(prune["unit_dir"], u) for u in stale_units]
                           + [os.path.join(prune["unit_dir"], u + ".d", prune["dropin_name"]) for u in stale_dropins])
        return self._remove(list(absent) + stale_paths + list(secret_absent), secret=set(secret_absent))

    def _reload(self, decisions, units, pending, removed):
        """systemctl daemon-reload when a unit file, a drop-in or a slice's include changed or went."""
        # Any unit file or drop-in, a slice's included (AllowedCPUs= applies on the reload), or a file with a unit.
        # And after an enable (_enable: `systemctl enable --no-reload`), so systemd sees the unit enabled.
        unit_files_changed = any(d["changed"] and (d["unit"] or is_systemd_path(d["path"])) for d in decisions)
        if (unit_files_changed or pending or any(is_systemd_path(p) for p in removed) or self.result["enabled"]) \
                and units.get("daemon_reload", True):
            self.result["daemon_reload"] = True
            if not self.check_mode:
                rc, msg = self._systemctl("daemon-reload")
                if rc != 0:
                    raise ApplyError("systemctl daemon-reload failed: %s" % msg)

    def _tidy(self, entries, backups_keep, secret_absent, prune, stale_dropins):
        """After success only (a failed run's backups are what it rolled back from): prune backups and empty dirs."""
        if backups_keep and not self.check_mode:
            for entry in entries:
                if entry.get("backup", True):
                    self.result["pruned_backups"].extend(self.fs.prune_backups(entry["path"], backups_keep))
        # Backups are for rollback alone: readable by their owner only, older gpunuma's included (fs.py).
        if not self.check_mode:
            for entry in entries:
                if entry.get("backup", True):
                    self.fs.restrict_backups(entry["path"])
        # A secret that goes leaves no copy behind.
        for path in secret_absent:
            if not self.check_mode:
                self.result["pruned_backups"].extend(self.fs.prune_backups(path, 0))
        # A pruned drop-in leaves no backups and, when nothing else is in it, no
        # directory (check mode reports the same, touching nothing).
        for unit in stale_dropins:
            directory = os.path.join(prune["unit_dir"], unit + ".d")
            name = prune["dropin_name"]
            try:
                others = [n for n in os.listdir(directory) if n != name and backup_stamp(name, n) is None]
            except OSError:
                continue
            if self.check_mode:
                if not others:
                    self.result["removed"].append(directory)
                continue
            self.result["pruned_backups"].extend(self.fs.prune_backups(os.path.join(directory, prune["dropin_name"]), 0))
            if not others and self.fs.remove_empty_dir(directory):
                self.result["removed"].append(directory)
