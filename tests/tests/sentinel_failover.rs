//! A Sentinel-watched primary SIGKILLed under load with its replica behind, the replica
//! promoted by the Sentinels (issue 44's failover proof under Sentinel: a primary, one
//! replica, three Sentinels with quorum 2, a primary down after 1 s unanswered).
//!
//! The scenario is `cluster_failover`'s (`sundial_tests::failover`): twenty jobs every
//! second on three executors through two instances that reach the store by
//! `redis+sentinel://`; four seconds in, the replica is stopped and cut off for 2 s
//! while the primary goes on acknowledging writes, then the primary is SIGKILLed. Here
//! every partition is on the one primary, so every run in flight sees the failover:
//! the instances' commands fail until the Sentinels name the promoted replica, and the
//! store's connections ask them again after a broken connection (or a `READONLY` from
//! a server that turned replica). What the failover loses is the lagging replica's
//! missing suffix of writes, and each run fares as `cluster_failover`'s doc says: a
//! lost claim is claimed again, a lost grant routed anew (the executor's `Started`
//! under the lost token refused), a lost result re-run as a new attempt after its
//! lease expires; executed at least once, twice only one after the other, never at
//! once, and fencing tokens stay ahead (a token is max(the job's counter + 1, the
//! store's clock in µs)).

use anyhow::Result;
use sundial_tests::RedisSentinel;
use sundial_tests::failover::jobs_survive_a_failover;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_and_its_replica_promoted_loses_no_fire_and_runs_none_twice_at_once()
-> Result<()> {
    let mut sentinel = RedisSentinel::start()?;
    jobs_survive_a_failover(&mut sentinel, env!("CARGO_BIN_EXE_test_executor")).await
}
