#!/usr/bin/env bash
# Runs the README's walk through ("A walk through with grpcurl", its HTTP commands and
# the closing pause/delete block) verbatim, ports aside, against a live server on the
# embedded store with the Rust example executor attached, and checks every answer; then
# the command of "Metrics and alerts" and the block of "Authentication" (against a
# second server that requires a bearer token and an app secret).
#
# The commands are read from README.md's ```sh blocks under that heading, in order
# (a `\` at a line's end, or a quote left open, joins the next line; `#` lines are
# comments), so the README
# shows exactly what this runs. Every command must have a check below: a command
# added to the README without one fails the run. Needs grpcurl, curl and python3, and
# the workspace built (`cargo build --workspace`; scripts/test does that).
#
# Usage: scripts/walkthrough.sh   (prints one line per command and the time taken)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
started=$(date +%s)

for tool in grpcurl curl python3 cargo; do
  command -v "$tool" >/dev/null 2>&1 || { echo "walkthrough: $tool is missing" >&2; exit 1; }
done

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The example executor, built before the clock of the walk through starts (the README
# runs it with `cargo run`, which then only starts it).
export CARGO_TARGET_DIR="$root/target/example"
cargo build --quiet --manifest-path sdk-examples/rust/Cargo.toml

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
grpc=$(free_port)
http=$(free_port)
"$root/target/debug/sundial" serve --listen "127.0.0.1:$grpc" --http-listen "127.0.0.1:$http" \
  --data-dir "$work/data" >"$work/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  curl -sf "localhost:$http/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sf "localhost:$http/healthz" >/dev/null || { cat "$work/server.log" >&2; echo "walkthrough: the server did not start" >&2; exit 1; }

# The README's commands, one per line, ports replaced.
python3 - "$grpc" "$http" >"$work/commands" <<'PY'
import re, shlex, sys
grpc, http = sys.argv[1], sys.argv[2]

def complete(c):
    try:
        shlex.split(c)
        return True
    except ValueError:  # an open quote: the command goes on on the next line
        return False

text = open("README.md").read()
start = text.index("### A walk through with grpcurl")
end = text.index("\n### ", start + 1)
section = text[start:end]
commands = []
for block in re.findall(r"```sh\n(.*?)```", section, re.S):
    joined = ""
    for line in block.splitlines():
        if not joined and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            joined += line[:-1] + " "
            continue
        if not complete(joined + line):
            joined += line + " "
            continue
        commands.append(joined + line)
        joined = ""
for c in commands:
    c = c.replace("localhost:50051", f"localhost:{grpc}").replace("127.0.0.1:50051", f"127.0.0.1:{grpc}")
    c = c.replace("localhost:8080", f"localhost:{http}")
    print(c)
PY

log="$work/server.log"
fail() { echo "walkthrough: FAILED at: $1" >&2; echo "answer: $(cat "$work/out" 2>/dev/null)" >&2; tail -20 "$log" >&2; exit 1; }
# Runs a command line as written.
run() { bash -c "$1" >"$work/out" 2>&1; }
# Runs a curl command line with the HTTP status appended to its answer.
with_status() { run "${1/curl -s/curl -s -w %\{http_code\}}"; }
# Re-runs a command line until its answer matches a pattern (up to 30 s).
until_matches() {
  for _ in $(seq 1 60); do
    if run "$1" && grep -Eq "$2" "$work/out"; then return 0; fi
    sleep 0.5
  done
  return 1
}
nodes="grpcurl -plaintext localhost:$grpc sundial.v1.NodeService/ListNodes"

n=0
while IFS= read -r cmd; do
  n=$((n + 1))
  echo "walkthrough [$n] $cmd"
  case "$cmd" in
  *" list")
    run "$cmd" || fail "$cmd"
    grep -q "sundial.v1.JobService" "$work/out" && grep -q "sundial.v1.ExecutorService" "$work/out" || fail "$cmd"
    ;;
  *JobService/CreateJob)
    run "$cmd" || fail "$cmd"
    grep -q '"id": "hello"' "$work/out" || fail "$cmd"
    ;;
  *JobService/ApplyJobs)
    run "$cmd" || fail "$cmd"
    grep -q 'APPLY_OUTCOME_CREATED' "$work/out" || fail "$cmd"
    # Applying the same list again writes nothing.
    run "$cmd" && grep -q 'APPLY_OUTCOME_UNCHANGED' "$work/out" || fail "$cmd (again)"
    ;;
  "cargo run --manifest-path sdk-examples/rust/Cargo.toml"*)
    bash -c "exec $cmd" >"$work/executor.log" 2>&1 &
    pids+=($!)
    until_matches "$nodes" '"nodeId": "demo-1"' || fail "$cmd (the executor never registered)"
    ;;
  *RunService/ListRuns)
    # Runs turn SUCCEEDED with output "hello, world" (base64 in JSON).
    until_matches "$cmd" '"output": "aGVsbG8sIHdvcmxk"' || fail "$cmd"
    grep -q 'RUN_STATE_SUCCEEDED' "$work/out" || fail "$cmd"
    ;;
  *RunService/GetJobStatus)
    run "$cmd" || fail "$cmd"
    grep -q '"nextFireTimesMs"' "$work/out" && grep -q '"latestRun"' "$work/out" || fail "$cmd"
    ;;
  *JobService/TriggerJob)
    run "$cmd" || fail "$cmd"
    grep -q '"scheduleId": "hello@manual-deploy-42"' "$work/out" || fail "$cmd"
    # Once per idempotency key: the same call again queues nothing new.
    run "$cmd" && grep -q '"duplicate": true' "$work/out" || fail "$cmd (again)"
    grep -q '"scheduleId": "hello@manual-deploy-42"' "$work/out" || fail "$cmd (again)"
    ;;
  *NodeService/ListNodes)
    run "$cmd" || fail "$cmd"
    grep -q '"nodeId": "demo-1"' "$work/out" && grep -q 'NODE_HEALTH_HEALTHY' "$work/out" || fail "$cmd"
    ;;
  *NodeService/DrainNode)
    run "$cmd" || fail "$cmd"
    until_matches "$nodes" 'NODE_HEALTH_DRAINING' || fail "$cmd (the node never showed DRAINING)"
    ;;
  "curl -s -X POST localhost:$http/api/v1/jobs -H"*)
    run "$cmd" || fail "$cmd"
    grep -q '"id":"report"' "$work/out" && grep -q '"version":"1"' "$work/out" || fail "$cmd"
    ;;
  "curl -s localhost:$http/api/v1/jobs/report")
    run "$cmd" || fail "$cmd"
    grep -q '"labels":{"team":"data"}' "$work/out" || fail "$cmd"
    ;;
  "curl -s 'localhost:$http/api/v1/jobs?label_selector=team=data&page_size=10'")
    run "$cmd" || fail "$cmd"
    grep -q '"id":"report"' "$work/out" && ! grep -q '"id":"hello"' "$work/out" || fail "$cmd"
    ;;
  "curl -s -X PUT localhost:$http/api/v1/jobs/report"*)
    run "$cmd" || fail "$cmd"
    grep -q '"cron":"0 30 6 \* \* \*"' "$work/out" && grep -q '"version":"2"' "$work/out" || fail "$cmd"
    # The same version again is stale: 409 ABORTED, nothing changed.
    with_status "$cmd" && grep -q '"code":"ABORTED".*}409$' "$work/out" \
      || fail "$cmd (a stale version)"
    ;;
  "curl -s -X POST localhost:$http/api/v1/jobs/report/pause")
    run "$cmd" || fail "$cmd"
    grep -q '"state":"JOB_STATE_PAUSED"' "$work/out" || fail "$cmd"
    ;;
  "curl -s -X POST localhost:$http/api/v1/jobs/report/resume")
    run "$cmd" || fail "$cmd"
    grep -q '"state":"JOB_STATE_ACTIVE"' "$work/out" || fail "$cmd"
    ;;
  "curl -s 'localhost:$http/api/v1/jobs/hello/runs?state=succeeded&page_size=5'")
    run "$cmd" || fail "$cmd"
    grep -q '"state":"RUN_STATE_SUCCEEDED"' "$work/out" && ! grep -q 'RUN_STATE_FAILED' "$work/out" || fail "$cmd"
    ;;
  "curl -s localhost:$http/api/v1/jobs/hello/status")
    run "$cmd" || fail "$cmd"
    grep -q '"jobId":"hello"' "$work/out" && grep -q '"nextFireTimesMs"' "$work/out" || fail "$cmd"
    ;;
  "curl -s localhost:$http/api/v1/runs/hello@manual-deploy-42")
    until_matches "$cmd" '"state":"RUN_STATE_SUCCEEDED"' || fail "$cmd"
    ;;
  "curl -s 'localhost:$http/api/v1/runs/hello@manual-deploy-42/logs?page_size=100'")
    run "$cmd" || fail "$cmd"
    grep -q '"message":"greeting world for hello@manual-deploy-42 (attempt 1)"' "$work/out" || fail "$cmd"
    ;;
  "curl -sN 'localhost:$http/api/v1/runs/hello@manual-deploy-42/logs/stream?follow=true'")
    # The run is final: the stream gives its lines and ends (bounded, in case it would not).
    run "timeout 10 $cmd" || fail "$cmd (did not end)"
    grep -q '^{.*"message":"greeting world for hello@manual-deploy-42 (attempt 1)".*}$' "$work/out" || fail "$cmd"
    ;;
  "curl -s -X POST localhost:$http/api/v1/jobs/hello/trigger"*)
    run "$cmd" || fail "$cmd"
    grep -q '"scheduleId":"hello@manual-deploy-43"' "$work/out" || fail "$cmd"
    run "$cmd" && grep -q '"duplicate":true' "$work/out" || fail "$cmd (again)"
    ;;
  "curl -s -X POST localhost:$http/api/v1/runs/hello@manual-deploy-43/cancel"*)
    run "$cmd" || fail "$cmd"
    grep -q '"state":"RUN_STATE_CANCELLED"' "$work/out" || fail "$cmd"
    with_status "$cmd" && grep -q '"code":"FAILED_PRECONDITION".*}409$' "$work/out" \
      || fail "$cmd (again: the run is final)"
    ;;
  "curl -s localhost:$http/api/v1/tasks/hello")
    run "$cmd" || fail "$cmd"
    grep -q '"job_id":"hello"' "$work/out" && grep -q '"next_fire_times_ms"' "$work/out" || fail "$cmd"
    ;;
  "curl -s localhost:$http/api/v1/nodes")
    run "$cmd" || fail "$cmd"
    grep -q '"nodeId":"demo-1"' "$work/out" || fail "$cmd"
    ;;
  "curl -s -X POST localhost:$http/api/v1/nodes/demo-1/drain"*)
    run "$cmd" || fail "$cmd"
    grep -q '"health":"NODE_HEALTH_DRAINING"' "$work/out" || fail "$cmd"
    ;;
  "curl -s -X POST localhost:$http/api/v1/apps -H"*)
    run "$cmd" || fail "$cmd"
    grep -q '"appId":"billing"' "$work/out" && grep -q '"secret":"whsec_' "$work/out" || fail "$cmd"
    ;;
  "curl -s localhost:$http/api/v1/apps/billing")
    run "$cmd" || fail "$cmd"
    grep -q '"appId":"billing"' "$work/out" && ! grep -q 'whsec_' "$work/out" || fail "$cmd"
    ;;
  "curl -s -X POST localhost:$http/api/v1/apps/billing/rotate"*)
    run "$cmd" || fail "$cmd"
    grep -q '"activeSecrets":2' "$work/out" && grep -q '"secret":"whsec_' "$work/out" || fail "$cmd"
    ;;
  "curl -s -X DELETE localhost:$http/api/v1/jobs/report")
    run "$cmd" || fail "$cmd"
    [ "$(cat "$work/out")" = "{}" ] || fail "$cmd"
    with_status "curl -s localhost:$http/api/v1/jobs/report" && grep -q '"code":"NOT_FOUND".*}404$' "$work/out" \
      || fail "$cmd (the job is still there)"
    ;;
  *JobService/PauseJob)
    run "$cmd" || fail "$cmd"
    grep -q '"paused": true' "$work/out" || fail "$cmd"
    ;;
  *JobService/DeleteJob)
    run "$cmd" || fail "$cmd"
    run "grpcurl -plaintext -d '{\"job_id\": \"hello\"}' localhost:$grpc sundial.v1.JobService/GetJob" \
      && fail "$cmd (the job is still there)"
    grep -q 'NotFound' "$work/out" || fail "$cmd (GetJob did not answer NotFound)"
    ;;
  *)
    fail "no check for this README command; add one to scripts/walkthrough.sh: $cmd"
    ;;
  esac
