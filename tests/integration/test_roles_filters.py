"""The filter plugin (filter_plugins/gpunuma.py): the autonuma, memlock and numa_binding filters.

The autonuma and memlock filters are thin wrappers over gpunuma.sysctl_owners
and gpunuma.limits (who else sets kernel.numa_balancing; the memlock ceiling
of PID 1); the numa_binding filters turn a plan instance into
ExecStart=/Environment= words. Inputs are the text the roles collect on a
node (file lists, grep -H output, /proc files).
"""

import importlib.util
import os
import re

import pytest
from ansible.errors import AnsibleFilterError
from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.node import autonuma, limits, sysctl_owners
from ansible.module_utils.gpunuma.plan import node_plan

from conftest import REPO_ROOT

pytestmark = pytest.mark.unit


def _load():
    path = os.path.join(REPO_ROOT, "filter_plugins", "gpunuma.py")
    spec = importlib.util.spec_from_file_location("gpunuma_test_filters", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


plugin = _load()


def _filters(prefix):
    """The plugin's filters whose names start with ``prefix`` (one role's filters)."""
    return {name: f for name, f in plugin.FilterModule().filters().items() if name.startswith(prefix)}


# Filter names as the roles and playbooks call them: ``| name`` and ``map('name')``.
_NAME = r"((?:gpunuma|autonuma|memlock|numa_binding|gpu_topology|gpu_validate)_[a-z_]+)"
_USE = re.compile(r"(?:\|\s*|map\(\s*['\"])gpunuma\.fleet\." + _NAME)
# A call by the short name works in a checkout only (filter_plugins/), not in the installed collection.
_SHORT_USE = re.compile(r"(?:\|\s*|map\(\s*['\"])" + _NAME)


def _used_filter_names(pattern=_USE):
    used = {}
    for top in ("roles", "playbooks", "molecule"):
        for root, _dirs, files in os.walk(os.path.join(REPO_ROOT, top)):
            for name in files:
                if not name.endswith((".yml", ".yaml", ".j2")):
                    continue
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as handle:
                    for match in pattern.finditer(handle.read()):
                        used.setdefault(match.group(1), os.path.relpath(path, REPO_ROOT))
    return used


def test_every_filter_the_roles_and_playbooks_call_is_in_the_plugin():
    used = _used_filter_names()
    # The scan sees the calls (a broken pattern would pass vacuously).
    assert {"gpunuma_audit_line", "numa_binding_exec_line", "memlock_role_plan", "autonuma_role_plan"} <= set(used)
    filters = plugin.FilterModule().filters()
    missing = {name: where for name, where in used.items() if name not in filters}
    assert not missing, missing
    for name, function in filters.items():
        assert callable(function), name


def test_roles_and_playbooks_call_the_filters_by_their_full_name():
    filters = plugin.FilterModule().filters()
    short = {name: where for name, where in _used_filter_names(_SHORT_USE).items() if name in filters}
    assert not short, "call these as gpunuma.fleet.<name> (docs/collection.md): %s" % short


def test_ansible_cfg_points_at_the_plugin_directory():
    import configparser

    config = configparser.ConfigParser()
    config.read(os.path.join(REPO_ROOT, "ansible.cfg"))
    assert config["defaults"]["filter_plugins"] == "filter_plugins"
    assert os.path.isfile(os.path.join(REPO_ROOT, config["defaults"]["filter_plugins"], "gpunuma.py"))
    # gpunuma.fleet resolves in a checkout to the same plugin file.
    linked = os.path.join(REPO_ROOT, config["defaults"]["collections_path"], "ansible_collections", "gpunuma", "fleet",
                          "plugins", "filter", "gpunuma.py")
    assert os.path.samefile(linked, os.path.join(REPO_ROOT, "filter_plugins", "gpunuma.py"))


OWN = "/etc/sysctl.d/60-gpunuma-numa-balancing.conf"


# ------------------------------------------------------------------ autonuma
# The logic is gpunuma.sysctl_owners (tests/unit/test_sysctl_owners.py);
# these check that the filters the role calls reach it, through the same
# import path Ansible gives the plugin, and that its errors become filter
# errors.


def test_autonuma_filters_are_the_autonuma_functions():
    filters = _filters("autonuma_")
    # autonuma_input_problems checks the role's variables (test_roles_inputs.py).
    assert set(filters) == {"autonuma_input_problems", "autonuma_decide", "autonuma_role_plan"}
    # The value decision is gpunuma.autonuma (tests/unit/test_autonuma_decide.py), and so is
    # whether the live value is written (the audit asks the same function: tests/unit/test_one_decider.py);
    # the role asks role_plan, which chains them with the sysctl.d and tuned readings below.
    assert filters["autonuma_decide"].__wrapped__ is autonuma.decide
    assert filters["autonuma_role_plan"].__wrapped__ is autonuma.role_plan


def test_sysctl_owners_chain_as_role_plan_chains_them():
    paths = ["/usr/lib/sysctl.d/10-distro.conf", OWN, "/etc/sysctl.d/99-late.conf"]
    grep = ["/usr/lib/sysctl.d/10-distro.conf:kernel.numa_balancing = 1", OWN + ":kernel.numa_balancing=0",
            "/etc/sysctl.d/99-late.conf:kernel/numa_balancing=1"]
    writers = sysctl_owners.sysctl_writers(paths, grep, "kernel.numa_balancing")
    files = sysctl_owners.sysctl_conflicts(writers, OWN, 0, "kernel.numa_balancing")
    assert [w["path"] for w in files["overriding"]] == ["/etc/sysctl.d/99-late.conf"]
    assert [w["path"] for w in files["overridden"]] == ["/usr/lib/sysctl.d/10-distro.conf"]

    tuned = ["/usr/lib/tuned/network-latency/tuned.conf:[sysctl]",
             "/usr/lib/tuned/network-latency/tuned.conf:kernel.numa_balancing=0",
             "/etc/tuned/gpu/tuned.conf:[main]", "/etc/tuned/gpu/tuned.conf:include=network-latency"]
    active = sysctl_owners.tuned_active_profiles("Current active profile: gpu\n")
    setting = sysctl_owners.tuned_setting(tuned, active, "kernel.numa_balancing")
    assert setting == {"value": "0", "profile": "network-latency", "chain": ["gpu", "network-latency"]}
    assert sysctl_owners.tuned_conflict(setting, 0, "kernel.numa_balancing") is None
    assert sysctl_owners.tuned_conflict(setting, 1, "kernel.numa_balancing").startswith(
        "tuned profile gpu (through network-latency) sets kernel.numa_balancing=0")
    # role_plan reads the same node the same way: the late file overrides gpunuma's, the tuned profile agrees
    node = {"live_value": 1, "kernel_release": "6.1.0", "in_container": False, "sysctl_paths": paths,
            "sysctl_lines": grep, "tuned_active": "Current active profile: gpu\n", "tuned_active_rc": 0,
            "tuned_lines": tuned}
    plan = _filters("autonuma_")["autonuma_role_plan"](0, "strict", node, None, OWN, "fail", "h1",
                                                     "/proc/sys/kernel/numa_balancing")
    assert plan["problem"].startswith("h1: kernel.numa_balancing=0 would not hold: /etc/sysctl.d/99-late.conf sets")


@pytest.mark.parametrize(
    "function, args",
    [
        (sysctl_owners.sysctl_writers, ([OWN], [], "not a key")),
        (sysctl_owners.sysctl_conflicts, ([{"path": OWN}], OWN, 0)),
        (sysctl_owners.tuned_active_profiles, (["Current active profile: x"],)),
        (sysctl_owners.tuned_setting, ([], "cpu-partitioning")),
        (sysctl_owners.tuned_conflict, ({"value": "0"}, 1)),
    ],
)
def test_sysctl_owners_errors_say_what_is_allowed(function, args):
    with pytest.raises(GpunumaError, match="allowed: "):
        function(*args)


def test_autonuma_role_plan_errors_become_filter_errors():
    with pytest.raises(AnsibleFilterError, match="autonuma_apply_live: 'maybe' is not allowed; allowed: "):
        _filters("autonuma_")["autonuma_role_plan"](0, "strict", {"live_value": 1}, "maybe", OWN, "warn", "h1",
                                                    "/proc/sys/kernel/numa_balancing")


# ------------------------------------------------------------------- memlock
# The logic is gpunuma.limits (tests/unit/test_limits.py).


def test_memlock_filters_are_the_limits_functions():
    filters = _filters("memlock_")
    assert filters["memlock_role_plan"].__wrapped__ is limits.role_plan
    assert set(filters) == {"memlock_input_problems", "memlock_role_plan"}


LIMITS_8M = ("Limit                     Soft Limit           Hard Limit           Units     \n"
             "Max locked memory         8388608              8388608              bytes     \n")


def _pid1(limits_text, status="CapEff:\t00000000a8a425fb\n"):
    import base64
    return {"limits": base64.b64encode(limits_text.encode()).decode(), "status": base64.b64encode(status.encode()).decode()}


def test_memlock_role_plan_chains_the_limits_functions():
    ceiling = limits.memlock_ceiling(LIMITS_8M, "CapEff:\t00000000a8a425fb\n", None, "/proc/1")
    clamp = limits.memlock_clamp("64M", ceiling)
    assert (clamp["effective_systemd"], clamp["clamped"]) == (8388608, True)
    role_plan = _filters("memlock_")["memlock_role_plan"]
    warned = role_plan("64M", _pid1(LIMITS_8M), "/proc/1", "warn", "h1")
    assert (warned["systemd_limit"], warned["effective_limit"], warned["pam_value"]) == (67108864, 8388608, 65536)
    assert warned["notes"] == ["WARNING h1: " + limits.clamp_message(clamp, ceiling)] and warned["problem"] is None
    stopped = role_plan("64M", _pid1(LIMITS_8M), "/proc/1", "fail", "h1")
    assert stopped["problem"].startswith("h1: memlock_limit asks for 64 MiB") and "memlock_on_clamp is fail" in stopped["problem"]
    unknown = role_plan("unlimited", {}, "/proc/1", "fail", "h1")
    assert (unknown["systemd_limit"], unknown["pam_value"], unknown["problem"]) == ("infinity", "unlimited", None)
    assert unknown["notes"] == ["/proc/1/limits or /status could not be read: whether systemd can give units "
                                "LimitMEMLOCK=infinity is not checked."]


@pytest.mark.parametrize(
    "args, message",
    [
        (("lots", {}, "/proc/1", "warn", "h1"), "memlock_limit: 'lots' is not a limit"),
        (("64M", _pid1(""), "/proc/1", "warn", "h1"), "/proc/1/limits: "),
    ],
)
def test_memlock_errors_become_filter_errors(args, message):
    with pytest.raises(AnsibleFilterError, match=message):
        _filters("memlock_")["memlock_role_plan"](*args)


# -------------------------------------------------------------- numa_binding


def test_exec_argv_puts_numactl_path_before_the_command():
    instance = {
        "name": "llm0",
        "exec_prefix": ["numactl", "--physcpubind=2-23", "--membind=0"],
        "command": ["/opt/vllm/bin/vllm", "serve"],
    }
    assert plugin.numa_binding_exec_argv(instance, "/usr/bin/numactl") == [
        "/usr/bin/numactl",
        "--physcpubind=2-23",
        "--membind=0",
        "/opt/vllm/bin/vllm",
        "serve",
    ]


def test_exec_argv_without_prefix_is_the_command():
    instance = {"name": "x", "exec_prefix": [], "command": ["/bin/true"]}
    assert plugin.numa_binding_exec_argv(instance, "/usr/bin/numactl") == ["/bin/true"]


def test_exec_argv_needs_a_command():
    with pytest.raises(AnsibleFilterError, match="has no command"):
        plugin.numa_binding_exec_argv({"name": "vendor", "exec_prefix": [], "command": None}, "/usr/bin/numactl")


def test_exec_line_escapes_what_systemd_would_expand():
    line = plugin.numa_binding_exec_line(["/bin/echo", "$HOME", "%h", 'say "hi"', "a\\b"])
    assert line == '"/bin/echo" "$$HOME" "%%h" "say \\"hi\\"" "a\\\\b"'


def test_exec_line_refuses_an_executable_systemd_reads_as_a_prefix():
    with pytest.raises(AnsibleFilterError, match="prefix"):
        plugin.numa_binding_exec_line(["-/bin/true"])


def test_environment_keeps_dollar_and_escapes_specifiers():
    assert plugin.numa_binding_environment("A", 'x $Y %n "q" \\') == '"A=x $Y %%n \\"q\\" \\\\"'


def test_environment_control_characters_are_c_escaped():
    assert plugin.numa_binding_environment("A", "l1\nl2\t\x01") == '"A=l1\\nl2\\t\\x01"'


# ------------------------------------------------------------ drop-in hazards

def _dropin_plan(**instance):
    base = {"name": "vendor", "mode": "dropin", "unit": "vendor.service", "gpus": [0], "command": None}
    base.update(instance)
    return {"instances": [base, {"name": "own", "mode": "service", "unit": "gpunuma-own.service", "gpus": [1]}]}


def test_dropin_hazard_container_launcher_is_refused_unless_the_instance_replaces_the_command():
    inspected = {"vendor.service": {"container_launchers": ["docker run"], "cuda_visible_devices": []}}
    problems = node_plan.dropin_hazards(_dropin_plan(), inspected, "h1")
    assert len(problems) == 1
    assert "h1: gpunuma_instances entry 'vendor' binds unit vendor.service, whose ExecStart= launches a container " \
           "(docker run)" in problems[0]
    assert "numa_binding_allow_dropin_hazards: true" in problems[0]
    assert node_plan.dropin_hazards(_dropin_plan(command=["/srv/run"]), inspected, "h1") == []


def test_dropin_hazard_environment_file_cuda_visible_devices():
    inspected = {"vendor.service": {"container_launchers": [],
                                    "cuda_visible_devices": ["/etc/default/vendor: CUDA_VISIBLE_DEVICES=3",
                                                             "Environment=: CUDA_VISIBLE_DEVICES=0"]}}
    problems = node_plan.dropin_hazards(_dropin_plan(), inspected, "h1")
    assert len(problems) == 1
    assert "EnvironmentFile= sets CUDA_VISIBLE_DEVICES (/etc/default/vendor: CUDA_VISIBLE_DEVICES=3)" in problems[0]
    assert "GPUs 0" in problems[0]
    # The unit's own Environment= is overridden by the drop-in's: not a hazard. CPU-only instances neither.
    only_env = {"vendor.service": {"container_launchers": [], "cuda_visible_devices": ["Environment=: CUDA_VISIBLE_DEVICES=0"]}}
    assert node_plan.dropin_hazards(_dropin_plan(), only_env, "h1") == []
    assert node_plan.dropin_hazards(_dropin_plan(gpus=[]), inspected, "h1") == []
