"""The CPUs a node really grants, and housekeeping on every socket that holds GPUs.

A node may grant its services fewer CPUs than sysfs lists: a container's or a boot ``CPUAffinity=`` (PID 1's
``Cpus_allowed_list``), a parent slice's cpuset, ``isolcpus=domain``. Discovery reads them into the topology
(``cpus_granted``, ``cpus_isolated``) and the planner plans on what is left, or refuses naming them. A socket that
holds every GPU keeps housekeeping of its own (GPU-less nodes hand theirs over only to socket mates).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, parse_cpulist
from ansible.module_utils.gpunuma.discovery.discover import discover
from ansible.module_utils.gpunuma.discovery.sysfs.host import read_host
from ansible.module_utils.gpunuma.node.housekeeping import irq_target
from ansible.module_utils.gpunuma.plan.model import PlanError
from ansible.module_utils.gpunuma.plan.planner import build_plan
from conftest import examples
from machine_model import Machine
from plan_invariants import check_plan, plan_or_error
from test_plan import profile

pytestmark = pytest.mark.unit


def _write(root, relative, text):
    path = os.path.join(root, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)


def _status(cpus):
    return "Name:\tsystemd\nPid:\t1\nCpus_allowed:\tff\nCpus_allowed_list:\t%s\nMems_allowed_list:\t0-1\n" % cpus


def _tree(tmp_path, machine, pid1=None, parent_cpus=None, isolated=None, pid1_cgroup="/init.scope"):
    """A machine's sysfs; ``pid1``: PID 1's Cpus_allowed_list; ``parent_cpus``: cgroup v2 with the cpuset
    controller, PID 1 in ``pid1_cgroup``, its parent's cpuset.cpus.effective."""
    root = str(tmp_path / "root")
    machine.sysfs(root)
    if pid1 is not None:
        _write(root, "proc/1/status", _status(pid1))
    if parent_cpus is not None:
        _write(root, "sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory pids\n")
        _write(root, "proc/1/cgroup", "0::%s\n" % pid1_cgroup)
        parent = os.path.dirname(pid1_cgroup).strip("/")
        _write(root, os.path.join("sys/fs/cgroup", parent, "cpuset.cpus.effective"), parent_cpus + "\n")
    if isolated is not None:
        _write(root, "sys/devices/system/cpu/isolated", isolated + "\n")
    return root


def _topology(root):
    return discover("m", sysfs_root=root, sources=["sysfs"])["topology"]


TWO_SOCKETS = Machine(sockets=2, nodes_per_socket=1, cores_per_node=8, smt=2, l3_cores=8, gpu_nodes=[0, 1])


# -- discovery -----------------------------------------------------------------------------------------------------


def test_without_cgroup_v2_pid1s_affinity_is_the_grant(tmp_path):
    # CPUs 0-15 first threads, 16-31 siblings; a container's --cpuset-cpus leaves PID 1 on 2-13,18-29.
    root = _tree(tmp_path, TWO_SOCKETS, pid1="2-13,18-29")
    assert read_host(root)["cpus_granted"] == "2-13,18-29"
    topology = _topology(root)
    assert topology["cpus_granted"] == "2-13,18-29"
    assert "cpus_isolated" not in topology
    # What the node grants is not hardware: the fingerprint stays that of the whole machine.
    assert topology["fingerprint"] == _topology(_tree(tmp_path / "other", TWO_SOCKETS))["fingerprint"]


def test_with_cgroup_v2_the_parent_of_pid1s_cgroup_is_the_grant_not_gpunumas_own_fence(tmp_path):
    """gpunuma's housekeeping confinement puts init.scope (PID 1) and system.slice on the housekeeping CPUs: read
    back, they would shrink every later plan to those. The cgroup that holds them is what the node grants."""
    root = _tree(tmp_path, TWO_SOCKETS, pid1="0,16", parent_cpus="0-11,16-27")
    assert _topology(root)["cpus_granted"] == "0-11,16-27"
    # A system container: PID 1 deeper in the host's tree, its container's cpuset above it.
    nested = _tree(tmp_path / "nested", TWO_SOCKETS, parent_cpus="4-7,20-23",
                   pid1_cgroup="/system.slice/docker-1.scope/init.scope")
    assert _topology(nested)["cpus_granted"] == "4-7,20-23"
    # Everything granted: nothing in the topology.
    assert "cpus_granted" not in _topology(_tree(tmp_path / "all", TWO_SOCKETS, pid1="0", parent_cpus="0-31"))


