"""Reconcile a node's gpunuma files and units in one step (one round trip).

The controller renders every file (units, drop-ins, limits, sysctl, the
applied plan) and hands the whole set to ``gpunuma_apply``, which:

1. validates every changed file first (a command run on a temporary copy):
   one file that fails validation stops the run before any file is written;
2. writes each changed file atomically (temporary file in the same
   directory, then rename), keeping a backup of the file it replaces, and
   removes the files no longer wanted (prune: only files carrying gpunuma's
   marker line);
3. reloads systemd once when a unit or drop-in changed, restarts only the
   units whose file changed (drop-in targets only when running), enables and
   starts the instance units, waits ``settle_seconds`` and checks that every
   unit it started is still active with the same invocation;
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

import grp
import json
import os
import pwd
import stat

from ansible.module_utils.gpunuma.common import bounded
from ansible.module_utils.gpunuma.node.apply_files import (
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

ACTIVE_STATES = ("active", "activating", "reloading")


def _http_get(url, timeout):
    """(True, status) for an HTTP 2xx answer, else (False, what happened)."""
    from urllib.error import HTTPError, URLError
    from ansible.module_utils.urls import open_url
    try:
        # The operator's own readiness URL: no proxy, redirects followed, certificates checked.
        with open_url(url, timeout=timeout, use_proxy=False) as answer:
            return 200 <= answer.status < 300, "HTTP %d" % answer.status
    except HTTPError as exc:
        return False, "HTTP %d" % exc.code
    except (URLError, OSError, ValueError) as exc:
        return False, str(getattr(exc, "reason", exc))


def _show(runner, unit, props):
    rc, out, _unused = runner(["systemctl", "show", "--property=" + ",".join(props), "--", unit])
    values = {}
    for line in (out or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key] = value
    return values


def _journal(runner, unit, lines):
    rc, out, err = runner(["journalctl", "--no-pager", "--output=short-iso", "--lines", str(lines), "--unit", unit])
    return (out or err or "").splitlines()


# A readiness command runs with the account of the instance it checks (its
# unit's User=/Group= as systemd reports them), never with more: anything the
# service account can write must not run as root. util-linux's setpriv(1)
# switches the ids and initialises the supplementary groups.
SETPRIV = "setpriv"


def readiness_argv(command, user, group):
    """The argv that runs readiness ``command`` as the unit's ``user``/``group``.

    ``user`` empty, ``root`` or ``0`` (the unit runs as root): the command as
    given. Otherwise ``setpriv --reuid --regid --init-groups --reset-env``;
    ``group`` empty means the user's primary group. An account the node does
    not know raises ApplyError (never falls back to root).
    """
    command = list(command)
    user = (user or "").strip()
    if user in ("", "root", "0"):
        return command
    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except (KeyError, ValueError, OverflowError):
        raise ApplyError("the readiness command runs as the unit's User=%s, which this node does not know; "
                         "it is never run as root instead" % user)
    gid = entry.pw_gid
    group = (group or "").strip()
    if group:
        try:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        except (KeyError, ValueError, OverflowError):
            raise ApplyError("the readiness command runs as the unit's Group=%s, which this node does not know; "
                             "it is never run as root instead" % group)
    return [SETPRIV, "--reuid=%d" % entry.pw_uid, "--regid=%d" % gid, "--init-groups", "--reset-env", "--"] + command


class Apply:
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
                       "enabled": [], "stopped": [], "failed_units": [], "rolled_back": [], "diff": [],
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
                    entry["path"], " ".join(entry["validate"]), (err or out or "").strip() or "rc %d" % rc))
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
        data = read_file(path)
        if data is None:
            return []
        try:
            pending = bounded.loads_json(data.decode("utf-8"))
        except ValueError:
            pending = None
        if not isinstance(pending, list) or not all(isinstance(u, str) for u in pending):
            raise ApplyError("%s is not gpunuma's list of pending restarts; move it aside and run again" % path)
        return pending

    def _write_pending(self, path, pending):
        if self.check_mode:
            return
        if not pending:
            if read_file(path) is not None:
                self.fs.remove(path)
            return
        entry = normalise_files([{"path": path, "content": json.dumps(sorted(set(pending))) + "\n",
                                  "mode": "0644", "backup": False}], "pending")
        [decision] = plan_files(entry, self.fs)
        if decision["changed"]:
            self.fs.write(decision)

    def run(self, files, absent=(), prune=None, units=None, after_success=(), pending_path=None, backups_keep=5,
            secret_absent=()):
        """Reconcile; on success keep only the newest ``backups_keep`` backups of each file (0: keep all).

        ``secret_absent``: files holding secrets that must go, with every backup of them."""
        units = units or {}
        absent, removal_units = normalise_absent(absent)
        if isinstance(backups_keep, bool) or not isinstance(backups_keep, int) or backups_keep < 0:
            raise ApplyError("backups_keep: %r is not allowed; allowed: 0 (keep every backup) or the number of "
                             "backups kept per file" % (backups_keep,))
        decisions = plan_files(files, self.fs)
        self._validate(decisions)
        after = normalise_files(after_success, "after_success")
        # Planned now: a target that cannot be read stops the run before anything changes.
        after_decisions = plan_files(after, self.fs)
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
        # Stale instance units stop before their file goes.
        for unit in stale_units:
            self.result["stopped"].append(unit)
            self.result["changed"] = True
            if not self.check_mode:
                self._systemctl("disable", "--now", "--", unit)
        stale_paths = []
        if prune:
            stale_paths = ([os.path.join(prune["unit_dir"], u) for u in stale_units]
                           + [os.path.join(prune["unit_dir"], u + ".d", prune["dropin_name"]) for u in stale_dropins])
        removed = self._remove(list(absent) + stale_paths + list(secret_absent), secret=set(secret_absent))
        # Any unit file or drop-in, a slice's included (AllowedCPUs= applies on the reload), or a file with a unit.
        unit_files_changed = any(d["changed"] and (d["unit"] or is_systemd_path(d["path"])) for d in decisions)
        if (unit_files_changed or pending or any(is_systemd_path(p) for p in removed)) \
                and units.get("daemon_reload", True):
            self.result["daemon_reload"] = True
            if not self.check_mode:
                rc, msg = self._systemctl("daemon-reload")
                if rc != 0:
                    raise ApplyError("systemctl daemon-reload failed: %s" % msg)

        self._live = []
        # Services gpunuma does not own whose drop-in went: restarted when running, to read their settings again.
        lost = [removal_units[os.path.normpath(p)] for p in removed if os.path.normpath(p) in removal_units]
        if not units.get("start", False):
            # Without units to start, only what asked for it restarts: a removed drop-in's unit, and the unit of a
            # changed file in mode if-running (a service gpunuma does not own, such as containerd).
            self._restart_running(lost + [d["unit"] for d in decisions
                                          if d["content_changed"] and d["unit"] and d["restart"] == "if-running"])
        if units.get("start", False):
            ok = self._start(decisions, units, stale_dropins + lost, pending)
            if pending_path:
                self._write_pending(pending_path, self._still_pending)
            if not ok:
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
        # Only after success: a failed run's backups are what it rolled back from.
        if backups_keep and not self.check_mode:
            for entry in list(files) + after:
                if entry.get("backup", True):
                    self.result["pruned_backups"].extend(self.fs.prune_backups(entry["path"], backups_keep))
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
        return self.result

    def _start(self, decisions, units, unbound, pending=()):
        services = list(units.get("services") or [])
        changed_units = [d for d in decisions if d["content_changed"] and d["unit"]]
        self._still_pending = []
        to_restart = []
        always = set()
        for d in changed_units:
            if d["restart"] == "never":
                continue
            if d["unit"] in services and d["restart"] == "changed":
                if d["existed"]:
                    to_restart.append(d["unit"])
                    always.add(d["unit"])
            else:
                to_restart.append(d["unit"])  # a drop-in's target, or if-running: restarted only when running
        for unit in unbound:
            to_restart.append(unit)
        # Left by a run that died before restarting them: restarted when running.
        to_restart.extend(pending)
        restart = []
        for unit in dict.fromkeys(to_restart):
            if unit not in always:
                state = _show(self.runner, unit, ["ActiveState"]).get("ActiveState", "")
                if state not in ACTIVE_STATES:
                    continue
            restart.append(unit)
        self.result["restarted"] = list(restart)
        start = []
        for unit in services:
            props = _show(self.runner, unit, ["ActiveState", "UnitFileState"])
            if props.get("UnitFileState") not in ("enabled", "enabled-runtime", "static", "alias"):
                self.result["enabled"].append(unit)
                if not self.check_mode:
                    self._systemctl("enable", "--", unit)
            if unit not in restart and props.get("ActiveState") not in ACTIVE_STATES:
                start.append(unit)
        self.result["started"] = list(start)
        if restart or start or self.result["enabled"]:
            self.result["changed"] = True
        if self.check_mode:
            return True
        # Rolling: changed running instances restart a batch at a time, each
        # batch settled before the next; a failed batch stops the rest, whose
        # new files are put back (they never ran).
        size = max(1, int(units.get("restart_batch") or 1))
        batches = [restart[i:i + size] for i in range(0, len(restart), size)]
        if start:
            batches.append(start)
        for index, batch in enumerate(batches):
            gone = self._gone() if index else None
            if gone:
                # Nobody is left to watch the rest: the node goes back to what it ran before this run.
                self._still_pending = [u for u in pending if u not in self._live]
                self._abandon(decisions, units, "the controller went away (%s)" % gone)
                self.result["controller_gone"] = gone
                return False
            verb = "start" if (start and index == len(batches) - 1) else "restart"
            self._live.extend(batch)
            failed, states = self._settle(batch, verb, units)
            if failed:
                later = [u for rest in batches[index + 1:] for u in rest if u in restart]
                self._rollback(decisions, failed, states, units, later)
                # Never restarted and not put back to the file their process
                # runs: still pending for the next run.
                self._still_pending = [u for u in later if u in pending or u not in self.result["rolled_back"]]
                return False
        return True

    def _restart_running(self, units):
        """Restart each of ``units`` that runs (check mode: report it); a failure fails the run naming the unit."""
        for unit in dict.fromkeys(units):
            if _show(self.runner, unit, ["ActiveState"]).get("ActiveState", "") not in ACTIVE_STATES:
                continue
            self.result["restarted"].append(unit)
            self.result["changed"] = True
            if not self.check_mode:
                rc, msg = self._systemctl("restart", "--", unit)
                if rc != 0:
                    raise ApplyError("systemctl restart %s failed: %s" % (unit, msg))

    def _gone(self):
        """Why the controller went away, or None (check mode never asks)."""
        return None if self.check_mode else self.alive()

    def _abandon(self, decisions, units, why):
        """Put the node back on the files it ran before this run, after live changes began.

        Every file this run wrote goes back (backup, previous bytes, or removed when new), every file it removed
        is recreated with its mode and owner, systemd reloads once, the units this run restarted restart on
        their previous files, new services it started are stopped, and pruned units are enabled and started
        again. The result fails, naming ``why`` and what was put back.
        """
        services = set(units.get("services") or [])
        put, problems = [], []
        for d in decisions:
            if d["changed"] and d.get("record"):
                try:
                    self._put_back(d)
                    put.append(d)
                except OSError as exc:
                    problems.append(os_error_text(exc))
        for path, (data, st) in sorted(self._removed.items()):
            try:
                self.fs.write({"path": path, "data": data, "before": None, "backup": False,
                               "mode": stat.S_IMODE(st.st_mode), "owner": None, "group": None, "dir_mode": None})
                os.chown(path, st.st_uid, st.st_gid)
            except OSError as exc:
                problems.append(os_error_text(exc))
        self._systemctl("daemon-reload")
        new_services = {d["unit"] for d in put if not d["existed"] and d["unit"] in services}
        for unit in dict.fromkeys(self._live):
            if unit in new_services:
                self._systemctl("disable", "--now", "--", unit)
            else:
                self._systemctl("restart", "--", unit)
        for unit in self.result["stopped"]:
            self._systemctl("enable", "--now", "--", unit)
        self.result["rolled_back"] = sorted(set(d["unit"] for d in put if d["unit"]) | set(self.result["stopped"]))
        self.result["failed"] = True
        self.result["msg"] = "stopped: %s; the node is back on the files it ran before this run (%d put back, " \
            "%d recreated; restarted again: %s)%s" % (
                why, len(put), len(self._removed), ", ".join(dict.fromkeys(self._live)) or "none",
                ("; could not put back: " + "; ".join(problems)) if problems else "")

    def _settle(self, batch, verb, units):
        """(Re)start batch, wait settle_seconds, and return (failed units, their states)."""
        refused = {}
        for unit in batch:
            rc, msg = self._systemctl(verb, "--", unit)
            if rc != 0:
                refused[unit] = msg
        invocations = {u: _show(self.runner, u, ["InvocationID"]).get("InvocationID", "") for u in batch}
        settle = int(units.get("settle_seconds", 5))
        if settle > 0:
            self.sleep(settle)
        failed, states = [], {}
        for unit in batch:
            # User/Group: the account a readiness command runs as (readiness_argv), read in the same call.
            props = _show(self.runner, unit, ["ActiveState", "SubState", "Result", "InvocationID", "NRestarts",
                                              "User", "Group"])
            states[unit] = props
            if unit in refused:
                props["Refused"] = refused[unit]
            if unit in refused or props.get("ActiveState") != "active" \
                    or props.get("InvocationID", "") != invocations[unit]:
                failed.append(unit)
        for unit in batch:
            spec = (units.get("readiness") or {}).get(unit)
            if unit in failed or not spec:
                continue
            answer = self._wait_ready(spec, states[unit].get("User"), states[unit].get("Group"))
            if answer is not None:
                states[unit]["Refused"] = "not ready: %s" % answer
                failed.append(unit)
        return failed, states

    def _wait_ready(self, spec, user=None, group=None):
        """None once the instance answers its readiness check, else the last answer after the timeout.

        A ``command`` runs as the unit's ``user``/``group`` (readiness_argv).
        """
        timeout, interval = int(spec.get("timeout", 300)), int(spec.get("interval", 5))
        waited = 0
        last = "no answer"
        argv = None
        if not spec.get("url"):
            try:
                argv = readiness_argv(spec["command"], user, group)
            except ApplyError as exc:
                return str(exc)
        while True:
            if spec.get("url"):
                ok, last = self.http_get(spec["url"], min(interval, 10))
            else:
                rc, out, err = self.runner(argv)
                ok = rc == 0
                last = "%s exited %s%s" % (spec["command"][0], rc, (": " + (err or out).strip()[:200]) if (err or out) else "")
            if ok:
                return None
            if waited >= timeout:
                return "%s after %d s (%s)" % (spec.get("url") or " ".join(spec["command"]), waited, last)
            self.sleep(interval)
            waited += interval

    def _rollback(self, decisions, failed, states, units, pending=()):
        self.result["failed_units"] = failed
        self.result["not_restarted"] = list(pending)
        rollback = units.get("rollback_on_failure", True)
        rolled = []
        if rollback:
            for d in decisions:
                if not (d["content_changed"] and (d["unit"] in failed or d["unit"] in pending)):
                    continue
                if not d["existed"] and d["unit"] in (units.get("services") or []):
                    self._systemctl("disable", "--now", "--", d["unit"])
                self._put_back(d)
                rolled.append(d)
            if rolled:
                self._systemctl("daemon-reload")
                for d in rolled:
                    if d["unit"] in pending:
                        continue  # never restarted: it still runs its previous file
                    if d["existed"] or d["unit"] not in (units.get("services") or []):
                        self._systemctl("restart", "--", d["unit"])
        self.result["rolled_back"] = sorted(set(d["unit"] for d in rolled))
        lines = ["instance units failed to start: " + ", ".join(failed)]
        if rollback and rolled:
            lines.append("rolled back to their previous files (or removed when new): "
                         + ", ".join(self.result["rolled_back"]))
        elif not rollback:
            lines.append("not rolled back (numa_binding_rollback_on_failure is false)")
        if pending:
            lines.append("not restarted (the rolling restart stopped at the failure; their previous files are %s): %s"
                         % ("back" if rollback else "NOT back", ", ".join(pending)))
        for unit in failed:
            props = states.get(unit, {})
            lines.append("%s: ActiveState=%s SubState=%s Result=%s NRestarts=%s%s" % (
                unit, props.get("ActiveState"), props.get("SubState"), props.get("Result"), props.get("NRestarts"),
                (" (systemctl: %s)" % props["Refused"]) if props.get("Refused") else ""))
        for unit in failed:
            lines.extend(_journal(self.runner, unit, int(units.get("journal_lines", 20))))
        self.result["failed"] = True
        self.result["msg"] = "\n".join(lines)
