"""The protocol against a scripted ExecutorService on a real socket: no handler before
go=True, none after go=False, an unknown handler rejected, Cancel setting the run's
event with no Result, and an unacknowledged Result listed in the next Hello and sent
again until its ack."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
from sundial.v1 import executor_pb2 as pb
from sundial.v1 import executor_pb2_grpc as pb_grpc

from sundial_executor import Executor, Run


class Stream:
    def __init__(self) -> None:
        self.incoming: queue.Queue[pb.ExecutorMessage | None] = queue.Queue()
        self.out: queue.Queue[pb.ServerMessage | None] = queue.Queue()

    def next(self) -> pb.ExecutorMessage:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                m = self.incoming.get(timeout=0.1)
            except queue.Empty:
                continue
            assert m is not None, "the stream ended"
            if m.WhichOneof("msg") != "heartbeat":
                return m
        raise AssertionError("no message within 5 s")

    def quiet(self, seconds: float, why: str) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                m = self.incoming.get(timeout=0.02)
            except queue.Empty:
                continue
            assert m is None or m.WhichOneof("msg") == "heartbeat", f"{why}: got {m}"

    def send(self, m: pb.ServerMessage) -> None:
        self.out.put(m)


class Scripted(pb_grpc.ExecutorServiceServicer):
    def __init__(self) -> None:
        self.streams: queue.Queue[Stream] = queue.Queue()
        self.all: list[Stream] = []

    def close(self) -> None:
        """Ends every stream's response generator, so the server's threads can exit."""
        for st in self.all:
            st.out.put(None)

    def Connect(self, request_iterator: Iterator[pb.ExecutorMessage],  # noqa: N802
                context: grpc.ServicerContext) -> Iterator[pb.ServerMessage]:
        st = Stream()

        def read() -> None:
            try:
                for m in request_iterator:
                    st.incoming.put(m)
            except grpc.RpcError:
                pass
            st.incoming.put(None)

        threading.Thread(target=read, daemon=True).start()
        self.all.append(st)
        self.streams.put(st)
        while True:
            m = st.out.get()
            if m is None:
                return
            yield m


def ref(sid: str, token: int) -> pb.RunRef:
    return pb.RunRef(schedule_id=sid, attempt=1, fencing_token=token)


def test_go_ahead_results_cancel_and_reconnect() -> None:
    scripted = Scripted()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_ExecutorServiceServicer_to_server(scripted, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    started: list[str] = []
    cancelled: queue.Queue[str] = queue.Queue()

    def echo(run: Run) -> bytes:
        started.append(run.schedule_id)
        return run.payload

    def block(run: Run) -> bytes:
        started.append(run.schedule_id)
        if run.cancelled.wait(60):
            cancelled.put(run.schedule_id)
        return b""

    ex = Executor([f"127.0.0.1:{port}"], group="g", node_id="n1")
    ex.handle("echo", echo)
    ex.handle("block", block)
    worker = threading.Thread(target=ex.run_forever, daemon=True)
    worker.start()
    welcome = pb.ServerMessage(welcome=pb.Welcome(heartbeat_interval_ms=50, lease_ttl_ms=5000))

    def dispatch(st: Stream, r: pb.RunRef, handler: str) -> None:
        st.send(pb.ServerMessage(dispatch=pb.Dispatch(run=r, handler=handler, payload=b"hi")))

    def go_ahead(st: Stream, r: pb.RunRef, go: bool) -> None:
        st.send(pb.ServerMessage(start_ack=pb.StartAck(run=r, go=go)))

    try:
        st = scripted.streams.get(timeout=10)
        assert st.next().hello.node_id == "n1"
        st.send(welcome)

        a = ref("a@1", 11)
        dispatch(st, a, "echo")
        assert st.next().started.run == a
        st.quiet(0.3, "before the go-ahead")
        assert started == [], "a handler started before its go-ahead"
        go_ahead(st, a, True)
        result = st.next().result
        assert result.run == a and result.status == pb.RESULT_STATUS_SUCCEEDED and result.output == b"hi"

        b = ref("b@1", 12)
        dispatch(st, b, "echo")
        st.next()
        go_ahead(st, b, False)
        st.quiet(0.3, "after go=False")
        assert started == ["a@1"], "a dispatch answered go=False started"

        c = ref("c@1", 13)
        dispatch(st, c, "nope")
        assert st.next().reject.run == c

        d = ref("d@1", 14)
        dispatch(st, d, "block")
        st.next()
        go_ahead(st, d, True)
        time.sleep(0.1)
        st.send(pb.ServerMessage(cancel=pb.Cancel(run=d, reason="test")))
        assert cancelled.get(timeout=5) == "d@1"
        st.quiet(0.3, "after a cancel")

        st.send(None)  # type: ignore[arg-type]  # ends the stream
        st2 = scripted.streams.get(timeout=10)
        assert list(st2.next().hello.in_flight) == [a]
        st2.send(welcome)
        assert st2.next().result.run == a
        st2.send(pb.ServerMessage(result_ack=pb.ResultAck(run=a, accepted=True)))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            m = st2.incoming.get(timeout=5)
            if m is not None and m.WhichOneof("msg") == "heartbeat" and not m.heartbeat.in_flight:
                break
        else:
            raise AssertionError("heartbeats still list a after its ResultAck")
    finally:
        ex.stop(grace_s=1)
        scripted.close()
        server.stop(0)
