"""docs/architecture.md names the one function that decides each concern: every name it gives must exist.

A move or a rename that leaves the pipeline drawing pointing at nothing fails here, so a newcomer following the
drawing always lands on the code that decides.
"""

import importlib
import os
import re

import pytest

from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

STAGES = ("common", "discovery", "node", "plan", "kubelet", "gate", "verify", "run")
NAME_RE = re.compile(r"\b(?:%s)(?:\.[A-Za-z_][A-Za-z0-9_]*)+" % "|".join(STAGES))


def pipeline_names():
    text = open(os.path.join(REPO_ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    block = text.split("## The pipeline", 1)[1].split("```", 2)[1]
    return sorted(set(n for n in NAME_RE.findall(block) if not n.endswith(".json")))


def resolve(dotted):
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module("ansible.module_utils.gpunuma." + ".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_the_drawing_names_code():
    names = pipeline_names()
    assert len(names) >= 25, names  # the drawing still names the deciders
    missing = []
    for name in names:
        try:
            resolve(name)
        except (ImportError, AttributeError) as exc:
            missing.append("%s (%s)" % (name, exc))
    assert not missing, "docs/architecture.md names code that does not exist: %s" % ", ".join(missing)


def test_a_renamed_function_is_caught():
    with pytest.raises(AttributeError):
        resolve("plan.planner.build_plan_renamed")
    assert callable(resolve("plan.render.render_instance"))
