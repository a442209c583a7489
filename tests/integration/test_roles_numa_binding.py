"""numa_binding against a real systemd: restart only what changed, roll back
a unit that does not stay up, prune, honest check mode, and the
set_mempolicy probe in a container without CAP_SYS_NICE.

Each test boots its own container from the fleet's base image
(gpunuma/debian-systemd:bookworm, built by scripts/build-base-image.sh) and
drives it with the community.docker.docker connection, as molecule does.
Skipped only when there is no Docker engine or no base image.
"""

import json
import os
import subprocess

import pytest
import yaml

from ansible_run import BINDIR, ansible_env
from conftest import REPO_ROOT
from containers import UNIT_DIR, Node, needs_docker

pytestmark = [pytest.mark.container, needs_docker]

@pytest.fixture
def node():
    created = Node()
    yield created
    created.remove()


def apply(node, tmp_path, instances, check=False, **role_vars):
    """Run gpu_topology + numa_binding on the container; return the process."""
    inventory = tmp_path / "inventory.yml"
    host_vars = {
        "ansible_connection": "community.docker.docker",
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_managed": "Managed by gpunuma; local edits are overwritten",
        "gpu_topology_controller_dir": str(tmp_path / "topology"),
        "gpunuma_instances": instances,
        "numa_binding_settle_seconds": 3,
    }
    host_vars.update(role_vars)
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {node.name: host_vars}}}))
    playbook = tmp_path / "apply.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False,
                                         "roles": ["gpu_topology", "numa_binding"]}]))
    cmd = [os.path.join(BINDIR, "ansible-playbook"), "-i", str(inventory), str(playbook)]
    if check:
        cmd.extend(["--check", "--diff"])
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=ansible_env())


SLEEPER = {"name": "steady", "numa_node": 0, "share_cpus": True, "command": ["/bin/sleep", "infinity"]}


def test_failed_change_is_rolled_back_and_others_keep_running(node, tmp_path):
    worker = {"name": "worker", "numa_node": 0, "share_cpus": True, "command": ["/bin/sleep", "infinity"]}
    first = apply(node, tmp_path, [SLEEPER, worker])
    assert first.returncode == 0, first.stdout[-4000:]
    good_unit = node.sh("cat %s/gpunuma-worker.service" % UNIT_DIR)
    steady_pid = node.main_pid("gpunuma-steady.service")

    broken = dict(worker, command=["/bin/sh", "-c", "exit 3"])
    second = apply(node, tmp_path, [SLEEPER, broken])
    assert second.returncode != 0
    assert "instance units failed to start: gpunuma-worker.service" in second.stdout
    assert "rolled back to their previous files" in second.stdout
    assert "status=3" in second.stdout  # the journal of the failed unit is in the report
    assert node.sh("cat %s/gpunuma-worker.service" % UNIT_DIR) == good_unit
    assert node.sh("systemctl is-active gpunuma-worker.service").strip() == "active"
    # The unchanged instance was never restarted.
    assert node.main_pid("gpunuma-steady.service") == steady_pid
    # The failed plan is not recorded as applied.
    recorded = json.loads(node.sh("cat /etc/gpunuma/plan.json"))
    assert next(i for i in recorded["instances"] if i["name"] == "worker")["command"] == ["/bin/sleep", "infinity"]


def test_new_instance_that_fails_is_removed(node, tmp_path):
    proc = apply(node, tmp_path, [dict(SLEEPER, name="dud", command=["/bin/false"])])
    assert proc.returncode != 0
    assert "gpunuma-dud.service" in proc.stdout
    assert node.sh("ls %s" % UNIT_DIR).split().count("gpunuma-dud.service") == 0
    assert node.sh("systemctl is-enabled gpunuma-dud.service", check=False).strip() != "enabled"


