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
# Two workers (GPUNUMA_TEST_WORKERS; 0 runs in this process): each test file
# is one group, kept on one worker, so the molecule scenarios run one after
# another (tests/conftest.py).
exec .venv/bin/python -m pytest -n "${GPUNUMA_TEST_WORKERS:-2}" --dist loadgroup "$@"
