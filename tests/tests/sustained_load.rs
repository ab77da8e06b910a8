//! A sustained load with webhooks, end to end on each store: jobs firing every second
//! for a few seconds on real executor processes (`test_executor`, the Rust SDK), each
//! run's result delivered to a receiver in this process that verifies every delivery
//! by both signature schemes. What must hold at any speed: every fire ran exactly once
//! and succeeded on its first attempt (a lost lease would show as a second start or a
//! second attempt), and every run's webhook arrived once, signed, saying so. How fast
//! is `sundial-bench sustained`'s business, never asserted here.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use sundial_proto::v1 as pb;
use sundial_proto::v1::node_service_client::NodeServiceClient;
use sundial_sdk::webhook::Secret;
use sundial_tests::hooks::SignedReceiver;
use sundial_tests::{RedisServer, Sundial, SundialOptions, TestExecutor, wait_for};

const EXECUTOR: &str = env!("CARGO_BIN_EXE_test_executor");
/// Jobs, each firing every second.
const JOBS: usize = 60;
/// Seconds of firing: each job fires this many times.
const SECONDS: i64 = 5;
const EXECUTORS: [&str; 3] = ["s1", "s2", "s3"];

/// Short sweeps; 2 s heartbeats (6 s leases), so a debug build on a loaded two-core
/// machine renews in time (a lease lost that way would be a second start here).
fn settings(store: SundialOptions, secret: &Secret) -> SundialOptions {
    store
        .arg("instance-id", "a")
        .arg("heartbeat-interval", "2s")
        .arg("sweep-every", "50ms")
        .arg("webhook-allow", "127.0.0.1/32")
        .arg("webhook-secret", &secret.to_string())
}