def test_a_cgroup_path_that_climbs_out_is_named_and_unknown(tmp_path):
    root = _tree(tmp_path, TWO_SOCKETS, parent_cpus="0-3")
    _write(root, "proc/1/cgroup", "0::/../../etc/x\n")
    host = read_host(root)
    assert host["cpus_granted"] is None
    assert any("proc/1/cgroup names cgroup" in w for w in host["warnings"]), host["warnings"]


def test_everything_granted_and_nothing_isolated_leave_the_topology_as_it_was(tmp_path):
    root = _tree(tmp_path, TWO_SOCKETS, pid1="0-31", isolated="")
    topology = _topology(root)
    assert "cpus_granted" not in topology and "cpus_isolated" not in topology
    assert topology["complete"] is True


def test_isolated_cpus_are_read(tmp_path):
    root = _tree(tmp_path, TWO_SOCKETS, isolated="12-15,28-31")
    assert _topology(root)["cpus_isolated"] == "12-15,28-31"


@pytest.mark.parametrize("status", ["Name:\tsystemd\n", "Cpus_allowed_list:\t0-x\n"])
def test_a_damaged_pid1_status_is_named_and_treated_as_unknown(tmp_path, status):
    root = _tree(tmp_path, TWO_SOCKETS)
    _write(root, "proc/1/status", status)
    host = read_host(root)
    assert host["cpus_granted"] is None
    assert any("proc/1/status" in w for w in host["warnings"])
    assert os.path.join(root, "proc/1/status") in host["lost"]


def test_a_grant_without_any_node_cpu_is_said_and_not_planned_on(tmp_path):
    root = _tree(tmp_path, TWO_SOCKETS, pid1="200-201")
    topology = _topology(root)
    assert "cpus_granted" not in topology
    assert any("grants its services no CPU" in w for w in topology["warnings"])


# -- planning ------------------------------------------------------------------------------------------------------


def _instances(machine, **extra):
    return [dict({"name": "w%d" % i, "gpus": [i], "command": ["/usr/bin/serve"]}, **extra)
            for i in range(len(machine.gpu_nodes))]


def test_the_plan_names_only_granted_cpus_and_says_why(tmp_path):
    topology = _topology(_tree(tmp_path, TWO_SOCKETS, pid1="2-13,18-29"))
    plan = build_plan(topology, profile("strict"), _instances(TWO_SOCKETS))
    check_plan(plan, topology, _instances(TWO_SOCKETS))
    named = frozenset()
    for key in ("housekeeping", "worker_cpus"):
        for text in plan[key].values():
            named |= parse_cpulist(text)
    assert named == parse_cpulist("2-13,18-29")
    assert any("outside what the node grants" in w and "0-1,14-17,30-31" in w for w in plan["warnings"])


def test_isolated_cpus_are_left_out_with_the_kernel_rule_named(tmp_path):
    topology = _topology(_tree(tmp_path, TWO_SOCKETS, isolated="4-7,20-23"))
    plan = build_plan(topology, profile("strict"), _instances(TWO_SOCKETS))
    for text in list(plan["housekeeping"].values()) + list(plan["worker_cpus"].values()):
        assert not parse_cpulist(text) & parse_cpulist("4-7,20-23")
    assert any("isolcpus" in w and "kernel-parameters" in w for w in plan["warnings"])


def test_explicit_housekeeping_cpus_outside_the_grant_are_refused(tmp_path):
    topology = _topology(_tree(tmp_path, TWO_SOCKETS, pid1="2-15,18-31"))
    with pytest.raises(PlanError) as caught:
        build_plan(topology, profile("strict"), [], housekeeping_cpus="0,16")
    assert "housekeeping_cpus: CPUs 0,16 are not granted" in str(caught.value)


def test_a_gpu_node_left_without_a_granted_cpu_is_named(tmp_path):
    # Node 1 (CPUs 8-15,24-31) is outside the grant: its GPU cannot be bound there.
    topology = _topology(_tree(tmp_path, TWO_SOCKETS, pid1="0-7,16-23"))
    result, plan = plan_or_error(topology, profile("strict"), _instances(TWO_SOCKETS))
    text = "\n".join(plan["warnings"]) if result == "plan" else str(plan)
    assert "GPU 1 is on NUMA node 1, which keeps no CPU the node grants" in text
    assert "NUMA node 1 keeps no CPU to plan on" in text


