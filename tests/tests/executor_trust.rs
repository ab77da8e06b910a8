//! The executor plane as a trust boundary, over real gRPC on both stores: a stream
//! authenticated for one executor group cannot start, finish, report progress or log
//! for a run leased to another group's node, even quoting that run's current
//! `RunRef`; the holder's own reports then go through; a stream that keeps naming
//! runs its node does not hold (guessing tokens) is closed; results sent together are
//! each answered as alone; a node id belongs to one group, and the same executor
//! connecting again replaces its old stream.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use sundial_proto::v1 as pb;
use sundial_proto::v1::executor_message::Msg;
use sundial_proto::v1::server_message::Msg as Out;
use sundial_server::dispatch::executors::MAX_FOREIGN_REPORTS;
use sundial_tests::raw::Exec;
use sundial_tests::{RedisServer, Sundial, SundialOptions, manual_job};
use tonic::Code;
use tonic::transport::Channel;

const TOKEN_A: &str = "exec-tok-group-a-7731";
const TOKEN_B: &str = "exec-tok-group-b-1187";

fn secured(opts: SundialOptions) -> SundialOptions {
    opts.repeated_arg("executor-token", &format!("ga={TOKEN_A}"))
        .repeated_arg("executor-token", &format!("gb={TOKEN_B}"))
        .arg("heartbeat-interval", "300ms")
        .arg("sweep-every", "50ms")
}

/// A raw executor of `group` presenting `token`.
async fn connect(channel: Channel, node: &str, group: &str, token: &str) -> Result<Exec> {
    let hello = pb::Hello {
        node_id: node.into(),
        group: group.into(),
        handlers: vec!["work".into()],
        token: token.into(),
        ..Default::default()
    };
    Ok(Exec::hello(channel, hello).await?.0)
}

/// Sends `Result` SUCCEEDED with `output` and returns its ack.
async fn forge_result(e: &mut Exec, run: &pb::RunRef, output: &[u8]) -> Result<pb::ResultAck> {
    e.result(run, pb::ResultStatus::Succeeded, output).await
}

