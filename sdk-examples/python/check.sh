#!/usr/bin/env bash
# The Python example's own checks, run by scripts/test: ruff (lint), mypy --strict (the
# module, the programs and the tests, against typed stubs from mypy-protobuf) and the
# pytest unit tests. Usage: check.sh PYTHON (a venv set up by setup.sh).
set -euo pipefail
cd "$(dirname "$0")"
python="${1:?usage: check.sh PYTHON}"
"$python" -m ruff check .
"$python" -m mypy --strict sundial_executor.py executor.py receiver.py tests
timeout 300 "$python" -m pytest -q
