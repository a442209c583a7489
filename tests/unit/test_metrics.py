"""gpunuma textfile metrics: rendered from the recorded H200 probe, a plan and a fake sys/proc tree,
and read back with prometheus_client's text-format parser."""

import importlib.util
import json
import os
import stat
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ansible.module_utils.gpunuma.verify import metrics
from conftest import REPO_ROOT

# The role's entry script imports the renderer installed beside it (gpunuma_metrics_collect.py): here, module_utils'.
sys.modules.setdefault("gpunuma_metrics_collect", metrics)
_SCRIPT = importlib.util.spec_from_file_location(
    "gpunuma_metrics_script", os.path.join(REPO_ROOT, "roles", "gpunuma_metrics", "files", "gpunuma_metrics.py"))
script = importlib.util.module_from_spec(_SCRIPT)
_SCRIPT.loader.exec_module(script)
from conftest import FIXTURES  # noqa: E402

pytestmark = pytest.mark.unit

RECORDED = os.path.join(FIXTURES, "recorded", "h200-probe", "run2", "h2d-probe.json")
UUID = "GPU-17feaaa1-be79-190b-6694-75d1b3c48504"


def parse(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(families, name, **labels):
    out = []
    for fam in families.values():
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == str(v) for k, v in labels.items()):
                out.append(s)
    return out


def fake_root(tmp_path, numa_maps=None, procs=None, unit="gpunuma-llm0.service", threads=None):
    """``threads``: {pid: {tid: Cpus_allowed_list}} written as /proc/PID/task/TID/status."""
    for node, hit in ((0, 1000), (1, 50)):
        d = tmp_path / "sys/devices/system/node" / ("node%d" % node)
        d.mkdir(parents=True)
        (d / "numastat").write_text("numa_hit %d\nnuma_miss 3\nnuma_foreign 4\ninterleave_hit 5\nlocal_node 6\nother_node 7\n" % hit)
    if procs:
        cg = tmp_path / "sys/fs/cgroup/system.slice" / unit
        cg.mkdir(parents=True)
        (cg / "cgroup.procs").write_text("\n".join(str(p) for p in procs) + "\n")
        for pid, text in zip(procs, numa_maps):
            d = tmp_path / "proc" / str(pid)
            d.mkdir(parents=True)
            (d / "numa_maps").write_text(text)
    for pid, tids in (threads or {}).items():
        for tid, cpus in tids.items():
            d = tmp_path / "proc" / str(pid) / "task" / str(tid)
            d.mkdir(parents=True)
            (d / "status").write_text("Name:\tpython3\nTgid:\t%d\nCpus_allowed_list:\t%s\n" % (pid, cpus))
    return str(tmp_path)


PLAN = {
    "schema": "gpunuma.plan/v1", "hostname": "gpu-a01", "topology_fingerprint": "sha256:abc", "profile": "strict",
    "instances": [{"name": "llm0", "unit": "gpunuma-llm0.service", "gpus": [0], "gpu_uuids": [UUID],
                   "numa_nodes": [0], "cpus": "1-7", "mem_policy": "bind", "mem_nodes": [0], "profile": "strict"}],
}
MAPS = ("7f00 bind:0 anon=300 dirty=300 N0=300 kernelpagesize_kB=4\n"
        "7f10 default anon=100 dirty=100 N1=100 kernelpagesize_kB=4\n"
        "7f20 default file=/x N0=2 kernelpagesize_kB=2048\n")