def test_changed_instance_restarts_alone_and_stale_units_are_pruned(node, tmp_path):
    other = dict(SLEEPER, name="other")
    first = apply(node, tmp_path, [SLEEPER, other])
    assert first.returncode == 0, first.stdout[-4000:]
    steady_pid = node.main_pid("gpunuma-steady.service")
    # A unit named like gpunuma's but not written by it is never pruned.
    node.sh("printf '[Service]\\nExecStart=/bin/sleep infinity\\n' > %s/gpunuma-foreign.service" % UNIT_DIR)

    second = apply(node, tmp_path, [SLEEPER])
    assert second.returncode == 0, second.stdout[-4000:]
    assert node.main_pid("gpunuma-steady.service") == steady_pid
    units = node.sh("ls %s" % UNIT_DIR).split()
    assert "gpunuma-other.service" not in units
    assert "gpunuma-foreign.service" in units
    assert node.sh("systemctl is-active gpunuma-other.service", check=False).strip() in ("inactive", "unknown")

    changed = dict(SLEEPER, environment={"MODE": "new"})
    third = apply(node, tmp_path, [changed])
    assert third.returncode == 0, third.stdout[-4000:]
    new_pid = node.main_pid("gpunuma-steady.service")
    assert new_pid != steady_pid
    assert "MODE=new" in node.sh("tr '\\0' '\\n' < /proc/%d/environ" % new_pid)


def test_removed_dropin_unbinds_the_running_unit(node, tmp_path):
    node.sh("printf '[Service]\\nExecStart=/bin/sleep infinity\\n[Install]\\nWantedBy=multi-user.target\\n'"
            " > %s/vendor.service && systemctl daemon-reload && systemctl enable --now vendor.service" % UNIT_DIR)
    bound = apply(node, tmp_path, [{"name": "vendor", "unit": "vendor.service", "numa_node": 0, "share_cpus": True,
                                          "memory": "64M"}])
    assert bound.returncode == 0, bound.stdout[-4000:]
    pid = node.main_pid("vendor.service")
    assert "bind:0" in node.sh("head -1 /proc/%d/numa_maps" % pid)

    unbound = apply(node, tmp_path, [])
    assert unbound.returncode == 0, unbound.stdout[-4000:]
    assert node.sh("ls %s/vendor.service.d/" % UNIT_DIR, check=False).strip() == ""
    pid_after = node.main_pid("vendor.service")
    assert pid_after != pid
    assert node.sh("head -1 /proc/%d/numa_maps" % pid_after).split()[1] == "default"


def test_check_mode_reports_but_changes_nothing(node, tmp_path):
    proc = apply(node, tmp_path, [SLEEPER], check=True)
    assert proc.returncode == 0, proc.stdout[-4000:]
    # The unit it would write is reported as a change, with its diff.
    section = proc.stdout.split("TASK [numa_binding : Install the units and start the instances]")[1].split("TASK [")[0]
    assert "changed: [%s]" % node.name in section
    assert "+++ after: %s/gpunuma-steady.service" % UNIT_DIR in proc.stdout
    assert "+ExecStart=" in proc.stdout
    assert "gpunuma-steady.service" not in node.sh("ls %s" % UNIT_DIR)
    assert node.sh("ls /etc/gpunuma 2>/dev/null || true").strip() == ""


def test_refused_set_mempolicy_fails_with_the_fix_or_falls_back(tmp_path):
    node = Node(sys_nice=False)
    try:
        refused = apply(node, tmp_path, [SLEEPER])
        assert refused.returncode != 0
        assert "set_mempolicy is refused here" in refused.stdout
        assert "--cap-add SYS_NICE" in refused.stdout and "securityContext.capabilities.add" in refused.stdout
        assert "gpunuma-steady.service" not in node.sh("ls %s" % UNIT_DIR)

        fallback = apply(node, tmp_path, [SLEEPER], numa_binding_on_mempolicy_denied="fallback")
        assert fallback.returncode == 0, fallback.stdout[-4000:]
        unit = node.sh("cat %s/gpunuma-steady.service" % UNIT_DIR)
        assert "--physcpubind=" in unit and "--membind" not in unit
        plan = json.loads(node.sh("cat /etc/gpunuma/plan.json"))
        assert plan["profile"] == "strict-cpu-only"
        assert any("set_mempolicy is refused" in w for w in plan["warnings"])
        assert node.sh("systemctl is-active gpunuma-steady.service").strip() == "active"
    finally:
        node.remove()


