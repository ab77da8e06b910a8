//! HTTP targets: the server calls the job's URL itself, under the same state machine —
//! a 2xx is SUCCEEDED with the body as output, a 500 is retried as the next attempt,
//! a target slower than the timeout fails with `http_timeout`. Loopback is outside the
//! HTTP-target egress policy, so these servers allow-list it (`--http-target-allow`);
//! without that, a target on 127.0.0.1 fails with `egress_refused` and is never called.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Result, ensure};
use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use sundial_proto::v1 as pb;
use sundial_tests::{RedisServer, Sundial, SundialOptions, manual_http_job};

/// A receiver on a free port: `/ok` answers 200 with the schedule id it was called
/// for, `/flaky` answers 500 to its first call and 200 after, `/slow` takes 3 s.
async fn receiver() -> Result<(String, Arc<AtomicUsize>)> {
    let calls = Arc::new(AtomicUsize::new(0));
    let flaky_calls = calls.clone();
    let app = Router::new()
        .route(
            "/ok",
            post(|h: HeaderMap| async move {
                let sid = h
                    .get("x-sundial-schedule-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                (StatusCode::OK, format!("hello {sid}"))
            }),
        )
        .route(
            "/flaky",
            post(move || {
                let calls = flaky_calls.clone();
                async move {
                    if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                        (StatusCode::INTERNAL_SERVER_ERROR, "not yet")
                    } else {
                        (StatusCode::OK, "now")
                    }
                }
            }),
        )
        .route(
            "/slow",
            post(|| async {
                tokio::time::sleep(Duration::from_secs(3)).await;
                "late"
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((format!("http://{addr}"), calls))
}

async fn run_until_final(server: &Sundial, job_id: &str) -> Result<pb::Run> {
    let sid = server.trigger(job_id).await?;
    server.finished(&sid).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_targets_run_under_the_state_machine() -> Result<()> {
    let redis = RedisServer::start()?;
    let (base, flaky_calls) = receiver().await?;
    let server = Sundial::start(
        SundialOptions::redis(&redis)
            .arg("heartbeat-interval", "300ms")
            .arg("sweep-every", "50ms")
            .arg("http-target-allow", "127.0.0.1/32"),
    )?;
    let mut jobs = server.jobs().await?;
    jobs.create_job(pb::CreateJobRequest {
        spec: Some(manual_http_job("ok", &format!("{base}/ok"))),
    })
    .await?;
    let mut flaky = manual_http_job("flaky", &format!("{base}/flaky"));
    flaky.retry = Some(pb::RetryPolicy {
        max_retries: 1,
        backoff_ms: 100,
        ..Default::default()
    });
    jobs.create_job(pb::CreateJobRequest { spec: Some(flaky) })
        .await?;
    let mut slow = manual_http_job("slow", &format!("{base}/slow"));
    slow.timeout_ms = Some(500);
    jobs.create_job(pb::CreateJobRequest { spec: Some(slow) })
        .await?;

    let r = run_until_final(&server, "ok").await?;
    ensure!(r.state == pb::RunState::Succeeded as i32, "{r:?}");
    ensure!(
        r.output == format!("hello {}", r.schedule_id).into_bytes(),
        "{r:?}"
    );

    let r = run_until_final(&server, "flaky").await?;
    ensure!(
        r.state == pb::RunState::Succeeded as i32 && r.attempt == 2,
        "{r:?}"
    );
    ensure!(r.output == b"now" && flaky_calls.load(Ordering::SeqCst) == 2);

    let r = run_until_final(&server, "slow").await?;
    ensure!(
        r.state != pb::RunState::Succeeded as i32 && r.attempt == 1,
        "{r:?}"
    );
    ensure!(
        r.error_code == "http_timeout" || r.error_code == "timeout",
        "{r:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_targets_are_refused_without_the_allow_list() -> Result<()> {
    let redis = RedisServer::start()?;
    // A bare listener counting connections: refused means not even a TCP connect.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            counted.fetch_add(1, Ordering::SeqCst);
        }
    });
    let server = Sundial::start(
        SundialOptions::redis(&redis)
            .arg("heartbeat-interval", "300ms")
            .arg("sweep-every", "50ms"),
    )?;
    let mut jobs = server.jobs().await?;
    // An IP literal is refused when the job is created: it could never be reached. A
    // host name is checked by the resolver at send time, and the run fails at once.
    let err = jobs
        .create_job(pb::CreateJobRequest {
            spec: Some(manual_http_job(
                "literal",
                &format!("http://127.0.0.1:{port}/ok"),
            )),
        })
        .await
        .expect_err("a loopback literal");
    ensure!(
        err.code() == tonic::Code::InvalidArgument
            && err
                .message()
                .starts_with("spec.http.url: egress to 127.0.0.1 refused")
            && err.message().contains("loopback"),
        "{err:?}"
    );
    jobs.create_job(pb::CreateJobRequest {
        spec: Some(manual_http_job(
            "named",
            &format!("http://localhost:{port}/ok"),
        )),
    })
    .await?;

    let r = run_until_final(&server, "named").await?;
    ensure!(r.state == pb::RunState::Failed as i32, "{r:?}");
    ensure!(r.error_code == "egress_refused", "{r:?}");
    ensure!(
        r.error_message.contains("localhost") && r.error_message.contains("127.0.0.1"),
        "{r:?}"
    );

    ensure!(
        connections.load(Ordering::SeqCst) == 0,
        "the receiver was connected to"
    );
    Ok(())
}
