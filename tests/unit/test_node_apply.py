"""gpunuma_apply's core (module_utils/gpunuma/node/apply/reconcile.py) on real files under tmp_path.

Files go through the module's own ``NodeFiles`` (module_utils/gpunuma/node/apply/fs.py)
with a small stand-in for AnsibleModule (backup_local, run_command); systemd
is a fake that keeps per-unit state and records every command.
"""

import importlib.util
import os
import stat
import subprocess
import sys

import pytest

from ansible.module_utils.gpunuma.node.apply.reconcile import Apply
from ansible.module_utils.gpunuma.node.apply.files import ApplyError, find_stale, normalise_files, plan_files
from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

_spec = importlib.util.spec_from_file_location("gpunuma_apply_module",
                                               os.path.join(REPO_ROOT, "library", "gpunuma_apply.py"))
gpunuma_apply = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpunuma_apply)
NodeFiles = gpunuma_apply.NodeFiles

UNIT_MARKER = "# gpunuma instance "
DROPIN_MARKER = "# gpunuma binding of "
DROPIN_NAME = "50-gpunuma.conf"

# A validate command that accepts a file only when it holds "[Service]".
VALIDATE_SERVICE = [sys.executable, "-c",
                    "import sys; d = open(sys.argv[1]).read(); "
                    "sys.exit(0) if '[Service]' in d else (sys.stderr.write('no [Service] section'), sys.exit(1))",
                    "%s"]


class FakeModule:
    """What NodeFiles uses of AnsibleModule (its backups are NodeFiles' own, written atomically)."""

    def __init__(self):
        self.commands = []

    def run_command(self, argv):
        self.commands.append(list(argv))
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        return proc.returncode, proc.stdout, proc.stderr


class FakeSystemd:
    """systemctl and journalctl over a dict of unit states.

    ``on_settle`` maps a unit to the properties it has after the settle sleep
    (a crash after start, a restart by systemd); ``refuse`` maps a unit to the
    error its restart/start prints.
    """

    PROPS = ("ActiveState", "SubState", "Result", "UnitFileState", "InvocationID", "NRestarts")

    def __init__(self, units=None, on_settle=None, refuse=None, journal=None, unit_dir=None):
        self.units = {name: dict(state) for name, state in (units or {}).items()}
        self.on_settle = on_settle or {}
        self.refuse = refuse or {}
        self.journal = journal or {}
        self.unit_dir = unit_dir
        self.calls = []
        self.sleeps = []
        self.files_at_call = []
        self._next = 0

    def state(self, unit):
        return self.units.setdefault(unit, {"ActiveState": "inactive", "SubState": "dead", "Result": "success",
                                            "UnitFileState": "", "InvocationID": "", "NRestarts": "0"})

    def _invocation(self):
        self._next += 1
        return "inv%04d" % self._next

    def _run(self, unit):
        st = self.state(unit)
        st.update(ActiveState="active", SubState="running", Result="success", InvocationID=self._invocation())

    def __call__(self, argv):
        argv = list(argv)
        self.calls.append(argv)
        if self.unit_dir:
            self.files_at_call.append((tuple(argv), sorted(os.listdir(self.unit_dir))))
        if argv[0] == "journalctl":
            unit = argv[argv.index("--unit") + 1]
            return 0, "".join(line + "\n" for line in self.journal.get(unit, [])), ""
        assert argv[0] == "systemctl", argv
        verb = argv[1]
        if verb == "show":
            props = argv[2].split("=", 1)[1].split(",")
            assert argv[3] == "--"
            blocks = []
            for unit in argv[4:]:
                st = self.state(unit)
                blocks.append("".join("%s=%s\n" % (p, st.get(p, "")) for p in props))
            return 0, "\n".join(blocks), ""
        if verb == "daemon-reload":
            return 0, "", ""
        if verb == "enable":  # one call for several units
            for unit in argv[argv.index("--") + 1:]:
                self.state(unit)["UnitFileState"] = "enabled"
            return 0, "", ""
        unit = argv[-1]
        assert argv[-2] == "--", argv
        if verb in ("restart", "start"):
            if unit in self.refuse:
                self.state(unit).update(ActiveState="failed", SubState="failed", Result="exit-code")
                return 1, "", self.refuse[unit]
            self._run(unit)
            return 0, "", ""
        if verb == "disable":
            st = self.state(unit)
            st["UnitFileState"] = "disabled"
            if "--now" in argv:
                st.update(ActiveState="inactive", SubState="dead")
            return 0, "", ""
        raise AssertionError("unexpected command %r" % argv)

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.calls.append(["sleep"])
        for unit, props in self.on_settle.items():
            self.state(unit).update(props)

    # ---------------------------------------------------------------- views
    def mutating(self):
        return [c for c in self.calls if c[0] == "systemctl" and c[1] != "show"]

    def verb(self, verb):
        """The units of every call of ``verb``, in order (a call may name several after ``--``)."""
        return [u for c in self.calls if c[0] == "systemctl" and c[1] == verb and verb != "daemon-reload"
                for u in c[c.index("--") + 1:]]

    def reloads(self):
        return sum(1 for c in self.calls if c[:2] == ["systemctl", "daemon-reload"])


def running(inv="old", enabled="enabled"):
    return {"ActiveState": "active", "SubState": "running", "Result": "success", "UnitFileState": enabled,
            "InvocationID": inv, "NRestarts": "0"}


def stopped(enabled="disabled"):
    return {"ActiveState": "inactive", "SubState": "dead", "Result": "success", "UnitFileState": enabled,
            "InvocationID": "", "NRestarts": "0"}


def unit_text(name, exe="/usr/bin/serve"):
    return "%s%s\n[Unit]\nDescription=%s\n\n[Service]\nExecStart=%s\n" % (UNIT_MARKER, name, name, exe)


def dropin_text(unit, cpus="0-3"):
    return "%s%s\n[Service]\nCPUAffinity=%s\n" % (DROPIN_MARKER, unit, cpus)


class Node:
    """A unit directory under tmp_path with a few files, and helpers."""

    def __init__(self, tmp_path):
        self.root = tmp_path
        self.unit_dir = tmp_path / "system"
        self.unit_dir.mkdir()
        self.plan_path = tmp_path / "etc" / "gpunuma" / "plan.json"

    def put(self, rel, text, mode=0o644):
        path = self.unit_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        os.chmod(path, mode)
        return path

    def path(self, rel):
        return str(self.unit_dir / rel)

    def entry(self, rel, text, unit=None, **extra):
        entry = {"path": self.path(rel), "content": text, "unit": unit}
        entry.update(extra)
        return entry

    def prune(self, keep_units=(), keep_dropins=()):
        return {"unit_dir": str(self.unit_dir), "unit_pattern": "gpunuma-*.service", "unit_marker": UNIT_MARKER,
                "dropin_name": DROPIN_NAME, "dropin_marker": DROPIN_MARKER,
                "keep_units": list(keep_units), "keep_dropins": list(keep_dropins)}

    def after_success(self, text='{"instances": 2}\n'):
        return [{"path": str(self.plan_path), "content": text, "mode": "0644"}]

    def backups(self):
        """Backups (``<path>.<pid>.<time>~``) anywhere under the root."""
        return sorted(os.path.join(d, f) for d, _, fs in os.walk(self.root) for f in fs if f.endswith("~"))

    def leftovers(self):
        """Temporary files of atomic writes left anywhere under the root."""
        return [os.path.join(d, f) for d, _, fs in os.walk(self.root) for f in fs if f.startswith(".gpunuma-")]


@pytest.fixture
def node(tmp_path):
    return Node(tmp_path)


def apply_run(fake, files, check_mode=False, module=None, **kwargs):
    apply = Apply(NodeFiles((module or FakeModule()).run_command), fake, fake.sleep, check_mode=check_mode)
    return apply.run(normalise_files(files), **kwargs)


UNITS = {"start": True, "settle_seconds": 3}


# ------------------------------------------------------------------ unchanged

