//! `NodeRegistry`: the executor nodes connected to any instance, and the shared
//! round-robin counters routing draws from; `Inboxes`: the per-instance inboxes that
//! carry dispatches and cancels to a node attached to another instance.
//!
//! Guarantees: a node is listed only while it is refreshed within its TTL, and only the
//! stream that registered it can remove it; inboxes are best effort by design (a lost
//! dispatch is never confirmed and is re-routed, a lost cancel is repeated).

use std::time::Duration;

use async_trait::async_trait;

use super::{Result, StoreMeta};
use crate::model::Millis;

/// An executor node as the registry knows it. It disappears unless refreshed (each
/// heartbeat) within the TTL it was written with.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeRecord {
    pub node_id: String,
    pub group: String,
    pub handlers: Vec<String>,
    pub weight: u32,
    /// 0 = unlimited.
    pub max_concurrency: u32,
    pub labels: std::collections::BTreeMap<String, String>,
    /// The server instance holding the node's stream.
    pub instance: String,
    /// Names the stream this record was registered by (chosen at its hello), so that
    /// the end of one stream never removes the registration of the node's next one.
    #[serde(default)]
    pub session: String,
    /// False while the executor declares itself not ready.
    pub ready: bool,
    /// Asked to drain (`DrainNode`): it finishes what it holds and gets no new work.
    #[serde(default)]
    pub draining: bool,
    /// When (ms, the holding instance's clock) the node went silent: a dispatch it
    /// left unanswered and nothing heard from it for `--silent-after`; 0 while it
    /// answers. A silent node gets no new work (see `dispatch::silence`).
    #[serde(default)]
    pub silent_since: Millis,
    /// Dropped (routing judged it FAILING) and not yet through its probation: judged
    /// FAILING, whatever its figures say, until its last `health::PROBATION` results
    /// all succeeded (set and cleared by the instance holding its stream). Without it
    /// a dropped node whose few failures were outweighed by its first successful
    /// probes was judged SLOW, got neither work nor probes, and stayed so until its
    /// failures left the window (an hour).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub on_probation: bool,
    /// Runs the executor reports holding (at its last heartbeat).
    pub active: u32,
    /// Runs leased to the node right now, as the store counts them (filled in by
    /// `list_nodes`; never stored): ahead of `active` between heartbeats.
    #[serde(default, skip_serializing)]
    pub leased: u32,
    pub load: f64,
    /// Mean duration (ms) of the node's results in the health window, as seen by the
    /// instance that holds its stream (reset when it reconnects).
    #[serde(default)]
    pub mean_duration_ms: u64,
    /// Of those recent results, how many were not SUCCEEDED.
    #[serde(default)]
    pub recent_errors: u32,
    #[serde(default)]
    pub recent_results: u32,
    /// Of those recent results, the leases the node lost (they ran out, or its
    /// dispatches went unconfirmed): failures that are the node's whatever the job.
    #[serde(default)]
    pub recent_faults: u32,
    /// The recent results of each handler (those whose handler the instance knew), so
    /// that a node is judged against its peers on the same work.
    #[serde(default)]
    pub by_handler: Vec<HandlerFigures>,
    pub connected_at: Millis,
    /// Written by the store from its clock.
    pub last_heartbeat: Millis,
}

/// One handler's recent results on a node (part of its [`NodeRecord`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HandlerFigures {
    pub handler: String,
    /// Results the executor reported (and attempts that timed out).
    pub results: u32,
    /// Of those, the ones that did not succeed.
    pub errors: u32,
    /// Mean duration (ms) of those with a known duration; 0 when none.
    pub mean_duration_ms: u64,
}

/// What [`NodeRegistry::remove_node`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeRemoved {
    /// The registration was the stream's own and is gone.
    pub removed: bool,
    /// Leases brought to end within `leases_within`.
    pub leases_shortened: u32,
}

/// What [`NodeRegistry::register_node`] or [`NodeRegistry::refresh_node`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registered {
    /// The record was written.
    Yes,
    /// Another stream of the node (its `session`) registered it since: nothing was
    /// written, and the stream that asked is superseded (the executor reconnected).
    Superseded,
    /// A live registration of this other group holds the node id: nothing was written.
    OtherGroup(String),
}

