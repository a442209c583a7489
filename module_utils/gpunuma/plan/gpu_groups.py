"""GPU grouping (plan/alloc.py's first step): which GPUs a ``gpus_per_instance`` instance gets, the group
whose links rank best (NVLink, XGMI, then the PCIe path), grown greedily past ``MAX_GROUP_COMBINATIONS``."""

from __future__ import annotations

import itertools
import math

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist

# Above this many candidate GPU groups the planner grows groups greedily
# from each seed GPU instead of scoring every combination.
MAX_GROUP_COMBINATIONS = 5000


def _group_key(group, topo):
    nodes = set(topo.gpus[g].node for g in group)
    ranks = [topo.link(a, b) for a, b in itertools.combinations(group, 2)]
    return (
        len(nodes),
        None in nodes,
        -(min(ranks) if ranks else 0),
        -sum(ranks),
        tuple(group),
    )


def _grow_group(seed, pool, size, topo):
    group = [seed]
    seed_node = topo.gpus[seed].node
    rest = [g for g in pool if g != seed]
    while len(group) < size:
        best = min(
            rest,
            key=lambda g: (
                topo.gpus[g].node != seed_node,
                -min(topo.link(g, m) for m in group),
                -sum(topo.link(g, m) for m in group),
                g,
            ),
        )
        group.append(best)
        rest.remove(best)
    return sorted(group)


def choose_gpu_group(pool, size, topo):
    """The best ``size`` GPUs out of ``pool``: fewest NUMA nodes, then best links.

    Links compare by the weakest pair first, then by the sum over all
    pairs; ties go to the lowest indexes, so the choice is deterministic.
    """
    pool = sorted(pool)
    if math.comb(len(pool), size) <= MAX_GROUP_COMBINATIONS:
        candidates = itertools.combinations(pool, size)
    else:
        candidates = (_grow_group(seed, pool, size, topo) for seed in pool)
    return list(min(candidates, key=lambda group: _group_key(group, topo)))


def assign_gpus(specs, topo, warnings, problems):
    """``spec.gpus``: the GPUs named, or the best group for a ``gpus_per_instance`` count."""
    claimed = {}
    for spec in specs:
        if spec.placement != "gpus":
            continue
        spec.gpus = list(spec.requested_gpus)
        for index in spec.gpus:
            if index in claimed:
                other = claimed[index]
                message = "GPU %d is also used by instance %r; both run on it" % (index, other.name)
                # The plan lists every instance warning once, prefixed with its name.
                spec.warnings.append(message)
            else:
                claimed[index] = spec
    pool = [g for g in topo.gpu_ids if g not in claimed]
    for spec in specs:
        if spec.placement != "gpus_per_instance":
            continue
        size = spec.requested_gpu_count
        if size > len(pool):
            problems.append(
                "%s.gpus_per_instance: needs %d GPUs but only %d are left on %s (%s taken by other instances); allowed: at most %d"
                % (
                    spec.path,
                    size,
                    len(pool),
                    topo.hostname,
                    format_cpulist(set(topo.gpu_ids) - set(pool)) or "none",
                    len(pool),
                )
            )
            spec.gpus = []
            continue
        group = choose_gpu_group(pool, size, topo)
        spec.gpus = group
        pool = [g for g in pool if g not in group]
        claimed.update((g, spec) for g in group)
    unused = [g for g in topo.gpu_ids if g not in claimed]
    if unused and specs:
        warnings.append("GPUs %s of %s are not used by any instance" % (format_cpulist(unused), topo.hostname))
