"""Source ordering and fallbacks of discover() on a 'live' node.

The live host is simulated by pointing sysfs reads of "/" at a recorded tree
and handing discover() a pynvml stand-in and an nvidia-smi runner.
"""

import os

import pytest

import sysfs_factory
from conftest import FIXTURES
from ansible.module_utils.gpunuma import sysfs
from ansible.module_utils.gpunuma.discover import discover
from ansible.module_utils.gpunuma.errors import SysfsError, TopoParseError
from test_nvml import fake_pynvml

pytestmark = pytest.mark.unit

H200_SYSFS = os.path.join(FIXTURES, "recorded", "h200-vm", "sysfs")
TOPO = os.path.join(FIXTURES, "recorded", "h200-vm", "nvidia-smi-topo-m.txt")
REAL_READ_HOST = sysfs.read_host


def live_root(monkeypatch, root):
    monkeypatch.setattr(sysfs, "read_host", lambda requested="/": REAL_READ_HOST(root if requested == "/" else requested))


def h200_nvml(**kwargs):
    return fake_pynvml([("00000000:00:06.0", "GPU-live", None, [0xFFFF])], **kwargs)


def smi_runner(text=None, problem=None):
    calls = []

    def run():
        calls.append(1)
        return text, problem

    run.calls = calls
    return run


def topo_text():
    with open(TOPO) as handle:
        return handle.read()


def test_nvml_is_used_first_and_nvidia_smi_is_not_run(monkeypatch):
    live_root(monkeypatch, H200_SYSFS)
    runner = smi_runner(topo_text())
    topo = discover("n", nvml_module=h200_nvml(), run_nvidia_smi=runner)["topology"]
    assert topo["sources"] == ["nvml", "sysfs"] and runner.calls == []
    assert topo["gpus"][0]["uuid"] == "GPU-live" and topo["complete"]


def test_nvml_failing_mid_query_falls_back_to_nvidia_smi_and_sysfs(monkeypatch):
    live_root(monkeypatch, H200_SYSFS)
    runner = smi_runner(topo_text())
    topo = discover("n", nvml_module=h200_nvml(fail_at=("nvmlDeviceGetPciInfo", 0)), run_nvidia_smi=runner)["topology"]
    assert topo["sources"] == ["nvidia_smi", "sysfs"] and runner.calls == [1]
    assert any("NVML failed during GPU 0 nvmlDeviceGetPciInfo" in w for w in topo["warnings"])
    # Placed from the other sources, but no longer named: not complete.
    assert topo["gpus"][0]["numa_node"] == 0 and topo["gpus"][0]["uuid"] is None
    assert topo["complete"] is False


def test_cpu_node_without_driver_is_sysfs_only_and_quiet(monkeypatch, tmp_path):
    live_root(monkeypatch, sysfs_factory.no_gpu(str(tmp_path)))

    class NoDriver(object):
        NVMLError = Exception

        @staticmethod
        def nvmlInit():
            raise Exception("Driver Not Loaded")

    result = discover("cpu", nvml_module=NoDriver, run_nvidia_smi=smi_runner(None, "nvidia-smi not found on PATH"))
    topo = result["topology"]
    assert topo["gpus"] == [] and topo["sources"] == ["sysfs"] and topo["complete"]
    assert not any("NVML" in w or "nvidia-smi" in w for w in topo["warnings"])


def test_sources_option_skips_nvml(monkeypatch):
    live_root(monkeypatch, H200_SYSFS)
    topo = discover("n", nvml_module=h200_nvml(), sources=["sysfs"])["topology"]
    assert topo["sources"] == ["sysfs"] and topo["gpus"][0]["uuid"] is None


def test_topo_file_alone_reads_nothing_local(monkeypatch):
    def forbidden(root="/"):
        raise AssertionError("sysfs must not be read when the topo text is given alone")

    monkeypatch.setattr(sysfs, "read_host", forbidden)
    topo = discover("t", topo_file=TOPO, nvml_module=h200_nvml())["topology"]
    assert topo["sources"] == ["nvidia_smi"]


def test_explicit_bad_inputs_raise(tmp_path):
    with pytest.raises(SysfsError):
        discover("x", sysfs_root=str(tmp_path / "missing"))
    with pytest.raises(TopoParseError) as err:
        discover("x", topo_file=str(tmp_path / "missing.txt"))
    assert "missing.txt" in str(err.value)
