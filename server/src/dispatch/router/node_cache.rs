//! The node registry as routing sees it: a snapshot re-read at most every
//! `node_refresh`, each node's health judged once per read, and what this instance saw
//! happen on each node since (leases granted here, runs whose end a stream attached
//! here reported).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::warn;

use crate::dispatch::health::{self, Health, HealthPolicy};
use crate::dispatch::lock;
use crate::store::{Assigned, NodeRecord, NodeRegistry, NodeSlot};

/// A registry snapshot and the health of each of its nodes, by index.
pub(super) type Judged = (Arc<Vec<NodeRecord>>, Arc<Vec<Health>>);

/// The node registry as routing sees it, re-read at most every `node_refresh`, and
/// what this instance saw happen on each node since that read: leases it granted, less
/// the runs whose end a stream attached here reported. The snapshot's counts do not
/// show those yet; without them every run of a burst would see the same node as the
/// least busy one.
pub(super) struct NodeCache {
    refresh: Duration,
    /// When it was read, the registry, and each node's health judged against its
    /// peers in it (once per read, not per routing decision).
    snapshot: tokio::sync::Mutex<(Option<Instant>, Judged)>,
    since_read: Mutex<HashMap<String, i64>>,
    policy: HealthPolicy,
}

impl NodeCache {
    pub(super) fn new(refresh: Duration, policy: HealthPolicy) -> Self {
        Self {
            refresh,
            snapshot: tokio::sync::Mutex::new((None, (Arc::default(), Arc::default()))),
            since_read: Mutex::new(HashMap::new()),
            policy,
        }
    }

    pub(super) async fn get(&self, store: &dyn NodeRegistry) -> Arc<Vec<NodeRecord>> {
        self.judged(store).await.0
    }

    /// The snapshot and the health of each of its nodes, by index.
    pub(super) async fn judged(&self, store: &dyn NodeRegistry) -> Judged {
        let mut s = self.snapshot.lock().await;
        if s.0.is_none_or(|t| t.elapsed() >= self.refresh) {
            match store.list_nodes(None).await {
                Ok(nodes) => {
                    let health = nodes
                        .iter()
                        .map(|n| health::classify(n, &nodes, &self.policy))
                        .collect();
                    *s = (Some(Instant::now()), (Arc::new(nodes), Arc::new(health)));
                    lock(&self.since_read).clear();
                }
                Err(e) => {
                    warn!(error = %e, "reading the node registry failed; using the last snapshot")
                }
            }
        }
        s.1.clone()
    }

    /// Forgets the snapshot: the next routing decision reads the registry again.
    pub(super) async fn invalidate(&self) {
        self.snapshot.lock().await.0 = None;
    }

    /// One more (`delta` 1: a lease granted here) or one fewer (-1: a run's end
    /// reported here) active run on `node_id` than the snapshot says.
    pub(super) fn moved(&self, node_id: &str, delta: i64) {
        *lock(&self.since_read)
            .entry(node_id.to_owned())
            .or_default() += delta;
    }

    /// The node's active runs as routing should count them: the store's lease count
    /// when the registry was read, plus the leases granted here since, less the runs
    /// that ended here since (whether they were in the count or granted after it).
    /// The executor's own `active` figure is left out: a handler runs only on a lease
    /// (the go-ahead), so it never exceeds the lease count, and it comes with
    /// heartbeats, so it may be seconds old (an old high figure starved a node).
    pub(super) fn busy(&self, node: &NodeRecord) -> u32 {
        let since = self.since(&node.node_id);
        u32::try_from((i64::from(node.leased) + since).max(0)).unwrap_or(u32::MAX)
    }

    /// A lease about to be asked of the store on `node`: counted from now, not from the
    /// grant, so the decisions made side by side (the begins of a burst, the refills of
    /// the room) see it and do not all ask for the same free slot. The slot to ask for.
    pub(super) fn asking(&self, node: &NodeRecord) -> NodeSlot {
        self.moved(&node.node_id, 1);
        NodeSlot {
            node_id: node.node_id.clone(),
            max_concurrency: node.max_concurrency,
        }
    }

