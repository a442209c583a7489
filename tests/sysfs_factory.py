"""Synthetic sysfs/procfs trees modelled on real GPU hosts.

Each builder writes, under a directory it is given (pytest's ``tmp_path``),
the files ``gpunuma.sysfs.read_host`` reads, laid out as the kernel lays them
out, and returns that directory as a string. ``build_tree`` is the generic
builder; the named builders call it with layouts taken from real machines
(the CPU numbering comes from the published ``lscpu`` / ``numactl`` outputs
kept in ``tests/fixtures/hosts/``).

By default PCI devices are written as on a live host: a real directory under
``sys/devices/pci<domain>:<bus>/<bridges...>/<bdf>`` and a relative symlink
``sys/bus/pci/devices/<bdf>`` to it. ``symlinks=False`` writes the layout of a
captured support bundle instead: plain directories holding ``_realpath``.
"""

import os

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, parse_cpulist

__all__ = [
    "build_tree",
    "cpumask",
    "two_socket_8gpu_ht",
    "amd_nps4_8node",
    "grace_cpuless",
    "gb200_34node",
    "single_socket",
    "vm_numa_minus_one",
    "no_gpu",
]

NVIDIA = "0x10de"
MELLANOX = "0x15b3"
GIB_KB = 1024 * 1024  # kB in a GiB

BRIDGE_VENDOR = "0x10b5"  # Broadcom/PLX PCIe switch, as on HGX baseboards
BRIDGE_DEVICE = "0xc010"
BRIDGE_CLASS = "0x060400"


def _cpuset(value):
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return parse_cpulist(value)
    return frozenset(int(c) for c in value)


