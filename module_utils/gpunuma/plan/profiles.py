"""Binding profiles: the rungs of the rollback ladder, kept as data.

A profile is a flat mapping (``policies/profiles/<name>.yml``)::

    name: strict             # must match the file name
    description: "..."       # one line, for humans
    cpu_binding: node        # node: the instance's CPU share | none
    mem_policy: bind         # bind | preferred | interleave | default
    mem_scope: instance      # interleave only: instance | all_cpu_nodes
    next: preferred          # the next (looser) rung, or null at the bottom

The planner (``plan.py``) reads only validated profiles. Profile files use a
deliberately small YAML subset (one ``key: scalar`` per line, comments, an
optional ``---``) so they can be read with the standard library on a node
that has no PyYAML; anything outside that subset is an error, never a guess.
"""

from __future__ import annotations

import os
import re
from collections import namedtuple

from ansible.module_utils.gpunuma.common import bounded, node_paths
from ansible.module_utils.gpunuma.common.errors import ProblemsError

PROFILE_FIELDS = ("name", "description", "cpu_binding", "mem_policy", "mem_scope", "next")
CPU_BINDINGS = ("node", "none")
MEM_POLICIES = ("bind", "preferred", "interleave", "default")
MEM_SCOPES = ("instance", "all_cpu_nodes")
PROFILE_SUFFIX = ".yml"
# A profile is a page of YAML; a bigger file (or a FIFO, a device) is refused, never read to its end.
MAX_PROFILE_BYTES = 1 << 20

# A variant of a rung, applied where the node cannot take the rung as it is:
# cpu-only binds CPUs and leaves the memory policy at default (the node
# refuses set_mempolicy). The plan's ``profile`` is then "<rung>-cpu-only";
# ProfileName is the one place that writes and reads that spelling.
CPU_ONLY = "cpu-only"
VARIANTS = (CPU_ONLY,)


class ProfileName(namedtuple("ProfileName", "base variant")):
    """A plan's profile: the ladder rung ``base`` and its ``variant`` (None, or one of VARIANTS)."""

    __slots__ = ()

    @classmethod
    def parse(cls, text):
        """``"strict-cpu-only"`` -> ProfileName("strict", "cpu-only"); anything not text -> ProfileName(None, None)."""
        if not isinstance(text, str):
            return cls(None, None)
        for variant in VARIANTS:
            if text.endswith("-" + variant) and len(text) > len(variant) + 1:
                return cls(text[: -len(variant) - 1], variant)
        return cls(text, None)

    def __str__(self):
        return self.base if not self.variant else "%s-%s" % (self.base, self.variant)


def base_profile(text):
    """The ladder rung of a plan's profile name (its variant removed); None for anything not text."""
    return ProfileName.parse(text).base


def profile_variant(base, variant):
    """The plan's profile name of rung ``base`` applied as ``variant`` (one of VARIANTS)."""
    if variant not in VARIANTS:
        raise ProfileError("profile variant %r is not allowed; allowed: %s" % (variant, ", ".join(VARIANTS)))
    return str(ProfileName(base, variant))


_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}\Z")
_KEY_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*):(?:\s+(.*?))?\s*$")
# YAML 1.1 scalars as PyYAML's safe loader resolves them; the profile reader
# must agree with PyYAML so the same file means the same thing everywhere.
_NULLS = ("", "~", "null", "Null", "NULL")
_TRUE = ("yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON")
_FALSE = ("no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF")
_INT_RE = re.compile(r"^[-+]?(0|[1-9][0-9_]*)$")


class ProfileError(ProblemsError):
    """A profile is unknown, unreadable or has invalid fields.

    ``problems`` lists each problem; the message is one problem per line.
    """


def _strip_comment(value):
    """Drop a trailing `` # comment`` that is outside quotes."""
    quote = None
    for pos, char in enumerate(value):
        if quote:
            if char == quote:
                quote = None
        elif char in ("'", '"'):
            if pos == 0:
                quote = char
        elif char == "#" and pos > 0 and value[pos - 1] in " \t":
            return value[:pos].rstrip()
    return value


def _scalar(raw, where):
    if raw in _NULLS:
        return None
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    if _INT_RE.match(raw):
        return int(raw.replace("_", ""))
    if raw[0] == '"':
        if len(raw) < 2 or raw[-1] != '"':
            raise ProfileError("%s: unterminated double-quoted string" % where)
        body = raw[1:-1]
        if "\\" in body or '"' in body:
            raise ProfileError(
                "%s: escapes and inner quotes are not supported in profile files; "
                "allowed: plain text in double quotes" % where
            )
        return body
    if raw[0] == "'":
        if len(raw) < 2 or raw[-1] != "'":
            raise ProfileError("%s: unterminated single-quoted string" % where)
        body = raw[1:-1]
        if "'" in body.replace("''", ""):
            raise ProfileError("%s: stray single quote" % where)
        return body.replace("''", "'")
    if raw[0] in "[]{}&*!|>%@`":
        raise ProfileError(
            "%s: %r is not a plain scalar; allowed in profile files: one 'key: value' "
            "per line with strings, integers, booleans or null" % (where, raw)
        )
    return raw


