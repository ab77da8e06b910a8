//! `TriggerQueue` checks: ack and reclaim, a blocking read woken by an append.

use super::*;

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

    // Together, one of them acknowledged before: the other is acknowledged.
    store
        .ack_triggers(&[a.entry_id.clone(), b.entry_id.clone()])
        .await
        .expect("ack a again and b");
    store.ack_trigger(&b.entry_id).await.expect("ack b again");
    let reclaimed = store
        .reclaim_triggers("c3", Duration::ZERO, 10)
        .await
        .expect("reclaim");
    assert_eq!(schedule_nos(&reclaimed), ["manual-c"]);
    store
        .ack_triggers(std::slice::from_ref(&c.entry_id))
        .await
        .expect("ack c");
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
