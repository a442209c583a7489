"""gpunuma_apply's restart mode ``stop`` (module_utils/gpunuma/node/apply/stop.py) on real files under tmp_path.

A kubelet-like service: it must be stopped before its config changes and its
stale checkpoint goes, started after, and put back - config, removed
checkpoint, the checkpoints it wrote itself - when it does not come back.
systemd is test_node_apply's fake, taught ``stop`` and a start that reads
the config it would run.
"""

import json
import os

import pytest

from ansible.module_utils.gpunuma.node.apply.reconcile import Apply
from ansible.module_utils.gpunuma.node.apply.files import ApplyError, normalise_files
from test_node_apply import FakeModule, FakeSystemd, NodeFiles, running, stopped

pytestmark = pytest.mark.unit

UNIT = "kubelet.service"
GOOD = "cpuManagerPolicy: static\n"
OLD = "cpuManagerPolicy: none\n"
BAD = "cpuManagerPolicy: static\nreservedMemory: [{numaNode: 1}]\n"


class Kubelet(FakeSystemd):
    """systemd with a kubelet: a start reads the config (one holding ``reservedMemory`` is refused) and writes its
    checkpoints, as the real one does; ``stop`` stops it; every mutating call records the config it saw."""

    def __init__(self, root, state="active", refuse_always=False):
        super().__init__({UNIT: running("k0") if state == "active" else stopped("enabled")},
                         journal={UNIT: ["E1204 kubelet.go:1600] \"Failed to start ContainerManager\" "
                                         "err=\"the reserved memory configuration for NUMA node 1\""]})
        self.root = root
        self.refuse_always = refuse_always
        self.seen = []

    def path(self, name):
        return os.path.join(str(self.root), name)

    def __call__(self, argv):
        argv = list(argv)
        if argv[:1] == ["systemctl"] and argv[1] not in ("show",):
            config = self.path("config.yaml")
            self.seen.append((argv[1], open(config).read() if os.path.exists(config) else None))
        if argv[:2] == ["systemctl", "stop"]:
            self.calls.append(argv)
            self.state(argv[-1]).update(ActiveState="inactive", SubState="dead")
            return 0, "", ""
        if argv[:2] == ["systemctl", "start"] and argv[-1] == UNIT:
            config = open(self.path("config.yaml")).read()
            policy = "static" if "static" in config else "none"
            # The kubelet writes its checkpoints on every start, even one it then refuses; the new config one more.
            for name in ("cpu_manager_state",) + (("dra_manager_state",) if policy == "static" else ()):
                with open(self.path(name), "w") as handle:
                    json.dump({"policyName": policy}, handle)
            if self.refuse_always or "reservedMemory" in config:
                self.calls.append(argv)
                self.state(UNIT).update(ActiveState="failed", SubState="failed", Result="exit-code")
                return 1, "", "Job for kubelet.service failed"
        return super().__call__(argv)


@pytest.fixture
def node(tmp_path):
    (tmp_path / "config.yaml").write_text(OLD)
    (tmp_path / "cpu_manager_state").write_text('{"policyName": "none"}')
    os.chmod(tmp_path / "cpu_manager_state", 0o600)
    (tmp_path / "memory_manager_state").write_text('{"policyName": "None"}')
    return tmp_path


def _run(node, fake, config, check_mode=False, absent=True, **units):
    state = [str(node / n) for n in ("cpu_manager_state", "memory_manager_state", "dra_manager_state")]
    apply = Apply(NodeFiles(FakeModule().run_command), fake, fake.sleep, check_mode=check_mode)
    files = normalise_files([{"path": str(node / "config.yaml"), "content": config, "unit": UNIT,
                              "restart": "stop", "backup": False}])
    return apply.run(files, absent=[{"path": str(node / "cpu_manager_state"), "unit": UNIT, "restart": "stop"}]
                     if absent else [], units=dict({"settle_seconds": 0, "state_files": {UNIT: state},
                                                    "backup_dir": str(node / "backup")}, **units),
                     stopped_path=str(node / "stopped.json"))


def test_the_unit_stops_before_the_write_and_starts_after(node):
    fake = Kubelet(node)
    result = _run(node, fake, GOOD)
    assert not result.get("failed"), result.get("msg")
    # Stopped while it still ran the old config; started on the new one, its stale checkpoint gone before.
    assert [s for s in fake.seen if s[0] != "daemon-reload"] == [("stop", OLD), ("start", GOOD)]
    assert result["stopped_for_change"] == [UNIT] and result["started"] == [UNIT] and result["changed"]
    assert (node / "config.yaml").read_text() == GOOD
    assert json.loads((node / "cpu_manager_state").read_text()) == {"policyName": "static"}
    # The copies of its state files taken before the stop; the list of stopped units is cleared.
    assert (node / "backup" / "cpu_manager_state").read_text() == '{"policyName": "none"}'
    assert oct(os.stat(node / "backup").st_mode & 0o777) == "0o700"
    assert not (node / "backup" / "dra_manager_state").exists()
    assert not (node / "stopped.json").exists()
    assert fake.state(UNIT)["ActiveState"] == "active"


