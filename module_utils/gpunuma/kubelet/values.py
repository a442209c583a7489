"""Kubelet values and what the kubelet accepts: policy names, policy options by version, quantities.

The tables follow the kubelet's documentation (kubernetes.io, "Control CPU
Management Policies on the Node", "Control Topology Management Policies on a
node", "Utilizing the NUMA-aware Memory Manager"); docs/kubelet.md cites each
rule. :mod:`kubelet.plan` and :mod:`kubelet.managers` use them.
"""

from __future__ import annotations

import decimal
import re

from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, parse_cpulist
from ansible.module_utils.gpunuma.common.errors import CpuListError, ProblemsError
from ansible.module_utils.gpunuma.kubelet.config import plain

CPU_POLICIES = ("none", "static")

MEMORY_POLICIES = ("None", "Static")

TOPOLOGY_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")

TOPOLOGY_SCOPES = ("container", "pod")

DEFAULTS = {
    "cpuManagerPolicy": "none",
    "topologyManagerPolicy": "none",
    "topologyManagerScope": "container",
    "memoryManagerPolicy": "None",
}

# The kubelet's hard eviction defaults on Linux; they apply only while
# evictionHard is absent from the config (kubernetes.io, Node-pressure Eviction).
EVICTION_HARD_DEFAULTS = {
    "memory.available": "100Mi",
    "nodefs.available": "10%",
    "imagefs.available": "15%",
    "nodefs.inodesFree": "5%",
}

MAX_NUMA_NODES_OPTION = "max-allowable-numa-nodes"

KUBELET_MAX_NUMA_NODES = 8

# Static CPU policy options: (alpha since, beta since, GA since), from the
# kubelet's CPU management policies page (kubernetes.io, "Control CPU
# Management Policies on the Node": strict-cpu-reservation GA in 1.35,
# prefer-align-cpus-by-uncorecache GA in 1.36). Alpha options need the feature gate
# CPUManagerPolicyAlphaOptions; beta ones CPUManagerPolicyBetaOptions (on by
# default).
CPU_POLICY_OPTIONS = {
    "full-pcpus-only": ((1, 22), (1, 23), (1, 33)),
    "distribute-cpus-across-numa": ((1, 23), (1, 33), None),
    "align-by-socket": ((1, 25), None, None),
    "distribute-cpus-across-cores": ((1, 31), None, None),
    "strict-cpu-reservation": ((1, 31), (1, 32), (1, 35)),
    "prefer-align-cpus-by-uncorecache": ((1, 32), (1, 34), (1, 36)),
}

TOPOLOGY_POLICY_OPTIONS = {
    "prefer-closest-numa-nodes": ((1, 26), (1, 28), (1, 32)),
    MAX_NUMA_NODES_OPTION: ((1, 31), (1, 31), (1, 35)),
}

BOOLEAN_OPTION_VALUES = ("true", "false")

# The Topology Manager's pod scope and the policies used here exist since 1.18.
OLDEST_KUBELET = (1, 18)

# The Memory Manager's Static policy is beta (on by default) since 1.22.
MEMORY_STATIC_SINCE = (1, 22)

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?\Z")

_QUANTITY_RE = re.compile(r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$")

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}

_DECIMAL = {"m": -1, "": 0, "k": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}

HUGEPAGES_RE = re.compile(r"^hugepages-[0-9]+(Ki|Mi|Gi)\Z")


class KubeletPlanError(ProblemsError):
    """The inputs have problems; ``problems`` lists each, one per line of the message."""


def parse_version(text, what="kubelet_version"):
    """``(major, minor)`` from ``"1.31"``, ``"v1.31.2"``, ``"1.31.0-eks-1"``; None stays None."""
    if text is None:
        return None
    match = _VERSION_RE.match(str(text).strip())
    if not match or isinstance(text, bool):
        raise KubeletPlanError("%s: %r is not a Kubernetes version; allowed: MAJOR.MINOR such as \"1.31\" or v1.31.2"
                               % (what, text))
    version = int(match.group(1)), int(match.group(2))
    if version < OLDEST_KUBELET:
        raise KubeletPlanError(
            "%s: %r is older than any kubelet gpunuma supports; allowed: %d.%d or later, as a quoted string (YAML reads "
            "an unquoted 1.30 as the number 1.3)" % ((what, text) + OLDEST_KUBELET))
    return version


