//! `Outbox`: the webhook outbox (deliveries, their claims and outcomes) and the
//! per-destination circuit breakers shared by every instance.
//!
//! The step that makes a run final (never a broadcast shard's: its parent's) writes,
//! when the run's plan has a callback URL, an outbox entry keyed by the schedule_id
//! (job, URL, the body fixed then, created_at = now, due now, 0 attempts) and sets
//! the run's `callback_state` to PENDING. A delivery worker claims a due entry
//! (`claim_delivery`), which moves it in flight under a new delivery token and a
//! lease; the outcome (`finish_delivery`) is applied only with that token, so a slow
//! worker whose lease ran out can never overwrite a later outcome, and a worker that
//! dies leaves an entry that comes due again when its lease ends.

use std::time::Duration;

use async_trait::async_trait;

use super::{Applied, Result, StoreMeta};
use crate::model::Millis;

/// A webhook delivery claimed from the outbox by `claim_delivery`: in flight under
/// `token` until its lease runs out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookDelivery {
    /// The run's schedule_id: the outbox key and the `webhook-id` of every attempt.
    pub schedule_id: String,
    pub job_id: String,
    pub url: String,
    /// The exact body, fixed when the run became final.
    pub body: String,
    /// Attempts whose outcome was recorded so far (deferrals not counted).
    pub attempts: u32,
    /// When the run became final (store clock): the start of the delivery's max age.
    pub created_at: Millis,
    /// This claim's delivery token; only an outcome carrying it is applied.
    pub token: u64,
    /// The store's now at the claim.
    pub now: Millis,
}

/// How one delivery attempt ended, as `finish_delivery` records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// Answered 2xx: the run's callback is DONE and the entry leaves the outbox.
    Delivered { status: u16 },
    /// Failed (`status` 0: no response); due again `after` from the store's now.
    Retry {
        after: Duration,
        status: u16,
        error: String,
    },
    /// Given up after this attempt (retries spent, or the next would pass the max
    /// age): CALLBACK_FAILED, the entry leaves the outbox.
    Failed { status: u16, error: String },
    /// Given up without an attempt (older than its max age, or its URL unusable):
    /// CALLBACK_FAILED, no attempt counted.
    Abandon { error: String },
    /// The receiver answered 410 Gone: CALLBACK_FAILED at once, no more retries.
    Gone,
    /// Not attempted (the destination's circuit breaker is open): due again at
    /// `until` (store clock), no attempt spent.
    Defer { until: Millis },
}

/// The delivery record's error after a 410 Gone.
pub const GONE_ERROR: &str = "gone: the receiver answered 410 Gone; no more retries";

/// A destination's circuit breaker (shared by every instance).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Deliveries go out.
    Closed,
    /// Deliveries wait until then (an open breaker, or another caller's probe).
    Open { until: Millis },
    /// The cool-down is over and this caller may send one probe.
    HalfOpen,
}

/// What `record_breaker` made of the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerUpdate {
    pub state: BreakerState,
    /// This call opened or closed it.
    pub changed: bool,
}

/// The webhook outbox and the circuit breakers. See the module docs.
#[async_trait]
pub trait Outbox: StoreMeta {
    /// Outbox entries of a partition due by the store's clock, in flight ones whose
    /// claim lease ran out included, earliest first.
    async fn due_deliveries(&self, partition: u32, limit: usize) -> Result<Vec<String>>;

    /// Claims the entry if it is due: in flight with a new delivery token (greater
    /// than any before it) until now + `lease`. None when it is not due or gone.
    async fn claim_delivery(
        &self,
        schedule_id: &str,
        lease: Duration,
    ) -> Result<Option<WebhookDelivery>>;

    /// Records an attempt's outcome if `token` is the entry's current token and the
    /// entry is in flight (otherwise `Applied::No`, nothing changes). Every outcome but
    /// `Defer` and `Abandon` counts an attempt; all but `Defer` update the run's
    /// delivery record (attempts, last status, last error). `Delivered` makes the run's
    /// callback DONE, `Failed`, `Gone` and `Abandon` FAILED (the run's result stays),
    /// and those four remove the entry.
    async fn finish_delivery(
        &self,
        schedule_id: &str,
        token: u64,
        outcome: DeliveryOutcome,
    ) -> Result<Applied>;

    /// The breaker of a destination (`scheme://host:port`). Closed → `Closed`; open
    /// until a time still ahead → `Open`; once that time has passed, the first caller
    /// gets `HalfOpen` (it may send one probe) and the breaker holds further callers
    /// `Open` for `probe` (until the probe's outcome is recorded, or it is presumed lost).
    async fn breaker_state(&self, destination: &str, probe: Duration) -> Result<BreakerState>;

    /// Counts an attempt's result on the destination's breaker: a success closes it;
    /// `threshold` consecutive failures open it for `cool_down`; a failure while half
    /// open (the probe) re-opens it for `cool_down`. A failure while open changes
    /// nothing (an attempt that started before it opened).
    async fn record_breaker(
        &self,
        destination: &str,
        success: bool,
        threshold: u32,
        cool_down: Duration,
    ) -> Result<BreakerUpdate>;
}
