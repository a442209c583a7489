# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The converge record: whether a node is still what the last run that provisioned it left.

A site.yml run decides everything from two things: its inputs (the host's gpunuma variables, the group it is in,
the code of the roles, modules and policies) and what it reads on the node (gpunuma_node_info, gpu_topology_info,
gpunuma_state). Its writes all go through gpunuma_apply. So when, after a run, the node is read again with the same
reads, the writes' files are digested and the services it started are running, that is everything the next run
would decide from: the **record** (``DEFAULT_PATH`` on the node, 0600) keeps the digests.

The next run's first step (``gpunuma_converge``, one round trip) compares its inputs' digests with the record's,
reads the node again exactly as the recorded run did and compares: when every digest matches, every file gpunuma
wrote is as written, no file it removed is back, no stale unit waits to be pruned, no restart is pending and every
service it started is active, the run would change nothing and the host's provisioning ends there. Any difference,
named in ``reasons``, runs the whole provisioning as before, which then records again.

What changes by itself and is never decided from (a NUMA node's free memory, PID 1's memory counters) is left out
of the digests (:func:`stable_view`).

Standard library only, plus gpunuma's readers; the controller side (:func:`input_digests`, :func:`write_summary`)
needs nothing from the node.
"""

from __future__ import absolute_import, division, print_function

import base64
import hashlib
import json
import os
import stat

from ansible.module_utils.gpunuma.common import atomic, bounded, node_paths, schemas
from ansible.module_utils.gpunuma.node import limits

__metaclass__ = type

SCHEMA = schemas.CONVERGED
DEFAULT_PATH = node_paths.CONVERGED
DEFAULT_PENDING = node_paths.PENDING_RESTARTS
# gpunuma_apply's list of units it stopped for a change (restart mode stop) and has not started again.
DEFAULT_STOPPED = node_paths.STOPPED_FOR_CHANGE
# The read-only modules whose answers a run decides from; a run that read the node otherwise is not recorded.
READERS = ("gpunuma_node_info", "gpu_topology_info", "gpunuma_state")
_VOLATILE_KEYS = frozenset(("memory_free_bytes",))
_FILE_CHUNK = 1 << 20


class ConvergeError(Exception):
    """A record or a journal entry gpunuma cannot use (the message names the field)."""


def digest(value):
    """``sha256:<hex>`` of ``value`` as canonical JSON."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _strip(value):
    if isinstance(value, dict):
        return dict((k, _strip(v)) for k, v in value.items() if k not in _VOLATILE_KEYS)
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def stable_view(module, result):
    """``result`` of reader ``module`` without what changes by itself and no decision reads.

    gpu_topology_info: a NUMA node's free memory (the planner sizes by total memory, never free memory:
    gate/policy.py); its node read (``node_info``) is seen as gpunuma_node_info's. gpunuma_node_info: of PID
    1's status only the capability lines (node/limits.py reads CapEff; the rest are counters).
    """
    result = _strip(result)
    if module == "gpu_topology_info" and isinstance(result.get("gpunuma_node"), dict):
        # The node read made with the discovery (node_info) is seen as gpunuma_node_info's.
        return dict(result, gpunuma_node=stable_view("gpunuma_node_info", result["gpunuma_node"]))
    if module == "gpunuma_node_info" and isinstance(result.get("pid1"), dict) and "status" in result["pid1"]:
        pid1 = dict(result["pid1"])
        text = base64.b64decode(pid1["status"]).decode("utf-8", "replace")
        pid1["status"] = limits.capability_lines(text)
        result = dict(result, pid1=pid1)
    return result