def test_probe_metrics_from_recorded_h200():
    text, errors = metrics.collect(probe_path=RECORDED, sysfs_root="/nonexistent")
    assert errors == []
    fams = parse(text)
    bw = samples(fams, "gpunuma_h2d_copy_bandwidth_bytes_per_second", gpu_uuid=UUID, placement="local",
                 direction="h2d", memory="pinned", size_bytes=268435456)
    assert len(bw) == 1 and bw[0].value == pytest.approx(55.446e9)
    assert bw[0].labels["numa_node"] == "0" and bw[0].labels["bound_node"] == "0" and bw[0].labels["pci_bus_id"] == "0000:00:06.0"
    pageable = samples(fams, "gpunuma_h2d_copy_bandwidth_bytes_per_second", placement="unbound", memory="pageable")
    assert pageable[0].value == pytest.approx(7.934e9) and pageable[0].labels["bound_node"] == ""
    assert fams["gpunuma_h2d_copy_duration_seconds"].type == "summary"
    p99 = samples(fams, "gpunuma_h2d_copy_duration_seconds", placement="local", size_bytes=4096, quantile="0.99")
    assert p99[0].value == pytest.approx(6.464e-6)
    count = samples(fams, "gpunuma_h2d_copy_duration_seconds_count", placement="local", size_bytes=4096)
    assert count[0].value == 1000
    link = samples(fams, "gpunuma_gpu_pcie_link_bandwidth_bytes_per_second", gpu="0")
    assert link[0].value == pytest.approx(63.015e9)
    assert samples(fams, "gpunuma_h2d_probe_success")[0].value == 1
    assert samples(fams, "gpunuma_metrics_source_up", source="probe")[0].value == 1
    # remote was skipped on the single-node VM: no series claims to have measured it
    assert not samples(fams, "gpunuma_h2d_copy_bandwidth_bytes_per_second", placement="remote")


def test_cpu_overhead_metrics_from_a_recorded_h200_probe():
    path = os.path.join(FIXTURES, "recorded", "h200-probe-cpu", "idle-1.json")
    fams = parse(metrics.collect(probe_path=path, sysfs_root="/nonexistent")[0])
    per_byte = samples(fams, "gpunuma_h2d_copy_cpu_seconds_per_byte", placement="local", direction="h2d",
                       memory="pinned", size_bytes=268435456)
    assert len(per_byte) == 1 and per_byte[0].value == pytest.approx(0.018192e-9)
    pageable = samples(fams, "gpunuma_h2d_copy_cpu_seconds_per_byte", placement="local", memory="pageable")
    assert pageable[0].value == pytest.approx(0.150378e-9)
    small = samples(fams, "gpunuma_h2d_copy_cpu_seconds", placement="local", size_bytes=4096)
    assert len(small) == 1 and small[0].value == pytest.approx(17.514e-6)
    # A probe recorded before the CPU figures has none, and no series claims one.
    assert not samples(parse(metrics.collect(probe_path=RECORDED, sysfs_root="/nonexistent")[0]),
                       "gpunuma_h2d_copy_cpu_seconds")


def test_names_follow_conventions():
    text, _ = metrics.collect(probe_path=RECORDED, plan_path=None, sysfs_root="/nonexistent")
    for fam in parse(text).values():
        assert fam.name.startswith("gpunuma_")
        if fam.type == "counter":
            assert any(s.name.endswith("_total") for s in fam.samples)
        for bad in ("_ms", "_us", "_gbps", "_kb", "_mb", "_gb"):
            assert not fam.name.endswith(bad)


def test_numastat_counters(tmp_path):
    text, _ = metrics.collect(sysfs_root=fake_root(tmp_path))
    fams = parse(text)
    assert fams["gpunuma_numa_hit_pages"].type == "counter"
    assert samples(fams, "gpunuma_numa_hit_pages_total", node="1")[0].value == 50
    assert samples(fams, "gpunuma_numa_other_node_pages_total", node="0")[0].value == 7
    assert samples(fams, "gpunuma_numa_foreign_pages_total", node="0")[0].value == 4
    assert samples(fams, "gpunuma_numa_miss_pages_total", node="0")[0].value == 3


def test_numa_maps_bytes():
    assert metrics.numa_maps_bytes(MAPS) == {0: 300 * 4096 + 2 * 2048 * 1024, 1: 100 * 4096}


