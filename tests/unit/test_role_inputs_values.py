"""Role inputs that would reach a rendered file or a command line are one line, and counts are in range.

A newline in numa_binding_plan_path once became "[Service]\\nExecStartPre=+/bin/sh -c ..." in a unit that
systemd ran as root. Every text option (str, path, list of str) of every role whose inputs site.yml checks
first is refused with a control character, naming the variable; whole-number options have a floor.
"""

import os

import pytest
import yaml

from ansible.module_utils.gpunuma.common import text as textlib
from ansible.module_utils.gpunuma.run import role_inputs
from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

CHECKED_ROLES = ("autonuma", "gpu_topology", "memlock", "numa_binding")


def _options(role):
    with open(os.path.join(REPO_ROOT, "roles", role, "meta", "argument_specs.yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)["argument_specs"]["main"]["options"]


def _text_options():
    for role in CHECKED_ROLES:
        options = _options(role)
        for name, spec in sorted(options.items()):
            kind = spec.get("type", "str")
            if kind in ("str", "path") or (kind == "list" and spec.get("elements", "str") in ("str", "path")):
                yield role, name, spec, options


@pytest.mark.parametrize("role, name, spec, options", list(_text_options()),
                         ids=[n for _, n, _, _ in _text_options()])
@pytest.mark.parametrize("bad", ["x\n[Service]\nExecStartPre=+/bin/sh -c id", "x\r", "a\tb", "x\x00", "x\x7f"])
def test_control_characters_are_refused_in_every_text_option(role, name, spec, options, bad):
    value = [bad] if spec.get("type") == "list" else bad
    problems = role_inputs.input_problems(options, {name: value})
    assert len(problems) == 1 and problems[0].startswith(name + ": "), problems
    assert "control character" in problems[0] and "allowed: one line of printable text" in problems[0]


@pytest.mark.parametrize("name, value, floor", [
    ("numa_binding_settle_seconds", -1, 0),
    ("numa_binding_start_limit_burst", 0, 1),
    ("numa_binding_restart_batch", 0, 1),
    ("numa_binding_journal_lines", -5, 0),
    ("numa_binding_backups_keep", -1, 0),
    ("numa_binding_start_limit_interval_sec", "-3", 0),
])
def test_whole_numbers_have_a_floor(name, value, floor):
    problems = role_inputs.input_problems(_options("numa_binding"), {name: value})
    assert problems == ["%s: %s is below %d; allowed: a whole number %d or more"
                        % (name, textlib.shown(value), floor, floor)]


def test_every_floor_names_a_whole_number_option():
    options = _options("numa_binding")
    assert all(options[name]["type"] == "int" for name in role_inputs.MINIMUMS)


@pytest.mark.parametrize("name, value", [("numa_binding_settle_seconds", 0), ("numa_binding_start_limit_burst", 1),
                                         ("numa_binding_plan_path", "/etc/gpunuma/plan.json"),
                                         ("numa_binding_slice", "gpunuma.slice")])
def test_ordinary_values_pass(name, value):
    assert role_inputs.input_problems(_options("numa_binding"), {name: value}) == []


def test_a_stricter_rule_of_the_role_keeps_its_own_sentence():
    """memlock_users' name rule and autonuma_sysctl_file's pattern refuse newlines in words of their own."""
    assert role_inputs.input_problems(_options("memlock"), {"memlock_users": ["svc\n"]},
                                      refined=("memlock_users",)) == []
    assert role_inputs.input_problems(_options("autonuma"), {"autonuma_sysctl_file": "/etc/sysctl.d/x.conf\n"},
                                      refined=("autonuma_sysctl_file",)) == []


# ------------------------------------------------------------ host file names

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conftest import examples  # noqa: E402


def _unquote(stem):
    """%XX back to bytes: host_file_stem is reversible."""
    out, pos = bytearray(), 0
    while pos < len(stem):
        if stem[pos] == "%":
            out.append(int(stem[pos + 1:pos + 3], 16))
            pos += 3
        else:
            out.extend(stem[pos].encode("ascii"))
            pos += 1
    return out.decode("utf-8")


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.text(min_size=1, max_size=40), min_size=2, max_size=6, unique=True))
def test_host_file_names_are_one_safe_component_and_never_shared(hosts):
    stems = {}
    for host in hosts:
        try:
            stem = role_inputs.host_file_stem(host)
        except role_inputs.RoleInputError as exc:
            assert "too long" in str(exc)
            continue
        assert "/" not in stem and not stem.startswith(".") and stem.isascii() and stem.isprintable()
        assert _unquote(stem) == host
        assert stem not in stems, (host, stems.get(stem))
        stems[stem] = host


@pytest.mark.parametrize("a, b", [("rack1/gpu-a01", "rack1_gpu-a01"), ("rack1 gpu-a01", "rack1_gpu-a01"),
                                  ("gpu%2Fa", "gpu/a"), ("..", "%2E.")])
def test_names_a_replacing_scheme_would_merge_stay_apart(a, b):
    assert role_inputs.host_file_stem(a) != role_inputs.host_file_stem(b)
