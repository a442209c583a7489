"""Files site.yml wrote on every fleet member, checked against the plan each
node recorded (/etc/gpunuma/plan.json) and the scenario's host_vars.
"""

import json

from fleet import (
    MANAGED,
    MEMLOCK_BYTES,
    PLAN_PATH,
    UNIT_DIR,
    scenario_host_vars,
    hostname_of,
    plan_of,
    systemd_escaped,
    unit_path,
)

testinfra_hosts = ["ansible://gpunuma_fleet"]


def test_plan_recorded_for_this_node(host):
    plan_file = host.file(PLAN_PATH)
    assert (plan_file.user, plan_file.group, plan_file.mode) == ("root", "root", 0o644)
    plan = plan_of(host)
    assert plan["schema"] == "gpunuma.plan/v1"
    topology = json.loads(host.file("/etc/gpunuma/topology.json").content_string)
    assert plan["topology_fingerprint"] == topology["fingerprint"]
    wanted = [i["name"] for i in scenario_host_vars(hostname_of(host))["gpunuma_instances"]]
    assert [i["name"] for i in plan["instances"]] == wanted
    assert plan["profile"] == scenario_host_vars(hostname_of(host))["gpunuma_profile"]


def test_every_instance_has_its_unit_file(host):
    for instance in plan_of(host)["instances"]:
        unit_file = host.file(unit_path(instance))
        assert unit_file.exists, f"{unit_path(instance)} missing"
        assert (unit_file.user, unit_file.group, unit_file.mode) == ("root", "root", 0o644)
        assert unit_file.content_string.startswith("#\n" + MANAGED)


def test_instance_units_pass_systemd_analyze_verify(host):
    for instance in plan_of(host)["instances"]:
        if instance["mode"] == "service":
            result = host.run(f"systemd-analyze verify {UNIT_DIR}/{instance['unit']}")
            assert result.rc == 0, f"{instance['unit']}: {result.stderr}"


def test_rendered_binding_matches_the_plan(host):
    for instance in plan_of(host)["instances"]:
        text = host.file(unit_path(instance)).content_string
        if instance["binding_method"] == "numactl":
            assert "ExecStart=\"/usr/bin/numactl\" " + " ".join(f'"{a}"' for a in instance["numactl_args"]) in text
        else:
            for key, value in instance["systemd"].items():
                assert f"\n{key}={value}\n" in text
        for name, value in instance["environment"].items():
            assert f'\nEnvironment="{systemd_escaped(name + "=" + value)}"\n' in text
        # The plan decides each unit's limit (plan/planner.unit_memlock); the unit says the same.
        assert instance["limit_memlock"] == (instance["memlock"] if instance["memlock"] is not None else MEMLOCK_BYTES)
        assert f"\nLimitMEMLOCK={instance['limit_memlock']}\n" in text


def test_unit_directory_holds_only_planned_gpunuma_units(host):
    planned = {i["unit"] for i in plan_of(host)["instances"] if i["mode"] == "service"}
    listed = host.check_output(f"find {UNIT_DIR} -maxdepth 1 -name 'gpunuma-*.service' -printf '%f\\n'")
    assert set(listed.split()) == planned


def test_login_memlock_limit_for_the_listed_group(host):
    limits = host.file("/etc/security/limits.d/90-gpunuma-memlock.conf")
    assert (limits.user, limits.group, limits.mode) == ("root", "root", 0o644)
    entries = [line.split() for line in limits.content_string.splitlines() if line and not line.startswith("#")]
    assert entries == [["@gpunuma", "-", "memlock", str(MEMLOCK_BYTES // 1024)]]


def test_numa_balancing_persisted(host):
    sysctl_file = host.file("/etc/sysctl.d/60-gpunuma-numa-balancing.conf")
    assert (sysctl_file.user, sysctl_file.group, sysctl_file.mode) == ("root", "root", 0o644)
    settings = [line for line in sysctl_file.content_string.splitlines() if line and not line.startswith("#")]
    assert settings == ["kernel.numa_balancing=0"]
