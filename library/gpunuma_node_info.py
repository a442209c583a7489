#!/usr/bin/python
# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Read what gpunuma's roles need from a node, in one round trip."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpunuma_node_info
short_description: "Internal (the roles' one node read): read a node's gpunuma files, units and settings at once"
description:
  - One module run instead of a chain of slurp, stat, find and command tasks (module_utils/gpunuma/node/probe.py).
    Only the sections asked for are read. Never changes anything; runs in check mode.
  - Files are read bounded (regular files only, at most 16 MiB) and returned base64-encoded, as slurp returns them.
options:
  files:
    description: Files to read, as a mapping of a name to a path; returns C(files.<name>) with C(exists), and
      C(content) (base64) or C(problem).
    type: dict
  paths:
    description: Paths whose existence is reported (C(paths.<path>) true or false).
    type: list
    elements: str
  globs:
    description: Shell patterns, as a mapping of a name to a pattern; returns C(globs.<name>), the sorted paths that
      match (any file type, at most 4096).
    type: dict
  units:
    description: Units whose LoadState, ActiveState, UnitFileState and MainPID are read with one systemctl call.
    type: list
    elements: str
  inspect_units:
    description:
      - Units that drop-ins would bind; returns C(inspect.<unit>) with C(container_launchers) (a C(docker run),
        C(podman run), C(nerdctl run)... in its ExecStart=, whose binding would apply to the CLI, not the workload)
        and C(cuda_visible_devices) (lines of its EnvironmentFile= or Environment= that set CUDA_VISIBLE_DEVICES).
    type: list
    elements: str
  commands:
    description: Read-only probes to run, as a mapping of a name to an argv; returns rc (null when the program is
      missing), stdout, stderr.
    type: dict
  pid1_proc_dir:
    description: Read this process directory's limits, status and uid_map (the memlock ceiling systemd applies).
    type: str
  autonuma:
    description: Read kernel.numa_balancing's live value, the kernel release, whether the node is a container,
      and the sysctl and tuned files that set it.
    type: dict
    suboptions:
      proc_path: {description: The live value's procfs file., type: str, default: /proc/sys/kernel/numa_balancing}
      container_markers:
        description: Files that mark a container; empty (the default) is the list the audit uses too
          (gpunuma.node.autonuma.CONTAINER_MARKERS). C(systemd-detect-virt --container) is asked as well.
        type: list
        elements: str
        default: []
      sysctl_dirs: {description: sysctl.d directories., type: list, elements: str, default: []}
      sysctl_conf: {description: The sysctl.conf file., type: str, default: /etc/sysctl.conf}
      tuned_dirs: {description: tuned profile directories., type: list, elements: str, default: []}
  programs:
    description:
      - Programs instances run, each with the account it runs as; returns C(programs.<path>) with C(exists),
        C(regular), C(executable.<user>) (every directory searchable and the file executable by that account) and,
        for programs run as root, C(other_writers) (why an account other than root could replace it, or null)
        (module_utils/gpunuma/node/programs.py).
    type: list
    elements: dict
    suboptions:
      path: {description: Absolute path of the program., type: str, required: true}
      user: {description: The account the program runs as., type: str, default: gpunuma}
  accounts:
    description: Which user accounts (with the groups they are a member of) and groups exist on the node; numeric
      ids count as existing.
    type: dict
    suboptions:
      users: {description: User names., type: list, elements: str, default: []}
      groups: {description: Group names., type: list, elements: str, default: []}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpunuma_attributes
author: gpunuma maintainers (@gpunuma)
"""

EXAMPLES = r"""
- name: Read the applied plan and the units' states
  gpunuma.fleet.gpunuma_node_info:
    files:
      plan: /etc/gpunuma/plan.json
    units: [gpunuma-llm0.service]
  register: node
"""

RETURN = r"""
gpunuma_node:
  description: The sections asked for (files, paths, globs, units, commands, pid1, autonuma, accounts, programs).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpunuma.node.probe import NODE_INFO_OPTIONS, command_problem, probe_with


def main():
    module = AnsibleModule(argument_spec=dict(NODE_INFO_OPTIONS), supports_check_mode=True)
    p = module.params
    problem = command_problem(p)
    if problem:
        module.fail_json(msg=problem)

    result = probe_with(module, p)
    module.exit_json(changed=False, gpunuma_node=result)


if __name__ == "__main__":
    main()
