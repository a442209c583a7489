"""Property-based tests of NVML dump validation and replay (Hypothesis).

Random ``gpunuma.nvml-dump/v1`` dumps are generated field by field as
``collect()`` writes them (0-4 GPUs, either bus id spelling, errors where NVML
may answer with one, NVLinks to peers and to NVSwitch ports), then mutated:
any value anywhere replaced by arbitrary JSON, a key dropped, a GPU repeated,
the whole text cut or garbled.

A valid dump always validates, survives a JSON round trip and replays over a
sysfs tree into a topology whose invariants hold. A mutated one either fails
validation with an :class:`NvmlError` naming the dump, or replays like a
valid one: never another exception, never a hang (SIGALRM bounds each
example besides Hypothesis' deadline).
"""

import copy
import json
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
from ansible.module_utils.gpunuma.discovery import topology
from ansible.module_utils.gpunuma.discovery.nvidia import nvml
from ansible.module_utils.gpunuma.discovery.nvidia import nvml_dump
from ansible.module_utils.gpunuma.discovery.sysfs import host as sysfs
from ansible.module_utils.gpunuma.common.errors import GpunumaError, NvmlError

pytestmark = pytest.mark.unit

HARD_LIMIT_S = 5
PROPS = settings(
    deadline=2000,
    max_examples=examples(100),
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
BUS_ID = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]")
SOURCE = "nvml_dump prop.json"

_TREE = tempfile.mkdtemp(prefix="gpunuma-prop-nvml-")
HOST = sysfs.read_host(factory.small_two_node(_TREE))
shutil.rmtree(_TREE, ignore_errors=True)


class Overran(Exception):
    pass


def _alarm(signum, frame):
    raise Overran("ran past %d s" % HARD_LIMIT_S)


