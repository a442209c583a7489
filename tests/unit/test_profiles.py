"""Profiles as data: the shipped ladder, the file reader and validation."""

import os

import pytest
import yaml

from ansible.module_utils.gpunuma.plan import profiles
from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.plan.profiles import ProfileError
from conftest import REPO_ROOT, plant

pytestmark = pytest.mark.unit

PROFILES_DIR = os.path.join(REPO_ROOT, "policies", "profiles")
SHIPPED = ["strict", "preferred", "interleave", "off"]


def write_profile(directory, name, text):
    path = os.path.join(str(directory), name + ".yml")
    with open(path, "w") as handle:
        handle.write(text)
    return path


def good(name="custom", **fields):
    data = {"name": name, "cpu_binding": "node", "mem_policy": "bind", "next": None}
    data.update(fields)
    return data


def test_shipped_ladder_order():
    assert profiles.list_profiles(PROFILES_DIR) == SHIPPED


@pytest.mark.parametrize(
    "name, cpu_binding, mem_policy, mem_scope, nxt",
    [
        ("strict", "node", "bind", "instance", "preferred"),
        ("preferred", "node", "preferred", "instance", "interleave"),
        ("interleave", "node", "interleave", "all_cpu_nodes", "off"),
        ("off", "none", "default", "instance", None),
    ],
)
def test_shipped_profiles(name, cpu_binding, mem_policy, mem_scope, nxt):
    profile = profiles.load_profile(name, PROFILES_DIR)
    assert profile["name"] == name
    assert profile["cpu_binding"] == cpu_binding
    assert profile["mem_policy"] == mem_policy
    assert profile["mem_scope"] == mem_scope
    assert profile["next"] == nxt
    assert profile["description"]


@pytest.mark.parametrize("name", SHIPPED)
def test_reader_agrees_with_pyyaml_on_shipped_files(name):
    path = os.path.join(PROFILES_DIR, name + ".yml")
    with open(path) as handle:
        text = handle.read()
    assert profiles.parse_profile_text(text) == yaml.safe_load(text)


@pytest.mark.parametrize(
    "text",
    [
        "name: x\nnext: off\n",
        "name: 'it''s'\nflag: yes\ncount: 1_000\nempty:\ntilde: ~\n",
        '---\n# comment\nname: "a # not a comment"  # a comment\nnext: null\n',
        "a: true\nb: False\nc: ON\nd: no\ne: -3\nf: plain words here\n",
    ],
)
def test_reader_agrees_with_pyyaml_on_subset(text):
    assert profiles.parse_profile_text(text) == yaml.safe_load(text)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("name: x\n  indented: 1\n", "indented lines are not supported"),
        ("name: [a, b]\n", "is not a plain scalar"),
        ("name: x\nname: y\n", "appears twice"),
        ("just text\n", "is not a 'key: value' line"),
        ('name: "open\n', "unterminated double-quoted string"),
        ('name: "a\\"b"\n', "escapes and inner quotes are not supported"),
    ],
)
def test_reader_rejects_outside_subset(text, needle):
    with pytest.raises(ProfileError) as info:
        profiles.parse_profile_text(text, source="p.yml")
    assert needle in str(info.value)
    assert "p.yml line" in str(info.value)


def test_validate_fills_mem_scope_and_description():
    profile = profiles.validate_profile(good())
    assert profile == {
        "name": "custom",
        "description": "",
        "cpu_binding": "node",
        "mem_policy": "bind",
        "mem_scope": "instance",
        "next": None,
    }


@pytest.mark.parametrize(
    "data, needle",
    [
        (
            good(mem_policy="membind"),
            "profile.mem_policy: 'membind' is not allowed; allowed: bind, preferred, interleave, default",
        ),
        (good(cpu_binding="socket"), "profile.cpu_binding: 'socket' is not allowed; allowed: node, none"),
        (
            good(mem_scope="everything", mem_policy="interleave"),
            "profile.mem_scope: 'everything' is not allowed; allowed: instance, all_cpu_nodes",
        ),
        (good(mem_scope="all_cpu_nodes"), "profile.mem_scope: 'all_cpu_nodes' only applies to mem_policy interleave"),
        (good(next=False), "profile.next: False is not a profile name (unquoted off/on/yes/no"),
        (good(name="Strict!"), "profile.name: 'Strict!' is not a profile name"),
        (good(next="custom"), "profile.next: 'custom' points at itself"),
        (good(colour="red"), "profile.colour: unknown field; allowed: name, description"),
        (good(description=3), "profile.description: must be a string"),
        ({"name": "x"}, "profile.cpu_binding: missing"),
        ("strict", "profile: must be a mapping"),
    ],
)
def test_validate_rejects(data, needle):
    with pytest.raises(ProfileError) as info:
        profiles.validate_profile(data)
    assert needle in str(info.value)
    assert isinstance(info.value, GpunumaError)


