# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Pinned host memory: each instance's budget, where it lands, and whether each NUMA node can hold it.

Pinned (page-locked) memory is what makes host-to-device copies asynchronous. It cannot be swapped, migrated or
reclaimed as page cache, so a node full of pinned pools leaves the rest of the node nothing to reclaim; and a
process may lock only what ``RLIMIT_MEMLOCK`` allows (getrlimit(2); the kernel charges mlock(2) and RDMA
registrations against it). An instance states its budget with ``pinned`` (a size, within its ``memory``).

* Where it lands: the pool is first touched by the instance, under its memory policy (Documentation/admin-guide/
  mm/numa_memory_policy.rst): on its bound or preferred node, spread over its nodes when interleaved, on its
  CPUs' node when its memory is not bound.
* What a node holds: of what it holds for instances (``memory_capacity``), ``pinned_page_cache_percent`` stays
  for page cache and other reclaimable memory; pinned pools share the rest. This is gpunuma's default (10 %),
  not a vendor figure: set it for the node's workload.
* Derived budgets: without ``pinned``, an engine option or variable that sizes a pinned pool states it
  (:func:`derived_budget`; docs/plan-v1.md, "Pinned budgets from the engine", cites each).
* The limit: the unit gets ``LimitMEMLOCK=`` of the budget plus ``pinned_headroom`` (libraries register buffers
  of their own: NCCL, UCX), unless the instance sets ``memlock`` itself (plan/planner.unit_memlock).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple

from ansible.module_utils.gpunuma.common import sizes
from ansible.module_utils.gpunuma.common.argv import long_options
from ansible.module_utils.gpunuma.common.sizes import format_gib
from ansible.module_utils.gpunuma.plan.model import is_int

DEFAULT_HEADROOM = "1G"
DEFAULT_PAGE_CACHE_PERCENT = 10


def parse_headroom(value, problems, what="pinned_headroom"):
    """``pinned_headroom`` in bytes (0 allowed), or None with a problem naming ``what``."""
    try:
        return sizes.parse_size(value, what, allowed="0, bytes as an integer, or a size like 1G")
    except sizes.SizeError as exc:
        problems.append(str(exc))
        return None


def check_page_cache_percent(value, problems, what="pinned_page_cache_percent"):
    """``pinned_page_cache_percent``: a whole number 0 to 90 (a problem naming ``what`` otherwise)."""
    if not is_int(value) or isinstance(value, bool) or not 0 <= int(value) <= 90:
        problems.append("%s: %r is not allowed; allowed: a whole number from 0 to 90 (the share of a node's memory "
                        "for instances kept for page cache)" % (what, value))
        return None
    return int(value)


GIB = 1 << 30
GB = 10 ** 9
# Values an engine reads as "off" in a boolean variable.
_FALSE = ("0", "false", "no", "off", "")


def _options(command):
    """``{option: value}`` of an argv list (common/argv.long_options; the last of a repeated option wins),
    underscores read as dashes (vLLM's and SGLang's parsers take both spellings)."""
    return {"--" + name.replace("_", "-"): value for name, value in long_options(command)}


