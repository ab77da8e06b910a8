//! The failover proof shared by `cluster_failover` and `sentinel_failover` (issue 44):
//! jobs firing every second on executors that journal each start and return, through
//! two `sundial` instances, while the store's master is SIGKILLed with its replica
//! behind and the replica promoted; then the counts (planned, claimed again, executed,
//! executed twice one after the other or at once, lost, re-run) from the store's run
//! records and the journals. Those tests' docs say what a failover loses and what
//! becomes of each run.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use sundial_proto::v1 as pb;
use sundial_server::testing::{Killed, RedisCluster, RedisSentinel};

use crate::{
    Sundial, SundialOptions, TestExecutor, all_runs, is_final, key_slot, read_journals,
    redis_now_at, unique_prefix, wait_for,
};

const JOBS: usize = 20;
const FIRE_FOR: Duration = Duration::from_secs(14);
const KILL_AFTER: Duration = Duration::from_secs(4);
const LAG: Duration = Duration::from_secs(2);
const PARTITIONS: u32 = 16;

/// A store with a master to kill and a replica to promote.
pub trait Failover {
    /// `--redis-url`.
    fn url(&self) -> String;
    /// Stops the replica of the master serving the most of `prefix`'s partitions for
    /// `lag`, then SIGKILLs that master.
    fn kill_master(&mut self, prefix: &str, lag: Duration) -> Result<Killed>;
    /// Waits until the replica serves in the master's place.
    fn wait_promoted(&self, prefix: &str, timeout: Duration) -> Result<()>;
}

/// The partitions' hash slots.
fn slots(prefix: &str) -> Vec<u16> {
    (0..PARTITIONS)
        .map(|p| key_slot(format!("{prefix}:{{{p}}}:").as_bytes()))
        .collect()
}

impl Failover for RedisCluster {
    fn url(&self) -> String {
        RedisCluster::url(self)
    }

    fn kill_master(&mut self, prefix: &str, lag: Duration) -> Result<Killed> {
        self.kill_busiest_master(&slots(prefix), Some(lag))
    }

    fn wait_promoted(&self, prefix: &str, timeout: Duration) -> Result<()> {
        self.wait_failover(&slots(prefix), timeout)
    }
}

impl Failover for RedisSentinel {
    fn url(&self) -> String {
        RedisSentinel::url(self)
    }

    fn kill_master(&mut self, _prefix: &str, lag: Duration) -> Result<Killed> {
        self.kill_primary(Some(lag))
    }

    fn wait_promoted(&self, _prefix: &str, timeout: Duration) -> Result<()> {
        self.wait_failover(timeout)
    }
}