def test_validate_collects_every_problem():
    with pytest.raises(ProfileError) as info:
        profiles.validate_profile({"name": "x", "cpu_binding": "socket", "mem_policy": "membind", "extra": 1})
    problems = info.value.problems
    assert len(problems) == 4
    assert str(info.value).splitlines() == problems


def test_unknown_profile_lists_available():
    with pytest.raises(ProfileError) as info:
        profiles.load_profile("strictest", PROFILES_DIR)
    assert "unknown profile 'strictest'" in str(info.value)
    assert "allowed: interleave, off, preferred, strict" in str(info.value)


@pytest.mark.parametrize("name", ["../strict", "", None, "Strict"])
def test_profile_name_must_be_a_plain_name(name):
    with pytest.raises(ProfileError) as info:
        profiles.load_profile(name, PROFILES_DIR)
    assert "is not a profile name" in str(info.value)


def test_file_name_must_match_profile_name(tmp_path):
    write_profile(tmp_path, "fast", "name: slow\ncpu_binding: node\nmem_policy: bind\nnext: null\n")
    with pytest.raises(ProfileError) as info:
        profiles.load_profile("fast", str(tmp_path))
    assert "does not match the file name fast.yml" in str(info.value)


def test_missing_directory():
    with pytest.raises(ProfileError) as info:
        profiles.load_profile("strict", "/nonexistent/profiles")
    assert "none found in /nonexistent/profiles" in str(info.value)
    with pytest.raises(ProfileError):
        profiles.list_profiles("/nonexistent/profiles")


def test_ladder_of_a_custom_set(tmp_path):
    write_profile(tmp_path, "b", "name: b\ncpu_binding: node\nmem_policy: preferred\nnext: c\n")
    write_profile(tmp_path, "a", "name: a\ncpu_binding: node\nmem_policy: bind\nnext: b\n")
    write_profile(tmp_path, "c", "name: c\ncpu_binding: none\nmem_policy: default\nnext: null\n")
    assert profiles.list_profiles(str(tmp_path)) == ["a", "b", "c"]


def test_ladder_rejects_dangling_next():
    with pytest.raises(ProfileError) as info:
        profiles.ladder({"a": good("a", next="zzz")})
    assert "profile a.next: 'zzz' is not a known profile; allowed: a, or null" in str(info.value)


def test_ladder_rejects_loops():
    with pytest.raises(ProfileError) as info:
        profiles.ladder({"a": good("a", next="b"), "b": good("b", next="a")})
    assert "loops back" in str(info.value)


@pytest.mark.parametrize("text, base, variant", [
    ("strict", "strict", None), ("strict-cpu-only", "strict", "cpu-only"), ("preferred-cpu-only", "preferred", "cpu-only"),
    ("off", "off", None), ("cpu-only", "cpu-only", None), (None, None, None), (3, None, None),
])
def test_profile_name_record(text, base, variant):
    name = profiles.ProfileName.parse(text)
    assert (name.base, name.variant) == (base, variant)
    assert profiles.base_profile(text) == base
    if isinstance(text, str):
        assert str(name) == text


def test_profile_variant_is_written_and_read_by_one_record():
    assert profiles.profile_variant("strict", "cpu-only") == "strict-cpu-only"
    assert profiles.base_profile(profiles.profile_variant("interleave", profiles.CPU_ONLY)) == "interleave"
    with pytest.raises(profiles.ProfileError, match="allowed: cpu-only"):
        profiles.profile_variant("strict", "gpu-only")


def test_no_other_place_spells_the_variant_suffix():
    """The "-cpu-only" spelling lives in gpunuma.plan.profiles alone."""
    import os
    import re
    from conftest import REPO_ROOT
    owner = os.path.join(REPO_ROOT, "module_utils", "gpunuma", "plan", "profiles.py")
    found = []
    for top in ("library", "module_utils", "roles", "playbooks", "filter_plugins"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(REPO_ROOT, top)):
            for name in filenames:
                path = os.path.join(dirpath, name)
                if path == owner or not name.endswith((".py", ".yml", ".j2")):
                    continue
                code = "\n".join(line.split("#")[0] for line in open(path, encoding="utf-8"))
                if re.search(r"""["'][^"'\n]*-cpu-only""", code):
                    found.append(os.path.relpath(path, REPO_ROOT))
    assert found == []


@pytest.mark.parametrize("kind", ["fifo", "huge"])
def test_a_profile_that_is_no_page_of_yaml_is_named_never_read_to_its_end(tmp_path, kind):
    path = tmp_path / "fast.yml"
    plant(path, kind, profiles.MAX_PROFILE_BYTES)
    with pytest.raises(profiles.ProfileError) as caught:
        profiles.load_profile("fast", str(tmp_path))
    assert "profile fast: cannot read %s" % path in str(caught.value)
