//! The audit trail: every admitted admin call that may change state (a gRPC method not
//! in [`READ_RPCS`](crate::auth::READ_RPCS), over gRPC or REST) is recorded with its
//! caller, operation, target and outcome, as an INFO line on the `audit` tracing target
//! and as an event in the store's audit log (the newest [`MAX_AUDIT_EVENTS`]);
//! `AuditService.ListAuditEvents` (REST `GET /api/v1/audit`) reads them, newest first.
//!
//! The transports record: `grpc_auth` around the gRPC services, `rest::ops` around the
//! REST operations. Both hand [`Audit::record`] the request message's bytes, from which
//! [`target`] reads what the call named.

use std::sync::Arc;

use prost_reflect::{DynamicMessage, Value};
use sundial_proto::v1 as pb;
use sundial_proto::v1::audit_service_server::AuditService;
use tonic::{Request, Response, Status};

use super::rest::clip;
use super::rest::ops::POOL;
use super::{convert, status};
use crate::auth::{Caller, READ_RPCS};
use crate::store::{AuditEvent, AuditLog};

/// How many events the store keeps; older ones are forgotten.
pub const MAX_AUDIT_EVENTS: usize = 10_000;

/// Whether a call to the gRPC method at `path` is audited: every admin method that may
/// change state.
pub fn audited(path: &str) -> bool {
    path.starts_with("/sundial.v1.")
        && !path.starts_with("/sundial.v1.ExecutorService/")
        && !READ_RPCS.contains(&path)
}

/// How an audited call went: `None` for success, else its status.
pub type Outcome<'a> = Option<&'a Status>;

/// The instance's recorder.
#[derive(Clone)]
pub struct Audit {
    store: Arc<dyn AuditLog>,
    instance: String,
}

impl Audit {
    pub fn new(store: Arc<dyn AuditLog>, instance: String) -> Self {
        Self { store, instance }
    }

    /// Records one call to the gRPC method at `path` whose request message was
    /// `message` (its protobuf bytes). A store that cannot take the event is logged,
    /// not raised: the call has happened either way.
    pub async fn record(
        &self,
        caller: &Caller,
        path: &str,
        message: &[u8],
        outcome: Outcome<'_>,
        via: &'static str,
    ) {
        let event = AuditEvent {
            caller: who(caller),
            operation: path.trim_start_matches("/sundial.v1.").replace('/', "."),
            target: target(path, message),
            outcome: outcome.map_or_else(|| "OK".to_owned(), |s| code_name(s.code())),
            detail: outcome.map_or_else(String::new, |s| clip(s.message())),
            via: via.to_owned(),
            instance: self.instance.clone(),
            ..AuditEvent::default()
        };
        tracing::info!(
            target: "audit",
            caller = %event.caller,
            operation = %event.operation,
            target = %event.target,
            outcome = %event.outcome,
            detail = %event.detail,
            via,
            "admin call"
        );
        if let Err(e) = self.store.append_audit(event, MAX_AUDIT_EVENTS).await {
            tracing::warn!(error = %e, "audit event not stored");
        }
    }
}

/// Who made a call, as the audit log names them.
pub fn who(caller: &Caller) -> String {
    match caller {
        Caller::Open => "anonymous".to_owned(),
        Caller::Bearer { name } => format!("bearer:{name}"),
        Caller::Reader { name } => format!("read:{name}"),
        Caller::App { app_id } => format!("app:{app_id}"),
    }
}

/// What a call named, read from its request message: `job <id>`, `jobs <id>, <id>…`,
/// `run <schedule_id>`, `node <id>`, `app <id>`; empty when the bytes are not the
/// method's message.
pub fn target(path: &str, message: &[u8]) -> String {
    let Some(input) = path
        .strip_prefix('/')
        .and_then(|p| p.split_once('/'))
        .and_then(|(service, method)| {
            POOL.get_service_by_name(service)?
                .methods()
                .find(|m| m.name() == method)
        })
        .map(|m| m.input())
    else {
        return String::new();
    };
    let Ok(msg) = DynamicMessage::decode(input, message) else {
        return String::new();
    };
    clip(&named(&msg))
}