def parse_quantity(value, what):
    """A Kubernetes resource quantity (``100Mi``, ``1G``, ``512``, ``1.5Gi``) as a Decimal."""
    if isinstance(value, bool) or value is None:
        raise KubeletPlanError("%s: %r is not a quantity; allowed: a Kubernetes quantity such as 100Mi, 1Gi, 500M"
                               % (what, value))
    text = str(value).strip()
    match = _QUANTITY_RE.match(text)
    if not match:
        raise KubeletPlanError("%s: %r is not a quantity; allowed: a Kubernetes quantity such as 100Mi, 1Gi, 500M"
                               % (what, value))
    number = decimal.Decimal(match.group(1))
    if number < 0:
        raise KubeletPlanError("%s: %r is negative; allowed: a quantity of 0 or more" % (what, value))
    suffix = match.group(2) or ""
    if suffix in _BINARY:
        return number * (1024 ** _BINARY[suffix])
    if suffix in _DECIMAL:
        return number * (decimal.Decimal(1000) ** _DECIMAL[suffix])
    return number * (decimal.Decimal(10) ** int(suffix[1:]))


def format_quantity(count):
    """Bytes as the largest binary suffix that divides them exactly (``1073741824`` -> ``1Gi``)."""
    count = int(count)
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = 1024 ** _BINARY[suffix]
        if count and count % unit == 0:
            return "%d%s" % (count // unit, suffix)
    return str(count)


def option_problem(field, name, value, table, version, gates, alpha_gate, beta_gate):
    """One problem line for a policy option, or None."""
    if name not in table:
        return "%s: option %r is unknown; allowed: %s" % (field, name, ", ".join(sorted(table)))
    if name == MAX_NUMA_NODES_OPTION:
        text = str(value) if not isinstance(value, bool) else ""
        if not text.isdigit() or int(text) < KUBELET_MAX_NUMA_NODES:
            return "%s.%s: %r is not allowed; allowed: an integer of at least %d, as a string (\"16\"), never true" % (
                field, name, value, KUBELET_MAX_NUMA_NODES)
    elif str(value) not in BOOLEAN_OPTION_VALUES:
        return "%s.%s: %r is not allowed; allowed: \"true\" or \"false\"" % (field, name, value)
    if version is None:
        return None
    alpha, beta, ga = table[name]
    if version < alpha:
        return "%s.%s: needs kubelet %d.%d or later (kubelet_version is %d.%d); allowed: remove the option or upgrade" % (
            field, name, alpha[0], alpha[1], version[0], version[1])
    if ga is not None and version >= ga:
        return None
    if beta is not None and version >= beta:
        if gates.get(beta_gate) is False:
            return "%s.%s: is beta in kubelet %d.%d and featureGates.%s is false; allowed: that gate on (its default)" % (
                field, name, version[0], version[1], beta_gate)
        return None
    if gates.get(alpha_gate) is not True:
        return "%s.%s: is alpha in kubelet %d.%d and needs featureGates.%s: true; allowed: set that gate, or remove the option" % (
            field, name, version[0], version[1], alpha_gate)
    return None


def normalise_options(field, value, problems):
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append("%s: %r is not a mapping; allowed: a mapping of option name to string value" % (field, value))
        return {}
    out = {}
    for key, item in value.items():
        # The kubelet reads these as map[string]string: a YAML true would not decode.
        out[str(key)] = ("true" if item else "false") if isinstance(item, bool) else str(item)
    return out


def comparable(key, value):
    """Value of an owned key for change detection: equal meaning compares equal."""
    value = plain(value)
    if key == "reservedMemory" and isinstance(value, list):
        out = []
        for entry in value:
            if isinstance(entry, dict) and isinstance(entry.get("limits"), dict):
                limits = {}
                for resource, raw in entry["limits"].items():
                    try:
                        limits[resource] = str(parse_quantity(raw, resource).normalize())
                    except KubeletPlanError:
                        limits[resource] = raw
                out.append((repr(entry.get("numaNode")), sorted(limits.items())))
            else:
                out.append(repr(entry))
        return sorted(out)
    if key == "reservedSystemCPUs" and isinstance(value, str):
        try:
            return format_cpulist(parse_cpulist(value, key))
        except CpuListError:
            return value
    if key in ("cpuManagerPolicyOptions", "topologyManagerPolicyOptions") and value == {}:
        return None
    return value
