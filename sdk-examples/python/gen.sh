#!/usr/bin/env bash
# Generates the Python stubs of proto/sundial/v1/*.proto into sdk-examples/python/gen
# (gitignored), with typed .pyi stubs from mypy-protobuf for `mypy --strict`.
# Usage: gen.sh [PYTHON]; PYTHON's environment needs grpcio-tools and mypy-protobuf
# (requirements.txt).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
python="${1:-python3}"
bin="$(dirname "$python")"
out="$here/gen"
rm -rf "$out"
mkdir -p "$out"
cd "$root"
"$python" -m grpc_tools.protoc -I proto --python_out="$out" --grpc_python_out="$out" \
  --plugin=protoc-gen-mypy="$bin/protoc-gen-mypy" --mypy_out="$out" \
  --plugin=protoc-gen-mypy_grpc="$bin/protoc-gen-mypy_grpc" --mypy_grpc_out="$out" \
  proto/sundial/v1/*.proto
touch "$out/sundial/__init__.py" "$out/sundial/v1/__init__.py"
