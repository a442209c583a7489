#!/usr/bin/env bash
# Discover the demo fleet: this machine plus recorded and published topologies
# (inventory/demo.yml). Installs the controller virtualenv first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh
export PATH="$PWD/.venv/bin:$PATH"
exec ansible-playbook -i inventory/demo.yml playbooks/discover.yml "$@"
