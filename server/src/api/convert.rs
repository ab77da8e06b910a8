//! The one place where prost types meet the domain: `TryFrom`-style validation of
//! requests into [`model`] types (every error names the field and the reason) and the
//! conversions of domain records back to the wire.

use std::collections::BTreeMap;

use sundial_proto::v1 as pb;

use crate::model::{
    self, CallbackState, JobRecord, JobSpec, MAX_PAYLOAD_BYTES, MAX_TIME_MS, MisfirePolicy,
    OverlapPolicy, RetryPolicy, RouteStrategy, RunRecord, RunState, Target, TriggerKind,
    valid_job_id,
};
use crate::schedule::jobs::{Error, Plan, Preview};

/// Executors get an hour unless the job says otherwise.
pub const DEFAULT_TIMEOUT_MS: i64 = 3_600_000;
const MAX_NAME_BYTES: usize = 256;
const MAX_ROUTE_KEY_BYTES: usize = 256;
const MAX_LABELS: usize = 64;
const MAX_LABEL_KEY_BYTES: usize = 63;
const MAX_LABEL_VALUE_BYTES: usize = 256;
const MAX_RETRIES: i32 = 100;
const MAX_JITTER_MS: i64 = 24 * 3600 * 1000;
const MAX_CATCH_UP: i32 = 1000;
/// Most fire times one `PreviewFireTimes` call answers.
const MAX_PREVIEW_FIRES: i32 = 100;
/// The most webhooks a job may have in flight to its destination (as the server's
/// `--webhook-destination-concurrency`).
const MAX_CALLBACK_IN_FLIGHT: i32 = 10_000;
/// The longest a job's attempt may run: 30 days.
pub const MAX_TIMEOUT_MS: i64 = 30 * 24 * 3600 * 1000;
/// The longest delay before a retry, `backoff_ms` and `max_backoff_ms` alike: 7 days.
const MAX_BACKOFF_MS: i64 = 7 * 24 * 3600 * 1000;

/// `s` quoted for an error message, cut to its first 100 characters ("…" marks a cut),
/// so a huge input never makes a huge message.
pub fn quoted(s: &str) -> String {
    const MAX: usize = 100;
    match s.char_indices().nth(MAX) {
        Some((end, _)) => format!("{:?}…", &s[..end]),
        None => format!("{s:?}"),
    }
}

/// A run-list page token: the `<scheduled_at ms>:<schedule_id>` cursor a listing
/// returned (both stores use it). Anything else is refused naming `field`, rather
/// than reaching the store, which would take it for corrupt data.
pub fn run_page_token(field: &'static str, raw: &str) -> Result<Option<String>, Error> {
    if raw.is_empty() {
        return Ok(None);
    }
    let well_formed = raw.len() <= 512
        && raw
            .split_once(':')
            .is_some_and(|(at, sid)| at.parse::<i64>().is_ok() && sid.contains('@'));
    if !well_formed {
        return Err(invalid(
            field,
            format!("{} is not a page token a listing returned", quoted(raw)),
        ));
    }
    Ok(Some(raw.to_owned()))
}

/// A sequence-number page token (the run log's line, the audit log's event): the number
/// a listing returned, None when empty, anything else refused naming `field`.
pub fn seq_page_token(field: &'static str, raw: &str) -> Result<Option<u64>, Error> {
    if raw.is_empty() {
        return Ok(None);
    }
    raw.parse().map(Some).map_err(|_| {
        invalid(
            field,
            format!("{} is not a page token a listing returned", quoted(raw)),
        )
    })
}

fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::Invalid {
        field,
        reason: reason.into(),
    }
}

fn name_like(s: &str) -> bool {
    valid_job_id(s)
}

