"""Shared pytest setup.

``gpunuma_controller.core.use_core()`` puts ``module_utils/`` on
``ansible.module_utils.__path__`` so unit
tests import the core exactly as modules do at run time
(``ansible.module_utils.gpunuma.*``).

Hypothesis profiles (``HYPOTHESIS_PROFILE``, docs/testing.md):

- ``ci`` (the default): derandomized, no example database, each property
  runs ``examples(n)`` = 30 % of its stated weight ``n`` (at least 10). Two
  runs of one tree try the same examples, so a failure reproduces.
- ``deep``: random seeds and 10x the stated weight, for release checks and
  for hunting new counter-examples (``HYPOTHESIS_PROFILE=deep
  ./scripts/test.sh -m unit``).

Every test carries at least one layer marker of ``pytest.ini``; a test with
none is a collection error (``pytest_collection_modifyitems`` below), so
``-m`` always selects whole layers.
"""

import os
import sys

import pytest
from hypothesis import settings

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)
from gpunuma_controller.core import use_core  # noqa: E402

MODULE_UTILS = use_core()

FIXTURES = os.path.join(REPO_ROOT, "tests", "fixtures")
sys.path.insert(0, os.path.join(REPO_ROOT, "tests"))

# Fraction of each property's stated weight a profile runs, and its settings.
_PROFILES = {
    "ci": (0.3, dict(derandomize=True, database=None)),
    "deep": (10.0, dict(derandomize=False, database=None)),
}
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if PROFILE not in _PROFILES:
    raise pytest.UsageError(
        "HYPOTHESIS_PROFILE=%r is not a gpunuma profile; allowed: %s" % (PROFILE, ", ".join(sorted(_PROFILES))))


def _scaled(weight, scale):
    return max(10, int(weight * scale))


for _name, (_scale, _options) in _PROFILES.items():
    settings.register_profile(_name, max_examples=_scaled(100, _scale), **_options)
settings.load_profile(PROFILE)


def examples(weight):
    """Examples a property of stated weight ``weight`` runs under the loaded profile."""
    return _scaled(weight, _PROFILES[PROFILE][0])


def plant(path, kind, limit):
    """Put what a bounded reader must refuse at ``path``: a FIFO (``fifo``, which a plain open() waits on for ever)
    or a text file one byte over ``limit`` (``huge``)."""
    if kind == "fifo":
        os.mkfifo(path)
    else:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("# " + "x" * (limit - 2) + "\n")


# The layers of pytest.ini; every test belongs to at least one.
LAYERS = ("unit", "ansible", "container", "vm", "browser", "lint", "molecule")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Refuse unmarked tests; order the rest for ``pytest -n N --dist loadfile --no-loadscope-reorder``.

    ``scripts/test.sh`` hands each test file to one worker as a whole
    (``--dist loadfile``): its module-scoped containers boot once, and the
    molecule scenarios run one after another. The files are dealt out in the
    order of their first test here (``--no-loadscope-reorder``), so the
    longest work goes first and overlaps the rest instead of trailing it: the
    VM scenario, then the container scenarios, then files that boot
    containers.

    (``--dist loadgroup`` with an ``xdist_group`` marker per file does not
    group under pytest 9: pytest-xdist 3.8 marks the group by rewriting
    ``item._nodeid``, which pytest 9 no longer reads, so every test was
    scheduled alone and one file's module fixture ran on both workers at
    once, against the same containers.)
    """
    unmarked = [item.nodeid for item in items if not any(item.get_closest_marker(m) for m in LAYERS)]
    if unmarked:
        raise pytest.UsageError(
            "%d test(s) carry no layer marker (allowed: %s), e.g. %s"
            % (len(unmarked), ", ".join(LAYERS), ", ".join(unmarked[:5])))

    def rank(item):
        if item.get_closest_marker("vm"):
            return 0
        if item.get_closest_marker("molecule"):
            return 1
        if item.get_closest_marker("container"):
            return 2
        return 3

    items.sort(key=rank)
