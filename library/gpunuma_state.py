#!/usr/bin/python
# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Read or record the node's profile state (/etc/gpunuma/state.json)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpunuma_state
short_description: Read or record a node's gpunuma profile and its history
description:
  - Reads C(/etc/gpunuma/state.json) (schema C(gpunuma.state/v1), docs/state-v1.md) and the applied plan
    C(/etc/gpunuma/plan.json) in one round trip, or records a switch of profile.
  - The file is written atomically (temporary file in the same directory, then rename). The history keeps the
    newest O(history_limit) switches, each with time (UTC), from, to, action, reason and the controller user.
  - A state file that is not a valid v1 document is never overwritten silently; O(state=record) keeps it as
    C(<path>.corrupt-<UTC time>), warns naming both files, and starts a new history. A file written by a newer
    gpunuma (schema C(gpunuma.state/v2) or later) is an error in both modes and is left as it is.
options:
  state:
    description: C(read) reports the state (never changes anything); C(record) records a switch.
    type: str
    choices: [read, record]
    default: read
  path:
    description: The state file.
    type: path
    default: /etc/gpunuma/state.json
  plan_path:
    description: The applied plan; its C(profile) is the node's profile when no state file exists yet.
    type: path
    default: /etc/gpunuma/plan.json
  hostname:
    description: The inventory name written into the file.
    type: str
    required: true
  profile:
    description: O(state=record) the profile the node now runs.
    type: str
  action:
    description:
      - O(state=record) what moved the node. C(site) follows the inventory (the node is not pinned, and nothing is
        recorded when the profile did not change); C(profile), C(down) and C(previous) pin the node to its new
        profile; C(release) unpins it.
    type: str
    choices: [profile, down, previous, release, site]
    default: site
  reason:
    description: O(state=record) why (at most 500 characters).
    type: str
  user:
    description: O(state=record) who ran the switch on the controller.
    type: str
  history_limit:
    description: How many switches the history keeps (the oldest are dropped).
    type: int
    default: 50
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpunuma_attributes.diff
  # O(lock): a switch is recorded (read, changed, written) under it; it is not taken to read.
  - gpunuma_lock
author: gpunuma maintainers (@gpunuma)
"""

EXAMPLES = r"""
- name: Read the node's profile state
  gpunuma.fleet.gpunuma_state:
    hostname: "{{ inventory_hostname }}"
  register: state

- name: Record a rollback
  gpunuma.fleet.gpunuma_state:
    state: record
    hostname: "{{ inventory_hostname }}"
    profile: preferred
    action: down
    reason: P99 spike after strict binding
    user: "{{ lookup('ansible.builtin.env', 'USER') }}"
"""

RETURN = r"""
gpunuma_state:
  description: What the node holds.
  returned: always
  type: dict
  contains:
    state: {description: "The state document (after recording), or null when there is none or it is corrupt.", type: dict}
    exists: {description: The state file exists., type: bool}
    corrupt: {description: "Why the state file cannot be read (it is corrupt), or null.", type: str}
    backup: {description: "Where a corrupt file was kept (record only), or null.", type: str}
    applied_profile: {description: "The profile of the applied plan (its rung, a C(cpu-only) variant removed), or null.", type: str}
    current_profile: {description: "The state's profile, else the applied plan's, else null (never provisioned).", type: str}
    provisioned: {description: The node has a state file or an applied plan., type: bool}
    pinned: {description: The node's profile is its own (a rollback put it there) and wins over the inventory., type: bool}
"""

import contextlib
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpunuma.common import atomic, node_paths
from ansible.module_utils.gpunuma.node import lock as locklib
from ansible.module_utils.gpunuma.plan import state as statelib


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["read", "record"], default="read"),
            path=dict(type="path", default=statelib.DEFAULT_PATH),
            plan_path=dict(type="path", default=node_paths.PLAN),
            hostname=dict(type="str", required=True),
            profile=dict(type="str"),
            action=dict(type="str", choices=list(statelib.ACTIONS), default="site"),
            reason=dict(type="str"),
            user=dict(type="str"),
            history_limit=dict(type="int", default=statelib.DEFAULT_HISTORY_LIMIT),
            lock=dict(type="dict", default={}, options=locklib.module_options()),
        ),
        required_if=[("state", "record", ["profile"])],
        supports_check_mode=True,
    )
    guard = locklib.for_module(module) if module.params["state"] == "record" else contextlib.nullcontext()
    try:
        with guard:
            _run(module)
    except locklib.LockError as exc:
        module.fail_json(msg=str(exc), changed=False)


def _run(module):
    p = module.params
    path = p["path"]
    text = statelib.read_text(path)
    try:
        result, corrupt = statelib.read_summary(text, statelib.read_text(p["plan_path"]), path)
    except statelib.StateError as exc:
        module.fail_json(msg=str(exc))
    applied = result["applied_profile"]
    warnings = [statelib.corrupt_warning(path, corrupt, p["state"] == "record")] if corrupt else []
    if p["state"] == "read":
        for warning in warnings:
            module.warn(warning)
        module.exit_json(changed=False, gpunuma_state=result)

    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        new, changed, corrupt = statelib.next_state(text, path, applied, p["hostname"], p["profile"], p["action"],
                                                    p["reason"], p["user"], now, p["history_limit"])
    except statelib.StateError as exc:
        module.fail_json(msg=str(exc))
    diff = {"before": text if isinstance(text, str) else "", "after": statelib.dump_state(new)}
    if changed and not module.check_mode:
        directory = os.path.dirname(path) or "."
        try:
            if not os.path.isdir(directory):
                os.makedirs(directory, 0o755)
            if corrupt and text is not None:
                backup = statelib.corrupt_backup_path(path, now)
                os.rename(path, backup)
                result["backup"] = backup
                warnings[-1] = "%s is corrupt (%s); kept as %s, a new history starts" % (path, corrupt, backup)
            atomic.write_atomic(path, statelib.dump_state(new), 0o644, prefix=".state.json.")
        except OSError as exc:
            module.fail_json(msg="%s: cannot be written: %s" % (path, exc))
    result.update(state=new, current_profile=new["profile"], provisioned=True, pinned=new["pinned"])
    for warning in warnings:
        module.warn(warning)
    module.exit_json(changed=changed, gpunuma_state=result, diff=diff)


if __name__ == "__main__":
    main()
