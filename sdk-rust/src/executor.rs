//! [`Executor::run`]: the one loop that owns this process's runs for its whole life,
//! across connections. It dials servers through [`connection`], admits dispatches into
//! the [`RunTable`], asks the server for the go-ahead (`Started`, answered by
//! `StartAck`) and only then runs each handler as a task, forwards log lines and
//! results, renews and enforces leases, and drains on `Drain` or shutdown.
//! Handler tasks talk to it only through a channel (log lines, progress) and their
//! return value, so none of its state is shared or locked.
//!
//! While no server is connected the loop keeps going: handlers finish (their results
//! wait), log lines wait, and a lease that runs out cancels its handler.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use sundial_proto::v1 as pb;
use sundial_proto::v1::executor_message::Msg;
use sundial_proto::v1::server_message::Msg as In;
use tokio::sync::{mpsc, watch};
use tokio::task::{self, JoinError, JoinSet};
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::Error;
use crate::connection::{self, ClientTls, Closed, Dialer, Session};
use crate::context::{Note, RunContext};
use crate::handler::{Handler, Outcome, now_ms};
use crate::logs::LogBatcher;
use crate::runs::{Admission, Refusal, Renewal, RunKey, RunTable};

/// A batch of log lines goes out at this many lines …
const LOG_BATCH_LINES: usize = 100;
/// … or when its oldest line is this old.
const LOG_BATCH_DELAY: Duration = Duration::from_millis(100);
/// Lines kept per run while no server can be reached.
const LOG_LINES_OFFLINE: usize = 1_000;
/// The lease length assumed until a server says otherwise (runs only arrive after a
/// `Welcome`, which always says).
const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(15);

#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub endpoints: Vec<String>,
    /// Sent on every connection, with `in_flight` filled in at the time.
    pub hello: pb::Hello,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    pub shutdown_grace: Duration,
    /// For `https://` endpoints.
    pub tls: ClientTls,
}

/// The server an executor is connected to, as [`Executor::connected`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connected {
    /// The endpoint URL it dialled.
    pub endpoint: String,
    /// The instance name the server gave in its `Welcome`.
    pub server_instance: String,
}

/// An executor process: connects to a Sundial server, takes the runs dispatched to it
/// and executes them with its registered handlers. Build one with
/// [`Executor::builder`], then [`run`](Executor::run) it; see the crate docs.
#[derive(Debug)]
pub struct Executor {
    settings: Settings,
    handlers: HashMap<String, Handler>,
    connected: watch::Sender<Option<Connected>>,
}

/// Why one session ended.
enum Ended {
    /// Shutdown is complete (or its grace period is over).
    Shutdown,
    /// The server asked us to go elsewhere, perhaps to one of these.
    GoAway { suggested: Vec<String> },
    /// The stream broke; `welcomed` says whether it had been working.
    Lost { welcomed: bool, reason: String },
}

impl From<Closed> for Ended {
    fn from(_: Closed) -> Self {
        Ended::Lost {
            welcomed: true,
            reason: "stream closed".into(),
        }
    }
}

/// Something that needs the loop's attention, connected or not.
enum Event {
    ShutdownAsked,
    GraceOver,
    Finished(Result<(task::Id, Outcome), JoinError>),
    Note(Note),
    LeaseDue,
    LogsDue,
}

impl Executor {
    pub(crate) fn new(settings: Settings, handlers: HashMap<String, Handler>) -> Self {
        Self {
            settings,
            handlers,
            connected: watch::Sender::new(None),
        }
    }

    /// The node id this executor registers under.
    pub fn node_id(&self) -> &str {
        &self.settings.hello.node_id
    }

    /// Follows the connection: `Some` while a server has welcomed this executor,
    /// `None` between connections. Take it before [`run`](Self::run).
    ///
    /// ```no_run
    /// # async fn demo(executor: sundial_sdk::Executor) {
    /// let mut connected = executor.connected();
    /// tokio::spawn(executor.run(sundial_sdk::CancellationToken::new()));
    /// if let Ok(c) = connected.wait_for(Option::is_some).await {
    ///     println!("connected to {:?}", c.as_ref().map(|c| &c.server_instance));
    /// }
    /// # }
    /// ```
    pub fn connected(&self) -> watch::Receiver<Option<Connected>> {
        self.connected.subscribe()
    }

