//! The embedded backend's own tests: the conformance suite on a redb file, and what
//! only this backend has: data surviving a reopen, the schema check, caller mistakes as
//! errors, tokens that outgrow a clock step back, the lazy sweeps of expired nodes
//! and runs, and group commit (waiting writes sharing a commit, the tables a batch's
//! steps share, a failed write taking nothing of its batch into the file).

use super::*;
use crate::model::{RunPlan, schedule_id};
use crate::store::Store;
use crate::store::conformance::{self, arm, cron_trigger, job, manual_trigger, run};

// The file is unlinked as soon as it is open: the open descriptor keeps it alive
// until the store drops, so the suite leaves nothing behind in the temp dir.
crate::store::conformance::store_conformance_tests!(|opts| async move {
    let dir = tempfile::tempdir().expect("temp dir");
    EmbeddedStore::open(&dir.path().join("store.redb"), opts).expect("open store")
});

fn open(path: &Path, opts: StoreOptions) -> Arc<dyn Store> {
    Arc::new(EmbeddedStore::open(path, opts).expect("open store"))
}

#[tokio::test]
async fn data_survives_reopen() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.redb");
    let store = open(&path, conformance::options());
    let t0 = store.now().await.expect("now");

    store
        .create_job(job("keep-due", Some(arm(t0 - 1000))))
        .await
        .expect("create");
    store
        .create_job(job("keep-later", Some(arm(t0 + 3_600_000))))
        .await
        .expect("create");
    for no in ["manual-1", "manual-2", "manual-3"] {
        store
            .enqueue_manual(manual_trigger("keep-due", no, t0), Some(no))
            .await
            .expect("enqueue");
    }
    let delivered = store
        .read_triggers("c", 2, Duration::ZERO)
        .await
        .expect("read");
    store
        .ack_trigger(&delivered[0].entry_id)
        .await
        .expect("ack");
    let r = store
        .record_run(run("keep-due", 5000, t0))
        .await
        .expect("record")
        .run;
    // A run in flight: leased, logged, with a serial run queued behind it.
    let serial = RunPlan {
        overlap: OverlapPolicy::Serial,
        ..RunPlan::default()
    };
    let long = LeaseTerms {
        ttl: Duration::from_secs(60),
        confirm_within: Duration::from_secs(60),
    };
    let grace = Duration::from_secs(60);
    let flying = conformance::planned_run("keep-due", 6000, serial.clone());
    store.begin_run(flying.clone(), grace).await.expect("begin");
    let queued = conformance::planned_run("keep-due", 7000, serial);
    store.begin_run(queued.clone(), grace).await.expect("begin");
    let node = NodeSlot {
        node_id: "node-a".to_owned(),
        max_concurrency: 1,
    };
    let Assigned::Granted(leased) = store
        .assign_run(&flying.schedule_id, 1, &node, long)
        .await
        .expect("assign")
    else {
        panic!("expected a grant");
    };
    let line = LogLine {
        seq: 0,
        time_ms: t0,
        level: "info".to_owned(),
        message: "hello".to_owned(),
        attempt: 1,
    };
    assert_eq!(
        store
            .append_logs(&flying.schedule_id, &Holder::of(&leased), vec![line], 1000)
            .await
            .expect("append"),
        Applied::Yes
    );
    assert!(
        store
            .check_nonce("app", "n", Duration::from_secs(60))
            .await
            .expect("nonce")
    );
    let job_before = store.get_job("keep-due").await.expect("get");
    // The executor holding the leased run, registered by this process.
    store
        .register_node(
            conformance::node("node-a", "g", "this-process"),
            Duration::from_secs(60),
        )
        .await
        .expect("register");
    drop(store);

    // Different options: the file keeps its partition count.
    let store = open(
        &path,
        StoreOptions {
            partitions: 9,
            ..conformance::options()
        },
    );
    assert_eq!(store.partitions(), 4);
    assert_eq!(store.get_job("keep-due").await.expect("get"), job_before);
    // Its stream died with the process: the node is not routed to any more, and the
    // run it held keeps its lease (and the node's slot) until it reconnects.
    assert_eq!(store.list_nodes(None).await.expect("list"), vec![]);
    let kept = store
        .get_run(&flying.schedule_id)
        .await
        .expect("get")
        .expect("the leased run");
    assert_eq!(
        (kept.state, kept.fencing_token),
        (RunState::Dispatched, leased.fencing_token)
    );
    assert!(store.get_job("keep-later").await.expect("get").is_some());

    let p = partition_of("keep-due", 4);
    let batch = store.due_fires(p, 10).await.expect("due");
    assert_eq!(batch.fires.len(), 1);
    assert_eq!(
        (batch.fires[0].job_id.as_str(), batch.fires[0].due),
        ("keep-due", t0 - 1000)
    );

    // Every unacked entry is delivered again after a restart, delivered or not.
    let again = conformance::drain_triggers(&store, "c").await;
    let nos: Vec<_> = again
        .iter()
        .map(|d| d.trigger.schedule_no.as_str())
        .collect();
    assert_eq!(nos, ["manual-2", "manual-3"]);
    assert_eq!(again[0].entry_id, delivered[1].entry_id);

    // Sequences continue: a new entry's id is above every old one.
    store
        .enqueue_manual(manual_trigger("keep-due", "manual-4", t0), None)
        .await
        .expect("enqueue");
    let newer = conformance::drain_triggers(&store, "c").await;
    let newest: u64 = newer[0].entry_id.parse().expect("numeric entry id");
    let oldest: u64 = again[1].entry_id.parse().expect("numeric entry id");
    assert!(newest > oldest);

    // Idempotency keys, runs, leases and nonces too.
    let dup = store
        .enqueue_manual(manual_trigger("keep-due", "manual-x", t0), Some("manual-1"))
        .await
        .expect("enqueue");
    assert!(dup.duplicate);
    assert_eq!(dup.schedule_id, schedule_id("keep-due", "manual-1"));
    assert_eq!(
        store.get_run(&r.schedule_id).await.expect("get"),
        Some(r.clone())
    );
    assert_eq!(
        store.get_run(&flying.schedule_id).await.expect("get"),
        Some(leased.clone())
    );
    assert_eq!(
        store
            .read_logs(&flying.schedule_id, 0, 10)
            .await
            .expect("read")
            .len(),
        1
    );
    // The node's slot, the active set, the serial queue and the token counter too.
    let other = conformance::planned_run("keep-later", 8000, RunPlan::default());
    store.begin_run(other.clone(), grace).await.expect("begin");
    assert_eq!(
        store
            .assign_run(&other.schedule_id, 1, &node, long)
            .await
            .expect("assign"),
        Assigned::NodeFull
    );
    let done = store
        .finish_run(
            &flying.schedule_id,
            Finisher::Holder(Holder::of(&leased)),
            Outcome {
                state: RunState::Succeeded,
                output: None,
                error_code: String::new(),
                error_message: String::new(),
                started_at: None,
                finished_at: None,
            },
        )
        .await
        .expect("finish");
    assert_eq!(done.next_serial, Some(queued.schedule_id.clone()));
    let Assigned::Granted(next) = store
        .assign_run(&other.schedule_id, 1, &node, long)
        .await
        .expect("assign")
    else {
        panic!("expected a grant");
    };
    assert!(next.fencing_token > leased.fencing_token);
    assert!(
        !store
            .check_nonce("app", "n", Duration::from_secs(60))
            .await
            .expect("nonce")
    );
}

