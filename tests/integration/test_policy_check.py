"""gpunuma_policy_check through Ansible: an unwaived error rule fails the
host naming the rule, why and how to waive it; a waiver lets it through; an
expired one is reported; bad waivers name the field."""

import pytest
import json
import os
import platform
import sys

import yaml

from ansible.module_utils.gpunuma.node import autonuma
from ansible_run import run_module, run_playbook
from conftest import REPO_ROOT

pytestmark = pytest.mark.ansible

RULES = os.path.join(REPO_ROOT, "policies", "rules")
TOPO = {"numa_nodes": [{"id": 0, "cpus": "0-3", "has_cpus": True, "cores": ["0", "1", "2", "3"]},
                       {"id": 1, "cpus": "4-7", "has_cpus": True, "cores": ["4", "5", "6", "7"]}]}
PLAN = {"profile": "strict", "options": {"housekeeping_cores_per_node": 1}, "housekeeping": {"0": "0", "1": "4"},
        "instances": [{"name": "tp", "unit": "gpunuma-tp.service", "numa_nodes": [0, 1], "cpus": "1-3,5-7",
                       "mem_policy": "bind", "mem_nodes": [0, 1], "memory_bytes": None,
                       "limit_memlock": 4 << 20}]}
SETTINGS = {"memlock_limit": "4M", "memlock_users": [], "numa_balancing": 0}


def args(**kw):
    a = {"host": "gpu-a01", "groups": ["h100"], "rules_dir": RULES, "topology": TOPO, "plan": PLAN,
         "settings": SETTINGS, "today": "2026-06-01"}
    a.update(kw)
    return a


def waiver(**kw):
    w = {"control": "GN-SPAN-001", "groups": ["h100"], "justification": "TP over both sockets, measured",
         "owner": "alice", "expires": "2026-12-31"}
    w.update(kw)
    return w


def test_violation_fails_naming_rule_and_waiver():
    rc, result = run_module("gpunuma_policy_check", args())
    assert rc != 0 and result.get("failed")
    msg = result["msg"]
    assert "gpu-a01: policy GN-SPAN-001" in msg and "spans NUMA nodes 0-1" in msg and "gpunuma_policy_waivers" in msg


def test_waiver_lets_it_through_and_expired_is_reported():
    rc, result = run_module("gpunuma_policy_check", args(waivers=[waiver()]))
    assert rc == 0, result
    span = [r for r in result["policy"]["results"] if r["id"] == "GN-SPAN-001"][0]
    assert span["status"] == "waived" and span["waiver"]["owner"] == "alice"
    rc, result = run_module("gpunuma_policy_check", args(waivers=[waiver(expires="2026-01-31")]))
    assert rc != 0 and "expired on 2026-01-31" in result["msg"]


def test_bad_waiver_names_the_field():
    rc, result = run_module("gpunuma_policy_check", args(waivers=[waiver(control="GN-NOPE-9", expires="soon")]))
    assert rc != 0
    assert "gpunuma_policy_waivers[0].control: 'GN-NOPE-9' is not a known control id" in result["msg"]
    assert "gpunuma_policy_waivers[0].expires: 'soon' is not a date" in result["msg"]


def test_report_only_mode_does_not_fail():
    rc, result = run_module("gpunuma_policy_check", args(fail_on_violation=False))
    assert rc == 0 and result["policy"]["violations"]


def _gate_results(tmp_path, gather_facts, extra_vars):
    """The policy_gate role on localhost as site.yml and audit.yml include it; GN-NB-001's status and violations."""
    out = tmp_path / "policy.json"
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    (tmp_path / "gate.yml").write_text(yaml.safe_dump([{
        "name": "Gate", "hosts": "localhost", "gather_facts": gather_facts,
        "module_defaults": {"ansible.builtin.setup": {"gather_subset": ["!all", "!min", "platform"]}},
        "tasks": [
            {"name": "Evaluate", "ansible.builtin.include_role": {"name": "policy_gate"},
             "vars": {"policy_gate_topology": TOPO, "policy_gate_plan": PLAN, "policy_gate_fail": False}},
            {"name": "Keep the result", "ansible.builtin.copy": {
                "content": "{{ gpunuma_policy.policy | to_json }}", "dest": str(out), "mode": "0644"}},
        ]}]))
    proc = run_playbook(str(tmp_path / "gate.yml"), str(tmp_path / "inventory.yml"), extra_vars)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    result = [r for r in json.loads(out.read_text())["results"] if r["id"] == "GN-NB-001"][0]
    return result["status"], result["violations"]


def test_gate_passes_auto_as_is_and_decides_it_on_the_node_without_a_release(tmp_path):
    # site.yml's gate gathers no facts: the kernel release is unknown, auto is left to the node.
    assert _gate_results(tmp_path, False, {}) == ("not_applicable", [])
    # An explicit value is still judged at the gate.
    assert _gate_results(tmp_path, False, {"autonuma_numa_balancing": 1}) == (
        "fail", ["instances tp use membind but autonuma_numa_balancing is 1, not 0"])


def test_gate_judges_auto_with_the_release_it_knows(tmp_path):
    # Gathered facts give the controller's kernel here (this machine's, 5.12 or later on any current CI).
    assert autonuma.parse_kernel_release(platform.release()) >= autonuma.MOF_OPT_IN_RELEASE
    assert _gate_results(tmp_path, True, {}) == ("pass", [])
    # The audit's report carries the release it read on the node; it wins over the facts.
    live = {"numa_balancing": {"expected": 0, "live": "1", "file": "1", "kernel_release": "5.10.0-30-amd64"},
            "instances": []}
    assert _gate_results(tmp_path, True, {"policy_gate_live": live}) == (
        "fail", ["the node's sysctl file sets kernel.numa_balancing = 1"])
