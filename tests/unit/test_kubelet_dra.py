"""DRA-aware kubelet plans, the DRA checkpoint, the memory checkpoint guard's files and the ResourceSlice audit.

ResourceSlices are the published shapes in tests/fixtures/kubelet/resourceslices
(README there), and H200/GB200 slices derived from the topology fixtures with the
same attribute names and typed values. The real kubelet under gpu_and_cpu is
tests/integration/test_kubelet_real.py.
"""

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.kubelet import guard, resource_slices
from ansible.module_utils.gpunuma.kubelet.dra import dra_checkpoint, dra_mode
from ansible.module_utils.gpunuma.kubelet.values import KubeletPlanError
from ansible.module_utils.gpunuma.kubelet.plan import plan_kubelet
from ansible.module_utils.gpunuma.plan.profiles import load_profile, parse_profile_text
from ansible.module_utils.gpunuma.verify import audit
from conftest import FIXTURES, REPO_ROOT
from dra_slices import derived_slices

pytestmark = pytest.mark.unit

SLICES = os.path.join(FIXTURES, "kubelet", "resourceslices")
KUBEADM = os.path.join(FIXTURES, "kubelet", "kubeadm-config.yaml")


def load(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def topology(name):
    return load(os.path.join(FIXTURES, "topologies", name))


def plan(profile_name="strict", dra="off", topo="hgx-h200-8gpu-2socket-ht.json", config=None, **kwargs):
    profile = load_profile(profile_name, os.path.join(REPO_ROOT, "policies", "profiles"))
    preset_path = os.path.join(REPO_ROOT, "policies", "kubelet", "%s.yml" % profile_name)
    with open(preset_path, encoding="utf-8") as handle:
        preset = parse_profile_text(handle.read(), preset_path)
    if config is None:
        with open(KUBEADM, encoding="utf-8") as handle:
            config = handle.read()
    return plan_kubelet(topology(topo), profile, preset, config, kubelet_version="1.34", dra=dra, **kwargs)


# ---------------------------------------------------------------- DRA modes

def test_gpu_and_cpu_hands_cpus_to_the_cpu_dra_driver():
    result = plan(dra="gpu_and_cpu").as_dict()
    settings_ = result["settings"]
    assert settings_["cpuManagerPolicy"] == "none" and settings_["memoryManagerPolicy"] == "None"
    assert settings_["cpuManagerPolicyOptions"] is None and settings_["reservedMemory"] is None
    strict = plan(dra="off").as_dict()
    # The housekeeping CPUs stay reserved, and the driver is told the same list.
    assert result["reserved_cpus"] == strict["reserved_cpus"] and result["reserved_cpus"]
    assert any("--reserved-cpus=%s" % result["reserved_cpus"] in w for w in result["warnings"])
    assert result["dra_mode"] == "gpu_and_cpu"
    assert result["memory_checkpoint_guard"] is False, "no Static Memory Manager, nothing to guard"
    # none and None are the kubelet's defaults: the config leaves them out (kubeadm's config has neither).
    assert "cpuManagerPolicy" not in result["config_text"] and "memoryManagerPolicy" not in result["config_text"]


def test_a_static_node_moving_to_gpu_and_cpu_drops_its_stale_checkpoints():
    static = plan(dra="off")
    cpu_state = json.dumps({"policyName": "static", "defaultCpuSet": "0-3", "checksum": 1})
    mem_state = json.dumps({"policyName": "Static", "machineState": {}, "checksum": 2})
    moved = plan(dra="gpu_and_cpu", config=static.config_text, cpu_state=cpu_state, memory_state=mem_state)
    assert sorted(moved.remove_checkpoints) == ["/var/lib/kubelet/cpu_manager_state",
                                                "/var/lib/kubelet/memory_manager_state"]
    assert {c["key"] for c in moved.changes} >= {"cpuManagerPolicy", "memoryManagerPolicy", "reservedMemory"}


def test_gpu_keeps_the_preset_and_says_what_aligns_the_gpu():
    off, gpu = plan(dra="off").as_dict(), plan(dra="gpu").as_dict()
    assert gpu["settings"] == off["settings"]
    assert any("does not align DRA devices" in w and "matchAttribute" in w for w in gpu["warnings"])
    assert gpu["memory_checkpoint_guard"] is True


@pytest.mark.parametrize("overrides, needle", [
    ({"cpuManagerPolicy": "static"}, "overrides.cpuManagerPolicy: 'static' conflicts with dra gpu_and_cpu"),
    ({"memoryManagerPolicy": "Static"}, "overrides.memoryManagerPolicy: 'Static' conflicts"),
    ({"cpuManagerPolicyOptions": {"full-pcpus-only": "true"}}, "overrides.cpuManagerPolicyOptions: is set with dra"),
])
def test_overrides_that_contradict_gpu_and_cpu_are_refused_by_name(overrides, needle):
    with pytest.raises(KubeletPlanError) as caught:
        plan(dra="gpu_and_cpu", overrides=overrides)
    assert any(needle in p for p in caught.value.problems), caught.value.problems


def test_an_unknown_dra_mode_is_named():
    with pytest.raises(KubeletPlanError) as caught:
        plan(dra="yes")
    assert any(p.startswith("dra: 'yes' is not allowed; allowed: off, gpu, gpu_and_cpu") for p in caught.value.problems)


@pytest.mark.parametrize("names, mode", [
    ([], "off"),
    (["/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock"], "gpu"),
    (["/var/lib/kubelet/plugins_registry/gpu.amd.com-reg.sock", "x/dra.cpu-reg.sock"], "gpu_and_cpu"),
    (["x/dra.cpu-reg.sock"], "off"),
    (["x/dra.net-reg.sock", "x/gpu.nvidia.com-reg.sock"], "gpu"),
    (["x/gpu.nvidia.com.sock"], "off"),
])
def test_auto_follows_the_drivers_registered_with_the_kubelet(names, mode):
    assert dra_mode("auto", names) == mode
    assert dra_mode("gpu", names) == "gpu"


def test_a_bare_off_in_yaml_is_off_and_other_values_are_named():
    """YAML 1.1 (Ansible's inventories) reads an unquoted off as false."""
    assert dra_mode(False) == "off"
    for bad in (True, "on", "GPU", None, 0):
        with pytest.raises(GpunumaError) as caught:
            dra_mode(bad)
        assert str(caught.value).startswith("kubelet_topology_dra: %r is not allowed; allowed: off, gpu, gpu_and_cpu, auto"
                                            % (bad,))


# ---------------------------------------------------------------- memory checkpoint guard

def test_the_guard_follows_the_static_memory_manager_and_the_drift_gate():
    assert plan("strict").as_dict()["memory_checkpoint_guard"] is True
    assert plan("off").as_dict()["memory_checkpoint_guard"] is False
    with open(KUBEADM, encoding="utf-8") as handle:
        text = handle.read()
    gated = text.replace("kind: KubeletConfiguration", "kind: KubeletConfiguration\nfeatureGates:\n  MemoryManagerDriftTolerance: true")
    assert gated != text
    assert plan("strict", config=gated).as_dict()["memory_checkpoint_guard"] is False


def guard_args(**changes):
    args = dict(guard=True, enabled=True, script_text="print('x')\n", python="/usr/bin/python3",
                libexec_dir="/usr/local/libexec/gpunuma", unit_dir="/etc/systemd/system", service="kubelet.service",
                state_dir="/var/lib/kubelet", backup_dir="/var/lib/gpunuma/kubelet-backup", tolerance_mib=128)
    args.update(changes)
    return args


def test_guard_files_are_the_script_and_a_kubelet_drop_in():
    files = guard.guard_files(**guard_args())
    assert files["absent"] == []
    script, dropin = files["files"]
    assert script["path"] == "/usr/local/libexec/gpunuma/kubelet-memory-checkpoint" and script["mode"] == "0755"
    assert dropin["path"] == "/etc/systemd/system/kubelet.service.d/50-gpunuma-memory-checkpoint.conf"
    assert ('ExecStartPre=-"/usr/bin/python3" "/usr/local/libexec/gpunuma/kubelet-memory-checkpoint" --state-dir '
            '"/var/lib/kubelet" --backup-dir "/var/lib/gpunuma/kubelet-backup/stale" --tolerance 134217728') in dropin["content"]
    assert "unit" not in script and "unit" not in dropin, "nothing restarts for the guard itself"


@pytest.mark.parametrize("changes", [dict(guard=False), dict(enabled=False)])
def test_guard_off_removes_both_files(changes):
    files = guard.guard_files(**guard_args(**changes))
    assert files == {"files": [], "absent": ["/etc/systemd/system/kubelet.service.d/50-gpunuma-memory-checkpoint.conf",
                                             "/usr/local/libexec/gpunuma/kubelet-memory-checkpoint"]}


@pytest.mark.parametrize("changes, needle", [
    (dict(python="python3"), "kubelet_topology_python is 'python3'"),
    (dict(state_dir='/var/lib/"kubelet'), "kubelet_topology_state_dir"),
    (dict(libexec_dir="/opt/%n"), "kubelet_topology_libexec_dir"),
    (dict(service="kubelet"), "kubelet_topology_service is 'kubelet'"),
    (dict(tolerance_mib=-1), "kubelet_topology_memory_drift_tolerance_mib is -1"),
])
def test_guard_inputs_that_cannot_go_into_exec_start_pre_are_named(changes, needle):
    with pytest.raises(GpunumaError) as caught:
        guard.guard_files(**guard_args(**changes))
    assert needle in str(caught.value)
    # The plan step asks the same check (kubelet_topology_plan's guard_settings), with the same words.
    args = guard_args(**changes)
    problems = guard.input_problems(*(args[k] for k in ("python", "libexec_dir", "unit_dir", "service", "state_dir",
                                                        "backup_dir", "tolerance_mib")))
    assert problems == caught.value.problems and any(needle in p for p in problems)


def test_good_guard_inputs_have_no_problem():
    args = guard_args()
    assert guard.input_problems(*(args[k] for k in ("python", "libexec_dir", "unit_dir", "service", "state_dir",
                                                    "backup_dir", "tolerance_mib"))) == []


# ---------------------------------------------------------------- the DRA checkpoint

def dra_state(entries, legacy=False):
    if legacy:
        return json.dumps({"version": "v1", "entries": entries, "checksum": 1})
    data = {"kind": "DRACheckpoint", "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1", "Entries": entries}
    return json.dumps({"Data": json.dumps(data), "Checksum": 123})


CLAIM = {"ClaimUID": "067798be-454e-4be4-9047-1aa06aea63f7", "ClaimName": "example", "Namespace": "default",
         "PodUIDs": {"139cdb46-f989-4f17-9561-ca10cfb509a6": {}},
         "DriverState": {"gpu.nvidia.com": {"Devices": [{"PoolName": "worker-1", "DeviceName": "gpu-0"}]}}}


@pytest.mark.parametrize("legacy", [False, True])
def test_the_dra_checkpoint_is_read_and_reported(legacy):
    seen = dra_checkpoint(dra_state([CLAIM, dict(CLAIM, ClaimName="other")], legacy), "/var/lib/kubelet/dra_manager_state")
    assert seen == {"path": "/var/lib/kubelet/dra_manager_state", "claims": 2, "drivers": ["gpu.nvidia.com"],
                    "problem": None}
    assert dra_checkpoint(None, "x") is None
    findings = audit.kubelet_findings([], [], None, "strict", seen)
    assert [(f["id"], f["severity"]) for f in findings] == [("kubelet-dra-checkpoint", "info")]
    assert "2 prepared claim(s) of gpu.nvidia.com" in findings[0]["message"]


@pytest.mark.parametrize("text", ["{", json.dumps({"Data": "{not json", "Checksum": 1}),
                                  json.dumps({"Data": json.dumps({"Entries": {"a": 1}}), "Checksum": 1})])
def test_a_dra_checkpoint_the_kubelet_would_refuse_is_a_warning(text):
    seen = dra_checkpoint(text, "/var/lib/kubelet/dra_manager_state")
    assert seen["problem"] and "the kubelet refuses to start with it" in seen["problem"]
    result = plan(dra_state=text).as_dict()
    assert result["dra_checkpoint"]["problem"] in result["warnings"]
    assert not [p for p in result["remove_checkpoints"] if "dra" in p], "a DRA checkpoint is never planned away"
    findings = audit.kubelet_findings([], [], None, "strict", seen)
    assert [(f["id"], f["severity"]) for f in findings] == [("kubelet-dra-checkpoint", "warning")]


# ---------------------------------------------------------------- ResourceSlices

def severities(findings):
    return sorted((f["severity"], f["message"].split(" ")[0]) for f in findings)


def test_slices_that_agree_with_the_topology_give_no_finding():
    topo = topology("hgx-h200-8gpu-2socket-ht.json")
    assert resource_slices.resource_slice_findings(derived_slices(topo, "gpu-a01"), topo, "gpu-a01") == []
    listed = derived_slices(topo, "gpu-a01", numa=lambda g: {"ints": [g["numa_node"], 1 - g["numa_node"]]})
    assert resource_slices.resource_slice_findings(listed, topo, "gpu-a01") == []


def test_a_wrong_or_missing_numa_node_is_named_per_device():
    topo = topology("hgx-h200-8gpu-2socket-ht.json")
    wrong = derived_slices(topo, "gpu-a01", numa=lambda g: {"int": 0})
    findings = resource_slices.resource_slice_findings(wrong, topo, "gpu-a01")
    assert [f["severity"] for f in findings] == ["error"] * 4
    assert "gpu.nvidia.com/gpu-4 publishes numaNode 0, but gpunuma found the GPU on NUMA node 1" in findings[0]["message"]
    missing = derived_slices(topo, "gpu-a01", numa=lambda g: None)
    assert [f["severity"] for f in resource_slices.resource_slice_findings(missing, topo, "gpu-a01")] == ["warning"] * 8


def test_a_boolean_numa_node_is_no_node_one():
    """true equals 1 in Python: a GPU on node 1 publishing numaNode true would pass unseen."""
    topo = topology("hgx-h200-8gpu-2socket-ht.json")
    odd = derived_slices(topo, "gpu-a01", numa=lambda g: {"int": True})
    findings = resource_slices.resource_slice_findings(odd, topo, "gpu-a01")
    assert [f["severity"] for f in findings] == ["error"] * 8
    assert "publishes numaNode true, which is not a NUMA node number" in findings[-1]["message"]


def test_a_device_that_is_no_mapping_is_named_not_a_crash():
    topo = topology("hgx-h200-8gpu-2socket-ht.json")
    document = derived_slices(topo, "gpu-a01")
    document["items"][0]["spec"]["devices"].append("gpu-9")
    with pytest.raises(resource_slices.ResourceSliceError) as caught:
        resource_slices.resource_slice_findings(document, topo, "gpu-a01")
    assert "items[0].spec.devices[%d] is str, not a device mapping" % (
        len(document["items"][0]["spec"]["devices"]) - 1) in str(caught.value)


def test_gb200_publishing_the_gpu_memory_node_is_the_known_driver_fault():
    topo = topology("gb200-4gpu-34numa.json")
    slices = derived_slices(topo, "gb200-n1", numa=lambda g: {"int": g["gpu_numa_id"]})
    findings = resource_slices.resource_slice_findings(slices, topo, "gb200-n1")
    assert len(findings) == 4 and all(f["severity"] == "error" and "dra-driver-nvidia-gpu#1242" in f["message"]
                                      for f in findings)
    assert (findings[0]["expected"], findings[0]["actual"]) == (0, 2)


def test_the_published_gke_slice_on_its_own_node():
    document = load(os.path.join(SLICES, "nvidia-gke-a100.json"))
    node = "gke-gpu-a100-80gb-pool-c78060b4-cg6n"
    topo = {"gpus": [{"index": 0, "uuid": "GPU-e89d84ee-93b4-a63d-ac3f-8c242831ac09", "pci_bus_id": "0000:00:05.0",
                      "numa_node": None}]}
    # A VM whose GPU has no NUMA node: no numaNode is right; no pcieRoot problem.
    assert resource_slices.resource_slice_findings(document, topo, node) == []
    topo["gpus"][0]["numa_node"] = 0
    findings = resource_slices.resource_slice_findings(document, topo, node)
    assert [(f["severity"], f["device"]) for f in findings] == [("warning", "gpu.nvidia.com/gpu-0")]
    assert "publishes no numaNode" in findings[0]["message"]
    other = resource_slices.resource_slice_findings(document, topo, "gpu-a01")
    assert [f["severity"] for f in other] == ["info"] and "no ResourceSlice" in other[0]["message"]


def test_devices_gpunuma_did_not_find_and_gpus_no_slice_has():
    topo = topology("hgx-h200-8gpu-2socket-ht.json")
    slices = derived_slices(topo, "gpu-a01")
    devices = slices["items"][0]["spec"]["devices"]
    devices[0]["attributes"]["uuid"] = {"string": "GPU-00000000-0000-0000-0000-000000000000"}
    devices[0]["attributes"]["resource.kubernetes.io/pciBusID"] = {"string": "0000:ff:00.0"}
    del devices[1]
    findings = resource_slices.resource_slice_findings(slices, topo, "gpu-a01")
    assert severities(findings) == [("info", "GPU"), ("info", "GPU"), ("warning", "gpu.nvidia.com/gpu-0")]


def test_a_pcie_root_shared_across_numa_nodes_is_a_warning():
    topo = topology("hgx-h200-8gpu-2socket-ht.json")
    slices = derived_slices(topo, "gpu-a01")
    for device in slices["items"][0]["spec"]["devices"]:
        device["attributes"]["resource.kubernetes.io/pcieRoot"] = {"string": "pci0000:00"}
    findings = resource_slices.resource_slice_findings(slices, topo, "gpu-a01")
    assert [f["severity"] for f in findings] == ["warning"] and "NUMA nodes 0, 1" in findings[0]["message"]


def test_cpu_driver_slices_are_not_gpus():
    document = load(os.path.join(SLICES, "dra-cpu-individual.json"))
    findings = resource_slices.resource_slice_findings(document, topology("h200-1gpu-vm.json"), "dra-driver-cpu-worker")
    assert [f["severity"] for f in findings] == ["info"]


@pytest.mark.parametrize("document, needle", [
    ([], "not a JSON object"),
    ({"kind": "Pod"}, "kind 'Pod' without items"),
    ({"items": [{"spec": {}}]}, "items[0].spec.driver is missing"),
])
def test_a_document_that_is_not_resource_slices_is_named(document, needle):
    with pytest.raises(GpunumaError) as caught:
        resource_slices.resource_slice_findings(document, {}, "n")
    assert needle in str(caught.value)


@settings(max_examples=150, deadline=None)
@given(shift=st.lists(st.integers(0, 3), min_size=8, max_size=8), listed=st.booleans())
def test_every_device_whose_numa_node_differs_is_one_error(shift, listed):
    topo = topology("hgx-h200-8gpu-2socket-ht.json")

    def numa(gpu):
        node = gpu["numa_node"] + shift[gpu["index"]]
        return {"ints": [node]} if listed else {"int": node}

    findings = resource_slices.resource_slice_findings(derived_slices(topo, "n", numa=numa), topo, "n")
    assert len(findings) == sum(1 for s in shift if s) and all(f["severity"] == "error" for f in findings)
