"""H2D probe core against a fake libcuda built here with gcc (tests/unit/test_h2d_fake_libcuda.c).

The fake proves the error paths, the statistics and the placement/binding
logic; the real measurement is the recorded H200 run
(tests/fixtures/recorded/h200-probe/), replayed by the report tests.
"""

import ctypes
import os
import shutil
import subprocess

import pytest

from ansible.module_utils.gpunuma.verify.h2d import probe as h2d
from ansible.module_utils.gpunuma.common import cpulist
from ansible.module_utils.gpunuma.verify.h2d import cuda as h2d_cuda
from ansible.module_utils.gpunuma.verify.h2d import host as h2d_host
from ansible.module_utils.gpunuma.verify.h2d import measure as h2d_measure
from ansible.module_utils.gpunuma.verify.h2d import options as h2d_options
from ansible.module_utils.gpunuma.verify.h2d import rounds as h2d_rounds
from ansible.module_utils.gpunuma.verify.h2d import report as h2d_report

pytestmark = pytest.mark.unit

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_ENV = ("FAKE_CUDA_DEVICES", "FAKE_CUDA_INIT_ERROR", "FAKE_CUDA_BUSY", "FAKE_CUDA_OOM", "FAKE_CUDA_HANG",
            "FAKE_CUDA_PROHIBITED", "FAKE_CUDA_GBPS", "FAKE_CUDA_LAT_US", "FAKE_CUDA_SPIN_US")
SMALL = {"large_bytes": 1 << 20, "repeats": 3, "small_repeats": 50, "warmup": 1, "timeout_s": 30}


@pytest.fixture(scope="session")
def fake_libcuda(tmp_path_factory):
    if not shutil.which("gcc"):
        pytest.skip("gcc is needed to build the fake libcuda")
    out = tmp_path_factory.mktemp("fakecuda") / "libcuda.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(out), os.path.join(HERE, "test_h2d_fake_libcuda.c")],
                   check=True)
    return str(out)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in FAKE_ENV:
        monkeypatch.delenv(name, raising=False)


def opts(lib, **extra):
    out = dict(SMALL, libcuda_path=lib)
    out.update(extra)
    return out


def sysfs_tree(root, nodes, gpu_nodes):
    """nodes: {id: (cpulist, distances)}; gpu_nodes: {bus id: numa_node text}."""
    for nid, (cpus, dist) in nodes.items():
        d = root / "sys/devices/system/node" / ("node%d" % nid)
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
        (d / "distance").write_text(" ".join(str(x) for x in dist) + "\n")
    for bus, node in gpu_nodes.items():
        d = root / "sys/bus/pci/devices" / bus
        d.mkdir(parents=True)
        (d / "numa_node").write_text(node + "\n")
        (d / "max_link_speed").write_text("32.0 GT/s PCIe\n")
        (d / "max_link_width").write_text("16\n")
        (d / "current_link_speed").write_text("2.5 GT/s PCIe\n")
        (d / "current_link_width").write_text("16\n")
    return str(root)


def one_node_root(tmp_path):
    cpus = cpulist.format_cpulist(os.sched_getaffinity(0))
    return sysfs_tree(tmp_path, {0: (cpus, [10])}, {"0000:06:00.0": "-1", "0000:07:00.0": "0"})


# ------------------------------------------------------------ options


@pytest.mark.parametrize("bad, field", [
    ({"placements": ["local", "near"]}, "placements has 'near'; allowed: local, remote, unbound"),
    ({"placements": []}, "placements is []"),
    ({"placements": ["local", "local"]}, "lists a placement twice"),
    ({"large_bytes": 100}, "large_bytes is 100; it must be an integer from 4096"),
    ({"repeats": 0}, "repeats is 0"),
    ({"repeats": True}, "repeats is True"),
    ({"small_repeats": "many"}, "small_repeats is 'many'"),
    ({"pinned_alloc": "mlock"}, "pinned_alloc is 'mlock'; allowed: register, host_alloc"),
    ({"remote_node": -1}, "remote_node is -1"),
    ({"gpus": "0"}, "gpus is '0'"),
    ({"colour": "blue"}, "unknown option 'colour'"),
    ({"large_bytes": 8192, "small_bytes": 65536}, "small_bytes is 65536, larger than large_bytes (8192)"),
])
def test_bad_options_are_named_with_what_is_allowed(bad, field):
    with pytest.raises(h2d_host.ProbeError) as err:
        h2d_options.check_options(bad)
    assert field in str(err.value)


