"""`nvidia-smi topo -m` parser: published and public outputs, quirks, bad input."""

import collections
import glob
import json
import os
import random
import re

import pytest

from ansible.module_utils.gpunuma.common.errors import GpunumaError, TopoParseError
from ansible.module_utils.gpunuma.discovery.nvidia.topo_parse import parse_topo_matrix

pytestmark = pytest.mark.unit

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
PUBLISHED = os.path.join(FIXTURES, "published")
TOPO = os.path.join(FIXTURES, "topo")
FIELDS = ("gpus", "nics", "gpu_links", "gpu_nic_links")

PUBLISHED_NAMES = sorted(
    os.path.basename(p)[: -len(".topo.txt")] for p in glob.glob(os.path.join(PUBLISHED, "*.topo.txt"))
)
TOPO_NAMES = sorted(
    os.path.basename(p)[: -len(".topo.txt")] for p in glob.glob(os.path.join(TOPO, "*.topo.txt"))
)
ALL_FIXTURES = [os.path.join(PUBLISHED, n + ".topo.txt") for n in PUBLISHED_NAMES] + [
    os.path.join(TOPO, n + ".topo.txt") for n in TOPO_NAMES
]

LEGEND = (
    "\nLegend:\n\n  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n"
)


def read(path):
    with open(path, "r", encoding="utf-8", newline="") as handle:
        return handle.read()


def data(result):
    return dict((k, result[k]) for k in FIELDS)


def matrix(rows, header):
    """A tab-separated topo -m text (as nvidia-smi prints it) from rows of cells."""
    return "\t" + "\t".join(header) + "\n" + "".join("\t".join(r) + "\n" for r in rows) + LEGEND


def gpu(index, cpu, numa=(), gpu_numa_id=None):
    return {"index": index, "cpu_affinity": cpu, "numa_affinity": list(numa), "gpu_numa_id": gpu_numa_id}


def square(codes_by_pair, n):
    """GPU x GPU matrix with X on the diagonal and codes_by_pair(i, j) elsewhere."""
    return [["X" if i == j else codes_by_pair(i, j) for j in range(n)] for i in range(n)]


# --------------------------------------------------------------------------
# published fixtures: every field of expected/*.json


def test_published_fixtures_are_present():
    assert len(PUBLISHED_NAMES) >= 5
    for name in PUBLISHED_NAMES:
        assert os.path.exists(os.path.join(PUBLISHED, "expected", name + ".json")), name


@pytest.mark.parametrize("name", PUBLISHED_NAMES)
def test_published_fixture_matches_expected(name):
    expected = json.loads(read(os.path.join(PUBLISHED, "expected", name + ".json")))
    result = parse_topo_matrix(read(os.path.join(PUBLISHED, name + ".topo.txt")), name)
    for field in FIELDS:
        assert result[field] == expected[field], field
    assert isinstance(result["warnings"], list)
    assert len(result["gpu_links"]) == len(result["gpus"])
    assert all(len(row) == len(result["nics"]) for row in result["gpu_nic_links"])


# --------------------------------------------------------------------------
# public outputs from other machines and drivers (tests/fixtures/topo)

