#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# gpunuma: compute the per-instance CPU / memory-node binding plan.
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_binding_plan
short_description: Decide which CPUs and NUMA memory nodes each inference instance gets
description:
  - Turns a C(gpunuma.topology/v1) document (from M(gpunuma.fleet.gpu_topology_info)), a binding profile
    (a rung of the rollback ladder C(strict) -> C(preferred) -> C(interleave) -> C(off)) and the
    inventory's instance list (C(gpunuma_instances)) into a C(gpunuma.plan/v1) document.
  - Each instance gets the CPU-bearing NUMA node(s) of its GPUs, a share of that node's worker
    CPUs (whole cores with their hyperthread siblings, never the housekeeping cores), a memory
    policy, the exact C(numactl) arguments or systemd C(CPUAffinity=)/C(NUMAPolicy=)/C(NUMAMask=)
    directives, and C(CUDA_VISIBLE_DEVICES) naming its GPUs by UUID.
  - Pure computation; nothing on the node is read except O(topology_path) and the profile file,
    and nothing is changed, so the module always returns C(changed=false) and runs the same in
    check mode.
  - "Every problem in the input is reported at once, one per line, each naming the variable path,
    the problem and what is allowed, for example
    C(gpunuma_instances[2].gpus[0]: GPU 9 does not exist on gpu-a01; allowed: 0-7)."
