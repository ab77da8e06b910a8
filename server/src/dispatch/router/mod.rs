//! Routing: turns each routable run into a dispatch.
//!
//! A WAITING run goes to one healthy node of its group that serves its handler,
//! chosen by the job's strategy, under a lease granted by the store (which also
//! enforces the node's max concurrency across instances). The dispatch travels on the
//! node's stream, or through the inbox of the instance the node is attached to. HTTP
//! targets are leased to this instance's built-in HTTP executor instead. Owns the
//! overlap policy's follow-up too (revoked runs are sent `Cancel`), the cache of job
//! definitions the dispatch layer routes by, and tells the trigger consumer
//! ([`TriggerConsumer`](super::TriggerConsumer)) where a run about to begin would go
//! first.
//!
//! Nothing here is the only record of anything: a run that could not be routed now
//! stays WAITING with a timer in the store, and the sweeper (`sweeper`) brings it back.
//! A run that found every eligible node at its window also waits in this instance's
//! room queue (`room`), from which a freed slot is refilled at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{Instrument, debug, info, info_span, warn};

use crate::deliver::alerts::Alerts;
use crate::dispatch::health::{Health, HealthPolicy};
use crate::dispatch::http_target::HttpTargets;
use crate::dispatch::links::Links;
use crate::dispatch::lock;
use crate::dispatch::routing::{self, NodeView, Route, RouteState};
use crate::model::{JobRecord, RouteStrategy, RunPlan, RunRecord, RunState, Target, duration_ms};
use crate::store::job_cache::JobCache;
use crate::store::{
    Assigned, FannedOut, Finisher, JobStore, LeaseTerms, NodeRecord, NodeRegistry, NodeSlot,
    Outcome, Revocation, RunStore, Transition,
};

mod begin;
mod node_cache;
mod room;

pub use begin::First;
use node_cache::NodeCache;
use room::{Place, Room};

/// The store traits the router uses, each for its own part of the work.
#[derive(Clone)]
pub struct RouteStore {
    /// Job definitions: a run's plan and route come from its job.
    pub jobs: Arc<dyn JobStore>,
    /// The job records this instance read, shared with its scheduler (which reads a
    /// job first, when it fires), refreshed when a run names a newer version.
    pub job_cache: Arc<JobCache>,
    /// The run machine: begin, fan out, assign, finish what found no executor.
    pub runs: Arc<dyn RunStore>,
    /// The nodes it routes to, and the shared round-robin counters.
    pub nodes: Arc<dyn NodeRegistry>,
}

#[derive(Debug, Clone)]
pub struct DispatchOptions {
    /// This instance's consumer name in the queue.
    pub consumer: String,
    /// Triggers read per store call.
    pub batch_size: usize,
    /// How long one read waits for new triggers; also bounds shutdown latency.
    pub read_block: Duration,
    /// A trigger delivered this long ago and never acknowledged is taken over.
    pub reclaim_idle: Duration,
    /// How often to look for such triggers (and to trim the queue).
    pub reclaim_every: Duration,
    /// This instance beats in the store every third of this; an instance whose beat
    /// is older is dead, and its unacknowledged triggers are taken over at once.
    pub instance_ttl: Duration,
    /// Acknowledged queue entries older than this are trimmed.
    pub queue_retention: Duration,
    /// The lease a dispatch is made under.
    pub lease: LeaseTerms,
    /// How soon a WAITING run that could not be routed is tried again.
    pub route_retry: Duration,
    /// How long a run may wait for an eligible node to connect before it fails with
    /// "no_executor".
    pub dispatch_wait: Duration,
    /// Longest serial queue per job.
    pub serial_limit: u32,
    /// How stale the node snapshot used for routing may be.
    pub node_refresh: Duration,
    /// Which nodes get work: slow ones last, failing, draining and not-ready ones none.
    pub health: HealthPolicy,
}

impl Default for DispatchOptions {
    fn default() -> Self {
        Self {
            consumer: "sundial".to_owned(),
            batch_size: 500,
            read_block: Duration::from_millis(500),
            reclaim_idle: Duration::from_secs(30),
            reclaim_every: Duration::from_secs(5),
            instance_ttl: Duration::from_secs(3),
            queue_retention: Duration::from_secs(3600),
            lease: LeaseTerms {
                ttl: Duration::from_secs(15),
                confirm_within: Duration::from_secs(10),
            },
            route_retry: Duration::from_millis(500),
            dispatch_wait: Duration::from_secs(30),
            serial_limit: 100,
            node_refresh: Duration::from_millis(250),
            health: HealthPolicy::default(),
        }
    }
}

