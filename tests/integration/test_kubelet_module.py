"""kubelet_topology_plan run through Ansible on localhost, and its documentation."""

import json
import os
import subprocess

import pytest

from ansible_run import BINDIR, ansible_env, run_module
from conftest import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.ansible

HGX = os.path.join(FIXTURES, "topologies", "hgx-h200-8gpu-2socket-ht.json")
KUBEADM = os.path.join(FIXTURES, "kubelet", "kubeadm-config.yaml")
PROFILES = os.path.join(REPO_ROOT, "policies", "profiles")
PRESETS = os.path.join(REPO_ROOT, "policies", "kubelet")


def test_plan_from_files_is_pure_and_reads_checkpoints(tmp_path):
    (tmp_path / "cpu_manager_state").write_text('{"policyName": "none"}')
    config_before = open(KUBEADM, encoding="utf-8").read()
    args = {"topology_path": HGX, "profile": "strict", "profiles_dir": PROFILES, "presets_dir": PRESETS,
            "config_path": KUBEADM, "kubelet_version": "1.31", "state_dir": str(tmp_path)}
    rc, result = run_module("kubelet_topology_plan", args)
    assert rc == 0, result
    assert result["changed"] is False
    # The default is the planner's auto: ceil(48 cores / 24) = 2 whole cores per node.
    assert result["config"]["reservedSystemCPUs"] == "0-1,48-49,96-97,144-145"
    assert result["config_format"] == "yaml"
    assert result["remove_checkpoints"] == [str(tmp_path / "cpu_manager_state"), str(tmp_path / "memory_manager_state")]
    assert result["transition_needed"] is True
    assert open(KUBEADM, encoding="utf-8").read() == config_before
    assert (tmp_path / "cpu_manager_state").read_text() == '{"policyName": "none"}'
    # Same answer in check mode.
    rc, checked = run_module("kubelet_topology_plan", args, check=True)
    assert checked["config_text"] == result["config_text"]


@pytest.mark.parametrize("extra, reserved", [
    ({"housekeeping_cores_per_node": "1"}, "0,48,96,144"),
    ({"housekeeping_cores_per_node": "auto"}, "0-1,48-49,96-97,144-145"),
    ({"housekeeping_cpus": "0-3,96-99,48,144"}, "0-3,48,96-99,144"),
])
def test_housekeeping_is_taken_as_the_binding_planner_takes_it(tmp_path, extra, reserved):
    args = {"topology_path": HGX, "profile": "strict", "profiles_dir": PROFILES, "presets_dir": PRESETS,
            "config_path": KUBEADM, "kubelet_version": "1.31", "state_dir": str(tmp_path)}
    rc, result = run_module("kubelet_topology_plan", dict(args, **extra))
    assert rc == 0, result
    assert result["config"]["reservedSystemCPUs"] == reserved


def test_read_checkpoints_false_ignores_files(tmp_path):
    (tmp_path / "cpu_manager_state").write_text('{"policyName": "static"}')
    (tmp_path / "memory_manager_state").write_text('{"policyName": "Static"}')
    args = {"topology_path": HGX, "profile": "off", "profiles_dir": PROFILES, "presets_dir": PRESETS,
            "config_path": KUBEADM, "kubelet_version": "1.31", "state_dir": str(tmp_path), "read_checkpoints": False}
    rc, result = run_module("kubelet_topology_plan", args)
    assert rc == 0, result
    assert result["remove_checkpoints"] == []
    args["read_checkpoints"] = True
    rc, result = run_module("kubelet_topology_plan", args)
    assert result["remove_checkpoints"] == [str(tmp_path / "cpu_manager_state"), str(tmp_path / "memory_manager_state")]


def test_bad_input_fails_with_every_problem():
    with open(HGX, encoding="utf-8") as handle:
        topology = json.load(handle)
    rc, result = run_module("kubelet_topology_plan", {
        "topology": topology, "profile": "strict", "profiles_dir": PROFILES, "presets_dir": PRESETS,
        "config": "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n",
        "overrides": {"memoryManagerPolicy": "static", "reservedSystemCPUs": "0-400"}})
    assert rc != 0
    assert result["failed"] is True
    assert "memoryManagerPolicy: 'static' is not a Memory Manager policy (the case matters); allowed: None, Static" in result["problems"]
    assert any(p.startswith("reservedSystemCPUs: '0-400' names CPUs 192-400") for p in result["problems"])
    assert "Traceback" not in result["msg"]


def test_ansible_doc_reads_the_module():
    proc = subprocess.run([os.path.join(BINDIR, "ansible-doc"), "-M", os.path.join(REPO_ROOT, "library"),
                           "kubelet_topology_plan"], cwd=REPO_ROOT, capture_output=True, text=True, env=ansible_env(),
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    for word in ("housekeeping_cores_per_node", "memory_spread", "remove_checkpoints", "manage_reservations",
                 "read_checkpoints"):
        assert word in proc.stdout
