//! The trigger-queue consumer: reads triggers in batches, begins their runs (begun and
//! leased in one store decision when routing can name a node with room), acknowledges
//! each trigger only once its run is durable, takes over the triggers of instances
//! whose beat ran out, and keeps this instance's own beat.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use super::{BEGIN_CONCURRENCY, Dispatcher, Pick, run_plan, waits_in_room};
use crate::dispatch::lock;
use crate::fault::crash_point;
use crate::model::{JobRecord, RunRecord, RunState, Target, duration_ms};
use crate::store::{Assigned, Begun, Delivery, NodeRecord};

impl Dispatcher {
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
    /// order (it matters to the serial policy). The triggers whose runs are durable are
    /// acknowledged together once the batch is done (one store call, not one per run;
    /// a trigger redelivered meanwhile finds its run).
    async fn begin_all(&self, batch: Vec<Delivery>) {
        self.prefetch_jobs(&batch).await;
        let mut by_job: HashMap<String, Vec<Delivery>> = HashMap::new();
        for d in batch {
            by_job.entry(d.trigger.job_id.clone()).or_default().push(d);
        }
        let durable = std::sync::Mutex::new(Vec::new());
        futures::stream::iter(by_job.into_values())
            .for_each_concurrent(BEGIN_CONCURRENCY, |group| async {
                for d in group {
                    if let Some(entry_id) = self.begin(d).await {
                        lock(&durable).push(entry_id);
                    }
                }
            })
            .await;
        let durable = durable.into_inner().unwrap_or_else(|e| e.into_inner());
        if durable.is_empty() {
            return;
        }
        if let Err(e) = self.store.triggers.ack_triggers(&durable).await {
            warn!(error = %e, count = durable.len(), "acknowledging triggers failed; they will be redelivered");
        }
    }

    /// Reads the jobs of a batch that the cache does not hold at their trigger's version
    /// in one store call per partition, instead of one call per run as each begins
    /// (a burst of jobs firing for the first time would read each job alone). A job
    /// not found, or a store error, is left to `job`, which reads it on its own.
    async fn prefetch_jobs(&self, batch: &[Delivery]) {
        let missing: Vec<String> = {
            let jobs = lock(&self.jobs);
            let ids: BTreeSet<&str> = batch
                .iter()
                .map(|d| &d.trigger)
                .filter(|t| {
                    jobs.get(&t.job_id)
                        .is_none_or(|j| j.version < t.job_version)
                })
                .map(|t| t.job_id.as_str())
                .collect();
            ids.into_iter().map(str::to_owned).collect()
        };
        if missing.is_empty() {
            return;
        }
        match self.store.jobs.get_jobs(&missing).await {
            Ok(found) => self.cache_jobs(found),
            Err(e) => debug!(error = %e, "reading a batch's jobs failed; each run reads its own"),
        }
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

    /// A run of an executor job whose node routing can name now is begun and leased
    /// to it in one store decision (`begin_and_assign`); if that node is full, or the
    /// run is queued or skipped, it goes on as any begun run. Answers the trigger's
    /// entry once its run is durable (to be acknowledged), None when beginning failed
    /// (the trigger will be delivered again).
    async fn begin(&self, d: Delivery) -> Option<String> {
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
                None => First::Other,
            };
            let (first, grace) = match first {
                First::Node(nodes, i, route_key) => (Some((nodes, i, route_key)), self.opts.route_retry),
                // It will wait in the room, which routes it when a slot frees: its timer
                // is only for an instance that dies meanwhile.
                First::NoRoom => (None, self.room_grace(run.plan.timeout_ms)),
                First::Other => (None, self.opts.route_retry),
            };
            let node = first.as_ref().map(|(nodes, i, _)| &nodes[*i]);
            let (begun, assigned) = match self.begin_on(run, node, grace).await {
                Ok(b) => b,
                Err(e) => {
                    warn!(error = %e, "beginning the run failed; the trigger will be retried");
                    return None;
                }
            };
            debug!(created = begun.created, state = %begun.run.state, reason = %begun.run.reason, "run begun");
            self.alerts.metrics().record_begun(&begun);
            crash_point("dispatch.before_ack");
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
            Some(d.entry_id)
        }
        .instrument(span)
        .await
    }

    /// Begins the run; when routing named a node for it, leases it to that node in
    /// the same store decision (`begin_and_assign`: its outcome is `Some` when tried).
    async fn begin_on(
        &self,
        run: RunRecord,
        node: Option<&NodeRecord>,
        grace: std::time::Duration,
    ) -> crate::store::Result<(Begun, Option<Assigned>)> {
        let Some(node) = node else {
            return self
                .store
                .runs
                .begin_run(run, grace)
                .await
                .map(|b| (b, None));
        };
        // Least active must see the runs the begins beside this one are about to lease.
        let slot = self.nodes.asking(node);
        let begun = self
            .store
            .runs
            .begin_and_assign(run, grace, &slot, self.opts.lease)
            .await;
        let assigned = begun.as_ref().ok().and_then(|(_, a)| a.as_ref());
        self.nodes.answered(node, assigned);
        begun
    }

    /// The node routing would try first for a run of `job` about to begin, when it
    /// is an executor job routed to one node and some node can take it now.
    async fn first_node(&self, run: &RunRecord, job: &JobRecord) -> First {
        let Target::Executor { group, handler } = &job.spec.target else {
            return First::Other;
        };
        let roomy = waits_in_room(run, job);
        if roomy && lock(&self.room).waiting(group, handler) {
            // Older runs wait for a slot on these nodes: this one goes behind them.
            return First::NoRoom;
        }
        match self.pick(run, job, group, handler).await {
            Pick::Order {
                nodes,
                order,
                route_key,
            } => match order.first() {
                Some(&i) => First::Node(nodes, i, route_key),
                None if roomy => First::NoRoom,
                None => First::Other,
            },
            Pick::NoNode | Pick::Broadcast { .. } => First::Other,
        }
    }
}

/// Where a run about to begin would go first.
enum First {
    /// To this node of the snapshot, with this route key.
    Node(Arc<Vec<NodeRecord>>, usize, String),
    /// Into the room queue: every eligible node is at its window, or runs wait already.
    NoRoom,
    /// Anywhere else (no node, a broadcast, an HTTP target, a run that waits by its
    /// timer): routed as any begun run.
    Other,
}
