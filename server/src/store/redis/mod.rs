//! The `redis` backend: production, any number of server instances.
//!
//! Owns the key layout, the Lua scripts and the pub/sub watcher. Every decision is one
//! script of `lua/`, a function of one Lua library loaded with `FUNCTION LOAD` (Redis 7)
//! and called with `FCALL`, loaded again when a restarted Redis has lost it
//! (`functions`).
//! A job lives in partition `p = partition_of(job_id, P)`; every key of a partition
//! carries the hash tag `{p}`, so each script touches one cluster slot:
//!
//! ```text
//! <prefix>:meta                         schema version, partition count
//! <prefix>:{p}:job:<job_id>             hash: rec (compact MessagePack: `encode_job`), version,
//!                                       paused, jit (due − planned),
//!                                       member (its pending member while armed), kept
//!                                       (when a begin last wrote the index's TTL), plain
//!                                       (runs of allow plans may be going outside
//!                                       active:<job_id>: `overlap_candidates`)
//! <prefix>:{p}:jobs                     zset (score 0) of job ids, for listing
//! <prefix>:{p}:pending                  zset "<version>:<jit>:<job_id>" -> due time (ms)
//! <prefix>:{p}:claimer                  instance working the partition (short TTL)
//! <prefix>:{p}:triggers                 stream of triggers, consumer group "dispatch"
//! <prefix>:{p}:idem:<job_id>:<key>      manual-trigger idempotency key -> schedule_id
//! <prefix>:{p}:run:<schedule_id>        run record (MessagePack, fields at their default left out; JSON before schema 2), expires after the retention
//! <prefix>:{p}:runs:<job_id>            zset schedule_id -> scheduled_at: bounded per-job index
//! <prefix>:{p}:lease:<schedule_id>      hash: holder, token, expires
//! <prefix>:{p}:leases                   zset schedule_id -> lease expiry
//! <prefix>:{p}:tokens                   hash: * -> the partition's last fencing token (job_id ->
//!                                       a job's, before: folded into * at its first use)
//! <prefix>:{p}:delivery:<schedule_id>   webhook outbox entry (hash: job_id, url, body,
//!                                       created_at, attempts, token, in_flight, due, ra, rn),
//!                                       and the outcomes so far (status, error, ev, hn), read
//!                                       over the run's record; once delivered or given up
//!                                       (done) only those, as long as the record lives
//!                                       (`outbox:<schedule_id>`, one JSON document, before:
//!                                       moved into the hash when first read)
//! <prefix>:{p}:outbox_due               zset schedule_id -> due (next attempt, or the end of
//!                                       an in-flight claim's lease)
//! <prefix>:{webhooks}:breaker:<dest>    hash: state, until, failures (a day's TTL)
//! <prefix>:{webhooks}:pace:<dest>       zset holder -> end of its slot's lease
//! <prefix>:{webhooks}:wait:<dest>       zset owner refused a slot -> end of its waiting mark
//! <prefix>:{n}:nonce:<app>:<nonce>      replay-protection marker with a TTL
//! <prefix>:{nodes}:node:<node_id>       hash: rec (JSON), inst, hb (store clock); expires with its TTL
//! <prefix>:{nodes}:ids                  set of registered node ids, pruned when listed
//! <prefix>:{nodes}:busy:<node_id>       set of the runs leased to the node (one Redis: the
//!                                       run scripts keep it)
//! <prefix>:{held:<node_id>}             zset schedule_id -> reservation end: the same count
//!                                       in a cluster, kept around the run scripts in a
//!                                       slot per node (`node_slots`)
//! <prefix>:{nodes}:inbox:<instance>     list of messages for the instance's streams
//! <prefix>:{nodes}:instances            zset instance -> end of its last beat (store clock)
//! <prefix>:changes                      pub/sub channel: a job was created or changed
//! ```
//!
//! One file per concern, each implementing the store trait of that concern for
//! `RedisStore`: `jobs` (`JobStore`: jobs, fires, manual triggers), `triggers`
//! (`TriggerQueue`: the trigger streams, instance beats), `runs` (`RunStore`: runs,
//! leases, the run machine, logs), `nodes` (`NodeRegistry` and `Inboxes`: registry,
//! routing counters, inboxes), `outbox` (`Outbox`: webhook outbox, breakers), `apps`
//! (`AppStore`: apps, nonces). The scripts are in `lua/`; this file holds the
//! connections, the scripts' table, the decoding helpers and `StoreMeta`.
//!
//! Connections (`conn`): every command but the two blocking ones goes over one shared,
//! multiplexed connection (redis-rs's `ConnectionManager`, its cluster connection, or
//! under Sentinel a connection to the master of the moment: concurrent commands are
//! pipelined on it, and it reconnects by itself after a Redis restart or failover), so
//! a command costs no pool checkout (a pool's recycle check was a `PING` and an
//! `UNWATCH` round trip per checkout, a fifth of all commands). The
//! blocking trigger read (`XREADGROUP … BLOCK`) and inbox pop (`BRPOP`) would stall
//! that shared pipeline, so each takes a connection of its own from a small pool.
//!
//! Redis Cluster (`redis+cluster://`): every script's keys lie in one slot, and a call
//! names that slot by its first key (or first argument: `functions`), so the client
//! sends it to the master serving it. Two things cross slots on one Redis and are done
//! otherwise in a cluster: a node's count of leased runs (`node_slots`: reserved in a
//! slot of the node's own around the partition's script) and the trigger read over every
//! partition (one reader per partition: `triggers`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use redis::streams::{
    StreamAutoClaimReply, StreamClaimReply, StreamId, StreamPendingCountReply, StreamReadReply,
};
use redis::{AsyncCommands, FromRedisValue, Value};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{
    Admission, AppStore, Applied, Assigned, AuditEvent, AuditLog, Begun, BreakerState,
    BreakerUpdate, ClaimOutcome, ClaimResult, CleanAdmission, Delivery, DeliveryOutcome,
    DeliveryResult, DeliveryTerms, DueBatch, DueEntries, DueFire, Enqueued, Error, FannedOut,
    Finisher, FireClaim, GONE_ERROR, Held, Holder, Inboxes, JobStore, JobWrite, LOG_LINE_COST,
    LeaseTerms, LogLine, NodeRecord, NodeRegistry, NodeRemoved, NodeSlot, Outbox, Outcome, Page,
    Recorded, Registered, Result, Revocation, RunQuery, RunStore, SCHEMA_VERSION, SettleRequest,
    StoreMeta, StoreOptions, Transition, TriggerQueue, UNKNOWN_RUN, WAITING_MARK, WebhookDelivery,
    partition_of,
};
use crate::model::{
    AppRecord, Arm, CallbackState, JobRecord, Millis, RunEvent, RunPlan, RunRecord, RunState,
    Trigger, duration_ms, split_schedule_id,
};
use serde::Deserialize;

