#!/usr/bin/env python3
"""H2D probe against PyTorch, side by side, on every GPU of this machine.

    python3 benchmarks/h2d_bench.py [--large-bytes N] [--repeats 10] [--small-repeats 1000]
                                    [--pinned-alloc register|host_alloc] [--json out.json]

First the gpunuma probe (``module_utils/gpunuma/verify/h2d.py``, libcuda through
ctypes, each placement in a bound child process), then PyTorch in this
process: ``copy_(non_blocking=True)`` from a pinned (``pin_memory=True``)
and a pageable tensor, event-timed on a dedicated stream after the same
warm-up, and the same small copies (each event-timed, then a loop of
back-to-back async copies).  Prints per GPU: both numbers and the ratio.

Targets (from the recorded run): probe pinned H2D >= 0.98 x PyTorch's, and
probe small-copy latency no worse than PyTorch's (p50 event-timed, and per
copy in the back-to-back loop).  Exits 1 when a target is missed, 2 when
PyTorch or a GPU is missing.
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

use_core()

from ansible.module_utils.gpunuma.verify import h2d  # noqa: E402

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

    def series(fn, count):
        for _ in range(warmup):
            fn()
        return [fn() for _ in range(count)]

    out = {
        "h2d_pinned": h2d.bandwidth_stats(large, series(lambda: event_copy(d_large, pinned), repeats)),
        "d2h_pinned": h2d.bandwidth_stats(large, series(lambda: event_copy(pinned, d_large), repeats)),
        "h2d_pageable": h2d.bandwidth_stats(large, series(lambda: wall_copy(d_large, pageable), repeats)),
        "small_h2d_pinned": h2d.latency_stats(series(lambda: event_copy(d_small, pinned_small), small_repeats)),
    }
    with torch.cuda.stream(stream):
        for _ in range(warmup):
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


def compare(probe_m, torch_m):
    def ratio(a, b):
        return round(a / b, 4) if a and b else None

    return {
        "h2d_pinned_ratio": ratio(probe_m["h2d_pinned"]["gbps_median"], torch_m["h2d_pinned"]["gbps_median"]),
        "d2h_pinned_ratio": ratio(probe_m["d2h_pinned"]["gbps_median"], torch_m["d2h_pinned"]["gbps_median"]),
        "h2d_pageable_ratio": ratio(probe_m["h2d_pageable"]["gbps_median"], torch_m["h2d_pageable"]["gbps_median"]),
        "small_p50_ratio": ratio(probe_m["small_h2d_pinned"]["us_p50"], torch_m["small_h2d_pinned"]["us_p50"]),
        "small_p99_ratio": ratio(probe_m["small_h2d_pinned"]["us_p99"], torch_m["small_h2d_pinned"]["us_p99"]),
        "small_loop_ratio": ratio(probe_m["small_h2d_pinned"]["loop_us_per_copy"],
                                  torch_m["small_h2d_pinned"]["loop_us_per_copy"]),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--large-bytes", type=int, default=h2d.DEFAULTS["large_bytes"])
    ap.add_argument("--small-bytes", type=int, default=h2d.DEFAULTS["small_bytes"])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--small-repeats", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--pinned-alloc", default="register", choices=h2d.PINNED_ALLOCS)
    ap.add_argument("--json", help="write probe, PyTorch and ratios here")
    args = ap.parse_args()
    opts = {"large_bytes": args.large_bytes, "small_bytes": args.small_bytes, "repeats": args.repeats,
            "small_repeats": args.small_repeats, "warmup": args.warmup, "pinned_alloc": args.pinned_alloc,
            "placements": ["local", "unbound"]}
    # the probe first: its parent process must not hold a CUDA context when it forks
    report = h2d.probe(opts)
    if report["status"] != "ok":
        print("probe %s: %s" % (report["status"], report["reason"]))
        return 2
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed here; only the probe ran")
        return 2
    rows, failed = [], False
    for gpu in report["gpus"]:
        if gpu["status"] != "ok":
            continue
        placement = "local" if gpu["placements"].get("local", {}).get("status") == "ok" else "unbound"
        pm = gpu["placements"][placement]["measurement"]
        tm = torch_measure(torch, gpu["index"], args.large_bytes, args.small_bytes, args.repeats,
                           args.small_repeats, args.warmup)
        ratios = compare(pm, tm)
        ok = (ratios["h2d_pinned_ratio"] or 0) >= BANDWIDTH_RATIO_MIN and \
            min(ratios["small_p50_ratio"] or 9, ratios["small_loop_ratio"] or 9) <= 1.0
        failed = failed or not ok
        rows.append({"gpu": gpu["index"], "uuid": gpu["uuid"], "placement": placement,
                     "probe": {k: {kk: vv for kk, vv in v.items() if kk != "seconds"} for k, v in pm.items()},
                     "torch": tm, "ratios": ratios, "meets_targets": ok})
    hdr = "%-4s %-8s %-22s %10s %10s %8s" % ("gpu", "place", "measure", "probe", "torch", "ratio")
    print(hdr)
    for r in rows:
        p, t, q = r["probe"], r["torch"], r["ratios"]
        lines = [
            ("h2d pinned GB/s", p["h2d_pinned"]["gbps_median"], t["h2d_pinned"]["gbps_median"], q["h2d_pinned_ratio"]),
            ("d2h pinned GB/s", p["d2h_pinned"]["gbps_median"], t["d2h_pinned"]["gbps_median"], q["d2h_pinned_ratio"]),
            ("h2d pageable GB/s", p["h2d_pageable"]["gbps_median"], t["h2d_pageable"]["gbps_median"], q["h2d_pageable_ratio"]),
            ("small p50 us", p["small_h2d_pinned"]["us_p50"], t["small_h2d_pinned"]["us_p50"], q["small_p50_ratio"]),
            ("small p99 us", p["small_h2d_pinned"]["us_p99"], t["small_h2d_pinned"]["us_p99"], q["small_p99_ratio"]),
            ("small loop us/copy", p["small_h2d_pinned"]["loop_us_per_copy"], t["small_h2d_pinned"]["loop_us_per_copy"],
             q["small_loop_ratio"]),
        ]
        for name, a, b, c in lines:
            print("%-4s %-8s %-22s %10.3f %10.3f %8.4f" % (r["gpu"], r["placement"], name, a, b, c))
        print("%-4s targets: pinned ratio >= %.2f and small latency ratio <= 1: %s"
              % (r["gpu"], BANDWIDTH_RATIO_MIN, "met" if r["meets_targets"] else "MISSED"))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"schema": "gpunuma.h2d-bench/v1", "options": opts, "rows": rows,
                       "torch_version": torch.__version__, "probe_seconds": report["seconds"]}, fh, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
