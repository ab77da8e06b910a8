#!/usr/bin/env bash
# Creates (or reuses) a venv with requirements.txt installed and generates the stubs.
# Usage: setup.sh VENV_DIR. Idempotent: pip runs only when requirements.txt changed
# since the venv was last set up. Prints the venv's python path last.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${1:?usage: setup.sh VENV_DIR}"
mkdir -p "$venv"
venv="$(cd "$venv" && pwd)"
stamp="$venv/.sundial-requirements"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if ! cmp -s "$here/requirements.txt" "$stamp"; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt" >&2
  cp "$here/requirements.txt" "$stamp"
fi
"$here/gen.sh" "$venv/bin/python"
echo "$venv/bin/python"
