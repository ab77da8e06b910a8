//! `sustained`: R jobs firing every second for S seconds, each with a `callback_url` to
//! the bench's own webhook receiver, which verifies every delivery by both signature
//! schemes. What a user waits for: due → handler start (journals), due → result (the
//! run's `finished_at_ms` in the webhook body) and due → webhook arrival; and whether
//! every run ran once and was delivered, verified.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde::Serialize;
use sundial_proto::v1 as pb;
use sundial_sdk::webhook::Secret;
use sundial_tests::hooks::{Hook, SignedReceiver};

use crate::cost::{CostProbe, Costs, RedisCeiling};
use crate::rig::{Binaries, Rig, RigSpec, StoreKind, noop_job, now_ms, register};
use crate::stats::{Spread, Starts, planned_ms, run_problems};

#[derive(Debug, Clone, clap::Args)]
pub struct SustainedArgs {
    /// Jobs, each firing every second: the offered runs per second.
    #[arg(long, default_value_t = 1000)]
    pub rate: usize,
    /// Seconds of firing.
    #[arg(long, default_value_t = 30)]
    pub seconds: usize,
    /// `test_executor` processes (handler `noop`).
    #[arg(long, default_value_t = 10)]
    pub executors: usize,
    /// Server instances (Redis only), executors spread over them.
    #[arg(long, default_value_t = 1)]
    pub instances: usize,
    #[arg(long, value_enum, default_value_t = StoreKind::Redis)]
    pub store: StoreKind,
    /// Count the servers' round trips and the commands inside scripts apart (Redis
    /// `MONITOR`, which costs Redis CPU: the CPU per run then includes it).
    #[arg(long)]
    pub monitor: bool,
    /// Stop waiting for results and webhooks this many seconds after the last fire
    /// (what has not arrived by then is reported missing).
    #[arg(long, default_value_t = 300)]
    pub timeout_s: u64,
}

#[derive(Debug, Serialize)]
pub struct SustainedReport {
    pub scenario: &'static str,
    pub store: &'static str,
    pub rate: usize,
    pub seconds: usize,
    pub executors: usize,
    pub instances: usize,
    pub expected_runs: usize,
    pub runs_started: usize,
    /// Runs whose webhook arrived, verified by both schemes.
    pub webhooks_verified: usize,
    pub webhooks_succeeded: usize,
    /// The delivered runs by final state (e.g. SKIPPED by the overlap policy, FAILED
    /// `no_executor`).
    pub webhooks_by_status: BTreeMap<String, usize>,
    pub webhooks_redelivered: usize,
    pub webhooks_refused: usize,
    /// Deliveries deferred a second (no attempt spent) because their destination or
    /// the instance had its bound in flight for as long as they could wait.
    pub webhooks_deferred_busy: f64,
    pub duplicate_starts: usize,
    pub runs_started_twice: usize,
    pub lost: f64,
    /// Due → first handler start.
    pub due_to_start: Spread,
    /// Due → the run's result recorded (`finished_at_ms`).
    pub due_to_result: Spread,
    /// Due → its webhook at the receiver.
    pub due_to_webhook: Spread,
    /// Results per second: the runs delivered over first due → last result, + 1 s.
    pub results_per_s: f64,
    /// Webhooks per second, the same way to the last arrival.
    pub webhooks_per_s: f64,
    /// Results recorded while the load lasted, per second: from 2 s after the first
    /// due time to the last due second's end (the whole load when it lasts under 3 s).
    /// The offered rate when the pipeline keeps up, its capacity when it cannot; unlike
    /// `results_per_s` it does not count the last runs' latency against the rate.
    pub steady_results_per_s: f64,
    /// Webhooks arrived while the load lasted, per second, the same way.
    pub steady_webhooks_per_s: f64,
    /// From registration's end to the last webhook.
    #[serde(flatten)]
    pub costs: Costs,
}

