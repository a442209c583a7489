"""One instance's entry in ``gpunuma.plan/v1`` (docs/plan-v1.md, Output), from its allocated spec.

How it is bound (numactl arguments, systemd's CPUAffinity=/NUMAPolicy=, or the fence alone for an engine that
binds its own workers), the GPU selection variable of its vendor, and the NICs near its GPUs.
"""

from __future__ import annotations

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist


def nic_environment_value(variable, nics):
    """The value of ``UCX_NET_DEVICES`` or ``NCCL_IB_HCA`` naming ``nics``.

    UCX takes ``<device>:<port>`` for RDMA devices (port 1, the first port
    of each listed function) and netdev names for TCP; NCCL_IB_HCA takes
    RDMA device names, ``=`` first for exact matches (``mlx5_1`` alone would
    also match ``mlx5_10``).
    """
    if variable == "UCX_NET_DEVICES":
        return ",".join("%s:1" % nic.name if nic.rdma else nic.name for nic in nics)
    rdma = [nic.name for nic in nics if nic.rdma]
    return "=" + ",".join(rdma) if rdma else None


def _numactl_args(spec, cpus, mem_nodes, nodes_text):
    """numactl's binding arguments for an instance's CPUs and memory policy (``nodes_text``: ``mem_nodes`` as a list)."""
    args = []
    if cpus:
        args.append("--physcpubind=%s" % cpus)
    if spec.mem_policy == "bind":
        args.append("--membind=%s" % nodes_text)
    elif spec.mem_policy == "preferred" and spec.preferred_many:
        args.append("--preferred-many=%s" % format_cpulist(spec.preferred_many))
    elif spec.mem_policy == "preferred":
        args.append("--preferred=%d" % mem_nodes[0])
    elif spec.mem_policy == "interleave":
        args.append("--interleave=%s" % nodes_text)
    return args


def _binding(spec, cpus, mem_nodes, fence):
    """``(numactl_args, exec_prefix, systemd)``: how the instance is bound (numactl, systemd, or the fence alone)."""
    nodes_text = format_cpulist(mem_nodes)
    args = _numactl_args(spec, cpus, mem_nodes, nodes_text)
    systemd = {}
    exec_prefix = []
    if spec.engine_self_binds and fence:
        # The engine binds its workers itself; the fence alone holds it to its share (engines.py).
        args = []
    elif spec.binding_method == "systemd":
        if cpus:
            systemd["CPUAffinity"] = cpus
        if spec.mem_policy != "default":
            systemd["NUMAPolicy"] = spec.mem_policy
            systemd["NUMAMask"] = nodes_text
    elif args:
        exec_prefix = ["numactl"] + args
    return args, exec_prefix, systemd


