"""Every module's documentation parses and says what its argument spec does.

``ansible-doc`` renders each module from its DOCUMENTATION; ``validate-modules``
(ansible-test sanity) compares it with the argument spec. This is the same
comparison, run on every module in ``library/``: for each option (and
suboption) the type, default, choices, required and elements of the
documentation equal the spec's, no option is documented that the module does
not take, and none it takes is undocumented. DOCUMENTATION, EXAMPLES and
RETURN must be valid YAML.
"""

import ast
import glob
import importlib.util
import os

import pytest
import yaml

from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

MODULES = sorted(glob.glob(os.path.join(REPO_ROOT, "library", "*.py")))


class _Captured(Exception):
    def __init__(self, kwargs):
        super().__init__("argument spec captured")
        self.kwargs = kwargs


class _CaptureModule:
    def __init__(self, **kwargs):
        raise _Captured(kwargs)


def _docs(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
            out[node.targets[0].id] = node.value.value
    return out


def _with_fragments(documentation):
    """DOCUMENTATION with the options of its ``extends_documentation_fragment`` entries (doc_fragments/), merged
    as ansible-doc merges them."""
    for name in documentation.get("extends_documentation_fragment") or []:
        if name.startswith("ansible.builtin."):
            # ansible-core's own fragments: action_common_attributes describes attributes, no option.
            module = importlib.import_module("ansible.plugins.doc_fragments." + name.split(".")[2].split(".")[0])
            assert "options" not in (yaml.safe_load(module.ModuleDocFragment.DOCUMENTATION) or {}), name
            continue
        base, _dot, part = name.partition(".")
        fragment = os.path.join(REPO_ROOT, "doc_fragments", base + ".py")
        assert os.path.isfile(fragment), "%s: no doc_fragments/%s.py" % (documentation["module"], base)
        source = open(fragment, encoding="utf-8").read()
        namespace = {}
        exec(compile(source, fragment, "exec"), namespace)
        data = yaml.safe_load(getattr(namespace["ModuleDocFragment"], (part or "documentation").upper()))
        if "attributes" in data:
            assert "attributes" not in documentation, "%s sets attributes itself and through %s" % (
                documentation["module"], name)
            documentation["attributes"] = data["attributes"]
        options = data.get("options") or {}
        clash = set(options) & set(documentation.get("options") or {})
        assert not clash, "%s documents %s itself and through %s" % (documentation["module"], sorted(clash), name)
        documentation.setdefault("options", {}).update(options)
    return documentation


def _argument_spec(path):
    spec = importlib.util.spec_from_file_location("gpunuma_doc_check_" + os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.AnsibleModule = _CaptureModule
    with pytest.raises(_Captured) as captured:
        module.main()
    return captured.value.kwargs["argument_spec"]


def _compare(doc_options, spec_options, where, problems):
    doc_options = doc_options or {}
    for name in sorted(set(doc_options) - set(spec_options)):
        problems.append("%s.%s: documented, but the module does not take it" % (where, name))
    for name, spec in sorted(spec_options.items()):
        doc = doc_options.get(name)
        path = "%s.%s" % (where, name)
        if doc is None:
            problems.append("%s: taken by the module, not documented" % path)
            continue
        for key, fallback in (("type", "str"), ("default", None), ("choices", None), ("required", False),
                              ("elements", None)):
            documented, actual = doc.get(key, fallback), spec.get(key, fallback)
            if key == "choices" and documented is not None and actual is not None:
                documented, actual = list(documented), list(actual)
            if documented != actual:
                problems.append("%s: %s is %r in the documentation, %r in the argument spec"
                                % (path, key, documented, actual))
        if spec.get("options") or doc.get("suboptions"):
            _compare(doc.get("suboptions"), spec.get("options") or {}, path, problems)


@pytest.mark.parametrize("path", MODULES, ids=[os.path.basename(p)[:-3] for p in MODULES])
def test_documentation_parses_and_matches_the_argument_spec(path):
    docs = _docs(path)
    assert set(docs) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}, sorted(docs)
    parsed = {}
    for key, text in docs.items():
        try:
            parsed[key] = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            pytest.fail("%s %s is not valid YAML: %s" % (os.path.basename(path), key, exc))
    assert parsed["DOCUMENTATION"]["module"] == os.path.basename(path)[:-3]
    problems = []
    _compare(_with_fragments(parsed["DOCUMENTATION"]).get("options"), _argument_spec(path),
             os.path.basename(path)[:-3], problems)
    assert problems == [], "\n".join(problems)
    # Attributes as validate-modules and ansible-doc expect them (described by ansible-core's fragment).
    documentation = parsed["DOCUMENTATION"]  # with its fragments merged (_with_fragments)
    assert "ansible.builtin.action_common_attributes" in documentation["extends_documentation_fragment"]
    attributes = documentation["attributes"]
    assert set(attributes) == {"check_mode", "diff_mode", "platform"}, sorted(attributes)
    assert attributes["check_mode"]["support"] == "full"
    assert attributes["platform"]["platforms"] == "posix"
    source = open(path, encoding="utf-8").read()
    # diff_mode full exactly where the module returns a diff.
    assert (attributes["diff_mode"]["support"] == "full") == ("diff=" in source or '"diff"' in source), \
        attributes["diff_mode"]


@pytest.mark.parametrize("path", MODULES, ids=[os.path.basename(p)[:-3] for p in MODULES])
def test_module_carries_the_licence(path):
    head = open(path, encoding="utf-8").read().splitlines()[:6]
    assert "# SPDX-License-Identifier: GPL-3.0-or-later" in head
    assert os.path.isfile(os.path.join(REPO_ROOT, "LICENSE"))
    assert "GNU GENERAL PUBLIC LICENSE" in open(os.path.join(REPO_ROOT, "LICENSE"), encoding="utf-8").read(200)
