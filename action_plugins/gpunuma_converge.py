# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The converge step's controller side (docs/architecture.md, "The converge record").

``state: checked`` digests the run's inputs here (the host's gpunuma variables templated, its groups, the code of
the roles, modules, plugins and policies), asks the node in one round trip whether it is what the last recorded run
left (the gpunuma_converge module), compares the controller's copies, and returns ``converged`` with the recorded
facts, or the reasons it is not. ``state: recorded`` sends the run's journal (the reads and writes the node modules
added) with the inputs digested at the check; the node reads itself again after the run and keeps the record.
"""

from __future__ import annotations

import os

import ansible.module_utils
from ansible import constants as C
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible.utils.vars import load_extra_vars

# Controller-side plugins do not get the configured module_utils path on
# ansible.module_utils (only modules shipped to a node do); add it so the
# core is imported exactly as modules import it.
for _path in C.DEFAULT_MODULE_UTILS_PATH or []:
    if _path not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(_path)

from ansible.module_utils.gpunuma.common import layout, node_paths  # noqa: E402
from ansible.module_utils.gpunuma.run import converge  # noqa: E402
from ansible.module_utils.gpunuma.run import topology_store  # noqa: E402

# The variables a run decides from: every variable of gpunuma's roles and playbooks.
PREFIXES = ("gpunuma_", "gpu_topology_", "numa_binding_", "memlock_", "autonuma_", "kubelet_", "policy_gate_",
            "node_checks_")
# Those that steer the run, not what it decides for a node, and the run's own bookkeeping.
RUN_CONTROL = ("gpunuma_target", "gpunuma_serial", "gpunuma_max_fail_percentage", "gpunuma_lock_timeout",
               "gpunuma_lock_ttl", "gpunuma_lock_break", "gpunuma_converge_check", converge.JOURNAL_READS,
               converge.JOURNAL_WRITES, "gpunuma_converge_inputs")
# The code a run executes, relative to this plugin's project or collection root.
CODE = ("roles", "library", "module_utils", "filter_plugins", "action_plugins", "policies", "playbooks", "plugins")
FACT = converge.INPUTS_FACT
display = Display()


_CODE_DIGEST = {}


def code_digest():
    root = layout.plugin_root(__file__)
    if root not in _CODE_DIGEST:
        _CODE_DIGEST[root] = converge.code_digest(root, [n for n in CODE if os.path.exists(os.path.join(root, n))])
    return _CODE_DIGEST[root]


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("state", "path", "facts", "controller_files", "release_lock"))
    _supports_check_mode = True

    def inputs(self, task_vars, templar):
        """``{name: digest}`` of this host's inputs, each templated by ``templar`` (bound to ``task_vars``)."""
        values = {}
        defaults = self.role_defaults()
        for name in sorted(task_vars):
            if not name.startswith(PREFIXES) or name in RUN_CONTROL:
                continue
            if name in defaults and task_vars[name] == defaults[name]:
                continue  # a role's default, left as it is: the code's digest covers it
            try:
                values[name] = templar.template(task_vars[name])
            except Exception as exc:  # an input that does not template: its text, and the run reports it
                values[name] = "%r (%s)" % (task_vars[name], type(exc).__name__)
        values["group_names"] = sorted(task_vars.get("group_names") or [])
        values["inventory_hostname"] = task_vars.get("inventory_hostname")
        values["ansible_version"] = (task_vars.get("ansible_version") or {}).get("full")
        # -e values win over everything and name the profile's source (extra-vars): their names count.
        try:
            extra = load_extra_vars(self._loader) or {}
        except Exception:  # no command line (the plugin driven by tests)
            extra = {}
        values["extra_vars"] = sorted(name for name in extra if name.startswith(PREFIXES))
        return converge.input_digests(values, code_digest())

    def role_defaults(self):
        """``{name: raw value}`` of the defaults of the roles the play imports (an imported role's defaults are
        the play's variables, at the lowest precedence): a variable still at its default is no input of the
        user's."""
        try:
            roles = self._task.get_play().get_roles()
        except AttributeError:  # no play (the plugin driven by tests)
            return {}
        out = {}
        for role in roles:
            out.update(role.get_default_vars())
        return out

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        args = self._task.args
        state = args.get("state", "checked")
        path = args.get("path") or converge.DEFAULT_PATH
        if state not in ("checked", "recorded"):
            return dict(result, failed=True, msg="state must be checked or recorded, got %r" % state)
        if state == "checked":
            return self.check(result, task_vars, path, converge.skip_reason(task_vars))
        return self.record(result, task_vars, path)

    def check(self, result, task_vars, path, why):
        result = self.checked(result, task_vars, path, why)
        # The result holds the inputs' digests (some of values the inventory may keep in a vault): never dumped at
        # -v; what -v shows is the verdict and its reasons.
        result["_ansible_verbose_override"] = True
        host = task_vars.get("inventory_hostname")
        if result.get("converged"):
            display.v("%s: %s" % (host, result["msg"]))
        else:
            display.v("%s: the whole run: %s" % (host, "; ".join(result.get("reasons") or [])))
        return result

    def checked(self, result, task_vars, path, why):
        result.update(changed=False, converged=False, gpunuma_round_trips=0)
        if why:
            return dict(result, reasons=[why])
        templar = self._templar.copy_with_new_env(available_variables=task_vars)
        inputs = self.inputs(task_vars, templar)
        result["ansible_facts"] = {FACT: inputs}
        files = topology_store.host_controller_files(task_vars, templar)
        if files is None:
            return dict(result, reasons=["the host's controller files cannot be told (gpu_topology_controller_dir)"])
        if not os.path.lexists(files["plan"]):
            # Every record holds the state of this copy: without it no record can match, so the node is not asked.
            return dict(result, reasons=["no controller copy of the host's applied plan (%s): not converged from "
                                         "this controller" % files["plan"]])
        seal = converge.read_seal(files["seal"])
        if seal is None:
            # The node's record is replayed only as this controller asked for it: without the seal, never.
            return dict(result, reasons=["no controller seal of the node's converge record (%s): not converged "
                                         "from this controller" % files["seal"]])
        module_args = {"state": "checked", "path": path, "inputs": inputs, "seal": seal,
                       "lock_path": templar.template(task_vars.get("gpunuma_lock_path") or node_paths.LOCK)}
        answer = self._execute_module(module_name="gpunuma_converge", module_args=module_args, task_vars=task_vars)
        result["gpunuma_round_trips"] = 1
        if answer.get("unreachable"):
            return dict(result, **answer)
        if answer.get("failed"):
            # Never fatal: the whole provisioning runs and meets (and reports) the node's problem itself.
            return dict(result, reasons=["the converge check failed: %s" % answer.get("msg", "unknown error")])
        reasons = list(answer.get("reasons") or [])
        for cpath, recorded in sorted((answer.get("controller") or {}).items()):
            if converge.file_state(cpath) != recorded:
                reasons.append("the controller's %s differs from the last converge's" % cpath)
        result.update(converged=not reasons, reasons=reasons)
        if not reasons:
            # What the last converge recorded (the plan, the profile), as facts: the summaries read them under
            # ansible_facts, which holds them whether or not facts are injected as variables.
            facts = dict(answer.get("facts") or {})
            facts.update({FACT: inputs, "gpunuma_provisioned": True})
            result["ansible_facts"] = facts
            result["msg"] = "the node is as the last converge left it; nothing to do"
        return result

    def record(self, result, task_vars, path):
        result.update(changed=False, recorded=False, gpunuma_round_trips=0)
        controller = dict((p, converge.file_state(p)) for p in self._task.args.get("controller_files") or [])
        module_args, why = converge.record_request(task_vars, path, self._task.args.get("facts"), controller)
        release_lock = self._task.args.get("release_lock")
        if release_lock:
            module_args["release_lock"] = release_lock
        files = None if self._task.check_mode else topology_store.host_controller_files(
            task_vars, self._templar.copy_with_new_env(available_variables=task_vars))
        seal_path = files and files["seal"]
        answer = self._execute_module(module_name="gpunuma_converge", module_args=module_args, task_vars=task_vars)
        result["gpunuma_round_trips"] = 1
        if answer.get("failed") or answer.get("unreachable"):
            return dict(result, **answer)
        failed = seal_path and converge.keep_seal(
            seal_path, converge.request_seal(module_args) if answer.get("recorded") else None)
        if failed:
            return dict(result, **failed)
        reasons = ([why] if why else []) + list(answer.get("reasons") or [])
        result.update(recorded=bool(answer.get("recorded")), reasons=reasons,
                      lock_released=bool(answer.get("lock_released")))
        return result
