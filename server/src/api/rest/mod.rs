//! The REST API on `--http-listen`, for callers without gRPC: every operation of the
//! admin services ([`ops`], one route per gRPC method, served by the gRPC
//! implementation itself), the older status route [`tasks`], the OpenAPI document
//! generated from both ([`openapi`]), `/healthz` and `/metrics`.
//!
//! Every failure answers one shape, `{"error": {"code", "message"}}` as JSON, with the
//! HTTP status mapped from the gRPC code ([`http_status`], the only table): the
//! operations' own errors ([`ApiError`]) and axum's (no route 404, a method the route
//! does not take 405 with `Allow`, a body over [`MAX_SIGNED_BODY`] 413), rewritten by
//! [`json_errors`]. A body needs `Content-Type: application/json` (415 otherwise) and
//! must parse (400 naming `body`); messages quote at most 100 characters of the input.
//!
//! Every route but `/healthz`, `/metrics` and the console's files (the `open` routes of
//! [`router`]) needs admin credentials (a bearer token or an app signature, see
//! [`crate::auth`]) unless admin authentication is off (dev mode);
//! [`require_admin`] checks them before routing, buffering a signed request's body (at
//! most [`MAX_SIGNED_BODY`]) to verify it and then passing the same bytes on. Refusals
//! are 401 with the usual error body, code `UNAUTHENTICATED`; a read-only token on
//! anything but `GET` is 403, `PERMISSION_DENIED`. `/healthz` stays open
//! for load balancers, and so is `/metrics` (the Prometheus text format, see
//! [`crate::metrics`]; added after the layer, like `/healthz`), so scrapers need no
//! admin credentials: it shows counts and gauges, never a job's content or a secret.

pub mod openapi;
pub mod ops;
mod tasks;

use axum::Json;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tonic::{Code, Status};

use super::convert;
use crate::api::queries::StatusSource;
use crate::api::scrape::Scrape;
use crate::auth::{self, AdminGuard};
use crate::schedule::jobs;
use crate::store;

pub use ops::Services;

/// The largest request body (a signed one is held in memory to be verified): 4 MiB,
/// the largest message the gRPC services decode (tonic's default), so an apply of
/// many specs that gRPC takes, REST takes too.
pub const MAX_SIGNED_BODY: usize = 4 << 20;

/// The REST routes over the services of this instance; all but `/healthz`, `/metrics`
/// and the `open` routes (the console's files, which hold no data) behind `guard`.
/// Every route, `open` ones included, answers failures in the one error shape.
pub fn router(
    status: StatusSource,
    services: &Services,
    guard: AdminGuard,
    scrape: Scrape,
    open: axum::Router,
) -> axum::Router {
    axum::Router::new()
        .route("/api/v1/openapi.json", get(openapi::serve))
        .route(
            "/api/v1/tasks/{job_id}",
            get(tasks::task_status).with_state(status),
        )
        .route("/api/v1/whoami", get(whoami))
        .merge(ops::routes(services))
        // Applies to the routes above only: the ones below are open.
        .layer(axum::middleware::from_fn_with_state(guard, require_admin))
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics).with_state(scrape))
        .merge(open)
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

/// An error text cut to 200 characters, for messages that may carry input (and the
/// audit log's targets and details).
pub(crate) fn clip(s: &str) -> String {
    match s.char_indices().nth(200) {
        Some((end, _)) => format!("{}…", &s[..end]),
        None => s.to_owned(),
    }
}

