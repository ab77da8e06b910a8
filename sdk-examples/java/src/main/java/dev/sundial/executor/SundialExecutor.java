package dev.sundial.executor;

import com.google.protobuf.ByteString;
import dev.sundial.v1.Dispatch;
import dev.sundial.v1.ExecutorMessage;
import dev.sundial.v1.ExecutorServiceGrpc;
import dev.sundial.v1.Heartbeat;
import dev.sundial.v1.HeartbeatAck;
import dev.sundial.v1.Hello;
import dev.sundial.v1.LeaseStatus;
import dev.sundial.v1.Reject;
import dev.sundial.v1.Result;
import dev.sundial.v1.ResultAck;
import dev.sundial.v1.ResultStatus;
import dev.sundial.v1.RunRef;
import dev.sundial.v1.ServerMessage;
import dev.sundial.v1.StartAck;
import dev.sundial.v1.Started;
import dev.sundial.v1.Welcome;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.stub.StreamObserver;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.logging.Logger;

/**
 * A Sundial executor: owns the whole protocol of proto/sundial/v1/executor.proto (its
 * comments say the why of each rule), so a program registers handlers and starts it.
 *
 * <ul>
 *   <li>Hello with the token, the window (max_concurrency) and the runs still held from
 *       the previous stream; Welcome.unknown_in_flight stops those handlers.
 *   <li>Credits: a Dispatch is admitted only while fewer than the window are admitted or
 *       executing (the server sends no more; one beyond is rejected "busy").
 *   <li>The go-ahead: Started on admission, the handler starts only on StartAck go =
 *       true; go = false forgets it. A dispatch cancelled before its go-ahead, or left
 *       without one when a stream broke, is rejected (routed again, no attempt spent).
 *   <li>Heartbeats listing exactly the held runs (admitted, executing, Result unacked).
 *   <li>A Result echoing the dispatch's RunRef, kept and resent after every Welcome
 *       until its ResultAck.
 *   <li>Cancel, a lease a HeartbeatAck reports gone, or one not renewed within the lease
 *       TTL on this process's clock interrupt the handler; no Result is sent for it.
 *   <li>Reject for an unknown handler and while draining; Drain stops admitting work,
 *       Undrain admits it again.
 *   <li>GoAway and broken streams: reconnect with jittered exponential backoff across
 *       the endpoints (and those a GoAway names).
 *   <li>{@link #shutdown(Duration)} (e.g. from a shutdown hook on SIGTERM): no new work,
 *       running handlers get the grace to finish and deliver their Results, then the
 *       rest are interrupted and the stream is closed.
 * </ul>
 */
public final class SundialExecutor {
  /** What the server applies to max_concurrency 0. */
  public static final int DEFAULT_WINDOW = 64;

  public static final String SDK = "sundial-example-java/0.1";

  private static final Logger LOG = Logger.getLogger(SundialExecutor.class.getName());

  private enum Phase { ADMITTED, EXECUTING, AWAITING_ACK }

  /** One run this process holds a lease for. */
  private static final class Held {
    Phase phase = Phase.ADMITTED;
    final Dispatch dispatch;
    final Handler handler;
    final AtomicBoolean cancelled = new AtomicBoolean();
    Future<?> task;
    Result result;
    long renewedNanos = System.nanoTime();

    Held(Dispatch dispatch, Handler handler) {
      this.dispatch = dispatch;
      this.handler = handler;
    }
  }

  /** A run is identified by its whole RunRef (RunRef has value equality). */
  private final Map<RunRef, Held> runs = new LinkedHashMap<>();
  private final List<RunRef> toReject = new ArrayList<>();
  private final Map<String, Handler> handlers = new LinkedHashMap<>();
  private final List<String> endpoints;
  private final String group;
  private final String nodeId;
  private final String token;
  private final int maxConcurrency;
  private final ExecutorService pool = Executors.newCachedThreadPool(r -> {
    Thread t = new Thread(r, "sundial-handler");
    t.setDaemon(true);
    return t;
  });
  private final ScheduledExecutorService timers = Executors.newScheduledThreadPool(1, r -> {
    Thread t = new Thread(r, "sundial-timers");
    t.setDaemon(true);
    return t;
  });
  private final CompletableFuture<Void> stopped = new CompletableFuture<>();

