"""A Sundial executor in Python: the protocol lives in sundial_executor.py, this file
only registers handlers. Handlers: echo (the payload back as output), sleep (payload =
milliseconds; stops when the run is cancelled) and fail (fails with error code
"py_fail").

    python executor.py --endpoints localhost:50051 --group demo --node-id py-1

SIGTERM or SIGINT: take no new work, let running handlers finish (10 s at most), close
the stream and exit 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading

from sundial_executor import Executor, Failure, Run


def echo(run: Run) -> bytes:
    return run.payload


def sleep(run: Run) -> bytes:
    try:
        ms = int(run.payload.decode().strip())
    except ValueError as e:
        raise Failure("bad_payload", f"sleep wants milliseconds: {e}") from e
    print(f"sleep started {run.schedule_id} attempt {run.attempt} ms {ms}", file=sys.stderr, flush=True)
    if run.cancelled.wait(ms / 1000.0):
        print(f"sleep cancelled {run.schedule_id} attempt {run.attempt}", file=sys.stderr, flush=True)
        return b""  # no Result is sent for a cancelled run
    return f"slept {ms} ms".encode()


def fail(run: Run) -> bytes:
    raise Failure("py_fail", "fail always fails")


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--endpoints", default="localhost:50051",
                   help="comma-separated host:port of Sundial servers (plaintext)")
    p.add_argument("--group", default="demo")
    p.add_argument("--node-id", default=f"{socket.gethostname()}-{os.getpid()}")
    p.add_argument("--max-concurrency", type=int, default=0,
                   help="the window: runs held at once (0 = the server's default, 64)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    executor = Executor(
        args.endpoints.split(","), group=args.group, node_id=args.node_id,
        token=os.environ.get("SUNDIAL_EXECUTOR_TOKEN", ""),
        max_concurrency=args.max_concurrency,
        on_welcome=lambda _instance: print(f"PY_EXECUTOR_READY {args.node_id}", flush=True))
    executor.handle("echo", echo)
    executor.handle("sleep", sleep)
    executor.handle("fail", fail)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    worker = threading.Thread(target=executor.run_forever, daemon=True)
    worker.start()
    while not stop.wait(0.2) and worker.is_alive():
        pass
    executor.stop(grace_s=10.0)
    worker.join(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
