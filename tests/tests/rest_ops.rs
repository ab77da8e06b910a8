//! Every operation of the REST edge over real HTTP, on both stores: each one's success
//! and a validation error, every answer (successes and failures) checked against the
//! server's OpenAPI document, and paging through 1,000 jobs with none missed or
//! repeated. The operations are the gRPC services' own (one code path), so these check
//! the HTTP side: routes, bodies, query parameters, statuses and the JSON mapping.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use base64::Engine as _;
use serde_json::{Value, json};
use sundial_server::testing::RedisServer;
use sundial_tests::rest::RestClient;
use sundial_tests::{Sundial, SundialOptions, TestExecutor, wait_for};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn spec(id: &str, handler: &str, payload: &[u8]) -> Value {
    json!({
        "id": id,
        // Once a year: the test's runs are the manual ones.
        "cron": "0 0 0 1 1 *",
        "executor": {"group": "g", "handler": handler},
        "payload": B64.encode(payload),
        "labels": {"team": "rest"},
    })
}

async fn client(server: &Sundial) -> Result<RestClient> {
    let base = server.http_url().context("no http address")?;
    RestClient::new(&base, None).await
}

/// The message of an error answer, after checking its code.
fn error(v: &Value, code: &str) -> Result<String> {
    ensure!(v["error"]["code"] == code, "expected {code}: {v}");
    Ok(v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned())
}

