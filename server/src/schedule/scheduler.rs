//! The scheduler loop: claims due fires from the pending set, computes each job's next
//! fire from its cron, applies the misfire policy, and hands the claim (next fire +
//! triggers) to the store as one atomic step per batch.
//!
//! Every instance runs this loop over every partition; the store's compare-and-set
//! (`claim_fires`) makes sure each fire is claimed exactly once. The loop sleeps until
//! the earliest due time the store reports (at most `max_sleep`), and wakes early when
//! any instance creates or changes a job (the store's change notification). While it
//! sleeps, it reads the jobs of the fires due within `read_ahead` that it has no plan
//! for (a read only: what is due is still judged and claimed when due).
//!
//! Architecture Invariant: the scheduler never decides "due" by its own clock; it only
//! uses the store's now and converts the remaining delay into a local sleep.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, info_span, warn};

use crate::deliver::alerts::{AlertKind, Alerts};
use crate::fault::crash_point;
use crate::model::{JobRecord, Millis, MisfirePolicy, Trigger, TriggerKind};
use crate::schedule::cron::CronError;
use crate::schedule::jobs::{self, Plan};
use crate::store::job_cache::JobCache;
use crate::store::{ClaimResult, DueFire, FireClaim, JobStore};

#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// Due fires read and claimed per store call.
    pub batch_size: usize,
    /// The longest the loop sleeps without asking the store again. A safety net: it
    /// sleeps until the earliest due fire the store reported and is woken by the
    /// store's change notification when any instance creates or changes a job, so an
    /// idle server asks each partition once per `max_sleep` (5 s by default).
    pub max_sleep: Duration,
    /// While the loop sleeps, it reads the jobs of the fires due within this much
    /// time that it has no plan for yet (`Scheduler::read_ahead`), so their claims
    /// read nothing when they fall due. Zero: read them when due.
    pub read_ahead: Duration,
    /// A fire claimed later than this (by the store's clock) is a misfire.
    pub misfire_threshold: Duration,
    /// Catch-up limit for jobs that do not set their own.
    pub default_catch_up_limit: u32,
    /// Partitions claimed concurrently in one pass.
    pub parallel_partitions: usize,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        Self {
            batch_size: 500,
            max_sleep: Duration::from_secs(5),
            read_ahead: Duration::from_secs(10),
            misfire_threshold: Duration::from_secs(5),
            default_catch_up_limit: 10,
            parallel_partitions: 4,
        }
    }
}

/// Lateness of claimed fires (claim time by the store's clock − due time), for
/// benchmarks and metrics. Shared between the loop and whoever reports.
#[derive(Clone)]
pub struct SchedulerStats {
    inner: Arc<Mutex<StatsInner>>,
}

struct StatsInner {
    lateness_ms: hdrhistogram::Histogram<u64>,
    claimed: u64,
    lost_races: u64,
    misfires: u64,
}

impl Default for SchedulerStats {
    fn default() -> Self {
        let lateness_ms = hdrhistogram::Histogram::new_with_bounds(1, 3_600_000, 3)
            .expect("constant histogram bounds are valid");
        Self {
            inner: Arc::new(Mutex::new(StatsInner {
                lateness_ms,
                claimed: 0,
                lost_races: 0,
                misfires: 0,
            })),
        }
    }
}

/// A point-in-time copy of [`SchedulerStats`].
#[derive(Debug, Clone, Default)]
pub struct StatsSnapshot {
    pub claimed: u64,
    pub lost_races: u64,
    pub misfires: u64,
    pub lateness_p50_ms: u64,
    pub lateness_p99_ms: u64,
    pub lateness_max_ms: u64,
}

impl SchedulerStats {
    pub fn snapshot(&self) -> StatsSnapshot {
        let Ok(s) = self.inner.lock() else {
            return StatsSnapshot::default();
        };
        StatsSnapshot {
            claimed: s.claimed,
            lost_races: s.lost_races,
            misfires: s.misfires,
            lateness_p50_ms: s.lateness_ms.value_at_quantile(0.5),
            lateness_p99_ms: s.lateness_ms.value_at_quantile(0.99),
            lateness_max_ms: s.lateness_ms.max(),
        }
    }

