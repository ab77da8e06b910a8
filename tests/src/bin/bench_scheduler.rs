//! Scheduler benchmark: N jobs due in the same second on a local throwaway Redis, claimed
//! by one or more in-process scheduler instances (each with its own store connection
//! pool, exactly as separate servers would be). Prints trigger lateness (claim time by
//! the store's clock − due time) p50/p99/max, and fires lost and duplicated, read back
//! from the trigger queue.
//!
//! `cargo run --release -p sundial-tests --bin bench-scheduler -- --jobs 10000 --instances 2`

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use futures::StreamExt;
use sundial_server::model::{Arm, JobRecord, JobSpec, RetryPolicy, Target};
use sundial_server::schedule::scheduler::{Scheduler, SchedulerOptions, SchedulerStats};
use sundial_server::store::redis::RedisStore;
use sundial_server::store::{JobStore, Store, StoreMeta, StoreOptions};
use sundial_tests::{RedisServer, queued_triggers};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
struct Args {
    /// Jobs due in the same second.
    #[arg(long, default_value_t = 10_000)]
    jobs: usize,
    /// Scheduler instances racing for them.
    #[arg(long, default_value_t = 1)]
    instances: usize,
    /// Store partitions.
    #[arg(long, default_value_t = 16)]
    partitions: u32,
    /// Fires claimed per store call.
    #[arg(long, default_value_t = 500)]
    batch: usize,
    /// Partitions claimed concurrently by each instance.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Partition lease of each instance, ms (0 = instances race for every batch).
    #[arg(long, default_value_t = 300)]
    partition_lease_ms: u64,
    /// Fire rounds, 10 s apart (1 = one fire per job, cold caches).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Print Redis's per-command statistics at the end.
    #[arg(long)]
    redis_stats: bool,
    /// Instead of N jobs due at once: one job firing every second, this many times.
    #[arg(long)]
    single_job_fires: Option<usize>,
}

