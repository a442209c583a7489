"""site.yml's safety on a systemd container: the node lock, and programs checked before anything is written.

The node lock: two runs against one node are serialised.

Run A (instances w1 and w2, profile preferred, a long settle) is started in
the background. While it holds the node:

- site.yml run B (w1 and w3, profile strict) with ``gpunuma_lock_timeout:
  1`` stops naming A's holder (controller, user, playbook) and changes
  nothing (no w3 unit, A's files as A wrote them), and ends with the one-host
  NOT PROVISIONED line naming the step;
Once A ended, rollback.yml run C (w1 and w3, to interleave, a long
settle) takes the lease; site.yml run E (w1 and w3, strict) started
meanwhile reads the node before C's apply ends, waits for the lease, then
finds plan.json and state.json changed since it read them and stops with
nothing changed: the rollback is kept. The node ends on C's plan in every
place: the unit files, plan.json, state.json (A's site switch, then the
rollback), the running units and their processes' memory policy; w2 is
pruned, and the lease is given back. (A controller run beside an
ansible-pull run is in tests/integration/test_ansible_pull.py.)

The lease logic itself (expiry, break, a step's own lease, links) is in
tests/unit/test_node_lock.py.

Programs: on the node B left, an inventory adding an instance whose
command[0] does not exist is refused by the validation play, naming the
instance and the path; nothing is written and the running instances keep
their processes (systemd-analyze verify alone sees only numactl, so the
unit would have been written, started, failed and rolled back). The
permission and root-safety rules are in tests/unit/test_programs.py.

Secrets: an instance with HF_TOKEN in its environment, applied with -v and
--diff. The value is in the process's environment and in
/etc/gpunuma/env/<name>.env (0600 root) only: not in any other file under
/etc or /var/lib/gpunuma (units, plan.json, backups), not in the
controller's plan copy, not in `systemctl show -p Environment`, not in the
playbook's output. A changed secret restarts the instance; its old value
survives only in the 0600 backup; removing the instance removes the file and
every backup. The quoting and redaction rules are in tests/unit/test_secrets.py.
"""

import json
import os
import uuid
import subprocess
import time

import pytest
import yaml

from ansible_run import BINDIR, ansible_env
from conftest import REPO_ROOT
from containers import Node, needs_docker

pytestmark = [pytest.mark.container, needs_docker]

LOCK = "/run/gpunuma/lock"
POLICY_FLAGS = ("--interleave", "--membind", "--preferred")


# An instance with a second thread, which the audit test re-pins after start.
THREADED = {"name": "thr", "numa_node": 0, "share_cpus": True,
            "command": ["/usr/bin/python3", "-c", "import threading, time; "
                        "threading.Thread(target=time.sleep, args=(1e6,), daemon=True).start(); time.sleep(1e6)"]}


def _instance(name):
    return {"name": name, "numa_node": 0, "share_cpus": True, "command": ["/bin/sleep", "infinity"]}


@pytest.fixture(scope="module")
def node():
    created = Node()
    yield created
    created.remove()


def _site(tmp_path, node, tag, instances, profile, more=(), playbook="site.yml", **extra):
    host = {
        "ansible_connection": "community.docker.docker",
        "ansible_python_interpreter": "/usr/bin/python3",
        "gpu_topology_controller_dir": str(tmp_path / ("topology-" + tag)),
        "gpunuma_profile": profile,
        "memlock_limit": "4M",
        "autonuma_numa_balancing": None,
        "gpunuma_instances": [_instance(name) for name in instances] + list(more),
    }
    host.update(extra)
    inventory = tmp_path / ("inventory-%s.yml" % tag)
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {node.name: host}}}))
    return [os.path.join(BINDIR, "ansible-playbook"), "-i", str(inventory), "playbooks/" + playbook]


def _start(cmd, log_path):
    log = open(log_path, "w+")
    return subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
                            env=ansible_env(USER="oncall")), log


def _finish(proc, log, timeout=600):
    proc.wait(timeout=timeout)
    log.seek(0)
    return proc.returncode, log.read()


def _lease(node):
    text = node.sh("cat %s 2>/dev/null || true" % LOCK).strip()
    return json.loads(text) if text else None


def _units(node):
    out = node.sh("ls /etc/systemd/system/ | grep '^gpunuma-w.*\\.service$' || true")
    return sorted(out.split())


