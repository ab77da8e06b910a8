//! A hand-driven executor over a raw stream (no SDK), for tests that say exactly what
//! an executor sends: it heartbeats every 200 ms (listing nothing, so leases last
//! their TTL) and otherwise sends only what the test tells it to.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use sundial_proto::v1 as pb;
use sundial_proto::v1::executor_message::Msg;
use sundial_proto::v1::server_message::Msg as Out;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// A hand-driven executor. See the module docs.
pub struct Exec {
    tx: mpsc::Sender<pb::ExecutorMessage>,
    rx: tonic::Streaming<pb::ServerMessage>,
    heartbeats: tokio::task::JoinHandle<()>,
}

impl Drop for Exec {
    fn drop(&mut self) {
        self.heartbeats.abort();
    }
}

impl Exec {
    /// Connects as `node` of group `g` (no executor token).
    pub async fn connect(channel: Channel, node: &str, handlers: &[&str]) -> Result<Self> {
        Ok(Self::reconnect(channel, node, handlers, Vec::new())
            .await?
            .0)
    }

    /// Connects with a hello listing `in_flight` (runs held from an earlier stream);
    /// returns the welcome's `unknown_in_flight` too.
    pub async fn reconnect(
        channel: Channel,
        node: &str,
        handlers: &[&str],
        in_flight: Vec<pb::RunRef>,
    ) -> Result<(Self, Vec<pb::RunRef>)> {
        Self::hello(
            channel,
            pb::Hello {
                node_id: node.into(),
                group: "g".into(),
                handlers: handlers.iter().map(|h| (*h).to_owned()).collect(),
                in_flight,
                ..Default::default()
            },
        )
        .await
    }

    /// Connects with this hello; fails with the server's status if it refuses it.
    pub async fn hello(channel: Channel, hello: pb::Hello) -> Result<(Self, Vec<pb::RunRef>)> {
        let (tx, rx) = mpsc::channel(64);
        tx.send(msg(Msg::Hello(hello))).await?;
        let mut client = pb::executor_service_client::ExecutorServiceClient::new(channel);
        let rx = client.connect(ReceiverStream::new(rx)).await?.into_inner();
        let beat = tx.clone();
        let heartbeats = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let hb = msg(Msg::Heartbeat(pb::Heartbeat::default()));
                if beat.send(hb).await.is_err() {
                    return;
                }
            }
        });
        let mut e = Self { tx, rx, heartbeats };
        let Out::Welcome(w) = e.next().await? else {
            bail!("expected welcome");
        };
        Ok((e, w.unknown_in_flight))
    }

    /// Sends `Started` and waits for its go-ahead.
    pub async fn start(&mut self, run: &pb::RunRef) -> Result<bool> {
        self.send(Msg::Started(pb::Started {
            run: Some(run.clone()),
        }))
        .await?;
        loop {
            if let Out::StartAck(a) = self.next().await?
                && a.run.as_ref() == Some(run)
            {
                return Ok(a.go);
            }
        }
    }

    pub async fn send(&self, m: Msg) -> Result<()> {
        self.tx.send(msg(m)).await.context("stream closed")
    }

    pub async fn next(&mut self) -> Result<Out> {
        let m = self.next_or_status().await?.map_err(anyhow::Error::from)?;
        m.context("stream ended")
    }

    /// The next message, `None` once the stream ended, or the status it ended with.
    pub async fn next_or_status(&mut self) -> Result<Result<Option<Out>, tonic::Status>> {
        let m = tokio::time::timeout(Duration::from_secs(15), self.rx.message())
            .await
            .context("no message within 15 s")?;
        Ok(m.map(|m| m.and_then(|m| m.msg)))
    }

    /// The next dispatch, answering heartbeat acks and skipping anything else.
    pub async fn dispatch(&mut self) -> Result<pb::Dispatch> {
        loop {
            if let Out::Dispatch(d) = self.next().await? {
                return Ok(d);
            }
        }
    }

    pub async fn result(
        &mut self,
        run: &pb::RunRef,
        status: pb::ResultStatus,
        output: &[u8],
    ) -> Result<pb::ResultAck> {
        self.send(Msg::Result(pb::Result {
            run: Some(run.clone()),
            status: status as i32,
            output: output.to_vec(),
            error_code: if status == pb::ResultStatus::Failed {
                "boom".into()
            } else {
                String::new()
            },
            ..Default::default()
        }))
        .await?;
        loop {
            if let Out::ResultAck(a) = self.next().await? {
                return Ok(a);
            }
        }
    }
}

/// An executor message.
pub fn msg(m: Msg) -> pb::ExecutorMessage {
    pb::ExecutorMessage { msg: Some(m) }
}
