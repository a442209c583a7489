#!/usr/bin/python
# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Take or give back the node lock, so one gpunuma run changes a node at a time."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpunuma_lock
short_description: Take or give back a node's gpunuma lock
description:
  - One gpunuma run changes a node at a time. A run takes a lease on the node (a JSON record under C(/run/gpunuma),
    naming its controller, user and playbook, with a token only that run knows) before its first change and gives it
    back after its last (module_utils/gpunuma/node/lock.py). C(gpunuma_apply) and C(gpunuma_state) take the same
    lease under an exclusive flock for each change, with the run's token or, used alone, their own.
  - A second run waits up to O(timeout) seconds, then fails naming the holder. A lease older than O(ttl) seconds
    (its run died with its controller) is taken over, and the result says so; O(break_lock) takes it over at once.
  - In check mode nothing is taken; the result names a current holder, if any.
options:
  state:
    description: C(acquired) takes (or renews) the lease for O(token); C(released) gives it back if O(token) holds it.
    type: str
    choices: [acquired, released]
    default: acquired
  path:
    description: The lease file. Under C(/run), so a reboot clears it.
    type: path
    default: /run/gpunuma/lock
  token:
    description: The run's secret; the same for every step of one run on one node.
    type: str
    required: true
  timeout:
    description: Seconds to wait for another run's lease before failing.
    type: int
    default: 300
  ttl:
    description: Seconds after which an unrenewed lease is stale and may be taken over.
    type: int
    default: 3600
  break_lock:
    description: Take the lease over even from a live holder (the holder's run must be gone; the result names it).
    type: bool
    default: false
  holder:
    description: Who takes the lease, for the message a waiting run prints.
    type: dict
    default: {}
    suboptions:
      controller: {description: The controller's host name., type: str}
      user: {description: The user running the playbook., type: str}
      playbook: {description: The playbook., type: str}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpunuma_attributes
author: gpunuma maintainers (@gpunuma)
"""

EXAMPLES = r"""
- name: Take the node lock for this run
  gpunuma.fleet.gpunuma_lock:
    token: "{{ run_token }}"
    holder: {controller: ctl-01, user: oncall, playbook: site.yml}
    timeout: 300
"""

RETURN = r"""
acquired:
  description: True when this call took the lease (false when the token held it already, or on release).
  returned: always
  type: bool
released:
  description: True when this call gave the lease back.
  returned: state is released
  type: bool
previous:
  description: The stale or broken lease this call took over (its holder, when it was taken and when it expired).
  returned: when one was taken over
  type: dict
holder:
  description: The current holder in check mode, when another run holds the node.
  returned: check mode
  type: dict
waited_s:
  description: Seconds spent waiting for another run.
  returned: state is acquired
  type: float
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpunuma.node import lock as locklib


def main():
    module = AnsibleModule(
        # The lock option of gpunuma_apply and gpunuma_state, at the top level, with a required token.
        argument_spec=dict(
            locklib.module_options(),
            state=dict(type="str", choices=["acquired", "released"], default="acquired"),
            token=dict(type="str", required=True, no_log=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    problem = locklib.times_problem(p["timeout"], p["ttl"])
    if problem:
        module.fail_json(msg=problem)
    if not p["token"].strip() or any(ord(c) < 32 for c in p["token"]):
        module.fail_json(msg="token: must be a non-empty word without control characters")
    if module.check_mode:
        lease = locklib.peek(p["path"])
        held = lease is not None and lease["token"] != p["token"]
        module.exit_json(changed=False, acquired=False, holder=lease.get("holder") if held else None)
    try:
        if p["state"] == "released":
            module.exit_json(changed=False, acquired=False, released=locklib.release(p["path"], p["token"]))
        info = locklib.acquire(p["path"], p["token"], dict(p["holder"] or {}), p["timeout"], p["ttl"],
                               break_lock=p["break_lock"])
    except locklib.LockError as exc:
        module.fail_json(msg=str(exc))
    if info["previous"] is not None:
        module.warn(locklib.took_over(info["previous"], p["break_lock"], time.time()))
    # Taking the lease changes nothing the user manages: not reported as a change.
    module.exit_json(changed=False, **info)


if __name__ == "__main__":
    main()
