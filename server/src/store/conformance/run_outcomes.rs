//! `RunStore` checks of how a run ends or moves on: `finish_run` (outcomes, retries, rejects),
//! `expire_run` (timeouts, unconfirmed dispatches, lost leases, waits),
//! `take_back_unconfirmed` (a silent node's dispatches), run timers by
//! partition, `cancel_run`, sharding broadcast, progress and logs.

use super::*;

/// A run's common way (begun and leased in one step, started, succeeded with a code,
/// message and output of its own): every store writes the same fields and steps at
/// each call, and the record a call returns is the one stored. The success's event
/// names the code and message; its deadlines are all cleared.
pub async fn a_common_run_is_recorded_whole_at_each_step(store: Arc<dyn Store>) {
    store.create_job(job("whole", None)).await.expect("create");
    let run = planned_run("whole", 1000, plan(OverlapPolicy::Allow));
    let sid = run.schedule_id.clone();
    let (_, assigned) = store
        .begin_and_assign(run, GRACE, &slot("whole-n", 4), LONG)
        .await
        .expect("begin and assign");
    let Some(Assigned::Granted(leased)) = assigned else {
        panic!("expected a grant: {assigned:?}");
    };
    let holder = Holder::of(&leased);
    let t = store.mark_started(&sid, &holder).await.expect("start");
    assert_eq!(t.applied, Applied::Yes);
    let running = t.run.expect("run");
    assert_eq!(get(&store, &sid).await, running);
    assert_eq!(
        (running.state, running.deadlines.confirm_by),
        (RunState::Running, 0)
    );
    assert!(running.started_at.is_some() && running.deadlines.lease_expires > 0);
    assert_eq!(running.fencing_token, leased.fencing_token);

    let result = Outcome {
        output: Some(b"done".to_vec()),
        error_code: "W1".to_owned(),
        error_message: "slow disk".to_owned(),
        finished_at: Some(9_999),
        ..outcome(RunState::Succeeded)
    };
    let t = store
        .finish_run(&sid, Finisher::Holder(holder), result)
        .await
        .expect("finish");
    assert_eq!(t.applied, Applied::Yes);
    let done = t.run.expect("run");
    assert_eq!(get(&store, &sid).await, done);
    assert_eq!(
        (
            done.state,
            done.error_code.as_str(),
            done.error_message.as_str(),
            done.output.as_deref(),
            done.finished_at,
            done.started_at,
            done.reason.as_str(),
        ),
        (
            RunState::Succeeded,
            "W1",
            "slow disk",
            Some(&b"done"[..]),
            Some(9_999),
            running.started_at,
            "",
        )
    );
    assert_eq!(done.deadlines, Deadlines::default());
    assert_eq!(
        history_rows(&done.history),
        [
            ("DISPATCHED", 1, "whole-n", ""),
            ("RUNNING", 1, "whole-n", ""),
            ("SUCCEEDED", 1, "whole-n", "W1: slow disk"),
        ]
    );
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
        .mark_started(&sid(1000), &Holder::of(&g))
        .await
        .expect("start");
    let result = Outcome {
        output: Some(b"{\"ok\":true}".to_vec()),
        started_at: Some(1_111),
        finished_at: Some(2_222),
        ..outcome(RunState::Succeeded)
    };
    let t = store
        .finish_run(&sid(1000), Finisher::Holder(Holder::of(&g)), result.clone())
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
            Finisher::Holder(Holder::of(&g)),
            outcome(RunState::Failed),
        )
        .await
        .expect("finish");
    assert_eq!(t.applied, Applied::Already);
    assert_eq!(t.run.as_ref(), Some(&done));
    let t = store
        .finish_run(
            &sid(1000),
            Finisher::Holder(Holder {
                token: g.fencing_token - 1,
                ..Holder::of(&g)
            }),
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
            Finisher::Holder(Holder::of(&g)),
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
        .finish_run(
            &sid(3000),
            Finisher::Holder(holder("n1", 0)),
            outcome(RunState::Succeeded),
        )
        .await
        .expect("finish");
    assert!(matches!(t.applied, Applied::No(_)), "{t:?}");
    let t = store
        .finish_run(
            "fin@404",
            Finisher::Holder(holder("n1", 1)),
            outcome(RunState::Succeeded),
        )
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
        .finish_run(sid, Finisher::Holder(Holder::of(&g1)), failed("E1"))
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
        .finish_run(sid, Finisher::Holder(Holder::of(&g1)), failed("E1"))
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
        .finish_run(sid, Finisher::Holder(Holder::of(&g2)), failed("E2"))
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
        .finish_run(sid, Finisher::Holder(Holder::of(&g3)), failed("E3"))
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
        .finish_run(sid, Finisher::Holder(Holder::of(&g3)), failed("E3"))
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
        .finish_run(sid, Finisher::Holder(Holder::of(&g)), rejection.clone())
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
        .finish_run(sid, Finisher::Holder(Holder::of(&g)), rejection)
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
        .mark_started(sid, &Holder::of(&g1))
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
            attempt: g1.attempt,
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
            .mark_started(sid, &Holder::of(&g1))
            .await
            .expect("start"),
        store
            .finish_run(
                sid,
                Finisher::Holder(Holder::of(&g1)),
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

/// A silent node's dispatch is taken back at once, as its confirm deadline would take
/// it: only from the holder under its token, only while DISPATCHED and unconfirmed. A
/// `Started` or a heartbeat that got there first keeps the run where it is.
pub async fn take_back_unconfirmed_only_before_a_start(store: Arc<dyn Store>) {
    store.create_job(job("mute", None)).await.expect("create");
    let sid = |planned: i64| schedule_id("mute", &planned.to_string());
    for planned in [1000, 2000, 3000] {
        begin(
            &store,
            planned_run("mute", planned, plan(OverlapPolicy::Allow)),
        )
        .await;
    }
    let t = store
        .take_back_unconfirmed(&sid(1000), &holder("mute-n", 1))
        .await
        .expect("take back");
    assert!(matches!(t.applied, Applied::No(_)), "WAITING: {t:?}");
    let n = slot("mute-n", 0);
    let a = grant(&store, &sid(1000), 1, &n, LONG).await;
    let b = grant(&store, &sid(2000), 1, &n, LONG).await;
    let c = grant(&store, &sid(3000), 1, &n, LONG).await;

    // Only the holder, under its token.
    let thief = Holder {
        node_id: "thief".into(),
        ..Holder::of(&a)
    };
    let stale = Holder {
        token: a.fencing_token + 1,
        ..Holder::of(&a)
    };
    for (h, why) in [(&thief, NOT_THE_HOLDER), (&stale, STALE_TOKEN)] {
        let t = store
            .take_back_unconfirmed(&sid(1000), h)
            .await
            .expect("take back");
        assert_eq!(t.applied, Applied::No(why.to_owned()), "{h:?}");
    }
    assert_eq!(get(&store, &sid(1000)).await, a);

    let before = now(&store).await;
    let t = store
        .take_back_unconfirmed(&sid(1000), &Holder::of(&a))
        .await
        .expect("take back");
    let after = now(&store).await;
    assert_eq!(t.applied, Applied::Yes, "{t:?}");
    assert_eq!(
        t.revoked,
        vec![Revocation {
            schedule_id: a.schedule_id.clone(),
            node_id: "mute-n".to_owned(),
            token: a.fencing_token,
            attempt: 1,
            reason: "unconfirmed".to_owned(),
        }]
    );
    let w = t.run.expect("run");
    assert_eq!(
        (w.state, w.attempt, w.reason.as_str()),
        (RunState::Waiting, 1, "unconfirmed")
    );
    assert!(w.fencing_token > a.fencing_token);
    assert_eq!(w.last_node, "mute-n");
    assert_near(w.deadlines.wake_at, before, after, 0, "wake_at");
    assert_near(w.deadlines.wait_until, before, after, 5_000, "wait_until");
    assert_eq!(get(&store, &sid(1000)).await, w);
    // Routed again: a second take-back of the old lease is refused.
    let t = store
        .take_back_unconfirmed(&sid(1000), &Holder::of(&a))
        .await
        .expect("take back");
    assert!(matches!(t.applied, Applied::No(_)), "twice: {t:?}");

    // Started first: RUNNING stays.
    let started = store
        .mark_started(&sid(2000), &Holder::of(&b))
        .await
        .expect("start");
    assert_eq!(started.applied, Applied::Yes);
    let t = store
        .take_back_unconfirmed(&sid(2000), &Holder::of(&b))
        .await
        .expect("take back");
    assert_eq!(t.applied, Applied::No("run is RUNNING".to_owned()));
    assert_eq!(get(&store, &sid(2000)).await.state, RunState::Running);

    // Listed by a heartbeat first: confirmed, stays DISPATCHED.
    let renewed = store
        .renew_leases(
            "mute-n",
            &[Held {
                schedule_id: c.schedule_id.clone(),
                token: c.fencing_token,
            }],
            LONG.ttl,
        )
        .await
        .expect("renew");
    assert!(renewed[0].is_some());
    let t = store
        .take_back_unconfirmed(&sid(3000), &Holder::of(&c))
        .await
        .expect("take back");
    assert!(matches!(t.applied, Applied::No(_)), "confirmed: {t:?}");
    let kept = get(&store, &sid(3000)).await;
    assert_eq!(
        (kept.state, kept.fencing_token),
        (RunState::Dispatched, c.fencing_token)
    );
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
        .mark_started(&sid(3000), &Holder::of(&c))
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
                attempt: g.attempt,
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
        .mark_started(&sid(3000), &Holder::of(&c2))
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
            Finisher::Holder(Holder::of(&c2)),
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
    let mut earliest_wake = Millis::MAX;
    for id in &ones {
        let r = store
            .begin_run(planned_run(id, 1000, plan(OverlapPolicy::Allow)), short)
            .await
            .expect("begin")
            .run;
        earliest_wake = earliest_wake.min(r.deadlines.wake_at);
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
    // Not due yet: a run whose timer is far off. (The others are asked about only
    // while the store's clock is still before their wake: on a loaded two-core machine
    // the embedded store's writer once took longer than their 300 ms to commit these
    // begins, and the sweep rightly found them due.)
    begin(
        &store,
        planned_run(&ones[0], 2000, plan(OverlapPolicy::Allow)),
    )
    .await;
    let due = store.due_runs(1, 10).await.expect("due");
    if now(&store).await < earliest_wake {
        assert_eq!(due, Vec::<String>::new(), "woken at {earliest_wake}");
    }

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
        .mark_started(&sid(2000), &Holder::of(&g))
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
            attempt: g.attempt,
            reason: "by user".to_owned(),
        }]
    );
    let c = t.run.expect("run");
    assert_eq!(c.state, RunState::Cancelled);
    assert!(c.fencing_token > g.fencing_token);
    assert_eq!(
        store
            .report_progress(&sid(2000), &Holder::of(&g), 10, "late")
            .await
            .expect("progress"),
        Applied::No(STALE_TOKEN.to_owned())
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
    let t = store
        .mark_started(&sid(1000), &Holder::of(&granted[0]))
        .await
        .expect("start");
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
            Finisher::Holder(Holder::of(&granted[0])),
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
            Finisher::Holder(Holder::of(&granted[1])),
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
            Finisher::Holder(Holder::of(&g1)),
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
            Finisher::Holder(Holder::of(&granted[2])),
            failed("disk"),
        )
        .await
        .expect("finish");
    assert_eq!(t.run.expect("shard").state, RunState::Waiting);
    let g2 = grant(&store, "bc@1000#2", 2, &nodes[1], LONG).await;
    store
        .finish_run(
            "bc@1000#2",
            Finisher::Holder(Holder::of(&g2)),
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
                Finisher::Holder(Holder::of(&g)),
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
            attempt: g.attempt,
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
            attempt: g.attempt,
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
    assert_ne!(
        store
            .report_progress(sid, &holder("logs-n", 0), 5, "x")
            .await
            .expect("progress"),
        Applied::Yes
    );
    let g = grant(&store, sid, 1, &slot("logs-n", 0), LONG).await;
    let token = Holder::of(&g);
    let stale = Holder {
        token: g.fencing_token + 1,
        ..Holder::of(&g)
    };
    assert_eq!(
        store
            .report_progress(sid, &token, 50, "half way")
            .await
            .expect("progress"),
        Applied::Yes
    );
    let p = get(&store, sid).await;
    assert_eq!(
        (p.progress_percent, p.progress_message.as_str()),
        (50, "half way")
    );
    assert_ne!(
        store
            .report_progress(sid, &stale, 60, "stale")
            .await
            .expect("progress"),
        Applied::Yes
    );
    assert_ne!(
        store
            .report_progress("logs@404", &token, 60, "none")
            .await
            .expect("progress"),
        Applied::Yes
    );
    assert_eq!(get(&store, sid).await.progress_percent, 50);

    // Logs: seq from 1, assigned by the store; at most max_bytes, each line counted as
    // its message plus LOG_LINE_COST, the oldest lines falling out first; seqs never
    // reused.
    assert_ne!(
        store
            .append_logs(sid, &stale, vec![log("stale-line")], 1000)
            .await
            .expect("append"),
        Applied::Yes
    );
    assert_ne!(
        store
            .append_logs("logs@404", &token, vec![log("none-line")], 1000)
            .await
            .expect("append"),
        Applied::Yes
    );
    let ten = |c: char| c.to_string().repeat(10);
    // Room for two lines of ten bytes, not three.
    let two = 2 * (10 + LOG_LINE_COST as usize) + 5;
    assert_eq!(
        store
            .append_logs(
                sid,
                &token,
                vec![log(&ten('a')), log(&ten('b')), log(&ten('c'))],
                two
            )
            .await
            .expect("append"),
        Applied::Yes
    );
    let got = store.read_logs(sid, 0, 100).await.expect("read");
    assert_eq!(
        seqs(&got),
        [2, 3],
        "three lines over a two-line bound: the oldest fell out"
    );
    assert_eq!(got[0].message, ten('b'));
    assert_eq!(
        (got[0].level.as_str(), got[0].time_ms, got[0].attempt),
        ("info", 1_000, 1)
    );
    assert_eq!(
        store
            .append_logs(sid, &token, vec![log(&ten('d')), log(&ten('e'))], two)
            .await
            .expect("append"),
        Applied::Yes
    );
    let got = store.read_logs(sid, 0, 100).await.expect("read");
    assert_eq!(seqs(&got), [4, 5]);
    let messages: Vec<&str> = got.iter().map(|l| l.message.as_str()).collect();
    assert_eq!(messages, [ten('d'), ten('e')]);
    // A line alone over the bound does not survive, but its seq is spent.
    assert_eq!(
        store
            .append_logs(sid, &token, vec![log(&"x".repeat(two))], two)
            .await
            .expect("append"),
        Applied::Yes
    );
    assert_eq!(store.read_logs(sid, 0, 100).await.expect("read"), vec![]);
    // Empty lines cost their line each: 500 of them keep the last two.
    let empty: Vec<LogLine> = (0..500).map(|_| log("")).collect();
    assert_eq!(
        store
            .append_logs(sid, &token, empty, two)
            .await
            .expect("append"),
        Applied::Yes
    );
    assert_eq!(
        seqs(&store.read_logs(sid, 0, 1000).await.expect("read")),
        [505, 506],
        "lines are bounded, empty ones too"
    );
    let lines: Vec<LogLine> = (0..10).map(|i| log(&format!("line {i}"))).collect();
    assert_eq!(
        store
            .append_logs(sid, &token, lines, 10_000)
            .await
            .expect("append"),
        Applied::Yes
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
    // The two empty lines kept before, then the ten.
    assert_eq!(seqs(&all), (505..=516).collect::<Vec<u64>>());
    assert_eq!(all[2].message, "line 0");
    assert_eq!(all[11].message, "line 9");
    assert_eq!(
        seqs(&store.read_logs(sid, 514, 100).await.expect("read")),
        [515, 516]
    );
    assert_eq!(store.read_logs(sid, 516, 100).await.expect("read"), vec![]);
    assert_eq!(
        store.read_logs("logs@404", 0, 100).await.expect("read"),
        vec![]
    );

    // After its result the run takes neither progress nor log lines, not even from
    // the token that finished it. Once revoked, the old token is refused.
    store
        .finish_run(
            sid,
            Finisher::Holder(token.clone()),
            outcome(RunState::Succeeded),
        )
        .await
        .expect("finish");
    assert_ne!(
        store
            .report_progress(sid, &token, 100, "done")
            .await
            .expect("progress"),
        Applied::Yes
    );
    assert_eq!(
        store
            .append_logs(sid, &token, vec![log("after the result")], 10_000)
            .await
            .expect("append"),
        Applied::No("run is SUCCEEDED".into())
    );
    assert_eq!(store.read_logs(sid, 516, 100).await.expect("read"), vec![]);
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
    assert_ne!(
        store
            .append_logs(&r2.schedule_id, &Holder::of(&g2), vec![log("late")], 10_000)
            .await
            .expect("append"),
        Applied::Yes
    );
    assert_eq!(
        store.read_logs(&r2.schedule_id, 0, 10).await.expect("read"),
        vec![]
    );
}
