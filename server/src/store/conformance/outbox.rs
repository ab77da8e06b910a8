//! `Outbox` checks: the webhook outbox and the circuit breakers: the entry written in the
//! step that makes a run final, delivery claims and outcomes under their token, due
//! deliveries by partition, breaker transitions, the slots that pace a destination and
//! their ramp after its breaker closes.

use super::*;

const HOOK: &str = "https://hooks.example/sundial";

pub fn hooked(plan: RunPlan) -> RunPlan {
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

/// `finish_delivery` of a 2xx under `token`.
async fn delivered_200(store: &Arc<dyn Store>, sid: &str, token: u64) -> Applied {
    store
        .finish_delivery(sid, token, DeliveryOutcome::Delivered { status: 200 })
        .await
        .expect("finish")
}

fn body_of(d: &WebhookDelivery) -> serde_json::Value {
    serde_json::from_str(&d.body).expect("the body is JSON")
}

fn expected_body(run: &RunRecord) -> serde_json::Value {
    serde_json::to_value(WebhookBody::of(run)).expect("body")
}

/// A leased run of `job_id` planned at `planned`, RUNNING on its own node.
pub async fn running(
    store: &Arc<dyn Store>,
    job_id: &str,
    planned: Millis,
    plan: RunPlan,
) -> RunRecord {
    let r = begin(store, planned_run(job_id, planned, plan)).await.run;
    let n = slot(&format!("{job_id}-{planned}"), 0);
    let g = grant(store, &r.schedule_id, 1, &n, LONG).await;
    store
        .mark_started(&r.schedule_id, &Holder::of(&g))
        .await
        .expect("start");
    g
}

/// A new job `id` whose run planned at 1000 SUCCEEDED with a callback URL: its
/// schedule_id, whose delivery is due.
async fn delivery_due(store: &Arc<dyn Store>, id: &str) -> String {
    store.create_job(job(id, None)).await.expect("create");
    succeeded_with_webhook(store, id, 1000).await.schedule_id
}

/// A run of `job_id` planned at `planned`, with a callback URL, that SUCCEEDED on its
/// own node: its delivery is due. The run as it was leased (its node and token).
pub async fn succeeded_with_webhook(
    store: &Arc<dyn Store>,
    job_id: &str,
    planned: Millis,
) -> RunRecord {
    let g = running(store, job_id, planned, hooked(plan(OverlapPolicy::Allow))).await;
    store
        .finish_run(
            &g.schedule_id,
            Finisher::Holder(Holder::of(&g)),
            outcome(RunState::Succeeded),
        )
        .await
        .expect("finish");
    g
}

/// A run's history as (what, attempt, node_id, detail) rows, oldest first.
pub fn history_rows(events: &[RunEvent]) -> Vec<(&str, u32, &str, &str)> {
    events
        .iter()
        .map(|e| {
            (
                e.what.as_str(),
                e.attempt,
                e.node_id.as_str(),
                e.detail.as_str(),
            )
        })
        .collect()
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
            Finisher::Holder(Holder::of(&g)),
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
            Finisher::Holder(Holder::of(&g)),
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
            Finisher::Holder(Holder::of(&g)),
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
            Finisher::Holder(Holder::of(&g2)),
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
                Finisher::Holder(Holder::of(&g)),
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
                    Finisher::Holder(Holder::of(&g)),
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

    // Deferred (breaker open): not due before then, due again then, no attempt spent.
    // (Whether it is due is asked only while the store's clock is still before then:
    // on a loaded machine the embedded store's writer once took longer than a 150 ms
    // deferral to commit it, so the poll found it due, as it should by then.)
    let until = now(&store).await + 400;
    assert_eq!(
        store
            .finish_delivery(&s2, fresh.token, DeliveryOutcome::Defer { until })
            .await
            .expect("finish"),
        Applied::Yes
    );
    let due = due_deliveries(&store, "dl").await;
    if now(&store).await < until {
        assert_eq!(due, Vec::<String>::new(), "deferred until {until}");
    }
    while now(&store).await <= until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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

/// `claim_deliveries`: a batch over several partitions claims each due entry as
/// `claim_delivery` would, in the order asked, and leaves out the ones it cannot
/// claim (claimed before, unknown, asked twice) while claiming the rest.
pub async fn claim_deliveries_batch(store: Arc<dyn Store>) {
    // Over three partitions.
    let parts = store.partitions();
    let mut jobs = ids_in_partition(parts, 0, "cb", 2);
    jobs.extend(ids_in_partition(parts, 1, "cb", 2));
    jobs.extend(ids_in_partition(parts, 2, "cb", 1));
    let mut sids = Vec::new();
    for id in &jobs {
        sids.push(delivery_due(&store, id).await);
    }
    // One claimed before the batch: not due while its claim lasts.
    let before = claim(&store, &sids[2], 60_000).await;
    let asked = vec![
        sids[4].clone(),
        sids[2].clone(),
        schedule_id(&jobs[0], "999"),
        sids[0].clone(),
        sids[3].clone(),
        sids[0].clone(),
        sids[1].clone(),
    ];
    let claimed = store
        .claim_deliveries(&asked, Duration::from_secs(60))
        .await
        .expect("claim deliveries");
    let got: Vec<&str> = claimed.iter().map(|d| d.schedule_id.as_str()).collect();
    assert_eq!(got, vec![&*sids[4], &*sids[0], &*sids[3], &*sids[1]]);
    // Outcomes in one batch are applied in turn: the same outcome twice, the second
    // finds the claim ended.
    let retry = DeliveryOutcome::Retry {
        after: Duration::from_secs(60),
        status: 500,
        error: "http_500".to_owned(),
    };
    let first = &claimed[0];
    let result = DeliveryResult {
        schedule_id: first.schedule_id.clone(),
        token: first.token,
        outcome: retry,
    };
    let applied = store
        .finish_deliveries(vec![result.clone(), result])
        .await
        .expect("finish deliveries");
    assert_eq!(applied[0], Applied::Yes);
    assert!(matches!(applied[1], Applied::No(_)), "{:?}", applied[1]);
    assert_eq!(get(&store, &first.schedule_id).await.callback_attempts, 1);
    let claimed = &claimed[1..];
    for d in claimed {
        let (job_id, _) = crate::model::split_schedule_id(&d.schedule_id).expect("schedule id");
        assert_eq!(
            (d.job_id.as_str(), d.url.as_str(), d.attempts),
            (job_id, HOOK, 0)
        );
        assert_eq!(
            body_of(d),
            expected_body(&get(&store, &d.schedule_id).await)
        );
        // Claimed: exclusive while the lease lasts, and its token's outcome counts.
        assert_eq!(
            store
                .claim_delivery(&d.schedule_id, Duration::from_secs(60))
                .await
                .expect("claim"),
            None
        );
        assert_eq!(
            delivered_200(&store, &d.schedule_id, d.token).await,
            Applied::Yes
        );
    }
    // The one claimed before is still that claim's.
    assert_eq!(
        store
            .finish_delivery(
                &sids[2],
                before.token,
                DeliveryOutcome::Delivered { status: 200 }
            )
            .await
            .expect("finish"),
        Applied::Yes
    );
    for sid in sids.iter().filter(|s| **s != sids[4]) {
        assert_eq!(get(&store, sid).await.callback_state, CallbackState::Done);
    }
    assert_eq!(
        get(&store, &sids[4]).await.callback_state,
        CallbackState::Pending,
        "retried in a minute"
    );
    assert_eq!(
        store
            .claim_deliveries(&sids, Duration::from_secs(60))
            .await
            .expect("claim deliveries"),
        Vec::new(),
        "nothing due to claim"
    );
}

/// A result given with `claim_webhook` gets the webhook it makes due claimed for its
/// caller in the same step: in flight under the claim's token (no sweep sees it due,
/// no other claim takes it), its outcome recorded as any claim's. One not asked for,
/// a result that makes nothing due and a result already recorded claim nothing.
pub async fn a_result_claims_its_webhook_for_its_caller(store: Arc<dyn Store>) {
    store.create_job(job("rcw", None)).await.expect("create");
    let hooked_run = |planned| running(&store, "rcw", planned, hooked(plan(OverlapPolicy::Allow)));
    let (a, b, d) = (
        hooked_run(1000).await,
        hooked_run(2000).await,
        hooked_run(3000).await,
    );
    let plain = running(&store, "rcw", 4000, plan(OverlapPolicy::Allow)).await;
    let lease = Duration::from_secs(60);
    let fin = |r: &RunRecord, state: RunState, claim: Option<Duration>| Finish {
        schedule_id: r.schedule_id.clone(),
        by: Finisher::Holder(Holder::of(r)),
        outcome: outcome(state),
        claim_webhook: claim,
    };
    let before = now(&store).await;
    let t = store
        .finish_runs(vec![
            fin(&a, RunState::Succeeded, Some(lease)),
            fin(&b, RunState::Failed, Some(lease)),
            fin(&d, RunState::Succeeded, None),
            fin(&plain, RunState::Succeeded, Some(lease)),
        ])
        .await
        .expect("finish runs");
    assert!(t.iter().all(|t| t.applied == Applied::Yes), "{t:?}");
    for (t, r) in t[..2].iter().zip([&a, &b]) {
        let w = t.webhook.as_ref().expect("claimed for the caller");
        let final_run = get(&store, &r.schedule_id).await;
        assert_eq!(final_run.callback_state, CallbackState::Pending);
        assert_eq!(
            (
                w.schedule_id.as_str(),
                w.job_id.as_str(),
                w.url.as_str(),
                w.attempts
            ),
            (r.schedule_id.as_str(), "rcw", HOOK, 0)
        );
        assert_eq!(body_of(w), expected_body(&final_run));
        assert!(w.created_at >= before && w.now >= before, "{w:?}");
        assert!(w.token > 0);
        // In flight under that claim: no other claim takes it.
        assert_eq!(
            store
                .claim_delivery(&r.schedule_id, lease)
                .await
                .expect("claim"),
            None
        );
    }
    assert_eq!(t[2].webhook, None, "not asked for");
    assert_eq!(t[3].webhook, None, "no callback URL");
    assert_eq!(
        due_deliveries(&store, "rcw").await,
        vec![d.schedule_id.clone()]
    );

    // The claim's token records the outcome, as any claim's does.
    let w = t[0].webhook.clone().expect("claimed");
    assert_eq!(
        delivered_200(&store, &w.schedule_id, w.token + 1).await,
        Applied::No("stale delivery token".to_owned())
    );
    assert_eq!(
        delivered_200(&store, &w.schedule_id, w.token).await,
        Applied::Yes
    );
    let delivered = get(&store, &a.schedule_id).await;
    assert_eq!(
        (
            delivered.callback_state,
            delivered.callback_attempts,
            delivered.callback_status
        ),
        (CallbackState::Done, 1, 200)
    );

    // The same result again is already recorded: nothing is claimed.
    let again = store
        .finish_runs(vec![fin(&b, RunState::Failed, Some(lease))])
        .await
        .expect("finish runs");
    assert_eq!(
        (&again[0].applied, &again[0].webhook),
        (&Applied::Already, &None)
    );
}

pub async fn outbox_due_per_partition(store: Arc<dyn Store>) {
    let parts = store.partitions();
    let a = ids_in_partition(parts, 0, "oba", 1).remove(0);
    let b = ids_in_partition(parts, 1, "obb", 1).remove(0);
    for id in [&a, &b] {
        delivery_due(&store, id).await;
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

fn terms(limit: u32) -> DeliveryTerms {
    DeliveryTerms {
        limit,
        lease: Duration::from_secs(30),
        probe: Duration::from_millis(100),
        threshold: 3,
        cool_down: Duration::from_millis(200),
    }
}

async fn admit(store: &Arc<dyn Store>, dest: &str, holder: &str, t: &DeliveryTerms) -> Admission {
    store
        .admit_delivery(dest, holder, t)
        .await
        .expect("admit delivery")
}

async fn settle(
    store: &Arc<dyn Store>,
    dest: &str,
    holder: &str,
    answered: Option<bool>,
    t: &DeliveryTerms,
) -> Option<BreakerUpdate> {
    store
        .settle_delivery(dest, holder, answered, t)
        .await
        .expect("settle delivery")
}

/// An admitted attempt and its result: what the breaker became.
async fn attempt(
    store: &Arc<dyn Store>,
    dest: &str,
    holder: &str,
    ok: bool,
    t: &DeliveryTerms,
) -> BreakerUpdate {
    let a = admit(store, dest, holder, t).await;
    assert!(
        matches!(a, Admission::Go | Admission::Probe),
        "{holder}: {a:?}"
    );
    settle(store, dest, holder, Some(ok), t)
        .await
        .expect("an answered attempt is counted")
}

pub async fn breaker_transitions(store: Arc<dyn Store>) {
    let dest = "https://hooks.example:443";
    let other = "http://10.0.0.1:8080";
    // One slot: no ramp outlives its first answer.
    let t = terms(1);
    let closed = |changed| BreakerUpdate {
        state: BreakerState::Closed,
        changed,
    };
    // Closed until `threshold` failures in a row; a success resets the count.
    for holder in ["a", "b"] {
        assert_eq!(
            attempt(&store, dest, holder, false, &t).await,
            closed(false)
        );
    }
    assert_eq!(attempt(&store, dest, "c", true, &t).await, closed(false));
    for holder in ["d", "e"] {
        attempt(&store, dest, holder, false, &t).await;
    }
    let before = now(&store).await;
    let u = attempt(&store, dest, "f", false, &t).await;
    let after = now(&store).await;
    let BreakerState::Open { until } = u.state else {
        panic!("three failures open the breaker: {u:?}");
    };
    assert!(u.changed);
    assert_near(until, before, after, 200, "open until");
    assert_eq!(
        admit(&store, dest, "g", &t).await,
        Admission::Open { until }
    );
    assert_eq!(
        admit(&store, other, "g", &t).await,
        Admission::Go,
        "breakers are per destination"
    );
    assert_eq!(settle(&store, other, "g", None, &t).await, None);
    // A failure while open (an attempt that started earlier) changes nothing.
    assert_eq!(
        settle(&store, dest, "h", Some(false), &t).await,
        Some(BreakerUpdate {
            state: BreakerState::Open { until },
            changed: false
        })
    );

    // After the cool-down one caller gets the probe; the others wait for it (and go as
    // soon as it closes the breaker).
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(admit(&store, dest, "p1", &t).await, Admission::Probe);
    assert_eq!(
        admit(&store, dest, "p2", &t).await,
        Admission::Full { window: 1 },
        "the probe holds the only slot"
    );
    // The probe fails: open again for a cool-down.
    let u = settle(&store, dest, "p1", Some(false), &t)
        .await
        .expect("counted");
    assert!(
        matches!(u.state, BreakerState::Open { .. }) && u.changed,
        "{u:?}"
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    // A probe that never reports is presumed lost after `probe`, and its slot is free
    // when its lease ends: another one goes.
    let short = DeliveryTerms {
        lease: Duration::from_millis(100),
        ..t
    };
    assert_eq!(admit(&store, dest, "p3", &short).await, Admission::Probe);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(admit(&store, dest, "p4", &t).await, Admission::Probe);
    // The probe succeeds: closed.
    assert_eq!(
        settle(&store, dest, "p4", Some(true), &t).await,
        Some(closed(true))
    );
    // And it takes `threshold` failures again to open it.
    assert_eq!(attempt(&store, dest, "i", false, &t).await, closed(false));
}

/// A destination's slots: at most `limit` held by live holders, across callers; a
/// holder asking again keeps its slot; a slot given back or whose lease ran out is
/// free; destinations count apart.
pub async fn delivery_slots_pace_a_destination(store: Arc<dyn Store>) {
    let dest = "http://receiver.example:80";
    let t = terms(2);
    assert_eq!(admit(&store, dest, "a", &t).await, Admission::Go);
    assert_eq!(admit(&store, dest, "b", &t).await, Admission::Go);
    assert_eq!(
        admit(&store, dest, "c", &t).await,
        Admission::Full { window: 2 }
    );
    assert_eq!(admit(&store, dest, "a", &t).await, Admission::Go, "held");
    assert_eq!(
        admit(&store, "http://other.example:80", "c", &t).await,
        Admission::Go
    );
    // A higher limit (another job's) sees the same slots held.
    assert_eq!(admit(&store, dest, "c", &terms(3)).await, Admission::Go);
    assert_eq!(
        admit(&store, dest, "d", &terms(3)).await,
        Admission::Full { window: 3 }
    );
    // Given back without an attempt: nothing counted, the slot free.
    assert_eq!(settle(&store, dest, "a", None, &t).await, None);
    assert_eq!(settle(&store, dest, "c", None, &t).await, None);
    assert_eq!(admit(&store, dest, "d", &t).await, Admission::Go);
    // A holder that died: its slot is free once its lease ends.
    let one = DeliveryTerms {
        lease: Duration::from_millis(100),
        ..terms(1)
    };
    let lone = "http://lone.example:80";
    assert_eq!(admit(&store, lone, "x", &one).await, Admission::Go);
    assert_eq!(
        admit(&store, lone, "y", &one).await,
        Admission::Full { window: 1 }
    );
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(admit(&store, lone, "y", &one).await, Admission::Go);
}

/// A destination's window shared between owners (a holder's name before its `#`):
/// while one is refused a slot (and so marked waiting), another holding at least its
/// share is refused new slots and loses a slot it asks again for, until the waiting one
/// has its share; one owner with nobody waiting takes the whole window, and the waiting
/// mark ends after `WAITING_MARK`.
pub async fn delivery_slots_are_shared_between_owners(store: Arc<dyn Store>) {
    let dest = "http://shared.example:80";
    let t = terms(4);
    for h in ["a#1", "a#2", "a#3", "a#4"] {
        assert_eq!(admit(&store, dest, h, &t).await, Admission::Go, "{h}");
    }
    let full = Admission::Full { window: 4 };
    assert_eq!(
        admit(&store, dest, "b#1", &t).await,
        full,
        "the window is full"
    );
    // Share 2 each: `a` holds 3 besides a#1, so a#1 asking again loses its slot, and a
    // new holder of `a` gets none.
    assert_eq!(admit(&store, dest, "a#1", &t).await, full, "a#1 yields");
    assert_eq!(
        admit(&store, dest, "a#5", &t).await,
        full,
        "a is past its share"
    );
    assert_eq!(admit(&store, dest, "b#1", &t).await, Admission::Go);
    assert_eq!(admit(&store, dest, "a#2", &t).await, full, "a#2 yields");
    assert_eq!(admit(&store, dest, "b#2", &t).await, Admission::Go);
    // Each has its share: asking again keeps a slot, and the window is full.
    assert_eq!(admit(&store, dest, "a#3", &t).await, Admission::Go, "kept");
    assert_eq!(admit(&store, dest, "b#1", &t).await, Admission::Go, "kept");
    assert_eq!(admit(&store, dest, "b#3", &t).await, full);
    // Alone on another destination, an owner takes the whole window.
    let alone = "http://alone.example:80";
    for h in ["a#6", "a#7", "a#8", "a#9"] {
        assert_eq!(admit(&store, alone, h, &t).await, Admission::Go, "{h}");
    }
    // `b` gives its slots back: while its mark lasts `a` is held to its share ...
    assert_eq!(settle(&store, dest, "b#1", None, &t).await, None);
    assert_eq!(settle(&store, dest, "b#2", None, &t).await, None);
    assert_eq!(
        admit(&store, dest, "a#10", &t).await,
        full,
        "b is still waiting"
    );
    // ... and once it has ended, `a` takes the whole window again.
    tokio::time::sleep(crate::store::WAITING_MARK + Duration::from_millis(200)).await;
    assert_eq!(admit(&store, dest, "a#10", &t).await, Admission::Go);
    assert_eq!(admit(&store, dest, "a#11", &t).await, Admission::Go);
}

/// `end_waiting`: an owner with no delivery left waiting for a slot ends its mark at
/// once, and the other owner takes the whole window again; a later refusal marks it
/// again.
pub async fn a_waiting_mark_ends_when_its_owner_stops_waiting(store: Arc<dyn Store>) {
    let dest = "http://mark.example:80";
    let t = terms(4);
    for h in ["a#1", "a#2", "a#3", "a#4"] {
        assert_eq!(admit(&store, dest, h, &t).await, Admission::Go, "{h}");
    }
    let full = Admission::Full { window: 4 };
    assert_eq!(admit(&store, dest, "b#1", &t).await, full, "marked waiting");
    assert_eq!(settle(&store, dest, "a#1", None, &t).await, None);
    assert_eq!(admit(&store, dest, "b#1", &t).await, Admission::Go);
    // `b` sent its one delivery and has nothing else waiting.
    store.end_waiting(dest, "b").await.expect("end_waiting");
    assert_eq!(settle(&store, dest, "b#1", None, &t).await, None);
    assert_eq!(
        admit(&store, dest, "a#5", &t).await,
        Admission::Go,
        "b's mark ended: a is not held to its share"
    );
    assert_eq!(
        admit(&store, dest, "a#6", &t).await,
        full,
        "the window is full"
    );
    // Ending a mark that is not there changes nothing.
    store.end_waiting(dest, "c").await.expect("end_waiting");
    store
        .end_waiting("http://nobody.example:80", "b")
        .await
        .expect("end_waiting");
    assert_eq!(admit(&store, dest, "b#2", &t).await, full, "marked again");
    assert_eq!(
        admit(&store, dest, "a#2", &t).await,
        full,
        "a#2 yields to b"
    );
}

/// `settle_deliveries`: a batch is the sequence of its requests, across destinations,
/// one answer each: slots given back, answers counted on each destination's breaker.
pub async fn settle_batches(store: Arc<dyn Store>) {
    let (a, b) = ("http://batch-a.example:80", "http://batch-b.example:80");
    let give = |dest: &str, holder: &str, answered: Option<bool>, t: DeliveryTerms| SettleRequest {
        destination: dest.to_owned(),
        holder: holder.to_owned(),
        answered,
        terms: t,
    };
    let t = terms(2);
    let once = DeliveryTerms {
        threshold: 1,
        ..terms(2)
    };
    for (dest, holder) in [(a, "a1"), (a, "a2"), (b, "b1")] {
        assert_eq!(admit(&store, dest, holder, &t).await, Admission::Go);
    }
    assert_eq!(
        admit(&store, a, "a3", &t).await,
        Admission::Full { window: 2 }
    );
    let settled = store
        .settle_deliveries(vec![
            give(a, "a1", Some(true), t),
            give(b, "b1", Some(false), once),
            give(a, "a2", None, t),
        ])
        .await
        .expect("settle deliveries");
    assert_eq!(settled.len(), 3);
    assert_eq!(
        settled[0],
        Some(BreakerUpdate {
            state: BreakerState::Closed,
            changed: false
        })
    );
    let opened = settled[1].expect("counted");
    assert!(
        opened.changed && matches!(opened.state, BreakerState::Open { .. }),
        "{opened:?}"
    );
    assert_eq!(settled[2], None, "no attempt: nothing counted");
    // Both of a's slots are free again; b's breaker is open.
    assert_eq!(admit(&store, a, "a3", &t).await, Admission::Go);
    assert_eq!(admit(&store, a, "a4", &t).await, Admission::Go);
    let refused = admit(&store, b, "b2", &t).await;
    assert!(matches!(refused, Admission::Open { .. }), "{refused:?}");
    assert_eq!(
        store
            .settle_deliveries(Vec::new())
            .await
            .expect("settle nothing"),
        Vec::new()
    );
}

/// `admit_delivery_clean`: clean while nothing is counted on the destination's
/// breaker; a failure counted makes it not clean, and so does a ramp under way; a
/// success that leaves no record makes it clean again.
pub async fn clean_admissions(store: Arc<dyn Store>) {
    let dest = "http://clean.example:80";
    let t = terms(4);
    let clean = |holder: &'static str| {
        let store = store.clone();
        async move {
            store
                .admit_delivery_clean(dest, holder, &t)
                .await
                .expect("admit")
        }
    };
    let a = clean("a").await;
    assert_eq!((a.admission, a.clean), (Admission::Go, true));
    // Asking again keeps the slot, and says the same.
    let a = clean("a").await;
    assert_eq!((a.admission, a.clean), (Admission::Go, true));
    assert_eq!(
        settle(&store, dest, "a", Some(false), &t).await,
        Some(BreakerUpdate {
            state: BreakerState::Closed,
            changed: false
        })
    );
    let b = clean("b").await;
    assert_eq!(
        (b.admission, b.clean),
        (Admission::Go, false),
        "a failure counted"
    );
    settle(&store, dest, "b", Some(true), &t).await;
    let c = clean("c").await;
    assert_eq!(
        (c.admission, c.clean),
        (Admission::Go, true),
        "the success reset it"
    );
    settle(&store, dest, "c", None, &t).await;
    // Opened, then closed by a probe: the ramp under way is counted.
    for holder in ["d", "e", "f"] {
        attempt(&store, dest, holder, false, &t).await;
    }
    let open = clean("g").await;
    assert!(
        matches!(open.admission, Admission::Open { .. }) && !open.clean,
        "{open:?}"
    );
    tokio::time::sleep(t.cool_down + Duration::from_millis(50)).await;
    let probe = clean("p").await;
    assert_eq!((probe.admission, probe.clean), (Admission::Probe, false));
    settle(&store, dest, "p", Some(true), &t).await;
    let ramp = clean("r").await;
    assert_eq!(
        (ramp.admission, ramp.clean),
        (Admission::Go, false),
        "ramping up"
    );
}

/// After its breaker closes a destination's window starts at one slot, grows by one
/// with each answered attempt, halves with a failure, and ends at the limit.
pub async fn a_closed_breaker_ramps_up(store: Arc<dyn Store>) {
    let dest = "http://recovering.example:80";
    let t = terms(6);
    for holder in ["a", "b", "c"] {
        attempt(&store, dest, holder, false, &t).await;
    }
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(admit(&store, dest, "probe", &t).await, Admission::Probe);
    let u = settle(&store, dest, "probe", Some(true), &t).await;
    assert_eq!(
        u.map(|u| (u.state, u.changed)),
        Some((BreakerState::Closed, true))
    );
    // The window, found by admitting holders until one is refused, then freed.
    let window = |n: usize| {
        let store = store.clone();
        async move {
            let mut held = Vec::new();
            let full = loop {
                let holder = format!("w{}", held.len());
                match admit(&store, dest, &holder, &t).await {
                    Admission::Go => held.push(holder),
                    other => break other,
                }
                assert!(held.len() <= n, "more than {n} admitted");
            };
            for holder in &held {
                settle(&store, dest, holder, None, &t).await;
            }
            (held.len(), full)
        }
    };
    assert_eq!(window(1).await, (1, Admission::Full { window: 1 }));
    attempt(&store, dest, "s1", true, &t).await;
    assert_eq!(window(2).await, (2, Admission::Full { window: 2 }));
    attempt(&store, dest, "s2", true, &t).await;
    attempt(&store, dest, "s3", true, &t).await;
    assert_eq!(window(4).await, (4, Admission::Full { window: 4 }));
    // A failure halves it (the breaker stays closed: one failure of three).
    let u = attempt(&store, dest, "f", false, &t).await;
    assert_eq!((u.state, u.changed), (BreakerState::Closed, false));
    assert_eq!(window(2).await, (2, Admission::Full { window: 2 }));
    for holder in ["s4", "s5", "s6", "s7"] {
        attempt(&store, dest, holder, true, &t).await;
    }
    // 2 + 4 = 6: the ramp is over, the window is the limit.
    assert_eq!(window(6).await, (6, Admission::Full { window: 6 }));
}

/// A run's history notes each step in order, the same on every store: begun WAITING,
/// DISPATCHED to a node, RUNNING, a failed attempt back to WAITING for its retry,
/// DISPATCHED to another node, RUNNING, SUCCEEDED, then each webhook delivery attempt
/// with its answer. A report that changes nothing notes nothing.
pub async fn run_history_notes_each_step(store: Arc<dyn Store>) {
    store.create_job(job("hist", None)).await.expect("create");
    let two = hooked(RunPlan {
        max_attempts: 2,
        ..plan(OverlapPolicy::Allow)
    });
    let r = begin(&store, planned_run("hist", 1000, two)).await.run;
    let sid = r.schedule_id.as_str();
    let g1 = grant(&store, sid, 1, &slot("hist-a", 0), LONG).await;
    store
        .mark_started(sid, &Holder::of(&g1))
        .await
        .expect("start");
    // Started again (a re-sent report): nothing changes, nothing is noted.
    store
        .mark_started(sid, &Holder::of(&g1))
        .await
        .expect("start again");
    store
        .finish_run(sid, Finisher::Holder(Holder::of(&g1)), failed("E1"))
        .await
        .expect("fail");
    let g2 = grant(&store, sid, 2, &slot("hist-b", 0), LONG).await;
    store
        .mark_started(sid, &Holder::of(&g2))
        .await
        .expect("start 2");
    store
        .finish_run(
            sid,
            Finisher::Holder(Holder::of(&g2)),
            outcome(RunState::Succeeded),
        )
        .await
        .expect("succeed");
    let d1 = claim(&store, sid, 60_000).await;
    let retry = DeliveryOutcome::Retry {
        after: Duration::from_millis(1),
        status: 500,
        error: "http_500".to_owned(),
    };
    store
        .finish_delivery(sid, d1.token, retry)
        .await
        .expect("retry delivery");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let d2 = claim(&store, sid, 60_000).await;
    store
        .finish_delivery(sid, d2.token, DeliveryOutcome::Delivered { status: 200 })
        .await
        .expect("deliver");

    let run = get(&store, sid).await;
    assert_eq!(
        history_rows(&run.history),
        [
            ("WAITING", 1, "", ""),
            ("DISPATCHED", 1, "hist-a", ""),
            ("RUNNING", 1, "hist-a", ""),
            ("WAITING", 2, "hist-a", "retry: E1"),
            ("DISPATCHED", 2, "hist-b", ""),
            ("RUNNING", 2, "hist-b", ""),
            ("SUCCEEDED", 2, "hist-b", ""),
            ("WEBHOOK", 2, "hist-b", "HTTP 500: http_500"),
            ("WEBHOOK", 2, "hist-b", "HTTP 200"),
        ]
    );
    let at: Vec<Millis> = run.history.iter().map(|e| e.at).collect();
    assert!(at.windows(2).all(|w| w[0] <= w[1]), "in order: {at:?}");
    assert!(at[0] >= run.created_at, "{at:?} from {}", run.created_at);
}

/// A run's history keeps its last [`RunEvent::KEPT`] steps, oldest first, on every
/// store; a record given with steps of its own (`record_run`) keeps them before the
/// store's.
pub async fn run_history_keeps_the_last_steps(store: Arc<dyn Store>) {
    store.create_job(job("kept", None)).await.expect("create");
    let given_steps = vec![
        RunEvent {
            at: 5,
            what: "TRIGGERED".to_owned(),
            attempt: 1,
            node_id: String::new(),
            detail: "earlier".to_owned(),
        },
        RunEvent {
            at: 6,
            what: "WAITING".to_owned(),
            attempt: 1,
            node_id: "somewhere".to_owned(),
            detail: String::new(),
        },
    ];
    let given = RunRecord {
        history: given_steps.clone(),
        ..run("kept", 1_000_000, 0)
    };
    let recorded = store.record_run(given).await.expect("record").run;
    assert_eq!(recorded.history[..2], given_steps[..]);
    assert_eq!(recorded.history.len(), 3, "{:?}", recorded.history);
    assert_eq!(recorded.history[2].what, "TRIGGERED");
    assert_eq!(
        get(&store, &recorded.schedule_id).await.history,
        recorded.history
    );

    // Begun (1 step), then 20 dispatches each rejected (2 steps each): 41 steps.
    let r = begin(
        &store,
        planned_run("kept", 2000, plan(OverlapPolicy::Allow)),
    )
    .await
    .run;
    let sid = r.schedule_id.as_str();
    let rejection = Outcome {
        error_message: "busy".to_owned(),
        ..outcome(RunState::Waiting)
    };
    for i in 0..20 {
        let g = grant(&store, sid, 1, &slot(&format!("kept-{}", i % 2), 0), LONG).await;
        let t = store
            .finish_run(sid, Finisher::Holder(Holder::of(&g)), rejection.clone())
            .await
            .expect("reject");
        assert_eq!(t.applied, Applied::Yes);
    }
    let run = get(&store, sid).await;
    assert_eq!(run.history.len(), RunEvent::KEPT);
    // The first 9 steps fell out: step 9 (the fifth dispatch, to kept-0) is the oldest.
    let whats: Vec<(&str, &str)> = run
        .history
        .iter()
        .map(|e| (e.what.as_str(), e.node_id.as_str()))
        .collect();
    for (i, w) in whats.iter().enumerate() {
        let node = if (i + 9) % 4 == 1 || (i + 9) % 4 == 2 {
            "kept-0"
        } else {
            "kept-1"
        };
        let what = if i % 2 == 0 { "DISPATCHED" } else { "WAITING" };
        assert_eq!(*w, (what, node), "step {i} of {whats:?}");
    }
    assert_eq!(run.history[31].detail, "rejected: busy");
    let at: Vec<Millis> = run.history.iter().map(|e| e.at).collect();
    assert!(at.windows(2).all(|w| w[0] <= w[1]), "in order: {at:?}");
}
