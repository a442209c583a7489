"""The node lock (module_utils/gpunuma/node/lock.py): one gpunuma run changes a node at a time."""

import json
import os
import subprocess
import sys
import time

import pytest

from ansible.module_utils.gpunuma.node import lock

pytestmark = pytest.mark.unit

HOLDER = {"controller": "ctl-01", "user": "oncall", "playbook": "site.yml"}


class Clock:
    """A clock that moves only when the code under test sleeps."""

    def __init__(self, start=1_000_000.0):
        self.t = start
        self.slept = 0.0

    def now(self):
        return self.t

    def sleep(self, seconds):
        self.t += seconds
        self.slept += seconds


def lease_of(path):
    with open(path) as handle:
        text = handle.read()
    return json.loads(text) if text.strip() else None


def test_a_free_node_is_taken_and_names_its_holder(tmp_path):
    path = str(tmp_path / "run" / "gpunuma" / "lock")
    clock = Clock()
    info = lock.acquire(path, "run-a", HOLDER, timeout_s=0, ttl_s=60, now=clock.now, sleep=clock.sleep)
    assert info == {"acquired": True, "previous": None, "waited_s": 0}
    lease = lease_of(path)
    assert lease["token"] == "run-a" and lease["holder"] == HOLDER and lease["kind"] == "run"
    assert lease["expires"] == clock.t + 60
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"


def test_the_same_run_renews_its_own_lease(tmp_path):
    path = str(tmp_path / "lock")
    clock = Clock()
    lock.acquire(path, "run-a", HOLDER, 0, 60, now=clock.now, sleep=clock.sleep)
    clock.t += 30
    info = lock.acquire(path, "run-a", HOLDER, 0, 60, now=clock.now, sleep=clock.sleep)
    assert info["acquired"] is False
    assert lease_of(path)["expires"] == clock.t + 60


def test_another_run_waits_its_timeout_then_fails_naming_the_holder(tmp_path):
    path = str(tmp_path / "lock")
    clock = Clock()
    lock.acquire(path, "run-a", HOLDER, 0, 3600, now=clock.now, sleep=clock.sleep)
    with pytest.raises(lock.LockError) as err:
        lock.acquire(path, "run-b", {"user": "other"}, timeout_s=5, ttl_s=3600, now=clock.now, sleep=clock.sleep)
    message = str(err.value)
    for needle in ("another gpunuma run holds this node", "controller ctl-01", "user oncall", "playbook site.yml",
                   "waited 5 s", "gpunuma_lock_timeout", "gpunuma_lock_break=true"):
        assert needle in message, (needle, message)
    assert clock.slept >= 5
    assert lease_of(path)["token"] == "run-a"


def test_a_waiting_run_takes_the_lease_when_the_holder_gives_it_back(tmp_path):
    path = str(tmp_path / "lock")
    clock = Clock()
    lock.acquire(path, "run-a", HOLDER, 0, 3600, now=clock.now, sleep=clock.sleep)

    def sleep(seconds):
        clock.sleep(seconds)
        if clock.slept >= 3:
            lock.release(path, "run-a", now=clock.now, sleep=clock.sleep)

    info = lock.acquire(path, "run-b", HOLDER, timeout_s=60, ttl_s=3600, now=clock.now, sleep=sleep)
    assert info["acquired"] is True and info["previous"] is None and info["waited_s"] >= 3
    assert lease_of(path)["token"] == "run-b"


def test_an_expired_lease_is_taken_over_and_returned(tmp_path):
    path = str(tmp_path / "lock")
    clock = Clock()
    lock.acquire(path, "run-a", HOLDER, 0, 10, now=clock.now, sleep=clock.sleep)
    clock.t += 11
    info = lock.acquire(path, "run-b", {}, 0, 10, now=clock.now, sleep=clock.sleep)
    assert info["acquired"] is True and info["previous"]["token"] == "run-a"
    assert clock.slept == 0


