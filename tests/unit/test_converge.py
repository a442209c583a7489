"""The converge record (module_utils/gpunuma/run/converge.py and the gpunuma_converge action's rules).

What a run owns is taken from gpunuma_apply's arguments; what it read is asked again; the comparison names every
difference; a run with a read that cannot be asked again is never recorded. The container behaviour (a converged
node ends its run at the check, every drift gets the full run) is in tests/integration/test_site_converge.py.
"""

import base64
import importlib.util
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO_ROOT
from ansible.module_utils.gpunuma.run import converge

pytestmark = pytest.mark.unit

_spec = importlib.util.spec_from_file_location(
    "gpunuma_converge_action", os.path.join(REPO_ROOT, "action_plugins", "gpunuma_converge.py"))
action = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(action)

APPLY_ARGS = {
    "files": [{"path": "/etc/systemd/system/gpunuma-a.service", "content": "secret-free unit"}],
    "secret_files": [{"path": "/etc/gpunuma/env/a.env", "content": "HF_TOKEN=hunter2"}],
    "after_success": [{"path": "/etc/gpunuma/plan.json", "content": "{}"}],
    "state_record": {"hostname": "n1", "profile": "strict"},
    "absent": ["/etc/gpunuma/old.conf", {"path": "/etc/systemd/system/irqbalance.service.d/50-x.conf",
                                         "unit": "irqbalance.service"}],
    "secret_absent": ["/etc/gpunuma/env/gone.env"],
    "units": {"start": True, "services": ["gpunuma-a.service"]},
    "prune": {"unit_dir": "/etc/systemd/system", "keep_units": ["gpunuma-a.service"]},
}


def test_digest_is_canonical():
    assert converge.digest({"a": 1, "b": [1, 2]}) == converge.digest({"b": [1, 2], "a": 1})
    assert converge.digest({"a": 1}) != converge.digest({"a": 2})
    assert converge.digest({"a": 1}).startswith("sha256:")


def test_stable_view_leaves_out_what_changes_by_itself():
    topo = {"topology": {"numa_nodes": [{"id": 0, "memory_total_bytes": 8, "memory_free_bytes": 3}]}}
    moved = {"topology": {"numa_nodes": [{"id": 0, "memory_total_bytes": 8, "memory_free_bytes": 5}]}}
    assert converge.stable_view("gpu_topology_info", topo) == converge.stable_view("gpu_topology_info", moved)
    grown = {"topology": {"numa_nodes": [{"id": 0, "memory_total_bytes": 9, "memory_free_bytes": 3}]}}
    assert converge.stable_view("gpu_topology_info", topo) != converge.stable_view("gpu_topology_info", grown)

    def pid1(rss, cap):
        status = "Name:\tsystemd\nVmRSS:\t%d kB\nCapEff:\t%s\n" % (rss, cap)
        return {"pid1": {"status": base64.b64encode(status.encode()).decode(), "limits": "bGltaXRz"}}

    view = converge.stable_view("gpunuma_node_info", pid1(100, "000001ffffffffff"))
    assert view["pid1"]["status"] == ["CapEff:\t000001ffffffffff"] and view["pid1"]["limits"] == "bGltaXRz"
    assert view == converge.stable_view("gpunuma_node_info", pid1(900, "000001ffffffffff"))
    assert view != converge.stable_view("gpunuma_node_info", pid1(100, "00000000a80425fb"))

    # The node read the discovery carries (gpu_topology_info's node_info) is seen as gpunuma_node_info's.
    def carried(rss, cap, free):
        return {"topology": {"numa_nodes": [{"id": 0, "memory_free_bytes": free}]}, "gpunuma_node": pid1(rss, cap)}

    carried_view = converge.stable_view("gpu_topology_info", carried(100, "000001ffffffffff", 3))
    assert carried_view["gpunuma_node"] == view
    assert carried_view == converge.stable_view("gpu_topology_info", carried(900, "000001ffffffffff", 5))
    assert carried_view != converge.stable_view("gpu_topology_info", carried(100, "00000000a80425fb", 3))


