"""The autonuma role on localhost against temporary sysctl.d and tuned trees.

autonuma_apply_live is false in every run: these tests never write the
controller's kernel.numa_balancing. The tuned profiles are trimmed copies of
tuned's own network-latency / cpu-partitioning files, and `tuned-adm` is a
stand-in script on PATH that prints what tuned-adm prints.
"""

import json
import os
import subprocess
import sys

import pytest
import yaml

from ansible_run import BINDIR, ansible_env
from conftest import REPO_ROOT

pytestmark = pytest.mark.ansible

TUNED_PROFILES = {
    "latency-performance": "[cpu]\nforce_latency=0\ngovernor=performance\n",
    "network-latency": "[main]\nsummary=low latency network\ninclude=latency-performance\n\n"
                       "[sysctl]\nnet.core.busy_read=50\nkernel.numa_balancing=0\n",
    "cpu-partitioning": "[main]\ninclude=network-latency\n\n[sysctl]\nkernel.hung_task_timeout_secs = 600\n",
    "throughput-performance": "[main]\nsummary=throughput\n\n[sysctl]\nvm.swappiness=10\n",
}


def _tree(tmp_path, sysctl_files=None, active_profile=None):
    etc = tmp_path / "etc-sysctl.d"
    lib = tmp_path / "lib-sysctl.d"
    etc.mkdir()
    lib.mkdir()
    for rel, text in (sysctl_files or {}).items():
        (tmp_path / rel).write_text(text)
    tuned = tmp_path / "tuned"
    for name, text in TUNED_PROFILES.items():
        (tuned / name).mkdir(parents=True)
        (tuned / name / "tuned.conf").write_text(text)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    if active_profile:
        fake = bindir / "tuned-adm"
        fake.write_text("#!/bin/sh\n# stand-in for tuned-adm in tests\necho 'Current active profile: %s'\n" % active_profile)
        fake.chmod(0o755)
    return etc, lib, tuned, bindir


# _run's autonuma_numa_balancing unless a test passes one: 0, the value these
# tests check the file, conflict and tuned handling with. UNSET leaves the
# role's default (auto).
UNSET = object()


def _proc(tmp_path, release, live="1"):
    """A copy of /proc/sys/kernel with numa_balancing and (unless None) osrelease."""
    kernel = tmp_path / "proc" / "sys" / "kernel"
    kernel.mkdir(parents=True)
    (kernel / "numa_balancing").write_text(live + "\n")
    if release is not None:
        (kernel / "osrelease").write_text(release + "\n")
    return {"__autonuma_proc_path": str(kernel / "numa_balancing")}


def _run(tmp_path, tree, check=False, extra=None, **role_vars):
    etc, lib, tuned, bindir = tree
    own = etc / "60-gpunuma-numa-balancing.conf"
    variables = {
        "autonuma_numa_balancing": 0,
        "autonuma_sysctl_file": str(own),
        "autonuma_sysctl_dirs": [str(etc), str(lib)],
        "autonuma_tuned_dirs": [str(tuned)],
        "autonuma_apply_live": False,
        "ansible_managed": "Managed by gpunuma; local edits are overwritten",
    }
    variables.update(role_vars)
    variables = {k: v for k, v in variables.items() if v is not UNSET}
    playbook = tmp_path / "autonuma.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "vars": variables,
                                         "roles": ["autonuma"]}]))
    cmd = [os.path.join(BINDIR, "ansible-playbook"), "-i", "localhost,", "-c", "local",
           "-e", "ansible_python_interpreter=" + sys.executable, str(playbook)]
    if check:
        cmd.append("--check")
    if extra:
        # Extra vars: the role's own vars (the procfs path) give way only to them.
        cmd += ["-e", json.dumps(extra)]
    env = ansible_env(PATH=str(bindir) + os.pathsep + BINDIR + os.pathsep + os.environ.get("PATH", ""))
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)
    return proc, own


def _settings(path):
    return [line for line in path.read_text().splitlines() if line and not line.startswith("#")]


