"""Shared helpers of the fleet verifiers (test_roles_*.py).

Expectations come from the plan each node recorded (/etc/gpunuma/plan.json)
and from the scenario's own variables (host_vars/*.yml), never from numbers
copied here: the live members take the CPUs of whatever host runs them.
Live state is read where it is real: /proc/<pid>/status, numa_maps, limits
and environ of the running instances, and systemctl.
"""

import json
from pathlib import Path

import yaml

SCENARIO = Path(__file__).resolve().parents[1]
UNIT_DIR = "/etc/systemd/system"
PLAN_PATH = "/etc/gpunuma/plan.json"
MANAGED = "# Managed by gpunuma; local edits are overwritten"
# memlock_limit in group_vars/gpunuma_fleet.yml (4M) as systemd and
# limits.conf count it.
MEMLOCK_BYTES = 4 * 1024 * 1024
# numa_maps policy names of the plan's mem_policy.
NUMA_MAPS_POLICY = {"bind": "bind", "preferred": "prefer", "interleave": "interleave"}


def scenario_host_vars(name):
    return yaml.safe_load((SCENARIO / "host_vars" / f"{name}.yml").read_text())


def hostname_of(host):
    return host.backend.get_hostname()


def plan_of(host):
    return json.loads(host.file(PLAN_PATH).content_string)


def main_pid(host, unit):
    pid = int(host.check_output(f"systemctl show --property=MainPID --value {unit}"))
    assert pid > 0, f"{unit} has no main process"
    return pid


def status_field(host, pid, field):
    for line in host.file(f"/proc/{pid}/status").content_string.splitlines():
        key, _, value = line.partition(":")
        if key == field:
            return value.strip()
    raise AssertionError(f"/proc/{pid}/status has no {field}")


def memlock_limits(host, pid):
    for line in host.file(f"/proc/{pid}/limits").content_string.splitlines():
        if line.startswith("Max locked memory"):
            soft, hard = line.split()[3:5]
            return soft, hard
    raise AssertionError(f"/proc/{pid}/limits has no memlock line")


def environ_of(host, pid):
    raw = host.check_output(f"tr '\\0' '\\n' < /proc/{pid}/environ")
    return dict(line.split("=", 1) for line in raw.splitlines() if "=" in line)


def cpu_set(text):
    out = set()
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out.update(range(int(lo), int(hi) + 1))
        elif part:
            out.add(int(part))
    return out


def systemd_escaped(text):
    # systemd.syntax: backslash and double quote escaped inside quotes,
    # % doubled (specifiers); Environment= expands no $ variables.
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")


def unit_path(instance):
    if instance["mode"] == "dropin":
        return f"{UNIT_DIR}/{instance['unit']}.d/50-gpunuma.conf"
    return f"{UNIT_DIR}/{instance['unit']}"


