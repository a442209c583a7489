"""NVML adapter: live collection through a fake pynvml, dumps, link matrix."""

import json
import types

import pytest

from ansible.module_utils.gpunuma.discovery.nvidia import nvml
from ansible.module_utils.gpunuma.discovery.nvidia import nvml_dump
from ansible.module_utils.gpunuma.common.errors import NvmlError

pytestmark = pytest.mark.unit


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_GpuIsLost(NVMLError):
    pass


def fake_pynvml(gpus, fail_at=None, nvlinks=None, levels=None):
    """A pynvml stand-in with the call signatures of nvidia-ml-py.

    ``gpus``: list of (bus_id, uuid, numa or None, affinity words).
    ``fail_at``: (function name, gpu index) raising GpuIsLost there.
    """
    mod = types.SimpleNamespace()
    mod.NVMLError = NVMLError
    mod.NVML_FEATURE_ENABLED = 1
    nvlinks = nvlinks or {}

    def guard(name, index):
        if fail_at == (name, index):
            raise NVMLError_GpuIsLost("GPU is lost")

    mod.nvmlInit = lambda: None
    mod.nvmlShutdown = lambda: None
    mod.nvmlSystemGetDriverVersion = lambda: "580.159.04"
    mod.nvmlSystemGetNVMLVersion = lambda: "13.580.159.04"
    mod.nvmlSystemGetCudaDriverVersion = lambda: 13000
    mod.nvmlDeviceGetCount = lambda: len(gpus)

    def handle(i):
        guard("nvmlDeviceGetHandleByIndex", i)
        return i

    mod.nvmlDeviceGetHandleByIndex = handle

    def pci(h):
        guard("nvmlDeviceGetPciInfo", h)
        return types.SimpleNamespace(busId=gpus[h][0])

    mod.nvmlDeviceGetPciInfo = pci
    mod.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    mod.nvmlDeviceGetUUID = lambda h: gpus[h][1]

    def numa(h):
        if gpus[h][2] is None:
            raise NVMLError_NotSupported("Not Supported")
        return gpus[h][2]

    mod.nvmlDeviceGetNumaNodeId = numa
    mod.nvmlDeviceGetCpuAffinity = lambda h, n: list(gpus[h][3])
    mod.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 5
    mod.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16
    mod.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 5
    mod.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 16
    mod.nvmlDeviceGetMigMode = lambda h: [0, 0]
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=150754820096)

    def link_state(h, link):
        links = nvlinks.get(h, [])
        if link >= len(links):
            raise NVMLError_NotSupported("Not Supported")
        return 1

    mod.nvmlDeviceGetNvLinkState = link_state
    mod.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(busId=nvlinks[h][link])
    mod.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: (levels or {}).get((a, b), 50)
    return mod


def two_gpus(**kwargs):
    return fake_pynvml(
        [
            ("00000000:18:00.0", "GPU-aaaa", 0, [(1 << 48) - 1, 0, 0]),
            ("00000000:9A:00.0", "GPU-bbbb", None, [0, (1 << 32) - 1, 0]),
        ],
        **kwargs
    )


def test_collect_records_values_and_not_supported_errors():
    dump = nvml.collect(two_gpus())
    assert dump["schema"] == "gpunuma.nvml-dump/v1"
    assert dump["driver_version"] == "580.159.04"
    first, second = dump["gpus"]
    assert first["pci_bus_id"] == "0000:18:00.0"
    assert second["pci_bus_id"] == "0000:9a:00.0"
    assert first["numa_node_id"] == 0
    assert second["numa_node_id"] == {"nvml_error": "NotSupported"}
    assert first["cpu_affinity_words"] == [(1 << 48) - 1, 0, 0]
    assert first["mig_mode"] == {"current": 0, "pending": 0}
    assert dump["topology_levels"] == [[0, 50], [50, 0]]
    # A dump survives a JSON round trip and validates.
    assert nvml_dump.validate_dump(json.loads(json.dumps(dump))) == dump