    /// Serves until `shutdown` is cancelled, reconnecting after every loss (to the
    /// next endpoint, with jittered exponential backoff, started over after a
    /// go-away).
    ///
    /// On shutdown it drains: new dispatches are refused (`"draining"`), heartbeats go
    /// on, and it returns once every running handler has finished and the server has
    /// acknowledged every result, or when the grace period
    /// ([`shutdown_grace`](crate::ExecutorBuilder::shutdown_grace)) is over; then
    /// handlers still running are cancelled and dropped.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let Executor {
            settings,
            handlers,
            connected,
        } = self;
        let node_id = settings.hello.node_id.clone();
        let mut core = Core::new(
            handlers,
            settings.hello.max_concurrency,
            settings.shutdown_grace,
        );
        let mut dialer = Dialer::new(
            settings.endpoints.clone(),
            settings.backoff_min,
            settings.backoff_max,
        );
        loop {
            let endpoint = dialer.next_endpoint();
            let hello = pb::Hello {
                in_flight: core.runs.in_flight(),
                ..settings.hello.clone()
            };
            let ended = match core
                .tend(&shutdown, connection::open(&endpoint, hello, &settings.tls))
                .await
            {
                None => break,
                Some(Err(reason)) => Ended::Lost {
                    welcomed: false,
                    reason,
                },
                Some(Ok(mut session)) => {
                    connected.send_replace(Some(Connected {
                        endpoint: endpoint.clone(),
                        server_instance: session.welcome.server_instance.clone(),
                    }));
                    let ended = core.serve(&mut session, &shutdown).await;
                    connected.send_replace(None);
                    core.drop_unstarted();
                    ended
                }
            };
            match ended {
                Ended::Shutdown => break,
                Ended::GoAway { suggested } => {
                    let wait = dialer.went_away(&endpoint, suggested.clone());
                    info!(%endpoint, ?suggested, ?wait, "server sent go-away; reconnecting elsewhere");
                    if core
                        .tend(&shutdown, tokio::time::sleep(wait))
                        .await
                        .is_none()
                    {
                        break;
                    }
                }
                Ended::Lost { welcomed, reason } => {
                    let wait = dialer.lost(welcomed);
                    warn!(%endpoint, %reason, ?wait, "connection lost; reconnecting");
                    if core
                        .tend(&shutdown, tokio::time::sleep(wait))
                        .await
                        .is_none()
                    {
                        break;
                    }
                }
            }
        }
        core.abandon();
        info!(%node_id, "executor stopped");
        Ok(())
    }
}

/// The state that outlives connections; see the module docs.
struct Core {
    handlers: HashMap<String, Handler>,
    runs: RunTable,
    logs: LogBatcher,
    tasks: JoinSet<Outcome>,
    /// Which run each handler task executes: a task that panicked only tells its id.
    task_runs: HashMap<task::Id, RunKey>,
    /// Admitted dispatches (in `runs`, so they count against the concurrency limit and
    /// their leases are renewed) whose `Started` waits for the server's go-ahead.
    awaiting_go: HashMap<RunKey, Pending>,
    /// Dispatches the server said not to start (their lease was gone), or whose
    /// go-ahead never came because the stream broke.
    dropped_unstarted: u64,
    /// Dispatches forgotten unstarted when a stream broke, rejected after the next
    /// welcome.
    to_reject: Vec<RunKey>,
    /// Handed to every run's context.
    notes_tx: mpsc::UnboundedSender<Note>,
    notes_rx: mpsc::UnboundedReceiver<Note>,
    /// A server said `Drain` (and no `Undrain` since): take no new work.
    drained: bool,
    grace: Duration,
    /// Shutdown was asked; the grace period ends then.
    stopping: Option<Instant>,
    grace_over: bool,
}

