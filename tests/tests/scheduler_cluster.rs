//! Several `sundial` processes on one real Redis (or one Redis Cluster of three masters
//! with a replica each): every planned fire becomes exactly one run, also when an
//! instance is SIGKILLed or stops itself at a named crash point.
//!
//! The witness for "exactly once" is the trigger queue itself (one stream entry per
//! claimed fire): run records are keyed by schedule_id, so they would hide a double
//! claim. Each job gets an end time, so the set of planned fires is known exactly.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use sundial_proto::v1 as pb;
use sundial_tests::{
    RedisServer, Sundial, SundialOptions, all_runs, every_second, is_final, queued_triggers_at,
    redis_now_at, shared_redis_cluster_url, unique_prefix, wait_for,
};

struct Scenario {
    instances: usize,
    jobs: usize,
    /// How long each job fires (its end time is creation + this).
    fire_for: Duration,
    /// Instance 1 is started with this `SUNDIAL_FAULT`.
    fault: Option<&'static str>,
    /// Instance 1 is SIGKILLed this long after the jobs were created.
    kill_after: Option<Duration>,
    /// Redis (persistent, fsync always) is SIGKILLed this long after the jobs were
    /// created and restarted a second later.
    redis_restart_after: Option<Duration>,
    /// Extra `--flag value` for every instance.
    args: &'static [(&'static str, &'static str)],
    /// On the test binary's shared Redis Cluster (under a prefix of its own) instead
    /// of a Redis of its own.
    cluster: bool,
}

struct PlannedJob {
    id: String,
    created_at: i64,
    end: i64,
}

impl PlannedJob {
    /// Every whole second in (created_at, end]: the fires of `* * * * * *`.
    fn expected(&self) -> BTreeSet<i64> {
        let first = (self.created_at / 1000 + 1) * 1000;
        (first..=self.end).step_by(1000).collect()
    }
}

