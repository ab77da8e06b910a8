//! The store conformance suite: the behaviour every `Store` backend must share, written
//! once and run against each backend, so "same semantics" is a test result and not a
//! promise.
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
//! which expands to a `store_conformance` module with one `#[tokio::test]` per check.
//! Checks use short TTLs and sleep only where expiry itself is under test.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{
    Applied, Assigned, Begun, BreakerState, ClaimResult, Delivery, DeliveryOutcome, DueFire,
    Enqueued, Error, FannedOut, Finisher, FireClaim, GONE_ERROR, Held, LeaseTerms, LogLine,
    NodeRecord, NodeSlot, Outcome, Revocation, RunQuery, Store, StoreOptions, Transition,
    WebhookDelivery, partition_of,
};
use crate::model::{
    AppRecord, AppSecret, Arm, CallbackState, Deadlines, JobRecord, JobSpec, Millis, OverlapPolicy,
    RetryPolicy, RunPlan, RunRecord, RunState, Target, Trigger, TriggerKind, WebhookBody,
    schedule_id,
};

/// Expands to one `#[tokio::test]` per conformance check, in a `store_conformance`
/// module. `$make` is a closure `|opts: StoreOptions| async move { … }` returning any
/// `Store`; it is called once per test with the options that test needs.
macro_rules! store_conformance_tests {
    ($make:expr) => {
        $crate::store::conformance::store_conformance_tests!(@suite $make;
            job_crud: options,
            job_list_paging: options,
            update_rewrites_pending: options,
            paused_job_is_never_due: options,
            due_fires_order_limit_partition: options,
            claim_outcomes: options,
            claim_race: options,
            trigger_queue_ack_reclaim: options,
            trigger_read_blocks_until_append: options,
            manual_idempotency: options,
            record_run_idempotent_and_skips: options,
            list_runs_order_filter_paging: options,
            runs_bounded_per_job: bounded_runs_options,
            run_retention: short_retention_options,
            begin_run_idempotent_and_skips: options,
            overlap_allow_and_forbid: options,
            overlap_serial_queue: options,
            serial_queue_one_at_a_time: options,
            overlap_replace: options,
            assign_run_tokens_and_capacity: options,
            assign_run_race: options,
            mark_started_transitions: options,
            renew_leases_extend_and_confirm: options,
            finish_run_outcomes: options,
            finish_run_retries: options,
            finish_run_rejected: options,
            expire_run_timeout: options,
            expire_run_unconfirmed_and_lost: options,
            expire_run_wakes_waiting: options,
            due_runs_per_partition: options,
            cancel_run_transitions: options,
            broadcast_shards: options,
            broadcast_cancel_and_replace: options,
            progress_and_logs: options,
            inbox_order_and_blocking: options,
            nonces: options,
            route_counters: options,
            apps_and_rotation: options,
            nodes_register_refresh_expire: options,
            nodes_report_leased_runs: options,
            nodes_removed_only_by_their_instance: options,
            outbox_written_when_final: options,
            delivery_claims_and_outcomes: options,
            outbox_due_per_partition: options,
            breaker_transitions: options,
        );
    };
    (@suite $make:expr; $($check:ident : $opts:ident),* $(,)?) => {
        mod store_conformance {
            #[allow(unused_imports)]
            use super::*;

            async fn make_store(
                opts: $crate::store::StoreOptions,
            ) -> ::std::sync::Arc<dyn $crate::store::Store> {
                $crate::store::conformance::make_store($make, opts).await
            }

            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $check() {
                    let store = make_store($crate::store::conformance::$opts()).await;
                    $crate::store::conformance::$check(store).await;
                }
            )*
        }
    };
}
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
        ready: true,
        draining: false,
        active: 0,
        leased: 0,
        // Exact in binary, so no backend's number formatting can round it.
        load: 0.25,
        mean_duration_ms: 0,
        recent_errors: 0,
        recent_results: 0,
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

// ---- jobs

pub async fn job_crud(store: Arc<dyn Store>) {
    let mut changes = store.job_changes();
    changes.borrow_and_update();

    let mut draft = job("crud-1", None);
    draft.version = 42; // ignored
    let created = store.create_job(draft).await.expect("create");
    assert_eq!(created.version, 1);
    assert_eq!(created.spec, spec("crud-1"));
    assert!(!created.paused);
    assert_eq!(created.next_fire, None);
    wait_changed(&mut changes, "create").await;

    match store.create_job(job("crud-1", None)).await {
        Err(Error::JobExists(id)) => assert_eq!(id, "crud-1"),
        other => panic!("duplicate create: expected JobExists, got {other:?}"),
    }

    let got = store.get_job("crud-1").await.expect("get").expect("exists");
    assert_eq!(got, created);
    assert_eq!(store.get_job("crud-none").await.expect("get"), None);

    let mut renamed = got.clone();
    renamed.spec.name = "renamed".to_owned();
    let updated = store.update_job(renamed.clone(), 1).await.expect("update");
    assert_eq!(updated.version, 2);
    assert_eq!(updated.spec.name, "renamed");
    let got = store.get_job("crud-1").await.expect("get").expect("exists");
    assert_eq!(got.version, 2);
    assert_eq!(got.spec.name, "renamed");
    wait_changed(&mut changes, "update").await;

    match store.update_job(renamed.clone(), 1).await {
        Err(Error::VersionConflict {
            job_id,
            expected,
            current,
        }) => {
            assert_eq!((job_id.as_str(), expected, current), ("crud-1", 1, 2));
        }
        other => panic!("stale update: expected VersionConflict, got {other:?}"),
    }
    // The failed update changed nothing.
    assert_eq!(
        store
            .get_job("crud-1")
            .await
            .expect("get")
            .map(|j| j.version),
        Some(2)
    );
    match store.update_job(job("crud-missing", None), 1).await {
        Err(Error::JobNotFound(id)) => assert_eq!(id, "crud-missing"),
        other => panic!("update of a missing job: expected JobNotFound, got {other:?}"),
    }

    let jobs = store
        .get_jobs(&["crud-1".to_owned(), "crud-none".to_owned()])
        .await
        .expect("get_jobs");
    assert_eq!(
        jobs.iter().map(|j| j.spec.id.as_str()).collect::<Vec<_>>(),
        ["crud-1"]
    );

    store.delete_job("crud-1").await.expect("delete");
    wait_changed(&mut changes, "delete").await;
    assert_eq!(store.get_job("crud-1").await.expect("get"), None);
    match store.delete_job("crud-1").await {
        Err(Error::JobNotFound(id)) => assert_eq!(id, "crud-1"),
        other => panic!("second delete: expected JobNotFound, got {other:?}"),
    }
    // The id is free again.
    assert_eq!(
        store
            .create_job(job("crud-1", None))
            .await
            .expect("re-create")
            .version,
        1
    );
}

pub async fn job_list_paging(store: Arc<dyn Store>) {
    let ids: BTreeSet<String> = (0..25).map(|i| format!("page-{i:02}")).collect();
    for id in &ids {
        store.create_job(job(id, None)).await.expect("create");
    }
    let mut seen = Vec::new();
    let mut sizes = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let page = store
            .list_jobs(cursor.as_deref(), 10)
            .await
            .expect("list jobs");
        sizes.push(page.items.len());
        seen.extend(page.items.into_iter().map(|j| j.spec.id));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => {
                cursor = None;
                break;
            }
        }
    }
    assert_eq!(cursor, None, "paging never ended");
    assert_eq!(seen.len(), 25, "every job exactly once: {seen:?}");
    assert_eq!(seen.iter().cloned().collect::<BTreeSet<_>>(), ids);
    // `limit` at a time: full pages, then the rest (a trailing empty page is tolerated).
    assert_eq!(&sizes[..3], &[10, 10, 5], "page sizes {sizes:?}");
    assert!(sizes[3..].iter().all(|s| *s == 0), "page sizes {sizes:?}");
}

// ---- fires

pub async fn update_rewrites_pending(store: Arc<dyn Store>) {
    let id = "pend-1";
    let p = partition_of(id, store.partitions());
    let t0 = now(&store).await;

    store
        .create_job(job(id, Some(arm(t0 - 1000))))
        .await
        .expect("create");
    let batch = store.due_fires(p, 100).await.expect("due");
    assert_eq!(
        batch.fires,
        vec![DueFire {
            job_id: id.to_owned(),
            due: t0 - 1000,
            planned: t0 - 1000,
            version: 1,
        }]
    );
    assert!(batch.now >= t0);

    // Pause: the member goes away.
    let mut paused = store.get_job(id).await.expect("get").expect("exists");
    paused.paused = true;
    paused.next_fire = None;
    let paused = store.update_job(paused, 1).await.expect("pause");
    let batch = store.due_fires(p, 100).await.expect("due");
    assert_eq!(batch.fires, vec![]);
    assert_eq!(batch.next_due, None);

    // Resume with a new arm (planned ≠ due: jitter): the new due is what is pending.
    let mut resumed = paused;
    resumed.paused = false;
    resumed.next_fire = Some(Arm {
        planned: t0 - 600,
        due: t0 - 500,
    });
    store.update_job(resumed.clone(), 2).await.expect("resume");
    let batch = store.due_fires(p, 100).await.expect("due");
    assert_eq!(
        batch.fires,
        vec![DueFire {
            job_id: id.to_owned(),
            due: t0 - 500,
            planned: t0 - 600,
            version: 3,
        }]
    );
    assert_eq!(batch.next_due, None);

    // Re-armed into the future: not due, but it is the partition's next due.
    resumed.next_fire = Some(arm(t0 + 3_600_000));
    store.update_job(resumed.clone(), 3).await.expect("re-arm");
    let batch = store.due_fires(p, 100).await.expect("due");
    assert_eq!(batch.fires, vec![]);
    assert_eq!(batch.next_due, Some(t0 + 3_600_000));

    // Schedule ended (None without pause): nothing pending.
    resumed.next_fire = None;
    store.update_job(resumed, 4).await.expect("end");
    let batch = store.due_fires(p, 100).await.expect("due");
    assert_eq!((batch.fires, batch.next_due), (vec![], None));

    // Delete removes the member too.
    let mut again = store.get_job(id).await.expect("get").expect("exists");
    again.next_fire = Some(arm(t0 - 10));
    store.update_job(again, 5).await.expect("arm again");
    assert_eq!(store.due_fires(p, 100).await.expect("due").fires.len(), 1);
    store.delete_job(id).await.expect("delete");
    let batch = store.due_fires(p, 100).await.expect("due");
    assert_eq!((batch.fires, batch.next_due), (vec![], None));
}

/// A paused job never has a pending member, even if the record handed to the store
/// still carries an arm: otherwise every scheduler pass would see it due and every
/// claim would answer Gone, forever.
pub async fn paused_job_is_never_due(store: Arc<dyn Store>) {
    let t0 = now(&store).await;
    let mut a = job("paused-a", Some(arm(t0 - 1000)));
    a.paused = true;
    store.create_job(a).await.expect("create paused");
    let p = partition_of("paused-a", store.partitions());
    let batch = store.due_fires(p, 100).await.expect("due");
    assert_eq!((batch.fires, batch.next_due), (vec![], None));

    store
        .create_job(job("paused-b", Some(arm(t0 - 1000))))
        .await
        .expect("create");
    let mut b = store
        .get_job("paused-b")
        .await
        .expect("get")
        .expect("exists");
    b.paused = true; // next_fire left armed
    store.update_job(b, 1).await.expect("pause");
    let p = partition_of("paused-b", store.partitions());
    let batch = store.due_fires(p, 100).await.expect("due");
    assert_eq!((batch.fires, batch.next_due), (vec![], None));
}

pub async fn due_fires_order_limit_partition(store: Arc<dyn Store>) {
    let parts = store.partitions();
    assert_eq!(
        parts, 4,
        "the store keeps the partition count it was made with"
    );
    let ids = ids_in_partition(parts, 0, "due", 4);
    let other = ids_in_partition(parts, 1, "due-other", 1).remove(0);
    let t0 = now(&store).await;
    let dues = [t0 - 3000, t0 - 1000, t0 - 2000, t0 + 3_600_000];
    for (id, due) in ids.iter().zip(dues) {
        store
            .create_job(job(id, Some(arm(due))))
            .await
            .expect("create");
    }
    store
        .create_job(job(&other, Some(arm(t0 - 5000))))
        .await
        .expect("create other");
    let fire = |i: usize| DueFire {
        job_id: ids[i].clone(),
        due: dues[i],
        planned: dues[i],
        version: 1,
    };

    let batch = store.due_fires(0, 2).await.expect("due");
    assert_eq!(
        batch.fires,
        vec![fire(0), fire(2)],
        "earliest first, limited"
    );
    assert_eq!(
        batch.next_due,
        Some(t0 - 1000),
        "the limit cut a due member off"
    );
    assert!(batch.now >= t0);

    let batch = store.due_fires(0, 10).await.expect("due");
    assert_eq!(batch.fires, vec![fire(0), fire(2), fire(1)]);
    assert_eq!(
        batch.next_due,
        Some(t0 + 3_600_000),
        "includes not-yet-due members"
    );

    let batch = store.due_fires(0, 0).await.expect("due");
    assert_eq!((batch.fires, batch.next_due), (vec![], Some(t0 - 3000)));

    let batch = store.due_fires(1, 10).await.expect("due");
    assert_eq!(
        batch.fires,
        vec![DueFire {
            job_id: other,
            due: t0 - 5000,
            planned: t0 - 5000,
            version: 1,
        }]
    );
    assert_eq!(batch.next_due, None);
    for p in 2..parts {
        let batch = store.due_fires(p, 10).await.expect("due");
        assert_eq!(
            (batch.fires, batch.next_due),
            (vec![], None),
            "partition {p}"
        );
    }
}

pub async fn claim_outcomes(store: Arc<dyn Store>) {
    let parts = store.partitions();
    let ids = ids_in_partition(parts, 1, "claim", 4);
    let (a, b, c, d) = (&ids[0], &ids[1], &ids[2], &ids[3]);
    let t0 = now(&store).await;
    let due = |i: i64| t0 - 4000 + i * 1000;
    for (i, id) in ids.iter().enumerate() {
        store
            .create_job(job(id, Some(arm(due(i as i64)))))
            .await
            .expect("create");
    }
    // b: the definition changed, same arm. c: paused. d: deleted.
    let mut bj = store.get_job(b).await.expect("get").expect("b");
    bj.spec.name = "changed".to_owned();
    store.update_job(bj, 1).await.expect("update b");
    let mut cj = store.get_job(c).await.expect("get").expect("c");
    cj.paused = true;
    cj.next_fire = None;
    store.update_job(cj, 1).await.expect("pause c");
    store.delete_job(d).await.expect("delete d");

    let next_a = arm(t0 + 3_600_000);
    let claim =
        |id: &String, i: i64, version: u64, next: Option<Arm>, triggers: Vec<Trigger>| FireClaim {
            job_id: id.clone(),
            expected_due: due(i),
            expected_version: version,
            next,
            triggers,
        };
    let mut misfire = cron_trigger(a, due(0), 1);
    misfire.kind = TriggerKind::Misfire;
    misfire.schedule_no = format!("{}", due(0) - 60_000);
    let a_triggers = vec![misfire, cron_trigger(a, due(0), 1)];

    let before = now(&store).await;
    let outcome = store
        .claim_fires(
            1,
            vec![
                claim(a, 0, 1, Some(next_a), a_triggers.clone()),
                claim(b, 1, 1, None, vec![cron_trigger(b, due(1), 1)]),
                claim(c, 2, 1, None, vec![cron_trigger(c, due(2), 1)]),
                claim(d, 3, 1, None, vec![cron_trigger(d, due(3), 1)]),
            ],
        )
        .await
        .expect("claim");
    let after = now(&store).await;
    assert_eq!(
        outcome.results,
        vec![
            ClaimResult::Claimed,
            ClaimResult::VersionChanged,
            ClaimResult::Gone,
            ClaimResult::Gone
        ]
    );
    assert!(outcome.now >= before && outcome.now <= after);
    assert_eq!(outcome.next_due, Some(due(1)), "b is still pending");

    // The identical claim again: the score moved.
    let outcome = store
        .claim_fires(1, vec![claim(a, 0, 1, Some(next_a), a_triggers.clone())])
        .await
        .expect("claim again");
    assert_eq!(outcome.results, vec![ClaimResult::Moved]);

    // A claim advances the schedule without being a job change.
    let aj = store.get_job(a).await.expect("get").expect("a");
    assert_eq!((aj.version, aj.next_fire), (1, Some(next_a)));
    let batch = store.due_fires(1, 10).await.expect("due");
    assert_eq!(
        batch.fires,
        vec![DueFire {
            job_id: b.clone(),
            due: due(1),
            planned: due(1),
            version: 2,
        }]
    );
    assert_eq!(batch.next_due, Some(next_a.due));

    // b with its current version, schedule ended, nothing to append.
    let outcome = store
        .claim_fires(1, vec![claim(b, 1, 2, None, vec![])])
        .await
        .expect("claim b");
    assert_eq!(outcome.results, vec![ClaimResult::Claimed]);
    assert_eq!(outcome.next_due, Some(next_a.due));
    let bj = store.get_job(b).await.expect("get").expect("b");
    assert_eq!((bj.version, bj.next_fire), (2, None));
    assert_eq!(store.due_fires(1, 10).await.expect("due").fires, vec![]);

    // Only a's two triggers were queued, in order, stamped with the store's clock.
    let got = drain_triggers(&store, "claims").await;
    assert_eq!(
        schedule_nos(&got),
        a_triggers
            .iter()
            .map(|t| t.schedule_no.clone())
            .collect::<Vec<_>>()
    );
    for (d, want) in got.iter().zip(&a_triggers) {
        assert_eq!(d.trigger.job_id, *a);
        assert_eq!(d.trigger.kind, want.kind);
        assert_eq!(d.trigger.scheduled_at, want.scheduled_at);
        assert!(
            d.trigger.triggered_at >= before && d.trigger.triggered_at <= after,
            "triggered_at {} not the store's claim time [{before}, {after}]",
            d.trigger.triggered_at
        );
        assert!(d.trigger.triggered_at >= due(0));
    }
    let ids: HashSet<_> = got.iter().map(|d| d.entry_id.clone()).collect();
    assert_eq!(ids.len(), got.len(), "entry ids are distinct");
}

