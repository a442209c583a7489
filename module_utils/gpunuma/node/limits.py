"""Resource limits: ``/proc/<pid>/limits``, and the memlock ceiling systemd cannot pass.

systemd applies a unit's ``LimitMEMLOCK=`` with setrlimit() in the forked
child of PID 1. Raising a hard limit above the current one needs
CAP_SYS_RESOURCE in the initial user namespace; without it (a container's
systemd under Docker's or Kubernetes' default capabilities, or any user
namespace) the kernel refuses and systemd quietly applies the closest value
it may, PID 1's own hard limit. A unit asking for 64M inside a container
whose runtime left 8 MiB then runs with 8 MiB, and NCCL/RDMA registration
fails or falls back without saying why. These functions read the text of
PID 1's ``limits``, ``status`` and ``uid_map`` and say what a unit gets.
"""

from __future__ import annotations

import base64
import re
from typing import Any, Union

from ansible.module_utils.gpunuma.common.errors import GpunumaError, SysfsError
from ansible.module_utils.gpunuma.common.sizes import MAX_SIZE, SizeError, format_size, parse_size

MEMLOCK = "Max locked memory"
# linux/capability.h
CAP_SYS_RESOURCE = 24
# Spellings of "no limit": limits.conf and /proc say unlimited, systemd infinity.
UNLIMITED_WORDS = ("unlimited", "infinity")

# Columns are padded with spaces; the name itself has single spaces.
# Used with fullmatch: a trailing newline is not silently accepted.
_LIMIT_LINE_RE = re.compile(r"(\S.*?)\s{2,}(\S+)\s+(\S+)(?:\s+(\S+))?\s*")
_CAP_LINE_RE = re.compile(r"(Cap[A-Za-z]+):\s*([0-9a-fA-F]+)\s*")
_UID_MAP_LINE_RE = re.compile(r"\s*([0-9]+)\s+([0-9]+)\s+([0-9]+)\s*")
# The identity map of the initial user namespace: all 2^32-1 ids.
_INIT_UID_MAP = (0, 0, 4294967295)


def _limit_value(text, source, name):
    if text == "unlimited":
        return None
    if text.isdigit():
        return int(text)
    raise SysfsError("%s: %r has %r as a limit; allowed: a number or unlimited" % (source, name, text))


def parse_proc_limits(text, source="/proc/<pid>/limits"):
    """``{name: {"soft", "hard", "units"}}`` from a ``/proc/<pid>/limits`` text.

    ``soft``/``hard`` are ints, or None for ``unlimited``; ``units`` is the
    last column (``bytes``, ``seconds``, ...) or None where the kernel
    prints none.
    """
    if not isinstance(text, str):
        raise SysfsError("%s: %r is not text; allowed: the contents of /proc/<pid>/limits" % (source, text))
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("Limit"):
        raise SysfsError(
            "%s: no 'Limit  Soft Limit  Hard Limit  Units' header; allowed: the contents of /proc/<pid>/limits" % source
        )
    limits = {}
    for line in lines[1:]:
        match = _LIMIT_LINE_RE.fullmatch(line)
        if not match:
            raise SysfsError(
                "%s: cannot read the line %r; allowed: '<name>  <soft>  <hard>  [<units>]'" % (source, line)
            )
        name, soft, hard, units = match.groups()
        limits[name] = {
            "soft": _limit_value(soft, source, name),
            "hard": _limit_value(hard, source, name),
            "units": units,
        }
    return limits


def hard_limit(text, name=MEMLOCK, source="/proc/<pid>/limits"):
    """The hard limit ``name`` in a ``/proc/<pid>/limits`` text (None: unlimited)."""
    limits = parse_proc_limits(text, source)
    if name not in limits:
        raise SysfsError("%s: has no %r line; allowed: the contents of /proc/<pid>/limits" % (source, name))
    return limits[name]["hard"]


def capability_lines(text):
    """The capability lines (``Cap<set>:``) of a ``/proc/<pid>/status`` text: all of it gpunuma decides from."""
    return [line for line in text.splitlines() if line.startswith("Cap")]


def parse_capabilities(text, source="/proc/<pid>/status"):
    """``{"CapEff": int, ...}``: the capability sets in a ``/proc/<pid>/status`` text."""
    if not isinstance(text, str):
        raise SysfsError("%s: %r is not text; allowed: the contents of /proc/<pid>/status" % (source, text))
    caps = {}
    for line in capability_lines(text):
        match = _CAP_LINE_RE.fullmatch(line)
        if not match:
            raise SysfsError("%s: cannot read the line %r; allowed: 'Cap<set>:\\t<hex mask>'" % (source, line))
        caps[match.group(1)] = int(match.group(2), 16)
    if "CapEff" not in caps:
        raise SysfsError("%s: has no CapEff line; allowed: the contents of /proc/<pid>/status" % source)
    return caps


