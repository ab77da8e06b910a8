//! `RunStore` checks of run records: idempotent recording and skips, listing (order, filters,
//! paging), the per-job bound and retention.

use super::*;

pub async fn record_run_idempotent_and_skips(store: Arc<dyn Store>) {
    store.create_job(job("rec-1", None)).await.expect("create");
    let t0 = now(&store).await;

    let given = run("rec-1", 1_000_000, t0);
    let first = store.record_run(given.clone()).await.expect("record");
    assert!(first.created);
    // As given, its history one step: recorded TRIGGERED.
    assert_eq!(
        RunRecord {
            history: Vec::new(),
            ..first.run.clone()
        },
        given,
        "recorded as given"
    );
    assert_eq!(
        first
            .run
            .history
            .iter()
            .map(|e| (e.what.as_str(), e.attempt))
            .collect::<Vec<_>>(),
        [("TRIGGERED", 1)]
    );
    let given = first.run.clone();
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

    // A listing stopped after any run continues right after it.
    let all = list_all_runs(&store, "list-1", q(100)).await;
    for (i, r) in all.iter().enumerate() {
        let page = store
            .list_runs(
                "list-1",
                RunQuery {
                    cursor: Some(store.run_cursor_after(r)),
                    ..q(100)
                },
            )
            .await
            .expect("list after");
        assert_eq!(page.items, all[i + 1..], "after {}", r.schedule_id);
    }

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
