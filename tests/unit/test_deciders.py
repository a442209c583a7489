"""Each concern is decided by one function, and only the modules listed here ask it.

A second caller of a decider is the first step to deciding twice with other inputs (the kubelet once recomputed
the housekeeping CPUs without the IRQ sizing the plan used). A new caller must be added here, in review, with the
reason it needs the decision and cannot read the decided value.
"""

from __future__ import annotations

import ast
import os

import pytest

from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

PREFIX = "ansible.module_utils.gpunuma."
CALLERS = {
    # The plan: the module (standalone) and the node's planning step; nobody else plans.
    "plan.planner.build_plan": {"library/gpu_binding_plan.py", "module_utils/gpunuma/plan/node_plan.py"},
    "plan.node_plan.plan_for_node": {"library/gpu_binding_plan.py"},
    # Housekeeping without a plan: only a kubelet configured on a node that has no binding plan.
    "plan.planner.housekeeping_cpu_set": {"module_utils/gpunuma/kubelet/plan.py"},
    # LimitMEMLOCK= of the units: the planner alone (the role's limits.d and containerd files use role_plan).
    "plan.planner.unit_memlock": set(),
    "node.limits.systemd_limit": {"module_utils/gpunuma/plan/planner.py"},
    # Membind capacity: the planner's rule, judged again by the gate on the plan it made.
    "plan.capacity.overcommitted_nodes": {"module_utils/gpunuma/gate/checks.py"},
    # The rung a node runs and the state it records.
    "plan.state.effective_profile": {"filter_plugins/gpunuma.py"},
    "plan.state.resolve_target": {"filter_plugins/gpunuma.py"},
    "plan.state.next_state": {"library/gpunuma_apply.py", "library/gpunuma_state.py"},
    # AutoNUMA: the role through its filter, the gate's reading of the setting, the audit with the applied profile.
    "node.autonuma.decide": {"filter_plugins/gpunuma.py", "module_utils/gpunuma/verify/audit.py"},
    "node.autonuma.setting_of": {"module_utils/gpunuma/gate/checks.py"},
    "node.autonuma.write_live": {"library/gpunuma_audit_info.py"},
    "node.autonuma.detect_container": {"library/gpunuma_audit_info.py", "module_utils/gpunuma/node/probe.py"},
    "kubelet.plan.plan_kubelet": {"library/kubelet_topology_plan.py"},
    "gate.policy.evaluate": {"library/gpunuma_policy_check.py"},
}
SEARCHED = ("module_utils", "library", "action_plugins", "filter_plugins", "gpunuma_controller")


def callers(root: str = REPO_ROOT) -> dict:
    """``{decider: {file}}``: every call of a listed decider from another module."""
    modules = {d.rsplit(".", 1)[0] for d in CALLERS}
    found = {d: set() for d in CALLERS}
    for base in SEARCHED:
        for directory, _, files in os.walk(os.path.join(root, base)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(directory, name)
                rel = os.path.relpath(path, root)
                tree = ast.parse(open(path, encoding="utf-8").read())
                functions, aliases = {}, {}
                for node in ast.walk(tree):
                    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX):
                        module = node.module[len(PREFIX):]
                        for alias in node.names:
                            if module + "." + alias.name in CALLERS:
                                functions[alias.asname or alias.name] = module + "." + alias.name
                            if module + "." + alias.name in modules:
                                aliases[alias.asname or alias.name] = module + "." + alias.name
                for node in ast.walk(tree):
                    target = None
                    if isinstance(node, ast.Name) and node.id in functions:
                        target = functions[node.id]
                    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                            and node.value.id in aliases and aliases[node.value.id] + "." + node.attr in CALLERS:
                        target = aliases[node.value.id] + "." + node.attr
                    if target:
                        found[target].add(rel)
    return found


def test_each_decider_is_asked_only_by_its_listed_callers():
    assert callers() == CALLERS


def test_a_new_caller_is_seen(tmp_path):
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "x.py").write_text(
        "from ansible.module_utils.gpunuma.plan.planner import housekeeping_cpu_set as hk\n"
        "from ansible.module_utils.gpunuma.node import autonuma\n"
        "hk({})\nf = autonuma.decide\n")
    found = callers(str(tmp_path))
    assert found["plan.planner.housekeeping_cpu_set"] == {"library/x.py"}
    assert found["node.autonuma.decide"] == {"library/x.py"}
