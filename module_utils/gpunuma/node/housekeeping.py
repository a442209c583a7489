"""Housekeeping confinement and irqbalance's banned CPUs, as files.

Both are opt-in per host (numa_binding_housekeeping_confine,
numa_binding_irqbalance_ban) and both are plain systemd drop-ins, so the
``off`` profile (or turning the option off) removes them and one
``systemctl daemon-reload`` puts the node back:

* confinement: ``AllowedCPUs=`` of the plan's housekeeping CPUs on
  ``system.slice``, ``user.slice`` and ``init.scope`` (systemd.resource-control(5):
  a slice's cpuset bounds every unit below it). gpunuma's instances then run
  in a slice of their own (``gpunuma.slice`` by default, a sibling of
  ``system.slice``), or the system.slice fence would also hold them to the
  housekeeping CPUs. ``kubepods.slice`` (the kubelet's pods) is a sibling too
  and is left alone: the kubelet's CPU Manager places pods, and its
  ``reservedSystemCPUs`` is the same housekeeping set (the kubelet role).
* irqbalance: ``IRQBALANCE_BANNED_CPULIST`` (irqbalance 1.8 and later) and
  ``IRQBALANCE_BANNED_CPUS`` (the older hex mask) with the workers' CPUs, in a
  drop-in for irqbalance.service (irqbalance(1), "ENVIRONMENT"), so interrupts
  are balanced over the housekeeping CPUs only. A value in
  /etc/default/irqbalance (Debian, Ubuntu) or /etc/sysconfig/irqbalance (EL,
  Fedora) would override the drop-in (EnvironmentFile= is read after
  Environment=), so such a file is refused rather than silently lost.
* IRQ pinning (numa_binding_irq_pin), the operator's alternative to the ban:
  the interrupts of the instances' GPUs and of their NICs pinned to the
  housekeeping CPUs of the device's own NUMA node, else of the nearest node
  on the same socket by the SLIT distances (``irq_target``), never of another
  socket (an interrupt served across the socket interconnect is the cost
  binding avoids; kernel Documentation/core-api/irq/irq-affinity.rst,
  irqbalance(1)'s NUMA-local placement); a device with no such CPUs keeps
  the kernel's default affinity, with a note. By a oneshot unit (gpunuma-irq-affinity.service)
  that runs at every boot and puts the kernel's default affinity back when it
  is stopped. Refused while irqbalance runs: it would move them again.
  Kernel-managed interrupts (whose affinity the driver sets, e.g. NVMe
  queues) refuse a new affinity; the unit reports them and goes on.
"""

from __future__ import annotations

import base64

import re

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, parse_cpulist

CONFINE_NAME = "50-gpunuma-housekeeping.conf"
IRQBALANCE_NAME = "50-gpunuma-banned-cpus.conf"
IRQ_UNIT = "gpunuma-irq-affinity.service"
IRQ_SCRIPT = "/usr/local/libexec/gpunuma/irq-affinity"
BDF_RE = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\Z")
# The oneshot's script: apply|reset, then CPULIST=BDF[,BDF...] words.
IRQ_SCRIPT_TEXT = r"""#!/bin/sh
# gpunuma: pin the interrupts of PCI devices to CPU lists (apply), or give
# them the kernel's default affinity again (reset).
# Usage: irq-affinity apply|reset CPULIST=BDF[,BDF...] ...
set -u
mode=${1:?usage: irq-affinity apply|reset CPULIST=BDF[,BDF...] ...}; shift
default=$(cat /proc/irq/default_smp_affinity)
for spec in "$@"; do
  cpus=${spec%%=*}
  for bdf in $(echo "${spec#*=}" | tr ',' ' '); do
    dev=/sys/bus/pci/devices/$bdf
    if [ ! -d "$dev" ]; then echo "gpunuma: $bdf: no such PCI device, skipped"; continue; fi
    irqs=$(ls "$dev/msi_irqs" 2>/dev/null)
    [ -n "$irqs" ] || irqs=$(cat "$dev/irq" 2>/dev/null)
    for irq in $irqs; do
      [ "$irq" -gt 0 ] 2>/dev/null || continue
      [ -e "/proc/irq/$irq/smp_affinity_list" ] || continue
      if [ "$mode" = apply ]; then
        if echo "$cpus" > "/proc/irq/$irq/smp_affinity_list" 2>/dev/null; then
          echo "gpunuma: IRQ $irq ($bdf) on CPUs $cpus"
        else
          echo "gpunuma: IRQ $irq ($bdf) keeps CPUs $(cat /proc/irq/$irq/smp_affinity_list): its affinity is kernel-managed"
        fi
      else
        echo "$default" > "/proc/irq/$irq/smp_affinity" 2>/dev/null && echo "gpunuma: IRQ $irq ($bdf) back to the default affinity"
      fi
    done
  done
done
exit 0
"""
MARKER = "# gpunuma housekeeping"
CONFINED = (("system.slice", "Slice"), ("user.slice", "Slice"), ("init.scope", "Scope"))
SLICE_RE = re.compile(r"^[A-Za-z0-9:_.\\-]+\.slice\Z")
BANNED_RE = re.compile(r"^\s*(?:export\s+)?(IRQBALANCE_BANNED_CPUS|IRQBALANCE_BANNED_CPULIST)\s*=\s*(\S.*)?$")