def file_state(path):
    """``None`` (absent), or the digest, mode and owner of a regular file (the type of anything else).

    Opened by ``bounded.open_regular`` (never a link, FIFO or device, even one swapped in after the type check)
    and digested in chunks; mode and owner come from the opened file.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return {"error": exc.strerror or str(exc)}
    if not stat.S_ISREG(st.st_mode):
        return {"type": "%o" % stat.S_IFMT(st.st_mode)}
    sha = hashlib.sha256()
    try:
        fd, st = bounded.open_regular(path, what="a file gpunuma owns")
        try:
            for chunk in iter(lambda: os.read(fd, _FILE_CHUNK), b""):
                sha.update(chunk)
        finally:
            os.close(fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return {"error": exc.strerror or str(exc)}
    return {"sha256": sha.hexdigest(), "mode": "%04o" % stat.S_IMODE(st.st_mode), "uid": st.st_uid, "gid": st.st_gid}


# -- the controller side -------------------------------------------------------


def input_digests(values, code):
    """``{name: digest}`` of each input value (already templated) and ``code`` (a digest of the code)."""
    out = dict((name, digest(value)) for name, value in values.items())
    out[" code"] = code
    return out


def code_digest(root, names):
    """One digest of every file under ``root``'s ``names`` (directories or files), by relative path and content."""
    sha = hashlib.sha256()
    for name in sorted(names):
        top = os.path.join(root, name)
        paths = [top] if os.path.isfile(top) else []
        for directory, subdirs, files in os.walk(top):
            subdirs[:] = sorted(d for d in subdirs if d != "__pycache__" and not d.startswith("."))
            paths.extend(os.path.join(directory, f) for f in sorted(files) if not f.endswith((".pyc", ".retry")))
        for path in paths:
            sha.update(os.path.relpath(path, root).encode("utf-8") + b"\0")
            try:
                with open(path, "rb") as handle:
                    sha.update(hashlib.sha256(handle.read()).digest())
            except OSError:
                sha.update(b"unreadable")
    return "sha256:" + sha.hexdigest()


def changed_inputs(recorded, now):
    """Names of the inputs that differ (added, removed or changed), sorted."""
    recorded = recorded if isinstance(recorded, dict) else {}
    return sorted(n.strip() for n in set(recorded) | set(now) if recorded.get(n) != now.get(n))


def write_summary(args):
    """What a gpunuma_apply call owns, from its arguments, with no file content: ``{files, absent, services,
    prune, pending}``."""
    files = [f.get("path") for key in ("files", "secret_files", "after_success") for f in (args.get(key) or [])
             if isinstance(f, dict)]
    record = args.get("state_record")
    if isinstance(record, dict):
        files.append(record.get("path") or node_paths.STATE)
    units = args.get("units") if isinstance(args.get("units"), dict) else {}
    # A file a unit writes itself (units.state_files: the kubelet's checkpoints), removed for its restart, is not
    # kept absent: the unit writes it again when it starts.
    state = set(p for paths in (units.get("state_files") or {}).values() for p in (paths or []))
    absent = [a.get("path") if isinstance(a, dict) else a for a in (args.get("absent") or [])]
    absent = [a for a in absent if a not in state] + list(args.get("secret_absent") or [])
    services = list(units.get("services") or []) if units.get("start") else []
    prune = args.get("prune") if isinstance(args.get("prune"), dict) else None
    return {"files": [f for f in files if isinstance(f, str)], "absent": [a for a in absent if isinstance(a, str)],
            "services": [s for s in services if isinstance(s, str)], "prune": prune,
            "pending": args.get("pending_file") or DEFAULT_PENDING, "stopped": args.get("stopped_file") or DEFAULT_STOPPED}


def owned(writes):
    """The union of write summaries: files, absent paths (not also written), services, prune specs, pending files."""
    files, absent, services, prunes, pending = set(), set(), set(), [], set()
    for entry in writes or []:
        files.update(entry.get("files") or [])
        absent.update(entry.get("absent") or [])
        services.update(entry.get("services") or [])
        if entry.get("prune") and entry["prune"] not in prunes:
            prunes.append(entry["prune"])
        pending.add(entry.get("pending") or DEFAULT_PENDING)
        # A unit stopped for a change and not started again is a restart still to make.
        pending.add(entry.get("stopped") or DEFAULT_STOPPED)
    return {"files": sorted(files), "absent": sorted(absent - files), "services": sorted(services),
            "prune": prunes, "pending": sorted(pending)}


