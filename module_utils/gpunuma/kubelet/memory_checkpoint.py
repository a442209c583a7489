"""The kubelet's Memory Manager checkpoint against the node's memory, before the kubelet starts.

Standard library only: the kubelet_topology role installs this file on the
node as a script that the kubelet unit runs first (``ExecStartPre=-``, a
drop-in), wherever the plan sets ``memoryManagerPolicy: Static``.

Why: under the Static policy the kubelet records each NUMA node's memory
(``machineState[node].memoryMap.memory.total``, the node's ``MemTotal``; in
the ``data`` string where the kubelet writes one) in
``memory_manager_state`` and refuses to start when the machine no longer
matches it ("the expected machine state is different from the real one").
After a reboot, kernel address-space layout randomisation (KASLR) can move the
kernel image from one NUMA node to another, so each node's MemTotal shifts by a
few KiB to MiB and a node that was fine stays NotReady (kubernetes#131253,
NVIDIA/gpu-operator#455). OpenShift's Machine Config Operator removes the file
before every kubelet start (openshift/machine-config-operator#2718); this check
removes it only when it is that case:

- the checkpoint was written before this boot (its mtime is older than the
  kernel's boot time): a drift that appears without a reboot is not KASLR;
- the same NUMA nodes, the same hugepage totals, and each node's ``memory``
  total within ``--tolerance`` bytes of its MemTotal now (128 MiB by default:
  the kernel image, which is what moves, is tens of MiB; KEP-6232 measures
  55 MiB plus a 64 MiB grace).

Anything else (a memory bank added or removed, hugepages changed, a checkpoint
that cannot be read) is left for the kubelet to refuse with its own message:
that needs an operator. A removed checkpoint is moved to ``--backup-dir``,
never deleted, and every decision is one line on standard output (the kubelet
unit's journal). The script exits 0 whatever it finds, and the unit runs it
with ``-``, so it can never keep the kubelet from starting.

The node's memory is read the way the kubelet's cAdvisor reads it:
``/sys/devices/system/node/node<N>/meminfo`` ``MemTotal`` (kB) and
``hugepages/hugepages-<size>kB/nr_hugepages``; a machine without NUMA sysfs is
one node 0 with ``/proc/meminfo``'s MemTotal.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import shutil
import stat
import sys
import time

STATE_FILE = "memory_manager_state"
DEFAULT_TOLERANCE = 128 * 1024 * 1024
# The checkpoint of a node with many pods is tens of KiB; sysfs and procfs files are smaller still.
MAX_READ_BYTES = 16 * 1024 * 1024
_MEMTOTAL_RE = re.compile(r"MemTotal:\s*([0-9]+)\s*kB")
_NODE_DIR_RE = re.compile(r"^node([0-9]+)$")
_HUGEPAGES_DIR_RE = re.compile(r"^hugepages-([0-9]+)kB$")
_UNITS = (("Gi", 1024 * 1024), ("Mi", 1024), ("Ki", 1))


class CheckpointError(ValueError):
    """The checkpoint cannot be read as a Memory Manager checkpoint."""


def hugepage_resource(size_kb):
    """The kubelet's resource name of a hugepage size in kB (``2048`` -> ``hugepages-2Mi``)."""
    for suffix, factor in _UNITS:
        if size_kb % factor == 0:
            return "hugepages-%d%s" % (size_kb // factor, suffix)
    return "hugepages-%dKi" % size_kb


def checkpoint_totals(text):
    """``{node id: {resource: total bytes}}`` recorded in a ``memory_manager_state`` text.

    Raises :class:`CheckpointError` naming what is wrong."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # the guard runs alone on the node: no core reader here
        raise CheckpointError("not JSON (%s)" % ("nested too deep" if isinstance(exc, RecursionError) else exc))
    if not isinstance(data, dict):
        raise CheckpointError("not a JSON object")
    # Kubelets that write ``data`` (the state as a JSON string, with ``dataChecksum``) read that, not the
    # top-level copy beside it (seen with the upstream kubelet 1.37).
    if isinstance(data.get("data"), str):
        try:
            data = json.loads(data["data"])
        except (ValueError, RecursionError) as exc:
            raise CheckpointError("its data is not JSON (%s)"
                                  % ("nested too deep" if isinstance(exc, RecursionError) else exc))
        if not isinstance(data, dict):
            raise CheckpointError("its data is not a JSON object")
    machine = data.get("machineState")
    if machine is None:
        return {}
    if not isinstance(machine, dict):
        raise CheckpointError("machineState is not an object")
    totals = {}
    for node, state in machine.items():
        if not str(node).isdigit() or not isinstance(state, dict) or not isinstance(state.get("memoryMap"), dict):
            raise CheckpointError("machineState[%s] has no memoryMap" % node)
        resources = {}
        for resource, table in state["memoryMap"].items():
            total = table.get("total") if isinstance(table, dict) else None
            if isinstance(total, bool) or not isinstance(total, int):
                raise CheckpointError("machineState[%s].memoryMap.%s.total is not a number" % (node, resource))
            resources[str(resource)] = total
        totals[int(node)] = resources
    return totals


def _read(path, limit=MAX_READ_BYTES):
    """A regular file's text, at most ``limit`` bytes; OSError otherwise (what every caller already handles)."""
    # O_NONBLOCK: a FIFO put in the file's place must not hang the kubelet's start.
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, "larger than %d bytes" % limit, path)
    return data.decode("utf-8", "replace")


