//! `GET /metrics` over real HTTP against a server with a real executor: run outcomes,
//! trigger lateness and connected executors are counted, a failed run raises an alert
//! (log line + counter), a lost lease is counted and alerted once, and the endpoint is
//! open while the API needs credentials.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use sundial_proto::v1 as pb;
use sundial_tests::{
    RedisServer, Sundial, SundialOptions, TestExecutor, every_second, metric_sample, wait_for,
};

const EXECUTOR: &str = env!("CARGO_BIN_EXE_test_executor");

async fn scrape(http: &reqwest::Client, base: &str) -> Result<String> {
    let resp = http.get(format!("{base}/metrics")).send().await?;
    ensure!(resp.status() == 200, "GET /metrics: {}", resp.status());
    let ct = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    ensure!(
        ct.starts_with("text/plain; version=0.0.4"),
        "content type {ct:?}"
    );
    Ok(resp.text().await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_outcomes_lateness_and_executors_and_a_failed_run_raises_an_alert()
-> Result<()> {
    let redis = RedisServer::start()?;
    let server = Sundial::start(
        SundialOptions::redis(&redis)
            .arg("heartbeat-interval", "300ms")
            .arg("sweep-every", "50ms")
            .arg("route-retry", "200ms"),
    )?;
    let base = format!("http://{}", server.http.context("no http address")?);
    let http = reqwest::Client::new();
    let dir = tempfile::tempdir()?;
    let endpoints = vec![format!("http://{}", server.grpc)];
    let _executor = TestExecutor::start(EXECUTOR, &endpoints, "x", &dir.path().join("x.log"))?;

    let mut jobs = server.jobs().await?;
    // Every second on the executor: on-time cron fires that succeed.
    let mut ticking = every_second("ticking");
    ticking.target = Some(pb::job_spec::Target::Executor(pb::ExecutorTarget {
        group: "g".into(),
        handler: "noop".into(),
    }));
    jobs.create_job(pb::CreateJobRequest {
        spec: Some(ticking),
    })
    .await?;
    // Triggered once, fails with no retries: a final FAILED and its alert.
    jobs.create_job(pb::CreateJobRequest {
        spec: Some(pb::JobSpec {
            id: "doomed".into(),
            cron: sundial_tests::MANUAL_ONLY.into(),
            target: Some(pb::job_spec::Target::Executor(pb::ExecutorTarget {
                group: "g".into(),
                handler: "fail".into(),
            })),
            ..Default::default()
        }),
    })
    .await?;
    let doomed = server.trigger("doomed").await?;
    let run = wait_for(
        "the doomed run to fail",
        Duration::from_secs(20),
        || async {
            let r = server.run(&doomed).await?;
            Ok((r.state == pb::RunState::Failed as i32).then_some(r))
        },
    )
    .await?;
    ensure!(run.error_code == "boom", "{run:?}");

    let text = wait_for(
        "a success, a failure and claimed fires in /metrics",
        Duration::from_secs(20),
        || async {
            let text = scrape(&http, &base).await?;
            let ok = metric_sample(&text, r#"sundial_runs_finished_total{state="SUCCEEDED"}"#)
                .is_some_and(|v| v >= 1.0)
                && metric_sample(&text, r#"sundial_runs_finished_total{state="FAILED"}"#)
                    .is_some_and(|v| v >= 1.0)
                && metric_sample(&text, "sundial_trigger_lateness_seconds_count")
                    .is_some_and(|v| v > 0.0);
            Ok(ok.then_some(text))
        },
    )
    .await?;
    ensure!(
        metric_sample(&text, "sundial_executors_connected") == Some(1.0),
        "{text}"
    );
    ensure!(
        metric_sample(&text, r#"sundial_executor_nodes{health="HEALTHY"}"#) == Some(1.0),
        "{text}"
    );
    ensure!(
        metric_sample(&text, r#"sundial_alerts_total{kind="run_failed"}"#)
            .is_some_and(|v| v >= 1.0),
        "{text}"
    );
    ensure!(
        text.contains("# TYPE sundial_trigger_lateness_seconds histogram")
            && text.contains(r#"sundial_trigger_lateness_seconds_bucket{le="0.001"}"#)
            && text.contains(r#"sundial_trigger_lateness_seconds_bucket{le="60"}"#),
        "{text}"
    );

    let doc: serde_json::Value = http
        .get(format!("{base}/api/v1/openapi.json"))
        .send()
        .await?
        .json()
        .await?;
    ensure!(
        doc["paths"]["/metrics"]["get"]["security"] == serde_json::json!([]),
        "the OpenAPI document describes /metrics as open"
    );

    // The alert is an error line with the stable `alert` field and the run's ids.
    let stderr = server.stderr();
    let alert = stderr
        .lines()
        .find(|l| l.contains("alert") && l.contains("run_failed") && l.contains(&doomed))
        .with_context(|| format!("no run_failed alert for {doomed} in:\n{stderr}"))?;
    ensure!(
        alert.contains("ERROR") && alert.contains("job_id=doomed"),
        "{alert}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_no_credentials_while_the_api_does() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let server =
        Sundial::start(SundialOptions::embedded(dir.path()).arg("bearer-token", "secret123"))?;
    let base = format!("http://{}", server.http.context("no http address")?);
    let http = reqwest::Client::new();
    let text = scrape(&http, &base).await?;
    ensure!(text.contains("sundial_runs_finished_total"), "{text}");
    let api = http
        .get(format!("{base}/api/v1/tasks/anything"))
        .send()
        .await?;
    ensure!(api.status() == 401, "API without a token: {}", api.status());
    let api = http
        .get(format!("{base}/api/v1/tasks/anything"))
        .bearer_auth("secret123")
        .send()
        .await?;
    ensure!(api.status() == 404, "API with the token: {}", api.status());
    Ok(())
}

/// A lost lease is one event: counted lost and retried once, and alerted once, however
/// often the sweeper wakes the retry while it waits for an executor (every
/// `route-retry`, 200 ms here, for about 3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_is_counted_and_alerted_once_however_long_its_retry_waits() -> Result<()> {
    let redis = RedisServer::start()?;
    let server = Sundial::start(
        SundialOptions::redis(&redis)
            .arg("sweep-every", "50ms")
            .arg("route-retry", "200ms")
            .arg("dispatch-wait", "60s"),
    )?;
    let base = format!("http://{}", server.http.context("no http address")?);
    let http = reqwest::Client::new();
    let dir = tempfile::tempdir()?;
    let endpoints = vec![format!("http://{}", server.grpc)];
    let mut jobs = server.jobs().await?;
    jobs.create_job(pb::CreateJobRequest {
        spec: Some(pb::JobSpec {
            payload: b"60000".to_vec(),
            retry: Some(pb::RetryPolicy {
                max_retries: 1,
                backoff_ms: 1,
                ..Default::default()
            }),
            ..sundial_tests::manual_job("lost", "sleep")
        }),
    })
    .await?;
    let mut doomed =
        TestExecutor::start(EXECUTOR, &endpoints, "doomed", &dir.path().join("d.log"))?;
    let sid = server.trigger("lost").await?;
    wait_for("the run to start", Duration::from_secs(15), || async {
        let r = server.run(&sid).await?;
        Ok((r.state == pb::RunState::Running as i32).then_some(()))
    })
    .await?;
    doomed.kill()?;
    wait_for("the retry", Duration::from_secs(15), || async {
        let r = server.run(&sid).await?;
        Ok((r.attempt == 2).then_some(()))
    })
    .await?;
    // No executor: the retry waits, woken every 200 ms.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let text = scrape(&http, &base).await?;
    let counted = |name: &str| metric_sample(&text, name).unwrap_or(0.0);
    ensure!(
        counted("sundial_runs_lost_total") == 1.0
            && counted("sundial_runs_retried_total") == 1.0
            && counted(r#"sundial_alerts_total{kind="run_lost"}"#) == 1.0,
        "one lost lease counted lost {}, retried {}, alerted {} times",
        counted("sundial_runs_lost_total"),
        counted("sundial_runs_retried_total"),
        counted(r#"sundial_alerts_total{kind="run_lost"}"#)
    );
    Ok(())
}
