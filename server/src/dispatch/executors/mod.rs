//! The executor stream (`ExecutorService.Connect`) and the node registry it keeps.
//!
//! Owns one task per connected executor: the hello → welcome handshake (a hello
//! without its group's executor token, when tokens are configured, is refused with
//! `UNAUTHENTICATED` before anything is registered), heartbeats
//! (each refreshes the node's registry entry, whose TTL is `missed_heartbeats`
//! intervals, and is acknowledged), the closing of streams that go silent, and the
//! go-away on shutdown. A malformed or out-of-order message ends that stream with a
//! precise status; it never affects another stream or the server.
//!
//! Runs on the stream: a heartbeat renews exactly the leases it lists (the ack
//! carries each one's remaining time, ≤ 0 = gone: stop it); `Started` confirms a
//! dispatch and is answered with the go-ahead (`StartAck`: go, or not when the lease
//! is already gone, so a stale dispatch never starts a handler); a `Result` finishes the attempt through the store, which refuses a stale
//! fencing token (the ack says so); `Reject` sends the run back to be routed elsewhere
//! without spending an attempt; progress and log lines are stored under the run's
//! current token only. Dispatches and cancels reach the stream through [`Links`].
//!
//! Each stream has a reader task that takes messages off it as they arrive (it never
//! waits for the store) and hands heartbeats to their own task, so a node's registry
//! entry and leases never wait behind other messages' store calls; the session task
//! handles the rest in batches, the `Started` / `Result` / `Progress` / `Logs` reports
//! about distinct runs together (a store call for the `Started`, one for the results,
//! one for the log lines), never one overtaking an earlier message about the same run
//! (`stretches` cuts a batch so; `reports` reads a result or log message into its
//! store request). `node_service` answers the operators' `NodeService` over the same
//! registry.

mod node_service;
mod reports;
mod stretches;

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt as _};
use sundial_proto::v1 as pb;
use sundial_proto::v1::executor_message::Msg;
use sundial_proto::v1::executor_service_server::ExecutorService;
use sundial_proto::v1::server_message::Msg as Out;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tracing::{Instrument, debug, info, info_span, warn};

use self::reports::{log_batch_of, result_of};
use self::stretches::{Stretch, stretches};
use crate::auth::Authenticator;
use crate::deliver::webhooks::Deliveries;
use crate::dispatch::health::{self, Health, HealthPolicy, ResultWindow};
use crate::dispatch::links::{Links, Outgoing, StreamSender};
use crate::dispatch::silence::Liveness;
use crate::dispatch::{Router, lock};
use crate::model::{RunState, duration_ms, now_ms, valid_job_id};
use crate::store::{
    Applied, Finisher, Held, Holder, NOT_THE_HOLDER, NodeRecord, NodeRegistry, Outcome, Registered,
    RunStore, UNKNOWN_RUN,
};

#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// This instance's name, recorded as the owner of its executors' streams.
    pub instance_id: String,
    /// How often executors heartbeat (told to them in `Welcome`).
    pub heartbeat_interval: Duration,
    /// A node that sends nothing for this many intervals is dropped.
    pub missed_heartbeats: u32,
    /// How long a new stream may take to say hello.
    pub hello_timeout: Duration,
    /// The lease a heartbeat renews to.
    pub lease_ttl: Duration,
    /// When a stream ends from the executor's side (it died, or closed it) while it
    /// holds runs, their leases end this much later unless it reconnects and lists
    /// them first, so they fail over in about this long rather than a lease TTL.
    pub disconnect_grace: Duration,
    /// A node that leaves a dispatch unanswered and sends nothing for this long is
    /// silent: its unanswered dispatches are taken back and routed again (same
    /// attempt), and it gets no new work until it is heard from ([`silence`]). Zero
    /// turns the rule off (the store's `confirm_by` still takes them back).
    ///
    /// [`silence`]: crate::dispatch::silence
    pub silent_after: Duration,
    /// Log text kept per run; the oldest lines fall out first.
    pub max_log_bytes: usize,
    /// The health window and thresholds `ListNodes` reports by.
    pub health: HealthPolicy,
}

impl Default for ExecutorOptions {
    fn default() -> Self {
        Self {
            instance_id: "sundial".into(),
            heartbeat_interval: Duration::from_secs(5),
            missed_heartbeats: 3,
            hello_timeout: Duration::from_secs(10),
            lease_ttl: Duration::from_secs(15),
            disconnect_grace: Duration::from_secs(1),
            silent_after: Duration::from_secs(1),
            max_log_bytes: 1 << 20,
            health: HealthPolicy::default(),
        }
    }
}

impl ExecutorOptions {
    /// How long a node stays registered (and a lease would last) without a heartbeat.
    pub fn node_ttl(&self) -> Duration {
        self.heartbeat_interval * self.missed_heartbeats.max(1)
    }
}

const MAX_HANDLERS: usize = 256;
/// The window of an executor whose `Hello.max_concurrency` is 0: at most this many
/// runs leased to it at once (the Rust SDK sends the same figure).
pub const DEFAULT_WINDOW: u32 = 64;
/// The largest window a `Hello` may ask for.
const MAX_WINDOW: u32 = 10_000;
/// Messages read off a stream ahead of their handling.
const READ_AHEAD: usize = 1024;
/// Heartbeats read off a stream ahead of their answer.
const BEATS_AHEAD: usize = 64;
/// Messages handled per batch.
const BATCH: usize = 256;
/// Run reports of one stream in the store at once.
const REPORT_CONCURRENCY: usize = 8;
/// Runs one heartbeat or hello may list.
const MAX_IN_FLIGHT: usize = 10_000;
/// Lines in one `LogLines` message, and bytes in one line (longer ones are cut).
const MAX_LOG_LINES: usize = 1_000;
const MAX_LOG_LINE_BYTES: usize = 8 * 1024;
/// A result's output past this is not stored: the attempt fails "output_too_large".
pub const MAX_OUTPUT_BYTES: usize = 1024 * 1024;
/// A result's `error_message` and `error_code` are cut to these.
const MAX_ERROR_MESSAGE_BYTES: usize = 8 * 1024;
const MAX_ERROR_CODE_BYTES: usize = 128;
/// A hello's labels: at most this many, keys and values at most this long.
const MAX_LABELS: usize = 64;
const MAX_LABEL_KEY_BYTES: usize = 128;
const MAX_LABEL_VALUE_BYTES: usize = 1024;
/// Reports about runs the stream's node does not hold (or unknown runs) one stream may
/// make before it is closed: a live executor makes none, short of a run moved twice
/// between two of its reports; a stream guessing other nodes' runs is cut off.
pub const MAX_FOREIGN_REPORTS: u32 = 32;

