//! The REST status API on `--http-listen`, for callers without gRPC: job status, runs,
//! manual triggers, the OpenAPI document, `/healthz` and `/metrics`. Handlers validate their own
//! request shapes (errors name the parameter, as JSON) and forward to the same core as
//! the gRPC services (`jobs`, `runs`).
//!
//! Every failure answers one shape, `{"error": {"code", "message"}}` as JSON: the
//! handlers' own errors ([`ApiError`]) and axum's (no route 404, a method the route does
//! not take 405 with `Allow`, a body over [`MAX_SIGNED_BODY`] 413), rewritten by
//! [`json_errors`]. A body needs `Content-Type: application/json` (415 otherwise) and
//! must parse (400 naming `body`); messages quote at most 100 characters of the input.
//!
//! Every route but `/healthz` and `/metrics` needs admin credentials (a bearer token or an app
//! signature, see [`crate::auth`]) unless admin authentication is off (dev mode);
//! [`require_admin`] checks them before routing, buffering a signed request's body (at
//! most [`MAX_SIGNED_BODY`]) to verify it and then passing the same bytes on. Refusals
//! are 401 with the usual error body, code `UNAUTHENTICATED`. `/healthz` stays open
//! for load balancers, and so is `/metrics` (the Prometheus text format, see
//! [`crate::metrics`]; added after the layer, like `/healthz`), so scrapers need no
//! admin credentials: it shows counts and gauges, never a job's content or a secret.

use std::collections::HashMap;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::convert;
use crate::api::queries::{self, RunFilter};
use crate::api::scrape::Scrape;
use crate::auth::{self, AdminGuard};
use crate::model::{CallbackState, MAX_PAYLOAD_BYTES, RunRecord, RunState, split_schedule_id};
use crate::schedule::jobs::{self, Jobs};
use crate::store;

/// The largest request body a signed request may have (it is held in memory to be
/// verified). The largest real one, a trigger with a 64 KiB payload in base64, is far
/// below it.
pub const MAX_SIGNED_BODY: usize = 1 << 20;

/// The REST routes, over the job operations of this instance; all but `/healthz` and
/// `/metrics` behind `guard`.
pub fn router(jobs: Jobs, guard: AdminGuard, scrape: Scrape) -> axum::Router {
    axum::Router::new()
        .route("/api/v1/openapi.json", get(openapi))
        .route("/api/v1/tasks/{job_id}", get(task_status))
        .route("/api/v1/runs/{schedule_id}", get(get_run))
        .route("/api/v1/jobs/{job_id}/runs", get(list_runs))
        .route("/api/v1/jobs/{job_id}/trigger", post(trigger))
        .with_state(jobs)
        // Applies to the routes above only: the ones below are open.
        .layer(axum::middleware::from_fn_with_state(guard, require_admin))
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics).with_state(scrape))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_SIGNED_BODY))
        .layer(axum::middleware::from_fn(json_errors))
}

/// Makes every failure of the REST edge the one error shape: a response of 400 or more
/// that is not JSON already (axum's own answers: no route, a method the route does not
/// take, a body over the limit) becomes `{"error": {"code", "message"}}` with the same
/// status and headers (so a 405 keeps its `Allow`).
async fn json_errors(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = convert::quoted(req.uri().path());
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"));
    if status.as_u16() < 400 || is_json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let (code, message) = match status {
        StatusCode::NOT_FOUND => ("NOT_FOUND", format!("no route for {method} {path}")),
        StatusCode::METHOD_NOT_ALLOWED => (
            "METHOD_NOT_ALLOWED",
            format!("{path} does not take {method}"),
        ),
        StatusCode::PAYLOAD_TOO_LARGE => (
            "PAYLOAD_TOO_LARGE",
            format!("body: larger than {MAX_SIGNED_BODY} bytes"),
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (
            "UNSUPPORTED_MEDIA_TYPE",
            "content-type: a body must be application/json".to_owned(),
        ),
        s if s.is_client_error() => ("INVALID_ARGUMENT", format!("request: {}", clip(&text))),
        _ => ("INTERNAL", clip(&text)),
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    let body = serde_json::json!({ "error": { "code": code, "message": message } });
    let mut out = (status, Json(body)).into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE {
            out.headers_mut().insert(name, value.clone());
        }
    }
    out
}

/// An error text cut to 200 characters, for messages that may carry input.
fn clip(s: &str) -> String {
    match s.char_indices().nth(200) {
        Some((end, _)) => format!("{}…", &s[..end]),
        None => s.to_owned(),
    }
}

/// `GET /metrics`: the instance's metrics in the Prometheus text format.
async fn metrics(State(scrape): State<Scrape>) -> Response {
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        scrape.render().await,
    )
        .into_response()
}