def test_a_socket_that_holds_every_gpu_keeps_housekeeping_of_its_own(tmp_path):
    machine = Machine(sockets=2, nodes_per_socket=1, cores_per_node=8, smt=2, l3_cores=8, gpu_nodes=[0, 0, 0, 0])
    topology = _sysfs_topology(tmp_path, machine)
    plan = build_plan(topology, profile("strict"), _instances(machine), irq_pin=True)
    assert plan["housekeeping"]["0"], "the socket with every GPU kept no housekeeping"
    # Its devices' interrupts stay on their socket: pinned to node 0's own housekeeping.
    assert irq_target(topology, plan["housekeeping"], 0) == (plan["housekeeping"]["0"], 0)


def test_nps_nodes_without_gpus_still_keep_the_housekeeping_of_their_socket(tmp_path):
    # Two sockets of two nodes; GPUs on nodes 0 and 2: nodes 1 and 3 keep it, as NPS2/SNC2 wants.
    machine = Machine(sockets=2, nodes_per_socket=2, cores_per_node=8, smt=2, l3_cores=4, gpu_nodes=[0, 2])
    plan = build_plan(_sysfs_topology(tmp_path, machine), profile("strict"), _instances(machine))
    assert plan["housekeeping"]["0"] == "" and plan["housekeeping"]["2"] == ""
    assert plan["housekeeping"]["1"] and plan["housekeeping"]["3"]


def _sysfs_topology(directory, machine, **files):
    root = os.path.join(str(directory), "root")
    machine.sysfs(root)
    for relative, text in files.items():
        _write(root, relative, text)
    return _topology(root)


@st.composite
def narrowed_machines(draw):
    cores = draw(st.sampled_from([4, 6, 8]))
    sockets = draw(st.integers(1, 2))
    per_socket = draw(st.sampled_from([1, 2]))
    nodes = sockets * per_socket
    # GPUs anywhere, or all on one socket.
    one_socket = draw(st.booleans())
    choices = list(range(per_socket)) if one_socket else list(range(nodes))
    gpus = draw(st.lists(st.sampled_from(choices), min_size=1, max_size=4))
    machine = Machine(sockets, per_socket, cores, draw(st.sampled_from([1, 2])), cores, gpus)
    every = list(range(machine.core_count * machine.smt))
    granted = draw(st.one_of(st.none(), st.sets(st.sampled_from(every), min_size=1)))
    isolated = draw(st.one_of(st.none(), st.sets(st.sampled_from(every), max_size=len(every) // 2)))
    return machine, granted, isolated


@settings(max_examples=examples(60), deadline=None)
@given(case=narrowed_machines(), irq_pin=st.booleans(), profile_name=st.sampled_from(["strict", "preferred"]))
def test_every_cpu_a_plan_names_is_granted_and_every_gpu_socket_keeps_housekeeping(tmp_path_factory, case, irq_pin,
                                                                                  profile_name):
    machine, granted, isolated = case
    files = {}
    if granted is not None:
        files["proc/1/status"] = _status(format_cpulist(granted))
    if isolated is not None:
        files["sys/devices/system/cpu/isolated"] = format_cpulist(isolated) + "\n"
    topology = _sysfs_topology(tmp_path_factory.mktemp("m"), machine, **files)
    usable = frozenset(range(machine.core_count * machine.smt))
    if granted is not None:
        usable &= frozenset(granted)
    usable -= frozenset(isolated or ())
    instances = _instances(machine)
    result, plan = plan_or_error(topology, profile(profile_name), instances, irq_pin=irq_pin)
    if result == "error":
        # A refusal names what narrowed the node, never a CPU numactl would refuse.
        assert granted is not None or isolated, plan.problems
        return
    check_plan(plan, topology, instances)
    named = frozenset()
    for key in ("housekeeping", "worker_cpus"):
        for text in plan[key].values():
            named |= parse_cpulist(text)
    for inst in plan["instances"]:
        if inst["cpus"]:
            named |= parse_cpulist(inst["cpus"])
    assert named <= usable, "CPUs %s are not granted or are isolated" % format_cpulist(named - usable)
    # Each socket whose nodes hold GPUs keeps housekeeping on one of its nodes (when it has a usable CPU).
    for socket in range(machine.sockets):
        nodes = [n for n in range(machine.node_count) if machine.socket_of(n) == socket]
        has_gpu = any(machine.gpu_nodes.count(n) for n in nodes)
        has_usable = any(frozenset(machine.node_cpus(n)) & usable for n in nodes)
        if has_gpu and has_usable and plan["options"]["housekeeping_cores_per_node"] == "auto":
            kept = [n for n in nodes if plan["housekeeping"].get(str(n))]
            assert kept, "socket %d holds GPUs and keeps no housekeeping: %r" % (socket, plan["housekeeping"])
