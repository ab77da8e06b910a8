#!/usr/bin/env bash
# Builds the Go example from a fresh clone: installs the protoc plugins at pinned
# versions (go install, into GOPATH/bin), generates the stubs from proto/ (go generate),
# vets, runs the package's unit tests, and builds bin/executor and bin/receiver (or
# into the directory given as the first argument). Prints that directory last.
# Needs Go and protoc (Debian: apt-get install protobuf-compiler).
set -euo pipefail
out=$(realpath -m "${1:-$(dirname "$0")/bin}")
cd "$(dirname "$0")"
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
command -v protoc >/dev/null 2>&1 || { echo "build.sh: protoc is missing (apt-get install protobuf-compiler)" >&2; exit 1; }
PATH="$(go env GOPATH)/bin:$PATH"
export PATH
if ! protoc-gen-go --version 2>/dev/null | grep -q "${PROTOC_GEN_GO_VERSION}"; then
  go install "google.golang.org/protobuf/cmd/protoc-gen-go@${PROTOC_GEN_GO_VERSION}"
fi
if ! protoc-gen-go-grpc --version 2>/dev/null | grep -q "${PROTOC_GEN_GO_GRPC_VERSION#v}"; then
  go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@${PROTOC_GEN_GO_GRPC_VERSION}"
fi
go generate ./...
go vet ./...
go test ./... >&2
mkdir -p "$out"
go build -o "$out/" ./cmd/executor ./cmd/receiver
echo "$out"
