"""PCI functions as sysfs describes them, and which of them are GPUs, NICs and NVMe controllers
(discovery/sysfs/host.py's reader)."""

from __future__ import annotations

import errno
import os
import re
import stat

from ansible.module_utils.gpunuma.common.bounded import file_kind as _file_kind
from ansible.module_utils.gpunuma.common.errors import CpuListError
from ansible.module_utils.gpunuma.discovery.sysfs.reader import BDF_RE, _HEX_RE, _MISSING, Reader, quote

NVIDIA_VENDOR = "0x10de"
# AMD Instinct GPUs: vendor 0x1002 with the class of a processing accelerator (0x1200, MI300 series), a
# display controller (0x0380, MI100/MI200) or a 3D controller (0x0302); a VGA controller (0x0300) of
# that vendor is an APU's or a workstation card, not counted.
AMD_VENDOR = "0x1002"
AMD_INSTINCT_CLASSES = ("0x1200", "0x0380", "0x0302")
_AMD_UNIQUE_ID_RE = re.compile(r"(?:0x)?([0-9a-fA-F]{1,16})", re.ASCII)


def is_nvidia_gpu(vendor, pci_class):
    """A PCI function's vendor and class (sysfs text) name an NVIDIA GPU: class 0x0300xx (VGA) or 0x0302xx (3D)."""
    return vendor == NVIDIA_VENDOR and bool(pci_class) and pci_class[:6] in ("0x0300", "0x0302")


def is_amd_instinct(vendor, pci_class):
    """A PCI function's vendor and class (sysfs text) name an AMD Instinct GPU."""
    return vendor == AMD_VENDOR and bool(pci_class) and pci_class[:6] in AMD_INSTINCT_CLASSES


def amd_gpu_uuid(unique_id):
    """The UUID ROCm gives an AMD GPU (``GPU-<hex>``, what ROCR_VISIBLE_DEVICES takes) from its
    ``unique_id`` sysfs attribute, or None when there is none."""
    match = _AMD_UNIQUE_ID_RE.fullmatch((unique_id or "").strip())
    if not match or int(match.group(1), 16) == 0:
        return None
    return "GPU-%s" % match.group(1).lower().rjust(16, "0")


_SPEED_RE = re.compile(r"\s*([0-9]{1,4}(?:\.[0-9]{1,4})?)\s*GT/s", re.ASCII)
# PCIe generation by per-lane transfer rate (GT/s), as the kernel writes it in
# max_link_speed / current_link_speed ("2.5 GT/s PCIe", "32.0 GT/s PCIe").
_GEN_BY_SPEED = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


def pcie_gen_from_speed(speed):
    """PCIe generation for a sysfs link speed: ``"32.0 GT/s PCIe"`` -> ``5``.

    2.5 -> 1, 5 -> 2, 8 -> 3, 16 -> 4, 32 -> 5, 64 -> 6 GT/s. Anything else
    (``None``, ``"Unknown"``, an unlisted rate) is ``None``.
    """
    if not isinstance(speed, str):
        return None
    match = _SPEED_RE.match(speed)
    if not match:
        return None
    return _GEN_BY_SPEED.get(float(match.group(1)))


def gpu_functions(host):
    """PCI functions of GPUs: NVIDIA's (:func:`is_nvidia_gpu`) and AMD Instinct ones (:func:`is_amd_instinct`)."""
    return [
        dev
        for dev in host["pci"]
        if is_nvidia_gpu(dev["vendor"], dev["class"]) or is_amd_instinct(dev["vendor"], dev["class"])
    ]


def nic_functions(host):
    """PCI functions of network controllers: class 0x02xxxx (Ethernet, InfiniBand, other)."""
    return [dev for dev in host["pci"] if dev["class"] is not None and dev["class"][:4] == "0x02"]


def nvme_functions(host):
    """PCI functions of NVMe controllers: class 0x010802."""
    return [dev for dev in host["pci"] if dev["class"] == "0x010802"]


