//! The instance's Prometheus metrics: one [`Metrics`] per instance (created in
//! `server::run`, shared by `Arc` with the components that record), its registry, and
//! the text rendering served at `GET /metrics` on `--http-listen` (open, like
//! `/healthz`: scrapers need no admin credentials).
//!
//! What is counted where, so that each event is counted once across the cluster:
//!
//! - `sundial_trigger_lateness_seconds` (histogram, 1 ms … 60 s): store time at the
//!   claim − the fire's due time (planned + the job's jitter offset), for every cron
//!   fire this instance's claim won (`scheduler`).
//! - `sundial_misfires_total{policy}`, `sundial_late_fires_total`: a claimed fire
//!   later than the misfire threshold, by the job's policy; a late fire is one that
//!   still ran (FIRE_ONCE, CATCH_UP: one per run queued) (`scheduler`).
//! - `sundial_runs_finished_total{state}`, `sundial_runs_retried_total`,
//!   `sundial_runs_lost_total`: by [`Metrics::record_transition`], from the transitions
//!   the store applied (`Applied::Yes`) on this instance, which are atomic and applied
//!   once: results (`executors`, `http_target`), deadlines (`sweeper`), failures
//!   before dispatch and cancels (`dispatch::Router::follow_up`), and the SKIPPED
//!   and replaced runs of `begin_run` (`dispatch`).
//! - `sundial_executors_connected`, `sundial_executor_nodes{health}` (gauges): read at
//!   scrape time from this instance's attached streams and from the registry (every
//!   instance reports the same node figures; take one instance's, or `max`).
//! - `sundial_worker_threads` (gauge): the threads of the runtime serving this
//!   instance (`worker_threads`), read at scrape time.
//! - `sundial_store_commits_total`: the embedded store's write transactions committed
//!   (each one journal sync, shared by the decisions of its batch), read at scrape
//!   time; 0 on Redis, which commits nothing itself. Beside it, read the same way:
//!   `sundial_store_commit_steps_total` (the writes those commits applied),
//!   `sundial_store_applying_seconds_total` and `sundial_store_committing_seconds_total`
//!   (the writer's time applying them, and committing: the journal's append and sync,
//!   then the transaction's commit), `sundial_store_checkpoints_total` and
//!   `sundial_store_checkpointing_seconds_total` (the store file synced and the journal
//!   emptied, and the time that took the writer).
//! - `sundial_alerts_total{kind}`: every alert raised; the alerts module counts them
//!   through [`Metrics::alert_raised`] (this module knows no alert kinds).
//! - `sundial_forwarded_messages_total{outcome}`: messages (dispatches, cancels, drains)
//!   for executors attached to another instance, `pushed` to its inbox or `dropped`
//!   (its queue full, or the push failed; a dispatch dropped is re-routed once its
//!   confirmation is overdue), through [`Metrics::forwarded`].
//! - `sundial_webhook_attempts_total{outcome}`, `sundial_webhook_claims_total{by}`,
//!   `sundial_webhook_circuit_open{destination}`:
//!   reserved for the webhook delivery worker, which records them through
//!   [`Metrics::webhook_attempt`], [`Metrics::webhook_claimed`] and
//!   [`Metrics::set_circuit`].
//!
//! Known gaps: a broadcast run's shards are runs here (each counted when it becomes
//! final), but the parent, made final in the same step as its last shard, is not
//! counted on its own; runs cancelled by the replace policy or with a cancelled
//! broadcast are counted only when they held a lease (those are the ones the store
//! names).

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::model::{MisfirePolicy, RunRecord, RunState, duration_us};
use crate::store::{Applied, Begun, CommitStats, Transition};

