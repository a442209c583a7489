#!/usr/bin/env bash
# Create (or refresh) the controller virtualenvs from the pinned requirements:
#   .venv/                 requirements.txt: the newest ansible-core (2.21), the
#                          suite's tools; Python 3.13 or 3.12
#   .venv/cores/2.20/      requirements-core-2.20.txt: the oldest ansible-core
#                          gpunuma supports (meta/runtime.yml), on Python 3.12
#                          where it is installed; the suite runs plan.yml and
#                          site.yml on it (tests/integration/test_controllers.py)
# ansible-core 2.20 and 2.21 need Python 3.12 or later: the first of
# $PYTHON, python3.13, python3.12, python3 (and pyenv's 3.13 and 3.12) that is
# 3.12 or later is used; none is an error that says so.
# Re-running is cheap: nothing is installed while the requirements are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

# The interpreters to try, newest first, for the versions given (e.g. 3.13 3.12).
candidates() {
  local v
  [ -n "${PYTHON:-}" ] && echo "$PYTHON"
  for v in "$@"; do
    echo "python$v"
    if command -v pyenv >/dev/null 2>&1; then
      ls -d "$(pyenv root)/versions/$v".*/bin/python3 2>/dev/null | sort -V -r || true
    fi
  done
  echo python3
}

# The first candidate that runs and is Python 3.12 or later.
find_python() {
  local c
  while read -r c; do
    if command -v "$c" >/dev/null 2>&1 \
      && "$c" -c 'import sys, venv; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
      command -v "$c"
      return 0
    fi
  done < <(candidates "$@")
  echo "gpunuma: no Python 3.12 or later found (ansible-core 2.20 and 2.21 need it); install python3.12 or" \
    "python3.13, or set PYTHON=/path/to/python3.12" >&2
  return 1
}

# make_venv DIR REQUIREMENTS PYTHON-VERSIONS...
make_venv() {
  local dir=$1 req=$2 python want stamp
  shift 2
  stamp=$dir/.requirements.sha256
  want=$(sha256sum "$req" | cut -d' ' -f1)
  if [ -x "$dir/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  python=$(find_python "$@")
  echo "gpunuma: installing $req into $dir ($("$python" --version))" >&2
  rm -rf "$dir"
  "$python" -m venv "$dir"
  # Some pip configurations list local mirrors that may be absent: keep their noise out.
  "$dir/bin/python" -m pip install -q --upgrade pip 2> >(grep -v "^WARNING: Location .* is ignored" >&2) >/dev/null
  "$dir/bin/python" -m pip install -q -r "$req" 2> >(grep -v "^WARNING: Location .* is ignored" >&2)
  echo "$want" > "$stamp"
}

# .venv/cores lives inside .venv: made after it, kept while .venv is.
make_venv .venv requirements.txt 3.13 3.12
make_venv .venv/cores/2.20 requirements-core-2.20.txt 3.12 3.13
