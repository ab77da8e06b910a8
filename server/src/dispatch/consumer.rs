//! The trigger-queue consumer: reads triggers in batches, begins their runs (begun and
//! leased in one store decision when the router can name a node with room),
//! acknowledges each trigger only once its run is durable, takes over the triggers of
//! instances whose beat ran out, and keeps this instance's own beat. Where a run goes
//! is the [`Router`]'s decision.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::dispatch::router::First;
use crate::dispatch::{DispatchOptions, Router, run_plan};
use crate::fault::crash_point;
use crate::model::{JobRecord, RunRecord, duration_ms};
use crate::store::{
    Assigned, BeginOn, Begun, Delivery, NodeSlot, RunStore, TriggerQueue, rounds_by_job,
};

/// Runs one consumer begins (those not leased in the wave's one call) or sends on at
/// once.
const BEGIN_CONCURRENCY: usize = 64;

/// Runs of a wave routed and begun together. Each part's routing sees the slots the
/// part before it took and the runs that ended meanwhile: a whole batch routed at
/// once would find the nodes' windows spent by its first few hundred runs and send
/// the rest through the room (a begin, then a lease: two store calls instead of one).
const WAVE_PART: usize = 64;

/// Parts of a wave begun side by side by an instance alone. One at a time, a consumer
/// waited for each part's store call (behind the starts and results queued at the
/// store) before it routed the next: a 100,000-run burst kept Redis about three
/// quarters busy. Four keep it busy; eight send more runs through the room (a part's
/// routing sees the slots the others asked for, not the runs they will end), and so
/// do two on each of two instances (each routes blind to the other's asks), so an
/// instance that shares the queue begins one part at a time.
const PARTS_IN_FLIGHT: usize = 4;

/// The longest an instance whose last batch sent runs to its room waits before it reads
/// again while other instances are alive. Each instance's room is refilled at once when
/// a run ends on an executor attached to it, and from the others' rooms only at their
/// routing ticks: an instance that read the whole of a burst (a batch begins in a few
/// store calls) fed its own executors and left the others' idle. Pausing for about as
/// long as its batch took lets the others read their share first.
const MAX_YIELD: Duration = Duration::from_millis(200);

/// This instance's consumer of the trigger queue.
pub struct TriggerConsumer {
    /// The triggers it consumes, and this instance's beat.
    triggers: Arc<dyn TriggerQueue>,
    /// Where runs begin (and the store's clock, for trimming the queue).
    runs: Arc<dyn RunStore>,
    router: Arc<Router>,
    opts: DispatchOptions,
}

impl TriggerConsumer {
    pub fn new(
        triggers: Arc<dyn TriggerQueue>,
        runs: Arc<dyn RunStore>,
        router: Arc<Router>,
    ) -> Self {
        let opts = router.options().clone();
        Self {
            triggers,
            runs,
            router,
            opts,
        }
    }