def test_all_bad_options_reported_at_once():
    with pytest.raises(h2d_host.ProbeError) as err:
        h2d_options.check_options({"repeats": 0, "warmup": -1})
    assert "repeats is 0" in str(err.value) and "warmup is -1" in str(err.value)


def test_placements_keep_canonical_order():
    assert h2d_options.check_options({"placements": ["unbound", "local"]})["placements"] == ["local", "unbound"]


# ------------------------------------------------------------ PCIe, statistics, placement choice


@pytest.mark.parametrize("gen, width, raw, encoded", [
    (5, 16, 64.0, 63.015), (4, 16, 32.0, 31.508), (3, 8, 8.0, 7.877), (2, 16, 10.0, 8.0), (6, 16, 128.0, 121.0),
])
def test_pcie_theoretical(gen, width, raw, encoded):
    r, e = h2d_host.pcie_theoretical_gbps(gen, width)
    assert r == raw and round(e, 3) == encoded


def test_pcie_unknown_is_none():
    assert h2d_host.pcie_theoretical_gbps(None, 16) == (None, None)
    assert h2d_host.pcie_theoretical_gbps(7, 16) == (None, None)


def test_pcie_link_from_sysfs_uses_max_link(tmp_path):
    root = one_node_root(tmp_path)
    link = h2d_host.pcie_link("0000:06:00.0", nvml=None, root=root)
    assert link["source"] == "sysfs" and (link["gen_max"], link["width_max"]) == (5, 16)
    assert link["gen_current"] == 1  # idle links train down; the max is the link's capability
    assert link["theoretical_gbps"] == 63.015


def test_percentile_nearest_rank():
    values = list(range(1, 101))
    assert h2d_measure.percentile(values, 50) == 50
    assert h2d_measure.percentile(values, 99) == 99
    assert h2d_measure.percentile(values, 100) == 100
    assert h2d_measure.percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        h2d_measure.percentile([], 50)


def test_bandwidth_stats_median_best_worst():
    stats = h2d_measure.bandwidth_stats(1_000_000_000, [0.02, 0.025, 0.05])
    assert (stats["gbps_median"], stats["gbps_best"], stats["gbps_worst"]) == (40.0, 50.0, 20.0)


def test_latency_stats():
    stats = h2d_measure.latency_stats([5e-6] * 98 + [9e-6, 20e-6])
    assert (stats["us_p50"], stats["us_p99"], stats["us_max"]) == (5.0, 9.0, 20.0)


def test_remote_is_farthest_cpu_bearing_node():
    nodes = {0: {"cpus": {0}, "distances": [10, 12, 32, 32]}, 1: {"cpus": {1}, "distances": [12, 10, 32, 32]},
             2: {"cpus": {2}, "distances": [32, 32, 10, 12]}, 3: {"cpus": set(), "distances": [40, 40, 40, 10]}}
    assert h2d_host.choose_remote(0, nodes) == 2  # node 3 has no CPUs (Grace HBM style): never chosen
    assert h2d_host.choose_remote(0, nodes, override=1) == 1
    with pytest.raises(h2d_host.ProbeError, match="remote_node is 3; it must be a CPU-bearing NUMA node of this host"):
        h2d_host.choose_remote(0, nodes, override=3)
    with pytest.raises(h2d_host.ProbeError, match="the GPU's own node"):
        h2d_host.choose_remote(0, nodes, override=0)
    assert h2d_host.choose_remote(0, {0: nodes[0]}) is None


