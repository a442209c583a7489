"""The roles' controller-side input checks (gpunuma.role_inputs, the validate
entry points' filters) and the controller file name mapping, without Ansible runs."""

import base64
import importlib.util
import json
import os

import pytest
import yaml

from ansible.module_utils.gpunuma.common import seal
from ansible.module_utils.gpunuma.run import role_inputs
from ansible.module_utils.gpunuma.plan.profiles import profile_choice_problem
from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

PROFILES = os.path.join(REPO_ROOT, "policies", "profiles")


def _load():
    path = os.path.join(REPO_ROOT, "filter_plugins", "gpunuma.py")
    spec = importlib.util.spec_from_file_location("gpunuma_inputs_filters", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def options(role):
    """The main entry point's options as the input step reads them (role_inputs.with_template_defaults)."""
    with open(os.path.join(REPO_ROOT, "roles", role, "meta", "argument_specs.yml"), encoding="utf-8") as handle:
        spec = yaml.safe_load(handle)["argument_specs"]["main"]["options"]
    with open(os.path.join(REPO_ROOT, "roles", role, "defaults", "main.yml"), encoding="utf-8") as handle:
        return role_inputs.with_template_defaults(spec, yaml.safe_load(handle) or {})


# ------------------------------------------------------------ file names


@pytest.mark.parametrize(
    "host, stem",
    [
        ("gpu-a01.example.net", "gpu-a01.example.net"),
        ("10.0.0.7", "10.0.0.7"),
        ("fe80::1", "fe80::1"),
        ("../../x", "%2E.%2F..%2Fx"),
        ("..", "%2E."),
        (".hidden", "%2Ehidden"),
        ("a/b", "a%2Fb"),
        ("100%", "100%25"),
        ("node\n", "node%0A"),
        ("nœud", "n%C5%93ud"),
    ],
)
def test_host_file_stem_is_one_safe_component(host, stem):
    assert role_inputs.host_file_stem(host) == stem
    assert "/" not in stem and not stem.startswith(".") and stem not in (".", "..")


def test_host_file_stems_never_collide():
    hosts = ["a/b", "a%2Fb", "a%252Fb", ".a", "%2Ea", "a", "A", "a.", "..a", "%"]
    stems = [role_inputs.host_file_stem(h) for h in hosts]
    assert len(set(stems)) == len(hosts), stems


def test_too_long_host_name_is_refused_with_the_fix():
    with pytest.raises(role_inputs.RoleInputError, match="too long for a controller file name.*ansible_host"):
        role_inputs.host_file_stem("n" * 241)
    assert role_inputs.host_file_stem("n" * 240) == "n" * 240


# ------------------------------------------------------------ spec checks


@pytest.mark.parametrize("role", ["gpu_topology", "numa_binding", "memlock", "autonuma"])
def test_every_option_of_the_spec_is_checked(role):
    """A wrong type for any option of a role's spec is named: the checks come from the spec itself."""
    opts = options(role)
    wrong = {"str": ["a list"], "path": {"a": 1}, "int": "many", "bool": "maybe", "list": "a,b", "dict": "k=v"}
    for name, spec in opts.items():
        kind = spec.get("type", "str")
        if kind == "raw":
            continue
        problems = role_inputs.input_problems(opts, {name: wrong[kind]})
        assert len(problems) == 1 and problems[0].startswith(name + ": "), (name, problems)


def test_defaults_pass():
    for role in ("gpu_topology", "numa_binding", "memlock", "autonuma"):
        opts = options(role)
        values = {n: s["default"] for n, s in opts.items() if "default" in s and "{{" not in str(s["default"])}
        assert role_inputs.input_problems(opts, values) == [], role


def test_problem_names_the_gpunuma_variable_the_user_set():
    opts = options("numa_binding")
    values = {"numa_binding_housekeeping_cores_per_node": "two"}
    set_by_user = {"gpunuma_housekeeping_cores_per_node": "two"}
    assert role_inputs.input_problems(opts, values, set_by_user) == [
        'gpunuma_housekeeping_cores_per_node: "two" is not a core count; allowed: auto, or a whole number 0 or more']
    # Set under the role's own name: that name.
    assert role_inputs.input_problems(opts, values, {})[0].startswith("numa_binding_housekeeping_cores_per_node:")
    assert role_inputs.aliases_of(opts) == ["gpunuma_profile", "gpunuma_instances",
                                            "gpunuma_housekeeping_cores_per_node", "gpunuma_housekeeping_cpus",
                                            "gpunuma_memory_reserve_per_node", "gpunuma_strict_capacity",
                                            "gpunuma_allow_unknown_siblings", "memlock_limit"]


@pytest.mark.parametrize("value", ["auto", 0, 2, "2", "0"])
def test_housekeeping_count_accepts_auto_and_counts(value):
    opts = options("numa_binding")
    assert role_inputs.input_problems(opts, {"numa_binding_housekeeping_cores_per_node": value}) == []


@pytest.mark.parametrize("value", [-1, "-1", "two", "Auto", " 2", True, 1.5, [1], "auto,1"])
def test_housekeeping_count_refuses_the_rest(value):
    opts = options("numa_binding")
    values = {"numa_binding_housekeeping_cores_per_node": value}
    problems = role_inputs.input_problems(opts, values, {"gpunuma_housekeeping_cores_per_node": value})
    assert problems == ["gpunuma_housekeeping_cores_per_node: %s is not a core count; allowed: auto, or a whole "
                        "number 0 or more%s" % (json.dumps(value), "; YAML reads unquoted yes/no/on/off/true/false "
                                                "as booleans" if value is True else "")]


@pytest.mark.parametrize("value", ["0-1,96-97", "0", 3, "", None])
def test_housekeeping_cpus_accepts_lists_and_unset(value):
    opts = options("numa_binding")
    assert role_inputs.input_problems(opts, {"numa_binding_housekeeping_cpus": value}) == []


@pytest.mark.parametrize("value", ["0-1,x", "3-1", [0, 1], True, "99999999", {"a": 1}, "0;1", ","])
def test_housekeeping_cpus_refuses_the_rest(value):
    opts = options("numa_binding")
    values = {"numa_binding_housekeeping_cpus": value}
    (problem,) = role_inputs.input_problems(opts, values, {"gpunuma_housekeeping_cpus": value})
    assert problem.startswith("gpunuma_housekeeping_cpus: %s is not a CPU list" % json.dumps(value)), problem
    assert problem.endswith('allowed: a CPU list like "0-1,96-97" (quoted), or leave it unset'), problem


@pytest.mark.parametrize("value, ok", [("auto", True), ("16G", True), (0, True), ("lots", False),
                                       (-1, False), (True, False)])
def test_memory_reserve_per_node(value, ok):
    opts = options("numa_binding")
    problems = role_inputs.input_problems(opts, {"numa_binding_memory_reserve_per_node": value},
                                          {"gpunuma_memory_reserve_per_node": value})
    if ok:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].startswith(
            "gpunuma_memory_reserve_per_node: %s is not a size" % json.dumps(value)), problems
        assert problems[0].endswith("allowed: auto, bytes as an integer, or a size like 16G")


