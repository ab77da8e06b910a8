//! The store: the consistency boundary, and the only place where server instances
//! coordinate.
//!
//! Every decision two instances could race on is one atomic operation here (a Lua script
//! in Redis, one write transaction in the embedded backend). Operations are idempotent
//! and return the current state, so a retried call resumes where the first one stopped.
//! "Now" is always the store's clock, never the caller's.
//!
//! The operations are grouped into narrow traits, one file each, and every part of the
//! server holds only the traits it uses:
//!
//! | trait | file | owns |
//! |---|---|---|
//! | [`StoreMeta`] | here | backend name, partition count, the store's clock (every trait below extends it) |
//! | [`JobStore`] | `jobs.rs` | jobs, the pending set, fire claims, manual triggers, job changes |
//! | [`TriggerQueue`] | `triggers.rs` | the durable trigger queue, instance beats, takeover |
//! | [`RunStore`] | `runs.rs` | run records, the run state machine, timers, progress, logs |
//! | [`NodeRegistry`] | `nodes.rs` | executor nodes, round-robin counters |
//! | [`Inboxes`] | `nodes.rs` | per-instance inboxes for nodes attached elsewhere |
//! | [`Outbox`] | `outbox.rs` | webhook deliveries and circuit breakers |
//! | [`AppStore`] | `apps.rs` | apps, their secrets, inbound nonces |
//!
//! Beside them, [`job_cache::JobCache`] is an instance's own cache of job records, which
//! its scheduler and router share (it coordinates nothing).
//!
//! [`Store`] is their sum, which both backends implement (`redis/`, `embedded/`, each
//! trait in the backend's file of that concern); only the wiring (`server.rs`) and tests
//! hold a whole `Store`.
//!
//! Architecture Invariant: nothing outside this module coordinates instances, and no
//! in-memory timer is ever the only record of a deadline.

mod apps;
mod audit;
#[cfg(any(test, feature = "testing"))]
pub mod conformance;
pub mod embedded;
pub mod job_cache;
mod jobs;
mod nodes;
mod outbox;
pub mod pacing;
pub mod redis;
mod runs;
mod triggers;

use std::time::Duration;

use async_trait::async_trait;

use crate::model::Millis;

pub use apps::AppStore;
pub use audit::{AuditEvent, AuditLog};
pub use jobs::{
    ClaimOutcome, ClaimResult, DueBatch, DueFire, Enqueued, FireClaim, JobStore, JobWrite,
};
pub(crate) use nodes::LocalCounters;
pub use nodes::{HandlerFigures, Inboxes, NodeRecord, NodeRegistry, NodeRemoved, Registered};
pub use outbox::{
    Admission, BreakerState, BreakerUpdate, CleanAdmission, DeliveryOutcome, DeliveryResult,
    DeliveryTerms, GONE_ERROR, Outbox, SettleRequest, WAITING_MARK, WebhookDelivery,
};
pub use pacing::Pacer;
pub use runs::{
    Assigned, BeginOn, Begun, FannedOut, Finish, Finisher, Held, Holder, LOG_LINE_COST, LeaseTerms,
    LogBatch, LogLine, NOT_THE_HOLDER, NodeSlot, Outcome, Recorded, Revocation, RunQuery, RunStore,
    STALE_TOKEN, Transition, UNKNOWN_RUN, assigned_after, positions_by_job, rounds_by_job,
    routable_now,
};
pub use triggers::{Delivery, TriggerQueue};

/// Version of the persisted layout in Redis (the embedded store versions its file
/// apart). A server refuses a store written by a newer schema, and raises an older one
/// to its own when it connects. 1: the first; 2: run records are MessagePack (a
/// version-1 store's JSON records are still read, and rewritten at their next step);
/// 3: run records leave out the fields at their default (see `RunRecord`; a version-2
/// record, with every field, is read as it is); 4: the run scripts write a record as
/// its fields, its plan and its history's events, back to back (`decode_run` in
/// `redis/mod.rs`; a version-3 record, one map, is read as it is).
pub const SCHEMA_VERSION: u32 = 4;

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
    #[error("app {0:?} already exists")]
    AppExists(String),
    #[error("app {0:?} not found")]
    AppNotFound(String),
    #[error("store schema {found} is newer than this server understands ({supported})")]
    SchemaTooNew { found: u32, supported: u32 },
    /// A listing's cursor that no listing of this store returned.
    #[error("page_token: {0:?} is not a page token a listing returned")]
    BadCursor(String),
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
    /// Leases that lapse while no server is up to renew them: when the embedded store
    /// is opened, or the Redis store connected while no other instance is alive, each
    /// held run's lease ends at least this long after that moment, so its executor can
    /// reconnect and renew it or report its result before the run is lost (zero: no
    /// grace). The server passes its lease TTL.
    pub reopen_lease_grace: Duration,
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
            reopen_lease_grace: Duration::ZERO,
        }
    }
}

