#!/usr/bin/env python3
"""Assemble the gpunuma.fleet collection from the repository.

The repository keeps the playbook layout (ansible.cfg, library/,
module_utils/, filter_plugins/, roles/, playbooks/, policies/). This script
lays the same files out as a collection under
``build/ansible_collections/gpunuma/fleet`` (docs/collection.md):

* ``library/*.py``            -> ``plugins/modules/``
* ``module_utils/gpunuma/``   -> ``plugins/module_utils/gpunuma/``
* ``filter_plugins/*.py``     -> ``plugins/filter/``
* ``action_plugins/*.py``     -> ``plugins/action/`` (links copied as files)
* ``doc_fragments/*.py``      -> ``plugins/doc_fragments/``
* ``roles/``, ``playbooks/``, ``policies/``, ``LICENSE``, ``README.md``
* ``galaxy.yml``, ``meta/runtime.yml``, ``meta/execution-environment.yml``,
  ``requirements.txt``, ``bindep.txt``, ``CHANGELOG.md`` and ``changelogs/`` from
  ``collections/ansible_collections/gpunuma/fleet/``.

Only the Python import lines change: ``ansible.module_utils.gpunuma`` becomes
``ansible_collections.gpunuma.fleet.plugins.module_utils.gpunuma`` (how a
collection's plugins import its module_utils), a module's documentation
fragment gets its full name, and the filter plugin's module_utils path set-up
(only a checkout needs it) goes. Roles and playbooks are copied unchanged:
they already call the filters by their full names.

Usage: .venv/bin/python scripts/build-collection.py [--out DIR] [--tarball]
  --out DIR   the directory that receives ansible_collections/ (default build/)
  --tarball   also run `ansible-galaxy collection build` into DIR
              (gpunuma-fleet-<version>.tar.gz); prints its path last.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import yaml

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(REPO_ROOT, "collections", "ansible_collections", "gpunuma", "fleet")
NAMESPACE, NAME = "gpunuma", "fleet"
PREFIX = "ansible_collections.%s.%s.plugins.module_utils" % (NAMESPACE, NAME)

IMPORT = re.compile(r"\bansible\.module_utils\.gpunuma\b")
# filter_plugins/gpunuma.py: the block that puts the configured module_utils
# path on ansible.module_utils (a collection's plugins import theirs directly).
PATH_SETUP = re.compile(
    r"# Controller-side plugins do not get the configured module_utils path.*?\n\n(?=from )", re.S)
# A documentation fragment of doc_fragments/ named in a module's extends_documentation_fragment.
FRAGMENT = re.compile(r"^(\s+- )((?:%s)(?:\.\w+)?)$" % "|".join(
    sorted(os.path.splitext(name)[0] for name in os.listdir(os.path.join(REPO_ROOT, "doc_fragments"))
           if name.endswith(".py"))), re.M)


def rewrite_python(text, kind):
    """``text`` of a Python file with its gpunuma imports as a collection's (``kind``: modules, filter, ...)."""
    text = IMPORT.sub(PREFIX + ".gpunuma", text)
    if kind in ("filter", "action"):
        text, count = PATH_SETUP.subn("", text)
        if count != 1:
            raise SystemExit("build-collection: the module_utils path set-up of a %s plugin was not found; "
                             "update PATH_SETUP in %s" % (kind, __file__))
        text = text.replace("import ansible.module_utils\n", "")
        if not re.search(r"\bC\.", text):  # still used beyond the path set-up: kept
            text = text.replace("from ansible import constants as C\n", "")
        text = text.replace("  # noqa: E402", "")
    if kind == "modules":
        text = FRAGMENT.sub(r"\g<1>%s.%s.\2" % (NAMESPACE, NAME), text)
    return text


def copy_python_tree(src, dst, kind):
    for directory, subdirs, files in os.walk(src):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
        target = os.path.join(dst, os.path.relpath(directory, src))
        os.makedirs(target, exist_ok=True)
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(directory, name), encoding="utf-8") as handle:
                text = handle.read()
            with open(os.path.join(target, name), "w", encoding="utf-8") as handle:
                handle.write(rewrite_python(text, kind))


def copy_tree(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".ansible"), symlinks=False)


def _users(name):
    """The roles and playbooks that call filter ``name`` (by its full name)."""
    found = set()
    for top in ("roles", "playbooks"):
        for directory, _dirs, files in os.walk(os.path.join(REPO_ROOT, top)):
            for file_name in files:
                if file_name.endswith((".yml", ".j2")):
                    with open(os.path.join(directory, file_name), encoding="utf-8") as handle:
                        if "gpunuma.fleet.%s" % name in handle.read():
                            rel = os.path.relpath(directory, REPO_ROOT).split(os.sep)
                            found.add("role %s" % rel[1] if rel[0] == "roles" else "playbooks/%s" % file_name)
    return sorted(found)


