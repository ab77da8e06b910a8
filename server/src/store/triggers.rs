//! `TriggerQueue`: the durable queue that carries triggers from the scheduler to the
//! dispatchers, and the instance beats that let a live instance take over a dead one's
//! triggers.
//!
//! Guarantees: a trigger is delivered until it is acknowledged, and is acknowledged only
//! once its run is durable (the caller's side of the contract); a consumer that dies
//! leaves its unacknowledged triggers to another (`reclaim_triggers` after they idle, or
//! `take_over_triggers` once its beat ran out). A trigger may be delivered twice, so
//! recording its run is idempotent (`RunStore::begin_run`). The queue is trimmed by age,
//! never by count.

use std::time::Duration;

use async_trait::async_trait;

use super::{Result, StoreMeta};
use crate::model::{Millis, Trigger};

/// A trigger read from the durable queue; ack it only once its run is durable.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// Opaque id of the queue entry (backend-specific).
    pub entry_id: String,
    pub trigger: Trigger,
}

/// The trigger queue and the instance beats. See the module docs.
#[async_trait]
pub trait TriggerQueue: StoreMeta {
    /// New triggers for this consumer, waiting at most `block` for some to arrive
    /// (zero: do not wait).
    async fn read_triggers(
        &self,
        consumer: &str,
        max: usize,
        block: Duration,
    ) -> Result<Vec<Delivery>>;

    /// Triggers delivered to some consumer at least `min_idle` ago and never acked
    /// (that consumer died): they are handed to `consumer` now.
    async fn reclaim_triggers(
        &self,
        consumer: &str,
        min_idle: Duration,
        max: usize,
    ) -> Result<Vec<Delivery>>;

    /// Marks `instance` alive until `ttl` from now (store clock) and returns the other
    /// instances whose last beat has run out: the consumers whose unacknowledged
    /// triggers [`TriggerQueue::take_over_triggers`] may take at once, without waiting for
    /// them to idle. The embedded store serves one process and has none.
    async fn beat_instance(&self, instance: &str, ttl: Duration) -> Result<Vec<String>>;

    /// Whether this instance's last beat found another instance alive, reading the
    /// same queue (true until its first beat on a store instances share; a store of
    /// one process: never).
    fn others_alive(&self) -> bool {
        false
    }

    /// Hands up to `max` of the triggers `dead` (an instance whose beat ran out) holds
    /// unacknowledged to `consumer`; once it holds none, forgets it and the nodes still
    /// registered to it (their streams died with it), unless it beat again meanwhile.
    /// A trigger taken from an instance that was only stalled is begun twice, which
    /// records one run.
    async fn take_over_triggers(
        &self,
        dead: &str,
        consumer: &str,
        max: usize,
    ) -> Result<Vec<Delivery>>;

    /// Acknowledges a delivered trigger; it will not be delivered again.
    async fn ack_trigger(&self, entry_id: &str) -> Result<()> {
        self.ack_triggers(&[entry_id.to_owned()]).await
    }

    /// Acknowledges delivered triggers together (an entry acknowledged before, or
    /// unknown, changes nothing).
    async fn ack_triggers(&self, entry_ids: &[String]) -> Result<()>;

    /// Drops acknowledged queue entries older than `older_than` (by age, never count).
    async fn trim_triggers(&self, older_than: Millis) -> Result<()>;
}
