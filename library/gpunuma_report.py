#!/usr/bin/python
# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Render the self-contained HTML fleet report from directories of gpunuma artefacts."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpunuma_report
short_description: Render the HTML fleet report from gpunuma's JSON artefacts
description:
  - Searches each directory of O(src) (recursively) for gpunuma's JSON artefacts, recognised by their C(schema)
    (topology, plan, state, audit, validation), and writes one HTML page to O(dest) - a fleet table, each node's
    drift and rollback history, and per host the topology picture with each instance's CPUs, memory nodes and GPUs.
    The page needs no network and runs no script; every text taken from an artefact is escaped.
  - Meant for the controller, where the playbooks keep their artefacts (C(playbooks/report.yml) runs it on
    localhost). An artefact with a known schema but a shape gpunuma does not write is listed as a problem of its
    host, never a failure; a missing directory, one without any artefact, a host of O(hosts) with none, or a path
    holding a control character (a newline) fails, naming the field, before anything is written.
  - The page is written atomically and only when its text changes; check mode writes nothing and reports whether
    it would.
options:
  src:
    description: Directories holding the artefacts (searched recursively), such as the playbooks' topology, audit
      and validation directories.
    type: list
    elements: path
    required: true
  dest:
    description: Where the page goes.
    type: path
    required: true
  hosts:
    description: Only these hosts (all hosts with artefacts when empty).
    type: list
    elements: str
    default: []
  title:
    description: The page's title.
    type: str
    default: gpunuma fleet report
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpunuma_attributes
author: gpunuma maintainers (@gpunuma)
"""

EXAMPLES = r"""
- name: Render the fleet report from the playbooks' artefacts
  gpunuma.fleet.gpunuma_report:
    src:
      - "{{ playbook_dir }}/../topology"
      - "{{ playbook_dir }}/../audit"
    dest: "{{ playbook_dir }}/../fleet-report.html"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
dest:
  description: The page's path.
  returned: always
  type: str
hosts:
  description: One summary per host shown - C(host), C(profile), C(fingerprint), C(instances) (null without a
    plan), C(compliance), C(probe) (the validation's verdict) and C(problems) (artefacts of a shape gpunuma does not
    write).
  returned: always
  type: list
  elements: dict
lines:
  description: The same summaries as one line of text each, for the play's output.
  returned: always
  type: list
  elements: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpunuma.common import atomic
from ansible.module_utils.gpunuma.common.bounded import read_bounded
from ansible.module_utils.gpunuma.common.text import control_problem, shown
from ansible.module_utils.gpunuma.report.base import ReportError
from ansible.module_utils.gpunuma.report.page import build_report, host_summary, summary_line


def main():
    module = AnsibleModule(argument_spec=dict(
        src=dict(type="list", elements="path", required=True),
        dest=dict(type="path", required=True),
        hosts=dict(type="list", elements="str", default=[]),
        title=dict(type="str", default="gpunuma fleet report"),
    ), supports_check_mode=True)
    p = module.params
    if not p["src"]:
        module.fail_json(msg="src: no directory given; allowed: one or more directories holding gpunuma artefacts")
    # A path with a newline (a YAML block scalar's) names another file than the one meant: refused, not written.
    named = [("src[%d]" % i, path) for i, path in enumerate(p["src"])] + [("dest", p["dest"])]
    problems = ["%s: %s %s" % (field, shown(path), control_problem(path)) for field, path in named
                if control_problem(path)]
    if problems:
        module.fail_json(msg="; ".join(problems))
    try:
        page, fleet = build_report(p["src"], p["title"], p["hosts"] or None)
    except ReportError as exc:
        module.fail_json(msg="src: %s" % exc)
    names = [h for h in sorted(fleet["hosts"]) if not p["hosts"] or h in p["hosts"]]
    summaries = [host_summary(fleet["hosts"][name]) for name in names]
    width = max(len(name) for name in names)
    result = {"dest": os.path.abspath(p["dest"]), "hosts": summaries, "lines": [summary_line(s, width) for s in summaries]}
    data = page.encode("utf-8")
    try:
        # The page as it stands, read only as a regular file no larger than the new one (a link, a FIFO or a
        # bigger file is written anew: write_atomic replaces it, never follows it).
        changed = read_bounded(p["dest"], limit=len(data), what="the report page") != data
    except OSError:  # missing, larger, or not a regular file: written anew
        changed = True
    if changed and not module.check_mode:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(p["dest"])), exist_ok=True)
            atomic.write_atomic(p["dest"], data, 0o644)
        except OSError as exc:
            module.fail_json(msg="dest: cannot write %s: %s" % (p["dest"], exc.strerror or exc), **result)
    module.exit_json(changed=changed, **result)


if __name__ == "__main__":
    main()