def _union(texts):
    cpus = set()
    for text in texts:
        if text:
            cpus |= set(parse_cpulist(text))
    return cpus


def hex_mask(cpus):
    """The kernel's cpumask text: 32-bit hex words, most significant first, comma-separated."""
    if not cpus:
        return "0"
    value = 0
    for cpu in cpus:
        value |= 1 << cpu
    words = []
    while value:
        words.append("%08x" % (value & 0xFFFFFFFF))
        value >>= 32
    words.reverse()
    words[0] = words[0].lstrip("0") or "0"
    return ",".join(words)


# The environment files irqbalance.service reads (EnvironmentFile=): Debian and
# Ubuntu ship /etc/default/irqbalance, EL and Fedora /etc/sysconfig/irqbalance.
IRQBALANCE_ENV_FILES = ("/etc/default/irqbalance", "/etc/sysconfig/irqbalance")


def irqbalance_env_reads():
    """The ``files`` entries of a gpunuma_node_info read that fetch irqbalance's environment files
    (``{"irqbalance:<path>": path}``), so a role names none of the paths itself."""
    return {"irqbalance:" + path: path for path in IRQBALANCE_ENV_FILES}


def irqbalance_env_read_texts(files):
    """``{path: text}`` from a gpunuma_node_info ``files`` result read with :func:`irqbalance_env_reads`
    (base64 ``content``; a missing file is empty)."""
    texts = {}
    for name, path in irqbalance_env_reads().items():
        entry = (files or {}).get(name) or {}
        content = entry.get("content") or ""
        texts[path] = base64.b64decode(content).decode("utf-8", "replace") if content else ""
    return texts


def irqbalance_env_texts(value):
    """``{path: text}`` of irqbalance's environment files from ``value``: a mapping of path to text, or one text
    (that of /etc/default/irqbalance)."""
    if isinstance(value, dict):
        return {path: text or "" for path, text in value.items()}
    return {IRQBALANCE_ENV_FILES[0]: value or ""}


def banned_in_default(text):
    """Lines of an irqbalance environment file that set a banned-CPU variable (uncommented, non-empty)."""
    found = []
    for line in (text or "").splitlines():
        match = BANNED_RE.match(line)
        if match and (match.group(2) or "").strip().strip("\"'"):
            found.append(line.strip())
    return found


def socket_mates(topology, node):
    """The CPU-bearing nodes on ``node``'s socket (``node`` first, then nearest first by SLIT), or [node].

    Sockets are not listed per node: with ``sockets`` sockets and k CPU-bearing nodes per socket (NPS2/NPS4,
    SNC2/SNC4), a node's socket mates are its k-1 nearest nodes, when they are strictly nearer than every other
    node. Anything less clear (distances unknown, uneven nodes per socket, a tie at the border) gives the node
    alone: never a guess that could cross a socket.
    """
    nodes = [n for n in (topology or {}).get("numa_nodes") or [] if isinstance(n, dict) and n.get("has_cpus")]
    ids = [n.get("id") for n in (topology or {}).get("numa_nodes") or [] if isinstance(n, dict)]
    sockets = (topology or {}).get("sockets")
    me = [n for n in nodes if n.get("id") == node]
    if not me or not isinstance(sockets, int) or sockets < 1 or len(nodes) % sockets:
        return [node]
    per_socket = len(nodes) // sockets
    row = me[0].get("distances") or []
    if per_socket == 1 or len(row) != len(ids):
        return [node]
    others = sorted((row[ids.index(n["id"])], n["id"]) for n in nodes if n["id"] != node)
    mates, rest = others[:per_socket - 1], others[per_socket - 1:]
    if rest and mates and mates[-1][0] >= rest[0][0]:
        return [node]
    return [node] + [n for _unused, n in mates]


