"""Who else sets kernel.numa_balancing: filters over module_utils/gpunuma/sysctl_owners.py.

The logic (systemd-sysctl order, tuned include chains, conflict sentences)
lives in ``gpunuma.sysctl_owners``, imported here exactly as modules import
it; these filters only turn its errors into filter errors.
"""

from __future__ import annotations

import functools
import re

import ansible.module_utils
from ansible import constants as C
from ansible.errors import AnsibleFilterError

# Controller-side plugins do not get the configured module_utils path on
# ansible.module_utils (only modules shipped to a node do); add it so the
# core is imported exactly as modules import it.
for _path in C.DEFAULT_MODULE_UTILS_PATH or []:
    if _path not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(_path)

from ansible.module_utils.gpunuma import role_inputs, sysctl_owners  # noqa: E402
from ansible.module_utils.gpunuma.errors import GpunumaError  # noqa: E402


def _filter(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except GpunumaError as exc:
            raise AnsibleFilterError(str(exc))

    return wrapper


sysctl_writers = _filter(sysctl_owners.sysctl_writers)
sysctl_conflicts = _filter(sysctl_owners.sysctl_conflicts)
tuned_active_profiles = _filter(sysctl_owners.tuned_active_profiles)
tuned_setting = _filter(sysctl_owners.tuned_setting)
tuned_conflict = _filter(sysctl_owners.tuned_conflict)


# systemd-sysctl reads only *.conf files (sysctl.d(5)); the whole path must match.
SYSCTL_FILE_PATTERN = r"/[^\x00-\x1f\x7f]*[^/\x00-\x1f\x7f]\.conf"


def input_problems(options, values, aliases=None):
    """Every problem of the AutoNUMA inputs (argument spec, then the sysctl file name)."""
    problems = role_inputs.input_problems(options, values, aliases)
    named = set(p.split(":", 1)[0] for p in problems)
    balancing = values.get("autonuma_numa_balancing")
    if (
        "autonuma_numa_balancing" not in named
        and balancing is not None
        and (isinstance(balancing, bool) or str(balancing).strip() not in ("0", "1"))
    ):
        problems.append(
            "autonuma_numa_balancing: %s is invalid; allowed: 0 (AutoNUMA off), 1 (on), or null (leave it alone)%s"
            % (
                role_inputs.shown(balancing),
                (
                    " - YAML read an unquoted off/on/no/yes as a boolean; write 0 or 1"
                    if isinstance(balancing, bool)
                    else ""
                ),
            )
        )
    path = values.get("autonuma_sysctl_file")
    if "autonuma_sysctl_file" not in named and isinstance(path, str) and not re.fullmatch(SYSCTL_FILE_PATTERN, path):
        problems.append(
            "autonuma_sysctl_file: %s is invalid; allowed: an absolute path ending in .conf "
            "(systemd-sysctl ignores other names)" % repr(path)
        )
    return problems


class FilterModule:
    def filters(self):
        return {
            "autonuma_input_problems": input_problems,
            "autonuma_sysctl_writers": sysctl_writers,
            "autonuma_sysctl_conflicts": sysctl_conflicts,
            "autonuma_tuned_active_profiles": tuned_active_profiles,
            "autonuma_tuned_setting": tuned_setting,
            "autonuma_tuned_conflict": tuned_conflict,
        }
