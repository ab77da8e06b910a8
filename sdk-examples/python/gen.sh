#!/usr/bin/env bash
# Generates the Python stubs of proto/sundial/v1/*.proto into sdk-examples/python/gen
# (gitignored). Usage: gen.sh [PYTHON]; PYTHON needs grpcio-tools (requirements.txt).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
python="${1:-python3}"
out="$here/gen"
rm -rf "$out"
mkdir -p "$out"
cd "$root"
"$python" -m grpc_tools.protoc -I proto --python_out="$out" --grpc_python_out="$out" proto/sundial/v1/*.proto