/// Admits a request with admin credentials, or answers 401 (413 for a signed body over
/// [`MAX_SIGNED_BODY`]). A signature covers the request target as sent: path and query.
pub async fn require_admin(State(guard): State<AdminGuard>, req: Request, next: Next) -> Response {
    if guard.is_open() {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let (body, bytes) = if guard.needs_body(&parts.headers) {
        match axum::body::to_bytes(body, MAX_SIGNED_BODY).await {
            Ok(b) => (Body::from(b.clone()), b),
            Err(_) => {
                return ApiError {
                    status: StatusCode::PAYLOAD_TOO_LARGE,
                    code: "PAYLOAD_TOO_LARGE",
                    message: format!("body: unreadable or larger than {MAX_SIGNED_BODY} bytes"),
                }
                .into_response();
            }
        }
    } else {
        (body, axum::body::Bytes::new())
    };
    let target = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path(), |pq| pq.as_str());
    match guard
        .admit(parts.method.as_str(), target, &parts.headers, &bytes)
        .await
    {
        Ok(caller) => {
            tracing::debug!(path = %parts.uri.path(), ?caller, "http request admitted");
            next.run(Request::from_parts(parts, body)).await
        }
        Err(e) => {
            tracing::info!(path = %parts.uri.path(), reason = %e, "http request refused");
            let unauthenticated = !matches!(e, auth::Error::NonceStore(_));
            let mut resp = ApiError::from(e).into_response();
            if unauthenticated {
                resp.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            resp
        }
    }
}

/// An error as the REST API answers it: `{"error": {"code": …, "message": …}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn invalid(field: &str, reason: impl std::fmt::Display) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            code: "INVALID_ARGUMENT",
            message: format!("{field}: {reason}"),
        }
    }
}

