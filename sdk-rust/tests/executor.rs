//! The executor against a scripted in-process server: each test plays the server's
//! side of the stream message by message (the fake answers only heartbeats, per a
//! lease policy the test sets, and `Started`, with the go-ahead unless the test
//! withholds it, by itself) and checks what the SDK sends back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use sundial_sdk::proto as pb;
use sundial_sdk::{CancellationToken, Executor, ExecutorBuilder, HandlerError, RunContext};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

use pb::executor_message::Msg;
use pb::executor_service_server::{ExecutorService, ExecutorServiceServer};
use pb::server_message::Msg as Out;

const WAIT: Duration = Duration::from_secs(10);
const HEARTBEAT_MS: i64 = 100;

type Outbound = mpsc::UnboundedSender<Result<pb::ServerMessage, Status>>;

/// One fake server on a free port; every accepted stream arrives as a [`Conn`].
struct FakeServer {
    url: String,
    conns: mpsc::UnboundedReceiver<Conn>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

struct Service {
    conns: mpsc::UnboundedSender<Conn>,
}

/// One executor stream, seen from the server.
struct Conn {
    hello: pb::Hello,
    tx: Outbound,
    /// Every message after the hello, heartbeats included.
    rx: mpsc::UnboundedReceiver<Msg>,
    /// How heartbeats are answered: > 0 renews every listed run for that many ms, 0
    /// says every lease is gone, < 0 acknowledges without renewing anything.
    lease_ms: Arc<AtomicI64>,
    /// How `Started` is answered: `StartAck` with this `go` (true unless set).
    go: Arc<AtomicBool>,
}

#[tonic::async_trait]
impl ExecutorService for Service {
    type ConnectStream = UnboundedReceiverStream<Result<pb::ServerMessage, Status>>;

    async fn connect(
        &self,
        req: Request<Streaming<pb::ExecutorMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let mut inbound = req.into_inner();
        let hello = match inbound.message().await? {
            Some(pb::ExecutorMessage {
                msg: Some(Msg::Hello(h)),
            }) => h,
            other => return Err(Status::failed_precondition(format!("{other:?}"))),
        };
        let (tx, out) = mpsc::unbounded_channel();
        let (seen, rx) = mpsc::unbounded_channel();
        let lease_ms = Arc::new(AtomicI64::new(5_000));
        let go = Arc::new(AtomicBool::new(true));
        tokio::spawn(pump(
            inbound,
            tx.clone(),
            seen,
            lease_ms.clone(),
            go.clone(),
        ));
        let _ = self.conns.send(Conn {
            hello,
            tx,
            rx,
            lease_ms,
            go,
        });
        Ok(Response::new(UnboundedReceiverStream::new(out)))
    }
}

/// Forwards the executor's messages to the test, answering heartbeats and starts on
/// the way.
async fn pump(
    mut inbound: Streaming<pb::ExecutorMessage>,
    tx: Outbound,
    seen: mpsc::UnboundedSender<Msg>,
    lease_ms: Arc<AtomicI64>,
    go: Arc<AtomicBool>,
) {
    while let Ok(Some(m)) = inbound.message().await {
        let Some(m) = m.msg else { continue };
        if let Msg::Heartbeat(hb) = &m {
            let ms = lease_ms.load(Ordering::SeqCst);
            let leases = if ms < 0 {
                Vec::new()
            } else {
                hb.in_flight
                    .iter()
                    .map(|r| pb::LeaseStatus {
                        run: Some(r.clone()),
                        remaining_ms: ms,
                    })
                    .collect()
            };
            let _ = tx.send(Ok(out(Out::HeartbeatAck(pb::HeartbeatAck { leases }))));
        }
        if let Msg::Started(s) = &m {
            let go = go.load(Ordering::SeqCst);
            let _ = tx.send(Ok(out(Out::StartAck(pb::StartAck {
                run: s.run.clone(),
                go,
                reason: if go { String::new() } else { "no lease".into() },
            }))));
        }
        if seen.send(m).is_err() {
            break;
        }
    }
}

fn out(m: Out) -> pb::ServerMessage {
    pb::ServerMessage { msg: Some(m) }
}

impl FakeServer {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let (conns_tx, conns) = mpsc::unbounded_channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let service = ExecutorServiceServer::new(Service { conns: conns_tx });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                    let _ = stopped.await;
                }),
        );
        Self {
            url,
            conns,
            _stop: stop,
        }
    }

    /// The next stream, already welcomed with a 100 ms heartbeat and this lease.
    async fn accept(&mut self, lease_ttl_ms: i64, unknown: Vec<pb::RunRef>) -> Conn {
        let conn = tokio::time::timeout(WAIT, self.conns.recv())
            .await
            .expect("no connection in time")
            .expect("server gone");
        conn.send(Out::Welcome(pb::Welcome {
            server_instance: "fake".into(),
            heartbeat_interval_ms: HEARTBEAT_MS,
            lease_ttl_ms,
            unknown_in_flight: unknown,
        }));
        conn
    }
}