def test_unchanged_files_report_no_change_and_restart_nothing(node):
    llm0 = node.put("gpunuma-llm0.service", unit_text("llm0"))
    node.put("containerd.service.d/" + DROPIN_NAME, dropin_text("containerd.service"))
    fake = FakeSystemd({"gpunuma-llm0.service": running(), "containerd.service": running()})
    mtime = os.stat(llm0).st_mtime_ns

    result = apply_run(fake, [
        node.entry("gpunuma-llm0.service", unit_text("llm0"), unit="gpunuma-llm0.service"),
        node.entry("containerd.service.d/" + DROPIN_NAME, dropin_text("containerd.service"),
                   unit="containerd.service"),
    ], units=dict(UNITS, services=["gpunuma-llm0.service"]))

    assert result["changed"] is False
    assert [f["changed"] for f in result["files"]] == [False, False]
    assert result["restarted"] == [] and result["started"] == [] and result["enabled"] == []
    assert fake.mutating() == []
    assert fake.sleeps == []
    assert "daemon_reload" not in result
    assert os.stat(llm0).st_mtime_ns == mtime
    assert node.backups() == []


def test_a_running_instance_systemd_restarted_is_named_every_run(node):
    """Settle honestly: an instance that crashed after its settle window and was restarted by systemd (Restart=)
    runs again when the next run looks, and is still said to have restarted, with the count."""
    node.put("gpunuma-llm0.service", unit_text("llm0"))
    fake = FakeSystemd({"gpunuma-llm0.service": dict(running(), NRestarts="3"),
                        "gpunuma-llm1.service": running()})
    node.put("gpunuma-llm1.service", unit_text("llm1"))
    result = apply_run(fake, [node.entry("gpunuma-llm%d.service" % i, unit_text("llm%d" % i),
                                         unit="gpunuma-llm%d.service" % i) for i in (0, 1)],
                       units=dict(UNITS, services=["gpunuma-llm0.service", "gpunuma-llm1.service"]))
    assert result["changed"] is False and fake.mutating() == []
    assert result["restarted_by_systemd"] == {"gpunuma-llm0.service": 3}


def test_mode_only_change_is_a_change_without_a_diff(node):
    path = node.put("gpunuma-llm0.service", unit_text("llm0"), mode=0o600)
    fake = FakeSystemd({"gpunuma-llm0.service": running()})
    result = apply_run(fake, [node.entry("gpunuma-llm0.service", unit_text("llm0"), mode="0644")])
    assert result["changed"] is True
    assert result["diff"] == []
    assert os.stat(path).st_mode & 0o7777 == 0o644
    assert path.read_text() == unit_text("llm0")


# ------------------------------------------------------------------ changed unit of an existing service

def test_changed_unit_written_atomically_backed_up_and_only_it_restarted(node):
    old = unit_text("llm0", "/usr/bin/old")
    new = unit_text("llm0", "/usr/bin/new")
    llm0 = node.put("gpunuma-llm0.service", old)
    node.put("gpunuma-llm1.service", unit_text("llm1"))
    fake = FakeSystemd({"gpunuma-llm0.service": running("a"), "gpunuma-llm1.service": running("b"),
                        "containerd.service": running("c")})
    # An open descriptor on the old file still reads the old bytes after an
    # atomic replace (a rewrite in place would change them).
    with open(llm0, "rb") as held:
        result = apply_run(fake, [
            node.entry("gpunuma-llm0.service", new, unit="gpunuma-llm0.service", validate=VALIDATE_SERVICE),
            node.entry("gpunuma-llm1.service", unit_text("llm1"), unit="gpunuma-llm1.service"),
        ], units=dict(UNITS, services=["gpunuma-llm0.service", "gpunuma-llm1.service"]),
            after_success=node.after_success())
        assert held.read().decode() == old

    assert result["changed"] is True
    assert not result.get("failed")
    assert llm0.read_text() == new
    [backup] = node.backups()
    assert backup.startswith(str(llm0) + ".%d." % os.getpid())
    assert open(backup).read() == old
    # Kept for rollback alone: readable by its owner only once the run succeeded.
    assert os.stat(backup).st_mode & 0o7777 == 0o600
    assert result["files"][0] == {"path": str(llm0), "changed": True, "created": False, "backup": backup}
    assert result["files"][1]["changed"] is False
    assert fake.reloads() == 1
    assert result["daemon_reload"] is True
    assert fake.verb("restart") == ["gpunuma-llm0.service"]
    assert result["restarted"] == ["gpunuma-llm0.service"]
    assert fake.verb("start") == [] and fake.verb("enable") == [] and fake.verb("disable") == []
    assert fake.units["gpunuma-llm1.service"]["InvocationID"] == "b"
    assert fake.units["containerd.service"]["InvocationID"] == "c"
    # daemon-reload comes before the restart, and the restart after the write.
    verbs = [c[1] for c in fake.mutating()]
    assert verbs == ["daemon-reload", "restart"]
    assert fake.sleeps == [3]
    assert node.plan_path.read_text() == '{"instances": 2}\n'
    assert node.leftovers() == []
    # The unit's diff, then the plan written after success.
    diff, plan_diff = result["diff"]
    assert plan_diff["before_header"] == str(node.plan_path) + " (absent)"
    assert diff["before"] == old and diff["after"] == new and diff["before_header"] == str(llm0)


def test_new_service_is_enabled_and_started_not_restarted(node):
    fake = FakeSystemd({"gpunuma-llm2.service": stopped(enabled="")})
    result = apply_run(fake, [node.entry("gpunuma-llm2.service", unit_text("llm2"), unit="gpunuma-llm2.service")],
                       units=dict(UNITS, services=["gpunuma-llm2.service"]))
    assert (node.unit_dir / "gpunuma-llm2.service").read_text() == unit_text("llm2")
    assert result["files"][0]["created"] is True and "backup" not in result["files"][0]
    assert fake.verb("restart") == []
    assert fake.verb("enable") == ["gpunuma-llm2.service"]
    assert fake.verb("start") == ["gpunuma-llm2.service"]
    assert result["started"] == ["gpunuma-llm2.service"] and result["enabled"] == ["gpunuma-llm2.service"]
    assert result["restarted"] == []
    assert fake.reloads() == 1
    assert result["diff"][0]["before_header"].endswith("(absent)")


def test_stopped_unchanged_service_is_started_without_reload(node):
    node.put("gpunuma-llm0.service", unit_text("llm0"))
    fake = FakeSystemd({"gpunuma-llm0.service": stopped(enabled="enabled")})
    result = apply_run(fake, [node.entry("gpunuma-llm0.service", unit_text("llm0"), unit="gpunuma-llm0.service")],
                       units=dict(UNITS, services=["gpunuma-llm0.service"]))
    assert result["changed"] is True
    assert fake.reloads() == 0
    assert fake.verb("start") == ["gpunuma-llm0.service"] and fake.verb("enable") == []


@pytest.mark.parametrize("state,restarted", [("active", True), ("activating", True), ("inactive", False),
                                             ("failed", False)])
def test_dropin_target_restarted_only_when_running(node, state, restarted):
    st = running("k") if state == "active" else dict(stopped(), ActiveState=state)
    fake = FakeSystemd({"containerd.service": st})
    result = apply_run(fake, [node.entry("containerd.service.d/" + DROPIN_NAME, dropin_text("containerd.service"),
                                         unit="containerd.service")], units=dict(UNITS))
    assert (node.unit_dir / "containerd.service.d" / DROPIN_NAME).exists()
    assert fake.reloads() == 1
    assert fake.verb("restart") == (["containerd.service"] if restarted else [])
    assert fake.verb("start") == []
    assert result["restarted"] == (["containerd.service"] if restarted else [])
    assert not result.get("failed")


def test_slice_dropin_change_reloads_systemd_without_restarting_anything(node):
    """A slice's AllowedCPUs= applies on a daemon-reload: a changed drop-in without a unit still reloads."""
    fake = FakeSystemd({"system.slice": running()})
    result = apply_run(fake, [node.entry("system.slice.d/50-gpunuma-confine.conf", "[Slice]\nAllowedCPUs=0-1\n")],
                       units=dict(UNITS))
    assert fake.reloads() == 1 and result["daemon_reload"] is True
    assert fake.verb("restart") == [] and result["restarted"] == []
    # unchanged: nothing at all
    fake = FakeSystemd({"system.slice": running()})
    result = apply_run(fake, [node.entry("system.slice.d/50-gpunuma-confine.conf", "[Slice]\nAllowedCPUs=0-1\n")],
                       units=dict(UNITS))
    assert fake.reloads() == 0 and not result["changed"]


