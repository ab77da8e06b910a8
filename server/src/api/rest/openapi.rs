//! The OpenAPI 3.1 document at `/api/v1/openapi.json`, generated rather than written:
//! the operations' paths, parameters and bodies from the table of [`super::ops`], and
//! their schemas from the proto descriptors the server is built with (the canonical
//! JSON mapping of each message: lowerCamelCase names, enums by name, 64-bit integers
//! as decimal strings, bytes as base64). Only the older `/api/v1/tasks/{job_id}` route,
//! `/healthz` and `/metrics` are described by hand, here.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use axum::Json;
use prost_reflect::{EnumDescriptor, FieldDescriptor, Kind, MessageDescriptor};
use serde_json::{Map, Value, json};

use super::ops::{NDJSON, OPS, Op, Success, query_names};

/// The document, made once.
static DOCUMENT: LazyLock<Value> = LazyLock::new(build);

/// `GET /api/v1/openapi.json`.
pub async fn serve() -> Json<Value> {
    Json(document().clone())
}

/// The OpenAPI document of this API.
pub fn document() -> &'static Value {
    &DOCUMENT
}

/// A schema's reference by its component name.
fn reference(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// The component name of a message or enum: its full name without the package.
fn component(full_name: &str) -> String {
    full_name
        .strip_prefix("sundial.v1.")
        .unwrap_or(full_name)
        .to_owned()
}

/// Collects the schemas of messages and enums as they are met.
#[derive(Default)]
struct Schemas(BTreeMap<String, Value>);

impl Schemas {
    fn message(&mut self, m: &MessageDescriptor) -> Value {
        let name = component(m.full_name());
        if !self.0.contains_key(&name) {
            self.0.insert(name.clone(), Value::Null); // a recursive message refers back
            let mut properties = Map::new();
            for f in m.fields() {
                let schema = self.field(&f);
                properties.insert(f.json_name().to_owned(), schema);
            }
            self.0.insert(
                name.clone(),
                json!({
                    "type": "object",
                    "description": format!(
                        "{} in the canonical JSON mapping (requests may use the proto field names too).",
                        m.full_name()
                    ),
                    "properties": properties,
                    "additionalProperties": false,
                }),
            );
        }
        reference(&name)
    }

    fn enumeration(&mut self, e: &EnumDescriptor) -> Value {
        let name = component(e.full_name());
        let names: Vec<String> = e.values().map(|v| v.name().to_owned()).collect();
        self.0.entry(name.clone()).or_insert_with(|| {
            json!({"type": "string", "enum": names, "description": format!("{} by name", e.full_name())})
        });
        reference(&name)
    }

    fn field(&mut self, f: &FieldDescriptor) -> Value {
        if f.is_map()
            && let Kind::Message(entry) = f.kind()
        {
            let value = self.field(&entry.map_entry_value_field());
            return json!({"type": "object", "additionalProperties": value});
        }
        let one = self.kind(&f.kind());
        if f.is_list() {
            json!({"type": "array", "items": one})
        } else {
            one
        }
    }

    fn kind(&mut self, kind: &Kind) -> Value {
        match kind {
            Kind::Bool => json!({"type": "boolean"}),
            Kind::String => json!({"type": "string"}),
            Kind::Bytes => json!({"type": "string", "contentEncoding": "base64"}),
            Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
                json!({"type": "integer", "format": "int32"})
            }
            Kind::Uint32 | Kind::Fixed32 => {
                json!({"type": "integer", "format": "int32", "minimum": 0})
            }
            Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => json!({
                "type": ["string", "integer"], "format": "int64", "pattern": "^-?[0-9]+$",
                "description": "a decimal string in answers; a number or a string in requests"
            }),
            Kind::Uint64 | Kind::Fixed64 => json!({
                "type": ["string", "integer"], "format": "uint64", "pattern": "^[0-9]+$", "minimum": 0,
                "description": "a decimal string in answers; a number or a string in requests"
            }),
            Kind::Double | Kind::Float => json!({"type": ["number", "string"]}),
            Kind::Enum(e) => self.enumeration(e),
            Kind::Message(m) => self.message(m),
        }
    }
}

/// The failures every operation may answer, each a shared response of the document.
const ERRORS: &[(&str, &str)] = &[
    (
        "400",
        "INVALID_ARGUMENT: a field is invalid (the message names it)",
    ),
    ("401", "UNAUTHENTICATED: missing or refused credentials"),
    (
        "404",
        "NOT_FOUND: no such job, run, node or app, or no such route",
    ),
    (
        "409",
        "ALREADY_EXISTS, ABORTED (a version changed) or FAILED_PRECONDITION",
    ),
    ("413", "PAYLOAD_TOO_LARGE: a body over 4 MiB"),
    (
        "415",
        "UNSUPPORTED_MEDIA_TYPE: a body that is not application/json",
    ),
    ("503", "UNAVAILABLE: the store cannot be reached"),
];

fn error_response(description: &str) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": reference("Error")}}})
}

