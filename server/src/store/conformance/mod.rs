//! The store conformance suite: the behaviour every `Store` backend must share, written
//! once and run against each backend, so "same semantics" is a test result and not a
//! promise. Also built with the `testing` feature, so a benchmark makes the records
//! the checks make (`sundial-bench steps`).
//!
//! Each check is a `pub async fn` taking a fresh, empty store. A backend's test module
//! runs the whole suite in one line, given an async constructor that takes the
//! `StoreOptions` to build the store with:
//!
//! ```ignore
//! crate::store::conformance::store_conformance_tests!(|opts| async move {
//!     EmbeddedStore::open(&path, opts).expect("open")
//! });
//! ```
//!
//! which expands to a `store_conformance` module with one `#[tokio::test]` per check,
//! grouped by the store trait it checks (`store_conformance::job_store::claim_race`).
//! Checks use short TTLs and sleep only where expiry itself is under test.
//!
//! The checks live one file per store trait: `jobs` (`JobStore`: jobs, fires, manual
//! triggers), `triggers` (`TriggerQueue`), `runs`, `run_machine` and `run_outcomes`
//! (`RunStore`: run records; the run machine up to a start; how a run ends), `nodes`
//! (`NodeRegistry` and `Inboxes`), `outbox` (`Outbox`: the webhook outbox and
//! breakers), `apps` (`AppStore`: apps and nonces); the fixtures they share are here.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{
    Admission, Applied, Assigned, AuditEvent, BeginOn, Begun, BreakerState, BreakerUpdate,
    ClaimResult, Delivery, DeliveryOutcome, DeliveryResult, DeliveryTerms, DueFire, Enqueued,
    Error, FannedOut, Finish, Finisher, FireClaim, GONE_ERROR, Held, Holder, JobWrite,
    LOG_LINE_COST, LeaseTerms, LogBatch, LogLine, NOT_THE_HOLDER, NodeRecord, NodeRemoved,
    NodeSlot, Outcome, Registered, Revocation, RunQuery, STALE_TOKEN, SettleRequest, Store,
    StoreOptions, Transition, UNKNOWN_RUN, WebhookDelivery, partition_of,
};
use crate::model::{
    AppRecord, AppSecret, Arm, CallbackState, Deadlines, JobRecord, JobSpec, Millis, OverlapPolicy,
    RetryPolicy, RunEvent, RunPlan, RunRecord, RunState, Target, Trigger, TriggerKind, WebhookBody,
    schedule_id,
};

mod apps;
mod audit;
mod jobs;
mod nodes;
mod outbox;
mod run_machine;
mod run_outcomes;
mod runs;
mod triggers;

pub use apps::*;
pub use audit::*;
pub use jobs::*;
pub use nodes::*;
pub use outbox::*;
pub use run_machine::*;
pub use run_outcomes::*;
pub use runs::*;
pub use triggers::*;

