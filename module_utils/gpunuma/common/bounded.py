# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Bounded reading: every file gpunuma reads, and every JSON document it parses.

* :func:`read_bounded`: a regular file only (a FIFO, socket, device or
  directory refused before it can block or stream), at most ``limit`` bytes.
* :func:`loads_json`: ``json.loads`` that first refuses a document nested
  deeper than ``MAX_JSON_DEPTH`` (Python's parser recurses: 200,000 nested
  brackets end in ``RecursionError``, a traceback instead of a message).
  The error is a ``ValueError``, as for any malformed JSON, so every reader
  reports it the way it reports bad JSON.

Standard library only.
"""

from __future__ import annotations

import errno
import json
import os
import stat

# sysfs and procfs attributes are at most a page; 64 KiB is generous.
MAX_ATTRIBUTE_BYTES = 65536
# gpunuma's documents nest a few levels (plan -> instances -> systemd); a
# kubelet configuration a few more.
MAX_JSON_DEPTH = 64

_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
)


def file_kind(mode):
    """What a non-regular file is, for messages."""
    for test, name in _FILE_KINDS:
        if test(mode):
            return name
    return "not a regular file"


_S_ISREG = stat.S_ISREG
# O_NONBLOCK: a FIFO swapped in after the type check still cannot block.
_FOLLOW_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
_ATTRIBUTE_FLAGS = _FOLLOW_FLAGS | getattr(os, "O_NOFOLLOW", 0)


def _refuse(path, mode, follow_symlinks, what):
    if stat.S_ISLNK(mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        raise OSError(errno.ELOOP, "it is a symbolic link (to %s); %s is read only as a regular file"
                      % (target, what))
    raise OSError(errno.EINVAL, "it is %s%s; %s is read only as a regular file"
                  % (file_kind(mode),
                     " (%s)" % os.path.realpath(path) if follow_symlinks and os.path.islink(path) else "",
                     what))


def open_regular(path, follow_symlinks=False, what="a sysfs or procfs attribute"):
    """``(fd, fstat result)`` of the regular file ``path``, opened read-only; the caller closes ``fd``.

    Only regular files are opened: a FIFO, socket, directory or device node
    (a link to ``/dev/zero``) is refused before ``open()``, so nothing can
    block or stream forever, and nothing under ``/dev`` is opened (opening
    some devices, such as a watchdog, has effects). With
    ``follow_symlinks=False`` (sysfs and procfs attributes and the files
    gpunuma owns, which are never links) a symbolic link is refused too,
    which also stops symlink loops; with ``True`` (files a user names) the
    link's target must be a regular file outside ``/dev``. The file is
    opened ``O_NONBLOCK`` and checked again with ``fstat`` (the path may have
    been swapped between ``lstat()`` and ``open()``).

    Raises ``OSError``: ``ENOENT``/``ENOTDIR`` when absent (as ``open``
    would), otherwise with a ``strerror`` that says what the file is and
    what is allowed (``ELOOP`` for a link, ``EINVAL`` for a file of the wrong
    type).
    """
    mode = (os.stat if follow_symlinks else os.lstat)(path).st_mode
    if not _S_ISREG(mode):
        _refuse(path, mode, follow_symlinks, what)
    if follow_symlinks:
        real = os.path.realpath(path)
        if real == "/dev" or real.startswith("/dev/"):
            raise OSError(errno.EINVAL, "it resolves to %s, under /dev; %s is read only from a regular file"
                          % (real, what))
    fd = os.open(path, _FOLLOW_FLAGS if follow_symlinks else _ATTRIBUTE_FLAGS)
    try:
        st = os.fstat(fd)
        if not _S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "it is %s; %s is read only as a regular file" % (file_kind(st.st_mode), what))
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_bounded(path, limit=MAX_ATTRIBUTE_BYTES, follow_symlinks=False, what="a sysfs or procfs attribute"):
    """The bytes of the regular file ``path`` (opened by ``open_regular``), at most ``limit`` of them.

    Reads up to ``limit + 1`` bytes; raises ``OSError`` as ``open_regular``
    does, and ``EFBIG`` when the file is larger than ``limit``.
    """
    fd = open_regular(path, follow_symlinks, what)[0]
    try:
        # A sysfs or procfs attribute arrives whole in one read (the next
        # returns nothing); a larger file may come in several.
        data = os.read(fd, limit + 1)
        chunks, chunk, total = [data], data, len(data)
        while chunk and total <= limit:
            chunk = os.read(fd, limit + 1 - total)
            chunks.append(chunk)
            total += len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(errno.EFBIG, "it is larger than %d bytes, the most %s may hold" % (limit, what))
    return data


def json_depth(text, stop_at=None):
    """The deepest nesting of objects and arrays in JSON ``text`` (strings skipped); stops early past ``stop_at``."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if stop_at is not None and deepest > stop_at:
                    return deepest
        elif char in "]}":
            depth -= 1
    return deepest


def loads_json(text, max_depth=MAX_JSON_DEPTH, **kwargs):
    """``json.loads(text)``, refusing (``ValueError``) a document nested deeper than ``max_depth``."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    if json_depth(text, stop_at=max_depth) > max_depth:
        raise ValueError("nested deeper than %d levels, more than any gpunuma document" % max_depth)
    return json.loads(text, **kwargs)