/// Validates a wire job spec into a domain spec (cron included).
pub fn job_spec(spec: Option<pb::JobSpec>) -> Result<(JobSpec, bool), Error> {
    let s = spec.ok_or_else(|| invalid("spec", "required"))?;
    if s.id.is_empty() {
        return Err(invalid("spec.id", "required"));
    }
    if !valid_job_id(&s.id) {
        return Err(invalid(
            "spec.id",
            format!("{} must match [A-Za-z0-9._-]{{1,128}}", quoted(&s.id)),
        ));
    }
    if s.name.len() > MAX_NAME_BYTES {
        return Err(invalid("spec.name", "longer than 256 bytes"));
    }
    if s.cron.trim().is_empty() {
        return Err(invalid("spec.cron", "required"));
    }
    let time_zone = if s.time_zone.is_empty() {
        "UTC".to_owned()
    } else {
        s.time_zone
    };
    let start_time = optional_time("spec.start_time_ms", s.start_time_ms)?;
    let end_time = optional_time("spec.end_time_ms", s.end_time_ms)?;
    if let (Some(a), Some(b)) = (start_time, end_time)
        && b <= a
    {
        return Err(invalid("spec.end_time_ms", "must be after start_time_ms"));
    }
    if !(0..=MAX_JITTER_MS).contains(&s.jitter_ms) {
        return Err(invalid("spec.jitter_ms", "must be between 0 and 24 h"));
    }
    let target = match s.target {
        None => return Err(invalid("spec.target", "required: executor or http")),
        Some(pb::job_spec::Target::Executor(e)) => {
            if !name_like(&e.group) {
                return Err(invalid(
                    "spec.executor.group",
                    "required, must match [A-Za-z0-9._-]{1,128}, not . or ..",
                ));
            }
            if e.handler.is_empty() || e.handler.len() > 128 {
                return Err(invalid(
                    "spec.executor.handler",
                    "required, at most 128 bytes",
                ));
            }
            Target::Executor {
                group: e.group,
                handler: e.handler,
            }
        }
        Some(pb::job_spec::Target::Http(h)) => {
            http_url("spec.http.url", &h.url)?;
            let method = if h.method.is_empty() {
                "POST".to_owned()
            } else {
                h.method.to_ascii_uppercase()
            };
            if !matches!(method.as_str(), "GET" | "POST" | "PUT" | "PATCH" | "DELETE") {
                return Err(invalid(
                    "spec.http.method",
                    format!("{method:?} is not one of GET, POST, PUT, PATCH, DELETE"),
                ));
            }
            Target::Http { url: h.url, method }
        }
    };
    let route_strategy = route_strategy(s.route_strategy)?;
    if s.route_key.len() > MAX_ROUTE_KEY_BYTES {
        return Err(invalid("spec.route_key", "longer than 256 bytes"));
    }
    let timeout_ms = match s.timeout_ms {
        None => DEFAULT_TIMEOUT_MS,
        Some(t) if t <= 0 => return Err(invalid("spec.timeout_ms", "must be > 0")),
        Some(t) if t > MAX_TIMEOUT_MS => {
            return Err(invalid(
                "spec.timeout_ms",
                format!("{t} is more than 30 days ({MAX_TIMEOUT_MS} ms)"),
            ));
        }
        Some(t) => t,
    };
    let retry = retry_policy(s.retry)?;
    let misfire_policy = match pb::MisfirePolicy::try_from(s.misfire_policy) {
        Ok(pb::MisfirePolicy::Unspecified | pb::MisfirePolicy::FireOnce) => MisfirePolicy::FireOnce,
        Ok(pb::MisfirePolicy::Skip) => MisfirePolicy::Skip,
        Ok(pb::MisfirePolicy::CatchUp) => MisfirePolicy::CatchUp,
        Err(_) => {
            return Err(invalid(
                "spec.misfire_policy",
                format!("unknown value {}", s.misfire_policy),
            ));
        }
    };
    if !(0..=MAX_CATCH_UP).contains(&s.misfire_catch_up_limit) {
        return Err(invalid(
            "spec.misfire_catch_up_limit",
            "must be between 0 (default 10) and 1000",
        ));
    }
    let overlap_policy = match pb::OverlapPolicy::try_from(s.overlap_policy) {
        Ok(pb::OverlapPolicy::Unspecified | pb::OverlapPolicy::Allow) => OverlapPolicy::Allow,
        Ok(pb::OverlapPolicy::Forbid) => OverlapPolicy::Forbid,
        Ok(pb::OverlapPolicy::Serial) => OverlapPolicy::Serial,
        Ok(pb::OverlapPolicy::Replace) => OverlapPolicy::Replace,
        Err(_) => {
            return Err(invalid(
                "spec.overlap_policy",
                format!("unknown value {}", s.overlap_policy),
            ));
        }
    };
    let callback_url = if s.callback_url.is_empty() {
        None
    } else {
        http_url("spec.callback_url", &s.callback_url)?;
        Some(s.callback_url)
    };
    if !(0..=MAX_CALLBACK_IN_FLIGHT).contains(&s.callback_max_in_flight) {
        return Err(invalid(
            "spec.callback_max_in_flight",
            format!(
                "{} is not between 0 (the server's default) and {MAX_CALLBACK_IN_FLIGHT}",
                s.callback_max_in_flight
            ),
        ));
    }
    if !s.app_id.is_empty() && !name_like(&s.app_id) {
        return Err(invalid(
            "spec.app_id",
            "must match [A-Za-z0-9._-]{1,128}, not . or ..",
        ));
    }
    if s.payload.len() > MAX_PAYLOAD_BYTES {
        return Err(invalid(
            "spec.payload",
            format!("{} bytes is more than 64 KiB", s.payload.len()),
        ));
    }
    let labels = labels(s.labels)?;
    let spec = JobSpec {
        id: s.id,
        name: s.name,
        cron: s.cron.trim().to_owned(),
        time_zone,
        start_time,
        end_time,
        jitter_ms: s.jitter_ms,
        target,
        route_strategy,
        route_key: s.route_key,
        timeout_ms,
        retry,
        misfire_policy,
        misfire_catch_up_limit: s.misfire_catch_up_limit as u32,
        overlap_policy,
        callback_url,
        callback_max_in_flight: s.callback_max_in_flight as u32,
        app_id: s.app_id,
        payload: s.payload,
        labels,
    };
    // Parse the cron here too, so a bad one is reported with the `spec.` prefix.
    Plan::new(spec.clone()).map_err(|e| match e {
        Error::Invalid { field, reason } => Error::Invalid {
            field: if field == "time_zone" {
                "spec.time_zone"
            } else {
                "spec.cron"
            },
            reason,
        },
        other => other,
    })?;
    Ok((spec, s.paused))
}

