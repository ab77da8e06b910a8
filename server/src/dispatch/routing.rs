//! Routing strategies: pure functions over a snapshot of the nodes that can serve a
//! job, deciding where its run goes. No I/O, no clocks: whatever state a strategy needs
//! (a round-robin counter, smooth-weighted current weights, a random source) is passed
//! in, so every strategy is unit-tested exactly and the caller decides where that state
//! lives (see ARCHITECTURE.md once dispatch uses this module).
//!
//! Dispatch seeds `RouteState::counter` from the store's shared per-job counter before
//! every round-robin, weighted or busyover decision, so instances take turns from one
//! sequence (ARCHITECTURE.md, "Routing"), shifted by a stable hash of the job id so
//! that many jobs firing at once do not all begin their turns on the same node; and it
//! counts the leases it granted since its node snapshot into each node's `active`.

use std::collections::{BTreeMap, HashMap};

use crate::model::RouteStrategy;

/// What routing needs to know about one node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    pub node_id: String,
    pub weight: u32,
    /// 0 = unlimited.
    pub max_concurrency: u32,
    pub active: u32,
    pub mean_duration_ms: u64,
    /// Failed runs in the recent window.
    pub recent_errors: u32,
    /// Deprioritised (success rate under the threshold) but not dropped.
    pub slow: bool,
}

/// Where a run goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    One(String),
    /// Sharding broadcast: every node, each with its shard index (0-based) of `len()`.
    All(Vec<String>),
    /// No node can take it: the run fails with "no healthy executor" and is retried
    /// per its policy.
    NoNode,
}

/// State a strategy carries between decisions (per job).
#[derive(Debug, Default, Clone)]
pub struct RouteState {
    /// Round-robin position; the caller may seed it from shared state so that several
    /// server instances do not start on the same node.
    pub counter: u64,
    /// Smooth weighted round robin's sequence for one node set (ids and weights): one
    /// full cycle of picks, indexed by `counter`, so any instance holding the same
    /// counter picks the same node. Built when the node set changes.
    pub weighted: Option<WeightedCycle>,
    /// Past `MAX_WEIGHTED_CYCLE` total weight no cycle is built: the current weights of
    /// the classic algorithm are kept here instead (per instance).
    pub current_weights: HashMap<String, i64>,
    /// The consistent-hash ring and the node ids it was built from: rebuilt only when
    /// the node set changes (building it costs 200 hashes per node).
    pub ring: Option<(Vec<String>, HashRing)>,
}

/// A smooth-weighted cycle: the (node id, weight) set it was built for, and the picks
/// of one full cycle as indexes into that set.
pub type WeightedCycle = (Vec<(String, u32)>, Vec<u32>);

/// Longest smooth-weighted cycle built (the sum of the weights); building one costs
/// cycle × nodes steps, once per node-set change.
pub const MAX_WEIGHTED_CYCLE: u64 = 10_000;

/// Virtual nodes per node on the consistent-hash ring.
pub const DEFAULT_VIRTUAL_NODES: u32 = 200;

/// The nodes a run is routed among: a retry prefers another node than the one its last
/// attempt ran on (`ran_last`), so those are left out, unless no other serves it.
pub fn retry_candidates<T>(eligible: Vec<T>, ran_last: impl Fn(&T) -> bool) -> Vec<T> {
    if eligible.iter().all(&ran_last) {
        return eligible;
    }
    eligible.into_iter().filter(|n| !ran_last(n)).collect()
}

/// Strategies whose choice is the node itself (a key's node, the first healthy one):
/// when it is at its window the run waits for it rather than moving elsewhere.
pub fn keeps_affinity(strategy: RouteStrategy) -> bool {
    matches!(
        strategy,
        RouteStrategy::ConsistentHash | RouteStrategy::Failover | RouteStrategy::First
    )
}

/// Strategies that take turns through the job's nodes (round robin, weighted,
/// busyover): their position comes from the job's counter, shared by the instances.
pub fn takes_turns(strategy: RouteStrategy) -> bool {
    matches!(
        strategy,
        RouteStrategy::RoundRobin | RouteStrategy::WeightedRoundRobin | RouteStrategy::Busyover
    )
}

