//! `sundial-bench`: what users wait for, measured from outside against real processes.
//!
//! Each scenario starts everything it needs (a throwaway `redis-server` without
//! persistence or an embedded store, `sundial serve` processes of this binary's build
//! profile, `test_executor` processes with journals), runs, tears it all down, and
//! prints a table and one line `BENCH {json}`. It fails (exit 1) only when the counts
//! are inconsistent — a run lost, failed, missing or started twice — never on a timing.
//!
//! ```sh
//! cargo run --release -p sundial-tests --bin sundial-bench -- burst --jobs 10000 --executors 10
//! cargo run --release -p sundial-tests --bin sundial-bench -- unary
//! cargo run -p sundial-tests --bin sundial-bench -- --quick all   # the smoke scripts/test runs
//! ```
//!
//! Scenarios built so far: `burst`, `unary`, `idle`, `registered` and `executors` (see
//! their modules); `burst` also counts Redis commands, Redis CPU and server CPU per run.
//! Not built yet: `sustained` (with webhooks) and a `redis-benchmark` reference.

mod burst;
mod idle;
mod registered;
mod rig;
mod stats;
mod streams;
mod unary;

use anyhow::{Result, bail};
use clap::{Parser, Subcommand};
use serde::Serialize;

use crate::burst::BurstArgs;
use crate::idle::IdleArgs;
use crate::registered::RegisteredArgs;
use crate::rig::{Binaries, StoreKind};
use crate::streams::StreamsArgs;
use crate::unary::UnaryArgs;

#[derive(Debug, Parser)]
#[command(name = "sundial-bench")]
struct Cli {
    /// Every scenario at a small size (a smoke test of the counts, not a measurement).
    #[arg(long, global = true)]
    quick: bool,
    /// Run this `sundial` binary instead of the one built next to the bench (e.g. an
    /// older build, for a before/after figure).
    #[arg(long, global = true)]
    sundial_bin: Option<std::path::PathBuf>,
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Debug, Subcommand)]
enum Scenario {
    /// N jobs due in the same second, R rounds: due → handler start, duplicates, spread.
    Burst(BurstArgs),
    /// Single admin calls' round trips (small and ~1 KB messages).
    Unary(UnaryArgs),
    /// Redis commands per second with nothing due (Redis only).
    Idle(IdleArgs),
    /// Redis memory per registered job and the server's RSS (Redis only).
    Registered(RegisteredArgs),
    /// The server's memory per idle executor stream (in-process SDK executors).
    Executors(StreamsArgs),
    /// Every scenario, on every store it supports.
    All,
}

fn emit<T: Serialize>(report: &T) -> Result<()> {
    println!("BENCH {}", serde_json::to_string(report)?);
    Ok(())
}

fn quick_burst(store: StoreKind, instances: usize) -> BurstArgs {
    BurstArgs {
        jobs: 200,
        executors: 2,
        instances,
        rounds: 2,
        interval_s: 5,
        store,
        max_concurrency: 0,
        timeout_s: 120,
    }
}

async fn burst(bins: &Binaries, args: &BurstArgs) -> Result<Vec<String>> {
    let report = burst::run(bins, args).await?;
    report.print();
    emit(&report)?;
    Ok(report.consistency())
}

async fn idle(bins: &Binaries, args: &IdleArgs) -> Result<Vec<String>> {
    let report = idle::run(bins, args).await?;
    report.print();
    emit(&report)?;
    Ok(report.consistency())
}

async fn registered(bins: &Binaries, args: &RegisteredArgs) -> Result<Vec<String>> {
    let report = registered::run(bins, args).await?;
    report.print();
    emit(&report)?;
    Ok(report.consistency())
}

async fn executors(bins: &Binaries, args: &StreamsArgs) -> Result<Vec<String>> {
    let report = streams::run(bins, args).await?;
    report.print();
    emit(&report)?;
    Ok(report.consistency())
}

fn quick_idle() -> IdleArgs {
    IdleArgs {
        jobs: 200,
        executors: 2,
        seconds: 3,
    }
}

async fn unary(bins: &Binaries, args: &UnaryArgs) -> Result<Vec<String>> {
    let report = unary::run(bins, args).await?;
    report.print();
    emit(&report)?;
    Ok(report.consistency())
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let bins = Binaries::build(cli.sundial_bin.clone())?;
    let mut problems = Vec::new();
    match &cli.scenario {
        Scenario::Burst(args) => {
            let args = if cli.quick {
                quick_burst(args.store, args.instances)
            } else {
                args.clone()
            };
            problems.extend(burst(&bins, &args).await?);
        }
        Scenario::Unary(args) => {
            let mut args = args.clone();
            if cli.quick {
                args.calls = 20;
            }
            problems.extend(unary(&bins, &args).await?);
        }
        Scenario::Idle(args) => {
            let args = if cli.quick {
                quick_idle()
            } else {
                args.clone()
            };
            problems.extend(idle(&bins, &args).await?);
        }
        Scenario::Registered(args) => {
            let args = if cli.quick {
                RegisteredArgs { jobs: 200 }
            } else {
                args.clone()
            };
            problems.extend(registered(&bins, &args).await?);
        }
        Scenario::Executors(args) => {
            let mut args = args.clone();
            if cli.quick {
                args.streams = 20;
            }
            problems.extend(executors(&bins, &args).await?);
        }
        Scenario::All => {
            let calls = if cli.quick { 20 } else { 500 };
            let bursts = if cli.quick {
                vec![
                    quick_burst(StoreKind::Redis, 1),
                    quick_burst(StoreKind::Redis, 2),
                    quick_burst(StoreKind::Embedded, 1),
                ]
            } else {
                let full = |store, instances| BurstArgs {
                    store,
                    instances,
                    ..quick_burst(store, instances).with_full_size()
                };
                vec![
                    full(StoreKind::Redis, 1),
                    full(StoreKind::Redis, 2),
                    full(StoreKind::Embedded, 1),
                ]
            };
            for args in &bursts {
                problems.extend(burst(&bins, args).await?);
            }
            for store in [StoreKind::Redis, StoreKind::Embedded] {
                problems.extend(unary(&bins, &UnaryArgs { calls, store }).await?);
            }
            let idle_args = if cli.quick {
                quick_idle()
            } else {
                IdleArgs {
                    jobs: 1000,
                    executors: 10,
                    seconds: 30,
                }
            };
            problems.extend(idle(&bins, &idle_args).await?);
            let jobs = if cli.quick { 200 } else { 10_000 };
            problems.extend(registered(&bins, &RegisteredArgs { jobs }).await?);
            let streams = if cli.quick { 20 } else { 1000 };
            problems.extend(
                executors(
                    &bins,
                    &StreamsArgs {
                        streams,
                        store: StoreKind::Redis,
                    },
                )
                .await?,
            );
        }
    }
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("sundial-bench: inconsistent: {p}");
        }
        bail!("{} inconsistencies", problems.len());
    }
    Ok(())
}
