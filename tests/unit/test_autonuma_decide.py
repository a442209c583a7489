"""autonuma_numa_balancing: auto follows the profile and the kernel release;
0, 1 and null keep their meaning (gpunuma.autonuma), and the node probe
reads the release in the same round trip (gpunuma.node_probe)."""

import os

import pytest
from hypothesis import given, settings
from conftest import examples
from hypothesis import strategies as st

from ansible.module_utils.gpunuma.node import autonuma, probe as node_probe

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("release,expected", [
    ("6.1.0-28-amd64", (6, 1)),
    ("5.12.0", (5, 12)),
    ("4.18.0-553.el8_10.x86_64", (4, 18)),
    ("5.4.0-1234-aws", (5, 4)),
    ("6.8.0-rc3+", (6, 8)),
    ("5.11\n", (5, 11)),
    ("garbage", None),
    ("", None),
    ("5", None),
    ("5.12abc", None),
    ("v6.1", None),
    ("6.1 extra words", None),
    ("\u0665.\u0661\u0662", None),  # Arabic-Indic digits are not a release
    (None, None),
    (6.1, None),
])
def test_parse_kernel_release(release, expected):
    assert autonuma.parse_kernel_release(release) == expected


NEW = ["6.1.0-28-amd64", "5.12.0", "6.18.44-fc-v657"]
OLD = ["5.4.0-1234-aws", "4.18.0-553.el8_10.x86_64", "5.11.22"]
UNKNOWN = [None, "", "garbage", "5.12abc"]


@pytest.mark.parametrize("profile", ["strict", "preferred", "interleave"])
@pytest.mark.parametrize("release", NEW)
def test_auto_bound_profile_on_5_12_or_later_leaves_the_node_alone(profile, release):
    value, reason = autonuma.decide("auto", profile, release)
    assert value is None
    assert "profile %s, kernel %s: kernel.numa_balancing is left as it is" % (profile, release) in reason
    assert "neither scanned nor migrated" in reason and "bda420b98505" in reason
    assert reason.endswith("set autonuma_numa_balancing: 0 to turn it off anyway")


@pytest.mark.parametrize("profile", ["strict", "preferred", "interleave"])
@pytest.mark.parametrize("release", OLD)
def test_auto_bound_profile_before_5_12_is_0(profile, release):
    value, reason = autonuma.decide("auto", profile, release)
    assert value == 0 and not isinstance(value, bool)
    assert "kernel %s (older than 5.12): 0" % release in reason
    assert "already bound to NUMA nodes then this feature should be disabled" in reason


@pytest.mark.parametrize("release", UNKNOWN)
def test_auto_bound_profile_with_an_unknown_release_is_0(release):
    value, reason = autonuma.decide("auto", "strict", release)
    assert value == 0
    assert "kernel release unknown: 0" in reason


@pytest.mark.parametrize("profile", ["off", False])
@pytest.mark.parametrize("release", NEW + OLD + UNKNOWN)
def test_auto_profile_off_hands_the_node_back(profile, release):
    value, reason = autonuma.decide("auto", profile, release)
    assert value is None
    assert "the profile is off (no binding)" in reason


@pytest.mark.parametrize("setting,expected", [(0, 0), (1, 1), ("0", 0), ("1", 1), (None, None)])
@pytest.mark.parametrize("profile", ["strict", "off", "interleave"])
@pytest.mark.parametrize("release", NEW + OLD + UNKNOWN)
def test_explicit_values_keep_their_meaning(setting, expected, profile, release):
    value, _ = autonuma.decide(setting, profile, release)
    assert value == expected and type(value) is type(expected)


def test_default_profile_is_strict():
    assert autonuma.decide("auto", None, "5.4.0")[1].startswith("autonuma_numa_balancing is auto, profile strict,")


@settings(max_examples=examples(300), deadline=None)
@given(release=st.one_of(st.text(), st.none(), st.binary().map(lambda b: b.decode("latin-1"))),
       profile=st.sampled_from(["strict", "preferred", "interleave", "off", False, None]))
def test_any_release_string_gives_a_decision(release, profile):
    value, reason = autonuma.decide("auto", profile, release)
    assert value in (0, None) and isinstance(reason, str) and reason
    parsed = autonuma.parse_kernel_release(release)
    assert parsed is None or (isinstance(parsed, tuple) and len(parsed) == 2)
    if profile not in ("off", False):
        assert (value is None) == (parsed is not None and parsed >= (5, 12))


@given(major=st.integers(0, 9999), minor=st.integers(0, 9999),
       rest=st.sampled_from(["", ".0", ".0-28-amd64", "-rc1", "+", ".0-553.el8_10.x86_64"]))
