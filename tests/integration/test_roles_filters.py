"""Filter plugins of the autonuma and numa_binding roles, as pure functions.

The autonuma filters decide who else sets kernel.numa_balancing (sysctl.d
precedence, tuned include chains); the numa_binding filters turn a plan
instance into ExecStart=/Environment= words. Inputs are the text the roles
collect on a node (file lists, grep -H output).
"""

import importlib.util
import os

import pytest
from ansible.errors import AnsibleFilterError

from conftest import REPO_ROOT

pytestmark = pytest.mark.unit


def _load(role, name):
    path = os.path.join(REPO_ROOT, "roles", role, "filter_plugins", name + ".py")
    spec = importlib.util.spec_from_file_location("gpunuma_test_%s_filters" % role, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


autonuma = _load("autonuma", "autonuma")
numa_binding = _load("numa_binding", "numa_binding")

OWN = "/etc/sysctl.d/60-gpunuma-numa-balancing.conf"


# ------------------------------------------------------------ sysctl.d order


def test_writers_follow_file_name_order_across_directories():
    paths = ["/usr/lib/sysctl.d/10-distro.conf", OWN, "/etc/sysctl.d/99-late.conf"]
    grep = [
        "/usr/lib/sysctl.d/10-distro.conf:kernel.numa_balancing = 1",
        OWN + ":kernel.numa_balancing=0",
        "/etc/sysctl.d/99-late.conf:kernel/numa_balancing=1",
    ]
    writers = autonuma.sysctl_writers(paths, grep)
    assert [w["path"] for w in writers] == paths
    assert [w["value"] for w in writers] == ["1", "0", "1"]


def test_etc_file_hides_the_same_name_in_usr_lib():
    paths = ["/usr/lib/sysctl.d/50-x.conf", "/etc/sysctl.d/50-x.conf", OWN]
    grep = ["/usr/lib/sysctl.d/50-x.conf:kernel.numa_balancing=1", OWN + ":kernel.numa_balancing=0"]
    # /etc/sysctl.d/50-x.conf exists but does not set the key: the shipped
    # file of the same name is never read, so nothing else sets it.
    assert autonuma.sysctl_writers(paths, grep) == [{"path": OWN, "value": "0"}]


def test_sysctl_conf_is_read_last():
    paths = ["/etc/sysctl.conf", OWN, "/etc/sysctl.d/99-z.conf"]
    grep = ["/etc/sysctl.conf:kernel.numa_balancing=1", OWN + ":kernel.numa_balancing=0"]
    writers = autonuma.sysctl_writers(paths, grep)
    assert [w["path"] for w in writers] == [OWN, "/etc/sysctl.conf"]


def test_last_assignment_in_a_file_wins_and_ignore_prefix_is_read():
    grep = [OWN + ":kernel.numa_balancing=1", OWN + ":-kernel.numa_balancing = 0"]
    assert autonuma.sysctl_writers([OWN], grep) == [{"path": OWN, "value": "0"}]


def test_other_keys_and_comments_are_not_settings():
    path = "/etc/sysctl.d/20-x.conf"
    grep = [path + ":# kernel.numa_balancing=1", path + ":kernel.numa_balancing_scan_delay_ms=1000"]
    assert autonuma.sysctl_writers([path], grep) == []


def test_later_file_with_another_value_overrides_gpunuma():
    writers = [
        {"path": "/usr/lib/sysctl.d/10-distro.conf", "value": "1"},
        {"path": OWN, "value": "0"},
        {"path": "/etc/sysctl.d/99-late.conf", "value": "1"},
        {"path": "/etc/sysctl.d/99-same.conf", "value": "0"},
    ]
    result = autonuma.sysctl_conflicts(writers, OWN, 0)
    assert [w["path"] for w in result["overriding"]] == ["/etc/sysctl.d/99-late.conf"]
    assert "wins at boot" in result["overriding"][0]["reason"]
    assert [w["path"] for w in result["overridden"]] == ["/usr/lib/sysctl.d/10-distro.conf"]


def test_no_conflict_when_everyone_agrees():
    writers = [{"path": OWN, "value": "1"}, {"path": "/etc/sysctl.d/99-late.conf", "value": "1"}]
    assert autonuma.sysctl_conflicts(writers, OWN, 1) == {"overriding": [], "overridden": []}


# ---------------------------------------------------------------------- tuned


TUNED = [
    "/usr/lib/tuned/latency-performance/tuned.conf:[cpu]",
    "/usr/lib/tuned/network-latency/tuned.conf:[main]",
    "/usr/lib/tuned/network-latency/tuned.conf:include=latency-performance",
    "/usr/lib/tuned/network-latency/tuned.conf:[sysctl]",
    "/usr/lib/tuned/network-latency/tuned.conf:kernel.numa_balancing=0",
    "/usr/lib/tuned/cpu-partitioning/tuned.conf:[main]",
    "/usr/lib/tuned/cpu-partitioning/tuned.conf:include=network-latency",
    "/usr/lib/tuned/cpu-partitioning/tuned.conf:[sysctl]",
    "/usr/lib/tuned/throughput-performance/tuned.conf:[main]",
    "/usr/lib/tuned/throughput-performance/tuned.conf:[sysctl]",
]


def test_active_profiles_from_tuned_adm():
    assert autonuma.tuned_active_profiles("Current active profile: cpu-partitioning\n") == ["cpu-partitioning"]
    assert autonuma.tuned_active_profiles("Current active profile: throughput-performance hpc-compute") == [
        "throughput-performance",
        "hpc-compute",
    ]
    assert autonuma.tuned_active_profiles("No current active profile.") == []


def test_setting_found_through_the_include_chain():
    setting = autonuma.tuned_setting(TUNED, ["cpu-partitioning"])
    assert setting == {"value": "0", "profile": "network-latency", "chain": ["cpu-partitioning", "network-latency"]}


def test_profile_without_the_key_sets_nothing():
    assert autonuma.tuned_setting(TUNED, ["throughput-performance"]) is None
    assert autonuma.tuned_setting(TUNED, ["latency-performance"]) is None


def test_including_profile_overrides_the_included_one():
    lines = TUNED + [
        "/etc/tuned/gpu-serving/tuned.conf:[main]",
        "/etc/tuned/gpu-serving/tuned.conf:include=cpu-partitioning",
        "/etc/tuned/gpu-serving/tuned.conf:[sysctl]",
        "/etc/tuned/gpu-serving/tuned.conf:kernel.numa_balancing=1",
    ]
    assert autonuma.tuned_setting(lines, ["gpu-serving"])["value"] == "1"


def test_etc_tuned_replaces_the_shipped_profile():
    lines = TUNED + [
        "/etc/tuned/network-latency/tuned.conf:[main]",
        "/etc/tuned/network-latency/tuned.conf:include=latency-performance",
    ]
    assert autonuma.tuned_setting(lines, ["cpu-partitioning"]) is None


def test_include_loops_end():
    lines = [
        "/usr/lib/tuned/a/tuned.conf:[main]",
        "/usr/lib/tuned/a/tuned.conf:include=b",
        "/usr/lib/tuned/b/tuned.conf:[main]",
        "/usr/lib/tuned/b/tuned.conf:include=a",
    ]
    assert autonuma.tuned_setting(lines, ["a"]) is None


def test_key_outside_the_sysctl_section_is_ignored():
    lines = ["/usr/lib/tuned/x/tuned.conf:[bootloader]", "/usr/lib/tuned/x/tuned.conf:kernel.numa_balancing=0"]
    assert autonuma.tuned_setting(lines, ["x"]) is None


# -------------------------------------------------------------- numa_binding


def test_exec_argv_puts_numactl_path_before_the_command():
    instance = {
        "name": "llm0",
        "exec_prefix": ["numactl", "--physcpubind=2-23", "--membind=0"],
        "command": ["/opt/vllm/bin/vllm", "serve"],
    }
    assert numa_binding.exec_argv(instance, "/usr/bin/numactl") == [
        "/usr/bin/numactl",
        "--physcpubind=2-23",
        "--membind=0",
        "/opt/vllm/bin/vllm",
        "serve",
    ]


def test_exec_argv_without_prefix_is_the_command():
    instance = {"name": "x", "exec_prefix": [], "command": ["/bin/true"]}
    assert numa_binding.exec_argv(instance, "/usr/bin/numactl") == ["/bin/true"]


def test_exec_argv_needs_a_command():
    with pytest.raises(AnsibleFilterError, match="has no command"):
        numa_binding.exec_argv({"name": "vendor", "exec_prefix": [], "command": None}, "/usr/bin/numactl")


def test_exec_line_escapes_what_systemd_would_expand():
    line = numa_binding.exec_line(["/bin/echo", "$HOME", "%h", 'say "hi"', "a\\b"])
    assert line == '"/bin/echo" "$$HOME" "%%h" "say \\"hi\\"" "a\\\\b"'


def test_exec_line_refuses_an_executable_systemd_reads_as_a_prefix():
    with pytest.raises(AnsibleFilterError, match="prefix"):
        numa_binding.exec_line(["-/bin/true"])


def test_environment_keeps_dollar_and_escapes_specifiers():
    assert numa_binding.environment_assignment("A", 'x $Y %n "q" \\') == '"A=x $Y %%n \\"q\\" \\\\"'


def test_environment_control_characters_are_c_escaped():
    assert numa_binding.environment_assignment("A", "l1\nl2\t\x01") == '"A=l1\\nl2\\t\\x01"'
