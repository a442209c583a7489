"""gpunuma_inputs (action_plugins/gpunuma_inputs.py), the one controller step that checks every role's inputs of a
site.yml run: each role's own rule, the variable the user set named, one line a role, nothing set on failure; the
good roles' reads added to the run's node read. Local hosts: the step never contacts one."""

import json
import os
import subprocess

import pytest
import yaml

from ansible_run import BINDIR, ansible_env
from conftest import REPO_ROOT

pytestmark = pytest.mark.ansible

ROLES = ["memlock", "autonuma", "gpu_topology", "numa_binding", "gpunuma_state", "policy_gate"]
PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - name: Check the inputs
      gpunuma_inputs:
        roles: %s
    - name: Show the run's node read requests
      ansible.builtin.debug:
        var: ansible_facts.gpunuma_node_read_requests
""" % json.dumps(ROLES)


def _run(tmp_path, hosts):
    inventory = tmp_path / "inventory.yml"
    common = {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"}
    inventory.write_text(yaml.safe_dump({"all": {"hosts": dict((h, dict(common, **v)) for h, v in hosts.items())}}))
    playbook = tmp_path / "inputs.yml"
    playbook.write_text(PLAYBOOK)
    proc = subprocess.run([os.path.join(BINDIR, "ansible-playbook"), "-i", str(inventory), str(playbook)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env=ansible_env(ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"))
    data = json.loads(proc.stdout[proc.stdout.index("{"):])
    results = {}
    for task in data["plays"][0]["tasks"]:
        for host, result in task["hosts"].items():
            results.setdefault(host, {})[task["task"]["name"]] = result
    return proc, results


def test_every_roles_problems_in_one_step_naming_the_users_variable(tmp_path):
    good = {"gpunuma_profile": "preferred", "memlock_limit": "4M", "autonuma_numa_balancing": 0,
            "gpunuma_instances": [{"name": "w", "numa_node": 0, "command": ["/bin/sleep", "infinity"]}]}
    bad = dict(good, gpunuma_profile="fastest", memlock_limit="lots", autonuma_numa_balancing=7,
               gpunuma_state_history_limit="many", gpunuma_policy_waivers="none")
    proc, results = _run(tmp_path, {"good": good, "bad": bad})
    assert proc.returncode != 0

    check = results["bad"]["Check the inputs"]
    assert check["failed"] is True and "ansible_facts" not in check and check["gpunuma_round_trips"] == 0
    lines = check["msg"].splitlines()
    # One line a role with problems, in the order asked, each naming the host.
    assert [line.split(": ", 2)[1] for line in lines] == [
        "memlock_limit", "autonuma_numa_balancing", "gpunuma_profile", "gpunuma_state_history_limit",
        "gpunuma_policy_waivers"], lines
    assert all(line.startswith("bad: ") for line in lines)
    # The user's variable is named (gpunuma_profile, not the role's numa_binding_profile), with what is allowed.
    assert "'fastest'" in lines[2] and "numa_binding_profile" not in lines[2] and "strict" in lines[2]
    assert "policy_gate_waivers" not in lines[4] and "a YAML list" in lines[4], lines[4]
    assert check["input_problems"]["gpu_topology_input_problems"] == []
    assert check["input_problems"]["numa_binding_input_problems"] and "requests" not in json.dumps(check["input_problems"])
    assert "Show the run's node read requests" not in results["bad"]

    facts = results["good"]["Check the inputs"]["ansible_facts"]
    assert all(facts[name] == [] for name in ("memlock_input_problems", "autonuma_input_problems",
                                              "gpu_topology_input_problems", "numa_binding_input_problems",
                                              "gpunuma_state_input_problems", "policy_gate_input_problems"))
    requests = results["good"]["Show the run's node read requests"]["ansible_facts.gpunuma_node_read_requests"]
    # Each good role's part: PID 1's limits and containerd (memlock), the AutoNUMA sources, the state file and
    # the applied plan (gpunuma_state), the applied plan, numactl and the accounts (numa_binding).
    assert requests["pid1_proc_dir"] == "/proc/1" and "containerd.service" in requests["units"], requests
    assert requests["autonuma"]["proc_path"], requests
    assert requests["files"]["gpunuma_state"] == "/etc/gpunuma/state.json", requests
    assert requests["files"]["gpunuma_state_plan"] == "/etc/gpunuma/plan.json", requests
    assert "plan" in requests["files"] and any("numactl" in p for p in requests["paths"]), requests


def test_a_role_the_step_does_not_know_is_refused(tmp_path):
    playbook = tmp_path / "p.yml"
    playbook.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                        "    - gpunuma_inputs:\n        roles: [memlock, kubelet]\n")
    proc = subprocess.run([os.path.join(BINDIR, "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=ansible_env())
    assert proc.returncode != 0
    assert "roles: ['kubelet'] is not allowed; allowed: a list of autonuma, gpu_topology, gpunuma_state, memlock, " \
           "numa_binding, policy_gate, kubelet_topology" in proc.stdout, proc.stdout[-2000:]


def test_a_kubelet_nodes_reads_join_the_node_read_and_its_inputs_wait_for_its_plan(tmp_path):
    """kubelet_topology's inputs need the discovery (its plan checks them); the step adds only its reads."""
    playbook = tmp_path / "p.yml"
    playbook.write_text(PLAYBOOK.replace(json.dumps(ROLES), json.dumps(["memlock", "kubelet_topology"])))
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"k": {
        "ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}",
        "kubelet_topology_config_path": "/etc/kubernetes/kubelet/config.json", "kubelet_topology_dra": "auto"}}}}))
    proc = subprocess.run([os.path.join(BINDIR, "ansible-playbook"), "-i", str(inventory), str(playbook)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env=ansible_env(ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    data = json.loads(proc.stdout[proc.stdout.index("{"):])
    check, shown = (task["hosts"]["k"] for task in data["plays"][0]["tasks"])
    assert "__kubelet_topology_input_problems" not in check["ansible_facts"]
    requests = shown["ansible_facts.gpunuma_node_read_requests"]
    assert requests["files"]["kubelet_config"] == "/etc/kubernetes/kubelet/config.json"
    assert requests["files"]["kubelet_dra_manager_state"] == "/var/lib/kubelet/dra_manager_state"
    assert requests["globs"] == {"kubelet_dra_registrations": "/var/lib/kubelet/plugins_registry/*-reg.sock"}
    # memlock's part is there too.
    assert requests["pid1_proc_dir"] == "/proc/1"