def test_releases_order_by_major_and_minor(major, minor, rest):
    release = "%d.%d%s" % (major, minor, rest)
    assert autonuma.parse_kernel_release(release) == (major, minor)
    value, _ = autonuma.decide("auto", "strict", release)
    assert value == (None if (major, minor) >= (5, 12) else 0)


# ------------------------------------------------------------------ the probe

def test_probe_reads_the_release_next_to_a_copied_proc_file(tmp_path):
    kernel = tmp_path / "proc" / "sys" / "kernel"
    kernel.mkdir(parents=True)
    (kernel / "numa_balancing").write_text("1\n")
    proc_path = str(kernel / "numa_balancing")
    assert node_probe.kernel_release(proc_path) is None
    (kernel / "osrelease").write_text("5.4.0-1234-aws\n")
    assert node_probe.kernel_release(proc_path) == "5.4.0-1234-aws"
    (kernel / "osrelease").write_text("")
    assert node_probe.kernel_release(proc_path) is None
    os.unlink(str(kernel / "osrelease"))
    os.mkfifo(str(kernel / "osrelease"))
    assert node_probe.kernel_release(proc_path) is None


def test_probe_of_the_real_proc_file_is_uname():
    assert node_probe.kernel_release("/proc/sys/kernel/numa_balancing") == os.uname().release
    assert node_probe.kernel_release("/proc/sys/kernel/../kernel/numa_balancing") == os.uname().release


def test_autonuma_probe_returns_the_release(tmp_path):
    kernel = tmp_path / "kernel"
    kernel.mkdir()
    (kernel / "numa_balancing").write_text("0\n")
    (kernel / "osrelease").write_text("6.1.0-28-amd64\n")

    def runner(argv):
        return 1, "", ""

    result = node_probe.autonuma_probe(runner, {"proc_path": str(kernel / "numa_balancing")})
    assert result["kernel_release"] == "6.1.0-28-amd64" and result["live_value"] == "0"
    assert node_probe.probe(runner, autonuma={"proc_path": str(kernel / "numa_balancing")})["autonuma"][
        "kernel_release"] == "6.1.0-28-amd64"


# ------------------------------------------------------------------ role_plan: everything the role does, at once

OWN = "/etc/sysctl.d/90-gpunuma-numa-balancing.conf"


def node(**over):
    base = {"live_value": 1, "kernel_release": "5.10.0", "in_container": False, "sysctl_paths": [], "sysctl_lines": [],
            "tuned_active": "", "tuned_active_rc": 1, "tuned_lines": []}
    base.update(over)
    return base


def role_plan(setting, probe=None, profile="strict", apply_live=None, on_conflict="warn"):
    return autonuma.role_plan(setting, profile, probe, apply_live, OWN, on_conflict, "gpu-a01",
                              "/proc/sys/kernel/numa_balancing")


def test_role_plan_null_hands_the_key_back():
    out = role_plan(None)
    assert (out["value"], out["remove_file"], out["write_file"], out["write_live"]) == (None, True, False, False)
    assert out["notes"] == ["autonuma_numa_balancing is null: kernel.numa_balancing is not managed; its live value "
                            "is left as it is."]


def test_role_plan_auto_writes_file_and_live_value_on_an_old_kernel():
    out = role_plan("auto", node())
    assert (out["value"], out["write_file"], out["write_live"], out["problem"]) == (0, True, True, None)
    assert out["notes"][0].startswith("autonuma_numa_balancing is auto, profile strict, kernel 5.10.0 (older than 5.12): 0")


def test_role_plan_leaves_an_equal_live_value_and_a_container_alone():
    assert role_plan(0, node(live_value=0))["write_live"] is False
    inside = role_plan(0, node(in_container=True))
    assert inside["write_file"] and not inside["write_live"]
    assert "was not written: this node is a container" in inside["notes"][-1]
    assert role_plan(0, node(in_container=True), apply_live=True)["write_live"] is True


def test_role_plan_conflicts_warn_or_stop_before_writing():
    later = "/etc/sysctl.d/99-site.conf"
    probe = node(sysctl_paths=[later], sysctl_lines=["%s:kernel.numa_balancing=1" % later])
    warned = role_plan(0, probe)
    assert warned["write_file"] and any(n.startswith("WARNING gpu-a01: %s sets kernel.numa_balancing=1" % later)
                                        for n in warned["notes"])
    stopped = role_plan(0, probe, on_conflict="fail")
    assert stopped["problem"].startswith("gpu-a01: kernel.numa_balancing=0 would not hold: %s" % later)
    assert not stopped["write_file"] and not stopped["write_live"]


def test_role_plan_on_a_kernel_without_numa_balancing_writes_nothing():
    out = role_plan(0, node(live_value=None))
    assert not out["write_file"] and not out["write_live"]
    assert out["notes"][-1].startswith("/proc/sys/kernel/numa_balancing does not exist")