def test_a_checkpoint_removed_for_a_restart_is_not_kept_absent():
    """The kubelet's stale checkpoint goes before its start and comes back with it: not an owned absent path."""
    args = {"files": [{"path": "/var/lib/kubelet/config.yaml", "content": "x", "unit": "kubelet.service",
                       "restart": "stop"}],
            "absent": [{"path": "/var/lib/kubelet/cpu_manager_state", "unit": "kubelet.service", "restart": "stop"},
                       {"path": "/etc/systemd/system/kubelet.service.d/50-gpunuma-memory-checkpoint.conf",
                        "unit": "kubelet.service", "restart": "stop"}],
            "units": {"state_files": {"kubelet.service": ["/var/lib/kubelet/cpu_manager_state",
                                                          "/var/lib/kubelet/memory_manager_state"]}}}
    summary = converge.write_summary(args)
    assert summary["files"] == ["/var/lib/kubelet/config.yaml"]
    assert summary["absent"] == ["/etc/systemd/system/kubelet.service.d/50-gpunuma-memory-checkpoint.conf"]
    # A unit stopped for a change and never started again (a run that died between) keeps the node from being
    # converged, as a pending restart does.
    own = converge.owned([summary, converge.write_summary(dict(args, stopped_file="/run/x/stopped.json"))])
    assert own["pending"] == sorted([converge.DEFAULT_PENDING, converge.DEFAULT_STOPPED, "/run/x/stopped.json"])


def test_write_summary_takes_paths_and_never_content():
    summary = converge.write_summary(APPLY_ARGS)
    assert summary["files"] == ["/etc/systemd/system/gpunuma-a.service", "/etc/gpunuma/env/a.env",
                                "/etc/gpunuma/plan.json", "/etc/gpunuma/state.json"]
    assert summary["absent"] == ["/etc/gpunuma/old.conf", "/etc/systemd/system/irqbalance.service.d/50-x.conf",
                                 "/etc/gpunuma/env/gone.env"]
    assert summary["services"] == ["gpunuma-a.service"]
    assert summary["pending"] == converge.DEFAULT_PENDING
    assert "hunter2" not in repr(summary) and "secret-free" not in repr(summary)
    # Services are owned only where the call starts them.
    assert converge.write_summary(dict(APPLY_ARGS, units={"start": False, "services": ["x.service"]}))["services"] == []


def test_owned_is_the_union_and_a_path_written_is_not_absent():
    first = converge.write_summary(APPLY_ARGS)
    second = converge.write_summary({"files": [{"path": "/etc/gpunuma/old.conf"}], "prune": APPLY_ARGS["prune"]})
    own = converge.owned([first, second])
    assert "/etc/gpunuma/old.conf" in own["files"] and "/etc/gpunuma/old.conf" not in own["absent"]
    assert own["prune"] == [APPLY_ARGS["prune"]]
    assert own["files"] == sorted(own["files"])


def test_unique_reads_drops_repeats_and_refuses_what_cannot_be_asked_again():
    read = {"module": "gpunuma_node_info", "args": {"paths": ["/x"]}}
    assert converge.unique_reads([read, dict(read), {"module": "gpunuma_state", "args": {}}]) == [
        read, {"module": "gpunuma_state", "args": {}}]
    for bad in ({"module": "command", "args": {}}, {"module": "gpunuma_node_info"}, "gpunuma_node_info",
                {"module": "gpunuma_node_info", "not_replayable": "delegated to localhost"}):
        with pytest.raises(converge.ConvergeError, match=r"reads\[0\] must be"):
            converge.unique_reads([bad])


def _view(tmp_path, reads=(), services=None, stale=((), ()), readers=None, pid="100"):
    own = {"files": [str(tmp_path / "unit"), str(tmp_path / "missing")], "absent": [str(tmp_path / "gone")],
           "services": sorted(services or {}), "prune": [{"unit_dir": str(tmp_path)}],
           "pending": [str(tmp_path / "pending.json")]}
    readers = readers or {"gpunuma_node_info": lambda args: {"paths": {p: os.path.exists(p) for p in args["paths"]}}}
    return converge.node_view(list(reads), own, readers,
                              lambda units: dict((u, {"ActiveState": s, "UnitFileState": "enabled", "MainPID": pid})
                                                 for u, s in (services or {}).items()),
                              lambda spec: (list(stale[0]), list(stale[1])))


