"""One machine model, three captures of it: a sysfs tree, ``nvidia-smi topo -m`` text and ``lscpu -p`` text.

Tests that compare what gpunuma plans from each capture build all three
from the same ``Machine``, so a difference is the reader's or the
planner's, never the fixtures'.

CPU numbering is the standard Linux x86 enumeration: first threads of
all cores ``0..C-1`` (node by node, socket by socket), second threads
``C..2C-1`` (CPU ``c + C`` is the sibling of ``c``). L3 domains are runs of
``l3_cores`` consecutive cores inside a node (an EPYC CCD/CCX, a Xeon's
whole socket when ``l3_cores`` is the node's core count).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from sysfs_factory import GIB_KB, NVIDIA, build_tree

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist


@dataclass
class Machine:
    sockets: int
    nodes_per_socket: int
    cores_per_node: int
    smt: int  # 1 or 2
    l3_cores: int  # cores per L3 domain; divides cores_per_node
    gpu_nodes: List[int] = field(default_factory=list)  # one entry per GPU, in PCI order

    @property
    def node_count(self):
        return self.sockets * self.nodes_per_socket

    @property
    def core_count(self):
        return self.node_count * self.cores_per_node

    def node_cores(self, node):
        first = node * self.cores_per_node
        return list(range(first, first + self.cores_per_node))

    def threads(self, core):
        return [core + k * self.core_count for k in range(self.smt)]

    def node_cpus(self, node):
        return sorted(cpu for core in self.node_cores(node) for cpu in self.threads(core))

    def socket_of(self, node):
        return node // self.nodes_per_socket

    def l3_of_core(self, core):
        return core // self.l3_cores

    def l3_cpus(self, core):
        first = self.l3_of_core(core) * self.l3_cores
        return sorted(cpu for c in range(first, first + self.l3_cores) for cpu in self.threads(c))

    def distances(self):
        return [[10 if i == j else 12 if self.socket_of(i) == self.socket_of(j) else 32
                 for j in range(self.node_count)] for i in range(self.node_count)]

    def sysfs(self, root, with_l3=True):
        nodes = [{"id": n, "cpus": self.node_cpus(n), "mem_kb": 64 * GIB_KB, "free_kb": 60 * GIB_KB}
                 for n in range(self.node_count)]
        cpus = {}
        l3 = {}
        for node in range(self.node_count):
            for core in self.node_cores(node):
                for cpu in self.threads(core):
                    cpus[cpu] = (self.socket_of(node), core, self.threads(core))
                    l3[cpu] = self.l3_cpus(core)
        pci = []
        for index, node in enumerate(self.gpu_nodes):
            pci.append(dict(bdf="0000:%02x:00.0" % (0x10 + 8 * index), vendor=NVIDIA, device="0x2330",
                            numa_node=node, **{"class": "0x030200"}))
        return build_tree(root, nodes, distances=self.distances(), cpus=cpus, pci=pci,
                          l3=l3 if with_l3 else None)

    def topo_text(self):
        count = len(self.gpu_nodes)
        head = "\t" + "\t".join("GPU%d" % i for i in range(count)) + "\tCPU Affinity\tNUMA Affinity"
        lines = [head]
        for i, node in enumerate(self.gpu_nodes):
            cells = [" X " if i == j else ("NODE" if node == other else "SYS")
                     for j, other in enumerate(self.gpu_nodes)]
            lines.append("GPU%d\t%s\t%s\t%d" % (i, "\t".join(cells), format_cpulist(self.node_cpus(node)), node))
        lines += ["", "Legend:", "", "  X    = Self",
                  "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
                  "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node"]
        return "\n".join(lines) + "\n"

    def lscpu_parse(self):
        """``lscpu -p=CPU,CORE,SOCKET,NODE,CACHE`` (ids of caches as lscpu numbers them: unique, from zero)."""
        lines = ["# The following is the parsable format, which can be fed to other",
                 "# programs. Each different item in every column has an unique ID",
                 "# starting from zero.",
                 "# CPU,Core,Socket,Node,L1d:L1i:L2:L3"]
        for cpu in range(self.core_count * self.smt):
            core = cpu % self.core_count
            node = core // self.cores_per_node
            lines.append("%d,%d,%d,%d,%d:%d:%d:%d" % (cpu, core, self.socket_of(node), node, core, core, core,
                                                      self.l3_of_core(core)))
        return "\n".join(lines) + "\n"
