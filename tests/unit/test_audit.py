"""Drift audit core: parsing /proc and unit files, findings per difference."""

import importlib.util
import os

import pytest

from ansible.module_utils.gpunuma import audit
from conftest import REPO_ROOT

_spec = importlib.util.spec_from_file_location(
    "gpunuma_audit_filters", os.path.join(REPO_ROOT, "filter_plugins", "gpunuma.py"))
gpunuma_audit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpunuma_audit)

STATUS = "Name:\tsleep\nCpus_allowed:\tf\nCpus_allowed_list:\t1-3\nMems_allowed_list:\t0\n"
MAPS_BIND = ("55d0 bind:0 file=/usr/bin/sleep mapped=4 N0=4 kernelpagesize_kB=4\n"
             "55d1 bind:0 anon=10 dirty=10 N0=10 kernelpagesize_kB=4\n"
             "7f00 bind:0 file=/lib/libc.so mapped=50 N0=40 N1=10 kernelpagesize_kB=4\n")
LIMITS = ("Limit                     Soft Limit           Hard Limit           Units\n"
          "Max locked memory         4194304              4194304              bytes\n")
ITEM = {"name": "small", "unit": "gpunuma-small.service", "mode": "service", "binding_method": "numactl",
        "cpus": "1-3", "mem_policy": "bind", "mem_nodes": [0],
        "numactl_args": ["--physcpubind=1-3", "--membind=0"], "command": ["/bin/sleep", "infinity"]}
UNIT = ("# gpunuma instance small\n[Service]\nType=exec\n"
        "ExecStart=/usr/bin/numactl --physcpubind=1-3 --membind=0 /bin/sleep infinity\nLimitMEMLOCK=4M\n")


def run(item=ITEM, unit_text=UNIT, status=STATUS, maps=MAPS_BIND, limits=LIMITS, **unit):
    u = {"unit": item["unit"], "path": "/etc/systemd/system/" + item["unit"], "text": unit_text,
         "active": "active", "pid": 42}
    u.update(unit)
    findings, live = audit.audit_instance(item, u, {"status": status, "numa_maps": maps, "limits": limits}, 0.5)
    return [f["id"] for f in findings], findings, live


def test_clean_instance_has_no_findings():
    ids, _, live = run()
    assert ids == []
    assert live["cpus"] == "1-3" and live["mem_policy"] == "bind" and live["mem_nodes"] == [0]
    assert live["local_share"] == pytest.approx(54 / 64.0, abs=1e-3) and live["memlock"] == 4194304


def test_repinned_process_is_cpu_affinity_drift():
    ids, findings, _ = run(status=STATUS.replace("1-3", "0-3"))
    assert ids == ["cpu-affinity"]
    assert findings[0]["expected"] == "1-3" and findings[0]["actual"] == "0-3"


def test_wrong_memory_policy():
    ids, findings, _ = run(maps=MAPS_BIND.replace("bind:0", "prefer:1"))
    assert "mem-policy" in ids
    assert findings[ids.index("mem-policy")]["actual"] == {"policy": "preferred", "nodes": [1]}


def test_edited_unit_is_unit_binding_drift():
    ids, findings, _ = run(unit_text=UNIT.replace("--membind=0", "--interleave=0"))
    assert ids == ["unit-binding"] and "--interleave=0" in findings[0]["message"]


def test_missing_unit_and_stopped_instance():
    ids, _, _ = run(unit_text=None)
    assert ids == ["unit-missing"]
    ids, _, _ = run(active="failed", pid=0)
    assert ids == ["instance-not-running"]


def test_memlock_differs_from_unit():
    ids, findings, _ = run(limits=LIMITS.replace("4194304   ", "65536     "))
    assert ids == ["memlock"] and findings[0]["expected"] == 4194304 and findings[0]["actual"] == 65536


def test_low_local_share_is_a_warning():
    maps = "55d1 bind:0 anon=10 N0=1 N1=9\n"
    ids, findings, live = run(maps=maps)
    assert ids == ["mem-local-share"] and findings[0]["severity"] == "warning" and live["local_share"] == 0.1


def test_extra_dropin_and_pending_reload():
    ids, _, _ = run(extra_dropins=["/etc/systemd/system/gpunuma-small.service.d/override.conf"], need_reload=True)
    assert ids == ["unit-extra-dropin", "unit-reload-pending"]


def test_systemd_binding_method():
    item = dict(ITEM, binding_method="systemd", numactl_args=[], systemd={"CPUAffinity": "1-3", "NUMAPolicy": "bind",
                                                                          "NUMAMask": "0"})
    unit = "[Service]\nExecStart=/bin/sleep infinity\nCPUAffinity=1-3\nNUMAPolicy=bind\nNUMAMask=0\nLimitMEMLOCK=4M\n"
    assert run(item=item, unit_text=unit)[0] == []
    assert run(item=item, unit_text=unit.replace("NUMAMask=0", "NUMAMask=1"))[0] == ["unit-binding"]


def test_parse_helpers():
    assert audit.parse_numa_maps("a default N0=1\nb default N1=3\nc interleave:0-1 N0=1\n")[:2] == ("default", [])
    assert audit.memlock_bytes("64M") == 64 << 20 and audit.memlock_bytes("infinity") == "infinity"
    assert audit.parse_memlock("Max locked memory  unlimited unlimited bytes\n") == "infinity"


def test_status_and_fleet_lines():
    assert audit.status_of([]) == "compliant"
    finding = audit.Finding("cpu-affinity", "error", "x", "small")
    assert audit.status_of([finding]) == "drifted"
    assert audit.status_of([audit.Finding("topology-unverified", "info", "x")]) == "compliant"
    line = gpunuma_audit.gpunuma_audit_line({"hostname": "gpu-a01", "status": "drifted", "findings": [finding]})
    assert "gpu-a01" in line and "cpu-affinity(small)" in line
    metrics = gpunuma_audit.gpunuma_audit_metrics([{"hostname": "gpu-a01", "status": "drifted", "findings": [finding]}],
                                                  ["gpu-b"])
    assert 'gpunuma_audit_compliant{host="gpu-a01"} 0' in metrics
    assert 'gpunuma_audit_unreachable{host="gpu-b"} 1' in metrics
    assert 'gpunuma_audit_findings{host="gpu-a01",id="cpu-affinity",severity="error"} 1' in metrics


def test_kubelet_findings_name_each_setting_and_checkpoint():
    findings = audit.kubelet_findings(
        [{"key": "cpuManagerPolicy", "old": "none", "new": "static"},
         {"key": "reservedSystemCPUs", "old": None, "new": "0-1"}],
        ["/var/lib/kubelet/cpu_manager_state"], profile="strict")
    assert [(f["id"], f["severity"]) for f in findings] == [
        ("kubelet-setting", "error"), ("kubelet-setting", "error"), ("kubelet-checkpoint", "warning")]
    assert findings[0]["message"] == "kubelet cpuManagerPolicy is 'none', profile strict asks for 'static'"
    assert (findings[0]["expected"], findings[0]["actual"]) == ("static", "none")
    assert "reservedSystemCPUs is absent" in findings[1]["message"]
    assert audit.status_of(findings) == "drifted"


def test_kubelet_findings_clean_and_unreadable():
    assert audit.kubelet_findings([], []) == []
    unreadable = audit.kubelet_findings(None, None, problem="config.yaml cannot be read")
    assert [f["id"] for f in unreadable] == ["kubelet-unreadable"]
    assert "config.yaml cannot be read" in unreadable[0]["message"]
