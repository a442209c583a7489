"""The QEMU scenario (molecule ``numa_vm``: a guest with two real NUMA nodes) end to end.

A file of its own so that pytest-xdist (``--dist loadfile``) runs it on one
worker while the container scenarios (``test_scenarios.py``) run on the
other: it is the longest test of the suite (TCG where KVM does not run).
Every scenario that is not on the docker driver is here, so a new scenario
is run by one of the two files.
"""

import pytest

from scenario_run import SCENARIO_FILES, driver_name, run_scenario, scenario_param

pytestmark = pytest.mark.molecule

VM_SCENARIOS = [p for p in SCENARIO_FILES if driver_name(p) != "docker"]


@pytest.mark.parametrize("scenario_file", [scenario_param(p) for p in VM_SCENARIOS])
def test_molecule_scenario(scenario_file, request):
    run_scenario(scenario_file, request)
