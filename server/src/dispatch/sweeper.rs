//! The run sweeper: every run deadline (lease expiry, unconfirmed dispatch, execution
//! timeout, retry backoff, a wait for a free node) lives in the store's per-partition
//! timer sets; this loop claims the due ones with `expire_run` and does what the store
//! decided — cancel a revoked lease on its node, route a run that is WAITING again.
//!
//! Every instance sweeps every partition: `expire_run` is atomic and moves the timer
//! it acted on, so two sweepers never act twice on one deadline.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::dispatch::Router;
use crate::model::RunState;
use crate::store::{Applied, DueEntries, Pacer, RunStore};

#[derive(Debug, Clone)]
pub struct SweepOptions {
    /// How often the partitions whose timers may be due are checked (each at least
    /// every `store::pacing::IDLE_TICKS` ticks: see `store::Pacer`).
    pub every: Duration,
    /// Due runs handled per partition and pass.
    pub batch: usize,
}

impl Default for SweepOptions {
    fn default() -> Self {
        Self {
            every: Duration::from_millis(200),
            batch: 256,
        }
    }
}

pub struct Sweeper {
    store: Arc<dyn RunStore>,
    router: Arc<Router>,
    opts: SweepOptions,
}

impl Sweeper {
    pub fn new(store: Arc<dyn RunStore>, router: Arc<Router>, opts: SweepOptions) -> Self {
        Self {
            store,
            router,
            opts,
        }
    }

    pub async fn run(self, shutdown: CancellationToken) {
        info!(every = ?self.opts.every, "sweeper started");
        Pacer::new(
            self.store.partitions(),
            self.opts.every,
            self.store.activity(),
        )
        .run(&shutdown, |p| self.sweep(p))
        .await;
        info!("sweeper stopped");
    }

    /// Handles the partition's due runs; answers what the store said of them (None
    /// when it could not be asked).
    async fn sweep(&self, partition: u32) -> Option<DueEntries> {
        crate::fault::panic_point("sweeper.panic");
        let due = match self.store.poll_due_runs(partition, self.opts.batch).await {
            Ok(d) => d,
            Err(e) => {
                warn!(partition, error = %e, "reading due runs failed");
                return None;
            }
        };
        for schedule_id in &due.ids {
            let grace = self.router.wake_grace(schedule_id);
            let (job_id, _) = crate::model::split_schedule_id(schedule_id).unwrap_or(("", ""));
            let span = info_span!("deadline", %job_id, %schedule_id);
            async {
                let t = match self.store.expire_run(schedule_id, grace).await {
                    Ok(t) => t,
                    Err(e) => {
                        warn!(error = %e, "expiring the run failed; it stays due");
                        return;
                    }
                };
                if t.applied != Applied::Yes {
                    return;
                }
                // A wake-up (WAITING, nothing revoked) is routed now, and nothing else:
                // only the time passed, so there is nothing to count or alert (its
                // reason may still say why it waits, e.g. "retry: lost", which was
                // counted when it happened). A run that went back to WAITING after a
                // revocation is routed when its own timer comes due.
                let woken = t.run.clone().filter(|r| {
                    t.revoked.is_empty() && r.state == RunState::Waiting && r.deadlines.wake_at > 0
                });
                for rv in &t.revoked {
                    info!(node_id = %rv.node_id, reason = %rv.reason, "lease revoked");
                }
                if let Some(run) = &t.run {
                    debug!(state = %run.state, attempt = run.attempt, reason = %run.reason, "deadline handled");
                }
                match woken {
                    Some(run) => self.router.route(run).await,
                    None => self.router.follow_up(t).await,
                }
            }
            .instrument(span)
            .await;
        }
        Some(due)
    }
}