async fn run_scenario(s: Scenario) -> Result<()> {
    let (mut redis, url, prefix) = if s.cluster {
        (None, shared_redis_cluster_url()?, unique_prefix("sched"))
    } else {
        let redis = if s.redis_restart_after.is_some() {
            RedisServer::start_persistent()?
        } else {
            RedisServer::start()?
        };
        let url = redis.url();
        (Some(redis), url, "sundial".to_owned())
    };
    let prefix = prefix.as_str();
    let mut servers = Vec::new();
    for i in 0..s.instances {
        let mut opts = SundialOptions::redis_url(&url, prefix)
            // A starved CI machine must not turn lateness into deliberate misfire skips:
            // this test is about claims, not the misfire policy.
            .arg("misfire-threshold", "60s")
            // No executor connects: each run fails "no_executor" as soon as it is
            // routed, so that every run is final when the fires are counted.
            .arg("dispatch-wait", "1ms")
            .arg("instance-id", &format!("inst-{i}"));
        for (flag, value) in s.args {
            opts = opts.arg(flag, value);
        }
        if i == 1
            && let Some(point) = s.fault
        {
            opts = opts.fault(point);
        }
        servers.push(Sundial::start(opts)?);
    }
    let fire_for = i64::try_from(s.fire_for.as_millis())?;
    let mut planned = Vec::new();
    // Jobs are created through every instance (they all write the same store) but the
    // faulted one: its crash point may be reached while jobs are still being created.
    let mut clients = Vec::new();
    for (i, srv) in servers.iter().enumerate() {
        if i != 1 || s.fault.is_none() {
            clients.push(srv.jobs().await?);
        }
    }
    let start = redis_now_at(&url).await?;
    for j in 0..s.jobs {
        let id = format!("job-{j:04}");
        let mut spec = every_second(&id);
        spec.end_time_ms = start + fire_for;
        let n = clients.len();
        let client = &mut clients[j % n];
        let job = client
            .create_job(pb::CreateJobRequest { spec: Some(spec) })
            .await?
            .into_inner()
            .job
            .context("no job")?;
        planned.push(PlannedJob {
            id,
            created_at: job.created_at_ms,
            end: start + fire_for,
        });
    }
    if let Some(after) = s.redis_restart_after {
        let redis = redis
            .as_mut()
            .context("a Redis restart needs a Redis of its own")?;
        tokio::time::sleep(after).await;
        redis.kill();
        tokio::time::sleep(Duration::from_secs(1)).await;
        redis.restart()?;
    }
    if let Some(after) = s.kill_after {
        tokio::time::sleep(after).await;
        servers[1].kill()?;
    }
    if let Some(point) = s.fault {
        let waited = servers[1]
            .wait_exit(s.fire_for + Duration::from_secs(10))
            .await;
        let status = match waited {
            Ok(status) => status,
            Err(e) => {
                let log = servers[1].stderr();
                let tail = &log[log.floor_char_boundary(log.len().saturating_sub(2000))..];
                bail!(
                    "{e}: instance 1 never reached its crash point {point}; its log ends:\n{tail}"
                );
            }
        };
        ensure!(!status.success(), "crash point exit was {status}");
        ensure!(
            servers[1].stderr().contains("SUNDIAL_FAULT: crashing at"),
            "the instance died, but not at its crash point"
        );
    }
    // Wait until the last planned fire is past, then until every run is recorded
    // (triggers a dead instance held are taken over after the reclaim idle time).
    let end = start + fire_for;
    wait_for(
        "the last planned fire",
        s.fire_for + Duration::from_secs(30),
        || async { Ok((redis_now_at(&url).await? > end + 500).then_some(())) },
    )
    .await?;
    let live = servers
        .iter_mut()
        .position(|s| s.is_running())
        .context("no live instance")?;
    let mut runs = servers[live].runs().await?;
    let expected_total: usize = planned.iter().map(|p| p.expected().len()).sum();
    let ids: Vec<String> = planned.iter().map(|p| p.id.clone()).collect();
    // Recorded is not final: a run recorded late (after the outage, or taken over from
    // a dead instance) is WAITING until its routing or its timer fails it.
    wait_for(
        "every run recorded and final",
        Duration::from_secs(60),
        || {
            let mut runs = runs.clone();
            let ids = ids.clone();
            async move {
                let mut n = 0;
                for id in &ids {
                    let recorded = all_runs(&mut runs, id).await?;
                    if !recorded.iter().all(is_final) {
                        return Ok(None);
                    }
                    n += recorded.len();
                }
                Ok((n >= expected_total).then_some(()))
            }
        },
    )
    .await?;

    // The queue: one trigger per planned fire, none twice, none unplanned.
    let triggers = queued_triggers_at(&url, prefix).await?;
    let mut per_schedule: BTreeMap<&str, usize> = BTreeMap::new();
    for t in &triggers {
        *per_schedule.entry(t.schedule_id.as_str()).or_default() += 1;
    }
    let dups: Vec<_> = per_schedule.iter().filter(|(_, n)| **n > 1).collect();
    ensure!(dups.is_empty(), "fires claimed twice: {dups:?}");
    for p in &planned {
        let expected = p.expected();
        let queued: BTreeSet<i64> = triggers
            .iter()
            .filter(|t| t.job_id == p.id)
            .map(|t| t.scheduled_at)
            .collect();
        ensure!(
            queued == expected,
            "{}: queued fires differ from planned: missing {:?}, unplanned {:?}",
            p.id,
            expected.difference(&queued).collect::<Vec<_>>(),
            queued.difference(&expected).collect::<Vec<_>>()
        );
        let recorded = all_runs(&mut runs, &p.id).await?;
        let recorded_at: BTreeSet<i64> = recorded.iter().map(|r| r.scheduled_at_ms).collect();
        ensure!(
            recorded.len() == expected.len() && recorded_at == expected,
            "{}: {} runs recorded for {} planned fires",
            p.id,
            recorded.len(),
            expected.len()
        );
        let other: Vec<_> = recorded
            .iter()
            .filter(|r| r.state != pb::RunState::Failed as i32 || r.error_code != "no_executor")
            .map(|r| (&r.schedule_id, r.state, &r.error_code, &r.error_message))
            .collect();
        ensure!(
            other.is_empty(),
            "{}: every run should fail \"no_executor\" (none is connected), these did not: {other:?}",
            p.id
        );
    }
    println!(
        "{} jobs, {} planned fires, {} queued triggers, 0 missing, 0 duplicated",
        planned.len(),
        expected_total,
        triggers.len()
    );
    for srv in &mut servers {
        if srv.is_running() {
            let status = srv.stop()?;
            if !status.success() {
                bail!("graceful stop failed: {status}\n{}", srv.stderr());
            }
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_fire_every_planned_fire_once() -> Result<()> {
    run_scenario(Scenario {
        instances: 3,
        jobs: 200,
        fire_for: Duration::from_secs(10),
        fault: None,
        kill_after: None,
        redis_restart_after: None,
        args: &[],
        cluster: false,
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_one_instance_loses_and_doubles_nothing() -> Result<()> {
    run_scenario(Scenario {
        instances: 3,
        jobs: 200,
        fire_for: Duration::from_secs(10),
        fault: None,
        kill_after: Some(Duration::from_secs(5)),
        redis_restart_after: None,
        args: &[],
        cluster: false,
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_loses_and_doubles_nothing() -> Result<()> {
    // Functions are gone after the restart (loaded again at the next call), connections break
    // (the pool replaces them), the change subscription reconnects, and the fires
    // that came due during the outage are claimed late, once each.
    run_scenario(Scenario {
        instances: 2,
        jobs: 50,
        fire_for: Duration::from_secs(10),
        fault: None,
        kill_after: None,
        redis_restart_after: Some(Duration::from_secs(4)),
        args: &[],
        cluster: false,
    })
    .await
}

// One test per crash point of the claim path. The n-th hit makes the instance crash
// in the first seconds, with fires claimed and dispatched before and after. The
// dispatch points count runs this one instance begins, its share of what three
// instances read: 10 is reached even when it reads little beside other tests (30 was
// missed twice in about ten runs of the whole binary).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_before_claim() -> Result<()> {
    crash_at("scheduler.before_claim@15").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_claim() -> Result<()> {
    crash_at("scheduler.after_claim@15").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_before_record() -> Result<()> {
    crash_at("dispatch.before_record@10").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_before_ack() -> Result<()> {
    crash_at("dispatch.before_ack@10").await
}

async fn crash_at(point: &'static str) -> Result<()> {
    run_scenario(Scenario {
        instances: 3,
        jobs: 50,
        fire_for: Duration::from_secs(8),
        fault: Some(point),
        kill_after: None,
        redis_restart_after: None,
        args: &[],
        cluster: false,
    })
    .await
}

/// An instance that dies between reading triggers and recording their runs: the
/// survivor takes them over once the dead one's beat runs out (1 s here), not after
/// the idle reclaim (two minutes here, longer than the test waits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_instances_triggers_are_taken_over_when_its_beat_runs_out() -> Result<()> {
    run_scenario(Scenario {
        instances: 2,
        jobs: 50,
        fire_for: Duration::from_secs(8),
        fault: Some("dispatch.before_record@10"),
        kill_after: None,
        redis_restart_after: None,
        args: &[("trigger-reclaim-idle", "120s"), ("instance-ttl", "1s")],
        cluster: false,
    })
    .await
}

/// On a Redis Cluster: three instances, one of them SIGKILLed, every fire claimed once
/// (the trigger streams of each partition live on the master serving its slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_sigkill_of_one_instance_loses_and_doubles_nothing() -> Result<()> {
    run_scenario(Scenario {
        instances: 3,
        jobs: 200,
        fire_for: Duration::from_secs(10),
        fault: None,
        kill_after: Some(Duration::from_secs(4)),
        redis_restart_after: None,
        args: &[],
        cluster: true,
    })
    .await
}

#[test]
fn every_crash_point_has_a_test() {
    // The claim path's points are tested here, the result path's with the webhooks,
    // the embedded store's group commit with its restarts, the loop watch's panic point
    // with the server's surface.
    let sources = [
        include_str!("scheduler_cluster.rs"),
        include_str!("webhooks.rs"),
        include_str!("embedded_restart.rs"),
        include_str!("server_surface.rs"),
    ];
    for point in sundial_server::fault::POINTS {
        assert!(
            sources.iter().any(|s| s.contains(&format!("\"{point}@"))),
            "crash point {point} has no test here, in webhooks.rs, embedded_restart.rs or server_surface.rs"
        );
    }
}
