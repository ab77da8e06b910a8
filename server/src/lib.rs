//! Sundial's control plane as a library: the `sundial` binary is a thin shell over
//! [`server::run`], and the integration tests start the same code in-process or as
//! processes.

// The OpenAPI document (`api::rest`) is one `json!` literal, deeper than the default limit.
#![recursion_limit = "256"]

pub mod alerts;
pub mod api;
pub mod auth;
pub mod config;
pub mod cron;
pub mod dispatch;
pub mod egress;
pub mod executors;
pub mod fault;
pub mod health;
pub mod http_target;
pub mod jobs;
pub mod links;
pub mod metrics;
pub mod model;
pub mod routing;
pub mod runs;
pub mod scheduler;
pub mod server;
pub mod store;
pub mod sweeper;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tls;
pub mod webhooks;
