"""gpunuma's own documents carry a checksum over their content (common/seal.py).

A hand-edited topology.json (a CPU moved to another node, the fingerprint
untouched) was read as gpunuma's own; now every reader names the file.
"""

import base64
import copy
import glob
import importlib.util
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible.module_utils.gpunuma.common import schemas, seal
from ansible.module_utils.gpunuma.plan import state as statelib
from conftest import FIXTURES, REPO_ROOT, examples

pytestmark = pytest.mark.unit

TOPOLOGIES = sorted(glob.glob(os.path.join(FIXTURES, "topologies", "*.json")))
TOPOLOGY = json.load(open(TOPOLOGIES[0]))


def _leaves(doc, prefix=()):
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        if isinstance(value, (dict, list)) and value:
            yield from _leaves(value, prefix + (key,))
        else:
            yield prefix + (key,), value


def _set(doc, path, value):
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value


def test_sealing_is_stable_and_idempotent():
    sealed = seal.seal(TOPOLOGY)
    assert sealed["checksum"].startswith("sha256:") and seal.problem(sealed) is None
    assert seal.seal(sealed) == sealed
    # Key order and the JSON layout the file is written with do not matter.
    again = json.loads(json.dumps(dict(reversed(list(sealed.items()))), indent=1))
    assert seal.problem(again) is None


def test_a_document_without_its_checksum_is_refused():
    """Deleting the field is an edit: it never lifts the check."""
    assert not seal.is_sealed(TOPOLOGY)
    assert "carries no checksum" in seal.problem(TOPOLOGY)
    stripped = {k: v for k, v in seal.seal(TOPOLOGY).items() if k != seal.FIELD}
    assert "carries no checksum" in seal.problem(stripped)


@settings(max_examples=examples(120), deadline=None)
@given(st.data())
def test_any_change_to_any_field_is_noticed(data):
    sealed = seal.seal(copy.deepcopy(json.load(open(data.draw(st.sampled_from(TOPOLOGIES))))))
    leaves = [(p, v) for p, v in _leaves(sealed) if p != ("checksum",)]
    path, old = data.draw(st.sampled_from(leaves))
    new = data.draw(st.one_of(st.integers(), st.text(max_size=8), st.none(), st.booleans(), st.floats(allow_nan=False)))
    if type(new) is type(old) and new == old:
        return
    _set(sealed, path, new)
    assert "was changed after gpunuma wrote it" in seal.problem(sealed), path


@pytest.mark.parametrize("stored", [None, 5, "md5:abc", ["sha256:x"]])
def test_a_checksum_field_of_another_shape_is_refused(stored):
    doc = dict(TOPOLOGY, checksum=stored)
    assert "checksum" in seal.problem(doc)


def _read(doc, schema=schemas.TOPOLOGY):
    content = base64.b64encode(json.dumps(doc, indent=1).encode()).decode()
    return seal.read_state_file(content, "gpu-a01:/etc/gpunuma/topology.json", schema, "Recover so.")


def test_the_node_file_readers_refuse_an_edited_file_naming_it():
    sealed = seal.seal(TOPOLOGY)
    assert _read(sealed) == {"data": sealed, "problem": None}
    assert _read(TOPOLOGY)["data"] is None and "carries no checksum" in _read(TOPOLOGY)["problem"]
    edited = copy.deepcopy(sealed)
    node = edited["numa_nodes"][0]
    node["cpus"] = node["cpus"] + ",4095"  # a CPU moved here by hand; the fingerprint untouched
    read = _read(edited)
    assert read["data"] is None
    assert read["problem"].startswith("gpu-a01:/etc/gpunuma/topology.json was changed after gpunuma wrote it")
    assert read["problem"].endswith("It is left as it is. Recover so.")


def test_the_filter_the_roles_write_with_seals():
    spec = importlib.util.spec_from_file_location("gpunuma_filters_seal", os.path.join(REPO_ROOT, "filter_plugins",
                                                                                     "gpunuma.py"))
    filters = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(filters)
    assert filters.FilterModule().filters()["gpunuma_seal"](TOPOLOGY) == seal.seal(TOPOLOGY)
    # The roles write topology.json and plan.json through it.
    for rel in ("roles/gpu_topology/tasks/controller_copy.yml", "roles/gpu_topology/vars/main.yml",
                "roles/numa_binding/tasks/install.yml", "playbooks/provision.yml"):
        text = open(os.path.join(REPO_ROOT, rel)).read()
        assert "| gpunuma.fleet.gpunuma_seal | to_nice_json" in text, rel


def test_state_is_written_sealed_and_an_edit_makes_it_corrupt():
    state = statelib.empty_state("gpu-a01")
    state.update(profile="strict", history=[{"time": "2026-01-31T03:00:00Z", "from": None, "to": "strict",
                                             "action": "site", "reason": None, "user": "sre"}])
    text = statelib.dump_state(state)
    assert json.loads(text)["checksum"] == seal.digest(state)
    assert statelib.parse_state(text, "state.json")["profile"] == "strict"
    edited = json.loads(text)
    edited["profile"] = "preferred"
    with pytest.raises(statelib.StateCorrupt) as info:
        statelib.parse_state(json.dumps(edited), "/etc/gpunuma/state.json")
    assert "/etc/gpunuma/state.json: was changed after gpunuma wrote it" in str(info.value)


@pytest.mark.parametrize("field, value", [("profile", "strict\n"), ("history.time", "2026-01-31T03:00:00Z\n")])
def test_state_values_with_a_trailing_newline_are_refused(field, value):
    state = {"schema": statelib.SCHEMA, "hostname": "h", "profile": "strict", "pinned": False, "updated": None,
             "history": [{"time": "2026-01-31T03:00:00Z", "to": "strict"}]}
    if field == "profile":
        state["profile"] = value
    else:
        state["history"][0]["time"] = value
    with pytest.raises(statelib.StateCorrupt):
        statelib.parse_state(json.dumps(state), "state.json")


def test_the_audit_reports_each_edited_file(tmp_path, capsys):
    from test_audit import _audit_module

    plan = seal.seal({"schema": schemas.PLAN, "profile": "strict", "instances": []})
    plan["profile"] = "interleave"
    topology = seal.seal(TOPOLOGY)
    topology["numa_nodes"][0]["cores"] = []
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "topology.json").write_text(json.dumps(topology))
    state = json.loads(statelib.dump_state(dict(statelib.empty_state("gpu-a01"), profile="interleave")))
    (tmp_path / "state.json").write_text(json.dumps(state))
    result = _audit_module(capsys, plan_path=str(tmp_path / "plan.json"), topology_path=str(tmp_path / "topology.json"),
                           state_path=str(tmp_path / "state.json"), numa_balancing_file=str(tmp_path / "nb.conf"))
    ids = [f["id"] for f in result["audit"]["findings"]]
    assert "plan-edited" in ids and "topology-edited" in ids and "state-edited" not in ids
    [edited] = [f for f in result["audit"]["findings"] if f["id"] == "topology-edited"]
    assert edited["severity"] == "error" and "gpu_topology_accept_changes" in edited["message"]
    assert str(tmp_path / "topology.json") in edited["message"]
