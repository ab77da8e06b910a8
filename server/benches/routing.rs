//! Cost of one routing decision per strategy with 10, 100 and 1,000 nodes:
//! `cargo bench -p sundial-server --bench routing`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use sundial_server::dispatch::routing::{
    DEFAULT_VIRTUAL_NODES, HashRing, NodeView, RouteState, route,
};
use sundial_server::model::RouteStrategy;

fn nodes(n: usize) -> Vec<NodeView> {
    (0..n)
        .map(|i| NodeView {
            node_id: format!("executor-{i:04}"),
            weight: 1 + (i % 5) as u32,
            max_concurrency: 8,
            active: (i % 9) as u32,
            mean_duration_ms: (i * 37 % 1000) as u64,
            recent_errors: (i % 3) as u32,
            slow: i % 17 == 0,
        })
        .collect()
}

fn strategies(c: &mut Criterion) {
    for n in [10, 100, 1000] {
        let snapshot = nodes(n);
        let mut group = c.benchmark_group(format!("route/{n}_nodes"));
        for s in [
            RouteStrategy::RoundRobin,
            RouteStrategy::WeightedRoundRobin,
            RouteStrategy::Random,
            RouteStrategy::LeastActive,
            RouteStrategy::Busyover,
            RouteStrategy::Failover,
            RouteStrategy::ShardingBroadcast,
            RouteStrategy::ConsistentHash,
        ] {
            let mut state = RouteState::default();
            let mut i = 0u64;
            group.bench_function(BenchmarkId::from_parameter(format!("{s:?}")), |b| {
                b.iter(|| {
                    i += 1;
                    black_box(route(
                        s,
                        black_box(&snapshot),
                        "customer_id42",
                        &mut state,
                        (i % 1000) as f64 / 1000.0,
                    ))
                })
            });
        }
        // A ring built once and reused: what dispatch should cache per node-set change.
        let ring = HashRing::new(
            snapshot.iter().map(|n| n.node_id.as_str()),
            DEFAULT_VIRTUAL_NODES,
        );
        let mut i = 0u64;
        group.bench_function(
            BenchmarkId::from_parameter("ConsistentHash (cached ring)"),
            |b| {
                b.iter(|| {
                    i += 1;
                    black_box(ring.node_for(&format!("customer_id{i}")))
                })
            },
        );
        group.finish();
    }
}

criterion_group!(benches, strategies);
criterion_main!(benches);