@pytest.mark.parametrize("state, restarted", [("active", True), ("inactive", False)])
@pytest.mark.parametrize("start", [True, False])
def test_removed_dropin_of_a_service_not_ours_restarts_it_when_it_runs(node, state, restarted, start):
    """irqbalance's ban drop-in goes: irqbalance reads its environment again, if it runs (one engine, no YAML)."""
    node.put("irqbalance.service.d/50-gpunuma-banned-cpus.conf", "[Service]\nEnvironment=X=1\n")
    st = running("irq") if state == "active" else stopped("enabled")
    fake = FakeSystemd({"irqbalance.service": st})
    path = node.path("irqbalance.service.d/50-gpunuma-banned-cpus.conf")
    result = apply_run(fake, [], absent=[{"path": path, "unit": "irqbalance.service"}],
                       units=dict(UNITS, start=start))
    assert not os.path.exists(path) and fake.reloads() == 1
    assert fake.verb("restart") == (["irqbalance.service"] if restarted else [])
    assert result["restarted"] == (["irqbalance.service"] if restarted else [])
    # already gone: nothing restarts
    fake = FakeSystemd({"irqbalance.service": running("irq")})
    result = apply_run(fake, [], absent=[{"path": path, "unit": "irqbalance.service"}], units=dict(UNITS, start=start))
    assert fake.verb("restart") == [] and not result["changed"]


@pytest.mark.parametrize("mode, state, restarted", [
    ("changed", "inactive", True),      # an instance service: restarted (started) even when stopped
    ("if-running", "inactive", False),
    ("if-running", "active", True),
    ("never", "active", False),
])
def test_restart_modes_of_a_changed_file(node, mode, state, restarted):
    node.put("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/old"))
    st = running() if state == "active" else stopped("enabled")
    fake = FakeSystemd({"gpunuma-llm0.service": st})
    entry = node.entry("gpunuma-llm0.service", unit_text("llm0"), unit="gpunuma-llm0.service", restart=mode)
    result = apply_run(fake, [entry], units=dict(UNITS, services=["gpunuma-llm0.service"]))
    assert fake.reloads() == 1
    assert ("gpunuma-llm0.service" in result["restarted"]) == restarted


@pytest.mark.parametrize("mode, restarted", [("if-running", True), ("never", False), ("changed", False)])
def test_without_units_to_start_only_if_running_files_restart_their_unit(node, mode, restarted):
    """memlock's own step (no units to start): containerd's drop-in restarts it only with consent (if-running)."""
    fake = FakeSystemd({"containerd.service": running("c")})
    entry = node.entry("containerd.service.d/50-gpunuma-memlock.conf", "[Service]\nLimitMEMLOCK=infinity\n",
                       unit="containerd.service", restart=mode)
    result = apply_run(fake, [entry])
    assert fake.reloads() == 1
    assert fake.verb("restart") == (["containerd.service"] if restarted else [])
    assert result["restarted"] == (["containerd.service"] if restarted else [])


def test_bad_restart_mode_and_absent_entries_are_refused(node):
    with pytest.raises(ApplyError) as caught:
        normalise_files([node.entry("a.service", "x", restart="sometimes")])
    assert "files[0].restart: 'sometimes' is not allowed; allowed: changed, if-running, never" in str(caught.value)
    fake = FakeSystemd()
    for absent, words in (([{"path": "relative"}], "absent[0] must be an absolute path"),
                          ([{"path": "/x", "unit": "irqbalance"}], "absent[0].unit must be a systemd unit name"),
                          ([{"path": "/x", "mode": "0644"}], "absent[0]: mode not allowed; allowed: path, unit")):
        with pytest.raises(ApplyError) as caught:
            apply_run(fake, [], absent=absent, units=dict(UNITS))
        assert words in str(caught.value)
    assert fake.calls == []


def test_units_not_started_when_start_is_false(node):
    node.put("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/old"))
    fake = FakeSystemd({"gpunuma-llm0.service": running()})
    result = apply_run(fake, [node.entry("gpunuma-llm0.service", unit_text("llm0"), unit="gpunuma-llm0.service")],
                       units={"start": False, "services": ["gpunuma-llm0.service"]},
                       after_success=node.after_success())
    assert [c[1] for c in fake.calls] == ["daemon-reload"]
    assert result["restarted"] == []
    assert node.plan_path.exists()


# ------------------------------------------------------------------ validation

def test_validation_failure_of_any_file_writes_nothing(node):
    llm0 = node.put("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/old"))
    fake = FakeSystemd({"gpunuma-llm0.service": running()})
    stale = node.put("gpunuma-gone.service", unit_text("gone"))
    module = FakeModule()
    with pytest.raises(ApplyError) as err:
        apply_run(fake, [
            node.entry("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/new"), unit="gpunuma-llm0.service",
                       validate=VALIDATE_SERVICE),
            node.entry("gpunuma-llm1.service", unit_text("llm1"), unit="gpunuma-llm1.service"),
            node.entry("gpunuma-bad.service", "[Unit]\nDescription=no service\n", unit="gpunuma-bad.service",
                       validate=VALIDATE_SERVICE),
        ], module=module, prune=node.prune(keep_units=["gpunuma-llm0.service"]),
            units=dict(UNITS, services=["gpunuma-llm0.service"]), after_success=node.after_success())
    msg = str(err.value)
    assert node.path("gpunuma-bad.service") in msg and "no [Service] section" in msg
    assert msg.endswith("nothing was written")
    assert node.path("gpunuma-llm0.service") not in msg
    # Both changed files with a validate command were checked, on copies.
    assert len(module.commands) == 2
    assert all(node.path("") not in c[-1] for c in module.commands)
    assert llm0.read_text() == unit_text("llm0", "/usr/bin/old")
    assert not (node.unit_dir / "gpunuma-llm1.service").exists()
    assert not (node.unit_dir / "gpunuma-bad.service").exists()
    assert stale.exists()
    assert not node.plan_path.exists()
    assert node.backups() == []
    assert fake.calls == []
    assert node.leftovers() == []


def test_validation_only_for_changed_files(node):
    node.put("gpunuma-llm0.service", "[Unit]\n")
    module = FakeModule()
    fake = FakeSystemd()
    result = apply_run(fake, [node.entry("gpunuma-llm0.service", "[Unit]\n", validate=VALIDATE_SERVICE)],
                       module=module)
    assert result["changed"] is False and module.commands == []


# ------------------------------------------------------------------ check mode

def _check_mode_scene(node):
    node.put("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/old"))
    node.put("gpunuma-gone.service", unit_text("gone"))
    node.put("nginx.service.d/" + DROPIN_NAME, dropin_text("nginx.service"))
    fake = FakeSystemd({"gpunuma-llm0.service": running("a"), "gpunuma-gone.service": running("g"),
                        "nginx.service": running("n"), "containerd.service": running("c"),
                        "gpunuma-llm2.service": stopped(enabled="")})
    files = [
        node.entry("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/new"), unit="gpunuma-llm0.service",
                   validate=VALIDATE_SERVICE),
        node.entry("gpunuma-llm2.service", unit_text("llm2"), unit="gpunuma-llm2.service"),
        node.entry("containerd.service.d/" + DROPIN_NAME, dropin_text("containerd.service"),
                   unit="containerd.service"),
    ]
    services = ["gpunuma-llm0.service", "gpunuma-llm2.service"]
    kwargs = dict(prune=node.prune(keep_units=services, keep_dropins=["containerd.service"]),
                  units=dict(UNITS, services=services), after_success=node.after_success())
    return fake, files, kwargs


def _snapshot(root):
    return {os.path.join(d, f): open(os.path.join(d, f), "rb").read()
            for d, _, fs in os.walk(root) for f in fs}


