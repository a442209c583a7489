# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The converge record's node side (docs/architecture.md, "The converge record"): the node read again with a run's
reads, and the record kept. One place, used by the ``gpunuma_converge`` module (the check, and a record of its own)
and by ``gpunuma_apply`` (the record kept in the apply step's round trip, once every unit settled)."""

from __future__ import annotations

import base64
import json
import os

from ansible.module_utils.gpunuma.common import atomic, node_paths
from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.discovery.module_run import discover_with
from ansible.module_utils.gpunuma.node.apply.files import ApplyError, find_stale
from ansible.module_utils.gpunuma.common import commands
from ansible.module_utils.gpunuma.node.probe import node_read_params, probe_with, read_file, unit_states
from ansible.module_utils.gpunuma.run import converge

# The options of a record request (gpunuma_converge's state=recorded, gpunuma_apply's record).
RECORD_OPTIONS = dict(
    state=dict(type="str", choices=["recorded", "absent"], default="recorded"),
    path=dict(type="path", default=converge.DEFAULT_PATH),
    # Digests of values the inventory may keep in a vault: never printed.
    inputs=dict(type="dict", default={}, no_log=True),
    reads=dict(type="list", elements="dict", default=[]),
    writes=dict(type="list", elements="dict", default=[]),
    facts=dict(type="dict", default={}),
    controller=dict(type="dict", default={}),
)


def readers(module):
    """``{reader module: callable(args)}``: each read-only module's answer, computed as that module computes it."""

    def topology(args):
        try:
            result = discover_with(module, args)
        except GpunumaError as exc:
            raise converge.ConvergeError(str(exc))
        out = {"topology": result["topology"]}
        if args.get("read_files"):
            out["files"] = dict((name, read_file(path)) for name, path in args["read_files"].items())
        if args.get("node_info") is not None:
            node_info = node_read_params(args["node_info"])
            if isinstance(node_info, str):
                raise converge.ConvergeError(node_info)
            out["gpunuma_node"] = probe_with(module, node_info)
        return out

    def state(args):
        # gpunuma_state's read answers from these two files alone.
        return {"state": converge.file_state(args.get("path") or node_paths.STATE),
                "plan": converge.file_state(args.get("plan_path") or node_paths.PLAN)}

    return {"gpunuma_node_info": lambda args: probe_with(module, args), "gpu_topology_info": topology,
            "gpunuma_state": state}


def view_now(module, reads, own):
    runner = commands.runner(module)

    def stale(spec):
        try:
            return find_stale(spec, set(spec.get("keep_units") or []), set(spec.get("keep_dropins") or []))
        except ApplyError as exc:
            return ["(%s)" % exc], []

    return converge.node_view(reads, own, readers(module), lambda units: unit_states(runner, units), stale)


def recorded(module, p):
    """Keep the record ``p`` asks for (RECORD_OPTIONS): ``{recorded, reasons}``. Fails the module on a request it
    cannot read or a record it cannot write; no record (and the old one removed) when the node is not converged."""
    if p["state"] == "absent":
        remove(module, p["path"])
        return {"recorded": False, "reasons": []}
    try:
        own = converge.owned(p["writes"])
        view, problems = view_now(module, p["reads"], own)
        record = converge.build_record(p["inputs"], p["reads"], own, view, p["facts"], p["controller"])
    except converge.ConvergeError as exc:
        module.fail_json(msg="gpunuma_converge: %s" % exc)
    if problems:
        remove(module, p["path"])
        return {"recorded": False, "reasons": problems}
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    current = read_file(p["path"])
    if current.get("content") is not None and base64.b64decode(current["content"]).decode("utf-8", "replace") == text:
        return {"recorded": True, "reasons": []}
    if not module.check_mode:
        try:
            directory = os.path.dirname(p["path"])
            if not os.path.isdir(directory):
                os.makedirs(directory, 0o755)
            atomic.write_atomic(p["path"], text, 0o600, prefix=".converged.json.")
        except OSError as exc:
            module.fail_json(msg="%s cannot be written: %s" % (p["path"], exc.strerror or exc))
    return {"recorded": True, "reasons": []}


def remove(module, path):
    if os.path.lexists(path) and not module.check_mode:
        try:
            os.unlink(path)
        except OSError as exc:
            module.fail_json(msg="%s cannot be removed: %s" % (path, exc.strerror or exc))
