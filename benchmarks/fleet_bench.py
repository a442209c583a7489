#!/usr/bin/env python3
"""gpunuma fleet benchmark: what a provisioning run costs in host round-trips.

    .venv/bin/python benchmarks/fleet_bench.py [--hosts 10] [--forks 10] [--keep]
    .venv/bin/python benchmarks/fleet_bench.py --baseline ../gpunuma-base --rounds 2

Starts N systemd containers from the fleet's base image
(scripts/build-base-image.sh), each with two CPU-only instances, and runs,
side by side in one session:

- the floor: ``ansible -m ping`` over the fleet (one module round-trip per
  host; the cheapest thing Ansible can do to every host);
- ``playbooks/site.yml``, first converge;
- ``playbooks/site.yml`` again, the idempotent re-run (must change nothing).

It prints each wall time and its ratio to the floor, the tasks per host (ok,
changed, skipped), the round-trips per host (tasks that ran a module on the
host: not skipped, not delegated to the controller, not controller-only
actions; a task delegated to its own host is one), the CPU-seconds each
run cost (Ansible on the controller with every process it waited for, and
the rest of this machine: with local containers, their modules and
services), and the slowest tasks of each run. The ratios are what the fleet-speed targets are
stated in; absolute seconds depend on the controller's cores (a 2-core
controller with N containers on the same machine is CPU-bound long before
the network is).

With ``--baseline CHECKOUT`` (another checkout, e.g. ``git worktree add
../gpunuma-base <rev>``) the two revisions' site.yml runs alternate for
``--rounds`` rounds, each on a fresh fleet of its own and with the same
inventory, and are printed side by side: medians and ranges, the ratios to
each run's floor, tasks and round-trips a host of the first converge, and a
verdict for each run by a stated rule (``RULE``: measurable only when the
ranges do not overlap; fewer than 2 rounds give no verdict).

With ``--kubelet`` every container is a Kubernetes node as well: it runs
the STAND-IN kubelet of the molecule scenario ``kubelet``
(molecule/kubelet/files/kubelet-standin.py, a small program that checks a
KubeletConfiguration and its checkpoints the way the kubelet documents it
and serves healthz; not the kubelet) under ``kubelet.service``, with a fresh
config, and the inventory sets ``gpunuma_kubelet: true``: the first converge
then includes each node's kubelet change (stop, stale checkpoint removed,
config written, start, healthz), the re-run its check.

Requires root (or a user in the docker group), a running Docker engine and
the base image. Containers are removed at the end unless --keep.
"""

import argparse
import collections
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
IMAGE = "gpunuma/debian-systemd:bookworm"
INOTIFY_PER_CONTAINER = 6

# Actions that run on the controller only: no round-trip to the host.
CONTROLLER_ACTIONS = {
    "set_fact", "ansible.builtin.set_fact", "debug", "ansible.builtin.debug",
    "assert", "ansible.builtin.assert", "fail", "ansible.builtin.fail",
    "include_role", "ansible.builtin.include_role", "import_role", "ansible.builtin.import_role",
    "include_tasks", "ansible.builtin.include_tasks", "include_vars", "ansible.builtin.include_vars",
    "meta", "ansible.builtin.meta", "add_host", "ansible.builtin.add_host",
    "group_by", "ansible.builtin.group_by", "validate_argument_spec",
    "ansible.builtin.validate_argument_spec", "gather_facts",
}

HOST_VARS = """\
ansible_connection: community.docker.docker
ansible_python_interpreter: /usr/bin/python3
gpunuma_profile: preferred
memlock_limit: 4M
memlock_groups: [gpunuma]
autonuma_numa_balancing: 0
gpunuma_instances:
  - name: worker-a
    numa_node: 0
    share_cpus: true
    command: [/bin/sleep, infinity]
  - name: worker-b
    numa_node: 0
    share_cpus: true
    command: [/bin/sleep, infinity]
"""