def in_initial_user_namespace(uid_map_text, source="/proc/<pid>/uid_map"):
    """Whether a ``uid_map`` is the initial namespace's identity map.

    None (no uid_map: a kernel without user namespaces) counts as the
    initial namespace.
    """
    if uid_map_text is None:
        return True
    if not isinstance(uid_map_text, str):
        raise SysfsError("%s: %r is not text; allowed: the contents of /proc/<pid>/uid_map" % (source, uid_map_text))
    entries = []
    for line in uid_map_text.splitlines():
        if not line.strip():
            continue
        match = _UID_MAP_LINE_RE.fullmatch(line)
        if not match:
            raise SysfsError("%s: cannot read the line %r; allowed: '<inside> <outside> <count>'" % (source, line))
        entries.append(tuple(int(part) for part in match.groups()))
    return entries == [_INIT_UID_MAP]


class LimitError(GpunumaError, ValueError):
    """A limit is not a limit at all (``malformed``), or lies outside what can be meant."""

    def __init__(self, message, malformed):
        super().__init__(message)
        self.malformed = malformed


def parse_limit(value, what="memlock_limit"):
    """Bytes from a limit (``64G``, ``512M``, ``8k``, an int), or None for unlimited/infinity.

    The size grammar is ``sizes.parse_size`` (the planner reads instance
    ``memory`` and ``memlock`` with the same code). A limit of 0 locks no
    memory at all: CUDA pinned host memory, NCCL and RDMA registration then
    fail, so 0 is refused rather than written.
    """
    if isinstance(value, str) and value.strip().lower() in UNLIMITED_WORDS:
        return None
    try:
        limit = parse_size(value, what)
    except SizeError as exc:
        if exc.out_of_range:
            raise LimitError(
                "%s: %r is more than any limit the kernel or systemd holds; allowed: 1 to %d bytes, "
                "unlimited or infinity" % (what, value, MAX_SIZE),
                malformed=False,
            )
        raise LimitError(
            "%s: %r is not a limit; allowed: unlimited, infinity, bytes as an integer, or a size such as 64G"
            % (what, value),
            malformed=True,
        )
    if limit == 0:
        raise LimitError(
            "%s: %r locks no memory, so pinned host memory (cudaHostAlloc, NCCL, RDMA registration) fails; "
            "allowed: 1 byte or more (a size such as 64G), unlimited or infinity" % (what, value),
            malformed=False,
        )
    return limit


def systemd_limit(value: Any, what: str = "memlock_limit") -> Union[int, str]:
    """A limit as ``LimitMEMLOCK=`` takes it: ``"infinity"`` or bytes (int)."""
    limit = parse_limit(value, what)
    return "infinity" if limit is None else limit


def format_limit(limit):
    """``8 MiB``, ``1.5 GiB``, ``1000 bytes`` or ``unlimited`` for messages."""
    if limit is None:
        return "unlimited"
    return format_size(limit)


def memlock_ceiling(limits_text, status_text, uid_map_text=None, source="/proc/1"):
    """The highest RLIMIT_MEMLOCK systemd (PID 1) can give a unit.

    Returns ``{"hard", "can_raise", "ceiling", "reason"}``: ``hard`` is PID
    1's own hard limit (None: unlimited); ``can_raise`` whether it holds
    CAP_SYS_RESOURCE in the initial user namespace; ``ceiling`` the limit a
    unit cannot exceed (None: none); ``reason`` a sentence for the report.
    """
    hard = hard_limit(limits_text, MEMLOCK, source + "/limits")
    effective_caps = parse_capabilities(status_text, source + "/status")["CapEff"]
    has_cap = bool(effective_caps & (1 << CAP_SYS_RESOURCE))
    init_ns = in_initial_user_namespace(uid_map_text, source + "/uid_map")
    can_raise = has_cap and init_ns
    if hard is None:
        reason = "PID 1's hard memlock limit is unlimited"
    elif can_raise:
        reason = "PID 1 holds CAP_SYS_RESOURCE and may raise its hard memlock limit (%s)" % format_limit(hard)
    elif not has_cap:
        reason = "PID 1's hard memlock limit is %s and PID 1 lacks CAP_SYS_RESOURCE" % format_limit(hard)
    else:
        reason = (
            "PID 1's hard memlock limit is %s and PID 1 runs in a user namespace, where CAP_SYS_RESOURCE "
            "cannot raise it" % format_limit(hard)
        )
    return {"hard": hard, "can_raise": can_raise, "ceiling": None if can_raise else hard, "reason": reason}