mod apps;
mod audit;
mod conn;
mod functions;
mod jobs;
mod node_slots;
mod nodes;
mod outbox;
mod runs;
#[cfg(test)]
mod tests;
mod triggers;

pub use conn::Target;
#[cfg(any(test, feature = "testing"))]
pub use conn::raw_connection;
use conn::{Blocking, BlockingConn, Shared, Subscribers};
use functions::{Activity, Call, Function, Library};

const GROUP: &str = "dispatch";
/// Runs per `grace_leases` call (each one a declared key).
const GRACE_BATCH: usize = 500;
/// Jobs whose index hint a store keeps (`Inner::index_hints`): past it, it forgets all.
const INDEX_HINTS: usize = 100_000;

/// The helpers every function of the library sees, defined once when it is loaded:
/// the prelude, the run machine's helpers, those of the decisions that begin or lease
/// a run, and a webhook destination's breaker and slots.
const PRELUDE: [&str; 4] = [
    include_str!("lua/common.lua"),
    include_str!("lua/runlib.lua"),
    include_str!("lua/beginlib.lua"),
    include_str!("lua/pacelib.lua"),
];

/// The functions that never set a run timer earlier than the partition had nor make a
/// webhook delivery due, so they leave `StoreMeta::activity` alone: the polls, reads,
/// beats and renewals an idle server makes (bumping on them would wake the pollers at
/// every tick), and the job writes (the scheduler has its own change notification).
const QUIET: &[&str] = &[
    "due_fires",
    "claim_fires",
    "due_runs",
    "due_deliveries",
    "read_jobs",
    "apply_jobs",
    "delete_job",
    "enqueue_manual",
    "trim_triggers",
    "upsert_node",
    "beat_instance",
    "forget_instance",
    "renew_leases",
    "report_progress",
    "append_logs",
    "append_logs_many",
    "create_app",
    "rotate_app_secret",
    "append_audit",
    "node_slots",
];

/// The functions whose scripts may reach keys of their slot they do not declare: none.
/// Redis Cluster could not redirect such a call while its slot moves between masters
/// (README lets a resharding run while instances do), so a new function declares every
/// key it touches, asking for the ones it finds in records (`want` in common.lua);
/// every function is checked in the tests to touch only declared keys of its slot
/// (`functions::KEY_CHECK`), and this list may only stay empty.
#[cfg(test)]
const DERIVES_KEYS: &[&str] = &[];

