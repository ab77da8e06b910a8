//! The `Store` trait: the consistency boundary, and the only place where server
//! instances coordinate.
//!
//! Every decision two instances could race on is one atomic operation here (a Lua script
//! in Redis, one write transaction in the embedded backend). Operations are idempotent
//! and return the current state, so a retried call resumes where the first one stopped.
//! "Now" is always the store's clock, never the caller's.
//!
//! Architecture Invariant: nothing outside this module coordinates instances, and no
//! in-memory timer is ever the only record of a deadline.

#[cfg(test)]
pub mod conformance;
pub mod embedded;
pub mod redis;

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::model::{Arm, JobRecord, Millis, RunRecord, Trigger};

/// Version of the persisted layout. A server refuses a store written by a newer schema.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("job {0:?} already exists")]
    JobExists(String),
    #[error("job {0:?} not found")]
    JobNotFound(String),
    #[error("job {job_id:?} is at version {current}, not the expected {expected}")]
    VersionConflict {
        job_id: String,
        expected: u64,
        current: u64,
    },
    #[error("lease on {schedule_id:?} is held by {holder:?}")]
    LeaseHeld { schedule_id: String, holder: String },
    #[error("fencing token {token} is not the current one for {schedule_id:?}")]
    StaleToken { schedule_id: String, token: u64 },
    #[error("store schema {found} is newer than this server understands ({supported})")]
    SchemaTooNew { found: u32, supported: u32 },
    #[error("store is unavailable: {0}")]
    Unavailable(String),
    #[error("store data is corrupt: {0}")]
    Corrupt(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Settings every backend honours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// Partitions for a new store; an existing store keeps the number it was created with.
    pub partitions: u32,
    /// How long a run record is kept after it was created.
    pub run_retention: Duration,
    /// At most this many runs are indexed per job; the oldest fall out first.
    pub max_runs_per_job: usize,
    /// How long a manual trigger's idempotency key is remembered.
    pub idempotency_ttl: Duration,
    /// This instance's name, for backends shared by several instances.
    pub instance_id: String,
    /// How long one instance keeps a partition to itself after reading its due fires
    /// (zero: never). Only an efficiency measure, so two schedulers do not compute the
    /// same batch and lose the race for half of it; correctness rests on the claim's
    /// compare-and-set alone. An instance that dies delays its partitions by at most
    /// this long.
    pub partition_lease: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            partitions: 16,
            run_retention: Duration::from_secs(7 * 24 * 3600),
            max_runs_per_job: 10_000,
            idempotency_ttl: Duration::from_secs(7 * 24 * 3600),
            instance_id: String::from("sundial"),
            partition_lease: Duration::from_millis(300),
        }
    }
}

/// A page of results and the cursor for the next one (None when done).
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}

/// A pending fire whose due time has come, as seen by `due_fires`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueFire {
    pub job_id: String,
    pub due: Millis,
    /// The armed fire's planned time (its schedule_no); `due` adds the job's jitter.
    pub planned: Millis,
    pub version: u64,
}

/// What `due_fires` saw in one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueBatch {
    /// The store's now at the time of the read.
    pub now: Millis,
    /// Due members, earliest first, at most the requested limit.
    pub fires: Vec<DueFire>,
    /// The earliest due time in the partition after `fires`, if any (may be ≤ now when
    /// the limit cut the batch short).
    pub next_due: Option<Millis>,
}

