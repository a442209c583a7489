"""gpunuma_apply survives a run that dies at any step.

Every operation that changes the node is a numbered step: each file-system
call of the module's ``NodeFiles`` (temporary file, write, fsync, chmod,
rename, unlink, mkdir; backups are written the same way) and each systemctl call that is not a
``show``. A clean run of a realistic apply (two changed instance units, a new
one, a changed drop-in, a stale unit and a stale drop-in to prune, the plan
written after success) counts its steps; then, for every step k, a fresh
node runs the same apply and the host "dies" at step k: the step does not
happen (a write leaves half its bytes, as a lost page cache would), and
nothing after it runs, not even the module's own cleanup. Systemd forgets
its running processes' files only across a reboot, so the fake keeps, per
unit, the bytes of the unit file its process was started from.

After each crash:

- every path holds its old bytes or its complete new bytes; anything else
  is a temporary file of an atomic write (``.gpunuma-*``) or a backup with
  the complete old bytes;
- the plan is never written before every unit settled.

Then a plain run on the same node converges it: files as wanted, no
temporary file left, every instance running the file on disk (a unit
written before the crash is restarted, never reported unchanged while its
process still runs the old file), the plan written; and a run after that
changes nothing.
"""

import importlib.util
import json
import os
import tempfile

import pytest

from ansible.module_utils.gpunuma.node.apply.files import TEMP_PREFIX, ApplyError, normalise_files
from ansible.module_utils.gpunuma.node.apply.reconcile import Apply
from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

UNIT_MARKER = "# gpunuma instance "
DROPIN_MARKER = "# gpunuma binding of "
DROPIN_NAME = "50-gpunuma.conf"
SERVICES = ["gpunuma-llm0.service", "gpunuma-llm1.service", "gpunuma-llm2.service", "gpunuma-llm3.service"]


