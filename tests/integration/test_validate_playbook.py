"""h2d_probe_info and playbooks/validate.yml run through Ansible on localhost.

Hosts are local connections; one replays the probe recorded on a real H200,
others measure through the fake libcuda built from
tests/unit/test_h2d_fake_libcuda.c (not a GPU: it proves the wiring, the
error paths and the report; the H200 recording proves the numbers).
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from ansible_run import run_module, run_playbook
from conftest import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.ansible

RECORDED = os.path.join(FIXTURES, "recorded", "h200-probe", "run2", "h2d-probe.json")
QUICK = {"gpu_validate_large_bytes": 1048576, "gpu_validate_repeats": 2, "gpu_validate_small_repeats": 20,
         "gpu_validate_warmup": 1}


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory):
    if not shutil.which("gcc"):
        pytest.skip("gcc is needed to build the fake libcuda")
    out = tmp_path_factory.mktemp("fakecuda") / "libcuda.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(out),
                    os.path.join(REPO_ROOT, "tests", "unit", "test_h2d_fake_libcuda.c")], check=True)
    return str(out)


def inventory(tmp_path, hosts):
    inv = {"all": {"hosts": {}, "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}
    for name, hostvars in hosts.items():
        inv["all"]["hosts"][name] = hostvars
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    return str(path)


def test_module_probe_with_fake_driver(fake_libcuda, tmp_path):
    out = tmp_path / "probe.json"
    rc, result = run_module("h2d_probe_info", {"libcuda_path": fake_libcuda, "large_bytes": 1048576, "repeats": 2,
                                               "small_repeats": 20, "output": str(out)})
    assert rc == 0, result
    assert result["changed"] is False and result["probe"]["status"] == "ok"
    assert json.loads(out.read_text()) == result["probe"]
    assert oct(out.stat().st_mode & 0o777) == "0o644"


def test_module_check_mode_writes_nothing(fake_libcuda, tmp_path):
    out = tmp_path / "probe.json"
    rc, result = run_module("h2d_probe_info", {"libcuda_path": fake_libcuda, "large_bytes": 1048576, "repeats": 2,
                                               "small_repeats": 20, "placements": ["unbound"], "output": str(out)},
                            check=True)
    assert rc == 0 and result["probe"]["status"] == "ok" and not out.exists()


def test_module_no_driver_skips(tmp_path):
    rc, result = run_module("h2d_probe_info", {"libcuda_path": str(tmp_path / "nothing.so")})
    assert rc == 0 and result["probe"]["status"] == "skipped"
    assert "cannot load the CUDA driver library" in result["probe"]["reason"]


def test_module_bad_option_names_it():
    rc, result = run_module("h2d_probe_info", {"placements": ["local", "far"], "repeats": 0})
    assert rc != 0
    assert "placements has 'far'; allowed: local, remote, unbound" in result["msg"]
    assert "repeats is 0" in result["msg"]
    assert "Traceback" not in json.dumps(result)


def test_module_busy_gpu_named(fake_libcuda, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_CUDA_BUSY", "0")
    rc, result = run_module("h2d_probe_info", {"libcuda_path": fake_libcuda, "large_bytes": 1048576, "repeats": 2,
                                               "small_repeats": 20, "placements": ["unbound"]})
    assert rc == 0
    assert result["probe"]["gpus"][0]["status"] == "skipped"
    assert result["probe"]["gpus"][0]["reason"].startswith("GPU 0 (GPU-00010203-0405-0607-0809-0a0b0c0d0e0f, 0000:06:00.0) is busy")


def test_module_allocation_failure_fails_naming_gpu(fake_libcuda, monkeypatch):
    monkeypatch.setenv("FAKE_CUDA_OOM", "device")
    monkeypatch.setenv("FAKE_CUDA_DEVICES", "1")
    rc, result = run_module("h2d_probe_info", {"libcuda_path": fake_libcuda, "large_bytes": 1048576,
                                               "placements": ["unbound"]})
    assert rc != 0 and result["failed"]
    assert result["msg"].startswith("GPU 0 (GPU-00010203-0405-0607-0809-0a0b0c0d0e0f, 0000:06:00.0), placement unbound: "
                                    "cuMemAlloc allocating the device buffer of 1048576 bytes failed with CUDA_ERROR_OUT_OF_MEMORY")
    assert result["probe"]["status"] == "error"


def test_validate_fleet(fake_libcuda, tmp_path):
    reports = tmp_path / "reports"
    # The recorded node applied a preferred plan (a rollback pinned it): its report says so, whatever the inventory.
    applied = tmp_path / "node" / "plan.json"
    applied.parent.mkdir(parents=True)
    applied.write_text(json.dumps({"schema": "gpunuma.plan/v1", "profile": "preferred", "instances": []}))
    inv = inventory(tmp_path, {
        "h200-recorded": {"gpu_validate_probe_replay": RECORDED, "gpu_validate_plan_path": str(applied),
                          "gpunuma_profile": "strict"},
        "fake-gpu": dict(QUICK, gpu_validate_libcuda_path=fake_libcuda, gpu_validate_node_probe_path=str(tmp_path / "node" / "p.json")),
        "cpu-only": {"gpu_validate_libcuda_path": str(tmp_path / "missing.so"), "gpu_validate_node_probe_path": ""},
    })
    proc = run_playbook("playbooks/validate.yml", inv, {"gpu_validate_report_dir": str(reports)})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    recorded = json.loads((reports / "h200-recorded.json").read_text())
    assert recorded["schema"] == "gpunuma.validation/v1" and recorded["status"] == "passed"
    assert recorded["hostname"] == "h200-recorded" and recorded["profile"] == "preferred"
    assert recorded["gpus"][0]["placements"]["local"]["h2d_pinned_gbps"] == 55.446
    fake = json.loads((reports / "fake-gpu.json").read_text())
    assert fake["status"] == "passed" and len(fake["gpus"]) == 2
    assert json.loads((tmp_path / "node" / "p.json").read_text())["schema"] == "gpunuma.h2d-probe/v1"
    assert json.loads((reports / "cpu-only.json").read_text())["status"] == "skipped"
    # the fleet table: one header, one row per GPU, a row for the CPU-only host
    assert "host           gpu  node  link GB/s  local GB/s" in proc.stdout
    assert "h200-recorded  0    0     63.0       55.45" in proc.stdout
    assert "cpu-only" in proc.stdout and "cannot load the CUDA driver library" in proc.stdout


def test_validate_failing_control_fails_host_after_report(tmp_path):
    policy = yaml.safe_load(open(os.path.join(REPO_ROOT, "policies", "validation", "h2d.yml")))
    policy["controls"][0]["min_fraction"] = 0.95
    pfile = tmp_path / "strict.yml"
    pfile.write_text(yaml.safe_dump(policy))
    reports = tmp_path / "reports"
    inv = inventory(tmp_path, {"h200": {"gpu_validate_probe_replay": RECORDED}})
    proc = run_playbook("playbooks/validate.yml", inv, {"gpu_validate_report_dir": str(reports),
                                                        "gpu_validate_policy_file": str(pfile)})
    assert proc.returncode != 0
    assert "h200 failed validation: gpunuma-h2d-01" in proc.stdout
    assert json.loads((reports / "h200.json").read_text())["status"] == "failed"


def test_validate_bad_policy_names_field(tmp_path):
    pfile = tmp_path / "bad.yml"
    pfile.write_text("schema: gpunuma.validation-policy/v1\ncontrols:\n  - {id: x-1, title: t, check: pinned_link_fraction, min_fraction: 2}\n"
                     "verdict: {bandwidth_tolerance: 0.03, latency_tolerance: 0.1}\n")
    inv = inventory(tmp_path, {"h200": {"gpu_validate_probe_replay": RECORDED}})
    proc = run_playbook("playbooks/validate.yml", inv, {"gpu_validate_report_dir": str(tmp_path / "r"),
                                                        "gpu_validate_policy_file": str(pfile)})
    assert proc.returncode != 0
    assert "controls[0].min_fraction is 2; it must be a number from 0.0 to 1.0" in proc.stdout
    assert not (tmp_path / "r").exists()


def test_validate_bad_option_type_fails_before_probe(tmp_path):
    inv = inventory(tmp_path, {"h200": {"gpu_validate_probe_replay": RECORDED}})
    proc = run_playbook("playbooks/validate.yml", inv, {"gpu_validate_report_dir": str(tmp_path / "r"),
                                                        "gpu_validate_placements": ["near"]})
    assert proc.returncode != 0 and "gpu_validate_placements" in proc.stdout and "near" in proc.stdout


def test_validate_check_mode_writes_no_report(tmp_path):
    reports = tmp_path / "reports"
    inv = inventory(tmp_path, {"h200": {"gpu_validate_probe_replay": RECORDED}})
    proc = run_playbook("playbooks/validate.yml", inv, {"gpu_validate_report_dir": str(reports)}, check=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "no measurable difference" in proc.stdout  # the table is still printed
    assert not reports.exists()
