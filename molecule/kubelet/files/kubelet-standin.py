#!/usr/bin/python3
"""STAND-IN for the kubelet, for gpunuma's molecule scenario `kubelet` only.

This is not the kubelet and runs no pods. The upstream kubelet itself runs in
tests/integration/test_kubelet_real.py (fresh node to static and back with
its checkpoints, reservedMemory accepted, a Guaranteed pod pinned, a refused
change restored, the Memory Manager checkpoint a reboot left behind moved
aside before it starts, DRA gpu_and_cpu accepted), but only on this host's
one NUMA node. This small program plays the kubelet for what needs a machine
the host is not (several NUMA nodes, more than 8 of them): it reads the KubeletConfiguration
and the CPU / Memory Manager checkpoint files, refuses to start exactly where
the real kubelet documents that it would, writes the checkpoints under the
configured policies (the real kubelet writes them even under the default
policies), and serves a healthz endpoint. Each start is counted in
/var/lib/kubelet-standin/starts, so a test can prove a run did not restart it.

Refusals (exit status 1, message on stderr, as the real kubelet's):
- a checkpoint records another policy than the config (CPU / Memory Manager);
- memoryManagerPolicy Static whose reservedMemory sum per resource differs
  from kubeReserved + systemReserved + the hard eviction threshold (100Mi
  while evictionHard is absent), or names a NUMA node the machine lacks;
- more than 8 NUMA nodes under a Topology Manager policy other than none
  without the max-allowable-numa-nodes option;
- cpuManagerPolicy static with no CPU reservation; cpuManagerPolicyOptions
  under none; reservedSystemCPUs with system/kubeReservedCgroup;
- policy names outside none/static (CPU), None/Static (Memory).

The machine's NUMA nodes come from STANDIN_NUMA_NODES (e.g. "0" or "0-33"),
so the scenario does not depend on the test host's hardware.
"""

import argparse
import decimal
import http.server
import json
import os
import re
import signal
import sys
import time