def test_persists_the_value_with_header_and_mode(tmp_path):
    proc, own = _run(tmp_path, _tree(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert _settings(own) == ["kernel.numa_balancing=0"]
    assert own.read_text().startswith("#\n# Managed by gpunuma; local edits are overwritten\n")
    assert oct(own.stat().st_mode & 0o777) == "0o644"
    assert "the live value" in proc.stdout and "autonuma_apply_live is false" in proc.stdout


def test_second_run_changes_nothing(tmp_path):
    tree = _tree(tmp_path)
    first, _ = _run(tmp_path, tree, autonuma_numa_balancing=1)
    second, own = _run(tmp_path, tree, autonuma_numa_balancing=1)
    # One step writes the whole file (header and key line); the live value is left alone here.
    assert "changed=1" in first.stdout, first.stdout[-3000:]
    assert "changed=0" in second.stdout, second.stdout[-3000:]
    assert _settings(own) == ["kernel.numa_balancing=1"]


def test_check_mode_writes_nothing(tmp_path):
    proc, own = _run(tmp_path, _tree(tmp_path), check=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert not own.exists()


def test_later_sysctl_file_is_a_conflict(tmp_path):
    files = {"etc-sysctl.d/99-site.conf": "kernel.numa_balancing = 1\n",
             "lib-sysctl.d/10-distro.conf": "kernel/numa_balancing=1\n"}
    tree = _tree(tmp_path, files)
    proc, own = _run(tmp_path, tree)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "WARNING localhost: %s/99-site.conf sets kernel.numa_balancing=1" % tree[0] in proc.stdout
    # The earlier file is overridden by gpunuma: reported, not a conflict.
    assert "10-distro.conf sets kernel.numa_balancing=1; %s is applied after it and wins" % own in proc.stdout
    assert "WARNING localhost: %s/10-distro.conf" % tree[1] not in proc.stdout

    proc, _ = _run(tmp_path, tree, autonuma_on_conflict="fail")
    assert proc.returncode != 0
    assert "kernel.numa_balancing=0 would not hold" in proc.stdout
    assert "99-site.conf sets kernel.numa_balancing=1 and is applied after" in proc.stdout


def test_conflict_failure_changes_nothing(tmp_path):
    tree = _tree(tmp_path, {"etc-sysctl.d/99-site.conf": "kernel.numa_balancing=1\n"})
    proc, own = _run(tmp_path, tree, autonuma_on_conflict="fail")
    assert proc.returncode != 0
    assert not own.exists()


def test_same_value_elsewhere_is_no_conflict(tmp_path):
    tree = _tree(tmp_path, {"etc-sysctl.d/99-site.conf": "kernel.numa_balancing=0\n"})
    proc, own = _run(tmp_path, tree, autonuma_on_conflict="fail")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert _settings(own) == ["kernel.numa_balancing=0"]


def test_tuned_profile_setting_it_through_includes_is_a_conflict(tmp_path):
    tree = _tree(tmp_path, active_profile="cpu-partitioning")
    proc, own = _run(tmp_path, tree, autonuma_numa_balancing=1, autonuma_on_conflict="fail")
    assert proc.returncode != 0
    assert ("tuned profile cpu-partitioning (through network-latency) sets kernel.numa_balancing=0 "
            "and applies it again whenever tuned starts") in proc.stdout
    assert not own.exists()
    # Asking for what tuned sets anyway is fine.
    proc, own = _run(tmp_path, tree, autonuma_numa_balancing=0, autonuma_on_conflict="fail")
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_tuned_profile_without_the_key_is_no_conflict(tmp_path):
    tree = _tree(tmp_path, active_profile="throughput-performance")
    proc, _ = _run(tmp_path, tree, autonuma_numa_balancing=1, autonuma_on_conflict="fail")
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_null_hands_the_setting_back(tmp_path):
    tree = _tree(tmp_path)
    proc, own = _run(tmp_path, tree)
    assert own.exists()
    proc, own = _run(tmp_path, tree, autonuma_numa_balancing=None)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert not own.exists()
    assert "its live value is left as it is" in proc.stdout


@pytest.mark.parametrize(
    "role_vars,message",
    [
        ({"autonuma_numa_balancing": 2}, "autonuma_numa_balancing must be one of: auto, 0, 1, None, got: 2"),
        ({"autonuma_on_conflict": "ignore"}, "autonuma_on_conflict must be one of: warn, fail, got: ignore"),
        ({"autonuma_sysctl_file": "/etc/sysctl.d/60-gpunuma"}, "autonuma_sysctl_file: '/etc/sysctl.d/60-gpunuma' is invalid"),
    ],
)
def test_bad_input_fails_before_any_change(tmp_path, role_vars, message):
    tree = _tree(tmp_path)
    proc, own = _run(tmp_path, tree, **role_vars)
    assert proc.returncode != 0
    assert message in proc.stdout
    assert not own.exists()


# ------------------------------------------------------------------ auto
# A copy of /proc/sys/kernel under tmp_path gives the probe its live value and
# kernel release (osrelease); the controller's own kernel plays no part.

AUTO_LEFT_ALONE = "are neither scanned nor migrated by NUMA balancing"


def test_auto_on_a_kernel_before_5_12_persists_0(tmp_path):
    tree = _tree(tmp_path)
    proc, own = _run(tmp_path, tree, extra=_proc(tmp_path, "5.4.0-1234-aws"), autonuma_numa_balancing="auto")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert _settings(own) == ["kernel.numa_balancing=0"]
    assert "profile strict, kernel 5.4.0-1234-aws (older than 5.12): 0, following" in proc.stdout
    assert "If the target workload is already bound to NUMA nodes then this feature should be disabled" in proc.stdout
    # The live value (1 in the copy) is compared with the decision, not with "auto".
    assert "kernel.numa_balancing=0 is persisted in %s but the live value (1) was not written" % own in proc.stdout


def test_auto_is_the_default_and_leaves_a_5_12_kernel_alone(tmp_path):
    tree = _tree(tmp_path)
    etc = tree[0]
    own = etc / "60-gpunuma-numa-balancing.conf"
    own.write_text("kernel.numa_balancing=0\n")
    extra = _proc(tmp_path, "6.1.0-28-amd64")
    proc, own = _run(tmp_path, tree, extra=extra, autonuma_numa_balancing=UNSET, gpunuma_profile="strict")
    assert proc.returncode == 0, proc.stdout[-3000:]
    # gpunuma's file is handed back; the live value is not touched.
    assert not own.exists()
    assert "profile strict, kernel 6.1.0-28-amd64: kernel.numa_balancing is left as it is" in proc.stdout
    assert AUTO_LEFT_ALONE in proc.stdout and "set autonuma_numa_balancing: 0 to turn it off anyway" in proc.stdout
    assert (tmp_path / "proc" / "sys" / "kernel" / "numa_balancing").read_text() == "1\n"
    assert "changed=1" in proc.stdout
    # Explicit 0 on the same kernel still turns it off.
    proc, own = _run(tmp_path, tree, extra=extra, autonuma_numa_balancing=0)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert _settings(own) == ["kernel.numa_balancing=0"]
    assert AUTO_LEFT_ALONE not in proc.stdout


@pytest.mark.parametrize("profile", ["off", False])
def test_auto_with_profile_off_hands_the_node_back(tmp_path, profile):
    tree = _tree(tmp_path)
    first, own = _run(tmp_path, tree, extra=_proc(tmp_path, "4.18.0-553.el8_10.x86_64"))
    assert _settings(own) == ["kernel.numa_balancing=0"]
    # An unquoted `off` in YAML arrives as false: it is still the profile off.
    proc, own = _run(tmp_path, tree, extra=_proc_again(tmp_path), autonuma_numa_balancing="auto",
                     gpunuma_profile=profile)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert not own.exists()
    assert "the profile is off (no binding): gpunuma hands kernel.numa_balancing back" in proc.stdout


def _proc_again(tmp_path):
    return {"__autonuma_proc_path": str(tmp_path / "proc" / "sys" / "kernel" / "numa_balancing")}


def test_auto_follows_a_rollback_pin_over_the_inventory(tmp_path):
    tree = _tree(tmp_path)
    extra = dict(_proc(tmp_path, "5.4.0-1234-aws"), gpunuma_effective_profile="off")
    proc, own = _run(tmp_path, tree, extra=extra, autonuma_numa_balancing="auto", gpunuma_profile="strict")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert not own.exists()
    assert "the profile is off" in proc.stdout


@pytest.mark.parametrize("release", [None, "not-a-kernel"])
def test_auto_with_an_unknown_kernel_release_persists_0(tmp_path, release):
    tree = _tree(tmp_path)
    proc, own = _run(tmp_path, tree, extra=_proc(tmp_path, release), autonuma_numa_balancing="auto",
                     gpunuma_profile="preferred")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert _settings(own) == ["kernel.numa_balancing=0"]
    assert "profile preferred, kernel release unknown: 0" in proc.stdout


def test_auto_in_check_mode_writes_and_removes_nothing(tmp_path):
    tree = _tree(tmp_path)
    proc, own = _run(tmp_path, tree, check=True, extra=_proc(tmp_path, "5.11.0"), autonuma_numa_balancing="auto")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert not own.exists()
    assert "kernel 5.11.0 (older than 5.12): 0" in proc.stdout
    own.write_text("kernel.numa_balancing=0\n")
    (tmp_path / "proc" / "sys" / "kernel" / "osrelease").write_text("5.12.0\n")
    proc, own = _run(tmp_path, tree, check=True, extra=_proc_again(tmp_path), autonuma_numa_balancing="auto")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert own.exists()
    assert AUTO_LEFT_ALONE in proc.stdout
