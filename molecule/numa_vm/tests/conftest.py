"""The helper module's asserts get pytest's detailed failure messages too; SSH's own failures are tried again."""

import time

import pytest
from testinfra.backend import ssh as testinfra_ssh

pytest.register_assert_rewrite("gpunuma_probe")

# ssh exits 255 when the connection itself failed: the emulated guest (QEMU TCG) can stall long enough under a
# loaded controller for the SSH master to give up (ServerAliveInterval, molecule.yml). Ansible's own calls retry
# such failures (ssh_connection.retries: 3); the verifier's commands through testinfra get the same: up to three
# attempts, a pause between them. Every command the verifier runs reads the guest or runs a transient unit that
# ends, so a second attempt is safe; a command that schedules a reboot is never sent twice.
SSH_ATTEMPTS = 3
_run_ssh = testinfra_ssh.SshBackend.run_ssh


def _run_ssh_again_on_ssh_failure(self, command):
    for attempt in range(1, SSH_ATTEMPTS + 1):
        try:
            return _run_ssh(self, command)
        except RuntimeError as exc:
            failed = exc.args[0] if exc.args else None
            if getattr(failed, "rc", None) != 255 or attempt == SSH_ATTEMPTS or "reboot" in command:
                raise
            time.sleep(3 * attempt)
    raise AssertionError("unreachable")  # pragma: no cover


testinfra_ssh.SshBackend.run_ssh = _run_ssh_again_on_ssh_failure
