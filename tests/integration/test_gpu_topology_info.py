"""gpu_topology_info run through Ansible, as users run it."""

import json
import os
import subprocess
import sys

import pytest

from ansible_run import BINDIR, ansible_env, run_module, run_playbook
from conftest import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.ansible

PUBLISHED = os.path.join(FIXTURES, "published")
RECORDED = os.path.join(FIXTURES, "recorded", "h200-vm")


@pytest.mark.parametrize("name", sorted(f[:-len(".topo.txt")] for f in os.listdir(PUBLISHED) if f.endswith(".topo.txt")))
def test_published_topo_text_alone(name):
    rc, result = run_module("gpu_topology_info", {"nvidia_smi_topo_file": os.path.join(PUBLISHED, name + ".topo.txt")})
    assert rc == 0, result
    with open(os.path.join(PUBLISHED, "expected", name + ".json")) as handle:
        expected = json.load(handle)
    topo = result["topology"]
    assert topo["sources"] == ["nvidia_smi"]
    assert result["changed"] is False
    assert [n["name"] for n in topo["nics"]] == expected["nics"]
    assert topo["gpu_links"] == expected["gpu_links"]
    assert topo["gpu_nic_links"] == expected["gpu_nic_links"]
    for gpu, want in zip(topo["gpus"], expected["gpus"]):
        assert gpu["cpu_affinity"] == want["cpu_affinity"]
        assert gpu["gpu_numa_id"] == want["gpu_numa_id"]
        if len(want["numa_affinity"]) == 1:
            assert gpu["numa_node"] == want["numa_affinity"][0]


def test_recorded_h200_replay_through_the_module():
    rc, result = run_module("gpu_topology_info", {"sysfs_root": os.path.join(RECORDED, "sysfs"),
                                                  "nvml_dump": os.path.join(RECORDED, "nvml-dump.json"),
                                                  "hostname": "h200-vm"})
    assert rc == 0, result
    with open(os.path.join(RECORDED, "topology.json")) as handle:
        live = json.load(handle)
    assert result["topology"]["fingerprint"] == live["fingerprint"]


def test_node_info_is_read_in_the_same_round_trip(tmp_path):
    """node_info: gpunuma_node_info's read after the discovery, returned as gpunuma_node; a bad option fails the
    task naming it, before anything is read."""
    marker = tmp_path / "plan.json"
    marker.write_text("{}\n")
    rc, result = run_module("gpu_topology_info", {
        "sysfs_root": os.path.join(RECORDED, "sysfs"), "nvml_dump": os.path.join(RECORDED, "nvml-dump.json"),
        "node_info": {"files": {"plan": str(marker)}, "paths": [str(marker), str(tmp_path / "absent")],
                      "commands": {"true": ["true"]}}})
    assert rc == 0, result
    node = result["gpunuma_node"]
    assert node["files"]["plan"]["exists"] and node["files"]["plan"]["content"] == "e30K"
    assert node["paths"] == {str(marker): True, str(tmp_path / "absent"): False}
    assert node["commands"]["true"]["rc"] == 0
    assert result["topology"]["gpus"]

    rc, result = run_module("gpu_topology_info", {"sysfs_root": os.path.join(RECORDED, "sysfs"),
                                                  "node_info": {"commands": {"x": "true"}}})
    assert rc != 0 and result["msg"] == "node_info.commands.x must be an argv (a list of words), got 'true'"
    rc, result = run_module("gpu_topology_info", {"node_info": {"pid": "/proc/1"}})
    assert rc != 0 and result["msg"].startswith("node_info: unsupported option pid")


def test_live_localhost_without_gpu():
    rc, result = run_module("gpu_topology_info")
    assert rc == 0, result
    topo = result["topology"]
    assert "sysfs" in topo["sources"]
    assert topo["numa_nodes"] and all(n["cpus"] for n in topo["numa_nodes"] if n["has_cpus"])


