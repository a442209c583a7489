"""site.yml's converge step on a systemd container: a node that is what the last run left ends its run at the
first step; every kind of drift a full run would mend still gets the full run, which mends it.

1. First run: no controller copy of the plan, so the node is not asked; the whole provisioning, then the record
   (0600) and the copy are written by the apply step.
2. Second run: converged at the first step, changed=0, one task with a round trip on the host. Another run's
   lease on the node makes it not converged (the whole run then waits for the lease as usual).
3. Drift, several at once: a unit file edited by hand, another instance stopped, a stale gpunuma unit (with
   gpunuma's marker) dropped in, a limits file's mode changed. The check names each; the full run restores the
   file (as recorded), restarts the unit, prunes the stale one and resets the mode; the run after ends at the check.
4. Check mode over drift: the check says not converged, --check runs the whole (read-only) provisioning and
   nothing on the node changes (the hand edit and the record stay as they are).
5. An input changed (memlock_limit): the check names it; the full run writes the new limit; then converged.
6. A command-line -e of a gpunuma variable is an input of its own (the profile's source depends on it).
7. The controller's plan copy removed, the record removed, then damaged: each named; the full run writes them again.
8. -v prints the verdict, never the inputs' digests.
"""

import json
import os
import re
import subprocess

import pytest
import yaml

from ansible_run import BINDIR, ansible_env, run_playbook
from conftest import REPO_ROOT
from containers import Node, needs_docker

pytestmark = [pytest.mark.container, needs_docker]

RECORD = "/var/lib/gpunuma/converged.json"
UNIT_A = "/etc/systemd/system/gpunuma-worker-a.service"
LIMITS = "/etc/security/limits.d/90-gpunuma-memlock.conf"


@pytest.fixture(scope="module")
def node():
    created = Node()
    yield created
    created.remove()


def _instance(name):
    return {"name": name, "numa_node": 0, "share_cpus": True, "command": ["/bin/sleep", "infinity"]}


def _inventory(tmp_path, node, **extra):
    host = {
        "ansible_connection": "community.docker.docker",
        "ansible_python_interpreter": "/usr/bin/python3",
        "gpu_topology_controller_dir": str(tmp_path / "topology"),
        "gpunuma_profile": "preferred",
        "memlock_limit": "4M",
        "memlock_groups": ["gpunuma"],
        "autonuma_numa_balancing": None,
        "gpunuma_instances": [_instance("worker-a"), _instance("worker-b")],
    }
    host.update(extra)
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": {node.name: host}}}))
    return str(path)


