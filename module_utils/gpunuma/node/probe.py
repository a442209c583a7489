"""Everything the roles read from a node before they change it, in one pass.

``gpunuma_node_info`` runs this on the node: one round trip instead of a
chain of ``slurp``, ``stat``, ``find`` and ``command`` tasks. Each section
is asked for by the caller and returned in the shape the controller-side
filters already read (file contents base64-encoded as ``slurp`` returns
them, ``grep -H`` style ``path:line`` lines for the sysctl and tuned
files), so the decisions stay in tested controller code.

Commands go through ``runner(argv) -> (rc, out, err)``; a missing program is
reported as rc None with the error, never raised.
"""

from __future__ import annotations

import base64
import errno
import fnmatch
import glob
import os
import re

from ansible.module_utils.gpunuma.node.programs import program_states
from ansible.module_utils.gpunuma.common.bounded import read_bounded
from ansible.module_utils.gpunuma.node import autonuma
from ansible.module_utils.gpunuma.common import commands
from ansible.module_utils.gpunuma.node import systemctl

MAX_NODE_FILE = 16 * 1024 * 1024
MAX_CONFIG_FILE = 1024 * 1024
MAX_SCAN_FILES = 4096


def read_file(path, limit=MAX_NODE_FILE):
    """{'exists': bool, 'content': base64 or absent, 'problem': text or absent}."""
    try:
        data = read_bounded(path, limit=limit, follow_symlinks=True, what="a gpunuma state file")
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return {"exists": False}
        return {"exists": True, "problem": "%s cannot be read: %s" % (path, exc.strerror or exc)}
    return {"exists": True, "content": base64.b64encode(data).decode("ascii")}


def unit_states(runner, units, props=("LoadState", "ActiveState", "UnitFileState", "MainPID")):
    """{unit: {prop: value}} from one ``systemctl show`` call for all units."""
    units = list(dict.fromkeys(units or []))
    rc, err, states = systemctl.show(runner, units, props)
    if units and (rc is None or (rc != 0 and not states)):
        return {u: {"LoadState": "unknown", "error": (err or "systemctl failed").strip()} for u in units}
    for unit in units:
        states.setdefault(unit, {"LoadState": "unknown"})
    return states


def run_probe(runner, argv):
    rc, out, err = runner(list(argv))
    result = {"rc": rc, "stdout": out or "", "stderr": err or ""}
    if rc is None:
        result["msg"] = err or "No such file or directory"
    return result


def _grep_lines(paths, pattern):
    """``grep -H -E pattern -- paths`` output lines, in Python and bounded."""
    regex = re.compile(pattern)
    lines = []
    for path in paths:
        try:
            data = read_bounded(path, limit=MAX_CONFIG_FILE, follow_symlinks=True, what="a configuration file")
        except OSError:
            continue
        for line in data.decode("utf-8", "replace").splitlines():
            if regex.search(line):
                lines.append("%s:%s" % (path, line))
    return lines


def _list_conf(dirs, pattern):
    found = []
    for directory in dirs:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            if fnmatch.fnmatch(name, pattern):
                found.append(os.path.join(directory, name))
            if len(found) >= MAX_SCAN_FILES:
                return found
    return found


def _find_tuned(dirs, depth=3):
    found = []
    for top in dirs:
        top = top.rstrip("/") or "/"
        for root, subdirs, files in os.walk(top):
            level = root[len(top):].count(os.sep)
            if level >= depth - 1:
                subdirs[:] = []
            if "tuned.conf" in files:
                found.append(os.path.join(root, "tuned.conf"))
            if len(found) >= MAX_SCAN_FILES:
                return sorted(found)
    return sorted(found)


NUMA_BALANCING_PROC_PATH = "/proc/sys/kernel/numa_balancing"


def kernel_release(proc_path):
    """The running kernel's release (``uname -r``), or None when it cannot be read.

    For the node's own ``/proc/sys/kernel/numa_balancing`` it is
    ``os.uname().release``; a ``proc_path`` elsewhere (a copy of procfs in
    tests) has its ``osrelease`` file next to it, as in ``/proc/sys/kernel``.
    """
    if os.path.normpath(proc_path) == NUMA_BALANCING_PROC_PATH:
        return os.uname().release
    entry = read_file(os.path.join(os.path.dirname(proc_path), "osrelease"), limit=256)
    if not entry.get("content"):
        return None
    return base64.b64decode(entry["content"]).decode("utf-8", "replace").strip() or None