/// A node's health figures are written to the registry at most this often besides its
/// heartbeats.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// The store traits the executor streams use.
#[derive(Clone)]
pub struct ExecutorStore {
    /// What a stream reports about runs: started, renewed, finished, progress, logs.
    pub runs: Arc<dyn RunStore>,
    /// The node registry: a stream's node, and `ListNodes`.
    pub nodes: Arc<dyn NodeRegistry>,
}

/// `ExecutorService` and `NodeService` over the store's registry.
#[derive(Clone)]
pub struct Executors {
    store: ExecutorStore,
    opts: ExecutorOptions,
    links: Arc<Links>,
    router: Arc<Router>,
    shutdown: CancellationToken,
    /// Checks the executor token of each hello.
    auth: Arc<Authenticator>,
    /// This instance's webhook worker: a stream's results have the store claim their
    /// webhooks for it while it has room, and hand them over (`finish_many`).
    webhooks: Option<Arc<Deliveries>>,
}

impl Executors {
    pub fn new(
        store: ExecutorStore,
        opts: ExecutorOptions,
        links: Arc<Links>,
        router: Arc<Router>,
        shutdown: CancellationToken,
        auth: Arc<Authenticator>,
    ) -> Self {
        Self {
            store,
            opts,
            links,
            router,
            shutdown,
            auth,
            webhooks: None,
        }
    }

    /// The webhooks a stream's results make due are claimed for `deliveries` in the
    /// step that applies them and handed to it, instead of waiting for its sweep.
    pub fn with_webhooks(mut self, deliveries: Arc<Deliveries>) -> Self {
        self.webhooks = Some(deliveries);
        self
    }
}

/// Validates a hello into the node it registers.
fn node_from_hello(h: pb::Hello, instance: &str) -> Result<NodeRecord, Status> {
    let invalid =
        |field: &str, reason: &str| Status::invalid_argument(format!("hello.{field}: {reason}"));
    if !valid_job_id(&h.node_id) {
        return Err(invalid(
            "node_id",
            "required, must match [A-Za-z0-9._-]{1,128}, not . or ..",
        ));
    }
    if !valid_job_id(&h.group) {
        return Err(invalid(
            "group",
            "required, must match [A-Za-z0-9._-]{1,128}, not . or ..",
        ));
    }
    if h.max_concurrency > MAX_WINDOW {
        return Err(invalid(
            "max_concurrency",
            "at most 10000 (0 = the default, 64)",
        ));
    }
    if h.handlers.is_empty() {
        return Err(invalid("handlers", "at least one handler is required"));
    }
    if h.handlers.len() > MAX_HANDLERS {
        return Err(invalid("handlers", "more than 256 handlers"));
    }
    if h.handlers.iter().any(|x| x.is_empty() || x.len() > 128) {
        return Err(invalid(
            "handlers",
            "each handler name must be 1 to 128 bytes",
        ));
    }
    if h.labels.len() > MAX_LABELS {
        return Err(invalid("labels", "more than 64 labels"));
    }
    if h.labels.iter().any(|(k, v)| {
        k.is_empty() || k.len() > MAX_LABEL_KEY_BYTES || v.len() > MAX_LABEL_VALUE_BYTES
    }) {
        return Err(invalid(
            "labels",
            "each key must be 1 to 128 bytes and each value at most 1024",
        ));
    }
    Ok(NodeRecord {
        node_id: h.node_id,
        group: h.group,
        handlers: h.handlers,
        weight: h.weight.max(1),
        max_concurrency: match h.max_concurrency {
            0 => DEFAULT_WINDOW,
            n => n,
        },
        labels: h.labels.into_iter().collect(),
        instance: instance.to_owned(),
        session: uuid::Uuid::now_v7().simple().to_string(),
        ready: true,
        draining: false,
        silent_since: 0,
        on_probation: false,
        active: 0,
        leased: 0,
        load: 0.0,
        mean_duration_ms: 0,
        recent_errors: 0,
        recent_results: 0,
        recent_faults: 0,
        by_handler: Vec::new(),
        connected_at: now_ms(),
        last_heartbeat: 0,
    })
}

fn out(msg: Out) -> Outgoing {
    Box::new(Ok(pb::ServerMessage { msg: Some(msg) }))
}

/// The status that ends a stream, as its last item.
fn end(status: Status) -> Outgoing {
    Box::new(Err(status))
}

