"""The node's profile state (``/etc/gpunuma/state.json``, ``gpunuma.state/v1``).

The state file says which rung of the ladder a node is on, whether that
choice is the node's own (``pinned``: a rollback put it there, and a later
``site.yml`` keeps it) or follows the inventory, and the history of every
switch, so ``gpunuma_rollback=previous`` is always answerable::

    {"schema": "gpunuma.state/v1", "hostname": "gpu-a01",
     "profile": "preferred", "pinned": true,
     "updated": "2026-01-01T03:02:11Z",
     "history": [{"time": "...", "from": "strict", "to": "preferred",
                  "action": "down", "reason": "P99 spike", "user": "alice"}]}

Pure functions over text and dicts: the module (``library/gpunuma_state.py``)
reads and writes the file; the playbooks decide the target through
:func:`resolve_target`. docs/state-v1.md is the reference.
"""

from __future__ import annotations

import base64

import json
import re
from typing import Any, Optional, Tuple

from ansible.module_utils.gpunuma.common import bounded, seal
from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.common import documents, node_paths, schemas
from ansible.module_utils.gpunuma.node.probe import read_file
from ansible.module_utils.gpunuma.plan.profiles import base_profile

SCHEMA = schemas.STATE
SCHEMA_PREFIX = "gpunuma.state/v"
SCHEMA_VERSION = 1
DEFAULT_HISTORY_LIMIT = 50
DEFAULT_PATH = node_paths.STATE
ACTIONS = ("profile", "down", "previous", "release", "site")
ROLLBACK_CHOICES = ("down", "previous", "release")
# Matched with fullmatch: "$" would also accept a final newline ("strict\n").
_TIME_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
_PROFILE_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
ENTRY_FIELDS = ("time", "from", "to", "action", "reason", "user")
MAX_REASON = 500
# A state or plan file read on the node (read_text): a regular file of at most this size.
MAX_READ_BYTES = 16 * 1024 * 1024


class StateError(GpunumaError):
    """The state file cannot be used (newer schema) or a request is invalid."""


class StateCorrupt(StateError):
    """The state file is not a gpunuma.state document; kept as a backup, history restarted."""


class RollbackRefused(StateError):
    """The rollback asked for cannot be done; nothing is changed."""


def empty_state(hostname):
    return {"schema": SCHEMA, "hostname": hostname, "profile": None, "pinned": False, "updated": None, "history": []}


def parse_state(text, path):
    """Parse and check the text of a state file; return the state dict.

    Raises :class:`StateCorrupt` when the text is not a valid v1 document
    (the caller keeps the file as a backup and restarts the history), and
    :class:`StateError` when the file was written by a newer gpunuma (the
    caller must not touch it).
    """
    try:
        data = bounded.loads_json(text)
    except (ValueError, RecursionError) as exc:
        raise StateCorrupt("%s: not valid JSON (%s)" % (path, exc))
    if not isinstance(data, dict):
        raise StateCorrupt("%s: must be a JSON object, got %s" % (path, type(data).__name__))
    schema = data.get("schema")
    if not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
        raise StateCorrupt("%s: schema: %r is not allowed; allowed: %s" % (path, schema, SCHEMA))
    version = schema[len(SCHEMA_PREFIX):]
    if not version.isdigit():
        raise StateCorrupt("%s: schema: %r is not allowed; allowed: %s" % (path, schema, SCHEMA))
    if int(version) > SCHEMA_VERSION:
        raise StateError(
            "%s: schema: %r was written by a newer gpunuma; this one reads %s. Upgrade gpunuma on the controller, "
            "or move the file away to start a new history; the file is left as it is" % (path, schema, SCHEMA)
        )
    if int(version) != SCHEMA_VERSION:
        raise StateCorrupt("%s: schema: %r is not allowed; allowed: %s" % (path, schema, SCHEMA))
    edited = seal.problem(data)
    if edited:
        raise StateCorrupt("%s: %s" % (path, edited))
    # The shape (types, required keys) from the one schema of the document; then what only this module knows.
    problems = documents.problems_of(SCHEMA, data, "state")
    if problems:
        raise StateCorrupt("%s: %s" % (path, "; ".join(problems)))
    profile = data.get("profile")
    if profile is not None and not _PROFILE_RE.fullmatch(profile):
        problems.append("state.profile: %r is not a profile name" % (profile,))
    history = data.get("history", [])
    for index, entry in enumerate(history):
        where = "state.history[%d]" % index
        if not _TIME_RE.fullmatch(entry["time"]):
            problems.append("%s.time: %r is not a UTC time like 2026-01-31T03:00:00Z" % (where, entry["time"]))
        for field in ("from", "to"):
            value = entry.get(field)
            if value is not None and not _PROFILE_RE.fullmatch(value):
                problems.append("%s.%s: %r is not a profile name" % (where, field, value))
    if problems:
        raise StateCorrupt("%s: %s" % (path, "; ".join(problems)))
    state = empty_state(data.get("hostname"))
    state.update(
        profile=profile,
        pinned=bool(data.get("pinned", False)),
        updated=data.get("updated"),
        history=[dict((k, e.get(k)) for k in ENTRY_FIELDS) for e in history],
    )
    return state


