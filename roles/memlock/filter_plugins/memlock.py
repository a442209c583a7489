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

from ansible.module_utils.gpunuma import limits  # noqa: E402
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


class FilterModule:
    def filters(self):
        return {
            "memlock_systemd_value": systemd_limit,
            "memlock_ceiling": memlock_ceiling,
            "memlock_clamp": memlock_clamp,
            "memlock_clamp_message": clamp_message,
            "memlock_format_limit": format_limit,
        }