#[tokio::test]
async fn schema_too_new_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.redb");
    drop(EmbeddedStore::open(&path, StoreOptions::default()).expect("open"));
    {
        let db = Database::create(&path).expect("raw open");
        let txn = db.begin_write().expect("begin");
        {
            let mut meta = txn.open_table(META).expect("meta");
            meta.insert(META_SCHEMA, u64::from(FILE_VERSION) + 1)
                .expect("write");
        }
        txn.commit().expect("commit");
    }
    match EmbeddedStore::open(&path, StoreOptions::default()) {
        Err(Error::SchemaTooNew { found, supported }) => {
            assert_eq!((found, supported), (FILE_VERSION + 1, FILE_VERSION));
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
}

/// A version-1 file (a `run_timers` table beside the timer index) opens as version 2:
/// the table is gone, an index entry no record gives is dropped, the runs' own timers
/// stay and still come due.
#[tokio::test]
async fn a_version_1_file_is_migrated() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.redb");
    let sid = {
        let store = EmbeddedStore::open(&path, conformance::options()).expect("open");
        store.create_job(job("mig", None)).await.expect("create");
        let begun = store
            .begin_run(
                conformance::planned_run("mig", 1000, RunPlan::default()),
                Duration::ZERO,
            )
            .await
            .expect("begin");
        assert_eq!(begun.run.state, RunState::Waiting);
        begun.run.schedule_id
    };
    {
        let db = Database::create(&path).expect("raw open");
        let txn = db.begin_write().expect("begin");
        {
            txn.open_table(META)
                .expect("meta")
                .insert(META_SCHEMA, 1)
                .expect("write");
            let mut timers = txn.open_table(TIMERS).expect("timers");
            timers.insert(sid.as_str(), (0, 1)).expect("write");
            let mut index = txn.open_table(TIMER_INDEX).expect("index");
            index.insert((0, 5, "ghost@5"), ()).expect("write");
        }
        txn.commit().expect("commit");
    }
    let store = EmbeddedStore::open(&path, conformance::options()).expect("reopen");
    store
        .check_indexes()
        .await
        .expect("indexes match the records");
    let due: Vec<String> = {
        let mut all = Vec::new();
        for p in 0..store.partitions() {
            all.extend(store.due_runs(p, 100).await.expect("due"));
        }
        all
    };
    assert_eq!(due, [sid]);
    drop(store);
    let db = Database::create(&path).expect("raw open");
    let txn = db.begin_read().expect("read");
    let version = txn
        .open_table(META)
        .expect("meta")
        .get(META_SCHEMA)
        .expect("get")
        .map(|g| g.value());
    assert_eq!(version, Some(u64::from(FILE_VERSION)));
    assert!(txn.open_table(TIMERS).is_err(), "run_timers is deleted");
}

