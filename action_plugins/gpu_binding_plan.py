# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The action of gpunuma's modules that need nothing of a node (gpu_binding_plan, kubelet_topology_plan,
gpunuma_policy_check, gpunuma_copy; their files link to this one). On the controller (a local connection, no become,
not async, no task environment: how the roles delegate them to localhost) the module's ``run(module)`` is called in
this process (module_utils/gpunuma/common/inprocess.py); anywhere else the module runs as usual."""

from __future__ import annotations

import importlib.util

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

from ansible.module_utils.gpunuma.common.inprocess import plain_args, run_module  # noqa: E402


def _has_environment(environment):
    """Whether a task sets environment variables. Ansible keeps a task's ``environment:`` as a list of its own and its
    blocks' and play's entries (``[{}]`` when none sets any); an entry that is still a template counts as one."""
    if not environment:
        return False
    if isinstance(environment, dict):
        return bool(environment)
    return any(entry for entry in environment)


def _inject_invocation(task_vars):
    """Whether a module's result carries ``invocation`` here: ansible-core 2.21's INJECT_INVOCATION, always before."""
    try:
        return bool(C.config.get_config_value("INJECT_INVOCATION", variables=task_vars))
    except Exception:  # pylint: disable=broad-except
        return True  # no such setting before 2.21


class ActionModule(NormalAction):
    def _runs_here(self):
        """Whether the module would run on this controller, as this process's Python would run it (no become, no
        async, no task environment of its own)."""
        return (getattr(self._connection, "transport", None) == "local" and not self._play_context.become
                and not self._task.async_val and not _has_environment(self._task.environment))

    def _load(self):
        found = self._shared_loader_obj.module_loader.find_plugin_with_context(
            self._task.action, collection_list=self._task.collections)
        if not found.resolved:
            return None
        spec = importlib.util.spec_from_file_location("_gpunuma_on_controller_" + found.plugin_resolved_name.replace(".", "_"),
                                                      found.plugin_resolved_path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if not hasattr(module, "MODULE_SPEC") or not hasattr(module, "run"):
            return None
        return module

    def run(self, tmp=None, task_vars=None):
        module = self._load() if self._runs_here() else None
        args = None
        if module is not None:
            try:
                args = plain_args(self._task.args)
            except (TypeError, ValueError):
                module = None  # not JSON data: Ansible's own encoding of module arguments decides, as a module
        if module is None:
            return super().run(tmp, task_vars)
        self._supports_check_mode = True
        result = super(NormalAction, self).run(tmp, task_vars)
        result.update(run_module(module.MODULE_SPEC, module.run, args, self._task.check_mode,
                                 self._task.action, self._task.diff, Display().verbosity, _inject_invocation(task_vars)))
        return result