def _site(inventory, *extra):
    """(rc, the check's result, {ok, changed, skipped} of the host, output) of one site.yml run (JSON callback)."""
    proc = subprocess.run([os.path.join(BINDIR, "ansible-playbook"), "-i", inventory, "playbooks/site.yml", *extra],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
                          env=ansible_env(ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"))
    data = json.loads(proc.stdout[proc.stdout.index("{"):])
    check, counts = None, {"ok": 0, "changed": 0, "skipped": 0, "round_trips": 0, "ran": {}}
    for play in data["plays"]:
        for task in play["tasks"]:
            for host, result in task["hosts"].items():
                if host == "localhost":
                    continue
                if task["task"]["name"] == "Check the node against its converge record":
                    check = result
                counts["skipped" if result.get("skipped") else "changed" if result.get("changed") else "ok"] += 1
                if not result.get("skipped"):
                    counts["round_trips"] += result.get("gpunuma_round_trips", 0)
                    counts["ran"][task["task"]["name"]] = result
    return proc.returncode, check, counts, proc.stdout[-4000:] + proc.stderr[-2000:]


def _sha(node, path):
    return node.sh("sha256sum %s | cut -d' ' -f1" % path).strip()


def test_converge_record_ends_a_converged_run_and_every_drift_gets_the_full_run(node, tmp_path):
    inventory = _inventory(tmp_path, node)

    rc, check, counts, out = _site(inventory)
    assert rc == 0, out
    plan_copy = tmp_path / "topology" / ("%s.plan.json" % node.name)
    # A node this controller never converged: no record can match, so the check does not ask the node.
    assert check["converged"] is False and check["reasons"] == [
        "no controller copy of the host's applied plan (%s): not converged from this controller" % plan_copy]
    assert check["gpunuma_round_trips"] == 0, check
    assert counts["changed"] > 0
    # The record and the controller copy are kept by the instances' apply step, which gave the lease back.
    applied = counts["ran"]["numa_binding : Install the units and start the instances"]
    assert applied["converge_record"] == {"recorded": True, "reasons": [], "why": None}, applied
    assert applied["lock_released"] is True and "Give the node lock back" not in counts["ran"]
    assert node.sh("stat -c %a " + RECORD).strip() == "600"
    assert json.loads(plan_copy.read_text())["instances"], plan_copy.read_text()
    # One node read in the validation play, with the discovery (docs/roles.md, "One node read"): the memlock,
    # autonuma, numa_binding and gpunuma_state roles' parts come in its round trip and none of them reads the node
    # itself; the topology inventory is written by the instances' apply step.
    read = counts["ran"]["gpu_topology : Discover the topology"]["gpunuma_node"]
    assert read["pid1"] and "containerd.service" in read["units"], read
    assert read["autonuma"]["kernel_release"], read["autonuma"]
    assert read["accounts"]["users"] and "gpunuma_state" in read["files"] and "plan" in read["files"], read
    for own in ("numa_binding : Read the node (applied plan, numactl, memory policy probe, drop-in targets)",
                "memlock : Read PID 1's limits and the containerd unit", "gpunuma_state : Read the node's profile state",
                "autonuma : Read kernel.numa_balancing and who sets it",
                "gpu_topology : Write the topology inventory on the node"):
        assert own not in counts["ran"], own
    assert "/etc/gpunuma/topology.json" in json.dumps(counts["ran"]["numa_binding : Install the units and start the instances"])
    assert json.loads(node.sh("cat /etc/gpunuma/topology.json"))["schema"] == "gpunuma.topology/v1"
    unit_text = node.sh("cat " + UNIT_A)

    # 2. Nothing moved: the run ends at the check.
    rc, check, counts, out = _site(inventory)
    assert rc == 0, out
    assert check["converged"] is True, check["reasons"]
    assert counts["changed"] == 0 and counts["round_trips"] == 1, counts
    # The check, and the summary's run_once task (on the play's first host).
    assert counts["ok"] <= 3, counts

    # Another run's lease on the node: not converged (that run may be changing it); the whole run waits for
    # the lease (here 1 s) and stops naming its holder, changing nothing.
    lease = {"schema": "gpunuma.lock/v1", "token": "t" * 32, "kind": "run", "holder": {"controller": "ops-ctl"},
             "acquired": 0, "expires": 4102444800}
    node.sh("mkdir -p /run/gpunuma && echo '%s' > /run/gpunuma/lock" % json.dumps(lease))
    rc, check, counts, out = _site(inventory, "-e", "gpunuma_lock_timeout=1")
    assert rc != 0 and check["converged"] is False, out
    assert any("holds the node lock (controller ops-ctl" in r for r in check["reasons"]), check["reasons"]
    assert counts["changed"] == 0
    node.sh("rm /run/gpunuma/lock")

    # 3. Drift, four kinds at once.
    pid_b = node.main_pid("gpunuma-worker-b.service")
    node.sh("echo '# edited by hand' >> %s" % UNIT_A)
    node.sh("systemctl stop gpunuma-worker-b.service")
    node.sh("printf '[Unit]\\n# gpunuma instance old\\n[Service]\\nExecStart=/bin/true\\n' "
            "> /etc/systemd/system/gpunuma-old.service")
    node.sh("chmod 0600 " + LIMITS)
    rc, check, counts, out = _site(inventory)
    assert rc == 0, out
    assert check["converged"] is False
    reasons = "\n".join(check["reasons"])
    for expected in (UNIT_A + " differs", "gpunuma-worker-b.service is inactive", "gpunuma-old.service",
                     LIMITS + " differs"):
        assert expected in reasons, reasons
    assert counts["changed"] > 0
    assert node.sh("cat " + UNIT_A) == unit_text
    assert node.sh("systemctl is-active gpunuma-worker-b.service").strip() == "active"
    assert node.main_pid("gpunuma-worker-b.service") not in (0, pid_b)
    assert node.sh("test -e /etc/systemd/system/gpunuma-old.service && echo yes || echo no").strip() == "no"
    assert node.sh("stat -c %a " + LIMITS).strip() == "644"
    rc, check, counts, out = _site(inventory)
    assert rc == 0 and check["converged"] is True and counts["changed"] == 0, (check, out)

    # 4. Check mode over drift: read-only, nothing changes.
    record_sha = _sha(node, RECORD)
    node.sh("echo '# edited by hand' >> %s" % UNIT_A)
    edited = _sha(node, UNIT_A)
    rc, check, counts, out = _site(inventory, "--check")
    assert rc == 0, out
    assert check["converged"] is False and any(UNIT_A in r for r in check["reasons"])
    assert _sha(node, UNIT_A) == edited and _sha(node, RECORD) == record_sha

    # 5. An input changed: named, applied (the hand edit is mended on the way).
    inventory = _inventory(tmp_path, node, memlock_limit="8M")
    rc, check, counts, out = _site(inventory)
    assert rc == 0, out
    assert any("memlock_limit" in r for r in check["reasons"]), check["reasons"]
    assert re.search(r"memlock\s+8192$", node.sh("cat " + LIMITS), re.M), node.sh("cat " + LIMITS)
    unit = node.sh("cat " + UNIT_A)
    assert "# edited by hand" not in unit and "LimitMEMLOCK=8388608" in unit, unit
    rc, check, counts, out = _site(inventory)
    assert check["converged"] is True, check["reasons"]

    # 6. The same value given with -e is another input (the profile's source is extra-vars).
    rc, check, counts, out = _site(inventory, "-e", "gpunuma_profile=preferred")
    assert rc == 0, out
    assert any("extra_vars" in r for r in check["reasons"]), check["reasons"]

    # Without it again: another input set, another full run.
    rc, check, counts, out = _site(inventory)
    assert any("extra_vars" in r for r in check["reasons"]), check["reasons"]

    # 7. The controller's plan copy gone, the record gone, then damaged: each named, each written again.
    assert plan_copy.exists()
    plan_copy.unlink()
    rc, check, counts, out = _site(inventory)
    assert any("no controller copy of the host's applied plan" in r for r in check["reasons"]), check["reasons"]
    assert plan_copy.exists()
    node.sh("rm " + RECORD)
    rc, check, counts, out = _site(inventory)
    assert rc == 0, out
    assert check["reasons"] == ["no converge record on the node (%s)" % RECORD] and check["gpunuma_round_trips"] == 1
    node.sh("echo '{' > " + RECORD)
    rc, check, counts, out = _site(inventory)
    assert rc == 0, out
    assert any("is not JSON" in r for r in check["reasons"]), check["reasons"]
    rc, check, counts, out = _site(inventory)
    assert check["converged"] is True and counts["changed"] == 0, (check, out)

    # 8. A forged record (a read that runs a command as root, the facts a converged run returns): its seal is not
    # the one this controller kept, so nothing of it is asked again or returned; the full run records anew.
    record = json.loads(node.sh("cat " + RECORD))
    record["reads"].append({"module": "gpunuma_node_info",
                            "args": {"commands": {"x": ["/bin/sh", "-c", "touch /tmp/gpunuma-forged"]}}})
    record["facts"]["gpunuma_plan"] = {"forged": True}
    node.sh("cat > %s <<'EOF'\n%s\nEOF" % (RECORD, json.dumps(record)))
    rc, check, counts, out = _site(inventory)
    assert rc == 0, out
    assert check["converged"] is False and check["gpunuma_round_trips"] == 1, check
    assert check["reasons"] == ["%s is not the record this controller asked the node to keep (its seal differs): "
                                "ignored" % RECORD], check["reasons"]
    assert node.sh("test -e /tmp/gpunuma-forged && echo yes || echo no").strip() == "no"
    assert "forged" not in node.sh("cat " + RECORD) and "forged" not in plan_copy.read_text()
    # The controller's seal gone: the node's record is not replayed at all.
    seal = tmp_path / "topology" / ("%s.converged.seal" % node.name)
    assert oct(seal.stat().st_mode & 0o777) == "0o600"
    seal.unlink()
    rc, check, counts, out = _site(inventory)
    assert check["gpunuma_round_trips"] == 0 and "no controller seal" in check["reasons"][0], check
    rc, check, counts, out = _site(inventory)
    assert check["converged"] is True and counts["changed"] == 0, (check, out)

    # -v says why, and never prints the inputs' digests.
    proc = run_playbook("playbooks/site.yml", inventory, extra=("-v",))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "%s: the node is as the last converge left it; nothing to do" % node.name in proc.stdout
    assert "gpunuma_converge_inputs" not in proc.stdout and "sha256:" not in proc.stdout
