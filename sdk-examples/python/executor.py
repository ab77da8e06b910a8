"""A Sundial executor in plain Python, on stubs generated from proto/ (see gen.sh).

The protocol, one bidirectional gRPC stream (ExecutorService.Connect) per connection:

1. The executor sends Hello (node_id, group, handlers, sdk, executor token, its
   window max_concurrency, and the runs it still holds from a previous connection);
   the server answers Welcome with the heartbeat interval. The server never leases
   this node more runs than its window (0 = the default, 64); a dispatch beyond it
   (a cancelled handler still winding down) is rejected "busy".
2. Every heartbeat interval the executor sends Heartbeat listing exactly the runs it
   holds (each a RunRef: schedule_id, attempt, fencing_token, shard_index): admitted,
   executing, or with a Result not yet acknowledged; not_ready is left unset (ready)
   unless it is draining or stopping. The server renews those leases and answers
   HeartbeatAck (a lease with remaining_ms <= 0 is gone: stop that run).
3. On Dispatch the executor admits the run (it now counts as held and is listed in
   heartbeats) and sends Started, but does not run the handler yet: the server answers
   StartAck. go=true: run the handler, then send one Result (status, output or error,
   started/finished ms) carrying the dispatch's RunRef. go=false (the lease is gone,
   e.g. the dispatch waited unread while this process was frozen): forget the run, no
   Result. A run whose StartAck has not come when the stream ends is forgotten too,
   and sent as a Reject after the next Welcome; one cancelled before its go=true
   arrives is not started and is rejected at once (a Reject re-routes the run without
   spending an attempt).
   The executor keeps each Result until a ResultAck for that RunRef arrives: it stays
   listed in heartbeats and in the next Hello, and is sent again after a reconnect.
4. Cancel: stop the run (no result is sent for it). Drain: take no new work.
   GoAway: reconnect. A broken stream: reconnect with exponential backoff.

SIGTERM/SIGINT: stop taking work, let running handlers finish (a few seconds at most),
close the stream and exit 0.
"""

import argparse
import os
import queue
import signal
import sys
import threading
import time

import grpc

STUBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gen")
sys.path.insert(0, os.environ.get("SUNDIAL_PY_STUBS", STUBS))
try:
    from sundial.v1 import executor_pb2 as pb
    from sundial.v1 import executor_pb2_grpc as pb_grpc
except ImportError as e:
    sys.exit(f"executor.py: generated stubs not found ({e}); run sdk-examples/python/gen.sh first")

SDK = "sundial-example-python/0.1"
DEFAULT_WINDOW = 64  # what the server applies to max_concurrency 0


def now_ms():
    return int(time.time() * 1000)


def key_of(ref):
    return (ref.schedule_id, ref.attempt, ref.fencing_token, ref.shard_index)


def ref_of(key):
    return pb.RunRef(schedule_id=key[0], attempt=key[1], fencing_token=key[2], shard_index=key[3])


# Handlers: payload bytes in, (status, output, error_code, error_message) out.
def py_echo(payload, cancelled):
    return pb.RESULT_STATUS_SUCCEEDED, payload, "", ""


def py_fail(payload, cancelled):
    return pb.RESULT_STATUS_FAILED, b"", "py_boom", "py_fail always fails"


HANDLERS = {"py_echo": py_echo, "py_fail": py_fail}


