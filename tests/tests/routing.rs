//! Routing and node health with real executor processes (`test_executor`, the Rust
//! SDK) on real gRPC streams and a real Redis: consistent hashing keeps a key on its
//! node until that node dies, least-active goes around a busy node, a node that fails
//! every run stops getting work, a drained node gets none, broadcast reaches every
//! node with its shard, and two server instances share one round-robin sequence.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use sundial_proto::v1 as pb;
use sundial_proto::v1::node_service_client::NodeServiceClient;
use sundial_tests::{RedisServer, Sundial, SundialOptions, TestExecutor, wait_for};

const EXECUTOR: &str = env!("CARGO_BIN_EXE_test_executor");

fn opts(redis: &RedisServer, instance: &str) -> SundialOptions {
    SundialOptions::redis(redis)
        .arg("instance-id", instance)
        .arg("heartbeat-interval", "300ms")
        .arg("sweep-every", "50ms")
        .arg("route-retry", "200ms")
}

fn job(id: &str, handler: &str, strategy: pb::RouteStrategy, route_key: &str) -> pb::JobSpec {
    pb::JobSpec {
        id: id.into(),
        cron: sundial_tests::MANUAL_ONLY.into(),
        target: Some(pb::job_spec::Target::Executor(pb::ExecutorTarget {
            group: "g".into(),
            handler: handler.into(),
        })),
        route_strategy: strategy as i32,
        route_key: route_key.into(),
        ..Default::default()
    }
}

