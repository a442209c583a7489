#!/usr/bin/env python3
"""Discovery benchmark: core discovery time per topology, against a baseline.

Core discovery is what the module does besides Ansible's own start-up:
reading sysfs (and the NVML dump or topo text) and building the topology.
The baseline is the I/O floor: reading every file of the same tree once,
with no parsing. Prints median and p90 over many runs, and the ratio.

    .venv/bin/python benchmarks/bench_discovery.py [--runs 50] [--live]

``--live`` also times discovery of this machine (live sysfs, and live NVML
and ``nvidia-smi topo -m`` where present). Target: core discovery of the
2-socket 8-GPU tree under 50 ms.
"""

import argparse
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

import ansible.module_utils  # noqa: E402

ansible.module_utils.__path__.append(os.path.join(REPO, "module_utils"))

import sysfs_factory  # noqa: E402
from ansible.module_utils.gpunuma.discover import discover  # noqa: E402

FIXTURES = os.path.join(REPO, "tests", "fixtures")
TARGET_MS = 50.0


def timed(func, runs):
    func()  # warm the page and dentry caches, as on a node that has booted
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        func()
        samples.append((time.perf_counter() - start) * 1000.0)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.9) - 1]


def read_every_file(root):
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                with open(os.path.join(dirpath, name), "rb") as handle:
                    handle.read()
            except OSError:
                pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--live", action="store_true", help="also time discovery of this machine")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="gpunuma-bench-")
    try:
        cases = []
        two = sysfs_factory.two_socket_8gpu_ht(os.path.join(work, "8gpu"))
        cases.append(("2-socket 8-GPU HT (sysfs)", dict(sysfs_root=two), two))
        gb = sysfs_factory.gb200_34node(os.path.join(work, "gb200"))
        cases.append(("GB200 34 NUMA nodes (sysfs)", dict(sysfs_root=gb), gb))
        h200 = os.path.join(FIXTURES, "recorded", "h200-vm")
        dump = os.path.join(h200, "nvml-dump.json")
        if os.path.exists(dump):
            cases.append(("H200 recorded (sysfs + NVML replay)",
                          dict(sysfs_root=os.path.join(h200, "sysfs"), nvml_dump=dump), os.path.join(h200, "sysfs")))
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

        print("%-40s %10s %10s %14s %8s" % ("case", "median ms", "p90 ms", "baseline ms", "ratio"))
        for label, kwargs, tree in cases:
            median, p90 = timed(lambda: discover("bench", **kwargs), args.runs)
            if tree:
                base, _ = timed(lambda: read_every_file(tree), args.runs)
                ratio = "%7.1fx" % (median / base) if base else "-"
                base_txt = "%14.2f" % base
            else:
                base_txt, ratio = "%14s" % "-", "-"
            print("%-40s %10.2f %10.2f %s %8s" % (label, median, p90, base_txt, ratio))
            if label.startswith("2-socket"):
                verdict = "meets" if median < TARGET_MS else "MISSES"
                print("  -> %s the %.0f ms target for the 8-GPU tree" % (verdict, TARGET_MS))
        print("baseline: reading every file of the same tree once, no parsing (I/O floor)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