def parse_profile_text(text, source="profile"):
    """Parse the flat ``key: value`` YAML subset used by profile files."""
    data = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        where = "%s line %d" % (source, lineno)
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped == "---" and not data:
            continue
        if line[0] in " \t":
            raise ProfileError(
                "%s: indented lines are not supported; allowed: one top-level " "'key: value' per line" % where
            )
        match = _KEY_RE.match(line.rstrip())
        if not match:
            raise ProfileError("%s: %r is not a 'key: value' line" % (where, line))
        key, raw = match.group(1), _strip_comment(match.group(2) or "")
        if key in data:
            raise ProfileError("%s: key %r appears twice" % (where, key))
        data[key] = _scalar(raw, where)
    return data


def _name_problem(what, field, value, allow_null):
    """The problem with a profile name field (``name`` or ``next``), or None."""
    if value is None and allow_null:
        return None
    if isinstance(value, bool):
        return (
            "%s.%s: %r is not a profile name (unquoted off/on/yes/no read as booleans "
            "in YAML; quote it); allowed: lower-case letters, digits, '_' and '-'" % (what, field, value)
        )
    if not isinstance(value, str) or not _NAME_RE.match(value):
        return "%s.%s: %r is not a profile name; allowed: lower-case letters, digits, '_' and '-'%s" % (
            what, field, value, ", or null at the bottom of the ladder" if allow_null else "")
    return None


def validate_profile(data, what="profile"):
    """Check a profile mapping; return a normalised copy (``mem_scope`` filled in).

    Raises :class:`ProfileError` listing every problem, each naming the field
    and the allowed values.
    """
    if not isinstance(data, dict):
        raise ProfileError(
            "%s: must be a mapping with keys %s, got %s" % (what, ", ".join(PROFILE_FIELDS), type(data).__name__)
        )
    problems = []
    for key in sorted(data):
        if key not in PROFILE_FIELDS:
            problems.append("%s.%s: unknown field; allowed: %s" % (what, key, ", ".join(PROFILE_FIELDS)))
    for field in ("name", "cpu_binding", "mem_policy", "next"):
        if field not in data:
            problems.append("%s.%s: missing; it is required" % (what, field))

    if "name" in data:
        problem = _name_problem(what, "name", data["name"], allow_null=False)
        if problem:
            problems.append(problem)
    if "next" in data:
        problem = _name_problem(what, "next", data["next"], allow_null=True)
        if problem:
            problems.append(problem)
        elif data["next"] is not None and data["next"] == data.get("name"):
            problems.append("%s.next: %r points at itself; allowed: another profile or null" % (what, data["next"]))
    description = data.get("description", "")
    if description is None:
        description = ""
    if not isinstance(description, str):
        problems.append("%s.description: must be a string" % what)
    for field, allowed in (("cpu_binding", CPU_BINDINGS), ("mem_policy", MEM_POLICIES)):
        if field in data and data[field] not in allowed:
            problems.append("%s.%s: %r is not allowed; allowed: %s" % (what, field, data[field], ", ".join(allowed)))
    scope = data.get("mem_scope", "instance")
    if scope not in MEM_SCOPES:
        problems.append("%s.mem_scope: %r is not allowed; allowed: %s" % (what, scope, ", ".join(MEM_SCOPES)))
    elif scope != "instance" and data.get("mem_policy") != "interleave":
        problems.append(
            "%s.mem_scope: %r only applies to mem_policy interleave; allowed with mem_policy %r: instance"
            % (what, scope, data.get("mem_policy"))
        )
    if problems:
        raise ProfileError(problems)
    return {
        "name": data["name"],
        "description": description,
        "cpu_binding": data["cpu_binding"],
        "mem_policy": data["mem_policy"],
        "mem_scope": scope,
        "next": data["next"],
    }


def list_profiles(profiles_dir):
    """Profile names found in ``profiles_dir``, in ladder order.

    Ladder order follows ``next`` from each profile no other profile points
    at (``strict`` for the shipped set), roots in alphabetical order.
    """
    profiles = load_profiles(profiles_dir)
    return ladder(profiles)


def load_profiles(profiles_dir):
    """All profiles of ``profiles_dir`` as ``{name: validated profile}``."""
    if not os.path.isdir(profiles_dir):
        raise ProfileError("profiles_dir: %r is not a directory" % profiles_dir)
    profiles = {}
    for entry in sorted(os.listdir(profiles_dir)):
        if entry.endswith(PROFILE_SUFFIX) and not entry.startswith("."):
            name = entry[: -len(PROFILE_SUFFIX)]
            profiles[name] = load_profile(name, profiles_dir)
    return profiles


