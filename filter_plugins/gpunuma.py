"""gpunuma's controller-side Jinja filters, for every role and playbook.

The logic lives in ``module_utils/gpunuma`` and is imported here exactly as
modules import it; these filters hand it the roles' inputs and turn its
errors (``GpunumaError``) into filter errors. One file holds them all so the
``module_utils`` path set-up and the error wrapper exist once; ansible.cfg
(``filter_plugins = filter_plugins``) and the molecule scenarios
(``ANSIBLE_FILTER_PLUGINS``) point Ansible here.

Sections: fleet audit (playbooks/audit.yml), autonuma, gpu_topology,
gpu_validate, gpunuma_state, kubelet_topology, memlock, numa_binding. Every filter is the
module-level function of the same name.
"""

from __future__ import annotations

import functools
import json
import os
import re

import ansible.module_utils
from ansible import constants as C
from ansible.errors import AnsibleFilterError

# Controller-side plugins do not get the configured module_utils path on
# ansible.module_utils (only modules shipped to a node do); add it so the
# core is imported exactly as modules import it.
for _path in C.DEFAULT_MODULE_UTILS_PATH or []:
    if _path not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(_path)

from ansible.module_utils.gpunuma.verify import audit  # noqa: E402
from ansible.module_utils.gpunuma.verify.h2d import report as h2d_report
from ansible.module_utils.gpunuma.verify.h2d import policy as h2d_policy
from ansible.module_utils.gpunuma.node import limits  # noqa: E402
from ansible.module_utils.gpunuma.run import role_inputs  # noqa: E402
from ansible.module_utils.gpunuma.run import topology_store  # noqa: E402
from ansible.module_utils.gpunuma.run import dry_run  # noqa: E402
from ansible.module_utils.gpunuma.node import accounts as accountslib  # noqa: E402
from ansible.module_utils.gpunuma.node import autonuma as autonumalib  # noqa: E402
from ansible.module_utils.gpunuma.node import housekeeping as housekeepinglib  # noqa: E402
from ansible.module_utils.gpunuma.node import programs as programslib  # noqa: E402
from ansible.module_utils.gpunuma.plan import state as statelib  # noqa: E402
from ansible.module_utils.gpunuma.common import seal as seallib  # noqa: E402
from ansible.module_utils.gpunuma.common import text as textlib  # noqa: E402
from ansible.module_utils.gpunuma.plan import pinned as pinnedlib  # noqa: E402
from ansible.module_utils.gpunuma.common import secrets as secretslib  # noqa: E402
from ansible.module_utils.gpunuma.common.errors import GpunumaError  # noqa: E402
from ansible.module_utils.gpunuma.kubelet import guard as kubeletguard  # noqa: E402
from ansible.module_utils.gpunuma.kubelet import change as kubeletchange  # noqa: E402
from ansible.module_utils.gpunuma.kubelet import dra as kubeletdra  # noqa: E402
from ansible.module_utils.gpunuma.kubelet import resource_slices as resourceslices  # noqa: E402
from ansible.module_utils.gpunuma.plan.systemd_words import (  # noqa: E402
    systemd_environment_assignment, systemd_exec_line)
from ansible.module_utils.gpunuma.plan.profiles import (  # noqa: E402
    ProfileError, base_profile, load_profiles, profile_choice_problem)


def _filter(function, doc=None):
    """``function`` with its GpunumaError raised as AnsibleFilterError (``__wrapped__`` is ``function``); ``doc``,
    when given, is the filter's docstring instead of the function's. (No ``name.__doc__ = ...`` at the top level:
    ansible-doc reads this file's top-level assignments and warns on each attribute target.)"""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except GpunumaError as exc:
            raise AnsibleFilterError(str(exc))

    if doc is not None:
        wrapper.__doc__ = doc
    return wrapper


# ================================================================ site.yml
# The line a host that failed the apply play ends with.