def _amount(text):
    """A non-negative finite number from option text, or None."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


def derived_budget(engine: str, command: Any, environment: Any, ranks: int) -> Tuple[Optional[int], Optional[str]]:
    """``(bytes, source)`` of the pinned pools an instance's own engine options state, ``(None, why)`` when the
    command turns a pool on whose size it does not state, or ``(None, None)``.

    ``ranks``: the instance's GPUs (one worker process each). What is read, by engine (docs/plan-v1.md):

    * vLLM ``--cpu-offload-gb N``: N GiB per GPU of weights in CPU-pinned memory (vllm/config, UVAOffloadConfig);
      ``--kv-offloading-size N`` (backend ``native``, the default): N GiB of CPU KV blocks in all, across the ranks
      (vllm/config/cache.py, VllmConfig._post_init_kv_transfer_config);
    * SGLang ``--hicache-size N`` with ``--enable-hierarchical-cache``: N GB (10^9 bytes) of host KV pool per rank
      (SGLang's hierarchical cache docs); without it the pool follows ``--hicache-ratio`` of the GPU pool;
    * LMCache (either engine): ``LMCACHE_MAX_LOCAL_CPU_SIZE`` GiB per worker, allocated pinned
      (lmcache/v1/cache_engine.py, ``max_local_cpu_size * 1024**3``), unless ``LMCACHE_LOCAL_CPU`` is off.
    """
    options = _options(command)
    ranks = max(1, ranks)
    total, said = 0, []
    if engine == "vllm":
        offload = _amount(options.get("--cpu-offload-gb"))
        if offload:
            total += int(offload * GIB) * ranks
            said.append("vLLM --cpu-offload-gb %s (GiB per GPU, %d GPU%s)"
                        % (options["--cpu-offload-gb"], ranks, "s" if ranks > 1 else ""))
        kv = _amount(options.get("--kv-offloading-size"))
        if kv and options.get("--kv-offloading-backend", "native") == "native":
            total += int(kv * GIB)
            said.append("vLLM --kv-offloading-size %s (GiB across the ranks)" % options["--kv-offloading-size"])
    if engine == "sglang" and "--enable-hierarchical-cache" in options:
        host = _amount(options.get("--hicache-size"))
        if not host:
            return None, ("SGLang's hierarchical cache is sized by --hicache-ratio against the GPU pool, unknown before "
                          "it starts: state pinned (or --hicache-size) to budget it")
        total += int(host * GB) * ranks
        said.append("SGLang --hicache-size %s (GB per rank, %d rank%s)"
                    % (options["--hicache-size"], ranks, "s" if ranks > 1 else ""))
    environment = environment if isinstance(environment, dict) else {}
    local_cpu = str(environment.get("LMCACHE_LOCAL_CPU", "true")).strip().lower() not in _FALSE
    lmcache = _amount(environment.get("LMCACHE_MAX_LOCAL_CPU_SIZE"))
    if engine in ("vllm", "sglang") and lmcache and local_cpu:
        total += int(lmcache * GIB) * ranks
        said.append("LMCACHE_MAX_LOCAL_CPU_SIZE=%s (GiB per worker, %d worker%s)" % (
            environment["LMCACHE_MAX_LOCAL_CPU_SIZE"], ranks, "s" if ranks > 1 else ""))
    if not total:
        return None, None
    return total, "; ".join(said)


def derive_budgets(specs: list, problems: list) -> None:
    """Each instance without ``pinned`` gets the budget its engine options state (``pinned_bytes``,
    ``pinned_source``); one over its ``memory`` is a problem naming the options."""
    for spec in specs:
        if spec.pinned_bytes is not None:
            spec.pinned_source = "pinned"
            continue
        budget, why = derived_budget(spec.engine, spec.command, spec.environment, len(spec.gpus))
        if budget is None:
            if why:
                spec.warnings.append("pinned budget unknown: " + why)
            continue
        if spec.memory_bytes is not None and budget > spec.memory_bytes:
            problems.append("%s.command: %s pin %s, more than the instance's memory (%s); allowed: a memory that "
                            "holds the pinned pools, or smaller pools" % (spec.path, why, format_gib(budget),
                                                                          format_gib(spec.memory_bytes)))
            continue
        spec.pinned_bytes, spec.pinned_source = budget, why


def pool_nodes(spec: Any) -> dict:
    """``{node id: bytes}``: where an instance's pinned pool lands (its first touch, under its memory policy)."""
    if not spec.pinned_bytes:
        return {}
    if spec.mem_policy == "interleave" and spec.mem_nodes:
        nodes = sorted(spec.mem_nodes)
        share, rest = divmod(spec.pinned_bytes, len(nodes))
        return {n: share + (1 if i < rest else 0) for i, n in enumerate(nodes)}
    nodes = spec.mem_nodes if spec.mem_policy in ("bind", "preferred") and spec.mem_nodes else spec.numa_nodes
    return {nodes[0]: spec.pinned_bytes} if nodes else {}


def check_pinned(specs: list, capacity: dict, page_cache_percent: Optional[int], strict_capacity: str,
                 problems: list) -> dict:
    """``{node id: bytes}``: the pinned budgets per node; a node whose pools exceed what it holds for them is a
    problem (``strict_capacity: error``) or a warning on each instance there (``fallback``: pinned memory cannot
    spill; its allocation fails or the node stops reclaiming)."""
    budget: dict = {}
    members: dict = {}
    for spec in specs:
        for node_id, nbytes in pool_nodes(spec).items():
            budget[node_id] = budget.get(node_id, 0) + nbytes
            members.setdefault(node_id, []).append(spec)
    if page_cache_percent is None:
        return budget
    for node_id in sorted(budget):
        held = capacity.get(node_id)
        if isinstance(held, bool) or not isinstance(held, int):
            for spec in members[node_id]:
                spec.warnings.append("memory size of NUMA node %s is unknown; the pinned budget was not checked"
                                     % node_id)
            continue
        room = held - held * page_cache_percent // 100
        if budget[node_id] <= room:
            continue
        what = "pinned %s on NUMA node %s (%s) exceeds the %s it holds for pinned pools (%s for instances less %d %% "
        what = what % (format_gib(budget[node_id]), node_id, ", ".join(s.name for s in members[node_id]),
                       format_gib(room), format_gib(held), page_cache_percent)
        what += "kept for page cache); pinned memory is never reclaimed"
        if strict_capacity == "error":
            paths = ", ".join("%s.pinned" % s.path for s in members[node_id])
            problems.append("%s: %s; allowed: at most %s pinned on this node, or a smaller pinned_page_cache_percent"
                            % (paths, what, format_gib(room)))
        else:
            for spec in members[node_id]:
                spec.warnings.append(what + ": the pool's allocation may fail, or the node stall reclaiming")
    return budget