def test_check_mode_reports_the_same_decisions_and_touches_nothing(node, tmp_path_factory):
    fake, files, kwargs = _check_mode_scene(node)
    before = _snapshot(node.root)
    module = FakeModule()
    checked = apply_run(fake, files, check_mode=True, module=module, **kwargs)

    assert _snapshot(node.root) == before
    assert node.backups() == []
    assert [c[1] for c in fake.calls if c[0] == "systemctl"] and fake.mutating() == []
    assert all(c[0] == "systemctl" and c[1] == "show" for c in fake.calls)
    assert fake.sleeps == []

    # The same scene applied for real makes the same decisions.
    real_node = Node(tmp_path_factory.mktemp("real"))
    real_fake, real_files, real_kwargs = _check_mode_scene(real_node)
    applied = apply_run(real_fake, real_files, **real_kwargs)
    assert not applied.get("failed")

    for key in ("changed", "restarted", "started", "enabled", "stopped", "daemon_reload"):
        assert checked.get(key) == applied.get(key), key
    assert checked["changed"] is True
    assert checked["restarted"] == ["gpunuma-llm0.service", "containerd.service", "nginx.service"]
    assert checked["started"] == ["gpunuma-llm2.service"]
    assert checked["stopped"] == ["gpunuma-gone.service"]
    assert [os.path.relpath(p, str(node.root)) for p in checked["removed"]] == \
        [os.path.relpath(p, str(real_node.root)) for p in applied["removed"]]

    def strip(diffs, root):
        return [{k: v.replace(str(root), "<root>") for k, v in d.items()} for d in diffs]

    assert strip(checked["diff"], node.root) == strip(applied["diff"], real_node.root)
    # Diffs for the three changed files, the two removals and the plan.
    assert len(checked["diff"]) == 6
    assert [f["changed"] for f in checked["files"]] == [True, True, True, True]
    assert all("backup" not in f for f in checked["files"])


# ------------------------------------------------------------------ prune

def test_prune_stops_and_removes_only_marked_stale_files(node):
    node.put("gpunuma-llm0.service", unit_text("llm0"))
    gone = node.put("gpunuma-gone.service", unit_text("gone"))
    foreign = node.put("gpunuma-foreign.service", "[Unit]\nDescription=someone else's\n[Service]\nExecStart=/x\n")
    kept_dropin = node.put("containerd.service.d/" + DROPIN_NAME, dropin_text("containerd.service"))
    stale_dropin = node.put("nginx.service.d/" + DROPIN_NAME, dropin_text("nginx.service"))
    other_conf = node.put("nginx.service.d/10-local.conf", "[Service]\nNice=5\n")
    unmarked_dropin = node.put("redis.service.d/" + DROPIN_NAME, "[Service]\nNice=1\n")
    fake = FakeSystemd({"gpunuma-llm0.service": running("a"), "gpunuma-gone.service": running("g"),
                        "gpunuma-foreign.service": running("f"), "nginx.service": running("n"),
                        "containerd.service": running("c"), "redis.service": running("r")},
                       unit_dir=str(node.unit_dir))

    result = apply_run(fake, [
        node.entry("gpunuma-llm0.service", unit_text("llm0"), unit="gpunuma-llm0.service"),
        node.entry("containerd.service.d/" + DROPIN_NAME, dropin_text("containerd.service"),
                   unit="containerd.service"),
    ], prune=node.prune(keep_units=["gpunuma-llm0.service"], keep_dropins=["containerd.service"]),
        units=dict(UNITS, services=["gpunuma-llm0.service"]))

    assert not gone.exists()
    assert not stale_dropin.exists()
    assert foreign.exists() and kept_dropin.exists() and other_conf.exists() and unmarked_dropin.exists()
    assert sorted(result["removed"]) == sorted([str(gone), str(stale_dropin)])
    assert result["stopped"] == ["gpunuma-gone.service"]
    disables = [c for c in fake.calls if c[:2] == ["systemctl", "disable"]]
    assert disables == [["systemctl", "disable", "--now", "--", "gpunuma-gone.service"]]
    # The unit was stopped while its file still existed.
    [(_, listing)] = [(argv, names) for argv, names in fake.files_at_call if argv[1] == "disable"]
    assert "gpunuma-gone.service" in listing
    assert fake.reloads() == 1
    assert fake.verb("restart") == ["nginx.service"]
    assert result["restarted"] == ["nginx.service"]
    assert fake.units["gpunuma-foreign.service"]["ActiveState"] == "active"
    assert fake.units["containerd.service"]["InvocationID"] == "c"
    assert fake.units["redis.service"]["InvocationID"] == "r"
    assert result["changed"] is True and not result.get("failed")


def test_prune_stale_dropin_of_a_stopped_unit_is_not_started(node):
    stale_dropin = node.put("nginx.service.d/" + DROPIN_NAME, dropin_text("nginx.service"))
    fake = FakeSystemd({"nginx.service": stopped()})
    result = apply_run(fake, [], prune=node.prune(), units=dict(UNITS))
    assert not stale_dropin.exists()
    assert fake.reloads() == 1
    assert fake.verb("restart") == [] and fake.verb("start") == []
    assert result["restarted"] == []


def test_find_stale_lists_marked_files_only(node):
    node.put("gpunuma-a.service", unit_text("a"))
    node.put("gpunuma-b.service", unit_text("b"))
    node.put("gpunuma-c.service", "[Unit]\n")
    node.put("other.service", unit_text("other"))
    node.put("x.service.d/" + DROPIN_NAME, dropin_text("x.service"))
    node.put("y.service.d/" + DROPIN_NAME, dropin_text("y.service"))
    node.put("z.service.d/" + DROPIN_NAME, "[Service]\n")
    os.symlink(node.path("x.service.d"), node.path("w.service.d"))
    assert find_stale(node.prune(keep_units=["gpunuma-b.service"], keep_dropins=["y.service"]),
                      {"gpunuma-b.service"}, {"y.service"}) == (["gpunuma-a.service"], ["x.service"])


def test_find_stale_without_unit_dir(tmp_path):
    prune = {"unit_dir": str(tmp_path / "missing"), "unit_pattern": "gpunuma-*.service", "unit_marker": "m",
             "dropin_name": "d.conf", "dropin_marker": "m"}
    assert find_stale(prune, set(), set()) == ([], [])


# ------------------------------------------------------------------ failure and rollback

def test_failed_existing_unit_is_restored_from_backup(node):
    old = unit_text("llm0", "/usr/bin/old")
    new = unit_text("llm0", "/usr/bin/broken")
    llm0 = node.put("gpunuma-llm0.service", old)
    node.put("gpunuma-llm1.service", unit_text("llm1", "/usr/bin/old1"))
    fake = FakeSystemd({"gpunuma-llm0.service": running("a"), "gpunuma-llm1.service": running("b")},
                       on_settle={"gpunuma-llm0.service": {"ActiveState": "failed", "SubState": "failed",
                                                          "Result": "exit-code", "NRestarts": "3"}},
                       journal={"gpunuma-llm0.service": ["llm0 boom: bad flag", "llm0 exited 2"]})
    result = apply_run(fake, [
        node.entry("gpunuma-llm0.service", new, unit="gpunuma-llm0.service"),
        node.entry("gpunuma-llm1.service", unit_text("llm1", "/usr/bin/new1"), unit="gpunuma-llm1.service"),
    ], units=dict(UNITS, services=["gpunuma-llm0.service", "gpunuma-llm1.service"], restart_batch=2),
        after_success=node.after_success())

    assert result["failed"] is True
    assert result["failed_units"] == ["gpunuma-llm0.service"]
    assert result["rolled_back"] == ["gpunuma-llm0.service"]
    assert llm0.read_text() == old
    # The unit that settled keeps its new file.
    assert (node.unit_dir / "gpunuma-llm1.service").read_text() == unit_text("llm1", "/usr/bin/new1")
    msg = result["msg"]
    assert msg.splitlines()[0] == "instance units failed to start: gpunuma-llm0.service"
    assert "rolled back to their previous files" in msg
    assert "gpunuma-llm0.service: ActiveState=failed SubState=failed Result=exit-code NRestarts=3" in msg
    assert "llm0 boom: bad flag" in msg and "llm0 exited 2" in msg
    assert "gpunuma-llm1.service" not in msg
    assert not node.plan_path.exists()
    assert fake.reloads() == 2
    restarts = fake.verb("restart")
    assert sorted(restarts[:2]) == ["gpunuma-llm0.service", "gpunuma-llm1.service"]
    assert restarts[2:] == ["gpunuma-llm0.service"]
    # The reload after the restore comes before the restored unit's restart.
    tail = [c[1] for c in fake.mutating()][-2:]
    assert tail == ["daemon-reload", "restart"]
    journal = [c for c in fake.calls if c[0] == "journalctl"]
    assert journal == [["journalctl", "--no-pager", "--output=short-iso", "--lines", "20", "--unit",
                        "gpunuma-llm0.service"]]


