//! The domain vocabulary: validated jobs, triggers and runs as the core sees them.
//!
//! Prost types never reach past `api::convert`; everything below the API works on these
//! types, which can only be built from input that passed validation. They are also what
//! the store persists (as JSON), so a field added here must stay `serde(default)`-able.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Epoch milliseconds, UTC. The store's clock decides what "now" is.
pub type Millis = i64;

/// A duration in whole milliseconds, saturating.
pub fn duration_ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A duration in whole microseconds, saturating.
pub fn duration_us(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// This machine's wall clock in epoch ms: for times an executor or target reports,
/// never for decisions (those use the store's clock).
pub fn now_ms() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The longest job id we accept (`[A-Za-z0-9._-]{1,128}`).
pub const MAX_JOB_ID_LEN: usize = 128;
/// The largest payload a job or a manual trigger may carry.
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;

/// The latest time a job spec or an executor may give: 3000-01-01T00:00:00Z. Every
/// time the stores handle stays below 10^14 ms, the largest integer Lua's cjson writes
/// back exactly (it keeps 14 significant digits).
pub const MAX_TIME_MS: i64 = 32_503_680_000_000;

/// A time an executor reported, kept only when it is one the stores can hold (after
/// 1970, before the year 3000); any other counts as unknown.
pub fn reported_time(ms: i64) -> Option<Millis> {
    (ms > 0 && ms < MAX_TIME_MS).then_some(ms)
}

/// Where a run executes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Target {
    /// An executor of `group` that registered `handler`.
    Executor { group: String, handler: String },
    /// The server calls this URL itself.
    Http { url: String, method: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RouteStrategy {
    #[default]
    RoundRobin,
    WeightedRoundRobin,
    Random,
    LeastActive,
    ConsistentHash,
    Busyover,
    Failover,
    First,
    ShardingBroadcast,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum MisfirePolicy {
    #[default]
    FireOnce,
    Skip,
    CatchUp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OverlapPolicy {
    #[default]
    Allow,
    Forbid,
    Serial,
    Replace,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct RetryPolicy {
    pub max_retries: u32,
    pub backoff_ms: i64,
    pub backoff_multiplier: f64,
    pub max_backoff_ms: i64,
}

/// A validated job definition: what the user asked for, nothing derived.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    pub id: String,
    pub name: String,
    pub cron: String,
    pub time_zone: String,
    pub start_time: Option<Millis>,
    pub end_time: Option<Millis>,
    pub jitter_ms: i64,
    pub target: Target,
    pub route_strategy: RouteStrategy,
    pub route_key: String,
    pub timeout_ms: i64,
    pub retry: RetryPolicy,
    pub misfire_policy: MisfirePolicy,
    pub misfire_catch_up_limit: u32,
    pub overlap_policy: OverlapPolicy,
    pub callback_url: Option<String>,
    /// At most this many webhooks in flight to the callback's destination while this
    /// job's are sent; 0 = the server's default.
    #[serde(default)]
    pub callback_max_in_flight: u32,
    pub app_id: String,
    #[serde(with = "b64")]
    pub payload: Vec<u8>,
    pub labels: BTreeMap<String, String>,
}

/// A job as stored: the spec plus the state the store maintains for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub spec: JobSpec,
    /// Grows by one at every change; a fire claim computed from an older version fails.
    pub version: u64,
    pub paused: bool,
    /// The armed fire, if any. `None` while paused or once the schedule has ended.
    pub next_fire: Option<Arm>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// One armed fire: the planned time (the `schedule_no`) and when it is due, which is
/// later than planned by the job's stable jitter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Arm {
    pub planned: Millis,
    pub due: Millis,
}

/// Why a trigger exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TriggerKind {
    Cron,
    /// A cron fire claimed later than the misfire threshold and run per the policy.
    Misfire,
    Manual,
    Retry,
}

/// A request to create a run, queued between the scheduler (or TriggerJob) and dispatch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trigger {
    pub job_id: String,
    /// Planned fire time in epoch ms for cron fires, `manual-<id>` for manual ones.
    pub schedule_no: String,
    pub kind: TriggerKind,
    pub scheduled_at: Millis,
    /// When the fire was claimed, by the store's clock (filled in by the store).
    pub triggered_at: Millis,
    pub job_version: u64,
    /// Set when the run must be recorded as SKIPPED rather than dispatched (misfire skip).
    pub skip_reason: Option<String>,
    #[serde(default, with = "b64_opt")]
    pub payload_override: Option<Vec<u8>>,
    pub route_key_override: Option<String>,
}

impl Trigger {
    pub fn schedule_id(&self) -> String {
        schedule_id(&self.job_id, &self.schedule_no)
    }
}

/// `schedule_id = job_id + "@" + schedule_no`. `@` cannot occur in a job id, so the
/// split is unambiguous.
pub fn schedule_id(job_id: &str, schedule_no: &str) -> String {
    format!("{job_id}@{schedule_no}")
}

/// The schedule_no of a manual trigger: `manual-<idempotency key>`, or a fresh UUIDv7.
pub fn manual_schedule_no(idempotency_key: Option<&str>) -> String {
    match idempotency_key {
        Some(k) => format!("manual-{k}"),
        None => format!("manual-{}", uuid::Uuid::now_v7()),
    }
}

/// Splits a schedule_id into (job_id, schedule_no), or None if it is not one.
pub fn split_schedule_id(schedule_id: &str) -> Option<(&str, &str)> {
    let (job, no) = schedule_id.split_once('@')?;
    (valid_job_id(job) && !no.is_empty()).then_some((job, no))
}

pub fn valid_job_id(id: &str) -> bool {
    !id.is_empty()
        // Path segments in the REST API, which path-normalising clients would rewrite.
        && id != "."
        && id != ".."
        && id.len() <= MAX_JOB_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RunState {
    Triggered,
    Waiting,
    Dispatched,
    Running,
    Succeeded,
    Failed,
    TimedOut,
    Cancelled,
    Skipped,
}

impl RunState {
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Self::Succeeded | Self::Failed | Self::TimedOut | Self::Cancelled | Self::Skipped
        )
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = serde_json::to_value(self).ok();
        write!(f, "{}", s.as_ref().and_then(|v| v.as_str()).unwrap_or("?"))
    }
}