#[tokio::test]
async fn caller_mistakes_are_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open(&dir.path().join("store.redb"), conformance::options());
    let t0 = store.now().await.expect("now");
    let id = conformance::ids_in_partition(4, 2, "wrong", 1).remove(0);
    store
        .create_job(job(&id, Some(arm(t0 - 10))))
        .await
        .expect("create");
    let claim = FireClaim {
        job_id: id.clone(),
        expected_due: t0 - 10,
        expected_planned: t0 - 10,
        expected_version: 1,
        next: None,
        triggers: vec![cron_trigger(&id, t0 - 10, 1)],
    };
    assert!(matches!(
        store.claim_fires(3, vec![claim]).await,
        Err(Error::Corrupt(_))
    ));
    // Nothing was claimed.
    assert_eq!(store.due_fires(2, 10).await.expect("due").fires.len(), 1);
    assert!(matches!(
        store.ack_trigger("not-a-number").await,
        Err(Error::Corrupt(_))
    ));
    assert!(matches!(
        store
            .list_runs(
                &id,
                RunQuery {
                    cursor: Some("garbage".into()),
                    ..RunQuery::default()
                }
            )
            .await,
        Err(Error::Corrupt(_))
    ));
}

#[tokio::test]
async fn tokens_outgrow_a_clock_step_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store =
        EmbeddedStore::open(&dir.path().join("store.redb"), conformance::options()).expect("open");
    store.create_job(job("step", None)).await.expect("create");
    // A counter ahead of the clock stands for a clock that stepped back since.
    let ahead = now_us() + 3_600_000_000;
    {
        let txn = store.inner.db.begin_write().expect("begin");
        {
            let mut counters = txn.open_table(TOKENS).expect("counters");
            counters.insert("step", ahead).expect("write");
        }
        txn.commit().expect("commit");
    }
    let node = NodeSlot {
        node_id: "a".to_owned(),
        max_concurrency: 0,
    };
    let terms = LeaseTerms {
        ttl: Duration::from_secs(5),
        confirm_within: Duration::from_secs(5),
    };
    for (planned, expected) in [(1, ahead + 1), (2, ahead + 2)] {
        let r = conformance::planned_run("step", planned, RunPlan::default());
        store
            .begin_run(r.clone(), Duration::from_secs(5))
            .await
            .expect("begin");
        match store
            .assign_run(&r.schedule_id, 1, &node, terms)
            .await
            .expect("assign")
        {
            Assigned::Granted(run) => assert_eq!(run.fencing_token, expected),
            other => panic!("expected a grant, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn expired_nodes_are_swept() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store =
        EmbeddedStore::open(&dir.path().join("store.redb"), conformance::options()).expect("open");
    let count = |store: &EmbeddedStore| -> (usize, usize) {
        let txn = store.inner.db.begin_read().expect("read");
        let nodes = txn.open_table(NODES).expect("nodes");
        let expiry = txn.open_table(NODE_EXPIRY).expect("node expiry");
        (
            nodes.iter().expect("iter").count(),
            expiry.iter().expect("iter").count(),
        )
    };
    // Refreshes replace the expiry key instead of adding one.
    let ttl = Duration::from_secs(30);
    for _ in 0..3 {
        store
            .register_node(conformance::node("live", "g", "i"), ttl)
            .await
            .expect("upsert");
    }
    assert_eq!(count(&store), (1, 1));

    // Nodes that expired a while ago, written as register_node would have.
    let past = now_ms() - 60_000;
    {
        let txn = store.inner.db.begin_write().expect("begin");
        {
            let mut nodes = txn.open_table(NODES).expect("nodes");
            let mut expiry = txn.open_table(NODE_EXPIRY).expect("node expiry");
            for i in 0..(SWEEP_BATCH + 5) {
                let id = format!("gone-{i:03}");
                let json =
                    serde_json::to_string(&conformance::node(&id, "g", "i")).expect("encode");
                nodes
                    .insert(id.as_str(), (json.as_str(), past))
                    .expect("write");
                expiry.insert((past, id.as_str()), ()).expect("write");
            }
        }
        txn.commit().expect("commit");
    }
    let total = SWEEP_BATCH + 6;
    // Listing only skips them…
    let ids = |nodes: Vec<NodeRecord>| nodes.into_iter().map(|n| n.node_id).collect::<Vec<_>>();
    assert_eq!(ids(store.list_nodes(None).await.expect("list")), ["live"]);
    assert_eq!(
        ids(store.list_nodes(Some("g")).await.expect("list")),
        ["live"]
    );
    assert_eq!(count(&store), (total, total));
    // …and an expired node cannot be removed, but each write sweeps up to SWEEP_BATCH.
    // gone-036 is beyond this sweep's batch: deleted as expired, not reported removed.
    let gone = conformance::node("gone-036", "g", "i");
    assert!(
        !store
            .remove_node(&gone, None)
            .await
            .expect("remove")
            .removed
    );
    let left = total - SWEEP_BATCH - 1;
    assert_eq!(count(&store), (left, left));
    store
        .register_node(conformance::node("live", "g", "i"), ttl)
        .await
        .expect("upsert");
    assert_eq!(count(&store), (1, 1), "only the live node remains");
    assert_eq!(ids(store.list_nodes(None).await.expect("list")), ["live"]);
}

#[tokio::test]
async fn expired_runs_are_swept() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open(
        &dir.path().join("store.redb"),
        conformance::short_retention_options(),
    )
    .expect("open");
    let t0 = store.now().await.expect("now");
    for i in 0..(SWEEP_BATCH as i64 + 5) {
        store
            .record_run(run("sweep", i, t0 - 10_000))
            .await
            .expect("record");
    }
    let count = |store: &EmbeddedStore| -> usize {
        let txn = store.inner.db.begin_read().expect("read");
        let runs = txn.open_table(RUNS).expect("runs");
        runs.iter().expect("iter").count()
    };
    // Each record swept up to SWEEP_BATCH of the already-expired ones before it.
    assert!(count(&store) <= 2, "left {}", count(&store));
    store
        .record_run(run("sweep", 1_000_000, 0))
        .await
        .expect("record");
    store
        .record_run(run("sweep", 1_000_001, 0))
        .await
        .expect("record");
    assert_eq!(count(&store), 2, "only the live runs remain");
    let txn = store.inner.db.begin_read().expect("read");
    let counts = txn.open_table(RUN_COUNTS).expect("counts");
    assert_eq!(
        counts.get("sweep").expect("get").map(|g| g.value()),
        Some(2)
    );
}

/// A fire claim moves the job's pending member and leaves its record as it was (the
/// record's fire gives the jitter, `armed`), unless the fire it arms is at another
/// offset from its planned time: then the record holds that fire. Either way the job
/// reads with the fire claimed, also after a reopen.
#[tokio::test]
async fn a_claim_rewrites_the_job_record_only_for_another_offset() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.redb");
    let store = EmbeddedStore::open(&path, StoreOptions::default()).expect("open");
    let id = "offset";
    let p = partition_of(id, store.inner.partitions);
    let at = |planned: Millis, offset: i64| Arm {
        planned,
        due: planned + offset,
    };
    store
        .create_job(job(id, Some(at(1_000, 250))))
        .await
        .expect("create");
    let record = |store: &EmbeddedStore| -> String {
        let txn = store.inner.db.begin_read().expect("read");
        let jobs = txn.open_table(JOBS).expect("jobs");
        jobs.get(id).expect("get").expect("job").value().to_owned()
    };
    let claim = |expected: Arm, next: Arm| FireClaim {
        job_id: id.to_owned(),
        expected_due: expected.due,
        expected_planned: expected.planned,
        expected_version: 1,
        next: Some(next),
        triggers: Vec::new(),
    };
    let created = record(&store);
    let outcome = store
        .claim_fires(p, vec![claim(at(1_000, 250), at(2_000, 250))])
        .await
        .expect("claim");
    assert_eq!(outcome.results, vec![ClaimResult::Claimed]);
    assert_eq!(record(&store), created, "same offset: the record stays");
    let got = store.get_job(id).await.expect("get").expect("job");
    assert_eq!(got.next_fire, Some(at(2_000, 250)));

    let outcome = store
        .claim_fires(p, vec![claim(at(2_000, 250), at(3_000, 40))])
        .await
        .expect("claim at another offset");
    assert_eq!(outcome.results, vec![ClaimResult::Claimed]);
    assert_ne!(
        record(&store),
        created,
        "another offset: the record holds it"
    );
    let got = store.get_job(id).await.expect("get").expect("job");
    assert_eq!(got.next_fire, Some(at(3_000, 40)));
    store
        .claim_fires(p, vec![claim(at(3_000, 40), at(4_000, 40))])
        .await
        .expect("claim");
    drop(store);
    let store = open(&path, StoreOptions::default());
    let got = store.get_job(id).await.expect("get").expect("job");
    assert_eq!(got.next_fire, Some(at(4_000, 40)), "after a reopen");
}

