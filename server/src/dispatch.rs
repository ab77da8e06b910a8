//! Dispatch: turns each trigger from the durable queue into a run.
//!
//! For now (the foundation issue) a run is only recorded, TRIGGERED or SKIPPED; the
//! executors issue adds overlap policy, routing, leases and sending. What already holds
//! is the queue discipline: a trigger is acknowledged only after its run is durable,
//! and a redelivered trigger finds that run (`record_run` is idempotent), so a dispatcher
//! that dies at any point loses no run and records none twice. Entries a dead instance
//! left unacknowledged are reclaimed by the survivors after `reclaim_idle`.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::fault::crash_point;
use crate::model::RunRecord;
use crate::store::{Delivery, Store};

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
    /// Acknowledged queue entries older than this are trimmed.
    pub queue_retention: Duration,
}

impl Default for DispatchOptions {
    fn default() -> Self {
        Self {
            consumer: "sundial".to_owned(),
            batch_size: 500,
            read_block: Duration::from_millis(500),
            reclaim_idle: Duration::from_secs(30),
            reclaim_every: Duration::from_secs(5),
            queue_retention: Duration::from_secs(3600),
        }
    }
}

pub struct Dispatcher {
    store: Arc<dyn Store>,
    opts: DispatchOptions,
}

impl Dispatcher {
    pub fn new(store: Arc<dyn Store>, opts: DispatchOptions) -> Self {
        Self { store, opts }
    }

    /// Runs until `shutdown`; the batch in hand is finished (recorded and acknowledged)
    /// before it returns.
    pub async fn run(self, shutdown: CancellationToken) {
        info!(consumer = %self.opts.consumer, "dispatcher started");
        let mut last_reclaim = tokio::time::Instant::now();
        let mut backoff = Duration::from_millis(50);
        while !shutdown.is_cancelled() {
            let mut batch = match self
                .store
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
            for delivery in batch {
                self.dispatch(delivery).await;
            }
        }
        info!("dispatcher stopped");
    }

    async fn reclaim(&self) -> Vec<Delivery> {
        let reclaimed = self
            .store
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
        let cutoff = self.store.now().await.map(|now| {
            now - i64::try_from(self.opts.queue_retention.as_millis()).unwrap_or(i64::MAX)
        });
        if let Ok(cutoff) = cutoff
            && let Err(e) = self.store.trim_triggers(cutoff).await
        {
            warn!(error = %e, "trimming the trigger queue failed");
        }
        reclaimed
    }

    /// Records the run, then acknowledges the trigger. On a store error the trigger
    /// stays unacknowledged and comes back through reclaim.
    async fn dispatch(&self, d: Delivery) {
        let schedule_id = d.trigger.schedule_id();
        let span = info_span!("dispatch", job_id = %d.trigger.job_id, %schedule_id);
        async {
            crash_point("dispatch.before_record");
            match self
                .store
                .record_run(RunRecord::from_trigger(&d.trigger))
                .await
            {
                Ok(r) => debug!(created = r.created, state = %r.run.state, "run recorded"),
                Err(e) => {
                    warn!(error = %e, "recording the run failed; the trigger will be retried");
                    return;
                }
            }
            crash_point("dispatch.before_ack");
            if let Err(e) = self.store.ack_trigger(&d.entry_id).await {
                warn!(error = %e, "acknowledging the trigger failed; it will be redelivered");
            }
        }
        .instrument(span)
        .await;
    }
}

pub fn spawn(
    store: Arc<dyn Store>,
    opts: DispatchOptions,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(
        Dispatcher::new(store, opts)
            .run(shutdown)
            .instrument(info_span!("dispatcher")),
    )
}
