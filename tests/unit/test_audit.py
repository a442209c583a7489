"""Drift audit core: parsing /proc and unit files, findings per difference."""

import importlib.util
import os

import pytest

from ansible.module_utils.gpunuma.verify import audit
from ansible.module_utils.gpunuma.verify import proc_texts
from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

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


def run(item=ITEM, unit_text=UNIT, status=STATUS, maps=MAPS_BIND, limits=LIMITS, more=None, share=0.5, **unit):
    u = {"unit": item["unit"], "path": "/etc/systemd/system/" + item["unit"], "text": unit_text,
         "active": "active", "pid": 42}
    u.update(unit)
    proc = {"status": status, "numa_maps": maps, "limits": limits}
    proc.update(more or {})
    findings, live = audit.audit_instance(item, u, proc, share)
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
    assert proc_texts.parse_numa_maps("a default N0=1\nb default N1=3\nc interleave:0-1 N0=1\n")[:2] == ("default", [])
    assert proc_texts.memlock_bytes("64M") == 64 << 20 and proc_texts.memlock_bytes("infinity") == "infinity"
    assert proc_texts.parse_memlock("Max locked memory  unlimited unlimited bytes\n") == "infinity"


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


# -- kernel.numa_balancing: autonuma_numa_balancing decided as the autonuma role does ----------------