async fn trigger_with_key(server: &Sundial, job_id: &str, route_key: &str) -> Result<String> {
    Ok(server
        .jobs()
        .await?
        .trigger_job(pb::TriggerJobRequest {
            job_id: job_id.into(),
            route_key: route_key.into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .schedule_id)
}

async fn nodes(server: &Sundial) -> Result<Vec<pb::Node>> {
    Ok(NodeServiceClient::new(server.channel().await?)
        .list_nodes(pb::ListNodesRequest::default())
        .await?
        .into_inner()
        .nodes)
}

async fn node(server: &Sundial, id: &str) -> Result<Option<pb::Node>> {
    Ok(nodes(server).await?.into_iter().find(|n| n.node_id == id))
}

/// `spec` with one retry after 50 ms: a failed attempt runs again elsewhere.
fn retried_once(spec: pb::JobSpec) -> pb::JobSpec {
    pb::JobSpec {
        retry: Some(pb::RetryPolicy {
            max_retries: 1,
            backoff_ms: 50,
            ..Default::default()
        }),
        ..spec
    }
}

/// Waits until every node of `ids` is in the registry.
async fn wait_listed(server: &Sundial, ids: &[&str]) -> Result<()> {
    for &id in ids {
        wait_for(&format!("{id} listed"), Duration::from_secs(20), || async {
            node(server, id).await
        })
        .await?;
    }
    Ok(())
}

fn start_executors(
    endpoints: &[String],
    dir: &std::path::Path,
    ids: &[&str],
) -> Result<Vec<TestExecutor>> {
    ids.iter()
        .map(|id| TestExecutor::start(EXECUTOR, endpoints, id, &dir.join(format!("{id}.log"))))
        .collect()
}

/// 100 triggers with one route key land on one node; keys spread over the nodes; when
/// a node dies its keys move and no other key does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_hash_keeps_keys_on_their_node_until_it_dies() -> Result<()> {
    let redis = RedisServer::start()?;
    let server = Sundial::start(opts(&redis, "a"))?;
    let dir = tempfile::tempdir()?;
    let endpoints = vec![format!("http://{}", server.grpc)];
    let mut execs = start_executors(&endpoints, dir.path(), &["n1", "n2", "n3"])?;
    server
        .create_job(job(
            "ch",
            "noop",
            pb::RouteStrategy::ConsistentHash,
            "customer_id42",
        ))
        .await?;

    let mut sids = Vec::new();
    for _ in 0..100 {
        sids.push(server.trigger("ch").await?);
    }
    let mut on = BTreeSet::new();
    for sid in &sids {
        let run = server.finished(sid).await?;
        ensure!(run.state == pb::RunState::Succeeded as i32, "{run:?}");
        on.insert(run.node_id);
    }
    ensure!(on.len() == 1, "one key went to {on:?}");
    let home = on.into_iter().next().context("no node")?;

    // Twenty other keys, once each: where each one lives.
    let keys: Vec<String> = (1..=20).map(|i| format!("customer_id{i}")).collect();
    let mut before = BTreeMap::new();
    for k in &keys {
        let sid = trigger_with_key(&server, "ch", k).await?;
        before.insert(k.clone(), server.finished(&sid).await?.node_id);
    }
    let used: BTreeSet<&String> = before.values().collect();
    ensure!(used.len() >= 2, "20 keys all on {used:?}");

    // Kill the home node; wait until the registry drops it.
    let victim = execs
        .iter()
        .position(|e| e.node_id == home)
        .context("home node is not ours")?;
    execs[victim].kill()?;
    wait_for(
        "the dead node to leave",
        Duration::from_secs(10),
        || async { Ok(node(&server, &home).await?.is_none().then_some(())) },
    )
    .await?;

    let sid = server.trigger("ch").await?;
    let moved_to = server.finished(&sid).await?.node_id;
    ensure!(moved_to != home && !moved_to.is_empty(), "{moved_to}");
    for k in &keys {
        let sid = trigger_with_key(&server, "ch", k).await?;
        let now = server.finished(&sid).await?.node_id;
        if before[k] == home {
            ensure!(now != home, "{k} still on the dead node");
        } else {
            ensure!(
                now == before[k],
                "{k} moved from {} to {now} though its node lives",
                before[k]
            );
        }
    }
    Ok(())
}

/// A node busy with long runs: least-active sends new work to the idle one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_active_goes_around_a_busy_node() -> Result<()> {
    let redis = RedisServer::start()?;
    let server = Sundial::start(opts(&redis, "a"))?;
    let dir = tempfile::tempdir()?;
    let endpoints = vec![format!("http://{}", server.grpc)];
    let _execs = start_executors(&endpoints, dir.path(), &["busy", "idle"])?;
    // FIRST puts every long run on "busy" (first in node-id order).
    let long = pb::JobSpec {
        payload: b"8000".to_vec(),
        ..job("long", "sleep", pb::RouteStrategy::First, "")
    };
    server.create_job(long).await?;
    server
        .create_job(job("quick", "noop", pb::RouteStrategy::LeastActive, ""))
        .await?;
    let mut long_runs = Vec::new();
    for _ in 0..3 {
        long_runs.push(server.trigger("long").await?);
    }
    wait_for(
        "busy to report 3 active",
        Duration::from_secs(10),
        || async {
            Ok(node(&server, "busy")
                .await?
                .filter(|n| n.active == 3)
                .map(|_| ()))
        },
    )
    .await?;
    for sid in &long_runs {
        let run = server.run(sid).await?;
        ensure!(run.node_id == "busy", "{run:?}");
    }
    // Past one registry refresh of the dispatcher (250 ms).
    tokio::time::sleep(Duration::from_secs(1)).await;
    for _ in 0..10 {
        let sid = server.trigger("quick").await?;
        let run = server.finished(&sid).await?;
        ensure!(
            run.state == pb::RunState::Succeeded as i32 && run.node_id == "idle",
            "a quick run went to {:?}: {run:?}",
            run.node_id
        );
    }
    Ok(())
}