/// Expands to one `#[tokio::test]` per conformance check, in a `store_conformance`
/// module with one submodule per store trait (`store_conformance::run_store::…`).
/// `$make` is a closure `|opts: StoreOptions| async move { … }` returning any `Store`;
/// it is called once per test with the options that test needs.
#[cfg(test)]
macro_rules! store_conformance_tests {
    ($make:expr) => {
        $crate::store::conformance::store_conformance_tests!(@suite $make;
            job_store {
                job_crud: options,
                job_list_paging: options,
                job_list_by_prefix: options,
                update_rewrites_pending: options,
                paused_job_is_never_due: options,
                due_fires_order_limit_partition: options,
                upcoming_fires_read_a_window_and_claim_nothing: options,
                claim_outcomes: options,
                claimed_fires_keep_their_planned_time: options,
                claim_race: options,
                apply_jobs_batches_and_refusals: options,
                manual_idempotency: options,
            }
            trigger_queue {
                trigger_queue_ack_reclaim: options,
                trigger_read_blocks_until_append: options,
            }
            run_store {
                record_run_idempotent_and_skips: options,
                list_runs_order_filter_paging: options,
                runs_bounded_per_job: bounded_runs_options,
                run_retention: short_retention_options,
                begin_run_idempotent_and_skips: options,
                overlap_allow_and_forbid: options,
                overlap_serial_queue: options,
                serial_queue_one_at_a_time: options,
                overlap_replace: options,
                overlap_after_a_policy_change: options,
                assign_run_tokens_and_capacity: options,
                assign_run_race: options,
                begin_and_assign_in_one_decision: options,
                begin_and_assign_many_begins_each_run: options,
                mark_started_transitions: options,
                mark_started_many_applies_each_report: options,
                finish_runs_applies_each_result: options,
                append_logs_many_appends_each_run: options,
                reports_only_from_the_lease_holder: options,
                renew_leases_extend_and_confirm: options,
                finish_run_outcomes: options,
                a_common_run_is_recorded_whole_at_each_step: options,
                finish_run_retries: options,
                finish_run_rejected: options,
                expire_run_timeout: options,
                expire_run_unconfirmed_and_lost: options,
                take_back_unconfirmed_only_before_a_start: options,
                expire_run_wakes_waiting: options,
                due_runs_per_partition: options,
                cancel_run_transitions: options,
                broadcast_shards: options,
                broadcast_cancel_and_replace: options,
                progress_and_logs: options,
            }
            node_registry {
                route_counters: options,
                nodes_register_refresh_expire: options,
                nodes_report_leased_runs: options,
                nodes_removed_only_by_their_instance: options,
                a_gone_nodes_leases_end_within_the_grace: options,
                node_ids_belong_to_one_group: options,
            }
            inboxes {
                inbox_order_and_blocking: options,
            }
            outbox {
                outbox_written_when_final: options,
                delivery_claims_and_outcomes: options,
                claim_deliveries_batch: options,
                a_result_claims_its_webhook_for_its_caller: options,
                outbox_due_per_partition: options,
                breaker_transitions: options,
                delivery_slots_pace_a_destination: options,
                delivery_slots_are_shared_between_owners: options,
                a_waiting_mark_ends_when_its_owner_stops_waiting: options,
                settle_batches: options,
                clean_admissions: options,
                a_closed_breaker_ramps_up: options,
                run_history_notes_each_step: options,
                run_history_keeps_the_last_steps: options,
            }
            app_store {
                apps_and_rotation: options,
                nonces: options,
            }
            audit_log {
                audit_log_pages_and_keeps_the_newest: options,
            }
        );
    };
    (@suite $make:expr; $($group:ident { $($check:ident : $opts:ident),* $(,)? })*) => {
        mod store_conformance {
            #[allow(unused_imports)]
            use super::*;

            async fn make_store(
                opts: $crate::store::StoreOptions,
            ) -> ::std::sync::Arc<dyn $crate::store::Store> {
                $crate::store::conformance::make_store($make, opts).await
            }

            $(
                mod $group {
                    $(
                        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                        async fn $check() {
                            let store = super::make_store(
                                $crate::store::conformance::$opts(),
                            )
                            .await;
                            $crate::store::conformance::$check(store.clone()).await;
                            store.check_indexes().await.expect("indexes match the records");
                        }
                    )*
                }
            )*
        }
    };
}
#[cfg(test)]
pub(crate) use store_conformance_tests;

/// Builds a store through the backend's constructor closure (the bound lets the closure's
/// argument type be inferred at the call site).
pub async fn make_store<F, Fut, S>(make: F, opts: StoreOptions) -> Arc<dyn Store>
where
    F: FnOnce(StoreOptions) -> Fut,
    Fut: Future<Output = S>,
    S: Store,
{
    Arc::new(make(opts).await)
}

/// The options most checks use: a few partitions, so per-partition behaviour shows.
pub fn options() -> StoreOptions {
    StoreOptions {
        partitions: 4,
        ..StoreOptions::default()
    }
}

/// At most five runs per job.
pub fn bounded_runs_options() -> StoreOptions {
    StoreOptions {
        max_runs_per_job: 5,
        ..options()
    }
}

/// Run records live 300 ms.
pub fn short_retention_options() -> StoreOptions {
    StoreOptions {
        run_retention: Duration::from_millis(300),
        ..options()
    }
}

// ---- fixtures

pub fn spec(id: &str) -> JobSpec {
    JobSpec {
        id: id.to_owned(),
        name: format!("job {id}"),
        cron: "*/5 * * * *".to_owned(),
        time_zone: "UTC".to_owned(),
        start_time: None,
        end_time: None,
        jitter_ms: 0,
        target: Target::Executor {
            group: "workers".to_owned(),
            handler: "noop".to_owned(),
        },
        route_strategy: Default::default(),
        route_key: String::new(),
        timeout_ms: 60_000,
        retry: RetryPolicy::default(),
        misfire_policy: Default::default(),
        misfire_catch_up_limit: 10,
        overlap_policy: Default::default(),
        callback_url: None,
        callback_max_in_flight: 0,
        app_id: "app".to_owned(),
        payload: b"{\"k\":1}".to_vec(),
        labels: BTreeMap::new(),
    }
}

pub fn job(id: &str, next_fire: Option<Arm>) -> JobRecord {
    JobRecord {
        spec: spec(id),
        version: 0,
        paused: false,
        next_fire,
        created_at: 0,
        updated_at: 0,
    }
}

