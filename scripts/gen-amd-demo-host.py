#!/usr/bin/env python3
"""Write tests/fixtures/hosts/mi300x-cpx-sysfs.tar.gz: the sysfs tree of the demo's AMD node.

The tree is tests/sysfs_factory.mi300x_cpx_host: a 2-socket NPS1 host laid out as the published
MI300X CPX KFD capture (tests/fixtures/published/amd/kfd-mi300x-cpx-8gpu.json, its eight GPUs'
bus ids and CPU nodes, 63 compute partitions) with that capture's KFD topology. scripts/demo.sh
unpacks it on the demo's mi300x-cpx node; tests/unit/test_amd_sources.py checks that the archive is
what the factory builds.

    .venv/bin/python scripts/gen-amd-demo-host.py
"""

import io
import os
import sys
import tarfile
import tempfile
import gzip

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, REPO)
from gpunuma_controller.core import use_core  # noqa: E402

use_core()
from sysfs_factory import mi300x_cpx_host  # noqa: E402

OUT = os.path.join(REPO, "tests", "fixtures", "hosts", "mi300x-cpx-sysfs.tar.gz")


def archive(root):
    """The tree as a reproducible .tar.gz (sorted, no times, owners or gzip name)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for folder, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(dirs) + sorted(files):
                path = os.path.join(folder, name)
                info = tar.gettarinfo(path, arcname=os.path.relpath(path, root))
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                if info.isfile():
                    with open(path, "rb") as handle:
                        tar.addfile(info, handle)
                else:
                    tar.addfile(info)
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="") as handle:
        handle.write(raw.getvalue())
    return out.getvalue()


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = archive(mi300x_cpx_host(tmp))
    with open(OUT, "wb") as handle:
        handle.write(data)
    print("wrote %s (%d bytes)" % (os.path.relpath(OUT, REPO), len(data)))


if __name__ == "__main__":
    main()
