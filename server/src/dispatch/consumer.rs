//! The trigger-queue consumer: reads triggers in batches, begins their runs (begun and
//! leased in one store decision when the router can name a node with room),
//! acknowledges each trigger only once its run is durable, takes over the triggers of
//! instances whose beat ran out, and keeps this instance's own beat. Where a run goes
//! is the [`Router`]'s decision.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::dispatch::router::First;
use crate::dispatch::{DispatchOptions, Router, lock, run_plan};
use crate::fault::crash_point;
use crate::model::{RunRecord, duration_ms};
use crate::store::{Assigned, Begun, Delivery, RunStore, TriggerQueue};

/// Jobs whose triggers one consumer begins at once.
const BEGIN_CONCURRENCY: usize = 64;

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
            self.begin_all(batch).await;
        }
        info!("trigger consumer stopped");
    }

    /// Runs of different jobs begin concurrently; one job's triggers keep their queue
    /// order (it matters to the serial policy). The triggers whose runs are durable are
    /// acknowledged together once the batch is done (one store call, not one per run;
    /// a trigger redelivered meanwhile finds its run).
    async fn begin_all(&self, batch: Vec<Delivery>) {
        let wanted = batch
            .iter()
            .map(|d| (d.trigger.job_id.as_str(), d.trigger.job_version));
        self.router.prefetch_jobs(wanted).await;
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
        if let Err(e) = self.triggers.ack_triggers(&durable).await {
            warn!(error = %e, count = durable.len(), "acknowledging triggers failed; they will be redelivered");
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
            let job = self.router.job(&d.trigger.job_id, d.trigger.job_version).await;
            if let Some(job) = &job {
                run.plan = run_plan(job, &self.opts);
            }
            let first = match &job {
                Some(job) => self.router.first_node(&run, job).await,
                None => First::Other,
            };
            let grace = self.router.begin_grace(&first, &run);
            let (begun, assigned) = match self.begin_on(run, &first, grace).await {
                Ok(b) => b,
                Err(e) => {
                    warn!(error = %e, "beginning the run failed; the trigger will be retried");
                    return None;
                }
            };
            debug!(created = begun.created, state = %begun.run.state, reason = %begun.run.reason, "run begun");
            self.router.count_begun(&begun);
            crash_point("dispatch.before_ack");
            self.router
                .begun(begun, assigned, &first, job.as_deref())
                .await;
            Some(d.entry_id)
        }
        .instrument(span)
        .await
    }

    /// Begins the run; when routing named a node for it (`first`), leases it to that
    /// node in the same store decision (`begin_and_assign`: its outcome is `Some`
    /// when tried).
    async fn begin_on(
        &self,
        run: RunRecord,
        first: &First,
        grace: Duration,
    ) -> crate::store::Result<(Begun, Option<Assigned>)> {
        let Some(node) = first.node() else {
            return self.runs.begin_run(run, grace).await.map(|b| (b, None));
        };
        let slot = self.router.asking(node);
        let begun = self
            .runs
            .begin_and_assign(run, grace, &slot, self.opts.lease)
            .await;
        let assigned = begun.as_ref().ok().and_then(|(_, a)| a.as_ref());
        self.router.answered(node, assigned);
        begun
    }
}
