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
//! cargo run --release -p sundial-tests --bin sundial-bench -- failover --runs 100
//! cargo run -p sundial-tests --bin sundial-bench -- --quick all   # the smoke (scripts/test runs the workspace build's target/debug/sundial-bench)
//! ```
//!
//! Scenarios: `burst`, `sustained` (with webhooks), `unary`, `idle`, `registered`,
//! `executors`, `failover` and `steps` (see their modules). `burst` and `sustained` also count what a run costs
//! (`cost`): Redis commands, Redis CPU and server CPU per run, read against
//! `redis-benchmark` on the same Redis.

mod burst;
mod cost;
mod failover;
mod idle;
mod registered;
mod rig;
mod stats;
mod steps;
mod streams;
mod sustained;
mod unary;

use anyhow::{Result, bail};
use clap::{Parser, Subcommand};
use serde::Serialize;

use crate::burst::BurstArgs;
use crate::failover::FailoverArgs;
use crate::idle::IdleArgs;
use crate::registered::RegisteredArgs;
use crate::rig::{Binaries, StoreKind};
use crate::steps::StepsArgs;
use crate::streams::StreamsArgs;
use crate::sustained::SustainedArgs;
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
    /// R jobs firing every second for S seconds, with verified webhooks.
    Sustained(SustainedArgs),
    /// Single admin calls' round trips (small and ~1 KB messages).
    Unary(UnaryArgs),
    /// Redis commands per second with nothing due (Redis only).
    Idle(IdleArgs),
    /// Redis memory per registered job and the server's RSS (Redis only).
    Registered(RegisteredArgs),
    /// The server's memory per idle executor stream (in-process SDK executors).
    Executors(StreamsArgs),
    /// An executor SIGKILLed mid-run: kill → its runs' attempt 2 starting elsewhere;
    /// `--freeze`: one SIGSTOPped before a stream of runs: trigger → start.
    Failover(FailoverArgs),
    /// The three hot run steps alone on one Redis, no server: Redis µs per run in
    /// each, commands per run by name, the store client's CPU (Redis only).
    Steps(StepsArgs),
    /// Every scenario, on every store it supports.
    All,
}

/// What every scenario's report does.
trait Report: Serialize {
    /// The human table.
    fn print(&self);
    /// What is wrong with its counts, whatever the timing (empty when they add up).
    fn consistency(&self) -> Vec<String>;
}

/// Prints a report, then its `BENCH` line; answers its inconsistencies.
fn finish<R: Report>(report: &R) -> Result<Vec<String>> {
    report.print();
    println!("BENCH {}", serde_json::to_string(report)?);
    Ok(report.consistency())
}

/// A scenario's arguments as its command line's defaults give them (the full size).
fn defaults<T: clap::Args>() -> T {
    #[derive(Parser)]
    struct Only<T: clap::Args> {
        #[command(flatten)]
        args: T,
    }
    Only::<T>::parse_from(["sundial-bench"]).args
}

fn quick_burst(store: StoreKind, instances: usize) -> BurstArgs {
    BurstArgs {
        jobs: 2000,
        executors: 2,
        instances,
        rounds: 2,
        interval_s: 5,
        store,
        max_concurrency: 0,
        monitor: true,
        timeout_s: 120,
    }
}

fn quick_sustained(store: StoreKind) -> SustainedArgs {
    SustainedArgs {
        rate: 40,
        seconds: 5,
        executors: 2,
        instances: 1,
        store,
        monitor: true,
        timeout_s: 120,
    }
}

fn quick_steps() -> StepsArgs {
    StepsArgs {
        runs: 640,
        jobs: 100,
        batch: 64,
        whole: false,
        // Below the 6.4 runs per job: most begins drop the job's oldest run.
        max_runs_per_job: 3,
    }
}

fn quick_idle() -> IdleArgs {
    IdleArgs {
        jobs: 200,
        executors: 2,
        seconds: 3,
    }
}

fn quick_failover(store: StoreKind) -> FailoverArgs {
    FailoverArgs {
        runs: 20,
        sleep_ms: 1000,
        store,
        disconnect_grace: None,
        freeze: false,
        silent_after: None,
        timeout_s: 60,
    }
}

