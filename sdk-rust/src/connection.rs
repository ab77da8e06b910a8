//! The stream to one server, and where to dial next. Opening a [`Session`] is connect,
//! `Hello`, then waiting for `Welcome`; a session sends without ever blocking (so a
//! stalled server cannot stall the executor loop) and remembers when each heartbeat
//! went out, so that a lease renewal counts from then. The [`Dialer`] walks the
//! endpoints in turn, tries a go-away's suggested endpoints first, and backs off with
//! jitter after failures and go-aways. Nothing here knows about runs.
//!
//! An `https://` endpoint is dialled over TLS (rustls), trusting the webpki roots
//! plus any CA the builder was given; an `http://` one in plaintext.

use std::collections::VecDeque;
use std::time::Duration;

use sundial_proto::v1 as pb;
use sundial_proto::v1::executor_message::Msg;
use sundial_proto::v1::executor_service_client::ExecutorServiceClient;
use sundial_proto::v1::server_message::Msg as In;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a server may take to answer `Hello`.
const WELCOME_TIMEOUT: Duration = Duration::from_secs(10);
/// Heartbeat send times kept for matching acknowledgements; a server that stops
/// acknowledging cannot grow this without bound.
const MAX_UNACKED_HEARTBEATS: usize = 64;

/// The stream ended under our feet: the session is over.
#[derive(Debug)]
pub(crate) struct Closed;

/// One open, welcomed stream.
pub(crate) struct Session {
    pub endpoint: String,
    pub welcome: pb::Welcome,
    tx: mpsc::UnboundedSender<pb::ExecutorMessage>,
    inbound: tonic::Streaming<pb::ServerMessage>,
    /// Send times of heartbeats not yet acknowledged, oldest first. The server answers
    /// each heartbeat in order, and an answer's remaining lease time counts from when
    /// its heartbeat left, not from when the answer arrived: the deadline errs early.
    heartbeats: VecDeque<Instant>,
    /// Keeps the connection's handle for as long as the stream lives.
    _channel: Channel,
}

/// What an `https://` endpoint is dialled with.
#[derive(Clone, Default)]
pub(crate) struct ClientTls {
    /// Extra trusted CAs (PEM), for servers with certificates from a private CA.
    pub ca_pem: Option<Vec<u8>>,
    /// A client certificate chain and its key (PEM), for servers that ask for one.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca_pem", &self.ca_pem.is_some())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

impl ClientTls {
    fn config(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new().with_webpki_roots();
        if let Some(ca) = &self.ca_pem {
            config = config.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        config
    }
}

/// Connects to `endpoint`, says hello, and waits for the welcome.
pub(crate) async fn open(
    endpoint: &str,
    hello: pb::Hello,
    tls: &ClientTls,
) -> Result<Session, String> {
    let mut dial =
        Endpoint::from_shared(endpoint.to_owned()).map_err(|e| format!("bad endpoint: {e}"))?;
    if endpoint.starts_with("https://") {
        dial = dial
            .tls_config(tls.config())
            .map_err(|e| format!("tls: {e}"))?;
    }
    let channel = dial
        .connect_timeout(CONNECT_TIMEOUT)
        // Small messages (Started, Result) go out at once, not after a delayed ACK.
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(message(Msg::Hello(hello)))
        .map_err(|_| "stream closed".to_owned())?;
    let mut client = ExecutorServiceClient::new(channel.clone());
    let welcome = async {
        let mut inbound = client
            .connect(UnboundedReceiverStream::new(rx))
            .await
            .map_err(|status| format!("hello refused: {status}"))?
            .into_inner();
        match inbound.message().await {
            Ok(Some(pb::ServerMessage {
                msg: Some(In::Welcome(w)),
            })) => Ok((inbound, w)),
            Ok(other) => Err(format!("expected welcome, got {other:?}")),
            Err(status) => Err(format!("hello refused: {status}")),
        }
    };
    let (inbound, welcome) = tokio::time::timeout(WELCOME_TIMEOUT, welcome)
        .await
        .map_err(|_| format!("no welcome within {WELCOME_TIMEOUT:?}"))??;
    Ok(Session {
        endpoint: endpoint.to_owned(),
        welcome,
        tx,
        inbound,
        heartbeats: VecDeque::new(),
        _channel: channel,
    })
}

fn message(m: Msg) -> pb::ExecutorMessage {
    pb::ExecutorMessage { msg: Some(m) }
}

impl Session {
    /// Queues a message; it never waits.
    pub fn send(&self, m: Msg) -> Result<(), Closed> {
        self.tx.send(message(m)).map_err(|_| Closed)
    }

    pub fn heartbeat(&mut self, hb: pb::Heartbeat, now: Instant) -> Result<(), Closed> {
        self.send(Msg::Heartbeat(hb))?;
        if self.heartbeats.len() == MAX_UNACKED_HEARTBEATS {
            self.heartbeats.pop_front();
        }
        self.heartbeats.push_back(now);
        Ok(())
    }

