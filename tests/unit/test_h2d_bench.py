"""benchmarks/h2d_bench.py: ratios from the recorded H200 run, and a clear exit without a GPU."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.unit

BENCH = os.path.join(REPO_ROOT, "benchmarks", "h2d_bench.py")
RECORDED = os.path.join(FIXTURES, "recorded", "h200-probe")


def load_bench():
    spec = importlib.util.spec_from_file_location("h2d_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("run, mode", [(r, m) for r in ("run1", "run2") for m in ("register", "host_alloc")])
def test_recorded_ratios_meet_targets(run, mode):
    bench = load_bench()
    with open(os.path.join(RECORDED, run, "bench-%s.json" % mode)) as fh:
        data = json.load(fh)
    assert data["schema"] == "gpunuma.h2d-bench/v1" and data["options"]["pinned_alloc"] == mode
    for row in data["rows"]:
        ratios = bench.compare(row["probe"], row["torch"])
        assert ratios == row["ratios"]
        assert ratios["h2d_pinned_ratio"] >= bench.BANDWIDTH_RATIO_MIN
        assert ratios["small_p50_ratio"] <= 1.0 and ratios["small_loop_ratio"] <= 1.0
        assert row["meets_targets"] is True


def test_compare_flags_a_slow_probe():
    bench = load_bench()
    probe = {"h2d_pinned": {"gbps_median": 50.0}, "d2h_pinned": {"gbps_median": 50.0}, "h2d_pageable": {"gbps_median": 9.0},
             "small_h2d_pinned": {"us_p50": 5.0, "us_p99": 6.0, "loop_us_per_copy": 3.0}}
    torch = {"h2d_pinned": {"gbps_median": 55.0}, "d2h_pinned": {"gbps_median": 55.0}, "h2d_pageable": {"gbps_median": 9.0},
             "small_h2d_pinned": {"us_p50": 4.0, "us_p99": 6.0, "loop_us_per_copy": 2.5}}
    ratios = bench.compare(probe, torch)
    assert ratios["h2d_pinned_ratio"] == round(50 / 55, 4) < bench.BANDWIDTH_RATIO_MIN
    assert ratios["small_p50_ratio"] == 1.25


def test_without_a_driver_exits_2_with_the_reason(tmp_path):
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path))
    proc = subprocess.run([sys.executable, BENCH, "--repeats", "1"], capture_output=True, text=True, env=env, timeout=120)
    if proc.returncode != 2 or "cannot load the CUDA driver library" not in proc.stdout:
        if os.path.exists("/dev/nvidiactl"):
            pytest.skip("this machine has an NVIDIA driver")
    assert proc.returncode == 2
    assert proc.stdout.startswith("probe skipped: cannot load the CUDA driver library 'libcuda.so.1'")
    assert "Traceback" not in proc.stderr


def _measurement(gbps, p50, loop):
    return {"h2d_pinned": {"gbps_median": gbps}, "d2h_pinned": {"gbps_median": gbps},
            "h2d_pageable": {"gbps_median": 9.0},
            "small_h2d_pinned": {"us_p50": p50, "us_p99": p50 * 2, "loop_us_per_copy": loop}}


def test_targets_use_the_medians_of_the_runs_so_one_cold_run_decides_nothing():
    bench = load_bench()
    # The probe's first run is cold (p50 8.1 us against PyTorch's 6.2); its median over five is not.
    probe = [_measurement(55.0, 8.1, 2.7)] + [_measurement(55.2, 4.7, 2.6)] * 4
    torch = [_measurement(55.3, 6.2, 3.7)] * 5
    summary = bench.summarise(probe, torch)
    p50 = summary["small p50 us"]
    assert p50["probe"] == {"min": 4.7, "median": 4.7, "max": 8.1, "runs": 5}
    assert p50["median_ratio"] == round(4.7 / 6.2, 4)
    assert bench.meets_targets(summary) is True
    # One run alone, the cold one, misses the small-copy target by p50 (the loop ratio still meets it).
    cold = bench.summarise(probe[:1], torch[:1])
    assert cold["small p50 us"]["median_ratio"] > 1
    # A probe slower in the median misses the bandwidth target.
    slow = bench.summarise([_measurement(50.0, 4.7, 2.6)] * 3 + [_measurement(56.0, 4.7, 2.6)] * 2, torch)
    assert slow["h2d pinned GB/s"]["median_ratio"] == round(50.0 / 55.3, 4)
    assert bench.meets_targets(slow) is False


def test_spread_ignores_missing_values():
    bench = load_bench()
    assert bench.spread([3.0, None, 1.0, 2.0]) == {"min": 1.0, "median": 2.0, "max": 3.0, "runs": 3}
    assert bench.spread([None]) == {"min": None, "median": None, "max": None, "runs": 0}


def test_recorded_runs_replay_to_the_printed_summary():
    bench = load_bench()
    with open(os.path.join(FIXTURES, "recorded", "h200-bench-runs", "bench-runs-register.json")) as fh:
        data = json.load(fh)
    assert data["schema"] == "gpunuma.h2d-bench/v2" and data["options"]["runs"] == 5
    [row] = data["rows"]
    assert len(row["probe_runs"]) == len(row["torch_runs"]) == 5
    summary = bench.summarise(row["probe_runs"], row["torch_runs"])
    assert summary == row["summary"]
    assert bench.meets_targets(summary) is row["meets_targets"] is True
    # The medians, not one run: the spread of the small copies is wide on both sides.
    p50 = summary["small p50 us"]
    assert p50["probe"]["max"] > 1.3 * p50["probe"]["min"]
    assert p50["probe"]["min"] <= p50["probe"]["median"] <= p50["probe"]["max"]
