//! `registered`: what N registered jobs cost at rest: Redis `used_memory` per job and
//! the server's resident memory, with no executor and nothing due.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::cost::RedisCeiling;
use crate::rig::{Binaries, Rig, RigSpec, StoreKind, info_field, noop_job, redis_info, register};

#[derive(Debug, Clone, clap::Args)]
pub struct RegisteredArgs {
    #[arg(long, default_value_t = 10_000)]
    pub jobs: usize,
}

#[derive(Debug, Serialize)]
pub struct RegisteredReport {
    pub scenario: &'static str,
    pub jobs: usize,
    pub register_ms: u128,
    pub redis_bytes_per_job: f64,
    pub server_rss_before_kib: u64,
    pub server_rss_after_kib: u64,
    pub jobs_listed: usize,
    /// `redis-benchmark` on the same Redis, after the measurement (none on embedded).
    pub redis_ceiling: Option<RedisCeiling>,
}

impl crate::Report for RegisteredReport {
    fn print(&self) {
        println!(
            "registered: {} jobs in {} ms; Redis {:.0} bytes per job; server RSS {} KiB before, {} KiB after",
            self.jobs,
            self.register_ms,
            self.redis_bytes_per_job,
            self.server_rss_before_kib,
            self.server_rss_after_kib
        );
        RedisCeiling::print(self.redis_ceiling);
    }

    fn consistency(&self) -> Vec<String> {
        if self.jobs_listed == self.jobs {
            Vec::new()
        } else {
            vec![format!(
                "registered: {} of {} jobs listed",
                self.jobs_listed, self.jobs
            )]
        }
    }
}

async fn used_memory(url: &str) -> Result<u64> {
    let info = redis_info(url, "memory").await?;
    info_field(&info, "used_memory")
        .map(|v| v as u64)
        .context("INFO memory without used_memory")
}

/// VmRSS of a process, KiB.
pub fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS")
}

pub async fn run(bins: &Binaries, args: &RegisteredArgs) -> Result<RegisteredReport> {
    let rig = Rig::start(&RigSpec {
        bins,
        store: StoreKind::Redis,
        instances: 1,
        executors: 0,
        server_args: Vec::new(),
        executor_args: Vec::new(),
    })?;
    let url = rig.redis_url().context("registered runs on Redis")?;
    let pid = rig.instances[0].pid();
    let mut jobs = rig.jobs().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mem_before = used_memory(&url).await?;
    let rss_before = rss_kib(pid)?;
    let specs = (0..args.jobs)
        .map(|i| noop_job(format!("registered-{i}"), sundial_tests::MANUAL_ONLY))
        .collect();
    let started = Instant::now();
    register(&jobs, specs, 4).await?;
    let took = started.elapsed();
    // A few scheduler passes over the new jobs (it caches their plans).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mem_after = used_memory(&url).await?;
    let rss_after = rss_kib(pid)?;
    let listed = sundial_tests::all_jobs(&mut jobs).await?.len();
    let redis_ceiling = RedisCeiling::of(&rig)?;
    Ok(RegisteredReport {
        scenario: "registered",
        redis_ceiling,
        jobs: args.jobs,
        register_ms: took.as_millis(),
        redis_bytes_per_job: mem_after.saturating_sub(mem_before) as f64 / args.jobs.max(1) as f64,
        server_rss_before_kib: rss_before,
        server_rss_after_kib: rss_after,
        jobs_listed: listed,
    })
}