/// One planned execution. The store keeps it for the retention period.
///
/// Stored compactly: a field holding its default (an empty string, 0, none, a plan
/// field of [`RunPlan::DEFAULT`], an unset deadline) is left out of the record and read
/// back as that default; the Redis scripts read records the same way (`RUN_DEFAULTS`
/// and `PLAN_DEFAULTS` in `runlib.lua` are these fields and values).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub schedule_id: String,
    pub job_id: String,
    pub schedule_no: String,
    pub state: RunState,
    pub kind: TriggerKind,
    pub attempt: u32,
    /// Fencing tokens exceed 2^53 in spirit (µs timestamps), so they travel as strings
    /// through the store's scripts.
    #[serde(with = "u64_string")]
    pub fencing_token: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_id: String,
    pub scheduled_at: Millis,
    pub triggered_at: Millis,
    pub created_at: Millis,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Millis>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error_code: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error_message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    pub job_version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "b64_opt")]
    pub payload_override: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_key_override: Option<String>,
    /// The result bytes of the final attempt, as the executor sent them.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "b64_opt")]
    pub output: Option<Vec<u8>>,
    /// How this run executes, copied from the job when the run began.
    #[serde(default)]
    pub plan: RunPlan,
    /// The run's deadlines by the store's clock; its timer is the earliest one set.
    #[serde(default)]
    pub deadlines: Deadlines,
    /// The node of the previous attempt, avoided when a retry is routed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_node: String,
    /// The executor's last progress report.
    #[serde(default, skip_serializing_if = "is_default")]
    pub progress_percent: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub progress_message: String,
    /// Sharding broadcast. On a shard (a sub-run, schedule_id `{parent}#{index}`): its
    /// index from 0 and the number of shards. On the parent: `shard_total` shards were
    /// fanned out (0 = not a broadcast run).
    #[serde(default, skip_serializing_if = "is_default")]
    pub shard_index: u32,
    #[serde(default, skip_serializing_if = "is_default")]
    pub shard_total: u32,
    /// On a shard: the parent run's schedule_id (empty on every other run).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub parent: String,
    /// On a parent: shards that reached a final state, and how many of them succeeded.
    #[serde(default, skip_serializing_if = "is_default")]
    pub shards_done: u32,
    #[serde(default, skip_serializing_if = "is_default")]
    pub shards_succeeded: u32,
    /// Where the run's webhook stands: PENDING from the step that made the run final
    /// (when its plan has a callback URL) until the outbox entry is delivered (DONE) or
    /// given up (FAILED). The other fields are the delivery record: attempts made, the
    /// last HTTP status (0: no response) and the last error.
    #[serde(default, skip_serializing_if = "is_default")]
    pub callback_state: CallbackState,
    #[serde(default, skip_serializing_if = "is_default")]
    pub callback_attempts: u32,
    #[serde(default, skip_serializing_if = "is_default")]
    pub callback_status: u16,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub callback_error: String,
    /// The run's steps, oldest first: each change of state, attempt, node or webhook
    /// attempts, noted by the store as it writes the record (the last
    /// [`RunEvent::KEPT`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<RunEvent>,
}

