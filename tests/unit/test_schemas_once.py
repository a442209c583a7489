"""Each versioned document's schema name is defined once (gpunuma.common.schemas).

Code that names a schema in a string of its own would drift from the rest
when the version moves. One file keeps literal names on purpose and is
checked against the constants instead: the metrics script (installed on a
node as a standalone script, standard library only). The HTML report takes
the constants from the core (gpunuma_controller.core.use_core standalone).
"""

import ast
import os
import re

import pytest

from ansible.module_utils.gpunuma.common import schemas
from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

SCHEMA_RE = re.compile(r"^gpunuma\.[a-z0-9-]+/v[0-9]+$")
OWNER = os.path.join("module_utils", "gpunuma", "common", "schemas.py")
STANDALONE = (os.path.join("module_utils", "gpunuma", "verify", "metrics.py"),)


def _literals(path):
    """Schema-name string constants of a Python file, docstrings left out."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
            and SCHEMA_RE.match(n.value)]


def _python_files():
    for top in ("library", "module_utils", "filter_plugins", "gpunuma_controller", "scripts"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(REPO_ROOT, top)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for name in filenames:
                if name.endswith(".py"):
                    yield os.path.relpath(os.path.join(dirpath, name), REPO_ROOT)


def test_schema_names_are_defined_once():
    found = {path: _literals(os.path.join(REPO_ROOT, path)) for path in _python_files()
             if path != OWNER and path not in STANDALONE}
    assert {path: names for path, names in found.items() if names} == {}


def test_standalone_files_name_only_known_schemas():
    for path in STANDALONE:
        names = set(_literals(os.path.join(REPO_ROOT, path)))
        assert names, path
        assert names <= set(schemas.DOCUMENTS), (path, names - set(schemas.DOCUMENTS))


def test_constants_are_distinct_schema_names():
    assert len(set(schemas.DOCUMENTS)) == len(schemas.DOCUMENTS)
    assert all(SCHEMA_RE.match(name) for name in schemas.DOCUMENTS)