/// A node that fails every run is dropped from routing once it has enough results in
/// the window; ListNodes says so; work goes to the healthy node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_node_stops_getting_work() -> Result<()> {
    let redis = RedisServer::start()?;
    let server = Sundial::start(
        opts(&redis, "a")
            .arg("health-window", "1m")
            .arg("health-min-results", "3")
            .arg("slow-below", "0.9")
            .arg("drop-below", "0.5")
            // No probe run within the test (a_dropped_node_is_probed_back_* has them).
            .arg("health-probe-every", "1h"),
    )?;
    let dir = tempfile::tempdir()?;
    let endpoints = vec![format!("http://{}", server.grpc)];
    let _sick = TestExecutor::start_with(
        EXECUTOR,
        &endpoints,
        "a-sick",
        &dir.path().join("sick.log"),
        &["--failing"],
    )?;
    let _well = TestExecutor::start(EXECUTOR, &endpoints, "b-well", &dir.path().join("well.log"))?;
    server
        .create_job(job("rr", "noop", pb::RouteStrategy::RoundRobin, ""))
        .await?;

    // Round robin alternates until the sick node has 3 failed results in the window;
    // then the registry says FAILING.
    let mut on_sick = 0;
    let mut runs = 0;
    while node(&server, "a-sick")
        .await?
        .context("sick node listed")?
        .health
        != pb::NodeHealth::Failing as i32
    {
        ensure!(
            runs < 60,
            "the sick node ran {on_sick} of {runs} and is not FAILING"
        );
        let sid = server.trigger("rr").await?;
        let run = server.finished(&sid).await?;
        if run.node_id == "a-sick" {
            ensure!(run.state == pb::RunState::Failed as i32, "{run:?}");
            on_sick += 1;
        }
        runs += 1;
    }
    ensure!(on_sick >= 3, "FAILING after {on_sick} failed runs");
    // Once every instance's registry snapshot (refreshed every 250 ms) has seen it, the
    // sick node gets nothing.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for _ in 0..10 {
        let sid = server.trigger("rr").await?;
        let run = server.finished(&sid).await?;
        ensure!(
            run.node_id == "b-well" && run.state == pb::RunState::Succeeded as i32,
            "{run:?}"
        );
    }
    let sick = node(&server, "a-sick").await?.context("sick node listed")?;
    ensure!(
        sick.health == pb::NodeHealth::Failing as i32 && sick.success_rate == 0.0,
        "{sick:?}"
    );
    let well = node(&server, "b-well").await?.context("well node listed")?;
    ensure!(
        well.health == pb::NodeHealth::Healthy as i32 && well.success_rate == 1.0,
        "{well:?}"
    );
    Ok(())
}

/// DrainNode: the node finishes what it holds and gets no new work; ListNodes shows
/// it draining; an unknown node is NOT_FOUND. UndrainNode: it takes work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_node_gets_no_new_work() -> Result<()> {
    let redis = RedisServer::start()?;
    let server = Sundial::start(opts(&redis, "a"))?;
    let dir = tempfile::tempdir()?;
    let endpoints = vec![format!("http://{}", server.grpc)];
    let _execs = start_executors(&endpoints, dir.path(), &["d1", "d2"])?;
    let long = pb::JobSpec {
        payload: b"1500".to_vec(),
        ..job("held", "sleep", pb::RouteStrategy::First, "")
    };
    server.create_job(long).await?;
    server
        .create_job(job("rr", "noop", pb::RouteStrategy::RoundRobin, ""))
        .await?;
    let held = server.trigger("held").await?;
    wait_for("held to run on d1", Duration::from_secs(10), || async {
        let run = server.run(&held).await?;
        Ok((run.state == pb::RunState::Running as i32 && run.node_id == "d1").then_some(()))
    })
    .await?;

    let mut admin = NodeServiceClient::new(server.channel().await?);
    let drained = admin
        .drain_node(pb::DrainNodeRequest {
            node_id: "d1".into(),
            reason: "maintenance".into(),
        })
        .await?
        .into_inner()
        .node
        .context("no node")?;
    ensure!(
        drained.health == pb::NodeHealth::Draining as i32,
        "{drained:?}"
    );
    let unknown = admin
        .drain_node(pb::DrainNodeRequest {
            node_id: "nope".into(),
            reason: String::new(),
        })
        .await
        .expect_err("unknown node");
    ensure!(unknown.code() == tonic::Code::NotFound, "{unknown:?}");
    wait_for("d1 to report draining", Duration::from_secs(10), || async {
        Ok(node(&server, "d1")
            .await?
            .filter(|n| n.health == pb::NodeHealth::Draining as i32)
            .map(|_| ()))
    })
    .await?;
    for _ in 0..8 {
        let sid = server.trigger("rr").await?;
        let run = server.finished(&sid).await?;
        ensure!(
            run.state == pb::RunState::Succeeded as i32 && run.node_id == "d2",
            "{run:?}"
        );
    }
    // The run it held still finishes there.
    let run = server.finished(&held).await?;
    ensure!(
        run.state == pb::RunState::Succeeded as i32 && run.node_id == "d1",
        "{run:?}"
    );

    // Drain the other one too: no healthy executor is left. A run fails saying so,
    // and is retried by its policy (not lost, not stuck).
    admin
        .drain_node(pb::DrainNodeRequest {
            node_id: "d2".into(),
            reason: String::new(),
        })
        .await?;
    wait_for("d2 to report draining", Duration::from_secs(10), || async {
        Ok(node(&server, "d2")
            .await?
            .filter(|n| n.health == pb::NodeHealth::Draining as i32)
            .map(|_| ()))
    })
    .await?;
    let retried = pb::JobSpec {
        retry: Some(pb::RetryPolicy {
            max_retries: 1,
            backoff_ms: 100,
            ..Default::default()
        }),
        ..job("nobody", "noop", pb::RouteStrategy::RoundRobin, "")
    };
    server.create_job(retried).await?;
    let sid = server.trigger("nobody").await?;
    let run = server.finished(&sid).await?;
    ensure!(
        run.state == pb::RunState::Failed as i32
            && run.attempt == 2
            && run.error_code == "no_executor"
            && run.error_message.contains("no healthy executor"),
        "{run:?}"
    );

    // UndrainNode: d1 takes work again (told so on its stream, ready at its next
    // heartbeat); d2 stays drained.
    let undrained = admin
        .undrain_node(pb::UndrainNodeRequest {
            node_id: "d1".into(),
            reason: "maintenance over".into(),
        })
        .await?
        .into_inner()
        .node
        .context("no node")?;
    ensure!(
        undrained.health != pb::NodeHealth::Draining as i32,
        "{undrained:?}"
    );
    let unknown = admin
        .undrain_node(pb::UndrainNodeRequest {
            node_id: "nope".into(),
            reason: String::new(),
        })
        .await
        .expect_err("unknown node");
    ensure!(unknown.code() == tonic::Code::NotFound, "{unknown:?}");
    wait_for("d1 to report healthy", Duration::from_secs(10), || async {
        Ok(node(&server, "d1")
            .await?
            .filter(|n| n.health == pb::NodeHealth::Healthy as i32)
            .map(|_| ()))
    })
    .await?;
    for _ in 0..4 {
        let sid = server.trigger("rr").await?;
        let run = server.finished(&sid).await?;
        ensure!(
            run.state == pb::RunState::Succeeded as i32 && run.node_id == "d1",
            "{run:?}"
        );
    }
    Ok(())
}

