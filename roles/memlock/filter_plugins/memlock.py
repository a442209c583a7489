"""The memlock limit as systemd writes it, and the ceiling PID 1 puts on it.

Filters over module_utils/gpunuma/limits.py, imported exactly as modules
import it; they only turn its errors into filter errors.
"""

from __future__ import annotations

import functools

import ansible.module_utils
from ansible import constants as C
from ansible.errors import AnsibleFilterError

# Controller-side plugins do not get the configured module_utils path on
# ansible.module_utils (only modules shipped to a node do); add it so the
# core is imported exactly as modules import it.
for _path in C.DEFAULT_MODULE_UTILS_PATH or []:
    if _path not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(_path)

from ansible.module_utils.gpunuma import limits, role_inputs  # noqa: E402
from ansible.module_utils.gpunuma.errors import GpunumaError  # noqa: E402


def _filter(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except GpunumaError as exc:
            raise AnsibleFilterError(str(exc))

    return wrapper


systemd_limit = _filter(limits.systemd_limit)
memlock_ceiling = _filter(limits.memlock_ceiling)
memlock_clamp = _filter(limits.memlock_clamp)
clamp_message = _filter(limits.clamp_message)
format_limit = _filter(limits.format_limit)


# User and group names as shadow-utils accepts them (a trailing $ marks Samba
# machine accounts); anything else could break the limits.d line. Matched
# against the whole name: "root\n" is not a name.
NAME_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.-]*[$]?"
# RLIM_INFINITY is 2^64-1; limits.conf counts KiB.
_MAX_LIMIT = 2**64 - 1


def limit_problem(value, variable="memlock_limit"):
    """Why ``value`` is no memlock limit, naming ``variable`` and the allowed range; None when it is one.

    Parsed by limits.parse_limit, the function that turns it into the
    units' LimitMEMLOCK= and the limits.d value: one grammar for both.
    """
    try:
        limit = limits.parse_limit(value, variable)
    except GpunumaError as exc:
        return str(exc)
    if limit is None:
        return None
    if limit == 0 or limit >= _MAX_LIMIT:
        return (
            "%s: %s is %d bytes; allowed: unlimited, infinity, or a size from 1K to below 16E "
            "(0 locks no memory at all: pinned CUDA and NCCL buffers fail)"
            % (variable, role_inputs.shown(value), limit)
        )
    if limit % 1024:
        return (
            "%s: %s is %d bytes, not a whole number of KiB (limits.conf counts KiB); allowed: a multiple "
            "of 1024 bytes, or a size such as 512M" % (variable, role_inputs.shown(value), limit)
        )
    return None


def input_problems(options, values, aliases=None):
    """Every problem of the memlock inputs (argument spec, then the size and the names)."""
    problems = role_inputs.input_problems(options, values, aliases)
    named = set(p.split(":", 1)[0] for p in problems)
    if "memlock_limit" not in named:
        problem = limit_problem(values.get("memlock_limit"))
        if problem:
            problems.append(problem)
    wildcard = values.get("memlock_allow_wildcard")
    wildcard = wildcard is True or str(wildcard).strip().lower() in ("y", "yes", "on", "1", "true", "t")
    users = values.get("memlock_users")
    if "memlock_users" not in named and isinstance(users, list):
        if "*" in users and not wildcard:
            problems.append(
                "memlock_users: '*' would give every user on the node the limit; allowed: named users, or set "
                "memlock_allow_wildcard: true to mean it"
            )
        problems += role_inputs.name_problems(
            "memlock_users",
            users,
            NAME_PATTERN,
            "letters, digits, '_', '.', '-' (groups go in memlock_groups, without '@')",
            extra_ok=("*",),
            noun="user names",
        )
    groups = values.get("memlock_groups")
    if "memlock_groups" not in named:
        problems += role_inputs.name_problems(
            "memlock_groups",
            groups,
            NAME_PATTERN,
            "letters, digits, '_', '.', '-', without a leading '@'",
            noun="group names",
        )
    return problems


class FilterModule:
    def filters(self):
        return {
            "memlock_aliases": role_inputs.aliases_of,
            "memlock_input_problems": input_problems,
            "memlock_systemd_value": systemd_limit,
            "memlock_ceiling": memlock_ceiling,
            "memlock_clamp": memlock_clamp,
            "memlock_clamp_message": clamp_message,
            "memlock_format_limit": format_limit,
        }