def dump_state(state):
    """The text of state.json: the document with its checksum (common/seal.py)."""
    return json.dumps(seal.seal(state), indent=1, sort_keys=True) + "\n"


def previous_profile(state):
    """The profile the node had before its current one, or None."""
    for entry in reversed(state.get("history") or []):
        if entry.get("to") == state.get("profile") and entry.get("from") and entry["from"] != entry["to"]:
            return entry["from"]
    return None


def _rung_below(current, profiles, host):
    """The ladder's next rung below ``current`` (its profile's ``next``)."""
    if current not in profiles:
        raise RollbackRefused(
            "%s: the node runs profile %r, which is not in the profiles directory; cannot go down from it; "
            "name a profile with -e gpunuma_profile=<%s>" % (host, current, "|".join(sorted(profiles)))
        )
    nxt = profiles[current].get("next")
    if nxt is None:
        raise RollbackRefused(
            "%s: the node is on %r, the bottom rung of the ladder (next: null); there is no rung below it" % (host, current)
        )
    return nxt


def _previous(current, state, profiles, host):
    """The profile the node ran before ``current``, by its history."""
    prev = previous_profile(state or {})
    if prev is None:
        raise RollbackRefused(
            "%s: the node's history has no profile before %r; name one with -e gpunuma_profile=<%s>"
            % (host, current, "|".join(sorted(profiles)))
        )
    if prev not in profiles:
        raise RollbackRefused(
            "%s: the previous profile %r is no longer in the profiles directory; allowed: %s"
            % (host, prev, ", ".join(sorted(profiles)))
        )
    return prev


def resolve_target(current: Optional[str], state: dict, rollback: Optional[str], requested: Any, profiles: dict,
                   inventory_profile: Optional[str], host: str = "node") -> Tuple[Any, str]:
    """Decide the profile a rollback moves the node to; return (target, action).

    ``current``: the profile the node runs now (state, else the applied
    plan), None when gpunuma never provisioned it. ``rollback``: ``down``,
    ``previous``, ``release`` or None; ``requested``: a named profile or None.
    ``profiles``: ``{name: profile}`` (``profiles.load_profiles``).
    Raises :class:`RollbackRefused` with a sentence saying why and what to do.
    """
    if current is None:
        raise RollbackRefused(
            "%s: gpunuma never provisioned this node (no /etc/gpunuma/state.json or plan.json); there is nothing to roll "
            "back. Provision it with playbooks/site.yml first" % host
        )
    if rollback is not None and requested is not None:
        raise RollbackRefused(
            "%s: give either gpunuma_rollback (%r) or gpunuma_profile (%r), not both" % (host, rollback, requested)
        )
    if rollback is None and requested is None:
        raise RollbackRefused(
            "%s: say where to go: -e gpunuma_rollback=down|previous|release, or -e gpunuma_profile=<%s>"
            % (host, "|".join(sorted(profiles)))
        )
    if requested is not None:
        if isinstance(requested, bool) or requested not in profiles:
            shown = "false (an unquoted off; quote it: gpunuma_profile=\"'off'\")" if requested is False else repr(requested)
            raise RollbackRefused(
                "%s: gpunuma_profile: %s is not a known profile; allowed: %s" % (host, shown, ", ".join(sorted(profiles)))
            )
        return requested, "profile"
    if rollback not in ROLLBACK_CHOICES:
        raise RollbackRefused(
            "%s: gpunuma_rollback: %r is not allowed; allowed: %s" % (host, rollback, ", ".join(ROLLBACK_CHOICES))
        )
    if rollback == "down":
        return _rung_below(current, profiles, host), "down"
    if rollback == "previous":
        return _previous(current, state, profiles, host), "previous"
    # release: follow the inventory again
    if inventory_profile not in profiles:
        raise RollbackRefused(
            "%s: gpunuma_profile in the inventory is %r, not a known profile; allowed: %s"
            % (host, inventory_profile, ", ".join(sorted(profiles)))
        )
    return inventory_profile, "release"


