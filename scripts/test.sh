#!/usr/bin/env bash
# Run every gpunuma test: unit tests, module and playbook runs on localhost,
# ansible-lint (production profile), and the molecule scenarios (a systemd
# container fleet and a QEMU VM with two real NUMA nodes).
# Installs what it needs first. Extra arguments go to pytest (e.g. -m unit).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh
if [ "$(id -u)" = 0 ]; then
  scripts/setup-host.sh
  # The systemd base image of the container fleet (cached; no registry is reachable).
  scripts/build-base-image.sh
else
  echo "gpunuma: not root; skipping host set-up (Docker, QEMU)" >&2
fi
export PATH="$PWD/.venv/bin:$PATH"
# Keep compiled bytecode: with PYTHONDONTWRITEBYTECODE set, every pytest,
# ansible and ansible-playbook process recompiles the core and the tests.
unset PYTHONDONTWRITEBYTECODE
# Two workers (GPUNUMA_TEST_WORKERS; 0 runs in this process). Each test file
# goes to one worker as a whole, in the order tests/conftest.py gives (the VM
# and container work first), so the molecule scenarios run one after another
# and a file's containers are never driven from both workers at once.
if [ "${GPUNUMA_TEST_WORKERS:-2}" = 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
exec .venv/bin/python -m pytest -n "${GPUNUMA_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
