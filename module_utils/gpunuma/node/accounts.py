# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The account instances run as, created in the step that starts them (``gpunuma_apply``'s ``account``).

Only a missing account is created: a system account (``useradd --system``) with its home, comment, shell and
supplementary groups. An account that exists is left exactly as it is (its groups, shell and home are the
node owner's), as the numa_binding role always did. One ``useradd``, under the node lock, before any file is
validated or written (a unit that names the account is verified against a node that has it).
"""

from __future__ import annotations

import pwd
import re

from ansible.module_utils.gpunuma.common.text import control_problem

# useradd's default NAME_REGEX (shadow-utils, Debian and RHEL alike), without the trailing "$" of machine accounts.
NAME_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}\Z")


class AccountError(Exception):
    """The account could not be created; the message says why."""


def account_problem(spec):
    """Why ``spec`` (the ``account`` option) cannot name an account to create, or None."""
    if not NAME_RE.match(spec.get("name") or ""):
        return ("account.name: %r is not allowed; allowed: a lower-case login name (a letter or _, then letters, digits, "
                "_ or -, at most 32 characters)" % (spec.get("name"),))
    for field in ("comment", "home", "shell"):
        # Each goes into /etc/passwd as one field of one line (the rule role_inputs applies to every input).
        problem = control_problem(spec.get(field))
        if problem:
            return "account.%s: %r %s" % (field, spec[field], problem)
    for field in ("home", "shell"):
        if spec.get(field) and not spec[field].startswith("/"):
            return "account.%s: %r is not allowed; allowed: an absolute path" % (field, spec[field])
    for group in spec.get("groups") or []:
        if not NAME_RE.match(group):
            return "account.groups: %r is not allowed; allowed: group names" % (group,)
    if ":" in (spec.get("comment") or ""):
        return "account.comment: %r is not allowed; allowed: text without ':' (the passwd field separator)" % (
            spec["comment"],)
    return None


def useradd_argv(spec):
    """The one command that creates ``spec``'s account."""
    argv = ["useradd", "--system", "--create-home"]
    for option, field in (("--comment", "comment"), ("--home-dir", "home"), ("--shell", "shell")):
        if spec.get(field):
            argv += [option, spec[field]]
    if spec.get("groups"):
        argv += ["--groups", ",".join(spec["groups"])]
    return argv + ["--", spec["name"]]


def ensure(runner, spec, check_mode, exists=None):
    """Create ``spec``'s account when it is missing; returns {"name", "created", "changed"}.

    ``runner(argv) -> (rc, out, err)``; ``exists(name)`` tells whether the account is there (the node's passwd
    database by default). In check mode nothing is run: the result says what a real run would do."""
    exists = exists or _exists
    problem = account_problem(spec)
    if problem:
        raise AccountError(problem)
    if exists(spec["name"]):
        return {"name": spec["name"], "created": False, "changed": False}
    if not check_mode:
        rc, out, err = runner(useradd_argv(spec))
        if rc != 0:
            raise AccountError("creating the account %s failed (useradd rc %s): %s"
                               % (spec["name"], rc, (err or out or "").strip() or "no message"))
    return {"name": spec["name"], "created": True, "changed": True}


def _exists(name):
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


# The account gpunuma creates (numa_binding_create_user) for instances that name none.
DEDICATED = "gpunuma"
DEDICATED_SPEC = {"name": DEDICATED, "comment": "gpunuma inference instances", "shell": "/usr/sbin/nologin",
                  "home": "/var/lib/gpunuma-instances"}


def users_to_read(instances):
    """The accounts a node read asks about: the dedicated one and every instance's ``user``, once each."""
    named = [i.get("user") for i in instances if isinstance(i, dict)] if isinstance(instances, (list, tuple)) else []
    return list(dict.fromkeys([DEDICATED] + [u for u in named if isinstance(u, str)]))


def account_to_create(plan, accounts, start, create_user, groups=()):
    """The dedicated account for ``gpunuma_apply``'s ``account`` option when this run creates it (instances start,
    ``create_user``, an instance runs as it and the node lacks it), else None; it joins the ``groups`` (the GPU device
    nodes' groups, numa_binding_user_groups) the node has."""
    if not (start and create_user) or DEDICATED not in missing_accounts(plan, accounts):
        return None
    present = (accounts or {}).get("groups") or {}
    return dict(DEDICATED_SPEC, groups=[g for g in groups or () if present.get(g)])


def missing_accounts(plan, accounts):
    """The accounts the plan's instances run as that the node lacks, in the plan's order. ``accounts``:
    ``gpunuma_node_info``'s ``accounts`` (``{"users": {name: {"exists": bool}}}``)."""
    users = (accounts or {}).get("users") or {}
    named = [i.get("user") for i in plan.get("instances") or []]
    return [u for u in dict.fromkeys(named) if isinstance(u, str) and not (users.get(u) or {}).get("exists")]


def missing_account_problems(plan, accounts, host, start, create_user):
    """Why the plan's instances cannot start as planned: an account they run as that the node lacks and this run does
    not create (``create_user`` creates the dedicated one). Nothing when no instance starts (``start`` false) or the
    node's accounts were not read (``accounts`` None)."""
    if not start or accounts is None:
        return []
    missing = missing_accounts(plan, accounts)
    if not [u for u in missing if not (create_user and u == DEDICATED)]:
        return []
    names = [i["name"] for i in plan.get("instances") or [] if i.get("user") in missing]
    how = ("or set numa_binding_create_user: true (creates %s)" % DEDICATED if DEDICATED in missing
           else "or leave `user` out to run as the %s account" % DEDICATED)
    return ["%s: no account %s on the node, and instances %s run as it: create it, name an existing account in the "
            "instance's `user`, %s" % (host, ", ".join(missing), ", ".join(names), how)]