    fn record(&self, lateness: &[Millis], lost: u64, misfires: u64) {
        if let Ok(mut s) = self.inner.lock() {
            for l in lateness {
                s.lateness_ms.saturating_record((*l).max(0) as u64);
            }
            s.claimed += lateness.len() as u64;
            s.lost_races += lost;
            s.misfires += misfires;
        }
    }
}

/// The scheduler loop of one instance.
pub struct Scheduler {
    store: Arc<dyn JobStore>,
    opts: SchedulerOptions,
    stats: SchedulerStats,
    /// Lateness, misfires and their alerts, for the fires this instance's claims won.
    alerts: Arc<Alerts>,
    /// The job records read to plan fires, kept for the instance's router (which
    /// begins their runs) in the cache they share.
    job_cache: Arc<JobCache>,
    /// One state per partition, in the order this instance visits them: a random
    /// rotation, so instances spread out instead of racing for the same batch first.
    partitions: Vec<PartitionState>,
}

/// What the scheduler caches about one partition's jobs. A job lives in one partition,
/// so partitions can be claimed concurrently without sharing anything.
struct PartitionState {
    partition: u32,
    /// Parsed plans by job id, valid for the cached version only.
    plans: HashMap<String, (u64, Option<Plan>)>,
    /// The store's now at the partition's last read, and when that was here.
    seen: Option<(Millis, Instant)>,
    /// The earliest fire the partition's last read or claim left pending (None:
    /// none), so a window with no fire in it is not read ahead.
    next_due: Option<Millis>,
    /// The fires due up to this time (the store's clock) have had their jobs read
    /// ahead (`Claimer::read_partition_ahead`).
    ahead_until: Millis,
}

impl Scheduler {
    pub fn new(store: Arc<dyn JobStore>, opts: SchedulerOptions, stats: SchedulerStats) -> Self {
        let parts = store.partitions().max(1);
        let start = rand::random::<u32>() % parts;
        let partitions = (0..parts)
            .map(|i| PartitionState {
                partition: (start + i) % parts,
                plans: HashMap::new(),
                seen: None,
                next_due: None,
                ahead_until: Millis::MIN,
            })
            .collect();
        Self {
            store,
            opts,
            stats,
            alerts: Arc::new(Alerts::unread()),
            job_cache: Arc::new(JobCache::default()),
            partitions,
        }
    }

    /// Raises alerts and records metrics through `alerts` (by default, a registry of
    /// its own that nobody reads).
    pub fn with_alerts(mut self, alerts: Arc<Alerts>) -> Self {
        self.alerts = alerts;
        self
    }

    /// Shares the job records it reads through `cache` (by default, a cache of its
    /// own).
    pub fn with_job_cache(mut self, cache: Arc<JobCache>) -> Self {
        self.job_cache = cache;
        self
    }

