"""Damaged versions of every file gpunuma reads back from a node, fed to the code that reads it.

The topology, the plan and the state (sealed documents), the converge record, the node lock's lease, the
kubelet's configuration and its memory and DRA checkpoints: truncated, deep, huge, of the wrong types, not UTF-8.
Each reader answers with its document or its own named refusal; never a traceback, never a hang (each example runs
under a deadline).
"""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible.module_utils.gpunuma.common import schemas, seal
from ansible.module_utils.gpunuma.kubelet import config as kubelet_config
from ansible.module_utils.gpunuma.kubelet import dra, memory_checkpoint
from ansible.module_utils.gpunuma.node import lock
from ansible.module_utils.gpunuma.plan import state as statelib
from ansible.module_utils.gpunuma.run import converge
from conftest import examples

pytestmark = pytest.mark.unit

VALID = {
    "topology": seal.seal({"schema": schemas.TOPOLOGY, "hostname": "n", "numa_nodes": [], "gpus": []}),
    "plan": seal.seal({"schema": schemas.PLAN, "profile": "strict", "instances": []}),
    "state": seal.seal({"schema": statelib.SCHEMA, "hostname": "n", "profile": "strict", "pinned": False,
                        "updated": None, "history": []}),
    "record": {"schema": converge.SCHEMA, "inputs": {}, "reads": [], "owned": {}, "view": {}, "facts": {},
               "controller": {}},
    "lease": {"schema": lock.SCHEMA, "token": "t", "acquired": 1, "expires": 2, "holder": {"pid": 1}},
    "kubelet": {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration"},
    "memory": {"policyName": "Static", "machineState": {}, "checksum": 1},
    "dra": {"Data": json.dumps({"Entries": []}), "Checksum": 1},
}

JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10 ** 30, 10 ** 30), st.floats(), st.text(max_size=6)),
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(st.sampled_from(["schema", "history", "profile", "pinned", "inputs",
                                                                "reads", "token", "expires", "holder", "Data",
                                                                "machineState", "kind", "checksum", "Entries"]),
                                               children, max_size=4)),
    max_leaves=12)


@st.composite
def damaged(draw, name):
    """Text that a file of ``name`` may hold after damage: cut, nested, swelled, retyped or garbage."""
    text = json.dumps(VALID[name], sort_keys=True)
    kind = draw(st.sampled_from(["cut", "deep", "huge", "retyped", "field", "garbage"]))
    if kind == "cut":
        return text[:draw(st.integers(0, len(text)))]
    if kind == "deep":
        # Past gpunuma's bound (64), and past what Python's own parser survives (about 10^5 in 3.13).
        depth = draw(st.sampled_from([65, 3000, 100000]))
        return "[" * depth + "]" * depth
    if kind == "huge":
        return json.dumps(dict(VALID[name], filler="x" * draw(st.integers(1, 1 << 16))))
    if kind == "retyped":
        return json.dumps(draw(JSON_VALUES))
    if kind == "field":
        doc = dict(VALID[name])
        doc[draw(st.sampled_from(sorted(doc)))] = draw(JSON_VALUES)
        return json.dumps(doc)
    return draw(st.text(max_size=40))


def _topology(text):
    content = base64.b64encode(text.encode("utf-8")).decode()
    out = seal.read_state_file(content, "n:/etc/gpunuma/topology.json", schemas.TOPOLOGY, "Recover.")
    assert (out["data"] is None) != (out["problem"] is None)


def _plan(text):
    out = seal.read_state_file(text, "n:/etc/gpunuma/plan.json", schemas.PLAN, "Recover.", encoding="text")
    assert (out["data"] is None) != (out["problem"] is None)


def _state(text):
    try:
        statelib.parse_state(text, "/etc/gpunuma/state.json")
    except statelib.StateError as exc:
        assert "/etc/gpunuma/state.json" in str(exc)


def _record(text):
    try:
        converge.load_record(text, "/var/lib/gpunuma/converged.json")
    except converge.ConvergeError as exc:
        assert "/var/lib/gpunuma/converged.json" in str(exc)


def _lease(text):
    lease = lock._parse(text.encode("utf-8"))
    # A lease that names no finite expiry is stale, never a crash.
    assert lease is None or lock.is_stale(lease, 10) in (True, False)


def _kubelet(text):
    try:
        kubelet_config.parse_config(text, "/var/lib/kubelet/config.yaml")
    except kubelet_config.KubeletConfigError:
        pass


def _memory(text):
    try:
        memory_checkpoint.checkpoint_totals(text)
    except memory_checkpoint.CheckpointError:
        pass


def _dra(text):
    out = dra.dra_checkpoint(text, "/var/lib/kubelet/dra_manager_state")
    assert out["problem"] is None or "dra_manager_state cannot be read" in out["problem"]


READERS = {"topology": _topology, "plan": _plan, "state": _state, "record": _record, "lease": _lease,
           "kubelet": _kubelet, "memory": _memory, "dra": _dra}


@pytest.mark.parametrize("name", sorted(READERS))
def test_the_valid_file_reads(name):
    READERS[name](json.dumps(VALID[name]))


@pytest.mark.parametrize("name", sorted(READERS))
def test_a_damaged_file_is_read_or_refused_by_name_never_a_crash(name):
    @settings(max_examples=examples(80), deadline=2000, suppress_health_check=[HealthCheck.too_slow])
    @given(text=damaged(name))
    def check(text):
        READERS[name](text)
    check()
