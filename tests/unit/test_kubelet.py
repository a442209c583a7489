"""kubelet_topology_plan's core: merge and every kubelet rule, on real-shaped configs and fixture topologies.

These tests check the generated KubeletConfiguration against the kubelet's
documented rules; no kubelet binary runs here (docs/kubelet.md, "How it is
tested").
"""

import json
import os
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible.module_utils.gpunuma.kubelet import managers
from ansible.module_utils.gpunuma.kubelet.values import KubeletPlanError
from ansible.module_utils.gpunuma.kubelet.plan import housekeeping_cpus, plan_kubelet
from ansible.module_utils.gpunuma.kubelet.values import format_quantity, parse_quantity
from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, parse_cpulist
from ansible.module_utils.gpunuma.plan.planner import build_plan
from ansible.module_utils.gpunuma.plan.profiles import load_profile, parse_profile_text
from conftest import examples, FIXTURES, REPO_ROOT

pytestmark = pytest.mark.unit

KUBELET = os.path.join(FIXTURES, "kubelet")
TOPOLOGIES = {
    "hgx-2socket": os.path.join(FIXTURES, "topologies", "hgx-h200-8gpu-2socket-ht.json"),
    "nps4-8node": os.path.join(FIXTURES, "topologies", "dgxa100-nps4-8node.json"),
    "gb200-34node": os.path.join(FIXTURES, "topologies", "gb200-4gpu-34numa.json"),
    "single-node": os.path.join(FIXTURES, "topologies", "h200-1gpu-vm.json"),
    "no-gpu": os.path.join(KUBELET, "no-gpu-1node.topology.json"),
}
CONFIGS = ("k8s-docs-example.yaml", "kubeadm-config.yaml", "kubespray-config.yaml", "hand-edited.yaml",
           "eks-config.json")
OWNED = re.compile(r"^\s*(cpuManagerPolicy|topologyManager|memoryManagerPolicy|reservedMemory|reservedSystemCPUs)")
CPU_STATE = "/var/lib/kubelet/cpu_manager_state"
MEM_STATE = "/var/lib/kubelet/memory_manager_state"


def topology(name):
    with open(TOPOLOGIES[name], encoding="utf-8") as handle:
        return json.load(handle)


def config(name):
    with open(os.path.join(KUBELET, name), encoding="utf-8") as handle:
        return handle.read()


def profile(name):
    return load_profile(name, os.path.join(REPO_ROOT, "policies", "profiles"))


def preset(name):
    with open(os.path.join(REPO_ROOT, "policies", "kubelet", "%s.yml" % name), encoding="utf-8") as handle:
        return parse_profile_text(handle.read())


def plan(topo="hgx-2socket", prof="strict", cfg="kubeadm-config.yaml", text=None, **kwargs):
    kwargs.setdefault("kubelet_version", "1.33")
    return plan_kubelet(topology(topo), profile(prof), preset(prof), config(cfg) if text is None else text, **kwargs)


def problems_of(**kwargs):
    with pytest.raises(KubeletPlanError) as info:
        plan(**kwargs)
    return info.value.problems


def checkpoint(policy):
    return json.dumps({"policyName": policy, "defaultCpuSet": "", "checksum": 1})


# --------------------------------------------------------------------------
# Presets


@pytest.mark.parametrize("name", ["strict", "preferred", "interleave", "off"])
def test_every_binding_profile_has_a_kubelet_preset_naming_it(name):
    data = preset(name)
    assert data["profile"] == name
    profiles = sorted(f[:-4] for f in os.listdir(os.path.join(REPO_ROOT, "policies", "profiles")) if f.endswith(".yml"))
    presets = sorted(f[:-4] for f in os.listdir(os.path.join(REPO_ROOT, "policies", "kubelet")) if f.endswith(".yml"))
    assert presets == profiles


def test_strict_preset_is_single_numa_node_pod_scope_static_static():
    result = plan(prof="strict")
    assert result.settings["cpuManagerPolicy"] == "static"
    assert result.settings["topologyManagerPolicy"] == "single-numa-node"
    assert result.settings["topologyManagerScope"] == "pod"
    assert result.settings["memoryManagerPolicy"] == "Static"


