# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The numa_binding role's planning step against one read of the node, decided at once.

From what ``gpunuma_node_info`` read (the applied plan, the memory policy probe, the units drop-in instances
bind, the instances' programs) and the planner's inputs: the applied plan read safely, the plan, whether the
node allows memory policies (and, where it refuses them and the user chose ``fallback``, the CPU-only plan of
the same profile, ``ProfileName(base, "cpu-only")``), and every reason to stop before anything is written:
a damaged ``plan.json``, bad instance input, numactl unable to set a policy, drop-in units that cannot be
bound, programs that cannot run. The role's ``gpu_binding_plan`` task calls :func:`plan_for_node` once.
"""

from __future__ import annotations

from typing import Any, Sequence

from ansible.module_utils.gpunuma.common import schemas
from ansible.module_utils.gpunuma.common.errors import GpunumaError
from ansible.module_utils.gpunuma.node import accounts as accountslib
from ansible.module_utils.gpunuma.node import programs as programslib
from ansible.module_utils.gpunuma.common.seal import read_state_file
from ansible.module_utils.gpunuma.plan.planner import build_plan
from ansible.module_utils.gpunuma.plan.profiles import profile_variant

MEMPOLICY_STATES = ("not-probed", "allowed", "denied", "no-numactl", "error")


def read_applied_plan(content, path, host):
    """The node's applied plan (slurp content) as ``{data, problem}``."""
    return read_state_file(
        content,
        "%s:%s" % (host, path),
        schemas.PLAN,
        "It is read to leave running instances' own memory out of the free-memory check, and is rewritten "
        "(with a backup) only after a successful apply. To recover, move it aside on the node "
        "(mv %s %s.damaged) and run again; earlier plans are kept beside it as %s.<pid>.<time>~ backups."
        % (path, path, path),
    )


def mempolicy_state(probe, plan):
    """How the node answered ``numactl --localalloc true`` (one of :data:`MEMPOLICY_STATES`); ``not-probed``
    when it was not run or no instance of ``plan`` asks for a memory policy."""
    if probe is None or not [i for i in plan["instances"] if i.get("mem_policy") != "default"]:
        return "not-probed"
    if probe.get("rc") == 0:
        return "allowed"
    if "Operation not permitted" in (probe.get("stderr") or ""):
        return "denied"
    if "No such file" in (probe.get("msg") or "") + (probe.get("stderr") or ""):
        return "no-numactl"
    return "error"


def missing_targets(plan, units, host):
    """One message per drop-in instance whose unit the node cannot load (``units``: gpunuma_node_info's)."""
    problems = []
    for instance in (plan or {}).get("instances") or []:
        if instance.get("mode") != "dropin":
            continue
        state = (units or {}).get(instance.get("unit")) or {"LoadState": "unknown"}
        load = state.get("LoadState") or ""
        if load == "loaded":
            continue
        why = ("is not installed" if load == "not-found"
               else "systemd cannot load (%s)" % (load or state.get("error") or "no LoadState"))
        problems.append("%s: gpunuma_instances entry '%s' binds unit %s, which %s on this node; allowed: an existing "
                        "service unit, or leave out unit (and give command) for a gpunuma-<name>.service"
                        % (host, instance.get("name"), instance.get("unit"), why))
    return problems


def dropin_hazards(plan, inspected, host):
    """One message per drop-in instance whose unit a drop-in cannot bind safely (``inspected``: gpunuma_node_info's
    ``inspect``): its own ExecStart= launches a container through a CLI (the drop-in would bind the CLI, not the
    workload) and the instance gives no command; or its EnvironmentFile= sets CUDA_VISIBLE_DEVICES, which wins
    over the drop-in's Environment= (systemd.exec(5)), for an instance with GPUs."""
    problems = []
    for instance in (plan or {}).get("instances") or []:
        if instance.get("mode") != "dropin":
            continue
        found = (inspected or {}).get(instance.get("unit")) or {}
        where = "%s: gpunuma_instances entry '%s' binds unit %s" % (host, instance.get("name"), instance.get("unit"))
        launchers = found.get("container_launchers") or []
        if launchers and not instance.get("command"):
            problems.append(
                "%s, whose ExecStart= launches a container (%s): the binding would hold the CLI, not the workload. "
                "Bind the container itself (its runtime's cpuset/NUMA options, or the kubelet role), give the instance "
                "a command, or set numa_binding_allow_dropin_hazards: true" % (where, ", ".join(launchers)))
        cuda = [line for line in found.get("cuda_visible_devices") or [] if not line.startswith("Environment=")]
        if cuda and instance.get("gpus"):
            problems.append(
                "%s, whose EnvironmentFile= sets CUDA_VISIBLE_DEVICES (%s), which overrides the drop-in's GPUs %s. "
                "Remove it from the file, or set numa_binding_allow_dropin_hazards: true"
                % (where, "; ".join(cuda), ",".join(str(g) for g in instance.get("gpus"))))
    return problems


def _mempolicy_problem(state, probe, argv, plan, host, on_denied):
    shown = " ".join(argv)
    if state == "error":
        return ("%s: `%s` failed (rc %s): %s. The instances' memory policies cannot be applied on this node; use "
                "gpunuma_profile: off here." % (host, shown, probe.get("rc"),
                                                (probe.get("stderr") or "").strip() or probe.get("msg") or ""))
    if state == "denied" and on_denied == "fail":
        needing = [i for i in plan["instances"] if i.get("mem_policy") != "default"]
        return ("%s: set_mempolicy is refused here (`%s`: %s), but instances %s need a memory policy (%s). The node "
                "is a container or pod without CAP_SYS_NICE: Docker's default seccomp profile refuses set_mempolicy "
                "and mbind unless the container runs with --cap-add SYS_NICE; in Kubernetes add SYS_NICE to the "
                "container's securityContext.capabilities.add. Grant it, or set numa_binding_on_mempolicy_denied: "
                "fallback to bind CPUs only (memory policy default), or use gpunuma_profile: off."
                % (host, shown, (probe.get("stderr") or "").strip(), ", ".join(i["name"] for i in needing),
                   ", ".join(dict.fromkeys(i["mem_policy"] for i in needing))))
    return None


def plan_for_node(topology: dict, profile: Any, instances: Any, node: dict, host: str, plan_path: str, options: dict,
                  mempolicy_argv: Sequence[str] = ("numactl",)) -> dict:
    """``{plan, applied, problems, notices, mempolicy}`` for one node (``plan`` None when a problem stops it;
    ``applied``: the node's applied plan, None when it has none).

    ``node``: ``gpunuma_node_info``'s result (``files.plan``, ``commands.mempolicy``, ``units``, ``inspect``,
    ``programs``); ``options``: :func:`build_plan`'s keyword options plus ``on_mempolicy_denied`` (fail |
    fallback), ``allow_dropin_hazards``, ``start`` and ``create_user`` (node/accounts.missing_account_problems).
    """
    options = dict(options)
    on_denied = options.pop("on_mempolicy_denied", "fail")
    allow_hazards = options.pop("allow_dropin_hazards", False)
    start = options.pop("start", True)
    create_user = options.pop("create_user", False)
    node = node or {}
    out: dict = {"plan": None, "applied": None, "problems": [], "notices": [], "mempolicy": "not-probed"}
    plan_file = (node.get("files") or {}).get("plan") or {}
    applied = read_applied_plan(plan_file["content"], plan_path, host) if "content" in plan_file else {"data": None}
    if applied.get("problem"):
        out["problems"].append(applied["problem"])
        return out
    out["applied"] = applied["data"]
    try:
        plan = build_plan(topology, profile, instances, applied_plan=applied["data"], **options)
        probe = (node.get("commands") or {}).get("mempolicy")
        out["mempolicy"] = state = mempolicy_state(probe, plan)
        problem = _mempolicy_problem(state, probe or {}, mempolicy_argv, plan, host, on_denied)
        if problem:
            out["problems"].append(problem)
            return out
        if state == "denied" and on_denied == "fallback":
            variant = profile_variant(profile["name"], "cpu-only")
            cpu_only = dict(profile, name=variant, mem_policy="default", mem_scope="instance",
                            description="%s with the memory policy left at default: the node refuses set_mempolicy"
                            % profile["name"])
            plan = build_plan(topology, cpu_only, instances, applied_plan=applied["data"], **options)
            warning = ("set_mempolicy is refused on %s (no CAP_SYS_NICE); profile %s is applied as %s: CPUs are bound, "
                       "memory follows the default policy" % (host, profile["name"], variant))
            plan["warnings"].append(warning)
            out["notices"].append("WARNING %s: %s" % (host, warning))
    except GpunumaError as exc:
        problems = list(getattr(exc, "problems", [str(exc)]))
        out["problems"].append("%s: the binding plan cannot be made:\n%s%s" % (host, "\n".join(problems), (
            "\n(applied_plan is %s:%s, the plan the node runs now; if it is damaged, move it aside on the node and run "
            "again)" % (host, plan_path)) if any("applied_plan" in p for p in problems) else ""))
        return out
    problems = missing_targets(plan, node.get("units"), host)
    if not allow_hazards:
        problems += dropin_hazards(plan, node.get("inspect"), host)
    problems += programslib.program_problems(plan, node.get("programs"), host, start)
    problems += accountslib.missing_account_problems(plan, node.get("accounts"), host, start, create_user)
    if problems:
        out["problems"].extend(problems)
        return out
    out["plan"] = plan
    return out
