"""docs/role-variables.md is generated from the roles' argument specs and kept current."""

import glob
import importlib.util
import os
import re
import shutil

import pytest
import yaml

from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

SCRIPT = os.path.join(REPO_ROOT, "scripts", "gen-role-docs.py")
DOC = os.path.join(REPO_ROOT, "docs", "role-variables.md")
ROLES = os.path.join(REPO_ROOT, "roles")

_spec = importlib.util.spec_from_file_location("gen_role_docs", SCRIPT)
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)


def test_role_variables_doc_is_what_the_script_generates():
    with open(DOC, encoding="utf-8") as handle:
        committed = handle.read()
    assert committed == gen.render(ROLES), (
        "docs/role-variables.md differs from the roles' meta/argument_specs.yml; regenerate it: %s" % gen.COMMAND
    )


def test_every_role_has_its_generated_readme():
    """Galaxy and Automation Hub refuse a collection with a role that has no README.md."""
    generated = gen.outputs(ROLES)
    roles = sorted(name for name in os.listdir(ROLES) if os.path.isdir(os.path.join(ROLES, name)))
    assert len(roles) >= 10
    for role in roles:
        rel = os.path.join("roles", role, "README.md")
        assert rel in generated, role
        with open(os.path.join(REPO_ROOT, rel), encoding="utf-8") as handle:
            assert handle.read() == generated[rel], "%s is out of date; regenerate it: %s" % (rel, gen.COMMAND)
        assert "name: gpunuma.fleet.%s" % role in generated[rel]


def test_every_role_entry_point_and_variable_is_documented():
    text = gen.render(ROLES)
    specs = gen.load_specs(ROLES)
    assert {role for role, _ in specs} >= {"numa_binding", "memlock", "autonuma", "gpu_topology"}
    for role, entry_points in specs:
        assert "\n## %s\n" % role in text
        for entry_point, spec in entry_points.items():
            section = text.split("\n### %s: %s\n" % (role, entry_point), 1)[1].split("\n### ", 1)[0]
            for name in (spec.get("options") or {}):
                assert "| `%s` |" % name in section, (role, entry_point, name)


def test_autonuma_default_is_auto_in_the_spec_the_defaults_and_the_doc():
    with open(os.path.join(ROLES, "autonuma", "defaults", "main.yml"), encoding="utf-8") as handle:
        defaults = yaml.safe_load(handle)
    spec = gen.load_specs(ROLES)
    options = dict(spec)["autonuma"]["main"]["options"]
    assert defaults["autonuma_numa_balancing"] == options["autonuma_numa_balancing"]["default"] == "auto"
    assert options["autonuma_numa_balancing"]["choices"] == ["auto", 0, 1, None]
    with open(DOC, encoding="utf-8") as handle:
        assert "| `autonuma_numa_balancing` | raw | `auto` | `auto`, `0`, `1`, `null` |" in handle.read()


def _copy_role(tmp_path, role="memlock"):
    roles = tmp_path / "roles"
    shutil.copytree(os.path.join(ROLES, role, "meta"), roles / role / "meta")
    return roles


def test_a_changed_spec_changes_the_doc(tmp_path):
    roles = _copy_role(tmp_path)
    before = gen.render(str(roles))
    path = roles / "memlock" / "meta" / "argument_specs.yml"
    data = yaml.safe_load(path.read_text())
    data["argument_specs"]["main"]["options"]["memlock_on_clamp"]["default"] = "fail"
    path.write_text(yaml.safe_dump(data))
    after = gen.render(str(roles))
    assert "| `memlock_on_clamp` | str | `warn` | `warn`, `fail` |" in before
    assert "| `memlock_on_clamp` | str | `fail` | `warn`, `fail` |" in after


