#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# gpunuma: apply the opted-in safe fixes planned by node_checks_info.
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: node_checks_fix
short_description: Apply the safe fixes node_checks_info planned (CPU governor, GPU persistence mode)
description:
  - Takes C(node_checks.planned_fixes) of M(gpunuma.fleet.node_checks_info) and applies only two kinds of fix, both per device
    and both lost at reboot, never anything node-wide.
  - C(governor) writes C(performance) to one CPU's C(cpufreq/scaling_governor) (the path must end so, without C(..)).
  - C(persistence) runs C(nvidia-smi -i <bus id> -pm 1).
  - Each fix re-reads the current value first (governor), so a second run changes nothing; check mode
    predicts C(changed) and returns the diff without writing or running anything.
version_added: "0.2.0"
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpunuma_attributes.diff
author: gpunuma maintainers (@gpunuma)
options:
  fixes:
    description: The planned fixes (C(kind), C(target), C(before), C(after)).
    type: list
    elements: dict
    required: true
  nvidia_smi_path:
    description: Path to C(nvidia-smi); looked up on C(PATH) when a persistence fix is planned.
    type: path
"""

EXAMPLES = r"""
- name: Apply the opted-in fixes
  gpunuma.fleet.node_checks_fix:
    fixes: "{{ checks.node_checks.planned_fixes }}"
"""

RETURN = r"""
applied:
  description: The fixes that changed (or, in check mode, would change) something.
  returned: always
  type: list
  elements: dict
"""

import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpunuma.common import commands
from ansible.module_utils.gpunuma.common.bounded import read_bounded

_BUS_RE = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", re.ASCII)
_KINDS = ("governor", "persistence")


def _problems(fixes):
    problems = []
    for i, fix in enumerate(fixes):
        kind, target = fix.get("kind"), fix.get("target")
        if kind not in _KINDS:
            problems.append("fixes[%d].kind is %r; allowed: %s" % (i, kind, ", ".join(_KINDS)))
        elif kind == "governor" and (not isinstance(target, str) or not target.endswith("/cpufreq/scaling_governor")
                                     or ".." in target.split("/")):
            problems.append("fixes[%d].target is %r; a path ending in /cpufreq/scaling_governor without '..' "
                            "is allowed" % (i, target))
        elif kind == "persistence" and (not isinstance(target, str) or not _BUS_RE.fullmatch(target)):
            problems.append("fixes[%d].target is %r; a PCI bus id such as 0000:18:00.0 is allowed" % (i, target))
    return problems


def main():
    module = AnsibleModule(
        argument_spec=dict(fixes=dict(type="list", elements="dict", required=True),
                           nvidia_smi_path=dict(type="path")),
        supports_check_mode=True,
    )
    fixes = module.params["fixes"]
    problems = _problems(fixes)
    if problems:
        module.fail_json(msg="node_checks_fix: " + "; ".join(problems))
    smi = None
    if any(f["kind"] == "persistence" for f in fixes):
        smi = module.params["nvidia_smi_path"] or module.get_bin_path("nvidia-smi", required=True)
    applied, before, after = [], [], []
    for fix in fixes:
        if fix["kind"] == "governor":
            try:
                current = read_bounded(fix["target"]).decode("ascii", "replace").strip()
            except (IOError, OSError) as exc:
                module.fail_json(msg="%s cannot be read: %s" % (fix["target"], exc.strerror or exc), applied=applied)
            if current == "performance":
                continue
            if not module.check_mode:
                try:
                    with open(fix["target"], "w") as handle:
                        handle.write("performance\n")
                except (IOError, OSError) as exc:
                    module.fail_json(msg="%s: writing 'performance' failed: %s (is the governor available? "
                                     "see scaling_available_governors)" % (fix["target"], exc.strerror or exc),
                                     applied=applied)
            before.append("%s: %s" % (fix["target"], current))
            after.append("%s: performance" % fix["target"])
            applied.append(dict(fix, before=current))
        else:
            if not module.check_mode:
                rc, out, err = commands.runner(module)([smi, "-i", fix["target"], "-pm", "1"])
                if rc != 0:
                    module.fail_json(msg="nvidia-smi -i %s -pm 1 failed (rc %s): %s"
                                     % (fix["target"], rc, (err or out).strip()[-500:]), applied=applied)
            before.append("gpu %s persistence mode: %s" % (fix["target"], fix.get("before", "Disabled")))
            after.append("gpu %s persistence mode: Enabled" % fix["target"])
            applied.append(fix)
    diff = {"before": "\n".join(before) + ("\n" if before else ""),
            "after": "\n".join(after) + ("\n" if after else ""),
            "before_header": "node settings", "after_header": "node settings"}
    module.exit_json(changed=bool(applied), applied=applied, diff=diff)


if __name__ == "__main__":
    main()