def irq_target(topology, housekeeping_by_node, node):
    """``(cpus, from_node)``: the housekeeping CPUs a device of ``node`` is pinned to (its own node's, else the
    nearest socket mate's that keeps some), or ``(None, None)`` when its socket keeps none or its node is
    unknown."""
    if node is None:
        return None, None
    for mate in socket_mates(topology, node):
        cpus = housekeeping_by_node.get(str(mate))
        if cpus:
            return cpus, mate
    return None, None


def irq_devices(plan, topology):
    """[(node or None, bdf, what)] of the instances' GPUs and their NICs, in plan order, each once."""
    gpus = {g.get("index"): g for g in (topology or {}).get("gpus") or [] if isinstance(g, dict)}
    nics = {n.get("name"): n for n in (topology or {}).get("nics") or [] if isinstance(n, dict)}
    found, seen = [], set()
    for instance in (plan or {}).get("instances") or []:
        entries = [("GPU %s" % g, gpus.get(g)) for g in instance.get("gpus") or []]
        entries += [("NIC %s" % n, nics.get(n)) for n in instance.get("nics") or []]
        for what, entry in entries:
            bdf = (entry or {}).get("pci_bus_id")
            if not isinstance(bdf, str) or not BDF_RE.match(bdf) or bdf.lower() in seen:
                continue
            seen.add(bdf.lower())
            node = entry.get("numa_node")
            found.append((node if isinstance(node, int) and node >= 0 else None, bdf.lower(), what))
    return found


class _Out(object):
    """What the three housekeeping options add up to: files, removals, problems, notes (in that order)."""

    def __init__(self, plan, unit_dir, header, host):
        self.plan = plan or {}
        self.unit_dir = unit_dir.rstrip("/") or "/"
        self.header = header
        self.host = host
        self.profile_off = self.plan.get("profile") == "off"
        self.housekeeping = _union(self.plan.get("housekeeping", {}).values())
        self.workers = _union(self.plan.get("worker_cpus", {}).values()) - self.housekeeping
        self.hk_text, self.worker_text = format_cpulist(self.housekeeping), format_cpulist(self.workers)
        self.problems, self.notes, self.files, self.absent = [], [], [], []


def housekeeping_files(plan, unit_dir="/etc/systemd/system", confine=False, irqbalance_ban=False,
                       slice_name="gpunuma.slice", cpuset_available=True, irqbalance_loaded=False,
                       irqbalance_default="", host="this host", header="", irq_pin=False, topology=None,
                       irqbalance_active=False):
    """Files to write, paths to remove and problems for the housekeeping options.

    Returns ``{"files": [...], "absent": [...], "problems": [...], "confined": bool,
    "slice": name or None, "housekeeping_cpus": text, "banned_cpus": text, "notes": [...]}``.
    Every file gpunuma may have written is in ``absent`` when the option is
    off (or the profile is ``off``), so turning it off is the way back.
    """
    out = _Out(plan, unit_dir, header, host)
    slice_name, want_confine = _confinement(out, confine, slice_name, cpuset_available)
    _irqbalance_ban(out, irqbalance_ban, irqbalance_loaded, irqbalance_default)
    services, pinned = _irq_pinning(out, irq_pin, irqbalance_active, topology)
    return {
        "files": out.files,
        "absent": out.absent,
        "services": services,
        "irq_pinned": pinned if services else [],
        "problems": out.problems,
        "notes": out.notes,
        "confined": want_confine and not out.problems,
        "slice": slice_name if want_confine and not out.problems else None,
        "housekeeping_cpus": out.hk_text,
        "banned_cpus": out.worker_text,
    }