def effective_profile(rollback_target: Optional[str], cli_profile: Optional[str], read: Any,
                      inventory_profile: Optional[str]) -> Tuple[Optional[str], str]:
    """The profile a node runs this run, and where it comes from: ``(profile, source)``.

    In this order: a rollback's target (``rollback``, rollback.yml decided it); ``-e gpunuma_profile=...``
    (``extra-vars``); the profile the node's state pins (``node-state``: a rollback left it there, and it stays
    until a release or a named profile moves it); else the inventory's ``gpunuma_profile`` (``inventory``).
    ``read``: the gpunuma_state module's ``gpunuma_state`` (``pinned``, ``state.profile``), or None.
    """
    if rollback_target is not None:
        return rollback_target, "rollback"
    if cli_profile is not None:
        return cli_profile, "extra-vars"
    read = read if isinstance(read, dict) else {}
    pinned = ((read.get("state") or {}).get("profile")) if read.get("pinned") else None
    if pinned:
        return pinned, "node-state"
    return inventory_profile, "inventory"


def read_text(path):
    """The text of a state or plan file on the node, None when absent, else the error (kept, so the caller can
    call the file corrupt and keep it). Read as gpunuma_node_info reads a file (a regular file, or a link to one,
    of at most 16 MiB), so the module and site.yml's node read see the same thing."""
    return text_of_read(read_file(path, MAX_READ_BYTES))


def text_of_read(read):
    """A file as gpunuma_node_info reads it (``{exists, content (base64) | problem}``), given as :func:`read_text`
    gives it: None when absent, the text, or the error."""
    if not isinstance(read, dict) or not read.get("exists"):
        return None
    if "content" not in read:
        # The read's own message, which names the file and why.
        return OSError(read.get("problem") or "cannot be read")
    try:
        return base64.b64decode(read["content"]).decode("utf-8")
    except (ValueError, UnicodeDecodeError) as exc:
        return exc


def read_summary(text, plan_text, path):
    """What gpunuma_state's read reports of a node, from its state file's text and its applied plan's (each as
    :func:`read_text` gives it): ``(result, corrupt)``, ``corrupt`` saying why the state file cannot be read, or
    None. A state of a newer gpunuma raises StateError."""
    current, corrupt = read_current(text, path)
    applied = applied_profile_of(plan_text)
    return {
        "state": current,
        "exists": text is not None,
        "corrupt": corrupt,
        "backup": None,
        "applied_profile": applied,
        "current_profile": (current or {}).get("profile") or applied,
        "provisioned": text is not None or applied is not None,
        "pinned": bool((current or {}).get("pinned")),
    }, corrupt


def corrupt_warning(path, corrupt, recording):
    """The warning a damaged state file gets: read, or replaced by a recorded switch."""
    return "%s is corrupt and cannot be read (%s); %s" % (
        path, corrupt, "it is kept as a backup and a new history starts" if recording
        else "the next recorded switch keeps it as a backup and starts a new history")


def applied_profile(plan_path):
    """The base profile of the applied plan at ``plan_path``, or None when there is none to read."""
    return applied_profile_of(read_text(plan_path))


