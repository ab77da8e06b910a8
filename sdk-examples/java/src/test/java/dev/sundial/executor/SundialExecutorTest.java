package dev.sundial.executor;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.google.protobuf.ByteString;
import dev.sundial.v1.Cancel;
import dev.sundial.v1.Dispatch;
import dev.sundial.v1.ExecutorMessage;
import dev.sundial.v1.ExecutorServiceGrpc;
import dev.sundial.v1.ResultAck;
import dev.sundial.v1.ResultStatus;
import dev.sundial.v1.RunRef;
import dev.sundial.v1.ServerMessage;
import dev.sundial.v1.StartAck;
import dev.sundial.v1.Welcome;
import io.grpc.Grpc;
import io.grpc.InsecureServerCredentials;
import io.grpc.Server;
import io.grpc.stub.StreamObserver;
import java.time.Duration;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/** The protocol against a scripted ExecutorService on a real socket. */
class SundialExecutorTest {
  /** One stream as the scripted server sees it. */
  static final class Stream {
    final BlockingQueue<ExecutorMessage> in = new LinkedBlockingQueue<>();
    StreamObserver<ServerMessage> out;

    /** The next message that is not a heartbeat. */
    ExecutorMessage next() throws InterruptedException {
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
      while (System.nanoTime() < deadline) {
        ExecutorMessage m = in.poll(100, TimeUnit.MILLISECONDS);
        if (m != null && !m.hasHeartbeat()) {
          return m;
        }
      }
      return fail("no message within 5 s");
    }

    void quiet(long ms, String why) throws InterruptedException {
      long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(ms);
      while (System.nanoTime() < deadline) {
        ExecutorMessage m = in.poll(20, TimeUnit.MILLISECONDS);
        if (m != null && !m.hasHeartbeat()) {
          fail(why + ": got " + m);
        }
      }
    }

    synchronized void send(ServerMessage m) {
      out.onNext(m);
    }
  }

  @Test
  void goAheadResultsCancelAndReconnect() throws Exception {
    BlockingQueue<Stream> streams = new LinkedBlockingQueue<>();
    Server server = Grpc.newServerBuilderForPort(0, InsecureServerCredentials.create())
        .addService(new ExecutorServiceGrpc.ExecutorServiceImplBase() {
          @Override
          public StreamObserver<ExecutorMessage> connect(StreamObserver<ServerMessage> out) {
            Stream s = new Stream();
            s.out = out;
            streams.add(s);
            return new StreamObserver<>() {
              @Override public void onNext(ExecutorMessage m) { s.in.add(m); }
              @Override public void onError(Throwable t) { }
              @Override public void onCompleted() { }
            };
          }
        }).build().start();
    AtomicInteger started = new AtomicInteger();
    BlockingQueue<String> interrupted = new LinkedBlockingQueue<>();
    SundialExecutor ex = new SundialExecutor(java.util.List.of("127.0.0.1:" + server.getPort()), "g", "n1", "", 0)
        .handle("echo", run -> {
          started.incrementAndGet();
          return run.payload();
        })
        .handle("block", run -> {
          started.incrementAndGet();
          try {
            Thread.sleep(60_000);
          } catch (InterruptedException e) {
            interrupted.add(run.scheduleId() + (run.cancelled() ? " cancelled" : ""));
            throw e;
          }
          return new byte[0];
        });
    ex.start();
    try {
      ServerMessage welcome = ServerMessage.newBuilder().setWelcome(
          Welcome.newBuilder().setHeartbeatIntervalMs(50).setLeaseTtlMs(5000)).build();
      Stream st = streams.poll(10, TimeUnit.SECONDS);
      assertNotNull(st, "no stream");
      assertEquals("n1", st.next().getHello().getNodeId());
      st.send(welcome);

      // Started on admission, nothing runs before go = true.
      RunRef a = dispatch(st, "a@1", "echo", 11);
      assertEquals(a, st.next().getStarted().getRun());
      st.quiet(300, "before the go-ahead");
      assertEquals(0, started.get(), "a handler started before its go-ahead");
      goAhead(st, a, true);
      var res = st.next().getResult();
      assertEquals(a, res.getRun());
      assertEquals(ResultStatus.RESULT_STATUS_SUCCEEDED, res.getStatus());
      assertEquals("hi", res.getOutput().toStringUtf8());

      // go = false: forgotten, never started, no Result.
      RunRef b = dispatch(st, "b@1", "echo", 12);
      st.next();
      goAhead(st, b, false);
      st.quiet(300, "after go = false");
      assertEquals(1, started.get(), "a dispatch answered go = false started");

      // An unknown handler is rejected.
      RunRef c = dispatch(st, "c@1", "nope", 13);
      assertEquals(c, st.next().getReject().getRun());

      // Cancel interrupts the handler; no Result follows.
      RunRef d = dispatch(st, "d@1", "block", 14);
      st.next();
      goAhead(st, d, true);
      Thread.sleep(100);
      st.send(ServerMessage.newBuilder().setCancel(Cancel.newBuilder().setRun(d).setReason("test")).build());
      assertEquals("d@1 cancelled", interrupted.poll(5, TimeUnit.SECONDS));
      st.quiet(300, "after a cancel");

      // a's Result was never acknowledged: after the stream breaks the next Hello lists
      // it and it is sent again after the Welcome; the ack settles it.
      st.out.onError(io.grpc.Status.UNAVAILABLE.asRuntimeException());
      Stream st2 = streams.poll(10, TimeUnit.SECONDS);
      assertNotNull(st2, "no reconnect");
      var hello = st2.next().getHello();
      assertEquals(java.util.List.of(a), hello.getInFlightList());
      st2.send(welcome);
      assertEquals(a, st2.next().getResult().getRun());
      st2.send(ServerMessage.newBuilder().setResultAck(ResultAck.newBuilder().setRun(a).setAccepted(true)).build());
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
      boolean empty = false;
      while (!empty && System.nanoTime() < deadline) {
        ExecutorMessage m = st2.in.poll(100, TimeUnit.MILLISECONDS);
        empty = m != null && m.hasHeartbeat() && m.getHeartbeat().getInFlightCount() == 0;
      }
      assertTrue(empty, "heartbeats still list a after its ResultAck");
    } finally {
      ex.shutdown(Duration.ofSeconds(1));
      server.shutdownNow();
    }
  }

  private static RunRef dispatch(Stream st, String sid, String handler, long token) {
    RunRef ref = RunRef.newBuilder().setScheduleId(sid).setAttempt(1).setFencingToken(token).build();
    st.send(ServerMessage.newBuilder().setDispatch(Dispatch.newBuilder().setRun(ref).setHandler(handler)
        .setPayload(ByteString.copyFromUtf8("hi"))).build());
    return ref;
  }

  private static void goAhead(Stream st, RunRef ref, boolean go) {
    st.send(ServerMessage.newBuilder().setStartAck(StartAck.newBuilder().setRun(ref).setGo(go)).build());
  }
}
