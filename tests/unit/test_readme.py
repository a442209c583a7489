"""The README stays true: its two commands, its worked inventory, its links."""

import pytest
import json
import os
import re

import yaml

from ansible.module_utils.gpunuma.plan.planner import build_plan
from ansible.module_utils.gpunuma.plan.profiles import load_profile
from conftest import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.unit

README = os.path.join(REPO_ROOT, "README.md")
HGX = os.path.join(FIXTURES, "topologies", "hgx-h200-8gpu-2socket-ht.json")


def text():
    with open(README, encoding="utf-8") as handle:
        return handle.read()


def worked_inventory():
    (block,) = re.findall(r"```yaml\n(.*?)```", text(), re.S)
    return yaml.safe_load(block)


def test_exactly_two_setup_commands_and_both_scripts_exist():
    section = text().split("## Two commands", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```sh\n(.*?)```", section, re.S)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["./scripts/demo.sh", "./scripts/test.sh"]
    for command in commands:
        assert os.access(os.path.join(REPO_ROOT, command), os.X_OK)


def test_worked_inventory_variables_are_real():
    documented = open(os.path.join(REPO_ROOT, "docs", "role-variables.md"), encoding="utf-8").read()
    examples = open(os.path.join(REPO_ROOT, "inventory", "group_vars", "all.yml"), encoding="utf-8").read()
    seen = []

    def walk(group):
        for name in (group.get("vars") or {}):
            seen.append(name)
        for child in (group.get("children") or {}).values():
            walk(child or {})

    walk(worked_inventory()["all"])
    assert "gpunuma_instances" in seen and "numa_binding_housekeeping_confine" in seen
    for name in seen:
        if name.startswith("ansible_"):
            continue
        assert "`%s`" % name in documented or re.search(r"^#? ?%s:" % re.escape(name), examples, re.M), name


def test_worked_inventory_plans_on_an_hgx_node():
    group = worked_inventory()["all"]["children"]["gpu_nodes"]
    host_vars = group["vars"]
    with open(HGX, encoding="utf-8") as handle:
        topology = json.load(handle)
    profile = load_profile(host_vars["gpunuma_profile"], os.path.join(REPO_ROOT, "policies", "profiles"))
    plan = build_plan(topology, profile, host_vars["gpunuma_instances"],
                      housekeeping_cores_per_node=host_vars["gpunuma_housekeeping_cores_per_node"])
    (vllm0,) = plan["instances"]
    assert vllm0["gpus"] == [0] and vllm0["numa_nodes"] == [topology["gpus"][0]["numa_node"]]
    assert vllm0["mem_policy"] == "bind" and vllm0["user"] == "inference" and vllm0["ready"]["url"]


def test_links_and_pictures_exist():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text()):
        if "://" in target:
            continue
        assert os.path.exists(os.path.join(REPO_ROOT, target)), target


def test_worked_inventory_passes_the_shipped_policies():
    """The README's example, planned on an HGX node, passes every shipped rule the gate can judge from the plan."""
    import datetime

    from ansible.module_utils.gpunuma.gate import policy

    host_vars = worked_inventory()["all"]["children"]["gpu_nodes"]["vars"]
    with open(HGX, encoding="utf-8") as handle:
        topology = json.load(handle)
    profile = load_profile(host_vars["gpunuma_profile"], os.path.join(REPO_ROOT, "policies", "profiles"))
    instances = [dict(host_vars["gpunuma_instances"][0], name="vllm%d" % g, gpus=[g]) for g in range(8)]
    # As the numa_binding role plans it: the units' limit is memlock_limit's (numa_binding_limit_memlock's default).
    plan = build_plan(topology, profile, instances,
                      housekeeping_cores_per_node=host_vars["gpunuma_housekeeping_cores_per_node"],
                      limit_memlock=host_vars["memlock_limit"])
    settings = {"memlock_limit": host_vars["memlock_limit"], "memlock_users": host_vars.get("memlock_users", []),
                "memlock_unlimited_services": host_vars.get("gpunuma_policy_memlock_unlimited_services", []),
                "numa_balancing": host_vars.get("autonuma_numa_balancing", "auto"), "kernel_release": "6.1.0",
                "kubelet": None}
    rules = policy.load_rules(os.path.join(REPO_ROOT, "policies", "rules"), yaml.safe_load)
    ctx = policy.Context("gpu-a01.example.net", topology, plan, settings, None)
    results, _ = policy.evaluate(rules, ctx, [], ["gpu_nodes"], datetime.date(2026, 12, 7))
    failed = [(r["id"], r["violations"]) for r in results if r["status"] == "fail"]
    assert failed == []
