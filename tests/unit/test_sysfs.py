import errno
import os
import re
import shutil

import pytest

import sysfs_factory as factory
from ansible.module_utils.gpunuma.discovery.sysfs import host as sysfs
from ansible.module_utils.gpunuma.common import bounded
from ansible.module_utils.gpunuma.discovery.sysfs import pci as sysfs_pci
from ansible.module_utils.gpunuma.discovery.sysfs import reader as sysfs_reader
from ansible.module_utils.gpunuma.common.cpulist import parse_cpulist
from ansible.module_utils.gpunuma.common.errors import SysfsError
from conftest import FIXTURES

pytestmark = pytest.mark.unit

H200_DIR = os.path.join(FIXTURES, "captured", "h200-1gpu-vm")
H200_ROOT = os.path.join(H200_DIR, "sysfs")
HOSTS = os.path.join(FIXTURES, "hosts")
KB = 1024
GIB = 1024 ** 3


def by_id(host, bus_id):
    matches = [dev for dev in host["pci"] if dev["pci_bus_id"] == bus_id]
    assert len(matches) == 1, bus_id
    return matches[0]


def node_cpus(host):
    return {node["id"]: node["cpus"] for node in host["numa_nodes"]}


def lscpu_node_cpus(name):
    """``NUMA nodeN CPU(s):`` lines of a published lscpu output."""
    nodes = {}
    with open(os.path.join(HOSTS, name)) as handle:
        for line in handle:
            match = re.match(r"^NUMA node(\d+) CPU\(s\):\s*(.*)$", line)
            if match:
                nodes[int(match.group(1))] = match.group(2).strip()
    return nodes


def numactl_hardware(name):
    """cpus, size (MB) and distance rows of a ``numactl --hardware`` text (wrapped lines joined)."""
    with open(os.path.join(HOSTS, name)) as handle:
        lines = [line.rstrip("\n") for line in handle if not line.startswith("# ")]
    joined = []
    for line in lines:
        if joined and re.match(r"^\d", line) and not re.match(r"^\s*\d+:", line):
            joined[-1] += " " + line  # continuation of a wrapped "node N cpus:" line
        else:
            joined.append(line)
    cpus, sizes, rows = {}, {}, {}
    for line in joined:
        match = re.match(r"^node (\d+) cpus:(.*)$", line)
        if match:
            cpus[int(match.group(1))] = sorted(int(c) for c in match.group(2).split())
        match = re.match(r"^node (\d+) size: (\d+) MB$", line)
        if match:
            sizes[int(match.group(1))] = int(match.group(2))
        match = re.match(r"^\s+(\d+):\s+(.*)$", line)
        if match:
            rows[int(match.group(1))] = [int(d) for d in match.group(2).split()]
    return cpus, sizes, rows


# -- captured H200 VM --------------------------------------------------------


def test_captured_h200_nodes_and_globals():
    host = sysfs.read_host(H200_ROOT)
    assert host["numa_nodes"] == [
        {
            "id": 0,
            "cpus": "0-15",
            "has_cpus": True,
            "memory_total_bytes": 6385136 * KB,
            "memory_free_bytes": 4017920 * KB,
            "distances": [10],
        }
    ]
    assert host["sockets"] == 1
    assert host["numa_balancing"] == 0
    assert host["warnings"] == []


def test_captured_h200_gpu_and_nic():
    host = sysfs.read_host(H200_ROOT)
    assert [dev["pci_bus_id"] for dev in host["pci"]] == ["0000:00:03.0", "0000:00:06.0"]
    assert sysfs_pci.gpu_functions(host) == [
        {
            "pci_bus_id": "0000:00:06.0",
            "vendor": "0x10de",
            "device": "0x2335",
            "class": "0x030200",
            "numa_node": None,
            "raw_numa_node": -1,
            "local_cpulist": "0-15",
            "max_link_speed": "32.0 GT/s PCIe",
            "max_link_width": 16,
            "current_link_speed": "32.0 GT/s PCIe",
            "current_link_width": 16,
            "netdevs": [],
            "rdma": [],
            "nvme": [],
            "realpath": "/sys/devices/pci0000:00/0000:00:06.0",
            "msi_vectors": None,  # the capture has no msi_irqs/
        }
    ]
    nics = sysfs_pci.nic_functions(host)
    assert [(n["pci_bus_id"], n["vendor"], n["class"], n["numa_node"], n["max_link_speed"]) for n in nics] == [
        ("0000:00:03.0", "0x1af4", "0x020000", None, None)
    ]
    assert sysfs_pci.nvme_functions(host) == []


def test_captured_h200_agrees_with_raw_command_outputs():
    """sysfs, numactl --hardware, lscpu -e and nvidia-smi of the same VM tell one story."""
    host = sysfs.read_host(H200_ROOT)
    with open(os.path.join(H200_DIR, "raw", "numactl_H.txt")) as handle:
        numactl = handle.read()
    size_mb = int(re.search(r"node 0 size: (\d+) MB", numactl).group(1))
    node = host["numa_nodes"][0]
    # (free memory moved between the two captures; only the size is stable)
    assert node["memory_total_bytes"] // 2 ** 20 == size_mb

    with open(os.path.join(H200_DIR, "raw", "lscpu_e.txt")) as handle:
        rows = [line.split() for line in handle if re.match(r"^\s*\d", line)]
    expected = [
        {"id": int(cpu), "node": int(nd), "package": int(sock), "core": int(core), "siblings": cpu,
         "online": online == "yes"}
        for cpu, nd, sock, core, online in rows
    ]
    assert len(expected) == 16
    assert host["cpus"] == expected

    with open(os.path.join(H200_DIR, "raw", "nvsmi_topo.txt")) as handle:
        affinity = re.search(r"^GPU0\s+X\s+(\S+)", handle.read(), re.M).group(1)
    assert sysfs_pci.gpu_functions(host)[0]["local_cpulist"] == affinity == "0-15"
    assert sysfs_pci.pcie_gen_from_speed(sysfs_pci.gpu_functions(host)[0]["max_link_speed"]) == 5


# -- synthetic machines ------------------------------------------------------