/// Sharding broadcast: every node runs one shard with the right numbers; the run
/// succeeds when all do, and fails naming the shard when one fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcast_reaches_every_node_with_its_shard() -> Result<()> {
    let redis = RedisServer::start()?;
    let server = Sundial::start(opts(&redis, "a"))?;
    let dir = tempfile::tempdir()?;
    let endpoints = vec![format!("http://{}", server.grpc)];
    let mut execs = start_executors(&endpoints, dir.path(), &["s1", "s2", "s3"])?;
    server
        .create_job(job("bc", "shard", pb::RouteStrategy::ShardingBroadcast, ""))
        .await?;
    let sid = server.trigger("bc").await?;
    let run = server.finished(&sid).await?;
    ensure!(
        run.state == pb::RunState::Succeeded as i32
            && (run.shard_total, run.shards_done, run.shards_succeeded) == (3, 3, 3),
        "{run:?}"
    );
    let mut nodes_seen = BTreeSet::new();
    for i in 0..3u32 {
        let shard = server.run(&format!("{sid}#{i}")).await?;
        ensure!(
            shard.state == pb::RunState::Succeeded as i32
                && shard.shard_index == i
                && shard.parent_schedule_id == sid
                && shard.output == format!("{i}/3").into_bytes(),
            "{shard:?}"
        );
        nodes_seen.insert(shard.node_id);
    }
    ensure!(
        nodes_seen == BTreeSet::from(["s1".to_owned(), "s2".to_owned(), "s3".to_owned()]),
        "{nodes_seen:?}"
    );
    // The run list shows the run, not its shards.
    let listed = sundial_tests::all_runs(&mut server.runs().await?, "bc").await?;
    ensure!(listed.len() == 1, "{listed:?}");

    // One node that fails every run: the broadcast fails and names its shard.
    execs.truncate(2);
    let _sick = TestExecutor::start_with(
        EXECUTOR,
        &endpoints,
        "s4-sick",
        &dir.path().join("s4.log"),
        &["--failing"],
    )?;
    wait_for("s3 gone, s4-sick in", Duration::from_secs(10), || async {
        let ids: BTreeSet<String> = nodes(&server)
            .await?
            .into_iter()
            .map(|n| n.node_id)
            .collect();
        Ok((ids.len() == 3 && ids.contains("s4-sick") && !ids.contains("s3")).then_some(()))
    })
    .await?;
    // Past one registry refresh of the dispatcher (250 ms).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let sid = server.trigger("bc").await?;
    let run = server.finished(&sid).await?;
    ensure!(
        run.state == pb::RunState::Failed as i32
            && run.error_code == "shards_failed"
            && run.error_message.contains("shard 2 FAILED (boom)")
            && (run.shards_done, run.shards_succeeded) == (3, 2),
        "{run:?}"
    );
    Ok(())
}