TOPO_EXPECTED = {
    "dgx1-p100-soc-glued-header": {
        "gpus": [gpu(i, "1") for i in range(8)],
        "nics": ["mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"],
        "gpu_links": [
            ["X", "NV1", "NV1", "NV1", "NV1", "SYS", "SYS", "SYS"],
            ["NV1", "X", "NV1", "NV1", "SYS", "NV1", "SYS", "SYS"],
            ["NV1", "NV1", "X", "NV1", "SYS", "SYS", "NV1", "SYS"],
            ["NV1", "NV1", "NV1", "X", "SYS", "SYS", "SYS", "NV1"],
            ["NV1", "SYS", "SYS", "SYS", "X", "NV1", "NV1", "NV1"],
            ["SYS", "NV1", "SYS", "SYS", "NV1", "X", "NV1", "NV1"],
            ["SYS", "SYS", "NV1", "SYS", "NV1", "NV1", "X", "NV1"],
            ["SYS", "SYS", "SYS", "NV1", "NV1", "NV1", "NV1", "X"],
        ],
        "gpu_nic_links": [["PIX", "SYS", "PHB", "SYS"]] * 2
        + [["PHB", "SYS", "PIX", "SYS"]] * 2
        + [["SYS", "PIX", "SYS", "PHB"]] * 2
        + [["SYS", "PHB", "SYS", "PIX"]] * 2,
        "warnings": ["header titles were glued", "SOC read as SYS"],
    },
    "rtx4090-8gpu-2nic-no-legend": {
        "gpus": [gpu(i, "0-55,112-167", [0]) for i in range(4)]
        + [gpu(i, "56-111,168-223", [1]) for i in range(4, 8)],
        "nics": ["NIC0", "NIC1"],
        "gpu_links": square(lambda i, j: "SYS", 8),
        "gpu_nic_links": [["SYS", "SYS"]] * 6 + [["PHB", "PHB"], ["SYS", "SYS"]],
        "warnings": ["NIC Legend missing: NIC0, NIC1"],
    },
    "tesla-p4-1gpu-numa-na": {
        "gpus": [gpu(0, "0-7")],
        "nics": [],
        "gpu_links": [["X"]],
        "gpu_nic_links": [[]],
        "warnings": [],
    },
    "p100-2gpu-soc-comment": {
        "gpus": [gpu(0, "0-5"), gpu(1, "6-11")],
        "nics": [],
        "gpu_links": [["X", "SYS"], ["SYS", "X"]],
        "gpu_nic_links": [[], []],
        "warnings": ["SOC read as SYS"],
    },
    "2gpu-node-indented-p2p": {
        "gpus": [gpu(0, "0-15", [0]), gpu(1, "0-15", [0])],
        "nics": [],
        "gpu_links": [["X", "NODE"], ["NODE", "X"]],
        "gpu_nic_links": [[], []],
        "warnings": [],
    },
    "5gpu-split-numa-spaces": {
        "gpus": [gpu(0, "8-15,24-31", [1])] + [gpu(i, "0-7,16-23", [0]) for i in range(1, 5)],
        "nics": [],
        "gpu_links": [
            ["X", "SYS", "SYS", "SYS", "SYS"],
            ["SYS", "X", "PHB", "NODE", "NODE"],
            ["SYS", "PHB", "X", "NODE", "NODE"],
            ["SYS", "NODE", "NODE", "X", "PHB"],
            ["SYS", "NODE", "NODE", "PHB", "X"],
        ],
        "gpu_nic_links": [[]] * 5,
        "warnings": [],
    },
    "h100-8gpu-nv18-spaces": {
        "gpus": [gpu(i, "0-47,96-143", [0]) for i in range(4)]
        + [gpu(i, "48-95,144-191", [1]) for i in range(4, 8)],
        "nics": [],
        "gpu_links": square(lambda i, j: "NV18", 8),
        "gpu_nic_links": [[]] * 8,
        "warnings": [],
    },
    "h200-1gpu-vm-ansi": {
        "gpus": [gpu(0, "0-15", [0])],
        "nics": [],
        "gpu_links": [["X"]],
        "gpu_nic_links": [[]],
        "warnings": [],
    },
}


def test_every_topo_fixture_has_expectations():
    assert sorted(TOPO_EXPECTED) == TOPO_NAMES


@pytest.mark.parametrize("name", sorted(TOPO_EXPECTED))
def test_public_output_fixture(name):
    path = os.path.join(TOPO, name + ".topo.txt")
    text = read(path)
    if name != "h200-1gpu-vm-ansi":
        assert text.startswith("# source: http"), "public fixtures name their source"
    expected = TOPO_EXPECTED[name]
    result = parse_topo_matrix(text, name)
    for field in FIELDS:
        assert result[field] == expected[field], field
    assert len(result["warnings"]) == len(expected["warnings"]), result["warnings"]
    for fragment, warning in zip(expected["warnings"], result["warnings"]):
        assert fragment in warning


def test_captured_output_keeps_its_ansi_header():
    text = read(os.path.join(TOPO, "h200-1gpu-vm-ansi.topo.txt"))
    assert "\x1b[4mGPU0" in text and text.startswith("$ nvidia-smi topo -m")


# --------------------------------------------------------------------------
# stability across the ways a text gets mangled


def tabs_to_spaces(text):
    return text.expandtabs(8)


def spaces_to_tabs(text):
    return re.sub(r" {2,}", "\t", text)


def single_spaces(text):
    return re.sub(r"[ \t]+", " ", text)


def crlf(text):
    return text.replace("\r\n", "\n").replace("\n", "\r\n")


def trailing_blanks(text):
    return text.replace("\n", "   \t\n")


