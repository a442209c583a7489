"""ansible-doc renders every module of library/ (as a user reads them: ``ansible-doc -M library <module>``)."""

import glob
import os
import re
import subprocess

import pytest

from ansible_run import BINDIR, ansible_env
from conftest import REPO_ROOT

pytestmark = pytest.mark.ansible

MODULES = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO_ROOT, "library", "*.py")))


def test_every_module_renders():
    assert len(MODULES) >= 12
    proc = subprocess.run([os.path.join(BINDIR, "ansible-doc"), "-M", "library", "-t", "module", *MODULES],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=ansible_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ERROR" not in proc.stderr and "WARNING" not in proc.stderr, proc.stderr[-3000:]
    text = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout)
    for module in MODULES:
        assert "> MODULE %s (" % module in text, module
        # Every option of the module is shown (its documentation parsed whole).
        assert "OPTIONS" in text.split("> MODULE %s (" % module, 1)[1].split("> MODULE ", 1)[0], module
