"""The node's profile state: parsing, rollback targets, recording."""

import json
import os

import pytest

from ansible.module_utils.gpunuma.common import seal

from ansible.module_utils.gpunuma.plan import state as statelib
from ansible.module_utils.gpunuma.plan.profiles import load_profiles
from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

PROFILES = load_profiles(os.path.join(REPO_ROOT, "policies", "profiles"))
NOW = "2026-01-31T03:00:00Z"


def recorded(*steps, limit=50):
    state = None
    for to, action in steps:
        state, _ = statelib.record(state, "gpu-a01", to, action, "why", "alice", NOW, limit)
    return state


def test_record_keeps_time_from_to_reason_user():
    state = recorded(("strict", "site"), ("preferred", "down"))
    assert state["profile"] == "preferred" and state["pinned"] is True
    assert state["history"][-1] == {"time": NOW, "from": "strict", "to": "preferred", "action": "down",
                                    "reason": "why", "user": "alice"}
    assert state["history"][0]["from"] is None


def test_site_with_same_profile_records_nothing():
    state = recorded(("strict", "site"))
    again, changed = statelib.record(state, "gpu-a01", "strict", "site", None, "bob", NOW)
    assert not changed and again == state


def test_site_keeps_pin_on_same_profile_and_release_unpins():
    state = recorded(("strict", "site"), ("preferred", "down"))
    kept, changed = statelib.record(state, "gpu-a01", "preferred", "site", None, "bob", NOW)
    assert not changed and kept["pinned"]
    released, changed = statelib.record(state, "gpu-a01", "strict", "release", None, "bob", NOW)
    assert changed and not released["pinned"] and released["history"][-1]["action"] == "release"


def test_history_is_bounded():
    steps = [("strict", "site")] + [("preferred" if i % 2 == 0 else "strict", "profile") for i in range(30)]
    state = recorded(*steps, limit=5)
    assert len(state["history"]) == 5


def test_round_trip_through_text():
    state = recorded(("strict", "site"), ("interleave", "profile"))
    assert statelib.parse_state(statelib.dump_state(state), "/etc/gpunuma/state.json") == state


@pytest.mark.parametrize("text, needle", [
    ("{not json", "not valid JSON"),
    ("[]", "must be a JSON object"),
    ('{"schema": "other/v1"}', "schema"),
    ('{"schema": "gpunuma.state/v1", "history": "x"}', "history"),
    ('{"schema": "gpunuma.state/v1", "history": [{"time": "yesterday", "to": "strict"}]}', "history[0].time"),
    ('{"schema": "gpunuma.state/v1", "profile": 3}', "profile"),
    ('{"schema": "gpunuma.state/v1", "pinned": "yes"}', "pinned"),
])
def test_corrupt_files_name_the_file_and_field(text, needle):
    try:
        # Sealed, so the field's own problem is what is named (an unsealed file is refused first, for that).
        text = json.dumps(seal.seal(json.loads(text)))
    except (ValueError, AttributeError):
        pass
    with pytest.raises(statelib.StateCorrupt) as err:
        statelib.parse_state(text, "/etc/gpunuma/state.json")
    assert "/etc/gpunuma/state.json" in str(err.value) and needle in str(err.value)


def test_a_state_without_its_checksum_is_corrupt():
    """A profile pinned by hand with the checksum removed is not obeyed: the file is corrupt (kept as a backup)."""
    forged = {k: v for k, v in json.loads(statelib.dump_state(recorded(("off", "profile")))).items() if k != "checksum"}
    with pytest.raises(statelib.StateCorrupt) as err:
        statelib.parse_state(json.dumps(forged), "/etc/gpunuma/state.json")
    assert "/etc/gpunuma/state.json: carries no checksum" in str(err.value)


def test_newer_schema_is_an_error_not_corruption():
    with pytest.raises(statelib.StateError) as err:
        statelib.parse_state(json.dumps({"schema": "gpunuma.state/v2"}), "/etc/gpunuma/state.json")
    assert not isinstance(err.value, statelib.StateCorrupt)
    assert "newer gpunuma" in str(err.value) and "/etc/gpunuma/state.json" in str(err.value)


def resolve(current, state, rollback=None, requested=None, inventory="strict"):
    return statelib.resolve_target(current, state, rollback, requested, PROFILES, inventory, "gpu-a01")


def test_down_follows_next():
    assert resolve("strict", None, "down") == ("preferred", "down")
    assert resolve("interleave", None, "down") == ("off", "down")


def test_down_from_bottom_rung_is_refused():
    with pytest.raises(statelib.RollbackRefused) as err:
        resolve("off", None, "down")
    assert "bottom rung" in str(err.value) and "gpu-a01" in str(err.value)


def test_never_provisioned_is_refused():
    with pytest.raises(statelib.RollbackRefused) as err:
        resolve(None, None, "down")
    assert "never provisioned" in str(err.value)


@pytest.mark.parametrize("requested", ["fastest", False, ""])
def test_unknown_profile_is_refused(requested):
    with pytest.raises(statelib.RollbackRefused) as err:
        resolve("strict", None, requested=requested or "x y")
    assert "allowed: interleave, off, preferred, strict" in str(err.value)


