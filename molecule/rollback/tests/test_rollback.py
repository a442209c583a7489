"""The rollback ladder and the drift audit on a live systemd container.

Also: site.yml keeps a rolled-back node on its profile, and refused moves
(down from the bottom rung, an unknown profile) change nothing.

Each step runs the real playbook (ansible-playbook with molecule's
inventory), then reads the live binding of every instance from
/proc/<pid>/numa_maps and /proc/<pid>/status, and the node's state history.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[3]))
INVENTORY = os.path.dirname(os.environ["MOLECULE_INVENTORY_FILE"]) if os.environ.get("MOLECULE_INVENTORY_FILE") else None

pytestmark = pytest.mark.skipif(INVENTORY is None, reason="run by molecule (MOLECULE_INVENTORY_FILE)")


def flat(text):
    """The output with line wrapping undone (the YAML callback folds long messages)."""
    return " ".join(text.split())


def play(playbook, *extra):
    cmd = ["ansible-playbook", "-i", INVENTORY, str(REPO / "playbooks" / playbook), "--limit", "rollback-node"]
    for item in extra:
        cmd += ["-e", json.dumps(item)]
    env = dict(os.environ, ANSIBLE_LIBRARY=str(REPO / "library"), ANSIBLE_MODULE_UTILS=str(REPO / "module_utils"),
               ANSIBLE_FILTER_PLUGINS=str(REPO / "filter_plugins"),
               ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"),
               ANSIBLE_ROLES_PATH=str(REPO / "roles"), SUDO_USER="oncall", ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True, timeout=600, env=env)
    return proc.returncode, proc.stdout + proc.stderr


def live(host, name):
    unit = "gpunuma-%s.service" % name
    pid = int(host.check_output("systemctl show --property=MainPID --value %s" % unit))
    assert pid > 0, unit
    policy = host.check_output("head -n 1 /proc/%d/numa_maps" % pid).split()[1]
    cpus = [line.split(":")[1].strip() for line in host.file("/proc/%d/status" % pid).content_string.splitlines()
            if line.startswith("Cpus_allowed_list")][0]
    return pid, policy, cpus


def history(host):
    state = json.loads(host.file("/etc/gpunuma/state.json").content_string)
    return state, [(h["from"], h["to"], h["action"]) for h in state["history"]]


def test_ladder_and_audit(host, tmp_path):
    small0, policy, all_cpus = live(host, "small")
    assert policy == "bind:0"
    big_pid, big_policy, _ = live(host, "big")
    assert big_policy == "prefer:0"
    assert history(host)[1] == [(None, "strict", "site")]

    steps = [
        ({"gpunuma_rollback": "down", "gpunuma_reason": "P99 spike"}, "prefer:0", ("strict", "preferred", "down")),
        ({"gpunuma_rollback": "previous"}, "bind:0", ("preferred", "strict", "previous")),
        ({"gpunuma_profile": "off"}, "default", ("strict", "off", "profile")),
        ({"gpunuma_profile": "strict"}, "bind:0", ("off", "strict", "profile")),
    ]
    for count, (extra, want_policy, entry) in enumerate(steps, start=2):
        rc, out = play("rollback.yml", extra)
        assert rc == 0, out[-4000:]
        pid, policy, _ = live(host, "small")
        assert policy == want_policy, (extra, policy)
        state, hist = history(host)
        assert len(hist) == count and hist[-1] == entry and state["profile"] == entry[1] and state["pinned"]
        assert state["history"][-1]["user"] == "oncall"
        if entry[1] in ("preferred", "strict") and entry[0] in ("preferred", "strict"):
            # big's binding is preferred either way: not restarted.
            assert live(host, "big")[0] == big_pid
        if entry == ("strict", "preferred", "down"):
            # A later site.yml keeps the node on its rolled-back profile and says so.
            rc, out = play("site.yml")
            assert rc == 0, out[-4000:]
            assert "stays on profile preferred" in flat(out), out[-3000:]
            assert live(host, "small")[:2] == (pid, "prefer:0")
            assert len(history(host)[1]) == count
        if entry[1] == "off":
            # Refused moves change nothing: down from the bottom rung, an unknown profile.
            before = host.file("/etc/gpunuma/state.json").content_string
            rc, out = play("rollback.yml", {"gpunuma_rollback": "down"})
            assert rc != 0 and "bottom rung" in flat(out), out[-3000:]
            rc, out = play("rollback.yml", {"gpunuma_profile": "fastest"})
            # The YAML callback may double a quote: match the words around it.
            assert rc != 0 and "fastest" in out and "is not a known profile" in flat(out), out[-3000:]
            assert host.file("/etc/gpunuma/state.json").content_string == before
            assert live(host, "small")[:2] == (pid, "default")
    assert history(host)[0]["history"][1]["reason"] == "P99 spike"

    # The audit: a clean node is compliant.
    reports = tmp_path / "audit"
    rc, out = play("audit.yml", {"gpunuma_audit_dir": str(reports)})
    report = json.loads(next(reports.glob("*.json")).read_text())
    assert rc == 0 and report["status"] == "compliant", (report["findings"], out[-3000:])

    # Drift made on purpose: a unit edited (not reloaded), a process re-pinned,
    # the numa_balancing file changed.
    host.check_output("sed -i 's/--membind=0/--preferred=0/' /etc/systemd/system/gpunuma-small.service")
    pid = live(host, "big")[0]
    first_cpu = all_cpus.split(",")[0].split("-")[0]
    host.check_output("taskset -a -p -c %s %d" % (first_cpu, pid))
    host.check_output("sed -i 's/^kernel.numa_balancing *= *0/kernel.numa_balancing = 1/' "
                      "/etc/sysctl.d/60-gpunuma-numa-balancing.conf")
    rc, out = play("audit.yml", {"gpunuma_audit_dir": str(reports)})
    report = json.loads(next(reports.glob("*.json")).read_text())
    assert rc != 0 and report["status"] == "drifted"
    found = sorted((f["id"], f["instance"]) for f in report["findings"])
    expected = [("numa-balancing-file", None), ("unit-binding", "small"), ("unit-reload-pending", "small")]
    if first_cpu != all_cpus:
        expected.append(("cpu-affinity", "big"))
    assert found == sorted(expected), report["findings"]
    failed = [r["id"] for r in report["policy"]["results"] if r["status"] == "fail" and r["severity"] == "error"]
    assert failed == ["GN-NB-001"], report["policy"]["results"]
    assert "drifted" in out
