"""DRA on a kubelet node: the mode's settings, the mode ``auto`` resolves to, and the DRA checkpoint.

docs/kubelet.md, "DRA", says why each setting and cites its source; plan.plan_kubelet
calls :func:`apply_dra` after the preset, so the rest of its rules see the
mode's policies as any other.
"""

from __future__ import annotations

from ansible.module_utils.gpunuma.common import bounded
from ansible.module_utils.gpunuma.common.cpulist import format_cpulist
from ansible.module_utils.gpunuma.common.errors import GpunumaError

DRA_STATE_FILE = "dra_manager_state"
# How GPUs (and CPUs) reach pods (docs/kubelet.md, "DRA"): off = device plugins, aligned by the Topology
# Manager; gpu = GPUs through DRA, which the Topology Manager does not align (kubernetes/website#56761);
# gpu_and_cpu = the CPU DRA driver (kubernetes-sigs/dra-driver-cpu) assigns CPUs too and needs
# cpuManagerPolicy none. The role resolves auto from the node's DRA plugin registrations.
DRA_MODES = ("off", "gpu", "gpu_and_cpu")
# DRA drivers by the name they register with the kubelet (``<driver>-reg.sock`` in its plugins_registry):
# NVIDIA's (kubernetes-sigs/dra-driver-nvidia-gpu), AMD's (ROCm/k8s-gpu-dra-driver) and the CPU driver.
DRA_GPU_DRIVERS = ("gpu.nvidia.com", "gpu.amd.com")
DRA_CPU_DRIVERS = ("dra.cpu",)
# KEP-6232's gate: a kubelet that tolerates a moved kernel image itself needs no checkpoint check before it starts.
MEMORY_DRIFT_GATE = "MemoryManagerDriftTolerance"


class DraError(GpunumaError):
    """A DRA setting that is not allowed; the message names the variable and what is allowed."""


def apply_dra(run, dra, overrides, reserved):
    """The DRA mode's settings in ``run.desired`` (a plan_kubelet run, after the preset; checked against the
    user's overrides), and its warnings."""
    if dra not in DRA_MODES:
        run.problems.append("dra: %r is not allowed; allowed: %s (auto is resolved from the node by the role)"
                            % (dra, ", ".join(DRA_MODES)))
        return
    if dra == "off":
        return
    overrides = overrides if isinstance(overrides, dict) else {}
    if dra == "gpu":
        run.warnings.append(
            "dra gpu: the Topology Manager does not align DRA devices (the kubelet prepares them after admission, "
            "kubernetes/website#56761): a pod's GPU comes from its ResourceClaim, aligned with a NIC or CPUs only by "
            "the claim's matchAttribute on resource.kubernetes.io/numaNode or pcieRoot (docs/kubelet.md, \"DRA\"); "
            "the CPU and Memory Managers still align CPUs and memory with each other, not with the GPU")
        return
    # gpu_and_cpu: the CPU DRA driver assigns exclusive CPUs and "the CPUManager and this DRA driver are mutually
    # incompatible" (kubernetes-sigs/dra-driver-cpu README): cpuManagerPolicy none. The Memory Manager would pin
    # memory (cpuset.mems) to a node it picks without seeing the claim, so it is None too and memory follows the
    # claimed CPUs by the kernel's local allocation.
    for key, value in (("cpuManagerPolicy", "none"), ("memoryManagerPolicy", "None")):
        if key in overrides and overrides[key] != value:
            run.problems.append("overrides.%s: %r conflicts with dra gpu_and_cpu, where the CPU DRA driver assigns CPUs "
                                "and memory follows them; allowed: %r, or dra gpu or off" % (key, overrides[key], value))
        run.desired[key] = value
    for key in ("cpuManagerPolicyOptions", "reservedMemory"):
        if overrides.get(key):
            run.problems.append("overrides.%s: is set with dra gpu_and_cpu, where the CPU Manager is none and the "
                                "Memory Manager None; allowed: leave it out, or dra gpu or off" % key)
        run.desired.pop(key, None)
    # The housekeeping CPUs stay reserved: the driver's --reserved-cpus takes the same list.
    if "reservedSystemCPUs" not in overrides and reserved:
        run.desired["reservedSystemCPUs"] = format_cpulist(reserved)
    run.warnings.append(
        "dra gpu_and_cpu: pass --reserved-cpus=%s to the CPU DRA driver (the CPUs the kubelet reserves here); claims "
        "align GPU and CPUs with matchAttribute on resource.kubernetes.io/numaNode (docs/kubelet.md, \"DRA\")"
        % (format_cpulist(reserved) if reserved else "(none)"))


def dra_mode(requested, registrations=(), what="kubelet_topology_dra"):
    """The DRA mode: ``requested`` itself, or for ``auto`` the drivers registered with the node's kubelet.

    ``registrations`` are the file names in the kubelet's ``plugins_registry`` directory (``<driver>-reg.sock``).
    An unquoted ``off`` in YAML 1.1 (Ansible's inventories) arrives as false and means off; any other value
    outside :data:`DRA_MODES` and ``auto`` raises :class:`DraError` naming ``what``."""
    if requested is False:
        return "off"
    if requested not in DRA_MODES + ("auto",):
        raise DraError("%s: %r is not allowed; allowed: %s, auto (quote \"off\" in YAML, where a bare off is false)"
                       % (what, requested, ", ".join(DRA_MODES)))
    if requested != "auto":
        return requested
    drivers = set()
    for name in registrations or ():
        base = str(name).rsplit("/", 1)[-1]
        if base.endswith("-reg.sock"):
            drivers.add(base[:-len("-reg.sock")])
    if not drivers & set(DRA_GPU_DRIVERS):
        return "off"
    return "gpu_and_cpu" if drivers & set(DRA_CPU_DRIVERS) else "gpu"


def dra_checkpoint(text, path):
    """What ``dra_manager_state`` records: ``{"path", "claims", "drivers", "problem"}``, or None when absent.

    The kubelet writes ``{"Data": "<JSON>", "Checksum": n}`` whose Data holds ``Entries`` (older kubelets:
    ``ClaimInfoStateList``, or ``{"version", "entries", "checksum"}``); it refuses to start on one it
    cannot read ("please drain node and remove DRA state file")."""
    if text is None:
        return None
    result = {"path": path, "claims": None, "drivers": [], "problem": None}
    try:
        data = bounded.loads_json(text)
        if isinstance(data, dict) and isinstance(data.get("Data"), str):
            data = bounded.loads_json(data["Data"])
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        entries = next((data[k] for k in ("Entries", "ClaimInfoStateList", "entries") if k in data), [])
        if entries is None:
            entries = []
        if not isinstance(entries, list):
            raise ValueError("its claims are not a list")
    except (TypeError, ValueError) as exc:
        result["problem"] = ("%s cannot be read as the kubelet's DRA checkpoint (%s): the kubelet refuses to start "
                             "with it; drain the node, then move it aside" % (path, exc))
        return result
    drivers = set()
    for entry in entries:
        states = entry.get("DriverState") if isinstance(entry, dict) else None
        if isinstance(states, dict):
            drivers.update(str(name) for name in states)
    result["claims"] = len(entries)
    result["drivers"] = sorted(drivers)
    return result
