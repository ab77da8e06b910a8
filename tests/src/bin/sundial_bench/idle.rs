//! `idle`: what a server costs Redis with nothing due: N jobs armed far in the future
//! and E connected executors, Redis commands per second by name over a window (from
//! `INFO commandstats`, which counts the commands run inside scripts too).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::cost::{RedisCeiling, calls_since, commandstats};
use crate::rig::{Binaries, Rig, RigSpec, StoreKind, noop_job, register};

#[derive(Debug, Clone, clap::Args)]
pub struct IdleArgs {
    /// Jobs, armed for decades from now.
    #[arg(long, default_value_t = 1000)]
    pub jobs: usize,
    #[arg(long, default_value_t = 10)]
    pub executors: usize,
    /// The measured window, after 5 s for everything to settle.
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
}

#[derive(Debug, Serialize)]
pub struct IdleReport {
    pub scenario: &'static str,
    pub jobs: usize,
    pub executors: usize,
    pub seconds: f64,
    pub commands_per_s: f64,
    /// Per command name (lower case, as Redis reports it), per second.
    pub by_command: BTreeMap<String, f64>,
    /// `redis-benchmark` on the same Redis, after the measurement (none on embedded).
    pub redis_ceiling: Option<RedisCeiling>,
}

impl crate::Report for IdleReport {
    fn print(&self) {
        println!(
            "idle: {} jobs far in the future, {} executors, {:.0} s window: {:.0} Redis commands/s",
            self.jobs, self.executors, self.seconds, self.commands_per_s
        );
        let mut top: Vec<(&String, &f64)> = self.by_command.iter().collect();
        top.sort_by(|a, b| b.1.total_cmp(a.1));
        for (name, rate) in top.into_iter().take(12) {
            println!("  {name:<24} {rate:>8.1}/s");
        }
        RedisCeiling::print(self.redis_ceiling);
    }

    fn consistency(&self) -> Vec<String> {
        // Heartbeats alone renew the registry: a window with no command at all means
        // the statistics were not read.
        if self.commands_per_s <= 0.0 {
            vec!["idle: no Redis command counted".into()]
        } else {
            Vec::new()
        }
    }
}

pub async fn run(bins: &Binaries, args: &IdleArgs) -> Result<IdleReport> {
    let rig = Rig::start(&RigSpec {
        bins,
        store: StoreKind::Redis,
        instances: 1,
        executors: args.executors,
        server_args: Vec::new(),
        executor_args: Vec::new(),
    })?;
    let specs = (0..args.jobs)
        .map(|i| noop_job(format!("idle-{i}"), sundial_tests::MANUAL_ONLY))
        .collect();
    register(&rig.jobs().await?, specs, 4).await?;
    let url = rig.redis_url().context("idle runs on Redis")?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = commandstats(&url).await?;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.seconds.max(1))).await;
    let after = commandstats(&url).await?;
    let seconds = started.elapsed().as_secs_f64();
    let mut calls = calls_since(&before, &after);
    // The INFO call that took the first reading is not the server's.
    if let Some(info) = calls.get_mut("info") {
        *info -= 1;
    }
    let by_command: BTreeMap<String, f64> = calls
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| (name, n as f64 / seconds))
        .collect();
    let redis_ceiling = RedisCeiling::of(&rig)?;
    Ok(IdleReport {
        scenario: "idle",
        redis_ceiling,
        jobs: args.jobs,
        executors: args.executors,
        seconds,
        commands_per_s: by_command.values().sum(),
        by_command,
    })
}
