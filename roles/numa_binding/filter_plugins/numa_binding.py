"""Render plan instances into systemd unit syntax.

Templates only render the plan: the argv quoting for ``ExecStart=`` is the
planner's own ``systemd_exec_line`` (imported, not copied), so a command is
always passed as argv and never read by a shell.
"""

from __future__ import annotations

import ansible.module_utils
from ansible import constants as C
from ansible.errors import AnsibleFilterError

# Controller-side plugins do not get the configured module_utils path on
# ansible.module_utils (only modules shipped to a node do); add it so the
# planner's code is imported exactly as modules import it.
for _path in C.DEFAULT_MODULE_UTILS_PATH or []:
    if _path not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(_path)

from ansible.module_utils.gpunuma.errors import GpunumaError  # noqa: E402
from ansible.module_utils.gpunuma.plan import systemd_environment_assignment, systemd_exec_line  # noqa: E402


def exec_argv(instance, numactl_path):
    """The argv a plan instance runs: numactl prefix (if any) + command.

    The plan's ``exec_prefix`` names ``numactl`` by program name; the unit
    gets the node's absolute path so it does not depend on systemd's
    executable search path.
    """
    command = instance.get("command")
    if not command:
        raise AnsibleFilterError("instance %r has no command to run" % instance.get("name"))
    prefix = list(instance.get("exec_prefix") or [])
    if prefix and prefix[0] == "numactl":
        prefix[0] = numactl_path
    return prefix + list(command)


def exec_line(argv):
    """``ExecStart=`` value running ``argv`` verbatim (plan.systemd_exec_line)."""
    try:
        return systemd_exec_line(list(argv))
    except GpunumaError as exc:
        raise AnsibleFilterError(str(exc))


def environment_assignment(name, value):
    """``Environment=`` word for one variable (plan.systemd_environment_assignment)."""
    try:
        return systemd_environment_assignment(name, value)
    except GpunumaError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule:
    def filters(self):
        return {
            "numa_binding_exec_argv": exec_argv,
            "numa_binding_exec_line": exec_line,
            "numa_binding_environment": environment_assignment,
        }