def test_preferred_preset_is_best_effort():
    result = plan(prof="preferred")
    assert result.config["topologyManagerPolicy"] == "best-effort"
    assert result.config["cpuManagerPolicy"] == "static"
    assert "reservedMemory" not in result.config


@pytest.mark.parametrize("name", ["interleave", "off"])
def test_loose_presets_leave_a_default_config_untouched(name):
    text = config("kubeadm-config.yaml")
    result = plan(prof=name, text=text)
    assert result.changes == []
    assert result.config_text == text
    assert result.remove_checkpoints == []
    assert not result.transition_needed


def test_override_replaces_one_preset_key():
    result = plan(overrides={"topologyManagerPolicy": "restricted", "cpuManagerPolicyOptions": {"full-pcpus-only": True}})
    assert result.config["topologyManagerPolicy"] == "restricted"
    # map[string]string in the kubelet: a YAML boolean would not decode.
    assert result.config["cpuManagerPolicyOptions"] == {"full-pcpus-only": "true"}
    assert "full-pcpus-only: 'true'" in result.config_text


# --------------------------------------------------------------------------
# Merge: keys gpunuma does not own keep their text


@pytest.mark.parametrize("cfg", [c for c in CONFIGS if c.endswith(".yaml")])
def test_yaml_merge_keeps_every_unowned_line_in_order(cfg):
    original = config(cfg)
    result = plan(cfg=cfg, topo="hgx-2socket")
    # Only the owned keys' lines are rewritten: every other line is kept byte for byte.
    kept = [line for line in original.splitlines() if not OWNED.match(line)]
    out = result.config_text.splitlines()
    pos = 0
    for line in kept:
        assert line in out[pos:], "line %r of %s lost or moved" % (line, cfg)
        pos = out.index(line, pos) + 1


def test_hand_edited_comments_and_indentation_survive():
    result = plan(cfg="hand-edited.yaml")
    text = result.config_text
    assert text.startswith("---\n# Kubelet config of the gpu-a rack.")
    assert "cgroupDriver: systemd   # must match containerd's SystemdCgroup" in text
    assert "    - 10.96.0.10   # CoreDNS service IP" in text
    # The owned key keeps its place and its comment; the value changes.
    assert "\ncpuManagerPolicy: static   # set by gpunuma from the node's profile\n" in text
    assert text.index("cpuManagerPolicy") < text.index("maxPods")
    assert "reservedMemory:\n    -   numaNode: 0" in text or "reservedMemory:\n    - numaNode: 0" in text


def test_json_merge_keeps_order_and_indentation():
    original = json.loads(config("eks-config.json"))
    del original["systemReservedCgroup"], original["kubeReservedCgroup"]
    text = json.dumps(original, indent=4)
    result = plan(cfg="eks-config.json", text=text, housekeeping_cores_per_node=1)
    assert result.config_format == "json" if hasattr(result, "config_format") else True
    merged = json.loads(result.config_text)
    assert list(merged)[: len(original)] == list(original)
    assert result.config_text.startswith('{\n    "kind": "KubeletConfiguration"')
    assert merged["reservedSystemCPUs"] == "0,48,96,144"


def test_a_merged_config_planned_again_changes_nothing():
    first = plan(cfg="kubespray-config.yaml")
    again = plan(text=first.config_text, cpu_state=checkpoint("static"), memory_state=checkpoint("Static"))
    assert again.changes == []
    assert again.config_text == first.config_text
    assert again.remove_checkpoints == []


def test_changes_list_key_old_new():
    result = plan(cfg="kubespray-config.yaml")
    by_key = dict((c["key"], c) for c in result.changes)
    assert by_key["cpuManagerPolicy"] == {"key": "cpuManagerPolicy", "old": "none", "new": "static"}
    assert by_key["reservedSystemCPUs"]["old"] is None
    assert "kubeReserved" not in by_key


