#!/usr/bin/env bash
# Builds the Java example from a fresh clone with nothing but a JDK 17 and Maven:
# protoc and protoc-gen-grpc-java come from Maven Central as artifacts (pinned in
# pom.xml), the stubs are generated from proto/ into target/, the unit tests run, and
# target/sundial-example.jar holds the executor (dev.sundial.example.Main) and the
# receiver (dev.sundial.example.Receiver) with every dependency. Maven's local
# repository is target/m2 at the workspace root (MAVEN_REPO overrides), so a cold
# build downloads into the build tree only. Prints the jar's path last.
set -euo pipefail
cd "$(dirname "$0")"
repo=${MAVEN_REPO:-$(realpath -m ../../target/m2)}
command -v mvn >/dev/null 2>&1 || { echo "build.sh: mvn is missing (apt-get install maven)" >&2; exit 1; }
mvn -q -B -Dmaven.repo.local="$repo" package >&2
realpath target/sundial-example.jar