impl From<jobs::Error> for ApiError {
    fn from(e: jobs::Error) -> Self {
        let (status, code) = match &e {
            jobs::Error::Invalid { .. } => (StatusCode::BAD_REQUEST, "INVALID_ARGUMENT"),
            jobs::Error::Store(s) => match s {
                store::Error::JobNotFound(_) | store::Error::AppNotFound(_) => {
                    (StatusCode::NOT_FOUND, "NOT_FOUND")
                }
                store::Error::JobExists(_) | store::Error::AppExists(_) => {
                    (StatusCode::CONFLICT, "ALREADY_EXISTS")
                }
                store::Error::VersionConflict { .. } => (StatusCode::CONFLICT, "ABORTED"),
                store::Error::LeaseHeld { .. } | store::Error::StaleToken { .. } => {
                    (StatusCode::CONFLICT, "FAILED_PRECONDITION")
                }
                store::Error::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE"),
                store::Error::SchemaTooNew { .. } | store::Error::Corrupt(_) => {
                    tracing::error!(error = %s, "store error");
                    (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL")
                }
            },
        };
        Self {
            status,
            code,
            message: e.to_string(),
        }
    }
}

impl From<store::Error> for ApiError {
    fn from(e: store::Error) -> Self {
        jobs::Error::Store(e).into()
    }
}

impl From<auth::Error> for ApiError {
    fn from(e: auth::Error) -> Self {
        match e {
            auth::Error::NonceStore(s) => s.into(),
            e => Self {
                status: StatusCode::UNAUTHORIZED,
                code: "UNAUTHENTICATED",
                message: e.to_string(),
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": { "code": self.code, "message": self.message } });
        (self.status, Json(body)).into_response()
    }
}

/// A run as the REST API shows it (the JSON twin of `sundial.v1.Run`).
#[derive(Debug, Serialize, Deserialize)]
pub struct RunView {
    pub schedule_id: String,
    pub job_id: String,
    pub schedule_no: String,
    pub state: RunState,
    pub trigger_kind: String,
    pub attempt: u32,
    /// A decimal string: tokens exceed what JSON numbers carry exactly.
    pub fencing_token: String,
    pub node_id: String,
    pub scheduled_at_ms: i64,
    pub triggered_at_ms: i64,
    pub started_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
    pub error_code: String,
    pub error_message: String,
    pub reason: String,
    pub job_version: u64,
    /// The executor's output, base64.
    pub output: String,
    pub progress_percent: u32,
    pub progress_message: String,
    /// Sharding broadcast: shards fanned out (0: not a broadcast), ended, succeeded.
    #[serde(default)]
    pub shard_total: u32,
    #[serde(default)]
    pub shards_done: u32,
    #[serde(default)]
    pub shards_succeeded: u32,
    /// On a shard ("<parent>#<index>"): its index and its parent.
    #[serde(default)]
    pub shard_index: u32,
    #[serde(default)]
    pub parent_schedule_id: String,
    /// The webhook: NONE (no callback URL, or not final yet), PENDING, DONE or FAILED,
    /// with the delivery record (attempts, last HTTP status (0: none), last error).
    #[serde(default)]
    pub callback_state: CallbackState,
    #[serde(default)]
    pub callback_attempts: u32,
    #[serde(default)]
    pub callback_status: u16,
    #[serde(default)]
    pub callback_error: String,
}

impl From<RunRecord> for RunView {
    fn from(r: RunRecord) -> Self {
        let kind = serde_json::to_value(r.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_ascii_uppercase))
            .unwrap_or_default();
        Self {
            schedule_id: r.schedule_id,
            job_id: r.job_id,
            schedule_no: r.schedule_no,
            state: r.state,
            trigger_kind: kind,
            attempt: r.attempt,
            fencing_token: r.fencing_token.to_string(),
            node_id: r.node_id,
            scheduled_at_ms: r.scheduled_at,
            triggered_at_ms: r.triggered_at,
            started_at_ms: r.started_at,
            finished_at_ms: r.finished_at,
            error_code: r.error_code,
            error_message: r.error_message,
            reason: r.reason,
            job_version: r.job_version,
            output: {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD.encode(r.output.unwrap_or_default())
            },
            progress_percent: r.progress_percent,
            progress_message: r.progress_message,
            shard_total: r.shard_total,
            shards_done: r.shards_done,
            shards_succeeded: r.shards_succeeded,
            shard_index: r.shard_index,
            parent_schedule_id: r.parent,
            callback_state: r.callback_state,
            callback_attempts: r.callback_attempts,
            callback_status: r.callback_status,
            callback_error: r.callback_error,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct TaskView {
    pub job_id: String,
    pub version: u64,
    /// ACTIVE, PAUSED or FINISHED.
    pub state: String,
    pub next_fire_times_ms: Vec<i64>,
    pub latest_run: Option<RunView>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct RunsPage {
    pub runs: Vec<RunView>,
    /// Empty when there is nothing more.
    pub next_page_token: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TriggerBody {
    pub idempotency_key: Option<String>,
    /// The payload as text (UTF-8), instead of the job's.
    pub payload: Option<String>,
    /// The payload as base64, for bytes that are not text.
    pub payload_base64: Option<String>,
    pub route_key: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Triggered {
    pub schedule_id: String,
    pub duplicate: bool,
}

fn job_id(raw: &str) -> Result<String, ApiError> {
    convert::job_id("job_id", raw).map_err(ApiError::from)
}

async fn task_status(
    State(jobs): State<Jobs>,
    Path(raw): Path<String>,
) -> Result<Json<TaskView>, ApiError> {
    let id = job_id(&raw)?;
    let st = queries::job_status(&jobs, &id, 5).await?;
    let state = match convert::job_state(&st.job) {
        sundial_proto::v1::JobState::Paused => "PAUSED",
        sundial_proto::v1::JobState::Finished => "FINISHED",
        _ => "ACTIVE",
    };
    Ok(Json(TaskView {
        job_id: id,
        version: st.job.version,
        state: state.to_owned(),
        next_fire_times_ms: st.next_fires,
        latest_run: st.latest_run.map(RunView::from),
    }))
}

async fn get_run(
    State(jobs): State<Jobs>,
    Path(schedule_id): Path<String>,
) -> Result<Json<RunView>, ApiError> {
    if split_schedule_id(&schedule_id).is_none() {
        return Err(ApiError::invalid(
            "schedule_id",
            format!("{schedule_id:?} is not <job_id>@<schedule_no>"),
        ));
    }
    let run = jobs
        .store()
        .get_run(&schedule_id)
        .await?
        .ok_or_else(|| ApiError {
            status: StatusCode::NOT_FOUND,
            code: "NOT_FOUND",
            message: format!("run {schedule_id:?} not found"),
        })?;
    Ok(Json(run.into()))
}

fn int_param(q: &HashMap<String, String>, name: &str) -> Result<Option<i64>, ApiError> {
    q.get(name)
        .map(|v| {
            v.parse::<i64>()
                .map_err(|_| ApiError::invalid(name, format!("{v:?} is not an integer")))
        })
        .transpose()
}

async fn list_runs(
    State(jobs): State<Jobs>,
    Path(raw): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<RunsPage>, ApiError> {
    const KNOWN: &[&str] = &["state", "from_ms", "to_ms", "page_size", "page_token"];
    if let Some(unknown) = q.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(ApiError::invalid(
            unknown,
            format!("unknown parameter; known: {}", KNOWN.join(", ")),
        ));
    }
    let id = job_id(&raw)?;
    let state = match q.get("state").map(String::as_str) {
        None | Some("") => None,
        Some(s) => Some(
            serde_json::from_value::<RunState>(serde_json::Value::String(s.to_ascii_uppercase()))
                .map_err(|_| ApiError::invalid("state", format!("{s:?} is not a run state")))?,
        ),
    };
    let from = int_param(&q, "from_ms")?;
    let to = int_param(&q, "to_ms")?;
    if from.is_some_and(|f| f < 0) || to.is_some_and(|t| t < 0) {
        return Err(ApiError::invalid("from_ms/to_ms", "must be ≥ 0"));
    }
    if let (Some(f), Some(t)) = (from, to)
        && t <= f
    {
        return Err(ApiError::invalid("to_ms", "must be after from_ms"));
    }
    let size = int_param(&q, "page_size")?.unwrap_or(0);
    let size = convert::page_size("page_size", i32::try_from(size).unwrap_or(i32::MAX))?;
    let cursor =
        convert::run_page_token("page_token", q.get("page_token").map_or("", String::as_str))?;
    let page = queries::list_runs(
        jobs.store().as_ref(),
        &id,
        &RunFilter { state, from, to },
        size,
        cursor,
    )
    .await?;
    Ok(Json(RunsPage {
        runs: page.items.into_iter().map(RunView::from).collect(),
        next_page_token: page.next_cursor.unwrap_or_default(),
    }))
}

/// A request's JSON body: an empty body is `T::default()`; any other needs
/// `Content-Type: application/json` (415 otherwise, never silently ignored) and must
/// parse (400 naming `body`, the parser's reason cut short).
fn json_body<T: serde::de::DeserializeOwned + Default>(
    headers: &axum::http::HeaderMap,
    body: &[u8],
) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let is_json = content_type.as_deref().is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
    });
    if !is_json {
        return Err(ApiError {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            code: "UNSUPPORTED_MEDIA_TYPE",
            message: format!(
                "content-type: a body must be application/json, got {}",
                content_type
                    .as_deref()
                    .map_or_else(|| "none".to_owned(), convert::quoted)
            ),
        });
    }
    serde_json::from_slice(body).map_err(|e| ApiError::invalid("body", clip(&e.to_string())))
}

async fn trigger(
    State(jobs): State<Jobs>,
    Path(raw): Path<String>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<Triggered>), ApiError> {
    let id = job_id(&raw)?;
    let body: TriggerBody = json_body(&headers, &body)?;
    let payload = match (body.payload, body.payload_base64) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "payload_base64",
                "give payload or payload_base64, not both",
            ));
        }
        (Some(text), None) => Some(text.into_bytes()),
        (None, Some(b64)) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| ApiError::invalid("payload_base64", e))?,
        ),
        (None, None) => None,
    };
    if payload
        .as_ref()
        .is_some_and(|p| p.len() > MAX_PAYLOAD_BYTES)
    {
        return Err(ApiError::invalid("payload", "more than 64 KiB"));
    }
    if body.route_key.as_ref().is_some_and(|k| k.len() > 256) {
        return Err(ApiError::invalid("route_key", "longer than 256 bytes"));
    }
    let enq = jobs
        .trigger(
            &id,
            body.idempotency_key.as_deref().filter(|k| !k.is_empty()),
            payload,
            body.route_key.filter(|k| !k.is_empty()),
        )
        .await?;
    tracing::info!(job_id = %id, schedule_id = %enq.schedule_id, duplicate = enq.duplicate, "manual trigger (REST)");
    let status = if enq.duplicate {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((
        status,
        Json(Triggered {
            schedule_id: enq.schedule_id,
            duplicate: enq.duplicate,
        }),
    ))
}