def test_row_shows_type_elements_default_choices_and_description(tmp_path):
    roles = tmp_path / "roles"
    (roles / "demo" / "meta").mkdir(parents=True)
    (roles / "demo" / "meta" / "argument_specs.yml").write_text(yaml.safe_dump({"argument_specs": {"main": {
        "short_description": "Demo role",
        "options": {
            "demo_names": {"type": "list", "elements": "str", "default": [], "description": ["First.", "Second | more."]},
            "demo_mode": {"type": "str", "choices": ["a", "b"], "description": "Mode."},
            "demo_must": {"type": "int", "required": True, "description": "Needed."},
        },
    }, "check": {"short_description": "Checks only", "options": {}}}}))
    text = gen.render(str(roles))
    assert "### demo: main\n\nDemo role\n" in text
    assert "| `demo_names` | list of str | `[]` | - | First.<br>Second \\| more. |" in text
    assert "| `demo_mode` | str | - | `a`, `b` | Mode. |" in text
    assert "| `demo_must` | int | required | - | Needed. |" in text
    assert "### demo: check\n\nChecks only\n\nNo variables.\n" in text


def test_check_mode_reports_a_stale_doc(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gen, "REPO_ROOT", str(tmp_path))
    shutil.copytree(os.path.join(ROLES, "memlock", "meta"), tmp_path / "roles" / "memlock" / "meta")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "role-variables.md").write_text("stale\n")
    assert gen.main(["--check"]) == 1
    assert gen.COMMAND in capsys.readouterr().err
    assert (tmp_path / "docs" / "role-variables.md").read_text() == "stale\n"
    assert gen.main([]) == 0
    assert gen.main(["--check"]) == 0
    assert "| `memlock_limit` |" in (tmp_path / "docs" / "role-variables.md").read_text()


def _literal(value):
    """A default that is data, not a template or null (those cannot be spelt in a spec)."""
    return value is not None and not (isinstance(value, str) and "{{" in value)


def _role_defaults():
    out = {}
    for role in sorted(os.listdir(ROLES)):
        path = os.path.join(ROLES, role, "defaults", "main.yml")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as handle:
                for name, value in (yaml.safe_load(handle) or {}).items():
                    out[name] = (role, value)
    return out


def test_role_defaults_are_the_argument_specs_defaults():
    """What docs/role-variables.md shows as a default is what the role uses, a template's text included."""
    specs = {}
    for role, entry_points in gen.load_specs(ROLES):
        for spec in entry_points.values():
            for name, option in (spec.get("options") or {}).items():
                specs[name] = option
    wrong = []
    for name, (role, value) in sorted(_role_defaults().items()):
        if value is None or name.startswith("__"):
            continue  # null: the same as no default in an argument spec
        option = specs.get(name)
        if option is not None and "default" not in option and isinstance(value, str) and "{{" in value \
                and "Defaults to C(%s)" % value in " ".join(gen._paragraphs(option.get("description"))):
            continue  # a template of a list, mapping or bool: stated in the description (antsibull-docs' schema)
        if option is None or option.get("default", "<none>") != value:
            wrong.append("%s/%s: defaults/main.yml has %r, the argument spec %r"
                         % (role, name, value, None if option is None else option.get("default", "<none>")))
    assert wrong == [], "\n".join(wrong)


