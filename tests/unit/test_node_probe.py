"""gpunuma_node_info's core (module_utils/gpunuma/node/probe.py) on files under tmp_path and a fake runner."""

import base64
import os
import signal

import pytest

from ansible.module_utils.gpunuma.node import probe as node_probe
from ansible.module_utils.gpunuma.node.probe import (
    NODE_INFO_OPTIONS,
    autonuma_probe,
    node_read_params,
    pid1_texts,
    probe,
    read_file,
    run_probe,
    unit_states,
)

pytestmark = pytest.mark.unit


class Runner:
    """Answers argv by its first words; records every call."""

    def __init__(self, answers=None):
        self.answers = answers or {}
        self.calls = []

    def __call__(self, argv):
        self.calls.append(list(argv))
        for words, answer in self.answers.items():
            if tuple(argv[:len(words)]) == words:
                return answer(argv) if callable(answer) else answer
        raise AssertionError("unexpected command %r" % argv)


def b64(text):
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode("ascii")


# ------------------------------------------------------------------ unit_states

SHOW = ("LoadState=loaded\nActiveState=active\nUnitFileState=enabled\nMainPID=1234\n"
        "\n"
        "LoadState=not-found\nActiveState=inactive\nUnitFileState=\nMainPID=0\n"
        "\n"
        "LoadState=loaded\nActiveState=failed\nUnitFileState=disabled\nMainPID=0\n")


def test_unit_states_one_call_for_all_units_blocks_in_order():
    runner = Runner({("systemctl", "show"): (0, SHOW, "")})
    states = unit_states(runner, ["a.service", "gone.service", "b.service", "a.service"])
    assert runner.calls == [["systemctl", "show", "--property=LoadState,ActiveState,UnitFileState,MainPID", "--",
                             "a.service", "gone.service", "b.service"]]
    assert states == {
        "a.service": {"LoadState": "loaded", "ActiveState": "active", "UnitFileState": "enabled", "MainPID": "1234"},
        "gone.service": {"LoadState": "not-found", "ActiveState": "inactive", "UnitFileState": "",
                         "MainPID": "0"},
        "b.service": {"LoadState": "loaded", "ActiveState": "failed", "UnitFileState": "disabled", "MainPID": "0"},
    }


def test_unit_states_values_may_hold_equals_and_extra_blank_lines():
    out = "\n\nLoadState=loaded\nDescription=a=b\n\n\n\nLoadState=loaded\nDescription=\n\n"
    runner = Runner({("systemctl", "show"): (0, out, "")})
    states = unit_states(runner, ["x.service", "y.service"], props=("LoadState", "Description"))
    assert states == {"x.service": {"LoadState": "loaded", "Description": "a=b"},
                      "y.service": {"LoadState": "loaded", "Description": ""}}


def test_unit_states_missing_blocks_are_unknown():
    runner = Runner({("systemctl", "show"): (0, "LoadState=loaded\nActiveState=active\n", "")})
    states = unit_states(runner, ["x.service", "y.service"])
    assert states["x.service"]["ActiveState"] == "active"
    assert states["y.service"] == {"LoadState": "unknown"}


@pytest.mark.parametrize("answer,error", [
    ((1, "", "Failed to connect to bus: No such file or directory\n"), "Failed to connect to bus: No such file"),
    ((None, "", "[Errno 2] No such file or directory: b'systemctl'"), "[Errno 2] No such file or directory"),
    ((1, "", ""), "systemctl failed"),
])
def test_unit_states_failing_systemctl(answer, error):
    runner = Runner({("systemctl", "show"): answer})
    states = unit_states(runner, ["x.service", "y.service"])
    assert set(states) == {"x.service", "y.service"}
    for value in states.values():
        assert value["LoadState"] == "unknown"
        assert value["error"].startswith(error)
        assert value["error"] == value["error"].strip()


def test_unit_states_nonzero_rc_with_output_is_parsed():
    # systemctl show exits non-zero when one unit name is refused but prints the rest.
    runner = Runner({("systemctl", "show"): (1, "LoadState=loaded\nActiveState=active\n", "bad name")})
    assert unit_states(runner, ["x.service"]) == {"x.service": {"LoadState": "loaded", "ActiveState": "active"}}


