//! A small Sundial executor: two handlers, graceful shutdown on Ctrl-C or SIGTERM.

use std::time::Duration;

use clap::Parser;
use sundial_sdk::{CancellationToken, Executor, HandlerError, LogLevel, RunContext};

#[derive(Debug, Parser)]
#[command(about = "A Sundial executor serving the `hello` and `sleep` handlers")]
struct Args {
    /// A server's gRPC endpoint; repeat for failover.
    #[arg(
        long = "endpoint",
        required = true,
        env = "SUNDIAL_ENDPOINT",
        value_delimiter = ','
    )]
    endpoints: Vec<String>,
    /// The executor group to serve.
    #[arg(long, default_value = "demo")]
    group: String,
    /// A stable node id (default: generated from the group and the process id).
    #[arg(long)]
    node_id: Option<String>,
    /// The group's executor token.
    #[arg(long, env = "SUNDIAL_EXECUTOR_TOKEN", default_value = "")]
    token: String,
    /// At most this many runs at once (0 = the server's default window, 64).
    #[arg(long, default_value_t = 4)]
    max_concurrency: u32,
}

/// Greets whoever the payload names.
async fn hello(ctx: RunContext) -> Result<Vec<u8>, HandlerError> {
    let name = match std::str::from_utf8(ctx.payload())?.trim() {
        "" => "world",
        name => name,
    };
    ctx.log(
        LogLevel::Info,
        format!(
            "greeting {name} for {} (attempt {})",
            ctx.schedule_id(),
            ctx.attempt()
        ),
    );
    Ok(format!("hello, {name}").into_bytes())
}

/// Sleeps for the payload's milliseconds in four steps, reporting progress, and stops
/// as soon as the run is cancelled (by the server, or because its lease was lost).
async fn sleep(ctx: RunContext) -> Result<Vec<u8>, HandlerError> {
    let text = std::str::from_utf8(ctx.payload())?.trim();
    let ms: u64 = text
        .parse()
        .map_err(|_| HandlerError::new("bad_payload", format!("not milliseconds: {text:?}")))?;
    ctx.info(format!("sleeping {ms} ms"));
    for quarter in 1..=4u32 {
        ctx.until_cancelled(tokio::time::sleep(Duration::from_millis(ms / 4)))
            .await?;
        ctx.progress(
            quarter * 25,
            format!("{} of {ms} ms", ms / 4 * u64::from(quarter)),
        );
    }
    Ok(format!("slept {ms} ms").into_bytes())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();

    let mut builder = Executor::builder()
        .group(args.group)
        .token(args.token)
        .max_concurrency(args.max_concurrency)
        .handler("hello", hello)
        .handler("sleep", sleep);
    for endpoint in args.endpoints {
        builder = builder.endpoint(endpoint);
    }
    if let Some(id) = args.node_id {
        builder = builder.node_id(id);
    }
    let executor = builder.build()?;

    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    executor.run(shutdown).await?;
    Ok(())
}

/// Ctrl-C or SIGTERM: drain and exit.
async fn stop_on_signal(shutdown: CancellationToken) {
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
    shutdown.cancel();
}
