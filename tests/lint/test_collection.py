"""The gpunuma.fleet collection (docs/collection.md): built from the checkout,
installed as a user installs it, run from outside the repository, and
``ansible-test sanity`` on it with no finding and no ignore file."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.lint

BINDIR = os.path.dirname(sys.executable)
RECORDED = os.path.join(FIXTURES, "recorded", "h200-vm")


def _clean_env(**extra):
    """The environment of a user outside the checkout: no ANSIBLE_* of the suite, no repository ansible.cfg."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(PATH=BINDIR + os.pathsep + env.get("PATH", ""), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    env.update(extra)
    return env


def _files(top):
    out = set()
    for root, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        out.update(os.path.relpath(os.path.join(root, name), top) for name in files)
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(tarball, install path, collection dir) of a fresh build installed with ansible-galaxy."""
    out = tmp_path_factory.mktemp("build")
    proc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "scripts", "build-collection.py"), "--tarball",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tarball = proc.stdout.strip().splitlines()[-1]
    assert os.path.basename(tarball).startswith("gpunuma-fleet-") and os.path.isfile(tarball)
    install = tmp_path_factory.mktemp("collections")
    user = tmp_path_factory.mktemp("user-project")
    proc = subprocess.run([os.path.join(BINDIR, "ansible-galaxy"), "collection", "install", "-p", str(install),
                           tarball], cwd=str(user), env=_clean_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    collection = install / "ansible_collections" / "gpunuma" / "fleet"
    assert (collection / "MANIFEST.json").is_file(), proc.stdout
    return tarball, install, collection, user


def test_the_built_collection_imports_its_own_module_utils(installed):
    _tarball, _install, collection, _user = installed
    layout = _files(str(collection))
    for path in ("plugins/modules/gpunuma_apply.py", "plugins/module_utils/gpunuma/plan/planner.py",
                 "plugins/filter/gpunuma.py", "plugins/doc_fragments/gpunuma_lock.py",
                 "roles/numa_binding/tasks/main.yml",
                 "playbooks/site.yml", "policies/rules", "meta/runtime.yml", "LICENSE", "MANIFEST.json"):
        assert path in layout or os.path.isdir(os.path.join(str(collection), path)), path
    for rel in sorted(p for p in layout if p.endswith(".py")):
        with open(os.path.join(str(collection), rel), encoding="utf-8") as handle:
            text = handle.read()
        # A checkout's import left in the collection would only work beside a checkout.
        assert not re.search(r"\bansible\.module_utils\.gpunuma\b", text), rel
        assert "DEFAULT_MODULE_UTILS_PATH" not in text, rel
    with open(os.path.join(str(collection), "plugins", "modules", "gpunuma_apply.py"), encoding="utf-8") as handle:
        assert "- gpunuma.fleet.gpunuma_lock" in handle.read()
    # No sanity ignore file ships: every finding is fixed, none waived.
    assert not [p for p in layout if p.startswith("tests/sanity/ignore")]


def test_a_user_plans_with_the_installed_collection_from_outside_the_repository(installed, tmp_path):
    _tarball, install, collection, user = installed
    before = _files(str(collection))
    state = tmp_path / "state"
    instances = [{"name": "llm0", "gpus": [0], "command": ["/bin/true"], "memory": "2G"}]
    proc = subprocess.run(
        [os.path.join(BINDIR, "ansible-playbook"), "-i", "gpu-a01,", "-c", "local", "gpunuma.fleet.plan",
         "-e", "ansible_python_interpreter=" + sys.executable,
         "-e", "gpu_topology_sysfs_root=" + os.path.join(RECORDED, "sysfs"),
         "-e", "gpu_topology_nvml_dump=" + os.path.join(RECORDED, "nvml-dump.json"),
         "-e", json.dumps({"gpunuma_instances": instances})],
        cwd=str(user), env=_clean_env(ANSIBLE_COLLECTIONS_PATH=str(install), XDG_STATE_HOME=str(state)),
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    # The collection's playbook keeps its output in the user's state directory, not in the collection.
    with open(state / "gpunuma" / "topology" / "gpu-a01.plan.json", encoding="utf-8") as handle:
        plan = json.load(handle)
    (instance,) = plan["instances"]
    assert instance["name"] == "llm0" and instance["gpus"] == [0] and instance["mem_policy"] == "bind"
    assert (state / "gpunuma" / "topology" / "gpu-a01.json").is_file()
    assert _files(str(collection)) == before
    assert not os.listdir(str(user))


def test_the_collection_declares_its_controller_dependencies(installed):
    """ruamel.yaml (the kubelet role's merge) is declared for an execution environment, and the suite's pin meets it."""
    from packaging.requirements import Requirement

    _tarball, _install, collection, _user = installed
    ee = (collection / "meta" / "execution-environment.yml").read_text()
    assert "python: requirements.txt" in ee and "system: bindep.txt" in ee
    assert (collection / "bindep.txt").is_file()
    declared = [Requirement(line) for line in (collection / "requirements.txt").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert [r.name for r in declared] == ["ruamel.yaml"]
    with open(os.path.join(REPO_ROOT, "requirements.txt"), encoding="utf-8") as handle:
        (pin,) = [line.split("==")[1].strip() for line in handle if line.startswith("ruamel.yaml==")]
    assert declared[0].specifier.contains(pin), (declared[0], pin)


def test_the_release_notes_lint_and_generate_the_committed_changelog(tmp_path):
    """changelogs/ passes antsibull-changelog's lint, and CHANGELOG.md is what it generates from them."""
    import shutil

    source = os.path.join(REPO_ROOT, "collections", "ansible_collections", "gpunuma", "fleet")
    tool = os.path.join(BINDIR, "antsibull-changelog")
    copy = tmp_path / "fleet"
    shutil.copytree(source, copy, symlinks=True)
    for argv in ([tool, "lint"], [tool, "lint-changelog-yaml", "changelogs/changelog.yaml"], [tool, "generate"]):
        proc = subprocess.run(argv, cwd=str(copy), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and not proc.stdout.strip(), (argv, proc.stdout + proc.stderr)
    with open(os.path.join(source, "CHANGELOG.md"), encoding="utf-8") as handle:
        assert (copy / "CHANGELOG.md").read_text() == handle.read(), "regenerate: antsibull-changelog generate"
    assert os.listdir(os.path.join(source, "changelogs", "fragments")), "the next release's changes are fragments"


def test_galaxy_importer_accepts_the_tarball(installed, tmp_path):
    """What Galaxy and Automation Hub run on an upload: the import passes (role READMEs, documented filters, lint).

    Its ansible-test run needs a container registry, which this machine cannot reach; scripts/sanity.sh runs
    ansible-test sanity on the same build (test_ansible_test_sanity_finds_nothing).
    """
    tarball, _install, _collection, _user = installed
    config = tmp_path / "galaxy-importer.cfg"
    config.write_text("[galaxy-importer]\nRUN_ANSIBLE_TEST = False\nRUN_ANSIBLE_LINT = True\n")
    proc = subprocess.run([sys.executable, "-m", "galaxy_importer.main", tarball], cwd=str(tmp_path),
                          env=_clean_env(GALAXY_IMPORTER_CONFIG=str(config)), capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "ERROR" not in out, out[-6000:]
    # Every filter is documented (ansible-doc lists each) and every role has its README.
    assert "No role readme found" not in out and "Error running ansible-doc" not in out, out[-6000:]


def test_antsibull_docs_lint_passes_on_the_build(installed):
    """Every module, filter and role argument spec is documentation antsibull-docs accepts."""
    _tarball, install, collection, _user = installed
    proc = subprocess.run([os.path.join(BINDIR, "antsibull-docs"), "lint-collection-docs", "--plugin-docs", "."],
                          cwd=str(collection), env=_clean_env(ANSIBLE_COLLECTIONS_PATH=str(install)),
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and ":0:0:" not in out, out[-6000:]


def _examples():
    """``{module: its EXAMPLES text}`` of every module in library/."""
    import ast

    out = {}
    for name in sorted(os.listdir(os.path.join(REPO_ROOT, "library"))):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(REPO_ROOT, "library", name), encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
        for node in tree.body:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "EXAMPLES":
                out[name[:-3]] = node.value.value
    return out


def test_every_modules_examples_paste_into_a_playbook_of_the_installed_collection(installed, tmp_path):
    """Each module's EXAMPLES, as the tasks of a play in a user's project, parse and resolve (FQCNs)."""
    _tarball, install, _collection, user = installed
    examples = _examples()
    assert len(examples) >= 15, sorted(examples)
    for module, text in examples.items():
        assert "gpunuma.fleet.%s:" % module in text, module
        play = tmp_path / ("%s.yml" % module)
        indented = "\n".join(("    " + line) if line.strip() else "" for line in text.strip("\n").splitlines())
        play.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n%s\n" % indented)
        proc = subprocess.run([os.path.join(BINDIR, "ansible-playbook"), "--syntax-check", "-i", "localhost,",
                               str(play)], cwd=str(user), env=_clean_env(ANSIBLE_COLLECTIONS_PATH=str(install)),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (module, proc.stdout[-2000:] + proc.stderr[-2000:])


def _filters():
    spec = importlib.util.spec_from_file_location("gpunuma_filters_collection",
                                                  os.path.join(REPO_ROOT, "filter_plugins", "gpunuma.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_output_dir_is_beside_the_playbook_except_in_an_installed_collection(tmp_path):
    output_dir = _filters().gpunuma_output_dir
    assert output_dir("/srv/fleet/playbooks", "topology", {}) == "/srv/fleet/playbooks/../topology"
    shipped = "/home/sre/.ansible/collections/ansible_collections/gpunuma/fleet/playbooks"
    assert output_dir(shipped, "audit", {"XDG_STATE_HOME": "/var/state"}) == "/var/state/gpunuma/audit"
    assert output_dir(shipped, "audit", {}) == os.path.join(os.path.expanduser("~"), ".local", "state", "gpunuma",
                                                              "audit")
    # A link into a collection counts as the collection.
    (tmp_path / "ansible_collections" / "x" / "y" / "playbooks").mkdir(parents=True)
    os.symlink(tmp_path / "ansible_collections" / "x" / "y" / "playbooks", tmp_path / "link")
    assert output_dir(str(tmp_path / "link"), "validation", {"XDG_STATE_HOME": "/s"}) == "/s/gpunuma/validation"


def _ansible_test_version(core):
    venv = os.path.join(REPO_ROOT, ".venv") if core == "2.21" else os.path.join(REPO_ROOT, ".venv", "cores", core)
    proc = subprocess.run([os.path.join(venv, "bin", "ansible"), "--version"], capture_output=True, text=True)
    return proc.stdout.replace("core ", "ansible-core ", 1)


@pytest.mark.parametrize("core", ["2.21", "2.20"])
def test_ansible_test_sanity_finds_nothing(core):
    """ansible-test sanity of every supported ansible-core, each with its own Python, no ignore file."""
    proc = subprocess.run([os.path.join(REPO_ROOT, "scripts", "sanity.sh"), "--core", core], cwd=REPO_ROOT,
                          env=_clean_env(), capture_output=True, text=True, timeout=1800)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    assert "ansible-core %s" % core in _ansible_test_version(core), _ansible_test_version(core)
    assert not os.path.exists(os.path.join(REPO_ROOT, "tests", "sanity")), "a sanity ignore file"
    assert not re.search(r"^ERROR: ", out, re.M), out[-8000:]
    ran = set(re.findall(r'^Running sanity test "([\w-]+)"', out, re.M))
    # The tests that matter for modules ran (none skipped for a missing requirement).
    assert {"validate-modules", "pylint", "pep8", "yamllint", "ansible-doc", "import", "compile"} <= ran, ran
    assert "Skipping sanity test" not in out, out[-4000:]