# -- the node side --------------------------------------------------------------


def unique_reads(reads):
    """The reads without repeats, in first-seen order; raises ConvergeError on an entry gpunuma cannot replay."""
    seen, out = set(), []
    for index, entry in enumerate(reads or []):
        if not isinstance(entry, dict) or entry.get("module") not in READERS or not isinstance(entry.get("args"), dict):
            raise ConvergeError("reads[%d] must be {module: one of %s, args: mapping}, got %r"
                                % (index, ", ".join(READERS), entry))
        key = digest(entry)
        if key not in seen:
            seen.add(key)
            out.append(entry)
    return out


def read_again(entry, readers):
    """The answer of one recorded read, asked again. ``readers``: ``{module: callable(args)}``."""
    return stable_view(entry["module"], readers[entry["module"]](entry["args"]))


def node_view(reads, own, readers, unit_states, find_stale):
    """``(view, problems)``: what the decisions read and what the writes left, as digests; ``problems`` are what
    keeps the node from being converged whatever the record says (a failed service, a stale unit, a pending
    restart, a read that fails)."""
    problems = []
    view = {"reads": [], "files": {}, "absent": {}, "services": {}}
    for entry in unique_reads(reads):
        try:
            answer = read_again(entry, readers)
            view["reads"].append(dict((key, digest(value)) for key, value in answer.items())
                                 if isinstance(answer, dict) else {"": digest(answer)})
        except Exception as exc:  # any failure of a read: the full run reads and reports it
            view["reads"].append(None)
            problems.append("%s cannot read the node: %s" % (entry["module"], exc))
    for path in own["files"]:
        view["files"][path] = file_state(path)
    for path in own["absent"]:
        view["absent"][path] = os.path.lexists(path)
    states = unit_states(own["services"]) if own["services"] else {}
    for unit in own["services"]:
        state = states.get(unit) or {}
        # The main PID too: a service restarted since the record (by systemd after a crash, or by hand) is not
        # what the run left, even when it is active again when asked.
        view["services"][unit] = [state.get("ActiveState"), state.get("UnitFileState"), state.get("MainPID")]
        if state.get("ActiveState") != "active":
            problems.append("%s is %s" % (unit, state.get("ActiveState") or "unknown"))
    for spec in own["prune"]:
        units, dropins = find_stale(spec)
        if units or dropins:
            problems.append("stale gpunuma units to prune: %s" % ", ".join(units + [d + " (drop-in)" for d in dropins]))
    for path in own["pending"]:
        if os.path.lexists(path):
            problems.append("restarts are pending (%s)" % path)
    return view, problems


def seal(inputs, reads, own, facts, controller):
    """The digest of what a controller asked a node to record: the inputs, the reads the next check asks again,
    what the run owns, the facts a converged check returns and the controller files' states. The controller keeps
    it beside its copy of the host's plan; a check replays a node's record only when its seal is this one, so no
    read, command or fact is ever taken from the node's file alone (docs/security.md)."""
    value = {"inputs": inputs or {}, "reads": unique_reads(reads), "owned": own, "facts": facts or {},
             "controller": controller or {}}
    # As the record holds it: JSON (a tuple is a list, a key a string).
    return digest(json.loads(json.dumps(value, default=str)))


def request_seal(request):
    """:func:`seal` of a record request (:func:`record_request`, state ``recorded``)."""
    return seal(request.get("inputs"), request.get("reads"), owned(request.get("writes")), request.get("facts"),
                request.get("controller"))


