"""Property-based tests of discovery over sysfs-shaped trees (Hypothesis).

Random hosts are written with ``sysfs_factory.build_tree`` (1-4 NUMA nodes
with random ids, CPUs spread over them in any order, some offline, up to 6
PCI functions of any class, vendor, node and domain, live or capture
layout), then damaged with ``sysfs_factory.apply_damage``: random text or
bytes in any file, FIFOs, links to ``/dev/zero``, symlink loops, directories
where files belong, removed files, files past the read cap.

Whatever the tree, ``discover(sysfs_root=...)`` either raises a
:class:`SysfsError` naming a path under the tree, or returns a topology
whose invariants hold: node ids unique, node CPU sets disjoint, every GPU on
a CPU-bearing node or none, bus ids unique and in full form, a square link
matrix; an undamaged tree gives exactly the nodes and GPUs it was built
with and ``complete: true``; and a complete topology never misses one of
the GPUs the tree was built with when the damage could only destroy values.
Each example runs under a hard time bound (SIGALRM) besides Hypothesis'
deadline.
"""

import os
import re
import shutil
import signal
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from conftest import examples
from hypothesis import strategies as st

import sysfs_factory as factory
from ansible.module_utils.gpunuma.common import cpulist
from ansible.module_utils.gpunuma.discovery.discover import discover
from ansible.module_utils.gpunuma.common.errors import GpunumaError, SysfsError

pytestmark = pytest.mark.unit

HARD_LIMIT_S = 5
PROPS = settings(
    deadline=3000,
    max_examples=examples(100),
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
BUS_ID = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]")
LINK_CODES = {"X", "PIX", "PXB", "PHB", "NODE", "SYS", None}
GPU_CLASSES = ("0x030200", "0x030000")
CLASSES = GPU_CLASSES + ("0x020700", "0x020000", "0x010802", "0x060400", "0x040300", "0x068000")
VENDORS = (factory.NVIDIA, factory.MELLANOX, "0x8086", "0x144d")


class Overran(Exception):
    pass


def _alarm(signum, frame):
    raise Overran("discovery ran past %d s" % HARD_LIMIT_S)


@st.composite
def host_specs(draw):
    node_ids = sorted(draw(st.sets(st.integers(0, 9), min_size=1, max_size=4)))
    ncpus = draw(st.integers(1, 12))
    owner = draw(st.lists(st.sampled_from(node_ids), min_size=ncpus, max_size=ncpus))
    nodes = [{"id": nid, "cpus": [c for c in range(ncpus) if owner[c] == nid],
              "mem_kb": draw(st.integers(0, 1 << 30)), "free_kb": 0} for nid in node_ids]
    offline = draw(st.sets(st.integers(1, ncpus - 1), max_size=2)) if ncpus > 1 else set()
    buses = draw(st.lists(st.integers(1, 0xfe), min_size=0, max_size=6, unique=True))
    pci = []
    for bus in buses:
        domain = draw(st.sampled_from(["0000", "0001", "0019", "10000"]))
        numa_node = draw(st.sampled_from([-1] + node_ids))
        dev = {"bdf": "%s:%02x:%02x.%d" % (domain, bus, draw(st.integers(0, 0x1f)), draw(st.integers(0, 7))),
               "vendor": draw(st.sampled_from(VENDORS)), "device": "0x%04x" % draw(st.integers(0, 0xffff)),
               "class": draw(st.sampled_from(CLASSES)), "numa_node": numa_node}
        if draw(st.booleans()):
            dev["netdevs"] = ["eth%d" % bus]
        if draw(st.booleans()):
            dev["max_link_speed"], dev["max_link_width"] = "32.0 GT/s PCIe", 16
        pci.append(dev)
    return {"nodes": nodes, "pci": pci, "online": [c for c in range(ncpus) if c not in offline],
            "symlinks": draw(st.booleans())}


CONTENTS = st.one_of(
    st.binary(max_size=40).map(lambda b: {"hex": b.hex()}),
    st.text(max_size=40).map(lambda t: {"text": t}),
    st.sampled_from(["-1\n", "0x10de\n", "0x030200\n", "0-3\n", "", "\n", "9" * 30 + "\n", "4-2\n", "0x\n",
                     "0,1,2,3\n", "ffffffff,ffffffff\n", "\u0661\n", "1 \u00b2\n"]).map(lambda t: {"text": t}),
)
# Damage that can only destroy a value, never turn it into another valid one.
DESTRUCTIVE = ("fifo", "devzero", "loop", "mkdir", "huge", "binary")


def _op(kind, path, content=None):
    if kind == "write":
        return dict({"op": "write", "path": path}, **content)
    if kind == "binary":
        return {"op": "write", "path": path, "hex": "ff00fe0a"}
    if kind == "huge":
        return {"op": "write", "path": path, "text": "f", "repeat": factory_cap() + 1}
    if kind == "devzero":
        return {"op": "symlink", "path": path, "target": "/dev/zero"}
    if kind == "loop":
        return {"op": "symlink", "path": path, "target": os.path.basename(path)}
    return {"op": kind, "path": path}