def test_example_knobs_are_commented_out_at_their_defaults():
    """inventory/group_vars/all.yml says every commented knob shows its default: hold it to that."""
    defaults = _role_defaults()
    wrong = []
    with open(os.path.join(REPO_ROOT, "inventory", "group_vars", "all.yml"), encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.startswith("# ") or ":" not in line:
                continue
            name, _, text = line[2:].partition(":")
            if name not in defaults or not text.strip():
                continue
            try:
                shown = yaml.safe_load(text)
            except yaml.YAMLError:
                continue
            role, value = defaults[name]
            if _literal(value) and shown != value:
                wrong.append("line %d: %s shows %r, the %s default is %r" % (number, name, shown, role, value))
    assert wrong == [], "\n".join(wrong)


def _playbook_spec():
    with open(os.path.join(REPO_ROOT, "playbooks", "vars", "argument_specs.yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)["argument_specs"]


def test_every_variable_a_playbook_reads_with_a_default_has_a_spec_with_that_default():
    """A gpunuma_* variable a playbook reads as ``name | default(X)`` is a user input: it is specified (playbooks/
    vars/argument_specs.yml or a role's spec) with the default X, so docs/role-variables.md lists it."""
    import re

    role_vars = {}
    for path in glob.glob(os.path.join(REPO_ROOT, "roles", "*", "meta", "argument_specs.yml")):
        with open(path, encoding="utf-8") as handle:
            for entry in (yaml.safe_load(handle).get("argument_specs") or {}).values():
                role_vars.update((entry or {}).get("options") or {})
    playbook_vars = {}
    for entry in _playbook_spec().values():
        for name, option in (entry.get("options") or {}).items():
            playbook_vars.setdefault(name, []).append(option)
    # Internal facts a play sets for the next one (never a user's input).
    internal = {"gpunuma_plan", "gpunuma_effective_profile", "gpunuma_summary_after_apply", "gpunuma_audit_targets"}
    literal = re.compile(r"\b(gpunuma_[a-z_]+) \| default\(('[^']*'|\d+|true|false)\)")
    seen, problems = set(), []
    for path in sorted(glob.glob(os.path.join(REPO_ROOT, "playbooks", "*.yml"))):
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        for name, default in literal.findall(text):
            if name in internal or name in role_vars:
                continue
            seen.add(name)
            value = default.strip("'") if default.startswith("'") else yaml.safe_load(default)
            specs = playbook_vars.get(name)
            if not specs:
                problems.append("%s: %s has no spec" % (os.path.basename(path), name))
            elif not any(str(spec.get("default")) == str(value) for spec in specs):
                problems.append("%s: %s defaults to %r, its spec says %r"
                                % (os.path.basename(path), name, value, [s.get("default") for s in specs]))
    assert problems == [], "\n".join(problems)
    # The scan sees the playbooks' own knobs (a broken pattern would pass vacuously).
    assert {"gpunuma_serial", "gpunuma_lock_timeout", "gpunuma_target", "gpunuma_validate_hosts"} <= seen
    documented = open(os.path.join(REPO_ROOT, "docs", "role-variables.md"), encoding="utf-8").read()
    for name in playbook_vars:
        assert "`%s`" % name in documented, name


def test_role_metadata_claims_only_what_the_suite_runs():
    """galaxy_info platforms: Debian releases the suite runs each role on, nothing else; the core floor is
    meta/runtime.yml's."""
    with open(os.path.join(REPO_ROOT, "tests", "molecule", "test_scenarios.py"), encoding="utf-8") as handle:
        other_releases = set(re.findall(r'"(bullseye|trixie)"', handle.read()))
    with open(os.path.join(REPO_ROOT, "playbooks", "site.yml"), encoding="utf-8") as handle:
        site = handle.read()
    for name in ("preflight.yml", "provision.yml"):
        with open(os.path.join(REPO_ROOT, "playbooks", name), encoding="utf-8") as handle:
            site += handle.read()
    with open(os.path.join(REPO_ROOT, "collections", "ansible_collections", "gpunuma", "fleet", "meta",
                           "runtime.yml"), encoding="utf-8") as handle:
        floor = yaml.safe_load(handle)["requires_ansible"].lstrip(">=").rsplit(".", 1)[0]
    for path in sorted(glob.glob(os.path.join(ROLES, "*", "meta", "main.yml"))):
        role = path.split(os.sep)[-3]
        with open(path, encoding="utf-8") as handle:
            info = yaml.safe_load(handle)["galaxy_info"]
        assert info["min_ansible_version"] == floor, role
        # site.yml's roles run in molecule default on every release it names; the others on bookworm only.
        in_site = "name: %s\n" % role in site
        allowed = {"bookworm"} | (other_releases if in_site and role != "kubelet_topology" else set())
        assert [p["name"] for p in info["platforms"]] == ["Debian"], role
        assert set(info["platforms"][0]["versions"]) <= allowed, (role, info["platforms"], allowed)
