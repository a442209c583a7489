"""Run ansible / ansible-playbook from tests, the way a user would."""

import json
import os
import subprocess
import sys

from conftest import REPO_ROOT

BINDIR = os.path.dirname(sys.executable)


def ansible_env(**extra):
    env = dict(os.environ)
    env.update(
        PATH=BINDIR + os.pathsep + env.get("PATH", ""),
        ANSIBLE_CONFIG=os.path.join(REPO_ROOT, "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_RETRY_FILES_ENABLED="0",
        ANSIBLE_LOCALHOST_WARNING="0",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="0",
    )
    env.update(extra)
    return env


def no_deprecation(output):
    """Fail on a deprecation warning in a run's output: gpunuma runs on the supported cores without one."""
    assert "[DEPRECATION WARNING]" not in output, output[max(0, output.find("[DEPRECATION WARNING]") - 200):][:3000]


def run_module(module, args=None, check=False, extra=()):
    """Run one module on localhost; return (rc, result dict)."""
    cmd = [os.path.join(BINDIR, "ansible"), "localhost", "-i", "localhost,", "-c", "local",
           "-m", module, "-e", "ansible_python_interpreter=%s" % sys.executable]
    if args:
        cmd += ["-a", json.dumps(args)]
    if check:
        cmd.append("--check")
    cmd += list(extra)
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env=ansible_env(ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"))
    no_deprecation(proc.stdout + proc.stderr)
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError("ansible printed no JSON (rc=%d):\n%s\n%s" % (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:]))
    result = data["plays"][0]["tasks"][0]["hosts"]["localhost"]
    return proc.returncode, result


def run_playbook(playbook, inventory, extra_vars=None, check=False, extra=(), env=None):
    """Run a playbook; return the CompletedProcess (stdout: the default callback). ``env``: variables added
    to (or replacing) ansible_env's."""
    cmd = [os.path.join(BINDIR, "ansible-playbook"), "-i", inventory, playbook]
    for key, value in (extra_vars or {}).items():
        cmd += ["-e", json.dumps({key: value})]
    if check:
        cmd.append("--check")
    cmd += list(extra)
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
                          env=ansible_env(**(env or {})))
    no_deprecation(proc.stdout + proc.stderr)
    return proc


def run_playbook_json(playbook, inventory, *extra):
    """ansible-playbook with the JSON callback: (rc, {host: [failed task results]}, raw output)."""
    proc = subprocess.run(
        [os.path.join(BINDIR, "ansible-playbook"), "-i", str(inventory), playbook, *extra],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=1200,
        env=ansible_env(ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"),
    )
    no_deprecation(proc.stdout + proc.stderr)
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError("no JSON (rc=%d):\n%s\n%s" % (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:]))
    failures = {}
    for play in data["plays"]:
        for task in play["tasks"]:
            for host, result in task["hosts"].items():
                if result.get("failed") or result.get("unreachable"):
                    failures.setdefault(host, []).append(dict(result, task=task["task"]["name"]))
    return proc.returncode, failures, proc.stdout + proc.stderr
