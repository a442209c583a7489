"""limits: /proc/<pid>/limits, PID 1's capabilities, and the memlock ceiling systemd cannot pass."""

import os

import pytest

from ansible.module_utils.gpunuma.node import limits
from ansible.module_utils.gpunuma.common.errors import GpunumaError, SysfsError
from conftest import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.unit

DOCKER_PID1 = os.path.join(FIXTURES, "captured", "docker-systemd-pid1")
MIB = 1 << 20


def _read(name):
    with open(os.path.join(DOCKER_PID1, name)) as handle:
        return handle.read()


def _limits_text(soft, hard):
    return (
        "Limit                     Soft Limit           Hard Limit           Units     \n"
        "Max stack size            8388608              unlimited            bytes     \n"
        "Max locked memory         %-20s %-20s bytes     \n"
        "Max nice priority         0                    0                    \n" % (soft, hard)
    )


def _status(cap_eff):
    return "Name:\tsystemd\nCapInh:\t0000000000000000\nCapEff:\t%016x\nCapBnd:\t000001ffffffffff\n" % cap_eff


ALL_CAPS = (1 << 41) - 1
NO_SYS_RESOURCE = ALL_CAPS & ~(1 << limits.CAP_SYS_RESOURCE)
INIT_NS = "         0          0 4294967295\n"
USER_NS = "         0     100000      65536\n"


# ------------------------------------------------------------ /proc/<pid>/limits


def test_captured_docker_pid1_limits():
    parsed = limits.parse_proc_limits(_read("limits"))
    assert parsed["Max locked memory"] == {"soft": 8 * MIB, "hard": 8 * MIB, "units": "bytes"}
    assert parsed["Max stack size"] == {"soft": 8 * MIB, "hard": None, "units": "bytes"}
    assert parsed["Max nice priority"] == {"soft": 0, "hard": 0, "units": None}
    assert len(parsed) == 16


def test_hard_limit_reads_the_hard_column():
    assert limits.hard_limit(_limits_text(65536, 8 * MIB)) == 8 * MIB
    assert limits.hard_limit(_limits_text(65536, "unlimited")) is None
    assert limits.hard_limit(_limits_text("unlimited", "unlimited"), "Max stack size") is None


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "no 'Limit  Soft Limit  Hard Limit  Units' header"),
        ("Max locked memory  8388608  8388608  bytes\n", "no 'Limit  Soft Limit"),
        (_limits_text("lots", 8 * MIB), "'Max locked memory' has 'lots' as a limit; allowed: a number or unlimited"),
        (_limits_text(1, 2) + "garbage\n", "cannot read the line 'garbage'"),
        (None, "None is not text"),
    ],
)
def test_malformed_limits_name_the_file(text, message):
    with pytest.raises(SysfsError, match="/proc/1/limits: .*" + message.replace("(", r"\(")):
        limits.parse_proc_limits(text, "/proc/1/limits")


def test_missing_memlock_line_is_an_error():
    text = _limits_text(1, 2).replace("Max locked memory", "Max resident set")
    with pytest.raises(SysfsError, match="has no 'Max locked memory' line"):
        limits.hard_limit(text)


# ------------------------------------------------------------ status, uid_map


def test_capabilities_of_captured_docker_pid1_lack_sys_resource():
    caps = limits.parse_capabilities(_read("status"))
    assert caps["CapEff"] == 0xA8A425FB
    assert not caps["CapEff"] & (1 << limits.CAP_SYS_RESOURCE)
    assert set(caps) == {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}


@pytest.mark.parametrize(
    "text, message", [("Name:\tx\n", "has no CapEff line"), ("CapEff:\tzz\n", "cannot read the line")]
)
def test_malformed_status(text, message):
    with pytest.raises(SysfsError, match=message):
        limits.parse_capabilities(text)


@pytest.mark.parametrize(
    "text, initial",
    [
        (INIT_NS, True),
        (None, True),
        (USER_NS, False),
        ("0 0 1000\n1000 1000 4294966295\n", False),
        ("1000 1000 1\n", False),
    ],
)
def test_initial_user_namespace(text, initial):
    assert limits.in_initial_user_namespace(text) is initial


def test_malformed_uid_map():
    with pytest.raises(SysfsError, match="uid_map: cannot read the line 'x y z'"):
        limits.in_initial_user_namespace("x y z\n")


