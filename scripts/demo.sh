#!/usr/bin/env bash
# The demo fleet (inventory/demo.yml): this machine plus recorded and
# published GPU servers. Discovers each one, prints the fleet topology table,
# then plans every instance's binding and prints the plan table. Nothing is
# installed or started on any host; state goes under .demo/.
# Installs the controller virtualenv first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh
export PATH="$PWD/.venv/bin:$PATH"
exec ansible-playbook -i inventory/demo.yml playbooks/plan.yml "$@"
