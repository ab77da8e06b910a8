//! Job changes racing with claims on several instances: updates, pauses, resumes and
//! deletes arrive while three schedulers claim the same jobs every second.
//!
//! What must hold, read from the trigger queue (the record of every claim):
//! - one fire chain per job: cron fires appear in strictly increasing planned order,
//!   and no schedule_id twice;
//! - a paused job is never claimed between its pause and its resume;
//! - a resumed job fires from "now", with no catch-up of the paused interval;
//! - a deleted job is never claimed again;
//! - no chain dies of the races: each job fires after its last change.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, ensure};
use rand::Rng;
use sundial_proto::v1 as pb;
use sundial_tests::{
    JobServiceClient, RedisServer, Sundial, SundialOptions, every_second, queued_triggers,
    redis_now,
};
use tonic::transport::Channel;

const JOBS: usize = 12;

/// What one actor did to its job, with the store's clock around each step.
#[derive(Default, Debug)]
struct History {
    /// (pause committed, resume requested): nothing may be claimed in between.
    paused: Vec<(i64, i64)>,
    /// Resume request times: fires claimed after one are planned after it.
    resumed: Vec<i64>,
    deleted_at: Option<i64>,
}

async fn act(
    redis: &RedisServer,
    mut jobs: JobServiceClient<Channel>,
    id: String,
    rounds: usize,
) -> Result<History> {
    let mut h = History::default();
    let mut fast = true;
    for _ in 0..rounds {
        let (op, wait) = {
            let mut rng = rand::rng();
            (rng.random_range(0..3), rng.random_range(200..700))
        };
        tokio::time::sleep(Duration::from_millis(wait)).await;
        match op {
            0 => {
                // Update against the version just read; a concurrent change loses.
                let job = jobs
                    .get_job(pb::GetJobRequest { job_id: id.clone() })
                    .await?
                    .into_inner()
                    .job
                    .unwrap_or_default();
                fast = !fast;
                let mut spec = every_second(&id);
                spec.cron = if fast { "* * * * * *" } else { "*/2 * * * * *" }.into();
                let r = jobs
                    .update_job(pb::UpdateJobRequest {
                        spec: Some(spec),
                        expected_version: job.version,
                    })
                    .await;
                ensure!(
                    r.is_ok() || r.as_ref().err().map(|e| e.code()) == Some(tonic::Code::Aborted),
                    "update failed: {r:?}"
                );
            }
            1 => {
                jobs.pause_job(pb::PauseJobRequest { job_id: id.clone() })
                    .await?;
                let paused_at = redis_now(redis).await?;
                tokio::time::sleep(Duration::from_millis(wait + 1200)).await;
                let resume_at = redis_now(redis).await?;
                h.paused.push((paused_at, resume_at));
                h.resumed.push(resume_at);
                jobs.resume_job(pb::ResumeJobRequest { job_id: id.clone() })
                    .await?;
            }
            _ => {
                // Pause and resume back to back: the tightest race with a claim.
                jobs.pause_job(pb::PauseJobRequest { job_id: id.clone() })
                    .await?;
                let resume_at = redis_now(redis).await?;
                h.resumed.push(resume_at);
                jobs.resume_job(pb::ResumeJobRequest { job_id: id.clone() })
                    .await?;
            }
        }
    }
    // The races must leave the chain alive: a fire claimed after the last change, before
    // the delete. (Whether a job fires during its rounds is chance: every change re-arms
    // from now, so a fire due but not yet claimed when a change lands is replaced, and a
    // third of the rounds are paused. Simulated, 0.06 % of jobs never fire in their rounds
    // when claims are instant, 1.2 % when they trail their due time by 100 ms, as on a
    // loaded CI machine; one job of twelve did in a CI run.)
    let last_change = redis_now(redis).await?;
    fired_since(redis, &id, last_change, Duration::from_secs(15)).await?;
    jobs.delete_job(pb::DeleteJobRequest { job_id: id.clone() })
        .await?;
    h.deleted_at = Some(redis_now(redis).await?);
    Ok(h)
}

