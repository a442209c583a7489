"""The kubelet change as one gpunuma_apply request (module_utils/gpunuma/kubelet/change.py)."""

import pytest

from ansible.module_utils.gpunuma.kubelet.change import CHECKPOINTS, change_request, node_read, read_request
from ansible.module_utils.gpunuma.node import probe as node_probe
from ansible.module_utils.gpunuma.node.apply.files import normalise_files
from ansible.module_utils.gpunuma.node.apply.files import normalise_absent

pytestmark = pytest.mark.unit

SERVICE = "kubelet.service"
GUARD_ON = {"files": [{"path": "/etc/systemd/system/kubelet.service.d/50-gpunuma-memory-checkpoint.conf",
                       "content": "[Service]\nExecStartPre=-/usr/local/libexec/gpunuma/kubelet-memory-checkpoint\n"}],
            "absent": []}
GUARD_OFF = {"files": [], "absent": ["/etc/systemd/system/kubelet.service.d/50-gpunuma-memory-checkpoint.conf",
                                     "/usr/local/libexec/gpunuma/kubelet-memory-checkpoint"]}


def _plan(needed, remove=()):
    return {"transition_needed": needed, "config_text": "cpuManagerPolicy: static\n",
            "remove_checkpoints": list(remove)}


def test_a_transition_stops_the_kubelet_for_the_config_and_the_stale_checkpoints():
    request = change_request(_plan(True, ["/var/lib/kubelet/cpu_manager_state"]), GUARD_ON,
                             "/var/lib/kubelet/config.yaml", "/var/lib/kubelet/", SERVICE)
    config, dropin = normalise_files(request["files"])
    assert (config["path"], config["unit"], config["restart"], config["mode"]) == (
        "/var/lib/kubelet/config.yaml", SERVICE, "stop", 0o644)
    assert config["owner"] == config["group"] == "root" and config["backup"] is True
    # The check's drop-in is the kubelet's too: written without a restart, put back with the config.
    assert (dropin["unit"], dropin["restart"]) == (SERVICE, "never")
    paths, restarts, stops = normalise_absent(request["absent"])
    assert paths == ["/var/lib/kubelet/cpu_manager_state"] and restarts == {}
    assert stops == {"/var/lib/kubelet/cpu_manager_state": SERVICE}
    # Every checkpoint the kubelet keeps is put back when it does not come back, the DRA manager's included.
    assert request["state_files"] == {SERVICE: ["/var/lib/kubelet/" + name for name in CHECKPOINTS]}
    assert CHECKPOINTS == ("cpu_manager_state", "memory_manager_state", "dra_manager_state")


def test_without_a_transition_only_the_check_files_are_asked_for():
    request = change_request(_plan(False), GUARD_OFF, "/var/lib/kubelet/config.yaml", "/var/lib/kubelet", SERVICE)
    assert request["files"] == [] and request["state_files"] == {}
    # Removed without stopping anything (plain paths).
    assert request["absent"] == GUARD_OFF["absent"]
    assert normalise_absent(request["absent"])[2] == {}


def test_check_files_that_go_during_a_transition_come_back_with_the_old_config():
    request = change_request(_plan(True), GUARD_OFF, "/etc/kubernetes/kubelet/config.json", "/var/lib/kubelet",
                             SERVICE)
    _paths, _restarts, stops = normalise_absent(request["absent"])
    assert stops == {path: SERVICE for path in GUARD_OFF["absent"]}


# ---------------------------------------------------------------- what the plan reads of the node


def _read(request):
    return {"gpunuma_node": node_probe.probe(None, files=request["files"], globs=request["globs"])}


@pytest.mark.parametrize("dra", ["auto", "off"])
def test_the_read_request_reads_the_config_every_checkpoint_and_the_registrations(tmp_path, dra):
    state = tmp_path / "kubelet"
    (state / "plugins_registry").mkdir(parents=True)
    (state / "plugins_registry" / "gpu.nvidia.com-reg.sock").write_text("")
    (tmp_path / "config.yaml").write_text("kind: KubeletConfiguration\n")
    (state / "cpu_manager_state").write_text('{"policyName":"none"}')
    (state / "dra_manager_state").write_bytes(b'{"claims":[]} \xff')
    request = read_request(str(tmp_path / "config.yaml"), str(state) + "/", dra)
    got = node_read(_read(request))
    assert got["config"] == "kind: KubeletConfiguration\n" and got["config_problem"] is None
    # Every checkpoint by its own name; one the node lacks is None, never an empty text.
    assert {name: got[name] for name in CHECKPOINTS} == {
        "cpu_manager_state": '{"policyName":"none"}', "memory_manager_state": None,
        "dra_manager_state": '{"claims":[]} \ufffd'}
    assert got["registrations"] == ([str(state / "plugins_registry" / "gpu.nvidia.com-reg.sock")] if dra == "auto" else [])


def test_a_config_that_cannot_be_read_says_why_and_a_read_without_the_kubelet_is_none(tmp_path):
    got = node_read(_read(read_request(str(tmp_path / "missing.yaml"), str(tmp_path), "off")))
    assert got["config"] is None and got["config_problem"] == "no such file"
    (tmp_path / "dir.yaml").mkdir()
    got = node_read(_read(read_request(str(tmp_path / "dir.yaml"), str(tmp_path), "off")))
    assert got["config"] is None and "dir.yaml cannot be read" in got["config_problem"]
    # The run's node read of a host outside Kubernetes holds no kubelet part.
    assert node_read({"gpunuma_node": {"files": {"applied_plan": {"exists": False}}}}) is None
    assert node_read({}) is None and node_read(None) is None
