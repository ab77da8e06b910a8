//! `steps`: the run machine's three hot store steps alone, on a throwaway Redis with
//! nothing else running: `begin_and_assign`, `mark_started_many` (the `Started`
//! reports of a batch, as a stream sends them) and `finish_run`, for N runs of J jobs,
//! a batch of B runs at a time, each step's calls sent together. Prints, per step,
//! Redis's time inside its scripts per run (`INFO commandstats`' `fcall` usec over
//! the step's calls), and over all three the commands per run by name and this
//! process's CPU per run (the store's Rust side: arguments, replies, records).
//!
//! Steadier than `burst` (no executors, gRPC or scheduler share the two cores), so it
//! shows a change of a few µs in one step; `burst` says what it is worth end to end.
//! It links the store of its own build: compare builds by building the bench of each
//! (`--sundial-bin` does not apply).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, bail};
use serde::Serialize;
use sundial_server::model::{OverlapPolicy, RunState};
use sundial_server::store::conformance::{job, outcome, plan, planned_run, slot, terms};
use sundial_server::store::redis::RedisStore;
use sundial_server::store::{
    Applied, Assigned, Finisher, Holder, JobStore, RunStore, StoreOptions, Transition,
};
use sundial_tests::RedisServer;

use crate::cost::{ScriptTime, calls_since, commandstats, processes_cpu_us, script_time};

#[derive(Debug, Clone, clap::Args)]
pub struct StepsArgs {
    /// Runs, each taken through the three steps.
    #[arg(long, default_value_t = 20_000)]
    pub runs: usize,
    /// Jobs the runs belong to (run i is job i % jobs's).
    #[arg(long, default_value_t = 1_000)]
    pub jobs: usize,
    /// Runs per batch: each step's calls for a batch are sent together, and the
    /// node's window is this size (so its count is checked and never full).
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Read Redis's statistics only before and after, not between the steps (each
    /// reading is an `INFO` call, which at small batches sits between every two script
    /// calls): the three steps' total only.
    #[arg(long)]
    pub whole: bool,
    /// The store's bound of runs kept per job (`--max-runs-per-job`): below runs/jobs,
    /// every begin past it drops the job's oldest run.
    #[arg(long, default_value_t = 10_000)]
    pub max_runs_per_job: usize,
}

/// One step's cost per run.
#[derive(Debug, Default, Serialize)]
pub struct StepCost {
    pub step: &'static str,
    /// Redis's time inside the step's script calls, per run.
    pub redis_us_per_run: f64,
    /// The step's script calls per run (below 1 when a call carries several runs).
    pub calls_per_run: f64,
}

#[derive(Debug, Serialize)]
pub struct StepsReport {
    pub scenario: &'static str,
    pub runs: usize,
    pub jobs: usize,
    pub batch: usize,
    pub max_runs_per_job: usize,
    /// Script calls answered with keys to declare and made again, per run (each a
    /// round trip more: keys found in records the call could not name).
    pub calls_asking_for_keys_per_run: f64,
    /// Each step's cost (none with `--whole`).
    pub steps: Vec<StepCost>,
    /// The three steps' Redis time per run inside their scripts.
    pub redis_us_per_run: f64,
    pub commands_per_run: f64,
    /// Every command run per run, by name (scripts' inner commands included).
    pub commands_per_run_by_name: BTreeMap<String, f64>,
    /// This process's CPU per run: the store's client side.
    pub client_cpu_us_per_run: f64,
    pub granted: usize,
    pub started: usize,
    pub succeeded: usize,
}

/// The steps, in order.
const STEPS: [&str; 3] = ["begin_and_assign", "mark_started_many", "finish_run"];