/// One step of a run's life (see [`RunRecord::history`]). Stored as a map (JSON) or,
/// by the Redis scripts, as an array of its fields in this order: serde reads both, so
/// the fields keep their order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunEvent {
    /// When, by the store's clock.
    pub at: Millis,
    /// The state the run entered (`RunState`'s name, e.g. `DISPATCHED`), or `WEBHOOK`
    /// for a webhook delivery attempt.
    pub what: String,
    pub attempt: u32,
    /// The node holding (or that held) the run, if any.
    #[serde(default)]
    pub node_id: String,
    /// Why: the run's reason or error; a delivery's HTTP status and error.
    #[serde(default)]
    pub detail: String,
}

impl RunEvent {
    /// How many steps a record keeps (the oldest fall out first).
    pub const KEPT: usize = 32;
}

/// What a run's history notes a change of: state, attempt, node, webhook attempts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunMark {
    state: RunState,
    attempt: u32,
    node_id: String,
    callback_attempts: u32,
}

/// Whether `v` is its type's default: a stored record leaves such fields out.
fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// Where a run's webhook stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CallbackState {
    /// No callback URL, or the run is not final yet.
    #[default]
    None,
    /// An outbox entry waits for delivery.
    Pending,
    /// A delivery was answered 2xx.
    Done,
    /// Given up: retries spent, too old, or the receiver answered 410 Gone. The run's
    /// result is kept.
    Failed,
}

impl fmt::Display for CallbackState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = serde_json::to_value(self).ok();
        write!(f, "{}", s.as_ref().and_then(|v| v.as_str()).unwrap_or("?"))
    }
}

/// The JSON body of a run's webhook, built once in the store step that makes the run
/// final and sent byte for byte on every delivery attempt. Times are epoch ms (0: not
/// set); `output` is base64; `fencing_token` is a decimal string.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookBody {
    pub schedule_id: String,
    pub job_id: String,
    pub attempt: u32,
    pub fencing_token: String,
    pub status: RunState,
    pub scheduled_at_ms: Millis,
    pub started_at_ms: Millis,
    pub finished_at_ms: Millis,
    /// finished − started, 0 when the run never started.
    pub duration_ms: i64,
    pub error_code: String,
    pub error_message: String,
    pub output: String,
    pub node_id: String,
}

impl WebhookBody {
    pub fn of(run: &RunRecord) -> Self {
        use base64::Engine as _;
        let started = run.started_at.unwrap_or(0);
        let finished = run.finished_at.unwrap_or(0);
        Self {
            schedule_id: run.schedule_id.clone(),
            job_id: run.job_id.clone(),
            attempt: run.attempt,
            fencing_token: run.fencing_token.to_string(),
            status: run.state,
            scheduled_at_ms: run.scheduled_at,
            started_at_ms: started,
            finished_at_ms: finished,
            duration_ms: if started > 0 && finished >= started {
                finished - started
            } else {
                0
            },
            error_code: run.error_code.clone(),
            error_message: run.error_message.clone(),
            output: base64::engine::general_purpose::STANDARD
                .encode(run.output.as_deref().unwrap_or_default()),
            node_id: run.node_id.clone(),
        }
    }
}

impl RunRecord {
    /// What its history notes a change of.
    pub fn mark(&self) -> RunMark {
        RunMark {
            state: self.state,
            attempt: self.attempt,
            node_id: self.node_id.clone(),
            callback_attempts: self.callback_attempts,
        }
    }

