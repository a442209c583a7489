# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpunuma_inputs: the input check of gpunuma's roles, on the controller, in one step (no round trip).

For each role named, the variables of its main entry point (meta/argument_specs.yml) are templated and checked by
that role's own rule (the ``gpunuma.fleet.<role>_input_problems`` filter, or the argument spec's rules alone for a
role with no rule of its own), naming the variable the user set and what is allowed. A role whose inputs are good
adds what it needs of the node to the run's node read (its ``<role>_read_request`` variable, merged into
``gpunuma_node_read_requests``; docs/roles.md, "One node read"). Each role's problems are set as the fact its
playbooks read; the step fails when any role has a problem, one line a role, and sets nothing then.

The roles' own input checks are this step with their role alone; site.yml runs it once for every role of the run.
"""

from __future__ import annotations

import os

import ansible.module_utils
from ansible import constants as C
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible.utils.vars import merge_hash

# Controller-side plugins do not get the configured module_utils path on
# ansible.module_utils (only modules shipped to a node do); add it so the
# core is imported exactly as modules import it.
for _path in C.DEFAULT_MODULE_UTILS_PATH or []:
    if _path not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(_path)

from ansible.module_utils.gpunuma.common import layout  # noqa: E402
from ansible.module_utils.gpunuma.run import converge  # noqa: E402
from ansible.module_utils.gpunuma.run import role_inputs

display = Display()
# Per controller process: the names gpunuma's code spells, by code root.
_KNOWN = {}

# role -> (its filter, the fact its problems are kept in, the names of its arguments after options and values).
CHECKS = {
    "memlock": ("memlock_input_problems", "memlock_input_problems", ()),
    "autonuma": ("autonuma_input_problems", "autonuma_input_problems", ()),
    # The discovery names the host's controller files after it: the host name is checked too.
    "gpu_topology": ("gpu_topology_input_problems", "gpu_topology_input_problems", ("no_aliases", "host")),
    # The profile is a file of numa_binding_profiles_dir; the user's gpunuma_* variables are named.
    "numa_binding": ("numa_binding_input_problems", "numa_binding_input_problems", ("aliases", "profiles_dir")),
    "gpunuma_state": (None, "gpunuma_state_input_problems", ()),
    # Waivers and the like come from the user's gpunuma_policy_* variables: named as such.
    "policy_gate": (None, "policy_gate_input_problems", ("aliases",)),
}
# What a role reads of the node (gpunuma_node_info's options), a variable of its vars/main.yml; the roles not
# listed read nothing of it through the run's node read.
READ_REQUESTS = {
    "memlock": "memlock_read_request",
    "autonuma": "autonuma_read_request",
    "numa_binding": "numa_binding_read_request",
    "gpunuma_state": "gpunuma_state_read_request",
    "kubelet_topology": "kubelet_topology_read_request",
}
# Roles whose inputs their own planning step checks, once the discovery it needs has run (kubelet_topology_plan):
# here only their read request joins the run's node read.
READ_ONLY = ("kubelet_topology",)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("roles", "on_problem", "playbook"))
    _supports_check_mode = True

    def role_dir(self, name):
        """``(directory, imported)``: the play's own role of that name (its defaults and vars are the play's
        variables), else this project's or collection's."""
        try:
            roles = self._task.get_play().get_roles()
        except AttributeError:  # no play (the plugin driven by tests)
            roles = []
        for role in roles:
            if role.get_name().rsplit(".", 1)[-1] == name:
                return role._role_path, True
        return os.path.join(layout.plugin_root(__file__), "roles", name), False

    def role_file(self, role_dir, part, trusted=True, name="main.yml"):
        """The role's ``<part>/<name>`` through Ansible's loader (parsed once a run), templates trusted as the
        role's own; {} when there is none."""
        path = os.path.join(role_dir, part, name)
        if not os.path.isfile(path):
            return {}
        return self._loader.load_from_file(path, trusted_as_template=trusted) or {}

    def main_options(self, role_dir):
        """The options of the role's main entry point (its argument spec), with the defaults/main.yml text of those
        whose spec states no default (role_inputs.with_template_defaults)."""
        spec = self.role_file(role_dir, "meta", trusted=False, name="argument_specs.yml")
        return role_inputs.with_template_defaults(spec["argument_specs"]["main"].get("options") or {},
                                                  self.role_file(role_dir, "defaults", trusted=False))

    def role_scope(self, name, templar, task_vars):
        """``(role directory, templar, variables)`` as within the role: a role the play does not import gets its
        defaults and vars, as a play that imports it has them (the play's own values win); either way they name its
        own directory (role_path)."""
        role_dir, imported = self.role_dir(name)
        if not imported:
            task_vars = dict(self.role_file(role_dir, "defaults"), **dict(self.role_file(role_dir, "vars"), **task_vars))
        task_vars = dict(task_vars, role_path=role_dir, role_name=name)
        return role_dir, templar.copy_with_new_env(available_variables=task_vars), task_vars

    def value(self, templar, task_vars, name, default=None):
        if name not in task_vars:
            return default
        return templar.template(task_vars[name])

    def problems(self, name, templar, task_vars):
        """The role's problems (each a sentence naming a variable), and its read request ({} when it has none)."""
        filter_name, _fact, extra = CHECKS[name]
        role_dir, templar, task_vars = self.role_scope(name, templar, task_vars)
        options = self.main_options(role_dir)
        values, problems = {}, []
        for option in options:
            try:
                values[option] = self.value(templar, task_vars, option)
            except Exception as exc:  # a value that does not template: named as the check names any bad value
                problems.append("%s: cannot be worked out: %s" % (option, exc))
                values[option] = role_inputs.UNDEFINED
        args = []
        for kind in extra:
            if kind == "aliases":
                args.append(dict((alias, self.value(templar, task_vars, alias, role_inputs.UNDEFINED))
                                 for alias in role_inputs.aliases_of(options)))
            elif kind == "no_aliases":
                args.append({})
            elif kind == "host":
                args.append(task_vars.get("inventory_hostname"))
            elif kind == "profiles_dir":
                args.append(values.get("numa_binding_profiles_dir"))
        try:
            if filter_name is None:
                problems += role_inputs.input_problems(options, values, *args)
            else:
                check = self._shared_loader_obj.filter_loader.get("gpunuma.fleet." + filter_name)
                problems += check.j2_function(options, values, *args)
        except Exception as exc:  # a rule that cannot judge these values: the host stops, naming the role
            problems.append("the %s input check failed: %s" % (name, exc))
        if problems:
            return problems, {}
        return self.scoped_request(name, templar, task_vars)

    def scoped_request(self, name, templar, task_vars):
        """([], the role's read request, {} when it has none), or ([why], {}); ``templar`` and ``task_vars`` are
        the role's scope (role_scope)."""
        if name not in READ_REQUESTS:
            return [], {}
        try:
            return [], self.value(templar, task_vars, READ_REQUESTS[name], {}) or {}
        except Exception as exc:
            return ["cannot work out what to read of the node: %s" % exc], {}

    def read_request(self, name, templar, task_vars):
        """A READ_ONLY role's read request, as scoped_request, the role named in a problem."""
        _role_dir, templar, task_vars = self.role_scope(name, templar, task_vars)
        problems, request = self.scoped_request(name, templar, task_vars)
        return ["%s: %s" % (name, p) for p in problems], request

    def playbook_problems(self, playbook, templar, task_vars, roles=()):
        """Problems of the variables the playbook reads itself (playbooks/vars/argument_specs.yml's entry point
        ``playbook``) that are set: by the argument spec's rules (role_inputs.input_problems), each naming it. A
        variable a role of ``roles`` takes as its default (gpunuma_profile) is that role's to name, once."""
        path = os.path.join(layout.plugin_root(__file__), "playbooks", "vars", "argument_specs.yml")
        specs = (self._loader.load_from_file(path, trusted_as_template=False) or {}).get("argument_specs") or {}
        if playbook not in specs:
            return ["playbook: %r is not allowed; allowed: %s" % (playbook, ", ".join(sorted(specs)))]
        taken = set()
        for role in roles:
            taken.update(role_inputs.aliases_of(self.main_options(self.role_dir(role)[0])))
        options = dict((k, v) for k, v in (specs[playbook].get("options") or {}).items() if k not in taken)
        values, problems = {}, []
        for option in options:
            if option in task_vars:
                try:
                    values[option] = templar.template(task_vars[option])
                except Exception as exc:  # a value that does not template is named as any bad value is
                    problems.append("%s: cannot be worked out: %s" % (option, exc))
        return problems + role_inputs.input_problems(options, values)

    def warn_unknown(self, host, task_vars):
        """Name each gpunuma-prefixed variable of the inventory or the command line that nothing reads, once a run.

        Hosts run this step in processes of their own: of the play's hosts that have the variable, the first says
        it, with how many more have it.
        """
        root = layout.plugin_root(__file__)
        if root not in _KNOWN:
            _KNOWN[root] = role_inputs.known_variable_names(root)
        unknown = role_inputs.unknown_variables(set(task_vars), _KNOWN[root])
        if not unknown:
            return
        hosts = list(task_vars.get("ansible_play_hosts_all") or []) or [host]
        hostvars = task_vars.get("hostvars") or {}
        for name, nearest in unknown:
            having = [h for h in hosts if h == host or (h in hostvars and name in hostvars[h])]
            if having and having[0] != host:
                continue
            more = " (and %d more host%s)" % (len(having) - 1, "s" if len(having) > 2 else "") if len(having) > 1 else ""
            display.warning("%s%s: %s" % (host, more, role_inputs.unknown_variable_message(name, nearest)))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        # The host is never contacted (the fleet benchmark counts round trips by it, as gpunuma_converge's).
        result["gpunuma_round_trips"] = 0
        names = self._task.args.get("roles") or []
        unknown = [n for n in names if n not in CHECKS and n not in READ_ONLY]
        if not isinstance(names, list) or unknown:
            return dict(result, failed=True, msg="roles: %r is not allowed; allowed: a list of %s"
                        % (unknown or names, ", ".join(sorted(CHECKS) + list(READ_ONLY))))
        on_problem = self._task.args.get("on_problem", "fail")
        if on_problem not in ("fail", "return"):
            return dict(result, failed=True, msg="on_problem: %r is not allowed; allowed: fail, return" % (on_problem,))
        templar = self._templar.copy_with_new_env(available_variables=task_vars)
        host = task_vars.get("inventory_hostname")
        self.warn_unknown(host, task_vars)
        requests = templar.template(converge.host_fact(task_vars, "gpunuma_node_read_requests", {})) or {}
        facts, lines, said = {}, [], set()
        if self._task.args.get("playbook"):
            problems = self.playbook_problems(self._task.args["playbook"], templar, task_vars,
                                              [n for n in names if n in CHECKS])
            if problems:
                lines.append("%s: %s" % (host, "; ".join(problems)))
        for name in names:
            if name in READ_ONLY:
                problems, request = self.read_request(name, templar, task_vars)
            else:
                problems, request = self.problems(name, templar, task_vars)
                facts[CHECKS[name][1]] = problems
            # One knob read by two roles (memlock_limit, numa_binding's default) is named once, by the first.
            problems = [p for p in problems if p not in said]
            said.update(problems)
            if problems:
                lines.append("%s: %s" % (host, "; ".join(problems)))
            elif request:
                requests = merge_hash(requests, request, recursive=True, list_merge="append_rp")
        result["changed"] = False
        if lines and on_problem == "return":
            # The play stops once with every check's problems (playbooks/preflight.yml); nothing is read.
            return dict(result, problems=lines, input_problems=facts)
        if lines:
            return dict(result, failed=True, msg="\n".join(lines), input_problems=facts)
        facts["gpunuma_node_read_requests"] = requests
        if on_problem == "return":
            result["problems"] = []
        return dict(result, ansible_facts=facts)