/// Where a job's turn-taking starts: a stable hash of its id, so that many jobs that
/// each fire once (a burst) start on different nodes instead of all on the first.
fn spread_offset(job_id: &str) -> u64 {
    // FNV-1a: stable across processes and instances.
    job_id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

pub struct Router {
    store: RouteStore,
    opts: DispatchOptions,
    links: Arc<Links>,
    http: Arc<HttpTargets>,
    /// Where the run outcomes this instance applies are counted (and alerted).
    alerts: Arc<Alerts>,
    nodes: NodeCache,
    /// Per-job routing state (round-robin position, weights, hash ring).
    routes: Mutex<HashMap<String, RouteState>>,
    /// When this instance last sent each FAILING node a probe run.
    probes: Mutex<HashMap<String, Instant>>,
    /// Runs waiting for a node with room, oldest first (see `room`).
    room: Mutex<Room>,
    /// When this instance began to serve: no run fails "no_executor" before it has
    /// served for `dispatch_wait` (see `no_node_yet`).
    serving_since: tokio::time::Instant,
}

/// A run waiting in the room queue is woken by its timer only this many times
/// `route_retry` apart (the room routes it as soon as a slot frees; the timer is for an
/// instance that died or forgot it), instead of every `route_retry`: each wake-up is a
/// store call, which a burst waiting for room would make for every waiting run.
const ROOM_GRACE_RETRIES: u32 = 10;

/// Runs one refill routes at most: a refill started by a result (or the tick) ends, and
/// the next result or tick starts another.
const REFILL_BATCH: usize = 256;

/// The run-relevant part of a job, snapshotted into the run when it begins.
pub fn run_plan(job: &JobRecord, opts: &DispatchOptions) -> RunPlan {
    let s = &job.spec;
    RunPlan {
        max_attempts: s.retry.max_retries.saturating_add(1),
        backoff_ms: s.retry.backoff_ms,
        backoff_multiplier: s.retry.backoff_multiplier,
        max_backoff_ms: s.retry.max_backoff_ms,
        timeout_ms: s.timeout_ms,
        overlap: s.overlap_policy,
        serial_limit: opts.serial_limit,
        dispatch_wait_ms: duration_ms(opts.dispatch_wait),
        callback_url: s.callback_url.clone(),
    }
}

impl Router {
    pub fn new(
        store: RouteStore,
        opts: DispatchOptions,
        links: Arc<Links>,
        http: Arc<HttpTargets>,
        alerts: Arc<Alerts>,
    ) -> Self {
        let (refresh, policy) = (opts.node_refresh, opts.health);
        Self {
            store,
            opts,
            links,
            http,
            alerts,
            nodes: NodeCache::new(refresh, policy),
            routes: Mutex::new(HashMap::new()),
            probes: Mutex::new(HashMap::new()),
            room: Mutex::new(Room::default()),
            serving_since: tokio::time::Instant::now(),
        }
    }

    pub fn options(&self) -> &DispatchOptions {
        &self.opts
    }

    /// A `Started` came for a dispatch whose lease was gone: the executor was told not
    /// to start it (counted in `sundial_starts_refused_total`).
    pub fn start_refused(&self) {
        self.alerts.metrics().start_refused();
    }

    /// A silent executor's unanswered dispatch was taken back (counted in
    /// `sundial_dispatches_taken_back_total`).
    pub fn taken_back(&self) {
        self.alerts.metrics().taken_back();
    }

    /// A stream attached here reported about a run its node does not hold.
    pub fn foreign_report(&self) {
        self.alerts.metrics().foreign_report();
    }

    /// A node attached here changed in a way routing must see at once (it went silent
    /// or answers again): the next routing decision re-reads the registry.
    pub async fn nodes_changed(&self) {
        self.nodes.invalidate().await;
    }

    /// A stream attached here reported the end of a run on `node_id` (of `group`,
    /// serving `handlers`): routing counts the node one run less busy until its next
    /// registry read, and the runs waiting in the room for such a node are routed now.
    pub fn run_ended_on(self: &Arc<Self>, node_id: &str, group: &str, handlers: &[String]) {
        self.nodes.moved(node_id, -1);
        let keys: Vec<(String, String)> = {
            let room = lock(&self.room);
            handlers
                .iter()
                .filter(|h| room.waiting(group, h))
                .map(|h| (group.to_owned(), h.clone()))
                .collect()
        };
        if keys.is_empty() {
            return;
        }
        let me = self.clone();
        tokio::spawn(
            async move {
                for (group, handler) in keys {
                    me.refill(&group, &handler).await;
                }
            }
            .in_current_span(),
        );
    }

    /// How far a sweep moves the timer of a run that is due again: further while the
    /// run waits in the room (see [`Router::room_grace`]).
    pub fn wake_grace(&self, schedule_id: &str) -> Duration {
        match lock(&self.room).waits(schedule_id) {
            Some(timeout_ms) => self.room_grace(timeout_ms),
            None => self.opts.route_retry,
        }
    }

    /// How far apart the timer of a run waiting in the room wakes it: on a store other
    /// instances share, every `route_retry` as any waiting run (their rooms do not see
    /// this one's runs: a wake-up is how an instance whose own nodes have room finds
    /// them, which a longer grace left idle while this instance's nodes took the whole
    /// backlog); on a store of its own, up to [`ROOM_GRACE_RETRIES`] times
    /// `route_retry`, but at most a tenth of its job's timeout (each wake-up is where a
    /// wait longer than the timeout is failed), and never less often than `route_retry`.
    fn room_grace(&self, timeout_ms: i64) -> Duration {
        if self.store.runs.shared() {
            return self.opts.route_retry;
        }
        let longest = self.opts.route_retry * ROOM_GRACE_RETRIES;
        let grace = match u64::try_from(timeout_ms) {
            Ok(ms) if ms > 0 => longest.min(Duration::from_millis(ms / 10)),
            _ => longest,
        };
        grace.max(self.opts.route_retry)
    }

    /// Until `stop`: every `node_refresh`, routes what waits in the room (a node may
    /// have room that no result seen here freed: a new node, runs ended on another
    /// instance's streams, a lease revoked).
    pub async fn refill_room(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(self.opts.node_refresh);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let keys = lock(&self.room).keys();
            for (group, handler) in keys {
                self.refill(&group, &handler).await;
            }
        }
    }

    /// Routes the runs waiting in the room for a node of `group` serving `handler`,
    /// oldest first, until one finds no room (it is put back at its place in the queue).
    /// One refill of a queue at a time: a refill asked for while one is under way makes
    /// that one go round again instead.
    async fn refill(&self, group: &str, handler: &str) {
        if !lock(&self.room).start_refill(group, handler) {
            return;
        }
        let mut under_way = RefillUnderWay {
            room: &self.room,
            group,
            handler,
            done: false,
        };
        loop {
            self.refill_pass(group, handler).await;
            if !lock(&self.room).end_refill_pass(group, handler) {
                under_way.done = true;
                return;
            }
        }
    }

    /// One pass of `refill`: up to [`REFILL_BATCH`] runs, as many at once as the
    /// eligible nodes have free slots as far as this instance knows (routed one at a
    /// time, each waited for its store call: a room that filled once drained at one
    /// run per round trip, which on the embedded store is a commit, and every newer run
    /// queued behind it). A run that finds no room after all goes back to its place.
    async fn refill_pass(&self, group: &str, handler: &str) {
        let mut left = REFILL_BATCH;
        while left > 0 {
            let free = self.free_slots(group, handler).await.min(left);
            if free == 0 {
                return;
            }
            let runs: Vec<(Place, RunRecord)> = {
                let mut room = lock(&self.room);
                std::iter::from_fn(|| room.pop(group, handler))
                    .take(free)
                    .collect()
            };
            if runs.is_empty() {
                return;
            }
            left -= runs.len();
            let routed = futures::future::join_all(
                runs.iter()
                    .map(|(place, run)| self.route_one(run, Some(*place))),
            )
            .await;
            if routed.contains(&Routed::NoRoom) {
                return;
            }
        }
    }

    /// The job as of at least `version` (None when it is gone), from the instance's
    /// job cache or the store.
    pub(super) async fn job(&self, job_id: &str, version: u64) -> Option<Arc<JobRecord>> {
        if let Some(j) = self.store.job_cache.get(job_id, version) {
            return Some(j);
        }
        match self.store.jobs.get_job(job_id).await {
            Ok(Some(j)) => self.store.job_cache.keep(vec![j]).pop(),
            Ok(None) => {
                self.store.job_cache.forget(job_id);
                None
            }
            Err(e) => {
                warn!(%job_id, error = %e, "reading the job failed");
                None
            }
        }
    }

    /// Acts on what a transition left to do: count it (metrics and alerts, when
    /// applied), cancel a revoked lease, route the serial run it released. Every
    /// applied transition but `begin_run` and the HTTP executor's results comes here
    /// once.
    pub async fn follow_up(&self, t: Transition) {
        if self.follow_up_at_once(&t) {
            return;
        }
        self.alerts.record_transition(&t);
        for rv in &t.revoked {
            self.send_cancel(rv).await;
        }
        if let Some(next) = &t.next_serial {
            match self.store.runs.get_run(next).await {
                Ok(Some(run)) => Box::pin(self.route(run)).await,
                Ok(None) => {}
                Err(e) => {
                    warn!(schedule_id = %next, error = %e, "reading a released serial run failed; the sweeper will route it")
                }
            }
        }
    }

    /// [`Router::follow_up`] of a transition that left nothing to wait on (no lease to
    /// cancel, no serial run released: a run's common end), done here: true then, and
    /// the caller need not spawn a task for it.
    pub fn follow_up_at_once(&self, t: &Transition) -> bool {
        if !t.revoked.is_empty() || t.next_serial.is_some() {
            return false;
        }
        self.alerts.record_transition(t);
        true
    }

    /// Tells the node that held a revoked lease to stop.
    pub async fn send_cancel(&self, rv: &Revocation) {
        if rv.node_id == self.http.node_id() {
            self.http.cancel(&rv.schedule_id, rv.token);
            return;
        }
        let instance = self
            .nodes
            .get(self.store.nodes.as_ref())
            .await
            .iter()
            .find(|n| n.node_id == rv.node_id)
            .map(|n| n.instance.clone())
            .unwrap_or_default();
        let (job_id, _) = crate::model::split_schedule_id(&rv.schedule_id).unwrap_or(("", ""));
        debug!(%job_id, schedule_id = %rv.schedule_id, node_id = %rv.node_id, reason = %rv.reason, "cancelling");
        self.links.cancel(rv, &instance);
    }

    /// Routes a WAITING run: leases it to a node and sends the dispatch. When no node
    /// can take it now, it stays WAITING (its timer brings it back) until its wait
    /// runs out; when its group has no healthy node at all, the attempt fails with
    /// "no executor" (retried per the job's policy).
    pub async fn route(&self, run: RunRecord) {
        self.route_one(&run, None).await;
    }

    /// Routes `run` (`queued`: its place, when taken out of the room queue) in its
    /// span; NoRoom when it found every eligible node at its window.
    async fn route_one(&self, run: &RunRecord, queued: Option<Place>) -> Routed {
        let span = info_span!("route", job_id = %run.job_id, schedule_id = %run.schedule_id, attempt = run.attempt);
        async {
            let Some(job) = self.job(&run.job_id, run.job_version).await else {
                self.fail_waiting(run, "no_job", "the job was deleted")
                    .await;
                return Routed::Settled;
            };
            match &job.spec.target {
                Target::Http { .. } => {
                    self.route_http(run, &job).await;
                    Routed::Settled
                }
                Target::Executor { group, handler } => {
                    self.route_executor(run, &job, group, handler, queued).await
                }
            }
        }
        .instrument(span)
        .await
    }

    async fn route_http(&self, run: &RunRecord, job: &Arc<JobRecord>) {
        let slot = NodeSlot {
            node_id: self.http.node_id().to_owned(),
            max_concurrency: self.http.max_concurrency(),
        };
        match self
            .store
            .runs
            .assign_run(&run.schedule_id, run.attempt, &slot, self.opts.lease)
            .await
        {
            Ok(Assigned::Granted(run)) => self.http.start(run, job.clone()),
            Ok(Assigned::NodeFull) => {
                self.still_waiting(run).await;
            }
            Ok(Assigned::NotWaiting(_)) => debug!("run no longer waiting"),
            Err(e) => warn!(error = %e, "assigning the run failed; its timer will retry"),
        }
    }

    /// Routes an executor job's WAITING run; `queued`: its place when it was taken out
    /// of the room queue (where it goes back to that place if it finds no room again).
    async fn route_executor(
        &self,
        run: &RunRecord,
        job: &JobRecord,
        group: &str,
        handler: &str,
        queued: Option<Place>,
    ) -> Routed {
        let roomy = waits_in_room(run, job);
        if roomy && queued.is_none() && lock(&self.room).waiting(group, handler) {
            // Older runs wait for these nodes: this one queues behind them, and the
            // room is refilled now in case a node has room already.
            self.wait_for_room(run, group, handler, None).await;
            Box::pin(self.refill(group, handler)).await;
            return Routed::NoRoom;
        }
        match self.pick(run, job, group, handler, None).await {
            Pick::NoNode => {
                self.no_node_yet(run, group, handler).await;
                Routed::Settled
            }
            Pick::Broadcast {
                nodes,
                candidates,
                route_key,
            } => {
                let candidates = candidates.iter().map(|&i| &nodes[i]).collect();
                self.broadcast(run, job, candidates, &route_key).await;
                Routed::Settled
            }
            Pick::Order {
                nodes,
                order,
                route_key,
            } => {
                for i in order {
                    match self.assign_to(run, job, &nodes[i], &route_key).await {
                        Placed::Done => return Routed::Settled,
                        Placed::Full => continue,
                    }
                }
                if roomy {
                    self.wait_for_room(run, group, handler, queued).await;
                } else {
                    self.still_waiting(run).await;
                }
                Routed::NoRoom
            }
        }
    }

    /// The free slots of the routable nodes of `group` serving `handler` as far as
    /// this instance knows (routing asks the store about each): a node without a
    /// window counts as [`REFILL_BATCH`].
    async fn free_slots(&self, group: &str, handler: &str) -> usize {
        let (snapshot, health) = self.nodes.judged(self.store.nodes.as_ref()).await;
        snapshot
            .iter()
            .zip(health.iter())
            .filter(|(n, h)| {
                n.group == group && h.routable() && n.handlers.iter().any(|x| x == handler)
            })
            .map(|(n, _)| match n.max_concurrency {
                0 => REFILL_BATCH,
                max => usize::try_from(max.saturating_sub(self.nodes.busy(n))).unwrap_or(0),
            })
            .fold(0, usize::saturating_add)
    }

    /// Every eligible node is at its window: unless it has waited past its timeout
    /// (`still_waiting`), the run waits in the room queue: back at its `place` when it
    /// was taken from there, else behind the runs already waiting.
    async fn wait_for_room(
        &self,
        run: &RunRecord,
        group: &str,
        handler: &str,
        place: Option<Place>,
    ) {
        if !self.still_waiting(run).await {
            return;
        }
        let mut room = lock(&self.room);
        let queued = match place {
            Some(place) => room.put_back(group, handler, run.clone(), place),
            None => room.push_back(group, handler, run.clone()),
        };
        if !queued && !room.holds(&run.schedule_id, run.attempt) {
            debug!(
                waiting = room.len(),
                "the room queue is full; the run waits for its timer"
            );
        }
    }

    /// Where routing sends the run: the healthy nodes of its group that serve its
    /// handler, in the order to try them (the job's strategy's pick first), or every
    /// one of them for a sharding broadcast. Takes a turn of the job's round-robin
    /// counter where the strategy draws one: `turn` when one was drawn for it already
    /// (`Router::draw_turns`).
    async fn pick(
        &self,
        run: &RunRecord,
        job: &JobRecord,
        group: &str,
        handler: &str,
        turn: Option<u64>,
    ) -> Pick {
        let (snapshot, health) = self.nodes.judged(self.store.nodes.as_ref()).await;
        let serves = |n: &NodeRecord| n.group == group && n.handlers.iter().any(|h| h == handler);
        // Nodes by their index in the snapshot.
        let eligible: Vec<usize> = (0..snapshot.len())
            .filter(|&i| serves(&snapshot[i]) && health[i].routable())
            .collect();
        let is_broadcast =
            job.spec.route_strategy == RouteStrategy::ShardingBroadcast && run.parent.is_empty();
        let probe = (!is_broadcast)
            .then(|| self.probe(&snapshot, &health, serves, &run.last_node))
            .flatten();
        let route_key = run
            .route_key_override
            .clone()
            .unwrap_or_else(|| job.spec.route_key.clone());
        if eligible.is_empty() {
            return match probe {
                Some(i) => Pick::Order {
                    order: vec![i],
                    nodes: snapshot,
                    route_key,
                },
                None => Pick::NoNode,
            };
        }
        let candidates =
            routing::retry_candidates(eligible, |&i| snapshot[i].node_id == run.last_node);
        let strategy = match job.spec.route_strategy {
            // A shard (a broadcast sub-run being routed again) goes to one node.
            RouteStrategy::ShardingBroadcast if !run.parent.is_empty() => {
                RouteStrategy::LeastActive
            }
            RouteStrategy::ShardingBroadcast => {
                return Pick::Broadcast {
                    candidates,
                    nodes: snapshot,
                    route_key,
                };
            }
            other => other,
        };
        let views: Vec<NodeView> = candidates
            .iter()
            .map(|&i| (&snapshot[i], health[i]))
            .map(|(n, h)| NodeView {
                node_id: n.node_id.clone(),
                weight: n.weight,
                max_concurrency: n.max_concurrency,
                active: self.nodes.busy(n),
                mean_duration_ms: n.mean_duration_ms,
                recent_errors: n.recent_errors,
                slow: h == Health::Slow,
            })
            .collect();
        // Turn-taking strategies draw their position from the job's shared counter,
        // so instances routing the same job do not start on the same node; if the
        // store cannot say, this instance's own counter goes on.
        let shared = match turn {
            _ if !routing::takes_turns(strategy) => None,
            Some(n) => Some(n),
            None => match self.store.nodes.next_route_counter(&run.job_id).await {
                Ok(n) => Some(n),
                Err(e) => {
                    debug!(error = %e, "shared route counter unavailable; using this instance's");
                    None
                }
            },
        };
        let first = {
            let mut routes = lock(&self.routes);
            let offset = spread_offset(&run.job_id);
            let state = routes
                .entry(run.job_id.clone())
                .or_insert_with(|| RouteState {
                    counter: offset,
                    ..RouteState::default()
                });
            if let Some(n) = shared {
                state.counter = n.wrapping_add(offset);
            }
            routing::route(strategy, &views, &route_key, state, rand::random::<f64>())
        };
        let first = match first {
            Route::One(id) => id,
            Route::All(_) | Route::NoNode => String::new(),
        };
        // The strategy's pick first; if it is full, any other candidate (busyover),
        // unless the strategy keeps its affinity: then the run waits for its node.
        // A node this instance knows to be at its window is not asked (the store
        // would answer NodeFull); the estimate is re-read every `node_refresh`.
        let full: Vec<bool> = candidates
            .iter()
            .map(|&i| self.nodes.at_window(&snapshot[i]))
            .collect();
        let mut order: Vec<usize> = routing::fallback_order(strategy, &views, &first, &full)
            .into_iter()
            .map(|k| candidates[k])
            .collect();
        if let Some(i) = probe {
            order.insert(0, i);
        }
        Pick::Order {
            order,
            nodes: snapshot,
            route_key,
        }
    }

    /// A FAILING node that serves the run and is due a probe (this instance has seen
    /// it FAILING, and sent it no probe, for `probe_every`), taking its turn now: a
    /// dropped node gets one run per `probe_every`, so it can show it recovered (see
    /// `ResultWindow::forgive`). Not the node the run just failed on.
    fn probe(
        &self,
        snapshot: &[NodeRecord],
        health: &[Health],
        serves: impl Fn(&NodeRecord) -> bool,
        last_node: &str,
    ) -> Option<usize> {
        let now = Instant::now();
        let every = self.opts.health.probe_every;
        let failing: Vec<usize> = (0..snapshot.len())
            .filter(|&i| health[i] == Health::Failing)
            .collect();
        let mut probes = lock(&self.probes);
        if failing.is_empty() {
            probes.clear();
            return None;
        }
        // Since when each failing node waits for its next probe; a node no longer
        // failing is forgotten, so a node dropped again waits a whole period.
        probes.retain(|id, _| failing.iter().any(|&i| snapshot[i].node_id == *id));
        for &i in &failing {
            probes.entry(snapshot[i].node_id.clone()).or_insert(now);
        }
        let i = failing.into_iter().find(|&i| {
            let n = &snapshot[i];
            n.node_id != last_node
                && serves(n)
                && probes
                    .get(&n.node_id)
                    .is_some_and(|at| now.duration_since(*at) >= every)
        })?;
        probes.insert(snapshot[i].node_id.clone(), now);
        debug!(node_id = %snapshot[i].node_id, "probing a failing node with this run");
        Some(i)
    }

    /// The node's health as this instance's routing last judged it.
    pub async fn judged_health(&self, node_id: &str) -> Option<Health> {
        let (nodes, health) = self.nodes.judged(self.store.nodes.as_ref()).await;
        nodes
            .iter()
            .position(|n| n.node_id == node_id)
            .map(|i| health[i])
    }

    /// Sharding broadcast: one shard per node (in node-id order, shard i to the i-th
    /// node), each then leased like any run; a shard whose node is full is routed on
    /// its own.
    async fn broadcast(
        &self,
        run: &RunRecord,
        job: &JobRecord,
        mut nodes: Vec<&NodeRecord>,
        route_key: &str,
    ) {
        nodes.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        let total = u32::try_from(nodes.len()).unwrap_or(u32::MAX);
        let shards = match self
            .store
            .runs
            .fan_out(&run.schedule_id, run.attempt, total, self.opts.route_retry)
            .await
        {
            Ok(FannedOut::Shards { shards, .. }) => shards,
            Ok(FannedOut::NotWaiting(_)) => {
                debug!("run no longer waiting");
                return;
            }
            Err(e) => {
                warn!(error = %e, "fanning the run out failed; its timer will retry");
                return;
            }
        };
        info!(shards = total, "broadcast fanned out");
        for (shard, node) in shards.into_iter().zip(nodes) {
            if let Placed::Full = self.assign_to(&shard, job, node, route_key).await {
                Box::pin(self.route(shard)).await;
            }
        }
    }

    /// Leases the run to `node` and sends the dispatch. `Full` when the node is at its
    /// max concurrency; every other outcome ends the attempt to place it here.
    async fn assign_to(
        &self,
        run: &RunRecord,
        job: &JobRecord,
        node: &NodeRecord,
        route_key: &str,
    ) -> Placed {
        if self.nodes.at_window(node) {
            // Filled since the pick (routing decisions run side by side).
            return Placed::Full;
        }
        let slot = self.nodes.asking(node);
        let assigned = self
            .store
            .runs
            .assign_run(&run.schedule_id, run.attempt, &slot, self.opts.lease)
            .await;
        self.nodes.answered(node, assigned.as_ref().ok());
        match assigned {
            Ok(Assigned::Granted(leased)) => {
                self.dispatch(&leased, job, node, route_key);
                Placed::Done
            }
            Ok(Assigned::NodeFull) => Placed::Full,
            Ok(Assigned::NotWaiting(_)) => {
                debug!("run no longer waiting");
                Placed::Done
            }
            Err(e) => {
                warn!(error = %e, "assigning the run failed; its timer will retry");
                Placed::Done
            }
        }
    }

    /// Sends the dispatch of a run leased to `node` on its way; the lease is counted
    /// on the node already (`NodeCache::moved`).
    fn dispatch(&self, leased: &RunRecord, job: &JobRecord, node: &NodeRecord, route_key: &str) {
        debug!(node_id = %node.node_id, token = leased.fencing_token, shard = leased.shard_index, "dispatched");
        self.links.dispatch(node, leased, job, route_key);
    }

    /// Every eligible node is at its window: the run stays WAITING in the store (its
    /// timer routes it again every `route_retry`, on whichever instance sweeps it)
    /// however long that takes, unless the job has a timeout: a run that has waited
    /// longer than its timeout for capacity fails "timeout" (retried per its policy).
    /// Waiting for capacity never fails it "no_executor".
    ///
    /// Whether it still waits (false: it failed "timeout").
    async fn still_waiting(&self, run: &RunRecord) -> bool {
        let since = waiting_since(run);
        // Only a job with a timeout needs the store's clock (a round trip on Redis,
        // for every waiting run at every retry).
        let timed_out = run.plan.timeout_ms > 0
            && since > 0
            && self.store.runs.now().await.unwrap_or(0)
                >= since.saturating_add(run.plan.timeout_ms);
        if timed_out {
            self.fail_waiting(
                run,
                "timeout",
                "every eligible executor stayed at its window for longer than the job's timeout",
            )
            .await;
            false
        } else {
            debug!("every eligible node is at its window; the run waits");
            true
        }
    }

    /// No routable node of the job's group serves its handler: the run waits for one
    /// to connect (or to become ready) until `wait_until` (`dispatch_wait` after it
    /// became WAITING), then fails "no_executor" (retried per its policy).
    ///
    /// Time no server was up does not count: no executor could connect then. So until
    /// this instance has served for `dispatch_wait`, a run is not failed for want of an
    /// executor; after a restart its executors are still reconnecting (a run begun
    /// just before a `kill -9` would otherwise fail the moment the server is back).
    async fn no_node_yet(&self, run: &RunRecord, group: &str, handler: &str) {
        if self.serving_since.elapsed() < self.opts.dispatch_wait {
            debug!("no eligible node is connected yet; executors may be reconnecting");
            return;
        }
        let now = self.store.runs.now().await.unwrap_or(0);
        if run.deadlines.wait_until <= 0 || now >= run.deadlines.wait_until {
            self.fail_waiting(
                run,
                "no_executor",
                &format!("no healthy executor of group {group:?} serves handler {handler:?}"),
            )
            .await;
        } else {
            debug!("no eligible node is connected; the run waits for one");
        }
    }

    async fn fail_waiting(&self, run: &RunRecord, code: &str, message: &str) {
        warn!(%code, %message, "the attempt failed before it reached an executor");
        let outcome = Outcome {
            state: RunState::Failed,
            output: None,
            error_code: code.to_owned(),
            error_message: message.to_owned(),
            started_at: None,
            finished_at: None,
        };
        match self
            .store
            .runs
            .finish_run(
                &run.schedule_id,
                Finisher::Waiting {
                    attempt: run.attempt,
                },
                outcome,
            )
            .await
        {
            Ok(t) => Box::pin(self.follow_up(t)).await,
            Err(e) => warn!(error = %e, "failing the run failed; its timer will retry"),
        }
    }
}

