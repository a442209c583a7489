# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node lock: one gpunuma run changes a node at a time.

A run takes a lease on the node (``/run/gpunuma/lock`` by default): a small
JSON record naming its holder (controller host, user, playbook, when it was
taken) and a token only that run knows. Every step that changes the node
(``gpunuma_apply``, ``gpunuma_state`` recording a switch, ``gpunuma_lock``
itself) takes the lease under an exclusive ``flock`` of the same file, so
two runs cannot interleave: the second waits up to its timeout, then stops
naming the holder.

* A step given the run's token finds the lease its own and goes on.
* A step given no token (a role used alone) takes the lease for itself and
  gives it back when it ends.
* A lease whose ``expires`` has passed is stale (the run that took it died
  with its controller): the next run takes it over and says so. A step's
  own lease is also stale once its process is gone (killed mid-step).
* The lease lives under ``/run``, so a reboot clears it.

Only the standard library; the modules pass ``now`` and ``sleep`` so the
tests drive the clock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time

from ansible.module_utils.gpunuma.common import node_paths, schemas

SCHEMA = schemas.LOCK
DEFAULT_PATH = node_paths.LOCK
DEFAULT_TIMEOUT_S = 300
DEFAULT_TTL_S = 3600
POLL_S = 1.0
# A lease is a few hundred bytes; anything larger is not gpunuma's.
MAX_LEASE_BYTES = 64 * 1024
HOLDER_KEYS = ("controller", "user", "playbook", "pid")


class LockError(Exception):
    """The lease could not be taken: held by another run past the timeout, or the file is unusable."""


def describe(lease, now):
    """One line naming a lease's holder, for messages."""
    holder = lease.get("holder") or {}
    words = []
    for key in HOLDER_KEYS:
        if holder.get(key) not in (None, ""):
            words.append("%s %s" % (key, holder[key]))
    acquired = lease.get("acquired")
    if isinstance(acquired, (int, float)):
        words.append("since %s (%d s ago)" % (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(acquired)),
                                              max(0, int(now - acquired))))
    expires = lease.get("expires")
    if isinstance(expires, (int, float)):
        words.append("expires in %d s" % max(0, int(expires - now)))
    return ", ".join(words) or "an unnamed holder"


def held_message(lease, now, since, busy=False):
    """Why a step cannot go on: who holds the node, how long it waited, what to do."""
    return ("another gpunuma run holds this node%s (%s): waited %d s (gpunuma_lock_timeout); run again when it has "
            "finished, or, if that run is gone, wait until its lease expires or pass -e gpunuma_lock_break=true"
            % (" and is changing it now" if busy else "", describe(lease, now) if lease else "no lease recorded",
               max(0, int(now - since))))


# What a lease's times and pid may be: seconds since the epoch before the year 5138, a Linux pid (PID_MAX_LIMIT).
MAX_TIME_S = 1e11
MAX_PID = 1 << 22


