//! The redis backend's own tests: the conformance suite against a real Redis, and what
//! only this backend has.

use super::*;
use crate::testing::{
    shared_redis_cluster_url, shared_redis_sentinel_url, shared_redis_tls, shared_redis_url,
    unique_prefix,
};

tokio::task_local! {
    static AS_ONE_REDIS: bool;
}

/// Whether the store this task is opening runs as production does on one Redis (its
/// calls name their slot by their prefix alone: no keys declared, none checked).
pub(super) fn opening_as_one_redis() -> bool {
    AS_ONE_REDIS.try_with(|one| *one).unwrap_or(false)
}

/// A store on the shared Redis that runs as production does there.
async fn as_one_redis(name: &str, opts: StoreOptions) -> RedisStore {
    let url = shared_redis_url().expect("redis-server");
    AS_ONE_REDIS
        .scope(true, RedisStore::connect(&url, &unique_prefix(name), opts))
        .await
        .expect("connect")
}

crate::store::conformance::store_conformance_tests!(|opts| async move {
    let url = shared_redis_url().expect("redis-server");
    RedisStore::connect(&url, &unique_prefix("conf"), opts)
        .await
        .expect("connect")
});

/// The conformance suite on one Redis as production runs there: calls name their slot
/// by their prefix alone, and the scripts skip what only a cluster needs (the asking).
mod one_redis {
    use super::*;

    crate::store::conformance::store_conformance_tests!(|opts| async move {
        as_one_redis("one", opts).await
    });
}

/// The conformance suite against the primary three Sentinels watch, reached through
/// them (a failover is `sentinel_failover` in the tests crate).
mod sentinel {
    use super::*;
    use crate::store::conformance::options;
    use crate::testing::{RedisSentinel, TestPki};

    #[tokio::test]
    async fn a_job_change_on_one_instance_wakes_the_others() {
        job_change_wakes_another_instance(&shared_redis_sentinel_url().expect("sentinel")).await;
    }

    /// Sentinels and data nodes reached over mutual TLS only (`rediss+sentinel://`, the
    /// CA and a client certificate given), the primary asking for a password (given in
    /// the URL, for the master) and the Sentinels for another one of their own
    /// (`--redis-sentinel-password`). Without the Sentinels' password, or without the
    /// client certificate, the store does not connect.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn over_mutual_tls_with_passwords_the_store_runs() {
        let pki = TestPki::new().expect("CA");
        let set = RedisSentinel::start_secure(&pki, "s3cret", "watchers-s3cret")
            .expect("secure Sentinel set");
        let trusting = Target::parse(&set.url())
            .expect("url")
            .with_tls_ca(pki.ca_pem.clone().into_bytes());
        let certified = trusting.clone().with_client_cert(
            pki.client_cert_pem.clone().into_bytes(),
            pki.client_key_pem.clone().into_bytes(),
        );
        let refused = |target: Target| async move {
            RedisStore::connect_to(&target, &unique_prefix("sentls"), options())
                .await
                .err()
                .expect("connected without what the set asks for")
                .to_string()
        };
        let e = refused(certified.clone()).await;
        assert!(e.contains("NOAUTH"), "{e}");
        let e = refused(
            trusting
                .clone()
                .with_sentinel_auth(None, "watchers-s3cret".into()),
        )
        .await;
        assert!(e.contains("CertificateRequired"), "{e}");
        let target = certified.with_sentinel_auth(None, "watchers-s3cret".into());
        some_checks(|| async {
            RedisStore::connect_to(&target, &unique_prefix("sentls"), options())
                .await
                .expect("connect")
        })
        .await;
    }

    crate::store::conformance::store_conformance_tests!(|opts| async move {
        let url = shared_redis_sentinel_url().expect("redis sentinel");
        RedisStore::connect(&url, &unique_prefix("sentinel"), opts)
            .await
            .expect("connect")
    });
}

/// The conformance suite over TLS (`rediss://`, trusting a throwaway CA given as
/// `--redis-tls-ca` would), and what TLS refuses: a server signed by an authority not
/// trusted.
mod tls {
    use super::*;
    use crate::store::conformance::options;
    use crate::testing::{RedisCluster, RedisServer, TestPki};

    crate::store::conformance::store_conformance_tests!(|opts| async move {
        let (url, ca) = shared_redis_tls().expect("redis over TLS");
        let target = Target::parse(&url)
            .expect("url")
            .with_tls_ca(ca.into_bytes());
        RedisStore::connect_to(&target, &unique_prefix("tls"), opts)
            .await
            .expect("connect")
    });

    /// A server asking clients for a certificate (`tls-auth-clients yes`): the store
    /// presents the one it is given and runs; without one it does not connect.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_certificate_is_presented_when_the_server_asks() {
        let pki = TestPki::new().expect("CA");
        let redis = RedisServer::start_mutual_tls(&pki).expect("redis over mutual TLS");
        let trusting = Target::parse(&redis.tls_url().expect("TLS port"))
            .expect("url")
            .with_tls_ca(pki.ca_pem.clone().into_bytes());
        let refused = RedisStore::connect_to(&trusting, &unique_prefix("mtls"), options())
            .await
            .err()
            .expect("connected without a client certificate");
        let e = refused.to_string();
        assert!(e.contains("CertificateRequired"), "{e}");
        let target = trusting.with_client_cert(
            pki.client_cert_pem.clone().into_bytes(),
            pki.client_key_pem.clone().into_bytes(),
        );
        some_checks(|| async {
            RedisStore::connect_to(&target, &unique_prefix("mtls"), options())
                .await
                .expect("connect")
        })
        .await;
    }

    #[tokio::test]
    async fn a_server_signed_by_an_untrusted_authority_is_refused() {
        let (url, _) = shared_redis_tls().expect("redis over TLS");
        let other = TestPki::new().expect("another CA");
        for target in [
            // The system's authorities: the test CA is none of them.
            Target::parse(&url).expect("url"),
            Target::parse(&url)
                .expect("url")
                .with_tls_ca(other.ca_pem.clone().into_bytes()),
        ] {
            let refused = RedisStore::connect_to(&target, &unique_prefix("tls"), options())
                .await
                .err()
                .expect("connected to a server no trusted authority signed");
            let e = refused.to_string();
            assert!(
                e.contains("certificate") || e.contains("Certificate"),
                "{e}"
            );
        }
    }

    /// A cluster whose nodes serve TLS (and talk TLS among themselves): the seed list
    /// is of TLS ports, and the nodes the client learns of are reached by TLS too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cluster_over_tls_runs_the_store() {
        let pki = TestPki::new().expect("CA");
        let cluster = RedisCluster::start_tls(3, 0, &pki).expect("cluster over TLS");
        let target = Target::parse(&cluster.tls_url())
            .expect("url")
            .with_tls_ca(pki.ca_pem.clone().into_bytes());
        some_checks(|| async {
            RedisStore::connect_to(&target, &unique_prefix("tlscl"), options())
                .await
                .expect("connect")
        })
        .await;
    }
}

/// The conformance suite as an ACL user who may touch only its own prefix's keys and
/// channel (`redis://user:password@…`), so nothing of the store lies outside its prefix;
/// a wrong password is refused. (A cluster with such a user: `cluster::an_acl_user…`.)
mod credentials {
    use super::*;

    crate::store::conformance::store_conformance_tests!(|opts| async move {
        let url = shared_redis_url().expect("redis-server");
        let prefix = unique_prefix("acl");
        let credentials = acl_user(std::slice::from_ref(&url), &prefix).await;
        let url = url.replacen("://", &format!("://{credentials}"), 1);
        RedisStore::connect(&url, &prefix, opts)
            .await
            .expect("connect")
    });

    #[tokio::test]
    async fn a_wrong_password_is_refused() {
        let url = shared_redis_url().expect("redis-server");
        let prefix = unique_prefix("acl");
        let credentials = acl_user(std::slice::from_ref(&url), &prefix)
            .await
            .replace(":pw-", ":wrong-");
        let url = url.replacen("://", &format!("://{credentials}"), 1);
        let e = RedisStore::connect(&url, &prefix, StoreOptions::default())
            .await
            .err()
            .expect("a wrong password connected");
        assert!(e.to_string().contains("authentication failed"), "{e}");
    }
}

/// Makes, on each of the servers at `urls`, a user who may touch only `prefix`'s keys
/// and channel, and returns its credentials as a URL takes them (`user:password@`).
async fn acl_user(urls: &[String], prefix: &str) -> String {
    let user = format!("u-{prefix}");
    let password = format!("pw-{}", uuid::Uuid::now_v7().simple());
    for url in urls {
        let mut c = redis::Client::open(url.as_str())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(&user)
            .arg("on")
            .arg(format!(">{password}"))
            .arg("resetkeys")
            .arg(format!("~{prefix}:*"))
            .arg("resetchannels")
            .arg(format!("&{prefix}:*"))
            .arg("+@all")
            .query_async(&mut c)
            .await
            .expect("ACL SETUSER");
    }
    format!("{user}:{password}@")
}

/// A few checks that use every kind of connection the store has (the shared one, a
/// blocking one, the change subscription) against stores `make` opens.
async fn some_checks<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = RedisStore>,
{
    use crate::store::conformance as c;
    let store =
        || async { std::sync::Arc::new(make().await) as std::sync::Arc<dyn crate::store::Store> };
    c::job_crud(store().await).await;
    c::trigger_read_blocks_until_append(store().await).await;
    c::begin_and_assign_in_one_decision(store().await).await;
    c::inbox_order_and_blocking(store().await).await;
    c::finish_run_outcomes(store().await).await;
}

/// The conformance suite against a Redis Cluster of three masters with a replica each,
/// and what only a cluster has: a node's count kept beside the run scripts.
mod cluster {
    use super::*;
    use crate::model::OverlapPolicy;
    use crate::store::RunStore;
    use crate::store::conformance::{job, options, outcome, plan, planned_run, slot};

    crate::store::conformance::store_conformance_tests!(|opts| async move {
        let url = shared_redis_cluster_url().expect("redis cluster");
        RedisStore::connect(&url, &unique_prefix("cluster"), opts)
            .await
            .expect("connect")
    });

    #[tokio::test]
    async fn a_job_change_on_one_instance_wakes_the_others() {
        job_change_wakes_another_instance(&shared_redis_cluster_url().expect("cluster")).await;
    }