    /// Runs until `shutdown`; a store operation in progress always completes first.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut changes = self.store.job_changes();
        let mut backoff = Duration::from_millis(50);
        info!(backend = self.store.backend(), "scheduler started");
        while !shutdown.is_cancelled() {
            changes.borrow_and_update();
            let sleep = match self.claim_all_due().await {
                Ok(sleep) => {
                    backoff = Duration::from_millis(50);
                    sleep
                }
                Err(e) => {
                    warn!(error = %e, "scheduler pass failed; retrying");
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                    backoff
                }
            };
            if sleep.is_zero() {
                continue;
            }
            let wake = tokio::time::sleep(sleep);
            tokio::pin!(wake);
            let max_sleep = self.opts.max_sleep;
            let mut reading = sleep >= MIN_READ_AHEAD_SLEEP;
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = &mut wake => break,
                    r = changes.changed() => {
                        if r.is_err() {
                            // The store's watcher is gone; fall back to the max sleep.
                            tokio::time::sleep(max_sleep).await;
                        }
                        break;
                    }
                    // Dropped where it stands when the sleep ends: what it read is kept.
                    () = self.read_ahead(), if reading => reading = false,
                }
            }
        }
        info!("scheduler stopped");
    }

    /// Reads the jobs of the fires due within `read_ahead` that this instance has no
    /// plan for, partition by partition, `parallel_partitions` at a time, so their
    /// claims need no job read when they fall due (a job's first fire, or its first
    /// after a change, would read it then: at the busiest moment of a burst). A
    /// partition's window is read once as it advances (`ahead_until`), at most once a
    /// [`READ_AHEAD_STEP`]; a failed read is left for the fire's own.
    async fn read_ahead(&mut self) {
        if self.opts.read_ahead.is_zero() {
            return;
        }
        let parallel = self.opts.parallel_partitions.max(1);
        let (claimer, partitions) = self.claimer();
        let reads: Vec<_> = partitions
            .iter_mut()
            .map(|st| claimer.read_partition_ahead(st))
            .collect();
        futures::stream::iter(reads)
            .buffer_unordered(parallel)
            .for_each(|r| async move {
                if let Err(e) = r {
                    debug!(error = %e, "reading jobs ahead of their fires failed; they are read when due");
                }
            })
            .await;
    }

    /// One pass over every partition: claims everything due, `parallel_partitions`
    /// partitions at a time so the store's work and ours overlap. Returns how long to
    /// sleep before the next pass (zero when more is due right now).
    pub async fn claim_all_due(&mut self) -> Result<Duration, jobs::Error> {
        let (parallel, max_sleep) = (self.opts.parallel_partitions.max(1), self.opts.max_sleep);
        let (claimer, partitions) = self.claimer();
        // Collected first: a lazy `map` closure inside the stream would make the
        // spawned future's Send bound unprovable (higher-ranked lifetimes).
        let passes: Vec<_> = partitions
            .iter_mut()
            .map(|st| claimer.claim_partition(st))
            .collect();
        let results: Vec<Result<Duration, jobs::Error>> = futures::stream::iter(passes)
            .buffer_unordered(parallel)
            .collect()
            .await;
        let mut sleep = max_sleep;
        for r in results {
            sleep = sleep.min(r?);
        }
        Ok(sleep)
    }

    /// What a pass borrows of the loop, beside its partitions' states.
    fn claimer(&mut self) -> (Claimer<'_>, &mut [PartitionState]) {
        let claimer = Claimer {
            store: &self.store,
            job_cache: &self.job_cache,
            opts: &self.opts,
            stats: &self.stats,
            alerts: &self.alerts,
        };
        (claimer, &mut self.partitions)
    }
}

/// Borrowed context of one pass.
#[derive(Clone, Copy)]
struct Claimer<'a> {
    store: &'a Arc<dyn JobStore>,
    job_cache: &'a JobCache,
    opts: &'a SchedulerOptions,
    stats: &'a SchedulerStats,
    alerts: &'a Alerts,
}

/// A fire claimed later than the misfire threshold, and what its policy did.
struct Misfire {
    policy: MisfirePolicy,
    late_ms: Millis,
    /// Runs queued for it (0 when skipped).
    runs: usize,
}

