//! Links to executors: which node's stream is attached to this instance, and delivery
//! of a server message to a node wherever it is attached.
//!
//! A node attached here gets the message on its stream directly; a node attached to
//! another instance gets it through that instance's inbox in the store, which this
//! module also drains for its own nodes. Sending never waits: a message for another
//! instance joins its instance's queue here, and one push (`run_forwards`) takes what
//! queued while the previous one was on its way. Delivery is best effort on purpose: a
//! lost dispatch is never confirmed and the sweeper re-routes it, a lost cancel is
//! repeated by the next heartbeat acknowledgement (the lease is gone), so nothing here
//! needs to be durable.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message as _;
use sundial_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::dispatch::messages;
use crate::dispatch::silence::Liveness;
use crate::metrics::Metrics;
use crate::model::{JobRecord, RunRecord};
use crate::store::{Inboxes, NodeRecord, Revocation};

/// The sending half of an executor's stream.
pub type StreamSender = mpsc::Sender<Outgoing>;

/// One item for an executor's stream, boxed: a channel allocates its slots 32 at a
/// time, and an unboxed item is about 200 bytes, so each idle stream held some 6 KiB of
/// empty slots.
pub type Outgoing = Box<Result<pb::ServerMessage, tonic::Status>>;

struct Link {
    conn: u64,
    tx: StreamSender,
    /// A `Drain` went down this stream: the node reports draining from now on.
    draining: bool,
    /// The dispatches and cancels sent down it are noted here, for the silence rule
    /// and the node's health window.
    liveness: Arc<Liveness>,
}

/// Messages for other instances' inboxes, not pushed yet: each instance's in the order
/// sent.
#[derive(Default)]
struct Forwards {
    waiting: Mutex<HashMap<String, Vec<Vec<u8>>>>,
    queued: tokio::sync::Notify,
}

/// At most this many messages wait for one instance's inbox (while the store is slow
/// or down); past it a message is dropped, as a failed push drops its messages.
const MAX_FORWARDS_WAITING: usize = 16_384;

pub struct Links {
    store: Arc<dyn Inboxes>,
    instance: String,
    local: Mutex<HashMap<String, Link>>,
    next_conn: std::sync::atomic::AtomicU64,
    forwards: Forwards,
    metrics: Arc<Metrics>,
}

