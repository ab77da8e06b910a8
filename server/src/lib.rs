//! Sundial's control plane as a library: the `sundial` binary is a thin shell over
//! [`server::run`], and the integration tests start the same code in-process or as
//! processes.

// The OpenAPI document (`api::rest`) is one `json!` literal, deeper than the default limit.
#![recursion_limit = "256"]

// What the server answers, one folder per question: when (`schedule`), where
// (`dispatch`), and how the world learns (`deliver`); the surfaces above them (`api`,
// `server`, `config`), the foundation below them (`store`, `model`, `metrics`, `auth`,
// `egress`, `tls`, `fault`). ARCHITECTURE.md states the allowed import directions.
pub mod api;
pub mod auth;
pub mod cli;
pub mod config;
pub mod deliver;
pub mod dispatch;
pub mod egress;
pub mod fault;
#[cfg(test)]
mod layout;
pub mod metrics;
pub mod model;
pub mod schedule;
pub mod server;
pub mod store;
pub mod telemetry;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tls;
