"""sysctl_owners: who else sets kernel.numa_balancing (sysctl.d order, tuned include chains)."""

import pytest

from ansible.module_utils.gpunuma.node import sysctl_owners as so
from ansible.module_utils.gpunuma.common.errors import GpunumaError

pytestmark = pytest.mark.unit

OWN = "/etc/sysctl.d/60-gpunuma-numa-balancing.conf"


# ------------------------------------------------------------ grep -H output


def test_grep_lines_grouped_by_path_in_order():
    lines = ["/a.conf:x=1", "/b.conf:y=2", "/a.conf:z=3:4", "no path here"]
    assert so.grep_lines_by_path(lines) == {"/a.conf": ["x=1", "z=3:4"], "/b.conf": ["y=2"]}


@pytest.mark.parametrize("bad", ["/a.conf:x=1", ["/a.conf:x=1", 3]])
def test_grep_lines_must_be_a_list_of_strings(bad):
    with pytest.raises(GpunumaError, match="grep lines: .* allowed: a list of strings"):
        so.grep_lines_by_path(bad)


# ---------------------------------------------------------- sysctl.d order


def test_apply_order_is_by_file_name_across_directories():
    paths = ["/usr/lib/sysctl.d/99-z.conf", "/etc/sysctl.d/10-a.conf", "/run/sysctl.d/50-m.conf"]
    assert so.sysctl_apply_order(paths) == [
        "/etc/sysctl.d/10-a.conf",
        "/run/sysctl.d/50-m.conf",
        "/usr/lib/sysctl.d/99-z.conf",
    ]


@pytest.mark.parametrize(
    "paths, kept",
    [
        (["/usr/lib/sysctl.d/50-x.conf", "/etc/sysctl.d/50-x.conf"], "/etc/sysctl.d/50-x.conf"),
        (["/lib/sysctl.d/50-x.conf", "/usr/local/lib/sysctl.d/50-x.conf"], "/usr/local/lib/sysctl.d/50-x.conf"),
        (["/usr/lib/sysctl.d/50-x.conf", "/run/sysctl.d/50-x.conf"], "/run/sysctl.d/50-x.conf"),
        # Outside the standard directories: ranks after them.
        (["/srv/sysctl.d/50-x.conf", "/lib/sysctl.d/50-x.conf"], "/lib/sysctl.d/50-x.conf"),
    ],
)
def test_earlier_directory_hides_the_same_name(paths, kept):
    assert so.sysctl_apply_order(paths) == [kept]


def test_sysctl_conf_comes_last_once():
    paths = ["/etc/sysctl.conf", "/etc/sysctl.d/99-z.conf", "/etc/sysctl.conf"]
    assert so.sysctl_apply_order(paths) == ["/etc/sysctl.d/99-z.conf", "/etc/sysctl.conf"]


def test_writers_follow_file_name_order_across_directories():
    paths = ["/usr/lib/sysctl.d/10-distro.conf", OWN, "/etc/sysctl.d/99-late.conf"]
    grep = [
        "/usr/lib/sysctl.d/10-distro.conf:kernel.numa_balancing = 1",
        OWN + ":kernel.numa_balancing=0",
        "/etc/sysctl.d/99-late.conf:kernel/numa_balancing=1",
    ]
    assert so.sysctl_writers(list(reversed(paths)), grep) == [
        {"path": paths[0], "value": "1"},
        {"path": OWN, "value": "0"},
        {"path": paths[2], "value": "1"},
    ]


def test_a_hidden_file_does_not_write():
    paths = ["/usr/lib/sysctl.d/50-x.conf", "/etc/sysctl.d/50-x.conf", OWN]
    grep = ["/usr/lib/sysctl.d/50-x.conf:kernel.numa_balancing=1", OWN + ":kernel.numa_balancing=0"]
    # /etc/sysctl.d/50-x.conf sets nothing, but hides the shipped file.
    assert so.sysctl_writers(paths, grep) == [{"path": OWN, "value": "0"}]


def test_sysctl_conf_writes_last():
    paths = ["/etc/sysctl.conf", OWN, "/etc/sysctl.d/99-z.conf"]
    grep = ["/etc/sysctl.conf:kernel.numa_balancing=1", OWN + ":kernel.numa_balancing=0"]
    assert [w["path"] for w in so.sysctl_writers(paths, grep)] == [OWN, "/etc/sysctl.conf"]