    /// Consumes the trigger queue until `shutdown`; the batch in hand is finished
    /// before it returns.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        info!(consumer = %self.opts.consumer, "trigger consumer started");
        let mut last_reclaim = tokio::time::Instant::now();
        let mut backoff = Duration::from_millis(50);
        while !shutdown.is_cancelled() {
            let mut batch = match self
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
            let started = tokio::time::Instant::now();
            if self.begin_all(batch).await > 0 && self.triggers.others_alive() {
                // Its runs wait in this instance's room: let the others read the next
                // triggers (see `MAX_YIELD`).
                let pause = started.elapsed().min(MAX_YIELD);
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(pause) => {}
                }
            }
        }
        info!("trigger consumer stopped");
    }

    /// The batch begins in waves: wave k holds each job's k-th trigger (one job's
    /// triggers keep their queue order, which the serial policy needs), each wave in
    /// parts of [`WAVE_PART`] runs begun together, [`PARTS_IN_FLIGHT`] parts side by
    /// side while this instance reads the queue alone (a part's runs are of distinct
    /// jobs, and so are the wave's). What follows a run's begin (its dispatch, or
    /// routing, which may take store calls of its own) goes on while the next parts
    /// begin, at most [`BEGIN_CONCURRENCY`] runs at a time: one run slow to route
    /// holds no part back. The triggers whose runs are durable are acknowledged
    /// together once the batch is done (one store call, not one per run; a trigger
    /// redelivered meanwhile finds its run).
    async fn begin_all(&self, batch: Vec<Delivery>) -> usize {
        let wanted = batch
            .iter()
            .map(|d| (d.trigger.job_id.as_str(), d.trigger.job_version));
        self.router.prefetch_jobs(wanted).await;
        let mut going = futures::stream::FuturesUnordered::new();
        let mut durable = Vec::new();
        let mut roomed = 0;
        for wave in rounds_by_job(batch, |d| d.trigger.job_id.clone()) {
            // The next wave waits for all of this one's parts (a job's next trigger is
            // in it). With other instances reading too, their parts ask the same
            // nodes' windows, which this one's routing does not see: one at a time.
            let in_flight = if self.triggers.others_alive() {
                1
            } else {
                PARTS_IN_FLIGHT
            };
            let mut parts = wave.into_iter().peekable();
            let mut begins = futures::stream::FuturesUnordered::new();
            loop {
                while begins.len() < in_flight
                    && going.len() <= BEGIN_CONCURRENCY
                    && parts.peek().is_some()
                {
                    let part: Vec<Delivery> = parts.by_ref().take(WAVE_PART).collect();
                    begins.push(self.begin_part(part));
                }
                if begins.is_empty() && parts.peek().is_none() {
                    break;
                }
                // Both polled together: a run going on may wait for what a part in
                // flight holds (the node snapshot's lock across its read), and the
                // reverse.
                tokio::select! {
                    Some(begun) = begins.next(), if !begins.is_empty() => {
                        for (p, b) in begun {
                            roomed += usize::from(matches!(p.first, First::NoRoom));
                            match self.go_on_now(p, b) {
                                Ok(entry) => durable.extend(entry),
                                Err(left) => going.push(self.go_on_later(*left)),
                            }
                        }
                    }
                    Some(done) = going.next(), if !going.is_empty() => durable.extend(done),
                    else => break,
                }
            }
        }
        while let Some(done) = going.next().await {
            durable.extend(done);
        }
        if !durable.is_empty()
            && let Err(e) = self.triggers.ack_triggers(&durable).await
        {
            warn!(error = %e, count = durable.len(), "acknowledging triggers failed; they will be redelivered");
        }
        roomed
    }

    /// Begins a part of a wave (runs of distinct jobs): those whose node routing can
    /// name now begun and leased to it in one store call for them all
    /// (`begin_and_assign_many`: on Redis one script call per partition), the others
    /// begun one by one. Each run with its begin's outcome. The round-robin turns the
    /// part's picks take are drawn first, in one store call for the part (counters
    /// shared with other instances: a round trip each otherwise); the runs are then
    /// routed concurrently, so a pick that still takes a store call waits beside the
    /// others, not after them.
    async fn begin_part(&self, part: Vec<Delivery>) -> Vec<(Prepared, Begin)> {
        let mut to_lease = Vec::new();
        let mut alone = Vec::new();
        let runs = part
            .iter()
            .map(|d| (d.trigger.job_id.as_str(), d.trigger.job_version));
        let turns = self.router.draw_turns(runs).await;
        let prepared = futures::future::join_all(part.into_iter().map(|d| {
            let turn = turns.get(&d.trigger.job_id).copied();
            self.prepare(d, turn)
        }))
        .await;
        for (p, run, slot) in prepared {
            match slot {
                Some(slot) => to_lease.push((p, run, slot)),
                None => alone.push((p, run)),
            }
        }
        let alone = futures::stream::iter(alone)
            .map(|(p, run)| async move {
                let begun = self.runs.begin_run(run, p.grace).await;
                (p, begun.map(|b| (b, None)))
            })
            .buffer_unordered(BEGIN_CONCURRENCY)
            .collect::<Vec<_>>();
        let (mut leased, alone) = futures::join!(self.begin_and_lease(to_lease), alone);
        leased.extend(alone);
        leased
    }

    /// A trigger's run as it will be begun (its plan from its job), with the node
    /// routing would try first, how long its timer waits and the slot to ask of that
    /// node (counted as asked at once, so the picks after it see it).
    async fn prepare(
        &self,
        d: Delivery,
        turn: Option<u64>,
    ) -> (Prepared, RunRecord, Option<NodeSlot>) {
        let span = info_span!("dispatch", job_id = %d.trigger.job_id, schedule_id = %d.trigger.schedule_id());
        async {
            crash_point("dispatch.before_record");
            let mut run = RunRecord::from_trigger(&d.trigger);
            let job = self
                .router
                .job(&d.trigger.job_id, d.trigger.job_version)
                .await;
            if let Some(job) = &job {
                run.plan = run_plan(job, &self.opts);
            }
            let first = match &job {
                Some(job) => self.router.first_node(&run, job, turn).await,
                None => First::Other,
            };
            let grace = self.router.begin_grace(&first, &run);
            let slot = first.node().map(|n| self.router.asking(n));
            let p = Prepared {
                entry_id: d.entry_id,
                job,
                first,
                grace,
                span: tracing::Span::current(),
            };
            (p, run, slot)
        }
        .instrument(span)
        .await
    }

    /// Begins the runs routing named a node for and leases each to the slot asked
    /// of it, in one store call (`begin_and_assign_many`); each run's outcome, or
    /// the batch's error.
    async fn begin_and_lease(
        &self,
        runs: Vec<(Prepared, RunRecord, NodeSlot)>,
    ) -> Vec<(Prepared, Begin)> {
        if runs.is_empty() {
            return Vec::new();
        }
        let mut prepared = Vec::with_capacity(runs.len());
        let mut items = Vec::with_capacity(runs.len());
        for (p, run, node) in runs {
            items.push(BeginOn {
                run,
                route_grace: p.grace,
                node,
            });
            prepared.push(p);
        }
        let outcomes = self
            .runs
            .begin_and_assign_many(items, self.opts.lease)
            .await;
        let outcomes: Vec<Begin> = match outcomes {
            Ok(o) => o.into_iter().map(Ok).collect(),
            Err(e) => {
                let e = e.to_string();
                prepared
                    .iter()
                    .map(|_| Err(crate::store::Error::Unavailable(e.clone())))
                    .collect()
            }
        };
        prepared
            .into_iter()
            .zip(outcomes)
            .map(|(p, outcome)| {
                if let Some(node) = p.first.node() {
                    let assigned = outcome.as_ref().ok().and_then(|(_, a)| a.as_ref());
                    self.router.answered(node, assigned);
                }
                (p, outcome)
            })
            .collect()
    }

    /// What follows a run's begin: the metrics, then its dispatch or routing (the
    /// router's `begun`), as far as it goes without an await: the common run, leased
    /// to a node, is dispatched now (on its stream here, or queued for its instance's
    /// inbox). Ok with the trigger's entry once
    /// its run is durable (to be acknowledged), or None when beginning failed (the
    /// trigger will be delivered again); Err with what is left for
    /// [`go_on_later`](Self::go_on_later).
    fn go_on_now(&self, p: Prepared, begun: Begin) -> Result<Option<String>, Left> {
        let span = p.span.clone();
        let _in = span.enter();
        let (begun, assigned) = match begun {
            Ok(b) => b,
            Err(e) => {
                warn!(error = %e, "beginning the run failed; the trigger will be retried");
                return Ok(None);
            }
        };
        debug!(created = begun.created, state = %begun.run.state, reason = %begun.run.reason, "run begun");
        self.router.count_begun(&begun);
        crash_point("dispatch.before_ack");
        match self
            .router
            .begun_at_once(begun, assigned, &p.first, p.job.as_deref())
        {
            None => Ok(Some(p.entry_id)),
            Some((begun, assigned)) => Err(Box::new((p, begun, assigned))),
        }
    }

    /// The rest of [`go_on_now`](Self::go_on_now): the router's `begun` (cancels for
    /// revoked leases, routing). The trigger's entry, to be acknowledged.
    async fn go_on_later(
        &self,
        (p, begun, assigned): (Prepared, Begun, Option<Assigned>),
    ) -> Option<String> {
        self.router
            .begun(begun, assigned, &p.first, p.job.as_deref())
            .instrument(p.span.clone())
            .await;
        Some(p.entry_id)
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
            .runs
            .now()
            .await
            .map(|now| now - duration_ms(self.opts.queue_retention));
        if let Ok(cutoff) = cutoff
            && let Err(e) = self.triggers.trim_triggers(cutoff).await
        {
            warn!(error = %e, "trimming the trigger queue failed");
        }
        reclaimed
    }
}

/// A run's begin as the store answered it (with the assignment tried, if any).
type Begin = crate::store::Result<(Begun, Option<Assigned>)>;

/// A begun run whose going on needs an await (`TriggerConsumer::go_on_later`), boxed
/// (the common run needs none).
type Left = Box<(Prepared, Begun, Option<Assigned>)>;

/// A trigger's run about to begin (`TriggerConsumer::prepare`).
struct Prepared {
    entry_id: String,
    job: Option<Arc<JobRecord>>,
    first: First,
    grace: Duration,
    /// The run's `dispatch` span (job_id, schedule_id).
    span: tracing::Span,
}