/// An arm whose planned time is its due time (no jitter).
pub fn arm(due: Millis) -> Arm {
    Arm { planned: due, due }
}

pub fn cron_trigger(job_id: &str, planned: Millis, version: u64) -> Trigger {
    Trigger {
        job_id: job_id.to_owned(),
        schedule_no: planned.to_string(),
        kind: TriggerKind::Cron,
        scheduled_at: planned,
        triggered_at: 0,
        job_version: version,
        skip_reason: None,
        payload_override: None,
        route_key_override: None,
    }
}

pub fn manual_trigger(job_id: &str, schedule_no: &str, at: Millis) -> Trigger {
    Trigger {
        job_id: job_id.to_owned(),
        schedule_no: schedule_no.to_owned(),
        kind: TriggerKind::Manual,
        scheduled_at: at,
        triggered_at: 0,
        job_version: 1,
        skip_reason: None,
        payload_override: Some(b"override".to_vec()),
        route_key_override: None,
    }
}

/// A TRIGGERED run of `job_id` planned at `scheduled_at` (schedule_no = that time);
/// `created_at` 0 leaves it for the store to fill.
pub fn run(job_id: &str, scheduled_at: Millis, created_at: Millis) -> RunRecord {
    RunRecord {
        created_at,
        ..RunRecord::from_trigger(&cron_trigger(job_id, scheduled_at, 1))
    }
}

/// An executor node as an instance registers it. `last_heartbeat` is a value the store
/// must overwrite with its clock; the other fields must come back as given.
pub fn node(id: &str, group: &str, instance: &str) -> NodeRecord {
    NodeRecord {
        node_id: id.to_owned(),
        group: group.to_owned(),
        handlers: vec!["h".to_owned()],
        weight: 1,
        max_concurrency: 4,
        labels: BTreeMap::from([("zone".to_owned(), "a".to_owned())]),
        instance: instance.to_owned(),
        session: format!("{id}@{instance}"),
        ready: true,
        draining: false,
        silent_since: 0,
        on_probation: false,
        active: 0,
        leased: 0,
        // Exact in binary, so no backend's number formatting can round it.
        load: 0.25,
        mean_duration_ms: 0,
        recent_errors: 0,
        recent_results: 0,
        recent_faults: 0,
        by_handler: Vec::new(),
        connected_at: 1_000,
        last_heartbeat: 1,
    }
}

/// `n` job ids `<prefix>-<i>` that land in `partition`.
pub fn ids_in_partition(partitions: u32, partition: u32, prefix: &str, n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|id| partition_of(id, partitions) == partition)
        .take(n)
        .collect()
}

async fn now(store: &Arc<dyn Store>) -> Millis {
    store.now().await.expect("store clock")
}

/// Reads until the queue has nothing new, so backends that split the queue (per
/// partition) still hand over everything. An entry read twice is a failure (and ends
/// what would otherwise be an endless loop).
pub async fn drain_triggers(store: &Arc<dyn Store>, consumer: &str) -> Vec<Delivery> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    loop {
        let got = store
            .read_triggers(consumer, 100, Duration::from_millis(100))
            .await
            .expect("read triggers");
        if got.is_empty() {
            return out;
        }
        for d in got {
            assert!(
                seen.insert(d.entry_id.clone()),
                "entry {} was read twice",
                d.entry_id
            );
            out.push(d);
        }
    }
}

fn schedule_nos(ds: &[Delivery]) -> Vec<String> {
    ds.iter().map(|d| d.trigger.schedule_no.clone()).collect()
}

async fn wait_changed(rx: &mut tokio::sync::watch::Receiver<u64>, what: &str) {
    tokio::time::timeout(Duration::from_secs(3), rx.changed())
        .await
        .unwrap_or_else(|_| panic!("job_changes did not move after {what}"))
        .expect("job_changes sender alive");
    rx.borrow_and_update();
}

async fn list_all_runs(store: &Arc<dyn Store>, job_id: &str, q: RunQuery) -> Vec<RunRecord> {
    let mut out = Vec::new();
    let mut cursor = None;
    for _ in 0..1000 {
        let page = store
            .list_runs(
                job_id,
                RunQuery {
                    cursor: cursor.take(),
                    ..q.clone()
                },
            )
            .await
            .expect("list runs");
        assert!(page.items.len() <= q.limit, "page over the limit");
        out.extend(page.items);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return out,
        }
    }
    panic!("list_runs never finished paging");
}

fn scheduled(runs: &[RunRecord]) -> Vec<Millis> {
    runs.iter().map(|r| r.scheduled_at).collect()
}

// ---- run machine fixtures