class PciReader(Reader):
    # -- PCI ---------------------------------------------------------------------

    def read_pci(self):
        pci_root = self.path("sys", "bus", "pci", "devices")
        devices = []
        for name in self.listdir(pci_root, "PCI devices"):
            match = BDF_RE.fullmatch(name)
            if not match:
                self.warn_lost(
                    pci_root,
                    "%s: %s is not a PCI bus id (domain:bus:device.function); skipped" % (pci_root, quote(name)),
                )
                continue
            dev_dir = pci_root + "/" + name
            if self.usable_device_dir(dev_dir):
                devices.append(self.read_pci_device(dev_dir, name.lower()))
        devices.sort(key=lambda dev: dev["pci_bus_id"])
        return devices

    def usable_device_dir(self, dev_dir):
        """False, after a warning, for an entry that is not a directory inside this tree's sys/devices.

        On a live host ``bus/pci/devices/<bdf>`` links into ``sys/devices``;
        in a copy it is a plain directory. A dangling link, a symlink loop or
        a link leading elsewhere (into ``/dev``) loses the device: one
        warning, not one per attribute.
        """
        try:
            info = os.stat(dev_dir)
        except OSError as exc:
            self.warn_lost(dev_dir, "cannot read PCI device %s: %s; device skipped" % (dev_dir, exc.strerror or exc))
            return False
        if not stat.S_ISDIR(info.st_mode):
            self.warn_lost(dev_dir, "PCI device %s is %s, not a directory; device skipped"
                           % (dev_dir, _file_kind(info.st_mode)))
            return False
        try:
            target = os.readlink(dev_dir)
        except OSError:
            return True  # a plain directory: a copy, or a capture
        # As in read_realpath: the kernel's links are relative and cross real
        # directories, so normalising the joined path resolves them.
        target = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(dev_dir)), target))
        if self._devices_dir is None:
            self._devices_dir = os.path.abspath(self.path("sys", "devices")) + os.sep
        if not target.startswith(self._devices_dir):
            self.warn_lost(dev_dir, "PCI device %s leads to %s, outside %s; device skipped"
                           % (dev_dir, target, self._devices_dir.rstrip(os.sep)))
            return False
        return True

    def hex_attr(self, path, width=None, essential=False):
        """A 0x-prefixed hex attribute; ``essential`` ones (vendor, device, class) exist for every PCI function."""
        text = self.read_text(path)
        if text is _MISSING and essential:
            self.warn_lost(path, "%s is missing; every PCI function has one, so the device cannot be identified"
                           % path)
            return None
        if text is _MISSING or text is None:
            return None
        value = text.strip().lower()
        if not _HEX_RE.fullmatch(value):
            self.warn_lost(path, "%s holds %s, not a 0x-prefixed hex number of at most 8 digits; value treated "
                                 "as unknown" % (path, quote(value)))
            return None
        if width:
            return "0x%0*x" % (width, int(value, 16))
        return value

    def str_attr(self, path):
        text = self.read_text(path)
        if text is _MISSING or text is None:
            return None
        return text.strip() or None

    def read_pci_device(self, dev_dir, bus_id):
        base = dev_dir + "/"
        raw_node = self.optional_int(base + "numa_node")
        numa_node = raw_node if raw_node is not None and raw_node >= 0 else None
        if numa_node is not None and self.node_ids is not None and numa_node not in self.node_ids:
            self.warn_lost(
                base + "numa_node",
                "%s says %d, which is not a NUMA node of this host (%s); node treated as unknown"
                % (base + "numa_node", numa_node, ",".join(str(n) for n in sorted(self.node_ids)))
            )
            numa_node = None
        pci_class = self.hex_attr(base + "class", width=6, essential=True)
        if pci_class is not None and pci_class.startswith("0x0604"):
            # A PCI bridge's directory holds its children, never net/,
            # infiniband/ or nvme/: skip three lookups on every bridge.
            netdevs, rdma, nvme = [], [], []
        else:
            netdevs = self.device_names(base + "net", "network interfaces")
            if not netdevs and pci_class is not None and pci_class.startswith("0x02"):
                netdevs = self.virtio_netdevs(base)
            rdma = self.device_names(base + "infiniband", "RDMA devices")
            nvme = self.device_names(base + "nvme", "NVMe controllers")
        vendor = self.hex_attr(base + "vendor", essential=True)
        device = {
            "pci_bus_id": bus_id,
            "vendor": vendor,
            "device": self.hex_attr(base + "device", essential=True),
            "class": pci_class,
            "numa_node": numa_node,
            "raw_numa_node": raw_node,
            "local_cpulist": self.read_local_cpus(base),
            "max_link_speed": self.str_attr(base + "max_link_speed"),
            "max_link_width": self.optional_int(base + "max_link_width", allow_negative=False),
            "current_link_speed": self.str_attr(base + "current_link_speed"),
            "current_link_width": self.optional_int(base + "current_link_width", allow_negative=False),
            "netdevs": netdevs,
            "rdma": rdma,
            "nvme": nvme,
            "realpath": self.read_realpath(dev_dir),
            # MSI/MSI-X vectors of NICs and GPUs (msi_irqs/<irq>): what IRQ pinning puts on housekeeping CPUs.
            "msi_vectors": self.msi_vectors(base) if pci_class is not None and pci_class[:4] in ("0x02", "0x03", "0x12")
            else None,
        }
        if is_amd_instinct(vendor, pci_class):
            # amdgpu's unique_id: the GPU's identity ROCm shows as GPU-<hex>.
            device["unique_id"] = self.str_attr(base + "unique_id")
            # amdgpu's partition modes (MI300 series): SPX/DPX/QPX/CPX and NPS1/NPS2/NPS4.
            device["compute_partition"] = self.str_attr(base + "current_compute_partition")
            device["memory_partition"] = self.str_attr(base + "current_memory_partition")
        return device

    def msi_vectors(self, base):
        """How many MSI/MSI-X vectors the function has allocated (entries of ``msi_irqs/``), None without it."""
        if not os.path.isdir(base + "msi_irqs"):
            return None
        return sum(1 for name in self.listdir(base + "msi_irqs", "MSI vectors") if name.isdigit())

    def virtio_netdevs(self, base):
        """Netdevs of a virtio-net function: they sit under ``virtio<N>/net/``, not ``net/``."""
        names = []
        for entry in self.listdir(base, "PCI device directory"):
            if entry.startswith("virtio") and entry[6:].isdigit():
                names.extend(self.device_names(base + entry + "/net", "network interfaces"))
        return sorted(names)

    def read_local_cpus(self, base):
        for name, mask in (("local_cpulist", False), ("local_cpus", True)):
            path = base + name
            text = self.read_text(path)
            if text is None:
                return None
            if text is _MISSING:
                continue
            try:
                return self.parse_cpus(text, path, mask)[1]
            except CpuListError as exc:
                self.warn_lost(path, "%s; local CPUs treated as unknown" % exc)
                return None
        return None

    def read_realpath(self, dev_dir):
        """Where the device sits in the PCI hierarchy (``/sys/devices/pci.../<bdf>``)."""
        try:
            target = os.readlink(dev_dir)
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: not a symlink (a capture)
                self.warn_lost(dev_dir, "cannot read link %s: %s" % (dev_dir, exc.strerror or exc))
                return None
            return self.str_attr(dev_dir + "/_realpath")
        # The kernel's links are relative and the directories they cross are
        # real, so normalising the joined path resolves them without a
        # realpath() walk over every component.
        target = os.path.normpath(os.path.join(os.path.abspath(os.path.dirname(dev_dir)), target))
        if self.root.rstrip(os.sep):
            root = os.path.abspath(self.root)
            if target == root or target.startswith(root + os.sep):
                # Report the path as the host sees it, not under an offline root.
                target = os.sep + os.path.relpath(target, root)
        return target