def test_a_second_run_waits_for_the_first_and_the_node_ends_on_one_plan(node, tmp_path):
    # A takes the lease with its apply step and holds it through its settle: long enough for B's whole
    # validation play (discovery, plan) to run and reach its own apply step on a loaded machine.
    run_a, log_a = _start(_site(tmp_path, node, "a", ["w1", "w2"], "preferred", numa_binding_settle_seconds=60),
                          tmp_path / "a.log")
    try:
        deadline = time.time() + 300
        while not (_lease(node) or {}).get("holder"):
            assert run_a.poll() is None, "run A ended before it took the lease:\n" + open(log_a.name).read()[-4000:]
            assert time.time() < deadline, "run A never took the node lock"
            time.sleep(0.3)
        lease = _lease(node)
        assert lease["holder"]["playbook"] == "site.yml" and lease["holder"]["user"] == "oncall"

        # B with a short wait: refused, naming A, and nothing of B's on the node.
        cmd_b = _site(tmp_path, node, "b", ["w1", "w3"], "strict")
        short = subprocess.run(cmd_b + ["-e", "gpunuma_lock_timeout=1"], cwd=REPO_ROOT, capture_output=True,
                               text=True, timeout=600, env=ansible_env())
        out = short.stdout + short.stderr
        assert short.returncode != 0, out[-4000:]
        assert "another gpunuma run holds this node" in out, out[-4000:]
        # A one-host run that fails in the apply play still ends naming the host and the step.
        assert 'NOT PROVISIONED: %s failed at "Install the units and start the instances": another gpunuma run holds this node' \
            % node.name in out, out[-4000:]
        for needle in ("controller %s" % lease["holder"]["controller"], "user oncall", "playbook site.yml"):
            assert needle in out, (needle, out[-4000:])
        # The refusal names A's holder (user oncall; B runs as another user), so A held the lease when B
        # reached its apply step; A may end its settle while B prints (seen under a loaded suite).
        assert "gpunuma-w3.service" not in _units(node)

        rc_a, out_a = _finish(run_a, log_a)
        assert rc_a == 0, out_a[-6000:]

        # C, a rollback that holds the lease through its settle; E, a site.yml run started meanwhile, decides from
        # the node as it read it before C's apply ended, then waits for the lease: it must not undo the rollback.
        # Once it holds the lease it finds plan.json and state.json changed since it read them and stops, with
        # nothing changed (docs/security.md, "The node lock").
        cmd_c = _site(tmp_path, node, "c", ["w1", "w3"], "strict", playbook="rollback.yml",
                      numa_binding_settle_seconds=60) + [
            "--limit", node.name, "-e", "gpunuma_profile=interleave", "-e", "gpunuma_reason=lock-test"]
        run_c, log_c = _start(cmd_c, tmp_path / "c.log")
        deadline = time.time() + 300
        while ((_lease(node) or {}).get("holder") or {}).get("playbook") != "rollback.yml":
            assert run_c.poll() is None, "the rollback ended before it took the lease:\n" + open(log_c.name).read()[-4000:]
            assert time.time() < deadline, "the rollback never took the node lock"
            time.sleep(0.3)
        run_e, log_e = _start(_site(tmp_path, node, "e", ["w1", "w3"], "strict"), tmp_path / "e.log")
        rc_c, out_c = _finish(run_c, log_c)
        rc_e, out_e = _finish(run_e, log_e)
    finally:
        for proc in (run_a,) + tuple(locals()[n] for n in ("run_c", "run_e") if n in locals()):
            if proc.poll() is None:
                proc.kill()
    assert rc_c == 0, out_c[-6000:]
    assert rc_e != 0, out_e[-6000:]
    assert "changed since this run read it" in out_e and "run it again to decide from the node as it is now" in out_e, \
        out_e[-6000:]

    # The rollback decides the node, in every place at once.
    state = json.loads(node.sh("cat /etc/gpunuma/state.json"))
    switches = [(h["to"], h["action"]) for h in state["history"]]
    assert switches[-2:] == [("preferred", "site"), ("interleave", "profile")], switches
    last = state["history"][-1]
    assert state["profile"] == "interleave" and state["pinned"] is True and last["reason"] == "lock-test"
    plan = json.loads(node.sh("cat /etc/gpunuma/plan.json"))
    assert plan["profile"].startswith("interleave")
    assert sorted(i["name"] for i in plan["instances"]) == ["w1", "w3"]
    assert _units(node) == ["gpunuma-w1.service", "gpunuma-w3.service"]
    for item in plan["instances"]:
        unit = node.sh("cat /etc/systemd/system/%s" % item["unit"])
        assert "# gpunuma instance %s" % item["name"] in unit
        for word in item.get("numactl_args") or []:
            assert word in unit, (item["name"], word)
        assert node.sh("systemctl is-active %s" % item["unit"], check=False).strip() == "active"
        # The running process has the plan's memory policy (numa_maps: interleave:0).
        pid = node.main_pid(item["unit"])
        assert node.sh("awk '{print $2}' /proc/%d/numa_maps | sort -u" % pid).split() == ["interleave:0"], item["unit"]
    assert node.sh("systemctl is-active gpunuma-w2.service", check=False).strip() != "active"
    assert _lease(node) is None, "the lease was not given back"


