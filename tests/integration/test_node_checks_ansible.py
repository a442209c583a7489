"""node_checks through Ansible: the module on localhost, the role (default read-only, opt-in fixes, check mode)."""

import hashlib
import json
import os
import re
import stat
import sys

import pytest
import yaml

from ansible_run import run_module, run_playbook
from conftest import FIXTURES, REPO_ROOT
from sysfs_factory import NVIDIA, build_tree, node_platform

pytestmark = pytest.mark.ansible

GPU = "0000:18:00.0"
RECORDED = os.path.join(FIXTURES, "recorded", "h200-vm")
SMI_Q = os.path.join(FIXTURES, "node_checks", "nvidia-smi-q-h200.txt")


def make_tree(root, governors):
    nodes = [{"id": 0, "cpus": "0-3", "mem_kb": 1024, "free_kb": 512},
             {"id": 1, "cpus": "4-7", "mem_kb": 1024, "free_kb": 512}]
    pci = [{"bdf": GPU, "vendor": NVIDIA, "device": "0x2330", "class": "0x030200", "numa_node": 1,
            "parents": ["0000:17:00.0"], "max_link_speed": "32.0 GT/s PCIe", "max_link_width": 16,
            "current_link_speed": "32.0 GT/s PCIe", "current_link_width": 8}]
    build_tree(str(root), nodes, pci=pci, numa_balancing=1)
    node_platform(str(root), governors=governors)
    return str(root)


def tree_digest(root):
    digest = hashlib.sha256()
    for base, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(base, name)
            mode = os.lstat(path).st_mode
            digest.update(path.encode())
            if stat.S_ISREG(mode):
                with open(path, "rb") as handle:
                    digest.update(handle.read())
    return digest.hexdigest()


def test_module_reports_and_changes_nothing(tmp_path):
    root = make_tree(tmp_path / "t", {cpu: "powersave" for cpu in range(8)})
    before = tree_digest(root)
    for check in (False, True):
        rc, result = run_module("node_checks_info", {"sysfs_root": root, "profile": "strict"}, check=check)
        assert rc == 0, result
        assert result["changed"] is False
        checks = {(f["check"], f["severity"]) for f in result["node_checks"]["findings"]}
        assert ("pcie_link", "warning") in checks  # x8 of x16
        assert ("cpu_governor", "warning") in checks
        assert ("numa_balancing", "warning") in checks
        assert result["node_checks"]["gpus"] == [GPU]
        assert result["node_checks"]["summary"]["worst"] == "warning"
        assert result["node_checks"]["planned_fixes"] == []
    assert tree_digest(root) == before


def test_module_replays_the_recorded_h200(tmp_path):
    rc, result = run_module("node_checks_info", {
        "sysfs_root": os.path.join(RECORDED, "sysfs"), "nvml_dump": os.path.join(RECORDED, "nvml-dump.json"),
        "nvidia_smi_q_file": SMI_Q, "fix_persistence": True})
    assert rc == 0, result
    assert result["node_checks"]["sources"] == ["sysfs", "nvml_dump", "nvidia_smi_q_file"]
    assert [f["check"] for f in result["node_checks"]["findings"] if f["severity"] == "warning"] == ["persistence_mode"]
    assert result["node_checks"]["planned_fixes"][0]["target"] == "0000:00:06.0"


@pytest.mark.parametrize("args,expected", [
    ({"sysfs_root": "/nonexistent/bundle"}, "sysfs_root /nonexistent/bundle does not exist or is not a directory"),
    ({"sysfs_root": os.path.join(RECORDED, "sysfs"), "profile": "strickt"},
     "value of profile must be one of: strict, preferred, interleave, off, got: strickt"),
    ({"sysfs_root": os.path.join(RECORDED, "sysfs"), "nvidia_smi_q_file": os.path.join(RECORDED, "bench.txt")},
     "no 'GPU 0000:18:00.0' section found"),
    ({"sysfs_root": os.path.join(RECORDED, "sysfs"), "nvml_dump": SMI_Q}, "is not valid JSON"),
])
def test_module_bad_input_is_a_clear_error(args, expected):
    rc, result = run_module("node_checks_info", args)
    assert rc != 0 and result.get("failed")
    assert expected in result["msg"]
    assert "Traceback" not in result.get("module_stderr", "")


def _role(tmp_path, check=False, diff=False, **role_vars):
    playbook = tmp_path / "node-checks.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "roles": ["node_checks"]}]))
    extra = ["-c", "local", "-e", "ansible_python_interpreter=" + sys.executable]
    if diff:
        extra.append("--diff")
    return run_playbook(str(playbook), "localhost,", extra_vars=role_vars, check=check, extra=extra)


