"""Throwaway systemd containers from the fleet's base image, for tests.

The image (gpunuma/debian-systemd:bookworm) is built by
scripts/build-base-image.sh, which scripts/test.sh runs before pytest.
Nodes run systemd as PID 1 with the options the molecule fleet uses, and are
driven with the community.docker.docker connection.
"""

import shutil
import subprocess
import time
import uuid

import pytest

IMAGE = "gpunuma/debian-systemd:bookworm"
UNIT_DIR = "/etc/systemd/system"


def _docker_ready():
    if not shutil.which("docker"):
        return "no docker client"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "no running Docker engine"
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0:
        return "base image %s missing (scripts/build-base-image.sh)" % IMAGE
    return None


NOT_READY = _docker_ready()
needs_docker = pytest.mark.skipif(bool(NOT_READY), reason=NOT_READY or "")


class Node:
    """A systemd container of the fleet image.

    ``name`` (default a fresh ``gpunuma-it-*``) is also its hostname when
    ``hostname`` is true; ``mounts`` are read-only bind mounts (source, target);
    ``image`` another Debian release's image (scripts/build-base-image.sh --suite).
    """

    def __init__(self, sys_nice=True, name=None, hostname=False, mounts=(), boot_timeout=300, extra_args=(),
                 image=IMAGE):
        self.name = name or "gpunuma-it-%s" % uuid.uuid4().hex[:8]
        caps = ["--cap-add", "SYS_ADMIN"] + (["--cap-add", "SYS_NICE"] if sys_nice else [])
        extra = ["--hostname", self.name] if hostname else []
        for source, target in mounts:
            extra += ["-v", "%s:%s:ro" % (source, target)]
        extra += list(extra_args)
        subprocess.run(
            ["docker", "run", "-d", "--name", self.name, *caps, *extra, "--cgroupns", "host",
             "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run", "--tmpfs", "/run/lock",
             "--stop-signal", "SIGRTMIN+3", image, "/lib/systemd/systemd"],
            check=True, capture_output=True,
        )
        deadline = time.time() + boot_timeout
        while time.time() < deadline:
            state = self.sh("systemctl is-system-running --wait", check=False).strip()
            if state in ("running", "degraded"):
                return
            time.sleep(1)
        self.remove()
        raise AssertionError("%s did not finish booting" % self.name)

    def sh(self, script, check=True):
        proc = subprocess.run(["docker", "exec", self.name, "sh", "-c", script], capture_output=True, text=True)
        if check:
            assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def main_pid(self, unit):
        return int(self.sh("systemctl show --property=MainPID --value %s" % unit))

    def remove(self):
        subprocess.run(["docker", "rm", "-f", self.name], capture_output=True)


