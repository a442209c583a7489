"""Controller-side helpers of the gpunuma_state role: which profile a node runs.

The decisions live in ``module_utils/gpunuma/state.py``; these filters only
hand it the profiles directory and the variables given on the command line.
"""

from __future__ import annotations

import ansible.module_utils
from ansible import constants as C

# Controller-side plugins do not get the configured module_utils path on
# ansible.module_utils (only modules shipped to a node do).
for _path in C.DEFAULT_MODULE_UTILS_PATH or []:
    if _path not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(_path)

from ansible.module_utils.gpunuma import state as statelib  # noqa: E402
from ansible.module_utils.gpunuma.profiles import ProfileError, load_profiles  # noqa: E402

_MISSING = object()


def _extra_vars():
    """The -e variables of this run (they are indistinguishable from inventory variables in templates)."""
    try:
        from ansible.parsing.dataloader import DataLoader
        from ansible.utils.vars import load_extra_vars

        return load_extra_vars(DataLoader()) or {}
    except Exception:  # pragma: no cover - no CLI context (unit tests)
        return {}


def gpunuma_extra_var(name, default=None):
    """The value of ``-e name=...`` on this run's command line, or ``default``."""
    return _extra_vars().get(name, default)


def gpunuma_rollback_target(read, rollback, requested, profiles_dir, inventory_profile, host):
    """``{target, action, from}`` or ``{error}`` for a rollback of one node.

    ``read``: the gpunuma_state module's ``gpunuma_state`` (mode read).
    """
    try:
        profiles = load_profiles(profiles_dir)
    except ProfileError as exc:
        return {"error": "%s: the profiles in %s cannot be read: %s" % (host, profiles_dir, exc)}
    if rollback in ("", None):
        rollback = None
    if isinstance(requested, str) and requested == "":
        requested = None
    try:
        target, action = statelib.resolve_target(
            read.get("current_profile"), read.get("state"), rollback, requested, profiles, inventory_profile, host
        )
    except statelib.StateError as exc:
        return {"error": str(exc)}
    return {"target": target, "action": action, "from": read.get("current_profile")}


class FilterModule:
    def filters(self):
        return {
            "gpunuma_extra_var": gpunuma_extra_var,
            "gpunuma_rollback_target": gpunuma_rollback_target,
        }
