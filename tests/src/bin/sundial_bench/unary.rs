//! `unary`: round trips of single admin calls from one client, one after another:
//! `CreateJob` with a small and a ~1 KB spec, `GetJob` of the ~1 KB job, `GetRun`.
//! What Nagle's algorithm meeting delayed ACKs shows up in (answers over one segment).

use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;
use sundial_proto::v1 as pb;

use crate::cost::RedisCeiling;
use crate::rig::{Binaries, Rig, RigSpec, StoreKind, noop_job};
use crate::stats::Spread;

#[derive(Debug, Clone, clap::Args)]
pub struct UnaryArgs {
    /// Calls of each kind.
    #[arg(long, default_value_t = 500)]
    pub calls: usize,
    #[arg(long, value_enum, default_value_t = StoreKind::Redis)]
    pub store: StoreKind,
}

#[derive(Debug, Serialize)]
pub struct UnaryReport {
    pub scenario: &'static str,
    pub store: &'static str,
    /// Round trips in µs.
    pub create_small_us: Spread,
    pub create_1kb_us: Spread,
    pub get_job_1kb_us: Spread,
    pub get_run_us: Spread,
    /// `redis-benchmark` on the same Redis, after the measurement (none on embedded).
    pub redis_ceiling: Option<RedisCeiling>,
}

impl crate::Report for UnaryReport {
    fn print(&self) {
        println!("unary: store {}, µs per round trip", self.store);
        for (what, s) in [
            ("CreateJob, small spec", &self.create_small_us),
            ("CreateJob, ~1 KB spec", &self.create_1kb_us),
            ("GetJob, ~1 KB answer", &self.get_job_1kb_us),
            ("GetRun", &self.get_run_us),
        ] {
            println!(
                "  {what:<24} p50 {:>7} / p99 {:>7} / max {:>7} over {}",
                s.p50, s.p99, s.max, s.n
            );
        }
        RedisCeiling::print(self.redis_ceiling);
    }

    fn consistency(&self) -> Vec<String> {
        let mut bad = Vec::new();
        for (what, s, want) in [
            ("create small", &self.create_small_us, 1),
            ("create 1kb", &self.create_1kb_us, 1),
            ("get job", &self.get_job_1kb_us, 1),
            ("get run", &self.get_run_us, 1),
        ] {
            if s.n < want {
                bad.push(format!("no {what} call measured"));
            }
        }
        bad
    }
}

fn job(id: String, payload: usize) -> pb::JobSpec {
    pb::JobSpec {
        payload: vec![b'x'; payload],
        ..noop_job(id, sundial_tests::MANUAL_ONLY)
    }
}

pub async fn run(bins: &Binaries, args: &UnaryArgs) -> Result<UnaryReport> {
    let rig = Rig::start(&RigSpec {
        bins,
        store: args.store,
        instances: 1,
        executors: 0,
        server_args: Vec::new(),
        executor_args: Vec::new(),
    })?;
    let mut jobs = rig.jobs().await?;
    let mut runs = rig.instances[0].runs().await?;
    let mut create_small = Vec::with_capacity(args.calls);
    let mut create_big = Vec::with_capacity(args.calls);
    let mut get_job = Vec::with_capacity(args.calls);
    let mut get_run = Vec::with_capacity(args.calls);
    let micros = |t: Instant| i64::try_from(t.elapsed().as_micros()).unwrap_or(i64::MAX);
    for i in 0..args.calls {
        let t = Instant::now();
        jobs.create_job(pb::CreateJobRequest {
            spec: Some(job(format!("unary-s-{i}"), 0)),
        })
        .await?;
        create_small.push(micros(t));
        let t = Instant::now();
        jobs.create_job(pb::CreateJobRequest {
            spec: Some(job(format!("unary-b-{i}"), 1000)),
        })
        .await?;
        create_big.push(micros(t));
    }
    for i in 0..args.calls {
        let t = Instant::now();
        jobs.get_job(pb::GetJobRequest {
            job_id: format!("unary-b-{i}"),
        })
        .await?;
        get_job.push(micros(t));
    }
    let sid = rig.instances[0].trigger("unary-s-0").await?;
    // The run is recorded when the dispatcher takes the trigger: wait for it.
    sundial_tests::wait_for(
        "the triggered run",
        std::time::Duration::from_secs(10),
        || {
            let server = &rig.instances[0];
            let sid = sid.clone();
            async move { Ok(server.run(&sid).await.ok()) }
        },
    )
    .await?;
    for _ in 0..args.calls {
        let t = Instant::now();
        runs.get_run(pb::GetRunRequest {
            schedule_id: sid.clone(),
        })
        .await?
        .into_inner()
        .run
        .context("GetRun answered without a run")?;
        get_run.push(micros(t));
    }
    let redis_ceiling = RedisCeiling::of(&rig)?;
    Ok(UnaryReport {
        scenario: "unary",
        redis_ceiling,
        store: args.store.name(),
        create_small_us: Spread::of(create_small),
        create_1kb_us: Spread::of(create_big),
        get_job_1kb_us: Spread::of(get_job),
        get_run_us: Spread::of(get_run),
    })
}
