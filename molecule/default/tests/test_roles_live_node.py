"""live-node only: the instance user, argv and environment reaching the
program verbatim, the drop-in on an existing unit, containerd's limit.
"""

import json

from fleet import (
    MEMLOCK_BYTES,
    UNIT_DIR,
    environ_of,
    scenario_host_vars,
    main_pid,
    memlock_limits,
)

testinfra_hosts = ["ansible://live-node"]


def test_worker_runs_as_its_user(host):
    pid = main_pid(host, "gpunuma-worker.service")
    assert host.check_output(f"ps -o user= -p {pid}") == "gpuworker"


def test_command_reaches_the_program_as_argv(host):
    probe = next(i for i in scenario_host_vars("live-node")["gpunuma_instances"] if i["name"] == "argv-probe")
    received = json.loads(host.file("/run/gpunuma-argv.json").content_string)
    assert received == probe["command"][3:]


def test_environment_reaches_the_program_verbatim(host):
    probe = next(i for i in scenario_host_vars("live-node")["gpunuma_instances"] if i["name"] == "argv-probe")
    environ = environ_of(host, main_pid(host, "gpunuma-argv-probe.service"))
    assert environ["PROBE_TEXT"] == probe["environment"]["PROBE_TEXT"]


def test_dropin_binds_the_existing_unit(host):
    dropin = host.file(f"{UNIT_DIR}/vendor-inference.service.d/50-gpunuma.conf").content_string
    # The stand-in's own unit file is untouched; the binding lives in the drop-in.
    assert "CPUAffinity" not in host.file(f"{UNIT_DIR}/vendor-inference.service").content_string
    assert "\nCPUAffinity=\nCPUAffinity=" in dropin
    effective = host.check_output("systemctl show --property=NUMAPolicy --value vendor-inference.service")
    assert effective == "bind"


def test_containerd_gets_the_memlock_limit(host):
    dropin = host.file(f"{UNIT_DIR}/containerd.service.d/50-gpunuma-memlock.conf")
    assert (dropin.user, dropin.group, dropin.mode) == ("root", "root", 0o644)
    assert f"\nLimitMEMLOCK={MEMLOCK_BYTES}\n" in dropin.content_string
    pid = main_pid(host, "containerd.service")
    assert memlock_limits(host, pid) == (str(MEMLOCK_BYTES), str(MEMLOCK_BYTES))