async fn forged_reports_are_refused(opts: SundialOptions) -> Result<()> {
    let server = Sundial::start(secured(opts))?;
    let channel = server.channel().await?;
    server.create_job(gb_job("payroll")).await?;
    let mut victim = connect(channel.clone(), "victim", "gb", TOKEN_B).await?;
    let mut thief = connect(channel.clone(), "thief", "ga", TOKEN_A).await?;

    let sid = server.trigger("payroll").await?;
    let run = victim.dispatch().await?.run.context("run ref")?;
    ensure!(run.schedule_id == sid, "{run:?}");

    // The thief quotes the victim's whole RunRef: every report is refused.
    ensure!(
        !thief.start(&run).await?,
        "a foreign Started got the go-ahead"
    );
    thief
        .send(Msg::Progress(pb::Progress {
            run: Some(run.clone()),
            percent: 99,
            message: "forged".into(),
        }))
        .await?;
    thief
        .send(Msg::Logs(pb::LogLines {
            run: Some(run.clone()),
            lines: vec![pb::LogEntry {
                time_ms: 1,
                level: "info".into(),
                message: "forged line".into(),
            }],
        }))
        .await?;
    let ack = forge_result(&mut thief, &run, b"forged").await?;
    ensure!(
        !ack.accepted && ack.reason == "not the lease holder",
        "a foreign Result: {ack:?}"
    );
    let r = server.run(&sid).await?;
    ensure!(
        r.state == pb::RunState::Dispatched as i32 && r.progress_percent == 0,
        "the foreign reports changed the run: {r:?}"
    );
    let logs = server
        .runs()
        .await?
        .get_run_logs(pb::GetRunLogsRequest {
            schedule_id: sid.clone(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .message()
        .await?;
    ensure!(logs.is_none(), "a foreign log line was stored: {logs:?}");

    // The holder's own reports are applied: its output is the run's.
    ensure!(victim.start(&run).await?, "the holder got no go-ahead");
    let ack = forge_result(&mut victim, &run, b"real").await?;
    ensure!(ack.accepted, "the holder's result: {ack:?}");
    let r = server.finished(&sid).await?;
    ensure!(
        r.state == pb::RunState::Succeeded as i32 && r.output == b"real" && r.node_id == "victim",
        "{r:?}"
    );

    // Guessing, on a fresh stream of group ga: results for the next run with every
    // token from a few below its current one up. None is accepted, and the stream is
    // closed after MAX_FOREIGN_REPORTS refusals, long before the guesses run out.
    let sid = server.trigger("payroll").await?;
    let next = victim.dispatch().await?.run.context("run ref")?;
    let mut guesser = connect(channel.clone(), "guesser", "ga", TOKEN_A).await?;
    let mut refused = 0u32;
    let mut sent = 0u64;
    let closed = 'guessing: loop {
        ensure!(sent < 1000, "the guessing stream was never closed");
        let mut guess = next.clone();
        guess.fencing_token = next.fencing_token.saturating_sub(5) + sent;
        sent += 1;
        guesser
            .send(Msg::Result(pb::Result {
                run: Some(guess),
                status: pb::ResultStatus::Succeeded as i32,
                output: b"guessed".to_vec(),
                ..Default::default()
            }))
            .await?;
        // Its answer: a refusal, or the stream's end (heartbeat acks skipped).
        loop {
            match guesser.next_or_status().await? {
                Ok(Some(Out::ResultAck(a))) => {
                    ensure!(!a.accepted, "a guessed result was accepted: {a:?}");
                    refused += 1;
                    break;
                }
                Ok(Some(_)) => {}
                Ok(None) => bail!("the stream ended without a status"),
                Err(status) => break 'guessing status,
            }
        }
    };
    println!("guessing stream closed after {sent} results ({refused} refused): {closed:?}");
    ensure!(closed.code() == Code::PermissionDenied, "{closed:?}");
    ensure!(
        refused == MAX_FOREIGN_REPORTS && sent == u64::from(MAX_FOREIGN_REPORTS) + 1,
        "{refused} refused of {sent} before the close"
    );
    let r = server.run(&sid).await?;
    ensure!(
        r.state == pb::RunState::Dispatched as i32 && r.output.is_empty(),
        "{r:?}"
    );
    ensure!(
        victim.start(&next).await?,
        "the holder lost its run to the guesses"
    );
    let foreign = foreign_reports(&server).await?;
    ensure!(
        foreign >= u64::from(MAX_FOREIGN_REPORTS) + 4,
        "sundial_foreign_reports_total = {foreign}"
    );
    Ok(())
}

/// `sundial_foreign_reports_total` from `/metrics`.
async fn foreign_reports(server: &Sundial) -> Result<u64> {
    let url = format!("{}/metrics", server.http_url().context("no http listener")?);
    let text = reqwest::get(&url).await?.text().await?;
    let line = text
        .lines()
        .find(|l| l.starts_with("sundial_foreign_reports_total "))
        .context("no sundial_foreign_reports_total")?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("no value")?
        .parse::<f64>()? as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_reports_are_refused_on_redis() -> Result<()> {
    let redis = RedisServer::start()?;
    forged_reports_are_refused(SundialOptions::redis(&redis)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_reports_are_refused_on_the_embedded_store() -> Result<()> {
    let dir = tempfile::tempdir()?;
    forged_reports_are_refused(SundialOptions::embedded(dir.path())).await
}

/// Log lines, progress and results sent together (one batch on the stream; the results
/// one store decision) are each applied as alone: the results answered in order, the
/// holder's applied, one quoting a stale token refused and changing nothing (that
/// run's real result is applied after), every run's log line and the progress kept.
async fn results_sent_together_are_each_answered(opts: SundialOptions) -> Result<()> {
    let server = Sundial::start(secured(opts))?;
    let channel = server.channel().await?;
    server.create_job(gb_job("ledger")).await?;
    let mut holder = connect(channel.clone(), "holder", "gb", TOKEN_B).await?;
    let mut runs = Vec::new();
    for _ in 0..3 {
        let sid = server.trigger("ledger").await?;
        let run = holder.dispatch().await?.run.context("run ref")?;
        ensure!(run.schedule_id == sid, "{run:?}");
        ensure!(holder.start(&run).await?, "no go-ahead for {sid}");
        runs.push(run);
    }
    let stale = pb::RunRef {
        fencing_token: runs[1].fencing_token - 1,
        ..runs[1].clone()
    };
    // Log lines and progress first, in the same burst as the results.
    for (i, run) in runs.iter().enumerate() {
        holder
            .send(Msg::Logs(pb::LogLines {
                run: Some(run.clone()),
                lines: vec![pb::LogEntry {
                    time_ms: 1,
                    level: "info".into(),
                    message: format!("line of run {i}"),
                }],
            }))
            .await?;
    }
    holder
        .send(Msg::Progress(pb::Progress {
            run: Some(runs[1].clone()),
            percent: 40,
            message: "almost".into(),
        }))
        .await?;
    for (run, output) in [(&runs[0], "r0"), (&stale, "stale"), (&runs[2], "r2")] {
        holder
            .send(Msg::Result(pb::Result {
                run: Some(run.clone()),
                status: pb::ResultStatus::Succeeded as i32,
                output: output.as_bytes().to_vec(),
                ..Default::default()
            }))
            .await?;
    }
    let mut acks = Vec::new();
    while acks.len() < 3 {
        if let Out::ResultAck(a) = holder.next().await? {
            acks.push(a);
        }
    }
    let answered: Vec<_> = acks
        .iter()
        .map(|a| (a.run.clone(), a.accepted, a.reason.as_str()))
        .collect();
    ensure!(
        answered
            == vec![
                (Some(runs[0].clone()), true, ""),
                (Some(stale.clone()), false, "stale fencing token"),
                (Some(runs[2].clone()), true, ""),
            ],
        "{answered:?}"
    );
    for (run, output) in [(&runs[0], "r0"), (&runs[2], "r2")] {
        let r = server.finished(&run.schedule_id).await?;
        ensure!(
            r.state == pb::RunState::Succeeded as i32 && r.output == output.as_bytes(),
            "{r:?}"
        );
    }
    let r = server.run(&runs[1].schedule_id).await?;
    ensure!(
        r.state == pb::RunState::Running as i32 && r.output.is_empty(),
        "the stale result changed the run: {r:?}"
    );
    ensure!(r.progress_percent == 40, "{r:?}");
    for (i, run) in runs.iter().enumerate() {
        let logs = server
            .runs()
            .await?
            .list_run_logs(pb::ListRunLogsRequest {
                schedule_id: run.schedule_id.clone(),
                ..Default::default()
            })
            .await?
            .into_inner()
            .lines;
        let texts: Vec<&str> = logs.iter().map(|l| l.message.as_str()).collect();
        ensure!(texts == [format!("line of run {i}")], "run {i}: {texts:?}");
    }
    let ack = holder
        .result(&runs[1], pb::ResultStatus::Succeeded, b"r1")
        .await?;
    ensure!(ack.accepted, "the holder's own result: {ack:?}");
    let r = server.finished(&runs[1].schedule_id).await?;
    ensure!(r.output == b"r1", "{r:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_sent_together_are_each_answered_on_redis() -> Result<()> {
    let redis = RedisServer::start()?;
    results_sent_together_are_each_answered(SundialOptions::redis(&redis)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_sent_together_are_each_answered_on_the_embedded_store() -> Result<()> {
    let dir = tempfile::tempdir()?;
    results_sent_together_are_each_answered(SundialOptions::embedded(dir.path())).await
}

/// A `manual_job` on group `gb`.
fn gb_job(id: &str) -> pb::JobSpec {
    let mut spec = manual_job(id, "work");
    if let Some(pb::job_spec::Target::Executor(t)) = spec.target.as_mut() {
        t.group = "gb".into();
    }
    spec
}

async fn a_node_id_belongs_to_one_group(opts: SundialOptions) -> Result<()> {
    let server = Sundial::start(secured(opts))?;
    let channel = server.channel().await?;
    server.create_job(gb_job("ledger")).await?;
    let mut victim = connect(channel.clone(), "shared-id", "gb", TOKEN_B).await?;

    // Another group's hello with the victim's node id is refused.
    let refused = match connect(channel.clone(), "shared-id", "ga", TOKEN_A).await {
        Ok(_) => bail!("a hello from another group took over the node id"),
        Err(e) => e
            .downcast::<tonic::Status>()
            .context("refused without a status")?,
    };
    ensure!(
        refused.code() == Code::PermissionDenied && refused.message().contains("hello.node_id"),
        "{refused:?}"
    );

    // The victim keeps receiving its group's runs.
    for _ in 0..3 {
        let sid = server.trigger("ledger").await?;
        let run = victim.dispatch().await?.run.context("run ref")?;
        ensure!(run.schedule_id == sid, "{run:?}");
        ensure!(victim.start(&run).await?);
        ensure!(
            victim
                .result(&run, pb::ResultStatus::Succeeded, b"")
                .await?
                .accepted
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_id_belongs_to_one_group_on_redis() -> Result<()> {
    let redis = RedisServer::start()?;
    a_node_id_belongs_to_one_group(SundialOptions::redis(&redis)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_id_belongs_to_one_group_on_the_embedded_store() -> Result<()> {
    let dir = tempfile::tempdir()?;
    a_node_id_belongs_to_one_group(SundialOptions::embedded(dir.path())).await
}

/// The same executor connects again while its old stream still looks alive (the old
/// stream was cut off, not closed): the new stream takes the node over, listing the
/// run it holds, which keeps its lease and is finished once; the old stream gets
/// `GoAway` at its next heartbeat, and new runs go to the new stream.
async fn a_reconnect_replaces_the_old_stream(opts: SundialOptions) -> Result<()> {
    let server = Sundial::start(secured(opts))?;
    let channel = server.channel().await?;
    server.create_job(gb_job("ledger")).await?;
    let mut old = connect(channel.clone(), "n", "gb", TOKEN_B).await?;
    let sid = server.trigger("ledger").await?;
    let run = old.dispatch().await?.run.context("run ref")?;
    ensure!(old.start(&run).await?);

    let hello = pb::Hello {
        node_id: "n".into(),
        group: "gb".into(),
        handlers: vec!["work".into()],
        token: TOKEN_B.into(),
        in_flight: vec![run.clone()],
        ..Default::default()
    };
    let (mut new, unknown) = Exec::hello(channel.clone(), hello).await?;
    ensure!(unknown.is_empty(), "the held run was taken: {unknown:?}");
    let go_away = loop {
        match old.next_or_status().await? {
            Ok(Some(Out::GoAway(g))) => break g,
            Ok(Some(_)) => {}
            other => bail!("the old stream ended without GoAway: {other:?}"),
        }
    };
    ensure!(go_away.reason.contains("superseded"), "{go_away:?}");

    let ack = new
        .result(&run, pb::ResultStatus::Succeeded, b"done")
        .await?;
    ensure!(ack.accepted, "{ack:?}");
    let r = server.finished(&sid).await?;
    ensure!(
        r.state == pb::RunState::Succeeded as i32 && r.attempt == 1 && r.output == b"done",
        "{r:?}"
    );
    let next = server.trigger("ledger").await?;
    let d = new.dispatch().await?.run.context("run ref")?;
    ensure!(d.schedule_id == next, "{d:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_replaces_the_old_stream_on_redis() -> Result<()> {
    let redis = RedisServer::start()?;
    a_reconnect_replaces_the_old_stream(SundialOptions::redis(&redis)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_replaces_the_old_stream_on_the_embedded_store() -> Result<()> {
    let dir = tempfile::tempdir()?;
    a_reconnect_replaces_the_old_stream(SundialOptions::embedded(dir.path())).await
}

/// Whether a hello of group `gb` with `token` is welcomed (on a handler no job uses, so
/// a welcomed probe takes no work).
async fn probe(channel: Channel, token: &str) -> Result<Result<(), tonic::Status>> {
    let hello = pb::Hello {
        node_id: "probe".into(),
        group: "gb".into(),
        handlers: vec!["probe".into()],
        token: token.into(),
        ..Default::default()
    };
    match Exec::hello(channel, hello).await {
        Ok(_) => Ok(Ok(())),
        Err(e) => Ok(Err(e.downcast::<tonic::Status>()?)),
    }
}

fn sighup(server: &Sundial) -> Result<()> {
    let status = std::process::Command::new("kill")
        .args(["-HUP", &server.pid().to_string()])
        .status()?;
    ensure!(status.success(), "kill -HUP failed");
    Ok(())
}

/// Triggers the job and has `e` run it to success.
async fn run_once(server: &Sundial, e: &mut Exec, job: &str) -> Result<()> {
    let sid = server.trigger(job).await?;
    let run = e.dispatch().await?.run.context("run ref")?;
    ensure!(run.schedule_id == sid, "{run:?}");
    ensure!(e.start(&run).await?, "no go-ahead");
    ensure!(
        e.result(&run, pb::ResultStatus::Succeeded, b"")
            .await?
            .accepted
    );
    let r = server.finished(&sid).await?;
    ensure!(r.state == pb::RunState::Succeeded as i32, "{r:?}");
    Ok(())
}

/// A group's executor token rotates without a restart: the new token is added to the
/// tokens file (SIGHUP), the executor moves to it, the old one is removed (SIGHUP) and
/// refused from then on; runs go on throughout, and no token reaches the logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executor_tokens_rotate_without_a_restart() -> Result<()> {
    const OLD: &str = "exec-tok-old-5512";
    const NEW: &str = "exec-tok-new-9034";
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("executor-tokens");
    std::fs::write(&file, format!("# group gb\ngb={OLD}\n"))?;
    let server = Sundial::start(
        SundialOptions::embedded(dir.path())
            .arg("executor-tokens-file", &file.to_string_lossy())
            .arg("heartbeat-interval", "300ms"),
    )?;
    let channel = server.channel().await?;
    server.create_job(gb_job("ledger")).await?;
    let mut exec = connect(channel.clone(), "a", "gb", OLD).await?;
    run_once(&server, &mut exec, "ledger").await?;
    ensure!(
        probe(channel.clone(), NEW).await?.is_err(),
        "the new token before it was added"
    );

    // Add the new token: both are accepted.
    std::fs::write(&file, format!("gb={OLD}\ngb={NEW}\n"))?;
    sighup(&server)?;
    sundial_tests::wait_for(
        "the new token to be accepted",
        Duration::from_secs(10),
        || {
            let channel = channel.clone();
            async move { Ok(probe(channel, NEW).await?.ok()) }
        },
    )
    .await?;
    ensure!(probe(channel.clone(), OLD).await?.is_ok());
    run_once(&server, &mut exec, "ledger").await?;

    // The executor moves to the new token (it reconnects), then the old one goes.
    drop(exec);
    let mut exec = connect(channel.clone(), "a", "gb", NEW).await?;
    std::fs::write(&file, format!("gb={NEW}\n"))?;
    sighup(&server)?;
    let refused = sundial_tests::wait_for(
        "the old token to be refused",
        Duration::from_secs(10),
        || {
            let channel = channel.clone();
            async move { Ok(probe(channel, OLD).await?.err()) }
        },
    )
    .await?;
    ensure!(refused.code() == Code::Unauthenticated, "{refused:?}");
    for _ in 0..3 {
        run_once(&server, &mut exec, "ledger").await?;
    }

    let logs = format!("{}\n{}", server.stderr(), server.stdout());
    ensure!(
        logs.contains("executor tokens file read again"),
        "no reload logged"
    );
    for token in [OLD, NEW] {
        ensure!(!logs.contains(token), "a token reached the logs");
    }
    Ok(())
}
