# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where gpunuma's parts lie, from a controller plugin's own file: a checkout or the collection."""

from __future__ import annotations

import os


def plugin_root(plugin_file):
    """The checkout or collection root of the plugin at ``plugin_file``: ``action_plugins/x.py`` in a checkout,
    ``plugins/action/x.py`` in the collection (roles/, policies/ and the rest lie under it)."""
    here = os.path.dirname(os.path.abspath(plugin_file))
    return os.path.dirname(os.path.dirname(here)) if os.path.basename(os.path.dirname(here)) == "plugins" \
        else os.path.dirname(here)
