"""One command runner (common/commands.py) and one ``systemctl show`` parser (node/systemctl.py)."""

from __future__ import annotations

import os
import re

import pytest

from ansible.module_utils.gpunuma.common import commands
from ansible.module_utils.gpunuma.node import systemctl
from conftest import REPO_ROOT

pytestmark = pytest.mark.unit


class Module:
    def __init__(self, paths, fail=None):
        self.paths, self.fail, self.calls = paths, fail, []

    def get_bin_path(self, name):
        return self.paths.get(name)

    def run_command(self, argv, handle_exceptions=True, environ_update=None):
        self.calls.append((list(argv), handle_exceptions, dict(environ_update or {})))
        if self.fail:
            raise self.fail
        return 0, "out", ""


def test_a_program_is_resolved_and_run_in_the_c_locale():
    module = Module({"systemctl": "/usr/bin/systemctl"})
    assert commands.runner(module)(["systemctl", "show", "x"]) == (0, "out", "")
    assert module.calls == [(["/usr/bin/systemctl", "show", "x"], False, {"LC_ALL": "C"})]


def test_an_absolute_program_is_run_as_given():
    module = Module({})
    commands.runner(module)(["/opt/x/bin/tool", "-q"])
    assert module.calls[0][0] == ["/opt/x/bin/tool", "-q"]


def test_a_missing_program_is_rc_none_with_the_reason():
    module = Module({})
    rc, out, err = commands.runner(module)(["nvidia-smi", "-q"])
    assert rc is None and out == "" and module.calls == []
    assert err.startswith("nvidia-smi: No such file or directory (not installed") and module.calls == []


def test_a_program_that_cannot_start_is_rc_none():
    module = Module({"tool": "/usr/bin/tool"}, fail=PermissionError(13, "Permission denied"))
    rc, _out, err = commands.runner(module)(["tool"])
    assert rc is None and "/usr/bin/tool" in err and "Permission denied" in err


def test_systemctl_show_keeps_every_line_of_a_repeated_property():
    out = ("ExecStart={ path=/a ; argv[]=/a -x ; }\nExecStart={ path=/b ; argv[]=/b ; }\nEnvironmentFiles=/e (ignore)\n"
           "\nExecStart=\nEnvironmentFiles=\n")
    rc, err, shown = systemctl.show(lambda argv: (0, out, ""), ["a.service", "b.service"], ("ExecStart",))
    assert shown["a.service"]["ExecStart"] == "{ path=/a ; argv[]=/a -x ; }\n{ path=/b ; argv[]=/b ; }"
    assert shown["b.service"] == {"ExecStart": "", "EnvironmentFiles": ""}


CODE_DIRS = ("module_utils", "library", "action_plugins", "filter_plugins")


def _code():
    for base in CODE_DIRS:
        for directory, _, files in os.walk(os.path.join(REPO_ROOT, base)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(directory, name)
                    yield os.path.relpath(path, REPO_ROOT), open(path, encoding="utf-8").read()


def test_modules_run_programs_only_through_the_runner():
    callers = sorted(path for path, text in _code() if re.search(r"\.run_command\(|subprocess\.", text))
    assert callers == ["module_utils/gpunuma/common/commands.py", "module_utils/gpunuma/node/apply/fs.py"], callers
    # node/apply/fs.py calls the runner it was handed (gpunuma_apply passes commands.runner).
    assert "commands.runner(module)" in open(os.path.join(REPO_ROOT, "library", "gpunuma_apply.py")).read()


def test_systemctl_show_output_is_parsed_in_one_place():
    readers = sorted(path for path, text in _code() if re.search(r"""["']show["'],\s*["']--prop""", text))
    assert readers == ["module_utils/gpunuma/node/systemctl.py"], readers