# What a step's result says when the node stopped answering in the middle of
# it (rebooted, powered off, container stopped, connection cut): the module's
# output ends before its JSON, or the connection reports the loss.
_NODE_GONE = re.compile(
    r"Module result deserialization failed|No start of json char found|MODULE FAILURE|"
    r"Connection reset|Connection closed|closed by remote host|Broken pipe|Shared connection to .* closed|"
    r"is not running|No such container|Failed to connect to the host", re.IGNORECASE)


def gpunuma_not_provisioned(host, task, result):
    """``NOT PROVISIONED: HOST failed at "STEP": why`` for a host the apply play could not finish.

    A node that went away mid-step is said to have done so (its result is
    often only "Module result deserialization failed"); the message of any
    other failure follows as the step gave it.
    """
    result = result if isinstance(result, dict) else {}
    msg = str(result.get("msg") or "").strip()
    detail = " ".join(str(result.get(k) or "") for k in ("msg", "module_stdout", "module_stderr", "stderr"))
    gone = bool(result.get("unreachable")) or bool(_NODE_GONE.search(detail))
    why = msg or "no message"
    if gone:
        why = ("the node stopped answering during this step (rebooted, shut down, or its connection dropped); "
               "what it had applied is kept and a plain re-run converges it. The step said: %s" % (msg or "nothing"))
    return 'NOT PROVISIONED: %s failed at "%s": %s' % (host, task or "an unnamed step", why)


def gpunuma_would_change(hosts):
    """plan.yml's lines of what site.yml would change, per host, from its apply play's check-mode results.

    ``hosts``: each host's variables (hostvars), in inventory order; run/dry_run.py reads the steps' results.
    """
    return dry_run.table([{"host": h.get("inventory_hostname"), "results": {
        "numactl": h.get("numa_binding_numactl_installed"), "memlock": h.get("memlock_applied"),
        "autonuma": h.get("autonuma_decision"), "kubelet": h.get("kubelet_topology_applied"),
        "apply": h.get("numa_binding_applied")}} for h in hosts])


# ================================================================ documents
# topology.json and plan.json are written by the roles; each gets its
# checksum (common/seal.py) as it is serialised.


@_filter
def gpunuma_seal(document):
    """``document`` with its checksum, ready for to_nice_json."""
    return seallib.seal(document)


# ================================================================ fleet audit
# Summary of playbooks/audit.yml: table lines and Prometheus textfile metrics.


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


def gpunuma_audit_kubelet(plan_result, profile=None, problem=None):
    """audit.kubelet_findings from a kubelet_topology plan result (or the problem that stopped it)."""
    plan_result = plan_result or {}
    # Plain dicts: Ansible stores no dict subclass in a variable without a warning.
    return [dict(f) for f in audit.kubelet_findings(plan_result.get("changes"), plan_result.get("remove_checkpoints"),
                                                    problem, profile, plan_result.get("dra_checkpoint"))]


@_filter
def gpunuma_audit_resource_slices(document, topology, node_name):
    """``kubelet-resource-slice`` findings: the node's DRA ResourceSlices against its topology."""
    if isinstance(document, str):
        try:
            document = json.loads(document)
        except ValueError as exc:
            raise AnsibleFilterError("gpunuma_audit_resource_slices: not JSON (%s); allowed: the output of kubectl get "
                                     "resourceslices -o json" % exc)
    return [dict(audit.Finding("kubelet-resource-slice", f["severity"], f["message"], None, f["expected"], f["actual"]))
            for f in resourceslices.resource_slice_findings(document, topology or {}, node_name)]


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
    hosts = [(report.get("hostname"), report.get("status") == "compliant") for report in reports]
    lines += ['gpunuma_audit_compliant{host="%s"} %d' % (_label(h), ok) for h, ok in hosts]
    lines += ['gpunuma_audit_compliant{host="%s"} 0' % _label(host) for host in unreachable]
    lines += [
        "# HELP gpunuma_audit_unreachable 1 when the node could not be audited.",
        "# TYPE gpunuma_audit_unreachable gauge",
    ]
    lines += ['gpunuma_audit_unreachable{host="%s"} 0' % _label(h) for h, _unused in hosts]
    lines += ['gpunuma_audit_unreachable{host="%s"} 1' % _label(host) for host in unreachable]
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