def filter_docs():
    """``{filter name: its documentation (YAML text)}``, from each filter's docstring and signature.

    The filters are the roles' own steps, not a general-purpose library: each
    document says so and names the roles and playbooks that call it, so
    ansible-doc, Galaxy and Automation Hub list them as what they are.
    """
    import inspect

    spec = importlib.util.spec_from_file_location("gpunuma_filters_doc", os.path.join(REPO_ROOT, "filter_plugins", "gpunuma.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    docs = {}
    for name, function in sorted(module.FilterModule().filters().items()):
        function = inspect.unwrap(function)
        lines = [" ".join(p.split()) for p in (inspect.getdoc(function) or name).split("\n\n")]
        params = list(inspect.signature(function).parameters.values())
        users = _users(name)
        options = {"_input": {"description": "The value the filter is applied to (%s)." % params[0].name,
                              "type": "raw", "required": True}}
        for param in params[1:]:
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            option = {"description": "The filter's argument %s (see the description)." % param.name, "type": "raw"}
            if param.default is param.empty:
                option["required"] = True
            elif param.default is None or isinstance(param.default, (bool, int, float, str)):
                option["default"] = param.default
            options[param.name] = option
        doc = {
            "name": name,
            "author": ["gpunuma maintainers"],
            "short_description": lines[0].rstrip(".")[:150] or name,
            "description": lines + ["Internal to gpunuma.fleet: a step of %s, not a stable interface."
                                    % (", ".join(users) or "the collection's roles")],
            "positional": ", ".join(p.name for p in params[1:] if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)),
            "options": options,
        }
        if not doc["positional"]:
            del doc["positional"]
        example = "# As %s calls it:\nresult: \"{{ value | gpunuma.fleet.%s%s }}\"\n" % (
            users[0] if users else "the roles", name,
            "(%s)" % ", ".join(p.name for p in params[1:] if p.default is p.empty
                               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)) if len(params) > 1 else "")
        docs[name] = yaml.safe_dump({"DOCUMENTATION": doc, "EXAMPLES": example,
                                     "RETURN": {"_value": {"description": "What the filter computes (see the "
                                                                          "description).", "type": "raw"}}},
                                    sort_keys=False, width=110)
    return docs


def build(out):
    root = os.path.join(out, "ansible_collections", NAMESPACE, NAME)
    if os.path.isdir(root):
        shutil.rmtree(root)
    os.makedirs(os.path.join(root, "meta"))
    shutil.copy(os.path.join(SOURCE, "galaxy.yml"), root)
    shutil.copy(os.path.join(SOURCE, "meta", "runtime.yml"), os.path.join(root, "meta"))
    shutil.copy(os.path.join(SOURCE, "CHANGELOG.md"), root)
    # The release notes as data (antsibull-changelog): the released versions and the next one's fragments.
    copy_tree(os.path.join(SOURCE, "changelogs"), os.path.join(root, "changelogs"))
    # What an execution environment installs for the collection (ansible-builder).
    shutil.copy(os.path.join(SOURCE, "meta", "execution-environment.yml"), os.path.join(root, "meta"))
    for name in ("requirements.txt", "bindep.txt"):
        shutil.copy(os.path.join(SOURCE, name), root)
    for name in ("LICENSE", "README.md"):
        shutil.copy(os.path.join(REPO_ROOT, name), root)
    copy_python_tree(os.path.join(REPO_ROOT, "library"), os.path.join(root, "plugins", "modules"), "modules")
    copy_python_tree(os.path.join(REPO_ROOT, "module_utils"), os.path.join(root, "plugins", "module_utils"),
                     "module_utils")
    copy_python_tree(os.path.join(REPO_ROOT, "filter_plugins"), os.path.join(root, "plugins", "filter"), "filter")
    for name, text in filter_docs().items():
        with open(os.path.join(root, "plugins", "filter", "%s.yml" % name), "w", encoding="utf-8") as handle:
            handle.write(text)
    copy_python_tree(os.path.join(REPO_ROOT, "action_plugins"), os.path.join(root, "plugins", "action"), "action")
    copy_python_tree(os.path.join(REPO_ROOT, "doc_fragments"), os.path.join(root, "plugins", "doc_fragments"),
                     "doc_fragments")
    for name in ("roles", "playbooks", "policies"):
        copy_tree(os.path.join(REPO_ROOT, name), os.path.join(root, name))
    return root


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "build"))
    parser.add_argument("--tarball", action="store_true")
    args = parser.parse_args(argv)
    root = build(os.path.abspath(args.out))
    print(root)
    if args.tarball:
        with open(os.path.join(root, "galaxy.yml"), encoding="utf-8") as handle:
            version = yaml.safe_load(handle)["version"]
        galaxy = os.path.join(os.path.dirname(sys.executable), "ansible-galaxy")
        subprocess.run([galaxy, "collection", "build", "--force", "--output-path", os.path.abspath(args.out), root],
                       check=True, stdout=subprocess.DEVNULL)
        print(os.path.join(os.path.abspath(args.out), "%s-%s-%s.tar.gz" % (NAMESPACE, NAME, version)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