/// Validates a `PreviewFireTimes` request; the cron and zone are parsed by
/// [`Jobs::preview`](crate::schedule::jobs::Jobs::preview), naming `cron` or `time_zone`.
pub fn preview(r: pb::PreviewFireTimesRequest) -> Result<Preview, Error> {
    if r.cron.trim().is_empty() {
        return Err(invalid("cron", "required"));
    }
    let start = optional_time("start_time_ms", r.start_time_ms)?;
    let end = optional_time("end_time_ms", r.end_time_ms)?;
    if let (Some(a), Some(b)) = (start, end)
        && b <= a
    {
        return Err(invalid("end_time_ms", "must be after start_time_ms"));
    }
    let after = optional_time("after_ms", r.after_ms)?;
    let count = match r.count {
        0 => 5,
        n if (1..=MAX_PREVIEW_FIRES).contains(&n) => n as usize,
        n => {
            return Err(invalid(
                "count",
                format!("{n} is not between 0 and {MAX_PREVIEW_FIRES}"),
            ));
        }
    };
    Ok(Preview {
        cron: r.cron.trim().to_owned(),
        time_zone: if r.time_zone.is_empty() {
            "UTC".to_owned()
        } else {
            r.time_zone
        },
        start,
        end,
        after,
        count,
    })
}

fn optional_time(field: &'static str, v: i64) -> Result<Option<model::Millis>, Error> {
    match v {
        0 => Ok(None),
        v if v < 0 => Err(invalid(field, "must be ≥ 0 (epoch ms)")),
        v if v >= MAX_TIME_MS => Err(invalid(
            field,
            format!("{v} is not before the year 3000 ({MAX_TIME_MS} epoch ms)"),
        )),
        v => Ok(Some(v)),
    }
}

fn http_url(field: &'static str, raw: &str) -> Result<(), Error> {
    let u = url::Url::parse(raw).map_err(|e| invalid(field, format!("{}: {e}", quoted(raw))))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(invalid(
            field,
            format!("scheme {:?} is not http or https", u.scheme()),
        ));
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err(invalid(field, "has no host"));
    }
    Ok(())
}