# ================================================================ autonuma
# Everything the role does is gpunuma.node.autonuma.role_plan (the value, the
# live write, who else sets kernel.numa_balancing: gpunuma.node.sysctl_owners).

# autonuma_numa_balancing (auto follows the profile and the kernel release): gpunuma.autonuma.
autonuma_decide = _filter(autonumalib.decide)
# Whether the live value is written (not in a container unless asked): the audit asks the same function.
autonuma_role_plan = _filter(autonumalib.role_plan)

# systemd-sysctl reads only *.conf files (sysctl.d(5)); the whole path must match.
AUTONUMA_SYSCTL_FILE_PATTERN = r"/[^\x00-\x1f\x7f]*[^/\x00-\x1f\x7f]\.conf"


def autonuma_input_problems(options, values, aliases=None):
    """Every problem of the AutoNUMA inputs (argument spec, then the sysctl file name)."""
    problems = role_inputs.input_problems(options, values, aliases, refined=("autonuma_sysctl_file",))
    named = set(p.split(":", 1)[0] for p in problems)
    balancing = values.get("autonuma_numa_balancing")
    if (
        "autonuma_numa_balancing" not in named
        and balancing is not None
        and (isinstance(balancing, bool) or str(balancing).strip() not in ("0", "1", "auto"))
    ):
        problems.append(
            "autonuma_numa_balancing: %s is invalid; allowed: auto (follow the profile and the kernel), "
            "0 (AutoNUMA off), 1 (on), or null (leave it alone)%s"
            % (
                textlib.shown(balancing),
                (
                    " - YAML read an unquoted off/on/no/yes as a boolean; write 0 or 1"
                    if isinstance(balancing, bool)
                    else ""
                ),
            )
        )
    path = values.get("autonuma_sysctl_file")
    if (
        "autonuma_sysctl_file" not in named
        and isinstance(path, str)
        and not re.fullmatch(AUTONUMA_SYSCTL_FILE_PATTERN, path)
    ):
        problems.append(
            "autonuma_sysctl_file: %s is invalid; allowed: an absolute path ending in .conf "
            "(systemd-sysctl ignores other names)" % repr(path)
        )
    return problems


# ================================================================ gpu_topology
# Controller file names (gpunuma.role_inputs) and the persisted-topology decision (gpunuma.run.topology_store).


# The one name of a host's controller files (topology, plan, audit and
# validation reports): reversible %XX, so two hosts never share a file.
gpunuma_host_file = _filter(role_inputs.host_file_stem,
                            "The controller file name stem of inventory host ``host`` (role_inputs.host_file_stem).")


# node_exporter's textfile directory: Debian's and Ubuntu's prometheus-node-exporter
# package, and EPEL's golang-github-prometheus-node-exporter (EL, Fedora), which
# passes it in /etc/sysconfig/node_exporter.
TEXTFILE_DIRS = {"debian": "/var/lib/prometheus/node-exporter", "el": "/var/lib/node_exporter/textfile_collector"}
_TEXTFILE_FLAG = re.compile(r"--collector\.textfile\.directory[= ]+[\"']?(/[^\s\"']+)")
_EL_IDS = {"rhel", "centos", "fedora", "rocky", "almalinux", "ol"}


