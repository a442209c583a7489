"""Each of gpunuma's default paths on a node is spelled once (common/node_paths.py): the roles' defaults, the
modules' documentation and the metrics collector's options say the same."""

import ast
import pathlib
import re

import pytest
import yaml

from ansible.module_utils.gpunuma.common import node_paths

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]
PATHS = {name: value for name, value in vars(node_paths).items() if name.isupper()}
# A gpunuma path on a node: a whole path below one of gpunuma's own directories.
NODE_PATH_RE = re.compile(r"^/(?:etc|var/lib|run)/gpunuma/[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*$")

# Role variables whose default is one of the node paths, by name.
ROLE_DEFAULTS = {
    ("gpu_topology", "gpu_topology_node_path"): "TOPOLOGY",
    ("gpunuma_state", "gpunuma_state_path"): "STATE",
    ("numa_binding", "numa_binding_plan_path"): "PLAN",
    ("numa_binding", "numa_binding_env_dir"): "ENV_DIR",
    ("gpunuma_metrics", "gpunuma_metrics_plan_path"): "PLAN",
    ("gpunuma_metrics", "gpunuma_metrics_probe_path"): "H2D_PROBE",
    ("gpunuma_metrics", "gpunuma_metrics_audit_path"): "AUDIT",
    ("gpu_validate", "gpu_validate_node_probe_path"): "H2D_PROBE",
    ("kubelet_topology", "kubelet_topology_backup_dir"): "KUBELET_BACKUP_DIR",
}


def _role_defaults(role):
    return yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {}


def _documented_defaults(options, prefix=""):
    for name, spec in (options or {}).items():
        if "default" in spec:
            yield prefix + name, spec["default"]
        yield from _documented_defaults(spec.get("suboptions"), prefix + name + ".")


def _module_docs():
    for path in sorted((ROOT / "library").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DOCUMENTATION" for t in node.targets):
                yield path.name, yaml.safe_load(node.value.value)


def test_the_paths_are_absolute_gpunuma_paths_and_distinct():
    assert PATHS, "node_paths defines no path"
    for name, value in PATHS.items():
        assert NODE_PATH_RE.match(value), (name, value)
    assert len(set(PATHS.values())) == len(PATHS)


@pytest.mark.parametrize("role,var", sorted(ROLE_DEFAULTS))
def test_a_role_default_is_the_node_path(role, var):
    assert _role_defaults(role)[var] == PATHS[ROLE_DEFAULTS[(role, var)]]


def test_no_role_default_spells_a_gpunuma_path_of_its_own():
    """A role default that is a gpunuma node path is one of node_paths' (a new one is added there first)."""
    known = set(PATHS.values())
    for defaults in sorted((ROOT / "roles").glob("*/defaults/main.yml")):
        for var, value in (yaml.safe_load(defaults.read_text()) or {}).items():
            if isinstance(value, str) and NODE_PATH_RE.match(value):
                assert value in known, "%s: %s = %s is not in common/node_paths.py" % (defaults, var, value)


def test_every_documented_module_default_is_the_node_path():
    known = set(PATHS.values())
    seen = 0
    for module, doc in _module_docs():
        for option, default in _documented_defaults(doc.get("options")):
            if isinstance(default, str) and NODE_PATH_RE.match(default):
                seen += 1
                assert default in known, "%s: %s documents %s, not in common/node_paths.py" % (module, option, default)
    assert seen >= 10


def test_the_metrics_collector_spells_the_same_paths():
    text = (ROOT / "roles/gpunuma_metrics/files/gpunuma_metrics.py").read_text()
    spelled = set(re.findall(r'default="(/(?:etc|var/lib|run)/gpunuma/[^"]+)"', text))
    assert spelled == {PATHS["H2D_PROBE"], PATHS["PLAN"], PATHS["AUDIT"]}


def test_the_modules_take_their_defaults_from_node_paths():
    """The argument specs' defaults are the constants (the sanity test holds the documentation to the specs)."""
    from ansible.module_utils.gpunuma.run import converge
    from ansible.module_utils.gpunuma.node import lock
    from ansible.module_utils.gpunuma.plan import state
    from ansible.module_utils.gpunuma.plan import model
    assert (converge.DEFAULT_PATH, converge.DEFAULT_PENDING, converge.DEFAULT_STOPPED) == (
        node_paths.CONVERGED, node_paths.PENDING_RESTARTS, node_paths.STOPPED_FOR_CHANGE)
    assert (lock.DEFAULT_PATH, state.DEFAULT_PATH, model.APPLIED_PLAN_SOURCE) == (
        node_paths.LOCK, node_paths.STATE, node_paths.PLAN)
    for path in (ROOT / "library").glob("*.py"):
        assert not re.search(r'default="/(?:etc|var/lib|run)/gpunuma/', path.read_text()), path.name
