"""gpunuma's versioned documents as types: one JSON Schema each, defined here once, and a loader that names the bad field.

The five documents gpunuma writes and reads back - the topology, the plan,
the node state, the audit report and the validation report - each get:

* ``SCHEMA``: the JSON Schema (draft 2020-12) of the document, here and
  nowhere else; ``scripts/gen-schemas.py`` writes it to
  ``docs/schemas/<name>.schema.json`` and a test keeps the two equal;
* ``load(data, source)``: the document checked against it, returned as the
  dataclass, or :class:`DocumentError` listing every problem, each naming
  the field (``plan.instances[2].cpus: 5 is not a string or null``);
* ``to_dict()``: the document as JSON-ready data again.

The schemas state the shape readers rely on: required keys and their types,
down to each list's entries. Additive minor versions add optional keys, so
unknown keys are allowed (readers of v1 ignore what they do not know). The
meaning of a value (a CPU list that parses, a node that exists) stays with
the module that owns it (``plan.topology``, ``plan.state``); the shape is
checked here first, by every reader, in one way.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import ClassVar, Optional

from ansible.module_utils.gpunuma.common import bounded, schemas
from ansible.module_utils.gpunuma.common.errors import ProblemsError

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


class DocumentError(ProblemsError):
    """A document whose shape is not its schema's; one problem per line, each naming the field."""


def _t(kind, null=False, **extra):
    types = [kind] if isinstance(kind, str) else list(kind)
    if null:
        types.append("null")
    out = {"type": types[0] if len(types) == 1 else types}
    out.update(extra)
    return out


def _obj(required, properties, **extra):
    out = {"type": "object", "required": list(required), "properties": properties}
    out.update(extra)
    return out


def _list(items, **extra):
    out = {"type": "array", "items": items}
    out.update(extra)
    return out


def schema_file(name):
    """The file of a document's JSON Schema under docs/schemas: ``gpunuma.plan/v1`` -> ``plan-v1.schema.json``."""
    return "%s.schema.json" % name.replace("gpunuma.", "").replace("/", "-")


def _doc(name, title, required, properties):
    props = dict(properties, schema={"const": name})
    return dict(_obj(["schema"] + list(required), props), **{
        "$schema": JSON_SCHEMA_DIALECT, "$id": schema_file(name),
        "title": title})


_CPUS = _t("string", description="a canonical CPU list, e.g. 0-47,96-143")
_NODE = _t("integer", minimum=0)
_BYTES = _t("integer", null=True, minimum=0)
_FINGERPRINT = _t("string", null=True, pattern="^sha256:[0-9a-f]{64}$")

_TOPOLOGY_PROPERTIES = {
    "hostname": _t("string", null=True),
    "fingerprint": _FINGERPRINT,
    "sources": _list(_t("string")),
    "warnings": _list(_t("string")),
    "complete": _t("boolean"),
    "driver_version": _t("string", null=True),
    "numa_balancing": _t("integer", null=True),
    "sockets": _t("integer", null=True, minimum=1),
    "threads_per_core": _t("integer", minimum=1),
    "unplaced_cpus": _CPUS,
    "cpus_granted": _CPUS,
    "cpus_isolated": _CPUS,
    "numa_nodes": _list(_obj(["id", "cpus"], {
        "id": _NODE,
        "cpus": _t("string"),
        "has_cpus": _t("boolean"),
        "memory_total_bytes": _BYTES,
        "memory_free_bytes": _BYTES,
        "hugetlb_bytes": _BYTES,
        "distances": _list(_t("integer")),
        "cores": _t("array", null=True, items=_t("string")),
        "l3_groups": _list(_t("string")),
        "inferred": _t("boolean"),
    })),
    "gpus": _list(_obj(["index", "numa_node"], {
        "index": _t("integer", minimum=0),
        "uuid": _t("string", null=True),
        "name": _t("string", null=True),
        "pci_bus_id": _t("string", null=True),
        "cpu_affinity": _t("string", null=True),
        "numa_affinity": _list(_NODE),
        "gpu_numa_id": _t("integer", null=True),
        "numa_node": _t("integer", null=True, minimum=0),
        "numa_node_source": _t("string", null=True),
        "pcie": _t("object"),
        "mig_enabled": _t("boolean"),
        "memory_total_bytes": _BYTES,
        "irq_vectors": _t("integer", minimum=0),
        "vendor": {"enum": ["nvidia", "amd"]},
        "partition": _obj(["index", "count"], {
            "index": _t("integer", minimum=0),
            "count": _t("integer", minimum=1),
            "compute": _t("string", null=True),
            "memory": _t("string", null=True),
        }),
    })),
    "gpu_links": _t("array", null=True, items=_list(_t("string"))),
    "nics": _list(_obj(["name", "numa_node"], {
        "name": _t("string", null=True),
        "netdevs": _list(_t("string")),
        "pci_bus_id": _t("string", null=True),
        "numa_node": _t("integer", null=True),
        "irq_vectors": _t("integer", minimum=0),
    })),
    "gpu_nic_links": _t("array", null=True, items=_list(_t("string"))),
    "nvme": _list(_t("object")),
}
TOPOLOGY_SCHEMA = _doc(schemas.TOPOLOGY, "gpunuma topology (docs/topology-v1.md)",
                       ["hostname", "fingerprint", "sources", "warnings", "complete", "numa_nodes", "gpus", "gpu_links",
                        "nics", "gpu_nic_links"], _TOPOLOGY_PROPERTIES)