def test_new_unit_that_fails_is_disabled_and_removed(node):
    fake = FakeSystemd({"gpunuma-llm2.service": stopped(enabled="")},
                       on_settle={"gpunuma-llm2.service": {"ActiveState": "failed", "SubState": "failed",
                                                          "Result": "exit-code"}},
                       journal={"gpunuma-llm2.service": ["llm2 cannot open device"]})
    result = apply_run(fake, [node.entry("gpunuma-llm2.service", unit_text("llm2"), unit="gpunuma-llm2.service")],
                       units=dict(UNITS, services=["gpunuma-llm2.service"], journal_lines=7),
                       after_success=node.after_success())
    assert not (node.unit_dir / "gpunuma-llm2.service").exists()
    assert result["rolled_back"] == ["gpunuma-llm2.service"]
    assert ["systemctl", "disable", "--now", "--", "gpunuma-llm2.service"] in fake.calls
    # A removed new unit is not restarted.
    assert fake.verb("restart") == []
    assert fake.reloads() == 2
    assert "instance units failed to start: gpunuma-llm2.service" in result["msg"]
    assert "llm2 cannot open device" in result["msg"]
    assert ["journalctl", "--no-pager", "--output=short-iso", "--lines", "7", "--unit",
            "gpunuma-llm2.service"] in fake.calls
    assert not node.plan_path.exists()


def test_unit_restarted_by_systemd_during_settle_counts_as_failed(node):
    llm0 = node.put("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/old"))
    # Still "active", but a different invocation: it crashed and systemd restarted it.
    fake = FakeSystemd({"gpunuma-llm0.service": running("a")},
                       on_settle={"gpunuma-llm0.service": {"InvocationID": "restarted-by-systemd",
                                                          "NRestarts": "1"}})
    result = apply_run(fake, [node.entry("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/new"),
                                         unit="gpunuma-llm0.service")],
                       units=dict(UNITS, services=["gpunuma-llm0.service"]), after_success=node.after_success())
    assert result["failed"] is True
    assert result["failed_units"] == ["gpunuma-llm0.service"]
    assert "ActiveState=active" in result["msg"] and "NRestarts=1" in result["msg"]
    assert llm0.read_text() == unit_text("llm0", "/usr/bin/old")
    assert not node.plan_path.exists()


def test_refused_restart_is_reported_with_systemctl_error(node):
    node.put("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/old"))
    fake = FakeSystemd({"gpunuma-llm0.service": running("a")},
                       refuse={"gpunuma-llm0.service": "Job for gpunuma-llm0.service failed."})
    result = apply_run(fake, [node.entry("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/new"),
                                         unit="gpunuma-llm0.service")],
                       units=dict(UNITS, services=["gpunuma-llm0.service"]))
    assert result["failed_units"] == ["gpunuma-llm0.service"]
    assert "(systemctl: Job for gpunuma-llm0.service failed.)" in result["msg"]


def test_failed_dropin_target_gets_its_new_dropin_removed_and_restarted(node):
    fake = FakeSystemd({"containerd.service": running("c")},
                       on_settle={"containerd.service": {"ActiveState": "failed"}})
    dropin = "containerd.service.d/" + DROPIN_NAME
    result = apply_run(fake, [node.entry(dropin, dropin_text("containerd.service"), unit="containerd.service")],
                       units=dict(UNITS))
    assert not (node.unit_dir / dropin).exists()
    assert result["rolled_back"] == ["containerd.service"]
    assert fake.verb("disable") == []
    assert fake.verb("restart") == ["containerd.service", "containerd.service"]


def test_no_rollback_leaves_the_new_files(node):
    llm0 = node.put("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/old"))
    fake = FakeSystemd({"gpunuma-llm0.service": running("a")},
                       on_settle={"gpunuma-llm0.service": {"ActiveState": "failed"}})
    result = apply_run(fake, [node.entry("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/new"),
                                         unit="gpunuma-llm0.service")],
                       units=dict(UNITS, services=["gpunuma-llm0.service"], rollback_on_failure=False),
                       after_success=node.after_success())
    assert result["failed"] is True
    assert llm0.read_text() == unit_text("llm0", "/usr/bin/new")
    assert result["rolled_back"] == []
    assert "not rolled back" in result["msg"]
    assert "rolled back to their previous files" not in result["msg"]
    assert fake.reloads() == 1
    assert fake.verb("restart") == ["gpunuma-llm0.service"]
    assert not node.plan_path.exists()


def test_after_success_written_when_every_unit_settles(node):
    node.plan_path.parent.mkdir(parents=True)
    node.plan_path.write_text('{"instances": 1}\n')
    fake = FakeSystemd({"gpunuma-llm2.service": stopped(enabled="")})
    result = apply_run(fake, [node.entry("gpunuma-llm2.service", unit_text("llm2"), unit="gpunuma-llm2.service")],
                       units=dict(UNITS, services=["gpunuma-llm2.service"]), after_success=node.after_success())
    assert not result.get("failed")
    assert node.plan_path.read_text() == '{"instances": 2}\n'
    [backup] = node.backups()
    assert backup.startswith(str(node.plan_path) + ".")
    assert open(backup).read() == '{"instances": 1}\n'
    assert result["files"][-1]["path"] == str(node.plan_path) and result["files"][-1]["changed"] is True


def test_after_success_created_with_its_directory(node):
    fake = FakeSystemd()
    result = apply_run(fake, [], after_success=node.after_success())
    assert node.plan_path.read_text() == '{"instances": 2}\n'
    assert result["changed"] is True and fake.calls == []


# ------------------------------------------------------------------ refusals

def test_non_regular_file_at_a_wanted_path_is_refused(node):
    target = node.put("real.service", "x")
    os.symlink(str(target), node.path("gpunuma-llm0.service"))
    with pytest.raises(ApplyError, match="it is a symbolic link .to .*real.service.; a file gpunuma manages is read only as a regular file; move it aside"):
        apply_run(FakeSystemd(), [node.entry("gpunuma-llm0.service", "y")])
    assert target.read_text() == "x"


def test_daemon_reload_failure_is_an_error(node):
    class Failing(FakeSystemd):
        def __call__(self, argv):
            if argv[:2] == ["systemctl", "daemon-reload"]:
                self.calls.append(list(argv))
                return 1, "", "Access denied"
            return super().__call__(argv)
    with pytest.raises(ApplyError, match="daemon-reload failed: Access denied"):
        apply_run(Failing(), [node.entry("gpunuma-x.service", unit_text("x"), unit="gpunuma-x.service")],
                  units=dict(UNITS))


