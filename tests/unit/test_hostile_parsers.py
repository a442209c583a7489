"""The topology text parser, the CPU list/mask parsers and the topology builder on hostile input.

``tests/fixtures/hostile/topo/*.topo.txt`` are damaged or hostile
``nvidia-smi topo -m`` texts, one case per file; ``cases.json`` says what
each must produce:

* ``error``: a :class:`GpunumaError` whose message holds every needle;
* ``warning``: a topology whose warnings hold every needle;
* ``ok``: a topology (its warnings are not checked).

A case with ``sysfs`` is built next to that ``sysfs_factory`` tree
(``keep_gpus``: only its first N NVIDIA GPUs in PCI order). Every case must
end in bounded time, never with another exception; every file must be
indexed and every index entry must have its file.

``tests/fixtures/hostile/cpulist/cases.json`` does the same for the CPU list,
node list, hex mask and NVML affinity word parsers (inputs inline; ``repeat``
builds the long ones).
"""

import copy
import json
import os
import signal
import sys
import time

import pytest

import sysfs_factory as factory
from conftest import FIXTURES
from ansible.module_utils.gpunuma.common import cpulist
from ansible.module_utils.gpunuma.discovery import topology
from ansible.module_utils.gpunuma.discovery.sysfs import host as sysfs
from ansible.module_utils.gpunuma.discovery.sysfs import pci as sysfs_pci
from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.discovery.nvidia.topo_text import (
    MAX_DEVICE_COLUMNS, MAX_LINE_CHARS, MAX_LINES, MAX_TEXT_CHARS)
from ansible.module_utils.gpunuma.discovery.nvidia.topo_parse import parse_topo_matrix

pytestmark = pytest.mark.unit

TOPO_CORPUS = os.path.join(FIXTURES, "hostile", "topo")
CPULIST_CORPUS = os.path.join(FIXTURES, "hostile", "cpulist")
TIME_LIMIT_S = 5


class Overran(Exception):
    pass


def _alarm(signum, frame):
    raise Overran("ran past %d s" % TIME_LIMIT_S)


