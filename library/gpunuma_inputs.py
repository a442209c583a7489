#!/usr/bin/python
# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Check the inputs of gpunuma's roles on the controller (the action does the work; this file documents it)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpunuma_inputs
short_description: "Internal (the roles' input step): check the inputs of gpunuma's roles on the controller"
description:
  - An action that runs on the controller alone (action_plugins/gpunuma_inputs.py) and never contacts the host.
  - For each role of O(roles), the variables of its main entry point (its C(meta/argument_specs.yml)) are
    templated and checked by the role's own rule - the argument spec's types and choices, then what a spec cannot
    express (a size that must parse, a profile that must be a file, a host name that names controller files) -
    each problem naming the variable the user set (C(gpunuma_profile), not C(numa_binding_profile)) and what is
    allowed.
  - A role whose inputs are good adds what it needs of the node to the run's node read
    (C(gpunuma_node_read_requests); docs/roles.md, "One node read").
  - "Fails, with one line a role (C(host: problem; problem)), when any role has a problem; RV(input_problems)
    holds them by role. site.yml checks every role of the run in this one step; each role's own input check is
    this step with its role alone."
  - With O(on_problem=return) the step does not fail but returns those lines in RV(problems), for a play that
    collects every check's problems and stops once with all of them (playbooks/preflight.yml) - each problem is
    then printed once, by that stop.
options:
  roles:
    description: The roles whose inputs are checked, in this order.
    type: list
    elements: str
    choices: [memlock, autonuma, gpu_topology, numa_binding, gpunuma_state, policy_gate]
    required: true
  on_problem:
    description: Fail the step (C(fail)), or return the problems in RV(problems) and succeed (C(return)).
    type: str
    choices: [fail, return]
    default: fail
  playbook:
    description:
      - Also check the variables the playbook itself reads (its entry point of C(playbooks/vars/argument_specs.yml),
        such as C(gpunuma_lock_ttl) of C(site)) that the inventory or the command line sets, by the same rules - so
        C(gpunuma_lock_ttl=1h) is named instead of read as 0.
    type: str
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpunuma_attributes
author: gpunuma maintainers (@gpunuma)
"""

EXAMPLES = r"""
- name: Check the inputs of every role of the run
  gpunuma.fleet.gpunuma_inputs:
    roles: [memlock, autonuma, gpu_topology, numa_binding, gpunuma_state, policy_gate]
"""

RETURN = r"""
input_problems:
  description: The problems of each role (the fact each role's playbooks read, by name).
  returned: when a role has a problem
  type: dict
problems:
  description: "One line a role with problems (C(host: problem; problem)); empty when there is none."
  returned: with O(on_problem=return)
  type: list
  elements: str
ansible_facts:
  description: Each role's problems (empty lists) and C(gpunuma_node_read_requests) with the roles' reads added.
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(
        argument_spec=dict(
            roles=dict(type="list", elements="str", required=True,
                       choices=["memlock", "autonuma", "gpu_topology", "numa_binding", "gpunuma_state", "policy_gate"]),
            on_problem=dict(type="str", choices=["fail", "return"], default="fail"),
            playbook=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    module.fail_json(msg="gpunuma_inputs runs on the controller as an action (action_plugins/gpunuma_inputs.py); "
                         "it has nothing to do on a node")


if __name__ == "__main__":
    main()
