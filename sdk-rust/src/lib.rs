//! The Sundial executor SDK for Rust.
//!
//! An [`Executor`] serves one executor group with handlers registered by name. It
//! connects to one of its endpoints over the `ExecutorService.Connect` stream, says
//! hello, heartbeats at the interval the server asks for, and executes the runs the
//! server dispatches:
//!
//! - each run calls its handler, an async function of a [`RunContext`] (schedule id,
//!   attempt, fencing token, payload, route key, shard, deadline, a cancellation
//!   signal, log lines) returning output bytes or a [`HandlerError`]; a handler that
//!   panics is reported FAILED with code `"panic"`;
//! - at most `max_concurrency` dispatches are held at once, its window
//!   ([`DEFAULT_WINDOW`] unless set), which `Hello` tells the server: the server
//!   sends no more than that, and the runs beyond it wait in the store (a dispatch
//!   beyond it is rejected as `"busy"`, an unknown handler as
//!   `"unknown handler: <name>"`);
//! - a handler starts only on the server's go-ahead: an admitted dispatch is answered
//!   with `Started`, and the handler begins when `StartAck` says the lease is still
//!   current. A dispatch that waited past its lease (say, unread while the process
//!   was frozen) is dropped without starting, as is one whose answer never came
//!   because the stream broke;
//! - every heartbeat lists the runs still executing, so the server renews exactly
//!   those leases. A handler whose lease is gone, or ran out on this process's own
//!   monotonic clock without renewal (for example while no server can be reached), is
//!   cancelled: self-fencing;
//! - a result is kept until the server acknowledges it and is sent again after a
//!   reconnect; a run's log lines are batched and always sent before its result;
//! - it reconnects with jittered backoff, started over (from its minimum) and to an
//!   endpoint the server suggested, if any, after a go-away;
//! - on `Drain` (until an `Undrain`), or when shut down, it takes no new work and
//!   finishes what runs (shutdown waits at most a grace period).
//!
//! Admin callers that sign as an app use [`app_auth::AppSigner`] (REST and gRPC).
//!
//! Receivers of Sundial's result webhooks verify them with [`webhook::Verifier`]; the
//! [`webhook`] module also holds the signing functions the server uses.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use sundial_sdk::{CancellationToken, Executor, HandlerError, LogLevel, RunContext};
//!
//! /// Sends the invoice named by the payload.
//! async fn invoice(ctx: RunContext) -> Result<Vec<u8>, HandlerError> {
//!     let customer = std::str::from_utf8(ctx.payload())?;
//!     if customer.is_empty() {
//!         return Err(HandlerError::new("bad_payload", "no customer given"));
//!     }
//!     ctx.log(LogLevel::Info, format!("invoicing {customer} (attempt {})", ctx.attempt()));
//!     // Stop early if the run is cancelled or its lease is lost.
//!     ctx.until_cancelled(tokio::time::sleep(Duration::from_millis(200))).await?;
//!     Ok(format!("invoice sent to {customer}").into_bytes())
//! }
//!
//! # async fn demo() -> Result<(), sundial_sdk::Error> {
//! let executor = Executor::builder()
//!     .endpoint("http://127.0.0.1:50051")
//!     .endpoint("http://127.0.0.1:50052")
//!     .group("billing")
//!     .node_id("billing-worker-1")
//!     .token("executor-token-of-billing")
//!     .max_concurrency(4)
//!     .handler("invoice", invoice)
//!     .handler("ping", |_ctx| async { Ok(b"pong".to_vec()) })
//!     .build()?;
//!
//! let shutdown = CancellationToken::new();
//! let stop = shutdown.clone();
//! tokio::spawn(async move {
//!     let _ = tokio::signal::ctrl_c().await;
//!     stop.cancel();
//! });
//! executor.run(shutdown).await
//! # }
//! ```
//!
//! # Choosing a runtime
//!
//! The executor runs on the Tokio runtime it is started on. Handlers that are light
//! (they await I/O and return) run best on a current-thread runtime
//! (`#[tokio::main(flavor = "current_thread")]`): the stream, the heartbeats and the
//! handlers then share one thread instead of waking each other across worker threads.
//! Measured with ten executor processes of no-op handlers on a 2-core machine
//! (`sundial-bench burst --jobs 10000`): about 30 µs of CPU per run on a current-thread
//! runtime, 45–49 µs on the default multi-thread one. Handlers that compute for long
//! stretches want the multi-thread runtime (or `spawn_blocking`), so one does not hold
//! up the others, the heartbeats among them.

