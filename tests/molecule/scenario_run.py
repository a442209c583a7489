"""Running a molecule scenario (``molecule/<name>/molecule.yml``) end to end, for the scenario tests.

``test_scenarios.py`` runs the container (docker-driver) scenarios and
``test_vm_scenario.py`` the QEMU one: two files, so ``pytest -n 2 --dist
loadfile`` runs the long VM scenario on one worker while the container
scenarios run, one after another, on the other.

One test per scenario: ``molecule test -s <name>`` from the repository root,
with this virtualenv's ``bin`` first on PATH so molecule finds the pinned
ansible-playbook and pytest. Scenarios on the docker driver get the fleet's
base image built (or found in the cache) by ``scripts/build-base-image.sh``
first, since no registry is reachable to pull it from.

Skipped only when the host cannot run them at all: not root, or no docker
client for a docker-driver scenario. A docker client without a running engine
is a failure: ``scripts/setup-host.sh`` starts one.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
SCENARIO_FILES = sorted(REPO_ROOT.glob("molecule/*/molecule.yml"))
BUILD_BASE_IMAGE = REPO_ROOT / "scripts" / "build-base-image.sh"

# A full scenario runs for about a minute on two cores; a hung boot or
# container must not hold CI for hours.
SCENARIO_TIMEOUT_S = 30 * 60
IMAGE_BUILD_TIMEOUT_S = 15 * 60
OUTPUT_TAIL_LINES = 80


def _venv_bin():
    # Not resolved: the venv's python may be a symlink to the base
    # interpreter, whose bin holds no molecule.
    local = REPO_ROOT / ".venv" / "bin"
    if (local / "molecule").exists():
        return local
    return Path(sys.executable).parent


def _subprocess_env():
    env = dict(os.environ)
    env["PATH"] = f"{_venv_bin()}{os.pathsep}{env.get('PATH', '')}"
    # Plain text: the output tail is what a failing test shows.
    env.update({"NO_COLOR": "1", "PY_COLORS": "0", "ANSIBLE_FORCE_COLOR": "0"})
    return env


def _tail(text, lines=OUTPUT_TAIL_LINES):
    return "\n".join(text.splitlines()[-lines:])


def _run(argv, timeout, extra_env=None):
    """Run argv from the repository root; return (rc, combined output)."""
    try:
        proc = subprocess.run(
            argv,
            cwd=REPO_ROOT,
            env=dict(_subprocess_env(), **(extra_env or {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout or ""
        if isinstance(output, bytes):
            output = output.decode(errors="replace")
        return None, output
    return proc.returncode, proc.stdout


def driver_name(scenario_file):
    with open(scenario_file, encoding="utf-8") as stream:
        config = yaml.safe_load(stream) or {}
    return (config.get("driver") or {}).get("name", "default")


def _skip_reason(driver):
    if os.geteuid() != 0:
        return "molecule scenarios need root (containers, VMs); run scripts/test.sh as root"
    if driver == "docker" and shutil.which("docker") is None:
        return "docker is not installed; scripts/setup-host.sh installs and starts it"
    return None


def build_base_image(suite="bookworm"):
    """Build (or find cached) gpunuma/debian-systemd:<suite>; fail the test with the script's output tail."""
    argv = [str(BUILD_BASE_IMAGE), "--suite", suite]
    rc, output = _run(argv, IMAGE_BUILD_TIMEOUT_S)
    if rc != 0:
        how = "timed out" if rc is None else f"exited {rc}"
        pytest.fail(
            f"{BUILD_BASE_IMAGE.relative_to(REPO_ROOT)} --suite {suite} {how}; last lines:\n{_tail(output)}",
            pytrace=False,
        )
    return "gpunuma/debian-systemd:" + suite


@pytest.fixture(scope="session")
def fleet_base_image():
    """Build (or find cached) the image the docker-driver scenarios boot."""
    return build_base_image()


def scenario_param(scenario_file):
    """The scenario as a parameter, marked by what it boots: ``container`` or ``vm``."""
    layer = pytest.mark.container if driver_name(scenario_file) == "docker" else pytest.mark.vm
    return pytest.param(scenario_file, marks=layer, id=scenario_file.parent.name)


def run_scenario(scenario_file, request, suite=None):
    """``molecule test -s <scenario>``; skips where the host cannot run it, fails with the output's tail.

    ``suite`` (the platform matrix): boot the scenario's containers from that
    Debian release's image (``GPUNUMA_FLEET_IMAGE``, which molecule/default reads).
    """
    scenario = scenario_file.parent.name
    driver = driver_name(scenario_file)
    reason = _skip_reason(driver)
    if reason:
        pytest.skip(reason)
    extra = {}
    if suite is not None:
        extra["GPUNUMA_FLEET_IMAGE"] = build_base_image(suite)
    elif driver == "docker":
        request.getfixturevalue("fleet_base_image")

    argv = [str(_venv_bin() / "molecule"), "test", "-s", scenario]
    rc, output = _run(argv, SCENARIO_TIMEOUT_S, extra)
    if rc != 0:
        how = f"timed out after {SCENARIO_TIMEOUT_S} s" if rc is None else f"exited {rc}"
        pytest.fail(
            f"molecule test -s {scenario}{' on ' + suite if suite else ''} {how}; last {OUTPUT_TAIL_LINES} lines:\n{_tail(output)}",
            pytrace=False,
        )