/// Two server instances route one round-robin job: dispatches decided one at a time
/// follow one cycle over the nodes, whichever instance decides. (An instance alone
/// keeps its counters in memory; each shares them from its first beat that finds the
/// other alive, within `instance-ttl` / 3 = 1 s here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_is_shared_across_instances() -> Result<()> {
    let redis = RedisServer::start()?;
    let a = Sundial::start(opts(&redis, "a"))?;
    let b = Sundial::start(opts(&redis, "b"))?;
    // Both beat since both are up (every second): `a` beat alone before `b` started.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let dir = tempfile::tempdir()?;
    let endpoints = vec![format!("http://{}", a.grpc), format!("http://{}", b.grpc)];
    let _execs = start_executors(&endpoints, dir.path(), &["r1", "r2", "r3"])?;
    a.create_job(job("rr", "noop", pb::RouteStrategy::RoundRobin, ""))
        .await?;
    let mut order = Vec::new();
    for i in 0..12 {
        let via = if i % 2 == 0 { &a } else { &b };
        let sid = via.trigger("rr").await?;
        let run = via.finished(&sid).await?;
        ensure!(run.state == pb::RunState::Succeeded as i32, "{run:?}");
        order.push(run.node_id);
    }
    // One cycle, wherever it started: each node exactly every third run.
    for (i, n) in order.iter().enumerate() {
        ensure!(*n == order[i % 3], "not one shared cycle: {order:?}");
    }
    let distinct: BTreeSet<&String> = order.iter().collect();
    ensure!(distinct.len() == 3, "{order:?}");
    Ok(())
}