def _cuda_environment(spec, topo, gpus, uuids, environment):
    """CUDA_VISIBLE_DEVICES (by UUID, else by index in PCI bus order) unless the user set it, with MIG warnings."""
    mig = [g for g in gpus if topo.gpus[g].mig]
    if "CUDA_VISIBLE_DEVICES" in environment:
        spec.warnings.append(
            "environment.CUDA_VISIBLE_DEVICES kept as given (%r) because GPU %s has MIG enabled"
            % (environment["CUDA_VISIBLE_DEVICES"], format_cpulist(mig))
        )
    elif all(uuids):
        environment["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
    else:
        environment["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        environment["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        spec.warnings.append(
            "GPU %s has no UUID in the topology; CUDA_VISIBLE_DEVICES uses indexes with CUDA_DEVICE_ORDER=PCI_BUS_ID"
            % format_cpulist([g for g, u in zip(gpus, uuids) if not u])
        )
    if mig and "CUDA_VISIBLE_DEVICES" not in spec.environment:
        spec.warnings.append(
            "GPU %s has MIG enabled; CUDA_VISIBLE_DEVICES names the whole GPU, set MIG-<uuid> in environment to pick MIG instances"
            % format_cpulist(mig)
        )


def _nics(spec, topo, gpus, environment):
    """``(nics, gpu_nics)``: the NICs near the instance's GPUs (or on its nodes), and nic_environment's variables."""
    gpu_nics = [topo.nics_near_gpu(g)[0] for g in gpus]
    nics = []
    for names in gpu_nics if gpus else [topo.nics_on_node(n) for n in spec.numa_nodes]:
        nics.extend(n for n in names if n not in nics)
    if spec.nic_environment:
        if not nics:
            spec.warnings.append(
                "nic_environment: no NIC is near %s on %s (no PIX/PXB link, none on its NUMA node); %s not set"
                % ("GPU %s" % format_cpulist(gpus) if gpus else "NUMA node %s" % format_cpulist(spec.numa_nodes),
                   topo.hostname, ", ".join(spec.nic_environment))
            )
        else:
            for variable in spec.nic_environment:
                value = nic_environment_value(variable, [topo.nic(n) for n in nics])
                if value is None:
                    spec.warnings.append("nic_environment: NICs %s are no RDMA devices; %s not set"
                                         % (", ".join(nics), variable))
                else:
                    environment[variable] = value
    return nics, gpu_nics


def render_instance(spec, topo, profile, fence=None):
    """The plan entry of one instance (docs/plan-v1.md, Output)."""
    gpus = list(spec.gpus) if spec.placement != "numa_node" else []
    uuids = [topo.gpus[g].uuid for g in gpus]
    cpus = spec.cpus_text
    mem_nodes = list(spec.mem_nodes) if spec.mem_policy != "default" else []
    args, exec_prefix, systemd = _binding(spec, cpus, mem_nodes, fence)

    # Secret values never reach the plan (common/secrets.py): only their names.
    environment = {k: v for k, v in spec.environment.items() if k not in spec.secret_names}
    if gpus and any(topo.gpus[g].vendor == "amd" for g in gpus):
        ordinals = sorted(g for g, gpu in topo.gpus.items() if gpu.vendor == "amd")
        _rocm_environment(spec, gpus, uuids, [ordinals.index(g) for g in gpus], environment)
    elif gpus:
        _cuda_environment(spec, topo, gpus, uuids, environment)
    nics, gpu_nics = _nics(spec, topo, gpus, environment)

    return {
        "name": spec.name,
        "unit": spec.unit,
        "mode": spec.mode,
        "binding_method": spec.binding_method,
        "gpus": gpus,
        "gpu_uuids": uuids,
        "numa_nodes": list(spec.numa_nodes),
        "numa_bind_nodes": list(spec.numa_bind_nodes),
        "cpus": cpus,
        "share_cpus": spec.share_cpus,
        "mem_policy": spec.mem_policy,
        "mem_nodes": mem_nodes,
        "profile": profile["name"],
        "fallback": spec.fallback,
        "numactl_args": args,
        "exec_prefix": exec_prefix,
        "systemd": systemd,
        "environment": dict(sorted(environment.items())),
        "secret_environment": list(spec.secret_names),
        "command": list(spec.command) + list(spec.engine_args) if spec.command is not None else None,
        "engine": spec.engine,
        "engine_version": ".".join(str(p) for p in spec.engine_version) if spec.engine_version else None,
        "engine_args": list(spec.engine_args),
        "worker_cpus": [format_cpulist(c) for c in spec.worker_cpus] if spec.worker_cpus is not None else None,
        "user": spec.user,
        "group": spec.group,
        "memory_bytes": spec.memory_bytes,
        "memlock": spec.memlock,
        "pinned_bytes": spec.pinned_bytes,
        "pinned_source": spec.pinned_source,
        "ready": spec.ready,
        "nics": nics,
        "gpu_nics": gpu_nics,
        "warnings": list(spec.warnings),
    }


def _rocm_environment(spec, gpus, uuids, ordinals, environment):
    """ROCR_VISIBLE_DEVICES for an instance of AMD GPUs: by the UUIDs ROCm shows (GPU-<unique_id>), else by
    ordinal in the order ROCm enumerates the node's AMD GPUs (KFD node order, as discovery numbers them;
    ``ordinals``: each GPU's place among the AMD GPUs, which differs from its index on a node that also has
    NVIDIA GPUs). Partitions of one GPU share its unique_id, so they are always selected by ordinal.
    HIP_VISIBLE_DEVICES is left out: HIP applies it after ROCR's and counts within the GPUs ROCR left, so
    setting both would filter twice (ROCm documentation, "GPU isolation techniques")."""
    if all(uuids):
        environment["ROCR_VISIBLE_DEVICES"] = ",".join(uuids)
        return
    environment["ROCR_VISIBLE_DEVICES"] = ",".join(str(o) for o in ordinals)
    without = format_cpulist([g for g, u in zip(gpus, uuids) if not u])
    spec.warnings.append(
        "GPU %s has no UUID of its own in the topology (amdgpu's unique_id; partitions share their GPU's); "
        "ROCR_VISIBLE_DEVICES uses ROCm's ordinals %s" % (without, ",".join(str(o) for o in ordinals))
    )