def autonuma_probe(runner, spec):
    """The live value, the kernel release, whether this is a container, and who else sets the key."""
    live = read_file(spec["proc_path"], limit=64)
    live_value = base64.b64decode(live["content"]).decode().strip() if live.get("content") else None
    in_container, evidence = autonuma.detect_container(
        runner, markers=tuple(spec.get("container_markers") or autonuma.CONTAINER_MARKERS))
    sysctl_paths = sorted(_list_conf(spec.get("sysctl_dirs") or [], "*.conf"))
    conf = spec.get("sysctl_conf")
    if conf and os.path.exists(conf):
        sysctl_paths.append(conf)
    sysctl_lines = _grep_lines(sysctl_paths, r"numa_balancing")
    rc_tuned, tuned_out, _unused = runner(["tuned-adm", "active"])
    result = {
        "live_value": live_value,
        "kernel_release": kernel_release(spec["proc_path"]),
        "in_container": in_container,
        "container_markers": [e for e in evidence if e.startswith("/")],
        "sysctl_paths": sysctl_paths,
        "sysctl_lines": sysctl_lines,
        "tuned_active_rc": rc_tuned,
        "tuned_active": tuned_out or "",
        "tuned_lines": [],
    }
    if rc_tuned == 0:
        result["tuned_lines"] = _grep_lines(_find_tuned(spec.get("tuned_dirs") or []),
                                            r"^[\s]*(\[|include[\s]*=|.*numa_balancing)")
    return result


def pid1_texts(proc_dir):
    """{name: base64 text} of PID 1's limits, status and uid_map (those readable)."""
    texts = {}
    for name in ("limits", "status", "uid_map"):
        entry = read_file(os.path.join(proc_dir, name), limit=64 * 1024)
        if entry.get("content") is not None:
            texts[name] = entry["content"]
    return texts


CONTAINER_LAUNCHERS = ("docker", "podman", "nerdctl", "ctr", "crictl")
_ENV_LINE = re.compile(r"^\s*(?:export\s+)?CUDA_VISIBLE_DEVICES\s*=\s*(.*?)\s*$")


def _argv_words(exec_start):
    """The argv[] of each command in a ``systemctl show -p ExecStart`` value."""
    commands = []
    for match in re.finditer(r"argv\[\]=(.*?) ;", exec_start or ""):
        commands.append(match.group(1).split())
    return commands


def launches_container(argv):
    """'docker run' etc. when argv starts a container through an engine's CLI, else None."""
    words = [os.path.basename(w) for w in argv[:6]]
    for index, word in enumerate(words):
        if word in CONTAINER_LAUNCHERS:
            rest = words[index + 1:]
            for verb in ("run", "start", "create"):
                if verb in rest[:3]:
                    return "%s %s" % (word, verb)
            if word in ("podman", "docker") and rest[:2] == ["compose", "up"]:
                return "%s compose up" % word
    return None


def inspect_units(runner, units):
    """For units that drop-ins would bind: what their ExecStart= launches and
    whether an EnvironmentFile= sets CUDA_VISIBLE_DEVICES behind the drop-in."""
    units = list(dict.fromkeys(units or []))
    if not units:
        return {}
    _rc, _err, shown = systemctl.show(runner, units, ("ExecStart", "EnvironmentFiles", "Environment"))
    result = {}
    for unit in units:
        if unit not in shown:
            continue
        props = shown[unit]
        exec_start, env = props.get("ExecStart", ""), props.get("Environment", "")
        env_files = [value.split(" (")[0] for value in props.get("EnvironmentFiles", "").split("\n") if value]
        launchers = [l for l in (launches_container(argv) for argv in _argv_words(exec_start)) if l]
        cuda = []
        for path in env_files:
            path = path.lstrip("-")
            try:
                data = read_bounded(path, limit=MAX_CONFIG_FILE, follow_symlinks=True, what="an EnvironmentFile")
            except OSError:
                continue
            for line in data.decode("utf-8", "replace").splitlines():
                match = _ENV_LINE.match(line)
                if match:
                    cuda.append("%s: CUDA_VISIBLE_DEVICES=%s" % (path, match.group(1)))
        if re.search(r"(^|\s)CUDA_VISIBLE_DEVICES=", env or ""):
            cuda.append("Environment=: " + " ".join(w for w in env.split() if w.startswith("CUDA_VISIBLE_DEVICES=")))
        result[unit] = {"container_launchers": launchers, "cuda_visible_devices": cuda}
    return result


