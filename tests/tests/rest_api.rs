//! The REST API over real HTTP: the status route, runs, manual triggers, the OpenAPI
//! document and every documented route being served, and errors that name the
//! parameter in the one error shape. `rest_ops` goes through every operation.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use base64::Engine as _;
use serde_json::Value;
use sundial_proto::v1 as pb;
use sundial_tests::rest::header;
use sundial_tests::{Sundial, SundialOptions, every_second, wait_for};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// A server on a fresh embedded store with one every-second job; its HTTP base URL and
/// a client. The directory and server live as long as the returned guards.
async fn server_with_job(
    job_id: &str,
) -> Result<(tempfile::TempDir, Sundial, String, reqwest::Client)> {
    let dir = tempfile::tempdir()?;
    // No executor connects: each run fails "no_executor" as soon as it is routed.
    let server = Sundial::start(SundialOptions::embedded(dir.path()).arg("dispatch-wait", "1ms"))?;
    let base = format!("http://{}", server.http.context("no http address")?);
    server
        .jobs()
        .await?
        .create_job(pb::CreateJobRequest {
            spec: Some(every_second(job_id)),
        })
        .await?;
    Ok((dir, server, base, reqwest::Client::new()))
}

/// Fails if `job` has a manual run: the refused triggers before must not have queued one.
async fn no_manual_run(http: &reqwest::Client, base: &str, job: &str) -> Result<()> {
    let resp = http
        .get(format!("{base}/api/v1/jobs/{job}/runs"))
        .send()
        .await?;
    ensure!(resp.status() == 200, "listing runs: {}", resp.status());
    let runs: Value = resp.json().await?;
    // An empty list is left out of the answer, like every field at its default.
    let none = Vec::new();
    let listed = runs.get("runs").map_or(Some(&none), Value::as_array);
    ensure!(
        listed.is_some_and(|r| r.iter().all(|r| r["triggerKind"] != "TRIGGER_KIND_MANUAL")),
        "a refused trigger queued a run: {runs}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_runs_and_triggers_over_http() -> Result<()> {
    let (_dir, _server, base, http) = server_with_job("rest-job").await?;

    // Runs accumulate; the status shows the latest and the next five fires.
    let url = format!("{base}/api/v1/jobs/rest-job/runs?page_size=2");
    let page: Value = wait_for("three runs", Duration::from_secs(20), || {
        let http = http.clone();
        let url = format!("{base}/api/v1/jobs/rest-job/runs");
        async move {
            let v: Value = http.get(&url).send().await?.json().await?;
            Ok((v["runs"].as_array().map_or(0, Vec::len) >= 3).then_some(v))
        }
    })
    .await?;
    // The oldest of them (two fires ago): the newest may still be WAITING for its
    // routing, a few milliseconds after its fire.
    let first = page["runs"]
        .as_array()
        .and_then(|runs| runs.last())
        .cloned()
        .context("runs")?;
    ensure!(
        // No executor is connected: each run fails "no_executor".
        first["state"] == "RUN_STATE_FAILED"
            && first["errorCode"] == "no_executor"
            && first["triggerKind"] == "TRIGGER_KIND_CRON",
        "{first}"
    );
    let two: Value = http.get(&url).send().await?.json().await?;
    ensure!(two["runs"].as_array().map(Vec::len) == Some(2));
    let token = two["nextPageToken"].as_str().context("token")?;
    ensure!(!token.is_empty());
    let next: Value = http
        .get(format!("{base}/api/v1/jobs/rest-job/runs"))
        .query(&[("page_size", "2"), ("page_token", token)])
        .send()
        .await?
        .json()
        .await?;
    // 64-bit integers are decimal strings in the canonical mapping.
    let at = |v: &Value| -> Result<i64> {
        Ok(v["scheduledAtMs"]
            .as_str()
            .context("scheduledAtMs")?
            .parse()?)
    };
    ensure!(at(&next["runs"][0])? < at(&two["runs"][1])?);

    let task: Value = http
        .get(format!("{base}/api/v1/tasks/rest-job"))
        .send()
        .await?
        .json()
        .await?;
    ensure!(task["state"] == "ACTIVE" && task["version"] == 1, "{task}");
    ensure!(task["next_fire_times_ms"].as_array().map(Vec::len) == Some(5));
    ensure!(task["latest_run"]["job_id"] == "rest-job");

    let sid = first["scheduleId"].as_str().context("sid")?;
    let run = http.get(format!("{base}/api/v1/runs/{sid}")).send().await?;
    ensure!(run.status() == 200);
    let run: Value = run.json().await?;
    ensure!(run["run"]["scheduleId"] == sid);

    // Manual trigger: 202 the first time, 200 + duplicate for the same key.
    let t = http
        .post(format!("{base}/api/v1/jobs/rest-job/trigger"))
        .json(&serde_json::json!({"idempotency_key": "rest-1", "payload": B64.encode("{\"x\":1}")}))
        .send()
        .await?;
    ensure!(t.status() == 202, "{}", t.status());
    let t: Value = t.json().await?;
    ensure!(t["scheduleId"] == "rest-job@manual-rest-1" && t.get("duplicate").is_none());
    let again = http
        .post(format!("{base}/api/v1/jobs/rest-job/trigger"))
        .json(&serde_json::json!({"idempotency_key": "rest-1"}))
        .send()
        .await?;
    ensure!(again.status() == 200);
    let again: Value = again.json().await?;
    ensure!(again["duplicate"] == true && again["scheduleId"] == t["scheduleId"]);
    let manual = wait_for("the manual run", Duration::from_secs(20), || {
        let http = http.clone();
        let url = format!("{base}/api/v1/runs/rest-job@manual-rest-1");
        async move {
            let r = http.get(&url).send().await?;
            Ok(if r.status() == 200 {
                Some(r.json::<Value>().await?)
            } else {
                None
            })
        }
    })
    .await?;
    ensure!(
        manual["run"]["triggerKind"] == "TRIGGER_KIND_MANUAL",
        "{manual}"
    );
    ensure!(manual["run"]["state"] != Value::Null, "{manual}");

    // State filter.
    let manual_only: Value = http
        .get(format!("{base}/api/v1/jobs/rest-job/runs?state=skipped"))
        .send()
        .await?
        .json()
        .await?;
    ensure!(manual_only == serde_json::json!({}), "{manual_only}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_name_the_parameter_and_openapi_describes_the_api() -> Result<()> {
    let (_dir, _server, base, http) = server_with_job("known").await?;

    let get = |path: &str| http.get(format!("{base}{path}"));
    let trigger = |job: &str| http.post(format!("{base}/api/v1/jobs/{job}/trigger"));
    let cases: Vec<(reqwest::RequestBuilder, u16, &str)> = vec![
        (get("/api/v1/tasks/bad%20id"), 400, "job_id:"),
        (get("/api/v1/tasks/ghost"), 404, "job \"ghost\" not found"),
        (get("/api/v1/runs/no-at-sign"), 400, "schedule_id:"),
        (get("/api/v1/runs/known@123"), 404, "not found"),
        (get("/api/v1/jobs/known/runs?state=DONE"), 400, "state:"),
        (get("/api/v1/jobs/known/runs?from_ms=abc"), 400, "from_ms:"),
        (
            get("/api/v1/jobs/known/runs?from_ms=5&to_ms=4"),
            400,
            "to_ms:",
        ),
        (
            get("/api/v1/jobs/known/runs?page_size=5000"),
            400,
            "page_size:",
        ),
        (
            get("/api/v1/jobs/known/runs?colour=red"),
            400,
            "\"colour\": unknown",
        ),
        (
            trigger("known").json(&serde_json::json!({"idempotency_key": "has space"})),
            400,
            "idempotency_key:",
        ),
        (
            trigger("known").json(&serde_json::json!({"payload": "!!!"})),
            400,
            "body.payload: ",
        ),
        (
            trigger("known")
                .json(&serde_json::json!({"payload": B64.encode("x".repeat(64 * 1024 + 1))})),
            400,
            "payload:",
        ),
        (
            trigger("known").json(&serde_json::json!({"surprise": 1})),
            400,
            "body.surprise: unknown field",
        ),
        (trigger("ghost"), 404, "not found"),
    ];
    for (req, status, needle) in cases {
        let resp = req.send().await?;
        let got = resp.status().as_u16();
        let body: Value = resp.json().await.context("error bodies are JSON")?;
        let message = body["error"]["message"].as_str().unwrap_or_default();
        ensure!(
            got == status && message.contains(needle),
            "expected {status} naming {needle:?}, got {got}: {body}"
        );
    }
    // None of those queued anything.
    no_manual_run(&http, &base, "known").await?;

    let doc: Value = http
        .get(format!("{base}/api/v1/openapi.json"))
        .send()
        .await?
        .json()
        .await?;
    ensure!(doc["openapi"] == "3.1.0", "{}", doc["openapi"]);
    // Every documented route is served: a request with placeholder parameters gets an
    // answer of the operation (an error about the placeholders at most), never the
    // router's "no route" 404 or a 405. (That every route is documented is the other
    // half: the routes are made from the table the document is made from, and a unit
    // test of `ops` finds a route for every gRPC method.)
    let mut documented = 0;
    for (path, item) in doc["paths"].as_object().context("paths")? {
        let concrete = path
            .replace("{schedule_id}", "known@1")
            .replace(['{', '}'], "");
        for method in item.as_object().context("path item")?.keys() {
            let m = reqwest::Method::from_bytes(method.to_ascii_uppercase().as_bytes())?;
            let resp = http.request(m, format!("{base}{concrete}")).send().await?;
            let status = resp.status().as_u16();
            let body = resp.text().await?;
            ensure!(
                status != 405 && !body.contains("no route for"),
                "documented {method} {path} is not routed: {status} {body}"
            );
            documented += 1;
        }
    }
    ensure!(documented >= 23, "{documented} documented operations");
    let health = get("/healthz").send().await?;
    ensure!(health.status() == 200);
    Ok(())
}

/// Every failure of the REST edge answers the one error shape, `{"error": {"code",
/// "message"}}` as JSON, whatever fails: no route, a method the route does not take
/// (405 with `Allow`), malformed or non-UTF-8 JSON, a body without or with the wrong
/// content type, a body too large, a page token this API never issued. None of them
/// changes anything, and messages quote at most about 100 characters of the input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_failure_is_one_json_error_shape() -> Result<()> {
    let (_dir, _server, base, http) = server_with_job("shape").await?;
    let trigger = || http.post(format!("{base}/api/v1/jobs/shape/trigger"));
    let long = "z".repeat(5000);
    let cases: Vec<(&str, reqwest::RequestBuilder, u16, &str, &str)> = vec![
        (
            "unknown path",
            http.get(format!("{base}/api/v1/nowhere")),
            404,
            "NOT_FOUND",
            "/api/v1/nowhere",
        ),
        (
            "unknown method",
            http.delete(format!("{base}/api/v1/tasks/shape")),
            405,
            "METHOD_NOT_ALLOWED",
            "DELETE",
        ),
        (
            "malformed JSON",
            trigger()
                .header("content-type", "application/json")
                .body("{\"idempotency_key\": "),
            400,
            "INVALID_ARGUMENT",
            "body:",
        ),
        (
            "non-UTF-8 JSON",
            trigger()
                .header("content-type", "application/json")
                .body(vec![b'"', 0xff, 0xfe, b'"']),
            400,
            "INVALID_ARGUMENT",
            "body:",
        ),
        (
            "deep nesting",
            trigger()
                .header("content-type", "application/json")
                .body("[".repeat(10_000)),
            400,
            "INVALID_ARGUMENT",
            "body:",
        ),
        (
            "no content type",
            trigger().body("{\"idempotency_key\": \"k1\"}"),
            415,
            "UNSUPPORTED_MEDIA_TYPE",
            "content-type",
        ),
        (
            "wrong content type",
            trigger()
                .header("content-type", "text/plain")
                .body("{\"idempotency_key\": \"k1\"}"),
            415,
            "UNSUPPORTED_MEDIA_TYPE",
            "content-type",
        ),
        (
            "too large",
            // The server answers before reading the body and drops the connection:
            // the client must not pool it for the next case.
            trigger()
                .header("content-type", "application/json")
                .header("connection", "close")
                .body(vec![b' '; 5 << 20]),
            413,
            "PAYLOAD_TOO_LARGE",
            "body",
        ),
        (
            "bad page token",
            http.get(format!("{base}/api/v1/jobs/shape/runs?page_token=garbage")),
            400,
            "INVALID_ARGUMENT",
            "page_token:",
        ),
        (
            "bad jobs page token",
            http.get(format!("{base}/api/v1/jobs?page_token=x:y")),
            400,
            "INVALID_ARGUMENT",
            "page_token:",
        ),
        (
            "a number past its field's range names the field",
            http.post(format!("{base}/api/v1/jobs"))
                .header("content-type", "application/json")
                .body(r#"{"spec": {"id": "n", "cron": "0 0 12 * * ?", "retry": {"maxRetries": 4e9}}}"#),
            400,
            "INVALID_ARGUMENT",
            "body.spec.retry.maxRetries: not a number this field can hold",
        ),
        (
            "a query number past its range names the parameter",
            http.get(format!("{base}/api/v1/jobs/shape/runs?page_size=99999999999")),
            400,
            "INVALID_ARGUMENT",
            "query.",
        ),
        (
            "a wrong type names the field",
            http.post(format!("{base}/api/v1/jobs"))
                .header("content-type", "application/json")
                .body(r#"{"spec": {"id": "n", "cron": 5}}"#),
            400,
            "INVALID_ARGUMENT",
            "body.spec.cron: ",
        ),
        (
            "a long bad id is quoted short",
            http.get(format!("{base}/api/v1/tasks/{long}")),
            400,
            "INVALID_ARGUMENT",
            "job_id:",
        ),
    ];
    for (what, req, status, code, needle) in cases {
        let resp = req.send().await?;
        let got = resp.status().as_u16();
        let allow = header(&resp, "allow");
        let content_type = header(&resp, "content-type").unwrap_or_default();
        let text = resp.text().await?;
        let body: Value = serde_json::from_str(&text)
            .with_context(|| format!("{what}: not JSON ({content_type}): {text:?}"))?;
        let message = body["error"]["message"].as_str().unwrap_or_default();
        ensure!(
            got == status
                && content_type.starts_with("application/json")
                && body["error"]["code"] == code
                && message.contains(needle),
            "{what}: expected {status} {code} naming {needle:?}, got {got}: {body}"
        );
        ensure!(
            message.len() < 300,
            "{what}: a {} byte message",
            message.len()
        );
        if status == 405 {
            ensure!(
                allow.as_deref() == Some("GET,HEAD"),
                "{what}: Allow {allow:?}"
            );
        }
    }
    // None of them queued a run.
    no_manual_run(&http, &base, "shape").await?;
    // An empty body without a content type is still a plain trigger.
    let ok = trigger().send().await?;
    ensure!(ok.status() == 202, "an empty trigger: {}", ok.status());
    Ok(())
}
