"""gpunuma_apply's Controller: how the module learns that the run that started it went away.

A signal (Ctrl-C reaches a module run by the local connection as SIGINT) is
noted, not obeyed, so the step in progress reaches a boundary; a closed
output pipe (over SSH the session's pipe closes with the controller) shows
as EPIPE on the blank line the module writes. Blank lines before a module's
JSON answer are what the controller skips.
"""

import importlib.util
import os
import signal

import pytest

from ansible.module_utils.json_utils import _filter_non_json_lines
from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

_spec = importlib.util.spec_from_file_location("gpunuma_apply_controller",
                                               os.path.join(REPO_ROOT, "library", "gpunuma_apply.py"))
gpunuma_apply = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpunuma_apply)


@pytest.fixture
def handlers():
    saved = {s: signal.getsignal(s) for s in gpunuma_apply.Controller.SIGNALS}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.fixture
def pipe():
    """The module's output (fd 1 on the node) as a pipe: (read end, write end), closed after the test."""
    ends = list(os.pipe())
    yield ends
    for fd in ends:
        try:
            os.close(fd)
        except OSError:
            pass


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_is_noted_and_the_process_goes_on(handlers, pipe, signum):
    controller = gpunuma_apply.Controller(pipe[1])
    assert controller.gone() is None
    os.kill(os.getpid(), signum)  # would end the process (or raise KeyboardInterrupt) without the handler
    assert controller.gone() == "signal %s" % signal.Signals(signum).name
    # The first signal is the one reported.
    os.kill(os.getpid(), signal.SIGTERM)
    assert controller.gone() == "signal %s" % signal.Signals(signum).name


def test_a_closed_output_pipe_means_the_controller_is_gone(handlers, pipe):
    read, write = pipe
    controller = gpunuma_apply.Controller(write)
    assert controller.gone() is None
    assert os.read(read, 16) == b"\n"
    os.close(read)
    assert controller.gone() == "its connection closed (EPIPE)"


def test_the_blank_lines_asked_with_are_skipped_by_the_controller():
    answer = '\n\n\n{"changed": false, "msg": "ok"}\n'
    cleaned, warnings = _filter_non_json_lines(answer, objects_only=True)
    assert cleaned == '{"changed": false, "msg": "ok"}' and warnings == []
