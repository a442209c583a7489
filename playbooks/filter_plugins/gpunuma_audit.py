"""Fleet audit summary for playbooks/audit.yml: table lines and Prometheus textfile metrics."""

from __future__ import annotations


def gpunuma_audit_line(report):
    """``HOST STATUS what drifted`` for one gpunuma.audit/v1 report."""
    findings = report.get("findings") or []
    what = ", ".join(
        "%s%s" % (f.get("id"), ("(%s)" % f["instance"]) if f.get("instance") else "")
        for f in findings if f.get("severity") in ("error", "warning")
    )
    failed = ["policy %s" % r.get("id") for r in (report.get("policy") or {}).get("results") or []
              if r.get("status") == "fail" and r.get("severity") == "error"]
    what = ", ".join(x for x in [what] + failed if x)
    return "%-24s %-12s %s" % (report.get("hostname"), report.get("status"), what or "-")


def gpunuma_audit_unreachable_line(host):
    return "%-24s %-12s %s" % (host, "unreachable", "not audited")


def _label(value):
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def gpunuma_audit_metrics(reports, unreachable=()):
    """node_exporter textfile metrics: per host status and per finding id counts."""
    lines = [
        "# HELP gpunuma_audit_compliant 1 when the node matches its applied plan, 0 when it drifted or was unreachable.",
        "# TYPE gpunuma_audit_compliant gauge",
    ]
    for report in reports:
        lines.append('gpunuma_audit_compliant{host="%s"} %d'
                     % (_label(report.get("hostname")), 1 if report.get("status") == "compliant" else 0))
    for host in unreachable:
        lines.append('gpunuma_audit_compliant{host="%s"} 0' % _label(host))
    lines += [
        "# HELP gpunuma_audit_unreachable 1 when the node could not be audited.",
        "# TYPE gpunuma_audit_unreachable gauge",
    ]
    for report in reports:
        lines.append('gpunuma_audit_unreachable{host="%s"} 0' % _label(report.get("hostname")))
    for host in unreachable:
        lines.append('gpunuma_audit_unreachable{host="%s"} 1' % _label(host))
    lines += [
        "# HELP gpunuma_audit_findings Findings of the last audit per host, finding id and severity.",
        "# TYPE gpunuma_audit_findings gauge",
    ]
    for report in reports:
        counts = {}
        for finding in report.get("findings") or []:
            key = (finding.get("id"), finding.get("severity"))
            counts[key] = counts.get(key, 0) + 1
        for (fid, severity), count in sorted(counts.items()):
            lines.append('gpunuma_audit_findings{host="%s",id="%s",severity="%s"} %d'
                         % (_label(report.get("hostname")), _label(fid), _label(severity), count))
    return "\n".join(lines) + "\n"


class FilterModule:
    def filters(self):
        return {
            "gpunuma_audit_line": gpunuma_audit_line,
            "gpunuma_audit_unreachable_line": gpunuma_audit_unreachable_line,
            "gpunuma_audit_metrics": gpunuma_audit_metrics,
        }