fn route_strategy(v: i32) -> Result<RouteStrategy, Error> {
    use pb::RouteStrategy as R;
    Ok(match R::try_from(v) {
        Ok(R::Unspecified | R::RoundRobin) => RouteStrategy::RoundRobin,
        Ok(R::WeightedRoundRobin) => RouteStrategy::WeightedRoundRobin,
        Ok(R::Random) => RouteStrategy::Random,
        Ok(R::LeastActive) => RouteStrategy::LeastActive,
        Ok(R::ConsistentHash) => RouteStrategy::ConsistentHash,
        Ok(R::Busyover) => RouteStrategy::Busyover,
        Ok(R::Failover) => RouteStrategy::Failover,
        Ok(R::First) => RouteStrategy::First,
        Ok(R::ShardingBroadcast) => RouteStrategy::ShardingBroadcast,
        Err(_) => {
            return Err(invalid("spec.route_strategy", format!("unknown value {v}")));
        }
    })
}

fn retry_policy(r: Option<pb::RetryPolicy>) -> Result<RetryPolicy, Error> {
    let Some(r) = r else {
        return Ok(RetryPolicy::default());
    };
    if r.max_retries < 0 {
        return Err(invalid("spec.retry.max_retries", "must be ≥ 0"));
    }
    if r.max_retries > MAX_RETRIES {
        return Err(invalid("spec.retry.max_retries", "must be ≤ 100"));
    }
    if !(0..=MAX_BACKOFF_MS).contains(&r.backoff_ms) {
        return Err(invalid(
            "spec.retry.backoff_ms",
            format!(
                "{} must be between 0 and 7 days ({MAX_BACKOFF_MS} ms)",
                r.backoff_ms
            ),
        ));
    }
    if !r.backoff_multiplier.is_finite() || !(0.0..=100.0).contains(&r.backoff_multiplier) {
        return Err(invalid(
            "spec.retry.backoff_multiplier",
            "must be a number between 0 and 100",
        ));
    }
    if !(0..=MAX_BACKOFF_MS).contains(&r.max_backoff_ms) {
        return Err(invalid(
            "spec.retry.max_backoff_ms",
            format!(
                "{} must be between 0 and 7 days ({MAX_BACKOFF_MS} ms)",
                r.max_backoff_ms
            ),
        ));
    }
    Ok(RetryPolicy {
        max_retries: r.max_retries as u32,
        backoff_ms: r.backoff_ms,
        backoff_multiplier: r.backoff_multiplier,
        max_backoff_ms: r.max_backoff_ms,
    })
}

fn labels(
    raw: std::collections::HashMap<String, String>,
) -> Result<BTreeMap<String, String>, Error> {
    if raw.len() > MAX_LABELS {
        return Err(invalid("spec.labels", "more than 64 labels"));
    }
    for (k, v) in &raw {
        let key_ok = !k.is_empty()
            && k.len() <= MAX_LABEL_KEY_BYTES
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/'));
        if !key_ok {
            return Err(invalid(
                "spec.labels",
                format!("key {k:?} must match [A-Za-z0-9._/-]{{1,63}}"),
            ));
        }
        if v.len() > MAX_LABEL_VALUE_BYTES {
            return Err(invalid(
                "spec.labels",
                format!("value of {k:?} is longer than 256 bytes"),
            ));
        }
    }
    Ok(raw.into_iter().collect())
}

/// A job id from a request field.
pub fn job_id(field: &'static str, id: &str) -> Result<String, Error> {
    if id.is_empty() {
        return Err(invalid(field, "required"));
    }
    if !valid_job_id(id) {
        return Err(invalid(
            field,
            format!("{} must match [A-Za-z0-9._-]{{1,128}}", quoted(id)),
        ));
    }
    Ok(id.to_owned())
}

pub fn job_state(job: &JobRecord) -> pb::JobState {
    if job.paused {
        pb::JobState::Paused
    } else if job.next_fire.is_none() {
        pb::JobState::Finished
    } else {
        pb::JobState::Active
    }
}