@pytest.mark.parametrize("files,message", [
    ([{"path": "/etc/a.conf", "content": "a"}, {"path": "etc/b.conf", "content": "b"}],
     r"files\[1\]\.path must be an absolute path"),
    ([{"path": "/etc/a.conf", "content": "a"}, {"path": "/etc//./a.conf", "content": "b"}],
     r"files\[1\]\.path /etc/a.conf is listed twice"),
    ([{"path": "/etc/a.conf", "content": b"bytes"}], r"files\[0\]\.content must be text, got 'bytes'"),
    ([{"path": "/etc/a.conf", "content": None}], r"files\[0\]\.content must be text"),
    ([{"path": "/etc/a.conf", "content": "a", "mode": "rw-r--r--"}],
     r"files\[0\]\.mode: mode 'rw-r--r--' is not an octal mode"),
    ([{"path": "/etc/a.conf", "content": "a", "mode": "17777"}], r"files\[0\]\.mode: mode '17777' is out of range"),
    ([{"path": "/etc/a.conf", "content": "a", "dir_mode": "9"}], r"files\[0\]\.dir_mode: mode '9'"),
    ([{"path": "/etc/a.conf", "content": "a", "validate": ["systemd-analyze", "verify"]}],
     r"files\[0\]\.validate must be a command .* one holding %s"),
    ([{"path": "/etc/a.conf", "content": "a", "validate": "visudo -cf %s"}], r"files\[0\]\.validate must be"),
    ([{"path": "/etc/a.conf", "content": "a", "validate": []}], r"files\[0\]\.validate must be"),
    (["/etc/a.conf"], r"files\[0\] must be a mapping"),
    ([{"path": "/etc/a\0.conf", "content": "a"}], r"files\[0\]\.path must be an absolute path"),
])
def test_normalise_files_refusals_name_the_field(files, message):
    with pytest.raises(ApplyError, match=message):
        normalise_files(files)


def test_normalise_files_field_name_and_defaults():
    with pytest.raises(ApplyError, match=r"after_success\[0\]\.path"):
        normalise_files([{"path": "plan.json", "content": ""}], "after_success")
    [entry] = normalise_files([{"path": "/etc/x/../a.conf", "content": "é", "validate": ["check", "-f", "%s"]}])
    assert entry["path"] == "/etc/a.conf"
    assert entry["data"] == "é".encode("utf-8")
    assert entry["mode"] == 0o644 and entry["dir_mode"] == 0o755
    assert entry["backup"] is True and entry["restart"] == "changed"
    assert normalise_files(None) == []
    assert normalise_files([{"path": "/a", "content": "", "mode": "0600"}])[0]["mode"] == 0o600


def test_plan_files_marks_content_and_attribute_changes(node):
    node.put("same.conf", "a\n")
    node.put("mode.conf", "a\n", mode=0o600)
    node.put("text.conf", "old\n")
    decisions = plan_files(normalise_files([
        node.entry("same.conf", "a\n"), node.entry("mode.conf", "a\n"), node.entry("text.conf", "new\n"),
        node.entry("new.conf", "n\n"),
    ]), NodeFiles(FakeModule().run_command))
    assert [(d["content_changed"], d["changed"], d["existed"]) for d in decisions] == [
        (False, False, True), (False, True, True), (True, True, True), (True, True, False)]
    assert decisions[2]["before"] == b"old\n" and decisions[3]["before"] is None


def test_failed_existing_unit_without_backup_gets_its_previous_bytes_back(node):
    old = unit_text("llm0", "/usr/bin/old")
    llm0 = node.put("gpunuma-llm0.service", old)
    fake = FakeSystemd({"gpunuma-llm0.service": running("a")},
                       on_settle={"gpunuma-llm0.service": {"ActiveState": "failed"}})
    module = FakeModule()
    result = apply_run(fake, [node.entry("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/new"),
                                         unit="gpunuma-llm0.service", backup=False)],
                       module=module, units=dict(UNITS, services=["gpunuma-llm0.service"]))
    assert node.backups() == [] and "backup" not in result["files"][0]
    assert result["rolled_back"] == ["gpunuma-llm0.service"]
    # The unit existed: it is put back as it was, never deleted or disabled.
    assert llm0.read_text() == old
    assert fake.verb("disable") == []
    assert fake.verb("restart") == ["gpunuma-llm0.service", "gpunuma-llm0.service"]
    assert node.leftovers() == []


def test_rolling_restart_stops_at_the_first_failed_batch(node):
    """Batches of one: llm0 fails, so llm1 is never restarted and gets its old file back."""
    old0, old1 = unit_text("llm0", "/usr/bin/old"), unit_text("llm1", "/usr/bin/old1")
    llm0 = node.put("gpunuma-llm0.service", old0)
    llm1 = node.put("gpunuma-llm1.service", old1)
    fake = FakeSystemd({"gpunuma-llm0.service": running("a"), "gpunuma-llm1.service": running("b")},
                       on_settle={"gpunuma-llm0.service": {"ActiveState": "failed", "SubState": "failed",
                                                          "Result": "exit-code", "NRestarts": "1"}})
    result = apply_run(fake, [
        node.entry("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/broken"), unit="gpunuma-llm0.service"),
        node.entry("gpunuma-llm1.service", unit_text("llm1", "/usr/bin/new1"), unit="gpunuma-llm1.service"),
    ], units=dict(UNITS, services=["gpunuma-llm0.service", "gpunuma-llm1.service"], restart_batch=1),
        after_success=node.after_success())

    assert result["failed"] is True
    assert result["failed_units"] == ["gpunuma-llm0.service"]
    assert result["not_restarted"] == ["gpunuma-llm1.service"]
    assert llm0.read_text() == old0 and llm1.read_text() == old1
    # llm1 was never restarted: not in the batch, and not after the rollback either.
    assert "gpunuma-llm1.service" not in fake.verb("restart")
    assert "not restarted (the rolling restart stopped at the failure" in result["msg"]
    assert not node.plan_path.exists()


def test_rolling_restart_settles_each_batch_before_the_next(node):
    node.put("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/old"))
    node.put("gpunuma-llm1.service", unit_text("llm1", "/usr/bin/old1"))
    fake = FakeSystemd({"gpunuma-llm0.service": running("a"), "gpunuma-llm1.service": running("b")})
    result = apply_run(fake, [
        node.entry("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/new"), unit="gpunuma-llm0.service"),
        node.entry("gpunuma-llm1.service", unit_text("llm1", "/usr/bin/new1"), unit="gpunuma-llm1.service"),
    ], units=dict(UNITS, services=["gpunuma-llm0.service", "gpunuma-llm1.service"], restart_batch=1))
    assert not result.get("failed")
    assert result["restarted"] == ["gpunuma-llm0.service", "gpunuma-llm1.service"]
    # One settle wait per batch, and the second restart only after the first wait.
    assert len(fake.sleeps) == 2
    order = [c[-1] for c in fake.calls if c[:2] == ["systemctl", "restart"] or c == ["sleep"]]
    assert order == ["gpunuma-llm0.service", "sleep", "gpunuma-llm1.service", "sleep"]


# ------------------------------------------------------------------ readiness

def _ready_run(node, fake, answers, spec):
    calls = []

    def http_get(url, timeout):
        calls.append(url)
        return answers.pop(0) if answers else (False, "connection refused")

    apply = Apply(NodeFiles(FakeModule().run_command), fake, fake.sleep, http_get=http_get)
    result = apply.run(normalise_files([
        node.entry("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/new"), unit="gpunuma-llm0.service")]),
        units=dict(UNITS, services=["gpunuma-llm0.service"], readiness={"gpunuma-llm0.service": spec}),
        after_success=node.after_success())
    return result, calls


def test_restart_settles_only_when_the_instance_answers(node):
    node.put("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/old"))
    fake = FakeSystemd({"gpunuma-llm0.service": running("a")})
    result, calls = _ready_run(node, fake, [(False, "connection refused"), (False, "HTTP 503"), (True, "HTTP 200")],
                               {"url": "http://127.0.0.1:8000/health", "timeout": 60, "interval": 2})
    assert not result.get("failed"), result.get("msg")
    assert calls == ["http://127.0.0.1:8000/health"] * 3
    assert node.plan_path.exists()


def test_instance_that_never_answers_is_rolled_back(node):
    old = unit_text("llm0", "/usr/bin/old")
    unit = node.put("gpunuma-llm0.service", old)
    fake = FakeSystemd({"gpunuma-llm0.service": running("a")})
    result, calls = _ready_run(node, fake, [], {"url": "http://127.0.0.1:8000/health", "timeout": 6, "interval": 2})
    assert result["failed"] is True
    assert len(calls) == 4  # at 0, 2, 4 and 6 s
    assert "not ready: http://127.0.0.1:8000/health after 6 s (connection refused)" in result["msg"]
    assert unit.read_text() == old
    assert not node.plan_path.exists()


