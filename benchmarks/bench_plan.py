#!/usr/bin/env python3
"""Planning time of the binding planner on two real-sized topologies.

Run from the repository root with the project virtualenv:

    .venv/bin/python benchmarks/bench_plan.py [--runs N] [--target-ms MS]

Prints the median (and slowest) wall time of ``build_plan`` over N runs for

* an 8-GPU, 2-socket host with hyperthreads (one instance per GPU, plus a
  tensor-parallel variant and a tokenizer), and
* a 4-GPU Grace host with 34 NUMA nodes (2 with CPUs, 32 CPU-less).

Exits 1 when a median is above the target (20 ms by default).
"""

import argparse
import json
import os
import statistics
import sys
import time

import ansible.module_utils

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE_UTILS = os.path.join(REPO_ROOT, "module_utils")
if MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(MODULE_UTILS)

from ansible.module_utils.gpunuma.plan import build_plan  # noqa: E402
from ansible.module_utils.gpunuma.profiles import load_profile  # noqa: E402

TOPOLOGIES = os.path.join(REPO_ROOT, "tests", "fixtures", "topologies")
PROFILES = os.path.join(REPO_ROOT, "policies", "profiles")


def load(name):
    with open(os.path.join(TOPOLOGIES, name)) as handle:
        return json.load(handle)


def per_gpu(count):
    return [
        {
            "name": "w%d" % i,
            "gpus": [i],
            "command": ["/opt/vllm/bin/vllm", "serve", "--port", str(8000 + i)],
            "memory": "64G",
        }
        for i in range(count)
    ]


CASES = [
    ("8 GPUs, 2 nodes, HT: one instance per GPU", "hgx-h200-8gpu-2socket-ht.json", "strict", per_gpu(8)),
    (
        "8 GPUs, 2 nodes, HT: 2x gpus_per_instance 4 + tokenizer",
        "hgx-h200-8gpu-2socket-ht.json",
        "strict",
        [
            {"name": "tp-a", "gpus_per_instance": 4, "command": ["/opt/vllm/bin/vllm", "serve"]},
            {"name": "tp-b", "gpus_per_instance": 4, "command": ["/opt/vllm/bin/vllm", "serve"]},
            {"name": "tok", "numa_node": 0, "cpus": 8, "command": ["/opt/tok/bin/tok"]},
        ],
    ),
    ("4 GPUs, 34 NUMA nodes (32 CPU-less): one instance per GPU", "gb200-4gpu-34numa.json", "strict", per_gpu(4)),
    ("4 GPUs, 34 NUMA nodes (32 CPU-less): interleave profile", "gb200-4gpu-34numa.json", "interleave", per_gpu(4)),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--target-ms", type=float, default=20.0)
    args = parser.parse_args()
    slow = False
    print("%-62s %10s %10s" % ("case (runs=%d)" % args.runs, "median ms", "max ms"))
    for label, fixture, profile_name, instances in CASES:
        topology = load(fixture)
        profile = load_profile(profile_name, PROFILES)
        build_plan(topology, profile, instances)  # warm-up; also fails loudly on bad input
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            build_plan(topology, profile, instances)
            times.append((time.perf_counter() - start) * 1000.0)
        median = statistics.median(times)
        slow = slow or median > args.target_ms
        print("%-62s %10.3f %10.3f" % (label, median, max(times)))
    print("target: median < %.0f ms: %s" % (args.target_ms, "SLOW" if slow else "ok"))
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