pub async fn run(args: &StepsArgs) -> Result<StepsReport> {
    if args.batch == 0 || args.jobs == 0 {
        bail!("--batch and --jobs: must be at least 1");
    }
    let redis = RedisServer::start()?;
    let url = redis.url();
    let opts = StoreOptions {
        max_runs_per_job: args.max_runs_per_job,
        ..StoreOptions::default()
    };
    let store = RedisStore::connect(&url, "bench", opts).await?;
    for j in 0..args.jobs {
        store.create_job(job(&format!("step-{j}"), None)).await?;
    }
    let node = slot("bench-node", u32::try_from(args.batch)?);
    let lease = terms(60_000, 30_000);
    let mut spent = [ScriptTime::default(); 3];
    let whole_before = script_time(&url).await?;
    // Between the steps, unless only the whole is read.
    let reading = |url: String| async move {
        if args.whole {
            Ok(ScriptTime::default())
        } else {
            script_time(&url).await
        }
    };
    let (mut granted, mut started, mut succeeded) = (0, 0, 0);
    // Scheduled from now on, a second apart per job, as a scheduler plans them (a
    // run's index entry is then within the retention, as in production).
    let base = sundial_server::model::now_ms();
    let calls_before = commandstats(&url).await?;
    let cpu_before = processes_cpu_us(&[std::process::id()])?;
    for first in (0..args.runs).step_by(args.batch) {
        let batch = first..(first + args.batch).min(args.runs);
        let t0 = reading(url.clone()).await?;
        let begins = batch.map(|i| {
            let job_id = format!("step-{}", i % args.jobs);
            let at = base + i64::try_from(i / args.jobs)? * 1000;
            let run = planned_run(&job_id, at, plan(OverlapPolicy::Allow));
            let (store, node) = (&store, &node);
            Ok(async move {
                store
                    .begin_and_assign(run, Duration::ZERO, node, lease)
                    .await
            })
        });
        let begins = begins.collect::<Result<Vec<_>>>()?;
        let mut held = Vec::new();
        for (_, assigned) in futures::future::try_join_all(begins).await? {
            if let Some(Assigned::Granted(run)) = assigned {
                held.push((run.schedule_id.clone(), Holder::of(&run)));
            }
        }
        granted += held.len();
        let t1 = reading(url.clone()).await?;
        let answers = store.mark_started_many(&held).await?;
        started += answers.iter().filter(|a| **a == Applied::Yes).count();
        let t2 = reading(url.clone()).await?;
        let finishes = held.iter().map(|(sid, holder)| {
            store.finish_run(
                sid,
                Finisher::Holder(holder.clone()),
                outcome(RunState::Succeeded),
            )
        });
        let done: Vec<Transition> = futures::future::try_join_all(finishes).await?;
        succeeded += done
            .iter()
            .filter(|t| {
                t.run
                    .as_ref()
                    .is_some_and(|r| r.state == RunState::Succeeded)
            })
            .count();
        let t3 = reading(url.clone()).await?;
        for (s, (a, b)) in spent.iter_mut().zip([(t0, t1), (t1, t2), (t2, t3)]) {
            s.add(b.since(a));
        }
    }
    let whole = script_time(&url).await?.since(whole_before);
    let cpu = processes_cpu_us(&[std::process::id()])?.saturating_sub(cpu_before);
    let calls = calls_since(&calls_before, &commandstats(&url).await?);
    let n = args.runs as f64;
    // The readings of `INFO` between the steps are the bench's, not the store's.
    let by_name: BTreeMap<String, f64> = calls
        .into_iter()
        .filter(|(name, _)| name != "info")
        .map(|(name, c)| (name, c as f64 / n))
        .collect();
    let steps: Vec<StepCost> = STEPS
        .iter()
        .zip(spent)
        .filter(|_| !args.whole)
        .map(|(step, t)| StepCost {
            step,
            redis_us_per_run: t.usec as f64 / n,
            calls_per_run: t.calls as f64 / n,
        })
        .collect();
    Ok(StepsReport {
        scenario: "steps",
        runs: args.runs,
        jobs: args.jobs,
        batch: args.batch,
        max_runs_per_job: args.max_runs_per_job,
        calls_asking_for_keys_per_run: store.calls_asking_for_keys() as f64 / n,
        redis_us_per_run: whole.usec as f64 / n,
        steps,
        commands_per_run: by_name.values().sum(),
        commands_per_run_by_name: by_name,
        client_cpu_us_per_run: cpu as f64 / n,
        granted,
        started,
        succeeded,
    })
}

impl crate::Report for StepsReport {
    fn print(&self) {
        println!(
            "steps: {} runs of {} jobs (at most {} kept each), batches of {}, one Redis, no server",
            self.runs, self.jobs, self.max_runs_per_job, self.batch
        );
        for s in &self.steps {
            println!(
                "  {:<18} Redis {:6.1} µs per run inside {:.2} script calls",
                s.step, s.redis_us_per_run, s.calls_per_run
            );
        }
        println!(
            "  all three: Redis {:.1} µs, {:.1} commands per run; the store's client {:.1} µs CPU per run",
            self.redis_us_per_run, self.commands_per_run, self.client_cpu_us_per_run
        );
        let mut top: Vec<_> = self.commands_per_run_by_name.iter().collect();
        top.sort_by(|a, b| b.1.total_cmp(a.1));
        let top: Vec<String> = top.iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
        println!("    by name: {}", top.join(", "));
        println!(
            "  calls answered with keys to declare: {:.3} per run",
            self.calls_asking_for_keys_per_run
        );
    }

    fn consistency(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (what, n) in [
            ("granted", self.granted),
            ("started", self.started),
            ("succeeded", self.succeeded),
        ] {
            if n != self.runs {
                problems.push(format!("steps: {n} of {} runs {what}", self.runs));
            }
        }
        problems
    }
}