# ------------------------------------------------------------------ readiness runs as the unit's account

def _command_ready_run(node, fake, spec, runner_answers):
    """An apply whose readiness is a command; returns (result, argvs the command ran as)."""
    ran = []

    def runner(argv):
        if argv[0] in ("systemctl", "journalctl"):
            return fake(argv)
        ran.append(list(argv))
        return runner_answers.pop(0) if runner_answers else (1, "", "still starting")

    apply = Apply(NodeFiles(FakeModule().run_command), runner, fake.sleep)
    result = apply.run(normalise_files([
        node.entry("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/new"), unit="gpunuma-llm0.service")]),
        units=dict(UNITS, services=["gpunuma-llm0.service"], readiness={"gpunuma-llm0.service": spec}),
        after_success=node.after_success())
    return result, ran


def test_readiness_command_runs_as_the_units_user(node, monkeypatch):
    import pwd
    entry = pwd.struct_passwd(("gpunuma", "x", 990, 985, "", "/var/lib/gpunuma-instances", "/usr/sbin/nologin"))
    monkeypatch.setattr(pwd, "getpwnam", lambda name: entry if name == "gpunuma" else (_ for _ in ()).throw(KeyError(name)))
    node.put("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/old"))
    fake = FakeSystemd({"gpunuma-llm0.service": dict(running("a"), User="gpunuma", Group="")})
    result, ran = _command_ready_run(node, fake, {"command": ["/usr/local/bin/ready", "--port", "8000"],
                                                  "timeout": 10, "interval": 1}, [(0, "", "")])
    assert not result.get("failed"), result.get("msg")
    assert ran == [["setpriv", "--reuid=990", "--regid=985", "--init-groups", "--reset-env", "--",
                    "/usr/local/bin/ready", "--port", "8000"]]


def test_readiness_command_of_a_root_unit_runs_as_given(node):
    node.put("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/old"))
    fake = FakeSystemd({"gpunuma-llm0.service": dict(running("a"), User="", Group="")})
    result, ran = _command_ready_run(node, fake, {"command": ["/bin/true"], "timeout": 10, "interval": 1}, [(0, "", "")])
    assert not result.get("failed"), result.get("msg")
    assert ran == [["/bin/true"]]


def test_readiness_command_of_an_unknown_account_never_runs_and_rolls_back(node, monkeypatch):
    import pwd

    def unknown(name):
        raise KeyError(name)

    monkeypatch.setattr(pwd, "getpwnam", unknown)
    old = unit_text("llm0", "/usr/bin/old")
    unit = node.put("gpunuma-llm0.service", old)
    fake = FakeSystemd({"gpunuma-llm0.service": dict(running("a"), User="ghost", Group="")})
    result, ran = _command_ready_run(node, fake, {"command": ["/bin/true"], "timeout": 10, "interval": 1}, [])
    assert ran == []
    assert result["failed"] is True
    assert "User=ghost, which this node does not know; it is never run as root instead" in result["msg"]
    assert unit.read_text() == old


@pytest.mark.parametrize("user, group, expect", [
    ("root", "", ["/bin/true"]),
    ("0", "", ["/bin/true"]),
    (None, None, ["/bin/true"]),
    ("990", "", ["setpriv", "--reuid=990", "--regid=985", "--init-groups", "--reset-env", "--", "/bin/true"]),
    ("gpunuma", "7", ["setpriv", "--reuid=990", "--regid=7", "--init-groups", "--reset-env", "--", "/bin/true"]),
])
def test_readiness_argv(user, group, expect, monkeypatch):
    import pwd

    from ansible.module_utils.gpunuma.node.apply.units import readiness_argv
    entry = pwd.struct_passwd(("gpunuma", "x", 990, 985, "", "/", "/usr/sbin/nologin"))
    monkeypatch.setattr(pwd, "getpwnam", lambda name: entry)
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: entry)
    assert readiness_argv(["/bin/true"], user, group) == expect


# ------------------------------------------------------------------ backups pruned after success

def _old_backups(node, rel, count):
    paths = []
    for day in range(1, count + 1):
        path = node.put("%s.%d.2026-11-%02d@03:00:00~" % (rel, 100 + day, day), "old %d\n" % day)
        paths.append(str(path))
    return paths


def _new_llm0(node, backups_keep):
    """A successful run that changes gpunuma-llm0.service, keeping ``backups_keep`` backups; its result."""
    fake = FakeSystemd({"gpunuma-llm0.service": running("a")})
    result = apply_run(fake, [node.entry("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/new"),
                                         unit="gpunuma-llm0.service")],
                       units=dict(UNITS, services=["gpunuma-llm0.service"]), after_success=node.after_success(),
                       backups_keep=backups_keep)
    assert not result.get("failed"), result.get("msg")
    return result


def test_success_keeps_the_newest_backups_per_file(node):
    node.put("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/old"))
    old = _old_backups(node, "gpunuma-llm0.service", 7)
    unrelated = node.put("other.service.1.2026-11-01@03:00:00~", "not ours to prune\n")
    result = _new_llm0(node, backups_keep=3)
    # This run's backup and the two newest before it stay; the five oldest go, oldest first.
    assert result["pruned_backups"] == old[:5]
    kept = [b for b in node.backups() if os.path.basename(b).startswith("gpunuma-llm0.service.")]
    assert len(kept) == 3 and old[5] in kept and old[6] in kept
    assert unrelated.exists()


def test_backups_are_readable_by_their_owner_alone_after_success(node):
    """A backup is for rollback: an older gpunuma's world-readable unit backup (which may hold a secret written
    before secrets moved to 0600 environment files) and this run's own are made 0600; the unit keeps 0644."""
    node.put("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/old"))
    old = _old_backups(node, "gpunuma-llm0.service", 2)
    for path in old:
        os.chmod(path, 0o644)
    unrelated = node.put("other.service.1.2026-11-01@03:00:00~", "not ours\n")
    os.chmod(unrelated, 0o644)
    _new_llm0(node, backups_keep=5)
    backups = [b for b in node.backups() if os.path.basename(b).startswith("gpunuma-llm0.service.")]
    assert len(backups) == 3 and all(stat.S_IMODE(os.stat(b).st_mode) == 0o600 for b in backups), backups
    assert stat.S_IMODE(os.stat(node.path("gpunuma-llm0.service")).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(unrelated).st_mode) == 0o644


def test_failed_run_prunes_nothing(node):
    node.put("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/old"))
    old = _old_backups(node, "gpunuma-llm0.service", 7)
    fake = FakeSystemd({"gpunuma-llm0.service": running("a")}, refuse={"gpunuma-llm0.service": "boom"})
    result = apply_run(fake, [node.entry("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/new"),
                                         unit="gpunuma-llm0.service")],
                       units=dict(UNITS, services=["gpunuma-llm0.service"]), after_success=node.after_success(),
                       backups_keep=3)
    assert result["failed"] is True and result["pruned_backups"] == []
    assert all(os.path.exists(p) for p in old)


def test_backups_keep_zero_keeps_all_and_bad_values_are_refused(node):
    node.put("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/old"))
    old = _old_backups(node, "gpunuma-llm0.service", 7)
    fake = FakeSystemd({"gpunuma-llm0.service": running("a")})
    result = apply_run(fake, [node.entry("gpunuma-llm0.service", unit_text("llm0", "/usr/bin/new"),
                                         unit="gpunuma-llm0.service")],
                       units=dict(UNITS, services=["gpunuma-llm0.service"]), backups_keep=0)
    assert result["pruned_backups"] == [] and all(os.path.exists(p) for p in old)
    with pytest.raises(ApplyError, match=r"backups_keep: -1 is not allowed; allowed: 0 \(keep every backup\)"):
        apply_run(fake, [], backups_keep=-1)


