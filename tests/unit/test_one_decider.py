"""One decision, one place: the AutoNUMA container test and live-write rule.

The autonuma role (through gpunuma_node_info) and the audit
(gpunuma_audit_info) must agree about a node: a Podman container that the
role treats as a container and the audit as a host would be flagged as drift
by the audit on every run. Both ask ``autonuma.detect_container`` and
``autonuma.write_live``; these tests fail if a marker list or a live-write
rule appears anywhere else, and check the two paths give the same answer for
every marker.
"""

import os
import re

import pytest

from ansible.module_utils.gpunuma.node import autonuma
from ansible.module_utils.gpunuma.node.probe import autonuma_probe
from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

SEARCHED = ("library", "module_utils", "roles", "playbooks", "filter_plugins")


def _files():
    for top in SEARCHED:
        for dirpath, dirnames, filenames in os.walk(os.path.join(REPO_ROOT, top)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for name in filenames:
                if name.endswith((".py", ".yml", ".yaml", ".j2")):
                    yield os.path.join(dirpath, name)


def test_container_markers_are_named_in_one_place():
    owner = os.path.join(REPO_ROOT, "module_utils", "gpunuma", "node", "autonuma.py")
    pattern = re.compile(r"\.dockerenv|\.containerenv|run/systemd/container")
    elsewhere = [os.path.relpath(path, REPO_ROOT) for path in _files()
                 if path != owner and pattern.search(open(path, encoding="utf-8").read())]
    assert elsewhere == [], "container markers decided outside gpunuma.node.autonuma: %s" % elsewhere


def test_irqbalance_environment_files_are_named_in_one_place():
    """node/housekeeping.py's IRQBALANCE_ENV_FILES: the role reads them by that list and maps them back with it."""
    owner = os.path.join(REPO_ROOT, "module_utils", "gpunuma", "node", "housekeeping.py")
    pattern = re.compile(r"/etc/(default|sysconfig)/irqbalance")
    # A role's argument spec may mention them in a description (documentation, not a decision).
    elsewhere = [os.path.relpath(path, REPO_ROOT) for path in _files()
                 if path != owner and not path.endswith("argument_specs.yml")
                 and pattern.search(open(path, encoding="utf-8").read())]
    assert elsewhere == [], "irqbalance environment files named outside gpunuma.node.housekeeping: %s" % elsewhere


def test_irqbalance_reads_map_back_to_every_environment_file():
    import base64

    from ansible.module_utils.gpunuma.node import housekeeping

    reads = housekeeping.irqbalance_env_reads()
    assert sorted(reads.values()) == sorted(housekeeping.IRQBALANCE_ENV_FILES)
    files = {name: {"exists": True, "content": base64.b64encode(("IRQBALANCE_BANNED_CPULIST=%d\n" % i).encode()).decode()}
             for i, name in enumerate(sorted(reads))}
    texts = housekeeping.irqbalance_env_read_texts(files)
    assert sorted(texts) == sorted(housekeeping.IRQBALANCE_ENV_FILES)
    assert all(text.startswith("IRQBALANCE_BANNED_CPULIST=") for text in texts.values())
    assert housekeeping.irqbalance_env_read_texts({}) == {path: "" for path in housekeeping.IRQBALANCE_ENV_FILES}


def test_kubelet_checkpoint_paths_are_made_in_one_place():
    """The paths of the kubelet's checkpoints (what the plan reads, what the change removes and keeps) are joined
    from kubelet/change.CHECKPOINTS; the Memory Manager check's script is installed whole and names its own."""
    owners = {os.path.join(REPO_ROOT, "module_utils", "gpunuma", "kubelet", name)
              for name in ("change.py", "plan.py", "dra.py", "memory_checkpoint.py")}
    pattern = re.compile(r"/(cpu|memory|dra)_manager_state")
    elsewhere = [os.path.relpath(path, REPO_ROOT) for path in _files()
                 if path not in owners and pattern.search(open(path, encoding="utf-8").read())]
    assert elsewhere == [], "kubelet checkpoint paths made outside gpunuma.kubelet: %s" % elsewhere


def test_no_other_live_write_rule():
    # The old YAML rule and the audit's own test, in any spelling.
    pattern = re.compile(r"not\s+__autonuma_node\.in_container|numa_balancing_live\"?\]?\s*==\s*\"auto\"")
    found = [os.path.relpath(path, REPO_ROOT) for path in _files()
             if pattern.search(open(path, encoding="utf-8").read())]
    assert found == []


@pytest.mark.parametrize("marker", autonuma.CONTAINER_MARKERS + (None,))
@pytest.mark.parametrize("detect_virt_rc", [0, 1, None])
def test_role_probe_and_audit_agree(marker, detect_virt_rc, tmp_path, monkeypatch):
    present = {marker} if marker else set()
    monkeypatch.setattr(os.path, "lexists", lambda path: path in present)
    proc = tmp_path / "numa_balancing"
    proc.write_text("1\n")

    def runner(argv):
        if argv[0] == "systemd-detect-virt":
            return detect_virt_rc, "", ""
        return 1, "", ""

    # What the role reads (gpunuma_node_info's autonuma probe with the role's spec, no markers of its own).
    role_view = autonuma_probe(runner, {"proc_path": str(proc)})["in_container"]
    # What the audit reads (gpunuma_audit_info).
    audit_view, _ = autonuma.detect_container(runner)
    expected = marker is not None or detect_virt_rc == 0
    assert role_view is audit_view is expected
    for apply_live in (None, "auto", True, False, "yes", "no"):
        assert autonuma.write_live(apply_live, role_view) == autonuma.write_live(apply_live, audit_view)


@pytest.mark.parametrize("apply_live, in_container, write", [
    (None, False, True), (None, True, False), ("auto", True, False), (True, True, True),
    ("yes", True, True), (False, False, False), ("no", False, False),
])
def test_write_live(apply_live, in_container, write):
    assert autonuma.write_live(apply_live, in_container)[0] is write


def test_write_live_refuses_garbage_naming_the_variable():
    from ansible.module_utils.gpunuma.common.errors import GpunumaError
    with pytest.raises(GpunumaError, match="autonuma_apply_live: 'sometimes' is not allowed; allowed: null"):
        autonuma.write_live("sometimes", False)