impl Claimer<'_> {
    /// Claims due fires in one partition until none are due; returns the delay until
    /// the partition's next due fire (by the store's clock).
    async fn claim_partition(self, st: &mut PartitionState) -> Result<Duration, jobs::Error> {
        let p = st.partition;
        loop {
            let batch = self.store.due_fires(p, self.opts.batch_size).await?;
            st.seen = Some((batch.now, Instant::now()));
            st.next_due = batch.fires.first().map(|f| f.due).or(batch.next_due);
            if batch.fires.is_empty() {
                return Ok(delay_until(batch.next_due, batch.now, self.opts.max_sleep));
            }
            let full = batch.fires.len() >= self.opts.batch_size;
            self.refresh_plans(st, &batch.fires).await?;
            let mut claims = Vec::with_capacity(batch.fires.len());
            let mut misfired = Vec::with_capacity(batch.fires.len());
            let mut misfires = 0;
            for fire in &batch.fires {
                if let Some((claim, misfire)) = self.build_claim(st, fire, batch.now) {
                    misfires += u64::from(misfire.is_some());
                    claims.push(claim);
                    misfired.push(misfire);
                }
            }
            if claims.is_empty() {
                // Every due fire belonged to a job that changed between the two reads
                // (or whose record is gone): look again shortly rather than spin.
                return Ok(Duration::from_millis(50));
            }
            crash_point("scheduler.before_claim");
            let outcome = self.store.claim_fires(p, claims.clone()).await?;
            crash_point("scheduler.after_claim");
            let mut lateness = Vec::with_capacity(claims.len());
            let mut lost = 0;
            for ((claim, result), misfire) in claims.iter().zip(&outcome.results).zip(&misfired) {
                match result {
                    ClaimResult::Claimed => {
                        lateness.push(outcome.now - claim.expected_due);
                        self.alerts
                            .metrics()
                            .fire_claimed(outcome.now - claim.expected_due);
                        if let Some(m) = misfire {
                            self.misfire_claimed(claim, m);
                        }
                        debug!(job_id = %claim.job_id, due = claim.expected_due, "fire claimed");
                    }
                    ClaimResult::VersionChanged | ClaimResult::Gone => {
                        st.plans.remove(&claim.job_id);
                        lost += 1;
                    }
                    ClaimResult::Moved => lost += 1,
                }
            }
            self.stats.record(&lateness, lost, misfires);
            if lost * 2 > claims.len() as u64 {
                // Another instance is working this partition right now: leave it to
                // that one and come back on the next pass instead of racing batch
                // after batch for the same fires.
                return Ok(Duration::ZERO);
            }
            st.next_due = outcome.next_due;
            if !full {
                return Ok(delay_until(
                    outcome.next_due,
                    outcome.now,
                    self.opts.max_sleep,
                ));
            }
        }
    }

    /// Counts a misfire this instance's claim won and raises its alert: `misfire` when
    /// the fire was skipped, `late_fire` when it still ran.
    fn misfire_claimed(self, claim: &FireClaim, m: &Misfire) {
        self.alerts.metrics().misfire(m.policy, m.runs);
        let (kind, what) = if m.runs == 0 {
            (AlertKind::Misfire, "skipped".to_owned())
        } else {
            (AlertKind::LateFire, format!("{} run(s) queued", m.runs))
        };
        let first = claim.triggers.first();
        let schedule_id = first.map(Trigger::schedule_id).unwrap_or_default();
        self.alerts.raise(
            kind,
            &claim.job_id,
            &schedule_id,
            &format!(
                "fire claimed {} ms late (threshold {} ms), policy {:?}: {what}",
                m.late_ms,
                self.opts.misfire_threshold.as_millis(),
                m.policy
            ),
        );
    }

    /// Reads ahead the jobs of the partition's fires due within `read_ahead` of the
    /// store's now (as last seen, moved on by the time since), in the part of that
    /// window not read before, [`READ_AHEAD_CHUNK`] jobs a call.
    async fn read_partition_ahead(self, st: &mut PartitionState) -> Result<(), jobs::Error> {
        let Some((now, at)) = st.seen else {
            return Ok(());
        };
        let by = now
            .saturating_add(duration_ms(at.elapsed()))
            .saturating_add(duration_ms(self.opts.read_ahead));
        if by < st.ahead_until.saturating_add(duration_ms(READ_AHEAD_STEP))
            || st.next_due.is_none_or(|due| due > by)
        {
            // Read not long ago, or nothing is due in the window (a job created since
            // woke the loop, whose pass saw it).
            return Ok(());
        }
        let fires = self
            .store
            .upcoming_fires(st.partition, st.ahead_until, by, READ_AHEAD_LIMIT)
            .await?;
        for chunk in fires.chunks(READ_AHEAD_CHUNK) {
            self.refresh_plans(st, chunk).await?;
        }
        // A full read goes on from its last due time next time (again from the
        // fires due then, whose plans are read by now).
        st.ahead_until = match fires.last() {
            Some(last) if fires.len() >= READ_AHEAD_LIMIT => last.due - 1,
            _ => by,
        };
        Ok(())
    }

    /// Makes sure a plan for the due version of every fire is cached.
    async fn refresh_plans(
        self,
        st: &mut PartitionState,
        fires: &[DueFire],
    ) -> Result<(), jobs::Error> {
        let missing: Vec<String> = fires
            .iter()
            .filter(|f| st.plans.get(&f.job_id).map(|(v, _)| *v) != Some(f.version))
            .map(|f| f.job_id.clone())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        // Jobs often share a cron line: parse each distinct (cron, zone) once per batch.
        let mut parsed: HashMap<(String, String), Option<Plan>> = HashMap::new();
        let found = self.store.get_jobs(&missing).await?;
        for job in self.job_cache.keep(found) {
            let key = (job.spec.cron.clone(), job.spec.time_zone.clone());
            let plan = match parsed.get(&key) {
                Some(Some(shared)) => Some(Plan {
                    spec: Arc::new(job.spec.clone()),
                    cron: shared.cron.clone(),
                }),
                Some(None) => None,
                None => {
                    let plan = plan_of(&job);
                    parsed.insert(key, plan.clone());
                    plan
                }
            };
            st.plans.insert(job.spec.id.clone(), (job.version, plan));
        }
        Ok(())
    }

    /// The claim for one due fire, or None when the cached plan is for another version
    /// (the job changed between the two reads: the next pass sees the new one).
    fn build_claim(
        self,
        st: &PartitionState,
        fire: &DueFire,
        now: Millis,
    ) -> Option<(FireClaim, Option<Misfire>)> {
        let (version, plan) = st.plans.get(&fire.job_id)?;
        if *version != fire.version {
            return None;
        }
        let span = info_span!("claim", job_id = %fire.job_id, schedule_no = fire.planned);
        let _enter = span.enter();
        let Some(plan) = plan else {
            // The stored cron no longer parses or never fires again: end the chain
            // with this fire, which still runs.
            return Some((
                FireClaim {
                    job_id: fire.job_id.clone(),
                    expected_due: fire.due,
                    expected_planned: fire.planned,
                    expected_version: fire.version,
                    next: None,
                    triggers: vec![trigger(fire, TriggerKind::Cron, None)],
                },
                None,
            ));
        };
        let late = now - fire.due;
        let threshold = i64::try_from(self.opts.misfire_threshold.as_millis()).unwrap_or(i64::MAX);
        if late <= threshold {
            return Some((
                FireClaim {
                    job_id: fire.job_id.clone(),
                    expected_due: fire.due,
                    expected_planned: fire.planned,
                    expected_version: fire.version,
                    next: plan.next_arm(fire.planned),
                    triggers: vec![trigger(fire, TriggerKind::Cron, None)],
                },
                None,
            ));
        }
        let policy = plan.spec.misfire_policy;
        let triggers = match policy {
            MisfirePolicy::FireOnce => vec![trigger(fire, TriggerKind::Misfire, None)],
            MisfirePolicy::Skip => vec![trigger(
                fire,
                TriggerKind::Misfire,
                Some("misfire".to_owned()),
            )],
            MisfirePolicy::CatchUp => {
                let limit = match plan.spec.misfire_catch_up_limit {
                    0 => self.opts.default_catch_up_limit,
                    n => n,
                } as usize;
                let mut planned = vec![fire.planned];
                while planned.len() < limit {
                    match plan.next_planned(planned[planned.len() - 1]) {
                        Some(t) if t <= now => planned.push(t),
                        _ => break,
                    }
                }
                planned
                    .into_iter()
                    .map(|t| {
                        let mut tr = trigger(fire, TriggerKind::Misfire, None);
                        tr.schedule_no = t.to_string();
                        tr.scheduled_at = t;
                        tr
                    })
                    .collect()
            }
        };
        let runs = triggers.iter().filter(|t| t.skip_reason.is_none()).count();
        // The alert is raised once the claim is won (`misfire_claimed`).
        debug!(
            job_id = %fire.job_id,
            late_ms = late,
            ?policy,
            runs,
            "misfire: fire claimed late"
        );
        Some((
            FireClaim {
                job_id: fire.job_id.clone(),
                expected_due: fire.due,
                expected_planned: fire.planned,
                expected_version: fire.version,
                // After a misfire the chain continues from now: what was missed is
                // either in `triggers` or deliberately skipped.
                next: plan.next_arm(now.max(fire.planned)),
                triggers,
            },
            Some(Misfire {
                policy,
                late_ms: late,
                runs,
            }),
        ))
    }
}