/// 200 due jobs, 8 concurrent claimers: every fire is claimed exactly once.
pub async fn claim_race(store: Arc<dyn Store>) {
    const JOBS: usize = 200;
    let t0 = now(&store).await;
    let all: BTreeSet<String> = (0..JOBS).map(|i| format!("race-{i:03}")).collect();
    for (i, id) in all.iter().enumerate() {
        store
            .create_job(job(id, Some(arm(t0 - 10_000 - i as i64))))
            .await
            .expect("create");
    }
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let mut claimed = Vec::new();
            loop {
                let mut saw_any = false;
                for p in 0..store.partitions() {
                    let batch = store.due_fires(p, 16).await.expect("due");
                    if batch.fires.is_empty() {
                        continue;
                    }
                    saw_any = true;
                    let claims: Vec<FireClaim> = batch
                        .fires
                        .iter()
                        .map(|f| FireClaim {
                            job_id: f.job_id.clone(),
                            expected_due: f.due,
                            expected_version: f.version,
                            next: None,
                            triggers: vec![cron_trigger(&f.job_id, f.planned, f.version)],
                        })
                        .collect();
                    let outcome = store.claim_fires(p, claims).await.expect("claim");
                    assert_eq!(outcome.results.len(), batch.fires.len());
                    for (f, r) in batch.fires.iter().zip(outcome.results) {
                        match r {
                            ClaimResult::Claimed => claimed.push(f.job_id.clone()),
                            ClaimResult::Moved => {}
                            other => panic!("unexpected claim result {other:?}"),
                        }
                    }
                }
                if !saw_any {
                    return claimed;
                }
            }
        }));
    }
    let mut claimed = Vec::new();
    for t in tasks {
        claimed.extend(t.await.expect("claimer task"));
    }
    assert_eq!(claimed.len(), JOBS, "Claimed results");
    assert_eq!(claimed.into_iter().collect::<BTreeSet<_>>(), all);

    let got = drain_triggers(&store, "race").await;
    assert_eq!(got.len(), JOBS, "queued triggers");
    let queued: BTreeSet<String> = got.iter().map(|d| d.trigger.job_id.clone()).collect();
    assert_eq!(queued, all, "one trigger per job");
    for p in 0..store.partitions() {
        let batch = store.due_fires(p, 100).await.expect("due");
        assert_eq!((batch.fires, batch.next_due), (vec![], None));
    }
}

// ---- the trigger queue

pub async fn trigger_queue_ack_reclaim(store: Arc<dyn Store>) {
    store
        .create_job(job("queue-1", None))
        .await
        .expect("create");
    let t0 = now(&store).await;
    for no in ["manual-a", "manual-b", "manual-c"] {
        store
            .enqueue_manual(manual_trigger("queue-1", no, t0), None)
            .await
            .expect("enqueue");
    }
    let first = store
        .read_triggers("c1", 2, Duration::from_millis(500))
        .await
        .expect("read");
    assert_eq!(schedule_nos(&first), ["manual-a", "manual-b"]);
    assert!(first.iter().all(|d| d.trigger.triggered_at >= t0));
    assert_eq!(
        first[0].trigger.payload_override.as_deref(),
        Some(&b"override"[..])
    );
    let second = drain_triggers(&store, "c1").await;
    assert_eq!(
        schedule_nos(&second),
        ["manual-c"],
        "delivered entries are not re-read"
    );
    let (a, b, c) = (&first[0], &first[1], &second[0]);

    store.ack_trigger(&a.entry_id).await.expect("ack a");
    assert_eq!(drain_triggers(&store, "c2").await.len(), 0);

    let none = store
        .reclaim_triggers("c2", Duration::from_secs(60), 10)
        .await
        .expect("reclaim");
    assert_eq!(none.len(), 0, "not idle long enough");

    let reclaimed = store
        .reclaim_triggers("c2", Duration::ZERO, 10)
        .await
        .expect("reclaim");
    assert_eq!(
        schedule_nos(&reclaimed),
        ["manual-b", "manual-c"],
        "unacked only"
    );
    assert_eq!(reclaimed[0].entry_id, b.entry_id);
    assert_eq!(reclaimed[1].entry_id, c.entry_id);

    store.ack_trigger(&b.entry_id).await.expect("ack b");
    store.ack_trigger(&b.entry_id).await.expect("ack b again");
    store.ack_trigger(&a.entry_id).await.expect("ack a again");
    let reclaimed = store
        .reclaim_triggers("c3", Duration::ZERO, 10)
        .await
        .expect("reclaim");
    assert_eq!(schedule_nos(&reclaimed), ["manual-c"]);
    store.ack_trigger(&c.entry_id).await.expect("ack c");
    let reclaimed = store
        .reclaim_triggers("c3", Duration::ZERO, 10)
        .await
        .expect("reclaim");
    assert_eq!(reclaimed.len(), 0);
    assert_eq!(drain_triggers(&store, "c3").await.len(), 0);
    store.trim_triggers(now(&store).await).await.expect("trim");
}