def cpumask(cpus, nbits):
    """A CPU set as the kernel prints a cpumask of ``nbits`` bits (``%*pb``).

    32-bit words, most significant first, comma separated; the first word is
    printed with only as many hex digits as its bits need (``ffff`` for 16
    CPUs, ``0000ffff,ffffffff`` for 48 of 64).
    """
    nbits = max(int(nbits), 1)
    value = 0
    for cpu in cpus:
        value |= 1 << cpu
    nwords = (nbits + 31) // 32
    words = []
    for index in range(nwords - 1, -1, -1):
        word = (value >> (32 * index)) & 0xFFFFFFFF
        bits = min(32, nbits - 32 * index) if index == nwords - 1 else 32
        words.append("%0*x" % ((bits + 3) // 4, word))
    return ",".join(words)


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)


def _default_distances(count):
    return [[10 if i == j else 20 for j in range(count)] for i in range(count)]


def build_tree(
    root,
    nodes,
    distances=None,
    cpus=None,
    pci=(),
    numa_balancing=1,
    symlinks=True,
    numa=True,
    online=None,
    l3=None,
):
    """Write a sysfs/procfs tree under ``root`` and return ``root`` (a str).

    ``nodes``: ``[{"id": 0, "cpus": [0, 1] or "0-1", "mem_kb": int,
    "free_kb": int, "hugepages": {size_kb: count}}]``; ``distances``: SLIT rows in the order of ``nodes``
    (default 10 on the diagonal, 20 elsewhere); ``cpus``: ``{cpu: (package,
    core, siblings)}`` (siblings a list or CPU list string; default: one
    package 0, every CPU its own core); ``online``: the online CPUs (default
    every CPU of ``nodes`` and ``cpus``); ``numa_balancing``: the
    ``kernel.numa_balancing`` value, ``None`` to leave the file out;
    ``numa=False`` leaves ``sys/devices/system/node`` out (kernel without
    NUMA); ``l3``: ``{cpu: CPU list}`` written as ``cache/index3`` (level 3,
    ``shared_cpu_list``), none by default.

    ``pci``: ``[{"bdf": "0000:18:00.0", "vendor", "device", "class",
    "numa_node" (default -1), "local_cpus" (default: the CPUs of that node,
    or every online CPU for -1), "max_link_speed", "max_link_width",
    "current_link_speed", "current_link_width" (left out when absent),
    "netdevs", "rdma", "nvme" (names), "virtio" (N: netdevs go under
    ``virtio<N>/net/`` as for virtio-net), "msi" (N: ``msi_irqs/`` entries),
    "parents" (bridge bdfs from the root
    port down; bridges not listed themselves are created with class
    0x060400)}]``.
    """
    root = str(root)
    sys_dir = os.path.join(root, "sys")
    node_root = os.path.join(sys_dir, "devices", "system", "node")
    cpu_root = os.path.join(sys_dir, "devices", "system", "cpu")

    node_cpus = {node["id"]: _cpuset(node.get("cpus")) for node in nodes}
    all_cpus = set()
    for cpuset in node_cpus.values():
        all_cpus |= cpuset
    if cpus:
        all_cpus |= set(cpus)
    online_set = _cpuset(online) if online is not None else frozenset(all_cpus)
    nbits = (max(all_cpus) + 1) if all_cpus else 1

    if distances is None:
        distances = _default_distances(len(nodes))

    # NUMA nodes
    if numa:
        for index, node in enumerate(nodes):
            node_dir = os.path.join(node_root, "node%d" % node["id"])
            cpuset = node_cpus[node["id"]]
            _write(os.path.join(node_dir, "cpulist"), format_cpulist(cpuset) + "\n")
            _write(os.path.join(node_dir, "cpumap"), cpumask(cpuset, nbits) + "\n")
            total = node.get("mem_kb", 0)
            free = node.get("free_kb", 0)
            nid = node["id"]
            _write(
                os.path.join(node_dir, "meminfo"),
                "Node %d MemTotal:       %d kB\n"
                "Node %d MemFree:        %d kB\n"
                "Node %d MemUsed:        %d kB\n"
                "Node %d HugePages_Total:     0\n" % (nid, total, nid, free, nid, total - free, nid),
            )
            _write(os.path.join(node_dir, "distance"), " ".join(str(d) for d in distances[index]) + "\n")
            for size_kb, count in (node.get("hugepages") or {}).items():
                _write(os.path.join(node_dir, "hugepages", "hugepages-%dkB" % size_kb, "nr_hugepages"), "%d\n" % count)
        ids = [node["id"] for node in nodes]
        _write(os.path.join(node_root, "online"), format_cpulist(ids) + "\n")
        _write(os.path.join(node_root, "possible"), format_cpulist(ids) + "\n")
        _write(os.path.join(node_root, "has_cpu"), format_cpulist(n for n in ids if node_cpus[n]) + "\n")
        _write(
            os.path.join(node_root, "has_memory"),
            format_cpulist(node["id"] for node in nodes if node.get("mem_kb")) + "\n",
        )

    # CPUs
    _write(os.path.join(cpu_root, "online"), format_cpulist(online_set) + "\n")
    _write(os.path.join(cpu_root, "possible"), format_cpulist(all_cpus) + "\n")
    _write(os.path.join(cpu_root, "present"), format_cpulist(all_cpus) + "\n")
    layout = {cpu: (cpus[cpu] if cpus and cpu in cpus else (0, cpu, [cpu])) for cpu in all_cpus}
    package_cpus = {}
    for cpu in online_set:
        package_cpus.setdefault(layout[cpu][0], set()).add(cpu)
    for cpu in sorted(all_cpus):
        cpu_dir = os.path.join(cpu_root, "cpu%d" % cpu)
        os.makedirs(cpu_dir, exist_ok=True)
        if cpu not in online_set:
            # The kernel removes topology/ when a CPU goes offline.
            continue
        package, core, siblings = layout[cpu]
        topo = os.path.join(cpu_dir, "topology")
        members = format_cpulist(package_cpus[package]) + "\n"
        _write(os.path.join(topo, "physical_package_id"), "%d\n" % package)
        _write(os.path.join(topo, "core_id"), "%d\n" % core)
        _write(os.path.join(topo, "thread_siblings_list"), format_cpulist(_cpuset(siblings)) + "\n")
        _write(os.path.join(topo, "package_cpus_list"), members)
        _write(os.path.join(topo, "core_siblings_list"), members)
        if l3 and cpu in l3:
            cache = os.path.join(cpu_dir, "cache", "index3")
            _write(os.path.join(cache, "level"), "3\n")
            _write(os.path.join(cache, "shared_cpu_list"), format_cpulist(_cpuset(l3[cpu])) + "\n")

    # PCI
    _write_pci(sys_dir, list(pci), node_cpus, online_set, nbits, symlinks)

    # procfs
    total_kb = sum(node.get("mem_kb", 0) for node in nodes)
    free_kb = sum(node.get("free_kb", 0) for node in nodes)
    _write(
        os.path.join(root, "proc", "meminfo"),
        "MemTotal:       %d kB\nMemFree:        %d kB\nMemAvailable:   %d kB\n" % (total_kb, free_kb, free_kb),
    )
    if numa_balancing is not None:
        _write(os.path.join(root, "proc", "sys", "kernel", "numa_balancing"), "%d\n" % numa_balancing)
    return root


def _write_pci(sys_dir, devices, node_cpus, online_set, nbits, symlinks):
    by_bdf = {dev["bdf"]: dev for dev in devices}
    # Bridges named as parents but not given are created like their child.
    for dev in list(devices):
        for bridge in dev.get("parents", ()):
            if bridge not in by_bdf:
                by_bdf[bridge] = {
                    "bdf": bridge,
                    "vendor": BRIDGE_VENDOR,
                    "device": BRIDGE_DEVICE,
                    "class": BRIDGE_CLASS,
                    "numa_node": dev.get("numa_node", -1),
                    "local_cpus": dev.get("local_cpus"),
                    "parents": dev["parents"][: dev["parents"].index(bridge)],
                }
    bus_root = os.path.join(sys_dir, "bus", "pci", "devices")
    os.makedirs(bus_root, exist_ok=True)
    for bdf, dev in by_bdf.items():
        chain = list(dev.get("parents", ())) + [bdf]
        domain, bus = chain[0].split(":")[:2]
        rel = os.path.join("devices", "pci%s:%s" % (domain, bus), *chain)
        if symlinks:
            dev_dir = os.path.join(sys_dir, rel)
            os.makedirs(dev_dir, exist_ok=True)
            os.symlink(os.path.join("..", "..", "..", rel), os.path.join(bus_root, bdf))
        else:
            dev_dir = os.path.join(bus_root, bdf)
            os.makedirs(dev_dir, exist_ok=True)
            _write(os.path.join(dev_dir, "_realpath"), "/sys/%s\n" % rel)

        numa_node = dev.get("numa_node", -1)
        local = dev.get("local_cpus")
        if local is None:
            local = node_cpus.get(numa_node, frozenset()) if numa_node >= 0 else online_set
        local = _cpuset(local)
        _write(os.path.join(dev_dir, "vendor"), dev["vendor"] + "\n")
        _write(os.path.join(dev_dir, "device"), dev["device"] + "\n")
        _write(os.path.join(dev_dir, "class"), dev["class"] + "\n")
        _write(os.path.join(dev_dir, "numa_node"), "%d\n" % numa_node)
        _write(os.path.join(dev_dir, "local_cpulist"), format_cpulist(local) + "\n")
        _write(os.path.join(dev_dir, "local_cpus"), cpumask(local, nbits) + "\n")
        for attr in ("max_link_speed", "max_link_width", "current_link_speed", "current_link_width", "unique_id",
                     "current_compute_partition", "current_memory_partition"):
            if dev.get(attr) is not None:
                _write(os.path.join(dev_dir, attr), "%s\n" % dev[attr])
        # virtio-net puts its netdevs under virtio<N>/net/, not net/.
        net = "net" if dev.get("virtio") is None else os.path.join("virtio%d" % dev["virtio"], "net")
        for sub, key in ((net, "netdevs"), ("infiniband", "rdma"), ("nvme", "nvme")):
            for name in dev.get(key, ()):
                os.makedirs(os.path.join(dev_dir, sub, name), exist_ok=True)
        for vector in range(dev.get("msi", 0)):
            _write(os.path.join(dev_dir, "msi_irqs", str(1000 + vector)), "msix\n")


def _link(gen_speed, width):
    return {
        "max_link_speed": gen_speed,
        "max_link_width": width,
        "current_link_speed": gen_speed,
        "current_link_width": width,
    }


GEN4 = "16.0 GT/s PCIe"
GEN5 = "32.0 GT/s PCIe"


def _bus(bdf):
    return int(bdf.split(":")[1], 16)


def _with_bus(bdf, bus, dev=0, fn=0):
    return "%s:%02x:%02x.%d" % (bdf.split(":")[0], bus, dev, fn)


def _switch_parents(gpu_bdf):
    """Root port, switch upstream and downstream port above a GPU at bus B (buses B-3..B-1)."""
    bus = _bus(gpu_bdf)
    return [_with_bus(gpu_bdf, bus - 3, 1), _with_bus(gpu_bdf, bus - 2), _with_bus(gpu_bdf, bus - 1)]


# -- named machines ----------------------------------------------------------


TWO_SOCKET_GPUS = [
    ("0000:18:00.0", 0),
    ("0000:2a:00.0", 0),
    ("0000:3a:00.0", 0),
    ("0000:5d:00.0", 0),
    ("0000:9a:00.0", 1),
    ("0000:ab:00.0", 1),
    ("0000:ba:00.0", 1),
    ("0000:db:00.0", 1),
]


def two_socket_8gpu_ht(root):
    """HGX H100 8-GPU server with two 48-core Xeons (Sapphire Rapids 8468 class).

    2 sockets x 48 cores x 2 threads, numbered as Linux numbers Intel
    hyperthreads: node 0 = CPUs 0-47 and 96-143, node 1 = 48-95 and 144-191
    (CPU c and c+96 are siblings); 1 TiB per node, SLIT 10/21.
    8 H100 SXM5 GPUs (0x10de:0x2330, class 0x030200, PCIe Gen5 x16), four per
    socket, each behind its own PCIe switch (root port, upstream, downstream
    port) shared with one ConnectX-7 InfiniBand NIC (0x15b3:0x1021, class
    0x020700, ``mlx5_0``..``mlx5_7``, IPoIB netdev) on the next bus.
    One Intel E810 Ethernet NIC (class 0x020000, netdev ``ens9f0``) on node 0
    and two Samsung PM9A3 NVMe drives (class 0x010802) on node 1.
    ``kernel.numa_balancing`` = 1, as shipped by most distributions.
    """
    nodes = [
        {"id": 0, "cpus": list(range(0, 48)) + list(range(96, 144)), "mem_kb": 1024 * GIB_KB, "free_kb": 1000 * GIB_KB},
        {"id": 1, "cpus": list(range(48, 96)) + list(range(144, 192)), "mem_kb": 1024 * GIB_KB, "free_kb": 990 * GIB_KB},
    ]
    cpus = {}
    for cpu in range(192):
        first = cpu % 96
        cpus[cpu] = (first // 48, first % 48, [first, first + 96])
    pci = []
    for index, (bdf, node) in enumerate(TWO_SOCKET_GPUS):
        parents = _switch_parents(bdf)
        nic = _with_bus(bdf, _bus(bdf) + 1)
        pci.append(dict(bdf=bdf, vendor=NVIDIA, device="0x2330", numa_node=node, parents=parents,
                        **{"class": "0x030200"}, **_link(GEN5, 16)))
        pci.append(dict(bdf=nic, vendor=MELLANOX, device="0x1021", numa_node=node,
                        parents=parents[:2] + [_with_bus(bdf, _bus(bdf) - 1, 1)],
                        rdma=["mlx5_%d" % index], netdevs=["ibp%ds0" % _bus(nic)],
                        **{"class": "0x020700"}, **_link(GEN5, 16)))
    pci.append(dict(bdf="0000:0b:00.0", vendor="0x8086", device="0x1593", numa_node=0,
                    parents=["0000:0a:01.0"], netdevs=["ens9f0"],
                    **{"class": "0x020000"}, **_link(GEN4, 8)))
    for index, bdf in enumerate(("0000:c1:00.0", "0000:c2:00.0")):
        pci.append(dict(bdf=bdf, vendor="0x144d", device="0xa80a", numa_node=1,
                        parents=["0000:c0:0%d.0" % (index + 1)], nvme=["nvme%d" % index],
                        **{"class": "0x010802"}, **_link(GEN4, 4)))
    return build_tree(root, nodes, distances=[[10, 21], [21, 10]], cpus=cpus, pci=pci, numa_balancing=1)


# DGX A100: GPU bus ids, their NUMA node, and the two ConnectX-6 ports
# sharing each GPU pair's switch (nvidia-smi topo -m: PXB).
DGX_A100_GPUS = [
    ("0000:07:00.0", 3),
    ("0000:0f:00.0", 3),
    ("0000:47:00.0", 1),
    ("0000:4e:00.0", 1),
    ("0000:87:00.0", 7),
    ("0000:90:00.0", 7),
    ("0000:b7:00.0", 5),
    ("0000:bd:00.0", 5),
]
DGX_A100_NICS = [
    ("0000:0c:00.0", 3, "mlx5_0"),
    ("0000:12:00.0", 3, "mlx5_1"),
    ("0000:4b:00.0", 1, "mlx5_2"),
    ("0000:54:00.0", 1, "mlx5_3"),
    ("0000:8d:00.0", 7, "mlx5_4"),
    ("0000:94:00.0", 7, "mlx5_5"),
    ("0000:ba:00.0", 5, "mlx5_6"),
    ("0000:cc:00.0", 5, "mlx5_7"),
    ("0000:e1:00.0", 6, "mlx5_8"),
    ("0000:e1:00.1", 6, "mlx5_9"),
]


def amd_nps4_8node(root):
    """DGX A100: 2x AMD EPYC 7742 (64 cores, SMT 2) in NPS4 mode, 8 NUMA nodes.

    Node k holds cores 16k..16k+15 and their siblings 128+16k..128+16k+15
    (``dgxa100-epyc7742-nps4.lscpu.txt``); nodes 0-3 are socket 0, 4-7
    socket 1; SLIT 10 local, 12 same socket, 32 other socket; 128 GiB per node.
    8 A100-SXM4-40GB (0x10de:0x20b0, class 0x030200, PCIe Gen4 x16) on nodes
    3,3,1,1,7,7,5,5, as ``nvidia-smi topo -m`` reports on that host, each pair
    sharing a PCIe switch with two ConnectX-6 InfiniBand ports (mlx5_0..7);
    mlx5_8/mlx5_9 are the two ports of the storage NIC on node 6.
    """
    nodes = []
    cpus = {}
    for node in range(8):
        first = list(range(16 * node, 16 * node + 16))
        nodes.append({"id": node, "cpus": first + [c + 128 for c in first],
                      "mem_kb": 128 * GIB_KB, "free_kb": (120 - node) * GIB_KB})
        for cpu in first:
            package = node // 4
            cpus[cpu] = (package, cpu % 64, [cpu, cpu + 128])
            cpus[cpu + 128] = (package, cpu % 64, [cpu, cpu + 128])
    distances = [[10 if i == j else 12 if i // 4 == j // 4 else 32 for j in range(8)] for i in range(8)]
    pci = []
    for index, (bdf, node) in enumerate(DGX_A100_GPUS):
        pair = index // 2
        switch = ["0000:%02x:01.0" % (_bus(DGX_A100_GPUS[2 * pair][0]) - 4),
                  "0000:%02x:00.0" % (_bus(DGX_A100_GPUS[2 * pair][0]) - 3)]
        pci.append(dict(bdf=bdf, vendor=NVIDIA, device="0x20b0", numa_node=node,
                        parents=switch + [_with_bus(bdf, _bus(bdf) - 1)],
                        **{"class": "0x030200"}, **_link(GEN4, 16)))
    for index, (bdf, node, name) in enumerate(DGX_A100_NICS):
        if index < 8:
            gpu_bus = _bus(DGX_A100_GPUS[2 * (index // 2)][0])
            parents = ["0000:%02x:01.0" % (gpu_bus - 4), "0000:%02x:00.0" % (gpu_bus - 3),
                       _with_bus(bdf, _bus(bdf) - 1)]
        else:
            parents = ["0000:e0:03.1"]
        pci.append(dict(bdf=bdf, vendor=MELLANOX, device="0x101b", numa_node=node, parents=parents,
                        rdma=[name], netdevs=["ibp%ds0f%s" % (_bus(bdf), bdf[-1])],
                        **{"class": "0x020700"}, **_link(GEN4, 16)))
    return build_tree(root, nodes, distances=distances, cpus=cpus, pci=pci, numa_balancing=1)


# An 8-GPU AMD Instinct MI300X host (device 0x74a1, PCI class 0x1200, Gen5 x16) on two EPYC sockets in NPS1:
# GPUs 0-3 on NUMA node 0 and 4-7 on node 1, as `rocm-smi --showtoponuma` prints it for such a host
# (ROCm/legacy-rocm-build#4740); the bus ids and unique_ids are this layout's own.
MI300X_GPUS = [("0000:%02x:00.0" % bus, 0 if i < 4 else 1, "%016x" % (0x5b4ac59a0da2a6a0 + i))
               for i, bus in enumerate((0x05, 0x15, 0x65, 0x75, 0x85, 0x95, 0xe5, 0xf5))]
AMD = "0x1002"


def mi300x_8gpu_2socket(root, gpus=None, compute_partition=None, numa_node=None):
    """2 sockets x 48 cores with SMT (96 CPUs a socket), NPS1 (one NUMA node a socket), 8 MI300X.

    The CPUs are laid out as a 48-core EPYC 9004 (six CCDs of eight cores, each CCD one L3 cache:
    ``cache/index3``), the CPU of AMD's MI300X reference platforms.

    ``gpus``: other ``(bus id, node, unique_id)`` triples (a published capture's); ``compute_partition``:
    amdgpu's ``current_compute_partition`` (``CPX`` ...) with ``current_memory_partition`` NPS1;
    ``numa_node``: every GPU's sysfs ``numa_node`` instead of its own (-1 as in VMs)."""
    gpus = gpus or MI300X_GPUS
    modes = {"current_compute_partition": compute_partition, "current_memory_partition": "NPS1"} \
        if compute_partition else {}
    nodes, cpus = [], {}
    for node in range(2):
        first = list(range(48 * node, 48 * node + 48))
        nodes.append({"id": node, "cpus": first + [c + 96 for c in first], "mem_kb": 768 * GIB_KB,
                      "free_kb": 700 * GIB_KB})
        for cpu in first:
            cpus[cpu] = (node, cpu % 48, [cpu, cpu + 96])
            cpus[cpu + 96] = (node, cpu % 48, [cpu, cpu + 96])
    l3 = {}
    for cpu in range(192):
        first = cpu % 96 // 8 * 8
        l3[cpu] = [c for c in range(first, first + 8)] + [c + 96 for c in range(first, first + 8)]
    pci = [dict(bdf=bdf, vendor=AMD, device="0x74a1", numa_node=node if numa_node is None else numa_node, unique_id=uid,
                parents=[_with_bus(bdf, _bus(bdf) - 1)], **{"class": "0x120000"}, **_link(GEN5, 16), **modes)
           for bdf, node, uid in gpus]
    return build_tree(root, nodes, distances=[[10, 32], [32, 10]], cpus=cpus, pci=pci, numa_balancing=1, l3=l3)


# The physical GPUs of the published MI300X CPX KFD capture (tests/fixtures/published/amd/kfd-mi300x-cpx-8gpu.json:
# location_id >> 8) and the KFD CPU node each links to.
CPX_DEVICES = {"0000:05:00.0": 0, "0000:27:00.0": 0, "0000:47:00.0": 0, "0000:65:00.0": 0,
               "0000:85:00.0": 1, "0000:a7:00.0": 1, "0000:c7:00.0": 1, "0000:e5:00.0": 1}
KFD_MI300X_CPX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "published", "amd",
                              "kfd-mi300x-cpx-8gpu.json")


def mi300x_cpx_host(root, numa_node=None):
    """The MI300X host of the published CPX KFD capture: mi300x_8gpu_2socket with the capture's eight GPUs
    (bus ids and CPU nodes), amdgpu's modes CPX/NPS1, and the capture's KFD tree (63 partitions)."""
    gpus = [(bus, node, "%016x" % (0x1000 + n)) for n, (bus, node) in enumerate(sorted(CPX_DEVICES.items()))]
    root = mi300x_8gpu_2socket(root, gpus=gpus, compute_partition="CPX", numa_node=numa_node)
    kfd_tree(root, KFD_MI300X_CPX)
    return root


def kfd_tree(root, bundle):
    """Write a published KFD topology capture (tests/fixtures/published/amd/kfd-*.json: ``files`` holds each
    ``nodes/...properties`` text) under ``root``/sys/class/kfd/kfd/topology; returns the document."""
    import json
    with open(bundle) as handle:
        doc = json.load(handle)
    base = os.path.join(root, "sys", "class", "kfd", "kfd", "topology")
    for rel, text in doc["files"].items():
        _write(os.path.join(base, rel), text)
    return doc


def _grace_distances(count, cpu_nodes):
    # As numactl shows on GH200: 10 local, 80 between a Grace CPU node and any
    # other node, 255 between CPU-less nodes; 40 between the two Grace CPUs
    # (an assumption for the 2-CPU layouts).
    rows = []
    for i in range(count):
        row = []
        for j in range(count):
            if i == j:
                row.append(10)
            elif i in cpu_nodes and j in cpu_nodes:
                row.append(40)
            elif i in cpu_nodes or j in cpu_nodes:
                row.append(80)
            else:
                row.append(255)
        rows.append(row)
    return rows


def grace_cpuless(root, superchips=1):
    """Grace Hopper (GH200) host: Grace CPU node(s) plus CPU-less memory nodes.

    ``superchips=1`` is the GH200 of ``gh200-9numa-hbm-node.numactl.txt``:
    node 0 = CPUs 0-71 (72 Neoverse-V2 cores, no SMT) with 490037 MB, node 1
    = the H100's 97280 MB of HBM (CPU-less), nodes 2-8 CPU-less and empty
    (reserved for MIG), with that file's SLIT. The GPU (0x10de:0x2342, class
    0x030200) is 0009:01:00.0 and its sysfs ``numa_node`` is 0, the Grace
    node, as on real hosts; its HBM node (1) is only visible through NVML.
    ``superchips=2`` is a dual GH200 board: CPU nodes 0 (0-71) and 1
    (72-143), HBM nodes 2 and 10, 16 CPU-less nodes in all, GPUs
    0009:01:00.0 (node 0) and 0019:01:00.0 (node 1).
    One ConnectX-7 per superchip in domain 0002 / 0012. GPU link attributes
    are left out: the GPU hangs off NVLink-C2C, and what its PCIe link files
    say on real hosts is not modelled.
    """
    if superchips not in (1, 2):
        raise ValueError("superchips must be 1 or 2, got %r" % (superchips,))
    mb_kb = 1024
    if superchips == 1:
        nodes = [{"id": 0, "cpus": "0-71", "mem_kb": 490037 * mb_kb, "free_kb": 484432 * mb_kb},
                 {"id": 1, "cpus": "", "mem_kb": 97280 * mb_kb, "free_kb": 97279 * mb_kb}]
        nodes += [{"id": n, "cpus": "", "mem_kb": 0, "free_kb": 0} for n in range(2, 9)]
        distances = [[10] + [80] * 8] + [[80] + [10 if i == j else 255 for j in range(1, 9)] for i in range(1, 9)]
        gpus = [("0009:01:00.0", 0)]
        nics = [("0002:01:00.0", 0, "mlx5_0")]
        cpu_ranges = [range(0, 72)]
    else:
        nodes = [{"id": 0, "cpus": "0-71", "mem_kb": 480 * GIB_KB, "free_kb": 470 * GIB_KB},
                 {"id": 1, "cpus": "72-143", "mem_kb": 480 * GIB_KB, "free_kb": 471 * GIB_KB}]
        for n in range(2, 18):
            hbm = n in (2, 10)
            nodes.append({"id": n, "cpus": "", "mem_kb": 95 * GIB_KB if hbm else 0,
                          "free_kb": 94 * GIB_KB if hbm else 0})
        distances = _grace_distances(18, {0, 1})
        gpus = [("0009:01:00.0", 0), ("0019:01:00.0", 1)]
        nics = [("0002:01:00.0", 0, "mlx5_0"), ("0012:01:00.0", 1, "mlx5_1")]
        cpu_ranges = [range(0, 72), range(72, 144)]
    cpus = {}
    for package, cpu_range in enumerate(cpu_ranges):
        for cpu in cpu_range:
            cpus[cpu] = (package, cpu - cpu_range[0], [cpu])
    pci = []
    for bdf, node in gpus:
        pci.append(dict(bdf=bdf, vendor=NVIDIA, device="0x2342", numa_node=node,
                        parents=[_with_bus(bdf, 0)], **{"class": "0x030200"}))
    for bdf, node, name in nics:
        pci.append(dict(bdf=bdf, vendor=MELLANOX, device="0x1021", numa_node=node,
                        parents=[_with_bus(bdf, 0)], rdma=[name], netdevs=["ibP%ds1s0" % int(bdf[:4], 16)],
                        **{"class": "0x020700"}, **_link(GEN5, 16)))
    return build_tree(root, nodes, distances=distances, cpus=cpus, pci=pci, numa_balancing=0)


GB200_GPUS = [("0008:01:00.0", 0, 2), ("0009:01:00.0", 0, 10), ("0018:01:00.0", 1, 18), ("0019:01:00.0", 1, 26)]
GB200_NICS = [("0000:03:00.0", 0, "mlx5_0"), ("0002:03:00.0", 0, "mlx5_1"),
              ("0010:03:00.0", 1, "mlx5_4"), ("0012:03:00.0", 1, "mlx5_5")]


def gb200_34node(root):
    """4x GB200 tray: 2 Grace CPUs and 32 CPU-less NUMA nodes (34 in all).

    Per ``gb200-4gpu-34numa.lscpu.txt``: node 0 = CPUs 0-71, node 1 = 72-143
    (no SMT), nodes 2-33 CPU-less. Each B200 owns 8 of them; the first
    (2, 10, 18, 26: ``GPU NUMA ID`` in that host's ``nvidia-smi topo -m``)
    holds its 186 GiB of HBM, the other 7 are empty. GPUs (0x10de:0x2941,
    class 0x030200) 0008:01:00.0 and 0009:01:00.0 on node 0, 0018:01:00.0
    and 0019:01:00.0 on node 1; NICs mlx5_0, mlx5_1 (node 0), mlx5_4, mlx5_5
    (node 1) as in that topo output. SLIT as on GH200 (10 local, 80 CPU to
    other, 255 between CPU-less nodes) with 40 between the two Grace CPUs.
    """
    nodes = [{"id": 0, "cpus": "0-71", "mem_kb": 480 * GIB_KB, "free_kb": 450 * GIB_KB},
             {"id": 1, "cpus": "72-143", "mem_kb": 480 * GIB_KB, "free_kb": 451 * GIB_KB}]
    hbm_nodes = {gpu_node for _, _, gpu_node in GB200_GPUS}
    for n in range(2, 34):
        nodes.append({"id": n, "cpus": "", "mem_kb": 186 * GIB_KB if n in hbm_nodes else 0,
                      "free_kb": 185 * GIB_KB if n in hbm_nodes else 0})
    cpus = {cpu: (cpu // 72, cpu % 72, [cpu]) for cpu in range(144)}
    pci = []
    for bdf, node, _ in GB200_GPUS:
        pci.append(dict(bdf=bdf, vendor=NVIDIA, device="0x2941", numa_node=node,
                        parents=[_with_bus(bdf, 0)], **{"class": "0x030200"}))
    for bdf, node, name in GB200_NICS:
        pci.append(dict(bdf=bdf, vendor=MELLANOX, device="0x1021", numa_node=node,
                        parents=[_with_bus(bdf, 0)], rdma=[name], netdevs=["ibP%dp3s0" % int(bdf[:4], 16)],
                        **{"class": "0x020700"}, **_link(GEN5, 16)))
    return build_tree(root, nodes, distances=_grace_distances(34, {0, 1}), cpus=cpus, pci=pci, numa_balancing=0)


def single_socket(root):
    """One-socket workstation/edge server: 16 cores x 2 threads, one L40S.

    One NUMA node, CPUs 0-31 (c and c+16 are siblings), 256 GiB; one L40S
    (0x10de:0x26b9, class 0x030200, PCIe Gen4 x16) at 0000:01:00.0 on node 0.
    ``kernel.numa_balancing`` = 0 (the kernel leaves it off with one node).
    """
    nodes = [{"id": 0, "cpus": "0-31", "mem_kb": 256 * GIB_KB, "free_kb": 240 * GIB_KB}]
    cpus = {cpu: (0, cpu % 16, [cpu % 16, cpu % 16 + 16]) for cpu in range(32)}
    pci = [dict(bdf="0000:01:00.0", vendor=NVIDIA, device="0x26b9", numa_node=0,
                parents=["0000:00:01.0"], **{"class": "0x030200"}, **_link(GEN4, 16))]
    return build_tree(root, nodes, distances=[[10]], cpus=cpus, pci=pci, numa_balancing=0)


def vm_numa_minus_one(root):
    """Cloud VM with one passed-through H200, like ``captured/h200-1gpu-vm``.

    One node, 16 vCPUs without SMT (0-15), 6 GiB in the node; the GPU
    (0x10de:0x2335, class 0x030200, Gen5 x16) at 0000:00:06.0 and a
    virtio-net NIC (0x1af4:0x1041, netdev ``ens3`` under ``virtio0/net/``) at
    0000:00:03.0 both have
    ``numa_node`` -1 and ``local_cpulist`` 0-15, as the hypervisor gives no
    affinity. Written in the capture layout (plain directories with
    ``_realpath``), as a support bundle would be.
    """
    nodes = [{"id": 0, "cpus": "0-15", "mem_kb": 6 * GIB_KB, "free_kb": 4 * GIB_KB}]
    pci = [
        dict(bdf="0000:00:06.0", vendor=NVIDIA, device="0x2335", numa_node=-1,
             **{"class": "0x030200"}, **_link(GEN5, 16)),
        dict(bdf="0000:00:03.0", vendor="0x1af4", device="0x1041", numa_node=-1,
             netdevs=["ens3"], virtio=0, **{"class": "0x020000"}),
    ]
    return build_tree(root, nodes, distances=[[10]], pci=pci, numa_balancing=0, symlinks=False)


def no_gpu(root):
    """Two-socket CPU-only server: no NVIDIA device, one Ethernet NIC.

    Nodes 0 (CPUs 0-7) and 1 (8-15), no SMT, 64 GiB each, SLIT 10/21; an
    ASPEED BMC VGA controller (0x1a03:0x2000, class 0x030000: a display
    device that is not a GPU to bind) and one Broadcom NIC (0x14e4:0x16d7,
    class 0x020000, netdev ``eno1``) on node 0.
    """
    nodes = [{"id": 0, "cpus": "0-7", "mem_kb": 64 * GIB_KB, "free_kb": 60 * GIB_KB},
             {"id": 1, "cpus": "8-15", "mem_kb": 64 * GIB_KB, "free_kb": 61 * GIB_KB}]
    cpus = {cpu: (cpu // 8, cpu % 8, [cpu]) for cpu in range(16)}
    pci = [
        dict(bdf="0000:03:00.0", vendor="0x1a03", device="0x2000", numa_node=0,
             parents=["0000:00:1c.0", "0000:02:00.0"], **{"class": "0x030000"}),
        dict(bdf="0000:41:00.0", vendor="0x14e4", device="0x16d7", numa_node=0,
             parents=["0000:40:01.1"], netdevs=["eno1"], **{"class": "0x020000"}, **_link(GEN4, 8)),
    ]
    return build_tree(root, nodes, distances=[[10, 21], [21, 10]], cpus=cpus, pci=pci, numa_balancing=1)


# -- small hosts and damage, for hostile-input and property-based tests -------


def small_two_node(root, symlinks=True):
    """Two nodes (CPUs 0-3 and 4-7), one H100 on node 1, one ConnectX-7 on node 0.

    The GPU is 0000:18:00.0 (0x10de:0x2330, class 0x030200), the NIC
    0000:19:00.0 (0x15b3:0x1021, class 0x020700, ``mlx5_0``). The base tree
    of the hostile-input corpus (``tests/fixtures/hostile/discovery``).
    """
    nodes = [{"id": 0, "cpus": "0-3", "mem_kb": 1024, "free_kb": 512},
             {"id": 1, "cpus": "4-7", "mem_kb": 2048, "free_kb": 1024}]
    pci = [dict(bdf="0000:18:00.0", vendor=NVIDIA, device="0x2330", numa_node=1,
                max_link_speed="16.0 GT/s PCIe", max_link_width=16, **{"class": "0x030200"}),
           dict(bdf="0000:19:00.0", vendor=MELLANOX, device="0x1021", numa_node=0,
                rdma=["mlx5_0"], **{"class": "0x020700"})]
    return build_tree(root, nodes, pci=pci, symlinks=symlinks)


def _replace(path):
    """Remove whatever is at ``path`` (file, link, FIFO or directory) so it can be re-created."""
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
        os.remove(path)
    elif os.path.isdir(path):
        import shutil

        shutil.rmtree(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)


def apply_damage(root, op):
    """Damage a tree as a broken host, a bad copy or a hostile bundle would.

    ``op`` is a mapping with ``op`` and ``path`` (relative to ``root``;
    symlinks in it are followed, as ``sys/bus/pci/devices/<bdf>/...`` must
    be):

    * ``write``: ``text`` (str) or ``hex`` (bytes as hex) replaces the file;
      ``repeat`` (int) repeats it, for oversized files, between the optional
      ``prefix`` and ``suffix`` (str);
    * ``remove``: delete the file, link or directory;
    * ``mkdir``: a directory where a file belongs;
    * ``fifo``: a named pipe (reading it would block forever);
    * ``symlink``: a symbolic link to ``target`` (``/dev/zero``, a path
      relative to the link, or the link itself for a loop).

    Things that cannot live in git (FIFOs, links into ``/dev``) are built
    here from a small description instead.
    """
    path = os.path.join(str(root), op["path"])
    kind = op["op"]
    if kind == "write":
        data = bytes.fromhex(op["hex"]) if "hex" in op else op["text"].encode("utf-8")
        data *= int(op.get("repeat", 1))
        data = op.get("prefix", "").encode("utf-8") + data + op.get("suffix", "").encode("utf-8")
        _replace(path)
        with open(path, "wb") as handle:
            handle.write(data)
    elif kind == "remove":
        if os.path.lexists(path):
            _replace(path)
    elif kind == "mkdir":
        _replace(path)
        os.makedirs(path)
    elif kind == "fifo":
        _replace(path)
        os.mkfifo(path)
    elif kind == "symlink":
        _replace(path)
        os.symlink(op["target"], path)
    else:
        raise ValueError("unknown damage op %r" % (kind,))
    return path


# -- platform settings read by node_checks -------------------------------------


def pci_config_with_acs(acs_ctrl, acs_cap=0x005F):
    """4096 bytes of PCI config space whose only extended capability is ACS (id 0x000d at 0x100)."""
    data = bytearray(4096)
    data[0x100:0x104] = (0x000D | (1 << 16)).to_bytes(4, "little")
    data[0x104:0x106] = acs_cap.to_bytes(2, "little")
    data[0x106:0x108] = acs_ctrl.to_bytes(2, "little")
    return bytes(data)


def node_platform(root, governors=None, available="performance powersave", thp_enabled="always [madvise] never",
                  thp_defrag="always defer defer+madvise [madvise] never", cmdline="BOOT_IMAGE=/vmlinuz ro quiet",
                  acs=None, iommu_groups=None):
    """Add the files node_checks reads to a tree made by ``build_tree``.

    ``governors``: ``{cpu: "powersave"}`` (each CPU gets ``cpufreq/scaling_governor``
    and, unless ``available`` is None, ``scaling_available_governors``);
    ``thp_enabled``/``thp_defrag``/``cmdline``: file contents, None to leave
    the file out; ``acs``: ``{bdf: ACS control value}`` written as that
    device's ``config``; ``iommu_groups``: ``{bdf: group}`` (an
    ``iommu_group`` symlink and ``sys/kernel/iommu_groups/<group>``).
    """
    root = str(root)
    cpu_dir = os.path.join(root, "sys", "devices", "system", "cpu")
    for cpu, governor in (governors or {}).items():
        base = os.path.join(cpu_dir, "cpu%d" % cpu, "cpufreq")
        _write(os.path.join(base, "scaling_governor"), governor + "\n")
        if available is not None:
            _write(os.path.join(base, "scaling_available_governors"), available + "\n")
    thp = os.path.join(root, "sys", "kernel", "mm", "transparent_hugepage")
    for name, text in (("enabled", thp_enabled), ("defrag", thp_defrag)):
        if text is not None:
            _write(os.path.join(thp, name), text + "\n")
    if cmdline is not None:
        _write(os.path.join(root, "proc", "cmdline"), cmdline + "\n")
    devices = os.path.join(root, "sys", "bus", "pci", "devices")
    for bdf, ctrl in (acs or {}).items():
        with open(os.path.join(devices, bdf, "config"), "wb") as handle:
            handle.write(pci_config_with_acs(ctrl))
    for bdf, group in (iommu_groups or {}).items():
        group_dir = os.path.join(root, "sys", "kernel", "iommu_groups", str(group))
        os.makedirs(group_dir, exist_ok=True)
        os.symlink(group_dir, os.path.join(devices, bdf, "iommu_group"))
    return root