def test_node_view_and_compare_name_each_difference(tmp_path):
    (tmp_path / "unit").write_text("[Service]\n")
    os.chmod(str(tmp_path / "unit"), 0o644)
    reads = [{"module": "gpunuma_node_info", "args": {"paths": [str(tmp_path / "flag")]}}]
    view, problems = _view(tmp_path, reads, services={"a.service": "active"})
    assert problems == []
    assert view["files"][str(tmp_path / "missing")] is None
    assert view["files"][str(tmp_path / "unit")]["mode"] == "0644"
    assert view["absent"] == {str(tmp_path / "gone"): False}
    record = converge.build_record({"x": "sha256:1"}, reads, {}, view, {}, {})
    assert converge.compare(record, view, problems) == []

    # Each kind of drift, one at a time, is named.
    (tmp_path / "unit").write_text("[Service]\n# edited\n")
    assert converge.compare(record, *_view(tmp_path, reads, {"a.service": "active"})) == [
        "%s differs from what gpunuma wrote" % (tmp_path / "unit")]
    (tmp_path / "unit").write_text("[Service]\n")
    os.chmod(str(tmp_path / "unit"), 0o600)
    assert converge.compare(record, *_view(tmp_path, reads, {"a.service": "active"})) == [
        "%s differs from what gpunuma wrote" % (tmp_path / "unit")]
    os.chmod(str(tmp_path / "unit"), 0o644)
    (tmp_path / "gone").write_text("")
    assert converge.compare(record, *_view(tmp_path, reads, {"a.service": "active"})) == [
        "%s came back after gpunuma removed it" % (tmp_path / "gone")]
    os.unlink(str(tmp_path / "gone"))
    (tmp_path / "flag").write_text("")
    assert converge.compare(record, *_view(tmp_path, reads, {"a.service": "active"})) == [
        "gpunuma_node_info answers differently than at the last converge (read 1: paths)"]
    os.unlink(str(tmp_path / "flag"))
    assert converge.compare(record, *_view(tmp_path, reads, {"a.service": "failed"})) == [
        "a.service is failed", "a.service is not as gpunuma left it"]
    # Active again, under another main PID: it restarted since the run (a crash and systemd's Restart=, or by hand).
    assert converge.compare(record, *_view(tmp_path, reads, {"a.service": "active"}, pid="4242")) == [
        "a.service restarted since the last converge (main PID 100, now 4242): crashed and restarted by systemd, "
        "or restarted by hand"]
    assert converge.compare(record, *_view(tmp_path, reads, {"a.service": "active"}, stale=(["gpunuma-old.service"], []))) == [
        "stale gpunuma units to prune: gpunuma-old.service"]
    (tmp_path / "pending.json").write_text("[]")
    assert converge.compare(record, *_view(tmp_path, reads, {"a.service": "active"})) == [
        "restarts are pending (%s)" % (tmp_path / "pending.json")]


def test_a_read_that_fails_is_a_problem_not_a_crash(tmp_path):
    def broken(args):
        raise converge.ConvergeError("/sys is gone")

    reads = [{"module": "gpu_topology_info", "args": {}}]
    view, problems = _view(tmp_path, reads, readers={"gpu_topology_info": broken})
    assert view["reads"] == [None] and problems == ["gpu_topology_info cannot read the node: /sys is gone"]


def test_load_record_names_what_is_wrong():
    good = converge.build_record({}, [], {}, {"reads": []}, {}, {})
    assert converge.load_record(converge.json.dumps(good), "/r") == good
    with pytest.raises(converge.ConvergeError, match="/r is not JSON"):
        converge.load_record("{", "/r")
    with pytest.raises(converge.ConvergeError, match="schema is 'gpunuma.converged/v0', expected gpunuma.converged/v1"):
        converge.load_record(converge.json.dumps(dict(good, schema="gpunuma.converged/v0")), "/r")
    with pytest.raises(converge.ConvergeError, match="/r: view must be a dict"):
        converge.load_record(converge.json.dumps(dict(good, view=[])), "/r")