STATE = os.environ.get("STANDIN_STATE_DIR", "/var/lib/kubelet-standin")
_Q = re.compile(r"^([0-9.]+)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_POW = {"Ki": 1024, "Mi": 1024 ** 2, "Gi": 1024 ** 3, "Ti": 1024 ** 4, "k": 1000, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12}


def quantity(text):
    match = _Q.match(str(text).strip())
    if not match:
        raise ValueError("bad quantity %r" % text)
    return decimal.Decimal(match.group(1)) * _POW.get(match.group(2) or "", 1)


def nodes(text):
    out = set()
    for part in text.split(","):
        if "-" in part:
            low, high = part.split("-")
            out.update(range(int(low), int(high) + 1))
        elif part.strip():
            out.add(int(part))
    return out


def load(path):
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    if text.lstrip().startswith("{"):
        return json.loads(text)
    import yaml  # only for YAML configs

    return yaml.safe_load(text)


def refuse(message):
    sys.stderr.write("E kubelet-standin: %s\n" % message)
    sys.stderr.flush()
    sys.exit(1)


def check(config, state_dir, machine_nodes):
    if config.get("kind") != "KubeletConfiguration":
        refuse("failed to load kubelet config file: kind %r is not KubeletConfiguration" % config.get("kind"))
    cpu = config.get("cpuManagerPolicy", "none")
    mem = config.get("memoryManagerPolicy", "None")
    topo = config.get("topologyManagerPolicy", "none")
    if cpu not in ("none", "static"):
        refuse("unknown policy: \"%s\"" % cpu)
    if mem not in ("None", "Static"):
        refuse("unknown memory manager policy: \"%s\"" % mem)
    if config.get("cpuManagerPolicyOptions") and cpu == "none":
        refuse("received unsupported options %r for none policy" % config["cpuManagerPolicyOptions"])
    reserved_cpus = config.get("reservedSystemCPUs")
    if reserved_cpus and (config.get("systemReservedCgroup") or config.get("kubeReservedCgroup")):
        refuse("--system-reserved-cgroup or --kube-reserved-cgroup must not be specified with --reserved-cpus")
    if cpu == "static" and not reserved_cpus:
        total = sum(quantity((config.get(k) or {}).get("cpu", "0")) for k in ("kubeReserved", "systemReserved"))
        if not total:
            refuse("[cpumanager] unable to determine reserved CPU resources for static policy")
    options = config.get("topologyManagerPolicyOptions") or {}
    limit = int(options.get("max-allowable-numa-nodes", "8"))
    if topo != "none" and len(machine_nodes) > limit:
        refuse("unsupported on machines with more than %d NUMA Nodes" % limit)
    if mem == "Static":
        expected = {}
        for key in ("kubeReserved", "systemReserved"):
            for res, value in (config.get(key) or {}).items():
                if res == "memory" or res.startswith("hugepages-"):
                    expected[res] = expected.get(res, 0) + quantity(value)
        eviction = config.get("evictionHard")
        threshold = "100Mi" if eviction is None else eviction.get("memory.available")
        if threshold:
            expected["memory"] = expected.get("memory", 0) + quantity(threshold)
        got = {}
        for entry in config.get("reservedMemory") or []:
            if entry.get("numaNode") not in machine_nodes:
                refuse("[memorymanager] the reserved memory configuration for NUMA node %s, but the machine has NUMA "
                       "nodes %s" % (entry.get("numaNode"), sorted(machine_nodes)))
            for res, value in (entry.get("limits") or {}).items():
                got[res] = got.get(res, 0) + quantity(value)
        for res in sorted(set(expected) | set(got)):
            if expected.get(res, 0) != got.get(res, 0):
                refuse("[memorymanager] the total amount \"%s\" of type %q is not equal to the value \"%s\" determined "
                       "by Node Allocatable feature".replace("%q", "%r") % (got.get(res, 0), res, expected.get(res, 0)))
    for name, policy in (("cpu_manager_state", cpu), ("memory_manager_state", mem)):
        path = os.path.join(state_dir, name)
        if os.path.exists(path):
            try:
                recorded = json.load(open(path, encoding="utf-8")).get("policyName")
            except ValueError:
                refuse("could not restore state from checkpoint: %s is corrupt" % path)
            if recorded != policy:
                refuse("could not restore state from checkpoint: configured policy \"%s\" differs from state "
                       "checkpoint policy \"%s\", please drain this node and delete the %s checkpoint file \"%s\" "
                       "before restarting Kubelet" % (policy, recorded, "CPU manager" if name.startswith("cpu") else
                                                      "memory manager", path))
        else:
            with open(path, "w", encoding="utf-8") as handle:
                json.dump({"policyName": policy, "checksum": 0}, handle)


def main():
    parser = argparse.ArgumentParser(description="STAND-IN kubelet for gpunuma's tests (not the kubelet)")
    parser.add_argument("--config", required=True)
    parser.add_argument("--root-dir", default="/var/lib/kubelet")
    args = parser.parse_args()
    os.makedirs(STATE, exist_ok=True)
    with open(os.path.join(STATE, "starts"), "a", encoding="utf-8") as handle:
        handle.write("%d %f\n" % (os.getpid(), time.time()))
    try:
        config = load(args.config)
    except (OSError, ValueError) as exc:
        refuse("failed to load kubelet config file %s: %s" % (args.config, exc))
    os.makedirs(args.root_dir, exist_ok=True)
    check(config, args.root_dir, nodes(os.environ.get("STANDIN_NUMA_NODES", "0")))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path == "/healthz":
                body = b"ok"
            elif self.path == "/configz":
                body = json.dumps({"kubeletconfig": config}).encode()
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json" if self.path == "/configz" else "text/plain")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    server = http.server.HTTPServer((config.get("healthzBindAddress", "127.0.0.1"), int(config.get("healthzPort", 10248))),
                                    Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sys.stderr.write("I kubelet-standin: started (cpu %s, memory %s, topology %s)\n" % (
        config.get("cpuManagerPolicy", "none"), config.get("memoryManagerPolicy", "None"),
        config.get("topologyManagerPolicy", "none")))
    sys.stderr.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
