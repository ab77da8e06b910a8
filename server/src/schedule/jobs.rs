//! Job lifecycle: how a validated spec is armed (cron, start/end window, jitter) and the
//! create / update / pause / resume / delete / trigger operations, each one atomic store
//! call that bumps the version and rewrites the pending member.
//!
//! The gRPC handlers only forward here; the scheduler uses [`Plan`] to compute the next
//! fire of a claimed one.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt as _;

use crate::model::{
    Arm, JobRecord, JobSpec, Millis, Trigger, TriggerKind, manual_schedule_no, valid_job_id,
};
use crate::schedule::cron::{CronError, CronSchedule};
use crate::store::{self, Enqueued, JobStore, JobWrite, Page, partition_of};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error(transparent)]
    Store(#[from] store::Error),
}

impl From<CronError> for Error {
    fn from(e: CronError) -> Self {
        Error::Invalid {
            field: e.field(),
            reason: e.reason(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A job's spec with its parsed cron: everything needed to compute fire times. The
/// parsed cron is shared (jobs with one cron line and zone share one parse; a clone of
/// it copied croner's tables, about 2 % of the server's CPU in a burst of new jobs).
#[derive(Clone, Debug)]
pub struct Plan {
    pub spec: Arc<JobSpec>,
    pub cron: Arc<CronSchedule>,
}

impl Plan {
    pub fn new(spec: JobSpec) -> Result<Self> {
        let cron = CronSchedule::parse(&spec.cron, &spec.time_zone)?;
        Ok(Self {
            spec: Arc::new(spec),
            cron: Arc::new(cron),
        })
    }

    /// The first planned fire strictly after `after` inside the job's start/end window.
    pub fn next_planned(&self, after: Millis) -> Option<Millis> {
        next_in_window(&self.cron, self.spec.start_time, self.spec.end_time, after)
    }

    /// The fire to arm after `after`: planned time plus the job's stable jitter.
    pub fn next_arm(&self, after: Millis) -> Option<Arm> {
        self.next_planned(after).map(|planned| Arm {
            planned,
            due: planned + jitter_offset(&self.spec.id, self.spec.jitter_ms),
        })
    }

    /// The record of a new job with this plan, armed from `now` unless `paused`.
    pub fn new_record(&self, paused: bool, now: Millis) -> JobRecord {
        JobRecord {
            spec: (*self.spec).clone(),
            version: 1,
            paused,
            next_fire: if paused { None } else { self.next_arm(now) },
            created_at: now,
            updated_at: now,
        }
    }

    /// `current` with this plan's spec, re-armed from `now` (unless it is paused).
    pub fn replacing(&self, current: &JobRecord, now: Millis) -> JobRecord {
        JobRecord {
            spec: (*self.spec).clone(),
            next_fire: if current.paused {
                None
            } else {
                self.next_arm(now)
            },
            updated_at: now,
            ..current.clone()
        }
    }

    /// Up to `n` upcoming planned fires after `after`.
    pub fn upcoming(&self, after: Millis, n: usize) -> Vec<Millis> {
        upcoming_in_window(
            &self.cron,
            self.spec.start_time,
            self.spec.end_time,
            after,
            n,
        )
    }
}

/// The first fire of `cron` strictly after `after` that is no earlier than `start` and
/// no later than `end`.
fn next_in_window(
    cron: &CronSchedule,
    start: Option<Millis>,
    end: Option<Millis>,
    after: Millis,
) -> Option<Millis> {
    let after = match start {
        Some(start) => after.max(start - 1),
        None => after,
    };
    let next = cron.next_after(after)?;
    match end {
        Some(end) if next > end => None,
        _ => Some(next),
    }
}

/// Up to `n` fires of `cron` after `after` inside the window.
fn upcoming_in_window(
    cron: &CronSchedule,
    start: Option<Millis>,
    end: Option<Millis>,
    after: Millis,
    n: usize,
) -> Vec<Millis> {
    let mut out = Vec::with_capacity(n);
    let mut t = after;
    while out.len() < n {
        match next_in_window(cron, start, end, t) {
            Some(next) => {
                out.push(next);
                t = next;
            }
            None => break,
        }
    }
    out
}

/// A schedule that is not (or not yet) a job's: what `PreviewFireTimes` computes.
#[derive(Debug, Clone)]
pub struct Preview {
    pub cron: String,
    pub time_zone: String,
    pub start: Option<Millis>,
    pub end: Option<Millis>,
    /// Fires strictly after this; `None`: the store's now.
    pub after: Option<Millis>,
    pub count: usize,
}

/// A job's jitter is one stable offset in `[0, jitter_ms)`, derived from its id: it
/// spreads jobs that share a cron line without making any one job's cadence irregular.
pub fn jitter_offset(job_id: &str, jitter_ms: i64) -> i64 {
    if jitter_ms <= 0 {
        return 0;
    }
    // FNV-1a 64 over the id; the low bits are well mixed enough for a modulus.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in job_id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % jitter_ms.unsigned_abs()) as i64
}

/// Most specs one [`Jobs::apply`] call takes.
pub const MAX_APPLY: usize = 1000;

/// Partitions whose batches one [`Jobs::apply`] call writes at once.
const APPLY_PARALLEL_PARTITIONS: usize = 8;

/// What [`Jobs::apply`] did with one spec.
#[derive(Debug)]
pub enum ApplyOutcome {
    Created(JobRecord),
    Updated(JobRecord),
    /// The spec equals the job's: nothing was written.
    Unchanged(JobRecord),
    /// Another caller created, changed or deleted the job between our read and our
    /// write: nothing was written for this spec.
    Conflict(String),
}

/// The job operations, over a store. Cheap to clone.
#[derive(Clone)]
pub struct Jobs {
    store: Arc<dyn JobStore>,
}

impl Jobs {
    pub fn new(store: Arc<dyn JobStore>) -> Self {
        Self { store }
    }

    /// Creates a job armed from the store's now (unless created paused).
    pub async fn create(&self, spec: JobSpec, paused: bool) -> Result<JobRecord> {
        let plan = Plan::new(spec)?;
        let now = self.store.now().await?;
        Ok(self.store.create_job(plan.new_record(paused, now)).await?)
    }

    /// Replaces the spec if the job is still at `expected_version`; re-arms from now.
    pub async fn update(&self, spec: JobSpec, expected_version: u64) -> Result<JobRecord> {
        let plan = Plan::new(spec)?;
        let current = self.require(&plan.spec.id).await?;
        let now = self.store.now().await?;
        let record = plan.replacing(&current, now);
        Ok(self.store.update_job(record, expected_version).await?)
    }

    /// Pauses: the pending fire goes away; queued triggers will be recorded SKIPPED.
    /// Pausing a paused job changes nothing.
    pub async fn pause(&self, job_id: &str) -> Result<JobRecord> {
        loop {
            let current = self.require(job_id).await?;
            if current.paused {
                return Ok(current);
            }
            let now = self.store.now().await?;
            let version = current.version;
            let record = JobRecord {
                paused: true,
                next_fire: None,
                updated_at: now,
                ..current
            };
            match self.store.update_job(record, version).await {
                Err(store::Error::VersionConflict { .. }) => continue,
                r => return Ok(r?),
            }
        }
    }

    /// Resumes: arms the first fire after the store's now, with no catch-up.
    pub async fn resume(&self, job_id: &str) -> Result<JobRecord> {
        loop {
            let current = self.require(job_id).await?;
            if !current.paused {
                return Ok(current);
            }
            let plan = Plan::new(current.spec.clone())?;
            let now = self.store.now().await?;
            let version = current.version;
            let record = JobRecord {
                paused: false,
                next_fire: plan.next_arm(now),
                updated_at: now,
                ..current
            };
            match self.store.update_job(record, version).await {
                Err(store::Error::VersionConflict { .. }) => continue,
                r => return Ok(r?),
            }
        }
    }

    /// Makes each spec true (see `ApplyJobsRequest` in the proto): creates the jobs
    /// that do not exist (paused as their spec says), replaces the spec of those whose
    /// spec differs (re-armed from now, paused state kept), leaves equal ones alone.
    /// One read of the current jobs, then one store write per partition. The answer has
    /// one entry per spec, in order: an outcome, or the spec's own validation error.
    /// Ids must be distinct (the caller checks); a store failure fails the whole call
    /// (some partitions may be written: applying again finishes the job). A `dry_run`
    /// writes nothing and answers each spec with the job as applying it would leave it.
    pub async fn apply(
        &self,
        specs: Vec<(JobSpec, bool)>,
        dry_run: bool,
    ) -> Result<Vec<Result<ApplyOutcome>>> {
        let mut answers: Vec<Option<Result<ApplyOutcome>>> = Vec::with_capacity(specs.len());
        let mut plans = Vec::new();
        for (i, (spec, paused)) in specs.into_iter().enumerate() {
            match Plan::new(spec) {
                Ok(plan) => {
                    answers.push(None);
                    plans.push((i, plan, paused));
                }
                Err(e) => answers.push(Some(Err(e))),
            }
        }
        let ids: Vec<String> = plans.iter().map(|(_, p, _)| p.spec.id.clone()).collect();
        let current: HashMap<String, JobRecord> = self
            .store
            .get_jobs(&ids)
            .await?
            .into_iter()
            .map(|j| (j.spec.id.clone(), j))
            .collect();
        let now = self.store.now().await?;
        let partitions = self.store.partitions();
        let mut batches: HashMap<u32, Vec<(usize, JobWrite)>> = HashMap::new();
        for (i, plan, paused) in plans {
            let write = match current.get(&plan.spec.id) {
                Some(job) if job.spec == *plan.spec => {
                    answers[i] = Some(Ok(ApplyOutcome::Unchanged(job.clone())));
                    continue;
                }
                Some(job) => JobWrite::Update {
                    job: plan.replacing(job, now),
                    expected_version: job.version,
                },
                None => JobWrite::Create(plan.new_record(paused, now)),
            };
            if dry_run {
                answers[i] = Some(Ok(match write {
                    JobWrite::Create(job) => ApplyOutcome::Created(job),
                    JobWrite::Update { mut job, .. } => {
                        job.version += 1;
                        ApplyOutcome::Updated(job)
                    }
                }));
                continue;
            }
            batches
                .entry(partition_of(write.job_id(), partitions))
                .or_default()
                .push((i, write));
        }
        let store = &self.store;
        let mut written = futures::stream::iter(batches.into_iter().map(|(p, batch)| async move {
            let (slots, writes): (Vec<(usize, bool)>, Vec<JobWrite>) = batch
                .into_iter()
                .map(|(i, w)| ((i, matches!(w, JobWrite::Create(_))), w))
                .unzip();
            store.apply_jobs(p, writes).await.map(|out| (slots, out))
        }))
        .buffer_unordered(APPLY_PARALLEL_PARTITIONS);
        while let Some(batch) = written.next().await {
            let (slots, out) = batch?;
            for ((i, created), r) in slots.into_iter().zip(out) {
                answers[i] = Some(Ok(match r {
                    Ok(job) if created => ApplyOutcome::Created(job),
                    Ok(job) => ApplyOutcome::Updated(job),
                    Err(store::Error::JobExists(_)) => {
                        ApplyOutcome::Conflict("created by another caller meanwhile".into())
                    }
                    Err(store::Error::JobNotFound(_)) => {
                        ApplyOutcome::Conflict("deleted by another caller meanwhile".into())
                    }
                    Err(store::Error::VersionConflict { current, .. }) => ApplyOutcome::Conflict(
                        format!("changed by another caller meanwhile (now version {current})"),
                    ),
                    Err(e) => return Err(e.into()),
                }));
            }
        }
        // Every spec is answered above (invalid, unchanged, or one answer per write);
        // a store that answered fewer writes than it was given is corrupt.
        Ok(answers
            .into_iter()
            .map(|a| {
                a.unwrap_or_else(|| {
                    Err(store::Error::Corrupt("apply_jobs left a write unanswered".into()).into())
                })
            })
            .collect())
    }

    /// The next planned fires of a schedule, from the same cron code and window rule
    /// as a saved job's.
    pub async fn preview(&self, p: Preview) -> Result<Vec<Millis>> {
        let cron = CronSchedule::parse(&p.cron, &p.time_zone)?;
        let after = match p.after {
            Some(after) => after,
            None => self.store.now().await?,
        };
        Ok(upcoming_in_window(&cron, p.start, p.end, after, p.count))
    }

    pub async fn delete(&self, job_id: &str) -> Result<()> {
        Ok(self.store.delete_job(job_id).await?)
    }

    pub async fn get(&self, job_id: &str) -> Result<JobRecord> {
        self.require(job_id).await
    }

    /// Jobs whose id starts with `prefix` (all when empty), `limit` at a time.
    pub async fn list(
        &self,
        cursor: Option<&str>,
        prefix: &str,
        limit: usize,
    ) -> Result<Page<JobRecord>> {
        Ok(self.store.list_jobs(cursor, prefix, limit).await?)
    }

    /// The cursor that continues a listing right after the job `job_id`.
    pub fn cursor_after(&self, job_id: &str) -> String {
        self.store.job_cursor_after(job_id)
    }

    /// Queues a manual run now. The same idempotency key never queues twice.
    pub async fn trigger(
        &self,
        job_id: &str,
        idempotency_key: Option<&str>,
        payload_override: Option<Vec<u8>>,
        route_key_override: Option<String>,
    ) -> Result<Enqueued> {
        if let Some(k) = idempotency_key
            && !valid_job_id(k)
        {
            return Err(Error::Invalid {
                field: "idempotency_key",
                reason: "must match [A-Za-z0-9._-]{1,128}, not . or ..".into(),
            });
        }
        let job = self.require(job_id).await?;
        let now = self.store.now().await?;
        let trigger = Trigger {
            job_id: job_id.to_owned(),
            schedule_no: manual_schedule_no(idempotency_key),
            kind: TriggerKind::Manual,
            scheduled_at: now,
            triggered_at: now,
            job_version: job.version,
            skip_reason: None,
            payload_override,
            route_key_override,
        };
        Ok(self.store.enqueue_manual(trigger, idempotency_key).await?)
    }

    async fn require(&self, job_id: &str) -> Result<JobRecord> {
        self.store
            .get_job(job_id)
            .await?
            .ok_or_else(|| store::Error::JobNotFound(job_id.to_owned()).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(cron: &str, start: Option<Millis>, end: Option<Millis>) -> Plan {
        let mut spec = crate::store::conformance::spec("p");
        spec.cron = cron.into();
        spec.start_time = start;
        spec.end_time = end;
        Plan::new(spec).expect("valid")
    }

    #[test]
    fn start_and_end_bound_the_fires() {
        let t0 = 1_800_000_000_000; // a whole second
        let p = plan("* * * * * *", Some(t0 + 10_000), Some(t0 + 12_000));
        assert_eq!(
            p.next_planned(t0),
            Some(t0 + 10_000),
            "nothing before the start"
        );
        assert_eq!(
            p.upcoming(t0, 10),
            vec![t0 + 10_000, t0 + 11_000, t0 + 12_000]
        );
        assert_eq!(p.next_planned(t0 + 12_000), None, "nothing after the end");
        let open = plan("*/15 * * * *", None, None);
        assert_eq!(open.upcoming(t0, 2).len(), 2);
        assert_eq!(open.next_arm(t0).map(|a| a.due - a.planned), Some(0));
    }

    #[test]
    fn jitter_is_stable_and_bounded() {
        assert_eq!(jitter_offset("a", 0), 0);
        for id in ["a", "job-1", "report.daily"] {
            let j = jitter_offset(id, 1000);
            assert!((0..1000).contains(&j));
            assert_eq!(j, jitter_offset(id, 1000));
        }
        assert_ne!(jitter_offset("a", 1_000_000), jitter_offset("b", 1_000_000));
    }
}
