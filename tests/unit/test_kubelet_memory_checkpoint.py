"""The Memory Manager checkpoint check the kubelet unit runs before it starts (kubelet/memory_checkpoint.py).

Checkpoints are shaped as the kubelet writes them (pkg/kubelet/cm/memorymanager/state:
MemoryTable's ``total``/``systemReserved``/``allocatable``/``reserved``/``free``); the
machine is a temporary tree laid out like ``/sys/devices/system/node`` and ``/proc``.
The real kubelet refusing a drifted checkpoint, and starting after this check moved
it, is tests/integration/test_kubelet_real.py.
"""

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible.module_utils.gpunuma.kubelet import memory_checkpoint as mc
from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

GIB = 1024 ** 3
BOOT = 1_700_000_000


def table(total, reserved=0):
    return {"total": total, "systemReserved": reserved, "allocatable": total - reserved, "reserved": 0,
            "free": total - reserved}


def checkpoint(nodes, entries=None):
    """A memory_manager_state as the kubelet writes it: {node: {resource: total}}."""
    machine = {}
    for node, resources in nodes.items():
        machine[str(node)] = {"numberOfAssignments": 0, "cells": [node],
                              "memoryMap": {name: table(total) for name, total in resources.items()}}
    data = {"policyName": "Static", "machineState": machine, "checksum": 1234567890}
    if entries:
        data["entries"] = entries
    return json.dumps(data)


