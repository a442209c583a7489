#!/usr/bin/env bash
# Run `ansible-test sanity` on the gpunuma.fleet collection (docs/collection.md).
#
# Builds the collection into build/ (scripts/build-collection.py), then runs
# every sanity test of the .venv's ansible-test on it with the controller's
# Python. ansible-test makes one virtualenv per test under
# ~/.ansible/test/venv and installs its own pinned requirements there from
# PyPI; only its pip bootstrap script (get-pip.py, fetched from
# ci-files.testing.ansible.com, which a machine without that host cannot reach)
# is replaced: ~/.ansible/test/cache/get_pip_<version>.py installs the same pip
# release from its PyPI wheel (pinned below by version and sha256).
#
# Every supported ansible-core: the .venv's (2.21) by default, --core 2.20 for
# .venv/cores/2.20 (scripts/setup-venv.sh builds both), each with its own
# ansible-test and Python.
#
# Usage: scripts/sanity.sh [--core 2.20|2.21] [ansible-test sanity arguments, e.g. --test pylint]
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
VENV=$REPO/.venv
CORE=2.21
if [ "${1:-}" = --core ]; then
  case "${2:-}" in
    2.21) ;;
    2.20) VENV=$REPO/.venv/cores/2.20; CORE=2.20 ;;
    *) echo "gpunuma: --core '${2:-}': allowed: 2.20, 2.21" >&2; exit 2 ;;
  esac
  shift 2
fi
PIP_VERSION=25.2
PIP_WHEEL_SHA256=6d67a2b4e7f14d8b31b8b52648866fa717f45a1eb70e83002f4331d07e953717
CACHE_DIR="${GPUNUMA_CACHE_DIR:-/var/cache/gpunuma}/ansible-test"
[ -w "$(dirname "$CACHE_DIR")" ] || CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/gpunuma/ansible-test"
wheel="$CACHE_DIR/pip-$PIP_VERSION-py3-none-any.whl"
bootstrap="$HOME/.ansible/test/cache/get_pip_${PIP_VERSION//./_}.py"

scripts/setup-venv.sh
mkdir -p "$CACHE_DIR" "$(dirname "$bootstrap")"
if ! echo "$PIP_WHEEL_SHA256  $wheel" | sha256sum -c --status 2>/dev/null; then
  .venv/bin/python -m pip download -q --no-deps --disable-pip-version-check "pip==$PIP_VERSION" -d "$CACHE_DIR"
  echo "$PIP_WHEEL_SHA256  $wheel" | sha256sum -c --status \
    || { echo "gpunuma: $wheel does not match its pinned sha256" >&2; exit 1; }
fi
# Each run writes its own copy, then renames it: two cores checked at once never share a half-written file.
bootstrap_tmp=$(mktemp "$bootstrap.XXXXXX")
cat > "$bootstrap_tmp" <<EOF
# Written by gpunuma's scripts/sanity.sh: stands in for get-pip.py $PIP_VERSION.
# Installs the packages ansible-test asks for (pip==$PIP_VERSION among them)
# with the pip of the PyPI wheel $wheel.
import sys
sys.path.insert(0, "$wheel")
from pip._internal.cli.main import main
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(main(["install", "--quiet"] + args))
EOF
chmod 0644 "$bootstrap_tmp"
mv -f "$bootstrap_tmp" "$bootstrap"

# Outside the checkout: inside it, ansible-test would list the collection's
# files with git, which ignores build/. One tree per core: the suite checks
# both cores at once, and a rebuild must not pull files from under the other.
out="${TMPDIR:-/tmp}/gpunuma-sanity-$CORE"
collection=$(.venv/bin/python scripts/build-collection.py --out "$out" | tail -1)
cd "$collection"
exec env PATH="$VENV/bin:$PATH" "$VENV/bin/ansible-test" sanity --local --python "$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
  --color no "$@"