@pytest.mark.parametrize("transform", [tabs_to_spaces, spaces_to_tabs, single_spaces, crlf, trailing_blanks])
@pytest.mark.parametrize("path", ALL_FIXTURES, ids=os.path.basename)
def test_parse_is_stable_under_whitespace_changes(path, transform):
    text = read(path)
    # every fixture has tabs or runs of spaces, so one of the two conversions rewrites it
    assert tabs_to_spaces(text) != text or spaces_to_tabs(text) != text
    assert data(parse_topo_matrix(transform(text))) == data(parse_topo_matrix(text))


# --------------------------------------------------------------------------
# quirks, small hand-written inputs


def test_header_with_ansi_codes_with_and_without_escape_character():
    body = "GPU0\t X \tNV4\t0-7\t0\t\tN/A\nGPU1\tNV4\t X \t8-15\t1\t\tN/A\n"
    header = "GPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    plain = parse_topo_matrix("\t" + header + "\n" + body)
    with_esc = parse_topo_matrix("\t\x1b[4m" + header + "\x1b[0m\n" + body)
    lost_esc = parse_topo_matrix("\t[4m" + header + "[0m\n" + body)
    assert data(plain) == data(with_esc) == data(lost_esc)
    assert plain["gpus"] == [gpu(0, "0-7", [0]), gpu(1, "8-15", [1])]
    assert plain["gpu_links"] == [["X", "NV4"], ["NV4", "X"]]


def test_windows_line_endings_and_byte_order_mark():
    text = "\ufeff\tGPU0\tGPU1\tCPU Affinity\r\nGPU0\t X \tPIX\t0-11\r\nGPU1\tPIX\t X \t0-11\r\n"
    result = parse_topo_matrix(text)
    assert result["gpus"] == [gpu(0, "0-11"), gpu(1, "0-11")]
    assert result["gpu_links"] == [["X", "PIX"], ["PIX", "X"]]