fn path_parameter(name: &str) -> Value {
    let description = match name {
        "schedule_id" => "<job_id>@<schedule_no>; a shard is <schedule_id>#<index> (%23 in a URL)",
        _ => "[A-Za-z0-9._-]{1,128}, not . or ..",
    };
    json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}, "description": description})
}

fn operation(op: &Op, schemas: &mut Schemas) -> Value {
    let Some(method) = op.descriptor() else {
        return Value::Null;
    };
    let mut parameters: Vec<Value> = op.bind.iter().map(|(p, _)| path_parameter(p)).collect();
    let input = method.input();
    for name in query_names(op) {
        if let Some(f) = input.get_field_by_name(&name) {
            let schema = if f.is_map() {
                json!({"type": "array", "items": {"type": "string", "pattern": "^[^=]+=.*$"}})
            } else {
                match f.kind() {
                    // A query takes an enum by its full or short name, any case.
                    Kind::Enum(_) => json!({"type": "string"}),
                    _ => schemas.field(&f),
                }
            };
            let mut p = json!({"name": name, "in": "query", "required": false, "schema": schema});
            if f.is_map() {
                p["description"] = json!("key=value, repeatable");
                p["explode"] = json!(true);
            } else if let Kind::Enum(e) = f.kind() {
                p["description"] = json!(format!(
                    "a {} by its name, or the part after the prefix",
                    e.name()
                ));
            }
            parameters.push(p);
        }
    }
    let mut responses = Map::new();
    let answer = schemas.message(&method.output());
    // A stream answers newline-delimited JSON: each line one message of the schema (or,
    // ending a stream that failed midway, one Error).
    let media = if op.success == Success::Lines {
        NDJSON
    } else {
        "application/json"
    };
    for (code, what) in op.success.statuses() {
        responses.insert(
            code.to_string(),
            json!({"description": format!("{what}: the {}", method.output().name()),
                   "content": {media: {"schema": answer}}}),
        );
    }
    for (code, _) in ERRORS {
        responses.insert(
            (*code).into(),
            json!({"$ref": format!("#/components/responses/E{code}")}),
        );
    }
    let mut out = json!({
        "operationId": op.id(),
        "summary": op.summary,
        "description": format!("gRPC sundial.v1.{}/{}", op.service, op.method),
        "tags": [op.service],
        "parameters": parameters,
        "responses": responses,
    });
    if op.body {
        out["requestBody"] = json!({
            "required": false,
            "description": "the request message; an empty body is the message with every field at its default",
            "content": {"application/json": {"schema": schemas.message(&input)}}
        });
    }
    out
}

fn build() -> Value {
    let mut schemas = Schemas::default();
    let mut paths: BTreeMap<&str, Map<String, Value>> = BTreeMap::new();
    for op in OPS {
        let value = operation(op, &mut schemas);
        paths
            .entry(op.path)
            .or_default()
            .insert(op.verb.as_str().to_ascii_lowercase(), value);
    }
    let mut paths: Map<String, Value> = paths
        .into_iter()
        .map(|(k, v)| (k.to_owned(), Value::Object(v)))
        .collect();
    for (path, item) in hand_written_paths() {
        paths.insert(path.to_owned(), item);
    }
    let mut components = schemas.0;
    components.extend(hand_written_schemas());
    let mut responses = Map::new();
    for (code, what) in ERRORS {
        responses.insert(format!("E{code}"), error_response(what));
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Sundial API",
            "version": "v1",
            "description": "Every operation of the gRPC JobService, RunService, NodeService and AppService over JSON. Requests and answers are the gRPC messages in the proto's canonical JSON mapping: answers use lowerCamelCase names and leave out fields at their default value; requests may use lowerCamelCase or the proto names, give 64-bit integers as numbers or strings, enums by name, bytes as base64. A success is 200; every failure is {\"error\": {\"code\", \"message\"}} with the gRPC code's name and the HTTP status mapped from it."
        },
        "paths": paths,
        "security": [{"bearer": []}, {"appSignature": []}],
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "a token given to the server with --bearer-token"},
                "appSignature": {"type": "apiKey", "in": "header", "name": "X-Sundial-Signature", "description": "with X-Sundial-App-Id, X-Sundial-Timestamp (unix seconds, within 5 minutes) and X-Sundial-Nonce (single use): lowercase hex HMAC-SHA256, keyed with the base64-decoded part of the app's whsec_ secret, of METHOD \\n PATH (with ?query) \\n TIMESTAMP \\n NONCE \\n followed by the raw body"}
            },
            "responses": responses,
            "schemas": components,
        }
    })
}

