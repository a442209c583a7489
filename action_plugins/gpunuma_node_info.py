# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The action of the modules that read or write a node: gpunuma_node_info, gpu_topology_info, gpunuma_state and
gpunuma_apply (the other three files are links to this one). Each runs its module as usual and adds the call to the
run's journal: the reads and writes the converge record keeps (module_utils/gpunuma/run/converge.py)."""

from __future__ import annotations

import ansible.module_utils
from ansible import constants as C
from ansible.plugins.action.normal import ActionModule as NormalAction

# Controller-side plugins do not get the configured module_utils path on
# ansible.module_utils (only modules shipped to a node do); add it so the
# core is imported exactly as modules import it.
for _path in C.DEFAULT_MODULE_UTILS_PATH or []:
    if _path not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(_path)

from ansible.module_utils.gpunuma.run.converge import journal_call  # noqa: E402


class ActionModule(NormalAction):
    def run(self, tmp=None, task_vars=None):
        # The journal keeps a read's validated arguments (the result's invocation), which ansible-core 2.21 returns
        # only when asked (INJECT_INVOCATION, off by default): asked here for this call alone.
        return journal_call(self, super().run(tmp, dict(task_vars or {}, ansible_inject_invocation=True)), task_vars)
