//! `JobStore` checks: create / update / delete and listing, the pending member an
//! update rewrites, paused jobs, due fires by partition, claims and their races, bulk
//! writes, manual triggers' idempotency keys.

use super::*;

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
            .list_jobs(cursor.as_deref(), "", 10)
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
    // A listing stopped after any job continues right after it.
    let all = store.list_jobs(None, "", 100).await.expect("list all");
    let all: Vec<String> = all.items.into_iter().map(|j| j.spec.id).collect();
    for (i, id) in all.iter().enumerate() {
        let after = store.job_cursor_after(id);
        let page = store
            .list_jobs(Some(&after), "", 100)
            .await
            .expect("list after");
        let rest: Vec<String> = page.items.into_iter().map(|j| j.spec.id).collect();
        assert_eq!(rest, all[i + 1..], "after {id} ({after})");
    }
    // A cursor no listing returned is refused, not read as "from the start" (or as
    // corrupt data): garbage, a partition that is not a number or does not exist.
    for bad in ["not a cursor!", "x:y", "-1:a", "99999:", "1:not an id"] {
        match store.list_jobs(Some(bad), "", 10).await {
            Err(Error::BadCursor(c)) => assert_eq!(c, bad),
            other => panic!("cursor {bad:?}: {other:?}"),
        }
    }
}