type ConnectStream = Pin<Box<dyn Stream<Item = Result<pb::ServerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl ExecutorService for Executors {
    type ConnectStream = ConnectStream;

    async fn connect(
        &self,
        req: Request<Streaming<pb::ExecutorMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        // A server shutting down has told its executors to go away: a new stream now
        // would only be told the same (a reconnect storm while it drains).
        if self.shutdown.is_cancelled() {
            info!("hello refused: this server is shutting down");
            return Err(Status::unavailable(
                "this server is shutting down: connect to another endpoint, with backoff",
            ));
        }
        let mut inbound = req.into_inner();
        let first = tokio::time::timeout(self.opts.hello_timeout, inbound.message())
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "hello: not received within {:?}",
                    self.opts.hello_timeout
                ))
            })??;
        let mut hello = match first.and_then(|m| m.msg) {
            Some(Msg::Hello(h)) => h,
            Some(_) => {
                return Err(Status::failed_precondition(
                    "hello: the first message on the stream must be hello",
                ));
            }
            None => return Err(Status::invalid_argument("hello: no message")),
        };
        // The token is checked before anything else is looked at or stored, and is
        // not kept.
        let token = std::mem::take(&mut hello.token);
        self.auth.check_executor(&hello.group, &token)?;
        drop(token);
        if hello.in_flight.len() > MAX_IN_FLIGHT {
            return Err(Status::invalid_argument(format!(
                "hello.in_flight: more than {MAX_IN_FLIGHT} runs"
            )));
        }
        let in_flight = hello.in_flight.clone();
        let node = node_from_hello(hello, &self.opts.instance_id)?;
        let registered = self
            .store
            .nodes
            .register_node(node.clone(), self.opts.node_ttl())
            .await?;
        if let Registered::OtherGroup(_) = registered {
            warn!(node_id = %node.node_id, group = %node.group, "hello refused: the node id is registered by an executor of another group");
            return Err(Status::permission_denied(format!(
                "hello.node_id: {:?} is connected as an executor of another group",
                node.node_id
            )));
        }
        // Runs it still holds from an earlier stream keep their leases if they are
        // still its own; the rest are named so the executor stops them.
        let (_, gone) = self.renew(&node.node_id, in_flight).await?;
        info!(node_id = %node.node_id, group = %node.group, handlers = ?node.handlers, "executor connected");
        let (tx, rx) = mpsc::channel(1024);
        let welcome = pb::Welcome {
            server_instance: self.opts.instance_id.clone(),
            heartbeat_interval_ms: duration_ms(self.opts.heartbeat_interval),
            lease_ttl_ms: duration_ms(self.opts.lease_ttl),
            unknown_in_flight: gone,
        };
        tx.send(out(Out::Welcome(welcome)))
            .await
            .map_err(|_| Status::cancelled("executor left"))?;
        let liveness = Arc::new(Liveness::new(Instant::now()));
        let conn = self
            .links
            .attach(&node.node_id, tx.clone(), liveness.clone());
        let span = info_span!("executor", node_id = %node.node_id);
        // One copy of the service per stream, shared by its four tasks (each held a
        // copy of its options before).
        tokio::spawn(
            Arc::new(self.clone())
                .session(node, (conn, liveness), inbound, tx)
                .instrument(span),
        );
        Ok(Response::new(Box::pin(ReceiverStream::new(rx).map(|m| *m))))
    }
}

impl Executors {
    /// Serves one stream after the handshake until it ends, goes silent, misbehaves or
    /// the server shuts down; then takes the node out of the registry.
    ///
    /// Reading never waits for the store: a reader task takes every message off the
    /// stream as it arrives (so a node that keeps talking is never taken for silent,
    /// however far its reports are behind), and this loop handles them in batches, the
    /// run reports of a batch concurrently ([`Executors::handle_batch`]).
    async fn session(
        self: Arc<Self>,
        node: NodeRecord,
        (conn, liveness): (u64, Arc<Liveness>),
        inbound: Streaming<pb::ExecutorMessage>,
        tx: StreamSender,
    ) {
        let node_id = node.node_id.clone();
        let state = Arc::new(Mutex::new(NodeState {
            node,
            window: ResultWindow::default(),
            liveness: liveness.clone(),
            published: Instant::now(),
            foreign_reports: 0,
        }));
        let (read_tx, mut read_rx) = mpsc::channel(READ_AHEAD);
        let (beats_tx, beats_rx) = mpsc::channel(BEATS_AHEAD);
        let stop_reading = CancellationToken::new();
        tokio::spawn(
            self.clone()
                .read_stream(
                    inbound,
                    (read_tx.clone(), beats_tx),
                    liveness.clone(),
                    stop_reading.clone(),
                )
                .in_current_span(),
        );
        tokio::spawn(
            self.clone()
                .watch_silence(state.clone(), stop_reading.clone())
                .in_current_span(),
        );
        tokio::spawn(
            self.clone()
                .answer_heartbeats(beats_rx, state.clone(), tx.clone(), read_tx)
                .in_current_span(),
        );
        // Grown by the messages read; let go when nothing more waits, so an idle stream
        // holds no buffer (256 slots were 4 KiB per stream, a ninth of its memory).
        let mut batch = Vec::new();
        loop {
            if read_rx.is_empty() {
                batch = Vec::new();
            }
            let got = tokio::select! {
                () = self.shutdown.cancelled() => {
                    let _ = tx.send(out(Out::GoAway(pb::GoAway {
                        reason: "server shutting down".into(),
                        endpoints: Vec::new(),
                    }))).await;
                    break;
                }
                () = tx.closed() => break,
                n = read_rx.recv_many(&mut batch, BATCH) => n,
            };
            if got == 0 {
                break;
            }
            let mut msgs = Vec::with_capacity(batch.len());
            let mut ended = None;
            for item in batch.drain(..) {
                match item {
                    Read::Message(m) => msgs.push(*m),
                    Read::Ended(status) => {
                        ended = Some(status);
                        break;
                    }
                }
            }
            // Boxed, as are the heartbeat's and the silence check's work: the state of an
            // await lives in its task for the stream's whole life, and an idle stream
            // should hold only what waiting needs.
            let handled = Box::pin(self.handle_batch(&state, msgs, &tx)).await;
            if let Err(status) = handled {
                warn!(%status, "executor protocol error; closing its stream");
                let _ = tx.send(end(status)).await;
                break;
            }
            if let Some(status) = ended {
                // Say why, in case the executor is still listening.
                if let Some(status) = status {
                    let _ = tx.send(end(status)).await;
                }
                break;
            }
        }
        stop_reading.cancel();
        self.links.detach(&node_id, conn);
        // The executor left (it died, or closed its stream): what it held fails over
        // after the grace unless it comes back for it. When this server is the one
        // going away, its executors reconnect elsewhere and keep their full leases.
        let leases_within = (!self.shutdown.is_cancelled()).then_some(self.opts.disconnect_grace);
        let node = lock(&state).node.clone();
        match self.store.nodes.remove_node(&node, leases_within).await {
            Ok(r) if r.leases_shortened > 0 => info!(
                leases = r.leases_shortened,
                grace = ?self.opts.disconnect_grace,
                "executor disconnected holding runs; they fail over unless it is back within the grace"
            ),
            Ok(_) => info!("executor disconnected"),
            Err(e) => warn!(error = %e, "could not unregister the executor; it expires by itself"),
        }
    }

