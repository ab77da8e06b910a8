//! `AuditLog` checks: events get ascending seqs and the store's time, list newest first
//! in pages, and only the newest `keep` are kept.

use super::*;

fn event(i: u64) -> AuditEvent {
    AuditEvent {
        caller: format!("bearer:ops-{i}"),
        operation: "JobService.CreateJob".into(),
        target: format!("job j{i}"),
        outcome: if i.is_multiple_of(2) {
            "OK"
        } else {
            "NOT_FOUND"
        }
        .into(),
        detail: "x".repeat(i as usize),
        via: "grpc".into(),
        instance: "i-1".into(),
        // The store's, whatever is given.
        seq: 99,
        time_ms: 1,
    }
}

pub async fn audit_log_pages_and_keeps_the_newest(store: Arc<dyn Store>) {
    assert_eq!(store.list_audit(None, 10).await.expect("list"), vec![]);
    let t0 = now(&store).await;
    for i in 1..=7 {
        store.append_audit(event(i), 5).await.expect("append");
    }
    let all = store.list_audit(None, 100).await.expect("list");
    let seqs: Vec<u64> = all.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        [7, 6, 5, 4, 3],
        "newest first, the oldest two forgotten"
    );
    for e in &all {
        let given = event(e.seq);
        assert_eq!(
            (&e.caller, &e.target, &e.outcome, &e.detail, &e.via),
            (
                &given.caller,
                &given.target,
                &given.outcome,
                &given.detail,
                &given.via
            )
        );
        assert!(
            e.time_ms >= t0 - 1000,
            "the store's time: {} vs {t0}",
            e.time_ms
        );
    }
    // Pages: before a seq, newest first.
    let page = |before, limit| {
        let store = store.clone();
        async move {
            let events = store.list_audit(before, limit).await.expect("page");
            events.iter().map(|e| e.seq).collect::<Vec<_>>()
        }
    };
    assert_eq!(page(None, 2).await, [7, 6]);
    assert_eq!(page(Some(6), 2).await, [5, 4]);
    assert_eq!(page(Some(4), 10).await, [3]);
    assert_eq!(page(Some(3), 10).await, Vec::<u64>::new());
    // Seqs go on after the oldest are forgotten.
    store.append_audit(event(8), 5).await.expect("append");
    assert_eq!(page(None, 1).await, [8]);
    assert_eq!(store.list_audit(None, 100).await.expect("list").len(), 5);
}
