#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# gpunuma: read-only platform checks of a GPU node.
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: node_checks_info
short_description: Report platform settings that slow a GPU node down, with evidence and a fix
description:
  - Reads the node once and reports findings per host and per GPU, each with a C(severity)
    (C(info), C(warning), C(error)), the C(evidence) (file and value read) and a C(fix).
  - "Checks: PCIe link generation and width of each NVIDIA GPU and of each bridge above it (sysfs
    C(current_link_*) against C(max_link_*), and NVML where present); ACS control bits of those bridges
    (from their PCI config space, readable by root only) and the kernel command line's
    C(iommu=), C(intel_iommu=), C(amd_iommu=); the cpufreq governor of the CPUs local to the GPUs;
    GPU persistence mode (NVML, or a saved C(nvidia-smi -q)); transparent hugepages C(enabled) and
    C(defrag); C(kernel.numa_balancing) against the binding profile."
  - A link generation below the maximum is C(info) by default, because NVIDIA GPUs lower it when idle;
    set O(pcie_expect_full_speed) when the GPUs are busy to make it a C(warning). A width below the maximum
    is always a C(warning).
  - Changes nothing, ever; the opt-in fixes are planned here (RV(node_checks.planned_fixes)) and applied
    by C(node_checks_fix).
  - A file that exists but is unreadable or holds a value outside its grammar becomes a C(warning) finding
    of check C(unreadable) naming the file; only an unusable O(sysfs_root), an unknown O(profile) or an
    unusable replay file fail the task.
version_added: "0.2.0"
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpunuma_attributes
author: gpunuma maintainers (@gpunuma)
options:
  sysfs_root:
    description:
      - Directory holding C(sys/) and C(proc/) to read instead of C(/) (a support bundle or a test tree).
        When set, live NVML and C(nvidia-smi) are not queried.
    type: path
  profile:
    description:
      - The binding profile compared with C(kernel.numa_balancing). When not given, the profile of the plan the
        node applied (O(plan_path)), which is the one a rollback pinned, not the inventory's; with neither, the
        value is reported as C(info).
    type: str
    choices: [strict, preferred, interleave, "off"]
  plan_path:
    description: The plan the node applied, whose profile is the node's when O(profile) is not given.
    type: path
    default: /etc/gpunuma/plan.json
  pcie_expect_full_speed:
    description:
      - The GPUs are busy now, so a PCIe generation below the maximum is a fault (C(warning)), not an idle downshift (C(info)).
    type: bool
    default: false
  nvml_dump:
    description: A recorded NVML dump (C(gpunuma.nvml-dump/v1)) whose PCIe fields are used instead of live NVML.
    type: path
  nvidia_smi_q_file:
    description: A saved C(nvidia-smi -q) output read for persistence mode instead of live NVML.
    type: path
  use_nvml:
    description: Query live NVML (package C(nvidia-ml-py)) when it imports; ignored with O(sysfs_root).
    type: bool
    default: true
  fix_governor:
    description: Plan setting C(performance) on the GPU nodes' CPUs whose governor differs (applied by C(node_checks_fix)).
    type: bool
    default: false
  fix_persistence:
    description: Plan C(nvidia-smi -i <bus id> -pm 1) for each GPU whose persistence mode is off.
    type: bool
    default: false
notes:
  - Run with C(become) to read the bridges' ACS control; without it the ACS check reports C(info).
seealso:
  - name: gpunuma node checks
    description: Every check, its sources and the fixes.
    link: https://github.com/gpunuma/gpunuma/blob/main/docs/node-checks.md
"""

EXAMPLES = r"""
- name: Check the node against the strict profile
  gpunuma.fleet.node_checks_info:
    profile: strict
  become: true
  register: checks

- name: Replay a support bundle
  gpunuma.fleet.node_checks_info:
    sysfs_root: /srv/bundles/gpu-a01
    nvml_dump: /srv/bundles/gpu-a01/nvml-dump.json
    nvidia_smi_q_file: /srv/bundles/gpu-a01/nvidia-smi-q.txt
  delegate_to: localhost
"""

RETURN = r"""
node_checks:
  description: The findings and a summary.
  returned: success
  type: dict
  contains:
    findings:
      description: >-
        Each with C(check) (pcie_link, acs, iommu, cpu_governor, persistence_mode, thp, numa_balancing, unreadable;
        on nodes with AMD Instinct GPUs amd_nps, amd_iommu, amd_c2_state, amd_numa_balancing),
        C(severity), C(subject) (C(host), C(gpu <bus id>), C(bridge <bus id> above gpu <bus id>)), C(gpu)
        (bus id or null), C(message), C(evidence) (list of C(file), C(value)) and C(fix).
      type: list
      elements: dict
    gpus:
      description: The bus ids of the GPUs found.
      type: list
      elements: str
    summary:
      description: C(counts) per severity and C(worst) (C(ok), C(info), C(warning), C(error)).
      type: dict
    sources:
      description: Which of C(sysfs), C(nvml), C(nvml_dump), C(nvidia_smi_q_file), C(nvidia_smi) answered.
      type: list
      elements: str
    profile:
      description: The profile C(kernel.numa_balancing) was judged by (null when none), and C(profile_source).
      type: str
    profile_source:
      description: C(option) (O(profile)), C(applied plan) (O(plan_path)) or C(none).
      type: str
    planned_fixes:
      description: The opted-in fixes that would change something (C(kind), C(target), C(before), C(after)).
      type: list
      elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
