//! `NodeRegistry` and `Inboxes` checks: per-instance inboxes, round-robin counters, and the
//! node registry (register, refresh, expire, leased-run counts, removal only by the
//! stream that registered the node, and the leases of a node whose stream ended).

use super::*;

pub async fn inbox_order_and_blocking(store: Arc<dyn Store>) {
    for batch in [vec!["a", "b"], vec![], vec!["c"]] {
        let messages = batch.iter().map(|m| m.as_bytes().to_vec()).collect();
        store.push_inbox("inst-1", messages).await.expect("push");
    }
    store
        .push_inbox("inst-2", vec![b"other".to_vec()])
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
        .push_inbox("inst-2", vec![b"not for inst-1".to_vec()])
        .await
        .expect("push");
    store
        .push_inbox("inst-1", vec![b"wake".to_vec()])
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
    // A batch draws each job's next value, as single draws would, in the order asked.
    let drawn = store
        .next_route_counters(&["rr-a", "rr-c", "rr-b"])
        .await
        .expect("counters");
    assert_eq!(drawn, vec![22, 0, 1]);
    assert_eq!(next("rr-b").await, 2, "a batch's draws count");
    assert_eq!(
        store.next_route_counters(&[]).await.expect("none"),
        Vec::<u64>::new()
    );
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
        .register_node(node("lr-n", "g1", "i1"), Duration::from_secs(5))
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
            Finisher::Holder(Holder::of(&tokens[0])),
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
        store.register_node(n.clone(), ttl).await.expect("upsert");
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
        .register_node(refresh.clone(), ttl)
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
        .register_node(node("e1", "ge", "i1"), short)
        .await
        .expect("upsert");
    store
        .register_node(node("e2", "ge", "i1"), short)
        .await
        .expect("upsert");
    assert_eq!(node_ids(&store, Some("ge")).await, ["e1", "e2"]);
    store
        .register_node(node("e2", "ge", "i1"), Duration::from_secs(5))
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
    assert!(!removed(&store, &node("e1", "ge", "i1")).await);

    // A refresh with a shorter TTL shortens the expiry too.
    store
        .register_node(node("e2", "ge", "i1"), short)
        .await
        .expect("refresh");
    assert_eq!(node_ids(&store, Some("ge")).await, ["e2"]);
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(store.list_nodes(Some("ge")).await.expect("list"), vec![]);

    // An expired node registers again like a new one.
    store
        .register_node(node("e1", "ge", "i1"), ttl)
        .await
        .expect("upsert");
    assert_eq!(node_ids(&store, Some("ge")).await, ["e1"]);
}

/// Removes the node's registration as its stream's end does, without touching leases.
async fn removed(store: &Arc<dyn Store>, node: &NodeRecord) -> bool {
    let r = store.remove_node(node, None).await.expect("remove");
    assert_eq!(r.leases_shortened, 0, "no grace given, no lease touched");
    r.removed
}

pub async fn nodes_removed_only_by_their_instance(store: Arc<dyn Store>) {
    let ttl = Duration::from_secs(5);
    store
        .register_node(node("n1", "g1", "i1"), ttl)
        .await
        .expect("upsert");
    store
        .register_node(node("n2", "g1", "i1"), ttl)
        .await
        .expect("upsert");

    assert!(!removed(&store, &node("n1", "g1", "other-instance")).await);
    assert_eq!(node_ids(&store, None).await, ["n1", "n2"]);

    // The node reconnects to instance i2: the stale instance i1 must not remove it.
    store
        .register_node(node("n1", "g1", "i2"), ttl)
        .await
        .expect("re-register");
    assert!(!removed(&store, &node("n1", "g1", "i1")).await);
    let listed = store.list_nodes(None).await.expect("list");
    assert_eq!(listed.len(), 2);
    assert_eq!(
        (listed[0].node_id.as_str(), listed[0].instance.as_str()),
        ("n1", "i2")
    );

    // It reconnects to i2 again before i2 saw its first stream end: the end of the
    // first stream (its session) must not remove the second.
    let second = NodeRecord {
        session: "second stream".into(),
        ..node("n1", "g1", "i2")
    };
    store
        .register_node(second.clone(), ttl)
        .await
        .expect("again");
    assert!(!removed(&store, &node("n1", "g1", "i2")).await);
    assert_eq!(node_ids(&store, None).await, ["n1", "n2"]);

    assert!(removed(&store, &second).await);
    assert_eq!(node_ids(&store, None).await, ["n2"]);
    assert!(!removed(&store, &second).await, "removed again");
    assert!(!removed(&store, &node("never", "g1", "i1")).await);
    assert_eq!(node_ids(&store, Some("g1")).await, ["n2"]);
}

