#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# gpunuma: compute the kubelet's NUMA topology settings and merge them into its config.
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: kubelet_topology_plan
short_description: Merge NUMA-aligned CPU, Memory and Topology Manager settings into a KubeletConfiguration
description:
  - Turns a C(gpunuma.topology/v1) document, the node's binding profile and that profile's kubelet
    preset (C(policies/kubelet/<profile>.yml)) into the kubelet settings that place a pod's CPUs,
    memory and GPU on one NUMA node, and merges them into the node's existing KubeletConfiguration.
  - "Owned keys: C(cpuManagerPolicy), C(cpuManagerPolicyOptions), C(topologyManagerPolicy),
    C(topologyManagerScope), C(topologyManagerPolicyOptions), C(memoryManagerPolicy), C(reservedMemory),
    C(reservedSystemCPUs); and C(kubeReserved), C(systemReserved), C(evictionHard) only when given in
    O(overrides) with O(manage_reservations=true). Every other key is kept, with its comments and order
    (YAML through ruamel.yaml's round-trip mode; JSON with its key order and indentation)."
  - C(reservedSystemCPUs) under the C(static) CPU policy are the binding planner's housekeeping cores
    (the same code as M(gpunuma.fleet.gpu_binding_plan)); C(reservedMemory) under the C(Static) Memory Manager is
    computed so that its sum per resource equals kube-reserved + system-reserved + the hard eviction
    threshold; C(max-allowable-numa-nodes) is set exactly when the node has more than 8 NUMA nodes.
  - Every input is checked against the kubelet's documented rules first; all problems are reported at
    once, each naming the field, the value and what is allowed.
  - Pure computation; nothing on the node is read except O(topology_path), O(config_path), the
    checkpoint paths and the profile and preset files, and nothing is changed, so the module always
    returns C(changed=false) and runs the same in check mode. The C(kubelet_topology) role applies the
    result (drain, stop, back up, remove checkpoints, write, start, health check, roll back).
version_added: "0.1.0"
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpunuma_attributes
author: gpunuma maintainers (@gpunuma)
requirements:
  - ruamel.yaml (for a YAML config; a JSON config needs only the standard library)
options:
  topology:
    description:
      - The node's topology, a C(gpunuma.topology/v1) mapping. Exactly one of O(topology) and O(topology_path).
    type: dict
  topology_path:
    description: A JSON file holding the topology (for example C(/etc/gpunuma/topology.json)).
    type: path
  profile:
    description:
      - Name of the binding profile (C(strict), C(preferred), C(interleave), C(off)); names the kubelet preset
        and is read from O(profiles_dir)/<name>.yml when O(profile_data) is not given.
    type: str
  profile_data:
    description: The binding profile itself (the content of C(policies/profiles/<name>.yml)).
    type: dict
  profiles_dir:
    description: Directory of binding profile files, used with O(profile) when O(profile_data) is not given.
    type: path
    default: /etc/gpunuma/profiles
  preset:
    description:
      - The kubelet preset of the profile (the content of C(policies/kubelet/<profile>.yml)); read from
        O(presets_dir)/<profile>.yml when not given.
    type: dict
  presets_dir:
    description: Directory of kubelet preset files, used when O(preset) is not given.
    type: path
    default: /etc/gpunuma/kubelet
  housekeeping_cores_per_node:
    description:
      - Whole cores kept per CPU-bearing NUMA node for the system and the kubelet, exactly as
        M(gpunuma.fleet.gpu_binding_plan) takes it (C(auto), the default, or an integer 0 or more). Under the
        C(static) CPU policy they become C(reservedSystemCPUs).
    type: raw
    default: auto
  housekeeping_cpus:
    description:
      - An explicit housekeeping CPU list instead of O(housekeeping_cores_per_node), exactly as
        M(gpunuma.fleet.gpu_binding_plan) takes it (C(0-1,96-97)); whole cores are kept.
    type: str
  binding_plan:
    description:
      - The node's binding plan (the C(gpunuma.plan/v1) of M(gpunuma.fleet.gpu_binding_plan), for the same
        topology). When given, its C(housekeeping) CPUs are C(reservedSystemCPUs) as the planner decided them (the
        CPUs C(irq_pin) keeps for device interrupts included); O(housekeeping_cores_per_node) and
        O(housekeeping_cpus) are then only checked.
    type: dict
  config:
    description:
      - The current KubeletConfiguration as text (YAML or JSON). Exactly one of O(config) and O(config_path).
    type: str
  config_path:
    description: The current KubeletConfiguration file.
    type: path
  host:
    description:
      - The inventory name a failure is reported under; every problem is listed, one per line, after the words
        "the kubelet settings cannot be planned; nothing was changed".
    type: str
  guard_settings:
    description:
      - The paths, service and tolerance the Memory Manager checkpoint check's script and kubelet drop-in are written
        with (the kubelet_topology role's variables of the same names), checked here with O(state_dir) so that a value
        the drop-in cannot carry fails the plan, before anything changes; each problem names the role variable.
    type: dict
    suboptions:
      python: {description: kubelet_topology_python., type: raw}
      libexec_dir: {description: kubelet_topology_libexec_dir., type: raw}
      unit_dir: {description: kubelet_topology_unit_dir., type: raw}
      service: {description: kubelet_topology_service., type: raw}
      backup_dir: {description: kubelet_topology_backup_dir., type: raw}
      tolerance_mib: {description: kubelet_topology_memory_drift_tolerance_mib., type: raw}
  kubelet_version:
    description:
      - The node's kubelet version (C("1.31"), C(v1.31.2)); policy options that need a later version or an
        alpha feature gate are refused. Unset, those checks are skipped with a warning.
    type: str
  overrides:
    description:
      - "Per-key values that replace the preset's, for owned keys (see the description), for example
        C({cpuManagerPolicyOptions: {full-pcpus-only: \"true\"}}) or C({topologyManagerPolicy: restricted})."
      - C(kubeReserved), C(systemReserved) and C(evictionHard) are accepted only with O(manage_reservations).
    type: dict
    default: {}
  memory_spread:
    description:
      - Where C(reservedMemory) puts each resource's reservation under the C(Static) Memory Manager.
      - C(first_node) puts all of it on the lowest CPU-bearing NUMA node (node 0 usually);
        C(cpu_nodes) splits it evenly over the CPU-bearing nodes (the remainder on the first).
    type: str
    choices: [first_node, cpu_nodes]
    default: first_node
  pod_gpu_counts:
    description:
      - The GPUs per pod of the workloads the node's pool runs (e.g. C([1, 2, 4])). Under the
        C(single-numa-node) Topology Manager policy, more than one count gets a warning - mixed sizes
        fragment the NUMA nodes and larger pods are rejected at admission.
    type: list
    elements: int
    default: []
  dra:
    description:
      - How GPUs (and CPUs) reach pods. C(off) - device plugins, aligned by the Topology Manager.
      - C(gpu) - GPUs through Dynamic Resource Allocation; the preset stays and a warning says that the
        Topology Manager does not align DRA devices (a ResourceClaim's C(matchAttribute) does).
      - C(gpu_and_cpu) - the CPU DRA driver assigns CPUs too - C(cpuManagerPolicy) none (the driver's
        requirement), C(memoryManagerPolicy) None, no CPU Manager options, the housekeeping CPUs kept in
        C(reservedSystemCPUs) for the driver's C(--reserved-cpus); a stale CPU or memory checkpoint is removed as
        on any change to none.
    type: str
    choices: ["off", gpu, gpu_and_cpu]
    default: "off"
  manage_reservations:
    description:
      - Allow O(overrides) to write C(kubeReserved), C(systemReserved) and C(evictionHard). An
        C(evictionHard) written where the config had none also gets the kubelet's other defaults, since the
        key replaces them as a whole.
    type: bool
    default: false
  state_dir:
    description: The kubelet's root directory, holding C(cpu_manager_state) and C(memory_manager_state).
    type: path
    default: /var/lib/kubelet
  cpu_manager_state:
    description:
      - Text of the C(cpu_manager_state) checkpoint, when the caller read it; otherwise it is read from
        O(state_dir) when present.
    type: str
  memory_manager_state:
    description: Text of the C(memory_manager_state) checkpoint; as O(cpu_manager_state).
    type: str
  dra_manager_state:
    description:
      - Text of the C(dra_manager_state) checkpoint (the DRA manager's prepared claims); as O(cpu_manager_state).
        It is read and reported (RV(dra_checkpoint)), never planned away.
    type: str
  read_checkpoints:
    description:
      - Read a checkpoint file from O(state_dir) when its text option is not given. Set false when the
        module runs somewhere else than the node (the role runs it on the controller and passes the
        texts it read from the node; an omitted text then means the file does not exist).
    type: bool
    default: true
notes:
  - No kubelet is run. The rules are the kubelet's documented ones; docs/kubelet.md cites each source.
seealso:
  - module: gpunuma.fleet.gpu_binding_plan
  - name: Kubernetes CPU management policies
    description: The CPU Manager policies and options this module sets.
    link: https://kubernetes.io/docs/tasks/administer-cluster/cpu-management-policies/
  - name: Kubernetes Memory Manager
    description: The Memory Manager and its reservedMemory rule.
    link: https://kubernetes.io/docs/tasks/administer-cluster/memory-manager/
  - name: Kubernetes Topology Manager
    description: The Topology Manager policies and scopes.
    link: https://kubernetes.io/docs/tasks/administer-cluster/topology-manager/
"""

EXAMPLES = r"""
- name: Plan the kubelet settings of a strict node from files on the node
  gpunuma.fleet.kubelet_topology_plan:
    topology_path: /etc/gpunuma/topology.json
    profile: strict
    config_path: /var/lib/kubelet/config.yaml
    kubelet_version: "1.31"
  register: kubelet_plan

- name: Plan on the controller from text read off the node, spreading reservedMemory over the sockets
  gpunuma.fleet.kubelet_topology_plan:
    topology: "{{ gpu_topology }}"
    profile_data: "{{ lookup('ansible.builtin.file', 'policies/profiles/strict.yml') | from_yaml }}"
    preset: "{{ lookup('ansible.builtin.file', 'policies/kubelet/strict.yml') | from_yaml }}"
    config: "{{ kubelet_config_file.content | b64decode }}"
    kubelet_version: "1.33"
    memory_spread: cpu_nodes
    overrides:
      cpuManagerPolicyOptions:
        full-pcpus-only: "true"
      topologyManagerPolicy: restricted
  delegate_to: localhost
"""

RETURN = r"""
config:
  description: The merged KubeletConfiguration as a mapping.
  returned: success
  type: dict
config_text:
  description: The merged config as it is to be written, in the input's format; the input text itself when nothing changes.
  returned: success
  type: str
config_format:
  description: C(yaml) or C(json).
  returned: success
  type: str
changes:
  description: One C({key, old, new}) per owned key whose value changes (C(old) null when absent; C(new) null when removed).
  returned: success
  type: list
  elements: dict
remove_checkpoints:
  description: The checkpoint files the kubelet would refuse to restore under the new config; remove them while it is stopped.
  returned: success
  type: list
  elements: str
transition_needed:
  description: True when the config changes or a checkpoint must go; false means the node is left alone.
  returned: success
  type: bool
settings:
  description: The owned settings as computed (null for a key that is absent from the merged config).
  returned: success
  type: dict
numa_node_count:
  description: NUMA nodes of the host as the kubelet counts them (CPU-less memory nodes included).
  returned: success
  type: int
reserved_cpus:
  description: C(reservedSystemCPUs) as written, or null.
  returned: success
  type: str
dra_mode:
  description: The DRA mode planned for (O(dra)).
  returned: success
  type: str
memory_checkpoint_guard:
  description:
    - True when the merged config runs the C(Static) Memory Manager without the C(MemoryManagerDriftTolerance)
      feature gate (KEP-6232); the role then has the kubelet unit check C(memory_manager_state) before each start.
  returned: success
  type: bool
dra_checkpoint:
  description: C({path, claims, drivers, problem}) of C(dra_manager_state), or null when there is none.
  returned: success
  type: dict
warnings:
  description: Warnings (also emitted as Ansible warnings).
  returned: success
  type: list
  elements: str
problems:
  description: Every problem found, one per item, when the module fails on bad input.
  returned: failure
  type: list
  elements: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpunuma.common import node_paths
from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.plan.inputs import count_or_word
from ansible.module_utils.gpunuma.kubelet import guard
from ansible.module_utils.gpunuma.kubelet.change import CHECKPOINTS
from ansible.module_utils.gpunuma.kubelet.dra import DRA_MODES
from ansible.module_utils.gpunuma.kubelet.plan import plan_kubelet
from ansible.module_utils.gpunuma.plan.profiles import module_options, module_profile, parse_profile_text


def _read(module, path, what):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (IOError, OSError, UnicodeDecodeError) as exc:
        module.fail_json(msg="%s: %s cannot be read: %s" % (what, path, exc))


def _checkpoints(module, params):
    """The kubelet's CPU, Memory and DRA Manager checkpoints (each option is named as its file): given as options,
    else read from state_dir."""
    states = {}
    for name in CHECKPOINTS:
        states[name] = params[name]
        path = os.path.join(params["state_dir"], name)
        if states[name] is None and params["read_checkpoints"] and os.path.exists(path):
            states[name] = _read(module, path, name)
    return states


ARGUMENT_SPEC = dict(
    module_options(),
    preset=dict(type="dict"),
    presets_dir=dict(type="path", default=node_paths.KUBELET_PRESETS_DIR),
    housekeeping_cores_per_node=dict(type="raw", default="auto"),
    housekeeping_cpus=dict(type="str"),
    binding_plan=dict(type="dict"),
    config=dict(type="str"),
    config_path=dict(type="path"),
    host=dict(type="str"),
    guard_settings=dict(type="dict", options=dict(
        (name, dict(type="raw")) for name in ("python", "libexec_dir", "unit_dir", "service", "backup_dir",
                                              "tolerance_mib"))),
    kubelet_version=dict(type="str"),
    overrides=dict(type="dict", default={}),
    memory_spread=dict(type="str", choices=["first_node", "cpu_nodes"], default="first_node"),
    pod_gpu_counts=dict(type="list", elements="int", default=[]),
    manage_reservations=dict(type="bool", default=False),
    state_dir=dict(type="path", default="/var/lib/kubelet"),
    cpu_manager_state=dict(type="str"),
    memory_manager_state=dict(type="str"),
    dra_manager_state=dict(type="str"),
    dra=dict(type="str", choices=list(DRA_MODES), default="off"),
    read_checkpoints=dict(type="bool", default=True),
)


MODULE_SPEC = dict(
    argument_spec=ARGUMENT_SPEC,
    mutually_exclusive=[("topology", "topology_path"), ("config", "config_path")],
    required_one_of=[("topology", "topology_path"), ("profile", "profile_data"), ("config", "config_path")],
    supports_check_mode=True,
)


def _fail(module, problems, msg):
    """Fail with every problem; under the host's name (O(host)), each on a line of its own."""
    if module.params["host"]:
        msg = "%s: the kubelet settings cannot be planned; nothing was changed:\n%s" % (
            module.params["host"], "\n".join(problems))
    module.fail_json(msg=msg, problems=problems)


def run(module):
    """The module's body: AnsibleModule on a node, or the controller's in-process module
    (action_plugins/gpu_binding_plan.py)."""
    params = module.params
    topology = params["topology"]
    if topology is None:
        try:
            topology = json.loads(_read(module, params["topology_path"], "topology_path"))
        except ValueError as exc:
            module.fail_json(msg="topology_path: %s is not JSON: %s" % (params["topology_path"], exc))
    config_source = "config"
    config = params["config"]
    if config is None:
        config_source = "config_path %s" % params["config_path"]
        config = _read(module, params["config_path"], "config_path")

    states = _checkpoints(module, params)
    settings = params["guard_settings"]
    guard_problems = [] if settings is None else guard.input_problems(
        settings["python"], settings["libexec_dir"], settings["unit_dir"], settings["service"], params["state_dir"],
        settings["backup_dir"], settings["tolerance_mib"])
    try:
        profile = module_profile(params["profile"], params["profile_data"], params["profiles_dir"])
        preset = params["preset"]
        if preset is None:
            preset_path = os.path.join(params["presets_dir"], "%s.yml" % profile.get("name"))
            preset = parse_profile_text(_read(module, preset_path, "presets_dir"), preset_path)
        result = plan_kubelet(
            topology,
            profile,
            preset,
            config,
            kubelet_version=params["kubelet_version"],
            housekeeping_cores_per_node=count_or_word(params["housekeeping_cores_per_node"]),
            housekeeping_cpus_list=params["housekeeping_cpus"],
            binding_plan=params["binding_plan"],
            overrides=params["overrides"],
            memory_spread=params["memory_spread"],
            pod_gpu_counts=params["pod_gpu_counts"],
            manage_reservations=params["manage_reservations"],
            cpu_state=states["cpu_manager_state"],
            memory_state=states["memory_manager_state"],
            state_dir=params["state_dir"],
            config_source=config_source,
            dra=params["dra"],
            dra_state=states["dra_manager_state"],
        )
    except GpunumaError as exc:
        _fail(module, list(getattr(exc, "problems", [str(exc)])) + guard_problems, str(exc))
    if guard_problems:
        _fail(module, guard_problems, "\n".join(guard_problems))

    for warning in result.warnings:
        module.warn(warning)
    module.exit_json(changed=False, **result.as_dict())


def main():
    run(AnsibleModule(**MODULE_SPEC))


if __name__ == "__main__":
    main()
