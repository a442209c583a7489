"""Role inputs checked against the roles' own argument specs, before any task reaches a host.

Each role's ``meta/argument_specs.yml`` is the one list of its variables and
their types. Ansible checks it when a role is included, but its failure names
the role's internal variable (``numa_binding_profile``), quotes a Python type
(``<class 'str'>``) and prints the whole spec. :func:`input_problems` makes the
same checks first and says them the way a user can act on:

* the variable the user set: a role option whose spec default reads
  ``{{ gpunuma_x | default(...) }}`` is named ``gpunuma_x`` when the user set
  that (and the option holds its value), else by its own name;
* what the user wrote (as JSON, so ``false`` and ``"false"`` differ);
* what is allowed, with a hint where YAML changed the value: an unquoted
  ``off``/``no``/``on``/``yes`` is a boolean, not a word.

It is never looser than Ansible's own conversion: a value accepted here is
accepted by the argument spec, so the spec check after it cannot fail on
what passed here. Lists and mappings are stricter (a string is not split on
commas into a list, nor ``k=v`` read as a mapping).

File names on the controller: :func:`host_file_stem` maps an inventory host
name to a name safe to use as one path component.
"""

from __future__ import annotations

import re

from ansible.module_utils.gpunuma.common.text import control_problem, shown, yaml_kind
from ansible.module_utils.gpunuma.common.errors import GpunumaError

# A spec default like "{{ gpunuma_profile | default('strict') }}": the option
# carries the user-facing variable gpunuma_profile. Another role's variable
# counts too ("{{ memlock_limit | default('infinity') }}"): one knob, named
# once, by the name the user set.
_ALIAS_RE = re.compile(r"^\{\{\s*((?:gpunuma|gpu_topology|numa_binding|memlock|autonuma|kubelet_topology|policy_gate|"
                       r"node_checks)_[A-Za-z0-9_]+)\s*\|\s*default\(")
# Ansible's boolean spellings (ansible.module_utils.parsing.convert_bool).
_TRUE = ("y", "yes", "on", "1", "true", "t")
_FALSE = ("n", "no", "off", "0", "false", "f")
_INT_RE = re.compile(r"[-+]?[0-9]+")
# What an unquoted YAML 1.1 boolean was most likely written as.
_YAML_BOOL_HINT = "YAML reads unquoted yes/no/on/off/true/false as booleans"

# Marks a variable the play does not define (lookup('vars', ..., default=UNDEFINED)).
UNDEFINED = "__gpunuma_undefined__"

# Inventory host names are used verbatim as controller file names when they
# only hold these characters (RFC 1123 host names, IPv4/IPv6 addresses,
# and '_', '@', '+'); anything else is written %XX.
_SAFE_FILE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-:@+")
# The longest stem: NAME_MAX (255) less the longest suffix (.pending.json).
MAX_STEM = 240


class RoleInputError(GpunumaError):
    """A value the roles cannot use (raised only by helpers that need one answer)."""


def _is_int(value):
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, str) and _INT_RE.fullmatch(value.strip()) is not None


def _as_int(value):
    """The whole number of a value _is_int accepted (2, 2.0, " 2 ")."""
    return int(value) if isinstance(value, (int, float)) else int(value.strip())


def _is_bool(value):
    if isinstance(value, bool):
        return True
    if isinstance(value, int):
        return value in (0, 1)
    return isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE


def _is_str(value):
    # Ansible would turn numbers into strings; a boolean turned into 'True'
    # is never what was meant.
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def _type_problem(kind, value, elements=None):
    """Why ``value`` is not of the spec type ``kind``, or None."""
    if kind in (None, "raw"):
        return None
    if kind == "int":
        if _is_int(value):
            return None
        return "is not a whole number%s" % ("; " + _YAML_BOOL_HINT if isinstance(value, bool) else "")
    if kind == "bool":
        if _is_bool(value):
            return None
        return "is not a boolean; allowed: true or false"
    if kind in ("str", "path"):
        if _is_str(value) and (kind == "str" or str(value) != ""):
            return control_problem(value)
        if isinstance(value, bool):
            return "is a boolean, not text (%s; quote it)" % _YAML_BOOL_HINT
        return "is not %s" % ("a path" if kind == "path" else "text")
    if kind == "list":
        if not isinstance(value, list):
            return "is not a list; allowed: a YAML list, e.g. [a, b]"
        for index, element in enumerate(value):
            problem = _type_problem(elements, element)
            if problem and elements == "dict":
                # Which entry, not its value: an entry that is no mapping may be a secret pasted out of place.
                return "item %d is %s, not a mapping" % (index, yaml_kind(element))
            if problem:
                return "item %d, %s, %s" % (index, shown(element), problem)
        return None
    if kind == "dict":
        if isinstance(value, dict):
            return None
        return "is not a mapping"
    return None