def test_break_lock_takes_over_a_live_lease(tmp_path):
    path = str(tmp_path / "lock")
    clock = Clock()
    lock.acquire(path, "run-a", HOLDER, 0, 3600, now=clock.now, sleep=clock.sleep)
    info = lock.acquire(path, "run-b", {}, 0, 3600, break_lock=True, now=clock.now, sleep=clock.sleep)
    assert info["previous"]["holder"] == HOLDER and lease_of(path)["token"] == "run-b"


def test_a_steps_lease_is_stale_once_its_process_is_gone(tmp_path):
    path = str(tmp_path / "lock")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    clock = Clock()
    lock.acquire(path, "step-x", {"pid": dead.pid}, 0, 3600, now=clock.now, sleep=clock.sleep, kind="step")
    info = lock.acquire(path, "run-b", {}, 0, 3600, now=clock.now, sleep=clock.sleep)
    assert info["previous"]["token"] == "step-x"
    # A run's lease is not judged by a PID: the PID of the step that took it is long gone.
    lock.acquire(path, "run-c", {"pid": dead.pid}, 0, 3600, break_lock=True, now=clock.now, sleep=clock.sleep)
    with pytest.raises(lock.LockError):
        lock.acquire(path, "run-d", {}, 0, 3600, now=clock.now, sleep=clock.sleep)


def test_release_gives_back_only_the_holders_lease(tmp_path):
    path = str(tmp_path / "lock")
    assert lock.release(path, "run-a") is False
    lock.acquire(path, "run-a", HOLDER, 0, 3600)
    assert lock.release(path, "run-b") is False
    assert lease_of(path)["token"] == "run-a"
    assert lock.release(path, "run-a") is True
    assert lease_of(path) is None
    assert lock.peek(path) is None


@pytest.mark.parametrize("content", [b"", b"not json", b"[]", b'{"schema": "other/v1", "token": "x"}',
                                     b'{"schema": "gpunuma.lock/v1", "token": 5}', b"x" * (lock.MAX_LEASE_BYTES + 10)])
def test_what_is_not_a_lease_leaves_the_node_free(tmp_path, content):
    path = tmp_path / "lock"
    path.write_bytes(content)
    assert lock.peek(str(path)) is None
    info = lock.acquire(str(path), "run-a", HOLDER, 0, 60)
    assert info["acquired"] is True and lease_of(path)["token"] == "run-a"


def test_a_link_or_a_directory_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("keep me")
    link = tmp_path / "lock"
    link.symlink_to(target)
    with pytest.raises(lock.LockError, match="cannot open the node lock"):
        lock.acquire(str(link), "run-a", HOLDER, 0, 60)
    assert target.read_text() == "keep me"
    (tmp_path / "dir").mkdir()
    with pytest.raises(lock.LockError):
        lock.acquire(str(tmp_path / "dir"), "run-a", HOLDER, 0, 60)


def test_a_step_of_its_own_holds_the_lease_only_for_its_block(tmp_path):
    path = str(tmp_path / "lock")
    with lock.Held(path, None, {"user": "oncall"}, timeout_s=0):
        lease = lease_of(path)
        assert lease["kind"] == "step" and lease["holder"]["pid"] == os.getpid()
        with pytest.raises(lock.LockError):
            lock.acquire(path, "run-b", {}, 0, 60)
    assert lease_of(path) is None


def test_a_step_of_a_run_keeps_the_runs_lease(tmp_path):
    path = str(tmp_path / "lock")
    lock.acquire(path, "run-a", HOLDER, 0, 3600)
    with lock.Held(path, "run-a", HOLDER, timeout_s=0) as info:
        assert info["acquired"] is False
    assert lease_of(path)["token"] == "run-a"


def test_a_step_without_the_runs_token_waits_then_fails(tmp_path):
    path = str(tmp_path / "lock")
    lock.acquire(path, "run-a", HOLDER, 0, 3600)
    clock = Clock()
    with pytest.raises(lock.LockError, match="another gpunuma run holds this node"):
        with lock.Held(path, None, {}, timeout_s=2, now=clock.now, sleep=clock.sleep):
            raise AssertionError("the step ran under another run's lease")