/// The order to ask `nodes` in, as their indexes: the strategy's pick (`first`) before
/// the others, then a healthy node before a slow one, the least busy first, by id last;
/// only the pick when the strategy keeps its affinity; none that `full` says is at its
/// window (the store would answer it is full).
pub fn fallback_order(
    strategy: RouteStrategy,
    nodes: &[NodeView],
    first: &str,
    full: &[bool],
) -> Vec<usize> {
    let mut order: Vec<usize> = (0..nodes.len())
        .filter(|&i| !keeps_affinity(strategy) || nodes[i].node_id == first)
        .filter(|&i| !full.get(i).copied().unwrap_or(false))
        .collect();
    // Compared by reference: a key that owns the id is two String clones per
    // comparison, on every run's pick.
    let key = |i: usize| {
        let n = &nodes[i];
        (n.node_id != first, n.slow, n.active, n.node_id.as_str())
    };
    order.sort_by(|&a, &b| key(a).cmp(&key(b)));
    order
}

/// Routes one run. `nodes` are the healthy nodes that serve the job's group and handler
/// (any order: strategies sort by node id where order matters); `random` is a uniform
/// value in [0, 1) for RANDOM.
pub fn route(
    strategy: RouteStrategy,
    nodes: &[NodeView],
    route_key: &str,
    state: &mut RouteState,
    random: f64,
) -> Route {
    if nodes.is_empty() {
        return Route::NoNode;
    }
    let mut sorted: Vec<&NodeView> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.node_id.cmp(&b.node_id));
    // Slow nodes only take work when nothing else can.
    let preferred: Vec<&NodeView> = {
        let fast: Vec<&NodeView> = sorted.iter().copied().filter(|n| !n.slow).collect();
        if fast.is_empty() {
            sorted.clone()
        } else {
            fast
        }
    };
    let one = |n: &NodeView| Route::One(n.node_id.clone());
    match strategy {
        RouteStrategy::RoundRobin => {
            let n = preferred[(state.counter % preferred.len() as u64) as usize];
            state.counter = state.counter.wrapping_add(1);
            one(n)
        }
        RouteStrategy::WeightedRoundRobin => one(smooth_weighted(&preferred, state)),
        RouteStrategy::Random => {
            let i = ((random.clamp(0.0, 1.0) * preferred.len() as f64) as usize)
                .min(preferred.len() - 1);
            one(preferred[i])
        }
        RouteStrategy::LeastActive => one(least_active(&preferred)),
        RouteStrategy::ConsistentHash => {
            // The ring is over every node, slow or not: moving keys away from a node
            // because it is slow would defeat the point of the strategy.
            let ids: Vec<String> = sorted.iter().map(|n| n.node_id.clone()).collect();
            if state
                .ring
                .as_ref()
                .is_none_or(|(built_for, _)| *built_for != ids)
            {
                let ring = HashRing::new(ids.iter().map(String::as_str), DEFAULT_VIRTUAL_NODES);
                state.ring = Some((ids, ring));
            }
            state
                .ring
                .as_ref()
                .and_then(|(_, ring)| ring.node_for(route_key))
                .map_or(Route::NoNode, |id| Route::One(id.to_owned()))
        }
        RouteStrategy::Busyover => {
            let free = |n: &NodeView| n.max_concurrency == 0 || n.active < n.max_concurrency;
            let start = (state.counter % preferred.len() as u64) as usize;
            state.counter = state.counter.wrapping_add(1);
            preferred
                .iter()
                .cycle()
                .skip(start)
                .take(preferred.len())
                .find(|n| free(n))
                .or_else(|| sorted.iter().find(|n| free(n)))
                .map_or(Route::NoNode, |n| one(n))
        }
        RouteStrategy::Failover | RouteStrategy::First => one(preferred[0]),
        RouteStrategy::ShardingBroadcast => {
            Route::All(sorted.iter().map(|n| n.node_id.clone()).collect())
        }
    }
}