def gpunuma_metrics_textfile_dir(os_release, exporter_env_texts):
    """The textfile directory ``auto`` stands for on a node: the ``--collector.textfile.directory`` its
    node_exporter's environment file passes (``exporter_env_texts``: /etc/default/prometheus-node-exporter,
    /etc/sysconfig/node_exporter), else the directory its distribution's package uses (``os_release``: the text
    of /etc/os-release; EL and Fedora by ID or ID_LIKE), else Debian's."""
    for text in exporter_env_texts or []:
        for line in (text or "").splitlines():
            if line.lstrip().startswith("#"):
                continue
            match = _TEXTFILE_FLAG.search(line)
            if match:
                return match.group(1)
    ids = set()
    for line in (os_release or "").splitlines():
        key, _sep, value = line.partition("=")
        if key.strip() in ("ID", "ID_LIKE"):
            ids.update(value.strip().strip("\"'").split())
    return TEXTFILE_DIRS["el"] if ids & _EL_IDS else TEXTFILE_DIRS["debian"]


def gpunuma_output_dir(playbook_dir, name, environ=None):
    """The controller directory ``name`` (topology, validation, audit) of a run of the playbook in ``playbook_dir``.

    Beside the playbook's directory (``<playbook_dir>/../<name>``), as in a
    checkout or a user's own project; but a playbook an installed collection
    ships (its directory lies under an ``ansible_collections`` tree) must not
    write into the collection, so its runs keep their files under
    ``$XDG_STATE_HOME/gpunuma/<name>`` (``~/.local/state/gpunuma/<name>``).
    docs/collection.md.
    """
    environ = os.environ if environ is None else environ
    parts = os.path.realpath(str(playbook_dir)).split(os.sep)
    if "ansible_collections" not in parts:
        return os.path.join(str(playbook_dir), "..", name)
    state = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "gpunuma", name)


def _gpu_topology_stem_problem(host):
    """Why ``host`` cannot name a controller file, or None."""
    try:
        role_inputs.host_file_stem(host)
    except GpunumaError as exc:
        return str(exc)
    return None


gpu_topology_controller_files = _filter(topology_store.controller_files)


# The role's one decision over the persisted inventories.
gpu_topology_decide = _filter(topology_store.decide)


def gpu_topology_input_problems(options, values, aliases=None, host=None):
    """Every problem of the discovery inputs (argument spec, then the host's file name)."""
    problems = role_inputs.input_problems(options, values, aliases)
    if host is not None:
        problem = _gpu_topology_stem_problem(host)
        if problem:
            problems.append(problem)
    return problems


# ================================================================ gpu_validate
# Validation reports over gpunuma.h2d_report.


@_filter
def gpu_validate_policy(data, source="policy"):
    return h2d_policy.load_policy(data, source)


@_filter
def gpu_validate_report(probe, policy, hostname, profile=None, generated_at=None, previous=None):
    """The host's validation report; ``previous`` is the text of its last report file ("" or damaged: none)."""
    if isinstance(previous, str):
        try:
            previous = json.loads(previous) if previous.strip() else None
        except ValueError:
            previous = None
    return h2d_report.build_report(probe, policy, hostname=hostname, profile=profile, generated_at=generated_at,
                                   previous=previous)


@_filter
def gpu_validate_table(reports):
    return h2d_report.fleet_table([r for r in reports if isinstance(r, dict)])


# ================================================================ gpunuma_state
# Which profile a node runs: the decisions are gpunuma.state; these filters
# hand it the profiles directory and the variables given on the command line.


def _extra_vars():
    """The -e variables of this run (they are indistinguishable from inventory variables in templates)."""
    try:
        from ansible.parsing.dataloader import DataLoader
        from ansible.utils.vars import load_extra_vars

        return load_extra_vars(DataLoader()) or {}
    except Exception:  # pragma: no cover - no CLI context (unit tests)
        return {}


def gpunuma_extra_var(name, default=None):
    """The value of ``-e name=...`` on this run's command line, or ``default``."""
    return _extra_vars().get(name, default)


# A plan's profile is a rung and an optional variant (gpunuma.plan.profiles.ProfileName).
gpunuma_base_profile = _filter(base_profile)


