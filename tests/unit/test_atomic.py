"""common/atomic.py: the one writer of gpunuma's files (node modules, controller scripts)."""

import os
import stat

import pytest

from ansible.module_utils.gpunuma.common import atomic

pytestmark = pytest.mark.unit


def test_replaces_the_file_with_its_mode(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("old")
    assert atomic.write_atomic(str(path), "new ✓", 0o600) == str(path)
    assert path.read_text(encoding="utf-8") == "new ✓"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(str(tmp_path)) == ["plan.json"]


def test_a_link_at_the_target_is_replaced_not_written_through(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("keep")
    (tmp_path / "d").mkdir()
    target = tmp_path / "d" / "report.json"
    os.symlink(str(outside), str(target))
    atomic.write_atomic(str(target), b"data")
    assert outside.read_text() == "keep"
    assert not target.is_symlink() and target.read_bytes() == b"data"


def test_a_failure_leaves_the_target_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "state.json"
    path.write_text("old")

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError):
        atomic.write_atomic(str(path), "new", prefix=".state.json.")
    assert path.read_text() == "old"
    assert os.listdir(str(tmp_path)) == ["state.json"]


def test_bytes_must_be_text_or_bytes(tmp_path):
    with pytest.raises(TypeError):
        atomic.write_atomic(str(tmp_path / "x"), 5)
    assert os.listdir(str(tmp_path)) == []
