#!/usr/bin/env bash
# Where a benchmark's Redis time goes, by script function: runs a command (a
# `sundial-bench` scenario), waits START seconds, sets Redis's SLOWLOG to log every
# command on the newest redis-server (the bench's own), reads it WINDOW seconds
# later and prints, per command and per FCALL function, calls, total and mean
# microseconds (a function's time includes the commands it ran, which are also
# listed on their own; logging every command slows Redis by ~20 %, so compare
# shares and per-call figures, not the run's throughput).
#
# Usage: scripts/slowlog-by-function.sh START WINDOW -- COMMAND...
#   e.g. scripts/slowlog-by-function.sh 9 3 -- target/release/sundial-bench sustained --rate 3000 --seconds 15
set -euo pipefail
start=$1 window=$2
shift 3
out=$(mktemp)
"$@" >"$out" 2>&1 &
bench=$!
sleep "$start"
pid=$(pgrep -n redis-server)
port=$(ss -ltnp | grep "pid=$pid," | grep -o '127.0.0.1:[0-9]*' | head -1 | cut -d: -f2)
redis-cli -p "$port" CONFIG SET slowlog-max-len 2000000 >/dev/null
redis-cli -p "$port" SLOWLOG RESET >/dev/null
redis-cli -p "$port" CONFIG SET slowlog-log-slower-than 0 >/dev/null
sleep "$window"
redis-cli -p "$port" CONFIG SET slowlog-log-slower-than 10000 >/dev/null
python3 - "$port" <<'PY'
import collections, io, socket, sys

def slowlog(port):
    s = socket.create_connection(("127.0.0.1", int(port)))
    s.sendall(b"*3\r\n$7\r\nSLOWLOG\r\n$3\r\nGET\r\n$2\r\n-1\r\n")
    buf = bytearray()
    s.settimeout(2)
    try:
        while True:
            d = s.recv(1 << 20)
            if not d:
                break
            buf += d
    except socket.timeout:
        pass
    f = io.BytesIO(bytes(buf))

    def read():
        line = f.readline()
        t, rest = line[:1], line[1:-2]
        if t in (b"+", b"-"):
            return rest.decode()
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            return None if n < 0 else f.read(n + 2)[:-2].decode(errors="replace")
        if t == b"*":
            return [read() for _ in range(int(rest))]
        raise ValueError(f"unexpected reply {line!r}")

    return read()

agg = collections.defaultdict(lambda: [0, 0])
entries = slowlog(sys.argv[1])
for e in entries:
    args = e[3]
    name = args[0].lower()
    if name in ("fcall", "fcall_ro", "evalsha"):
        name = f"{name} {args[1]}"
    agg[name][0] += 1
    agg[name][1] += e[2]
total = sum(v[1] for k, v in agg.items() if not k.startswith("fcall"))
print(f"{len(entries)} entries; plain commands (in scripts or not): {total} us")
for k, (calls, us) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"{k:56s} {calls:8d} calls {us:10d} us {us / calls:8.1f} us/call")
PY
wait "$bench" || true
grep -E "due ->|results/s|Redis per run" "$out" || tail -5 "$out"
rm -f "$out"
