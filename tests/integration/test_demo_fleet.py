"""The live demo (scripts/demo.sh, docs/demo.md) end to end on systemd containers.

The README's first command, run exactly as the README writes it (no
arguments, no environment of its own: the default fleet of six hosts and
the default .demo/ directory): the live-discovered GPU-less node, whose
stand-in worker really runs bound, and five nodes whose topologies are
offline input (published `nvidia-smi topo -m` outputs without node memory,
the recorded H200 VM, the AMD MI300X CPX node), whose units are installed
but not started. The test fails when the README's command or the demo's
host list changes without it. Its containers are the demo's own
(gpunuma-demo-*), removed at the end by `demo.sh --clean`.
"""

import json
import os
import pathlib
import re
import subprocess

import pytest

from ansible_run import ansible_env
from conftest import REPO_ROOT
from containers import needs_docker

pytestmark = [pytest.mark.container, needs_docker]

HOSTS = ["demo-live", "hgx-h200-8gpu", "gb200-4gpu", "dgx-a100-nps4", "h200-vm", "mi300x-cpx"]
# The offline text topologies: no node memory, so their membind capacity is not checked (the plan says so).
TEXT_ONLY = ["hgx-h200-8gpu", "gb200-4gpu", "dgx-a100-nps4"]
LIVE = "demo-live"
PREFIX = "gpunuma-demo-"


