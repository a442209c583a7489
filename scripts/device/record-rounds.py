#!/usr/bin/env python3
"""Record validation probes back to back on a GPU node: ``record-rounds.py OUT RUNS ROUNDS [LOAD]``.

Each run is ``h2d.probe({"rounds": ROUNDS, "load": LOAD})`` (the probe core, default sizes,
every placement the node has; LOAD idle, copies, memory or both, default idle), written to ``OUT/LOAD-N.json``, with a one-line
summary of its per-round figures on stdout (GB/s, p99 µs, CPU s/GB, CPU µs per small copy). Runs without Ansible installed
(the core needs only the standard library and libcuda): ``ansible.module_utils``
is stood in for by the repository's ``module_utils``.
"""
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from gpunuma_controller.core import use_core  # noqa: E402

use_core(standalone=True)

from ansible.module_utils.gpunuma.verify.h2d import probe as h2d  # noqa: E402


def main(argv):
    if len(argv) not in (4, 5):
        sys.exit("usage: record-rounds.py OUT RUNS ROUNDS [LOAD]")
    out, runs, rounds = argv[1], int(argv[2]), int(argv[3])
    load = argv[4] if len(argv) == 5 else "idle"
    os.makedirs(out, exist_ok=True)
    for run in range(1, runs + 1):
        started = time.time()
        result = h2d.probe({"rounds": rounds, "load": load})
        with open(os.path.join(out, "%s-%d.json" % (load, run)), "w") as handle:
            json.dump(result, handle, indent=1, sort_keys=True)
        gpu = result["gpus"][0] if result["gpus"] else {}
        summary = {name: [(r["h2d_pinned_gbps"], r["small_p99_us"], r.get("h2d_pinned_cpu_s_per_gb"),
                           r.get("small_cpu_us_per_copy")) for r in place.get("rounds", [])]
                   for name, place in gpu.get("placements", {}).items()}
        print("run", run, load, result["status"], result.get("reason"), "%.1fs" % (time.time() - started),
              json.dumps(summary), json.dumps(result.get("load", {}).get("gbps")), flush=True)


if __name__ == "__main__":
    main(sys.argv)