def test_unit_states_no_units_runs_nothing():
    runner = Runner()
    assert unit_states(runner, []) == {} and unit_states(runner, None) == {}
    assert runner.calls == []


# ------------------------------------------------------------------ read_file

def test_read_file_missing_and_regular(tmp_path):
    assert read_file(str(tmp_path / "missing")) == {"exists": False}
    assert read_file(str(tmp_path / "not-a-dir" / "x")) == {"exists": False}
    (tmp_path / "file").write_bytes(b"not-a-dir")
    assert read_file(str(tmp_path / "file" / "x")) == {"exists": False}
    (tmp_path / "plan.json").write_bytes(b'{"a": 1}\n\xff')
    assert read_file(str(tmp_path / "plan.json")) == {"exists": True, "content": b64(b'{"a": 1}\n\xff')}
    (tmp_path / "empty").write_bytes(b"")
    assert read_file(str(tmp_path / "empty")) == {"exists": True, "content": ""}


def test_read_file_follows_a_link_to_a_regular_file(tmp_path):
    (tmp_path / "real").write_text("x\n")
    os.symlink(str(tmp_path / "real"), str(tmp_path / "link"))
    assert read_file(str(tmp_path / "link")) == {"exists": True, "content": b64("x\n")}
    os.symlink(str(tmp_path / "nowhere"), str(tmp_path / "dangling"))
    assert read_file(str(tmp_path / "dangling")) == {"exists": False}


def test_read_file_fifo_is_a_problem_and_never_blocks(tmp_path):
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)

    def hung(signum, frame):
        raise AssertionError("read_file blocked on a FIFO")
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(5)
    try:
        result = read_file(fifo)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert result["exists"] is True and "content" not in result
    assert result["problem"].startswith(fifo + " cannot be read: ")
    assert "FIFO" in result["problem"] or "fifo" in result["problem"].lower()


def test_read_file_directory_and_device_are_problems(tmp_path):
    result = read_file(str(tmp_path))
    assert result["exists"] is True and "content" not in result and "cannot be read" in result["problem"]
    os.symlink("/dev/null", str(tmp_path / "null"))
    result = read_file(str(tmp_path / "null"))
    assert result["exists"] is True and "content" not in result and "cannot be read" in result["problem"]