KUBELET_CONFIG = "/etc/kubernetes/kubelet/config.json"
KUBELET_UNIT = """[Unit]
Description=STAND-IN kubelet for gpunuma benchmarks (not the kubelet; molecule/kubelet/files/kubelet-standin.py)

[Service]
Environment=STANDIN_NUMA_NODES=0
ExecStart=/usr/local/bin/kubelet-standin --config %s --root-dir /var/lib/kubelet
Restart=no

[Install]
WantedBy=multi-user.target
""" % KUBELET_CONFIG
KUBELET_VARS = """\
gpunuma_kubelet: true
kubelet_topology_config_path: %s
kubelet_topology_kubelet_version: "1.31"
kubelet_topology_health_retries: 15
kubelet_topology_health_delay: 1
""" % KUBELET_CONFIG


KUBELET_NOTE = " (Kubernetes nodes: the STAND-IN kubelet)"


# A fresh node's config: no NUMA policy (the kubelet's defaults), its healthz where the role asks.
FRESH_KUBELET_CONFIG = {"kind": "KubeletConfiguration", "apiVersion": "kubelet.config.k8s.io/v1beta1",
                        "cgroupDriver": "systemd", "healthzBindAddress": "127.0.0.1", "healthzPort": 10248}


def start_kubelets(names):
    """Each container a fresh Kubernetes node: the stand-in kubelet running on a config without NUMA policies
    (also tests/integration/test_site_kubelet.py's node)."""
    standin = os.path.join(REPO, "molecule", "kubelet", "files", "kubelet-standin.py")
    config = json.dumps(FRESH_KUBELET_CONFIG)
    script = ("install -D -m 0755 /dev/stdin /usr/local/bin/kubelet-standin && mkdir -p %s /var/lib/kubelet && "
              "printf '%%s\\n' '%s' > %s && printf '%%s' '%s' > /etc/systemd/system/kubelet.service && "
              "printf '%%s' '{\"policyName\": \"none\", \"checksum\": 0}' > /var/lib/kubelet/cpu_manager_state && "
              "systemctl daemon-reload && systemctl enable --now kubelet.service"
              % (os.path.dirname(KUBELET_CONFIG), config, KUBELET_CONFIG, KUBELET_UNIT))
    for name in names:
        with open(standin, "rb") as handle:
            subprocess.run(["docker", "exec", "-i", name, "sh", "-c", script], stdin=handle, check=True,
                           capture_output=True)


def start_containers(count, prefix):
    names = ["%s-%02d" % (prefix, i) for i in range(count)]
    for name in names:
        subprocess.run(
            ["docker", "run", "-d", "--name", name, "--cap-add", "SYS_ADMIN", "--cap-add", "SYS_NICE",
             "--cgroupns", "host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run",
             "--tmpfs", "/run/lock", "--stop-signal", "SIGRTMIN+3", IMAGE, "/lib/systemd/systemd"],
            check=True, capture_output=True)
    deadline = time.time() + 300
    for name in names:
        while True:
            state = subprocess.run(["docker", "exec", name, "systemctl", "is-system-running", "--wait"],
                                   capture_output=True, text=True).stdout.strip()
            if state in ("running", "degraded"):
                break
            if time.time() > deadline:
                raise SystemExit("container %s did not finish booting" % name)
            time.sleep(1)
    return names


def remove_containers(names):
    if names:
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True)


def write_inventory(work, names, kubelet=False):
    inv = os.path.join(work, "inventory")
    os.makedirs(os.path.join(inv, "host_vars"))
    with open(os.path.join(inv, "hosts.yml"), "w") as handle:
        handle.write("all:\n  children:\n    bench:\n      hosts:\n")
        for name in names:
            handle.write("        %s: {}\n" % name)
    with open(os.path.join(inv, "host_vars", "all.yml"), "w"):
        pass
    os.makedirs(os.path.join(inv, "group_vars"))
    with open(os.path.join(inv, "group_vars", "bench.yml"), "w") as handle:
        handle.write(HOST_VARS)
        handle.write("gpu_topology_controller_dir: %s\n" % os.path.join(work, "topology"))
        if kubelet:
            handle.write(KUBELET_VARS)
    return os.path.join(inv, "hosts.yml")


