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
