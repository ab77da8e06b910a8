//! The REST face of the gRPC services: one table, [`OPS`], gives every unary operation of
//! `JobService`, `RunService`, `NodeService` and `AppService` a method and a path, and
//! [`bridge`] serves it by calling the gRPC implementation itself (one code path per
//! operation: the same validation, errors and logs as over gRPC).
//!
//! A request is the operation's request message in the proto's canonical JSON mapping
//! (pbjson: lowerCamelCase or proto field names, enums by name, 64-bit integers as
//! numbers or strings, bytes as base64), assembled from
//! - the path parameters, each bound to one request field ([`Op::bind`]; a body that
//!   names the same field must agree),
//! - the JSON body, for the operations that take one ([`Op::body`]), or
//! - the query string, for those that do not: each parameter a top-level field by either
//!   name, converted by the field's type as the descriptor says (integers, `true`/`false`,
//!   an enum by its full or short name, `key=value` for a map, repeats for a list).
//!
//! A success is 200 with the response message in the same mapping (fields at their
//! default value left out, as grpcurl prints them; 201 for a create, 202 for a queued
//! trigger, see [`Success`]), and for the one server stream (`GetRunLogs`) one message
//! per line as it comes ([`lines`]); a failure is the gRPC status as
//! [`ApiError`] (one table of codes to HTTP statuses). The OpenAPI document
//! ([`super::openapi`]) is generated from the same table and the same descriptors.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, LazyLock};

use axum::body::Bytes;
use axum::extract::{RawPathParams, RawQuery};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, on};
use axum::{Extension, Json};
use futures::{Stream, StreamExt as _};
use prost_reflect::{DescriptorPool, FieldDescriptor, Kind, MessageDescriptor};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use sundial_proto::v1::app_service_server::AppService;
use sundial_proto::v1::audit_service_server::AuditService;
use sundial_proto::v1::job_service_server::JobService;
use sundial_proto::v1::node_service_server::NodeService;
use sundial_proto::v1::run_service_server::RunService;
use tonic::Status;

use super::{ApiError, clip, json_body};
use crate::api::audit::audited;
use crate::api::convert::quoted;
use crate::api::{AppApi, Audit, AuditApi, JobApi, RunApi};
use crate::auth::Caller;
use crate::dispatch::executors::Executors;

/// The gRPC service implementations the routes call.
#[derive(Clone)]
pub struct Services {
    pub jobs: Arc<JobApi>,
    pub runs: Arc<RunApi>,
    pub nodes: Arc<Executors>,
    pub apps: Arc<AppApi>,
    pub audit: Arc<AuditApi>,
    /// Records the calls that may change state (see [`crate::api::audit`]).
    pub recorder: Audit,
}

/// The HTTP methods the operations use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verb {
    Get,
    Post,
    Put,
    Delete,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Post => "POST",
            Self::Put => "PUT",
            Self::Delete => "DELETE",
        }
    }

    fn filter(self) -> MethodFilter {
        match self {
            Self::Get => MethodFilter::GET,
            Self::Post => MethodFilter::POST,
            Self::Put => MethodFilter::PUT,
            Self::Delete => MethodFilter::DELETE,
        }
    }
}

/// One REST operation: a gRPC method at a method and path.
pub struct Op {
    pub verb: Verb,
    /// axum's syntax: `{name}` for a path parameter.
    pub path: &'static str,
    /// The service's short name (`JobService`) and the method's (`CreateJob`).
    pub service: &'static str,
    pub method: &'static str,
    /// Takes the request in a JSON body (else in the query string).
    pub body: bool,
    /// Each path parameter and the request field it fills (proto names, dotted).
    pub bind: &'static [(&'static str, &'static str)],
    pub summary: &'static str,
    pub success: Success,
    /// Serves the operation by calling the service.
    handler: fn(&'static Op, &Services) -> MethodRouter,
}

impl Op {
    /// The gRPC method's descriptor (every entry of [`OPS`] has one: a unit test says so).
    pub fn descriptor(&self) -> Option<prost_reflect::MethodDescriptor> {
        POOL.get_service_by_name(&format!("sundial.v1.{}", self.service))?
            .methods()
            .find(|m| m.name() == self.method)
    }