impl Conn {
    fn send(&self, m: Out) {
        self.tx.send(Ok(out(m))).expect("stream open");
    }

    /// Ends the stream with an error, as a dying server would.
    fn close(self) {
        let _ = self
            .tx
            .send(Err(Status::unavailable("the fake server hung up")));
    }

    fn dispatch(&self, id: &str, token: u64, handler: &str, payload: &[u8]) -> pb::RunRef {
        let run = pb::RunRef {
            schedule_id: id.into(),
            attempt: 1,
            fencing_token: token,
            shard_index: 0,
        };
        self.send(Out::Dispatch(pb::Dispatch {
            run: Some(run.clone()),
            job_id: id.into(),
            handler: handler.into(),
            payload: payload.to_vec(),
            ..Default::default()
        }));
        run
    }

    /// The next message (heartbeats included); None once the stream has ended.
    async fn next(&mut self) -> Option<Msg> {
        tokio::time::timeout(WAIT, self.rx.recv())
            .await
            .expect("the executor said nothing in time")
    }

    /// Skips messages until `pick` takes one.
    async fn until<T>(&mut self, what: &str, mut pick: impl FnMut(Msg) -> Option<T>) -> T {
        loop {
            match self.next().await {
                Some(m) => {
                    if let Some(t) = pick(m) {
                        return t;
                    }
                }
                None => panic!("the stream ended while waiting for {what}"),
            }
        }
    }

    /// The next message that is not a heartbeat.
    async fn next_event(&mut self) -> Msg {
        self.until("a message", |m| {
            (!matches!(m, Msg::Heartbeat(_))).then_some(m)
        })
        .await
    }

    async fn result(&mut self) -> pb::Result {
        self.until("a result", |m| match m {
            Msg::Result(r) => Some(r),
            _ => None,
        })
        .await
    }

    fn ack(&self, run: &pb::RunRef) {
        self.send(Out::ResultAck(pb::ResultAck {
            run: Some(run.clone()),
            accepted: true,
            reason: String::new(),
        }));
    }
}

async fn echo(ctx: RunContext) -> Result<Vec<u8>, HandlerError> {
    ctx.info(format!("echoing {} bytes", ctx.payload().len()));
    Ok(ctx.payload().to_vec())
}

async fn chatty(ctx: RunContext) -> Result<Vec<u8>, HandlerError> {
    for i in 0..250 {
        ctx.info(format!("line {i}"));
    }
    Ok(b"done".to_vec())
}

/// Sleeps for the payload's milliseconds unless cancelled.
async fn sleep(ctx: RunContext) -> Result<Vec<u8>, HandlerError> {
    let ms: u64 = std::str::from_utf8(ctx.payload())?.parse()?;
    ctx.until_cancelled(tokio::time::sleep(Duration::from_millis(ms)))
        .await?;
    Ok(Vec::new())
}

/// Never returns on its own, and ignores cancellation.
async fn stubborn(_ctx: RunContext) -> Result<Vec<u8>, HandlerError> {
    std::future::pending().await
}

async fn panics(_ctx: RunContext) -> Result<Vec<u8>, HandlerError> {
    panic!("handler exploded")
}

fn builder(servers: &[&FakeServer]) -> ExecutorBuilder {
    let mut b = Executor::builder()
        .group("g")
        .node_id("node-1")
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(100))
        .handler("echo", echo)
        .handler("chatty", chatty)
        .handler("sleep", sleep)
        .handler("stubborn", stubborn)
        .handler("panic", panics);
    for s in servers {
        b = b.endpoint(s.url.clone());
    }
    b
}