def test_nic_legend_resolves_non_contiguous_names():
    rows = [
        ["GPU0", " X ", "NODE", "SYS", "0-31", "0", "", "N/A"],
        ["NIC0", "NODE", " X ", "SYS"],
        ["NIC1", "SYS", "SYS", " X "],
    ]
    text = matrix(rows, ["GPU0", "NIC0", "NIC1", "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])
    text += "\nNIC Legend:\n\n  NIC0: mlx5_2\n  NIC1: bnxt_re7\n"
    result = parse_topo_matrix(text)
    assert result["nics"] == ["mlx5_2", "bnxt_re7"]
    assert result["gpu_nic_links"] == [["NODE", "SYS"]]
    assert result["warnings"] == []


def test_incomplete_nic_legend_keeps_the_matrix_name_and_warns():
    rows = [["GPU0", "X", "PIX", "PIX", "0-7"], ["NIC0", "PIX", "X", "PIX"], ["NIC1", "PIX", "PIX", "X"]]
    text = matrix(rows, ["GPU0", "NIC0", "NIC1", "CPU Affinity"]) + "\nNIC Legend:\n\n  NIC0: mlx5_0\n"
    result = parse_topo_matrix(text)
    assert result["nics"] == ["mlx5_0", "NIC1"]
    assert any("NIC Legend incomplete" in w and "NIC1" in w for w in result["warnings"])


def test_device_named_nic_columns_and_rows_with_trailing_affinity_cells():
    # mlx4_0-era output; some drivers print empty or N/A affinity cells on NIC rows
    text = (
        "        GPU0    GPU1    mlx4_0  CPU Affinity    NUMA Affinity\n"
        "GPU0     X      SOC     PHB     0-9,20-29       0\n"
        "GPU1    SOC      X      SOC     10-19,30-39     1\n"
        "mlx4_0  PHB     SOC      X      N/A             N/A\n"
    )
    result = parse_topo_matrix(text)
    assert result["nics"] == ["mlx4_0"]
    assert result["gpu_links"] == [["X", "SYS"], ["SYS", "X"]]
    assert result["gpu_nic_links"] == [["PHB"], ["SYS"]]
    assert result["gpus"] == [gpu(0, "0-9,20-29", [0]), gpu(1, "10-19,30-39", [1])]


def test_dgx2_sixteen_gpus_nvswitch_and_ten_named_nics():
    n = 16
    nics = ["mlx5_%d" % i for i in range(10)]

    def nic_code(g, k):
        if k >= 8:
            return "SYS" if g < 8 else "NODE"
        pair = g // 2
        if pair == k:
            return "PIX"
        if pair // 2 == k // 2:
            return "PXB"
        return "NODE" if (pair < 4) == (k < 4) else "SYS"

    lines = [
        "        " + "".join("%-8s" % h for h in ["GPU%d" % i for i in range(n)] + nics) + "CPU Affinity"
    ]
    for g in range(n):
        cells = ["X" if g == j else "NV6" for j in range(n)] + [nic_code(g, k) for k in range(10)]
        cpu = "0-23,48-71" if g < 8 else "24-47,72-95"
        lines.append("%-8s" % ("GPU%d" % g) + "".join("%-8s" % c for c in cells) + cpu)
    for k, name in enumerate(nics):
        cells = [nic_code(g, k) for g in range(n)] + ["X" if k == j else "SYS" for j in range(10)]
        lines.append("%-8s" % name + "".join("%-8s" % c for c in cells))
    result = parse_topo_matrix("\n".join(lines) + "\n" + LEGEND)
    assert [g["index"] for g in result["gpus"]] == list(range(16))
    assert result["gpus"][15] == gpu(15, "24-47,72-95")
    assert result["gpu_links"] == square(lambda i, j: "NV6", 16)
    assert result["nics"] == nics
    assert result["gpu_nic_links"] == [[nic_code(g, k) for k in range(10)] for g in range(n)]
    assert result["gpu_nic_links"][0] == ["PIX", "PXB", "NODE", "NODE"] + ["SYS"] * 6
    assert result["warnings"] == []


@pytest.mark.parametrize(
    "cpu, numa, gpu_numa_id, expected",
    [
        ("0-23,48-71", "0", "N/A", gpu(0, "0-23,48-71", [0])),
        ("0,2,4,6", "0-1", "N/A", gpu(0, "0,2,4,6", [0, 1])),
        ("0-3,4-7,16", "1,3", "N/A", gpu(0, "0-7,16", [1, 3])),
        ("0-71", "0", "1", gpu(0, "0-71", [0], 1)),
        ("N/A", "N/A", "N/A", gpu(0, None, [])),
        ("72-143", "1", "18", gpu(0, "72-143", [1], 18)),
    ],
)
def test_affinity_spellings(cpu, numa, gpu_numa_id, expected):
    text = matrix(
        [["GPU0", " X ", cpu, numa, "", gpu_numa_id]],
        ["GPU0", "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
    )
    assert parse_topo_matrix(text)["gpus"] == [expected]


def test_gh200_single_gpu_with_gpu_numa_id():
    text = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-71\t0\t\t1\n" + LEGEND
    assert parse_topo_matrix(text)["gpus"] == [gpu(0, "0-71", [0], 1)]


def test_old_driver_without_any_affinity_column():
    text = "\tGPU0\tGPU1\nGPU0\t X \tPHB\nGPU1\tPHB\t X \n"
    result = parse_topo_matrix(text)
    assert result["gpus"] == [gpu(0, None), gpu(1, None)]
    assert result["gpu_links"] == [["X", "PHB"], ["PHB", "X"]]


def test_x_cells_with_or_without_padding():
    padded = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t  X  \tSYS\t0-3\nGPU1\tSYS\t  X  \t4-7\n"
    bare = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\tX\tSYS\t0-3\nGPU1\tSYS\tX\t4-7\n"
    assert data(parse_topo_matrix(padded)) == data(parse_topo_matrix(bare))


def test_text_around_the_matrix_is_ignored():
    text = (
        "$ nvidia-smi -L\n"
        "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-7fdaf0a5-179b-f636-d15d-daf243e3ff16)\n"
        "  MIG 1g.10gb     Device  0: (UUID: MIG-feb88891-0321-5fef-9c87-d4af3b54259e)\n"
        "GPU Topology:\n"
        "GPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tNV12\t0-63\t0\t\tN/A\n"
        "GPU1\tNV12\t X \t0-63\t0\t\tN/A\n"
        "\nLegend:\n\n  X    = Self\n"
        "\nulimit soft: 1048576\n"
    )
    result = parse_topo_matrix(text)
    assert result["gpu_links"] == [["X", "NV12"], ["NV12", "X"]]
    assert result["warnings"] == []


def test_caption_on_the_header_line():
    text = "GPU Topology: GPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPHB\t0-7\nGPU1\tPHB\t X \t0-7\n"
    assert parse_topo_matrix(text)["gpus"] == [gpu(0, "0-7"), gpu(1, "0-7")]


def test_stray_line_inside_the_matrix_is_skipped_with_a_warning():
    text = (
        "\tGPU0\tGPU1\tCPU Affinity\n"
        "GPU0\t X \tNV2\t0-7\n"
        "  MIG 3g.40gb     Device  0: (UUID: MIG-36c795f2-5cf7-55d6-af30-e535e79b7bb6)\n"
        "GPU1\tNV2\t X \t0-7\n"
    )
    result = parse_topo_matrix(text, "paste.txt")
    assert result["gpu_links"] == [["X", "NV2"], ["NV2", "X"]]
    assert len(result["warnings"]) == 1 and "line 3 ignored" in result["warnings"][0]


def test_p2p_matrix_before_the_topology_is_skipped():
    p2p = " \tGPU0\tGPU1\t\n GPU0\tX\tGNS\t\n GPU1\tGNS\tX\t\n\nLegend:\n\n  X    = Self\n  OK   = Status Ok\n\n"
    topo = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPHB\t0-63\nGPU1\tPHB\t X \t0-63\n"
    result = parse_topo_matrix(p2p + topo, "report.txt")
    assert result["gpu_links"] == [["X", "PHB"], ["PHB", "X"]]
    assert any("topo -p2p" in w for w in result["warnings"])


def test_glued_header_titles_are_split_again():
    text = (
        "\tGPU0GPU1GPU2NIC0\tCPU AffinityNUMA Affinity\n"
        + "".join(
            "\t".join(r) + "\n"
            for r in [
                ["GPU0", "X", "NV2", "SYS", "PIX", "0-7", "0"],
                ["GPU1", "NV2", "X", "SYS", "PIX", "0-7", "0"],
                ["GPU2", "SYS", "SYS", "X", "SYS", "8-15", "1"],
                ["NIC0", "PIX", "PIX", "SYS", "X"],
            ]
        )
        + "\nNIC Legend:\n\n  NIC0: mlx5_0\n"
    )
    result = parse_topo_matrix(text)
    assert result["nics"] == ["mlx5_0"]
    assert result["gpus"][2] == gpu(2, "8-15", [1])
    assert result["gpu_nic_links"] == [["PIX"], ["PIX"], ["SYS"]]
    assert any("glued" in w for w in result["warnings"])


def test_glued_device_names_are_split_using_the_row_labels():
    text = (
        "\tGPU0\tmlx5_0mlx5_1\tCPU Affinity\n"
        "GPU0\t X \tPIX\tSYS\t0-7\n"
        "mlx5_0\tPIX\t X \tSYS\n"
        "mlx5_1\tSYS\tSYS\t X \n"
    )
    result = parse_topo_matrix(text)
    assert result["nics"] == ["mlx5_0", "mlx5_1"]
    assert result["gpu_nic_links"] == [["PIX", "SYS"]]
    assert any("row labels" in w for w in result["warnings"])


# --------------------------------------------------------------------------
# rows damaged in copying


def h100_text():
    return read(os.path.join(TOPO, "h100-8gpu-nv18-spaces.topo.txt"))


def hgx_text():
    return read(os.path.join(PUBLISHED, "hgx-h200-8gpu-10nic-tabs.topo.txt"))


@pytest.mark.parametrize(
    "source_text, old, new, row",
    [
        # two link codes glued
        (h100_text, "GPU0     X      NV18    NV18", "GPU0     X      NV18NV18", "GPU0"),
        # label glued to the X cell
        (h100_text, "GPU0     X      NV18", "GPU0X NV18", "GPU0"),
        # last link code glued to the CPU list: NV18|48-95 and NV184|8-95 both parse,
        # the mirror cell (row GPU7, column GPU6 = NV18) settles it
        (h100_text, "X      NV18    48-95,144-191", "X      NV1848-95,144-191", "GPU6"),
        # NIC link code glued to the CPU list, tabs kept
        (hgx_text, "SYS\t0-47,96-143", "SYS0-47,96-143", "GPU0"),
        # NUMA Affinity glued to GPU NUMA ID (the tab pair lost)
        (hgx_text, "\t48-95,144-191\t1\t\tN/A", "\t48-95,144-191\t1N/A", "GPU4"),
    ],
)
def test_glued_cells_are_repaired_when_unambiguous(source_text, old, new, row):
    text = source_text()
    damaged = text.replace(old, new, 1)
    assert damaged != text
    repaired = parse_topo_matrix(damaged, "paste.txt")
    assert data(repaired) == data(parse_topo_matrix(text))
    assert any(("row %s" % row) in w and "glued" in w for w in repaired["warnings"]), repaired["warnings"]


def test_glued_nvlink_count_settled_by_the_mirror_cell():
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV412-23\nGPU1\tNV4\t X \t12-23\n"
    result = parse_topo_matrix(text)
    assert result["gpu_links"] == [["X", "NV4"], ["NV4", "X"]]
    assert result["gpus"][0] == gpu(0, "12-23")


def test_glued_rows_settle_each_other():
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV412-23\nGPU1\tNV4\tX12-23\n"
    result = parse_topo_matrix(text)
    assert result["gpu_links"] == [["X", "NV4"], ["NV4", "X"]]
    assert result["gpus"] == [gpu(0, "12-23"), gpu(1, "12-23")]
    assert len([w for w in result["warnings"] if "glued" in w]) == 2


def test_glued_cells_that_fit_no_mirror_cell_are_refused():
    # NV4|12-23 and NV41|2-23 both parse; row GPU1 says the link is NV2
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV412-23\nGPU1\tNV2\t X \t12-23\n"
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix(text, "paste.txt")
    message = str(err.value)
    assert message.startswith("paste.txt: line 2: row GPU0: expected 2 link code(s)")
    assert "disagree with the matching cells of the other rows" in message


def test_two_glued_numbers_are_never_split():
    # 0-470 reads as 0-47|0 or 0-4|70, and the same text is also a CPU list with a lost cell
    text = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tSYS\t0-470\nGPU1\tSYS\t X \t48-95\t1\n"
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix(text, "paste.txt")
    message = str(err.value)
    assert "paste.txt: line 2: row GPU0" in message
    assert "2 link code(s)" in message and "CPU Affinity, NUMA Affinity" in message


def test_missing_affinity_value_is_an_error():
    text = h100_text().replace("0-47,96-143     0               N/A", "0-47,96-143     N/A", 1)
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix(text, "h100.txt")
    message = str(err.value)
    assert "h100.txt: line 6: row GPU0" in message
    assert "3 value(s) (CPU Affinity, NUMA Affinity, GPU NUMA ID)" in message
    assert "found 10 cell(s)" in message


ROW_START_RE = re.compile(r"\s*(GPU\d+|NIC\d+|mlx\d_\d+)[ \t]+(?!GPU\d)")


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=os.path.basename)
def test_damaged_rows_are_repaired_exactly_or_refused(path):
    """Lose one or two separators, or whole cells, in matrix rows: never a different result."""
    text = read(path)
    original = data(parse_topo_matrix(text))
    lines = text.split("\n")
    legend = next((i for i, l in enumerate(lines) if l.strip().startswith("Legend")), len(lines))
    row_lines = [i for i in range(legend) if ROW_START_RE.match(lines[i])]
    assert row_lines
    rng = random.Random(os.path.basename(path))
    outcomes = collections.Counter()
    for _trial in range(60):
        damaged = list(lines)
        for _ in range(rng.choice((1, 1, 2))):
            i = rng.choice(row_lines)
            lead = len(damaged[i]) - len(damaged[i].lstrip())
            row = damaged[i].strip()
            gaps = [m.span() for m in re.finditer(r"[ \t]+", row)]
            a, b = rng.choice(gaps)
            if rng.random() < 0.6:
                row = row[:a] + row[b:]  # two cells glued
            else:
                row = row[:a] + re.sub(r"^[ \t]+\S+", "", row[a:], count=1)  # a cell lost
            damaged[i] = damaged[i][:lead] + row
        try:
            result = parse_topo_matrix("\n".join(damaged), "damaged")
        except TopoParseError as exc:
            assert str(exc).startswith("damaged: ")
            outcomes["refused"] += 1
            continue
        assert data(result) == original
        outcomes["repaired"] += 1
    assert outcomes["refused"] and outcomes["repaired"], outcomes


def test_asymmetric_links_are_reported():
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV2\t0-7\nGPU1\tNV1\t X \t0-7\n"
    result = parse_topo_matrix(text)
    assert result["gpu_links"] == [["X", "NV2"], ["NV1", "X"]]
    assert result["warnings"] == [
        "link GPU0-GPU1 is NV2 in row GPU0 but NV1 in row GPU1; row values are used"
    ]


def test_gpu_index_comes_from_the_label():
    text = "\tGPU0\tGPU2\tCPU Affinity\nGPU0\t X \tSYS\t0-7\nGPU2\tSYS\t X \t8-15\n"
    result = parse_topo_matrix(text)
    assert [g["index"] for g in result["gpus"]] == [0, 2]
    assert any("not GPU0..GPU1" in w for w in result["warnings"])


# --------------------------------------------------------------------------
# bad input: TopoParseError naming the source and the problem


@pytest.mark.parametrize("text", ["", "   \n\t\n", "\r\n"])
def test_empty_text(text):
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix(text, "node7.txt")
    assert str(err.value).startswith("node7.txt: the text is empty")
    assert "GPU0" in str(err.value)


@pytest.mark.parametrize("value", [None, 42, ["GPU0"]])
def test_text_of_wrong_type(value):
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix(value, "node7.txt")
    assert "node7.txt" in str(err.value) and type(value).__name__ in str(err.value)


@pytest.mark.parametrize(
    "text",
    [
        "No devices were found\n",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
        "\x00\x01garbage \xff\xfe\n" * 3,
        "GPU0\t X \tNV4\t0-7\nGPU1\tNV4\t X \t0-7\n",  # rows without their header
    ],
)
def test_text_without_a_header(text):
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix(text, "node7.txt")
    message = str(err.value)
    assert message.startswith("node7.txt: no topology header found")
    assert "first column is GPU0" in message


def test_truncated_output_names_the_missing_rows():
    text = read(os.path.join(PUBLISHED, "8gpu-pcie-plx-numa-na.topo.txt"))
    truncated = "\n".join(text.splitlines()[:10]) + "\n"  # 5 comment lines, header, GPU0..GPU3
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix(truncated, "8gpu.txt")
    message = str(err.value)
    assert message.startswith("8gpu.txt: the matrix is incomplete")
    assert "header (line 6) lists 8 column(s) (GPU0..GPU7)" in message
    assert "no row for GPU4, GPU5, GPU6, GPU7" in message
    assert "truncated" in message


def test_missing_nic_rows_are_truncation():
    text = hgx_text()
    cut = text[: text.index("\nNIC5\t") + 1]
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix(cut, "hgx.txt")
    assert "no row for NIC5, NIC6, NIC7, NIC8, NIC9" in str(err.value)


def test_header_only():
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix("\tGPU0\tGPU1\tCPU Affinity\n\n", "hdr.txt")
    assert "no row for GPU0, GPU1" in str(err.value)


def test_garbage_after_the_header():
    text = "\tGPU0\tGPU1\tCPU Affinity\nlorem ipsum dolor\nsit amet\n"
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix(text, "g.txt")
    message = str(err.value)
    assert "no row for GPU0, GPU1" in message and "line(s) 2, 3 could not be read as rows" in message


def test_row_with_a_missing_link_cell():
    text = h100_text().replace(
        "GPU3    NV18    NV18    NV18     X      NV18", "GPU3    NV18    NV18     X      NV18", 1
    )
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix(text, "h100.txt")
    message = str(err.value)
    assert message.startswith("h100.txt: line 9: row GPU3: expected 8 link code(s) (columns GPU0..GPU7)")
    assert "found 10 cell(s)" in message


def test_row_with_an_extra_cell():
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSYS\tSYS\t0-7\nGPU1\tSYS\t X \t0-7\n"
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix(text, "x.txt")
    assert "x.txt: line 2: row GPU0: expected 2 link code(s)" in str(err.value)
    assert "found 4 cell(s)" in str(err.value)


@pytest.mark.parametrize("code", ["CNX", "NV", "QPI", "nv4"])
def test_unknown_link_code(code):
    text = (
        "\tGPU0\tGPU1\tNIC0\tCPU Affinity\nGPU0\t X \tNV4\t%s\t0-7\nGPU1\tNV4\t X \tSYS\t0-7\nNIC0\t%s\tSYS\t X \n"
        % (
            code,
            code,
        )
    )
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix(text, "codes.txt")
    message = str(err.value)
    assert message.startswith("codes.txt: line 2: row GPU0: ")
    assert repr(code) in message and "in column NIC0" in message
    assert "allowed: X, NV#" in message and "SYS" in message


def test_p2p_matrix_alone_is_not_a_topology():
    text = " \tGPU0\tGPU1\t\n GPU0\tX\tOK\t\n GPU1\tOK\tX\t\n\nLegend:\n\n  X    = Self\n  OK   = Status Ok\n"
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix(text, "p2p.txt")
    assert "p2p.txt: line 2: row GPU0" in str(err.value) and "topo -p2p" in str(err.value)


def test_x_off_the_diagonal():
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\tPIX\t X \t0-7\nGPU1\tPIX\t X \t0-7\n"
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix(text, "d.txt")
    assert "d.txt: line 2: row GPU0: expected X (the row's own column) in column GPU0, found 'PIX'" in str(
        err.value
    )


@pytest.mark.parametrize("cpu", ["0-95-3", "95-0", "0,,4"])
def test_bad_cpu_affinity(cpu):
    text = "\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t%s\t0\n" % cpu
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix(text, "c.txt")
    message = str(err.value)
    assert "c.txt: line 2: row GPU0" in message
    assert "CPU Affinity" in message and cpu in message


def test_duplicate_row():
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSYS\t0-7\nGPU0\t X \tSYS\t0-7\nGPU1\tSYS\t X \t0-7\n"
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix(text, "dup.txt")
    assert "dup.txt: line 3" in str(err.value) and "appears twice (first on line 2)" in str(err.value)


def test_row_not_in_header():
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSYS\t0-7\nGPU2\tSYS\t X \t0-7\n"
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix(text, "r.txt")
    assert "r.txt: line 3" in str(err.value) and "row GPU2 is not among the header's columns" in str(
        err.value
    )


def test_device_column_after_affinity_columns():
    text = "\tGPU0\tCPU Affinity\tNIC0\nGPU0\t X \t0-7\tPIX\n"
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix(text, "h.txt")
    assert "h.txt: line 1" in str(err.value) and "'NIC0' comes after the affinity columns" in str(err.value)


@pytest.mark.parametrize(
    "text, problem",
    [
        ("GPU0", "no row for GPU0"),
        ("\tGPU0\nGPU0\n", "no row for GPU0"),
        ("\tGPU0\nGPU0 X X\n", "found 2 cell(s)"),
        ("\tGPU0\tCPU Affinity\nGPU0 X 1-\n", "expected CPU Affinity"),
        ("\tGPU0\tGPU1\nGPU0 X NV99999999999999999999\nGPU1 NV1 X NV1\n", "found 'NV99999999999999999999'"),
        ("\tGPU0\tGPU0\nGPU0 X X\n", "GPU0 appear more than once"),
        ("\tGPU0\tCPU Affinity\tCPU Affinity\nGPU0 X 0 0\n", "'CPU Affinity' appears twice"),
        ("\tGPU0\tNIC0\nGPU0 X PIX\nNIC0 PIX X 0-3 0-3\n", "NIC0"),
        ("\tGPU0\tGPU1\n\x1b[4mGPU0 X\x1b[0m\n", "GPU0"),
    ],
)
def test_malformed_inputs_raise_topo_parse_error(text, problem):
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix(text, "fuzz")
    assert isinstance(err.value, GpunumaError)
    assert str(err.value).startswith("fuzz: ")
    assert problem in str(err.value)


def test_single_gpu_without_affinity_header_is_a_complete_result():
    result = parse_topo_matrix("GPU0\nGPU0 X\n")
    assert result == {
        "source": "nvidia-smi topo -m output",
        "gpus": [gpu(0, None)],
        "nics": [],
        "gpu_links": [["X"]],
        "gpu_nic_links": [[]],
        "warnings": [],
    }


def test_gpu_columns_out_of_order_come_out_by_index_with_their_links():
    text = (
        "\tGPU0\tGPU2\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\n"
        "GPU0\t X \tSYS\tNV4\tPIX\t0-7\t0\n"
        "GPU2\tSYS\t X \tPHB\tSYS\t8-15\t1\n"
        "GPU1\tNV4\tPHB\t X \tNODE\t0-7\t0\n"
        "NIC0\tPIX\tSYS\tNODE\t X \n"
    )
    result = parse_topo_matrix(text)
    assert [g["index"] for g in result["gpus"]] == [0, 1, 2]
    assert [g["cpu_affinity"] for g in result["gpus"]] == ["0-7", "0-7", "8-15"]
    assert result["gpu_links"] == [["X", "NV4", "SYS"], ["NV4", "X", "PHB"], ["SYS", "PHB", "X"]]
    assert result["gpu_nic_links"] == [["PIX"], ["NODE"], ["SYS"]]
    assert any("GPU columns are GPU0 GPU2 GPU1, not GPU0..GPU2 in order" in w for w in result["warnings"])


@pytest.mark.parametrize("label", ["GPU-1", "GPU01", "gpu1", "GPU 1x", "GPU256"])
def test_a_label_that_is_not_gpu_n_is_never_taken_for_a_nic(label):
    first = label.split()[0]
    text = "\tGPU0\t%s\tCPU Affinity\nGPU0\t X \tSYS\t0-7\n%s\tSYS\t X \t0-7\n" % (first, first)
    with pytest.raises(TopoParseError) as err:
        parse_topo_matrix(text, "t.txt")
    assert "column %r is not a GPU label; allowed: GPU<n> with n from 0 to 255" % first in str(err.value)
