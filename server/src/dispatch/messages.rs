//! The server's messages to executors built from the run machine's records: the one
//! place where a dispatch or a cancel becomes protobuf. The dispatcher decides and
//! hands records to [`Links`](super::links::Links), which builds these at the stream
//! edge (a node's stream here, or another instance's inbox).

use sundial_proto::v1 as pb;

use crate::model::{JobRecord, RunRecord, Target};
use crate::store::Revocation;

/// The `Dispatch` of `run`, leased under its fencing token, for `job`'s handler, with
/// its payload (a manual trigger's override, else the job's) and `route_key`.
pub fn dispatch(run: &RunRecord, job: &JobRecord, route_key: &str) -> pb::server_message::Msg {
    let handler = match &job.spec.target {
        Target::Executor { handler, .. } => handler.clone(),
        Target::Http { .. } => String::new(),
    };
    pb::server_message::Msg::Dispatch(pb::Dispatch {
        run: Some(pb::RunRef {
            schedule_id: run.wire_id().to_owned(),
            attempt: run.attempt,
            fencing_token: run.fencing_token,
            shard_index: run.shard_index,
        }),
        job_id: run.job_id.clone(),
        handler,
        payload: run
            .payload_override
            .clone()
            .unwrap_or_else(|| job.spec.payload.clone()),
        route_key: route_key.to_owned(),
        shard_total: run.shard_total.max(1),
        deadline_ms: run.plan.timeout_ms,
        scheduled_at_ms: run.scheduled_at,
        labels: job.spec.labels.clone().into_iter().collect(),
    })
}

/// The `Cancel` of the revoked lease `rv` (its run, attempt and token, and why).
pub fn cancel(rv: &Revocation) -> pb::server_message::Msg {
    let (schedule_id, shard_index) = RunRecord::wire_ref(&rv.schedule_id);
    pb::server_message::Msg::Cancel(pb::Cancel {
        run: Some(pb::RunRef {
            schedule_id: schedule_id.to_owned(),
            attempt: rv.attempt,
            fencing_token: rv.token,
            shard_index,
        }),
        reason: rv.reason.clone(),
    })
}