    /// An ACL user made on every node who may touch only its prefix's keys and
    /// channel: the cluster client authenticates to each node it learns of.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_acl_user_limited_to_its_prefix_runs_the_store() {
        let url = shared_redis_cluster_url().expect("redis cluster");
        let hosts = url.trim_start_matches("redis+cluster://");
        let nodes: Vec<String> = hosts.split(',').map(|h| format!("redis://{h}")).collect();
        some_checks(|| async {
            let prefix = unique_prefix("aclcl");
            let credentials = acl_user(&nodes, &prefix).await;
            let url = format!("redis+cluster://{credentials}{hosts}");
            RedisStore::connect(&url, &prefix, options())
                .await
                .expect("connect")
        })
        .await;
    }

    /// Two partitions' slots moved to another master, key by key, with the store's
    /// instances stopped and started again after: every record moves with its slot.
    /// (While runs go on: `slots_moved_while_runs_go_on_keep_every_record`.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slots_moved_to_another_master_keep_every_record() {
        use crate::testing::{RedisCluster, key_slot};
        let cluster = RedisCluster::start(3, 0).expect("cluster");
        let prefix = unique_prefix("reshard");
        let store = RedisStore::connect(&cluster.url(), &prefix, options())
            .await
            .expect("connect");
        let node = slot("n1", 100_000);
        let mut runs = Vec::new();
        for i in 0..40 {
            runs.push(life_of_a_run(&store, &format!("before-{i}"), &node).await);
        }
        drop(store);
        let (cluster, moved) = tokio::task::spawn_blocking(move || {
            let moved: Vec<_> = [0u16, 1]
                .iter()
                .map(|p| {
                    cluster
                        .move_slot(key_slot(p.to_string().as_bytes()), 5, Duration::ZERO)
                        .expect("move slot")
                })
                .collect();
            (cluster, moved)
        })
        .await
        .expect("mover");
        assert!(moved.iter().all(|(from, to)| from != to), "{moved:?}");
        let store = RedisStore::connect(&cluster.url(), &prefix, options())
            .await
            .expect("connect");
        for i in 0..40 {
            runs.push(life_of_a_run(&store, &format!("after-{i}"), &node).await);
        }
        let mut missing = Vec::new();
        for (job_id, sid) in &runs {
            let job = store.get_job(job_id).await.expect("get job");
            let run = store.get_run(sid).await.expect("get run");
            if job.is_none() || run.is_none_or(|r| r.state != RunState::Succeeded) {
                missing.push(job_id.clone());
            }
        }
        assert!(missing.is_empty(), "jobs or runs lost or torn: {missing:?}");
        store
            .check_indexes()
            .await
            .expect("indexes match the records");
        drop(cluster);
    }

    /// Two partitions' slots moved to another master, key by key, while runs go on in
    /// every partition (jobs with a serial queue, at their count bound, so runs are
    /// released from queues and evicted from indexes while the keys move). Every
    /// script declares every key it touches, so while a slot is half moved Redis
    /// answers its calls `TRYAGAIN` (some of their keys moved or missing) or `ASK`,
    /// which the cluster client retries or follows, and never runs one against keys
    /// that are not all there: no record is lost or torn, no run is started twice,
    /// none is left held or queued, and the other partitions go on meanwhile. Fires
    /// queued on every job meanwhile are all read back from the trigger streams.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slots_moved_while_runs_go_on_keep_every_record() {
        use crate::testing::{RedisCluster, key_slot};
        use std::sync::atomic::{AtomicBool, Ordering};
        let cluster = RedisCluster::start(3, 0).expect("cluster");
        let opts = StoreOptions {
            max_runs_per_job: 3,
            ..options()
        };
        let partitions = opts.partitions;
        let store = Arc::new(
            RedisStore::connect(&cluster.url(), &unique_prefix("reshard-live"), opts)
                .await
                .expect("connect"),
        );
        // Three jobs per partition; partitions 0 and 1 move.
        let mut jobs = Vec::new();
        for p in 0..partitions {
            for id in crate::store::conformance::ids_in_partition(partitions, p, "live", 3) {
                store.create_job(job(&id, None)).await.expect("create");
                jobs.push((p, id));
            }
        }
        let moving = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        // One worker per partition, so a partition waiting for its slot holds no other.
        let workers: Vec<_> = (0..partitions)
            .map(|p| {
                let store = store.clone();
                let jobs: Vec<String> = jobs
                    .iter()
                    .filter(|(q, _)| *q == p)
                    .map(|(_, id)| id.clone())
                    .collect();
                let (moving, stop) = (moving.clone(), stop.clone());
                tokio::spawn(async move {
                    let node = slot("n1", 100_000);
                    // Runs finished while the slots moved, rounds over the jobs.
                    let (mut during, mut round) = (0usize, 0i64);
                    while !stop.load(Ordering::SeqCst) {
                        for id in &jobs {
                            let sids = two_serial_runs(&store, id, round, &node).await;
                            if moving.load(Ordering::SeqCst) {
                                during += sids.len();
                            }
                        }
                        round += 1;
                    }
                    (during, round)
                })
            })
            .collect();
        // Fires through the trigger streams meanwhile: one per job a round, read back by
        // one consumer (the partitions' blocking readers) and acknowledged.
        let fires = {
            let (store, jobs, stop) = (store.clone(), jobs.clone(), stop.clone());
            tokio::spawn(async move {
                let mut sent = std::collections::BTreeSet::new();
                let mut read = std::collections::BTreeSet::new();
                let mut n = 0;
                loop {
                    let stopping = stop.load(Ordering::SeqCst);
                    if !stopping {
                        for (_, id) in &jobs {
                            let t = crate::store::conformance::manual_trigger(
                                id,
                                &format!("fire-{n}"),
                                0,
                            );
                            let q = retried(|| store.enqueue_manual(t.clone(), None)).await;
                            sent.insert(q.schedule_id);
                        }
                        n += 1;
                    }
                    let got =
                        retried(|| store.read_triggers("c", 100, Duration::from_millis(50))).await;
                    let ids: Vec<String> = got.iter().map(|d| d.entry_id.clone()).collect();
                    read.extend(got.into_iter().map(|d| d.trigger.schedule_id()));
                    retried(|| store.ack_triggers(&ids)).await;
                    if stopping && (read.len() >= sent.len() || ids.is_empty()) {
                        return (sent, read);
                    }
                }
            })
        };
        // Some rounds before the move, so every job is at its bound while it moves.
        tokio::time::sleep(Duration::from_secs(2)).await;
        moving.store(true, Ordering::SeqCst);
        let (cluster, moved) = tokio::task::spawn_blocking(move || {
            let moved: Vec<_> = [0u16, 1]
                .iter()
                .map(|p| {
                    cluster
                        .move_slot(
                            key_slot(p.to_string().as_bytes()),
                            1,
                            Duration::from_millis(20),
                        )
                        .expect("move slot")
                })
                .collect();
            (cluster, moved)
        })
        .await
        .expect("mover");
        moving.store(false, Ordering::SeqCst);
        assert!(moved.iter().all(|(from, to)| from != to), "{moved:?}");
        // A few rounds after, on the slots' new masters.
        tokio::time::sleep(Duration::from_secs(1)).await;
        stop.store(true, Ordering::SeqCst);
        let mut during = Vec::new();
        let mut rounds = Vec::new();
        for w in workers {
            let (d, r) = w.await.expect("worker");
            during.push(d);
            rounds.push(r);
        }
        println!(
            "moved {moved:?}; rounds per partition {rounds:?}; runs finished per partition while the slots moved: {during:?}"
        );
        assert!(
            during[2] + during[3] > 0,
            "the partitions that stayed went on while the others moved: {during:?}"
        );
        let (sent, read) = fires.await.expect("fires");
        let lost: Vec<_> = sent.difference(&read).collect();
        assert!(lost.is_empty(), "fires queued but never read: {lost:?}");
        println!("{} fires queued and read", sent.len());
        let mut c = store.conn().await.expect("conn");
        for (p, id) in &jobs {
            assert!(store.get_job(id).await.expect("get").is_some(), "{id} lost");
            let runs = first_runs(&store, id).await;
            assert_eq!(runs.len(), 3, "{id}: its bound of runs kept: {runs:?}");
            for run in &runs {
                assert_eq!(run.state, RunState::Succeeded, "{id}: {run:?}");
            }
            for key in [format!("active:{id}"), format!("serial:{id}")] {
                let n: usize = redis::cmd("EXISTS")
                    .arg(store.key(*p, &key))
                    .query_async(&mut c)
                    .await
                    .expect("exists");
                assert_eq!(n, 0, "{id}: {key} left behind");
            }
        }
        for p in 0..partitions {
            let timers: usize = redis::cmd("ZCARD")
                .arg(store.key(p, "timers"))
                .query_async(&mut c)
                .await
                .expect("zcard");
            assert_eq!(timers, 0, "partition {p}: a run left with a deadline");
        }
        drop(cluster);
    }

    /// Two runs of a serial job in round `round`: the second queued behind the first,
    /// released by its finish, then run in turn; every step retried while the store
    /// answers an error (a slot moving). Each is started once and succeeds.
    async fn two_serial_runs(
        store: &RedisStore,
        job_id: &str,
        round: i64,
        node: &NodeSlot,
    ) -> Vec<String> {
        let mut sids = Vec::new();
        for k in 0..2 {
            let run = planned_run(
                job_id,
                crate::model::now_ms() + round * 2 + k,
                plan(OverlapPolicy::Serial),
            );
            let begun = retried(|| store.begin_run(run.clone(), Duration::ZERO)).await;
            sids.push(begun.run.schedule_id);
        }
        for sid in &sids {
            let run = match retried(|| store.assign_run(sid, 1, node, TERMS)).await {
                Assigned::Granted(run) => run,
                // A grant whose answer was lost, asked again.
                Assigned::NotWaiting(Some(run)) if run.node_id == node.node_id => run,
                other => panic!("{sid}: not granted: {other:?}"),
            };
            let holder = Holder::of(&run);
            let started = retried(|| store.mark_started(sid, &holder)).await;
            assert!(
                matches!(started.applied, Applied::Yes | Applied::Already),
                "{sid}: start {started:?}"
            );
            let t = retried(|| {
                store.finish_run(
                    sid,
                    Finisher::Holder(holder.clone()),
                    outcome(RunState::Succeeded),
                )
            })
            .await;
            assert!(
                matches!(t.applied, Applied::Yes | Applied::Already),
                "{sid}: finish {t:?}"
            );
        }
        sids
    }

    /// `call` until it answers without an error (at most 10 s).
    async fn retried<T, F: std::future::Future<Output = Result<T>>>(call: impl Fn() -> F) -> T {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match call().await {
                Ok(v) => return v,
                Err(e) if std::time::Instant::now() < deadline => {
                    println!("retrying after: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("still failing after 10 s: {e}"),
            }
        }
    }

    /// A job and one run of it from begin to a successful finish: (job id, schedule id).
    async fn life_of_a_run(store: &RedisStore, job_id: &str, node: &NodeSlot) -> (String, String) {
        let sid = waiting_run(store, job_id).await;
        let Assigned::Granted(run) = store
            .assign_run(&sid, 1, node, TERMS)
            .await
            .expect("assign")
        else {
            panic!("{job_id}: not granted");
        };
        let holder = Holder::of(&run);
        store.mark_started(&sid, &holder).await.expect("start");
        let t = store
            .finish_run(&sid, Finisher::Holder(holder), outcome(RunState::Succeeded))
            .await
            .expect("finish");
        assert_eq!(t.applied, Applied::Yes, "{job_id}");
        (job_id.to_owned(), sid)
    }

    async fn cluster_store() -> RedisStore {
        let url = shared_redis_cluster_url().expect("redis cluster");
        RedisStore::connect(&url, &unique_prefix("cluster"), StoreOptions::default())
            .await
            .expect("connect")
    }

    async fn waiting_run(store: &RedisStore, job_id: &str) -> String {
        store.create_job(job(job_id, None)).await.expect("create");
        let run = planned_run(job_id, 1000, plan(OverlapPolicy::Allow));
        let begun = store
            .begin_run(run, Duration::from_secs(30))
            .await
            .expect("begin");
        begun.run.schedule_id
    }

    const TERMS: LeaseTerms = LeaseTerms {
        ttl: Duration::from_secs(30),
        confirm_within: Duration::from_secs(30),
    };

    #[tokio::test]
    async fn a_reservation_left_between_two_steps_lapses() {
        let store = cluster_store().await;
        assert!(store.inner.shared.is_cluster());
        let node = slot("n1", 1);
        // What an instance that died after reserving and before leasing leaves behind.
        let reserved = store
            .reserve_slot(&node, "gone@1", Duration::from_millis(300))
            .await
            .expect("reserve");
        assert_eq!(reserved, node_slots::Reserved::Ok);
        let sid = waiting_run(&store, "job-a").await;
        let full = store
            .assign_run(&sid, 1, &node, TERMS)
            .await
            .expect("assign");
        assert_eq!(full, Assigned::NodeFull, "the node's window is reserved");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let granted = store
            .assign_run(&sid, 1, &node, TERMS)
            .await
            .expect("assign");
        assert!(matches!(granted, Assigned::Granted(_)), "{granted:?}");
    }

    #[tokio::test]
    async fn a_failed_lease_gives_its_reservation_back_and_a_result_its_slot() {
        let store = cluster_store().await;
        let node = slot("n1", 1);
        let first = waiting_run(&store, "job-b").await;
        // Not waiting at attempt 2: refused, and the reservation made for it is gone.
        let refused = store
            .assign_run(&first, 2, &node, TERMS)
            .await
            .expect("assign");
        assert!(matches!(refused, Assigned::NotWaiting(_)), "{refused:?}");
        let Assigned::Granted(run) = store
            .assign_run(&first, 1, &node, TERMS)
            .await
            .expect("assign")
        else {
            panic!("the node's one slot is free again");
        };
        // The same run again, as a late second instance would: its reservation is
        // 'taken', the run not waiting, and the lease stays counted.
        let again = store
            .assign_run(&first, 1, &node, TERMS)
            .await
            .expect("assign");
        assert!(matches!(again, Assigned::NotWaiting(Some(_))), "{again:?}");
        let second = waiting_run(&store, "job-c").await;
        assert_eq!(
            store
                .assign_run(&second, 1, &node, TERMS)
                .await
                .expect("assign"),
            Assigned::NodeFull
        );
        let t = store
            .finish_run(
                &first,
                Finisher::Holder(Holder::of(&run)),
                outcome(RunState::Succeeded),
            )
            .await
            .expect("finish");
        assert_eq!(t.applied, Applied::Yes);
        let granted = store
            .assign_run(&second, 1, &node, TERMS)
            .await
            .expect("assign");
        assert!(matches!(granted, Assigned::Granted(_)), "{granted:?}");
    }
}