    /// The operation id in the OpenAPI document: the gRPC method's name.
    pub fn id(&self) -> &'static str {
        self.method
    }
}

/// The HTTP status of a success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Success {
    /// 200.
    Ok,
    /// 201: the operation made something new.
    Created,
    /// 202 (queued), or 200 when the answer's boolean field of this name is true
    /// (nothing new was queued: the trigger's idempotency key was used before).
    AcceptedUnless(&'static str),
    /// 200 with a server stream as newline-delimited JSON (`application/x-ndjson`): one
    /// message per line; a failure after the first line ends it with one error line.
    Lines,
}

impl Success {
    fn status(self, answer: &Value) -> StatusCode {
        match self {
            Self::Ok => StatusCode::OK,
            Self::Created => StatusCode::CREATED,
            Self::AcceptedUnless(field) if answer[field] == Value::Bool(true) => StatusCode::OK,
            Self::AcceptedUnless(_) => StatusCode::ACCEPTED,
            Self::Lines => StatusCode::OK,
        }
    }

    /// The statuses it may answer, with what each means.
    pub fn statuses(self) -> Vec<(u16, String)> {
        match self {
            Self::Ok => vec![(200, "done".into())],
            Self::Created => vec![(201, "created".into())],
            Self::AcceptedUnless(field) => vec![
                (202, "queued".into()),
                (200, format!("{field}: nothing new queued")),
            ],
            Self::Lines => vec![(200, "a stream, one message per line".into())],
        }
    }
}

/// The descriptors of the `sundial.v1` messages, for reading queries and writing the
/// OpenAPI document.
pub static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(sundial_proto::FILE_DESCRIPTOR_SET)
        .expect("the descriptor set built with this binary decodes")
});

/// Serves `op` by calling `$svc.$method` of [`Services`], answering one message (or,
/// with `lines`, a server stream's messages a line each).
macro_rules! grpc {
    ($svc:ident . $method:ident) => {
        grpc!($svc.$method, one)
    };
    ($svc:ident . $method:ident, $answer:ident) => {
        |op, s| {
            bridge(
                op,
                s.$svc.clone(),
                s.recorder.clone(),
                |svc, req| async move { svc.$method(req).await },
                $answer,
            )
        }
    };
}

const JOB_ID: &[(&str, &str)] = &[("job_id", "job_id")];
const SCHEDULE_ID: &[(&str, &str)] = &[("schedule_id", "schedule_id")];

