"""A Sundial executor in one module: it owns the whole protocol of
proto/sundial/v1/executor.proto (its comments say the why of each rule), so a program
that copies it writes only handlers::

    ex = Executor(["localhost:50051"], group="demo", node_id="py-1")
    ex.handle("echo", lambda run: run.payload)
    ex.run_forever()            # until ex.stop() (e.g. from a SIGTERM handler)

What it does for the handlers (each a plain function run on its own thread):

- Hello with the token, the window (max_concurrency) and the runs still held from the
  previous stream; Welcome.unknown_in_flight cancels those handlers.
- Credits: a Dispatch is admitted only while fewer than the window are admitted or
  executing (the server sends no more; one beyond is rejected "busy").
- The go-ahead: Started on admission; the handler starts only on StartAck go=True,
  go=False forgets the dispatch. A dispatch cancelled before its go-ahead, or left
  without one when a stream broke, is rejected (routed again, no attempt spent).
- Heartbeats listing exactly the held runs (admitted, executing, Result unacked).
- A Result echoing the dispatch's RunRef, kept and resent after every Welcome until
  its ResultAck.
- Cancel, a lease a HeartbeatAck reports gone, or one not renewed within the lease TTL
  on this process's clock set the run's ``cancelled`` event; no Result is sent for it.
- Reject for an unknown handler and while draining; Drain stops admitting work,
  Undrain admits it again.
- GoAway and broken streams: reconnect with jittered exponential backoff across the
  endpoints (and those a GoAway names).
- ``stop(grace_s)``: no new work, running handlers get the grace to finish and deliver
  their Results, the rest are cancelled, the stream is closed.

A handler returns its output as bytes; it raises ``Failure(code, message)`` to fail
with an error code, ``Cancelled`` to end the run CANCELLED, anything else to fail with
code "error". It should watch ``run.cancelled`` (a ``threading.Event``) and return
promptly once it is set.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum

import grpc

_STUBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gen")
sys.path.insert(0, os.environ.get("SUNDIAL_PY_STUBS", _STUBS))
from sundial.v1 import executor_pb2 as pb  # noqa: E402
from sundial.v1 import executor_pb2_grpc as pb_grpc  # noqa: E402

SDK = "sundial-example-python/0.2"
DEFAULT_WINDOW = 64  # what the server applies to max_concurrency 0

log = logging.getLogger("sundial_executor")

# A run is identified by its whole RunRef: (schedule_id, attempt, fencing_token, shard_index).
Key = tuple[str, int, int, int]


def key_of(ref: pb.RunRef) -> Key:
    return (ref.schedule_id, ref.attempt, ref.fencing_token, ref.shard_index)


def ref_of(key: Key) -> pb.RunRef:
    return pb.RunRef(schedule_id=key[0], attempt=key[1], fencing_token=key[2], shard_index=key[3])


class Failure(Exception):
    """Fails a run with a machine-readable code and a message for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class Cancelled(Exception):
    """Raised by a handler to end its run CANCELLED (final, not retried)."""


@dataclass(frozen=True)
class Run:
    """One dispatch as a handler sees it."""

    schedule_id: str
    job_id: str
    attempt: int
    shard_index: int
    shard_total: int
    payload: bytes
    route_key: str
    labels: dict[str, str]
    scheduled_at_ms: int
    cancelled: threading.Event = field(default_factory=threading.Event)


Handler = Callable[[Run], bytes]


class Phase(Enum):
    ADMITTED = 1  # Started sent, waiting for the StartAck
    EXECUTING = 2  # the handler runs
    AWAITING_ACK = 3  # the Result is sent, waiting for its ResultAck


@dataclass
class Held:
    """One run this process holds a lease for."""

    dispatch: pb.Dispatch
    handler: Handler
    phase: Phase = Phase.ADMITTED
    cancelled: threading.Event = field(default_factory=threading.Event)
    result: pb.Result | None = None
    renewed: float = field(default_factory=time.monotonic)


