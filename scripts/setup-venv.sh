#!/usr/bin/env bash
# Create (or refresh) the controller virtualenv in .venv from requirements.txt.
# Re-running is cheap: nothing is installed while requirements.txt is unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
stamp=.venv/.requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "gpunuma: installing controller packages into .venv" >&2
"$PYTHON" -m venv .venv
# Some pip configurations list local mirrors that may be absent: keep their noise out.
quiet_pip() { .venv/bin/python -m pip "$@" 2> >(grep -v "^WARNING: Location .* is ignored" >&2); }
quiet_pip install -q --upgrade pip >/dev/null
quiet_pip install -q -r requirements.txt
echo "$want" > "$stamp"
