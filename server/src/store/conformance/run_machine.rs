//! `RunStore` checks of the run state machine up to a run's start: `begin_run` and every overlap
//! policy, `assign_run` (tokens, capacity, races), `begin_and_assign`, `mark_started` and
//! `renew_leases`.

use super::*;

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
        .mark_started(&held.schedule_id, &Holder::of(&held))
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
            Finisher::Holder(Holder::of(&held)),
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
            Finisher::Holder(Holder::of(&h1)),
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
            attempt: held_a.attempt,
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
        .mark_started(&a.schedule_id, &Holder::of(&held_a))
        .await
        .expect("start");
    assert!(matches!(t.applied, Applied::No(_)), "{t:?}");
    let t = store
        .finish_run(
            &a.schedule_id,
            Finisher::Holder(Holder::of(&held_a)),
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

/// A job's overlap policy changed from allow: the runs its allow plans began that are
/// still going count for the new policy at its first begin and after (forbid skips,
/// serial queues behind them, replace cancels them); one that ended does not. A job
/// created again under a deleted one's id counts that one's runs still going too.
pub async fn overlap_after_a_policy_change(store: Arc<dyn Store>) {
    let node = slot("chg-node", 0);
    let sid = |id: &str, planned: i64| schedule_id(id, &planned.to_string());
    for policy in [
        OverlapPolicy::Forbid,
        OverlapPolicy::Serial,
        OverlapPolicy::Replace,
    ] {
        let id = format!("chg-{policy:?}");
        store.create_job(job(&id, None)).await.expect("create");
        let allow = plan(OverlapPolicy::Allow);
        let ended = begin(&store, planned_run(&id, 1000, allow.clone()))
            .await
            .run;
        let held = grant(&store, &ended.schedule_id, 1, &node, LONG).await;
        let t = store
            .finish_run(
                &ended.schedule_id,
                Finisher::Holder(Holder::of(&held)),
                outcome(RunState::Succeeded),
            )
            .await
            .expect("finish");
        assert_eq!(t.applied, Applied::Yes);
        let going = begin(&store, planned_run(&id, 2000, allow)).await.run;
        let going = grant(&store, &going.schedule_id, 1, &node, LONG).await;
        let mut changed = job(&id, None);
        changed.spec.overlap_policy = policy;
        store.update_job(changed, 1).await.expect("update");

        let next = begin(&store, planned_run(&id, 3000, plan(policy))).await;
        match policy {
            OverlapPolicy::Forbid => {
                assert_eq!(
                    (next.run.state, next.run.reason.as_str()),
                    (RunState::Skipped, "overlap"),
                    "{id}"
                );
                let again = begin(&store, planned_run(&id, 3500, plan(policy))).await;
                assert_eq!(again.run.reason, "overlap", "{id}: and at the next begin");
            }
            OverlapPolicy::Serial => {
                assert_eq!(
                    (next.run.state, next.run.reason.as_str()),
                    (RunState::Waiting, "queued"),
                    "{id}"
                );
            }
            _ => {
                assert_eq!(
                    next.revoked
                        .iter()
                        .map(|r| r.schedule_id.as_str())
                        .collect::<Vec<_>>(),
                    [going.schedule_id.as_str()],
                    "{id}: the allow run still going is replaced"
                );
                let old = get(&store, &going.schedule_id).await;
                assert_eq!(
                    (old.state, old.reason.as_str()),
                    (RunState::Cancelled, "replaced")
                );
                continue;
            }
        }
        let t = store
            .finish_run(
                &going.schedule_id,
                Finisher::Holder(Holder::of(&going)),
                outcome(RunState::Succeeded),
            )
            .await
            .expect("finish");
        assert_eq!(t.applied, Applied::Yes);
        if policy == OverlapPolicy::Serial {
            assert_eq!(t.next_serial, Some(sid(&id, 3000)), "{id}: the queue pops");
        } else {
            let free = begin(&store, planned_run(&id, 4000, plan(policy))).await;
            assert_eq!(free.run.state, RunState::Waiting, "{id}: the job is free");
        }
    }

    store
        .create_job(job("chg-del", None))
        .await
        .expect("create");
    let old = begin(
        &store,
        planned_run("chg-del", 1000, plan(OverlapPolicy::Allow)),
    )
    .await
    .run;
    grant(&store, &old.schedule_id, 1, &node, LONG).await;
    store.delete_job("chg-del").await.expect("delete");
    let mut again = job("chg-del", None);
    again.spec.overlap_policy = OverlapPolicy::Forbid;
    store.create_job(again).await.expect("create again");
    let next = begin(
        &store,
        planned_run("chg-del", 2000, plan(OverlapPolicy::Forbid)),
    )
    .await;
    assert_eq!(
        (next.run.state, next.run.reason.as_str()),
        (RunState::Skipped, "overlap"),
        "the deleted job's run still going counts"
    );
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
            Finisher::Holder(Holder::of(&r1)),
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

/// `begin_and_assign`: a new run WAITING to be routed is leased to the node in the same
/// decision (as `assign_run` would); a node at its max concurrency leaves it WAITING
/// and routable; a trigger seen again, a skipped run and a queued serial run are begun
/// (or found) and not assigned.
pub async fn begin_and_assign_in_one_decision(store: Arc<dyn Store>) {
    store.create_job(job("ba", None)).await.expect("create");
    let n = slot("ba-n", 1);
    let first = planned_run("ba", 1000, plan(OverlapPolicy::Allow));
    let (begun, assigned) = store
        .begin_and_assign(first.clone(), GRACE, &n, LONG)
        .await
        .expect("begin and assign");
    assert!(begun.created, "{begun:?}");
    let Some(Assigned::Granted(leased)) = assigned else {
        panic!("expected a grant: {assigned:?}");
    };
    assert_eq!(begun.run, leased, "the run as the call left it");
    assert_eq!(
        (leased.state, leased.node_id.as_str(), leased.attempt),
        (RunState::Dispatched, "ba-n", 1)
    );
    assert!(leased.fencing_token > 0 && leased.deadlines.lease_expires > 0);
    assert_eq!(get(&store, &first.schedule_id).await, leased);
    // Written once, leased: its history notes the lease alone, on every store.
    assert_eq!(steps(&leased), ["DISPATCHED"], "{leased:?}");

    // The node is full: the run exists, WAITING with its timer, for the router.
    let second = planned_run("ba", 2000, plan(OverlapPolicy::Allow));
    let (begun, assigned) = store
        .begin_and_assign(second.clone(), GRACE, &n, LONG)
        .await
        .expect("begin and assign");
    assert!(begun.created, "{begun:?}");
    assert_eq!(assigned, Some(Assigned::NodeFull));
    let stored = get(&store, &second.schedule_id).await;
    assert_eq!(stored, begun.run);
    assert_eq!(stored.state, RunState::Waiting);
    assert!(stored.deadlines.wake_at > 0, "{stored:?}");
    assert_eq!(steps(&stored), ["WAITING"], "{stored:?}");

    // The first trigger again: found, not assigned again.
    let (begun, assigned) = store
        .begin_and_assign(first.clone(), GRACE, &slot("ba-m", 0), LONG)
        .await
        .expect("begin and assign");
    assert_eq!((begun.created, assigned), (false, None));
    assert_eq!(get(&store, &first.schedule_id).await, leased);

    // A deleted job's run is skipped; a serial run behind an active one is queued.
    let (begun, assigned) = store
        .begin_and_assign(
            planned_run("ba-gone", 1000, plan(OverlapPolicy::Allow)),
            GRACE,
            &slot("ba-m", 0),
            LONG,
        )
        .await
        .expect("begin and assign");
    assert_eq!((begun.run.state, assigned), (RunState::Skipped, None));
    store
        .create_job(job("ba-serial", None))
        .await
        .expect("create");
    let (_, assigned) = store
        .begin_and_assign(
            planned_run("ba-serial", 1000, plan(OverlapPolicy::Serial)),
            GRACE,
            &slot("ba-m", 0),
            LONG,
        )
        .await
        .expect("begin and assign");
    assert!(
        matches!(assigned, Some(Assigned::Granted(_))),
        "{assigned:?}"
    );
    let (begun, assigned) = store
        .begin_and_assign(
            planned_run("ba-serial", 2000, plan(OverlapPolicy::Serial)),
            GRACE,
            &slot("ba-m", 0),
            LONG,
        )
        .await
        .expect("begin and assign");
    assert_eq!(
        (begun.run.state, begun.run.reason.as_str(), assigned),
        (RunState::Waiting, "queued", None)
    );
}

/// `begin_and_assign_many`: each run of a batch gets what `begin_and_assign` would
/// give it alone, in the order given: two runs of one job leased one after the other
/// (the second under a newer token), a third past the node's limit left WAITING, a
/// forbid run behind an active one skipped, a deleted job's run skipped, a trigger
/// seen again in the same batch found; the others are applied all the same.
pub async fn begin_and_assign_many_begins_each_run(store: Arc<dyn Store>) {
    for id in ["bm-a", "bm-f"] {
        store.create_job(job(id, None)).await.expect("create");
    }
    begin(
        &store,
        planned_run("bm-f", 1000, plan(OverlapPolicy::Forbid)),
    )
    .await;
    let n = slot("bm-n", 2);
    let on = |job_id: &str, planned: Millis, overlap: OverlapPolicy| BeginOn {
        run: planned_run(job_id, planned, plan(overlap)),
        route_grace: GRACE,
        node: n.clone(),
    };
    let items = vec![
        on("bm-a", 1000, OverlapPolicy::Allow),
        on("bm-f", 2000, OverlapPolicy::Forbid),
        on("bm-a", 2000, OverlapPolicy::Allow),
        on("bm-gone", 1000, OverlapPolicy::Allow),
        on("bm-a", 3000, OverlapPolicy::Allow),
        on("bm-a", 1000, OverlapPolicy::Allow),
    ];
    let sids: Vec<String> = items.iter().map(|i| i.run.schedule_id.clone()).collect();
    let out = store
        .begin_and_assign_many(items, LONG)
        .await
        .expect("begin and assign many");
    assert_eq!(out.len(), 6, "one outcome per run");
    let mut tokens = Vec::new();
    for i in [0, 2] {
        let (begun, assigned) = &out[i];
        let Some(Assigned::Granted(leased)) = assigned else {
            panic!("run {i}: expected a grant: {assigned:?}");
        };
        assert!(begun.created, "run {i}: {begun:?}");
        assert_eq!(&begun.run, leased, "run {i}: the run as the call left it");
        assert_eq!(
            (leased.state, leased.node_id.as_str()),
            (RunState::Dispatched, "bm-n")
        );
        assert_eq!(get(&store, &sids[i]).await, *leased, "run {i} as stored");
        tokens.push(leased.fencing_token);
    }
    assert!(
        tokens[0] < tokens[1],
        "begun in the order given: {tokens:?}"
    );
    let (begun, assigned) = &out[1];
    assert_eq!(
        (begun.run.state, begun.run.reason.as_str(), assigned),
        (RunState::Skipped, "overlap", &None)
    );
    let (begun, assigned) = &out[3];
    assert_eq!(
        (begun.run.state, begun.run.reason.as_str(), assigned),
        (RunState::Skipped, "deleted", &None)
    );
    let (begun, assigned) = &out[4];
    assert_eq!(assigned, &Some(Assigned::NodeFull), "past the node's limit");
    assert!(
        begun.created && begun.run.state == RunState::Waiting,
        "{begun:?}"
    );
    assert!(begun.run.deadlines.wake_at > 0, "routable: {begun:?}");
    assert_eq!(get(&store, &sids[4]).await, begun.run);
    let (begun, assigned) = &out[5];
    assert_eq!((begun.created, assigned), (false, &None), "found again");
    assert_eq!(begun.run.state, RunState::Dispatched, "{begun:?}");
    assert!(
        store
            .begin_and_assign_many(Vec::new(), LONG)
            .await
            .expect("an empty batch")
            .is_empty()
    );
}

/// What a run's history says it went through, oldest first.
fn steps(run: &RunRecord) -> Vec<&str> {
    run.history.iter().map(|e| e.what.as_str()).collect()
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
            .finish_run(&sid, Finisher::Holder(Holder::of(&won)), failed("boom"))
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
    let t = store
        .mark_started(sid, &holder("n", 1))
        .await
        .expect("start");
    assert!(matches!(t.applied, Applied::No(_)), "WAITING: {t:?}");
    assert_eq!(t.run.map(|r| r.state), Some(RunState::Waiting));

    let g = grant(&store, sid, 1, &slot("n", 0), terms(30_000, 10_000)).await;
    let t = store
        .mark_started(
            sid,
            &Holder {
                token: g.fencing_token + 1,
                ..Holder::of(&g)
            },
        )
        .await
        .expect("start");
    assert!(matches!(t.applied, Applied::No(_)), "wrong token: {t:?}");
    let before = now(&store).await;
    let t = store
        .mark_started(sid, &Holder::of(&g))
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
        .mark_started(sid, &Holder::of(&g))
        .await
        .expect("start");
    assert_eq!(t.applied, Applied::Already);
    assert_eq!(t.run, Some(running));

    store
        .finish_run(
            sid,
            Finisher::Holder(Holder::of(&g)),
            outcome(RunState::Succeeded),
        )
        .await
        .expect("finish");
    let t = store
        .mark_started(sid, &Holder::of(&g))
        .await
        .expect("start");
    assert!(matches!(t.applied, Applied::No(_)), "final: {t:?}");
    let t = store
        .mark_started("start@404", &holder("n", 1))
        .await
        .expect("start");
    assert_eq!(t.applied, Applied::No(UNKNOWN_RUN.to_owned()));
    assert_eq!(t.run, None);
}

/// `mark_started_many` answers each report as `mark_started` would, in order (runs of
/// two jobs, with whatever partitions they hash to): one refused (a stale token, a run
/// not leased, an unknown run) changes nothing and the others are applied all the same.
pub async fn mark_started_many_applies_each_report(store: Arc<dyn Store>) {
    for id in ["many-a", "many-b"] {
        store.create_job(job(id, None)).await.expect("create");
    }
    let mut granted = Vec::new();
    for (id, at) in [
        ("many-a", 1000),
        ("many-a", 2000),
        ("many-a", 3000),
        ("many-b", 1000),
    ] {
        let r = begin(&store, planned_run(id, at, plan(OverlapPolicy::Allow)))
            .await
            .run;
        let slot = slot("n", 0);
        granted.push(grant(&store, &r.schedule_id, 1, &slot, terms(30_000, 10_000)).await);
    }
    let waiting = begin(
        &store,
        planned_run("many-a", 4000, plan(OverlapPolicy::Allow)),
    )
    .await
    .run;
    let stale = Holder {
        token: granted[1].fencing_token + 1,
        ..Holder::of(&granted[1])
    };
    let reports = vec![
        (granted[0].schedule_id.clone(), Holder::of(&granted[0])),
        (granted[1].schedule_id.clone(), stale),
        (waiting.schedule_id.clone(), holder("n", 1)),
        ("many-a@404".to_owned(), holder("n", 1)),
        (granted[2].schedule_id.clone(), Holder::of(&granted[2])),
        (granted[3].schedule_id.clone(), Holder::of(&granted[3])),
        ("no-separator".to_owned(), holder("n", 1)),
    ];
    let before = now(&store).await;
    let answers = store.mark_started_many(&reports).await.expect("start");
    let after = now(&store).await;
    assert_eq!(answers.len(), reports.len());
    assert_eq!(answers[0], Applied::Yes);
    assert_eq!(answers[1], Applied::No("stale fencing token".to_owned()));
    assert!(
        matches!(answers[2], Applied::No(_)),
        "not leased: {answers:?}"
    );
    assert_eq!(answers[3], Applied::No(UNKNOWN_RUN.to_owned()));
    assert_eq!(answers[4], Applied::Yes);
    assert_eq!(answers[5], Applied::Yes);
    assert_eq!(answers[6], Applied::No(UNKNOWN_RUN.to_owned()));
    for i in [0, 2, 3] {
        let run = get(&store, &granted[i].schedule_id).await;
        assert_eq!(run.state, RunState::Running, "{i}");
        let started = run.started_at.expect("started_at");
        assert_near(started, before, after, 0, "started_at");
        assert_eq!(run.deadlines.confirm_by, 0);
    }
    let untouched = get(&store, &granted[1].schedule_id).await;
    assert_eq!(untouched, granted[1], "a refused report changes nothing");
    assert_eq!(
        get(&store, &waiting.schedule_id).await.state,
        RunState::Waiting
    );

    // Sent again: already started, and the refused one now goes through.
    let again = vec![
        (granted[0].schedule_id.clone(), Holder::of(&granted[0])),
        (granted[1].schedule_id.clone(), Holder::of(&granted[1])),
    ];
    let answers = store.mark_started_many(&again).await.expect("start");
    assert_eq!(answers, vec![Applied::Already, Applied::Yes]);
    assert!(store.mark_started_many(&[]).await.expect("none").is_empty());
}

/// `finish_runs` answers each result as `finish_run` would, in order (runs of three
/// jobs, whatever partitions they hash to): a result refused (a stale token, an unknown
/// run, a malformed id) changes nothing and the others are applied all the same, each
/// answer with the transition's run and follow-ups (a serial job's released run); a
/// second result for a run the batch already finished is `Already`.
pub async fn finish_runs_applies_each_result(store: Arc<dyn Store>) {
    for id in ["fins-a", "fins-b", "fins-s"] {
        store.create_job(job(id, None)).await.expect("create");
    }
    let n = slot("fins-n", 0);
    let mut granted = Vec::new();
    for (id, at) in [
        ("fins-a", 1000),
        ("fins-a", 2000),
        ("fins-b", 1000),
        ("fins-b", 2000),
        ("fins-s", 1000),
    ] {
        let overlap = if id == "fins-s" {
            OverlapPolicy::Serial
        } else {
            OverlapPolicy::Allow
        };
        let r = begin(&store, planned_run(id, at, plan(overlap))).await.run;
        granted.push(grant(&store, &r.schedule_id, 1, &n, LONG).await);
    }
    let queued = begin(
        &store,
        planned_run("fins-s", 2000, plan(OverlapPolicy::Serial)),
    )
    .await
    .run;
    assert_eq!(queued.reason, "queued");
    let waiting = begin(
        &store,
        planned_run("fins-b", 3000, plan(OverlapPolicy::Allow)),
    )
    .await
    .run;
    let stale = Holder {
        token: granted[1].fencing_token + 1,
        ..Holder::of(&granted[1])
    };
    let by = |r: &RunRecord| Finisher::Holder(Holder::of(r));
    let fin = |sid: &str, by: Finisher, outcome: Outcome| Finish {
        schedule_id: sid.to_owned(),
        by,
        outcome,
        claim_webhook: None,
    };
    let rejected = Outcome {
        error_message: "busy".into(),
        ..outcome(RunState::Waiting)
    };
    let results = vec![
        fin(
            &granted[0].schedule_id,
            by(&granted[0]),
            Outcome {
                output: Some(b"a0".to_vec()),
                ..outcome(RunState::Succeeded)
            },
        ),
        fin(
            &granted[1].schedule_id,
            Finisher::Holder(stale),
            outcome(RunState::Succeeded),
        ),
        fin("fins-a@404", by(&granted[0]), outcome(RunState::Succeeded)),
        fin(&granted[2].schedule_id, by(&granted[2]), failed("E1")),
        fin(&granted[3].schedule_id, by(&granted[3]), rejected),
        fin(
            &waiting.schedule_id,
            Finisher::Waiting { attempt: 1 },
            failed("no executor"),
        ),
        fin(
            &granted[4].schedule_id,
            by(&granted[4]),
            outcome(RunState::Succeeded),
        ),
        fin(
            "no-separator",
            by(&granted[0]),
            outcome(RunState::Succeeded),
        ),
        fin(
            &granted[0].schedule_id,
            by(&granted[0]),
            outcome(RunState::Failed),
        ),
    ];
    let answers = store.finish_runs(results).await.expect("finish");
    let states: Vec<_> = answers
        .iter()
        .map(|t| (t.applied.clone(), t.run.as_ref().map(|r| r.state)))
        .collect();
    let no = |why: &str| Applied::No(why.to_owned());
    assert_eq!(
        states,
        vec![
            (Applied::Yes, Some(RunState::Succeeded)),
            (no("stale fencing token"), Some(RunState::Dispatched)),
            (no(UNKNOWN_RUN), None),
            (Applied::Yes, Some(RunState::Failed)),
            (Applied::Yes, Some(RunState::Waiting)),
            (Applied::Yes, Some(RunState::Failed)),
            (Applied::Yes, Some(RunState::Succeeded)),
            (no(UNKNOWN_RUN), None),
            (Applied::Already, Some(RunState::Succeeded)),
        ]
    );
    let done = get(&store, &granted[0].schedule_id).await;
    assert_eq!(done.output.as_deref(), Some(&b"a0"[..]));
    assert_eq!(
        answers[8].run.as_ref(),
        Some(&done),
        "the batch's first result stands"
    );
    assert_eq!(
        get(&store, &granted[1].schedule_id).await,
        granted[1],
        "a refused result changes nothing"
    );
    let again = get(&store, &granted[3].schedule_id).await;
    assert_eq!(
        (again.attempt, again.reason.as_str()),
        (1, "rejected: busy")
    );
    assert!(again.fencing_token > granted[3].fencing_token);
    assert_eq!(answers[6].next_serial, Some(queued.schedule_id.clone()));
    assert!(answers.iter().all(|t| t.revoked.is_empty()));
    assert_eq!(
        answers.iter().filter(|t| t.next_serial.is_some()).count(),
        1
    );
    assert!(
        store
            .finish_runs(Vec::new())
            .await
            .expect("none")
            .is_empty()
    );
}

/// `append_logs_many` answers each run's lines as `append_logs` would, in order: a
/// refused one (a stale token, an unknown run, a final run, a malformed id) stores
/// nothing and the others are stored all the same; the same run twice in one batch
/// gets its lines in order; no lines is vacuously stored.
pub async fn append_logs_many_appends_each_run(store: Arc<dyn Store>) {
    for id in ["logm-a", "logm-b"] {
        store.create_job(job(id, None)).await.expect("create");
    }
    let n = slot("logm-n", 0);
    let mut granted = Vec::new();
    for (id, at) in [
        ("logm-a", 1000),
        ("logm-a", 2000),
        ("logm-b", 1000),
        ("logm-b", 2000),
    ] {
        let r = begin(&store, planned_run(id, at, plan(OverlapPolicy::Allow)))
            .await
            .run;
        granted.push(grant(&store, &r.schedule_id, 1, &n, LONG).await);
    }
    let done = &granted[3];
    store
        .finish_run(
            &done.schedule_id,
            Finisher::Holder(Holder::of(done)),
            outcome(RunState::Succeeded),
        )
        .await
        .expect("finish");
    let stale = Holder {
        token: granted[1].fencing_token + 1,
        ..Holder::of(&granted[1])
    };
    let batch = |sid: &str, holder: Holder, lines: &[&str]| LogBatch {
        schedule_id: sid.to_owned(),
        holder,
        lines: lines.iter().map(|m| log(m)).collect(),
    };
    let of = |i: usize| (granted[i].schedule_id.as_str(), Holder::of(&granted[i]));
    let batches = vec![
        batch(of(0).0, of(0).1, &["a0-1", "a0-2"]),
        batch(of(1).0, stale.clone(), &["stale"]),
        batch("logm-a@404", of(0).1, &["nobody's"]),
        batch(of(2).0, of(2).1, &["b0"]),
        batch(of(0).0, of(0).1, &["a0-3"]),
        batch(of(3).0, of(3).1, &["late"]),
        batch(of(2).0, stale, &[]),
        batch("no-separator", of(0).1, &["x"]),
    ];
    let answers = store
        .append_logs_many(batches, 10_000)
        .await
        .expect("append");
    let no = |why: &str| Applied::No(why.to_owned());
    assert_eq!(
        answers,
        vec![
            Applied::Yes,
            no("stale fencing token"),
            no(UNKNOWN_RUN),
            Applied::Yes,
            Applied::Yes,
            no("run is SUCCEEDED"),
            Applied::Yes,
            no(UNKNOWN_RUN),
        ]
    );
    let read = |i: usize| {
        let store = store.clone();
        let sid = granted[i].schedule_id.clone();
        async move {
            let lines = store.read_logs(&sid, 0, 100).await.expect("read");
            lines
                .into_iter()
                .map(|l| (l.seq, l.message))
                .collect::<Vec<_>>()
        }
    };
    let owned = |v: &[(u64, &str)]| {
        v.iter()
            .map(|(s, m)| (*s, (*m).to_owned()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        read(0).await,
        owned(&[(1, "a0-1"), (2, "a0-2"), (3, "a0-3")])
    );
    assert_eq!(read(1).await, owned(&[]), "a refused batch stores nothing");
    assert_eq!(read(2).await, owned(&[(1, "b0")]));
    assert_eq!(read(3).await, owned(&[]), "a final run's log is closed");
    assert!(
        store
            .append_logs_many(Vec::new(), 10_000)
            .await
            .expect("none")
            .is_empty()
    );
}

/// Every report about a run (start, result, reject, progress, logs) is applied only
/// from the node that holds its lease, with its token: another node quoting the right
/// token is refused "not the lease holder" and changes nothing; the holder's own
/// reports then go through. The node is checked before the token, so a foreign node
/// learns nothing of it; the previous lease's node gets "stale fencing token".
pub async fn reports_only_from_the_lease_holder(store: Arc<dyn Store>) {
    store.create_job(job("own", None)).await.expect("create");
    let r = begin(&store, planned_run("own", 1000, plan(OverlapPolicy::Allow)))
        .await
        .run;
    let sid = r.schedule_id.as_str();
    let g = grant(&store, sid, 1, &slot("victim", 0), terms(30_000, 10_000)).await;
    let forged = Holder {
        node_id: "thief".into(),
        ..Holder::of(&g)
    };
    let wrong_token = Holder {
        token: g.fencing_token + 1,
        ..forged.clone()
    };
    let foreign = Applied::No(NOT_THE_HOLDER.to_owned());
    for h in [&forged, &wrong_token] {
        let t = store.mark_started(sid, h).await.expect("start");
        assert_eq!(t.applied, foreign, "start from {h:?}");
        let t = store
            .finish_run(
                sid,
                Finisher::Holder(h.clone()),
                outcome(RunState::Succeeded),
            )
            .await
            .expect("finish");
        assert_eq!(t.applied, foreign, "result from {h:?}");
        let mut reject = outcome(RunState::Waiting);
        reject.error_message = "busy".into();
        let t = store
            .finish_run(sid, Finisher::Holder(h.clone()), reject)
            .await
            .expect("reject");
        assert_eq!(t.applied, foreign, "reject from {h:?}");
        let a = store
            .report_progress(sid, h, 90, "forged")
            .await
            .expect("progress");
        assert_eq!(a, foreign, "progress from {h:?}");
        let a = store
            .append_logs(sid, h, vec![log("forged")], 1000)
            .await
            .expect("logs");
        assert_eq!(a, foreign, "logs from {h:?}");
    }
    let untouched = get(&store, sid).await;
    assert_eq!(untouched, g, "the foreign reports changed the run");
    assert_eq!(store.read_logs(sid, 0, 10).await.expect("read"), vec![]);

    // The holder's own reports are applied.
    let own = Holder::of(&g);
    let t = store.mark_started(sid, &own).await.expect("start");
    assert_eq!(t.applied, Applied::Yes);
    assert_eq!(
        store
            .report_progress(sid, &own, 40, "own")
            .await
            .expect("progress"),
        Applied::Yes
    );
    // An attempt that failed on one node and was retried on another: the previous
    // holder's late report is stale, not foreign.
    let mut retry = plan(OverlapPolicy::Allow);
    retry.max_attempts = 2;
    retry.backoff_ms = 0;
    let r2 = begin(&store, planned_run("own", 2000, retry)).await.run;
    let g2 = grant(&store, &r2.schedule_id, 1, &slot("victim", 0), LONG).await;
    let t = store
        .finish_run(
            &r2.schedule_id,
            Finisher::Holder(Holder::of(&g2)),
            failed("boom"),
        )
        .await
        .expect("fail");
    assert_eq!(t.applied, Applied::Yes);
    let retried = get(&store, &r2.schedule_id).await;
    assert_eq!((retried.state, retried.attempt), (RunState::Waiting, 2));
    let g3 = grant(&store, &r2.schedule_id, 2, &slot("heir", 0), LONG).await;
    let late = store
        .report_progress(&r2.schedule_id, &Holder::of(&g2), 50, "late")
        .await
        .expect("progress");
    assert_eq!(late, Applied::No(STALE_TOKEN.to_owned()));
    let heir = store
        .report_progress(&r2.schedule_id, &Holder::of(&g3), 50, "heir")
        .await
        .expect("progress");
    assert_eq!(heir, Applied::Yes);
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
