"""Self-contained HTML fleet report from a directory of gpunuma artefacts.

``load_fleet(path)`` reads every JSON document under ``path`` (recursively)
and sorts the gpunuma ones by their ``schema`` field (topology, plan, state,
audit, validation) into hosts; ``render_html(fleet)`` draws one HTML page
(inline CSS and SVG, no script, nothing fetched) with a fleet table, the
drift and rollback history of every node, and per host the topology picture
with each instance's CPUs, memory nodes and GPUs. ``build_report(path)``
does both. Standard library only: the report is rendered on a controller or
on a laptop holding a copied directory.

Every text taken from an artefact is HTML-escaped. An artefact with a known
schema but a shape gpunuma does not write is listed as a problem of its host,
never a traceback; a missing or empty directory is a ``ReportError``.
"""

from __future__ import annotations

# The report's parts, one file each: base (schemas, limits, colours, errors, escaping, CPU lists),
# load (loading and shape checks), svg (the drawings).
from ansible.module_utils.gpunuma.common.cpulist import format_cpulist as format_ids
from ansible.module_utils.gpunuma.common.sizes import format_size
from ansible.module_utils.gpunuma.plan.profiles import base_profile
from ansible.module_utils.gpunuma.report.base import KINDS, ReportError, esc, shown
from ansible.module_utils.gpunuma.report.load import load_fleet
from ansible.module_utils.gpunuma.report.svg import _host_model, legend_html, matrix_svg, topology_svg


# ---------------------------------------------------------------- tables


def _violations(audit):
    return list((audit.get("policy") or {}).get("violations") or [])


def compliance(host):
    """``ok``, ``no audit``, or ``<status>: N findings (E error, W warning)[, V policy violations]``."""
    audit = host.get("audit")
    if not audit:
        return "no audit"
    counts = {}
    for finding in audit["findings"]:
        counts[finding["severity"]] = counts.get(finding["severity"], 0) + 1
    violations = len(_violations(audit))
    if not audit["findings"] and not violations:
        return "ok" if audit["status"] == "compliant" else audit["status"]
    order = ["error", "warning", "info"] + sorted(k for k in counts if k not in ("error", "warning", "info"))
    text = "%s: %d finding%s" % (audit["status"], len(audit["findings"]), "" if len(audit["findings"]) == 1 else "s")
    if counts:
        text += " (%s)" % ", ".join("%d %s" % (counts[k], k) for k in order if k in counts)
    if violations:
        text += ", %d policy violation%s" % (violations, "" if violations == 1 else "s")
    return text


def probe_verdict(host):
    report = host.get("validation")
    if not report:
        return "no probe"
    verdicts = []
    for gpu in report["gpus"]:
        v = gpu.get("verdict") or gpu.get("status") or "?"
        if v not in verdicts:
            verdicts.append(v)
    text = report["status"]
    if verdicts:
        text += ": " + "; ".join(str(v) for v in verdicts)
    elif report.get("probe_reason"):
        text += ": " + str(report["probe_reason"])
    return text


def _profile(host):
    plan = host.get("plan") or {}
    state = host.get("state") or {}
    out = plan.get("profile") or state.get("profile") or "-"
    if state.get("profile") and plan.get("profile") and state["profile"] != base_profile(plan["profile"]):
        out += " (state: %s)" % state["profile"]
    if state.get("pinned"):
        out += " (pinned by rollback)"
    return out


def _fingerprint(host):
    topo = host.get("topology") or {}
    plan = host.get("plan") or {}
    fp = topo.get("fingerprint") or plan.get("topology_fingerprint")
    if not isinstance(fp, str):
        return "-"
    short = fp.split(":", 1)[-1][:12]
    if topo.get("fingerprint") and plan.get("topology_fingerprint") and topo["fingerprint"] != plan["topology_fingerprint"]:
        short += " (plan made for %s)" % plan["topology_fingerprint"].split(":", 1)[-1][:12]
    return short