pub mod app_auth;
mod connection;
mod context;
mod executor;
mod handler;
mod logs;
mod runs;
pub mod webhook;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::Duration;

pub use context::{HandlerError, LogLevel, RunContext};
pub use executor::{Connected, Executor};
pub use handler::HandlerResult;
pub use sundial_proto::v1 as proto;
pub use tokio_util::sync::CancellationToken;

use handler::Handler;

/// The window an executor asks for when `max_concurrency` is not set (the server
/// applies the same figure to a `Hello` with `max_concurrency` 0).
pub const DEFAULT_WINDOW: u32 = 64;

/// Why an executor could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{field}: {reason}")]
    Config { field: &'static str, reason: String },
}

/// Builds an [`Executor`]; see the crate docs for an example.
#[derive(Debug, Clone, Default)]
pub struct ExecutorBuilder {
    endpoints: Vec<String>,
    group: String,
    node_id: Option<String>,
    handlers: Vec<(String, Handler)>,
    token: String,
    weight: u32,
    max_concurrency: u32,
    labels: BTreeMap<String, String>,
    backoff: Option<(Duration, Duration)>,
    shutdown_grace: Option<Duration>,
    tls: connection::ClientTls,
}

impl ExecutorBuilder {
    /// A server to connect to (`http://host:port`, or `https://host:port` for TLS);
    /// give several for failover.
    pub fn endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoints.push(url.into());
        self
    }

    /// The executor group this process serves.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = group.into();
        self
    }

    /// A stable node id, reused across reconnects (default: `<group>-<pid>-<random>`).
    pub fn node_id(mut self, id: impl Into<String>) -> Self {
        self.node_id = Some(id.into());
        self
    }

    /// Registers the handler for runs dispatched to `name`: an async function that
    /// receives the run's [`RunContext`] and returns its output or a
    /// [`HandlerError`].
    ///
    /// ```
    /// use sundial_sdk::{Executor, HandlerError, RunContext};
    ///
    /// async fn echo(ctx: RunContext) -> Result<Vec<u8>, HandlerError> {
    ///     Ok(ctx.payload().to_vec())
    /// }
    ///
    /// let builder = Executor::builder()
    ///     .handler("echo", echo)
    ///     .handler("noop", |_ctx| async { Ok(Vec::new()) });
    /// # let _ = builder;
    /// ```
    pub fn handler<F, Fut>(mut self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(RunContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        self.handlers.push((name.into(), Handler::new(f)));
        self
    }

    /// The group's executor token.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = token.into();
        self
    }

    /// Weight for weighted round robin (default 1).
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// The executor's window: at most this many dispatches held at once (waiting for
    /// their go-ahead or executing); 0 = [`DEFAULT_WINDOW`], the default. The server
    /// sends no more than that (the window is sent in `Hello`); a dispatch beyond it
    /// (a cancelled handler still winding down) is rejected as `"busy"`, which routes
    /// it again without spending an attempt.
    pub fn max_concurrency(mut self, n: u32) -> Self {
        self.max_concurrency = n;
        self
    }

    /// A label the server may route on.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Reconnect backoff: starts at `min`, doubles up to `max`, with jitter (default
    /// 100 ms to 5 s).
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff = Some((min, max.max(min)));
        self
    }

    /// How long shutdown waits for running handlers and result acknowledgements
    /// before it gives up on them (default 30 s).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = Some(grace);
        self
    }

    /// Trusts the CA certificates in this PEM, besides the public (webpki) roots,
    /// for `https://` endpoints: for servers whose certificate a private CA signed.
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca_pem = Some(pem.into());
        self
    }

    /// Presents this client certificate chain and key (PEM) to `https://` endpoints
    /// that ask for one (a server started with `--tls-client-ca`).
    pub fn tls_identity(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    pub fn build(self) -> Result<Executor, Error> {
        let config = |field, reason: String| Error::Config { field, reason };
        if self.endpoints.is_empty() {
            return Err(config(
                "endpoint",
                "at least one endpoint is required".into(),
            ));
        }
        if self.group.is_empty() {
            return Err(config("group", "required".into()));
        }
        if self.handlers.is_empty() {
            return Err(config("handler", "at least one handler is required".into()));
        }
        // A cheap check that catches a wrong file; rustls parses it on connect.
        let has =
            |pem: &[u8], needle: &str| pem.windows(needle.len()).any(|w| w == needle.as_bytes());
        if let Some(ca) = &self.tls.ca_pem
            && !has(ca, "-----BEGIN CERTIFICATE-----")
        {
            return Err(config("tls_ca_pem", "no PEM CERTIFICATE found".into()));
        }
        if let Some((cert, key)) = &self.tls.identity {
            if !has(cert, "-----BEGIN CERTIFICATE-----") {
                return Err(config("tls_identity", "no PEM CERTIFICATE found".into()));
            }
            if !(has(key, "-----BEGIN ") && has(key, "PRIVATE KEY-----")) {
                return Err(config("tls_identity", "no PEM PRIVATE KEY found".into()));
            }
        }
        let mut handlers = HashMap::new();
        for (name, handler) in self.handlers {
            if name.is_empty() {
                return Err(config("handler", "a handler name must not be empty".into()));
            }
            if handlers.contains_key(&name) {
                return Err(config("handler", format!("{name:?} is registered twice")));
            }
            handlers.insert(name, handler);
        }
        let mut names: Vec<String> = handlers.keys().cloned().collect();
        names.sort();
        let node_id = self.node_id.unwrap_or_else(|| {
            format!(
                "{}-{}-{:06x}",
                self.group,
                std::process::id(),
                rand::random::<u32>() & 0xff_ffff
            )
        });
        let (min, max) = self
            .backoff
            .unwrap_or((Duration::from_millis(100), Duration::from_secs(5)));
        let settings = executor::Settings {
            endpoints: self.endpoints,
            hello: proto::Hello {
                node_id,
                group: self.group,
                handlers: names,
                weight: self.weight.max(1),
                max_concurrency: match self.max_concurrency {
                    0 => DEFAULT_WINDOW,
                    n => n,
                },
                labels: self.labels.into_iter().collect(),
                token: self.token,
                sdk: concat!("sundial-sdk-rust/", env!("CARGO_PKG_VERSION")).to_owned(),
                in_flight: Vec::new(),
            },
            backoff_min: min,
            backoff_max: max,
            shutdown_grace: self.shutdown_grace.unwrap_or(Duration::from_secs(30)),
            tls: self.tls,
        };
        Ok(Executor::new(settings, handlers))
    }
}