fn spec(id: String, cron: &str) -> JobSpec {
    JobSpec {
        id,
        name: String::new(),
        cron: cron.to_owned(),
        time_zone: "UTC".into(),
        start_time: None,
        end_time: None,
        jitter_ms: 0,
        target: Target::Executor {
            group: "bench".into(),
            handler: "noop".into(),
        },
        route_strategy: Default::default(),
        route_key: String::new(),
        timeout_ms: 60_000,
        retry: RetryPolicy::default(),
        misfire_policy: Default::default(),
        misfire_catch_up_limit: 0,
        overlap_policy: Default::default(),
        callback_url: None,
        callback_max_in_flight: 0,
        app_id: String::new(),
        payload: Vec::new(),
        labels: Default::default(),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let redis = RedisServer::start()?;
    let opts = StoreOptions {
        partitions: args.partitions,
        ..StoreOptions::default()
    };
    let prefix = "bench";
    let setup = Arc::new(RedisStore::connect(&redis.url(), prefix, opts.clone()).await?);
    let now = setup.now().await?;
    // Due on a whole second far enough ahead to create every job first.
    let lead = 3 + args.jobs as i64 / 20_000;
    let (count, cron, due) = match (args.single_job_fires, args.rounds) {
        (Some(_), _) => (1, "* * * * * *", (now / 1000 + 2) * 1000),
        // Once a year: each job fires exactly once in the run.
        (None, 1) => (args.jobs, "0 0 1 1 *", (now / 1000 + lead) * 1000),
        // Every 10 s: the first round parses every job (cold), later ones hit the
        // scheduler's plan cache (warm), as a long-running server does.
        (None, _) => (
            args.jobs,
            "*/10 * * * * *",
            ((now / 1000 + lead) / 10 + 1) * 10_000,
        ),
    };
    let created = Instant::now();
    futures::stream::iter(0..count)
        .map(|i| {
            let store = setup.clone();
            async move {
                store
                    .create_job(JobRecord {
                        spec: spec(format!("bench-{i:06}"), cron),
                        version: 1,
                        paused: false,
                        next_fire: Some(Arm { planned: due, due }),
                        created_at: now,
                        updated_at: now,
                    })
                    .await
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let setup_secs = created.elapsed().as_secs_f64();
    anyhow::ensure!(
        setup.now().await? < due,
        "job creation overran the due time; raise the lead"
    );

    if args.redis_stats {
        // Count only what the schedulers do.
        let mut c = redis.connection().await?;
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut c)
            .await?;
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(0)
            .arg("slowlog-max-len")
            .arg(100_000)
            .query_async(&mut c)
            .await?;
        let _: () = redis::cmd("SLOWLOG")
            .arg("RESET")
            .query_async(&mut c)
            .await?;
    }
    let shutdown = CancellationToken::new();
    let mut tasks = Vec::new();
    let mut stats = Vec::new();
    for i in 0..args.instances {
        let opts = StoreOptions {
            instance_id: format!("bench-{i}"),
            partition_lease: Duration::from_millis(args.partition_lease_ms),
            ..opts.clone()
        };
        let store: Arc<dyn Store> =
            Arc::new(RedisStore::connect(&redis.url(), prefix, opts).await?);
        let s = SchedulerStats::default();
        let sched = Scheduler::new(
            store,
            SchedulerOptions {
                batch_size: args.batch,
                parallel_partitions: args.parallel,
                misfire_threshold: Duration::from_secs(3600),
                ..SchedulerOptions::default()
            },
            s.clone(),
        );
        stats.push(s);
        tasks.push(tokio::spawn(sched.run(shutdown.clone())));
    }
    let expected = args
        .single_job_fires
        .unwrap_or(args.jobs * args.rounds.max(1));
    let deadline = Instant::now() + Duration::from_secs(120 + expected as u64 / 1000);
    loop {
        let claimed: u64 = stats.iter().map(|s| s.snapshot().claimed).sum();
        if claimed as usize >= expected || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A moment more, so a late double claim would show up in the queue.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    shutdown.cancel();
    for t in tasks {
        t.await.context("scheduler task")?;
    }

    let mut triggers = queued_triggers(&redis, prefix).await?;
    // Only the planned rounds are measured (a chain may fire once more meanwhile).
    triggers.sort_by_key(|t| t.scheduled_at);
    let last_round = match args.single_job_fires {
        Some(fires) => due + (fires as i64 - 1) * 1000,
        None => due + (args.rounds.max(1) as i64 - 1) * 10_000,
    };
    triggers.retain(|t| t.scheduled_at <= last_round);
    if args.rounds > 1 {
        let mut by_round: std::collections::BTreeMap<i64, hdrhistogram::Histogram<u64>> =
            Default::default();
        for t in &triggers {
            by_round
                .entry(t.scheduled_at)
                .or_insert_with(|| hdrhistogram::Histogram::new(3).expect("histogram"))
                .record((t.triggered_at - t.scheduled_at).max(0) as u64)?;
        }
        for (i, (_, h)) in by_round.iter().enumerate() {
            println!(
                "round {} ({}): fires={} lateness_ms p50={} p99={} max={}",
                i + 1,
                if i == 0 { "cold" } else { "warm" },
                h.len(),
                h.value_at_quantile(0.5),
                h.value_at_quantile(0.99),
                h.max()
            );
        }
    }
    let mut lateness = hdrhistogram::Histogram::<u64>::new(3)?;
    let mut seen = HashSet::new();
    let mut dups = 0;
    for t in &triggers {
        if !seen.insert(t.schedule_id.clone()) {
            dups += 1;
        }
        lateness.record((t.triggered_at - t.scheduled_at).max(0) as u64)?;
    }
    let lost = expected.saturating_sub(seen.len());
    let lost_races: u64 = stats.iter().map(|s| s.snapshot().lost_races).sum();
    println!(
        "jobs={} instances={} partitions={} parallel={} batch={} setup={setup_secs:.1}s",
        count, args.instances, args.partitions, args.parallel, args.batch
    );
    println!(
        "fires={} lateness_ms p50={} p99={} max={} lost={lost} duplicated={dups} lost_claim_races={lost_races}",
        triggers.len(),
        lateness.value_at_quantile(0.5),
        lateness.value_at_quantile(0.99),
        lateness.max()
    );
    if args.redis_stats {
        let mut c = redis.connection().await?;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut c)
            .await?;
        for line in info.lines().filter(|l| l.starts_with("cmdstat_")) {
            println!("{line}");
        }
        // Per script (by SHA prefix): calls, total and mean µs inside Redis.
        let log: Vec<(i64, i64, i64, Vec<String>)> = redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(100_000)
            .query_async::<Vec<redis::Value>>(&mut c)
            .await?
            .into_iter()
            .filter_map(|v| {
                let redis::Value::Array(f) = v else {
                    return None;
                };
                let id = redis::from_redis_value_ref::<i64>(f.first()?).ok()?;
                let ts = redis::from_redis_value_ref::<i64>(f.get(1)?).ok()?;
                let us = redis::from_redis_value_ref::<i64>(f.get(2)?).ok()?;
                let args = redis::from_redis_value_ref::<Vec<String>>(f.get(3)?).ok()?;
                Some((id, ts, us, args))
            })
            .collect();
        let mut by: std::collections::BTreeMap<String, (u64, i64)> = Default::default();
        for (_, _, us, args) in log
            .iter()
            .filter(|l| l.3.first().is_some_and(|c| c == "EVALSHA" || c == "FCALL"))
        {
            let key = format!(
                "{} {}",
                args.first().cloned().unwrap_or_default(),
                args.get(1).map(|s| &s[..s.len().min(8)]).unwrap_or("")
            );
            let e = by.entry(key).or_default();
            e.0 += 1;
            e.1 += us;
        }
        for (k, (n, us)) in by {
            println!(
                "slowlog {k}: calls={n} total_us={us} avg_us={}",
                us / n as i64
            );
        }
    }
    anyhow::ensure!(lost == 0 && dups == 0, "fires lost or duplicated");
    Ok(())
}