  // Guarded by this.
  private StreamObserver<ExecutorMessage> out;
  private ScheduledFuture<?> heartbeats;
  private long leaseTtlNanos = TimeUnit.SECONDS.toNanos(30);
  private boolean draining;
  private boolean stopping;
  private List<String> goAwayTo = List.of();
  private volatile Runnable onWelcome = () -> {};

  /**
   * @param endpoints "host:port" of Sundial servers (plaintext), tried in turn
   * @param group the group jobs target
   * @param nodeId [A-Za-z0-9._-]{1,128}, kept across reconnects
   * @param token the group's executor token, or "" when the server requires none
   * @param maxConcurrency the window; 0 = {@link #DEFAULT_WINDOW}
   */
  public SundialExecutor(List<String> endpoints, String group, String nodeId, String token, int maxConcurrency) {
    if (endpoints.isEmpty() || group.isEmpty() || nodeId.isEmpty()) {
      throw new IllegalArgumentException("endpoints, group and nodeId are required");
    }
    this.endpoints = List.copyOf(endpoints);
    this.group = group;
    this.nodeId = nodeId;
    this.token = token;
    this.maxConcurrency = maxConcurrency;
  }

  /** Registers a handler under the name jobs give as executor.handler. */
  public SundialExecutor handle(String name, Handler handler) {
    handlers.put(name, handler);
    return this;
  }

  /** Called after each Welcome (e.g. to print a readiness line). */
  public SundialExecutor onWelcome(Runnable r) {
    onWelcome = r;
    return this;
  }

  /** Connects in a background thread and keeps connected until {@link #shutdown}. */
  public void start() {
    if (handlers.isEmpty()) {
      throw new IllegalStateException("register at least one handler");
    }
    timers.scheduleAtFixedRate(this::watchdog, 200, 200, TimeUnit.MILLISECONDS);
    Thread t = new Thread(this::connectLoop, "sundial-connect");
    t.setDaemon(true);
    t.start();
  }

  private int window() {
    return maxConcurrency == 0 ? DEFAULT_WINDOW : maxConcurrency;
  }

  private void connectLoop() {
    long backoffMs = 100;
    for (int attempt = 0; !stopped.isDone(); attempt++) {
      String endpoint = endpoint(attempt);
      boolean welcomed = false;
      String why;
      try {
        welcomed = session(endpoint);
        why = "stream ended";
      } catch (Exception e) {
        why = e.toString();
      }
      if (stopped.isDone()) {
        return;
      }
      backoffMs = welcomed ? 100 : Math.min(backoffMs * 2, 5000);
      long wait = backoffMs / 2 + ThreadLocalRandom.current().nextLong(backoffMs / 2 + 1);
      LOG.warning("stream to " + endpoint + " ended (" + why + "); reconnecting in " + wait + " ms");
      try {
        stopped.get(wait, TimeUnit.MILLISECONDS);
        return;
      } catch (java.util.concurrent.TimeoutException e) {
        // backoff over
      } catch (Exception e) {
        return;
      }
    }
  }

  private synchronized String endpoint(int attempt) {
    List<String> list = goAwayTo.isEmpty() ? endpoints : goAwayTo;
    return list.get(attempt % list.size()).replaceFirst("^http://", "");
  }