def test_equivalent_reserved_memory_quantities_are_no_change():
    first = plan(cfg="kubespray-config.yaml")
    rewritten = first.config_text.replace("memory: 1124Mi", "memory: 1151Ki".replace("1151Ki", "%dKi" % (1124 * 1024)))
    assert rewritten != first.config_text
    again = plan(text=rewritten, cpu_state=checkpoint("static"), memory_state=checkpoint("Static"))
    assert again.changes == []


# --------------------------------------------------------------------------
# Reserved CPUs come from the planner


@pytest.mark.parametrize("topo", sorted(TOPOLOGIES))
@pytest.mark.parametrize("cores", [1, 2])
def test_reserved_cpus_are_the_planners_housekeeping_cores(topo, cores):
    expected = build_plan(topology(topo), profile("strict"), [], housekeeping_cores_per_node=cores)["housekeeping"]
    union = set()
    for node, text in expected.items():
        union |= set(housekeeping_cpus(topology(topo), profile("strict"), cores)) & set(range(100000))
    result = plan(topo=topo, housekeeping_cores_per_node=cores)
    assert result.config["reservedSystemCPUs"] == format_cpulist(union)
    assert result.config["reservedSystemCPUs"]


def test_two_socket_reserves_one_whole_core_per_node():
    assert plan(housekeeping_cores_per_node=1).config["reservedSystemCPUs"] == "0,48,96,144"


def test_default_reserves_what_the_binding_planner_keeps_by_default():
    # auto, as gpu_binding_plan: ceil(48 cores / 24) = 2 whole cores per node (docs/plan-v1.md).
    assert plan().config["reservedSystemCPUs"] == "0-1,48-49,96-97,144-145"
    assert plan(housekeeping_cores_per_node="auto").config["reservedSystemCPUs"] == "0-1,48-49,96-97,144-145"


def test_explicit_housekeeping_cpus_are_reserved_as_the_planner_keeps_them():
    result = plan(housekeeping_cpus_list="0-3,96-99,48,144")
    assert result.config["reservedSystemCPUs"] == "0-3,48,96-99,144"


def test_bad_housekeeping_cpus_is_a_problem_not_a_traceback():
    problems = problems_of(housekeeping_cpus_list="0-x")
    assert any("housekeeping_cpus" in p for p in problems), problems


def test_static_with_no_housekeeping_cores_needs_another_cpu_reservation():
    problems = problems_of(housekeeping_cores_per_node=0)
    assert any(p.startswith("reservedSystemCPUs: the static CPU policy needs a CPU reservation greater than zero")
               for p in problems)
    # kubeReserved cpu is a reservation too: then no CPU list is written.
    result = plan(cfg="kubespray-config.yaml", housekeeping_cores_per_node=0)
    assert "reservedSystemCPUs" not in result.config


def test_reserved_cpus_with_reserved_cgroups_is_refused():
    problems = problems_of(cfg="eks-config.json")
    assert any("systemReservedCgroup ('/system')" in p and "allowed:" in p for p in problems)
    assert any("kubeReservedCgroup ('/runtime')" in p for p in problems)


def test_no_reserved_cpus_under_none():
    result = plan(prof="off", text=plan().config_text)
    assert "reservedSystemCPUs" not in result.config
    assert result.config["cpuManagerPolicy"] == "none"


# --------------------------------------------------------------------------
# Memory Manager sum rule


def _sum(entries, resource="memory"):
    return sum(parse_quantity(e["limits"].get(resource, "0"), resource) for e in entries)


def test_sum_includes_the_default_eviction_threshold():
    result = plan(cfg="kubeadm-config.yaml")
    assert result.config["reservedMemory"] == [{"numaNode": 0, "limits": {"memory": "100Mi"}}]


def test_sum_is_kube_plus_system_reserved_plus_eviction():
    result = plan(cfg="kubespray-config.yaml")
    assert _sum(result.config["reservedMemory"]) == parse_quantity("1124Mi", "x")