#[tokio::test]
async fn newer_schema_is_refused_and_partitions_stick() {
    let url = shared_redis_url().expect("redis-server");
    let prefix = unique_prefix("schema");
    let opts = StoreOptions {
        partitions: 3,
        ..StoreOptions::default()
    };
    let first = RedisStore::connect(&url, &prefix, opts.clone())
        .await
        .expect("connect");
    assert_eq!(first.partitions(), 3);
    // A second instance configured differently adopts the store's partition count.
    let other = StoreOptions {
        partitions: 8,
        ..opts.clone()
    };
    let second = RedisStore::connect(&url, &prefix, other)
        .await
        .expect("connect");
    assert_eq!(second.partitions(), 3);
    let mut c = raw_connection().await;
    // An older schema is raised to this build's.
    let _: () = c
        .hset(format!("{prefix}:meta"), "schema", SCHEMA_VERSION - 1)
        .await
        .expect("hset");
    RedisStore::connect(&url, &prefix, opts.clone())
        .await
        .expect("connect to an older schema");
    let raised: u32 = c
        .hget(format!("{prefix}:meta"), "schema")
        .await
        .expect("hget");
    assert_eq!(raised, SCHEMA_VERSION);
    let _: () = c
        .hset(format!("{prefix}:meta"), "schema", SCHEMA_VERSION + 1)
        .await
        .expect("hset");
    match RedisStore::connect(&url, &prefix, opts).await {
        Err(Error::SchemaTooNew { found, supported }) => {
            assert_eq!((found, supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a newer schema must be refused"),
    }
}

#[tokio::test]
async fn functions_reload_after_function_flush() {
    let url = shared_redis_url().expect("redis-server");
    let store = RedisStore::connect(&url, &unique_prefix("noscript"), StoreOptions::default())
        .await
        .expect("connect");
    store
        .due_fires(0, 10)
        .await
        .expect("the library was loaded by connect");
    let mut c = raw_connection().await;
    // What a Redis restart without persistence does to the functions: the next FCALL
    // finds none.
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut c)
        .await
        .expect("flush");
    store
        .due_fires(0, 10)
        .await
        .expect("the library loaded again");
    store
        .due_fires(0, 10)
        .await
        .expect("and still there for the next call");
}

async fn store(name: &str, opts: StoreOptions) -> (RedisStore, String) {
    let url = shared_redis_url().expect("redis-server");
    let prefix = unique_prefix(name);
    let store = RedisStore::connect(&url, &prefix, opts)
        .await
        .expect("connect");
    (store, prefix)
}

/// The first page (10) of a job's runs, newest first.
async fn first_runs(store: &RedisStore, job_id: &str) -> Vec<RunRecord> {
    let query = RunQuery {
        from: None,
        to: None,
        limit: 10,
        cursor: None,
    };
    store.list_runs(job_id, query).await.expect("list").items
}

/// A plain connection to the shared test Redis, for looking behind the store.
async fn raw_connection() -> redis::aio::MultiplexedConnection {
    let url = shared_redis_url().expect("redis-server");
    redis::Client::open(url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("conn")
}

fn one_partition() -> StoreOptions {
    StoreOptions {
        partitions: 1,
        ..StoreOptions::default()
    }
}

async fn queue_len(prefix: &str) -> usize {
    let mut c = raw_connection().await;
    c.xlen(format!("{prefix}:{{0}}:triggers"))
        .await
        .expect("xlen")
}

#[tokio::test]
async fn trimming_by_age_never_drops_pending_or_undelivered_triggers() {
    use crate::store::conformance::{job, manual_trigger};
    let (store, prefix) = store("trim", one_partition()).await;
    store.create_job(job("t", None)).await.expect("create");
    for i in 0..3 {
        store
            .enqueue_manual(manual_trigger("t", &format!("manual-{i}"), 0), None)
            .await
            .expect("enqueue");
    }
    // Deliver all three, ack the first and the last: the middle one stays pending.
    let got = store
        .read_triggers("c1", 10, Duration::from_millis(10))
        .await
        .expect("read");
    assert_eq!(got.len(), 3);
    store.ack_trigger(&got[0].entry_id).await.expect("ack");
    store.ack_trigger(&got[2].entry_id).await.expect("ack");
    // One more, never delivered.
    store
        .enqueue_manual(manual_trigger("t", "manual-3", 0), None)
        .await
        .expect("enqueue");
    let future = store.now().await.expect("now") + 60_000;
    store.trim_triggers(future).await.expect("trim");
    // Only the acked entry older than the oldest pending one can go.
    assert_eq!(queue_len(&prefix).await, 3);
    let again = store
        .reclaim_triggers("c2", Duration::ZERO, 10)
        .await
        .expect("reclaim");
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].trigger.schedule_no, "manual-1");
    store.ack_trigger(&again[0].entry_id).await.expect("ack");
    store.trim_triggers(future).await.expect("trim");
    assert_eq!(queue_len(&prefix).await, 1, "the undelivered entry stays");
    let last = store
        .read_triggers("c1", 10, Duration::from_millis(10))
        .await
        .expect("read");
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].trigger.schedule_no, "manual-3");
    // An age cutoff in the past trims nothing that is younger.
    store.ack_trigger(&last[0].entry_id).await.expect("ack");
    store.trim_triggers(0).await.expect("trim");
    assert_eq!(queue_len(&prefix).await, 1);
    // Consumers that hold nothing and were last seen before the cutoff go.
    let consumers = |prefix: String| async move {
        let mut c = raw_connection().await;
        let v: Vec<redis::Value> = redis::cmd("XINFO")
            .arg("CONSUMERS")
            .arg(format!("{prefix}:{{0}}:triggers"))
            .arg(GROUP)
            .query_async(&mut c)
            .await
            .expect("xinfo");
        v.len()
    };
    // The earlier future-cutoff trims forgot c1 and c2 once they held nothing; c1's
    // last read re-created it.
    assert_eq!(consumers(prefix.clone()).await, 1);
    store.trim_triggers(0).await.expect("trim");
    assert_eq!(consumers(prefix.clone()).await, 1, "recently seen: kept");
    store.trim_triggers(future).await.expect("trim");
    assert_eq!(
        consumers(prefix.clone()).await,
        0,
        "idle and empty: forgotten"
    );
}

#[tokio::test]
async fn a_job_change_on_one_instance_wakes_the_others() {
    job_change_wakes_another_instance(&shared_redis_url().expect("redis-server")).await;
}

/// Two stores on `url` under one prefix: a job created through one wakes the other's
/// change watch (the change subscription; in a cluster it is on a seed node, and the
/// `PUBLISH` reaches it over the cluster bus; under Sentinel, on the master).
async fn job_change_wakes_another_instance(url: &str) {
    use crate::store::conformance::job;
    let prefix = unique_prefix("notify");
    let a = RedisStore::connect(url, &prefix, one_partition())
        .await
        .expect("connect");
    let b = RedisStore::connect(url, &prefix, one_partition())
        .await
        .expect("connect");
    let mut changes = b.job_changes();
    // The subscription itself bumps once when it is established.
    tokio::time::timeout(Duration::from_secs(5), changes.changed())
        .await
        .expect("subscribed")
        .expect("watch");
    changes.borrow_and_update();
    a.create_job(job("n", None)).await.expect("create");
    tokio::time::timeout(Duration::from_secs(5), changes.changed())
        .await
        .expect("instance b is told about a's new job")
        .expect("watch");
}