done <"$work/commands"

[ "$n" -ge 14 ] || fail "only $n commands found in README.md's walk through"

# "Metrics and alerts": the one command it names, on the server of the walk through.
metrics=$(python3 - "$http" <<'PY'
import re, sys
text = open("README.md").read()
start = text.index("### Metrics and alerts")
section = text[start:text.index("\n### ", start + 1)]
found = re.findall(r"`(curl [^`]*/metrics)`", section)
assert len(found) == 1, f"expected one metrics command, found {found}"
print(found[0].replace("localhost:8080", f"localhost:{sys.argv[1]}"))
PY
)
n=$((n + 1))
echo "walkthrough [$n] $metrics"
run "$metrics" || fail "$metrics"
grep -Eq '^sundial_runs_finished_total\{state="SUCCEEDED"\} [1-9]' "$work/out" \
  && grep -q '^sundial_executors_connected' "$work/out" || fail "$metrics"

# "Authentication": its sh block run as one script (its lines share variables) against
# a second server that requires credentials, with SECRET and TOKEN set to the server's.
secret="whsec_$(python3 -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())')"
token="walkthrough-$(python3 -c 'import secrets; print(secrets.token_hex(8))')"
agrpc=$(free_port)
ahttp=$(free_port)
SUNDIAL_BEARER_TOKENS="$token" SUNDIAL_APP_SECRETS="billing=$secret" \
  "$root/target/debug/sundial" serve --listen "127.0.0.1:$agrpc" --http-listen "127.0.0.1:$ahttp" \
  --data-dir "$work/auth-data" >"$work/auth-server.log" 2>&1 &
