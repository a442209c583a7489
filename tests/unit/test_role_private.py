"""No role-private variable is read outside its role.

A role's ``__<role>_*`` variables are its own: they may change with the role. What a playbook or another role
reads of it is a public, role-prefixed output (``gpu_topology_node_files``, ``memlock_node_files``,
``autonuma_decision``, ``autonuma_node_files``, the ``<role>_read_request`` each role declares), documented in
docs/roles.md. Controller code names no role-private variable either, nor builds one's name.
"""

from __future__ import annotations

import os
import re

import pytest

from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

SEARCHED = ("roles", "playbooks", "action_plugins", "filter_plugins", "library", "module_utils", "gpunuma_controller")
PRIVATE = re.compile(r"__([a-z][a-z0-9_]*)")
# A private name built from a role's name (``"__%s_x" % role``) is a read nobody can search for.
BUILT = re.compile(r"""["']__%s_""")


def roles(root):
    return sorted(os.listdir(os.path.join(root, "roles")))


def owner(variable, names):
    """The role a ``__<role>_...`` variable belongs to, or None."""
    for name in sorted(names, key=len, reverse=True):
        if variable.startswith(name + "_"):
            return name
    return None


def readers(root=REPO_ROOT):
    """``[(file, line, variable)]``: each role-private variable named outside its role, and each built name."""
    names = roles(root)
    found = []
    for base in SEARCHED:
        for directory, _dirs, files in os.walk(os.path.join(root, base)):
            for file_name in files:
                if not file_name.endswith((".yml", ".yaml", ".j2", ".py")):
                    continue
                path = os.path.join(directory, file_name)
                rel = os.path.relpath(path, root)
                parts = rel.split(os.sep)
                here = parts[1] if parts[0] == "roles" else None
                with open(path, encoding="utf-8") as handle:
                    text = handle.read()
                for match in PRIVATE.finditer(text):
                    role = owner(match.group(1), names)
                    if role is not None and role != here:
                        found.append((rel, text.count("\n", 0, match.start()) + 1, match.group(0)))
                for match in BUILT.finditer(text):
                    found.append((rel, text.count("\n", 0, match.start()) + 1, match.group(0)))
    return found


def test_no_role_private_variable_is_read_outside_its_role():
    assert readers() == []


def test_a_read_from_outside_is_found(tmp_path):
    for role in ("memlock", "numa_binding"):
        (tmp_path / "roles" / role / "tasks").mkdir(parents=True)
    (tmp_path / "roles" / "memlock" / "tasks" / "main.yml").write_text("- debug: var=__memlock_plan\n")
    (tmp_path / "roles" / "numa_binding" / "tasks" / "main.yml").write_text("- debug: var=__memlock_plan\n")
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "site.yml").write_text("x: '{{ __numa_binding_files }}'\n")
    (tmp_path / "action_plugins").mkdir()
    (tmp_path / "action_plugins" / "a.py").write_text("name = '__%s_read_request' % role\n")
    assert sorted(readers(str(tmp_path))) == [
        ("action_plugins/a.py", 1, "'__%s_"),
        ("playbooks/site.yml", 1, "__numa_binding_files"),
        ("roles/numa_binding/tasks/main.yml", 1, "__memlock_plan"),
    ]
