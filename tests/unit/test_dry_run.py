"""plan.yml's "what site.yml would change" (run/dry_run.py) from check-mode results shaped as the steps return them."""

import pytest

from ansible.module_utils.gpunuma.run import dry_run

pytestmark = pytest.mark.unit

APPLY = {
    "changed": True,
    "account": {"name": "gpunuma", "created": True, "changed": True},
    "files": [{"path": "/etc/systemd/system/gpunuma-a.service", "changed": True, "created": True},
              {"path": "/etc/systemd/system/gpunuma-b.service", "changed": True, "created": False},
              {"path": "/etc/sysctl.d/60-gpunuma-numa-balancing.conf", "changed": False, "created": False}],
    "removed": ["/etc/systemd/system/gpunuma-old.service"],
    "restarted": ["gpunuma-b.service"], "started": ["gpunuma-a.service"],
    "state_record": {"changed": True, "state": {"profile": "preferred"}, "corrupt": None},
}
KUBELET = {"changed": True, "files": [{"path": "/var/lib/kubelet/config.yaml", "changed": True, "created": False}],
           "removed": ["/var/lib/kubelet/cpu_manager_state"], "stopped_for_change": ["kubelet.service"],
           "restarted": [], "started": []}


def test_every_step_says_what_it_would_do_in_the_order_site_runs_them():
    pairs = dry_run.changes({"numactl": {"changed": True}, "autonuma": {"write_live": True, "value": 0},
                             "kubelet": KUBELET, "apply": APPLY})
    assert pairs == [
        ("install", "the numactl package"),
        ("sysctl", "kernel.numa_balancing=0, live"),
        ("write", "/var/lib/kubelet/config.yaml"),
        ("remove", "/var/lib/kubelet/cpu_manager_state"),
        ("stop", "the kubelet: kubelet.service, for its change, then start it"),
        ("create", "account gpunuma"),
        ("write", "/etc/systemd/system/gpunuma-a.service (new)"),
        ("write", "/etc/systemd/system/gpunuma-b.service"),
        ("remove", "/etc/systemd/system/gpunuma-old.service"),
        ("restart", "gpunuma-b.service"),
        ("start", "gpunuma-a.service"),
        ("record", "profile preferred in the node's state"),
    ]


def test_unchanged_files_and_skipped_or_missing_steps_say_nothing():
    skipped = {"skipped": True, "changed": True, "files": [{"path": "/x", "changed": True}]}
    assert dry_run.changes({"numactl": {"skipped": True, "changed": False}, "memlock": skipped,
                            "autonuma": {"write_live": False, "value": 0}, "kubelet": None,
                            "apply": {"changed": False, "files": [{"path": "/y", "changed": False}], "removed": []}}) == []
    assert dry_run.changes({}) == []


def test_the_table_has_one_line_per_change_and_says_nothing_for_a_converged_host():
    lines = dry_run.table([{"host": "gpu-a01", "results": {"apply": APPLY}},
                           {"host": "gpu-a02-long-name", "results": {"apply": {"files": [], "removed": []}}}])
    assert lines[0].split()[:2] == ["HOST", "CHANGE"]
    assert [line.split()[:2] for line in lines[1:]] == [["gpu-a01", "create"], ["gpu-a01", "write"],
                                                        ["gpu-a01", "write"], ["gpu-a01", "remove"],
                                                        ["gpu-a01", "restart"], ["gpu-a01", "start"],
                                                        ["gpu-a01", "record"], ["gpu-a02-long-name", "nothing"]]
    # The columns line up under the longest host name.
    assert len({line.index(line.split()[1]) for line in lines}) == 1