/// What a store that commits its own write transactions (the embedded store) has
/// committed so far: the commits (one journal sync each), the steps they applied (one
/// per write call, many per commit under load), the time its writer spent applying
/// them and committing them (the journal's append and sync, then the transaction's
/// commit), and its checkpoints (the store file synced, the journal emptied) with the
/// time they took (a checkpoint made by a batch's commit counts in that commit's time
/// too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommitStats {
    pub commits: u64,
    pub steps: u64,
    pub applying: Duration,
    pub committing: Duration,
    pub checkpoints: u64,
    pub checkpointing: Duration,
}

/// A page of results and the cursor for the next one (None when done).
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}

/// How a transition request went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The run changed.
    Yes,
    /// The same request had already been applied (a re-sent result): nothing changed,
    /// and the caller may treat it as done.
    Already,
    /// Refused, with the reason (stale token, unknown run, wrong state).
    No(String),
}

/// What the store says of itself: which backend, how many partitions, and its clock.
/// Every narrow trait below extends it.
#[async_trait]
pub trait StoreMeta: Send + Sync + 'static {
    /// "redis" or "embedded", for logs.
    fn backend(&self) -> &'static str;

    /// The number of partitions; a job lives in `partition_of(job_id)` forever.
    fn partitions(&self) -> u32;

    /// Whether other instances may share this store (Redis), or this process is its
    /// only one (the embedded store).
    fn shared(&self) -> bool;

    /// The store's clock.
    async fn now(&self) -> Result<Millis>;

    /// Write transactions committed so far, where the backend commits them itself (the
    /// embedded store: one journal sync each), with the steps they applied, the time spent
    /// applying and committing, and its checkpoints; None where it does not (Redis).
    fn commit_stats(&self) -> Option<CommitStats> {
        None
    }

    /// A counter this handle bumps after each of its calls that may have set an earliest
    /// run timer or made a webhook delivery due, so that pollers which know when each
    /// partition is next due (`poll_due_runs`, `poll_due_deliveries`) can sleep until
    /// then and still look at once after such a write. None from a backend whose polls
    /// do not say when the next entry is due (the embedded store: its polls are reads
    /// in process, asked at every tick).
    fn activity(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// Checks the indexes the backend derives from its records against them, where a
    /// bug could leave one out of step (the embedded store: each run's timer is the one
    /// its record gives, and no other). `Corrupt` names what differs. A full scan:
    /// for tests (the conformance suite runs it after every check) and diagnosis.
    async fn check_indexes(&self) -> Result<()> {
        Ok(())
    }
}

/// Due entries of one partition (run timers, webhook deliveries) and when to look again.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DueEntries {
    /// Due entries, earliest first, at most the requested limit.
    pub ids: Vec<String>,
    /// How long, by the store's clock, until the partition's earliest entry not in
    /// `ids` falls due: zero when more are due than were returned, None when there is
    /// none. Zero, too, from a backend that does not say (the default methods): its
    /// pollers then ask again at their next tick.
    pub next_in: Option<Duration>,
}

impl DueEntries {
    /// Entries from a backend that does not say when the next falls due.
    pub fn unpaced(ids: Vec<String>) -> Self {
        Self {
            ids,
            next_in: Some(Duration::ZERO),
        }
    }
}

/// The whole store: every narrow trait. Only the wiring and tests hold one; each part of
/// the server holds the traits it uses (an `Arc<dyn Store>` coerces to any of them).
pub trait Store:
    JobStore + TriggerQueue + RunStore + NodeRegistry + Inboxes + Outbox + AppStore + AuditLog
{
}

impl<T> Store for T where
    T: JobStore + TriggerQueue + RunStore + NodeRegistry + Inboxes + Outbox + AppStore + AuditLog
{
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
