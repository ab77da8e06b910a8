//! The run state machine over a raw executor stream (no SDK), on a real Redis and on
//! the embedded store: dispatch → started → logs → result, stale tokens refused,
//! rejects re-routed, timeouts, retries with attempts counted, CancelRun, run logs.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use sundial_proto::v1 as pb;
use sundial_proto::v1::executor_message::Msg;
use sundial_proto::v1::server_message::Msg as Out;
use sundial_tests::raw::Exec;
use sundial_tests::{RedisServer, Sundial, SundialOptions, manual_job, wait_for};

async fn wait_state(server: &Sundial, sid: &str, state: pb::RunState) -> Result<pb::Run> {
    wait_for(
        &format!("{sid} to be {state:?}"),
        Duration::from_secs(15),
        || async {
            let r = server.run(sid).await?;
            Ok((r.state == state as i32).then_some(r))
        },
    )
    .await
}

fn servers(redis: Option<&RedisServer>, dir: &std::path::Path) -> SundialOptions {
    match redis {
        Some(r) => SundialOptions::redis(r),
        None => SundialOptions::embedded(dir),
    }
    .arg("heartbeat-interval", "300ms")
    .arg("sweep-every", "50ms")
    .arg("route-retry", "200ms")
}

async fn happy_path_and_stale_tokens(opts: SundialOptions) -> Result<()> {
    let server = Sundial::start(opts)?;
    let channel = server.channel().await?;
    server
        .jobs()
        .await?
        .create_job(pb::CreateJobRequest {
            spec: Some(manual_job("j1", "work")),
        })
        .await?;
    let mut e = Exec::connect(channel.clone(), "n1", &["work"]).await?;
    let sid = server.trigger("j1").await?;
    let d = e.dispatch().await?;
    let run = d.run.clone().context("run ref")?;
    ensure!(
        run.schedule_id == sid && run.attempt == 1 && run.fencing_token > 0 && d.handler == "work"
    );
    e.send(Msg::Started(pb::Started {
        run: Some(run.clone()),
    }))
    .await?;
    wait_state(&server, &sid, pb::RunState::Running).await?;
    // A follower sees lines as they arrive and its stream ends once the run is final.
    let mut follow = server
        .runs()
        .await?
        .get_run_logs(pb::GetRunLogsRequest {
            schedule_id: sid.clone(),
            follow: true,
        })
        .await?
        .into_inner();
    e.send(Msg::Logs(pb::LogLines {
        run: Some(run.clone()),
        lines: (0..3)
            .map(|i| pb::LogEntry {
                time_ms: 1,
                level: "info".into(),
                message: format!("line {i}"),
            })
            .collect(),
    }))
    .await?;
    // A wrong token is refused and changes nothing.
    let mut stale = run.clone();
    stale.fencing_token -= 1;
    let a = e.result(&stale, pb::ResultStatus::Failed, b"").await?;
    ensure!(!a.accepted && a.reason.contains("stale"), "{a:?}");
    let first = tokio::time::timeout(Duration::from_secs(10), follow.message())
        .await
        .context("no live log line")??
        .context("follow ended early")?;
    ensure!(first.message == "line 0" && first.attempt == 1, "{first:?}");
    let a = e.result(&run, pb::ResultStatus::Succeeded, b"done").await?;
    ensure!(a.accepted, "{a:?}");
    let mut followed = vec![first.message];
    while let Some(l) = tokio::time::timeout(Duration::from_secs(10), follow.message())
        .await
        .context("the follow did not end after the run finished")??
    {
        followed.push(l.message);
    }
    ensure!(followed == ["line 0", "line 1", "line 2"], "{followed:?}");
    let r = wait_state(&server, &sid, pb::RunState::Succeeded).await?;
    ensure!(r.output == b"done" && r.node_id == "n1" && r.attempt == 1);
    // A re-sent result (lost ack) is acknowledged again, nothing changes.
    let a = e.result(&run, pb::ResultStatus::Succeeded, b"done").await?;
    ensure!(a.accepted && a.reason.contains("already"), "{a:?}");
    let logs: Vec<pb::LogLine> = collect_logs(&server, &sid).await?;
    ensure!(
        logs.iter().map(|l| l.message.as_str()).collect::<Vec<_>>()
            == ["line 0", "line 1", "line 2"],
        "{logs:?}"
    );
    Ok(())
}

