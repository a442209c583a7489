# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""``systemctl show`` for several units in one call: the node read (node/probe.py) and the apply step's unit steps
(node/apply/units.py) read unit properties the same way."""

from __future__ import annotations

import re


def show(runner, units, props):
    """``(rc, err, {unit: {prop: value}})`` from one ``systemctl show --property=...`` call for ``units`` (in their
    order; systemd prints one block a unit, blocks separated by an empty line). A unit without a block is absent.
    A property systemd prints on several lines (``ExecStart=``, ``EnvironmentFiles=``: one line each) holds them
    joined by newlines. The one parser of ``systemctl show`` output in gpunuma."""
    units = list(dict.fromkeys(units or []))
    if not units:
        return 0, "", {}
    rc, out, err = runner(["systemctl", "show", "--property=" + ",".join(props), "--"] + units)
    out = out or ""
    blocks = re.split(r"\n\s*\n", out.strip("\n")) if out.strip() else []
    states = {}
    for unit, block in zip(units, blocks):
        values = {}
        for line in block.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                values[key] = values[key] + "\n" + value if key in values else value
        states[unit] = values
    return rc, err, states