def _private(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Both:
    """Sets an attribute on the module and on its private copy of common/atomic.py (its writer)."""

    def __init__(self, module):
        object.__setattr__(self, "_targets", (module, module.atomic))

    def __getattr__(self, name):
        return getattr(self._targets[0], name)

    def __setattr__(self, name, value):
        for target in self._targets:
            setattr(target, name, value)


def _load_module():
    """Private copies of gpunuma_apply's writer (module_utils/gpunuma/node/apply/fs.py, NodeFiles) and the atomic
    writer it calls, so os and tempfile can be swapped."""
    module = _private("gpunuma_apply_fs_faults",
                      os.path.join(REPO_ROOT, "module_utils", "gpunuma", "node", "apply", "fs.py"))
    module.atomic = _private("gpunuma_atomic_faults",
                             os.path.join(REPO_ROOT, "module_utils", "gpunuma", "common", "atomic.py"))
    return _Both(module)


class Crash(BaseException):
    """The host died (not an Exception: nothing may catch it and carry on)."""


class Steps:
    """Numbers the operations that change the node; dies at step ``crash_at``."""

    def __init__(self, crash_at=None):
        self.crash_at = crash_at
        self.done = []
        self.dead = False

    def __call__(self, label, half=None):
        if self.dead:
            raise Crash("after death: " + label)
        self.done.append(label)
        if len(self.done) == self.crash_at:
            self.dead = True
            if half:
                half()
            raise Crash(label)


class FaultyStream:
    def __init__(self, stream, steps, name):
        self.stream, self.steps, self.name = stream, steps, name

    def write(self, data):
        def half():
            self.stream.write(data[:len(data) // 2])
            self.stream.flush()
        self.steps("write " + self.name, half)
        return self.stream.write(data)

    def __getattr__(self, name):
        return getattr(self.stream, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stream.close()


class FaultyOs:
    """The os module as NodeFiles sees it: every call that changes the disk is a step."""

    path = os.path

    def __init__(self, steps):
        self.steps = steps

    def __getattr__(self, name):
        return getattr(os, name)

    def replace(self, src, dst):
        self.steps("rename -> " + os.path.basename(dst))
        os.replace(src, dst)

    def unlink(self, path):
        self.steps("unlink " + os.path.basename(path))
        os.unlink(path)

    def chmod(self, path, mode):
        self.steps("chmod " + os.path.basename(path))
        os.chmod(path, mode)

    def chown(self, path, uid, gid):
        self.steps("chown " + os.path.basename(path))
        os.chown(path, uid, gid)

    def fsync(self, fd):
        self.steps("fsync")
        os.fsync(fd)

    def makedirs(self, path, mode=0o777, exist_ok=False):
        self.steps("mkdir " + os.path.basename(path))
        os.makedirs(path, mode, exist_ok)

    def link(self, src, dst):
        self.steps("link -> " + os.path.basename(dst))
        os.link(src, dst)

    def fdopen(self, fd, mode="r", *args, **kwargs):
        return FaultyStream(os.fdopen(fd, mode, *args, **kwargs), self.steps, "fd %d" % fd)


class FaultyTempfile:
    def __init__(self, steps):
        self.steps = steps

    def __getattr__(self, name):
        return getattr(tempfile, name)

    def mkstemp(self, *args, **kwargs):
        self.steps("mkstemp")
        return tempfile.mkstemp(*args, **kwargs)


class FakeModule:
    """What NodeFiles uses of AnsibleModule: nothing that writes.

    AnsibleModule.backup_local copies in place, so a run dying half way
    through it leaves half a backup; NodeFiles writes its backups atomically
    itself.
    """

    def backup_local(self, path):
        raise AssertionError("backup_local copies in place (a crash leaves half a backup): %s" % path)

    def run_command(self, argv):
        raise AssertionError("no validate command in these scenes: %r" % argv)


class Systemd:
    """systemctl over unit states that survive the crash, as on a live host.

    A running unit remembers the bytes of its unit file (and drop-in) at its
    last (re)start: ``runs_disk`` says whether the process runs what is on disk.
    """

    def __init__(self, unit_dir, steps):
        self.unit_dir = unit_dir
        self.steps = steps
        self.units = {}
        self.loaded = {}
        self.calls = []
        self._next = 0

    def disk(self, unit):
        paths = [os.path.join(self.unit_dir, unit), os.path.join(self.unit_dir, unit + ".d", DROPIN_NAME)]
        return tuple(open(p, "rb").read() if os.path.exists(p) else None for p in paths)

    def state(self, unit):
        return self.units.setdefault(unit, {"ActiveState": "inactive", "SubState": "dead", "Result": "success",
                                            "UnitFileState": "", "InvocationID": "", "NRestarts": "0",
                                            "ran": None})

    def boot_running(self, unit, enabled="enabled"):
        st = self.state(unit)
        st.update(ActiveState="active", SubState="running", UnitFileState=enabled, InvocationID="boot-" + unit,
                  ran=self.disk(unit))

    def runs_disk(self, unit):
        st = self.state(unit)
        return st["ActiveState"] == "active" and st["ran"] == self.disk(unit)

    def __call__(self, argv):
        argv = list(argv)
        self.calls.append(argv)
        assert argv[0] in ("systemctl", "journalctl"), argv
        if argv[0] == "journalctl":
            return 0, "", ""
        verb = argv[1]
        if verb == "show":
            props = argv[2].split("=", 1)[1].split(",")
            assert argv[3] == "--"
            return 0, "\n".join("".join("%s=%s\n" % (p, self.state(u).get(p, "")) for p in props)
                                for u in argv[4:]), ""
        self.steps("systemctl " + " ".join(argv[1:]))
        if verb == "daemon-reload":
            return 0, "", ""
        if verb == "enable" and "--now" not in argv:  # one call for several units
            for unit in argv[argv.index("--") + 1:]:
                self.state(unit)["UnitFileState"] = "enabled"
            return 0, "", ""
        unit = argv[-1]
        st = self.state(unit)
        if verb in ("restart", "start"):
            self._next += 1
            st.update(ActiveState="active", SubState="running", InvocationID="inv%d" % self._next,
                      ran=self.disk(unit))
        elif verb == "enable":
            st["UnitFileState"] = "enabled"
            if "--now" in argv:
                self._next += 1
                st.update(ActiveState="active", SubState="running", InvocationID="inv%d" % self._next,
                          ran=self.disk(unit))
        elif verb == "disable":
            st["UnitFileState"] = "disabled"
            if "--now" in argv:
                st.update(ActiveState="inactive", SubState="dead", ran=None)
        else:
            raise AssertionError(argv)
        return 0, "", ""

    def sleep(self, seconds):
        pass


def unit_text(name, exe):
    return "%s%s\n[Unit]\nDescription=%s\n\n[Service]\nExecStart=%s\n" % (UNIT_MARKER, name, name, exe)


def dropin_text(unit, cpus):
    return "%s%s\n[Service]\nCPUAffinity=%s\n" % (DROPIN_MARKER, unit, cpus)


class Scene:
    """A node with running instances, and the apply that changes it."""

    def __init__(self, root):
        self.root = root
        self.unit_dir = os.path.join(root, "system")
        self.plan = os.path.join(root, "etc", "gpunuma", "plan.json")
        self.pending = os.path.join(root, "var", "lib", "gpunuma", "pending-restarts.json")
        old = {
            "gpunuma-llm0.service": unit_text("llm0", "/usr/bin/old0"),
            "gpunuma-llm1.service": unit_text("llm1", "/usr/bin/old1"),
            "gpunuma-llm3.service": unit_text("llm3", "/usr/bin/same3"),
            "gpunuma-gone.service": unit_text("gone", "/usr/bin/gone"),
            "containerd.service.d/" + DROPIN_NAME: dropin_text("containerd.service", "0-3"),
            "nginx.service.d/" + DROPIN_NAME: dropin_text("nginx.service", "4-7"),
        }
        self.old = {}
        for rel, text in old.items():
            path = os.path.join(self.unit_dir, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as stream:
                stream.write(text)
            self.old[path] = text.encode()
        os.makedirs(os.path.dirname(self.plan))
        with open(self.plan, "w") as stream:
            stream.write('{"instances": 3}\n')
        self.old[self.plan] = b'{"instances": 3}\n'
        self.files = [
            self.entry("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/new0")),
            self.entry("gpunuma-llm1.service", unit_text("llm1", "/usr/bin/new1")),
            self.entry("gpunuma-llm2.service", unit_text("llm2", "/usr/bin/new2")),
            self.entry("gpunuma-llm3.service", unit_text("llm3", "/usr/bin/same3")),
            self.entry("containerd.service.d/" + DROPIN_NAME, dropin_text("containerd.service", "0-7"),
                       unit="containerd.service"),
        ]
        self.after = [{"path": self.plan, "content": '{"instances": 4}\n', "mode": "0644"}]
        self.wanted = {e["path"]: e["content"].encode() for e in self.files + self.after}
        self.gone = [os.path.join(self.unit_dir, "gpunuma-gone.service"),
                     os.path.join(self.unit_dir, "nginx.service.d", DROPIN_NAME)]

    def entry(self, rel, text, unit=None):
        return {"path": os.path.join(self.unit_dir, rel), "content": text, "mode": "0644",
                "unit": unit or rel}

    def systemd(self, steps):
        fake = Systemd(self.unit_dir, steps)
        for unit in ("gpunuma-llm0.service", "gpunuma-llm1.service", "gpunuma-llm3.service",
                     "gpunuma-gone.service", "containerd.service", "nginx.service"):
            fake.boot_running(unit)
        return fake

    def run(self, fake, steps, alive=None, files=None):
        module = _load_module()
        module.os = FaultyOs(steps)
        module.tempfile = FaultyTempfile(steps)
        apply = Apply((files or module.NodeFiles)(FakeModule().run_command), fake, fake.sleep, alive=alive)
        return apply.run(
            normalise_files(self.files),
            prune={"unit_dir": self.unit_dir, "unit_pattern": "gpunuma-*.service", "unit_marker": UNIT_MARKER,
                   "dropin_name": DROPIN_NAME, "dropin_marker": DROPIN_MARKER,
                   "keep_units": SERVICES, "keep_dropins": ["containerd.service"]},
            units={"start": True, "services": SERVICES, "settle_seconds": 1, "restart_batch": 2},
            after_success=self.after, pending_path=self.pending)

    def tree(self):
        out = {}
        for directory, _, names in os.walk(self.root):
            for name in names:
                path = os.path.join(directory, name)
                with open(path, "rb") as stream:
                    out[path] = stream.read()
        return out


def _is_backup_of(path, data, scene):
    for original, old in scene.old.items():
        if path.startswith(original + ".") and path.endswith("~"):
            return data == old
    return None


def _check_consistent(scene, where):
    """Every file is whole: old bytes, new bytes, a whole backup, or a temporary file."""
    for path, data in scene.tree().items():
        name = os.path.basename(path)
        if name.startswith(TEMP_PREFIX):
            continue
        backup = _is_backup_of(path, data, scene)
        if backup is not None:
            assert backup, "%s: backup %s is not the whole previous file: %r" % (where, path, data)
            continue
        if path == scene.pending:
            assert isinstance(json.loads(data), list), where
            continue
        allowed = {scene.old.get(path), scene.wanted.get(path)} - {None}
        assert data in allowed, "%s: %s holds %r, neither its old nor its new bytes" % (where, path, data)


def _check_converged(scene, fake, result, where):
    assert not result.get("failed"), (where, result.get("msg"))
    tree = scene.tree()
    for path, data in scene.wanted.items():
        assert tree.get(path) == data, "%s: %s not converged" % (where, path)
    for path in scene.gone:
        assert path not in tree, "%s: %s not pruned" % (where, path)
    leftovers = [p for p in tree if os.path.basename(p).startswith(TEMP_PREFIX)]
    assert leftovers == [], "%s: temporary files left: %s" % (where, leftovers)
    assert not os.path.exists(scene.pending), "%s: restarts still pending" % where
    for unit in SERVICES + ["containerd.service"]:
        assert fake.runs_disk(unit), "%s: %s does not run the file on disk (%r)" % (where, unit, fake.state(unit))
        if unit in SERVICES:
            assert fake.state(unit)["UnitFileState"] == "enabled", (where, unit)
    for unit in ("gpunuma-gone.service",):
        assert fake.state(unit)["ActiveState"] == "inactive", (where, unit)
    # nginx lost its drop-in: it runs without it.
    assert fake.runs_disk("nginx.service"), (where, fake.state("nginx.service"))


def _clean_steps(tmp_path):
    scene = Scene(str(tmp_path / "count"))
    steps = Steps()
    fake = scene.systemd(steps)
    result = scene.run(fake, steps)
    _check_converged(scene, fake, result, "clean run")
    return steps.done


def test_clean_run_converges_and_a_second_run_changes_nothing(tmp_path):
    scene = Scene(str(tmp_path / "node"))
    steps = Steps()
    fake = scene.systemd(steps)
    result = scene.run(fake, steps)
    _check_converged(scene, fake, result, "clean run")
    assert result["restarted"] == ["gpunuma-llm0.service", "gpunuma-llm1.service", "containerd.service",
                                   "nginx.service"]
    assert result["started"] == ["gpunuma-llm2.service"]
    # The steps of a realistic apply: writes, removals, reload, restarts.
    assert len(steps.done) > 20
    assert any(s.startswith("systemctl daemon-reload") for s in steps.done)

    again = Steps()
    fake.steps = again
    second = scene.run(fake, again)
    assert second["changed"] is False, second
    assert again.done == []


def test_every_step_of_the_apply_is_counted(tmp_path):
    done = _clean_steps(tmp_path)
    # Each changed file: temporary file, write, fsync, chmod, rename; the
    # replaced ones a backup first.
    assert sum(1 for s in done if s == "mkstemp") >= 6  # 4 changed files, the pending list, the plan
    assert sum(1 for s in done if s.startswith("rename -> ")) >= 6
    assert [s for s in done if s.startswith("unlink ")] == \
        ["unlink gpunuma-gone.service", "unlink " + DROPIN_NAME, "unlink pending-restarts.json"]


def _crash_then_rerun(tmp_path, k):
    scene = Scene(str(tmp_path / ("k%03d" % k)))
    steps = Steps(crash_at=k)
    fake = scene.systemd(steps)
    with pytest.raises(Crash):
        scene.run(fake, steps)
    where = "crash at step %d (%s)" % (k, steps.done[-1])
    _check_consistent(scene, where)
    if os.path.exists(scene.plan) and open(scene.plan, "rb").read() == scene.wanted[scene.plan]:
        # The plan is written last: every unit already runs its new file.
        for unit in SERVICES + ["containerd.service"]:
            assert fake.runs_disk(unit), (where, unit)

    # The host is back; processes that were running still run what they ran.
    rerun = Steps()
    fake.steps = rerun
    written_not_restarted = [u for u in SERVICES + ["containerd.service", "nginx.service"]
                             if fake.state(u)["ActiveState"] == "active" and not fake.runs_disk(u)]
    result = scene.run(fake, rerun)
    _check_converged(scene, fake, result, where + ", then a plain run")
    for unit in written_not_restarted:
        assert unit in result["restarted"], "%s: %s was written but not restarted, and the re-run left it" % (
            where, unit)
        assert result["changed"] is True

    final = Steps()
    fake.steps = final
    third = scene.run(fake, final)
    assert third["changed"] is False and final.done == [], (where, third)
    return steps.done[-1]


def test_a_crash_at_every_step_leaves_whole_files_and_a_plain_run_converges(tmp_path):
    total = len(_clean_steps(tmp_path))
    crashed_at = [_crash_then_rerun(tmp_path, k) for k in range(1, total + 1)]
    # Every kind of step was a crash point.
    kinds = {label.split(" ")[0] for label in crashed_at}
    assert {"mkdir", "mkstemp", "write", "fsync", "chmod", "rename", "unlink", "systemctl"} <= kinds, kinds
    assert total > 60


def test_a_unit_written_but_never_restarted_is_restarted_by_the_next_run(tmp_path):
    """The crash right after the last unit's rename: nothing restarted yet."""
    scene = Scene(str(tmp_path / "node"))
    done = _clean_steps(tmp_path)
    k = done.index("systemctl daemon-reload") + 1
    steps = Steps(crash_at=k)
    fake = scene.systemd(steps)
    with pytest.raises(Crash):
        scene.run(fake, steps)
    for path, data in scene.wanted.items():
        if path != scene.plan:
            assert open(path, "rb").read() == data
    assert not fake.runs_disk("gpunuma-llm0.service")
    assert json.loads(open(scene.pending).read()) == ["containerd.service", "gpunuma-llm0.service",
                                                      "gpunuma-llm1.service", "gpunuma-llm2.service",
                                                      "nginx.service"]
    rerun = Steps()
    fake.steps = rerun
    result = scene.run(fake, rerun)
    # The files no longer differ, yet the units are restarted, after a reload.
    assert [f["changed"] for f in result["files"]][:5] == [False] * 5
    assert result["changed"] is True and result["daemon_reload"] is True
    assert result["restarted"] == ["containerd.service", "gpunuma-llm0.service", "gpunuma-llm1.service",
                                   "nginx.service"]
    assert result["started"] == ["gpunuma-llm2.service"]
    assert rerun.done.index("systemctl daemon-reload") < rerun.done.index("systemctl restart -- gpunuma-llm0.service")
    _check_converged(scene, fake, result, "re-run")


def test_a_failed_rollout_keeps_pending_only_what_still_runs_an_older_file(tmp_path):
    """llm0 fails after its restart and is rolled back; llm1 (the next batch) never restarted and got its
    old file back: nothing is left pending. A unit left pending by an earlier run stays pending."""
    scene = Scene(str(tmp_path / "node"))
    steps = Steps()
    fake = scene.systemd(steps)
    os.makedirs(os.path.dirname(scene.pending))
    with open(scene.pending, "w") as stream:
        stream.write('["gpunuma-llm3.service"]\n')

    class Failing(Systemd):
        def __call__(self, argv):
            rc, out, err = super().__call__(argv)
            if argv[:2] == ["systemctl", "restart"] and argv[-1] == "gpunuma-llm0.service" \
                    and b"new0" in (self.state(argv[-1])["ran"][0] or b""):
                self.state(argv[-1]).update(ActiveState="failed", SubState="failed", Result="exit-code")
            return rc, out, err

    failing = Failing(scene.unit_dir, steps)
    failing.units = fake.units
    module = _load_module()
    apply = Apply(module.NodeFiles(FakeModule().run_command), failing, failing.sleep)
    result = apply.run(normalise_files(scene.files[:2]),
                       units={"start": True, "services": SERVICES[:2] + ["gpunuma-llm3.service"],
                              "settle_seconds": 1, "restart_batch": 1},
                       after_success=scene.after, pending_path=scene.pending)
    assert result["failed"] is True
    assert result["failed_units"] == ["gpunuma-llm0.service"]
    assert result["rolled_back"] == ["gpunuma-llm0.service", "gpunuma-llm1.service"]
    assert result["not_restarted"] == ["gpunuma-llm1.service", "gpunuma-llm3.service"]
    assert json.loads(open(scene.pending).read()) == ["gpunuma-llm3.service"]
    assert failing.runs_disk("gpunuma-llm0.service") and failing.runs_disk("gpunuma-llm1.service")
    assert open(scene.plan, "rb").read() == scene.old[scene.plan]


def test_check_mode_reports_the_pending_restarts_and_touches_nothing(tmp_path):
    scene = Scene(str(tmp_path / "node"))
    steps = Steps(crash_at=_clean_steps(tmp_path).index("systemctl daemon-reload") + 1)
    fake = scene.systemd(steps)
    with pytest.raises(Crash):
        scene.run(fake, steps)
    assert steps.done[-1] == "systemctl daemon-reload"
    before = scene.tree()
    module = _load_module()
    checking = Steps(crash_at=1)  # any change would be a step, and die
    module.os = FaultyOs(checking)
    fake.steps = checking
    apply = Apply(module.NodeFiles(FakeModule().run_command), fake, fake.sleep, check_mode=True)
    result = apply.run(normalise_files(scene.files), units={"start": True, "services": SERVICES},
                       after_success=scene.after, pending_path=scene.pending)
    assert checking.done == []
    assert scene.tree() == before
    assert result["changed"] is True and result["daemon_reload"] is True
    assert result["restarted"] == ["containerd.service", "gpunuma-llm0.service", "gpunuma-llm1.service",
                                   "nginx.service"]


def test_a_pending_list_that_is_not_gpunuma_s_stops_the_run_before_any_change(tmp_path):
    scene = Scene(str(tmp_path / "node"))
    os.makedirs(os.path.dirname(scene.pending))
    with open(scene.pending, "w") as stream:
        stream.write('{"units": "gpunuma-llm0.service"}\n')
    before = scene.tree()
    steps = Steps()
    fake = scene.systemd(steps)
    with pytest.raises(ApplyError, match="pending-restarts.json is not gpunuma's list of pending restarts"):
        scene.run(fake, steps)
    assert steps.done == [] and scene.tree() == before


# ------------------------------------------------------- a write that fails

class FullDisk:
    """NodeFiles whose write fails with ENOSPC from the n-th unit file on (the pending list is written as before)."""

    def __init__(self, files, fail_at, error=28):
        self.files, self.fail_at, self.error, self.writes = files, fail_at, error, 0

    def __getattr__(self, name):
        return getattr(self.files, name)

    def write(self, entry):
        if not entry["path"].endswith(".service"):
            return self.files.write(entry)
        self.writes += 1
        if self.writes >= self.fail_at:
            raise OSError(self.error, os.strerror(self.error))
        return self.files.write(entry)


@pytest.mark.parametrize("fail_at", [1, 2, 3])
def test_a_failed_write_puts_back_what_was_written_and_changes_nothing_live(tmp_path, fail_at):
    from test_node_apply import FakeModule, FakeSystemd, NodeFiles

    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    (unit_dir / "gpunuma-a.service").write_text("# gpunuma instance a\nold a\n")
    (unit_dir / "gpunuma-b.service").write_text("# gpunuma instance b\nold b\n")
    before = {p.name: p.read_text() for p in unit_dir.iterdir()}
    fake = FakeSystemd({"gpunuma-a.service": {"ActiveState": "active"}, "gpunuma-b.service": {"ActiveState": "active"}})
    pending = tmp_path / "pending.json"
    files = normalise_files([
        {"path": str(unit_dir / "gpunuma-a.service"), "content": "# gpunuma instance a\nnew a\n", "unit": "gpunuma-a.service"},
        {"path": str(unit_dir / "gpunuma-b.service"), "content": "# gpunuma instance b\nnew b\n", "unit": "gpunuma-b.service"},
        {"path": str(unit_dir / "gpunuma-c.service"), "content": "# gpunuma instance c\nnew c\n", "unit": "gpunuma-c.service"},
    ])
    apply = Apply(FullDisk(NodeFiles(FakeModule().run_command), fail_at), fake, fake.sleep)
    with pytest.raises(ApplyError) as err:
        apply.run(files, units={"start": True, "services": ["gpunuma-a.service", "gpunuma-b.service",
                                                               "gpunuma-c.service"]},
                  pending_path=str(pending))
    message = str(err.value)
    failed = ["gpunuma-a.service", "gpunuma-b.service", "gpunuma-c.service"][fail_at - 1]
    assert "cannot write %s: [Errno 28] ENOSPC: No space left on device" % (unit_dir / failed) in message
    assert "nothing was stopped, reloaded or restarted" in message
    assert ("the %d file(s) written before it were put back" % (fail_at - 1)) in message if fail_at > 1 \
        else "no file had been written" in message
    # Every unit file as it was, nothing new, no temporary file; systemd never asked to change anything.
    left = {p.name: p.read_text() for p in unit_dir.iterdir() if not p.name.endswith("~")}
    assert left == before
    assert not [p for p in unit_dir.iterdir() if p.name.startswith(TEMP_PREFIX)]
    assert [c for c in fake.calls if c[:1] != ["show"] and "show" not in c] == []
    # Nothing is left pending for the next run to restart.
    assert not pending.exists()


# ------------------------------------------------- the controller goes away

def _check_on_old_plan(scene, fake, result, where):
    """The node runs exactly what it ran before the run: old files, pruned files back, old processes' files."""
    assert result.get("failed"), where
    tree = scene.tree()
    for path, data in scene.old.items():
        assert tree.get(path) == data, "%s: %s is not back to its old bytes" % (where, path)
    assert os.path.join(scene.unit_dir, "gpunuma-llm2.service") not in tree, where
    leftovers = [p for p in tree if os.path.basename(p).startswith(TEMP_PREFIX)]
    assert leftovers == [], "%s: temporary files left: %s" % (where, leftovers)
    pending = json.loads(tree[scene.pending]) if scene.pending in tree else []
    assert pending == [], "%s: restarts left pending %s" % (where, pending)
    for unit in ("gpunuma-llm0.service", "gpunuma-llm1.service", "gpunuma-llm3.service", "gpunuma-gone.service",
                 "containerd.service", "nginx.service"):
        assert fake.runs_disk(unit), "%s: %s does not run its file on disk (%r)" % (where, unit, fake.state(unit))
    assert fake.state("gpunuma-llm2.service")["ActiveState"] != "active", where


class Gone:
    """alive() for Apply: the controller is there for the first ``after`` questions, then gone."""

    def __init__(self, after):
        self.after, self.asked = after, 0

    def __call__(self):
        self.asked += 1
        return "signal SIGINT" if self.asked > self.after else None


def test_a_controller_that_goes_away_leaves_the_node_on_the_old_plan_or_the_new_one(tmp_path):
    """Asked at each step boundary (before the writes, before the first live change, before each later restart
    batch): gone at any of them, the node is back on its old files and processes; gone after the last batch
    settled, the run finishes and the applied plan is written with the units."""
    outcomes = []
    for after in range(0, 6):
        scene = Scene(str(tmp_path / ("gone%d" % after)))
        steps = Steps()
        fake = scene.systemd(steps)
        alive = Gone(after)
        where = "controller gone after %d question(s)" % after
        try:
            result = scene.run(fake, steps, alive=alive)
        except ApplyError as exc:
            result = {"failed": True, "msg": str(exc)}
        if alive.asked <= after:
            _check_converged(scene, fake, result, where)
            outcomes.append("new")
            break
        assert "the controller went away (signal SIGINT)" in result["msg"], (where, result["msg"])
        _check_on_old_plan(scene, fake, result, where)
        outcomes.append(result["msg"].split(":")[0])
    # Every kind of boundary was met, and the run that outlived every question converged.
    assert outcomes[:2] == ["stopped before writing anything", "stopped before any live change"], outcomes
    assert outcomes[2:-1] and all(o == "stopped" for o in outcomes[2:-1]), outcomes
    assert outcomes[-1] == "new", outcomes


def test_a_plan_that_cannot_be_written_after_the_restarts_puts_the_node_back(tmp_path):
    """The applied plan and the units are one transaction: a full disk at the plan puts every unit back."""
    scene = Scene(str(tmp_path / "node"))
    steps = Steps()
    fake = scene.systemd(steps)

    def files(run_command):
        real = _load_module().NodeFiles(run_command)

        class PlanDiskFull:
            def __getattr__(self, name):
                return getattr(real, name)

            def write(self, entry):
                if entry["path"] == scene.plan:
                    raise OSError(28, os.strerror(28))
                return real.write(entry)
        return PlanDiskFull()

    result = scene.run(fake, steps, files=files)
    assert "stopped: cannot write %s: [Errno 28] ENOSPC" % scene.plan in result["msg"], result["msg"]
    assert "free the space" in result["msg"]
    _check_on_old_plan(scene, fake, result, "plan write failed")
    # The next run, with space, converges.
    again = Steps()
    fake.steps = again
    _check_converged(scene, fake, scene.run(fake, again), "after the full disk")