def ladder(profiles):
    """Ladder order of a ``{name: profile}`` mapping; checks every ``next``.

    Raises :class:`ProfileError` when a ``next`` names a missing profile or
    the chain loops.
    """
    problems = []
    for name in sorted(profiles):
        nxt = profiles[name]["next"]
        if nxt is not None and nxt not in profiles:
            problems.append(
                "profile %s.next: %r is not a known profile; allowed: %s, or null"
                % (name, nxt, ", ".join(sorted(profiles)))
            )
    if problems:
        raise ProfileError(problems)
    for name in sorted(profiles):
        seen = []
        current = name
        while current is not None:
            if current in seen:
                raise ProfileError(
                    "profile %s.next: the ladder loops back to %r; allowed: a chain that ends with next: null"
                    % (seen[-1], current)
                )
            seen.append(current)
            current = profiles[current]["next"]
    pointed_at = set(p["next"] for p in profiles.values() if p["next"] is not None)
    order = []
    for start in sorted(n for n in profiles if n not in pointed_at):
        name = start
        while name is not None and name not in order:
            order.append(name)
            name = profiles[name]["next"]
    return order


def load_profile(name, profiles_dir):
    """Read and validate ``<profiles_dir>/<name>.yml``."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ProfileError(
            "profile: %r is not a profile name; allowed: lower-case letters, digits, '_' and '-'" % (name,)
        )
    path = os.path.join(profiles_dir, name + PROFILE_SUFFIX)
    if not os.path.lexists(path):
        available = []
        if os.path.isdir(profiles_dir):
            available = sorted(
                e[: -len(PROFILE_SUFFIX)]
                for e in os.listdir(profiles_dir)
                if e.endswith(PROFILE_SUFFIX) and not e.startswith(".")
            )
        raise ProfileError(
            "profile: unknown profile %r (no %s); allowed: %s"
            % (name, path, ", ".join(available) if available else "none found in %s" % profiles_dir)
        )
    try:
        text = bounded.read_bounded(path, MAX_PROFILE_BYTES, follow_symlinks=True,
                                    what="a profile file").decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError("profile %s: cannot read %s: %s" % (name, path, exc))
    profile = validate_profile(parse_profile_text(text, source=path), what="profile %s" % name)
    if profile["name"] != name:
        raise ProfileError(
            "profile %s.name: %r does not match the file name %s; allowed: %r"
            % (name, profile["name"], os.path.basename(path), name)
        )
    return profile


def profile_choice_problem(value, profiles_dir, variable="gpunuma_profile"):
    """Why ``value`` (what the user set ``variable`` to) names no profile of ``profiles_dir``; None when it does.

    The sentence names the variable, what YAML handed over and the allowed
    names in ladder order. An unquoted ``off`` reaches Ansible as the boolean
    false (YAML 1.1), so a boolean gets the fix spelled out.
    """
    profiles_dir = os.path.normpath(profiles_dir)
    try:
        known = list_profiles(profiles_dir)
    except ProfileError as exc:
        return "%s: the profiles in %s cannot be read: %s" % (variable, profiles_dir, exc)
    allowed = ", ".join(known) if known else "none (no *.yml in %s)" % profiles_dir
    if isinstance(value, bool):
        if value is False:
            return (
                "%s: false is not a known profile; YAML read an unquoted `off` (or no/false) as the boolean "
                'false - quote it: %s: "off"; allowed: %s' % (variable, variable, allowed)
            )
        return (
            "%s: true is not a known profile; YAML read an unquoted on/yes/true as the boolean true - "
            'write a profile name, quoted if it is one of those words (%s: "strict"); allowed: %s'
            % (variable, variable, allowed)
        )
    if isinstance(value, str) and value in known:
        return None
    if isinstance(value, str):
        return "%s: %r is not a known profile; allowed: %s (files in %s)" % (variable, value, allowed, profiles_dir)
    return "%s: %s is not a profile name; allowed: %s" % (
        variable,
        "null" if value is None else repr(value),
        allowed,
    )


def module_options():
    """The options through which a planning module (gpu_binding_plan, kubelet_topology_plan) is given its topology
    and profile: each a mapping or a path, the profile by name from ``profiles_dir`` or whole."""
    return dict(
        topology=dict(type="dict"),
        topology_path=dict(type="path"),
        profile=dict(type="str"),
        profile_data=dict(type="dict"),
        profiles_dir=dict(type="path", default=node_paths.PROFILES_DIR),
    )


def module_profile(name, data, profiles_dir):
    """The profile a planning module is given: ``profile_data`` (whose name must be ``name`` when both are
    given), else the profile ``name`` of ``profiles_dir``. Raises ProfileError."""
    if data is None:
        return load_profile(name, profiles_dir)
    if name is not None and data.get("name") != name:
        raise ProfileError("profile: %r does not match profile_data.name %r; allowed: the same name, or only one of "
                           "them" % (name, data.get("name")))
    return data