/// The library's functions, one per script of `lua/` (named by its file), each a field
/// of `Scripts`; all but the `QUIET` ones bump the store's activity counter.
macro_rules! scripts {
    ($($name:ident),* $(,)?) => {
        struct Scripts {
            library: Arc<Library>,
            $($name: Function,)*
        }

        /// Every function's name.
        #[cfg(test)]
        const SCRIPT_NAMES: &[&str] = &[$(stringify!($name),)*];

        impl Scripts {
            /// `declare`: the calls declare their keys (`Library::function`).
            fn load(activity: &Activity, declare: bool) -> Self {
                let library = Library::build(
                    &PRELUDE,
                    &[$((stringify!($name), include_str!(concat!("lua/", stringify!($name), ".lua"))),)*],
                );
                let function = |name: &str| {
                    let bumps = !QUIET.contains(&name);
                    library.function(name, bumps.then(|| activity.clone()), declare)
                };
                Self {
                    $($name: function(stringify!($name)),)*
                    library,
                }
            }
        }
    };
}

scripts!(
    apply_jobs,
    delete_job,
    due_fires,
    claim_fires,
    enqueue_manual,
    record_run,
    trim_triggers,
    read_jobs,
    upsert_node,
    remove_node,
    beat_instance,
    forget_instance,
    begin_run,
    assign_run,
    begin_and_assign,
    begin_and_assign_many,
    mark_started,
    mark_started_many,
    take_back_unconfirmed,
    renew_leases,
    shorten_leases,
    finish_run,
    finish_runs,
    due_runs,
    expire_run,
    cancel_run,
    report_progress,
    append_logs,
    append_logs_many,
    fan_out,
    create_app,
    rotate_app_secret,
    due_deliveries,
    claim_deliveries,
    finish_deliveries,
    admit_delivery,
    settle_deliveries,
    grace_leases,
    append_audit,
    node_slots,
);

/// The Redis-backed store. Cheap to clone.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The shared multiplexed connection every non-blocking command uses.
    shared: Shared,
    /// Connections for the blocking commands.
    blocking: Blocking,
    prefix: String,
    partitions: u32,
    opts: StoreOptions,
    scripts: Scripts,
    /// Bumped by the functions that may make a timer or a delivery due sooner.
    activity: watch::Receiver<u64>,
    changes: watch::Receiver<u64>,
    /// Stops the pub/sub watcher (and a cluster's partition readers) when the last
    /// handle is dropped.
    watcher: CancellationToken,
    /// In a cluster, each consumer's partition readers (`triggers`).
    readers: triggers::Readers,
    /// Per job, the index entries its last begin said the next one will likely look
    /// at or drop (`index_new_run` in runlib.lua), declared by that next begin.
    index_hints: std::sync::Mutex<std::collections::HashMap<String, Vec<String>>>,
    /// Round-robin counters kept in memory while no other instance is alive.
    route_counters: nodes::RouteCounters,
    /// The calls declare the keys they touch (a cluster, and every test build; see
    /// `Library::function`): else the keys are not even built.
    declares: bool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.watcher.cancel();
    }
}

fn unavailable(e: impl std::fmt::Display) -> Error {
    Error::Unavailable(e.to_string())
}

/// Whether calls declare their keys on one Redis: only in the tests (which check every
/// call's keys), but for a store they open to run as production does.
#[cfg(test)]
fn declares_on_one_redis() -> bool {
    !tests::opening_as_one_redis()
}

#[cfg(not(test))]
fn declares_on_one_redis() -> bool {
    false
}

fn corrupt(e: impl std::fmt::Display) -> Error {
    Error::Corrupt(e.to_string())
}

#[async_trait]
impl StoreMeta for RedisStore {
    fn backend(&self) -> &'static str {
        "redis"
    }

    fn partitions(&self) -> u32 {
        self.inner.partitions
    }

    fn shared(&self) -> bool {
        true
    }

    fn activity(&self) -> Option<watch::Receiver<u64>> {
        Some(self.inner.activity.clone())
    }

    async fn now(&self) -> Result<Millis> {
        let mut c = self.conn().await?;
        let (s, us): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut c)
            .await
            .map_err(unavailable)?;
        Ok(s * 1000 + us / 1000)
    }
}

impl RedisStore {
    /// Connects, checks or writes the schema record, creates the consumer groups and
    /// starts the change watcher. `prefix` namespaces every key (tests use one per run).
    pub async fn connect(url: &str, prefix: &str, opts: StoreOptions) -> Result<Self> {
        let target = Target::parse(url).map_err(unavailable)?;
        Self::connect_to(&target, prefix, opts).await
    }

