"""The node's half of a kubelet change, as one ``gpunuma_apply`` request.

The kubelet refuses to start on a CPU or Memory Manager checkpoint recorded
under another policy, so a policy change is: stop the kubelet, remove the
stale checkpoints, write the config, start it (kubernetes.io, "Changing the
CPU Manager Policy"; docs/kubelet.md). ``change_request`` turns the plan of
:func:`kubelet.plan.plan_kubelet` and the Memory Manager checkpoint check's
files (kubelet/guard.py) into the request that does it in restart mode
``stop`` (node/apply/stop.py): the config and the stale checkpoints carry the
kubelet unit in that mode, every checkpoint the kubelet keeps is a state file
put back as it was when the kubelet does not come back, and the check's files
go with the kubelet (written without a restart; put back with the config).
Where the plan needs no transition, only the check's files are asked for.

The same checkpoints are what the plan reads of the node: ``read_request`` asks ``gpunuma_node_info`` for the
config, each of them and (DRA ``auto``) the plugin registrations, and ``node_read`` gives the answer back by
checkpoint name, decoded.
"""

from __future__ import annotations

import base64

from ansible.module_utils.gpunuma.kubelet.dra import DRA_STATE_FILE
from ansible.module_utils.gpunuma.kubelet.plan import CPU_STATE_FILE, MEMORY_STATE_FILE

# Every checkpoint the kubelet keeps that a failed change must not lose: the two a policy change can invalidate,
# and the DRA manager's, which none does.
CHECKPOINTS = (CPU_STATE_FILE, MEMORY_STATE_FILE, DRA_STATE_FILE)
# The keys of the kubelet's part of a node read (gpunuma_node_info's files and globs).
CONFIG_KEY = "kubelet_config"
REGISTRATIONS_KEY = "kubelet_dra_registrations"


def _checkpoint_key(name):
    return "kubelet_" + name


def read_request(config_path, state_dir, dra):
    """``gpunuma_node_info``'s options for what the kubelet plan reads: the config, every checkpoint (the DRA
    manager's is reported, never planned away) and, for ``dra`` ``auto``, the DRA drivers registered with the
    kubelet (``<driver>-reg.sock`` under ``plugins_registry``)."""
    state_dir = str(state_dir).rstrip("/")
    files = {CONFIG_KEY: config_path}
    files.update((_checkpoint_key(name), "%s/%s" % (state_dir, name)) for name in CHECKPOINTS)
    globs = {REGISTRATIONS_KEY: state_dir + "/plugins_registry/*-reg.sock"} if dra == "auto" else {}
    return {"files": files, "globs": globs}


def node_read(read):
    """The kubelet's part of a ``gpunuma_node_info`` answer (``{"gpunuma_node": ...}``), or None when it holds none:
    ``config`` (text; or None, with ``config_problem`` saying why), each checkpoint by name (text, or None when absent) and
    ``registrations`` (paths)."""
    node = (read or {}).get("gpunuma_node") or {}
    files = node.get("files") or {}
    if CONFIG_KEY not in files:
        return None

    def text(key):
        content = (files.get(key) or {}).get("content")
        return None if content is None else base64.b64decode(content).decode("utf-8", "replace")

    config = text(CONFIG_KEY)
    problem = None if config is not None else (files[CONFIG_KEY] or {}).get("problem") or "no such file"
    out = {"config": config, "config_problem": problem,
           "registrations": list((node.get("globs") or {}).get(REGISTRATIONS_KEY) or [])}
    out.update((name, text(_checkpoint_key(name))) for name in CHECKPOINTS)
    return out


def change_request(plan, guard, config_path, state_dir, service):
    """``{"files", "absent", "state_files"}`` for gpunuma_apply: the kubelet's change (when the plan needs one) and
    the checkpoint check's files (``guard``: guard.guard_files)."""
    change = bool(plan.get("transition_needed"))
    files, absent = [], []
    if change:
        files.append({"path": config_path, "content": plan["config_text"], "owner": "root", "group": "root",
                      "mode": "0644", "unit": service, "restart": "stop"})
        absent.extend({"path": path, "unit": service, "restart": "stop"} for path in plan["remove_checkpoints"])
    # The check runs at the kubelet's next start; a change the kubelet refuses puts its files back too.
    files.extend(dict(entry, unit=service, restart="never") for entry in guard["files"])
    absent.extend({"path": path, "unit": service, "restart": "stop"} if change else path for path in guard["absent"])
    state = ["%s/%s" % (state_dir.rstrip("/"), name) for name in CHECKPOINTS]
    return {"files": files, "absent": absent, "state_files": {service: state} if change else {}}
