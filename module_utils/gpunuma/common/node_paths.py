# Copyright: gpunuma contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where gpunuma keeps its files on a node, by default: the one place each path is spelled.

The modules' argument specs, the readers and the converge record take their defaults from here; the roles'
defaults (``roles/*/defaults/main.yml``) and the modules' documentation say the same paths, which
``tests/unit/test_node_paths.py`` holds them to. The metrics collector (``roles/gpunuma_metrics/files/
gpunuma_metrics.py``) runs on the node with the standard library only: it spells its own, and the same test holds
them equal.
"""

from __future__ import annotations

# The applied plan (gpunuma.plan/v1), written once every instance settled.
PLAN = "/etc/gpunuma/plan.json"
# The node's profile state (gpunuma.state/v1): rollbacks, pins and their history.
STATE = "/etc/gpunuma/state.json"
# The persisted topology inventory (gpunuma.topology/v1).
TOPOLOGY = "/etc/gpunuma/topology.json"
# One 0600 environment file per instance with secret values.
ENV_DIR = "/etc/gpunuma/env"
# Binding profiles when a module runs without the checkout's.
PROFILES_DIR = "/etc/gpunuma/profiles"
# Kubelet presets when a module runs without the checkout's.
KUBELET_PRESETS_DIR = "/etc/gpunuma/kubelet"
# The converge record (gpunuma.converged/v1, 0600).
CONVERGED = "/var/lib/gpunuma/converged.json"
# Units whose file changed and whose restart is still to make (gpunuma_apply).
PENDING_RESTARTS = "/var/lib/gpunuma/pending-restarts.json"
# Units gpunuma_apply stopped for a change (restart mode stop) and has not started again.
STOPPED_FOR_CHANGE = "/var/lib/gpunuma/stopped-for-change.json"
# The last host-to-device probe's report (gpu_validate writes it, the metrics collector reads it).
H2D_PROBE = "/var/lib/gpunuma/h2d-probe.json"
# The last audit's report, as the metrics collector reads it.
AUDIT = "/var/lib/gpunuma/audit.json"
# Copies of the kubelet's config and checkpoints while it changes.
KUBELET_BACKUP_DIR = "/var/lib/gpunuma/kubelet-backup"
# The node lock's lease (on tmpfs: a reboot ends it).
LOCK = "/run/gpunuma/lock"
