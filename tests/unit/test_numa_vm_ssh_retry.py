"""The numa_vm verifier tries a command again when SSH itself failed (exit 255), never a reboot, never a command
that failed on the guest."""

import importlib.util
import os

import pytest

from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

testinfra_base = pytest.importorskip("testinfra.backend.base")

_spec = importlib.util.spec_from_file_location(
    "numa_vm_conftest", os.path.join(REPO_ROOT, "molecule", "numa_vm", "tests", "conftest.py"))
numa_vm_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(numa_vm_conftest)


def _result(rc):
    return testinfra_base.CommandResult(backend=None, exit_status=rc, command=b"x", _stdout=b"", _stderr=b"")


@pytest.fixture
def fake_ssh(monkeypatch):
    calls, pauses = [], []

    def answers(*results):
        queue = list(results)

        def run_ssh(self, command):
            calls.append(command)
            result = queue.pop(0)
            if result.rc == 255:
                raise RuntimeError(result)  # what testinfra raises for SSH's own failures
            return result
        monkeypatch.setattr(numa_vm_conftest, "_run_ssh", run_ssh)
    monkeypatch.setattr(numa_vm_conftest.time, "sleep", pauses.append)
    return answers, calls, pauses


def test_an_ssh_failure_is_tried_again(fake_ssh):
    answers, calls, pauses = fake_ssh
    answers(_result(255), _result(255), _result(0))
    assert numa_vm_conftest._run_ssh_again_on_ssh_failure(None, "cat /proc/self/status").rc == 0
    assert calls == ["cat /proc/self/status"] * 3 and pauses == [3, 6]


def test_three_ssh_failures_fail_the_test(fake_ssh):
    answers, calls, _pauses = fake_ssh
    answers(_result(255), _result(255), _result(255))
    with pytest.raises(RuntimeError):
        numa_vm_conftest._run_ssh_again_on_ssh_failure(None, "true")
    assert len(calls) == numa_vm_conftest.SSH_ATTEMPTS


def test_a_reboot_and_a_guest_failure_are_never_sent_twice(fake_ssh):
    answers, calls, _pauses = fake_ssh
    answers(_result(255))
    with pytest.raises(RuntimeError):
        numa_vm_conftest._run_ssh_again_on_ssh_failure(None, "systemd-run --on-active=1 systemctl reboot")
    answers(_result(1))
    assert numa_vm_conftest._run_ssh_again_on_ssh_failure(None, "false").rc == 1
    assert calls == ["systemd-run --on-active=1 systemctl reboot", "false"]


def test_the_verifier_uses_it():
    from testinfra.backend import ssh
    assert ssh.SshBackend.run_ssh is numa_vm_conftest._run_ssh_again_on_ssh_failure
