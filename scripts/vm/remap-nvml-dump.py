#!/usr/bin/env python3
"""Map a recorded NVML dump's GPUs onto another machine's PCI bus ids.

    remap-nvml-dump.py --dump IN.json --map RECORDED=NEW [--map ...] --out OUT.json
                       [--keep-cpu-affinity] [--keep-numa-node]

Used by the numa_vm molecule scenario: the VM cannot have an NVIDIA GPU, so
the GPU side of discovery replays a dump recorded on a real GPU node, with
each GPU's bus id moved onto a stand-in PCI device of the VM (see
scripts/vm/numa-vm.sh). The GPU's identity then comes from the dump and its
placement from the VM's own sysfs: the recorded CPU affinity and NVML NUMA
id, which describe the recording machine, are replaced by
{"nvml_error": "NotMapped"} unless --keep-* is given.

The work is module_utils/gpunuma/discovery/nvidia/nvml.py's remap_dump(). Needs ansible-core
importable (the repository's virtualenv python). Exit status 2 on bad input,
with the reason on stderr.
"""

import argparse
import json
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

sys.path.insert(0, REPO_ROOT)
from gpunuma_controller.core import use_core  # noqa: E402

# The gpunuma core is imported as modules import it on a node.
try:
    use_core()
except ImportError:
    sys.exit("remap-nvml-dump: ansible-core is not importable; run this with the virtualenv's python (.venv/bin/python)")

from ansible.module_utils.gpunuma.common.errors import GpunumaError  # noqa: E402
from ansible.module_utils.gpunuma.discovery.nvidia.nvml import load_dump, remap_dump  # noqa: E402


def parse_args(argv):
    parser = argparse.ArgumentParser(description="Map a recorded NVML dump's GPUs onto other PCI bus ids.")
    parser.add_argument("--dump", required=True, help="recorded gpunuma.nvml-dump/v1 JSON")
    parser.add_argument("--map", action="append", required=True, metavar="RECORDED=NEW",
                        help="recorded bus id = new bus id; once per GPU (and per NVSwitch port to move)")
    parser.add_argument("--out", required=True, help="where to write the remapped dump")
    parser.add_argument("--keep-cpu-affinity", action="store_true",
                        help="keep the recorded CPU affinity words (they describe the recording machine)")
    parser.add_argument("--keep-numa-node", action="store_true",
                        help="keep the recorded NVML NUMA node id (it describes the recording machine)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    bus_map = {}
    for item in args.map:
        old, sep, new = item.partition("=")
        if not sep or not old or not new:
            print("remap-nvml-dump: --map %r is not RECORDED=NEW (e.g. 0000:00:06.0=0000:21:02.0)" % item,
                  file=sys.stderr)
            return 2
        bus_map[old.strip()] = new.strip()
    try:
        dump = remap_dump(load_dump(args.dump), bus_map, drop_cpu_affinity=not args.keep_cpu_affinity,
                          drop_numa_node=not args.keep_numa_node)
    except GpunumaError as exc:
        print("remap-nvml-dump: %s" % exc, file=sys.stderr)
        return 2
    text = json.dumps(dump, indent=1, sort_keys=True) + "\n"
    tmp = args.out + ".tmp"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, args.out)
    print(json.dumps(dump["remapped"], sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