@pytest.mark.parametrize(
    "name, value, needle",
    [
        ("numa_binding_strict_capacity", False, "quote it"),
        ("numa_binding_restart_policy", False, "quote it"),
        ("numa_binding_instances", "vllm0", "is not a list"),
        ("numa_binding_instances", ["name=x"], "item 0 is text, not a mapping"),
        ("numa_binding_start", "maybe", "is not a boolean"),
        ("numa_binding_settle_seconds", True, "is not a whole number"),
        ("numa_binding_env_dir", "etc/gpunuma/env", "is not an absolute path"),
        ("numa_binding_env_dir", "%h/env", "which systemd expands as a unit specifier"),
        ("numa_binding_unit_dir", "/etc/%n", "which systemd expands as a unit specifier"),
        ("numa_binding_profiles_dir", "policies/%i", "which systemd expands as a unit specifier"),
    ],
)
def test_spec_problem_sentences(name, value, needle):
    (problem,) = role_inputs.input_problems(options("numa_binding"), {name: value})
    # A list's problem names the item, never the whole list (nor the item of a list of mappings: a secret?).
    shown = "" if isinstance(value, list) else " " + json.dumps(value)
    assert problem.startswith(name + ":" + shown) and needle in problem
    if isinstance(value, list):
        assert json.dumps(value) not in problem