/// Many jobs due in the same second, each firing once, on four executors: round robin
/// and least active each spread the burst over every executor (neither leaves a node
/// idle while another takes the burst; round robin gives each at least a fifth), and
/// every run starts exactly once and succeeds. Both stores.
async fn a_burst_spreads_over_every_executor(store: &str) -> Result<()> {
    const JOBS: usize = 200;
    let redis;
    let dir = tempfile::tempdir()?;
    // A 1 s heartbeat (3 s leases): the burst's confirmations must not be outrun by
    // the short leases of the other tests on a slow debug build.
    let server = if store == "redis" {
        redis = RedisServer::start()?;
        Sundial::start(opts(&redis, "a").arg("heartbeat-interval", "1s"))?
    } else {
        Sundial::start(
            SundialOptions::embedded(&dir.path().join("data"))
                .arg("heartbeat-interval", "1s")
                .arg("sweep-every", "50ms")
                .arg("route-retry", "200ms"),
        )?
    };
    let ids = ["s1", "s2", "s3", "s4"];
    // A window the burst cannot fill: with the default (64 leases a node, 256 in all
    // for 400 runs) a node whose debug executor finishes slowly fills it, and its
    // turns pass to the others as they should (a full node is skipped), which is the
    // window at work, not the strategy this test looks at.
    let window = (2 * JOBS).to_string();
    let execs = ids
        .iter()
        .map(|id| {
            TestExecutor::start_with(
                EXECUTOR,
                &[format!("http://{}", server.grpc)],
                id,
                &dir.path().join(format!("{id}.log")),
                &["--max-concurrency", &window],
            )
        })
        .collect::<Result<Vec<_>>>()?;
    wait_for("four executors", Duration::from_secs(20), || async {
        Ok((nodes(&server).await?.len() == ids.len()).then_some(()))
    })
    .await?;
    // One fire each, at a whole second far enough ahead for the registration.
    let due = (sundial_tests::now_ms() + 3_000) / 1000 * 1000 + 1000;
    let strategies = [
        pb::RouteStrategy::RoundRobin,
        pb::RouteStrategy::LeastActive,
    ];
    let specs: Vec<pb::JobSpec> = strategies
        .iter()
        .flat_map(|&strategy| {
            (0..JOBS).map(move |i| pb::JobSpec {
                cron: "* * * * * *".into(),
                start_time_ms: due,
                end_time_ms: due + 1,
                ..job(
                    &format!("{}-{i}", strategy.as_str_name()),
                    "noop",
                    strategy,
                    "",
                )
            })
        })
        .collect();
    sundial_tests::register(&server.jobs().await?, specs, 1).await?;
    let journals: Vec<_> = execs.iter().map(|e| e.journal.clone()).collect();
    let total = JOBS * strategies.len();
    // A bound, not a speed: a debug build of the embedded store on a loaded machine
    // was seen to need more than a minute for these 400 runs.
    let waited = wait_for("every run to finish", Duration::from_secs(180), || async {
        let entries = sundial_tests::read_journals(&journals)?;
        let finished = entries.iter().filter(|e| e.event == "finish").count();
        Ok((finished >= total).then_some(()))
    })
    .await;
    if let Err(e) = waited {
        return Err(
            e.context(unfinished_report(&server, &journals, &specs_ids(&strategies, JOBS)).await)
        );
    }
    // Whatever could still arrive late would be a second start: give it a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let entries = sundial_tests::read_journals(&journals)?;
    let starts: Vec<_> = entries.iter().filter(|e| e.event == "start").collect();
    let distinct: BTreeSet<&str> = starts.iter().map(|e| e.schedule_id.as_str()).collect();
    let mut seen = BTreeMap::<&str, usize>::new();
    for e in &starts {
        *seen.entry(e.schedule_id.as_str()).or_default() += 1;
    }
    let twice: Vec<&&sundial_tests::JournalEntry> = starts
        .iter()
        .filter(|e| seen[e.schedule_id.as_str()] > 1)
        .take(12)
        .collect();
    ensure!(
        starts.len() == total && distinct.len() == total,
        "{} starts of {} runs, {total} expected; started twice: {twice:?}",
        starts.len(),
        distinct.len()
    );
    ensure!(
        entries
            .iter()
            .filter(|e| e.event == "finish")
            .all(|e| e.status == "SUCCEEDED"),
        "every run succeeded"
    );
    let spread = |prefix: &str| {
        let mut per_node: BTreeMap<&str, usize> = ids.iter().map(|id| (*id, 0)).collect();
        for e in starts.iter().filter(|e| e.schedule_id.starts_with(prefix)) {
            *per_node.entry(e.node_id.as_str()).or_default() += 1;
        }
        per_node
    };
    // An even share is a quarter. Round robin gives every executor at least a fifth of
    // its runs; least active counts what each node has in hand, so a node slower to
    // confirm and finish gets less (beside the whole suite on 2 cores one got 13 of
    // 200 while another got 90), but it leaves none idle: at least a twentieth.
    let by_strategy: Vec<_> = strategies
        .iter()
        .map(|s| (*s, spread(&format!("{}-", s.as_str_name()))))
        .collect();
    println!("{store}: runs started per node: {by_strategy:?}");
    for (strategy, per_node) in &by_strategy {
        let floor = if *strategy == pb::RouteStrategy::RoundRobin {
            JOBS / 5
        } else {
            JOBS / 20
        };
        ensure!(
            per_node.values().all(|&n| n >= floor),
            "{strategy:?} gave a node under {floor} of {JOBS}: {by_strategy:?}"
        );
    }
    Ok(())
}

fn specs_ids(strategies: &[pb::RouteStrategy], jobs: usize) -> Vec<String> {
    strategies
        .iter()
        .flat_map(|s| (0..jobs).map(move |i| format!("{}-{i}", s.as_str_name())))
        .collect()
}

