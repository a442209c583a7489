"""Live state of the instances that run (live-node, cpu-only): CPUs, memory
policy and memlock limit as the kernel sees them in /proc/<pid>/.
"""

from fleet import (
    MEMLOCK_BYTES,
    NUMA_MAPS_POLICY,
    cpu_set,
    main_pid,
    memlock_limits,
    plan_of,
    status_field,
)

testinfra_hosts = ["ansible://live-node", "ansible://cpu-only"]


def test_service_instances_enabled_and_running(host):
    for instance in plan_of(host)["instances"]:
        if instance["mode"] == "service":
            service = host.service(instance["unit"])
            assert service.is_enabled and service.is_running, instance["unit"]


def test_running_instances_are_bound_as_planned(host):
    for instance in plan_of(host)["instances"]:
        pid = main_pid(host, instance["unit"])
        assert cpu_set(status_field(host, pid, "Cpus_allowed_list")) == cpu_set(instance["cpus"]), instance["name"]
        policies = set(
            line.split()[1] for line in host.file(f"/proc/{pid}/numa_maps").content_string.splitlines()
        )
        nodes = ",".join(str(n) for n in instance["mem_nodes"])
        assert policies == {f"{NUMA_MAPS_POLICY[instance['mem_policy']]}:{nodes}"}, instance["name"]


def test_running_instances_get_their_memlock_limit(host):
    for instance in plan_of(host)["instances"]:
        pid = main_pid(host, instance["unit"])
        expected = str(instance["memlock"] if instance["memlock"] is not None else MEMLOCK_BYTES)
        assert memlock_limits(host, pid) == (expected, expected), instance["name"]