def test_dropin_on_a_unit_that_launches_a_container_is_refused(node, tmp_path):
    node.sh("printf '[Service]\\nExecStart=/usr/bin/docker run --rm example/vllm\\n' > %s/vendor.service"
            " && systemctl daemon-reload" % UNIT_DIR)
    vendor = {"name": "vendor", "unit": "vendor.service", "numa_node": 0, "share_cpus": True, "memory": "64M"}
    refused = apply(node, tmp_path, [vendor])
    assert refused.returncode != 0
    assert "binds unit vendor.service, whose ExecStart= launches a container (docker run)" in refused.stdout
    assert node.sh("ls %s/vendor.service.d/ 2>/dev/null || true" % UNIT_DIR).strip() == ""
    allowed = apply(node, tmp_path, [vendor], numa_binding_allow_dropin_hazards=True)
    assert allowed.returncode == 0, allowed.stdout[-4000:]
    assert "CPUAffinity=" in node.sh("cat %s/vendor.service.d/50-gpunuma.conf" % UNIT_DIR) or \
        "numactl" in node.sh("cat %s/vendor.service.d/50-gpunuma.conf" % UNIT_DIR)


def test_instance_unit_has_a_reachable_start_limit(node, tmp_path):
    proc = apply(node, tmp_path, [SLEEPER])
    assert proc.returncode == 0, proc.stdout[-4000:]
    shown = node.sh("systemctl show --property=StartLimitIntervalUSec,StartLimitBurst,RestartUSec "
                    "gpunuma-steady.service")
    values = dict(line.split("=", 1) for line in shown.split())
    assert values["StartLimitBurst"] == "5"
    assert values["StartLimitIntervalUSec"] == "10min"
    # Five restarts 5 s apart fit in the interval: the limit is reachable.
    assert values["RestartUSec"] == "5s"


def test_restart_settles_only_when_ready_else_rolls_back(node, tmp_path):
    # The readiness command runs with the instance's account, never as root
    # (a script the service account can write must not gain root).
    node.sh("rm -f /tmp/gpunuma-ready-id")
    first = apply(node, tmp_path, [dict(SLEEPER, ready={"command": ["/bin/sh", "-c", "id -un > /tmp/gpunuma-ready-id"],
                                                        "timeout": 5, "interval": 1})])
    assert first.returncode == 0, first.stdout[-4000:]
    user = node.sh("systemctl show -p User --value gpunuma-steady.service").strip()
    assert user and user != "root"
    assert node.sh("cat /tmp/gpunuma-ready-id").strip() == user
    good = node.sh("cat %s/gpunuma-steady.service" % UNIT_DIR)
    never = dict(SLEEPER, environment={"MODE": "new"},
                 ready={"command": ["/bin/sh", "-c", "echo warming up; exit 1"], "timeout": 3, "interval": 1})
    second = apply(node, tmp_path, [never])
    assert second.returncode != 0
    out = " ".join(second.stdout.split())
    assert "instance units failed to start: gpunuma-steady.service" in out
    assert "not ready: /bin/sh -c echo warming up; exit 1 after 3 s (/bin/sh exited 1: warming up)" in out
    assert node.sh("cat %s/gpunuma-steady.service" % UNIT_DIR) == good
    assert node.sh("systemctl is-active gpunuma-steady.service").strip() == "active"


def test_missing_numactl_is_refused_without_consent_before_anything_is_written(node, tmp_path):
    """numactl.yml is included only where the plan needs numactl and the node lacks it: without
    numa_binding_install_numactl the run stops naming the instances and the variable, nothing written."""
    node.sh("mv /usr/bin/numactl /usr/bin/numactl.off")
    before = node.sh("ls -A %s" % UNIT_DIR)
    proc = apply(node, tmp_path, [SLEEPER], numa_binding_install_numactl=False)
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "/usr/bin/numactl does not exist, and instances steady run under numactl" in proc.stdout, proc.stdout[-3000:]
    assert "numa_binding_install_numactl: true" in proc.stdout
    assert node.sh("ls -A %s" % UNIT_DIR) == before
    assert node.sh("test -e /run/gpunuma/lock && cat /run/gpunuma/lock || true").strip() == ""
    node.sh("mv /usr/bin/numactl.off /usr/bin/numactl")
    again = apply(node, tmp_path, [SLEEPER], numa_binding_install_numactl=False)
    assert again.returncode == 0, again.stdout[-3000:]
    assert "numactl" in node.sh("cat %s/gpunuma-steady.service" % UNIT_DIR)