pub async fn trigger_read_blocks_until_append(store: Arc<dyn Store>) {
    store
        .create_job(job("block-1", None))
        .await
        .expect("create");

    // Zero block: answers at once.
    let started = Instant::now();
    let got = tokio::time::timeout(
        Duration::from_secs(2),
        store.read_triggers("c", 10, Duration::ZERO),
    )
    .await
    .expect("a zero block must not wait")
    .expect("read");
    assert_eq!(got.len(), 0);
    assert!(started.elapsed() < Duration::from_secs(1));

    // Nothing arrives: waits about `block`, then answers empty.
    let started = Instant::now();
    let got = store
        .read_triggers("c", 10, Duration::from_millis(200))
        .await
        .expect("read");
    assert_eq!(got.len(), 0);
    assert!(started.elapsed() >= Duration::from_millis(150));

    // Something arrives while waiting: woken well before the block ends.
    let reader = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            let started = Instant::now();
            let got = store
                .read_triggers("c", 10, Duration::from_secs(10))
                .await
                .expect("read");
            (got, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = now(&store).await;
    store
        .enqueue_manual(manual_trigger("block-1", "manual-x", t0), None)
        .await
        .expect("enqueue");
    let (got, waited) = reader.await.expect("reader");
    assert_eq!(schedule_nos(&got), ["manual-x"]);
    assert!(waited < Duration::from_secs(5), "woken late: {waited:?}");
}

pub async fn manual_idempotency(store: Arc<dyn Store>) {
    store
        .create_job(job("manual-1", None))
        .await
        .expect("create");
    let t0 = now(&store).await;
    let first = store
        .enqueue_manual(manual_trigger("manual-1", "manual-k1", t0), Some("k1"))
        .await
        .expect("enqueue");
    assert_eq!(
        first,
        Enqueued {
            schedule_id: schedule_id("manual-1", "manual-k1"),
            duplicate: false,
        }
    );
    let again = store
        .enqueue_manual(manual_trigger("manual-1", "manual-other", t0), Some("k1"))
        .await
        .expect("enqueue again");
    assert_eq!(
        again,
        Enqueued {
            schedule_id: schedule_id("manual-1", "manual-k1"),
            duplicate: true,
        }
    );
    // Without a key, every call queues.
    for no in ["manual-u1", "manual-u2"] {
        let e = store
            .enqueue_manual(manual_trigger("manual-1", no, t0), None)
            .await
            .expect("enqueue");
        assert_eq!(
            e,
            Enqueued {
                schedule_id: schedule_id("manual-1", no),
                duplicate: false,
            }
        );
    }
    let got = drain_triggers(&store, "m").await;
    assert_eq!(schedule_nos(&got), ["manual-k1", "manual-u1", "manual-u2"]);
    assert!(got.iter().all(|d| d.trigger.kind == TriggerKind::Manual));
    assert!(got.iter().all(|d| d.trigger.triggered_at >= t0));

    match store
        .enqueue_manual(manual_trigger("manual-none", "manual-z", t0), Some("z"))
        .await
    {
        Err(Error::JobNotFound(id)) => assert_eq!(id, "manual-none"),
        other => panic!("manual trigger of a missing job: expected JobNotFound, got {other:?}"),
    }
    assert_eq!(drain_triggers(&store, "m").await.len(), 0);
}

// ---- runs

pub async fn record_run_idempotent_and_skips(store: Arc<dyn Store>) {
    store.create_job(job("rec-1", None)).await.expect("create");
    let t0 = now(&store).await;

    let given = run("rec-1", 1_000_000, t0);
    let first = store.record_run(given.clone()).await.expect("record");
    assert!(first.created);
    assert_eq!(first.run, given, "recorded as given");
    assert_eq!(
        store.get_run(&given.schedule_id).await.expect("get"),
        Some(given.clone())
    );

    let mut redelivered = given.clone();
    redelivered.state = RunState::Running;
    redelivered.attempt = 2;
    let second = store.record_run(redelivered).await.expect("record again");
    assert!(!second.created);
    assert_eq!(second.run, given, "the stored run, unchanged");
    assert_eq!(
        store.get_run(&given.schedule_id).await.expect("get"),
        Some(given.clone())
    );

    // created_at 0 is filled with the store's now.
    let unstamped = run("rec-1", 2_000_000, 0);
    let rec = store.record_run(unstamped).await.expect("record");
    assert!(rec.run.created_at >= t0 && rec.run.created_at <= now(&store).await);

    // A trigger that says skip: SKIPPED as given, finished by the store's clock.
    let mut skip = cron_trigger("rec-1", 2_500_000, 1);
    skip.skip_reason = Some("misfire".to_owned());
    let rec = store
        .record_run(RunRecord::from_trigger(&skip))
        .await
        .expect("record");
    assert_eq!(
        (rec.run.state, rec.run.reason.as_str()),
        (RunState::Skipped, "misfire")
    );
    assert!(rec.run.finished_at.expect("finished") >= t0);
    assert!(rec.run.created_at >= t0);

    // Paused: SKIPPED (paused).
    let mut j = store.get_job("rec-1").await.expect("get").expect("job");
    j.paused = true;
    store.update_job(j, 1).await.expect("pause");
    let before = now(&store).await;
    let rec = store
        .record_run(run("rec-1", 3_000_000, before))
        .await
        .expect("record");
    assert!(rec.created);
    assert_eq!(rec.run.state, RunState::Skipped);
    assert_eq!(rec.run.reason, "paused");
    let finished = rec.run.finished_at.expect("a skipped run is finished");
    assert!(finished >= before);
    assert_eq!(
        store
            .get_run(&rec.run.schedule_id)
            .await
            .expect("get")
            .map(|r| (r.state, r.reason)),
        Some((RunState::Skipped, "paused".to_owned()))
    );

    // Deleted: SKIPPED (deleted); earlier runs stay.
    store.delete_job("rec-1").await.expect("delete");
    let rec = store
        .record_run(run("rec-1", 4_000_000, now(&store).await))
        .await
        .expect("record");
    assert!(rec.created);
    assert_eq!(rec.run.state, RunState::Skipped);
    assert_eq!(rec.run.reason, "deleted");
    assert!(rec.run.finished_at.is_some());
    assert_eq!(
        store.get_run(&given.schedule_id).await.expect("get"),
        Some(given)
    );
    assert_eq!(store.get_run("rec-1@404").await.expect("get"), None);
}

pub async fn list_runs_order_filter_paging(store: Arc<dyn Store>) {
    store.create_job(job("list-1", None)).await.expect("create");
    store
        .create_job(job("list-10", None))
        .await
        .expect("create");
    let t0 = now(&store).await;
    for i in 1..=30 {
        store
            .record_run(run("list-1", i * 1000, t0))
            .await
            .expect("record");
    }
    // A job whose id extends this one's must not leak into its listing.
    store
        .record_run(run("list-10", 15_500, t0))
        .await
        .expect("record");
    let all_desc: Vec<Millis> = (1..=30).rev().map(|i| i * 1000).collect();

    let q = |limit: usize| RunQuery {
        limit,
        ..RunQuery::default()
    };
    let all = list_all_runs(&store, "list-1", q(7)).await;
    assert_eq!(scheduled(&all), all_desc, "newest first, each once");
    assert!(all.iter().all(|r| r.job_id == "list-1"));
    assert_eq!(
        scheduled(&list_all_runs(&store, "list-1", q(100)).await),
        all_desc
    );

    // from inclusive, to exclusive, paged.
    let window = RunQuery {
        from: Some(5000),
        to: Some(10_000),
        limit: 2,
        cursor: None,
    };
    assert_eq!(
        scheduled(&list_all_runs(&store, "list-1", window.clone()).await),
        [9000, 8000, 7000, 6000, 5000]
    );
    let page = store
        .list_runs(
            "list-1",
            RunQuery {
                limit: 100,
                ..window
            },
        )
        .await
        .expect("list");
    assert_eq!(scheduled(&page.items), [9000, 8000, 7000, 6000, 5000]);
    assert_eq!(page.next_cursor, None);

    // A newer run recorded between pages neither repeats nor shifts the listing.
    let page1 = store.list_runs("list-1", q(10)).await.expect("list");
    assert_eq!(scheduled(&page1.items), all_desc[..10]);
    store
        .record_run(run("list-1", 99_000, t0))
        .await
        .expect("record newer");
    let mut rest = Vec::new();
    let mut cursor = page1.next_cursor;
    while let Some(c) = cursor {
        let page = store
            .list_runs(
                "list-1",
                RunQuery {
                    cursor: Some(c),
                    ..q(10)
                },
            )
            .await
            .expect("list");
        rest.extend(page.items);
        cursor = page.next_cursor;
    }
    assert_eq!(scheduled(&rest), all_desc[10..]);
    let fresh = store.list_runs("list-1", q(1)).await.expect("list");
    assert_eq!(scheduled(&fresh.items), [99_000]);
    assert!(fresh.next_cursor.is_some());

    assert_eq!(
        scheduled(&list_all_runs(&store, "list-10", q(10)).await),
        [15_500]
    );
    assert_eq!(list_all_runs(&store, "list-none", q(10)).await.len(), 0);
}

pub async fn runs_bounded_per_job(store: Arc<dyn Store>) {
    store
        .create_job(job("bound-1", None))
        .await
        .expect("create");
    let t0 = now(&store).await;
    for i in 1..=8 {
        store
            .record_run(run("bound-1", i * 1000, t0))
            .await
            .expect("record");
    }
    let q = RunQuery {
        limit: 100,
        ..RunQuery::default()
    };
    let kept = list_all_runs(&store, "bound-1", q).await;
    assert_eq!(
        scheduled(&kept),
        [8000, 7000, 6000, 5000, 4000],
        "oldest fall out"
    );
    for (at, present) in [(1000, false), (3000, false), (4000, true), (8000, true)] {
        let sid = schedule_id("bound-1", &at.to_string());
        assert_eq!(
            store.get_run(&sid).await.expect("get").is_some(),
            present,
            "run {sid}"
        );
    }
}

pub async fn run_retention(store: Arc<dyn Store>) {
    store.create_job(job("ret-1", None)).await.expect("create");
    let r = run("ret-1", 1000, 0);
    assert!(store.record_run(r.clone()).await.expect("record").created);
    assert!(store.get_run(&r.schedule_id).await.expect("get").is_some());
    let q = RunQuery {
        limit: 10,
        ..RunQuery::default()
    };
    assert_eq!(list_all_runs(&store, "ret-1", q.clone()).await.len(), 1);

    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(store.get_run(&r.schedule_id).await.expect("get"), None);
    assert_eq!(list_all_runs(&store, "ret-1", q).await.len(), 0);
    // Gone means gone: the same schedule_id records anew.
    assert!(store.record_run(r.clone()).await.expect("record").created);
}

// ---- the run state machine
//
// Shared shape of these checks: `begin_run` with a long route grace (so no timer fires
// unless a check wants it), explicit plans, and nodes named per check. Times the store
// stamps are checked against the store's clock read just before and after the call.

/// The route grace most checks use: long enough that a run's wake-up timer stays quiet.
const GRACE: Duration = Duration::from_secs(30);

/// A lease no check outlives, for checks not about expiry.
const LONG: LeaseTerms = LeaseTerms {
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

fn slot(node_id: &str, max_concurrency: u32) -> NodeSlot {
    NodeSlot {
        node_id: node_id.to_owned(),
        max_concurrency,
    }
}

fn terms(ttl_ms: u64, confirm_ms: u64) -> LeaseTerms {
    LeaseTerms {
        ttl: Duration::from_millis(ttl_ms),
        confirm_within: Duration::from_millis(confirm_ms),
    }
}

fn outcome(state: RunState) -> Outcome {
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

pub async fn begin_run_idempotent_and_skips(store: Arc<dyn Store>) {
    store
        .create_job(job("begin-1", None))
        .await
        .expect("create");

    let before = now(&store).await;
    let begun = begin(
        &store,
        planned_run("begin-1", 1000, plan(OverlapPolicy::Allow)),
    )
    .await;
    let after = now(&store).await;
    let r = begun.run.clone();
    assert!(begun.revoked.is_empty());
    assert_eq!(
        (r.state, r.attempt, r.reason.as_str()),
        (RunState::Waiting, 1, "")
    );
    assert_near(r.created_at, before, after, 0, "created_at");
    assert_near(
        r.deadlines.wake_at,
        before,
        after,
        30_000,
        "wake_at = now + grace",
    );
    assert_near(r.deadlines.wait_until, before, after, 5_000, "wait_until");
    assert_eq!(
        (
            r.deadlines.lease_expires,
            r.deadlines.confirm_by,
            r.deadlines.timeout_at
        ),
        (0, 0, 0)
    );
    assert_eq!((r.finished_at, r.fencing_token), (None, 0));
    assert_eq!(get(&store, &r.schedule_id).await, r);
    let listed = store
        .list_runs("begin-1", RunQuery::default())
        .await
        .expect("list");
    assert_eq!(listed.items, vec![r.clone()], "indexed under its job");

    // A redelivered trigger finds the run as it is now.
    let again = store
        .begin_run(
            planned_run("begin-1", 1000, plan(OverlapPolicy::Forbid)),
            GRACE,
        )
        .await
        .expect("begin again");
    assert!(!again.created && again.revoked.is_empty());
    assert_eq!(again.run, r);
    grant(&store, &r.schedule_id, 1, &slot("n", 0), LONG).await;
    let again = store
        .begin_run(
            planned_run("begin-1", 1000, plan(OverlapPolicy::Allow)),
            GRACE,
        )
        .await
        .expect("begin again");
    assert!(!again.created);
    assert_eq!(again.run.state, RunState::Dispatched);

    // A trigger that says skip keeps its reason; SKIPPED runs are finished at once and
    // never active, so they do not count for the overlap policy.
    let mut skip = cron_trigger("begin-1", 2000, 1);
    skip.skip_reason = Some("misfire".to_owned());
    let before = now(&store).await;
    let skipped = begin(
        &store,
        RunRecord {
            plan: plan(OverlapPolicy::Forbid),
            ..RunRecord::from_trigger(&skip)
        },
    )
    .await
    .run;
    assert_eq!(
        (skipped.state, skipped.reason.as_str()),
        (RunState::Skipped, "misfire")
    );
    assert!(skipped.finished_at.expect("finished") >= before);
    assert_eq!(skipped.deadlines.earliest(), None);

    // Paused, then deleted: SKIPPED with the reason, whatever the policy.
    let mut j = store.get_job("begin-1").await.expect("get").expect("job");
    j.paused = true;
    store.update_job(j, 1).await.expect("pause");
    let paused = begin(
        &store,
        planned_run("begin-1", 3000, plan(OverlapPolicy::Replace)),
    )
    .await;
    assert_eq!(
        (paused.run.state, paused.run.reason.as_str()),
        (RunState::Skipped, "paused")
    );
    assert!(paused.revoked.is_empty(), "a skipped run replaces nothing");
    assert!(paused.run.finished_at.is_some());
    store.delete_job("begin-1").await.expect("delete");
    let deleted = begin(
        &store,
        planned_run("begin-1", 4000, plan(OverlapPolicy::Allow)),
    )
    .await;
    assert_eq!(
        (deleted.run.state, deleted.run.reason.as_str()),
        (RunState::Skipped, "deleted")
    );
    assert_eq!(
        get(&store, &r.schedule_id).await.state,
        RunState::Dispatched,
        "the replace policy of a skipped run touched nothing"
    );
}

pub async fn overlap_allow_and_forbid(store: Arc<dyn Store>) {
    store.create_job(job("ovl-a", None)).await.expect("create");
    store.create_job(job("ovl-f", None)).await.expect("create");

    // allow: every run starts.
    for planned in [1000, 2000, 3000] {
        let b = begin(
            &store,
            planned_run("ovl-a", planned, plan(OverlapPolicy::Allow)),
        )
        .await;
        assert_eq!(b.run.state, RunState::Waiting);
    }

    // forbid: a run while another is active (WAITING, DISPATCHED, RUNNING) is SKIPPED.
    let first = begin(
        &store,
        planned_run("ovl-f", 1000, plan(OverlapPolicy::Forbid)),
    )
    .await
    .run;
    assert_eq!(first.state, RunState::Waiting);
    let before = now(&store).await;
    let second = begin(
        &store,
        planned_run("ovl-f", 2000, plan(OverlapPolicy::Forbid)),
    )
    .await
    .run;
    assert_eq!(
        (second.state, second.reason.as_str()),
        (RunState::Skipped, "overlap")
    );
    assert!(second.finished_at.expect("finished") >= before);
    let held = grant(&store, &first.schedule_id, 1, &slot("n", 0), LONG).await;
    assert_eq!(
        begin(
            &store,
            planned_run("ovl-f", 3000, plan(OverlapPolicy::Forbid))
        )
        .await
        .run
        .state,
        RunState::Skipped
    );
    store
        .mark_started(&held.schedule_id, held.fencing_token)
        .await
        .expect("start");
    assert_eq!(
        begin(
            &store,
            planned_run("ovl-f", 4000, plan(OverlapPolicy::Forbid))
        )
        .await
        .run
        .reason,
        "overlap"
    );
    // Once it is final the job is free again.
    let done = store
        .finish_run(
            &held.schedule_id,
            Finisher::Token(held.fencing_token),
            outcome(RunState::Succeeded),
        )
        .await
        .expect("finish");
    assert_eq!(done.applied, Applied::Yes);
    assert_eq!(done.next_serial, None);
    assert_eq!(
        begin(
            &store,
            planned_run("ovl-f", 5000, plan(OverlapPolicy::Forbid))
        )
        .await
        .run
        .state,
        RunState::Waiting
    );
}

pub async fn overlap_serial_queue(store: Arc<dyn Store>) {
    store.create_job(job("ser", None)).await.expect("create");
    let serial = RunPlan {
        serial_limit: 2,
        ..plan(OverlapPolicy::Serial)
    };
    let sid = |planned: i64| schedule_id("ser", &planned.to_string());
    let r1 = begin(&store, planned_run("ser", 1000, serial.clone()))
        .await
        .run;
    assert_eq!((r1.state, r1.reason.as_str()), (RunState::Waiting, ""));
    assert!(r1.deadlines.wake_at > 0, "the first run routes at once");
    for planned in [2000, 3000] {
        let q = begin(&store, planned_run("ser", planned, serial.clone()))
            .await
            .run;
        assert_eq!((q.state, q.reason.as_str()), (RunState::Waiting, "queued"));
        assert_eq!(
            q.deadlines,
            Deadlines::default(),
            "a queued run has no timer"
        );
    }
    let full = begin(&store, planned_run("ser", 4000, serial.clone()))
        .await
        .run;
    assert_eq!(
        (full.state, full.reason.as_str()),
        (RunState::Skipped, "serial queue full")
    );
    assert!(full.finished_at.is_some());

    // A queued run cannot be routed.
    let a = store
        .assign_run(&sid(2000), 1, &slot("n", 0), LONG)
        .await
        .expect("assign");
    assert_eq!(not_waiting_state(&a), Some(RunState::Waiting), "{a:?}");

    // The running run finishes: the queue pops its head, due to route now.
    let h1 = grant(&store, &r1.schedule_id, 1, &slot("n", 0), LONG).await;
    let before = now(&store).await;
    let t = store
        .finish_run(
            &r1.schedule_id,
            Finisher::Token(h1.fencing_token),
            outcome(RunState::Succeeded),
        )
        .await
        .expect("finish");
    let after = now(&store).await;
    assert_eq!(t.applied, Applied::Yes);
    assert_eq!(t.next_serial, Some(sid(2000)));
    let r2 = get(&store, &sid(2000)).await;
    assert_eq!((r2.state, r2.reason.as_str()), (RunState::Waiting, ""));
    assert_near(r2.deadlines.wake_at, before, after, 0, "popped wake_at");
    assert_near(
        r2.deadlines.wait_until,
        before,
        after,
        5_000,
        "popped wait_until",
    );
    assert_eq!(get(&store, &sid(3000)).await.reason, "queued");
    // The popped run is due for the sweep, so a dispatcher that died still routes it.
    let due = store
        .due_runs(partition_of("ser", store.partitions()), 10)
        .await
        .expect("due");
    assert_eq!(due, vec![sid(2000)]);

    // The queue has room again.
    let q5 = begin(&store, planned_run("ser", 5000, serial.clone()))
        .await
        .run;
    assert_eq!(q5.reason, "queued");

    // Cancelling the running run pops the next one too…
    let t = store
        .cancel_run(&sid(2000), "by user")
        .await
        .expect("cancel");
    assert_eq!(t.applied, Applied::Yes);
    assert_eq!(t.next_serial, Some(sid(3000)));
    assert!(get(&store, &sid(3000)).await.deadlines.wake_at > 0);
    // …and so does a serial run that found no executor.
    let t = store
        .finish_run(
            &sid(3000),
            Finisher::Waiting { attempt: 1 },
            failed("no executor"),
        )
        .await
        .expect("finish");
    assert_eq!(t.applied, Applied::Yes);
    assert_eq!(t.run.expect("run").state, RunState::Failed);
    assert_eq!(t.next_serial, Some(sid(5000)));
    // The queue is empty: nothing pops, and the next run starts at once.
    let t = store
        .cancel_run(&sid(5000), "by user")
        .await
        .expect("cancel");
    assert_eq!(t.next_serial, None);
    let r6 = begin(&store, planned_run("ser", 6000, serial)).await.run;
    assert_eq!((r6.state, r6.reason.as_str()), (RunState::Waiting, ""));
    assert!(r6.deadlines.wake_at > 0);
}

/// Serial means one at a time: a queued run leaves the queue only when no run of the
/// job that is not queued is still active.
pub async fn serial_queue_one_at_a_time(store: Arc<dyn Store>) {
    store.create_job(job("one", None)).await.expect("create");
    let serial = plan(OverlapPolicy::Serial);
    let sid = |planned: i64| schedule_id("one", &planned.to_string());
    for planned in [1000, 2000, 3000] {
        begin(&store, planned_run("one", planned, serial.clone())).await;
    }
    assert_eq!(get(&store, &sid(3000)).await.reason, "queued");

    // Nobody may route a queued run, so nobody may find that no executor takes it:
    // failing it "for want of an executor" would release the run behind it early.
    let t = store
        .finish_run(
            &sid(2000),
            Finisher::Waiting { attempt: 1 },
            failed("no executor"),
        )
        .await
        .expect("finish");
    assert!(matches!(t.applied, Applied::No(_)), "{t:?}");
    assert_eq!(t.next_serial, None);
    let r2 = get(&store, &sid(2000)).await;
    assert_eq!(
        (r2.state, r2.reason.as_str()),
        (RunState::Waiting, "queued")
    );

    // Cancelling a queued run while the first one is active releases nothing.
    let t = store
        .cancel_run(&sid(2000), "by user")
        .await
        .expect("cancel");
    assert_eq!(t.applied, Applied::Yes);
    assert_eq!(t.revoked, vec![]);
    assert_eq!(t.next_serial, None, "run 1000 still holds the line");
    let r3 = get(&store, &sid(3000)).await;
    assert_eq!(
        (r3.reason.as_str(), r3.deadlines.wake_at),
        ("queued", 0),
        "still queued"
    );
    // The first one ends: now the queue pops.
    let t = store
        .cancel_run(&sid(1000), "by user")
        .await
        .expect("cancel");
    assert_eq!(t.next_serial, Some(sid(3000)));
}

pub async fn overlap_replace(store: Arc<dyn Store>) {
    store.create_job(job("rep", None)).await.expect("create");
    let node = slot("rep-node", 1);
    let a = begin(
        &store,
        planned_run("rep", 1000, plan(OverlapPolicy::Serial)),
    )
    .await
    .run;
    let held_a = grant(&store, &a.schedule_id, 1, &node, LONG).await;
    let b = begin(
        &store,
        planned_run("rep", 2000, plan(OverlapPolicy::Serial)),
    )
    .await
    .run;
    assert_eq!(b.reason, "queued");

    let before = now(&store).await;
    let c = begin(
        &store,
        planned_run("rep", 3000, plan(OverlapPolicy::Replace)),
    )
    .await;
    assert_eq!(
        c.revoked,
        vec![Revocation {
            schedule_id: a.schedule_id.clone(),
            node_id: "rep-node".to_owned(),
            token: held_a.fencing_token,
            reason: "replaced".to_owned(),
        }],
        "only a leased run has a holder to tell"
    );
    assert_eq!(
        (c.run.state, c.run.reason.as_str()),
        (RunState::Waiting, "")
    );
    assert!(c.run.deadlines.wake_at > 0);
    for old in [&a.schedule_id, &b.schedule_id] {
        let r = get(&store, old).await;
        assert_eq!(
            (r.state, r.reason.as_str()),
            (RunState::Cancelled, "replaced")
        );
        assert!(r.finished_at.expect("finished") >= before);
        assert_eq!(r.deadlines, Deadlines::default());
    }
    // The old holder is fenced off…
    let a_now = get(&store, &a.schedule_id).await;
    assert!(a_now.fencing_token > held_a.fencing_token);
    let t = store
        .mark_started(&a.schedule_id, held_a.fencing_token)
        .await
        .expect("start");
    assert!(matches!(t.applied, Applied::No(_)), "{t:?}");
    let t = store
        .finish_run(
            &a.schedule_id,
            Finisher::Token(held_a.fencing_token),
            outcome(RunState::Succeeded),
        )
        .await
        .expect("finish");
    assert!(matches!(t.applied, Applied::No(_)), "{t:?}");
    // …and its node slot is free for the new run.
    grant(&store, &c.run.schedule_id, 1, &node, LONG).await;
    // The queued run was dequeued: nothing pops when the new run ends.
    let d = begin(
        &store,
        planned_run("rep", 4000, plan(OverlapPolicy::Replace)),
    )
    .await;
    assert_eq!(d.revoked.len(), 1);
    assert_eq!(d.revoked[0].schedule_id, c.run.schedule_id);
    let t = store
        .cancel_run(&d.run.schedule_id, "done")
        .await
        .expect("cancel");
    assert_eq!(t.next_serial, None);
    assert_eq!(get(&store, &b.schedule_id).await.state, RunState::Cancelled);
}

pub async fn assign_run_tokens_and_capacity(store: Arc<dyn Store>) {
    store.create_job(job("asg", None)).await.expect("create");
    let timed = RunPlan {
        timeout_ms: 60_000,
        ..plan(OverlapPolicy::Allow)
    };
    let mut sids = Vec::new();
    for i in 1..=6 {
        let r = begin(&store, planned_run("asg", i * 1000, timed.clone()))
            .await
            .run;
        sids.push(r.schedule_id);
    }
    let n = slot("asg-n", 2);

    let before = now(&store).await;
    let r1 = grant(&store, &sids[0], 1, &n, terms(10_000, 4_000)).await;
    let after = now(&store).await;
    assert_eq!(
        (
            r1.state,
            r1.node_id.as_str(),
            r1.attempt,
            r1.reason.as_str()
        ),
        (RunState::Dispatched, "asg-n", 1, "")
    );
    assert!(r1.fencing_token > 0);
    assert_near(
        r1.deadlines.lease_expires,
        before,
        after,
        10_000,
        "lease_expires",
    );
    assert_near(r1.deadlines.confirm_by, before, after, 4_000, "confirm_by");
    assert_near(r1.deadlines.timeout_at, before, after, 60_000, "timeout_at");
    assert_eq!((r1.deadlines.wake_at, r1.deadlines.wait_until), (0, 0));
    assert_eq!(get(&store, &sids[0]).await, r1);

    let r2 = grant(&store, &sids[1], 1, &n, LONG).await;
    assert!(r2.fencing_token > r1.fencing_token, "tokens grow per job");
    // At its max concurrency the node takes nothing more; the run is left as it was.
    assert_eq!(
        store
            .assign_run(&sids[2], 1, &n, LONG)
            .await
            .expect("assign"),
        Assigned::NodeFull
    );
    assert_eq!(get(&store, &sids[2]).await.state, RunState::Waiting);
    // Another node (no limit) does.
    let r3 = grant(&store, &sids[2], 1, &slot("asg-m", 0), LONG).await;
    assert!(r3.fencing_token > r2.fencing_token);

    // Not WAITING at that attempt, or gone.
    let a = store.assign_run(&sids[0], 1, &slot("asg-m", 0), LONG).await;
    assert_eq!(
        not_waiting_state(&a.expect("assign")),
        Some(RunState::Dispatched)
    );
    let a = store
        .assign_run(&sids[3], 2, &slot("asg-m", 0), LONG)
        .await
        .expect("assign");
    assert_eq!(
        not_waiting_state(&a),
        Some(RunState::Waiting),
        "wrong attempt"
    );
    assert_eq!(
        store
            .assign_run("asg@404", 1, &slot("asg-m", 0), LONG)
            .await
            .expect("assign"),
        Assigned::NotWaiting(None)
    );

    // A run that ends (finished or cancelled) frees its slot.
    store
        .finish_run(
            &sids[0],
            Finisher::Token(r1.fencing_token),
            outcome(RunState::Succeeded),
        )
        .await
        .expect("finish");
    let r4 = grant(&store, &sids[3], 1, &n, LONG).await;
    assert_eq!(
        store
            .assign_run(&sids[4], 1, &n, LONG)
            .await
            .expect("assign"),
        Assigned::NodeFull
    );
    store.cancel_run(&sids[1], "test").await.expect("cancel");
    let r5 = grant(&store, &sids[4], 1, &n, LONG).await;
    assert!(r5.fencing_token > r4.fencing_token && r4.fencing_token > r3.fencing_token);

    // Tokens grow across many grants of one job, whatever the run.
    let mut last = r5.fencing_token;
    for i in 0..20 {
        let r = begin(
            &store,
            planned_run("asg", 100_000 + i, plan(OverlapPolicy::Allow)),
        )
        .await
        .run;
        let g = grant(&store, &r.schedule_id, 1, &slot("asg-many", 0), LONG).await;
        assert!(
            g.fencing_token > last,
            "grant {i}: {} after {last}",
            g.fencing_token
        );
        last = g.fencing_token;
    }
}

pub async fn assign_run_race(store: Arc<dyn Store>) {
    store.create_job(job("race", None)).await.expect("create");
    let two = RunPlan {
        max_attempts: 2,
        backoff_ms: 1,
        ..plan(OverlapPolicy::Allow)
    };
    let r = begin(&store, planned_run("race", 1000, two)).await.run;
    let sid = r.schedule_id.clone();

    // Eight dispatchers route the same run at once, each to its own node: exactly one
    // wins, and the losers see it taken. Then again for the second attempt.
    let mut last_token = 0;
    for attempt in 1..=2u32 {
        let barrier = Arc::new(tokio::sync::Barrier::new(8));
        let mut tasks = Vec::new();
        for i in 0..8 {
            let (store, barrier, sid) = (Arc::clone(&store), Arc::clone(&barrier), sid.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                store
                    .assign_run(&sid, attempt, &slot(&format!("race-{i}"), 1), LONG)
                    .await
                    .expect("assign")
            }));
        }
        let mut winners = Vec::new();
        for t in tasks {
            match t.await.expect("task") {
                Assigned::Granted(run) => winners.push(run),
                Assigned::NotWaiting(Some(run)) => {
                    assert_eq!((run.state, run.attempt), (RunState::Dispatched, attempt));
                }
                other => panic!("attempt {attempt}: unexpected {other:?}"),
            }
        }
        assert_eq!(winners.len(), 1, "attempt {attempt}: one grant");
        let won = winners.remove(0);
        assert!(won.fencing_token > last_token);
        last_token = won.fencing_token;
        assert_eq!(get(&store, &sid).await, won);
        let t = store
            .finish_run(&sid, Finisher::Token(won.fencing_token), failed("boom"))
            .await
            .expect("finish");
        assert_eq!(t.applied, Applied::Yes);
    }
    assert_eq!(get(&store, &sid).await.state, RunState::Failed);

    // Eight runs race for a node with three slots: exactly three fit.
    let mut sids = Vec::new();
    for i in 0..8 {
        let r = begin(
            &store,
            planned_run("race", 10_000 + i, plan(OverlapPolicy::Allow)),
        )
        .await
        .run;
        sids.push(r.schedule_id);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(8));
    let mut tasks = Vec::new();
    for sid in sids {
        let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store
                .assign_run(&sid, 1, &slot("race-small", 3), LONG)
                .await
                .expect("assign")
        }));
    }
    let (mut granted, mut full) = (0, 0);
    for t in tasks {
        match t.await.expect("task") {
            Assigned::Granted(_) => granted += 1,
            Assigned::NodeFull => full += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((granted, full), (3, 5));
}

pub async fn mark_started_transitions(store: Arc<dyn Store>) {
    store.create_job(job("start", None)).await.expect("create");
    let r = begin(
        &store,
        planned_run("start", 1000, plan(OverlapPolicy::Allow)),
    )
    .await
    .run;
    let sid = r.schedule_id.as_str();
    let t = store.mark_started(sid, 1).await.expect("start");
    assert!(matches!(t.applied, Applied::No(_)), "WAITING: {t:?}");
    assert_eq!(t.run.map(|r| r.state), Some(RunState::Waiting));

    let g = grant(&store, sid, 1, &slot("n", 0), terms(30_000, 10_000)).await;
    let t = store
        .mark_started(sid, g.fencing_token + 1)
        .await
        .expect("start");
    assert!(matches!(t.applied, Applied::No(_)), "wrong token: {t:?}");
    let before = now(&store).await;
    let t = store
        .mark_started(sid, g.fencing_token)
        .await
        .expect("start");
    let after = now(&store).await;
    assert_eq!(t.applied, Applied::Yes);
    assert_eq!((t.revoked, t.next_serial), (vec![], None));
    let running = t.run.expect("run");
    assert_eq!(running.state, RunState::Running);
    assert_near(
        running.started_at.expect("started"),
        before,
        after,
        0,
        "started_at",
    );
    assert_eq!(running.deadlines.confirm_by, 0);
    assert_eq!(running.deadlines.lease_expires, g.deadlines.lease_expires);
    assert_eq!(get(&store, sid).await, running);

    let t = store
        .mark_started(sid, g.fencing_token)
        .await
        .expect("start");
    assert_eq!(t.applied, Applied::Already);
    assert_eq!(t.run, Some(running));

    store
        .finish_run(
            sid,
            Finisher::Token(g.fencing_token),
            outcome(RunState::Succeeded),
        )
        .await
        .expect("finish");
    let t = store
        .mark_started(sid, g.fencing_token)
        .await
        .expect("start");
    assert!(matches!(t.applied, Applied::No(_)), "final: {t:?}");
    let t = store.mark_started("start@404", 1).await.expect("start");
    assert!(matches!(t.applied, Applied::No(_)));
    assert_eq!(t.run, None);
}

pub async fn renew_leases_extend_and_confirm(store: Arc<dyn Store>) {
    store.create_job(job("renew", None)).await.expect("create");
    let mut sids = Vec::new();
    for i in 1..=3 {
        let r = begin(
            &store,
            planned_run("renew", i * 1000, plan(OverlapPolicy::Allow)),
        )
        .await
        .run;
        sids.push(r.schedule_id);
    }
    let n = slot("renew-n", 0);
    let a = grant(&store, &sids[0], 1, &n, terms(500, 300)).await;
    let b = grant(&store, &sids[1], 1, &n, terms(500, 300)).await;
    let c = grant(&store, &sids[2], 1, &slot("renew-m", 0), terms(500, 300)).await;
    let held = |r: &RunRecord, token: u64| Held {
        schedule_id: r.schedule_id.clone(),
        token,
    };

    // Current → renewed for the new ttl; a wrong token, another node's run or an
    // unknown run → gone.
    let before = now(&store).await;
    let got = store
        .renew_leases(
            "renew-n",
            &[
                held(&a, a.fencing_token),
                held(&b, b.fencing_token + 1),
                held(&c, c.fencing_token),
                Held {
                    schedule_id: "renew@404".to_owned(),
                    token: 1,
                },
            ],
            Duration::from_millis(900),
        )
        .await
        .expect("renew");
    let after = now(&store).await;
    assert_eq!(got, vec![Some(900), None, None, None]);
    let a_now = get(&store, &sids[0]).await;
    assert_near(
        a_now.deadlines.lease_expires,
        before,
        after,
        900,
        "renewed lease",
    );
    assert_eq!(
        a_now.deadlines.confirm_by, 0,
        "a listed dispatch is confirmed"
    );
    assert_eq!(a_now.state, RunState::Dispatched);
    assert_eq!(
        store
            .renew_leases("renew-n", &[], Duration::from_millis(900))
            .await
            .expect("renew"),
        Vec::<Option<i64>>::new()
    );

    // Past the confirm deadline: the confirmed dispatch stays, the unconfirmed one is
    // re-routed.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let t = store.expire_run(&sids[0], GRACE).await.expect("expire");
    assert!(matches!(t.applied, Applied::No(_)), "confirmed: {t:?}");
    assert_eq!(t.revoked, vec![]);
    assert_eq!(get(&store, &sids[0]).await.state, RunState::Dispatched);
    let t = store.expire_run(&sids[1], GRACE).await.expect("expire");
    assert_eq!(t.applied, Applied::Yes);
    assert_eq!(revocation_of(&t).reason, "unconfirmed");

    // An expired lease is not renewed, even with its current token.
    let got = store
        .renew_leases(
            "renew-m",
            &[held(&c, c.fencing_token)],
            Duration::from_millis(900),
        )
        .await
        .expect("renew");
    assert_eq!(got, vec![None]);
    // Nor a revoked one.
    let got = store
        .renew_leases(
            "renew-n",
            &[held(&b, b.fencing_token)],
            Duration::from_millis(900),
        )
        .await
        .expect("renew");
    assert_eq!(got, vec![None]);
    // The confirmed run's renewed lease runs out too: that is a lost run, not an
    // unconfirmed one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        store
            .renew_leases("renew-n", &[held(&a, a.fencing_token)], LONG.ttl)
            .await
            .expect("renew"),
        vec![None]
    );
    let t = store.expire_run(&sids[0], GRACE).await.expect("expire");
    assert_eq!(t.applied, Applied::Yes);
    assert_eq!(revocation_of(&t).reason, "lost");
    let r = t.run.expect("run");
    assert_eq!((r.state, r.reason.as_str()), (RunState::Failed, "lost"));
}