def _confinement(out, confine, slice_name, cpuset_available):
    """system.slice, user.slice and init.scope on the housekeeping CPUs, the instances in a slice of their own:
    ``(slice name, wanted)``."""
    problems, host = out.problems, out.host
    if not isinstance(slice_name, str) or not SLICE_RE.match(slice_name) or slice_name in (
            "-.slice", "system.slice", "user.slice", "machine.slice", "kubepods.slice"):
        problems.append("numa_binding_slice must be a slice unit name of gpunuma's own (like gpunuma.slice), "
                        "not -.slice, system.slice, user.slice, machine.slice or kubepods.slice; got %r" % (slice_name,))
        slice_name = "gpunuma.slice"
    slice_path = "%s/%s" % (out.unit_dir, slice_name)
    confine_paths = ["%s/%s.d/%s" % (out.unit_dir, unit, CONFINE_NAME) for unit, _unused in CONFINED]
    want_confine = bool(confine) and not out.profile_off
    if want_confine:
        if not cpuset_available:
            problems.append("numa_binding_housekeeping_confine is true but %s has no cgroup v2 cpuset controller "
                            "(/sys/fs/cgroup/cgroup.controllers does not list cpuset): AllowedCPUs= on slices "
                            "would do nothing; set it to false for this host" % host)
        if not out.housekeeping:
            problems.append("numa_binding_housekeeping_confine is true but the plan of %s keeps no housekeeping CPUs "
                            "(gpunuma_housekeeping_cores_per_node is 0 and gpunuma_housekeeping_cpus unset): "
                            "system.slice, user.slice and init.scope would have no CPU to run on" % host)
        if not out.workers:
            out.notes.append("every CPU of %s is a housekeeping CPU: confinement changes nothing" % host)
    if want_confine and not problems:
        out.files.append({"path": slice_path, "content": (
            out.header + "%s: the slice of gpunuma's instances, beside system.slice, whose CPUs are\n"
            "# confined to the housekeeping CPUs (%s).\n"
            "[Unit]\nDescription=gpunuma inference instances\nBefore=slices.target\n" % (MARKER, out.hk_text))})
        for path, (unit, section) in zip(confine_paths, CONFINED):
            out.files.append({"path": path, "content": (
                out.header + "%s: %s runs on the housekeeping CPUs only; the workers' CPUs\n"
                "# (%s) are left to gpunuma's instances in %s.\n"
                "[%s]\nAllowedCPUs=%s\n" % (MARKER, unit, out.worker_text or "none", slice_name, section, out.hk_text))})
    else:
        out.absent.extend([slice_path] + confine_paths)
    return slice_name, want_confine


def _irqbalance_ban(out, irqbalance_ban, irqbalance_loaded, irqbalance_default):
    """irqbalance keeps interrupts off the workers' CPUs (a drop-in of irqbalance.service, restarted if running)."""
    host = out.host
    irq_path = "%s/irqbalance.service.d/%s" % (out.unit_dir, IRQBALANCE_NAME)
    want_ban = bool(irqbalance_ban) and not out.profile_off
    ban_problem = False
    if want_ban and irqbalance_loaded:
        for env_path, text in sorted(irqbalance_env_texts(irqbalance_default).items()):
            lines = banned_in_default(text)
            if lines:
                ban_problem = True
                out.problems.append("numa_binding_irqbalance_ban is true but %s on %s already sets %s, which "
                                    "irqbalance.service reads after gpunuma's drop-in and would win; remove that line "
                                    "or set numa_binding_irqbalance_ban: false" % (env_path, host, "; ".join(lines)))
        if not out.housekeeping:
            ban_problem = True
            out.problems.append("numa_binding_irqbalance_ban is true but the plan of %s keeps no housekeeping CPUs "
                                "for interrupts (gpunuma_housekeeping_cores_per_node is 0)" % host)
    if want_ban and not irqbalance_loaded:
        out.notes.append("numa_binding_irqbalance_ban: irqbalance.service is not installed on %s; nothing to tell" % host)
    if want_ban and irqbalance_loaded and not ban_problem and out.workers:
        out.files.append({"path": irq_path, "unit": "irqbalance.service", "restart": "if-running", "content": (
            out.header + "%s: irqbalance keeps interrupts off the workers' CPUs and balances them over the\n"
            "# housekeeping CPUs (%s). IRQBALANCE_BANNED_CPULIST: irqbalance 1.8 and later;\n"
            "# IRQBALANCE_BANNED_CPUS: the older hex mask.\n"
            "[Service]\nEnvironment=IRQBALANCE_BANNED_CPULIST=%s\nEnvironment=IRQBALANCE_BANNED_CPUS=%s\n"
            % (MARKER, out.hk_text, out.worker_text, hex_mask(out.workers)))})
    elif not (want_ban and ban_problem):
        # irqbalance (not gpunuma's) reads its environment again: restarted by gpunuma_apply when it runs.
        out.absent.append({"path": irq_path, "unit": "irqbalance.service"})


