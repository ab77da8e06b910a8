//! A Sundial webhook receiver: verifies every POST with `sundial_sdk::webhook`, answers
//! 401 when the signature does not hold, and processes each schedule_id once.
//!
//! The server retries a delivery until it gets a 2xx, and a run's result can arrive
//! more than once (a lost response, a retry racing a slow first attempt). The
//! `webhook-id` header, the run's schedule_id, is the same on every copy: dedupe on it
//! and answer 200 for a duplicate, so the server stops retrying. With a database the
//! dedupe is a unique index, in the same transaction as the work:
//!
//! ```sql
//! CREATE UNIQUE INDEX results_schedule_id ON results (schedule_id);
//!
//! INSERT INTO results (schedule_id, body) VALUES ($1, $2)
//!     ON CONFLICT (schedule_id) DO NOTHING;
//! -- 0 rows inserted: a duplicate. Commit nothing else and answer 200.
//! ```
//!
//! Here an in-memory set stands in for that table.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use clap::Parser;
use sundial_sdk::webhook::{MemoryNonceCache, Secret, Verifier};

#[derive(Parser)]
#[command(about = "Receives and verifies Sundial result webhooks")]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "SUNDIAL_WEBHOOK_LISTEN", default_value = "127.0.0.1:8080")]
    listen: String,
    // Secrets are parsed in `main`, not by clap, whose errors would echo the value.
    /// The endpoint's secret, `whsec_…`.
    #[arg(long, env = "SUNDIAL_WEBHOOK_SECRET", hide_env_values = true)]
    secret: String,
    /// While a secret is rotated: the other one, also accepted.
    #[arg(long, env = "SUNDIAL_WEBHOOK_PREVIOUS_SECRET", hide_env_values = true)]
    previous_secret: Option<String>,
}

struct Receiver {
    verifier: Verifier,
    /// Schedule ids already processed: the `results` table of the module docs.
    processed: Mutex<HashSet<String>>,
}

async fn receive(State(rx): State<Arc<Receiver>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    // The server sends both header schemes; the standard one also signs webhook-id,
    // the key we dedupe on.
    let verified = match rx.verifier.verify_standard(&headers, &body) {
        Ok(verified) => verified,
        Err(e) => {
            tracing::warn!("refused: {e}");
            return StatusCode::UNAUTHORIZED;
        }
    };
    let Some(schedule_id) = verified.id else {
        return StatusCode::UNAUTHORIZED;
    };
    let first = rx
        .processed
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(schedule_id.clone());
    if !first {
        tracing::info!("{schedule_id}: duplicate, already processed");
        return StatusCode::OK;
    }
    // The work: here, only a log line.
    tracing::info!("{schedule_id}: {}", String::from_utf8_lossy(&body));
    StatusCode::OK
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();

    let parse = |name: &str, text: &str| text.parse::<Secret>().map_err(|e| format!("{name}: {e}"));
    let mut verifier = Verifier::new(parse("SUNDIAL_WEBHOOK_SECRET", &args.secret)?)
        .nonce_cache(MemoryNonceCache::default());
    if let Some(previous) = &args.previous_secret {
        verifier = verifier.also_accept(parse("SUNDIAL_WEBHOOK_PREVIOUS_SECRET", previous)?);
    }
    let receiver = Arc::new(Receiver {
        verifier,
        processed: Mutex::new(HashSet::new()),
    });
    let app = Router::new()
        .route("/", post(receive))
        .route("/{*path}", post(receive))
        .with_state(receiver);

    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    tracing::info!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
