"""Input checks of one instance, part two (plan/inputs.py runs them in order): readiness, shared and counted CPUs,
secret and NIC environment, the engine."""

from __future__ import annotations

import re

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, parse_cpulist
from ansible.module_utils.gpunuma.common.errors import CpuListError
from ansible.module_utils.gpunuma.plan.engines import ENGINES, parse_version, self_binding_flags
from ansible.module_utils.gpunuma.plan.instance_checks import MAX_READY_TIMEOUT, READY_KEYS
from ansible.module_utils.gpunuma.plan.model import NIC_ENVIRONMENT, is_int, type_name


def _check_ready(raw, spec, topo, problems):
    """``ready``: when a (re)started instance counts as settled (docs/plan-v1.md).

    ``{url: http://127.0.0.1:8000/health}`` (an HTTP 2xx answer) or
    ``{command: [argv...]}`` (exit 0), with ``timeout`` (seconds, default
    300) and ``interval`` (seconds between tries, default 5).
    """
    ready = raw.get("ready")
    if ready is None:
        return
    where = "%s.ready" % spec.path
    if not isinstance(ready, dict):
        problems.append("%s: %r is not a mapping; allowed: {url: http://...} or {command: [argv...]}, with timeout "
                        "and interval in seconds" % (where, ready))
        return
    unknown = [k for k in ready if k not in READY_KEYS]
    if unknown:
        problems.append("%s.%s: unknown key; allowed: %s" % (where, unknown[0], ", ".join(READY_KEYS)))
        return
    url, command = ready.get("url"), ready.get("command")
    if (url is None) == (command is None):
        problems.append("%s: give exactly one of url and command" % where)
        return
    out = {}
    if url is not None:
        if not isinstance(url, str) or not re.fullmatch(r"https?://[^\s]{1,2000}", url):
            problems.append("%s.url: %r is not an http:// or https:// URL" % (where, url))
            return
        out["url"] = url
    else:
        if not isinstance(command, list) or not command or not all(isinstance(w, str) and w for w in command) \
                or not command[0].startswith("/"):
            problems.append("%s.command: %r is not an argv list starting with an absolute path" % (where, command))
            return
        out["command"] = list(command)
    for key, default in (("timeout", 300), ("interval", 5)):
        value = ready.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_READY_TIMEOUT:
            problems.append("%s.%s: %r is not allowed; allowed: whole seconds from 1 to %d"
                            % (where, key, value, MAX_READY_TIMEOUT))
            return
        out[key] = value
    spec.ready = out


def _check_share_cpus(raw, spec, topo, problems):
    share = raw.get("share_cpus", False)
    if share is None:
        share = False
    if not isinstance(share, bool):
        problems.append("%s.share_cpus: %r is not a boolean; allowed: true, false" % (spec.path, share))
        share = False
    spec.share_cpus = share


def _check_cpus(raw, spec, topo, problems):
    cpus = raw.get("cpus")
    path = spec.path
    if cpus is None:
        return
    if is_int(cpus):
        if cpus < 1:
            problems.append(
                '%s.cpus: %d is not a CPU count; allowed: 1 or more, or a CPU list string like "2-5"' % (path, cpus)
            )
        elif cpus > len(topo.all_cpus):
            problems.append(
                "%s.cpus: %d is more CPUs than %s has; allowed: 1-%d" % (path, cpus, topo.hostname, len(topo.all_cpus))
            )
        elif spec.share_cpus:
            problems.append(
                "%s.cpus: a count (%d) needs CPUs of its own, which share_cpus: true does not reserve; "
                'allowed with share_cpus: an explicit CPU list string like "2-5", or no cpus' % (path, cpus)
            )
        spec.requested_cpu_count = cpus
    elif isinstance(cpus, str):
        try:
            parsed = parse_cpulist(cpus, "%s.cpus" % path)
        except CpuListError as exc:
            problems.append(str(exc))
            return
        if not parsed:
            problems.append("%s.cpus: %r is empty; allowed: a CPU count or a non-empty CPU list" % (path, cpus))
        elif not parsed <= topo.all_cpus:
            problems.append(
                "%s.cpus: CPUs %s do not exist on %s; allowed: %s"
                % (path, format_cpulist(parsed - topo.all_cpus), topo.hostname, format_cpulist(topo.all_cpus) or "none")
            )
        spec.requested_cpu_list = parsed
    else:
        problems.append(
            '%s.cpus: %r is %s; allowed: a CPU count (integer) or a CPU list string like "2-5"'
            % (path, cpus, type_name(cpus))
        )


def _check_secret_environment(raw, spec, topo, problems):
    names = raw.get("secret_environment")
    if names is None:
        return
    where = "%s.secret_environment" % spec.path
    # Its entries are never quoted: a secret written here instead of its name would be printed.
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        problems.append("%s: is %s, not a list of variable names; allowed: names of this instance's environment "
                        "whose values are secret (the value is not shown)"
                        % (where, type_name(names) if not isinstance(names, list) else "a list of other things"))
        return
    for pos, name in enumerate(names):
        if name not in spec.environment:
            problems.append("%s[%d]: names no variable of this instance's environment; allowed: one of %s (the "
                            "entry is not shown)"
                            % (where, pos, ", ".join(sorted(spec.environment)) or "(none: environment is empty)"))
    spec.secret_environment = list(names)


def _check_nic_environment(raw, spec, topo, problems):
    names = raw.get("nic_environment")
    if names is None:
        return
    allowed = ", ".join(NIC_ENVIRONMENT)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        problems.append(
            "%s.nic_environment: %r is not a list of variable names; allowed: a list of %s" % (spec.path, names, allowed)
        )
        return
    for pos, name in enumerate(names):
        where = "%s.nic_environment[%d]" % (spec.path, pos)
        if name not in NIC_ENVIRONMENT:
            problems.append("%s: %r is not a variable gpunuma fills with NICs; allowed: %s" % (where, name, allowed))
        elif names.index(name) != pos:
            problems.append("%s: %s is listed twice; allowed: each once" % (where, name))
        elif name in spec.environment:
            problems.append(
                "%s: %s is also given in environment; allowed: one of them (environment keeps your value, "
                "nic_environment sets the instance's nearest NICs)" % (where, name)
            )
    spec.nic_environment = list(names)


def _check_engine(raw, spec, topo, problems):
    engine = raw.get("engine")
    version = raw.get("engine_version")
    if isinstance(version, (int, float)) and not isinstance(version, bool):
        # YAML reads an unquoted 0.30 as the number 0.3, and 1.10 as 1.1: which release was meant cannot be told.
        problems.append("%s.engine_version: %r is a number, not a release (YAML reads an unquoted 0.30 as 0.3); "
                        "allowed: the release quoted, such as \"0.23.0\"" % (spec.path, version))
    elif version is not None:
        spec.engine_version = parse_version(version)
        if spec.engine_version is None:
            problems.append("%s.engine_version: %r is not a release number; allowed: the installed engine's version "
                            "such as \"0.23.0\"" % (spec.path, version))
    if engine is None:
        if version is not None:
            problems.append("%s.engine_version: given without engine; allowed: engine_version with engine: %s"
                            % (spec.path, ", ".join(e for e in ENGINES if e != "generic")))
        return
    if engine not in ENGINES:
        problems.append("%s.engine: %r is not allowed; allowed: %s" % (spec.path, engine, ", ".join(ENGINES)))
        return
    spec.engine = engine
    # The command binds the engine's workers itself: gpunuma does not bind them twice (engines.py).
    spec.engine_self_binds = self_binding_flags(engine, spec.command)