def test_instance_info_and_planned_share(tmp_path):
    root = fake_root(tmp_path, numa_maps=[MAPS, "7f00 default anon=100 N1=100 kernelpagesize_kB=4\n"], procs=[101, 102])
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    text, errors = metrics.collect(plan_path=str(plan), sysfs_root=root)
    assert errors == []
    fams = parse(text)
    info = samples(fams, "gpunuma_instance_info", instance="llm0")[0]
    assert info.labels == {"instance": "llm0", "unit": "gpunuma-llm0.service", "profile": "strict", "cpus": "1-7",
                           "mem_policy": "bind", "mem_nodes": "0", "numa_nodes": "0", "gpu_uuids": UUID,
                           "topology_fingerprint": "sha256:abc"}
    on0 = 300 * 4096 + 2 * 2048 * 1024
    on1 = 200 * 4096
    assert samples(fams, "gpunuma_instance_memory_resident_bytes", instance="llm0", node=1)[0].value == on1
    ratio = samples(fams, "gpunuma_instance_local_pages_ratio", instance="llm0", kind="all")[0]
    assert ratio.value == pytest.approx(on0 / (on0 + on1)) and ratio.labels["planned_nodes"] == "0"
    # What the processes allocated (anon): 300 pages on node 0, 200 on node 1; the file mapping is all on node 0.
    anon = samples(fams, "gpunuma_instance_local_pages_ratio", instance="llm0", kind="anon")[0]
    assert anon.value == pytest.approx(300 / 500.0)
    assert samples(fams, "gpunuma_instance_local_pages_ratio", instance="llm0", kind="file")[0].value == 1.0
    assert samples(fams, "gpunuma_node_profile_info", profile="strict")[0].value == 1
    assert samples(fams, "gpunuma_instance_up", instance="llm0")[0].value == 1


def test_locked_and_pinned_memory_per_instance_against_the_plans_limit(tmp_path):
    root = fake_root(tmp_path, numa_maps=[MAPS, MAPS], procs=[101, 102])
    (tmp_path / "proc/101/status").write_text("Name:\tvllm\nVmLck:\t    1024 kB\nVmPin:\t 2097152 kB\n")
    (tmp_path / "proc/102/status").write_text("Name:\tvllm\nVmLck:\t       0 kB\nVmPin:\t    4096 kB\n")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(dict(PLAN, instances=[dict(PLAN["instances"][0], limit_memlock=8 << 30,
                                                          pinned_bytes=7 << 30)])))
    text, errors = metrics.collect(plan_path=str(plan), sysfs_root=root)
    assert errors == []
    fams = parse(text)
    assert samples(fams, "gpunuma_instance_locked_bytes", instance="llm0")[0].value == 1024 * 1024
    assert samples(fams, "gpunuma_instance_pinned_bytes", instance="llm0")[0].value == (2097152 + 4096) * 1024
    assert samples(fams, "gpunuma_instance_memlock_limit_bytes", instance="llm0")[0].value == 8 << 30
    assert samples(fams, "gpunuma_instance_pinned_budget_bytes", instance="llm0")[0].value == 7 << 30
    # Unlimited: no limit sample; a process without a status file adds nothing.
    plan.write_text(json.dumps(dict(PLAN, instances=[dict(PLAN["instances"][0], limit_memlock="infinity")])))
    (tmp_path / "proc/102/status").unlink()
    fams = parse(metrics.collect(plan_path=str(plan), sysfs_root=root)[0])
    assert not samples(fams, "gpunuma_instance_memlock_limit_bytes")
    assert samples(fams, "gpunuma_instance_pinned_bytes", instance="llm0")[0].value == 2097152 * 1024