class Executor:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.executing = {}  # RunRef key -> threading.Event set on Cancel
        self.awaiting_go = {}  # RunRef key -> (handler, payload): Started sent, no StartAck yet
        self.to_reject = []  # RunRef keys forgotten unstarted when a stream broke
        self.awaiting_ack = {}  # RunRef key -> pb.Result not yet acknowledged
        self.outq = None  # the current session's send queue (None: offline)
        self.call = None
        self.draining = False
        self.stopping = threading.Event()

    def send(self, **msg):
        with self.lock:
            if self.outq is not None:
                self.outq.put(pb.ExecutorMessage(**msg))

    def held(self):
        """The leases to renew: runs admitted or executing, and results not yet acked."""
        return [ref_of(k) for k in sorted(set(self.executing) | set(self.awaiting_ack))]

    def heartbeat(self):
        with self.lock:
            in_flight = self.held()
            active = len(self.executing)
        not_ready = self.draining or self.stopping.is_set()
        self.send(heartbeat=pb.Heartbeat(in_flight=in_flight, active=active, not_ready=not_ready))

    def run_forever(self):
        backoff = 0.1
        while not self.stopping.is_set():
            welcomed = self.session()
            if self.stopping.is_set():
                break
            backoff = 0.1 if welcomed else min(backoff * 2, 5.0)
            print(f"stream ended; reconnecting in {backoff:.1f}s", file=sys.stderr, flush=True)
            self.stopping.wait(backoff)

    def session(self):
        """One connection: Hello, Welcome, then messages until the stream ends."""
        outq = queue.Queue()
        with self.lock:
            held = self.held()
        outq.put(pb.ExecutorMessage(hello=pb.Hello(
            node_id=self.args.node_id, group=self.args.group, handlers=list(HANDLERS),
            max_concurrency=self.args.max_concurrency, token=self.args.token, sdk=SDK,
            in_flight=held)))

        def requests():
            while True:
                msg = outq.get()
                if msg is None:
                    return
                yield msg

        channel = grpc.insecure_channel(self.args.endpoint)
        welcomed = False
        session_over = threading.Event()
        try:
            self.call = pb_grpc.ExecutorServiceStub(channel).Connect(requests())
            for msg in self.call:
                kind = msg.WhichOneof("msg")
                if kind == "welcome":
                    welcomed = True
                    self.welcomed(msg.welcome, outq, session_over)
                elif kind == "heartbeat_ack":
                    for lease in msg.heartbeat_ack.leases:
                        if lease.remaining_ms <= 0:
                            self.cancel(key_of(lease.run))
                elif kind == "dispatch":
                    self.dispatch(msg.dispatch)
                elif kind == "start_ack":
                    self.start_ack(msg.start_ack)
                elif kind == "result_ack":
                    with self.lock:
                        self.awaiting_ack.pop(key_of(msg.result_ack.run), None)
                elif kind == "cancel":
                    self.cancel(key_of(msg.cancel.run))
                elif kind == "drain":
                    self.draining = True
                    self.heartbeat()
                elif kind == "go_away":
                    break
        except grpc.RpcError as e:
            if not self.stopping.is_set():
                print(f"stream error: {e.code()} {e.details()}", file=sys.stderr, flush=True)
        finally:
            session_over.set()
            with self.lock:
                self.outq = None
                for key in self.awaiting_go:  # never got the go-ahead: never started
                    self.executing.pop(key, None)
                    self.to_reject.append(key)
                self.awaiting_go.clear()
            outq.put(None)
            channel.close()
        return welcomed

    def welcomed(self, welcome, outq, session_over):
        for ref in welcome.unknown_in_flight:
            self.cancel(key_of(ref))
        with self.lock:
            self.outq = outq
            for key in self.to_reject:  # not started when the last stream broke
                outq.put(pb.ExecutorMessage(reject=pb.Reject(
                    run=ref_of(key), reason="not started: the stream broke before the go-ahead")))
            self.to_reject = []
            for result in self.awaiting_ack.values():  # re-send what was not acknowledged
                outq.put(pb.ExecutorMessage(result=result))
        interval = max(welcome.heartbeat_interval_ms, 50) / 1000.0

        def beat():
            while not session_over.wait(interval):
                self.heartbeat()

        self.heartbeat()
        threading.Thread(target=beat, daemon=True).start()
        print(f"PY_EXECUTOR_READY {self.args.node_id}", flush=True)

    def dispatch(self, d):
        key = key_of(d.run)
        with self.lock:
            if key in self.executing:
                return
            if key in self.awaiting_ack:  # dispatched again: answer with the kept result
                if self.outq is not None:
                    self.outq.put(pb.ExecutorMessage(result=self.awaiting_ack[key]))
                return
        handler = HANDLERS.get(d.handler)
        with self.lock:
            full = len(self.executing) >= (self.args.max_concurrency or DEFAULT_WINDOW)
        if handler is None or self.draining or self.stopping.is_set() or full:
            reason = ("unknown handler" if handler is None
                      else "busy" if full else "draining")
            self.send(reject=pb.Reject(run=d.run, reason=reason))
            return
        with self.lock:
            self.executing[key] = threading.Event()
            self.awaiting_go[key] = (handler, d.payload)
        self.send(started=pb.Started(run=d.run))

    def start_ack(self, ack):
        key = key_of(ack.run)
        with self.lock:
            pending = self.awaiting_go.pop(key, None)
            cancelled = self.executing.get(key)
            if pending is None or cancelled is None:
                return  # already started, or forgotten
            if not ack.go or cancelled.is_set():
                self.executing.pop(key, None)
                print(f"not starting {key[0]}: {ack.reason or 'cancelled'}", file=sys.stderr, flush=True)
                if ack.go and self.outq is not None:  # cancelled first: route it again
                    self.outq.put(pb.ExecutorMessage(reject=pb.Reject(
                        run=ack.run, reason="not started: cancelled before the go-ahead")))
                return
        handler, payload = pending
        args = (key, handler, payload, cancelled)
        threading.Thread(target=self.execute, args=args, daemon=True).start()

    def execute(self, key, handler, payload, cancelled):
        started = now_ms()
        try:
            status, output, code, message = handler(payload, cancelled)
        except Exception as e:  # a handler bug fails the run, not the executor
            status, output, code, message = pb.RESULT_STATUS_FAILED, b"", "exception", repr(e)
        result = pb.Result(run=ref_of(key), status=status, output=output, error_code=code,
                           error_message=message, started_at_ms=started, finished_at_ms=now_ms())
        with self.lock:
            self.executing.pop(key, None)
            if cancelled.is_set():
                return  # the server cancelled it or the lease is gone: no result
            self.awaiting_ack[key] = result
            if self.outq is not None:
                self.outq.put(pb.ExecutorMessage(result=result))

    def cancel(self, key):
        with self.lock:
            event = self.executing.get(key)
        if event is not None:
            event.set()

    def shutdown(self, grace_s=5.0):
        """Stop taking work, wait for handlers and acks, then close the stream."""
        self.stopping.set()
        self.heartbeat()
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            with self.lock:
                idle = not self.executing and (not self.awaiting_ack or self.outq is None)
            if idle:
                break
            time.sleep(0.05)
        call = self.call
        if call is not None:
            call.cancel()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--endpoint", required=True, help="host:port of a sundial server (plaintext)")
    p.add_argument("--group", required=True)
    p.add_argument("--node-id", required=True)
    p.add_argument("--max-concurrency", type=int, default=0,
                   help="the window: runs held at once (0 = the server's default, 64)")
    p.add_argument("--token", default="", help="the group's executor token, if the server wants one")
    executor = Executor(p.parse_args())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    worker = threading.Thread(target=executor.run_forever, daemon=True)
    worker.start()
    while not stop.wait(0.2) and worker.is_alive():
        pass
    executor.shutdown()
    worker.join(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
