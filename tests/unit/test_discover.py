"""Source ordering and fallbacks of discover() on a 'live' node.

The live host is simulated by pointing sysfs reads of "/" at a recorded tree
and handing discover() a pynvml stand-in and an nvidia-smi runner.
"""

import json
import os

import pytest

import sysfs_factory
from conftest import FIXTURES
from ansible.module_utils.gpunuma.discovery.sysfs import host as sysfs
from ansible.module_utils.gpunuma.discovery.discover import discover
from ansible.module_utils.gpunuma.common.errors import NvmlError, SysfsError, TopoParseError
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


# -- completeness: true only when nothing was lost ---------------------------------


def test_a_gpu_lost_to_binary_bytes_in_class_makes_the_topology_incomplete(tmp_path):
    root = sysfs_factory.small_two_node(str(tmp_path))
    path = os.path.join(root, "sys/bus/pci/devices/0000:18:00.0/class")
    with open(path, "wb") as handle:
        handle.write(b"\x00\xff\x7f\n")
    topo = discover("n", sysfs_root=root)["topology"]
    assert topo["gpus"] == [] and topo["complete"] is False
    assert any(path in w and "not a 0x-prefixed hex number" in w for w in topo["warnings"])
    assert topo["warnings"][-1].startswith("topology incomplete: 1 sysfs path(s)") and path in topo["warnings"][-1]


def test_a_symlink_loop_in_bus_pci_devices_makes_the_topology_incomplete(tmp_path):
    root = sysfs_factory.small_two_node(str(tmp_path))
    devices = os.path.join(root, "sys/bus/pci/devices")
    sysfs_factory.apply_damage(root, {"op": "symlink", "path": "sys/bus/pci/devices", "target": "devices"})
    topo = discover("n", sysfs_root=root)["topology"]
    assert topo["gpus"] == [] and topo["nics"] == [] and topo["complete"] is False
    assert any(devices in w and "symbolic links" in w for w in topo["warnings"])


def test_an_unreadable_gpu_numa_node_makes_the_topology_incomplete_even_if_placed(tmp_path):
    root = sysfs_factory.small_two_node(str(tmp_path))
    sysfs_factory.apply_damage(root, {"op": "fifo", "path": "sys/bus/pci/devices/0000:18:00.0/numa_node"})
    topo = discover("n", sysfs_root=root)["topology"]
    # Still placed, from its local_cpulist; but a value was lost.
    assert topo["gpus"][0]["numa_node"] == 1 and topo["gpus"][0]["numa_node_source"] == "cpu_affinity"
    assert topo["complete"] is False


def test_numa_node_minus_one_in_a_vm_is_not_a_loss(tmp_path):
    topo = discover("vm", sysfs_root=sysfs_factory.vm_numa_minus_one(str(tmp_path)))["topology"]
    assert topo["complete"] is True and topo["gpus"][0]["numa_node"] == 0


def test_a_bad_nvml_dump_fails_naming_the_field(tmp_path):
    dump = nvml_dump_two(tmp_path, lambda d: d["gpus"][0].update(numa_node_id="zero"))
    with pytest.raises(NvmlError) as err:
        discover("n", sysfs_root=sysfs_factory.small_two_node(str(tmp_path / "root")), nvml_dump=dump)
    assert str(err.value) == ("nvml_dump %s: gpus[0].numa_node_id is 'zero'; allowed: an integer from -1 (none) "
                              "to 1023 (Linux MAX_NUMNODES is at most 1024), null or {\"nvml_error\": \"<name>\"}"
                              % dump)


def test_a_topo_file_that_is_a_fifo_fails_at_once_naming_it(tmp_path):
    fifo = str(tmp_path / "topo.txt")
    os.mkfifo(fifo)
    with pytest.raises(TopoParseError, match="nvidia_smi_topo_file %s cannot be read: it is a FIFO" % fifo):
        discover("x", topo_file=fifo)


def nvml_dump_two(tmp_path, mutate):
    with open(os.path.join(FIXTURES, "hostile", "nvml", "valid.json")) as handle:
        dump = json.load(handle)
    mutate(dump)
    path = str(tmp_path / "dump.json")
    with open(path, "w") as handle:
        json.dump(dump, handle)
    return path


def test_live_nvml_answering_garbage_falls_back_with_a_warning(monkeypatch):
    live_root(monkeypatch, H200_SYSFS)
    from test_nvml import fake_pynvml

    bad = fake_pynvml([("00000000:00:06.0", "GPU-live\n", None, [0xFFFF])])
    topo = discover("n", nvml_module=bad, run_nvidia_smi=smi_runner(topo_text()))["topology"]
    assert "nvml" not in topo["sources"] and topo["complete"] is False
    assert any("live NVML: gpus[0].uuid is 'GPU-live\\n'" in w for w in topo["warnings"])
