//! Dispatch: turns each trigger into a run and each routable run into a dispatch.
//!
//! Owns the trigger-queue consumer (a trigger is acknowledged only after `begin_run`
//! made its run durable — leased, skipped or queued — and a redelivered trigger finds
//! that run), the overlap policy's follow-up (revoked runs are sent `Cancel`), and
//! routing: a WAITING run goes to one healthy node of its group that serves its
//! handler, chosen by the job's strategy, under a lease granted by the store (which
//! also enforces the node's max concurrency across instances). The dispatch travels
//! on the node's stream, or through the inbox of the instance the node is attached
//! to. HTTP targets are leased to this instance's built-in HTTP executor instead.
//!
//! Nothing here is the only record of anything: a run that could not be routed now
//! stays WAITING with a timer in the store, and the sweeper (`sweeper`) brings it back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use sundial_proto::v1 as pb;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::deliver::alerts::Alerts;
use crate::dispatch::health::{self, Health, HealthPolicy};
use crate::dispatch::http_target::HttpTargets;
use crate::dispatch::links::Links;
use crate::dispatch::lock;
use crate::dispatch::routing::{self, NodeView, Route, RouteState};
use crate::fault::crash_point;
use crate::model::{JobRecord, RouteStrategy, RunPlan, RunRecord, RunState, Target, duration_ms};
use crate::store::{
    Assigned, Begun, Delivery, FannedOut, Finisher, JobStore, LeaseTerms, NodeRecord, NodeRegistry,
    NodeSlot, Outcome, Revocation, RunStore, Transition, TriggerQueue,
};

/// The store traits the dispatcher uses, each for its own part of the work.
#[derive(Clone)]
pub struct DispatchStore {
    /// Job definitions: a run's plan and route come from its job.
    pub jobs: Arc<dyn JobStore>,
    /// The triggers it consumes, and this instance's beat.
    pub triggers: Arc<dyn TriggerQueue>,
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

/// A registry snapshot and the health of each of its nodes, by index.
type Judged = (Arc<Vec<NodeRecord>>, Arc<Vec<Health>>);

/// The node registry as routing sees it, re-read at most every `node_refresh`, and
/// what this instance saw happen on each node since that read: leases it granted, less
/// the runs whose end a stream attached here reported. The snapshot's counts do not
/// show those yet; without them every run of a burst would see the same node as the
/// least busy one.
struct NodeCache {
    refresh: Duration,
    /// When it was read, the registry, and each node's health judged against its
    /// peers in it (once per read, not per routing decision).
    snapshot: tokio::sync::Mutex<(Option<Instant>, Judged)>,
    since_read: Mutex<HashMap<String, i64>>,
    policy: HealthPolicy,
}

impl NodeCache {
    fn new(refresh: Duration, policy: HealthPolicy) -> Self {
        Self {
            refresh,
            snapshot: tokio::sync::Mutex::new((None, (Arc::default(), Arc::default()))),
            since_read: Mutex::new(HashMap::new()),
            policy,
        }
    }

    async fn get(&self, store: &dyn NodeRegistry) -> Arc<Vec<NodeRecord>> {
        self.judged(store).await.0
    }

    /// The snapshot and the health of each of its nodes, by index.
    async fn judged(&self, store: &dyn NodeRegistry) -> Judged {
        let mut s = self.snapshot.lock().await;
        if s.0.is_none_or(|t| t.elapsed() >= self.refresh) {
            match store.list_nodes(None).await {
                Ok(nodes) => {
                    let health = nodes
                        .iter()
                        .map(|n| health::classify(n, &nodes, &self.policy))
                        .collect();
                    *s = (Some(Instant::now()), (Arc::new(nodes), Arc::new(health)));
                    lock(&self.since_read).clear();
                }
                Err(e) => {
                    warn!(error = %e, "reading the node registry failed; using the last snapshot")
                }
            }
        }
        s.1.clone()
    }

    /// Forgets the snapshot: the next routing decision reads the registry again.
    async fn invalidate(&self) {
        self.snapshot.lock().await.0 = None;
    }