def test_last_assignment_in_a_file_wins_and_ignore_prefix_is_read():
    grep = [OWN + ":kernel.numa_balancing=1", OWN + ":-kernel.numa_balancing = 0"]
    assert so.sysctl_writers([OWN], grep) == [{"path": OWN, "value": "0"}]


@pytest.mark.parametrize(
    "line",
    [
        "# kernel.numa_balancing=1",
        "; kernel.numa_balancing=1",
        "kernel.numa_balancing_scan_delay_ms=1000",
        "kernelXnuma_balancing=1",
        "vm.numa_balancing=1",
    ],
)
def test_other_keys_and_comments_are_not_settings(line):
    assert so.sysctl_writers([OWN], [OWN + ":" + line]) == []


def test_a_file_not_in_the_list_is_not_read():
    assert so.sysctl_writers([OWN], ["/etc/sysctl.d/99-gone.conf:kernel.numa_balancing=1"]) == []


def test_other_key_given_with_slashes():
    grep = [OWN + ":vm.swappiness=10", OWN + ":kernel.numa_balancing=0"]
    assert so.sysctl_writers([OWN], grep, key="vm/swappiness") == [{"path": OWN, "value": "10"}]


@pytest.mark.parametrize("key", ["", "kernel numa", "kernel.numa_balancing=0", None, "a..b"])
def test_bad_key_is_refused(key):
    with pytest.raises(GpunumaError, match="sysctl key: .* allowed: dotted or slashed words"):
        so.sysctl_writers([OWN], [], key=key)


# --------------------------------------------------------------- conflicts


WRITERS = [
    {"path": "/usr/lib/sysctl.d/10-distro.conf", "value": "1"},
    {"path": OWN, "value": "0"},
    {"path": "/etc/sysctl.d/99-late.conf", "value": "1"},
    {"path": "/etc/sysctl.d/99-same.conf", "value": "0"},
]


def test_later_file_with_another_value_overrides_gpunuma():
    result = so.sysctl_conflicts(WRITERS, OWN, 0)
    assert [w["path"] for w in result["overriding"]] == ["/etc/sysctl.d/99-late.conf"]
    assert result["overriding"][0]["reason"] == (
        "/etc/sysctl.d/99-late.conf sets kernel.numa_balancing=1 and is applied after %s, so it wins at boot" % OWN
    )
    assert [w["path"] for w in result["overridden"]] == ["/usr/lib/sysctl.d/10-distro.conf"]
    assert result["overridden"][0]["reason"] == (
        "/usr/lib/sysctl.d/10-distro.conf sets kernel.numa_balancing=1; %s is applied after it and wins" % OWN
    )


def test_wanted_value_decides_who_conflicts():
    result = so.sysctl_conflicts(WRITERS, OWN, "1")
    assert [w["path"] for w in result["overriding"]] == ["/etc/sysctl.d/99-same.conf"]
    assert result["overridden"] == []


def test_every_other_value_overrides_when_gpunuma_file_is_absent():
    result = so.sysctl_conflicts([w for w in WRITERS if w["path"] != OWN], OWN, 0)
    assert [w["path"] for w in result["overriding"]] == [
        "/usr/lib/sysctl.d/10-distro.conf",
        "/etc/sysctl.d/99-late.conf",
    ]


def test_no_conflict_when_everyone_agrees():
    writers = [{"path": OWN, "value": "1"}, {"path": "/etc/sysctl.d/99-late.conf", "value": "1"}]
    assert so.sysctl_conflicts(writers, OWN, 1) == {"overriding": [], "overridden": []}


def test_conflicts_do_not_modify_the_writers():
    writers = [dict(w) for w in WRITERS]
    so.sysctl_conflicts(writers, OWN, 0)
    assert writers == WRITERS


