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

from ansible.module_utils.gpunuma import limits, role_inputs  # noqa: E402
from ansible.module_utils.gpunuma.errors import GpunumaError  # noqa: E402
from ansible.module_utils.gpunuma.plan import systemd_environment_assignment, systemd_exec_line  # noqa: E402
from ansible.module_utils.gpunuma.profiles import profile_choice_problem  # noqa: E402

PLAN_SCHEMA = "gpunuma.plan/v1"


def missing_targets(plan, units, host):
    """One message per drop-in instance whose unit the node cannot load.

    ``units`` is gpunuma_node_info's ``units`` section ({unit: {LoadState: ...}}).
    """
    problems = []
    for instance in (plan or {}).get("instances") or []:
        if instance.get("mode") != "dropin":
            continue
        state = (units or {}).get(instance.get("unit")) or {"LoadState": "unknown"}
        load = state.get("LoadState") or ""
        if load == "loaded":
            continue
        why = ("is not installed" if load == "not-found"
               else "systemd cannot load (%s)" % (load or state.get("error") or "no LoadState"))
        problems.append("%s: gpunuma_instances entry '%s' binds unit %s, which %s on this node; allowed: an existing "
                        "service unit, or leave out unit (and give command) for a gpunuma-<name>.service"
                        % (host, instance.get("name"), instance.get("unit"), why))
    return problems


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


def input_problems(options, values, aliases, profiles_dir):
    """Every problem of the binding inputs, naming the variable the user set.

    The argument spec's checks (role_inputs.input_problems), then the ones a
    spec cannot express: the profile is a file of ``profiles_dir`` and
    ``numa_binding_limit_memlock`` parses as the memlock role's sizes do.
    """
    problems = role_inputs.input_problems(options, values, aliases)
    profile = values.get("numa_binding_profile")
    variable = role_inputs.user_variable(
        "numa_binding_profile", options.get("numa_binding_profile", {}), values, aliases
    )
    # The profile's own sentence (known names, the unquoted-off hint) replaces the spec's type sentence.
    problems = [p for p in problems if not p.startswith(variable + ":")]
    problem = profile_choice_problem(profile, profiles_dir, variable)
    if problem:
        problems.append(problem)
    memlock = values.get("numa_binding_limit_memlock")
    if memlock not in (None, role_inputs.UNDEFINED):
        problem = limit_problem(memlock, "numa_binding_limit_memlock")
        if problem and not any(p.startswith("numa_binding_limit_memlock:") for p in problems):
            problems.append(problem)
    return problems


def limit_problem(value, variable):
    """Why ``value`` is no RLIMIT_MEMLOCK value (limits.parse_limit, then the range); None when it is one."""
    try:
        limit = limits.parse_limit(value, variable)
    except GpunumaError as exc:
        return str(exc)
    if limit is None:
        return None
    if limit < 1024 or limit >= 2**64 - 1:
        return (
            "%s: %s is %d bytes; allowed: unlimited, infinity, or from 1K (1024 bytes) to below 16E "
            "(a limit of 0 locks no memory at all: pinned CUDA and NCCL buffers fail)"
            % (variable, role_inputs.shown(value), limit)
        )
    return None


def read_applied_plan(content, path, host):
    """The node's applied plan (slurp content) as ``{data, problem}`` (role_inputs.read_state_file)."""
    return role_inputs.read_state_file(
        content,
        "%s:%s" % (host, path),
        PLAN_SCHEMA,
        "It is read to leave running instances' own memory out of the free-memory check, and is rewritten "
        "(with a backup) only after a successful apply. To recover, move it aside on the node "
        "(mv %s %s.damaged) and run again; earlier plans are kept beside it as %s.<pid>.<time>~ backups."
        % (path, path, path),
    )


class FilterModule:
    def filters(self):
        return {
            "numa_binding_aliases": role_inputs.aliases_of,
            "numa_binding_input_problems": input_problems,
            "numa_binding_profile_problem": profile_choice_problem,
            "numa_binding_read_applied_plan": read_applied_plan,
            "numa_binding_exec_argv": exec_argv,
            "numa_binding_exec_line": exec_line,
            "numa_binding_environment": environment_assignment,
            "numa_binding_missing_targets": missing_targets,
        }