pub fn job_to_pb(job: JobRecord) -> pb::Job {
    let state = job_state(&job) as i32;
    let s = job.spec;
    let target = Some(match s.target {
        Target::Executor { group, handler } => {
            pb::job_spec::Target::Executor(pb::ExecutorTarget { group, handler })
        }
        Target::Http { url, method } => pb::job_spec::Target::Http(pb::HttpTarget { url, method }),
    });
    let route_strategy = match s.route_strategy {
        RouteStrategy::RoundRobin => pb::RouteStrategy::RoundRobin,
        RouteStrategy::WeightedRoundRobin => pb::RouteStrategy::WeightedRoundRobin,
        RouteStrategy::Random => pb::RouteStrategy::Random,
        RouteStrategy::LeastActive => pb::RouteStrategy::LeastActive,
        RouteStrategy::ConsistentHash => pb::RouteStrategy::ConsistentHash,
        RouteStrategy::Busyover => pb::RouteStrategy::Busyover,
        RouteStrategy::Failover => pb::RouteStrategy::Failover,
        RouteStrategy::First => pb::RouteStrategy::First,
        RouteStrategy::ShardingBroadcast => pb::RouteStrategy::ShardingBroadcast,
    };
    let misfire_policy = match s.misfire_policy {
        MisfirePolicy::FireOnce => pb::MisfirePolicy::FireOnce,
        MisfirePolicy::Skip => pb::MisfirePolicy::Skip,
        MisfirePolicy::CatchUp => pb::MisfirePolicy::CatchUp,
    };
    let overlap_policy = match s.overlap_policy {
        OverlapPolicy::Allow => pb::OverlapPolicy::Allow,
        OverlapPolicy::Forbid => pb::OverlapPolicy::Forbid,
        OverlapPolicy::Serial => pb::OverlapPolicy::Serial,
        OverlapPolicy::Replace => pb::OverlapPolicy::Replace,
    };
    pb::Job {
        spec: Some(pb::JobSpec {
            id: s.id,
            name: s.name,
            cron: s.cron,
            time_zone: s.time_zone,
            start_time_ms: s.start_time.unwrap_or(0),
            end_time_ms: s.end_time.unwrap_or(0),
            jitter_ms: s.jitter_ms,
            target,
            route_strategy: route_strategy as i32,
            route_key: s.route_key,
            timeout_ms: Some(s.timeout_ms),
            retry: Some(pb::RetryPolicy {
                max_retries: s.retry.max_retries as i32,
                backoff_ms: s.retry.backoff_ms,
                backoff_multiplier: s.retry.backoff_multiplier,
                max_backoff_ms: s.retry.max_backoff_ms,
            }),
            misfire_policy: misfire_policy as i32,
            misfire_catch_up_limit: s.misfire_catch_up_limit as i32,
            overlap_policy: overlap_policy as i32,
            callback_url: s.callback_url.unwrap_or_default(),
            callback_max_in_flight: i32::try_from(s.callback_max_in_flight).unwrap_or(i32::MAX),
            app_id: s.app_id,
            payload: s.payload,
            labels: s.labels.into_iter().collect(),
            paused: job.paused,
        }),
        version: job.version,
        state,
        next_fire_time_ms: job.next_fire.map_or(0, |a| a.planned),
        created_at_ms: job.created_at,
        updated_at_ms: job.updated_at,
    }
}

pub fn run_state_to_pb(s: RunState) -> pb::RunState {
    match s {
        RunState::Triggered => pb::RunState::Triggered,
        RunState::Waiting => pb::RunState::Waiting,
        RunState::Dispatched => pb::RunState::Dispatched,
        RunState::Running => pb::RunState::Running,
        RunState::Succeeded => pb::RunState::Succeeded,
        RunState::Failed => pb::RunState::Failed,
        RunState::TimedOut => pb::RunState::TimedOut,
        RunState::Cancelled => pb::RunState::Cancelled,
        RunState::Skipped => pb::RunState::Skipped,
    }
}

