"""The rollback ladder on the guest, where the binding is real.

strict -> down -> previous -> off -> strict with playbooks/rollback.yml (the
real playbook, molecule's inventory), checking after every step the live
binding of llm0 (memory policy from /proc/<pid>/numa_maps, CPUs from
/proc/<pid>/status), the node's state history, and that spill, whose binding
is the same under strict and preferred (its declared memory exceeds node 1,
so strict plans it preferred), kept its PID.

pytest collects files in name order: this runs after test_numa_vm.py and
before test_reboot.py, and ends on strict, the converged profile, so the
reboot checks see the converged bindings.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

import gpunuma_probe as probe

REPO = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[3]))
INVENTORY = os.environ.get("MOLECULE_INVENTORY_FILE")

pytestmark = pytest.mark.skipif(INVENTORY is None, reason="run by molecule (MOLECULE_INVENTORY_FILE)")


def rollback(*extra):
    cmd = ["ansible-playbook", "-i", os.path.dirname(INVENTORY), str(REPO / "playbooks" / "rollback.yml"),
           "--limit", "numa-vm"]
    for item in extra:
        cmd += ["-e", json.dumps(item)]
    env = dict(os.environ, ANSIBLE_LIBRARY=str(REPO / "library"), ANSIBLE_MODULE_UTILS=str(REPO / "module_utils"),
               ANSIBLE_FILTER_PLUGINS=str(REPO / "filter_plugins"), ANSIBLE_ROLES_PATH=str(REPO / "roles"),
               SUDO_USER="oncall", ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True, timeout=1200, env=env)
    return proc.returncode, proc.stdout + proc.stderr


def live(host, name):
    pid = probe.main_pid(host, name)
    policy = probe.read(host, f"/proc/{pid}/numa_maps").splitlines()[0].split()[1]
    return pid, policy, probe.status_field(host, pid, "Cpus_allowed_list")


def history(host):
    state = probe.load_json(host, "/etc/gpunuma/state.json")
    return state, [(h["from"], h["to"], h["action"]) for h in state["history"]]


def test_rollback_ladder_with_live_bindings(host):
    cpus = probe.node_cpulist(host, probe.NODE)
    every = probe.read(host, "/sys/devices/system/cpu/online").strip()
    assert live(host, "llm0")[1:] == (f"bind:{probe.NODE}", cpus)
    spill_pid = live(host, "spill")[0]
    _, start = history(host)

    steps = [
        ({"gpunuma_rollback": "down", "gpunuma_reason": "P99 spike"}, (f"prefer:{probe.NODE}", cpus),
         ("strict", "preferred", "down")),
        ({"gpunuma_rollback": "previous"}, (f"bind:{probe.NODE}", cpus), ("preferred", "strict", "previous")),
        ({"gpunuma_profile": "off"}, ("default", every), ("strict", "off", "profile")),
        ({"gpunuma_profile": "strict"}, (f"bind:{probe.NODE}", cpus), ("off", "strict", "profile")),
    ]
    for count, (extra, want, entry) in enumerate(steps, start=len(start) + 1):
        rc, out = rollback(extra)
        assert rc == 0, out[-4000:]
        assert live(host, "llm0")[1:] == want, (extra, live(host, "llm0"))
        state, hist = history(host)
        assert len(hist) == count and hist[-1] == entry, hist
        assert state["profile"] == entry[1] and state["pinned"] is True
        assert state["history"][-1]["user"] == "oncall"
        if entry[0] in ("strict", "preferred") and entry[1] in ("strict", "preferred"):
            assert live(host, "spill")[0] == spill_pid, "spill's binding did not change: it must not restart"
        else:
            spill_pid = live(host, "spill")[0]
    assert history(host)[0]["history"][len(start)]["reason"] == "P99 spike"
