"""The suite's own scheduling: scripts/test.sh hands each test file to one
pytest-xdist worker as a whole, in the order tests/conftest.py gives.

A file's module-scoped containers (and the molecule scenarios, one file) must
never run on both workers at once: two copies of a module fixture drive the
same containers and each undoes the other's work. This runs a small suite
with the worker options scripts/test.sh passes and this repository's
conftest, and checks where each test ran.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

TEST_SH = os.path.join(REPO_ROOT, "scripts", "test.sh")


def _worker_options():
    """The xdist options of the line in scripts/test.sh that runs pytest on workers."""
    with open(TEST_SH, encoding="utf-8") as handle:
        lines = [line for line in handle if re.search(r"pytest -n ", line)]
    assert len(lines) == 1, "scripts/test.sh should run pytest on workers once, found: %r" % lines
    words = lines[0].split()
    start = words.index("-n") + 2
    options = []
    for word in words[start:]:
        if word.startswith('"$@"'):
            break
        options.append(word)
    return options


SUITE_FILE = '''
import json, os, time
import pytest

pytestmark = pytest.mark.{marker}

@pytest.mark.parametrize("n", range({count}))
def test_record(n):
    time.sleep(0.05)
    with open(os.environ["SCHED_LOG"], "a") as log:
        log.write(json.dumps([os.environ.get("PYTEST_XDIST_WORKER"), __name__, n, time.time()]) + "\\n")
'''


def test_each_file_runs_whole_on_one_worker_container_files_first(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(os.path.join(REPO_ROOT, "tests", "conftest.py"), suite / "conftest.py")
    (suite / "pytest.ini").write_text(open(os.path.join(REPO_ROOT, "pytest.ini"), encoding="utf-8").read())
    # Unit files first in name order; the container file last by name and
    # with the fewest tests, so neither collection order nor xdist's default
    # reordering by test count can put it first: only the conftest's order.
    for name, marker, count in (("test_a_unit.py", "unit", 6), ("test_b_unit.py", "unit", 6),
                                ("test_c_unit.py", "unit", 6), ("test_z_container.py", "container", 3)):
        (suite / name).write_text(SUITE_FILE.format(marker=marker, count=count))
    log = tmp_path / "sched.jsonl"
    # The copied conftest imports gpunuma_controller from the repository root.
    env = dict(os.environ, SCHED_LOG=str(log), PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p))
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                           *_worker_options(), str(suite)],
                          cwd=suite, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 21, records
    workers = {}
    for worker, module, _, _ in records:
        workers.setdefault(module, set()).add(worker)
    split = {module: sorted(w) for module, w in workers.items() if len(w) != 1}
    assert not split, "test files ran on more than one worker: %r" % split
    assert len({w for ws in workers.values() for w in ws}) == 2, "both workers should have had work: %r" % workers
    container_start = min(r[3] for r in records if r[1] == "test_z_container")
    starts = sorted({min(r[3] for r in records if r[1] == m) for m in workers})
    # The container file is one of the two files dealt out first.
    assert container_start in starts[:2], records