fn plan_of(job: &JobRecord) -> Option<Plan> {
    match Plan::new(job.spec.clone()) {
        Ok(plan) => Some(plan),
        Err(jobs::Error::Invalid { .. }) => {
            // A stored year-bounded cron whose last year has passed parses as "never
            // fires"; anything else means the stored spec predates a stricter parser.
            let never = matches!(
                crate::schedule::cron::CronSchedule::parse(&job.spec.cron, &job.spec.time_zone),
                Err(CronError::NeverFires)
            );
            if !never {
                warn!(job_id = %job.spec.id, cron = %job.spec.cron, "stored cron no longer parses; the job ends");
            }
            None
        }
        Err(jobs::Error::Store(_)) => None,
    }
}

fn trigger(fire: &DueFire, kind: TriggerKind, skip_reason: Option<String>) -> Trigger {
    Trigger {
        job_id: fire.job_id.clone(),
        schedule_no: fire.planned.to_string(),
        kind,
        scheduled_at: fire.planned,
        triggered_at: 0,
        job_version: fire.version,
        skip_reason,
        payload_override: None,
        route_key_override: None,
    }
}

/// The loop reads ahead only while it sleeps at least this long.
const MIN_READ_AHEAD_SLEEP: Duration = Duration::from_millis(50);
/// A partition's window is read again once it has moved on this far.
const READ_AHEAD_STEP: Duration = Duration::from_secs(1);
/// Fires read ahead per partition and pass.
const READ_AHEAD_LIMIT: usize = 10_000;
/// Jobs read per store call when reading ahead.
const READ_AHEAD_CHUNK: usize = 1_000;

