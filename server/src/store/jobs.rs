//! `JobStore`: the jobs, their pending fires and what turns a fire into a trigger.
//!
//! Guarantees: every job change (create, update, pause, resume, delete) is one atomic
//! version bump that rewrites (or removes) the job's pending member, so a claim computed
//! from an old definition can never re-arm a chain; a claim advances a job only if its
//! pending score, version and enabled state are what the claimer read, and writes the
//! next fire and the trigger(s) in the same step. A fire is claimed at most once and
//! never lost. "Due" is judged by the store's clock.

use async_trait::async_trait;
use tokio::sync::watch;

use super::{Page, Result, StoreMeta};
use crate::model::{Arm, JobRecord, Millis, Trigger};

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
    /// That fire's planned time (`DueFire::planned`: its due less the job's jitter).
    pub expected_planned: Millis,
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

/// Result of a manual trigger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueued {
    pub schedule_id: String,
    /// The idempotency key had been used: nothing new was queued.
    pub duplicate: bool,
}

/// One write of [`JobStore::apply_jobs`].
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

/// Jobs, the pending set, fires, manual triggers and job changes. See the module docs.
#[async_trait]
pub trait JobStore: StoreMeta {
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
    /// twin of [`JobStore::create_job`] and [`JobStore::update_job`], same rules per item). One
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

    /// Jobs whose id starts with `prefix` (all of them when it is empty) in a stable
    /// order, `limit` at a time, from after `cursor` (a page's `next_cursor`), read by
    /// the prefix's range, never by scanning the jobs outside it; a cursor no listing
    /// of this store could have returned is refused with
    /// [`Error::BadCursor`](super::Error::BadCursor).
    async fn list_jobs(
        &self,
        cursor: Option<&str>,
        prefix: &str,
        limit: usize,
    ) -> Result<Page<JobRecord>>;

    /// The cursor that continues a listing of jobs right after the job `job_id` (for a
    /// caller that stops before the end of a page).
    fn job_cursor_after(&self, job_id: &str) -> String;

    // ---- fires

    /// Due pending members of one partition (score ≤ the store's now), earliest first.
    async fn due_fires(&self, partition: u32, limit: usize) -> Result<DueBatch>;

    /// Pending members of one partition due after `after` and at or before `by` (the
    /// store's clock), earliest first, at most `limit`: a read and nothing more (no
    /// claim, no partition lease), so the scheduler can read the jobs of fires due
    /// soon before they are due.
    async fn upcoming_fires(
        &self,
        partition: u32,
        after: Millis,
        by: Millis,
        limit: usize,
    ) -> Result<Vec<DueFire>>;

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
}