def user_variable(option, spec, values, aliases):
    """The variable the user set for ``option``: the variable its default reads (``gpunuma_profile``,
    ``memlock_limit``) when that one holds the option's value, or itself."""
    default = spec.get("default")
    match = _ALIAS_RE.match(default) if isinstance(default, str) else None
    if match:
        alias = match.group(1)
        alias_value = aliases.get(alias, UNDEFINED)
        if alias_value is not UNDEFINED and alias_value != UNDEFINED and alias_value == values.get(option):
            return alias
    return option


def with_template_defaults(options: dict, defaults: dict) -> dict:
    """An entry point's ``options`` with the role's defaults/main.yml text as the default of each option whose spec
    states none.

    An option whose default is a template of a list, mapping or bool (``{{ gpunuma_instances | default([]) }}``)
    states it in its description only: the spec documents defaults as values of the option's type. Its
    ``gpunuma_*`` variable is then known the same way as a string option's (:func:`aliases_of`, :func:`user_variable`).
    """
    out = {}
    for name, option in (options or {}).items():
        if isinstance(option, dict) and "default" not in option and isinstance((defaults or {}).get(name), str):
            option = dict(option, default=str(defaults[name]))
        out[name] = option
    return out


def aliases_of(options):
    """``gpunuma_*`` variables the options take their defaults from."""
    names = []
    for spec in options.values():
        default = spec.get("default") if isinstance(spec, dict) else None
        match = _ALIAS_RE.match(default) if isinstance(default, str) else None
        if match and match.group(1) not in names:
            names.append(match.group(1))
    return names


def input_problems(options, values, aliases=None, refined=()):
    """One sentence per option whose value the argument spec would refuse.

    ``options``: an entry point's ``options`` from ``meta/argument_specs.yml``;
    ``values``: the options' values (templated); ``aliases``: the values of the
    ``gpunuma_*`` variables (:func:`aliases_of`), ``UNDEFINED`` where unset.
    ``refined``: options whose text a stricter rule of the role checks next
    (a name or file pattern that already refuses control characters): their
    control characters are left to that rule's own sentence.
    """
    aliases = aliases or {}
    problems = []
    for option in sorted(options):
        spec = options[option] or {}
        if option not in values:
            continue
        value = values[option]
        if value is None or value == UNDEFINED:
            continue
        name = user_variable(option, spec, values, aliases)
        kind = spec.get("type", "str")
        problem = _type_problem(kind, value, spec.get("elements", "str") if kind == "list" else None)
        if problem and option in refined and "control character" in problem:
            problem = None
        if problem is None and "choices" in spec:
            choices = spec["choices"]
            items = value if kind == "list" else [value]
            for item in items:
                if not any(_same(item, choice) for choice in choices):
                    problem = "%sis not allowed%s; allowed: %s" % (
                        "" if kind != "list" else "item %s " % shown(item),
                        (
                            " (%s%s)"
                            % (_YAML_BOOL_HINT, "; quote it" if any(isinstance(c, str) for c in choices) else "")
                            if isinstance(item, bool)
                            else ""
                        ),
                        ", ".join(shown(c) if c is None or not isinstance(c, str) else c for c in choices),
                    )
                    break
        elif problem and "choices" in spec and kind != "list":
            problem += "; allowed: %s" % ", ".join(
                shown(c) if c is None or not isinstance(c, str) else c for c in spec["choices"]
            )
        if problem is None and kind == "path":
            problem = path_problem(option, value)
        if problem is None and kind == "int" and option in MINIMUMS and _as_int(value) < MINIMUMS[option]:
            problem = "is below %d; allowed: a whole number %d or more" % (MINIMUMS[option], MINIMUMS[option])
        if problem is None and option in VALUE_CHECKS:
            problem = VALUE_CHECKS[option](value)
        if problem and kind == "list" and isinstance(value, list):
            problems.append("%s: %s" % (name, problem))  # the item is named; the whole list is no help
        elif problem:
            problems.append("%s: %s %s" % (name, shown(value), problem))
    return problems