impl Links {
    pub fn new(store: Arc<dyn Inboxes>, instance: String, metrics: Arc<Metrics>) -> Self {
        Self {
            store,
            instance,
            metrics,
            local: Mutex::new(HashMap::new()),
            next_conn: std::sync::atomic::AtomicU64::new(1),
            forwards: Forwards::default(),
        }
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Attaches a node's stream here (replacing an older stream of the same node),
    /// noting each dispatch sent down it in `liveness`; returns the connection number
    /// to detach with.
    pub fn attach(&self, node_id: &str, tx: StreamSender, liveness: Arc<Liveness>) -> u64 {
        let conn = self
            .next_conn
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.map().insert(
            node_id.to_owned(),
            Link {
                conn,
                tx,
                draining: false,
                liveness,
            },
        );
        conn
    }

    /// Detaches the node unless a newer stream of it replaced `conn`.
    pub fn detach(&self, node_id: &str, conn: u64) {
        let mut map = self.map();
        if map.get(node_id).is_some_and(|l| l.conn == conn) {
            map.remove(node_id);
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Link>> {
        crate::dispatch::lock(&self.local)
    }

    /// How many executor streams are attached here.
    pub fn attached(&self) -> usize {
        self.map().len()
    }

    /// Whether a `Drain` was sent down the node's stream attached here.
    pub fn draining(&self, node_id: &str) -> bool {
        self.map().get(node_id).is_some_and(|l| l.draining)
    }

    /// Sends on the node's stream if it is attached here (a `Drain` also marks it
    /// draining, an `Undrain` no longer); gives the message back if it is not.
    fn send_local(
        &self,
        node_id: &str,
        msg: pb::server_message::Msg,
    ) -> Option<pb::server_message::Msg> {
        let tx = {
            let mut map = self.map();
            let Some(link) = map.get_mut(node_id) else {
                return Some(msg);
            };
            match &msg {
                pb::server_message::Msg::Drain(_) => link.draining = true,
                pb::server_message::Msg::Undrain(_) => link.draining = false,
                pb::server_message::Msg::Dispatch(pb::Dispatch {
                    run: Some(run),
                    handler,
                    ..
                }) => link.liveness.sent(run, handler, std::time::Instant::now()),
                pb::server_message::Msg::Cancel(pb::Cancel {
                    run: Some(run),
                    reason,
                }) => link.liveness.cancelled(run, reason),
                _ => {}
            }
            link.tx.clone()
        };
        Self::send_on(&tx, node_id, msg);
        None
    }

    /// Sends on a local stream; a message for a stream that is full or gone is dropped.
    fn send_on(tx: &StreamSender, node_id: &str, msg: pb::server_message::Msg) {
        if tx
            .try_send(Box::new(Ok(pb::ServerMessage { msg: Some(msg) })))
            .is_err()
        {
            debug!(%node_id, "the node's stream is full or closed; message dropped");
        }
    }

    /// Sends the dispatch of `run`, leased to `node` (see `messages::dispatch`), on its
    /// stream here or through its instance's inbox: no await.
    pub fn dispatch(&self, node: &NodeRecord, run: &RunRecord, job: &JobRecord, route_key: &str) {
        let msg = messages::dispatch(run, job, route_key);
        self.deliver(&node.node_id, &node.instance, msg);
    }

    /// Tells `rv.node_id`, attached to `instance` as far as the caller knows, to stop
    /// the run of the revoked lease `rv`.
    pub fn cancel(&self, rv: &Revocation, instance: &str) {
        self.deliver(&rv.node_id, instance, messages::cancel(rv));
    }

    /// Delivers to `node_id`, attached to `instance` as far as the caller knows: on its
    /// stream when it is attached here, else queued for `instance`'s inbox.
    pub fn deliver(&self, node_id: &str, instance: &str, msg: pb::server_message::Msg) {
        let Some(msg) = self.send_local(node_id, msg) else {
            return;
        };
        if instance.is_empty() || instance == self.instance {
            debug!(%node_id, "node not attached here; message dropped");
            return;
        }
        let mut bytes = Vec::with_capacity(node_id.len() + 64);
        bytes.extend_from_slice(node_id.as_bytes());
        bytes.push(b'\n');
        pb::ServerMessage { msg: Some(msg) }.encode(&mut bytes).ok();
        {
            let mut waiting = crate::dispatch::lock(&self.forwards.waiting);
            let queue = waiting.entry(instance.to_owned()).or_default();
            if queue.len() >= MAX_FORWARDS_WAITING {
                drop(waiting);
                debug!(%node_id, %instance, "too many messages wait for the instance's inbox; dropped");
                self.metrics.forwarded("dropped", 1);
                return;
            }
            queue.push(bytes);
        }
        self.forwards.queued.notify_one();
    }

    /// Pushes the messages queued for other instances' inboxes (`deliver`), each
    /// instance's in one store call, until `shutdown`; then what is still queued, once.
    pub async fn run_forwards(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = self.forwards.queued.notified() => {}
            }
            self.push_forwards().await;
        }
        self.push_forwards().await;
    }

    /// One push per instance of what waits for it, the instances side by side; a
    /// failed push drops its messages (best effort, see the module's doc).
    async fn push_forwards(&self) {
        let waiting = std::mem::take(&mut *crate::dispatch::lock(&self.forwards.waiting));
        let pushes = waiting.into_iter().map(|(instance, messages)| async move {
            let n = messages.len();
            match self.store.push_inbox(&instance, messages).await {
                Ok(()) => self.metrics.forwarded("pushed", n),
                Err(e) => {
                    warn!(%instance, messages = n, error = %e, "could not forward messages to another instance");
                    self.metrics.forwarded("dropped", n);
                }
            }
        });
        futures::future::join_all(pushes).await;
    }

    /// Drains this instance's inbox into the local streams until `shutdown`.
    pub async fn run_inbox(self: Arc<Self>, block: Duration, shutdown: CancellationToken) {
        info!(instance = %self.instance, "inbox started");
        let mut backoff = Duration::from_millis(50);
        while !shutdown.is_cancelled() {
            let got = tokio::select! {
                () = shutdown.cancelled() => break,
                r = self.store.pop_inbox(&self.instance, 256, block) => r,
            };
            match got {
                Ok(msgs) => {
                    backoff = Duration::from_millis(50);
                    for m in msgs {
                        self.deliver_forwarded(&m);
                    }
                }
                Err(e) => {
                    warn!(error = %e, "reading the inbox failed; retrying");
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
        info!("inbox stopped");
    }

    fn deliver_forwarded(&self, raw: &[u8]) {
        let Some(nl) = raw.iter().position(|&b| b == b'\n') else {
            warn!("malformed inbox message dropped");
            return;
        };
        let node_id = String::from_utf8_lossy(&raw[..nl]);
        match pb::ServerMessage::decode(&raw[nl + 1..]) {
            Ok(pb::ServerMessage { msg: Some(msg) }) => {
                if self.send_local(&node_id, msg).is_some() {
                    debug!(%node_id, "forwarded message for a node no longer attached here; dropped");
                }
            }
            _ => warn!("undecodable inbox message dropped"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::tests::sample;
    use crate::store::StoreOptions;
    use crate::store::embedded::EmbeddedStore;

    fn drain(node_id: &str) -> pb::server_message::Msg {
        pb::server_message::Msg::Drain(pb::Drain {
            reason: node_id.to_owned(),
        })
    }

    /// Which node each inbox message names, and the reason its drain says.
    fn read(raw: &[u8]) -> (String, String) {
        let nl = raw.iter().position(|&b| b == b'\n').expect("node id line");
        let msg = pb::ServerMessage::decode(&raw[nl + 1..]).expect("message");
        let Some(pb::server_message::Msg::Drain(d)) = msg.msg else {
            panic!("not a drain: {msg:?}");
        };
        (String::from_utf8_lossy(&raw[..nl]).into_owned(), d.reason)
    }

    /// Messages for nodes attached to other instances wait without a store call, go
    /// out each instance's in one push in the order sent, and what still waits when
    /// the loop stops is pushed before it ends; one for this instance's own node that
    /// is not attached, or for no instance, is dropped.
    #[tokio::test]
    async fn forwards_are_pushed_in_order_and_flushed_on_stop() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Arc::new(
            EmbeddedStore::open(&dir.path().join("s.redb"), StoreOptions::default()).expect("open"),
        );
        let metrics = Arc::new(Metrics::new());
        let links = Arc::new(Links::new(store.clone(), "me".into(), metrics.clone()));
        for (node, instance) in [
            ("n1", "b"),
            ("n2", "c"),
            ("n3", "b"),
            ("n4", "me"),
            ("n5", ""),
        ] {
            links.deliver(node, instance, drain(node));
        }
        // One past what may wait for an instance: dropped, and counted.
        for _ in 0..=MAX_FORWARDS_WAITING {
            links.deliver("n7", "d", drain("n7"));
        }
        let counted = |outcome: &str| {
            let name = format!("sundial_forwarded_messages_total{{outcome=\"{outcome}\"}}");
            sample(&metrics.render(), &name).map(|v| v as u64)
        };
        assert_eq!(counted("dropped"), Some(1));
        let pop = |instance: &'static str| {
            let store = store.clone();
            async move {
                store
                    .pop_inbox(instance, 10, Duration::ZERO)
                    .await
                    .expect("pop")
                    .iter()
                    .map(|m| read(m))
                    .collect::<Vec<_>>()
            }
        };
        assert!(
            pop("b").await.is_empty(),
            "nothing pushed before the loop runs"
        );
        let stop = CancellationToken::new();
        let forwarding = tokio::spawn(links.clone().run_forwards(stop.clone()));
        let pair = |n: &str| (n.to_owned(), n.to_owned());
        let b = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let got = pop("b").await;
                if !got.is_empty() {
                    return got;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("pushed");
        assert_eq!(b, vec![pair("n1"), pair("n3")]);
        assert_eq!(pop("c").await, vec![pair("n2")]);
        assert!(pop("me").await.is_empty());

        links.deliver("n6", "c", drain("n6"));
        stop.cancel();
        forwarding.await.expect("the loop ends");
        assert_eq!(pop("c").await, vec![pair("n6")], "flushed on stop");
        let waited = store
            .pop_inbox("d", MAX_FORWARDS_WAITING + 1, Duration::ZERO)
            .await
            .expect("pop");
        assert_eq!(waited.len(), MAX_FORWARDS_WAITING, "all that could wait");
        assert_eq!(
            counted("pushed"),
            Some(4 + MAX_FORWARDS_WAITING as u64),
            "n1, n2, n3, n6 and the ones for d"
        );
        assert_eq!(counted("dropped"), Some(1));
    }
}