/// `GET /api/v1/whoami`: who the credentials of this request are, and whether they may
/// change anything: what the console asks to know which buttons to show.
async fn whoami(axum::Extension(caller): axum::Extension<auth::Caller>) -> Response {
    let (kind, name) = match &caller {
        auth::Caller::Open => ("open", ""),
        auth::Caller::Bearer { name } => ("admin", name.as_str()),
        auth::Caller::App { app_id } => ("app", app_id.as_str()),
        auth::Caller::Reader { name } => ("reader", name.as_str()),
    };
    Json(serde_json::json!({
        "caller": kind,
        "name": name,
        "mayWrite": caller.may_write(),
        "devMode": matches!(caller, auth::Caller::Open),
    }))
    .into_response()
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
pub async fn require_admin(
    State(guard): State<AdminGuard>,
    mut req: Request,
    next: Next,
) -> Response {
    if guard.is_open() {
        // Who called, for the audit log: nobody in particular.
        req.extensions_mut().insert(auth::Caller::Open);
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
        Ok(caller) if !caller.may_write() && !is_read(&parts.method) => {
            tracing::info!(path = %parts.uri.path(), ?caller, "http request refused: read-only token");
            let what = format!("{} {}", parts.method, convert::quoted(parts.uri.path()));
            ApiError::from(Status::permission_denied(auth::read_only_refusal(&what)))
                .into_response()
        }
        Ok(caller) => {
            tracing::debug!(path = %parts.uri.path(), ?caller, "http request admitted");
            let mut req = Request::from_parts(parts, body);
            // Who called, for the audit log.
            req.extensions_mut().insert(caller);
            next.run(req).await
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

/// Whether a REST method only reads: what a read-only token may send. Every `GET`
/// route reads (the operations' are the gRPC methods of [`auth::READ_RPCS`]: a unit
/// test of `ops` says so).
pub fn is_read(method: &axum::http::Method) -> bool {
    method == axum::http::Method::GET || method == axum::http::Method::HEAD
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

    /// A fault of this server, not of the request: logged.
    fn internal(message: String) -> Self {
        tracing::error!(%message, "REST request failed");
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "INTERNAL",
            message,
        }
    }
}

/// The HTTP status and code name of a gRPC status code: the one table the REST edge
/// answers by.
pub fn http_status(code: Code) -> (StatusCode, &'static str) {
    match code {
        Code::Ok => (StatusCode::OK, "OK"),
        Code::Cancelled => (
            StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            "CANCELLED",
        ),
        Code::Unknown => (StatusCode::INTERNAL_SERVER_ERROR, "UNKNOWN"),
        Code::InvalidArgument => (StatusCode::BAD_REQUEST, "INVALID_ARGUMENT"),
        Code::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "DEADLINE_EXCEEDED"),
        Code::NotFound => (StatusCode::NOT_FOUND, "NOT_FOUND"),
        Code::AlreadyExists => (StatusCode::CONFLICT, "ALREADY_EXISTS"),
        Code::PermissionDenied => (StatusCode::FORBIDDEN, "PERMISSION_DENIED"),
        Code::ResourceExhausted => (StatusCode::TOO_MANY_REQUESTS, "RESOURCE_EXHAUSTED"),
        Code::FailedPrecondition => (StatusCode::CONFLICT, "FAILED_PRECONDITION"),
        Code::Aborted => (StatusCode::CONFLICT, "ABORTED"),
        Code::OutOfRange => (StatusCode::BAD_REQUEST, "OUT_OF_RANGE"),
        Code::Unimplemented => (StatusCode::NOT_IMPLEMENTED, "UNIMPLEMENTED"),
        Code::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL"),
        Code::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE"),
        Code::DataLoss => (StatusCode::INTERNAL_SERVER_ERROR, "DATA_LOSS"),
        Code::Unauthenticated => (StatusCode::UNAUTHORIZED, "UNAUTHENTICATED"),
    }
}

impl From<Status> for ApiError {
    fn from(s: Status) -> Self {
        let (status, code) = http_status(s.code());
        Self {
            status,
            code,
            message: s.message().to_owned(),
        }
    }
}

impl From<jobs::Error> for ApiError {
    fn from(e: jobs::Error) -> Self {
        super::status(e).into()
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
            e => Status::unauthenticated(e.to_string()).into(),
        }
    }
}

impl ApiError {
    /// The error shape's JSON.
    fn body(&self) -> serde_json::Value {
        serde_json::json!({ "error": { "code": self.code, "message": self.message } })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
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
