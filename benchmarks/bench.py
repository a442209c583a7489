#!/usr/bin/env python3
"""gpunuma benchmark: core discovery and planning time, each against a baseline.

    .venv/bin/python benchmarks/bench.py [--runs 50] [--live]

Discovery: what the module does besides Ansible's own start-up (reading
sysfs, the NVML dump or topo text, building the topology). Baseline: the I/O
floor, reading every file of the same tree once with no parsing.
Target: under 50 ms for the 2-socket 8-GPU tree.

Planning: ``build_plan`` on real-sized topologies. Baseline: a JSON round
trip of the same topology (the cost of merely copying the planner's input).
Target: under 20 ms.

``--live`` also times discovery of this machine (live sysfs, and live NVML
and ``nvidia-smi topo -m`` where present). Exits 1 when a target is missed.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, REPO)
from gpunuma_controller.core import use_core  # noqa: E402

use_core()

import sysfs_factory  # noqa: E402
from ansible.module_utils.gpunuma.discovery.discover import discover  # noqa: E402
from ansible.module_utils.gpunuma.plan.planner import build_plan  # noqa: E402
from ansible.module_utils.gpunuma.plan.profiles import load_profile  # noqa: E402

FIXTURES = os.path.join(REPO, "tests", "fixtures")
TOPOLOGIES = os.path.join(FIXTURES, "topologies")
PROFILES = os.path.join(REPO, "policies", "profiles")
DISCOVERY_TARGET_MS = 50.0
PLAN_TARGET_MS = 20.0
ROW = "%-58s %10s %10s %12s %8s"


def timed(func, runs):
    func()  # warm caches (and fail loudly on bad input) before measuring
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        func()
        samples.append((time.perf_counter() - start) * 1000.0)
    samples.sort()
    return statistics.median(samples), samples[max(0, int(len(samples) * 0.9) - 1)]


def row(label, median, p90, base):
    ratio = "%7.1fx" % (median / base) if base else "-"
    base_txt = "%12.3f" % base if base is not None else "-"
    print(ROW % (label, "%.3f" % median, "%.3f" % p90, base_txt, ratio))


def read_every_file(root):
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                with open(os.path.join(dirpath, name), "rb") as handle:
                    handle.read()
            except OSError:
                pass


def discovery_section(args, work):
    cases = []
    two = sysfs_factory.two_socket_8gpu_ht(os.path.join(work, "8gpu"))
    cases.append(("2-socket 8-GPU HT (sysfs)", dict(sysfs_root=two), two))
    gb = sysfs_factory.gb200_34node(os.path.join(work, "gb200"))
    cases.append(("GB200 34 NUMA nodes (sysfs)", dict(sysfs_root=gb), gb))
    h200 = os.path.join(FIXTURES, "recorded", "h200-vm")
    cases.append(("H200 recorded (sysfs + NVML replay)",
                  dict(sysfs_root=os.path.join(h200, "sysfs"), nvml_dump=os.path.join(h200, "nvml-dump.json")),
                  os.path.join(h200, "sysfs")))
    topo = os.path.join(FIXTURES, "published", "hgx-h200-8gpu-10nic-tabs.topo.txt")
    cases.append(("HGX H200 topo -m text only", dict(topo_file=topo), None))
    if args.live:
        def run_smi():
            try:
                proc = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return None, str(exc)
            return (proc.stdout, None) if proc.returncode == 0 else (None, proc.stderr)
        cases.append(("this machine, live (all sources)", dict(run_nvidia_smi=run_smi), "/sys/devices/system/node"))

    print(ROW % ("discovery (runs=%d)" % args.runs, "median ms", "p90 ms", "baseline ms", "ratio"))
    ok = True
    for label, kwargs, tree in cases:
        median, p90 = timed(lambda: discover("bench", **kwargs), args.runs)
        base = timed(lambda: read_every_file(tree), args.runs)[0] if tree else None
        row(label, median, p90, base)
        if label.startswith("2-socket"):
            ok = median < DISCOVERY_TARGET_MS
    print("  target: 8-GPU tree under %.0f ms: %s" % (DISCOVERY_TARGET_MS, "ok" if ok else "MISSED"))
    print("  baseline: reading every file of the same tree once, no parsing (I/O floor)")
    return ok


def per_gpu(count):
    return [{"name": "w%d" % i, "gpus": [i], "command": ["/opt/vllm/bin/vllm", "serve", "--port", str(8000 + i)],
             "memory": "64G"} for i in range(count)]


PLAN_CASES = [
    ("8 GPUs, 2 nodes, HT: one instance per GPU", "hgx-h200-8gpu-2socket-ht.json", "strict", per_gpu(8)),
    ("8 GPUs, 2 nodes, HT: 2x gpus_per_instance 4 + tokenizer", "hgx-h200-8gpu-2socket-ht.json", "strict",
     [{"name": "tp-a", "gpus_per_instance": 4, "command": ["/opt/vllm/bin/vllm", "serve"]},
      {"name": "tp-b", "gpus_per_instance": 4, "command": ["/opt/vllm/bin/vllm", "serve"]},
      {"name": "tok", "numa_node": 0, "cpus": 8, "command": ["/opt/tok/bin/tok"]}]),
    ("4 GPUs, 34 NUMA nodes (32 CPU-less): one per GPU", "gb200-4gpu-34numa.json", "strict", per_gpu(4)),
    ("4 GPUs, 34 NUMA nodes (32 CPU-less): interleave", "gb200-4gpu-34numa.json", "interleave", per_gpu(4)),
]


def planning_section(args):
    print(ROW % ("planning (runs=%d)" % args.runs, "median ms", "p90 ms", "baseline ms", "ratio"))
    ok = True
    for label, fixture, profile_name, instances in PLAN_CASES:
        with open(os.path.join(TOPOLOGIES, fixture)) as handle:
            topology = json.load(handle)
        profile = load_profile(profile_name, PROFILES)
        median, p90 = timed(lambda: build_plan(topology, profile, instances), args.runs)
        base = timed(lambda: json.loads(json.dumps(topology)), args.runs)[0]
        row(label, median, p90, base)
        ok = ok and median < PLAN_TARGET_MS
    print("  target: every median under %.0f ms: %s" % (PLAN_TARGET_MS, "ok" if ok else "MISSED"))
    print("  baseline: a JSON round trip of the same topology")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--live", action="store_true", help="also time discovery of this machine")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="gpunuma-bench-")
    try:
        ok = discovery_section(args, work)
        print()
        ok = planning_section(args) and ok
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
