# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The ``lock`` option of the modules that change a node (module_utils/gpunuma/node/lock.py: module_options)."""


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  lock:
    description:
      - The node lock (module_utils/gpunuma/node/lock.py; C(gpunuma_lock)). The step runs under an exclusive flock of
        the lease file, holding the run's lease (O(lock.token)) or, without a token, a lease of its own for the step
        only. Another run's live lease makes the step wait up to O(lock.timeout) seconds, then fail naming its holder,
        before anything is written. The first step of a run given its token takes the run's lease (or renews it).
        Not taken in check mode, which warns when another run holds the node.
    type: dict
    default: {}
    suboptions:
      path: {description: The lease file., type: path, default: /run/gpunuma/lock}
      token: {description: The run's token (C(gpunuma_lock)); none for a step of its own., type: str}
      timeout: {description: Seconds to wait for another run., type: int, default: 300}
      ttl: {description: Seconds after which an unrenewed lease is stale., type: int, default: 3600}
      holder:
        description: Who takes the lease, for the message a waiting run prints.
        type: dict
        default: {}
        suboptions:
          controller: {description: The controller's host name., type: str}
          user: {description: The user running the playbook., type: str}
          playbook: {description: The playbook., type: str}
      break_lock:
        description: Take the lease over even from a live holder (its run must be gone), with a warning naming it.
        type: bool
        default: false
"""
