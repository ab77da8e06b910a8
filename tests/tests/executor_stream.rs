//! The executor stream over real gRPC: handshake, heartbeats, the node registry, and a
//! protocol-abuse table. No job exists here, so no run is ever leased: in-flight runs
//! come back with no lease left, results are refused, `Started` gets no go-ahead.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use sundial_proto::v1 as pb;
use sundial_proto::v1::executor_message::Msg;
use sundial_proto::v1::server_message::Msg as Out;
use sundial_tests::{Sundial, SundialOptions, wait_for};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::transport::Channel;

fn hello(node: &str) -> pb::ExecutorMessage {
    pb::ExecutorMessage {
        msg: Some(Msg::Hello(pb::Hello {
            node_id: node.into(),
            group: "billing".into(),
            handlers: vec!["invoice".into(), "refund".into()],
            weight: 2,
            max_concurrency: 4,
            labels: [("zone".to_owned(), "a".to_owned())].into(),
            token: String::new(),
            sdk: "test".into(),
            in_flight: vec![run_ref("old@1")],
        })),
    }
}

fn run_ref(sid: &str) -> pb::RunRef {
    pb::RunRef {
        schedule_id: sid.into(),
        attempt: 1,
        fencing_token: 7,
        shard_index: 0,
    }
}

fn msg(m: Msg) -> pb::ExecutorMessage {
    pb::ExecutorMessage { msg: Some(m) }
}

struct Stream {
    tx: mpsc::Sender<pb::ExecutorMessage>,
    rx: tonic::Streaming<pb::ServerMessage>,
}

/// Opens a stream whose first message is `first`.
async fn open(channel: Channel, first: pb::ExecutorMessage) -> Result<Stream, tonic::Status> {
    let (tx, rx) = mpsc::channel(16);
    tx.send(first)
        .await
        .map_err(|_| tonic::Status::internal("send"))?;
    let mut client = pb::executor_service_client::ExecutorServiceClient::new(channel);
    let rx = client.connect(ReceiverStream::new(rx)).await?.into_inner();
    Ok(Stream { tx, rx })
}

impl Stream {
    async fn send(&self, m: Msg) -> Result<()> {
        self.tx.send(msg(m)).await.context("stream closed")
    }

    async fn next(&mut self) -> Result<Out, tonic::Status> {
        match tokio::time::timeout(Duration::from_secs(10), self.rx.message()).await {
            Err(_) => Err(tonic::Status::deadline_exceeded("test: no message in 10 s")),
            Ok(Err(s)) => Err(s),
            Ok(Ok(None)) => Err(tonic::Status::aborted("test: stream ended")),
            Ok(Ok(Some(m))) => m.msg.ok_or_else(|| tonic::Status::internal("empty")),
        }
    }
}

async fn nodes(channel: Channel) -> Result<Vec<pb::Node>> {
    Ok(pb::node_service_client::NodeServiceClient::new(channel)
        .list_nodes(pb::ListNodesRequest::default())
        .await?
        .into_inner()
        .nodes)
}