@pytest.mark.parametrize(
    "content, needle",
    [
        ("", "empty"),
        ("GPU0 GPU1\nthis is not a topology\n", "GPU"),
        ("hello world\n", "nvidia_smi_topo_file"),
        # truncated: the header names 4 GPUs, only 2 rows follow
        ("\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\nGPU0\t X \tNV4\tNV4\tNV4\t0-7\nGPU1\tNV4\t X \tNV4\tNV4\t0-7\n", "GPU2"),
        # a row whose cells disagree with its header
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\tNV4\tNV4\t0-7\nGPU1\tNV4\t X \t0-7\n", "GPU0"),
    ],
    ids=["empty", "garbage", "no-header", "truncated", "row-disagrees"],
)
def test_bad_topo_files_fail_cleanly(tmp_path, content, needle):
    path = tmp_path / "topo.txt"
    path.write_text(content)
    rc, result = run_module("gpu_topology_info", {"nvidia_smi_topo_file": str(path)})
    assert rc != 0 and result.get("failed") is True
    assert "Traceback" not in result.get("msg", "") and "module_stderr" not in result
    assert str(path) in result["msg"] and needle in result["msg"]


def test_missing_sysfs_root_fails_naming_it(tmp_path):
    missing = str(tmp_path / "nope")
    rc, result = run_module("gpu_topology_info", {"sysfs_root": missing})
    assert rc != 0 and missing in result["msg"] and "sysfs_root" in result["msg"]


def test_unreadable_sysfs_file_fails_naming_it(tmp_path):
    root = tmp_path / "root"
    node = root / "sys" / "devices" / "system" / "node" / "node0"
    node.mkdir(parents=True)
    (node / "cpulist").write_text("0-3,banana\n")
    rc, result = run_module("gpu_topology_info", {"sysfs_root": str(root)})
    assert rc != 0 and "node0/cpulist" in result["msg"] and "module_stderr" not in result


def test_bad_nvml_dump_fails_naming_it(tmp_path):
    dump = tmp_path / "dump.json"
    dump.write_text(json.dumps({"schema": "gpunuma.nvml-dump/v1", "gpus": [{"index": 0, "uuid": "GPU-x"}]}))
    rc, result = run_module("gpu_topology_info", {"sysfs_root": os.path.join(RECORDED, "sysfs"),
                                                  "nvml_dump": str(dump)})
    assert rc != 0 and str(dump) in result["msg"] and "pci_bus_id" in result["msg"]


def test_record_nvml_dump_without_nvml_fails_and_writes_nothing(tmp_path):
    dest = tmp_path / "dump.json"
    rc, result = run_module("gpu_topology_info", {"record_nvml_dump": str(dest)})
    assert rc != 0 and "record_nvml_dump" in result["msg"] and "NVML" in result["msg"]
    assert not dest.exists()


