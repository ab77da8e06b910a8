//! *Where* does a run go: the trigger consumer ([`TriggerConsumer`]) and the router
//! ([`Router`]), the strategies ([`routing`]) and node health ([`health`]) it routes
//! by, the executor streams ([`executors`]), the links to them ([`links`]), the
//! messages sent down them ([`messages`]) and whether they still answer ([`silence`]),
//! the built-in HTTP executor ([`http_target`]), and the sweeper of run deadlines
//! ([`sweeper`]).
//!
//! May import the foundation (`store`, `model`, `metrics`, `auth`, `egress`, `fault`)
//! and `deliver::alerts`; never `schedule`, `api` or `server`.

mod consumer;
pub mod executors;
pub mod health;
pub mod http_target;
pub mod links;
pub mod messages;
mod router;
pub mod routing;
pub mod silence;
pub mod sweeper;

pub use consumer::TriggerConsumer;
pub use router::{DispatchOptions, RouteStore, Router, run_plan};

/// Locks a mutex of this layer's in-memory state; a panic while it was held leaves
/// nothing half-written that matters here, so a poisoned lock is taken as it is.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