fn fast(dir: &std::path::Path) -> SundialOptions {
    SundialOptions::embedded(dir)
        .arg("heartbeat-interval", "300ms")
        .arg("missed-heartbeats", "3")
        .arg("instance-id", "inst-a")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_heartbeats_and_the_registry() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut server = Sundial::start(fast(dir.path()))?;
    let channel = server.channel().await?;
    let mut s = open(channel.clone(), hello("node-1")).await?;
    let Out::Welcome(w) = s.next().await? else {
        bail!("expected welcome");
    };
    ensure!(
        w.server_instance == "inst-a" && w.heartbeat_interval_ms == 300 && w.lease_ttl_ms == 900
    );
    ensure!(w.unknown_in_flight.len() == 1 && w.unknown_in_flight[0].schedule_id == "old@1");

    let listed = nodes(channel.clone()).await?;
    ensure!(listed.len() == 1, "{listed:?}");
    let n = &listed[0];
    ensure!(n.node_id == "node-1" && n.group == "billing" && n.handlers == ["invoice", "refund"]);
    ensure!(n.weight == 2 && n.max_concurrency == 4 && n.server_instance == "inst-a");
    ensure!(n.health == pb::NodeHealth::Healthy as i32 && n.last_heartbeat_ms > 0);

    // A heartbeat is acknowledged; the runs it lists hold no lease.
    s.send(Msg::Heartbeat(pb::Heartbeat {
        in_flight: vec![run_ref("job@5")],
        active: 1,
        load: 0.5,
        not_ready: true,
    }))
    .await?;
    let Out::HeartbeatAck(ack) = s.next().await? else {
        bail!("expected heartbeat ack");
    };
    ensure!(ack.leases.len() == 1 && ack.leases[0].remaining_ms <= 0);
    let listed = nodes(channel.clone()).await?;
    ensure!(listed[0].health == pb::NodeHealth::NotReady as i32 && listed[0].active == 1);

    // Results and starts for runs the server never leased.
    s.send(Msg::Result(pb::Result {
        run: Some(run_ref("job@5")),
        status: pb::ResultStatus::Succeeded as i32,
        ..Default::default()
    }))
    .await?;
    let Out::ResultAck(r) = s.next().await? else {
        bail!("expected result ack");
    };
    ensure!(!r.accepted && r.reason.contains("unknown run"));
    s.send(Msg::Started(pb::Started {
        run: Some(run_ref("job@6")),
    }))
    .await?;
    // No go-ahead for a run the server does not lease to this node, and a Cancel for
    // executors that started without waiting for it.
    let Out::StartAck(a) = s.next().await? else {
        bail!("expected start ack");
    };
    ensure!(
        !a.go
            && a.reason.contains("no lease")
            && a.run.as_ref().map(|r| r.schedule_id.as_str()) == Some("job@6"),
        "{a:?}"
    );
    let Out::Cancel(c) = s.next().await? else {
        bail!("expected cancel");
    };
    ensure!(c.run.map(|r| r.schedule_id).as_deref() == Some("job@6"));

    // Keep heartbeating past several TTLs: the node stays registered.
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        s.send(Msg::Heartbeat(pb::Heartbeat::default())).await?;
        let Out::HeartbeatAck(_) = s.next().await? else {
            bail!("expected heartbeat ack");
        };
    }
    // A heartbeat that leaves not_ready unset says "ready": the node takes work again.
    let listed = nodes(channel.clone()).await?;
    ensure!(listed.len() == 1, "{listed:?}");
    ensure!(
        listed[0].health == pb::NodeHealth::Healthy as i32,
        "an unset not_ready must mean ready: {listed:?}"
    );

    // Going silent ends the stream and the registration.
    let err = s.next().await.expect_err("silence closes the stream");
    ensure!(
        err.code() == Code::DeadlineExceeded && err.message().contains("heartbeat"),
        "{err:?}"
    );
    ensure!(nodes(channel.clone()).await?.is_empty());

    // A closed stream unregisters its node at once.
    let s2 = open(channel.clone(), hello("node-2")).await?;
    ensure!(nodes(channel.clone()).await?.len() == 1);
    drop(s2);
    wait_for("node-2 to leave", Duration::from_secs(5), || {
        let channel = channel.clone();
        async move { Ok(nodes(channel).await?.is_empty().then_some(())) }
    })
    .await?;

    // Shutdown tells connected executors to go away.
    let mut s3 = open(channel.clone(), hello("node-3")).await?;
    let Out::Welcome(_) = s3.next().await? else {
        bail!("expected welcome");
    };
    let stop = tokio::task::spawn_blocking(move || server.stop());
    let Out::GoAway(g) = s3.next().await? else {
        bail!("expected go-away");
    };
    ensure!(g.reason.contains("shutting down"));
    ensure!(stop.await??.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_abuse_gets_a_precise_error_and_hurts_nobody_else() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // Default heartbeat interval (5 s): the neighbour below must not time out while
    // the table runs.
    let server = Sundial::start(SundialOptions::embedded(dir.path()))?;
    let channel = server.channel().await?;
    // A well-behaved neighbour stays connected throughout.
    let mut good = open(channel.clone(), hello("good")).await?;
    let Out::Welcome(_) = good.next().await? else {
        bail!("expected welcome");
    };

    // Refused at the handshake.
    let bad_hellos: Vec<(pb::ExecutorMessage, Code, &str)> = vec![
        (
            msg(Msg::Heartbeat(pb::Heartbeat::default())),
            Code::FailedPrecondition,
            "hello: the first message",
        ),
        (
            pb::ExecutorMessage { msg: None },
            Code::InvalidArgument,
            "hello:",
        ),
        (
            {
                let mut h = hello("x");
                if let Some(Msg::Hello(h)) = &mut h.msg {
                    h.node_id = "bad id".into();
                }
                h
            },
            Code::InvalidArgument,
            "hello.node_id:",
        ),
        (
            {
                let mut h = hello("x");
                if let Some(Msg::Hello(h)) = &mut h.msg {
                    h.group = String::new();
                }
                h
            },
            Code::InvalidArgument,
            "hello.group:",
        ),
        (
            {
                let mut h = hello("x");
                if let Some(Msg::Hello(h)) = &mut h.msg {
                    h.labels = (0..65).map(|i| (format!("k{i}"), "v".to_owned())).collect();
                }
                h
            },
            Code::InvalidArgument,
            "hello.labels: more than 64",
        ),
        (
            {
                let mut h = hello("x");
                if let Some(Msg::Hello(h)) = &mut h.msg {
                    h.labels = [("big".to_owned(), "v".repeat(1_900_000))].into();
                }
                h
            },
            Code::InvalidArgument,
            "hello.labels: each key",
        ),
        (
            {
                let mut h = hello("x");
                if let Some(Msg::Hello(h)) = &mut h.msg {
                    h.node_id = "..".into();
                }
                h
            },
            Code::InvalidArgument,
            "hello.node_id:",
        ),
        (
            {
                let mut h = hello("x");
                if let Some(Msg::Hello(h)) = &mut h.msg {
                    h.handlers.clear();
                }
                h
            },
            Code::InvalidArgument,
            "hello.handlers:",
        ),
        (
            {
                let mut h = hello("x");
                if let Some(Msg::Hello(h)) = &mut h.msg {
                    h.max_concurrency = 10_001;
                }
                h
            },
            Code::InvalidArgument,
            "hello.max_concurrency: at most 10000",
        ),
    ];
    for (first, code, needle) in bad_hellos {
        let got = match open(channel.clone(), first).await {
            Err(status) => status,
            Ok(mut s) => match s.next().await {
                Err(status) => status,
                Ok(m) => bail!("{needle}: expected an error, got {m:?}"),
            },
        };
        ensure!(
            got.code() == code && got.message().starts_with(needle),
            "{needle}: got {:?} {:?}",
            got.code(),
            got.message()
        );
    }

    // Refused after the handshake: the stream ends with a precise status.
    let after: Vec<(Option<Msg>, Code, &str)> = vec![
        (
            Some(Msg::Hello(pb::Hello::default())),
            Code::FailedPrecondition,
            "hello: sent twice",
        ),
        (None, Code::InvalidArgument, "message: empty"),
        (
            Some(Msg::Result(pb::Result::default())),
            Code::InvalidArgument,
            "result.run:",
        ),
        (
            Some(Msg::Started(pb::Started { run: None })),
            Code::InvalidArgument,
            "started.run:",
        ),
        (
            Some(Msg::Logs(pb::LogLines {
                run: Some(run_ref("j@1")),
                lines: vec![pb::LogEntry {
                    time_ms: 1,
                    level: "info".into(),
                    message: "x".repeat(3 * 1024 * 1024),
                }],
            })),
            // tonic's code for a message over the server's decoding limit.
            Code::OutOfRange,
            "too large",
        ),
    ];
    for (i, (m, code, needle)) in after.into_iter().enumerate() {
        let mut s = open(channel.clone(), hello(&format!("abuser-{i}"))).await?;
        let Out::Welcome(_) = s.next().await? else {
            bail!("expected welcome");
        };
        s.tx.send(pb::ExecutorMessage { msg: m }).await.ok();
        let got = loop {
            match s.next().await {
                Err(status) => break status,
                Ok(Out::HeartbeatAck(_)) => continue,
                Ok(other) => bail!("{needle}: expected an error, got {other:?}"),
            }
        };
        ensure!(
            got.code() == code && got.message().contains(needle),
            "{needle}: got {:?} {:?}",
            got.code(),
            got.message()
        );
    }

    // The neighbour never noticed.
    good.send(Msg::Heartbeat(pb::Heartbeat::default())).await?;
    let Out::HeartbeatAck(_) = good.next().await? else {
        bail!("expected heartbeat ack");
    };
    let listed = nodes(channel).await?;
    ensure!(listed.iter().any(|n| n.node_id == "good"), "{listed:?}");
    Ok(())
}
