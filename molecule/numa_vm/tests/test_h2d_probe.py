"""The host-to-device probe's placements on the guest's two real NUMA nodes.

h2d_probe.yml (the side_effect step before verify) ran the gpu_validate role
on the converged guest: h2d_probe_info with ``libcuda_path`` pointing at a
fake libcuda (tests/unit/test_h2d_fake_libcuda.c, built on the controller)
that reports one GPU on the stand-in's bus id, then the policy and verdict
on the controller. The fake's copies are memcpy timed on a virtual clock, so
every bandwidth and latency figure here is made up; what is real is each
placement's child process binding itself in the guest kernel
(sched_setaffinity, set_mempolicy) and the probe reading that back from
/proc/self/status, get_mempolicy and move_pages. These tests check the
bindings against the guest's sysfs, read live, not against the probe's own
``*_verified`` flags alone.
"""

import json
import os

import pytest

import gpunuma_probe as probe

# h2d_probe.yml: gpu_validate_node_probe_path and gpu_validate_report_dir.
PROBE_RESULT = "/var/lib/gpunuma-vm/h2d-probe.json"
REPORT = os.path.join(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", ""), "validation", "numa-vm.json")
BOUND = [("local", probe.NODE), ("remote", probe.OTHER_NODE)]


@pytest.fixture(scope="module")
def result(host):
    return probe.load_json(host, PROBE_RESULT)


@pytest.fixture(scope="module")
def gpu(result):
    assert (result["status"], result["reason"]) == ("ok", None)
    assert len(result["gpus"]) == 1, result["gpus"]
    return result["gpus"][0]


@pytest.fixture(scope="module")
def report():
    with open(REPORT, encoding="utf-8") as handle:
        return json.load(handle)


def test_probe_sees_the_guests_two_nodes(host, result):
    assert result["numa_nodes"] == {
        "0": {"cpus": probe.node_cpulist(host, 0), "distances": [10, 20]},
        "1": {"cpus": probe.node_cpulist(host, 1), "distances": [20, 10]},
    }


def test_gpu_is_the_standin_on_node_1_and_remote_is_node_0(host, gpu):
    standins = probe.standin_bus_ids(host)
    assert len(standins) == 1, standins
    assert gpu["pci_bus_id"] == standins[0]
    assert (gpu["numa_node"], gpu["numa_node_source"]) == (probe.NODE, "sysfs numa_node")
    assert gpu["remote_node"] == probe.OTHER_NODE
    assert gpu["status"] == "ok", gpu["reason"]
    assert list(gpu["placements"]) == ["local", "remote", "unbound"]


@pytest.mark.parametrize("placement,node", BOUND, ids=[p for p, _ in BOUND])
def test_bound_placement_runs_on_its_node(host, gpu, placement, node):
    measured = gpu["placements"][placement]
    assert measured["status"] == "ok", measured.get("reason")
    assert measured["node"] == node
    binding = measured["binding"]
    cpus = probe.node_cpulist(host, node)
    assert "cpu_bind_error" not in binding and "mem_bind_error" not in binding, binding
    # asked for the node's CPUs and memory, and the child's /proc/self/status
    # and get_mempolicy say it got them
    assert (binding["requested_cpus"], binding["requested_mem_nodes"]) == (cpus, [node])
    assert binding["cpus_allowed"] == cpus
    assert (binding["mempolicy"], binding["mempolicy_nodes"]) == ("bind", [node])
    # a policy, not a cpuset: every node stays allowed
    assert binding["mems_allowed"] == "0-1"
    # move_pages: every sampled page of both host buffers on the node
    for kind in ("pinned", "pageable"):
        pages = binding["buffer_pages"][kind]
        assert list(pages) == [str(node)] and pages[str(node)] > 0, (kind, pages)
    assert (binding["cpus_verified"], binding["mem_verified"], binding["pages_verified"]) == (True, True, True)


def test_local_and_remote_are_different_nodes(gpu):
    local, remote = (gpu["placements"][p]["binding"] for p in ("local", "remote"))
    assert local["cpus_allowed"] != remote["cpus_allowed"]
    assert local["mempolicy_nodes"] != remote["mempolicy_nodes"]


def test_unbound_placement_is_reported_unbound(host, gpu):
    measured = gpu["placements"]["unbound"]
    assert measured["status"] == "ok", measured.get("reason")
    assert measured["node"] is None
    binding = measured["binding"]
    assert (binding["requested_cpus"], binding["requested_mem_nodes"]) == (None, None)
    # the module's process had every CPU, and the child kept them
    assert binding["cpus_allowed"] == probe.read(host, "/sys/devices/system/cpu/online").strip()
    assert (binding["mempolicy"], binding["mempolicy_nodes"]) == ("default", [])
    for kind in ("pinned", "pageable"):
        pages = binding["buffer_pages"][kind]
        assert pages and set(pages) <= {"0", "1"}, (kind, pages)


def test_report_verifies_every_binding_and_compares_all_three(report, gpu):
    assert report["schema"] == "gpunuma.validation/v1"
    assert report["status"] == "passed", report
    (entry,) = report["gpus"]
    assert entry["pci_bus_id"] == gpu["pci_bus_id"]
    places = entry["placements"]
    assert (places["local"]["node"], places["remote"]["node"], places["unbound"].get("node")) == (1, 0, None)
    assert [places[p]["binding_verified"] for p in ("local", "remote", "unbound")] == [True, True, True]
    controls = {c["id"]: c["status"] for c in entry["controls"]}
    assert controls["gpunuma-h2d-03"] == "pass", entry["controls"]
    # local and remote both measured, so the comparison ran (not "not_applicable")
    assert controls["gpunuma-h2d-02"] == "pass", entry["controls"]
    assert controls["gpunuma-h2d-04"] == "pass", entry["controls"]


def test_verdict_compares_with_unbound_and_remote(report):
    # The fake's virtual clock gives every placement the same pinned figures
    # in every round, so the rank test finds no difference; what this shows is
    # that it weighed the rounds of both references measured on the two-node
    # guest.
    (entry,) = report["gpus"]
    assert entry["verdict"] == "no measurable difference", entry
    assert "unbound: bandwidth" in entry["verdict_reason"] and "remote: bandwidth" in entry["verdict_reason"], entry
    assert entry["comparisons"]["remote"]["bandwidth"]["rounds_x"] == 4, entry["comparisons"]
    assert entry["suggested_rollback"] is None
