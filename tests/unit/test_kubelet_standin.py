"""The STAND-IN kubelet of the molecule scenario `kubelet` refuses where the real kubelet documents it would.

The scenario's rollback test is only as good as the stand-in's refusals, so
each refusal is checked here, and the configs gpunuma generates are checked
to pass it. The stand-in is molecule/kubelet/files/kubelet-standin.py; it is
not the kubelet.
"""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from ansible.module_utils.gpunuma.kubelet.plan import plan_kubelet
from ansible.module_utils.gpunuma.plan.profiles import load_profile, parse_profile_text
from conftest import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.unit

STANDIN = os.path.join(REPO_ROOT, "molecule", "kubelet", "files", "kubelet-standin.py")
BASE = {"kind": "KubeletConfiguration", "apiVersion": "kubelet.config.k8s.io/v1beta1"}


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_standin(tmp_path, config, cpu=None, mem=None, numa="0", wait=8.0):
    """Start the stand-in; return (started, stderr). A started one is stopped again."""
    root = tmp_path / "kubelet"
    root.mkdir(exist_ok=True)
    if cpu is not None:
        (root / "cpu_manager_state").write_text(json.dumps({"policyName": cpu}))
    if mem is not None:
        (root / "memory_manager_state").write_text(json.dumps({"policyName": mem}))
    config = dict(config, healthzPort=_free_port())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    env = dict(os.environ, STANDIN_NUMA_NODES=numa, STANDIN_STATE_DIR=str(tmp_path / "standin"))
    proc = subprocess.Popen([sys.executable, STANDIN, "--config", str(path), "--root-dir", str(root)],
                            stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + wait
    while time.time() < deadline:
        if proc.poll() is not None:
            return False, proc.stderr.read()
        try:
            with socket.create_connection(("127.0.0.1", config["healthzPort"]), timeout=0.2):
                proc.terminate()
                proc.wait(5)
                return True, proc.stderr.read()
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("stand-in neither started nor exited")


def test_defaults_start_and_write_checkpoints(tmp_path):
    started, err = run_standin(tmp_path, BASE)
    assert started, err
    assert json.loads((tmp_path / "kubelet" / "cpu_manager_state").read_text())["policyName"] == "none"
    assert json.loads((tmp_path / "kubelet" / "memory_manager_state").read_text())["policyName"] == "None"


def test_checkpoint_policy_mismatch_is_refused(tmp_path):
    config = dict(BASE, cpuManagerPolicy="static", reservedSystemCPUs="0")
    started, err = run_standin(tmp_path, config, cpu="none")
    assert not started
    assert 'configured policy "static" differs from state checkpoint policy "none"' in err


def test_memory_sum_rule_is_enforced(tmp_path):
    config = dict(BASE, memoryManagerPolicy="Static", reservedMemory=[{"numaNode": 0, "limits": {"memory": "50Mi"}}])
    started, err = run_standin(tmp_path, config)
    assert not started and "is not equal to the value" in err
    config["reservedMemory"][0]["limits"]["memory"] = "100Mi"
    assert run_standin(tmp_path, config)[0]


def test_more_than_eight_nodes_needs_the_option(tmp_path):
    config = dict(BASE, topologyManagerPolicy="single-numa-node")
    started, err = run_standin(tmp_path, config, numa="0-33")
    assert not started and "more than 8 NUMA Nodes" in err
    config["topologyManagerPolicyOptions"] = {"max-allowable-numa-nodes": "34"}
    assert run_standin(tmp_path, config, numa="0-33")[0]


def test_reserved_memory_on_a_missing_node_is_refused(tmp_path):
    config = dict(BASE, memoryManagerPolicy="Static", reservedMemory=[
        {"numaNode": 0, "limits": {"memory": "50Mi"}}, {"numaNode": 1, "limits": {"memory": "50Mi"}}])
    started, err = run_standin(tmp_path, config, numa="0")
    assert not started and "NUMA node 1" in err
    assert run_standin(tmp_path, config, numa="0-1")[0]


@pytest.mark.parametrize("topo,numa", [("gb200-4gpu-34numa.json", "0-33"), ("hgx-h200-8gpu-2socket-ht.json", "0-1")])
def test_gpunuma_strict_config_passes_after_the_planned_checkpoint_removal(tmp_path, topo, numa):
    with open(os.path.join(FIXTURES, "topologies", topo), encoding="utf-8") as handle:
        topology = json.load(handle)
    with open(os.path.join(REPO_ROOT, "policies", "kubelet", "strict.yml"), encoding="utf-8") as handle:
        preset = parse_profile_text(handle.read())
    result = plan_kubelet(topology, load_profile("strict", os.path.join(REPO_ROOT, "policies", "profiles")), preset,
                          json.dumps(BASE), kubelet_version="1.33", memory_spread="cpu_nodes",
                          cpu_state=json.dumps({"policyName": "none"}), memory_state=json.dumps({"policyName": "None"}))
    # Without removing the checkpoints the stand-in refuses, as the kubelet does ...
    assert not run_standin(tmp_path, result.config, cpu="none", mem="None", numa=numa)[0]
    # ... and with the planned removal it starts.
    assert result.remove_checkpoints == ["/var/lib/kubelet/cpu_manager_state", "/var/lib/kubelet/memory_manager_state"]
    for path in result.remove_checkpoints:
        (tmp_path / "kubelet" / os.path.basename(path)).unlink()
    assert run_standin(tmp_path, result.config, numa=numa)[0]