# ----------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    "value, expected",
    [
        ("unlimited", None),
        ("infinity", None),
        ("Infinity", None),
        ("64G", 64 << 30),
        ("512M", 512 * MIB),
        ("8k", 8192),
        (1048576, 1048576),
        ("4194304", 4 * MIB),
        ("1T", 1 << 40),
    ],
)
def test_parse_limit(value, expected):
    assert limits.parse_limit(value) == expected


@pytest.mark.parametrize("value", ["lots", "64 G X", -1, None, True, "-1"])
def test_parse_limit_refuses_garbage_naming_the_variable(value):
    with pytest.raises(GpunumaError, match="memlock_limit: .* is not a limit; allowed: unlimited, infinity, bytes"):
        limits.parse_limit(value)


@pytest.mark.parametrize(
    "value, expected", [("64G", 64 << 30), ("unlimited", "infinity"), ("infinity", "infinity"), ("8k", 8192)]
)
def test_systemd_limit(value, expected):
    assert limits.systemd_limit(value) == expected


@pytest.mark.parametrize(
    "count, text",
    [
        (None, "unlimited"),
        (8 * MIB, "8 MiB"),
        (64 << 30, "64 GiB"),
        (1536 * MIB, "1.5 GiB"),
        (8192, "8 KiB"),
        (1000, "1000 bytes"),
        (0, "0 bytes"),
        (1 << 40, "1 TiB"),
    ],
)
def test_format_limit(count, text):
    assert limits.format_limit(count) == text


# ------------------------------------------------------------- the ceiling


def test_captured_docker_pid1_has_an_8_mib_ceiling():
    ceiling = limits.memlock_ceiling(_read("limits"), _read("status"), _read("uid_map"))
    assert ceiling["hard"] == 8 * MIB
    assert ceiling["can_raise"] is False
    assert ceiling["ceiling"] == 8 * MIB
    assert ceiling["reason"] == "PID 1's hard memlock limit is 8 MiB and PID 1 lacks CAP_SYS_RESOURCE"


@pytest.mark.parametrize(
    "hard, caps, uid_map, can_raise, ceiling, reason",
    [
        (
            8 * MIB,
            ALL_CAPS,
            INIT_NS,
            True,
            None,
            "PID 1 holds CAP_SYS_RESOURCE and may raise its hard memlock limit (8 MiB)",
        ),
        (8 * MIB, ALL_CAPS, None, True, None, "PID 1 holds CAP_SYS_RESOURCE"),
        (
            8 * MIB,
            ALL_CAPS,
            USER_NS,
            False,
            8 * MIB,
            "runs in a user namespace, where CAP_SYS_RESOURCE cannot raise it",
        ),
        (8 * MIB, NO_SYS_RESOURCE, INIT_NS, False, 8 * MIB, "lacks CAP_SYS_RESOURCE"),
        ("unlimited", NO_SYS_RESOURCE, INIT_NS, False, None, "PID 1's hard memlock limit is unlimited"),
    ],
)
def test_ceiling(hard, caps, uid_map, can_raise, ceiling, reason):
    result = limits.memlock_ceiling(_limits_text(65536, hard), _status(caps), uid_map)
    assert result["ceiling"] == ceiling
    assert result["can_raise"] is can_raise
    assert result["hard"] == (None if hard == "unlimited" else hard)
    assert reason in result["reason"]


def test_ceiling_errors_name_pid1_files():
    with pytest.raises(SysfsError, match="^/proc/1/status: has no CapEff line"):
        limits.memlock_ceiling(_limits_text(1, 2), "Name:\tsystemd\n")
    with pytest.raises(SysfsError, match="^/proc/1/limits: "):
        limits.memlock_ceiling("", _status(ALL_CAPS))


# ------------------------------------------------------------- the clamp


CLAMPING = {"hard": 8 * MIB, "can_raise": False, "ceiling": 8 * MIB, "reason": "PID 1's hard memlock limit is 8 MiB"}
NO_CEILING = {"hard": 8 * MIB, "can_raise": True, "ceiling": None, "reason": "PID 1 holds CAP_SYS_RESOURCE"}


@pytest.mark.parametrize(
    "wanted, ceiling, effective, clamped, systemd",
    [
        ("64M", CLAMPING, 8 * MIB, True, 8 * MIB),
        ("unlimited", CLAMPING, 8 * MIB, True, 8 * MIB),
        ("infinity", CLAMPING, 8 * MIB, True, 8 * MIB),
        ("8M", CLAMPING, 8 * MIB, False, 8 * MIB),
        ("4M", CLAMPING, 4 * MIB, False, 4 * MIB),
        (8 * MIB + 1024, CLAMPING, 8 * MIB, True, 8 * MIB),
        ("64G", NO_CEILING, 64 << 30, False, 64 << 30),
        ("unlimited", NO_CEILING, None, False, "infinity"),
    ],
)
def test_clamp(wanted, ceiling, effective, clamped, systemd):
    result = limits.memlock_clamp(wanted, ceiling)
    assert result["effective"] == effective
    assert result["clamped"] is clamped
    assert result["effective_systemd"] == systemd
    assert result["ceiling"] == ceiling["ceiling"]
    assert result["wanted"] == limits.parse_limit(wanted)