def factory_cap():
    from ansible.module_utils.gpunuma.discovery.sysfs.reader import MAX_ATTRIBUTE_BYTES

    return MAX_ATTRIBUTE_BYTES


def _scratch():
    """A fresh directory, in memory where the host offers one: each example writes a whole tree."""
    shm = "/dev/shm"
    where = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    return tempfile.mkdtemp(prefix="gpunuma-prop-", dir=where)


def _entries(root):
    """Every file, link and directory below sys/ and proc/, relative to root, in a stable order."""
    found = []
    for top in ("sys", "proc"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            for name in dirnames + filenames:
                found.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(found)


def _expected_gpus(spec):
    return sorted(dev["bdf"].lower() for dev in spec["pci"]
                  if dev["vendor"] == factory.NVIDIA and dev["class"] in GPU_CLASSES)


def _check_invariants(topology):
    ids = [node["id"] for node in topology["numa_nodes"]]
    assert len(ids) == len(set(ids))
    seen = set()
    cpu_nodes = set()
    for node in topology["numa_nodes"]:
        cpus = cpulist.parse_cpulist(node["cpus"])
        assert not (cpus & seen), "NUMA nodes share CPUs"
        seen |= cpus
        assert node["has_cpus"] == bool(cpus)
        if cpus:
            cpu_nodes.add(node["id"])
    buses = [gpu["pci_bus_id"] for gpu in topology["gpus"]]
    assert len(buses) == len(set(buses)) and all(BUS_ID.fullmatch(b) for b in buses)
    for position, gpu in enumerate(topology["gpus"]):
        assert gpu["index"] == position
        assert gpu["numa_node"] is None or gpu["numa_node"] in cpu_nodes
    links = topology["gpu_links"]
    assert len(links) == len(buses) and all(len(row) == len(buses) for row in links)
    assert all(cell in LINK_CODES for row in links for cell in row)
    assert topology["fingerprint"].startswith("sha256:")
    assert all(isinstance(w, str) and len(w) < 2000 for w in topology["warnings"])


def _discover(root):
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, HARD_LIMIT_S)
    try:
        return discover("prop", sysfs_root=root)
    except GpunumaError as exc:
        return exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@PROPS
@given(spec=host_specs())
def test_an_undamaged_random_tree_is_complete_and_exact(spec):
    root = _scratch()
    try:
        factory.build_tree(root, spec["nodes"], pci=spec["pci"], online=spec["online"], symlinks=spec["symlinks"])
        outcome = _discover(root)
        assert not isinstance(outcome, GpunumaError), str(outcome)
        topology = outcome["topology"]
        _check_invariants(topology)
        assert topology["complete"] is True, topology["warnings"]
        assert [(n["id"], n["cpus"]) for n in topology["numa_nodes"]] == [
            (n["id"], cpulist.format_cpulist(n["cpus"])) for n in spec["nodes"]]
        assert [g["pci_bus_id"] for g in topology["gpus"]] == _expected_gpus(spec)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@PROPS
@given(spec=host_specs(), data=st.data())
def test_a_damaged_random_tree_gives_a_named_error_or_a_sound_topology(spec, data):
    root = _scratch()
    try:
        factory.build_tree(root, spec["nodes"], pci=spec["pci"], online=spec["online"], symlinks=spec["symlinks"])
        entries = _entries(root)
        kinds = data.draw(st.lists(st.sampled_from(("write",) + DESTRUCTIVE + ("remove",)), min_size=1, max_size=3))
        only_destroyed = True
        for kind in kinds:
            path = data.draw(st.sampled_from(entries))
            content = data.draw(CONTENTS) if kind == "write" else None
            try:
                factory.apply_damage(root, _op(kind, path, content))
            except OSError:
                continue  # e.g. a parent already replaced by a FIFO
            # Writes and removals may make a valid tree of another host; so
            # may emptying or dropping the directories above the PCI device
            # list (a host without PCI, as some VMs are).
            if kind not in DESTRUCTIVE or path in ("sys", "sys/bus", "sys/bus/pci") or (
                    kind == "mkdir" and path == "sys/bus/pci/devices"):
                only_destroyed = False
        outcome = _discover(root)
        if isinstance(outcome, GpunumaError):
            assert isinstance(outcome, SysfsError), "%s: %s" % (type(outcome).__name__, outcome)
            assert root in str(outcome) and len(str(outcome)) < 2000
            return
        topology = outcome["topology"]
        _check_invariants(topology)
        if topology["complete"] and only_destroyed:
            # Nothing destroyed was reported: no GPU the tree was built with may be missing.
            assert [g["pci_bus_id"] for g in topology["gpus"]] == _expected_gpus(spec), topology["warnings"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
