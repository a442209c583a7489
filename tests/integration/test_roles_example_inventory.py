"""inventory/example.yml plans cleanly on the hardware it describes.

The example's HGX hosts are planned against the captured 2-socket 8-GPU
H200 topology, exactly as site.yml's plan step would, so the example can
never drift into something the planner rejects.
"""

import json
import os
import subprocess

import pytest

from ansible_run import BINDIR, ansible_env
from conftest import FIXTURES, REPO_ROOT

from ansible.module_utils.gpunuma.plan.planner import build_plan
from ansible.module_utils.gpunuma.plan.profiles import load_profile

pytestmark = pytest.mark.ansible

HGX = os.path.join(FIXTURES, "topologies", "hgx-h200-8gpu-2socket-ht.json")


@pytest.fixture(scope="module")
def inventory():
    proc = subprocess.run(
        [os.path.join(BINDIR, "ansible-inventory"), "-i", os.path.join(REPO_ROOT, "inventory", "example.yml"), "--list"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env=ansible_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" not in proc.stderr.replace("DEPRECATION WARNING", ""), proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize(
    "host", ["gpu-a01.example.net", "gpu-a02.example.net", "gpu-b01.example.net", "gpu-b02.example.net"]
)
def test_hgx_hosts_plan_on_the_hgx_topology(inventory, host):
    host_vars = inventory["_meta"]["hostvars"][host]
    with open(HGX, encoding="utf-8") as handle:
        topology = json.load(handle)
    profile = load_profile(host_vars["gpunuma_profile"], os.path.join(REPO_ROOT, "policies", "profiles"))
    plan = build_plan(
        topology, profile, host_vars["gpunuma_instances"],
        housekeeping_cores_per_node=host_vars.get("gpunuma_housekeeping_cores_per_node", "auto"),
    )
    gpus = [g for i in plan["instances"] for g in i["gpus"]]
    assert sorted(gpus) == list(range(8))
    for instance in plan["instances"]:
        if instance["gpus"]:
            nodes = {topology["gpus"][g]["numa_node"] for g in instance["gpus"]}
            assert instance["numa_nodes"] == sorted(nodes) and len(nodes) == 1


def test_host_override_beats_the_group(inventory):
    hostvars = inventory["_meta"]["hostvars"]
    assert hostvars["gpu-b01.example.net"]["gpunuma_profile"] == "strict"
    assert hostvars["gpu-b02.example.net"]["gpunuma_profile"] == "preferred"