def memlock_clamp(wanted, ceiling, what="memlock_limit"):
    """What a unit asking for ``wanted`` gets under ``ceiling`` (:func:`memlock_ceiling`).

    Returns ``{"wanted", "ceiling", "effective", "clamped", "effective_systemd"}``:
    ``wanted``/``ceiling``/``effective`` in bytes (None: unlimited),
    ``clamped`` whether the unit gets less than it asks for, and
    ``effective_systemd`` the effective limit as ``LimitMEMLOCK=`` writes it.
    """
    if not isinstance(ceiling, dict) or "ceiling" not in ceiling:
        raise GpunumaError(
            "memlock ceiling: %r is not a memlock_ceiling() result; allowed: {hard, can_raise, ceiling, reason}"
            % (ceiling,)
        )
    wanted_bytes = parse_limit(wanted, what)
    cap = ceiling["ceiling"]
    if cap is None:
        effective = wanted_bytes
    elif wanted_bytes is None:
        effective = cap
    else:
        effective = min(wanted_bytes, cap)
    return {
        "wanted": wanted_bytes,
        "ceiling": cap,
        "effective": effective,
        "clamped": effective != wanted_bytes,
        "effective_systemd": "infinity" if effective is None else effective,
    }


def clamp_message(clamp, ceiling, what="memlock_limit"):
    """Why a unit gets less than ``what`` asks for, and how to lift the ceiling; None when it is not clamped.

    ``clamp``: :func:`memlock_clamp` output; ``ceiling``: :func:`memlock_ceiling` output.
    """
    for name, value, keys in (
        ("memlock clamp", clamp, ("wanted", "effective", "clamped")),
        ("memlock ceiling", ceiling, ("reason",)),
    ):
        if not isinstance(value, dict) or any(key not in value for key in keys):
            raise GpunumaError(
                "%s: %r lacks %s; allowed: the result of %s()" % (name, value, ", ".join(keys), name.replace(" ", "_"))
            )
    if not clamp["clamped"]:
        return None
    return (
        "%s asks for %s of locked memory but systemd units on this node get %s: %s, so systemd lowers "
        "every LimitMEMLOCK= above it (instance units, containerd and the pods it starts) without an error. "
        "Pinned host memory (cudaHostAlloc, NCCL, RDMA registration) then fails or falls back to slower paths. "
        "Fix: raise the memlock ulimit of the runtime that starts this node, e.g. `docker run --ulimit memlock=-1` "
        "(compose: ulimits: {memlock: -1}); on Kubernetes the container inherits containerd's limit, so set "
        "LimitMEMLOCK=infinity in containerd.service on the host; then restart the container. Or lower %s to %s."
        % (
            what,
            format_limit(clamp["wanted"]),
            format_limit(clamp["effective"]),
            ceiling["reason"],
            what,
            format_limit(clamp["effective"]),
        )
    )


def role_plan(wanted, pid1, proc_dir, on_clamp, hostname, what="memlock_limit"):
    """Everything the memlock role decides from one read of PID 1 (``pid1``: gpunuma_node_info's ``pid1``, each
    file base64-encoded as read; ``limits`` or ``status`` missing: the ceiling is unknown).

    Returns ``{systemd_limit, effective_limit, pam_value, problem, notes}``: the limit as ``LimitMEMLOCK=``
    takes it, what units really get under PID 1's ceiling (:func:`memlock_clamp`), the limits.d value (KiB or
    ``unlimited``), why the host stops (``on_clamp: fail`` and a clamp), and what to say.
    """
    systemd = systemd_limit(wanted, what)
    out = {"systemd_limit": systemd, "effective_limit": systemd, "problem": None, "notes": [],
           "pam_value": "unlimited" if systemd == "infinity" else systemd // 1024}
    pid1 = pid1 or {}
    if "limits" not in pid1 or "status" not in pid1:
        out["notes"].append("%s/limits or /status could not be read: whether systemd can give units LimitMEMLOCK=%s "
                            "is not checked." % (proc_dir, systemd))
        return out
    text = dict((name, base64.b64decode(pid1[name]).decode("utf-8", "replace"))
                for name in ("limits", "status", "uid_map") if name in pid1)
    ceiling = memlock_ceiling(text["limits"], text["status"], text.get("uid_map"), proc_dir)
    clamp = memlock_clamp(wanted, ceiling, what)
    out["effective_limit"] = clamp["effective_systemd"]
    if clamp["clamped"]:
        message = clamp_message(clamp, ceiling, what)
        if on_clamp == "fail":
            out["problem"] = ("%s: %s (memlock_on_clamp is fail; set it to warn to go on with the lower limit)"
                              % (hostname, message))
        else:
            out["notes"].append("WARNING %s: %s" % (hostname, message))
    return out
