//! `failover`: how long the runs of an executor that dies wait for their next attempt.
//! N runs of a sleeping handler are started over two executors, one executor is
//! SIGKILLed, and each run it held is timed from the kill to its attempt 2 starting on
//! the other (journals). With the server's defaults that is about `--disconnect-grace`
//! (1 s); `--disconnect-grace 15s` (the lease) shows what it was before the grace.
//!
//! `--freeze`: one of the two executors is SIGSTOPped first, then N runs are
//! triggered 50 ms apart, and each is timed from its trigger to its handler starting
//! (on the live executor: the runs routed to the frozen one are taken back once it has
//! been silent for `--silent-after`, 1 s); after SIGCONT the frozen one must start none
//! of them. `--silent-after 0` shows what it was before: they moved only after
//! `--confirm-within` (10 s).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;
use sundial_proto::v1 as pb;

use crate::rig::{Binaries, Rig, RigSpec, StoreKind, noop_job, now_ms, register};
use crate::stats::Spread;

#[derive(Debug, Clone, clap::Args)]
pub struct FailoverArgs {
    /// Runs started before the kill (about half of them on the killed executor).
    #[arg(long, default_value_t = 100)]
    pub runs: usize,
    /// How long each handler sleeps.
    #[arg(long, default_value_t = 3000)]
    pub sleep_ms: u64,
    #[arg(long, value_enum, default_value_t = StoreKind::Redis)]
    pub store: StoreKind,
    /// Passed to the server as `--disconnect-grace` (its default when not given).
    #[arg(long)]
    pub disconnect_grace: Option<String>,
    /// SIGSTOP one executor before the runs instead of SIGKILLing it during them.
    #[arg(long)]
    pub freeze: bool,
    /// Passed to the server as `--silent-after` (its default when not given).
    #[arg(long)]
    pub silent_after: Option<String>,
    /// Gives up when the runs are not all final this long after the kill.
    #[arg(long, default_value_t = 120)]
    pub timeout_s: u64,
}

#[derive(Debug, Serialize)]
pub struct FailoverReport {
    pub scenario: &'static str,
    pub store: &'static str,
    pub runs: usize,
    pub disconnect_grace: Option<String>,
    /// Runs the killed executor was executing.
    pub held_by_killed: usize,
    /// Kill → attempt 2 started on the survivor, per run the killed one held (ms).
    pub kill_to_retry_start: Spread,
    /// Runs of the killed executor whose attempt 2 never started.
    pub not_retried: usize,
    /// Start lines of a (run, attempt) beyond its first.
    pub duplicate_starts: usize,
    /// Runs that ended SUCCEEDED (every one should).
    pub succeeded: usize,
}

#[derive(Debug, Serialize)]
pub struct FreezeReport {
    pub scenario: &'static str,
    pub store: &'static str,
    pub runs: usize,
    pub silent_after: Option<String>,
    /// Trigger → handler start, per run (ms).
    pub trigger_to_start: Spread,
    /// Handler starts on the frozen executor, after it thawed (none should be).
    pub started_on_frozen: usize,
    /// Start lines of a (run, attempt) beyond its first.
    pub duplicate_starts: usize,
    pub succeeded: usize,
}

impl crate::Report for FreezeReport {
    fn print(&self) {
        println!(
            "failover --freeze ({}): {} runs 50 ms apart, one of two executors SIGSTOPped; silent after {}",
            self.store,
            self.runs,
            self.silent_after.as_deref().unwrap_or("default")
        );
        println!("  trigger → handler start: {}", self.trigger_to_start);
        println!(
            "  started on the frozen executor {}, duplicate starts {}, succeeded {} of {}",
            self.started_on_frozen, self.duplicate_starts, self.succeeded, self.runs
        );
    }

    fn consistency(&self) -> Vec<String> {
        let mut bad = Vec::new();
        if self.started_on_frozen > 0 {
            bad.push(format!(
                "failover --freeze: the thawed executor started {} runs",
                self.started_on_frozen
            ));
        }
        bad.extend(every_run_once(
            "failover --freeze",
            self.duplicate_starts,
            self.succeeded,
            self.runs,
        ));
        bad
    }
}

