"""The H2D probe through HIP (verify/h2d/hip.py) against a fake libamdhip64 built here with gcc
(tests/unit/test_h2d_fake_libhip.c, the fake libcuda under HIP's names and signatures).

No AMD GPU has been available: these prove that the probe's measurement, placements, binding
checks, statistics and error paths run unchanged through HIP; the real-hardware figure is missing.
"""

import os
import shutil
import subprocess
import time

import pytest

from ansible.module_utils.gpunuma.verify.h2d import probe as h2d
from ansible.module_utils.gpunuma.verify.h2d import cuda as h2d_cuda
from ansible.module_utils.gpunuma.verify.h2d import host as h2d_host
from ansible.module_utils.gpunuma.verify.h2d import measure as h2d_measure
from ansible.module_utils.gpunuma.verify.h2d import options as h2d_options
from ansible.module_utils.gpunuma.verify.h2d import hip as h2d_hip
from ansible.module_utils.gpunuma.verify.h2d import load as h2d_load
from test_h2d_probe import FAKE_ENV, SMALL, one_node_root

pytestmark = pytest.mark.unit

HERE = os.path.dirname(os.path.abspath(__file__))
NO_CUDA = "/nonexistent/libcuda.so.1"


@pytest.fixture(scope="session")
def fake_libhip(tmp_path_factory):
    if not shutil.which("gcc"):
        pytest.fail("gcc is needed to build the fake libamdhip64 (scripts/setup-host.sh installs it)")
    out = tmp_path_factory.mktemp("fakehip") / "libamdhip64.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-I", HERE, "-o", str(out),
                    os.path.join(HERE, "test_h2d_fake_libhip.c")], check=True)
    return str(out)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in FAKE_ENV:
        monkeypatch.delenv(name, raising=False)


def hip_opts(lib, **extra):
    out = dict(SMALL, libcuda_path=NO_CUDA, libhip_path=lib, runtime="hip")
    out.update(extra)
    return out


def test_probe_measures_amd_gpus_through_hip(fake_libhip, tmp_path):
    report = h2d.probe(hip_opts(fake_libhip, placements=["local", "unbound"]), root=one_node_root(tmp_path))
    assert report["status"] == "ok" and report["runtime"] == "hip", report["reason"]
    assert report["driver_version"] == "hip 60443484"
    assert [(g["index"], g["uuid"], g["pci_bus_id"], g["name"]) for g in report["gpus"]] == [
        (0, "GPU-5b4ac59a0da2a6a0", "0000:06:00.0", "Fake MI300X 0"),
        (1, "GPU-5b4ac59a0da2a6a1", "0000:07:00.0", "Fake MI300X 1")]
    gpu = report["gpus"][1]  # numa_node 0 in the tree
    local = gpu["placements"]["local"]
    assert local["status"] == "ok" and local["binding"]["cpus_verified"] and local["binding"]["mem_verified"]
    # the fake copies at 50 GB/s with 5 us a copy: the events HIP returns give those figures back
    assert 40 < local["measurement"]["h2d_pinned"]["gbps_median"] <= 50
    assert len(local["rounds"]) == SMALL.get("rounds", h2d_options.DEFAULTS["rounds"])


def test_auto_takes_hip_where_libcuda_is_missing(fake_libhip, tmp_path):
    report = h2d.probe(hip_opts(fake_libhip, runtime="auto", placements=["unbound"]), root=one_node_root(tmp_path))
    assert report["runtime"] == "hip" and report["status"] == "ok"


def test_no_runtime_at_all_is_a_skip_naming_both_libraries(tmp_path):
    report = h2d.probe(hip_opts("/nonexistent/libamdhip64.so", runtime="auto"), root=one_node_root(tmp_path))
    assert report["status"] == "skipped"
    assert "CUDA driver library '/nonexistent/libcuda.so.1'" in report["reason"]
    assert "HIP runtime library '/nonexistent/libamdhip64.so'" in report["reason"]


def test_no_amd_gpu_is_a_clear_skip(fake_libhip, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_CUDA_DEVICES", "0")
    report = h2d.probe(hip_opts(fake_libhip), root=one_node_root(tmp_path))
    assert report["status"] == "skipped" and "no AMD GPU on this node (the HIP runtime reports none)" in report["reason"]


@pytest.mark.parametrize("kind, call", [("device", "hipMalloc"), ("host_register", "hipHostRegister")])
def test_allocation_failure_names_the_hip_call(fake_libhip, tmp_path, monkeypatch, kind, call):
    monkeypatch.setenv("FAKE_CUDA_OOM", kind)
    report = h2d.probe(hip_opts(fake_libhip, placements=["unbound"]), root=one_node_root(tmp_path))
    assert report["status"] == "error"
    assert "%s allocating the" % call in report["reason"] and "hipErrorOutOfMemory (2): out of memory" in report["reason"]


@pytest.mark.parametrize("kind", ["device", "host_alloc", ""])
def test_nothing_left_allocated_through_hip(fake_libhip, monkeypatch, kind):
    monkeypatch.setenv("FAKE_CUDA_OOM", kind)
    hip = h2d_hip.HipRuntime(fake_libhip)
    hip.init()
    alloc = "host_alloc" if kind == "host_alloc" else "register"
    o = h2d_options.check_options(hip_opts(fake_libhip, pinned_alloc=alloc))
    if kind:
        with pytest.raises(h2d_cuda.CudaError, match="hipErrorOutOfMemory"):
            h2d_measure.measure_device(hip, 0, o)
    else:
        h2d_measure.measure_device(hip, 0, o)
    assert hip.lib.fake_outstanding() == 0


def test_copies_load_runs_through_hip(fake_libhip, tmp_path):
    library = {"runtime": "hip", "libcuda_path": NO_CUDA, "libhip_path": fake_libhip}
    with h2d_load.Load("copies", [0], library, max_seconds=5) as load:
        time.sleep(0.2)
    described = load.describe()
    assert [s["kind"] for s in described["stressors"]] == ["copies"]
    assert "error" not in described["stressors"][0] and described["stressors"][0]["gbps"] > 0, described


def test_runtime_option_is_checked():
    with pytest.raises(h2d_host.ProbeError, match="runtime is 'rocm'; allowed: auto, cuda, hip"):
        h2d_options.check_options({"runtime": "rocm"})
    with pytest.raises(h2d_host.ProbeError, match="libhip_path is ''"):
        h2d_options.check_options({"libhip_path": ""})