/// Writes that arrive while a batch is being applied share the next commit: 32 writes
/// sent together while the first one is still applying make two commits (the first,
/// then everyone queued behind it), not 32. Each is answered only after its commit, and
/// every write is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_waiting_share_one_commit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(
        EmbeddedStore::open(&dir.path().join("store.redb"), conformance::options()).expect("open"),
    );
    let before = store.writer.stats();
    const WRITERS: usize = 32;
    let (first_applying, applying) = tokio::sync::oneshot::channel();
    let slow = store.write(move |_, b| {
        let txn = b.txn();
        // The first write takes long enough for every other one to queue behind it.
        let _ = first_applying.send(());
        std::thread::sleep(Duration::from_millis(300));
        let mut meta = txn.open_table(META).ctx("meta")?;
        meta.insert("test-slow", 0).ctx("insert")?;
        Ok(())
    });
    let rest = async {
        applying.await.expect("the first write applies");
        let writes = (0..WRITERS - 1).map(|i| {
            store.write(move |_, b| {
                let txn = b.txn();
                let mut meta = txn.open_table(META).ctx("meta")?;
                meta.insert(format!("test-{i}").as_str(), i as u64)
                    .ctx("insert")?;
                Ok(())
            })
        });
        futures::future::join_all(writes).await
    };
    let (slow, rest) = tokio::join!(slow, rest);
    slow.expect("the slow write");
    for r in rest {
        r.expect("write");
    }
    let after = store.writer.stats();
    let commits = after.commits - before.commits;
    println!("{WRITERS} writes made {commits} commits");
    assert!(commits <= 3, "{WRITERS} writes made {commits} commits");
    // The writer's figures count every write it applied and the time it took: the
    // first write's sleep is applying time.
    assert_eq!(after.steps - before.steps, WRITERS as u64);
    assert!(after.applying - before.applying >= Duration::from_millis(300));
    assert!(after.committing > before.committing);
    let txn = store.inner.db.begin_read().expect("read");
    let meta = txn.open_table(META).expect("meta");
    for i in 0..WRITERS - 1 {
        let key = format!("test-{i}");
        assert_eq!(
            meta.get(key.as_str()).expect("get").map(|g| g.value()),
            Some(i as u64)
        );
    }
}

