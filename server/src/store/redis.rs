//! The `redis` backend: production, any number of server instances.
//!
//! Owns the key layout, the Lua scripts and the pub/sub watcher. Every decision is one
//! script, called by SHA and reloaded on `NOSCRIPT` (a restarted Redis forgets them).
//! A job lives in partition `p = partition_of(job_id, P)`; every key of a partition
//! carries the hash tag `{p}`, so each script touches one cluster slot:
//!
//! ```text
//! <prefix>:meta                         schema version, partition count
//! <prefix>:{p}:job:<job_id>             hash: rec (JSON), version, paused, jit (due − planned),
//!                                       member (its pending member while armed)
//! <prefix>:{p}:jobs                     zset (score 0) of job ids, for listing
//! <prefix>:{p}:pending                  zset "<version>:<jit>:<job_id>" -> due time (ms)
//! <prefix>:{p}:claimer                  instance working the partition (short TTL)
//! <prefix>:{p}:triggers                 stream of triggers, consumer group "dispatch"
//! <prefix>:{p}:idem:<job_id>:<key>      manual-trigger idempotency key -> schedule_id
//! <prefix>:{p}:run:<schedule_id>        run record (JSON), expires after the retention
//! <prefix>:{p}:runs:<job_id>            zset schedule_id -> scheduled_at: bounded per-job index
//! <prefix>:{p}:lease:<schedule_id>      hash: holder, token, expires
//! <prefix>:{p}:leases                   zset schedule_id -> lease expiry
//! <prefix>:{p}:tokens                   hash job_id -> last fencing token
//! <prefix>:{p}:outbox:<schedule_id>     webhook outbox entry (JSON: job, url, body, created_at,
//!                                       attempts, token, in_flight, due); gone once delivered
//!                                       or given up
//! <prefix>:{p}:outbox_due               zset schedule_id -> due (next attempt, or the end of
//!                                       an in-flight claim's lease)
//! <prefix>:{webhooks}:breaker:<dest>    hash: state, until, failures (a day's TTL)
//! <prefix>:{n}:nonce:<app>:<nonce>      replay-protection marker with a TTL
//! <prefix>:{nodes}:node:<node_id>       hash: rec (JSON), inst, hb (store clock); expires with its TTL
//! <prefix>:{nodes}:ids                  set of registered node ids, pruned when listed
//! <prefix>:changes                      pub/sub channel: a job was created or changed
//! ```

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_redis::{Manager, Pool, Runtime};
use futures::StreamExt;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadReply};
use redis::{AsyncCommands, Script, Value};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{
    Applied, Assigned, Begun, BreakerState, BreakerUpdate, ClaimOutcome, ClaimResult, Delivery,
    DeliveryOutcome, DueBatch, DueFire, Enqueued, Error, FannedOut, Finisher, FireClaim,
    GONE_ERROR, Held, LeaseTerms, LogLine, NodeRecord, NodeSlot, Outcome, Page, Recorded, Result,
    Revocation, RunQuery, SCHEMA_VERSION, Store, StoreOptions, Transition, WebhookDelivery,
    partition_of,
};
use crate::model::{
    AppRecord, Arm, JobRecord, Millis, RunRecord, RunState, Trigger, duration_ms, split_schedule_id,
};

const GROUP: &str = "dispatch";

macro_rules! script {
    ($name:literal) => {
        Script::new(concat!(
            include_str!("lua/common.lua"),
            "\n",
            include_str!(concat!("lua/", $name, ".lua"))
        ))
    };
}

/// A run-machine script: the common prelude, then the run helpers, then its body.
macro_rules! run_script {
    ($name:literal) => {
        Script::new(concat!(
            include_str!("lua/common.lua"),
            "\n",
            include_str!("lua/runlib.lua"),
            "\n",
            include_str!(concat!("lua/", $name, ".lua"))
        ))
    };
}

struct Scripts {
    create_job: Script,
    update_job: Script,
    delete_job: Script,
    due_fires: Script,
    claim_fires: Script,
    enqueue_manual: Script,
    record_run: Script,
    trim_triggers: Script,
    read_jobs: Script,
    upsert_node: Script,
    remove_node: Script,
    begin_run: Script,
    assign_run: Script,
    mark_started: Script,
    renew_leases: Script,
    finish_run: Script,
    due_runs: Script,
    expire_run: Script,
    cancel_run: Script,
    report_progress: Script,
    append_logs: Script,
    fan_out: Script,
    create_app: Script,
    rotate_app_secret: Script,
    due_deliveries: Script,
    claim_delivery: Script,
    finish_delivery: Script,
    breaker_state: Script,
    record_breaker: Script,
}

impl Scripts {
    fn load() -> Self {
        Self {
            create_job: script!("create_job"),
            update_job: script!("update_job"),
            delete_job: script!("delete_job"),
            due_fires: script!("due_fires"),
            claim_fires: script!("claim_fires"),
            enqueue_manual: script!("enqueue_manual"),
            record_run: script!("record_run"),
            trim_triggers: script!("trim_triggers"),
            read_jobs: script!("read_jobs"),
            upsert_node: script!("upsert_node"),
            remove_node: script!("remove_node"),
            begin_run: run_script!("begin_run"),
            assign_run: run_script!("assign_run"),
            mark_started: run_script!("mark_started"),
            renew_leases: run_script!("renew_leases"),
            finish_run: run_script!("finish_run"),
            due_runs: run_script!("due_runs"),
            expire_run: run_script!("expire_run"),
            cancel_run: run_script!("cancel_run"),
            report_progress: run_script!("report_progress"),
            append_logs: run_script!("append_logs"),
            fan_out: run_script!("fan_out"),
            create_app: script!("create_app"),
            rotate_app_secret: script!("rotate_app_secret"),
            due_deliveries: script!("due_deliveries"),
            claim_delivery: script!("claim_delivery"),
            finish_delivery: run_script!("finish_delivery"),
            breaker_state: script!("breaker_state"),
            record_breaker: script!("record_breaker"),
        }
    }
}

/// The Redis-backed store. Cheap to clone.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    prefix: String,
    partitions: u32,
    opts: StoreOptions,
    scripts: Scripts,
    changes: watch::Receiver<u64>,
    /// Stops the pub/sub watcher when the last handle is dropped.
    watcher: CancellationToken,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.watcher.cancel();
    }
}

fn unavailable(e: impl std::fmt::Display) -> Error {
    Error::Unavailable(e.to_string())
}

fn corrupt(e: impl std::fmt::Display) -> Error {
    Error::Corrupt(e.to_string())
}

