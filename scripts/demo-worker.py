#!/usr/bin/env python3
"""Stand-in inference worker of the live demo (scripts/demo.sh).

Started by a gpunuma-<name>.service unit through numactl, like a real server,
it reports the binding the kernel gives it, as read from inside the process:

- cpus: os.sched_getaffinity(0) (the CPUs it may run on);
- mems_allowed: Mems_allowed_list of /proc/self/status (the cpuset's memory nodes);
- mempolicy: the memory policy of its mappings in /proc/self/numa_maps
  (bind:0 under numactl --membind=0, prefer:0 under --preferred=0,
  default when no policy was set).

The report is printed once at start (one JSON line, so it lands in the
journal) and served as JSON on GET / of an HTTP port. Standard library only.

    demo-worker.py [--port 8081] [--name NAME]
"""

import argparse
import http.server
import json
import os
import socket
import sys
import time


def cpu_list(cpus):
    """[0, 1, 2, 5] -> "0-2,5" (the kernel's list format)."""
    ranges, start, prev = [], None, None
    for cpu in sorted(cpus):
        if start is None:
            start = prev = cpu
        elif cpu == prev + 1:
            prev = cpu
        else:
            ranges.append((start, prev))
            start = prev = cpu
    if start is not None:
        ranges.append((start, prev))
    return ",".join(str(a) if a == b else "%d-%d" % (a, b) for a, b in ranges)


def status_field(name):
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key == name:
                return value.strip()
    return None


def mempolicies():
    """Policy -> number of mappings with it, from /proc/self/numa_maps
    (second field of each line: default, bind:N, prefer:N, interleave:N-M...)."""
    counts = {}
    try:
        with open("/proc/self/numa_maps", encoding="ascii") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) > 1:
                    counts[fields[1]] = counts.get(fields[1], 0) + 1
    except OSError as exc:  # a kernel without NUMA support has no numa_maps
        return {"unreadable: %s" % exc.strerror: 1}
    return counts


def binding(name):
    policies = mempolicies()
    return {
        "worker": name,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "user": os.environ.get("USER") or str(os.getuid()),
        "cpus": cpu_list(os.sched_getaffinity(0)),
        "cpus_allowed": status_field("Cpus_allowed_list"),
        "mems_allowed": status_field("Mems_allowed_list"),
        # The process policy shows on every mapping without one of its own:
        # the most common entry is it.
        "mempolicy": max(policies, key=policies.get) if policies else None,
        "mempolicies": policies,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--name", default=os.environ.get("GPUNUMA_INSTANCE", "worker"))
    args = parser.parse_args(argv)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = (json.dumps(binding(args.name), sort_keys=True) + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *fargs):  # keep the journal to the binding lines
            pass

    server = http.server.HTTPServer(("0.0.0.0", args.port), Handler)
    print(json.dumps(binding(args.name), sort_keys=True), flush=True)
    print("demo-worker %s: serving its binding on port %d" % (args.name, args.port), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
