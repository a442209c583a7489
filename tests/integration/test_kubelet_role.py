"""The kubelet_topology role on localhost against temporary files: bad input stops it before any change.

The transition itself (stop, checkpoints, rollback) runs against the stand-in
kubelet in the molecule scenario `kubelet`; here only the planning half runs,
on files under a temporary directory, in normal and in check mode.
"""

import json
import os

import pytest
import yaml

from ansible_run import run_playbook
from conftest import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.ansible

ROLE = os.path.join(REPO_ROOT, "roles", "kubelet_topology")
HGX = os.path.join(FIXTURES, "topologies", "hgx-h200-8gpu-2socket-ht.json")


def _run(tmp_path, config_text, check=False, **role_vars):
    config = tmp_path / "config.yaml"
    config.write_text(config_text)
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    (state / "cpu_manager_state").write_text('{"policyName": "none"}')
    variables = {
        "kubelet_topology_topology": json.load(open(HGX, encoding="utf-8")),
        "kubelet_topology_config_path": str(config),
        "kubelet_topology_state_dir": str(state),
        "kubelet_topology_kubelet_version": "1.31",
        "gpunuma_profile": "strict",
        # The memory checkpoint check's script and kubelet drop-in stay in the temporary directory: this
        # machine is not a kubelet node (the check itself: test_kubelet_real.py, test_kubelet_memory_checkpoint.py).
        "kubelet_topology_libexec_dir": str(tmp_path / "libexec"),
        "kubelet_topology_unit_dir": str(tmp_path / "units"),
        "kubelet_topology_memory_checkpoint_guard": False,
    }
    variables.update(role_vars)
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "kubelet plan", "hosts": "all", "gather_facts": False,
        "vars": variables,
        "tasks": [{"name": "Run the role", "ansible.builtin.include_role": {"name": "kubelet_topology"}}],
    }]))
    inventory = tmp_path / "inventory.yml"
    import sys

    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"gpu-k01": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    proc = run_playbook(str(playbook), str(inventory), check=check)
    return proc, config


KUBEADM = open(os.path.join(FIXTURES, "kubelet", "kubeadm-config.yaml"), encoding="utf-8").read()


@pytest.mark.parametrize("role_vars,expected", [
    ({"kubelet_topology_state_dir": "var/lib/kubelet"}, "kubelet_topology_state_dir is 'var/lib/kubelet'; allowed: an absolute path"),
    ({"kubelet_topology_python": "python3"}, "kubelet_topology_python is 'python3'; allowed: an absolute path"),
    ({"kubelet_topology_service": "kubelet"}, "kubelet_topology_service is 'kubelet'; allowed: a systemd service name"),
])
def test_a_setting_the_checkpoint_check_cannot_carry_stops_the_plan(tmp_path, role_vars, expected):
    """Checked by the plan step (guard_settings), not first by the apply step: in site.yml that is the validation
    play, before any host changes."""
    proc, config = _run(tmp_path, KUBEADM, **role_vars)
    assert proc.returncode != 0
    out = " ".join(proc.stdout.split())
    assert "TASK [kubelet_topology : Plan the kubelet settings]" in proc.stdout
    failed_at = out.split("fatal: [gpu-k01")[0]
    assert "Write the kubelet settings" not in failed_at, proc.stdout[-3000:]
    assert "gpu-k01: the kubelet settings cannot be planned; nothing was changed" in proc.stdout
    assert expected in out, proc.stdout[-3000:]
    assert config.read_text() == KUBEADM and not (tmp_path / "units").exists()


