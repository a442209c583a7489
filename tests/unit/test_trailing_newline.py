"""Every anchored check of a value gpunuma writes into a unit, a path or a name refuses a trailing newline.

Python's ``$`` also matches before a final ``\\n``: ``re.match(r"^/[a-z]*$", "/x\\n")`` passes. A path or name
that passes with its newline breaks the line it is written into (ExecStart=, ExecStartPre=, a drop-in) or
silently disables what it configures. The checks anchor with ``\\Z``.
"""

import pytest

from ansible.module_utils.gpunuma.common import secrets
from ansible.module_utils.gpunuma.kubelet import guard, values
from ansible.module_utils.gpunuma.node import accounts, housekeeping
from ansible.module_utils.gpunuma.verify import metrics
from ansible.module_utils.gpunuma.plan import profiles

pytestmark = pytest.mark.unit

CHECKS = [
    ("kubelet guard path", guard._SAFE_PATH, "/var/lib/kubelet"),
    ("kubelet service", guard._UNIT, "kubelet.service"),
    ("account name", accounts.NAME_RE, "gpunuma"),
    ("PCI address", housekeeping.BDF_RE, "0000:17:00.0"),
    ("slice", housekeeping.SLICE_RE, "system.slice"),
    ("metrics unit", metrics._UNIT_NAME, "gpunuma-a.service"),
    ("kubelet version", values._VERSION_RE, "v1.34.1"),
    ("hugepages resource", values.HUGEPAGES_RE, "hugepages-2Mi"),
    ("profile name", profiles._NAME_RE, "strict"),
    ("variable name", secrets._NAME, "HF_TOKEN"),
]


@pytest.mark.parametrize("what, pattern, good", CHECKS, ids=[c[0] for c in CHECKS])
def test_an_anchored_check_passes_the_value_and_refuses_it_with_a_trailing_newline(what, pattern, good):
    assert pattern.match(good), what
    for bad in (good + "\n", good + "\r\n", good + "\nExecStartPre=/bin/sh"):
        assert not pattern.match(bad), (what, bad)


def test_the_kubelet_guard_settings_refuse_a_path_with_a_trailing_newline():
    problems = guard.input_problems("/usr/bin/python3", "/usr/local/libexec/gpunuma", "/etc/systemd/system",
                                    "kubelet.service", "/var/lib/kubelet\n", "/var/lib/gpunuma/kubelet-backup\n", 0)
    assert [p.split(" is ")[0] for p in problems] == ["kubelet_topology_state_dir", "kubelet_topology_backup_dir"]


def test_secret_patterns_refuse_a_trailing_newline():
    assert secrets.pattern_problems(["*TOKEN*\n"]) and not secrets.pattern_problems(["*TOKEN*"])
