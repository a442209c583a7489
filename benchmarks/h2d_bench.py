#!/usr/bin/env python3
"""H2D probe against PyTorch, side by side, on every GPU of this machine.

    python3 benchmarks/h2d_bench.py [--runs 5] [--large-bytes N] [--repeats 10] [--small-repeats 1000]
                                    [--pinned-alloc register|host_alloc] [--json out.json]

First the gpunuma probe (``module_utils/gpunuma/verify/h2d/probe.py``, libcuda through
ctypes, each placement in a bound child process), then PyTorch in this
process: ``copy_(non_blocking=True)`` from a pinned (``pin_memory=True``)
and a pageable tensor, event-timed on a dedicated stream after the same
warm-up, and the same small copies (each event-timed, then a loop of
back-to-back async copies).  Prints per GPU: both numbers and the ratio.

Each side runs ``--runs`` times (the probe's runs first: its parent must
hold no CUDA context when it forks its bound children), each run in a
process of its own (a fresh CUDA context on both sides) after the same
warm-up (small copies: ``h2d.SMALL_WARMUP_COPIES``); every figure is printed as min / median / max over the runs,
and the ratio and the targets use the medians, so one cold or noisy run
neither passes nor fails the benchmark.

Targets (from the recorded run): probe pinned H2D >= 0.98 x PyTorch's, and
probe small-copy latency no worse than PyTorch's (p50 event-timed, or per
copy in the back-to-back loop), medians over the runs.  Exits 1 when a
target is missed, 2 when PyTorch or a GPU is missing.
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

sys.path.insert(0, REPO)
from gpunuma_controller.core import use_core  # noqa: E402

# The probe core needs only the standard library and libcuda: GPU machines need no Ansible.
use_core(standalone=True)

from ansible.module_utils.gpunuma.verify.h2d import probe as h2d  # noqa: E402
from ansible.module_utils.gpunuma.verify.h2d import measure as h2d_measure  # noqa: E402
from ansible.module_utils.gpunuma.verify.h2d import options as h2d_options  # noqa: E402

BANDWIDTH_RATIO_MIN = 0.98


def torch_measure(torch, index, large, small, repeats, small_repeats, warmup):
    dev = torch.device("cuda", index)
    torch.cuda.set_device(dev)
    stream = torch.cuda.Stream(device=dev)
    d_large = torch.empty(large, dtype=torch.uint8, device=dev)
    pinned = torch.ones(large, dtype=torch.uint8).pin_memory()
    pageable = torch.ones(large, dtype=torch.uint8)
    pinned_small = torch.ones(small, dtype=torch.uint8).pin_memory()
    d_small = torch.empty(small, dtype=torch.uint8, device=dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def event_copy(dst, src):
        with torch.cuda.stream(stream):
            start.record(stream)
            dst.copy_(src, non_blocking=True)
            end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) / 1000.0

    def wall_copy(dst, src):
        t0 = time.perf_counter()
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
        stream.synchronize()
        return time.perf_counter() - t0

    def series(fn, count, warm=warmup):
        for _ in range(warm):
            fn()
        return [fn() for _ in range(count)]

    # The probe's small-copy warm-up, on both sides.
    small_warmup = max(warmup, h2d_options.SMALL_WARMUP_COPIES)
    out = {
        "h2d_pinned": h2d_measure.bandwidth_stats(large, series(lambda: event_copy(d_large, pinned), repeats)),
        "d2h_pinned": h2d_measure.bandwidth_stats(large, series(lambda: event_copy(pinned, d_large), repeats)),
        "h2d_pageable": h2d_measure.bandwidth_stats(large, series(lambda: wall_copy(d_large, pageable), repeats)),
        "small_h2d_pinned": h2d_measure.latency_stats(series(lambda: event_copy(d_small, pinned_small), small_repeats,
                                                     small_warmup)),
    }
    with torch.cuda.stream(stream):
        for _ in range(small_warmup):
            d_small.copy_(pinned_small, non_blocking=True)
        stream.synchronize()
        start.record(stream)
        for _ in range(small_repeats):
            d_small.copy_(pinned_small, non_blocking=True)
        end.record(stream)
    end.synchronize()
    out["small_h2d_pinned"]["loop_us_per_copy"] = round(start.elapsed_time(end) * 1000.0 / small_repeats, 3)
    for m in out.values():
        m.pop("seconds", None)
    del d_large, pinned, pageable, pinned_small, d_small
    torch.cuda.empty_cache()
    return out


MEASURES = (
    # (label, measurement key, field, ratio name)
    ("h2d pinned GB/s", "h2d_pinned", "gbps_median", "h2d_pinned_ratio"),
    ("d2h pinned GB/s", "d2h_pinned", "gbps_median", "d2h_pinned_ratio"),
    ("h2d pageable GB/s", "h2d_pageable", "gbps_median", "h2d_pageable_ratio"),
    ("small p50 us", "small_h2d_pinned", "us_p50", "small_p50_ratio"),
    ("small p99 us", "small_h2d_pinned", "us_p99", "small_p99_ratio"),
    ("small loop us/copy", "small_h2d_pinned", "loop_us_per_copy", "small_loop_ratio"),
)


def spread(values):
    """min / median / max of the runs' values (None where a run had none)."""
    values = [v for v in values if isinstance(v, (int, float))]
    if not values:
        return {"min": None, "median": None, "max": None, "runs": 0}
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "runs": len(values)}


