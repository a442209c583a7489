import pytest

from ansible.module_utils.gpunuma.common import cpulist
from ansible.module_utils.gpunuma.common.errors import CpuListError

pytestmark = pytest.mark.unit


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


def test_affinity_words_read_lowest_cpu_first():
    # CPUs 0-47 and 96-143 as NVML hands them: 64-bit words, word 0 holding CPUs 0-63.
    words = [(1 << 48) - 1, ((1 << 32) - 1) << 32, (1 << 16) - 1]
    assert cpulist.cpus_from_affinity_words(words) == frozenset(range(0, 48)) | frozenset(range(96, 144))


def test_affinity_words_reject_overflow():
    with pytest.raises(CpuListError):
        cpulist.cpus_from_affinity_words([1 << 64])


# --- caps: ids, lengths and masks beyond any Linux kernel fail fast, naming the input


@pytest.mark.parametrize(
    "bad, says",
    [
        ("0-1048575", "CPU id '1048575' is out of range; allowed: CPU ids 0-8191"),
        ("8192", "allowed: CPU ids 0-8191"),
        ("9" * 5000, "(5000 characters) is out of range"),
        ("0-3\u0663", "is not a CPU id or range"),  # a non-ASCII digit
        ("0," * 40000 + "1", "is too long (80001 characters); allowed: at most 65536"),
    ],
)
def test_parse_cpulist_caps_ids_and_length(bad, says):
    with pytest.raises(CpuListError) as err:
        cpulist.parse_cpulist(bad, what="node0/cpulist")
    message = str(err.value)
    assert message.startswith("node0/cpulist ") and says in message
    assert len(message) < 400  # the input is shown shortened, never whole


def test_parse_cpulist_largest_kernel_list_is_fast():
    import time

    start = time.monotonic()
    assert cpulist.parse_cpulist(",".join(["0-8191"] * 9000)) == frozenset(range(8192))
    assert cpulist.parse_cpulist("0-8191:1") == frozenset(range(8192))
    assert cpulist.parse_cpulist("0-8191:99999999999999999999") == frozenset([0])
    assert time.monotonic() - start < 2


def test_parse_nodelist_caps_node_ids():
    assert cpulist.parse_nodelist("0-1,1023") == frozenset([0, 1, 1023])
    with pytest.raises(CpuListError) as err:
        cpulist.parse_nodelist("1024", what="NUMA Affinity")
    assert "NUMA node id '1024' is out of range; allowed: NUMA node ids 0-1023" in str(err.value)


@pytest.mark.parametrize(
    "bad, says",
    [
        ("f" * 400000, "is too long (400000 characters); allowed: at most 2048 hex digits"),
        ("1" + "0" * 2048, "has 2049 hex digits; allowed: at most 2048"),
        ("ff,1", "is not a hexadecimal mask"),  # a short word after the first is misaligned
        ("0000ffff,", "is not a hexadecimal mask"),
        ("f_f", "is not a hexadecimal mask"),
        ("\u0661\u0662", "is not a hexadecimal mask"),
    ],
)
def test_parse_cpumask_caps(bad, says):
    import time

    start = time.monotonic()
    with pytest.raises(CpuListError) as err:
        cpulist.parse_cpumask(bad, what="/sys/bus/pci/devices/0000:18:00.0/local_cpus")
    assert time.monotonic() - start < 0.5
    message = str(err.value)
    assert message.startswith("/sys/bus/pci/devices/0000:18:00.0/local_cpus ") and says in message
    assert len(message) < 400


def test_parse_cpumask_accepts_the_kernel_spellings():
    assert cpulist.parse_cpumask("f" * 2048) == frozenset(range(8192))
    assert cpulist.parse_cpumask("ff,00000000") == frozenset(range(32, 40))
    assert cpulist.parse_cpumask("0xff") == frozenset(range(8))


@pytest.mark.parametrize(
    "words, bits, says",
    [
        ([1], -1, "word size -1 is not allowed; allowed: 32 or 64"),
        ([1], True, "word size True is not allowed"),
        ([0] * 128 + [1], 64, "sets CPU 8192; allowed: CPU ids 0-8191"),
        (["1"], 64, "word 0 ('1') is not an integer"),
        ({"a": 1}, 64, "must be a list of integers, got dict"),
    ],
)
def test_affinity_words_reject_what_nvml_cannot_give(words, bits, says):
    with pytest.raises(CpuListError) as err:
        cpulist.cpus_from_affinity_words(words, bits)
    assert says in str(err.value)