@pytest.mark.parametrize("call", ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetPciInfo"])
def test_collect_fails_loudly_mid_query(call):
    with pytest.raises(NvmlError) as err:
        nvml.collect(two_gpus(fail_at=(call, 1)))
    assert "GPU 1" in str(err.value) and call in str(err.value) and "GpuIsLost" in str(err.value)


def test_collect_without_pynvml_says_so(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError("no pynvml")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    with pytest.raises(NvmlError) as err:
        nvml.collect()
    assert "nvidia-ml-py" in str(err.value)


def test_nvswitch_links_read_as_min_link_count():
    switch = "00000000:05:00.0"
    mod = fake_pynvml(
        [("00000000:%02X:00.0" % (0x18 + i), "GPU-%d" % i, 0, [1]) for i in range(3)],
        nvlinks={0: [switch] * 18, 1: [switch] * 18, 2: [switch] * 12},
    )
    matrix = nvml.gpu_link_matrix(nvml.collect(mod))
    assert matrix[0] == ["X", "NV18", "NV12"]
    assert matrix[2] == ["NV12", "NV12", "X"]


def test_direct_nvlinks_and_pcie_levels():
    mod = fake_pynvml(
        [("00000000:18:00.0", "GPU-0", 0, [1]), ("00000000:19:00.0", "GPU-1", 0, [1]),
         ("00000000:9a:00.0", "GPU-2", 1, [2])],
        nvlinks={0: ["00000000:19:00.0"] * 4, 1: ["00000000:18:00.0"] * 4},
        levels={(0, 2): 50, (2, 0): 50, (1, 2): 40, (2, 1): 40},
    )
    matrix = nvml.gpu_link_matrix(nvml.collect(mod))
    assert matrix == [["X", "NV4", "SYS"], ["NV4", "X", "NODE"], ["SYS", "NODE", "X"]]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(schema="other"), "schema"),
        (lambda d: d["gpus"][0].pop("uuid"), "gpus[0].uuid"),
        (lambda d: d["gpus"][1].update(pci_bus_id={"nvml_error": "GpuIsLost"}), "gpus[1].pci_bus_id"),
        (lambda d: d["gpus"][1].update(index=5), "gpus[1].index"),
        (lambda d: d.update(topology_levels=[[0]]), "topology_levels"),
    ],
)
def test_validate_dump_rejects_broken_dumps(mutate, message):
    dump = nvml.collect(two_gpus())
    mutate(dump)
    with pytest.raises(NvmlError) as err:
        nvml_dump.validate_dump(dump, source="nvml_dump x.json")
    assert message in str(err.value) and "x.json" in str(err.value)


def test_load_dump_errors_name_the_file(tmp_path):
    missing = tmp_path / "missing.json"
    with pytest.raises(NvmlError) as err:
        nvml.load_dump(str(missing))
    assert str(missing) in str(err.value)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(NvmlError) as err:
        nvml.load_dump(str(bad))
    assert "not valid JSON" in str(err.value)


@pytest.mark.parametrize("bus, expected", [("00000000:18:00.0", "0000:18:00.0"),
                                           ("00000019:01:00.0", "0019:01:00.0"),
                                           (b"00000000:AB:00.0", "0000:ab:00.0")])
def test_normalize_bus_id(bus, expected):
    assert nvml_dump.normalize_bus_id(bus) == expected


# -- schema validation (gpunuma.nvml-dump/v1) ------------------------------------


@pytest.mark.parametrize("bus", ["zzzz:18:00.0", "0000:18:00.0\n", " 0000:18:00.0", "18:00.0", "0:18:00.0",
                                 "0000:18:20.0", "0000:18:00.8", "0000:1:00.0", "0000:18:00", 18, None,
                                 "000000000:18:00.0"])
def test_normalize_bus_id_refuses_anything_but_the_full_form(bus):
    with pytest.raises(NvmlError) as err:
        nvml_dump.normalize_bus_id(bus)
    assert "is not of the form DOMAIN:BUS:DEVICE.FUNCTION" in str(err.value) and "0000:18:00.0" in str(err.value)


def test_normalize_bus_id_keeps_wide_vmd_domains():
    assert nvml_dump.normalize_bus_id("00010000:01:1F.7") == "10000:01:1f.7"


def test_validate_dump_collects_every_problem_with_its_field_path():
    dump = nvml.collect(two_gpus())
    dump["gpus"][0]["pci_bus_id"] = "zzzz:18:00.0"
    dump["gpus"][1]["numa_node_id"] = "1"
    dump["gpus"][1]["cpu_affinity_words"] = [0, "x"]
    dump["cpu_word_bits"] = -64
    with pytest.raises(NvmlError) as err:
        nvml_dump.validate_dump(dump, source="nvml_dump d.json")
    message = str(err.value)
    assert message.startswith("nvml_dump d.json: 4 problems: ")
    for needle in ("gpus[0].pci_bus_id is 'zzzz:18:00.0'; allowed: DOMAIN:BUS:DEVICE.FUNCTION",
                   "gpus[1].numa_node_id is '1'; allowed: an integer from -1 (none) to 1023",
                   "gpus[1].cpu_affinity_words[1] is 'x'", "cpu_word_bits is -64; allowed: 32 or 64"):
        assert needle in message