async fn every_operation(server: &Sundial, journal: &std::path::Path) -> Result<()> {
    let api = client(server).await?;

    // ---- apps
    let created = api
        .expect(
            201,
            "POST",
            "/api/v1/apps",
            Some(json!({"appId": "billing", "name": "Billing"})),
        )
        .await?;
    ensure!(created["app"]["appId"] == "billing", "{created}");
    ensure!(
        created["secret"]
            .as_str()
            .is_some_and(|s| s.starts_with("whsec_"))
    );
    let v = api
        .expect(
            409,
            "POST",
            "/api/v1/apps",
            Some(json!({"appId": "billing"})),
        )
        .await?;
    error(&v, "ALREADY_EXISTS")?;
    let v = api
        .expect(
            400,
            "POST",
            "/api/v1/apps",
            Some(json!({"app_id": "bad id"})),
        )
        .await?;
    ensure!(error(&v, "INVALID_ARGUMENT")?.starts_with("app_id:"), "{v}");
    let got = api.expect(200, "GET", "/api/v1/apps/billing", None).await?;
    ensure!(
        got["app"]["activeSecrets"] == 1 && got.get("secret").is_none(),
        "{got}"
    );
    let v = api.expect(404, "GET", "/api/v1/apps/ghost", None).await?;
    error(&v, "NOT_FOUND")?;
    let rotated = api
        .expect(
            200,
            "POST",
            "/api/v1/apps/billing/rotate",
            Some(json!({"overlapMs": "60000"})),
        )
        .await?;
    ensure!(rotated["app"]["activeSecrets"] == 2, "{rotated}");
    ensure!(rotated["secret"] != created["secret"]);
    let v = api
        .expect(
            400,
            "POST",
            "/api/v1/apps/billing/rotate",
            Some(json!({"overlap_ms": -1})),
        )
        .await?;
    ensure!(
        error(&v, "INVALID_ARGUMENT")?.starts_with("overlap_ms:"),
        "{v}"
    );

    // ---- jobs: create, get, update with the version check, pause, resume, list
    let job = api
        .expect(
            201,
            "POST",
            "/api/v1/jobs",
            Some(json!({"spec": spec("r1", "sleep", b"4000")})),
        )
        .await?;
    ensure!(
        job["job"]["version"] == "1" && job["job"]["state"] == "JOB_STATE_ACTIVE",
        "{job}"
    );
    let v = api
        .expect(
            409,
            "POST",
            "/api/v1/jobs",
            Some(json!({"spec": spec("r1", "sleep", b"1")})),
        )
        .await?;
    error(&v, "ALREADY_EXISTS")?;
    let mut bad = spec("r2", "sleep", b"1");
    bad["cron"] = json!("every tuesday");
    let v = api
        .expect(400, "POST", "/api/v1/jobs", Some(json!({"spec": bad})))
        .await?;
    ensure!(error(&v, "INVALID_ARGUMENT")?.contains("cron"), "{v}");
    let v = api
        .expect(
            400,
            "POST",
            "/api/v1/jobs",
            Some(json!({"spec": {"id": "r2", "cronn": "x"}})),
        )
        .await?;
    ensure!(error(&v, "INVALID_ARGUMENT")?.contains("cronn"), "{v}");
    let got = api.expect(200, "GET", "/api/v1/jobs/r1", None).await?;
    ensure!(
        got["job"]["spec"]["executor"]["handler"] == "sleep",
        "{got}"
    );
    let v = api.expect(404, "GET", "/api/v1/jobs/ghost", None).await?;
    error(&v, "NOT_FOUND")?;

    let mut changed = spec("r1", "sleep", b"60000");
    changed["name"] = json!("renamed");
    // The id comes from the path when the spec leaves it out.
    changed.as_object_mut().map(|o| o.remove("id"));
    let updated = api
        .expect(
            200,
            "PUT",
            "/api/v1/jobs/r1",
            Some(json!({"spec": changed, "expectedVersion": "1"})),
        )
        .await?;
    ensure!(updated["job"]["version"] == "2" && updated["job"]["spec"]["name"] == "renamed");
    let v = api
        .expect(
            409,
            "PUT",
            "/api/v1/jobs/r1",
            Some(json!({"spec": changed, "expected_version": 1})),
        )
        .await?;
    error(&v, "ABORTED")?;
    let v = api
        .expect(
            400,
            "PUT",
            "/api/v1/jobs/r1",
            Some(json!({"spec": spec("other", "sleep", b"1"), "expectedVersion": "2"})),
        )
        .await?;
    ensure!(
        error(&v, "INVALID_ARGUMENT")?.starts_with("job_id: the path says"),
        "{v}"
    );
    let v = api
        .expect(
            400,
            "PUT",
            "/api/v1/jobs/r1",
            Some(json!({"spec": changed})),
        )
        .await?;
    ensure!(
        error(&v, "INVALID_ARGUMENT")?.starts_with("expected_version:"),
        "{v}"
    );

    let paused = api
        .expect(200, "POST", "/api/v1/jobs/r1/pause", None)
        .await?;
    ensure!(paused["job"]["state"] == "JOB_STATE_PAUSED", "{paused}");
    let listed = api
        .expect(200, "GET", "/api/v1/jobs?state=paused", None)
        .await?;
    ensure!(
        listed["jobs"][0]["spec"]["id"] == "r1"
            && listed["jobs"].as_array().map(Vec::len) == Some(1)
    );
    let resumed = api
        .expect(200, "POST", "/api/v1/jobs/r1/resume", Some(json!({})))
        .await?;
    ensure!(resumed["job"]["state"] == "JOB_STATE_ACTIVE", "{resumed}");
    let v = api
        .expect(404, "POST", "/api/v1/jobs/ghost/pause", None)
        .await?;
    error(&v, "NOT_FOUND")?;
    let v = api
        .expect(400, "GET", "/api/v1/jobs?state=sleepy", None)
        .await?;
    ensure!(
        error(&v, "INVALID_ARGUMENT")?.starts_with("state: \"sleepy\" is not one of ACTIVE"),
        "{v}"
    );
    let v = api
        .expect(400, "GET", "/api/v1/jobs?page_size=-1", None)
        .await?;
    ensure!(
        error(&v, "INVALID_ARGUMENT")?.starts_with("page_size:"),
        "{v}"
    );

    // Apply: one created, one unchanged, one invalid.
    let mut invalid = spec("a3", "sleep", b"1");
    invalid["cron"] = json!("nope");
    let mut other_team = spec("a1", "echo", b"x");
    other_team["labels"] = json!({"team": "other"});
    let applied = api
        .expect(
            200,
            "PUT",
            "/api/v1/jobs",
            Some(json!({"specs": [other_team, updated["job"]["spec"], invalid]})),
        )
        .await?;
    let outcomes: Vec<&str> = applied["results"]
        .as_array()
        .context("results")?
        .iter()
        .map(|r| r["outcome"].as_str().unwrap_or_default())
        .collect();
    ensure!(
        outcomes
            == [
                "APPLY_OUTCOME_CREATED",
                "APPLY_OUTCOME_UNCHANGED",
                "APPLY_OUTCOME_INVALID"
            ],
        "{applied}"
    );
    let v = api
        .expect(400, "PUT", "/api/v1/jobs", Some(json!({"specs": []})))
        .await?;
    ensure!(error(&v, "INVALID_ARGUMENT")?.starts_with("specs:"), "{v}");
    let by_label = api
        .expect(200, "GET", "/api/v1/jobs?label_selector=team%3Dother", None)
        .await?;
    let ids: Vec<&Value> = by_label["jobs"]
        .as_array()
        .context("jobs")?
        .iter()
        .map(|j| &j["spec"]["id"])
        .collect();
    ensure!(ids == [&json!("a1")], "{by_label}");
    let v = api
        .expect(400, "GET", "/api/v1/jobs?label_selector=team", None)
        .await?;
    ensure!(
        error(&v, "INVALID_ARGUMENT")?.starts_with("label_selector:"),
        "{v}"
    );
    let status = api
        .expect(200, "GET", "/api/v1/jobs/r1/status?next_fires=2", None)
        .await?;
    ensure!(
        status["jobId"] == "r1" && status["nextFireTimesMs"].as_array().map(Vec::len) == Some(2),
        "{status}"
    );
    let v = api
        .expect(400, "GET", "/api/v1/jobs/r1/status?next_fires=500", None)
        .await?;
    ensure!(
        error(&v, "INVALID_ARGUMENT")?.starts_with("next_fires:"),
        "{v}"
    );

    // ---- nodes: an executor connects
    let bin = env!("CARGO_BIN_EXE_test_executor");
    let mut executor = TestExecutor::start(bin, &[server.grpc_url()], "rest-node-1", journal)?;
    let nodes = api
        .expect(200, "GET", "/api/v1/nodes?group=g", None)
        .await?;
    ensure!(nodes["nodes"][0]["nodeId"] == "rest-node-1", "{nodes}");
    let v = api
        .expect(400, "GET", "/api/v1/nodes?group=no%20spaces", None)
        .await?;
    ensure!(error(&v, "INVALID_ARGUMENT")?.starts_with("group:"), "{v}");

    // ---- runs: trigger, get, logs, cancel
    let t = api
        .expect(
            202,
            "POST",
            "/api/v1/jobs/r1/trigger",
            Some(json!({"idempotencyKey": "k1"})),
        )
        .await?;
    let sid = t["scheduleId"].as_str().context("scheduleId")?.to_owned();
    ensure!(sid == "r1@manual-k1" && t.get("duplicate").is_none(), "{t}");
    let again = api
        .expect(
            200,
            "POST",
            "/api/v1/jobs/r1/trigger",
            Some(json!({"idempotency_key": "k1"})),
        )
        .await?;
    ensure!(
        again["duplicate"] == true && again["scheduleId"] == sid.as_str(),
        "{again}"
    );
    let v = api
        .expect(
            400,
            "POST",
            "/api/v1/jobs/r1/trigger",
            Some(json!({"payload": "!!!"})),
        )
        .await?;
    ensure!(
        error(&v, "INVALID_ARGUMENT")?.starts_with("body.payload: "),
        "{v}"
    );
    let run = wait_for("the run to start", Duration::from_secs(20), || {
        let api = &api;
        let path = format!("/api/v1/runs/{sid}");
        async move {
            let v = api.expect(200, "GET", &path, None).await?;
            Ok((v["run"]["state"] == "RUN_STATE_RUNNING").then_some(v))
        }
    })
    .await?;
    ensure!(
        run["run"]["nodeId"] == "rest-node-1" && run["run"]["triggerKind"] == "TRIGGER_KIND_MANUAL",
        "{run}"
    );
    let logs = wait_for("a log line", Duration::from_secs(20), || {
        let api = &api;
        let path = format!("/api/v1/runs/{sid}/logs?page_size=1");
        async move {
            let v = api.expect(200, "GET", &path, None).await?;
            Ok(v["lines"]
                .as_array()
                .is_some_and(|l| !l.is_empty())
                .then_some(v))
        }
    })
    .await?;
    ensure!(
        logs["lines"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("sleeping 60000 ms"))
            && logs["lines"][0]["seq"] == "1",
        "{logs}"
    );
    let v = api
        .expect(
            400,
            "GET",
            &format!("/api/v1/runs/{sid}/logs?page_token=x"),
            None,
        )
        .await?;
    ensure!(
        error(&v, "INVALID_ARGUMENT")?.starts_with("page_token:"),
        "{v}"
    );
    let v = api
        .expect(404, "GET", "/api/v1/runs/r1@123/logs", None)
        .await?;
    error(&v, "NOT_FOUND")?;
    let v = api
        .expect(400, "GET", "/api/v1/runs/no-at-sign", None)
        .await?;
    ensure!(
        error(&v, "INVALID_ARGUMENT")?.starts_with("schedule_id:"),
        "{v}"
    );
    // The log as a stream: the lines so far, then the answer ends; followed, it stays
    // open until the run is final (the cancel below).
    let stream = format!("/api/v1/runs/{sid}/logs/stream");
    let (status, lines) = api.lines(&stream).await?;
    ensure!(status == 200, "{stream}: {status}");
    let lines = lines.rest().await?;
    ensure!(
        lines.len() == 1 && lines[0]["message"] == logs["lines"][0]["message"],
        "{lines:?}"
    );
    let (status, mut follow) = api.lines(&format!("{stream}?follow=true")).await?;
    ensure!(status == 200, "follow: {status}");
    let first = follow.next().await?.context("a first followed line")?;
    ensure!(first["seq"] == "1", "{first}");
    ensure!(
        tokio::time::timeout(Duration::from_millis(700), follow.next())
            .await
            .is_err(),
        "the followed log ended while the run was still running"
    );
    let (status, bad) = api.lines(&format!("{stream}?follow=maybe")).await?;
    ensure!(status == 400, "follow=maybe: {status}");
    drop(bad);
    let (status, _) = api.lines("/api/v1/runs/r1@123/logs/stream").await?;
    ensure!(status == 404, "a stream of no run: {status}");
    let v = api
        .expect(
            400,
            "POST",
            &format!("/api/v1/runs/{sid}/cancel"),
            Some(json!({"reason": "r".repeat(300)})),
        )
        .await?;
    ensure!(error(&v, "INVALID_ARGUMENT")?.starts_with("reason:"), "{v}");
    let cancelled = api
        .expect(
            200,
            "POST",
            &format!("/api/v1/runs/{sid}/cancel"),
            Some(json!({"reason": "from REST"})),
        )
        .await?;
    ensure!(
        cancelled["run"]["state"] == "RUN_STATE_CANCELLED",
        "{cancelled}"
    );
    // The followed stream ends now that the run is final.
    let rest = tokio::time::timeout(Duration::from_secs(10), follow.rest())
        .await
        .context("the followed log did not end after the cancel")??;
    ensure!(rest.iter().all(|l| l.get("error").is_none()), "{rest:?}");
    let v = api
        .expect(409, "POST", &format!("/api/v1/runs/{sid}/cancel"), None)
        .await?;
    error(&v, "FAILED_PRECONDITION")?;
    let runs = api
        .expect(
            200,
            "GET",
            "/api/v1/jobs/r1/runs?state=RUN_STATE_CANCELLED&page_size=5",
            None,
        )
        .await?;
    ensure!(runs["runs"][0]["scheduleId"] == sid.as_str(), "{runs}");
    let v = api
        .expect(400, "GET", "/api/v1/jobs/r1/runs?from_ms=5&to_ms=4", None)
        .await?;
    ensure!(error(&v, "INVALID_ARGUMENT")?.starts_with("to_ms:"), "{v}");

    // ---- drain, delete
    let drained = api
        .expect(
            200,
            "POST",
            "/api/v1/nodes/rest-node-1/drain",
            Some(json!({"reason": "test"})),
        )
        .await?;
    ensure!(
        drained["node"]["health"] == "NODE_HEALTH_DRAINING",
        "{drained}"
    );
    let v = api
        .expect(404, "POST", "/api/v1/nodes/ghost/drain", None)
        .await?;
    error(&v, "NOT_FOUND")?;
    // ---- undrain: the node is no longer draining (ready again at its next heartbeat)
    let undrained = api
        .expect(
            200,
            "POST",
            "/api/v1/nodes/rest-node-1/undrain",
            Some(json!({"reason": "test over"})),
        )
        .await?;
    ensure!(
        undrained["node"]["nodeId"] == "rest-node-1"
            && undrained["node"]["health"] != "NODE_HEALTH_DRAINING",
        "{undrained}"
    );
    let v = api
        .expect(404, "POST", "/api/v1/nodes/ghost/undrain", None)
        .await?;
    error(&v, "NOT_FOUND")?;
    executor.kill()?;
    let deleted = api.expect(200, "DELETE", "/api/v1/jobs/r1", None).await?;
    ensure!(deleted == json!({}), "{deleted}");
    let v = api.expect(404, "DELETE", "/api/v1/jobs/r1", None).await?;
    error(&v, "NOT_FOUND")?;
    let v = api
        .expect(400, "DELETE", "/api/v1/jobs/r1?force=true", None)
        .await?;
    ensure!(
        error(&v, "INVALID_ARGUMENT")?.starts_with("\"force\": unknown parameter"),
        "{v}"
    );
    Ok(())
}