const QUICK_CALLS: usize = 20;
const QUICK_JOBS: usize = 200;
const QUICK_STREAMS: usize = 20;

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let bins = Binaries::build(cli.sundial_bin.clone())?;
    let quick = cli.quick;
    let mut problems = Vec::new();
    match &cli.scenario {
        Scenario::Burst(args) => {
            let args = if quick {
                quick_burst(args.store, args.instances)
            } else {
                args.clone()
            };
            problems.extend(finish(&burst::run(&bins, &args).await?)?);
        }
        Scenario::Sustained(args) => {
            let args = if quick {
                quick_sustained(args.store)
            } else {
                args.clone()
            };
            problems.extend(finish(&sustained::run(&bins, &args).await?)?);
        }
        Scenario::Unary(args) => {
            let mut args = args.clone();
            if quick {
                args.calls = QUICK_CALLS;
            }
            problems.extend(finish(&unary::run(&bins, &args).await?)?);
        }
        Scenario::Steps(args) => {
            let args = if quick { quick_steps() } else { args.clone() };
            problems.extend(finish(&steps::run(&args).await?)?);
        }
        Scenario::Idle(args) => {
            let args = if quick { quick_idle() } else { args.clone() };
            problems.extend(finish(&idle::run(&bins, &args).await?)?);
        }
        Scenario::Registered(args) => {
            let mut args = args.clone();
            if quick {
                args.jobs = QUICK_JOBS;
            }
            problems.extend(finish(&registered::run(&bins, &args).await?)?);
        }
        Scenario::Executors(args) => {
            let mut args = args.clone();
            if quick {
                args.streams = QUICK_STREAMS;
            }
            problems.extend(finish(&streams::run(&bins, &args).await?)?);
        }
        Scenario::Failover(args) => {
            let args = if quick {
                FailoverArgs {
                    freeze: args.freeze,
                    silent_after: args.silent_after.clone(),
                    disconnect_grace: args.disconnect_grace.clone(),
                    ..quick_failover(args.store)
                }
            } else {
                args.clone()
            };
            if args.freeze {
                problems.extend(finish(&failover::freeze(&bins, &args).await?)?);
            } else {
                problems.extend(finish(&failover::run(&bins, &args).await?)?);
            }
        }
        Scenario::All => {
            for (store, instances) in [
                (StoreKind::Redis, 1),
                (StoreKind::Redis, 2),
                (StoreKind::Embedded, 1),
            ] {
                let args = if quick {
                    quick_burst(store, instances)
                } else {
                    BurstArgs {
                        store,
                        instances,
                        ..defaults()
                    }
                };
                problems.extend(finish(&burst::run(&bins, &args).await?)?);
            }
            for store in [StoreKind::Redis, StoreKind::Embedded] {
                let args = if quick {
                    quick_sustained(store)
                } else {
                    SustainedArgs {
                        store,
                        ..defaults()
                    }
                };
                problems.extend(finish(&sustained::run(&bins, &args).await?)?);
            }
            for store in [StoreKind::Redis, StoreKind::Embedded] {
                let mut args = UnaryArgs {
                    store,
                    ..defaults()
                };
                if quick {
                    args.calls = QUICK_CALLS;
                }
                problems.extend(finish(&unary::run(&bins, &args).await?)?);
            }
            let args = if quick { quick_steps() } else { defaults() };
            problems.extend(finish(&steps::run(&args).await?)?);
            let args = if quick { quick_idle() } else { defaults() };
            problems.extend(finish(&idle::run(&bins, &args).await?)?);
            let mut args: RegisteredArgs = defaults();
            if quick {
                args.jobs = QUICK_JOBS;
            }
            problems.extend(finish(&registered::run(&bins, &args).await?)?);
            let mut args: StreamsArgs = defaults();
            if quick {
                args.streams = QUICK_STREAMS;
            }
            problems.extend(finish(&streams::run(&bins, &args).await?)?);
            for store in [StoreKind::Redis, StoreKind::Embedded] {
                let args = if quick {
                    quick_failover(store)
                } else {
                    FailoverArgs {
                        store,
                        ..defaults()
                    }
                };
                problems.extend(finish(&failover::run(&bins, &args).await?)?);
                let freeze = FailoverArgs {
                    freeze: true,
                    ..args
                };
                problems.extend(finish(&failover::freeze(&bins, &freeze).await?)?);
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_size_is_the_command_lines_defaults() {
        let burst: BurstArgs = defaults();
        assert_eq!((burst.jobs, burst.executors, burst.rounds), (10_000, 10, 2));
        let sustained: SustainedArgs = defaults();
        assert_eq!((sustained.rate, sustained.seconds), (1000, 30));
        let idle: IdleArgs = defaults();
        assert_eq!((idle.jobs, idle.executors, idle.seconds), (1000, 10, 30));
        assert_eq!(defaults::<RegisteredArgs>().jobs, 10_000);
        assert_eq!(defaults::<StreamsArgs>().streams, 1000);
        assert_eq!(defaults::<UnaryArgs>().calls, 500);
        let failover: FailoverArgs = defaults();
        assert_eq!((failover.runs, failover.sleep_ms), (100, 3000));
    }
}
