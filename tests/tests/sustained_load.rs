//! A sustained load with webhooks, end to end on each store: jobs firing every second
//! for a few seconds on real executor processes (`test_executor`, the Rust SDK), each
//! run's result delivered to a receiver in this process that verifies every delivery
//! by both signature schemes. What must hold at any speed: every fire ran exactly once
//! and succeeded on its first attempt (a lost lease would show as a second start or a
//! second attempt), and every run's webhook arrived once, signed, saying so. How fast
//! is `sundial-bench sustained`'s business, never asserted here.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Result, ensure};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use sundial_proto::v1 as pb;
use sundial_proto::v1::node_service_client::NodeServiceClient;
use sundial_sdk::webhook::{MemoryNonceCache, Secret, Verifier};
use sundial_tests::{RedisServer, Sundial, SundialOptions, TestExecutor, wait_for};
use tokio_util::sync::CancellationToken;

const EXECUTOR: &str = env!("CARGO_BIN_EXE_test_executor");
/// Jobs, each firing every second.
const JOBS: usize = 60;
/// Seconds of firing: each job fires this many times.
const SECONDS: i64 = 5;
const EXECUTORS: [&str; 3] = ["s1", "s2", "s3"];

/// One verified delivery: the run's status and attempt as its body says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Delivered {
    status: String,
    attempt: i64,
}

#[derive(Default)]
struct Inbox {
    /// Verified deliveries by schedule_id, in arrival order.
    by_run: BTreeMap<String, Vec<Delivered>>,
    /// Deliveries that failed a check (signature, timestamp, replay, body).
    refused: usize,
}

#[derive(Clone)]
struct Checks {
    classic: Verifier,
    standard: Verifier,
    inbox: Arc<Mutex<Inbox>>,
}

struct Receiver {
    addr: SocketAddr,
    inbox: Arc<Mutex<Inbox>>,
    stop: CancellationToken,
}

impl Receiver {
    async fn start(secret: &Secret) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let inbox = Arc::new(Mutex::new(Inbox::default()));
        let verifier = || Verifier::new(secret.clone()).nonce_cache(MemoryNonceCache::new(4096));
        let checks = Checks {
            classic: verifier(),
            standard: verifier(),
            inbox: inbox.clone(),
        };
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(hook))
            .with_state(checks);
        let stop = CancellationToken::new();
        let until = stop.clone().cancelled_owned();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(until)
                .await;
        });
        Ok(Self { addr, inbox, stop })
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    fn read<T>(&self, f: impl FnOnce(&Inbox) -> T) -> T {
        f(&self.inbox.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn hook(State(checks): State<Checks>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let verified = checks.classic.verify_classic(&headers, &body).is_ok()
        && checks.standard.verify_standard(&headers, &body).is_ok();
    let parsed = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| {
            Some((
                v.get("schedule_id")?.as_str()?.to_owned(),
                Delivered {
                    status: v.get("status")?.as_str()?.to_owned(),
                    attempt: v.get("attempt")?.as_i64()?,
                },
            ))
        });
    let mut inbox = checks.inbox.lock().unwrap_or_else(PoisonError::into_inner);
    match parsed {
        Some((sid, delivered)) if verified => {
            inbox.by_run.entry(sid).or_default().push(delivered);
            StatusCode::OK
        }
        _ => {
            inbox.refused += 1;
            StatusCode::UNAUTHORIZED
        }
    }
}

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
    let receiver = Receiver::start(&secret).await?;
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
    let once = Delivered {
        status: "SUCCEEDED".into(),
        attempt: 1,
    };
    let wrong: Vec<_> = by_run
        .iter()
        .filter(|(_, d)| d.as_slice() != std::slice::from_ref(&once))
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
