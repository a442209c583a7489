"""A gpunuma variable nothing reads (a misspelt one) is named with the nearest name gpunuma reads."""

import glob
import os
import re

import pytest
import yaml

from ansible.module_utils.gpunuma.run import role_inputs
from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

KNOWN = role_inputs.known_variable_names(REPO_ROOT)


def test_a_misspelt_variable_is_named_with_the_one_meant():
    found = dict(role_inputs.unknown_variables(
        ["gpunuma_profle", "numa_binding_irq_pinn", "gpunuma_profile", "gpunuma_zzz_nothing", "memlock_limt",
         "kubelet_custom_flag", "ansible_host"], KNOWN))
    assert found == {"gpunuma_profle": "gpunuma_profile", "numa_binding_irq_pinn": "numa_binding_irq_pin",
                     "gpunuma_zzz_nothing": None}
    assert role_inputs.unknown_variable_message("gpunuma_profle", "gpunuma_profile") == (
        "gpunuma_profle is not a variable gpunuma reads; did you mean gpunuma_profile?")


def test_every_documented_variable_is_known():
    """No warning for a variable a role's spec, the example inventories or the knob list name."""
    documented = set()
    for path in glob.glob(os.path.join(REPO_ROOT, "roles", "*", "meta", "argument_specs.yml")):
        with open(path, encoding="utf-8") as handle:
            for entry in (yaml.safe_load(handle)["argument_specs"] or {}).values():
                documented.update((entry or {}).get("options") or {})
    for path in [os.path.join(REPO_ROOT, "inventory", "group_vars", "all.yml"),
                 os.path.join(REPO_ROOT, "inventory", "example.yml"), os.path.join(REPO_ROOT, "README.md")]:
        with open(path, encoding="utf-8") as handle:
            documented.update(re.findall(r"^\s*#?\s*([a-z][a-z0-9_]+):", handle.read(), re.M))
    documented = [n for n in documented if n.startswith(role_inputs.OWN_PREFIXES)]
    assert len(documented) > 100
    assert role_inputs.unknown_variables(documented, KNOWN) == []