pub async fn finish_run_outcomes(store: Arc<dyn Store>) {
    store.create_job(job("fin", None)).await.expect("create");
    let sid = |planned: i64| schedule_id("fin", &planned.to_string());
    for planned in [1000, 2000, 3000] {
        begin(
            &store,
            planned_run("fin", planned, plan(OverlapPolicy::Allow)),
        )
        .await;
    }
    let n = slot("fin-n", 1);

    // SUCCEEDED: final, with the executor's output and times; the token stays.
    let g = grant(&store, &sid(1000), 1, &n, LONG).await;
    store
        .mark_started(&sid(1000), g.fencing_token)
        .await
        .expect("start");
    let result = Outcome {
        output: Some(b"{\"ok\":true}".to_vec()),
        started_at: Some(1_111),
        finished_at: Some(2_222),
        ..outcome(RunState::Succeeded)
    };
    let t = store
        .finish_run(&sid(1000), Finisher::Token(g.fencing_token), result.clone())
        .await
        .expect("finish");
    assert_eq!(t.applied, Applied::Yes);
    assert_eq!((t.revoked.clone(), t.next_serial.clone()), (vec![], None));
    let done = t.run.expect("run");
    assert_eq!(
        (done.state, done.fencing_token, done.reason.as_str()),
        (RunState::Succeeded, g.fencing_token, "")
    );
    assert_eq!(done.output.as_deref(), Some(&b"{\"ok\":true}"[..]));
    assert_eq!(
        (done.started_at, done.finished_at),
        (Some(1_111), Some(2_222))
    );
    assert_eq!(done.deadlines, Deadlines::default());
    assert_eq!(get(&store, &sid(1000)).await, done);
    assert_eq!(
        store
            .due_runs(partition_of("fin", store.partitions()), 10)
            .await
            .expect("due"),
        Vec::<String>::new()
    );

    // The same result again (a reconnect re-sends it): Already, nothing changes, even
    // if it differs. A stale token or a WAITING finisher: No.
    let t = store
        .finish_run(
            &sid(1000),
            Finisher::Token(g.fencing_token),
            outcome(RunState::Failed),
        )
        .await
        .expect("finish");
    assert_eq!(t.applied, Applied::Already);
    assert_eq!(t.run.as_ref(), Some(&done));
    let t = store
        .finish_run(
            &sid(1000),
            Finisher::Token(g.fencing_token - 1),
            result.clone(),
        )
        .await
        .expect("finish");
    assert!(matches!(t.applied, Applied::No(_)), "{t:?}");
    let t = store
        .finish_run(&sid(1000), Finisher::Waiting { attempt: 1 }, result.clone())
        .await
        .expect("finish");
    assert!(matches!(t.applied, Applied::No(_)), "{t:?}");
    assert_eq!(get(&store, &sid(1000)).await, done);

    // Without times: the store's clock; the slot was freed by the first result.
    let g = grant(&store, &sid(2000), 1, &n, LONG).await;
    let before = now(&store).await;
    let t = store
        .finish_run(
            &sid(2000),
            Finisher::Token(g.fencing_token),
            outcome(RunState::Cancelled),
        )
        .await
        .expect("finish");
    let after = now(&store).await;
    let r = t.run.expect("run");
    assert_eq!(r.state, RunState::Cancelled, "an executor may cancel");
    assert_near(
        r.finished_at.expect("finished"),
        before,
        after,
        0,
        "finished_at",
    );
    assert_eq!(r.started_at, None);
    assert_eq!(r.output, None);

    // A finisher that is not DISPATCHED/RUNNING yet: No.
    let t = store
        .finish_run(&sid(3000), Finisher::Token(0), outcome(RunState::Succeeded))
        .await
        .expect("finish");
    assert!(matches!(t.applied, Applied::No(_)), "{t:?}");
    let t = store
        .finish_run("fin@404", Finisher::Token(1), outcome(RunState::Succeeded))
        .await
        .expect("finish");
    assert!(matches!(t.applied, Applied::No(_)));
    assert_eq!(t.run, None);
}