@pytest.mark.parametrize("overrides,expected", [
    ({"memoryManagerPolicy": "static"},
     "memoryManagerPolicy: 'static' is not a Memory Manager policy (the case matters); allowed: None, Static"),
    ({"reservedSystemCPUs": "0,500"},
     "reservedSystemCPUs: '0,500' names CPUs 500 that gpu-a01 does not have; allowed: CPUs in 0-191"),
    ({"reservedMemory": [{"numaNode": 7, "limits": {"memory": "100Mi"}}]},
     "reservedMemory[0].numaNode: 7 is not a NUMA node of this host; allowed: 0, 1"),
    ({"topologyManagerPolicy": "numa-strict"},
     "topologyManagerPolicy: 'numa-strict' is not a Topology Manager policy"),
])
def test_bad_override_names_host_field_value_and_changes_nothing(tmp_path, overrides, expected):
    proc, config = _run(tmp_path, KUBEADM, kubelet_topology_overrides=overrides)
    assert proc.returncode != 0
    out = proc.stdout.replace("\n", " ")
    assert "gpu-k01: the kubelet settings cannot be planned; nothing was changed" in proc.stdout
    assert " ".join(expected.split()) in " ".join(out.split()), proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert config.read_text() == KUBEADM
    assert (tmp_path / "state" / "cpu_manager_state").read_text() == '{"policyName": "none"}'


@pytest.mark.parametrize("text,expected", [
    ("", "is empty; allowed: an existing KubeletConfiguration"),
    ("apiVersion: v1\nkind: ConfigMap\n", "kind is 'ConfigMap'; allowed: KubeletConfiguration"),
    ("kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\nfoo: [\n", "is not valid YAML"),
])
def test_bad_existing_config_changes_nothing(tmp_path, text, expected):
    proc, config = _run(tmp_path, text)
    assert proc.returncode != 0
    assert expected in proc.stdout, proc.stdout[-3000:]
    assert config.read_text() == text


def test_unknown_profile_names_the_presets(tmp_path):
    proc, config = _run(tmp_path, KUBEADM, gpunuma_profile="tight")
    assert proc.returncode != 0
    assert "gpu-k01: kubelet_topology_profile (gpunuma_profile) 'tight' has no kubelet preset; allowed: interleave, off, preferred, strict" in " ".join(proc.stdout.split())


def test_check_mode_reports_the_change_and_writes_nothing(tmp_path):
    proc, config = _run(tmp_path, KUBEADM, check=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    # The apply step's check mode: the same decisions, reported as a change, nothing written or stopped.
    assert "changed=1" in proc.stdout
    assert config.read_text() == KUBEADM
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "inventory.yml", "play.yml", "state"]
    assert (tmp_path / "state" / "cpu_manager_state").exists()


def test_matching_node_is_not_touched(tmp_path):
    # The off preset on a config without policy keys: nothing to do, no transition.
    proc, config = _run(tmp_path, KUBEADM, gpunuma_profile="off")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "changed=0" in proc.stdout
    assert "gpu-k01: no change; checkpoints to remove: none" in proc.stdout
    assert config.read_text() == KUBEADM


def test_every_role_variable_is_specified_and_documented():
    defaults = yaml.safe_load(open(os.path.join(ROLE, "defaults", "main.yml"), encoding="utf-8"))
    specs = yaml.safe_load(open(os.path.join(ROLE, "meta", "argument_specs.yml"), encoding="utf-8"))
    roles_md = open(os.path.join(REPO_ROOT, "docs", "roles.md"), encoding="utf-8").read()
    all_yml = open(os.path.join(REPO_ROOT, "inventory", "group_vars", "all.yml"), encoding="utf-8").read()
    assert set(specs["argument_specs"]["main"]["options"]) == set(defaults)
    for name in defaults:
        documented = "`%s`" % name in roles_md or (
            name == "kubelet_topology_health_delay" and "`kubelet_topology_health_retries` / `_delay`" in roles_md)
        assert documented, name
        if name not in ("kubelet_topology_profile", "kubelet_topology_profiles_dir", "kubelet_topology_presets_dir",
                        "kubelet_topology_housekeeping_cores_per_node", "kubelet_topology_housekeeping_cpus",
                        "kubelet_topology_topology",
                        "kubelet_topology_node_name"):
            assert "# %s:" % name in all_yml, name
