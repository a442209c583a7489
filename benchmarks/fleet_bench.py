#!/usr/bin/env python3
"""gpunuma fleet benchmark: what a provisioning run costs in host round-trips.

    .venv/bin/python benchmarks/fleet_bench.py [--hosts 10] [--forks 10] [--keep]

Starts N systemd containers from the fleet's base image
(scripts/build-base-image.sh), each with two CPU-only instances, and runs,
side by side in one session:

- the floor: ``ansible -m ping`` over the fleet (one module round-trip per
  host; the cheapest thing Ansible can do to every host);
- ``playbooks/site.yml``, first converge;
- ``playbooks/site.yml`` again, the idempotent re-run (must change nothing).

It prints each wall time and its ratio to the floor, the tasks per host (ok,
changed, skipped), the round-trips per host (tasks that ran a module on the
host: not skipped, not delegated, not controller-only actions), and the
slowest tasks of each run. The ratios are what the fleet-speed targets are
stated in; absolute seconds depend on the controller's cores (a 2-core
controller with N containers on the same machine is CPU-bound long before
the network is).

Requires root (or a user in the docker group), a running Docker engine and
the base image. Containers are removed at the end unless --keep.
"""

import argparse
import collections
import datetime
import json
import os
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


def write_inventory(work, names):
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
    return os.path.join(inv, "hosts.yml")


def ansible_env(forks, json_out=True):
    env = dict(os.environ)
    env.update({
        "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
        "ANSIBLE_FORKS": str(forks),
        "ANSIBLE_HOST_KEY_CHECKING": "False",
        "ANSIBLE_NOCOLOR": "1",
    })
    if json_out:
        env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.posix.json"
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def run_timed(argv, env):
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    return time.perf_counter() - start, proc


def ping_floor(inventory, forks, repeats):
    bindir = os.path.dirname(sys.executable)
    samples = []
    for _ in range(repeats):
        wall, proc = run_timed([os.path.join(bindir, "ansible"), "-i", inventory, "all", "-m", "ping"],
                               ansible_env(forks, json_out=False))
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
                delegated = result.get("_ansible_delegated_vars", {}).get("ansible_host")
                if action not in CONTROLLER_ACTIONS and not delegated:
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


def site_run(inventory, forks, label):
    bindir = os.path.dirname(sys.executable)
    wall, proc = run_timed([os.path.join(bindir, "ansible-playbook"), "-i", inventory,
                            os.path.join(REPO, "playbooks", "site.yml")], ansible_env(forks))
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


def print_report(args, forks, boot, floor, names, converge, first, rerun, second):
    """Print the side-by-side table and the slowest tasks; return the re-run's changed task results."""
    cpus = os.cpu_count()
    print("gpunuma fleet benchmark: %d systemd containers, forks %d, controller with %s CPUs (%d s to boot)"
          % (args.hosts, forks, cpus, boot))
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
    changed = sum(h["changed"] for h in results["site.yml idempotent re-run"][1].values())
    print()
    print("idempotent re-run: %d changed task results over the fleet (must be 0)" % changed)
    for label, (wall, _per_host, slow) in results.items():
        print()
        print("slowest tasks, %s:" % label)
        for seconds, name in slow[:args.slowest]:
            print("  %7.2f s  %s" % (seconds, name))
    return changed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=10, help="containers in the fleet (default 10)")
    parser.add_argument("--forks", type=int, default=None, help="Ansible forks (default: --hosts)")
    parser.add_argument("--ping-repeats", type=int, default=3, help="ping runs; the median is the floor")
    parser.add_argument("--slowest", type=int, default=8, help="slowest tasks listed per run")
    parser.add_argument("--keep", action="store_true", help="leave the containers running")
    args = parser.parse_args()
    if args.hosts < 1 or args.hosts > 200:
        parser.error("--hosts must be between 1 and 200, got %d" % args.hosts)
    check_inotify(parser, args.hosts)
    forks = args.forks or args.hosts

    prefix = "gpunuma-bench-%s" % uuid.uuid4().hex[:6]
    names = []
    with tempfile.TemporaryDirectory(prefix="gpunuma-fleet-bench-") as work:
        try:
            started = time.perf_counter()
            names = start_containers(args.hosts, prefix)
            boot = time.perf_counter() - started
            inventory = write_inventory(work, names)
            floor = ping_floor(inventory, forks, args.ping_repeats)
            converge, first = site_run(inventory, forks, "first converge")
            rerun, second = site_run(inventory, forks, "idempotent re-run")
        finally:
            if not args.keep:
                remove_containers(names)

    changed = print_report(args, forks, boot, floor, names, converge, first, rerun, second)
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