/// What both modes must show: no handler started twice, every run succeeded.
fn every_run_once(scenario: &str, duplicates: usize, succeeded: usize, runs: usize) -> Vec<String> {
    let mut bad = Vec::new();
    if duplicates > 0 {
        bad.push(format!("{scenario}: {duplicates} duplicate handler starts"));
    }
    if succeeded != runs {
        bad.push(format!("{scenario}: {succeeded} of {runs} runs succeeded"));
    }
    bad
}

fn server_args(args: &FailoverArgs) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(g) = &args.disconnect_grace {
        out.push(("disconnect-grace".to_owned(), g.clone()));
    }
    if let Some(s) = &args.silent_after {
        out.push(("silent-after".to_owned(), s.clone()));
    }
    out
}

fn sleep_jobs(args: &FailoverArgs) -> Vec<pb::JobSpec> {
    (0..args.runs)
        .map(|i| pb::JobSpec {
            retry: Some(pb::RetryPolicy {
                max_retries: 1,
                backoff_ms: 1,
                ..Default::default()
            }),
            payload: args.sleep_ms.to_string().into_bytes(),
            target: Some(pb::job_spec::Target::Executor(pb::ExecutorTarget {
                group: "g".into(),
                handler: "sleep".into(),
            })),
            ..noop_job(format!("failover-{i}"), sundial_tests::MANUAL_ONLY)
        })
        .collect()
}

/// Start lines of a (run, attempt) beyond its first.
fn duplicate_starts(entries: &[sundial_tests::JournalEntry]) -> usize {
    let mut starts: BTreeMap<(String, u32), usize> = BTreeMap::new();
    for e in entries.iter().filter(|e| e.event == "start") {
        *starts
            .entry((e.schedule_id.clone(), e.attempt))
            .or_default() += 1;
    }
    starts.values().map(|n| n - 1).sum()
}

fn succeeded(entries: &[sundial_tests::JournalEntry]) -> usize {
    entries
        .iter()
        .filter(|e| e.event == "finish" && e.status == "SUCCEEDED")
        .map(|e| e.schedule_id.as_str())
        .collect::<BTreeSet<_>>()
        .len()
}