pub async fn job_list_by_prefix(store: Arc<dyn Store>) {
    let ids = [
        "bill",
        "billing-a",
        "billing-b",
        "billing-c",
        "billing-d",
        "billinz",
        "bilk",
        "pay-1",
        "a-billing",
    ];
    for id in ids {
        store.create_job(job(id, None)).await.expect("create");
    }
    // Two at a time, every page from the prefix's range only.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let page = store
            .list_jobs(cursor.as_deref(), "billing-", 2)
            .await
            .expect("list by prefix");
        assert!(page.items.len() <= 2, "{} items", page.items.len());
        seen.extend(page.items.into_iter().map(|j| j.spec.id));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    seen.sort();
    assert_eq!(seen, ["billing-a", "billing-b", "billing-c", "billing-d"]);
    let ids_of = |page: crate::store::Page<JobRecord>| {
        let mut ids: Vec<String> = page.items.into_iter().map(|j| j.spec.id).collect();
        ids.sort();
        ids
    };
    let bill = store.list_jobs(None, "bill", 100).await.expect("list bill");
    assert_eq!(
        ids_of(bill),
        [
            "bill",
            "billing-a",
            "billing-b",
            "billing-c",
            "billing-d",
            "billinz"
        ]
    );
    let none = store.list_jobs(None, "zzz", 100).await.expect("list zzz");
    assert!(none.items.is_empty(), "{:?}", none.items);
    // A listing stopped after a job continues within the prefix.
    let after = store.job_cursor_after("billing-b");
    let rest = store
        .list_jobs(Some(&after), "billing-", 100)
        .await
        .expect("list after");
    let rest = ids_of(rest);
    assert!(
        rest.iter()
            .all(|id| id.starts_with("billing-") && id != "billing-b"),
        "{rest:?}"
    );
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

pub async fn upcoming_fires_read_a_window_and_claim_nothing(store: Arc<dyn Store>) {
    let ids = ids_in_partition(store.partitions(), 0, "soon", 4);
    let t0 = now(&store).await;
    let dues = [t0 + 1000, t0 - 500, t0 + 3000, t0 + 2000];
    for (id, due) in ids.iter().zip(dues) {
        store
            .create_job(job(id, Some(arm(due))))
            .await
            .expect("create");
    }
    let fire = |i: usize| DueFire {
        job_id: ids[i].clone(),
        due: dues[i],
        planned: dues[i],
        version: 1,
    };

    let soon = store
        .upcoming_fires(0, t0 - 500, t0 + 2000, 10)
        .await
        .expect("upcoming");
    assert_eq!(
        soon,
        vec![fire(0), fire(3)],
        "after `after` (not at it), up to and at `by`, earliest first"
    );
    let soon = store
        .upcoming_fires(0, i64::MIN, t0 + 5000, 2)
        .await
        .expect("upcoming");
    assert_eq!(soon, vec![fire(1), fire(0)], "at most `limit`");
    let none = store
        .upcoming_fires(1, i64::MIN, t0 + 5000, 10)
        .await
        .expect("upcoming");
    assert_eq!(none, vec![], "one partition only");

    let batch = store.due_fires(0, 10).await.expect("due");
    assert_eq!(batch.fires, vec![fire(1)], "nothing was claimed by reading");
    let claims = vec![FireClaim {
        job_id: ids[1].clone(),
        expected_due: dues[1],
        expected_planned: dues[1],
        expected_version: 1,
        next: None,
        triggers: vec![],
    }];
    let outcome = store.claim_fires(0, claims).await.expect("claim");
    assert_eq!(outcome.results, vec![ClaimResult::Claimed]);
    let soon = store
        .upcoming_fires(0, i64::MIN, t0 + 5000, 10)
        .await
        .expect("upcoming");
    assert_eq!(
        soon,
        vec![fire(0), fire(3), fire(2)],
        "a claimed fire that arms nothing is gone from the window"
    );
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
            expected_planned: due(i),
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

/// A job whose fires are due later than planned (jitter): each claim's armed fire is
/// what the job then reads (one, a list, a page) with its planned time and its due
/// time, and what `due_fires` offers once due; none armed reads as none. (The offset
/// is the definition's: a fire at another one is not a claim the scheduler makes.)
pub async fn claimed_fires_keep_their_planned_time(store: Arc<dyn Store>) {
    let parts = store.partitions();
    let id = &ids_in_partition(parts, 1, "jitter", 1)[0];
    let t0 = now(&store).await;
    let jittered = |planned: Millis, offset: i64| Arm {
        planned,
        due: planned + offset,
    };
    let first = jittered(t0 - 60_000, 250);
    store
        .create_job(job(id, Some(first)))
        .await
        .expect("create");
    let claim = |expected: Arm, next: Option<Arm>| FireClaim {
        job_id: id.clone(),
        expected_due: expected.due,
        expected_planned: expected.planned,
        expected_version: 1,
        next,
        triggers: vec![cron_trigger(id, expected.planned, 1)],
    };
    let reads = |want: Option<Arm>| {
        let store = store.clone();
        async move {
            let one = store.get_job(id).await.expect("get").expect("job");
            let many = store
                .get_jobs(std::slice::from_ref(id))
                .await
                .expect("get jobs");
            let page = store.list_jobs(None, "jitter", 10).await.expect("list");
            assert_eq!(one.next_fire, want, "get_job");
            assert_eq!(many[0].next_fire, want, "get_jobs");
            assert_eq!(page.items[0].next_fire, want, "list_jobs");
        }
    };
    // Claimed twice at the job's offset: still due in the past, offered as planned.
    let mut expected = first;
    for i in 1..=2 {
        let next = jittered(t0 - 60_000 + i * 10_000, 250);
        let outcome = store
            .claim_fires(1, vec![claim(expected, Some(next))])
            .await
            .expect("claim");
        assert_eq!(outcome.results, vec![ClaimResult::Claimed]);
        reads(Some(next)).await;
        let fires = store.due_fires(1, 10).await.expect("due").fires;
        assert_eq!(
            fires,
            vec![DueFire {
                job_id: id.clone(),
                due: next.due,
                planned: next.planned,
                version: 1,
            }]
        );
        expected = next;
    }
    // The schedule ends.
    let outcome = store
        .claim_fires(1, vec![claim(expected, None)])
        .await
        .expect("last claim");
    assert_eq!(outcome.results, vec![ClaimResult::Claimed]);
    reads(None).await;
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
                            expected_planned: f.planned,
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

/// `apply_jobs`: creates and updates of one partition in one step, each write with its
/// own answer; a refused write leaves the rest applied; the pending members are those
/// single creates and updates would leave; a write for another partition is refused
/// before anything is written.
pub async fn apply_jobs_batches_and_refusals(store: Arc<dyn Store>) {
    let parts = store.partitions();
    let ids = ids_in_partition(parts, 1, "apply", 4);
    let (a, b, c, d) = (&ids[0], &ids[1], &ids[2], &ids[3]);
    let t0 = now(&store).await;
    let mut changes = store.job_changes();
    changes.borrow_and_update();

    assert!(
        store
            .apply_jobs(1, Vec::new())
            .await
            .expect("empty")
            .is_empty(),
        "an empty batch is answered empty"
    );

    let mut paused = job(b, Some(arm(t0 - 1000)));
    paused.paused = true;
    let out = store
        .apply_jobs(
            1,
            vec![
                JobWrite::Create(job(a, Some(arm(t0 - 1000)))),
                JobWrite::Create(paused),
            ],
        )
        .await
        .expect("apply");
    let created: Vec<(String, u64, bool)> = out
        .into_iter()
        .map(|r| {
            let j = r.expect("created");
            (j.spec.id, j.version, j.next_fire.is_some())
        })
        .collect();
    assert_eq!(
        created,
        vec![(a.clone(), 1, true), (b.clone(), 1, false)],
        "version 1; a paused job is never pending"
    );
    wait_changed(&mut changes, "apply_jobs").await;
    let batch = store.due_fires(1, 100).await.expect("due");
    assert_eq!(
        batch.fires,
        vec![DueFire {
            job_id: a.clone(),
            due: t0 - 1000,
            planned: t0 - 1000,
            version: 1,
        }]
    );

    // One batch of four: two refused, two applied.
    let mut a2 = store.get_job(a).await.expect("get").expect("a exists");
    a2.spec.name = "renamed".into();
    a2.next_fire = Some(arm(t0 - 500));
    let out = store
        .apply_jobs(
            1,
            vec![
                JobWrite::Create(job(a, None)),
                JobWrite::Update {
                    job: a2,
                    expected_version: 1,
                },
                JobWrite::Update {
                    job: job(c, None),
                    expected_version: 1,
                },
                JobWrite::Update {
                    job: job(b, Some(arm(t0))),
                    expected_version: 5,
                },
                JobWrite::Create(job(d, Some(arm(t0 + 3_600_000)))),
            ],
        )
        .await
        .expect("apply");
    assert_eq!(out.len(), 5, "one answer per write");
    assert!(
        matches!(&out[0], Err(Error::JobExists(id)) if id == a),
        "{:?}",
        out[0]
    );
    match &out[1] {
        Ok(j) => assert_eq!((j.version, j.spec.name.as_str()), (2, "renamed")),
        other => panic!("update of a: {other:?}"),
    }
    assert!(
        matches!(&out[2], Err(Error::JobNotFound(id)) if id == c),
        "{:?}",
        out[2]
    );
    assert!(
        matches!(&out[3], Err(Error::VersionConflict { job_id, expected: 5, current: 1 }) if job_id == b),
        "{:?}",
        out[3]
    );
    assert!(matches!(&out[4], Ok(j) if j.version == 1), "{:?}", out[4]);
    let stored = store.get_job(a).await.expect("get").expect("a");
    assert_eq!((stored.version, stored.spec.name.as_str()), (2, "renamed"));
    assert!(
        store.get_job(c).await.expect("get").is_none(),
        "no update creates"
    );
    let stored_b = store.get_job(b).await.expect("get").expect("b");
    assert_eq!(
        (stored_b.version, stored_b.paused),
        (1, true),
        "the conflict changed nothing"
    );
    let batch = store.due_fires(1, 100).await.expect("due");
    assert_eq!(
        batch.fires,
        vec![DueFire {
            job_id: a.clone(),
            due: t0 - 500,
            planned: t0 - 500,
            version: 2,
        }],
        "the update replaced a's member"
    );
    assert_eq!(batch.next_due, Some(t0 + 3_600_000), "d is armed");

    // A write for another partition: the whole batch is refused, nothing written.
    let other = ids_in_partition(parts, 2, "apply-other", 1).remove(0);
    let err = store
        .apply_jobs(
            1,
            vec![
                JobWrite::Create(job(c, None)),
                JobWrite::Create(job(&other, None)),
            ],
        )
        .await
        .expect_err("wrong partition");
    assert!(matches!(err, Error::Corrupt(_)), "{err:?}");
    assert!(store.get_job(c).await.expect("get").is_none());
    assert!(store.get_job(&other).await.expect("get").is_none());
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
