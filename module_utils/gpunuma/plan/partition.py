"""The partitioner: every CPU carve-out of a node goes through here, L3-aware and sibling-whole.

A carve-out hands out *cores* (hyperthread sibling groups, never split) of
one NUMA node. Three kinds of request reach it:

* ``split(cores, l3_groups, count)``: the node's free cores shared by
  ``count`` instances (instance shares). Whole L3 domains per part where the
  counts allow (a linear partition of the L3 runs minimising the largest
  part), else an even split in core order.
* ``take(free, l3_groups, want)``: a counted instance (``cpus: N``): ``want``
  cores touching as few L3 domains as the count allows (whole free domains
  first, the rest from the domain it fits best), else the first free cores.
* ``rank_slices(cores, l3_groups, count)``: the per-GPU slices of a
  tensor-parallel instance's share. Every slice lies in one L3 domain where
  the share spans enough of them, slices are equal, and the cores left over
  stay with the instance for the engine's API server and engine core.

The L3 rule follows the kubelet's ``prefer-align-cpus-by-uncorecache`` CPU
Manager option (KEP-4800) and torchrun's ``--numa-binding core-complex``:
a worker whose cores share one last-level cache keeps its working set and
its cache-line traffic on one CCD/CCX. With no L3 information, or one domain
for the whole node, every request is served in core order as before.
"""

from __future__ import annotations


def _runs(cores, l3_groups):
    """``cores`` (in order) grouped by L3 domain, in domain order; None when a core is in no domain."""
    runs = []
    for l3 in l3_groups or []:
        mine = [core for core in cores if core <= l3]
        if mine:
            runs.append(mine)
    if sum(len(r) for r in runs) != len(cores):
        return None
    return runs


def even_split(cores, count):
    """``cores`` cut into ``count`` contiguous parts whose sizes differ by at most one."""
    base, extra = divmod(len(cores), count)
    parts, start = [], 0
    for rank in range(count):
        size = base + (1 if rank < extra else 0)
        parts.append(list(cores[start:start + size]))
        start += size
    return parts


def split(cores, l3_groups, count):
    """``(parts, aligned)``: ``cores`` shared by ``count`` instances, whole L3 domains each when ``aligned``.

    Whole domains are used when the node has at least ``count`` of them among
    ``cores`` and the linear partition's largest part is within one domain's
    size of an even split; otherwise the even split in core order.
    """
    if count < 1:
        return [], False
    runs = _runs(cores, l3_groups) if count > 1 else None
    if not runs or len(runs) < count:
        return even_split(cores, count), False
    sizes = [len(r) for r in runs]
    n = len(sizes)
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    # best[k][i]: the smallest possible largest part when the first i runs form k parts
    inf = float("inf")
    best = [[inf] * (n + 1) for _unused in range(count + 1)]
    cut = [[0] * (n + 1) for _unused in range(count + 1)]
    best[0][0] = 0
    for k in range(1, count + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i] = value
                    cut[k][i] = j
    bounds = []
    i = n
    for k in range(count, 0, -1):
        j = cut[k][i]
        bounds.append((j, i))
        i = j
    bounds.reverse()
    parts = [[core for run in runs[a:b] for core in run] for a, b in bounds]
    even = -(-len(cores) // count)
    if max(len(p) for p in parts) - even >= max(sizes):
        return even_split(cores, count), False
    return parts, True


def take(free, l3_groups, want):
    """``want`` cores of ``free`` touching as few L3 domains as possible.

    Whole free domains first (largest first, then in order), while the
    remainder is at least a domain; then the remainder from the domain whose
    free cores fit it best (the fewest that still hold it), else from the
    largest. Without L3 information, or with fewer than ``want`` free cores:
    the first ``want`` (the caller reports a shortfall).
    """
    if want <= 0:
        return []
    runs = _runs(free, l3_groups)
    if not runs or len(runs) < 2 or len(free) < want:
        return list(free[:want])
    pools = [list(r) for r in runs]
    chosen_runs = []
    need = want
    while need > 0:
        fits = [p for p in pools if p and len(p) >= need]
        if fits:
            pool = min(fits, key=len)  # best fit: leave the larger domains whole for others
            chosen_runs.append(pool[:need])
            del pool[:need]
            need = 0
            break
        pool = max(pools, key=len)
        chosen_runs.append(list(pool))
        need -= len(pool)
        del pool[:]
    return sorted((core for run in chosen_runs for core in run), key=min)


def rank_slices(cores, l3_groups, count):
    """``(slices, aligned)``: ``count`` per-rank slices of ``cores``, L3-aligned when ``aligned``.

    With at least ``count`` L3 domains among ``cores``, each rank gets whole
    domains (``split``). With fewer, the ranks are dealt to the L3 domains of ``cores`` by the largest
    remaining share (domain cores / (ranks there + 1)), so each slice lies in
    one domain and the slices are as large as an equal split allows; cores
    beyond ``count`` x the slice size stay unassigned (the instance keeps
    them: the engine's API server and engine core run there). Without L3
    information, with one domain, or when some rank would get no core: the
    even split of every core in order, not aligned.
    """
    if count < 1:
        return [], False
    runs = _runs(cores, l3_groups)
    if not runs or len(runs) < 2:
        return even_split(cores, count), False
    if len(runs) >= count:
        # Whole domains per rank.
        return split(cores, l3_groups, count)
    ranks = [0] * len(runs)
    for _unused in range(count):
        best = max(range(len(runs)), key=lambda i: (len(runs[i]) / (ranks[i] + 1), -i))
        ranks[best] += 1
    size = min(len(runs[i]) // ranks[i] for i in range(len(runs)) if ranks[i])
    if size < 1:
        return even_split(cores, count), False
    slices = []
    for i, run in enumerate(runs):
        for rank in range(ranks[i]):
            slices.append(run[rank * size:(rank + 1) * size])
    return slices, True