def test_two_socket_8gpu_ht(tmp_path):
    host = sysfs.read_host(factory.two_socket_8gpu_ht(tmp_path))
    assert host["warnings"] == []
    assert host["numa_nodes"] == [
        {"id": 0, "cpus": "0-47,96-143", "has_cpus": True, "memory_total_bytes": 1024 * GIB,
         "memory_free_bytes": 1000 * GIB, "distances": [10, 21]},
        {"id": 1, "cpus": "48-95,144-191", "has_cpus": True, "memory_total_bytes": 1024 * GIB,
         "memory_free_bytes": 990 * GIB, "distances": [21, 10]},
    ]
    assert host["sockets"] == 2
    assert host["numa_balancing"] == 1
    assert len(host["cpus"]) == 192
    assert host["cpus"][0] == {"id": 0, "node": 0, "package": 0, "core": 0, "siblings": "0,96", "online": True}
    assert host["cpus"][150] == {"id": 150, "node": 1, "package": 1, "core": 6, "siblings": "54,150",
                                 "online": True}
    assert host["cpus"][96]["siblings"] == "0,96" and host["cpus"][96]["core"] == 0

    gpus = sysfs_pci.gpu_functions(host)
    assert [(g["pci_bus_id"], g["numa_node"], g["local_cpulist"]) for g in gpus] == [
        ("0000:18:00.0", 0, "0-47,96-143"),
        ("0000:2a:00.0", 0, "0-47,96-143"),
        ("0000:3a:00.0", 0, "0-47,96-143"),
        ("0000:5d:00.0", 0, "0-47,96-143"),
        ("0000:9a:00.0", 1, "48-95,144-191"),
        ("0000:ab:00.0", 1, "48-95,144-191"),
        ("0000:ba:00.0", 1, "48-95,144-191"),
        ("0000:db:00.0", 1, "48-95,144-191"),
    ]
    gpu0 = gpus[0]
    assert (gpu0["vendor"], gpu0["device"], gpu0["class"]) == ("0x10de", "0x2330", "0x030200")
    assert (gpu0["max_link_speed"], gpu0["max_link_width"]) == ("32.0 GT/s PCIe", 16)
    assert gpu0["realpath"] == "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"

    nics = sysfs_pci.nic_functions(host)
    assert [(n["pci_bus_id"], n["class"], n["numa_node"], n["rdma"], n["netdevs"]) for n in nics] == [
        ("0000:0b:00.0", "0x020000", 0, [], ["ens9f0"]),
        ("0000:19:00.0", "0x020700", 0, ["mlx5_0"], ["ibp25s0"]),
        ("0000:2b:00.0", "0x020700", 0, ["mlx5_1"], ["ibp43s0"]),
        ("0000:3b:00.0", "0x020700", 0, ["mlx5_2"], ["ibp59s0"]),
        ("0000:5e:00.0", "0x020700", 0, ["mlx5_3"], ["ibp94s0"]),
        ("0000:9b:00.0", "0x020700", 1, ["mlx5_4"], ["ibp155s0"]),
        ("0000:ac:00.0", "0x020700", 1, ["mlx5_5"], ["ibp172s0"]),
        ("0000:bb:00.0", "0x020700", 1, ["mlx5_6"], ["ibp187s0"]),
        ("0000:dc:00.0", "0x020700", 1, ["mlx5_7"], ["ibp220s0"]),
    ]
    # each IB NIC shares the GPU's PCIe switch (root port and upstream port)
    nic0 = by_id(host, "0000:19:00.0")
    assert nic0["realpath"] == "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0"

    assert [(n["pci_bus_id"], n["numa_node"], n["nvme"]) for n in sysfs_pci.nvme_functions(host)] == [
        ("0000:c1:00.0", 1, ["nvme0"]),
        ("0000:c2:00.0", 1, ["nvme1"]),
    ]
    # 19 endpoints + 35 bridges; the helpers ignore the bridges
    bridges = [d for d in host["pci"] if d["class"] == "0x060400"]
    assert len(host["pci"]) == 54 and len(bridges) == 35
    assert [d["pci_bus_id"] for d in host["pci"]] == sorted(d["pci_bus_id"] for d in host["pci"])


