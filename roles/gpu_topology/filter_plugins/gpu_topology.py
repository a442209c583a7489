"""Controller file names and persisted-topology reads for the gpu_topology role.

Filters over module_utils/gpunuma/role_inputs.py, imported exactly as
modules import it; they only turn its errors into filter errors.
"""

from __future__ import annotations

import ansible.module_utils
from ansible import constants as C
from ansible.errors import AnsibleFilterError

# Controller-side plugins do not get the configured module_utils path on
# ansible.module_utils (only modules shipped to a node do); add it so the
# core is imported exactly as modules import it.
for _path in C.DEFAULT_MODULE_UTILS_PATH or []:
    if _path not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(_path)

from ansible.module_utils.gpunuma import role_inputs  # noqa: E402
from ansible.module_utils.gpunuma.errors import GpunumaError  # noqa: E402

TOPOLOGY_SCHEMA = "gpunuma.topology/v1"


def file_stem(host):
    """The controller file name stem of inventory host ``host`` (role_inputs.host_file_stem)."""
    try:
        return role_inputs.host_file_stem(host)
    except GpunumaError as exc:
        raise AnsibleFilterError(str(exc))


def stem_problem(host):
    """Why ``host`` cannot name a controller file, or None."""
    try:
        role_inputs.host_file_stem(host)
    except GpunumaError as exc:
        return str(exc)
    return None


def controller_files(host, directory):
    """``{topology, pending, plan}``: the controller files of ``host`` in ``directory``."""
    stem = file_stem(host)
    base = directory.rstrip("/") + "/" + stem
    return {"stem": stem, "topology": base + ".json", "pending": base + ".pending.json", "plan": base + ".plan.json"}


def read_topology(content, path, where, encoding="base64"):
    """A persisted topology (node: slurp content; controller: text) as ``{data, problem}``."""
    return role_inputs.read_state_file(
        content,
        where,
        TOPOLOGY_SCHEMA,
        "It holds the hardware fingerprint later runs compare against. To recover, re-run with "
        "-e gpu_topology_accept_changes=true to replace it with a fresh discovery (the damaged file is kept as "
        "a backup, %s.<pid>.<time>~), or move it aside (mv %s %s.damaged) and run again." % (path, path, path),
        encoding,
    )


def input_problems(options, values, aliases=None, host=None):
    """Every problem of the discovery inputs (argument spec, then the host's file name)."""
    problems = role_inputs.input_problems(options, values, aliases)
    if host is not None:
        problem = stem_problem(host)
        if problem:
            problems.append(problem)
    return problems


class FilterModule:
    def filters(self):
        return {
            "gpu_topology_file_stem": file_stem,
            "gpu_topology_controller_files": controller_files,
            "gpu_topology_read_topology": read_topology,
            "gpu_topology_input_problems": input_problems,
        }
