"""Restart mode ``stop`` of ``gpunuma_apply`` (node/apply/reconcile.py): stop before the write, start after, put back when the
unit does not come back.

Some services must not run while their files change: the kubelet refuses to
start on a CPU or Memory Manager checkpoint recorded under another policy,
so a policy change is stop, remove the stale checkpoint, write the config,
start (kubernetes.io, "Changing the CPU Manager Policy"; docs/kubelet.md). A
file (or an ``absent`` path) in mode ``stop`` asks for exactly that:

1. before the first write, each such unit that runs is listed in the
   ``stopped_path`` file (so a run that dies before the start is finished by
   the next one, which starts what is still listed), the files it keeps
   itself (``units.state_files``: the kubelet's checkpoints) are read and,
   with ``units.backup_dir``, copied there, and it is stopped;
2. every file is written and every absent path removed (node/apply/reconcile.py);
3. it is started, must stay active ``settle_seconds`` and answer its
   ``units.readiness`` check (node/apply/units.py's ``_settle``);
4. when it does not come back: its last journal lines are read (its own
   reason for refusing), it is stopped, its files this run wrote go back, the
   paths this run removed are recreated, its state files are put back as
   they were before (bytes, mode and owner, or removed when there were none:
   a checkpoint the refused start wrote would disagree with the old config),
   systemd reloads and it is started again and checked again. The run fails
   saying whether it is healthy again.

A unit that was not running before the run is not started: its files change
and it stays as the node's owner left it (``not_started``). Check mode
reports the stop and the start and touches nothing.
"""

from __future__ import annotations

import os

from ansible.module_utils.gpunuma.node.apply.files import ApplyError, read_file
from ansible.module_utils.gpunuma.node.apply.units import ACTIVE_STATES, _journal, _show


def check_stop_units(decisions, units):
    """A file in restart mode ``stop`` names the unit to stop, never an instance unit (those restart in batches);
    ``units.state_files`` maps a unit to absolute paths and ``units.backup_dir`` is absolute."""
    state_files = units.get("state_files") or {}
    if not isinstance(state_files, dict):
        raise ApplyError("units.state_files: a %s is not allowed; allowed: a mapping of unit to a list of absolute "
                         "paths" % type(state_files).__name__)
    for unit, paths in state_files.items():
        if not isinstance(paths, list) or not all(isinstance(p, str) and os.path.isabs(p) for p in paths):
            raise ApplyError("units.state_files[%s]: %r is not allowed; allowed: a list of absolute paths (the files "
                             "the unit writes itself)" % (unit, paths))
    backup_dir = units.get("backup_dir")
    if backup_dir is not None and not (isinstance(backup_dir, str) and os.path.isabs(backup_dir)):
        raise ApplyError("units.backup_dir: %r is not allowed; allowed: an absolute directory" % (backup_dir,))
    services = set(units.get("services") or [])
    for d in decisions:
        if d["restart"] != "stop":
            continue
        if not d["unit"]:
            raise ApplyError("%s: restart mode stop needs the unit to stop (files[].unit)" % d["path"])
        if d["unit"] in services:
            raise ApplyError("%s: restart mode stop is for a service gpunuma does not own; %s is an instance unit "
                             "(units.services), restarted in batches" % (d["path"], d["unit"]))


