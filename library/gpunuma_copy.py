#!/usr/bin/python
# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Write whole files atomically, as gpunuma_apply writes a node's files, with nothing else of apply."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpunuma_copy
short_description: Write whole files atomically, keeping a backup of a replaced one
description:
  - Each file of O(files) gets the whole O(files[].content) and O(files[].mode), written the way
    M(gpunuma.fleet.gpunuma_apply) writes a node's files (module_utils/gpunuma/node/apply/fs.py) - a temporary file
    in the same directory, flushed, then renamed over the target, the replaced file kept as C(<path>.<pid>.<time>~)
    when O(files[].backup) is set, missing parent directories created. A file that already holds the content and
    mode is left alone. A link (or anything but a regular file) at a target is refused, naming it, before any file
    is written - move it aside.
  - Nothing of gpunuma_apply's node work - no lock, no units, no journal of the run's writes. The roles delegate it
    to localhost for the controller's copies (the topology inventory, the applied plan); there it runs in the
    action's own process (action_plugins/gpu_binding_plan.py), so a fleet does not start a Python per host.
  - Check mode changes nothing and reports what would change; C(--diff) shows each changed file's text.
options:
  files:
    description: The files to write; every request is checked before any file is written.
    type: list
    elements: dict
    required: true
    suboptions:
      path: {description: Absolute path., type: str, required: true}
      content: {description: The whole text of the file., type: str, required: true}
      mode: {description: Octal mode., type: str, default: "0644"}
      backup: {description: Keep a backup of a replaced file., type: bool, default: false}
      dir_mode: {description: Mode of a parent directory this creates., type: str, default: "0755"}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpunuma_attributes.DIFF
author: gpunuma maintainers (@gpunuma)
"""

EXAMPLES = r"""
- name: Keep the applied plan on the controller
  gpunuma.fleet.gpunuma_copy:
    files:
      - path: "{{ playbook_dir }}/../topology/{{ inventory_hostname }}.plan.json"
        content: "{{ gpunuma_plan | to_nice_json }}\n"
  delegate_to: localhost
"""

RETURN = r"""
files:
  description: Per file - C(path), C(changed), and the C(backup) written (null when none).
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpunuma.node.apply.files import (
    ApplyError, file_diff, normalise_files, os_error_text, plan_files, quiet_state_diff)
from ansible.module_utils.gpunuma.node.apply.fs import NodeFiles

MODULE_SPEC = dict(
    argument_spec=dict(
        files=dict(type="list", elements="dict", required=True, options=dict(
            path=dict(type="str", required=True),
            content=dict(type="str", required=True),
            mode=dict(type="str", default="0644"),
            backup=dict(type="bool", default=False),
            dir_mode=dict(type="str", default="0755"),
        )),
    ),
    supports_check_mode=True,
)


def run(module):
    """The module's body: AnsibleModule anywhere, or the controller's in-process module (action_plugins/gpu_binding_plan.py)."""
    fs = NodeFiles()
    try:
        decisions = plan_files(normalise_files(module.params["files"]), fs)
    except ApplyError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=os_error_text(exc))
    result = {"changed": any(d["changed"] for d in decisions), "files": []}
    if getattr(module, "_diff", False):
        result["diff"] = [file_diff(d["path"], d["before"], d["data"]) for d in decisions if d["changed"]]
        if getattr(module, "_verbosity", 0) < 1:
            result["diff"] = [quiet_state_diff(d) for d in result["diff"]]
    for d in decisions:
        entry = {"path": d["path"], "changed": d["changed"], "backup": None}
        result["files"].append(entry)
        if d["changed"] and not module.check_mode:
            try:
                entry["backup"] = fs.write(d)
            except OSError as exc:
                # What was written stays (each file is whole); this one and those after it are not.
                entry["changed"] = False
                result["changed"] = any(e["changed"] for e in result["files"])
                if not exc.filename:
                    exc.filename = d["path"]
                module.fail_json(msg=os_error_text(exc), **result)
    module.exit_json(**result)


def main():
    run(AnsibleModule(**MODULE_SPEC))


if __name__ == "__main__":
    main()