def result_of(key: Key, run: Run, handler: Handler) -> pb.Result:
    """Runs the handler and turns how it ended into a Result."""
    started = int(time.time() * 1000)
    status, output, code, message = pb.RESULT_STATUS_SUCCEEDED, b"", "", ""
    try:
        output = handler(run)
    except Failure as f:
        status, code, message = pb.RESULT_STATUS_FAILED, f.code, f.message
    except Cancelled as c:
        status, message = pb.RESULT_STATUS_CANCELLED, str(c)
    except Exception as e:  # a handler bug fails its run, not the process
        status, code, message = pb.RESULT_STATUS_FAILED, "error", repr(e)
    return pb.Result(
        run=ref_of(key), status=status, output=output, error_code=code, error_message=message,
        started_at_ms=started, finished_at_ms=int(time.time() * 1000))


def jitter(delay_s: float) -> float:
    """Spreads a delay over [delay/2, delay] so executors do not reconnect in step."""
    return delay_s / 2 + random.uniform(0, delay_s / 2)


class Executor:
    """Connects to Sundial and runs the registered handlers; see the module doc."""

    def __init__(self, endpoints: list[str], group: str, node_id: str, token: str = "",
                 max_concurrency: int = 0,
                 on_welcome: Callable[[str], None] | None = None) -> None:
        if not endpoints or not group or not node_id:
            raise ValueError("endpoints, group and node_id are required")
        self.endpoints = endpoints
        self.group = group
        self.node_id = node_id
        self.token = token
        self.max_concurrency = max_concurrency
        self.on_welcome = on_welcome
        self.handlers: dict[str, Handler] = {}
        self.lock = threading.Lock()
        self.runs: dict[Key, Held] = {}
        self.to_reject: list[Key] = []
        self.outq: queue.Queue[pb.ExecutorMessage | None] | None = None
        self.lease_ttl_s = 30.0
        self.draining = False
        self.stopping = threading.Event()
        self.stopped = threading.Event()
        self.go_away_to: list[str] = []
        self.call: grpc.Call | None = None
        self.threads: list[threading.Thread] = []

    def handle(self, name: str, handler: Handler) -> None:
        """Registers a handler under the name jobs give as executor.handler."""
        self.handlers[name] = handler

    def window(self) -> int:
        return self.max_concurrency or DEFAULT_WINDOW

    def send(self, msg: pb.ExecutorMessage) -> None:
        """Queues a message on the current stream; dropped while offline (what matters
        is resent after the next Welcome). Callers hold the lock."""
        if self.outq is not None:
            self.outq.put(msg)

    # ---- connection

    def run_forever(self) -> None:
        """Connects and serves until stop(); reconnects with jittered backoff."""
        if not self.handlers:
            raise ValueError("register at least one handler")
        watchdog = threading.Thread(target=self._watchdog, daemon=True)
        watchdog.start()
        backoff = 0.1
        attempt = 0
        while not self.stopped.is_set():
            with self.lock:
                endpoints = self.go_away_to or self.endpoints
            endpoint = endpoints[attempt % len(endpoints)].removeprefix("http://")
            attempt += 1
            welcomed = self._session(endpoint)
            if self.stopped.is_set():
                break
            backoff = 0.1 if welcomed else min(backoff * 2, 5.0)
            wait = jitter(backoff)
            log.warning("stream to %s ended; reconnecting in %.2fs", endpoint, wait)
            self.stopped.wait(wait)

    def _session(self, endpoint: str) -> bool:
        """One stream: Hello, Welcome, then messages until it ends."""
        outq: queue.Queue[pb.ExecutorMessage | None] = queue.Queue()
        with self.lock:
            held = [ref_of(k) for k, h in self.runs.items() if h.phase != Phase.ADMITTED]
        outq.put(pb.ExecutorMessage(hello=pb.Hello(
            node_id=self.node_id, group=self.group, handlers=list(self.handlers),
            max_concurrency=self.max_concurrency, token=self.token, sdk=SDK, in_flight=held)))

        def requests() -> Iterator[pb.ExecutorMessage]:
            while True:
                msg = outq.get()
                if msg is None:
                    return
                yield msg

        channel = grpc.insecure_channel(endpoint)
        welcomed = False
        session_over = threading.Event()
        try:
            call = pb_grpc.ExecutorServiceStub(channel).Connect(requests())
            self.call = call
            for msg in call:
                kind = msg.WhichOneof("msg")
                if kind == "welcome":
                    welcomed = True
                    self._welcome(msg.welcome, outq, session_over)
                elif kind == "heartbeat_ack":
                    self._heartbeat_ack(msg.heartbeat_ack)
                elif kind == "dispatch":
                    self._dispatch(msg.dispatch)
                elif kind == "start_ack":
                    self._start_ack(msg.start_ack)
                elif kind == "result_ack":
                    self._result_ack(msg.result_ack)
                elif kind == "cancel":
                    log.info("cancel %s: %s", msg.cancel.run.schedule_id, msg.cancel.reason)
                    self._cancel(key_of(msg.cancel.run))
                elif kind == "drain":
                    log.info("draining: %s", msg.drain.reason)
                    with self.lock:
                        self.draining = True
                    self._heartbeat()
                elif kind == "undrain":
                    log.info("undrained: taking work again: %s", msg.undrain.reason)
                    with self.lock:
                        self.draining = False
                    self._heartbeat()
                elif kind == "go_away":
                    with self.lock:
                        self.go_away_to = list(msg.go_away.endpoints)
                    break
        except grpc.RpcError as e:
            if not self.stopped.is_set():
                log.warning("stream error: %s", e)
        finally:
            session_over.set()
            with self.lock:
                self.outq = None
                for key in [k for k, h in self.runs.items() if h.phase == Phase.ADMITTED]:
                    del self.runs[key]  # never got the go-ahead: never started
                    self.to_reject.append(key)
            outq.put(None)
            channel.close()
        return welcomed

    def _welcome(self, welcome: pb.Welcome, outq: queue.Queue[pb.ExecutorMessage | None],
                 session_over: threading.Event) -> None:
        for ref in welcome.unknown_in_flight:
            self._cancel(key_of(ref))
        with self.lock:
            self.outq = outq
            if welcome.lease_ttl_ms > 0:
                self.lease_ttl_s = welcome.lease_ttl_ms / 1000.0
            for key in self.to_reject:  # not started when the last stream broke
                self.send(pb.ExecutorMessage(reject=pb.Reject(
                    run=ref_of(key), reason="not started: the stream broke before the go-ahead")))
            self.to_reject = []
            now = time.monotonic()
            for h in self.runs.values():
                h.renewed = now  # Hello.in_flight renewed them
                if h.phase == Phase.AWAITING_ACK and h.result is not None:
                    self.send(pb.ExecutorMessage(result=h.result))
        interval = max(welcome.heartbeat_interval_ms, 50) / 1000.0

        def beat() -> None:
            while not session_over.wait(interval):
                self._heartbeat()

        self._heartbeat()
        threading.Thread(target=beat, daemon=True).start()
        log.info("connected to %s", welcome.server_instance)
        if self.on_welcome is not None:
            self.on_welcome(welcome.server_instance)

    # ---- messages

    def _heartbeat(self) -> None:
        with self.lock:
            active = sum(1 for h in self.runs.values() if h.phase == Phase.EXECUTING)
            self.send(pb.ExecutorMessage(heartbeat=pb.Heartbeat(
                in_flight=[ref_of(k) for k in self.runs], active=active,
                not_ready=self.draining or self.stopping.is_set())))

    def _heartbeat_ack(self, ack: pb.HeartbeatAck) -> None:
        now = time.monotonic()
        for lease in ack.leases:
            key = key_of(lease.run)
            if lease.remaining_ms <= 0:
                log.info("lease gone: %s", key[0])
                self._cancel(key)
                continue
            with self.lock:
                h = self.runs.get(key)
                if h is not None:
                    h.renewed = now

    def _watchdog(self) -> None:
        """Cancels handlers whose lease was not renewed within the TTL on this clock."""
        while not self.stopped.wait(0.2):
            with self.lock:
                now = time.monotonic()
                expired = [k for k, h in self.runs.items()
                           if h.phase != Phase.AWAITING_ACK and not h.cancelled.is_set()
                           and now - h.renewed > self.lease_ttl_s]
            for key in expired:
                log.warning("lease of %s not renewed in time; stopping its handler", key[0])
                self._cancel(key)

    def _dispatch(self, d: pb.Dispatch) -> None:
        key = key_of(d.run)
        with self.lock:
            h = self.runs.get(key)
            if h is not None:
                if h.phase == Phase.AWAITING_ACK and h.result is not None:
                    self.send(pb.ExecutorMessage(result=h.result))  # the kept result
                return
            handler = self.handlers.get(d.handler)
            holding = sum(1 for h in self.runs.values() if h.phase != Phase.AWAITING_ACK)
            reason = ("unknown handler " + d.handler if handler is None
                      else "draining" if self.draining or self.stopping.is_set()
                      else "busy" if holding >= self.window() else "")
            if handler is None or reason:
                self.send(pb.ExecutorMessage(reject=pb.Reject(run=d.run, reason=reason)))
                return
            self.runs[key] = Held(dispatch=d, handler=handler)
            self.send(pb.ExecutorMessage(started=pb.Started(run=d.run)))

    def _start_ack(self, ack: pb.StartAck) -> None:
        key = key_of(ack.run)
        with self.lock:
            h = self.runs.get(key)
            if h is None or h.phase != Phase.ADMITTED:
                return  # already started, or forgotten
            if not ack.go:
                del self.runs[key]
                log.info("not starting %s: %s", key[0], ack.reason)
                return
            if h.cancelled.is_set() or self.stopping.is_set():
                del self.runs[key]  # cancelled before the go-ahead: route it again
                self.send(pb.ExecutorMessage(reject=pb.Reject(
                    run=ack.run, reason="not started: cancelled before the go-ahead")))
                return
            h.phase = Phase.EXECUTING
        d = h.dispatch
        run = Run(schedule_id=key[0], job_id=d.job_id, attempt=key[1], shard_index=key[3],
                  shard_total=d.shard_total, payload=d.payload, route_key=d.route_key,
                  labels=dict(d.labels), scheduled_at_ms=d.scheduled_at_ms, cancelled=h.cancelled)
        if d.deadline_ms > 0:
            timer = threading.Timer(d.deadline_ms / 1000.0, self._cancel, args=(key,))
            timer.daemon = True
            timer.start()
        t = threading.Thread(target=self._execute, args=(key, h, run), daemon=True)
        with self.lock:
            self.threads = [x for x in self.threads if x.is_alive()] + [t]
        t.start()

    def _execute(self, key: Key, h: Held, run: Run) -> None:
        result = result_of(key, run, h.handler)
        with self.lock:
            if h.cancelled.is_set():  # cancelled or the lease is gone: a Result would be refused
                self.runs.pop(key, None)
                return
            h.phase, h.result = Phase.AWAITING_ACK, result
            self.send(pb.ExecutorMessage(result=result))

    def _result_ack(self, ack: pb.ResultAck) -> None:
        key = key_of(ack.run)
        with self.lock:
            h = self.runs.get(key)
            if h is not None and h.phase == Phase.AWAITING_ACK:
                if not ack.accepted:
                    log.warning("result of %s refused: %s", key[0], ack.reason)
                del self.runs[key]

    def _cancel(self, key: Key) -> None:
        """Stops a held run: sets its handler's event, or rejects it at its go-ahead."""
        with self.lock:
            h = self.runs.get(key)
            if h is not None and h.phase != Phase.AWAITING_ACK:
                h.cancelled.set()

    # ---- shutdown

    def stop(self, grace_s: float = 10.0) -> None:
        """No new work; running handlers get grace_s to finish and their Results to be
        acknowledged; the rest are cancelled; then the stream is closed."""
        self.stopping.set()
        self._heartbeat()
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            with self.lock:
                busy = any(h.phase != Phase.AWAITING_ACK or self.outq is not None
                           for h in self.runs.values())
            if not busy:
                break
            time.sleep(0.05)
        with self.lock:
            for h in self.runs.values():
                if h.phase == Phase.EXECUTING:
                    h.cancelled.set()
            threads = list(self.threads)
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()) + 1.0)
        self.stopped.set()
        call = self.call
        if call is not None:
            call.cancel()
