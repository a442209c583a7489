"""The gpu_topology role's one decision over the persisted inventories (run/topology_store.decide)."""

import base64
import copy
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible.module_utils.gpunuma.common import seal
from ansible.module_utils.gpunuma.run import topology_store
from conftest import FIXTURES

pytestmark = pytest.mark.unit

NODE, CONTROLLER = "/etc/gpunuma/topology.json", "/ctl/gpu-a01.json"


def topology(name="hgx-h200-8gpu-2socket-ht"):
    with open(os.path.join(FIXTURES, "topologies", name + ".json")) as handle:
        return json.load(handle)


def node_file(doc=None, text=None):
    if doc is None and text is None:
        return {}
    body = text if text is not None else json.dumps(doc)
    return {"content": base64.b64encode(body.encode()).decode()}


def decide(now, node=None, controller="", **options):
    return topology_store.decide(now, "gpu-a01", node if node is not None else {}, NODE, controller, CONTROLLER,
                                 **options)


def test_first_run_writes_both_copies():
    now = topology()
    out = decide(now)
    assert (out["problem"], out["notices"], out["write_node"], out["write_controller"], out["write_pending"]) == (
        None, [], True, True, False)
    assert out["summary"]["fingerprint"] == now["fingerprint"][7:19] and out["summary"]["changed"] is False


def test_unchanged_sealed_inventories_write_nothing():
    now = topology()
    sealed = seal.seal(now)
    out = decide(now, node_file(sealed), json.dumps(sealed))
    assert (out["problem"], out["write_node"], out["write_controller"], out["write_pending"]) == (None, False, False, False)


def test_an_inventory_without_its_checksum_stops_the_host_until_accepted():
    now = topology()
    out = decide(now, node_file(now), json.dumps(seal.seal(now)))
    assert "carries no checksum" in out["problem"] and not out["write_node"]
    accepted = decide(now, node_file(now), json.dumps(seal.seal(now)), accept_changes=True)
    assert accepted["problem"] is None and accepted["write_node"]


def test_changed_hardware_keeps_both_copies_and_keeps_the_new_one_beside():
    old, now = topology(), topology("dgxa100-nps4-8node")
    out = decide(now, node_file(seal.seal(old)), json.dumps(seal.seal(old)))
    assert out["problem"] is None and not out["write_node"] and not out["write_controller"] and out["write_pending"]
    assert out["notices"][0].startswith("HARDWARE FINGERPRINT CHANGED on gpu-a01") and "KEPT" in out["notices"][0]
    assert out["summary"]["changed"] is True
    strict = decide(now, node_file(seal.seal(old)), json.dumps(seal.seal(old)), fail_on_change=True)
    assert "hardware fingerprint changed" in strict["problem"]
    accepted = decide(now, node_file(seal.seal(old)), json.dumps(seal.seal(old)), accept_changes=True, fail_on_change=True)
    assert accepted["problem"] is None and accepted["write_node"] and accepted["write_controller"]
    assert not accepted["write_pending"]


@pytest.mark.parametrize("text, needle", [("", "is empty"), ("{not json", "is not valid JSON"),
                                          ('{"schema": "other/v1"}', "gpunuma.topology/v1")])
def test_a_damaged_node_inventory_stops_the_host_before_any_write(text, needle):
    now = topology()
    out = decide(now, node_file(text=text))
    assert out["problem"].startswith("gpu-a01:%s" % NODE) and "accept_changes=true" in out["problem"]
    assert needle in out["problem"], out["problem"]
    replaced = decide(now, node_file(text=text), accept_changes=True)
    assert replaced["problem"] is None and replaced["write_node"] and "it is replaced" in replaced["notices"][0]
    read_only = decide(now, node_file(text=text), accept_changes=True, persist_on_node=False)
    assert not read_only["write_node"] and "a run that persists the topology" in read_only["notices"][0]


def test_a_damaged_controller_copy_stops_the_host():
    now = topology()
    out = decide(now, node_file(seal.seal(now)), "[1, 2")
    assert out["problem"].startswith("gpu-a01: controller file %s" % CONTROLLER)
    assert decide(now, node_file(seal.seal(now)), "[1, 2", accept_changes=True)["problem"] is None


def test_a_tampered_inventory_is_damaged():
    now = topology()
    sealed = seal.seal(now)
    tampered = copy.deepcopy(sealed)
    tampered["gpus"][0]["numa_node"] = 1
    assert decide(now, node_file(tampered))["problem"] is not None


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["none", "same", "unsealed", "other", "damaged"]), st.sampled_from(["none", "same", "other"]),
       st.booleans(), st.booleans(), st.booleans())
def test_decisions_are_consistent(node_kind, controller_kind, accept, fail, persist):
    """Whatever the files: nothing is written when the host stops; a copy is never both replaced and kept beside;
    the node's inventory is replaced only when there was none, or with accept_changes."""
    now, other = topology(), topology("dgxa100-nps4-8node")
    node = {"none": {}, "same": node_file(seal.seal(now)), "unsealed": node_file(now),
            "other": node_file(seal.seal(other)), "damaged": node_file(text="{")}[node_kind]
    ctl = {"none": "", "same": json.dumps(seal.seal(now)), "other": json.dumps(seal.seal(other))}[controller_kind]
    out = decide(now, node, ctl, accept_changes=accept, fail_on_change=fail, persist_on_node=persist)
    assert not (out["write_controller"] and out["write_pending"])
    if out["problem"] is not None:
        assert not (out["write_node"] or out["write_controller"] or out["write_pending"])
    if out["write_node"]:
        assert persist and (node_kind == "none" or accept)
    if node_kind in ("damaged", "unsealed") and not accept:
        assert out["problem"] is not None
    if node_kind == "other" and fail and not accept:
        assert "hardware fingerprint changed" in out["problem"]
    if node_kind in ("none", "same") and controller_kind != "other":
        assert out["problem"] is None