def account_states(users=(), groups=()):
    """Which accounts and groups exist: {"users": {name: {"exists", "uid", "groups"}}, "groups": {name: bool}}.

    Numeric ids count as existing (systemd accepts them without an entry).
    """
    import grp
    import pwd

    out = {"users": {}, "groups": {}}
    for name in users or ():
        if str(name).isdigit():
            out["users"][name] = {"exists": True, "uid": int(name), "groups": []}
            continue
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            out["users"][name] = {"exists": False}
            continue
        member = sorted(g.gr_name for g in grp.getgrall() if name in g.gr_mem)
        out["users"][name] = {"exists": True, "uid": entry.pw_uid, "groups": member}
    for name in groups or ():
        if str(name).isdigit():
            out["groups"][name] = True
            continue
        try:
            grp.getgrnam(name)
            out["groups"][name] = True
        except KeyError:
            out["groups"][name] = False
    return out


def probe(runner, files=None, paths=None, units=None, commands=None, pid1_proc_dir=None, autonuma=None,
          inspect=None, accounts=None, programs=None, globs=None):
    out = {}
    if globs:
        # Sorted paths matching each pattern, of any file type (the kubelet's plugin registrations are sockets).
        out["globs"] = {name: sorted(glob.glob(pattern))[:MAX_SCAN_FILES] for name, pattern in globs.items()}
    if programs:
        out["programs"] = program_states(programs)
    if accounts:
        out["accounts"] = account_states(accounts.get("users"), accounts.get("groups"))
    if inspect:
        out["inspect"] = inspect_units(runner, inspect)
    if files:
        out["files"] = {name: read_file(path) for name, path in files.items()}
    if paths:
        out["paths"] = {path: os.path.lexists(path) for path in paths}
    if units:
        out["units"] = unit_states(runner, units)
    if commands:
        out["commands"] = {name: run_probe(runner, argv) for name, argv in commands.items()}
    if pid1_proc_dir:
        out["pid1"] = pid1_texts(pid1_proc_dir)
    if autonuma:
        out["autonuma"] = autonuma_probe(runner, autonuma)
    return out


# gpunuma_node_info's options, also gpu_topology_info's ``node_info`` (the node read made with the discovery).
NODE_INFO_OPTIONS = dict(
    files=dict(type="dict"),
    paths=dict(type="list", elements="str"),
    globs=dict(type="dict"),
    units=dict(type="list", elements="str"),
    inspect_units=dict(type="list", elements="str"),
    commands=dict(type="dict"),
    pid1_proc_dir=dict(type="str"),
    programs=dict(type="list", elements="dict", options=dict(
        path=dict(type="str", required=True),
        user=dict(type="str", default="gpunuma"),
    )),
    accounts=dict(type="dict", options=dict(
        users=dict(type="list", elements="str", default=[]),
        groups=dict(type="list", elements="str", default=[]),
    )),
    autonuma=dict(type="dict", options=dict(
        proc_path=dict(type="str", default="/proc/sys/kernel/numa_balancing"),
        container_markers=dict(type="list", elements="str", default=[]),
        sysctl_dirs=dict(type="list", elements="str", default=[]),
        sysctl_conf=dict(type="str", default="/etc/sysctl.conf"),
        tuned_dirs=dict(type="list", elements="str", default=[]),
    )),
)


def command_problem(params, prefix=""):
    """Why a ``commands`` entry of the node read options is not an argv (a list of words), or None."""
    for name, argv in (params.get("commands") or {}).items():
        if not isinstance(argv, list) or not argv or not all(isinstance(w, str) for w in argv):
            return "%scommands.%s must be an argv (a list of words), got %r" % (prefix, name, argv)
    return None


def node_read_params(options, name="node_info"):
    """``options`` (gpunuma_node_info's, given as another module's ``name``) checked and completed with their
    defaults as gpunuma_node_info's own spec does it; a message naming ``name.<option>`` when they are not."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
    from ansible.module_utils.errors import UnsupportedError

    if not isinstance(options, dict):
        return "%s must be a mapping of gpunuma_node_info's options, got %s" % (name, type(options).__name__)
    result = ArgumentSpecValidator(NODE_INFO_OPTIONS).validate(options)
    if result.error_messages:
        return "%s: %s" % (name, "; ".join(("unsupported option " if isinstance(e, UnsupportedError) else "") + e.msg
                                           for e in result.errors.errors))
    return command_problem(result.validated_parameters, name + ".") or result.validated_parameters


def probe_with(module, params):
    """:func:`probe` on gpunuma_node_info's validated ``params``, commands run through ``module``."""
    return probe(commands.runner(module), files=params.get("files"), paths=params.get("paths"), units=params.get("units"),
                 commands=params.get("commands"), pid1_proc_dir=params.get("pid1_proc_dir"),
                 autonuma=params.get("autonuma"), inspect=params.get("inspect_units"), accounts=params.get("accounts"),
                 programs=params.get("programs"), globs=params.get("globs"))
