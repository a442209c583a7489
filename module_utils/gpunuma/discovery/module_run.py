# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Discovery as a module runs it: gpu_topology_info's options, the module's command runner.

One place, used by ``gpu_topology_info`` and by ``gpunuma_converge`` when it reads the node again to see whether
anything the last converge depended on moved.
"""

from __future__ import absolute_import, division, print_function

import socket

from ansible.module_utils.gpunuma.common import commands
from ansible.module_utils.gpunuma.discovery.discover import discover

__metaclass__ = type


def tool_runner(module):
    """``run_tool(argv, binary=None)`` -> ``(stdout, None)`` or ``(None, why)``; ``why`` is None when the tool is
    not installed (for the ROCm tools: the KFD topology in sysfs is read instead)."""

    def run_tool(argv, binary=None):
        binary = binary or module.get_bin_path(argv[0])
        if not binary:
            return None, None
        rc, out, err = commands.runner(module)([binary] + list(argv[1:]))
        if rc != 0:
            return None, "%s exited %s: %s" % (" ".join(argv), rc, (err or out).strip()[:300])
        return out, None

    return run_tool


def discover_with(module, params):
    """``discover()`` on gpu_topology_info's validated ``params`` (raises GpunumaError on bad input)."""
    run_tool = tool_runner(module)

    def run_nvidia_smi():
        text, problem = run_tool(("nvidia-smi", "topo", "-m"), params.get("nvidia_smi_path"))
        return text, (problem if text is not None or problem else "nvidia-smi not found on PATH")

    return discover(
        hostname=params.get("hostname") or socket.gethostname(),
        sysfs_root=params.get("sysfs_root"),
        topo_file=params.get("nvidia_smi_topo_file"),
        nvml_dump=params.get("nvml_dump"),
        sources=params.get("sources"),
        run_nvidia_smi=run_nvidia_smi,
        keep_nvml_dump=bool(params.get("record_nvml_dump")),
        lscpu_file=params.get("lscpu_file"),
        amd_smi_file=params.get("amd_smi_topology_file"),
        rocm_smi_file=params.get("rocm_smi_topo_file"),
        run_tool=run_tool,
    )