/// A run-state filter from a request (UNSPECIFIED = any).
pub fn run_state_filter(v: i32) -> Result<Option<RunState>, Error> {
    Ok(match pb::RunState::try_from(v) {
        Ok(pb::RunState::Unspecified) => None,
        Ok(pb::RunState::Triggered) => Some(RunState::Triggered),
        Ok(pb::RunState::Waiting) => Some(RunState::Waiting),
        Ok(pb::RunState::Dispatched) => Some(RunState::Dispatched),
        Ok(pb::RunState::Running) => Some(RunState::Running),
        Ok(pb::RunState::Succeeded) => Some(RunState::Succeeded),
        Ok(pb::RunState::Failed) => Some(RunState::Failed),
        Ok(pb::RunState::TimedOut) => Some(RunState::TimedOut),
        Ok(pb::RunState::Cancelled) => Some(RunState::Cancelled),
        Ok(pb::RunState::Skipped) => Some(RunState::Skipped),
        Err(_) => return Err(invalid("state", format!("unknown value {v}"))),
    })
}

pub fn job_state_filter(v: i32) -> Result<Option<pb::JobState>, Error> {
    match pb::JobState::try_from(v) {
        Ok(pb::JobState::Unspecified) => Ok(None),
        Ok(s) => Ok(Some(s)),
        Err(_) => Err(invalid("state", format!("unknown value {v}"))),
    }
}

pub fn callback_state_to_pb(s: CallbackState) -> pb::CallbackState {
    match s {
        CallbackState::None => pb::CallbackState::Unspecified,
        CallbackState::Pending => pb::CallbackState::Pending,
        CallbackState::Done => pb::CallbackState::Done,
        CallbackState::Failed => pb::CallbackState::Failed,
    }
}

pub fn run_to_pb(r: RunRecord) -> pb::Run {
    let kind = match r.kind {
        TriggerKind::Cron => pb::TriggerKind::Cron,
        TriggerKind::Misfire => pb::TriggerKind::Misfire,
        TriggerKind::Manual => pb::TriggerKind::Manual,
        TriggerKind::Retry => pb::TriggerKind::Retry,
    };
    pb::Run {
        schedule_id: r.schedule_id,
        job_id: r.job_id,
        schedule_no: r.schedule_no,
        state: run_state_to_pb(r.state) as i32,
        trigger_kind: kind as i32,
        attempt: r.attempt,
        fencing_token: r.fencing_token,
        node_id: r.node_id,
        scheduled_at_ms: r.scheduled_at,
        triggered_at_ms: r.triggered_at,
        started_at_ms: r.started_at.unwrap_or(0),
        finished_at_ms: r.finished_at.unwrap_or(0),
        error_code: r.error_code,
        error_message: r.error_message,
        output: r.output.unwrap_or_default(),
        callback_state: callback_state_to_pb(r.callback_state) as i32,
        job_version: r.job_version,
        reason: r.reason,
        progress_percent: r.progress_percent,
        progress_message: r.progress_message,
        shard_total: r.shard_total,
        shards_done: r.shards_done,
        shards_succeeded: r.shards_succeeded,
        shard_index: r.shard_index,
        parent_schedule_id: r.parent,
        callback_attempts: r.callback_attempts,
        callback_status: u32::from(r.callback_status),
        callback_error: r.callback_error,
        history: r
            .history
            .into_iter()
            .map(|e| pb::RunEvent {
                at_ms: e.at,
                what: e.what,
                attempt: e.attempt,
                node_id: e.node_id,
                detail: e.detail,
            })
            .collect(),
    }
}