pub async fn finish_run_retries(store: Arc<dyn Store>) {
    store.create_job(job("retry", None)).await.expect("create");
    let three = RunPlan {
        max_attempts: 3,
        backoff_ms: 1_000,
        backoff_multiplier: 2.0,
        max_backoff_ms: 60_000,
        ..plan(OverlapPolicy::Forbid)
    };
    let r = begin(&store, planned_run("retry", 1000, three.clone()))
        .await
        .run;
    let sid = r.schedule_id.as_str();
    let n = slot("retry-n", 1);

    // Attempt 1 fails: WAITING at attempt 2 after the backoff, under a new token.
    let g1 = grant(&store, sid, 1, &n, LONG).await;
    let before = now(&store).await;
    let t = store
        .finish_run(sid, Finisher::Token(g1.fencing_token), failed("E1"))
        .await
        .expect("finish");
    let after = now(&store).await;
    assert_eq!(t.applied, Applied::Yes);
    assert_eq!((t.revoked.clone(), t.next_serial.clone()), (vec![], None));
    let w = t.run.expect("run");
    assert_eq!(
        (w.state, w.attempt, w.reason.as_str()),
        (RunState::Waiting, 2, "retry: E1")
    );
    assert!(
        w.fencing_token > g1.fencing_token,
        "a retry fences the old token"
    );
    assert_eq!(
        (
            w.error_code.as_str(),
            w.error_message.as_str(),
            w.last_node.as_str()
        ),
        ("E1", "E1 happened", "retry-n")
    );
    assert_near(
        w.deadlines.wake_at,
        before,
        after,
        1_000,
        "backoff after attempt 1",
    );
    assert_eq!(w.deadlines.wait_until, w.deadlines.wake_at + 5_000);
    assert_eq!(w.deadlines.lease_expires, 0);
    assert_eq!(w.finished_at, None);
    assert_eq!(get(&store, sid).await, w);
    // Still active: the forbid policy still skips.
    assert_eq!(
        begin(&store, planned_run("retry", 2000, three.clone()))
            .await
            .run
            .reason,
        "overlap"
    );
    // The old holder's re-sent result is stale now; the old attempt is not routable.
    let t = store
        .finish_run(sid, Finisher::Token(g1.fencing_token), failed("E1"))
        .await
        .expect("finish");
    assert!(matches!(t.applied, Applied::No(_)), "{t:?}");
    let a = store.assign_run(sid, 1, &n, LONG).await.expect("assign");
    assert_eq!(not_waiting_state(&a), Some(RunState::Waiting));

    // Attempt 2 fails: the backoff doubles (the node slot was freed).
    let g2 = grant(&store, sid, 2, &n, LONG).await;
    assert!(g2.fencing_token > w.fencing_token);
    let before = now(&store).await;
    let t = store
        .finish_run(sid, Finisher::Token(g2.fencing_token), failed("E2"))
        .await
        .expect("finish");
    let after = now(&store).await;
    let w = t.run.expect("run");
    assert_eq!((w.state, w.attempt), (RunState::Waiting, 3));
    assert_near(
        w.deadlines.wake_at,
        before,
        after,
        2_000,
        "backoff after attempt 2",
    );

    // Attempt 3 fails: attempts are spent, FAILED is final and keeps the token.
    let g3 = grant(&store, sid, 3, &n, LONG).await;
    let t = store
        .finish_run(sid, Finisher::Token(g3.fencing_token), failed("E3"))
        .await
        .expect("finish");
    let f = t.run.expect("run");
    assert_eq!(
        (f.state, f.attempt, f.fencing_token),
        (RunState::Failed, 3, g3.fencing_token)
    );
    assert_eq!((f.error_code.as_str(), f.reason.as_str()), ("E3", ""));
    assert!(f.finished_at.is_some());
    assert_eq!(f.deadlines, Deadlines::default());
    let t = store
        .finish_run(sid, Finisher::Token(g3.fencing_token), failed("E3"))
        .await
        .expect("finish");
    assert_eq!(t.applied, Applied::Already);
    // No longer active.
    assert_eq!(
        begin(&store, planned_run("retry", 3000, three.clone()))
            .await
            .run
            .state,
        RunState::Waiting
    );

    // The dispatcher found no executor: the same machine, by attempt.
    let two = RunPlan {
        max_attempts: 2,
        ..plan(OverlapPolicy::Allow)
    };
    let r = begin(&store, planned_run("retry", 4000, two)).await.run;
    let sid = r.schedule_id.as_str();
    let t = store
        .finish_run(sid, Finisher::Waiting { attempt: 2 }, failed("no executor"))
        .await
        .expect("finish");
    assert!(matches!(t.applied, Applied::No(_)), "wrong attempt: {t:?}");
    let t = store
        .finish_run(sid, Finisher::Waiting { attempt: 1 }, failed("no executor"))
        .await
        .expect("finish");
    assert_eq!(t.applied, Applied::Yes);
    let w = t.run.expect("run");
    assert_eq!(
        (w.state, w.attempt, w.reason.as_str()),
        (RunState::Waiting, 2, "retry: no executor")
    );
    let t = store
        .finish_run(sid, Finisher::Waiting { attempt: 2 }, failed("no executor"))
        .await
        .expect("finish");
    let f = t.run.expect("run");
    assert_eq!((f.state, f.attempt), (RunState::Failed, 2));
    assert_eq!(f.error_code, "no executor");
    let t = store
        .finish_run(sid, Finisher::Waiting { attempt: 2 }, failed("no executor"))
        .await
        .expect("finish");
    assert!(matches!(t.applied, Applied::No(_)), "final: {t:?}");
}

pub async fn finish_run_rejected(store: Arc<dyn Store>) {
    store.create_job(job("rej", None)).await.expect("create");
    let r = begin(
        &store,
        planned_run("rej", 1000, plan(OverlapPolicy::Forbid)),
    )
    .await
    .run;
    let sid = r.schedule_id.as_str();
    let n = slot("rej-n", 1);
    let rejection = Outcome {
        error_code: "rejected".to_owned(),
        error_message: "busy".to_owned(),
        ..outcome(RunState::Waiting)
    };

    // Only a lease holder can reject.
    let t = store
        .finish_run(sid, Finisher::Waiting { attempt: 1 }, rejection.clone())
        .await
        .expect("finish");
    assert!(matches!(t.applied, Applied::No(_)), "{t:?}");

    // The executor rejects its dispatch: WAITING again at the same attempt, due now,
    // under a new token, avoiding that node; the attempt is not spent.
    let g = grant(&store, sid, 1, &n, LONG).await;
    let before = now(&store).await;
    let t = store
        .finish_run(sid, Finisher::Token(g.fencing_token), rejection.clone())
        .await
        .expect("finish");
    let after = now(&store).await;
    assert_eq!(t.applied, Applied::Yes);
    assert_eq!((t.revoked.clone(), t.next_serial.clone()), (vec![], None));
    let w = t.run.expect("run");
    assert_eq!(
        (w.state, w.attempt, w.reason.as_str()),
        (RunState::Waiting, 1, "rejected: busy")
    );
    assert!(w.fencing_token > g.fencing_token);
    assert_eq!(w.last_node, "rej-n");
    assert_eq!((w.error_code.as_str(), w.error_message.as_str()), ("", ""));
    assert_near(w.deadlines.wake_at, before, after, 0, "wake_at");
    assert_near(w.deadlines.wait_until, before, after, 5_000, "wait_until");
    assert_eq!((w.deadlines.lease_expires, w.deadlines.confirm_by), (0, 0));
    assert_eq!(get(&store, sid).await, w);
    // Still active, the old token stale, the node's slot free.
    assert_eq!(
        begin(
            &store,
            planned_run("rej", 2000, plan(OverlapPolicy::Forbid))
        )
        .await
        .run
        .reason,
        "overlap"
    );
    let t = store
        .finish_run(sid, Finisher::Token(g.fencing_token), rejection)
        .await
        .expect("finish");
    assert!(matches!(t.applied, Applied::No(_)), "{t:?}");
    let g2 = grant(&store, sid, 1, &n, LONG).await;
    assert!(g2.fencing_token > w.fencing_token);
}

pub async fn expire_run_timeout(store: Arc<dyn Store>) {
    store.create_job(job("tmo", None)).await.expect("create");
    let p = partition_of("tmo", store.partitions());
    let timed = RunPlan {
        max_attempts: 2,
        backoff_ms: 50,
        timeout_ms: 300,
        ..plan(OverlapPolicy::Forbid)
    };
    let r = begin(&store, planned_run("tmo", 1000, timed.clone()))
        .await
        .run;
    let sid = r.schedule_id.as_str();
    let n = slot("tmo-n", 1);
    let g1 = grant(&store, sid, 1, &n, LONG).await;
    store
        .mark_started(sid, g1.fencing_token)
        .await
        .expect("start");
    assert_eq!(
        store.due_runs(p, 10).await.expect("due"),
        Vec::<String>::new()
    );
    let t = store.expire_run(sid, GRACE).await.expect("expire");
    assert!(matches!(t.applied, Applied::No(_)), "too early: {t:?}");
    assert_eq!(t.run.map(|r| r.state), Some(RunState::Running));

    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        store.due_runs(p, 10).await.expect("due"),
        vec![sid.to_owned()]
    );
    let before = now(&store).await;
    let t = store.expire_run(sid, GRACE).await.expect("expire");
    let after = now(&store).await;
    assert_eq!(t.applied, Applied::Yes);
    assert_eq!(
        t.revoked,
        vec![Revocation {
            schedule_id: sid.to_owned(),
            node_id: "tmo-n".to_owned(),
            token: g1.fencing_token,
            reason: "timeout".to_owned(),
        }]
    );
    let w = t.run.expect("run");
    assert_eq!(
        (w.state, w.attempt, w.reason.as_str(), w.error_code.as_str()),
        (RunState::Waiting, 2, "retry: timeout", "timeout")
    );
    assert!(w.fencing_token > g1.fencing_token);
    assert_eq!(w.last_node, "tmo-n");
    assert_near(w.deadlines.wake_at, before, after, 50, "backoff");
    // The old holder is stale everywhere.
    for t in [
        store
            .mark_started(sid, g1.fencing_token)
            .await
            .expect("start"),
        store
            .finish_run(
                sid,
                Finisher::Token(g1.fencing_token),
                outcome(RunState::Succeeded),
            )
            .await
            .expect("finish"),
    ] {
        assert!(matches!(t.applied, Applied::No(_)), "{t:?}");
    }

    // The last attempt times out too: TIMED_OUT, final.
    let g2 = grant(&store, sid, 2, &n, LONG).await;
    assert_eq!(
        g2.deadlines.timeout_at - g2.deadlines.lease_expires,
        300 - 30_000
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let t = store.expire_run(sid, GRACE).await.expect("expire");
    assert_eq!(t.applied, Applied::Yes);
    assert_eq!(revocation_of(&t).token, g2.fencing_token);
    let f = t.run.expect("run");
    assert_eq!(
        (f.state, f.attempt, f.reason.as_str()),
        (RunState::TimedOut, 2, "timeout")
    );
    assert!(f.finished_at.is_some());
    assert_eq!(f.deadlines, Deadlines::default());
    assert!(f.fencing_token > g2.fencing_token);
    assert_eq!(
        store.due_runs(p, 10).await.expect("due"),
        Vec::<String>::new()
    );
    // Final: the timer is gone and nothing happens; the job is free again.
    let t = store.expire_run(sid, GRACE).await.expect("expire");
    assert!(matches!(t.applied, Applied::No(_)));
    assert_eq!(t.revoked, vec![]);
    let t = store.expire_run("tmo@404", GRACE).await.expect("expire");
    assert!(matches!(t.applied, Applied::No(_)));
    assert_eq!(t.run, None);
    assert_eq!(
        begin(&store, planned_run("tmo", 2000, timed))
            .await
            .run
            .state,
        RunState::Waiting
    );
    // The node's slot was freed by the timeout.
    grant(&store, &schedule_id("tmo", "2000"), 1, &n, LONG).await;
}

pub async fn expire_run_unconfirmed_and_lost(store: Arc<dyn Store>) {
    store.create_job(job("lost", None)).await.expect("create");
    let two = RunPlan {
        max_attempts: 2,
        ..plan(OverlapPolicy::Allow)
    };
    let sid = |planned: i64| schedule_id("lost", &planned.to_string());
    for planned in [1000, 2000, 3000] {
        begin(&store, planned_run("lost", planned, two.clone())).await;
    }
    let n = slot("lost-n", 0);

    // Not confirmed by its deadline, or its lease ran out before it was: back to
    // WAITING at the same attempt, due now, the old token revoked.
    let a = grant(&store, &sid(1000), 1, &n, terms(30_000, 150)).await;
    let b = grant(&store, &sid(2000), 1, &n, terms(150, 30_000)).await;
    let c = grant(&store, &sid(3000), 1, &n, terms(200, 30_000)).await;
    store
        .mark_started(&sid(3000), c.fencing_token)
        .await
        .expect("start");
    tokio::time::sleep(Duration::from_millis(300)).await;
    for g in [&a, &b] {
        let before = now(&store).await;
        let t = store
            .expire_run(&g.schedule_id, GRACE)
            .await
            .expect("expire");
        let after = now(&store).await;
        assert_eq!(t.applied, Applied::Yes, "{t:?}");
        assert_eq!(
            t.revoked,
            vec![Revocation {
                schedule_id: g.schedule_id.clone(),
                node_id: "lost-n".to_owned(),
                token: g.fencing_token,
                reason: "unconfirmed".to_owned(),
            }]
        );
        let w = t.run.expect("run");
        assert_eq!(
            (w.state, w.attempt, w.reason.as_str()),
            (RunState::Waiting, 1, "unconfirmed")
        );
        assert!(w.fencing_token > g.fencing_token);
        assert_eq!(w.last_node, "lost-n");
        assert_near(w.deadlines.wake_at, before, after, 0, "wake_at");
        assert_near(w.deadlines.wait_until, before, after, 5_000, "wait_until");
        assert_eq!(w.deadlines.lease_expires, 0);
    }

    // RUNNING and its lease ran out: lost, attempt + 1 due now.
    let before = now(&store).await;
    let t = store.expire_run(&sid(3000), GRACE).await.expect("expire");
    let after = now(&store).await;
    assert_eq!(t.applied, Applied::Yes);
    assert_eq!(
        (revocation_of(&t).reason.as_str(), revocation_of(&t).token),
        ("lost", c.fencing_token)
    );
    let w = t.run.expect("run");
    assert_eq!(
        (w.state, w.attempt, w.reason.as_str(), w.error_code.as_str()),
        (RunState::Waiting, 2, "retry: lost", "lost")
    );
    assert_eq!(w.last_node, "lost-n");
    assert_near(w.deadlines.wake_at, before, after, 0, "wake_at");

    // Lost again with its attempts spent: FAILED (lost).
    let c2 = grant(&store, &sid(3000), 2, &n, terms(150, 30_000)).await;
    store
        .mark_started(&sid(3000), c2.fencing_token)
        .await
        .expect("start");
    tokio::time::sleep(Duration::from_millis(250)).await;
    let t = store.expire_run(&sid(3000), GRACE).await.expect("expire");
    assert_eq!(revocation_of(&t).token, c2.fencing_token);
    let f = t.run.expect("run");
    assert_eq!(
        (f.state, f.attempt, f.reason.as_str()),
        (RunState::Failed, 2, "lost")
    );
    assert!(f.finished_at.is_some());
    assert!(f.fencing_token > c2.fencing_token);
    let t = store
        .finish_run(
            &sid(3000),
            Finisher::Token(c2.fencing_token),
            outcome(RunState::Succeeded),
        )
        .await
        .expect("finish");
    assert!(
        matches!(t.applied, Applied::No(_)),
        "a revoked holder's late result: {t:?}"
    );
}

pub async fn expire_run_wakes_waiting(store: Arc<dyn Store>) {
    store.create_job(job("wake", None)).await.expect("create");
    let p = partition_of("wake", store.partitions());
    let r = store
        .begin_run(
            planned_run("wake", 1000, plan(OverlapPolicy::Allow)),
            Duration::from_millis(300),
        )
        .await
        .expect("begin")
        .run;
    let sid = r.schedule_id.as_str();
    let t = store.expire_run(sid, GRACE).await.expect("expire");
    assert!(matches!(t.applied, Applied::No(_)), "too early: {t:?}");
    assert_eq!(
        t.run.as_ref().map(|r| r.deadlines.wake_at),
        Some(r.deadlines.wake_at)
    );

    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        store.due_runs(p, 10).await.expect("due"),
        vec![sid.to_owned()]
    );
    let before = now(&store).await;
    let t = store.expire_run(sid, GRACE).await.expect("expire");
    let after = now(&store).await;
    assert_eq!(t.applied, Applied::Yes);
    assert_eq!(t.revoked, vec![]);
    let w = t.run.expect("run");
    assert_eq!((w.state, w.attempt), (RunState::Waiting, 1));
    assert_near(
        w.deadlines.wake_at,
        before,
        after,
        30_000,
        "wake_at = now + grace",
    );
    assert_eq!(
        w.deadlines.wait_until, r.deadlines.wait_until,
        "wait_until stays"
    );
    assert_eq!(
        store.due_runs(p, 10).await.expect("due"),
        Vec::<String>::new()
    );
    // Still routable at its attempt.
    grant(&store, sid, 1, &slot("wake-n", 0), LONG).await;
}