    /// Notes in `history` what changed since the record was `before` (None: the
    /// record is new), at `at`: a webhook attempt when only the webhook's attempts
    /// changed, else the state entered. The store calls it as it writes the record (the
    /// Redis scripts mirror it in `runlib.lua`'s `note_change`).
    pub fn note_change(&mut self, before: Option<&RunMark>, at: Millis) {
        let now = self.mark();
        if before == Some(&now) {
            return;
        }
        let webhook = before.is_some_and(|b| {
            b.callback_attempts != now.callback_attempts
                && b.state == now.state
                && b.attempt == now.attempt
                && b.node_id == now.node_id
        });
        let (what, detail) = if webhook {
            let status = match self.callback_status {
                0 => "no answer".to_owned(),
                s => format!("HTTP {s}"),
            };
            let detail = if self.callback_error.is_empty() {
                status
            } else {
                format!("{status}: {}", self.callback_error)
            };
            ("WEBHOOK".to_owned(), detail)
        } else {
            let state = self.state.to_string();
            let detail = match (self.error_code.is_empty(), self.state.is_final()) {
                (false, true) if self.error_message.is_empty() => self.error_code.clone(),
                (false, true) => format!("{}: {}", self.error_code, self.error_message),
                _ => self.reason.clone(),
            };
            (state, detail)
        };
        self.history.push(RunEvent {
            at,
            what,
            attempt: self.attempt,
            node_id: self.node_id.clone(),
            detail,
        });
        self.keep_last_events();
    }

    /// Drops the oldest events past the last [`RunEvent::KEPT`].
    pub fn keep_last_events(&mut self) {
        let excess = self.history.len().saturating_sub(RunEvent::KEPT);
        self.history.drain(..excess);
    }

    /// Whether this record is what a lost lease left: retried ("retry: lost") or, with
    /// its attempts spent, FAILED "lost".
    pub fn lost_its_lease(&self) -> bool {
        self.reason == "retry: lost" || (self.state == RunState::Failed && self.reason == "lost")
    }

    /// The schedule_id of shard `index` of the broadcast run `parent`.
    pub fn shard_id(parent: &str, index: u32) -> String {
        format!("{parent}#{index}")
    }

    /// The record an executor's (schedule_id, shard_index) names: the shard's when the
    /// index is not 0; for index 0 the caller asks the store, which resolves a fanned
    /// out parent to its shard 0.
    pub fn held_id(schedule_id: &str, shard_index: u32) -> String {
        if shard_index == 0 {
            schedule_id.to_owned()
        } else {
            Self::shard_id(schedule_id, shard_index)
        }
    }

    /// The (schedule_id, shard_index) an executor knows a stored schedule_id by: a
    /// shard's `{parent}#{index}` is (parent, index); any other id is (id, 0).
    pub fn wire_ref(stored_id: &str) -> (&str, u32) {
        stored_id
            .rsplit_once('#')
            .and_then(|(parent, i)| Some((parent, i.parse().ok()?)))
            .unwrap_or((stored_id, 0))
    }

    /// The schedule_id the executor is told: a shard's parent, otherwise its own.
    pub fn wire_id(&self) -> &str {
        if self.parent.is_empty() {
            &self.schedule_id
        } else {
            &self.parent
        }
    }

    /// A broadcast parent whose shards were fanned out: it holds no lease itself.
    pub fn is_fanned_out(&self) -> bool {
        self.parent.is_empty() && self.shard_total > 0
    }
}

/// The part of a job a run needs to execute, snapshotted when the run begins so a job
/// edit never changes a run in flight.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunPlan {
    /// 1 + the job's max_retries.
    #[serde(skip_serializing_if = "plan_default::max_attempts")]
    pub max_attempts: u32,
    #[serde(skip_serializing_if = "plan_default::backoff_ms")]
    pub backoff_ms: i64,
    #[serde(skip_serializing_if = "plan_default::backoff_multiplier")]
    pub backoff_multiplier: f64,
    #[serde(skip_serializing_if = "plan_default::max_backoff_ms")]
    pub max_backoff_ms: i64,
    /// Execution timeout per attempt, counted from dispatch (0 = none).
    #[serde(skip_serializing_if = "plan_default::timeout_ms")]
    pub timeout_ms: i64,
    #[serde(skip_serializing_if = "plan_default::overlap")]
    pub overlap: OverlapPolicy,
    /// Longest serial queue per job; a trigger beyond it is SKIPPED.
    #[serde(skip_serializing_if = "plan_default::serial_limit")]
    pub serial_limit: u32,
    /// How long a run may wait for an eligible node to connect before it fails with
    /// "no_executor" (waiting for a connected node's capacity never fails it).
    #[serde(skip_serializing_if = "plan_default::dispatch_wait_ms")]
    pub dispatch_wait_ms: i64,
    /// The job's webhook: the step that makes the run final writes its outbox entry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
}