def ratio(a, b):
    return round(a / b, 4) if a and b else None


def compare(probe_m, torch_m):
    """The ratios (probe / PyTorch) of one run of each side (the single-run v1 recordings)."""
    return {name: ratio(probe_m[key][field], torch_m[key][field]) for _, key, field, name in MEASURES}


def summarise(probe_runs, torch_runs):
    """Per measure: the probe's and PyTorch's spread over the runs and the ratio of their medians."""
    out = {}
    for label, key, field, _ in MEASURES:
        probe = spread([m[key][field] for m in probe_runs])
        torch = spread([m[key][field] for m in torch_runs])
        out[label] = {"probe": probe, "torch": torch, "median_ratio": ratio(probe["median"], torch["median"])}
    return out


def meets_targets(summary):
    bandwidth = summary["h2d pinned GB/s"]["median_ratio"] or 0
    latency = min(summary["small p50 us"]["median_ratio"] or 9, summary["small loop us/copy"]["median_ratio"] or 9)
    return bandwidth >= BANDWIDTH_RATIO_MIN and latency <= 1.0


def _fmt(value):
    return "%.3f" % value if isinstance(value, (int, float)) else "-"


def torch_in_child(index, args):
    """One PyTorch run in a process of its own, as each probe run is: a fresh CUDA context on both sides."""
    import subprocess

    spec = [index, args.large_bytes, args.small_bytes, args.repeats, args.small_repeats, args.warmup]
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--torch-child", json.dumps(spec)],
                          capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError("the PyTorch run failed (rc %d): %s" % (proc.returncode, proc.stderr[-2000:]))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def probe_all(opts, runs):
    """``({(gpu, uuid, placement): [measurement]}, [seconds])`` over ``runs`` probe runs; ``(None, None)`` when one
    cannot run (the reason printed)."""
    probe_runs = {}
    seconds = []
    for _ in range(runs):
        report = h2d.probe(opts)
        if report["status"] != "ok":
            print("probe %s: %s" % (report["status"], report["reason"]))
            return None, None
        seconds.append(report["seconds"])
        for gpu in report["gpus"]:
            if gpu["status"] != "ok":
                continue
            placement = "local" if gpu["placements"].get("local", {}).get("status") == "ok" else "unbound"
            probe_runs.setdefault((gpu["index"], gpu["uuid"], placement), []).append(
                gpu["placements"][placement]["measurement"])
    return probe_runs, seconds


def print_rows(rows, runs):
    """The side-by-side table: each measure's min/median/max on both sides and the ratio of the medians."""
    print("%d runs of each side; min / median / max over the runs, ratio of the medians (probe / PyTorch)"
          % runs)
    print("%-4s %-8s %-20s %26s %26s %8s" % ("gpu", "place", "measure", "probe min/med/max", "torch min/med/max", "ratio"))
    for r in rows:
        for label, _, _, _ in MEASURES:
            s = r["summary"][label]
            print("%-4s %-8s %-20s %26s %26s %8s" % (
                r["gpu"], r["placement"], label,
                "/".join(_fmt(s["probe"][k]) for k in ("min", "median", "max")),
                "/".join(_fmt(s["torch"][k]) for k in ("min", "median", "max")),
                _fmt(s["median_ratio"])))
        print("%-4s targets (medians): pinned ratio >= %.2f and small latency ratio <= 1: %s"
              % (r["gpu"], BANDWIDTH_RATIO_MIN, "met" if r["meets_targets"] else "MISSED"))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--torch-child":
        import torch

        print(json.dumps(torch_measure(torch, *json.loads(sys.argv[2]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each side; figures are min/median/max over them")
    ap.add_argument("--large-bytes", type=int, default=h2d_options.DEFAULTS["large_bytes"])
    ap.add_argument("--small-bytes", type=int, default=h2d_options.DEFAULTS["small_bytes"])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--small-repeats", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--pinned-alloc", default="register", choices=h2d_options.PINNED_ALLOCS)
    ap.add_argument("--json", help="write every run, the spreads and the ratios here")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs: %d is not allowed; allowed: 1 or more" % args.runs)
    opts = {"large_bytes": args.large_bytes, "small_bytes": args.small_bytes, "repeats": args.repeats,
            "small_repeats": args.small_repeats, "warmup": args.warmup, "pinned_alloc": args.pinned_alloc,
            "placements": ["local", "unbound"]}
    # Every probe run first: its parent process must not hold a CUDA context when it forks.
    probe_runs, seconds = probe_all(opts, args.runs)
    if probe_runs is None:
        return 2
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed here; only the probe ran")
        return 2
    rows, failed = [], False
    for (index, uuid, placement), runs in sorted(probe_runs.items()):
        torch_runs = [torch_in_child(index, args) for _ in range(args.runs)]
        summary = summarise(runs, torch_runs)
        ok = meets_targets(summary)
        failed = failed or not ok
        rows.append({"gpu": index, "uuid": uuid, "placement": placement, "summary": summary, "meets_targets": ok,
                     "probe_runs": [{k: {kk: vv for kk, vv in v.items() if kk != "seconds"} for k, v in m.items()}
                                    for m in runs],
                     "torch_runs": torch_runs})
    print_rows(rows, args.runs)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"schema": "gpunuma.h2d-bench/v2", "options": dict(opts, runs=args.runs), "rows": rows,
                       "torch_version": torch.__version__, "probe_seconds": seconds}, fh, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