/// The executor node registry and routing counters. See the module docs.
#[async_trait]
pub trait NodeRegistry: StoreMeta {
    /// Registers a node at its stream's hello (`last_heartbeat` = the store's now); it
    /// expires `ttl` later unless refreshed. A node id belongs to one group while it is
    /// registered: a live registration of another group leaves it alone
    /// (`OtherGroup`); one of the same group (the executor connected again, on this
    /// instance or another) is replaced, and its stream is `Superseded` at its next
    /// refresh.
    async fn register_node(&self, node: NodeRecord, ttl: Duration) -> Result<Registered>;

    /// Refreshes a registration from the stream that made it (each heartbeat), replacing
    /// the whole record. A registration by another stream of the node (`session`) →
    /// `Superseded`, by another group → `OtherGroup`, nothing written; none (it expired
    /// or was removed) → written again.
    async fn refresh_node(&self, node: NodeRecord, ttl: Duration) -> Result<Registered>;

    /// The stream `node` was registered by ended. Removes the node if that stream still
    /// holds it (same `instance` and `session`: a node that reconnected meanwhile, to
    /// this instance or another, is left alone). When it was removed and `leases_within`
    /// is given, every lease the node holds ends at most that long from now (store
    /// clock) unless it already ends sooner, so the runs of an executor that died fail
    /// over in about that time instead of a lease TTL; a node that registers again
    /// before they run out renews them with its hello (`renew_leases`), and a node
    /// registered again before this step is left alone.
    async fn remove_node(
        &self,
        node: &NodeRecord,
        leases_within: Option<Duration>,
    ) -> Result<NodeRemoved>;

    /// Unexpired nodes, by node id; `group` filters when given.
    async fn list_nodes(&self, group: Option<&str>) -> Result<Vec<NodeRecord>>;

    // ---- routing

    /// The next value (from 0) of the job's round-robin counter, shared by every
    /// instance, so the instances routing one job's runs take turns from a single
    /// sequence instead of each starting on the same node. While this instance's last
    /// beat ([`super::TriggerQueue::beat_instance`]) found no other instance alive, a
    /// store may keep the counter in memory (there is no one to share it with): an
    /// instance that joins is then counted with from the first beat of each that sees
    /// the other.
    async fn next_route_counter(&self, job_id: &str) -> Result<u64>;

    /// [`next_route_counter`](Self::next_route_counter) of each job, in the order given
    /// (distinct jobs): on Redis one round trip for them all where the counters are
    /// shared.
    async fn next_route_counters(&self, job_ids: &[&str]) -> Result<Vec<u64>> {
        let mut out = Vec::with_capacity(job_ids.len());
        for job_id in job_ids {
            out.push(self.next_route_counter(job_id).await?);
        }
        Ok(out)
    }
}

/// Round-robin counters kept in this process, by job, each from 0: what
/// [`NodeRegistry::next_route_counter`] answers where nothing shares them (the embedded
/// store, or an instance alone on Redis).
#[derive(Default)]
pub(crate) struct LocalCounters(std::sync::Mutex<std::collections::HashMap<String, u64>>);

impl LocalCounters {
    /// The job's next value.
    pub(crate) fn next(&self, job_id: &str) -> u64 {
        let mut counters = self.counters();
        let c = counters.entry(job_id.to_owned()).or_insert(0);
        let n = *c;
        *c = c.wrapping_add(1);
        n
    }

    /// Forgets every job's counter.
    pub(crate) fn clear(&self) {
        self.counters().clear();
    }

    fn counters(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, u64>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Per-instance inboxes: dispatches for executors attached to another instance.
#[async_trait]
pub trait Inboxes: StoreMeta {
    /// Queues `messages` for `instance`, in their order, in one step. Inboxes are best
    /// effort by design: a dispatch lost with its instance is never confirmed and is
    /// re-routed (`confirm_by`).
    async fn push_inbox(&self, instance: &str, messages: Vec<Vec<u8>>) -> Result<()>;

    /// Takes up to `max` messages for `instance`, oldest first, waiting at most `block`
    /// for the first.
    async fn pop_inbox(&self, instance: &str, max: usize, block: Duration) -> Result<Vec<Vec<u8>>>;
}