struct Running {
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), sundial_sdk::Error>>,
}

fn spawn(b: ExecutorBuilder) -> Running {
    let executor = b.build().expect("valid executor");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(executor.run(shutdown.clone()));
    Running { shutdown, task }
}

impl Running {
    async fn stopped_within(self, limit: Duration) {
        tokio::time::timeout(limit, self.task)
            .await
            .expect("the executor did not stop in time")
            .expect("executor task")
            .expect("executor result");
    }
}

fn status(r: &pb::Result) -> pb::ResultStatus {
    pb::ResultStatus::try_from(r.status).unwrap_or_default()
}

#[tokio::test]
async fn a_run_reports_started_logs_then_a_result_kept_until_acknowledged() {
    let mut server = FakeServer::start().await;
    let executor = builder(&[&server]).build().expect("valid");
    let mut connected = executor.connected();
    let running = {
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(executor.run(shutdown.clone()));
        Running { shutdown, task }
    };
    let mut conn = server.accept(5_000, Vec::new()).await;
    let c = tokio::time::timeout(WAIT, connected.wait_for(Option::is_some))
        .await
        .expect("connected in time")
        .expect("watch open")
        .clone()
        .expect("connected");
    assert_eq!(c.server_instance, "fake");
    assert_eq!(
        conn.hello.handlers,
        ["chatty", "echo", "panic", "sleep", "stubborn"]
    );

    let run = conn.dispatch("job@1", 7, "echo", b"payload");
    assert_eq!(
        conn.next_event().await,
        Msg::Started(pb::Started {
            run: Some(run.clone())
        })
    );
    let Msg::Logs(logs) = conn.next_event().await else {
        panic!("expected the log line before the result")
    };
    assert_eq!(logs.run.as_ref(), Some(&run));
    assert_eq!(logs.lines[0].message, "echoing 7 bytes");
    assert_eq!(logs.lines[0].level, "info");
    let result = conn.result().await;
    assert_eq!(result.run.as_ref(), Some(&run));
    assert_eq!(status(&result), pb::ResultStatus::Succeeded);
    assert_eq!(result.output, b"payload");
    assert!(result.finished_at_ms >= result.started_at_ms && result.started_at_ms > 0);

    // Not acknowledged: the next Hello still holds its lease (a result is accepted
    // only under a current lease), and it comes again right after the welcome.
    conn.close();
    let mut conn = server.accept(5_000, Vec::new()).await;
    assert_eq!(conn.hello.in_flight, vec![run.clone()]);
    assert_eq!(conn.next_event().await, Msg::Result(result.clone()));
    conn.ack(&run);

    // Acknowledged: the next connection starts clean.
    conn.close();
    let mut conn = server.accept(5_000, Vec::new()).await;
    assert!(conn.hello.in_flight.is_empty());
    let next = conn.dispatch("job@2", 8, "echo", b"");
    assert_eq!(
        conn.next_event().await,
        Msg::Started(pb::Started {
            run: Some(next.clone())
        })
    );
    // Shutdown waits for that result's acknowledgement.
    assert_eq!(conn.result().await.run.as_ref(), Some(&next));
    conn.ack(&next);

    running.shutdown.cancel();
    running.stopped_within(WAIT).await;
}

