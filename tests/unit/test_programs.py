"""Instances' programs (module_utils/gpunuma/node/programs.py): present, runnable by their account, safe as root."""

import os
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest

from ansible.module_utils.gpunuma.node import programs

pytestmark = pytest.mark.unit

HOST = "gpu-a01"


def _nobody():
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' account on this machine")


@pytest.fixture
def tree():
    """A root-owned 0755 directory with a few programs, under /tmp (sticky), whose parents every account can
    search (pytest's own temporary directories are 0700)."""
    if os.geteuid() != 0:
        pytest.skip("ownership checks need root")
    base = Path(tempfile.mkdtemp(prefix="gpunuma-programs-", dir="/tmp"))
    root = base / "opt"
    root.mkdir()
    for directory in (base, root):
        os.chmod(directory, 0o755)
    server = root / "server"
    server.write_text("#!/bin/sh\nexec sleep infinity\n")
    os.chmod(server, 0o755)
    private = root / "private"
    private.write_text("#!/bin/sh\n")
    os.chmod(private, 0o700)
    yield root
    shutil.rmtree(base)


def _plan(*instances):
    return {"instances": [dict({"name": "w%d" % i, "user": "gpunuma"}, **inst) for i, inst in enumerate(instances)]}


def test_requests_take_command0_and_the_account_and_skip_junk():
    instances = [
        {"name": "a", "command": ["/opt/x/server", "--port", "1"]},
        {"name": "b", "command": ["/opt/x/server"], "user": "svc"},
        {"name": "c", "command": ["/opt/x/server"]},  # the same program and account: read once
        {"name": "d", "command": "not a list"},
        {"name": "e", "command": ["relative/path"]},
        {"name": "f"},
        "junk",
        {"name": "g", "command": [5]},
        {"name": "h", "command": ["/usr/bin/true"], "user": 0},
    ]
    assert programs.program_requests(instances) == [
        {"path": "/opt/x/server", "user": "gpunuma"},
        {"path": "/opt/x/server", "user": "svc"},
        {"path": "/usr/bin/true", "user": "0"},
    ]
    assert programs.program_requests("not a list") == []


def test_a_missing_program_is_refused_naming_the_instance(tmp_path):
    missing = str(tmp_path / "nowhere" / "server")
    states = programs.program_states([{"path": missing, "user": "gpunuma"}])
    assert states[missing]["exists"] is False
    [problem] = programs.program_problems(_plan({"command": [missing, "--x"]}), states, HOST)
    assert problem.startswith("%s: gpunuma_instances entry 'w0' runs %s, which does not exist" % (HOST, missing))


def test_a_directory_is_not_a_program(tmp_path):
    states = programs.program_states([{"path": str(tmp_path), "user": "root"}])
    [problem] = programs.program_problems(_plan({"command": [str(tmp_path)], "user": "root"}), states, HOST)
    assert "is not a regular file" in problem


def test_execute_permission_follows_the_account(tree):
    nobody = _nobody().pw_name
    server, private = str(tree / "server"), str(tree / "private")
    states = programs.program_states([{"path": server, "user": nobody}, {"path": private, "user": nobody},
                                      {"path": private, "user": "root"}])
    assert states[server]["executable"] == {nobody: True}
    assert states[private]["executable"] == {nobody: False, "root": True}
    plan = _plan({"command": [server], "user": nobody}, {"command": [private], "user": nobody},
                 {"command": [private], "user": "root"})
    [problem] = programs.program_problems(plan, states, HOST)
    assert "'w1' runs %s as %s, who cannot execute it" % (private, nobody) in problem


def test_a_directory_the_account_cannot_search_hides_the_program(tree):
    nobody = _nobody().pw_name
    os.chmod(tree, 0o700)
    server = str(tree / "server")
    states = programs.program_states([{"path": server, "user": nobody}])
    assert states[server]["executable"] == {nobody: False}


def test_an_account_that_does_not_exist_yet_gets_the_other_bits(tree):
    server, private = str(tree / "server"), str(tree / "private")
    states = programs.program_states([{"path": server, "user": "gpunuma-no-such-account"},
                                      {"path": private, "user": "gpunuma-no-such-account"}])
    assert states[server]["executable"]["gpunuma-no-such-account"] is True
    assert states[private]["executable"]["gpunuma-no-such-account"] is False