def machine(root, nodes, boot=BOOT, numa_sysfs=True):
    """A /sys/devices/system/node and /proc tree with each node's MemTotal (bytes) and hugepages {kB: pages}."""
    proc = root / "proc"
    proc.mkdir(parents=True, exist_ok=True)
    (proc / "stat").write_text("cpu  1 2 3 4\nbtime %d\nprocesses 5\n" % boot)
    total = sum(n["memory"] for n in nodes.values())
    (proc / "meminfo").write_text("MemTotal:       %d kB\nMemFree:        1 kB\n" % (total // 1024))
    if not numa_sysfs:
        return
    for node, spec in nodes.items():
        nd = root / "sys/devices/system/node" / ("node%d" % node)
        nd.mkdir(parents=True)
        (nd / "meminfo").write_text("Node %d MemTotal:       %d kB\nNode %d MemFree:  1 kB\n"
                                    % (node, spec["memory"] // 1024, node))
        for size_kb, pages in spec.get("hugepages", {}).items():
            hp = nd / "hugepages" / ("hugepages-%dkB" % size_kb)
            hp.mkdir(parents=True)
            (hp / "nr_hugepages").write_text("%d\n" % pages)
    (root / "sys/devices/system/node/possible").write_text("0-%d\n" % max(nodes))


def state_dir(tmp_path, text, written=BOOT - 600):
    sd = tmp_path / "kubelet"
    sd.mkdir()
    path = sd / "memory_manager_state"
    path.write_text(text)
    os.utime(path, (written, written))
    return sd


def test_a_kaslr_drift_written_before_this_boot_is_moved_aside(tmp_path):
    root = tmp_path / "root"
    machine(root, {0: {"memory": 64 * GIB + 12 * 1024}, 1: {"memory": 64 * GIB - 12 * 1024}})
    sd = state_dir(tmp_path, checkpoint({0: {"memory": 64 * GIB}, 1: {"memory": 64 * GIB}}))
    before = (sd / "memory_manager_state").read_text()
    action, line = mc.check(str(sd), str(root), backup_dir=str(tmp_path / "backup"), now=BOOT + 10)
    assert action == "removed", line
    assert not (sd / "memory_manager_state").exists()
    moved = list((tmp_path / "backup").iterdir())
    assert [p.name for p in moved] == ["memory_manager_state.stale-20231114T221330Z"]
    assert moved[0].read_text() == before, "the stale checkpoint is kept byte for byte"
    assert "node 0 +12288 bytes" in line and "node 1 -12288 bytes" in line and "kubernetes#131253" in line


def test_a_matching_checkpoint_is_kept(tmp_path):
    root = tmp_path / "root"
    machine(root, {0: {"memory": 32 * GIB, "hugepages": {2048: 512}}})
    sd = state_dir(tmp_path, checkpoint({0: {"memory": 32 * GIB, "hugepages-2Mi": GIB, "hugepages-1Gi": 0}}))
    action, line = mc.check(str(sd), str(root))
    assert action == "kept" and "match" in line
    assert (sd / "memory_manager_state").exists()


@pytest.mark.parametrize("recorded, now, needle", [
    ({0: {"memory": 64 * GIB}}, {0: {"memory": 64 * GIB}, 1: {"memory": 64 * GIB}}, "NUMA nodes [0] recorded, [0, 1] now"),
    ({0: {"memory": 64 * GIB}}, {0: {"memory": 48 * GIB}}, "more than the"),
    ({0: {"memory": 64 * GIB, "hugepages-1Gi": 8 * GIB}}, {0: {"memory": 64 * GIB, "hugepages": {1048576: 4}}},
     "hugepages-1Gi total"),
], ids=["node-added", "bank-removed", "hugepages-changed"])
def test_a_real_change_is_left_for_the_kubelet_to_refuse(tmp_path, recorded, now, needle):
    root = tmp_path / "root"
    machine(root, now)
    sd = state_dir(tmp_path, checkpoint(recorded))
    action, line = mc.check(str(sd), str(root))
    assert action == "kept", line
    assert needle in line and "drain the node" in line
    assert (sd / "memory_manager_state").exists()


def test_a_drift_without_a_reboot_is_not_kaslr(tmp_path):
    root = tmp_path / "root"
    machine(root, {0: {"memory": 64 * GIB + 4096}})
    sd = state_dir(tmp_path, checkpoint({0: {"memory": 64 * GIB}}), written=BOOT + 60)
    action, line = mc.check(str(sd), str(root))
    assert action == "kept" and "written after this boot" in line
    assert (sd / "memory_manager_state").exists()


@pytest.mark.parametrize("text, needle", [
    ("{not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({"policyName": "Static", "machineState": {"0": {"memoryMap": {"memory": {"total": "x"}}}}}),
     "machineState[0].memoryMap.memory.total is not a number"),
])
def test_an_unreadable_checkpoint_is_kept_and_named(tmp_path, text, needle):
    root = tmp_path / "root"
    machine(root, {0: {"memory": GIB}})
    sd = state_dir(tmp_path, text)
    action, line = mc.check(str(sd), str(root))
    assert action == "kept" and needle in line


def test_a_machine_without_numa_sysfs_is_node_0_of_proc_meminfo(tmp_path):
    root = tmp_path / "root"
    machine(root, {0: {"memory": 8 * GIB}}, numa_sysfs=False)
    assert mc.machine_totals(str(root)) == {0: {"memory": 8 * GIB}}


def test_hugepage_sizes_are_named_as_the_kubelet_names_them():
    assert [mc.hugepage_resource(kb) for kb in (64, 2048, 32768, 1048576)] == [
        "hugepages-64Ki", "hugepages-2Mi", "hugepages-32Mi", "hugepages-1Gi"]


@settings(max_examples=200, deadline=None)
@given(totals=st.dictionaries(st.integers(0, 7), st.integers(GIB, 512 * GIB), min_size=1, max_size=8),
       shifts=st.lists(st.integers(-(1 << 30), 1 << 30), min_size=8, max_size=8),
       tolerance=st.integers(0, 1 << 29))
def test_compare_moves_only_a_drift_within_the_tolerance(totals, shifts, tolerance):
    recorded = {n: {"memory": t} for n, t in totals.items()}
    actual = {n: {"memory": t + shifts[n]} for n, t in totals.items()}
    verdict, _detail = mc.compare(recorded, actual, tolerance)
    moved = [shifts[n] for n in totals if shifts[n]]
    if not moved:
        assert verdict == "match"
    elif all(abs(s) <= tolerance for s in moved):
        assert verdict == "drift"
    else:
        assert verdict == "different"


def test_the_script_runs_alone_and_never_fails_the_unit(tmp_path):
    """As the node runs it: a file of its own, standard library only, exit 0 even on a broken root."""
    script = os.path.join(REPO_ROOT, "module_utils", "gpunuma", "kubelet", "memory_checkpoint.py")
    root = tmp_path / "root"
    machine(root, {0: {"memory": 64 * GIB + 8192}})
    sd = state_dir(tmp_path, checkpoint({0: {"memory": 64 * GIB}}))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    run = subprocess.run([sys.executable, "-I", script, "--state-dir", str(sd), "--root", str(root)],
                         capture_output=True, text=True, env=env, cwd=str(tmp_path), check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("gpunuma memory checkpoint check: ") and "moved to" in run.stdout
    assert [p.name.split(".stale-")[0] for p in sd.iterdir()] == ["memory_manager_state"]
    # A root the script cannot read (no /proc, no /sys): it says so and still exits 0.
    (sd / "memory_manager_state").write_text(checkpoint({0: {"memory": 64 * GIB}}))
    broken = subprocess.run([sys.executable, "-I", script, "--state-dir", str(sd), "--root", str(tmp_path / "none")],
                            capture_output=True, text=True, env=env, check=False)
    assert broken.returncode == 0, broken.stderr
    assert "not checked" in broken.stdout
    assert (sd / "memory_manager_state").exists()


def test_the_data_string_of_a_real_kubelet_checkpoint_is_what_counts(tmp_path):
    """Upstream kubelet 1.37 writes the state twice, at the top and as the JSON string ``data`` (which it reads):
    a drift in ``data`` alone moves the file; the top-level copy is not consulted."""
    from conftest import FIXTURES

    with open(os.path.join(FIXTURES, "kubelet", "checkpoints", "memory_manager_state-v1.37.2"), encoding="utf-8") as h:
        text = h.read()
    assert mc.checkpoint_totals(text) == {0: {"memory": 12710567936, "hugepages-1Gi": 0, "hugepages-2Mi": 0}}
    root = tmp_path / "root"
    machine(root, {0: {"memory": 12710567936 + 8192}})
    sd = state_dir(tmp_path, text)
    assert mc.check(str(sd), str(root))[0] == "removed"
    # The top-level copy drifted, data did not: data wins, and it matches.
    data = json.loads(text)
    data["machineState"]["0"]["memoryMap"]["memory"]["total"] += 8192
    root2 = tmp_path / "root2"
    machine(root2, {0: {"memory": 12710567936}})
    sd2 = tmp_path / "k2"
    sd2.mkdir()
    (sd2 / "memory_manager_state").write_text(json.dumps(data))
    action, line = mc.check(str(sd2), str(root2))
    assert action == "kept" and "match" in line


def test_a_backup_on_another_filesystem_is_copied_then_removed(tmp_path, monkeypatch):
    """os.rename across filesystems fails with EXDEV (seen with /var/lib/kubelet on a tmpfs of its own)."""
    import errno

    root = tmp_path / "root"
    machine(root, {0: {"memory": 64 * GIB + 4096}})
    sd = state_dir(tmp_path, checkpoint({0: {"memory": 64 * GIB}}))
    before = (sd / "memory_manager_state").read_text()
    real_rename = os.rename

    def rename(src, dst):
        if str(src).endswith("memory_manager_state"):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real_rename(src, dst)

    monkeypatch.setattr(mc.os, "rename", rename)
    action, line = mc.check(str(sd), str(root), backup_dir=str(tmp_path / "elsewhere"))
    assert action == "removed", line
    (moved,) = list((tmp_path / "elsewhere").iterdir())
    assert moved.read_text() == before and not moved.name.endswith(".part")
    assert not (sd / "memory_manager_state").exists()


@pytest.mark.parametrize("kind", ["fifo", "directory", "oversize"])
def test_a_checkpoint_that_is_no_regular_file_or_too_large_is_kept_unread(tmp_path, kind, monkeypatch):
    """Read bounded: a FIFO in its place does not block the kubelet's start, a directory or a file over the cap is
    not read, and none of them is reported as absent or moved."""
    root = tmp_path / "root"
    machine(root, {0: {"memory": GIB}})
    sd = tmp_path / "kubelet"
    sd.mkdir()
    path = sd / "memory_manager_state"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_text(checkpoint({0: {"memory": GIB}}))
        monkeypatch.setattr(mc._read, "__defaults__", (64,))
    action, line = mc.check(str(sd), str(root))
    assert action == "kept" and "it cannot be read" in line, line
    assert os.path.lexists(path)