async fn openapi() -> Json<serde_json::Value> {
    Json(openapi_document())
}

/// The OpenAPI 3 description of this API.
pub fn openapi_document() -> serde_json::Value {
    use serde_json::json;
    let error = json!({ "$ref": "#/components/schemas/Error" });
    let errors = |extra: &[(&str, &str)]| {
        let mut m = serde_json::Map::new();
        m.insert(
            "400".into(),
            json!({"description": "invalid parameter (the message names it)", "content": {"application/json": {"schema": error}}}),
        );
        m.insert(
            "401".into(),
            json!({"description": "missing or refused credentials (the message says why)", "content": {"application/json": {"schema": error}}}),
        );
        for (code, desc) in extra {
            m.insert(
                (*code).into(),
                json!({"description": desc, "content": {"application/json": {"schema": error}}}),
            );
        }
        m
    };
    let job_id = json!({"name": "job_id", "in": "path", "required": true, "schema": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,128}$"}});
    let mut task_responses = errors(&[("404", "no such job")]);
    task_responses.insert("200".into(), json!({"description": "status", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Task"}}}}));
    let mut run_responses = errors(&[("404", "no such run")]);
    run_responses.insert("200".into(), json!({"description": "the run", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Run"}}}}));
    let mut runs_responses = errors(&[]);
    runs_responses.insert("200".into(), json!({"description": "a page of runs, newest first", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RunsPage"}}}}));
    let mut trigger_responses = errors(&[("404", "no such job")]);
    trigger_responses.insert("202".into(), json!({"description": "queued", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Triggered"}}}}));
    trigger_responses.insert("200".into(), json!({"description": "the idempotency key was used before; nothing new queued", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Triggered"}}}}));
    let run_states = json!([
        "TRIGGERED",
        "WAITING",
        "DISPATCHED",
        "RUNNING",
        "SUCCEEDED",
        "FAILED",
        "TIMED_OUT",
        "CANCELLED",
        "SKIPPED"
    ]);
    json!({
        "openapi": "3.0.3",
        "info": {"title": "Sundial status API", "version": "v1"},
        "paths": {
            "/api/v1/tasks/{job_id}": {"get": {"summary": "A job's status: latest run and next fire times", "parameters": [job_id], "responses": task_responses}},
            "/api/v1/runs/{schedule_id}": {"get": {"summary": "One run", "parameters": [{"name": "schedule_id", "in": "path", "required": true, "schema": {"type": "string"}, "description": "<job_id>@<schedule_no>"}], "responses": run_responses}},
            "/api/v1/jobs/{job_id}/runs": {"get": {"summary": "A job's runs, newest first", "parameters": [
                job_id,
                {"name": "state", "in": "query", "schema": {"type": "string", "enum": run_states}},
                {"name": "from_ms", "in": "query", "schema": {"type": "integer", "format": "int64"}, "description": "scheduled at or after (epoch ms)"},
                {"name": "to_ms", "in": "query", "schema": {"type": "integer", "format": "int64"}, "description": "scheduled before (epoch ms)"},
                {"name": "page_size", "in": "query", "schema": {"type": "integer", "minimum": 0, "maximum": 1000}},
                {"name": "page_token", "in": "query", "schema": {"type": "string"}}
            ], "responses": runs_responses}},
            "/api/v1/jobs/{job_id}/trigger": {"post": {"summary": "Run the job now", "parameters": [job_id], "requestBody": {"required": false, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TriggerBody"}}}}, "responses": trigger_responses}},
            "/healthz": {"get": {"summary": "Liveness (no credentials needed)", "security": [], "responses": {"200": {"description": "ok"}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics, text format 0.0.4 (no credentials needed)", "security": [], "responses": {"200": {"description": "the exposition", "content": {"text/plain": {"schema": {"type": "string"}}}}}}}
        },
        "security": [{"bearer": []}, {"appSignature": []}],
        "components": {
        "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer", "description": "a token given to the server with --bearer-token"},
            "appSignature": {"type": "apiKey", "in": "header", "name": "X-Sundial-Signature", "description": "with X-Sundial-App-Id, X-Sundial-Timestamp (unix seconds, within 5 minutes) and X-Sundial-Nonce (single use): lowercase hex HMAC-SHA256, keyed with the base64-decoded part of the app's whsec_ secret, of METHOD \\n PATH (with ?query) \\n TIMESTAMP \\n NONCE \\n followed by the raw body"}
        },
        "schemas": {
            "Error": {"type": "object", "properties": {"error": {"type": "object", "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}},
            "Run": {"type": "object", "properties": {
                "schedule_id": {"type": "string"}, "job_id": {"type": "string"}, "schedule_no": {"type": "string"},
                "state": {"type": "string", "enum": run_states},
                "trigger_kind": {"type": "string", "enum": ["CRON", "MISFIRE", "MANUAL", "RETRY"]},
                "attempt": {"type": "integer"}, "fencing_token": {"type": "string"}, "node_id": {"type": "string"},
                "scheduled_at_ms": {"type": "integer", "format": "int64"}, "triggered_at_ms": {"type": "integer", "format": "int64"},
                "started_at_ms": {"type": "integer", "format": "int64", "nullable": true}, "finished_at_ms": {"type": "integer", "format": "int64", "nullable": true},
                "error_code": {"type": "string"}, "error_message": {"type": "string"}, "reason": {"type": "string"}, "job_version": {"type": "integer", "format": "int64"},
                "output": {"type": "string", "format": "byte"}, "progress_percent": {"type": "integer"}, "progress_message": {"type": "string"},
                "shard_total": {"type": "integer"}, "shards_done": {"type": "integer"}, "shards_succeeded": {"type": "integer"},
                "shard_index": {"type": "integer"}, "parent_schedule_id": {"type": "string"},
                "callback_state": {"type": "string", "enum": ["NONE", "PENDING", "DONE", "FAILED"]},
                "callback_attempts": {"type": "integer"}, "callback_status": {"type": "integer"}, "callback_error": {"type": "string"}
            }},
            "Task": {"type": "object", "properties": {
                "job_id": {"type": "string"}, "version": {"type": "integer", "format": "int64"},
                "state": {"type": "string", "enum": ["ACTIVE", "PAUSED", "FINISHED"]},
                "next_fire_times_ms": {"type": "array", "items": {"type": "integer", "format": "int64"}},
                "latest_run": {"allOf": [{"$ref": "#/components/schemas/Run"}], "nullable": true}
            }},
            "RunsPage": {"type": "object", "properties": {"runs": {"type": "array", "items": {"$ref": "#/components/schemas/Run"}}, "next_page_token": {"type": "string"}}},
            "TriggerBody": {"type": "object", "additionalProperties": false, "properties": {
                "idempotency_key": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,128}$"},
                "payload": {"type": "string", "description": "UTF-8 text payload"},
                "payload_base64": {"type": "string", "format": "byte"},
                "route_key": {"type": "string", "maxLength": 256}
            }},
            "Triggered": {"type": "object", "properties": {"schedule_id": {"type": "string"}, "duplicate": {"type": "boolean"}}}
        }}
    })
}