def test_read_file_too_large(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(b"x" * 101)
    result = read_file(str(path), limit=100)
    assert result["exists"] is True and "content" not in result
    assert result["problem"].startswith(str(path) + " cannot be read: ")
    path.write_bytes(b"x" * 100)
    assert read_file(str(path), limit=100) == {"exists": True, "content": b64("x" * 100)}


# ------------------------------------------------------------------ run_probe

def test_run_probe_missing_program_sets_msg():
    runner = Runner({("nvidia-smi",): (None, "", "[Errno 2] No such file or directory: b'nvidia-smi'")})
    assert run_probe(runner, ("nvidia-smi", "-q")) == {
        "rc": None, "stdout": "", "stderr": "[Errno 2] No such file or directory: b'nvidia-smi'",
        "msg": "[Errno 2] No such file or directory: b'nvidia-smi'"}
    assert runner.calls == [["nvidia-smi", "-q"]]
    runner = Runner({("x",): (None, None, None)})
    assert run_probe(runner, ["x"]) == {"rc": None, "stdout": "", "stderr": "", "msg": "No such file or directory"}


def test_run_probe_ran_program_has_no_msg():
    runner = Runner({("numactl",): (1, "out\n", "err\n")})
    assert run_probe(runner, ["numactl", "-H"]) == {"rc": 1, "stdout": "out\n", "stderr": "err\n"}
    runner = Runner({("true",): (0, None, None)})
    assert run_probe(runner, ["true"]) == {"rc": 0, "stdout": "", "stderr": ""}


# ------------------------------------------------------------------ autonuma_probe

@pytest.fixture
def autonuma_tree(tmp_path):
    root = tmp_path
    proc = root / "proc" / "numa_balancing"
    proc.parent.mkdir()
    proc.write_text("1\n")
    etc_d = root / "etc" / "sysctl.d"
    usr_d = root / "usr" / "lib" / "sysctl.d"
    for d in (etc_d, usr_d):
        d.mkdir(parents=True)
    (etc_d / "99-gpunuma.conf").write_text("# gpunuma\nkernel.numa_balancing = 0\n")
    (etc_d / "10-other.conf").write_text("vm.swappiness = 10\n")
    (etc_d / "50-vendor.conf").write_text("kernel.numa_balancing=1\n#kernel.numa_balancing=0\n")
    (etc_d / "README").write_text("kernel.numa_balancing = 1\n")
    (usr_d / "50-default.conf").write_text("kernel.numa_balancing = 1\n")
    conf = root / "etc" / "sysctl.conf"
    conf.write_text("kernel.numa_balancing = 1\nnet.core.somaxconn = 1024\n")
    tuned = root / "usr" / "lib" / "tuned"
    (tuned / "throughput").mkdir(parents=True)
    (tuned / "throughput" / "tuned.conf").write_text(
        "[main]\nsummary=x\ninclude = balanced\n[sysctl]\nkernel.numa_balancing = 0\nvm.dirty_ratio = 40\n")
    (tuned / "deep" / "a" / "b").mkdir(parents=True)
    (tuned / "deep" / "a" / "b" / "tuned.conf").write_text("[sysctl]\nkernel.numa_balancing = 1\n")
    spec = {
        "proc_path": str(proc),
        "sysctl_dirs": [str(etc_d), str(usr_d), str(root / "run" / "sysctl.d")],
        "sysctl_conf": str(conf),
        "tuned_dirs": [str(tuned), str(root / "etc" / "tuned")],
        "container_markers": [str(root / ".dockerenv"), str(root / "run" / ".containerenv")],
    }
    return root, spec


def _runner(virt_rc, tuned_rc, tuned_out="Current active profile: throughput-performance\n"):
    return Runner({("systemd-detect-virt",): (virt_rc, "none\n" if virt_rc else "docker\n", ""),
                   ("tuned-adm",): (tuned_rc, tuned_out if tuned_rc == 0 else "", "")})


def test_autonuma_probe_on_a_host_with_tuned(autonuma_tree):
    root, spec = autonuma_tree
    runner = _runner(1, 0)
    result = autonuma_probe(runner, spec)
    etc_d, usr_d = spec["sysctl_dirs"][:2]
    conf = spec["sysctl_conf"]
    assert result["live_value"] == "1"
    assert result["in_container"] is False and result["container_markers"] == []
    assert result["sysctl_paths"] == [etc_d + "/10-other.conf", etc_d + "/50-vendor.conf",
                                      etc_d + "/99-gpunuma.conf", usr_d + "/50-default.conf", conf]
    assert result["sysctl_lines"] == [
        etc_d + "/50-vendor.conf:kernel.numa_balancing=1",
        etc_d + "/50-vendor.conf:#kernel.numa_balancing=0",
        etc_d + "/99-gpunuma.conf:kernel.numa_balancing = 0",
        usr_d + "/50-default.conf:kernel.numa_balancing = 1",
        conf + ":kernel.numa_balancing = 1",
    ]
    assert result["tuned_active_rc"] == 0
    assert result["tuned_active"].startswith("Current active profile")
    tuned_conf = spec["tuned_dirs"][0] + "/throughput/tuned.conf"
    # Section headers, include lines and the key; depth-limited (deep/a/b is not read).
    assert result["tuned_lines"] == [tuned_conf + ":[main]", tuned_conf + ":include = balanced",
                                     tuned_conf + ":[sysctl]", tuned_conf + ":kernel.numa_balancing = 0"]
    assert [c[0] for c in runner.calls] == ["systemd-detect-virt", "tuned-adm"]
    assert runner.calls[0] == ["systemd-detect-virt", "--container"]
    assert runner.calls[1] == ["tuned-adm", "active"]


@pytest.mark.parametrize("tuned_rc", [1, None])
def test_autonuma_probe_reads_tuned_only_when_tuned_adm_succeeds(autonuma_tree, tuned_rc):
    _, spec = autonuma_tree
    result = autonuma_probe(_runner(1, tuned_rc), spec)
    assert result["tuned_active_rc"] == tuned_rc
    assert result["tuned_active"] == ""
    assert result["tuned_lines"] == []


def test_autonuma_probe_container_by_detect_virt_or_marker(autonuma_tree):
    root, spec = autonuma_tree
    assert autonuma_probe(_runner(0, 1), spec)["in_container"] is True
    (root / "run").mkdir()
    (root / "run" / ".containerenv").write_text("")
    result = autonuma_probe(_runner(1, 1), spec)
    assert result["in_container"] is True
    assert result["container_markers"] == [str(root / "run" / ".containerenv")]
    # A dangling link is still a marker (lexists).
    os.symlink(str(root / "nowhere"), str(root / ".dockerenv"))
    assert autonuma_probe(_runner(1, 1), spec)["container_markers"] == [
        str(root / ".dockerenv"), str(root / "run" / ".containerenv")]


def test_autonuma_probe_without_proc_file_or_sysctl_conf(autonuma_tree):
    root, spec = autonuma_tree
    os.unlink(spec["proc_path"])
    os.unlink(spec["sysctl_conf"])
    result = autonuma_probe(_runner(1, 1), dict(spec, sysctl_dirs=[]))
    assert result["live_value"] is None
    assert result["sysctl_paths"] == [] and result["sysctl_lines"] == []


def test_autonuma_probe_skips_unreadable_sysctl_entries(autonuma_tree):
    root, spec = autonuma_tree
    etc_d = spec["sysctl_dirs"][0]
    os.mkfifo(os.path.join(etc_d, "60-fifo.conf"))
    os.symlink("/dev/zero", os.path.join(etc_d, "70-zero.conf"))
    result = autonuma_probe(_runner(1, 1), spec)
    assert etc_d + "/60-fifo.conf" in result["sysctl_paths"]
    assert not any("60-fifo" in line or "70-zero" in line for line in result["sysctl_lines"])
    assert len(result["sysctl_lines"]) == 5


# ------------------------------------------------------------------ pid1_texts and probe

def test_pid1_texts_only_readable_files(tmp_path):
    (tmp_path / "limits").write_text("Max locked memory  unlimited  unlimited  bytes\n")
    (tmp_path / "status").write_text("Name:\tsystemd\n")
    assert pid1_texts(str(tmp_path)) == {"limits": b64("Max locked memory  unlimited  unlimited  bytes\n"),
                                        "status": b64("Name:\tsystemd\n")}
    os.mkfifo(str(tmp_path / "uid_map"))
    assert set(pid1_texts(str(tmp_path))) == {"limits", "status"}
    assert pid1_texts(str(tmp_path / "missing")) == {}


def test_probe_returns_only_the_sections_asked_for(tmp_path, autonuma_tree):
    (tmp_path / "plan.json").write_text("{}\n")
    runner = Runner({("systemctl", "show"): (0, SHOW.split("\n\n")[0], ""),
                     ("nproc",): (0, "8\n", "")})
    assert probe(runner) == {}
    assert runner.calls == []
    out = probe(runner, files={"plan": str(tmp_path / "plan.json"), "none": str(tmp_path / "none")},
                paths=[str(tmp_path / "plan.json"), str(tmp_path / "nope")],
                units=["a.service"], commands={"cpus": ["nproc"]}, pid1_proc_dir=str(tmp_path))
    assert out == {
        "files": {"plan": {"exists": True, "content": b64("{}\n")}, "none": {"exists": False}},
        "paths": {str(tmp_path / "plan.json"): True, str(tmp_path / "nope"): False},
        "units": {"a.service": {"LoadState": "loaded", "ActiveState": "active", "UnitFileState": "enabled",
                                "MainPID": "1234"}},
        "commands": {"cpus": {"rc": 0, "stdout": "8\n", "stderr": ""}},
        "pid1": {},
    }
    _, spec = autonuma_tree
    result = probe(_runner(1, 1), autonuma=spec)
    assert list(result) == ["autonuma"] and result["autonuma"]["live_value"] == "1"


# ------------------------------------------------------------------ drop-in targets

@pytest.mark.parametrize("argv,expected", [
    (["/usr/bin/docker", "run", "--rm", "img"], "docker run"),
    (["/usr/bin/podman", "run", "img"], "podman run"),
    (["/usr/local/bin/nerdctl", "--namespace", "k8s.io", "run", "img"], "nerdctl run"),
    (["/usr/bin/docker", "compose", "up"], "docker compose up"),
    (["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"], None),
    (["/usr/bin/dockerd", "-H", "fd://"], None),
])
def test_launches_container(argv, expected):
    assert node_probe.launches_container(argv) == expected


def test_inspect_units_finds_container_launchers_and_cuda_env(tmp_path):
    env = tmp_path / "vendor.env"
    env.write_text("# comment\nexport CUDA_VISIBLE_DEVICES=3\nOTHER=1\n")
    show = ("ExecStart={ path=/usr/bin/docker ; argv[]=/usr/bin/docker run --gpus all img ; ignore_errors=no ; "
            "start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }\n"
            "EnvironmentFiles=%s (ignore_errors=no)\nEnvironment=\n\n"
            "ExecStart={ path=/usr/bin/python3 ; argv[]=/usr/bin/python3 serve.py ; ignore_errors=no }\n"
            "EnvironmentFiles=\nEnvironment=CUDA_VISIBLE_DEVICES=0 FOO=1\n" % env)
    calls = []

    def runner(argv):
        calls.append(argv)
        return 0, show, ""

    found = node_probe.inspect_units(runner, ["vendor.service", "plain.service"])
    assert calls == [["systemctl", "show", "--property=ExecStart,EnvironmentFiles,Environment", "--",
                      "vendor.service", "plain.service"]]
    assert found["vendor.service"] == {"container_launchers": ["docker run"],
                                       "cuda_visible_devices": ["%s: CUDA_VISIBLE_DEVICES=3" % env]}
    assert found["plain.service"]["container_launchers"] == []
    assert found["plain.service"]["cuda_visible_devices"] == ["Environment=: CUDA_VISIBLE_DEVICES=0"]


def test_accounts_say_which_users_and_groups_exist():
    from ansible.module_utils.gpunuma.node.probe import account_states

    found = account_states(["root", "gpunuma-no-such-user", "4242"], ["root", "gpunuma-no-such-group", "7"])
    assert found["users"]["root"]["exists"] and found["users"]["root"]["uid"] == 0
    assert found["users"]["gpunuma-no-such-user"] == {"exists": False}
    assert found["users"]["4242"]["exists"]
    assert found["groups"] == {"root": True, "gpunuma-no-such-group": False, "7": True}


def test_node_read_params_check_and_complete_like_gpunuma_node_info():
    """gpu_topology_info's node_info takes gpunuma_node_info's options, checked by the same spec."""
    params = node_read_params({"units": ["a.service"], "autonuma": {"sysctl_dirs": ["/etc/sysctl.d"]},
                               "accounts": {"users": ["gpunuma"]}})
    assert set(params) == set(NODE_INFO_OPTIONS)
    assert params["units"] == ["a.service"] and params["files"] is None
    assert params["autonuma"]["proc_path"] == "/proc/sys/kernel/numa_balancing"
    assert params["accounts"] == {"users": ["gpunuma"], "groups": []}


@pytest.mark.parametrize("options, words", [
    ({"bogus": 1}, ["node_info: unsupported option bogus", "Supported parameters include: accounts"]),
    ({"autonuma": {"proc": "/x"}}, ["node_info: unsupported option autonuma.proc"]),
    ({"programs": [{"user": "x"}]}, ["node_info: missing required arguments: path"]),
    ({"commands": {"probe": "numactl --show"}}, ["node_info.commands.probe must be an argv"]),
    ({"commands": {"probe": []}}, ["node_info.commands.probe must be an argv"]),
    (["units"], ["node_info must be a mapping of gpunuma_node_info's options, got list"]),
])
def test_node_read_params_name_the_bad_option(options, words):
    problem = node_read_params(options)
    assert isinstance(problem, str)
    for word in words:
        assert word in problem, problem


def test_globs_list_the_matching_paths_of_any_type_sorted(tmp_path):
    """The kubelet's DRA plugin registrations are sockets (<driver>-reg.sock): listed as any other file."""
    import socket

    registry = tmp_path / "plugins_registry"
    registry.mkdir()
    (registry / "gpu.nvidia.com-reg.sock").write_text("")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(registry / "dra.cpu-reg.sock"))
    (registry / "other.sock").write_text("")
    try:
        out = node_probe.probe(None, globs={"regs": str(registry / "*-reg.sock"), "none": str(tmp_path / "missing/*")})
    finally:
        sock.close()
    assert out == {"globs": {"regs": [str(registry / "dra.cpu-reg.sock"), str(registry / "gpu.nvidia.com-reg.sock")],
                             "none": []}}
