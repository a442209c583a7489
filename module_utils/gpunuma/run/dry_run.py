"""What site.yml would change on a host, from the check-mode results of its apply play (plan.yml's dry run).

plan.yml runs site.yml's validation play and then its apply play (playbooks/provision.yml) in check mode: every
step reports what it would do and does nothing. ``changes`` turns those results into one (change, what) pair per
thing the run would do; ``table`` lays the hosts out as the lines plan.yml prints.
"""

from __future__ import annotations

WIDTH = 8  # the change column: "install", "write", "remove", "restart", ...


def _listed(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else []


def _apply_changes(result: object, what: str = "") -> list[tuple[str, str]]:
    """The pairs of one gpunuma_apply step's check-mode result; ``what`` prefixes the unit names."""
    if not isinstance(result, dict) or result.get("skipped"):
        return []
    out = []
    account = result.get("account")
    if isinstance(account, dict) and account.get("changed"):
        out.append(("create", "account %s" % account.get("name")))
    for entry in _listed(result.get("files")):
        if isinstance(entry, dict) and entry.get("changed"):
            out.append(("write", "%s%s" % (entry.get("path"), " (new)" if entry.get("created") else "")))
    for path in _listed(result.get("removed")):
        out.append(("remove", str(path)))
    for unit in _listed(result.get("stopped_for_change")):
        out.append(("stop", "%s%s, for its change, then start it" % (what, unit)))
    for unit in _listed(result.get("restarted")):
        out.append(("restart", "%s%s" % (what, unit)))
    for unit in _listed(result.get("started")):
        out.append(("start", "%s%s" % (what, unit)))
    record = result.get("state_record")
    if isinstance(record, dict) and record.get("changed"):
        state = record.get("state")
        state = state if isinstance(state, dict) else {}
        out.append(("record", "profile %s in the node's state" % state.get("profile", "?")))
    return out


def changes(results: dict) -> list[tuple[str, str]]:
    """(change, what) pairs, in the order site.yml would make them, from one host's check-mode results.

    ``results``: ``numactl`` (the package step), ``memlock`` (memlock's own apply step, with containerd),
    ``autonuma`` (the AutoNUMA decision: ``write_live`` and ``value``), ``kubelet`` (the kubelet's apply step) and
    ``apply`` (the instances' apply step, which carries every other file of the run); a step that did not run is
    missing or skipped.
    """
    out = []
    numactl = results.get("numactl")
    if isinstance(numactl, dict) and numactl.get("changed") and not numactl.get("skipped"):
        out.append(("install", "the numactl package"))
    out.extend(_apply_changes(results.get("memlock")))
    autonuma = results.get("autonuma")
    if isinstance(autonuma, dict) and autonuma.get("write_live"):
        out.append(("sysctl", "kernel.numa_balancing=%s, live" % autonuma.get("value")))
    out.extend(_apply_changes(results.get("kubelet"), "the kubelet: "))
    out.extend(_apply_changes(results.get("apply")))
    return out


def table(hosts: list) -> list[str]:
    """plan.yml's lines: a header, then per host one line per change (``nothing`` when there is none).

    ``hosts``: ``{"host": name, "results": {...}}`` for ``changes``, in inventory order.
    """
    names = [str(h.get("host")) for h in hosts]
    width = max([len(n) for n in names] + [len("HOST")])
    lines = ["%-*s  %-*s  %s" % (width, "HOST", WIDTH, "CHANGE", "WHAT (site.yml would do this; nothing was done)")]
    for name, host in zip(names, hosts):
        pairs = changes(host.get("results") or {})
        if not pairs:
            lines.append("%-*s  %-*s  %s" % (width, name, WIDTH, "nothing", "the node already is as planned"))
        for change, what in pairs:
            lines.append("%-*s  %-*s  %s" % (width, name, WIDTH, change, what))
    return lines