def test_gpu_node_from_sysfs_then_local_cpulist(tmp_path):
    root = sysfs_tree(tmp_path, {0: ("0-3", [10, 21]), 1: ("4-7", [21, 10])},
                      {"0000:06:00.0": "1", "0000:07:00.0": "-1"})
    (tmp_path / "sys/bus/pci/devices/0000:07:00.0/local_cpulist").write_text("0-3\n")
    nodes = h2d_host.read_numa_nodes(root)
    assert h2d_host.gpu_numa_node("0000:06:00.0", nodes, root) == (1, "sysfs numa_node")
    assert h2d_host.gpu_numa_node("0000:07:00.0", nodes, root) == (0, "sysfs local_cpulist")
    assert h2d_host.gpu_numa_node("0000:99:00.0", nodes, root) == (None, "unknown")


def test_bus_id_normalised():
    assert h2d_cuda.normalise_bus_id("00000000:1A:00.0") == "0000:1a:00.0"
    assert h2d_cuda.normalise_bus_id("0001:06:00.0") == "0001:06:00.0"


# ------------------------------------------------------------ fake driver: measurements


def test_probe_measures_every_gpu_and_placement(fake_libcuda, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_CUDA_GBPS", "50")
    monkeypatch.setenv("FAKE_CUDA_LAT_US", "5")
    report = h2d.probe(opts(fake_libcuda), root=one_node_root(tmp_path), hostname="n1")
    assert report["schema"] == "gpunuma.h2d-probe/v1" and report["status"] == "ok", report["reason"]
    assert [g["pci_bus_id"] for g in report["gpus"]] == ["0000:06:00.0", "0000:07:00.0"]
    gpu = report["gpus"][0]
    assert gpu["uuid"] == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert gpu["numa_node"] == 0 and gpu["pcie"]["theoretical_gbps"] == 63.015
    assert gpu["placements"]["remote"] == {"status": "skipped", "reason": "no other CPU-bearing NUMA node on this host"}
    local = gpu["placements"]["local"]
    assert local["status"] == "ok"
    m = local["measurement"]
    # virtual clock: 1 MiB at 50 GB/s + 5 us
    expected = (1 << 20) / ((1 << 20) / 50e3 + 5) / 1e3
    assert abs(m["h2d_pinned"]["gbps_median"] - expected) < 0.01
    assert m["h2d_pinned"]["samples"] == 3
    assert abs(m["small_h2d_pinned"]["us_p50"] - (5 + 4096 / 50e3)) < 0.01
    assert m["small_h2d_pinned"]["samples"] == 50
    assert m["h2d_pageable"]["gbps_median"] > 0


def test_cpu_overhead_is_the_copying_threads_cpu_time(fake_libcuda, tmp_path, monkeypatch):
    """Each synchronize of the fake spins FAKE_CUDA_SPIN_US of the thread's CPU, as a spinning CUDA context
    waits: the probe's CPU figures grow by about that per small copy, and per GB for large copies."""
    figures = {}
    root = one_node_root(tmp_path)
    for spin_us in (0, 400):
        monkeypatch.setenv("FAKE_CUDA_SPIN_US", str(spin_us))
        report = h2d.probe(opts(fake_libcuda, placements=["local"], rounds=2), root=root)
        figures[spin_us] = report["gpus"][0]["placements"]["local"]
    m0, m400 = figures[0]["measurement"], figures[400]["measurement"]
    small0, small400 = m0["small_h2d_pinned"]["cpu_us_per_copy"], m400["small_h2d_pinned"]["cpu_us_per_copy"]
    assert 400 * 0.9 <= small400 - small0 <= 400 * 3, (small0, small400)
    assert small0 < small400 / 4, (small0, small400)
    copies_per_gb = 1e9 / (1 << 20)  # opts(): 1 MiB large copies
    assert m400["h2d_pinned"]["cpu_s_per_gb"] >= 400e-6 * 0.9 * copies_per_gb, m400["h2d_pinned"]
    assert m400["h2d_pageable"]["cpu_s_per_gb"] >= 400e-6 * 0.9 * copies_per_gb, m400["h2d_pageable"]
    # Every round carries them, and the report gives their median over the rounds.
    local = figures[400]
    per_round = sorted(r["small_cpu_us_per_copy"] for r in local["rounds"])
    assert len(per_round) == 2
    summary = h2d_report._summarise_placement("local", local, 63.0)
    assert summary["small_cpu_us_per_copy"] == pytest.approx(sum(per_round) / 2, abs=0.01)
    assert summary["h2d_pinned_cpu_s_per_gb"] >= 400e-6 * 0.9 * copies_per_gb
    assert summary["h2d_pageable_cpu_s_per_gb"] is not None


def test_local_binding_is_applied_and_verified(fake_libcuda, tmp_path):
    report = h2d.probe(opts(fake_libcuda, placements=["local", "unbound"]), root=one_node_root(tmp_path))
    local = report["gpus"][0]["placements"]["local"]["binding"]
    assert local["cpus_allowed"] == cpulist.format_cpulist(os.sched_getaffinity(0))
    assert local["mempolicy"] == "bind" and local["mempolicy_nodes"] == [0]
    assert local["cpus_verified"] and local["mem_verified"] and local["pages_verified"]
    assert local["buffer_pages"]["pinned"] == {"0": 256} or set(local["buffer_pages"]["pinned"]) == {"0"}
    unbound = report["gpus"][0]["placements"]["unbound"]["binding"]
    assert unbound["mempolicy"] == "default" and unbound["requested_cpus"] is None


def test_child_binding_narrower_cpu_set(fake_libcuda):
    """The child really narrows its CPUs: bind to one CPU and read it back from /proc/self/status."""
    cpu = min(os.sched_getaffinity(0))
    options = h2d_options.check_options(opts(fake_libcuda))
    out = h2d_rounds.run_in_child(h2d_rounds._child_measure, (0, "local", [cpu], [0], options), 30)
    binding = out["ok"]["binding"]
    assert binding["cpus_allowed"] == str(cpu) and binding["cpus_verified"]
    assert os.sched_getaffinity(0) != {cpu} or len(os.sched_getaffinity(0)) == 1  # the parent is untouched


def test_host_alloc_mode(fake_libcuda, tmp_path):
    report = h2d.probe(opts(fake_libcuda, pinned_alloc="host_alloc", placements=["unbound"]), root=one_node_root(tmp_path))
    assert report["status"] == "ok"


def test_select_gpus_by_index_uuid_and_bus(fake_libcuda, tmp_path):
    root = one_node_root(tmp_path)
    report = h2d.probe(opts(fake_libcuda, gpus=["0000:07:00.0"], placements=["unbound"]), root=root)
    assert [g["index"] for g in report["gpus"]] == [1]
    report = h2d.probe(opts(fake_libcuda, gpus=["GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"], placements=["unbound"]), root=root)
    assert [g["index"] for g in report["gpus"]] == [0]
    with pytest.raises(h2d_host.ProbeError, match=r"gpus names 5, not on this node; it has 0 \(GPU-"):
        h2d.probe(opts(fake_libcuda, gpus=[5]), root=root)


# ------------------------------------------------------------ fake driver: error paths


def test_no_driver_is_a_clear_skip(tmp_path):
    report = h2d.probe({"libcuda_path": str(tmp_path / "libcuda.so.1")}, root=one_node_root(tmp_path))
    assert report["status"] == "skipped"
    assert "cannot load the CUDA driver library" in report["reason"] and "no NVIDIA driver" in report["reason"]
    assert report["gpus"] == []


def test_not_libcuda_is_a_clear_skip(tmp_path):
    libc = ctypes.util.find_library("c")
    report = h2d.probe({"libcuda_path": libc}, root=one_node_root(tmp_path))
    assert report["status"] == "skipped" and "lacks cuInit" in report["reason"]


def test_no_gpu_is_a_clear_skip(fake_libcuda, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_CUDA_INIT_ERROR", "100")
    report = h2d.probe(opts(fake_libcuda), root=one_node_root(tmp_path))
    assert report["status"] == "skipped" and report["reason"] == "no NVIDIA GPU on this node (the CUDA driver reports none)"
    monkeypatch.setenv("FAKE_CUDA_INIT_ERROR", "0")
    monkeypatch.setenv("FAKE_CUDA_DEVICES", "0")
    assert h2d.probe(opts(fake_libcuda), root=str(tmp_path))["status"] == "skipped"


def test_driver_failure_is_an_error_with_the_cuda_name(fake_libcuda, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_CUDA_INIT_ERROR", "999")
    report = h2d.probe(opts(fake_libcuda), root=one_node_root(tmp_path))
    assert report["status"] == "error"
    assert report["reason"] == "the CUDA driver could not list GPUs: cuInit failed with CUDA_ERROR_UNKNOWN (999): unknown error"


def test_busy_gpu_is_skipped_by_name_others_measured(fake_libcuda, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_CUDA_BUSY", "1")
    report = h2d.probe(opts(fake_libcuda, placements=["unbound"]), root=one_node_root(tmp_path))
    assert report["status"] == "ok"
    busy = report["gpus"][1]
    assert busy["status"] == "skipped"
    assert busy["reason"].startswith("GPU 1 (GPU-10111213-1415-1617-1819-1a1b1c1d1e1f, 0000:07:00.0) is busy")
    assert "CUDA_ERROR_DEVICES_UNAVAILABLE" in busy["reason"]
    assert report["gpus"][0]["placements"]["unbound"]["status"] == "ok"


def test_all_busy_means_skipped(fake_libcuda, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_CUDA_BUSY", "0")
    monkeypatch.setenv("FAKE_CUDA_DEVICES", "1")
    assert h2d.probe(opts(fake_libcuda), root=one_node_root(tmp_path))["status"] == "skipped"


def test_prohibited_compute_mode_skipped(fake_libcuda, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_CUDA_PROHIBITED", "0")
    report = h2d.probe(opts(fake_libcuda, placements=["unbound"]), root=one_node_root(tmp_path))
    assert report["gpus"][0]["status"] == "skipped" and "compute mode Prohibited" in report["gpus"][0]["reason"]


@pytest.mark.parametrize("kind, what", [
    ("device", "device buffer of 1048576 bytes"),
    ("host_register", "pinned (registered) host buffer of 1048576 bytes"),
])
def test_allocation_failure_names_gpu_and_buffer(fake_libcuda, tmp_path, monkeypatch, kind, what):
    monkeypatch.setenv("FAKE_CUDA_OOM", kind)
    monkeypatch.setenv("FAKE_CUDA_DEVICES", "1")
    report = h2d.probe(opts(fake_libcuda, placements=["unbound"]), root=one_node_root(tmp_path))
    assert report["status"] == "error"
    assert report["reason"] == ("GPU 0 (GPU-00010203-0405-0607-0809-0a0b0c0d0e0f, 0000:06:00.0), placement unbound: "
                                "%s allocating the %s failed with CUDA_ERROR_OUT_OF_MEMORY (2): out of memory"
                                % ("cuMemAlloc" if kind == "device" else "cuMemHostRegister", what))


@pytest.mark.parametrize("kind", ["device", "host_register", "host_alloc", ""])
def test_nothing_left_allocated(fake_libcuda, monkeypatch, kind):
    """In-process: every context, stream, event and buffer is released, on success and on failure."""
    monkeypatch.setenv("FAKE_CUDA_OOM", kind)
    cuda = h2d_cuda.CudaDriver(fake_libcuda)
    cuda.init()
    o = h2d_options.check_options(opts(fake_libcuda, pinned_alloc="host_alloc" if kind == "host_alloc" else "register"))
    if kind:
        with pytest.raises(h2d_cuda.CudaError, match="CUDA_ERROR_OUT_OF_MEMORY"):
            h2d_measure.measure_device(cuda, 0, o)
    else:
        h2d_measure.measure_device(cuda, 0, o)
    assert cuda.lib.fake_outstanding() == 0


def test_the_cost_of_pinning_is_measured_both_ways(fake_libcuda, monkeypatch):
    """cuMemHostAlloc with its pages touched, and cuMemHostRegister alone: seconds and seconds per GiB of the large
    buffer's size; an allocation the node refuses is reported, the measurement kept, nothing left allocated."""
    cuda = h2d_cuda.CudaDriver(fake_libcuda)
    cuda.init()
    o = h2d_options.check_options(opts(fake_libcuda))
    pinning = h2d_measure.measure_device(cuda, 0, o)["pinning"]
    assert pinning["bytes"] == o["large_bytes"]
    for method in ("host_alloc", "register"):
        figure = pinning[method]
        assert figure["seconds"] >= 0
        # seconds is kept to the microsecond; s_per_gib scales it by GiB / large_bytes.
        scale = (1 << 30) / o["large_bytes"]
        assert figure["s_per_gib"] == pytest.approx(figure["seconds"] * scale, abs=scale * 1e-6 + 1e-6)
    monkeypatch.setenv("FAKE_CUDA_OOM", "host_alloc")
    cuda.init()  # the fake driver reads its variables at cuInit
    refused = h2d_measure.measure_device(cuda, 0, o)
    assert "CUDA_ERROR_OUT_OF_MEMORY" in refused["pinning"]["host_alloc"]["error"]
    assert "s_per_gib" in refused["pinning"]["register"] and refused["h2d_pinned"]["samples"] == o["repeats"]
    assert cuda.lib.fake_outstanding() == 0


def test_busy_in_process_leaves_nothing(fake_libcuda, monkeypatch):
    monkeypatch.setenv("FAKE_CUDA_BUSY", "0")
    cuda = h2d_cuda.CudaDriver(fake_libcuda)
    cuda.init()
    with pytest.raises(h2d_cuda.CudaError) as err:
        h2d_measure.measure_device(cuda, 0, h2d_options.check_options(opts(fake_libcuda)))
    assert err.value.code == 46 and cuda.lib.fake_outstanding() == 0


def test_hung_driver_times_out_and_child_is_killed(fake_libcuda, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_CUDA_HANG", "1")
    monkeypatch.setenv("FAKE_CUDA_DEVICES", "1")
    report = h2d.probe(opts(fake_libcuda, placements=["unbound"], timeout_s=2), root=one_node_root(tmp_path))
    assert report["status"] == "error"
    assert "GPU 0 (GPU-00010203-0405-0607-0809-0a0b0c0d0e0f, 0000:06:00.0), placement unbound: no answer within 2 s" in report["reason"]


def test_crashing_child_reported():
    def boom():
        os._exit(9)
    out = h2d_rounds.run_in_child(boom, (), 10)
    assert out == {"error": "the measuring process died without an answer (exit status 9)", "type": "crash"}


def test_two_node_placements_and_a_refused_binding_is_reported(fake_libcuda, tmp_path):
    """A two-node layout on a one-node kernel: local binds and verifies; the remote node does not exist in
    the kernel, so set_mempolicy is refused, the measurement still runs and the binding is reported unverified."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or os.path.exists("/sys/devices/system/node/node1"):
        pytest.skip("needs two CPUs and a kernel with a single NUMA node")
    root = sysfs_tree(tmp_path, {0: (str(cpus[0]), [10, 21]), 1: (str(cpus[1]), [21, 10])},
                      {"0000:06:00.0": "0", "0000:07:00.0": "0"})
    report = h2d.probe(opts(fake_libcuda, gpus=[0]), root=root)
    gpu = report["gpus"][0]
    assert gpu["numa_node"] == 0 and gpu["remote_node"] == 1
    local = gpu["placements"]["local"]["binding"]
    assert local["cpus_allowed"] == str(cpus[0]) and local["cpus_verified"] and local["mem_verified"]
    remote = gpu["placements"]["remote"]
    assert remote["status"] == "ok" and remote["node"] == 1
    assert remote["binding"]["cpus_allowed"] == str(cpus[1]) and remote["binding"]["cpus_verified"]
    assert "set_mempolicy" in remote["binding"]["mem_bind_error"]
    assert remote["binding"]["mem_verified"] is False and remote["binding"]["pages_verified"] is False
    assert remote["binding"]["buffer_pages"]["pinned"] == {"0": 256}