/// Nginx's smooth weighted round robin: each pick adds every node's weight to its
/// current weight, takes the largest, and subtracts the total from the winner, which
/// interleaves nodes in proportion to their weights (5:1:1 → a a b a c a a). One full
/// cycle is precomputed and indexed by the (shared) counter.
fn smooth_weighted<'a>(nodes: &[&'a NodeView], state: &mut RouteState) -> &'a NodeView {
    let key: Vec<(String, u32)> = nodes
        .iter()
        .map(|n| (n.node_id.clone(), n.weight.max(1)))
        .collect();
    let total: u64 = key.iter().map(|(_, w)| u64::from(*w)).sum();
    if total > MAX_WEIGHTED_CYCLE {
        return smooth_weighted_step(nodes, state);
    }
    if state.weighted.as_ref().is_none_or(|(k, _)| *k != key) {
        let mut current = vec![0i64; nodes.len()];
        let mut cycle = Vec::with_capacity(total as usize);
        for _ in 0..total {
            let mut best = 0;
            for (i, (_, w)) in key.iter().enumerate() {
                current[i] += i64::from(*w);
                if current[i] > current[best] {
                    best = i;
                }
            }
            current[best] -= total as i64;
            cycle.push(best as u32);
        }
        state.weighted = Some((key, cycle));
    }
    let pick = state
        .weighted
        .as_ref()
        .and_then(|(_, cycle)| cycle.get((state.counter % total) as usize))
        .map_or(0, |&i| i as usize);
    state.counter = state.counter.wrapping_add(1);
    nodes[pick.min(nodes.len() - 1)]
}

/// The classic step-by-step form, for node sets whose cycle is too long to build.
fn smooth_weighted_step<'a>(nodes: &[&'a NodeView], state: &mut RouteState) -> &'a NodeView {
    // Forget nodes that left, so a returning node starts fresh.
    if state.current_weights.len() > nodes.len()
        || nodes
            .iter()
            .any(|n| !state.current_weights.contains_key(&n.node_id))
    {
        let present: std::collections::HashSet<&str> =
            nodes.iter().map(|n| n.node_id.as_str()).collect();
        state
            .current_weights
            .retain(|id, _| present.contains(id.as_str()));
    }
    let total: i64 = nodes.iter().map(|n| i64::from(n.weight.max(1))).sum();
    let mut best = nodes[0];
    let mut best_weight = i64::MIN;
    for n in nodes {
        let w = state.current_weights.entry(n.node_id.clone()).or_insert(0);
        *w += i64::from(n.weight.max(1));
        if *w > best_weight {
            best_weight = *w;
            best = n;
        }
    }
    if let Some(w) = state.current_weights.get_mut(&best.node_id) {
        *w -= total;
    }
    best
}

/// Fewest active runs, a node with recent errors counting as busier (each error adds
/// one), then the shorter recent mean duration, then the node id.
fn least_active<'a>(nodes: &[&'a NodeView]) -> &'a NodeView {
    nodes
        .iter()
        .copied()
        .min_by(|a, b| {
            let load = |n: &NodeView| u64::from(n.active) + u64::from(n.recent_errors);
            load(a)
                .cmp(&load(b))
                .then(a.mean_duration_ms.cmp(&b.mean_duration_ms))
                .then(a.node_id.cmp(&b.node_id))
        })
        .unwrap_or(nodes[0])
}

/// FNV1_32_HASH: FNV-1a 32-bit followed by the usual avalanche finalizer, so that keys
/// sharing a long prefix (`customer_id1…`) still spread over the whole ring.
pub fn fnv1_32_hash(key: &str) -> u32 {
    let mut h = fnv1a_32(key);
    h = h.wrapping_add(h << 13);
    h ^= h >> 7;
    h = h.wrapping_add(h << 3);
    h ^= h >> 17;
    h = h.wrapping_add(h << 5);
    h
}