@pytest.mark.parametrize(
    "writers, own, wanted, message",
    [
        ([{"path": OWN}], OWN, 0, "sysctl writers: .* lack path or value"),
        (WRITERS, "", 0, "own sysctl file: '' is not a path"),
        (WRITERS, OWN, None, "wanted value: None is not a sysctl value"),
        (WRITERS, OWN, True, "wanted value: True is not a sysctl value"),
    ],
)
def test_bad_conflict_input_is_refused(writers, own, wanted, message):
    with pytest.raises(GpunumaError, match=message):
        so.sysctl_conflicts(writers, own, wanted)


# ------------------------------------------------------------------- tuned


TUNED = [
    "/usr/lib/tuned/latency-performance/tuned.conf:[cpu]",
    "/usr/lib/tuned/network-latency/tuned.conf:[main]",
    "/usr/lib/tuned/network-latency/tuned.conf:include=latency-performance",
    "/usr/lib/tuned/network-latency/tuned.conf:[sysctl]",
    "/usr/lib/tuned/network-latency/tuned.conf:kernel.numa_balancing=0",
    "/usr/lib/tuned/cpu-partitioning/tuned.conf:[main]",
    "/usr/lib/tuned/cpu-partitioning/tuned.conf:include=network-latency",
    "/usr/lib/tuned/cpu-partitioning/tuned.conf:[sysctl]",
    "/usr/lib/tuned/throughput-performance/tuned.conf:[main]",
    "/usr/lib/tuned/throughput-performance/tuned.conf:[sysctl]",
]


@pytest.mark.parametrize(
    "text, profiles",
    [
        ("Current active profile: cpu-partitioning\n", ["cpu-partitioning"]),
        ("Current active profile: throughput-performance hpc-compute", ["throughput-performance", "hpc-compute"]),
        ("Some warning\nCurrent active profile: virtual-guest\nProfile mode: auto\n", ["virtual-guest"]),
        ("No current active profile.", []),
        ("", []),
        (None, []),
    ],
)
def test_active_profiles_from_tuned_adm(text, profiles):
    assert so.tuned_active_profiles(text) == profiles


def test_active_profiles_need_text():
    with pytest.raises(GpunumaError, match="tuned-adm active output: .* is not text"):
        so.tuned_active_profiles(["Current active profile: x"])


def test_etc_tuned_profile_replaces_the_shipped_one_whatever_the_order():
    shipped = "/usr/lib/tuned/x/tuned.conf:[main]"
    local = "/etc/tuned/x/tuned.conf:[sysctl]"
    assert so.tuned_profiles([shipped, local]) == {"x": ["[sysctl]"]}
    assert so.tuned_profiles([local, shipped]) == {"x": ["[sysctl]"]}


def test_setting_found_through_the_include_chain():
    assert so.tuned_setting(TUNED, ["cpu-partitioning"]) == {
        "value": "0",
        "profile": "network-latency",
        "chain": ["cpu-partitioning", "network-latency"],
    }


def test_profile_setting_it_itself_has_a_chain_of_one():
    assert so.tuned_setting(TUNED, ["network-latency"]) == {
        "value": "0",
        "profile": "network-latency",
        "chain": ["network-latency"],
    }


@pytest.mark.parametrize("active", [["throughput-performance"], ["latency-performance"], ["not-installed"], [], None])
def test_profiles_without_the_key_set_nothing(active):
    assert so.tuned_setting(TUNED, active) is None


def test_including_profile_overrides_the_included_one():
    lines = TUNED + [
        "/etc/tuned/gpu-serving/tuned.conf:[main]",
        "/etc/tuned/gpu-serving/tuned.conf:include=cpu-partitioning",
        "/etc/tuned/gpu-serving/tuned.conf:[sysctl]",
        "/etc/tuned/gpu-serving/tuned.conf:kernel.numa_balancing=1",
    ]
    setting = so.tuned_setting(lines, ["gpu-serving"])
    assert (setting["value"], setting["chain"]) == ("1", ["gpu-serving"])


def test_later_include_in_a_list_wins():
    lines = [
        "/usr/lib/tuned/on/tuned.conf:[sysctl]",
        "/usr/lib/tuned/on/tuned.conf:kernel.numa_balancing=1",
        "/usr/lib/tuned/off/tuned.conf:[sysctl]",
        "/usr/lib/tuned/off/tuned.conf:kernel.numa_balancing=0",
        "/usr/lib/tuned/both/tuned.conf:[main]",
        "/usr/lib/tuned/both/tuned.conf:include=on, off",
    ]
    assert so.tuned_setting(lines, ["both"])["profile"] == "off"
    lines[-1] = "/usr/lib/tuned/both/tuned.conf:include=off,on"
    assert so.tuned_setting(lines, ["both"])["profile"] == "on"