def host_summary(host):
    """One terminal/table row: host, profile, instances, compliance, probe verdict."""
    plan = host.get("plan")
    return {
        "host": host["name"],
        "profile": _profile(host),
        "fingerprint": _fingerprint(host),
        "instances": len(plan["instances"]) if plan else None,
        "compliance": compliance(host),
        "probe": probe_verdict(host),
        "problems": len(host["problems"]),
    }


def summary_line(summary: dict, width: int) -> str:
    """One host's ``host_summary`` as a line of text, its name padded to ``width``."""
    count = summary["instances"]
    line = "%-*s  profile %s, %s instance%s, compliance %s, probe %s" % (
        width, summary["host"], summary["profile"], "-" if count is None else count, "" if count == 1 else "s",
        summary["compliance"], summary["probe"])
    if summary["problems"]:
        line += ", %d problem%s in its artefacts" % (summary["problems"], "" if summary["problems"] == 1 else "s")
    return line


def _anchor(name):
    return "host-" + "".join(c if c.isascii() and c.isalnum() else "_%x_" % ord(c) for c in name)


CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:18px;color:#111;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 6px;border-bottom:2px solid #ccd}
h3{font-size:14px;margin:14px 0 4px}
table{border-collapse:collapse;margin:6px 0 12px;font-size:13px} th,td{border:1px solid #ccc;padding:3px 7px;
text-align:left;vertical-align:top} th{background:#eef1f5}
.meta{color:#555;font-size:12px} .problem{background:#fff0f0;border:2px solid #d00000;padding:6px 10px;margin:6px 0}
.problem li{color:#900}
.note{background:#fffbe6;border:1px solid #c9a400;padding:4px 10px;margin:6px 0;font-size:13px}
.sw{display:inline-block;width:14px;height:14px;border:1px solid #333;vertical-align:middle;margin-right:4px}
.cross-badge{color:#fff;background:#d00000;font-weight:bold;padding:1px 6px;border-radius:3px}
.ok{color:#176c2a;font-weight:bold} .bad{color:#b00000;font-weight:bold}
.legend{font-size:12px;margin:6px 0} .lg{display:inline-block;margin-right:12px}
.lg i{display:inline-block;width:14px;height:12px;border:1px solid #666;vertical-align:middle;margin-right:4px}
.matrices{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start}
section.host{margin-bottom:30px}
td.warn{font-size:12px;color:#7a4b00;max-width:520px}
"""


def _cls_status(text):
    return "ok" if text == "ok" or text.startswith("passed") else ("bad" if text.startswith(("drifted", "failed"))
                                                                   else "")


def _summaries(hosts):
    """``{host: summary row}``; a summary that cannot be made is a problem of its host, never a traceback."""
    summaries = {}
    for host in hosts:
        try:
            summaries[host["name"]] = host_summary(host)
        except Exception as exc:  # an artefact shape the checks let through: a problem, never a traceback
            host["problems"].append("summary: %s: %s" % (type(exc).__name__, exc))
            summaries[host["name"]] = {"host": host["name"], "profile": "-", "fingerprint": "-", "instances": None,
                                       "compliance": "-", "probe": "-", "problems": len(host["problems"])}
    return summaries


def _fleet_table(hosts, summaries):
    out = ['<h2>Fleet</h2><table class="fleet"><thead><tr><th>host</th><th>profile</th><th>fingerprint</th>'
           "<th>instances</th><th>compliance</th><th>probe verdict</th><th>drift found</th><th>problems</th>"
           "</tr></thead><tbody>"]
    for host in hosts:
        s = summaries[host["name"]]
        drift = ""
        audit = host.get("audit")
        if audit:
            drift = ", ".join([esc("%s%s" % (f["id"], " (%s)" % f["instance"] if f.get("instance") else ""))
                               for f in audit["findings"]] + ["policy"] * bool(_violations(audit))) or "none"
        out.append('<tr data-host="%s"><td><a href="#%s">%s</a></td><td>%s</td><td><code>%s</code></td><td>%s</td>'
                   '<td class="%s">%s</td><td class="%s">%s</td><td>%s</td><td class="%s">%s</td></tr>'
                   % (esc(host["name"]), esc(_anchor(host["name"])), esc(host["name"]), esc(s["profile"]),
                      esc(s["fingerprint"]), "-" if s["instances"] is None else s["instances"],
                      _cls_status(s["compliance"]), esc(s["compliance"]), _cls_status(s["probe"]), esc(s["probe"]),
                      drift or "-", "bad" if s["problems"] else "", s["problems"] or "none"))
    out.append("</tbody></table>")
    return out


def _drift_table(hosts):
    out = ['<h2>Drift found</h2>']
    rows = []
    for host in hosts:
        for f in (host.get("audit") or {}).get("findings") or []:
            rows.append("<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>"
                        % (esc(host["name"]), esc(f.get("severity")), esc(f.get("id")), esc(f.get("instance")),
                           esc(shown(f.get("expected"))), esc(shown(f.get("actual"))), esc(f.get("message"))))
        for message in _violations(host.get("audit") or {}):
            rows.append("<tr><td>%s</td><td>error</td><td>policy</td><td></td><td></td><td></td><td>%s</td></tr>"
                        % (esc(host["name"]), esc(message)))
    audited = sum(1 for h in hosts if h.get("audit"))
    if rows:
        out.append('<table class="drift"><thead><tr><th>host</th><th>severity</th><th>finding</th><th>instance</th>'
                   "<th>expected</th><th>actual</th><th>message</th></tr></thead><tbody>%s</tbody></table>"
                   % "".join(rows))
    else:
        text = ("No drift in %d audit report%s." % (audited, "" if audited == 1 else "s") if audited
                else "No audit reports in this directory.")
        out.append("<p>%s</p>" % text)
    return out


def _history_table(hosts):
    out = ["<h2>Rollback history</h2>"]
    rows = []
    for host in hosts:
        state = host.get("state")
        if not state:
            continue
        for entry in state["history"]:
            rows.append("<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>"
                        % (esc(host["name"]), esc(entry.get("time")), esc(entry.get("from") or "(first provisioning)"),
                           esc(entry.get("to")), esc(entry.get("action")), esc(entry.get("user")),
                           esc(entry.get("reason"))))
    if rows:
        out.append('<table class="history"><thead><tr><th>host</th><th>time (UTC)</th><th>from</th><th>to</th>'
                   "<th>action</th><th>user</th><th>reason</th></tr></thead><tbody>%s</tbody></table>" % "".join(rows))
    else:
        out.append("<p>No node state files in this directory.</p>")
    return out


def render_html(fleet, title="gpunuma fleet report", only=None):
    """The HTML page; ``only``: host names to include (default every host)."""
    hosts = [fleet["hosts"][k] for k in sorted(fleet["hosts"]) if only is None or k in only]
    out = ['<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
           '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'; '
           'img-src data:">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           "<title>%s</title><style>%s</style></head><body>" % (esc(title), CSS),
           "<h1>%s</h1>" % esc(title),
           '<p class="meta">%d host%s, from %s</p>' % (len(hosts), "" if len(hosts) == 1 else "s", esc(fleet["root"]))]
    summaries = _summaries(hosts)
    # Sections first: drawing a host may add problems the fleet table counts.
    sections = [_host_section(host, summaries[host["name"]]) for host in hosts]
    for host in hosts:
        summaries[host["name"]]["problems"] = len(host["problems"])
    out += _fleet_table(hosts, summaries) + _drift_table(hosts) + _history_table(hosts)
    out.extend(sections)
    out.append("</body></html>\n")
    return "".join(out)


def _host_section(host, summary):
    out = ['<section class="host" id="%s" data-host="%s"><h2>%s</h2>'
           % (esc(_anchor(host["name"])), esc(host["name"]), esc(host["name"]))]
    files = ", ".join("%s: %s" % (k, host["files"][k]) for k in KINDS if k in host["files"])
    out.append('<p class="meta">profile %s, fingerprint %s; compliance %s; probe %s<br>%s</p>'
               % (esc(summary["profile"]), esc(summary["fingerprint"]), esc(summary["compliance"]),
                  esc(summary["probe"]), esc(files)))
    body = []
    try:
        model = _host_model(host)
        topo = host.get("topology")
        if topo:
            body.append(topology_svg(host, model))
            body.append(legend_html())
            gpus = topo["gpus"]
            labels = ["GPU%s" % g.get("index") for g in gpus]
            nic_labels = [str(n.get("name") or "NIC%d" % i) for i, n in enumerate(topo.get("nics") or [])]
            body.append('<div class="matrices">%s%s</div>'
                        % (matrix_svg("GPU - GPU links", topo.get("gpu_links") or [], labels, labels),
                           matrix_svg("GPU - NIC links", topo.get("gpu_nic_links") or [], labels, nic_labels)))
            if topo.get("warnings"):
                body.append("<h3>Topology warnings</h3><ul>%s</ul>"
                            % "".join("<li>%s</li>" % esc(w) for w in topo["warnings"]))
        else:
            body.append('<p class="note">No topology for this host in the directory: nothing to draw.</p>')
        if host.get("plan"):
            body.append(_instances_table(host, model))
        else:
            body.append('<p class="note">No plan for this host in the directory.</p>')
        if host.get("validation"):
            body.append(_validation_table(host["validation"]))
    except Exception as exc:  # a shape the checks let through: reported with the host, never a traceback
        host["problems"].append("could not draw this host: %s: %s" % (type(exc).__name__, exc))
        body = []
    if host["problems"]:
        out.append('<div class="problem"><b>Problems with this host\'s artefacts</b><ul>%s</ul></div>'
                   % "".join("<li>%s</li>" % esc(p) for p in host["problems"]))
    for note in host["notes"]:
        out.append('<p class="note">%s</p>' % esc(note))
    out.extend(body)
    out.append("</section>")
    return "".join(out)


def _bytes(value):
    """A byte count as text (``16 GiB``); anything else as given."""
    return format_size(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else str(value)


def _memlock_cell(doc, live):
    """What the plan gives an instance of locked memory (its pinned budget, the unit's LimitMEMLOCK=) and, from the
    audit, what its processes hold now (VmLck, VmPin)."""
    parts = []
    if doc.get("pinned_bytes"):
        parts.append("pinned %s" % _bytes(doc["pinned_bytes"]))
    if doc.get("limit_memlock") is not None:
        parts.append("limit %s" % _bytes(doc["limit_memlock"]))
    held = [(word, live.get(key)) for word, key in (("locked", "locked_bytes"), ("pinned", "pinned_bytes"))
            if isinstance(live.get(key), int)]
    if held:
        parts.append("now " + ", ".join("%s %s" % (word, _bytes(n)) for word, n in held))
    return "; ".join(parts) or "-"


def _instances_table(host, model):
    plan = host["plan"]
    audit = host.get("audit") or {}
    live_of = {i.get("name"): i.get("live") if isinstance(i.get("live"), dict) else {}
               for i in audit.get("instances") or [] if isinstance(i, dict)}
    rows = []
    for inst in model["instances"]:
        doc = inst["doc"]
        cross = inst["cross"]
        cross_html = ""
        if cross:
            where = (esc(cross["label"]), esc(format_ids(cross["cpu_nodes"]) or "-"),
                     esc(format_ids(cross["mem_nodes"]) or "-"), esc(format_ids(cross["gpu_nodes"])))
            cross_html = ('<br><span class="cross-badge cross-socket">%s</span> CPUs on node %s, memory on node %s, '
                          "GPU on node %s" % where)
        warnings = "".join("<li>%s</li>" % esc(w) for w in doc.get("warnings") or [])
        rows.append('<tr class="instance" data-instance="%s"><td><span class="sw" style="background:%s"></span>%s%s</td>'
                    "<td>%s</td><td>%s</td><td><code>%s</code></td><td>%s %s</td><td class=\"memlock\">%s</td>"
                    '<td>%s</td><td>%s</td><td class="warn"><ul>%s</ul></td></tr>'
                    % (esc(doc.get("name")), inst["colour"], esc(doc.get("name")), cross_html,
                       esc(", ".join("GPU%s" % g for g in doc.get("gpus") or []) or "none"),
                       esc(format_ids(inst["cpu_nodes"]) or "-"), esc(doc.get("cpus") or "not bound"),
                       esc(doc.get("mem_policy")), esc(format_ids(inst["mem_nodes"])),
                       esc(_memlock_cell(doc, live_of.get(doc.get("name")) or {})), esc(doc.get("profile")),
                       esc(doc.get("fallback") or "-"), warnings))
    head = ("<h3>Instances (plan profile %s)</h3><table class=\"instances\"><thead><tr><th>instance</th><th>GPUs</th>"
            "<th>CPU nodes</th><th>CPUs</th><th>mem policy</th><th>locked memory</th><th>profile</th><th>fallback</th>"
            "<th>warnings</th></tr></thead><tbody>" % esc(plan.get("profile")))
    plan_warn = ""
    own = {"%s: " % i["doc"].get("name") for i in model["instances"]}
    extra = [w for w in plan.get("warnings") or [] if not any(str(w).startswith(p) for p in own)]
    if extra:
        plan_warn = "<ul>%s</ul>" % "".join("<li>%s</li>" % esc(w) for w in extra)
    budgets = plan.get("pinned_budget") or {}
    if budgets:
        plan_warn = ('<p class="pinned">Pinned host memory budgeted per NUMA node (plan/pinned.py): %s</p>'
                     % esc(", ".join("node %s %s" % (node, _bytes(budgets[node]))
                                     for node in sorted(budgets, key=lambda n: (len(str(n)), str(n)))))) + plan_warn
    return head + "".join(rows) + "</tbody></table>" + plan_warn


def _validation_table(report):
    rows = []
    for gpu in report["gpus"]:
        places = gpu.get("placements") if isinstance(gpu.get("placements"), dict) else {}

        def gbps(name):
            p = places.get(name)
            if not isinstance(p, dict):
                return "-"
            return p.get("h2d_pinned_gbps") if p.get("h2d_pinned_gbps") is not None else (p.get("status") or "-")
        rows.append("<tr><td>GPU%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>"
                    % (esc(gpu.get("index")), esc(gpu.get("numa_node")), esc(gpu.get("status")), esc(gbps("local")),
                       esc(gbps("remote")), esc(gbps("unbound")), esc(gpu.get("verdict")),
                       esc(gpu.get("suggested_rollback") or "-")))
    return ("<h3>H2D probe (%s, status %s)</h3><table class=\"validation\"><thead><tr><th>GPU</th><th>node</th>"
            "<th>status</th><th>local GB/s</th><th>remote GB/s</th><th>unbound GB/s</th><th>verdict</th>"
            "<th>suggested rollback</th></tr></thead><tbody>%s</tbody></table>"
            % (esc(report.get("policy")), esc(report.get("status")), "".join(rows)))


def build_report(path, title="gpunuma fleet report", only=None):
    """(html, fleet) for the artefacts under ``path``; ReportError when there are none, or when a host
    named in ``only`` has no artefact there."""
    fleet = load_fleet(path)
    if only is not None:
        unknown = [h for h in only if h not in fleet["hosts"]]
        if unknown:
            raise ReportError("%s has no artefacts for host %s; hosts there: %s"
                              % (path, ", ".join(unknown), ", ".join(sorted(fleet["hosts"]))))
    return render_html(fleet, title, only), fleet
