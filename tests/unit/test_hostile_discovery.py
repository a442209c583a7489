"""Discovery over the hostile-input corpus: a clear error or an incomplete result, in bounded time.

``tests/fixtures/hostile/discovery/*.json`` each describe one damaged or
hostile input: a sysfs tree (``sysfs_factory.small_two_node``) with damage
applied (``sysfs_factory.apply_damage``: FIFOs and links into ``/dev`` cannot
live in git, so they are built from the description), or an
``nvidia-smi topo -m`` file or an NVML dump placed beside it.
``tests/fixtures/hostile/nvml/*.json`` are NVML dumps that break the
``gpunuma.nvml-dump/v1`` schema, replayed over the same tree; ``cases.json``
says what the error must name.

Each case must end, within a few seconds, in either a
:class:`GpunumaError` naming the file or field (``expect: error``), or a
topology with ``complete: false`` and a warning naming it (``expect:
incomplete``) - never another exception, never a hang.
"""

import json
import os
import shutil
import signal
import time

import pytest

import sysfs_factory as factory
from conftest import FIXTURES
from ansible.module_utils.gpunuma.discovery.discover import discover
from ansible.module_utils.gpunuma.common.errors import GpunumaError

pytestmark = pytest.mark.unit

CORPUS = os.path.join(FIXTURES, "hostile", "discovery")
NVML_CORPUS = os.path.join(FIXTURES, "hostile", "nvml")
TIME_LIMIT_S = 5


def _discovery_cases():
    for name in sorted(os.listdir(CORPUS)):
        if name.endswith(".json"):
            with open(os.path.join(CORPUS, name)) as handle:
                yield pytest.param(json.load(handle), id="discovery/" + name[:-len(".json")])


def _nvml_cases():
    with open(os.path.join(NVML_CORPUS, "cases.json")) as handle:
        manifest = json.load(handle)
    for name in sorted(manifest):
        entry = manifest[name]
        yield pytest.param({
            "description": entry["description"],
            "inputs": {"sysfs_root": True, "nvml_dump": "nvml.json"},
            "copy": {os.path.join(NVML_CORPUS, name): "nvml.json"},
            "ops": [],
            "expect": "error",
            "needles": ["{root}/nvml.json"] + entry["needles"],
        }, id="nvml/" + name[:-len(".json")])


class Overran(Exception):
    pass


def _alarm(signum, frame):
    raise Overran("discovery ran past %d s" % TIME_LIMIT_S)


def run_case(tmp_path, case):
    """Build the case's inputs under tmp_path and run discover(); return (outcome, elapsed)."""
    root = factory.small_two_node(str(tmp_path / "root"))
    for source, dest in (case.get("copy") or {}).items():
        shutil.copyfile(source, os.path.join(root, dest))
    for op in case["ops"]:
        factory.apply_damage(root, op)
    inputs = case["inputs"]
    kwargs = {}
    if inputs.get("sysfs_root"):
        kwargs["sysfs_root"] = root
    for key in ("topo_file", "nvml_dump"):
        if inputs.get(key):
            kwargs[key] = os.path.join(root, inputs[key])
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_S)
    start = time.monotonic()
    try:
        try:
            outcome = discover("hostile", **kwargs)
        except GpunumaError as exc:
            outcome = exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return root, outcome, time.monotonic() - start


@pytest.mark.parametrize("case", list(_discovery_cases()) + list(_nvml_cases()))
def test_hostile_input_gives_a_named_error_or_an_incomplete_result(tmp_path, case):
    root, outcome, elapsed = run_case(tmp_path, case)
    needles = [needle.replace("{root}", root) for needle in case["needles"]]
    assert elapsed < TIME_LIMIT_S
    if case["expect"] == "error":
        assert isinstance(outcome, GpunumaError), "expected an error naming %s, got a topology: %r" % (
            needles, outcome["topology"]["warnings"])
        message = str(outcome)
        for needle in needles:
            assert needle in message, (needle, message)
        assert len(message) < 4000, "error messages quote what they found, not the whole input"
    else:
        assert not isinstance(outcome, GpunumaError), "expected degraded discovery, got: %s" % outcome
        topology = outcome["topology"]
        assert topology["complete"] is False, topology["warnings"]
        for needle in needles:
            assert any(needle in warning for warning in topology["warnings"]), (needle, topology["warnings"])
        assert all(len(warning) < 2000 for warning in topology["warnings"])
        # What was read is still a sound topology: nodes disjoint, GPUs on known nodes.
        seen = set()
        for node in topology["numa_nodes"]:
            assert node["id"] not in seen
            seen.add(node["id"])
        assert all(g["numa_node"] is None or g["numa_node"] in seen for g in topology["gpus"])


def test_the_undamaged_base_tree_and_dump_are_complete(tmp_path):
    """The corpus cases fail because of their damage, not because the base inputs are bad."""
    root = factory.small_two_node(str(tmp_path / "root"))
    topology = discover("base", sysfs_root=root, nvml_dump=os.path.join(NVML_CORPUS, "valid.json"))["topology"]
    assert topology["complete"] is True
    assert [g["pci_bus_id"] for g in topology["gpus"]] == ["0000:18:00.0", "0000:9a:00.0"]
    assert topology["gpus"][0]["numa_node"] == 1
    plain = discover("base", sysfs_root=root)["topology"]
    assert plain["complete"] is True and plain["warnings"] == []
    assert [g["pci_bus_id"] for g in plain["gpus"]] == ["0000:18:00.0"]


def test_corpus_cases_are_described():
    for param in list(_discovery_cases()) + list(_nvml_cases()):
        case = param.values[0]
        assert case["description"] and case["needles"] and case["expect"] in ("error", "incomplete")