  /** One stream: Hello, Welcome, messages until it ends. True if it was welcomed. */
  private boolean session(String endpoint) throws Exception {
    ManagedChannel channel = ManagedChannelBuilder.forTarget(endpoint).usePlaintext().build();
    CompletableFuture<Void> ended = new CompletableFuture<>();
    AtomicBoolean welcomed = new AtomicBoolean();
    try {
      StreamObserver<ExecutorMessage> requests = ExecutorServiceGrpc.newStub(channel).connect(
          new StreamObserver<>() {
            @Override
            public void onNext(ServerMessage m) {
              if (!onMessage(m, welcomed)) {
                ended.complete(null);
              }
            }

            @Override
            public void onError(Throwable t) {
              ended.completeExceptionally(t);
            }

            @Override
            public void onCompleted() {
              ended.complete(null);
            }
          });
      synchronized (this) {
        Hello.Builder hello = Hello.newBuilder().setNodeId(nodeId).setGroup(group)
            .addAllHandlers(handlers.keySet()).setMaxConcurrency(maxConcurrency)
            .setToken(token).setSdk(SDK);
        runs.forEach((ref, h) -> {
          if (h.phase != Phase.ADMITTED) {
            hello.addInFlight(ref);
          }
        });
        requests.onNext(ExecutorMessage.newBuilder().setHello(hello).build());
        pendingOut = requests;
      }
      CompletableFuture.anyOf(ended, stopped).get();
      synchronized (this) {
        if (stopped.isDone()) {
          requests.onCompleted();
        }
      }
      return welcomed.get();
    } catch (java.util.concurrent.ExecutionException e) {
      if (welcomed.get()) {
        return true;
      }
      throw e;
    } finally {
      sessionOver();
      channel.shutdownNow();
    }
  }

  /** The stream of the session in progress, before its Welcome. */
  private StreamObserver<ExecutorMessage> pendingOut;

  /** Handles one server message; false ends the session (GoAway). */
  private boolean onMessage(ServerMessage m, AtomicBoolean welcomed) {
    switch (m.getMsgCase()) {
      case WELCOME -> {
        welcomed.set(true);
        welcome(m.getWelcome());
      }
      case HEARTBEAT_ACK -> heartbeatAck(m.getHeartbeatAck());
      case DISPATCH -> dispatch(m.getDispatch());
      case START_ACK -> startAck(m.getStartAck());
      case RESULT_ACK -> resultAck(m.getResultAck());
      case CANCEL -> {
        LOG.info("cancel " + m.getCancel().getRun().getScheduleId() + ": " + m.getCancel().getReason());
        cancelRun(m.getCancel().getRun());
      }
      case DRAIN -> {
        LOG.info("draining: " + m.getDrain().getReason());
        synchronized (this) {
          draining = true;
        }
        heartbeat();
      }
      case UNDRAIN -> {
        LOG.info("undrained: taking work again: " + m.getUndrain().getReason());
        synchronized (this) {
          draining = false;
        }
        heartbeat();
      }
      case GO_AWAY -> {
        synchronized (this) {
          goAwayTo = List.copyOf(m.getGoAway().getEndpointsList());
        }
        return false;
      }
      default -> { }
    }
    return true;
  }

  /** Offline until the next Welcome: dispatches without a go-ahead are forgotten and
   * rejected after it. */
  private synchronized void sessionOver() {
    out = null;
    pendingOut = null;
    if (heartbeats != null) {
      heartbeats.cancel(false);
      heartbeats = null;
    }
    runs.entrySet().removeIf(e -> {
      if (e.getValue().phase == Phase.ADMITTED) {
        toReject.add(e.getKey());
        return true;
      }
      return false;
    });
  }

