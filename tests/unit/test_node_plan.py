"""The numa_binding role's planning step against one read of the node (plan/node_plan.plan_for_node)."""

import base64
import json
import os

import pytest

from ansible.module_utils.gpunuma.plan import node_plan
from ansible.module_utils.gpunuma.plan.profiles import load_profile
from conftest import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.unit

PROFILES = os.path.join(REPO_ROOT, "policies", "profiles")
INSTANCES = [{"name": "llm", "gpus": [0], "command": ["/usr/bin/true"]}]


def topology():
    with open(os.path.join(FIXTURES, "topologies", "hgx-h200-8gpu-2socket-ht.json")) as handle:
        return json.load(handle)


def run(node, instances=INSTANCES, **options):
    return node_plan.plan_for_node(topology(), load_profile("strict", PROFILES), instances, node, "gpu-a01",
                                   "/etc/gpunuma/plan.json", options, ["numactl", "--localalloc", "true"])


def probe(rc, stderr=""):
    return {"commands": {"mempolicy": {"rc": rc, "stderr": stderr}}}


def test_a_node_that_allows_memory_policies_gets_the_profiles_plan():
    out = run(probe(0))
    assert out["problems"] == [] and out["mempolicy"] == "allowed" and out["plan"]["profile"] == "strict"
    assert out["plan"]["instances"][0]["mem_policy"] != "default"


def test_a_refused_memory_policy_stops_or_falls_back_to_the_cpu_only_variant():
    denied = probe(1, "set_mempolicy: Operation not permitted")
    stopped = run(denied)
    assert stopped["plan"] is None and "CAP_SYS_NICE" in stopped["problems"][0] and "instances llm" in stopped["problems"][0]
    fallback = run(denied, on_mempolicy_denied="fallback")
    plan = fallback["plan"]
    assert plan["profile"].endswith("cpu-only") and plan["instances"][0]["mem_policy"] == "default"
    assert plan["instances"][0]["cpus"]  # the CPUs stay bound
    assert fallback["notices"] == ["WARNING gpu-a01: " + plan["warnings"][-1]]


def test_a_failing_probe_and_a_missing_numactl():
    assert "`numactl --localalloc true` failed (rc 2)" in run(probe(2, "odd"))["problems"][0]
    missing = run({"commands": {"mempolicy": {"rc": None, "msg": "[Errno 2] No such file or directory"}}})
    assert missing["mempolicy"] == "no-numactl" and missing["plan"] is not None


def test_a_damaged_applied_plan_stops_the_host_naming_it():
    node = {"files": {"plan": {"content": base64.b64encode(b"{").decode()}}}
    out = run(node)
    assert out["plan"] is None and out["problems"][0].startswith("gpu-a01:/etc/gpunuma/plan.json")


def test_bad_instance_input_names_the_field():
    out = run(probe(0), instances=[{"name": "llm", "gpus": [42], "command": ["/usr/bin/true"]}])
    assert out["plan"] is None and out["problems"][0].startswith("gpu-a01: the binding plan cannot be made:\n")
    assert "gpus[0]" in out["problems"][0]


def test_a_dropin_unit_that_cannot_be_bound():
    instances = [{"name": "svc", "gpus": [0], "unit": "vllm.service"}]
    missing = run({"units": {"vllm.service": {"LoadState": "not-found"}}}, instances=instances)
    assert "binds unit vllm.service, which is not installed" in missing["problems"][0]
    node = {"units": {"vllm.service": {"LoadState": "loaded"}},
            "inspect": {"vllm.service": {"container_launchers": ["docker run"]}}}
    assert "launches a container" in run(node, instances=instances)["problems"][0]
    assert run(node, instances=instances, allow_dropin_hazards=True)["plan"] is not None


def test_an_instance_whose_account_the_node_lacks_stops_the_plan():
    """The planning step checks the accounts the node read holds (before anything is written on any host)."""
    instances = [dict(INSTANCES[0], user="svc-llm")]
    node = dict(probe(0), accounts={"users": {"svc-llm": {"exists": False}}, "groups": {}})
    out = run(node, instances)
    assert out["plan"] is None and out["problems"] == [
        "gpu-a01: no account svc-llm on the node, and instances llm run as it: create it, name an existing account "
        "in the instance's `user`, or leave `user` out to run as the gpunuma account"]
    node["accounts"]["users"]["svc-llm"]["exists"] = True
    assert run(node, instances)["plan"] is not None
    # Not started: nothing runs as the account yet.
    node["accounts"]["users"]["svc-llm"]["exists"] = False
    assert run(node, instances, start=False)["plan"] is not None
