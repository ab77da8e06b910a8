//! *Where* does a run go: the trigger consumer and routing ([`Dispatcher`]), the
//! strategies ([`routing`]) and node health ([`health`]) they route by, the executor
//! streams ([`executors`]) and the links to them ([`links`]), the built-in HTTP
//! executor ([`http_target`]), and the sweeper of run deadlines ([`sweeper`]).
//!
//! May import the foundation (`store`, `model`, `metrics`, `auth`, `egress`, `fault`)
//! and `deliver::alerts`; never `schedule`, `api` or `server`.

mod dispatcher;
pub mod executors;
pub mod health;
pub mod http_target;
pub mod links;
pub mod routing;
pub mod sweeper;

pub use dispatcher::{DispatchOptions, Dispatcher, run_plan, spawn};
