"""gpunuma_state through Ansible on localhost: read, record, check mode,
bounded history, corrupt and newer-version files."""

import pytest
import json

from ansible_run import run_module

pytestmark = pytest.mark.ansible


def args(tmp_path, **kw):
    a = {"hostname": "gpu-a01", "path": str(tmp_path / "gpunuma" / "state.json"),
         "plan_path": str(tmp_path / "plan.json")}
    a.update(kw)
    return a


def test_never_provisioned_read(tmp_path):
    rc, result = run_module("gpunuma_state", args(tmp_path))
    assert rc == 0 and not result["changed"]
    assert result["gpunuma_state"]["provisioned"] is False and result["gpunuma_state"]["current_profile"] is None


def test_record_then_read_and_check_mode(tmp_path):
    rc, result = run_module("gpunuma_state", args(tmp_path, state="record", profile="strict", user="alice"), check=True)
    assert rc == 0 and result["changed"] and not (tmp_path / "gpunuma" / "state.json").exists()
    rc, result = run_module("gpunuma_state", args(tmp_path, state="record", profile="strict", user="alice"))
    assert rc == 0 and result["changed"]
    rc, result = run_module("gpunuma_state", args(tmp_path, state="record", profile="strict", user="alice"))
    assert rc == 0 and not result["changed"]
    rc, result = run_module("gpunuma_state", args(tmp_path, state="record", profile="preferred", action="down",
                                                  reason="P99", user="bob"))
    data = json.loads((tmp_path / "gpunuma" / "state.json").read_text())
    assert data["profile"] == "preferred" and data["pinned"] is True
    assert [(h["from"], h["to"], h["user"]) for h in data["history"]] == [(None, "strict", "alice"),
                                                                          ("strict", "preferred", "bob")]
    assert oct((tmp_path / "gpunuma" / "state.json").stat().st_mode & 0o777) == "0o644"


def test_history_limit(tmp_path):
    for i in range(6):
        run_module("gpunuma_state", args(tmp_path, state="record", profile=["strict", "off"][i % 2], action="profile",
                                         history_limit=3))
    assert len(json.loads((tmp_path / "gpunuma" / "state.json").read_text())["history"]) == 3


def test_plan_without_state_is_the_starting_profile(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps({"profile": "strict-cpu-only"}))
    rc, result = run_module("gpunuma_state", args(tmp_path))
    assert result["gpunuma_state"]["current_profile"] == "strict" and result["gpunuma_state"]["provisioned"]
    run_module("gpunuma_state", args(tmp_path, state="record", profile="preferred", action="down"))
    data = json.loads((tmp_path / "gpunuma" / "state.json").read_text())
    assert data["history"][0]["from"] == "strict"


def test_corrupt_file_is_kept_and_history_restarts(tmp_path):
    path = tmp_path / "gpunuma" / "state.json"
    path.parent.mkdir()
    path.write_text("{oops")
    rc, result = run_module("gpunuma_state", args(tmp_path))
    assert rc == 0 and result["gpunuma_state"]["corrupt"] and str(path) in " ".join(result["warnings"])
    assert path.read_text() == "{oops"
    rc, result = run_module("gpunuma_state", args(tmp_path, state="record", profile="strict"))
    assert rc == 0 and result["changed"]
    backups = list(path.parent.glob("state.json.corrupt-*"))
    assert len(backups) == 1 and backups[0].read_text() == "{oops"
    assert str(backups[0]) in " ".join(result["warnings"])
    assert json.loads(path.read_text())["profile"] == "strict"


def test_newer_schema_fails_and_is_left_alone(tmp_path):
    path = tmp_path / "gpunuma" / "state.json"
    path.parent.mkdir()
    path.write_text('{"schema": "gpunuma.state/v2", "profile": "x"}')
    for mode in ("read", "record"):
        rc, result = run_module("gpunuma_state", args(tmp_path, state=mode, profile="strict"))
        assert rc != 0 and "newer gpunuma" in result["msg"] and str(path) in result["msg"]
    assert "v2" in path.read_text() and not list(path.parent.glob("state.json.corrupt-*"))


def test_bad_input_is_a_clear_error(tmp_path):
    rc, result = run_module("gpunuma_state", args(tmp_path, state="record", profile="Not A Name"))
    assert rc != 0 and "profile: 'Not A Name' is not a profile name" in result["msg"]
    rc, result = run_module("gpunuma_state", args(tmp_path, state="record", profile="strict", history_limit=0))
    assert rc != 0 and "history_limit" in result["msg"]
