//! `Outbox`: the webhook outbox (deliveries, their claims and outcomes) and, per
//! destination, the circuit breaker and the slots that pace deliveries, shared by
//! every instance.
//!
//! The step that makes a run final (never a broadcast shard's: its parent's) writes,
//! when the run's plan has a callback URL, an outbox entry keyed by the schedule_id
//! (job, URL, the body fixed then, created_at = now, due now, 0 attempts) and sets
//! the run's `callback_state` to PENDING. A delivery worker claims a due entry
//! (`claim_delivery`), which moves it in flight under a new delivery token and a
//! lease; the outcome (`finish_delivery`) is applied only with that token, so a slow
//! worker whose lease ran out can never overwrite a later outcome, and a worker that
//! dies leaves an entry that comes due again when its lease ends.
//!
//! Before it sends, a claimed delivery is admitted to its destination
//! (`admit_delivery`): a closed breaker and a free slot among the destination's window
//! (its limit, counted across every instance; smaller while the destination ramps up
//! after its breaker closed). The slot is given back, with the attempt's result
//! counted on the breaker, by `settle_delivery`, or runs out with its lease.

use std::time::Duration;

use async_trait::async_trait;

use super::{Applied, DueEntries, Result, StoreMeta};
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

/// One attempt's outcome, for `finish_deliveries`: recorded under the claim's token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryResult {
    pub schedule_id: String,
    pub token: u64,
    pub outcome: DeliveryOutcome,
}

/// How long an owner refused a slot of a destination stays marked as waiting for one
/// (`Outbox::admit_delivery`): longer than the pause between two asks of a delivery
/// waiting for a slot, so a waiting instance stays marked while it asks again.
pub const WAITING_MARK: std::time::Duration = std::time::Duration::from_secs(2);

/// The delivery record's error after a 410 Gone.
pub const GONE_ERROR: &str = "gone: the receiver answered 410 Gone; no more retries";

/// A destination's circuit breaker (shared by every instance), as a settled attempt
/// left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Deliveries go out (within the destination's window).
    Closed,
    /// Deliveries wait until then.
    Open { until: Millis },
}

/// What `settle_delivery` made of the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerUpdate {
    pub state: BreakerState,
    /// This call opened or closed it.
    pub changed: bool,
}

/// What a delivery may do about its destination now (`admit_delivery`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Send: the breaker is closed and the caller holds one of the destination's slots.
    Go,
    /// Send, as the breaker's probe (its cool-down is over): the caller holds the
    /// destination's only slot.
    Probe,
    /// The breaker is open until then: no slot.
    Open { until: Millis },
    /// The destination has `window` deliveries in flight (its limit, or less while it
    /// ramps up after its breaker closed; 1 while another caller's probe is under
    /// way): no slot; ask again when one may be free.
    Full { window: u32 },
}

/// `admit_delivery_clean`'s answer: the admission, and whether the destination's
/// breaker had nothing counted on it then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanAdmission {
    pub admission: Admission,
    /// `Go` to a breaker closed with no failure and no ramp counted: an answered
    /// attempt's `settle_delivery` would change nothing on it but give the slot back.
    pub clean: bool,
}

/// The terms of one delivery's dealings with its destination: its slots (pacing) and
/// its breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryTerms {
    /// At most this many deliveries (at least one) in flight to the destination at
    /// once, counted across every instance.
    pub limit: u32,
    /// A slot not given back (its holder died) is free again after this.
    pub lease: Duration,
    /// A probe that never reports is presumed lost after this.
    pub probe: Duration,
    /// Consecutive failed attempts that open the breaker.
    pub threshold: u32,
    /// How long an opened breaker stays open before a probe.
    pub cool_down: Duration,
}

/// One delivery's `settle_delivery`, for `settle_deliveries`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettleRequest {
    pub destination: String,
    pub holder: String,
    pub answered: Option<bool>,
    pub terms: DeliveryTerms,
}

/// The webhook outbox and the circuit breakers. See the module docs.
#[async_trait]
pub trait Outbox: StoreMeta {
    /// Outbox entries of a partition due by the store's clock, in flight ones whose
    /// claim lease ran out included, earliest first.
    async fn due_deliveries(&self, partition: u32, limit: usize) -> Result<Vec<String>>;

    /// `due_deliveries`, and how long until the partition's next entry falls due (see
    /// `DueEntries`; by default "look again at the next tick").
    async fn poll_due_deliveries(&self, partition: u32, limit: usize) -> Result<DueEntries> {
        Ok(DueEntries::unpaced(
            self.due_deliveries(partition, limit).await?,
        ))
    }

    /// Claims the entry if it is due: in flight with a new delivery token (greater
    /// than any before it) until now + `lease`. None when it is not due or gone.
    async fn claim_delivery(
        &self,
        schedule_id: &str,
        lease: Duration,
    ) -> Result<Option<WebhookDelivery>>;