    /// What the store answered the ask (`None`: the call failed, or it tried no
    /// assignment): anything but a grant gives the count back, and `NodeFull` counts
    /// the node full (`saw_full`).
    pub(super) fn answered(&self, node: &NodeRecord, assigned: Option<&Assigned>) {
        match assigned {
            Some(Assigned::Granted(_)) => {}
            Some(Assigned::NodeFull) => {
                self.moved(&node.node_id, -1);
                self.saw_full(node);
            }
            _ => self.moved(&node.node_id, -1),
        }
    }

    /// The store answered that the node holds its whole window (`NodeFull`): count it
    /// full until the next registry read or a run's end reported here, so routing
    /// stops asking the store about it (each ask is a store call answered the same).
    fn saw_full(&self, node: &NodeRecord) {
        let full = i64::from(node.max_concurrency) - i64::from(node.leased);
        let mut since = lock(&self.since_read);
        let s = since.entry(node.node_id.clone()).or_default();
        *s = (*s).max(full);
    }

    /// The node holds its whole window as far as this instance knows (`busy`).
    pub(super) fn at_window(&self, node: &NodeRecord) -> bool {
        node.max_concurrency > 0 && self.busy(node) >= node.max_concurrency
    }

    /// Leases granted on the node here since the snapshot, less the runs that ended.
    pub(super) fn since(&self, node_id: &str) -> i64 {
        lock(&self.since_read).get(node_id).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache() -> NodeCache {
        NodeCache::new(Duration::from_secs(60), HealthPolicy::default())
    }

    fn node(id: &str, window: u32, leased: u32) -> NodeRecord {
        NodeRecord {
            node_id: id.into(),
            group: "g".into(),
            handlers: vec!["h".into()],
            weight: 1,
            max_concurrency: window,
            labels: Default::default(),
            instance: "i".into(),
            session: String::new(),
            ready: true,
            draining: false,
            silent_since: 0,
            on_probation: false,
            // The executor's own figure, seconds old: never counted.
            active: 1_000,
            leased,
            load: 0.0,
            mean_duration_ms: 0,
            recent_errors: 0,
            recent_results: 0,
            recent_faults: 0,
            by_handler: Vec::new(),
            connected_at: 0,
            last_heartbeat: 0,
        }
    }

    #[test]
    fn the_window_counts_the_store_leases_plus_what_happened_here_since() {
        let c = cache();
        let n = node("a", 4, 3);
        assert_eq!(c.busy(&n), 3);
        assert!(!c.at_window(&n), "one credit left");
        c.moved("a", 1);
        assert!(c.at_window(&n), "the lease granted here spent it");
        c.moved("a", -1);
        assert!(!c.at_window(&n), "a run that ended here returns it");
        // More ends seen here than the snapshot counted (runs granted and ended since
        // the read): never below zero, and the other nodes are untouched.
        for _ in 0..5 {
            c.moved("a", -1);
        }
        assert_eq!(c.busy(&n), 0);
        assert_eq!(c.busy(&node("b", 4, 2)), 2);
        // An ask is counted until the store answers; anything but a grant gives it back.
        let m = node("c", 4, 3);
        c.asking(&m);
        assert!(c.at_window(&m), "the ask holds the last slot");
        c.answered(&m, None);
        assert_eq!(c.busy(&m), 3);
        // The store said it is full: so it is, until a run ends there.
        c.asking(&n);
        c.answered(&n, Some(&Assigned::NodeFull));
        assert!(c.at_window(&n));
        c.moved("a", -1);
        assert!(!c.at_window(&n));
        // A node with window 0 (the HTTP target's unlimited one) is never full.
        let unlimited = node("h", 0, 10_000);
        assert!(!c.at_window(&unlimited));
    }
}