def gpunuma_effective_profile(read, rollback_target, cli_profile, inventory_profile):
    """``[profile, source]`` the node runs this run (plan/state.effective_profile)."""
    return list(statelib.effective_profile(rollback_target, cli_profile, read, inventory_profile))


def gpunuma_state_read(files, path):
    """gpunuma_state's read of a node (mode read), from the run's node read: ``files`` holds the state file
    (``gpunuma_state``) and the applied plan (``gpunuma_state_plan``) as gpunuma_node_info reads them. The same
    ``{gpunuma_state, warnings}`` the module returns, decided by the same code (plan/state.read_summary), or
    ``{error}`` for a state file of a newer gpunuma."""
    try:
        result, corrupt = statelib.read_summary(statelib.text_of_read(files.get("gpunuma_state")),
                                                statelib.text_of_read(files.get("gpunuma_state_plan")), path)
    except statelib.StateError as exc:
        return {"error": str(exc)}
    return {"gpunuma_state": result, "warnings": [statelib.corrupt_warning(path, corrupt, False)] if corrupt else [],
            "error": None}


def gpunuma_rollback_target(read, rollback, requested, profiles_dir, inventory_profile, host):
    """``{target, action, from}`` or ``{error}`` for a rollback of one node.

    ``read``: the gpunuma_state module's ``gpunuma_state`` (mode read).
    """
    try:
        profiles = load_profiles(profiles_dir)
    except ProfileError as exc:
        return {"error": "%s: the profiles in %s cannot be read: %s" % (host, profiles_dir, exc)}
    if rollback in ("", None):
        rollback = None
    if isinstance(requested, str) and requested == "":
        requested = None
    try:
        target, action = statelib.resolve_target(
            read.get("current_profile"), read.get("state"), rollback, requested, profiles, inventory_profile, host
        )
    except statelib.StateError as exc:
        return {"error": str(exc)}
    return {"target": target, "action": action, "from": read.get("current_profile")}


# ================================================================ kubelet_topology

@_filter
def kubelet_topology_dra_mode(requested, registrations=()):
    """``kubelet_topology_dra`` resolved (``auto``: from the node's DRA plugin registrations)."""
    return kubeletdra.dra_mode(requested, registrations)


@_filter
def kubelet_topology_guard_files(plan, enabled, script_text, python, libexec_dir, unit_dir, service, state_dir,
                                 backup_dir, tolerance_mib, header=""):
    """The memory checkpoint check's script and kubelet drop-in (or their removal), for gpunuma_apply."""
    return kubeletguard.guard_files(bool((plan or {}).get("memory_checkpoint_guard")), bool(enabled), script_text,
                                    python, libexec_dir, unit_dir, service, state_dir, backup_dir, tolerance_mib,
                                    header)


@_filter
def kubelet_topology_read_request(config_path, state_dir, dra):
    """What the kubelet plan reads of the node, as gpunuma_node_info's options."""
    return kubeletchange.read_request(config_path, state_dir, dra)


@_filter
def kubelet_topology_node_read(read):
    """The kubelet's part of a node read, decoded by checkpoint name (None when the read holds none)."""
    return kubeletchange.node_read(read)


@_filter
def kubelet_topology_change(plan, guard, config_path, state_dir, service):
    """The kubelet change (when the plan needs one) and the check's files as one gpunuma_apply request."""
    return kubeletchange.change_request(plan or {}, guard, config_path, state_dir, service)


# ================================================================ memlock
# The memlock limit as systemd writes it, and the ceiling PID 1 puts on it
# (gpunuma.limits).

memlock_role_plan = _filter(limits.role_plan)

# User and group names as shadow-utils accepts them (a trailing $ marks Samba
# machine accounts); anything else could break the limits.d line. Matched
# against the whole name: "root\n" is not a name.
MEMLOCK_NAME_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.-]*[$]?"
# RLIM_INFINITY is 2^64-1; limits.conf counts KiB.
_MAX_LIMIT = 2**64 - 1


