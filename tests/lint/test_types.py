"""The core's type annotations, checked: mypy over module_utils/gpunuma finds nothing, and every decider (the
functions tests/unit/test_deciders.py lists, one per concern) is annotated whole, so mypy checks its body too."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "unit"))
from test_deciders import CALLERS  # noqa: E402  (the deciders, listed once)

pytestmark = pytest.mark.lint

CORE = os.path.join(REPO_ROOT, "module_utils", "gpunuma")
# Public functions of the core beside the deciders that carry annotations as their contract.
ANNOTATED = (
    "plan.pinned.derived_budget", "plan.pinned.derive_budgets", "plan.pinned.pool_nodes", "plan.pinned.check_pinned",
    "common.secrets.command_secret_flags", "common.secrets.line_too_long", "run.dry_run.changes",
    "plan.node_plan.plan_for_node", "run.topology_store.decide",
)


def test_mypy_finds_nothing_in_the_core(tmp_path):
    """The core is imported as ``ansible.module_utils.gpunuma``: mypy reads it through that package path."""
    package = tmp_path / "ansible" / "module_utils"
    package.mkdir(parents=True)
    (tmp_path / "ansible" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    os.symlink(CORE, package / "gpunuma")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--ignore-missing-imports", "--cache-dir",
                           str(tmp_path / ".mypy_cache"), "-p", "ansible.module_utils.gpunuma"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "Success: no issues found" in proc.stdout


def _function(dotted):
    module, name = dotted.rsplit(".", 1)
    path = os.path.join(CORE, *module.split(".")) + ".py"
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError("%s: no function %s" % (path, name))


@pytest.mark.parametrize("dotted", sorted(set(CALLERS) | set(ANNOTATED)))
def test_each_decider_is_annotated_whole(dotted):
    node = _function(dotted)
    args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
    missing = [a.arg for a in args if a.annotation is None]
    assert not missing and node.returns is not None, "%s: parameters %s%s not annotated" % (
        dotted, missing, " and the return" if node.returns is None else "")