def test_a_step_running_in_another_process_blocks_until_the_timeout(tmp_path):
    """The flock is held for the whole step: a second process cannot even read-modify the lease meanwhile."""
    path = str(tmp_path / "lock")
    ready = tmp_path / "ready"
    child = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "open(sys.argv[2], 'w').close()\n"
        "time.sleep(30)\n"), path, str(ready)])
    try:
        deadline = time.time() + 10
        while not ready.exists():
            assert time.time() < deadline
            time.sleep(0.05)
        clock = Clock()
        with pytest.raises(lock.LockError, match="another gpunuma run holds this node and is changing it now"):
            lock.acquire(path, "run-b", HOLDER, timeout_s=2, ttl_s=60, now=clock.now, sleep=clock.sleep)
    finally:
        child.kill()
        child.wait()
    # The flock died with its process.
    assert lock.acquire(path, "run-b", HOLDER, 0, 60)["acquired"] is True


def test_the_module_option_is_one_spec():
    spec = lock.module_options()
    assert spec["token"]["no_log"] is True
    assert spec["path"]["default"] == lock.DEFAULT_PATH
    assert set(spec) == {"path", "token", "timeout", "ttl", "holder", "break_lock"}


class FakeModule:
    """What for_module uses of an AnsibleModule: params, check_mode, warn and fail_json."""

    def __init__(self, check_mode=False, **spec):
        self.params = {"lock": spec}
        self.check_mode = check_mode
        self.warnings = []

    def warn(self, text):
        self.warnings.append(text)

    def fail_json(self, **kw):
        raise SystemExit(kw["msg"])


def test_the_first_step_of_a_run_takes_the_runs_lease_and_keeps_it(tmp_path):
    """site.yml has no step of its own for the lease: its first change (the apply step) takes it."""
    path = str(tmp_path / "lock")
    module = FakeModule(path=path, token="run-a", holder=HOLDER, timeout=0, ttl=60)
    with lock.for_module(module) as info:
        assert info["acquired"] is True
    lease = lease_of(path)
    assert lease["token"] == "run-a" and lease["kind"] == "run" and lease["holder"]["playbook"] == "site.yml"
    with lock.for_module(module) as info:  # the run's later steps find it their own
        assert info["acquired"] is False
    assert module.warnings == []


def test_a_step_breaks_a_live_lease_only_when_told_and_says_so(tmp_path):
    path = str(tmp_path / "lock")
    lock.acquire(path, "run-a", HOLDER, 0, 3600)
    with pytest.raises(lock.LockError, match="another gpunuma run holds this node"):
        with lock.for_module(FakeModule(path=path, token="run-b", timeout=0)):
            raise AssertionError("ran under another run's lease")
    module = FakeModule(path=path, token="run-b", timeout=0, break_lock=True)
    with lock.for_module(module) as info:
        assert info["acquired"] is True and info["previous"]["token"] == "run-a"
    assert lease_of(path)["token"] == "run-b"
    assert len(module.warnings) == 1 and "took over the node lock from controller ctl-01" in module.warnings[0]
    assert "broken with break_lock" in module.warnings[0]


def test_a_step_of_its_own_never_breaks_a_lease(tmp_path):
    path = str(tmp_path / "lock")
    lock.acquire(path, "run-a", HOLDER, 0, 3600)
    with pytest.raises(lock.LockError):
        with lock.for_module(FakeModule(path=path, timeout=0, break_lock=True)):
            raise AssertionError("a step without the run's token broke its lease")


def test_check_mode_takes_nothing_and_warns_about_another_holder(tmp_path):
    path = str(tmp_path / "lock")
    module = FakeModule(check_mode=True, path=path, token="run-b", timeout=7)
    with lock.for_module(module) as info:
        assert info is None
    assert not os.path.exists(path) and module.warnings == []
    lock.acquire(path, "run-a", HOLDER, 0, 3600)
    with lock.for_module(module):
        pass
    assert lease_of(path)["token"] == "run-a"
    assert module.warnings and "another gpunuma run holds this node (controller ctl-01" in module.warnings[0]
    assert "wait up to 7 s" in module.warnings[0]