fn job(id: &str, start: i64) -> pb::JobSpec {
    pb::JobSpec {
        id: id.to_owned(),
        cron: "* * * * * *".to_owned(),
        end_time_ms: start + i64::try_from(FIRE_FOR.as_millis()).unwrap_or(0),
        target: Some(pb::job_spec::Target::Executor(pb::ExecutorTarget {
            group: "g".into(),
            handler: "sleep".into(),
        })),
        payload: b"300".to_vec(),
        retry: Some(pb::RetryPolicy {
            max_retries: 3,
            backoff_ms: 200,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Runs the scenario against `store`, with `executor` (the `test_executor` binary):
/// fails when a fire is lost or a run executed twice at once, or when the promoted
/// replica lacked nothing (the run would prove less); prints the counts.
pub async fn jobs_survive_a_failover(store: &mut impl Failover, executor: &str) -> Result<()> {
    let url = store.url();
    let prefix = unique_prefix("failover");
    let dir = tempfile::tempdir()?;
    let mut servers = Vec::new();
    for name in ["a", "b"] {
        servers.push(Sundial::start(
            SundialOptions::redis_url(&url, &prefix)
                .arg("instance-id", name)
                .arg("partitions", &PARTITIONS.to_string())
                // The outage makes fires late by seconds: this test is about what the
                // failover loses, not the misfire policy.
                .arg("misfire-threshold", "60s"),
        )?);
    }
    let endpoints: Vec<String> = servers.iter().map(Sundial::grpc_url).collect();
    let mut executors = Vec::new();
    for i in 0..3 {
        let journal = dir.path().join(format!("e{i}.journal"));
        executors.push(TestExecutor::start(
            executor,
            &endpoints[i % 2..=i % 2],
            &format!("e{i}"),
            &journal,
        )?);
    }
    let start = redis_now_at(&url).await?;
    let mut jobs = servers[0].jobs().await?;
    let mut planned: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for j in 0..JOBS {
        let id = format!("job-{j:02}");
        let created = jobs
            .create_job(pb::CreateJobRequest {
                spec: Some(job(&id, start)),
            })
            .await?
            .into_inner()
            .job
            .context("no job")?;
        let end = start + i64::try_from(FIRE_FOR.as_millis())?;
        let first = (created.created_at_ms / 1000 + 1) * 1000;
        planned.insert(id, (first..=end).step_by(1000).collect());
    }

    tokio::time::sleep(KILL_AFTER).await;
    // Its replica stopped for LAG first: what the master acknowledged meanwhile (about
    // LAG × JOBS fires claimed, run and finished) is lost with it. (The store's clock
    // at the kill is read before it: no master answers until the failover.)
    let lag_from = redis_now_at(&url).await?;
    let lag_started = Instant::now();
    let killed = store.kill_master(&prefix, LAG)?;
    let killed_ms = lag_from + i64::try_from(lag_started.elapsed().as_millis())?;
    let killed_at = Instant::now();
    store.wait_promoted(&prefix, Duration::from_secs(30))?;
    let failover = killed_at.elapsed();
    let (lost_bytes, killed) = (killed.lost_bytes, killed.port);

    // Every planned fire recorded and final.
    let end = start + i64::try_from(FIRE_FOR.as_millis())?;
    let runs = servers[1].runs().await?;
    let total: usize = planned.values().map(Vec::len).sum();
    let finals = wait_for(
        "every run final",
        FIRE_FOR + Duration::from_secs(90),
        || {
            let mut runs = runs.clone();
            let planned = planned.clone();
            let url = url.clone();
            async move {
                if redis_now_at(&url).await? <= end + 500 {
                    return Ok(None);
                }
                let mut out = Vec::new();
                for id in planned.keys() {
                    let recorded = all_runs(&mut runs, id).await?;
                    if recorded.iter().any(|r| !is_final(r)) {
                        return Ok(None);
                    }
                    out.extend(recorded);
                }
                Ok((out.len() >= total).then_some(out))
            }
        },
    )
    .await?;

    // Lost: planned and not run to success. Stuck: none (waited for above).
    let mut lost = Vec::new();
    for (id, fires) in &planned {
        for at in fires {
            let ok = finals.iter().any(|r| {
                r.job_id == *id
                    && r.scheduled_at_ms == *at
                    && r.state == pb::RunState::Succeeded as i32
            });
            if !ok {
                lost.push(format!("{id}@{at}"));
            }
        }
    }
    let rerun = finals.iter().filter(|r| r.attempt > 1).count();
    // Fires due while the replica lagged whose claim the failover lost: claimed again
    // (by the promoted replica's clock) after the kill.
    let reclaimed = finals
        .iter()
        .filter(|r| {
            r.scheduled_at_ms > lag_from
                && r.scheduled_at_ms < killed_ms - 1000
                && r.triggered_at_ms > killed_ms
        })
        .count();

    // The journals: starts per schedule_id, and whether two overlapped.
    let journals: Vec<_> = executors.iter().map(|e| e.journal.clone()).collect();
    drop(executors);
    let entries = read_journals(&journals)?;
    let mut per_run: BTreeMap<&str, Vec<(i64, i64)>> = BTreeMap::new();
    let mut open: BTreeMap<(&str, &str, u64), i64> = BTreeMap::new();
    for e in &entries {
        let key = (e.schedule_id.as_str(), e.node_id.as_str(), e.token);
        match e.event.as_str() {
            "start" => {
                open.insert(key, e.unix_ms);
            }
            "finish" => {
                let began = open.remove(&key).unwrap_or(e.unix_ms);
                per_run
                    .entry(e.schedule_id.as_str())
                    .or_default()
                    .push((began, e.unix_ms));
            }
            _ => {}
        }
    }
    // A start without its finish (the executor was stopped first) runs until now.
    for ((sid, _, _), began) in open {
        per_run.entry(sid).or_default().push((began, i64::MAX));
    }
    let executed = per_run.len();
    let twice = per_run.values().filter(|v| v.len() > 1).count();
    let mut at_once = Vec::new();
    for (sid, spans) in &mut per_run {
        spans.sort_unstable();
        if spans.windows(2).any(|w| w[1].0 < w[0].1) {
            at_once.push(((*sid).to_owned(), spans.clone()));
        }
    }
    println!(
        "master :{killed} killed with its replica {lost_bytes} bytes of acknowledged writes \
         behind ({LAG:?} of lag), replica promoted in {failover:?}: {total} fires planned, \
         {reclaimed} of them claimed again after the failover lost their claim, {executed} \
         executed, {twice} executed twice (one after the other), {} at once, {} lost, \
         {rerun} re-run as a new attempt",
        at_once.len(),
        lost.len()
    );
    ensure!(
        lost_bytes > 0,
        "the promoted replica lost nothing: its lag did not take effect, so this run proved less"
    );
    ensure!(
        at_once.is_empty(),
        "runs executed twice at once: {at_once:?}"
    );
    ensure!(lost.is_empty(), "fires lost: {lost:?}");
    for srv in &mut servers {
        let status = srv.stop()?;
        ensure!(
            status.success(),
            "graceful stop failed: {status}\n{}",
            srv.stderr()
        );
    }
    Ok(())
}