fn duration_ms(d: Duration) -> Millis {
    Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX)
}

fn delay_until(next_due: Option<Millis>, now: Millis, max: Duration) -> Duration {
    match next_due {
        Some(due) if due <= now => Duration::ZERO,
        Some(due) => Duration::from_millis((due - now) as u64).min(max),
        None => max,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays() {
        let max = Duration::from_secs(1);
        assert_eq!(delay_until(None, 100, max), max);
        assert_eq!(delay_until(Some(50), 100, max), Duration::ZERO);
        assert_eq!(delay_until(Some(100), 100, max), Duration::ZERO);
        assert_eq!(delay_until(Some(350), 100, max), Duration::from_millis(250));
        assert_eq!(delay_until(Some(10_000), 100, max), max);
    }

    /// The claim logic against a real (embedded) store, with due times placed in the
    /// past on purpose: lateness is set up, not waited for.
    mod claims {
        use std::sync::Arc;

        use super::super::*;
        use crate::metrics::Metrics;
        use crate::model::{Arm, JobRecord, MisfirePolicy};
        use crate::schedule::jobs::jitter_offset;
        use crate::store::conformance::{drain_triggers, job};
        use crate::store::embedded::EmbeddedStore;
        use crate::store::{Store, StoreOptions};

        struct Fixture {
            store: Arc<dyn Store>,
            now: Millis,
            _dir: tempfile::TempDir,
        }

        async fn fixture() -> Fixture {
            let dir = tempfile::tempdir().expect("tempdir");
            let store: Arc<dyn Store> = Arc::new(
                EmbeddedStore::open(
                    &dir.path().join("s.redb"),
                    StoreOptions {
                        partitions: 2,
                        ..StoreOptions::default()
                    },
                )
                .expect("open"),
            );
            let now = store.now().await.expect("now");
            Fixture {
                store,
                now: now / 1000 * 1000,
                _dir: dir,
            }
        }

        /// An every-second job armed at `planned` (due = planned + its jitter).
        fn every_second(id: &str, planned: Millis, f: impl FnOnce(&mut JobRecord)) -> JobRecord {
            let mut j = job(id, None);
            j.spec.cron = "* * * * * *".into();
            f(&mut j);
            j.next_fire = Some(Arm {
                planned,
                due: planned + jitter_offset(id, j.spec.jitter_ms),
            });
            j
        }

        /// Passes until nothing is due right now, as the loop does between sleeps.
        async fn pass(store: &Arc<dyn Store>) -> (SchedulerStats, Arc<Metrics>) {
            let stats = SchedulerStats::default();
            let alerts = Arc::new(Alerts::unread());
            let metrics = alerts.metrics().clone();
            let mut s = Scheduler::new(store.clone(), SchedulerOptions::default(), stats.clone())
                .with_alerts(alerts);
            for _ in 0..100 {
                if !s.claim_all_due().await.expect("pass").is_zero() {
                    return (stats, metrics);
                }
            }
            panic!("still due after 100 passes");
        }

        #[tokio::test]
        async fn misfire_policies() {
            let fx = fixture().await;
            let late = fx.now - 60_000;
            for (id, policy, limit) in [
                ("once", MisfirePolicy::FireOnce, 0),
                ("skip", MisfirePolicy::Skip, 0),
                ("catch-default", MisfirePolicy::CatchUp, 0),
                ("catch-3", MisfirePolicy::CatchUp, 3),
            ] {
                let j = every_second(id, late, |j| {
                    j.spec.misfire_policy = policy;
                    j.spec.misfire_catch_up_limit = limit;
                });
                fx.store.create_job(j).await.expect("create");
            }
            let (stats, metrics) = pass(&fx.store).await;
            assert_eq!(stats.snapshot().misfires, 4);
            let text = metrics.render();
            for line in [
                r#"sundial_misfires_total{policy="FIRE_ONCE"} 1"#,
                r#"sundial_misfires_total{policy="SKIP"} 1"#,
                r#"sundial_misfires_total{policy="CATCH_UP"} 2"#,
                // 1 (fire once) + 10 + 3 (catch up); the skipped one did not run.
                "sundial_late_fires_total 14",
                r#"sundial_alerts_total{kind="misfire"} 1"#,
                r#"sundial_alerts_total{kind="late_fire"} 3"#,
            ] {
                assert!(text.lines().any(|l| l == line), "{line} in {text}");
            }
            let triggers = drain_triggers(&fx.store, "t").await;
            // Regular fires after "now" may follow if the pass crosses a second
            // boundary; the misfire handling is what is under test.
            assert!(
                triggers
                    .iter()
                    .all(|d| d.trigger.kind == TriggerKind::Misfire
                        || d.trigger.scheduled_at >= fx.now),
                "only misfires come from the missed minute"
            );
            let of = |id: &str| -> Vec<Trigger> {
                triggers
                    .iter()
                    .map(|d| d.trigger.clone())
                    .filter(|t| t.job_id == id && t.kind == TriggerKind::Misfire)
                    .collect()
            };
            let once = of("once");
            assert_eq!(once.len(), 1);
            assert_eq!(once[0].scheduled_at, late);
            assert_eq!(once[0].skip_reason, None);
            let skip = of("skip");
            assert_eq!(skip.len(), 1);
            assert_eq!(skip[0].skip_reason.as_deref(), Some("misfire"));
            let planned = |ts: &[Trigger]| ts.iter().map(|t| t.scheduled_at).collect::<Vec<_>>();
            assert_eq!(
                planned(&of("catch-default")),
                (0..10).map(|i| late + i * 1000).collect::<Vec<_>>(),
                "catch-up defaults to 10, oldest first, one after another"
            );
            assert_eq!(
                planned(&of("catch-3")),
                vec![late, late + 1000, late + 2000]
            );
            // Every chain continues from now, not from the missed fires.
            for id in ["once", "skip", "catch-default", "catch-3"] {
                let j = fx.store.get_job(id).await.expect("get").expect("job");
                let next = j.next_fire.expect("armed").planned;
                assert!(
                    next > fx.now - 1000 && next <= fx.now + 2000,
                    "{id}: next {next}"
                );
            }
        }

        #[tokio::test]
        async fn on_time_fires_chain_one_after_another_and_end_time_stops_the_chain() {
            let fx = fixture().await;
            // Three seconds behind but under the misfire threshold: caught up as
            // ordinary fires, each planned second once.
            let start = fx.now - 3000;
            fx.store
                .create_job(every_second("steady", start, |_| {}))
                .await
                .expect("create");
            fx.store
                .create_job(every_second("ending", start, |j| {
                    j.spec.end_time = Some(start + 1000)
                }))
                .await
                .expect("create");
            pass(&fx.store).await;
            let triggers = drain_triggers(&fx.store, "t").await;
            let steady: Vec<Millis> = triggers
                .iter()
                .filter(|d| d.trigger.job_id == "steady")
                .map(|d| d.trigger.scheduled_at)
                .collect();
            assert!(steady.len() >= 4, "{steady:?}");
            assert!(steady.windows(2).all(|w| w[1] == w[0] + 1000), "{steady:?}");
            assert!(triggers.iter().all(|d| d.trigger.kind == TriggerKind::Cron));
            let ending: Vec<Millis> = triggers
                .iter()
                .filter(|d| d.trigger.job_id == "ending")
                .map(|d| d.trigger.scheduled_at)
                .collect();
            assert_eq!(ending, vec![start, start + 1000]);
            let j = fx.store.get_job("ending").await.expect("get").expect("job");
            assert_eq!(j.next_fire, None, "no fire after the end time");
        }

        #[tokio::test]
        async fn jitter_delays_the_due_time_but_not_the_schedule_no() {
            let fx = fixture().await;
            let planned = fx.now - 2000;
            let j = every_second("jittery", planned, |j| {
                j.spec.cron = "0 0 * * * *".into(); // hourly: one fire in this pass
                j.spec.jitter_ms = 1000;
            });
            let offset = jitter_offset("jittery", 1000);
            assert_eq!(j.next_fire.map(|a| a.due), Some(planned + offset));
            fx.store.create_job(j).await.expect("create");
            pass(&fx.store).await;
            let t = drain_triggers(&fx.store, "t").await;
            assert_eq!(t.len(), 1);
            assert_eq!(t[0].trigger.schedule_no, planned.to_string());
            let next = fx
                .store
                .get_job("jittery")
                .await
                .expect("get")
                .expect("job")
                .next_fire
                .expect("armed");
            assert_eq!(
                next.due - next.planned,
                offset,
                "the same offset every fire"
            );
            assert_eq!(next.planned % 3_600_000, 0);
        }

        #[tokio::test]
        async fn a_changed_job_is_not_claimed_from_its_old_version() {
            let fx = fixture().await;
            let planned = fx.now - 1000;
            let created = fx
                .store
                .create_job(every_second("changing", planned, |_| {}))
                .await
                .expect("create");
            // Paused between the read and the claim: the claim must not re-arm it.
            let mut s = Scheduler::new(
                fx.store.clone(),
                SchedulerOptions::default(),
                SchedulerStats::default(),
            );
            let mut paused = created.clone();
            paused.paused = true;
            paused.next_fire = None;
            fx.store.update_job(paused, 1).await.expect("pause");
            s.claim_all_due().await.expect("pass");
            assert!(drain_triggers(&fx.store, "t").await.is_empty());
            let j = fx
                .store
                .get_job("changing")
                .await
                .expect("get")
                .expect("job");
            assert_eq!(j.next_fire, None);
        }

        #[tokio::test]
        async fn the_jobs_of_fires_due_soon_are_read_ahead_and_not_claimed() {
            let fx = fixture().await;
            let soon = fx.now + 4000;
            let later = fx.now + 60_000;
            fx.store
                .create_job(every_second("soon", soon, |_| {}))
                .await
                .expect("create");
            fx.store
                .create_job(every_second("later", later, |_| {}))
                .await
                .expect("create");
            let cache = Arc::new(JobCache::default());
            let opts = SchedulerOptions {
                read_ahead: Duration::from_secs(10),
                ..SchedulerOptions::default()
            };
            let mut s = Scheduler::new(fx.store.clone(), opts, SchedulerStats::default())
                .with_job_cache(cache.clone());
            s.read_ahead().await;
            assert!(
                cache.get("soon", 1).is_none(),
                "nothing is read before a pass has seen the store's clock"
            );
            let sleep = s.claim_all_due().await.expect("pass");
            assert!(!sleep.is_zero(), "nothing is due yet");
            s.read_ahead().await;
            assert!(
                cache.get("soon", 1).is_some(),
                "due within the window: read"
            );
            assert!(
                cache.get("later", 1).is_none(),
                "due past the window: not read"
            );
            let st = s
                .partitions
                .iter()
                .find(|st| st.plans.contains_key("soon"))
                .expect("planned in its partition");
            assert!(st.ahead_until >= soon);
            assert!(
                drain_triggers(&fx.store, "t").await.is_empty(),
                "nothing claimed"
            );
            let job = fx.store.get_job("soon").await.expect("get").expect("job");
            assert_eq!(job.next_fire.map(|a| a.planned), Some(soon));
        }
    }
}