/// A write that fails (after writing part of itself) takes nothing of its batch with
/// it into the file; the next write commits normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_leaves_nothing_of_its_batch() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store =
        EmbeddedStore::open(&dir.path().join("store.redb"), conformance::options()).expect("open");
    let failed = store
        .write(|_, b| -> Result<()> {
            let mut meta = b.txn().open_table(META).ctx("meta")?;
            meta.insert("half-written", 1).ctx("insert")?;
            Err(Error::Corrupt("the step failed halfway".into()))
        })
        .await;
    assert!(matches!(failed, Err(Error::Corrupt(_))), "{failed:?}");
    store
        .write(|_, b| {
            let mut meta = b.txn().open_table(META).ctx("meta")?;
            meta.insert("next", 2).ctx("insert")?;
            Ok(())
        })
        .await
        .expect("the next write");
    let txn = store.inner.db.begin_read().expect("read");
    let meta = txn.open_table(META).expect("meta");
    assert_eq!(
        meta.get("half-written").expect("get").map(|g| g.value()),
        None
    );
    assert_eq!(meta.get("next").expect("get").map(|g| g.value()), Some(2));
}

/// A batch counts a node's leases once and keeps the count as its steps lease and
/// release runs of it (a slot taken twice or released twice counts once), and the
/// next batch counts what the last one committed.
#[tokio::test]
async fn a_batch_keeps_its_nodes_lease_counts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store =
        EmbeddedStore::open(&dir.path().join("store.redb"), conformance::options()).expect("open");
    let held_on = |sid: &str| RunRecord {
        schedule_id: sid.to_owned(),
        node_id: "n".to_owned(),
        state: RunState::Dispatched,
        ..run("count", 1, 0)
    };
    let counts = store
        .write(move |_, b| {
            let t = b.runs()?;
            let mut seen = vec![t.busy("n")?];
            t.take_slot("n", "a")?;
            t.take_slot("n", "b")?;
            t.take_slot("n", "a")?;
            t.take_slot("m", "c")?;
            seen.push(t.busy("n")?);
            t.leave_node(&held_on("a"))?;
            t.leave_node(&held_on("a"))?;
            seen.push(t.busy("n")?);
            seen.push(t.node_run_ids("n")?.len() as u64);
            Ok(seen)
        })
        .await
        .expect("first batch");
    assert_eq!(counts, vec![0, 2, 1, 1]);
    let next = store
        .write(|_, b| b.runs()?.busy("n"))
        .await
        .expect("next batch");
    assert_eq!(next, 1);
}

/// A run that `begin_and_assign` begins older than every run its job keeps at the
/// bound is deleted at once by the bound: it is not assigned, and its node keeps no
/// slot for it.
#[tokio::test]
async fn a_new_run_the_bound_deletes_at_once_is_not_assigned() {
    let dir = tempfile::tempdir().expect("temp dir");
    let opts = conformance::bounded_runs_options();
    let bound = opts.max_runs_per_job as i64;
    let store = EmbeddedStore::open(&dir.path().join("store.redb"), opts).expect("open");
    store.create_job(job("bound", None)).await.expect("create");
    let plan = conformance::plan(OverlapPolicy::Allow);
    let node = conformance::slot("bound-n", 1);
    let terms = LeaseTerms {
        ttl: Duration::from_secs(30),
        confirm_within: Duration::from_secs(30),
    };
    let grace = Duration::ZERO;
    for i in 0..bound {
        let run = conformance::planned_run("bound", 10_000 + i * 1000, plan.clone());
        store.begin_run(run, grace).await.expect("begin");
    }
    let oldest = conformance::planned_run("bound", 1_000, plan.clone());
    let (begun, assigned) = store
        .begin_and_assign(oldest.clone(), grace, &node, terms)
        .await
        .expect("begin and assign");
    assert!(begun.created);
    assert_eq!(assigned, Some(Assigned::NotWaiting(None)));
    assert_eq!(store.get_run(&oldest.schedule_id).await.expect("get"), None);
    // The node's one slot is free: the next run takes it.
    let next = conformance::planned_run("bound", 99_000, plan);
    let (_, assigned) = store
        .begin_and_assign(next, grace, &node, terms)
        .await
        .expect("begin and assign");
    assert!(
        matches!(assigned, Some(Assigned::Granted(_))),
        "{assigned:?}"
    );
}