pub async fn due_runs_per_partition(store: Arc<dyn Store>) {
    let parts = store.partitions();
    let ones = ids_in_partition(parts, 1, "due-run", 2);
    let twos = ids_in_partition(parts, 2, "due-run", 1);
    for id in ones.iter().chain(&twos) {
        store.create_job(job(id, None)).await.expect("create");
    }
    let short = Duration::from_millis(300);
    let mut first = Vec::new();
    for id in &ones {
        let r = store
            .begin_run(planned_run(id, 1000, plan(OverlapPolicy::Allow)), short)
            .await
            .expect("begin")
            .run;
        first.push(r.schedule_id);
        // Distinct wake times, so "earliest first" is the order of begin.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let two = store
        .begin_run(
            planned_run(&twos[0], 1000, plan(OverlapPolicy::Allow)),
            short,
        )
        .await
        .expect("begin")
        .run;
    // Not due yet: a run whose timer is far off.
    begin(
        &store,
        planned_run(&ones[0], 2000, plan(OverlapPolicy::Allow)),
    )
    .await;
    assert_eq!(
        store.due_runs(1, 10).await.expect("due"),
        Vec::<String>::new()
    );

    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(store.due_runs(1, 10).await.expect("due"), first);
    assert_eq!(store.due_runs(1, 1).await.expect("due"), first[..1]);
    assert_eq!(
        store.due_runs(2, 10).await.expect("due"),
        vec![two.schedule_id.clone()]
    );
    assert_eq!(
        store.due_runs(3, 10).await.expect("due"),
        Vec::<String>::new()
    );
    // Due means "left for the sweep", not claimed: they stay due until acted on.
    assert_eq!(store.due_runs(1, 10).await.expect("due"), first);
    let g = grant(&store, &first[0], 1, &slot("due-n", 0), LONG).await;
    assert_eq!(g.deadlines.earliest(), Some(g.deadlines.lease_expires));
    assert_eq!(store.due_runs(1, 10).await.expect("due"), first[1..]);
}

pub async fn cancel_run_transitions(store: Arc<dyn Store>) {
    store.create_job(job("cxl", None)).await.expect("create");
    let sid = |planned: i64| schedule_id("cxl", &planned.to_string());
    for planned in [1000, 2000] {
        begin(
            &store,
            planned_run("cxl", planned, plan(OverlapPolicy::Allow)),
        )
        .await;
    }
    let n = slot("cxl-n", 1);

    // WAITING: nothing to revoke.
    let before = now(&store).await;
    let t = store
        .cancel_run(&sid(1000), "by user")
        .await
        .expect("cancel");
    assert_eq!(t.applied, Applied::Yes);
    assert_eq!((t.revoked.clone(), t.next_serial.clone()), (vec![], None));
    let c = t.run.expect("run");
    assert_eq!(
        (c.state, c.reason.as_str()),
        (RunState::Cancelled, "by user")
    );
    assert!(c.finished_at.expect("finished") >= before);
    assert_eq!(c.deadlines, Deadlines::default());
    assert_eq!(get(&store, &sid(1000)).await, c);

    // DISPATCHED/RUNNING: the lease is revoked, the holder fenced, its slot freed.
    let g = grant(&store, &sid(2000), 1, &n, LONG).await;
    store
        .mark_started(&sid(2000), g.fencing_token)
        .await
        .expect("start");
    let t = store
        .cancel_run(&sid(2000), "by user")
        .await
        .expect("cancel");
    assert_eq!(t.applied, Applied::Yes);
    assert_eq!(
        t.revoked,
        vec![Revocation {
            schedule_id: sid(2000),
            node_id: "cxl-n".to_owned(),
            token: g.fencing_token,
            reason: "by user".to_owned(),
        }]
    );
    let c = t.run.expect("run");
    assert_eq!(c.state, RunState::Cancelled);
    assert!(c.fencing_token > g.fencing_token);
    assert!(
        !store
            .report_progress(&sid(2000), g.fencing_token, 10, "late")
            .await
            .expect("progress")
    );
    let r3 = begin(
        &store,
        planned_run("cxl", 3000, plan(OverlapPolicy::Forbid)),
    )
    .await
    .run;
    assert_eq!(r3.state, RunState::Waiting, "no longer active");
    grant(&store, &r3.schedule_id, 1, &n, LONG).await;

    // Final or unknown: No.
    let t = store.cancel_run(&sid(2000), "again").await.expect("cancel");
    assert!(matches!(t.applied, Applied::No(_)), "{t:?}");
    assert_eq!(t.run, Some(c));
    let t = store.cancel_run("cxl@404", "x").await.expect("cancel");
    assert!(matches!(t.applied, Applied::No(_)));
    assert_eq!(t.run, None);
}

async fn fan(store: &Arc<dyn Store>, sid: &str, shards: u32) -> (RunRecord, Vec<RunRecord>) {
    match store.fan_out(sid, 1, shards, GRACE).await.expect("fan out") {
        FannedOut::Shards { parent, shards } => (parent, shards),
        other => panic!("fan out {sid}: expected shards, got {other:?}"),
    }
}

pub async fn broadcast_shards(store: Arc<dyn Store>) {
    store.create_job(job("bc", None)).await.expect("create");
    let sid = |planned: i64| schedule_id("bc", &planned.to_string());
    let two_attempts = RunPlan {
        max_attempts: 2,
        ..plan(OverlapPolicy::Forbid)
    };
    begin(&store, planned_run("bc", 1000, two_attempts.clone())).await;
    let before = now(&store).await;
    let (parent, shards) = fan(&store, &sid(1000), 3).await;
    assert_eq!(
        (parent.state, parent.shard_total, parent.node_id.as_str()),
        (RunState::Running, 3, "")
    );
    assert!(parent.started_at.expect("started") >= before);
    assert_eq!(parent.deadlines, Deadlines::default());
    assert_eq!(get(&store, &sid(1000)).await, parent);
    let ids: Vec<&str> = shards.iter().map(|s| s.schedule_id.as_str()).collect();
    assert_eq!(ids, ["bc@1000#0", "bc@1000#1", "bc@1000#2"]);
    for (i, s) in shards.iter().enumerate() {
        assert_eq!(
            (
                s.state,
                s.attempt,
                s.parent.as_str(),
                s.shard_index,
                s.shard_total
            ),
            (RunState::Waiting, 1, sid(1000).as_str(), i as u32, 3)
        );
        assert!(s.deadlines.wake_at > 0 && s.deadlines.wait_until > 0);
        assert_eq!(get(&store, &s.schedule_id).await, *s);
    }
    // Fanned out once only; the run list shows the parent alone.
    let again = store
        .fan_out(&sid(1000), 1, 3, GRACE)
        .await
        .expect("fan out");
    assert!(
        matches!(&again, FannedOut::NotWaiting(Some(r)) if r.state == RunState::Running),
        "{again:?}"
    );
    let listed = list_all_runs(
        &store,
        "bc",
        RunQuery {
            limit: 100,
            ..RunQuery::default()
        },
    )
    .await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    // Each shard is leased on its own; shard 0 answers to the parent's id.
    let nodes = [slot("bc-0", 1), slot("bc-1", 1), slot("bc-2", 1)];
    let mut granted = Vec::new();
    for (s, n) in shards.iter().zip(&nodes) {
        granted.push(grant(&store, &s.schedule_id, 1, n, LONG).await);
    }
    let t0 = granted[0].fencing_token;
    let t = store.mark_started(&sid(1000), t0).await.expect("start");
    assert_eq!(t.applied, Applied::Yes);
    assert_eq!(t.run.as_ref().map(|r| r.state), Some(RunState::Running));
    assert_eq!(get(&store, "bc@1000#0").await.state, RunState::Running);
    let renewed = store
        .renew_leases(
            "bc-0",
            &[Held {
                schedule_id: sid(1000),
                token: t0,
            }],
            Duration::from_secs(30),
        )
        .await
        .expect("renew");
    assert!(renewed[0].is_some(), "{renewed:?}");
    // Shard 0 succeeds: counted on the parent, which keeps running.
    let t = store
        .finish_run(
            &sid(1000),
            Finisher::Token(t0),
            outcome(RunState::Succeeded),
        )
        .await
        .expect("finish");
    assert_eq!(t.applied, Applied::Yes);
    assert_eq!(
        t.run.as_ref().map(|r| r.schedule_id.as_str()),
        Some("bc@1000#0")
    );
    let p = get(&store, &sid(1000)).await;
    assert_eq!(
        (p.state, p.shards_done, p.shards_succeeded),
        (RunState::Running, 1, 1)
    );
    // Shard 1 fails once: it retries on its own; the parent does not count it yet.
    let t = store
        .finish_run(
            "bc@1000#1",
            Finisher::Token(granted[1].fencing_token),
            failed("boom"),
        )
        .await
        .expect("finish");
    let s1 = t.run.expect("shard");
    assert_eq!((s1.state, s1.attempt), (RunState::Waiting, 2));
    assert_eq!(get(&store, &sid(1000)).await.shards_done, 1);
    let g1 = grant(&store, "bc@1000#1", 2, &nodes[0], LONG).await;
    store
        .finish_run(
            "bc@1000#1",
            Finisher::Token(g1.fencing_token),
            outcome(RunState::Succeeded),
        )
        .await
        .expect("finish");
    // While a shard runs, the parent is active: forbid skips the next fire.
    let skipped = begin(&store, planned_run("bc", 2000, two_attempts.clone()))
        .await
        .run;
    assert_eq!(
        (skipped.state, skipped.reason.as_str()),
        (RunState::Skipped, "overlap")
    );
    // Shard 2 fails for good: the parent ends FAILED, naming it.
    let t = store
        .finish_run(
            "bc@1000#2",
            Finisher::Token(granted[2].fencing_token),
            failed("disk"),
        )
        .await
        .expect("finish");
    assert_eq!(t.run.expect("shard").state, RunState::Waiting);
    let g2 = grant(&store, "bc@1000#2", 2, &nodes[1], LONG).await;
    store
        .finish_run(
            "bc@1000#2",
            Finisher::Token(g2.fencing_token),
            failed("disk"),
        )
        .await
        .expect("finish");
    let p = get(&store, &sid(1000)).await;
    assert_eq!(
        (
            p.state,
            p.shards_done,
            p.shards_succeeded,
            p.error_code.as_str()
        ),
        (RunState::Failed, 3, 2, "shards_failed")
    );
    assert!(p.error_message.contains("shard 2 FAILED (disk)"), "{p:?}");
    assert!(p.finished_at.is_some());
    // No longer active: the next fire starts.
    let next = begin(&store, planned_run("bc", 3000, two_attempts))
        .await
        .run;
    assert_eq!(next.state, RunState::Waiting);
    // A broadcast where every shard succeeds ends SUCCEEDED.
    let (_, shards) = fan(&store, &sid(3000), 2).await;
    for (s, n) in shards.iter().zip(&nodes) {
        let g = grant(&store, &s.schedule_id, 1, n, LONG).await;
        store
            .finish_run(
                &s.schedule_id,
                Finisher::Token(g.fencing_token),
                outcome(RunState::Succeeded),
            )
            .await
            .expect("finish");
    }
    let p = get(&store, &sid(3000)).await;
    assert_eq!(
        (
            p.state,
            p.shards_done,
            p.shards_succeeded,
            p.error_code.as_str()
        ),
        (RunState::Succeeded, 2, 2, "")
    );
}

pub async fn broadcast_cancel_and_replace(store: Arc<dyn Store>) {
    store.create_job(job("bx", None)).await.expect("create");
    let sid = |planned: i64| schedule_id("bx", &planned.to_string());
    begin(&store, planned_run("bx", 1000, plan(OverlapPolicy::Allow))).await;
    let (_, shards) = fan(&store, &sid(1000), 2).await;
    let g = grant(&store, &shards[0].schedule_id, 1, &slot("bx-0", 1), LONG).await;
    // Cancelling the parent cancels every shard; only the leased one is revoked.
    let t = store
        .cancel_run(&sid(1000), "by user")
        .await
        .expect("cancel");
    assert_eq!(t.applied, Applied::Yes);
    assert_eq!(
        t.revoked,
        vec![Revocation {
            schedule_id: "bx@1000#0".to_owned(),
            node_id: "bx-0".to_owned(),
            token: g.fencing_token,
            reason: "by user".to_owned(),
        }]
    );
    let p = t.run.expect("parent");
    assert_eq!((p.state, p.shards_done), (RunState::Cancelled, 0));
    for s in &shards {
        let s = get(&store, &s.schedule_id).await;
        assert_eq!(
            (s.state, s.reason.as_str()),
            (RunState::Cancelled, "by user")
        );
    }
    // Replace takes a fanned-out run's shards down with it; the slot is free again.
    let replace = || planned_run("bx", 0, plan(OverlapPolicy::Replace));
    let r2 = RunRecord {
        scheduled_at: 2000,
        schedule_id: sid(2000),
        schedule_no: "2000".to_owned(),
        ..replace()
    };
    begin(&store, r2).await;
    let (_, shards) = fan(&store, &sid(2000), 2).await;
    let g = grant(&store, &shards[1].schedule_id, 1, &slot("bx-0", 1), LONG).await;
    let r3 = RunRecord {
        scheduled_at: 3000,
        schedule_id: sid(3000),
        schedule_no: "3000".to_owned(),
        ..replace()
    };
    let b = begin(&store, r3).await;
    assert_eq!(
        b.revoked,
        vec![Revocation {
            schedule_id: "bx@2000#1".to_owned(),
            node_id: "bx-0".to_owned(),
            token: g.fencing_token,
            reason: "replaced".to_owned(),
        }]
    );
    assert_eq!(get(&store, &sid(2000)).await.state, RunState::Cancelled);
    assert_eq!(get(&store, "bx@2000#0").await.state, RunState::Cancelled);
    grant(&store, &sid(3000), 1, &slot("bx-0", 1), LONG).await;
}

pub async fn progress_and_logs(store: Arc<dyn Store>) {
    store.create_job(job("logs", None)).await.expect("create");
    let r = begin(
        &store,
        planned_run("logs", 1000, plan(OverlapPolicy::Allow)),
    )
    .await
    .run;
    let sid = r.schedule_id.as_str();

    // Before a dispatch there is no current holder to accept.
    assert!(
        !store
            .report_progress(sid, 0, 5, "x")
            .await
            .expect("progress")
    );
    let g = grant(&store, sid, 1, &slot("logs-n", 0), LONG).await;
    let token = g.fencing_token;
    assert!(
        store
            .report_progress(sid, token, 50, "half way")
            .await
            .expect("progress")
    );
    let p = get(&store, sid).await;
    assert_eq!(
        (p.progress_percent, p.progress_message.as_str()),
        (50, "half way")
    );
    assert!(
        !store
            .report_progress(sid, token + 1, 60, "stale")
            .await
            .expect("progress")
    );
    assert!(
        !store
            .report_progress("logs@404", token, 60, "none")
            .await
            .expect("progress")
    );
    assert_eq!(get(&store, sid).await.progress_percent, 50);

    // Logs: seq from 1, assigned by the store; at most max_bytes of message text, the
    // oldest lines falling out first; seqs never reused.
    assert!(
        !store
            .append_logs(sid, token + 1, vec![log("stale-line")], 1000)
            .await
            .expect("append")
    );
    assert!(
        !store
            .append_logs("logs@404", token, vec![log("none-line")], 1000)
            .await
            .expect("append")
    );
    let ten = |c: char| c.to_string().repeat(10);
    assert!(
        store
            .append_logs(
                sid,
                token,
                vec![log(&ten('a')), log(&ten('b')), log(&ten('c'))],
                25
            )
            .await
            .expect("append")
    );
    let got = store.read_logs(sid, 0, 100).await.expect("read");
    assert_eq!(
        seqs(&got),
        [2, 3],
        "30 bytes over a 25-byte bound: the oldest fell out"
    );
    assert_eq!(got[0].message, ten('b'));
    assert_eq!(
        (got[0].level.as_str(), got[0].time_ms, got[0].attempt),
        ("info", 1_000, 1)
    );
    assert!(
        store
            .append_logs(sid, token, vec![log(&ten('d')), log(&ten('e'))], 25)
            .await
            .expect("append")
    );
    let got = store.read_logs(sid, 0, 100).await.expect("read");
    assert_eq!(seqs(&got), [4, 5]);
    let messages: Vec<&str> = got.iter().map(|l| l.message.as_str()).collect();
    assert_eq!(messages, [ten('d'), ten('e')]);
    // A line alone over the bound does not survive, but its seq is spent.
    assert!(
        store
            .append_logs(sid, token, vec![log(&"x".repeat(40))], 25)
            .await
            .expect("append")
    );
    assert_eq!(store.read_logs(sid, 0, 100).await.expect("read"), vec![]);
    let lines: Vec<LogLine> = (0..10).map(|i| log(&format!("line {i}"))).collect();
    assert!(
        store
            .append_logs(sid, token, lines, 10_000)
            .await
            .expect("append")
    );

    // Paging by seq.
    let mut all = Vec::new();
    let mut after = 0;
    loop {
        let page = store.read_logs(sid, after, 3).await.expect("read");
        assert!(page.len() <= 3);
        let Some(last) = page.last() else { break };
        after = last.seq;
        all.extend(page);
    }
    assert_eq!(seqs(&all), (7..=16).collect::<Vec<u64>>());
    assert_eq!(all[0].message, "line 0");
    assert_eq!(all[9].message, "line 9");
    assert_eq!(
        seqs(&store.read_logs(sid, 14, 100).await.expect("read")),
        [15, 16]
    );
    assert_eq!(store.read_logs(sid, 16, 100).await.expect("read"), vec![]);
    assert_eq!(
        store.read_logs("logs@404", 0, 100).await.expect("read"),
        vec![]
    );

    // After its result the run takes no progress; late log lines of the token that
    // finished it are still kept. Once revoked, the old token is refused.
    store
        .finish_run(sid, Finisher::Token(token), outcome(RunState::Succeeded))
        .await
        .expect("finish");
    assert!(
        !store
            .report_progress(sid, token, 100, "done")
            .await
            .expect("progress")
    );
    assert!(
        store
            .append_logs(sid, token, vec![log("after the result")], 10_000)
            .await
            .expect("append")
    );
    assert_eq!(
        seqs(&store.read_logs(sid, 16, 100).await.expect("read")),
        [17]
    );
    let r2 = begin(
        &store,
        planned_run("logs", 2000, plan(OverlapPolicy::Allow)),
    )
    .await
    .run;
    let g2 = grant(&store, &r2.schedule_id, 1, &slot("logs-n", 0), LONG).await;
    store
        .cancel_run(&r2.schedule_id, "stop")
        .await
        .expect("cancel");
    assert!(
        !store
            .append_logs(&r2.schedule_id, g2.fencing_token, vec![log("late")], 10_000)
            .await
            .expect("append")
    );
    assert_eq!(
        store.read_logs(&r2.schedule_id, 0, 10).await.expect("read"),
        vec![]
    );
}

pub async fn inbox_order_and_blocking(store: Arc<dyn Store>) {
    for m in ["a", "b", "c"] {
        store
            .push_inbox("inst-1", m.as_bytes().to_vec())
            .await
            .expect("push");
    }
    store
        .push_inbox("inst-2", b"other".to_vec())
        .await
        .expect("push");
    let pop = |instance: &'static str, max: usize, block: Duration| {
        let store = Arc::clone(&store);
        async move {
            store
                .pop_inbox(instance, max, block)
                .await
                .expect("pop inbox")
        }
    };
    assert_eq!(
        pop("inst-1", 2, Duration::ZERO).await,
        vec![b"a".to_vec(), b"b".to_vec()],
        "oldest first"
    );
    assert_eq!(pop("inst-1", 10, Duration::ZERO).await, vec![b"c".to_vec()]);
    assert_eq!(
        pop("inst-1", 10, Duration::ZERO).await,
        Vec::<Vec<u8>>::new()
    );
    assert_eq!(
        pop("inst-2", 10, Duration::ZERO).await,
        vec![b"other".to_vec()]
    );

    // Nothing arrives: it waits about `block`, then returns empty.
    let started = Instant::now();
    assert_eq!(
        pop("inst-1", 10, Duration::from_millis(200)).await,
        Vec::<Vec<u8>>::new()
    );
    assert!(started.elapsed() >= Duration::from_millis(150));

    // A push wakes a blocked pop at once.
    let waiter = tokio::spawn(pop("inst-1", 10, Duration::from_secs(5)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let pushed = Instant::now();
    store
        .push_inbox("inst-2", b"not for inst-1".to_vec())
        .await
        .expect("push");
    store
        .push_inbox("inst-1", b"wake".to_vec())
        .await
        .expect("push");
    let got = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("a push wakes the waiter")
        .expect("task");
    assert_eq!(got, vec![b"wake".to_vec()]);
    assert!(pushed.elapsed() < Duration::from_secs(2));
    assert_eq!(
        pop("inst-2", 10, Duration::ZERO).await,
        vec![b"not for inst-1".to_vec()]
    );
}

// ---- nonces

pub async fn apps_and_rotation(store: Arc<dyn Store>) {
    // A fresh store answers "no such app", not an error.
    assert_eq!(store.get_app("billing").await.expect("get"), None);
    let app = AppRecord {
        app_id: "billing".into(),
        name: "Billing".into(),
        secrets: vec![AppSecret {
            secret: "whsec_first".into(),
            not_after: 0,
        }],
        created_at: 0,
    };
    let before = now(&store).await;
    let created = store.create_app(app.clone()).await.expect("create app");
    assert!(created.created_at >= before, "{created:?}");
    assert_eq!(created.secrets, app.secrets);
    assert_eq!(
        store.get_app("billing").await.expect("get"),
        Some(created.clone())
    );
    let again = store.create_app(app).await;
    assert!(
        matches!(again, Err(Error::AppExists(ref id)) if id == "billing"),
        "{again:?}"
    );
    assert_eq!(store.get_app("nobody").await.expect("get"), None);
    let missing = store
        .rotate_app_secret("nobody", "whsec_x", Duration::from_secs(1))
        .await;
    assert!(matches!(missing, Err(Error::AppNotFound(_))), "{missing:?}");

    // A rotation: the old secret keeps signing for the overlap, the new one after.
    let t0 = now(&store).await;
    let r = store
        .rotate_app_secret("billing", "whsec_second", Duration::from_secs(60))
        .await
        .expect("rotate");
    let t1 = now(&store).await;
    assert_eq!(r.secrets.len(), 2);
    assert_eq!(r.secrets[1].secret, "whsec_second");
    assert_eq!(r.secrets[1].not_after, 0);
    assert_near(r.secrets[0].not_after, t0, t1, 60_000, "old secret's end");
    let active: Vec<&str> = r.active_secrets(t1).collect();
    assert_eq!(active, ["whsec_first", "whsec_second"]);
    assert_eq!(store.get_app("billing").await.expect("get"), Some(r));
    // No overlap: only the new secret signs from now on; a later rotation drops the
    // ended ones.
    let r = store
        .rotate_app_secret("billing", "whsec_third", Duration::ZERO)
        .await
        .expect("rotate");
    let t2 = now(&store).await;
    let active: Vec<&str> = r.active_secrets(t2 + 1).collect();
    assert_eq!(active, ["whsec_third"]);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let r = store
        .rotate_app_secret("billing", "whsec_fourth", Duration::from_secs(60))
        .await
        .expect("rotate");
    let kept: Vec<&str> = r.secrets.iter().map(|s| s.secret.as_str()).collect();
    assert_eq!(kept, ["whsec_third", "whsec_fourth"]);
    // Debug never shows a secret.
    assert!(!format!("{r:?}").contains("whsec_"), "{r:?}");
}

pub async fn route_counters(store: Arc<dyn Store>) {
    let next = |job: &'static str| {
        let store = store.clone();
        async move { store.next_route_counter(job).await.expect("counter") }
    };
    assert_eq!(next("rr-a").await, 0);
    assert_eq!(next("rr-a").await, 1);
    assert_eq!(next("rr-b").await, 0, "one counter per job");
    // Concurrent callers each get their own value.
    let got: BTreeSet<u64> = futures::future::join_all((0..20).map(|_| next("rr-a")))
        .await
        .into_iter()
        .collect();
    assert_eq!(got, (2..22).collect());
}

pub async fn nonces(store: Arc<dyn Store>) {
    let ttl = Duration::from_millis(200);
    assert!(store.check_nonce("app-1", "n-1", ttl).await.expect("nonce"));
    assert!(!store.check_nonce("app-1", "n-1", ttl).await.expect("nonce"));
    assert!(store.check_nonce("app-2", "n-1", ttl).await.expect("nonce"));
    assert!(store.check_nonce("app-1", "n-2", ttl).await.expect("nonce"));
    assert!(!store.check_nonce("app-2", "n-1", ttl).await.expect("nonce"));

    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(store.check_nonce("app-1", "n-1", ttl).await.expect("nonce"));
    assert!(!store.check_nonce("app-1", "n-1", ttl).await.expect("nonce"));
}

/// Ids of listed nodes, in the order listed.
async fn node_ids(store: &Arc<dyn Store>, group: Option<&str>) -> Vec<String> {
    store
        .list_nodes(group)
        .await
        .expect("list nodes")
        .into_iter()
        .map(|n| n.node_id)
        .collect()
}

pub async fn nodes_report_leased_runs(store: Arc<dyn Store>) {
    store.create_job(job("lr", None)).await.expect("create");
    store
        .upsert_node(node("lr-n", "g1", "i1"), Duration::from_secs(5))
        .await
        .expect("upsert");
    let leased = |store: Arc<dyn Store>| async move {
        store.list_nodes(None).await.expect("list")[0].leased
    };
    assert_eq!(leased(store.clone()).await, 0);
    let mut tokens = Vec::new();
    for planned in [1000, 2000] {
        let r = begin(
            &store,
            planned_run("lr", planned, plan(OverlapPolicy::Allow)),
        )
        .await;
        tokens.push(grant(&store, &r.run.schedule_id, 1, &slot("lr-n", 0), LONG).await);
    }
    assert_eq!(
        leased(store.clone()).await,
        2,
        "counted from the leases, not heartbeats"
    );
    store
        .finish_run(
            &tokens[0].schedule_id,
            Finisher::Token(tokens[0].fencing_token),
            outcome(RunState::Succeeded),
        )
        .await
        .expect("finish");
    assert_eq!(leased(store.clone()).await, 1);
}

pub async fn nodes_register_refresh_expire(store: Arc<dyn Store>) {
    let ttl = Duration::from_secs(5);
    assert_eq!(store.list_nodes(None).await.expect("list"), vec![]);

    let before = now(&store).await;
    // Registered out of order: listing sorts by node id.
    let registered = [
        node("n3", "g2", "i1"),
        node("n1", "g1", "i1"),
        node("n2", "g1", "i1"),
    ];
    for n in &registered {
        store.upsert_node(n.clone(), ttl).await.expect("upsert");
    }
    let after = now(&store).await;

    let listed = store.list_nodes(None).await.expect("list");
    let ids: Vec<_> = listed.iter().map(|n| n.node_id.as_str()).collect();
    assert_eq!(ids, ["n1", "n2", "n3"]);
    for got in &listed {
        assert!(
            (before..=after).contains(&got.last_heartbeat),
            "{}: last_heartbeat {} not the store's now (within [{before}, {after}])",
            got.node_id,
            got.last_heartbeat
        );
        let sent = registered
            .iter()
            .find(|n| n.node_id == got.node_id)
            .expect("a registered node");
        assert_eq!(
            *got,
            NodeRecord {
                last_heartbeat: got.last_heartbeat,
                ..sent.clone()
            },
            "everything but last_heartbeat as sent"
        );
    }
    let g1 = store.list_nodes(Some("g1")).await.expect("list");
    assert_eq!(g1, listed[..2].to_vec());
    assert_eq!(node_ids(&store, Some("g2")).await, ["n3"]);
    assert_eq!(store.list_nodes(Some("nope")).await.expect("list"), vec![]);

    // A refresh replaces the whole record (connected_at as the caller passes it).
    let first_beat = listed[0].last_heartbeat;
    let refresh = NodeRecord {
        ready: false,
        draining: false,
        active: 3,
        leased: 0,
        connected_at: 2_000,
        ..node("n1", "g1", "i1")
    };
    store
        .upsert_node(refresh.clone(), ttl)
        .await
        .expect("refresh");
    let after_refresh = now(&store).await;
    let g1 = store.list_nodes(Some("g1")).await.expect("list");
    assert_eq!(g1.len(), 2);
    let n1 = &g1[0];
    assert_eq!(n1.node_id, "n1");
    assert!(
        (first_beat..=after_refresh).contains(&n1.last_heartbeat),
        "refreshed last_heartbeat {} outside [{first_beat}, {after_refresh}]",
        n1.last_heartbeat
    );
    assert_eq!(
        *n1,
        NodeRecord {
            last_heartbeat: n1.last_heartbeat,
            ..refresh
        }
    );
    assert_eq!((n1.ready, n1.active, n1.connected_at), (false, 3, 2_000));
    assert_eq!(g1[1], listed[1], "other nodes untouched");
    assert_eq!(node_ids(&store, None).await, ["n1", "n2", "n3"]);

    // Expiry: a node not refreshed within its TTL disappears; a refresh with a longer
    // TTL keeps a node past its first one.
    let short = Duration::from_millis(100);
    store
        .upsert_node(node("e1", "ge", "i1"), short)
        .await
        .expect("upsert");
    store
        .upsert_node(node("e2", "ge", "i1"), short)
        .await
        .expect("upsert");
    assert_eq!(node_ids(&store, Some("ge")).await, ["e1", "e2"]);
    store
        .upsert_node(node("e2", "ge", "i1"), Duration::from_secs(5))
        .await
        .expect("refresh");
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(node_ids(&store, Some("ge")).await, ["e2"]);
    assert_eq!(
        node_ids(&store, None).await,
        ["e2", "n1", "n2", "n3"],
        "expired nodes are not listed unfiltered either"
    );
    // An expired node cannot be removed: it is already gone.
    assert!(!store.remove_node("e1", "i1").await.expect("remove"));

    // A refresh with a shorter TTL shortens the expiry too.
    store
        .upsert_node(node("e2", "ge", "i1"), short)
        .await
        .expect("refresh");
    assert_eq!(node_ids(&store, Some("ge")).await, ["e2"]);
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(store.list_nodes(Some("ge")).await.expect("list"), vec![]);

    // An expired node registers again like a new one.
    store
        .upsert_node(node("e1", "ge", "i1"), ttl)
        .await
        .expect("upsert");
    assert_eq!(node_ids(&store, Some("ge")).await, ["e1"]);
}

pub async fn nodes_removed_only_by_their_instance(store: Arc<dyn Store>) {
    let ttl = Duration::from_secs(5);
    store
        .upsert_node(node("n1", "g1", "i1"), ttl)
        .await
        .expect("upsert");
    store
        .upsert_node(node("n2", "g1", "i1"), ttl)
        .await
        .expect("upsert");

    assert!(
        !store
            .remove_node("n1", "other-instance")
            .await
            .expect("remove")
    );
    assert_eq!(node_ids(&store, None).await, ["n1", "n2"]);

    // The node reconnects to instance i2: the stale instance i1 must not remove it.
    store
        .upsert_node(node("n1", "g1", "i2"), ttl)
        .await
        .expect("re-register");
    assert!(!store.remove_node("n1", "i1").await.expect("remove"));
    let listed = store.list_nodes(None).await.expect("list");
    assert_eq!(listed.len(), 2);
    assert_eq!(
        (listed[0].node_id.as_str(), listed[0].instance.as_str()),
        ("n1", "i2")
    );

    assert!(store.remove_node("n1", "i2").await.expect("remove"));
    assert_eq!(node_ids(&store, None).await, ["n2"]);
    assert!(!store.remove_node("n1", "i2").await.expect("remove again"));
    assert!(
        !store
            .remove_node("never", "i1")
            .await
            .expect("remove unknown")
    );
    assert_eq!(node_ids(&store, Some("g1")).await, ["n2"]);
}

// ---- the webhook outbox

const HOOK: &str = "https://hooks.example/sundial";

fn hooked(plan: RunPlan) -> RunPlan {
    RunPlan {
        callback_url: Some(HOOK.to_owned()),
        ..plan
    }
}

async fn due_deliveries(store: &Arc<dyn Store>, job_id: &str) -> Vec<String> {
    store
        .due_deliveries(partition_of(job_id, store.partitions()), 100)
        .await
        .expect("due deliveries")
}

async fn claim(store: &Arc<dyn Store>, sid: &str, lease_ms: u64) -> WebhookDelivery {
    store
        .claim_delivery(sid, Duration::from_millis(lease_ms))
        .await
        .expect("claim delivery")
        .unwrap_or_else(|| panic!("{sid}: expected a due delivery"))
}

fn body_of(d: &WebhookDelivery) -> serde_json::Value {
    serde_json::from_str(&d.body).expect("the body is JSON")
}

fn expected_body(run: &RunRecord) -> serde_json::Value {
    serde_json::to_value(WebhookBody::of(run)).expect("body")
}

/// A leased run of `job_id` planned at `planned`, RUNNING on its own node.
async fn running(
    store: &Arc<dyn Store>,
    job_id: &str,
    planned: Millis,
    plan: RunPlan,
) -> RunRecord {
    let r = begin(store, planned_run(job_id, planned, plan)).await.run;
    let n = slot(&format!("{job_id}-{planned}"), 0);
    let g = grant(store, &r.schedule_id, 1, &n, LONG).await;
    store
        .mark_started(&r.schedule_id, g.fencing_token)
        .await
        .expect("start");
    g
}

pub async fn outbox_written_when_final(store: Arc<dyn Store>) {
    store.create_job(job("ob", None)).await.expect("create");
    let sid = |planned: i64| schedule_id("ob", &planned.to_string());

    // A result that makes the run final writes its entry in the same step: PENDING,
    // due at once, the body built from the final record.
    let g = running(&store, "ob", 1000, hooked(plan(OverlapPolicy::Allow))).await;
    let before = now(&store).await;
    let t = store
        .finish_run(
            &sid(1000),
            Finisher::Token(g.fencing_token),
            Outcome {
                output: Some(b"\x00result".to_vec()),
                started_at: Some(1_500),
                finished_at: Some(2_750),
                ..outcome(RunState::Succeeded)
            },
        )
        .await
        .expect("finish");
    let after = now(&store).await;
    let done = t.run.expect("run");
    assert_eq!(done.callback_state, CallbackState::Pending);
    assert_eq!(get(&store, &sid(1000)).await, done);
    assert_eq!(due_deliveries(&store, "ob").await, vec![sid(1000)]);
    let d = claim(&store, &sid(1000), 60_000).await;
    assert_eq!(
        (d.job_id.as_str(), d.url.as_str(), d.attempts),
        ("ob", HOOK, 0)
    );
    assert_near(d.created_at, before, after, 0, "created_at");
    assert!(d.token > 0 && d.now >= d.created_at);
    let body = body_of(&d);
    assert_eq!(body, expected_body(&done));
    assert_eq!(
        body,
        serde_json::json!({
            "schedule_id": sid(1000), "job_id": "ob", "attempt": 1,
            "fencing_token": g.fencing_token.to_string(), "status": "SUCCEEDED",
            "scheduled_at_ms": 1000, "started_at_ms": 1_500, "finished_at_ms": 2_750,
            "duration_ms": 1_250, "error_code": "", "error_message": "",
            "output": "AHJlc3VsdA==", "node_id": "ob-1000",
        })
    );

    // No callback URL: no entry, no callback state.
    let g = running(&store, "ob", 2000, plan(OverlapPolicy::Allow)).await;
    let t = store
        .finish_run(
            &sid(2000),
            Finisher::Token(g.fencing_token),
            outcome(RunState::Succeeded),
        )
        .await
        .expect("finish");
    assert_eq!(t.run.expect("run").callback_state, CallbackState::None);
    assert_eq!(due_deliveries(&store, "ob").await, Vec::<String>::new());

    // A failure with attempts left is not final: no entry until the last attempt,
    // whose body carries that attempt and the executor's finish time.
    let two = hooked(RunPlan {
        max_attempts: 2,
        backoff_ms: 0,
        ..plan(OverlapPolicy::Allow)
    });
    let g = running(&store, "ob", 3000, two).await;
    let t = store
        .finish_run(
            &sid(3000),
            Finisher::Token(g.fencing_token),
            Outcome {
                finished_at: Some(9_000),
                ..failed("boom")
            },
        )
        .await
        .expect("finish");
    let w = t.run.expect("run");
    assert_eq!(
        (w.state, w.callback_state, w.finished_at),
        (RunState::Waiting, CallbackState::None, None)
    );
    assert_eq!(due_deliveries(&store, "ob").await, Vec::<String>::new());
    let g2 = grant(&store, &sid(3000), 2, &slot("ob-3000-2", 0), LONG).await;
    let t = store
        .finish_run(
            &sid(3000),
            Finisher::Token(g2.fencing_token),
            Outcome {
                started_at: Some(9_500),
                finished_at: Some(9_900),
                ..failed("boom")
            },
        )
        .await
        .expect("finish");
    let f = t.run.expect("run");
    assert_eq!(
        (f.state, f.callback_state, f.finished_at),
        (RunState::Failed, CallbackState::Pending, Some(9_900))
    );
    let d = claim(&store, &sid(3000), 60_000).await;
    assert_eq!(body_of(&d), expected_body(&f));
    assert_eq!(
        (
            body_of(&d)["attempt"].clone(),
            body_of(&d)["status"].clone()
        ),
        (serde_json::json!(2), serde_json::json!("FAILED"))
    );

    // Cancelled and timed out runs are final too.
    running(&store, "ob", 4000, hooked(plan(OverlapPolicy::Allow))).await;
    let t = store
        .cancel_run(&sid(4000), "by test")
        .await
        .expect("cancel");
    let c = t.run.expect("run");
    assert_eq!(c.callback_state, CallbackState::Pending);
    assert_eq!(
        body_of(&claim(&store, &sid(4000), 60_000).await),
        expected_body(&c)
    );
    let timed = hooked(RunPlan {
        timeout_ms: 50,
        ..plan(OverlapPolicy::Allow)
    });
    running(&store, "ob", 5000, timed).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = store.expire_run(&sid(5000), GRACE).await.expect("expire");
    let to = t.run.expect("run");
    assert_eq!(
        (to.state, to.callback_state),
        (RunState::TimedOut, CallbackState::Pending)
    );
    assert_eq!(
        body_of(&claim(&store, &sid(5000), 60_000).await),
        expected_body(&to)
    );

    // Sharding broadcast: one webhook, the parent's, when its last shard ends.
    let r = begin(
        &store,
        planned_run("ob", 6000, hooked(plan(OverlapPolicy::Allow))),
    )
    .await
    .run;
    let (_, shards) = fan(&store, &r.schedule_id, 2).await;
    for (i, s) in shards.iter().enumerate() {
        let g = grant(
            &store,
            &s.schedule_id,
            1,
            &slot(&format!("ob-s{i}"), 0),
            LONG,
        )
        .await;
        let t = store
            .finish_run(
                &s.schedule_id,
                Finisher::Token(g.fencing_token),
                outcome(RunState::Succeeded),
            )
            .await
            .expect("finish shard");
        assert_eq!(t.run.expect("shard").callback_state, CallbackState::None);
        if i == 0 {
            assert_eq!(due_deliveries(&store, "ob").await, Vec::<String>::new());
        }
    }
    let parent = get(&store, &sid(6000)).await;
    assert_eq!(
        (parent.state, parent.callback_state),
        (RunState::Succeeded, CallbackState::Pending)
    );
    assert_eq!(due_deliveries(&store, "ob").await, vec![sid(6000)]);
    for s in &shards {
        assert_eq!(
            store
                .claim_delivery(&s.schedule_id, Duration::from_secs(60))
                .await
                .expect("claim"),
            None
        );
    }
    assert_eq!(
        body_of(&claim(&store, &sid(6000), 60_000).await),
        expected_body(&parent)
    );
}

pub async fn delivery_claims_and_outcomes(store: Arc<dyn Store>) {
    store.create_job(job("dl", None)).await.expect("create");
    let sid = |planned: i64| schedule_id("dl", &planned.to_string());
    let finished = |planned: i64| {
        let store = store.clone();
        async move {
            let g = running(&store, "dl", planned, hooked(plan(OverlapPolicy::Allow))).await;
            store
                .finish_run(
                    &sid(planned),
                    Finisher::Token(g.fencing_token),
                    Outcome {
                        output: Some(b"kept".to_vec()),
                        ..outcome(RunState::Succeeded)
                    },
                )
                .await
                .expect("finish")
                .run
                .expect("run")
        }
    };
    let s1 = sid(1000);
    let run1 = finished(1000).await;

    // A claim is exclusive while its lease lasts.
    let d1 = claim(&store, &s1, 60_000).await;
    assert_eq!(
        store
            .claim_delivery(&s1, Duration::from_secs(60))
            .await
            .expect("claim"),
        None
    );
    assert_eq!(due_deliveries(&store, "dl").await, Vec::<String>::new());

    // Only the current token's outcome counts; a retry comes due after its delay.
    let refused = store
        .finish_delivery(&s1, d1.token + 1, DeliveryOutcome::Gone)
        .await
        .expect("finish");
    assert!(matches!(refused, Applied::No(_)), "{refused:?}");
    let retry = DeliveryOutcome::Retry {
        after: Duration::from_millis(150),
        status: 500,
        error: "http_500".to_owned(),
    };
    assert_eq!(
        store
            .finish_delivery(&s1, d1.token, retry.clone())
            .await
            .expect("finish"),
        Applied::Yes
    );
    let r = get(&store, &s1).await;
    assert_eq!(
        (
            r.callback_state,
            r.callback_attempts,
            r.callback_status,
            r.callback_error.as_str()
        ),
        (CallbackState::Pending, 1, 500, "http_500")
    );
    // The same outcome again: the entry is no longer in flight.
    let again = store
        .finish_delivery(&s1, d1.token, retry)
        .await
        .expect("finish");
    assert!(matches!(again, Applied::No(_)), "{again:?}");
    assert_eq!(
        store
            .claim_delivery(&s1, Duration::from_secs(60))
            .await
            .expect("claim"),
        None,
        "not due before its delay"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(due_deliveries(&store, "dl").await, vec![s1.clone()]);
    let d2 = claim(&store, &s1, 60_000).await;
    assert!(d2.token > d1.token);
    assert_eq!((d2.attempts, d2.body.as_str()), (1, d1.body.as_str()));
    assert_eq!(d2.created_at, d1.created_at);

    // Delivered: DONE, the entry is gone, nothing more is accepted.
    assert_eq!(
        store
            .finish_delivery(&s1, d2.token, DeliveryOutcome::Delivered { status: 204 })
            .await
            .expect("finish"),
        Applied::Yes
    );
    let r = get(&store, &s1).await;
    assert_eq!(
        (
            r.callback_state,
            r.callback_attempts,
            r.callback_status,
            r.callback_error.as_str()
        ),
        (CallbackState::Done, 2, 204, "")
    );
    assert_eq!(
        (r.state, r.output.as_deref()),
        (run1.state, Some(&b"kept"[..]))
    );
    assert_eq!(due_deliveries(&store, "dl").await, Vec::<String>::new());
    assert_eq!(
        store
            .claim_delivery(&s1, Duration::from_secs(60))
            .await
            .expect("claim"),
        None
    );
    for token in [d1.token, d2.token] {
        let late = store
            .finish_delivery(&s1, token, DeliveryOutcome::Gone)
            .await
            .expect("finish");
        assert!(matches!(late, Applied::No(_)), "{late:?}");
    }
    assert_eq!(get(&store, &s1).await, r);

    // A claim whose lease runs out comes due again; the stale claimer's outcome is
    // refused and changes nothing.
    let s2 = sid(2000);
    finished(2000).await;
    let stale = claim(&store, &s2, 100).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(due_deliveries(&store, "dl").await, vec![s2.clone()]);
    let fresh = claim(&store, &s2, 60_000).await;
    assert!(fresh.token > stale.token);
    assert_eq!(fresh.attempts, 0);
    let refused = store
        .finish_delivery(&s2, stale.token, DeliveryOutcome::Delivered { status: 200 })
        .await
        .expect("finish");
    assert!(matches!(refused, Applied::No(_)), "{refused:?}");
    let r = get(&store, &s2).await;
    assert_eq!(
        (r.callback_state, r.callback_attempts),
        (CallbackState::Pending, 0)
    );

    // Deferred (breaker open): due again then, no attempt spent.
    let until = now(&store).await + 150;
    assert_eq!(
        store
            .finish_delivery(&s2, fresh.token, DeliveryOutcome::Defer { until })
            .await
            .expect("finish"),
        Applied::Yes
    );
    assert_eq!(due_deliveries(&store, "dl").await, Vec::<String>::new());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let d = claim(&store, &s2, 60_000).await;
    assert_eq!(d.attempts, 0);
    assert_eq!(get(&store, &s2).await.callback_attempts, 0);

    // Given up: CALLBACK_FAILED, the run's result kept.
    let failed_outcome = DeliveryOutcome::Failed {
        status: 503,
        error: "retries spent".to_owned(),
    };
    assert_eq!(
        store
            .finish_delivery(&s2, d.token, failed_outcome)
            .await
            .expect("finish"),
        Applied::Yes
    );
    let r = get(&store, &s2).await;
    assert_eq!(
        (
            r.state,
            r.callback_state,
            r.callback_attempts,
            r.callback_status,
            r.callback_error.as_str()
        ),
        (
            RunState::Succeeded,
            CallbackState::Failed,
            1,
            503,
            "retries spent"
        )
    );
    assert_eq!(r.output.as_deref(), Some(&b"kept"[..]));
    assert_eq!(due_deliveries(&store, "dl").await, Vec::<String>::new());

    // 410 Gone: failed at once, and the record says why.
    let s3 = sid(3000);
    finished(3000).await;
    let d = claim(&store, &s3, 60_000).await;
    assert_eq!(
        store
            .finish_delivery(&s3, d.token, DeliveryOutcome::Gone)
            .await
            .expect("finish"),
        Applied::Yes
    );
    let r = get(&store, &s3).await;
    assert_eq!(
        (
            r.callback_state,
            r.callback_attempts,
            r.callback_status,
            r.callback_error.as_str()
        ),
        (CallbackState::Failed, 1, 410, GONE_ERROR)
    );
    // Abandoned (too old before any attempt): FAILED, no attempt counted.
    let s4 = sid(4000);
    finished(4000).await;
    let d = claim(&store, &s4, 60_000).await;
    let abandon = DeliveryOutcome::Abandon {
        error: "max_age".to_owned(),
    };
    assert_eq!(
        store
            .finish_delivery(&s4, d.token, abandon)
            .await
            .expect("finish"),
        Applied::Yes
    );
    let r = get(&store, &s4).await;
    assert_eq!(
        (
            r.callback_state,
            r.callback_attempts,
            r.callback_status,
            r.callback_error.as_str()
        ),
        (CallbackState::Failed, 0, 0, "max_age")
    );
    assert_eq!(due_deliveries(&store, "dl").await, Vec::<String>::new());
    let unknown = store
        .finish_delivery("dl@404", 1, DeliveryOutcome::Gone)
        .await
        .expect("finish");
    assert!(matches!(unknown, Applied::No(_)), "{unknown:?}");
    assert_eq!(
        store
            .claim_delivery("dl@404", Duration::from_secs(1))
            .await
            .expect("claim"),
        None
    );
}

pub async fn outbox_due_per_partition(store: Arc<dyn Store>) {
    let parts = store.partitions();
    let a = ids_in_partition(parts, 0, "oba", 1).remove(0);
    let b = ids_in_partition(parts, 1, "obb", 1).remove(0);
    for id in [&a, &b] {
        store.create_job(job(id, None)).await.expect("create");
        let g = running(&store, id, 1000, hooked(plan(OverlapPolicy::Allow))).await;
        store
            .finish_run(
                &g.schedule_id,
                Finisher::Token(g.fencing_token),
                outcome(RunState::Succeeded),
            )
            .await
            .expect("finish");
    }
    assert_eq!(
        store.due_deliveries(0, 10).await.expect("due"),
        vec![schedule_id(&a, "1000")]
    );
    assert_eq!(
        store.due_deliveries(1, 10).await.expect("due"),
        vec![schedule_id(&b, "1000")]
    );
    assert_eq!(
        store.due_deliveries(1, 0).await.expect("due"),
        Vec::<String>::new()
    );
}

pub async fn breaker_transitions(store: Arc<dyn Store>) {
    let dest = "https://hooks.example:443";
    let other = "http://10.0.0.1:8080";
    let probe = Duration::from_millis(100);
    let cool = Duration::from_millis(200);
    assert_eq!(
        store.breaker_state(dest, probe).await.expect("state"),
        BreakerState::Closed
    );
    // Closed until `threshold` failures in a row; a success resets the count.
    for _ in 0..2 {
        let u = store
            .record_breaker(dest, false, 3, cool)
            .await
            .expect("record");
        assert_eq!((u.state, u.changed), (BreakerState::Closed, false));
    }
    let u = store
        .record_breaker(dest, true, 3, cool)
        .await
        .expect("record");
    assert_eq!((u.state, u.changed), (BreakerState::Closed, false));
    for _ in 0..2 {
        store
            .record_breaker(dest, false, 3, cool)
            .await
            .expect("record");
    }
    let before = now(&store).await;
    let u = store
        .record_breaker(dest, false, 3, cool)
        .await
        .expect("record");
    let after = now(&store).await;
    let BreakerState::Open { until } = u.state else {
        panic!("three failures open the breaker: {u:?}");
    };
    assert!(u.changed);
    assert_near(until, before, after, 200, "open until");
    assert_eq!(
        store.breaker_state(dest, probe).await.expect("state"),
        BreakerState::Open { until }
    );
    assert_eq!(
        store.breaker_state(other, probe).await.expect("state"),
        BreakerState::Closed,
        "breakers are per destination"
    );
    // A failure while open (an attempt that started earlier) changes nothing.
    let u = store
        .record_breaker(dest, false, 3, cool)
        .await
        .expect("record");
    assert_eq!((u.state, u.changed), (BreakerState::Open { until }, false));

    // After the cool-down one caller gets the probe; the others wait for it.
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(
        store.breaker_state(dest, probe).await.expect("state"),
        BreakerState::HalfOpen
    );
    let held = store.breaker_state(dest, probe).await.expect("state");
    assert!(
        matches!(held, BreakerState::Open { until: u } if u > until),
        "{held:?}"
    );
    // The probe fails: open again for a cool-down.
    let u = store
        .record_breaker(dest, false, 3, cool)
        .await
        .expect("record");
    assert!(
        matches!(u.state, BreakerState::Open { .. }) && u.changed,
        "{u:?}"
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(
        store.breaker_state(dest, probe).await.expect("state"),
        BreakerState::HalfOpen
    );
    // A probe that never reports is presumed lost after `probe`: another one goes.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        store.breaker_state(dest, probe).await.expect("state"),
        BreakerState::HalfOpen
    );
    // The probe succeeds: closed.
    let u = store
        .record_breaker(dest, true, 3, cool)
        .await
        .expect("record");
    assert_eq!((u.state, u.changed), (BreakerState::Closed, true));
    assert_eq!(
        store.breaker_state(dest, probe).await.expect("state"),
        BreakerState::Closed
    );
    // And it takes `threshold` failures again to open it.
    let u = store
        .record_breaker(dest, false, 3, cool)
        .await
        .expect("record");
    assert_eq!((u.state, u.changed), (BreakerState::Closed, false));
}
