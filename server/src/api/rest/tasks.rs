//! `GET /api/v1/tasks/{job_id}`, the status route that predates the operations of
//! [`super::ops`]: a job's state, next fire times and latest run in its own flat shape
//! (snake_case, states by their short names, times as JSON numbers), kept for the
//! callers written against it. `GET /api/v1/jobs/{job_id}/status` is its twin in the
//! canonical mapping.

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};

use super::ApiError;
use crate::api::convert;
use crate::api::queries::{self, StatusSource};
use crate::model::{CallbackState, RunRecord, RunState};

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

fn job_id(raw: &str) -> Result<String, ApiError> {
    convert::job_id("job_id", raw).map_err(ApiError::from)
}

pub(super) async fn task_status(
    State(source): State<StatusSource>,
    Path(raw): Path<String>,
) -> Result<Json<TaskView>, ApiError> {
    let id = job_id(&raw)?;
    let st = queries::job_status(&source.jobs, source.runs.as_ref(), &id, 5).await?;
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