impl RedisStore {
    /// Connects, checks or writes the schema record, creates the consumer groups and
    /// starts the change watcher. `prefix` namespaces every key (tests use one per run).
    pub async fn connect(url: &str, prefix: &str, opts: StoreOptions) -> Result<Self> {
        // Blocking stream reads and large claim batches outlast redis-rs's default
        // 500 ms response timeout; a dead server is still noticed within seconds.
        let conn_cfg = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(30)));
        let manager = Manager::new_with_config(url, conn_cfg).map_err(unavailable)?;
        let pool = Pool::builder(manager)
            .max_size(64)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(10)))
            .create_timeout(Some(Duration::from_secs(5)))
            .build()
            .map_err(unavailable)?;
        let partitions = Self::init_meta(&pool, prefix, opts.partitions).await?;
        let (tx, rx) = watch::channel(0u64);
        let watcher = CancellationToken::new();
        let client = redis::Client::open(url).map_err(unavailable)?;
        tokio::spawn(watch_changes(
            client,
            format!("{prefix}:changes"),
            tx,
            watcher.clone(),
        ));
        let store = Self {
            inner: Arc::new(Inner {
                pool,
                prefix: prefix.to_owned(),
                partitions,
                opts,
                scripts: Scripts::load(),
                changes: rx,
                watcher,
            }),
        };
        for p in 0..partitions {
            store.ensure_group(p).await?;
        }
        Ok(store)
    }

    /// Writes the schema record if absent; refuses a newer schema; returns the store's
    /// partition count (which wins over the configured one for an existing store).
    async fn init_meta(pool: &Pool, prefix: &str, partitions: u32) -> Result<u32> {
        let mut c = pool.get().await.map_err(unavailable)?;
        let key = format!("{prefix}:meta");
        let _: () = redis::pipe()
            .hset_nx(&key, "schema", SCHEMA_VERSION)
            .hset_nx(&key, "partitions", partitions.max(1))
            .query_async(&mut c)
            .await
            .map_err(unavailable)?;
        let (schema, parts): (Option<u32>, Option<u32>) = redis::cmd("HMGET")
            .arg(&key)
            .arg("schema")
            .arg("partitions")
            .query_async(&mut c)
            .await
            .map_err(unavailable)?;
        let schema = schema.ok_or_else(|| corrupt("meta record without schema"))?;
        if schema > SCHEMA_VERSION {
            return Err(Error::SchemaTooNew {
                found: schema,
                supported: SCHEMA_VERSION,
            });
        }
        parts.ok_or_else(|| corrupt("meta record without partitions"))
    }

    async fn ensure_group(&self, p: u32) -> Result<()> {
        let mut c = self.conn().await?;
        let r: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(self.key(p, "triggers"))
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut c)
            .await;
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// After a Redis restart without persistence the streams and groups are gone:
    /// recreate them (and the meta record) so reads resume.
    async fn recover_groups(&self) -> Result<()> {
        Self::init_meta(&self.inner.pool, &self.inner.prefix, self.inner.partitions).await?;
        for p in 0..self.inner.partitions {
            self.ensure_group(p).await?;
        }
        Ok(())
    }

    async fn conn(&self) -> Result<deadpool_redis::Connection> {
        self.inner.pool.get().await.map_err(unavailable)
    }

    /// An app's record: one key in the `{apps}` slot.
    fn app_key(&self, app_id: &str) -> String {
        format!("{}:{{apps}}:app:{app_id}", self.inner.prefix)
    }

    fn pfx(&self, p: u32) -> String {
        format!("{}:{{{p}}}:", self.inner.prefix)
    }

    fn key(&self, p: u32, rest: &str) -> String {
        format!("{}{rest}", self.pfx(p))
    }

    fn part(&self, job_id: &str) -> u32 {
        partition_of(job_id, self.inner.partitions)
    }

    /// Nodes are not partitioned: all of them share the `{nodes}` slot.
    fn nodes_prefix(&self) -> String {
        format!("{}:{{nodes}}:", self.inner.prefix)
    }

    /// Breakers are per destination, not per partition: all of them share one slot.
    fn breakers_prefix(&self) -> String {
        format!("{}:{{webhooks}}:", self.inner.prefix)
    }

    /// Calls a run-transition script with (partition prefix, nodes prefix,
    /// schedule_id, `extra`…) and parses its reply; a malformed schedule_id is an
    /// unknown run.
    async fn run_transition(
        &self,
        script: &Script,
        schedule_id: &str,
        extra: &[String],
    ) -> Result<Transition> {
        let Some((job_id, _)) = split_schedule_id(schedule_id) else {
            return Ok(unknown_run());
        };
        let mut inv = script.prepare_invoke();
        inv.arg(self.pfx(self.part(job_id)))
            .arg(self.nodes_prefix())
            .arg(schedule_id);
        for a in extra {
            inv.arg(a);
        }
        let mut c = self.conn().await?;
        let r: Vec<String> = inv.invoke_async(&mut c).await.map_err(unavailable)?;
        transition(&r)
    }

    fn channel(&self) -> String {
        format!("{}:changes", self.inner.prefix)
    }

    async fn read_job(&self, job_id: &str) -> Result<Option<JobRecord>> {
        let p = self.part(job_id);
        Ok(self.read_jobs(p, &[job_id.to_owned()]).await?.pop())
    }

    /// Reads jobs of one partition with their armed fire, in one script so the record
    /// and the pending score are from the same moment.
    async fn read_jobs(&self, p: u32, ids: &[String]) -> Result<Vec<JobRecord>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut inv = self.inner.scripts.read_jobs.prepare_invoke();
        inv.arg(self.pfx(p));
        for id in ids {
            inv.arg(id);
        }
        let mut c = self.conn().await?;
        #[allow(clippy::type_complexity)]
        let rows: Vec<(Option<String>, Option<u64>, Option<Millis>, Option<Millis>)> =
            inv.invoke_async(&mut c).await.map_err(unavailable)?;
        let mut out = Vec::with_capacity(rows.len());
        for (rec, version, due, jit) in rows {
            if let Some(job) = decode_job(rec, version, due.map(|d| (d, jit.unwrap_or(0))))? {
                out.push(job);
            }
        }
        Ok(out)
    }

    fn deliveries(&self, p: u32, ids: Vec<StreamId>) -> Vec<Delivery> {
        ids.into_iter()
            .filter_map(|sid| match decode_trigger(&sid) {
                Ok(trigger) => Some(Delivery {
                    entry_id: format!("{p}/{}", sid.id),
                    trigger,
                }),
                Err(e) => {
                    // A malformed entry would be redelivered forever; log it loudly.
                    tracing::error!(entry = %sid.id, partition = p, error = %e, "undecodable trigger entry");
                    None
                }
            })
            .collect()
    }
}

