//! The Sundial executor SDK for Rust.
//!
//! What works today: the connection. An [`Executor`] connects to one of its endpoints
//! over the `ExecutorService.Connect` stream, says hello (node id, group, handlers,
//! weight, max concurrency, labels, token), heartbeats at the interval the server
//! asks for, and reconnects with jittered backoff — to the next endpoint when the
//! server sends `GoAway` or the stream breaks — until it is shut down.
//!
//! Not yet: running handlers. The server does not dispatch runs yet (the executors
//! issue); should a `Dispatch` arrive, this version answers `Reject` ("this executor
//! SDK does not run handlers yet") so the server can route the run elsewhere.
//!
//! ```no_run
//! # async fn demo() -> Result<(), sundial_sdk::Error> {
//! let executor = sundial_sdk::Executor::builder()
//!     .endpoint("http://127.0.0.1:50051")
//!     .endpoint("http://127.0.0.1:50052")
//!     .group("billing")
//!     .node_id("billing-worker-1")
//!     .handler("invoice")
//!     .max_concurrency(4)
//!     .build()?;
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! executor.run(shutdown).await
//! # }
//! ```

mod connection;

use std::collections::BTreeMap;
use std::time::Duration;

pub use connection::Executor;
pub use sundial_proto::v1 as proto;

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
    handlers: Vec<String>,
    token: String,
    weight: u32,
    max_concurrency: u32,
    labels: BTreeMap<String, String>,
    backoff: Option<(Duration, Duration)>,
}

impl ExecutorBuilder {
    /// A server to connect to (`http://host:port`); give several for failover.
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

    /// A handler name this executor serves.
    pub fn handler(mut self, name: impl Into<String>) -> Self {
        self.handlers.push(name.into());
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

    /// At most this many runs at once (0 = unlimited).
    pub fn max_concurrency(mut self, n: u32) -> Self {
        self.max_concurrency = n;
        self
    }

    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Reconnect backoff: starts at `min`, doubles up to `max`, with jitter.
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff = Some((min, max.max(min)));
        self
    }

    pub fn build(self) -> Result<Executor, Error> {
        let config = |field, reason: &str| Error::Config {
            field,
            reason: reason.to_owned(),
        };
        if self.endpoints.is_empty() {
            return Err(config("endpoint", "at least one endpoint is required"));
        }
        if self.group.is_empty() {
            return Err(config("group", "required"));
        }
        if self.handlers.is_empty() {
            return Err(config("handler", "at least one handler is required"));
        }
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
        Ok(Executor::new(connection::Settings {
            endpoints: self.endpoints,
            hello: proto::Hello {
                node_id,
                group: self.group,
                handlers: self.handlers,
                weight: self.weight.max(1),
                max_concurrency: self.max_concurrency,
                labels: self.labels.into_iter().collect(),
                token: self.token,
                sdk: concat!("sundial-sdk-rust/", env!("CARGO_PKG_VERSION")).to_owned(),
                in_flight: Vec::new(),
            },
            backoff_min: min,
            backoff_max: max,
        }))
    }
}

impl Executor {
    pub fn builder() -> ExecutorBuilder {
        ExecutorBuilder::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_names_the_missing_field() {
        let err = |b: ExecutorBuilder| b.build().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err(Executor::builder()).starts_with("endpoint:"));
        assert!(err(Executor::builder().endpoint("http://x:1")).starts_with("group:"));
        assert!(err(Executor::builder().endpoint("http://x:1").group("g")).starts_with("handler:"));
        let ok = Executor::builder()
            .endpoint("http://x:1")
            .group("g")
            .handler("h")
            .build();
        assert!(ok.is_ok());
    }
}