def test_stopped_instance_is_down_without_share(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    fams = parse(metrics.collect(plan_path=str(plan), sysfs_root=fake_root(tmp_path))[0])
    assert samples(fams, "gpunuma_instance_up", instance="llm0")[0].value == 0
    assert not samples(fams, "gpunuma_instance_local_pages_ratio")
    assert not samples(fams, "gpunuma_instance_cpus_match")
    assert not samples(fams, "gpunuma_instance_pinned_bytes")


def test_numa_maps_kinds_split_what_a_process_allocated_from_its_page_cache():
    assert metrics.numa_maps_kinds(MAPS) == {"anon": {0: 300 * 4096, 1: 100 * 4096}, "file": {0: 2 * 2048 * 1024}}
    assert metrics.planned_ratio({0: 3, 1: 1}, [0]) == 0.75
    assert metrics.planned_ratio({}, [0]) is None


@pytest.mark.parametrize("cpus, match", [({101: "1-7", 102: "1-7", 103: "1,2,3-7"}, 1),
                                         ({101: "1-7", 102: "0-15", 103: "1-7"}, 0),
                                         ({101: "1-6", 102: "1-7", 103: "1-7"}, 0)])
def test_cpus_match_reads_every_thread_of_every_process(tmp_path, cpus, match):
    # Process 101 has threads 101 and 102; process 103 (a worker child) its own thread 103.
    threads = {101: {101: cpus[101], 102: cpus[102]}, 103: {103: cpus[103]}}
    root = fake_root(tmp_path, numa_maps=[MAPS, MAPS], procs=[101, 103], threads=threads)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    fams = parse(metrics.collect(plan_path=str(plan), sysfs_root=root)[0])
    assert samples(fams, "gpunuma_instance_cpus_match", instance="llm0")[0].value == match


def test_hostile_label_values_round_trip(tmp_path):
    plan = dict(PLAN, profile='str"ict\\', instances=[dict(PLAN["instances"][0], name='llm"0\nx', cpus="1-7\\")])
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    fams = parse(metrics.collect(plan_path=str(path), sysfs_root="/nonexistent")[0])
    info = samples(fams, "gpunuma_instance_info")[0]
    assert info.labels["instance"] == 'llm"0\nx' and info.labels["cpus"] == "1-7\\"
    assert samples(fams, "gpunuma_node_profile_info")[0].labels["profile"] == 'str"ict\\'


def test_audit_report_time_is_read(tmp_path):
    path = tmp_path / "audit.json"
    path.write_text(json.dumps({"schema": "gpunuma.audit/v1", "status": "drifted", "time": "2026-01-31T03:00:00Z"}))
    fams = parse(metrics.collect(audit_path=str(path), sysfs_root="/nonexistent")[0])
    assert samples(fams, "gpunuma_audit_state", state="drifted")[0].value == 1
    assert samples(fams, "gpunuma_audit_timestamp_seconds")[0].value == 1769828400


@pytest.mark.parametrize("audit, state", [({"status": "compliant", "timestamp": 1700000000}, "compliant"),
                                          ({"status": "drifted"}, "drifted"), ({"status": "weird"}, "unknown"), (None, "unknown")])
def test_audit_state(tmp_path, audit, state):
    path = tmp_path / "audit.json"
    if audit is not None:
        path.write_text(json.dumps(audit))
    fams = parse(metrics.collect(audit_path=str(path), sysfs_root="/nonexistent")[0])
    assert samples(fams, "gpunuma_audit_state", state=state)[0].value == 1
    assert sum(s.value for s in samples(fams, "gpunuma_audit_state")) == 1


def test_damaged_sources_reported_not_raised(tmp_path):
    probe = tmp_path / "probe.json"
    probe.write_text("{not json")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"schema": "gpunuma.plan/v9"}))
    text, errors = metrics.collect(probe_path=str(probe), plan_path=str(plan), sysfs_root="/nonexistent")
    assert any(e.startswith("probe result %s:" % probe) for e in errors)
    assert "plan %s: not a gpunuma.plan/v1 document" % plan in errors
    fams = parse(text)
    assert samples(fams, "gpunuma_h2d_probe_success")[0].value == 0
    assert samples(fams, "gpunuma_metrics_source_up", source="probe")[0].value == 0
    assert samples(fams, "gpunuma_metrics_source_up", source="plan")[0].value == 0
    assert samples(fams, "gpunuma_metrics_errors")[0].value == 2


def test_write_atomic_replaces_and_leaves_no_temp(tmp_path):
    (tmp_path / "gpunuma-node.prom").write_text("old\n")
    (tmp_path / "other.prom").write_text("x 1\n")
    path = script.write_atomic(str(tmp_path), "gpunuma_x 1\n")
    assert open(path).read() == "gpunuma_x 1\n"
    assert sorted(os.listdir(tmp_path)) == ["gpunuma-node.prom", "other.prom"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


def test_write_atomic_missing_dir(tmp_path):
    with pytest.raises(script.MetricsError, match="textfile directory .*/nope does not exist"):
        script.write_atomic(str(tmp_path / "nope"), "x 1\n")


def test_main_cli(tmp_path, capsys):
    assert script.main(["--textfile-dir", str(tmp_path), "--probe", RECORDED, "--plan", str(tmp_path / "none.json"),
                         "--audit", str(tmp_path / "none.json"), "--root", "/nonexistent"]) == 0
    assert "gpunuma_h2d_copy_bandwidth_bytes_per_second" in (tmp_path / "gpunuma-node.prom").read_text()
    assert script.main(["--textfile-dir", str(tmp_path / "missing")]) == 1
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("damage", [
    lambda p: p.update(gpus="x"),
    lambda p: p["gpus"][0].update(placements=["local"]),
    lambda p: p["gpus"][0]["placements"]["local"]["measurement"]["h2d_pinned"].update(gbps_median="fast"),
    lambda p: p["gpus"][0].update(pcie={"theoretical_gbps": "63"}),
    lambda p: p["gpus"].append(None),
])
def test_malformed_probe_is_an_error_not_a_crash(tmp_path, damage):
    probe = json.load(open(RECORDED))
    damage(probe)
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(probe))
    text, errors = metrics.collect(probe_path=str(path), sysfs_root="/nonexistent")
    assert len(errors) == 1 and errors[0].startswith("probe result %s: malformed" % path)
    fams = parse(text)
    assert samples(fams, "gpunuma_h2d_probe_success")[0].value == 0
    assert not samples(fams, "gpunuma_h2d_copy_bandwidth_bytes_per_second")
    assert samples(fams, "gpunuma_metrics_source_up", source="probe")[0].value == 0