impl Core {
    fn new(handlers: HashMap<String, Handler>, max_concurrency: u32, grace: Duration) -> Self {
        let (notes_tx, notes_rx) = mpsc::unbounded_channel();
        Self {
            handlers,
            runs: RunTable::new(max_concurrency, DEFAULT_LEASE_TTL),
            logs: LogBatcher::new(LOG_BATCH_LINES, LOG_BATCH_DELAY, LOG_LINES_OFFLINE),
            tasks: JoinSet::new(),
            task_runs: HashMap::new(),
            awaiting_go: HashMap::new(),
            dropped_unstarted: 0,
            to_reject: Vec::new(),
            notes_tx,
            notes_rx,
            drained: false,
            grace,
            stopping: None,
            grace_over: false,
        }
    }

    fn draining(&self) -> bool {
        self.drained || self.stopping.is_some()
    }

    /// Shutdown was asked and nothing is left to wait for.
    fn stop_now(&self) -> bool {
        self.stopping.is_some() && (self.grace_over || self.runs.is_idle())
    }

    /// Drives `fut` (connecting, or waiting to reconnect) while looking after the runs;
    /// None when shutdown is complete first.
    async fn tend<F: Future>(&mut self, shutdown: &CancellationToken, fut: F) -> Option<F::Output> {
        let mut fut = std::pin::pin!(fut);
        loop {
            if self.stop_now() {
                return None;
            }
            tokio::select! {
                out = &mut fut => return Some(out),
                event = self.next_event(shutdown, false) => {
                    // Offline, nothing is sent, so nothing can fail.
                    let _ = self.on_event(event, None);
                }
            }
        }
    }

