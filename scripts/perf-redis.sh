#!/usr/bin/env bash
# Where a benchmark's Redis spends its CPU, by C function: runs a command (a
# `sundial-bench` scenario) with a redis-server built with symbols first in PATH (so
# the bench starts that one), waits START seconds, records the newest redis-server
# with `perf record` for WINDOW seconds, and prints its hottest functions (self and
# with callees) and the self time grouped: the Lua VM, Redis itself, malloc,
# cmsgpack, number <-> string conversions, libc string functions, the kernel.
#
# Debian's redis-server is stripped of the Lua VM's symbols, so the first run builds
# the same version from Debian's source package into target/redis-sym (apt-get source
# through a private sources list: nothing of the machine's apt setup changes; a few
# minutes on two cores). Needs perf, dpkg-dev and a C toolchain.
#
# Usage: scripts/perf-redis.sh START WINDOW -- COMMAND...
#   e.g. scripts/perf-redis.sh 8 12 -- target/release/sundial-bench burst --jobs 10000 --executors 10 --rounds 2
set -euo pipefail
cd "$(dirname "$0")/.."
start=$1 window=$2
shift 3
root=$PWD
sym="$root/target/redis-sym"
work=$(mktemp -d)
bench=
# The source download, the bench's output and the perf data go, and a bench still
# running (the script stopped early) is stopped, however the script ends.
cleanup() {
  if [ -n "$bench" ]; then kill "$bench" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
if [ ! -x "$sym/src/redis-server" ]; then
  version=$(dpkg-query -W -f '${Version}' redis-server)
  mkdir -p "$work/lists/partial" "$work/parts"
  # deb-src entries for every Debian source the machine installs from.
  awk 'function out() { for (i = 1; i <= n; i++) print "deb-src [signed-by=" k "] " u " " s[i] " main"; u = "" }
       /^URIs:/ {u = $2} /^Suites:/ {n = split(substr($0, 8), s, " ")} /^Signed-By:/ {k = $2}
       /^$/ && u {out()} END {if (u) out()}' \
    /etc/apt/sources.list.d/debian.sources >"$work/src.list"
  apt_opts=(-o "Dir::Etc::SourceList=$work/src.list" -o "Dir::Etc::SourceParts=$work/parts"
    -o "Dir::State::Lists=$work/lists")
  apt-get "${apt_opts[@]}" update -qq
  (cd "$work" && apt-get "${apt_opts[@]}" source --download-only "redis=$version" >/dev/null 2>&1)
  tarball=$(ls "$work"/redis_*.orig.tar.gz)
  mkdir -p "$sym"
  tar xzf "$tarball" -C "$sym" --strip-components 1
  echo "perf-redis: building $(basename "$tarball") with symbols into $sym" >&2
  make -C "$sym" -j2 BUILD_TLS=no >"$sym/build.log" 2>&1
fi
out="$work/bench.out"
data="$work/perf.data"
PATH="$sym/src:$PATH" "$@" >"$out" 2>&1 &
bench=$!
sleep "$start"
pid=$(pgrep -n redis-server)
[ "$(readlink "/proc/$pid/exe")" = "$sym/src/redis-server" ] \
  || { echo "perf-redis: the newest redis-server is not the symbol build" >&2; exit 1; }
# Stopped with SIGINT after the window, or ending with Redis (no workload of its own:
# perf signals a workload it forked when the recorded process exits first).
timeout -s INT "$window" perf record -F 499 --call-graph dwarf,8192 -p "$pid" -o "$data" 2>/dev/null || true
wait "$bench" || true
bench=
grep -v '^BENCH' "$out"
echo "== hottest functions (self)"
report() { perf report -i "$data" --sort symbol --stdio -g none "$@" 2>/dev/null | grep '%' || true; }
report --no-children | sed -n 1,25p
echo "== with callees"
report --children |
  grep -E 'fcallCommandGeneric|luaCallFunction|lua_pcall|luaRedisGenericCommand|scriptCall|mp_pack|mp_unpack_full|luaS_newlstr|luaC_step|luaCreateArray|luaReplyToRedisReply|str_format|luaB_tonumber' || true
echo "== self time by kind"
report --no-children | awk '
  { p = $1; sub("%", "", p); k = $2; s = $3
    if (k == "[k]") c = "kernel"
    else if (s ~ /^mp_/) c = "cmsgpack"
    else if (s ~ /(json|strbuf|fpconv)/) c = "cjson"
    else if (s ~ /^(lua|index2adr|sweep|propagate|singlestep|mainposition|traverse|reallymarkobject|markroot|resize|rehash|newkey|computesizes|numusehash|f_call|adjust_varargs|tryfuncTM|Arith|str_|math_|tconcat|addfield|arrayindex|findindex|unbound_search|setnodevector|growCI)/) c = "Lua VM"
    else if (s ~ /(malloc|free|realloc|je_|_int_|unlink_chunk|consolidate|tcache)/) c = "malloc"
    else if (s ~ /(printf|strtod|mpn)/) c = "number <-> string"
    else if (s ~ /^(mem|__mem|__str|str)/) c = "libc strings"
    else c = "Redis"
    sum[c] += p }
  END { for (c in sum) printf "%6.2f%% %s\n", sum[c], c }' | sort -rn
