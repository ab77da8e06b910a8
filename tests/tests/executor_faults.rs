//! Runs survive dying and freezing executors and a dying server instance — with real
//! `test_executor` processes (the Rust SDK) that journal every handler start and
//! finish, so "executed once" is counted where it happens, not inferred from records.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, ensure};
use sundial_proto::v1 as pb;
use sundial_tests::{
    JournalEntry, RedisServer, Sundial, SundialOptions, TestExecutor, read_journals, wait_for,
};

const EXECUTOR: &str = env!("CARGO_BIN_EXE_test_executor");

fn opts(redis: &RedisServer, instance: &str) -> SundialOptions {
    SundialOptions::redis(redis)
        .arg("instance-id", instance)
        .arg("heartbeat-interval", "300ms")
        .arg("sweep-every", "50ms")
        .arg("route-retry", "200ms")
}

fn sleep_job(id: &str, ms: u64, max_retries: i32) -> pb::JobSpec {
    pb::JobSpec {
        id: id.into(),
        cron: sundial_tests::MANUAL_ONLY.into(),
        target: Some(pb::job_spec::Target::Executor(pb::ExecutorTarget {
            group: "g".into(),
            handler: "sleep".into(),
        })),
        payload: ms.to_string().into_bytes(),
        retry: Some(pb::RetryPolicy {
            max_retries,
            backoff_ms: 100,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn journal_of(entries: &[JournalEntry], sid: &str) -> Vec<JournalEntry> {
    entries
        .iter()
        .filter(|e| e.schedule_id == sid)
        .cloned()
        .collect()
}

async fn wait_journal_start(paths: &[PathBuf], sid: &str, attempt: u32) -> Result<JournalEntry> {
    wait_for(
        &format!("{sid} attempt {attempt} to start"),
        Duration::from_secs(20),
        || async {
            Ok(read_journals(paths)?
                .into_iter()
                .find(|e| e.event == "start" && e.schedule_id == sid && e.attempt == attempt))
        },
    )
    .await
}

fn now_ms() -> i64 {
    sundial_server::model::now_ms()
}

/// SIGKILL the executor in the middle of a long run: attempt 2 runs on the other
/// executor after the first one died, exactly one SUCCEEDED, never two at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_executor_run_completes_elsewhere_as_attempt_2() -> Result<()> {
    let redis = RedisServer::start()?;
    let server = Sundial::start(opts(&redis, "a"))?;
    let dir = tempfile::tempdir()?;
    let endpoints = vec![format!("http://{}", server.grpc)];
    let journals = vec![dir.path().join("x.log"), dir.path().join("y.log")];
    let mut x = TestExecutor::start(EXECUTOR, &endpoints, "x", &journals[0])?;
    let y = TestExecutor::start(EXECUTOR, &endpoints, "y", &journals[1])?;
    server
        .jobs()
        .await?
        .create_job(pb::CreateJobRequest {
            spec: Some(sleep_job("long", 2000, 1)),
        })
        .await?;
    let sid = server.trigger("long").await?;
    let first = wait_journal_start(&journals, &sid, 1).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let victim_is_x = first.node_id == "x";
    let killed_at = now_ms();
    if victim_is_x {
        x.kill()?;
    } else {
        drop(y);
    }
    let second = wait_journal_start(&journals, &sid, 2).await?;
    ensure!(second.node_id != first.node_id, "{second:?}");
    ensure!(
        second.unix_ms >= killed_at,
        "attempt 2 started before attempt 1 died"
    );
    let run = wait_for("the run to succeed", Duration::from_secs(20), || async {
        let r = server.run(&sid).await?;
        Ok((r.state == pb::RunState::Succeeded as i32).then_some(r))
    })
    .await?;
    ensure!(run.attempt == 2 && run.node_id == second.node_id, "{run:?}");
    let entries = journal_of(&read_journals(&journals)?, &sid);
    let finishes: Vec<&JournalEntry> = entries.iter().filter(|e| e.event == "finish").collect();
    ensure!(
        finishes.len() == 1 && finishes[0].status == "SUCCEEDED" && finishes[0].attempt == 2,
        "{entries:?}"
    );
    ensure!(
        entries.iter().filter(|e| e.event == "start").count() == 2,
        "{entries:?}"
    );
    drop(x);
    Ok(())
}

/// A frozen executor (SIGSTOP past its lease, then SIGCONT): its lease expires, the
/// other node runs attempt 2, and the frozen node's late result is refused by the
/// fencing token and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_executor_is_fenced_off() -> Result<()> {
    let redis = RedisServer::start()?;
    let server = Sundial::start(opts(&redis, "a"))?;
    let dir = tempfile::tempdir()?;
    let endpoints = vec![format!("http://{}", server.grpc)];
    let journals = vec![dir.path().join("x.log"), dir.path().join("y.log")];
    let x = TestExecutor::start(EXECUTOR, &endpoints, "x", &journals[0])?;
    let y = TestExecutor::start(EXECUTOR, &endpoints, "y", &journals[1])?;
    server
        .jobs()
        .await?
        .create_job(pb::CreateJobRequest {
            spec: Some(sleep_job("long", 1500, 1)),
        })
        .await?;
    let sid = server.trigger("long").await?;
    let first = wait_journal_start(&journals, &sid, 1).await?;
    let frozen = if first.node_id == "x" { &x } else { &y };
    frozen.signal("STOP")?;
    // The lease (3 × 300 ms) runs out; attempt 2 starts on the other node.
    let second = wait_journal_start(&journals, &sid, 2).await?;
    ensure!(second.node_id != first.node_id && second.token > first.token);
    // Thaw the frozen node while attempt 2 is still running, so that its stale
    // result races the real one.
    frozen.signal("CONT")?;
    let run = wait_for("the run to succeed", Duration::from_secs(20), || async {
        let r = server.run(&sid).await?;
        Ok((r.state == pb::RunState::Succeeded as i32).then_some(r))
    })
    .await?;
    // Give the thawed node time to report whatever it has.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = server.run(&sid).await?;
    ensure!(
        after == run,
        "the run changed after it succeeded: {after:?}"
    );
    ensure!(
        run.attempt == 2 && run.node_id == second.node_id && run.fencing_token == second.token,
        "{run:?}"
    );
    let entries = journal_of(&read_journals(&journals)?, &sid);
    let succeeded: Vec<&JournalEntry> = entries
        .iter()
        .filter(|e| e.event == "finish" && e.token == second.token)
        .collect();
    ensure!(
        succeeded.len() == 1 && succeeded[0].status == "SUCCEEDED",
        "{entries:?}"
    );
    Ok(())
}

/// Two server instances, three executors, 50 jobs firing every second for 30 s; one
/// instance is SIGKILLed in the middle. Every run completes exactly once (counted in
/// the executors' journals) and the executors of the dead instance move to the live
/// one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_mid_load_loses_and_repeats_nothing() -> Result<()> {
    const JOBS: usize = 50;
    const SECONDS: i64 = 30;
    let redis = RedisServer::start()?;
    let mut a = Sundial::start(opts(&redis, "a").arg("heartbeat-interval", "500ms"))?;
    let b = Sundial::start(opts(&redis, "b").arg("heartbeat-interval", "500ms"))?;
    let (ea, eb) = (format!("http://{}", a.grpc), format!("http://{}", b.grpc));
    let dir = tempfile::tempdir()?;
    let journals: Vec<PathBuf> = (0..3)
        .map(|i| dir.path().join(format!("e{i}.log")))
        .collect();
    let _e0 = TestExecutor::start(EXECUTOR, &[ea.clone(), eb.clone()], "e0", &journals[0])?;
    let _e1 = TestExecutor::start(EXECUTOR, &[ea.clone(), eb.clone()], "e1", &journals[1])?;
    let _e2 = TestExecutor::start(EXECUTOR, &[eb.clone(), ea.clone()], "e2", &journals[2])?;

    let start = now_ms() + 1000;
    let end = start + SECONDS * 1000;
    let mut jobs = b.jobs().await?;
    for i in 0..JOBS {
        let mut spec = sundial_tests::every_second(&format!("load-{i}"));
        spec.target = Some(pb::job_spec::Target::Executor(pb::ExecutorTarget {
            group: "g".into(),
            handler: "noop".into(),
        }));
        spec.start_time_ms = start;
        spec.end_time_ms = end;
        jobs.create_job(pb::CreateJobRequest { spec: Some(spec) })
            .await?;
    }
    tokio::time::sleep(Duration::from_millis(
        u64::try_from(SECONDS * 1000 / 2 + 1000).unwrap_or(0),
    ))
    .await;
    a.kill()?;
    // The executors that were on `a` reconnect to `b`.
    let nodes = wait_for("all executors on b", Duration::from_secs(15), || async {
        let nodes = pb::node_service_client::NodeServiceClient::new(b.channel().await?)
            .list_nodes(pb::ListNodesRequest::default())
            .await?
            .into_inner()
            .nodes;
        Ok((nodes.len() == 3 && nodes.iter().all(|n| n.server_instance == "b")).then_some(nodes))
    })
    .await?;
    ensure!(nodes.len() == 3);

    // Wait past the end for every run to settle, then count.
    let mut runs_by_sid: BTreeMap<String, pb::Run> = BTreeMap::new();
    wait_for(
        "every run to be final",
        Duration::from_secs(SECONDS as u64 + 60),
        || async {
            if now_ms() < end + 1000 {
                return Ok(None);
            }
            let mut client = b.runs().await?;
            let mut all = BTreeMap::new();
            for i in 0..JOBS {
                for r in sundial_tests::all_runs(&mut client, &format!("load-{i}")).await? {
                    all.insert(r.schedule_id.clone(), r);
                }
            }
            let settled = all.values().all(|r| [4, 5, 6, 7, 8].contains(&r.state));
            Ok(settled.then_some(all))
        },
    )
    .await
    .map(|all| runs_by_sid = all)?;

    // Every planned second of every job has a run, and every run SUCCEEDED.
    let expected = usize::try_from((end - start) / 1000).unwrap_or(0) * JOBS;
    ensure!(
        runs_by_sid.len() >= expected - JOBS && runs_by_sid.len() <= expected + JOBS,
        "{} runs for about {expected} planned fires",
        runs_by_sid.len()
    );
    for i in 0..JOBS {
        let mut nos: Vec<i64> = runs_by_sid
            .values()
            .filter(|r| r.job_id == format!("load-{i}"))
            .filter_map(|r| r.schedule_no.parse().ok())
            .collect();
        nos.sort_unstable();
        ensure!(
            nos.windows(2).all(|w| w[1] - w[0] == 1000),
            "load-{i} has a gap: {nos:?}"
        );
    }
    let not_ok: Vec<&pb::Run> = runs_by_sid
        .values()
        .filter(|r| r.state != pb::RunState::Succeeded as i32)
        .collect();
    ensure!(
        not_ok.is_empty(),
        "{} runs did not succeed: {:?}",
        not_ok.len(),
        not_ok.first()
    );

    // Each run executed to completion exactly once.
    let entries = read_journals(&journals)?;
    let mut finished: BTreeMap<&str, usize> = BTreeMap::new();
    for e in entries.iter().filter(|e| e.event == "finish") {
        *finished.entry(e.schedule_id.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = finished.iter().filter(|(_, n)| **n > 1).collect();
    ensure!(twice.is_empty(), "executed more than once: {twice:?}");
    let executed: BTreeSet<&str> = finished.keys().copied().collect();
    let recorded: BTreeSet<&str> = runs_by_sid.keys().map(String::as_str).collect();
    ensure!(
        executed == recorded,
        "executed {} vs recorded {}",
        executed.len(),
        recorded.len()
    );
    println!(
        "{} runs, all SUCCEEDED, each executed once; {} journal lines",
        recorded.len(),
        entries.len()
    );
    Ok(())
}

/// An executor frozen (SIGSTOP) while dispatches sit unread in its socket, thawed
/// after the server revoked them and ran them elsewhere: it starts none of them (the
/// go-ahead: a handler begins only when the server confirms the lease is current),
/// and each ran exactly once, on the other node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thawed_executor_never_starts_the_dispatches_it_missed() -> Result<()> {
    const RUNS: usize = 5;
    let redis = RedisServer::start()?;
    // A 1 s heartbeat: the frozen node stays registered (3 s) long enough to be sent
    // the dispatches; they go unconfirmed after 2 s and are re-routed.
    let server = Sundial::start(opts(&redis, "a").arg("heartbeat-interval", "1s"))?;
    let dir = tempfile::tempdir()?;
    let endpoints = vec![format!("http://{}", server.grpc)];
    let journals = vec![dir.path().join("x.log"), dir.path().join("y.log")];
    let x = TestExecutor::start(EXECUTOR, &endpoints, "x", &journals[0])?;
    let _y = TestExecutor::start(EXECUTOR, &endpoints, "y", &journals[1])?;
    // FIRST routes to the first node by id, x, while it is registered.
    let mut jobs = server.jobs().await?;
    jobs.create_job(pb::CreateJobRequest {
        spec: Some(pb::JobSpec {
            route_strategy: pb::RouteStrategy::First as i32,
            ..sleep_job("missed", 10, 0)
        }),
    })
    .await?;
    x.signal("STOP")?;
    let mut sids = Vec::new();
    for _ in 0..RUNS {
        sids.push(server.trigger("missed").await?);
    }
    for sid in &sids {
        let run = wait_for("the run to succeed", Duration::from_secs(30), || async {
            let r = server.run(sid).await?;
            Ok((r.state == pb::RunState::Succeeded as i32).then_some(r))
        })
        .await?;
        ensure!(run.node_id == "y", "{run:?}");
    }
    x.signal("CONT")?;
    // Give the thawed node time to read what waited in its socket and to reconnect.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let entries = read_journals(&journals)?;
    ensure!(
        !entries.iter().any(|e| e.node_id == "x"),
        "the thawed node started a handler: {entries:?}"
    );
    for sid in &sids {
        let starts = journal_of(&entries, sid)
            .into_iter()
            .filter(|e| e.event == "start")
            .count();
        ensure!(starts == 1, "{sid} started {starts} times: {entries:?}");
    }
    Ok(())
}

/// Finished work whose lease lapses while no server is up is not thrown away: the
/// restarted store gives the lease one more lease TTL, in which the executor
/// reconnects and reports the result it held. The handler sleeps 1.5 s; the server is
/// killed 0.5 s in and stays down 4 s, longer than the 3 s lease, so the handler ends
/// while it is down (well within its lease, so the executor keeps the result rather
/// than cancelling the handler) and the lease lapses before the restart.
///
/// `base` names the store; the server restarts on the same port.
async fn a_lapsed_lease_is_kept_across_a_restart(base: SundialOptions) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let opts = SundialOptions {
        port: Some(sundial_tests::free_port()?),
        ..base
    }
    .arg("heartbeat-interval", "500ms")
    .arg("lease-ttl", "3s")
    .arg("route-retry", "200ms");
    let mut server = Sundial::start(opts.clone())?;
    server
        .create_job(pb::JobSpec {
            payload: b"1500".to_vec(),
            ..sundial_tests::manual_job("long", "sleep")
        })
        .await?;
    let journal = dir.path().join("a.journal");
    let _a = TestExecutor::start(
        env!("CARGO_BIN_EXE_test_executor"),
        &[server.grpc_url()],
        "exec-a",
        &journal,
    )?;
    let sid = server.trigger("long").await?;
    let journals = [journal];
    let journaled = |event: &'static str| {
        let (journals, sid) = (&journals, &sid);
        move || async move {
            let entries = sundial_tests::read_journals(journals)?;
            Ok(Some(
                entries
                    .iter()
                    .filter(|e| e.event == event && &e.schedule_id == sid)
                    .count(),
            )
            .filter(|n| *n > 0))
        }
    };
    wait_for(
        "the handler to start",
        Duration::from_secs(20),
        journaled("start"),
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.kill()?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    ensure!(
        journaled("finish")().await?.is_some(),
        "the handler had not finished while the server was down"
    );

    let server = Sundial::start(opts)?;
    let run = server.finished(&sid).await?;
    ensure!(
        run.state == pb::RunState::Succeeded as i32 && run.attempt == 1,
        "{run:?}"
    );
    let starts = journaled("start")().await?.unwrap_or(0);
    ensure!(starts == 1, "the handler started {starts} times");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_lapses_while_the_server_is_down_is_kept_on_the_embedded_store() -> Result<()>
{
    let data = tempfile::tempdir()?;
    a_lapsed_lease_is_kept_across_a_restart(SundialOptions::embedded(data.path())).await
}

/// On Redis the grace applies when no other instance was alive (here the only one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_lapses_while_every_instance_is_down_is_kept_on_redis() -> Result<()> {
    let redis = RedisServer::start()?;
    a_lapsed_lease_is_kept_across_a_restart(SundialOptions::redis(&redis)).await
}

async fn node_health(server: &Sundial, id: &str) -> Result<Option<i32>> {
    Ok(
        pb::node_service_client::NodeServiceClient::new(server.channel().await?)
            .list_nodes(pb::ListNodesRequest::default())
            .await?
            .into_inner()
            .nodes
            .into_iter()
            .find(|n| n.node_id == id)
            .map(|n| n.health),
    )
}

/// A frozen executor (SIGSTOP) among two under a stream of runs: the dispatches it
/// leaves unanswered are taken back once it has been silent for about a second
/// (`--silent-after`) and it gets no new work (UNRESPONSIVE) until it answers again,
/// so every run starts on the live node. The windows that would otherwise move them
/// are set to the lease (15 s: `--confirm-within`, and the node's eviction after three
/// 5 s heartbeat intervals), so a run that waited for the frozen node starts a lease
/// or more after its trigger; the test asserts no tighter bound than that and prints
/// the delays. After SIGCONT no run starts twice: the thawed node's late `Started`s get
/// no go-ahead.
async fn a_frozen_executor_is_bypassed(base: SundialOptions) -> Result<()> {
    const RUNS: usize = 20;
    const LEASE: Duration = Duration::from_secs(15);
    let server = Sundial::start(
        base.arg("heartbeat-interval", "5s")
            .arg("lease-ttl", "15s")
            .arg("confirm-within", "15s")
            .arg("sweep-every", "50ms")
            .arg("route-retry", "200ms"),
    )?;
    let dir = tempfile::tempdir()?;
    let endpoints = vec![server.grpc_url()];
    let journals = vec![dir.path().join("x.log"), dir.path().join("y.log")];
    let x = TestExecutor::start(EXECUTOR, &endpoints, "x", &journals[0])?;
    let _y = TestExecutor::start(EXECUTOR, &endpoints, "y", &journals[1])?;
    server.create_job(sleep_job("stream", 10, 0)).await?;
    for id in ["x", "y"] {
        wait_for(
            &format!("{id} to register"),
            Duration::from_secs(20),
            || async { node_health(&server, id).await },
        )
        .await?;
    }
    x.signal("STOP")?;
    let mut triggered = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        triggered.push((server.trigger("stream").await?, now_ms()));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let unresponsive = node_health(&server, "x").await?;
    let mut delays = Vec::with_capacity(RUNS);
    for (sid, at) in &triggered {
        let run = wait_for("the run to succeed", 3 * LEASE, || async {
            let r = server.run(sid).await?;
            Ok((r.state == pb::RunState::Succeeded as i32).then_some(r))
        })
        .await?;
        ensure!(run.node_id == "y" && run.attempt == 1, "{run:?}");
        delays.push(run.started_at_ms - at);
    }
    let worst = delays.iter().copied().max().unwrap_or(0);
    println!("trigger -> start (ms) with one executor frozen: {delays:?}; worst {worst}");
    ensure!(
        u128::try_from(worst)? < LEASE.as_millis(),
        "a run waited {worst} ms for the frozen executor: {delays:?}"
    );
    ensure!(
        unresponsive == Some(pb::NodeHealth::Unresponsive as i32),
        "the frozen node was listed {unresponsive:?}"
    );
    x.signal("CONT")?;
    wait_for(
        "the thawed node to answer again",
        Duration::from_secs(20),
        || async {
            let h = node_health(&server, "x").await?;
            Ok((h == Some(pb::NodeHealth::Healthy as i32)).then_some(()))
        },
    )
    .await?;
    let entries = read_journals(&journals)?;
    ensure!(
        !entries.iter().any(|e| e.node_id == "x"),
        "the thawed node started a handler it was not given: {entries:?}"
    );
    for (sid, _) in &triggered {
        let starts = journal_of(&entries, sid)
            .iter()
            .filter(|e| e.event == "start")
            .count();
        ensure!(starts == 1, "{sid} started {starts} times: {entries:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_executor_is_bypassed_on_redis() -> Result<()> {
    let redis = RedisServer::start()?;
    a_frozen_executor_is_bypassed(SundialOptions::redis(&redis)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_executor_is_bypassed_on_the_embedded_store() -> Result<()> {
    let dir = tempfile::tempdir()?;
    a_frozen_executor_is_bypassed(SundialOptions::embedded(dir.path())).await
}
