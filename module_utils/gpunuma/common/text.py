# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""How a message quotes what the user wrote: as JSON, secrets redacted, cut short; and the one-line rule for text
gpunuma writes into files or command lines."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from ansible.module_utils.gpunuma.common import secrets

# The longest value a message quotes (a whole instance list is no help in one line).
MAX_SHOWN = 300


def shown(value):
    """``value`` as the user wrote it, in JSON (``false``, ``"off"``, ``[1, 2]``), secrets redacted
    (secrets.redact_value: malformed input included) and cut at MAX_SHOWN characters."""
    value = secrets.redact_value(value)
    try:
        text = json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN - 3] + "..."


def yaml_kind(value):
    """What a value is, in YAML's words: ``a list``, ``text``, ``a boolean``..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return "a %s" % type(value).__name__


# Text that reaches a rendered file (a unit, a drop-in, limits.d, sysctl.d) or a
# command line must be one line: a newline in a path or name would start a
# new directive ("[Service]\nExecStartPre=+/bin/sh -c ...") in what gpunuma
# writes as root. C0 control characters and DEL are refused in every text
# value of a spec, list items included.
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def control_problem(value):
    if isinstance(value, str) and _CONTROL_RE.search(value):
        return "holds a control character (newline, tab, ...); allowed: one line of printable text"
    return None
