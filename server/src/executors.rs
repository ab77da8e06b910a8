//! The executor stream (`ExecutorService.Connect`) and the node registry it keeps.
//!
//! Owns one task per connected executor: the hello → welcome handshake, heartbeats
//! (each refreshes the node's registry entry, whose TTL is `missed_heartbeats`
//! intervals, and is acknowledged), the closing of streams that go silent, and the
//! go-away on shutdown. A malformed or out-of-order message ends that stream with a
//! precise status; it never affects another stream or the server.
//!
//! Not built yet (the executors issue): dispatch, leases in use, results applied to
//! runs. Until then nothing is ever leased to a node, so every heartbeat's in-flight
//! run is acknowledged with no lease left, every result is refused as unknown, and a
//! `Started` for a run the server never dispatched is answered with `Cancel`.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use sundial_proto::v1 as pb;
use sundial_proto::v1::executor_message::Msg;
use sundial_proto::v1::executor_service_server::ExecutorService;
use sundial_proto::v1::node_service_server::NodeService;
use sundial_proto::v1::server_message::Msg as Out;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::model::{Millis, valid_job_id};
use crate::store::{NodeRecord, Store};

#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// This instance's name, recorded as the owner of its executors' streams.
    pub instance_id: String,
    /// How often executors heartbeat (told to them in `Welcome`).
    pub heartbeat_interval: Duration,
    /// A node that sends nothing for this many intervals is dropped.
    pub missed_heartbeats: u32,
    /// How long a new stream may take to say hello.
    pub hello_timeout: Duration,
}

impl Default for ExecutorOptions {
    fn default() -> Self {
        Self {
            instance_id: "sundial".into(),
            heartbeat_interval: Duration::from_secs(5),
            missed_heartbeats: 3,
            hello_timeout: Duration::from_secs(10),
        }
    }
}

impl ExecutorOptions {
    /// How long a node stays registered (and a lease would last) without a heartbeat.
    pub fn node_ttl(&self) -> Duration {
        self.heartbeat_interval * self.missed_heartbeats.max(1)
    }
}

const MAX_HANDLERS: usize = 256;

/// `ExecutorService` and `NodeService` over the store's registry.
#[derive(Clone)]
pub struct Executors {
    store: Arc<dyn Store>,
    opts: ExecutorOptions,
    shutdown: CancellationToken,
}

impl Executors {
    pub fn new(store: Arc<dyn Store>, opts: ExecutorOptions, shutdown: CancellationToken) -> Self {
        Self {
            store,
            opts,
            shutdown,
        }
    }
}

fn now_ms() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as Millis)
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Validates a hello into the node it registers.
fn node_from_hello(h: pb::Hello, instance: &str) -> Result<NodeRecord, Status> {
    let invalid =
        |field: &str, reason: &str| Status::invalid_argument(format!("hello.{field}: {reason}"));
    if !valid_job_id(&h.node_id) {
        return Err(invalid(
            "node_id",
            "required, must match [A-Za-z0-9._-]{1,128}",
        ));
    }
    if !valid_job_id(&h.group) {
        return Err(invalid(
            "group",
            "required, must match [A-Za-z0-9._-]{1,128}",
        ));
    }
    if h.handlers.is_empty() {
        return Err(invalid("handlers", "at least one handler is required"));
    }
    if h.handlers.len() > MAX_HANDLERS {
        return Err(invalid("handlers", "more than 256 handlers"));
    }
    if h.handlers.iter().any(|x| x.is_empty() || x.len() > 128) {
        return Err(invalid(
            "handlers",
            "each handler name must be 1 to 128 bytes",
        ));
    }
    Ok(NodeRecord {
        node_id: h.node_id,
        group: h.group,
        handlers: h.handlers,
        weight: h.weight.max(1),
        max_concurrency: h.max_concurrency,
        labels: h.labels.into_iter().collect(),
        instance: instance.to_owned(),
        ready: true,
        active: 0,
        load: 0.0,
        connected_at: now_ms(),
        last_heartbeat: 0,
    })
}

fn out(msg: Out) -> Result<pb::ServerMessage, Status> {
    Ok(pb::ServerMessage { msg: Some(msg) })
}

type ConnectStream = Pin<Box<dyn Stream<Item = Result<pb::ServerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl ExecutorService for Executors {
    type ConnectStream = ConnectStream;

    async fn connect(
        &self,
        req: Request<Streaming<pb::ExecutorMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let mut inbound = req.into_inner();
        let first = tokio::time::timeout(self.opts.hello_timeout, inbound.message())
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "hello: not received within {:?}",
                    self.opts.hello_timeout
                ))
            })??;
        let hello = match first.and_then(|m| m.msg) {
            Some(Msg::Hello(h)) => h,
            Some(_) => {
                return Err(Status::failed_precondition(
                    "hello: the first message on the stream must be hello",
                ));
            }
            None => return Err(Status::invalid_argument("hello: no message")),
        };
        let in_flight = hello.in_flight.clone();
        let node = node_from_hello(hello, &self.opts.instance_id)?;
        self.store
            .upsert_node(node.clone(), self.opts.node_ttl())
            .await?;
        info!(node_id = %node.node_id, group = %node.group, handlers = ?node.handlers, "executor connected");
        let (tx, rx) = mpsc::channel(64);
        let welcome = pb::Welcome {
            server_instance: self.opts.instance_id.clone(),
            heartbeat_interval_ms: ms(self.opts.heartbeat_interval),
            lease_ttl_ms: ms(self.opts.node_ttl()),
            // Nothing is leased to anyone yet, so whatever it still holds is unknown.
            unknown_in_flight: in_flight,
        };
        tx.send(out(Out::Welcome(welcome)))
            .await
            .map_err(|_| Status::cancelled("executor left"))?;
        let span = info_span!("executor", node_id = %node.node_id);
        tokio::spawn(self.clone().session(node, inbound, tx).instrument(span));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