impl RunPlan {
    /// What a plan's fields are when nothing sets them; a stored plan leaves out each
    /// field that holds this value (so do the Redis scripts' `PLAN_DEFAULTS`).
    pub const DEFAULT: RunPlan = RunPlan {
        max_attempts: 1,
        backoff_ms: 1000,
        backoff_multiplier: 1.0,
        max_backoff_ms: 60_000,
        timeout_ms: 0,
        overlap: OverlapPolicy::Allow,
        serial_limit: 100,
        dispatch_wait_ms: 30_000,
        callback_url: None,
    };
}

/// Whether a plan's field holds [`RunPlan::DEFAULT`]'s value (serde's
/// `skip_serializing_if` wants one function per field).
mod plan_default {
    use super::{OverlapPolicy, RunPlan};

    macro_rules! same_as_default {
        ($($field:ident: $ty:ty),* $(,)?) => {$(
            pub fn $field(v: &$ty) -> bool {
                *v == RunPlan::DEFAULT.$field
            }
        )*};
    }

    same_as_default!(
        max_attempts: u32,
        backoff_ms: i64,
        backoff_multiplier: f64,
        max_backoff_ms: i64,
        timeout_ms: i64,
        overlap: OverlapPolicy,
        serial_limit: u32,
        dispatch_wait_ms: i64,
    );
}

impl Default for RunPlan {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl RunPlan {
    /// The delay before attempt `attempt + 1`, after attempt `attempt` failed.
    pub fn backoff_after(&self, attempt: u32) -> i64 {
        let exp = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX);
        let mult = if self.backoff_multiplier > 1.0 {
            self.backoff_multiplier.powi(exp)
        } else {
            1.0
        };
        #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
        let delay = (self.backoff_ms as f64 * mult) as i64;
        if self.max_backoff_ms > 0 {
            delay.min(self.max_backoff_ms)
        } else {
            delay
        }
    }
}

/// Deadlines of a run in epoch ms by the store's clock; 0 = not set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Deadlines {
    /// DISPATCHED/RUNNING: the lease runs out (renewed by heartbeats).
    #[serde(skip_serializing_if = "is_default")]
    pub lease_expires: Millis,
    /// DISPATCHED: no Started or heartbeat confirmed the dispatch by then → re-route
    /// without spending an attempt.
    #[serde(skip_serializing_if = "is_default")]
    pub confirm_by: Millis,
    /// DISPATCHED/RUNNING: the attempt times out.
    #[serde(skip_serializing_if = "is_default")]
    pub timeout_at: Millis,
    /// WAITING: route (again) at this time (retry backoff, busy nodes, a lost route).
    #[serde(skip_serializing_if = "is_default")]
    pub wake_at: Millis,
    /// WAITING: no eligible node connected by then → FAILED "no_executor" (retried
    /// per policy); `wait_until - plan.dispatch_wait_ms` is when the run began to
    /// wait, which bounds a wait for capacity by the job's timeout.
    #[serde(skip_serializing_if = "is_default")]
    pub wait_until: Millis,
}

impl Deadlines {
    /// The earliest deadline set, if any: the run's timer.
    pub fn earliest(&self) -> Option<Millis> {
        [
            self.lease_expires,
            self.confirm_by,
            self.timeout_at,
            self.wake_at,
        ]
        .into_iter()
        .filter(|&d| d > 0)
        .min()
    }
}

impl RunRecord {
    /// The TRIGGERED run a trigger becomes (or SKIPPED, if the trigger says so).
    /// `created_at` (and `finished_at` of a SKIPPED run) are left for the store to fill
    /// from its own clock.
    pub fn from_trigger(t: &Trigger) -> Self {
        let (state, reason) = match &t.skip_reason {
            Some(r) => (RunState::Skipped, r.clone()),
            None => (RunState::Triggered, String::new()),
        };
        Self {
            schedule_id: t.schedule_id(),
            job_id: t.job_id.clone(),
            schedule_no: t.schedule_no.clone(),
            state,
            kind: t.kind,
            attempt: 1,
            fencing_token: 0,
            node_id: String::new(),
            scheduled_at: t.scheduled_at,
            triggered_at: t.triggered_at,
            created_at: 0,
            started_at: None,
            finished_at: None,
            error_code: String::new(),
            error_message: String::new(),
            reason,
            job_version: t.job_version,
            payload_override: t.payload_override.clone(),
            route_key_override: t.route_key_override.clone(),
            output: None,
            plan: RunPlan::default(),
            deadlines: Deadlines::default(),
            last_node: String::new(),
            progress_percent: 0,
            progress_message: String::new(),
            shard_index: 0,
            shard_total: 0,
            parent: String::new(),
            shards_done: 0,
            shards_succeeded: 0,
            callback_state: CallbackState::None,
            callback_attempts: 0,
            callback_status: 0,
            callback_error: String::new(),
            history: Vec::new(),
        }
    }
}

