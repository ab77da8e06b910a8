//! `burst`: N jobs due in the same whole second, once per round. What a user waits for:
//! due → handler start (from the executors' journals), and whether each run started
//! exactly once, on which executor, and ended SUCCEEDED.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde::Serialize;
use sundial_proto::v1 as pb;

use crate::cost::{CostProbe, Costs, RedisCeiling};
use crate::rig::{Binaries, Rig, RigSpec, StoreKind, noop_job, now_ms, register};
use crate::stats::{Spread, Starts, planned_ms, run_problems};

/// Past this many commits per run on the embedded store a burst's decisions are no
/// longer sharing commits (see `consistency`).
const MAX_COMMITS_PER_RUN: f64 = 0.5;

#[derive(Debug, Clone, clap::Args)]
pub struct BurstArgs {
    /// Jobs, all due in the same second of each round.
    #[arg(long, default_value_t = 10_000)]
    pub jobs: usize,
    /// `test_executor` processes (handler `noop`).
    #[arg(long, default_value_t = 10)]
    pub executors: usize,
    /// Server instances (Redis only), executors spread over them.
    #[arg(long, default_value_t = 1)]
    pub instances: usize,
    /// Rounds: round 1 is cold (the scheduler parses every job), later ones warm.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Seconds between rounds; a divisor of 60.
    #[arg(long, default_value_t = 10)]
    pub interval_s: u64,
    #[arg(long, value_enum, default_value_t = StoreKind::Redis)]
    pub store: StoreKind,
    /// Each executor's `--max-concurrency` (0: the SDK's default).
    #[arg(long, default_value_t = 0)]
    pub max_concurrency: u32,
    /// Count the servers' round trips and the commands inside scripts apart (Redis
    /// `MONITOR`, which costs Redis CPU: the CPU per run then includes it).
    #[arg(long)]
    pub monitor: bool,
    /// Give up waiting for the runs to end after this many seconds past the last due time.
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
}

#[derive(Debug, Serialize)]
pub struct RoundReport {
    pub round: usize,
    pub due_ms: i64,
    /// Due → first handler start, over the runs of this round.
    pub due_to_start: Spread,
    /// Runs started per second, from due to the last start (all are due at once).
    pub starts_per_s: f64,
    /// Runs started within one second of due.
    pub started_in_first_s: usize,
}