    /// Takes every message off the stream as it arrives, until the stream ends, stays
    /// silent for the node's TTL, or the session stops reading (`stop`) or listening.
    /// It never waits for the store: heartbeats go to their own task (they keep the
    /// node's registry entry and leases alive, so they never wait behind other
    /// messages' store calls), everything else to the session, in order. Each message
    /// is noted in `liveness` as it arrives, with the runs it answers for.
    async fn read_stream(
        self: Arc<Self>,
        mut inbound: Streaming<pb::ExecutorMessage>,
        (to_session, beats): (mpsc::Sender<Read>, mpsc::Sender<Box<pb::Heartbeat>>),
        liveness: Arc<Liveness>,
        stop: CancellationToken,
    ) {
        let silence = self.opts.node_ttl();
        loop {
            let next = tokio::select! {
                () = stop.cancelled() => return,
                m = tokio::time::timeout(silence, inbound.message()) => m,
            };
            if let Ok(Ok(Some(m))) = &next {
                note_answers(&liveness, m);
            }
            let item = match next {
                Err(_) => {
                    warn!(?silence, "executor silent; closing its stream");
                    Read::Ended(Some(Status::deadline_exceeded(format!(
                        "heartbeat: none within {silence:?}"
                    ))))
                }
                Ok(Err(status)) => {
                    // A message that could not be read (too large, undecodable) ends
                    // the stream.
                    debug!(%status, "executor stream failed");
                    Read::Ended(Some(status))
                }
                Ok(Ok(None)) => Read::Ended(None),
                Ok(Ok(Some(pb::ExecutorMessage {
                    msg: Some(Msg::Heartbeat(hb)),
                }))) => {
                    if beats.send(Box::new(hb)).await.is_err() {
                        return;
                    }
                    continue;
                }
                Ok(Ok(Some(m))) => Read::Message(Box::new(m)),
            };
            let last = matches!(item, Read::Ended(_));
            if to_session.send(item).await.is_err() || last {
                return;
            }
        }
    }