/// Every REST operation over the gRPC services (`ExecutorService` is for executors,
/// over gRPC only). The one server stream, `GetRunLogs`, answers newline-delimited
/// JSON; `ListRunLogs` pages the same lines.
pub static OPS: &[Op] = &[
    Op {
        verb: Verb::Post,
        path: "/api/v1/jobs",
        service: "JobService",
        method: "CreateJob",
        body: true,
        bind: &[],
        summary: "Create a job (ALREADY_EXISTS if the id is taken)",
        success: Success::Created,
        handler: grpc!(jobs.create_job),
    },
    Op {
        verb: Verb::Get,
        path: "/api/v1/jobs",
        service: "JobService",
        method: "ListJobs",
        body: false,
        bind: &[],
        summary: "List jobs by id, a page at a time; filter by state and labels (label_selector=key=value, repeatable)",
        success: Success::Ok,
        handler: grpc!(jobs.list_jobs),
    },
    Op {
        verb: Verb::Put,
        path: "/api/v1/jobs",
        service: "JobService",
        method: "ApplyJobs",
        body: true,
        bind: &[],
        summary: "Create or update up to 1000 jobs at once; an outcome per spec",
        success: Success::Ok,
        handler: grpc!(jobs.apply_jobs),
    },
    Op {
        verb: Verb::Get,
        path: "/api/v1/fire-times",
        service: "JobService",
        method: "PreviewFireTimes",
        body: false,
        bind: &[],
        summary: "The next fire times of a cron and zone (and optional start/end window) that need not be saved: cron=..&time_zone=..&count=..",
        success: Success::Ok,
        handler: grpc!(jobs.preview_fire_times),
    },
    Op {
        verb: Verb::Get,
        path: "/api/v1/jobs/{job_id}",
        service: "JobService",
        method: "GetJob",
        body: false,
        bind: JOB_ID,
        summary: "One job",
        success: Success::Ok,
        handler: grpc!(jobs.get_job),
    },
    Op {
        verb: Verb::Put,
        path: "/api/v1/jobs/{job_id}",
        service: "JobService",
        method: "UpdateJob",
        body: true,
        bind: &[("job_id", "spec.id")],
        summary: "Replace a job's spec; expected_version must be the version read (ABORTED, 409, if it changed since)",
        success: Success::Ok,
        handler: grpc!(jobs.update_job),
    },
    Op {
        verb: Verb::Delete,
        path: "/api/v1/jobs/{job_id}",
        service: "JobService",
        method: "DeleteJob",
        body: false,
        bind: JOB_ID,
        summary: "Delete a job (its runs stay readable until they age out)",
        success: Success::Ok,
        handler: grpc!(jobs.delete_job),
    },
    Op {
        verb: Verb::Post,
        path: "/api/v1/jobs/{job_id}/pause",
        service: "JobService",
        method: "PauseJob",
        body: true,
        bind: JOB_ID,
        summary: "Pause a job: no fires until it is resumed",
        success: Success::Ok,
        handler: grpc!(jobs.pause_job),
    },
    Op {
        verb: Verb::Post,
        path: "/api/v1/jobs/{job_id}/resume",
        service: "JobService",
        method: "ResumeJob",
        body: true,
        bind: JOB_ID,
        summary: "Resume a paused job",
        success: Success::Ok,
        handler: grpc!(jobs.resume_job),
    },
    Op {
        verb: Verb::Post,
        path: "/api/v1/jobs/{job_id}/trigger",
        service: "JobService",
        method: "TriggerJob",
        body: true,
        bind: JOB_ID,
        summary: "Run a job now; the same idempotency_key again answers the first run (duplicate = true)",
        success: Success::AcceptedUnless("duplicate"),
        handler: grpc!(jobs.trigger_job),
    },
    Op {
        verb: Verb::Get,
        path: "/api/v1/jobs/{job_id}/runs",
        service: "RunService",
        method: "ListRuns",
        body: false,
        bind: JOB_ID,
        summary: "A job's runs, newest first, a page at a time; filter by state and scheduled time",
        success: Success::Ok,
        handler: grpc!(runs.list_runs),
    },
    Op {
        verb: Verb::Get,
        path: "/api/v1/jobs/{job_id}/status",
        service: "RunService",
        method: "GetJobStatus",
        body: false,
        bind: JOB_ID,
        summary: "A job's version, pause state, latest run and next fire times",
        success: Success::Ok,
        handler: grpc!(runs.get_job_status),
    },
    Op {
        verb: Verb::Get,
        path: "/api/v1/runs/{schedule_id}",
        service: "RunService",
        method: "GetRun",
        body: false,
        bind: SCHEDULE_ID,
        summary: "One run (a shard is <schedule_id>#<index>, %23 in a URL)",
        success: Success::Ok,
        handler: grpc!(runs.get_run),
    },
    Op {
        verb: Verb::Get,
        path: "/api/v1/runs/{schedule_id}/logs",
        service: "RunService",
        method: "ListRunLogs",
        body: false,
        bind: SCHEDULE_ID,
        summary: "A run's log lines, oldest first, a page at a time",
        success: Success::Ok,
        handler: grpc!(runs.list_run_logs),
    },
    Op {
        verb: Verb::Get,
        path: "/api/v1/runs/{schedule_id}/logs/stream",
        service: "RunService",
        method: "GetRunLogs",
        body: false,
        bind: SCHEDULE_ID,
        summary: "A run's whole log as newline-delimited JSON; with follow=true the answer stays open, a line per new log line, until the run is final",
        success: Success::Lines,
        handler: grpc!(runs.get_run_logs, lines),
    },
    Op {
        verb: Verb::Post,
        path: "/api/v1/runs/{schedule_id}/cancel",
        service: "RunService",
        method: "CancelRun",
        body: true,
        bind: SCHEDULE_ID,
        summary: "Cancel a run that is not final (FAILED_PRECONDITION, 409, if it is)",
        success: Success::Ok,
        handler: grpc!(runs.cancel_run),
    },
    Op {
        verb: Verb::Get,
        path: "/api/v1/nodes",
        service: "NodeService",
        method: "ListNodes",
        body: false,
        bind: &[],
        summary: "The connected executor nodes, optionally of one group",
        success: Success::Ok,
        handler: grpc!(nodes.list_nodes),
    },
    Op {
        verb: Verb::Post,
        path: "/api/v1/nodes/{node_id}/drain",
        service: "NodeService",
        method: "DrainNode",
        body: true,
        bind: &[("node_id", "node_id")],
        summary: "Ask a node to finish what it holds and take no new work",
        success: Success::Ok,
        handler: grpc!(nodes.drain_node),
    },
    Op {
        verb: Verb::Post,
        path: "/api/v1/nodes/{node_id}/undrain",
        service: "NodeService",
        method: "UndrainNode",
        body: true,
        bind: &[("node_id", "node_id")],
        summary: "End a node's drain: it takes work again",
        success: Success::Ok,
        handler: grpc!(nodes.undrain_node),
    },
    Op {
        verb: Verb::Post,
        path: "/api/v1/apps",
        service: "AppService",
        method: "CreateApp",
        body: true,
        bind: &[],
        summary: "Create an app; its signing secret is in this answer only",
        success: Success::Created,
        handler: grpc!(apps.create_app),
    },
    Op {
        verb: Verb::Get,
        path: "/api/v1/apps/{app_id}",
        service: "AppService",
        method: "GetApp",
        body: false,
        bind: &[("app_id", "app_id")],
        summary: "One app (never its secrets)",
        success: Success::Ok,
        handler: grpc!(apps.get_app),
    },
    Op {
        verb: Verb::Post,
        path: "/api/v1/apps/{app_id}/rotate",
        service: "AppService",
        method: "RotateAppSecret",
        body: true,
        bind: &[("app_id", "app_id")],
        summary: "Give an app a new secret; the old one keeps signing for overlap_ms (default 24 h)",
        success: Success::Ok,
        handler: grpc!(apps.rotate_app_secret),
    },
    Op {
        verb: Verb::Get,
        path: "/api/v1/audit",
        service: "AuditService",
        method: "ListAuditEvents",
        body: false,
        bind: &[],
        summary: "The audit log: admin calls that may change state, newest first, a page at a time",
        success: Success::Ok,
        handler: grpc!(audit.list_audit_events),
    },
];