//
// Shared shape of these checks: `begin_run` with a long route grace (so no timer fires
// unless a check wants it), explicit plans, and nodes named per check. Times the store
// stamps are checked against the store's clock read just before and after the call.

/// The route grace most checks use: long enough that a run's wake-up timer stays quiet.
pub const GRACE: Duration = Duration::from_secs(30);

/// A lease no check outlives, for checks not about expiry.
pub const LONG: LeaseTerms = LeaseTerms {
    ttl: Duration::from_secs(30),
    confirm_within: Duration::from_secs(30),
};

/// A plan with one attempt, no timeout and a 5 s dispatch wait.
pub fn plan(overlap: OverlapPolicy) -> RunPlan {
    RunPlan {
        max_attempts: 1,
        backoff_ms: 100,
        backoff_multiplier: 1.0,
        max_backoff_ms: 60_000,
        timeout_ms: 0,
        overlap,
        serial_limit: 10,
        dispatch_wait_ms: 5_000,
        callback_url: None,
    }
}

/// The run `begin_run` is given for the cron fire of `job_id` planned at `planned`.
pub fn planned_run(job_id: &str, planned: Millis, plan: RunPlan) -> RunRecord {
    RunRecord {
        plan,
        ..RunRecord::from_trigger(&cron_trigger(job_id, planned, 1))
    }
}

/// A holder by hand: `node` quoting `token`.
fn holder(node: &str, token: u64) -> Holder {
    Holder {
        node_id: node.into(),
        token,
    }
}

pub fn slot(node_id: &str, max_concurrency: u32) -> NodeSlot {
    NodeSlot {
        node_id: node_id.to_owned(),
        max_concurrency,
    }
}

pub fn terms(ttl_ms: u64, confirm_ms: u64) -> LeaseTerms {
    LeaseTerms {
        ttl: Duration::from_millis(ttl_ms),
        confirm_within: Duration::from_millis(confirm_ms),
    }
}

pub fn outcome(state: RunState) -> Outcome {
    Outcome {
        state,
        output: None,
        error_code: String::new(),
        error_message: String::new(),
        started_at: None,
        finished_at: None,
    }
}

fn failed(code: &str) -> Outcome {
    Outcome {
        error_code: code.to_owned(),
        error_message: format!("{code} happened"),
        ..outcome(RunState::Failed)
    }
}

/// Begins a run that must be new.
async fn begin(store: &Arc<dyn Store>, run: RunRecord) -> Begun {
    let sid = run.schedule_id.clone();
    let begun = store.begin_run(run, GRACE).await.expect("begin run");
    assert!(begun.created, "{sid}: expected a new run");
    begun
}

async fn get(store: &Arc<dyn Store>, sid: &str) -> RunRecord {
    store
        .get_run(sid)
        .await
        .expect("get run")
        .unwrap_or_else(|| panic!("run {sid} is missing"))
}

/// Assigns a run that must be granted.
async fn grant(
    store: &Arc<dyn Store>,
    sid: &str,
    attempt: u32,
    node: &NodeSlot,
    terms: LeaseTerms,
) -> RunRecord {
    match store
        .assign_run(sid, attempt, node, terms)
        .await
        .expect("assign run")
    {
        Assigned::Granted(run) => run,
        other => panic!("assign {sid} at attempt {attempt}: expected Granted, got {other:?}"),
    }
}

fn not_waiting_state(a: &Assigned) -> Option<RunState> {
    match a {
        Assigned::NotWaiting(Some(r)) => Some(r.state),
        _ => None,
    }
}

/// `at` lies within `[before + offset, after + offset]`.
fn assert_near(at: Millis, before: Millis, after: Millis, offset: i64, what: &str) {
    assert!(
        at >= before + offset && at <= after + offset,
        "{what}: {at} not within [{}, {}]",
        before + offset,
        after + offset
    );
}

fn revocation_of(t: &Transition) -> &Revocation {
    match t.revoked.as_slice() {
        [rv] => rv,
        _ => panic!("expected one revocation, got {t:?}"),
    }
}

fn log(message: &str) -> LogLine {
    LogLine {
        seq: 0,
        time_ms: 1_000,
        level: "info".to_owned(),
        message: message.to_owned(),
        attempt: 1,
    }
}

fn seqs(lines: &[LogLine]) -> Vec<u64> {
    lines.iter().map(|l| l.seq).collect()
}

async fn fan(store: &Arc<dyn Store>, sid: &str, shards: u32) -> (RunRecord, Vec<RunRecord>) {
    match store.fan_out(sid, 1, shards, GRACE).await.expect("fan out") {
        FannedOut::Shards { parent, shards } => (parent, shards),
        other => panic!("fan out {sid}: expected shards, got {other:?}"),
    }
}