def _listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def machine_totals(root="/"):
    """``{node id: {resource: total bytes}}`` of the running machine, as the kubelet sees it."""
    node_root = os.path.join(root, "sys/devices/system/node")
    totals = {}
    for name in _listdir(node_root):
        match = _NODE_DIR_RE.match(name)
        if not match:
            continue
        node_dir = os.path.join(node_root, name)
        try:
            memtotal = _MEMTOTAL_RE.search(_read(os.path.join(node_dir, "meminfo")))
        except OSError:
            continue
        resources = {"memory": int(memtotal.group(1)) * 1024 if memtotal else 0}
        huge_dir = os.path.join(node_dir, "hugepages")
        for size_name in _listdir(huge_dir):
            size = _HUGEPAGES_DIR_RE.match(size_name)
            if not size:
                continue
            try:
                pages = int(_read(os.path.join(huge_dir, size_name, "nr_hugepages")).strip() or 0)
            except (OSError, ValueError):
                continue
            resources[hugepage_resource(int(size.group(1)))] = pages * int(size.group(1)) * 1024
        totals[int(match.group(1))] = resources
    if not totals:
        memtotal = _MEMTOTAL_RE.search(_read(os.path.join(root, "proc/meminfo")))
        totals[0] = {"memory": int(memtotal.group(1)) * 1024 if memtotal else 0}
    return totals


def compare(recorded, actual, tolerance=DEFAULT_TOLERANCE):
    """``(verdict, detail)``: ``match``, ``drift`` (only ``memory`` totals moved, each within
    ``tolerance``) or ``different`` (anything else), with one line saying what differs."""
    if set(recorded) != set(actual):
        return "different", "NUMA nodes %s recorded, %s now" % (sorted(recorded), sorted(actual))
    moved = []
    for node in sorted(recorded):
        was, now = recorded[node], actual[node]
        # Hugepage sizes the checkpoint has no entry for have no pages reserved (size 0 is not recorded).
        for resource in sorted(set(was) | set(now)):
            old, new = was.get(resource, 0), now.get(resource, 0)
            if old == new:
                continue
            if resource != "memory":
                return "different", "node %d %s total %d bytes recorded, %d now" % (node, resource, old, new)
            if abs(old - new) > tolerance:
                return "different", ("node %d memory total %d bytes recorded, %d now: %+d bytes, more than the %d bytes "
                                     "a moved kernel image explains" % (node, old, new, new - old, tolerance))
            moved.append("node %d %+d bytes" % (node, new - old))
    if moved:
        return "drift", "memory totals moved within %d bytes (%s)" % (tolerance, ", ".join(moved))
    return "match", "memory totals match the machine"