class StopSteps:
    """The ``stop`` restart mode, a mixin of :class:`node.apply.reconcile.Apply` (its state: runner, fs, result, check mode)."""

    def _stops_wanted(self, decisions, absent_stops):
        """Units of mode ``stop`` whose file changes or whose absent path is still there, in order."""
        wanted = [d["unit"] for d in decisions if d["content_changed"] and d["restart"] == "stop"]
        wanted += [unit for path, unit in absent_stops.items() if os.path.lexists(path)]
        return list(dict.fromkeys(wanted))

    def _read_stopped(self, path):
        return self._read_unit_list(path, "list of units stopped for a change") if path else []

    def _write_stopped(self, path, units):
        if path:
            self._write_unit_list(path, units, "stopped_file")

    def _stop_before_write(self, wanted, units, stopped_path):
        """Stop each running unit of ``wanted`` once its state files are read (and copied to units.backup_dir)."""
        self._stopped, self._state_before, self._stopped_path = [], {}, stopped_path
        # What the list held when this run began: a run whose list was empty, and which stops nothing, never
        # touches it again.
        self._listed = left = self._read_stopped(stopped_path)
        # Stopped by a run that died before starting them again: started in this run whatever else it does.
        self._resume = [u for u in left if u not in wanted]
        running = []
        for unit in wanted:
            if unit in left or _show(self.runner, unit, ["ActiveState"]).get("ActiveState", "") in ACTIVE_STATES:
                running.append(unit)
            else:
                self.result["not_started"].append(unit)
        if not running:
            return
        self.result["changed"] = True
        self.result["stopped_for_change"] = list(running)
        state_files = units.get("state_files") or {}
        for unit in running:
            for path in state_files.get(unit) or []:
                data = read_file(path)
                self._state_before[path] = (unit, data, os.lstat(path) if data is not None else None)
        if self.check_mode:
            return
        self._write_stopped(stopped_path, left + running)
        self._copy_state(units.get("backup_dir"))
        for unit in running:
            rc, msg = self._systemctl("stop", "--", unit)
            if rc != 0:
                raise ApplyError("systemctl stop %s failed: %s; nothing was written" % (unit, msg))
            self._stopped.append(unit)

    def _copy_state(self, directory):
        """A copy of each state file read before the stop in ``directory`` (one there of a file now absent goes)."""
        if not directory:
            return
        for path, (_unit, data, st) in sorted(self._state_before.items()):
            copy = os.path.join(directory, os.path.basename(path))
            if data is None:
                if read_file(copy) is not None:
                    self.fs.remove(copy)
                continue
            self._recreate(copy, data, st, dir_mode=0o700)

    def _start_after_error(self, decisions, exc):
        """After a failure between the stop and the start: the stopped units' files as they were (written ones put
        back, removed ones recreated) and the units started again; the error, saying so, to raise."""
        stopped = self._stopped
        if not stopped:
            return exc
        self._undo_writes([d for d in decisions if d["unit"] in stopped])
        for path, (data, st) in sorted(self._removed.items()):
            if self._absent_stops.get(os.path.normpath(path)) in stopped:
                self._recreate(path, data, st)
        self._systemctl("daemon-reload")
        started = []
        for unit in stopped:
            rc, _msg = self._systemctl("start", "--", unit)
            started.append(unit if rc == 0 else unit + " (its start failed: look at the node)")
        self._write_stopped(self._stopped_path, self._resume)
        return ApplyError("%s; put back and started again: %s" % (exc, ", ".join(started)))

    def _start_after_write(self, decisions, units, stopped_path):
        """Start the units stopped for the change (and those a dead run left stopped); True when all came back."""
        if self.check_mode:
            self.result["started"].extend(self.result.get("stopped_for_change") or [])
            return True
        batch = list(self._stopped) + [u for u in self._resume if _show(self.runner, u, ["ActiveState"]).get(
            "ActiveState", "") not in ACTIVE_STATES]
        if not batch:
            if self._listed:  # listed units a run left that run again by now
                self._write_stopped(stopped_path, [])
            return True
        self.result["changed"] = True
        failed, states = self._settle(batch, "start", units)
        self.result["started"].extend(u for u in batch if u not in failed)
        if failed:
            self._stop_rollback(decisions, failed, states, units)
        self._write_stopped(stopped_path, [])
        return not failed

    def _stop_rollback(self, decisions, failed, states, units):
        """Put ``failed`` back on the files they ran before this run, start them again, and fail the run."""
        lines = int(units.get("journal_lines", 20))
        journals = {u: _journal(self.runner, u, lines) for u in failed}  # its own reason, before the old config runs
        for unit in failed:
            self._systemctl("stop", "--", unit)
        put = []
        for d in decisions:
            if d["unit"] in failed and d["changed"] and d.get("record"):
                self._put_back(d)
                put.append(d["path"])
        for path, (data, st) in sorted(self._removed.items()):
            if self._absent_stops.get(os.path.normpath(path)) in failed:
                self._recreate(path, data, st)
                put.append(path)
        for path, (unit, data, st) in sorted(self._state_before.items()):
            if unit in failed and read_file(path) != data:
                if data is None:
                    self.fs.remove(path)
                else:
                    self._recreate(path, data, st)
                put.append(path)
        self._systemctl("daemon-reload")
        again, again_states = self._settle(failed, "start", units)
        self.result.update(failed_units=failed, rolled_back=sorted(failed), back_healthy=not again, failed=True)
        text = []
        for unit in failed:
            props = states.get(unit, {})
            text.append("%s did not come back after the change (ActiveState=%s SubState=%s Result=%s%s)" % (
                unit, props.get("ActiveState"), props.get("SubState"), props.get("Result"),
                ("; %s" % props["Refused"]) if props.get("Refused") else ""))
        text.append("put back as they were before this run: %s" % (", ".join(put) or "nothing"))
        for unit in failed:
            if unit in again:
                props = again_states.get(unit, {})
                text.append("%s on its previous files is NOT healthy (ActiveState=%s%s): look at the node now" % (
                    unit, props.get("ActiveState"), ("; %s" % props["Refused"]) if props.get("Refused") else ""))
            else:
                text.append("%s is healthy again on its previous files" % unit)
        for unit in failed:
            text.append("last %d journal lines of %s before the rollback:" % (lines, unit))
            text.extend(journals[unit])
        self.result["msg"] = "\n".join(text)