#[tokio::test]
async fn a_partition_lease_keeps_a_second_instance_off_a_busy_partition() {
    use crate::store::conformance::{arm, job};
    let lease = StoreOptions {
        partition_lease: Duration::from_millis(300),
        instance_id: "a".into(),
        ..one_partition()
    };
    let (a, prefix) = store("lease", lease.clone()).await;
    let url = shared_redis_url().expect("redis-server");
    let b = RedisStore::connect(
        &url,
        &prefix,
        StoreOptions {
            instance_id: "b".into(),
            ..lease
        },
    )
    .await
    .expect("connect");
    let now = a.now().await.expect("now");
    a.create_job(job("l", Some(arm(now - 10))))
        .await
        .expect("create");
    assert_eq!(a.due_fires(0, 10).await.expect("due").fires.len(), 1);
    let blocked = b.due_fires(0, 10).await.expect("due");
    assert!(blocked.fires.is_empty(), "b must leave a's partition alone");
    let retry = blocked.next_due.expect("when to look again");
    assert!(retry > blocked.now && retry <= blocked.now + 300);
    // Once a stops reading, the lease runs out and b takes the partition over.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(b.due_fires(0, 10).await.expect("due").fires.len(), 1);
}

#[tokio::test]
async fn a_dead_instances_triggers_are_taken_over_at_once() {
    use crate::store::conformance::{job, manual_trigger};
    // Two partitions, so a takeover spans them.
    let (store, _) = store(
        "takeover",
        StoreOptions {
            partitions: 2,
            ..StoreOptions::default()
        },
    )
    .await;
    let long = Duration::from_secs(60);
    assert_eq!(
        store.beat_instance("live", long).await.expect("beat"),
        Vec::<String>::new()
    );
    // Executors attached to each; one of doomed's moved to live before the takeover.
    use crate::store::conformance::node;
    for (n, inst) in [
        ("n-live", "live"),
        ("n-doomed", "doomed"),
        ("n-moved", "doomed"),
    ] {
        store
            .register_node(node(n, "g", inst), long)
            .await
            .expect("register");
    }
    store
        .register_node(node("n-moved", "g", "live"), long)
        .await
        .expect("reconnect");
    assert_eq!(
        store
            .beat_instance("doomed", Duration::from_millis(200))
            .await
            .expect("beat"),
        Vec::<String>::new()
    );
    let mut jobs = Vec::new();
    for p in 0..2 {
        jobs.extend(crate::store::conformance::ids_in_partition(2, p, "to", 1));
    }
    for id in &jobs {
        store.create_job(job(id, None)).await.expect("create");
        for n in 0..2 {
            store
                .enqueue_manual(manual_trigger(id, &format!("manual-{n}"), 0), None)
                .await
                .expect("enqueue");
        }
    }
    // `doomed` reads them all and dies having acknowledged one; `live` reads one of its
    // own, which is not taken from it.
    let read = store
        .read_triggers("doomed", 10, Duration::from_millis(10))
        .await
        .expect("read");
    assert_eq!(read.len(), 4);
    store.ack_trigger(&read[0].entry_id).await.expect("ack");
    store
        .enqueue_manual(manual_trigger(&jobs[0], "manual-9", 0), None)
        .await
        .expect("enqueue");
    let own = store
        .read_triggers("live", 10, Duration::from_millis(10))
        .await
        .expect("read");
    assert_eq!(own.len(), 1);
    // Alive: nothing to take.
    assert_eq!(
        store.beat_instance("live", long).await.expect("beat"),
        Vec::<String>::new()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        store.beat_instance("live", long).await.expect("beat"),
        ["doomed"]
    );
    // Taken in two steps of at most one; the instance is forgotten after the last.
    let first = store
        .take_over_triggers("doomed", "live", 1)
        .await
        .expect("take over");
    assert_eq!(first.len(), 1);
    assert_eq!(
        store.beat_instance("live", long).await.expect("beat"),
        ["doomed"]
    );
    let second = store
        .take_over_triggers("doomed", "live", 10)
        .await
        .expect("take over");
    let mut taken: Vec<_> = first
        .iter()
        .chain(&second)
        .map(|d| d.entry_id.clone())
        .collect();
    taken.sort();
    let mut expected: Vec<_> = read[1..].iter().map(|d| d.entry_id.clone()).collect();
    expected.sort();
    assert_eq!(taken, expected, "exactly the unacknowledged ones");
    let nodes: Vec<_> = store
        .list_nodes(None)
        .await
        .expect("list")
        .into_iter()
        .map(|n| n.node_id)
        .collect();
    assert_eq!(
        nodes,
        ["n-live", "n-moved"],
        "the dead instance's node is gone with it"
    );
    assert_eq!(
        store.beat_instance("live", long).await.expect("beat"),
        Vec::<String>::new()
    );
    // They are `live`'s now: an idle reclaim by a third consumer finds them still
    // pending (not lost), and acking them ends them.
    for d in first.iter().chain(&second).chain(&own) {
        store.ack_trigger(&d.entry_id).await.expect("ack");
    }
    assert!(
        store
            .reclaim_triggers("third", Duration::ZERO, 10)
            .await
            .expect("reclaim")
            .is_empty()
    );

    // An instance that was only stalled and beats again is not forgotten.
    store
        .beat_instance("stalled", Duration::from_millis(100))
        .await
        .expect("beat");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        store.beat_instance("live", long).await.expect("beat"),
        ["stalled"]
    );
    store.beat_instance("stalled", long).await.expect("beat");
    assert!(
        store
            .take_over_triggers("stalled", "live", 10)
            .await
            .expect("take over")
            .is_empty()
    );
    assert_eq!(
        store.beat_instance("live", long).await.expect("beat"),
        Vec::<String>::new()
    );
    store
        .beat_instance("stalled", Duration::from_millis(1))
        .await
        .expect("beat");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        store.beat_instance("live", long).await.expect("beat"),
        ["stalled"],
        "still known: it beat after the takeover"
    );
}

/// Run records are MessagePack; one written as JSON (before they were) is still read,
/// moves through the run machine, and is written back as MessagePack.
#[tokio::test]
async fn a_run_record_written_as_json_is_read_and_rewritten() {
    use crate::model::OverlapPolicy;
    use crate::store::conformance::{job, plan, planned_run, slot, terms};
    let (store, _) = store("json-run", one_partition()).await;
    store.create_job(job("legacy", None)).await.expect("create");
    let run = planned_run("legacy", 1000, plan(OverlapPolicy::Allow));
    let begun = store
        .begin_run(run, Duration::from_secs(30))
        .await
        .expect("begin");
    let key = store.key(0, &format!("run:{}", begun.run.schedule_id));
    let mut c = raw_connection().await;
    let stored: Vec<u8> = c.get(&key).await.expect("get");
    assert_ne!(stored.first(), Some(&b'{'), "written as MessagePack");
    let json = serde_json::to_string(&begun.run).expect("json");
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(&json)
        .arg("KEEPTTL")
        .query_async(&mut c)
        .await
        .expect("set");
    assert_eq!(
        store.get_run(&begun.run.schedule_id).await.expect("read"),
        Some(begun.run.clone())
    );
    let Assigned::Granted(leased) = store
        .assign_run(
            &begun.run.schedule_id,
            begun.run.attempt,
            &slot("n", 0),
            terms(30_000, 30_000),
        )
        .await
        .expect("assign")
    else {
        panic!("the JSON record was not assigned");
    };
    assert_eq!(leased.state, RunState::Dispatched);
    let stored: Vec<u8> = c.get(&key).await.expect("get");
    assert_ne!(stored.first(), Some(&b'{'), "rewritten as MessagePack");
    assert_eq!(
        store.get_run(&begun.run.schedule_id).await.expect("read"),
        Some(leased)
    );
}

/// The scripts write a run record in parts (schema 4): its fields (a map with neither
/// plan nor history), its plan, then its history's events. A record of one map (as
/// schema 3 wrote it, and as the server hands one to `begin_run`) is read as it is,
/// moves through the run machine and is written back in parts; a plan at every default
/// (an empty map) stays one.
#[tokio::test]
async fn a_run_record_of_one_map_is_read_and_written_back_in_parts() {
    use crate::model::{OverlapPolicy, RunPlan};
    use crate::store::conformance::{job, plan, planned_run, slot, terms};
    let (store, _) = store("parts", one_partition()).await;
    store.create_job(job("parted", None)).await.expect("create");
    let mut c = raw_connection().await;
    let given = RunPlan {
        callback_url: Some("http://127.0.0.1:9/hook".to_owned()),
        max_attempts: 3,
        ..plan(OverlapPolicy::Allow)
    };
    for (at, given) in [(1000, given), (2000, RunPlan::default())] {
        let begun = store
            .begin_run(
                planned_run("parted", at, given.clone()),
                Duration::from_secs(30),
            )
            .await
            .expect("begin")
            .run;
        let sid = begun.schedule_id.clone();
        let key = store.key(0, &format!("run:{sid}"));
        let stored: Vec<u8> = c.get(&key).await.expect("get");
        let fields: serde_json::Value = rmp_serde::from_slice(&stored).expect("fields");
        assert!(
            fields.get("plan").is_none() && fields.get("history").is_none(),
            "{fields}"
        );
        assert!(
            fields["pl"].as_u64().expect("the plan's length") > 0,
            "{fields}"
        );
        assert_eq!(fields["hn"], 1, "{fields}");
        assert_eq!(begun.plan, given);
        assert_eq!(
            store.get_run(&sid).await.expect("read"),
            Some(begun.clone())
        );

        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(encode_run(&begun).expect("one map"))
            .arg("KEEPTTL")
            .query_async(&mut c)
            .await
            .expect("set");
        assert_eq!(
            store.get_run(&sid).await.expect("read"),
            Some(begun.clone())
        );
        let Assigned::Granted(leased) = store
            .assign_run(&sid, begun.attempt, &slot("n", 0), terms(30_000, 30_000))
            .await
            .expect("assign")
        else {
            panic!("the record of one map was not assigned");
        };
        assert_eq!(leased.plan, given);
        let steps: Vec<&str> = leased.history.iter().map(|e| e.what.as_str()).collect();
        assert_eq!(steps, ["WAITING", "DISPATCHED"]);
        let stored: Vec<u8> = c.get(&key).await.expect("get");
        let fields: serde_json::Value = rmp_serde::from_slice(&stored).expect("fields");
        assert_eq!(fields["hn"], 2, "written back in parts: {fields}");
        assert_eq!(store.get_run(&sid).await.expect("read"), Some(leased));
    }
}

