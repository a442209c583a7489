"""The core's packages layer as docs/architecture.md lists them, and every caller imports a name from the module
that defines it.

* Layers: a core module imports only modules of its own package or of a package listed before it (``common``
  first, ``run`` last); no two packages import each other, sub-packages included.
* No facades: ``from M import name`` and ``M.name`` must find ``name`` defined in ``M`` (a function, a class, an
  assignment), not imported into it from another gpunuma module. A module that re-exported its parts made the
  reader look in two places and let a private name (``_child_measure``) travel.
"""

from __future__ import annotations

import ast
import os
import re

import pytest

from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

CORE = os.path.join(REPO_ROOT, "module_utils")
CORE_PREFIX = "ansible.module_utils.gpunuma"
CONTROLLER = "gpunuma_controller"
# docs/architecture.md, "The core, by stage": each package may import those before it.
LAYERS = ("common", "discovery", "node", "plan", "kubelet", "gate", "verify", "run", "report")
CALLER_DIRS = ("module_utils", "library", "action_plugins", "filter_plugins", "gpunuma_controller", "scripts",
               "benchmarks", "tests", "doc_fragments", "roles")


def module_file(module: str, root: str = REPO_ROOT) -> str | None:
    """The file of a gpunuma module (core or controller), or None for anything else."""
    if module == CORE_PREFIX or module.startswith(CORE_PREFIX + "."):
        rel = os.path.join("module_utils", *module.split(".")[2:])
    elif module == CONTROLLER or module.startswith(CONTROLLER + "."):
        rel = os.path.join(*module.split("."))
    else:
        return None
    for candidate in (os.path.join(root, rel + ".py"), os.path.join(root, rel, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def absolute(node: ast.ImportFrom, path: str, root: str) -> str | None:
    """The absolute module name of ``from ... import``, relative imports (the controller's) included."""
    if not node.level:
        return node.module
    package = os.path.relpath(os.path.dirname(path), root).split(os.sep)
    package = package[:len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def top_level(path: str, root: str) -> tuple[set, dict]:
    """Names ``path`` defines itself, and names it imports from another gpunuma module (name -> module)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    own, imported = set(), {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            own.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.ImportFrom):
            module = absolute(node, path, root)
            if module and module_file(module, root):
                for alias in node.names:
                    if not module_file(module + "." + alias.name, root):
                        imported[alias.asname or alias.name] = module
    return own, imported


def python_files(root: str):
    for base in CALLER_DIRS:
        for directory, _, files in os.walk(os.path.join(root, base)):
            for name in sorted(files):
                if name.endswith(".py"):
                    yield os.path.join(directory, name)


def facade_uses(root: str = REPO_ROOT) -> list:
    """Every ``from M import name`` and ``M.name`` where ``name`` is only imported into ``M``."""
    cache = {}

    def names_of(module):
        if module not in cache:
            cache[module] = top_level(module_file(module, root), root)
        return cache[module]

    found = []
    for path in python_files(root):
        try:
            tree = ast.parse(open(path, encoding="utf-8").read())
        except SyntaxError:
            continue
        where = os.path.relpath(path, root)
        modules = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = absolute(node, path, root)
                if not module or not module_file(module, root):
                    continue
                for alias in node.names:
                    if module_file(module + "." + alias.name, root):
                        modules[alias.asname or alias.name] = module + "." + alias.name
                        continue
                    if module_file(module, root).endswith("__init__.py"):
                        continue
                    own, imported = names_of(module)
                    if alias.name not in own and alias.name in imported:
                        found.append("%s:%d imports %s from %s; it is defined in %s"
                                     % (where, node.lineno, alias.name, module, imported[alias.name]))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and module_file(alias.name, root):
                        modules[alias.asname] = alias.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
                module = modules[node.value.id]
                if module_file(module, root).endswith("__init__.py"):
                    continue
                own, imported = names_of(module)
                if node.attr not in own and node.attr in imported:
                    found.append("%s:%d reads %s.%s; it is defined in %s"
                                 % (where, node.lineno, module, node.attr, imported[node.attr]))
    return found


def package_of(dotted: str, root: str) -> str:
    """The core package ``dotted`` (relative to gpunuma) is or lives in."""
    found = module_file(CORE_PREFIX + "." + dotted, root)
    if found and not found.endswith("__init__.py"):
        return dotted.rsplit(".", 1)[0]
    return dotted


def core_imports(root: str = REPO_ROOT) -> list:
    """``(importing package, imported package, file, line)`` for every core import of another core package."""
    edges = []
    core = os.path.join(root, "module_utils", "gpunuma")
    pattern = re.compile(r"^%s\.(.+)$" % re.escape(CORE_PREFIX))
    for directory, _, files in os.walk(core):
        package = ".".join(os.path.relpath(directory, core).split(os.sep))
        if package == ".":
            continue
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                targets = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    match = pattern.match(node.module)
                    if match:
                        targets.append(package_of(match.group(1), root))
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        match = pattern.match(alias.name)
                        if match:
                            targets.append(package_of(match.group(1), root))
                for target in targets:
                    if target != package:
                        edges.append((package, target, os.path.relpath(path, root), node.lineno))
    return edges


def upward(edges) -> list:
    bad = []
    for package, target, path, line in edges:
        mine, theirs = package.split(".")[0], target.split(".")[0]
        if mine not in LAYERS or theirs not in LAYERS:
            bad.append("%s:%d: package %s is not a layer of docs/architecture.md" % (path, line, mine if mine not in
                                                                                     LAYERS else theirs))
        elif LAYERS.index(theirs) > LAYERS.index(mine):
            bad.append("%s:%d: %s imports %s, a layer above it" % (path, line, mine, theirs))
    return bad


def cycles(edges) -> list:
    graph = {}
    for package, target, _, _ in edges:
        graph.setdefault(package, set()).add(target)
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_every_caller_imports_from_the_defining_module():
    assert facade_uses() == []


def test_packages_import_only_the_layers_below_them():
    edges = core_imports()
    assert len(edges) > 100, "the import graph was not read"
    assert upward(edges) == []


def test_no_two_packages_import_each_other():
    assert cycles(core_imports()) == []


def test_the_layers_are_the_packages_on_disk():
    on_disk = {d for d in os.listdir(os.path.join(CORE, "gpunuma")) if os.path.isdir(os.path.join(CORE, "gpunuma", d))
               and d != "__pycache__"}
    assert on_disk == set(LAYERS)
    text = open(os.path.join(REPO_ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    table = text.split("## The core, by stage", 1)[1]
    assert re.findall(r"^\| `(\w+)` \|", table, re.M) == list(LAYERS)


def _tree(tmp_path, files):
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for rel in ("module_utils/gpunuma", "module_utils/gpunuma/common", "module_utils/gpunuma/plan",
                "module_utils/gpunuma/node"):
        (tmp_path / rel / "__init__.py").write_text("")
    return str(tmp_path)


def test_the_checks_see_a_facade_an_upward_import_and_a_cycle(tmp_path):
    root = _tree(tmp_path, {
        "module_utils/gpunuma/common/a.py": "def helper():\n    pass\n",
        "module_utils/gpunuma/node/b.py": ("from ansible.module_utils.gpunuma.common.a import helper\n"
                                           "from ansible.module_utils.gpunuma.plan import c\n"),
        "module_utils/gpunuma/plan/c.py": "from ansible.module_utils.gpunuma.node import b\n",
        "tests/test_x.py": ("from ansible.module_utils.gpunuma.node.b import helper\n"
                            "from ansible.module_utils.gpunuma.node import b\nb.helper()\n"),
    })
    uses = facade_uses(root)
    assert len(uses) == 2 and all("defined in ansible.module_utils.gpunuma.common.a" in u for u in uses), uses
    edges = core_imports(root)
    assert upward(edges) == ["module_utils/gpunuma/node/b.py:2: node imports plan, a layer above it"]
    assert cycles(edges) == ["node -> plan -> node"]