impl RoundReport {
    fn of(round: usize, due_ms: i64, lags: Vec<i64>) -> Self {
        let started_in_first_s = lags.iter().filter(|&&l| l <= 1000).count();
        let due_to_start = Spread::of(lags);
        let starts_per_s = due_to_start.n as f64 * 1000.0 / due_to_start.max.max(1) as f64;
        Self {
            round,
            due_ms,
            due_to_start,
            starts_per_s,
            started_in_first_s,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct BurstReport {
    pub scenario: &'static str,
    pub store: &'static str,
    pub jobs: usize,
    pub executors: usize,
    pub instances: usize,
    pub rounds: Vec<RoundReport>,
    pub register_ms: u128,
    pub expected_runs: usize,
    pub runs_started: usize,
    pub succeeded: f64,
    pub failed: f64,
    pub timed_out: f64,
    pub cancelled: f64,
    pub skipped: f64,
    pub lost: f64,
    /// Dispatches taken back from executors taken for silent (none should be: every
    /// executor here answers).
    pub taken_back: f64,
    /// Handler start lines beyond the first for a schedule_id, over all executors.
    pub duplicate_starts: usize,
    pub runs_started_twice: usize,
    pub runs_per_executor_min: usize,
    pub runs_per_executor_max: usize,
    /// From registration's end to the last run final.
    #[serde(flatten)]
    pub costs: Costs,
}

impl crate::Report for BurstReport {
    /// What must hold whatever the timing: every run ran once and succeeded.
    fn consistency(&self) -> Vec<String> {
        let mut bad = run_problems(
            "",
            self.expected_runs,
            self.runs_started,
            self.duplicate_starts,
            self.lost,
        );
        if self.succeeded as usize != self.expected_runs {
            bad.push(format!(
                "{} of {} runs SUCCEEDED (failed {}, timed out {}, cancelled {}, skipped {})",
                self.succeeded,
                self.expected_runs,
                self.failed,
                self.timed_out,
                self.cancelled,
                self.skipped
            ));
        }
        // Not a timing: whether group commit still batches a burst's decisions on the
        // embedded store (about 0.04 a run on this 2-core machine at 10 000 jobs, 0.14
        // at the smoke test's 2 000; a decision committing alone makes it about 1, as
        // when a sequential room refill routed one run per commit).
        if let Some(commits) = self.costs.store_commits_per_run
            && commits > MAX_COMMITS_PER_RUN
        {
            bad.push(format!(
                "{commits:.3} store commits per run: more than {MAX_COMMITS_PER_RUN}, so the burst's decisions no longer share commits"
            ));
        }
        bad
    }

    fn print(&self) {
        println!(
            "burst: {} jobs x {} rounds, {} executors, {} instance(s), store {}",
            self.jobs,
            self.rounds.len(),
            self.executors,
            self.instances,
            self.store
        );
        println!("  registered (ApplyJobs) in {} ms", self.register_ms);
        for r in &self.rounds {
            let kind = if r.round == 1 { "cold" } else { "warm" };
            println!(
                "  round {} ({kind}): due -> handler start {} over {} runs (the first after {} ms); {:.0} starts/s, {} in the first second",
                r.round,
                r.due_to_start,
                r.due_to_start.n,
                r.due_to_start.min,
                r.starts_per_s,
                r.started_in_first_s
            );
        }
        println!(
            "  runs: {} expected, {} started, {} succeeded, {} failed, {} timed out, {} lost",
            self.expected_runs,
            self.runs_started,
            self.succeeded,
            self.failed,
            self.timed_out,
            self.lost
        );
        println!(
            "  duplicate starts: {} ({} runs started twice or more); dispatches taken back from silent executors: {}",
            self.duplicate_starts, self.runs_started_twice, self.taken_back
        );
        println!(
            "  runs per executor: min {} / max {}",
            self.runs_per_executor_min, self.runs_per_executor_max
        );
        self.costs.print();
    }
}

const FINAL: [&str; 5] = ["SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "SKIPPED"];

fn spec(id: String, interval_s: u64, first_ms: i64, last_ms: i64) -> pb::JobSpec {
    pb::JobSpec {
        start_time_ms: first_ms,
        // Just after the last fire (an end must come after the start, even for one round).
        end_time_ms: last_ms + 1,
        ..noop_job(id, &format!("*/{interval_s} * * * * *"))
    }
}

pub async fn run(bins: &Binaries, args: &BurstArgs) -> Result<BurstReport> {
    if args.interval_s == 0 || 60 % args.interval_s != 0 {
        bail!("--interval-s must divide 60");
    }
    let rig = Rig::start(&RigSpec {
        bins,
        store: args.store,
        instances: args.instances,
        executors: args.executors,
        server_args: Vec::new(),
        executor_args: if args.max_concurrency > 0 {
            vec!["--max-concurrency".into(), args.max_concurrency.to_string()]
        } else {
            Vec::new()
        },
    })?;
    let ceiling = RedisCeiling::of(&rig)?;
    let jobs = rig.jobs().await?;
    // The first round's due time: a whole multiple of the interval, far enough ahead
    // that registration ends before it (a generous guess of 2,000 jobs/s, plus 3 s).
    let interval_ms = i64::try_from(args.interval_s * 1000)?;
    let margin = 3_000 + i64::try_from(args.jobs / 2)?;
    let first = (now_ms() + margin).div_euclid(interval_ms) * interval_ms + interval_ms;
    let rounds = i64::try_from(args.rounds.max(1))?;
    let last = first + (rounds - 1) * interval_ms;
    let specs = (0..args.jobs)
        .map(|i| spec(format!("burst-{i}"), args.interval_s, first, last))
        .collect();
    let took = register(&jobs, specs, 4).await?;
    if now_ms() >= first {
        bail!(
            "registering {} jobs took {took:?}, past the first due time; the burst would not be one",
            args.jobs
        );
    }
    let expected = args.jobs * args.rounds.max(1);
    let probe = CostProbe::start(&rig, ceiling, args.monitor).await?;
    let client = reqwest::Client::new();
    let deadline = Instant::now()
        + Duration::from_millis(u64::try_from(last - now_ms()).unwrap_or(0))
        + Duration::from_secs(args.timeout_s);
    // Polls until every run is final; the last scrape gives the final states.
    let (states, lost, taken_back) = loop {
        let scraped = rig.scrape(&client).await?;
        let states = FINAL
            .map(|state| scraped.sum(&format!("sundial_runs_finished_total{{state=\"{state}\"}}")));
        let done: f64 = states.iter().sum();
        if done as usize >= expected {
            break (
                states,
                scraped.sum("sundial_runs_lost_total"),
                scraped.sum("sundial_dispatches_taken_back_total"),
            );
        }
        if Instant::now() >= deadline {
            bail!("only {done} of {expected} runs ended within the timeout");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let costs = probe.finish(expected).await?;
    let starts = Starts::of(&rig.journal()?);
    let mut by_round: Vec<Vec<i64>> = vec![Vec::new(); args.rounds.max(1)];
    for (sid, (at, _)) in &starts.first {
        if let Some(planned) = planned_ms(sid) {
            let r = usize::try_from((planned - first) / interval_ms).unwrap_or(0);
            if let Some(v) = by_round.get_mut(r) {
                v.push(at - planned);
            }
        }
    }
    let nodes: Vec<String> = rig.executors.iter().map(|e| e.node_id.clone()).collect();
    let per = starts.per_node(&nodes);
    Ok(BurstReport {
        scenario: "burst",
        store: args.store.name(),
        jobs: args.jobs,
        executors: args.executors,
        instances: args.instances,
        rounds: by_round
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                RoundReport::of(
                    i + 1,
                    first + i64::try_from(i).unwrap_or(0) * interval_ms,
                    v,
                )
            })
            .collect(),
        register_ms: took.as_millis(),
        expected_runs: expected,
        runs_started: starts.first.len(),
        succeeded: states[0],
        failed: states[1],
        timed_out: states[2],
        cancelled: states[3],
        skipped: states[4],
        lost,
        taken_back,
        duplicate_starts: starts.duplicates,
        runs_started_twice: starts.runs_started_twice,
        runs_per_executor_min: per.values().copied().min().unwrap_or(0),
        runs_per_executor_max: per.values().copied().max().unwrap_or(0),
        costs,
    })
}