/// Steps of one batch share the run tables the first of them opened: a step sees what
/// an earlier step wrote through them, also after a step in between took the bare
/// transaction (which closes them, its own writes staying in the transaction), and the
/// clock each step reads is its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_of_a_batch_share_their_tables() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(
        EmbeddedStore::open(&dir.path().join("store.redb"), conformance::options()).expect("open"),
    );
    let before = store.writer.stats().commits;
    let (first_applying, applying) = tokio::sync::oneshot::channel();
    let first = store.write(move |_, b| {
        let _ = first_applying.send(());
        let t = b.runs()?;
        t.runs.insert("by-shared", "{}").ctx("insert")?;
        let clock = t.now_us;
        // The steps behind it queue meanwhile, so they share its batch.
        std::thread::sleep(Duration::from_millis(300));
        Ok(clock)
    });
    let rest = async {
        applying.await.expect("the first write applies");
        let bare = store.write(|_, b| {
            let mut runs = b.txn().open_table(RUNS).ctx("runs")?;
            let seen = runs.get("by-shared").ctx("get")?.is_some();
            runs.insert("by-bare", "{}").ctx("insert")?;
            Ok(seen)
        });
        let shared = store.write(|_, b| {
            let t = b.runs()?;
            let seen = t.runs.get("by-bare").ctx("get")?.is_some();
            Ok((seen, t.now_us))
        });
        tokio::join!(bare, shared)
    };
    let (first, (bare, shared)) = tokio::join!(first, rest);
    let first_clock = first.expect("first");
    assert!(
        bare.expect("bare"),
        "the bare transaction sees the shared tables' write"
    );
    let (seen, clock) = shared.expect("shared");
    assert!(seen, "the shared tables see the bare transaction's write");
    assert!(
        clock >= first_clock + 300_000,
        "each step reads the clock when it begins"
    );
    assert_eq!(
        store.writer.stats().commits - before,
        1,
        "the three steps share one batch"
    );
    let txn = store.inner.db.begin_read().expect("read");
    let runs = txn.open_table(RUNS).expect("runs");
    for key in ["by-shared", "by-bare"] {
        assert!(runs.get(key).expect("get").is_some(), "{key} committed");
    }
}

/// A destination with no breaker record (it never failed, or its last attempt
/// succeeded and no ramp is under way) is admitted, its slot held in memory and its
/// successes counted, without a turn of the writer; a failure still goes through it,
/// after which the breaker is read there.
#[tokio::test]
async fn a_healthy_destination_costs_its_breaker_no_commit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store =
        EmbeddedStore::open(&dir.path().join("store.redb"), conformance::options()).expect("open");
    let dest = "http://receiver:80";
    let terms = DeliveryTerms {
        limit: 1,
        lease: Duration::from_secs(30),
        probe: Duration::from_secs(1),
        threshold: 2,
        cool_down: Duration::from_secs(60),
    };
    let admit = |holder: &'static str| store.admit_delivery(dest, holder, &terms);
    let settle =
        |holder: &'static str, ok: bool| store.settle_delivery(dest, holder, Some(ok), &terms);
    let before = store.writer.stats().commits;
    assert_eq!(admit("a").await.expect("admit"), Admission::Go);
    assert_eq!(
        admit("b").await.expect("admit"),
        Admission::Full { window: 1 },
        "the slot is held in memory"
    );
    let closed = settle("a", true).await.expect("success").expect("counted");
    assert_eq!(
        (closed.state, closed.changed),
        (BreakerState::Closed, false)
    );
    assert_eq!(
        store.writer.stats().commits,
        before,
        "no commit for a healthy destination"
    );

    // One failure of two: a record, still closed; the next admission is the writer's.
    admit("b").await.expect("admit");
    let failed = settle("b", false).await.expect("failure").expect("counted");
    assert_eq!(
        (failed.state, failed.changed),
        (BreakerState::Closed, false)
    );
    let after_failure = store.writer.stats().commits;
    assert!(after_failure > before, "a failure is written");
    assert_eq!(admit("c").await.expect("admit"), Admission::Go);
    // The second failure opens it; a success closes it and (its ramp over at a limit
    // of one) removes the record.
    let opened = settle("c", false).await.expect("failure").expect("counted");
    assert!(matches!(opened.state, BreakerState::Open { .. }) && opened.changed);
    assert!(matches!(
        admit("d").await.expect("admit"),
        Admission::Open { .. }
    ));
    let closed = settle("e", true).await.expect("success").expect("counted");
    assert_eq!((closed.state, closed.changed), (BreakerState::Closed, true));
    let settled = store.writer.stats().commits;
    assert_eq!(admit("f").await.expect("admit"), Admission::Go);
    assert_eq!(
        store.writer.stats().commits,
        settled,
        "closed again: read only"
    );
}

