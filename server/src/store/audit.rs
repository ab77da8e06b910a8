//! `AuditLog`: the record of every mutating admin call (who, what, on which target,
//! how it went), kept in the store so every instance's calls are in one place and a
//! restart keeps them; bounded to the newest events.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{Result, StoreMeta};
use crate::model::Millis;

/// One mutating admin call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct AuditEvent {
    /// Assigned by the store: ascending, one per event.
    #[serde(default)]
    pub seq: u64,
    /// Assigned by the store: its clock when the event was appended.
    #[serde(default)]
    pub time_ms: Millis,
    /// Who: `bearer:<token name>`, `app:<app id>`, or `anonymous` (dev mode).
    pub caller: String,
    /// The gRPC method, `JobService.CreateJob`.
    pub operation: String,
    /// What it named: `job hello`, `run hello@1700000000000`, `node n1`, `app billing`.
    pub target: String,
    /// `OK`, or the gRPC code's name (`NOT_FOUND`, `INVALID_ARGUMENT`, ...).
    pub outcome: String,
    /// Why, when it failed: the error's message, cut.
    pub detail: String,
    /// `grpc` or `rest`.
    pub via: String,
    /// The server instance that served it.
    pub instance: String,
}

/// The audit log. See the module docs.
#[async_trait]
pub trait AuditLog: StoreMeta {
    /// Appends `event` (its `seq` and `time_ms` are the store's) and forgets the oldest
    /// past the newest `keep`.
    async fn append_audit(&self, event: AuditEvent, keep: usize) -> Result<()>;

    /// Up to `limit` events, newest first, those with a `seq` below `before` (all
    /// when `None`).
    async fn list_audit(&self, before: Option<u64>, limit: usize) -> Result<Vec<AuditEvent>>;
}
