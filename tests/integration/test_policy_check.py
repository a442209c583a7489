"""gpunuma_policy_check through Ansible: an unwaived error rule fails the
host naming the rule, why and how to waive it; a waiver lets it through; an
expired one is reported; bad waivers name the field."""

import os

from ansible_run import run_module
from conftest import REPO_ROOT

RULES = os.path.join(REPO_ROOT, "policies", "rules")
TOPO = {"numa_nodes": [{"id": 0, "cpus": "0-3", "has_cpus": True, "cores": ["0", "1", "2", "3"]},
                       {"id": 1, "cpus": "4-7", "has_cpus": True, "cores": ["4", "5", "6", "7"]}]}
PLAN = {"profile": "strict", "options": {"housekeeping_cores_per_node": 1}, "housekeeping": {"0": "0", "1": "4"},
        "instances": [{"name": "tp", "unit": "gpunuma-tp.service", "numa_nodes": [0, 1], "cpus": "1-3,5-7",
                       "mem_policy": "bind", "mem_nodes": [0, 1], "memory_bytes": None}]}
SETTINGS = {"memlock_limit": "4M", "memlock_users": [], "limit_memlock": "4M", "numa_balancing": 0}


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