def test_last_of_several_active_profiles_wins():
    lines = TUNED + ["/etc/tuned/numa-on/tuned.conf:[sysctl]", "/etc/tuned/numa-on/tuned.conf:kernel.numa_balancing=1"]
    assert so.tuned_setting(lines, ["cpu-partitioning", "numa-on"])["value"] == "1"
    assert so.tuned_setting(lines, ["numa-on", "cpu-partitioning"])["value"] == "0"


def test_etc_tuned_replaces_the_shipped_profile():
    lines = TUNED + [
        "/etc/tuned/network-latency/tuned.conf:[main]",
        "/etc/tuned/network-latency/tuned.conf:include=latency-performance",
    ]
    assert so.tuned_setting(lines, ["cpu-partitioning"]) is None


def test_include_through_a_variable_is_not_followed():
    lines = TUNED + [
        "/etc/tuned/v/tuned.conf:[main]",
        "/etc/tuned/v/tuned.conf:include=${f:virt_check:x:network-latency}",
    ]
    assert so.tuned_setting(lines, ["v"]) is None


def test_include_loops_end():
    lines = [
        "/usr/lib/tuned/a/tuned.conf:[main]",
        "/usr/lib/tuned/a/tuned.conf:include=b",
        "/usr/lib/tuned/b/tuned.conf:[main]",
        "/usr/lib/tuned/b/tuned.conf:include=a",
        "/usr/lib/tuned/b/tuned.conf:[sysctl]",
        "/usr/lib/tuned/b/tuned.conf:kernel.numa_balancing=1",
    ]
    assert so.tuned_setting(lines, ["a"]) == {"value": "1", "profile": "b", "chain": ["a", "b"]}


@pytest.mark.parametrize(
    "lines",
    [
        ["/usr/lib/tuned/x/tuned.conf:[bootloader]", "/usr/lib/tuned/x/tuned.conf:kernel.numa_balancing=0"],
        ["/usr/lib/tuned/x/tuned.conf:kernel.numa_balancing=0"],
        [
            "/usr/lib/tuned/x/tuned.conf:[sysctl]",
            "/usr/lib/tuned/x/tuned.conf:include=y",
            "/usr/lib/tuned/y/tuned.conf:[sysctl]",
            "/usr/lib/tuned/y/tuned.conf:kernel.numa_balancing=0",
        ],
    ],
    ids=["other-section", "no-section", "include-outside-main"],
)
def test_lines_outside_their_section_are_ignored(lines):
    assert so.tuned_setting(lines, ["x"]) is None


def test_active_must_be_a_list_of_names():
    with pytest.raises(GpunumaError, match="active tuned profiles: 'cpu-partitioning' is not a list of names"):
        so.tuned_setting(TUNED, "cpu-partitioning")


def test_tuned_conflict_sentence_names_the_chain():
    setting = so.tuned_setting(TUNED, ["cpu-partitioning"])
    assert so.tuned_conflict(setting, 1) == (
        "tuned profile cpu-partitioning (through network-latency) sets kernel.numa_balancing=0 and applies it again "
        "whenever tuned starts; set it in a custom tuned profile, or switch profiles"
    )
    direct = so.tuned_setting(TUNED, ["network-latency"])
    assert so.tuned_conflict(direct, "1").startswith("tuned profile network-latency sets kernel.numa_balancing=0 ")


@pytest.mark.parametrize(
    "setting, wanted",
    [
        (None, 1),
        ({"value": "0", "profile": "p", "chain": ["p"]}, 0),
        ({"value": "0", "profile": "p", "chain": ["p"]}, "0"),
    ],
)
def test_no_tuned_conflict(setting, wanted):
    assert so.tuned_conflict(setting, wanted) is None


def test_tuned_conflict_needs_a_setting():
    with pytest.raises(GpunumaError, match="tuned setting: .* is not a tuned_setting"):
        so.tuned_conflict({"value": "0"}, 1)
