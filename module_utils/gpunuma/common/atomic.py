# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One atomic writer for every file gpunuma writes, on the node or the controller.

:func:`write_atomic` writes a temporary file in the target's own directory,
created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` (``tempfile.mkstemp``: a fresh
name, mode 0600, never a file or link somebody planted there), flushes and
fsyncs it, sets its mode (and owner), then ``rename(2)``s it over the
target. rename replaces a link at the target with the file and never writes
through it, so a symlinked ``fleet-report.html`` or ``<host>.json`` cannot
send gpunuma's output elsewhere. A reader sees the old file or the new one,
never half of one; a failure removes the temporary file and leaves the
target as it was.

Standard library only.
"""

from __future__ import annotations

import os
import tempfile


def write_atomic(path, data, mode=0o644, uid=-1, gid=-1, prefix=None):
    """Replace ``path`` by ``data`` (bytes, or text written as UTF-8) atomically; return ``path``.

    ``uid``/``gid`` (-1: unchanged) are set on the temporary file before the
    rename. ``prefix`` names the temporary file (default ``.<name>.``, so a
    leftover of a killed process is a dot file beside its target).
    """
    directory = os.path.dirname(path) or "."
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix or "." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(tmp, mode)
        if uid != -1 or gid != -1:
            os.chown(tmp, uid, gid)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
