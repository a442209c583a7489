"""The probe under load (verify/h2d/load.py) against the fake libcuda: what runs, what the report says, and
that no stressor outlives the probe - stopped when it has measured, killed with it, or stopped on Ctrl-C."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ansible.module_utils.gpunuma.verify.h2d import probe as h2d
from ansible.module_utils.gpunuma.verify.h2d import host as h2d_host
from ansible.module_utils.gpunuma.verify.h2d import options as h2d_options
from ansible.module_utils.gpunuma.verify.h2d import load as h2d_load
from conftest import REPO_ROOT
from test_h2d_probe import clean_env, fake_libcuda, one_node_root, opts  # noqa: F401 (fixtures)

pytestmark = pytest.mark.unit


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _children(pid):
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name) as handle:
                    fields = handle.read().split(")")[-1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(name))
    return out


def test_load_options_are_checked_and_named():
    with pytest.raises(h2d_host.ProbeError) as err:
        h2d_options.check_options({"load": "heavy", "load_memory_workers": 0, "load_max_seconds": 5,
                           "load_memory_node": -1, "load_cpus": []})
    text = str(err.value)
    for needle in ("load is 'heavy'; allowed: idle, copies, memory, both",
                   "load_memory_workers is 0; it must be an integer from 1 to 64",
                   "load_max_seconds is 5; it must be an integer from 10 to 7200",
                   "load_memory_node is -1", "load_cpus is []"):
        assert needle in text, (needle, text)


def test_the_report_says_which_load_ran_and_how_hard_it_pushed(fake_libcuda, tmp_path):
    before = set(_children(os.getpid()))
    report = h2d.probe(opts(fake_libcuda, placements=["local", "unbound"], rounds=2, load="both",
                            load_memory_workers=2, load_cpus=[0]), root=one_node_root(tmp_path))
    assert report["status"] == "ok", report["reason"]
    load = report["load"]
    assert load["kind"] == "both" and load["memory_node"] == 0 and load["cpus"] == [0]
    kinds = sorted((s["kind"], s.get("gpu", s.get("node"))) for s in load["stressors"])
    assert kinds == [("copies", 0), ("copies", 1), ("memory", 0), ("memory", 0)], kinds
    # Each pushed and said how hard: the memory stressors' real memmove, at least 0.1 GB/s on any machine.
    assert all(s.get("gbps") is not None and "error" not in s for s in load["stressors"]), load
    assert load["gbps"]["memory"] > 0.1
    assert report["options"]["load"] == "both"
    assert set(_children(os.getpid())) == before, "a stressor outlived the probe"


def test_idle_starts_nothing(fake_libcuda, tmp_path):
    report = h2d.probe(opts(fake_libcuda, placements=["local"], rounds=1), root=one_node_root(tmp_path))
    assert report["load"] == {"kind": "idle"}


def test_a_stressor_stops_itself_at_its_deadline(fake_libcuda):
    load = h2d_load.Load("memory", [], fake_libcuda, memory_node=None, memory_workers=1, max_seconds=10)
    load.max_seconds = 1  # below what the option allows, for the test's sake
    with load:
        [pid] = load.pids()
        deadline = time.time() + 15
        while _alive(pid) and time.time() < deadline:
            # Finished and waiting to be reaped: a zombie is not alive.
            time.sleep(0.2)
        assert not _alive(pid), "the stressor ran past its deadline"
    [answer] = load.describe()["stressors"]
    assert answer["gbps"] > 0


PROBE_SCRIPT = r"""
import json, os, signal, sys
# Ctrl-C as a terminal delivers it: a job started in the background by a non-interactive shell (a CI runner's
# `cmd &`) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler at all.
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, %(repo)r)
from gpunuma_controller.core import use_core
use_core(standalone=True)
from ansible.module_utils.gpunuma.verify.h2d import probe as h2d
os.environ["FAKE_CUDA_SPIN_US"] = "2000"
report = h2d.probe({"libcuda_path": %(lib)r, "placements": ["local"], "rounds": 50, "repeats": 3,
                    "small_repeats": 200, "large_bytes": 1 << 20, "load": "both", "load_memory_workers": 2},
                   root=%(root)r)
print(json.dumps(report["load"]))
"""


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT", "SIGTERM"])
def test_no_stressor_outlives_a_probe_that_is_killed_or_interrupted(fake_libcuda, tmp_path, how):
    """The probe is killed (or Ctrl-C'd, or terminated) while it measures under load: every stressor is gone
    within seconds (PR_SET_PDEATHSIG for a killed probe; the probe's own stop for Ctrl-C)."""
    script = PROBE_SCRIPT % {"repo": REPO_ROOT, "lib": fake_libcuda, "root": one_node_root(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.time() + 60
        stressors = []
        while len(stressors) < 4 and time.time() < deadline:
            # The stressors are the probe's children that live on (measurement children come and go).
            stressors = [p for p in _children(proc.pid) if p not in ()]
            time.sleep(0.2)
            stressors = [p for p in stressors if _alive(p)]
        assert len(stressors) >= 4, "the probe never started its stressors"
        assert proc.poll() is None, proc.communicate()
        os.kill(proc.pid, getattr(signal, how))
        # A guard against a hang, not the property: the probe stops its stressors (STOP_GRACE_S) and exits.
        proc.wait(timeout=30)
        deadline = time.time() + 10
        while any(_alive(p) for p in stressors) and time.time() < deadline:
            time.sleep(0.2)
        assert not [p for p in stressors if _alive(p)], "stressors left after %s of the probe" % how
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_stressor_cpus_come_from_the_applied_plan_read_through_its_schema(tmp_path):
    """No load_cpus: the applied plan's housekeeping CPUs; a damaged plan.json gives the probe's default."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("h2d_probe_info", os.path.join(REPO_ROOT, "library",
                                                                                 "h2d_probe_info.py"))
    module_file = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module_file)

    class Module:
        def __init__(self, plan_path):
            self.params = {"load_cpus": None, "plan_path": plan_path}

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"schema": "gpunuma.plan/v1", "profile": "strict", "instances": [],
                                "housekeeping": {"0": "0-1", "1": "48-49"}}))
    assert module_file._load_cpus(Module(str(plan))) == [0, 1, 48, 49]
    plan.write_text(json.dumps({"schema": "gpunuma.plan/v1", "profile": "strict", "instances": 5,
                                "housekeeping": {"0": "0-1"}}))
    assert module_file._load_cpus(Module(str(plan))) is None
    assert module_file._load_cpus(Module(str(tmp_path / "absent.json"))) is None