/// A job's index and active set live twice the retention, their TTL written by the
/// begin that creates the index and then by one a quarter of the retention after the
/// last that wrote it (the job's `kept`), not by every begin; a node's busy set gets
/// its TTL when created and again at each heartbeat of its node, not at every lease.
/// A run of an allow plan stays out of the active set: its job is marked `plain`.
#[tokio::test]
async fn ttls_are_written_when_due_not_at_every_begin() {
    use crate::model::OverlapPolicy;
    use crate::store::conformance::{job, node, plan, planned_run, slot, terms};
    let retention = Duration::from_secs(40);
    let (store, _) = store(
        "kept",
        StoreOptions {
            run_retention: retention,
            ..one_partition()
        },
    )
    .await;
    let mut c = raw_connection().await;
    let reader = c.clone();
    let busy = format!("{}busy:n", store.nodes_prefix());
    let pttl = |key: String| {
        let mut c = reader.clone();
        async move {
            let ms: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut c)
                .await
                .expect("pttl");
            ms
        }
    };
    let base = crate::model::now_ms();
    let begin = |id: &'static str, policy: OverlapPolicy, i: i64| {
        let store = store.clone();
        async move {
            let run = store
                .begin_run(
                    planned_run(id, base + i, plan(policy)),
                    Duration::from_secs(30),
                )
                .await
                .expect("begin")
                .run;
            let granted = store
                .assign_run(
                    &run.schedule_id,
                    run.attempt,
                    &slot("n", 10),
                    terms(30_000, 30_000),
                )
                .await
                .expect("assign");
            assert!(matches!(granted, Assigned::Granted(_)), "{granted:?}");
        }
    };
    let twice = 2 * retention.as_millis() as i64;
    // Each begin of a replace plan cancels the run before it: one run going at a time.
    for (id, policy) in [
        ("kept", OverlapPolicy::Allow),
        ("kept-r", OverlapPolicy::Replace),
    ] {
        store.create_job(job(id, None)).await.expect("create");
        let index = store.key(0, &format!("runs:{id}"));
        let active = store.key(0, &format!("active:{id}"));
        let mut kept = vec![index.clone()];
        begin(id, policy, 0).await;
        if policy == OverlapPolicy::Allow {
            let members: i64 = c.scard(&active).await.expect("scard");
            let plain: Option<String> = c
                .hget(store.key(0, &format!("job:{id}")), "plain")
                .await
                .expect("hget");
            assert_eq!(
                (members, plain.as_deref()),
                (0, Some("1")),
                "an allow run stays out of the active set; its job is marked"
            );
            assert!(
                pttl(busy.clone()).await > 86_000_000,
                "a new busy set gets its TTL"
            );
        } else {
            kept.push(active.clone());
        }
        for key in &kept {
            assert!(
                pttl(key.clone()).await > twice - 5_000,
                "{key}: the first begin writes it"
            );
        }
        kept.push(busy.clone());
        for key in &kept {
            let _: bool = c.pexpire(key, 50_000).await.expect("pexpire");
        }
        begin(id, policy, 1).await;
        for key in &kept {
            assert!(
                pttl(key.clone()).await <= 50_000,
                "{key}: not written again"
            );
        }
        kept.pop();

        let quarter_ago = crate::model::now_ms() - retention.as_millis() as i64 / 4 - 1_000;
        let _: () = c
            .hset(store.key(0, &format!("job:{id}")), "kept", quarter_ago)
            .await
            .expect("hset");
        begin(id, policy, 2).await;
        for key in &kept {
            assert!(
                pttl(key.clone()).await > twice - 5_000,
                "{key}: written a quarter later"
            );
        }
        assert!(pttl(busy.clone()).await <= 50_000);
    }
    store
        .refresh_node(node("n", "g", "i"), Duration::from_secs(30))
        .await
        .expect("refresh");
    assert!(
        pttl(busy).await > 86_000_000,
        "the node's heartbeat keeps its busy set"
    );
}

/// A run of an allow plan stays out of its job's active set, and its record says so
/// (`np`); a forbid begin that takes it in (found going in the index) clears that, so
/// when it succeeds the common way it leaves the set, and the next forbid begin starts.
#[tokio::test]
async fn a_run_taken_into_the_active_set_leaves_it_at_its_end() {
    use crate::model::OverlapPolicy;
    use crate::store::conformance::{job, outcome, plan, planned_run, slot, terms};
    let (store, _) = store("taken-in", one_partition()).await;
    store.create_job(job("ti", None)).await.expect("create");
    let mut c = raw_connection().await;
    let active = store.key(0, "active:ti");
    let grace = Duration::from_secs(30);
    let base = crate::model::now_ms();
    let begin = |planned: i64, policy: OverlapPolicy| {
        let store = store.clone();
        async move {
            store
                .begin_run(planned_run("ti", base + planned, plan(policy)), grace)
                .await
                .expect("begin")
                .run
        }
    };
    let a = begin(0, OverlapPolicy::Allow).await;
    let granted = store
        .assign_run(&a.schedule_id, 1, &slot("n", 0), terms(30_000, 30_000))
        .await
        .expect("assign");
    let Assigned::Granted(held) = granted else {
        panic!("{granted:?}")
    };
    let members: Vec<String> = c.smembers(&active).await.expect("smembers");
    assert!(members.is_empty(), "an allow run stays out: {members:?}");
    let record = store.key(0, &format!("run:{}", a.schedule_id));
    let looker = c.clone();
    let not_in = || {
        let mut c = looker.clone();
        let record = record.clone();
        async move {
            let bytes: Vec<u8> = c.get(&record).await.expect("get");
            // The record's first part, its fields.
            let mut de = rmp_serde::Deserializer::new(bytes.as_slice());
            let fields: std::collections::HashMap<String, serde::de::IgnoredAny> =
                Deserialize::deserialize(&mut de).expect("fields");
            fields.contains_key("np")
        }
    };
    assert!(not_in().await, "its record says it is not in the set");

    let skipped = begin(1, OverlapPolicy::Forbid).await;
    assert_eq!(skipped.reason, "overlap");
    let members: Vec<String> = c.smembers(&active).await.expect("smembers");
    assert_eq!(members, std::slice::from_ref(&a.schedule_id), "taken in");
    let ttl: i64 = c.pttl(&active).await.expect("pttl");
    assert!(ttl > 0, "a set that took a run in has a TTL: {ttl}");
    assert!(!not_in().await, "taken in, its record no longer says so");

    let t = store
        .finish_run(
            &a.schedule_id,
            Finisher::Holder(Holder::of(&held)),
            outcome(RunState::Succeeded),
        )
        .await
        .expect("finish");
    assert_eq!(t.applied, Applied::Yes);
    let members: Vec<String> = c.smembers(&active).await.expect("smembers");
    assert!(members.is_empty(), "left at its end: {members:?}");

    let next = begin(2, OverlapPolicy::Forbid).await;
    assert_eq!((next.state, next.reason.as_str()), (RunState::Waiting, ""));
    let members: Vec<String> = c.smembers(&active).await.expect("smembers");
    assert_eq!(members, std::slice::from_ref(&next.schedule_id));
}

/// On one Redis a begin looks at its job's oldest index entry only when the new entry
/// makes the count a multiple of 8 (or reaches the bound): the entries whose records
/// expired stay until then, and are dropped then (at most 8 a time).
#[tokio::test]
async fn on_one_redis_a_begin_looks_at_the_oldest_entry_one_time_in_eight() {
    use crate::model::OverlapPolicy;
    use crate::store::conformance::{job, plan, planned_run};
    let store = as_one_redis("eighth", one_partition()).await;
    store.create_job(job("eighth", None)).await.expect("create");
    let begin = |at: i64| {
        let store = store.clone();
        async move {
            store
                .begin_run(
                    planned_run("eighth", at, plan(OverlapPolicy::Allow)),
                    Duration::from_secs(30),
                )
                .await
                .expect("begin")
                .run
                .schedule_id
        }
    };
    let mut c = raw_connection().await;
    // Five runs scheduled long ago, whose records then expire (deleted here).
    let mut old = Vec::new();
    for i in 0..5 {
        old.push(begin(1_000 + i).await);
    }
    for sid in old {
        let _: () = c
            .del(store.key(0, &format!("run:{sid}")))
            .await
            .expect("del");
    }
    let index = store.key(0, "runs:eighth");
    let base = crate::model::now_ms();
    let counts = {
        let mut counts = Vec::new();
        for i in 0..3 {
            begin(base + i).await;
            let card: usize = c.zcard(&index).await.expect("zcard");
            counts.push(card);
        }
        counts
    };
    assert_eq!(
        counts,
        [6, 7, 3],
        "the third begin (8 entries) dropped the five"
    );
    assert_eq!(first_runs(&store, "eighth").await.len(), 3);
}

/// A poll of due runs says when the partition's next timer falls due, and the calls
/// that may set a sooner timer move the activity counter while the polls do not: what
/// lets an idle sweeper sleep (`store::Pacer`).
#[tokio::test]
async fn polls_say_when_the_next_timer_falls_due() {
    use crate::model::OverlapPolicy;
    use crate::store::conformance::{job, plan, planned_run, slot, terms};
    let (store, _) = store("poll-next", one_partition()).await;
    let mut activity = store.activity().expect("redis has an activity counter");
    assert_eq!(
        store.poll_due_runs(0, 10).await.expect("poll"),
        DueEntries::default(),
        "no timer at all"
    );
    store.create_job(job("paced", None)).await.expect("create");
    let run = planned_run("paced", 1000, plan(OverlapPolicy::Allow));
    let begun = store
        .begin_run(run, Duration::from_secs(30))
        .await
        .expect("begin");
    assert!(activity.has_changed().expect("sender"), "begin moved it");
    activity.borrow_and_update();
    let polled = store.poll_due_runs(0, 10).await.expect("poll");
    assert!(polled.ids.is_empty());
    let next = polled.next_in.expect("the wait for a node is timed");
    assert!(
        next > Duration::from_secs(29) && next <= Duration::from_secs(30),
        "{next:?}"
    );
    store
        .assign_run(
            &begun.run.schedule_id,
            begun.run.attempt,
            &slot("n", 0),
            terms(60_000, 10_000),
        )
        .await
        .expect("assign");
    assert!(activity.has_changed().expect("sender"), "assign moved it");
    activity.borrow_and_update();
    let next = store
        .poll_due_runs(0, 10)
        .await
        .expect("poll")
        .next_in
        .expect("the confirmation is timed");
    assert!(
        next > Duration::from_secs(9) && next <= Duration::from_secs(10),
        "the sooner deadline: {next:?}"
    );
    store.due_deliveries(0, 10).await.expect("poll");
    assert!(
        !activity.has_changed().expect("sender"),
        "polls leave the counter alone"
    );
    assert_eq!(
        store.poll_due_deliveries(0, 10).await.expect("poll"),
        DueEntries::default()
    );
}

