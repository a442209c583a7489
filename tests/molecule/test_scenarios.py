"""The container scenarios (molecule ``default``, ``rollback``, ``kubelet``: docker driver) end to end.

One test per scenario, one after another on one pytest-xdist worker; the
QEMU scenario is ``test_vm_scenario.py``, which runs beside them on the
other worker. How a scenario is run: ``scenario_run.py``.
"""

import pytest

from scenario_run import SCENARIO_FILES, driver_name, fleet_base_image, run_scenario, scenario_param  # noqa: F401

pytestmark = pytest.mark.molecule

CONTAINER_SCENARIOS = [p for p in SCENARIO_FILES if driver_name(p) == "docker"]


@pytest.mark.parametrize("scenario_file", [scenario_param(p) for p in CONTAINER_SCENARIOS])
def test_molecule_scenario(scenario_file, request):
    run_scenario(scenario_file, request)


# The platform matrix (docs/testing.md, "Platforms"): the default scenario on the Debian releases around the
# fleet's bookworm (systemd 252, Python 3.11): bullseye (systemd 247, Python 3.9) and trixie (systemd 257,
# Python 3.13), each a debootstrap-built image like bookworm's.
DEFAULT_SCENARIO = next(p for p in CONTAINER_SCENARIOS if p.parent.name == "default")


@pytest.mark.container
@pytest.mark.parametrize("suite", ["bullseye", "trixie"])
def test_default_scenario_on_other_debian_releases(suite, request):
    run_scenario(DEFAULT_SCENARIO, request, suite=suite)