    /// `claim_delivery` of each of `schedule_ids` (of any partitions), in as few store
    /// calls as the backend can make (Redis: one per partition, sent together): the
    /// claimed deliveries, in the order asked; the ones not due, gone or claimed by
    /// another worker are left out and the rest claimed all the same.
    async fn claim_deliveries(
        &self,
        schedule_ids: &[String],
        lease: Duration,
    ) -> Result<Vec<WebhookDelivery>> {
        let mut claimed = Vec::with_capacity(schedule_ids.len());
        for sid in schedule_ids {
            if let Some(d) = self.claim_delivery(sid, lease).await? {
                claimed.push(d);
            }
        }
        Ok(claimed)
    }

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

    /// `finish_delivery` of each of `results` (of any partitions), in as few store
    /// calls as the backend can make (Redis: one per partition, sent together): what
    /// became of each, in order. A result whose token is stale is refused
    /// (`Applied::No`) and the others applied all the same.
    async fn finish_deliveries(&self, results: Vec<DeliveryResult>) -> Result<Vec<Applied>> {
        let mut applied = Vec::with_capacity(results.len());
        for r in results {
            applied.push(
                self.finish_delivery(&r.schedule_id, r.token, r.outcome)
                    .await?,
            );
        }
        Ok(applied)
    }

    /// Admits one delivery to its destination (`scheme://host:port`) for `holder` (one
    /// per claim: the schedule_id and delivery token): the breaker first (open →
    /// `Open`; once its cool-down is over the first caller gets `Probe`, the only slot,
    /// and the others are told `Full` until the probe reports or, after `terms.probe`,
    /// is presumed lost), then the slots:
    /// `Go` with a slot held until `terms.lease` from now if fewer than the window are
    /// held by live holders, else `Full`. The window is `terms.limit`, or the ramp
    /// while it is smaller: after a breaker closes it starts at one and grows by one
    /// with each answered attempt (see `settle_delivery`). Asking again for a holder
    /// that has a slot keeps it (its lease renewed).
    ///
    /// While the breaker is closed the window is shared fairly between owners: a
    /// holder's owner (an instance) is what comes before the first `#` of its name
    /// (the whole name without one). An owner told `Full` is marked waiting for
    /// [`WAITING_MARK`]; while another owner marked waiting holds fewer than its share
    /// (the window over the owners holding slots or waiting, rounded up), an owner
    /// holding at least its share (besides the asking holder) is told `Full` too, and
    /// a holder of it asking again loses its slot (it is given to the waiting one): one
    /// instance keeping its slots between deliveries cannot starve another.
    async fn admit_delivery(
        &self,
        destination: &str,
        holder: &str,
        terms: &DeliveryTerms,
    ) -> Result<Admission>;

    /// `admit_delivery`, and whether the breaker had nothing counted on it (see
    /// `CleanAdmission`): a caller may then keep the slot for its next delivery to the
    /// destination after a 2xx rather than settle it, asking again (the same holder,
    /// its lease renewed) before long. By default never clean: every attempt settles.
    async fn admit_delivery_clean(
        &self,
        destination: &str,
        holder: &str,
        terms: &DeliveryTerms,
    ) -> Result<CleanAdmission> {
        Ok(CleanAdmission {
            admission: self.admit_delivery(destination, holder, terms).await?,
            clean: false,
        })
    }

    /// Gives back `holder`'s slot and counts the attempt's result on the breaker:
    /// `answered` Some(true) (the receiver answered, 2xx or 410) closes it (a breaker
    /// that was not closed starts its ramp at one slot) and grows a ramp under way by
    /// one, ending it at `terms.limit`; Some(false) counts a failure: `threshold` in a
    /// row open it for `cool_down`, so does a failed probe, a ramp under way halves (at
    /// least one), and a failure while open changes nothing (an attempt that started
    /// before it opened). None (no attempt made, or one the egress policy refused)
    /// only gives the slot back and answers None.
    async fn settle_delivery(
        &self,
        destination: &str,
        holder: &str,
        answered: Option<bool>,
        terms: &DeliveryTerms,
    ) -> Result<Option<BreakerUpdate>>;

    /// `owner` (an instance, as in `admit_delivery`) has no delivery left waiting for
    /// a slot of `destination`: its waiting mark ends now instead of [`WAITING_MARK`]
    /// after its last refusal, so the other owners stop yielding their share to it
    /// (an instance whose refused deliveries were admitted or deferred held the others
    /// to half the window for two seconds, with nothing of its own to send). A later
    /// refusal marks it again.
    async fn end_waiting(&self, destination: &str, owner: &str) -> Result<()>;

    /// `settle_delivery` of each request, one after the other in order, in as few
    /// store calls as the backend can make (Redis: one): what each made of its
    /// breaker, in order.
    async fn settle_deliveries(
        &self,
        requests: Vec<SettleRequest>,
    ) -> Result<Vec<Option<BreakerUpdate>>> {
        let mut out = Vec::with_capacity(requests.len());
        for r in requests {
            out.push(
                self.settle_delivery(&r.destination, &r.holder, r.answered, &r.terms)
                    .await?,
            );
        }
        Ok(out)
    }
}