    /// [`connect`](Self::connect) to a parsed target (which may carry the TLS
    /// authorities to trust).
    pub async fn connect_to(target: &Target, prefix: &str, opts: StoreOptions) -> Result<Self> {
        let (mut shared, blocking) = target.connect().await?;
        let partitions = Self::init_meta(&mut shared, prefix, opts.partitions).await?;
        let (tx, rx) = watch::channel(0u64);
        let watcher = CancellationToken::new();
        let (activity, activity_rx) = watch::channel(0u64);
        // Only a cluster moves slots; the tests check every call's keys everywhere (but
        // for a store opened `as_one_redis`, which runs as production does there).
        let declare = shared.is_cluster() || declares_on_one_redis();
        let scripts = Scripts::load(&Arc::new(activity), declare);
        scripts
            .library
            .load(&mut shared.clone())
            .await
            .map_err(|e| {
                unavailable(format!(
                    "loading Sundial's Lua functions (Redis 7.0 or newer is needed): {e}"
                ))
            })?;
        tokio::spawn(watch_changes(
            target.subscribers()?,
            format!("{prefix}:changes"),
            tx,
            watcher.clone(),
        ));
        let store = Self {
            inner: Arc::new(Inner {
                shared,
                blocking,
                prefix: prefix.to_owned(),
                partitions,
                opts,
                scripts,
                activity: activity_rx,
                changes: rx,
                watcher,
                readers: Default::default(),
                index_hints: Default::default(),
                route_counters: Default::default(),
                declares: declare,
            }),
        };
        for p in 0..partitions {
            store.ensure_group(p).await?;
        }
        if !store.inner.opts.reopen_lease_grace.is_zero() {
            store.grace_leases_if_alone().await?;
        }
        Ok(store)
    }