async fn collect_logs(server: &Sundial, sid: &str) -> Result<Vec<pb::LogLine>> {
    let mut s = server
        .runs()
        .await?
        .get_run_logs(pb::GetRunLogsRequest {
            schedule_id: sid.into(),
            follow: false,
        })
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(l) = s.message().await? {
        out.push(l);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn happy_path_redis() -> Result<()> {
    let redis = RedisServer::start()?;
    let dir = tempfile::tempdir()?;
    happy_path_and_stale_tokens(servers(Some(&redis), dir.path())).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn happy_path_embedded() -> Result<()> {
    let dir = tempfile::tempdir()?;
    happy_path_and_stale_tokens(servers(None, dir.path())).await
}

/// Timeouts, retries with attempts counted, rejects, CancelRun — one server on Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_retries_rejects_and_cancel() -> Result<()> {
    let redis = RedisServer::start()?;
    let dir = tempfile::tempdir()?;
    let server = Sundial::start(servers(Some(&redis), dir.path()))?;
    let channel = server.channel().await?;
    let mut jobs = server.jobs().await?;
    let mut flaky = manual_job("flaky", "work");
    flaky.retry = Some(pb::RetryPolicy {
        max_retries: 2,
        backoff_ms: 100,
        ..Default::default()
    });
    jobs.create_job(pb::CreateJobRequest { spec: Some(flaky) })
        .await?;
    let mut slow = manual_job("slow", "work");
    slow.timeout_ms = Some(500);
    slow.retry = Some(pb::RetryPolicy {
        max_retries: 1,
        backoff_ms: 100,
        ..Default::default()
    });
    jobs.create_job(pb::CreateJobRequest { spec: Some(slow) })
        .await?;
    jobs.create_job(pb::CreateJobRequest {
        spec: Some(manual_job("cancel-me", "work")),
    })
    .await?;
    let mut e = Exec::connect(channel.clone(), "n1", &["work"]).await?;

    // Retries: attempt 1 and 2 fail, attempt 3 succeeds; each attempt has a new token.
    let sid = server.trigger("flaky").await?;
    let mut tokens = Vec::new();
    for attempt in 1..=3u32 {
        let d = e.dispatch().await?;
        let run = d.run.context("run ref")?;
        ensure!(run.schedule_id == sid && run.attempt == attempt, "{run:?}");
        tokens.push(run.fencing_token);
        let status = if attempt < 3 {
            pb::ResultStatus::Failed
        } else {
            pb::ResultStatus::Succeeded
        };
        ensure!(e.result(&run, status, b"").await?.accepted);
    }
    ensure!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let r = wait_state(&server, &sid, pb::RunState::Succeeded).await?;
    ensure!(r.attempt == 3, "{r:?}");

    // A failure with no attempts left is final.
    jobs.create_job(pb::CreateJobRequest {
        spec: Some(manual_job("once", "work")),
    })
    .await?;
    let sid = server.trigger("once").await?;
    let run = e.dispatch().await?.run.context("run ref")?;
    ensure!(
        e.result(&run, pb::ResultStatus::Failed, b"")
            .await?
            .accepted
    );
    let r = wait_state(&server, &sid, pb::RunState::Failed).await?;
    ensure!(r.attempt == 1 && r.error_code == "boom", "{r:?}");
    // The registry keeps the node's recent results: failed, failed, succeeded, failed.
    wait_for(
        "n1's recent results in the registry",
        Duration::from_secs(10),
        || {
            let channel = channel.clone();
            async move {
                let nodes = pb::node_service_client::NodeServiceClient::new(channel)
                    .list_nodes(pb::ListNodesRequest::default())
                    .await?
                    .into_inner()
                    .nodes;
                Ok(nodes
                    .iter()
                    .any(|n| n.node_id == "n1" && (n.success_rate - 0.25).abs() < 1e-9)
                    .then_some(()))
            }
        },
    )
    .await?;

    // Timeout: the executor never answers; the server cancels attempt 1, retries
    // once, and records TIMED_OUT after attempt 2 times out too.
    let sid = server.trigger("slow").await?;
    let mut cancelled = Vec::new();
    let mut dispatched = Vec::new();
    while cancelled.len() < 2 {
        match e.next().await? {
            Out::Dispatch(d) => {
                let run = d.run.context("run ref")?;
                ensure!(d.deadline_ms == 500);
                e.send(Msg::Started(pb::Started {
                    run: Some(run.clone()),
                }))
                .await?;
                dispatched.push(run);
            }
            Out::Cancel(c) => cancelled.push(c.run.context("run ref")?),
            _ => {}
        }
    }
    let r = wait_state(&server, &sid, pb::RunState::TimedOut).await?;
    ensure!(
        r.attempt == 2 && dispatched.len() == 2,
        "{r:?} {dispatched:?}"
    );
    // The Cancel names the dispatch's whole RunRef (the attempt too).
    ensure!(
        cancelled[0] == dispatched[0],
        "{:?} for {:?}",
        cancelled[0],
        dispatched[0]
    );
    // The late result of the timed-out attempt is refused.
    let a = e
        .result(&dispatched[1], pb::ResultStatus::Succeeded, b"")
        .await?;
    ensure!(!a.accepted, "{a:?}");
    ensure!(server.run(&sid).await?.state == pb::RunState::TimedOut as i32);

    // Reject: the dispatch goes to another node, same attempt.
    let sid = server.trigger("once").await?;
    let run = e.dispatch().await?.run.context("run ref")?;
    let mut e2 = Exec::connect(channel.clone(), "n2", &["work"]).await?;
    // Let routing's node snapshot (refreshed every 250 ms) see n2.
    tokio::time::sleep(Duration::from_millis(400)).await;
    e.send(Msg::Reject(pb::Reject {
        run: Some(run.clone()),
        reason: "busy".into(),
    }))
    .await?;
    let again = e2.dispatch().await?.run.context("run ref")?;
    ensure!(
        again.schedule_id == sid && again.attempt == 1 && again.fencing_token > run.fencing_token
    );
    ensure!(
        e2.result(&again, pb::ResultStatus::Succeeded, b"")
            .await?
            .accepted
    );
    let r = wait_state(&server, &sid, pb::RunState::Succeeded).await?;
    ensure!(r.node_id == "n2", "{r:?}");
    drop(e2);

    // CancelRun: the executor is told, its later result is refused.
    let sid = server.trigger("cancel-me").await?;
    let run = e.dispatch().await?.run.context("run ref")?;
    let cancelled = server
        .runs()
        .await?
        .cancel_run(pb::CancelRunRequest {
            schedule_id: sid.clone(),
            reason: "operator".into(),
        })
        .await?
        .into_inner()
        .run
        .context("run")?;
    ensure!(cancelled.state == pb::RunState::Cancelled as i32 && cancelled.reason == "operator");
    loop {
        if let Out::Cancel(c) = e.next().await? {
            ensure!(c.run.as_ref() == Some(&run), "{c:?} for {run:?}");
            break;
        }
    }
    ensure!(
        !e.result(&run, pb::ResultStatus::Succeeded, b"")
            .await?
            .accepted
    );
    let again = server
        .runs()
        .await?
        .cancel_run(pb::CancelRunRequest {
            schedule_id: sid.clone(),
            reason: String::new(),
        })
        .await
        .expect_err("a final run cannot be cancelled");
    ensure!(again.code() == tonic::Code::FailedPrecondition, "{again:?}");
    Ok(())
}

async fn all_job_runs(server: &Sundial, job_id: &str) -> Result<Vec<pb::Run>> {
    sundial_tests::all_runs(&mut server.runs().await?, job_id).await
}

fn count(runs: &[pb::Run], state: pb::RunState) -> usize {
    runs.iter().filter(|r| r.state == state as i32).count()
}

/// Fires `n` manual triggers of `job_id`, alternating between the two instances, all
/// at once.
async fn trigger_racing(a: &Sundial, b: &Sundial, job_id: &str, n: usize) -> Result<Vec<String>> {
    let mut clients = vec![a.jobs().await?, b.jobs().await?];
    let calls = (0..n).map(|i| {
        let mut c = clients[i % 2].clone();
        let job_id = job_id.to_owned();
        async move {
            Ok::<_, anyhow::Error>(
                c.trigger_job(pb::TriggerJobRequest {
                    job_id,
                    ..Default::default()
                })
                .await?
                .into_inner()
                .schedule_id,
            )
        }
    });
    let out = futures::future::try_join_all(calls).await?;
    clients.clear();
    Ok(out)
}

/// Each overlap policy with two server instances racing to begin runs of one job;
/// the executor is attached to instance A, so B's dispatches travel through A's inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_policies_hold_across_two_instances() -> Result<()> {
    let redis = RedisServer::start()?;
    let dir = tempfile::tempdir()?;
    let a = Sundial::start(servers(Some(&redis), dir.path()).arg("instance-id", "a"))?;
    let b = Sundial::start(servers(Some(&redis), dir.path()).arg("instance-id", "b"))?;
    let mut jobs = a.jobs().await?;
    for (id, policy) in [
        ("forbid", pb::OverlapPolicy::Forbid),
        ("serial", pb::OverlapPolicy::Serial),
        ("replace", pb::OverlapPolicy::Replace),
        ("allow", pb::OverlapPolicy::Allow),
    ] {
        let mut spec = manual_job(id, id);
        spec.overlap_policy = policy as i32;
        jobs.create_job(pb::CreateJobRequest { spec: Some(spec) })
            .await?;
    }
    let mut e = Exec::connect(
        a.channel().await?,
        "n1",
        &["forbid", "serial", "replace", "allow"],
    )
    .await?;

    // forbid: one run executes, every other trigger is SKIPPED "overlap".
    let sids = trigger_racing(&a, &b, "forbid", 8).await?;
    let d = e.dispatch().await?.run.context("run ref")?;
    let runs = wait_for("forbid runs to settle", Duration::from_secs(15), || async {
        let runs = all_job_runs(&a, "forbid").await?;
        Ok((runs.len() == 8 && count(&runs, pb::RunState::Skipped) == 7).then_some(runs))
    })
    .await?;
    ensure!(
        runs.iter()
            .filter(|r| r.state == pb::RunState::Skipped as i32)
            .all(|r| r.reason == "overlap")
    );
    ensure!(sids.contains(&d.schedule_id));
    ensure!(
        e.result(&d, pb::ResultStatus::Succeeded, b"")
            .await?
            .accepted
    );

    // serial: one at a time, in a queue, every run executes.
    trigger_racing(&a, &b, "serial", 5).await?;
    let mut done = Vec::new();
    for _ in 0..5 {
        let d = e.dispatch().await?.run.context("run ref")?;
        // While it runs, nothing else of the job is dispatched or running.
        let runs = all_job_runs(&a, "serial").await?;
        let busy = runs
            .iter()
            .filter(|r| {
                [
                    pb::RunState::Dispatched as i32,
                    pb::RunState::Running as i32,
                ]
                .contains(&r.state)
            })
            .count();
        ensure!(busy == 1, "{runs:?}");
        ensure!(
            e.result(&d, pb::ResultStatus::Succeeded, b"")
                .await?
                .accepted
        );
        done.push(d.schedule_id);
    }
    let runs = all_job_runs(&a, "serial").await?;
    ensure!(
        count(&runs, pb::RunState::Succeeded) == 5 && done.len() == 5,
        "{runs:?}"
    );

    // replace: each new run cancels the running one; the last one standing executes.
    let first = a.trigger("replace").await?;
    let d1 = e.dispatch().await?.run.context("run ref")?;
    ensure!(d1.schedule_id == first);
    let second = b.trigger("replace").await?;
    let mut cancelled = false;
    let mut d2 = None;
    while !cancelled || d2.is_none() {
        match e.next().await? {
            Out::Cancel(c) => {
                ensure!(c.run.map(|r| r.schedule_id) == Some(first.clone()));
                cancelled = true;
            }
            Out::Dispatch(d) => d2 = d.run,
            _ => {}
        }
    }
    let d2 = d2.context("second dispatch")?;
    ensure!(d2.schedule_id == second);
    ensure!(
        !e.result(&d1, pb::ResultStatus::Succeeded, b"")
            .await?
            .accepted
    );
    ensure!(
        e.result(&d2, pb::ResultStatus::Succeeded, b"")
            .await?
            .accepted
    );
    let r1 = a.run(&first).await?;
    ensure!(
        r1.state == pb::RunState::Cancelled as i32 && r1.reason == "replaced",
        "{r1:?}"
    );
    wait_state(&a, &second, pb::RunState::Succeeded).await?;

    // allow: runs overlap freely.
    trigger_racing(&a, &b, "allow", 4).await?;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(e.dispatch().await?.run.context("run ref")?);
    }
    for d in &held {
        ensure!(
            e.result(d, pb::ResultStatus::Succeeded, b"")
                .await?
                .accepted
        );
    }
    let runs = all_job_runs(&a, "allow").await?;
    ensure!(count(&runs, pb::RunState::Succeeded) == 4, "{runs:?}");
    Ok(())
}

