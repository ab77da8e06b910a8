//! The executor process the end-to-end fault tests start, built on `sundial-sdk`.
//!
//! Handlers: `noop` (empty output), `echo` (the payload), `sleep` (payload = ASCII
//! milliseconds; stops early when cancelled, answering CANCELLED), `fail` (always
//! FAILED, code `boom`), `flaky` (FAILED on attempt 1, then succeeds), `shard`
//! (output `<shard_index>/<shard_total>`), `ticks` (payload = ASCII count N: writes the
//! log line `tick <i>` every 300 ms, N times, then succeeds). With `--failing`, every handler fails; with
//! `--failing-while FILE`, every handler fails while FILE exists.
//!
//! With `--journal <path>` every handler start and return is appended as one line,
//! written and flushed at once, so that a SIGKILLed process leaves only whole lines:
//!
//! ```text
//! start <schedule_id> <attempt> <token> <node_id> <unix_ms>
//! finish <schedule_id> <attempt> <token> <node_id> <unix_ms> <SUCCEEDED|FAILED|CANCELLED>
//! ```
//!
//! Prints `TEST_EXECUTOR_READY <node_id>` on stdout once a server first welcomed it.
//! SIGTERM or SIGINT drains: no new runs, running ones finish, then it exits 0.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use sundial_sdk::{CancellationToken, Executor, ExecutorBuilder, HandlerError, RunContext};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Debug, Parser)]
struct Args {
    /// A server endpoint (`http://host:port` or `https://host:port`); repeat for
    /// failover.
    #[arg(long = "endpoint", required = true)]
    endpoints: Vec<String>,
    #[arg(long)]
    group: String,
    /// Default: `test-executor-<pid>`.
    #[arg(long)]
    node_id: Option<String>,
    /// 0 = unlimited.
    #[arg(long, default_value_t = 0)]
    max_concurrency: u32,
    #[arg(long, default_value = "")]
    token: String,
    /// Append start/finish lines here.
    #[arg(long)]
    journal: Option<PathBuf>,
    /// Every handler fails (code `boom`): a sick node.
    #[arg(long)]
    failing: bool,
    /// Every handler fails while this file exists: a node that falls sick and recovers.
    #[arg(long)]
    failing_while: Option<PathBuf>,
    /// How long a shutdown waits for running handlers and acknowledgements.
    #[arg(long, default_value_t = 30_000)]
    shutdown_grace_ms: u64,
    /// A PEM CA to trust for `https://` endpoints (a private CA).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
}

/// The journal file, shared by every handler.
#[derive(Clone)]
struct Journal {
    file: Option<Arc<Mutex<File>>>,
    node_id: String,
}

impl Journal {
    fn open(path: Option<&PathBuf>, node_id: &str) -> Result<Self> {
        let file = match path {
            Some(p) => Some(Arc::new(Mutex::new(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .with_context(|| format!("opening the journal {}", p.display()))?,
            ))),
            None => None,
        };
        Ok(Self {
            file,
            node_id: node_id.to_owned(),
        })
    }