async fn sustained_load_runs_and_delivers_each_once(
    store: SundialOptions,
    dir: &std::path::Path,
) -> Result<()> {
    let secret = Secret::generate();
    let receiver = SignedReceiver::start(&secret, 4096).await?;
    let server = Sundial::start(settings(store, &secret))?;
    let execs: Vec<TestExecutor> = EXECUTORS
        .iter()
        .map(|id| {
            TestExecutor::start(
                EXECUTOR,
                &[server.grpc_url()],
                id,
                &dir.join(format!("{id}.log")),
            )
        })
        .collect::<Result<_>>()?;
    let channel = server.channel().await?;
    wait_for("the executors", Duration::from_secs(20), || async {
        let nodes = NodeServiceClient::new(channel.clone())
            .list_nodes(pb::ListNodesRequest::default())
            .await?
            .into_inner()
            .nodes;
        Ok((nodes.len() == EXECUTORS.len()).then_some(()))
    })
    .await?;
    // Every job fires at each of the SECONDS whole seconds from `first`.
    let first = (sundial_tests::now_ms() + 3_000) / 1000 * 1000 + 1000;
    let specs: Vec<pb::JobSpec> = (0..JOBS)
        .map(|i| pb::JobSpec {
            id: format!("load-{i}"),
            cron: "* * * * * *".into(),
            start_time_ms: first,
            end_time_ms: first + (SECONDS - 1) * 1000 + 1,
            callback_url: receiver.url(),
            target: Some(pb::job_spec::Target::Executor(pb::ExecutorTarget {
                group: "g".into(),
                handler: "noop".into(),
            })),
            route_strategy: pb::RouteStrategy::RoundRobin as i32,
            ..Default::default()
        })
        .collect();
    sundial_tests::register(&server.jobs().await?, specs, 1).await?;
    let expected: BTreeSet<String> = (0..JOBS)
        .flat_map(|i| (0..SECONDS).map(move |s| format!("load-{i}@{}", first + s * 1000)))
        .collect();
    wait_for("every run's webhook", Duration::from_secs(120), || async {
        let delivered = receiver.read(|inbox| inbox.by_run.len());
        Ok((delivered >= expected.len()).then_some(()))
    })
    .await?;
    // Whatever could still arrive late would be a second start or a redelivery.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let journals: Vec<_> = execs.iter().map(|e| e.journal.clone()).collect();
    let entries = sundial_tests::read_journals(&journals)?;
    let mut starts = BTreeMap::<&str, Vec<(u32, &str)>>::new();
    for e in entries.iter().filter(|e| e.event == "start") {
        starts
            .entry(e.schedule_id.as_str())
            .or_default()
            .push((e.attempt, e.node_id.as_str()));
    }
    let not_once: Vec<_> = starts
        .iter()
        .filter(|(_, s)| s.len() != 1 || s[0].0 != 1)
        .take(12)
        .collect();
    ensure!(
        not_once.is_empty(),
        "started more than once or past attempt 1: {not_once:?}"
    );
    let started: BTreeSet<String> = starts.keys().map(|s| (*s).to_owned()).collect();
    ensure!(
        started == expected,
        "{} runs started, {} planned; unplanned: {:?}, never started: {:?}",
        started.len(),
        expected.len(),
        started.difference(&expected).take(12).collect::<Vec<_>>(),
        expected.difference(&started).take(12).collect::<Vec<_>>()
    );
    let finishes: Vec<_> = entries.iter().filter(|e| e.event == "finish").collect();
    ensure!(
        finishes.len() == expected.len() && finishes.iter().all(|e| e.status == "SUCCEEDED"),
        "every handler finished once and succeeded: {} finishes, not succeeded {:?}",
        finishes.len(),
        finishes
            .iter()
            .filter(|e| e.status != "SUCCEEDED")
            .take(12)
            .collect::<Vec<_>>()
    );
    let (by_run, refused) = receiver.read(|inbox| (inbox.by_run.clone(), inbox.refused));
    ensure!(refused == 0, "{refused} deliveries failed verification");
    let wrong: Vec<_> = by_run
        .iter()
        .filter(|(_, h)| !matches!(h.as_slice(), [h] if h.status == "SUCCEEDED" && h.attempt == 1))
        .take(12)
        .collect();
    ensure!(
        wrong.is_empty(),
        "webhooks not delivered exactly once as SUCCEEDED, attempt 1: {wrong:?}"
    );
    let delivered: BTreeSet<String> = by_run.into_keys().collect();
    ensure!(
        delivered == expected,
        "webhooks for {} runs, {} planned; unplanned: {:?}",
        delivered.len(),
        expected.len(),
        delivered.difference(&expected).take(12).collect::<Vec<_>>()
    );
    // The results came in on this instance's executor streams, whose steps claim
    // their webhooks for its worker: those go out without a sweep (a delivery the
    // sweep found first, while the worker had no room, is counted `sweep`).
    let metrics = reqwest::get(format!(
        "http://{}/metrics",
        server.http.context("no http address")?
    ))
    .await?
    .text()
    .await?;
    let claimed = |by: &str| -> f64 {
        let name = format!("sundial_webhook_claims_total{{by=\"{by}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&name)?.trim().parse().ok())
            .unwrap_or(-1.0)
    };
    let (by_result, by_sweep) = (claimed("result"), claimed("sweep"));
    ensure!(
        by_result > 0.0 && by_sweep >= 0.0 && by_result + by_sweep >= expected.len() as f64,
        "webhooks claimed by their results' steps {by_result}, by the sweep {by_sweep}, for {} runs",
        expected.len()
    );
    let mut per_node = BTreeMap::<&str, usize>::new();
    for s in starts.values() {
        *per_node.entry(s[0].1).or_default() += 1;
    }
    ensure!(
        per_node.len() == EXECUTORS.len(),
        "round robin left an executor out: {per_node:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sustained_load_with_webhooks_runs_and_delivers_each_once_on_redis() -> Result<()> {
    let redis = RedisServer::start()?;
    let dir = tempfile::tempdir()?;
    sustained_load_runs_and_delivers_each_once(SundialOptions::redis(&redis), dir.path()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sustained_load_with_webhooks_runs_and_delivers_each_once_on_the_embedded_store()
-> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = SundialOptions::embedded(&dir.path().join("data"));
    sustained_load_runs_and_delivers_each_once(store, dir.path()).await
}