def test_role_changes_nothing_by_default_and_fixes_only_when_asked(tmp_path):
    root = make_tree(tmp_path / "t", {cpu: "powersave" for cpu in range(8)})
    governor = lambda cpu: open(os.path.join(root, "sys/devices/system/cpu/cpu%d/cpufreq/scaling_governor" % cpu)).read()
    before = tree_digest(root)

    default = _role(tmp_path, node_checks_sysfs_root=root, node_checks_profile="strict")
    assert default.returncode == 0, default.stdout[-3000:]
    assert "changed=0" in default.stdout
    assert "warning | gpu 0000:18:00.0 | pcie_link: PCIe link width x8 is below the x16" in default.stdout
    assert tree_digest(root) == before

    # Check mode is honest: it says what would change and writes nothing.
    dry = _role(tmp_path, check=True, diff=True, node_checks_sysfs_root=root, node_checks_fix_governor=True)
    assert dry.returncode == 0, dry.stdout[-3000:]
    assert "changed=1" in dry.stdout
    assert "cpu4/cpufreq/scaling_governor: powersave" in dry.stdout
    assert "cpu7/cpufreq/scaling_governor: performance" in dry.stdout
    assert "cpu0/cpufreq/scaling_governor" not in dry.stdout  # CPU 0 is not on the GPU's node
    assert tree_digest(root) == before

    real = _role(tmp_path, node_checks_sysfs_root=root, node_checks_fix_governor=True)
    assert real.returncode == 0, real.stdout[-3000:]
    assert "changed=1" in real.stdout
    assert [governor(cpu) for cpu in range(8)] == ["powersave\n"] * 4 + ["performance\n"] * 4

    again = _role(tmp_path, node_checks_sysfs_root=root, node_checks_fix_governor=True)
    assert again.returncode == 0 and "changed=0" in again.stdout


def test_role_persistence_fix_runs_nvidia_smi_only_when_asked(tmp_path):
    log = tmp_path / "nvidia-smi.log"
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho \"$@\" >> %s\n" % log)
    fake.chmod(0o755)
    common = dict(node_checks_sysfs_root=os.path.join(RECORDED, "sysfs"), node_checks_nvidia_smi_q_file=SMI_Q,
                  node_checks_nvidia_smi_path=str(fake))
    assert _role(tmp_path, **common).returncode == 0
    dry = _role(tmp_path, check=True, diff=True, node_checks_fix_persistence=True, **common)
    assert dry.returncode == 0 and "changed=1" in dry.stdout
    assert "gpu 0000:00:06.0 persistence mode: Enabled" in dry.stdout
    assert not log.exists()
    real = _role(tmp_path, node_checks_fix_persistence=True, **common)
    assert real.returncode == 0, real.stdout[-3000:]
    assert log.read_text() == "-i 0000:00:06.0 -pm 1\n"


def test_role_fail_on_warning(tmp_path):
    root = make_tree(tmp_path / "t", {cpu: "performance" for cpu in range(8)})
    proc = _role(tmp_path, node_checks_sysfs_root=root, node_checks_fail_on="warning")
    assert proc.returncode != 0
    assert "PCIe link width x8 is below the x16" in proc.stdout


def test_role_rejects_a_bad_variable_before_any_task(tmp_path):
    proc = _role(tmp_path, node_checks_profile="strickt")
    assert proc.returncode != 0
    assert "node_checks_profile must be one of" in proc.stdout
    assert "Check the node platform settings" not in proc.stdout


def test_fix_module_refuses_targets_outside_scaling_governor(tmp_path):
    rc, result = run_module("node_checks_fix", {"fixes": [
        {"kind": "governor", "target": "/etc/passwd"},
        {"kind": "governor", "target": "/sys/devices/system/cpu/cpu0/../../../../etc/cpufreq/scaling_governor"},
        {"kind": "persistence", "target": "0; reboot"}, {"kind": "thp", "target": "x"}]})
    assert rc != 0
    for part in ("fixes[0].target is '/etc/passwd'", "fixes[1].target", "fixes[2].target is '0; reboot'",
                 "fixes[3].kind is 'thp'; allowed: governor, persistence"):
        assert part in result["msg"]


def test_playbook_is_the_role():
    with open(os.path.join(REPO_ROOT, "playbooks", "node-checks.yml")) as handle:
        plays = yaml.safe_load(handle)
    assert plays[0]["roles"] == [{"role": "node_checks"}]


def test_every_role_variable_is_specified_defaulted_and_documented():
    role = os.path.join(REPO_ROOT, "roles", "node_checks")
    with open(os.path.join(role, "meta", "argument_specs.yml")) as handle:
        spec = set(yaml.safe_load(handle)["argument_specs"]["main"]["options"])
    with open(os.path.join(role, "defaults", "main.yml")) as handle:
        defaults = set(yaml.safe_load(handle))
    with open(os.path.join(REPO_ROOT, "docs", "node-checks.md")) as handle:
        docs = set(re.findall(r"`(node_checks_[a-z_]+)`", handle.read())) - {"node_checks_info", "node_checks_fix",
                                                                            "node_checks_result"}
    assert spec == defaults == docs


@pytest.mark.parametrize("applied,variables,expected", [
    (None, {"node_checks_profile": False}, "kernel.numa_balancing=1 with profile off"),
    # The node's applied plan says what it is on (a rollback's pin included), whatever the inventory says.
    ("strict", {"gpunuma_profile": "off"}, "profile strict binds workers"),
    ("off", {"gpunuma_profile": "strict"}, "kernel.numa_balancing=1 with profile off"),
    (None, {"gpunuma_profile": "strict"}, "kernel.numa_balancing=1 with profile none"),
    # An explicit node_checks_profile is what the user asked to judge by.
    ("off", {"node_checks_profile": "strict"}, "profile strict binds workers"),
])
def test_role_judges_by_the_applied_profile_and_reads_unquoted_off(tmp_path, applied, variables, expected):
    root = make_tree(tmp_path / "t", {cpu: "performance" for cpu in range(8)})
    if applied is not None:
        os.makedirs(os.path.join(root, "etc", "gpunuma"), exist_ok=True)
        with open(os.path.join(root, "etc", "gpunuma", "plan.json"), "w", encoding="utf-8") as handle:
            json.dump({"schema": "gpunuma.plan/v1", "profile": applied, "instances": []}, handle)
    proc = _role(tmp_path, node_checks_sysfs_root=root, **variables)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert expected in proc.stdout
