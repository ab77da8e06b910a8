#!/usr/bin/env bash
# What the run scripts' Lua costs Redis, step by step, with no client, network or
# FCALL in the way: runlib's and beginlib's own helpers called in a loop inside one
# EVAL (scripts/bench-lua/*.lua) on a throwaway redis-server. Steadier than
# `sundial-bench steps` (a change of 1-2 µs in one helper shows), and it compares the
# scripts of two revisions side by side, interleaved: the working tree's against REV's.
#
# Usage: scripts/bench-lua.sh [REV] [ITERATIONS]   (default: HEAD, 20000)
# Prints, per mode, ns per iteration for REV and for the working tree (three rounds);
# the next is a sketch of a step on a hash record (the same for both: its script
# does not use the prelude), for comparison with `record start`; then what one command
# or cmsgpack call of a step costs alone (scripts/bench-lua/ops.lua, no prelude).
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD}
n=${2:-20000}
lua=server/src/store/redis/lua
work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
  >"$work/redis.log" 2>&1 &
pid=$!
cleanup() { kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done

# The prelude of a revision ('' for the working tree): common.lua, runlib.lua, beginlib.lua,
# then `new_call()`, which resets what a call's wrapper resets besides the clock
# (functions.rs): the run scripts' `run_info` and the fencing counter of the call
# (written first, as the call's wrapper writes it when the call ends), where the
# revision has them.
prelude() {
  for f in common runlib beginlib; do
    if [ -z "$1" ]; then cat "$lua/$f.lua"; else git show "$1:$lua/$f.lua"; fi
    echo
  done >"$work/prelude.tmp"
  cat "$work/prelude.tmp"
  if grep -q '^local busy_counts' "$work/prelude.tmp"; then
    # ... and the lease counts the call read.
    echo 'local function new_call() if token_last then save_tokens() end; token_key, token_last, run_info, busy_counts = nil, nil, {}, nil end'
  elif grep -q '^local function save_tokens' "$work/prelude.tmp"; then
    # The last call's fencing counter written, as its wrapper ends it.
    echo 'local function new_call() if token_last then save_tokens() end; token_key, token_last, run_info = nil, nil, {} end'
  elif grep -q '^local run_info' "$work/prelude.tmp"; then
    echo 'local function new_call() run_info = {} end'
  else
    echo 'local function new_call() end'
  fi
}
prelude "$rev" >"$work/base.lua"
prelude "" >"$work/tree.lua"
for tail in record begin sketch-hash-start; do
  cat "$work/base.lua" "scripts/bench-lua/$tail.lua" >"$work/base-$tail.lua"
  cat "$work/tree.lua" "scripts/bench-lua/$tail.lua" >"$work/tree-$tail.lua"
done

run() { # build tail mode [events]
  redis-cli -p "$port" flushall >/dev/null
  redis-cli -p "$port" --eval "$work/$1-$2.lua" , "$n" "$3" ${4:+"$4"} | tail -1
}
echo "ns per iteration, $n iterations; $rev's scripts | the working tree's (three rounds)"
for step in "record get 2" "record load 2" "record save 2" "record plan 2" "record start 2" \
  "record start 20" "record finish 2" "begin record" "begin begin" "begin assign" "begin first" "sketch-hash-start -"; do
  set -- $step
  line=$(printf '%-7s %-7s %-3s' "$1" "$2" "${3:-}")
  for _ in 1 2 3; do
    line="$line  $(run base "$@") | $(run tree "$@")"
  done
  echo "$line"
done
ops="empty concat get_miss set_px_new zadd_new sadd_new_set hset unpack_new pack_leased time"
line="ops, ns each:"
for op in $ops; do
  redis-cli -p "$port" flushall >/dev/null
  line="$line $op $(redis-cli -p "$port" --eval scripts/bench-lua/ops.lua , "$n" "$op" | tail -1)"
done
echo "$line"