def test_plan_with_a_path_for_a_unit_is_refused(tmp_path):
    plan = dict(PLAN, instances=[dict(PLAN["instances"][0], unit="../../../etc/passwd")])
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    text, errors = metrics.collect(plan_path=str(path), sysfs_root="/nonexistent")
    assert errors == ["plan %s: malformed (ValueError: instance 'llm0' has unit '../../../etc/passwd', not a systemd unit name)" % path]
    fams = parse(text)
    assert not samples(fams, "gpunuma_instance_info")
    assert samples(fams, "gpunuma_metrics_source_up", source="plan")[0].value == 0


def _textfile_dir():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpunuma_filters_metrics", os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "filter_plugins", "gpunuma.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.gpunuma_metrics_textfile_dir


@pytest.mark.parametrize("os_release, env_texts, expected", [
    # Debian's package passes nothing: its default.
    ('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n', ['ARGS=""\n', ""], "/var/lib/prometheus/node-exporter"),
    ('ID=ubuntu\nID_LIKE=debian\n', ["", ""], "/var/lib/prometheus/node-exporter"),
    # EL by ID_LIKE (Rocky, Alma) or ID (RHEL, Fedora): EPEL's directory.
    ('ID="rocky"\nID_LIKE="rhel centos fedora"\n', ["", ""], "/var/lib/node_exporter/textfile_collector"),
    ('ID=fedora\n', ["", ""], "/var/lib/node_exporter/textfile_collector"),
    # What node_exporter is told wins over any default, in either spelling; a commented line does not count.
    ('ID=debian\n', ['ARGS="--collector.textfile.directory=/srv/prom --web.listen-address=:9100"\n', ""], "/srv/prom"),
    ('ID=rhel\n', ["", 'OPTIONS="--collector.textfile.directory /var/lib/node_exporter/tf"\n'],
     "/var/lib/node_exporter/tf"),
    ('ID=debian\n', ['#ARGS="--collector.textfile.directory=/srv/prom"\n', ""], "/var/lib/prometheus/node-exporter"),
    # Nothing readable: Debian's.
    ("", [], "/var/lib/prometheus/node-exporter"),
])
def test_auto_textfile_dir_follows_node_exporter_then_the_distribution(os_release, env_texts, expected):
    assert _textfile_dir()(os_release, env_texts) == expected


@pytest.mark.parametrize("kind", ["fifo", "deep", "huge", "directory"])
def test_a_hostile_document_is_an_error_never_a_hang_or_a_traceback(tmp_path, kind):
    """The collector runs alone on the node: a FIFO planted at plan.json never blocks it, a deep or huge file is
    an error line, and the rest of the metrics are still written."""
    path = tmp_path / "plan.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "deep":
        path.write_text("[" * 100000 + "]" * 100000)
    elif kind == "huge":
        with open(path, "wb") as handle:
            handle.truncate(metrics.MAX_DOCUMENT_BYTES + 1)
    else:
        path.mkdir()
    text, errors = metrics.collect(plan_path=str(path), probe_path=RECORDED, sysfs_root="/nonexistent")
    assert any(str(path) in e for e in errors), errors
    assert "gpunuma_h2d" in text
