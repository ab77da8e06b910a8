//! The alert webhook: a failed run raises `run_failed`, which the server POSTs to
//! `--alert-webhook-url`, signed like result webhooks — checked by a real HTTP receiver
//! in this process with `sundial_sdk::webhook::Verifier`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use serde_json::Value;
use sundial_proto::v1 as pb;
use sundial_sdk::webhook::{Secret, Verifier};
use sundial_tests::{RedisServer, Sundial, SundialOptions, wait_for};

type Hits = Arc<Mutex<Vec<(HeaderMap, Vec<u8>)>>>;

/// Serves `/alerts` (records every POST) and `/target` (always 500) on one port.
async fn receiver() -> Result<(String, Hits)> {
    let hits: Hits = Arc::default();
    let app = Router::new()
        .route(
            "/alerts",
            post(
                |State(h): State<Hits>, headers: HeaderMap, body: Bytes| async move {
                    h.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((headers, body.to_vec()));
                    "ok"
                },
            ),
        )
        .route(
            "/target",
            post(|| async { (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "down") }),
        )
        .with_state(hits.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((format!("http://{addr}"), hits))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_run_raises_a_signed_alert_webhook() -> Result<()> {
    let redis = RedisServer::start()?;
    let (base, hits) = receiver().await?;
    let secret = Secret::generate();
    let server = Sundial::start(
        SundialOptions::redis(&redis)
            .arg("instance-id", "alerting")
            .arg("sweep-every", "50ms")
            .arg("http-target-allow", "127.0.0.1/32")
            .arg("webhook-allow", "127.0.0.1/32")
            .arg("webhook-secret", &secret.to_string())
            .arg("alert-webhook-url", &format!("{base}/alerts")),
    )?;
    server
        .jobs()
        .await?
        .create_job(pb::CreateJobRequest {
            spec: Some(sundial_tests::manual_http_job(
                "doomed",
                &format!("{base}/target"),
            )),
        })
        .await?;
    let sid = server.trigger("doomed").await?;

    let (headers, body) = wait_for("the alert webhook", Duration::from_secs(20), || async {
        Ok(hits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|(_, b)| String::from_utf8_lossy(b).contains(&sid))
            .cloned())
    })
    .await?;
    let run = server.run(&sid).await?;
    ensure!(run.state == pb::RunState::Failed as i32, "{run:?}");

    let v = Verifier::new(secret.clone());
    let standard = v.verify_standard(&headers, &body).context("standard")?;
    v.verify_classic(&headers, &body).context("classic")?;
    ensure!(
        standard
            .id
            .as_deref()
            .is_some_and(|id| id.starts_with("alert-")),
        "{standard:?}"
    );
    ensure!(
        Verifier::new(Secret::generate())
            .verify_standard(&headers, &body)
            .is_err(),
        "any secret verifies"
    );
    let alert: Value = serde_json::from_slice(&body)?;
    ensure!(
        alert["alert"] == "run_failed"
            && alert["job_id"] == "doomed"
            && alert["schedule_id"] == sid.as_str()
            && alert["instance"] == "alerting"
            && alert["raised_at_ms"].as_i64().is_some_and(|t| t > 0),
        "{alert}"
    );
    // The secret signs; it is never written to the log (this server logs at info).
    let key = secret.to_string();
    ensure!(
        !server.stderr().contains(key.trim_start_matches("whsec_")),
        "the webhook secret appears in the server log"
    );
    ensure!(
        server.stderr().contains("run_failed"),
        "the log is not captured"
    );
    Ok(())
}