def test_cpu_nodes_spread_splits_over_cpu_bearing_nodes_only():
    result = plan(topo="gb200-34node", cfg="kubespray-config.yaml", memory_spread="cpu_nodes")
    entries = result.config["reservedMemory"]
    assert [e["numaNode"] for e in entries] == [0, 1]
    assert entries[0]["limits"]["memory"] == "562Mi"
    assert _sum(entries) == parse_quantity("1124Mi", "x")


def test_explicit_eviction_hard_without_memory_counts_zero():
    text = config("k8s-docs-example.yaml").replace('    memory.available:  "100Mi"\n', "")
    problems = problems_of(text=text)
    assert any(p.startswith("reservedMemory: the Static Memory Manager needs a memory reservation") for p in problems)


def test_hugepages_reservations_get_their_own_resource():
    text = config("kubespray-config.yaml").replace("  memory: 512Mi\nsystemReserved", "  memory: 512Mi\n  hugepages-1Gi: 2Gi\nsystemReserved")
    result = plan(text=text, memory_spread="cpu_nodes")
    assert [e["limits"] for e in result.config["reservedMemory"]] == [
        {"memory": "562Mi", "hugepages-1Gi": "1Gi"},
        {"memory": "562Mi", "hugepages-1Gi": "1Gi"},
    ]


