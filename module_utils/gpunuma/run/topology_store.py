# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the gpu_topology role does with a discovery: the one decision over the persisted inventories.

The node keeps ``/etc/gpunuma/topology.json`` and the controller ``<dir>/<host>.json``; each holds the
hardware fingerprint later runs compare against. :func:`decide` reads both (as the role read them), and
returns what to write, what to say and why to stop; the role only carries it out (docs/roles.md,
"gpu_topology"). Standard library only.
"""

from __future__ import annotations

from typing import Optional

from ansible.module_utils.gpunuma.common import schemas
from ansible.module_utils.gpunuma.common.seal import read_state_file
from ansible.module_utils.gpunuma.run.role_inputs import host_file_stem


def controller_files(host, directory):
    """``{stem, topology, pending, plan, seal}``: the controller files of inventory host ``host`` in ``directory``
    (one documented mapping of the host name, role_inputs.host_file_stem; docs/roles.md). ``seal``: the digest of
    the node's converge record as this controller asked for it (run/converge.seal)."""
    stem = host_file_stem(host)
    base = directory.rstrip("/") + "/" + stem
    return {"stem": stem, "topology": base + ".json", "pending": base + ".pending.json", "plan": base + ".plan.json",
            "seal": base + ".converged.seal"}


def host_controller_files(task_vars, templar):
    """:func:`controller_files` of the host whose variables are ``task_vars`` (``gpu_topology_controller_dir``
    templated by ``templar``), or None when they cannot be told (the run's input check names what is wrong)."""
    try:
        directory = templar.template(task_vars["gpu_topology_controller_dir"])
        return controller_files(task_vars["inventory_hostname"], directory)
    except Exception:  # any input problem
        return None


def read_topology(content, path, where, encoding="base64"):
    """A persisted topology (node: slurp content; controller: text) as ``{data, problem}``."""
    return read_state_file(
        content,
        where,
        schemas.TOPOLOGY,
        "It holds the hardware fingerprint later runs compare against. To recover, re-run with "
        "-e gpu_topology_accept_changes=true to replace it with a fresh discovery (the damaged file is kept as "
        "a backup, %s.<pid>.<time>~), or move it aside (mv %s %s.damaged) and run again." % (path, path, path),
        encoding,
    )


def _persisted(content, path, where, encoding):
    """None (the node's file absent) or "" (the controller lookup of a missing file) is no inventory; an
    empty node file is a damaged one (a write cut short)."""
    if content is None or (encoding == "text" and not content):
        return {"data": None, "problem": None}
    return read_topology(content, path, where, encoding)


def decide(topology: dict, hostname: str, node_file: Optional[dict], node_path: str, controller_text: str,
           controller_path: str, accept_changes: bool = False, fail_on_change: bool = False,
           persist_on_node: bool = True) -> dict:
    """The whole decision of one host's discovery against its persisted inventories.

    ``node_file``: the node's file as read (``{"content": base64}``, or without ``content`` when absent);
    ``controller_text``: the controller copy's text ("" when absent). Returns ``{problem, notices,
    write_node, write_controller, write_pending, summary}``: ``problem`` (a sentence, or None) stops the
    host before anything is written; a damaged file is never read as "no inventory", and is replaced only
    with ``accept_changes`` (the write keeps a backup).
    """
    fingerprint = topology["fingerprint"]
    node = _persisted((node_file or {}).get("content"), node_path, "%s:%s" % (hostname, node_path), "base64")
    controller = _persisted(controller_text, controller_path, "controller file %s" % controller_path, "text")
    notices, problems = [], []
    if node["problem"]:
        if accept_changes:
            notices.append("WARNING %s gpu_topology_accept_changes is true: %s" % (node["problem"], (
                "it is replaced, and the damaged file kept as a backup." if persist_on_node else
                "a run that persists the topology (discover.yml, site.yml) replaces it, keeping the damaged file "
                "as a backup.")))
        else:
            problems.append(node["problem"])
    previous = (node["data"] or {}).get("fingerprint")
    changed = previous is not None and previous != fingerprint
    if changed:
        notices.append("HARDWARE FINGERPRINT CHANGED on %s; persisted: %s; now: %s; %s" % (
            hostname, previous, fingerprint,
            "The persisted inventory is replaced (backup kept): gpu_topology_accept_changes is true."
            if accept_changes else
            "The persisted inventory is KEPT. Check the node (BIOS NPS/SNC change, GPU or NIC moved, driver) and "
            "re-run with -e gpu_topology_accept_changes=true to accept."))
        if fail_on_change and not accept_changes:
            problems.append("%s: hardware fingerprint changed (%s -> %s) and gpu_topology_fail_on_change is true"
                            % (hostname, previous, fingerprint))
    if controller["problem"] and not accept_changes:
        problems.append("%s: %s" % (hostname, controller["problem"]))
    controller_previous = (controller["data"] or {}).get("fingerprint")
    controller_differs = controller_previous is not None and controller_previous != fingerprint
    go = not problems  # a host that stops writes nothing
    return {
        "problem": "\n".join(problems) or None,
        "notices": notices,
        "write_node": go and bool(persist_on_node and (previous is None or (changed and accept_changes))),
        "write_controller": go and (controller_previous is None or (bool(accept_changes) and controller_differs)),
        "write_pending": go and controller_differs and not accept_changes,
        "summary": summary_row(topology, hostname, changed or controller_differs),
    }


def summary_row(topology, hostname, changed):
    """The host's row in the discovery summary table."""
    return {
        "host": hostname,
        "sockets": topology["sockets"] if topology.get("sockets") is not None else "-",
        "numa_nodes": len(topology["numa_nodes"]),
        "cpu_nodes": len([n for n in topology["numa_nodes"] if n.get("has_cpus")]),
        "gpus": len(topology["gpus"]),
        "nics": len(topology["nics"]),
        "fingerprint": topology["fingerprint"][7:19],
        "changed": changed,
        "warnings": len(topology.get("warnings") or []),
        "complete": topology.get("complete"),
    }
