"""audit.yml on localhost plus an unreachable host: a report per audited
host, the fleet table, textfile metrics, a non-zero exit status, and
nothing written on the node."""

import pytest
import json
import os
import sys

import yaml

from ansible.module_utils.gpunuma.node import autonuma
from ansible_run import run_playbook

pytestmark = pytest.mark.ansible


def test_fleet_table_reports_and_exit_status(tmp_path):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {
        "localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "ghost": {"ansible_connection": "community.docker.docker"},
        "not-in-limit": {"ansible_connection": "local"},
        # Names that a character-replacing scheme maps to one file.
        "rack1/gpu-a01": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "rack1_gpu-a01": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
    }}}))
    reports = tmp_path / "reports"
    metrics = tmp_path / "gpunuma.prom"
    proc = run_playbook("playbooks/audit.yml", str(inventory),
                        {"gpunuma_audit_dir": str(reports), "gpunuma_audit_textfile": str(metrics),
                         "numa_binding_plan_path": str(tmp_path / "plan.json"),
                         "autonuma_numa_balancing": 0,
                         "autonuma_sysctl_file": str(tmp_path / "sysctl.conf")},
                        check=True, extra=["--limit", "localhost,ghost,rack1*"])
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "localhost                drifted      plan-missing, numa-balancing-file" in out
    assert "ghost                    unreachable  not audited" in out
    assert "not-in-limit" not in out
    # One report per host, named reversibly (role_inputs.host_file_stem).
    assert sorted(os.listdir(reports)) == ["localhost.json", "rack1%2Fgpu-a01.json", "rack1_gpu-a01.json"]
    for name, host in (("rack1%2Fgpu-a01.json", "rack1/gpu-a01"), ("rack1_gpu-a01.json", "rack1_gpu-a01")):
        assert json.loads((reports / name).read_text())["hostname"] == host
    report = json.loads((reports / "localhost.json").read_text())
    assert report["schema"] == "gpunuma.audit/v1" and report["status"] == "drifted"
    assert [f["id"] for f in report["findings"]] == ["plan-missing", "numa-balancing-file"]
    assert "results" in report["policy"]
    text = metrics.read_text()
    assert 'gpunuma_audit_compliant{host="localhost"} 0' in text and 'gpunuma_audit_unreachable{host="ghost"} 1' in text
    assert not (tmp_path / "plan.json").exists() and not (tmp_path / "sysctl.conf").exists()