def test_user_reserved_memory_with_a_wrong_sum_is_refused():
    problems = problems_of(cfg="kubespray-config.yaml",
                           overrides={"reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}}]})
    assert problems == [
        "reservedMemory: memory sums to 1Gi, but kubeReserved + systemReserved + evictionHard give 1124Mi; the Memory "
        "Manager (Static) refuses to start; allowed: reservedMemory summing to 1124Mi"
    ]


def test_user_reserved_memory_with_the_right_sum_is_kept():
    entries = [{"numaNode": 1, "limits": {"memory": "1000Mi"}}, {"numaNode": 0, "limits": {"memory": "124Mi"}}]
    result = plan(cfg="kubespray-config.yaml", overrides={"reservedMemory": entries})
    assert result.config["reservedMemory"] == entries


def test_percentage_memory_eviction_is_refused_for_static():
    text = config("k8s-docs-example.yaml").replace('"100Mi"', '"5%"')
    problems = problems_of(text=text)
    assert any("evictionHard.memory.available: '5%' is a percentage" in p and "allowed: an absolute quantity" in p
               for p in problems)


def test_eviction_hard_written_on_opt_in_keeps_the_disk_defaults():
    result = plan(cfg="kubeadm-config.yaml", manage_reservations=True,
                  overrides={"evictionHard": {"memory.available": "500Mi"}, "systemReserved": {"memory": "1Gi"}})
    assert result.config["evictionHard"] == {
        "memory.available": "500Mi", "nodefs.available": "10%", "imagefs.available": "15%", "nodefs.inodesFree": "5%"}
    assert _sum(result.config["reservedMemory"]) == parse_quantity("1524Mi", "x")
    assert any("evictionHard: written with the kubelet's defaults" in w for w in result.warnings)


@settings(max_examples=examples(200), deadline=None)
@given(st.dictionaries(st.sampled_from(["memory", "hugepages-2Mi", "hugepages-1Gi"]),
                       st.integers(min_value=1, max_value=1 << 44), min_size=1),
       st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=8, unique=True),
       st.sampled_from(["first_node", "cpu_nodes"]))
def test_spread_always_satisfies_the_sum_rule(totals, nodes, spread):
    entries = managers.spread(totals, sorted(nodes), spread)
    for resource, total in totals.items():
        assert _sum(entries, resource) == total
    assert {e["numaNode"] for e in entries} <= set(nodes)


@pytest.mark.parametrize("text,count", [("100Mi", 100 << 20), ("1Gi", 1 << 30), ("1G", 10 ** 9), ("512", 512),
                                        ("1.5Gi", 3 << 29), ("1e3", 1000), ("500m", 0.5)])
def test_parse_quantity(text, count):
    assert parse_quantity(text, "q") == count


def test_format_quantity_round_trips():
    for count in (1, 1024, 100 << 20, 1124 << 20, (1 << 30) + 1):
        assert parse_quantity(format_quantity(count), "q") == count


# --------------------------------------------------------------------------
# Topology Manager: more than 8 NUMA nodes


def test_gb200_gets_max_allowable_numa_nodes_as_the_kubelet_counts_them():
    result = plan(topo="gb200-34node")
    assert result.numa_nodes == 34
    assert result.config["topologyManagerPolicyOptions"] == {"max-allowable-numa-nodes": "34"}


def test_eight_nodes_need_no_option():
    assert "topologyManagerPolicyOptions" not in plan(topo="nps4-8node").config


def test_option_removed_when_no_longer_needed():
    gb200 = plan(topo="gb200-34node").config_text
    result = plan(topo="nps4-8node", text=gb200)
    assert {"key": "topologyManagerPolicyOptions", "old": {"max-allowable-numa-nodes": "34"}, "new": None} in result.changes


def test_none_topology_policy_on_gb200_needs_no_option():
    assert "topologyManagerPolicyOptions" not in plan(topo="gb200-34node", prof="off").config


def test_gb200_on_a_kubelet_before_1_31_is_refused():
    problems = problems_of(topo="gb200-34node", kubelet_version="1.30")
    assert any("kubelet 1.30 refuses more than 8" in p and "allowed:" in p for p in problems)


def test_max_allowable_numa_nodes_true_is_refused():
    problems = problems_of(overrides={"topologyManagerPolicyOptions": {"max-allowable-numa-nodes": True}})
    assert problems == ["topologyManagerPolicyOptions.max-allowable-numa-nodes: 'true' is not allowed; allowed: an "
                        "integer of at least 8, as a string (\"16\"), never true"]


# --------------------------------------------------------------------------
# Checkpoints


def test_none_to_static_removes_both_checkpoints_whose_policy_changed():
    result = plan(cpu_state=checkpoint("none"), memory_state=checkpoint("None"))
    assert result.remove_checkpoints == [CPU_STATE, MEM_STATE]


def test_preferred_removes_only_the_cpu_checkpoint():
    result = plan(prof="preferred", cpu_state=checkpoint("none"), memory_state=checkpoint("None"))
    assert result.remove_checkpoints == [CPU_STATE]


def test_checkpoint_that_disagrees_with_an_unchanged_config_is_removed():
    merged = plan().config_text
    result = plan(text=merged, cpu_state=checkpoint("none"), memory_state=checkpoint("Static"))
    assert result.changes == []
    assert result.remove_checkpoints == [CPU_STATE]
    assert result.transition_needed


def test_changed_reserved_cpus_under_static_removes_the_cpu_checkpoint():
    merged = plan(housekeeping_cores_per_node=1).config_text
    result = plan(text=merged, housekeeping_cores_per_node=2, cpu_state=checkpoint("static"),
                  memory_state=checkpoint("Static"))
    assert [c["key"] for c in result.changes] == ["reservedSystemCPUs"]
    assert result.remove_checkpoints == [CPU_STATE]


def test_unreadable_checkpoint_is_removed_with_a_warning():
    result = plan(prof="off", cpu_state="{not json", memory_state=checkpoint("None"))
    assert result.remove_checkpoints == [CPU_STATE]
    assert any("cannot be read as a kubelet checkpoint" in w for w in result.warnings)


def test_state_dir_is_used_in_paths():
    result = plan(prof="preferred", state_dir="/data/kubelet/", cpu_state=checkpoint("none"),
                  memory_state=checkpoint("None"))
    assert result.remove_checkpoints == ["/data/kubelet/cpu_manager_state"]


# --------------------------------------------------------------------------
# Bad input: one clear line per problem, naming field, value and what is allowed


@pytest.mark.parametrize("overrides,expected", [
    ({"cpuManagerPolicy": "Static"},
     "cpuManagerPolicy: 'Static' is not a CPU Manager policy; allowed: none, static (lower case)"),
    ({"memoryManagerPolicy": "static"},
     "memoryManagerPolicy: 'static' is not a Memory Manager policy (the case matters); allowed: None, Static"),
    ({"topologyManagerPolicy": "single-numa"},
     "topologyManagerPolicy: 'single-numa' is not a Topology Manager policy; allowed: none, best-effort, restricted, single-numa-node"),
    ({"topologyManagerScope": "node"},
     "topologyManagerScope: 'node' is not a Topology Manager scope; allowed: container, pod"),
    ({"reservedSystemCPUs": "0,999"},
     "reservedSystemCPUs: '0,999' names CPUs 999 that gpu-a01 does not have; allowed: CPUs in 0-191"),
    ({"reservedMemory": [{"numaNode": 5, "limits": {"memory": "100Mi"}}]},
     "reservedMemory[0].numaNode: 5 is not a NUMA node of this host; allowed: 0, 1"),
    ({"cpuManagerPolicyOptions": {"full-pcpu-only": "true"}},
     "cpuManagerPolicyOptions: option 'full-pcpu-only' is unknown; allowed: align-by-socket"),
    ({"cpuManagerPolicyOptions": {"align-by-socket": "true"}},
     "cpuManagerPolicyOptions.align-by-socket: is alpha in kubelet 1.33 and needs featureGates.CPUManagerPolicyAlphaOptions: true"),
    ({"kubeReserved": {"memory": "1Gi"}},
     "overrides.kubeReserved: is written only with manage_reservations: true; allowed:"),
    ({"maxPods": 10},
     "overrides.maxPods: is not a key gpunuma manages; allowed: cpuManagerPolicy"),
])
def test_bad_setting_is_named(overrides, expected):
    problems = problems_of(overrides=overrides)
    assert any(p.startswith(expected) for p in problems), problems


def test_option_newer_than_the_kubelet_is_refused():
    problems = problems_of(overrides={"cpuManagerPolicyOptions": {"strict-cpu-reservation": "true"}}, kubelet_version="v1.29.4")
    assert problems == ["cpuManagerPolicyOptions.strict-cpu-reservation: needs kubelet 1.31 or later (kubelet_version is "
                        "1.29); allowed: remove the option or upgrade"]


@pytest.mark.parametrize("option, beta_until, ga", [
    ("strict-cpu-reservation", "v1.34.4", "v1.35.4"),
    ("prefer-align-cpus-by-uncorecache", "v1.35.4", "v1.36.3"),
])
def test_options_that_went_ga_need_no_beta_gate(option, beta_until, ga):
    overrides = {"cpuManagerPolicyOptions": {option: "true"}}
    # The node's config turns the beta options off.
    text = config("kubeadm-config.yaml") + "featureGates:\n  CPUManagerPolicyBetaOptions: false\n"
    problems = problems_of(overrides=overrides, kubelet_version=beta_until, text=text)
    assert problems == ["cpuManagerPolicyOptions.%s: is beta in kubelet %s and featureGates.CPUManagerPolicyBetaOptions "
                        "is false; allowed: that gate on (its default)" % (option, beta_until[1:5])], problems
    result = plan(overrides=overrides, kubelet_version=ga, text=text)
    assert result.config["cpuManagerPolicyOptions"] == {option: "true"}


def test_alpha_option_allowed_with_its_gate():
    result = plan(cfg="hand-edited.yaml", overrides={"cpuManagerPolicyOptions": {"align-by-socket": "true"}})
    assert result.config["cpuManagerPolicyOptions"] == {"align-by-socket": "true"}


def test_options_under_none_policy_are_refused():
    problems = problems_of(prof="off", overrides={"cpuManagerPolicyOptions": {"full-pcpus-only": "true"}})
    assert any(p.startswith("cpuManagerPolicyOptions: {'full-pcpus-only': 'true'} is set under cpuManagerPolicy 'none', "
                            "which stops the kubelet") for p in problems)


def test_every_problem_is_reported_at_once():
    problems = problems_of(overrides={"cpuManagerPolicy": "Static", "memoryManagerPolicy": "static",
                                      "topologyManagerPolicy": "x"}, kubelet_version="one")
    assert len(problems) == 4


@pytest.mark.parametrize("text,expected", [
    ("", "config: is empty; allowed: an existing KubeletConfiguration"),
    ("   \n# only a comment\n", "config: holds 0 YAML documents; allowed: exactly one KubeletConfiguration document"),
    ("kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\nfoo: [1, 2\n", "config: is not valid YAML"),
    ('{"kind": "KubeletConfiguration",', "config: is not valid JSON"),
    ("- a\n- b\n", "config: is a CommentedSeq, not a mapping"),
    ("apiVersion: kubeadm.k8s.io/v1beta3\nkind: ClusterConfiguration\n",
     "config: kind is 'ClusterConfiguration'; allowed: KubeletConfiguration"),
    ("apiVersion: kubelet.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n",
     "config: apiVersion is 'kubelet.config.k8s.io/v1alpha1'; allowed: kubelet.config.k8s.io/v1beta1"),
    ("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n---\napiVersion: v1\nkind: ConfigMap\n",
     "config: holds 2 YAML documents"),
    ("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 1\nmaxPods: 2\n",
     "config: is not valid YAML"),
    ('{"kind": "KubeletConfiguration", "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "Pod"}',
     "config: key 'kind' appears twice in one JSON object; allowed: each key once"),
    ("{kind: KubeletConfiguration, apiVersion: kubelet.config.k8s.io/v1alpha9}",
     "config: apiVersion is 'kubelet.config.k8s.io/v1alpha9'"),
    ("\x00\x01binary", "config: is not valid YAML"),
])
def test_bad_config_is_named(text, expected):
    problems = problems_of(text=text)
    assert problems[0].startswith(expected), problems


def test_yaml_flow_mapping_is_yaml_not_json():
    result = plan(text="{kind: KubeletConfiguration, apiVersion: kubelet.config.k8s.io/v1beta1, maxPods: 64}")
    assert result.config_format == "yaml" if hasattr(result, "config_format") else result.fmt == "yaml"
    assert result.config["maxPods"] == 64
    assert result.config["cpuManagerPolicy"] == "static"


def test_unowned_text_is_byte_identical_around_the_changed_keys():
    original = config("kubespray-config.yaml")
    result = plan(cfg="kubespray-config.yaml")
    assert "failSwapOn: True\n" in result.config_text
    assert "topologyManagerPolicy: single-numa-node\ntopologyManagerScope: pod\n" in result.config_text
    head = original.split("cpuManagerPolicy: none")[0]
    assert result.config_text.startswith(head)


def test_a_layout_the_splice_cannot_keep_still_gives_the_same_document():
    # A flow mapping has no per-key lines: the whole document is written by ruamel.yaml.
    text = "{kind: KubeletConfiguration, apiVersion: kubelet.config.k8s.io/v1beta1, cpuManagerPolicy: none}"
    result = plan(text=text)
    assert result.config["cpuManagerPolicy"] == "static"
    assert result.config["kind"] == "KubeletConfiguration"


def test_a_comment_inside_an_owned_block_falls_back_safely():
    text = (config("kubeadm-config.yaml") + "reservedMemory:\n- numaNode: 0\n# second item\n- numaNode: 1\n"
            "memoryManagerPolicy: None\n")
    result = plan(text=text, prof="preferred")
    # preferred has memoryManagerPolicy None: the owned reservedMemory block goes, comment and all.
    assert "reservedMemory" not in result.config
    assert "numaNode" not in result.config_text


def test_negative_reservation_is_refused():
    text = config("kubespray-config.yaml").replace("  memory: 512Mi\nsystemReserved", "  memory: -512Mi\nsystemReserved")
    problems = problems_of(text=text)
    assert "config.kubeReserved.memory: '-512Mi' is negative; allowed: a quantity of 0 or more" in problems


def test_bad_memory_spread_and_version():
    problems = problems_of(memory_spread="everywhere", kubelet_version="latest")
    assert "kubelet_version: 'latest' is not a Kubernetes version; allowed: MAJOR.MINOR such as \"1.31\" or v1.31.2" in problems
    assert "memory_spread: 'everywhere' is not allowed; allowed: first_node, cpu_nodes" in problems


@pytest.mark.parametrize("version", [1.3, "1.3", "1.17"])
def test_a_version_read_as_a_number_is_caught(version):
    problems = problems_of(kubelet_version=version)
    assert problems[0].startswith("kubelet_version: %r is older than any kubelet gpunuma supports; allowed: 1.18 or later, "
                                  "as a quoted string" % (version,))


def test_missing_version_is_a_warning_not_an_error():
    result = plan(kubelet_version=None)
    assert any(w.startswith("kubelet_version is not set") for w in result.warnings)


def test_single_numa_node_on_a_pool_of_mixed_pod_sizes_is_warned():
    result = plan(prof="strict", pod_gpu_counts=[1, 2, 4, 4, 0])
    (line,) = [w for w in result.warnings if "single-numa-node" in w]
    assert "pods of 1, 2, 4 GPUs" in line and "TopologyAffinityError" in line
    assert "prefer-closest-numa-nodes" in line and "pytorch/ci-infra#696" in line


@pytest.mark.parametrize("prof, counts", [
    ("strict", [8, 8]),       # one pod size: packing cannot fragment
    ("strict", [0, 4]),       # CPU-only pods ask for no GPU
    ("preferred", [1, 2, 4]),  # best-effort admits what it cannot align
])
def test_no_mixed_size_warning_where_admission_cannot_livelock(prof, counts):
    result = plan(prof=prof, pod_gpu_counts=counts)
    assert not [w for w in result.warnings if "TopologyAffinityError" in w], result.warnings


def test_pod_gpu_counts_must_be_counts():
    problems = problems_of(pod_gpu_counts=[1, "two", -1])
    assert any(p.startswith("pod_gpu_counts: [1, 'two', -1] is not allowed; allowed: a list of GPU counts") for p in problems)


def _with_irq_vectors(topo, vectors):
    for device in list(topo.get("gpus") or []) + list(topo.get("nics") or []):
        device["irq_vectors"] = vectors
    return topo


@pytest.mark.parametrize("name", ["hgx-2socket", "nps4-8node", "gb200-34node", "single-node"])
@pytest.mark.parametrize("cores", ["auto", 0, 1, 3])
@pytest.mark.parametrize("irq_pin", [False, True])
def test_reserved_cpus_are_the_binding_plans_housekeeping(name, cores, irq_pin):
    """Given the node's binding plan, reservedSystemCPUs is its housekeeping, whatever the options: the IRQ CPUs
    irq_pin keeps are reserved too, so no Guaranteed pod lands where device interrupts were pinned."""
    topo = _with_irq_vectors(topology(name), 300)
    made = build_plan(topo, profile("strict"), [{"name": "w%d" % g["index"], "gpus": [g["index"]],
                                                  "command": ["/bin/true"]} for g in topo["gpus"]],
                      housekeeping_cores_per_node=cores, irq_pin=irq_pin)
    expected = frozenset()
    for text in made["housekeeping"].values():
        expected |= parse_cpulist(text or "")
    kwargs = dict(kubelet_version="1.33", housekeeping_cores_per_node=cores, binding_plan=made)
    if not expected:  # the static CPU policy needs a reservation: refused, as without a plan
        with pytest.raises(KubeletPlanError, match="reservedSystemCPUs: the static CPU policy needs"):
            plan_kubelet(topo, profile("strict"), preset("strict"), config("kubeadm-config.yaml"), **kwargs)
        return
    result = plan_kubelet(topo, profile("strict"), preset("strict"), config("kubeadm-config.yaml"), **kwargs)
    assert parse_cpulist(result.settings["reservedSystemCPUs"]) == expected


def test_a_binding_plan_of_other_hardware_is_refused():
    topo = topology("hgx-2socket")
    made = build_plan(topology("single-node"), profile("strict"), [])
    with pytest.raises(KubeletPlanError) as caught:
        plan_kubelet(topo, profile("strict"), preset("strict"), config("kubeadm-config.yaml"), kubelet_version="1.33",
                     binding_plan=made)
    assert "plan: made for topology" in str(caught.value)