/// Page sizes: 0 means the default (100), anything above 1000 is refused.
pub fn page_size(field: &'static str, v: i32) -> Result<usize, Error> {
    match v {
        0 => Ok(100),
        v if v < 0 => Err(invalid(field, "must be ≥ 0")),
        v if v > 1000 => Err(invalid(field, "must be ≤ 1000")),
        v => Ok(v as usize),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            ".{0,40}",
            "[A-Za-z0-9._@ -]{0,140}",
            Just(String::new()),
            Just("* * * * * *".to_owned()),
            Just("0 0 10 ? * 6#3".to_owned()),
            Just("http://example.com/hook".to_owned()),
        ]
    }

    fn any_spec() -> impl Strategy<Value = pb::JobSpec> {
        (
            (text(), text(), text(), text()),
            (any::<i64>(), any::<i64>(), any::<i64>()),
            (any::<i32>(), any::<i32>(), any::<i32>(), any::<i32>()),
            (
                proptest::option::of(any::<i64>()),
                any::<i32>(),
                any::<f64>(),
            ),
            (text(), text(), 0usize..70_000, 0u8..3),
        )
            .prop_map(
                |(
                    (id, cron, tz, url),
                    (start, end, jitter),
                    (strategy, misfire, overlap, catch_up),
                    (timeout, retries, multiplier),
                    (group, handler, payload_len, target),
                )| pb::JobSpec {
                    id,
                    cron,
                    time_zone: tz,
                    start_time_ms: start,
                    end_time_ms: end,
                    jitter_ms: jitter,
                    target: match target {
                        0 => None,
                        1 => Some(pb::job_spec::Target::Executor(pb::ExecutorTarget {
                            group,
                            handler,
                        })),
                        _ => Some(pb::job_spec::Target::Http(pb::HttpTarget {
                            url: url.clone(),
                            method: handler,
                        })),
                    },
                    route_strategy: strategy,
                    timeout_ms: timeout,
                    retry: Some(pb::RetryPolicy {
                        max_retries: retries,
                        backoff_ms: jitter,
                        backoff_multiplier: multiplier,
                        max_backoff_ms: end,
                    }),
                    misfire_policy: misfire,
                    misfire_catch_up_limit: catch_up,
                    overlap_policy: overlap,
                    callback_url: url,
                    callback_max_in_flight: catch_up,
                    payload: vec![0; payload_len],
                    ..Default::default()
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any request either validates or is refused with a field-named error; it
        /// never panics, and what validates round-trips through the wire form.
        #[test]
        fn validation_never_panics(spec in any_spec()) {
            match job_spec(Some(spec)) {
                Ok((spec, paused)) => {
                    let record = JobRecord {
                        spec: spec.clone(),
                        version: 1,
                        paused,
                        next_fire: None,
                        created_at: 0,
                        updated_at: 0,
                    };
                    let wire = job_to_pb(record);
                    let (again, _) = job_spec(wire.spec).expect("a valid spec stays valid");
                    prop_assert_eq!(again, spec);
                }
                Err(Error::Invalid { field, reason }) => {
                    prop_assert!(field.starts_with("spec"), "{field}");
                    prop_assert!(!reason.is_empty());
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }
    }

    #[test]
    fn page_tokens_are_checked_before_the_store() {
        assert_eq!(run_page_token("page_token", "").expect("empty"), None);
        assert_eq!(
            run_page_token("page_token", "1764680400000:job@1764680400000").expect("well formed"),
            Some("1764680400000:job@1764680400000".to_owned())
        );
        for bad in ["garbage", "12:no-at", "x:job@1", &"9".repeat(600)] {
            let e = run_page_token("page_token", bad)
                .expect_err("refused")
                .to_string();
            assert!(e.starts_with("page_token: "), "{e}");
            assert!(e.len() < 200, "a {} byte message", e.len());
        }
    }

    #[test]
    fn sequence_page_tokens_are_numbers() {
        assert_eq!(seq_page_token("page_token", "").expect("empty"), None);
        assert_eq!(
            seq_page_token("page_token", "42").expect("a number"),
            Some(42)
        );
        for bad in ["garbage", "-1", "1.5", &"9".repeat(600)] {
            let e = crate::api::status(seq_page_token("page_token", bad).expect_err("refused"));
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(
                e.message().starts_with("page_token: ")
                    && e.message()
                        .ends_with(" is not a page token a listing returned"),
                "{}",
                e.message()
            );
            assert!(
                e.message().len() < 200,
                "a {} byte message",
                e.message().len()
            );
        }
    }

    #[test]
    fn quoted_input_is_cut_at_100_characters() {
        assert_eq!(quoted("abc"), "\"abc\"");
        let long = "é".repeat(500);
        let q = quoted(&long);
        assert_eq!(q.chars().count(), 100 + 3, "{q}");
        assert!(q.ends_with('…'));
    }
}
