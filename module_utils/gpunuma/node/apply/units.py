"""The unit steps of ``gpunuma_apply`` (node/apply/reconcile.py): start, restart in batches, settle, readiness, abandon and
roll back, and the readiness command's account switch."""

from __future__ import annotations

import grp
import os
import pwd
import stat

from ansible.module_utils.gpunuma.node import systemctl
from ansible.module_utils.gpunuma.node.apply.files import ApplyError, os_error_text

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
    return systemctl.show(runner, [unit], props)[2].get(unit, {})


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


class UnitSteps:
    """The unit half of :class:`node.apply.reconcile.Apply` (its state: runner, sleep, result, check mode)."""

    def _to_restart(self, decisions, services, unbound, pending):
        """Units to restart, in order: changed instances that ran before, and running units whose files changed."""
        changed_units = [d for d in decisions if d["content_changed"] and d["unit"]]
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
        return restart

    def _enable(self, units):
        """Before the reload: read the services' states (one call) and enable those that are not, without the reload
        ``systemctl enable`` makes of its own (``--no-reload``): the run's one ``daemon-reload`` follows (node/apply/reconcile.py
        forces it when a unit was enabled). A new unit file is loaded from disk when asked about, and writing a unit's
        file leaves its enablement as it was, so the states read before the reload are the states after it."""
        services = list(units.get("services") or []) if units.get("start", False) else []
        self._service_states = systemctl.show(self.runner, services, ["ActiveState", "UnitFileState", "NRestarts"])[2]
        # A running instance systemd restarted by itself (Restart=) since it was last started may be crash-looping
        # after it settled: said on every run, never taken for a healthy one (docs/roles.md, "Settle").
        self.result["restarted_by_systemd"] = dict(
            (u, int(st["NRestarts"])) for u, st in ((u, self._service_states.get(u) or {}) for u in services)
            if str(st.get("NRestarts", "")).isdigit() and int(st["NRestarts"]) > 0)
        self.result["enabled"] = [u for u in services if (self._service_states.get(u) or {}).get("UnitFileState")
                                  not in ("enabled", "enabled-runtime", "static", "alias")]
        if self.result["enabled"] and not self.check_mode:
            # Without the run's reload (units.daemon_reload false), enable's own reload.
            quiet = ["--no-reload"] if units.get("daemon_reload", True) else []
            self._systemctl("enable", *(quiet + ["--"] + self.result["enabled"]))

    def _start(self, decisions, units, unbound, pending=()):
        services = list(units.get("services") or [])
        self._still_pending = []
        restart = self._to_restart(decisions, services, unbound, pending)
        self.result["restarted"] = list(restart)
        # States read before the reload (_enable): a reload changes no unit's ActiveState.
        start = [u for u in services if u not in restart
                 and (self._service_states.get(u) or {}).get("ActiveState") not in ACTIVE_STATES]
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
                self._recreate(path, data, st)
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

    def _recreate(self, path, data, st, dir_mode=None):
        """Write ``data`` to ``path`` with the mode and owner of ``st`` (a file this run removed or replaced, as it
        was; a new directory gets ``dir_mode``)."""
        self.fs.write({"path": path, "data": data, "before": None, "backup": False, "mode": stat.S_IMODE(st.st_mode),
                       "owner": None, "group": None, "dir_mode": dir_mode})
        os.chown(path, st.st_uid, st.st_gid)

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