version_added: "0.1.0"
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpunuma_attributes
author: gpunuma maintainers (@gpunuma)
options:
  topology:
    description:
      - The node's topology, a C(gpunuma.topology/v1) mapping (what M(gpunuma.fleet.gpu_topology_info) returns as C(topology)).
      - Exactly one of O(topology) and O(topology_path) is required.
    type: dict
  topology_path:
    description: A JSON file holding the topology (for example C(/etc/gpunuma/topology.json)).
    type: path
  profile:
    description:
      - Name of the binding profile, read from O(profiles_dir)/<name>.yml.
      - With O(profile_data) it must equal that profile's C(name).
    type: str
  profile_data:
    description:
      - The profile itself (the content of C(policies/profiles/<name>.yml)), for runs where the
        profile files live on the controller, not on the node. The role loads the file on the
        controller and passes it here.
    type: dict
  profiles_dir:
    description:
      - Directory of profile files on the node running the module, used with O(profile) when
        O(profile_data) is not given.
    type: path
    default: /etc/gpunuma/profiles
  instances:
    description:
      - The instances to plan (the inventory's C(gpunuma_instances)); see docs/plan-v1.md for every key.
      - Each has C(name) and exactly one of C(gpus) (list of indexes), C(gpus_per_instance) (count;
        the planner groups GPUs of one NUMA node with the best links) or C(numa_node) (a CPU-only
        service such as a tokenizer).
      - C(command) (list of strings) is required unless C(unit) names an existing unit to bind via a
        drop-in. Optional C(user), C(group), C(environment),
        C(secret_environment) (names of C(environment) whose values are secret), C(memory) (bytes or C(32G)), C(cpus)
        (a count, or a CPU list string), C(share_cpus), C(binding_method) (C(numactl) or C(systemd)),
        C(memlock), C(nic_environment) (a list of C(UCX_NET_DEVICES), C(NCCL_IB_HCA) to set to the
        instance's nearest NICs), C(engine) (C(generic), C(vllm), C(sglang) or C(trtllm)) and
        C(engine_version) (the engine's release), which decide what the engine's own worker binding is handed (per-GPU
        CPU sub-shares, its NUMA flags appended to the command, its variables; docs/plan-v1.md, section Engines).
      - An empty list gives a plan with no instances.
    type: list
    elements: dict
    default: []
  housekeeping_cores_per_node:
    description:
      - Whole cores (with their hyperthread siblings) kept per CPU-bearing node for the system,
        kubelet and network threads, carved out by the L3-aware partitioner (one L3 domain where they fit, else
        the lowest-numbered cores); never given to a worker.
      - C(auto) (the default) follows the node, ceil(cores / 24) and at least 1 per node; on a
        machine whose CPU-bearing nodes are not all GPU nodes (AMD NPS2/NPS4, Intel SNC) the
        housekeeping cores go on the GPU-less nodes and the GPU nodes keep every core for workers.
      - An integer keeps that many cores on every CPU-bearing node.
    type: raw
    default: auto
  housekeeping_cpus:
    description:
      - An explicit CPU list kept for housekeeping instead of O(housekeeping_cores_per_node), as the
        kubelet's C(reservedSystemCPUs) and Slurm's C(CpuSpecList) take it, for example C(0-1,96-97).
      - A list that covers part of a core keeps the whole core (a warning says so).
    type: str
  strict_capacity:
    description:
      - What to do when an instance under a C(bind) memory policy declares more C(memory) than its
        node holds for instances (MemTotal minus O(memory_reserve_per_node) minus the memory of the
        instances bound there before it), or declares no C(memory) at all (no capacity check is
        possible, and a full node then means OOM kills, not spill).
      - C(fallback) plans it as C(preferred) and says why in its C(fallback) field; C(error) fails.
    type: str
    choices: [fallback, error]
    default: fallback
  memory_reserve_per_node:
    description:
      - Memory kept back on every NUMA node for the kernel and system daemons when checking declared
        C(memory) under C(bind), either C(auto) or a size such as C(16G).
      - "C(auto) follows GKE's reservation tiers for the machine (25% of the first 4 GiB, 20% of the next 4,
        10% of the next 8, 6% of the next 112, 2% above 128 GiB; 255 MiB below 1 GiB) and spreads them over the
        nodes by size; a size is kept on every node."
      - "Free memory (MemFree) is never used: it counts page cache as used and moves at run time."
    type: raw
    default: auto
  secret_patterns:
    description:
      - Shell globs (any case) naming the C(environment) variables whose values are secret; an instance marks
        others with C(secret_environment). The plan keeps only their names, in each instance's
        C(secret_environment); the values never appear in it (module_utils/gpunuma/common/secrets.py).
    type: list
    elements: str
    default: ["*TOKEN*", "*PASSWORD*", "*PASSWD*", "*SECRET*", "*KEY*", "*CREDENTIAL*"]
  allow_unknown_siblings:
    description:
      - Whether a plan may bind CPUs on a NUMA node whose hyperthread siblings are unknown.
      - A topology without C(cores) (one built from C(nvidia-smi topo -m) alone) has them inferred
        when every node's CPU list is two equal ranges one offset apart (CPU N and N+T/2, the
        standard Linux x86 enumeration); the plan says so in C(siblings) and its warnings.
      - When they cannot be inferred, each CPU would be planned as a core, so two workers could share
        a physical core and a worker could get the sibling of a housekeeping CPU. With C(false) the
        module then fails naming the node; C(true) plans each CPU as a core, with a warning (for a
        dry run, or a node known to have SMT off).
    type: bool
    default: false
  fence:
    description:
      - Whether the instances' units get the cgroup fence (C(AllowedCPUs=)) on this node; the numa_binding role
        passes what O(fence) resolves to there (C(numa_binding_fence)).
      - Engines' own per-GPU binding flags (vLLM C(--numa-bind), SGLang C(--numa-node)) make them call C(numactl
        --cpunodebind), which widens to whole NUMA nodes; they are added only with C(true). Unset means not
        known, and no such flags are added (docs/plan-v1.md, Engines).
    type: bool
  irq_pin:
    description:
      - Whether the instances' GPU and NIC interrupts are pinned to housekeeping CPUs (the numa_binding role passes
        C(numa_binding_irq_pin)). With C(housekeeping_cores_per_node=auto), a node that would take more interrupt
        vectors (the topology's C(irq_vectors)) than its housekeeping CPUs hold (about 200 device vectors per x86
        CPU) keeps more cores, with a warning.
    type: bool
    default: false
  limit_memlock:
    description:
      - C(LimitMEMLOCK=) of the units whose instance sets no C(memlock) of its own (the numa_binding role passes
        C(numa_binding_limit_memlock), which is the memlock role's C(memlock_limit) unless set). C(infinity),
        C(unlimited), bytes, or a size such as C(64G). The plan gives every instance its C(limit_memlock), which
        the unit files, the policy gate and the dry run read.
    type: raw
    default: infinity
  pinned_headroom:
    description:
      - What an instance with a C(pinned) budget may lock beyond it, for buffers its libraries register (NCCL,
        UCX); its unit's C(LimitMEMLOCK=) is the budget plus this (the numa_binding role passes
        C(numa_binding_pinned_headroom)). A size; C(0) for none.
    type: raw
    default: 1G
  pinned_page_cache_percent:
    description:
      - The share of what each NUMA node holds for instances kept for page cache and other reclaimable memory; the
        instances' C(pinned) budgets on a node share the rest (C(numa_binding_pinned_page_cache_percent)). 0 to 90.
    type: int
    default: 10
  preferred_many:
    description:
      - Whether the node accepts C(numactl --preferred-many) (MPOL_PREFERRED_MANY, Linux 5.15+); the numa_binding
        role probes it. Used for a C(preferred) instance whose node's nearest other memory is a GPU's HBM
        (Grace), so its node and the other CPU nodes are preferred and a spill stays in CPU memory first. Unset
        means not known, and plain C(--preferred) is used with a warning saying where a spill goes.
    type: bool
  applied_plan:
    description:
      - The plan the node runs now (the content of C(/etc/gpunuma/plan.json)), if any. It is checked
        and otherwise changes nothing, since capacity comes from MemTotal, not from what the running
        instances use, so a running instance's own memory never pushes a re-plan from C(bind) to
        C(preferred).
      - A value that is not such a plan (not a mapping, another schema, C(instances) not a list, an
        instance whose C(mem_nodes), C(memory_bytes), C(mem_policy) or C(name) has the wrong type)
        fails the module with a message naming the field and how to recover (restore the file's
        backup, or remove it to plan from scratch); it is never ignored silently.
    type: raw
  node:
    description:
      - What M(gpunuma.fleet.gpunuma_node_info) read from the node (its C(gpunuma_node)) for the numa_binding role
        (module_utils/gpunuma/plan/node_plan.py). Given, the module plans for that node at once - its
        C(files.plan) is read as the applied plan (a damaged one stops the host naming it; O(applied_plan) must then
        not be given), C(commands.mempolicy) says whether the node allows memory policies, and C(units),
        C(inspect), C(programs) and C(accounts) are checked - and every problem fails the module, one per line.
      - Where the node refuses set_mempolicy and O(on_mempolicy_denied) is C(fallback), the plan is the same
        profile's CPU-only variant (memory policy default) with a warning.
    type: raw
  host:
    description: The inventory name the node's problems are reported under (with O(node)).
    type: str
  plan_path:
    description: The applied plan's path on the node, named in problems (with O(node)).
    type: str
    default: /etc/gpunuma/plan.json
  on_mempolicy_denied:
    description: With O(node) - C(fail) on a node that refuses set_mempolicy, or C(fallback) to a CPU-only plan.
    type: str
    choices: [fail, fallback]
    default: fail
  allow_dropin_hazards:
    description: With O(node) - allow drop-in instances whose unit launches a container or sets CUDA_VISIBLE_DEVICES itself.
    type: bool
    default: false
  start:
    description: With O(node) - whether the instances will be started (their programs and accounts are then checked).
    type: bool
    default: true
  create_user:
    description:
      - With O(node) and O(start) - the run creates the dedicated C(gpunuma) account where the node lacks it
        (C(numa_binding_create_user)), so only another missing account is a problem. An instance whose account the
        node lacks (C(node.accounts)) stops the host here, before anything is written on any host.
    type: bool
    default: false
  on_problem:
    description:
      - Fail on bad input (C(fail)), or succeed without a plan and return the problems in RV(problems)
        (C(return)) - for a play that collects every check's problems and stops once with all of them
        (playbooks/preflight.yml).
    type: str
    choices: [fail, return]
    default: fail
  mempolicy_argv:
    description: With O(node) - the memory policy probe that was run, named in its problem.
    type: list
    elements: str
    default: [numactl, --localalloc, "true"]