_PLAN_PROPERTIES = {
    "schema_minor": _t("integer", minimum=0),
    "hostname": _t("string", null=True),
    "topology_fingerprint": _FINGERPRINT,
    "profile": _t("string"),
    "options": _t("object"),
    "memory_capacity": {"type": "object", "additionalProperties": _BYTES},
    "housekeeping": {"type": "object", "additionalProperties": _t("string")},
    "worker_cpus": {"type": "object", "additionalProperties": _t("string")},
    "siblings": {"type": "object", "additionalProperties": {"enum": ["topology", "inferred", "unknown", "none"]}},
    "instances": _list(_obj(["name", "unit", "mode", "cpus", "mem_policy", "mem_nodes"], {
        "name": _t("string"),
        "unit": _t("string"),
        "mode": {"enum": ["service", "dropin"]},
        "binding_method": {"enum": ["numactl", "systemd"]},
        "gpus": _list(_t("integer", minimum=0)),
        "gpu_uuids": _list(_t("string", null=True)),
        "numa_nodes": _list(_NODE),
        "numa_bind_nodes": _list(_t("integer", null=True)),
        "cpus": _t("string", null=True),
        "share_cpus": _t("boolean"),
        "mem_policy": {"enum": ["bind", "preferred", "interleave", "default"]},
        "mem_nodes": _list(_NODE),
        "profile": _t("string"),
        "fallback": _t("string", null=True),
        "numactl_args": _list(_t("string")),
        "exec_prefix": _list(_t("string")),
        "systemd": _t("object"),
        "environment": {"type": "object", "additionalProperties": _t("string")},
        "secret_environment": _list(_t("string")),
        "command": _t("array", null=True, items=_t("string")),
        "engine": _t("string"),
        "engine_version": _t("string", null=True),
        "engine_args": _list(_t("string")),
        "worker_cpus": _t("array", null=True, items=_t("string")),
        "user": _t("string", null=True),
        "group": _t("string", null=True),
        "memory_bytes": _BYTES,
        "pinned_bytes": _BYTES,
        "pinned_source": _t("string", null=True),
        "nics": _list(_t("string")),
        "gpu_nics": _list(_list(_t("string"))),
        "warnings": _list(_t("string")),
    })),
    "warnings": _list(_t("string")),
}
PLAN_SCHEMA = _doc(schemas.PLAN, "gpunuma plan (docs/plan-v1.md)",
                   ["profile", "instances"], _PLAN_PROPERTIES)

# A node's state file is read back leniently (an older gpunuma's file has no pinned nor history): only what
# is there must have its type; the profile names and times in it are checked by plan.state.
_STATE_PROPERTIES = {
    "hostname": _t("string", null=True),
    "profile": _t("string", null=True),
    "pinned": _t("boolean"),
    "updated": _t("string", null=True),
    "history": _list(_obj(["time", "to"], {
        "time": _t("string"),
        "from": _t("string", null=True),
        "to": _t("string"),
        "action": _t("string", null=True),
        "reason": _t("string", null=True),
        "user": _t("string", null=True),
    })),
}
STATE_SCHEMA = _doc(schemas.STATE, "gpunuma node state (docs/state-v1.md)",
                    [], _STATE_PROPERTIES)

_AUDIT_PROPERTIES = {
    "hostname": _t("string", null=True),
    "time": _t("string"),
    "status": {"enum": ["compliant", "drifted", "unreachable"]},
    "profile": _t("object"),
    "fingerprint": _t("object"),
    "numa_balancing": _t("object"),
    "containers": _t("object", null=True),
    "instances": _list(_obj(["name"], {
        "name": _t("string"),
        "unit": _t("string", null=True),
        "expected": _t("object"),
        "live": _t("object"),
    })),
    "findings": _list(_obj(["id", "severity", "message"], {
        "id": _t("string"),
        "severity": {"enum": ["error", "warning", "info"]},
        "instance": _t("string", null=True),
        "message": _t("string"),
    })),
    "policy": _t("object"),
}
AUDIT_SCHEMA = _doc(schemas.AUDIT, "gpunuma drift audit (docs/audit.md)",
                    ["hostname", "time", "status", "instances", "findings"], _AUDIT_PROPERTIES)