import os

from ansible.module_utils.gpunuma.common import commands
from ansible.module_utils.gpunuma.common import node_paths
from ansible.module_utils.gpunuma.plan import state
from ansible.module_utils.gpunuma.verify import node_checks
from ansible.module_utils.gpunuma.verify import node_facts
from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.discovery.nvidia import nvml
from ansible.module_utils.gpunuma.discovery.nvidia import nvml_dump
from ansible.module_utils.gpunuma.common.bounded import read_bounded

_SMI_Q_LIMIT = 8 << 20


def _live_nvml():
    """({bus_id: bool} persistence, gpunuma.nvml-dump/v1) from live NVML, or (None, None) without NVML.

    The PCIe fields come from nvml.collect(), the adapter discovery uses;
    persistence mode, which the dump does not hold, is one more NVML call.
    """
    try:
        dump = nvml.collect()
    except GpunumaError:
        return None, None
    modes = {}
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:
        return modes, dump
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                bus = nvml_dump.normalize_bus_id(pynvml.nvmlDeviceGetPciInfo(handle).busId)
                modes[bus] = bool(pynvml.nvmlDeviceGetPersistenceMode(handle))
            except Exception:  # pynvml's NVMLError family, or a bus id NVML garbled
                continue
    except Exception:
        pass
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return modes, dump


def _smi_q(module, path):
    try:
        raw = read_bounded(path, _SMI_Q_LIMIT, follow_symlinks=True, what="an nvidia-smi -q output")
        text = raw.decode("utf-8")
    except (IOError, OSError) as exc:
        module.fail_json(msg="nvidia_smi_q_file %s cannot be read: %s" % (path, exc.strerror or exc))
    except UnicodeDecodeError:
        module.fail_json(msg="nvidia_smi_q_file %s is not UTF-8 text; a saved 'nvidia-smi -q' output was expected"
                         % path)
    try:
        return node_facts.parse_nvidia_smi_q(text)
    except ValueError as exc:
        module.fail_json(msg="nvidia_smi_q_file %s: %s" % (path, exc))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type="path"),
            profile=dict(type="str", choices=list(node_checks.PROFILES)),
            plan_path=dict(type="path", default=node_paths.PLAN),
            pcie_expect_full_speed=dict(type="bool", default=False),
            nvml_dump=dict(type="path"),
            nvidia_smi_q_file=dict(type="path"),
            use_nvml=dict(type="bool", default=True),
            fix_governor=dict(type="bool", default=False),
            fix_persistence=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    offline = params["sysfs_root"] is not None
    sources = ["sysfs"]
    try:
        facts = node_facts.read_node(params["sysfs_root"] if offline else "/")
        if params["nvml_dump"]:
            node_checks.apply_nvml_pcie(facts, nvml.load_dump(params["nvml_dump"]))
            sources.append("nvml_dump")
        if params["nvidia_smi_q_file"]:
            node_checks.apply_persistence(facts, _smi_q(module, params["nvidia_smi_q_file"]),
                                          "nvidia_smi_q_file %s" % params["nvidia_smi_q_file"])
            sources.append("nvidia_smi_q_file")
        if not offline and facts.gpus and params["use_nvml"]:
            modes, dump = _live_nvml()
            if dump is not None:
                node_checks.apply_persistence(facts, modes, "nvml:nvmlDeviceGetPersistenceMode")
                if not params["nvml_dump"]:
                    node_checks.apply_nvml_pcie(facts, dump)
                sources.append("nvml")
        if not offline and facts.gpus and any(g.persistence_mode is None for g in facts.gpus):
            smi = module.get_bin_path("nvidia-smi")
            if smi:
                rc, out, _unused = commands.runner(module)([smi, "-q"])
                if rc == 0:
                    try:
                        node_checks.apply_persistence(facts, node_facts.parse_nvidia_smi_q(out), "nvidia-smi -q")
                        sources.append("nvidia_smi")
                    except ValueError:
                        pass
        profile, profile_source = params["profile"], "option"
        if profile is None:
            # What this node is on: the profile of the plan it applied (a rollback's, when one pinned it).
            profile = state.applied_profile(os.path.join(params["sysfs_root"], params["plan_path"].lstrip("/"))
                                            if offline else params["plan_path"])
            profile_source = "applied plan" if profile else "none"
        findings = node_checks.evaluate(facts, profile, params["pcie_expect_full_speed"])
        fixes = node_checks.plan_fixes(facts, params["fix_governor"], params["fix_persistence"])
    except GpunumaError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, node_checks={
        "findings": [f.as_dict() for f in findings],
        "gpus": [g.link.bdf for g in facts.gpus],
        "summary": node_checks.summarize(findings),
        "sources": sources,
        "planned_fixes": fixes,
        "governor_scope": facts.governor_scope,
        "profile": profile,
        "profile_source": profile_source,
    })


if __name__ == "__main__":
    main()
