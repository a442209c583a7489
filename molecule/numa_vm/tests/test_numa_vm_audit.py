"""The binding seen inside the running workers, on the guest's two real NUMA nodes.

The audit (gpunuma_audit_info, the module of playbooks/audit.yml) reads every
process and thread of each instance's unit and the pages of its
/proc/PID/numa_maps. `spill` runs on node 1 with a preferred policy and a
64 MiB arena it wrote at start: at least 98 % of its anonymous pages are on
node 1 and the audit says nothing about it. Then `migratepages` moves its
pages to node 0 (what AutoNUMA or an operator's hand does; a preferred
policy allows node 0): the audit flags it (mem-local-share, the share it
read), and the move back clears it.

pytest collects files in name order: this runs after test_numa_vm.py and
before test_numa_vm_sequence.py, and leaves spill's pages on node 1 again.
"""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

import gpunuma_probe as probe

REPO = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[3]))
INVENTORY = os.environ.get("MOLECULE_INVENTORY_FILE")

pytestmark = pytest.mark.skipif(INVENTORY is None, reason="run by molecule (MOLECULE_INVENTORY_FILE)")


def audit():
    """The guest's gpunuma.audit/v1 report, from the module itself (one ad-hoc call)."""
    env = dict(os.environ, ANSIBLE_LIBRARY=str(REPO / "library"), ANSIBLE_MODULE_UTILS=str(REPO / "module_utils"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="json")
    cmd = ["ansible", "numa-vm", "-i", os.path.dirname(INVENTORY), "-m", "gpunuma_audit_info",
           "-a", json.dumps({"hostname": "numa-vm", "rediscover": False})]
    proc = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    out = json.loads(proc.stdout)
    [result] = [task["hosts"]["numa-vm"] for play in out["plays"] for task in play["tasks"]]
    return result["audit"]


def _spill(report):
    [live] = [i["live"] for i in report["instances"] if i["name"] == "spill"]
    findings = [f for f in report["findings"] if f["instance"] == "spill"]
    return live, findings


def test_the_audit_reads_local_pages_then_flags_pages_moved_off_the_node(host):
    pid = probe.main_pid(host, "spill")
    live, findings = _spill(audit())
    assert live["local_share_anon"] >= 0.98, live
    assert live["processes"] >= 1 and live["threads"] >= 1 and live["threads_off_plan"] == 0, live
    assert [f["id"] for f in findings] == [], findings

    try:
        host.check_output(f"migratepages {pid} {probe.NODE} {probe.OTHER_NODE}")
        by_node = probe.anon_bytes_by_node(host, pid)
        assert by_node.get(probe.OTHER_NODE, 0) > by_node.get(probe.NODE, 0), by_node
        live, findings = _spill(audit())
        assert live["local_share_anon"] < 0.5, live
        [finding] = findings
        assert finding["id"] == "mem-local-share" and finding["actual"] == live["local_share_anon"], finding
        assert f"are on node {probe.NODE}" in finding["message"]
    finally:
        host.run(f"migratepages {pid} {probe.OTHER_NODE} {probe.NODE}")
    deadline = time.monotonic() + 30
    while probe.anon_bytes_by_node(host, pid).get(probe.NODE, 0) < probe.ARENA_BYTES and time.monotonic() < deadline:
        time.sleep(1)
    live, findings = _spill(audit())
    assert live["local_share_anon"] >= 0.98 and findings == [], (live, findings)
