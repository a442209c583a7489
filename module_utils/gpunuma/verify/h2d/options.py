"""The probe's options, their defaults and their check (verify/h2d/probe.py)."""

from __future__ import annotations


from ansible.module_utils.gpunuma.common import schemas
from ansible.module_utils.gpunuma.verify.h2d import load as h2d_load
from ansible.module_utils.gpunuma.verify.h2d.hip import DEFAULT_PATH as HIP_DEFAULT_PATH, RUNTIMES
from ansible.module_utils.gpunuma.verify.h2d.host import (
    ProbeError)

SCHEMA = schemas.H2D_PROBE
PLACEMENTS = ("local", "remote", "unbound")
PINNED_ALLOCS = ("register", "host_alloc")
# Small copies made, and discarded, before the small-copy figures (at least; ``warmup`` when larger).
SMALL_WARMUP_COPIES = 100
MiB = 1024 * 1024

DEFAULTS = {
    "placements": list(PLACEMENTS),
    "large_bytes": 256 * MiB,
    "small_bytes": 4096,
    "repeats": 10,
    "small_repeats": 1000,
    "warmup": 3,
    # Interleaved rounds per placement (A B C, B C A, ...), after one warm-up
    # round that is measured and discarded (verify/stats.py).
    "rounds": 5,
    "warmup_round": True,
    "pinned_alloc": "register",
    "timeout_s": 120,
    "libcuda_path": "libcuda.so.1",
    # CUDA's driver API or HIP (verify/h2d/hip.py); auto: CUDA where libcuda loads, else HIP.
    "runtime": "auto",
    "libhip_path": HIP_DEFAULT_PATH,
    "remote_node": None,
    "gpus": None,
    # Load while measuring (verify/h2d/load.py): idle, copies, memory or both.
    "load": "idle",
    "load_memory_workers": h2d_load.DEFAULT_MEMORY_WORKERS,
    "load_max_seconds": h2d_load.DEFAULT_MAX_SECONDS,
    "load_memory_node": None,
    "load_cpus": None,
}


# ---------------------------------------------------------------- options


def check_options(opts):
    """Validate every option up front; return a complete option dict or raise ProbeError listing all problems."""
    out = dict(DEFAULTS)
    errors = []
    for key in opts:
        if key not in DEFAULTS:
            errors.append("unknown option %r; allowed: %s" % (key, ", ".join(sorted(DEFAULTS))))
    out.update({k: v for k, v in opts.items() if k in DEFAULTS and v is not None})

    def positive_int(name, low, high):
        value = out[name]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            errors.append("%s is %r; it must be an integer from %d to %d" % (name, value, low, high))

    positive_int("large_bytes", 4096, 16 * 1024 * MiB)
    positive_int("small_bytes", 1, 64 * MiB)
    positive_int("repeats", 1, 10000)
    positive_int("small_repeats", 10, 1000000)
    positive_int("warmup", 0, 1000)
    positive_int("timeout_s", 1, 3600)
    positive_int("rounds", 1, 50)
    if not isinstance(out["warmup_round"], bool):
        errors.append("warmup_round is %r; it must be true or false" % (out["warmup_round"],))
    if not errors and out["small_bytes"] > out["large_bytes"]:
        errors.append("small_bytes is %d, larger than large_bytes (%d); the small copies reuse the large device buffer"
                      % (out["small_bytes"], out["large_bytes"]))
    placements = out["placements"]
    if not isinstance(placements, (list, tuple)) or not placements:
        errors.append("placements is %r; it must be a non-empty list of %s" % (placements, ", ".join(PLACEMENTS)))
    else:
        bad = [p for p in placements if p not in PLACEMENTS]
        if bad:
            errors.append("placements has %s; allowed: %s" % (", ".join(repr(b) for b in bad), ", ".join(PLACEMENTS)))
        elif len(set(placements)) != len(placements):
            errors.append("placements %r lists a placement twice" % (placements,))
        else:
            out["placements"] = [p for p in PLACEMENTS if p in placements]
    if out["pinned_alloc"] not in PINNED_ALLOCS:
        errors.append("pinned_alloc is %r; allowed: %s" % (out["pinned_alloc"], ", ".join(PINNED_ALLOCS)))
    remote = out["remote_node"]
    if remote is not None and (isinstance(remote, bool) or not isinstance(remote, int) or remote < 0):
        errors.append("remote_node is %r; it must be a NUMA node id (integer >= 0)" % (remote,))
    gpus = out["gpus"]
    if gpus is not None:
        if not isinstance(gpus, (list, tuple)) or not all(isinstance(g, (str, int)) and not isinstance(g, bool) for g in gpus):
            errors.append("gpus is %r; it must be a list of GPU indices, UUIDs or PCI bus ids" % (gpus,))
    errors.extend(h2d_load.check(out["load"], out["load_memory_workers"], out["load_max_seconds"],
                                 out["load_memory_node"], out["load_cpus"]))
    for key in ("libcuda_path", "libhip_path"):
        if not isinstance(out[key], str) or not out[key]:
            errors.append("%s is %r; it must be a library name or path" % (key, out[key]))
    if out["runtime"] not in RUNTIMES:
        errors.append("runtime is %r; allowed: %s" % (out["runtime"], ", ".join(RUNTIMES)))
    if errors:
        raise ProbeError("; ".join(errors))
    return out