def test_changed_inputs_names_added_removed_and_changed():
    assert converge.changed_inputs({"a": "1", "b": "2", " code": "c"}, {"a": "1", "b": "3", "c": "4"}) == [
        "b", "c", "code"]
    assert converge.changed_inputs(None, {"a": "1"}) == ["a"]


class _Task:
    def __init__(self, action, args, delegate_to=None):
        self.action, self.args, self.delegate_to = action, args, delegate_to


class _Action:
    def __init__(self, *args, **kwargs):
        self._task = _Task(*args, **kwargs)


def test_the_journal_keeps_reads_with_their_validated_arguments_and_writes_without_content():
    task_vars = {"inventory_hostname": "n1"}
    params = {"paths": ["/usr/bin/numactl"], "units": None}
    result = converge.journal_call(_Action("gpunuma_node_info", {"paths": ["/usr/bin/numactl"]}),
                                   {"invocation": {"module_args": params}}, task_vars)
    reads = result["ansible_facts"][converge.JOURNAL_READS]
    assert reads == [{"module": "gpunuma_node_info", "args": params}]
    task_vars[converge.JOURNAL_READS] = reads
    result = converge.journal_call(_Action("gpunuma.fleet.gpunuma_apply", APPLY_ARGS), {"changed": True}, task_vars)
    assert result["ansible_facts"][converge.JOURNAL_WRITES] == [converge.write_summary(APPLY_ARGS)]
    assert converge.journal_call(_Action("gpunuma_apply", APPLY_ARGS), {"failed": True}, task_vars) == {"failed": True}
    recorded = converge.journal_call(_Action("gpunuma_state", {"state": "record", "path": "/etc/gpunuma/s.json"}),
                                     {"changed": True}, task_vars)
    assert recorded["ansible_facts"][converge.JOURNAL_WRITES][-1]["files"] == ["/etc/gpunuma/s.json"]


@pytest.mark.parametrize("action_args, delegate, result, why", [
    ({}, "localhost", {"invocation": {"module_args": {}}}, "delegated to localhost"),
    ({}, None, {"invocation": {"module_args": "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"}}, "no_log"),
    ({}, None, {"invocation": {"module_args": {"record_nvml_dump": "/x.json"}}}, "NVML dump"),
])
def test_a_read_that_cannot_be_asked_again_keeps_the_run_from_being_recorded(action_args, delegate, result, why):
    out = converge.journal_call(_Action("gpu_topology_info", action_args, delegate), dict(result), {"inventory_hostname": "n1"})
    reads = out["ansible_facts"][converge.JOURNAL_READS]
    assert why in converge.not_replayable(reads)
    # Delegated to the host itself is the host.
    same = converge.journal_call(_Action("gpunuma_node_info", {}, "n1"), {"invocation": {"module_args": {}}},
                                 {"inventory_hostname": "n1"})
    assert converge.not_replayable(same["ansible_facts"][converge.JOURNAL_READS]) is None


@pytest.mark.parametrize("task_vars, why", [
    ({"gpunuma_converge_check": False}, "gpunuma_converge_check is false"),
    ({"gpunuma_converge_check": "no"}, "gpunuma_converge_check is false"),
    ({"gpunuma_rollback_action": "down"}, "rollback"),
])
def test_hosts_whose_run_is_never_cut_short(task_vars, why):
    assert why in converge.skip_reason(task_vars)
    assert converge.skip_reason({"group_names": ["gpu"], "gpunuma_kubelet": False}) is None
    # A Kubernetes node's reads come with the run's node read and its kubelet change goes through gpunuma_apply:
    # both journaled, so its run can end at the check too.
    assert converge.skip_reason({"group_names": ["gpu", "kubernetes"], "gpunuma_kubelet": True}) is None