notes:
  - The plan is deterministic; the same inputs give the same plan, byte for byte.
  - Node memory sizes (MemTotal) decide C(strict_capacity) fallbacks; free memory never does, so page
    cache cannot change a plan. An unknown node size is a warning, not a fallback.
seealso:
  - module: gpunuma.fleet.gpu_topology_info
  - name: gpunuma plan contract
    description: Every field of C(gpunuma.plan/v1) and every planning rule.
    link: https://github.com/gpunuma/gpunuma/blob/main/docs/plan-v1.md
"""

EXAMPLES = r"""
- name: Discover the topology
  gpunuma.fleet.gpu_topology_info:
  register: topo

- name: Plan one vLLM worker per GPU under the strict profile
  gpunuma.fleet.gpu_binding_plan:
    topology: "{{ topo.topology }}"
    profile_data: "{{ lookup('ansible.builtin.file', 'policies/profiles/strict.yml') | from_yaml }}"
    instances:
      - name: llm0
        gpus: [0]
        command: [/opt/vllm/bin/vllm, serve, /models/llama, --port, "8000"]
        memory: 64G
      - name: llm1
        gpus: [1]
        command: [/opt/vllm/bin/vllm, serve, /models/llama, --port, "8001"]
        memory: 64G
  register: plan

- name: Tensor-parallel servers of four GPUs, plus a tokenizer on node 0
  gpunuma.fleet.gpu_binding_plan:
    topology_path: /etc/gpunuma/topology.json
    profile: preferred
    instances:
      - name: tp-a
        gpus_per_instance: 4
        command: [/opt/vllm/bin/vllm, serve, /models/big, --tensor-parallel-size, "4"]
      - name: tokenizer
        numa_node: 0
        cpus: 8
        command: [/opt/tok/bin/tokenizer-server]

