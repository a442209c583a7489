"""Validation filters over module_utils/gpunuma/h2d_report.py (the logic lives there)."""

from __future__ import annotations

import functools

import ansible.module_utils
from ansible import constants as C
from ansible.errors import AnsibleFilterError

# Controller-side plugins do not get the configured module_utils path on
# ansible.module_utils (only modules shipped to a node do); add it.
for _path in C.DEFAULT_MODULE_UTILS_PATH or []:
    if _path not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(_path)

from ansible.module_utils.gpunuma import h2d_report  # noqa: E402
from ansible.module_utils.gpunuma.errors import GpunumaError  # noqa: E402


def _filter(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except GpunumaError as exc:
            raise AnsibleFilterError(str(exc))
    return wrapper


@_filter
def gpu_validate_policy(data, source="policy"):
    return h2d_report.load_policy(data, source)


@_filter
def gpu_validate_report(probe, policy, hostname, profile=None, generated_at=None):
    return h2d_report.build_report(probe, policy, hostname=hostname, profile=profile, generated_at=generated_at)


@_filter
def gpu_validate_table(reports):
    return h2d_report.fleet_table([r for r in reports if isinstance(r, dict)])


@_filter
def gpu_validate_host_file(hostname):
    return h2d_report.host_file_name(hostname)


class FilterModule:
    def filters(self):
        return {
            "gpu_validate_policy": gpu_validate_policy,
            "gpu_validate_report": gpu_validate_report,
            "gpu_validate_table": gpu_validate_table,
            "gpu_validate_host_file": gpu_validate_host_file,
        }