def test_the_code_digest_follows_every_file(tmp_path):
    (tmp_path / "roles" / "r").mkdir(parents=True)
    (tmp_path / "roles" / "r" / "main.yml").write_text("a: 1\n")
    first = converge.code_digest(str(tmp_path), ["roles"])
    (tmp_path / "roles" / "r" / "main.yml").write_text("a: 2\n")
    assert converge.code_digest(str(tmp_path), ["roles"]) != first
    (tmp_path / "roles" / "r" / "main.yml").write_text("a: 1\n")
    assert converge.code_digest(str(tmp_path), ["roles"]) == first
    (tmp_path / "roles" / "r" / "other.yml").write_text("")
    assert converge.code_digest(str(tmp_path), ["roles"]) != first
    # The plugin's root is the checkout (action_plugins/..), or the collection (plugins/action/../..).
    from ansible.module_utils.gpunuma.common import layout
    assert layout.plugin_root(action.__file__) == REPO_ROOT
    assert layout.plugin_root("/c/ansible_collections/gpunuma/fleet/plugins/action/x.py") == \
        "/c/ansible_collections/gpunuma/fleet"


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                     max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(_JSON, _JSON)
def test_digest_equal_exactly_when_the_values_are(a, b):
    assert (converge.digest(a) == converge.digest(b)) == (converge.json.dumps(a, sort_keys=True) == converge.json.dumps(b, sort_keys=True))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=6), st.text(max_size=6), max_size=6),
       st.dictionaries(st.text(min_size=1, max_size=6), st.text(max_size=6), max_size=6))
def test_changed_inputs_is_empty_exactly_when_the_inputs_are_equal(before, now):
    names = converge.changed_inputs(before, now)
    assert (names == []) == (before == now)
    assert all(before.get(n) != now.get(n) for n in set(before) | set(now) if n.strip() in names or n in names)


def test_file_state_digests_regular_files_and_names_anything_else(tmp_path):
    unit = tmp_path / "gpunuma-a.service"
    unit.write_bytes(b"[Service]\n" * 300000)  # several chunks
    unit.chmod(0o640)
    state = converge.file_state(str(unit))
    assert state["mode"] == "0640" and state["uid"] == os.getuid()
    assert state["sha256"] == __import__("hashlib").sha256(unit.read_bytes()).hexdigest()
    assert converge.file_state(str(tmp_path / "gone")) is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert converge.file_state(str(fifo)) == {"type": "10000"}  # never opened: a FIFO would block
    link = tmp_path / "link"
    link.symlink_to(unit)
    assert converge.file_state(str(link)) == {"type": "120000"}
    assert converge.file_state(str(tmp_path)) == {"type": "40000"}


def test_file_state_refuses_a_file_swapped_for_a_link_after_the_type_check(tmp_path, monkeypatch):
    unit = tmp_path / "gpunuma-a.service"
    unit.write_text("[Service]\n")
    real_lstat = os.lstat
    swapped = []

    def lstat_then_swap(path, *args, **kwargs):
        st_before = real_lstat(path, *args, **kwargs)
        if str(path) == str(unit) and not swapped:
            swapped.append(True)
            unit.unlink()
            unit.symlink_to("/dev/zero")
        return st_before

    monkeypatch.setattr(converge.os, "lstat", lstat_then_swap)
    state = converge.file_state(str(unit))
    assert "error" in state and "sha256" not in state


class _Role:
    DEFAULTS = {"memlock_limit": "unlimited", "numa_binding_profile": "{{ gpunuma_profile | default('strict') }}"}

    def get_default_vars(self):
        return dict(self.DEFAULTS)


class _PlayTask:
    def __init__(self, roles):
        self.roles = roles

    def get_play(self):
        task = self

        class Play:
            def get_roles(self):
                return task.roles
        return Play()


class _Templar:
    def template(self, value):
        return value


def _inputs(roles, task_vars):
    plugin = action.ActionModule.__new__(action.ActionModule)
    plugin._task, plugin._loader = _PlayTask(roles), None
    return plugin.inputs(task_vars, _Templar())


def test_a_variable_left_at_an_imported_roles_default_is_no_input_and_one_the_user_sets_is():
    """site.yml imports its roles, so their defaults are the check's variables too: one still at its default is
    the code's (digested with it), one the inventory sets is the user's, and setting it changes the inputs."""
    base = dict(_Role.DEFAULTS, gpunuma_profile="strict", inventory_hostname="n1", group_names=["gpu"])
    at_default = _inputs([_Role()], base)
    assert "memlock_limit" not in at_default and "numa_binding_profile" not in at_default
    assert "gpunuma_profile" in at_default
    set_by_user = _inputs([_Role()], dict(base, memlock_limit="4M"))
    assert converge.changed_inputs(at_default, set_by_user) == ["memlock_limit"]
    # With no role of the play the same value is an input like any other.
    assert "memlock_limit" in _inputs([], base)


