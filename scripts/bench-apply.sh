#!/usr/bin/env bash
# How long `sundial job apply -f DIR` takes for a folder of N job files (YAML), against
# a release server on the embedded store in a temporary directory: the first apply
# (every job created), the second (nothing changes), one file edited, a dry run, and a
# prune of one removed file. Prints one line per step.
#
# Usage: scripts/bench-apply.sh [N]   (default 10000; builds the release binary first)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-10000}
cargo build --quiet --release -p sundial-server
bin=$PWD/target/release/sundial
work=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

python3 - "$n" "$work/jobs" <<'PY'
import os, sys
n, d = int(sys.argv[1]), sys.argv[2]
os.makedirs(d)
for i in range(n):
    with open(f"{d}/job-{i:05d}.yaml", "w") as f:
        f.write(f'id: job-{i:05d}\ncron: "0 {i % 60} {i % 24} * * ?"\n'
                f'time_zone: Europe/Berlin\nexecutor: {{group: g, handler: noop}}\n'
                f'labels: {{owner: git}}\n')
PY
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin" serve --data-dir "$work/data" --listen "127.0.0.1:$port" --http-listen off \
  >"$work/server.out" 2>"$work/server.err" &
pid=$!
for _ in $(seq 1 100); do grep -q SUNDIAL_READY "$work/server.out" && break; sleep 0.1; done
export SUNDIAL_SERVER="http://127.0.0.1:$port"

step() {
  local name=$1; shift
  local start end
  start=$(date +%s.%N)
  "$bin" job apply "$@" >"$work/out"
  end=$(date +%s.%N)
  printf '%-22s %6.2f s   %s\n' "$name" "$(echo "$end - $start" | bc)" "$(tail -1 "$work/out")"
}
echo "job apply of $n files"
step "first (all created)" -f "$work/jobs"
step "again (no change)" -f "$work/jobs"
sed -i 's/^cron: .*/cron: "0 1 2 * * ?"/' "$work/jobs/job-00005.yaml"
step "one file edited" -f "$work/jobs"
sed -i 's/^cron: .*/cron: "0 3 4 * * ?"/' "$work/jobs/job-00005.yaml"
step "dry run of one edit" -f "$work/jobs" --dry-run
sed -i 's/^cron: .*/cron: "0 1 2 * * ?"/' "$work/jobs/job-00005.yaml"
rm "$work/jobs/job-00007.yaml"
step "prune of one removed" -f "$work/jobs" --prune -l owner=git