mod b64 {
    //! Payload bytes as base64 in JSON, so stored records stay text.
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(v))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        STANDARD.decode(s).map_err(serde::de::Error::custom)
    }
}

mod b64_opt {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(b) => s.serialize_some(&STANDARD.encode(b)),
            None => s.serialize_none(),
        }
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| STANDARD.decode(s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

mod u64_string {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// An app: who receives signed webhooks (a job names it in `app_id`) and may sign
/// requests. Its secrets are write-only through every API.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppRecord {
    pub app_id: String,
    pub name: String,
    /// Oldest first; the last one is the newest. Several while a rotation overlaps.
    pub secrets: Vec<AppSecret>,
    pub created_at: Millis,
}

/// One signing secret of an app, in the Standard Webhooks `whsec_<base64>` form.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppSecret {
    pub secret: String,
    /// Signs until then (store clock); 0 = no end (the current secret).
    pub not_after: Millis,
}

impl AppRecord {
    /// The secrets that sign at `now`, oldest first.
    pub fn active_secrets(&self, now: Millis) -> impl Iterator<Item = &str> {
        self.secrets
            .iter()
            .filter(move |s| s.not_after == 0 || s.not_after > now)
            .map(|s| s.secret.as_str())
    }
}

impl std::fmt::Debug for AppRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppRecord")
            .field("app_id", &self.app_id)
            .field("name", &self.name)
            .field("secrets", &self.secrets)
            .field("created_at", &self.created_at)
            .finish()
    }
}