/// One compare-and-set claim of a pending fire.
#[derive(Debug, Clone, PartialEq)]
pub struct FireClaim {
    pub job_id: String,
    /// The pending score the claimer saw; the claim fails if it moved.
    pub expected_due: Millis,
    /// The job version the claimer computed `next` and `triggers` from.
    pub expected_version: u64,
    /// The fire to arm next, or None when the schedule has ended.
    pub next: Option<Arm>,
    /// Triggers to append, in order (usually one; zero or several under misfire
    /// policies). `triggered_at` is overwritten with the store's now.
    pub triggers: Vec<Trigger>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimResult {
    Claimed,
    /// The pending score no longer equals `expected_due` (another claim won).
    Moved,
    /// The job changed since the claimer read it.
    VersionChanged,
    /// The job was deleted or paused.
    Gone,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimOutcome {
    pub now: Millis,
    /// One result per claim, in order.
    pub results: Vec<ClaimResult>,
    /// The earliest pending due time in the partition after the claims.
    pub next_due: Option<Millis>,
}

/// A trigger read from the durable queue; ack it only once its run is durable.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// Opaque id of the queue entry (backend-specific).
    pub entry_id: String,
    pub trigger: Trigger,
}

/// Outcome of `record_run`.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    pub run: RunRecord,
    /// False when the run already existed (a redelivered trigger): `run` is the stored one.
    pub created: bool,
}

/// A lease on a run, held by one executor node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub schedule_id: String,
    pub holder: String,
    pub token: u64,
    /// Expiry by the store's clock.
    pub expires_at: Millis,
}

/// An executor node as the registry knows it. It disappears unless refreshed (each
/// heartbeat) within the TTL it was written with.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeRecord {
    pub node_id: String,
    pub group: String,
    pub handlers: Vec<String>,
    pub weight: u32,
    /// 0 = unlimited.
    pub max_concurrency: u32,
    pub labels: std::collections::BTreeMap<String, String>,
    /// The server instance holding the node's stream.
    pub instance: String,
    /// False while the executor declares itself not ready.
    pub ready: bool,
    /// Runs the executor reports holding.
    pub active: u32,
    pub load: f64,
    pub connected_at: Millis,
    /// Written by the store from its clock.
    pub last_heartbeat: Millis,
}

/// Result of a manual trigger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueued {
    pub schedule_id: String,
    /// The idempotency key had been used: nothing new was queued.
    pub duplicate: bool,
}

/// Which runs to list for a job, newest (by scheduled time) first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunQuery {
    pub from: Option<Millis>,
    pub to: Option<Millis>,
    pub limit: usize,
    pub cursor: Option<String>,
}

