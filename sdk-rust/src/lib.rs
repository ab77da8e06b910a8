//! The Sundial executor SDK for Rust.
//!
//! Not built yet: the executor protocol it will speak is fixed in `proto/sundial/v1/executor.proto`
//! and re-exported here so executors can already be written against the generated stubs.
//! The builder, reconnect, heartbeat and self-fencing logic arrive with the executors issue.

pub use sundial_proto::v1 as proto;
