#!/usr/bin/env python3
"""Render gpunuma's self-contained HTML fleet report from a directory of artefacts.

    scripts/report.py DIR [-o OUT.html] [--host NAME ...]

DIR is searched recursively for gpunuma JSON artefacts, recognised by their
``schema`` (topology, plan, state, audit, validation): the controller
directories the playbooks write (topology/, audit/, validation/) or a
directory copied from elsewhere. The page (default DIR/fleet-report.html)
needs no network; a summary line per host is printed. Exit status 2 with a
one-line error when DIR is missing or holds no artefact. See docs/report.md.
"""

import argparse
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from gpunuma_controller.core import use_core  # noqa: E402

use_core(standalone=True)  # the report is standard library only: no ansible needed
from ansible.module_utils.gpunuma.common import atomic  # noqa: E402
from ansible.module_utils.gpunuma.report import base as report_base, page as report  # noqa: E402


def parse_args(argv):
    parser = argparse.ArgumentParser(description="Render the gpunuma HTML fleet report from a directory of artefacts.")
    parser.add_argument("dir", metavar="DIR", help="directory holding gpunuma JSON artefacts (searched recursively)")
    parser.add_argument("-o", "--output", metavar="OUT.html", help="where to write the page (default: DIR/fleet-report.html)")
    parser.add_argument("--host", action="append", metavar="NAME", help="only this host (repeat for several)")
    parser.add_argument("--title", default="gpunuma fleet report", help="page title")
    return parser.parse_args(argv)


def printable(text):
    """Terminal-safe text: control characters from artefacts written as escapes."""
    return "".join(c if c.isprintable() else "\\x%02x" % ord(c) if ord(c) < 256 else "\\u%04x" % ord(c)
                   for c in str(text))


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    out = args.output or os.path.join(args.dir, "fleet-report.html")
    try:
        page, fleet = report.build_report(args.dir, args.title, args.host)
    except report_base.ReportError as exc:
        print("report: %s" % printable(exc), file=sys.stderr)
        return 2
    try:
        atomic.write_atomic(out, page, 0o644)
    except OSError as exc:
        print("report: cannot write %s: %s" % (out, exc.strerror or exc), file=sys.stderr)
        return 2
    names = [h for h in sorted(fleet["hosts"]) if not args.host or h in args.host]
    width = max(len(h) for h in names)
    for name in names:
        print(printable(report.summary_line(report.host_summary(fleet["hosts"][name]), width)))
    print("open %s" % os.path.abspath(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
