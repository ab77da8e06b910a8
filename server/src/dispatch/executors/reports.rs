//! Run reports read off the wire: a `Result` or a `Logs` message turned into the store
//! request it makes (as the run's holder on this stream), each field cut to its bounds.

use std::sync::Mutex;

use sundial_proto::v1 as pb;
use tonic::Status;

use super::{
    MAX_ERROR_CODE_BYTES, MAX_ERROR_MESSAGE_BYTES, MAX_LOG_LINE_BYTES, MAX_LOG_LINES,
    MAX_OUTPUT_BYTES, NodeState, holder, run_ref, stored_id, truncate_utf8,
};
use crate::model::{RunState, now_ms, reported_time};
use crate::store::{Finish, Finisher, LogBatch, LogLine, Outcome};

/// A `Logs` message read: its run, and its lines to append as the run's holder on
/// this stream (each cut to its bounds, timed now by this server's clock when the
/// executor's time cannot be held). More than [`MAX_LOG_LINES`] lines is refused.
pub(super) fn log_batch_of(
    state: &Mutex<NodeState>,
    l: pb::LogLines,
) -> Result<(pb::RunRef, LogBatch), Status> {
    let run = run_ref(l.run, "logs")?;
    if l.lines.len() > MAX_LOG_LINES {
        return Err(Status::invalid_argument(format!(
            "logs.lines: more than {MAX_LOG_LINES} in one message"
        )));
    }
    let lines = l
        .lines
        .into_iter()
        .map(|e| {
            let mut message = e.message;
            truncate_utf8(&mut message, MAX_LOG_LINE_BYTES);
            let mut level = e.level;
            truncate_utf8(&mut level, 16);
            LogLine {
                seq: 0,
                time_ms: reported_time(e.time_ms).unwrap_or_else(now_ms),
                level,
                message,
                attempt: run.attempt,
            }
        })
        .collect();
    let batch = LogBatch {
        schedule_id: stored_id(&run),
        holder: holder(state, &run),
        lines,
    };
    Ok((run, batch))
}

/// A `Result` read: its run, the finish to apply (from the run's holder on this
/// stream), the state it reports and the handler's run time. An output past
/// [`MAX_OUTPUT_BYTES`] fails the attempt; error texts are cut to their bounds.
pub(super) fn result_of(
    state: &Mutex<NodeState>,
    r: pb::Result,
) -> Result<(pb::RunRef, Finish, RunState, Option<u64>), Status> {
    let run = run_ref(r.run.clone(), "result")?;
    let reported = match pb::ResultStatus::try_from(r.status) {
        Ok(pb::ResultStatus::Succeeded) => RunState::Succeeded,
        Ok(pb::ResultStatus::Failed) => RunState::Failed,
        Ok(pb::ResultStatus::Cancelled) => RunState::Cancelled,
        _ => {
            return Err(Status::invalid_argument(
                "result.status: must be SUCCEEDED, FAILED or CANCELLED",
            ));
        }
    };
    // Times the stores cannot hold (an executor's i64::MAX) count as unknown.
    let (started_at, finished_at) = (
        reported_time(r.started_at_ms),
        reported_time(r.finished_at_ms),
    );
    let duration = match (started_at, finished_at) {
        (Some(s), Some(f)) if f >= s => u64::try_from(f - s).ok(),
        _ => None,
    };
    let (ended_as, output, mut error_code, mut error_message) = if r.output.len() > MAX_OUTPUT_BYTES
    {
        // Stored whole it would swell every read of the run (and make a listing
        // pass the transport's limit): the attempt fails.
        (
            RunState::Failed,
            None,
            "output_too_large".to_owned(),
            format!(
                "the handler's output was {} bytes, more than {MAX_OUTPUT_BYTES}; it was not kept",
                r.output.len()
            ),
        )
    } else {
        (
            reported,
            (!r.output.is_empty()).then_some(r.output),
            r.error_code,
            r.error_message,
        )
    };
    truncate_utf8(&mut error_code, MAX_ERROR_CODE_BYTES);
    truncate_utf8(&mut error_message, MAX_ERROR_MESSAGE_BYTES);
    let finish = Finish {
        schedule_id: stored_id(&run),
        by: Finisher::Holder(holder(state, &run)),
        outcome: Outcome {
            state: ended_as,
            output,
            error_code,
            error_message,
            started_at,
            finished_at,
        },
        claim_webhook: None,
    };
    Ok((run, finish, ended_as, duration))
}