impl Executors {
    /// Serves one stream after the handshake until it ends, goes silent, misbehaves or
    /// the server shuts down; then takes the node out of the registry.
    async fn session(
        self,
        mut node: NodeRecord,
        mut inbound: Streaming<pb::ExecutorMessage>,
        tx: mpsc::Sender<Result<pb::ServerMessage, Status>>,
    ) {
        let silence = self.opts.node_ttl();
        loop {
            let next = tokio::select! {
                () = self.shutdown.cancelled() => {
                    let _ = tx.send(out(Out::GoAway(pb::GoAway {
                        reason: "server shutting down".into(),
                        endpoints: Vec::new(),
                    }))).await;
                    break;
                }
                () = tx.closed() => break,
                m = tokio::time::timeout(silence, inbound.message()) => m,
            };
            let msg = match next {
                Err(_) => {
                    warn!(?silence, "executor silent; closing its stream");
                    let _ = tx
                        .send(Err(Status::deadline_exceeded(format!(
                            "heartbeat: none within {silence:?}"
                        ))))
                        .await;
                    break;
                }
                Ok(Err(status)) => {
                    // A message that could not be read (too large, undecodable) ends
                    // the stream; say why, in case the executor is still listening.
                    debug!(%status, "executor stream failed");
                    let _ = tx.send(Err(status)).await;
                    break;
                }
                Ok(Ok(None)) => break,
                Ok(Ok(Some(m))) => m,
            };
            match self.handle(&mut node, msg).await {
                Ok(replies) => {
                    for r in replies {
                        if tx.send(out(r)).await.is_err() {
                            break;
                        }
                    }
                }
                Err(status) => {
                    warn!(%status, "executor protocol error; closing its stream");
                    let _ = tx.send(Err(status)).await;
                    break;
                }
            }
        }
        match self
            .store
            .remove_node(&node.node_id, &self.opts.instance_id)
            .await
        {
            Ok(_) => info!("executor disconnected"),
            Err(e) => warn!(error = %e, "could not unregister the executor; it expires by itself"),
        }
    }

    /// One message after the handshake: the replies to send, or the status that ends
    /// the stream.
    async fn handle(
        &self,
        node: &mut NodeRecord,
        msg: pb::ExecutorMessage,
    ) -> Result<Vec<Out>, Status> {
        let run_ref = |r: Option<pb::RunRef>, what: &str| {
            r.filter(|r| !r.schedule_id.is_empty())
                .ok_or_else(|| Status::invalid_argument(format!("{what}.run: required")))
        };
        match msg.msg {
            None => Err(Status::invalid_argument("message: empty")),
            Some(Msg::Hello(_)) => Err(Status::failed_precondition(
                "hello: sent twice on one stream",
            )),
            Some(Msg::Heartbeat(hb)) => {
                node.ready = hb.ready;
                node.active = hb.active;
                node.load = if hb.load.is_finite() { hb.load } else { 0.0 };
                self.store
                    .upsert_node(node.clone(), self.opts.node_ttl())
                    .await
                    .map_err(Status::from)?;
                let leases = hb
                    .in_flight
                    .into_iter()
                    .map(|run| pb::LeaseStatus {
                        run: Some(run),
                        remaining_ms: 0,
                    })
                    .collect();
                Ok(vec![Out::HeartbeatAck(pb::HeartbeatAck { leases })])
            }
            Some(Msg::Result(r)) => {
                let run = run_ref(r.run, "result")?;
                Ok(vec![Out::ResultAck(pb::ResultAck {
                    run: Some(run),
                    accepted: false,
                    reason: "unknown run: no lease is held for this schedule_id and token".into(),
                })])
            }
            Some(Msg::Started(s)) => {
                let run = run_ref(s.run, "started")?;
                Ok(vec![Out::Cancel(pb::Cancel {
                    run: Some(run),
                    reason: "no lease is held for this run".into(),
                })])
            }
            Some(Msg::Progress(p)) => {
                run_ref(p.run, "progress")?;
                Ok(Vec::new())
            }
            Some(Msg::Logs(l)) => {
                run_ref(l.run, "logs")?;
                Ok(Vec::new())
            }
            Some(Msg::Reject(r)) => {
                run_ref(r.run, "reject")?;
                Ok(Vec::new())
            }
        }
    }
}

#[tonic::async_trait]
impl NodeService for Executors {
    async fn list_nodes(
        &self,
        req: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        let group = req.into_inner().group;
        if !group.is_empty() && !valid_job_id(&group) {
            return Err(Status::invalid_argument(
                "group: must match [A-Za-z0-9._-]{1,128}",
            ));
        }
        let nodes = self
            .store
            .list_nodes((!group.is_empty()).then_some(group.as_str()))
            .await?;
        Ok(Response::new(pb::ListNodesResponse {
            nodes: nodes
                .into_iter()
                .map(|n| pb::Node {
                    health: if n.ready {
                        pb::NodeHealth::Healthy
                    } else {
                        pb::NodeHealth::NotReady
                    } as i32,
                    node_id: n.node_id,
                    group: n.group,
                    handlers: n.handlers,
                    weight: n.weight,
                    max_concurrency: n.max_concurrency,
                    active: n.active,
                    // No run has been dispatched to anyone yet: no failures observed.
                    success_rate: 1.0,
                    mean_duration_ms: 0,
                    server_instance: n.instance,
                    last_heartbeat_ms: n.last_heartbeat,
                    labels: n.labels.into_iter().collect(),
                })
                .collect(),
        }))
    }
}