def test_clamp_refuses_bad_input():
    with pytest.raises(GpunumaError, match="memlock_limit: 'lots' is not a limit"):
        limits.memlock_clamp("lots", CLAMPING)
    with pytest.raises(GpunumaError, match="memlock ceiling: .* is not a memlock_ceiling"):
        limits.memlock_clamp("64M", 8 * MIB)


def test_clamp_message_gives_numbers_reason_and_fix():
    message = limits.clamp_message(limits.memlock_clamp("64M", CLAMPING), CLAMPING)
    assert message.startswith(
        "memlock_limit asks for 64 MiB of locked memory but systemd units on this node get 8 MiB: "
        "PID 1's hard memlock limit is 8 MiB, so systemd lowers every LimitMEMLOCK= above it"
    )
    assert "`docker run --ulimit memlock=-1`" in message
    assert "LimitMEMLOCK=infinity in containerd.service on the host" in message
    assert message.endswith("Or lower memlock_limit to 8 MiB.")


def test_no_message_when_not_clamped():
    assert limits.clamp_message(limits.memlock_clamp("4M", CLAMPING), CLAMPING) is None
    assert limits.clamp_message(limits.memlock_clamp("unlimited", NO_CEILING), NO_CEILING) is None


def test_clamp_message_needs_results():
    with pytest.raises(GpunumaError, match="memlock clamp: .* lacks wanted, effective, clamped"):
        limits.clamp_message({"clamped": True}, CLAMPING)
    with pytest.raises(GpunumaError, match="memlock ceiling: .* lacks reason"):
        limits.clamp_message(limits.memlock_clamp("64M", CLAMPING), {})


# ------------------------------------------------ one size grammar, ranges


@pytest.mark.parametrize("value, expected", [("64GiB", 64 << 30), ("1.5G", 3 << 29), ("64gb", 64 << 30), ("1.1G", 1181116006)])
def test_parse_limit_reads_sizes_like_the_planner(value, expected):
    from ansible.module_utils.gpunuma.common import sizes

    assert limits.parse_limit(value) == expected == sizes.parse_size(value)


@pytest.mark.parametrize(
    "value, expected",
    [
        (0, "memlock_limit: 0 locks no memory, so pinned host memory"),
        ("0", "memlock_limit: '0' locks no memory"),
        ("0K", "memlock_limit: '0K' locks no memory"),
        ("99999999999E", "memlock_limit: '99999999999E' is more than any limit the kernel or systemd holds; allowed: 1 to"),
        (1 << 63, "memlock_limit: 9223372036854775808 is more than any limit"),
        ("1.5", "memlock_limit: '1.5' is not a limit; allowed: unlimited, infinity"),
        ("64G\n", "memlock_limit: '64G\\n' is not a limit"),
        ("9" * 5000, "memlock_limit: '999"),
    ],
)
def test_parse_limit_refuses_what_cannot_be_meant(value, expected):
    with pytest.raises(GpunumaError) as info:
        limits.parse_limit(value)
    assert str(info.value).startswith(expected)
    assert "allowed: " in str(info.value)


def test_limits_does_not_import_the_planner():
    import subprocess
    import sys

    code = (
        "import ansible.module_utils, sys; ansible.module_utils.__path__.append(%r); "
        "import ansible.module_utils.gpunuma.node.limits; "
        "print(any(m.startswith('ansible.module_utils.gpunuma.plan') for m in sys.modules))" % os.path.join(REPO_ROOT, "module_utils")
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_role_plan_without_a_readable_pid1_says_so_and_keeps_the_limit():
    from ansible.module_utils.gpunuma.node import limits as limitslib
    out = limitslib.role_plan("64M", {"limits": "bm90IGEgbGltaXRzIGZpbGU="}, "/proc/1", "fail", "h1")
    assert (out["systemd_limit"], out["effective_limit"], out["problem"]) == (67108864, 67108864, None)
    assert out["notes"][0].startswith("/proc/1/limits or /status could not be read")