_VALIDATION_PROPERTIES = {
    "hostname": _t("string", null=True),
    "generated_at": _t("string", null=True),
    "policy": _t("string", null=True),
    "profile": _t("string", null=True),
    "probe_status": _t("string", null=True),
    "status": _t("string"),
    "load": _t("object"),
    "gpus": _list(_obj(["index", "verdict", "placements", "controls"], {
        "index": _t("integer", null=True),
        "uuid": _t("string", null=True),
        "verdict": _t("string"),
        "verdict_reason": _t("string", null=True),
        "suggested_rollback": _t("string", null=True),
        "placements": _t("object"),
        "controls": _list(_obj(["id", "status"], {
            "id": _t("string"),
            "status": {"enum": ["pass", "fail", "waived", "not_applicable"]},
        })),
    })),
    "summary": {"type": "object", "additionalProperties": _t("integer", minimum=0)},
}
VALIDATION_SCHEMA = _doc(schemas.VALIDATION, "gpunuma validation report (docs/probe.md)",
                         ["hostname", "generated_at", "policy", "gpus", "summary"], _VALIDATION_PROPERTIES)

SCHEMAS = {
    schemas.TOPOLOGY: TOPOLOGY_SCHEMA,
    schemas.PLAN: PLAN_SCHEMA,
    schemas.STATE: STATE_SCHEMA,
    schemas.AUDIT: AUDIT_SCHEMA,
    schemas.VALIDATION: VALIDATION_SCHEMA,
}

# How a type is named in a problem: the words of the inventory and YAML, not JSON Schema's.
_TYPE_WORDS = {"object": "a mapping", "array": "a list", "string": "a string", "integer": "a whole number",
               "number": "a number", "boolean": "a boolean", "null": "null"}
_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}
_MAX_PROBLEMS = 20


def _shown(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check(schema, value, where, problems):
    """Append to ``problems`` each way ``value`` is not ``schema`` (the subset of JSON Schema used above)."""
    if len(problems) >= _MAX_PROBLEMS:
        return
    if "const" in schema and value != schema["const"]:
        problems.append("%s: %s is not allowed; allowed: %r" % (where, _shown(value), schema["const"]))
        return
    if "enum" in schema and value not in schema["enum"]:
        problems.append("%s: %s is not allowed; allowed: %s" % (where, _shown(value), ", ".join(
            "null" if e is None else str(e) for e in schema["enum"])))
        return
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_TYPES[k](value) for k in kinds):
            problems.append("%s: %s is not %s" % (where, _shown(value), " or ".join(_TYPE_WORDS[k] for k in kinds)))
            return
    if isinstance(value, int) and not isinstance(value, bool) and "minimum" in schema and value < schema["minimum"]:
        problems.append("%s: %d is below %d" % (where, value, schema["minimum"]))
    if isinstance(value, str) and "pattern" in schema:
        if not re.search(schema["pattern"], value):
            problems.append("%s: %s does not match %s" % (where, _shown(value), schema["pattern"]))
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                problems.append("%s.%s: missing; the document needs it" % (where, key))
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                check(sub, value[key], "%s.%s" % (where, key), problems)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in sorted(set(value) - set(schema.get("properties", {}))):
                check(extra, value[key], "%s.%s" % (where, key), problems)
    if isinstance(value, list) and "items" in schema:
        for pos, item in enumerate(value):
            check(schema["items"], item, "%s[%d]" % (where, pos), problems)


def problems_of(name, data, source=None):
    """The problems of ``data`` as the document ``name`` (a ``schemas`` constant); [] when it is one."""
    problems = []
    check(SCHEMAS[name], data, source or name.split("/")[0].split(".")[-1], problems)
    return problems


def load_text(cls, text, source):
    """``(document, None)`` of a JSON text read from ``source``, else ``(None, why)`` naming the file and fields."""
    try:
        data = bounded.loads_json(text)
    except (ValueError, RecursionError) as exc:
        return None, "%s: not valid JSON (%s)" % (source, exc)
    try:
        return cls.load(data), None
    except DocumentError as exc:
        return None, "%s: not a %s document: %s" % (source, cls.NAME, "; ".join(exc.problems))


@dataclass
class Document:
    """A checked document: its schema name and its data."""

    data: dict = field(default_factory=dict)
    NAME: ClassVar[Optional[str]] = None

    @classmethod
    def load(cls, data, source=None):
        """The document, or :class:`DocumentError` naming every field that is not its schema's."""
        problems = problems_of(cls.NAME, data, source)
        if problems:
            raise DocumentError(problems)
        return cls(copy.deepcopy(data))

    def to_dict(self):
        return copy.deepcopy(self.data)


class Topology(Document):
    NAME = schemas.TOPOLOGY


class Plan(Document):
    NAME = schemas.PLAN


class State(Document):
    NAME = schemas.STATE


class AuditReport(Document):
    NAME = schemas.AUDIT


class ValidationReport(Document):
    NAME = schemas.VALIDATION


TYPES = {cls.NAME: cls for cls in (Topology, Plan, State, AuditReport, ValidationReport)}
