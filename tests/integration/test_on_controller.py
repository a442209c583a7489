"""gpunuma's compute-only modules called in the action's process on the controller
(action_plugins/gpu_binding_plan.py) return what the same module returns when
Ansible runs it as a module: results, warnings, and every kind of failure."""

import datetime
import json
import os
import subprocess

import pytest
import yaml

from ansible_run import BINDIR, ansible_env
from conftest import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.ansible

HGX = os.path.join(FIXTURES, "topologies", "hgx-h200-8gpu-2socket-ht.json")
PROFILES = os.path.join(REPO_ROOT, "policies", "profiles")
RULES = os.path.join(REPO_ROOT, "policies", "rules")
INSTANCES = [{"name": "llm0", "gpus": [0], "command": ["/opt/vllm/bin/vllm", "serve"], "memory": "64G"},
             {"name": "tp", "gpus": [3, 4], "command": ["/opt/vllm/bin/vllm", "serve"]}]
PLAN_ARGS = {"topology_path": HGX, "profile": "strict", "profiles_dir": PROFILES, "instances": INSTANCES,
             "housekeeping_cores_per_node": 2}
POLICY_ARGS = {"host": "gpu-a01", "groups": ["h200"], "rules_dir": RULES, "today": "2026-06-01",
               "topology": {"numa_nodes": [{"id": 0, "cpus": "0-3", "has_cpus": True, "cores": ["0", "1", "2", "3"]},
                                           {"id": 1, "cpus": "4-7", "has_cpus": True, "cores": ["4", "5", "6", "7"]}]},
               "plan": {"profile": "strict", "options": {"housekeeping_cores_per_node": 1},
                        "housekeeping": {"0": "0", "1": "4"},
                        "instances": [{"name": "tp", "unit": "gpunuma-tp.service", "numa_nodes": [0, 1],
                                       "cpus": "1-3,5-7", "mem_policy": "bind", "mem_nodes": [0, 1],
                                       "memory_bytes": None, "limit_memlock": 4 << 20}]},
               "settings": {"memlock_limit": "4M", "memlock_users": [], "numa_balancing": 0}}

KUBELET_ARGS = {"topology_path": HGX, "profile": "strict", "profiles_dir": PROFILES,
                "presets_dir": os.path.join(REPO_ROOT, "policies", "kubelet"),
                "config_path": os.path.join(FIXTURES, "kubelet", "kubeadm-config.yaml"), "kubelet_version": "1.31",
                "state_dir": "/nonexistent-kubelet-state"}

CASES = [
    ("plan", "gpu_binding_plan", PLAN_ARGS, False),
    ("plan in check mode", "gpu_binding_plan", PLAN_ARGS, True),
    ("plan of an unknown GPU", "gpu_binding_plan", dict(PLAN_ARGS, instances=[{"name": "x", "gpus": [42]}]), False),
    ("unsupported option", "gpu_binding_plan", dict(PLAN_ARGS, bogus=1), False),
    ("bad choice", "gpu_binding_plan", dict(PLAN_ARGS, strict_capacity="sometimes"), False),
    ("mutually exclusive", "gpu_binding_plan", dict(PLAN_ARGS, topology={"schema": "x"}), False),
    ("neither of required", "gpu_binding_plan", {"topology_path": HGX}, False),
    ("unreadable topology", "gpu_binding_plan", dict(PLAN_ARGS, topology_path="/nonexistent.json"), False),
    ("policy violation", "gpunuma_policy_check", POLICY_ARGS, False),
    ("policy warning only", "gpunuma_policy_check", dict(POLICY_ARGS, fail_on_violation=False), False),
    ("policy bad date", "gpunuma_policy_check", dict(POLICY_ARGS, today="June"), False),
    ("policy missing host", "gpunuma_policy_check", {"rules_dir": RULES}, False),
    ("kubelet plan", "kubelet_topology_plan", KUBELET_ARGS, False),
    ("kubelet plan of an unknown profile", "kubelet_topology_plan", dict(KUBELET_ARGS, profile="fastest"), False),
]


# YAML reads an unquoted 2026-12-31 as a date: Ansible hands a module its ISO text, and so does the action.
DATED_WAIVER = {"control": "GN-SPAN-001", "groups": ["h200"], "justification": "TP over both sockets, measured",
                "owner": "alice", "expires": datetime.date(2026, 12, 31)}