/// The stream of a node holding leases ends: its leases end within the grace (store
/// clock) instead of their TTL, other nodes' leases and leases ending sooner stay as
/// they are, and nothing changes when the node is registered by a newer stream.
pub async fn a_gone_nodes_leases_end_within_the_grace(store: Arc<dyn Store>) {
    store.create_job(job("gn", None)).await.expect("create");
    let ttl = Duration::from_secs(30);
    let mut leased = Vec::new();
    for (planned, n, terms) in [
        (1000, "gn-a", LONG),
        (2000, "gn-a", LONG),
        (3000, "gn-a", terms(200, 200)),
        (4000, "gn-b", LONG),
    ] {
        let r = begin(
            &store,
            planned_run("gn", planned, plan(OverlapPolicy::Allow)),
        )
        .await;
        leased.push(grant(&store, &r.run.schedule_id, 1, &slot(n, 0), terms).await);
    }
    // a's first run is confirmed (RUNNING), the second is still DISPATCHED.
    let started = store
        .mark_started(&leased[0].schedule_id, &Holder::of(&leased[0]))
        .await
        .expect("start");
    assert_eq!(started.applied, Applied::Yes);
    let a = node("gn-a", "g1", "i1");
    let b = node("gn-b", "g1", "i1");
    for n in [&a, &b] {
        store.register_node(n.clone(), ttl).await.expect("upsert");
    }

    // A newer stream of a holds the registration: the old stream's end changes nothing.
    let newer = NodeRecord {
        session: "newer".into(),
        ..a.clone()
    };
    store
        .register_node(newer.clone(), ttl)
        .await
        .expect("newer");
    let r = store
        .remove_node(&a, Some(Duration::from_millis(300)))
        .await
        .expect("remove");
    assert_eq!(r, NodeRemoved::default());
    for run in &leased {
        let now = get(&store, &run.schedule_id).await;
        assert_eq!(
            now.deadlines.lease_expires, run.deadlines.lease_expires,
            "{}: untouched",
            run.schedule_id
        );
    }

    let before = now(&store).await;
    let r = store
        .remove_node(&newer, Some(Duration::from_millis(300)))
        .await
        .expect("remove");
    let after = now(&store).await;
    assert_eq!(
        r,
        NodeRemoved {
            removed: true,
            leases_shortened: 2
        },
        "the two long leases of a; the one ending sooner is not lengthened"
    );
    assert_eq!(node_ids(&store, None).await, ["gn-b"]);
    for run in &leased[..2] {
        let now = get(&store, &run.schedule_id).await;
        assert_near(
            now.deadlines.lease_expires,
            before,
            after,
            300,
            &run.schedule_id,
        );
        assert_eq!(
            now.fencing_token, run.fencing_token,
            "same lease, sooner end"
        );
    }
    for run in &leased[2..] {
        let now = get(&store, &run.schedule_id).await;
        assert_eq!(now.deadlines.lease_expires, run.deadlines.lease_expires);
    }

    // When the grace is over the sweeper finds them due: the RUNNING one is lost, the
    // unconfirmed one is routed again; b's run is not due.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let p = partition_of("gn", store.partitions());
    let due = store.due_runs(p, 100).await.expect("due");
    for run in &leased[..3] {
        assert!(
            due.contains(&run.schedule_id),
            "{} due: {due:?}",
            run.schedule_id
        );
    }
    assert!(!due.contains(&leased[3].schedule_id));
    let t = store
        .expire_run(&leased[0].schedule_id, GRACE)
        .await
        .expect("expire");
    assert_eq!(revocation_of(&t).reason, "lost");
    let t = store
        .expire_run(&leased[1].schedule_id, GRACE)
        .await
        .expect("expire");
    assert_eq!(revocation_of(&t).reason, "unconfirmed");
}

/// A node id belongs to one group while it is registered: another group's hello is
/// refused (`OtherGroup`) and changes nothing, nor can that group refresh it; the same
/// group's hello (a reconnect: a new session, here on another instance) replaces the
/// registration, after which the old stream's refresh is `Superseded` and writes
/// nothing; once the registration expires, any group may take the id.
pub async fn node_ids_belong_to_one_group(store: Arc<dyn Store>) {
    let ttl = Duration::from_secs(30);
    let with_session = |group: &str, instance: &str, session: &str| {
        let mut n = node("n1", group, instance);
        n.session = session.into();
        n
    };
    let listed = |store: Arc<dyn Store>| async move {
        let nodes = store.list_nodes(None).await.expect("list");
        assert_eq!(nodes.len(), 1, "{nodes:?}");
        let n = &nodes[0];
        (n.group.clone(), n.instance.clone(), n.session.clone())
    };
    let first = with_session("ga", "inst-1", "s1");
    let thief = with_session("gb", "inst-2", "s9");
    let again = with_session("ga", "inst-2", "s2");
    let owned_by_ga = Registered::OtherGroup("ga".into());

    let r = store
        .register_node(first.clone(), ttl)
        .await
        .expect("register");
    assert_eq!(r, Registered::Yes);
    let r = store
        .register_node(thief.clone(), ttl)
        .await
        .expect("register");
    assert_eq!(r, owned_by_ga);
    let r = store
        .refresh_node(thief.clone(), ttl)
        .await
        .expect("refresh");
    assert_eq!(r, owned_by_ga);
    assert_eq!(
        listed(store.clone()).await,
        ("ga".into(), "inst-1".into(), "s1".into())
    );
    let r = store
        .refresh_node(first.clone(), ttl)
        .await
        .expect("refresh");
    assert_eq!(r, Registered::Yes);

    // The executor reconnects (same group, new stream): the old stream is superseded.
    let r = store
        .register_node(again.clone(), ttl)
        .await
        .expect("register");
    assert_eq!(r, Registered::Yes);
    let r = store
        .refresh_node(first.clone(), ttl)
        .await
        .expect("refresh");
    assert_eq!(r, Registered::Superseded);
    assert_eq!(
        listed(store.clone()).await,
        ("ga".into(), "inst-2".into(), "s2".into())
    );
    let r = store
        .refresh_node(again.clone(), ttl)
        .await
        .expect("refresh");
    assert_eq!(r, Registered::Yes);

    // Expired: the id is free for any group.
    let short = Duration::from_millis(200);
    let r = store.refresh_node(again, short).await.expect("refresh");
    assert_eq!(r, Registered::Yes);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let r = store.register_node(thief, ttl).await.expect("register");
    assert_eq!(r, Registered::Yes);
    assert_eq!(
        listed(store.clone()).await,
        ("gb".into(), "inst-2".into(), "s9".into())
    );
}