/// Applies 1,000 jobs over REST in one body of about 1.7 MB (over the old 1 MiB limit,
/// within the 4 MiB gRPC takes) and pages through them: each exactly once (in the
/// store's order, which the API does not promise).
async fn page_through_a_thousand_jobs(server: &Sundial) -> Result<()> {
    let api = client(server).await?;
    let specs: Vec<Value> = (0..1000)
        .map(|i| spec(&format!("p{i:04}"), "noop", &[b'x'; 1200]))
        .collect();
    let applied = api
        .expect(200, "PUT", "/api/v1/jobs", Some(json!({"specs": specs})))
        .await?;
    ensure!(
        applied["results"].as_array().is_some_and(
            |r| r.len() == 1000 && r.iter().all(|x| x["outcome"] == "APPLY_OUTCOME_CREATED")
        ),
        "not all created"
    );
    let mut seen = Vec::new();
    let mut token = String::new();
    for _ in 0..100 {
        let page = api
            .expect(
                200,
                "GET",
                &format!("/api/v1/jobs?page_size=97&page_token={token}"),
                None,
            )
            .await?;
        for j in page["jobs"].as_array().into_iter().flatten() {
            seen.push(j["spec"]["id"].as_str().unwrap_or_default().to_owned());
        }
        match page["nextPageToken"].as_str() {
            Some(t) if !t.is_empty() => {
                token = url::form_urlencoded::byte_serialize(t.as_bytes()).collect();
            }
            _ => break,
        }
    }
    let p: Vec<&String> = seen.iter().filter(|id| id.starts_with('p')).collect();
    let unique: BTreeSet<&&String> = p.iter().collect();
    ensure!(
        p.len() == 1000 && unique.len() == 1000,
        "{} seen, {} distinct",
        p.len(),
        unique.len()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_on_the_embedded_store() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let server = Sundial::start(SundialOptions::embedded(dir.path()).fast())?;
    every_operation(&server, &dir.path().join("journal")).await?;
    page_through_a_thousand_jobs(&server).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_on_redis() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let redis = RedisServer::start()?;
    let server = Sundial::start(SundialOptions::redis(&redis).fast())?;
    every_operation(&server, &dir.path().join("journal")).await?;
    page_through_a_thousand_jobs(&server).await
}