# Path options read or written on the controller, not the node: a path relative to where ansible-playbook runs is
# theirs to take. Every other path option names a file or directory on the node.
CONTROLLER_PATHS = frozenset((
    "numa_binding_profiles_dir", "kubelet_topology_profiles_dir", "kubelet_topology_presets_dir",
    "gpunuma_state_profiles_dir", "policy_gate_rules_dir", "gpu_validate_policy_file", "gpu_validate_report_dir",
    "gpu_topology_controller_dir", "gpu_topology_sysfs_root", "gpu_topology_nvidia_smi_topo_file",
    "gpu_topology_amd_smi_topology_file", "gpu_topology_rocm_smi_topo_file", "gpu_topology_lscpu_file",
    "gpu_topology_nvml_dump", "gpu_topology_record_nvml_dump", "node_checks_sysfs_root", "node_checks_nvml_dump",
    "node_checks_nvidia_smi_q_file",
))


def path_problem(option, value):
    """Why ``value`` is no path gpunuma can use for ``option``, or None: a node path is absolute (systemd and
    gpunuma_apply resolve nothing against a working directory), and no path holds ``%``, which systemd expands as a
    specifier in the unit files paths are written into (``%h``: the home directory; systemd.unit(5),
    "Specifiers")."""
    text = str(value)
    if "%" in text:
        return "holds %, which systemd expands as a unit specifier (%h, %n: systemd.unit(5)); allowed: a path without %"
    if option not in CONTROLLER_PATHS and not text.startswith("/"):
        return "is not an absolute path; allowed: a path on the node starting with /"
    return None


# Options whose values a spec type cannot express (``type: raw`` in the spec):
# each check says why a value is refused, or None. They accept exactly what
# the planner (gpu_binding_plan) accepts, so a value passed here is never
# refused on the host; docs/plan-v1.md has the rules.
_COUNT_RE = re.compile(r"[0-9]{1,6}")


def count_or_auto_problem(value):
    """Why ``value`` is not ``auto`` or a whole number 0 or more, or None."""
    if value == "auto":
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**6:
        return None
    if isinstance(value, str) and _COUNT_RE.fullmatch(value):
        return None
    hint = "; " + _YAML_BOOL_HINT if isinstance(value, bool) else ""
    return "is not a core count; allowed: auto, or a whole number 0 or more%s" % hint


def cpulist_problem(value):
    """Why ``value`` is not a non-empty CPU list (``0-1,96-97``), or None."""
    from ansible.module_utils.gpunuma.common.cpulist import parse_cpulist
    from ansible.module_utils.gpunuma.common.errors import CpuListError

    allowed = 'allowed: a CPU list like "0-1,96-97" (quoted), or leave it unset'
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return "is not a CPU list; %s" % allowed
    if isinstance(value, str) and not value.strip():
        return None  # unset: the count (housekeeping_cores_per_node) applies
    try:
        cpus = parse_cpulist(str(value), "the CPU list")
    except CpuListError as exc:
        return "is not a CPU list (%s); %s" % (exc, allowed)
    return None if cpus else "is not a CPU list; %s" % allowed


def size_or_auto_problem(value):
    """Why ``value`` is not ``auto`` or a size (``16G``, bytes), or None."""
    from ansible.module_utils.gpunuma.common import sizes

    if value == "auto":
        return None
    try:
        sizes.parse_size(value, "the size", allowed="auto, bytes as an integer, or a size like 16G")
    except sizes.SizeError as exc:
        return "is not a size (%s); allowed: auto, bytes as an integer, or a size like 16G" % exc
    return None


# The smallest value of whole-number options (a spec type cannot say it):
# a negative settle time or restart batch, a zero start-limit burst.
MINIMUMS = {
    "numa_binding_settle_seconds": 0,
    "numa_binding_journal_lines": 0,
    "numa_binding_start_limit_interval_sec": 0,
    "numa_binding_start_limit_burst": 1,
    "numa_binding_restart_batch": 1,
    "numa_binding_backups_keep": 0,
}

VALUE_CHECKS = {
    "numa_binding_housekeeping_cores_per_node": count_or_auto_problem,
    "numa_binding_housekeeping_cpus": cpulist_problem,
    "numa_binding_memory_reserve_per_node": size_or_auto_problem,
}


