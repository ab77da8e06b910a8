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

use crate::model::{AppRecord, Arm, JobRecord, Millis, RunRecord, RunState, Trigger};

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
    #[error("app {0:?} already exists")]
    AppExists(String),
    #[error("app {0:?} not found")]
    AppNotFound(String),
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

/// A run reference as an executor holds it: the schedule_id and the fencing token of
/// its dispatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub schedule_id: String,
    pub token: u64,
}

/// The node a run is assigned to, with its concurrency limit (0 = unlimited), which
/// the store enforces across all instances by counting the node's leased runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSlot {
    pub node_id: String,
    pub max_concurrency: u32,
}

/// The lease a dispatch is made under, and how soon it must be confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTerms {
    pub ttl: Duration,
    /// A dispatch not confirmed (Started, or listed by a heartbeat) within this is
    /// re-routed without spending an attempt.
    pub confirm_within: Duration,
}

/// Outcome of `begin_run`.
#[derive(Debug, Clone, PartialEq)]
pub struct Begun {
    /// The run as stored: WAITING (to route now, or queued behind a serial run), or
    /// SKIPPED. For a redelivered trigger: the run as it is now.
    pub run: RunRecord,
    /// False when the run already existed.
    pub created: bool,
    /// Runs revoked by the replace policy; each holder must be sent `Cancel`.
    pub revoked: Vec<Revocation>,
}

/// A lease taken away from a node: the node still holds `token` and must be told to
/// stop (`Cancel`). The run itself was already moved on by the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    pub schedule_id: String,
    pub node_id: String,
    pub token: u64,
    /// The attempt the revoked lease was for (the dispatch's `RunRef.attempt`).
    pub attempt: u32,
    pub reason: String,
}

/// Outcome of `assign_run`.
#[derive(Debug, Clone, PartialEq)]
pub enum Assigned {
    /// DISPATCHED to the node under a fresh fencing token; send it the dispatch.
    Granted(RunRecord),
    /// The node holds `max_concurrency` leased runs already.
    NodeFull,
    /// The run is no longer WAITING at that attempt (someone else routed or finished
    /// it), or it is gone.
    NotWaiting(Option<RunRecord>),
}

/// Outcome of `fan_out`.
#[derive(Debug, Clone, PartialEq)]
pub enum FannedOut {
    /// The parent (RUNNING) and its shards (WAITING, by index), to route now.
    Shards {
        parent: RunRecord,
        shards: Vec<RunRecord>,
    },
    /// The run is not WAITING at that attempt (or queued), or it is gone.
    NotWaiting(Option<RunRecord>),
}

/// Who finishes a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finisher {
    /// The executor holding the lease with this token (a Result, or the server for an
    /// HTTP target).
    Token(u64),
    /// The dispatcher, for a WAITING run at this attempt that found no executor.
    Waiting { attempt: u32 },
}

/// The end of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// SUCCEEDED, FAILED or CANCELLED (by the executor). Only FAILED is retried
    /// while attempts remain. WAITING means the executor rejected the dispatch.
    pub state: RunState,
    pub output: Option<Vec<u8>>,
    pub error_code: String,
    pub error_message: String,
    /// Executor-reported times. Absent: `started_at` stays as recorded (by
    /// `mark_started`), `finished_at` is the store's now.
    pub started_at: Option<Millis>,
    pub finished_at: Option<Millis>,
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

/// What a run transition did, with the follow-up work it leaves to the caller.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub applied: Applied,
    /// The run after the call; None when there is no such run.
    pub run: Option<RunRecord>,
    /// Leases this call took away (several when a broadcast run's shards are
    /// cancelled with it); each node must be sent `Cancel`.
    pub revoked: Vec<Revocation>,
    /// A serial run this call released from the job's queue: it is WAITING and due to
    /// be routed now.
    pub next_serial: Option<String>,
}

/// One stored log line of a run.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogLine {
    /// Position in the run's log, from 1, never reused even after old lines are dropped.
    pub seq: u64,
    pub time_ms: Millis,
    pub level: String,
    pub message: String,
    pub attempt: u32,
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
    /// Names the stream this record was registered by (chosen at its hello), so that
    /// the end of one stream never removes the registration of the node's next one.
    #[serde(default)]
    pub session: String,
    /// False while the executor declares itself not ready.
    pub ready: bool,
    /// Asked to drain (`DrainNode`): it finishes what it holds and gets no new work.
    #[serde(default)]
    pub draining: bool,
    /// Runs the executor reports holding (at its last heartbeat).
    pub active: u32,
    /// Runs leased to the node right now, as the store counts them (filled in by
    /// `list_nodes`; never stored): ahead of `active` between heartbeats.
    #[serde(default, skip_serializing)]
    pub leased: u32,
    pub load: f64,
    /// Mean duration (ms) of the node's results in the health window, as seen by the
    /// instance that holds its stream (reset when it reconnects).
    #[serde(default)]
    pub mean_duration_ms: u64,
    /// Of those recent results, how many were not SUCCEEDED.
    #[serde(default)]
    pub recent_errors: u32,
    #[serde(default)]
    pub recent_results: u32,
    pub connected_at: Millis,
    /// Written by the store from its clock.
    pub last_heartbeat: Millis,
}