- name: Bind an existing unit through a drop-in with systemd directives
  gpunuma.fleet.gpu_binding_plan:
    topology: "{{ topo.topology }}"
    profile: strict
    profiles_dir: /etc/gpunuma/profiles
    housekeeping_cores_per_node: 2
    strict_capacity: error
    instances:
      - name: triton
        unit: tritonserver.service
        gpus: [0, 1]
"""

RETURN = r"""
notices:
  description: With O(node) - lines to show (the CPU-only fallback's warning).
  returned: with O(node)
  type: list
  elements: str
applied_plan:
  description: With O(node) - the node's applied plan as read (null when it has none).
  returned: with O(node)
  type: dict
mempolicy:
  description: With O(node) - how the node answered the memory policy probe (not-probed, allowed, denied, no-numactl, error).
  returned: with O(node)
  type: str
plan:
  description: The binding plan (C(gpunuma.plan/v1)); docs/plan-v1.md describes every field.
  returned: success
  type: dict
  contains:
    schema:
      description: Always C(gpunuma.plan/v1).
      type: str
    hostname:
      description: The node, from the topology.
      type: str
    topology_fingerprint:
      description: The topology's C(fingerprint), so a plan can be matched to the hardware it was made for.
      type: str
    profile:
      description: Name of the profile the plan was computed under.
      type: str
    schema_minor:
      description: Minor version of C(gpunuma.plan/v1) (additive fields); 1 adds C(siblings), 3 C(engine_version)
        and C(options.fence).
      type: int
    options:
      description: C(housekeeping_cores_per_node), C(strict_capacity), C(allow_unknown_siblings), C(fence) and the
        memory reserve as used.
      type: dict
    memory_capacity:
      description: CPU-bearing node id (string) -> bytes it holds for bound instances (MemTotal minus the reserve), or null.
      type: dict
    siblings:
      description: >-
        CPU-bearing node id (string) -> where its hyperthread sibling groups come from: C(topology)
        (sysfs), C(inferred) (CPU N and N+T/2) or C(unknown) (each CPU planned as a core).
      type: dict
    housekeeping:
      description: CPU-bearing node id (string) -> canonical list of its housekeeping CPUs.
      type: dict
    worker_cpus:
      description: CPU-bearing node id (string) -> canonical list of the CPUs workers may get.
      type: dict
    instances:
      description: >-
        One entry per instance, in input order: C(name), C(unit), C(mode) (service or dropin),
        C(binding_method), C(gpus), C(gpu_uuids), C(numa_nodes), C(numa_bind_nodes), C(cpus),
        C(share_cpus), C(mem_policy), C(mem_nodes), C(profile), C(fallback), C(numactl_args),
        C(exec_prefix), C(systemd), C(environment) (without secret values), C(secret_environment), C(command), C(user), C(group), C(memory_bytes),
        C(memlock), C(nics), C(gpu_nics), C(engine), C(engine_args), C(worker_cpus), C(warnings).
      type: list
      elements: dict
    warnings:
      description: Plan-wide warnings, then each instance's warnings prefixed with its name.
      type: list
      elements: str
  sample:
    schema: gpunuma.plan/v1
    hostname: gpu-a01
    profile: strict
    housekeeping: {"0": "0,96", "1": "48,144"}
    instances:
      - name: llm0
        unit: gpunuma-llm0.service
        mode: service
        gpus: [0]
        numa_nodes: [0]
        cpus: "1-12,97-108"
        mem_policy: bind
        mem_nodes: [0]
        fallback: null
        numactl_args: ["--physcpubind=1-12,97-108", "--membind=0"]
        exec_prefix: [numactl, "--physcpubind=1-12,97-108", "--membind=0"]
        environment: {CUDA_VISIBLE_DEVICES: GPU-5c0c3f2a-1b7e-4f7e-9d0e-2a4f1c7b9e11}
problems:
  description: Every problem found in the input, one per item, when the module fails on bad input (or returns
    them, with O(on_problem=return); RV(plan) is then absent).
  returned: on bad input
  type: list
  elements: str
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpunuma.common import node_paths, secrets
from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.plan.inputs import count_or_word
from ansible.module_utils.gpunuma.plan.planner import build_plan
from ansible.module_utils.gpunuma.plan import node_plan
from ansible.module_utils.gpunuma.plan.profiles import module_options, module_profile


def _load_topology(module, path):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (IOError, OSError, ValueError) as exc:
        module.fail_json(msg="topology_path: %s cannot be read as JSON: %s" % (path, exc))


ARGUMENT_SPEC = dict(
    module_options(),
    instances=dict(type="list", elements="dict", default=[]),
    housekeeping_cores_per_node=dict(type="raw", default="auto"),
    housekeeping_cpus=dict(type="str"),
    strict_capacity=dict(type="str", choices=["fallback", "error"], default="fallback"),
    # raw: the planner checks it and names the bad field (Ansible's
    # dict conversion would only say "dictionary requested").
    applied_plan=dict(type="raw"),
    allow_unknown_siblings=dict(type="bool", default=False),
    fence=dict(type="bool"),
    preferred_many=dict(type="bool"),
    irq_pin=dict(type="bool", default=False),
    limit_memlock=dict(type="raw", default="infinity"),
    pinned_headroom=dict(type="raw", default="1G"),
    pinned_page_cache_percent=dict(type="int", default=10),
    memory_reserve_per_node=dict(type="raw", default="auto"),
    # Name patterns of secret variables, not secrets.
    secret_patterns=dict(type="list", elements="str", default=list(secrets.DEFAULT_PATTERNS), no_log=False),
    node=dict(type="raw"),
    host=dict(type="str"),
    plan_path=dict(type="str", default=node_paths.PLAN),
    on_mempolicy_denied=dict(type="str", choices=["fail", "fallback"], default="fail"),
    allow_dropin_hazards=dict(type="bool", default=False),
    start=dict(type="bool", default=True),
    create_user=dict(type="bool", default=False),
    on_problem=dict(type="str", choices=["fail", "return"], default="fail"),
    mempolicy_argv=dict(type="list", elements="str", default=["numactl", "--localalloc", "true"]),
)


MODULE_SPEC = dict(
    argument_spec=ARGUMENT_SPEC,
    mutually_exclusive=[("topology", "topology_path"), ("node", "applied_plan")],
    required_one_of=[("topology", "topology_path"), ("profile", "profile_data")],
    supports_check_mode=True,
)


def run(module):
    """The module's body: AnsibleModule on a node, or the controller's in-process module (action_plugins/gpu_binding_plan.py)."""
    params = module.params
    topology = params["topology"]
    if topology is None:
        topology = _load_topology(module, params["topology_path"])

    try:
        profile = module_profile(params["profile"], params["profile_data"], params["profiles_dir"])
        options = dict(
            housekeeping_cores_per_node=count_or_word(params["housekeeping_cores_per_node"]),
            strict_capacity=params["strict_capacity"],
            allow_unknown_siblings=params["allow_unknown_siblings"],
            memory_reserve_per_node=params["memory_reserve_per_node"],
            housekeeping_cpus=params["housekeeping_cpus"],
            secret_patterns=params["secret_patterns"],
            fence=params["fence"],
            preferred_many=params["preferred_many"],
            irq_pin=params["irq_pin"],
            limit_memlock=params["limit_memlock"],
            pinned_headroom=params["pinned_headroom"],
            pinned_page_cache_percent=params["pinned_page_cache_percent"],
        )
        if params["node"] is not None:
            _plan_for_node(module, topology, profile, options)
        plan = build_plan(topology, profile, params["instances"], applied_plan=params["applied_plan"], **options)
    except GpunumaError as exc:
        _problems(module, str(exc), list(getattr(exc, "problems", [str(exc)])))

    for warning in plan["warnings"]:
        module.warn(warning)
    module.exit_json(changed=False, plan=plan)


def main():
    run(AnsibleModule(**MODULE_SPEC))


def _problems(module, msg, problems, **extra):
    """Fail with the problems, or (O(on_problem=return)) return them with no plan; ends the module either way."""
    if module.params.get("on_problem") == "return":
        module.exit_json(changed=False, msg=msg, problems=problems, **extra)
    module.fail_json(msg=msg, problems=problems, **extra)


def _plan_for_node(module, topology, profile, options):
    """The numa_binding role's step: plan for the node O(node) describes, every problem at once."""
    params = module.params
    node = params["node"] if isinstance(params["node"], dict) else {}
    host = params["host"] or topology.get("hostname") or "this node"
    options.update(on_mempolicy_denied=params["on_mempolicy_denied"],
                   allow_dropin_hazards=params["allow_dropin_hazards"], start=params["start"],
                   create_user=params["create_user"])
    out = node_plan.plan_for_node(topology, profile, params["instances"], node, host, params["plan_path"], options,
                                  params["mempolicy_argv"])
    if out["plan"] is None:
        _problems(module, "\n".join(out["problems"]), out["problems"], mempolicy=out["mempolicy"])
    # Shown once, with the host: Ansible prints a module's warnings without the host they are about.
    for warning in out["plan"]["warnings"]:
        module.warn("%s: %s" % (host, warning))
    module.exit_json(changed=False, plan=out["plan"], notices=out["notices"], mempolicy=out["mempolicy"],
                     applied_plan=out["applied"])


if __name__ == "__main__":
    main()