/// Subscribes to the change channel and bumps the watch counter per message; after a
/// reconnect it bumps once too, because messages may have been missed meanwhile.
async fn watch_changes(
    client: redis::Client,
    channel: String,
    tx: watch::Sender<u64>,
    stop: CancellationToken,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let connected = async {
            let mut ps = client.get_async_pubsub().await?;
            ps.subscribe(&channel).await?;
            redis::RedisResult::Ok(ps)
        };
        let ps = tokio::select! {
            () = stop.cancelled() => return,
            r = connected => r,
        };
        match ps {
            Ok(mut ps) => {
                backoff = Duration::from_millis(100);
                tx.send_modify(|v| *v += 1);
                let mut msgs = ps.on_message();
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        m = msgs.next() => match m {
                            Some(_) => tx.send_modify(|v| *v += 1),
                            None => break,
                        },
                    }
                }
                tracing::warn!("store change subscription lost; reconnecting");
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot subscribe to store changes; retrying");
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

fn decode_job(
    rec: Option<String>,
    version: Option<u64>,
    armed: Option<(Millis, Millis)>,
) -> Result<Option<JobRecord>> {
    let Some(rec) = rec else { return Ok(None) };
    let mut job: JobRecord = serde_json::from_str(&rec).map_err(corrupt)?;
    job.version = version.ok_or_else(|| corrupt("job without version"))?;
    job.next_fire = armed.map(|(due, jit)| Arm {
        planned: due - jit,
        due,
    });
    Ok(Some(job))
}

fn decode_trigger(sid: &StreamId) -> std::result::Result<Trigger, String> {
    let json: String = sid
        .get("t")
        .ok_or_else(|| "entry without trigger".to_owned())?;
    let mut t: Trigger = serde_json::from_str(&json).map_err(|e| e.to_string())?;
    if let Some(at) = sid.get::<Millis>("at") {
        t.triggered_at = at;
    }
    Ok(t)
}

/// The record as persisted: `next_fire` lives in its own fields, written by claims.
fn encode_job(job: &JobRecord) -> Result<String> {
    let mut stored = job.clone();
    stored.next_fire = None;
    serde_json::to_string(&stored).map_err(corrupt)
}

/// (pending score, jitter offset) of an arm, as script arguments.
fn arm_args(arm: Option<Arm>) -> (String, String) {
    match arm {
        Some(a) => (a.due.to_string(), (a.due - a.planned).to_string()),
        None => (String::new(), "0".to_owned()),
    }
}

/// Splits a pending member "<version>:<jitter offset>:<job_id>".
fn split_member(member: &str) -> Result<(u64, Millis, &str)> {
    let mut parts = member.splitn(3, ':');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(v), Some(j), Some(id)) => Ok((v.parse().map_err(corrupt)?, parse_i64(j)?, id)),
        _ => Err(corrupt(format!("bad pending member {member:?}"))),
    }
}

/// An outcome as the finish script reads it (payload bytes as base64, like records).
#[derive(serde::Serialize)]
struct OutcomeJson {
    state: RunState,
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<String>,
    error_code: String,
    error_message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    started_at: Option<Millis>,
    #[serde(skip_serializing_if = "Option::is_none")]
    finished_at: Option<Millis>,
}

impl From<Outcome> for OutcomeJson {
    fn from(o: Outcome) -> Self {
        use base64::Engine as _;
        Self {
            state: o.state,
            output: o
                .output
                .map(|b| base64::engine::general_purpose::STANDARD.encode(b)),
            error_code: o.error_code,
            error_message: o.error_message,
            started_at: o.started_at,
            finished_at: o.finished_at,
        }
    }
}

fn unknown_run() -> Transition {
    Transition {
        applied: Applied::No("unknown run".to_owned()),
        run: None,
        revoked: Vec::new(),
        next_serial: None,
    }
}

fn revocation(sid: &str, node: &str, token: &str, reason: &str) -> Result<Option<Revocation>> {
    if sid.is_empty() {
        return Ok(None);
    }
    Ok(Some(Revocation {
        schedule_id: sid.to_owned(),
        node_id: node.to_owned(),
        token: token.parse().map_err(corrupt)?,
        reason: reason.to_owned(),
    }))
}

/// Revocations as the run scripts list them: 4 fields each (sid, node, token, reason).
fn revocations(fields: &[String]) -> Result<Vec<Revocation>> {
    fields
        .chunks(4)
        .map(|f| match f {
            [sid, node, token, reason] => revocation(sid, node, token, reason),
            _ => Err(corrupt(format!("a revocation of {} fields", f.len()))),
        })
        .collect::<Result<Vec<_>>>()
        .map(|v| v.into_iter().flatten().collect())
}

/// Parses the reply every transition script gives: {applied, reason, run_json,
/// next_serial, then 4 fields per revoked lease}.
fn transition(r: &[String]) -> Result<Transition> {
    let [applied, reason, json, next, rest @ ..] = r else {
        return Err(corrupt(format!("run script answered {r:?}")));
    };
    Ok(Transition {
        applied: match applied.as_str() {
            "yes" => Applied::Yes,
            "already" => Applied::Already,
            _ => Applied::No(reason.clone()),
        },
        run: if json.is_empty() {
            None
        } else {
            Some(serde_json::from_str(json).map_err(corrupt)?)
        },
        revoked: revocations(rest)?,
        next_serial: (!next.is_empty()).then(|| next.clone()),
    })
}

/// A breaker as the breaker scripts answer it: (state, until).
fn breaker(state: &str, until: &str) -> Result<BreakerState> {
    match state {
        "closed" => Ok(BreakerState::Closed),
        "open" => Ok(BreakerState::Open {
            until: parse_i64(until)?,
        }),
        "half_open" => Ok(BreakerState::HalfOpen),
        other => Err(corrupt(format!("breaker state {other:?}"))),
    }
}