/// The routes of every operation, one method router per path.
pub fn routes(services: &Services) -> axum::Router {
    let mut by_path: BTreeMap<&str, MethodRouter> = BTreeMap::new();
    for op in OPS {
        let route = (op.handler)(op, services);
        let merged = match by_path.remove(op.path) {
            Some(existing) => existing.merge(route),
            None => route,
        };
        by_path.insert(op.path, merged);
    }
    by_path
        .into_iter()
        .fold(axum::Router::new(), |r, (path, m)| r.route(path, m))
}

/// A route calling `call` with the request [`decode`] makes of an HTTP request, and
/// answering with `answer` (one JSON message, [`one`], or lines, [`lines`]).
fn bridge<S, Req, Resp, F, Fut>(
    op: &'static Op,
    svc: Arc<S>,
    recorder: Audit,
    call: F,
    answer: fn(&'static Op, Resp) -> Response,
) -> MethodRouter
where
    S: Send + Sync + 'static,
    Req: DeserializeOwned + prost::Message + Send + 'static,
    Resp: Send + 'static,
    F: Fn(Arc<S>, tonic::Request<Req>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>> + Send + 'static,
{
    let path = format!("/sundial.v1.{}/{}", op.service, op.method);
    let audited = audited(&path);
    let handler = move |caller: Option<Extension<Caller>>,
                        params: RawPathParams,
                        RawQuery(query): RawQuery,
                        headers: HeaderMap,
                        body: Bytes| {
        let (svc, call, recorder, path) =
            (svc.clone(), call.clone(), recorder.clone(), path.clone());
        async move {
            let req = match decode::<Req>(op, &params, query.as_deref(), &headers, &body) {
                Ok(req) => req,
                Err(e) => return e.into_response(),
            };
            // What the audit log reads the target from: the request as gRPC would carry it.
            let message = if audited {
                req.encode_to_vec()
            } else {
                Vec::new()
            };
            let result = call(svc, tonic::Request::new(req)).await;
            if audited {
                let caller = caller.map_or(Caller::Open, |Extension(c)| c);
                recorder
                    .record(&caller, &path, &message, result.as_ref().err(), "rest")
                    .await;
            }
            match result {
                Ok(resp) => answer(op, resp.into_inner()),
                Err(status) => ApiError::from(status).into_response(),
            }
        }
    };
    on(op.verb.filter(), handler)
}

/// A unary answer: the message as JSON, with the operation's success status.
fn one<Resp: Serialize>(op: &'static Op, resp: Resp) -> Response {
    match serde_json::to_value(resp) {
        Ok(answer) => (op.success.status(&answer), Json(answer)).into_response(),
        Err(e) => ApiError::internal(format!("answer not encoded: {e}")).into_response(),
    }
}

/// A server stream's answer: one JSON message per line, sent as the service yields
/// them; a client that goes away drops the stream, which ends the service's task.
fn lines<Item, St>(_: &'static Op, stream: St) -> Response
where
    Item: Serialize + Send + 'static,
    St: Stream<Item = Result<Item, Status>> + Send + 'static,
{
    let lines = stream.map(|item| {
        let value = match item {
            Ok(message) => serde_json::to_value(message)
                .unwrap_or_else(|e| ApiError::internal(format!("line not encoded: {e}")).body()),
            Err(status) => ApiError::from(status).body(),
        };
        let mut line = value.to_string().into_bytes();
        line.push(b'\n');
        Ok::<_, std::convert::Infallible>(Bytes::from(line))
    });
    (
        [(header::CONTENT_TYPE, NDJSON)],
        axum::body::Body::from_stream(lines),
    )
        .into_response()
}

/// The media type of a stream's answer.
pub const NDJSON: &str = "application/x-ndjson";

/// The request message of `op` from an HTTP request (see the module doc).
fn decode<Req: DeserializeOwned>(
    op: &Op,
    params: &RawPathParams,
    query: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Req, ApiError> {
    let input = op
        .descriptor()
        .map(|m| m.input())
        .ok_or_else(|| ApiError::internal(format!("no descriptor for {}", op.method)))?;
    let mut fields = if op.body {
        match json_body::<Value>(headers, body)? {
            Value::Null => Map::new(),
            Value::Object(m) => m,
            _ => return Err(ApiError::invalid("body", "must be a JSON object")),
        }
    } else {
        if !body.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::invalid(
                "body",
                format!(
                    "{} {} takes no body: give its parameters in the query",
                    op.verb.as_str(),
                    op.path
                ),
            ));
        }
        Map::new()
    };
    let query = query.unwrap_or_default();
    if op.body {
        if let Some((name, _)) = url::form_urlencoded::parse(query.as_bytes()).next() {
            return Err(ApiError::invalid(
                &quoted(&name),
                "unknown parameter: this operation takes its fields in the JSON body",
            ));
        }
    } else {
        query_fields(op, &input, query, &mut fields)?;
    }
    for (param, value) in params {
        let target = op
            .bind
            .iter()
            .find(|(p, _)| *p == param)
            .map(|(_, field)| *field)
            .ok_or_else(|| ApiError::internal(format!("path parameter {param} is not bound")))?;
        bind(&input, &mut fields, param, target, value)?;
    }
    let source = if op.body { "body" } else { "query" };
    serde_path_to_error::deserialize(Value::Object(fields)).map_err(|e| decode_error(source, &e))
}

/// A request that did not decode, named by its field path (`body.retry.maxRetries`)
/// and said in words: a number out of its field's range otherwise reads "data did not
/// match any variant of untagged enum Content" (how the JSON mapping takes a number or
/// a string holding one).
fn decode_error(source: &str, e: &serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let field = if path.is_empty() || path == "." {
        source.to_owned()
    } else {
        format!("{source}.{path}")
    };
    let inner = e.inner().to_string();
    let reason = if inner.contains("untagged enum") {
        "not a number this field can hold (a JSON number in its range, or a string holding one)"
            .to_owned()
    } else {
        inner
    };
    ApiError::invalid(&field, clip(&reason))
}

/// Sets the request field `target` (dotted proto names) to the path parameter's value;
/// a body that names the field already must say the same.
fn bind(
    input: &MessageDescriptor,
    fields: &mut Map<String, Value>,
    param: &str,
    target: &str,
    value: &str,
) -> Result<(), ApiError> {
    let mut desc = input.clone();
    let mut obj = fields;
    let mut segments = target.split('.').peekable();
    while let Some(seg) = segments.next() {
        let field = desc
            .get_field_by_name(seg)
            .ok_or_else(|| ApiError::internal(format!("{target} is not a request field")))?;
        let key = [field.name(), field.json_name()]
            .into_iter()
            .find(|k| obj.contains_key(*k))
            .unwrap_or(field.name())
            .to_owned();
        if segments.peek().is_none() {
            match obj.get(&key) {
                Some(Value::String(given)) if given == value => {}
                Some(given) => {
                    return Err(ApiError::invalid(
                        param,
                        format!(
                            "the path says {} but the body's {target} says {}",
                            quoted(value),
                            quoted(&given.to_string())
                        ),
                    ));
                }
                None => {
                    obj.insert(key, Value::String(value.to_owned()));
                }
            }
            return Ok(());
        }
        let Kind::Message(next) = field.kind() else {
            return Err(ApiError::internal(format!(
                "{target} is not a request field"
            )));
        };
        desc = next;
        let entry = obj.entry(key).or_insert_with(|| Value::Object(Map::new()));
        let Value::Object(inner) = entry else {
            return Err(ApiError::invalid(seg, "must be a JSON object"));
        };
        obj = inner;
    }
    Ok(())
}

/// The query parameters as request fields, each converted by its field's type.
fn query_fields(
    op: &Op,
    input: &MessageDescriptor,
    query: &str,
    fields: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    for (name, raw) in url::form_urlencoded::parse(query.as_bytes()) {
        let field = input
            .get_field_by_name(&name)
            .or_else(|| input.get_field_by_json_name(&name))
            .filter(|f| is_query_field(op, f))
            .ok_or_else(|| {
                ApiError::invalid(
                    &quoted(&name),
                    format!("unknown parameter; known: {}", query_names(op).join(", ")),
                )
            })?;
        let key = field.name().to_owned();
        if field.is_map() {
            let (k, v) = raw.split_once('=').ok_or_else(|| {
                ApiError::invalid(field.name(), format!("{} is not key=value", quoted(&raw)))
            })?;
            let map = fields
                .entry(key)
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(m) = map
                && m.insert(k.to_owned(), Value::String(v.to_owned()))
                    .is_some()
            {
                return Err(ApiError::invalid(
                    field.name(),
                    format!("key {} given twice", quoted(k)),
                ));
            }
            continue;
        }
        let value = scalar(&field, &raw)?;
        if field.is_list() {
            if let Value::Array(items) = fields.entry(key).or_insert_with(|| Value::Array(vec![])) {
                items.push(value);
            }
        } else if fields.insert(key, value).is_some() {
            return Err(ApiError::invalid(field.name(), "given twice"));
        }
    }
    Ok(())
}

/// The query parameters `op` takes, by their proto names.
pub fn query_names(op: &Op) -> Vec<String> {
    if op.body {
        return Vec::new();
    }
    op.descriptor()
        .map(|m| {
            m.input()
                .fields()
                .filter(|f| is_query_field(op, f))
                .map(|f| f.name().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a request field of `op` can come from the query string: a top-level field
/// not filled from the path, and a scalar, an enum, a list of those or a map (not a
/// message).
fn is_query_field(op: &Op, f: &FieldDescriptor) -> bool {
    !op.bind.iter().any(|(_, target)| *target == f.name())
        && (f.is_map() || !matches!(f.kind(), Kind::Message(_)))
}

/// One query value as the JSON the field's type takes.
fn scalar(field: &FieldDescriptor, raw: &str) -> Result<Value, ApiError> {
    let bad =
        |what: &str| ApiError::invalid(field.name(), format!("{} is not {what}", quoted(raw)));
    Ok(match field.kind() {
        Kind::Bool => match raw {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => return Err(bad("true or false")),
        },
        Kind::Int32
        | Kind::Sint32
        | Kind::Sfixed32
        | Kind::Int64
        | Kind::Sint64
        | Kind::Sfixed64 => Value::from(raw.parse::<i64>().map_err(|_| bad("an integer"))?),
        Kind::Uint32 | Kind::Fixed32 | Kind::Uint64 | Kind::Fixed64 => {
            Value::from(raw.parse::<u64>().map_err(|_| bad("an integer ≥ 0"))?)
        }
        Kind::Double | Kind::Float => Value::from(raw.parse::<f64>().map_err(|_| bad("a number"))?),
        Kind::Enum(e) => {
            // The full name (RUN_STATE_FAILED), or the part after the enum's prefix
            // (FAILED, failed).
            let prefix = e
                .values()
                .find(|v| v.number() == 0)
                .and_then(|v| v.name().strip_suffix("UNSPECIFIED").map(str::to_owned))
                .unwrap_or_default();
            let upper = raw.to_ascii_uppercase();
            let found = e
                .values()
                .find(|v| v.name() == raw || v.name() == format!("{prefix}{upper}"));
            match found {
                Some(v) => Value::String(v.name().to_owned()),
                None => {
                    let names: Vec<_> = e
                        .values()
                        .filter(|v| v.number() != 0)
                        .map(|v| {
                            v.name()
                                .strip_prefix(&prefix)
                                .unwrap_or(v.name())
                                .to_owned()
                        })
                        .collect();
                    return Err(bad(&format!("one of {}", names.join(", "))));
                }
            }
        }
        Kind::String | Kind::Bytes | Kind::Message(_) => Value::String(raw.to_owned()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_names_a_grpc_method_and_binds_its_path_parameters() {
        for op in OPS {
            let m = op
                .descriptor()
                .unwrap_or_else(|| panic!("{} {} has no gRPC method", op.service, op.method));
            assert!(!m.is_client_streaming(), "{}", op.method);
            assert_eq!(
                m.is_server_streaming(),
                op.success == Success::Lines,
                "{}: a server stream answers lines, a unary call one message",
                op.method
            );
            let params: Vec<&str> = op
                .path
                .split('/')
                .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
                .collect();
            let bound: Vec<&str> = op.bind.iter().map(|(p, _)| *p).collect();
            assert_eq!(params, bound, "{}", op.path);
        }
    }

    #[test]
    fn exactly_the_get_routes_call_the_methods_a_read_only_token_may_call() {
        for op in OPS {
            let rpc = format!("/sundial.v1.{}/{}", op.service, op.method);
            assert_eq!(
                op.verb == Verb::Get,
                crate::auth::READ_RPCS.contains(&rpc.as_str()),
                "{} {} calls {rpc}",
                op.verb.as_str(),
                op.path
            );
        }
    }

    #[test]
    fn every_method_of_the_admin_services_has_an_operation() {
        for service in [
            "JobService",
            "RunService",
            "NodeService",
            "AppService",
            "AuditService",
        ] {
            let svc = POOL
                .get_service_by_name(&format!("sundial.v1.{service}"))
                .expect("service");
            for m in svc.methods() {
                assert!(
                    OPS.iter()
                        .any(|op| op.service == service && op.method == m.name()),
                    "{service}.{} has no REST route",
                    m.name()
                );
            }
        }
    }

    fn field(message: &str, name: &str) -> FieldDescriptor {
        POOL.get_message_by_name(&format!("sundial.v1.{message}"))
            .and_then(|m| m.get_field_by_name(name))
            .expect("field")
    }

    #[test]
    fn query_values_take_their_fields_types() {
        let state = field("ListRunsRequest", "state");
        assert_eq!(
            scalar(&state, "failed").ok(),
            Some(Value::from("RUN_STATE_FAILED"))
        );
        assert_eq!(
            scalar(&state, "RUN_STATE_FAILED").ok(),
            Some(Value::from("RUN_STATE_FAILED"))
        );
        let e = scalar(&state, "DONE").expect_err("not a state");
        assert!(
            e.message
                .starts_with("state: \"DONE\" is not one of TRIGGERED"),
            "{}",
            e.message
        );
        let size = field("ListRunsRequest", "page_size");
        assert_eq!(scalar(&size, "5").ok(), Some(Value::from(5)));
        assert!(scalar(&size, "five").is_err());
        let overlap = field("RotateAppSecretRequest", "overlap_ms");
        assert_eq!(scalar(&overlap, "-1").ok(), Some(Value::from(-1)));
    }
}
