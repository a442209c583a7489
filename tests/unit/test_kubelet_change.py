"""The kubelet change as one gpunuma_apply request (module_utils/gpunuma/kubelet/change.py)."""

import pytest

from ansible.module_utils.gpunuma.kubelet.change import CHECKPOINTS, change_request
from ansible.module_utils.gpunuma.node.apply import normalise_files
from ansible.module_utils.gpunuma.node.apply_files import normalise_absent

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