/// The unresponsive window (`--confirm-within`): a dispatch its executor never
/// confirms (no `Started`, not listed in a heartbeat) is taken back once the window
/// passes and routed again, same attempt, new token, and the silent node's late
/// `Started` gets no go-ahead; a dispatch a heartbeat lists stays where it is however
/// long its `Started` takes.
async fn only_an_unconfirmed_dispatch_moves(opts: SundialOptions) -> Result<()> {
    // Heartbeats every 5 s, so the default window would be 10 s; this one is 1 s.
    let server = Sundial::start(
        opts.arg("sweep-every", "50ms")
            .arg("route-retry", "200ms")
            .arg("confirm-within", "1s"),
    )?;
    let channel = server.channel().await?;
    let mut jobs = server.jobs().await?;
    for id in ["mute", "listed"] {
        jobs.create_job(pb::CreateJobRequest {
            spec: Some(manual_job(id, "work")),
        })
        .await?;
    }
    let mut mute = Exec::connect(channel.clone(), "mute", &["work"]).await?;
    let sid = server.trigger("mute").await?;
    let first = mute.dispatch().await?.run.context("run ref")?;
    let sent = std::time::Instant::now();
    let mut other = Exec::connect(channel.clone(), "other", &["work"]).await?;
    // Round robin alternates, so the run reaches `other` at its first or second move
    // (the mute node is still connected and heartbeating).
    let again = other.dispatch().await?.run.context("run ref")?;
    let waited = sent.elapsed();
    ensure!(
        again.schedule_id == sid && again.attempt == 1 && again.fencing_token > first.fencing_token,
        "{first:?} then {again:?}"
    );
    ensure!(
        waited < Duration::from_secs(8),
        "moved after {waited:?}: the 1 s window was not applied (the default is 10 s)"
    );
    mute.send(Msg::Started(pb::Started {
        run: Some(first.clone()),
    }))
    .await?;
    let answer = loop {
        if let Out::StartAck(a) = mute.next().await?
            && a.run.as_ref() == Some(&first)
        {
            break a;
        }
    };
    ensure!(
        !answer.go,
        "a revoked dispatch got the go-ahead: {answer:?}"
    );
    other
        .send(Msg::Started(pb::Started {
            run: Some(again.clone()),
        }))
        .await?;
    ensure!(
        other
            .result(&again, pb::ResultStatus::Succeeded, b"")
            .await?
            .accepted
    );
    let r = wait_state(&server, &sid, pb::RunState::Succeeded).await?;
    ensure!(r.attempt == 1 && r.node_id == "other", "{r:?}");

    // A heartbeat that lists the dispatch confirms it: it stays past the window.
    drop(mute);
    let sid = server.trigger("listed").await?;
    let run = other.dispatch().await?.run.context("run ref")?;
    other
        .send(Msg::Heartbeat(pb::Heartbeat {
            in_flight: vec![run.clone()],
            ..Default::default()
        }))
        .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let r = server.run(&sid).await?;
    ensure!(
        r.state == pb::RunState::Dispatched as i32 && r.fencing_token == run.fencing_token,
        "a listed dispatch was taken back: {r:?}"
    );
    other
        .send(Msg::Started(pb::Started {
            run: Some(run.clone()),
        }))
        .await?;
    let answer = loop {
        if let Out::StartAck(a) = other.next().await? {
            break a;
        }
    };
    ensure!(answer.go, "{answer:?}");
    ensure!(
        other
            .result(&run, pb::ResultStatus::Succeeded, b"")
            .await?
            .accepted
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_unconfirmed_dispatch_moves_on_redis() -> Result<()> {
    let redis = RedisServer::start()?;
    only_an_unconfirmed_dispatch_moves(SundialOptions::redis(&redis)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_unconfirmed_dispatch_moves_on_the_embedded_store() -> Result<()> {
    let dir = tempfile::tempdir()?;
    only_an_unconfirmed_dispatch_moves(SundialOptions::embedded(dir.path())).await
}

/// `--disconnect-grace`: when an executor's stream ends from its side while it holds
/// a run, the run's lease ends a grace later instead of at its TTL (60 s here), so a
/// dead executor's run is retried elsewhere in about the grace; an executor that is
/// back within the grace, listing the run in its hello, keeps it and its result counts.
async fn a_dead_executors_runs_fail_over_within_the_grace(opts: SundialOptions) -> Result<()> {
    let server = Sundial::start(
        opts.arg("sweep-every", "50ms")
            .arg("route-retry", "200ms")
            .arg("lease-ttl", "60s")
            .arg("disconnect-grace", "1s"),
    )?;
    let channel = server.channel().await?;
    let mut jobs = server.jobs().await?;
    let mut spec = manual_job("fo", "work");
    spec.retry = Some(pb::RetryPolicy {
        max_retries: 1,
        backoff_ms: 1,
        ..Default::default()
    });
    jobs.create_job(pb::CreateJobRequest { spec: Some(spec) })
        .await?;
    jobs.create_job(pb::CreateJobRequest {
        spec: Some(manual_job("blip", "blip")),
    })
    .await?;

    // The executor holding a started run goes away (its stream ends, as when the
    // process is killed): attempt 2 reaches the other node long before the lease.
    let mut doomed = Exec::connect(channel.clone(), "doomed", &["work"]).await?;
    let sid = server.trigger("fo").await?;
    let first = doomed.dispatch().await?.run.context("run ref")?;
    ensure!(doomed.start(&first).await?, "no go-ahead for {first:?}");
    let mut heir = Exec::connect(channel.clone(), "heir", &["work"]).await?;
    let gone = std::time::Instant::now();
    drop(doomed);
    let second = heir.dispatch().await?.run.context("run ref")?;
    let waited = gone.elapsed();
    ensure!(
        second.schedule_id == sid && second.attempt == 2,
        "{first:?} then {second:?}"
    );
    ensure!(
        waited < Duration::from_secs(30),
        "attempt 2 came after {waited:?}: the lease (60 s) ran out, not the grace"
    );
    println!("attempt 2 dispatched {waited:?} after its executor left (grace 1 s)");
    ensure!(heir.start(&second).await?);
    ensure!(
        heir.result(&second, pb::ResultStatus::Succeeded, b"")
            .await?
            .accepted
    );
    let r = wait_state(&server, &sid, pb::RunState::Succeeded).await?;
    ensure!(r.attempt == 2 && r.node_id == "heir", "{r:?}");

    // A stream that breaks and comes back at once, listing its run, keeps the run
    // past the grace, and its result is the run's result.
    let mut blip = Exec::connect(channel.clone(), "blip", &["blip"]).await?;
    let sid = server.trigger("blip").await?;
    let run = blip.dispatch().await?.run.context("run ref")?;
    ensure!(blip.start(&run).await?);
    drop(blip);
    let (mut blip, unknown) =
        Exec::reconnect(channel.clone(), "blip", &["blip"], vec![run.clone()]).await?;
    ensure!(unknown.is_empty(), "the run was taken: {unknown:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let r = server.run(&sid).await?;
    ensure!(
        r.state == pb::RunState::Running as i32 && r.fencing_token == run.fencing_token,
        "a run its executor came back for was taken: {r:?}"
    );
    ensure!(
        blip.result(&run, pb::ResultStatus::Succeeded, b"")
            .await?
            .accepted
    );
    let r = wait_state(&server, &sid, pb::RunState::Succeeded).await?;
    ensure!(r.attempt == 1 && r.node_id == "blip", "{r:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_executors_runs_fail_over_within_the_grace_on_redis() -> Result<()> {
    let redis = RedisServer::start()?;
    a_dead_executors_runs_fail_over_within_the_grace(SundialOptions::redis(&redis)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_executors_runs_fail_over_within_the_grace_on_the_embedded_store() -> Result<()> {
    let dir = tempfile::tempdir()?;
    a_dead_executors_runs_fail_over_within_the_grace(SundialOptions::embedded(dir.path())).await
}

/// What an executor reports is bounded: an output past 1 MiB is not stored (the
/// attempt fails "output_too_large", so no read of the run swells), and a result's
/// error message and code are cut to 8 KiB and 128 bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_results_sizes_are_bounded() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let server = Sundial::start(SundialOptions::embedded(dir.path()))?;
    let channel = server.channel().await?;
    server.create_job(manual_job("big", "work")).await?;
    let mut exec = Exec::connect(channel, "n", &["work"]).await?;
    let run = || async {
        let sid = server.trigger("big").await?;
        Ok::<_, anyhow::Error>(sid)
    };
    let sid = run().await?;
    let r = exec.dispatch().await?.run.context("run ref")?;
    exec.send(Msg::Started(pb::Started {
        run: Some(r.clone()),
    }))
    .await?;
    let ack = exec
        .result(&r, pb::ResultStatus::Succeeded, &vec![7u8; 1_500_000])
        .await?;
    ensure!(ack.accepted, "{ack:?}");
    let got = wait_state(&server, &sid, pb::RunState::Failed).await?;
    ensure!(
        got.error_code == "output_too_large"
            && got.output.is_empty()
            && got.error_message.contains("1500000 bytes"),
        "{} {} {} bytes of output",
        got.error_code,
        got.error_message,
        got.output.len()
    );

    let sid = run().await?;
    let r = exec.dispatch().await?.run.context("run ref")?;
    exec.send(Msg::Started(pb::Started {
        run: Some(r.clone()),
    }))
    .await?;
    exec.send(Msg::Result(pb::Result {
        run: Some(r.clone()),
        status: pb::ResultStatus::Failed as i32,
        error_code: "c".repeat(300),
        error_message: "é".repeat(10_000),
        ..Default::default()
    }))
    .await?;
    let got = wait_state(&server, &sid, pb::RunState::Failed).await?;
    ensure!(
        got.error_code.len() == 128 && got.error_message.len() == 8 * 1024,
        "{} / {} bytes",
        got.error_code.len(),
        got.error_message.len()
    );
    Ok(())
}

/// Outputs may be 1 MiB each, and a listing of a hundred runs would pass gRPC's 4 MiB
/// answer limit (the client refuses it): ListRuns stops before its items pass 3 MiB and
/// its page token continues after the last one it gave, so every run is listed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_outputs_are_listed_in_pages_that_fit() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let server = Sundial::start(SundialOptions::embedded(dir.path()))?;
    let channel = server.channel().await?;
    server.create_job(manual_job("big", "work")).await?;
    let mut exec = Exec::connect(channel, "n", &["work"]).await?;
    let mut sids = Vec::new();
    for i in 0..5u8 {
        let sid = server.trigger("big").await?;
        let r = exec.dispatch().await?.run.context("run ref")?;
        exec.send(Msg::Started(pb::Started {
            run: Some(r.clone()),
        }))
        .await?;
        let ack = exec
            .result(&r, pb::ResultStatus::Succeeded, &vec![i; 1_000_000])
            .await?;
        ensure!(ack.accepted, "{ack:?}");
        wait_state(&server, &sid, pb::RunState::Succeeded).await?;
        sids.push(sid);
    }
    let mut runs = server.runs().await?;
    let mut pages = Vec::new();
    let mut listed = Vec::new();
    let mut token = String::new();
    for _ in 0..10 {
        let page = runs
            .list_runs(pb::ListRunsRequest {
                job_id: "big".into(),
                page_size: 100,
                page_token: token.clone(),
                ..Default::default()
            })
            .await?
            .into_inner();
        pages.push(page.runs.len());
        for r in page.runs {
            ensure!(r.output.len() == 1_000_000, "{} bytes", r.output.len());
            listed.push(r.schedule_id);
        }
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    ensure!(pages == [3, 2], "page sizes {pages:?}");
    sids.reverse();
    ensure!(listed == sids, "listed {listed:?}, ran {sids:?}");
    Ok(())
}

/// An executor's clock readings are numbers it chooses: an i64::MAX start, finish or
/// log time would have been written back by Lua as a float, and the run and its log
/// would no longer read (INTERNAL "store data is corrupt"). Such times count as
/// unknown (a log line takes the server's time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executors_clock_cannot_make_a_run_unreadable() -> Result<()> {
    let redis = RedisServer::start()?;
    let server = Sundial::start(SundialOptions::redis(&redis))?;
    let channel = server.channel().await?;
    server.create_job(manual_job("clock", "work")).await?;
    let mut exec = Exec::connect(channel, "n", &["work"]).await?;
    let sid = server.trigger("clock").await?;
    let r = exec.dispatch().await?.run.context("run ref")?;
    exec.send(Msg::Started(pb::Started {
        run: Some(r.clone()),
    }))
    .await?;
    exec.send(Msg::Logs(pb::LogLines {
        run: Some(r.clone()),
        lines: vec![pb::LogEntry {
            time_ms: i64::MAX,
            level: "info".into(),
            message: "from the far future".into(),
        }],
    }))
    .await?;
    let before = sundial_tests::now_ms();
    exec.send(Msg::Result(pb::Result {
        run: Some(r.clone()),
        status: pb::ResultStatus::Succeeded as i32,
        started_at_ms: i64::MAX,
        finished_at_ms: i64::MAX,
        ..Default::default()
    }))
    .await?;
    let got = wait_state(&server, &sid, pb::RunState::Succeeded).await?;
    ensure!(
        got.finished_at_ms > 0 && got.finished_at_ms < i64::MAX / 2,
        "finished at {}",
        got.finished_at_ms
    );
    let logs = server
        .runs()
        .await?
        .list_run_logs(pb::ListRunLogsRequest {
            schedule_id: sid.clone(),
            ..Default::default()
        })
        .await?
        .into_inner();
    ensure!(
        logs.lines.len() == 1
            && (before - 60_000..before + 60_000).contains(&logs.lines[0].time_ms),
        "{:?}",
        logs.lines
    );
    Ok(())
}