def test_a_missing_program_is_refused_before_anything_changes(node, tmp_path):
    # Runs after the lock test, on the node it left: w1 and w3 running.
    before = {unit: node.main_pid(unit) for unit in ("gpunuma-w1.service", "gpunuma-w3.service")}
    assert all(before.values()), before
    units_before = node.sh("cat /etc/systemd/system/gpunuma-w1.service /etc/gpunuma/plan.json")
    cmd = _site(tmp_path, node, "c", ["w1", "w3"], "strict")
    inventory = yaml.safe_load(open(cmd[2]))
    host = inventory["all"]["hosts"][node.name]
    host["gpunuma_instances"].append({"name": "server", "numa_node": 0, "share_cpus": True,
                                      "command": ["/opt/nowhere/bin/server", "--port", "8000"]})
    with open(cmd[2], "w") as handle:
        yaml.safe_dump(inventory, handle)
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=ansible_env())
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    assert ("gpunuma_instances entry 'server' runs /opt/nowhere/bin/server, which does not exist on the node"
            in out), out[-4000:]
    assert "Provision the GPU nodes" not in out
    assert node.sh("ls /etc/systemd/system/gpunuma-server.service 2>/dev/null || true").strip() == ""
    assert node.sh("cat /etc/systemd/system/gpunuma-w1.service /etc/gpunuma/plan.json") == units_before
    assert {unit: node.main_pid(unit) for unit in before} == before


def _grep(node, needle):
    """Files under /etc and /var/lib/gpunuma holding needle."""
    out = node.sh("grep -rlF -- %s /etc /var/lib/gpunuma 2>/dev/null || true" % needle)
    return sorted(out.split())


def _environ(node, unit):
    pid = node.main_pid(unit)
    raw = node.sh("cat /proc/%d/environ | tr '\\0' '\\n'" % pid)
    return pid, dict(line.split("=", 1) for line in raw.splitlines() if "=" in line)


def test_secret_environment_stays_out_of_units_plans_and_output(node, tmp_path):
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    value = 'hf_%s "q" $HOME \\x' % first

    def secret_instance(token):
        return {"name": "sec", "numa_node": 0, "share_cpus": True, "command": ["/bin/sleep", "infinity"],
                "environment": {"HF_TOKEN": token, "MODEL": "llama"}}

    cmd = _site(tmp_path, node, "s1", ["w1", "w3"], "strict", more=[secret_instance(value)])
    proc = subprocess.run(cmd + ["-v", "--diff"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                          env=ansible_env())
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert first not in out, "the secret is in the playbook's output"
    assert "<secret>" in out, "the environment file's diff is not shown redacted"
    assert _grep(node, first) == ["/etc/gpunuma/env/sec.env"]
    assert node.sh("stat -c '%a %U %G' /etc/gpunuma/env/sec.env").split() == ["600", "root", "root"]
    pid, environ = _environ(node, "gpunuma-sec.service")
    assert environ["HF_TOKEN"] == value and environ["MODEL"] == "llama"
    assert first not in node.sh("systemctl show -p Environment gpunuma-sec.service")
    unit = node.sh("cat /etc/systemd/system/gpunuma-sec.service")
    assert "EnvironmentFile=/etc/gpunuma/env/sec.env" in unit and "MODEL=llama" in unit
    controller = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "topology-s1") for f in fs]
    assert controller and not any(first in open(f).read() for f in controller)
    plan = json.loads(node.sh("cat /etc/gpunuma/plan.json"))
    [sec] = [i for i in plan["instances"] if i["name"] == "sec"]
    assert sec["secret_environment"] == ["HF_TOKEN"] and "HF_TOKEN" not in sec["environment"]
    # Nor in the node's journal, where modules log how they were invoked (masking a multi-line file's content
    # inside the logged argument list misses it: the whole argument is not logged).
    journal = node.sh("journalctl --no-pager -o cat")
    assert "Invoked with" in journal, journal[-2000:]
    assert first not in journal, "the secret is in the node's journal"

    # A new secret: the instance restarts with it; the old value only in the 0600 backup.
    cmd = _site(tmp_path, node, "s2", ["w1", "w3"], "strict", more=[secret_instance("hf_" + second)])
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=ansible_env())
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert first not in out and second not in out
    new_pid, environ = _environ(node, "gpunuma-sec.service")
    assert new_pid != pid and environ["HF_TOKEN"] == "hf_" + second
    [backup] = _grep(node, first)
    assert backup.startswith("/etc/gpunuma/env/sec.env.") and backup.endswith("~")
    assert node.sh("stat -c '%a' " + backup).strip() == "600"

    # The instance goes: so do its environment file and every backup of it. (A two-thread instance comes,
    # for the audit test below.)
    cmd = _site(tmp_path, node, "s3", ["w1", "w3"], "strict", more=[THREADED])
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=ansible_env())
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert _grep(node, first) == [] and _grep(node, second) == []
    assert node.sh("ls -A /etc/gpunuma/env 2>/dev/null || true").strip() == ""