/// The consistency boundary. See the module docs.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// "redis" or "embedded", for logs.
    fn backend(&self) -> &'static str;

    /// The number of partitions; a job lives in `partition_of(job_id)` forever.
    fn partitions(&self) -> u32;

    /// The store's clock.
    async fn now(&self) -> Result<Millis>;

    /// A counter that moves whenever any instance creates or changes a job, so a
    /// sleeping scheduler wakes early.
    fn job_changes(&self) -> watch::Receiver<u64>;

    // ---- jobs: every change is one atomic version bump that rewrites the pending member

    /// Creates the job at version 1 and arms `job.next_fire` (if any). `job.version`
    /// is ignored. A paused job is never pending, whatever `next_fire` says.
    async fn create_job(&self, job: JobRecord) -> Result<JobRecord>;

    /// Replaces the job if its version is still `expected_version`; the new record gets
    /// version + 1 and its `next_fire` replaces the pending member (None removes it).
    /// Also used for pause and resume, which are updates of `paused` and `next_fire`.
    async fn update_job(&self, job: JobRecord, expected_version: u64) -> Result<JobRecord>;

    /// Deletes the job and its pending member. Its runs stay until retention ends.
    async fn delete_job(&self, job_id: &str) -> Result<()>;

    async fn get_job(&self, job_id: &str) -> Result<Option<JobRecord>>;

    /// The jobs that exist among `job_ids` (missing ones are left out), in any order.
    async fn get_jobs(&self, job_ids: &[String]) -> Result<Vec<JobRecord>> {
        let mut out = Vec::with_capacity(job_ids.len());
        for id in job_ids {
            if let Some(job) = self.get_job(id).await? {
                out.push(job);
            }
        }
        Ok(out)
    }

    /// Jobs in a stable order, `limit` at a time.
    async fn list_jobs(&self, cursor: Option<&str>, limit: usize) -> Result<Page<JobRecord>>;

    // ---- fires

    /// Due pending members of one partition (score ≤ the store's now), earliest first.
    async fn due_fires(&self, partition: u32, limit: usize) -> Result<DueBatch>;

    /// Applies each claim atomically: advance the job only if its pending score still
    /// equals `expected_due`, its version equals `expected_version` and it is enabled;
    /// in the same step arm `next` and append `triggers`. All claims must belong to
    /// `partition`.
    async fn claim_fires(&self, partition: u32, claims: Vec<FireClaim>) -> Result<ClaimOutcome>;

    /// Appends a manual trigger for an existing job. With an idempotency key, a key seen
    /// before returns the first schedule_id and queues nothing.
    async fn enqueue_manual(
        &self,
        trigger: Trigger,
        idempotency_key: Option<&str>,
    ) -> Result<Enqueued>;

    // ---- the trigger queue

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

    /// Acknowledges a delivered trigger; it will not be delivered again.
    async fn ack_trigger(&self, entry_id: &str) -> Result<()>;

    /// Drops acknowledged queue entries older than `older_than` (by age, never count).
    async fn trim_triggers(&self, older_than: Millis) -> Result<()>;

    // ---- runs

    /// Records the run if its schedule_id has no run yet; otherwise returns the stored
    /// one. If the job is now paused or deleted, the run is recorded SKIPPED with reason
    /// "paused" / "deleted". Keeps the per-job index bounded and the record's TTL.
    async fn record_run(&self, run: RunRecord) -> Result<Recorded>;

    async fn get_run(&self, schedule_id: &str) -> Result<Option<RunRecord>>;

    /// Runs of a job, newest first.
    async fn list_runs(&self, job_id: &str, query: RunQuery) -> Result<Page<RunRecord>>;

    // ---- leases

    /// Grants the lease on a run to `holder` unless another holder's lease is unexpired.
    /// The token is max(job counter + 1, store time in µs); a re-grant to the same
    /// holder gets a new token. A malformed schedule_id is `JobNotFound`.
    async fn grant_lease(&self, schedule_id: &str, holder: &str, ttl: Duration) -> Result<Lease>;

    /// Extends a lease if `token` is still the current one and the lease has not
    /// expired; otherwise `StaleToken` (an expired lease is the sweeper's to recover).
    async fn renew_lease(&self, schedule_id: &str, token: u64, ttl: Duration) -> Result<Lease>;

    /// Releases the lease if `token` is current; returns whether it was.
    async fn release_lease(&self, schedule_id: &str, token: u64) -> Result<bool>;

    /// Leases whose expiry (store clock) has passed, earliest first.
    async fn expired_leases(&self, limit: usize) -> Result<Vec<Lease>>;

    // ---- the executor node registry

    /// Registers or refreshes a node (`last_heartbeat` = the store's now); it expires
    /// `ttl` later unless refreshed again. A refresh replaces the whole record.
    async fn upsert_node(&self, node: NodeRecord, ttl: Duration) -> Result<()>;

    /// Removes the node if `instance` still holds it (a node that reconnected to
    /// another instance meanwhile is left alone); returns whether it was removed.
    async fn remove_node(&self, node_id: &str, instance: &str) -> Result<bool>;

    /// Unexpired nodes, by node id; `group` filters when given.
    async fn list_nodes(&self, group: Option<&str>) -> Result<Vec<NodeRecord>>;

    // ---- inbound replay protection

    /// True if `nonce` was not seen for `app_id` within `ttl`; remembers it.
    async fn check_nonce(&self, app_id: &str, nonce: &str, ttl: Duration) -> Result<bool>;
}

/// The partition of a job: FNV-1a 32 of its id, mod `partitions`. Fixed at creation
/// because `partitions` is fixed per store (kept in its meta record).
pub fn partition_of(job_id: &str, partitions: u32) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in job_id.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_stable_and_in_range() {
        for p in [1, 7, 16] {
            for id in ["a", "job-1", "customer_id42"] {
                let x = partition_of(id, p);
                assert!(x < p);
                assert_eq!(x, partition_of(id, p));
            }
        }
        // FNV-1a of "a" is 0xe40c292c: pins the function so partitions never move.
        assert_eq!(partition_of("a", u32::MAX), 0xe40c_292c);
    }
}
