# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Secret environment values of instances: which they are, and where they go.

An instance's ``environment`` variable is secret when its name matches one
of the patterns (``DEFAULT_PATTERNS``, case-insensitive shell globs; the
role's ``numa_binding_secret_patterns``) or the instance lists it in
``secret_environment``. A secret value never reaches the unit file (0644,
and ``systemctl show -p Environment`` prints it to every user), the plan
(``/etc/gpunuma/plan.json``, the controller's copy), a module's arguments
or a diff:

* the controller replaces it with ``REDACTED`` before planning
  (:func:`redact_instances`), so the plan keeps only the names
  (``secret_environment`` of each instance);
* the values go to ``<env dir>/<instance>.env`` (0600, root), rendered by
  :func:`env_file_text` and written by ``gpunuma_apply``'s ``secret_files``
  (its content a ``no_log`` argument; diffs show ``REDACTED``); the unit
  reads it with ``EnvironmentFile=``, which systemd opens as root before it
  drops to the instance's account (systemd.exec(5)).
"""

from __future__ import annotations

from collections.abc import Mapping
import fnmatch
import os
import re
from typing import Any, List

from ansible.module_utils.gpunuma.common.argv import long_options
from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.common import node_paths

DEFAULT_PATTERNS = ("*TOKEN*", "*PASSWORD*", "*PASSWD*", "*SECRET*", "*KEY*", "*CREDENTIAL*")
REDACTED = "<secret>"
DEFAULT_ENV_DIR = node_paths.ENV_DIR
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


class SecretError(GpunumaError):
    """A secret value that cannot be written to an environment file."""


def pattern_problems(patterns, field="numa_binding_secret_patterns"):
    """Messages for a bad pattern list (naming ``field``)."""
    if not isinstance(patterns, (list, tuple)):
        return ["%s: %r is not allowed; allowed: a list of shell globs such as '*TOKEN*'" % (field, patterns)]
    return ["%s[%d]: %r is not allowed; allowed: a non-empty glob of letters, digits, _, * and ?" % (field, i, p)
            for i, p in enumerate(patterns)
            if not isinstance(p, str) or not re.match(r"^[A-Za-z0-9_*?\[\]!-]+\Z", p)]


def is_secret(name, patterns=DEFAULT_PATTERNS, marked=()):
    """Whether variable ``name`` holds a secret: listed in ``marked``, or matching a pattern (any case)."""
    if name in (marked or ()):
        return True
    upper = str(name).upper()
    return any(fnmatch.fnmatchcase(upper, str(p).upper()) for p in patterns or ())


def command_secret_flags(command: Any, patterns: Any = DEFAULT_PATTERNS) -> List[str]:
    """The options of ``command`` (an argv list) that carry a secret value: ``--api-key VALUE``,
    ``--hf-token=VALUE`` and the like, whose name (``API_KEY``) matches ``patterns`` as an environment variable's
    would. A value that is an absolute path (``--ssl-keyfile /etc/ssl/key.pem``) names a secret, never holds one.
    Only option names are returned, never a value."""
    found = []
    for name, value in long_options(command):
        if value and not value.startswith("/") and is_secret(name.replace("-", "_"), patterns):
            if "--" + name not in found:
                found.append("--" + name)
    return found


def marked_names(instance):
    """The names an instance marks secret itself (``secret_environment``), ignoring junk the planner reports."""
    marked = instance.get("secret_environment") if isinstance(instance, dict) else None
    return [n for n in marked if isinstance(n, str)] if isinstance(marked, list) else []


def secret_names(instance, patterns):
    """The names of an inventory instance's ``environment`` whose values are secret (none for junk input)."""
    environment = instance.get("environment") if isinstance(instance, dict) else None
    if not isinstance(environment, dict):
        return []
    marked = marked_names(instance)
    return [name for name in environment if isinstance(name, str) and is_secret(name, patterns, marked)]


def breaks_line(value):
    """Whether a value cannot be one line of an environment file."""
    return any(c in value for c in "\n\r\0")


def _plain(value):
    """A copy of mappings and lists as plain dicts and lists, item by item.

    Never ``copy.deepcopy``: ansible-core 2.19+ hands filters lazy template
    containers that hold the templar, and deep-copying them copies the
    templar and its plugin loaders (deprecated in 2.21).
    """
    if isinstance(value, Mapping):
        return dict((k, _plain(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


_ASSIGNMENT_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.+)$", re.S)


def redact_value(value, patterns=DEFAULT_PATTERNS, marked=()):
    """A copy of any input value, as malformed as it may be, fit for a message: the value of every mapping key that
    looks secret (``patterns``) or is ``marked``, everything under ``environment`` an instance marks secret and under
    a ``secret_environment`` mapping (names belong in a list there; a mapping holds values), and the value of each
    ``NAME=value`` text whose name looks secret, replaced by ``REDACTED``."""
    if isinstance(value, Mapping):
        own = set(marked or ()) | set(marked_names(value))
        out = {}
        for key, item in value.items():
            if is_secret(key, patterns, own) and item not in (None, ""):
                out[key] = REDACTED
            elif key == "secret_environment" and isinstance(item, Mapping):
                out[key] = dict((name, REDACTED) for name in item)
            else:
                out[key] = redact_value(item, patterns, own if key == "environment" else ())
        return out
    if isinstance(value, (list, tuple)):
        return [redact_value(item, patterns, marked) for item in value]
    if isinstance(value, str):
        match = _ASSIGNMENT_RE.match(value)
        if match and is_secret(match.group(1), patterns, marked):
            return "%s=%s" % (match.group(1), REDACTED)
    return value


def redact_instances(instances, patterns=DEFAULT_PATTERNS):
    """A copy of the inventory's instances with every secret value replaced by ``REDACTED``."""
    if not isinstance(instances, list):
        return instances
    out = _plain(instances)
    for instance in out:
        for name in secret_names(instance, patterns):
            instance["environment"][name] = REDACTED
    return out


def _quote(value):
    return '"%s"' % "".join("\\" + c if c in '"\\`$' else c for c in value)


# systemd reads unit and environment files a line at a time, at most this long (LONG_LINE_MAX, src/basic/fileio.h).
SYSTEMD_LINE_MAX = 1024 * 1024


def line_too_long(name: str, value: str) -> bool:
    """Whether ``NAME="value"``, quoted as gpunuma writes it, is longer than systemd reads a line."""
    return len("%s=%s" % (name, _quote(value))) + 1 >= SYSTEMD_LINE_MAX


def env_file_text(header, instance_name, names, instances):
    """The environment file of ``instance_name``: its secret ``names`` with their values from the inventory's
    ``instances``, one ``NAME="value"`` a line (systemd's EnvironmentFile= quoting, no expansion)."""
    source = None
    for instance in instances if isinstance(instances, list) else ():
        if isinstance(instance, dict) and instance.get("name") == instance_name:
            source = instance
    environment = (source or {}).get("environment")
    if not isinstance(environment, dict):
        raise SecretError("gpunuma_instances entry '%s': no environment to take secrets %s from"
                          % (instance_name, ", ".join(names)))
    lines = [header.rstrip("\n")] if header else []
    for name in sorted(names):
        if not _NAME.match(str(name)):
            raise SecretError("gpunuma_instances entry '%s'.environment: %r is not a variable name" % (instance_name, name))
        value = environment.get(name)
        if not isinstance(value, str):
            raise SecretError("gpunuma_instances entry '%s'.environment.%s: the value is not text; allowed: a string"
                              % (instance_name, name))
        if breaks_line(value) or line_too_long(name, value):
            raise SecretError("gpunuma_instances entry '%s'.environment.%s: the secret holds a line break or NUL, or "
                              "is longer than systemd reads a line; allowed: one line of text under 1 MiB"
                              % (instance_name, name))
        lines.append("%s=%s" % (name, _quote(value)))
    return "\n".join(lines) + "\n"


def env_file_path(env_dir, instance_name):
    return os.path.join(env_dir or DEFAULT_ENV_DIR, "%s.env" % instance_name)


def env_files(plan, instances, env_dir, header=""):
    """gpunuma_apply ``secret_files`` entries: one environment file per planned instance with secrets."""
    out = []
    for item in (plan or {}).get("instances") or []:
        names = item.get("secret_environment") or []
        if names:
            out.append({"path": env_file_path(env_dir, item["name"]),
                        "content": env_file_text(header, item["name"], names, instances),
                        "owner": "root", "group": "root", "mode": "0600", "unit": item.get("unit")})
    return out


def value_problems(instances, patterns, variable="gpunuma_instances"):
    """Why a secret value cannot go to an environment file, naming ``variable``'s entry and the name, never the
    value: checked with the role's inputs, before any host is contacted."""
    problems = []
    if not isinstance(instances, list) or not isinstance(patterns, (list, tuple)):
        return problems
    for pos, instance in enumerate(instances):
        for name in sorted(secret_names(instance, patterns)):
            value = instance["environment"][name]
            if isinstance(value, str) and breaks_line(value):
                problems.append("%s[%d].environment.%s: the secret holds a line break or NUL; allowed: one line of "
                                "text (the value is not shown)" % (variable, pos, name))
            elif isinstance(value, str) and line_too_long(name, value):
                problems.append("%s[%d].environment.%s: the secret is %d characters, longer than systemd reads a line "
                                "of an environment file (LONG_LINE_MAX, 1 MiB): systemd would drop it; allowed: a "
                                "shorter value, or a file the engine reads (the value is not shown)"
                                % (variable, pos, name, len(value)))
    return problems


def stale_env_files(applied, plan, env_dir):
    """Environment files the applied plan had that this plan no longer wants (an instance gone, or without
    secrets now): gpunuma_apply's ``secret_absent``."""
    wanted = {env_file_path(env_dir, i["name"]) for i in (plan or {}).get("instances") or []
              if i.get("secret_environment")}
    old = applied.get("instances") if isinstance(applied, dict) else None
    stale = []
    for item in old if isinstance(old, list) else ():
        if isinstance(item, dict) and item.get("secret_environment") and isinstance(item.get("name"), str):
            path = env_file_path(env_dir, item["name"])
            if path not in wanted and path not in stale:
                stale.append(path)
    return stale
