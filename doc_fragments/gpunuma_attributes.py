# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The attributes of gpunuma's modules (described by ansible.builtin.action_common_attributes).

Every module runs in check mode (it reports what it would change and changes
nothing) on POSIX nodes. ``DOCUMENTATION``: no diff; ``DIFF``: the modules
that return one (gpunuma_apply, gpunuma_state, node_checks_fix).
"""


class ModuleDocFragment:
    DOCUMENTATION = r"""
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

    DIFF = r"""
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
"""
