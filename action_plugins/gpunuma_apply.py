# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The action of gpunuma_apply. It runs the module and journals the call as its readers' action does
(action_plugins/gpunuma_node_info.py), and carries two things of a provisioning run on the apply step's round trip
(docs/architecture.md, "The converge record"):

``record`` (``facts``, ``controller_files``, ``release_lock``): the converge record, kept by the module once every
unit settled (module_utils/gpunuma/run/converge_node.py). Its inputs and reads are the run's (this host's converge
check and journal, converge.record_request), its writes the journal's and this step's own. Not in check mode.

``controller_copies`` (``path``, ``content``, ``mode``): files of the controller written once the node applied (the
controller's copy of the applied plan), the way gpunuma_copy writes them; the record holds the state each will have.
Check mode writes none of them and reports (and with --diff shows) what would change.
"""

from __future__ import annotations

import hashlib
import os
import stat

import ansible.module_utils
from ansible import constants as C
from ansible.plugins.action.normal import ActionModule as NormalAction
from ansible.utils.display import Display

# Controller-side plugins do not get the configured module_utils path on
# ansible.module_utils (only modules shipped to a node do); add it so the
# core is imported exactly as modules import it.
for _path in C.DEFAULT_MODULE_UTILS_PATH or []:
    if _path not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(_path)

from ansible.module_utils.gpunuma.node.apply.files import (  # noqa: E402
    ApplyError, file_diff, normalise_files, os_error_text, plan_files, quiet_state_diff)
from ansible.module_utils.gpunuma.node.apply.fs import NodeFiles  # noqa: E402
from ansible.module_utils.gpunuma.run import converge  # noqa: E402
from ansible.module_utils.gpunuma.run import topology_store


display = Display()


def state_after(decision):
    """converge.file_state of a controller copy once written: the file as it is when unchanged; else its content,
    its mode, and the owner a new file gets (this process's, the directory's group when that is set-group-ID)."""
    if not decision["changed"]:
        return converge.file_state(decision["path"])
    directory = os.path.dirname(decision["path"])
    try:
        dir_stat = os.stat(directory)
        gid = dir_stat.st_gid if dir_stat.st_mode & stat.S_ISGID else os.getegid()
    except OSError:
        gid = os.getegid()
    return {"sha256": hashlib.sha256(decision["data"]).hexdigest(), "mode": "%04o" % decision["mode"],
            "uid": os.geteuid(), "gid": gid}


class ActionModule(NormalAction):
    def run(self, tmp=None, task_vars=None):
        args = dict(self._task.args)
        record = args.pop("record", None)
        copies = args.pop("controller_copies", None) or []
        if record is None and not copies:
            return converge.journal_call(self, super().run(tmp, task_vars), task_vars)
        try:
            decisions = plan_files(normalise_files([dict(c, backup=False) for c in copies], "controller_copies"),
                                   NodeFiles())
        except ApplyError as exc:
            return {"failed": True, "changed": False, "msg": str(exc)}
        seal_path = None
        if record is not None and not self._task.check_mode:
            files = topology_store.host_controller_files(
                task_vars, self._templar.copy_with_new_env(available_variables=task_vars))
            seal_path = files and files["seal"]
            controller = dict((p, converge.file_state(p)) for p in record.get("controller_files") or [])
            controller.update((d["path"], state_after(d)) for d in decisions)
            request, why = converge.record_request(task_vars, record.get("path") or converge.DEFAULT_PATH,
                                                   record.get("facts"), controller, [converge.write_summary(args)])
            # The lease is the run's last on this node only when a record ends the run here.
            args["record"] = dict(request, release_lock=bool(record.get("release_lock")) and not why)
        self._task.args = args
        result = converge.journal_call(self, super().run(tmp, task_vars), task_vars)
        if record is not None and not self._task.check_mode:
            result["converge_record"] = dict(result.get("converge_record") or {}, why=why)
        if result.get("failed") or result.get("unreachable"):
            return result
        result = self.write_copies(result, decisions)
        answer = result.get("converge_record") or {}
        if seal_path and not result.get("failed") and "recorded" in answer:
            # The node kept this request's record (sealed as asked) or removed its record (no seal). A step that
            # failed left the node's record as it was, and its seal with it.
            failed = converge.keep_seal(seal_path, converge.request_seal(request) if answer["recorded"] else None)
            if failed:
                return dict(result, **failed)
        return result

    def write_copies(self, result, decisions):
        fs = NodeFiles()
        result["controller_copies"] = []
        if self._task.diff:
            result.setdefault("diff", [])
            if isinstance(result["diff"], dict):
                result["diff"] = [result["diff"]]
            copies = [file_diff(d["path"], d["before"], d["data"]) for d in decisions if d["changed"]]
            result["diff"] += copies if display.verbosity >= 1 else [quiet_state_diff(d) for d in copies]
        for d in decisions:
            entry = {"path": d["path"], "changed": d["changed"]}
            result["controller_copies"].append(entry)
            result["changed"] = result.get("changed") or d["changed"]
            if d["changed"] and not self._task.check_mode:
                try:
                    fs.write(d)
                except OSError as exc:
                    if not exc.filename:
                        exc.filename = d["path"]
                    return dict(result, failed=True, msg="the node applied; the controller's copy: %s"
                                % os_error_text(exc))
        return result
