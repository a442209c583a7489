#!/usr/bin/python
# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Write a node's gpunuma files and (re)start its units in one round trip."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpunuma_apply
short_description: Reconcile gpunuma's files and instance units on a node in one step
description:
  - Takes every file the controller rendered (units, drop-ins, limits, sysctl files, the applied plan) and makes
    the node match, in one round trip (module_utils/gpunuma/node/apply/reconcile.py).
  - Every changed file is validated first (O(files[].validate)); one failure stops the module before anything is
    written. Files are written atomically (a temporary file in the same directory, then rename), each replaced file
    kept as a backup (C(<path>.<pid>.<time>~), as Ansible's own modules name them, itself written atomically).
  - With O(prune), files gpunuma wrote (recognised by their marker line) that are no longer wanted are removed;
    their instance units are stopped and disabled first, and units that lose their drop-in are restarted when
    running.
  - With O(units.start), systemd is reloaded once, only units whose file changed are restarted (drop-in targets
    only when running), the instance units are enabled and started, and after O(units.settle_seconds) every unit
    started here must still be active with the same invocation. A unit that is not is rolled back (its previous
    file restored, or removed when new) and the module fails with each failed unit's state and journal.
  - O(after_success) files (the applied plan) are written only when every unit settled.
  - A run that dies half way (host lost, connection dropped) is finished by the next plain run - temporary
    files of its atomic writes (C(.gpunuma-*)) are removed, and the units it changed but never restarted are
    restarted, from the list kept in O(pending_file).
  - A run whose controller goes away (Ctrl-C or a signal such as SIGTERM or SIGHUP, or the connection that would
    read the answer closed) does no work after it. The module asks at each step boundary - before the writes,
    before the first live change, before each later restart batch - and then puts the node back on the files it
    ran before (restarting what it had restarted, recreating what it had pruned) and fails naming why; after the
    last batch settled it finishes. A run lease (O(lock.token)) it held is given back, since that run cannot. Over
    C(docker exec) the engine keeps reading for a dead client, so the module cannot tell and finishes the step.
  - O(state_record) records the profile switch in the node's state file in the same step, written with the
    applied plan, so the units, the plan and the state agree whatever happens to the run.
  - Supports check mode (reports the same changes, with diffs under --diff, and writes nothing).
options:
  files:
    description: The files the node must have.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Absolute path., type: str, required: true}
      content: {description: The whole text of the file., type: str, required: true}
      mode: {description: Octal mode., type: str, default: "0644"}
      owner: {description: Owner (name); left as it is when omitted., type: str}
      group: {description: Group (name); left as it is when omitted., type: str}
      backup: {description: Keep a backup of a replaced file., type: bool, default: true}
      dir_mode: {description: Mode of a parent directory this creates., type: str, default: "0755"}
      validate:
        description: A command (list of words, one of them holding C(%s)) run on a temporary copy named like the
          file; a non-zero exit refuses the whole change.
        type: list
        elements: str
      unit: {description: The systemd unit this file configures (a unit file or one of its drop-ins)., type: str}
      restart:
        description:
          - What a change of this file does to O(files[].unit) - C(changed) restarts it (an instance service of
            O(units.services) even when it was stopped, any other unit only when it runs), C(if-running) restarts
            it only when it runs (a service gpunuma does not own, such as irqbalance), C(never) restarts nothing,
            C(stop) stops it before the first write when it runs and starts it once every file is written and every
            O(absent) path removed (a service that must not run while its files change, such as the kubelet, which
            refuses a checkpoint recorded under another policy).
          - A unit in mode C(stop) that does not stay up O(units.settle_seconds) or answer O(units.readiness) is
            stopped, its files are put back (written ones from their backup, removed ones recreated, its
            O(units.state_files) as they were), and it is started again and checked again; the run fails saying
            whether it is healthy again and quoting its journal. A unit that was not running is not started.
          - systemd is reloaded whenever a unit file or drop-in changes, whatever the mode (a slice's
            C(AllowedCPUs=) applies on the reload).
        type: str
        choices: [changed, if-running, never, stop]
        default: changed
  absent:
    description:
      - Paths that must not exist, each a path or a mapping of C(path), C(unit) and C(restart); that unit (a
        service gpunuma does not own whose drop-in goes, such as irqbalance) is restarted, when it runs, once the
        path is removed (C(restart=if-running), the default), or, with C(restart=stop), stopped before the path
        goes and started after, as O(files[].restart=stop) (a checkpoint the kubelet must not read under a new
        policy).
    type: list
    elements: raw
    default: []
  prune:
    description: Remove instance units and drop-ins gpunuma wrote that are not in O(files).
    type: dict
    suboptions:
      unit_dir: {description: The unit directory., type: str, required: true}
      unit_pattern: {description: Shell pattern of instance unit names., type: str, default: gpunuma-*.service}
      unit_marker: {description: Line that marks a unit gpunuma wrote., type: str, required: true}
      dropin_name: {description: File name of gpunuma's drop-ins., type: str, required: true}
      dropin_marker: {description: Line that marks a drop-in gpunuma wrote., type: str, required: true}
      keep_units: {description: Instance units to keep., type: list, elements: str, default: []}
      keep_dropins: {description: Units whose gpunuma drop-in is kept., type: list, elements: str, default: []}
  units:
    description: What to do with systemd after the files are written.
    type: dict
    suboptions:
      start: {description: Restart changed units and start the instance units., type: bool, default: false}
      services: {description: Instance units to enable and start., type: list, elements: str, default: []}
      daemon_reload: {description: Reload systemd when a unit file or drop-in changed., type: bool, default: true}
      settle_seconds: {description: How long started units must stay up., type: int, default: 5}
      rollback_on_failure: {description: Restore the files of units that failed., type: bool, default: true}
      journal_lines: {description: Journal lines reported per failed unit., type: int, default: 20}
      readiness:
        description:
          - Per unit, when a (re)started unit counts as settled - C(url) (an HTTP 2xx answer) or C(command) (exit 0),
            with C(timeout) and C(interval) in seconds. A unit that does not answer in time fails like one that
            did not stay up (and is rolled back).
        type: dict
        default: {}
      state_files:
        description:
          - Per unit in restart mode C(stop), the absolute paths of the files it writes itself (the kubelet's
            checkpoints), read before it stops and put back as they were (or removed when there were none) when it
            does not come back.
        type: dict
        default: {}
      backup_dir:
        description: Copies of the O(units.state_files) are kept here (mode 0700 when created) while a unit in
          restart mode C(stop) changes; a copy of a file now absent is removed.
        type: path
      restart_batch:
        description: Changed running units restart this many at a time, each batch settled before the next; a
          failed batch stops the rest (their new files are put back).
        type: int
        default: 1
  pending_file:
    description:
      - With O(units.start), the units whose file is about to change are listed here (JSON) before the first
        write and the list is cleared once every unit settled; a later run restarts the units it still lists
        (when running), so a run that died between a write and its restart is finished by the next one.
    type: path
    default: /var/lib/gpunuma/pending-restarts.json
  stopped_file:
    description:
      - The units in restart mode C(stop) this step stopped, listed (JSON) before the stop and cleared once they
        started again; a later run starts the units it still lists (a run that died between the stop and the
        start).
    type: path
    default: /var/lib/gpunuma/stopped-for-change.json
  backups_keep:
    description:
      - After a successful run, only the newest this many backups of each file in O(files) and O(after_success)
        are kept (the rest are listed in C(pruned_backups)); a failed run prunes nothing. C(0) keeps every backup.
    type: int
    default: 5
  after_success:
    description: Files (as O(files), without validate) written only when every unit settled.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Absolute path., type: str, required: true}
      content: {description: The whole text of the file., type: str, required: true}
      mode: {description: Octal mode., type: str, default: "0644"}
      owner: {description: Owner (name); left as it is when omitted., type: str}
      group: {description: Group (name); left as it is when omitted., type: str}
      backup: {description: Keep a backup of a replaced file., type: bool, default: true}
      dir_mode: {description: Mode of a parent directory this creates., type: str, default: "0755"}
      unit: {description: The systemd unit this file configures., type: str}
  secret_files:
    description:
      - Files that hold secrets (an instance's environment file, module_utils/gpunuma/common/secrets.py). Handled
        as O(files), but their content is a no_log argument (never printed, in any verbosity), their diff shows
        C(<secret>) and its size only, and they are written 0600 unless O(secret_files[].mode) says otherwise.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Absolute path., type: str, required: true}
      content: {description: The whole text of the file., type: str, required: true}
      mode: {description: Octal mode., type: str, default: "0600"}
      owner: {description: Owner., type: str}
      group: {description: Group., type: str}
      backup: {description: Keep a backup (same mode) of the file replaced; pruned as O(backups_keep) says., type: bool, default: true}
      dir_mode: {description: Mode of a directory created for it., type: str, default: "0700"}
      unit: {description: The unit that reads the file; restarted (or started) when it changes., type: str}
  secret_absent:
    description: Files holding secrets that must not exist; removed with every backup of them, their diff redacted.
    type: list
    elements: str
    default: []
  account:
    description:
      - The account the units run as, created when it is missing (C(useradd --system --create-home)), under the node
        lock and before any file is validated or written, so a unit naming it verifies and starts in the same step.
        An account that exists is left as it is (its groups, shell and home stay the node owner's). Check mode
        reports what it would create (RV(account)).
    type: dict
    suboptions:
      name: {description: The login name., type: str, required: true}
      comment: {description: The account's comment (GECOS)., type: str}
      home: {description: "Its home directory (an absolute path), created with it.", type: str}
      shell: {description: Its login shell (an absolute path)., type: str}
      groups: {description: "Supplementary groups it joins when created; each must exist.", type: list, elements: str, default: []}
  unchanged_since_read:
    description:
      - The files this run decided from (the applied plan, the node's state), as a mapping of each path to the
        node read's answer for it (C(gpunuma_node_info)'s C(files.<name>), with its base64 C(content), none when
        it was absent or unreadable). Under the node lock, before anything is written, each must
        still read the same; one another run changed meanwhile (a rollback applied while this run waited for the
        lock) fails the step with nothing changed, naming the file, so that a run never applies what it decided
        from a node that is gone. Not checked in check mode.
    type: dict
    default: {}
  state_record:
    description:
      - Record the node's profile switch in its state file (C(gpunuma.state/v1), docs/state-v1.md), under the
        same lock and in the same step as O(after_success), by the rule the C(gpunuma_state) module follows. A
        switch that changes nothing writes nothing; a damaged state file is replaced (its backup kept) with a
        warning.
    type: dict
    suboptions:
      path: {description: The state file., type: path, default: /etc/gpunuma/state.json}
      plan_path:
        description: The applied plan, whose profile starts the history of a node provisioned before state files.
        type: path
        default: /etc/gpunuma/plan.json
      hostname: {description: "The node's inventory name, recorded in the file.", type: str, required: true}
      profile: {description: The profile the node runs after this step., type: str, required: true}
      action:
        description: What moved it (C(site) follows the inventory; the others pin the node).
        type: str
        choices: [profile, down, previous, release, site]
        default: site
      reason: {description: "Why, recorded in the history.", type: str}
      user: {description: "Who, recorded in the history.", type: str}
      history_limit: {description: Switches kept in the history., type: int, default: 50}
  record:
    description:
      - Keep the converge record (docs/architecture.md, "The converge record") in this step, once every unit
        settled and O(after_success) is written, as C(gpunuma_converge) with C(state=recorded) keeps it - the
        provisioning run's record in its apply round trip (site.yml). Nothing in check mode; no record (the old one
        removed) when a unit is not active, a stale unit is left or restarts are pending. RV(converge_record) says
        which.
      - The action (action_plugins/gpunuma_apply.py) fills O(record.state), O(record.inputs), O(record.reads),
        O(record.writes) and O(record.controller) from the run (the host's converge check, the run's journal and
        this step's own writes, O(record.controller_files) and O(controller_copies)); a host whose run is never cut
        short by a record (rollbacks, C(gpunuma_converge_check=false)) gets C(state=absent).
      - The action keeps the digest of the record it asked for on the controller, beside the host's plan copy
        (C(<gpu_topology_controller_dir>/<host>.converged.seal), 0600), or removes it when the node removed its
        record; a step that failed leaves both as they were. The next converge check replays the node's record only
        when it matches.
    type: dict
    suboptions:
      state: {description: C(recorded) keeps the record; C(absent) removes it., type: str, choices: [recorded, absent], default: recorded}
      path: {description: The record., type: path, default: /var/lib/gpunuma/converged.json}
      facts: {description: "The facts a run that ends at the check sets: the applied plan, the profile.", type: dict, default: {}}
      controller_files:
        description: Controller copies whose state the record keeps (the action reads them).
        type: list
        elements: str
        default: []
      release_lock:
        description: Give the run's lease (O(lock.token)) back once the record is kept - the run's last step on the
          node. RV(lock_released) says whether it was.
        type: bool
        default: false
      inputs: {description: The digest of each input of the run (set by the action)., type: dict, default: {}}
      reads: {description: The run's reads of the node (set by the action)., type: list, elements: dict, default: []}
      writes: {description: What the run's writes own (set by the action)., type: list, elements: dict, default: []}
      controller: {description: The controller copies' states (set by the action)., type: dict, default: {}}
  controller_copies:
    description:
      - Files of the controller written by the action once the node applied (the controller's copy of the applied
        plan), atomically, as C(gpunuma_copy) writes them; the module itself ignores them. Check mode writes none
        and reports what would change (shown with C(--diff)).
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Absolute path on the controller., type: str, required: true}
      content: {description: The whole text of the file., type: str, required: true}
      mode: {description: Octal mode., type: str, default: "0644"}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpunuma_attributes.diff
  - gpunuma_lock
author: gpunuma maintainers (@gpunuma)
"""

EXAMPLES = r"""
- name: Install the units and start the instances
  gpunuma.fleet.gpunuma_apply:
    files:
      - path: /etc/systemd/system/gpunuma-llm0.service
        content: "{{ lookup('ansible.builtin.template', 'instance.service.j2') }}"
        owner: root
        group: root
        unit: gpunuma-llm0.service
        validate: [systemd-analyze, verify, "%s"]
    units:
      start: true
      services: [gpunuma-llm0.service]
"""

RETURN = r"""
converge_record:
  description: O(record) - C(recorded) (whether a record was kept), C(reasons) (why not), C(why) (why the run keeps
    none, set by the action).
  returned: when O(record) is given, not in check mode
  type: dict
lock_released:
  description: Whether O(record.release_lock) gave the run's lease back.
  returned: when O(record) is given, not in check mode
  type: bool
controller_copies:
  description: Per O(controller_copies) file - C(path) and C(changed).
  returned: when O(controller_copies) is given
  type: list
account:
  description: The O(account) (name), and whether it was created (C(created), C(changed)); in check mode, would be.
  returned: when O(account) is given
  type: dict
files:
  description: One entry per wanted file (path, changed, created, backup when one was kept).
  returned: always
  type: list
removed:
  description: Paths removed (or that would be, in check mode).
  returned: always
  type: list
restarted:
  description: Units restarted because their file changed (or lost gpunuma's drop-in).
  returned: always
  type: list
restarted_by_systemd:
  description: Services of O(units.services) that systemd restarted by itself (their C(Restart=)) since they were
    last started, with the count (C(NRestarts)); each is also warned about, as it may be crash-looping.
  returned: when units are started
  type: dict
started:
  description: Instance units started because they were not running, and units in restart mode C(stop) started
    again after their change.
  returned: always
  type: list
stopped_for_change:
  description: Units in restart mode C(stop) stopped before their files changed (in check mode, would be).
  returned: when a unit in restart mode C(stop) was running and its files change
  type: list
  elements: str
not_started:
  description: Units in restart mode C(stop) whose files changed while they were not running; left stopped.
  returned: always
  type: list
  elements: str
back_healthy:
  description: After a unit in restart mode C(stop) did not come back, whether it is healthy again on its previous
    files.
  returned: when a unit in restart mode C(stop) did not come back
  type: bool
failed_units:
  description: Units that did not stay up after the change.
  returned: always
  type: list
rolled_back:
  description: Units whose files were restored (or removed when new) after they failed.
  returned: always
  type: list
  elements: str
pruned_backups:
  description: Backups removed after a successful run, beyond O(backups_keep) per file (oldest first).
  returned: always
  type: list
  elements: str
state_record:
  description: What O(state_record) made of the state file - C(changed), the new C(state) and C(corrupt) (why
    the file it replaced was unreadable, or null).
  returned: when O(state_record) is given
  type: dict
controller_gone:
  description: Why the module decided its controller had gone away (it then put the node back and failed).
  returned: when the controller went away during a restart
  type: str
"""

import errno
import os
import signal
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpunuma.common import commands
from ansible.module_utils.gpunuma.common import node_paths
from ansible.module_utils.gpunuma.node.apply.reconcile import Apply
from ansible.module_utils.gpunuma.node.apply.files import ApplyError, normalise_files, quiet_state_diff
from ansible.module_utils.gpunuma.node.apply.fs import NodeFiles
from ansible.module_utils.gpunuma.node.probe import read_file
from ansible.module_utils.gpunuma.node import lock as locklib
from ansible.module_utils.gpunuma.plan import state as statelib
from ansible.module_utils.gpunuma.run.converge_node import RECORD_OPTIONS, recorded


class Controller:
    """Whether the run that started this step still waits for its answer.

    Ctrl-C on the controller reaches a module run by the local connection (ansible-pull) as SIGINT, a stopped
    worker's process group as SIGTERM, a closed terminal as SIGHUP: each is noted, not obeyed at once, so the step
    in progress ends at a boundary (apply.py). Over SSH the session's pipe closes with the controller: a newline
    written to stdout (the controller skips blank lines before the JSON answer) fails with EPIPE. Over
    ``docker exec`` the engine keeps reading for a dead client, so nothing tells.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, out_fd=1):
        self.signal = None
        self.out_fd = out_fd
        for signum in self.SIGNALS:
            signal.signal(signum, self._note)

    def _note(self, signum, frame):
        self.signal = self.signal or signum

    def gone(self):
        if self.signal:
            return "signal %s" % signal.Signals(self.signal).name
        try:
            os.write(self.out_fd, b"\n")
        except OSError as exc:
            return "its connection closed (%s)" % (errno.errorcode.get(exc.errno) or exc)
        return None


def _state_entry(module, spec, result):
    """The state file as ``spec`` (O(state_record)) records the switch: an O(after_success) entry, or None."""
    text = statelib.read_text(spec["path"])
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        new, changed, corrupt = statelib.next_state(
            text, spec["path"], statelib.applied_profile(spec["plan_path"]), spec["hostname"], spec["profile"],
            spec["action"], spec["reason"], spec["user"], now, spec["history_limit"])
    except statelib.StateError as exc:
        module.fail_json(msg="state_record: %s" % exc, changed=False)
    result["state_record"] = {"changed": changed, "state": new, "corrupt": corrupt, "backup": None}
    if not changed:
        return None
    return {"path": spec["path"], "content": statelib.dump_state(new), "mode": "0644", "owner": None,
            "group": None, "backup": True, "dir_mode": "0755", "unit": None}


def _keep_corrupt_state(module, spec, result):
    """A damaged state file that a recorded switch replaced is kept as ``<path>.corrupt-<time>`` (as the
    gpunuma_state step keeps it), out of the backups that are pruned."""
    record = result.get("state_record") or {}
    if not spec or not record.get("corrupt") or module.check_mode:
        return
    for entry in result["files"]:
        if entry["path"] == spec["path"] and entry.get("backup"):
            kept = statelib.corrupt_backup_path(spec["path"], time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            os.rename(entry["backup"], kept)
            entry["backup"] = record["backup"] = kept
            module.warn("%s is corrupt (%s); kept as %s, a new history starts" % (spec["path"], record["corrupt"],
                                                                                  kept))


def _controller_gone(module, controller, msg):
    """A run whose controller went away: say so in the node's log, and give its lease back (it cannot)."""
    if not controller.signal and "the controller went away" not in msg:
        return
    module.log("gpunuma_apply: %s" % msg)
    lock = module.params.get("lock") or {}
    if lock.get("token") and not module.check_mode:
        locklib.release_quietly(lock.get("path"), lock["token"])


FILE_OPTIONS = dict(
    path=dict(type="str", required=True),
    content=dict(type="str", required=True),
    mode=dict(type="str", default="0644"),
    owner=dict(type="str"),
    group=dict(type="str"),
    backup=dict(type="bool", default=True),
    dir_mode=dict(type="str", default="0755"),
    validate=dict(type="list", elements="str"),
    unit=dict(type="str"),
    restart=dict(type="str", choices=["changed", "if-running", "never", "stop"], default="changed"),
)


ARGUMENT_SPEC = dict(
    files=dict(type="list", elements="dict", default=[], options=FILE_OPTIONS),
    absent=dict(type="list", elements="raw", default=[]),
    prune=dict(type="dict", options=dict(
        unit_dir=dict(type="str", required=True),
        unit_pattern=dict(type="str", default="gpunuma-*.service"),
        unit_marker=dict(type="str", required=True),
        dropin_name=dict(type="str", required=True),
        dropin_marker=dict(type="str", required=True),
        keep_units=dict(type="list", elements="str", default=[]),
        keep_dropins=dict(type="list", elements="str", default=[]),
    )),
    units=dict(type="dict", options=dict(
        start=dict(type="bool", default=False),
        services=dict(type="list", elements="str", default=[]),
        daemon_reload=dict(type="bool", default=True),
        settle_seconds=dict(type="int", default=5),
        rollback_on_failure=dict(type="bool", default=True),
        journal_lines=dict(type="int", default=20),
        restart_batch=dict(type="int", default=1),
        readiness=dict(type="dict", default={}),
        state_files=dict(type="dict", default={}),
        backup_dir=dict(type="path"),
    )),
    stopped_file=dict(type="path", default=node_paths.STOPPED_FOR_CHANGE),
    pending_file=dict(type="path", default=node_paths.PENDING_RESTARTS),
    backups_keep=dict(type="int", default=5),
    unchanged_since_read=dict(type="dict", default={}),
    # A file of files, but its content never printed, and private by default.
    # Only each entry's content is secret (no_log there); paths, owners and modes are not.
    secret_files=dict(type="list", elements="dict", default=[], no_log=False, options=dict(
        {k: v for k, v in FILE_OPTIONS.items() if k not in ("validate", "restart")},
        content=dict(type="str", required=True, no_log=True),
        mode=dict(type="str", default="0600"),
        dir_mode=dict(type="str", default="0700"))),
    # Paths of secret files to remove, not secrets.
    secret_absent=dict(type="list", elements="str", default=[], no_log=False),
    lock=dict(type="dict", default={}, options=locklib.module_options()),
    account=dict(type="dict", options=dict(
        name=dict(type="str", required=True),
        comment=dict(type="str"),
        home=dict(type="str"),
        shell=dict(type="str"),
        groups=dict(type="list", elements="str", default=[]),
    )),
    after_success=dict(type="list", elements="dict", default=[], options=dict(
        (k, v) for k, v in FILE_OPTIONS.items() if k not in ("validate", "restart"))),
    record=dict(type="dict", options=dict(
        RECORD_OPTIONS,
        controller_files=dict(type="list", elements="str", default=[]),
        release_lock=dict(type="bool", default=False),
    )),
    controller_copies=dict(type="list", elements="dict", default=[], options=dict(
        path=dict(type="str", required=True),
        content=dict(type="str", required=True),
        mode=dict(type="str", default="0644"),
    )),
    state_record=dict(type="dict", options=dict(
        path=dict(type="path", default=statelib.DEFAULT_PATH),
        plan_path=dict(type="path", default=node_paths.PLAN),
        hostname=dict(type="str", required=True),
        profile=dict(type="str", required=True),
        action=dict(type="str", choices=list(statelib.ACTIONS), default="site"),
        reason=dict(type="str"),
        user=dict(type="str"),
        history_limit=dict(type="int", default=statelib.DEFAULT_HISTORY_LIMIT),
    )),
)


def _release_after_record(module, result):
    """O(record.release_lock): the run's lease given back once its record is kept (the flock is free again)."""
    spec, lock = module.params["record"] or {}, module.params.get("lock") or {}
    if "converge_record" not in result:
        return
    result["lock_released"] = False
    if spec.get("release_lock") and lock.get("token"):
        result["lock_released"] = locklib.release_quietly(lock.get("path"), lock["token"])


def _refuse_what_changed_since_read(module, as_read):
    """Fail, with nothing changed, when a file this run decided from no longer reads as it did (under the lock)."""
    for path in sorted(as_read or {}):
        read = as_read[path] if isinstance(as_read[path], dict) else {}
        if read_file(path).get("content") != read.get("content"):
            module.fail_json(changed=False, msg=(
                "%s changed since this run read it: another gpunuma run (a rollback, another controller) applied "
                "while this one waited for the node lock. Nothing was changed by this run; run it again to decide "
                "from the node as it is now." % path))


def _module_class():
    """AnsibleModule, logging ``secret_files`` by path alone.

    A module logs its arguments to the node's journal ("Invoked with ..."), masking no_log values inside the
    printed argument list; a multi-line secret file is printed there with its line breaks escaped, which the
    masking does not find. So the entries are logged without their content, whatever it holds."""

    class ApplyModule(AnsibleModule):
        def _log_invocation(self):
            entries = self.params.get("secret_files")
            if not entries:
                return super()._log_invocation()
            self.params["secret_files"] = [{"path": e.get("path"), "content": "<secret>"} for e in entries]
            try:
                return super()._log_invocation()
            finally:
                self.params["secret_files"] = entries

    return ApplyModule


def main():
    module = _module_class()(
        argument_spec=ARGUMENT_SPEC,
        supports_check_mode=True,
    )
    params = module.params
    for field in ("secret_absent",):  # absent: normalise_absent checks each entry
        for index, path in enumerate(params[field]):
            if not os.path.isabs(path):
                module.fail_json(msg="%s[%d] must be an absolute path, got %r" % (field, index, path))

    runner = commands.runner(module)
    controller = Controller()
    apply = Apply(NodeFiles(runner), runner, time.sleep, check_mode=module.check_mode, alive=controller.gone)
    try:
        files = normalise_files(params["files"]) + normalise_files(
            [dict(entry, secret=True) for entry in params["secret_files"]], "secret_files")
        with locklib.for_module(module):
            if not module.check_mode:
                _refuse_what_changed_since_read(module, params["unchanged_since_read"])
            after = list(params["after_success"])
            if params["state_record"]:
                # Read under the lock: a switch another run recorded a moment ago is in the history.
                entry = _state_entry(module, params["state_record"], apply.result)
                after += [entry] if entry else []
            result = apply.run(files, absent=params["absent"], prune=params["prune"], units=params["units"],
                               after_success=after, pending_path=params["pending_file"],
                               backups_keep=params["backups_keep"], secret_absent=params["secret_absent"],
                               account=params["account"], stopped_path=params["stopped_file"])
            if params["record"] and not result.get("failed") and not module.check_mode:
                # Still under the lock: the node read for the record is the node this step left.
                result["converge_record"] = recorded(module, params["record"])
    except locklib.LockError as exc:
        module.fail_json(msg=str(exc), changed=False)
    except ApplyError as exc:
        _controller_gone(module, controller, str(exc))
        module.fail_json(msg=str(exc), **apply.result)
    except (OSError, KeyError) as exc:
        module.fail_json(msg="gpunuma_apply: %s" % exc, **apply.result)
    for unit, count in sorted((result.get("restarted_by_systemd") or {}).items()):
        module.warn("%s: systemd restarted it %d time%s since it was last started (its Restart= setting): it may be "
                    "crash-looping; see journalctl -u %s" % (unit, count, "" if count == 1 else "s", unit))
    if result.get("failed"):
        _controller_gone(module, controller, result.get("msg", ""))
    else:
        _keep_corrupt_state(module, params["state_record"], result)
        _release_after_record(module, result)
    if not module._diff:
        result.pop("diff", None)
    elif module._verbosity < 1:
        result["diff"] = [quiet_state_diff(d) for d in result.get("diff") or []]
    if result.get("failed"):
        msg = result.pop("msg")
        result.pop("failed")
        module.fail_json(msg=msg, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