def test_a_bad_time_fails_the_step_naming_the_option(tmp_path):
    with pytest.raises(SystemExit, match="lock.ttl: 0 is not allowed"):
        with lock.for_module(FakeModule(path=str(tmp_path / "lock"), ttl=0)):
            raise AssertionError("ran with a bad ttl")


def test_times_problem_names_the_option_and_what_is_allowed():
    assert lock.times_problem(0, 1) is None
    assert lock.times_problem(-1, 60, "lock.") == "lock.timeout: -1 is not allowed; allowed: 0 or more seconds"
    assert lock.times_problem(5, 0) == "ttl: 0 is not allowed; allowed: 1 or more seconds"


def test_a_hard_linked_lock_file_is_refused_and_the_other_file_kept(tmp_path):
    other = tmp_path / "precious"
    other.write_text("keep me\n")
    os.link(str(other), str(tmp_path / "lock"))
    with pytest.raises(lock.LockError, match="hard-linked to another file"):
        lock.acquire(str(tmp_path / "lock"), "run-a", HOLDER, 0, 60)
    assert other.read_text() == "keep me\n"


@pytest.mark.parametrize("field, value", [
    ("expires", "Infinity"), ("expires", "-Infinity"), ("expires", "NaN"), ("expires", "1e300"),
    ("acquired", "Infinity"), ("acquired", "NaN"), ("acquired", "1e300"), ("expires", "true"),
    ("holder", '{"pid": 1e300}'), ("holder", '{"pid": 99999999999999999999999}'), ("holder", '"me"'),
])
def test_a_damaged_lease_is_stale_never_a_crash(tmp_path, field, value):
    """A lease whose times or pid are not numbers a kernel or clock gives names no expiry: stale, taken over with a
    message that names it, described without raising."""
    base = {"schema": lock.SCHEMA, "token": "old", "kind": "step", "holder": {"controller": "ctl", "pid": 1},
            "acquired": 1_000_000.0, "expires": 1_000_000.0 + 3600}
    text = json.dumps(base).replace(json.dumps(field) + ": " + json.dumps(base[field]), json.dumps(field) + ": " + value)
    assert value in text
    path = tmp_path / "lock"
    path.write_text(text)
    clock = Clock()
    parsed = lock._parse(path.read_bytes())
    assert isinstance(lock.describe(parsed, clock.now()), str)
    if field == "expires":
        # No expiry to honour: stale, taken over, and the take-over message renders.
        assert lock.peek(str(path), now=clock.now) is None
        info = lock.acquire(str(path), "run-a", HOLDER, 0, 60, now=clock.now, sleep=clock.sleep)
        assert info["acquired"] is True and info["previous"]["token"] == "old"
        assert isinstance(lock.took_over(info["previous"], False, clock.now()), str)
    else:
        # A valid expiry still holds the node: another run is refused cleanly, naming what it can of the holder.
        assert lock.peek(str(path), now=clock.now) is not None
        with pytest.raises(lock.LockError, match="another gpunuma run holds this node"):
            lock.acquire(str(path), "run-a", HOLDER, 0, 60, now=clock.now, sleep=clock.sleep)


def test_a_lock_file_removed_while_a_step_waits_is_not_the_lock(tmp_path):
    """flock on a file removed by hand guards nothing: a step that gets it opens the path again."""
    path = tmp_path / "lock"
    clock = Clock()
    lock.acquire(str(path), "run-a", HOLDER, 0, 60, now=clock.now, sleep=clock.sleep)
    held = lock._Flock(str(path), clock.now() + 10, clock.now, clock.sleep).__enter__()
    try:
        path.unlink()
        path.write_text("")  # a new file at the path
        assert not held._still_the_path()
    finally:
        held.__exit__(None, None, None)
    again = lock._Flock(str(path), clock.now() + 10, clock.now, clock.sleep).__enter__()
    try:
        assert again._still_the_path()
    finally:
        again.__exit__(None, None, None)