def test_ansible_doc_renders():
    proc = subprocess.run([os.path.join(BINDIR, "ansible-doc"), "-M", "library", "gpu_topology_info"],
                          cwd=REPO_ROOT, capture_output=True, text=True, env=ansible_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    for option in ("sysfs_root", "nvidia_smi_topo_file", "nvml_dump", "record_nvml_dump", "sources"):
        assert option in proc.stdout


# --- the discover playbook: persistence, fingerprints, idempotence


def inventory(tmp_path, topo_file):
    inv = tmp_path / "inv.yml"
    inv.write_text(json.dumps({"all": {"hosts": {"node-a": {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "gpu_topology_nvidia_smi_topo_file": str(topo_file),
        "gpu_topology_node_path": str(tmp_path / "node" / "topology.json"),
        "gpu_topology_controller_dir": str(tmp_path / "controller"),
    }}}}))
    return str(inv)


def recap(stdout, host="node-a"):
    line = [l for l in stdout.splitlines() if l.startswith(host) and "ok=" in l][-1]
    return dict(part.split("=") for part in line.split(":", 1)[1].split())


def test_discover_persists_then_is_idempotent_then_keeps_old_on_change(tmp_path):
    topo = tmp_path / "topo.txt"
    topo.write_text(open(os.path.join(PUBLISHED, "hgx-h200-8gpu-10nic-tabs.topo.txt")).read())
    inv = inventory(tmp_path, topo)
    node_file = tmp_path / "node" / "topology.json"
    ctl_file = tmp_path / "controller" / "node-a.json"

    first = run_playbook("playbooks/discover.yml", inv)
    assert first.returncode == 0, first.stdout[-3000:]
    assert "FINGERPRINT" in first.stdout and "node-a" in first.stdout
    original = json.loads(node_file.read_text())
    assert original["schema"] == "gpunuma.topology/v1" and len(original["gpus"]) == 8
    assert json.loads(ctl_file.read_text())["fingerprint"] == original["fingerprint"]

    check = run_playbook("playbooks/discover.yml", inv, check=True)
    second = run_playbook("playbooks/discover.yml", inv)
    assert recap(check.stdout)["changed"] == "0" and recap(second.stdout)["changed"] == "0", second.stdout[-3000:]

    # The hardware changes: the GB200 text now answers for this node.
    topo.write_text(open(os.path.join(PUBLISHED, "gb200-4gpu-gpunumaid.topo.txt")).read())
    changed = run_playbook("playbooks/discover.yml", inv)
    assert changed.returncode == 0
    assert "HARDWARE FINGERPRINT CHANGED" in changed.stdout and "CHANGED" in changed.stdout
    assert json.loads(node_file.read_text())["fingerprint"] == original["fingerprint"]
    assert json.loads(ctl_file.read_text())["fingerprint"] == original["fingerprint"]
    pending = json.loads((tmp_path / "controller" / "node-a.pending.json").read_text())
    assert len(pending["gpus"]) == 4

    strict = run_playbook("playbooks/discover.yml", inv, extra_vars={"gpu_topology_fail_on_change": True})
    assert strict.returncode != 0 and "hardware fingerprint changed" in strict.stdout

    accepted = run_playbook("playbooks/discover.yml", inv, extra_vars={"gpu_topology_accept_changes": True})
    assert accepted.returncode == 0, accepted.stdout[-3000:]
    assert json.loads(node_file.read_text())["fingerprint"] == pending["fingerprint"]
    backups = [p for p in os.listdir(node_file.parent) if p.startswith("topology.json.") and p != "topology.json"]
    assert backups, "the replaced inventory must be backed up"


# --- hostile inputs through the module: a named failure or an incomplete result, quickly


def test_fifo_and_dev_zero_in_sysfs_degrade_to_warnings_quickly(tmp_path):
    import time

    import sysfs_factory

    root = sysfs_factory.small_two_node(str(tmp_path / "root"))
    gpu = os.path.join(root, "sys/bus/pci/devices/0000:18:00.0")
    sysfs_factory.apply_damage(root, {"op": "fifo", "path": "sys/bus/pci/devices/0000:18:00.0/class"})
    sysfs_factory.apply_damage(root, {"op": "symlink", "path": "sys/bus/pci/devices/0000:19:00.0/local_cpulist",
                                      "target": "/dev/zero"})
    start = time.monotonic()
    rc, result = run_module("gpu_topology_info", {"sysfs_root": root})
    assert time.monotonic() - start < 60
    assert rc == 0, result
    topo = result["topology"]
    assert topo["complete"] is False and topo["gpus"] == []
    assert any(gpu + "/class" in w and "FIFO" in w for w in topo["warnings"])
    assert any("/dev/zero" in w for w in topo["warnings"])


def test_fifo_node_cpulist_fails_naming_it(tmp_path):
    import sysfs_factory

    root = sysfs_factory.small_two_node(str(tmp_path / "root"))
    path = sysfs_factory.apply_damage(root, {"op": "fifo", "path": "sys/devices/system/node/node0/cpulist"})
    rc, result = run_module("gpu_topology_info", {"sysfs_root": root})
    assert rc != 0 and "module_stderr" not in result
    assert result["msg"] == "cannot read %s: it is a FIFO (named pipe); a sysfs or procfs attribute is read only " \
                            "as a regular file" % path


def test_nvml_dump_schema_errors_name_each_field(tmp_path):
    with open(os.path.join(FIXTURES, "hostile", "nvml", "several-problems.json")) as handle:
        content = handle.read()
    dump = tmp_path / "dump.json"
    dump.write_text(content)
    rc, result = run_module("gpu_topology_info", {"sysfs_root": os.path.join(RECORDED, "sysfs"),
                                                  "nvml_dump": str(dump)})
    assert rc != 0 and "module_stderr" not in result and "Traceback" not in result["msg"]
    assert result["msg"].startswith("nvml_dump %s: 3 problems: " % dump)
    for needle in ("cpu_word_bits is -1; allowed: 32 or 64", "gpus[0].pci_bus_id is 'zzzz:18:00.0'",
                   "gpus[1].uuid is 'GPU\\n'"):
        assert needle in result["msg"]