/// Waits (at most `within`) for a fire of `id` claimed after `after` (store clock).
async fn fired_since(redis: &RedisServer, id: &str, after: i64, within: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let triggers = queued_triggers(redis, "sundial").await?;
        if triggers
            .iter()
            .any(|t| t.job_id == id && t.entry_ms > after)
        {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{id}: no fire in {within:?} after its last change at {after}: the chain died"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_racing_with_claims_never_fork_or_revive_a_chain() -> Result<()> {
    let redis = RedisServer::start()?;
    let mut servers = Vec::new();
    for i in 0..3 {
        servers.push(Sundial::start(
            SundialOptions::redis(&redis)
                .arg("misfire-threshold", "60s")
                .arg("instance-id", &format!("race-{i}")),
        )?);
    }
    let mut actors = Vec::new();
    for j in 0..JOBS {
        let id = format!("race-{j:02}");
        let mut jobs = servers[j % 3].jobs().await?;
        jobs.create_job(pb::CreateJobRequest {
            spec: Some(every_second(&id)),
        })
        .await?;
        // Each actor talks to a different instance than the one that created its job.
        let client = servers[(j + 1) % 3].jobs().await?;
        let redis = &redis;
        actors.push(async move {
            let h = act(redis, client, id.clone(), 10).await?;
            anyhow::Ok((id, h))
        });
    }
    let histories: BTreeMap<String, History> = futures_join_all(actors).await?;
    // Let anything still in flight land before reading the queue.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let triggers = queued_triggers(&redis, "sundial").await?;
    // Only a guard against a vacuous run (each job must fire too, below): a job is
    // paused for a third of its rounds and fires every 1 or 2 s, so the total varies
    // around 50; it came to 35 under load, under the 36 this guard used to ask for.
    ensure!(
        triggers.len() >= JOBS * 2,
        "only {} fires in all",
        triggers.len()
    );

    let mut seen = BTreeMap::new();
    for t in &triggers {
        ensure!(
            seen.insert(t.schedule_id.clone(), ()).is_none(),
            "{} claimed twice",
            t.schedule_id
        );
    }
    for (id, h) in &histories {
        let mine: Vec<_> = triggers.iter().filter(|t| &t.job_id == id).collect();
        for w in mine.windows(2) {
            ensure!(
                w[1].scheduled_at > w[0].scheduled_at,
                "{id}: two fire chains: {} queued after {}",
                w[1].schedule_id,
                w[0].schedule_id
            );
        }
        for (paused_at, resume_at) in &h.paused {
            for t in &mine {
                ensure!(
                    !(t.entry_ms > *paused_at && t.entry_ms < *resume_at),
                    "{id}: {} claimed at {} while paused ({paused_at}..{resume_at})",
                    t.schedule_id,
                    t.entry_ms
                );
            }
        }
        for resume_at in &h.resumed {
            for t in mine.iter().filter(|t| t.entry_ms > *resume_at) {
                ensure!(
                    t.scheduled_at > *resume_at,
                    "{id}: {} claimed after the resume at {resume_at} is a catch-up",
                    t.schedule_id
                );
            }
        }
        if let Some(deleted) = h.deleted_at {
            for t in &mine {
                ensure!(
                    t.entry_ms <= deleted,
                    "{id}: {} claimed after the delete",
                    t.schedule_id
                );
            }
        }
    }
    println!(
        "{} jobs, {} claims checked: no fork, no claim while paused, no catch-up, none after delete",
        histories.len(),
        triggers.len()
    );
    Ok(())
}

/// Runs the actors concurrently and collects their histories (first error wins).
async fn futures_join_all<F>(actors: Vec<F>) -> Result<BTreeMap<String, History>>
where
    F: std::future::Future<Output = Result<(String, History)>>,
{
    let results = futures::future::join_all(actors).await;
    results.into_iter().collect()
}