@pytest.mark.parametrize("damage, why", [
    (lambda tree: os.chown(tree / "server", _nobody().pw_uid, -1), "is owned by uid"),
    (lambda tree: os.chmod(tree / "server", 0o757), "is writable by every account"),
    (lambda tree: os.chown(tree, _nobody().pw_uid, -1), "is owned by uid"),
    (lambda tree: os.chmod(tree, 0o777), "is writable by every account"),
    (lambda tree: (os.chown(tree / "server", 0, 4242), os.chmod(tree / "server", 0o775)), "writable by group gid 4242"),
])
def test_a_program_run_as_root_that_another_account_can_replace_is_refused(tree, damage, why):
    damage(tree)
    server = str(tree / "server")
    states = programs.program_states([{"path": server, "user": "root"}])
    assert why in states[server]["other_writers"]
    [problem] = programs.program_problems(_plan({"command": [server], "user": "root"}), states, HOST)
    assert "runs %s as root, but" % server in problem and "unprivileged `user`" in problem
    # The same program run as an unprivileged account is that account's business.
    states = programs.program_states([{"path": server, "user": _nobody().pw_name}])
    assert states[server]["other_writers"] is None


def test_a_sticky_world_writable_directory_guards_a_root_owned_program(tree):
    os.chmod(tree, 0o1777)
    server = str(tree / "server")
    states = programs.program_states([{"path": server, "user": "root"}])
    assert states[server]["other_writers"] is None


def test_a_root_owned_program_in_root_owned_directories_passes(tree):
    server = str(tree / "server")
    states = programs.program_states([{"path": server, "user": "root"}])
    assert states[server]["other_writers"] is None
    assert programs.program_problems(_plan({"command": [server], "user": "root"}), states, HOST) == []


def test_nothing_is_checked_when_units_are_not_started_or_the_node_was_not_read(tmp_path):
    missing = str(tmp_path / "nowhere")
    states = programs.program_states([{"path": missing, "user": "gpunuma"}])
    plan = _plan({"command": [missing]})
    assert programs.program_problems(plan, states, HOST, start=False) == []
    assert programs.program_problems(plan, None, HOST) == []
    # A drop-in instance without a command of its own has nothing to check.
    assert programs.program_problems({"instances": [{"name": "d", "mode": "dropin"}]}, states, HOST) == []


def test_a_link_is_judged_by_its_directory_and_its_target(tree):
    """/usr/bin/python3 is a link (mode 0777, as every link): the link's own mode does not make it replaceable."""
    server = tree / "server"
    link = tree / "python3"
    link.symlink_to("server")
    states = programs.program_states([{"path": str(link), "user": "root"}])
    assert states[str(link)]["executable"] == {"root": True}
    assert states[str(link)]["other_writers"] is None
    # The target world-writable: refused through the link.
    os.chmod(server, 0o777)
    states = programs.program_states([{"path": str(link), "user": "root"}])
    assert "%s is writable by every account" % server in states[str(link)]["other_writers"]


def test_requests_take_the_readiness_program_with_the_instances_account():
    instances = [
        {"name": "a", "command": ["/opt/x/server"], "user": "root",
         "ready": {"command": ["/opt/x/check", "--port", "1"]}},
        {"name": "b", "command": ["/opt/x/server"], "ready": {"url": "http://127.0.0.1:1/health"}},
        {"name": "c", "command": ["/opt/x/server"], "ready": {"command": "not a list"}},
    ]
    assert programs.program_requests(instances) == [
        {"path": "/opt/x/server", "user": "root"},
        {"path": "/opt/x/check", "user": "root"},
        {"path": "/opt/x/server", "user": "gpunuma"},
    ]


def test_a_readiness_program_run_as_root_that_another_account_can_replace_is_refused(tree):
    """gpunuma_apply runs a root instance's readiness command as root: its program meets command[0]'s rule."""
    check = tree / "check"
    check.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(check, 0o755)
    os.chown(check, _nobody().pw_uid, -1)
    server = str(tree / "server")
    plan = _plan({"command": [server], "user": "root", "ready": {"command": [str(check)], "timeout": 5}})
    states = programs.program_states(programs.program_requests(plan["instances"]))
    [problem] = programs.program_problems(plan, states, HOST)
    assert "checks its readiness with %s as root, but" % check in problem and "is owned by uid" in problem
    # Missing: named as the readiness program, with the field to correct.
    plan = _plan({"command": [server], "ready": {"command": [str(tree / "gone")]}})
    states = programs.program_states(programs.program_requests(plan["instances"]))
    [problem] = programs.program_problems(plan, states, HOST)
    assert "checks its readiness with %s, which does not exist" % (tree / "gone") in problem
    assert "correct ready.command[0]" in problem
