//! End-to-end benchmark: trigger → executor → result, on a local throwaway Redis, one
//! `sundial` server process and in-process Rust SDK executors with a no-op handler.
//!
//! `--jobs` jobs fire every second for `--seconds`; the numbers printed are sustained
//! runs per second (SUCCEEDED runs over the time from the first due time to the last
//! result), p50/p99/max from due time to the result (the executor's finish time; same
//! machine clock), and Redis commands per run from `INFO commandstats` (which counts the
//! commands inside scripts too), with the script calls (EVALSHA) per run as the round
//! trips that carry the run machine.
//!
//! ```sh
//! cargo build --release -p sundial-server -p sundial-tests
//! SUNDIAL_BIN=target/release/sundial ./target/release/bench-e2e --jobs 1000 --seconds 20
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use hdrhistogram::Histogram;
use sundial_proto::v1 as pb;
use sundial_sdk::{CancellationToken, Executor};
use sundial_tests::{RedisServer, Sundial, SundialOptions};

#[derive(Parser)]
struct Args {
    /// Jobs, each firing every second.
    #[arg(long, default_value_t = 1000)]
    jobs: usize,
    /// How long they fire.
    #[arg(long, default_value_t = 20)]
    seconds: i64,
    /// In-process executors (no-op handler).
    #[arg(long, default_value_t = 10)]
    executors: usize,
    /// Store partitions.
    #[arg(long, default_value_t = 16)]
    partitions: u32,
}

async fn commandstats(redis: &RedisServer) -> Result<BTreeMap<String, u64>> {
    let client = redis::Client::open(redis.url())?;
    let mut c = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await?;
    let mut out = BTreeMap::new();
    for line in info.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, fields)) = rest.split_once(':') else {
            continue;
        };
        let calls = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        out.insert(name.to_owned(), calls);
    }
    Ok(out)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let redis = RedisServer::start()?;
    let server = Sundial::start(
        SundialOptions::redis(&redis)
            .arg("partitions", &args.partitions.to_string())
            .arg("instance-id", "bench"),
    )?;
    let endpoint = format!("http://{}", server.grpc);
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    for i in 0..args.executors {
        let exec = Executor::builder()
            .endpoint(endpoint.clone())
            .group("bench")
            .node_id(format!("bench-{i}"))
            .handler("noop", |_ctx| async { Ok(Vec::new()) })
            .build()?;
        let mut connected = exec.connected();
        tasks.push(tokio::spawn(exec.run(stop.clone())));
        tokio::time::timeout(Duration::from_secs(10), connected.wait_for(Option::is_some))
            .await
            .context("executor did not connect")??;
    }
    let now = sundial_server::model::now_ms();
    let start = (now / 1000 + 3) * 1000;
    let end = start + args.seconds * 1000 - 1;
    let mut jobs = server.jobs().await?;
    for i in 0..args.jobs {
        let spec = pb::JobSpec {
            id: format!("bench-{i}"),
            cron: "* * * * * *".into(),
            target: Some(pb::job_spec::Target::Executor(pb::ExecutorTarget {
                group: "bench".into(),
                handler: "noop".into(),
            })),
            start_time_ms: start,
            end_time_ms: end,
            ..Default::default()
        };
        jobs.create_job(pb::CreateJobRequest { spec: Some(spec) })
            .await?;
    }
    let before = commandstats(&redis).await?;
    let expected = usize::try_from(args.seconds).unwrap_or(0) * args.jobs;
    println!(
        "{} jobs × every second × {} s = {expected} runs, {} executors",
        args.jobs, args.seconds, args.executors
    );

    // Wait for the last fire, then for the runs to settle.
    let wait = u64::try_from(end - sundial_server::model::now_ms()).unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(wait + 2000)).await;
    let mut client = server.runs().await?;
    let mut runs = Vec::new();
    for attempt in 0..120 {
        runs.clear();
        for i in 0..args.jobs {
            runs.extend(sundial_tests::all_runs(&mut client, &format!("bench-{i}")).await?);
        }
        let open = runs.iter().filter(|r| !(4..=8).contains(&r.state)).count();
        // Triggers still queued have no run yet: wait for every planned one.
        if (open == 0 && runs.len() >= expected) || attempt == 119 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let after = commandstats(&redis).await?;
    stop.cancel();
    for t in tasks {
        let _ = t.await;
    }

    let succeeded: Vec<&pb::Run> = runs
        .iter()
        .filter(|r| r.state == pb::RunState::Succeeded as i32)
        .collect();
    if succeeded.is_empty() {
        bail!("no run succeeded");
    }
    let mut hist = Histogram::<u64>::new(3)?;
    for r in &succeeded {
        hist.record(u64::try_from(r.finished_at_ms - r.scheduled_at_ms).unwrap_or(0))?;
    }
    let first_due = succeeded
        .iter()
        .map(|r| r.scheduled_at_ms)
        .min()
        .unwrap_or(0);
    let last_done = succeeded
        .iter()
        .map(|r| r.finished_at_ms)
        .max()
        .unwrap_or(0);
    let span_s = (last_done - first_due).max(1) as f64 / 1000.0;
    let delta = |k: &str| after.get(k).copied().unwrap_or(0) - before.get(k).copied().unwrap_or(0);
    let total: u64 = after.keys().map(|k| delta(k)).sum();
    let n = succeeded.len() as f64;
    println!(
        "runs: {} recorded, {} SUCCEEDED, {} other",
        runs.len(),
        succeeded.len(),
        runs.len() - succeeded.len()
    );
    println!(
        "throughput: {:.0} runs/s sustained ({} runs in {span_s:.1} s)",
        n / span_s,
        succeeded.len()
    );
    println!(
        "due → result: p50 {} ms, p99 {} ms, max {} ms",
        hist.value_at_quantile(0.5),
        hist.value_at_quantile(0.99),
        hist.max()
    );
    println!(
        "redis: {:.1} commands/run (inside scripts included), {:.1} script calls (EVALSHA)/run",
        total as f64 / n,
        delta("evalsha") as f64 / n,
    );
    let mut top: Vec<(String, u64)> = after.keys().map(|k| (k.clone(), delta(k))).collect();
    top.sort_by_key(|t| std::cmp::Reverse(t.1));
    for (k, v) in top.iter().take(15) {
        println!("  {k:<20} {:.2}/run", *v as f64 / n);
    }
    Ok(())
}