/// What [`Store::remove_node`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeRemoved {
    /// The registration was the stream's own and is gone.
    pub removed: bool,
    /// Leases brought to end within `leases_within`.
    pub leases_shortened: u32,
}

/// Result of a manual trigger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueued {
    pub schedule_id: String,
    /// The idempotency key had been used: nothing new was queued.
    pub duplicate: bool,
}

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

    /// Creates and updates many jobs of one `partition` in one atomic step (the bulk
    /// twin of [`Store::create_job`] and [`Store::update_job`], same rules per item). One
    /// answer per write, in order: the record as written, or the refusal that write met
    /// (`JobExists`, `JobNotFound`, `VersionConflict`), which leaves the others applied.
    /// Every write must belong to `partition` (else `Error::Corrupt`, nothing written).
    async fn apply_jobs(
        &self,
        partition: u32,
        writes: Vec<JobWrite>,
    ) -> Result<Vec<Result<JobRecord>>>;

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

    /// Marks `instance` alive until `ttl` from now (store clock) and returns the other
    /// instances whose last beat has run out: the consumers whose unacknowledged
    /// triggers [`Store::take_over_triggers`] may take at once, without waiting for
    /// them to idle. The embedded store serves one process and has none.
    async fn beat_instance(&self, instance: &str, ttl: Duration) -> Result<Vec<String>>;

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

    // ---- the run state machine (DESIGN.md "Life of a run")
    //
    // A run's timer lives in its partition's sorted set of deadlines, scored by the
    // earliest of `run.deadlines`; `due_runs` + `expire_run` are how every instance
    // sweeps it. A run leaving DISPATCHED/RUNNING always leaves its node's lease count.
    // A revoked lease always gets a new token, so the old holder's messages are stale.

    /// Records a trigger's run (`run` is `RunRecord::from_trigger` with its `plan`
    /// filled) and applies the overlap policy against the job's active runs (those not
    /// final) in the same step:
    /// - already recorded → returned unchanged, `created` false;
    /// - trigger says skip, or the job is paused/deleted → SKIPPED (as `record_run`);
    /// - allow, or no active run → WAITING, `wake_at` = now + `route_grace` (the
    ///   caller routes it at once; the timer only matters if the caller dies),
    ///   `wait_until` = now + plan.dispatch_wait_ms;
    /// - forbid with an active run → SKIPPED, reason "overlap";
    /// - serial with an active run → WAITING with no timer, reason "queued", appended
    ///   to the job's serial queue; SKIPPED "serial queue full" past plan.serial_limit;
    /// - replace → every active run is CANCELLED (reason "replaced"), each lease
    ///   revoked (listed in `revoked`), queued serial runs too; then as allow.
    ///
    /// The new run joins the job's active set unless SKIPPED.
    async fn begin_run(&self, run: RunRecord, route_grace: Duration) -> Result<Begun>;

    /// Dispatches a WAITING run at `attempt` to `node`: a fresh fencing token
    /// (max(job counter + 1, store time in µs)), state DISPATCHED, node_id set,
    /// `lease_expires` = now + ttl, `confirm_by` = now + confirm_within, `timeout_at` =
    /// now + plan.timeout_ms (if set), `wake_at`/`wait_until` cleared; the node's lease
    /// count grows by one unless it is at its max concurrency (`NodeFull`, nothing
    /// changes).
    async fn assign_run(
        &self,
        schedule_id: &str,
        attempt: u32,
        node: &NodeSlot,
        terms: LeaseTerms,
    ) -> Result<Assigned>;

    /// The executor confirmed the dispatch: DISPATCHED → RUNNING with `started_at` (the
    /// store's now), `confirm_by` cleared. RUNNING with the same token → `Already`.
    /// Anything else (stale token, final run) → `No`.
    async fn mark_started(&self, schedule_id: &str, token: u64) -> Result<Transition>;

    /// Renews exactly the listed leases held by `node_id` (a heartbeat's in-flight
    /// list), each only if its token is current and the lease has not expired; a
    /// DISPATCHED run listed here counts as confirmed (`confirm_by` cleared). Returns,
    /// per entry in order, the lease's remaining time in ms, or None when it is gone.
    async fn renew_leases(
        &self,
        node_id: &str,
        held: &[Held],
        ttl: Duration,
    ) -> Result<Vec<Option<i64>>>;

    /// Ends the current attempt. With `Finisher::Token`, only if the token is current
    /// and the run DISPATCHED or RUNNING (a final run finished by that same token →
    /// `Already`); with `Finisher::Waiting`, only if the run is WAITING at that attempt.
    /// FAILED with attempts left → WAITING at attempt + 1, `wake_at` = now +
    /// plan.backoff_after(attempt), `wait_until` = wake_at + dispatch_wait_ms,
    /// `last_node` = the node, error fields kept, a new token; WAITING (only with a
    /// token: the executor rejected the dispatch) → back to WAITING at the same
    /// attempt with a new token, `last_node` = the node, `wake_at` = now, `wait_until`
    /// = now + dispatch_wait_ms, reason "rejected: <error_message>"; otherwise the
    /// outcome is final: the
    /// run leaves the active set and the job's serial queue pops its next run (WAITING,
    /// `wake_at` = now), named in `next_serial`.
    async fn finish_run(
        &self,
        schedule_id: &str,
        by: Finisher,
        outcome: Outcome,
    ) -> Result<Transition>;

    /// Sharding broadcast: fans a WAITING run at `attempt` (not queued) out into
    /// `shards` sub-runs `{schedule_id}#{i}` (i from 0), each WAITING at attempt 1 with
    /// the parent's plan, payload and route key, `shard_index`/`shard_total` set,
    /// `wake_at` = now + `route_grace`, `wait_until` = now + dispatch_wait_ms, and its
    /// own token, timer and retries. The parent becomes RUNNING with no lease and no
    /// deadlines (`shard_total` = shards, `started_at` = now) and stays active for the
    /// overlap policy. Shards are not in the job's run list. When a shard becomes
    /// final, the same step counts it on the parent; when the last one does, the
    /// parent becomes SUCCEEDED if every shard did, else FAILED "shards_failed" with
    /// the failed shards named in its error message — and only then leaves the active
    /// set and pops the serial queue.
    ///
    /// Executor-facing calls (`mark_started`, `renew_leases`, `finish_run` by token,
    /// `report_progress`, `append_logs`) given a fanned-out parent's schedule_id act
    /// on its shard 0, because shard 0 travels under the parent's schedule_id.
    async fn fan_out(
        &self,
        schedule_id: &str,
        attempt: u32,
        shards: u32,
        route_grace: Duration,
    ) -> Result<FannedOut>;

    /// Runs of a partition whose timer is due by the store's clock, earliest first.
    async fn due_runs(&self, partition: u32, limit: usize) -> Result<Vec<String>>;

    /// Acts on whatever deadline of the run has passed (store clock), in this order:
    /// - final or missing → the timer is dropped, `Applied::No`;
    /// - DISPATCHED/RUNNING past `timeout_at` → revoked, TIMED_OUT, retried like a
    ///   FAILED outcome (reason "timeout");
    /// - DISPATCHED past `confirm_by`, or past `lease_expires` before it was confirmed →
    ///   revoked, back to WAITING at the same attempt, `wake_at` = now (reason
    ///   "unconfirmed");
    /// - RUNNING (or confirmed DISPATCHED) past `lease_expires` → revoked; WAITING at
    ///   attempt + 1 with `wake_at` = now and `last_node` set, or FAILED reason "lost"
    ///   when attempts are spent;
    /// - WAITING past `wake_at` → `wake_at` moves to now + `route_grace` and the run is
    ///   returned (`Applied::Yes`, state WAITING) for the caller to route;
    /// - otherwise the timer is re-scored to the earliest deadline, `Applied::No`.
    async fn expire_run(&self, schedule_id: &str, route_grace: Duration) -> Result<Transition>;

    /// Cancels a run that is not final: its lease (if any) is revoked, it leaves the
    /// active set and the serial queue, state CANCELLED with `reason`; the serial queue
    /// pops. A fanned-out broadcast run takes its unfinished shards with it (each
    /// revoked and CANCELLED; their revocations listed). A final run → `Applied::No`
    /// with the run.
    async fn cancel_run(&self, schedule_id: &str, reason: &str) -> Result<Transition>;

    /// Stores an executor's progress report if `token` is current; returns whether.
    async fn report_progress(
        &self,
        schedule_id: &str,
        token: u64,
        percent: u32,
        message: &str,
    ) -> Result<bool>;

    /// Appends log lines (their `seq` is assigned here) if `token` is current, keeping
    /// at most `max_bytes` of message text per run (the oldest lines fall out first);
    /// returns whether they were stored. Logs live as long as the run record.
    async fn append_logs(
        &self,
        schedule_id: &str,
        token: u64,
        lines: Vec<LogLine>,
        max_bytes: usize,
    ) -> Result<bool>;

    /// Log lines with `seq > after`, oldest first, at most `limit`.
    async fn read_logs(&self, schedule_id: &str, after: u64, limit: usize) -> Result<Vec<LogLine>>;

    // ---- the webhook outbox (DESIGN.md "Webhook outbox")
    //
    // The step that makes a run final (never a broadcast shard's: its parent's) writes,
    // when the run's plan has a callback URL, an outbox entry keyed by the schedule_id
    // (job, URL, the body fixed then, created_at = now, due now, 0 attempts) and sets
    // the run's `callback_state` to PENDING. A delivery worker claims a due entry
    // (`claim_delivery`), which moves it in flight under a new delivery token and a
    // lease; the outcome (`finish_delivery`) is applied only with that token, so a slow
    // worker whose lease ran out can never overwrite a later outcome, and a worker that
    // dies leaves an entry that comes due again when its lease ends.

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

    // ---- per-instance inboxes: dispatches for executors attached to another instance

    /// Queues a message for `instance`. Inboxes are best effort by design: a dispatch
    /// lost with its instance is never confirmed and is re-routed (`confirm_by`).
    async fn push_inbox(&self, instance: &str, message: Vec<u8>) -> Result<()>;

    /// Takes up to `max` messages for `instance`, oldest first, waiting at most `block`
    /// for the first.
    async fn pop_inbox(&self, instance: &str, max: usize, block: Duration) -> Result<Vec<Vec<u8>>>;

    // ---- the executor node registry

    /// Registers or refreshes a node (`last_heartbeat` = the store's now); it expires
    /// `ttl` later unless refreshed again. A refresh replaces the whole record.
    async fn upsert_node(&self, node: NodeRecord, ttl: Duration) -> Result<()>;

    /// The stream `node` was registered by ended. Removes the node if that stream still
    /// holds it (same `instance` and `session`: a node that reconnected meanwhile, to
    /// this instance or another, is left alone). When it was removed and `leases_within`
    /// is given, every lease the node holds ends at most that long from now (store
    /// clock) unless it already ends sooner, so the runs of an executor that died fail
    /// over in about that time instead of a lease TTL; a node that registers again
    /// before they run out renews them with its hello (`renew_leases`), and a node
    /// registered again before this step is left alone.
    async fn remove_node(
        &self,
        node: &NodeRecord,
        leases_within: Option<Duration>,
    ) -> Result<NodeRemoved>;

    /// Unexpired nodes, by node id; `group` filters when given.
    async fn list_nodes(&self, group: Option<&str>) -> Result<Vec<NodeRecord>>;

    // ---- routing

    /// The next value (from 0) of the job's round-robin counter, shared by every
    /// instance, so the instances routing one job's runs take turns from a single
    /// sequence instead of each starting on the same node.
    async fn next_route_counter(&self, job_id: &str) -> Result<u64>;

    // ---- apps and their secrets

    /// Stores a new app (`created_at` and each secret's `not_after` as given, except
    /// that `created_at` 0 becomes the store's now). An existing id → `AppExists`.
    async fn create_app(&self, app: AppRecord) -> Result<AppRecord>;

    async fn get_app(&self, app_id: &str) -> Result<Option<AppRecord>>;

    /// Adds `secret` as the app's current secret; the secrets that signed until now
    /// keep signing for `overlap` more (store clock) and the ones already past their
    /// end are dropped, in one step. Unknown app → `AppNotFound`.
    async fn rotate_app_secret(
        &self,
        app_id: &str,
        secret: &str,
        overlap: Duration,
    ) -> Result<AppRecord>;

    // ---- inbound replay protection

    /// True if `nonce` was not seen for `app_id` within `ttl`; remembers it.
    async fn check_nonce(&self, app_id: &str, nonce: &str, ttl: Duration) -> Result<bool>;
}

/// One write of [`Store::apply_jobs`].
#[derive(Clone, Debug, PartialEq)]
pub enum JobWrite {
    /// Create the job (refused with `JobExists` if it exists).
    Create(JobRecord),
    /// Replace the job if it is still at `expected_version`.
    Update {
        job: JobRecord,
        expected_version: u64,
    },
}

impl JobWrite {
    /// The job this write is for.
    pub fn job_id(&self) -> &str {
        match self {
            JobWrite::Create(job) | JobWrite::Update { job, .. } => &job.spec.id,
        }
    }
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
