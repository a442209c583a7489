# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The long options of an instance's command (an argv list), as an engine's own parser reads them."""

from __future__ import annotations

from typing import Any, List, Tuple


def long_options(command: Any) -> List[Tuple[str, str]]:
    """``[(name, value)]`` of every ``--name VALUE`` and ``--name=VALUE`` of ``command``, in order, ``name`` as written
    (without the dashes). A flag with no value (the end of the command, or another option next: an argument
    that starts with ``-``) gets ``""``. Items that are not text are skipped."""
    argv = [a for a in (command or []) if isinstance(a, str)]
    found = []
    for index, arg in enumerate(argv):
        if not arg.startswith("--") or len(arg) < 3:
            continue
        name, joined, value = arg[2:].partition("=")
        if not joined:
            value = argv[index + 1] if index + 1 < len(argv) else ""
            if value.startswith("-"):
                value = ""
        found.append((name, value))
    return found