def _number(value, limit):
    """``value`` when it is a finite number from 0 to ``limit`` (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if 0 <= value <= limit else None  # NaN and the infinities fail both comparisons or the limit


def _parse(raw):
    """The lease in ``raw`` (the file's bytes, read up to ``MAX_LEASE_BYTES + 1``), or None when the file is empty,
    too large or not a lease. Times and a pid that are not finite numbers in range (``Infinity``, ``NaN``, a year
    past 5138, a pid no kernel gives) are dropped: such a lease names no expiry, so it is stale, never a crash."""
    if not raw.strip() or len(raw) > MAX_LEASE_BYTES:
        return None
    try:
        lease = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(lease, dict) or lease.get("schema") != SCHEMA or not isinstance(lease.get("token"), str):
        return None
    for key in ("acquired", "expires"):
        lease[key] = _number(lease.get(key), MAX_TIME_S)
    holder = lease.get("holder")
    lease["holder"] = dict(holder) if isinstance(holder, dict) else {}
    if "pid" in lease["holder"]:
        pid = lease["holder"]["pid"]
        lease["holder"]["pid"] = pid if isinstance(pid, int) and _number(pid, MAX_PID) else None
    return lease


class _Flock:
    """An exclusive flock of the lease file, taken within a deadline."""

    def __init__(self, path, deadline, now, sleep, waited_from=None):
        self.path, self.deadline, self.now, self.sleep = path, deadline, now, sleep
        self.waited_from = now() if waited_from is None else waited_from
        self.fd = None

    def __enter__(self):
        directory = os.path.dirname(self.path) or "."
        try:
            os.makedirs(directory, mode=0o755, exist_ok=True)
            # O_NOFOLLOW: never a link somebody planted; a regular file only.
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
        except OSError as exc:
            raise LockError("%s: cannot open the node lock: %s" % (self.path, os.strerror(exc.errno) if exc.errno
                                                                   else exc))
        info = os.fstat(self.fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(self.fd)
            raise LockError("%s: the node lock is not a regular file" % self.path)
        if info.st_nlink > 1:
            # Its lease would be written into whatever other file shares the inode.
            os.close(self.fd)
            raise LockError("%s: the node lock is hard-linked to another file (%d links); gpunuma writes its lease "
                            "into it, so it is not used: remove it (rm %s) and run again"
                            % (self.path, info.st_nlink, self.path))
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if not self._still_the_path():
                    # Removed (or replaced) while this step waited: its flock guards nothing; open the path again.
                    os.close(self.fd)
                    self.fd = None
                    return self.__enter__()
                return self
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(self.fd)
                    raise LockError("%s: cannot lock: %s" % (self.path, os.strerror(exc.errno)))
            if self.now() >= self.deadline:
                lease = self.read()
                os.close(self.fd)
                raise LockError(held_message(lease, self.now(), self.waited_from, busy=True))
            self.sleep(POLL_S)

    def _still_the_path(self):
        """Whether the locked file is still the one at the path (a file removed by hand is not the lock)."""
        try:
            now = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return False
        mine = os.fstat(self.fd)
        return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)

    def read(self):
        os.lseek(self.fd, 0, os.SEEK_SET)
        return _parse(os.read(self.fd, MAX_LEASE_BYTES + 1))

    def write(self, lease):
        data = b"" if lease is None else (json.dumps(lease, sort_keys=True) + "\n").encode("utf-8")
        os.lseek(self.fd, 0, os.SEEK_SET)
        os.ftruncate(self.fd, 0)
        if data:
            os.write(self.fd, data)
        os.fsync(self.fd)

    def __exit__(self, *exc):
        if self.fd is not None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = None
        return False


def _new_lease(token, holder, now, ttl_s, kind="run"):
    return {"schema": SCHEMA, "token": token, "kind": kind,
            "holder": {k: holder.get(k) for k in HOLDER_KEYS if holder.get(k)},
            "acquired": now, "expires": now + ttl_s}


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def is_stale(lease, now):
    """A lease past its expiry, or a step's lease whose process is gone."""
    expires = lease.get("expires")
    if not (isinstance(expires, (int, float)) and expires > now):
        return True
    pid = (lease.get("holder") or {}).get("pid")
    if lease.get("kind") == "step" and isinstance(pid, int) and not isinstance(pid, bool):
        return not _pid_alive(pid)
    return False


def _acquire_locked(path, token, holder, timeout_s, ttl_s, break_lock, now, sleep, kind):
    """Take the lease for ``token`` (see :func:`acquire`); returns (the flock, still held, and the info)."""
    start = now()
    deadline = start + max(0, timeout_s)
    while True:
        lock = _Flock(path, deadline, now, sleep, waited_from=start).__enter__()
        try:
            lease = lock.read()
            current = now()
            if lease is not None and lease["token"] == token:
                lease["expires"] = current + ttl_s
                lock.write(lease)
                return lock, {"acquired": False, "previous": None, "waited_s": round(current - start, 3)}
            if lease is None or is_stale(lease, current) or break_lock:
                lock.write(_new_lease(token, holder, current, ttl_s, kind))
                return lock, {"acquired": True, "previous": lease, "waited_s": round(current - start, 3)}
            if current >= deadline:
                raise LockError(held_message(lease, current, start))
        except BaseException:
            lock.__exit__(None, None, None)
            raise
        lock.__exit__(None, None, None)
        sleep(POLL_S)


def acquire(path, token, holder, timeout_s=DEFAULT_TIMEOUT_S, ttl_s=DEFAULT_TTL_S, break_lock=False,
            now=time.time, sleep=time.sleep, kind="run"):
    """Take the lease for ``token``, waiting up to ``timeout_s`` for another holder.

    Returns {"acquired": bool (false when the token held it already),
    "previous": the stale or broken lease taken over, or None,
    "waited_s": seconds spent waiting}. Raises LockError naming the holder.
    """
    lock, info = _acquire_locked(path, token, holder, timeout_s, ttl_s, break_lock, now, sleep, kind)
    lock.__exit__(None, None, None)
    return info


def release(path, token, now=time.time, sleep=time.sleep):
    """Give the lease back if ``token`` holds it; returns True when it did."""
    if not os.path.exists(path):
        return False
    with _Flock(path, now() + DEFAULT_TIMEOUT_S, now, sleep) as lock:
        lease = lock.read()
        if lease is None or lease["token"] != token:
            return False
        lock.write(None)
        return True


def release_quietly(path, token):
    """:func:`release` for a step that gives a run's lease back on that run's behalf (after its record, or when its
    controller went away): whether it was given back; a failure is no error (the run's own release step, or the
    lease's expiry, gives it back)."""
    try:
        return release(path or DEFAULT_PATH, token)
    except (LockError, OSError):
        return False


def peek(path, now=time.time):
    """The current lease (None when free or stale), without taking anything: for check mode."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        lease = _parse(os.read(fd, MAX_LEASE_BYTES + 1))
    finally:
        os.close(fd)
    if lease is None or is_stale(lease, now()):
        return None
    return lease


class Held:
    """Hold the lease for one module's work: ``with Held(...) as info:``.

    With the run's token the lease stays after the block (the run gives it
    back at its end); without one, a private token takes it for the block
    only. The flock itself is held for the whole block, so two steps never
    change the node at once even between runs that share nothing else.
    """

    def __init__(self, path, token=None, holder=None, timeout_s=DEFAULT_TIMEOUT_S, ttl_s=DEFAULT_TTL_S,
                 now=time.time, sleep=time.sleep, break_lock=False):
        self.path, self.token, self.holder = path, token, holder or {}
        self.break_lock = bool(break_lock) and token is not None
        self.timeout_s, self.ttl_s, self.now, self.sleep = timeout_s, ttl_s, now, sleep
        self.private = token is None
        self._flock = None

    def __enter__(self):
        if self.private:
            self.token = "step-%d-%d" % (os.getpid(), int(self.now() * 1000))
        holder = dict(self.holder, pid=self.holder.get("pid") or os.getpid())
        # The flock that took the lease stays held for the whole block.
        self._flock, info = _acquire_locked(self.path, self.token, holder, self.timeout_s, self.ttl_s,
                                            self.break_lock, self.now, self.sleep, "step" if self.private else "run")
        return info

    def __exit__(self, *exc):
        if self._flock is not None:
            if self.private:
                self._flock.write(None)
            self._flock.__exit__(*exc)
        return False


def took_over(previous, broken, now):
    """The warning of a step that took a lease over from another run."""
    return "took over the node lock from %s (%s)" % (
        describe(previous, now), "broken with break_lock" if broken else "its lease had expired or its step was gone")


def times_problem(timeout, ttl, prefix=""):
    """Why a wait or a lease lifetime is not allowed (naming ``prefix`` + the option), or None."""
    if timeout < 0:
        return "%stimeout: %r is not allowed; allowed: 0 or more seconds" % (prefix, timeout)
    if ttl < 1:
        return "%sttl: %r is not allowed; allowed: 1 or more seconds" % (prefix, ttl)
    return None


def module_options():
    """The ``lock`` option of the modules that change a node (argument spec)."""
    return dict(
        path=dict(type="path", default=DEFAULT_PATH),
        token=dict(type="str", no_log=True),
        timeout=dict(type="int", default=DEFAULT_TIMEOUT_S),
        ttl=dict(type="int", default=DEFAULT_TTL_S),
        holder=dict(type="dict", default={}, options=dict(
            controller=dict(type="str"), user=dict(type="str"), playbook=dict(type="str"))),
        break_lock=dict(type="bool", default=False),
    )


@contextlib.contextmanager
def for_module(module):
    """The node lock for a module's step, from its ``lock`` option.

    The first step of a run given its token takes the run's lease (site.yml has no step of its own for it: the
    lease is taken by the first step that changes the node); ``break_lock`` takes it from a live holder, with a
    warning. Check mode takes nothing and writes nothing: it warns when another run holds the node."""
    spec = module.params.get("lock") or {}
    timeout = DEFAULT_TIMEOUT_S if spec.get("timeout") is None else spec["timeout"]
    ttl = DEFAULT_TTL_S if spec.get("ttl") is None else spec["ttl"]
    problem = times_problem(timeout, ttl, "lock.")
    if problem:
        module.fail_json(msg=problem)
    path = spec.get("path") or DEFAULT_PATH
    if module.check_mode:
        lease = peek(path)
        if lease is not None and lease["token"] != spec.get("token"):
            module.warn("another gpunuma run holds this node (%s); a real run would wait up to %d s for it "
                        "(gpunuma_lock_timeout)" % (describe(lease, time.time()), timeout))
        yield None
        return
    with Held(path, spec.get("token") or None, dict(spec.get("holder") or {}), timeout, ttl,
              break_lock=spec.get("break_lock")) as info:
        if info["previous"] is not None:
            module.warn(took_over(info["previous"], spec.get("break_lock"), time.time()))
        yield info
