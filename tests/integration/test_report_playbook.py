"""The fleet report as the collection ships it: gpunuma_report and playbooks/report.yml on the controller."""

import os
import sys

import pytest

from ansible_run import run_module, run_playbook
from conftest import FIXTURES, REPO_ROOT

sys.path.insert(0, os.path.join(FIXTURES, "report"))
import make_artefacts  # noqa: E402

pytestmark = pytest.mark.ansible

PLAYBOOK = os.path.join(REPO_ROOT, "playbooks", "report.yml")


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("artefacts")
    make_artefacts.write_fleet(str(root))
    return root


def test_the_playbook_writes_one_page_naming_every_host_once(artefacts, tmp_path):
    dest = tmp_path / "out" / "fleet.html"
    proc = run_playbook(PLAYBOOK, "localhost,", {"gpunuma_report_src": [str(artefacts)], "gpunuma_report_dest": str(dest)})
    assert proc.returncode == 0, proc.stdout[-3000:]
    page = dest.read_text()
    hosts = sorted(make_artefacts.fleet())
    for host in hosts:
        assert 'id="host-%s"' % host.replace("-", "_2d_") in page, host
        assert '"%s  ' % host.ljust(max(map(len, hosts))) in proc.stdout, host
    assert "open %s" % dest in proc.stdout
    assert "changed=1" in proc.stdout
    again = run_playbook(PLAYBOOK, "localhost,", {"gpunuma_report_src": [str(artefacts)], "gpunuma_report_dest": str(dest)})
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-2000:]


def test_several_directories_make_one_fleet_and_hosts_narrow_it(artefacts, tmp_path):
    dest = tmp_path / "fleet.html"
    rc, result = run_module("gpunuma_report", {
        "src": [str(artefacts / "topology"), str(artefacts / "audit")], "dest": str(dest), "hosts": ["h200-vm"]})
    assert rc == 0, result
    assert [s["host"] for s in result["hosts"]] == ["h200-vm"]
    assert result["hosts"][0]["compliance"] == "ok"  # the audit directory was read beside the topology one
    assert "audit/h200-vm.json" in dest.read_text()


def test_check_mode_writes_nothing_and_says_it_would(artefacts, tmp_path):
    dest = tmp_path / "fleet.html"
    rc, result = run_module("gpunuma_report", {"src": [str(artefacts)], "dest": str(dest)}, check=True)
    assert rc == 0 and result["changed"] is True, result
    assert not dest.exists()


@pytest.mark.parametrize("field", ["src", "dest"])
def test_a_path_with_a_control_character_is_refused_naming_it(artefacts, tmp_path, field):
    dest = tmp_path / "fleet.html"
    args = {"src": [str(artefacts)], "dest": str(dest)}
    if field == "src":
        args["src"] = [str(artefacts) + "\n"]
    else:
        args["dest"] = str(dest) + "\n"
    rc, result = run_module("gpunuma_report", args)
    assert rc != 0 and result.get("failed"), result
    name = "src[0]" if field == "src" else "dest"
    assert result["msg"].startswith(name + ": ") and "holds a control character" in result["msg"], result["msg"]
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("case", ["missing", "no-artefact", "unknown-host"])
def test_bad_sources_fail_naming_the_field_and_write_nothing(artefacts, tmp_path, case):
    dest = tmp_path / "fleet.html"
    args = {"src": [str(artefacts)], "dest": str(dest)}
    if case == "missing":
        args["src"] = [str(tmp_path / "nope")]
        expected = "src: %s does not exist" % (tmp_path / "nope")
    elif case == "no-artefact":
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "x.json").write_text('{"schema": "something/v1"}')
        args["src"] = [str(tmp_path / "other")]
        expected = "holds no gpunuma artefact"
    else:
        args["hosts"] = ["gpu-z99"]
        expected = "has no artefacts for host gpu-z99"
    rc, result = run_module("gpunuma_report", args)
    assert rc != 0 and result.get("failed"), result
    assert result["msg"].startswith("src: ") and expected in result["msg"], result["msg"]
    assert not dest.exists()


def test_the_playbook_names_its_variable_when_no_artefact_directory_exists(tmp_path):
    # A playbook directory beside no topology/, audit/ or validation/ (a project that ran nothing yet).
    project = tmp_path / "project" / "playbooks"
    project.mkdir(parents=True)
    (project / "report.yml").write_text(open(PLAYBOOK, encoding="utf-8").read())
    proc = run_playbook(str(project / "report.yml"), "localhost,")
    assert proc.returncode != 0
    assert "gpunuma_report_src: no artefact directory" in proc.stdout, proc.stdout[-2000:]
    assert not (tmp_path / "project" / "report").exists()


def test_a_fifo_among_the_artefacts_or_at_dest_is_not_read(artefacts, tmp_path):
    """Every file is read through the bounded reader: a FIFO (or a link) is never opened, so nothing blocks; the
    page replaces the FIFO at dest instead of writing into it."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "topology").symlink_to(artefacts / "topology")   # a link to a directory is not walked
    for name in ("h200-vm.json", "h200-vm.plan.json"):
        (src / name).write_bytes((artefacts / "topology" / name).read_bytes())
    os.mkfifo(str(src / "gpu-a01.json"))
    os.symlink(str(artefacts / "topology" / "gpu-a01.json"), str(src / "gpu-a02.json"))
    dest = tmp_path / "fleet.html"
    os.mkfifo(str(dest))
    rc, result = run_module("gpunuma_report", {"src": [str(src)], "dest": str(dest)})
    assert rc == 0 and result["changed"] is True, result
    assert [s["host"] for s in result["hosts"]] == ["h200-vm"]
    assert dest.is_file() and not dest.is_symlink() and 'id="host-h200_2d_vm"' in dest.read_text()