#[tokio::test]
async fn every_line_logged_goes_out_before_the_result_in_batches() {
    let mut server = FakeServer::start().await;
    let running = spawn(builder(&[&server]));
    let mut conn = server.accept(5_000, Vec::new()).await;
    let run = conn.dispatch("job@1", 1, "chatty", b"");
    let mut lines = Vec::new();
    let result = loop {
        match conn.next_event().await {
            Msg::Started(_) => {}
            Msg::Logs(l) => {
                assert!(l.lines.len() <= 100);
                assert_eq!(l.run.as_ref(), Some(&run));
                lines.extend(l.lines.into_iter().map(|l| l.message));
            }
            Msg::Result(r) => break r,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(
        lines,
        (0..250).map(|i| format!("line {i}")).collect::<Vec<_>>()
    );
    assert_eq!(result.output, b"done");
    conn.ack(&run);
    running.shutdown.cancel();
    running.stopped_within(WAIT).await;
}

#[tokio::test]
async fn dispatches_are_rejected_when_unknown_or_beyond_max_concurrency() {
    let mut server = FakeServer::start().await;
    let running = spawn(builder(&[&server]).max_concurrency(1));
    let mut conn = server.accept(5_000, Vec::new()).await;
    let first = conn.dispatch("a@1", 1, "sleep", b"60000");
    assert_eq!(
        conn.next_event().await,
        Msg::Started(pb::Started {
            run: Some(first.clone())
        })
    );
    // The same dispatch again is confirmed, not started twice.
    conn.dispatch("a@1", 1, "sleep", b"60000");
    assert_eq!(
        conn.next_event().await,
        Msg::Started(pb::Started {
            run: Some(first.clone())
        })
    );

    let busy = conn.dispatch("b@1", 2, "echo", b"");
    let unknown = conn.dispatch("c@1", 3, "nope", b"");
    let reject = |run: &pb::RunRef, reason: &str| {
        Msg::Reject(pb::Reject {
            run: Some(run.clone()),
            reason: reason.into(),
        })
    };
    assert_eq!(conn.next_event().await, reject(&busy, "busy"));
    assert_eq!(
        conn.next_event().await,
        reject(&unknown, "unknown handler: nope")
    );

    // Every heartbeat lists exactly the executing run.
    let hb = conn
        .until("a heartbeat", |m| match m {
            Msg::Heartbeat(hb) => Some(hb),
            _ => None,
        })
        .await;
    assert_eq!(
        (hb.in_flight, hb.active, hb.not_ready),
        (vec![first.clone()], 1, false)
    );

    conn.send(Out::Cancel(pb::Cancel {
        run: Some(first.clone()),
        reason: "timeout".into(),
    }));
    let result = conn.result().await;
    assert_eq!(status(&result), pb::ResultStatus::Cancelled);
    assert_eq!(result.error_code, "cancelled");
    conn.ack(&first);
    let again = conn.dispatch("b@1", 4, "echo", b"");
    assert_eq!(
        conn.next_event().await,
        Msg::Started(pb::Started {
            run: Some(again.clone())
        })
    );
    conn.result().await;
    conn.ack(&again);
    running.shutdown.cancel();
    running.stopped_within(WAIT).await;
}

#[tokio::test]
async fn a_panicking_handler_fails_with_code_panic() {
    let mut server = FakeServer::start().await;
    let running = spawn(builder(&[&server]));
    let mut conn = server.accept(5_000, Vec::new()).await;
    let run = conn.dispatch("p@1", 1, "panic", b"");
    let result = conn.result().await;
    assert_eq!(result.run, Some(run.clone()));
    assert_eq!(status(&result), pb::ResultStatus::Failed);
    assert_eq!(
        (result.error_code.as_str(), result.error_message.as_str()),
        ("panic", "handler exploded")
    );
    conn.ack(&run);
    running.shutdown.cancel();
    running.stopped_within(WAIT).await;
}

#[tokio::test]
async fn a_lease_not_renewed_in_time_cancels_the_handler() {
    let mut server = FakeServer::start().await;
    let running = spawn(builder(&[&server]));
    let mut conn = server.accept(400, Vec::new()).await;
    // Heartbeats are acknowledged but renew nothing.
    conn.lease_ms.store(-1, Ordering::SeqCst);
    let started = Instant::now();
    let run = conn.dispatch("l@1", 1, "sleep", b"60000");
    let result = conn.result().await;
    let took = started.elapsed();
    assert_eq!(status(&result), pb::ResultStatus::Cancelled);
    assert!(
        took >= Duration::from_millis(350),
        "cancelled after {took:?}"
    );
    assert!(took < Duration::from_secs(3), "cancelled after {took:?}");
    conn.ack(&run);

    // Renewed leases keep a run going past its first TTL …
    conn.lease_ms.store(400, Ordering::SeqCst);
    let run = conn.dispatch("l@2", 2, "sleep", b"1000");
    let result = conn.result().await;
    assert_eq!(status(&result), pb::ResultStatus::Succeeded);
    conn.ack(&run);

    // … and a renewal that says the lease is gone cancels at once.
    conn.lease_ms.store(0, Ordering::SeqCst);
    let run = conn.dispatch("l@3", 3, "sleep", b"60000");
    let result = conn.result().await;
    assert_eq!(status(&result), pb::ResultStatus::Cancelled);
    conn.ack(&run);
    running.shutdown.cancel();
    running.stopped_within(WAIT).await;
}

/// A dispatch the server withholds the go-ahead for (its lease is gone) never runs:
/// no handler, no result, and no longer listed in heartbeats; the next one runs.
#[tokio::test]
async fn a_dispatch_without_the_go_ahead_never_starts() {
    let mut server = FakeServer::start().await;
    let running = spawn(builder(&[&server]));
    let mut conn = server.accept(5_000, Vec::new()).await;
    conn.go.store(false, Ordering::SeqCst);
    let stale = conn.dispatch("s@1", 1, "echo", b"");
    assert_eq!(
        conn.next_event().await,
        Msg::Started(pb::Started { run: Some(stale) })
    );
    // Every message after Started was sent after the dispatch was admitted: a
    // heartbeat that lists nothing means it was forgotten.
    conn.until("a heartbeat listing nothing", |m| match m {
        Msg::Heartbeat(hb) if hb.in_flight.is_empty() => Some(()),
        _ => None,
    })
    .await;
    conn.go.store(true, Ordering::SeqCst);
    let run = conn.dispatch("s@2", 2, "echo", b"x");
    // The first result is the second run's: the first never ran.
    let result = conn.result().await;
    assert_eq!(result.run, Some(run.clone()));
    assert_eq!(status(&result), pb::ResultStatus::Succeeded);
    conn.ack(&run);
    running.shutdown.cancel();
    running.stopped_within(WAIT).await;
}

#[tokio::test]
async fn runs_survive_a_reconnect_unless_the_server_no_longer_leases_them() {
    let mut server = FakeServer::start().await;
    let running = spawn(builder(&[&server]));
    let mut conn = server.accept(5_000, Vec::new()).await;
    let kept = conn.dispatch("k@1", 1, "sleep", b"500");
    let lost = conn.dispatch("x@1", 2, "sleep", b"60000");
    for _ in 0..2 {
        assert!(matches!(conn.next_event().await, Msg::Started(_)));
    }
    conn.close();

    let conn = tokio::time::timeout(WAIT, server.conns.recv())
        .await
        .expect("reconnected")
        .expect("server up");
    assert_eq!(conn.hello.in_flight, vec![kept.clone(), lost.clone()]);
    conn.send(Out::Welcome(pb::Welcome {
        server_instance: "fake".into(),
        heartbeat_interval_ms: HEARTBEAT_MS,
        lease_ttl_ms: 5_000,
        unknown_in_flight: vec![lost.clone()],
    }));
    let mut conn = conn;
    let mut results = Vec::new();
    while results.len() < 2 {
        results.push(conn.result().await);
    }
    results.sort_by_key(|r| r.run.as_ref().map(|r| r.fencing_token));
    assert_eq!(status(&results[0]), pb::ResultStatus::Succeeded);
    assert_eq!(status(&results[1]), pb::ResultStatus::Cancelled);
    conn.ack(&kept);
    conn.ack(&lost);
    running.shutdown.cancel();
    running.stopped_within(WAIT).await;
}

#[tokio::test]
async fn go_away_moves_to_the_next_endpoint_with_the_run_still_going() {
    let mut a = FakeServer::start().await;
    let mut b = FakeServer::start().await;
    let running = spawn(builder(&[&a, &b]));
    let mut conn_a = a.accept(5_000, Vec::new()).await;
    let run = conn_a.dispatch("g@1", 1, "sleep", b"300");
    assert!(matches!(conn_a.next_event().await, Msg::Started(_)));
    conn_a.send(Out::GoAway(pb::GoAway {
        reason: "draining".into(),
        endpoints: Vec::new(),
    }));
    let mut conn_b = b.accept(5_000, Vec::new()).await;
    assert_eq!(conn_b.hello.in_flight, vec![run.clone()]);
    let result = conn_b.result().await;
    assert_eq!(
        (result.run.as_ref(), status(&result)),
        (Some(&run), pb::ResultStatus::Succeeded)
    );
    conn_b.ack(&run);
    running.shutdown.cancel();
    running.stopped_within(WAIT).await;
}

#[tokio::test]
async fn drain_refuses_new_work_and_finishes_what_runs() {
    let mut server = FakeServer::start().await;
    let running = spawn(builder(&[&server]));
    let mut conn = server.accept(5_000, Vec::new()).await;
    let run = conn.dispatch("d@1", 1, "sleep", b"300");
    assert!(matches!(conn.next_event().await, Msg::Started(_)));
    conn.send(Out::Drain(pb::Drain {
        reason: "maintenance".into(),
    }));
    let hb = conn
        .until("a not-ready heartbeat", |m| match m {
            Msg::Heartbeat(hb) if hb.not_ready => Some(hb),
            _ => None,
        })
        .await;
    assert_eq!(hb.in_flight, vec![run.clone()]);
    let refused = conn.dispatch("d@2", 2, "echo", b"");
    assert_eq!(
        conn.next_event().await,
        Msg::Reject(pb::Reject {
            run: Some(refused),
            reason: "draining".into()
        })
    );
    let result = conn.result().await;
    assert_eq!(status(&result), pb::ResultStatus::Succeeded);
    conn.ack(&run);
    running.shutdown.cancel();
    running.stopped_within(WAIT).await;
}

#[tokio::test]
async fn shutdown_waits_for_running_handlers_and_acknowledgements() {
    let mut server = FakeServer::start().await;
    let running = spawn(builder(&[&server]));
    let mut conn = server.accept(5_000, Vec::new()).await;
    let run = conn.dispatch("s@1", 1, "sleep", b"300");
    assert!(matches!(conn.next_event().await, Msg::Started(_)));
    running.shutdown.cancel();
    conn.until("a not-ready heartbeat", |m| match m {
        Msg::Heartbeat(hb) if hb.not_ready => Some(()),
        _ => None,
    })
    .await;
    let refused = conn.dispatch("s@2", 2, "echo", b"");
    assert_eq!(
        conn.next_event().await,
        Msg::Reject(pb::Reject {
            run: Some(refused),
            reason: "draining".into()
        })
    );
    let result = conn.result().await;
    assert_eq!(status(&result), pb::ResultStatus::Succeeded);
    assert!(
        !running.task.is_finished(),
        "stopped before the acknowledgement"
    );
    conn.ack(&run);
    running.stopped_within(WAIT).await;
    // Its side of the stream is closed.
    while let Some(m) = conn.next().await {
        assert!(matches!(m, Msg::Heartbeat(_)), "unexpected {m:?}");
    }
}

#[tokio::test]
async fn shutdown_gives_up_after_the_grace_period() {
    let mut server = FakeServer::start().await;
    let running = spawn(builder(&[&server]).shutdown_grace(Duration::from_millis(300)));
    let mut conn = server.accept(5_000, Vec::new()).await;
    conn.dispatch("z@1", 1, "stubborn", b"");
    assert!(matches!(conn.next_event().await, Msg::Started(_)));
    let asked = Instant::now();
    running.shutdown.cancel();
    running.stopped_within(WAIT).await;
    assert!(asked.elapsed() >= Duration::from_millis(250));
}

#[tokio::test]
async fn a_handler_is_fenced_while_no_server_can_be_reached() {
    let mut server = FakeServer::start().await;
    let running = spawn(builder(&[&server]));
    let mut conn = server.accept(400, Vec::new()).await;
    let run = conn.dispatch("f@1", 1, "sleep", b"60000");
    assert!(matches!(conn.next_event().await, Msg::Started(_)));
    let lost_at = unix_ms();
    conn.close();
    // The executor reconnects at once, but no welcome comes for a while: the lease
    // (400 ms, last counted from the dispatch or a renewal) runs out meanwhile.
    let conn = tokio::time::timeout(WAIT, server.conns.recv())
        .await
        .expect("reconnected")
        .expect("server up");
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let welcomed_at = unix_ms();
    conn.send(Out::Welcome(pb::Welcome {
        server_instance: "fake".into(),
        heartbeat_interval_ms: HEARTBEAT_MS,
        lease_ttl_ms: 5_000,
        unknown_in_flight: Vec::new(),
    }));
    let mut conn = conn;
    let result = conn.result().await;
    assert_eq!(status(&result), pb::ResultStatus::Cancelled);
    assert!(
        result.finished_at_ms < welcomed_at,
        "cancelled {} ms after the loss, {} ms after the welcome",
        result.finished_at_ms - lost_at,
        result.finished_at_ms - welcomed_at
    );
    conn.ack(&run);
    running.shutdown.cancel();
    running.stopped_within(WAIT).await;
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