    /// One more (`delta` 1: a lease granted here) or one fewer (-1: a run's end
    /// reported here) active run on `node_id` than the snapshot says.
    fn moved(&self, node_id: &str, delta: i64) {
        *lock(&self.since_read)
            .entry(node_id.to_owned())
            .or_default() += delta;
    }

    /// The node's active runs as routing should count them: the store's lease count
    /// when the registry was read, plus the leases granted here since, less the runs
    /// that ended here since (whether they were in the count or granted after it).
    /// The executor's own `active` figure is left out: a handler runs only on a lease
    /// (the go-ahead), so it never exceeds the lease count, and it comes with
    /// heartbeats, so it may be seconds old (an old high figure starved a node).
    fn busy(&self, node: &NodeRecord) -> u32 {
        let since = self.since(&node.node_id);
        u32::try_from((i64::from(node.leased) + since).max(0)).unwrap_or(u32::MAX)
    }

    /// The node holds its whole window as far as this instance knows (`busy`).
    fn at_window(&self, node: &NodeRecord) -> bool {
        node.max_concurrency > 0 && self.busy(node) >= node.max_concurrency
    }

    /// Leases granted on the node here since the snapshot, less the runs that ended.
    fn since(&self, node_id: &str) -> i64 {
        lock(&self.since_read).get(node_id).copied().unwrap_or(0)
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

pub struct Dispatcher {
    store: DispatchStore,
    opts: DispatchOptions,
    links: Arc<Links>,
    http: Arc<HttpTargets>,
    /// Where the run outcomes this instance applies are counted (and alerted).
    alerts: Arc<Alerts>,
    nodes: NodeCache,
    /// Job definitions by id, refreshed when a run names a newer version.
    jobs: Mutex<HashMap<String, Arc<JobRecord>>>,
    /// Per-job routing state (round-robin position, weights, hash ring).
    routes: Mutex<HashMap<String, RouteState>>,
    /// When this instance last sent each FAILING node a probe run.
    probes: Mutex<HashMap<String, Instant>>,
    /// When this instance began to serve: no run fails "no_executor" before it has
    /// served for `dispatch_wait` (see `no_node_yet`).
    serving_since: tokio::time::Instant,
}

/// Jobs whose triggers one dispatcher begins at once.
const BEGIN_CONCURRENCY: usize = 64;

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

impl Dispatcher {
    pub fn new(
        store: DispatchStore,
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
            jobs: Mutex::new(HashMap::new()),
            routes: Mutex::new(HashMap::new()),
            probes: Mutex::new(HashMap::new()),
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

    /// A stream attached here reported the end of a run on `node_id`: routing counts
    /// the node one run less busy until its next registry read.
    pub fn run_ended_on(&self, node_id: &str) {
        self.nodes.moved(node_id, -1);
    }

    /// Consumes the trigger queue until `shutdown`; the batch in hand is finished
    /// before it returns.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        info!(consumer = %self.opts.consumer, "dispatcher started");
        let mut last_reclaim = tokio::time::Instant::now();
        let mut backoff = Duration::from_millis(50);
        while !shutdown.is_cancelled() {
            let mut batch = match self
                .store
                .triggers
                .read_triggers(
                    &self.opts.consumer,
                    self.opts.batch_size,
                    self.opts.read_block,
                )
                .await
            {
                Ok(b) => b,
                Err(e) => {
                    warn!(error = %e, "reading triggers failed; retrying");
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                    continue;
                }
            };
            backoff = Duration::from_millis(50);
            if last_reclaim.elapsed() >= self.opts.reclaim_every {
                last_reclaim = tokio::time::Instant::now();
                batch.extend(self.reclaim().await);
            }
            self.begin_all(batch).await;
        }
        info!("dispatcher stopped");
    }

    /// Runs of different jobs begin concurrently; one job's triggers keep their queue
    /// order (it matters to the serial policy).
    async fn begin_all(&self, batch: Vec<Delivery>) {
        let mut by_job: HashMap<String, Vec<Delivery>> = HashMap::new();
        for d in batch {
            by_job.entry(d.trigger.job_id.clone()).or_default().push(d);
        }
        futures::stream::iter(by_job.into_values())
            .for_each_concurrent(BEGIN_CONCURRENCY, |group| async {
                for d in group {
                    self.begin(d).await;
                }
            })
            .await;
    }

    /// Beats for this instance every third of `instance_ttl` until `shutdown`, and
    /// begins at once the triggers an instance whose beat ran out (killed) had read
    /// and not acknowledged: their runs begin about `instance_ttl` after its death
    /// instead of `reclaim_idle` (which stays the net for instances that never beat).
    /// Beats have their own task, so a busy dispatch loop never looks dead.
    pub async fn keep_alive(self: Arc<Self>, shutdown: CancellationToken) {
        let me = self.opts.consumer.clone();
        let mut tick = tokio::time::interval(self.opts.instance_ttl / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            let dead = match self
                .store
                .triggers
                .beat_instance(&me, self.opts.instance_ttl)
                .await
            {
                Ok(d) => d,
                Err(e) => {
                    warn!(error = %e, "beating failed; other instances may take this one's triggers");
                    continue;
                }
            };
            for instance in dead {
                match self
                    .store
                    .triggers
                    .take_over_triggers(&instance, &me, self.opts.batch_size)
                    .await
                {
                    Ok(taken) if taken.is_empty() => {}
                    Ok(taken) => {
                        info!(%instance, count = taken.len(), "took over the triggers of an instance that stopped beating");
                        self.begin_all(taken).await;
                    }
                    Err(e) => {
                        warn!(%instance, error = %e, "taking over a dead instance's triggers failed")
                    }
                }
            }
        }
    }

    async fn reclaim(&self) -> Vec<Delivery> {
        let reclaimed = self
            .store
            .triggers
            .reclaim_triggers(
                &self.opts.consumer,
                self.opts.reclaim_idle,
                self.opts.batch_size,
            )
            .await
            .unwrap_or_else(|e| {
                warn!(error = %e, "reclaiming triggers failed");
                Vec::new()
            });
        if !reclaimed.is_empty() {
            info!(count = reclaimed.len(), "took over unacknowledged triggers");
        }
        let cutoff = self
            .store
            .runs
            .now()
            .await
            .map(|now| now - duration_ms(self.opts.queue_retention));
        if let Ok(cutoff) = cutoff
            && let Err(e) = self.store.triggers.trim_triggers(cutoff).await
        {
            warn!(error = %e, "trimming the trigger queue failed");
        }
        reclaimed
    }

    /// The job as of at least `version` (None when it is gone).
    async fn job(&self, job_id: &str, version: u64) -> Option<Arc<JobRecord>> {
        if let Some(j) = lock(&self.jobs).get(job_id)
            && j.version >= version
        {
            return Some(j.clone());
        }
        match self.store.jobs.get_job(job_id).await {
            Ok(Some(j)) => {
                let j = Arc::new(j);
                lock(&self.jobs).insert(job_id.to_owned(), j.clone());
                Some(j)
            }
            Ok(None) => {
                lock(&self.jobs).remove(job_id);
                None
            }
            Err(e) => {
                warn!(%job_id, error = %e, "reading the job failed");
                None
            }
        }
    }

    /// Begins the trigger's run, then acknowledges the trigger and routes the run. On
    /// a store error the trigger stays unacknowledged and comes back through reclaim.
    /// A run of an executor job whose node routing can name now is begun and leased
    /// to it in one store decision (`begin_and_assign`); if that node is full, or the
    /// run is queued or skipped, it goes on as any begun run.
    async fn begin(&self, d: Delivery) {
        let schedule_id = d.trigger.schedule_id();
        let span = info_span!("dispatch", job_id = %d.trigger.job_id, %schedule_id);
        async {
            crash_point("dispatch.before_record");
            let mut run = RunRecord::from_trigger(&d.trigger);
            let job = self.job(&d.trigger.job_id, d.trigger.job_version).await;
            if let Some(job) = &job {
                run.plan = run_plan(job, &self.opts);
            }
            let first = match &job {
                Some(job) => self.first_node(&run, job).await,
                None => None,
            };
            let node = first.as_ref().map(|(nodes, i, _)| &nodes[*i]);
            let (begun, assigned) = match self.begin_on(run, node).await {
                Ok(b) => b,
                Err(e) => {
                    warn!(error = %e, "beginning the run failed; the trigger will be retried");
                    return;
                }
            };
            debug!(created = begun.created, state = %begun.run.state, reason = %begun.run.reason, "run begun");
            self.alerts.metrics().record_begun(&begun);
            crash_point("dispatch.before_ack");
            if let Err(e) = self.store.triggers.ack_trigger(&d.entry_id).await {
                warn!(error = %e, "acknowledging the trigger failed; it will be redelivered");
            }
            for rv in &begun.revoked {
                self.send_cancel(rv).await;
            }
            match (assigned, &first, &job) {
                (Some(Assigned::Granted(leased)), Some((nodes, i, route_key)), Some(job)) => {
                    self.dispatch(&leased, job, &nodes[*i], route_key).await;
                }
                (Some(Assigned::NotWaiting(_)), _, _) => debug!("run no longer waiting"),
                // Not assigned here (no node named, or it was full), or a trigger seen
                // again whose run is still waiting: routed as any waiting run.
                _ if begun.run.state == RunState::Waiting && begun.run.deadlines.wake_at > 0 => {
                    self.route(begun.run).await;
                }
                _ => {}
            }
        }
        .instrument(span)
        .await;
    }

    /// Begins the run; when routing named a node for it, leases it to that node in
    /// the same store decision (`begin_and_assign`: its outcome is `Some` when tried).
    async fn begin_on(
        &self,
        run: RunRecord,
        node: Option<&NodeRecord>,
    ) -> crate::store::Result<(Begun, Option<Assigned>)> {
        let grace = self.opts.route_retry;
        let Some(node) = node else {
            return self
                .store
                .runs
                .begin_run(run, grace)
                .await
                .map(|b| (b, None));
        };
        let slot = NodeSlot {
            node_id: node.node_id.clone(),
            max_concurrency: node.max_concurrency,
        };
        // Counted on the node from the pick on, not from the grant: the begins of a
        // burst pick side by side, and least active must see the runs its neighbours
        // are about to lease.
        self.nodes.moved(&slot.node_id, 1);
        let begun = self
            .store
            .runs
            .begin_and_assign(run, grace, &slot, self.opts.lease)
            .await;
        if !matches!(begun, Ok((_, Some(Assigned::Granted(_))))) {
            self.nodes.moved(&slot.node_id, -1);
        }
        begun
    }

    /// The node routing would try first for a run of `job` about to begin, when it
    /// is an executor job routed to one node and some node can take it now.
    async fn first_node(
        &self,
        run: &RunRecord,
        job: &JobRecord,
    ) -> Option<(Arc<Vec<NodeRecord>>, usize, String)> {
        let Target::Executor { group, handler } = &job.spec.target else {
            return None;
        };
        match self.pick(run, job, group, handler).await {
            Pick::Order {
                nodes,
                order,
                route_key,
            } => order.first().map(|&i| (nodes, i, route_key)),
            Pick::NoNode | Pick::Broadcast { .. } => None,
        }
    }

    /// Acts on what a transition left to do: count it (metrics and alerts, when
    /// applied), cancel a revoked lease, route the serial run it released. Every
    /// applied transition but `begin_run` and the HTTP executor's results comes here
    /// once.
    pub async fn follow_up(&self, t: Transition) {
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
        let (schedule_id, shard_index) = RunRecord::wire_ref(&rv.schedule_id);
        let cancel = pb::server_message::Msg::Cancel(pb::Cancel {
            run: Some(pb::RunRef {
                schedule_id: schedule_id.to_owned(),
                attempt: rv.attempt,
                fencing_token: rv.token,
                shard_index,
            }),
            reason: rv.reason.clone(),
        });
        self.links.deliver(&rv.node_id, &instance, cancel).await;
    }

    /// Routes a WAITING run: leases it to a node and sends the dispatch. When no node
    /// can take it now, it stays WAITING (its timer brings it back) until its wait
    /// runs out; when its group has no healthy node at all, the attempt fails with
    /// "no executor" (retried per the job's policy).
    pub async fn route(&self, run: RunRecord) {
        let span = info_span!("route", job_id = %run.job_id, schedule_id = %run.schedule_id, attempt = run.attempt);
        async {
            let Some(job) = self.job(&run.job_id, run.job_version).await else {
                self.fail_waiting(&run, "no_job", "the job was deleted")
                    .await;
                return;
            };
            match &job.spec.target {
                Target::Http { .. } => self.route_http(&run, &job).await,
                Target::Executor { group, handler } => {
                    self.route_executor(&run, &job, group, handler).await;
                }
            }
        }
        .instrument(span)
        .await;
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
            Ok(Assigned::NodeFull) => self.still_waiting(run).await,
            Ok(Assigned::NotWaiting(_)) => debug!("run no longer waiting"),
            Err(e) => warn!(error = %e, "assigning the run failed; its timer will retry"),
        }
    }

    async fn route_executor(&self, run: &RunRecord, job: &JobRecord, group: &str, handler: &str) {
        match self.pick(run, job, group, handler).await {
            Pick::NoNode => self.no_node_yet(run, group, handler).await,
            Pick::Broadcast {
                nodes,
                candidates,
                route_key,
            } => {
                let candidates = candidates.iter().map(|&i| &nodes[i]).collect();
                self.broadcast(run, job, candidates, &route_key).await;
            }
            Pick::Order {
                nodes,
                order,
                route_key,
            } => {
                for i in order {
                    match self.assign_to(run, job, &nodes[i], &route_key).await {
                        Placed::Done => return,
                        Placed::Full => continue,
                    }
                }
                self.still_waiting(run).await;
            }
        }
    }

    /// Where routing sends the run: the healthy nodes of its group that serve its
    /// handler, in the order to try them (the job's strategy's pick first), or every
    /// one of them for a sharding broadcast. Takes a turn of the job's round-robin
    /// counter where the strategy draws one.
    async fn pick(&self, run: &RunRecord, job: &JobRecord, group: &str, handler: &str) -> Pick {
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
        // A retry prefers another node than the one that just failed it.
        let mut candidates: Vec<usize> = eligible
            .iter()
            .copied()
            .filter(|&i| snapshot[i].node_id != run.last_node)
            .collect();
        if candidates.is_empty() {
            candidates = eligible;
        }
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
        let shared = match strategy {
            RouteStrategy::RoundRobin
            | RouteStrategy::WeightedRoundRobin
            | RouteStrategy::Busyover => {
                match self.store.nodes.next_route_counter(&run.job_id).await {
                    Ok(n) => Some(n),
                    Err(e) => {
                        debug!(error = %e, "shared route counter unavailable; using this instance's");
                        None
                    }
                }
            }
            _ => None,
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
        let mut order: Vec<usize> = candidates
            .into_iter()
            .filter(|&i| !keeps_affinity(strategy) || snapshot[i].node_id == first)
            .filter(|&i| !self.nodes.at_window(&snapshot[i]))
            .collect();
        order.sort_by_key(|&i| {
            let n = &snapshot[i];
            let slow = health[i] == Health::Slow;
            (
                n.node_id != first,
                slow,
                self.nodes.busy(n),
                n.node_id.clone(),
            )
        });
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
        let slot = NodeSlot {
            node_id: node.node_id.clone(),
            max_concurrency: node.max_concurrency,
        };
        match self
            .store
            .runs
            .assign_run(&run.schedule_id, run.attempt, &slot, self.opts.lease)
            .await
        {
            Ok(Assigned::Granted(leased)) => {
                self.nodes.moved(&node.node_id, 1);
                self.dispatch(&leased, job, node, route_key).await;
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
    async fn dispatch(
        &self,
        leased: &RunRecord,
        job: &JobRecord,
        node: &NodeRecord,
        route_key: &str,
    ) {
        let dispatch = dispatch_message(leased, job, route_key);
        debug!(node_id = %node.node_id, token = leased.fencing_token, shard = leased.shard_index, "dispatched");
        self.links
            .deliver(&node.node_id, &node.instance, dispatch)
            .await;
    }

    /// Every eligible node is at its window: the run stays WAITING in the store (its
    /// timer routes it again every `route_retry`, on whichever instance sweeps it)
    /// however long that takes, unless the job has a timeout: a run that has waited
    /// longer than its timeout for capacity fails "timeout" (retried per its policy).
    /// Waiting for capacity never fails it "no_executor".
    async fn still_waiting(&self, run: &RunRecord) {
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
        } else {
            debug!("every eligible node is at its window; the run waits");
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

/// Strategies whose choice is the node itself (a key's node, the first healthy one):
/// when it is at its window the run waits for it rather than moving elsewhere.
fn keeps_affinity(strategy: RouteStrategy) -> bool {
    matches!(
        strategy,
        RouteStrategy::ConsistentHash | RouteStrategy::Failover | RouteStrategy::First
    )
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

/// Where routing sends a run (`Dispatcher::pick`); nodes are indexes into the
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

fn dispatch_message(run: &RunRecord, job: &JobRecord, route_key: &str) -> pb::server_message::Msg {
    let handler = match &job.spec.target {
        Target::Executor { handler, .. } => handler.clone(),
        Target::Http { .. } => String::new(),
    };
    pb::server_message::Msg::Dispatch(pb::Dispatch {
        run: Some(pb::RunRef {
            schedule_id: run.wire_id().to_owned(),
            attempt: run.attempt,
            fencing_token: run.fencing_token,
            shard_index: run.shard_index,
        }),
        job_id: run.job_id.clone(),
        handler,
        payload: run
            .payload_override
            .clone()
            .unwrap_or_else(|| job.spec.payload.clone()),
        route_key: route_key.to_owned(),
        shard_total: run.shard_total.max(1),
        deadline_ms: run.plan.timeout_ms,
        scheduled_at_ms: run.scheduled_at,
        labels: job.spec.labels.clone().into_iter().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache() -> NodeCache {
        NodeCache::new(Duration::from_secs(60), HealthPolicy::default())
    }

    fn node(id: &str, window: u32, leased: u32) -> NodeRecord {
        NodeRecord {
            node_id: id.into(),
            group: "g".into(),
            handlers: vec!["h".into()],
            weight: 1,
            max_concurrency: window,
            labels: Default::default(),
            instance: "i".into(),
            session: String::new(),
            ready: true,
            draining: false,
            silent_since: 0,
            // The executor's own figure, seconds old: never counted.
            active: 1_000,
            leased,
            load: 0.0,
            mean_duration_ms: 0,
            recent_errors: 0,
            recent_results: 0,
            recent_faults: 0,
            by_handler: Vec::new(),
            connected_at: 0,
            last_heartbeat: 0,
        }
    }

    #[test]
    fn the_window_counts_the_store_leases_plus_what_happened_here_since() {
        let c = cache();
        let n = node("a", 4, 3);
        assert_eq!(c.busy(&n), 3);
        assert!(!c.at_window(&n), "one credit left");
        c.moved("a", 1);
        assert!(c.at_window(&n), "the lease granted here spent it");
        c.moved("a", -1);
        assert!(!c.at_window(&n), "a run that ended here returns it");
        // More ends seen here than the snapshot counted (runs granted and ended since
        // the read): never below zero, and the other nodes are untouched.
        for _ in 0..5 {
            c.moved("a", -1);
        }
        assert_eq!(c.busy(&n), 0);
        assert_eq!(c.busy(&node("b", 4, 2)), 2);
        // A node with window 0 (the HTTP target's unlimited one) is never full.
        let unlimited = node("h", 0, 10_000);
        assert!(!c.at_window(&unlimited));
    }
}