def _parsed_limit(value, variable):
    """(bytes, None), (None, None) for unlimited, or (None, the parse error)."""
    try:
        return limits.parse_limit(value, variable), None
    except GpunumaError as exc:
        return None, str(exc)


def memlock_limit_problem(value, variable="memlock_limit"):
    """Why ``value`` is no memlock limit, naming ``variable`` and the allowed range; None when it is one.

    Parsed by limits.parse_limit, the function that turns it into the
    units' LimitMEMLOCK= and the limits.d value: one grammar for both.
    """
    limit, problem = _parsed_limit(value, variable)
    if limit is None:
        return problem
    if limit == 0 or limit >= _MAX_LIMIT:
        return (
            "%s: %s is %d bytes; allowed: unlimited, infinity, or a size from 1K to below 16E "
            "(0 locks no memory at all: pinned CUDA and NCCL buffers fail)"
            % (variable, textlib.shown(value), limit)
        )
    if limit % 1024:
        return (
            "%s: %s is %d bytes, not a whole number of KiB (limits.conf counts KiB); allowed: a multiple "
            "of 1024 bytes, or a size such as 512M" % (variable, textlib.shown(value), limit)
        )
    return None


def memlock_input_problems(options, values, aliases=None):
    """Every problem of the memlock inputs (argument spec, then the size and the names)."""
    problems = role_inputs.input_problems(options, values, aliases, refined=("memlock_users", "memlock_groups"))
    named = set(p.split(":", 1)[0] for p in problems)
    if "memlock_limit" not in named:
        problem = memlock_limit_problem(values.get("memlock_limit"))
        if problem:
            problems.append(problem)
    wildcard = values.get("memlock_allow_wildcard")
    wildcard = wildcard is True or str(wildcard).strip().lower() in ("y", "yes", "on", "1", "true", "t")
    users = values.get("memlock_users")
    if "memlock_users" not in named and isinstance(users, list):
        if "*" in users and not wildcard:
            problems.append(
                "memlock_users: '*' would give every user on the node the limit; allowed: named users, or set "
                "memlock_allow_wildcard: true to mean it"
            )
        problems += role_inputs.name_problems(
            "memlock_users",
            users,
            MEMLOCK_NAME_PATTERN,
            "letters, digits, '_', '.', '-' (groups go in memlock_groups, without '@')",
            extra_ok=("*",),
            noun="user names",
        )
    groups = values.get("memlock_groups")
    if "memlock_groups" not in named:
        problems += role_inputs.name_problems(
            "memlock_groups",
            groups,
            MEMLOCK_NAME_PATTERN,
            "letters, digits, '_', '.', '-', without a leading '@'",
            noun="group names",
        )
    return problems


# ================================================================ numa_binding
# Render plan instances into systemd unit syntax. Templates only render the
# plan: the argv quoting for ``ExecStart=`` is the planner's own
# ``systemd_exec_line`` (imported, not copied), so a command is always passed
# as argv and never read by a shell.

numa_binding_profile_problem = profile_choice_problem
numa_binding_exec_line = _filter(systemd_exec_line,
                                 "``ExecStart=`` value running ``argv`` verbatim (plan.systemd_exec_line).")
numa_binding_environment = _filter(systemd_environment_assignment,
                                   "``Environment=`` word for one variable (plan.systemd_environment_assignment).")


def numa_binding_redact_secrets(instances, patterns):
    """The inventory's instances with every secret environment value replaced by <secret> (before planning)."""
    return secretslib.redact_instances(instances, patterns)


@_filter
def numa_binding_env_files(plan, instances, env_dir, header=""):
    """The environment files (secret values, 0600) of the planned instances: gpunuma_apply secret_files."""
    return secretslib.env_files(plan, instances, env_dir, header)