impl crate::Report for SustainedReport {
    fn print(&self) {
        println!(
            "sustained: {} jobs firing every second for {} s, {} executors, {} instance(s), store {}",
            self.rate, self.seconds, self.executors, self.instances, self.store
        );
        println!("  due -> handler start {}", self.due_to_start);
        println!("  due -> result        {}", self.due_to_result);
        println!("  due -> webhook       {}", self.due_to_webhook);
        println!(
            "  {:.0} results/s, {:.0} webhooks/s (offered {} runs/s)",
            self.results_per_s, self.webhooks_per_s, self.rate
        );
        println!(
            "  while the load lasted (from 2 s after the first due time): {:.0} results/s, {:.0} webhooks/s",
            self.steady_results_per_s, self.steady_webhooks_per_s
        );
        println!(
            "  runs: {} expected, {} started, {} webhooks verified by both schemes ({} SUCCEEDED), {} redelivered, {} refused, {} lost",
            self.expected_runs,
            self.runs_started,
            self.webhooks_verified,
            self.webhooks_succeeded,
            self.webhooks_redelivered,
            self.webhooks_refused,
            self.lost
        );
        let states: Vec<String> = self
            .webhooks_by_status
            .iter()
            .map(|(s, n)| format!("{s} {n}"))
            .collect();
        println!("  delivered runs by state: {}", states.join(", "));
        println!(
            "  webhooks deferred for a busy destination (no attempt spent): {:.0}",
            self.webhooks_deferred_busy.max(0.0)
        );
        println!(
            "  duplicate starts: {} ({} runs started twice or more)",
            self.duplicate_starts, self.runs_started_twice
        );
        self.costs.print();
    }

    /// Every run started once, succeeded, and its webhook arrived once and verified.
    fn consistency(&self) -> Vec<String> {
        let mut bad = run_problems(
            "sustained: ",
            self.expected_runs,
            self.runs_started,
            self.duplicate_starts,
            self.lost,
        );
        if self.webhooks_verified != self.expected_runs {
            bad.push(format!(
                "sustained: {} of {} webhooks arrived verified",
                self.webhooks_verified, self.expected_runs
            ));
        }
        if self.webhooks_succeeded != self.webhooks_verified {
            bad.push(format!(
                "sustained: {} of {} delivered runs SUCCEEDED",
                self.webhooks_succeeded, self.webhooks_verified
            ));
        }
        if self.webhooks_redelivered > 0 {
            bad.push(format!(
                "sustained: {} webhooks arrived more than once (no claim should run out here)",
                self.webhooks_redelivered
            ));
        }
        if self.webhooks_refused > 0 {
            bad.push(format!(
                "sustained: {} deliveries failed verification",
                self.webhooks_refused
            ));
        }
        bad
    }
}