/// What a timed-out burst left behind: the store's view of every run whose handler has
/// not finished in the journals (status, attempt, node, error), and the server's log.
async fn unfinished_report(
    server: &Sundial,
    journals: &[std::path::PathBuf],
    job_ids: &[String],
) -> String {
    let finished: BTreeSet<String> = sundial_tests::read_journals(journals)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.event == "finish")
        .map(|e| e.schedule_id)
        .collect();
    let mut lines = Vec::new();
    let mut runs = match server.runs().await {
        Ok(r) => r,
        Err(e) => return format!("no run client: {e}"),
    };
    for id in job_ids {
        match sundial_tests::all_runs(&mut runs, id).await {
            Ok(rs) if rs.is_empty() => lines.push(format!("{id}: no run")),
            Ok(rs) => {
                for r in rs.iter().filter(|r| !finished.contains(&r.schedule_id)) {
                    lines.push(format!(
                        "{id}: {} {:?} attempt {} node {:?} reason {:?} error {:?}",
                        r.schedule_id,
                        r.state(),
                        r.attempt,
                        r.node_id,
                        r.reason,
                        r.error_message,
                    ));
                }
            }
            Err(e) => lines.push(format!("{id}: {e}")),
        }
    }
    let log = std::env::temp_dir().join("sundial-burst-spread.log");
    let _ = std::fs::write(&log, server.stderr());
    format!(
        "{} runs not finished in the journals (server log in {}):\n{}",
        lines.len(),
        log.display(),
        lines.join("\n")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_spreads_over_every_executor_on_redis() -> Result<()> {
    a_burst_spreads_over_every_executor("redis").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_spreads_over_every_executor_on_the_embedded_store() -> Result<()> {
    a_burst_spreads_over_every_executor("embedded").await
}

/// A job that fails its first attempt everywhere (and succeeds its second) makes no
/// node sick: its failures are the job's, judged against the node's peers on the same
/// handler. 100 runs over three executors, ten at a time: all three stay HEALTHY, each
/// executes at least a fifth of the 200 attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_failing_everywhere_makes_no_node_sick() -> Result<()> {
    const RUNS: usize = 100;
    let redis = RedisServer::start()?;
    let server = Sundial::start(opts(&redis, "a"))?;
    let dir = tempfile::tempdir()?;
    let endpoints = vec![server.grpc_url()];
    let ids = ["n1", "n2", "n3"];
    let _execs = start_executors(&endpoints, dir.path(), &ids)?;
    server
        .create_job(retried_once(job(
            "flaky",
            "flaky",
            pb::RouteStrategy::RoundRobin,
            "",
        )))
        .await?;
    wait_listed(&server, &ids).await?;
    for _ in 0..RUNS / 10 {
        let mut sids = Vec::new();
        for _ in 0..10 {
            sids.push(server.trigger("flaky").await?);
        }
        for sid in &sids {
            let run = server.finished(sid).await?;
            ensure!(
                run.state == pb::RunState::Succeeded as i32 && run.attempt == 2,
                "{run:?}"
            );
        }
    }
    let journals: Vec<_> = ids
        .iter()
        .map(|id| dir.path().join(format!("{id}.log")))
        .collect();
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for e in sundial_tests::read_journals(&journals)? {
        if e.event == "start" {
            *per_node.entry(e.node_id).or_default() += 1;
        }
    }
    let listed = nodes(&server).await?;
    let health: BTreeMap<&str, (i32, &str)> = listed
        .iter()
        .map(|n| (n.node_id.as_str(), (n.health, n.health_reason.as_str())))
        .collect();
    println!("attempts per node: {per_node:?}; health: {health:?}");
    for id in ids {
        let n = per_node.get(id).copied().unwrap_or(0);
        ensure!(
            n * 5 >= 2 * RUNS,
            "{id} ran {n} of {} attempts: {per_node:?}",
            2 * RUNS
        );
    }
    ensure!(
        listed
            .iter()
            .all(|n| n.health == pb::NodeHealth::Healthy as i32),
        "{health:?}"
    );
    Ok(())
}

/// A node that fails every run its peers run fine is dropped (FAILING); then it gets
/// only probe runs, one per `--health-probe-every` (a failed probe is retried
/// elsewhere), and once it recovers, three successful probes in a row bring it back
/// HEALTHY with a clean record, taking its turns again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_node_is_probed_back_after_it_recovers() -> Result<()> {
    const PROBE_EVERY: Duration = Duration::from_secs(1);
    let redis = RedisServer::start()?;
    let server = Sundial::start(
        opts(&redis, "a")
            .arg("health-min-results", "3")
            .arg("health-probe-every", "1s")
            // Probe decisions are logged at debug: printed if the node is not back.
            .env("RUST_LOG", "info,sundial_server::dispatch::router=debug"),
    )?;
    let dir = tempfile::tempdir()?;
    let endpoints = vec![server.grpc_url()];
    let sick_file = dir.path().join("sick");
    std::fs::write(&sick_file, b"")?;
    let journals = [dir.path().join("a-sick.log")];
    let _sick = TestExecutor::start_with(
        EXECUTOR,
        &endpoints,
        "a-sick",
        &journals[0],
        &["--failing-while", &sick_file.to_string_lossy()],
    )?;
    let _well = start_executors(&endpoints, dir.path(), &["b-well", "c-well"])?;
    server
        .create_job(retried_once(job(
            "rr",
            "noop",
            pb::RouteStrategy::RoundRobin,
            "",
        )))
        .await?;
    wait_listed(&server, &["a-sick", "b-well", "c-well"]).await?;
    let health = |id: &'static str| {
        let server = &server;
        async move {
            let n = node(server, id).await?.context("listed")?;
            Ok::<_, anyhow::Error>((n.health, n.health_reason))
        }
    };
    let run_one = || async {
        let sid = server.trigger("rr").await?;
        let run = server.finished(&sid).await?;
        ensure!(run.state == pb::RunState::Succeeded as i32, "{run:?}");
        Ok::<_, anyhow::Error>(run)
    };
    let attempts_on_sick = || -> Result<usize> {
        Ok(sundial_tests::read_journals(&journals)?
            .iter()
            .filter(|e| e.event == "start")
            .count())
    };

    // Dropped.
    let mut runs = 0;
    while health("a-sick").await?.0 != pb::NodeHealth::Failing as i32 {
        ensure!(runs < 60, "not FAILING after {runs} runs");
        run_one().await?;
        runs += 1;
    }
    println!(
        "a-sick FAILING after {runs} runs: {:?}",
        health("a-sick").await?
    );

    // Still sick: probes only, at most one per PROBE_EVERY (plus the one due at once),
    // each failing and retried elsewhere; the node stays FAILING.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (before, since) = (attempts_on_sick()?, std::time::Instant::now());
    for _ in 0..20 {
        run_one().await?;
    }
    let probes = attempts_on_sick()? - before;
    let bound = since.elapsed().as_millis() / PROBE_EVERY.as_millis() + 1;
    println!(
        "while sick: {probes} probes in 20 runs over {:?}",
        since.elapsed()
    );
    ensure!(
        u128::try_from(probes)? <= bound,
        "{probes} runs on the dropped node in {:?}",
        since.elapsed()
    );
    ensure!(health("a-sick").await?.0 == pb::NodeHealth::Failing as i32);

    // Recovered: its probes succeed, and three in a row bring it back.
    std::fs::remove_file(&sick_file)?;
    let recovered = std::time::Instant::now();
    let mut runs = 0;
    while health("a-sick").await?.0 != pb::NodeHealth::Healthy as i32 {
        if runs >= 200 {
            print_probe_log(&server);
            anyhow::bail!("not back after {runs} runs: {:?}", health("a-sick").await?);
        }
        run_one().await?;
        runs += 1;
    }
    println!(
        "a-sick back after {runs} runs, {:?}: {:?}",
        recovered.elapsed(),
        health("a-sick").await?
    );
    // Taking its turns again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut on_sick = 0;
    for _ in 0..9 {
        if run_one().await?.node_id == "a-sick" {
            on_sick += 1;
        }
    }
    ensure!(on_sick >= 2, "the recovered node ran {on_sick} of 9");
    Ok(())
}