def numa_binding_stale_env_files(applied, plan, env_dir):
    """Environment files of the applied plan this plan no longer wants: gpunuma_apply secret_absent."""
    return secretslib.stale_env_files(applied, plan, env_dir)


def numa_binding_program_requests(instances):
    """What gpunuma_node_info's ``programs`` section reads: each instance's command[0] and account."""
    return programslib.program_requests(instances)


def numa_binding_account_to_create(plan, accounts, start, create_user, groups=()):
    """The dedicated account this run creates, or None (node/accounts.account_to_create)."""
    return accountslib.account_to_create(plan, accounts, bool(start), bool(create_user), groups)


def numa_binding_account_reads(instances):
    """The accounts the node read asks about (node/accounts.users_to_read)."""
    return accountslib.users_to_read(instances)


def numa_binding_account_problems(plan, accounts, host, start, create_user):
    """Why the instances cannot start as the accounts they name (node/accounts.missing_account_problems)."""
    return accountslib.missing_account_problems(plan, accounts, host, start, create_user)


def numa_binding_housekeeping(plan, unit_dir, confine, irqbalance_ban, slice_name, cpuset_available,
                              irqbalance_loaded, irqbalance_default, host, header="", irq_pin=False, topology=None,
                              irqbalance_active=False):
    """Files, removals, services and problems of housekeeping confinement, irqbalance's ban and IRQ pinning."""
    return housekeepinglib.housekeeping_files(
        plan, unit_dir=unit_dir, confine=confine, irqbalance_ban=irqbalance_ban, slice_name=slice_name,
        cpuset_available=cpuset_available, irqbalance_loaded=irqbalance_loaded,
        irqbalance_default=irqbalance_default, host=host, header=header, irq_pin=irq_pin, topology=topology,
        irqbalance_active=irqbalance_active)


def numa_binding_node_reads(files):
    """``files`` (name -> path) of the numa_binding node read, with irqbalance's environment files added."""
    reads = dict(files or {})
    reads.update(housekeepinglib.irqbalance_env_reads())
    return reads


def numa_binding_irqbalance_texts(files):
    """``{path: text}`` of irqbalance's environment files from that read's ``files`` result."""
    return housekeepinglib.irqbalance_env_read_texts(files)


def numa_binding_exec_argv(instance, numactl_path):
    """The argv a plan instance runs: numactl prefix (if any) + command.

    The plan's ``exec_prefix`` names ``numactl`` by program name; the unit
    gets the node's absolute path so it does not depend on systemd's
    executable search path.
    """
    command = instance.get("command")
    if not command:
        raise AnsibleFilterError("instance %r has no command to run" % instance.get("name"))
    prefix = list(instance.get("exec_prefix") or [])
    if prefix and prefix[0] == "numactl":
        prefix[0] = numactl_path
    return prefix + list(command)