def record_seal(record):
    """:func:`seal` of a record as the node keeps it (:func:`load_record`)."""
    return seal(record["inputs"], record["reads"], record["owned"], record["facts"], record["controller"])


def read_seal(path):
    """The seal a controller kept at ``path`` (None when there is none or it is not one)."""
    try:
        # A regular file only, never a link, FIFO or device, and small: a seal is one line.
        text = bounded.read_bounded(path, limit=256, what="a converge seal").decode("ascii", "replace").strip()
    except OSError:
        return None
    return text if text.startswith("sha256:") and len(text) == 71 else None


def keep_seal(path, value):
    """Write the controller's seal ``value`` at ``path`` (0600), or remove it when ``value`` is None; the
    failed result naming the file when that cannot be done, else None (both converge actions return it)."""
    try:
        if value is None:
            if os.path.lexists(path):
                os.unlink(path)
        elif read_seal(path) != value:
            atomic.write_atomic(path, value + "\n", 0o600)
    except OSError as exc:
        return {"failed": True, "changed": False,
                "msg": "the controller's seal of the converge record (%s): %s" % (path, exc)}
    return None


def build_record(inputs, reads, own, view, facts, controller):
    return {"schema": SCHEMA, "inputs": inputs, "reads": unique_reads(reads), "owned": own, "view": view,
            "facts": facts or {}, "controller": controller or {}}