def boot_time(root="/"):
    """The kernel's boot time (``btime`` of ``/proc/stat``), seconds since the epoch."""
    for line in _read(os.path.join(root, "proc/stat")).splitlines():
        if line.startswith("btime "):
            return int(line.split()[1])
    raise ValueError("no btime in /proc/stat")


def _move(path, target):
    """Rename, or where the backup is on another filesystem (/var/lib/kubelet is often a mount of its own):
    copy to a temporary name beside the target, flush it, rename it into place, then remove the original."""
    try:
        os.rename(path, target)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    partial = target + ".part"
    shutil.copy2(path, partial)
    with open(partial, "rb") as handle:
        os.fsync(handle.fileno())
    os.rename(partial, target)
    os.unlink(path)


def check(state_dir, root="/", tolerance=DEFAULT_TOLERANCE, backup_dir=None, now=None):
    """Decide on ``<state_dir>/memory_manager_state``; returns ``(action, line)``.

    ``action`` is ``absent``, ``kept`` or ``removed`` (moved into ``backup_dir``)."""
    path = os.path.join(state_dir, STATE_FILE)
    try:
        text = _read(path)
        mtime = os.stat(path).st_mtime
    except FileNotFoundError:
        return "absent", "%s: absent; nothing to check" % path
    except OSError as exc:
        return "kept", "%s: kept; it cannot be read (%s) and the kubelet says what it makes of it" % (path, exc)
    try:
        recorded = checkpoint_totals(text)
    except CheckpointError as exc:
        return "kept", "%s: kept; it cannot be read (%s) and the kubelet says what it makes of it" % (path, exc)
    if not recorded:
        return "kept", "%s: kept; it records no machine state" % path
    verdict, detail = compare(recorded, machine_totals(root), tolerance)
    if verdict == "match":
        return "kept", "%s: kept; %s" % (path, detail)
    if verdict == "different":
        return "kept", ("%s: kept; %s. The kubelet will refuse it (\"the expected machine state is different from the "
                        "real one\"): drain the node, then move the file aside" % (path, detail))
    try:
        booted = boot_time(root)
    except (OSError, ValueError) as exc:
        return "kept", "%s: kept; %s, but the boot time cannot be read (%s)" % (path, detail, exc)
    if mtime >= booted:
        return "kept", ("%s: kept; %s, but it was written after this boot, so no reboot moved the kernel: the kubelet "
                        "says what it makes of it" % (path, detail))
    backup_dir = backup_dir or state_dir
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now if now is not None else time.time()))
    target = os.path.join(backup_dir, "%s.stale-%s" % (STATE_FILE, stamp))
    try:
        if not os.path.isdir(backup_dir):
            os.makedirs(backup_dir, 0o700)
        _move(path, target)
    except OSError as exc:
        return "kept", "%s: kept; %s since the last boot, but moving it to %s failed: %s" % (path, detail, target, exc)
    return "removed", ("%s: moved to %s; %s since the last boot (a moved kernel image, kubernetes#131253): the kubelet "
                       "starts with a fresh Memory Manager state" % (path, target, detail))


def main(argv=None):
    parser = argparse.ArgumentParser(description="Move a Memory Manager checkpoint aside when a reboot moved the "
                                     "kernel image between NUMA nodes (gpunuma, docs/kubelet.md).")
    parser.add_argument("--state-dir", default="/var/lib/kubelet", help="the kubelet's root directory")
    parser.add_argument("--tolerance", type=int, default=DEFAULT_TOLERANCE,
                        help="largest per-node memory drift in bytes taken as a moved kernel image")
    parser.add_argument("--backup-dir", default=None, help="where a stale checkpoint is moved (default: --state-dir)")
    parser.add_argument("--root", default="/", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        _action, line = check(args.state_dir, args.root, args.tolerance, args.backup_dir)
    except Exception as exc:  # pylint: disable=broad-exception-caught  # never keep the kubelet from starting
        line = "%s: not checked: %s" % (os.path.join(args.state_dir, STATE_FILE), exc)
    sys.stdout.write("gpunuma memory checkpoint check: %s\n" % line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