def test_previous_walks_the_history_back_and_forth():
    state = recorded(("strict", "site"), ("preferred", "down"))
    assert resolve("preferred", state, "previous") == ("strict", "previous")
    state = recorded(("strict", "site"), ("preferred", "down"), ("strict", "previous"))
    assert resolve("strict", state, "previous") == ("preferred", "previous")


def test_previous_without_history_is_refused():
    with pytest.raises(statelib.RollbackRefused) as err:
        resolve("strict", recorded(("strict", "site")), "previous")
    assert "no profile before 'strict'" in str(err.value)


def test_bad_rollback_word_and_both_given():
    with pytest.raises(statelib.RollbackRefused) as err:
        resolve("strict", None, "sideways")
    assert "gpunuma_rollback: 'sideways'" in str(err.value) and "down, previous, release" in str(err.value)
    with pytest.raises(statelib.RollbackRefused):
        resolve("strict", None, "down", "off")
    with pytest.raises(statelib.RollbackRefused):
        resolve("strict", None)


def test_release_goes_to_the_inventory_profile():
    assert resolve("off", None, "release", inventory="preferred") == ("preferred", "release")


def test_record_rejects_bad_input():
    with pytest.raises(statelib.StateError):
        statelib.record(None, "h", "strict", "fly", None, None, NOW)
    with pytest.raises(statelib.StateError):
        statelib.record(None, "h", "strict", "site", "x" * 501, None, NOW)
    with pytest.raises(statelib.StateError):
        statelib.record(None, "h", "strict", "site", None, None, NOW, 0)


# ---------------------------------------------------------------- the profile a run uses

PINNED = {"pinned": True, "state": {"profile": "interleave"}}
UNPINNED = {"pinned": False, "state": {"profile": "interleave"}}


@pytest.mark.parametrize("rollback, cli, read, expected", [
    ("off", "preferred", PINNED, ("off", "rollback")),
    (None, "preferred", PINNED, ("preferred", "extra-vars")),
    (None, None, PINNED, ("interleave", "node-state")),
    (None, None, UNPINNED, ("strict", "inventory")),
    (None, None, {"pinned": True, "state": {"profile": None}}, ("strict", "inventory")),
    (None, None, None, ("strict", "inventory")),
    (None, None, {}, ("strict", "inventory")),
])
def test_the_effective_profile_follows_its_order(rollback, cli, read, expected):
    assert statelib.effective_profile(rollback, cli, read, "strict") == expected


def test_the_role_and_the_filter_use_the_one_rule():
    """roles/gpunuma_state/tasks/effective.yml (resolve.yml's choice) picks the profile through the filter of the rule,
    not a Jinja copy."""
    with open(os.path.join(REPO_ROOT, "roles", "gpunuma_state", "tasks", "effective.yml"), encoding="utf-8") as handle:
        text = handle.read()
    assert "gpunuma.fleet.gpunuma_effective_profile(" in text
    # No second copy of the order: the pinned state and the rollback target are read only by the rule.
    assert ".pinned" not in text and ".state.profile" not in text and "'rollback']" not in text


def _both_reads(tmp_path, state_bytes, plan_bytes):
    """gpunuma_state's read of a node as the module makes it (read_text) and as site.yml makes it from the run's
    node read (gpunuma_node_info's read_file, then the gpunuma_state_read filter's conversion)."""
    from ansible.module_utils.gpunuma.node.probe import read_file

    path, plan_path = str(tmp_path / "state.json"), str(tmp_path / "plan.json")
    for target, data in ((path, state_bytes), (plan_path, plan_bytes)):
        if data == "fifo":
            os.mkfifo(target)
        elif data is not None:
            with open(target, "wb") as handle:
                handle.write(data)
    module = statelib.read_summary(statelib.read_text(path), statelib.read_text(plan_path), path)
    shared = statelib.read_summary(statelib.text_of_read(read_file(path)), statelib.text_of_read(read_file(plan_path)),
                                   path)
    return module, shared


@pytest.mark.parametrize("state_bytes, plan_bytes", [
    (None, None),
    (None, json.dumps({"schema": "gpunuma.plan/v1", "profile": "preferred-cpu-only"}).encode()),
    (statelib.dump_state(recorded(("strict", "site"), ("preferred", "down"))).encode(), b"{}"),
    (b"{not json", None),
    (b"\xff\xfe not utf-8", b"\xff"),
    (b"", b""),
    ("fifo", None),
])
def test_the_read_from_the_run_node_read_equals_the_module_read(tmp_path, state_bytes, plan_bytes):
    module, shared = _both_reads(tmp_path, state_bytes, plan_bytes)
    assert shared == module


def test_a_newer_state_is_an_error_in_both_reads(tmp_path):
    newer = json.dumps({"schema": "gpunuma.state/v2"}).encode()
    with pytest.raises(statelib.StateError):
        _both_reads(tmp_path, newer, None)
    from ansible.module_utils.gpunuma.node.probe import read_file
    path = str(tmp_path / "state.json")
    with pytest.raises(statelib.StateError):
        statelib.read_summary(statelib.text_of_read(read_file(path)), None, path)