def test_auto_numa_balancing_left_alone_is_no_drift(tmp_path):
    """autonuma_numa_balancing auto (the default) leaves a bound node's value and file alone on Linux 5.12+:
    the audit reads the node's kernel release and does not hold such a node to 0."""
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {
        "localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    reports = tmp_path / "reports"
    proc = run_playbook("playbooks/audit.yml", str(inventory),
                        {"gpunuma_audit_dir": str(reports), "numa_binding_plan_path": str(tmp_path / "plan.json"),
                         "autonuma_sysctl_file": str(tmp_path / "sysctl.conf")}, check=True)
    out = proc.stdout + proc.stderr
    report = json.loads((reports / "localhost.json").read_text())
    assert report["numa_balancing"]["kernel_release"] == os.uname().release, out[-3000:]
    # This machine's kernel is 5.12 or later (the case this test is about).
    assert autonuma.parse_kernel_release(os.uname().release) >= autonuma.MOF_OPT_IN_RELEASE
    assert report["numa_balancing"]["expected"] is None, out[-3000:]
    assert [f["id"] for f in report["findings"]] == ["plan-missing"]


def test_kubelet_settings_are_audited(tmp_path):
    """A kubelet node whose config does not match its profile's preset drifts, naming each setting."""
    import shutil

    from conftest import FIXTURES

    topology = tmp_path / "topology.json"
    shutil.copy(os.path.join(FIXTURES, "topologies", "hgx-h200-8gpu-2socket-ht.json"), topology)
    config = tmp_path / "config.yaml"
    config.write_text(open(os.path.join(FIXTURES, "kubelet", "kubeadm-config.yaml"), encoding="utf-8").read())
    state = tmp_path / "state"
    state.mkdir()
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {
        "localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                      "gpunuma_kubelet": True, "kubelet_topology_config_path": str(config),
                      "kubelet_topology_state_dir": str(state), "kubelet_topology_kubelet_version": "1.31",
                      "gpu_topology_node_path": str(topology),
                      # The fixture is another machine's topology: not re-discovered here.
                      "gpu_topology_nvml_dump": "/nonexistent"}}}}))
    reports = tmp_path / "reports"
    before = config.read_text()
    proc = run_playbook("playbooks/audit.yml", str(inventory),
                        {"gpunuma_audit_dir": str(reports), "numa_binding_plan_path": str(tmp_path / "plan.json"),
                         "autonuma_sysctl_file": str(tmp_path / "sysctl.conf")}, check=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    report = json.loads((reports / "localhost.json").read_text())
    kubelet = {f["message"].split()[1]: f for f in report["findings"] if f["id"] == "kubelet-setting"}
    assert kubelet["cpuManagerPolicy"]["expected"] == "static", report["findings"]
    assert kubelet["topologyManagerPolicy"]["expected"] == "single-numa-node"
    assert "profile strict asks for" in kubelet["cpuManagerPolicy"]["message"]
    assert report["status"] == "drifted"
    assert config.read_text() == before


@pytest.mark.parametrize("slices_from", ["file", "kubectl"])
def test_dra_nodes_are_audited_against_their_resource_slices(tmp_path, slices_from):
    """gpunuma_audit_resource_slices: the GPU devices a DRA driver publishes against the node's topology, and the
    DRA checkpoint reported (docs/audit.md). ``kubectl``: read live through a kubectl on the controller's PATH
    (here a script that records its arguments and prints the slices)."""
    import shutil

    from conftest import FIXTURES
    from dra_slices import derived_slices

    source = os.path.join(FIXTURES, "topologies", "hgx-h200-8gpu-2socket-ht.json")
    topology = tmp_path / "topology.json"
    shutil.copy(source, topology)
    config = tmp_path / "config.yaml"
    config.write_text(open(os.path.join(FIXTURES, "kubelet", "kubeadm-config.yaml"), encoding="utf-8").read())
    state = tmp_path / "state"
    state.mkdir()
    claims = {"kind": "DRACheckpoint", "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1",
              "Entries": [{"ClaimUID": "u1", "ClaimName": "gpu", "Namespace": "default",
                           "DriverState": {"gpu.nvidia.com": {"Devices": []}}}]}
    (state / "dra_manager_state").write_text(json.dumps({"Data": json.dumps(claims), "Checksum": 1}))
    # GPU 5's driver says NUMA node 0; gpunuma found it on node 1.
    slices = derived_slices(json.load(open(source, encoding="utf-8")), "gpu-k01",
                            numa=lambda gpu: {"int": 0 if gpu["index"] == 5 else gpu["numa_node"]})
    slices_file = tmp_path / "slices.json"
    slices_file.write_text(json.dumps(slices))
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {
        "localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                      "gpunuma_kubelet": True, "kubelet_topology_config_path": str(config),
                      "kubelet_topology_state_dir": str(state), "kubelet_topology_kubelet_version": "1.34",
                      "kubelet_topology_node_name": "gpu-k01", "kubelet_topology_dra": "gpu",
                      "gpu_topology_node_path": str(topology), "gpu_topology_nvml_dump": "/nonexistent"}}}}))
    reports = tmp_path / "reports"
    env = None
    if slices_from == "kubectl":
        bindir = tmp_path / "bin"
        bindir.mkdir()
        kubectl = bindir / "kubectl"
        kubectl.write_text('#!/bin/sh\nprintf "%%s\\n" "$@" > "%s"\ncat "%s"\n' % (tmp_path / "kubectl-args", slices_file))
        kubectl.chmod(0o755)
        env = {"PATH": os.pathsep.join([str(bindir), os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    proc = run_playbook("playbooks/audit.yml", str(inventory),
                        {"gpunuma_audit_dir": str(reports), "numa_binding_plan_path": str(tmp_path / "plan.json"),
                         "autonuma_sysctl_file": str(tmp_path / "sysctl.conf"),
                         "gpunuma_audit_resource_slices": str(slices_file) if slices_from == "file" else "kubectl"},
                        check=True, env=env)
    out = proc.stdout + proc.stderr
    if slices_from == "kubectl":
        assert (tmp_path / "kubectl-args").read_text().split() == [
            "get", "resourceslices", "--output", "json", "--field-selector", "spec.nodeName=gpu-k01"], out[-3000:]
    report = json.loads((reports / "localhost.json").read_text())
    slice_findings = [f for f in report["findings"] if f["id"] == "kubelet-resource-slice"]
    assert [(f["severity"], f["expected"], f["actual"]) for f in slice_findings] == [("error", 1, 0)], out[-3000:]
    assert "gpu.nvidia.com/gpu-5 publishes numaNode 0" in slice_findings[0]["message"]
    (dra,) = [f for f in report["findings"] if f["id"] == "kubelet-dra-checkpoint"]
    assert dra["severity"] == "info" and "1 prepared claim(s) of gpu.nvidia.com" in dra["message"]
    assert report["status"] == "drifted"
