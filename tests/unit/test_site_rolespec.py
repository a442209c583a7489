"""site.yml includes or imports some role entry points with rolespec_validate: false. Each may skip Ansible's
argument-spec check only when site.yml checked every one of that entry point's variables before: a gpunuma_inputs
step naming the role, or a `validate` entry point of the role (each checks the main entry point's variables with
role_inputs, never looser than the spec), or an include of an entry point with the same variables that Ansible did
check, in an earlier task."""

import importlib.util
import os
import re

import pytest
import yaml

from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

_spec = importlib.util.spec_from_file_location("gpunuma_inputs_action",
                                               os.path.join(REPO_ROOT, "action_plugins", "gpunuma_inputs.py"))
gpunuma_inputs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpunuma_inputs)


def _includes(node):
    """Every include_role and import_role of a task list, in order, blocks, rescues and always lists included."""
    if isinstance(node, list):
        for item in node:
            yield from _includes(item)
    elif isinstance(node, dict):
        for key in ("ansible.builtin.include_role", "ansible.builtin.import_role"):
            if key in node:
                yield node[key]
        if "gpunuma_inputs" in node:
            roles = node["gpunuma_inputs"]["roles"]
            # A templated list (a Kubernetes node adds kubelet_topology): the role names it quotes.
            listed = [n for part in re.findall(r"\[([^\]]*)\]", roles) for n in re.findall(r"'([a-z_]+)'", part)] \
                if isinstance(roles, str) else roles
            for role in listed:
                # A role whose read request alone joins the step is not checked there.
                if role not in gpunuma_inputs.READ_ONLY:
                    yield {"name": role, "tasks_from": "validate", "step": "gpunuma_inputs"}
        for key in ("tasks", "block", "rescue", "always"):
            if key in node:
                yield from _includes(node[key])


def _options(role, entry):
    with open(os.path.join(REPO_ROOT, "roles", role, "meta", "argument_specs.yml"), encoding="utf-8") as handle:
        specs = yaml.safe_load(handle)["argument_specs"]
    return set((specs.get(entry) or {}).get("options") or {})


def _plays(name):
    """The plays of playbooks/<name>, with those of the playbooks it imports in their place."""
    with open(os.path.join(REPO_ROOT, "playbooks", name), encoding="utf-8") as handle:
        out = []
        for play in yaml.safe_load(handle):
            imported = play.get("ansible.builtin.import_playbook") or play.get("import_playbook")
            out.extend(_plays(imported) if imported else [play])
        return out


def test_every_unvalidated_include_was_checked_before():
    plays = _plays("site.yml")
    assert any(play.get("name") == "Validate the input of every host" for play in plays)
    checked, skipped = set(), []
    for include in _includes(plays):
        role, entry = include["name"], include.get("tasks_from", "main")
        if entry == "validate" or entry == "validate_input":
            checked |= {(role, name) for name in _options(role, "main")}
        if include.get("rolespec_validate", True) is False:
            skipped.append((role, entry))
            missing = sorted(name for name in _options(role, entry) if (role, name) not in checked)
            assert not missing, "%s/%s skips the spec check, but nothing before it checked %s" % (role, entry, missing)
        else:
            checked |= {(role, name) for name in _options(role, entry)}
    # The test sees the includes it is about (a renamed key would make it pass on nothing).
    assert ("numa_binding", "install") in skipped and ("numa_binding", "plan") in skipped
    assert ("gpunuma_state", "effective") in skipped and ("memlock", "apply") in skipped
    assert ("policy_gate", "main") in skipped
    # The kubelet's apply entry point: its variables were checked by the plan entry point's spec check.
    assert ("kubelet_topology", "apply") in skipped