def _same(value, choice):
    if isinstance(value, bool) or isinstance(choice, bool):
        return value is choice
    if isinstance(choice, int) and _is_int(value):
        return int(str(value).strip()) == choice
    return value == choice or (isinstance(value, (int, float)) and str(value) == choice)


def name_problems(variable, names, pattern, allowed, extra_ok=(), noun="names"):
    """``variable: [...] are not valid names`` for the items not matching all of ``pattern``.

    Full match: a trailing newline (``"root\\n"``) is not a name.
    """
    if not isinstance(names, list):
        return []
    bad = [n for n in names if n not in extra_ok and (not isinstance(n, str) or not re.fullmatch(pattern, n))]
    if not bad:
        return []
    return [
        "%s: %s %s not valid %s; allowed: %s" % (variable, shown(bad), "is" if len(bad) == 1 else "are", noun, allowed)
    ]


def host_file_stem(host):
    """A controller file name stem for inventory host ``host``.

    Characters outside ``A-Z a-z 0-9 . _ - : @ +``, and a leading ``.``, are
    written ``%XX`` (their UTF-8 bytes, upper-case hex), so the stem is one
    path component that never starts with a dot, and different host names
    never share a file (``%`` itself is encoded). ``gpu-a01.example.net``
    stays as it is; ``../../x`` becomes ``%2E.%2F..%2Fx``.
    """
    if not isinstance(host, str) or not host:
        raise RoleInputError("inventory host name %s cannot name a file; allowed: a non-empty name" % shown(host))
    out = []
    for pos, char in enumerate(host):
        if char in _SAFE_FILE_CHARS and not (pos == 0 and char == "."):
            out.append(char)
        else:
            out.append("".join("%%%02X" % byte for byte in char.encode("utf-8", "surrogatepass")))
    stem = "".join(out)
    if len(stem.encode("utf-8")) > MAX_STEM:
        raise RoleInputError(
            "inventory host name %s is too long for a controller file name (%d bytes once encoded); "
            "allowed: at most %d bytes; give the host a shorter inventory name (and ansible_host: the address)"
            % (shown(host), len(stem), MAX_STEM)
        )
    return stem


# -- variables nobody reads -----------------------------------------------------------------------------------

# The prefixes of gpunuma's own variables. memlock_ and kubelet_ are left out: other roles (kubespray's kubelet_*)
# use them too, and a variable of theirs is not a misspelt one of gpunuma's.
OWN_PREFIXES = ("gpunuma_", "gpu_topology_", "numa_binding_", "autonuma_", "kubelet_topology_", "policy_gate_",
                "node_checks_", "gpu_validate_")
_NAME_RE = re.compile(r"\b(?:%s)[A-Za-z0-9_]*" % "|".join(OWN_PREFIXES))
# Where gpunuma's code reads its variables, in a checkout and in the collection (and the checkout's own
# inventories, whose helper variables are theirs).
_CODE_DIRS = ("roles", "playbooks", "plugins", "action_plugins", "library", "module_utils", "filter_plugins",
              "inventory", "molecule")
_CODE_SUFFIXES = (".yml", ".yaml", ".j2", ".py")


def known_variable_names(root: str) -> frozenset:
    """Every name with one of OWN_PREFIXES that gpunuma's roles, playbooks and plugins under ``root`` spell.

    A variable nobody spells is read by nothing: the run ignores it. The
    set is a superset of the read names (a name spelt in a comment counts),
    so a name outside it is certainly ignored.
    """
    import os

    names = set()
    for top in _CODE_DIRS:
        for directory, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if name.endswith(_CODE_SUFFIXES):
                    try:
                        with open(os.path.join(directory, name), encoding="utf-8", errors="replace") as handle:
                            names.update(_NAME_RE.findall(handle.read()))
                    except OSError:
                        continue
    return frozenset(names)


def unknown_variables(names, known) -> list:
    """``[(name, nearest known name or None)]`` for each of ``names`` with gpunuma's prefixes that is not ``known``."""
    import difflib

    out = []
    for name in sorted(n for n in names if isinstance(n, str) and n.startswith(OWN_PREFIXES)):
        if name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        out.append((name, close[0] if close else None))
    return out


def unknown_variable_message(name: str, nearest) -> str:
    """What to say of a variable nothing reads."""
    return "%s is not a variable gpunuma reads%s" % (
        name, "; did you mean %s?" % nearest if nearest else " (docs/role-variables.md lists those it does)")