    /// Until the session stops (`stop`): puts the ends of runs the ledger saw into the
    /// health window, and checks, four times per `silent_after` (unless it is zero: the
    /// rule is off), whether the node went silent ([`Liveness::check`]). When it does,
    /// it is marked so in the registry (no instance routes to it) and every dispatch it
    /// left unanswered is taken back and routed again; heard from again, it is marked
    /// answering.
    async fn watch_silence(self: Arc<Self>, state: Arc<Mutex<NodeState>>, stop: CancellationToken) {
        let liveness = lock(&state).liveness.clone();
        let after = self.opts.silent_after;
        let period = if after.is_zero() {
            Duration::from_millis(250)
        } else {
            (after / 4).max(Duration::from_millis(10))
        };
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            Box::pin(self.check_silence(&state, &liveness)).await;
        }
    }

    /// One pass of [`Executors::watch_silence`].
    async fn check_silence(&self, state: &Mutex<NodeState>, liveness: &Liveness) {
        self.note_ends(state).await;
        let after = self.opts.silent_after;
        if after.is_zero() {
            return;
        }
        let verdict = liveness.check(Instant::now(), after);
        if let Some(silent) = verdict.turned {
            self.mark_silent(state, silent).await;
        }
        let runs = verdict.take_back.len();
        let taken: usize = futures::stream::iter(verdict.take_back)
            .map(|run| self.take_back(state, run))
            .buffer_unordered(REPORT_CONCURRENCY)
            .map(usize::from)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .sum();
        if runs > 0 {
            info!(
                unanswered = runs,
                taken_back = taken,
                "dispatches of a silent executor taken back; routing them elsewhere"
            );
        }
    }

    /// Puts the ends of runs seen on the way out (leases lost, attempts timed out) into
    /// the node's health window.
    async fn note_ends(&self, state: &Mutex<NodeState>) {
        let noted = {
            let mut st = lock(state);
            let noted = st.liveness.take_noted();
            let now = now_ms();
            for (handler, kind) in &noted {
                st.window
                    .record(now, handler.as_ref().map(|h| h.to_string()), *kind, None);
            }
            noted.len()
        };
        if noted > 0
            && let Err(e) = self.publish_figures(state, false).await
        {
            debug!(error = %e, "could not publish the node's figures; its next heartbeat does");
        }
    }

    /// Publishes that the node turned silent (or answers again), so that routing on
    /// every instance leaves it out (or takes it back in); this instance's routing
    /// re-reads the registry at once.
    async fn mark_silent(&self, state: &Mutex<NodeState>, silent: bool) {
        let node = {
            let mut st = lock(state);
            st.node.silent_since = if silent { now_ms().max(1) } else { 0 };
            st.node.clone()
        };
        if silent {
            warn!(after = ?self.opts.silent_after, "executor silent: a dispatch unanswered and nothing heard from it; no new work for it until it answers");
        } else {
            info!("executor answers again; it gets work again");
        }
        match self
            .store
            .nodes
            .refresh_node(node, self.opts.node_ttl())
            .await
        {
            // Superseded meanwhile: the newer stream's record stands; this stream's next
            // heartbeat ends it.
            Ok(_) => self.router.nodes_changed().await,
            Err(e) => {
                warn!(error = %e, "could not publish the executor's silence; its dispatches are still taken back")
            }
        }
    }

    /// Takes back one dispatch the silent node left unanswered, if it is still
    /// unconfirmed (a `Started` applied first keeps it), and routes the run again.
    /// Whether it was taken back.
    async fn take_back(&self, state: &Mutex<NodeState>, run: pb::RunRef) -> bool {
        let taken = self
            .store
            .runs
            .take_back_unconfirmed(&stored_id(&run), &holder(state, &run))
            .await;
        match taken {
            Ok(t) if t.applied == Applied::Yes => {
                debug!(schedule_id = %run.schedule_id, token = run.fencing_token, "dispatch taken back from a silent executor");
                self.router.taken_back();
                self.spawn_follow_up(t);
                true
            }
            Ok(_) => false,
            Err(e) => {
                // Its confirm deadline takes it back instead.
                warn!(schedule_id = %run.schedule_id, error = %e, "could not take back a silent executor's dispatch");
                false
            }
        }
    }

    /// Answers the stream's heartbeats in order until the stream ends; a heartbeat
    /// that is refused (malformed, or the store failed) ends the session.
    async fn answer_heartbeats(
        self: Arc<Self>,
        mut beats: mpsc::Receiver<Box<pb::Heartbeat>>,
        state: Arc<Mutex<NodeState>>,
        replies: StreamSender,
        session: mpsc::Sender<Read>,
    ) {
        while let Some(hb) = beats.recv().await {
            match Box::pin(self.heartbeat(&state, *hb)).await {
                Ok(go_away @ Out::GoAway(_)) => {
                    // Superseded by a newer stream of the node: it holds the node's
                    // registration and runs now; this stream ends without removing them.
                    let _ = replies.send(out(go_away)).await;
                    let _ = session.send(Read::Ended(None)).await;
                    return;
                }
                Ok(ack) => {
                    if replies.send(out(ack)).await.is_err() {
                        return;
                    }
                }
                Err(status) => {
                    warn!(%status, "heartbeat refused; closing the stream");
                    let _ = session.send(Read::Ended(Some(status))).await;
                    return;
                }
            }
        }
    }

    /// A heartbeat: the node's registry entry is refreshed (readiness, activity,
    /// health window) and exactly the listed leases renewed; the ack says what is left
    /// of each.
    async fn heartbeat(&self, state: &Mutex<NodeState>, hb: pb::Heartbeat) -> Result<Out, Status> {
        if hb.in_flight.len() > MAX_IN_FLIGHT {
            return Err(Status::invalid_argument(format!(
                "heartbeat.in_flight: more than {MAX_IN_FLIGHT} runs"
            )));
        }
        let node = {
            let mut st = lock(state);
            st.published = Instant::now();
            let NodeState { node, window, .. } = &mut *st;
            node.ready = !hb.not_ready;
            node.draining = self.links.draining(&node.node_id);
            node.active = hb.active;
            window.apply(node, now_ms(), self.opts.health.window);
            node.load = if hb.load.is_finite() { hb.load } else { 0.0 };
            node.clone()
        };
        let node_id = node.node_id.clone();
        match self
            .store
            .nodes
            .refresh_node(node, self.opts.node_ttl())
            .await?
        {
            Registered::Yes => {}
            Registered::Superseded => {
                info!("the node connected again on another stream; ending this one");
                return Ok(Out::GoAway(pb::GoAway {
                    reason: "superseded: this node_id connected again on another stream".into(),
                    endpoints: Vec::new(),
                }));
            }
            Registered::OtherGroup(_) => {
                return Err(Status::permission_denied(
                    "hello.node_id: registered meanwhile by an executor of another group",
                ));
            }
        }
        let (leases, _) = self.renew(&node_id, hb.in_flight).await?;
        Ok(Out::HeartbeatAck(pb::HeartbeatAck { leases }))
    }

    /// Handles a batch of messages in their order, except that each stretch of run
    /// reports (`Started`, `Result`, `Progress`, `Logs`) naming distinct runs goes to
    /// the store at once: its `Started` reports in one call, its results in another,
    /// its log lines in a third (then its progress, [`REPORT_CONCURRENCY`] at a
    /// time), side by side; a report never overtakes an earlier message about the
    /// same run. Replies are sent on `tx` as soon as their store call is done (a
    /// `StartAck` never waits for a `ResultAck`); the status that ends the stream if
    /// one message did. A stream whose receiving side is gone stops being answered.
    async fn handle_batch(
        &self,
        state: &Mutex<NodeState>,
        msgs: Vec<pb::ExecutorMessage>,
        tx: &StreamSender,
    ) -> Result<(), Status> {
        let send = |replies: Vec<Out>| async move {
            for r in replies {
                if tx.send(out(r)).await.is_err() {
                    return false;
                }
            }
            true
        };
        for stretch in stretches(msgs) {
            let reports = match stretch {
                Stretch::One(m) => {
                    if !send(self.handle(state, m).await?).await {
                        return Ok(());
                    }
                    continue;
                }
                Stretch::Reports(reports) => reports,
            };
            // The stretch's `Started` reports go to the store in one call, its results
            // in another, its log lines in a third (then its progress, a few at a time),
            // side by side.
            let (starts, rest): (Vec<_>, Vec<_>) = reports
                .into_iter()
                .partition(|m| matches!(m.msg, Some(Msg::Started(_))));
            let (results, rest): (Vec<_>, Vec<_>) = rest
                .into_iter()
                .partition(|m| matches!(m.msg, Some(Msg::Result(_))));
            let (logs, progress): (Vec<_>, Vec<_>) = rest
                .into_iter()
                .partition(|m| matches!(m.msg, Some(Msg::Logs(_))));
            let started =
                async { Ok::<_, Status>(send(self.start_many(state, starts).await?).await) };
            let reported =
                async { Ok::<_, Status>(send(self.finish_many(state, results).await?).await) };
            let noted = async {
                self.append_many(state, logs).await?;
                let mut noted = futures::stream::iter(progress)
                    .map(|m| self.handle(state, m))
                    .buffer_unordered(REPORT_CONCURRENCY);
                while let Some(replies) = noted.next().await {
                    if !send(replies?).await {
                        return Ok(false);
                    }
                }
                Ok::<_, Status>(true)
            };
            let (started, reported, noted) = futures::try_join!(started, reported, noted)?;
            if !started || !reported || !noted {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Renews the listed leases held by `node_id`: the lease statuses, and the runs
    /// whose lease is gone.
    async fn renew(
        &self,
        node_id: &str,
        runs: Vec<pb::RunRef>,
    ) -> Result<(Vec<pb::LeaseStatus>, Vec<pb::RunRef>), Status> {
        if runs.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let held: Vec<Held> = runs
            .iter()
            .map(|r| Held {
                schedule_id: stored_id(r),
                token: r.fencing_token,
            })
            .collect();
        let remaining = self
            .store
            .runs
            .renew_leases(node_id, &held, self.opts.lease_ttl)
            .await?;
        let mut statuses = Vec::with_capacity(runs.len());
        let mut gone = Vec::new();
        for (run, left) in runs.into_iter().zip(remaining) {
            if left.is_none() {
                gone.push(run.clone());
            }
            statuses.push(pb::LeaseStatus {
                run: Some(run),
                remaining_ms: left.unwrap_or(0),
            });
        }
        Ok((statuses, gone))
    }

    /// One message after the handshake: the replies to send, or the status that ends
    /// the stream. Store failures end the stream too (the executor reconnects and
    /// re-sends what was not acknowledged).
    async fn handle(
        &self,
        state: &Mutex<NodeState>,
        msg: pb::ExecutorMessage,
    ) -> Result<Vec<Out>, Status> {
        match msg.msg {
            None => Err(Status::invalid_argument("message: empty")),
            Some(Msg::Hello(_)) => Err(Status::failed_precondition(
                "hello: sent twice on one stream",
            )),
            Some(Msg::Heartbeat(hb)) => Ok(vec![self.heartbeat(state, hb).await?]),
            // A report naming no run (any other is handled in a stretch): refused as
            // the stretch's call would refuse it.
            Some(m @ Msg::Started(_)) => {
                self.start_many(state, vec![pb::ExecutorMessage { msg: Some(m) }])
                    .await
            }
            Some(m @ Msg::Result(_)) => {
                self.finish_many(state, vec![pb::ExecutorMessage { msg: Some(m) }])
                    .await
            }
            Some(m @ Msg::Logs(_)) => {
                self.append_many(state, vec![pb::ExecutorMessage { msg: Some(m) }])
                    .await?;
                Ok(Vec::new())
            }
            Some(Msg::Progress(p)) => {
                let run = run_ref(p.run, "progress")?;
                let mut message = p.message;
                truncate_utf8(&mut message, MAX_LOG_LINE_BYTES);
                let applied = self
                    .store
                    .runs
                    .report_progress(
                        &stored_id(&run),
                        &holder(state, &run),
                        p.percent.min(100),
                        &message,
                    )
                    .await?;
                self.count_refusal(state, &run, &applied)?;
                Ok(Vec::new())
            }
            Some(Msg::Reject(r)) => {
                let run = run_ref(r.run, "reject")?;
                let mut reason = r.reason;
                truncate_utf8(&mut reason, 256);
                let outcome = Outcome {
                    state: RunState::Waiting,
                    output: None,
                    error_code: "rejected".into(),
                    error_message: reason,
                    started_at: None,
                    finished_at: None,
                };
                let t = self
                    .store
                    .runs
                    .finish_run(
                        &stored_id(&run),
                        Finisher::Holder(holder(state, &run)),
                        outcome,
                    )
                    .await?;
                self.count_refusal(state, &run, &t.applied)?;
                if t.applied == Applied::Yes {
                    debug!(schedule_id = %run.schedule_id, "dispatch rejected; routing it again");
                    self.spawn_follow_up(t);
                }
                Ok(Vec::new())
            }
        }
    }

    /// The replies to a `Started` the store answered `applied`: the go-ahead, or its
    /// refusal and a `Cancel`.
    fn started(&self, run: pb::RunRef, applied: Applied) -> Reported {
        let why = match applied {
            Applied::Yes | Applied::Already => {
                return Reported::Started {
                    reply: vec![Out::StartAck(pb::StartAck {
                        run: Some(run),
                        go: true,
                        reason: String::new(),
                    })],
                    refused: None,
                };
            }
            Applied::No(why) => why,
        };
        if !is_foreign(&why) {
            // A dispatch that waited past its lease (e.g. unread in a frozen
            // process): the handler must not start.
            info!(schedule_id = %run.schedule_id, token = run.fencing_token, %why, "start refused: the lease is gone");
            self.router.start_refused();
        }
        let reason = format!("no lease for this run: {why}");
        Reported::Started {
            reply: vec![
                Out::StartAck(pb::StartAck {
                    run: Some(run.clone()),
                    go: false,
                    reason: reason.clone(),
                }),
                // For executors that start without waiting for the answer.
                Out::Cancel(pb::Cancel {
                    run: Some(run),
                    reason,
                }),
            ],
            refused: Some(why),
        }
    }

    /// A stretch's `Started` reports in one store call (`mark_started_many`), each
    /// answered with [`started`](Self::started); the replies in order.
    async fn start_many(
        &self,
        state: &Mutex<NodeState>,
        msgs: Vec<pb::ExecutorMessage>,
    ) -> Result<Vec<Out>, Status> {
        let runs = msgs
            .into_iter()
            .map(|m| match m.msg {
                Some(Msg::Started(s)) => run_ref(s.run, "started"),
                _ => Err(Status::internal("start_many: not a Started")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let reports: Vec<(String, Holder)> = runs
            .iter()
            .map(|run| (stored_id(run), holder(state, run)))
            .collect();
        let answers = self.store.runs.mark_started_many(&reports).await?;
        let mut out = Vec::with_capacity(runs.len());
        for (run, applied) in runs.into_iter().zip(answers) {
            out.extend(self.settle(state, self.started(run, applied)).await?);
        }
        Ok(out)
    }

    /// A stretch's `Result` reports in one store call (`finish_runs`), each settled
    /// with [`settle`](Self::settle); the replies in order.
    async fn finish_many(
        &self,
        state: &Mutex<NodeState>,
        msgs: Vec<pb::ExecutorMessage>,
    ) -> Result<Vec<Out>, Status> {
        if msgs.is_empty() {
            return Ok(Vec::new());
        }
        let mut reads = Vec::with_capacity(msgs.len());
        let mut finishes = Vec::with_capacity(msgs.len());
        let claim = self
            .webhooks
            .as_ref()
            .and_then(|w| w.claim_lease_for(msgs.len()));
        for m in msgs {
            let Some(Msg::Result(r)) = m.msg else {
                return Err(Status::internal("finish_many: not a Result"));
            };
            let (run, mut finish, ended_as, duration) = result_of(state, r)?;
            finish.claim_webhook = claim;
            reads.push((run, ended_as, duration));
            finishes.push(finish);
        }
        let mut answers = self.store.runs.finish_runs(finishes).await?;
        if let Some(webhooks) = &self.webhooks {
            webhooks.hand_over(
                answers
                    .iter_mut()
                    .filter_map(|t| t.webhook.take())
                    .collect(),
            );
        }
        let mut out = Vec::with_capacity(reads.len());
        for ((run, state_of_run, duration), t) in reads.into_iter().zip(answers) {
            let r = Reported::Finished {
                run,
                t: Box::new(t),
                state: state_of_run,
                duration,
            };
            out.extend(self.settle(state, r).await?);
        }
        Ok(out)
    }

    /// A stretch's `Logs` messages in one store call (`append_logs_many`), each refusal
    /// counted as a progress report's is (log lines get no reply).
    async fn append_many(
        &self,
        state: &Mutex<NodeState>,
        msgs: Vec<pb::ExecutorMessage>,
    ) -> Result<(), Status> {
        if msgs.is_empty() {
            return Ok(());
        }
        let mut runs = Vec::with_capacity(msgs.len());
        let mut batches = Vec::with_capacity(msgs.len());
        for m in msgs {
            let Some(Msg::Logs(l)) = m.msg else {
                return Err(Status::internal("append_many: not a Logs"));
            };
            let (run, batch) = log_batch_of(state, l)?;
            runs.push(run);
            batches.push(batch);
        }
        let answers = self
            .store
            .runs
            .append_logs_many(batches, self.opts.max_log_bytes)
            .await?;
        for (run, applied) in runs.iter().zip(&answers) {
            self.count_refusal(state, run, applied)?;
        }
        Ok(())
    }

    /// What a run report leaves for the stream: the reply, and for an applied result
    /// the node's health window and the attempt's follow-up.
    async fn settle(&self, state: &Mutex<NodeState>, r: Reported) -> Result<Vec<Out>, Status> {
        let (run, t, ended_as, duration) = match r {
            Reported::Started { reply, refused } => {
                if let Some(why) = refused {
                    self.count_foreign(state, &why)?;
                }
                return Ok(reply);
            }
            Reported::Finished {
                run,
                t,
                state,
                duration,
            } => (run, t, state, duration),
        };
        if t.applied == Applied::Yes {
            crate::fault::crash_point("run.after_finish");
        }
        let (accepted, reason) = match &t.applied {
            Applied::Yes => (true, String::new()),
            Applied::Already => (true, "already recorded".to_owned()),
            Applied::No(why) => (false, why.clone()),
        };
        if !accepted {
            info!(schedule_id = %run.schedule_id, token = run.fencing_token, %reason, "result refused");
            self.count_foreign(state, &reason)?;
        }
        if t.applied == Applied::Yes {
            let (node_id, on, failures, passed) = {
                let mut st = lock(state);
                let handler = st.liveness.finished(&run).map(|h| h.to_string());
                let kind = if ended_as == RunState::Succeeded {
                    health::Kind::Ok
                } else {
                    health::Kind::Error
                };
                st.window.record(now_ms(), handler, kind, duration);
                let node = &st.node;
                self.router
                    .run_ended_on(&node.node_id, &node.group, &node.handlers);
                (
                    node.node_id.clone(),
                    node.on_probation,
                    st.window.has_failures(),
                    st.window.passed_probation(),
                )
            };
            let changed = self.probation(state, &node_id, on, failures, passed).await;
            self.publish_figures(state, changed).await?;
            if changed {
                self.router.nodes_changed().await;
            }
            self.spawn_follow_up(*t);
        }
        Ok(vec![Out::ResultAck(pb::ResultAck {
            run: Some(run),
            accepted,
            reason,
        })])
    }

    /// Publishes the node's health figures in the registry, at most once per
    /// [`PUBLISH_EVERY`] besides the heartbeats, so routing on every instance judges
    /// by recent figures sooner than the next heartbeat.
    async fn publish_figures(&self, state: &Mutex<NodeState>, now: bool) -> Result<(), Status> {
        let node = {
            let mut st = lock(state);
            if !now && st.published.elapsed() < PUBLISH_EVERY {
                return Ok(());
            }
            st.published = Instant::now();
            let NodeState { node, window, .. } = &mut *st;
            window.apply(node, now_ms(), self.opts.health.window);
            node.clone()
        };
        // A stream superseded meanwhile publishes nothing; its next heartbeat ends it.
        self.store
            .nodes
            .refresh_node(node, self.opts.node_ttl())
            .await?;
        Ok(())
    }

    /// A node routing judges FAILING goes on probation: judged FAILING (and probed)
    /// until its last [`health::PROBATION`] results (its probes) all succeeded, when its
    /// window forgets its failures (`health::probation`). Whether its record changed
    /// (then published at once). `on`: on probation; `failures`: its window holds
    /// some (else it cannot be dropped, and routing's judgement is not asked);
    /// `passed`: its last results all succeeded.
    async fn probation(
        &self,
        state: &Mutex<NodeState>,
        node_id: &str,
        on: bool,
        failures: bool,
        passed: bool,
    ) -> bool {
        let failing =
            !on && failures && self.router.judged_health(node_id).await == Some(Health::Failing);
        match health::probation(on, failing, passed) {
            health::Probation::Stay => false,
            health::Probation::Begin => {
                lock(state).node.on_probation = true;
                info!(
                    probes = health::PROBATION,
                    "a failing executor is dropped: on probation until its probes succeed"
                );
                true
            }
            health::Probation::Pass => {
                let mut st = lock(state);
                st.window.forgive();
                st.node.on_probation = false;
                info!(
                    probes = health::PROBATION,
                    "a failing executor's probes succeeded; its failures are forgiven"
                );
                true
            }
        }
    }

    /// Counts a report the store refused, if it was refused as foreign.
    fn count_refusal(
        &self,
        state: &Mutex<NodeState>,
        run: &pb::RunRef,
        applied: &Applied,
    ) -> Result<(), Status> {
        match applied {
            Applied::No(why) if is_foreign(why) => {
                debug!(schedule_id = %run.schedule_id, %why, "report refused");
                self.count_foreign(state, why)
            }
            _ => Ok(()),
        }
    }

    /// A report refused because this stream's node does not hold the run (or the run
    /// is unknown): counted in `sundial_foreign_reports_total`, logged once per stream;
    /// past [`MAX_FOREIGN_REPORTS`] the stream is closed (`PERMISSION_DENIED`).
    fn count_foreign(&self, state: &Mutex<NodeState>, why: &str) -> Result<(), Status> {
        if !is_foreign(why) {
            return Ok(());
        }
        self.router.foreign_report();
        let n = {
            let mut st = lock(state);
            st.foreign_reports = st.foreign_reports.saturating_add(1);
            st.foreign_reports
        };
        if n == 1 {
            warn!(reason = %why, "executor reported about a run its node does not hold; refused (logged once per stream)");
        }
        if n > MAX_FOREIGN_REPORTS {
            return Err(Status::permission_denied(format!(
                "run reports: more than {MAX_FOREIGN_REPORTS} about runs this node does not hold"
            )));
        }
        Ok(())
    }

    /// Routes what a finished or rejected attempt left behind, off the stream's task;
    /// a run's common end, which leaves nothing to wait on, is counted here instead
    /// (a task per result cost more than the counting).
    fn spawn_follow_up(&self, t: crate::store::Transition) {
        let route = t
            .run
            .as_ref()
            .filter(|r| {
                r.state == RunState::Waiting
                    && (r.reason.starts_with("rejected") || r.reason == "unconfirmed")
            })
            .cloned();
        if route.is_none() && self.router.follow_up_at_once(&t) {
            return;
        }
        let router = self.router.clone();
        tokio::spawn(
            async move {
                router.follow_up(t).await;
                if let Some(run) = route {
                    router.route(run).await;
                }
            }
            .in_current_span(),
        );
    }
}

/// Notes a message that just arrived in the stream's liveness: the node was heard from,
/// and each run the message is about (a heartbeat: each it lists) is answered.
fn note_answers(liveness: &Liveness, m: &pb::ExecutorMessage) {
    liveness.heard(Instant::now());
    match &m.msg {
        Some(Msg::Started(pb::Started { run: Some(run) }))
        | Some(Msg::Reject(pb::Reject { run: Some(run), .. }))
        | Some(Msg::Result(pb::Result { run: Some(run), .. })) => liveness.answered(run),
        Some(Msg::Heartbeat(hb)) => liveness.listed(&hb.in_flight),
        _ => {}
    }
}

/// A message's run reference, which must name a run.
fn run_ref(r: Option<pb::RunRef>, what: &str) -> Result<pb::RunRef, Status> {
    r.filter(|r| !r.schedule_id.is_empty())
        .ok_or_else(|| Status::invalid_argument(format!("{what}.run: required")))
}

/// What the reader task hands the session (a message boxed: see [`Outgoing`]).
enum Read {
    Message(Box<pb::ExecutorMessage>),
    /// The stream ended: cleanly (None) or with the status to answer it with.
    Ended(Option<Status>),
}

/// A run report after its store call.
enum Reported {
    /// The replies to `Started`: the go-ahead, or its refusal (and why) and a `Cancel`.
    Started {
        reply: Vec<Out>,
        refused: Option<String>,
    },
    Finished {
        run: pb::RunRef,
        t: Box<crate::store::Transition>,
        state: RunState,
        duration: Option<u64>,
    },
}

/// What a stream's tasks share of its node: the registry record it keeps publishing
/// and the health window behind it.
struct NodeState {
    node: NodeRecord,
    window: ResultWindow,
    /// The stream's ledger: which handler each dispatch was for, the leases lost.
    liveness: Arc<Liveness>,
    /// When the node's figures were last written to the registry.
    published: Instant,
    /// Reports the store refused because this node does not hold the run.
    foreign_reports: u32,
}

/// The holder a stream's report names: the stream's node, and the token it quotes.
fn holder(state: &Mutex<NodeState>, run: &pb::RunRef) -> Holder {
    Holder {
        node_id: lock(state).node.node_id.clone(),
        token: run.fencing_token,
    }
}

/// A refusal that says the reporting node has no business with the run.
fn is_foreign(why: &str) -> bool {
    why == NOT_THE_HOLDER || why == UNKNOWN_RUN
}

/// The stored run an executor's reference names: a shard's own record when it names
/// a shard other than 0 (shard 0 travels under its parent's id; the store resolves it).
fn stored_id(r: &pb::RunRef) -> String {
    crate::model::RunRecord::held_id(&r.schedule_id, r.shard_index)
}

/// Cuts `s` to at most `max` bytes on a character boundary.
fn truncate_utf8(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
}
