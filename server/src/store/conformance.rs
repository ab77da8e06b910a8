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
    ClaimResult, Delivery, DueFire, Enqueued, Error, FireClaim, NodeRecord, RunQuery, Store,
    StoreOptions, partition_of,
};
use crate::model::{
    Arm, JobRecord, JobSpec, Millis, RetryPolicy, RunRecord, RunState, Target, Trigger,
    TriggerKind, schedule_id,
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
            leases_grant_renew_release: options,
            lease_expiry: options,
            lease_tokens_increase: options,
            nonces: options,
            nodes_register_refresh_expire: options,
            nodes_removed_only_by_their_instance: options,
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
        active: 0,
        // Exact in binary, so no backend's number formatting can round it.
        load: 0.25,
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

// ---- leases

pub async fn leases_grant_renew_release(store: Arc<dyn Store>) {
    let sid = "lease-1@1000";
    let before = now(&store).await;
    let l1 = store
        .grant_lease(sid, "node-a", Duration::from_secs(5))
        .await
        .expect("grant");
    let after = now(&store).await;
    assert!(l1.token > 0);
    assert_eq!(
        (l1.schedule_id.as_str(), l1.holder.as_str()),
        (sid, "node-a")
    );
    assert!(l1.expires_at >= before + 5000 && l1.expires_at <= after + 5000);

    match store
        .grant_lease(sid, "node-b", Duration::from_secs(5))
        .await
    {
        Err(Error::LeaseHeld {
            schedule_id,
            holder,
        }) => assert_eq!((schedule_id.as_str(), holder.as_str()), (sid, "node-a")),
        other => panic!("second holder: expected LeaseHeld, got {other:?}"),
    }

    let renewed = store
        .renew_lease(sid, l1.token, Duration::from_secs(10))
        .await
        .expect("renew");
    assert_eq!(
        (renewed.token, renewed.holder.as_str()),
        (l1.token, "node-a")
    );
    assert!(renewed.expires_at >= before + 10_000 && renewed.expires_at > l1.expires_at);

    match store
        .renew_lease(sid, l1.token + 1, Duration::from_secs(10))
        .await
    {
        Err(Error::StaleToken { schedule_id, token }) => {
            assert_eq!((schedule_id.as_str(), token), (sid, l1.token + 1));
        }
        other => panic!("wrong token renew: expected StaleToken, got {other:?}"),
    }

    // The same holder re-granted (a reconnect): a new token fences the old one.
    let l2 = store
        .grant_lease(sid, "node-a", Duration::from_secs(5))
        .await
        .expect("re-grant");
    assert!(l2.token > l1.token);
    assert!(matches!(
        store
            .renew_lease(sid, l1.token, Duration::from_secs(5))
            .await,
        Err(Error::StaleToken { .. })
    ));

    assert!(!store.release_lease(sid, l1.token).await.expect("release"));
    assert!(store.release_lease(sid, l2.token).await.expect("release"));
    assert!(
        !store
            .release_lease(sid, l2.token)
            .await
            .expect("release again")
    );
    assert!(matches!(
        store
            .renew_lease(sid, l2.token, Duration::from_secs(5))
            .await,
        Err(Error::StaleToken { .. })
    ));

    let l3 = store
        .grant_lease(sid, "node-b", Duration::from_secs(5))
        .await
        .expect("grant after release");
    assert!(l3.token > l2.token);
    assert_eq!(l3.holder, "node-b");

    assert!(
        !store
            .release_lease("lease-1@never", 1)
            .await
            .expect("release")
    );
    match store
        .grant_lease("not a schedule id", "node-a", Duration::from_secs(5))
        .await
    {
        Err(Error::JobNotFound(_)) => {}
        other => panic!("invalid schedule id: expected JobNotFound, got {other:?}"),
    }
    assert_eq!(store.expired_leases(10).await.expect("expired"), vec![]);
}

pub async fn lease_expiry(store: Arc<dyn Store>) {
    let ttl = Duration::from_millis(50);
    let x = store.grant_lease("exp-1@1", "a", ttl).await.expect("grant");
    let y = store
        .grant_lease("exp-1@2", "a", Duration::from_millis(80))
        .await
        .expect("grant");
    let keep = store
        .grant_lease("exp-1@3", "a", Duration::from_secs(30))
        .await
        .expect("grant");
    assert_eq!(store.expired_leases(10).await.expect("expired"), vec![]);

    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        store.expired_leases(10).await.expect("expired"),
        vec![x.clone(), y.clone()],
        "earliest first, not removed, unexpired ones left out"
    );
    assert_eq!(
        store.expired_leases(1).await.expect("expired"),
        vec![x.clone()]
    );

    // Expired: renewal is refused even with the right token…
    match store
        .renew_lease("exp-1@1", x.token, Duration::from_secs(5))
        .await
    {
        Err(Error::StaleToken { .. }) => {}
        other => panic!("renew after expiry: expected StaleToken, got {other:?}"),
    }
    // …another holder may take it over, with a greater token…
    let x2 = store
        .grant_lease("exp-1@1", "b", Duration::from_secs(5))
        .await
        .expect("grant over an expired lease");
    assert!(x2.token > x.token);
    assert_eq!(x2.holder, "b");
    // …and release with the still-current token of an expired lease succeeds.
    assert!(
        store
            .release_lease("exp-1@2", y.token)
            .await
            .expect("release")
    );
    assert_eq!(store.expired_leases(10).await.expect("expired"), vec![]);
    assert!(
        !store
            .release_lease("exp-1@1", x.token)
            .await
            .expect("release")
    );
    assert!(keep.token > 0);
}

pub async fn lease_tokens_increase(store: Arc<dyn Store>) {
    let mut last = 0;
    for i in 0..100 {
        // Re-grants of one run, grants of other runs of the same job, and grants after a
        // release alike: the job's tokens only grow.
        let sid = format!("tok@{}", i % 7);
        let lease = store
            .grant_lease(&sid, "n", Duration::from_secs(30))
            .await
            .expect("grant");
        assert!(
            lease.token > last,
            "grant {i}: token {} after {last}",
            lease.token
        );
        last = lease.token;
        if i % 3 == 0 {
            assert!(
                store
                    .release_lease(&sid, lease.token)
                    .await
                    .expect("release")
            );
        }
    }
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
        active: 3,
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