def test_every_path_option_is_checked_and_only_controller_paths_may_be_relative():
    """Each role's path options: a node path relative or with %, refused naming it; a controller path may be
    relative. A new path option is a node path unless role_inputs.CONTROLLER_PATHS says otherwise."""
    seen = set()
    for role in sorted(os.listdir(os.path.join(REPO_ROOT, "roles"))):
        for option, spec in options(role).items():
            if (spec or {}).get("type") != "path" or option in seen:
                continue
            seen.add(option)
            (problem,) = role_inputs.input_problems({option: spec}, {option: "/x/%h"})
            assert "unit specifier" in problem, problem
            relative = role_inputs.input_problems({option: spec}, {option: "x/y"})
            assert relative == ([] if option in role_inputs.CONTROLLER_PATHS
                                else ["%s: \"x/y\" is not an absolute path; allowed: a path on the node starting with /"
                                      % option]), relative
    assert role_inputs.CONTROLLER_PATHS <= seen


@pytest.mark.parametrize("value", ["2", 2, "+2", 2.0])
def test_int_spellings_ansible_accepts_pass(value):
    assert role_inputs.input_problems(options("numa_binding"), {"numa_binding_settle_seconds": value}) == []


# ------------------------------------------------------------ profile, sizes, names


def test_unquoted_off_gets_the_fix():
    problem = profile_choice_problem(False, PROFILES)
    assert problem.startswith("gpunuma_profile: false is not a known profile")
    assert 'quote it: gpunuma_profile: "off"' in problem and "allowed: strict, preferred, interleave, off" in problem


@pytest.mark.parametrize("value", ["strict\n", "Strict", "../off", "", " strict"])
def test_profile_must_match_a_file_name_whole(value):
    problem = profile_choice_problem(value, PROFILES)
    assert problem and "is not a known profile" in problem and repr(value) in problem


@pytest.mark.parametrize("value", ["strict", "preferred", "interleave", "off"])
def test_shipped_profiles_pass(value):
    assert profile_choice_problem(value, PROFILES) is None


plugin = _load()


@pytest.mark.parametrize("value", ["64GiB", "1.5G", "64G", "8k", 1048576, "unlimited", "infinity"])
def test_memlock_sizes_are_the_parser_grammar(value):
    assert plugin.memlock_limit_problem(value) is None


@pytest.mark.parametrize("value", [0, "0", "0K", "1000", "1.5K", "lots", "99999999999E", -1, True])
def test_memlock_sizes_refused_name_the_value(value):
    problem = plugin.memlock_limit_problem(value)
    assert problem and problem.startswith("memlock_limit: ") and "allowed" in problem


@pytest.mark.parametrize("users", [["svc\n"], ["a b"], ["@g"], ["-x"], [5]])
def test_memlock_user_names_match_whole(users):
    problems = plugin.memlock_input_problems({}, {"memlock_limit": "unlimited", "memlock_users": users, "memlock_groups": []})
    assert len(problems) == 1 and problems[0].startswith("memlock_users: ")


# ------------------------------------------------------------ state files


def _b64(text):
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


@pytest.mark.parametrize(
    "content, needle",
    [
        ("", "is empty"),
        ("{", "is not valid JSON"),
        ("[1]", "holds a JSON list"),
        ('{"schema": "gpunuma.topology/v1"}', 'is not a gpunuma.plan/v1 document (schema: "gpunuma.topology/v1")'),
        (b"\xff\xfe", "is not UTF-8 text"),
    ],
)
def test_damaged_state_file_is_a_sentence_naming_the_file(content, needle):
    result = seal.read_state_file(_b64(content), "n1:/etc/gpunuma/plan.json", "gpunuma.plan/v1", "Move it aside.")
    assert result["data"] is None
    assert result["problem"].startswith("n1:/etc/gpunuma/plan.json ") and needle in result["problem"]
    assert result["problem"].endswith("It is left as it is. Move it aside.")


def test_good_state_file_is_read():
    plan = seal.seal({"schema": "gpunuma.plan/v1", "instances": []})
    result = seal.read_state_file(_b64(json.dumps(plan)), "p", "gpunuma.plan/v1", "")
    assert result == {"data": plan, "problem": None}


def test_a_state_file_without_its_checksum_is_refused():
    plan = {"schema": "gpunuma.plan/v1", "instances": []}
    result = seal.read_state_file(_b64(json.dumps(plan)), "p", "gpunuma.plan/v1", "Move it aside.")
    assert result["data"] is None
    assert result["problem"].startswith("p carries no checksum") and result["problem"].endswith("Move it aside.")
