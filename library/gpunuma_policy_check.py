#!/usr/bin/python
# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Evaluate gpunuma's policy rules (policies/rules/) for one host, with its waivers."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpunuma_policy_check
short_description: Evaluate gpunuma's policy rules on a host's topology, plan and settings (and live audit)
description:
  - Reads every rule file of O(rules_dir) (docs/policies.md) and evaluates it on the host's topology, binding plan
    and inventory settings, or on a C(gpunuma.audit/v1) report (O(live)).
  - Waivers (O(waivers), the inventory's C(gpunuma_policy_waivers)) apply to a control id on named hosts or groups
    until their expiry date; an expired waiver no longer applies and is reported in C(expired_waivers).
  - "Fails (with O(fail_on_violation)) when a rule of severity C(error) fails without a valid waiver; the message
    names the host, the rule, why it fails and how to waive it. Never changes anything. Run it on the controller
    (C(delegate_to: localhost)): rules are controller files and every input is a variable."
options:
  host: {description: The inventory name., type: str, required: true}
  groups: {description: The host's groups (for group waivers)., type: list, elements: str, default: []}
  rules_dir: {description: The rule files., type: path, required: true}
  topology: {description: The host's gpunuma.topology/v1 document., type: dict, default: {}}
  plan: {description: The host's gpunuma.plan/v1 document., type: dict, default: {}}
  settings:
    description:
      - Inventory settings the rules read - memlock_limit, memlock_users, memlock_unlimited_services,
        numa_balancing, kubelet (enabled, topology_manager_policy, max_allowable_numa_nodes). A unit's
        LimitMEMLOCK is the plan's (each instance's limit_memlock).
    type: dict
    default: {}
  live: {description: A gpunuma.audit/v1 report; rules then also check the live state., type: dict}
  waivers: {description: The inventory's gpunuma_policy_waivers., type: list, elements: raw, default: []}
  today: {description: The date expiries are compared with (YYYY-MM-DD; default today on the controller)., type: str}
  fail_on_violation: {description: Fail when an error rule fails without a valid waiver., type: bool, default: true}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpunuma_attributes
author: gpunuma maintainers (@gpunuma)
"""

EXAMPLES = r"""
- name: Gate the change on the policies
  gpunuma.fleet.gpunuma_policy_check:
    host: "{{ inventory_hostname }}"
    groups: "{{ group_names }}"
    rules_dir: "{{ playbook_dir }}/../policies/rules"
    topology: "{{ gpu_topology }}"
    plan: "{{ gpunuma_plan }}"
    waivers: "{{ gpunuma_policy_waivers | default([]) }}"
  delegate_to: localhost
"""

RETURN = r"""
policy:
  description: The evaluation.
  returned: always
  type: dict
  contains:
    results: {description: "Per rule: id, title, severity, status (pass, fail, waived, not_applicable), violations, waiver, source, file.", type: list}
    violations: {description: Messages of the error rules that fail without a waiver., type: list}
    warnings: {description: Messages of the warning rules that fail without a waiver., type: list}
    expired_waivers: {description: Waivers that would have applied but expired., type: list}
"""

import datetime

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpunuma.gate import policy
from ansible.module_utils.gpunuma.gate import checks as policy_checks


MODULE_SPEC = dict(
    argument_spec=dict(
        host=dict(type="str", required=True),
        groups=dict(type="list", elements="str", default=[]),
        rules_dir=dict(type="path", required=True),
        topology=dict(type="dict", default={}),
        plan=dict(type="dict", default={}),
        settings=dict(type="dict", default={}),
        live=dict(type="dict"),
        waivers=dict(type="list", elements="raw", default=[]),
        today=dict(type="str"),
        fail_on_violation=dict(type="bool", default=True),
    ),
    supports_check_mode=True,
)


def run(module):
    """The module's body: AnsibleModule on a node, or the controller's in-process module (action_plugins/gpu_binding_plan.py)."""
    p = module.params
    try:
        import yaml
    except ImportError:
        module.fail_json(msg="gpunuma_policy_check needs PyYAML where it runs; run it on the controller (delegate_to: localhost)")
    today = datetime.date.today()
    if p["today"]:
        today = policy._as_date(p["today"])
        if today is None:
            module.fail_json(msg="today: %r is not a date; allowed: YYYY-MM-DD" % p["today"])
    try:
        rules = policy.load_rules(p["rules_dir"], yaml.safe_load)
        waivers = policy.validate_waivers(p["waivers"], set(r["id"] for r in rules))
        p["settings"]["kubelet"] = policy_checks.validate_kubelet(p["settings"].get("kubelet"))
    except policy_checks.PolicyError as exc:
        module.fail_json(msg="%s: the policies cannot be used:\n%s" % (p["host"], exc), problems=exc.problems)
    ctx = policy.Context(p["host"], p["topology"], p["plan"], p["settings"], p["live"])
    results, expired = policy.evaluate(rules, ctx, waivers, p["groups"], today)
    violations = [policy.violation_message(p["host"], r) for r in results if r["status"] == "fail" and r["severity"] == "error"]
    warned = [policy.violation_message(p["host"], r) for r in results if r["status"] == "fail" and r["severity"] == "warning"]
    notes = ["%s: waiver of %s (owner %s) expired on %s and no longer applies" % (p["host"], w["control"], w["owner"], w["expires"])
             for w in expired]
    out = {"results": results, "violations": violations, "warnings": warned, "expired_waivers": expired}
    if violations and p["fail_on_violation"]:
        module.fail_json(msg="\n".join(violations + notes), policy=out)
    for warning in warned + notes:
        module.warn(warning)
    module.exit_json(changed=False, policy=out)


def main():
    run(AnsibleModule(**MODULE_SPEC))


if __name__ == "__main__":
    main()