def numa_binding_input_problems(options, values, aliases, profiles_dir):
    """Every problem of the binding inputs, naming the variable the user set.

    The argument spec's checks (role_inputs.input_problems), then the ones a
    spec cannot express: the profile is a file of ``profiles_dir`` and
    ``numa_binding_limit_memlock`` parses as the memlock role's sizes do, and the pinned budgets' headroom and
    page-cache share are what the planner takes (plan/pinned.py), each named by the user's variable.
    """
    problems = role_inputs.input_problems(options, values, aliases)
    profile = values.get("numa_binding_profile")
    variable = role_inputs.user_variable(
        "numa_binding_profile", options.get("numa_binding_profile", {}), values, aliases
    )
    # The profile's own sentence (known names, the unquoted-off hint) replaces the spec's type sentence.
    problems = [p for p in problems if not p.startswith(variable + ":")]
    problem = profile_choice_problem(profile, profiles_dir, variable)
    if problem:
        problems.append(problem)
    memlock = values.get("numa_binding_limit_memlock")
    if memlock not in (None, role_inputs.UNDEFINED):
        # memlock_limit where the user set that one (the option's default): the memlock role names it the same.
        memlock_variable = role_inputs.user_variable(
            "numa_binding_limit_memlock", options.get("numa_binding_limit_memlock", {}), values, aliases)
        problem = numa_binding_limit_problem(memlock, memlock_variable)
        if problem and not any(p.startswith(memlock_variable + ":") for p in problems):
            problems.append(problem)
    for name, check in (("numa_binding_pinned_headroom", pinnedlib.parse_headroom),
                        ("numa_binding_pinned_page_cache_percent", pinnedlib.check_page_cache_percent)):
        value = values.get(name)
        if value not in (None, role_inputs.UNDEFINED) and not any(p.startswith(name + ":") for p in problems):
            check(value, problems, name)
    instances_variable = role_inputs.user_variable(
        "numa_binding_instances", options.get("numa_binding_instances", {}), values, aliases)
    patterns = values.get("numa_binding_secret_patterns")
    problems.extend(secretslib.value_problems(values.get("numa_binding_instances"),
                                              patterns if isinstance(patterns, list) else secretslib.DEFAULT_PATTERNS,
                                              instances_variable))
    return problems


def numa_binding_limit_problem(value, variable):
    """Why ``value`` is no RLIMIT_MEMLOCK value (limits.parse_limit, then the range); None when it is one."""
    limit, problem = _parsed_limit(value, variable)
    if limit is None:
        return problem
    if limit < 1024 or limit >= _MAX_LIMIT:
        return (
            "%s: %s is %d bytes; allowed: unlimited, infinity, or from 1K (1024 bytes) to below 16E "
            "(a limit of 0 locks no memory at all: pinned CUDA and NCCL buffers fail)"
            % (variable, textlib.shown(value), limit)
        )
    return None


# Filter name -> function; each name is the function's own name above.
FILTERS = (
    # fleet audit
    "gpunuma_audit_line",
    "gpunuma_audit_kubelet",
    "gpunuma_audit_unreachable_line",
    "gpunuma_audit_metrics",
    # autonuma
    "autonuma_input_problems",
    "autonuma_decide",
    "autonuma_role_plan",
    # site.yml
    "gpunuma_not_provisioned",
    "gpunuma_would_change",
    "gpunuma_seal",
    # gpu_topology
    "gpunuma_host_file",
    "gpunuma_output_dir",
    "gpunuma_metrics_textfile_dir",
    "gpu_topology_controller_files",
    "gpu_topology_decide",
    "gpu_topology_input_problems",
    # gpu_validate
    "gpu_validate_policy",
    "gpu_validate_report",
    "gpu_validate_table",
    # gpunuma_state
    "gpunuma_effective_profile",
    "gpunuma_state_read",
    "gpunuma_extra_var",
    "gpunuma_rollback_target",
    "gpunuma_base_profile",
    # memlock
    "memlock_input_problems",
    "memlock_role_plan",
    # numa_binding
    "numa_binding_input_problems",
    "numa_binding_profile_problem",
    "numa_binding_exec_argv",
    "numa_binding_exec_line",
    "numa_binding_environment",
    "numa_binding_program_requests",
    "numa_binding_redact_secrets",
    "numa_binding_env_files",
    "numa_binding_stale_env_files",
    "numa_binding_account_problems",
    "numa_binding_account_to_create",
    "numa_binding_account_reads",
    "numa_binding_housekeeping",
    "numa_binding_node_reads",
    "numa_binding_irqbalance_texts",
    "gpunuma_audit_resource_slices",
    "kubelet_topology_dra_mode",
    "kubelet_topology_guard_files",
    "kubelet_topology_change",
    "kubelet_topology_read_request",
    "kubelet_topology_node_read",
)


class FilterModule:
    def filters(self):
        return {name: globals()[name] for name in FILTERS}
