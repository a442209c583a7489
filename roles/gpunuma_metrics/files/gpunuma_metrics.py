"""gpunuma-metrics: write the node's gpunuma metrics for node_exporter's textfile collector.

Installed by the gpunuma_metrics role, beside ``gpunuma_metrics_collect.py``
(module_utils/gpunuma/verify/metrics.py, which renders the metrics), and run
by gpunuma-metrics.timer. Standard library only. This script does what the
renderer leaves to its caller: it asks systemctl for the MainPID of a unit
whose processes no cgroup file lists, and writes the file atomically: a
temporary file in the collector's directory, fsync, then a rename over
``gpunuma-node.prom``, so node_exporter (which reads ``*.prom`` only) never
reads a half-written file.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpunuma_metrics_collect as collector  # noqa: E402  (installed beside this script)

OUTPUT_NAME = "gpunuma-node.prom"


class MetricsError(Exception):
    """A bad option; the message names it."""


def systemctl_main_pid(unit, systemctl="systemctl"):
    """The unit's MainPID as systemctl shows it (C locale), or None."""
    try:
        out = subprocess.run([systemctl, "show", "--property=MainPID", "--value", unit], capture_output=True,
                             check=False, text=True, timeout=10, env=dict(os.environ, LC_ALL="C")).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return int(out) if out.isdigit() else None


def write_atomic(directory, text, name=OUTPUT_NAME):
    """Write ``directory/name`` through a temporary file in the same directory and rename.

    common/atomic.py's write_atomic, repeated: this script runs on the node
    with the standard library only (role gpunuma_metrics).
    """
    if not os.path.isdir(directory):
        raise MetricsError("textfile directory %s does not exist; create it or pass the collector's directory" % directory)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + name + ".")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(directory, name))
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return os.path.join(directory, name)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Write gpunuma metrics for the node_exporter textfile collector.")
    ap.add_argument("--textfile-dir", required=True, help="node_exporter --collector.textfile.directory")
    ap.add_argument("--probe", default="/var/lib/gpunuma/h2d-probe.json")
    ap.add_argument("--plan", default="/etc/gpunuma/plan.json")
    ap.add_argument("--audit", default="/var/lib/gpunuma/audit.json")
    ap.add_argument("--root", default="/", help="read sys/ and proc/ under this directory (tests)")
    args = ap.parse_args(argv)
    text, errors = collector.collect(args.probe, args.plan, args.audit, args.root, main_pid=systemctl_main_pid)
    for err in errors:
        sys.stderr.write("gpunuma-metrics: %s\n" % err)
    try:
        path = write_atomic(args.textfile_dir, text)
    except (MetricsError, OSError) as exc:
        sys.stderr.write("gpunuma-metrics: %s\n" % exc)
        return 1
    sys.stdout.write("gpunuma-metrics: wrote %s\n" % path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
