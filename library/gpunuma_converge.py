#!/usr/bin/python
# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Whether a node is still what the last provisioning run left (the converge record)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpunuma_converge
short_description: "Internal (site.yml's first and last step): check a node against its converge record, or record it"
description:
  - The node side of the C(gpunuma_converge) action (action_plugins/gpunuma_converge.py), which computes the
    inputs' digests on the controller and passes the run's reads and writes; call the action, not this module alone.
  - O(state=checked) reads the record (O(path)), compares O(inputs) with it, reads the node again with the
    recorded reads and compares what they answer, the files gpunuma wrote, the paths it removed and the services
    it started (module_utils/gpunuma/run/converge.py). Never changes anything.
  - O(state=recorded) reads the node with O(reads), digests what O(writes) own and writes the record atomically,
    mode 0600, unless something keeps the node from being converged (a service not active, a stale unit, a
    pending restart), then no record is left. O(state=absent) removes the record. In check mode nothing is written.
  - The record is gpunuma's bookkeeping, not the node's configuration; writing or removing it is never reported as
    a change (a run that changed nothing else stays C(changed=0)).
options:
  state:
    description: C(checked), C(recorded) or C(absent).
    type: str
    choices: [checked, recorded, absent]
    default: checked
  path:
    description: The record.
    type: path
    default: /var/lib/gpunuma/converged.json
  inputs:
    description: The digest of each input of the run (C(name) -> C(sha256:...)).
    type: dict
    default: {}
  reads:
    description: O(state=recorded) the run's reads of the node, each C(module) (gpunuma_node_info, gpu_topology_info,
      gpunuma_state) and C(args) (the module's validated arguments).
    type: list
    elements: dict
    default: []
  writes:
    description: O(state=recorded) what the run's gpunuma_apply calls own (C(files), C(absent), C(services),
      C(prune), C(pending)), no content.
    type: list
    elements: dict
    default: []
  facts:
    description: O(state=recorded) the facts a run that ends at the check sets (the applied plan, the profile).
    type: dict
    default: {}
  lock_path:
    description: O(state=checked) the node lock; a lease another run holds makes the node not converged (that run
      may be changing it), so the whole provisioning runs and waits for the lease as usual.
    type: path
    default: /run/gpunuma/lock
  seal:
    description:
      - O(state=checked) the digest of the record this controller asked the node to keep (its inputs, reads, owned
        paths, facts and controller file states; the controller keeps it beside its copy of the host's plan).
      - A record whose seal differs, or a check without one, is ignored before anything of it is read again or
        returned.
    type: str
  controller:
    description: O(state=recorded) digests of the controller's copies (path -> file state); returned by the check
      for the action to compare.
    type: dict
    default: {}
  release_lock:
    description:
      - O(state=recorded) or O(state=absent) - the run's node lease (C(path), C(token)) to give back once the record
        is written or removed (the run's last step on the node, so the lock's own release step is not needed). Not in
        check mode. The result's RV(lock_released) says whether it was given back.
    type: dict
    suboptions:
      path: {description: The lease file., type: path, default: /run/gpunuma/lock}
      token: {description: The run's token., type: str, required: true}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpunuma_attributes
author: gpunuma maintainers (@gpunuma)
"""

EXAMPLES = r"""
- name: Is the node as the last converge left it?
  gpunuma.fleet.gpunuma_converge:
    state: checked
  register: converge
"""

RETURN = r"""
converged:
  description: O(state=checked) true when nothing the run decides from moved.
  returned: always
  type: bool
reasons:
  description: Why the node is not converged (or, O(state=recorded), why no record was left).
  returned: always
  type: list
  elements: str
facts:
  description: O(state=checked) the recorded facts, when converged.
  returned: when converged
  type: dict
controller:
  description: O(state=checked) the recorded controller file states.
  returned: when converged
  type: dict
recorded:
  description: O(state=recorded) whether a record was written (or is already the same).
  returned: always
  type: bool
lock_released:
  description: O(state=recorded) or O(state=absent) - whether O(release_lock) gave the run's node lease back.
  returned: state is recorded or absent
  type: bool
"""

import base64
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpunuma.node.probe import read_file
from ansible.module_utils.gpunuma.run import converge
from ansible.module_utils.gpunuma.node import lock as locklib
from ansible.module_utils.gpunuma.run.converge_node import RECORD_OPTIONS, recorded, view_now


def checked(module):
    p = module.params
    lease = locklib.peek(p["lock_path"])
    if lease is not None:
        return {"converged": False, "reasons": ["another gpunuma run holds the node lock (%s)"
                                                % locklib.describe(lease, time.time())]}
    entry = read_file(p["path"])
    if not entry.get("exists"):
        return {"converged": False, "reasons": ["no converge record on the node (%s)" % p["path"]]}
    if "content" not in entry:
        return {"converged": False, "reasons": [entry.get("problem")]}
    try:
        record = converge.load_record(base64.b64decode(entry["content"]).decode("utf-8", "replace"), p["path"])
    except converge.ConvergeError as exc:
        return {"converged": False, "reasons": [str(exc)]}
    try:
        sealed = p["seal"] is not None and converge.record_seal(record) == p["seal"]
    except converge.ConvergeError as exc:
        return {"converged": False, "reasons": ["%s: %s" % (p["path"], exc)]}
    if not sealed:
        # Nothing of a record this controller did not ask for is read again, run or returned.
        return {"converged": False, "reasons": ["%s is not the record this controller asked the node to keep (its "
                                                "seal differs): ignored" % p["path"]]}
    names = converge.changed_inputs(record["inputs"], p["inputs"])
    if names:
        shown = ", ".join(names[:8]) + (" and %d more" % (len(names) - 8) if len(names) > 8 else "")
        return {"converged": False, "reasons": ["inputs changed since the last converge: %s" % shown]}
    try:
        view, problems = view_now(module, record["reads"], record["owned"])
    except converge.ConvergeError as exc:
        return {"converged": False, "reasons": ["%s: %s" % (p["path"], exc)]}
    reasons = converge.compare(record, view, problems)
    out = {"converged": not reasons, "reasons": reasons}
    if not reasons:
        out.update(facts=record["facts"], controller=record["controller"])
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            RECORD_OPTIONS,
            state=dict(type="str", choices=["checked", "recorded", "absent"], default="checked"),
            lock_path=dict(type="path", default=locklib.DEFAULT_PATH),
            seal=dict(type="str"),
            release_lock=dict(type="dict", options=dict(
                path=dict(type="path", default=locklib.DEFAULT_PATH),
                token=dict(type="str", required=True, no_log=True),
            )),
        ),
        supports_check_mode=True,
    )
    if module.params["state"] == "checked":
        module.exit_json(changed=False, **checked(module))
    out = recorded(module, module.params)
    module.exit_json(changed=False, lock_released=release(module), **out)


def release(module):
    """Give the run's node lease back (O(release_lock)) after the record, the run's last step on the node; whether
    it was given back. Nothing in check mode (which takes none); a failure leaves it to the run's own release step."""
    spec = module.params["release_lock"]
    if not spec or module.check_mode:
        return False
    return locklib.release_quietly(spec["path"], spec["token"])


if __name__ == "__main__":
    main()