    /// One whole line per write, flushed before the handler goes on.
    fn record(&self, event: &str, ctx: &RunContext, status: Option<&str>) {
        let Some(file) = &self.file else { return };
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let mut line = format!(
            "{event} {} {} {} {} {unix_ms}",
            ctx.schedule_id(),
            ctx.attempt(),
            ctx.fencing_token(),
            self.node_id
        );
        if let Some(status) = status {
            line.push(' ');
            line.push_str(status);
        }
        line.push('\n');
        let mut file = file.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Err(e) = file.write_all(line.as_bytes()).and_then(|()| file.flush()) {
            eprintln!("test_executor: journal write failed: {e}");
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Behaviour {
    Noop,
    Echo,
    Sleep,
    Fail,
    Flaky,
    Shard,
    Ticks,
}

async fn behave(ctx: &RunContext, behaviour: Behaviour) -> Result<Vec<u8>, HandlerError> {
    match behaviour {
        Behaviour::Noop => Ok(Vec::new()),
        Behaviour::Echo => Ok(ctx.payload().to_vec()),
        Behaviour::Sleep => {
            let text = std::str::from_utf8(ctx.payload())?.trim();
            let ms: u64 = text.parse().map_err(|_| {
                HandlerError::new("bad_payload", format!("not milliseconds: {text:?}"))
            })?;
            ctx.info(format!("sleeping {ms} ms"));
            ctx.until_cancelled(tokio::time::sleep(Duration::from_millis(ms)))
                .await?;
            Ok(Vec::new())
        }
        Behaviour::Fail => Err(HandlerError::new("boom", "this handler always fails")),
        Behaviour::Flaky if ctx.attempt() <= 1 => {
            Err(HandlerError::new("flaky", "fails on the first attempt"))
        }
        Behaviour::Flaky => Ok(Vec::new()),
        Behaviour::Shard => Ok(format!("{}/{}", ctx.shard_index(), ctx.shard_total()).into_bytes()),
        Behaviour::Ticks => {
            let text = std::str::from_utf8(ctx.payload())?.trim();
            let n: u32 = text
                .parse()
                .map_err(|_| HandlerError::new("bad_payload", format!("not a count: {text:?}")))?;
            for i in 1..=n {
                ctx.info(format!("tick {i}"));
                ctx.until_cancelled(tokio::time::sleep(Duration::from_millis(300)))
                    .await?;
            }
            Ok(Vec::new())
        }
    }
}

fn register(
    builder: ExecutorBuilder,
    name: &str,
    behaviour: Behaviour,
    journal: &Journal,
    failing_while: Option<PathBuf>,
) -> ExecutorBuilder {
    let journal = journal.clone();
    builder.handler(name, move |ctx: RunContext| {
        let journal = journal.clone();
        let sick = failing_while.as_ref().is_some_and(|f| f.exists());
        async move {
            journal.record("start", &ctx, None);
            let behaviour = if sick { Behaviour::Fail } else { behaviour };
            let result = behave(&ctx, behaviour).await;
            let status = match &result {
                Ok(_) => "SUCCEEDED",
                Err(e) if e.is_cancelled() => "CANCELLED",
                Err(_) => "FAILED",
            };
            journal.record("finish", &ctx, Some(status));
            result
        }
    })
}

// One thread: its handlers are light, and the tests and benchmarks start ten of these
// on two cores, where a multi-thread runtime's workers spend their time waking each
// other (`sundial-bench burst --jobs 10000`: 45-49 µs of CPU per run on the default
// runtime, 30 µs on this one; see sundial-sdk's "Choosing a runtime").
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    let node_id = args
        .node_id
        .unwrap_or_else(|| format!("test-executor-{}", std::process::id()));
    let journal = Journal::open(args.journal.as_ref(), &node_id)?;

    let mut builder = Executor::builder()
        .group(args.group)
        .node_id(node_id.clone())
        .token(args.token)
        .max_concurrency(args.max_concurrency)
        .shutdown_grace(Duration::from_millis(args.shutdown_grace_ms))
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500));
    if let Some(ca) = &args.tls_ca {
        let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
        builder = builder.tls_ca_pem(pem);
    }
    for endpoint in args.endpoints {
        builder = builder.endpoint(endpoint);
    }
    for (name, behaviour) in [
        ("noop", Behaviour::Noop),
        ("echo", Behaviour::Echo),
        ("sleep", Behaviour::Sleep),
        ("fail", Behaviour::Fail),
        ("flaky", Behaviour::Flaky),
        ("shard", Behaviour::Shard),
        ("ticks", Behaviour::Ticks),
    ] {
        let behaviour = if args.failing {
            Behaviour::Fail
        } else {
            behaviour
        };
        builder = register(
            builder,
            name,
            behaviour,
            &journal,
            args.failing_while.clone(),
        );
    }
    let executor = builder.build()?;

    let mut connected = executor.connected();
    tokio::spawn(async move {
        if connected.wait_for(Option::is_some).await.is_ok() {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "TEST_EXECUTOR_READY {node_id}");
            let _ = out.flush();
        }
    });

    let shutdown = CancellationToken::new();
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let stop = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        stop.cancel();
    });
    executor.run(shutdown).await?;
    Ok(())
}
