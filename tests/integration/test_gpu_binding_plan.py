"""gpu_binding_plan run through Ansible on localhost, as a role would run it."""

import json
import os
import subprocess

import pytest

from ansible_run import BINDIR, ansible_env, run_module
from conftest import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.ansible

PROFILES_DIR = os.path.join(REPO_ROOT, "policies", "profiles")
HGX = os.path.join(FIXTURES, "topologies", "hgx-h200-8gpu-2socket-ht.json")
VM = os.path.join(FIXTURES, "topologies", "h200-1gpu-vm.json")


def test_plan_from_topology_file_and_profile_name():
    rc, result = run_module(
        "gpu_binding_plan",
        {
            "topology_path": HGX,
            "profile": "strict",
            "profiles_dir": PROFILES_DIR,
            "instances": [
                {"name": "llm0", "gpus": [0], "command": ["/opt/vllm/bin/vllm", "serve", "$HOME; rm -rf /"],
                 "memory": "64G"},
                {"name": "llm4", "gpus": [4], "command": ["/opt/vllm/bin/vllm", "serve"], "binding_method": "systemd",
                 "memory": "64G"},
            ],
            "housekeeping_cores_per_node": 2,
        },
    )
    assert rc == 0, result
    assert result["changed"] is False
    plan = result["plan"]
    assert plan["schema"] == "gpunuma.plan/v1"
    assert plan["housekeeping"] == {"0": "0-1,96-97", "1": "48-49,144-145"}
    llm0, llm4 = plan["instances"]
    assert llm0["exec_prefix"] == ["numactl", "--physcpubind=2-47,98-143", "--membind=0"]
    assert llm0["command"][-1] == "$HOME; rm -rf /"
    assert llm4["systemd"] == {"CPUAffinity": "50-95,146-191", "NUMAPolicy": "bind", "NUMAMask": "1"}
    # unused GPUs are reported through Ansible's warnings
    assert any("GPUs 1-3,5-7 of gpu-a01 are not used" in w for w in result.get("warnings", []))


def test_plan_from_topology_dict_and_profile_data_in_check_mode():
    with open(VM) as handle:
        topology = json.load(handle)
    profile_data = {"name": "strict", "cpu_binding": "node", "mem_policy": "bind", "next": "preferred"}
    rc, result = run_module(
        "gpu_binding_plan",
        {
            "topology": topology,
            "profile_data": profile_data,
            "instances": [{"name": "big", "gpus": [0], "command": ["/bin/srv"], "memory": "8G"}],
        },
        check=True,
    )
    assert rc == 0, result
    assert result["changed"] is False
    inst = result["plan"]["instances"][0]
    assert inst["mem_policy"] == "preferred"
    assert "planned as preferred" in inst["fallback"]


def test_bad_input_fails_with_every_problem():
    rc, result = run_module(
        "gpu_binding_plan",
        {
            "topology_path": HGX,
            "profile": "strict",
            "profiles_dir": PROFILES_DIR,
            "instances": [
                {"name": "a", "gpus": [9], "command": ["/bin/x"]},
                {"name": "b b", "numa_node": 0, "command": ["/bin/x"]},
            ],
        },
    )
    assert rc != 0
    assert result["failed"] is True
    assert result["problems"] == [
        "gpunuma_instances[0].gpus[0]: GPU 9 does not exist on gpu-a01; allowed: 0-7",
        "gpunuma_instances[1].name: 'b b' is not a valid instance name; allowed: 1-64 characters from "
        "A-Z a-z 0-9 _ . - (not starting with . or -), used in the unit name gpunuma-<name>.service",
    ]
    assert result["msg"] == "\n".join(result["problems"])


def test_unknown_profile_name_lists_the_ladder():
    rc, result = run_module(
        "gpu_binding_plan",
        {
            "topology_path": HGX,
            "profile": "strictest",
            "profiles_dir": PROFILES_DIR,
            "instances": [],
        },
    )
    assert rc != 0
    assert "unknown profile 'strictest'" in result["msg"]
    assert "allowed: interleave, off, preferred, strict" in result["msg"]


def test_profile_name_must_match_profile_data():
    rc, result = run_module(
        "gpu_binding_plan",
        {
            "topology_path": VM,
            "profile": "preferred",
            "profile_data": {"name": "strict", "cpu_binding": "node", "mem_policy": "bind", "next": None},
        },
    )
    assert rc != 0
    assert "does not match profile_data.name 'strict'" in result["msg"]