def test_pruned_dropin_leaves_no_backups_and_no_empty_directory(node):
    node.put("nginx.service.d/" + DROPIN_NAME, dropin_text("nginx.service"))
    old = node.put("nginx.service.d/%s.100.2026-11-01@03:00:00~" % DROPIN_NAME, dropin_text("nginx.service", "0-1"))
    node.put("redis.service.d/" + DROPIN_NAME, dropin_text("redis.service"))
    theirs = node.put("redis.service.d/10-admin.conf", "[Service]\nNice=5\n")
    fake = FakeSystemd({"nginx.service": running("n"), "redis.service": running("r")})
    result = apply_run(fake, [], prune=node.prune(), units=dict(UNITS, services=[]))
    assert not result.get("failed"), result.get("msg")
    assert str(old) in result["pruned_backups"]
    assert not (node.unit_dir / "nginx.service.d").exists()
    assert node.path("nginx.service.d") in result["removed"]
    # Someone else's drop-in keeps its directory.
    assert theirs.exists() and not (node.unit_dir / "redis.service.d" / DROPIN_NAME).exists()


# ------------------------------------------------------------------ account

class AccountNode(FakeSystemd):
    """systemd, and useradd: the accounts it created (the node's passwd database, as far as the step sees it)."""

    def __init__(self, *args, useradd_rc=0, **kwargs):
        super().__init__(*args, **kwargs)
        self.users, self.useradd_rc = set(), useradd_rc

    def __call__(self, argv):
        if argv[0] == "useradd":
            self.calls.append(list(argv))
            if self.unit_dir:
                self.files_at_call.append((tuple(argv), sorted(os.listdir(self.unit_dir))))
            if self.useradd_rc:
                return self.useradd_rc, "", "useradd: cannot lock /etc/passwd; try again later."
            self.users.add(argv[-1])
            return 0, "", ""
        return super().__call__(argv)


ACCOUNT = {"name": "gpunuma", "comment": "gpunuma inference instances", "home": "/var/lib/gpunuma-instances",
           "shell": "/usr/sbin/nologin", "groups": ["video"]}


def test_the_account_is_created_before_the_units_are_validated_and_started(node, monkeypatch):
    from ansible.module_utils.gpunuma.node import accounts
    fake = AccountNode({}, unit_dir=str(node.unit_dir))
    monkeypatch.setattr(accounts, "_exists", lambda name: name in fake.users)
    result = apply_run(fake, [node.entry("gpunuma-llm0.service", unit_text("llm0"), unit="gpunuma-llm0.service",
                                         validate=VALIDATE_SERVICE)],
                       units=dict(UNITS, services=["gpunuma-llm0.service"]), account=ACCOUNT)
    assert result["account"] == {"name": "gpunuma", "created": True, "changed": True}
    assert result["changed"] is True and result["started"] == ["gpunuma-llm0.service"]
    # useradd ran first, while the unit directory was still empty (before any write or systemctl call).
    assert fake.calls[0][0] == "useradd" and fake.files_at_call[0][1] == []
    again = apply_run(fake, [node.entry("gpunuma-llm0.service", unit_text("llm0"), unit="gpunuma-llm0.service")],
                      units=dict(UNITS, services=["gpunuma-llm0.service"]), account=ACCOUNT)
    assert again["account"]["created"] is False and again["changed"] is False
    assert [c for c in fake.calls if c[0] == "useradd"] == [fake.calls[0]]


def test_check_mode_reports_the_account_and_creates_nothing(node, monkeypatch):
    from ansible.module_utils.gpunuma.node import accounts
    fake = AccountNode({})
    monkeypatch.setattr(accounts, "_exists", lambda name: False)
    result = apply_run(fake, [], check_mode=True, account=ACCOUNT)
    assert result["account"]["created"] is True and result["changed"] is True
    assert [c for c in fake.calls if c[0] == "useradd"] == []


def test_a_failed_useradd_stops_the_step_before_any_file_is_written(node, monkeypatch):
    from ansible.module_utils.gpunuma.node import accounts
    fake = AccountNode({}, useradd_rc=1)
    monkeypatch.setattr(accounts, "_exists", lambda name: False)
    with pytest.raises(ApplyError, match=r"creating the account gpunuma failed \(useradd rc 1\): useradd: cannot lock"):
        apply_run(fake, [node.entry("gpunuma-llm0.service", unit_text("llm0"), unit="gpunuma-llm0.service")],
                  units=dict(UNITS, services=["gpunuma-llm0.service"]), account=ACCOUNT)
    assert os.listdir(node.unit_dir) == [] and [c[0] for c in fake.calls] == ["useradd"]


def test_bad_account_input_changes_nothing(node):
    fake = AccountNode({})
    with pytest.raises(ApplyError, match="account.name: 'Root Admin' is not allowed"):
        apply_run(fake, [node.entry("gpunuma-llm0.service", unit_text("llm0"), unit="gpunuma-llm0.service")],
                  units=dict(UNITS, services=["gpunuma-llm0.service"]), account=dict(ACCOUNT, name="Root Admin"))
    assert os.listdir(node.unit_dir) == [] and fake.calls == []


def test_new_instances_are_enabled_in_one_call(node):
    """The new units of a step are enabled together, before the step's one reload (enable's own is left out), and
    their states are read in one call."""
    fake = FakeSystemd({})
    names = ["gpunuma-llm%d.service" % i for i in range(3)]
    result = apply_run(fake, [node.entry(n, unit_text(n)) for n in names], units=dict(UNITS, services=names))
    enables = [c for c in fake.calls if c[:2] == ["systemctl", "enable"]]
    assert enables == [["systemctl", "enable", "--no-reload", "--"] + names]
    verbs = [c[1] for c in fake.calls if c[0] == "systemctl" and c[1] != "show"]
    assert verbs[:2] == ["enable", "daemon-reload"] and fake.reloads() == 1
    states = [c for c in fake.calls if c[:2] == ["systemctl", "show"] and "UnitFileState" in c[2]]
    assert states == [["systemctl", "show", "--property=ActiveState,UnitFileState,NRestarts", "--"] + names]
    assert result["enabled"] == names and sorted(result["started"]) == names
    assert all(fake.units[n]["UnitFileState"] == "enabled" for n in names)


def test_a_unit_enabled_again_is_reloaded_for(node):
    """A unit whose file is as wanted but that someone disabled is enabled again, and systemd reloads so it sees
    it (nothing else would reload: no file changed)."""
    name = "gpunuma-llm0.service"
    first = FakeSystemd({})
    apply_run(first, [node.entry(name, unit_text(name))], units=dict(UNITS, services=[name]))
    fake = FakeSystemd({name: running(enabled="disabled")})
    result = apply_run(fake, [node.entry(name, unit_text(name))], units=dict(UNITS, services=[name]))
    assert result["enabled"] == [name] and result["changed"] and result["started"] == []
    assert [c[1] for c in fake.mutating()] == ["enable", "daemon-reload"]


def test_without_the_run_reload_enable_reloads_itself(node):
    """units.daemon_reload false: the run makes no reload of its own, so enable makes its own."""
    name = "gpunuma-llm0.service"
    fake = FakeSystemd({})
    apply_run(fake, [node.entry(name, unit_text(name))], units=dict(UNITS, services=[name], daemon_reload=False))
    assert [c for c in fake.calls if c[:2] == ["systemctl", "enable"]] == [["systemctl", "enable", "--", name]]
    assert fake.reloads() == 0


def test_a_json_state_diff_is_cut_to_a_line_and_a_unit_diff_is_kept():
    from ansible.module_utils.gpunuma.node.apply.files import file_diff, quiet_state_diff

    unit = file_diff("/etc/systemd/system/gpunuma-a.service", None, b"[Service]\n")
    assert quiet_state_diff(unit) == unit
    state = quiet_state_diff(file_diff("/etc/gpunuma/plan.json", None, b'{"a": 1}\n'))
    assert state == {"before_header": "/etc/gpunuma/plan.json (absent)", "after_header": "/etc/gpunuma/plan.json",
                     "before": "", "after": "(gpunuma JSON state, 9 bytes; -v shows it)\n"}
    gone = quiet_state_diff(file_diff("/etc/gpunuma/plan.json", b"{}\n", None))
    assert gone["after"] == "" and gone["before"] == "(gpunuma JSON state, 3 bytes; -v shows it)\n"