/// The `Content-Type` of what [`Metrics::render`] writes: the Prometheus text format.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Lateness buckets in seconds: 1 ms to 60 s.
const LATENESS_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// One label, `name="value"`.
type Label = [(&'static str, String); 1];

/// Every metric of the instance. Recording is lock-free (atomics); the registry is
/// only read to render.
pub struct Metrics {
    registry: Registry,
    trigger_lateness: Histogram,
    runs_finished: Family<Label, Counter>,
    runs_retried: Counter,
    runs_lost: Counter,
    starts_refused: Counter,
    taken_back: Counter,
    foreign_reports: Counter,
    misfires: Family<Label, Counter>,
    late_fires: Counter,
    executors_connected: Gauge,
    worker_threads: Gauge,
    store_commits: Scraped<Counter>,
    store_commit_steps: Scraped<Counter>,
    store_applying: Scraped<Counter<f64, AtomicU64>>,
    store_committing: Scraped<Counter<f64, AtomicU64>>,
    store_checkpoints: Scraped<Counter>,
    store_checkpointing: Scraped<Counter<f64, AtomicU64>>,
    executor_nodes: Family<Label, Gauge>,
    alerts: Family<Label, Counter>,
    forwarded: Family<Label, Counter>,
    webhook_attempts: Family<Label, Counter>,
    webhook_claims: Family<Label, Counter>,
    webhook_circuit_open: Family<Label, Gauge>,
}

/// A counter whose total is kept elsewhere (the store) and read at scrape time: it is
/// brought up to each total read, never counted twice by two scrapes at once.
struct Scraped<C> {
    counter: C,
    /// The total (in the source's units) the counter has been brought up to.
    seen: AtomicU64,
}

impl<C> Scraped<C>
where
    C: ScrapedCounter + prometheus_client::encoding::EncodeMetric + Clone + 'static,
    C: std::fmt::Debug + Send + Sync,
{
    fn register(registry: &mut Registry, name: &str, help: &str) -> Self {
        let counter = C::default();
        registry.register(name, help, counter.clone());
        Self {
            counter,
            seen: AtomicU64::new(0),
        }
    }

    /// Brings the counter up to `total` (in the source's units).
    fn bring_to(&self, total: u64) {
        let seen = self.seen.fetch_max(total, Ordering::Relaxed);
        if total > seen {
            self.counter.add(total - seen);
        }
    }
}

/// A counter `Scraped` can bring up to a total: whole counts, or seconds from a total
/// in µs.
trait ScrapedCounter: Default {
    fn add(&self, units: u64);
}

impl ScrapedCounter for Counter {
    fn add(&self, units: u64) {
        self.inc_by(units);
    }
}

impl ScrapedCounter for Counter<f64, AtomicU64> {
    fn add(&self, micros: u64) {
        // Exact below 2^53 µs (285 years of writer time).
        #[allow(clippy::cast_precision_loss)]
        self.inc_by(micros as f64 / 1e6);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let trigger_lateness = Histogram::new(LATENESS_BUCKETS);
        registry.register(
            "sundial_trigger_lateness_seconds",
            "Claim time (store clock) minus the due time of claimed cron fires",
            trigger_lateness.clone(),
        );
        // Counters are registered without `_total`: the encoder appends it.
        let runs_finished = Family::default();
        registry.register(
            "sundial_runs_finished",
            "Runs made final by this instance, by final state",
            runs_finished.clone(),
        );
        let runs_retried = Counter::default();
        registry.register(
            "sundial_runs_retried",
            "Attempts that failed, timed out or lost their lease and were retried",
            runs_retried.clone(),
        );
        let runs_lost = Counter::default();
        registry.register(
            "sundial_runs_lost",
            "Runs whose executor stopped renewing the lease (retried or failed 'lost')",
            runs_lost.clone(),
        );
        let starts_refused = Counter::default();
        registry.register(
            "sundial_starts_refused",
            "Started reports for dispatches whose lease was already gone: not started",
            starts_refused.clone(),
        );
        let taken_back = Counter::default();
        registry.register(
            "sundial_dispatches_taken_back",
            "Dispatches a silent executor left unanswered, taken back and routed again (same attempt)",
            taken_back.clone(),
        );
        let foreign_reports = Counter::default();
        registry.register(
            "sundial_foreign_reports",
            "Executor reports refused because the stream's node does not hold the run's lease (or the run is unknown)",
            foreign_reports.clone(),
        );
        let misfires = Family::default();
        registry.register(
            "sundial_misfires",
            "Fires claimed later than the misfire threshold, by the job's misfire policy",
            misfires.clone(),
        );
        let late_fires = Counter::default();
        registry.register(
            "sundial_late_fires",
            "Runs queued for fires later than the misfire threshold (FIRE_ONCE, CATCH_UP)",
            late_fires.clone(),
        );
        let store_commits = Scraped::register(
            &mut registry,
            "sundial_store_commits",
            "Write transactions the embedded store committed (one journal sync each, shared by the writes of its batch)",
        );
        let store_commit_steps = Scraped::register(
            &mut registry,
            "sundial_store_commit_steps",
            "Writes the embedded store's commits applied (many per commit under load)",
        );
        let store_applying = Scraped::register(
            &mut registry,
            "sundial_store_applying_seconds",
            "Time the embedded store's writer spent applying writes",
        );
        let store_committing = Scraped::register(
            &mut registry,
            "sundial_store_committing_seconds",
            "Time the embedded store's writer spent committing (the journal's append and sync, the transaction's commit)",
        );
        let store_checkpoints = Scraped::register(
            &mut registry,
            "sundial_store_checkpoints",
            "Checkpoints of the embedded store: its file synced, its journal emptied",
        );
        let store_checkpointing = Scraped::register(
            &mut registry,
            "sundial_store_checkpointing_seconds",
            "Time the embedded store's writer spent on checkpoints (also counted in committing when a batch's commit made one)",
        );
        let executors_connected = Gauge::default();
        registry.register(
            "sundial_executors_connected",
            "Executor streams attached to this instance",
            executors_connected.clone(),
        );
        let worker_threads = Gauge::default();
        registry.register(
            "sundial_worker_threads",
            "Threads of the runtime serving this instance (worker_threads)",
            worker_threads.clone(),
        );
        let executor_nodes = Family::default();
        registry.register(
            "sundial_executor_nodes",
            "Executor nodes in the registry (all instances), by health",
            executor_nodes.clone(),
        );
        let alerts = Family::default();
        registry.register(
            "sundial_alerts",
            "Alerts raised by this instance, by kind",
            alerts.clone(),
        );
        let webhook_attempts = Family::default();
        registry.register(
            "sundial_webhook_attempts",
            "Webhook delivery attempts, by outcome",
            webhook_attempts.clone(),
        );
        let forwarded = Family::default();
        registry.register(
            "sundial_forwarded_messages",
            "Messages for executors attached to another instance, by outcome: `pushed` to \
             its inbox, or `dropped` (its queue here full, or the push failed)",
            forwarded.clone(),
        );
        let webhook_claims = Family::default();
        registry.register(
            "sundial_webhook_claims",
            "Webhook deliveries this instance's worker took on, by how they were claimed: \
             `result` (in the step that applied the run's result, on this instance's \
             executor stream) or `sweep` (found due in the outbox)",
            webhook_claims.clone(),
        );
        let webhook_circuit_open = Family::default();
        registry.register(
            "sundial_webhook_circuit_open",
            "1 while the circuit breaker of a webhook destination is open",
            webhook_circuit_open.clone(),
        );
        // Every known label value starts at 0, so each series exists from the first
        // scrape (a family with no series is left out of the exposition, and `rate()`
        // cannot see the first increment of a series that appears with it).
        for state in [
            RunState::Succeeded,
            RunState::Failed,
            RunState::TimedOut,
            RunState::Cancelled,
            RunState::Skipped,
        ] {
            let _ = runs_finished.get_or_create(&label("state", &state.to_string()));
        }
        for by in ["result", "sweep"] {
            let _ = webhook_claims.get_or_create(&label("by", by));
        }
        for outcome in ["pushed", "dropped"] {
            let _ = forwarded.get_or_create(&label("outcome", outcome));
        }
        for policy in [
            MisfirePolicy::FireOnce,
            MisfirePolicy::Skip,
            MisfirePolicy::CatchUp,
        ] {
            let _ = misfires.get_or_create(&label("policy", policy_name(policy)));
        }
        Self {
            registry,
            trigger_lateness,
            runs_finished,
            runs_retried,
            runs_lost,
            starts_refused,
            taken_back,
            foreign_reports,
            misfires,
            late_fires,
            executors_connected,
            worker_threads,
            store_commits,
            store_commit_steps,
            store_applying,
            store_committing,
            store_checkpoints,
            store_checkpointing,
            executor_nodes,
            alerts,
            webhook_attempts,
            forwarded,
            webhook_claims,
            webhook_circuit_open,
        }
    }

    /// The registry in the Prometheus text format ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_text::encode(&mut out, &self.registry);
        out
    }

    /// A cron fire claimed `late_ms` after its due time (store clock).
    pub fn fire_claimed(&self, late_ms: i64) {
        self.trigger_lateness
            .observe(late_ms.max(0) as f64 / 1000.0);
    }

    /// A claimed misfire; `runs` is how many runs it queued (0 when skipped).
    pub fn misfire(&self, policy: MisfirePolicy, runs: usize) {
        self.misfires
            .get_or_create(&label("policy", policy_name(policy)))
            .inc();
        self.late_fires.inc_by(runs as u64);
    }

    /// Counts what an applied transition did to its run (finished by state, retried,
    /// lost). Does nothing unless the store applied it (`Applied::Yes`). The run
    /// alerts of the same transition are raised by the alerts module, which calls this.
    pub fn record_transition(&self, t: &Transition) {
        if t.applied != Applied::Yes {
            return;
        }
        if let Some(run) = &t.run {
            self.record_run(run);
        }
    }

    /// A silent executor's unanswered dispatch was taken back.
    pub fn taken_back(&self) {
        self.taken_back.inc();
    }

    /// A `Started` was answered "do not start": its lease was gone.
    pub fn start_refused(&self) {
        self.starts_refused.inc();
    }

    /// An executor stream reported about a run its node does not hold (or an unknown
    /// one): refused.
    pub fn foreign_report(&self) {
        self.foreign_reports.inc();
    }

    /// Counts a run begun SKIPPED and the runs the replace policy cancelled with it
    /// (the ones that held a lease).
    pub fn record_begun(&self, b: &Begun) {
        if b.created && b.run.state == RunState::Skipped {
            self.finished(RunState::Skipped);
        }
        let replaced = b
            .revoked
            .iter()
            .filter(|rv| rv.reason == "replaced")
            .count();
        if replaced > 0 {
            self.runs_finished
                .get_or_create(&label("state", &RunState::Cancelled.to_string()))
                .inc_by(replaced as u64);
        }
    }

    fn record_run(&self, run: &RunRecord) {
        if run.state == RunState::Waiting && run.reason.starts_with("retry: ") {
            self.runs_retried.inc();
        }
        if run.state.is_final() {
            self.finished(run.state);
        }
        if run.lost_its_lease() {
            self.runs_lost.inc();
        }
    }

    fn finished(&self, state: RunState) {
        self.runs_finished
            .get_or_create(&label("state", &state.to_string()))
            .inc();
    }

    /// Makes the series of alert `kind` exist at 0 from the first scrape.
    pub fn declare_alert(&self, kind: &str) {
        let _ = self.alerts.get_or_create(&label("kind", kind));
    }

    /// Counts one alert of `kind`.
    pub fn alert_raised(&self, kind: &str) {
        self.alerts.get_or_create(&label("kind", kind)).inc();
    }

    /// One claimed webhook delivery ended with `outcome`: `delivered`, `retry`,
    /// `failed`, `gone`, `abandoned`, or not attempted: `circuit_open` (its breaker is
    /// open), `busy` (its destination or the instance had its bound in flight). Recorded by
    /// the webhook worker.
    pub fn webhook_attempt(&self, outcome: &str) {
        self.webhook_attempts
            .get_or_create(&label("outcome", outcome))
            .inc();
    }

    /// `n` messages for another instance's executors went `outcome` (`pushed` |
    /// `dropped`). Recorded by `dispatch::links`.
    pub fn forwarded(&self, outcome: &str, n: usize) {
        self.forwarded
            .get_or_create(&label("outcome", outcome))
            .inc_by(n as u64);
    }

    /// The webhook worker took on `n` claimed deliveries, claimed `by` `result` (in the
    /// step that applied their results) or `sweep`.
    pub fn webhook_claimed(&self, by: &str, n: usize) {
        self.webhook_claims
            .get_or_create(&label("by", by))
            .inc_by(n as u64);
    }

    /// The circuit breaker of `destination` (a host, never a full URL with secrets)
    /// opened or closed. Recorded by the webhook worker.
    pub fn set_circuit(&self, destination: &str, open: bool) {
        self.webhook_circuit_open
            .get_or_create(&label("destination", destination))
            .set(i64::from(open));
    }

    /// The executor streams attached to this instance (a scrape-time gauge).
    pub fn set_executors_connected(&self, connected: usize) {
        self.executors_connected
            .set(i64::try_from(connected).unwrap_or(i64::MAX));
    }

    /// The threads of the runtime serving this instance (a scrape-time gauge).
    pub fn set_worker_threads(&self, threads: usize) {
        self.worker_threads
            .set(i64::try_from(threads).unwrap_or(i64::MAX));
    }

    /// What the store has committed so far (counters read at scrape time).
    pub fn set_commit_stats(&self, stats: &CommitStats) {
        self.store_commits.bring_to(stats.commits);
        self.store_commit_steps.bring_to(stats.steps);
        self.store_applying.bring_to(duration_us(stats.applying));
        self.store_committing
            .bring_to(duration_us(stats.committing));
        self.store_checkpoints.bring_to(stats.checkpoints);
        self.store_checkpointing
            .bring_to(duration_us(stats.checkpointing));
    }

    /// The registry's nodes by health name (a scrape-time gauge): every name listed
    /// is set, so a health no node has any more reads 0.
    pub fn set_executor_nodes(&self, by_health: &[(&str, usize)]) {
        for (health, n) in by_health {
            self.executor_nodes
                .get_or_create(&label("health", health))
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }
}

fn label(name: &'static str, value: &str) -> Label {
    [(name, value.to_owned())]
}

fn policy_name(policy: MisfirePolicy) -> &'static str {
    match policy {
        MisfirePolicy::FireOnce => "FIRE_ONCE",
        MisfirePolicy::Skip => "SKIP",
        MisfirePolicy::CatchUp => "CATCH_UP",
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::{RunState, TriggerKind};
    use crate::store::Revocation;
    use std::time::Duration;

    pub(crate) fn run(state: RunState, reason: &str) -> RunRecord {
        let trigger = crate::model::Trigger {
            job_id: "nightly".into(),
            schedule_no: "1000".into(),
            kind: TriggerKind::Cron,
            scheduled_at: 1000,
            triggered_at: 1000,
            job_version: 1,
            skip_reason: None,
            payload_override: None,
            route_key_override: None,
        };
        let mut r = RunRecord::from_trigger(&trigger);
        r.state = state;
        r.reason = reason.into();
        r
    }

    pub(crate) fn applied(run: RunRecord) -> Transition {
        Transition {
            applied: Applied::Yes,
            run: Some(run),
            revoked: Vec::new(),
            next_serial: None,
            webhook: None,
        }
    }

    /// The sample line of `name` with exactly `labels` (`{…}` or empty), if any.
    pub(crate) fn sample(text: &str, name_and_labels: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    }

    #[test]
    fn the_store_commit_totals_follow_the_store_and_never_count_twice() {
        let m = Metrics::new();
        let mut stats = CommitStats {
            commits: 4,
            steps: 90,
            applying: Duration::from_micros(2_500),
            committing: Duration::from_micros(1_500_000),
            checkpoints: 2,
            checkpointing: Duration::from_micros(250_000),
        };
        m.set_commit_stats(&stats);
        // A second scrape of the same totals (or an older reading) adds nothing.
        m.set_commit_stats(&stats);
        m.set_commit_stats(&CommitStats::default());
        let text = m.render();
        assert_eq!(sample(&text, "sundial_store_commits_total"), Some(4.0));
        assert_eq!(
            sample(&text, "sundial_store_commit_steps_total"),
            Some(90.0)
        );
        assert_eq!(
            sample(&text, "sundial_store_applying_seconds_total"),
            Some(0.0025)
        );
        assert_eq!(
            sample(&text, "sundial_store_committing_seconds_total"),
            Some(1.5)
        );
        assert_eq!(sample(&text, "sundial_store_checkpoints_total"), Some(2.0));
        assert_eq!(
            sample(&text, "sundial_store_checkpointing_seconds_total"),
            Some(0.25)
        );
        stats.commits = 6;
        stats.checkpoints = 3;
        stats.committing = Duration::from_micros(2_000_000);
        m.set_commit_stats(&stats);
        let text = m.render();
        assert_eq!(sample(&text, "sundial_store_commits_total"), Some(6.0));
        assert_eq!(
            sample(&text, "sundial_store_committing_seconds_total"),
            Some(2.0)
        );
        assert_eq!(sample(&text, "sundial_store_checkpoints_total"), Some(3.0));
    }

    #[test]
    fn renders_counters_with_labels_and_the_lateness_histogram() {
        let m = Metrics::new();
        m.record_transition(&applied(run(RunState::Succeeded, "")));
        m.record_transition(&applied(run(RunState::Succeeded, "")));
        m.record_transition(&applied(run(RunState::Failed, "")));
        m.fire_claimed(3);
        m.fire_claimed(2_000);
        m.misfire(MisfirePolicy::CatchUp, 3);
        m.webhook_attempt("delivered");
        m.set_circuit("hooks.example.com", true);
        let text = m.render();
        assert!(
            text.contains("# TYPE sundial_runs_finished_total counter"),
            "{text}"
        );
        assert_eq!(
            sample(&text, r#"sundial_runs_finished_total{state="SUCCEEDED"}"#),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, r#"sundial_runs_finished_total{state="FAILED"}"#),
            Some(1.0)
        );
        assert!(text.contains("# TYPE sundial_trigger_lateness_seconds histogram"));
        assert_eq!(
            sample(&text, "sundial_trigger_lateness_seconds_count"),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"sundial_trigger_lateness_seconds_bucket{le="0.005"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"sundial_trigger_lateness_seconds_bucket{le="+Inf"}"#
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, r#"sundial_misfires_total{policy="CATCH_UP"}"#),
            Some(1.0)
        );
        assert_eq!(sample(&text, "sundial_late_fires_total"), Some(3.0));
        assert_eq!(
            sample(
                &text,
                r#"sundial_webhook_attempts_total{outcome="delivered"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"sundial_webhook_circuit_open{destination="hooks.example.com"}"#
            ),
            Some(1.0)
        );
        m.set_circuit("hooks.example.com", false);
        assert_eq!(
            sample(
                &m.render(),
                r#"sundial_webhook_circuit_open{destination="hooks.example.com"}"#
            ),
            Some(0.0)
        );
    }

    #[test]
    fn only_applied_transitions_that_end_or_retry_a_run_count() {
        let m = Metrics::new();
        let mut refused = applied(run(RunState::Failed, ""));
        refused.applied = Applied::No("stale fencing token".into());
        m.record_transition(&refused);
        let mut already = applied(run(RunState::Succeeded, ""));
        already.applied = Applied::Already;
        m.record_transition(&already);
        m.record_transition(&applied(run(RunState::Running, "")));
        m.record_transition(&applied(run(RunState::Waiting, "rejected: busy")));
        m.record_transition(&applied(run(RunState::Waiting, "unconfirmed")));
        let text = m.render();
        for state in ["SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "SKIPPED"] {
            assert_eq!(
                sample(
                    &text,
                    &format!("sundial_runs_finished_total{{state=\"{state}\"}}")
                ),
                Some(0.0),
                "{state}: present from the start, and still 0"
            );
        }
        assert_eq!(sample(&text, "sundial_runs_retried_total"), Some(0.0));

        m.record_transition(&applied(run(RunState::Waiting, "retry: E1")));
        m.record_transition(&applied(run(RunState::Waiting, "retry: lost")));
        m.record_transition(&applied(run(RunState::Failed, "lost")));
        m.record_transition(&applied(run(RunState::TimedOut, "timeout")));
        let text = m.render();
        assert_eq!(sample(&text, "sundial_runs_retried_total"), Some(2.0));
        assert_eq!(sample(&text, "sundial_runs_lost_total"), Some(2.0));
        assert_eq!(
            sample(&text, r#"sundial_runs_finished_total{state="FAILED"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, r#"sundial_runs_finished_total{state="TIMED_OUT"}"#),
            Some(1.0)
        );
    }

    #[test]
    fn begun_counts_skipped_and_replaced_runs() {
        let m = Metrics::new();
        let skipped = run(RunState::Skipped, "overlap");
        m.record_begun(&Begun {
            run: skipped.clone(),
            created: true,
            revoked: Vec::new(),
        });
        // A redelivered trigger finds its SKIPPED run: not counted again.
        m.record_begun(&Begun {
            run: skipped,
            created: false,
            revoked: Vec::new(),
        });
        m.record_begun(&Begun {
            run: run(RunState::Waiting, ""),
            created: true,
            revoked: vec![Revocation {
                schedule_id: "nightly@1".into(),
                node_id: "n1".into(),
                token: 7,
                attempt: 1,
                reason: "replaced".into(),
            }],
        });
        let text = m.render();
        assert_eq!(
            sample(&text, r#"sundial_runs_finished_total{state="SKIPPED"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, r#"sundial_runs_finished_total{state="CANCELLED"}"#),
            Some(1.0)
        );
    }
}