def test_a_stale_checkpoint_alone_stops_and_starts_the_unit(node):
    (node / "config.yaml").write_text(GOOD)
    fake = Kubelet(node)
    result = _run(node, fake, GOOD)
    assert result["removed"] == [str(node / "cpu_manager_state")]
    assert [s[0] for s in fake.seen] == ["stop", "start"]


def test_nothing_to_change_touches_nothing(node):
    (node / "config.yaml").write_text(GOOD)
    fake = Kubelet(node)
    result = _run(node, fake, GOOD, absent=False)
    assert not result["changed"] and fake.mutating() == [] and "stopped_for_change" not in result


def test_a_unit_that_was_not_running_gets_its_files_and_stays_stopped(node):
    fake = Kubelet(node, state="inactive")
    result = _run(node, fake, GOOD)
    assert (node / "config.yaml").read_text() == GOOD
    assert result["not_started"] == [UNIT] and result["started"] == []
    assert [s[0] for s in fake.seen if s[0] != "daemon-reload"] == []  # neither stopped nor started


def test_a_refused_start_puts_every_file_back_and_starts_the_old_config(node):
    before = {n: (node / n).read_bytes() for n in ("config.yaml", "cpu_manager_state", "memory_manager_state")}
    fake = Kubelet(node)
    result = _run(node, fake, BAD)
    assert result["failed"] is True and result["back_healthy"] is True
    assert result["failed_units"] == [UNIT] and result["rolled_back"] == [UNIT]
    # Byte for byte, the removed checkpoint with its mode; the checkpoint the refused start wrote where none was
    # is gone again.
    assert {n: (node / n).read_bytes() for n in before} == before
    assert oct(os.stat(node / "cpu_manager_state").st_mode & 0o777) == "0o600"
    assert not (node / "dra_manager_state").exists()
    # stop (old), start (refused), stop, reload, start (old config again).
    assert [s for s in fake.seen if s[0] in ("stop", "start")] == [("stop", OLD), ("start", BAD), ("stop", BAD),
                                                                   ("start", OLD)]
    assert fake.state(UNIT)["ActiveState"] == "active"
    msg = result["msg"]
    assert msg.startswith("kubelet.service did not come back after the change (ActiveState=failed")
    assert "Job for kubelet.service failed" in msg
    assert "kubelet.service is healthy again on its previous files" in msg
    assert "the reserved memory configuration for NUMA node 1" in msg
    assert str(node / "config.yaml") in msg and str(node / "dra_manager_state") in msg
    assert not (node / "stopped.json").exists()


def test_a_unit_that_does_not_come_back_on_the_old_files_says_so(node):
    fake = Kubelet(node, refuse_always=True)
    result = _run(node, fake, GOOD)
    assert result["failed"] is True and result["back_healthy"] is False
    assert "kubelet.service on its previous files is NOT healthy (ActiveState=failed" in result["msg"]
    assert (node / "config.yaml").read_text() == OLD


def test_a_unit_that_never_answers_its_readiness_check_is_put_back(node):
    fake = Kubelet(node)
    answers = []

    def http_get(url, timeout):
        answers.append(open(node / "config.yaml").read())
        return (False, "HTTP 500") if "static" in answers[-1] else (True, "HTTP 200")

    apply = Apply(NodeFiles(FakeModule().run_command), fake, fake.sleep, http_get=http_get)
    files = normalise_files([{"path": str(node / "config.yaml"), "content": GOOD, "unit": UNIT, "restart": "stop"}])
    result = apply.run(files, units={"settle_seconds": 0, "readiness": {
        UNIT: {"url": "http://127.0.0.1:10248/healthz", "timeout": 4, "interval": 2}}})
    assert result["failed"] is True and result["back_healthy"] is True
    assert "not ready: http://127.0.0.1:10248/healthz after 4 s (HTTP 500)" in result["msg"]
    assert answers == [GOOD, GOOD, GOOD, OLD]
    assert (node / "config.yaml").read_text() == OLD


def test_check_mode_reports_the_stop_and_touches_nothing(node):
    before = sorted((p.name, p.read_bytes()) for p in node.iterdir())
    fake = Kubelet(node)
    result = _run(node, fake, GOOD, check_mode=True)
    assert result["changed"] and result["stopped_for_change"] == [UNIT] and result["started"] == [UNIT]
    assert sorted((p.name, p.read_bytes()) for p in node.iterdir()) == before
    assert fake.mutating() == []