def _audit_module(capsys, **args):
    """gpunuma_audit_info run in this process; its result."""
    import json

    from ansible.module_utils.testing import patch_module_args

    spec = importlib.util.spec_from_file_location("gpunuma_audit_info", os.path.join(REPO_ROOT, "library",
                                                                                     "gpunuma_audit_info.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    capsys.readouterr()
    with patch_module_args(dict({"hostname": "gpu-a01", "rediscover": False}, **args)), pytest.raises(SystemExit):
        module.main()
    return json.loads(capsys.readouterr().out)


def _proc_copy(tmp_path, live="1", release="5.4.0-1234-aws"):
    kernel = tmp_path / "proc" / "sys" / "kernel"
    kernel.mkdir(parents=True)
    (kernel / "numa_balancing").write_text(live + "\n")
    if release is not None:
        (kernel / "osrelease").write_text(release + "\n")
    return str(tmp_path / "proc")


def test_live_report_carries_the_nodes_kernel_release(tmp_path, capsys):
    result = _audit_module(capsys, plan_path=str(tmp_path / "plan.json"), numa_balancing_file=str(tmp_path / "nb.conf"))
    assert not result.get("failed"), result
    assert result["audit"]["numa_balancing"]["kernel_release"] == os.uname().release
    # A copy of procfs (a support bundle, a test) carries its own osrelease.
    result = _audit_module(capsys, plan_path=str(tmp_path / "plan.json"), proc_root=_proc_copy(tmp_path),
                           numa_balancing_file=str(tmp_path / "nb.conf"))
    assert result["audit"]["numa_balancing"]["kernel_release"] == "5.4.0-1234-aws"


@pytest.mark.parametrize("release", ["5.4.0-1234-aws", "4.18.0-553.el8_10.x86_64", None])
def test_module_auto_on_an_old_or_unknown_kernel_expects_0(tmp_path, capsys, release):
    conf = tmp_path / "nb.conf"
    conf.write_text("kernel.numa_balancing = 1\n")
    result = _audit_module(capsys, plan_path=str(tmp_path / "plan.json"), proc_root=_proc_copy(tmp_path, "1", release),
                           numa_balancing="auto", numa_balancing_profile="strict", numa_balancing_file=str(conf),
                           numa_balancing_live="yes")
    section = result["audit"]["numa_balancing"]
    assert (section["expected"], section["live"], section["file"], section["kernel_release"]) == (0, "1", "1", release)
    drift = [(f["id"], f["expected"], f["actual"]) for f in result["audit"]["findings"] if f["id"] != "plan-missing"]
    assert drift == [("numa-balancing-file", 0, "1"), ("numa-balancing-live", 0, "1")]
    assert result["audit"]["status"] == "drifted"


def test_module_auto_on_5_12_or_later_is_not_checked(tmp_path, capsys):
    conf = tmp_path / "nb.conf"
    conf.write_text("kernel.numa_balancing = 1\n")
    result = _audit_module(capsys, plan_path=str(tmp_path / "plan.json"), proc_root=_proc_copy(tmp_path, "1", "6.1.0-28-amd64"),
                           numa_balancing="auto", numa_balancing_file=str(conf), numa_balancing_live="yes")
    section = result["audit"]["numa_balancing"]
    assert section["expected"] is None and section["kernel_release"] == "6.1.0-28-amd64"
    assert "5.12" in section["reason"]
    assert [f["id"] for f in result["audit"]["findings"]] == ["plan-missing"]


def test_module_refuses_a_setting_that_is_not_one(tmp_path, capsys):
    result = _audit_module(capsys, plan_path=str(tmp_path / "plan.json"), numa_balancing="off")
    assert result["failed"] and "numa_balancing: 'off' is not allowed" in result["msg"]


@pytest.mark.parametrize("setting,profile,release,expected", [
    ("auto", "strict", "5.4.0-1234-aws", 0),         # an old kernel: 0, as the role writes it
    ("auto", "interleave", "5.11.0", 0),
    ("auto", "strict", "garbage", 0),                # unreadable release: 0, as the role decides it
    ("auto", "strict", None, 0),
    ("auto", "strict", "5.12.0", None),              # 5.12 or later: left alone, not checked
    ("auto", "preferred", "6.8.0-45-generic", None),
    ("auto", "off", "4.19.0", None),                 # profile off: handed back
    ("auto", False, "4.19.0", None),                 # an unquoted off read by YAML
    (0, "strict", "6.8.0", 0),
    ("1", "strict", "4.19.0", 1),
    (None, "strict", "4.19.0", None),
])
def test_numa_balancing_expected_is_the_roles_decision(setting, profile, release, expected):
    assert audit.numa_balancing_expected(setting, profile, release)[0] == expected


@pytest.mark.parametrize("setting", [True, "off", "2", "Auto", [0]])
def test_numa_balancing_setting_refuses_other_values(setting):
    with pytest.raises(ValueError, match="allowed: auto, 0, 1, or null"):
        audit.numa_balancing_setting(setting)


def test_numa_balancing_findings():
    assert audit.numa_balancing_findings(None, "1", "1", "/etc/sysctl.d/x.conf", True) == []
    assert audit.numa_balancing_findings(0, "0", "0", "/etc/sysctl.d/x.conf", True) == []
    (missing,) = audit.numa_balancing_findings(0, "0", None, "/etc/sysctl.d/x.conf", True)
    assert missing["id"] == "numa-balancing-file" and "nothing (missing)" in missing["message"]
    # In a container the live value is the host's: only the file is compared.
    assert [f["id"] for f in audit.numa_balancing_findings(0, "1", "0", "/x.conf", False)] == []
    assert [f["id"] for f in audit.numa_balancing_findings(0, "1", "0", "/x.conf", True)] == ["numa-balancing-live"]


def _every_process(maps_by_pid, threads):
    """What gpunuma_audit_info hands over for a unit: pages of every process by kind, every thread's CPUs."""
    from ansible.module_utils.gpunuma.verify import metrics

    pages = {"anon": {}, "file": {}}
    for maps in maps_by_pid.values():
        metrics.add_numa_maps(pages, maps)
    return {"pages": pages, "threads": threads, "pids": sorted(maps_by_pid)}


def test_the_share_is_judged_on_what_every_process_allocated_not_on_the_page_cache():
    # The main process is all local; its worker child (43) allocated 90 % of its pages on node 1.
    worker = "7e00 bind:0 anon=100 N0=10 N1=90 kernelpagesize_kB=4\n"
    more = _every_process({42: MAPS_BIND, 43: worker}, {42: "1-3", 43: "1-3"})
    ids, findings, live = run(more=more, share=audit.MIN_LOCAL_SHARE)
    assert ids == ["mem-local-share"], findings
    assert live["local_share_anon"] == pytest.approx(20 / 110.0, abs=1e-3) and live["processes"] == 2
    assert "of the anonymous pages of its 2 processes are on node 0" in findings[0]["message"]
    # Page cache on the other node (libc read first by another process) is no finding: anon is all local.
    cache = "7f00 bind:0 file=/lib/libc.so mapped=50 N1=50 kernelpagesize_kB=4\n55d1 bind:0 anon=10 N0=10\n"
    ids, _, live = run(more=_every_process({42: cache}, {42: "1-3"}), share=audit.MIN_LOCAL_SHARE)
    assert ids == [] and live["local_share_anon"] == 1.0 and live["local_share_file"] == 0.0


def test_default_share_is_98_percent():
    assert audit.MIN_LOCAL_SHARE == 0.98
    at = "55d1 bind:0 anon=100 N0=98 N1=2\n"
    below = "55d1 bind:0 anon=100 N0=97 N1=3\n"
    assert run(more=_every_process({42: at}, {}), share=audit.MIN_LOCAL_SHARE)[0] == []
    assert run(more=_every_process({42: below}, {}), share=audit.MIN_LOCAL_SHARE)[0] == ["mem-local-share"]


def test_a_thread_re_pinned_after_start_is_thread_affinity_drift():
    # Main thread 42 on the plan's CPUs; thread 44 and the child's thread 50 re-pinned.
    threads = {42: "1-3", 43: "1,2,3", 44: "0-7", 50: "5"}
    ids, findings, live = run(more=_every_process({42: MAPS_BIND}, threads))
    assert ids == ["thread-affinity"], findings
    assert findings[0]["actual"] == {"44": "0-7", "50": "5"}
    assert "2 of 4 threads may run on other CPUs than the plan's 1-3: 44 on 0-7, 50 on 5" in findings[0]["message"]
    assert live["threads"] == 4 and live["threads_off_plan"] == 2
    # The main thread's own drift is cpu-affinity's, not repeated.
    ids, _, _ = run(status=STATUS.replace("1-3", "0-3"), more=_every_process({42: MAPS_BIND}, {42: "0-3"}))
    assert ids == ["cpu-affinity"]


def test_damaged_plan_is_one_finding_naming_its_fields(tmp_path, capsys):
    """plan.json read through the plan's one schema: a damaged one says which fields, and nothing else is judged."""
    plan = tmp_path / "plan.json"
    plan.write_text('{"schema": "gpunuma.plan/v1", "profile": "strict", "instances": [{"name": "a", "cpus": 5}]}')
    result = _audit_module(capsys, plan_path=str(plan), numa_balancing_file=str(tmp_path / "nb.conf"))
    (finding,) = [f for f in result["audit"]["findings"] if f["id"] == "plan-unreadable"]
    assert finding["severity"] == "error"
    assert "plan.instances[0].cpus: 5 is not a string or null" in finding["message"]
    assert "plan.instances[0].unit: missing" in finding["message"]
    assert result["audit"]["instances"] == [] and result["audit"]["status"] == "drifted"


# ------------------------------------------------------------ memlock: the plan's decision and what the worker holds


def test_the_unit_limit_is_judged_against_the_plans_decision():
    item = dict(ITEM, limit_memlock=4 << 20)
    assert run(item=item)[0] == []
    ids, findings, _ = run(item=dict(item, limit_memlock="infinity"))
    assert ids == ["memlock-unit"] and findings[0]["expected"] == "infinity" and findings[0]["actual"] == 4 << 20
    assert "sets LimitMEMLOCK=4M, the plan decided infinity" in findings[0]["message"]
    # The unit lost its line: the process still runs with 4M (no restart yet), the file no longer says so.
    ids, findings, _ = run(item=item, unit_text=UNIT.replace("LimitMEMLOCK=4M\n", ""))
    assert ids == ["memlock-unit"] and findings[0]["actual"] is None


def test_a_drop_in_without_a_decided_limit_sets_none():
    item = dict(ITEM, mode="dropin", limit_memlock=None)
    assert "memlock-unit" not in run(item=item, unit_text=UNIT.replace("LimitMEMLOCK=4M\n", ""))[0]
    ids, _, _ = run(item=item)
    assert "memlock-unit" in ids


def test_a_plan_without_the_decision_is_not_judged():
    assert "memlock-unit" not in run(unit_text=UNIT.replace("LimitMEMLOCK=4M", "LimitMEMLOCK=8M"))[0]


@pytest.mark.parametrize("locked_kb, pinned_kb, warned", [
    (0, 0, False), (3800, 0, False), (3900, 0, True), (1000, 3000, True), (0, 4096, True), (2000, 1800, False)])
def test_a_worker_at_its_memlock_limit_is_warned(locked_kb, pinned_kb, warned):
    status = STATUS + "VmLck:\t%8d kB\nVmPin:\t%8d kB\n" % (locked_kb, pinned_kb)
    ids, findings, live = run(status=status)
    assert live["locked_bytes"] == locked_kb * 1024 and live["pinned_bytes"] == pinned_kb * 1024
    assert ("memlock-at-limit" in ids) == warned, (ids, locked_kb, pinned_kb)
    if warned:
        (found,) = [f for f in findings if f["id"] == "memlock-at-limit"]
        assert found["severity"] == "warning" and found["expected"] == 4194304
        assert found["actual"] == (locked_kb + pinned_kb) * 1024


def test_an_unlimited_worker_is_never_at_its_limit():
    status = STATUS + "VmLck:\t99999999 kB\nVmPin:\t0 kB\n"
    limits = LIMITS.replace("4194304              4194304", "unlimited            unlimited")
    ids, _, _ = run(status=status, limits=limits, unit_text=UNIT.replace("LimitMEMLOCK=4M", "LimitMEMLOCK=infinity"))
    assert "memlock-at-limit" not in ids


@pytest.mark.parametrize("line", ["VmLck:\t12 MB\n", "VmLck:\t-1 kB\n", "VmLck:\n", "VmLck:\tlots kB\n",
                                  "VmLck:\t\u00b2 kB\n", "VmLck:\t%s kB\n" % ("9" * 40)])
def test_an_odd_status_line_is_left_out(line):
    assert "locked_bytes" not in proc_texts.parse_status(STATUS + line)


@pytest.mark.parametrize("locked_kb, budget, warned", [(1024, 2 << 20, False), (2048, 2 << 20, False),
                                                       (2049, 2 << 20, True), (4096, None, False)])
def test_a_worker_over_its_pinned_budget_is_warned(locked_kb, budget, warned):
    status = STATUS + "VmLck:\t%d kB\nVmPin:\t0 kB\n" % locked_kb
    ids, findings, _ = run(item=dict(ITEM, pinned_bytes=budget), status=status)
    assert ("pinned-over-budget" in ids) == warned
    if warned:
        (found,) = [f for f in findings if f["id"] == "pinned-over-budget"]
        assert found["expected"] == budget and found["actual"] == locked_kb * 1024


# -- the memlock limits pods' processes run with (Kubernetes nodes) -----------------------------------------------


def _limits(soft):
    value = "unlimited" if soft == "unlimited" else str(soft)
    return ("Limit                     Soft Limit           Hard Limit           Units\n"
            "Max locked memory         %s %s bytes\n" % (value, value))


def _proc_with_pods(tmp_path, processes):
    root = tmp_path / "proc"
    for pid, cgroup, soft in processes:
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(cgroup)
        (root / str(pid) / "limits").write_text(_limits(soft))
    (root / "sys" / "kernel").mkdir(parents=True)
    (root / "sys" / "kernel" / "numa_balancing").write_text("0\n")
    return str(root)


POD_V2 = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-a.scope\n"
POD_V1 = "12:memory:/kubepods/besteffort/pod2/b\n11:cpuset:/kubepods/besteffort/pod2/b\n"
HOST = "0::/system.slice/containerd.service\n"


def test_container_processes_below_the_containerd_limit_are_named():
    summary, found = audit.container_memlock(
        [(10, POD_V2, _limits("unlimited")), (11, POD_V1, _limits(8 << 20)), (12, HOST, _limits(65536))],
        expected="infinity")
    assert summary == {"processes": 2, "memlock": {"8388608": 1, "infinity": 1}, "lowest": 8 << 20}
    assert [(f["id"], f["severity"], f["actual"]) for f in found] == [("container-memlock", "warning", 8 << 20)]
    assert "PID 11" in found[0]["message"] and "restart those pods" in found[0]["message"]
    # At or above what containerd was given: nothing to say; without an expectation the limits are only reported.
    assert audit.container_memlock([(11, POD_V1, _limits(8 << 20))], expected=8 << 20)[1] == []
    assert audit.container_memlock([(11, POD_V1, _limits(8 << 20))], expected=None)[1] == []


def test_the_module_reads_the_pods_processes_only_when_asked(tmp_path, capsys):
    root = _proc_with_pods(tmp_path, [(10, POD_V2, "unlimited"), (11, POD_V1, 8 << 20), (12, HOST, 65536)])
    off = _audit_module(capsys, plan_path=str(tmp_path / "plan.json"), proc_root=root)
    assert off["audit"]["containers"] is None
    on = _audit_module(capsys, plan_path=str(tmp_path / "plan.json"), proc_root=root, containers=True,
                       container_memlock="64G")
    assert on["audit"]["containers"] == {"processes": 2, "memlock": {"8388608": 1, "infinity": 1}, "lowest": 8 << 20}
    assert [f["id"] for f in on["audit"]["findings"] if f["id"] == "container-memlock"] == ["container-memlock"]
    bad = _audit_module(capsys, plan_path=str(tmp_path / "plan.json"), proc_root=root, containers=True,
                        container_memlock="lots")
    assert bad["failed"] and bad["msg"].startswith("container_memlock: 'lots' is not a limit")