def _irq_pinning(out, irq_pin, irqbalance_active, topology):
    """The instances' GPU and NIC interrupts on the housekeeping CPUs of their own NUMA node (a oneshot unit):
    ``(services, pinned devices)``."""
    plan, host = out.plan, out.host
    irq_unit_path = "%s/%s" % (out.unit_dir, IRQ_UNIT)
    want_pin = bool(irq_pin) and not out.profile_off
    services = []
    pinned = []
    if want_pin:
        pin_problems = []
        if irqbalance_active:
            pin_problems.append("numa_binding_irq_pin is true but irqbalance.service runs on %s and would move the "
                                "pinned interrupts again; stop and disable irqbalance, or use "
                                "numa_binding_irqbalance_ban instead" % host)
        if not out.housekeeping:
            pin_problems.append("numa_binding_irq_pin is true but the plan of %s keeps no housekeeping CPUs to pin "
                                "interrupts to (gpunuma_housekeeping_cores_per_node is 0)" % host)
        if any(i.get("unit") == IRQ_UNIT for i in plan.get("instances") or []):
            pin_problems.append("numa_binding_irq_pin needs the unit name %s, which an instance of %s uses"
                                % (IRQ_UNIT, host))
        out.problems.extend(pin_problems)
        groups = _irq_groups(out, plan, topology, pinned)
        if not pinned:
            out.notes.append("numa_binding_irq_pin: no GPU or NIC of %s's instances has a PCI address in the topology; "
                             "nothing to pin" % host)
        if not pin_problems and pinned:
            words = " ".join("%s=%s" % (cpus, ",".join(bdfs)) for cpus, bdfs in sorted(groups.items()))
            out.files.append({"path": IRQ_SCRIPT, "mode": "0755", "content": IRQ_SCRIPT_TEXT})
            out.files.append({"path": irq_unit_path, "unit": IRQ_UNIT, "content": (
                out.header + "# gpunuma instance irq-affinity: not a worker; the interrupts of the instances' GPUs\n"
                "# and NICs on the housekeeping CPUs of their own NUMA node. Stopping it (numa_binding_irq_pin:\n"
                "# false, the off profile) gives them the kernel's default affinity again.\n"
                "[Unit]\nDescription=gpunuma: GPU and NIC interrupts on the housekeeping CPUs\n"
                "After=systemd-udev-settle.service\n\n"
                "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=%s apply %s\nExecStop=%s reset %s\n\n"
                "[Install]\nWantedBy=multi-user.target\n" % (IRQ_SCRIPT, words, IRQ_SCRIPT, words))})
            services.append(IRQ_UNIT)
    if not services:
        # Stopped (and so reset) by the instance prune, which knows its marker; the script goes.
        out.absent.append(IRQ_SCRIPT)
    return services, pinned


def _irq_groups(out, plan, topology, pinned):
    """``{cpu list: [bus ids]}``: each device's interrupts on its node's (or socket's) housekeeping CPUs
    (``irq_target``); ``pinned`` gets one record per device, ``out.notes`` one per device left alone."""
    by_node = dict((str(n), _union([t])) for n, t in (plan.get("housekeeping") or {}).items())
    groups = {}
    for node, bdf, what in irq_devices(plan, topology):
        cpus, source = irq_target(topology, by_node, node)
        if cpus is None:
            out.notes.append("numa_binding_irq_pin: %s (%s) keeps the kernel's default affinity: %s" % (
                what, bdf, "its NUMA node is unknown" if node is None else
                "no housekeeping CPU on its socket (node %s and its socket mates keep none)" % node))
            continue
        groups.setdefault(format_cpulist(cpus), []).append(bdf)
        pinned.append({"device": what, "pci_bus_id": bdf, "numa_node": node, "cpus": format_cpulist(cpus),
                       "cpus_node": source})
    return groups