def load_record(text, path):
    """The record in ``text``, or raises ConvergeError naming what is wrong."""
    try:
        record = bounded.loads_json(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConvergeError("%s is not JSON (%s)" % (path, exc))
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        raise ConvergeError("%s: schema is %r, expected %s" % (path, (record or {}).get("schema")
                                                               if isinstance(record, dict) else None, SCHEMA))
    for key, kind in (("inputs", dict), ("reads", list), ("owned", dict), ("view", dict), ("facts", dict),
                      ("controller", dict)):
        if not isinstance(record.get(key), kind):
            raise ConvergeError("%s: %s must be a %s" % (path, key, kind.__name__))
    return record


def compare(record, view, problems):
    """Reasons the node is not what ``record`` says, given the view read now (empty: converged)."""
    reasons = list(problems)
    before = record["view"]
    for index, (old, new) in enumerate(zip(before.get("reads") or [], view["reads"])):
        if old != new:
            parts = sorted(k for k in set(old or {}) | set(new or {}) if (old or {}).get(k) != (new or {}).get(k))
            reasons.append("%s answers differently than at the last converge (read %d: %s)"
                           % (record["reads"][index]["module"], index + 1, ", ".join(parts)))
    for key, what in (("files", "%s differs from what gpunuma wrote"), ("absent", "%s came back after gpunuma removed it"),
                      ("services", "%s is not as gpunuma left it")):
        old = before.get(key) or {}
        for name in sorted(set(old) | set(view[key])):
            if old.get(name) != view[key].get(name):
                restarted = _restarted(name, old.get(name), view[key].get(name)) if key == "services" else None
                reasons.append(restarted or what % name)
    return reasons


# -- the run's journal (controller side) ----------------------------------------

JOURNAL_READS = "gpunuma_node_reads"
JOURNAL_WRITES = "gpunuma_node_writes"


def _restarted(unit, before, now):
    """The reason for a service that runs as it did, but under another main PID (None otherwise)."""
    if isinstance(before, list) and isinstance(now, list) and len(before) == len(now) == 3 \
            and before[:2] == now[:2] and before[2] != now[2]:
        return "%s restarted since the last converge (main PID %s, now %s): crashed and restarted by systemd, or " \
               "restarted by hand" % (unit, before[2], now[2])
    return None


def host_fact(task_vars: dict, name: str, default=None):
    """A fact a gpunuma action returned for this host, whatever ``inject_facts_as_vars`` says.

    Facts a module or action returns always land under ``ansible_facts``; they
    are also top-level variables only while facts are injected (deprecated in
    ansible-core 2.20). Read them from ``ansible_facts`` first.
    """
    facts = task_vars.get("ansible_facts")
    if isinstance(facts, dict) and name in facts:
        return facts[name]
    return task_vars.get(name, default)


def journaled(task_vars, module, args, result, delegated_to=None):
    """The ``ansible_facts`` that add one module call to the run's journal (empty for a call that failed).

    Readers add ``{module, args}`` (the module's validated arguments, from ``result["invocation"]``); a read that
    cannot be asked again on the node (delegated elsewhere, arguments hidden, one that writes a file) adds an entry
    with ``not_replayable``, which keeps the run from being recorded. gpunuma_apply, and gpunuma_state recording a
    switch, add what they own (:func:`write_summary`).
    """
    if not isinstance(result, dict) or result.get("failed") or result.get("skipped"):
        return {}
    if module == "gpunuma_apply":
        return {JOURNAL_WRITES: list(host_fact(task_vars, JOURNAL_WRITES) or []) + [write_summary(args)]}
    if module == "gpunuma_state" and args.get("state") == "record":
        return {JOURNAL_WRITES: list(host_fact(task_vars, JOURNAL_WRITES) or [])
                + [write_summary({"state_record": {"path": args.get("path")}})]}
    params = (result.get("invocation") or {}).get("module_args")
    why = None
    if delegated_to:
        why = "delegated to %s" % delegated_to
    elif not isinstance(params, dict):
        why = "its arguments are not returned (no_log)"
    elif module == "gpu_topology_info" and params.get("record_nvml_dump"):
        why = "it records an NVML dump"
    entry = {"module": module, "not_replayable": why} if why else {"module": module, "args": params}
    return {JOURNAL_READS: list(host_fact(task_vars, JOURNAL_READS) or []) + [entry]}


INPUTS_FACT = "gpunuma_converge_inputs"


def skip_reason(task_vars):
    """Why this host's run is never cut short by a record (None when it can be)."""
    if str(task_vars.get("gpunuma_converge_check", True)).lower() in ("false", "no", "0", "off"):
        return "gpunuma_converge_check is false"
    if "gpunuma_rollback_action" in task_vars:
        return "a rollback always runs whole"
    return None


def record_request(task_vars, path, facts, controller, writes=()):
    """``(request, why)``: the node's record request for this host's run (converge_node.RECORD_OPTIONS), from the
    inputs its converge check digested and the run's journal, with ``writes`` (a step's own, not yet journaled)
    added. ``why`` says why no record is kept; the request then removes the node's record."""
    inputs = host_fact(task_vars, INPUTS_FACT)
    reads = host_fact(task_vars, JOURNAL_READS) or []
    why = skip_reason(task_vars) \
        or ("the run did not start with the converge check" if not isinstance(inputs, dict) else None) \
        or not_replayable(reads)
    if why:
        return {"state": "absent", "path": path}, why
    return {"state": "recorded", "path": path, "inputs": inputs, "reads": reads,
            "writes": list(host_fact(task_vars, JOURNAL_WRITES) or []) + list(writes), "facts": facts or {},
            "controller": controller or {}}, None


def not_replayable(reads):
    """Why the journal's reads cannot be asked again (None when they all can)."""
    for entry in reads or []:
        if isinstance(entry, dict) and entry.get("not_replayable"):
            return "%s: %s" % (entry.get("module"), entry["not_replayable"])
    return None


def journal_call(action, result, task_vars):
    """``result`` of the module call ``action`` (an action plugin) ran, with the call added to the run's journal."""
    task = action._task
    module = task.action.rsplit(".", 1)[-1]
    host = task_vars.get("inventory_hostname")
    delegated = task.delegate_to if task.delegate_to and task.delegate_to != host else None
    facts = journaled(task_vars, module, task.args or {}, result, delegated)
    if facts:
        result.setdefault("ansible_facts", {}).update(facts)
    return result
