# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A controller-side module run in the action's own process.

gpunuma's planning, policy and controller-copy modules need nothing of a
node: they read their arguments (and files on the controller), return a
document or write a controller file. Delegated to localhost, Ansible would
still start a new Python for each host's call (at 10 hosts on two cores a
task cost 2.2-4.4 s). Their action (``action_plugins/gpu_binding_plan.py``)
calls the module's own ``run(module)`` here instead, with
:class:`ControllerModule` in place of ``AnsibleModule``: the same argument
spec and constraints checked by the same validator, the same messages,
``fail_json``/``exit_json``/``warn``, check mode and diff, and no_log values
masked the same way. One module, two places it can run, deciding alike in
both (``tests/integration/test_on_controller.py`` runs the same calls both
ways and compares them).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime
import json
import traceback

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.parameters import remove_values
from ansible.module_utils.errors import UnsupportedError

# AnsibleModule's keyword arguments a validator takes (supports_check_mode is the module's promise, not a check).
_CONSTRAINTS = ("mutually_exclusive", "required_together", "required_one_of", "required_if", "required_by")


def _iso(value):
    # What Ansible sends a module for a YAML date or time (an unquoted 2026-12-31 in an inventory): ISO 8601 text.
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    raise TypeError("%s is not JSON data" % type(value).__name__)


def plain_args(args):
    """``args`` as a module shipped to a node receives them: JSON data (dates as ISO text), no templating types,
    no shared references. TypeError or ValueError when they are not JSON data (the caller then runs the module)."""
    return json.loads(json.dumps(args, default=_iso))


class ModuleDone(Exception):
    """exit_json or fail_json was called: ``result`` is what the module returns."""

    def __init__(self, result):
        super(ModuleDone, self).__init__(result.get("msg", ""))
        self.result = result


class ControllerModule:
    """The part of ``AnsibleModule`` gpunuma's controller-side modules use, for a call in this process."""

    def __init__(self, module_spec, args, check_mode=False, name="module", diff=False, verbosity=0,
                 inject_invocation=True):
        """``args``: the task's arguments as JSON data (:func:`plain_args`, which the action already applied);
        ``verbosity``: the run's -v count, as AnsibleModule's ``_verbosity``; ``inject_invocation``: whether the
        result carries ``invocation`` (ansible-core 2.21's INJECT_INVOCATION; always before it)."""
        validator = ArgumentSpecValidator(module_spec["argument_spec"],
                                          **dict((key, module_spec[key]) for key in _CONSTRAINTS if key in module_spec))
        validation = validator.validate(args)
        self._no_log = set(validation._no_log_values)
        self._warnings = []
        self.check_mode = bool(check_mode)
        self._diff = bool(diff)
        self._verbosity = int(verbosity or 0)
        self._inject_invocation = bool(inject_invocation)
        self.params = validation.validated_parameters
        if validation.errors.errors:  # the collection of errors is true even when it holds none
            msg = validation.errors.msg
            if isinstance(validation.errors.errors[0], UnsupportedError):
                msg = "Unsupported parameters for (%s) module: %s" % (name, msg)
            self.fail_json(msg=msg)

    def warn(self, warning):
        self._warnings.append(warning)

    def _result(self, values):
        out = remove_values(values, self._no_log)
        if self._inject_invocation:
            out["invocation"] = {"module_args": remove_values(self.params, self._no_log)}
        out.setdefault("changed", False)
        if self._warnings:
            out["warnings"] = list(self._warnings)
        return out

    def exit_json(self, **values):
        raise ModuleDone(self._result(values))

    def fail_json(self, msg, **values):
        values.update(failed=True, msg=msg)
        raise ModuleDone(self._result(values))


def run_module(module_spec, run, args, check_mode=False, name="module", diff=False, verbosity=0,
               inject_invocation=True):
    """The result of ``run(module)`` (the module's body) for ``args`` (JSON data: :func:`plain_args`), called in
    this process."""
    try:
        run(ControllerModule(module_spec, args, check_mode, name, diff, verbosity, inject_invocation))
    except ModuleDone as done:
        return done.result
    except Exception as exc:  # pylint: disable=broad-except
        # What a module that crashes on a node reports: a failure with the traceback, never a lost run.
        return {"failed": True, "msg": "%s failed: %s: %s" % (name, type(exc).__name__, exc),
                "exception": traceback.format_exc()}
    return {"failed": True, "msg": "%s ended without a result (neither exit_json nor fail_json)" % name}