fn parse_i64(v: &str) -> Result<i64> {
    v.parse().map_err(|e| corrupt(format!("{v:?}: {e}")))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn split_entry(entry_id: &str) -> Result<(u32, &str)> {
    let (p, id) = entry_id
        .split_once('/')
        .ok_or_else(|| corrupt(format!("bad entry id {entry_id:?}")))?;
    Ok((p.parse().map_err(corrupt)?, id))
}

fn is_nogroup(e: &redis::RedisError) -> bool {
    e.code() == Some("NOGROUP")
}

#[async_trait]
impl Store for RedisStore {
    fn backend(&self) -> &'static str {
        "redis"
    }

    fn partitions(&self) -> u32 {
        self.inner.partitions
    }

    async fn now(&self) -> Result<Millis> {
        let mut c = self.conn().await?;
        let (s, us): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut c)
            .await
            .map_err(unavailable)?;
        Ok(s * 1000 + us / 1000)
    }

    fn job_changes(&self) -> watch::Receiver<u64> {
        self.inner.changes.clone()
    }

    async fn create_job(&self, job: JobRecord) -> Result<JobRecord> {
        let id = job.spec.id.clone();
        let p = self.part(&id);
        let mut job = job;
        job.version = 1;
        if job.paused {
            // A paused job has no pending member, whatever the record carried.
            job.next_fire = None;
        }
        let (due, jit) = arm_args(job.next_fire);
        let mut c = self.conn().await?;
        let r: String = self
            .inner
            .scripts
            .create_job
            .arg(self.pfx(p))
            .arg(&id)
            .arg(encode_job(&job)?)
            .arg(if job.paused { "1" } else { "0" })
            .arg(due)
            .arg(jit)
            .arg(self.channel())
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        match r.as_str() {
            "ok" => Ok(job),
            "exists" => Err(Error::JobExists(id)),
            other => Err(corrupt(format!("create_job answered {other:?}"))),
        }
    }

    async fn update_job(&self, job: JobRecord, expected_version: u64) -> Result<JobRecord> {
        let id = job.spec.id.clone();
        let p = self.part(&id);
        let mut job = job;
        job.version = expected_version + 1;
        if job.paused {
            job.next_fire = None;
        }
        let (due, jit) = arm_args(job.next_fire);
        let mut c = self.conn().await?;
        let r: Vec<String> = self
            .inner
            .scripts
            .update_job
            .arg(self.pfx(p))
            .arg(&id)
            .arg(expected_version)
            .arg(encode_job(&job)?)
            .arg(if job.paused { "1" } else { "0" })
            .arg(due)
            .arg(jit)
            .arg(self.channel())
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        match r.first().map(String::as_str) {
            Some("ok") => Ok(job),
            Some("notfound") => Err(Error::JobNotFound(id)),
            Some("conflict") => Err(Error::VersionConflict {
                job_id: id,
                expected: expected_version,
                current: r.get(1).and_then(|v| v.parse().ok()).unwrap_or(0),
            }),
            other => Err(corrupt(format!("update_job answered {other:?}"))),
        }
    }

    async fn delete_job(&self, job_id: &str) -> Result<()> {
        let p = self.part(job_id);
        let mut c = self.conn().await?;
        let removed: i64 = self
            .inner
            .scripts
            .delete_job
            .arg(self.pfx(p))
            .arg(job_id)
            .arg(self.channel())
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        if removed == 1 {
            Ok(())
        } else {
            Err(Error::JobNotFound(job_id.to_owned()))
        }
    }

    async fn get_job(&self, job_id: &str) -> Result<Option<JobRecord>> {
        self.read_job(job_id).await
    }

    async fn get_jobs(&self, job_ids: &[String]) -> Result<Vec<JobRecord>> {
        let mut by_partition: std::collections::BTreeMap<u32, Vec<String>> = Default::default();
        for id in job_ids {
            by_partition
                .entry(self.part(id))
                .or_default()
                .push(id.clone());
        }
        let mut out = Vec::with_capacity(job_ids.len());
        for (p, ids) in by_partition {
            out.extend(self.read_jobs(p, &ids).await?);
        }
        Ok(out)
    }

    async fn list_jobs(&self, cursor: Option<&str>, limit: usize) -> Result<Page<JobRecord>> {
        // Cursor: "<partition>:<last job id>" — jobs are listed partition by partition,
        // by id within one.
        let (mut p, mut after) = match cursor.and_then(|c| c.split_once(':')) {
            Some((p, id)) => (p.parse::<u32>().map_err(corrupt)?, id.to_owned()),
            None => (0, String::new()),
        };
        let limit = limit.max(1);
        let mut items = Vec::new();
        let mut c = self.conn().await?;
        while p < self.inner.partitions && items.len() < limit {
            let min = if after.is_empty() {
                "-".to_owned()
            } else {
                format!("({after}")
            };
            let want = limit - items.len();
            let ids: Vec<String> = redis::cmd("ZRANGEBYLEX")
                .arg(self.key(p, "jobs"))
                .arg(min)
                .arg("+")
                .arg("LIMIT")
                .arg(0)
                .arg(want)
                .query_async(&mut c)
                .await
                .map_err(unavailable)?;
            let full = ids.len() == want;
            if let Some(last) = ids.last() {
                after = last.clone();
            }
            items.extend(self.read_jobs(p, &ids).await?);
            if !full {
                p += 1;
                after.clear();
            }
        }
        let next_cursor = (p < self.inner.partitions).then(|| format!("{p}:{after}"));
        Ok(Page { items, next_cursor })
    }

    async fn due_fires(&self, partition: u32, limit: usize) -> Result<DueBatch> {
        let mut c = self.conn().await?;
        let (now, rows, next): (String, Vec<String>, Option<String>) = self
            .inner
            .scripts
            .due_fires
            .arg(self.pfx(partition))
            .arg(limit)
            .arg(&self.inner.opts.instance_id)
            .arg(u64::try_from(self.inner.opts.partition_lease.as_millis()).unwrap_or(0))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        let mut fires = Vec::with_capacity(rows.len() / 2);
        for pair in rows.chunks(2) {
            let [member, due] = pair else {
                return Err(corrupt("odd due-fires reply"));
            };
            let (version, jit, job_id) = split_member(member)?;
            let due = parse_i64(due)?;
            fires.push(DueFire {
                job_id: job_id.to_owned(),
                due,
                planned: due - jit,
                version,
            });
        }
        Ok(DueBatch {
            now: parse_i64(&now)?,
            fires,
            next_due: next.as_deref().map(parse_i64).transpose()?,
        })
    }

    async fn claim_fires(&self, partition: u32, claims: Vec<FireClaim>) -> Result<ClaimOutcome> {
        let mut inv = self.inner.scripts.claim_fires.prepare_invoke();
        inv.arg(self.pfx(partition))
            .arg(self.channel())
            .arg(claims.len());
        for claim in &claims {
            debug_assert_eq!(self.part(&claim.job_id), partition);
            let (next_due, jit) = match claim.next {
                Some(a) => (a.due.to_string(), (a.due - a.planned).to_string()),
                None => (String::new(), String::new()),
            };
            inv.arg(&claim.job_id)
                .arg(claim.expected_due)
                .arg(claim.expected_version)
                .arg(jit)
                .arg(next_due)
                .arg(claim.triggers.len());
            for t in &claim.triggers {
                inv.arg(serde_json::to_string(t).map_err(corrupt)?);
            }
        }
        let mut c = self.conn().await?;
        let (now, results, next): (String, Vec<String>, Option<String>) =
            inv.invoke_async(&mut c).await.map_err(unavailable)?;
        let results = results
            .iter()
            .map(|r| match r.as_str() {
                "ok" => Ok(ClaimResult::Claimed),
                "moved" => Ok(ClaimResult::Moved),
                "version" => Ok(ClaimResult::VersionChanged),
                "gone" => Ok(ClaimResult::Gone),
                other => Err(corrupt(format!("claim answered {other:?}"))),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ClaimOutcome {
            now: parse_i64(&now)?,
            results,
            next_due: next.as_deref().map(parse_i64).transpose()?,
        })
    }

    async fn enqueue_manual(
        &self,
        trigger: Trigger,
        idempotency_key: Option<&str>,
    ) -> Result<Enqueued> {
        let p = self.part(&trigger.job_id);
        let sid = trigger.schedule_id();
        let mut c = self.conn().await?;
        let r: Vec<String> = self
            .inner
            .scripts
            .enqueue_manual
            .arg(self.pfx(p))
            .arg(&trigger.job_id)
            .arg(&sid)
            .arg(serde_json::to_string(&trigger).map_err(corrupt)?)
            .arg(idempotency_key.unwrap_or(""))
            .arg(ms(self.inner.opts.idempotency_ttl))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        match (r.first().map(String::as_str), r.get(1)) {
            (Some("ok"), Some(sid)) => Ok(Enqueued {
                schedule_id: sid.clone(),
                duplicate: false,
            }),
            (Some("dup"), Some(sid)) => Ok(Enqueued {
                schedule_id: sid.clone(),
                duplicate: true,
            }),
            (Some("notfound"), _) => Err(Error::JobNotFound(trigger.job_id)),
            other => Err(corrupt(format!("enqueue_manual answered {other:?}"))),
        }
    }

    async fn read_triggers(
        &self,
        consumer: &str,
        max: usize,
        block: Duration,
    ) -> Result<Vec<Delivery>> {
        let keys: Vec<String> = (0..self.inner.partitions)
            .map(|p| self.key(p, "triggers"))
            .collect();
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(GROUP)
            .arg(consumer)
            .arg("COUNT")
            .arg(max.max(1))
            .arg("BLOCK")
            .arg(ms(block))
            .arg("STREAMS")
            .arg(&keys);
        for _ in &keys {
            cmd.arg(">");
        }
        let mut c = self.conn().await?;
        let reply: redis::RedisResult<Option<StreamReadReply>> = cmd.query_async(&mut c).await;
        let reply = match reply {
            Ok(r) => r,
            Err(e) if is_nogroup(&e) => {
                self.recover_groups().await?;
                return Ok(Vec::new());
            }
            Err(e) => return Err(unavailable(e)),
        };
        let mut out = Vec::new();
        for sk in reply.map(|r| r.keys).unwrap_or_default() {
            let Some(p) = keys.iter().position(|k| *k == sk.key) else {
                continue;
            };
            out.extend(self.deliveries(p as u32, sk.ids));
        }
        Ok(out)
    }

    async fn reclaim_triggers(
        &self,
        consumer: &str,
        min_idle: Duration,
        max: usize,
    ) -> Result<Vec<Delivery>> {
        let mut out = Vec::new();
        let mut c = self.conn().await?;
        for p in 0..self.inner.partitions {
            if out.len() >= max {
                break;
            }
            let reply: redis::RedisResult<StreamAutoClaimReply> = redis::cmd("XAUTOCLAIM")
                .arg(self.key(p, "triggers"))
                .arg(GROUP)
                .arg(consumer)
                .arg(u64::try_from(min_idle.as_millis()).unwrap_or(u64::MAX))
                .arg("0-0")
                .arg("COUNT")
                .arg(max - out.len())
                .query_async(&mut c)
                .await;
            match reply {
                Ok(r) => out.extend(self.deliveries(p, r.claimed)),
                Err(e) if is_nogroup(&e) => {
                    drop(c);
                    self.recover_groups().await?;
                    return Ok(out);
                }
                Err(e) => return Err(unavailable(e)),
            }
        }
        Ok(out)
    }

    async fn ack_trigger(&self, entry_id: &str) -> Result<()> {
        let (p, id) = split_entry(entry_id)?;
        let mut c = self.conn().await?;
        let r: redis::RedisResult<i64> = c.xack(self.key(p, "triggers"), GROUP, &[id]).await;
        match r {
            Ok(_) => Ok(()),
            // The group vanished with a Redis restart: nothing is pending any more.
            Err(e) if is_nogroup(&e) => Ok(()),
            Err(e) => Err(unavailable(e)),
        }
    }

    async fn trim_triggers(&self, older_than: Millis) -> Result<()> {
        let mut c = self.conn().await?;
        for p in 0..self.inner.partitions {
            let r: redis::RedisResult<i64> = self
                .inner
                .scripts
                .trim_triggers
                .arg(self.pfx(p))
                .arg(GROUP)
                .arg(older_than.max(0))
                .invoke_async(&mut c)
                .await;
            match r {
                Ok(_) => {}
                Err(e) if is_nogroup(&e) => {}
                Err(e) => return Err(unavailable(e)),
            }
        }
        Ok(())
    }

    async fn record_run(&self, run: RunRecord) -> Result<Recorded> {
        let p = self.part(&run.job_id);
        let mut c = self.conn().await?;
        let (created, json): (i64, String) = self
            .inner
            .scripts
            .record_run
            .arg(self.pfx(p))
            .arg(&run.job_id)
            .arg(&run.schedule_id)
            .arg(serde_json::to_string(&run).map_err(corrupt)?)
            .arg(run.scheduled_at)
            .arg(ms(self.inner.opts.run_retention))
            .arg(self.inner.opts.max_runs_per_job.max(1))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        Ok(Recorded {
            run: serde_json::from_str(&json).map_err(corrupt)?,
            created: created == 1,
        })
    }

    async fn get_run(&self, schedule_id: &str) -> Result<Option<RunRecord>> {
        let Some((job_id, _)) = split_schedule_id(schedule_id) else {
            return Ok(None);
        };
        let p = self.part(job_id);
        let mut c = self.conn().await?;
        let json: Option<String> = c
            .get(self.key(p, &format!("run:{schedule_id}")))
            .await
            .map_err(unavailable)?;
        json.map(|j| serde_json::from_str(&j).map_err(corrupt))
            .transpose()
    }

    async fn list_runs(&self, job_id: &str, query: RunQuery) -> Result<Page<RunRecord>> {
        // Keyset paging. Cursor: "<scheduled_at>:<schedule_id>" of the last run handed
        // out; the next page starts strictly after it in (score desc, member desc)
        // order, so runs recorded meanwhile never repeat or shift a listing.
        let p = self.part(job_id);
        let index = self.key(p, &format!("runs:{job_id}"));
        let limit = query.limit.max(1);
        let min = query
            .from
            .map_or_else(|| "-inf".to_owned(), |f| f.to_string());
        let mut c = self.conn().await?;
        let (max, skip) = match query.cursor.as_deref().and_then(|c| c.split_once(':')) {
            Some((score, member)) => {
                let score = parse_i64(score)?;
                let ties: Vec<String> = c
                    .zrevrangebyscore(&index, score, score)
                    .await
                    .map_err(unavailable)?;
                let skip = ties.iter().filter(|m| m.as_str() >= member).count();
                (score.to_string(), skip)
            }
            None => (
                query
                    .to
                    .map_or_else(|| "+inf".to_owned(), |t| format!("({t}")),
                0,
            ),
        };
        let rows: Vec<(String, i64)> = redis::cmd("ZREVRANGEBYSCORE")
            .arg(&index)
            .arg(max)
            .arg(min)
            .arg("WITHSCORES")
            .arg("LIMIT")
            .arg(skip)
            .arg(limit)
            .query_async(&mut c)
            .await
            .map_err(unavailable)?;
        let next_cursor = match rows.last() {
            Some((member, score)) if rows.len() == limit => Some(format!("{score}:{member}")),
            _ => None,
        };
        if rows.is_empty() {
            return Ok(Page {
                items: Vec::new(),
                next_cursor,
            });
        }
        let keys: Vec<String> = rows
            .iter()
            .map(|(id, _)| self.key(p, &format!("run:{id}")))
            .collect();
        let jsons: Vec<Option<String>> = redis::cmd("MGET")
            .arg(&keys)
            .query_async(&mut c)
            .await
            .map_err(unavailable)?;
        // Records past their retention are gone while their index entry lingers
        // until record_run sweeps it: skip them.
        let items = jsons
            .into_iter()
            .flatten()
            .map(|j| serde_json::from_str(&j).map_err(corrupt))
            .collect::<Result<Vec<RunRecord>>>()?;
        Ok(Page { items, next_cursor })
    }

    async fn begin_run(&self, run: RunRecord, route_grace: Duration) -> Result<Begun> {
        let p = self.part(&run.job_id);
        let json = serde_json::to_string(&run).map_err(corrupt)?;
        let mut c = self.conn().await?;
        let r: Vec<String> = self
            .inner
            .scripts
            .begin_run
            .arg(self.pfx(p))
            .arg(self.nodes_prefix())
            .arg(&run.job_id)
            .arg(&run.schedule_id)
            .arg(json)
            .arg(run.scheduled_at)
            .arg(ms(self.inner.opts.run_retention))
            .arg(self.inner.opts.max_runs_per_job)
            .arg(ms(route_grace))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        let [created, json, rest @ ..] = r.as_slice() else {
            return Err(corrupt(format!("begin_run answered {r:?}")));
        };
        let revoked = revocations(rest)?;
        Ok(Begun {
            run: serde_json::from_str(json).map_err(corrupt)?,
            created: created == "1",
            revoked,
        })
    }

    async fn assign_run(
        &self,
        schedule_id: &str,
        attempt: u32,
        node: &NodeSlot,
        terms: LeaseTerms,
    ) -> Result<Assigned> {
        let Some((job_id, _)) = split_schedule_id(schedule_id) else {
            return Ok(Assigned::NotWaiting(None));
        };
        let p = self.part(job_id);
        let mut c = self.conn().await?;
        let r: Vec<String> = self
            .inner
            .scripts
            .assign_run
            .arg(self.pfx(p))
            .arg(self.nodes_prefix())
            .arg(schedule_id)
            .arg(attempt)
            .arg(&node.node_id)
            .arg(node.max_concurrency)
            .arg(ms(terms.ttl))
            .arg(ms(terms.confirm_within))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        match r.as_slice() {
            [ok, json] if ok == "ok" => Ok(Assigned::Granted(
                serde_json::from_str(json).map_err(corrupt)?,
            )),
            [full] if full == "full" => Ok(Assigned::NodeFull),
            [nw, json] if nw == "not_waiting" => Ok(Assigned::NotWaiting(if json.is_empty() {
                None
            } else {
                Some(serde_json::from_str(json).map_err(corrupt)?)
            })),
            other => Err(corrupt(format!("assign_run answered {other:?}"))),
        }
    }

    async fn fan_out(
        &self,
        schedule_id: &str,
        attempt: u32,
        shards: u32,
        route_grace: Duration,
    ) -> Result<FannedOut> {
        let Some((job_id, _)) = split_schedule_id(schedule_id) else {
            return Ok(FannedOut::NotWaiting(None));
        };
        let p = self.part(job_id);
        let mut c = self.conn().await?;
        let r: Vec<String> = self
            .inner
            .scripts
            .fan_out
            .arg(self.pfx(p))
            .arg(self.nodes_prefix())
            .arg(schedule_id)
            .arg(attempt)
            .arg(shards)
            .arg(ms(route_grace))
            .arg(ms(self.inner.opts.run_retention))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        let decode = |j: &String| serde_json::from_str::<RunRecord>(j).map_err(corrupt);
        match r.as_slice() {
            [yes, _, parent, shards @ ..] if yes == "yes" => Ok(FannedOut::Shards {
                parent: decode(parent)?,
                shards: shards.iter().map(decode).collect::<Result<_>>()?,
            }),
            [_, _, json] => Ok(FannedOut::NotWaiting(if json.is_empty() {
                None
            } else {
                Some(decode(json)?)
            })),
            other => Err(corrupt(format!("fan_out answered {other:?}"))),
        }
    }

    async fn mark_started(&self, schedule_id: &str, token: u64) -> Result<Transition> {
        let script = &self.inner.scripts.mark_started;
        self.run_transition(script, schedule_id, &[token.to_string()])
            .await
    }

    async fn renew_leases(
        &self,
        node_id: &str,
        held: &[Held],
        ttl: Duration,
    ) -> Result<Vec<Option<i64>>> {
        let mut out = vec![None; held.len()];
        // One script call per partition the held runs live in.
        let mut by_part: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
        for (i, h) in held.iter().enumerate() {
            if let Some((job_id, _)) = split_schedule_id(&h.schedule_id) {
                by_part.entry(self.part(job_id)).or_default().push(i);
            }
        }
        let mut c = self.conn().await?;
        for (p, idx) in by_part {
            let mut inv = self.inner.scripts.renew_leases.prepare_invoke();
            inv.arg(self.pfx(p)).arg(node_id).arg(ms(ttl));
            for &i in &idx {
                inv.arg(&held[i].schedule_id).arg(held[i].token.to_string());
            }
            let r: Vec<i64> = inv.invoke_async(&mut c).await.map_err(unavailable)?;
            for (&i, remaining) in idx.iter().zip(r) {
                out[i] = (remaining >= 0).then_some(remaining);
            }
        }
        Ok(out)
    }

    async fn finish_run(
        &self,
        schedule_id: &str,
        by: Finisher,
        outcome: Outcome,
    ) -> Result<Transition> {
        let (kind, value) = match by {
            Finisher::Token(t) => ("token", t.to_string()),
            Finisher::Waiting { attempt } => ("waiting", attempt.to_string()),
        };
        let json = serde_json::to_string(&OutcomeJson::from(outcome)).map_err(corrupt)?;
        let script = &self.inner.scripts.finish_run;
        self.run_transition(script, schedule_id, &[kind.to_owned(), value, json])
            .await
    }

    async fn due_runs(&self, partition: u32, limit: usize) -> Result<Vec<String>> {
        let mut c = self.conn().await?;
        self.inner
            .scripts
            .due_runs
            .arg(self.pfx(partition))
            .arg(limit)
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)
    }

    async fn expire_run(&self, schedule_id: &str, route_grace: Duration) -> Result<Transition> {
        let script = &self.inner.scripts.expire_run;
        self.run_transition(script, schedule_id, &[ms(route_grace).to_string()])
            .await
    }

    async fn cancel_run(&self, schedule_id: &str, reason: &str) -> Result<Transition> {
        let script = &self.inner.scripts.cancel_run;
        self.run_transition(script, schedule_id, &[reason.to_owned()])
            .await
    }

    async fn report_progress(
        &self,
        schedule_id: &str,
        token: u64,
        percent: u32,
        message: &str,
    ) -> Result<bool> {
        let Some((job_id, _)) = split_schedule_id(schedule_id) else {
            return Ok(false);
        };
        let p = self.part(job_id);
        let mut c = self.conn().await?;
        let r: i64 = self
            .inner
            .scripts
            .report_progress
            .arg(self.pfx(p))
            .arg(schedule_id)
            .arg(token.to_string())
            .arg(percent)
            .arg(message)
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        Ok(r == 1)
    }

    async fn append_logs(
        &self,
        schedule_id: &str,
        token: u64,
        lines: Vec<LogLine>,
        max_bytes: usize,
    ) -> Result<bool> {
        let Some((job_id, _)) = split_schedule_id(schedule_id) else {
            return Ok(false);
        };
        if lines.is_empty() {
            return Ok(true);
        }
        let p = self.part(job_id);
        let mut inv = self.inner.scripts.append_logs.prepare_invoke();
        inv.arg(self.pfx(p))
            .arg(schedule_id)
            .arg(token.to_string())
            .arg(max_bytes);
        for l in &lines {
            inv.arg(serde_json::to_string(l).map_err(corrupt)?);
        }
        let mut c = self.conn().await?;
        let r: i64 = inv.invoke_async(&mut c).await.map_err(unavailable)?;
        Ok(r == 1)
    }

    async fn read_logs(&self, schedule_id: &str, after: u64, limit: usize) -> Result<Vec<LogLine>> {
        let Some((job_id, _)) = split_schedule_id(schedule_id) else {
            return Ok(Vec::new());
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        let key = self.key(self.part(job_id), &format!("logs:{schedule_id}"));
        let mut c = self.conn().await?;
        // Sequence numbers are contiguous within the list, so the first line's seq
        // says where `after` sits.
        let first: Option<String> = c.lindex(&key, 0).await.map_err(unavailable)?;
        let Some(first) = first else {
            return Ok(Vec::new());
        };
        let first: LogLine = serde_json::from_str(&first).map_err(corrupt)?;
        let start = isize::try_from(after.saturating_sub(first.seq.saturating_sub(1)))
            .unwrap_or(isize::MAX);
        let stop = start.saturating_add(isize::try_from(limit).unwrap_or(isize::MAX) - 1);
        let rows: Vec<String> = c.lrange(&key, start, stop).await.map_err(unavailable)?;
        rows.iter()
            .map(|j| serde_json::from_str(j).map_err(corrupt))
            .filter(|l: &Result<LogLine>| l.as_ref().map_or(true, |l| l.seq > after))
            .collect()
    }

    async fn push_inbox(&self, instance: &str, message: Vec<u8>) -> Result<()> {
        let key = format!("{}inbox:{instance}", self.nodes_prefix());
        let mut c = self.conn().await?;
        let _: () = redis::pipe()
            .lpush(&key, message)
            .ignore()
            .pexpire(&key, 60_000)
            .ignore()
            .query_async(&mut c)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn pop_inbox(&self, instance: &str, max: usize, block: Duration) -> Result<Vec<Vec<u8>>> {
        let key = format!("{}inbox:{instance}", self.nodes_prefix());
        let Some(count) = std::num::NonZeroUsize::new(max) else {
            return Ok(Vec::new());
        };
        let mut c = self.conn().await?;
        let got: Option<Vec<Vec<u8>>> = c.rpop(&key, Some(count)).await.map_err(unavailable)?;
        if let Some(got) = got.filter(|g| !g.is_empty()) {
            return Ok(got);
        }
        if block.is_zero() {
            return Ok(Vec::new());
        }
        let one: Option<(String, Vec<u8>)> = c
            .brpop(&key, block.as_secs_f64())
            .await
            .map_err(unavailable)?;
        let Some((_, first)) = one else {
            return Ok(Vec::new());
        };
        let mut out = vec![first];
        if let Some(more) = std::num::NonZeroUsize::new(max - 1) {
            let rest: Option<Vec<Vec<u8>>> = c.rpop(&key, Some(more)).await.map_err(unavailable)?;
            out.extend(rest.unwrap_or_default());
        }
        Ok(out)
    }

    async fn upsert_node(&self, node: NodeRecord, ttl: Duration) -> Result<()> {
        let mut c = self.conn().await?;
        let json = serde_json::to_string(&node).map_err(corrupt)?;
        let _: i64 = self
            .inner
            .scripts
            .upsert_node
            .arg(self.nodes_prefix())
            .arg(&node.node_id)
            .arg(json)
            .arg(&node.instance)
            .arg(ms(ttl))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn remove_node(&self, node_id: &str, instance: &str) -> Result<bool> {
        let mut c = self.conn().await?;
        let removed: i64 = self
            .inner
            .scripts
            .remove_node
            .arg(self.nodes_prefix())
            .arg(node_id)
            .arg(instance)
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        Ok(removed == 1)
    }

    async fn list_nodes(&self, group: Option<&str>) -> Result<Vec<NodeRecord>> {
        let prefix = self.nodes_prefix();
        let mut c = self.conn().await?;
        let mut ids: Vec<String> = c
            .smembers(format!("{prefix}ids"))
            .await
            .map_err(unavailable)?;
        ids.sort();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.cmd("HMGET")
                .arg(format!("{prefix}node:{id}"))
                .arg("rec")
                .arg("hb");
            pipe.cmd("SCARD").arg(format!("{prefix}busy:{id}"));
        }
        let rows: Vec<((Option<String>, Option<Millis>), u32)> = {
            let flat: Vec<redis::Value> = pipe.query_async(&mut c).await.map_err(unavailable)?;
            flat.chunks(2)
                .map(|pair| match pair {
                    [rec, busy] => Ok((
                        redis::from_redis_value(rec.clone()).map_err(unavailable)?,
                        redis::from_redis_value(busy.clone()).map_err(unavailable)?,
                    )),
                    _ => Err(corrupt("list_nodes: an odd reply")),
                })
                .collect::<Result<_>>()?
        };
        let mut out = Vec::new();
        let mut gone = Vec::new();
        for (id, (row, leased)) in ids.iter().zip(rows) {
            match row {
                (Some(j), hb) => {
                    let mut node: NodeRecord = serde_json::from_str(&j).map_err(corrupt)?;
                    node.last_heartbeat = hb.unwrap_or(node.last_heartbeat);
                    node.leased = leased;
                    if group.is_none_or(|g| node.group == g) {
                        out.push(node);
                    }
                }
                (None, _) => gone.push(id.clone()),
            }
        }
        if !gone.is_empty() {
            // Expired records leave their id behind; forget it (a node that came
            // back meanwhile re-adds its id in the same script that writes it).
            let _: i64 = c
                .srem(format!("{prefix}ids"), &gone)
                .await
                .map_err(unavailable)?;
        }
        Ok(out)
    }

    async fn next_route_counter(&self, job_id: &str) -> Result<u64> {
        let mut c = self.conn().await?;
        let key = format!("{}rr", self.pfx(self.part(job_id)));
        let n: i64 = c.hincr(key, job_id, 1).await.map_err(unavailable)?;
        Ok(u64::try_from(n.saturating_sub(1)).unwrap_or(0))
    }

    async fn create_app(&self, app: AppRecord) -> Result<AppRecord> {
        let json = serde_json::to_string(&app).map_err(corrupt)?;
        let mut c = self.conn().await?;
        let stored: String = self
            .inner
            .scripts
            .create_app
            .arg(self.app_key(&app.app_id))
            .arg(json)
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        if stored.is_empty() {
            return Err(Error::AppExists(app.app_id));
        }
        serde_json::from_str(&stored).map_err(corrupt)
    }

    async fn get_app(&self, app_id: &str) -> Result<Option<AppRecord>> {
        let mut c = self.conn().await?;
        let j: Option<String> = c.get(self.app_key(app_id)).await.map_err(unavailable)?;
        j.map(|j| serde_json::from_str(&j).map_err(corrupt))
            .transpose()
    }

    async fn rotate_app_secret(
        &self,
        app_id: &str,
        secret: &str,
        overlap: Duration,
    ) -> Result<AppRecord> {
        let mut c = self.conn().await?;
        let stored: String = self
            .inner
            .scripts
            .rotate_app_secret
            .arg(self.app_key(app_id))
            .arg(secret)
            .arg(duration_ms(overlap))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        if stored.is_empty() {
            return Err(Error::AppNotFound(app_id.to_owned()));
        }
        serde_json::from_str(&stored).map_err(corrupt)
    }

    async fn due_deliveries(&self, partition: u32, limit: usize) -> Result<Vec<String>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut c = self.conn().await?;
        self.inner
            .scripts
            .due_deliveries
            .arg(self.pfx(partition))
            .arg(limit)
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)
    }

    async fn claim_delivery(
        &self,
        schedule_id: &str,
        lease: Duration,
    ) -> Result<Option<WebhookDelivery>> {
        let Some((job_id, _)) = split_schedule_id(schedule_id) else {
            return Ok(None);
        };
        let mut c = self.conn().await?;
        let r: Vec<String> = self
            .inner
            .scripts
            .claim_delivery
            .arg(self.pfx(self.part(job_id)))
            .arg(schedule_id)
            .arg(ms(lease))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        match r.as_slice() {
            [] => Ok(None),
            [job_id, url, body, attempts, created_at, token, now] => Ok(Some(WebhookDelivery {
                schedule_id: schedule_id.to_owned(),
                job_id: job_id.clone(),
                url: url.clone(),
                body: body.clone(),
                attempts: attempts.parse().map_err(corrupt)?,
                created_at: parse_i64(created_at)?,
                token: token.parse().map_err(corrupt)?,
                now: parse_i64(now)?,
            })),
            other => Err(corrupt(format!("claim_delivery answered {other:?}"))),
        }
    }

    async fn finish_delivery(
        &self,
        schedule_id: &str,
        token: u64,
        outcome: DeliveryOutcome,
    ) -> Result<Applied> {
        let Some((job_id, _)) = split_schedule_id(schedule_id) else {
            return Ok(Applied::No("unknown delivery".to_owned()));
        };
        let (kind, status, error, at): (&str, u16, String, i64) = match outcome {
            DeliveryOutcome::Delivered { status } => ("delivered", status, String::new(), 0),
            DeliveryOutcome::Retry {
                after,
                status,
                error,
            } => ("retry", status, error, crate::model::duration_ms(after)),
            DeliveryOutcome::Failed { status, error } => ("failed", status, error, 0),
            DeliveryOutcome::Gone => ("gone", 410, GONE_ERROR.to_owned(), 0),
            DeliveryOutcome::Abandon { error } => ("abandon", 0, error, 0),
            DeliveryOutcome::Defer { until } => ("defer", 0, String::new(), until),
        };
        let mut c = self.conn().await?;
        let r: Vec<String> = self
            .inner
            .scripts
            .finish_delivery
            .arg(self.pfx(self.part(job_id)))
            .arg(schedule_id)
            .arg(token.to_string())
            .arg(kind)
            .arg(status)
            .arg(error)
            .arg(at)
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        match r.as_slice() {
            [yes, _] if yes == "yes" => Ok(Applied::Yes),
            [_, reason] => Ok(Applied::No(reason.clone())),
            other => Err(corrupt(format!("finish_delivery answered {other:?}"))),
        }
    }

    async fn breaker_state(&self, destination: &str, probe: Duration) -> Result<BreakerState> {
        let mut c = self.conn().await?;
        let (state, until): (String, String) = self
            .inner
            .scripts
            .breaker_state
            .arg(self.breakers_prefix())
            .arg(destination)
            .arg(ms(probe))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        breaker(&state, &until)
    }

    async fn record_breaker(
        &self,
        destination: &str,
        success: bool,
        threshold: u32,
        cool_down: Duration,
    ) -> Result<BreakerUpdate> {
        let mut c = self.conn().await?;
        let (state, until, changed): (String, String, String) = self
            .inner
            .scripts
            .record_breaker
            .arg(self.breakers_prefix())
            .arg(destination)
            .arg(if success { "1" } else { "0" })
            .arg(threshold.max(1))
            .arg(ms(cool_down))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        Ok(BreakerUpdate {
            state: breaker(&state, &until)?,
            changed: changed == "1",
        })
    }

    async fn check_nonce(&self, app_id: &str, nonce: &str, ttl: Duration) -> Result<bool> {
        let mut c = self.conn().await?;
        let key = format!("{}:{{n}}:nonce:{app_id}:{nonce}", self.inner.prefix);
        let r: Value = redis::cmd("SET")
            .arg(key)
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(ms(ttl))
            .query_async(&mut c)
            .await
            .map_err(unavailable)?;
        Ok(!matches!(r, Value::Nil))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{shared_redis_url, unique_prefix};

    crate::store::conformance::store_conformance_tests!(|opts| async move {
        let url = shared_redis_url().expect("redis-server");
        RedisStore::connect(&url, &unique_prefix("conf"), opts)
            .await
            .expect("connect")
    });

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
    async fn scripts_reload_after_script_flush() {
        let url = shared_redis_url().expect("redis-server");
        let store = RedisStore::connect(&url, &unique_prefix("noscript"), StoreOptions::default())
            .await
            .expect("connect");
        store
            .due_fires(0, 10)
            .await
            .expect("first call loads the script");
        let mut c = raw_connection().await;
        // What a Redis restart does to the script cache: the next EVALSHA gets NOSCRIPT.
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut c)
            .await
            .expect("flush");
        store.due_fires(0, 10).await.expect("reloaded on NOSCRIPT");
    }

    async fn store(name: &str, opts: StoreOptions) -> (RedisStore, String) {
        let url = shared_redis_url().expect("redis-server");
        let prefix = unique_prefix(name);
        let store = RedisStore::connect(&url, &prefix, opts)
            .await
            .expect("connect");
        (store, prefix)
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
        use crate::store::conformance::job;
        let (a, prefix) = store("notify", one_partition()).await;
        let url = shared_redis_url().expect("redis-server");
        let b = RedisStore::connect(&url, &prefix, one_partition())
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
}