    /// A heartbeat acknowledgement arrived: when its heartbeat was sent (`now` if the
    /// server acknowledged more than we sent).
    pub fn heartbeat_acked(&mut self, now: Instant) -> Instant {
        self.heartbeats.pop_front().unwrap_or(now)
    }

    /// The next server message: `Ok(None)` for an empty one (ignored), `Err` once the
    /// stream is over.
    pub async fn recv(&mut self) -> Result<Option<In>, String> {
        match self.inbound.message().await {
            Ok(Some(m)) => Ok(m.msg),
            Ok(None) => Err("server closed the stream".into()),
            Err(status) => Err(format!("stream failed: {status}")),
        }
    }
}

/// Where to connect next, and how long to wait first.
#[derive(Debug)]
pub(crate) struct Dialer {
    endpoints: Vec<String>,
    next: usize,
    /// Endpoints a go-away suggested, tried before resuming the rotation.
    suggested: VecDeque<String>,
    backoff: Duration,
    min: Duration,
    max: Duration,
}

impl Dialer {
    /// `endpoints` must not be empty (the builder checks).
    pub fn new(endpoints: Vec<String>, min: Duration, max: Duration) -> Self {
        Self {
            endpoints,
            next: 0,
            suggested: VecDeque::new(),
            backoff: min,
            min,
            max: max.max(min),
        }
    }

    pub fn next_endpoint(&mut self) -> String {
        if let Some(e) = self.suggested.pop_front() {
            return e;
        }
        let e = self.endpoints[self.next % self.endpoints.len()].clone();
        self.next = self.next.wrapping_add(1);
        e
    }

    /// The server at `from` sent go-away: reconnect to one it suggested if any (a bare
    /// `host:port` takes the scheme of `from`, `http` or `https`), else to the next
    /// one, after the returned wait: the backoff starts over (the session was
    /// welcomed), jittered, so executors leaving a draining server neither storm it
    /// nor all arrive at the next one at once.
    pub fn went_away(&mut self, from: &str, suggested: Vec<String>) -> Duration {
        self.backoff = self.min;
        let wait = self.step();
        let scheme = if from.starts_with("https://") {
            "https"
        } else {
            "http"
        };
        self.suggested = suggested
            .into_iter()
            .filter(|e| !e.is_empty())
            .map(|e| {
                if e.contains("://") {
                    e
                } else {
                    format!("{scheme}://{e}")
                }
            })
            .filter(|e| e != from)
            .collect();
        wait
    }

    /// A connection failed or broke: how long to wait before the next attempt. A
    /// session that had been welcomed starts the backoff over.
    pub fn lost(&mut self, welcomed: bool) -> Duration {
        if welcomed {
            self.backoff = self.min;
        }
        self.step()
    }

    /// The current backoff, jittered; the next one doubles it up to the cap.
    fn step(&mut self) -> Duration {
        let wait = jitter(self.backoff);
        self.backoff = (self.backoff * 2).min(self.max);
        wait
    }
}

/// Full jitter in [d/2, d].
fn jitter(d: Duration) -> Duration {
    let half = d / 2;
    half + half.mul_f64(rand::random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn dialer() -> Dialer {
        Dialer::new(
            vec!["http://a".into(), "http://b".into()],
            100 * MS,
            800 * MS,
        )
    }

    #[test]
    fn endpoints_rotate_and_go_away_suggestions_come_first() {
        let mut d = dialer();
        let seq: Vec<_> = (0..3).map(|_| d.next_endpoint()).collect();
        assert_eq!(seq, ["http://a", "http://b", "http://a"]);
        d.went_away(
            "http://a",
            vec![
                "c:1".into(),
                "http://a".into(),
                String::new(),
                "https://d".into(),
            ],
        );
        let seq: Vec<_> = (0..3).map(|_| d.next_endpoint()).collect();
        assert_eq!(seq, ["http://c:1", "https://d", "http://b"]);
        d.went_away("https://b", vec!["e:2".into()]);
        assert_eq!(d.next_endpoint(), "https://e:2");
    }

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_cap_and_resets_after_a_welcome() {
        let mut d = dialer();
        for expected in [100, 200, 400, 800, 800] {
            let wait = d.lost(false);
            assert!(
                wait >= expected / 2 * MS && wait <= expected * MS,
                "{wait:?} outside [{}, {expected}] ms",
                expected / 2
            );
        }
        assert!(d.lost(true) <= 100 * MS);
        d.lost(false);
        // A go-away starts the backoff over and waits too; a refused reconnect after
        // it waits twice as long.
        let wait = d.went_away("http://a", Vec::new());
        assert!(wait >= 50 * MS && wait <= 100 * MS, "{wait:?}");
        let wait = d.lost(false);
        assert!(wait >= 100 * MS && wait <= 200 * MS, "{wait:?}");
    }
}
