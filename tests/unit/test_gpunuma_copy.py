"""gpunuma_copy's body on real files, through the controller's in-process module (the way the roles run it)."""

import importlib.util
import os
import stat

import pytest

from ansible.module_utils.gpunuma.common.inprocess import run_module
from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

_spec = importlib.util.spec_from_file_location("gpunuma_copy_module", os.path.join(REPO_ROOT, "library", "gpunuma_copy.py"))
gpunuma_copy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpunuma_copy)


def copy(files, check_mode=False, diff=False, verbosity=0):
    return run_module(gpunuma_copy.MODULE_SPEC, gpunuma_copy.run, {"files": files}, check_mode, "gpunuma_copy", diff,
                      verbosity)


def test_writes_creates_parents_and_then_changes_nothing(tmp_path):
    path = tmp_path / "topology" / "gpu-a01.plan.json"
    first = copy([{"path": str(path), "content": "{}\n", "dir_mode": "0750"}])
    assert first["changed"] is True and path.read_text() == "{}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o750
    assert first["files"] == [{"path": str(path), "changed": True, "backup": None}]
    again = copy([{"path": str(path), "content": "{}\n"}])
    assert again["changed"] is False and again["files"][0]["changed"] is False


def test_a_replaced_file_is_kept_as_a_backup_only_when_asked(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("old\n")
    kept = copy([{"path": str(path), "content": "new\n", "backup": True}])
    backup = kept["files"][0]["backup"]
    assert path.read_text() == "new\n" and backup.startswith(str(path) + ".") and backup.endswith("~")
    assert open(backup).read() == "old\n"
    plain = copy([{"path": str(path), "content": "newer\n"}])
    assert plain["files"][0]["backup"] is None
    assert sorted(os.listdir(tmp_path)) == sorted(["a.json", os.path.basename(backup)])


def test_a_mode_change_alone_is_a_change(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("same\n")
    os.chmod(path, 0o600)
    result = copy([{"path": str(path), "content": "same\n", "mode": "0644"}])
    assert result["changed"] is True and stat.S_IMODE(path.stat().st_mode) == 0o644


def test_check_mode_and_diff_write_nothing(tmp_path):
    path = tmp_path / "d" / "a.conf"
    result = copy([{"path": str(path), "content": "new\n"}], check_mode=True, diff=True)
    assert result["changed"] is True and not (tmp_path / "d").exists()
    assert result["diff"] == [{"before_header": "%s (absent)" % path, "after_header": str(path),
                               "before": "", "after": "new\n"}]


def test_a_json_state_files_diff_is_one_line_unless_verbose(tmp_path):
    path = tmp_path / "gpu-a01.plan.json"
    path.write_text('{"old": 1}\n')
    quiet = copy([{"path": str(path), "content": '{"new": 2}\n'}], check_mode=True, diff=True)
    assert quiet["diff"] == [{"before_header": str(path), "after_header": str(path),
                              "before": "(gpunuma JSON state, 11 bytes; -v shows it)\n",
                              "after": "(gpunuma JSON state, 11 bytes; -v shows it)\n"}]
    verbose = copy([{"path": str(path), "content": '{"new": 2}\n'}], check_mode=True, diff=True, verbosity=1)
    assert verbose["diff"][0]["before"] == '{"old": 1}\n' and verbose["diff"][0]["after"] == '{"new": 2}\n'


def test_a_link_at_the_target_is_refused_never_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    link = tmp_path / "a.json"
    link.symlink_to(victim)
    result = copy([{"path": str(link), "content": "new\n"}])
    assert result["failed"] and result["msg"].startswith("%s: it is a symbolic link" % link)
    assert result["msg"].endswith("move it aside and run again")
    assert victim.read_text() == "keep\n" and link.is_symlink()


def test_bad_requests_name_the_field_and_write_nothing(tmp_path):
    good = {"path": str(tmp_path / "good.json"), "content": "x\n"}
    relative = copy([good, {"path": "relative.json", "content": "x\n"}])
    assert relative["failed"] and relative["msg"] == "files[1].path must be an absolute path, got 'relative.json'"
    mode = copy([good, {"path": str(tmp_path / "b.json"), "content": "x\n", "mode": "rw"}])
    assert mode["failed"] and mode["msg"].startswith("files[1].mode")
    assert copy([{"content": "x"}])["msg"] == "missing required arguments: path found in files"
    assert not os.listdir(tmp_path)


def test_a_write_that_fails_names_the_path_and_keeps_what_was_written(tmp_path):
    blocker = tmp_path / "plans"
    blocker.write_text("a file where a directory should be\n")
    first = tmp_path / "first.json"
    result = copy([{"path": str(first), "content": "x\n"}, {"path": str(blocker / "a.json"), "content": "y\n"}])
    assert result["failed"] and result["msg"] == "cannot write %s: [Errno 17] EEXIST: File exists" % blocker
    assert first.read_text() == "x\n" and result["changed"] is True
    assert [f["changed"] for f in result["files"]] == [True, False]
