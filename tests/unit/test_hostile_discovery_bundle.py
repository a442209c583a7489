"""scripts/support-bundle.sh on a damaged tree: bounded, says what it skipped, and the bundle replays."""

import os
import subprocess

import pytest

import sysfs_factory as factory
from conftest import REPO_ROOT
from ansible.module_utils.gpunuma.discovery.discover import discover

pytestmark = pytest.mark.unit

SCRIPT = os.path.join(REPO_ROOT, "scripts", "support-bundle.sh")


def test_support_bundle_skips_fifos_links_and_huge_files_and_names_them(tmp_path):
    root = factory.small_two_node(str(tmp_path / "root"))
    gpu = "sys/bus/pci/devices/0000:18:00.0"
    nic = "sys/bus/pci/devices/0000:19:00.0"
    fifo = factory.apply_damage(root, {"op": "fifo", "path": nic + "/max_link_speed"})
    zero = factory.apply_damage(root, {"op": "symlink", "path": nic + "/vendor", "target": "/dev/zero"})
    huge = factory.apply_damage(root, {"op": "write", "path": gpu + "/local_cpus", "text": "f", "repeat": 100000})
    loop = factory.apply_damage(root, {"op": "symlink", "path": "sys/bus/pci/devices/0000:1a:00.0",
                                       "target": "0000:1a:00.0"})
    out = str(tmp_path / "bundle")
    proc = subprocess.run(["bash", SCRIPT, out, root], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with open(os.path.join(out, "SKIPPED")) as handle:
        skipped = handle.read()
    for path, why in ((fifo, "not a regular file"), (zero, "a symbolic link"), (huge, "larger than 65536 bytes"),
                      (loop, "a dangling or looping link")):
        assert "%s: %s" % (path, why) in skipped and path in proc.stderr
    # The GPU survives the copy (its local_cpulist is intact); the NIC lost its vendor.
    topology = discover("bundle", sysfs_root=out)["topology"]
    assert [g["pci_bus_id"] for g in topology["gpus"]] == ["0000:18:00.0"]
    assert topology["gpus"][0]["numa_node"] == 1