def applied_profile_of(text):
    """The base profile of an applied plan's text (as :func:`read_text` gives it), or None."""
    if not isinstance(text, str):
        return None
    # Lenient on purpose: a plan.json of an older gpunuma (no schema, only its profile) still says where the
    # node starts (docs/state-v1.md, Writing); only a profile that is text counts.
    try:
        plan = bounded.loads_json(text)
    except (ValueError, RecursionError):
        return None
    profile = plan.get("profile") if isinstance(plan, dict) else None
    return base_profile(profile) if isinstance(profile, str) else None


def corrupt_backup_path(path, now):
    """Where a damaged state file is kept when a recorded switch replaces it (``now``: the record's UTC time)."""
    return "%s.corrupt-%s" % (path, now.replace(":", ""))


def read_current(text, path):
    """``(state, corrupt)`` of a state file's text: text None (no file) gives (None, None); an exception (the
    file could not be read) or a damaged document gives (None, why). A newer schema raises StateError."""
    if isinstance(text, OSError):
        return None, str(text)
    if isinstance(text, Exception):
        return None, "%s: cannot be read: %s" % (path, text)
    if text is None:
        return None, None
    try:
        return parse_state(text, path), None
    except StateCorrupt as exc:
        return None, str(exc)


def next_state(text: Optional[str], path: str, applied: Optional[str], hostname: Optional[str], to: str, action: str,
               reason: Optional[str], user: Optional[str], now: str,
               history_limit: int = DEFAULT_HISTORY_LIMIT) -> Tuple[dict, bool, Optional[str]]:
    """What recording a switch makes of the state file: ``(new_state, changed, corrupt)``.

    ``text`` is the file's text (None: no file; an exception: unreadable), ``applied`` the profile of the
    applied plan (a node provisioned before state files existed starts its history from it). A damaged file
    is replaced (``corrupt`` says why; the caller keeps it as a backup). The one rule both the state step
    (``gpunuma_state``) and the apply step (``gpunuma_apply state_record``) follow.
    """
    current, corrupt = read_current(text, path)
    base = current
    if base is None and corrupt is None and applied is not None and action != "site":
        # Provisioned before state files existed: the applied plan is where it came from.
        base = empty_state(hostname)
        base["profile"] = applied
    new, changed = record(base, hostname, to, action, reason, user, now, history_limit)
    return new, changed or corrupt is not None, corrupt


def record(state, hostname, to, action, reason, user, now, history_limit=DEFAULT_HISTORY_LIMIT):
    """Return (new_state, changed): the node switched to ``to`` by ``action``.

    ``action`` ``site`` follows the inventory (pinned false) and records
    nothing when the profile is unchanged; a rollback pins the node to its
    target (``release`` unpins it). The history keeps the newest
    ``history_limit`` entries.
    """
    if action not in ACTIONS:
        raise StateError("action: %r is not allowed; allowed: %s" % (action, ", ".join(ACTIONS)))
    if not isinstance(to, str) or not _PROFILE_RE.fullmatch(to):
        raise StateError("profile: %r is not a profile name" % (to,))
    if not isinstance(history_limit, int) or isinstance(history_limit, bool) or history_limit < 1:
        raise StateError("history_limit: %r is not allowed; allowed: an integer of at least 1" % (history_limit,))
    if reason is not None and len(str(reason)) > MAX_REASON:
        raise StateError("reason: %d characters; allowed: at most %d" % (len(str(reason)), MAX_REASON))
    old = state or empty_state(hostname)
    pinned = action not in ("site", "release")
    if action == "site":
        pinned = bool(old.get("pinned")) and old.get("profile") == to
    new = dict(old)
    new["schema"] = SCHEMA
    new["hostname"] = hostname
    if old.get("profile") == to and bool(old.get("pinned")) == pinned:
        return old, False
    history = list(old.get("history") or [])
    if old.get("profile") != to:
        history.append(
            {"time": now, "from": old.get("profile"), "to": to, "action": action,
             "reason": None if reason is None else str(reason), "user": user}
        )
    new.update(profile=to, pinned=pinned, updated=now, history=history[-history_limit:])
    return new, True