/// The routes not generated from the operations table.
fn hand_written_paths() -> Vec<(&'static str, Value)> {
    let errors = json!({
        "400": {"$ref": "#/components/responses/E400"},
        "401": {"$ref": "#/components/responses/E401"},
        "404": {"$ref": "#/components/responses/E404"},
        "503": {"$ref": "#/components/responses/E503"},
    });
    let mut task_responses = errors;
    task_responses["200"] = json!({"description": "the job's status", "content": {"application/json": {"schema": reference("Task")}}});
    vec![
        (
            "/api/v1/tasks/{job_id}",
            json!({"get": {
                "operationId": "GetTask",
                "summary": "A job's status in the older flat shape (snake_case, short state names, times as numbers): latest run and next fire times",
                "tags": ["Status"],
                "parameters": [path_parameter("job_id")],
                "responses": task_responses
            }}),
        ),
        (
            "/api/v1/whoami",
            json!({"get": {"operationId": "WhoAmI", "summary": "Who the request's credentials are: caller (open in dev mode, admin, app or reader), its name, mayWrite, devMode", "tags": ["Status"],
                "responses": {"200": {"description": "the caller", "content": {"application/json": {"schema": {"type": "object", "properties": {
                    "caller": {"type": "string", "enum": ["open", "admin", "app", "reader"]},
                    "name": {"type": "string"}, "mayWrite": {"type": "boolean"}, "devMode": {"type": "boolean"}}}}}},
                    "401": {"$ref": "#/components/responses/E401"}}}}),
        ),
        (
            "/api/v1/openapi.json",
            json!({"get": {"operationId": "GetOpenApi", "summary": "This document", "tags": ["Status"],
                "responses": {"200": {"description": "the OpenAPI 3.1 document", "content": {"application/json": {"schema": {"type": "object"}}}}}}}),
        ),
        (
            "/healthz",
            json!({"get": {"operationId": "Healthz", "summary": "Liveness (no credentials needed)", "tags": ["Status"], "security": [],
                "responses": {"200": {"description": "ok", "content": {"text/plain": {"schema": {"type": "string"}}}}}}}),
        ),
        (
            "/metrics",
            json!({"get": {"operationId": "Metrics", "summary": "Prometheus metrics, text format 0.0.4 (no credentials needed)", "tags": ["Status"], "security": [],
                "responses": {"200": {"description": "the exposition", "content": {"text/plain": {"schema": {"type": "string"}}}}}}}),
        ),
    ]
}

/// The schemas of the older status route and of the error shape.
fn hand_written_schemas() -> Vec<(String, Value)> {
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
    let int = json!({"type": "integer"});
    let text = json!({"type": "string"});
    let ms = json!({"type": "integer", "format": "int64"});
    vec![
        (
            "Error".into(),
            json!({"type": "object", "required": ["error"], "additionalProperties": false, "properties": {
                "error": {"type": "object", "required": ["code", "message"], "additionalProperties": false, "properties": {
                    "code": {"type": "string", "description": "the gRPC code's name (INVALID_ARGUMENT…), or METHOD_NOT_ALLOWED, PAYLOAD_TOO_LARGE, UNSUPPORTED_MEDIA_TYPE"},
                    "message": {"type": "string", "description": "what is wrong, naming the field"}
                }}
            }}),
        ),
        (
            "TaskRun".into(),
            json!({"type": "object", "additionalProperties": false, "properties": {
                "schedule_id": text, "job_id": text, "schedule_no": text,
                "state": {"type": "string", "enum": run_states},
                "trigger_kind": {"type": "string", "enum": ["CRON", "MISFIRE", "MANUAL", "RETRY"]},
                "attempt": int, "fencing_token": {"type": "string", "pattern": "^[0-9]+$"}, "node_id": text,
                "scheduled_at_ms": ms, "triggered_at_ms": ms,
                "started_at_ms": {"type": ["integer", "null"]}, "finished_at_ms": {"type": ["integer", "null"]},
                "error_code": text, "error_message": text, "reason": text, "job_version": int,
                "output": {"type": "string", "contentEncoding": "base64"}, "progress_percent": int, "progress_message": text,
                "shard_total": int, "shards_done": int, "shards_succeeded": int,
                "shard_index": int, "parent_schedule_id": text,
                "callback_state": {"type": "string", "enum": ["NONE", "PENDING", "DONE", "FAILED"]},
                "callback_attempts": int, "callback_status": int, "callback_error": text
            }}),
        ),
        (
            "Task".into(),
            json!({"type": "object", "additionalProperties": false, "properties": {
                "job_id": text, "version": int,
                "state": {"type": "string", "enum": ["ACTIVE", "PAUSED", "FINISHED"]},
                "next_fire_times_ms": {"type": "array", "items": ms},
                "latest_run": {"oneOf": [reference("TaskRun"), {"type": "null"}]}
            }}),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_is_documented_with_its_schemas() {
        let doc = document();
        assert_eq!(doc["openapi"], "3.1.0");
        for op in OPS {
            let verb = op.verb.as_str().to_ascii_lowercase();
            let o = &doc["paths"][op.path][&verb];
            assert_eq!(o["operationId"], op.method, "{} {}", op.path, verb);
        }
        // Every reference resolves.
        let text = doc.to_string();
        for part in text.split("\"$ref\":\"").skip(1) {
            let target = part.split('"').next().unwrap_or_default();
            let pointer = target.trim_start_matches('#');
            assert!(doc.pointer(pointer).is_some(), "{target} does not resolve");
        }
        let job = &doc["components"]["schemas"]["Job"]["properties"];
        assert_eq!(job["nextFireTimeMs"]["format"], "int64");
        assert_eq!(
            doc["components"]["schemas"]["JobState"]["enum"][1],
            "JOB_STATE_ACTIVE"
        );
    }
}