def ansible_env(forks, json_out=True, repo=REPO):
    env = dict(os.environ)
    env.update({
        "ANSIBLE_CONFIG": os.path.join(repo, "ansible.cfg"),
        "ANSIBLE_FORKS": str(forks),
        "ANSIBLE_HOST_KEY_CHECKING": "False",
        "ANSIBLE_NOCOLOR": "1",
    })
    if json_out:
        env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.posix.json"
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def machine_busy_seconds():
    """CPU-seconds this machine has spent busy since boot (every CPU: /proc/stat's user, nice, system, irq,
    softirq and steal), or None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as handle:
            fields = [int(v) for v in handle.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    busy = sum(fields[:3]) + sum(fields[5:8])
    return busy / float(os.sysconf("SC_CLK_TCK"))


def children_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_timed(argv, env, repo=REPO, cpu=None):
    """``(wall seconds, CompletedProcess)``. With ``cpu`` (a dict), also what the run cost in CPU-seconds:
    ``controller`` (the command and every process it waited for: Ansible's workers, ``docker exec`` clients)
    and ``machine`` (every process of this machine meanwhile: the containers' modules and services too)."""
    start, busy, own = time.perf_counter(), machine_busy_seconds(), children_cpu_seconds()
    proc = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if cpu is not None:
        after = machine_busy_seconds()
        cpu["controller"] = children_cpu_seconds() - own
        cpu["machine"] = None if busy is None or after is None else after - busy
    return wall, proc


def ping_floor(inventory, forks, repeats, repo=REPO):
    bindir = os.path.dirname(sys.executable)
    samples = []
    for _ in range(repeats):
        wall, proc = run_timed([os.path.join(bindir, "ansible"), "-i", inventory, "all", "-m", "ping"],
                               ansible_env(forks, json_out=False, repo=repo), repo)
        if proc.returncode != 0:
            raise SystemExit("ping failed:\n" + proc.stdout[-3000:] + proc.stderr[-3000:])
        samples.append(wall)
    samples.sort()
    return samples[len(samples) // 2]


def _task_seconds(task):
    duration = task.get("task", {}).get("duration", {})
    try:
        start = datetime.datetime.strptime(duration["start"], "%Y-%m-%dT%H:%M:%S.%fZ")
        end = datetime.datetime.strptime(duration["end"], "%Y-%m-%dT%H:%M:%S.%fZ")
    except (KeyError, TypeError, ValueError):
        return 0.0
    return (end - start).total_seconds()


def on_controller(result):
    """Whether a task result ran on the controller: delegated to localhost (a task delegated to its own host, as
    the discovery is when it reads the node, is a round trip to that host)."""
    delegated = result.get("_ansible_delegated_vars") or {}
    if not delegated:
        return False
    return delegated.get("ansible_connection") == "local" or delegated.get("ansible_host") in ("localhost", "127.0.0.1", "::1")


def summarise(report):
    """Per-host task counts and round-trips, and task wall times, from the json callback."""
    per_host = collections.defaultdict(collections.Counter)
    slow = []
    for play in report.get("plays", []):
        for task in play.get("tasks", []):
            name = task.get("task", {}).get("name", "?")
            slow.append((_task_seconds(task), name))
            for host, result in task.get("hosts", {}).items():
                counts = per_host[host]
                action = result.get("action", "")
                if result.get("skipped"):
                    counts["skipped"] += 1
                    continue
                counts["changed" if result.get("changed") else "ok"] += 1
                if result.get("failed"):
                    counts["failed"] += 1
                if action not in CONTROLLER_ACTIONS and not on_controller(result):
                    # A loop runs the module once per item that was not skipped.
                    items = result.get("results")
                    if "gpunuma_round_trips" in result:
                        # gpunuma_converge runs its module itself (0 or 1 times) and says how often.
                        counts["round_trips"] += result["gpunuma_round_trips"]
                    elif isinstance(items, list):
                        counts["round_trips"] += sum(1 for item in items if not item.get("skipped"))
                    else:
                        counts["round_trips"] += 1
    slow.sort(reverse=True)
    return per_host, slow


def site_run(inventory, forks, label, repo=REPO, cpu=None):
    bindir = os.path.dirname(sys.executable)
    wall, proc = run_timed([os.path.join(bindir, "ansible-playbook"), "-i", inventory,
                            os.path.join(repo, "playbooks", "site.yml")], ansible_env(forks, repo=repo), repo, cpu)
    try:
        report = json.loads(proc.stdout[proc.stdout.index("{"):])
    except ValueError:
        raise SystemExit("%s: no JSON report (rc=%s):\n%s\n%s"
                         % (label, proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:]))
    if proc.returncode != 0:
        failures = ["%s: %s: %s" % (host, task.get("task", {}).get("name"), result.get("msg"))
                    for play in report.get("plays", []) for task in play.get("tasks", [])
                    for host, result in task.get("hosts", {}).items() if result.get("failed")]
        raise SystemExit("%s failed (rc=%s):\n%s\n%s"
                         % (label, proc.returncode, "\n".join(failures[:10]), proc.stderr[-3000:]))
    return wall, report


def mean_counts(per_host, names):
    """Means over the fleet's hosts (localhost, which the last plays report on, is not one)."""
    hosts = [per_host[name] for name in names]
    keys = ("ok", "changed", "skipped", "round_trips")
    return {k: sum(h[k] for h in hosts) / float(len(hosts) or 1) for k in keys}


def check_inotify(parser, hosts):
    """Stop with the sysctl to run when the fleet would exhaust the host's inotify instances."""
    # Each systemd container holds several inotify instances of the host's
    # (one user, root); past the limit a container's systemd never finishes
    # booting. Measured: 128 (a common default) stops at about 21 containers.
    needed = INOTIFY_PER_CONTAINER * hosts + 64
    try:
        with open("/proc/sys/fs/inotify/max_user_instances") as handle:
            have = int(handle.read())
    except (OSError, ValueError):
        have = None
    if have is not None and have < needed:
        parser.error("%d systemd containers need about %d inotify instances, fs.inotify.max_user_instances is %d; "
                     "raise it first: sysctl -w fs.inotify.max_user_instances=%d" % (hosts, needed, have, needed))


def cpu_split(cpu):
    """``(controller, rest of the machine)`` CPU-seconds of one run (``run_timed``), or None when not measured."""
    if not cpu or cpu.get("machine") is None:
        return None
    return cpu["controller"], max(0.0, cpu["machine"] - cpu["controller"])


def cpu_cells(cpu, wall):
    """``controller, rest of the machine, busy share`` of one run's CPU-seconds (``run_timed``), as text."""
    split = cpu_split(cpu)
    if split is None:
        return "-", "-", "-"
    share = cpu["machine"] / (wall * (os.cpu_count() or 1)) if wall else 0.0
    return "%.1f" % split[0], "%.1f" % split[1], "%.0f %%" % (100 * share)


def print_cpu(rows):
    """Where each run's time went, in CPU-seconds: Ansible on the controller (the command and the processes
    it waited for) and the rest of this machine (on a fleet of local containers: their modules and services)."""
    print()
    print("CPU-seconds (controller: ansible and what it waited for; rest: the rest of this machine, the local "
          "containers' modules and services included):")
    print("%-28s %12s %12s %16s" % ("run", "controller", "rest", "busy of wall"))
    for label, cpu, wall in rows:
        print("%-28s %12s %12s %16s" % ((label,) + cpu_cells(cpu, wall)))


def print_report(args, forks, boot, floor, names, converge, first, rerun, second, cpu=None):
    """Print the side-by-side table and the slowest tasks; return the re-run's changed task results."""
    cpus = os.cpu_count()
    print("gpunuma fleet benchmark: %d systemd containers%s, forks %d, controller with %s CPUs (%d s to boot)"
          % (args.hosts, KUBELET_NOTE if getattr(args, "kubelet", False) else "", forks, cpus, boot))
    print()
    print("%-28s %10s %9s %8s %8s %8s %12s" % ("run", "wall s", "x floor", "ok", "changed", "skipped", "round-trips"))
    print("%-28s %10.2f %9s %8s %8s %8s %12s" % ("ping (floor)", floor, "1.0x", "-", "-", "-", "1"))
    results = {}
    for label, wall, report in (("site.yml first converge", converge, first),
                                ("site.yml idempotent re-run", rerun, second)):
        per_host, slow = summarise(report)
        means = mean_counts(per_host, names)
        results[label] = (wall, per_host, slow)
        print("%-28s %10.2f %8.1fx %8.1f %8.1f %8.1f %12.1f"
              % (label, wall, wall / floor, means["ok"], means["changed"], means["skipped"],
                 means["round_trips"]))
    cpu = cpu or {}
    print_cpu([("site.yml first converge", cpu.get("first"), converge),
               ("site.yml idempotent re-run", cpu.get("rerun"), rerun)])
    changed = sum(h["changed"] for h in results["site.yml idempotent re-run"][1].values())
    print()
    print("idempotent re-run: %d changed task results over the fleet (must be 0)" % changed)
    for label, (wall, _per_host, slow) in results.items():
        print()
        print("slowest tasks, %s:" % label)
        for seconds, name in slow[:args.slowest]:
            print("  %7.2f s  %s" % (seconds, name))
    return changed


def measure(args, forks, repo):
    """One measurement of ``repo``'s site.yml on a fleet of its own: boot, floor, first converge, re-run."""
    prefix = "gpunuma-bench-%s" % uuid.uuid4().hex[:6]
    names = []
    with tempfile.TemporaryDirectory(prefix="gpunuma-fleet-bench-") as work:
        try:
            started = time.perf_counter()
            names = start_containers(args.hosts, prefix)
            if args.kubelet:
                start_kubelets(names)
            boot = time.perf_counter() - started
            inventory = write_inventory(work, names, args.kubelet)
            floor = ping_floor(inventory, forks, args.ping_repeats, repo)
            first_cpu, second_cpu = {}, {}
            converge, first = site_run(inventory, forks, "first converge", repo, first_cpu)
            rerun, second = site_run(inventory, forks, "idempotent re-run", repo, second_cpu)
        finally:
            if not args.keep:
                remove_containers(names)
    return {"boot": boot, "floor": floor, "names": names, "converge": converge, "first": first,
            "rerun": rerun, "second": second, "cpu": {"first": first_cpu, "rerun": second_cpu}}


def round_order(rounds):
    """The order the two revisions run in each round: in turns, so a machine that drifts favours neither."""
    return [("this", "baseline") if index % 2 == 0 else ("baseline", "this") for index in range(rounds)]


def spread(samples):
    """``(median, low, high)`` of a sample of seconds."""
    ordered = sorted(samples)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2.0
    return median, ordered[0], ordered[-1]


RULE = ("the revisions run in turns, each on a fleet of its own; a difference is measurable only when the two "
        "ranges of wall times do not overlap (and each revision ran at least 2 rounds)")


def verdict(this, baseline):
    """``(ratio of the medians, words)`` for two samples of wall seconds, by RULE."""
    ratio = spread(this)[0] / spread(baseline)[0]
    if min(len(this), len(baseline)) < 2:
        return ratio, "one round each: no verdict (run --rounds 2 or more)"
    if max(this) < min(baseline):
        return ratio, "measurable: faster"
    if min(this) > max(baseline):
        return ratio, "measurable: slower"
    return ratio, "no measurable difference"


def _revision(repo):
    proc = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() or os.path.basename(repo)


def print_comparison(args, forks, repos, samples):
    """Both revisions side by side (medians and ranges over the rounds), and the verdict of each run by RULE."""
    print("gpunuma fleet benchmark: %d systemd containers%s, forks %d, controller with %s CPUs, %d rounds"
          % (args.hosts, KUBELET_NOTE if getattr(args, "kubelet", False) else "", forks, os.cpu_count(), args.rounds))
    print()
    header = ("revision", "", "floor s", "first converge s", "re-run s", "tasks", "round-trips")
    print("%-12s %-10s %-22s %-22s %-22s %7s %12s" % header)
    walls = {}
    for side in ("this", "baseline"):
        runs = samples[side]
        floors = [run["floor"] for run in runs]
        firsts = [run["converge"] for run in runs]
        reruns = [run["rerun"] for run in runs]
        walls[side] = (firsts, reruns)
        first = [mean_counts(summarise(run["first"])[0], run["names"]) for run in runs]
        cells = ["%.1f [%.1f-%.1f]" % spread(values) for values in (floors, firsts, reruns)]
        ratios = "%.1fx / %.1fx" % (spread([r["converge"] / r["floor"] for r in runs])[0],
                                    spread([r["rerun"] / r["floor"] for r in runs])[0])
        print("%-12s %-10s %-22s %-22s %-22s %7.1f %12.1f" % (
            side, _revision(repos[side])[:10], cells[0], cells[1], cells[2],
            sum(m["ok"] + m["changed"] + m["skipped"] for m in first) / len(first),
            sum(m["round_trips"] for m in first) / len(first)))
        print("%-12s %-10s x floor (medians), first converge / re-run: %s" % ("", "", ratios))
        splits = [split for split in (cpu_split((run.get("cpu") or {}).get("first")) for run in runs) if split]
        if splits:
            print("%-12s %-10s first converge CPU-seconds (medians): controller %.1f, rest of this machine %.1f"
                  % ("", "", spread([c for c, _rest in splits])[0], spread([r for _c, r in splits])[0]))
    print()
    print("rule: " + RULE)
    for index, label in enumerate(("first converge", "idempotent re-run")):
        ratio, words = verdict(walls["this"][index], walls["baseline"][index])
        print("%s: this / baseline = %.2f (medians): %s" % (label, ratio, words))
    return sum(sum(h["changed"] for h in summarise(run["second"])[0].values())
               for side in samples for run in samples[side])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=10, help="containers in the fleet (default 10)")
    parser.add_argument("--forks", type=int, default=None, help="Ansible forks (default: --hosts)")
    parser.add_argument("--ping-repeats", type=int, default=3, help="ping runs; the median is the floor")
    parser.add_argument("--slowest", type=int, default=8, help="slowest tasks listed per run")
    parser.add_argument("--keep", action="store_true", help="leave the containers running")
    parser.add_argument("--kubelet", action="store_true",
                        help="every container a Kubernetes node running the STAND-IN kubelet (gpunuma_kubelet)")
    parser.add_argument("--baseline", metavar="CHECKOUT",
                        help="another checkout of gpunuma (e.g. a git worktree of the last release): its site.yml "
                             "runs in turns with this one's, each on a fleet of its own, and both are printed "
                             "side by side with a verdict")
    parser.add_argument("--rounds", type=int, default=1,
                        help="with --baseline: measurements of each revision (2 or more for a verdict; default 1)")
    args = parser.parse_args()
    if args.hosts < 1 or args.hosts > 200:
        parser.error("--hosts must be between 1 and 200, got %d" % args.hosts)
    if args.rounds < 1:
        parser.error("--rounds must be 1 or more, got %d" % args.rounds)
    if args.baseline and not os.path.isfile(os.path.join(args.baseline, "playbooks", "site.yml")):
        parser.error("--baseline %s is not a gpunuma checkout (no playbooks/site.yml)" % args.baseline)
    check_inotify(parser, args.hosts)
    forks = args.forks or args.hosts

    if not args.baseline:
        run = measure(args, forks, REPO)
        changed = print_report(args, forks, run["boot"], run["floor"], run["names"], run["converge"], run["first"],
                               run["rerun"], run["second"], run["cpu"])
        return 1 if changed else 0

    repos = {"this": REPO, "baseline": os.path.abspath(args.baseline)}
    samples = {"this": [], "baseline": []}
    for order in round_order(args.rounds):
        for side in order:
            samples[side].append(measure(args, forks, repos[side]))
    changed = print_comparison(args, forks, repos, samples)
    print()
    print("idempotent re-runs: %d changed task results over every fleet (must be 0)" % changed)
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
