//! The `sundial` binary: `serve` runs one server instance until SIGINT or SIGTERM; the
//! other subcommands (`job`, `run`, `node`, `app`) are a client of a running server
//! (`sundial_server::cli`).

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use sundial_server::cli;
use sundial_server::config::{Config, Settings};
use sundial_server::telemetry;
use tokio_util::sync::CancellationToken;

/// jemalloc instead of the system allocator: the server allocates and frees many small
/// buffers per run (records, messages, the embedded store's pages), and glibc's malloc
/// took about 15 % of its CPU under load; jemalloc cuts the server's CPU per run by
/// 10-15 % (BENCHMARKS.md). mimalloc saved less and nearly tripled the memory an idle
/// executor stream holds.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "sundial",
    version,
    about = "Sundial: a distributed scheduled-job control plane"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a server instance.
    Serve {
        /// TOML file with the same settings as the flags (flags and SUNDIAL_* win).
        #[arg(long, env = "SUNDIAL_CONFIG")]
        config: Option<std::path::PathBuf>,
        #[command(flatten)]
        settings: Box<Settings>,
    },
    #[command(flatten)]
    Client(cli::Command),
}

fn main() -> ExitCode {
    // `serve --help` shows each setting's default (config::settings).
    let parsed = Cli::command()
        .mut_subcommand("serve", Settings::with_defaults_in_help)
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches));
    let command = match parsed {
        Ok(cli) => cli.command,
        Err(e) => {
            // Help and version are answers, not failures; a usage error exits 1 (the
            // CLI's documented code), not clap's 2 (which means "not found" here).
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 1 } else { 0 });
        }
    };
    match command {
        Command::Serve { config, settings } => match serve(config, *settings) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("Error: {e:?}");
                ExitCode::FAILURE
            }
        },
        // A client makes a call or a few, one after another: one thread does.
        Command::Client(command) => match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => ExitCode::from(runtime.block_on(cli::run(command)) as u8),
            Err(e) => {
                eprintln!("Error: starting the runtime: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Reads the settings, then serves on a runtime of `worker_threads` threads until
/// SIGINT or SIGTERM.
fn serve(config: Option<std::path::PathBuf>, settings: Settings) -> anyhow::Result<()> {
    let file = match config {
        Some(path) => Settings::from_file(&path)?,
        None => Settings::default(),
    };
    let settings = settings.over(file);
    telemetry::init(settings.log_format.unwrap_or_default());
    let config = Config::from_settings(settings)?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.worker_threads)
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(run(config))
}

async fn run(config: Config) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    tokio::spawn(signals(shutdown.clone()));
    sundial_server::server::run(config, shutdown, |bound| {
        // One machine-readable line on stdout, for scripts and test harnesses that
        // start the server on port 0.
        println!(
            "SUNDIAL_READY grpc={} http={}",
            bound.grpc,
            bound
                .http
                .map_or_else(|| "off".to_owned(), |a| a.to_string())
        );
    })
    .await
    .context("server failed")
}

/// SIGINT and SIGTERM are handled together: either starts a graceful shutdown.
async fn signals(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("signal received");
    shutdown.cancel();
}