/// Whether a run that finds every eligible node at its window waits in the room queue:
/// not when its strategy keeps its affinity (it waits for its own node, by its timer),
/// nor a broadcast run about to fan out.
fn waits_in_room(run: &RunRecord, job: &JobRecord) -> bool {
    match job.spec.route_strategy {
        RouteStrategy::ShardingBroadcast => !run.parent.is_empty(),
        other => !routing::keeps_affinity(other),
    }
}

/// A refill of one room queue under way; if it stops before its end (its future
/// dropped), the queue is no longer marked as being refilled.
struct RefillUnderWay<'a> {
    room: &'a Mutex<Room>,
    group: &'a str,
    handler: &'a str,
    done: bool,
}

impl Drop for RefillUnderWay<'_> {
    fn drop(&mut self) {
        if !self.done {
            lock(self.room).drop_refill(self.group, self.handler);
        }
    }
}

/// What routing a WAITING run came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Routed {
    /// Dispatched, or nothing more for routing to do now (no node connected yet, fanned
    /// out, moved on by someone else, failed, or the store failed and its timer brings
    /// it back).
    Settled,
    /// Every eligible node is at its window: it waits (in the room queue, if it may).
    NoRoom,
}

/// When a WAITING run began to wait (store clock), 0 if unknown: every step that
/// makes a run WAITING sets `wait_until` to that moment + `plan.dispatch_wait_ms`.
fn waiting_since(run: &RunRecord) -> i64 {
    if run.deadlines.wait_until > 0 {
        run.deadlines
            .wait_until
            .saturating_sub(run.plan.dispatch_wait_ms)
    } else {
        0
    }
}

/// Where routing sends a run (`Router::pick`); nodes are indexes into the
/// snapshot of the registry the pick was made from.
enum Pick {
    /// No healthy node of the group serves the handler.
    NoNode,
    /// Sharding broadcast: a shard for each of these nodes.
    Broadcast {
        nodes: Arc<Vec<NodeRecord>>,
        candidates: Vec<usize>,
        route_key: String,
    },
    /// The nodes to try in turn, the strategy's pick first (possibly none: every
    /// candidate is known to be at its window).
    Order {
        nodes: Arc<Vec<NodeRecord>>,
        order: Vec<usize>,
        route_key: String,
    },
}

/// Where an attempt to lease a run to one node left it.
enum Placed {
    /// Dispatched, or nothing more to do here (someone else moved the run on, or the
    /// store failed and the run's timer will bring it back).
    Done,
    /// The node is at its max concurrency: try another.
    Full,
}