def test_a_thread_re_pinned_after_start_is_found_by_the_audit(node, tmp_path):
    # Runs after the secret test, on the node it left: w1, w3 and thr (two threads) running.
    plan = json.loads(node.sh("cat /etc/gpunuma/plan.json"))
    [thr] = [i for i in plan["instances"] if i["name"] == "thr"]
    pid = node.main_pid(thr["unit"])
    tids = sorted(int(t) for t in node.sh("ls /proc/%d/task" % pid).split())
    [other] = [t for t in tids if t != pid]
    planned = set()
    for part in thr["cpus"].split(","):
        low, _, high = part.partition("-")
        planned.update(range(int(low), int(high or low) + 1))
    online = set(range(int(node.sh("nproc --all"))))
    cpu = min(online - planned) if online - planned else min(planned)
    assert {cpu} != planned
    # What an engine's late sched_setaffinity does to one of its threads.
    node.sh("taskset -p -c %d %d" % (cpu, other))

    cmd = _site(tmp_path, node, "audit", ["w1", "w3"], "strict", more=[THREADED])
    cmd[-1] = "playbooks/audit.yml"
    proc = subprocess.run(cmd + ["-e", "gpunuma_audit_dir=%s" % (tmp_path / "audit")], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600, env=ansible_env())
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    [path] = (tmp_path / "audit").glob("*.json")
    report = json.loads(path.read_text())
    findings = [(f["id"], f["instance"]) for f in report["findings"]]
    assert findings == [("thread-affinity", "thr")], (findings, out[-4000:])
    [finding] = report["findings"]
    assert finding["actual"] == {str(other): str(cpu)} and finding["expected"] == thr["cpus"]
    [live] = [i["live"] for i in report["instances"] if i["name"] == "thr"]
    assert live["threads"] == 2 and live["threads_off_plan"] == 1 and live["processes"] == 1
    # One node: every page the instance allocated is local (judged for bind and preferred instances).
    assert live.get("local_share_anon", 1.0) == 1.0, live
    assert ("local_share_anon" in live) == (thr["mem_policy"] in ("bind", "preferred")), (thr["mem_policy"], live)


def test_validation_under_load_refuses_a_node_whose_instances_run(node, tmp_path):
    # Runs on the node the tests above left: gpunuma instances running. The busy check comes before any
    # stressor or CUDA call, so no GPU is needed to see it.
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {node.name: {
        "ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3"}}}}))
    proc = subprocess.run([os.path.join(BINDIR, "ansible"), node.name, "-i", str(inventory), "-m", "h2d_probe_info",
                           "-a", "load=memory"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env=ansible_env())
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "load memory would load a node whose gpunuma instances are running (" in out, out[-3000:]
    for unit in ("gpunuma-thr.service", "gpunuma-w1.service", "gpunuma-w3.service"):
        assert unit in out, (unit, out[-3000:])
    assert "gpu_validate_allow_busy: true" in out
    # Idle validation is not refused for running instances (it starts nothing): it gets as far as the driver.
    proc = subprocess.run([os.path.join(BINDIR, "ansible"), node.name, "-i", str(inventory), "-m", "h2d_probe_info"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=ansible_env())
    out = proc.stdout + proc.stderr
    assert "would load a node" not in out and '"status": "skipped"' in out, out[-3000:]
