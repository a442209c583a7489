import pytest

from ansible.module_utils.gpunuma import cpulist
from ansible.module_utils.gpunuma.errors import CpuListError


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0-3,8", {0, 1, 2, 3, 8}),
        ("0,2,4", {0, 2, 4}),
        ("  5 ", {5}),
        ("", set()),
        ("\n", set()),
        ("0-6:2", {0, 2, 4, 6}),
        ("3,1,2,1", {1, 2, 3}),
    ],
)
def test_parse_cpulist(text, expected):
    assert cpulist.parse_cpulist(text) == frozenset(expected)


@pytest.mark.parametrize(
    "cpus, expected",
    [
        ([0, 1, 2, 3, 8], "0-3,8"),
        ([0, 2, 4], "0,2,4"),
        ([4, 3, 3, 2], "2-4"),
        ([], ""),
        ([0, 1], "0-1"),
        (list(range(0, 48)) + list(range(96, 144)), "0-47,96-143"),
    ],
)
def test_format_cpulist(cpus, expected):
    assert cpulist.format_cpulist(cpus) == expected


@pytest.mark.parametrize("bad", ["a-b", "3-1", "1,,2", "0-", "-1", "1.5"])
def test_parse_cpulist_rejects_garbage_naming_the_input(bad):
    with pytest.raises(CpuListError) as err:
        cpulist.parse_cpulist(bad, what="node0/cpulist")
    assert "node0/cpulist" in str(err.value)


@pytest.mark.parametrize(
    "mask, expected",
    [
        ("0000ffff", set(range(16))),
        ("00000001,00000000", {32}),
        ("ff000000,00000000,000000ff", set(range(8)) | set(range(88, 96))),
        ("00000000", set()),
    ],
)
def test_parse_cpumask(mask, expected):
    assert cpulist.parse_cpumask(mask) == frozenset(expected)


def test_parse_cpumask_rejects_non_hex():
    with pytest.raises(CpuListError):
        cpulist.parse_cpumask("zz,00")


def test_affinity_words_round_trip():
    cpus = set(range(0, 48)) | set(range(96, 144))
    words = cpulist.affinity_words_from_cpus(cpus)
    assert len(words) == 3
    assert words[0] == (1 << 48) - 1
    assert cpulist.cpus_from_affinity_words(words) == frozenset(cpus)


def test_affinity_words_reject_overflow():
    with pytest.raises(CpuListError):
        cpulist.cpus_from_affinity_words([1 << 64])
