//! The executor's connection: one `Connect` stream at a time, hello → welcome,
//! heartbeats at the server's interval, and reconnects with jittered backoff across the
//! endpoints (at once, to the next endpoint, after a `GoAway`).

use std::time::Duration;

use sundial_proto::v1 as pb;
use sundial_proto::v1::executor_message::Msg;
use sundial_proto::v1::executor_service_client::ExecutorServiceClient;
use sundial_proto::v1::server_message::Msg as In;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;
use tracing::{debug, info, warn};

use crate::Error;

#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub endpoints: Vec<String>,
    pub hello: pb::Hello,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

/// A connected (or connecting) executor process. Build one with
/// [`Executor::builder`], then [`run`](Executor::run) it.
#[derive(Debug, Clone)]
pub struct Executor {
    settings: Settings,
}

/// Why one stream ended.
enum Ended {
    Shutdown,
    /// The server asked us to go elsewhere.
    GoAway,
    /// The stream could not be opened or broke; `welcomed` says whether it had been
    /// working (then the backoff starts over).
    Lost {
        welcomed: bool,
        reason: String,
    },
}

fn msg(m: Msg) -> pb::ExecutorMessage {
    pb::ExecutorMessage { msg: Some(m) }
}

impl Executor {
    pub(crate) fn new(settings: Settings) -> Self {
        Self { settings }
    }

    /// The node id this executor registers under.
    pub fn node_id(&self) -> &str {
        &self.settings.hello.node_id
    }

    /// Stays connected until `shutdown` is cancelled: reconnects after every loss, to
    /// the next endpoint, with jittered exponential backoff.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let endpoints = &self.settings.endpoints;
        let mut next = 0usize;
        let mut backoff = self.settings.backoff_min;
        while !shutdown.is_cancelled() {
            let endpoint = &endpoints[next % endpoints.len()];
            next += 1;
            match self.session(endpoint, &shutdown).await {
                Ended::Shutdown => break,
                Ended::GoAway => {
                    info!(%endpoint, "server sent go-away; moving to the next endpoint");
                    backoff = self.settings.backoff_min;
                }
                Ended::Lost { welcomed, reason } => {
                    if welcomed {
                        backoff = self.settings.backoff_min;
                    }
                    let wait = jitter(backoff);
                    warn!(%endpoint, %reason, ?wait, "connection lost; reconnecting");
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(wait) => {}
                    }
                    backoff = (backoff * 2).min(self.settings.backoff_max);
                }
            }
        }
        info!(node_id = %self.node_id(), "executor stopped");
        Ok(())
    }

    async fn session(&self, endpoint: &str, shutdown: &CancellationToken) -> Ended {
        let lost = |welcomed, reason: String| Ended::Lost { welcomed, reason };
        let channel = match Endpoint::from_shared(endpoint.to_owned()) {
            Ok(e) => e.connect_timeout(Duration::from_secs(5)),
            Err(e) => return lost(false, format!("bad endpoint: {e}")),
        };
        let channel = tokio::select! {
            () = shutdown.cancelled() => return Ended::Shutdown,
            c = channel.connect() => match c {
                Ok(c) => c,
                Err(e) => return lost(false, format!("connect: {e}")),
            },
        };
        let (tx, rx) = mpsc::channel(64);
        if tx
            .send(msg(Msg::Hello(self.settings.hello.clone())))
            .await
            .is_err()
        {
            return lost(false, "stream closed".into());
        }
        let mut client = ExecutorServiceClient::new(channel);
        let mut inbound = match client.connect(ReceiverStream::new(rx)).await {
            Ok(r) => r.into_inner(),
            Err(status) => return lost(false, format!("hello refused: {status}")),
        };
        let welcome = match inbound.message().await {
            Ok(Some(pb::ServerMessage {
                msg: Some(In::Welcome(w)),
            })) => w,
            Ok(other) => return lost(false, format!("expected welcome, got {other:?}")),
            Err(status) => return lost(false, format!("hello refused: {status}")),
        };
        let every =
            Duration::from_millis(u64::try_from(welcome.heartbeat_interval_ms).unwrap_or(0))
                .max(Duration::from_millis(50));
        info!(%endpoint, instance = %welcome.server_instance, heartbeat = ?every, "connected");
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut draining = false;
        loop {
            tokio::select! {
                // Dropping the sender ends our side of the stream: the server
                // unregisters the node at once.
                () = shutdown.cancelled() => return Ended::Shutdown,
                _ = ticks.tick() => {
                    let hb = pb::Heartbeat {
                        in_flight: Vec::new(),
                        active: 0,
                        load: 0.0,
                        ready: !draining,
                    };
                    if tx.send(msg(Msg::Heartbeat(hb))).await.is_err() {
                        return lost(true, "stream closed".into());
                    }
                }
                m = inbound.message() => match m {
                    Ok(Some(pb::ServerMessage { msg: Some(m) })) => match m {
                        In::GoAway(g) => {
                            debug!(reason = %g.reason, "go-away");
                            return Ended::GoAway;
                        }
                        In::Drain(d) => {
                            info!(reason = %d.reason, "draining: taking no new work");
                            draining = true;
                        }
                        In::Dispatch(d) => {
                            // Running handlers is not built yet: hand the run back.
                            let reject = pb::Reject {
                                run: d.run,
                                reason: "this executor SDK does not run handlers yet".into(),
                            };
                            if tx.send(msg(Msg::Reject(reject))).await.is_err() {
                                return lost(true, "stream closed".into());
                            }
                        }
                        In::Welcome(_) | In::HeartbeatAck(_) | In::ResultAck(_) | In::Cancel(_) => {}
                    },
                    Ok(Some(pb::ServerMessage { msg: None })) => {}
                    Ok(None) => return lost(true, "server closed the stream".into()),
                    Err(status) => return lost(true, format!("stream failed: {status}")),
                },
            }
        }
    }
}

/// Full jitter in [d/2, d].
fn jitter(d: Duration) -> Duration {
    let half = d / 2;
    half + half.mul_f64(rand::random::<f64>())
}