/// The server's log lines about probes and forgiven failures (this test failed once in
/// a full run, not reproduced since: they say whether probes were sent and how they
/// ended).
fn print_probe_log(server: &Sundial) {
    let log = server.stderr();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("a-sick") || l.contains("prob") || l.contains("forgiven"))
        .collect();
    eprintln!(
        "the server's last {} lines about the probes:",
        lines.len().min(200)
    );
    for l in &lines[lines.len().saturating_sub(200)..] {
        eprintln!("{l}");
    }
}

/// The largest weights an executor may announce still take turns: two nodes of weight
/// u32::MAX under weighted round robin get two of four runs each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_weights_dispatch() -> Result<()> {
    let redis = RedisServer::start()?;
    let server = Sundial::start(opts(&redis, "a"))?;
    let channel = server.channel().await?;
    let mut execs = Vec::new();
    for id in ["a", "b"] {
        let (exec, _) = sundial_tests::raw::Exec::hello(
            channel.clone(),
            pb::Hello {
                node_id: id.into(),
                group: "g".into(),
                handlers: vec!["work".into()],
                weight: u32::MAX,
                ..Default::default()
            },
        )
        .await?;
        execs.push(exec);
    }
    server
        .create_job(job(
            "heavy",
            "work",
            pb::RouteStrategy::WeightedRoundRobin,
            "",
        ))
        .await?;
    for _ in 0..4 {
        server.trigger("heavy").await?;
    }
    for exec in &mut execs {
        for _ in 0..2 {
            let d = exec.dispatch().await?;
            ensure!(d.job_id == "heavy" && d.run.as_ref().is_some_and(|r| r.attempt == 1));
        }
    }
    drop(execs);
    Ok(())
}