def readme_demo_command():
    """The README's demo command, as its "Two commands" section writes it."""
    with open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8") as handle:
        section = handle.read().split("## Two commands", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```sh\n(.*?)```", section, re.S)
    (line,) = [l.split("#")[0].strip() for l in block.splitlines() if "demo.sh" in l]
    return line.split()


def demo(*args):
    env = ansible_env()
    for name in [n for n in env if n.startswith("GPUNUMA_DEMO_")]:
        del env[name]  # the README's command, with no environment of the test's own
    return subprocess.run(readme_demo_command() + list(args), cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=1800, env=env)


def cpu_set(text):
    """The kernel's list format ("1-3,8") as a set of CPU numbers."""
    cpus = set()
    for part in (text or "").split(","):
        if part:
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def node_sh(host, script):
    proc = subprocess.run(["docker", "exec", PREFIX + host, "sh", "-c", script], capture_output=True, text=True)
    return proc.returncode, proc.stdout.strip()


def demo_containers():
    return subprocess.run(["docker", "ps", "-a", "--filter", "name=^" + PREFIX, "--format", "{{.Names}}"],
                          capture_output=True, text=True, check=True).stdout.split()


def test_the_readme_command_and_the_demo_fleet_are_the_tested_ones():
    assert readme_demo_command() == ["./scripts/demo.sh"]
    with open(os.path.join(REPO_ROOT, "scripts", "demo.sh"), encoding="utf-8") as handle:
        (hosts,) = re.findall(r'^readonly ALL_HOSTS="([^"]*)"', handle.read(), re.M)
    assert hosts.split() == HOSTS


@pytest.fixture(scope="module")
def run():
    root = os.path.join(REPO_ROOT, ".demo")
    proc = demo()
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    yield proc.stdout, pathlib.Path(root) / "artefacts", {}
    demo("--clean")


def read(path):
    return json.loads(path.read_text())


def test_every_step_has_its_header(run):
    out, _, _ = run
    for step in ("1. plan:", "2. site:", "3. audit:", "4. rollback: demo-live from strict to preferred",
                 "5. audit again:", "6. validate:"):
        assert "\n== " + step in out, out[-4000:]
    assert "replays the probe recorded on a real H200" in out


def test_every_host_provisioned_or_installed_not_started(run):
    out, artefacts, _ = run
    # Offline topology: the unit is on the node, verified, and not running, and the demo says why.
    line = [l for l in out.splitlines() if l.strip().startswith("h200-vm: installed, not started:")]
    assert len(line) == 1, out[-4000:]
    assert "topology is offline input" in line[0] and "0 active" in line[0]
    rc, units = node_sh("h200-vm", "ls /etc/systemd/system/gpunuma-*.service")
    assert rc == 0 and units == "/etc/systemd/system/gpunuma-vllm-0.service"
    rc, active = node_sh("h200-vm", "systemctl is-active gpunuma-vllm-0.service")
    assert active == "inactive"
    # Live discovery: the instance runs.
    rc, active = node_sh(LIVE, "systemctl is-active gpunuma-worker.service")
    assert (rc, active) == (0, "active")
    for host in HOSTS:
        state = read(artefacts / "state" / (host + ".json"))
        assert state["schema"] == "gpunuma.state/v1" and state["hostname"] == host


def test_amd_node_provisioned_audited_and_validated(run):
    """The demo's playbooks on the AMD node: its four units (ROCR_VISIBLE_DEVICES, TP8 on one GPU's
    partitions) installed and not started, its audit compliant, its probe skipped (no GPU here)."""
    out, artefacts, _ = run
    rc, units = node_sh("mi300x-cpx", "ls /etc/systemd/system/gpunuma-*.service")
    assert rc == 0 and sorted(units.split()) == ["/etc/systemd/system/gpunuma-%s.service" % n
                                                 for n in ("small-0", "small-1", "tp8-a", "tp8-b")]
    rc, unit = node_sh("mi300x-cpx", "cat /etc/systemd/system/gpunuma-tp8-a.service")
    assert "ROCR_VISIBLE_DEVICES=" in unit and "CUDA_VISIBLE_DEVICES" not in unit
    assert read(artefacts / "audit" / "mi300x-cpx.json")["status"] == "compliant"
    assert read(artefacts / "validation" / "mi300x-cpx.json")["status"] == "skipped"
    assert read(artefacts / "state" / "mi300x-cpx.json")["profile"] == "strict"


def test_live_worker_runs_on_the_planned_cpus(run):
    out, artefacts, _ = run
    plan = {i["name"]: i for i in read(artefacts / "topology" / (LIVE + ".plan.json"))["instances"]}["worker"]
    # The controller's copy is the plan the node applied last: the rollback's.
    assert plan["cpus"] and plan["mem_policy"] == "preferred" and plan["mem_nodes"] == [0]
    after_site = read(artefacts / "workers" / (LIVE + ".worker.after-site.json"))
    assert cpu_set(after_site["cpus"]) == cpu_set(plan["cpus"])
    assert after_site["mempolicy"] == "bind:0" and after_site["mems_allowed"] == "0"
    # After the rollback to preferred: the same CPUs, memory preferred on node 0.
    after_rollback = read(artefacts / "workers" / (LIVE + ".worker.after-rollback.json"))
    assert cpu_set(after_rollback["cpus"]) == cpu_set(plan["cpus"])
    assert after_rollback["mempolicy"] == "prefer:0" and after_rollback["pid"] != after_site["pid"]
    # What the worker reports is what the kernel says about the unit's main process.
    rc, pid = node_sh(LIVE, "systemctl show --property=MainPID --value gpunuma-worker.service")
    assert rc == 0 and int(pid) == after_rollback["pid"]
    rc, allowed = node_sh(LIVE, "awk '/^Cpus_allowed_list/ {print $2}' /proc/%s/status" % pid)
    assert cpu_set(allowed) == cpu_set(plan["cpus"])
    assert "%s/worker runs (pid %s): CPUs %s" % (LIVE, after_site["pid"], after_site["cpus"]) in out


def test_rolled_back_node_history_strict_to_preferred(run):
    _, artefacts, _ = run
    state = read(artefacts / "state" / (LIVE + ".json"))
    assert state["profile"] == "preferred" and state["pinned"] is True
    last = state["history"][-1]
    assert (last["from"], last["to"], last["action"]) == ("strict", "preferred", "profile")
    assert "P99" in last["reason"]
    assert [h["to"] for h in state["history"]] == ["strict", "preferred"]
    other = read(artefacts / "state" / "h200-vm.json")
    assert other["profile"] == "strict" and [h["to"] for h in other["history"]] == ["strict"]


def test_audit_artefacts_for_every_host(run):
    _, artefacts, _ = run
    assert sorted(p.name for p in (artefacts / "audit").glob("*.json")) == sorted(h + ".json" for h in HOSTS)
    for host in HOSTS:
        report = read(artefacts / "audit" / (host + ".json"))
        assert report["schema"] == "gpunuma.audit/v1" and report["status"] == "compliant", report
    validation = read(artefacts / "validation" / "h200-vm.json")
    assert validation["schema"] == "gpunuma.validation/v1" and validation["status"] == "passed"
    assert read(artefacts / "validation" / (LIVE + ".json"))["status"] == "skipped"


def test_text_only_hosts_bound_strict_with_the_planners_warning(run):
    """The planner binds where node memory is unknown, saying the size was not checked; the gate passes it."""
    out, artefacts, _ = run
    for host in TEXT_ONLY:
        plan = read(artefacts / "topology" / (host + ".plan.json"))
        assert all(v is None for v in plan["memory_capacity"].values()), plan["memory_capacity"]
        bound = [i for i in plan["instances"] if i["mem_policy"] == "bind"]
        assert bound, host
        assert any("was not checked" in w for i in bound for w in i.get("warnings") or []), host
        assert read(artefacts / "state" / (host + ".json"))["profile"] == "strict"
    assert "GN-MEM-001" not in out


def test_no_playbook_of_the_demo_prints_a_deprecation_warning(run):
    _, artefacts, _ = run
    logs = sorted((artefacts.parent / "fleet" / "logs").glob("*.log"))
    assert len(logs) >= 6, logs
    for log in logs:
        text = log.read_text(errors="replace")
        assert "[DEPRECATION WARNING]" not in text, (log.name, text[text.find("[DEPRECATION WARNING]"):][:2000])


def test_html_report_names_every_host(run):
    _, artefacts, _ = run
    report = (artefacts / "fleet-report.html").read_text(encoding="utf-8")
    for host in HOSTS:
        assert host in report, host


def test_clean_removes_containers_and_files(run):
    _, artefacts, env = run
    assert sorted(demo_containers()) == sorted(PREFIX + h for h in HOSTS)
    proc = demo("--clean")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert demo_containers() == []
    assert not artefacts.parent.exists()