pids+=($!)
log="$work/auth-server.log"
for _ in $(seq 1 100); do
  curl -sf "localhost:$ahttp/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
python3 - "$agrpc" "$ahttp" "$secret" >"$work/auth.sh" <<'PY'
import re, sys
grpc, http, secret = sys.argv[1:]
text = open("README.md").read()
start = text.index("### Authentication")
section = text[start:text.index("\n### ", start + 1)]
blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
assert len(blocks) == 1, f"expected one sh block under Authentication, found {len(blocks)}"
block = blocks[0]
assert "SECRET=whsec_..." in block, "the block no longer sets SECRET=whsec_..."
block = block.replace("SECRET=whsec_...", f"SECRET={secret}")
block = block.replace("localhost:50051", f"localhost:{grpc}").replace("localhost:8080", f"localhost:{http}")
print("set -e")
print(block)
PY
n=$((n + 1))
echo "walkthrough [$n] README.md's Authentication block (signed curl, bearer grpcurl, signed grpcurl)"
# Without credentials a call is refused, REST with the JSON error the README shows.
run "curl -s -o /dev/stderr -w '%{http_code}' localhost:$ahttp/api/v1/tasks/hello"
grep -q '^401' "$work/out" && grep -q '"code":"UNAUTHENTICATED"' "$work/out" \
  || fail "an unauthenticated REST call (expected 401 UNAUTHENTICATED)"
# The job the block triggers and reads, created with the bearer token.
run "grpcurl -plaintext -H 'authorization: Bearer $token' -d '{\"spec\": {\"id\": \"hello\", \"cron\": \"0 0 2 * * ?\", \"executor\": {\"group\": \"demo\", \"handler\": \"echo\"}}}' localhost:$agrpc sundial.v1.JobService/CreateJob" \
  || fail "creating the job of the Authentication block"
TOKEN="$token" bash "$work/auth.sh" >"$work/out" 2>&1 || fail "README.md's Authentication block"
grep -q '"scheduleId":"hello@manual-deploy-44"' "$work/out" || fail "the signed curl trigger"
[ "$(grep -c '"id": "hello"' "$work/out")" = 2 ] || fail "the bearer and the signed grpcurl GetJob"
# /metrics stays open without credentials.
n=$((n + 1))
echo "walkthrough [$n] $metrics (a server with credentials)"
run "${metrics//localhost:$http/localhost:$ahttp}" || fail "$metrics on the server with credentials"
grep -q '^sundial_' "$work/out" || fail "$metrics on the server with credentials (not open)"

echo "walkthrough: $n commands of README.md run and checked in $(( $(date +%s) - started )) s"
