"""The README's demo: discovery and planning of the demo fleet.

One run of scripts/demo.sh with the Docker fleet turned off
(GPUNUMA_DEMO_DOCKER=0): it says why in one line and runs the plan-only demo
(playbooks/plan.yml on inventory/demo.yml); every check below reads that
run's tables and the plans it wrote. The live fleet is
tests/integration/test_demo_fleet.py.
"""

import json
import os
import subprocess

import pytest

from ansible_run import ansible_env
from conftest import REPO_ROOT

pytestmark = pytest.mark.ansible


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    state = tmp_path_factory.mktemp("demo") / "demo"
    proc = subprocess.run([os.path.join(REPO_ROOT, "scripts", "demo.sh")], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=900,
                          env=ansible_env(GPUNUMA_DEMO_DOCKER="0", GPUNUMA_DEMO_DIR=str(state)))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return state, proc.stdout


def plan_of(state, host):
    return json.loads((state / "topology" / (host + ".plan.json")).read_text())


def test_tables_are_printed(demo):
    _, out = demo
    assert "FINGERPRINT" in out and "INSTANCE" in out
    for host in ("demo-local", "h200-vm", "mi300x-cpx", "hgx-h200-8gpu", "dgx-a100-nps4", "gb200-4gpu", "dgx1-v100",
                 "pcie-8gpu-plx"):
        assert host in out


def test_recorded_h200_instance_falls_back_to_preferred(demo):
    state, _ = demo
    (instance,) = plan_of(state, "h200-vm")["instances"]
    assert instance["mem_policy"] == "preferred" and "exceeds" in instance["fallback"]
    assert instance["environment"]["CUDA_VISIBLE_DEVICES"].startswith("GPU-")


def test_grace_instances_bind_cpu_nodes_never_gpu_memory_nodes(demo):
    state, _ = demo
    plan = plan_of(state, "gb200-4gpu")
    assert [i["mem_nodes"] for i in plan["instances"]] == [[0], [0], [1], [1]]


def test_nps4_pairs_stay_on_one_node(demo):
    state, _ = demo
    plan = plan_of(state, "dgx-a100-nps4")
    assert sorted(i["numa_nodes"][0] for i in plan["instances"]) == [1, 3, 5, 7]
    assert all(len(i["numa_nodes"]) == 1 and len(i["gpus"]) == 2 for i in plan["instances"])
    # the text names only the GPU nodes; with the host's lscpu the system runs on the other four
    assert sorted(int(n) for n, cpus in plan["housekeeping"].items() if cpus) == [0, 2, 4, 6]
    assert all(i["cpus"].count(",") == 1 for i in plan["instances"])  # each a whole node: 16 cores, 2 ranges


def test_amd_cpx_node_keeps_each_tensor_parallel_group_on_one_gpus_partitions(demo):
    """The MI300X CPX node (63 compute partitions of 8 GPUs, a published KFD capture): each TP8 server gets the
    eight partitions of one GPU, local to its node, selected by ROCm ordinals."""
    state, _ = demo
    topo = json.loads((state / "topology" / "mi300x-cpx.json").read_text())
    assert len(topo["gpus"]) == 63 and {g["vendor"] for g in topo["gpus"]} == {"amd"} and "kfd" in topo["sources"]
    gpus = dict((g["index"], g) for g in topo["gpus"])
    plan = {i["name"]: i for i in plan_of(state, "mi300x-cpx")["instances"]}
    for name in ("tp8-a", "tp8-b"):
        inst = plan[name]
        devices = {gpus[g]["pci_bus_id"] for g in inst["gpus"]}
        assert len(inst["gpus"]) == 8 and len(devices) == 1, inst["gpus"]
        assert inst["numa_nodes"] == [gpus[inst["gpus"][0]]["numa_node"]] and inst["mem_policy"] == "bind"
        assert inst["environment"]["ROCR_VISIBLE_DEVICES"] == ",".join(str(g) for g in inst["gpus"])
        assert "CUDA_VISIBLE_DEVICES" not in inst["environment"]
    assert not set(plan["tp8-a"]["gpus"]) & set(plan["tp8-b"]["gpus"])


def test_unplaceable_gpus_are_not_guessed(demo):
    state, _ = demo
    plan = plan_of(state, "pcie-8gpu-plx")
    assert all(i["mem_policy"] == "default" and i["cpus"] is None and i["fallback"] for i in plan["instances"])


def test_topology_persisted_for_every_host(demo):
    state, _ = demo
    hosts = sorted(p.name for p in (state / "topology").glob("*.json") if not p.name.endswith(".plan.json"))
    assert len(hosts) == 8


def _table_line(out, host, name):
    lines = [line for line in out.splitlines() if line.strip().startswith('"%s ' % host)
             and line.split()[1] == name]
    assert len(lines) == 1, (host, name, lines)
    return lines[0].strip().strip('",')


def test_table_shows_each_instance_nics(demo):
    state, out = demo
    assert "NICS" in out
    shown_any = False
    for host in ("hgx-h200-8gpu", "dgx-a100-nps4", "dgx1-v100"):
        for instance in plan_of(state, host)["instances"]:
            nics = instance.get("nics") or []
            expected = ",".join(nics[:2]) + (" +%d" % (len(nics) - 2) if len(nics) > 2 else "") if nics else "-"
            columns = _table_line(out, host, instance["name"]).split()
            assert columns[7] == expected.split()[0], (host, instance["name"], columns)
            shown_any = shown_any or bool(nics)
    assert shown_any  # the demo's HGX and DGX hosts have NICs next to their GPUs


def test_demo_sh_falls_back_to_the_plan_in_one_line(demo):
    """Where the Docker fleet cannot run (here: turned off), demo.sh says why in one
    line and runs the plan-only demo; no container is started."""
    state, out = demo
    lines = [line for line in out.splitlines() if line.startswith("gpunuma demo: ")]
    assert lines == ["gpunuma demo: plan only: GPUNUMA_DEMO_DOCKER=0 turns the Docker fleet off; "
                     "discovering and planning inventory/demo.yml, nothing is provisioned"]
    assert "FINGERPRINT" in out and "INSTANCE" in out
    # the plan-only demo's state went where it was told, the same as the playbook's own
    assert (state / "topology" / "h200-vm.plan.json").is_file()
    assert not (state / "fleet").exists()