/// Plain FNV-1a 32-bit, without the finalizer.
pub fn fnv1a_32(key: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in key.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// A consistent-hash ring of `{node_id}#{i}` virtual nodes.
#[derive(Debug, Clone)]
pub struct HashRing {
    ring: BTreeMap<u32, String>,
}

impl HashRing {
    pub fn new<'a>(nodes: impl IntoIterator<Item = &'a str>, virtual_nodes: u32) -> Self {
        Self::with_hash(nodes, virtual_nodes, fnv1_32_hash)
    }

    /// A ring with another hash function (to compare distributions).
    pub fn with_hash<'a>(
        nodes: impl IntoIterator<Item = &'a str>,
        virtual_nodes: u32,
        hash: fn(&str) -> u32,
    ) -> Self {
        let mut ring: BTreeMap<u32, String> = BTreeMap::new();
        for node in nodes {
            for i in 0..virtual_nodes.max(1) {
                // On a (rare) collision the smaller node id keeps the point, so the ring
                // does not depend on insertion order.
                let point = hash(&format!("{node}#{i}"));
                match ring.get(&point) {
                    Some(existing) if existing.as_str() <= node => {}
                    _ => {
                        ring.insert(point, node.to_owned());
                    }
                }
            }
        }
        Self { ring }
    }

    /// The node owning `key`: the first virtual node at or after the key's hash,
    /// wrapping around.
    pub fn node_for(&self, key: &str) -> Option<&str> {
        self.node_for_hash(fnv1_32_hash(key))
    }

    pub fn node_for_hash(&self, h: u32) -> Option<&str> {
        self.ring
            .range(h..)
            .next()
            .or_else(|| self.ring.iter().next())
            .map(|(_, n)| n.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str) -> NodeView {
        NodeView {
            node_id: id.into(),
            weight: 1,
            max_concurrency: 0,
            active: 0,
            mean_duration_ms: 0,
            recent_errors: 0,
            slow: false,
        }
    }

    fn pick(strategy: RouteStrategy, nodes: &[NodeView], state: &mut RouteState) -> String {
        match route(strategy, nodes, "", state, 0.0) {
            Route::One(n) => n,
            other => panic!("expected one node, got {other:?}"),
        }
    }

    #[test]
    fn a_retry_avoids_the_node_of_its_last_attempt_unless_it_is_the_only_one() {
        let eligible = vec!["a", "b", "c"];
        assert_eq!(
            retry_candidates(eligible.clone(), |n| *n == "b"),
            ["a", "c"]
        );
        assert_eq!(
            retry_candidates(eligible.clone(), |_| false),
            ["a", "b", "c"]
        );
        assert_eq!(retry_candidates(vec!["b"], |n| *n == "b"), ["b"]);
        assert!(retry_candidates(Vec::<&str>::new(), |_| true).is_empty());
    }

    #[test]
    fn fallback_order_puts_the_pick_first_then_healthy_and_least_busy() {
        let view = |id: &str, active: u32, slow: bool| NodeView {
            active,
            slow,
            ..node(id)
        };
        let nodes = [
            view("a", 5, false),
            view("b", 1, true),
            view("c", 2, false),
            view("d", 2, false),
            view("e", 0, false),
        ];
        let none = [false; 5];
        // The pick, then healthy by load (ties by id), then the slow one.
        assert_eq!(
            fallback_order(RouteStrategy::RoundRobin, &nodes, "a", &none),
            [0, 4, 2, 3, 1]
        );
        // Nodes known to be at their window are not asked, the pick included.
        let full = [true, false, false, true, false];
        assert_eq!(
            fallback_order(RouteStrategy::Busyover, &nodes, "a", &full),
            [4, 2, 1]
        );
        // Affinity: only the pick, and nothing when it is full (the run waits for it).
        for s in [
            RouteStrategy::ConsistentHash,
            RouteStrategy::Failover,
            RouteStrategy::First,
        ] {
            assert!(keeps_affinity(s));
            assert_eq!(fallback_order(s, &nodes, "c", &none), [2]);
            assert!(fallback_order(s, &nodes, "a", &full).is_empty());
        }
        assert!(!keeps_affinity(RouteStrategy::LeastActive));
    }

    #[test]
    fn no_nodes_means_no_node_for_every_strategy() {
        for s in [
            RouteStrategy::RoundRobin,
            RouteStrategy::WeightedRoundRobin,
            RouteStrategy::Random,
            RouteStrategy::LeastActive,
            RouteStrategy::ConsistentHash,
            RouteStrategy::Busyover,
            RouteStrategy::Failover,
            RouteStrategy::First,
            RouteStrategy::ShardingBroadcast,
        ] {
            assert_eq!(
                route(s, &[], "k", &mut RouteState::default(), 0.5),
                Route::NoNode,
                "{s:?}"
            );
        }
    }

    #[test]
    fn round_robin_cycles_in_node_order_whatever_the_input_order() {
        let nodes = [node("c"), node("a"), node("b")];
        let mut st = RouteState::default();
        let got: Vec<String> = (0..6)
            .map(|_| pick(RouteStrategy::RoundRobin, &nodes, &mut st))
            .collect();
        assert_eq!(got, ["a", "b", "c", "a", "b", "c"]);
        // A seeded counter starts elsewhere (how instances avoid piling on one node).
        let mut seeded = RouteState {
            counter: 7,
            ..RouteState::default()
        };
        assert_eq!(pick(RouteStrategy::RoundRobin, &nodes, &mut seeded), "b");
    }

    #[test]
    fn smooth_weighted_round_robin_interleaves_by_weight() {
        let nodes = [
            NodeView {
                weight: 5,
                ..node("a")
            },
            node("b"),
            node("c"),
        ];
        let mut st = RouteState::default();
        let got: Vec<String> = (0..7)
            .map(|_| pick(RouteStrategy::WeightedRoundRobin, &nodes, &mut st))
            .collect();
        assert_eq!(got, ["a", "a", "b", "a", "c", "a", "a"]);
        // Over many picks the shares match the weights exactly.
        let mut counts: HashMap<String, u32> = HashMap::new();
        for _ in 0..700 {
            *counts
                .entry(pick(RouteStrategy::WeightedRoundRobin, &nodes, &mut st))
                .or_default() += 1;
        }
        assert_eq!((counts["a"], counts["b"], counts["c"]), (500, 100, 100));
        // Weight 0 counts as 1.
        let zero = [
            NodeView {
                weight: 0,
                ..node("z")
            },
            node("y"),
        ];
        let mut st = RouteState::default();
        let got: Vec<String> = (0..4)
            .map(|_| pick(RouteStrategy::WeightedRoundRobin, &zero, &mut st))
            .collect();
        assert_eq!(got.iter().filter(|n| *n == "z").count(), 2);
        // Two instances sharing one counter pick from one sequence: together they
        // keep the 5:1:1 interleaving instead of each starting on "a".
        let (mut one, mut two) = (RouteState::default(), RouteState::default());
        let mut got = Vec::new();
        for shared in 0..7u64 {
            let st = if shared % 2 == 0 { &mut one } else { &mut two };
            st.counter = shared;
            got.push(pick(RouteStrategy::WeightedRoundRobin, &nodes, st));
        }
        assert_eq!(got, ["a", "a", "b", "a", "c", "a", "a"]);
        // A cycle too long to build falls back to per-instance steps, same shares.
        let heavy = [
            NodeView {
                weight: 9_000,
                ..node("h")
            },
            NodeView {
                weight: 3_000,
                ..node("l")
            },
        ];
        let mut st = RouteState::default();
        let mut h = 0;
        for _ in 0..12_000 {
            if pick(RouteStrategy::WeightedRoundRobin, &heavy, &mut st) == "h" {
                h += 1;
            }
        }
        assert_eq!(h, 9_000);
        assert!(st.weighted.is_none());
    }

    #[test]
    fn the_largest_weights_still_take_turns() {
        let nodes = [
            NodeView {
                weight: u32::MAX,
                ..node("a")
            },
            NodeView {
                weight: u32::MAX,
                ..node("b")
            },
        ];
        let mut st = RouteState::default();
        let got: Vec<String> = (0..4)
            .map(|_| pick(RouteStrategy::WeightedRoundRobin, &nodes, &mut st))
            .collect();
        assert_eq!(got, ["a", "b", "a", "b"]);
    }

    #[test]
    fn random_maps_the_unit_interval_onto_the_nodes() {
        let nodes = [node("b"), node("a")];
        let mut st = RouteState::default();
        assert_eq!(
            route(RouteStrategy::Random, &nodes, "", &mut st, 0.0),
            Route::One("a".into())
        );
        assert_eq!(
            route(RouteStrategy::Random, &nodes, "", &mut st, 0.49),
            Route::One("a".into())
        );
        assert_eq!(
            route(RouteStrategy::Random, &nodes, "", &mut st, 0.5),
            Route::One("b".into())
        );
        assert_eq!(
            route(RouteStrategy::Random, &nodes, "", &mut st, 1.0),
            Route::One("b".into())
        );
    }

    #[test]
    fn least_active_counts_errors_then_breaks_ties_by_duration_then_id() {
        let mut st = RouteState::default();
        let busy = [
            NodeView {
                active: 3,
                ..node("a")
            },
            NodeView {
                active: 1,
                ..node("b")
            },
        ];
        assert_eq!(pick(RouteStrategy::LeastActive, &busy, &mut st), "b");
        let erring = [
            NodeView {
                active: 1,
                recent_errors: 2,
                ..node("a")
            },
            NodeView {
                active: 2,
                ..node("b")
            },
        ];
        assert_eq!(
            pick(RouteStrategy::LeastActive, &erring, &mut st),
            "b",
            "errors inflate a node's load"
        );
        let tie = [
            NodeView {
                active: 1,
                mean_duration_ms: 900,
                ..node("a")
            },
            NodeView {
                active: 1,
                mean_duration_ms: 100,
                ..node("b")
            },
        ];
        assert_eq!(pick(RouteStrategy::LeastActive, &tie, &mut st), "b");
        let full_tie = [node("b"), node("a")];
        assert_eq!(pick(RouteStrategy::LeastActive, &full_tie, &mut st), "a");
    }

    #[test]
    fn busyover_skips_nodes_at_their_limit() {
        let nodes = [
            NodeView {
                max_concurrency: 2,
                active: 2,
                ..node("a")
            },
            NodeView {
                max_concurrency: 1,
                active: 0,
                ..node("b")
            },
            NodeView {
                max_concurrency: 0,
                active: 99,
                ..node("c")
            },
        ];
        let mut st = RouteState::default();
        let got: Vec<String> = (0..3)
            .map(|_| pick(RouteStrategy::Busyover, &nodes, &mut st))
            .collect();
        assert_eq!(got, ["b", "b", "c"]);
        let all_full = [NodeView {
            max_concurrency: 1,
            active: 1,
            ..node("a")
        }];
        assert_eq!(
            route(RouteStrategy::Busyover, &all_full, "", &mut st, 0.0),
            Route::NoNode
        );
    }

    #[test]
    fn failover_takes_the_first_in_stable_order_and_slow_nodes_go_last() {
        let mut st = RouteState::default();
        let nodes = [node("b"), node("a")];
        assert_eq!(pick(RouteStrategy::Failover, &nodes, &mut st), "a");
        assert_eq!(pick(RouteStrategy::First, &nodes, &mut st), "a");
        let slow_a = [
            NodeView {
                slow: true,
                ..node("a")
            },
            node("b"),
        ];
        assert_eq!(pick(RouteStrategy::Failover, &slow_a, &mut st), "b");
        assert_eq!(pick(RouteStrategy::RoundRobin, &slow_a, &mut st), "b");
        let only_slow = [NodeView {
            slow: true,
            ..node("a")
        }];
        assert_eq!(
            pick(RouteStrategy::RoundRobin, &only_slow, &mut st),
            "a",
            "slow beats none"
        );
    }

    #[test]
    fn broadcast_numbers_every_node_in_stable_order() {
        let nodes = [
            node("c"),
            NodeView {
                slow: true,
                ..node("a")
            },
            node("b"),
        ];
        assert_eq!(
            route(
                RouteStrategy::ShardingBroadcast,
                &nodes,
                "",
                &mut RouteState::default(),
                0.0
            ),
            Route::All(vec!["a".into(), "b".into(), "c".into()])
        );
    }

    #[test]
    fn consistent_hash_routes_a_key_to_the_same_node_until_that_node_leaves() {
        let mut st = RouteState::default();
        let nodes = vec![node("a"), node("b"), node("c")];
        let at = |nodes: &[NodeView], st: &mut RouteState| match route(
            RouteStrategy::ConsistentHash,
            nodes,
            "customer_id42",
            st,
            0.0,
        ) {
            Route::One(n) => n,
            other => panic!("{other:?}"),
        };
        let owner = at(&nodes, &mut st);
        for _ in 0..5 {
            assert_eq!(at(&nodes, &mut st), owner);
        }
        // The cached ring follows the node set: without the owner the key moves.
        let without: Vec<NodeView> = nodes
            .iter()
            .filter(|n| n.node_id != owner)
            .cloned()
            .collect();
        let moved = at(&without, &mut st);
        assert_ne!(moved, owner);
        assert_eq!(at(&nodes, &mut st), owner, "and comes back with it");
    }

    #[test]
    fn fnv1_32_hash_known_values() {
        // FNV-1a 32 reference values ("" and "a"), then the finalizer applied to them.
        assert_eq!(fnv1a_32(""), 0x811c_9dc5);
        assert_eq!(fnv1a_32("a"), 0xe40c_292c);
        assert_ne!(fnv1_32_hash("a"), fnv1a_32("a"));
        assert_eq!(fnv1_32_hash("a"), fnv1_32_hash("a"));
    }

    /// Distribution and movement on realistic keys, printed (`cargo test -p
    /// sundial-server routing -- --nocapture`), with the bounds the routing issue sets.
    #[test]
    fn consistent_hash_spreads_keys_and_moves_only_what_must_move() {
        /// max/mean keys per node, the mean taken over all `nodes` (a node that gets
        /// nothing counts).
        fn spread(ring: &HashRing, hash: fn(&str) -> u32, keys: &[String], nodes: usize) -> f64 {
            let mut counts: HashMap<String, usize> = HashMap::new();
            for k in keys {
                if let Some(n) = ring.node_for_hash(hash(k)) {
                    *counts.entry(n.to_owned()).or_default() += 1;
                }
            }
            let mean = keys.len() as f64 / nodes.max(1) as f64;
            let max = counts.values().copied().max().unwrap_or(0) as f64;
            max / mean
        }
        /// Java's `String.hashCode` (31·h + c), what naive rings often use.
        fn java_hash(s: &str) -> u32 {
            s.bytes()
                .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
        }
        let key_sets: Vec<(&str, Vec<String>)> = vec![
            (
                "customer_id1..100000",
                (1..=100_000).map(|i| format!("customer_id{i}")).collect(),
            ),
            (
                "long shared prefix",
                (1..=100_000)
                    .map(|i| format!("tenant-eu-west-1/warehouse-000042/orders/{i}"))
                    .collect(),
            ),
        ];
        let node_sets: Vec<Vec<&str>> = vec![
            vec!["node-1", "node-2", "node-3"],
            vec!["10.0.0.11:9999", "10.0.0.12:9999", "10.0.0.13:9999"],
            vec!["executor-a", "executor-b", "executor-c"],
        ];
        for (name, keys) in &key_sets {
            for nodes in &node_sets {
                let ring = HashRing::new(nodes.iter().copied(), DEFAULT_VIRTUAL_NODES);
                let ratio = spread(&ring, fnv1_32_hash, keys, nodes.len());
                let plain =
                    HashRing::with_hash(nodes.iter().copied(), DEFAULT_VIRTUAL_NODES, fnv1a_32);
                let plain_ratio = spread(&plain, fnv1a_32, keys, nodes.len());
                let java_ring =
                    HashRing::with_hash(nodes.iter().copied(), DEFAULT_VIRTUAL_NODES, java_hash);
                let java_ratio = spread(&java_ring, java_hash, keys, nodes.len());
                // A 4th node joins: every key that moves must move to it.
                let mut grown: Vec<&str> = nodes.clone();
                grown.push("node-new");
                let bigger = HashRing::new(grown.iter().copied(), DEFAULT_VIRTUAL_NODES);
                let mut moved = 0usize;
                for k in keys {
                    let before = ring.node_for(k);
                    let after = bigger.node_for(k);
                    if before != after {
                        assert_eq!(after, Some("node-new"), "{k} moved between old nodes");
                        moved += 1;
                    }
                }
                let share = moved as f64 / keys.len() as f64;
                println!(
                    "{name:>22} | nodes {:<44} | max/mean FNV1_32_HASH {ratio:.3}, plain FNV-1a {plain_ratio:.3}, String.hashCode {java_ratio:.3} | 4th node takes {:.1} %",
                    nodes.join(","),
                    share * 100.0
                );
                assert!(ratio <= 1.25, "{name} on {nodes:?}: max/mean {ratio:.3}");
                assert!((0.15..=0.35).contains(&share), "moved share {share:.3}");
            }
        }
    }
}
