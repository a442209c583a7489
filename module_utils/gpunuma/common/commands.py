# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one way gpunuma's modules run a program on a node.

Every command runs with ``LC_ALL=C`` (gpunuma parses ``systemctl``,
``nvidia-smi`` and ``lscpu`` output, which other locales translate), with its
program resolved to an absolute path first (``module.get_bin_path``: the
node's PATH and the sbin directories), and without a shell. A program that is
not installed, or cannot be started, is ``rc None`` with the reason as stderr,
never an exception: each caller decides whether that is a failure.
"""

from __future__ import annotations

import errno
import os
from typing import Callable, Sequence, Tuple

Result = Tuple[object, str, str]


def runner(module) -> Callable[[Sequence[str]], Result]:
    """``run(argv) -> (rc, stdout, stderr)`` through ``module.run_command``; ``rc`` is None when the program is not
    installed or cannot be started."""

    def run(argv: Sequence[str]) -> Result:
        argv = [str(word) for word in argv]
        if not argv:
            return None, "", "no program to run"
        if not os.path.isabs(argv[0]):
            found = module.get_bin_path(argv[0])
            if not found:
                # The OS's own words for ENOENT first: callers tell a missing program by them, as from exec.
                return None, "", "%s: %s (not installed: not on PATH or in the sbin directories)" % (
                    argv[0], os.strerror(errno.ENOENT))
            argv[0] = found
        try:
            return module.run_command(argv, handle_exceptions=False, environ_update={"LC_ALL": "C"})
        except (OSError, IOError) as exc:
            return None, "", "%s: %s" % (argv[0], exc)

    return run