pub async fn run(bins: &Binaries, args: &SustainedArgs) -> Result<SustainedReport> {
    if args.rate == 0 || args.seconds == 0 {
        bail!("--rate and --seconds must be at least 1");
    }
    let expected = args.rate * args.seconds;
    let secret = Secret::generate();
    let receiver = SignedReceiver::start(&secret, 2 * expected + 1000).await?;
    let rig = Rig::start(&RigSpec {
        bins,
        store: args.store,
        instances: args.instances,
        executors: args.executors,
        server_args: vec![
            ("webhook-secret".into(), secret.to_string()),
            ("webhook-allow".into(), "127.0.0.1/32".into()),
        ],
        executor_args: Vec::new(),
    })?;
    let ceiling = RedisCeiling::of(&rig)?;
    let jobs = rig.jobs().await?;
    // The first fire: a whole second far enough ahead that registration ends before it.
    let margin = 3_000 + i64::try_from(args.rate / 2)?;
    let first = (now_ms() + margin).div_euclid(1000) * 1000 + 1000;
    let last = first + i64::try_from(args.seconds - 1)? * 1000;
    let specs = (0..args.rate)
        .map(|i| pb::JobSpec {
            start_time_ms: first,
            end_time_ms: last,
            callback_url: receiver.url(),
            ..noop_job(format!("sustained-{i}"), "* * * * * *")
        })
        .collect();
    let took = register(&jobs, specs, 4).await?;
    if now_ms() >= first {
        bail!(
            "registering {} jobs took {took:?}, past the first fire",
            args.rate
        );
    }
    let probe = CostProbe::start(&rig, ceiling, args.monitor).await?;
    let deadline = Instant::now()
        + Duration::from_millis(u64::try_from(last - now_ms()).unwrap_or(0))
        + Duration::from_secs(args.timeout_s);
    while receiver.read(|i| i.by_run.len()) < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let costs = probe.finish(expected).await?;
    let scraped = rig.scrape(&reqwest::Client::new()).await?;
    let lost = scraped.sum("sundial_runs_lost_total");
    let deferred_busy = scraped.sum(r#"sundial_webhook_attempts_total{outcome="busy"}"#);
    let starts = Starts::of(&rig.journal()?);
    let due_to_start = starts
        .first
        .iter()
        .filter_map(|(sid, (at, _))| Some(at - planned_ms(sid)?))
        .collect();
    // The first verified delivery of each run.
    let (deliveries, redelivered, refused) = receiver.read(|i| {
        let d: Vec<Hook> = i
            .by_run
            .values()
            .filter_map(|h| h.first().cloned())
            .collect();
        (d, i.redelivered(), i.refused)
    });
    let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
    for d in &deliveries {
        *by_status.entry(d.status.clone()).or_default() += 1;
    }
    let per_s = |last_ms: Option<i64>| {
        last_ms.map_or(0.0, |l| {
            deliveries.len() as f64 * 1000.0 / ((l - first) + 1000).max(1) as f64
        })
    };
    let (from, to) = steady_window(first, args.seconds);
    let steady = |at: fn(&Hook) -> i64| {
        let n = deliveries
            .iter()
            .filter(|d| (from..to).contains(&at(d)))
            .count();
        n as f64 * 1000.0 / (to - from).max(1) as f64
    };
    Ok(SustainedReport {
        scenario: "sustained",
        store: args.store.name(),
        rate: args.rate,
        seconds: args.seconds,
        executors: args.executors,
        instances: args.instances,
        expected_runs: expected,
        runs_started: starts.first.len(),
        webhooks_verified: deliveries.len(),
        webhooks_succeeded: by_status.get("SUCCEEDED").copied().unwrap_or(0),
        webhooks_by_status: by_status,
        webhooks_redelivered: redelivered,
        webhooks_refused: refused,
        webhooks_deferred_busy: deferred_busy,
        duplicate_starts: starts.duplicates,
        runs_started_twice: starts.runs_started_twice,
        lost,
        due_to_start: Spread::of(due_to_start),
        due_to_result: Spread::of(
            deliveries
                .iter()
                .map(|d| d.finished_at_ms - d.scheduled_at_ms)
                .collect(),
        ),
        due_to_webhook: Spread::of(
            deliveries
                .iter()
                .map(|d| d.arrived_ms - d.scheduled_at_ms)
                .collect(),
        ),
        results_per_s: per_s(deliveries.iter().map(|d| d.finished_at_ms).max()),
        webhooks_per_s: per_s(deliveries.iter().map(|d| d.arrived_ms).max()),
        steady_results_per_s: steady(|d| d.finished_at_ms),
        steady_webhooks_per_s: steady(|d| d.arrived_ms),
        costs,
    })
}

/// The ms window [from, to) of a load whose first fires are due at `first` and that
/// fires for `seconds`: from 2 s after the first due time (the pipeline filled) to the
/// last due second's end; the whole load when it lasts under 3 s.
fn steady_window(first: i64, seconds: usize) -> (i64, i64) {
    let end = first + 1000 * i64::try_from(seconds).unwrap_or(i64::MAX / 1000);
    if seconds < 3 {
        (first, end)
    } else {
        (first + 2000, end)
    }
}

#[cfg(test)]
mod tests {
    use super::steady_window;

    #[test]
    fn the_steady_window_skips_the_first_two_seconds_of_a_long_load() {
        assert_eq!(steady_window(10_000, 15), (12_000, 25_000));
        assert_eq!(steady_window(10_000, 3), (12_000, 13_000));
        assert_eq!(steady_window(10_000, 2), (10_000, 12_000));
    }
}
