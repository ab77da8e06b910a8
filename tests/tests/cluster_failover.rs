//! A Redis Cluster master SIGKILLed under load with its replica behind, the replica
//! promoted (issue 44's failover proof, on a cluster of its own: three masters with a
//! replica each, a 1 s node timeout).
//!
//! Twenty jobs fire every second on three `test_executor` processes (each handler a
//! 300 ms sleep, journaled at its start and its return) through two `sundial`
//! instances. Four seconds in, the replica of the master serving the most partitions
//! is stopped and cut off for 2 s while its master goes on acknowledging writes, then
//! the master is SIGKILLed and the replica promoted: the promoted replica lacks the
//! master's last 2 s (the test measures how many bytes of replication stream), as
//! after any failover of a replica that lagged. The test counts, from the store's run
//! records and the executors' journals: the fires planned, those claimed again because
//! the failover lost their claim, the runs executed, those executed twice one after
//! the other, those executed twice at once (must be none), those lost (planned and
//! never run to success: must be none), those re-run as a new attempt, and waits until
//! none is stuck (every run final).
//!
//! What a failover loses, and what becomes of each run (a replica holds a prefix of its
//! master's writes, and every decision about one fire is in one slot, so the promoted
//! replica sees an earlier state of each run, never a torn one):
//! - a claimed fire whose claim was lost: the job's pending fire is as before the
//!   claim, so it is claimed again and runs (again, if it had run: the same
//!   schedule_id executed twice, one after the other);
//! - a grant lost: the run is WAITING again; the executor's `Started` under the lost
//!   token is refused, so that handler never starts, and the run is routed anew;
//! - a result lost: the run is held under a lease nobody renews any more; it expires
//!   and the run is re-run as a new attempt (never dropped).
//!
//! So across a failover a run is executed at least once, and twice only one after the
//! other as long as its handler ends before the failover is over (a handler still
//! running when its lease is taken is cancelled at its next renewal, about a
//! heartbeat later). Fencing tokens stay ahead across the failover because a token is
//! max(the job's counter + 1, the store's clock in µs): a promoted replica that lost
//! the last counter still hands out tokens above every one given before, as long as
//! its clock is not behind the dead master's by more than the time since.

use anyhow::Result;
use sundial_tests::RedisCluster;
use sundial_tests::failover::jobs_survive_a_failover;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_and_its_replica_promoted_loses_no_fire_and_runs_none_twice_at_once()
-> Result<()> {
    let mut cluster = RedisCluster::start(3, 1)?;
    jobs_survive_a_failover(&mut cluster, env!("CARGO_BIN_EXE_test_executor")).await
}