def test_record_request_carries_the_runs_journal_and_the_steps_own_writes():
    reads = [{"module": "gpunuma_node_info", "args": {"a": 1}}]
    earlier = [converge.write_summary({"files": [{"path": "/etc/a"}]})]
    task_vars = {converge.INPUTS_FACT: {"x": "sha256:1"}, converge.JOURNAL_READS: reads,
                 converge.JOURNAL_WRITES: earlier, "group_names": ["gpu"]}
    own = converge.write_summary(APPLY_ARGS)
    request, why = converge.record_request(task_vars, "/r.json", {"gpunuma_plan": {}}, {"/c": None}, [own])
    assert why is None
    assert request == {"state": "recorded", "path": "/r.json", "inputs": {"x": "sha256:1"}, "reads": reads,
                       "writes": earlier + [own], "facts": {"gpunuma_plan": {}}, "controller": {"/c": None}}
    # The journal itself is not changed.
    assert task_vars[converge.JOURNAL_WRITES] == earlier


@pytest.mark.parametrize("task_vars, why", [
    ({converge.INPUTS_FACT: {}, "gpunuma_rollback_action": "down"}, "rollback"),
    ({}, "did not start with the converge check"),
    ({converge.INPUTS_FACT: {}, converge.JOURNAL_READS: [{"module": "gpu_topology_info",
                                                           "not_replayable": "it records an NVML dump"}]},
     "NVML dump"),
])
def test_a_run_that_keeps_no_record_removes_the_old_one(task_vars, why):
    request, reason = converge.record_request(task_vars, "/r.json", {}, {})
    assert why in reason
    assert request == {"state": "absent", "path": "/r.json"}


_apply_spec = importlib.util.spec_from_file_location(
    "gpunuma_apply_action", os.path.join(REPO_ROOT, "action_plugins", "gpunuma_apply.py"))
apply_action = importlib.util.module_from_spec(_apply_spec)
_apply_spec.loader.exec_module(apply_action)


@pytest.mark.parametrize("before", [None, "old text\n", "same text\n"])
def test_the_record_holds_the_state_a_controller_copy_has_once_written(tmp_path, before):
    from ansible.module_utils.gpunuma.node.apply.files import normalise_files, plan_files
    from ansible.module_utils.gpunuma.node.apply.fs import NodeFiles
    path = tmp_path / "host.plan.json"
    if before is not None:
        path.write_text(before)
        path.chmod(0o600)
    fs = NodeFiles()
    decision = plan_files(normalise_files([{"path": str(path), "content": "same text\n", "mode": "0644",
                                            "backup": False}]), fs)[0]
    expected = apply_action.state_after(decision)
    if decision["changed"]:
        fs.write(decision)
    assert converge.file_state(str(path)) == expected


class _CheckPlugin(action.ActionModule):
    """The check's controller side with the node's answer stubbed: counts the round trips, keeps the arguments."""

    def __init__(self):
        self._task, self._loader, self._templar = _PlayTask([]), None, self
        self.asked = []

    def copy_with_new_env(self, available_variables):
        return _Templar()

    def _execute_module(self, **kwargs):
        self.asked.append(kwargs["module_args"])
        return {"converged": False, "reasons": ["no converge record on the node (/r)"]}