  private void welcome(Welcome w) {
    for (RunRef r : w.getUnknownInFlightList()) {
      cancelRun(r);
    }
    long intervalMs = Math.max(w.getHeartbeatIntervalMs(), 50);
    synchronized (this) {
      out = pendingOut;
      if (w.getLeaseTtlMs() > 0) {
        leaseTtlNanos = TimeUnit.MILLISECONDS.toNanos(w.getLeaseTtlMs());
      }
      for (RunRef r : toReject) {
        send(ExecutorMessage.newBuilder().setReject(Reject.newBuilder().setRun(r)
            .setReason("not started: the stream broke before the go-ahead")).build());
      }
      toReject.clear();
      long now = System.nanoTime();
      for (Held h : runs.values()) {
        h.renewedNanos = now; // Hello.in_flight renewed them
        if (h.phase == Phase.AWAITING_ACK) {
          send(ExecutorMessage.newBuilder().setResult(h.result).build());
        }
      }
      heartbeats = timers.scheduleAtFixedRate(this::heartbeat, 0, intervalMs, TimeUnit.MILLISECONDS);
    }
    LOG.info("connected to " + w.getServerInstance());
    onWelcome.run();
  }

  /** Sends on the current stream; dropped while offline (resent after the next Welcome). */
  private synchronized void send(ExecutorMessage m) {
    if (out != null) {
      try {
        out.onNext(m);
      } catch (RuntimeException e) {
        LOG.warning("send failed: " + e);
      }
    }
  }

  private synchronized void heartbeat() {
    Heartbeat.Builder hb = Heartbeat.newBuilder().addAllInFlight(runs.keySet())
        .setNotReady(draining || stopping);
    hb.setActive((int) runs.values().stream().filter(h -> h.phase == Phase.EXECUTING).count());
    send(ExecutorMessage.newBuilder().setHeartbeat(hb).build());
  }

  private void heartbeatAck(HeartbeatAck ack) {
    long now = System.nanoTime();
    for (LeaseStatus l : ack.getLeasesList()) {
      if (l.getRemainingMs() <= 0) {
        LOG.info("lease gone: " + l.getRun().getScheduleId());
        cancelRun(l.getRun());
        continue;
      }
      synchronized (this) {
        Held h = runs.get(l.getRun());
        if (h != null) {
          h.renewedNanos = now;
        }
      }
    }
  }

  /** Stops handlers whose lease was not renewed within the TTL on this clock. */
  private void watchdog() {
    List<RunRef> expired = new ArrayList<>();
    synchronized (this) {
      long now = System.nanoTime();
      runs.forEach((ref, h) -> {
        if (h.phase != Phase.AWAITING_ACK && !h.cancelled.get() && now - h.renewedNanos > leaseTtlNanos) {
          expired.add(ref);
        }
      });
    }
    for (RunRef r : expired) {
      LOG.warning("lease of " + r.getScheduleId() + " not renewed in time; stopping its handler");
      cancelRun(r);
    }
  }

  private synchronized void dispatch(Dispatch d) {
    RunRef ref = d.getRun();
    Held existing = runs.get(ref);
    if (existing != null) {
      if (existing.phase == Phase.AWAITING_ACK) { // dispatched again: the kept result
        send(ExecutorMessage.newBuilder().setResult(existing.result).build());
      }
      return;
    }
    Handler handler = handlers.get(d.getHandler());
    long holding = runs.values().stream().filter(h -> h.phase != Phase.AWAITING_ACK).count();
    String reason = handler == null ? "unknown handler " + d.getHandler()
        : (draining || stopping) ? "draining"
        : holding >= window() ? "busy" : null;
    if (reason != null) {
      send(ExecutorMessage.newBuilder().setReject(Reject.newBuilder().setRun(ref).setReason(reason)).build());
      return;
    }
    runs.put(ref, new Held(d, handler));
    send(ExecutorMessage.newBuilder().setStarted(Started.newBuilder().setRun(ref)).build());
  }