    /// When no other instance is alive (every one was down, so nobody renewed or
    /// expired leases meanwhile), gives each held run whose lease lapsed a lease ending
    /// `reopen_lease_grace` from now, as the embedded store does when it is opened.
    /// With another instance alive, leases were served all along and nothing changes.
    async fn grace_leases_if_alone(&self) -> Result<()> {
        let mut c = self.conn().await?;
        let (secs, micros): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut c)
            .await
            .map_err(unavailable)?;
        let now_ms = secs * 1000 + micros / 1000;
        let alive: u64 = redis::cmd("ZCOUNT")
            .arg(self.instances_key())
            .arg(format!("({now_ms}"))
            .arg("+inf")
            .query_async(&mut c)
            .await
            .map_err(unavailable)?;
        if alive > 0 {
            return Ok(());
        }
        let grace = ms(self.inner.opts.reopen_lease_grace);
        let mut extended: u64 = 0;
        // A held run's timer is at or before its lease end, so every lease to extend
        // has a timer up to the grace's end: those runs are read first, so each call
        // declares the records it may extend (a minute's slack for the time between
        // this read and the calls; the script compares with the store's clock).
        let cutoff = now_ms.saturating_add(i64::try_from(grace).unwrap_or(i64::MAX) + 60_000);
        for p in 0..self.inner.partitions {
            let sids: Vec<String> = c
                .zrangebyscore(self.key(p, "timers"), "-inf", cutoff)
                .await
                .map_err(unavailable)?;
            for chunk in sids.chunks(GRACE_BATCH) {
                let mut inv = self.inner.scripts.grace_leases.prepare_invoke();
                inv.key(self.key(p, "timers"));
                for sid in chunk {
                    inv.key(self.key(p, &format!("run:{sid}")));
                }
                inv.arg(self.pfx(p)).arg(grace);
                for sid in chunk {
                    inv.arg(sid);
                }
                let n: u64 = inv.invoke_async(&mut c).await.map_err(unavailable)?;
                extended += n;
            }
        }
        if extended > 0 {
            tracing::info!(
                leases = extended,
                grace_ms = grace,
                "held runs whose lease lapsed while no instance was up get a grace to be renewed"
            );
        }
        Ok(())
    }

    /// Writes the schema record if absent; refuses a newer schema and raises an older
    /// one to this build's (so an older build started later refuses the records this
    /// one writes); returns the store's partition count (which wins over the
    /// configured one for an existing store).
    async fn init_meta(c: &mut Shared, prefix: &str, partitions: u32) -> Result<u32> {
        let key = format!("{prefix}:meta");
        let _: () = redis::pipe()
            .hset_nx(&key, "schema", SCHEMA_VERSION)
            .hset_nx(&key, "partitions", partitions.max(1))
            .query_async(c)
            .await
            .map_err(unavailable)?;
        let (schema, parts): (Option<u32>, Option<u32>) = redis::cmd("HMGET")
            .arg(&key)
            .arg("schema")
            .arg("partitions")
            .query_async(c)
            .await
            .map_err(unavailable)?;
        let schema = schema.ok_or_else(|| corrupt("meta record without schema"))?;
        if schema > SCHEMA_VERSION {
            return Err(Error::SchemaTooNew {
                found: schema,
                supported: SCHEMA_VERSION,
            });
        }
        if schema < SCHEMA_VERSION {
            let _: () = c
                .hset(&key, "schema", SCHEMA_VERSION)
                .await
                .map_err(unavailable)?;
            tracing::info!(
                from = schema,
                to = SCHEMA_VERSION,
                "store schema raised: an instance of an older build can no longer read what this one writes"
            );
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
        Self::init_meta(
            &mut self.conn().await?,
            &self.inner.prefix,
            self.inner.partitions,
        )
        .await?;
        for p in 0..self.inner.partitions {
            self.ensure_group(p).await?;
        }
        Ok(())
    }

    /// The shared multiplexed connection (a cheap handle).
    async fn conn(&self) -> Result<Shared> {
        Ok(self.inner.shared.clone())
    }

    /// A connection of its own, for a command that blocks.
    async fn blocking_conn(&self) -> Result<BlockingConn> {
        self.inner.blocking.get().await
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

    /// The positions of `schedule_ids` grouped by the partition of their run (one
    /// script call each); a schedule_id naming no job is in none.
    fn positions_by_partition<'a>(
        &self,
        schedule_ids: impl Iterator<Item = &'a str>,
    ) -> std::collections::BTreeMap<u32, Vec<usize>> {
        self.partitions_of(schedule_ids.enumerate())
    }

    /// `(position, schedule_id)`s grouped by the partition of their run; a
    /// schedule_id naming no job is in none.
    fn partitions_of<'a>(
        &self,
        runs: impl Iterator<Item = (usize, &'a str)>,
    ) -> std::collections::BTreeMap<u32, Vec<usize>> {
        let mut by_part: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
        for (i, sid) in runs {
            if let Some((job_id, _)) = split_schedule_id(sid) {
                by_part.entry(self.part(job_id)).or_default().push(i);
            }
        }
        by_part
    }

    /// Calls `function` once per partition of the runs at `runs` (position,
    /// schedule_id; one naming no job is in no call), the calls sent together
    /// (pipelined on the shared connection), each declaring the keys `keys` names for
    /// that partition's positions (under the partition's prefix; none: the prefix
    /// names the slot), with the partition's prefix and then what `args` adds. Each
    /// call must answer `per_run` values per run; returns each call's positions with
    /// its answer.
    async fn per_partition<'a, R: FromRedisValue + Send>(
        &self,
        function: &Function,
        runs: impl Iterator<Item = (usize, &'a str)>,
        per_run: usize,
        keys: impl Fn(&[usize]) -> Vec<String>,
        args: impl Fn(&mut Call<'_>, &[usize]),
    ) -> Result<Vec<(Vec<usize>, Vec<R>)>> {
        let calls = self.partitions_of(runs).into_iter().map(|(p, idx)| {
            let mut inv = function.prepare_invoke();
            let pfx = self.pfx(p);
            for key in keys(&idx) {
                inv.key(format!("{pfx}{key}"));
            }
            inv.arg(pfx);
            args(&mut inv, &idx);
            async move {
                let mut c = self.conn().await?;
                let r: Vec<R> = inv.invoke_declaring(&mut c).await.map_err(unavailable)?;
                if r.len() != idx.len() * per_run {
                    return Err(corrupt(format!(
                        "{} answered {} values for {} runs",
                        function.name(),
                        r.len(),
                        idx.len()
                    )));
                }
                Ok((idx, r))
            }
        });
        futures::future::try_join_all(calls).await
    }

    /// The keys (under the partition's prefix) a report about run `sid` may read or
    /// write: its record, and shard 0's (a broadcast run's shard 0 reports under the
    /// parent's schedule_id: `load_held` in runlib.lua).
    fn held_keys(sid: &str) -> [String; 2] {
        [format!("run:{sid}"), format!("run:{sid}#0")]
    }

    /// The keys (under the partition's prefix) a transition of run `sid` may touch
    /// that its schedule_id names: its record and shard 0's (`held_keys`), its
    /// parent's when it is a shard (`<parent>#<n>`), their webhook entries, the job's
    /// active runs and serial queue, the timers, the tokens and the outbox's due set.
    /// (The runs a serial queue or a broadcast run names are asked for by the script:
    /// `Call::invoke_declaring`.)
    fn run_keys(&self, sid: &str) -> Vec<String> {
        if !self.inner.declares {
            return Vec::new();
        }
        let mut keys = Vec::with_capacity(10);
        keys.extend(Self::held_keys(sid));
        keys.push(format!("delivery:{sid}"));
        if let Some((parent, _)) = sid.rsplit_once('#') {
            keys.push(format!("run:{parent}"));
            keys.push(format!("delivery:{parent}"));
        }
        if let Some((job_id, _)) = split_schedule_id(sid) {
            keys.push(format!("active:{job_id}"));
            keys.push(format!("serial:{job_id}"));
        }
        keys.extend(["timers", "tokens", "outbox_due"].map(str::to_owned));
        keys
    }

    /// The log keys of run `sid` and of its shard 0 (see `held_keys`).
    fn log_keys(sid: &str) -> [String; 4] {
        [
            format!("logs:{sid}"),
            format!("logmeta:{sid}"),
            format!("logs:{sid}#0"),
            format!("logmeta:{sid}#0"),
        ]
    }

    /// Nodes are not partitioned: all of them share the `{nodes}` slot.
    fn nodes_prefix(&self) -> String {
        format!("{}:{{nodes}}:", self.inner.prefix)
    }

    /// The server instances' beats, in the `{nodes}` slot.
    fn instances_key(&self) -> String {
        format!("{}instances", self.nodes_prefix())
    }

    /// Breakers and pacing slots are per destination, not per partition: all of them
    /// share one slot.
    fn breakers_prefix(&self) -> String {
        format!("{}:{{webhooks}}:", self.inner.prefix)
    }

    /// Calls a run-transition script with (partition prefix, nodes prefix,
    /// schedule_id, `extra`…), declaring `keys` (names in the run's partition: none
    /// declares the prefix alone), and parses its reply; a malformed schedule_id is an
    /// unknown run.
    async fn run_transition(
        &self,
        script: &Function,
        schedule_id: &str,
        keys: &[String],
        extra: &[String],
    ) -> Result<Transition> {
        let Some((job_id, _)) = split_schedule_id(schedule_id) else {
            return Ok(unknown_run());
        };
        let p = self.part(job_id);
        let mut inv = script.prepare_invoke();
        for key in keys {
            inv.key(self.key(p, key));
        }
        inv.arg(self.pfx(p))
            .arg(self.run_nodes_arg())
            .arg(schedule_id);
        for a in extra {
            inv.arg(a);
        }
        let mut c = self.conn().await?;
        let r: Vec<Vec<u8>> = inv.invoke_declaring(&mut c).await.map_err(unavailable)?;
        let t = transition(&r)?;
        self.release_revoked(&t.revoked).await;
        Ok(t)
    }

    /// Calls `due_runs` or `due_deliveries` (the shared `due_entries` of common.lua) on
    /// the zset `key` of partition `p`.
    async fn due_entries(
        &self,
        script: &Function,
        key: &str,
        p: u32,
        limit: usize,
    ) -> Result<DueEntries> {
        let mut c = self.conn().await?;
        let (ids, next_in): (Vec<String>, Option<u64>) = script
            .key(self.key(p, key))
            .arg(limit)
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        Ok(DueEntries {
            ids,
            next_in: next_in.map(Duration::from_millis),
        })
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
        inv.key(self.key(p, "pending"));
        for id in ids {
            inv.key(self.key(p, &format!("job:{id}")));
        }
        inv.arg(self.pfx(p));
        for id in ids {
            inv.arg(id);
        }
        let mut c = self.conn().await?;
        #[allow(clippy::type_complexity)]
        let rows: Vec<(Option<Vec<u8>>, Option<u64>, Option<Millis>, Option<Millis>)> =
            inv.invoke_async(&mut c).await.map_err(unavailable)?;
        let mut out = Vec::with_capacity(rows.len());
        for (id, (rec, version, due, jit)) in ids.iter().zip(rows) {
            let armed = due.map(|d| (d, jit.unwrap_or(0)));
            if let Some(job) = decode_job(id, rec, version, armed)? {
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
    mut subscribers: Subscribers,
    channel: String,
    tx: watch::Sender<u64>,
    stop: CancellationToken,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let connected = async {
            let mut ps = subscribers.next().await?.get_async_pubsub().await?;
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
        if !back_off(&stop, &mut backoff).await {
            return;
        }
    }
}

/// Waits `backoff` and doubles it (up to 2 s) before a background task tries Redis
/// again; false when `stop` came first.
async fn back_off(stop: &CancellationToken, backoff: &mut Duration) -> bool {
    tokio::select! {
        () = stop.cancelled() => return false,
        () = tokio::time::sleep(*backoff) => {}
    }
    *backoff = (*backoff * 2).min(Duration::from_secs(2));
    true
}

/// The job `id` from its stored record (see `encode_job`; a whole JSON record, as
/// written before records were compact, is read too), its version and its armed fire
/// (due, jitter offset).
fn decode_job(
    id: &str,
    rec: Option<Vec<u8>>,
    version: Option<u64>,
    armed: Option<(Millis, Millis)>,
) -> Result<Option<JobRecord>> {
    let Some(rec) = rec else { return Ok(None) };
    let version = version.ok_or_else(|| corrupt("job without version"))?;
    let mut stored: serde_json::Value = if rec.first() == Some(&b'{') {
        serde_json::from_slice(&rec).map_err(corrupt)?
    } else {
        rmp_serde::from_slice(&rec).map_err(corrupt)?
    };
    if let serde_json::Value::Object(record) = &mut stored {
        restore_defaults(record, &JOB_DEFAULTS.record);
        record.insert("version".into(), version.into());
        if let Some(serde_json::Value::Object(spec)) = record.get_mut("spec") {
            restore_defaults(spec, &JOB_DEFAULTS.spec);
            spec.entry("id").or_insert_with(|| id.into());
        }
    }
    let mut job: JobRecord = serde_json::from_value(stored).map_err(corrupt)?;
    job.version = version;
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
/// A job's record as stored: MessagePack of its JSON form without `version` (the job's
/// hash holds it), `next_fire` (its pending member), `spec.id` (its key), nor any field
/// of the record or its spec whose value is the one `JOB_DEFAULTS` gives (`decode_job`
/// puts them all back). Most jobs leave most of their spec at its zero value: a typical
/// record is about 130 bytes instead of 600 (the whole JSON record before).
fn encode_job(job: &JobRecord) -> Result<Vec<u8>> {
    let mut stored = serde_json::to_value(job).map_err(corrupt)?;
    if let serde_json::Value::Object(record) = &mut stored {
        record.remove("version");
        record.remove("next_fire");
        drop_defaults(record, &JOB_DEFAULTS.record);
        if let Some(serde_json::Value::Object(spec)) = record.get_mut("spec") {
            spec.remove("id");
            drop_defaults(spec, &JOB_DEFAULTS.spec);
        }
    }
    rmp_serde::to_vec_named(&stored).map_err(corrupt)
}

/// The values a stored job record leaves out, each compared whole (a nested value is
/// left out only when all of it is the default).
struct JobDefaults {
    record: serde_json::Map<String, serde_json::Value>,
    spec: serde_json::Map<String, serde_json::Value>,
}

static JOB_DEFAULTS: std::sync::LazyLock<JobDefaults> = std::sync::LazyLock::new(|| {
    let object = |v: serde_json::Value| match v {
        serde_json::Value::Object(m) => m,
        _ => serde_json::Map::new(),
    };
    JobDefaults {
        record: object(serde_json::json!({ "paused": false, "next_fire": null })),
        spec: object(serde_json::json!({
            "name": "",
            "start_time": null,
            "end_time": null,
            "jitter_ms": 0,
            "route_strategy": "round_robin",
            "route_key": "",
            "retry": { "max_retries": 0, "backoff_ms": 0, "backoff_multiplier": 0.0, "max_backoff_ms": 0 },
            "misfire_policy": "fire_once",
            "misfire_catch_up_limit": 0,
            "overlap_policy": "allow",
            "callback_url": null,
            "callback_max_in_flight": 0,
            "app_id": "",
            "payload": "",
            "labels": {},
        })),
    }
});

fn drop_defaults(
    object: &mut serde_json::Map<String, serde_json::Value>,
    defaults: &serde_json::Map<String, serde_json::Value>,
) {
    object.retain(|k, v| defaults.get(k) != Some(v));
}

fn restore_defaults(
    object: &mut serde_json::Map<String, serde_json::Value>,
    defaults: &serde_json::Map<String, serde_json::Value>,
) {
    for (k, v) in defaults {
        if !object.contains_key(k) {
            object.insert(k.clone(), v.clone());
        }
    }
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
        applied: Applied::No(UNKNOWN_RUN.to_owned()),
        run: None,
        revoked: Vec::new(),
        next_serial: None,
        webhook: None,
    }
}

/// A run record as Redis holds it. The run scripts write three MessagePack values back
/// to back (schema 4, `decode_run` in `runlib.lua`): the run's fields, its plan, then
/// its history's events, oldest first, so a step decodes only the part it reads. A
/// record of one map (schema 3, or as [`encode_run`] writes it) holds plan and history
/// inside; a record written before schema 2 is JSON (it starts with `{`, which no
/// MessagePack map does).
fn decode_run(bytes: &[u8]) -> Result<RunRecord> {
    if bytes.first() == Some(&b'{') {
        return serde_json::from_slice(bytes).map_err(corrupt);
    }
    let mut de = rmp_serde::Deserializer::new(std::io::Cursor::new(bytes));
    let mut run = RunRecord::deserialize(&mut de).map_err(corrupt)?;
    if de.position() < bytes.len() as u64 {
        run.plan = RunPlan::deserialize(&mut de).map_err(corrupt)?;
        read_events(&mut de, bytes.len(), &mut run.history)?;
    }
    Ok(run)
}

/// Reads the history events (MessagePack, back to back) from `de` to the end of its
/// `len` bytes onto `history`.
fn read_events(
    de: &mut rmp_serde::Deserializer<rmp_serde::decode::ReadReader<std::io::Cursor<&[u8]>>>,
    len: usize,
    history: &mut Vec<RunEvent>,
) -> Result<()> {
    while de.position() < len as u64 {
        history.push(RunEvent::deserialize(&mut *de).map_err(corrupt)?);
    }
    Ok(())
}

/// The fields of a webhook's outbox entry that keep its outcomes (`finish_entry` in
/// `runlib.lua`): the last status (absent until an outcome was kept there), attempts,
/// the last error, `DONE` | `FAILED` once final, the events noted.
const OUTCOME_FIELDS: [&str; 5] = ["status", "attempts", "error", "done", "ev"];

/// Lays a webhook's outcomes, as its outbox entry keeps them (`fields`, the values of
/// [`OUTCOME_FIELDS`]), over the run's record: the run is final and its record no longer
/// changes, so the outcomes are written on the entry instead (its events after the
/// record's, the last [`RunEvent::KEPT`] kept, as a record's own would be).
fn overlay_outcome(run: &mut RunRecord, fields: &[Option<Vec<u8>>]) -> Result<()> {
    let [Some(status), attempts, error, done, ev] = fields else {
        return Ok(());
    };
    run.callback_status = text(status)?.parse().map_err(corrupt)?;
    run.callback_attempts = match attempts {
        Some(a) => text(a)?.parse().map_err(corrupt)?,
        None => 0,
    };
    run.callback_error = match error {
        Some(e) => text(e)?.to_owned(),
        None => String::new(),
    };
    run.callback_state = match done.as_deref() {
        None => CallbackState::Pending,
        Some(b"DONE") => CallbackState::Done,
        Some(b"FAILED") => CallbackState::Failed,
        Some(other) => return Err(corrupt(format!("a delivery done as {other:?}"))),
    };
    if let Some(ev) = ev {
        let mut de = rmp_serde::Deserializer::new(std::io::Cursor::new(ev.as_slice()));
        read_events(&mut de, ev.len(), &mut run.history)?;
        run.keep_last_events();
    }
    Ok(())
}

/// A run record for a script (as the scripts write them: MessagePack, fields by name).
fn encode_run(run: &RunRecord) -> Result<Vec<u8>> {
    rmp_serde::to_vec_named(run).map_err(corrupt)
}

/// A reply field that is text (a status, a reason, an id, a number).
fn text(field: &[u8]) -> Result<&str> {
    std::str::from_utf8(field).map_err(corrupt)
}

/// One revocation as the run scripts list it: sid, node, token, reason, attempt.
fn revocation(f: &[Vec<u8>]) -> Result<Option<Revocation>> {
    let [sid, node, token, reason, attempt] = f else {
        return Err(corrupt(format!("a revocation of {} fields", f.len())));
    };
    if sid.is_empty() {
        return Ok(None);
    }
    Ok(Some(Revocation {
        schedule_id: text(sid)?.to_owned(),
        node_id: text(node)?.to_owned(),
        token: text(token)?.parse().map_err(corrupt)?,
        attempt: text(attempt)?.parse().map_err(corrupt)?,
        reason: text(reason)?.to_owned(),
    }))
}

/// Revocations as the run scripts list them: 5 fields each.
fn revocations(fields: &[Vec<u8>]) -> Result<Vec<Revocation>> {
    fields
        .chunks(5)
        .map(revocation)
        .collect::<Result<Vec<_>>>()
        .map(|v| v.into_iter().flatten().collect())
}

/// Parses the reply every transition script gives: {applied, reason, run record,
/// next_serial, the webhook claimed for the caller, then 5 fields per revoked lease}.
fn transition(r: &[Vec<u8>]) -> Result<Transition> {
    let [applied, reason, run, next, webhook, rest @ ..] = r else {
        return Err(corrupt(format!("run script answered {} fields", r.len())));
    };
    Ok(Transition {
        applied: match text(applied)? {
            "yes" => Applied::Yes,
            "already" => Applied::Already,
            _ => Applied::No(text(reason)?.to_owned()),
        },
        run: if run.is_empty() {
            None
        } else {
            Some(decode_run(run)?)
        },
        revoked: revocations(rest)?,
        next_serial: if next.is_empty() {
            None
        } else {
            Some(text(next)?.to_owned())
        },
        webhook: if webhook.is_empty() {
            None
        } else {
            Some(claimed_webhook(webhook)?)
        },
    })
}

/// A webhook a run script claimed for its caller (`write_outbox` in runlib.lua): the
/// MessagePack array {schedule_id, job_id, url, body, created_at, token}, the numbers
/// as decimal text. Its first attempt is yet to be made, and the claim was made at its
/// creation.
fn claimed_webhook(bytes: &[u8]) -> Result<WebhookDelivery> {
    let (schedule_id, job_id, url, body, created_at, token): (
        String,
        String,
        String,
        String,
        String,
        String,
    ) = rmp_serde::from_slice(bytes).map_err(|e| corrupt(format!("a claimed webhook: {e}")))?;
    let created_at = parse_i64(&created_at)?;
    Ok(WebhookDelivery {
        schedule_id,
        job_id,
        url,
        body,
        attempts: 0,
        created_at,
        token: token
            .parse()
            .map_err(|e| corrupt(format!("a claimed webhook's token {token:?}: {e}")))?,
        now: created_at,
    })
}

/// A breaker as `settle_delivery` answers it: (state, until).
fn breaker(state: &str, until: &str) -> Result<BreakerState> {
    match state {
        "closed" => Ok(BreakerState::Closed),
        "open" => Ok(BreakerState::Open {
            until: parse_i64(until)?,
        }),
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