fn named(msg: &DynamicMessage) -> String {
    let text = |field: &str| match msg.get_field_by_name(field).as_deref() {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    };
    if let Some(id) = text("job_id") {
        return format!("job {id}");
    }
    if let Some(Value::Message(spec)) = msg.get_field_by_name("spec").as_deref()
        && let Some(Value::String(id)) = spec.get_field_by_name("id").as_deref()
    {
        return format!("job {id}");
    }
    if let Some(Value::List(specs)) = msg.get_field_by_name("specs").as_deref() {
        let ids: Vec<String> = specs
            .iter()
            .filter_map(|s| match s {
                Value::Message(m) => match m.get_field_by_name("id").as_deref() {
                    Some(Value::String(id)) => Some(id.clone()),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        // A dry run changes nothing, and says so first (a long list is clipped).
        let dry = matches!(
            msg.get_field_by_name("dry_run").as_deref(),
            Some(Value::Bool(true))
        );
        let what = if dry { "dry run of jobs" } else { "jobs" };
        return format!("{what} {}", ids.join(", "));
    }
    for (field, kind) in [
        ("schedule_id", "run"),
        ("node_id", "node"),
        ("app_id", "app"),
    ] {
        if let Some(v) = text(field) {
            return format!("{kind} {v}");
        }
    }
    String::new()
}

/// A gRPC code as the protocol spells it (`NOT_FOUND`).
fn code_name(code: tonic::Code) -> String {
    let words = format!("{code:?}");
    let mut out = String::with_capacity(words.len() + 4);
    for (i, c) in words.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// `AuditService`: the audit log, newest first.
pub struct AuditApi {
    store: Arc<dyn AuditLog>,
}

impl AuditApi {
    pub fn new(store: Arc<dyn AuditLog>) -> Self {
        Self { store }
    }
}

#[tonic::async_trait]
impl AuditService for AuditApi {
    async fn list_audit_events(
        &self,
        req: Request<pb::ListAuditEventsRequest>,
    ) -> Result<Response<pb::ListAuditEventsResponse>, Status> {
        let req = req.into_inner();
        let size = convert::page_size("page_size", req.page_size).map_err(status)?;
        let before = convert::seq_page_token("page_token", &req.page_token).map_err(status)?;
        let events = self.store.list_audit(before, size).await?;
        let next_page_token = match events.last() {
            Some(last) if events.len() == size && last.seq > 1 => last.seq.to_string(),
            _ => String::new(),
        };
        Ok(Response::new(pb::ListAuditEventsResponse {
            events: events.into_iter().map(view).collect(),
            next_page_token,
        }))
    }
}

fn view(e: AuditEvent) -> pb::AuditEvent {
    pb::AuditEvent {
        seq: e.seq,
        time_ms: e.time_ms,
        caller: e.caller,
        operation: e.operation,
        target: e.target,
        outcome: e.outcome,
        detail: e.detail,
        via: e.via,
        instance: e.instance,
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    #[test]
    fn the_target_is_what_the_request_names() {
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            (
                "/sundial.v1.JobService/CreateJob",
                pb::CreateJobRequest {
                    spec: Some(pb::JobSpec {
                        id: "hello".into(),
                        ..Default::default()
                    }),
                }
                .encode_to_vec(),
                "job hello",
            ),
            (
                "/sundial.v1.JobService/DeleteJob",
                pb::DeleteJobRequest {
                    job_id: "old".into(),
                }
                .encode_to_vec(),
                "job old",
            ),
            (
                "/sundial.v1.JobService/ApplyJobs",
                pb::ApplyJobsRequest {
                    specs: vec![
                        pb::JobSpec {
                            id: "a".into(),
                            ..Default::default()
                        },
                        pb::JobSpec {
                            id: "b".into(),
                            ..Default::default()
                        },
                    ],
                    dry_run: false,
                }
                .encode_to_vec(),
                "jobs a, b",
            ),
            (
                "/sundial.v1.JobService/ApplyJobs",
                pb::ApplyJobsRequest {
                    specs: vec![pb::JobSpec {
                        id: "a".into(),
                        ..Default::default()
                    }],
                    dry_run: true,
                }
                .encode_to_vec(),
                "dry run of jobs a",
            ),
            (
                "/sundial.v1.RunService/CancelRun",
                pb::CancelRunRequest {
                    schedule_id: "hello@1".into(),
                    ..Default::default()
                }
                .encode_to_vec(),
                "run hello@1",
            ),
            (
                "/sundial.v1.NodeService/DrainNode",
                pb::DrainNodeRequest {
                    node_id: "n1".into(),
                    ..Default::default()
                }
                .encode_to_vec(),
                "node n1",
            ),
            (
                "/sundial.v1.AppService/RotateAppSecret",
                pb::RotateAppSecretRequest {
                    app_id: "billing".into(),
                    ..Default::default()
                }
                .encode_to_vec(),
                "app billing",
            ),
            ("/sundial.v1.JobService/DeleteJob", vec![0xff, 0xff], ""),
            ("/sundial.v1.Nope/Nothing", Vec::new(), ""),
        ];
        for (path, bytes, want) in cases {
            assert_eq!(target(path, &bytes), want, "{path}");
        }
    }

    #[test]
    fn reads_and_executors_are_not_audited() {
        assert!(audited("/sundial.v1.JobService/CreateJob"));
        assert!(audited("/sundial.v1.NodeService/DrainNode"));
        assert!(!audited("/sundial.v1.JobService/GetJob"));
        assert!(!audited("/sundial.v1.AuditService/ListAuditEvents"));
        assert!(!audited("/sundial.v1.ExecutorService/Connect"));
        assert!(!audited("/grpc.health.v1.Health/Check"));
    }

    #[test]
    fn codes_are_named_as_grpc_names_them() {
        assert_eq!(code_name(tonic::Code::NotFound), "NOT_FOUND");
        assert_eq!(code_name(tonic::Code::InvalidArgument), "INVALID_ARGUMENT");
        assert_eq!(code_name(tonic::Code::Aborted), "ABORTED");
    }
}
