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
    since_read: Mutex<HashMap<String, Seen>>,
    policy: HealthPolicy,
}

/// What an instance saw happen on a node since the registry was read.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    /// Leases granted here, less the runs whose end a stream attached here reported.
    since: i64,
    /// Leases asked of the store here and not answered yet (kept across reads).
    asking: i64,
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
                    self.read_again();
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
        lock(&self.since_read)
            .entry(node_id.to_owned())
            .or_default()
            .since += delta;
    }

    /// The registry was read again: what happened since the last read is in its
    /// counts now, but not the asks still unanswered (a lease they win is granted
    /// after the read; forgetting them let a burst's begins, hundreds asked at once,
    /// ask for slots the nodes no longer had).
    fn read_again(&self) {
        let mut seen = lock(&self.since_read);
        seen.retain(|_, s| s.asking > 0);
        for s in seen.values_mut() {
            s.since = 0;
        }
    }

    /// The node's active runs as routing should count them: the store's lease count
    /// when the registry was read, plus the leases granted here since, less the runs
    /// that ended here since (whether they were in the count or granted after it).
    /// The executor's own `active` figure is left out: a handler runs only on a lease
    /// (the go-ahead), so it never exceeds the lease count, and it comes with
    /// heartbeats, so it may be seconds old (an old high figure starved a node).
    pub(super) fn busy(&self, node: &NodeRecord) -> u32 {
        let seen = self.seen(&node.node_id);
        let busy = (i64::from(node.leased) + seen.since).max(0) + seen.asking;
        u32::try_from(busy.max(0)).unwrap_or(u32::MAX)
    }

    /// A lease about to be asked of the store on `node`: counted from now, not from the
    /// grant, so the decisions made side by side (the begins of a burst, the refills of
    /// the room) see it and do not all ask for the same free slot. The slot to ask for.
    pub(super) fn asking(&self, node: &NodeRecord) -> NodeSlot {
        lock(&self.since_read)
            .entry(node.node_id.clone())
            .or_default()
            .asking += 1;
        NodeSlot {
            node_id: node.node_id.clone(),
            max_concurrency: node.max_concurrency,
        }
    }

    /// What the store answered the ask (`None`: the call failed, or it tried no
    /// assignment): anything but a grant gives the count back, and `NodeFull` counts
    /// the node full (`saw_full`).
    pub(super) fn answered(&self, node: &NodeRecord, assigned: Option<&Assigned>) {
        {
            let mut seen = lock(&self.since_read);
            let s = seen.entry(node.node_id.clone()).or_default();
            s.asking -= 1;
            if matches!(assigned, Some(Assigned::Granted(_))) {
                s.since += 1;
            }
        }
        if matches!(assigned, Some(Assigned::NodeFull)) {
            self.saw_full(node);
        }
    }

    /// The store answered that the node holds its whole window (`NodeFull`): count it
    /// full until the next registry read or a run's end reported here, so routing
    /// stops asking the store about it (each ask is a store call answered the same).
    fn saw_full(&self, node: &NodeRecord) {
        let full = i64::from(node.max_concurrency) - i64::from(node.leased);
        let mut seen = lock(&self.since_read);
        let s = seen.entry(node.node_id.clone()).or_default();
        s.since = s.since.max(full);
    }

    /// The node holds its whole window as far as this instance knows (`busy`).
    pub(super) fn at_window(&self, node: &NodeRecord) -> bool {
        node.max_concurrency > 0 && self.busy(node) >= node.max_concurrency
    }

    /// What this instance saw on the node since the snapshot was read.
    fn seen(&self, node_id: &str) -> Seen {
        lock(&self.since_read)
            .get(node_id)
            .copied()
            .unwrap_or_default()
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
        // Asks still unanswered when the registry is read again stay counted: the
        // read's counts cannot hold the leases they are about to win.
        let d = node("d", 4, 1);
        c.asking(&d);
        c.asking(&d);
        c.read_again();
        assert_eq!(c.busy(&d), 3, "two asks in flight across the read");
        let run = crate::model::RunRecord::from_trigger(&crate::model::Trigger {
            job_id: "j".into(),
            schedule_no: "1".into(),
            kind: crate::model::TriggerKind::Manual,
            scheduled_at: 1,
            triggered_at: 1,
            job_version: 1,
            skip_reason: None,
            payload_override: None,
            route_key_override: None,
        });
        c.answered(&d, Some(&Assigned::Granted(run)));
        c.answered(&d, None);
        assert_eq!(c.busy(&d), 2, "one granted after the read, one given back");
        // A node with window 0 (the HTTP target's unlimited one) is never full.
        let unlimited = node("h", 0, 10_000);
        assert!(!c.at_window(&unlimited));
    }
}