    /// Serves one welcomed stream until it ends.
    async fn serve(&mut self, session: &mut Session, shutdown: &CancellationToken) -> Ended {
        let every = millis(session.welcome.heartbeat_interval_ms)
            .unwrap_or(Duration::from_secs(5))
            .max(Duration::from_millis(50));
        let lease_ttl = millis(session.welcome.lease_ttl_ms).unwrap_or(every * 3);
        self.runs.set_lease_ttl(lease_ttl);
        info!(
            endpoint = %session.endpoint,
            instance = %session.welcome.server_instance,
            heartbeat = ?every,
            ?lease_ttl,
            "connected"
        );
        if let Err(ended) = self.welcomed(session) {
            return ended;
        }
        // The server answers every heartbeat; this long without a word, it is gone.
        let silence = (every * 3).max(lease_ttl);
        let mut heard = Instant::now();
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if self.stop_now() {
                return Ended::Shutdown;
            }
            let step = tokio::select! {
                _ = ticks.tick() => self.heartbeat(session),
                m = session.recv() => match m {
                    Ok(m) => {
                        heard = Instant::now();
                        match m {
                            Some(m) => self.on_message(m, session),
                            None => Ok(()),
                        }
                    }
                    Err(reason) => Err(Ended::Lost { welcomed: true, reason }),
                },
                () = sleep_until(heard + silence) => Err(Ended::Lost {
                    welcomed: true,
                    reason: format!("the server said nothing for {silence:?}"),
                }),
                event = self.next_event(shutdown, true) => self.on_event(event, Some(session)),
            };
            if let Err(ended) = step {
                return ended;
            }
        }
    }

    /// Right after a `Welcome`: cancel what the server no longer leases to us, then
    /// send the log lines and results that waited for a connection, in that order.
    fn welcomed(&mut self, session: &mut Session) -> Result<(), Ended> {
        for run in &session.welcome.unknown_in_flight {
            let key = RunKey::from(run);
            if self.runs.revoke(&key) {
                warn!(run = %key, "the server no longer leases this run to us; cancelling it");
            }
        }
        for key in std::mem::take(&mut self.to_reject) {
            session.send(Msg::Reject(pb::Reject {
                run: Some(key.to_proto()),
                reason: "not started: the stream broke before the go-ahead".into(),
            }))?;
        }
        for lines in self.logs.take_all() {
            session.send(Msg::Logs(lines))?;
        }
        for result in self.runs.awaiting_ack() {
            session.send(Msg::Result(result.clone()))?;
        }
        Ok(())
    }

    fn heartbeat(&mut self, session: &mut Session) -> Result<(), Ended> {
        let in_flight = self.runs.in_flight();
        let active = u32::try_from(self.runs.executing_count()).unwrap_or(u32::MAX);
        let load = match self.runs.max_concurrency() {
            0 => 0.0,
            limit => f64::from(active) / f64::from(limit),
        };
        let hb = pb::Heartbeat {
            in_flight,
            active,
            load,
            not_ready: self.draining(),
        };
        Ok(session.heartbeat(hb, Instant::now())?)
    }

    async fn next_event(&mut self, shutdown: &CancellationToken, online: bool) -> Event {
        let lease_due = self.runs.next_lease_deadline();
        let logs_due = if online { self.logs.next_flush() } else { None };
        let grace_end = self.stopping.filter(|_| !self.grace_over);
        tokio::select! {
            () = shutdown.cancelled(), if self.stopping.is_none() => Event::ShutdownAsked,
            () = sleep_until_some(grace_end) => Event::GraceOver,
            Some(joined) = self.tasks.join_next_with_id() => Event::Finished(joined),
            Some(note) = self.notes_rx.recv() => Event::Note(note),
            () = sleep_until_some(lease_due) => Event::LeaseDue,
            () = sleep_until_some(logs_due) => Event::LogsDue,
        }
    }

    fn on_event(&mut self, event: Event, session: Option<&mut Session>) -> Result<(), Ended> {
        match event {
            Event::ShutdownAsked => {
                self.stopping = Some(Instant::now() + self.grace);
                info!(
                    running = self.runs.executing_count(),
                    grace = ?self.grace,
                    "shutting down: taking no new work, finishing what runs"
                );
                if let Some(session) = session {
                    // Tell the server at once that we take no more work.
                    self.heartbeat(session)?;
                }
            }
            Event::GraceOver => self.grace_over = true,
            Event::Finished(joined) => self.finished(joined, session)?,
            Event::Note(note) => self.absorb(note, session)?,
            Event::LeaseDue => {
                for key in self.runs.expire_leases(Instant::now()) {
                    warn!(
                        run = %key,
                        "lease ran out without renewal; cancelling the handler (self-fencing)"
                    );
                }
            }
            Event::LogsDue => {
                if let Some(session) = session {
                    for lines in self.logs.take_due(Instant::now()) {
                        session.send(Msg::Logs(lines))?;
                    }
                }
            }
        }
        Ok(())
    }

    fn on_message(&mut self, m: In, session: &mut Session) -> Result<(), Ended> {
        match m {
            In::Welcome(_) => debug!("ignoring a second welcome"),
            In::HeartbeatAck(ack) => {
                let since = session.heartbeat_acked(Instant::now());
                for lease in ack.leases {
                    let Some(run) = lease.run else { continue };
                    let key = RunKey::from(&run);
                    if self.runs.renew(&key, lease.remaining_ms, since) == Renewal::Revoked {
                        warn!(run = %key, "the server says the lease is gone; cancelling the handler");
                    }
                }
            }
            In::Dispatch(d) => self.dispatch(d, session)?,
            In::StartAck(ack) => {
                let Some(run) = ack.run else {
                    return Ok(());
                };
                let key = RunKey::from(&run);
                // Nothing waits for it: already started (a repeated answer) or forgotten.
                let Some(pending) = self.awaiting_go.remove(&key) else {
                    return Ok(());
                };
                if !ack.go {
                    self.runs.forget(&key);
                    self.dropped_unstarted += 1;
                    info!(run = %key, reason = %ack.reason, dropped = self.dropped_unstarted, "the server no longer leases this dispatch; not starting it");
                } else if pending.cancel.is_cancelled() {
                    // Cancelled, or its lease ran out here, while the answer was on its
                    // way: not started, and the server is told so (it routes the run
                    // again without spending an attempt).
                    self.runs.forget(&key);
                    self.dropped_unstarted += 1;
                    info!(run = %key, "cancelled before the go-ahead came; not starting it");
                    session.send(Msg::Reject(pb::Reject {
                        run: Some(run),
                        reason: "not started: cancelled or its lease ran out before the go-ahead"
                            .into(),
                    }))?;
                } else {
                    self.begin(key, pending);
                }
            }
            In::ResultAck(ack) => {
                let Some(run) = ack.run else {
                    return Ok(());
                };
                let key = RunKey::from(&run);
                if self.runs.acknowledge(&key) {
                    if ack.accepted {
                        debug!(run = %key, "result accepted");
                    } else {
                        warn!(run = %key, reason = %ack.reason, "result refused by the server");
                    }
                }
            }
            In::Cancel(c) => {
                let Some(run) = c.run else {
                    return Ok(());
                };
                let key = RunKey::from(&run);
                if self.runs.cancel(&key) {
                    info!(run = %key, reason = %c.reason, "the server cancelled the run");
                }
            }
            In::Drain(d) => {
                info!(reason = %d.reason, "draining: taking no new work");
                self.drained = true;
                self.heartbeat(session)?;
            }
            In::Undrain(u) => {
                if self.drained {
                    info!(reason = %u.reason, "undrained: taking work again");
                    self.drained = false;
                    self.heartbeat(session)?;
                }
            }
            In::GoAway(g) => {
                debug!(reason = %g.reason, "go-away");
                return Err(Ended::GoAway {
                    suggested: g.endpoints,
                });
            }
        }
        Ok(())
    }

    fn dispatch(&mut self, d: pb::Dispatch, session: &mut Session) -> Result<(), Ended> {
        let Some(run) = d.run.clone() else {
            warn!(handler = %d.handler, "ignoring a dispatch that names no run");
            return Ok(());
        };
        let key = RunKey::from(&run);
        let handler = self.handlers.get(&d.handler).cloned();
        match self.runs.admit(&key, handler, self.draining()) {
            Admission::AlreadyRunning => {
                session.send(Msg::Started(pb::Started { run: Some(run) }))?
            }
            Admission::AlreadyFinished(result) => session.send(Msg::Result(*result))?,
            Admission::Refuse(why) => {
                let reason = match why {
                    Refusal::UnknownHandler => format!("unknown handler: {}", d.handler),
                    Refusal::Draining => "draining".to_owned(),
                    Refusal::Busy => "busy".to_owned(),
                };
                debug!(run = %key, %reason, "rejecting a dispatch");
                session.send(Msg::Reject(pb::Reject {
                    run: Some(run),
                    reason,
                }))?;
            }
            Admission::Start(handler) => {
                // Held from now (it counts against the limit, and heartbeats renew its
                // lease), but started only on the server's go-ahead.
                let cancel = CancellationToken::new();
                self.runs
                    .start(key.clone(), cancel.clone(), Instant::now(), now_ms());
                self.awaiting_go.insert(
                    key,
                    Pending {
                        handler,
                        dispatch: d,
                        cancel,
                    },
                );
                session.send(Msg::Started(pb::Started { run: Some(run) }))?;
            }
        }
        Ok(())
    }

    /// The go-ahead came: the handler runs as a task from now.
    fn begin(&mut self, key: RunKey, pending: Pending) {
        let Pending {
            handler,
            dispatch: d,
            cancel,
        } = pending;
        let now = Instant::now();
        let deadline = millis(d.deadline_ms).map(|ms| now + ms);
        let span = info_span!(
            "run",
            schedule_id = %key.schedule_id,
            attempt = key.attempt,
            shard = key.shard_index,
            token = key.fencing_token,
            handler = %d.handler,
        );
        info!(run = %key, handler = %d.handler, "starting");
        let ctx = RunContext::new(key.clone(), d, deadline, cancel, self.notes_tx.clone());
        let task = self
            .tasks
            .spawn(async move { Outcome::returned(handler.call(ctx).await) }.instrument(span));
        self.task_runs.insert(task.id(), key);
    }

    /// The stream ended: a dispatch still waiting for its go-ahead is forgotten (not
    /// started, no result, not in the next `Hello.in_flight`) and rejected on the next
    /// connection, so that the server routes it again at once if it still leases it to
    /// us.
    fn drop_unstarted(&mut self) {
        for (key, _) in self.awaiting_go.drain() {
            self.runs.forget(&key);
            self.dropped_unstarted += 1;
            debug!(run = %key, "the stream ended before the go-ahead; not starting it");
            self.to_reject.push(key);
        }
    }

    /// A handler task ended: its result waits for an acknowledgement, and goes out now
    /// if connected, after every line the handler logged.
    fn finished(
        &mut self,
        joined: Result<(task::Id, Outcome), JoinError>,
        session: Option<&mut Session>,
    ) -> Result<(), Ended> {
        let (id, outcome) = match joined {
            Ok(done) => done,
            Err(e) => (e.id(), Outcome::from_join_error(e)),
        };
        let Some(key) = self.task_runs.remove(&id) else {
            return Ok(());
        };
        // Whatever the handler logged before it returned is already in the channel;
        // take it in while the run still counts as executing.
        let mut progress = Vec::new();
        while let Ok(note) = self.notes_rx.try_recv() {
            if let Some(p) = self.buffer(note) {
                progress.push(p);
            }
        }
        let Some(result) = self.runs.finish(&key, outcome) else {
            return Ok(());
        };
        info!(
            run = %key,
            status = ?pb::ResultStatus::try_from(result.status).unwrap_or_default(),
            code = %result.error_code,
            "finished"
        );
        if let Some(session) = session {
            for p in progress {
                session.send(Msg::Progress(p))?;
            }
            for lines in self.logs.take(&key) {
                session.send(Msg::Logs(lines))?;
            }
            session.send(Msg::Result(result))?;
        }
        Ok(())
    }

    /// Keeps a handler's note: log lines wait in their batch (sent at once if the batch
    /// is full and we are connected); progress goes out only while connected.
    fn absorb(&mut self, note: Note, session: Option<&mut Session>) -> Result<(), Ended> {
        let full = match &note {
            Note::Log(key, _) => Some(key.clone()),
            Note::Progress(..) => None,
        };
        let progress = self.buffer(note);
        if let Some(session) = session {
            if let Some(p) = progress {
                session.send(Msg::Progress(p))?;
            }
            if let Some(key) = full.filter(|k| self.logs.is_full(k)) {
                for lines in self.logs.take(&key) {
                    session.send(Msg::Logs(lines))?;
                }
            }
        }
        Ok(())
    }

    /// Files a note from a handler; returns a progress report to forward. Notes of
    /// runs that no longer execute (a context kept past its handler) are dropped.
    fn buffer(&mut self, note: Note) -> Option<pb::Progress> {
        match note {
            Note::Log(key, line) => {
                if self.runs.is_executing(&key) {
                    self.logs.push(&key, line, Instant::now());
                }
                None
            }
            Note::Progress(key, p) => self.runs.is_executing(&key).then_some(p),
        }
    }

    /// Shutdown is over: whatever still runs is cancelled, and its task dropped.
    fn abandon(&mut self) {
        let running = self.runs.executing_count();
        let unacknowledged = self.runs.awaiting_ack_count();
        if running + unacknowledged > 0 {
            warn!(
                running,
                unacknowledged, "shutdown grace period over; abandoning runs"
            );
        }
        self.runs.cancel_all();
        self.tasks.abort_all();
    }
}

/// An admitted dispatch waiting for the server's go-ahead.
struct Pending {
    handler: Handler,
    dispatch: pb::Dispatch,
    /// The run's cancellation: a `Cancel`, a lease revoked by a heartbeat ack or run
    /// out meanwhile fires it, and the run is then never started.
    cancel: CancellationToken,
}

/// A positive millisecond count from the wire; None for 0 or less.
fn millis(ms: i64) -> Option<Duration> {
    u64::try_from(ms)
        .ok()
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
}

/// Sleeps until `at`, or forever if there is nothing to wait for.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}