def test_amd_nps4_matches_published_lscpu(tmp_path):
    host = sysfs.read_host(factory.amd_nps4_8node(tmp_path))
    assert host["warnings"] == []
    published = lscpu_node_cpus("dgxa100-epyc7742-nps4.lscpu.txt")
    assert len(published) == 8
    assert node_cpus(host) == published
    assert host["sockets"] == 2
    assert host["numa_nodes"][0]["distances"] == [10, 12, 12, 12, 32, 32, 32, 32]
    assert host["numa_nodes"][5]["distances"] == [32, 32, 32, 32, 12, 10, 12, 12]
    assert {c["package"] for c in host["cpus"] if c["node"] in (4, 5, 6, 7)} == {1}
    assert host["cpus"][200] == {"id": 200, "node": 4, "package": 1, "core": 8, "siblings": "72,200",
                                 "online": True}

    gpus = sysfs_pci.gpu_functions(host)
    assert [g["numa_node"] for g in gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    for gpu in gpus:
        assert gpu["local_cpulist"] == published[gpu["numa_node"]]
        assert sysfs_pci.pcie_gen_from_speed(gpu["max_link_speed"]) == 4
    nics = sysfs_pci.nic_functions(host)
    assert [(n["rdma"][0], n["numa_node"]) for n in nics] == [
        ("mlx5_0", 3), ("mlx5_1", 3), ("mlx5_2", 1), ("mlx5_3", 1),
        ("mlx5_4", 7), ("mlx5_5", 7), ("mlx5_6", 5), ("mlx5_7", 5),
        ("mlx5_8", 6), ("mlx5_9", 6),
    ]


def test_grace_gh200_matches_published_numactl(tmp_path):
    host = sysfs.read_host(factory.grace_cpuless(tmp_path))
    assert host["warnings"] == []
    cpus, sizes, rows = numactl_hardware("gh200-9numa-hbm-node.numactl.txt")
    assert sorted(cpus) == list(range(9))
    for node in host["numa_nodes"]:
        assert sorted(parse_cpulist(node["cpus"])) == cpus[node["id"]]
        assert node["memory_total_bytes"] // 2 ** 20 == sizes[node["id"]]
        assert node["distances"] == rows[node["id"]]
    assert [n["has_cpus"] for n in host["numa_nodes"]] == [True] + [False] * 8
    assert host["numa_nodes"][1]["cpus"] == ""
    assert host["sockets"] == 1

    gpu, = sysfs_pci.gpu_functions(host)
    assert gpu["pci_bus_id"] == "0009:01:00.0"
    assert (gpu["numa_node"], gpu["raw_numa_node"], gpu["local_cpulist"]) == (0, 0, "0-71")
    assert gpu["realpath"] == "/sys/devices/pci0009:00/0009:00:00.0/0009:01:00.0"
    assert (gpu["max_link_speed"], gpu["max_link_width"]) == (None, None)
    assert [(n["pci_bus_id"], n["rdma"]) for n in sysfs_pci.nic_functions(host)] == [("0002:01:00.0", ["mlx5_0"])]


def test_grace_dual_superchip(tmp_path):
    host = sysfs.read_host(factory.grace_cpuless(tmp_path, superchips=2))
    assert host["warnings"] == []
    assert len(host["numa_nodes"]) == 18
    assert node_cpus(host)[0] == "0-71" and node_cpus(host)[1] == "72-143"
    assert [n["id"] for n in host["numa_nodes"] if not n["has_cpus"]] == list(range(2, 18))
    assert [n["id"] for n in host["numa_nodes"] if not n["has_cpus"] and n["memory_total_bytes"]] == [2, 10]
    assert [(g["pci_bus_id"], g["numa_node"], g["local_cpulist"]) for g in sysfs_pci.gpu_functions(host)] == [
        ("0009:01:00.0", 0, "0-71"),
        ("0019:01:00.0", 1, "72-143"),
    ]
    assert host["sockets"] == 2


def test_gb200_matches_published_lscpu(tmp_path):
    host = sysfs.read_host(factory.gb200_34node(tmp_path))
    assert host["warnings"] == []
    published = lscpu_node_cpus("gb200-4gpu-34numa.lscpu.txt")
    assert len(published) == 34
    assert node_cpus(host) == published
    assert [n["id"] for n in host["numa_nodes"] if n["has_cpus"]] == [0, 1]
    assert [n["id"] for n in host["numa_nodes"] if not n["has_cpus"] and n["memory_total_bytes"]] == [
        2, 10, 18, 26]
    assert all(len(n["distances"]) == 34 for n in host["numa_nodes"])
    assert host["sockets"] == 2
    assert host["cpus"][100] == {"id": 100, "node": 1, "package": 1, "core": 28, "siblings": "100",
                                 "online": True}
    assert [(g["pci_bus_id"], g["numa_node"], g["local_cpulist"]) for g in sysfs_pci.gpu_functions(host)] == [
        ("0008:01:00.0", 0, "0-71"),
        ("0009:01:00.0", 0, "0-71"),
        ("0018:01:00.0", 1, "72-143"),
        ("0019:01:00.0", 1, "72-143"),
    ]
    assert [(n["pci_bus_id"], n["rdma"][0], n["numa_node"]) for n in sysfs_pci.nic_functions(host)] == [
        ("0000:03:00.0", "mlx5_0", 0),
        ("0002:03:00.0", "mlx5_1", 0),
        ("0010:03:00.0", "mlx5_4", 1),
        ("0012:03:00.0", "mlx5_5", 1),
    ]


def test_single_socket(tmp_path):
    host = sysfs.read_host(factory.single_socket(tmp_path))
    assert host["warnings"] == []
    assert host["numa_nodes"] == [{"id": 0, "cpus": "0-31", "has_cpus": True, "memory_total_bytes": 256 * GIB,
                                   "memory_free_bytes": 240 * GIB, "distances": [10]}]
    assert [c["siblings"] for c in host["cpus"][:2]] == ["0,16", "1,17"]
    assert host["cpus"][17]["core"] == 1
    assert host["sockets"] == 1
    assert host["numa_balancing"] == 0
    gpu, = sysfs_pci.gpu_functions(host)
    assert (gpu["pci_bus_id"], gpu["device"], gpu["numa_node"], gpu["local_cpulist"]) == (
        "0000:01:00.0", "0x26b9", 0, "0-31")
    assert sysfs_pci.nic_functions(host) == []


def test_vm_numa_minus_one(tmp_path):
    host = sysfs.read_host(factory.vm_numa_minus_one(tmp_path))
    assert host["warnings"] == []
    gpu, = sysfs_pci.gpu_functions(host)
    assert (gpu["pci_bus_id"], gpu["numa_node"], gpu["raw_numa_node"], gpu["local_cpulist"]) == (
        "0000:00:06.0", None, -1, "0-15")
    assert gpu["realpath"] == "/sys/devices/pci0000:00/0000:00:06.0"
    nic, = sysfs_pci.nic_functions(host)
    assert (nic["pci_bus_id"], nic["numa_node"], nic["netdevs"]) == ("0000:00:03.0", None, ["ens3"])
    assert host["sockets"] == 1


def test_no_gpu(tmp_path):
    host = sysfs.read_host(factory.no_gpu(tmp_path))
    assert host["warnings"] == []
    assert node_cpus(host) == {0: "0-7", 1: "8-15"}
    # the BMC's VGA function is a display controller, but not NVIDIA's
    assert by_id(host, "0000:03:00.0")["class"] == "0x030000"
    assert sysfs_pci.gpu_functions(host) == []
    assert [(n["pci_bus_id"], n["netdevs"], n["numa_node"]) for n in sysfs_pci.nic_functions(host)] == [
        ("0000:41:00.0", ["eno1"], 0)]
    assert sysfs_pci.nvme_functions(host) == []


def test_capture_layout_reads_like_live_layout(tmp_path):
    nodes = [{"id": 0, "cpus": "0-3", "mem_kb": 1000, "free_kb": 500},
             {"id": 1, "cpus": "4-7", "mem_kb": 2000, "free_kb": 700}]
    pci = [dict(bdf="0000:18:00.0", vendor="0x10de", device="0x2330", numa_node=1,
                parents=["0000:15:01.0", "0000:16:00.0"], **{"class": "0x030200"})]
    live = sysfs.read_host(factory.build_tree(tmp_path / "live", nodes, pci=pci))
    capture = sysfs.read_host(factory.build_tree(tmp_path / "capture", nodes, pci=pci, symlinks=False))
    assert os.path.islink(tmp_path / "live" / "sys" / "bus" / "pci" / "devices" / "0000:18:00.0")
    assert live == capture
    assert by_id(live, "0000:18:00.0")["realpath"] == "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:18:00.0"


def test_live_root_relative_symlink_resolution(tmp_path, monkeypatch):
    root = factory.two_socket_8gpu_ht(tmp_path)
    monkeypatch.chdir(tmp_path)
    host = sysfs.read_host(".")
    assert by_id(host, "0000:9a:00.0")["realpath"] == (
        "/sys/devices/pci0000:97/0000:97:01.0/0000:98:00.0/0000:99:00.0/0000:9a:00.0")
    assert host == sysfs.read_host(root)


def test_read_host_accepts_pathlike(tmp_path):
    factory.single_socket(tmp_path)
    assert sysfs.read_host(tmp_path)["numa_nodes"][0]["cpus"] == "0-31"


# -- fallbacks ---------------------------------------------------------------


def simple_tree(root, **kwargs):
    nodes = [{"id": 0, "cpus": "0-3", "mem_kb": 1024, "free_kb": 512},
             {"id": 1, "cpus": "4-7", "mem_kb": 2048, "free_kb": 1024}]
    pci = [dict(bdf="0000:18:00.0", vendor="0x10de", device="0x2330", numa_node=1,
                max_link_speed="16.0 GT/s PCIe", max_link_width=16, **{"class": "0x030200"}),
           dict(bdf="0000:19:00.0", vendor="0x15b3", device="0x1021", numa_node=0,
                rdma=["mlx5_0"], **{"class": "0x020700"})]
    return factory.build_tree(root, kwargs.pop("nodes", nodes), pci=kwargs.pop("pci", pci), **kwargs)


def test_node_cpumap_used_when_cpulist_absent(tmp_path):
    root = simple_tree(tmp_path)
    os.remove(os.path.join(root, "sys/devices/system/node/node1/cpulist"))
    with open(os.path.join(root, "sys/devices/system/node/node1/cpumap")) as handle:
        assert handle.read() == "f0\n"
    host = sysfs.read_host(root)
    assert node_cpus(host) == {0: "0-3", 1: "4-7"}
    assert host["warnings"] == []


def test_local_cpus_mask_used_when_local_cpulist_absent(tmp_path):
    root = simple_tree(tmp_path)
    os.remove(os.path.join(root, "sys/bus/pci/devices/0000:18:00.0/local_cpulist"))
    assert by_id(sysfs.read_host(root), "0000:18:00.0")["local_cpulist"] == "4-7"


def test_kernel_without_numa_synthesises_node_0(tmp_path):
    root = simple_tree(tmp_path, numa=False)
    host = sysfs.read_host(root)
    assert host["numa_nodes"] == [{"id": 0, "cpus": "0-7", "has_cpus": True,
                                   "memory_total_bytes": 3072 * KB, "memory_free_bytes": 1536 * KB,
                                   "distances": [10]}]
    assert [c["node"] for c in host["cpus"]] == [0] * 8
    # the GPU's numa_node 1 is not a node of this (NUMA-less) view
    gpu = by_id(host, "0000:18:00.0")
    assert (gpu["numa_node"], gpu["raw_numa_node"]) == (None, 1)
    assert host["warnings"] == [
        "%s/sys/devices/system/node is missing (kernel without NUMA support): the host is treated as one "
        "NUMA node 0 holding CPUs 0-7" % root,
        "%s/sys/bus/pci/devices/0000:18:00.0/numa_node says 1, which is not a NUMA node of this host (0); "
        "node treated as unknown" % root,
    ]


def test_kernel_without_numa_and_without_online_file_uses_cpu_dirs(tmp_path):
    root = simple_tree(tmp_path, numa=False)
    os.remove(os.path.join(root, "sys/devices/system/cpu/online"))
    host = sysfs.read_host(root)
    assert host["numa_nodes"][0]["cpus"] == "0-7"
    assert [c["online"] for c in host["cpus"]] == [None] * 8


def test_kernel_without_numa_garbage_online_raises(tmp_path):
    root = simple_tree(tmp_path, numa=False)
    path = os.path.join(root, "sys/devices/system/cpu/online")
    with open(path, "w") as handle:
        handle.write("zero-seven\n")
    with pytest.raises(SysfsError, match=re.escape(path)):
        sysfs.read_host(root)


def test_offline_cpu_without_topology(tmp_path):
    nodes = [{"id": 0, "cpus": "0-2", "mem_kb": 1024, "free_kb": 512}]
    root = factory.build_tree(tmp_path, nodes, cpus={3: (0, 3, [3])}, online="0-2")
    host = sysfs.read_host(root)
    assert host["cpus"][3] == {"id": 3, "node": None, "package": None, "core": None, "siblings": None,
                               "online": False}
    assert host["cpus"][2]["online"] is True
    assert host["warnings"] == []


def test_online_cpu_without_topology_warns(tmp_path):
    root = simple_tree(tmp_path)
    shutil.rmtree(os.path.join(root, "sys/devices/system/cpu/cpu5/topology"))
    host = sysfs.read_host(root)
    # the package still comes from cpu4's package_cpus_list (4-7)
    assert host["cpus"][5] == {"id": 5, "node": 1, "package": 0, "core": None, "siblings": None,
                               "online": True}
    assert len(host["warnings"]) == 1
    assert host["warnings"][0].startswith("CPUs 5 have no %s/sys/devices/system/cpu/cpu<N>/topology/"
                                          "thread_siblings_list" % root)


def test_package_id_read_per_cpu_without_package_lists(tmp_path):
    root = factory.build_tree(tmp_path, [{"id": 0, "cpus": "0-3"}], cpus={0: (0, 0, [0]), 1: (0, 1, [1]),
                                                                           2: (1, 0, [2]), 3: (1, 1, [3])})
    for cpu in range(4):
        for name in ("package_cpus_list", "core_siblings_list"):
            os.remove(os.path.join(root, "sys/devices/system/cpu/cpu%d/topology/%s" % (cpu, name)))
    host = sysfs.read_host(root)
    assert [c["package"] for c in host["cpus"]] == [0, 0, 1, 1]
    assert host["sockets"] == 2


def test_package_minus_one_is_unknown(tmp_path):
    root = factory.build_tree(tmp_path, [{"id": 0, "cpus": "0-1"}], cpus={0: (-1, 0, [0]), 1: (-1, 1, [1])})
    host = sysfs.read_host(root)
    assert [c["package"] for c in host["cpus"]] == [None, None]
    assert host["sockets"] is None


def test_missing_optional_files(tmp_path):
    root = simple_tree(tmp_path, numa_balancing=None)
    os.remove(os.path.join(root, "sys/devices/system/node/node0/meminfo"))
    os.remove(os.path.join(root, "sys/devices/system/node/node1/distance"))
    host = sysfs.read_host(root)
    assert host["numa_balancing"] is None
    node0, node1 = host["numa_nodes"]
    assert (node0["memory_total_bytes"], node0["memory_free_bytes"]) == (None, None)
    assert node1["distances"] == []
    assert node1["memory_total_bytes"] == 2048 * KB
    assert sorted(host["warnings"]) == sorted([
        os.path.join(root, "sys/devices/system/node/node0/meminfo") + " is missing",
        os.path.join(root, "sys/devices/system/node/node1/distance") + " is missing",
    ])
    nic = by_id(host, "0000:19:00.0")
    assert (nic["max_link_speed"], nic["max_link_width"], nic["netdevs"]) == (None, None, [])


def test_uppercase_bus_id_directory_is_lowercased(tmp_path):
    root = simple_tree(tmp_path, pci=[dict(bdf="0000:AB:00.0", vendor="0x10DE", device="0x2330",
                                           numa_node=0, **{"class": "0x030200"})], symlinks=False)
    gpu, = sysfs_pci.gpu_functions(sysfs.read_host(root))
    assert (gpu["pci_bus_id"], gpu["vendor"]) == ("0000:ab:00.0", "0x10de")


def test_non_bdf_entry_is_skipped_with_warning(tmp_path):
    root = simple_tree(tmp_path)
    os.makedirs(os.path.join(root, "sys/bus/pci/devices/not-a-device"))
    host = sysfs.read_host(root)
    assert [d["pci_bus_id"] for d in host["pci"]] == ["0000:18:00.0", "0000:19:00.0"]
    assert len(host["warnings"]) == 1 and "'not-a-device' is not a PCI bus id" in host["warnings"][0]


# -- bad input ---------------------------------------------------------------


def test_missing_root(tmp_path):
    missing = str(tmp_path / "nowhere")
    with pytest.raises(SysfsError, match="sysfs root %s does not exist" % re.escape(missing)):
        sysfs.read_host(missing)


def test_root_is_a_file(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(SysfsError, match="%s is not a directory" % re.escape(str(path))):
        sysfs.read_host(str(path))


def test_root_without_sys(tmp_path):
    (tmp_path / "proc").mkdir()
    with pytest.raises(SysfsError, match="%s has no sys/ directory" % re.escape(str(tmp_path))):
        sysfs.read_host(str(tmp_path))


def test_root_of_wrong_type():
    with pytest.raises(SysfsError, match="must be a path, got NoneType"):
        sysfs.read_host(None)


def test_garbage_node_cpulist_raises_naming_file(tmp_path):
    root = simple_tree(tmp_path)
    path = os.path.join(root, "sys/devices/system/node/node1/cpulist")
    with open(path, "w") as handle:
        handle.write("4-x\n")
    with pytest.raises(SysfsError, match=re.escape(path)):
        sysfs.read_host(root)


def test_garbage_node_cpumap_raises_naming_file(tmp_path):
    root = simple_tree(tmp_path)
    os.remove(os.path.join(root, "sys/devices/system/node/node0/cpulist"))
    path = os.path.join(root, "sys/devices/system/node/node0/cpumap")
    with open(path, "w") as handle:
        handle.write("zz\n")
    with pytest.raises(SysfsError, match=re.escape(path)):
        sysfs.read_host(root)


def test_node_without_cpulist_or_cpumap_raises(tmp_path):
    root = simple_tree(tmp_path)
    node_dir = os.path.join(root, "sys/devices/system/node/node0")
    os.remove(os.path.join(node_dir, "cpulist"))
    os.remove(os.path.join(node_dir, "cpumap"))
    with pytest.raises(SysfsError, match="%s has neither cpulist nor cpumap" % re.escape(node_dir)):
        sysfs.read_host(root)


def test_unreadable_node_cpulist_directory_in_place_raises(tmp_path):
    root = simple_tree(tmp_path)
    path = os.path.join(root, "sys/devices/system/node/node0/cpulist")
    os.remove(path)
    os.mkdir(path)
    with pytest.raises(SysfsError, match="cannot read %s" % re.escape(path)):
        sysfs.read_host(root)


def failing_open(monkeypatch, target, err):
    real_open = os.open

    def fake_open(path, flags, *args, **kwargs):
        if os.fspath(path) == target:
            raise OSError(err, os.strerror(err), path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(sysfs.os, "open", fake_open)


@pytest.mark.parametrize("err", [errno.EACCES, errno.EIO])
def test_unreadable_node_cpulist_raises(tmp_path, monkeypatch, err):
    root = simple_tree(tmp_path)
    path = os.path.join(root, "sys/devices/system/node/node1/cpulist")
    failing_open(monkeypatch, path, err)
    with pytest.raises(SysfsError, match="cannot read %s: %s" % (re.escape(path), re.escape(os.strerror(err)))):
        sysfs.read_host(root)


def test_unreadable_thread_siblings_raises(tmp_path, monkeypatch):
    root = simple_tree(tmp_path)
    path = os.path.join(root, "sys/devices/system/cpu/cpu2/topology/thread_siblings_list")
    failing_open(monkeypatch, path, errno.EIO)
    with pytest.raises(SysfsError, match=re.escape(path)):
        sysfs.read_host(root)


@pytest.mark.parametrize("name, text", [("thread_siblings_list", "2;3\n"), ("core_id", "two\n"),
                                        ("physical_package_id", "\n")])
def test_garbage_cpu_topology_raises(tmp_path, name, text):
    root = simple_tree(tmp_path)
    path = os.path.join(root, "sys/devices/system/cpu/cpu0/topology", name)
    with open(path, "w") as handle:
        handle.write(text)
    with pytest.raises(SysfsError, match=re.escape(path)):
        sysfs.read_host(root)


def test_overlapping_node_cpulists_raise(tmp_path):
    root = simple_tree(tmp_path, nodes=[{"id": 0, "cpus": "0-4"}, {"id": 1, "cpus": "4-7"}])
    with pytest.raises(SysfsError, match="CPU 4 is listed by both node0 and node1"):
        sysfs.read_host(root)


@pytest.mark.parametrize("err", [errno.EACCES, errno.EIO])
def test_unreadable_pci_numa_node_warns(tmp_path, monkeypatch, err):
    root = simple_tree(tmp_path)
    path = os.path.join(root, "sys/bus/pci/devices/0000:18:00.0/numa_node")
    failing_open(monkeypatch, path, err)
    host = sysfs.read_host(root)
    gpu = by_id(host, "0000:18:00.0")
    assert (gpu["numa_node"], gpu["raw_numa_node"]) == (None, None)
    assert gpu["local_cpulist"] == "4-7"  # the rest of the device still read
    assert host["warnings"] == ["cannot read %s: %s; value treated as unknown" % (path, os.strerror(err))]


def test_garbage_numa_node_warns_and_is_none(tmp_path):
    root = simple_tree(tmp_path)
    path = os.path.join(root, "sys/bus/pci/devices/0000:18:00.0/numa_node")
    with open(path, "w") as handle:
        handle.write("one\n")
    host = sysfs.read_host(root)
    gpu = by_id(host, "0000:18:00.0")
    assert (gpu["numa_node"], gpu["raw_numa_node"]) == (None, None)
    assert host["warnings"] == ["%s holds 'one', not an integer; value treated as unknown" % path]


def test_numa_node_of_unknown_node_warns(tmp_path):
    root = simple_tree(tmp_path)
    path = os.path.join(root, "sys/bus/pci/devices/0000:18:00.0/numa_node")
    with open(path, "w") as handle:
        handle.write("7\n")
    host = sysfs.read_host(root)
    gpu = by_id(host, "0000:18:00.0")
    assert (gpu["numa_node"], gpu["raw_numa_node"]) == (None, 7)
    assert len(host["warnings"]) == 1 and path in host["warnings"][0] and "not a NUMA node" in host["warnings"][0]


@pytest.mark.parametrize(
    "relpath, text, field, expected",
    [
        ("sys/bus/pci/devices/0000:18:00.0/vendor", "nvidia\n", "vendor", None),
        ("sys/bus/pci/devices/0000:18:00.0/class", "3D\n", "class", None),
        ("sys/bus/pci/devices/0000:18:00.0/max_link_width", "x16\n", "max_link_width", None),
        ("sys/bus/pci/devices/0000:18:00.0/local_cpulist", "4-\n", "local_cpulist", None),
    ],
)
def test_garbage_pci_attributes_warn(tmp_path, relpath, text, field, expected):
    root = simple_tree(tmp_path)
    path = os.path.join(root, relpath)
    with open(path, "w") as handle:
        handle.write(text)
    host = sysfs.read_host(root)
    assert by_id(host, "0000:18:00.0")[field] == expected
    assert by_id(host, "0000:18:00.0")["numa_node"] == 1
    assert len(host["warnings"]) == 1 and path in host["warnings"][0]


def test_garbage_distance_and_unreadable_meminfo_warn(tmp_path, monkeypatch):
    root = simple_tree(tmp_path)
    distance = os.path.join(root, "sys/devices/system/node/node0/distance")
    with open(distance, "w") as handle:
        handle.write("10 twenty\n")
    meminfo = os.path.join(root, "sys/devices/system/node/node1/meminfo")
    failing_open(monkeypatch, meminfo, errno.EIO)
    host = sysfs.read_host(root)
    assert host["numa_nodes"][0]["distances"] == []
    assert host["numa_nodes"][1]["memory_total_bytes"] is None
    assert host["numa_nodes"][0]["cpus"] == "0-3"
    assert len(host["warnings"]) == 2
    assert any(distance in w for w in host["warnings"]) and any(meminfo in w for w in host["warnings"])


def test_garbage_numa_balancing_warns(tmp_path):
    root = simple_tree(tmp_path)
    path = os.path.join(root, "proc/sys/kernel/numa_balancing")
    with open(path, "w") as handle:
        handle.write("on\n")
    host = sysfs.read_host(root)
    assert host["numa_balancing"] is None
    assert host["warnings"] == ["%s holds 'on', not a non-negative integer; value treated as unknown" % path]


def test_unlistable_netdev_dir_warns(tmp_path, monkeypatch):
    root = simple_tree(tmp_path)
    target = os.path.join(root, "sys/bus/pci/devices/0000:19:00.0/infiniband")
    real_listdir = os.listdir

    def fake_listdir(path="."):
        if os.fspath(path) == target:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_listdir(path)

    monkeypatch.setattr(sysfs.os, "listdir", fake_listdir)
    host = sysfs.read_host(root)
    assert by_id(host, "0000:19:00.0")["rdma"] == []
    assert len(host["warnings"]) == 1 and target in host["warnings"][0]


# -- helpers -----------------------------------------------------------------


@pytest.mark.parametrize(
    "speed, gen",
    [
        ("2.5 GT/s PCIe", 1),
        ("5.0 GT/s PCIe", 2),
        ("8.0 GT/s PCIe", 3),
        ("16.0 GT/s PCIe", 4),
        ("32.0 GT/s PCIe", 5),
        ("64.0 GT/s PCIe", 6),
        ("8 GT/s", 3),
        ("2.5 GT/s", 1),
        ("Unknown", None),
        ("", None),
        ("128.0 GT/s PCIe", None),
        (None, None),
        (32, None),
    ],
)
def test_pcie_gen_from_speed(speed, gen):
    assert sysfs_pci.pcie_gen_from_speed(speed) == gen


def test_function_helpers_by_class(tmp_path):
    pci = [
        dict(bdf="0000:01:00.0", vendor="0x10de", device="0x2330", numa_node=0, **{"class": "0x030200"}),
        dict(bdf="0000:02:00.0", vendor="0x10de", device="0x1eb8", numa_node=0, **{"class": "0x030000"}),
        dict(bdf="0000:02:00.1", vendor="0x10de", device="0x10f8", numa_node=0, **{"class": "0x040300"}),
        dict(bdf="0000:03:00.0", vendor="0x10de", device="0x22a3", numa_node=0, **{"class": "0x068000"}),
        dict(bdf="0000:04:00.0", vendor="0x15b3", device="0xa2dc", numa_node=0, **{"class": "0x020000"}),
        dict(bdf="0000:04:00.1", vendor="0x15b3", device="0x1021", numa_node=0, **{"class": "0x020700"}),
        dict(bdf="0000:05:00.0", vendor="0x8086", device="0x1234", numa_node=0, **{"class": "0x028000"}),
        dict(bdf="0000:06:00.0", vendor="0x144d", device="0xa80a", numa_node=0, **{"class": "0x010802"}),
        dict(bdf="0000:07:00.0", vendor="0x8086", device="0x2822", numa_node=0, **{"class": "0x010601"}),
        # AMD Instinct MI210 (display controller class) and MI300X (processing accelerator): GPUs; an AMD VGA
        # controller (an APU's) is not.
        dict(bdf="0000:08:00.0", vendor="0x1002", device="0x740f", numa_node=0, **{"class": "0x038000"}),
        dict(bdf="0000:09:00.0", vendor="0x1002", device="0x74a1", numa_node=0, **{"class": "0x120000"}),
        dict(bdf="0000:0a:00.0", vendor="0x1002", device="0x164e", numa_node=0, **{"class": "0x030000"}),
    ]
    host = sysfs.read_host(factory.build_tree(tmp_path, [{"id": 0, "cpus": "0-1"}], pci=pci))
    assert [d["pci_bus_id"] for d in sysfs_pci.gpu_functions(host)] == ["0000:01:00.0", "0000:02:00.0", "0000:08:00.0",
                                                                     "0000:09:00.0"]
    assert [d["pci_bus_id"] for d in sysfs_pci.nic_functions(host)] == ["0000:04:00.0", "0000:04:00.1", "0000:05:00.0"]
    assert [d["pci_bus_id"] for d in sysfs_pci.nvme_functions(host)] == ["0000:06:00.0"]


def test_factory_cpumask_matches_kernel_format():
    assert factory.cpumask(range(16), 16) == "ffff"
    assert factory.cpumask(range(48, 96), 192) == "00000000,00000000,00000000,ffffffff,ffff0000,00000000"
    assert factory.cpumask([], 144) == "0000,00000000,00000000,00000000,00000000"


# -- reads only what it needs ------------------------------------------------


def test_does_not_walk_unrelated_sysfs(tmp_path, monkeypatch):
    root = factory.two_socket_8gpu_ht(tmp_path)
    # decoys a full walk would touch
    for decoy in ("sys/class/net/eth0", "sys/devices/system/cpu/cpu0/cache/index0",
                  "sys/devices/system/node/node0/hugepages/hugepages-2048kB", "sys/kernel/mm"):
        os.makedirs(os.path.join(root, decoy))
    touched = []
    real_open, real_listdir = os.open, os.listdir

    def spy_open(path, flags, *args, **kwargs):
        touched.append(os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    def spy_listdir(path="."):
        touched.append(os.fspath(path))
        return real_listdir(path)

    monkeypatch.setattr(sysfs.os, "open", spy_open)
    monkeypatch.setattr(sysfs.os, "listdir", spy_listdir)
    sysfs.read_host(root)
    relative = [os.path.relpath(p, root) for p in touched]
    assert not [p for p in relative if p.startswith(("sys/class", "sys/kernel")) or "/cache" in p
                or ("hugepages" in p and not p.endswith(("/hugepages", "/nr_hugepages")))]
    # the HugeTLB pools of each node are listed (capacity), nothing else under them is read
    assert sum(p.endswith("/hugepages") for p in relative) == 2
    # siblings share a core, CPUs of a package share its id: 96 cores, 2 packages
    assert sum(p.endswith("/thread_siblings_list") for p in relative) == 96
    assert sum(p.endswith("/physical_package_id") for p in relative) == 2


# -- bounded reads ---------------------------------------------------------------


def test_read_bounded_reads_a_regular_file_up_to_the_cap(tmp_path):
    path = tmp_path / "attr"
    path.write_bytes(b"x" * sysfs_reader.MAX_ATTRIBUTE_BYTES)
    assert len(bounded.read_bounded(str(path))) == sysfs_reader.MAX_ATTRIBUTE_BYTES
    path.write_bytes(b"x" * (sysfs_reader.MAX_ATTRIBUTE_BYTES + 1))
    with pytest.raises(OSError) as err:
        bounded.read_bounded(str(path))
    assert err.value.errno == errno.EFBIG and "larger than 65536 bytes" in err.value.strerror


@pytest.mark.parametrize("make, kind", [
    (lambda p: os.mkfifo(p), "a FIFO"),
    (lambda p: os.mkdir(p), "a directory"),
    (lambda p: os.symlink("/dev/zero", p), "a symbolic link (to /dev/zero)"),
    (lambda p: os.symlink(os.path.basename(p), p), "a symbolic link"),
])
def test_read_bounded_opens_nothing_but_regular_files(tmp_path, monkeypatch, make, kind):
    path = str(tmp_path / "attr")
    make(path)
    opened = []
    real_open = os.open
    monkeypatch.setattr(sysfs.os, "open", lambda p, *a, **k: opened.append(p) or real_open(p, *a, **k))
    with pytest.raises(OSError) as err:
        bounded.read_bounded(path)
    assert kind in err.value.strerror and "read only as a regular file" in err.value.strerror
    assert opened == []


def test_read_bounded_follows_links_for_named_files_but_never_into_dev(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("hello")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    assert bounded.read_bounded(str(link), follow_symlinks=True) == b"hello"
    zero = tmp_path / "zero"
    zero.symlink_to("/dev/zero")
    with pytest.raises(OSError, match="character device"):
        bounded.read_bounded(str(zero), follow_symlinks=True)
    with pytest.raises(OSError, match="symbolic link"):
        bounded.read_bounded(str(link))


def test_a_clean_tree_loses_nothing(tmp_path):
    assert sysfs.read_host(simple_tree(tmp_path))["lost"] == []
    assert sysfs.read_host(H200_ROOT)["lost"] == []


def test_kernel_without_numa_is_not_a_loss(tmp_path):
    # Without NUMA the kernel writes numa_node -1 for every device.
    pci = [dict(bdf="0000:18:00.0", vendor="0x10de", device="0x2330", numa_node=-1, **{"class": "0x030200"})]
    root = simple_tree(tmp_path, numa=False, pci=pci)
    host = sysfs.read_host(root)
    assert host["lost"] == [] and any("kernel without NUMA" in w for w in host["warnings"])


@pytest.mark.parametrize("relpath, damage, needle", [
    ("sys/bus/pci/devices/0000:18:00.0/class", lambda p: os.mkfifo(p), "FIFO"),
    ("sys/bus/pci/devices/0000:18:00.0/class", lambda p: open(p, "wb").write(b"\x00\xff\xfe"), "hex"),
    ("sys/bus/pci/devices/0000:18:00.0/vendor", lambda p: os.symlink("/dev/zero", p), "/dev/zero"),
    ("sys/bus/pci/devices/0000:18:00.0/local_cpus", lambda p: open(p, "w").write("f" * 400000), "65536 bytes"),
])
def test_a_gpu_lost_to_an_unreadable_attribute_is_recorded(tmp_path, relpath, damage, needle):
    root = simple_tree(tmp_path)
    path = os.path.join(root, relpath)
    if relpath.endswith("local_cpus"):
        os.remove(os.path.join(root, "sys/bus/pci/devices/0000:18:00.0/local_cpulist"))
    os.remove(path)
    damage(path)
    host = sysfs.read_host(root)
    assert host["lost"] == [path]
    assert [w for w in host["warnings"] if path in w and needle in w]


def test_a_pci_device_link_loop_loses_the_device_with_one_warning(tmp_path):
    root = simple_tree(tmp_path)
    link = os.path.join(root, "sys/bus/pci/devices/0000:18:00.0")
    os.remove(link)
    os.symlink("0000:18:00.0", link)
    host = sysfs.read_host(root)
    assert [d["pci_bus_id"] for d in host["pci"]] == ["0000:19:00.0"]
    assert host["lost"] == [link] and len(host["warnings"]) == 1 and "symbolic links" in host["warnings"][0]


def test_entries_with_a_trailing_newline_are_not_bus_ids(tmp_path):
    root = simple_tree(tmp_path)
    os.mkdir(os.path.join(root, "sys/bus/pci/devices/0000:1a:00.0\n"))
    host = sysfs.read_host(root)
    assert [d["pci_bus_id"] for d in host["pci"]] == ["0000:18:00.0", "0000:19:00.0"]
    assert "'0000:1a:00.0\\n' is not a PCI bus id" in host["warnings"][0]


@pytest.mark.parametrize("relpath, text", [
    ("sys/devices/system/node/node0/distance", "10 \u00b2\n"),
    ("sys/bus/pci/devices/0000:18:00.0/numa_node", "9" * 5000 + "\n"),
    ("sys/bus/pci/devices/0000:18:00.0/numa_node", "\u0661\n"),
    ("sys/devices/system/node/node1/meminfo", "Node 1 MemTotal: %s kB\nNode 1 MemFree: 1 kB\n" % ("9" * 5000)),
    ("sys/bus/pci/devices/0000:18:00.0/local_cpulist", "4-" + "7" * 5000 + "\n"),
])
def test_numbers_python_cannot_or_should_not_parse_are_warnings(tmp_path, relpath, text):
    root = simple_tree(tmp_path)
    path = os.path.join(root, relpath)
    with open(path, "w") as handle:
        handle.write(text)
    host = sysfs.read_host(root)
    assert host["lost"] == [path]
    assert all(len(w) < 1000 for w in host["warnings"])


@pytest.mark.parametrize("name", ["vendor", "device", "class"])
def test_a_missing_identity_attribute_is_a_loss(tmp_path, name):
    root = simple_tree(tmp_path)
    path = os.path.join(root, "sys/bus/pci/devices/0000:18:00.0", name)
    os.remove(path)
    host = sysfs.read_host(root)
    assert host["lost"] == [path]
    assert host["warnings"] == ["%s is missing; every PCI function has one, so the device cannot be identified" % path]


@pytest.mark.parametrize("relpath, parent", [
    ("sys/devices/system/cpu/cpu8192", "sys/devices/system/cpu"),
    ("sys/devices/system/cpu/cpu007", "sys/devices/system/cpu"),
    ("sys/devices/system/node/node1024", "sys/devices/system/node"),
])
def test_directory_ids_past_the_kernel_limits_are_skipped_with_a_warning(tmp_path, relpath, parent):
    root = simple_tree(tmp_path)
    os.makedirs(os.path.join(root, relpath))
    host = sysfs.read_host(root)
    assert host["lost"] == [os.path.join(root, parent)]
    assert "directory the kernel writes" in host["warnings"][0] and os.path.basename(relpath) in host["warnings"][0]
    assert [n["id"] for n in host["numa_nodes"]] == [0, 1] and len(host["cpus"]) == 8