def test_a_run_that_died_after_the_stop_is_finished_by_the_next(node):
    # The files were written and the unit is down: nothing differs any more, but it is listed as stopped.
    (node / "config.yaml").write_text(GOOD)
    (node / "stopped.json").write_text(json.dumps([UNIT]))
    fake = Kubelet(node, state="inactive")
    result = _run(node, fake, GOOD, absent=False)
    assert result["started"] == [UNIT] and fake.state(UNIT)["ActiveState"] == "active"
    assert not (node / "stopped.json").exists()
    (node / "stopped.json").write_text("{not json")
    with pytest.raises(ApplyError) as caught:
        _run(node, Kubelet(node), GOOD, absent=False)
    assert "is not gpunuma's list of units stopped for a change; move it aside" in str(caught.value)


def test_a_failed_write_after_the_stop_puts_back_and_starts_the_unit(node):
    (node / "blocker").write_text("a file where a directory is needed")
    fake = Kubelet(node)
    apply = Apply(NodeFiles(FakeModule().run_command), fake, fake.sleep)
    files = normalise_files([
        {"path": str(node / "config.yaml"), "content": GOOD, "unit": UNIT, "restart": "stop"},
        {"path": str(node / "blocker" / "drop-in.conf"), "content": "x\n", "unit": UNIT, "restart": "never"}])
    with pytest.raises(ApplyError) as caught:
        apply.run(files, absent=[{"path": str(node / "cpu_manager_state"), "unit": UNIT, "restart": "stop"}],
                  units={"settle_seconds": 0}, stopped_path=str(node / "stopped.json"))
    assert "put back and started again: kubelet.service" in str(caught.value)
    assert (node / "config.yaml").read_text() == OLD
    assert (node / "cpu_manager_state").exists()
    assert fake.state(UNIT)["ActiveState"] == "active" and not (node / "stopped.json").exists()


@pytest.mark.parametrize("files, absent, units, words", [
    ([{"path": "/etc/x.conf", "content": "x", "restart": "stop"}], [], {},
     "/etc/x.conf: restart mode stop needs the unit to stop (files[].unit)"),
    ([{"path": "/etc/x.service", "content": "x", "unit": "gpunuma-a.service", "restart": "stop"}], [],
     {"start": True, "services": ["gpunuma-a.service"]}, "gpunuma-a.service is an instance unit"),
    ([], [{"path": "/var/lib/x", "restart": "stop"}], {}, "absent[0].restart: stop needs the unit to stop"),
    ([], [{"path": "/var/lib/x", "unit": UNIT, "restart": "always"}], {},
     "absent[0].restart: 'always' is not allowed; allowed: if-running, stop"),
    ([{"path": "/etc/x.conf", "content": "x", "unit": UNIT, "restart": "stop"}], [],
     {"state_files": {UNIT: ["cpu_manager_state"]}},
     "units.state_files[kubelet.service]: ['cpu_manager_state'] is not allowed; allowed: a list of absolute paths"),
    ([{"path": "/etc/x.conf", "content": "x", "unit": UNIT, "restart": "stop"}], [],
     {"state_files": {UNIT: "/var/lib/kubelet/cpu_manager_state"}}, "units.state_files[kubelet.service]"),
    ([{"path": "/etc/x.conf", "content": "x", "unit": UNIT, "restart": "stop"}], [],
     {"state_files": ["/var/lib/kubelet/cpu_manager_state"]}, "units.state_files: a list is not allowed"),
    ([{"path": "/etc/x.conf", "content": "x", "unit": UNIT, "restart": "stop"}], [],
     {"backup_dir": "backups"}, "units.backup_dir: 'backups' is not allowed; allowed: an absolute directory"),
])
def test_bad_stop_requests_are_refused_before_anything_changes(node, files, absent, units, words):
    fake = Kubelet(node)
    apply = Apply(NodeFiles(FakeModule().run_command), fake, fake.sleep)
    with pytest.raises(ApplyError) as caught:
        apply.run(normalise_files(files), absent=absent, units=units)
    assert words in str(caught.value)
    assert fake.mutating() == []


def test_a_config_that_is_a_link_is_refused_before_the_unit_stops(node):
    (node / "config.yaml").rename(node / "real.yaml")
    os.symlink("real.yaml", node / "config.yaml")
    fake = Kubelet(node)
    with pytest.raises(ApplyError) as caught:
        _run(node, fake, GOOD)
    assert "config.yaml: it is a symbolic link (to real.yaml)" in str(caught.value)
    assert fake.mutating() == [] and (node / "real.yaml").read_text() == OLD