def bounded(call, *args, **kwargs):
    """(result or GpunumaError, seconds); Overran when it runs past TIME_LIMIT_S."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_S)
    start = time.monotonic()
    try:
        try:
            outcome = call(*args, **kwargs)
        except GpunumaError as exc:
            outcome = exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return outcome, time.monotonic() - start


def _load(corpus):
    with open(os.path.join(corpus, "cases.json")) as handle:
        return json.load(handle)


TOPO_CASES = _load(TOPO_CORPUS)
_HOSTS = {}


def _host(name, keep_gpus, tmp_path_factory):
    if name not in _HOSTS:
        _HOSTS[name] = sysfs.read_host(getattr(factory, name)(str(tmp_path_factory.mktemp(name))))
    host = copy.deepcopy(_HOSTS[name])
    if keep_gpus is not None:
        gpus = sorted(p["pci_bus_id"] for p in sysfs_pci.gpu_functions(host))
        drop = set(gpus[keep_gpus:])
        host["pci"] = [p for p in host["pci"] if p["pci_bus_id"] not in drop]
    return host


def test_every_corpus_file_is_indexed_and_every_entry_has_its_file():
    files = sorted(f for f in os.listdir(TOPO_CORPUS) if f != "cases.json")
    assert files == sorted(TOPO_CASES)
    for name, case in TOPO_CASES.items():
        assert case["expect"] in ("error", "warning", "ok"), name
        assert case["description"], name


@pytest.mark.parametrize("name", sorted(TOPO_CASES))
def test_hostile_topo_text(name, tmp_path_factory):
    case = TOPO_CASES[name]
    with open(os.path.join(TOPO_CORPUS, name), "rb") as handle:
        text = handle.read().decode("utf-8")
    host = _host(case["sysfs"], case.get("keep_gpus"), tmp_path_factory) if case.get("sysfs") else None

    def build():
        smi = parse_topo_matrix(text, source=name)
        return topology.build_topology(
            "hostile", host=host, smi=smi, warnings=smi["warnings"],
            sources=["nvidia_smi"] + (["sysfs"] if host else []),
        )

    outcome, elapsed = bounded(build)
    assert elapsed < TIME_LIMIT_S
    if case["expect"] == "error":
        assert isinstance(outcome, GpunumaError), "expected an error naming %s, got warnings %r" % (
            case["needles"], outcome["warnings"])
        message = str(outcome)
        for needle in case["needles"]:
            assert needle in message, (needle, message)
        assert len(message) < 2000, "messages quote what they found, shortened, never the whole input"
        assert message.startswith(name + ": "), "the message names the file first: %s" % message
    else:
        assert not isinstance(outcome, GpunumaError), "expected a topology, got: %s" % outcome
        for needle in case["needles"]:
            assert any(needle in w for w in outcome["warnings"]), (needle, outcome["warnings"])
        assert all(len(w) < 2000 for w in outcome["warnings"])
        assert [g["index"] for g in outcome["gpus"]] == sorted(g["index"] for g in outcome["gpus"])
        check_nodes_disjoint(outcome["numa_nodes"])


def check_nodes_disjoint(nodes):
    seen = set()
    for node in nodes:
        cpus = cpulist.parse_cpulist(node["cpus"])
        assert not cpus & seen, nodes
        seen |= cpus


# --- caps the corpus cannot hold as files (sizes), and the recursion bound


def _square(labels, glue=False):
    lines = ["\t" + "\t".join(labels) + "\tCPU Affinity"]
    for i, label in enumerate(labels):
        cells = ["X" if i == j else "SYS" for j in range(len(labels))] + (["0-7"] if label.startswith("GPU") else [])
        row = "\t".join([label] + cells)
        lines.append(row.replace("\tSYS\tSYS", "\tSYSSYS") if glue else row)
    return "\n".join(lines) + "\n"


def test_the_largest_allowed_matrix_parses_without_recursion_and_fast():
    labels = ["GPU%d" % i for i in range(MAX_DEVICE_COLUMNS // 2)] + [
        "NIC%d" % i for i in range(MAX_DEVICE_COLUMNS // 2)]
    # Cells glued together take the search path; a recursive search would need a frame per cell.
    text = _square(labels, glue=True)
    limit = sys.getrecursionlimit()
    depth = len(__import__("inspect").stack())
    sys.setrecursionlimit(depth + 80)
    try:
        outcome, elapsed = bounded(parse_topo_matrix, text)
    finally:
        sys.setrecursionlimit(limit)
    assert not isinstance(outcome, GpunumaError), outcome
    assert len(outcome["gpus"]) == MAX_DEVICE_COLUMNS // 2 and len(outcome["nics"]) == MAX_DEVICE_COLUMNS // 2
    assert elapsed < TIME_LIMIT_S


@pytest.mark.parametrize(
    "text, says",
    [
        ("x" * (MAX_TEXT_CHARS + 1), "the text is %d characters long; allowed: at most %d (MAX_TEXT_CHARS)"
         % (MAX_TEXT_CHARS + 1, MAX_TEXT_CHARS)),
        ("\n" * MAX_LINES + "\tGPU0\nGPU0\tX\n", "lines; allowed: at most %d (MAX_LINES)" % MAX_LINES),
        ("\tGPU0\nGPU0\tX\t" + "0" * MAX_LINE_CHARS + "\n",
         "line 2 is %d characters long; allowed: at most %d (MAX_LINE_CHARS)" % (MAX_LINE_CHARS + 7, MAX_LINE_CHARS)),
        (_square(["GPU%d" % i for i in range(MAX_DEVICE_COLUMNS + 1)])[:MAX_TEXT_CHARS],
         "lists %d GPU and NIC columns (GPU0..GPU%d); allowed: at most %d (MAX_DEVICE_COLUMNS)"
         % (MAX_DEVICE_COLUMNS + 1, MAX_DEVICE_COLUMNS, MAX_DEVICE_COLUMNS)),
    ],
    ids=["text", "lines", "line", "columns"],
)
def test_input_caps_name_the_limit(text, says):
    outcome, elapsed = bounded(parse_topo_matrix, text, "big.txt")
    assert isinstance(outcome, GpunumaError)
    assert str(outcome).startswith("big.txt: ") and says in str(outcome)
    assert len(str(outcome)) < 600 and elapsed < 1


# --- the CPU list, node list, mask and affinity word parsers

CPULIST_CASES = _load(CPULIST_CORPUS)
PARSERS = {
    "cpulist": cpulist.parse_cpulist,
    "nodelist": cpulist.parse_nodelist,
    "cpumask": cpulist.parse_cpumask,
    "affinity_words": lambda words, what: cpulist.cpus_from_affinity_words(words[0], words[1], what),
}


def _input(spec):
    if isinstance(spec, dict) and "repeat" in spec:
        text, count = spec["repeat"]
        return spec.get("prefix", "") + text * count + spec.get("suffix", "")
    return spec


@pytest.mark.parametrize("name", sorted(CPULIST_CASES))
def test_hostile_cpu_lists_and_masks(name):
    case = CPULIST_CASES[name]
    outcome, elapsed = bounded(PARSERS[case["parser"]], _input(case["input"]), what=case["what"])
    assert elapsed < 1, "parsers answer at once: %.2f s" % elapsed
    if case["expect"] == "error":
        assert isinstance(outcome, GpunumaError), "expected an error, got %d CPUs" % len(outcome)
        message = str(outcome)
        assert message.startswith(case["what"]), message
        for needle in case["needles"]:
            assert needle in message, (needle, message)
        assert len(message) < 600
    else:
        assert not isinstance(outcome, GpunumaError), outcome
        assert len(outcome) == case["cpus"]