impl Executor {
    /// Starts building an executor.
    pub fn builder() -> ExecutorBuilder {
        ExecutorBuilder::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn noop(_ctx: RunContext) -> HandlerResult {
        Ok(Vec::new())
    }

    #[test]
    fn builder_names_the_missing_field() {
        let err = |b: ExecutorBuilder| b.build().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err(Executor::builder()).starts_with("endpoint:"));
        assert!(err(Executor::builder().endpoint("http://x:1")).starts_with("group:"));
        assert!(err(Executor::builder().endpoint("http://x:1").group("g")).starts_with("handler:"));
        let twice = Executor::builder()
            .endpoint("http://x:1")
            .group("g")
            .handler("h", noop)
            .handler("h", noop);
        assert_eq!(err(twice), "handler: \"h\" is registered twice");
        let ok = Executor::builder()
            .endpoint("http://x:1")
            .group("g")
            .node_id("n")
            .handler("h", noop)
            .build();
        assert_eq!(ok.as_ref().map(Executor::node_id).ok(), Some("n"));
        let valid = || {
            Executor::builder()
                .endpoint("https://x:1")
                .group("g")
                .handler("h", noop)
        };
        assert_eq!(
            err(valid().tls_ca_pem("not a pem")),
            "tls_ca_pem: no PEM CERTIFICATE found"
        );
        assert!(
            err(valid().tls_identity("-----BEGIN CERTIFICATE-----", "x"))
                .starts_with("tls_identity:")
        );
        assert!(
            valid()
                .tls_ca_pem("-----BEGIN CERTIFICATE-----\n")
                .build()
                .is_ok()
        );
    }
}
