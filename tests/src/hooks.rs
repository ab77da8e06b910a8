//! A run-webhook receiver for tests and benchmarks: listens on a free local port and
//! keeps every delivery that verifies by both signature schemes (each scheme with its
//! own replay cache), by schedule_id in arrival order; a delivery that fails a check
//! (signature, timestamp, replay, or a body that is not a run's webhook) is answered
//! 401 and counted.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Result;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use sundial_sdk::webhook::{MemoryNonceCache, Secret, Verifier};
use tokio_util::sync::CancellationToken;

/// One verified delivery: when it arrived and what its body says of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hook {
    pub arrived_ms: i64,
    pub scheduled_at_ms: i64,
    pub finished_at_ms: i64,
    pub status: String,
    pub attempt: i64,
}

/// What the receiver got.
#[derive(Debug, Default)]
pub struct Inbox {
    /// Verified deliveries by schedule_id, in arrival order.
    pub by_run: HashMap<String, Vec<Hook>>,
    /// Deliveries that failed a check (answered 401).
    pub refused: usize,
}

impl Inbox {
    /// Verified deliveries of runs already delivered (at least once allows them).
    pub fn redelivered(&self) -> usize {
        self.by_run
            .values()
            .map(|h| h.len().saturating_sub(1))
            .sum()
    }
}

#[derive(Clone)]
struct Checks {
    classic: Verifier,
    standard: Verifier,
    inbox: Arc<Mutex<Inbox>>,
}

pub struct SignedReceiver {
    addr: SocketAddr,
    inbox: Arc<Mutex<Inbox>>,
    stop: CancellationToken,
}

impl SignedReceiver {
    /// Listens on a free local port; accepts what both schemes verify with `secret`,
    /// each remembering up to `nonces` deliveries against replays.
    pub async fn start(secret: &Secret, nonces: usize) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let inbox = Arc::new(Mutex::new(Inbox::default()));
        let verifier = || Verifier::new(secret.clone()).nonce_cache(MemoryNonceCache::new(nonces));
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

    /// The `callback_url` to give jobs.
    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    pub fn read<T>(&self, f: impl FnOnce(&Inbox) -> T) -> T {
        f(&self.inbox.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Drop for SignedReceiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn hook(State(checks): State<Checks>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let arrived_ms = crate::now_ms();
    let verified = checks.classic.verify_classic(&headers, &body).is_ok()
        && checks.standard.verify_standard(&headers, &body).is_ok();
    let parsed = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| {
            let int = |name: &str| v.get(name)?.as_i64();
            Some((
                v.get("schedule_id")?.as_str()?.to_owned(),
                Hook {
                    arrived_ms,
                    scheduled_at_ms: int("scheduled_at_ms")?,
                    finished_at_ms: int("finished_at_ms")?,
                    status: v.get("status")?.as_str()?.to_owned(),
                    attempt: int("attempt")?,
                },
            ))
        });
    let mut inbox = checks.inbox.lock().unwrap_or_else(PoisonError::into_inner);
    match parsed {
        Some((sid, h)) if verified => {
            inbox.by_run.entry(sid).or_default().push(h);
            StatusCode::OK
        }
        _ => {
            inbox.refused += 1;
            StatusCode::UNAUTHORIZED
        }
    }
}