/// A webhook claim is held in memory: it costs no commit, it is exclusive while its
/// lease lasts (and the claimed entry is not listed due), only its token's outcome is
/// written, and it does not outlive the process: reopened, the entry is due at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_claim_is_held_in_memory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.redb");
    let store: Arc<dyn Store> = open(&path, conformance::options());
    store.create_job(job("cl", None)).await.expect("create");
    let g = conformance::running(
        &store,
        "cl",
        1000,
        conformance::hooked(conformance::plan(OverlapPolicy::Allow)),
    )
    .await;
    store
        .finish_run(
            &g.schedule_id,
            Finisher::Holder(Holder::of(&g)),
            conformance::outcome(RunState::Succeeded),
        )
        .await
        .expect("finish");
    let sid = g.schedule_id.clone();
    let partition = partition_of("cl", store.partitions());
    let lease = Duration::from_secs(60);

    let before = store.commit_stats().expect("commit stats").commits;
    let d = store
        .claim_delivery(&sid, lease)
        .await
        .expect("claim")
        .expect("due");
    assert_eq!(
        store.commit_stats().map(|s| s.commits),
        Some(before),
        "a claim is not committed"
    );
    assert_eq!(
        store.claim_delivery(&sid, lease).await.expect("claim"),
        None
    );
    assert!(
        store
            .due_deliveries(partition, 10)
            .await
            .expect("due")
            .is_empty()
    );
    let stale = store
        .finish_delivery(&sid, d.token - 1, DeliveryOutcome::Gone)
        .await
        .expect("finish");
    assert!(matches!(stale, Applied::No(_)), "{stale:?}");
    drop(store);

    // Reopened: the claim died with the process; the entry is due and claimable, under
    // a greater token.
    let store: Arc<dyn Store> = open(&path, conformance::options());
    assert_eq!(
        store.due_deliveries(partition, 10).await.expect("due"),
        std::slice::from_ref(&sid)
    );
    let again = store
        .claim_delivery(&sid, lease)
        .await
        .expect("claim")
        .expect("due");
    assert!(again.token > d.token, "{} > {}", again.token, d.token);
    let old = store
        .finish_delivery(&sid, d.token, DeliveryOutcome::Delivered { status: 200 })
        .await
        .expect("finish");
    assert!(
        matches!(old, Applied::No(_)),
        "the old claim's outcome: {old:?}"
    );
    assert_eq!(
        store
            .finish_delivery(
                &sid,
                again.token,
                DeliveryOutcome::Delivered { status: 200 }
            )
            .await
            .expect("finish"),
        Applied::Yes
    );
    let run = store.get_run(&sid).await.expect("get").expect("run");
    assert_eq!(
        (run.callback_state, run.callback_attempts),
        (CallbackState::Done, 1)
    );
    assert_eq!(
        store.claim_delivery(&sid, lease).await.expect("claim"),
        None
    );
}

/// An open breaker stays open across a restart: a destination with a record when the
/// store opens is read from the file, not taken for one that never failed.
#[tokio::test]
async fn an_open_breaker_is_open_after_a_reopen() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.redb");
    let dest = "http://receiver:80";
    let terms = DeliveryTerms {
        limit: 4,
        lease: Duration::from_secs(30),
        probe: Duration::from_secs(1),
        threshold: 2,
        cool_down: Duration::from_secs(600),
    };
    {
        let store = EmbeddedStore::open(&path, conformance::options()).expect("open");
        for _ in 0..2 {
            store
                .settle_delivery(dest, "h", Some(false), &terms)
                .await
                .expect("failure");
        }
    }
    let store = EmbeddedStore::open(&path, conformance::options()).expect("reopen");
    assert!(matches!(
        store
            .admit_delivery(dest, "a", &terms)
            .await
            .expect("admit"),
        Admission::Open { .. }
    ));
    assert_eq!(
        store
            .admit_delivery("http://other:80", "a", &terms)
            .await
            .expect("admit"),
        Admission::Go
    );
}