/// A `Started` that only moves a run's earliest deadline later (confirm_by cleared, the
/// lease's end next) leaves its timer at the earlier time: the sweep then finds nothing
/// due and re-scores it at the lease's end, where a lease nobody renewed is found lost.
#[tokio::test]
async fn a_started_run_keeps_its_earlier_timer_until_the_sweep_rescores_it() {
    use crate::model::OverlapPolicy;
    use crate::store::conformance::{job, plan, planned_run, slot, terms};
    let (store, _) = store("start-timer", one_partition()).await;
    let mut c = raw_connection().await;
    store.create_job(job("timed", None)).await.expect("create");
    let run = planned_run("timed", 1000, plan(OverlapPolicy::Allow));
    let sid = store
        .begin_run(run, Duration::from_secs(30))
        .await
        .expect("begin")
        .run
        .schedule_id;
    let Assigned::Granted(leased) = store
        .assign_run(&sid, 1, &slot("n", 0), terms(1_500, 300))
        .await
        .expect("assign")
    else {
        panic!("not granted");
    };
    let timer = |c: &mut redis::aio::MultiplexedConnection| {
        let key = store.key(0, "timers");
        let sid = sid.clone();
        let mut c = c.clone();
        async move {
            let score: Option<i64> = c.zscore(key, sid).await.expect("zscore");
            score
        }
    };
    let confirm_by = leased.deadlines.confirm_by;
    assert_eq!(timer(&mut c).await, Some(confirm_by));
    let holder = Holder::of(&leased);
    let started = store.mark_started(&sid, &holder).await.expect("start");
    assert_eq!(started.applied, Applied::Yes);
    let lease_end = leased.deadlines.lease_expires;
    assert!(lease_end > confirm_by);
    assert_eq!(timer(&mut c).await, Some(confirm_by), "left where it was");

    // Due at confirm_by: nothing is, and the timer moves to the lease's end.
    let due = async {
        loop {
            let polled = store.poll_due_runs(0, 10).await.expect("poll");
            if !polled.ids.is_empty() {
                return polled.ids;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let ids = tokio::time::timeout(Duration::from_secs(5), due)
        .await
        .expect("the timer came due");
    assert_eq!(ids, std::slice::from_ref(&sid));
    let t = store
        .expire_run(&sid, Duration::from_secs(30))
        .await
        .expect("sweep");
    assert_eq!(t.applied, Applied::No("nothing due".to_owned()));
    let run = t.run.expect("the run");
    assert_eq!(run.state, RunState::Running);
    assert_eq!(timer(&mut c).await, Some(lease_end), "re-scored");

    // Nobody renewed the lease: at its end the run is lost.
    let due = async {
        while store
            .poll_due_runs(0, 10)
            .await
            .expect("poll")
            .ids
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), due)
        .await
        .expect("the lease's end came due");
    let t = store
        .expire_run(&sid, Duration::from_secs(30))
        .await
        .expect("sweep");
    assert_eq!(t.applied, Applied::Yes);
    let run = t.run.expect("the run");
    assert_eq!((run.state, run.reason.as_str()), (RunState::Failed, "lost"));
    assert_eq!(timer(&mut c).await, None, "a final run has no timer");
}

/// A stored job record (MessagePack) leaves out what is at its default and its id, and
/// gets them back when read;
/// a job that sets everything keeps everything; a record written whole (before records
/// were compact) is still read.
#[test]
fn job_records_are_stored_without_their_defaults() {
    use crate::model::{MisfirePolicy, OverlapPolicy, RetryPolicy, RouteStrategy, Target};
    use crate::store::conformance::{arm, job};
    let mut plain = job("plain", Some(arm(5_000)));
    plain.version = 3;
    plain.created_at = 1_000;
    plain.updated_at = 2_000;
    plain.spec.name.clear();
    plain.spec.app_id.clear();
    plain.spec.payload.clear();
    plain.spec.misfire_catch_up_limit = 0;
    let stored = encode_job(&plain).expect("encode");
    assert!(stored.len() < 160, "{} bytes: {stored:?}", stored.len());
    let text = String::from_utf8_lossy(&stored);
    for left_out in ["version", "next_fire", "labels", "retry", "name", "plain"] {
        assert!(!text.contains(left_out), "{left_out} in {text}");
    }
    let read = decode_job("plain", Some(stored), Some(3), Some((5_000, 0)))
        .expect("decode")
        .expect("a job");
    assert_eq!(read, plain);

    let mut full = plain.clone();
    full.paused = true;
    full.next_fire = None;
    let s = &mut full.spec;
    s.name = "n".into();
    s.start_time = Some(1);
    s.end_time = Some(2);
    s.jitter_ms = 3;
    s.target = Target::Http {
        url: "https://example.com/x".into(),
        method: "POST".into(),
    };
    s.route_strategy = RouteStrategy::ConsistentHash;
    s.route_key = "k".into();
    s.retry = RetryPolicy {
        max_retries: 1,
        backoff_ms: 0,
        backoff_multiplier: 0.0,
        max_backoff_ms: 0,
    };
    s.misfire_policy = MisfirePolicy::CatchUp;
    s.misfire_catch_up_limit = 4;
    s.overlap_policy = OverlapPolicy::Serial;
    s.callback_url = Some("https://example.com/cb".into());
    s.callback_max_in_flight = 5;
    s.app_id = "app".into();
    s.payload = vec![0, 1];
    s.labels.insert("team".into(), "a".into());
    let stored = encode_job(&full).expect("encode");
    let read = decode_job("plain", Some(stored), Some(3), None)
        .expect("decode")
        .expect("a job");
    assert_eq!(read, full);

    let mut whole = serde_json::to_value(&plain).expect("json");
    whole["next_fire"] = serde_json::Value::Null;
    let read = decode_job(
        "plain",
        Some(whole.to_string().into_bytes()),
        Some(3),
        Some((5_000, 0)),
    )
    .expect("decode")
    .expect("a job");
    assert_eq!(read, plain);
}

/// A store of one partition, as itself and as a `Store`, and a run of job "hooked"
/// (with a callback URL) that succeeded: its webhook is due.
async fn a_hooked_run_succeeded(
    name: &str,
) -> (RedisStore, Arc<dyn crate::store::Store>, RunRecord) {
    use crate::store::conformance::{job, succeeded_with_webhook};
    let (redis, _) = store(name, one_partition()).await;
    let store: Arc<dyn crate::store::Store> = Arc::new(redis.clone());
    store.create_job(job("hooked", None)).await.expect("create");
    let g = succeeded_with_webhook(&store, "hooked", 1000).await;
    (redis, store, g)
}

/// A webhook's outbox entry is a hash whose body a claim and an outcome never rewrite;
/// one written before as a JSON document (`outbox:<sid>`) is moved into the hash when
/// first claimed, and delivered as any other.
#[tokio::test]
async fn an_outbox_entry_written_as_json_is_claimed_and_delivered() {
    use crate::model::CallbackState;
    let (redis, store, g) = a_hooked_run_succeeded("json-outbox").await;
    let sid = g.schedule_id.clone();
    let hash = redis.key(0, &format!("delivery:{sid}"));
    let mut c = raw_connection().await;
    let fields: std::collections::HashMap<String, String> =
        c.hgetall(&hash).await.expect("hgetall");
    assert_eq!(
        fields.get("token").map(String::as_str),
        Some("0"),
        "{fields:?}"
    );
    let body = fields.get("body").cloned().expect("body");
    // As the build before this one wrote it.
    let legacy = serde_json::json!({
        "job_id": "hooked",
        "url": fields["url"],
        "body": body,
        "created_at": fields["created_at"].parse::<i64>().expect("created_at"),
        "attempts": 0,
        "token": "0",
        "in_flight": false,
        "due": fields["due"].parse::<i64>().expect("due"),
    });
    let _: () = c.del(&hash).await.expect("del");
    let legacy_key = redis.key(0, &format!("outbox:{sid}"));
    let _: () = c.set(&legacy_key, legacy.to_string()).await.expect("set");

    let d = store
        .claim_delivery(&sid, Duration::from_secs(60))
        .await
        .expect("claim")
        .expect("the JSON entry is due");
    assert_eq!(
        (d.job_id.as_str(), d.attempts, d.body.as_str()),
        ("hooked", 0, body.as_str())
    );
    let moved: bool = c.exists(&legacy_key).await.expect("exists");
    assert!(!moved, "the JSON entry was moved into the hash");
    assert!(
        store
            .claim_delivery(&sid, Duration::from_secs(60))
            .await
            .expect("claim")
            .is_none(),
        "in flight: not due again"
    );
    assert_eq!(
        store
            .finish_delivery(&sid, d.token, DeliveryOutcome::Delivered { status: 200 })
            .await
            .expect("finish delivery"),
        Applied::Yes
    );
    let exists: bool = c.exists(&hash).await.expect("exists");
    assert!(!exists, "delivered: the entry is gone");
    let run = store.get_run(&sid).await.expect("get").expect("run");
    assert_eq!(
        (
            run.callback_state,
            run.callback_attempts,
            run.callback_status
        ),
        (CallbackState::Done, 1, 200)
    );
}

/// A webhook's outcomes are kept on its outbox entry, not written into the run's record
/// (final, it never changes again): the record as stored still says PENDING with the
/// history it had, while get_run and list_runs read the outcomes over it; once the
/// webhook is done the entry keeps only them (no url or body), as long as the record,
/// and is no delivery any more.
#[tokio::test]
async fn a_webhooks_outcomes_are_kept_on_its_entry_not_in_the_run_record() {
    use crate::model::CallbackState;
    let (redis, store, g) = a_hooked_run_succeeded("kept-outcomes").await;
    let sid = g.schedule_id.clone();
    let mut c = raw_connection().await;
    let run_key = redis.key(0, &format!("run:{sid}"));
    let stored: Vec<u8> = c.get(&run_key).await.expect("get");
    let final_run = store.get_run(&sid).await.expect("get").expect("run");
    assert_eq!(final_run.callback_state, CallbackState::Pending);

    let claim = |store: Arc<dyn crate::store::Store>, sid: String| async move {
        store
            .claim_delivery(&sid, Duration::from_secs(60))
            .await
            .expect("claim")
            .expect("due")
    };
    let d = claim(store.clone(), sid.clone()).await;
    let retry = DeliveryOutcome::Retry {
        after: Duration::from_millis(0),
        status: 500,
        error: "http_500".to_owned(),
    };
    assert_eq!(
        store
            .finish_delivery(&sid, d.token, retry)
            .await
            .expect("retry"),
        Applied::Yes
    );
    let run = store.get_run(&sid).await.expect("get").expect("run");
    assert_eq!(
        (
            run.callback_state,
            run.callback_attempts,
            run.callback_status,
            run.callback_error.as_str()
        ),
        (CallbackState::Pending, 1, 500, "http_500")
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let d = claim(store.clone(), sid.clone()).await;
    let delivered = DeliveryOutcome::Delivered { status: 200 };
    assert_eq!(
        store
            .finish_delivery(&sid, d.token, delivered.clone())
            .await
            .expect("deliver"),
        Applied::Yes
    );

    let after: Vec<u8> = c.get(&run_key).await.expect("get");
    assert_eq!(after, stored, "the run's record was not rewritten");
    let run = store.get_run(&sid).await.expect("get").expect("run");
    assert_eq!(
        (
            run.callback_state,
            run.callback_attempts,
            run.callback_status,
            run.callback_error.as_str()
        ),
        (CallbackState::Done, 2, 200, "")
    );
    assert_eq!(
        crate::store::conformance::history_rows(&run.history[final_run.history.len()..]),
        [
            ("WEBHOOK", 1, g.node_id.as_str(), "HTTP 500: http_500"),
            ("WEBHOOK", 1, g.node_id.as_str(), "HTTP 200"),
        ]
    );
    assert_eq!(run.history[..final_run.history.len()], final_run.history);
    assert_eq!(
        first_runs(&redis, "hooked").await,
        std::slice::from_ref(&run)
    );

    let entry = redis.key(0, &format!("delivery:{sid}"));
    let fields: std::collections::HashMap<String, Vec<u8>> =
        c.hgetall(&entry).await.expect("hgetall");
    assert_eq!(fields.get("done").map(Vec::as_slice), Some(&b"DONE"[..]));
    assert!(
        !fields.contains_key("url") && !fields.contains_key("body"),
        "{:?}",
        fields.keys()
    );
    // When each expires (not PTTL: two PTTLs are read a moment apart, and a millisecond
    // boundary between them made the later one look shorter).
    let (entry_at, run_at): (i64, i64) = redis::pipe()
        .cmd("PEXPIRETIME")
        .arg(&entry)
        .cmd("PEXPIRETIME")
        .arg(&run_key)
        .query_async(&mut c)
        .await
        .expect("pexpiretime");
    assert!(
        entry_at > 0 && entry_at <= run_at,
        "the entry expires at {entry_at} ms, the record at {run_at} ms"
    );
    assert_eq!(
        store
            .finish_delivery(&sid, d.token, delivered)
            .await
            .expect("again"),
        Applied::No("unknown delivery".to_owned())
    );
    assert!(
        store
            .claim_delivery(&sid, Duration::from_secs(60))
            .await
            .expect("claim")
            .is_none(),
        "done: nothing to claim"
    );
}

/// A run that falls out of its job's index at the count bound takes its webhook's
/// entry along once the webhook is done (the entry then only keeps its outcomes); an
/// entry still to deliver stays.
#[tokio::test]
async fn a_run_dropped_at_the_bound_takes_its_done_webhook_entry_along() {
    use crate::store::conformance::{job, succeeded_with_webhook};
    let opts = StoreOptions {
        max_runs_per_job: 2,
        ..one_partition()
    };
    let (redis, _) = store("bound-delivery", opts).await;
    let store: Arc<dyn crate::store::Store> = Arc::new(redis.clone());
    store.create_job(job("hooked", None)).await.expect("create");
    let mut c = raw_connection().await;
    let mut sids = Vec::new();
    for at in [1000, 2000, 3000, 4000] {
        sids.push(
            succeeded_with_webhook(&store, "hooked", at)
                .await
                .schedule_id,
        );
        if at == 1000 {
            let d = store
                .claim_delivery(&sids[0], Duration::from_secs(60))
                .await
                .expect("claim")
                .expect("due");
            let delivered = DeliveryOutcome::Delivered { status: 200 };
            store
                .finish_delivery(&sids[0], d.token, delivered)
                .await
                .expect("deliver");
        }
    }
    let entry = |sid: &str| redis.key(0, &format!("delivery:{sid}"));
    let gone: bool = c
        .exists(redis.key(0, &format!("run:{}", sids[0])))
        .await
        .expect("exists");
    assert!(!gone, "the first run fell out of the index");
    let kept: bool = c.exists(entry(&sids[0])).await.expect("exists");
    assert!(!kept, "its done entry went with it");
    let pending: bool = c.exists(entry(&sids[1])).await.expect("exists");
    assert!(pending, "the second run's webhook is still to deliver");
    assert!(
        store
            .claim_delivery(&sids[1], Duration::from_secs(60))
            .await
            .expect("claim")
            .is_some(),
        "and is delivered as its entry says"
    );
}

/// `record_run` keeps the job's index bounded as a begin does: a leased run with logs
/// that falls out at the bound takes its record, logs, timer and node slot along (it
/// had a count-bound drop of its own that deleted the record alone).
#[tokio::test]
async fn a_run_recorded_past_the_bound_drops_the_oldest_as_a_begin_does() {
    use crate::model::OverlapPolicy;
    use crate::store::conformance::{job, plan, planned_run, slot, terms};
    let opts = StoreOptions {
        max_runs_per_job: 2,
        ..one_partition()
    };
    let (redis, _) = store("record-bound", opts).await;
    let store: Arc<dyn crate::store::Store> = Arc::new(redis.clone());
    store.create_job(job("rb", None)).await.expect("create");
    let first = planned_run("rb", 1000, plan(OverlapPolicy::Allow));
    let sid = first.schedule_id.clone();
    let (_, assigned) = store
        .begin_and_assign(
            first,
            Duration::from_secs(30),
            &slot("rb-n", 5),
            terms(60_000, 60_000),
        )
        .await
        .expect("begin and assign");
    let Some(Assigned::Granted(leased)) = assigned else {
        panic!("expected a grant: {assigned:?}");
    };
    let holder = Holder {
        node_id: "rb-n".into(),
        token: leased.fencing_token,
    };
    let line = LogLine {
        seq: 0,
        time_ms: 1_000,
        level: "info".to_owned(),
        message: "hello".to_owned(),
        attempt: 1,
    };
    assert_eq!(
        store
            .append_logs(&sid, &holder, vec![line], 1000)
            .await
            .expect("append"),
        Applied::Yes
    );
    let c = raw_connection().await;
    let keys = [
        redis.key(0, &format!("run:{sid}")),
        redis.key(0, &format!("logs:{sid}")),
        redis.key(0, &format!("logmeta:{sid}")),
    ];
    let busy = format!("{}busy:rb-n", redis.nodes_prefix());
    let timers = redis.key(0, "timers");
    let left = |c: redis::aio::MultiplexedConnection| {
        what_is_left(c, keys.clone(), busy.clone(), timers.clone(), sid.clone())
    };
    assert_eq!(
        left(c.clone()).await,
        [true; 5],
        "record, logs, slot, timer"
    );

    for at in [2000, 3000] {
        let recorded = store
            .record_run(crate::store::conformance::run("rb", at, 0))
            .await
            .expect("record");
        assert!(recorded.created);
    }
    assert_eq!(store.get_run(&sid).await.expect("get"), None);
    assert_eq!(left(c).await, [false; 5], "all gone with the run");
}

/// Whether each of `keys` exists, then whether `sid` is in the node's `busy` set and
/// in the `timers`.
async fn what_is_left(
    mut c: redis::aio::MultiplexedConnection,
    keys: [String; 3],
    busy: String,
    timers: String,
    sid: String,
) -> Vec<bool> {
    let mut found = Vec::new();
    for k in &keys {
        found.push(c.exists::<_, bool>(k).await.expect("exists"));
    }
    found.push(c.sismember(&busy, &sid).await.expect("sismember"));
    let score: Option<f64> = c.zscore(&timers, &sid).await.expect("zscore");
    found.push(score.is_some());
    found
}

/// An instance whose beat found no other alive keeps its round-robin counters in
/// memory (no `rr` hash written); from the first beat that finds another, the shared
/// counters count again.
#[tokio::test]
async fn round_robin_counters_are_kept_in_memory_while_alone() {
    let (store, _) = store("rr-alone", one_partition()).await;
    let mut c = raw_connection().await;
    let rr = store.key(0, "rr");
    let long = Duration::from_secs(60);
    let counted = |store: RedisStore, job: &'static str| async move {
        store.next_route_counter(job).await.expect("counter")
    };
    assert_eq!(counted(store.clone(), "j").await, 0, "shared before a beat");
    assert_eq!(c.hget::<_, _, i64>(&rr, "j").await.expect("hget"), 1);

    assert_eq!(
        store.beat_instance("me", long).await.expect("beat"),
        Vec::<String>::new()
    );
    let alone: Vec<u64> =
        futures::future::join_all((0..3).map(|_| counted(store.clone(), "k"))).await;
    assert_eq!(
        alone
            .iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        (0..3).collect()
    );
    assert_eq!(
        store.next_route_counters(&["k", "m"]).await.expect("batch"),
        vec![3, 0],
        "a batch drawn alone goes on from the memory's counters"
    );
    for job in ["k", "m"] {
        let exists: bool = c.hexists(&rr, job).await.expect("hexists");
        assert!(!exists, "alone: nothing written for {job}");
    }

    // Another instance beats: the next beat of this one shares the counters again.
    store.beat_instance("other", long).await.expect("beat");
    store.beat_instance("me", long).await.expect("beat");
    assert_eq!(
        counted(store.clone(), "j").await,
        1,
        "the shared counter goes on"
    );
    assert_eq!(counted(store.clone(), "k").await, 0);
    assert_eq!(c.hget::<_, _, i64>(&rr, "k").await.expect("hget"), 1);
    assert_eq!(
        store.next_route_counters(&["j", "k"]).await.expect("batch"),
        vec![2, 1],
        "a batch drawn shared goes on from the shared counters"
    );
    assert_eq!(c.hget::<_, _, i64>(&rr, "k").await.expect("hget"), 2);
}

/// Every name in `QUIET` names a function: a misspelt one would leave the function it
/// meant bumping the activity counter, waking the idle pollers, unnoticed.
#[test]
fn every_quiet_function_exists() {
    for name in QUIET {
        assert!(
            SCRIPT_NAMES.contains(name),
            "{name} is not a script of lua/"
        );
    }
}

/// Every name in `DERIVES_KEYS` names a function (a misspelt one would leave the
/// function it meant checked, and the tests failing for a reason the list hides).
#[test]
fn every_function_deriving_keys_exists() {
    for name in DERIVES_KEYS {
        assert!(
            SCRIPT_NAMES.contains(name),
            "{name} is not a script of lua/"
        );
    }
}

/// The key check has teeth: a checked function called without one of the keys it
/// touches (here `admit_delivery` without its waiting marks' key) is refused, loudly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "undeclared key")]
async fn a_checked_function_touching_an_undeclared_key_fails() {
    assert!(!DERIVES_KEYS.contains(&"admit_delivery"));
    let url = shared_redis_url().expect("redis-server");
    let store = RedisStore::connect(&url, &unique_prefix("keys"), StoreOptions::default())
        .await
        .expect("connect");
    let b = store.breakers_prefix();
    let dest = "http://undeclared.example:80";
    let mut c = store.conn().await.expect("conn");
    // Its two other keys declared: asking for a slot reads the waiting marks.
    let _: redis::RedisResult<(String, String)> = store
        .inner
        .scripts
        .admit_delivery
        .key(format!("{b}breaker:{dest}"))
        .key(format!("{b}pace:{dest}"))
        .arg(&b)
        .arg(dest)
        .arg("a#1")
        .arg(1)
        .arg(30_000)
        .arg(5_000)
        .arg(2_000)
        .invoke_async(&mut c)
        .await;
}

/// A store opened while no instance is alive (every one was down) gives each held run
/// whose lease lapsed meanwhile a lease ending the grace from now (`grace_leases`, its
/// keys declared and checked); a run not held is left as it was.
#[tokio::test]
async fn a_store_opened_alone_gives_lapsed_leases_a_grace() {
    use crate::store::conformance::{job, run, slot, terms};
    let (store, prefix) = store("grace", one_partition()).await;
    store.create_job(job("held", None)).await.expect("create");
    store.create_job(job("waits", None)).await.expect("create");
    let held = run("held", 1_000, 1_000);
    let waits = run("waits", 1_000, 1_000);
    for r in [&held, &waits] {
        store
            .begin_run(r.clone(), Duration::ZERO)
            .await
            .expect("begin");
    }
    let granted = store
        .assign_run(&held.schedule_id, 1, &slot("n", 0), terms(50, 50))
        .await
        .expect("assign");
    assert!(matches!(granted, Assigned::Granted(_)), "{granted:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waiting_before = store.get_run(&waits.schedule_id).await.expect("get");
    let url = shared_redis_url().expect("redis-server");
    let opened = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let reopened = RedisStore::connect(
        &url,
        &prefix,
        StoreOptions {
            partitions: 1,
            reopen_lease_grace: Duration::from_secs(30),
            ..StoreOptions::default()
        },
    )
    .await
    .expect("reopen");
    let lease = reopened
        .get_run(&held.schedule_id)
        .await
        .expect("get")
        .expect("held run")
        .deadlines
        .lease_expires;
    assert!(
        lease >= opened + 29_000,
        "the lapsed lease ends at {lease}, opened at {opened}"
    );
    assert_eq!(
        reopened.get_run(&waits.schedule_id).await.expect("get"),
        waiting_before
    );
}

/// A job at its count bound drops its oldest run at every begin: each begin names the
/// entries the next one will drop (the index hint), so the next declares their keys
/// and needs no second call; a store that has no hint yet asks once.
#[tokio::test]
async fn a_job_at_its_bound_begins_in_one_call() {
    use crate::model::OverlapPolicy;
    use crate::store::conformance::{job, plan, planned_run};
    let opts = StoreOptions {
        partitions: 1,
        max_runs_per_job: 3,
        ..StoreOptions::default()
    };
    let (store, prefix) = store("hint", opts.clone()).await;
    store
        .create_job(job("bounded", None))
        .await
        .expect("create");
    let base = crate::model::now_ms();
    let begin = |store: &RedisStore, i: i64| {
        let run = planned_run("bounded", base + i, plan(OverlapPolicy::Allow));
        let store = store.clone();
        async move {
            store
                .begin_run(run, Duration::from_secs(30))
                .await
                .expect("begin")
        }
    };
    for i in 0..8 {
        assert!(begin(&store, i).await.created);
    }
    assert_eq!(
        store.calls_asking_for_keys(),
        0,
        "every begin named the next one's keys"
    );
    let url = shared_redis_url().expect("redis-server");
    let fresh = RedisStore::connect(&url, &prefix, opts)
        .await
        .expect("connect");
    assert!(begin(&fresh, 8).await.created);
    assert_eq!(
        fresh.calls_asking_for_keys(),
        1,
        "without a hint the begin asks"
    );
    assert!(begin(&fresh, 9).await.created);
    assert_eq!(fresh.calls_asking_for_keys(), 1);
    let kept = first_runs(&fresh, "bounded").await;
    assert_eq!(kept.len(), 3, "{kept:?}");
}

/// Fencing tokens come from one counter per partition, read once and written once per
/// call: a partition whose tokens hash holds the per-job counters of before starts past
/// the largest of them (another job's too) and keeps only its own; a counter ahead of
/// the store's clock (a clock that stepped back) is what the next tokens grow from; a
/// batch's leases get tokens in the order given, the counter left at the last.
#[tokio::test]
async fn fencing_tokens_grow_from_the_partitions_counter() {
    use crate::model::OverlapPolicy;
    use crate::store::BeginOn;
    use crate::store::conformance::{job, plan, planned_run, slot, terms};
    let (store, _) = store("tokens", one_partition()).await;
    for id in ["tk-a", "tk-b", "tk-c"] {
        store.create_job(job(id, None)).await.expect("create");
    }
    let mut c = raw_connection().await;
    let tokens = store.key(0, "tokens");
    let ahead = (crate::model::now_ms() as u64 + 3_600_000) * 1000;
    let _: () = c.hset(&tokens, "tk-a", ahead).await.expect("hset");
    let base = crate::model::now_ms();
    let on = |id: &str, at: i64| BeginOn {
        run: planned_run(id, base + at, plan(OverlapPolicy::Allow)),
        route_grace: Duration::from_secs(30),
        node: slot("tk-n", 0),
    };
    let granted = |out: &[(Begun, Option<Assigned>)]| -> Vec<u64> {
        out.iter()
            .map(|(_, a)| match a {
                Some(Assigned::Granted(r)) => r.fencing_token,
                other => panic!("expected a grant: {other:?}"),
            })
            .collect()
    };
    let lease = terms(30_000, 30_000);
    let first = granted(
        &store
            .begin_and_assign_many(vec![on("tk-b", 0)], lease)
            .await
            .expect("begin"),
    );
    assert_eq!(first, vec![ahead + 1], "past another job's legacy counter");
    let kept: std::collections::HashMap<String, u64> = c.hgetall(&tokens).await.expect("hgetall");
    assert_eq!(
        kept,
        [("*".to_owned(), ahead + 1)].into(),
        "the per-job counters dropped"
    );

    let counter = ahead + 1_000_000;
    let _: () = c.hset(&tokens, "*", counter).await.expect("hset");
    let batch = granted(
        &store
            .begin_and_assign_many(vec![on("tk-a", 1), on("tk-b", 1), on("tk-c", 1)], lease)
            .await
            .expect("begin"),
    );
    assert_eq!(batch, vec![counter + 1, counter + 2, counter + 3]);
    let last: u64 = c.hget(&tokens, "*").await.expect("hget");
    assert_eq!(last, counter + 3, "written once, as the call left it");
}

/// A trigger seen again after its run ended finds the run and changes nothing: the
/// common begin writes the record first, only when there is none, and nothing before
/// it (the run's timer, the node's busy set and the job's index are as the run's end
/// left them; a token counted for the lease it did not make is skipped).
#[tokio::test]
async fn a_trigger_seen_again_after_its_run_ended_changes_nothing() {
    use crate::model::OverlapPolicy;
    use crate::store::BeginOn;
    use crate::store::conformance::{job, outcome, plan, planned_run, slot, terms};
    let (store, _) = store("again", one_partition()).await;
    store.create_job(job("ag", None)).await.expect("create");
    let run = planned_run("ag", crate::model::now_ms(), plan(OverlapPolicy::Allow));
    let on = || BeginOn {
        run: run.clone(),
        route_grace: Duration::from_secs(30),
        node: slot("ag-n", 4),
    };
    let lease = terms(30_000, 30_000);
    let first = store
        .begin_and_assign_many(vec![on()], lease)
        .await
        .expect("begin");
    let Some(Assigned::Granted(held)) = &first[0].1 else {
        panic!("{first:?}")
    };
    store
        .finish_run(
            &run.schedule_id,
            Finisher::Holder(Holder::of(held)),
            outcome(RunState::Succeeded),
        )
        .await
        .expect("finish");
    let mut c = raw_connection().await;
    let timers = store.key(0, "timers");
    let busy = format!("{}busy:ag-n", store.nodes_prefix());
    let index = store.key(0, "runs:ag");
    let before: (Vec<String>, Vec<String>, i64) = (
        c.zrange(&timers, 0, -1).await.expect("zrange"),
        c.smembers(&busy).await.expect("smembers"),
        c.zcard(&index).await.expect("zcard"),
    );
    assert_eq!((&before.0, &before.1, before.2), (&vec![], &vec![], 1));
    let ended = store
        .get_run(&run.schedule_id)
        .await
        .expect("get")
        .expect("run");

    let again = store
        .begin_and_assign_many(vec![on()], lease)
        .await
        .expect("begin again");
    let (begun, assigned) = &again[0];
    assert!(!begun.created, "found, not made: {begun:?}");
    assert_eq!(assigned, &None, "not leased again");
    assert_eq!(begun.run, ended, "the run as its end left it");
    let after: (Vec<String>, Vec<String>, i64) = (
        c.zrange(&timers, 0, -1).await.expect("zrange"),
        c.smembers(&busy).await.expect("smembers"),
        c.zcard(&index).await.expect("zcard"),
    );
    assert_eq!(after.0, before.0, "no timer");
    assert_eq!(after.1, before.1, "no slot of the node taken");
    assert_eq!(after.2, before.2, "one index entry");
    let stored = store
        .get_run(&run.schedule_id)
        .await
        .expect("get")
        .expect("run");
    assert_eq!(stored, ended, "the record unchanged");
}

/// A call of `begin_and_assign_many` counts each node's leases once (`busy_counts`,
/// common.lua) and keeps the count true as the batch goes: a slot freed in the middle
/// of a batch is seen by the runs after it. A run of a job at its bound of five drops
/// the oldest, which held the one slot of node `bf-n`: a run for that node before it
/// in the batch found the node full, one after it is leased. (On a Redis Cluster a
/// batch's slots are reserved before its call, so there the last run would wait.)
#[tokio::test]
async fn a_batch_sees_a_slot_freed_in_its_middle() {
    use crate::model::OverlapPolicy;
    use crate::store::BeginOn;
    use crate::store::conformance::{GRACE, LONG, job, plan, planned_run, slot};
    let opts = StoreOptions {
        max_runs_per_job: 5,
        ..one_partition()
    };
    let (store, _) = store("slot-freed", opts).await;
    let (x, y, z) = ("bf-x", "bf-y", "bf-z");
    for id in [x, y, z] {
        store.create_job(job(id, None)).await.expect("create");
    }
    let on = |job_id: &str, planned: Millis, node: NodeSlot| BeginOn {
        run: planned_run(job_id, planned, plan(OverlapPolicy::Allow)),
        route_grace: GRACE,
        node,
    };
    let first = store
        .begin_and_assign_many(vec![on(x, 1000, slot("bf-n", 1))], LONG)
        .await
        .expect("the first lease");
    assert!(
        matches!(first[0].1, Some(Assigned::Granted(_))),
        "{first:?}"
    );
    let oldest = first[0].0.run.schedule_id.clone();
    for planned in [2000, 3000, 4000, 5000] {
        let run = planned_run(x, planned, plan(OverlapPolicy::Allow));
        assert!(store.begin_run(run, GRACE).await.expect("begin").created);
    }
    let out = store
        .begin_and_assign_many(
            vec![
                on(z, 1000, slot("bf-n", 1)),
                on(x, 6000, slot("bf-o", 5)),
                on(y, 1000, slot("bf-n", 1)),
            ],
            LONG,
        )
        .await
        .expect("the batch");
    let assigned: Vec<_> = out.iter().map(|(_, a)| a.clone()).collect();
    assert_eq!(assigned[0], Some(Assigned::NodeFull), "{assigned:?}");
    for (i, node) in [(1, "bf-o"), (2, "bf-n")] {
        let Some(Assigned::Granted(leased)) = &assigned[i] else {
            panic!("run {i}: expected a grant: {assigned:?}");
        };
        assert_eq!(leased.node_id, node, "run {i}");
    }
    assert_eq!(
        store.get_run(&oldest).await.expect("get"),
        None,
        "the oldest run fell out of its job's bound"
    );
}