def test_unreadable_topology_file(tmp_path):
    bad = tmp_path / "topology.json"
    bad.write_text("{not json")
    rc, result = run_module(
        "gpu_binding_plan", {"topology_path": str(bad), "profile": "strict", "profiles_dir": PROFILES_DIR}
    )
    assert rc != 0
    assert result["msg"].startswith("topology_path: %s cannot be read as JSON" % bad)


def test_ansible_doc_renders():
    proc = subprocess.run(
        [os.path.join(BINDIR, "ansible-doc"), "-M", "library", "gpu_binding_plan"],
        cwd=REPO_ROOT,
        env=ansible_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for word in ("strict_capacity", "housekeeping_cores_per_node", "profile_data", "EXAMPLES", "RETURN VALUES",
                 "allow_unknown_siblings", "memory_reserve_per_node"):
        assert word in proc.stdout


@pytest.mark.parametrize(
    "applied, expected",
    [
        ("{not json", "applied_plan: must be a gpunuma.plan/v1 mapping, got a str"),
        ([1, 2], "applied_plan: must be a gpunuma.plan/v1 mapping, got a list"),
        ({"schema": "gpunuma.plan/v1", "instances": 5}, "applied_plan.instances: 5 is not a list"),
        (
            {"schema": "gpunuma.plan/v1", "instances": [{"name": "llm", "mem_nodes": 0, "mem_policy": "bind"}]},
            "applied_plan.instances[0].mem_nodes: 0 is not a list of node ids",
        ),
    ],
)
def test_malformed_applied_plan_fails_naming_the_field(applied, expected):
    rc, result = run_module(
        "gpu_binding_plan",
        {
            "topology_path": VM,
            "profile": "strict",
            "profiles_dir": PROFILES_DIR,
            "instances": [{"name": "llm", "numa_node": 0, "memory": "1G", "command": ["/bin/true"]}],
            "applied_plan": applied,
        },
    )
    assert rc != 0, result
    assert result["problems"][0].startswith(expected), result
    assert "/etc/gpunuma/plan.json" in result["msg"]
    assert "Traceback" not in json.dumps(result)


def test_unknown_siblings_refused_unless_allowed():
    with open(VM) as handle:
        topology = json.load(handle)
    topology["numa_nodes"][0]["cores"] = []  # as from nvidia-smi topo -m alone
    args = {
        "topology": topology,
        "profile": "strict",
        "profiles_dir": PROFILES_DIR,
        "instances": [{"name": "llm", "gpus": [0], "command": ["/bin/true"]}],
    }
    rc, result = run_module("gpu_binding_plan", args)
    assert rc != 0
    assert result["problems"][0].startswith(
        "topology.numa_nodes: hyperthread siblings of NUMA node 0 on h200-vm are unknown and cannot be inferred"
    )
    assert "allow_unknown_siblings: true" in result["msg"]
    rc, result = run_module("gpu_binding_plan", dict(args, allow_unknown_siblings=True))
    assert rc == 0, result
    assert result["plan"]["siblings"] == {"0": "unknown"}
    assert any("siblings of NUMA node 0 are unknown" in w for w in result.get("warnings", []))


def test_housekeeping_auto_by_default_and_explicit_cpus():
    base = {"topology_path": HGX, "profile": "strict", "profiles_dir": PROFILES_DIR, "instances": []}
    rc, result = run_module("gpu_binding_plan", base)
    assert rc == 0, result
    assert result["plan"]["housekeeping"] == {"0": "0-1,96-97", "1": "48-49,144-145"}
    rc, result = run_module("gpu_binding_plan", dict(base, housekeeping_cores_per_node="3"))
    assert rc == 0, result
    assert result["plan"]["housekeeping"]["0"] == "0-2,96-98"
    rc, result = run_module("gpu_binding_plan", dict(base, housekeeping_cpus="0,96"))
    assert rc == 0, result
    assert result["plan"]["housekeeping"] == {"0": "0,96", "1": ""}
    rc, result = run_module("gpu_binding_plan", dict(base, housekeeping_cores_per_node="lots"))
    assert rc != 0
    assert result["problems"] == [
        "housekeeping_cores_per_node: 'lots' is not a core count; allowed: auto, or an integer 0 or more"
    ]