  private synchronized void startAck(StartAck ack) {
    RunRef ref = ack.getRun();
    Held h = runs.get(ref);
    if (h == null || h.phase != Phase.ADMITTED) {
      return; // already started, or forgotten
    }
    if (!ack.getGo()) {
      runs.remove(ref);
      LOG.info("not starting " + ref.getScheduleId() + ": " + ack.getReason());
      return;
    }
    if (h.cancelled.get() || stopping) { // cancelled before the go-ahead: route it again
      runs.remove(ref);
      send(ExecutorMessage.newBuilder().setReject(Reject.newBuilder().setRun(ref)
          .setReason("not started: cancelled before the go-ahead")).build());
      return;
    }
    h.phase = Phase.EXECUTING;
    Run run = new Run(h.dispatch, h.cancelled);
    h.task = pool.submit(() -> execute(ref, h, run));
    long deadlineMs = h.dispatch.getDeadlineMs();
    if (deadlineMs > 0) {
      timers.schedule(() -> cancelRun(ref), deadlineMs, TimeUnit.MILLISECONDS);
    }
  }

  private void execute(RunRef ref, Held h, Run run) {
    long started = System.currentTimeMillis();
    Result result;
    try {
      byte[] output = h.handler.handle(run);
      result = result(ref, ResultStatus.RESULT_STATUS_SUCCEEDED, output, "", "", started);
    } catch (Failure f) {
      result = result(ref, ResultStatus.RESULT_STATUS_FAILED, null, f.code(), String.valueOf(f.getMessage()), started);
    } catch (Cancelled c) {
      result = result(ref, ResultStatus.RESULT_STATUS_CANCELLED, null, "", String.valueOf(c.getMessage()), started);
    } catch (Throwable t) { // a handler bug fails its run, not the process
      result = result(ref, ResultStatus.RESULT_STATUS_FAILED, null, "error", t.toString(), started);
    }
    synchronized (this) {
      if (h.cancelled.get()) { // cancelled or the lease is gone: a Result would be refused
        runs.remove(ref);
        return;
      }
      h.phase = Phase.AWAITING_ACK;
      h.result = result;
      send(ExecutorMessage.newBuilder().setResult(result).build());
    }
  }

  /** The Result for a handler's outcome (visible for tests). */
  static Result result(RunRef ref, ResultStatus status, byte[] output, String code, String message, long startedMs) {
    return Result.newBuilder().setRun(ref).setStatus(status)
        .setOutput(output == null ? ByteString.EMPTY : ByteString.copyFrom(output))
        .setErrorCode(code).setErrorMessage(message)
        .setStartedAtMs(startedMs).setFinishedAtMs(System.currentTimeMillis()).build();
  }

  private synchronized void resultAck(ResultAck ack) {
    Held h = runs.get(ack.getRun());
    if (h != null && h.phase == Phase.AWAITING_ACK) {
      if (!ack.getAccepted()) {
        LOG.warning("result of " + ack.getRun().getScheduleId() + " refused: " + ack.getReason());
      }
      runs.remove(ack.getRun());
    }
  }

  /** Stops a held run: interrupts its handler, or rejects it at its go-ahead. */
  private synchronized void cancelRun(RunRef ref) {
    Held h = runs.get(ref);
    if (h == null || h.phase == Phase.AWAITING_ACK) {
      return;
    }
    h.cancelled.set(true);
    if (h.task != null) {
      h.task.cancel(true);
    }
  }

  /**
   * Stops taking work, gives running handlers {@code grace} to finish and their Results
   * to be acknowledged, interrupts the rest and closes the stream.
   */
  public void shutdown(Duration grace) {
    synchronized (this) {
      stopping = true;
    }
    heartbeat();
    long deadline = System.nanoTime() + grace.toNanos();
    while (System.nanoTime() < deadline) {
      synchronized (this) {
        boolean busy = runs.values().stream().anyMatch(h -> h.phase != Phase.AWAITING_ACK || out != null);
        if (!busy) {
          break;
        }
      }
      try {
        Thread.sleep(50);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        break;
      }
    }
    synchronized (this) {
      for (Held h : new HashMap<>(runs).values()) {
        if (h.phase == Phase.EXECUTING) {
          h.cancelled.set(true);
          h.task.cancel(true);
        }
      }
    }
    stopped.complete(null);
    pool.shutdown();
    try {
      pool.awaitTermination(5, TimeUnit.SECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
    timers.shutdownNow();
  }
}