pub async fn freeze(bins: &Binaries, args: &FailoverArgs) -> Result<FreezeReport> {
    let rig = Rig::start(&RigSpec {
        bins,
        store: args.store,
        instances: 1,
        executors: 2,
        server_args: server_args(args),
        executor_args: vec!["--max-concurrency".into(), args.runs.to_string()],
    })?;
    let mut jobs = rig.jobs().await?;
    register(&jobs, sleep_jobs(args), 4).await?;
    let nodes = pb::node_service_client::NodeServiceClient::new(rig.instances[0].channel().await?);
    wait_async(Duration::from_secs(30), || {
        let mut nodes = nodes.clone();
        async move {
            let n = nodes
                .list_nodes(pb::ListNodesRequest::default())
                .await?
                .into_inner()
                .nodes
                .len();
            Ok((n == 2).then_some(()))
        }
    })
    .await
    .context("both executors registered")?;
    let frozen = rig.executors[0].node_id.clone();
    rig.executors[0].signal("STOP")?;
    let mut triggered = BTreeMap::new();
    for i in 0..args.runs {
        let sid = jobs
            .trigger_job(pb::TriggerJobRequest {
                job_id: format!("failover-{i}"),
                ..Default::default()
            })
            .await?
            .into_inner()
            .schedule_id;
        triggered.insert(sid, now_ms());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let finished = wait(Duration::from_secs(args.timeout_s), || {
        let entries = rig.journal()?;
        let n = entries.iter().filter(|e| e.event == "finish").count();
        Ok((n >= args.runs).then_some(()))
    })
    .await;
    rig.executors[0].signal("CONT")?;
    finished.context("every run finished")?;
    // The thawed executor reads what waited in its socket and answers it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let entries = rig.journal()?;
    let mut first_start: BTreeMap<&str, i64> = BTreeMap::new();
    for e in entries.iter().filter(|e| e.event == "start") {
        first_start.entry(&e.schedule_id).or_insert(e.unix_ms);
    }
    let delays = triggered
        .iter()
        .filter_map(|(sid, at)| first_start.get(sid.as_str()).map(|s| s - at))
        .collect();
    Ok(FreezeReport {
        scenario: "failover-freeze",
        store: args.store.name(),
        runs: args.runs,
        silent_after: args.silent_after.clone(),
        trigger_to_start: Spread::of(delays),
        started_on_frozen: entries
            .iter()
            .filter(|e| e.event == "start" && e.node_id == frozen)
            .count(),
        duplicate_starts: duplicate_starts(&entries),
        succeeded: succeeded(&entries),
    })
}

impl crate::Report for FailoverReport {
    fn print(&self) {
        println!(
            "failover ({}): {} runs, the killed executor held {}; disconnect grace {}",
            self.store,
            self.runs,
            self.held_by_killed,
            self.disconnect_grace.as_deref().unwrap_or("default")
        );
        println!(
            "  SIGKILL → attempt 2 started elsewhere: {}",
            self.kill_to_retry_start
        );
        println!(
            "  not retried {}, duplicate starts {}, succeeded {} of {}",
            self.not_retried, self.duplicate_starts, self.succeeded, self.runs
        );
    }

    fn consistency(&self) -> Vec<String> {
        let mut bad = Vec::new();
        if self.held_by_killed == 0 {
            bad.push("failover: the killed executor held no run".into());
        }
        if self.not_retried > 0 {
            bad.push(format!(
                "failover: {} runs never started attempt 2",
                self.not_retried
            ));
        }
        bad.extend(every_run_once(
            "failover",
            self.duplicate_starts,
            self.succeeded,
            self.runs,
        ));
        bad
    }
}

pub async fn run(bins: &Binaries, args: &FailoverArgs) -> Result<FailoverReport> {
    let mut rig = Rig::start(&RigSpec {
        bins,
        store: args.store,
        instances: 1,
        executors: 2,
        server_args: server_args(args),
        // Room for every run on one executor, so the survivor never makes a retry wait
        // for capacity.
        executor_args: vec!["--max-concurrency".into(), args.runs.to_string()],
    })?;
    let mut jobs = rig.jobs().await?;
    register(&jobs, sleep_jobs(args), 4).await?;
    for i in 0..args.runs {
        jobs.trigger_job(pb::TriggerJobRequest {
            job_id: format!("failover-{i}"),
            ..Default::default()
        })
        .await?;
    }
    let started = wait(Duration::from_secs(60), || {
        let starts = rig.journal()?;
        let n = starts.iter().filter(|e| e.event == "start").count();
        Ok((n >= args.runs).then_some(starts))
    })
    .await
    .context("every run's first start")?;
    let killed = rig.executors[0].node_id.clone();
    let held: BTreeSet<String> = started
        .iter()
        .filter(|e| e.event == "start" && e.node_id == killed)
        .map(|e| e.schedule_id.clone())
        .collect();
    let kill_ms = now_ms();
    rig.executors[0].kill()?;

    let timeout = Duration::from_secs(args.timeout_s);
    let entries = wait(timeout, || {
        let entries = rig.journal()?;
        let finished = entries
            .iter()
            .filter(|e| e.event == "finish" && e.node_id != killed)
            .count();
        Ok((finished >= args.runs).then_some(entries))
    })
    .await
    .context("every run finished on the survivor")?;
    let mut retry_at: BTreeMap<String, i64> = BTreeMap::new();
    for e in entries.iter().filter(|e| e.event == "start") {
        if e.attempt == 2 && held.contains(&e.schedule_id) {
            retry_at.entry(e.schedule_id.clone()).or_insert(e.unix_ms);
        }
    }
    Ok(FailoverReport {
        scenario: "failover",
        store: args.store.name(),
        runs: args.runs,
        disconnect_grace: args.disconnect_grace.clone(),
        held_by_killed: held.len(),
        kill_to_retry_start: Spread::of(retry_at.values().map(|at| at - kill_ms).collect()),
        not_retried: held.len() - retry_at.len(),
        duplicate_starts: duplicate_starts(&entries),
        succeeded: succeeded(&entries),
    })
}

/// Polls an async `probe` every 100 ms until it answers, for at most `limit`.
async fn wait_async<T, F, Fut>(limit: Duration, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe().await? {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            bail!("not within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `probe` every 100 ms until it answers, for at most `limit`.
async fn wait<T>(limit: Duration, mut probe: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe()? {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            bail!("not within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