def test_a_host_without_the_controller_copy_of_its_plan_or_seal_is_not_converged_without_asking_the_node(tmp_path):
    """Every record holds the state of the host's plan copy, and the check replays only the record whose seal this
    controller kept: without either (or without a directory to find them in) the node is not asked."""
    task_vars = {"gpu_topology_controller_dir": str(tmp_path), "inventory_hostname": "gpu-a01", "group_names": []}
    plugin = _CheckPlugin()
    result = plugin.checked({}, task_vars, "/r", None)
    assert result["converged"] is False and plugin.asked == [] and result["gpunuma_round_trips"] == 0
    assert "no controller copy of the host's applied plan (%s)" % (tmp_path / "gpu-a01.plan.json") in result["reasons"][0]
    (tmp_path / "gpu-a01.plan.json").write_text("{}\n")
    result = plugin.checked({}, task_vars, "/r", None)
    assert plugin.asked == [] and "no controller seal" in result["reasons"][0]
    (tmp_path / "gpu-a01.converged.seal").write_text("not a seal\n")
    assert "no controller seal" in plugin.checked({}, task_vars, "/r", None)["reasons"][0] and plugin.asked == []
    for bad in ({"inventory_hostname": "gpu-a01"}, dict(task_vars, gpu_topology_controller_dir=7)):
        result = plugin.checked({}, bad, "/r", None)
        assert plugin.asked == [] and "cannot be told" in result["reasons"][0]
    seal = converge.digest({"any": "value"})
    converge.keep_seal(str(tmp_path / "gpu-a01.converged.seal"), seal)
    assert oct((tmp_path / "gpu-a01.converged.seal").stat().st_mode & 0o777) == "0o600"
    result = plugin.checked({}, task_vars, "/r", None)
    assert len(plugin.asked) == 1 and plugin.asked[0]["seal"] == seal
    assert result["reasons"] == ["no converge record on the node (/r)"]
    converge.keep_seal(str(tmp_path / "gpu-a01.converged.seal"), None)
    assert not (tmp_path / "gpu-a01.converged.seal").exists()


def _recorded_request():
    reads = [{"module": "gpunuma_node_info", "args": {"files": {"plan": "/etc/gpunuma/plan.json"}}}]
    task_vars = {converge.INPUTS_FACT: {"gpunuma_profile": "sha256:1"}, converge.JOURNAL_READS: reads,
                 converge.JOURNAL_WRITES: [converge.write_summary(APPLY_ARGS)]}
    request, why = converge.record_request(task_vars, "/r.json", {"gpunuma_plan": {"n": (1, 2)}}, {"/c": None})
    assert why is None
    return request


def test_the_seal_of_a_request_is_the_seal_of_the_record_the_node_keeps_from_it():
    request = _recorded_request()
    own = converge.owned(request["writes"])
    record = converge.build_record(request["inputs"], request["reads"], own, {"reads": []}, request["facts"],
                                   request["controller"])
    # As the node keeps it: JSON text, read back.
    import json
    kept = converge.load_record(json.dumps(record), "/r.json")
    assert converge.record_seal(kept) == converge.request_seal(request)


@pytest.mark.parametrize("forge", [
    lambda r: r["reads"].append({"module": "gpunuma_node_info", "args": {"commands": {"x": ["/bin/touch", "/pwned"]}}}),
    lambda r: r["reads"][0]["args"]["files"].update(plan="/etc/shadow"),
    lambda r: r["facts"].update(gpunuma_plan={"forged": True}),
    lambda r: r["inputs"].update(gpunuma_profile="sha256:2"),
    lambda r: r["owned"]["files"].remove(r["owned"]["files"][0]),
    lambda r: r["controller"].update({"/c": {"sha256": "0"}}),
])
def test_any_change_to_a_record_changes_its_seal(forge):
    request = _recorded_request()
    record = converge.build_record(request["inputs"], request["reads"], converge.owned(request["writes"]),
                                   {"reads": []}, request["facts"], request["controller"])
    import copy
    forged = copy.deepcopy(record)
    forge(forged)
    assert converge.record_seal(forged) != converge.request_seal(request)


def test_a_seal_that_is_no_regular_file_is_no_seal_and_an_unwritable_one_is_named(tmp_path):
    """The seal is read through the bounded reader: a FIFO (which would block a plain read) or a link is none."""
    fifo = tmp_path / "h.converged.seal"
    os.mkfifo(str(fifo))
    assert converge.read_seal(str(fifo)) is None
    target = tmp_path / "elsewhere"
    target.write_text(converge.digest({"x": 1}) + "\n")
    link = tmp_path / "l.converged.seal"
    link.symlink_to(target)
    assert converge.read_seal(str(link)) is None
    failed = converge.keep_seal(str(tmp_path / "missing-dir" / "h.converged.seal"), converge.digest({"x": 1}))
    assert failed["failed"] is True and "missing-dir" in failed["msg"]