/// An outbox entry written before claims moved to memory (with `token` and
/// `in_flight`) still reads: it is claimed and delivered as any other.
#[tokio::test]
async fn an_outbox_entry_of_the_old_shape_is_delivered() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.redb");
    drop(EmbeddedStore::open(&path, conformance::options()).expect("open"));
    let sid = "old@1";
    let partition = partition_of("old", conformance::options().partitions);
    {
        let db = Database::create(&path).expect("raw open");
        let txn = db.begin_write().expect("begin");
        {
            let json = r#"{"job_id":"old","url":"http://h:1/x","body":"{}","created_at":5,"attempts":1,"token":9,"in_flight":true,"due":5}"#;
            let mut outbox = txn.open_table(OUTBOX).expect("outbox");
            outbox.insert(sid, json).expect("write");
            let mut due = txn.open_table(OUTBOX_DUE).expect("outbox due");
            due.insert((partition, 5, sid), ()).expect("write");
        }
        txn.commit().expect("commit");
    }
    let store = EmbeddedStore::open(&path, conformance::options()).expect("reopen");
    assert_eq!(
        store.due_deliveries(partition, 10).await.expect("due"),
        [sid]
    );
    let d = store
        .claim_delivery(sid, Duration::from_secs(60))
        .await
        .expect("claim")
        .expect("due");
    assert_eq!((d.attempts, d.url.as_str()), (1, "http://h:1/x"));
    assert!(d.token > 9);
    assert_eq!(
        store
            .finish_delivery(sid, d.token, DeliveryOutcome::Delivered { status: 200 })
            .await
            .expect("finish"),
        Applied::Yes
    );
    assert!(
        store
            .due_deliveries(partition, 10)
            .await
            .expect("due")
            .is_empty()
    );
}

/// Opening the store replays the journal's records whose sequence is past the one the
/// file holds (their batches committed without a sync, then the process died), and only
/// those: a record the file already holds is not applied twice. Then the journal is
/// empty and the file holds the last sequence.
#[tokio::test]
async fn the_journal_replays_what_the_file_lacks_and_nothing_it_holds() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.redb");
    let store = EmbeddedStore::open(&path, conformance::options()).expect("open");
    store.create_job(job("held", None)).await.expect("create");
    drop(store);
    let journal_path = journal::Journal::path_for(&path);
    assert_eq!(std::fs::metadata(&journal_path).expect("journal").len(), 0);
    let seq_in = |db: &Database, key: &str| {
        let txn = db.begin_read().expect("read");
        let meta = txn.open_table(META).expect("meta");
        meta.get(key).expect("get").map(|g| g.value())
    };
    let held = {
        let db = Database::create(&path).expect("raw open");
        let held = seq_in(&db, META_JOURNAL_SEQ).expect("a journaled store has a sequence");
        // Two batches' records, neither committed to the file: the first says it is
        // already held (its sequence is the file's), the second that it is not.
        let record = |key: &str| {
            let redo = Redo::default();
            let txn = db.begin_write().expect("begin");
            Tx::new(&txn, &redo)
                .open_table(META)
                .expect("meta")
                .insert(key, 7)
                .expect("insert");
            redo.take()
        };
        let (mut journal, _) = journal::Journal::open(&journal_path).expect("journal");
        journal
            .append(held, &record("marker_held"))
            .expect("append");
        journal
            .append(held + 1, &record("marker_lost"))
            .expect("append");
        held
    };
    let store = EmbeddedStore::open(&path, conformance::options()).expect("reopen");
    assert!(store.get_job("held").await.expect("get").is_some());
    drop(store);
    assert_eq!(std::fs::metadata(&journal_path).expect("journal").len(), 0);
    let db = Database::create(&path).expect("raw open");
    assert_eq!(seq_in(&db, "marker_lost"), Some(7), "replayed");
    assert_eq!(
        seq_in(&db, "marker_held"),
        None,
        "held already: not applied"
    );
    assert_eq!(seq_in(&db, META_JOURNAL_SEQ), Some(held + 1));
}

/// A write is journaled (the journal grows) and committed without a sync of the store
/// file; once the writer has had nothing to do for `CHECKPOINT_IDLE` it checkpoints:
/// the checkpoint is counted and the journal is empty again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_writer_checkpoints_and_empties_the_journal() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.redb");
    let store = EmbeddedStore::open(&path, conformance::options()).expect("open");
    let journal_len = || {
        std::fs::metadata(journal::Journal::path_for(&path))
            .expect("journal")
            .len()
    };
    let before = store.writer.stats();
    store
        .create_job(job("journaled", None))
        .await
        .expect("create");
    assert!(journal_len() > 0, "the write's record is in the journal");
    let deadline = Instant::now() + Duration::from_secs(20);
    while store.writer.stats().checkpoints == before.checkpoints {
        assert!(Instant::now() < deadline, "no checkpoint after 20 s idle");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = store.writer.stats();
    assert_eq!(after.checkpoints, before.checkpoints + 1);
    assert!(after.checkpointing > before.checkpointing);
    assert_eq!(journal_len(), 0, "a checkpoint empties the journal");

    // What a crash would leave now (the store still open, nothing closed cleanly): the
    // store file alone, its journal emptied, holds the write.
    let copy = dir.path().join("copy.redb");
    std::fs::copy(&path, &copy).expect("copy the store file");
    let reopened = EmbeddedStore::open(&copy, conformance::options()).expect("open the copy");
    assert!(
        reopened.get_job("journaled").await.expect("get").is_some(),
        "the checkpoint made the write durable in the store file"
    );
    drop(store);
}