def bounded(call, *args, **kwargs):
    """The call's result, or the GpunumaError it raised; anything else fails the test."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, HARD_LIMIT_S)
    try:
        return call(*args, **kwargs)
    except GpunumaError as exc:
        return exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


ERROR = st.sampled_from(["NotSupported", "GpuIsLost", "NoPermission", "NotMapped"]).map(lambda n: {"nvml_error": n})


def maybe(strategy):
    return st.one_of(strategy, ERROR, st.none())


@st.composite
def bus_ids(draw):
    domain = draw(st.sampled_from([0, 1, 0x19, 0x10000]))
    width = draw(st.sampled_from([4, 8]))
    text = "%0*x:%02x:%02x.%d" % (width, domain, draw(st.integers(0, 255)), draw(st.integers(0, 31)),
                                  draw(st.integers(0, 7)))
    return text.upper() if draw(st.booleans()) else text


@st.composite
def dumps(draw):
    count = draw(st.integers(0, 4))
    buses = draw(st.lists(bus_ids(), min_size=count, max_size=count,
                          unique_by=lambda b: nvml_dump.normalize_bus_id(b)))
    word_bits = draw(st.sampled_from([32, 64]))
    gpus = []
    for index, bus in enumerate(buses):
        links = []
        for link in range(draw(st.integers(0, 4))):
            remote = draw(st.one_of(st.sampled_from(buses), bus_ids()))
            if nvml_dump.normalize_bus_id(remote) != nvml_dump.normalize_bus_id(bus):
                links.append({"link": link, "remote_pci_bus_id": remote})
        gpus.append({
            "index": index,
            "name": draw(maybe(st.sampled_from(["NVIDIA H100 80GB HBM3", "NVIDIA H200", "Tesla P4"]))),
            "uuid": "GPU-%08x-0000-4000-8000-%012x" % (draw(st.integers(0, 2 ** 32 - 1)), index),
            "pci_bus_id": bus,
            "numa_node_id": draw(maybe(st.integers(-1, 3))),
            "cpu_affinity_words": draw(maybe(st.lists(st.integers(0, 2 ** word_bits - 1), max_size=4))),
            "pcie": draw(maybe(st.fixed_dictionaries({k: maybe(st.integers(0, 16)) for k in
                                                      ("gen_max", "width_max", "gen_current", "width_current")}))),
            "mig_mode": draw(maybe(st.fixed_dictionaries({"current": st.sampled_from([0, 1]),
                                                          "pending": st.sampled_from([0, 1])}))),
            "memory_total_bytes": draw(maybe(st.integers(0, 2 ** 40))),
            "nvlinks": links,
        })
    levels = [[0 if i == j else draw(st.one_of(st.sampled_from(sorted(nvml_dump.TOPOLOGY_LEVEL_CODES)), ERROR))
               for j in range(count)] for i in range(count)]
    return {"schema": nvml_dump.DUMP_SCHEMA, "driver_version": draw(maybe(st.just("580.159.04"))),
            "nvml_version": "13.580.159.04", "cuda_driver_version": draw(maybe(st.just(13000))),
            "cpu_word_bits": word_bits, "gpus": gpus,
            "topology_levels": levels if count and draw(st.booleans()) else []}


JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)


def _paths(value, prefix=()):
    """Every (container path, key) in a JSON value."""
    found = []
    if isinstance(value, dict):
        for key in sorted(value):
            found.append(prefix + (key,))
            found.extend(_paths(value[key], prefix + (key,)))
    elif isinstance(value, list):
        for k, item in enumerate(value):
            found.append(prefix + (k,))
            found.extend(_paths(item, prefix + (k,)))
    return found


def _check_replay(dump):
    """Replay a validated dump over the sysfs host; check what every consumer relies on."""
    built = bounded(topology.build_topology, "prop", host=HOST, nvml=dump, sources=["nvml", "sysfs"])
    assert not isinstance(built, GpunumaError), "a dump that validated must replay: %s" % built
    node_ids = {n["id"] for n in built["numa_nodes"] if n["has_cpus"]}
    buses = [g["pci_bus_id"] for g in built["gpus"]]
    assert len(buses) == len(dump["gpus"]) == len(set(buses))
    assert all(BUS_ID.fullmatch(b) for b in buses)
    for position, gpu in enumerate(built["gpus"]):
        assert gpu["index"] == position and gpu["uuid"].startswith("GPU-")
        assert gpu["numa_node"] is None or gpu["numa_node"] in node_ids
        if gpu["cpu_affinity"] is not None:
            assert cpulist.canonical_cpulist(gpu["cpu_affinity"]) == gpu["cpu_affinity"]
    assert len(built["gpu_links"]) == len(buses)


@PROPS
@given(dump=dumps())
def test_a_valid_dump_validates_round_trips_and_replays(dump):
    text = json.dumps(dump)
    checked = bounded(nvml_dump.validate_dump, json.loads(text), source=SOURCE)
    assert not isinstance(checked, GpunumaError), str(checked)
    assert [g["pci_bus_id"] for g in checked["gpus"]] == [nvml_dump.normalize_bus_id(g["pci_bus_id"])
                                                          for g in dump["gpus"]]
    assert nvml_dump.validate_dump(json.loads(json.dumps(checked))) == checked
    _check_replay(checked)


@PROPS
@given(dump=dumps(), data=st.data())
def test_a_mutated_dump_is_refused_naming_it_or_replays_soundly(dump, data):
    mutated = copy.deepcopy(dump)
    for _ in range(data.draw(st.integers(1, 3))):
        paths = _paths(mutated)
        kind = data.draw(st.sampled_from(["replace", "drop", "repeat_gpu"] if paths else ["replace_whole"]))
        if kind == "repeat_gpu" and mutated.get("gpus"):
            if isinstance(mutated["gpus"], list):
                mutated["gpus"].append(copy.deepcopy(data.draw(st.sampled_from(mutated["gpus"]))))
            continue
        if kind == "replace_whole" or not paths:
            mutated = data.draw(JSON)
            continue
        path = data.draw(st.sampled_from(paths))
        parent = mutated
        for key in path[:-1]:
            parent = parent[key]
        if kind == "drop" and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(JSON)
    checked = bounded(nvml_dump.validate_dump, mutated, source=SOURCE)
    if isinstance(checked, GpunumaError):
        assert isinstance(checked, NvmlError) and str(checked).startswith(SOURCE + ": ")
        assert len(str(checked)) < 6000
        return
    _check_replay(checked)


@PROPS
@given(dump=dumps(), data=st.data())
def test_any_file_content_loads_or_is_refused_naming_the_file(dump, data):
    text = json.dumps(dump).encode("utf-8")
    cut = data.draw(st.integers(0, len(text)))
    content = data.draw(st.one_of(
        st.just(text[:cut]),
        st.binary(max_size=200),
        st.just(text[:cut] + data.draw(st.binary(max_size=20)) + text[cut:]),
    ))
    with tempfile.NamedTemporaryFile(suffix=".json") as handle:
        handle.write(content)
        handle.flush()
        loaded = bounded(nvml.load_dump, handle.name)
        if isinstance(loaded, GpunumaError):
            assert isinstance(loaded, NvmlError) and handle.name in str(loaded)
            return
        _check_replay(loaded)
