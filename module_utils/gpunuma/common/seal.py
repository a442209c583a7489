# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A checksum over the content of gpunuma's own documents (topology.json, plan.json, state.json).

gpunuma writes each document with a ``checksum`` field: ``sha256:`` and the
SHA-256 of the document's canonical JSON (keys sorted, no spaces, the
checksum field itself left out). A reader recomputes it: a document whose
content no longer matches was changed after gpunuma wrote it (edited by
hand, or written by another tool) and is refused or reported, never trusted
silently. The hardware ``fingerprint`` of a topology covers the layout only;
the checksum covers everything the planner reads (cores, L3 groups, memory).

A document without the field is refused like an edited one: gpunuma has
sealed every copy it writes since its first release (0.3.0), so deleting the
field is an edit, and never lifts the check (a hand-pinned profile in an
unsealed state.json is not obeyed).

:func:`read_state_file` reads one such document back and says what is wrong with it.
"""

from __future__ import annotations

import hashlib
import json

from ansible.module_utils.gpunuma.common import bounded
from ansible.module_utils.gpunuma.common.text import shown

FIELD = "checksum"
PREFIX = "sha256:"


def digest(doc):
    """``sha256:<hex>`` of ``doc`` without its checksum field."""
    body = {key: value for key, value in doc.items() if key != FIELD}
    blob = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return PREFIX + hashlib.sha256(blob.encode("ascii")).hexdigest()


def seal(doc):
    """A copy of the mapping ``doc`` with its checksum."""
    out = {key: value for key, value in doc.items() if key != FIELD}
    out[FIELD] = digest(out)
    return out


def is_sealed(doc):
    return isinstance(doc, dict) and FIELD in doc


def problem(doc):
    """Why ``doc`` cannot be trusted as gpunuma wrote it, or None (sealed and matching)."""
    if not is_sealed(doc):
        return ("carries no checksum: gpunuma writes one into every copy it keeps, so it was written by hand, by "
                "another tool, or had its checksum removed")
    stored = doc[FIELD]
    if not isinstance(stored, str) or not stored.startswith(PREFIX):
        return "its checksum field is %s, not a %s<hex> checksum gpunuma writes" % (json.dumps(stored, default=str)[:80],
                                                                                    PREFIX)
    try:
        wanted = digest(doc)
    except (TypeError, ValueError) as exc:
        return "its content cannot be checked (%s)" % exc
    if stored != wanted:
        return ("was changed after gpunuma wrote it: its content no longer matches its checksum "
                "(edited by hand, or written by another tool)")
    return None


def read_state_file(content, path, schema, recovery, encoding="base64"):
    """A JSON state file gpunuma keeps (``/etc/gpunuma/topology.json``, ``plan.json``).

    ``content``: the file's text (``encoding="text"``) or Ansible's slurp
    ``content`` (``"base64"``). Returns ``{"data": mapping or None, "problem":
    None or a sentence}``; the sentence names ``path``, says what is wrong and
    ends with ``recovery``. A file that is not a ``schema`` JSON object, or
    that has no checksum or one its content no longer matches (common/seal.py),
    is a problem, never a crash and never silently treated as absent.
    """
    import base64
    import binascii

    def refused(what):
        return {"data": None, "problem": "%s %s. It is left as it is. %s" % (path, what, recovery)}

    text = content
    if encoding == "base64":
        try:
            raw = base64.b64decode(content or "", validate=True)
        except (binascii.Error, ValueError, TypeError):
            return refused("could not be read back (not base64)")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return refused("is not UTF-8 text (byte %d)" % exc.start)
    if not isinstance(text, str):
        return refused("is not text")
    if not text.strip():
        return refused("is empty (a write cut short?)")
    try:
        data = bounded.loads_json(text)
    except ValueError as exc:
        return refused("is not valid JSON (%s)" % exc)
    if not isinstance(data, dict):
        return refused("holds a JSON %s, not a %s object" % (type(data).__name__, schema))
    if data.get("schema") != schema:
        return refused("is not a %s document (schema: %s)" % (schema, shown(data.get("schema"))))
    edited = problem(data)
    if edited:
        return refused(edited)
    return {"data": data, "problem": None}