def _run(tmp_path, action_plugins, interpreter=os.path.join(BINDIR, "python"), extra_tasks=()):
    tasks = [{"name": name, module: args, "check_mode": check, "ignore_errors": True}
             for name, module, args, check in CASES]
    playbook = tmp_path / "play.yml"
    tasks.append({"name": "waiver with a YAML date", "ignore_errors": True,
                  "gpunuma_policy_check": dict(POLICY_ARGS, waivers=[DATED_WAIVER])})
    tasks.extend(extra_tasks)
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    assert "expires: 2026-12-31\n" in playbook.read_text()  # unquoted: a date to YAML
    env = ansible_env(ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
                      ANSIBLE_ACTION_PLUGINS=action_plugins)
    proc = subprocess.run([os.path.join(BINDIR, "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", "ansible_python_interpreter=" + interpreter, str(playbook)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)
    data = json.loads(proc.stdout)
    results = {}
    for task in data["plays"][0]["tasks"]:
        result = task["hosts"]["localhost"]
        results[task["task"]["name"]] = {
            "failed": bool(result.get("failed")), "changed": result.get("changed"), "msg": result.get("msg"),
            "problems": result.get("problems"), "plan": result.get("plan"), "policy": result.get("policy"),
            "kubelet": result.get("config_text"),
            "warnings": sorted(str(w.get("msg", w) if isinstance(w, dict) else w) for w in result.get("warnings", [])),
            "module_args": (result.get("invocation") or {}).get("module_args"),
        }
    return results


def test_in_process_results_equal_the_modules(tmp_path):
    empty = tmp_path / "no-actions"
    empty.mkdir()
    here = _run(tmp_path, os.path.join(REPO_ROOT, "action_plugins"))
    module = _run(tmp_path, str(empty))
    assert list(here) == [case[0] for case in CASES] + ["waiver with a YAML date"]
    for name in here:
        assert here[name] == module[name], name
    # The cases are what they say: each failure is one, with the message a user acts on.
    assert not here["plan"]["failed"] and here["plan"]["plan"]["instances"]
    assert here["plan in check mode"]["plan"] == here["plan"]["plan"]
    assert here["unsupported option"]["msg"].startswith("Unsupported parameters for (gpu_binding_plan) module: bogus")
    assert "strict_capacity must be one of" in here["bad choice"]["msg"]
    assert "mutually exclusive: topology|topology_path" in here["mutually exclusive"]["msg"]
    assert "one of the following is required: profile, profile_data" in here["neither of required"]["msg"]
    assert here["unreadable topology"]["msg"].startswith("topology_path: /nonexistent.json cannot be read")
    assert here["plan of an unknown GPU"]["failed"] and here["plan of an unknown GPU"]["problems"]
    assert here["policy violation"]["failed"] and "GN-" in here["policy violation"]["msg"]
    assert not here["policy warning only"]["failed"] and here["policy warning only"]["policy"]["violations"]
    assert here["policy bad date"]["msg"] == "today: 'June' is not a date; allowed: YYYY-MM-DD"
    assert "missing required arguments: host" in here["policy missing host"]["msg"]
    assert "reservedSystemCPUs: 0-1,48-49,96-97,144-145" in here["kubelet plan"]["kubelet"]
    assert here["kubelet plan of an unknown profile"]["failed"]
    dated = here["waiver with a YAML date"]
    assert not dated["failed"], dated
    assert any(r["status"] == "waived" and r["waiver"]["expires"] == "2026-12-31" for r in dated["policy"]["results"])


def test_the_action_runs_them_without_a_python_of_their_own(tmp_path):
    """The in-process path is really taken: with no Python at the interpreter's path on localhost, every case still
    gives the module's own result; a task with an environment of its own runs as a module and cannot start."""
    empty = tmp_path / "no-actions"
    empty.mkdir()
    module = _run(tmp_path, str(empty))
    environment_task = {"name": "with an environment", "gpunuma_policy_check": POLICY_ARGS, "ignore_errors": True,
                        "environment": {"LC_ALL": "C"}}
    here = _run(tmp_path, os.path.join(REPO_ROOT, "action_plugins"), interpreter="/nonexistent/python",
                extra_tasks=[environment_task])
    for name in module:
        assert here[name] == module[name], name
    assert here["with an environment"]["failed"]
    assert "/nonexistent/python" in here["with an environment"]["msg"]
