"""Filter plugins of the autonuma, memlock and numa_binding roles.

The autonuma and memlock filters are thin wrappers over gpunuma.sysctl_owners
and gpunuma.limits (who else sets kernel.numa_balancing; the memlock ceiling
of PID 1); the numa_binding filters turn a plan instance into
ExecStart=/Environment= words. Inputs are the text the roles collect on a
node (file lists, grep -H output, /proc files).
"""

import importlib.util
import os

import pytest
from ansible.errors import AnsibleFilterError
from ansible.module_utils.gpunuma import limits, sysctl_owners

from conftest import REPO_ROOT

pytestmark = pytest.mark.unit


def _load(role, name):
    path = os.path.join(REPO_ROOT, "roles", role, "filter_plugins", name + ".py")
    spec = importlib.util.spec_from_file_location("gpunuma_test_%s_filters" % role, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


autonuma = _load("autonuma", "autonuma")
memlock = _load("memlock", "memlock")
numa_binding = _load("numa_binding", "numa_binding")

OWN = "/etc/sysctl.d/60-gpunuma-numa-balancing.conf"


# ------------------------------------------------------------------ autonuma
# The logic is gpunuma.sysctl_owners (tests/unit/test_sysctl_owners.py);
# these check that the filters the role calls reach it, through the same
# import path Ansible gives the plugin, and that its errors become filter
# errors.


def test_autonuma_filters_are_the_sysctl_owners_functions():
    filters = autonuma.FilterModule().filters()
    # autonuma_input_problems checks the role's variables (test_roles_inputs.py).
    assert set(filters) == {"autonuma_sysctl_writers", "autonuma_sysctl_conflicts", "autonuma_tuned_active_profiles",
                            "autonuma_tuned_setting", "autonuma_tuned_conflict", "autonuma_input_problems"}
    for name, function in filters.items():
        if name == "autonuma_input_problems":
            continue
        core = getattr(sysctl_owners, name[len("autonuma_"):])
        assert function.__wrapped__ is core, name


def test_autonuma_filters_chain_as_the_role_chains_them():
    filters = autonuma.FilterModule().filters()
    paths = ["/usr/lib/sysctl.d/10-distro.conf", OWN, "/etc/sysctl.d/99-late.conf"]
    grep = ["/usr/lib/sysctl.d/10-distro.conf:kernel.numa_balancing = 1", OWN + ":kernel.numa_balancing=0",
            "/etc/sysctl.d/99-late.conf:kernel/numa_balancing=1"]
    writers = filters["autonuma_sysctl_writers"](paths, grep, "kernel.numa_balancing")
    files = filters["autonuma_sysctl_conflicts"](writers, OWN, 0, "kernel.numa_balancing")
    assert [w["path"] for w in files["overriding"]] == ["/etc/sysctl.d/99-late.conf"]
    assert [w["path"] for w in files["overridden"]] == ["/usr/lib/sysctl.d/10-distro.conf"]

    tuned = ["/usr/lib/tuned/network-latency/tuned.conf:[sysctl]",
             "/usr/lib/tuned/network-latency/tuned.conf:kernel.numa_balancing=0",
             "/etc/tuned/gpu/tuned.conf:[main]", "/etc/tuned/gpu/tuned.conf:include=network-latency"]
    active = filters["autonuma_tuned_active_profiles"]("Current active profile: gpu\n")
    setting = filters["autonuma_tuned_setting"](tuned, active, "kernel.numa_balancing")
    assert setting == {"value": "0", "profile": "network-latency", "chain": ["gpu", "network-latency"]}
    assert filters["autonuma_tuned_conflict"](setting, 0, "kernel.numa_balancing") is None
    assert filters["autonuma_tuned_conflict"](setting, 1, "kernel.numa_balancing").startswith(
        "tuned profile gpu (through network-latency) sets kernel.numa_balancing=0")


@pytest.mark.parametrize(
    "name, args",
    [
        ("autonuma_sysctl_writers", ([OWN], [], "not a key")),
        ("autonuma_sysctl_conflicts", ([{"path": OWN}], OWN, 0)),
        ("autonuma_tuned_active_profiles", (["Current active profile: x"],)),
        ("autonuma_tuned_setting", ([], "cpu-partitioning")),
        ("autonuma_tuned_conflict", ({"value": "0"}, 1)),
    ],
)
def test_autonuma_errors_become_filter_errors(name, args):
    with pytest.raises(AnsibleFilterError, match="allowed: "):
        autonuma.FilterModule().filters()[name](*args)


# ------------------------------------------------------------------- memlock
# The logic is gpunuma.limits (tests/unit/test_limits.py).


def test_memlock_filters_are_the_limits_functions():
    filters = memlock.FilterModule().filters()
    assert filters["memlock_systemd_value"].__wrapped__ is limits.systemd_limit
    assert filters["memlock_ceiling"].__wrapped__ is limits.memlock_ceiling
    assert filters["memlock_clamp"].__wrapped__ is limits.memlock_clamp
    assert filters["memlock_clamp_message"].__wrapped__ is limits.clamp_message
    assert filters["memlock_format_limit"].__wrapped__ is limits.format_limit


def test_memlock_filters_chain_as_the_role_chains_them():
    filters = memlock.FilterModule().filters()
    limits_text = ("Limit                     Soft Limit           Hard Limit           Units     \n"
                   "Max locked memory         8388608              8388608              bytes     \n")
    ceiling = filters["memlock_ceiling"](limits_text, "CapEff:\t00000000a8a425fb\n", None, "/proc/1")
    clamp = filters["memlock_clamp"]("64M", ceiling)
    assert (clamp["effective_systemd"], clamp["clamped"]) == (8388608, True)
    assert "get 8 MiB" in filters["memlock_clamp_message"](clamp, ceiling)
    assert filters["memlock_systemd_value"]("unlimited") == "infinity"


@pytest.mark.parametrize(
    "name, args, message",
    [
        ("memlock_systemd_value", ("lots",), "memlock_limit: 'lots' is not a limit"),
        ("memlock_ceiling", ("", "CapEff:\t0\n", None, "/proc/1"), "/proc/1/limits: "),
        ("memlock_clamp", ("64M", None), "memlock ceiling: None is not a memlock_ceiling"),
    ],
)
def test_memlock_errors_become_filter_errors(name, args, message):
    with pytest.raises(AnsibleFilterError, match=message):
        memlock.FilterModule().filters()[name](*args)


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