@pytest.mark.parametrize("field", ["name", "numa_node_id", "cpu_affinity_words", "pcie", "mig_mode",
                                   "memory_total_bytes"])
def test_fields_nvml_may_not_answer_accept_errors_and_null(field):
    for value in ({"nvml_error": "NotSupported"}, None):
        dump = nvml.collect(two_gpus())
        dump["gpus"][0][field] = value
        assert nvml_dump.validate_dump(dump)["gpus"][0][field] == value


def test_validate_dump_normalises_bus_ids_and_nvlink_peers():
    dump = nvml.collect(two_gpus())
    dump["gpus"][0]["pci_bus_id"] = "00000000:18:00.0"
    dump["gpus"][0]["nvlinks"] = [{"link": 0, "remote_pci_bus_id": "00000000:9A:00.0"}]
    out = nvml_dump.validate_dump(dump)
    assert out["gpus"][0]["pci_bus_id"] == "0000:18:00.0"
    assert out["gpus"][0]["nvlinks"][0]["remote_pci_bus_id"] == "0000:9a:00.0"


def test_duplicates_are_named_against_the_first_holder():
    dump = nvml.collect(two_gpus())
    dump["gpus"][1]["pci_bus_id"] = "00000000:18:00.0"
    dump["gpus"][1]["uuid"] = dump["gpus"][0]["uuid"]
    with pytest.raises(NvmlError) as err:
        nvml_dump.validate_dump(dump)
    assert "gpus[1].pci_bus_id is '00000000:18:00.0'; allowed: a bus id of its own (gpus[0] is at 0000:18:00.0" \
        in str(err.value)
    assert "gpus[1].uuid is 'GPU-aaaa'; allowed: a UUID of its own (gpus[0] has this UUID as well)" in str(err.value)


def test_unknown_keys_are_ignored_and_word_bits_32_accepted():
    dump = nvml.collect(two_gpus())
    dump["recorded_by"] = "someone"
    dump["cpu_word_bits"] = 32
    dump["gpus"][0]["cpu_affinity_words"] = [0xFFFFFFFF]
    assert nvml_dump.validate_dump(dump)["recorded_by"] == "someone"
    dump["gpus"][0]["cpu_affinity_words"] = [1 << 32]
    with pytest.raises(NvmlError, match=r"gpus\[0\].cpu_affinity_words\[0\] is 4294967296; allowed: an integer "
                                        r"from 0 to 2\*\*32 - 1"):
        nvml_dump.validate_dump(dump)


def test_load_dump_refuses_a_fifo_and_a_large_file_naming_them(tmp_path):
    import os

    fifo = tmp_path / "fifo.json"
    os.mkfifo(str(fifo))
    with pytest.raises(NvmlError, match="nvml_dump %s cannot be read: it is a FIFO" % fifo):
        nvml.load_dump(str(fifo))
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (nvml_dump.MAX_DUMP_BYTES + 1))
    with pytest.raises(NvmlError, match="larger than %d bytes" % nvml_dump.MAX_DUMP_BYTES):
        nvml.load_dump(str(big))
    link = tmp_path / "link.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(NvmlError, match="character device"):
        nvml.load_dump(str(link))


def test_load_dump_follows_a_link_to_a_regular_file(tmp_path):
    real = tmp_path / "real.json"
    real.write_text(json.dumps(nvml.collect(two_gpus())))
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert nvml.load_dump(str(link))["gpus"][1]["pci_bus_id"] == "0000:9a:00.0"


def test_live_answers_go_through_the_dump_schema():
    mod = fake_pynvml([("00000000:18:00.0", "GPU-aaaa", 0, [1]), ("00000000:19:00.0", "GPU-aaaa", 0, [1])])
    with pytest.raises(NvmlError, match=r"live NVML: gpus\[1\].uuid is 'GPU-aaaa'; allowed: a UUID of its own"):
        nvml.collect(mod)
    mod = fake_pynvml([("00000000:18:00.0", "GPU-a\nb", 0, [1])])
    with pytest.raises(NvmlError, match=r"live NVML: gpus\[0\].uuid"):
        nvml.collect(mod)