impl std::fmt::Debug for AppSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppSecret")
            .field("secret", &"<redacted>")
            .field("not_after", &self.not_after)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_run() -> RunRecord {
        RunRecord::from_trigger(&Trigger {
            job_id: "j".into(),
            schedule_no: "1000".into(),
            kind: TriggerKind::Cron,
            scheduled_at: 1000,
            triggered_at: 1001,
            job_version: 1,
            skip_reason: None,
            payload_override: None,
            route_key_override: None,
        })
    }

    #[test]
    fn a_stored_run_leaves_out_its_defaults_and_reads_them_back()
    -> Result<(), Box<dyn std::error::Error>> {
        let run = new_run();
        let json = serde_json::to_value(&run)?;
        let mut fields: Vec<&str> = json
            .as_object()
            .ok_or("not an object")?
            .keys()
            .map(String::as_str)
            .collect();
        fields.sort_unstable();
        assert_eq!(
            fields,
            [
                "attempt",
                "created_at",
                "deadlines",
                "fencing_token",
                "job_id",
                "job_version",
                "kind",
                "plan",
                "schedule_id",
                "schedule_no",
                "scheduled_at",
                "state",
                "triggered_at"
            ]
        );
        assert_eq!(json["plan"], serde_json::json!({}));
        assert_eq!(json["deadlines"], serde_json::json!({}));
        let back: RunRecord = rmp_serde::from_slice(&rmp_serde::to_vec_named(&run)?)?;
        assert_eq!(back, run);
        // A field set to something else is kept.
        let mut set = run.clone();
        set.plan.max_attempts = 3;
        set.plan.callback_url = Some("https://example.com/h".into());
        set.deadlines.wake_at = 5;
        set.node_id = "n".into();
        set.shard_total = 2;
        let back: RunRecord = serde_json::from_value(serde_json::to_value(&set)?)?;
        assert_eq!(back, set);
        Ok(())
    }

    /// `key = value` pairs of the Lua table `name` in `runlib.lua` (one level, scalars).
    fn lua_table(name: &str) -> Vec<(String, String)> {
        let lib = include_str!("store/redis/lua/runlib.lua");
        let start = lib
            .find(&format!("local {name} = {{"))
            .map(|i| i + name.len() + 10)
            .unwrap_or(lib.len());
        let end = lib[start..].find('}').map_or(start, |e| start + e);
        lib[start..end]
            .split(',')
            .filter_map(|pair| pair.split_once('='))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect()
    }

    #[test]
    fn the_scripts_read_back_the_defaults_a_record_leaves_out()
    -> Result<(), Box<dyn std::error::Error>> {
        let d = RunPlan::DEFAULT;
        let overlap = serde_json::to_value(d.overlap)?;
        let expected = [
            ("max_attempts", d.max_attempts.to_string()),
            ("backoff_ms", d.backoff_ms.to_string()),
            ("backoff_multiplier", d.backoff_multiplier.to_string()),
            ("max_backoff_ms", d.max_backoff_ms.to_string()),
            ("timeout_ms", d.timeout_ms.to_string()),
            ("overlap", format!("'{}'", overlap.as_str().unwrap_or("?"))),
            ("serial_limit", d.serial_limit.to_string()),
            ("dispatch_wait_ms", d.dispatch_wait_ms.to_string()),
        ];
        let plan = lua_table("PLAN_DEFAULTS");
        assert_eq!(plan.len(), expected.len(), "{plan:?}");
        for (k, v) in &expected {
            assert!(
                plan.contains(&((*k).to_owned(), v.clone())),
                "PLAN_DEFAULTS {k} = {v}: {plan:?}"
            );
        }
        // Every field the scripts default is one a new record leaves out, at its zero
        // value (CallbackState::None is "NONE").
        let run = serde_json::to_value(new_run())?;
        let run_defaults = lua_table("RUN_DEFAULTS");
        assert_eq!(run_defaults.len(), 16, "{run_defaults:?}");
        for (k, v) in &run_defaults {
            assert!(run.get(k).is_none(), "{k} is written at its default");
            assert!(["''", "0", "'NONE'"].contains(&v.as_str()), "{k} = {v}");
        }
        Ok(())
    }

    #[test]
    fn an_empty_plan_or_deadlines_written_by_lua_reads_as_defaults()
    -> Result<(), Box<dyn std::error::Error>> {
        // cmsgpack writes an empty Lua table as an empty array, not an empty map.
        #[derive(Serialize)]
        struct Stored<'a> {
            schedule_id: &'a str,
            job_id: &'a str,
            schedule_no: &'a str,
            state: RunState,
            kind: TriggerKind,
            attempt: u32,
            fencing_token: &'a str,
            scheduled_at: i64,
            triggered_at: i64,
            created_at: i64,
            job_version: u64,
            plan: [u8; 0],
            deadlines: [u8; 0],
        }
        let bytes = rmp_serde::to_vec_named(&Stored {
            schedule_id: "j@1000",
            job_id: "j",
            schedule_no: "1000",
            state: RunState::Triggered,
            kind: TriggerKind::Cron,
            attempt: 1,
            fencing_token: "0",
            scheduled_at: 1000,
            triggered_at: 1001,
            created_at: 0,
            job_version: 1,
            plan: [],
            deadlines: [],
        })?;
        let run: RunRecord = rmp_serde::from_slice(&bytes)?;
        assert_eq!(run, new_run());
        Ok(())
    }

    #[test]
    fn job_ids() {
        assert!(valid_job_id("a.b_c-9"));
        assert!(valid_job_id(&"x".repeat(128)));
        assert!(!valid_job_id(&"x".repeat(129)));
        assert!(!valid_job_id(""));
        assert!(!valid_job_id("a b"));
        assert!(!valid_job_id("a@b"));
        assert!(!valid_job_id("ä"));
        // Path segments a REST client would rewrite.
        assert!(!valid_job_id(".") && !valid_job_id(".."));
        assert!(valid_job_id("...") && valid_job_id(".a"));
    }

    #[test]
    fn schedule_ids_round_trip() {
        let id = schedule_id("job-1", "1764403200000");
        assert_eq!(id, "job-1@1764403200000");
        assert_eq!(split_schedule_id(&id), Some(("job-1", "1764403200000")));
        assert_eq!(split_schedule_id("nojob"), None);
        assert_eq!(split_schedule_id("bad id@1"), None);
        assert_eq!(split_schedule_id("job@"), None);
    }

    #[test]
    fn run_state_display_matches_wire_names() {
        assert_eq!(RunState::TimedOut.to_string(), "TIMED_OUT");
        assert_eq!(RunState::Triggered.to_string(), "TRIGGERED");
    }
}
