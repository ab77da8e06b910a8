//! The embedded backend: one durable redb file, single process, the same semantics as
//! the redis backend (and the same conformance suite).
//!
//! It owns the on-disk layout of an embedded store: the tables below, the meta record
//! (schema version, partition count, trigger sequence), and the in-memory delivery state
//! of the trigger queue. Every `Store` operation is exactly one redb transaction, run on
//! the blocking pool, so the atomicity the trait promises is redb's: a write transaction
//! is serialised against every other one and commits durably (fsync) or not at all.
//!
//! Layout (all values that are domain records are JSON, so a field added to `model`
//! stays readable as long as it is `serde(default)`-able):
//!
//! | table | key → value | why |
//! |---|---|---|
//! | `meta` | name → u64 | schema version, partitions, next trigger sequence |
//! | `jobs` | job_id → JSON `JobRecord` | the jobs |
//! | `pending` | job_id → due | the pending member of a job (at most one) |
//! | `due_index` | (partition, due, job_id) → () | range scans of due fires per partition |
//! | `triggers` | seq → JSON (trigger, enqueued_at) | the durable trigger queue |
//! | `idempotency` | (job_id, key) → (schedule_id, expires_at) | manual trigger keys |
//! | `idempotency_expiry` | (expires_at, job_id, key) → () | lazy sweep of old keys |
//! | `runs` | schedule_id → JSON `RunRecord` | run records |
//! | `runs_by_job` | (job_id, scheduled_at, schedule_id) → () | listing, per-job bound |
//! | `runs_by_created` | (created_at, schedule_id) → () | retention sweep |
//! | `run_counts` | job_id → u64 | the per-job bound without counting a range |
//! | `lease_counters` | job_id → u64 | last fencing token of a job (never deleted) |
//! | `active_runs` | (job_id, schedule_id) → () | the job's runs not final (overlap policy) |
//! | `serial_queue` | (job_id, position) → schedule_id | the job's queued serial runs, FIFO |
//! | `run_timers` | schedule_id → (partition, due) | a run's timer, to move or drop it |
//! | `run_timer_index` | (partition, due, schedule_id) → () | `due_runs` per partition |
//! | `node_runs` | (node_id, schedule_id) → () | runs leased to a node (max concurrency) |
//! | `run_logs` | (schedule_id, seq) → JSON `LogLine` | executor log lines |
//! | `run_log_meta` | schedule_id → (last seq, bytes kept) | seq allocation, the byte bound |
//! | `nonces` | (app_id, nonce) → expires_at | inbound replay protection |
//! | `nonce_expiry` | (expires_at, app_id, nonce) → () | lazy sweep of old nonces |
//! | `nodes` | node_id → (JSON `NodeRecord`, expires_at) | the executor node registry |
//! | `node_expiry` | (expires_at, node_id) → () | lazy sweep of expired nodes |
//! | `webhook_outbox` | schedule_id → JSON entry | webhook deliveries not yet done |
//! | `webhook_outbox_due` | (partition, due, schedule_id) → () | `due_deliveries` per partition |
//! | `webhook_breakers` | destination → JSON breaker | circuit breakers by scheme://host:port |
//!
//! Everything in the run machine's tables (`active_runs` to `run_log_meta`) hangs off a
//! run record and goes with it (retention sweep, per-job bound). Outbox entries do not:
//! a webhook is delivered (or given up at its max age) even if its run is gone. Per-instance inboxes
//! are not stored: they live in memory (see `push_inbox`).
//!
//! Choices where the trait leaves room. Those marked (pinned) are checked by the
//! conformance suite, so the redis backend must make the same ones:
//!
//! - A paused job never has a pending member: `next_fire` is stored as None while
//!   `paused`, whatever the caller passed (pinned).
//! - `read_triggers` with a zero `block` does not wait (pinned).
//! - Run records past `run_retention` (by `created_at`) are invisible at once (pinned),
//!   to the run machine too, and deleted lazily: each `record_run` and `begin_run`
//!   first deletes up to [`SWEEP_BATCH`] expired records. Idempotency keys and nonces
//!   are swept the same way by the operations that write them. `record_run` fills
//!   `created_at` (if 0) and, for a final state, `finished_at` (if None) from the
//!   store's clock (pinned); `begin_run` always stamps `created_at`. A trigger that
//!   says skip keeps its reason even if the job is paused or deleted meanwhile.
//! - The run machine makes the choices of the redis scripts (`lua/runlib.lua` and the
//!   run scripts), most of them pinned by the conformance suite: reasons ("retry:
//!   <error code, or failed>", "retry: timeout", "retry: lost", "unconfirmed",
//!   "timeout", "lost", "queued", "replaced", "overlap", "serial queue full"), a final
//!   FAILED result with reason "", error fields set by timeouts and lost leases,
//!   `last_node` set on every retry and re-route, `node_id` kept after the lease ends. A revoked lease and a
//!   retried attempt each get a new token; a final result keeps its finisher's.
//!   `append_logs` only checks the token (late lines after a result are kept);
//!   `report_progress` also needs the run DISPATCHED/RUNNING.
//! - Serial means one at a time (pinned): the queue pops only when no run of the job
//!   outside the queue is still active, so cancelling a queued run releases nothing
//!   while another runs, and a queued run cannot be finished by `Finisher::Waiting`.
//! - A rejected dispatch (a WAITING outcome) keeps the run's error fields; any other
//!   outcome whose state is not final is refused (`Applied::No`).
//! - An executor node past its TTL (expires_at ≤ now) is invisible at once: not listed,
//!   and `remove_node` returns false for it (pinned). It is deleted lazily: each
//!   `upsert_node` and `remove_node` first deletes up to [`SWEEP_BATCH`] expired nodes.
//!   `list_nodes` only skips them, so it stays a read transaction that never waits for
//!   the writer. A refresh replaces the record and its expiry (a shorter TTL shortens
//!   it); `connected_at` is kept as the caller passed it.
//! - The store stamps `JobRecord.created_at`/`updated_at` with its clock (create sets
//!   both; update keeps `created_at` and sets `updated_at`).
//! - Queue entry ids are the decimal sequence number; `trim_triggers` is a no-op since
//!   `ack_trigger` deletes. A page `limit` of zero means [`DEFAULT_PAGE`]; a zero
//!   `limit` for `due_runs` or `read_logs` returns nothing (as in redis).
//! - Caller mistakes the trait has no variant for (a claim sent to the wrong partition,
//!   a malformed cursor or entry id) are `Error::Corrupt`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::Bound;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use redb::{
    Database, ReadTransaction, ReadableDatabase, ReadableTable, Table, TableDefinition,
    WriteTransaction,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, watch};

use super::{
    Applied, Assigned, Begun, BreakerState, BreakerUpdate, ClaimOutcome, ClaimResult, Delivery,
    DeliveryOutcome, DueBatch, DueFire, Enqueued, Error, FannedOut, Finisher, FireClaim, Held,
    LeaseTerms, LogLine, NodeRecord, NodeSlot, Outcome, Page, Recorded, Result, Revocation,
    RunQuery, SCHEMA_VERSION, Store, StoreOptions, Transition, WebhookDelivery, partition_of,
};
use crate::model::{
    AppRecord, AppSecret, CallbackState, Deadlines, JobRecord, Millis, OverlapPolicy, RunRecord,
    RunState, Trigger, WebhookBody, duration_ms,
};

/// How many expired records (runs, idempotency keys, nonces, nodes) one write sweeps, so that a
/// backlog is worked off over time without making any single operation slow.
pub const SWEEP_BATCH: usize = 32;
/// The page size used when a caller asks for a page of zero items.
pub const DEFAULT_PAGE: usize = 100;
/// An inbox nobody pushed to for this long is forgotten, messages and all (the redis
/// backend lets the key expire after the same time).
pub const INBOX_TTL: Duration = Duration::from_secs(60);

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const JOBS: TableDefinition<&str, &str> = TableDefinition::new("jobs");
const PENDING: TableDefinition<&str, i64> = TableDefinition::new("pending");
const DUE_INDEX: TableDefinition<(u32, i64, &str), ()> = TableDefinition::new("due_index");
const TRIGGERS: TableDefinition<u64, &str> = TableDefinition::new("triggers");
const IDEMPOTENCY: TableDefinition<(&str, &str), (&str, i64)> = TableDefinition::new("idempotency");
const IDEMPOTENCY_EXPIRY: TableDefinition<(i64, &str, &str), ()> =
    TableDefinition::new("idempotency_expiry");
const RUNS: TableDefinition<&str, &str> = TableDefinition::new("runs");
const RUNS_BY_JOB: TableDefinition<(&str, i64, &str), ()> = TableDefinition::new("runs_by_job");
const RUNS_BY_CREATED: TableDefinition<(i64, &str), ()> = TableDefinition::new("runs_by_created");
const RUN_COUNTS: TableDefinition<&str, u64> = TableDefinition::new("run_counts");
/// The last fencing token of each job. The on-disk name predates the run machine.
const TOKENS: TableDefinition<&str, u64> = TableDefinition::new("lease_counters");
const ACTIVE: TableDefinition<(&str, &str), ()> = TableDefinition::new("active_runs");
const SERIAL: TableDefinition<(&str, u64), &str> = TableDefinition::new("serial_queue");
const TIMERS: TableDefinition<&str, (u32, i64)> = TableDefinition::new("run_timers");
const TIMER_INDEX: TableDefinition<(u32, i64, &str), ()> = TableDefinition::new("run_timer_index");
const NODE_RUNS: TableDefinition<(&str, &str), ()> = TableDefinition::new("node_runs");
const LOGS: TableDefinition<(&str, u64), &str> = TableDefinition::new("run_logs");
const LOG_META: TableDefinition<&str, (u64, u64)> = TableDefinition::new("run_log_meta");
const NONCES: TableDefinition<(&str, &str), i64> = TableDefinition::new("nonces");
const NONCE_EXPIRY: TableDefinition<(i64, &str, &str), ()> = TableDefinition::new("nonce_expiry");
const NODES: TableDefinition<&str, (&str, i64)> = TableDefinition::new("nodes");
const NODE_EXPIRY: TableDefinition<(i64, &str), ()> = TableDefinition::new("node_expiry");
const APPS: TableDefinition<&str, &str> = TableDefinition::new("apps");
const OUTBOX: TableDefinition<&str, &str> = TableDefinition::new("webhook_outbox");
const OUTBOX_DUE: TableDefinition<(u32, i64, &str), ()> =
    TableDefinition::new("webhook_outbox_due");
const BREAKERS: TableDefinition<&str, &str> = TableDefinition::new("webhook_breakers");

const META_SCHEMA: &str = "schema_version";
const META_PARTITIONS: &str = "partitions";
/// The sequence number the next appended trigger gets. Persisted so entry ids never
/// repeat, even after every entry was acked and removed.
const META_TRIGGER_SEQ: &str = "trigger_seq";

/// A queue entry as stored: the trigger and when it was appended (store clock).
#[derive(Debug, Serialize, Deserialize)]
struct QueuedTrigger {
    enqueued_at: Millis,
    trigger: Trigger,
}

/// A webhook waiting in the outbox (the redis scripts keep the same JSON shape).
#[derive(Debug, Serialize, Deserialize)]
struct OutboxEntry {
    job_id: String,
    url: String,
    body: String,
    created_at: Millis,
    attempts: u32,
    /// The last claim's delivery token (0: never claimed).
    token: u64,
    in_flight: bool,
    /// When it is due: the next attempt, or while in flight the end of the claim's lease.
    due: Millis,
}

/// A destination's circuit breaker; no record means closed with no failures.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Breaker {
    /// "closed", "open" or "half_open".
    state: String,
    /// Open: until then. Half open: the probe's deadline.
    until: Millis,
    /// Consecutive failures while closed.
    failures: u32,
}

/// Delivery bookkeeping of the trigger queue. It lives in memory on purpose: "delivered
/// but not acked" only means something for the life of this process, and after a restart
/// every unacked entry must be delivered again, which an empty state gives for free.
#[derive(Debug, Default)]
struct QueueState {
    /// Every entry with a lower sequence was delivered by `read_triggers` during this
    /// process's life (or acked). Sequences are allocated inside the single redb writer,
    /// so they become visible in order and a watermark is enough to find new entries.
    next_unread: u64,
    /// Delivered and not yet acked: sequence → when it was (last) delivered.
    delivered: HashMap<u64, Millis>,
}

/// What the blocking closures share.
struct Inner {
    db: Database,
    partitions: u32,
    run_retention_ms: i64,
    max_runs_per_job: u64,
    idempotency_ttl_ms: i64,
    queue: Mutex<QueueState>,
}

/// The embedded `Store`: see the module docs.
pub struct EmbeddedStore {
    inner: Arc<Inner>,
    /// Bumped after every committed job create/update/delete.
    changes: watch::Sender<u64>,
    /// Woken after every committed trigger append, so blocked readers need not poll.
    appended: Arc<Notify>,
    /// Per-instance inboxes. In memory on purpose: an embedded store serves one process,
    /// and inboxes are best effort by contract (a dispatch lost with its message is
    /// never confirmed, so it is re-routed).
    inboxes: Mutex<HashMap<String, Inbox>>,
    /// Woken after every push, so blocked `pop_inbox` callers need not poll.
    inbox_pushed: Notify,
    /// Round-robin counters by job: in memory, as only this process routes.
    route_counters: Mutex<HashMap<String, u64>>,
}

/// One instance's inbox: messages oldest first, forgotten once nobody pushed for
/// [`INBOX_TTL`] (as the redis key expires).
#[derive(Debug)]
struct Inbox {
    messages: VecDeque<Vec<u8>>,
    expires: Instant,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore")
            .field("partitions", &self.inner.partitions)
            .finish_non_exhaustive()
    }
}

impl EmbeddedStore {
    /// Opens (creating if missing) the store file at `path`. A new file records
    /// `SCHEMA_VERSION` and `opts.partitions`; an existing one keeps its partition count,
    /// and one written by a newer schema is refused with `Error::SchemaTooNew`.
    ///
    /// This is blocking I/O (it may fsync); call it at start-up or from a blocking task.
    pub fn open(path: &Path, opts: StoreOptions) -> Result<EmbeddedStore> {
        let db = Database::create(path)
            .map_err(|e| map_redb(&format!("open embedded store {}", path.display()), e.into()))?;
        let partitions = init_meta(&db, opts.partitions)?;
        // The remaining tables are created up front so that read transactions can always
        // open them (a read transaction cannot create a table).
        let txn = db.begin_write().ctx("begin schema transaction")?;
        create_tables(&txn)?;
        txn.commit().ctx("commit schema transaction")?;

        let (changes, _) = watch::channel(0);
        Ok(EmbeddedStore {
            inner: Arc::new(Inner {
                db,
                partitions,
                run_retention_ms: duration_ms(opts.run_retention),
                // Zero would delete a run in the very operation that records it, breaking
                // `record_run`'s idempotency, so at least one run per job is kept.
                max_runs_per_job: u64::try_from(opts.max_runs_per_job.max(1)).unwrap_or(u64::MAX),
                idempotency_ttl_ms: duration_ms(opts.idempotency_ttl),
                queue: Mutex::new(QueueState::default()),
            }),
            changes,
            appended: Arc::new(Notify::new()),
            inboxes: Mutex::new(HashMap::new()),
            inbox_pushed: Notify::new(),
            route_counters: Mutex::new(HashMap::new()),
        })
    }

    /// Runs `f` on the blocking pool: redb calls block on disk and on the writer lock.
    async fn blocking<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> Result<T> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| Error::Unavailable(format!("embedded store task failed: {e}")))?
    }

    fn job_changed(&self) {
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    fn inboxes(&self) -> MutexGuard<'_, HashMap<String, Inbox>> {
        // Each statement leaves the map consistent, so a panic elsewhere cannot leave
        // it half-updated.
        self.inboxes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes up to `max` messages from the instance's inbox, oldest first.
    fn take_inbox(&self, instance: &str, max: usize) -> Vec<Vec<u8>> {
        let mut inboxes = self.inboxes();
        let Some(inbox) = inboxes.get_mut(instance) else {
            return Vec::new();
        };
        if inbox.expires <= Instant::now() {
            inboxes.remove(instance);
            return Vec::new();
        }
        let n = max.min(inbox.messages.len());
        let got: Vec<Vec<u8>> = inbox.messages.drain(..n).collect();
        if inbox.messages.is_empty() {
            inboxes.remove(instance);
        }
        got
    }
}

/// Checks or writes the meta record; returns the store's partition count.
fn init_meta(db: &Database, wanted_partitions: u32) -> Result<u32> {
    let txn = db.begin_write().ctx("begin meta transaction")?;
    let partitions = {
        let mut meta = txn.open_table(META).ctx("open meta table")?;
        let schema = meta
            .get(META_SCHEMA)
            .ctx("read schema version")?
            .map(|g| g.value());
        match schema {
            None => {
                let partitions = wanted_partitions.max(1);
                meta.insert(META_SCHEMA, u64::from(SCHEMA_VERSION))
                    .ctx("write schema version")?;
                meta.insert(META_PARTITIONS, u64::from(partitions))
                    .ctx("write partitions")?;
                meta.insert(META_TRIGGER_SEQ, 1)
                    .ctx("write trigger sequence")?;
                partitions
            }
            Some(found) => {
                if found > u64::from(SCHEMA_VERSION) {
                    return Err(Error::SchemaTooNew {
                        found: u32::try_from(found).unwrap_or(u32::MAX),
                        supported: SCHEMA_VERSION,
                    });
                }
                // Schema 1 is the only one so far: nothing to migrate.
                let stored = meta
                    .get(META_PARTITIONS)
                    .ctx("read partitions")?
                    .map(|g| g.value())
                    .ok_or_else(|| Error::Corrupt("meta record has no partition count".into()))?;
                match u32::try_from(stored) {
                    Ok(p) if p > 0 => p,
                    _ => {
                        return Err(Error::Corrupt(format!(
                            "meta record has an invalid partition count {stored}"
                        )));
                    }
                }
            }
        }
    };
    txn.commit().ctx("commit meta transaction")?;
    Ok(partitions)
}

fn create_tables(txn: &WriteTransaction) -> Result<()> {
    txn.open_table(JOBS).ctx("create jobs table")?;
    txn.open_table(PENDING).ctx("create pending table")?;
    txn.open_table(DUE_INDEX).ctx("create due index")?;
    txn.open_table(TRIGGERS).ctx("create triggers table")?;
    txn.open_table(IDEMPOTENCY)
        .ctx("create idempotency table")?;
    txn.open_table(IDEMPOTENCY_EXPIRY)
        .ctx("create idempotency expiry index")?;
    txn.open_table(RUNS).ctx("create runs table")?;
    txn.open_table(RUNS_BY_JOB)
        .ctx("create runs-by-job index")?;
    txn.open_table(RUNS_BY_CREATED)
        .ctx("create runs-by-created index")?;
    txn.open_table(RUN_COUNTS).ctx("create run counts table")?;
    txn.open_table(TOKENS).ctx("create token counters")?;
    txn.open_table(ACTIVE).ctx("create active runs table")?;
    txn.open_table(SERIAL).ctx("create serial queue table")?;
    txn.open_table(TIMERS).ctx("create run timers")?;
    txn.open_table(TIMER_INDEX).ctx("create run timer index")?;
    txn.open_table(NODE_RUNS).ctx("create node runs table")?;
    txn.open_table(LOGS).ctx("create run logs table")?;
    txn.open_table(LOG_META).ctx("create run log meta table")?;
    txn.open_table(NONCES).ctx("create nonces table")?;
    txn.open_table(NONCE_EXPIRY)
        .ctx("create nonce expiry index")?;
    txn.open_table(NODES).ctx("create nodes table")?;
    txn.open_table(NODE_EXPIRY)
        .ctx("create node expiry index")?;
    txn.open_table(OUTBOX).ctx("create webhook outbox")?;
    txn.open_table(OUTBOX_DUE)
        .ctx("create webhook outbox index")?;
    txn.open_table(BREAKERS).ctx("create webhook breakers")?;
    txn.open_table(APPS).ctx("create apps table")?;
    Ok(())
}

// ---- error mapping

/// Maps a redb error to the store's vocabulary: damage to the file (or a layout this
/// code does not expect) is `Corrupt`; anything else (I/O, locks, a closed database)
/// is `Unavailable`, which callers may retry.
fn map_redb(what: &str, e: redb::Error) -> Error {
    match e {
        redb::Error::Corrupted(_)
        | redb::Error::UpgradeRequired(_)
        | redb::Error::TableTypeMismatch { .. }
        | redb::Error::TypeDefinitionChanged { .. }
        | redb::Error::TableIsMultimap(_)
        | redb::Error::TableIsNotMultimap(_) => Error::Corrupt(format!("{what}: {e}")),
        other => Error::Unavailable(format!("{what}: {other}")),
    }
}

/// `.ctx("what")` on any redb result, naming the step that failed.
trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T>;
}

impl<T, E: Into<redb::Error>> Ctx<T> for std::result::Result<T, E> {
    fn ctx(self, what: &str) -> Result<T> {
        self.map_err(|e| map_redb(what, e.into()))
    }
}

/// Deletes up to `SWEEP_BATCH` entries past their expiry from an expiry index keyed
/// (expires_at, a, b) and from the table it indexes, keyed (a, b).
fn sweep_pair_expiry<V: redb::Value + 'static>(
    txn: &WriteTransaction,
    index: TableDefinition<(i64, &str, &str), ()>,
    table: TableDefinition<(&str, &str), V>,
    now: Millis,
    what: &str,
) -> Result<()> {
    let mut entries = txn.open_table(table).ctx(what)?;
    let mut expiry = txn.open_table(index).ctx(what)?;
    let expired: Vec<(i64, String, String)> = {
        let mut out = Vec::new();
        for item in expiry.range(..(now.saturating_add(1), "", "")).ctx(what)? {
            if out.len() >= SWEEP_BATCH {
                break;
            }
            let (k, _) = item.ctx(what)?;
            let (at, a, b) = k.value();
            out.push((at, a.to_owned(), b.to_owned()));
        }
        out
    };
    for (at, a, b) in expired {
        expiry.remove((at, a.as_str(), b.as_str())).ctx(what)?;
        entries.remove((a.as_str(), b.as_str())).ctx(what)?;
    }
    Ok(())
}

fn decode<T: DeserializeOwned>(what: &str, key: &str, json: &str) -> Result<T> {
    serde_json::from_str(json).map_err(|e| Error::Corrupt(format!("{what} {key:?}: {e}")))
}

fn encode<T: Serialize>(what: &str, value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| Error::Corrupt(format!("encode {what}: {e}")))
}

// ---- clock

/// Epoch microseconds by the system clock (0 if it is set before 1970).
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn now_ms() -> Millis {
    i64::try_from(now_us() / 1000).unwrap_or(i64::MAX)
}

fn page_limit(limit: usize) -> usize {
    if limit == 0 { DEFAULT_PAGE } else { limit }
}

// ---- transaction helpers

/// One write transaction: commits if `f` succeeds, aborts (by drop) if it fails.
fn write<T>(db: &Database, f: impl FnOnce(&WriteTransaction) -> Result<T>) -> Result<T> {
    let txn = db.begin_write().ctx("begin write transaction")?;
    let out = f(&txn)?;
    txn.commit().ctx("commit")?;
    Ok(out)
}

fn read(db: &Database) -> Result<ReadTransaction> {
    db.begin_read().ctx("begin read transaction")
}

fn load_job(
    jobs: &impl ReadableTable<&'static str, &'static str>,
    job_id: &str,
) -> Result<Option<JobRecord>> {
    match jobs.get(job_id).ctx("read job")? {
        Some(g) => decode("job", job_id, g.value()).map(Some),
        None => Ok(None),
    }
}

fn store_job(jobs: &mut Table<&'static str, &'static str>, job: &JobRecord) -> Result<()> {
    let json = encode("job", job)?;
    jobs.insert(job.spec.id.as_str(), json.as_str())
        .ctx("write job")?;
    Ok(())
}

fn load_run(
    runs: &impl ReadableTable<&'static str, &'static str>,
    schedule_id: &str,
) -> Result<Option<RunRecord>> {
    match runs.get(schedule_id).ctx("read run")? {
        Some(g) => decode("run", schedule_id, g.value()).map(Some),
        None => Ok(None),
    }
}

/// Rewrites a job's pending member: removes the old one (and its index key), then arms
/// `due` if any. Both tables always change together, so they cannot disagree.
fn set_pending(
    txn: &WriteTransaction,
    partitions: u32,
    job_id: &str,
    due: Option<Millis>,
) -> Result<()> {
    let mut pending = txn.open_table(PENDING).ctx("open pending")?;
    let mut index = txn.open_table(DUE_INDEX).ctx("open due index")?;
    let partition = partition_of(job_id, partitions);
    let old = pending
        .remove(job_id)
        .ctx("remove pending member")?
        .map(|g| g.value());
    if let Some(old) = old {
        index
            .remove((partition, old, job_id))
            .ctx("remove due index key")?;
    }
    if let Some(due) = due {
        pending.insert(job_id, due).ctx("write pending member")?;
        index
            .insert((partition, due, job_id), ())
            .ctx("write due index key")?;
    }
    Ok(())
}

/// The earliest pending due time in `partition`, if any.
fn earliest_due(
    index: &impl ReadableTable<(u32, i64, &'static str), ()>,
    partition: u32,
) -> Result<Option<Millis>> {
    let mut range = index
        .range((partition, i64::MIN, "")..)
        .ctx("scan due index")?;
    match range.next() {
        Some(item) => {
            let (k, _) = item.ctx("scan due index")?;
            let (p, due, _) = k.value();
            Ok((p == partition).then_some(due))
        }
        None => Ok(None),
    }
}

/// Appends triggers to the queue with `triggered_at = now`, allocating sequence numbers
/// from the meta record (inside this write transaction, hence in commit order).
fn append_triggers(txn: &WriteTransaction, now: Millis, triggers: Vec<Trigger>) -> Result<()> {
    if triggers.is_empty() {
        return Ok(());
    }
    let mut meta = txn.open_table(META).ctx("open meta")?;
    let mut queue = txn.open_table(TRIGGERS).ctx("open triggers")?;
    let mut seq = meta
        .get(META_TRIGGER_SEQ)
        .ctx("read trigger sequence")?
        .map(|g| g.value())
        .unwrap_or(1);
    for mut trigger in triggers {
        trigger.triggered_at = now;
        let json = encode(
            "trigger",
            &QueuedTrigger {
                enqueued_at: now,
                trigger,
            },
        )?;
        queue.insert(seq, json.as_str()).ctx("append trigger")?;
        seq += 1;
    }
    meta.insert(META_TRIGGER_SEQ, seq)
        .ctx("write trigger sequence")?;
    Ok(())
}

/// A run holds a lease (and a slot on its node) in these states.
fn held(state: RunState) -> bool {
    matches!(state, RunState::Dispatched | RunState::Running)
}

/// The smallest key above every `(prefix, _)` key of a two-part string key.
fn successor(prefix: &str) -> String {
    format!("{prefix}\0")
}

/// Every table that describes runs, open together for one write transaction, with the
/// store's clock read once for it.
///
/// redb hands out one handle per table at a time, so the run operations share these
/// handles instead of each helper opening its own. It also keeps in one place the
/// answer to "what must go when a run record goes" (`delete`).
struct RunTables<'t> {
    now: Millis,
    now_us: u64,
    partitions: u32,
    retention_ms: i64,
    max_runs_per_job: u64,
    runs: Table<'t, &'static str, &'static str>,
    by_job: Table<'t, (&'static str, i64, &'static str), ()>,
    by_created: Table<'t, (i64, &'static str), ()>,
    counts: Table<'t, &'static str, u64>,
    /// (job_id, schedule_id): the job's runs that are not final, queued ones included.
    active: Table<'t, (&'static str, &'static str), ()>,
    /// (job_id, position) → schedule_id: the job's serial queue, popped from the front.
    serial: Table<'t, (&'static str, u64), &'static str>,
    /// schedule_id → (partition, due): the run's timer, so it can be found and moved.
    timers: Table<'t, &'static str, (u32, i64)>,
    timer_index: Table<'t, (u32, i64, &'static str), ()>,
    /// (node_id, schedule_id): the runs leased to a node, counted for max concurrency.
    node_runs: Table<'t, (&'static str, &'static str), ()>,
    tokens: Table<'t, &'static str, u64>,
    logs: Table<'t, (&'static str, u64), &'static str>,
    /// schedule_id → (last seq, message bytes kept).
    log_meta: Table<'t, &'static str, (u64, u64)>,
    /// schedule_id → JSON `OutboxEntry`: webhooks written by `finalize`.
    outbox: Table<'t, &'static str, &'static str>,
    /// (partition, due, schedule_id): when each outbox entry is due.
    outbox_due: Table<'t, (u32, i64, &'static str), ()>,
}

impl<'t> RunTables<'t> {
    fn open(txn: &'t WriteTransaction, inner: &Inner) -> Result<Self> {
        let now_us = now_us();
        Ok(RunTables {
            now: i64::try_from(now_us / 1000).unwrap_or(i64::MAX),
            now_us,
            partitions: inner.partitions,
            retention_ms: inner.run_retention_ms,
            max_runs_per_job: inner.max_runs_per_job,
            runs: txn.open_table(RUNS).ctx("open runs")?,
            by_job: txn.open_table(RUNS_BY_JOB).ctx("open runs-by-job")?,
            by_created: txn
                .open_table(RUNS_BY_CREATED)
                .ctx("open runs-by-created")?,
            counts: txn.open_table(RUN_COUNTS).ctx("open run counts")?,
            active: txn.open_table(ACTIVE).ctx("open active runs")?,
            serial: txn.open_table(SERIAL).ctx("open serial queue")?,
            timers: txn.open_table(TIMERS).ctx("open run timers")?,
            timer_index: txn.open_table(TIMER_INDEX).ctx("open run timer index")?,
            node_runs: txn.open_table(NODE_RUNS).ctx("open node runs")?,
            tokens: txn.open_table(TOKENS).ctx("open token counters")?,
            logs: txn.open_table(LOGS).ctx("open run logs")?,
            log_meta: txn.open_table(LOG_META).ctx("open run log meta")?,
            outbox: txn.open_table(OUTBOX).ctx("open webhook outbox")?,
            outbox_due: txn
                .open_table(OUTBOX_DUE)
                .ctx("open webhook outbox index")?,
        })
    }

    fn expired(&self, run: &RunRecord) -> bool {
        run.created_at.saturating_add(self.retention_ms) <= self.now
    }

    /// The run, unless it is missing or past its retention (gone as far as anyone can
    /// tell: in redis its key would have expired).
    fn load(&self, schedule_id: &str) -> Result<Option<RunRecord>> {
        Ok(load_run(&self.runs, schedule_id)?.filter(|r| !self.expired(r)))
    }

    /// The run an executor's message names: shard 0 of a fanned-out broadcast run
    /// travels under the parent's schedule_id.
    fn load_held(&self, schedule_id: &str) -> Result<Option<RunRecord>> {
        match self.load(schedule_id)? {
            Some(run) if run.is_fanned_out() => self.load(&RunRecord::shard_id(schedule_id, 0)),
            other => Ok(other),
        }
    }

    /// The stored run for a schedule_id about to be recorded: a record past retention
    /// is deleted on the spot so the new one takes its place.
    fn existing(&mut self, schedule_id: &str) -> Result<Option<RunRecord>> {
        match load_run(&self.runs, schedule_id)? {
            Some(run) if self.expired(&run) => {
                self.delete(&run)?;
                Ok(None)
            }
            other => Ok(other),
        }
    }

    /// Writes the run back and re-scores its timer: the earliest deadline while it is
    /// not final, none once it is.
    fn save(&mut self, run: &RunRecord) -> Result<()> {
        let json = encode("run", run)?;
        self.runs
            .insert(run.schedule_id.as_str(), json.as_str())
            .ctx("write run")?;
        let due = if run.state.is_final() {
            None
        } else {
            run.deadlines.earliest()
        };
        self.set_timer(&run.schedule_id, &run.job_id, due)
    }

    fn set_timer(&mut self, schedule_id: &str, job_id: &str, due: Option<Millis>) -> Result<()> {
        self.drop_timer(schedule_id)?;
        if let Some(due) = due {
            let p = partition_of(job_id, self.partitions);
            self.timers
                .insert(schedule_id, (p, due))
                .ctx("write run timer")?;
            self.timer_index
                .insert((p, due, schedule_id), ())
                .ctx("write run timer index")?;
        }
        Ok(())
    }

    fn drop_timer(&mut self, schedule_id: &str) -> Result<()> {
        let old = self
            .timers
            .remove(schedule_id)
            .ctx("delete run timer")?
            .map(|g| g.value());
        if let Some((p, due)) = old {
            self.timer_index
                .remove((p, due, schedule_id))
                .ctx("delete run timer index")?;
        }
        Ok(())
    }

    /// A fresh fencing token for a run of `job_id`: max(counter + 1, store time in µs).
    /// The clock keeps tokens growing even if the counter were lost; the counter keeps
    /// them growing if the clock stepped back.
    fn new_token(&mut self, job_id: &str) -> Result<u64> {
        let counter = self
            .tokens
            .get(job_id)
            .ctx("read token counter")?
            .map(|g| g.value())
            .unwrap_or(0);
        let token = counter.saturating_add(1).max(self.now_us);
        self.tokens
            .insert(job_id, token)
            .ctx("write token counter")?;
        Ok(token)
    }

    /// How many runs are leased to the node.
    fn busy(&self, node_id: &str) -> Result<u64> {
        let upper = successor(node_id);
        let mut n = 0;
        for item in self
            .node_runs
            .range((node_id, "")..(upper.as_str(), ""))
            .ctx("scan node runs")?
        {
            item.ctx("scan node runs")?;
            n += 1;
        }
        Ok(n)
    }

    /// The run leaves DISPATCHED/RUNNING (the caller changes its state): its node's
    /// lease count drops.
    fn leave_node(&mut self, run: &RunRecord) -> Result<()> {
        if held(run.state) && !run.node_id.is_empty() {
            self.node_runs
                .remove((run.node_id.as_str(), run.schedule_id.as_str()))
                .ctx("delete node run")?;
        }
        Ok(())
    }

    /// Takes the lease away: a new token makes the holder's stale. None when the run
    /// held no lease.
    fn revoke(&mut self, run: &mut RunRecord, reason: &str) -> Result<Option<Revocation>> {
        if !held(run.state) || run.node_id.is_empty() {
            return Ok(None);
        }
        let revocation = Revocation {
            schedule_id: run.schedule_id.clone(),
            node_id: run.node_id.clone(),
            token: run.fencing_token,
            reason: reason.to_owned(),
        };
        self.leave_node(run)?;
        run.fencing_token = self.new_token(&run.job_id)?;
        Ok(Some(revocation))
    }

    /// The schedule_ids of the job's runs that are not final (as indexed).
    fn active_ids(&self, job_id: &str) -> Result<Vec<String>> {
        let upper = successor(job_id);
        let mut out = Vec::new();
        for item in self
            .active
            .range((job_id, "")..(upper.as_str(), ""))
            .ctx("scan active runs")?
        {
            let (k, _) = item.ctx("scan active runs")?;
            out.push(k.value().1.to_owned());
        }
        Ok(out)
    }

    /// The job's serial queue, front first: (position, schedule_id).
    fn queue(&self, job_id: &str) -> Result<Vec<(u64, String)>> {
        let mut out = Vec::new();
        for item in self
            .serial
            .range((job_id, 0)..=(job_id, u64::MAX))
            .ctx("scan serial queue")?
        {
            let (k, v) = item.ctx("scan serial queue")?;
            out.push((k.value().1, v.value().to_owned()));
        }
        Ok(out)
    }

    fn enqueue(&mut self, job_id: &str, schedule_id: &str) -> Result<()> {
        let last = self
            .serial
            .range((job_id, 0)..=(job_id, u64::MAX))
            .ctx("scan serial queue")?
            .next_back()
            .transpose()
            .ctx("scan serial queue")?
            .map(|(k, _)| k.value().1);
        let pos = last.map_or(0, |p| p.saturating_add(1));
        self.serial
            .insert((job_id, pos), schedule_id)
            .ctx("write serial queue")?;
        Ok(())
    }

    fn unqueue(&mut self, job_id: &str, schedule_id: &str) -> Result<()> {
        for (pos, sid) in self.queue(job_id)? {
            if sid == schedule_id {
                self.serial
                    .remove((job_id, pos))
                    .ctx("delete serial queue entry")?;
            }
        }
        Ok(())
    }

    /// The next queued serial run of the job becomes due to route now; returns its
    /// schedule_id. Nothing pops while another run of the job that is not queued is
    /// still active: serial means one at a time.
    fn pop_serial(&mut self, job_id: &str) -> Result<Option<String>> {
        let queue = self.queue(job_id)?;
        if queue.is_empty() {
            return Ok(None);
        }
        let queued: HashSet<&str> = queue.iter().map(|(_, sid)| sid.as_str()).collect();
        for sid in self.active_ids(job_id)? {
            if queued.contains(sid.as_str()) {
                continue;
            }
            if self.load(&sid)?.is_some_and(|r| !r.state.is_final()) {
                return Ok(None);
            }
        }
        for (pos, sid) in queue {
            self.serial
                .remove((job_id, pos))
                .ctx("delete serial queue entry")?;
            let Some(mut run) = self.load(&sid)? else {
                continue;
            };
            if run.state != RunState::Waiting {
                continue;
            }
            run.deadlines.wake_at = self.now;
            run.deadlines.wait_until = self.now.saturating_add(run.plan.dispatch_wait_ms);
            run.reason.clear();
            self.save(&run)?;
            return Ok(Some(sid));
        }
        Ok(None)
    }

    /// Makes the run final (its lease already revoked or released): no deadlines, out
    /// of the active set and the serial queue. Returns the serial run this released,
    /// if `pop`. The caller saves the run.
    fn finalize(
        &mut self,
        run: &mut RunRecord,
        state: RunState,
        reason: &str,
        pop: bool,
    ) -> Result<Option<String>> {
        run.deadlines = Deadlines::default();
        run.state = state;
        run.reason = reason.to_owned();
        if run.finished_at.is_none_or(|f| f == 0) {
            run.finished_at = Some(self.now);
        }
        if !run.parent.is_empty() {
            return self.count_shard(run);
        }
        self.write_outbox(run)?;
        let (job_id, sid) = (run.job_id.as_str(), run.schedule_id.as_str());
        self.active.remove((job_id, sid)).ctx("delete active run")?;
        self.unqueue(job_id, sid)?;
        if pop {
            self.pop_serial(job_id)
        } else {
            Ok(None)
        }
    }

    /// The run's webhook: when its plan names a callback URL, its outbox entry (the
    /// body fixed now, due now) and callback state PENDING, in the step that makes it
    /// final.
    fn write_outbox(&mut self, run: &mut RunRecord) -> Result<()> {
        let Some(url) = run.plan.callback_url.clone().filter(|u| !u.is_empty()) else {
            return Ok(());
        };
        let body = encode("webhook body", &WebhookBody::of(run))?;
        let entry = OutboxEntry {
            job_id: run.job_id.clone(),
            url,
            body,
            created_at: self.now,
            attempts: 0,
            token: 0,
            in_flight: false,
            due: self.now,
        };
        self.put_outbox(&run.schedule_id, &entry, None)?;
        run.callback_state = CallbackState::Pending;
        Ok(())
    }

    /// Writes an outbox entry and moves its index key from `old_due` (if any).
    fn put_outbox(
        &mut self,
        schedule_id: &str,
        entry: &OutboxEntry,
        old_due: Option<Millis>,
    ) -> Result<()> {
        let p = partition_of(&entry.job_id, self.partitions);
        if let Some(old) = old_due {
            self.outbox_due
                .remove((p, old, schedule_id))
                .ctx("delete outbox index")?;
        }
        let json = encode("outbox entry", entry)?;
        self.outbox
            .insert(schedule_id, json.as_str())
            .ctx("write outbox entry")?;
        self.outbox_due
            .insert((p, entry.due, schedule_id), ())
            .ctx("write outbox index")?;
        Ok(())
    }

    fn load_outbox(&self, schedule_id: &str) -> Result<Option<OutboxEntry>> {
        self.outbox
            .get(schedule_id)
            .ctx("read outbox entry")?
            .map(|g| decode("outbox entry", schedule_id, g.value()))
            .transpose()
    }

    fn remove_outbox(&mut self, schedule_id: &str, entry: &OutboxEntry) -> Result<()> {
        let p = partition_of(&entry.job_id, self.partitions);
        self.outbox.remove(schedule_id).ctx("delete outbox entry")?;
        self.outbox_due
            .remove((p, entry.due, schedule_id))
            .ctx("delete outbox index")?;
        Ok(())
    }

    /// A shard became final: it counts on its parent, which ends with its last shard
    /// (SUCCEEDED only if every shard did). Returns the serial run the parent released.
    fn count_shard(&mut self, shard: &RunRecord) -> Result<Option<String>> {
        let Some(mut parent) = self.load(&shard.parent)? else {
            return Ok(None);
        };
        if parent.state.is_final() {
            return Ok(None);
        }
        parent.shards_done += 1;
        if shard.state == RunState::Succeeded {
            parent.shards_succeeded += 1;
        } else {
            let mut note = format!("shard {} {}", shard.shard_index, shard.state);
            if !shard.error_code.is_empty() {
                note.push_str(&format!(" ({})", shard.error_code));
            }
            if !parent.error_message.is_empty() {
                parent.error_message.push_str("; ");
            }
            parent.error_message.push_str(&note);
        }
        let mut next = None;
        if parent.shards_done >= parent.shard_total {
            let state = if parent.shards_succeeded >= parent.shard_total {
                RunState::Succeeded
            } else {
                parent.error_code = "shards_failed".to_owned();
                RunState::Failed
            };
            next = self.finalize(&mut parent, state, "", true)?;
        }
        self.save(&parent)?;
        Ok(next)
    }

    /// Cancels a run that is not final and, for a fanned-out broadcast run, each of its
    /// shards still going (the parent first, so they do not count on it). Returns the
    /// revocations and the serial run released (if `pop`). The caller saves `run`.
    fn cancel_tree(
        &mut self,
        run: &mut RunRecord,
        reason: &str,
        pop: bool,
    ) -> Result<(Vec<Revocation>, Option<String>)> {
        let mut revoked: Vec<Revocation> = self.revoke(run, reason)?.into_iter().collect();
        let next = self.finalize(run, RunState::Cancelled, reason, pop)?;
        if run.is_fanned_out() {
            self.save(run)?;
            for i in 0..run.shard_total {
                let Some(mut shard) = self.load(&RunRecord::shard_id(&run.schedule_id, i))? else {
                    continue;
                };
                if shard.state.is_final() {
                    continue;
                }
                revoked.extend(self.revoke(&mut shard, reason)?);
                self.finalize(&mut shard, RunState::Cancelled, reason, false)?;
                self.save(&shard)?;
            }
        }
        Ok((revoked, next))
    }

    /// An attempt ended badly (its lease already revoked or released): WAITING at
    /// attempt + 1 after `delay`, with a new token, while attempts remain; otherwise
    /// final in `final_state`. Returns the serial run a final outcome released.
    fn retry_or_final(
        &mut self,
        run: &mut RunRecord,
        final_state: RunState,
        reason: &str,
        delay: i64,
    ) -> Result<Option<String>> {
        if run.attempt < run.plan.max_attempts {
            run.last_node = run.node_id.clone();
            run.fencing_token = self.new_token(&run.job_id)?;
            run.attempt += 1;
            run.state = RunState::Waiting;
            run.reason = format!("retry: {reason}");
            run.finished_at = None;
            let wake_at = self.now.saturating_add(delay);
            run.deadlines = Deadlines {
                wake_at,
                wait_until: wake_at.saturating_add(run.plan.dispatch_wait_ms),
                ..Deadlines::default()
            };
            return Ok(None);
        }
        self.finalize(run, final_state, reason, true)
    }

    /// Writes a new run record with its indexes and timer, then keeps the job's index
    /// bounded: the oldest (by scheduled time) fall out first, with everything of theirs.
    fn insert_new(&mut self, run: &RunRecord) -> Result<()> {
        let sid = run.schedule_id.as_str();
        let job_id = run.job_id.as_str();
        self.save(run)?;
        self.by_job
            .insert((job_id, run.scheduled_at, sid), ())
            .ctx("write run index key")?;
        self.by_created
            .insert((run.created_at, sid), ())
            .ctx("write run retention key")?;
        let count = self
            .counts
            .get(job_id)
            .ctx("read run count")?
            .map(|g| g.value())
            .unwrap_or(0)
            + 1;
        self.counts.insert(job_id, count).ctx("write run count")?;
        let excess = count.saturating_sub(self.max_runs_per_job);
        if excess == 0 {
            return Ok(());
        }
        let oldest: Vec<String> = {
            let mut out = Vec::new();
            for item in self
                .by_job
                .range((job_id, i64::MIN, "")..)
                .ctx("scan runs-by-job")?
            {
                if out.len() as u64 >= excess {
                    break;
                }
                let (k, _) = item.ctx("scan runs-by-job")?;
                let (j, _, old_sid) = k.value();
                if j != job_id {
                    break;
                }
                out.push(old_sid.to_owned());
            }
            out
        };
        for old_sid in oldest {
            if let Some(old) = load_run(&self.runs, &old_sid)? {
                self.delete(&old)?;
            }
        }
        Ok(())
    }

    /// Deletes a run record and everything that points at it or hangs off it: its
    /// indexes, its place in the active set and serial queue, its timer, its node slot
    /// and its logs.
    fn delete(&mut self, run: &RunRecord) -> Result<()> {
        if run.is_fanned_out() {
            for i in 0..run.shard_total {
                if let Some(shard) =
                    load_run(&self.runs, &RunRecord::shard_id(&run.schedule_id, i))?
                {
                    self.delete(&shard)?;
                }
            }
        }
        let sid = run.schedule_id.as_str();
        let job_id = run.job_id.as_str();
        self.runs.remove(sid).ctx("delete run")?;
        let indexed = self
            .by_job
            .remove((job_id, run.scheduled_at, sid))
            .ctx("delete run index key")?
            .is_some();
        self.by_created
            .remove((run.created_at, sid))
            .ctx("delete run retention key")?;
        if indexed {
            let count = self
                .counts
                .get(job_id)
                .ctx("read run count")?
                .map(|g| g.value())
                .unwrap_or(0);
            if count <= 1 {
                self.counts.remove(job_id).ctx("delete run count")?;
            } else {
                self.counts
                    .insert(job_id, count - 1)
                    .ctx("write run count")?;
            }
        }
        self.active.remove((job_id, sid)).ctx("delete active run")?;
        self.unqueue(job_id, sid)?;
        self.drop_timer(sid)?;
        self.leave_node(run)?;
        let seqs: Vec<u64> = {
            let mut out = Vec::new();
            for item in self
                .logs
                .range((sid, 0)..=(sid, u64::MAX))
                .ctx("scan run logs")?
            {
                let (k, _) = item.ctx("scan run logs")?;
                out.push(k.value().1);
            }
            out
        };
        for seq in seqs {
            self.logs.remove((sid, seq)).ctx("delete run log line")?;
        }
        self.log_meta.remove(sid).ctx("delete run log meta")?;
        Ok(())
    }

    /// Deletes up to `SWEEP_BATCH` runs whose retention has passed, oldest first.
    fn sweep(&mut self) -> Result<()> {
        let cutoff = self.now.saturating_sub(self.retention_ms);
        let expired = due_keys(&self.by_created, cutoff, "scan runs-by-created")?;
        for (created_at, sid) in expired {
            match load_run(&self.runs, &sid)? {
                Some(run) => self.delete(&run)?,
                None => {
                    // A retention key without a record: drop it so the sweep moves on.
                    tracing::warn!(schedule_id = %sid, "run retention key without a run record");
                    self.by_created
                        .remove((created_at, sid.as_str()))
                        .ctx("delete run retention key")?;
                }
            }
        }
        Ok(())
    }
}

/// Why a run of this job must be recorded SKIPPED rather than started, if it must.
fn job_skip_reason(job: Option<&JobRecord>) -> Option<&'static str> {
    match job {
        None => Some("deleted"),
        Some(j) if j.paused => Some("paused"),
        Some(_) => None,
    }
}

/// What `begin_run`'s overlap policy makes of a new run.
enum Start {
    /// WAITING, due to be routed now.
    Route,
    /// WAITING at the back of the job's serial queue.
    Queue,
    /// SKIPPED, for this reason.
    Skip(&'static str),
}

/// Up to `limit` ids of a `(partition, time, id)` index whose time is due by now,
/// earliest first: run timers and webhook deliveries.
fn due_in_partition(
    db: &Database,
    table: TableDefinition<(u32, i64, &str), ()>,
    partition: u32,
    limit: usize,
    what: &str,
) -> Result<Vec<String>> {
    let mut out = Vec::new();
    if limit == 0 {
        return Ok(out);
    }
    let txn = read(db)?;
    let now = now_ms();
    let index = txn.open_table(table).ctx(what)?;
    for item in index
        .range((partition, i64::MIN, "")..(partition, now.saturating_add(1), ""))
        .ctx(what)?
    {
        let (k, _) = item.ctx(what)?;
        out.push(k.value().2.to_owned());
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
}

/// A transition that was refused.
fn refused(reason: &str, run: Option<RunRecord>) -> Transition {
    Transition {
        applied: Applied::No(reason.to_owned()),
        run,
        revoked: Vec::new(),
        next_serial: None,
    }
}

/// A transition that changed the run.
fn applied(
    run: RunRecord,
    revoked: impl IntoIterator<Item = Revocation>,
    next_serial: Option<String>,
) -> Transition {
    Transition {
        applied: Applied::Yes,
        run: Some(run),
        revoked: revoked.into_iter().collect(),
        next_serial,
    }
}

/// Up to `SWEEP_BATCH` keys of a `(time, id)` index whose time is ≤ `until`,
/// earliest first.
fn due_keys(
    index: &impl ReadableTable<(i64, &'static str), ()>,
    until: Millis,
    what: &str,
) -> Result<Vec<(i64, String)>> {
    let mut out = Vec::new();
    for item in index.range(..(until.saturating_add(1), "")).ctx(what)? {
        if out.len() >= SWEEP_BATCH {
            break;
        }
        let (k, _) = item.ctx(what)?;
        let (at, id) = k.value();
        out.push((at, id.to_owned()));
    }
    Ok(out)
}

/// Deletes up to `SWEEP_BATCH` nodes whose expiry has passed, earliest first.
fn sweep_nodes(txn: &WriteTransaction, now: Millis) -> Result<()> {
    let mut nodes = txn.open_table(NODES).ctx("open nodes")?;
    let mut expiry = txn.open_table(NODE_EXPIRY).ctx("open node expiry")?;
    let expired = due_keys(&expiry, now, "scan node expiry")?;
    for (at, node_id) in expired {
        expiry
            .remove((at, node_id.as_str()))
            .ctx("delete node expiry")?;
        // Record and expiry key always change together; the check only guards against
        // deleting a record that a damaged index no longer describes.
        let stored_expiry = nodes
            .get(node_id.as_str())
            .ctx("read node")?
            .map(|g| g.value().1);
        if stored_expiry == Some(at) {
            nodes.remove(node_id.as_str()).ctx("delete node")?;
        }
    }
    Ok(())
}

impl Inner {
    fn expired_run(&self, run: &RunRecord, now: Millis) -> bool {
        run.created_at.saturating_add(self.run_retention_ms) <= now
    }

    fn queue_state(&self) -> MutexGuard<'_, QueueState> {
        // The state is a watermark and a map, each always left consistent between
        // statements, so a panic elsewhere cannot leave it half-updated.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

// ---- the operations, each one redb transaction, run on the blocking pool

impl Inner {
    fn create_job(&self, mut job: JobRecord) -> Result<JobRecord> {
        write(&self.db, |txn| {
            let now = now_ms();
            let mut jobs = txn.open_table(JOBS).ctx("open jobs")?;
            if jobs.get(job.spec.id.as_str()).ctx("read job")?.is_some() {
                return Err(Error::JobExists(job.spec.id.clone()));
            }
            job.version = 1;
            job.created_at = now;
            job.updated_at = now;
            if job.paused {
                job.next_fire = None;
            }
            store_job(&mut jobs, &job)?;
            drop(jobs);
            set_pending(
                txn,
                self.partitions,
                &job.spec.id,
                job.next_fire.map(|a| a.due),
            )?;
            Ok(job)
        })
    }

    fn update_job(&self, mut job: JobRecord, expected_version: u64) -> Result<JobRecord> {
        write(&self.db, |txn| {
            let now = now_ms();
            let mut jobs = txn.open_table(JOBS).ctx("open jobs")?;
            let Some(stored) = load_job(&jobs, &job.spec.id)? else {
                return Err(Error::JobNotFound(job.spec.id.clone()));
            };
            if stored.version != expected_version {
                return Err(Error::VersionConflict {
                    job_id: job.spec.id.clone(),
                    expected: expected_version,
                    current: stored.version,
                });
            }
            job.version = stored.version + 1;
            job.created_at = stored.created_at;
            job.updated_at = now;
            if job.paused {
                job.next_fire = None;
            }
            store_job(&mut jobs, &job)?;
            drop(jobs);
            set_pending(
                txn,
                self.partitions,
                &job.spec.id,
                job.next_fire.map(|a| a.due),
            )?;
            Ok(job)
        })
    }

    fn delete_job(&self, job_id: &str) -> Result<()> {
        write(&self.db, |txn| {
            let mut jobs = txn.open_table(JOBS).ctx("open jobs")?;
            if jobs.remove(job_id).ctx("delete job")?.is_none() {
                return Err(Error::JobNotFound(job_id.to_owned()));
            }
            drop(jobs);
            // Runs and the token counter stay: runs (in flight or not) until retention
            // ends, and the counter so that a job re-created under the same id keeps
            // growing tokens.
            set_pending(txn, self.partitions, job_id, None)
        })
    }

    fn get_job(&self, job_id: &str) -> Result<Option<JobRecord>> {
        let txn = read(&self.db)?;
        let jobs = txn.open_table(JOBS).ctx("open jobs")?;
        load_job(&jobs, job_id)
    }

    /// One read transaction for the lot, so the jobs are a consistent snapshot.
    fn get_jobs(&self, job_ids: &[String]) -> Result<Vec<JobRecord>> {
        let txn = read(&self.db)?;
        let jobs = txn.open_table(JOBS).ctx("open jobs")?;
        let mut out = Vec::with_capacity(job_ids.len());
        for id in job_ids {
            if let Some(job) = load_job(&jobs, id)? {
                out.push(job);
            }
        }
        Ok(out)
    }

    /// Jobs in job id order; the cursor is the last job id of the previous page.
    fn list_jobs(&self, cursor: Option<String>, limit: usize) -> Result<Page<JobRecord>> {
        let limit = page_limit(limit);
        let txn = read(&self.db)?;
        let jobs = txn.open_table(JOBS).ctx("open jobs")?;
        let start = match cursor.as_deref() {
            Some(c) => Bound::Excluded(c),
            None => Bound::Unbounded,
        };
        let mut items = Vec::new();
        let mut more = false;
        for item in jobs
            .range::<&str>((start, Bound::Unbounded))
            .ctx("scan jobs")?
        {
            if items.len() == limit {
                more = true;
                break;
            }
            let (k, v) = item.ctx("scan jobs")?;
            items.push(decode::<JobRecord>("job", k.value(), v.value())?);
        }
        let next_cursor = if more {
            items.last().map(|j| j.spec.id.clone())
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }

    fn due_fires(&self, partition: u32, limit: usize) -> Result<DueBatch> {
        let txn = read(&self.db)?;
        let now = now_ms();
        let index = txn.open_table(DUE_INDEX).ctx("open due index")?;
        let jobs = txn.open_table(JOBS).ctx("open jobs")?;
        let mut due_members = Vec::new();
        let mut next_due = None;
        for item in index
            .range((partition, i64::MIN, "")..)
            .ctx("scan due index")?
        {
            let (k, _) = item.ctx("scan due index")?;
            let (p, due, job_id) = k.value();
            if p != partition {
                break;
            }
            if due > now || due_members.len() >= limit {
                next_due = Some(due);
                break;
            }
            due_members.push((job_id.to_owned(), due));
        }
        let mut fires = Vec::with_capacity(due_members.len());
        for (job_id, due) in due_members {
            match load_job(&jobs, &job_id)? {
                Some(job) => fires.push(DueFire {
                    job_id,
                    due,
                    // The pending member is always written from `next_fire`, so the armed
                    // fire carries the planned time of this due.
                    planned: job.next_fire.map_or(due, |a| a.planned),
                    version: job.version,
                }),
                // Job and pending member change in one transaction, so this cannot happen
                // short of damage; skipping keeps the rest of the partition firing.
                None => tracing::warn!(job_id = %job_id, "pending fire without a job"),
            }
        }
        Ok(DueBatch {
            now,
            fires,
            next_due,
        })
    }

    fn claim_fires(&self, partition: u32, claims: Vec<FireClaim>) -> Result<ClaimOutcome> {
        write(&self.db, |txn| {
            let now = now_ms();
            let mut results = Vec::with_capacity(claims.len());
            let mut appended = Vec::new();
            for claim in claims {
                let home = partition_of(&claim.job_id, self.partitions);
                if home != partition {
                    // A caller bug (claims come from `due_fires` of one partition). The
                    // redis backend cannot touch another partition's slot in one script,
                    // so this one refuses too rather than silently working.
                    return Err(Error::Corrupt(format!(
                        "claim for job {:?} sent to partition {partition}, but it lives in {home}",
                        claim.job_id
                    )));
                }
                let result = self.claim_one(txn, &claim)?;
                if result == ClaimResult::Claimed {
                    appended.extend(claim.triggers);
                }
                results.push(result);
            }
            append_triggers(txn, now, appended)?;
            let index = txn.open_table(DUE_INDEX).ctx("open due index")?;
            let next_due = earliest_due(&index, partition)?;
            Ok(ClaimOutcome {
                now,
                results,
                next_due,
            })
        })
    }

    /// One claim's compare-and-set, inside the batch's transaction.
    fn claim_one(&self, txn: &WriteTransaction, claim: &FireClaim) -> Result<ClaimResult> {
        let mut jobs = txn.open_table(JOBS).ctx("open jobs")?;
        let Some(mut job) = load_job(&jobs, &claim.job_id)? else {
            return Ok(ClaimResult::Gone);
        };
        if job.paused {
            return Ok(ClaimResult::Gone);
        }
        let pending_due = {
            let pending = txn.open_table(PENDING).ctx("open pending")?;
            pending
                .get(claim.job_id.as_str())
                .ctx("read pending member")?
                .map(|g| g.value())
        };
        // No member while enabled means the schedule ended or another claim consumed the
        // last fire: either way the claimer's view moved.
        if pending_due != Some(claim.expected_due) {
            return Ok(ClaimResult::Moved);
        }
        if job.version != claim.expected_version {
            return Ok(ClaimResult::VersionChanged);
        }
        // A claim advances the schedule but is not a job change: the version stays, so
        // claims computed from the same definition keep matching.
        job.next_fire = claim.next;
        store_job(&mut jobs, &job)?;
        drop(jobs);
        set_pending(
            txn,
            self.partitions,
            &claim.job_id,
            claim.next.map(|a| a.due),
        )?;
        Ok(ClaimResult::Claimed)
    }

    fn enqueue_manual(&self, trigger: Trigger, key: Option<String>) -> Result<Enqueued> {
        write(&self.db, |txn| {
            let now = now_ms();
            {
                let jobs = txn.open_table(JOBS).ctx("open jobs")?;
                if jobs.get(trigger.job_id.as_str()).ctx("read job")?.is_none() {
                    return Err(Error::JobNotFound(trigger.job_id.clone()));
                }
            }
            self.sweep_idempotency(txn, now)?;
            let schedule_id = trigger.schedule_id();
            if let Some(key) = key.as_deref() {
                let mut keys = txn.open_table(IDEMPOTENCY).ctx("open idempotency")?;
                let mut expiry = txn
                    .open_table(IDEMPOTENCY_EXPIRY)
                    .ctx("open idempotency expiry")?;
                let job_id = trigger.job_id.as_str();
                let seen = keys
                    .get((job_id, key))
                    .ctx("read idempotency key")?
                    .map(|g| {
                        let (sid, expires_at) = g.value();
                        (sid.to_owned(), expires_at)
                    });
                match seen {
                    Some((first, expires_at)) if expires_at > now => {
                        return Ok(Enqueued {
                            schedule_id: first,
                            duplicate: true,
                        });
                    }
                    Some((_, expires_at)) => {
                        expiry
                            .remove((expires_at, job_id, key))
                            .ctx("delete idempotency expiry")?;
                    }
                    None => {}
                }
                let expires_at = now.saturating_add(self.idempotency_ttl_ms);
                keys.insert((job_id, key), (schedule_id.as_str(), expires_at))
                    .ctx("write idempotency key")?;
                expiry
                    .insert((expires_at, job_id, key), ())
                    .ctx("write idempotency expiry")?;
            }
            append_triggers(txn, now, vec![trigger])?;
            Ok(Enqueued {
                schedule_id,
                duplicate: false,
            })
        })
    }

    /// Deletes up to `SWEEP_BATCH` idempotency keys past their expiry.
    fn sweep_idempotency(&self, txn: &WriteTransaction, now: Millis) -> Result<()> {
        sweep_pair_expiry(txn, IDEMPOTENCY_EXPIRY, IDEMPOTENCY, now, "idempotency")
    }

    /// Delivers up to `max` never-delivered entries, in sequence order.
    fn read_once(&self, max: usize) -> Result<Vec<Delivery>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        // The lock is held across the read so that two concurrent readers cannot both
        // take the same entries past the watermark.
        let mut state = self.queue_state();
        let txn = read(&self.db)?;
        let now = now_ms();
        let queue = txn.open_table(TRIGGERS).ctx("open triggers")?;
        let mut out = Vec::new();
        for item in queue.range(state.next_unread..).ctx("scan triggers")? {
            if out.len() >= max {
                break;
            }
            let (k, v) = item.ctx("scan triggers")?;
            let seq = k.value();
            let entry_id = seq.to_string();
            let queued: QueuedTrigger = decode("trigger", &entry_id, v.value())?;
            out.push((seq, entry_id, queued.trigger));
        }
        let mut deliveries = Vec::with_capacity(out.len());
        for (seq, entry_id, trigger) in out {
            state.delivered.insert(seq, now);
            state.next_unread = seq + 1;
            deliveries.push(Delivery { entry_id, trigger });
        }
        Ok(deliveries)
    }

    fn reclaim(&self, min_idle: Duration, max: usize) -> Result<Vec<Delivery>> {
        let mut state = self.queue_state();
        let txn = read(&self.db)?;
        let now = now_ms();
        let min_idle = duration_ms(min_idle);
        let mut idle: Vec<u64> = state
            .delivered
            .iter()
            .filter(|(_, at)| now.saturating_sub(**at) >= min_idle)
            .map(|(seq, _)| *seq)
            .collect();
        idle.sort_unstable();
        let queue = txn.open_table(TRIGGERS).ctx("open triggers")?;
        let mut out = Vec::new();
        for seq in idle {
            if out.len() >= max {
                break;
            }
            let entry_id = seq.to_string();
            let json = queue
                .get(seq)
                .ctx("read trigger")?
                .map(|g| g.value().to_owned());
            match json {
                Some(json) => {
                    let queued: QueuedTrigger = decode("trigger", &entry_id, &json)?;
                    state.delivered.insert(seq, now);
                    out.push(Delivery {
                        entry_id,
                        trigger: queued.trigger,
                    });
                }
                // Acked since it was delivered (the ack raced this scan): forget it.
                None => {
                    state.delivered.remove(&seq);
                }
            }
        }
        Ok(out)
    }

    fn ack(&self, seq: u64) -> Result<()> {
        write(&self.db, |txn| {
            let mut queue = txn.open_table(TRIGGERS).ctx("open triggers")?;
            queue.remove(seq).ctx("delete trigger")?;
            Ok(())
        })?;
        self.queue_state().delivered.remove(&seq);
        Ok(())
    }

    fn record_run(&self, mut run: RunRecord) -> Result<Recorded> {
        write(&self.db, |txn| {
            let job = {
                let jobs = txn.open_table(JOBS).ctx("open jobs")?;
                load_job(&jobs, &run.job_id)?
            };
            let mut t = RunTables::open(txn, self)?;
            t.sweep()?;
            if let Some(existing) = t.existing(&run.schedule_id)? {
                return Ok(Recorded {
                    run: existing,
                    created: false,
                });
            }
            let now = t.now;
            // A trigger that already says why it is skipped keeps its reason.
            if run.state != RunState::Skipped
                && let Some(reason) = job_skip_reason(job.as_ref())
            {
                run.state = RunState::Skipped;
                run.reason = reason.to_owned();
                run.finished_at = Some(now);
            }
            // Callers leave the timestamps the store owns at zero/None (see
            // `RunRecord::from_trigger`); a SKIPPED run is finished the moment it exists.
            if run.created_at == 0 {
                run.created_at = now;
            }
            if run.state.is_final() && run.finished_at.is_none() {
                run.finished_at = Some(now);
            }
            t.insert_new(&run)?;
            Ok(Recorded { run, created: true })
        })
    }

    fn get_run(&self, schedule_id: &str) -> Result<Option<RunRecord>> {
        let txn = read(&self.db)?;
        let now = now_ms();
        let runs = txn.open_table(RUNS).ctx("open runs")?;
        Ok(load_run(&runs, schedule_id)?.filter(|r| !self.expired_run(r, now)))
    }

    /// Newest scheduled_at first. The cursor is the index key of the last run returned,
    /// `"<scheduled_at>:<schedule_id>"`; the next page starts strictly below it, so runs
    /// inserted meanwhile with a newer key can neither be repeated nor shift the page.
    fn list_runs(&self, job_id: &str, q: RunQuery) -> Result<Page<RunRecord>> {
        let limit = page_limit(q.limit);
        let cursor = q.cursor.as_deref().map(parse_run_cursor).transpose()?;
        let txn = read(&self.db)?;
        let now = now_ms();
        let index = txn.open_table(RUNS_BY_JOB).ctx("open runs-by-job")?;
        let runs = txn.open_table(RUNS).ctx("open runs")?;

        // "job\0" is the smallest string above "job", so (job\0, MIN, "") bounds every
        // key of this job from above.
        let successor = format!("{job_id}\0");
        let lower: (&str, i64, &str) = (job_id, q.from.unwrap_or(i64::MIN), "");
        let mut upper: (&str, i64, &str) = (successor.as_str(), i64::MIN, "");
        if let Some(to) = q.to {
            upper = (job_id, to, "");
        }
        if let Some((at, sid)) = &cursor {
            let c = (job_id, *at, sid.as_str());
            if c < upper {
                upper = c;
            }
        }
        if lower >= upper {
            return Ok(Page {
                items: Vec::new(),
                next_cursor: None,
            });
        }
        let mut items = Vec::new();
        let mut last_key = None;
        let mut more = false;
        for item in index
            .range((Bound::Included(lower), Bound::Excluded(upper)))
            .ctx("scan runs-by-job")?
            .rev()
        {
            let (k, _) = item.ctx("scan runs-by-job")?;
            let (_, at, sid) = k.value();
            let Some(run) = load_run(&runs, sid)? else {
                continue;
            };
            if self.expired_run(&run, now) {
                continue;
            }
            if items.len() == limit {
                more = true;
                break;
            }
            last_key = Some((at, sid.to_owned()));
            items.push(run);
        }
        let next_cursor = if more {
            last_key.map(|(at, sid)| format!("{at}:{sid}"))
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }

    fn begin_run(&self, mut run: RunRecord, route_grace: Duration) -> Result<Begun> {
        write(&self.db, |txn| {
            let job = {
                let jobs = txn.open_table(JOBS).ctx("open jobs")?;
                load_job(&jobs, &run.job_id)?
            };
            let mut t = RunTables::open(txn, self)?;
            t.sweep()?;
            if let Some(existing) = t.existing(&run.schedule_id)? {
                return Ok(Begun {
                    run: existing,
                    created: false,
                    revoked: Vec::new(),
                });
            }
            let now = t.now;
            run.deadlines = Deadlines::default();
            run.created_at = now;
            if run.state != RunState::Skipped
                && let Some(reason) = job_skip_reason(job.as_ref())
            {
                run.state = RunState::Skipped;
                run.reason = reason.to_owned();
            }
            let mut revoked = Vec::new();
            if run.state != RunState::Skipped {
                // The job's runs that are really still active; stale members (records
                // gone or final) are dropped on the way.
                let mut live = Vec::new();
                for sid in t.active_ids(&run.job_id)? {
                    match t.load(&sid)? {
                        Some(r) if !r.state.is_final() => live.push(r),
                        _ => {
                            t.active
                                .remove((run.job_id.as_str(), sid.as_str()))
                                .ctx("delete active run")?;
                        }
                    }
                }
                let start = match run.plan.overlap {
                    _ if live.is_empty() => Start::Route,
                    OverlapPolicy::Allow => Start::Route,
                    OverlapPolicy::Forbid => Start::Skip("overlap"),
                    OverlapPolicy::Serial => {
                        let waiting = t.queue(&run.job_id)?.len() as u64;
                        if waiting >= u64::from(run.plan.serial_limit) {
                            Start::Skip("serial queue full")
                        } else {
                            Start::Queue
                        }
                    }
                    OverlapPolicy::Replace => {
                        for mut old in live {
                            let (rvs, _) = t.cancel_tree(&mut old, "replaced", false)?;
                            revoked.extend(rvs);
                            t.save(&old)?;
                        }
                        Start::Route
                    }
                };
                match start {
                    Start::Route => {
                        run.state = RunState::Waiting;
                        run.reason.clear();
                        run.deadlines.wake_at = now.saturating_add(duration_ms(route_grace));
                        run.deadlines.wait_until = now.saturating_add(run.plan.dispatch_wait_ms);
                    }
                    Start::Queue => {
                        // No timer: it waits for the run ahead of it to end and pop it.
                        run.state = RunState::Waiting;
                        run.reason = "queued".to_owned();
                        t.enqueue(&run.job_id, &run.schedule_id)?;
                    }
                    Start::Skip(reason) => {
                        run.state = RunState::Skipped;
                        run.reason = reason.to_owned();
                    }
                }
                if run.state == RunState::Waiting {
                    t.active
                        .insert((run.job_id.as_str(), run.schedule_id.as_str()), ())
                        .ctx("write active run")?;
                }
            }
            if run.state == RunState::Skipped {
                run.finished_at = Some(now);
            }
            t.insert_new(&run)?;
            Ok(Begun {
                run,
                created: true,
                revoked,
            })
        })
    }

    fn assign_run(
        &self,
        schedule_id: &str,
        attempt: u32,
        node: &NodeSlot,
        terms: LeaseTerms,
    ) -> Result<Assigned> {
        write(&self.db, |txn| {
            let mut t = RunTables::open(txn, self)?;
            let Some(mut run) = t.load(schedule_id)? else {
                return Ok(Assigned::NotWaiting(None));
            };
            // wake_at 0 marks a run queued behind a serial run: not routable yet.
            if run.state != RunState::Waiting
                || run.attempt != attempt
                || run.deadlines.wake_at == 0
            {
                return Ok(Assigned::NotWaiting(Some(run)));
            }
            if node.max_concurrency > 0 && t.busy(&node.node_id)? >= u64::from(node.max_concurrency)
            {
                return Ok(Assigned::NodeFull);
            }
            let now = t.now;
            run.fencing_token = t.new_token(&run.job_id)?;
            run.node_id = node.node_id.clone();
            run.state = RunState::Dispatched;
            run.reason.clear();
            run.deadlines = Deadlines {
                lease_expires: now.saturating_add(duration_ms(terms.ttl)),
                confirm_by: now.saturating_add(duration_ms(terms.confirm_within)),
                timeout_at: if run.plan.timeout_ms > 0 {
                    now.saturating_add(run.plan.timeout_ms)
                } else {
                    0
                },
                ..Deadlines::default()
            };
            t.node_runs
                .insert((node.node_id.as_str(), schedule_id), ())
                .ctx("write node run")?;
            t.save(&run)?;
            Ok(Assigned::Granted(run))
        })
    }

    fn mark_started(&self, schedule_id: &str, token: u64) -> Result<Transition> {
        write(&self.db, |txn| {
            let mut t = RunTables::open(txn, self)?;
            let Some(mut run) = t.load_held(schedule_id)? else {
                return Ok(refused("unknown run", None));
            };
            if run.fencing_token != token {
                return Ok(refused("stale fencing token", Some(run)));
            }
            match run.state {
                RunState::Running => Ok(Transition {
                    applied: Applied::Already,
                    ..refused("", Some(run))
                }),
                RunState::Dispatched => {
                    run.state = RunState::Running;
                    run.started_at = Some(t.now);
                    run.deadlines.confirm_by = 0;
                    t.save(&run)?;
                    Ok(applied(run, [], None))
                }
                other => Ok(refused(&format!("run is {other}"), Some(run))),
            }
        })
    }

    fn renew_leases(
        &self,
        node_id: &str,
        held_runs: &[Held],
        ttl: Duration,
    ) -> Result<Vec<Option<i64>>> {
        write(&self.db, |txn| {
            let mut t = RunTables::open(txn, self)?;
            let ttl = duration_ms(ttl);
            let mut out = Vec::with_capacity(held_runs.len());
            for h in held_runs {
                let renewable = t.load_held(&h.schedule_id)?.filter(|r| {
                    held(r.state)
                        && r.fencing_token == h.token
                        && r.node_id == node_id
                        && r.deadlines.lease_expires > t.now
                });
                match renewable {
                    Some(mut run) => {
                        run.deadlines.lease_expires = t.now.saturating_add(ttl);
                        run.deadlines.confirm_by = 0;
                        t.save(&run)?;
                        out.push(Some(ttl));
                    }
                    None => out.push(None),
                }
            }
            Ok(out)
        })
    }

    fn finish_run(&self, schedule_id: &str, by: Finisher, outcome: Outcome) -> Result<Transition> {
        write(&self.db, |txn| {
            let mut t = RunTables::open(txn, self)?;
            let found = match by {
                Finisher::Token(_) => t.load_held(schedule_id)?,
                Finisher::Waiting { .. } => t.load(schedule_id)?,
            };
            let Some(mut run) = found else {
                return Ok(refused("unknown run", None));
            };
            match by {
                Finisher::Token(token) => {
                    if run.fencing_token != token {
                        return Ok(refused("stale fencing token", Some(run)));
                    }
                    if run.state.is_final() {
                        return Ok(Transition {
                            applied: Applied::Already,
                            ..refused("", Some(run))
                        });
                    }
                    if !held(run.state) {
                        return Ok(refused(&format!("run is {}", run.state), Some(run)));
                    }
                }
                Finisher::Waiting { attempt } => {
                    if run.state != RunState::Waiting || run.attempt != attempt {
                        return Ok(refused("run is no longer waiting", Some(run)));
                    }
                    // Queued behind a serial run: nobody may route it, so nobody may
                    // find that no executor takes it either.
                    if run.deadlines.wake_at == 0 {
                        return Ok(refused("run is queued", Some(run)));
                    }
                }
            }
            if outcome.state == RunState::Waiting {
                // The executor rejected the dispatch (busy, not ready): route it
                // elsewhere at the same attempt; the attempt never began.
                if !matches!(by, Finisher::Token(_)) {
                    return Ok(refused("only a lease holder can reject", Some(run)));
                }
                let now = t.now;
                t.leave_node(&run)?;
                run.last_node = run.node_id.clone();
                run.fencing_token = t.new_token(&run.job_id)?;
                run.state = RunState::Waiting;
                run.reason = format!("rejected: {}", outcome.error_message);
                run.deadlines = Deadlines {
                    wake_at: now,
                    wait_until: now.saturating_add(run.plan.dispatch_wait_ms),
                    ..Deadlines::default()
                };
                t.save(&run)?;
                return Ok(applied(run, [], None));
            }
            if !outcome.state.is_final() {
                return Ok(refused(
                    &format!("{} is not an outcome", outcome.state),
                    Some(run),
                ));
            }
            t.leave_node(&run)?;
            if outcome.output.is_some() {
                run.output = outcome.output;
            }
            run.error_code = outcome.error_code;
            run.error_message = outcome.error_message;
            if outcome.started_at.is_some() {
                run.started_at = outcome.started_at;
            }
            // Set before the run may become final, so the webhook body written then has
            // it (a retry clears it again).
            if outcome.finished_at.is_some() {
                run.finished_at = outcome.finished_at;
            }
            let next = if outcome.state == RunState::Failed {
                let reason = if run.error_code.is_empty() {
                    "failed".to_owned()
                } else {
                    run.error_code.clone()
                };
                let delay = run.plan.backoff_after(run.attempt);
                let next = t.retry_or_final(&mut run, RunState::Failed, &reason, delay)?;
                if run.state == RunState::Failed {
                    run.reason.clear();
                }
                next
            } else {
                t.finalize(&mut run, outcome.state, "", true)?
            };
            t.save(&run)?;
            Ok(applied(run, [], next))
        })
    }

    fn due_runs(&self, partition: u32, limit: usize) -> Result<Vec<String>> {
        due_in_partition(&self.db, TIMER_INDEX, partition, limit, "scan run timers")
    }

    fn expire_run(&self, schedule_id: &str, route_grace: Duration) -> Result<Transition> {
        write(&self.db, |txn| {
            let mut t = RunTables::open(txn, self)?;
            let Some(mut run) = t.load(schedule_id)? else {
                t.drop_timer(schedule_id)?;
                return Ok(refused("unknown run", None));
            };
            if run.state.is_final() {
                t.drop_timer(schedule_id)?;
                return Ok(refused("run is final", Some(run)));
            }
            let now = t.now;
            let d = run.deadlines.clone();
            let passed = |at: Millis| at > 0 && at <= now;
            if held(run.state) {
                let confirmed = run.state == RunState::Running || d.confirm_by == 0;
                if passed(d.timeout_at) {
                    let rv = t.revoke(&mut run, "timeout")?;
                    run.error_code = "timeout".to_owned();
                    run.error_message = "the attempt exceeded its timeout".to_owned();
                    let delay = run.plan.backoff_after(run.attempt);
                    let next = t.retry_or_final(&mut run, RunState::TimedOut, "timeout", delay)?;
                    t.save(&run)?;
                    return Ok(applied(run, rv, next));
                }
                if !confirmed && (passed(d.confirm_by) || d.lease_expires <= now) {
                    // Never confirmed: the dispatch may not have arrived at all, so the
                    // attempt is not spent.
                    let rv = t.revoke(&mut run, "unconfirmed")?;
                    run.last_node = run.node_id.clone();
                    run.state = RunState::Waiting;
                    run.reason = "unconfirmed".to_owned();
                    run.deadlines = Deadlines {
                        wake_at: now,
                        wait_until: now.saturating_add(run.plan.dispatch_wait_ms),
                        ..Deadlines::default()
                    };
                    t.save(&run)?;
                    return Ok(applied(run, rv, None));
                }
                if passed(d.lease_expires) {
                    let rv = t.revoke(&mut run, "lost")?;
                    run.error_code = "lost".to_owned();
                    run.error_message = "the executor stopped renewing its lease".to_owned();
                    let next = t.retry_or_final(&mut run, RunState::Failed, "lost", 0)?;
                    t.save(&run)?;
                    return Ok(applied(run, rv, next));
                }
            } else if run.state == RunState::Waiting && passed(d.wake_at) {
                run.deadlines.wake_at = now.saturating_add(duration_ms(route_grace));
                t.save(&run)?;
                return Ok(applied(run, [], None));
            }
            // Nothing due (the timer was early, e.g. after a renewal): re-score it.
            t.save(&run)?;
            Ok(refused("nothing due", Some(run)))
        })
    }

    fn cancel_run(&self, schedule_id: &str, reason: &str) -> Result<Transition> {
        write(&self.db, |txn| {
            let mut t = RunTables::open(txn, self)?;
            let Some(mut run) = t.load(schedule_id)? else {
                return Ok(refused("unknown run", None));
            };
            if run.state.is_final() {
                let why = format!("run is already {}", run.state);
                return Ok(refused(&why, Some(run)));
            }
            let (revoked, next) = t.cancel_tree(&mut run, reason, true)?;
            t.save(&run)?;
            Ok(applied(run, revoked, next))
        })
    }

    fn fan_out(
        &self,
        schedule_id: &str,
        attempt: u32,
        shards: u32,
        route_grace: Duration,
    ) -> Result<FannedOut> {
        write(&self.db, |txn| {
            let mut t = RunTables::open(txn, self)?;
            let Some(mut run) = t.load(schedule_id)? else {
                return Ok(FannedOut::NotWaiting(None));
            };
            if run.state != RunState::Waiting
                || run.attempt != attempt
                || run.deadlines.wake_at == 0
            {
                return Ok(FannedOut::NotWaiting(Some(run)));
            }
            let now = t.now;
            let mut out = Vec::with_capacity(shards as usize);
            for i in 0..shards {
                let mut shard = run.clone();
                shard.schedule_id = RunRecord::shard_id(schedule_id, i);
                shard.parent = schedule_id.to_owned();
                shard.shard_index = i;
                shard.shard_total = shards;
                shard.shards_done = 0;
                shard.shards_succeeded = 0;
                shard.attempt = 1;
                shard.state = RunState::Waiting;
                shard.reason.clear();
                shard.node_id.clear();
                shard.last_node.clear();
                shard.started_at = None;
                shard.finished_at = None;
                shard.created_at = now;
                shard.fencing_token = t.new_token(&run.job_id)?;
                shard.deadlines = Deadlines {
                    wake_at: now.saturating_add(duration_ms(route_grace)),
                    wait_until: now.saturating_add(run.plan.dispatch_wait_ms),
                    ..Deadlines::default()
                };
                t.save(&shard)?;
                // Retention like any run; not in the job's run list.
                t.by_created
                    .insert((shard.created_at, shard.schedule_id.as_str()), ())
                    .ctx("write run retention key")?;
                out.push(shard);
            }
            run.state = RunState::Running;
            run.reason.clear();
            run.node_id.clear();
            run.shard_total = shards;
            run.shards_done = 0;
            run.shards_succeeded = 0;
            run.started_at = Some(now);
            run.deadlines = Deadlines::default();
            t.save(&run)?;
            Ok(FannedOut::Shards {
                parent: run,
                shards: out,
            })
        })
    }

    fn report_progress(
        &self,
        schedule_id: &str,
        token: u64,
        percent: u32,
        message: &str,
    ) -> Result<bool> {
        write(&self.db, |txn| {
            let mut t = RunTables::open(txn, self)?;
            let Some(mut run) = t
                .load_held(schedule_id)?
                .filter(|r| r.fencing_token == token && held(r.state))
            else {
                return Ok(false);
            };
            run.progress_percent = percent;
            run.progress_message = message.to_owned();
            t.save(&run)?;
            Ok(true)
        })
    }

    fn append_logs(
        &self,
        schedule_id: &str,
        token: u64,
        lines: Vec<LogLine>,
        max_bytes: usize,
    ) -> Result<bool> {
        write(&self.db, |txn| {
            let mut t = RunTables::open(txn, self)?;
            // Any state: an executor may flush its last lines after its result.
            let Some(run) = t
                .load_held(schedule_id)?
                .filter(|r| r.fencing_token == token)
            else {
                return Ok(false);
            };
            let schedule_id = run.schedule_id.as_str();
            let (mut seq, mut bytes) = t
                .log_meta
                .get(schedule_id)
                .ctx("read run log meta")?
                .map(|g| g.value())
                .unwrap_or((0, 0));
            for mut line in lines {
                seq += 1;
                line.seq = seq;
                bytes = bytes.saturating_add(line.message.len() as u64);
                let json = encode("log line", &line)?;
                t.logs
                    .insert((schedule_id, seq), json.as_str())
                    .ctx("write run log line")?;
            }
            let max = u64::try_from(max_bytes).unwrap_or(u64::MAX);
            if bytes > max {
                let mut dropped = Vec::new();
                for item in t
                    .logs
                    .range((schedule_id, 0)..=(schedule_id, u64::MAX))
                    .ctx("scan run logs")?
                {
                    if bytes <= max {
                        break;
                    }
                    let (k, v) = item.ctx("scan run logs")?;
                    let old: LogLine = decode("log line", schedule_id, v.value())?;
                    bytes = bytes.saturating_sub(old.message.len() as u64);
                    dropped.push(k.value().1);
                }
                for s in dropped {
                    t.logs.remove((schedule_id, s)).ctx("delete run log line")?;
                }
            }
            t.log_meta
                .insert(schedule_id, (seq, bytes))
                .ctx("write run log meta")?;
            Ok(true)
        })
    }

    fn read_logs(&self, schedule_id: &str, after: u64, limit: usize) -> Result<Vec<LogLine>> {
        let txn = read(&self.db)?;
        let now = now_ms();
        let runs = txn.open_table(RUNS).ctx("open runs")?;
        let logs = txn.open_table(LOGS).ctx("open run logs")?;
        let mut out = Vec::new();
        // Logs live as long as their run: a run past retention has none.
        if limit == 0
            || after == u64::MAX
            || load_run(&runs, schedule_id)?.is_none_or(|r| self.expired_run(&r, now))
        {
            return Ok(out);
        }
        for item in logs
            .range((schedule_id, after + 1)..=(schedule_id, u64::MAX))
            .ctx("scan run logs")?
        {
            let (_, v) = item.ctx("scan run logs")?;
            out.push(decode("log line", schedule_id, v.value())?);
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    fn upsert_node(&self, mut node: NodeRecord, ttl: Duration) -> Result<()> {
        write(&self.db, |txn| {
            let now = now_ms();
            sweep_nodes(txn, now)?;
            node.last_heartbeat = now;
            let json = encode("node", &node)?;
            let expires_at = now.saturating_add(duration_ms(ttl));
            let node_id = node.node_id.as_str();
            let mut nodes = txn.open_table(NODES).ctx("open nodes")?;
            let mut expiry = txn.open_table(NODE_EXPIRY).ctx("open node expiry")?;
            let old_expiry = nodes.get(node_id).ctx("read node")?.map(|g| g.value().1);
            if let Some(old) = old_expiry {
                expiry.remove((old, node_id)).ctx("delete node expiry")?;
            }
            nodes
                .insert(node_id, (json.as_str(), expires_at))
                .ctx("write node")?;
            expiry
                .insert((expires_at, node_id), ())
                .ctx("write node expiry")?;
            Ok(())
        })
    }

    fn remove_node(&self, node_id: &str, instance: &str) -> Result<bool> {
        write(&self.db, |txn| {
            let now = now_ms();
            sweep_nodes(txn, now)?;
            let mut nodes = txn.open_table(NODES).ctx("open nodes")?;
            let mut expiry = txn.open_table(NODE_EXPIRY).ctx("open node expiry")?;
            let current = nodes.get(node_id).ctx("read node")?.map(|g| {
                let (json, expires_at) = g.value();
                (json.to_owned(), expires_at)
            });
            let Some((json, expires_at)) = current else {
                return Ok(false);
            };
            // Expired but not swept yet: it is gone as far as anyone can tell (in redis
            // its key would have expired), so it is deleted and not reported removed.
            let removed = if expires_at <= now {
                false
            } else {
                let stored: NodeRecord = decode("node", node_id, &json)?;
                if stored.instance != instance {
                    return Ok(false);
                }
                true
            };
            nodes.remove(node_id).ctx("delete node")?;
            expiry
                .remove((expires_at, node_id))
                .ctx("delete node expiry")?;
            Ok(removed)
        })
    }

    /// Unexpired nodes in node id order (the table's key order).
    fn list_nodes(&self, group: Option<&str>) -> Result<Vec<NodeRecord>> {
        let txn = read(&self.db)?;
        let now = now_ms();
        let nodes = txn.open_table(NODES).ctx("open nodes")?;
        let node_runs = txn.open_table(NODE_RUNS).ctx("open node runs")?;
        let mut out = Vec::new();
        for item in nodes.iter().ctx("scan nodes")? {
            let (k, v) = item.ctx("scan nodes")?;
            let (json, expires_at) = v.value();
            if expires_at <= now {
                continue;
            }
            let mut node: NodeRecord = decode("node", k.value(), json)?;
            if group.is_none_or(|g| node.group == g) {
                let upper = successor(&node.node_id);
                node.leased = node_runs
                    .range((node.node_id.as_str(), "")..(upper.as_str(), ""))
                    .ctx("scan node runs")?
                    .count()
                    .try_into()
                    .unwrap_or(u32::MAX);
                out.push(node);
            }
        }
        Ok(out)
    }

    fn due_deliveries(&self, partition: u32, limit: usize) -> Result<Vec<String>> {
        due_in_partition(
            &self.db,
            OUTBOX_DUE,
            partition,
            limit,
            "scan webhook outbox",
        )
    }

    fn claim_delivery(
        &self,
        schedule_id: &str,
        lease: Duration,
    ) -> Result<Option<WebhookDelivery>> {
        write(&self.db, |txn| {
            let mut t = RunTables::open(txn, self)?;
            let Some(mut entry) = t.load_outbox(schedule_id)? else {
                return Ok(None);
            };
            if entry.due > t.now {
                return Ok(None);
            }
            let old_due = entry.due;
            // Tokens only grow: max(last + 1, store time in µs), as fencing tokens do.
            entry.token = entry.token.saturating_add(1).max(t.now_us);
            entry.in_flight = true;
            entry.due = t.now.saturating_add(duration_ms(lease));
            t.put_outbox(schedule_id, &entry, Some(old_due))?;
            Ok(Some(WebhookDelivery {
                schedule_id: schedule_id.to_owned(),
                job_id: entry.job_id,
                url: entry.url,
                body: entry.body,
                attempts: entry.attempts,
                created_at: entry.created_at,
                token: entry.token,
                now: t.now,
            }))
        })
    }

    fn finish_delivery(
        &self,
        schedule_id: &str,
        token: u64,
        outcome: DeliveryOutcome,
    ) -> Result<Applied> {
        write(&self.db, |txn| {
            let mut t = RunTables::open(txn, self)?;
            let Some(mut entry) = t.load_outbox(schedule_id)? else {
                return Ok(Applied::No("unknown delivery".to_owned()));
            };
            if entry.token != token || !entry.in_flight {
                return Ok(Applied::No("stale delivery token".to_owned()));
            }
            let old_due = entry.due;
            let now = t.now;
            let (status, error) = match &outcome {
                DeliveryOutcome::Defer { until } => {
                    entry.in_flight = false;
                    entry.due = now.max(*until);
                    t.put_outbox(schedule_id, &entry, Some(old_due))?;
                    return Ok(Applied::Yes);
                }
                DeliveryOutcome::Delivered { status } => (*status, String::new()),
                DeliveryOutcome::Retry { status, error, .. }
                | DeliveryOutcome::Failed { status, error } => (*status, error.clone()),
                DeliveryOutcome::Gone => (410, super::GONE_ERROR.to_owned()),
                DeliveryOutcome::Abandon { error } => (0, error.clone()),
            };
            if !matches!(outcome, DeliveryOutcome::Abandon { .. }) {
                entry.attempts = entry.attempts.saturating_add(1);
            }
            let mut run = t.load(schedule_id)?;
            if let Some(run) = run.as_mut() {
                run.callback_attempts = entry.attempts;
                run.callback_status = status;
                run.callback_error = error;
            }
            match outcome {
                DeliveryOutcome::Retry { after, .. } => {
                    entry.in_flight = false;
                    entry.due = now.saturating_add(duration_ms(after));
                    t.put_outbox(schedule_id, &entry, Some(old_due))?;
                }
                done => {
                    t.remove_outbox(schedule_id, &entry)?;
                    if let Some(run) = run.as_mut() {
                        run.callback_state = if matches!(done, DeliveryOutcome::Delivered { .. }) {
                            CallbackState::Done
                        } else {
                            CallbackState::Failed
                        };
                    }
                }
            }
            if let Some(run) = run {
                t.save(&run)?;
            }
            Ok(Applied::Yes)
        })
    }

    fn breaker_state(&self, destination: &str, probe: Duration) -> Result<BreakerState> {
        write(&self.db, |txn| {
            let now = now_ms();
            let mut table = txn.open_table(BREAKERS).ctx("open webhook breakers")?;
            let mut b: Breaker = match table.get(destination).ctx("read breaker")? {
                Some(g) => decode("breaker", destination, g.value())?,
                None => return Ok(BreakerState::Closed),
            };
            if b.state == "closed" {
                return Ok(BreakerState::Closed);
            }
            if b.until > now {
                // Open, or half open with another caller's probe under way.
                return Ok(BreakerState::Open { until: b.until });
            }
            b.state = "half_open".to_owned();
            b.until = now.saturating_add(duration_ms(probe));
            let json = encode("breaker", &b)?;
            table
                .insert(destination, json.as_str())
                .ctx("write breaker")?;
            Ok(BreakerState::HalfOpen)
        })
    }

    fn record_breaker(
        &self,
        destination: &str,
        success: bool,
        threshold: u32,
        cool_down: Duration,
    ) -> Result<BreakerUpdate> {
        write(&self.db, |txn| {
            let now = now_ms();
            let mut table = txn.open_table(BREAKERS).ctx("open webhook breakers")?;
            let mut b: Breaker = match table.get(destination).ctx("read breaker")? {
                Some(g) => decode("breaker", destination, g.value())?,
                None => Breaker {
                    state: "closed".to_owned(),
                    ..Breaker::default()
                },
            };
            if success {
                table.remove(destination).ctx("delete breaker")?;
                return Ok(BreakerUpdate {
                    state: BreakerState::Closed,
                    changed: b.state != "closed",
                });
            }
            if b.state == "open" {
                return Ok(BreakerUpdate {
                    state: BreakerState::Open { until: b.until },
                    changed: false,
                });
            }
            b.failures = b.failures.saturating_add(1);
            let opens = b.state == "half_open" || b.failures >= threshold;
            if opens {
                b.state = "open".to_owned();
                b.until = now.saturating_add(duration_ms(cool_down));
            }
            let json = encode("breaker", &b)?;
            table
                .insert(destination, json.as_str())
                .ctx("write breaker")?;
            Ok(BreakerUpdate {
                state: if opens {
                    BreakerState::Open { until: b.until }
                } else {
                    BreakerState::Closed
                },
                changed: opens,
            })
        })
    }

    fn check_nonce(&self, app_id: &str, nonce: &str, ttl: Duration) -> Result<bool> {
        write(&self.db, |txn| {
            let now = now_ms();
            // Forget a few expired nonces so the table stays as small as the live window.
            sweep_pair_expiry(txn, NONCE_EXPIRY, NONCES, now, "nonce")?;
            let mut nonces = txn.open_table(NONCES).ctx("open nonces")?;
            let mut expiry = txn.open_table(NONCE_EXPIRY).ctx("open nonce expiry")?;
            let seen = nonces
                .get((app_id, nonce))
                .ctx("read nonce")?
                .map(|g| g.value());
            match seen {
                Some(expires_at) if expires_at > now => return Ok(false),
                Some(expires_at) => {
                    expiry
                        .remove((expires_at, app_id, nonce))
                        .ctx("delete nonce expiry")?;
                }
                None => {}
            }
            let expires_at = now.saturating_add(duration_ms(ttl));
            nonces
                .insert((app_id, nonce), expires_at)
                .ctx("write nonce")?;
            expiry
                .insert((expires_at, app_id, nonce), ())
                .ctx("write nonce expiry")?;
            Ok(true)
        })
    }

    fn create_app(&self, mut app: AppRecord) -> Result<AppRecord> {
        write(&self.db, |txn| {
            let mut apps = txn.open_table(APPS).ctx("open apps")?;
            if apps.get(app.app_id.as_str()).ctx("read app")?.is_some() {
                return Err(Error::AppExists(app.app_id.clone()));
            }
            if app.created_at == 0 {
                app.created_at = now_ms();
            }
            let json = encode("app", &app)?;
            apps.insert(app.app_id.as_str(), json.as_str())
                .ctx("write app")?;
            Ok(app.clone())
        })
    }

    fn get_app(&self, app_id: &str) -> Result<Option<AppRecord>> {
        let txn = read(&self.db)?;
        let apps = txn.open_table(APPS).ctx("open apps")?;
        match apps.get(app_id).ctx("read app")? {
            Some(g) => decode("app", app_id, g.value()).map(Some),
            None => Ok(None),
        }
    }

    fn rotate_app_secret(
        &self,
        app_id: &str,
        secret: &str,
        overlap: Duration,
    ) -> Result<AppRecord> {
        write(&self.db, |txn| {
            let mut apps = txn.open_table(APPS).ctx("open apps")?;
            let mut app: AppRecord = match apps.get(app_id).ctx("read app")? {
                Some(g) => decode("app", app_id, g.value())?,
                None => return Err(Error::AppNotFound(app_id.to_owned())),
            };
            let now = now_ms();
            let until = now.saturating_add(duration_ms(overlap));
            app.secrets
                .retain(|s| s.not_after == 0 || s.not_after > now);
            for s in &mut app.secrets {
                if s.not_after == 0 || s.not_after > until {
                    s.not_after = until;
                }
            }
            app.secrets.push(AppSecret {
                secret: secret.to_owned(),
                not_after: 0,
            });
            let json = encode("app", &app)?;
            apps.insert(app_id, json.as_str()).ctx("write app")?;
            Ok(app)
        })
    }
}

fn parse_run_cursor(cursor: &str) -> Result<(Millis, String)> {
    cursor
        .split_once(':')
        .and_then(|(at, sid)| Some((at.parse().ok()?, sid.to_owned())))
        .ok_or_else(|| Error::Corrupt(format!("invalid run list cursor {cursor:?}")))
}

fn parse_entry_id(entry_id: &str) -> Result<u64> {
    entry_id
        .parse()
        .map_err(|_| Error::Corrupt(format!("invalid trigger entry id {entry_id:?}")))
}

// ---- the trait

#[async_trait]
impl Store for EmbeddedStore {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    fn partitions(&self) -> u32 {
        self.inner.partitions
    }

    async fn now(&self) -> Result<Millis> {
        Ok(now_ms())
    }

    fn job_changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    async fn create_job(&self, job: JobRecord) -> Result<JobRecord> {
        let job = self.blocking(move |i| i.create_job(job)).await?;
        self.job_changed();
        Ok(job)
    }

    async fn update_job(&self, job: JobRecord, expected_version: u64) -> Result<JobRecord> {
        let job = self
            .blocking(move |i| i.update_job(job, expected_version))
            .await?;
        self.job_changed();
        Ok(job)
    }

    async fn delete_job(&self, job_id: &str) -> Result<()> {
        let job_id = job_id.to_owned();
        self.blocking(move |i| i.delete_job(&job_id)).await?;
        self.job_changed();
        Ok(())
    }

    async fn get_job(&self, job_id: &str) -> Result<Option<JobRecord>> {
        let job_id = job_id.to_owned();
        self.blocking(move |i| i.get_job(&job_id)).await
    }

    async fn get_jobs(&self, job_ids: &[String]) -> Result<Vec<JobRecord>> {
        let job_ids = job_ids.to_vec();
        self.blocking(move |i| i.get_jobs(&job_ids)).await
    }

    async fn list_jobs(&self, cursor: Option<&str>, limit: usize) -> Result<Page<JobRecord>> {
        let cursor = cursor.map(str::to_owned);
        self.blocking(move |i| i.list_jobs(cursor, limit)).await
    }

    async fn due_fires(&self, partition: u32, limit: usize) -> Result<DueBatch> {
        self.blocking(move |i| i.due_fires(partition, limit)).await
    }

    async fn claim_fires(&self, partition: u32, claims: Vec<FireClaim>) -> Result<ClaimOutcome> {
        let outcome = self
            .blocking(move |i| i.claim_fires(partition, claims))
            .await?;
        if outcome.results.contains(&ClaimResult::Claimed) {
            self.appended.notify_waiters();
        }
        Ok(outcome)
    }

    async fn enqueue_manual(
        &self,
        trigger: Trigger,
        idempotency_key: Option<&str>,
    ) -> Result<Enqueued> {
        let key = idempotency_key.map(str::to_owned);
        let enqueued = self
            .blocking(move |i| i.enqueue_manual(trigger, key))
            .await?;
        if !enqueued.duplicate {
            self.appended.notify_waiters();
        }
        Ok(enqueued)
    }

    async fn read_triggers(
        &self,
        _consumer: &str,
        max: usize,
        block: Duration,
    ) -> Result<Vec<Delivery>> {
        // A block too long to represent is as good as forever.
        let deadline = Instant::now().checked_add(block);
        loop {
            // Registered before looking, so an append between the look and the wait
            // still wakes us.
            let notified = self.appended.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let got = self.blocking(move |i| i.read_once(max)).await?;
            if !got.is_empty() || max == 0 {
                return Ok(got);
            }
            match deadline {
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(got);
                    }
                    // Timing out just means nothing arrived; look once more and return.
                    let _ = tokio::time::timeout(deadline - now, notified).await;
                }
                None => notified.await,
            }
        }
    }

    async fn reclaim_triggers(
        &self,
        _consumer: &str,
        min_idle: Duration,
        max: usize,
    ) -> Result<Vec<Delivery>> {
        self.blocking(move |i| i.reclaim(min_idle, max)).await
    }

    async fn ack_trigger(&self, entry_id: &str) -> Result<()> {
        let seq = parse_entry_id(entry_id)?;
        self.blocking(move |i| i.ack(seq)).await
    }

    /// A no-op by design: `ack_trigger` deletes the entry in the same transaction that
    /// acknowledges it, so no acknowledged entry is ever left to trim, and unacknowledged
    /// ones must stay until acked.
    async fn trim_triggers(&self, _older_than: Millis) -> Result<()> {
        Ok(())
    }

    async fn record_run(&self, run: RunRecord) -> Result<Recorded> {
        self.blocking(move |i| i.record_run(run)).await
    }

    async fn get_run(&self, schedule_id: &str) -> Result<Option<RunRecord>> {
        let schedule_id = schedule_id.to_owned();
        self.blocking(move |i| i.get_run(&schedule_id)).await
    }

    async fn list_runs(&self, job_id: &str, query: RunQuery) -> Result<Page<RunRecord>> {
        let job_id = job_id.to_owned();
        self.blocking(move |i| i.list_runs(&job_id, query)).await
    }

    async fn begin_run(&self, run: RunRecord, route_grace: Duration) -> Result<Begun> {
        self.blocking(move |i| i.begin_run(run, route_grace)).await
    }

    async fn assign_run(
        &self,
        schedule_id: &str,
        attempt: u32,
        node: &NodeSlot,
        terms: LeaseTerms,
    ) -> Result<Assigned> {
        let (schedule_id, node) = (schedule_id.to_owned(), node.clone());
        self.blocking(move |i| i.assign_run(&schedule_id, attempt, &node, terms))
            .await
    }

    async fn mark_started(&self, schedule_id: &str, token: u64) -> Result<Transition> {
        let schedule_id = schedule_id.to_owned();
        self.blocking(move |i| i.mark_started(&schedule_id, token))
            .await
    }

    async fn renew_leases(
        &self,
        node_id: &str,
        held: &[Held],
        ttl: Duration,
    ) -> Result<Vec<Option<i64>>> {
        let (node_id, held) = (node_id.to_owned(), held.to_vec());
        self.blocking(move |i| i.renew_leases(&node_id, &held, ttl))
            .await
    }

    async fn finish_run(
        &self,
        schedule_id: &str,
        by: Finisher,
        outcome: Outcome,
    ) -> Result<Transition> {
        let schedule_id = schedule_id.to_owned();
        self.blocking(move |i| i.finish_run(&schedule_id, by, outcome))
            .await
    }

    async fn due_runs(&self, partition: u32, limit: usize) -> Result<Vec<String>> {
        self.blocking(move |i| i.due_runs(partition, limit)).await
    }

    async fn expire_run(&self, schedule_id: &str, route_grace: Duration) -> Result<Transition> {
        let schedule_id = schedule_id.to_owned();
        self.blocking(move |i| i.expire_run(&schedule_id, route_grace))
            .await
    }

    async fn fan_out(
        &self,
        schedule_id: &str,
        attempt: u32,
        shards: u32,
        route_grace: Duration,
    ) -> Result<FannedOut> {
        let schedule_id = schedule_id.to_owned();
        self.blocking(move |i| i.fan_out(&schedule_id, attempt, shards, route_grace))
            .await
    }

    async fn cancel_run(&self, schedule_id: &str, reason: &str) -> Result<Transition> {
        let (schedule_id, reason) = (schedule_id.to_owned(), reason.to_owned());
        self.blocking(move |i| i.cancel_run(&schedule_id, &reason))
            .await
    }

    async fn report_progress(
        &self,
        schedule_id: &str,
        token: u64,
        percent: u32,
        message: &str,
    ) -> Result<bool> {
        let (schedule_id, message) = (schedule_id.to_owned(), message.to_owned());
        self.blocking(move |i| i.report_progress(&schedule_id, token, percent, &message))
            .await
    }

    async fn append_logs(
        &self,
        schedule_id: &str,
        token: u64,
        lines: Vec<LogLine>,
        max_bytes: usize,
    ) -> Result<bool> {
        // Nothing to store is vacuously stored, whoever asks (as in redis).
        if lines.is_empty() {
            return Ok(true);
        }
        let schedule_id = schedule_id.to_owned();
        self.blocking(move |i| i.append_logs(&schedule_id, token, lines, max_bytes))
            .await
    }

    async fn read_logs(&self, schedule_id: &str, after: u64, limit: usize) -> Result<Vec<LogLine>> {
        let schedule_id = schedule_id.to_owned();
        self.blocking(move |i| i.read_logs(&schedule_id, after, limit))
            .await
    }

    async fn push_inbox(&self, instance: &str, message: Vec<u8>) -> Result<()> {
        let now = Instant::now();
        {
            let mut inboxes = self.inboxes();
            // Forget inboxes nobody wrote to for a while (their instance is gone), as
            // redis lets the key expire.
            inboxes.retain(|_, inbox| inbox.expires > now);
            let inbox = inboxes.entry(instance.to_owned()).or_insert_with(|| Inbox {
                messages: VecDeque::new(),
                expires: now,
            });
            inbox.messages.push_back(message);
            inbox.expires = now + INBOX_TTL;
        }
        self.inbox_pushed.notify_waiters();
        Ok(())
    }

    async fn pop_inbox(&self, instance: &str, max: usize, block: Duration) -> Result<Vec<Vec<u8>>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        // A block too long to represent is as good as forever.
        let deadline = Instant::now().checked_add(block);
        loop {
            // Registered before looking, so a push between the look and the wait still
            // wakes us.
            let notified = self.inbox_pushed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let got = self.take_inbox(instance, max);
            if !got.is_empty() {
                return Ok(got);
            }
            match deadline {
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(got);
                    }
                    // Timing out just means nothing arrived; look once more and return.
                    let _ = tokio::time::timeout(deadline - now, notified).await;
                }
                None => notified.await,
            }
        }
    }

    async fn upsert_node(&self, node: NodeRecord, ttl: Duration) -> Result<()> {
        self.blocking(move |i| i.upsert_node(node, ttl)).await
    }

    async fn remove_node(&self, node_id: &str, instance: &str) -> Result<bool> {
        let (node_id, instance) = (node_id.to_owned(), instance.to_owned());
        self.blocking(move |i| i.remove_node(&node_id, &instance))
            .await
    }

    async fn list_nodes(&self, group: Option<&str>) -> Result<Vec<NodeRecord>> {
        let group = group.map(str::to_owned);
        self.blocking(move |i| i.list_nodes(group.as_deref())).await
    }

    async fn next_route_counter(&self, job_id: &str) -> Result<u64> {
        let mut counters = self
            .route_counters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let c = counters.entry(job_id.to_owned()).or_insert(0);
        let n = *c;
        *c = c.wrapping_add(1);
        Ok(n)
    }

    async fn create_app(&self, app: AppRecord) -> Result<AppRecord> {
        self.blocking(move |i| i.create_app(app)).await
    }

    async fn get_app(&self, app_id: &str) -> Result<Option<AppRecord>> {
        let app_id = app_id.to_owned();
        self.blocking(move |i| i.get_app(&app_id)).await
    }

    async fn rotate_app_secret(
        &self,
        app_id: &str,
        secret: &str,
        overlap: Duration,
    ) -> Result<AppRecord> {
        let (app_id, secret) = (app_id.to_owned(), secret.to_owned());
        self.blocking(move |i| i.rotate_app_secret(&app_id, &secret, overlap))
            .await
    }

    async fn check_nonce(&self, app_id: &str, nonce: &str, ttl: Duration) -> Result<bool> {
        let (app_id, nonce) = (app_id.to_owned(), nonce.to_owned());
        self.blocking(move |i| i.check_nonce(&app_id, &nonce, ttl))
            .await
    }

    async fn due_deliveries(&self, partition: u32, limit: usize) -> Result<Vec<String>> {
        self.blocking(move |i| i.due_deliveries(partition, limit))
            .await
    }

    async fn claim_delivery(
        &self,
        schedule_id: &str,
        lease: Duration,
    ) -> Result<Option<WebhookDelivery>> {
        let schedule_id = schedule_id.to_owned();
        self.blocking(move |i| i.claim_delivery(&schedule_id, lease))
            .await
    }

    async fn finish_delivery(
        &self,
        schedule_id: &str,
        token: u64,
        outcome: DeliveryOutcome,
    ) -> Result<Applied> {
        let schedule_id = schedule_id.to_owned();
        self.blocking(move |i| i.finish_delivery(&schedule_id, token, outcome))
            .await
    }

    async fn breaker_state(&self, destination: &str, probe: Duration) -> Result<BreakerState> {
        let destination = destination.to_owned();
        self.blocking(move |i| i.breaker_state(&destination, probe))
            .await
    }

    async fn record_breaker(
        &self,
        destination: &str,
        success: bool,
        threshold: u32,
        cool_down: Duration,
    ) -> Result<BreakerUpdate> {
        let destination = destination.to_owned();
        self.blocking(move |i| i.record_breaker(&destination, success, threshold, cool_down))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{RunPlan, schedule_id};
    use crate::store::conformance::{self, arm, cron_trigger, job, manual_trigger, run};

    // The file is unlinked as soon as it is open: the open descriptor keeps it alive
    // until the store drops, so the suite leaves nothing behind in the temp dir.
    crate::store::conformance::store_conformance_tests!(|opts| async move {
        let dir = tempfile::tempdir().expect("temp dir");
        EmbeddedStore::open(&dir.path().join("store.redb"), opts).expect("open store")
    });

    fn open(path: &Path, opts: StoreOptions) -> Arc<dyn Store> {
        Arc::new(EmbeddedStore::open(path, opts).expect("open store"))
    }

    #[tokio::test]
    async fn data_survives_reopen() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("store.redb");
        let store = open(&path, conformance::options());
        let t0 = store.now().await.expect("now");

        store
            .create_job(job("keep-due", Some(arm(t0 - 1000))))
            .await
            .expect("create");
        store
            .create_job(job("keep-later", Some(arm(t0 + 3_600_000))))
            .await
            .expect("create");
        for no in ["manual-1", "manual-2", "manual-3"] {
            store
                .enqueue_manual(manual_trigger("keep-due", no, t0), Some(no))
                .await
                .expect("enqueue");
        }
        let delivered = store
            .read_triggers("c", 2, Duration::ZERO)
            .await
            .expect("read");
        store
            .ack_trigger(&delivered[0].entry_id)
            .await
            .expect("ack");
        let r = run("keep-due", 5000, t0);
        store.record_run(r.clone()).await.expect("record");
        // A run in flight: leased, logged, with a serial run queued behind it.
        let serial = RunPlan {
            overlap: OverlapPolicy::Serial,
            ..RunPlan::default()
        };
        let long = LeaseTerms {
            ttl: Duration::from_secs(60),
            confirm_within: Duration::from_secs(60),
        };
        let grace = Duration::from_secs(60);
        let flying = conformance::planned_run("keep-due", 6000, serial.clone());
        store.begin_run(flying.clone(), grace).await.expect("begin");
        let queued = conformance::planned_run("keep-due", 7000, serial);
        store.begin_run(queued.clone(), grace).await.expect("begin");
        let node = NodeSlot {
            node_id: "node-a".to_owned(),
            max_concurrency: 1,
        };
        let Assigned::Granted(leased) = store
            .assign_run(&flying.schedule_id, 1, &node, long)
            .await
            .expect("assign")
        else {
            panic!("expected a grant");
        };
        let line = LogLine {
            seq: 0,
            time_ms: t0,
            level: "info".to_owned(),
            message: "hello".to_owned(),
            attempt: 1,
        };
        assert!(
            store
                .append_logs(&flying.schedule_id, leased.fencing_token, vec![line], 1000)
                .await
                .expect("append")
        );
        assert!(
            store
                .check_nonce("app", "n", Duration::from_secs(60))
                .await
                .expect("nonce")
        );
        let job_before = store.get_job("keep-due").await.expect("get");
        drop(store);

        // Different options: the file keeps its partition count.
        let store = open(
            &path,
            StoreOptions {
                partitions: 9,
                ..conformance::options()
            },
        );
        assert_eq!(store.partitions(), 4);
        assert_eq!(store.get_job("keep-due").await.expect("get"), job_before);
        assert!(store.get_job("keep-later").await.expect("get").is_some());

        let p = partition_of("keep-due", 4);
        let batch = store.due_fires(p, 10).await.expect("due");
        assert_eq!(batch.fires.len(), 1);
        assert_eq!(
            (batch.fires[0].job_id.as_str(), batch.fires[0].due),
            ("keep-due", t0 - 1000)
        );

        // Every unacked entry is delivered again after a restart, delivered or not.
        let again = conformance::drain_triggers(&store, "c").await;
        let nos: Vec<_> = again
            .iter()
            .map(|d| d.trigger.schedule_no.as_str())
            .collect();
        assert_eq!(nos, ["manual-2", "manual-3"]);
        assert_eq!(again[0].entry_id, delivered[1].entry_id);

        // Sequences continue: a new entry's id is above every old one.
        store
            .enqueue_manual(manual_trigger("keep-due", "manual-4", t0), None)
            .await
            .expect("enqueue");
        let newer = conformance::drain_triggers(&store, "c").await;
        let newest: u64 = newer[0].entry_id.parse().expect("numeric entry id");
        let oldest: u64 = again[1].entry_id.parse().expect("numeric entry id");
        assert!(newest > oldest);

        // Idempotency keys, runs, leases and nonces too.
        let dup = store
            .enqueue_manual(manual_trigger("keep-due", "manual-x", t0), Some("manual-1"))
            .await
            .expect("enqueue");
        assert!(dup.duplicate);
        assert_eq!(dup.schedule_id, schedule_id("keep-due", "manual-1"));
        assert_eq!(
            store.get_run(&r.schedule_id).await.expect("get"),
            Some(r.clone())
        );
        assert_eq!(
            store.get_run(&flying.schedule_id).await.expect("get"),
            Some(leased.clone())
        );
        assert_eq!(
            store
                .read_logs(&flying.schedule_id, 0, 10)
                .await
                .expect("read")
                .len(),
            1
        );
        // The node's slot, the active set, the serial queue and the token counter too.
        let other = conformance::planned_run("keep-later", 8000, RunPlan::default());
        store.begin_run(other.clone(), grace).await.expect("begin");
        assert_eq!(
            store
                .assign_run(&other.schedule_id, 1, &node, long)
                .await
                .expect("assign"),
            Assigned::NodeFull
        );
        let done = store
            .finish_run(
                &flying.schedule_id,
                Finisher::Token(leased.fencing_token),
                Outcome {
                    state: RunState::Succeeded,
                    output: None,
                    error_code: String::new(),
                    error_message: String::new(),
                    started_at: None,
                    finished_at: None,
                },
            )
            .await
            .expect("finish");
        assert_eq!(done.next_serial, Some(queued.schedule_id.clone()));
        let Assigned::Granted(next) = store
            .assign_run(&other.schedule_id, 1, &node, long)
            .await
            .expect("assign")
        else {
            panic!("expected a grant");
        };
        assert!(next.fencing_token > leased.fencing_token);
        assert!(
            !store
                .check_nonce("app", "n", Duration::from_secs(60))
                .await
                .expect("nonce")
        );
    }

    #[tokio::test]
    async fn schema_too_new_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("store.redb");
        drop(EmbeddedStore::open(&path, StoreOptions::default()).expect("open"));
        {
            let db = Database::create(&path).expect("raw open");
            let txn = db.begin_write().expect("begin");
            {
                let mut meta = txn.open_table(META).expect("meta");
                meta.insert(META_SCHEMA, u64::from(SCHEMA_VERSION) + 1)
                    .expect("write");
            }
            txn.commit().expect("commit");
        }
        match EmbeddedStore::open(&path, StoreOptions::default()) {
            Err(Error::SchemaTooNew { found, supported }) => {
                assert_eq!((found, supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
            }
            other => panic!("expected SchemaTooNew, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn caller_mistakes_are_errors() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = open(&dir.path().join("store.redb"), conformance::options());
        let t0 = store.now().await.expect("now");
        let id = conformance::ids_in_partition(4, 2, "wrong", 1).remove(0);
        store
            .create_job(job(&id, Some(arm(t0 - 10))))
            .await
            .expect("create");
        let claim = FireClaim {
            job_id: id.clone(),
            expected_due: t0 - 10,
            expected_version: 1,
            next: None,
            triggers: vec![cron_trigger(&id, t0 - 10, 1)],
        };
        assert!(matches!(
            store.claim_fires(3, vec![claim]).await,
            Err(Error::Corrupt(_))
        ));
        // Nothing was claimed.
        assert_eq!(store.due_fires(2, 10).await.expect("due").fires.len(), 1);
        assert!(matches!(
            store.ack_trigger("not-a-number").await,
            Err(Error::Corrupt(_))
        ));
        assert!(matches!(
            store
                .list_runs(
                    &id,
                    RunQuery {
                        cursor: Some("garbage".into()),
                        ..RunQuery::default()
                    }
                )
                .await,
            Err(Error::Corrupt(_))
        ));
    }

    #[tokio::test]
    async fn tokens_outgrow_a_clock_step_back() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open(&dir.path().join("store.redb"), conformance::options())
            .expect("open");
        store.create_job(job("step", None)).await.expect("create");
        // A counter ahead of the clock stands for a clock that stepped back since.
        let ahead = now_us() + 3_600_000_000;
        {
            let txn = store.inner.db.begin_write().expect("begin");
            {
                let mut counters = txn.open_table(TOKENS).expect("counters");
                counters.insert("step", ahead).expect("write");
            }
            txn.commit().expect("commit");
        }
        let node = NodeSlot {
            node_id: "a".to_owned(),
            max_concurrency: 0,
        };
        let terms = LeaseTerms {
            ttl: Duration::from_secs(5),
            confirm_within: Duration::from_secs(5),
        };
        for (planned, expected) in [(1, ahead + 1), (2, ahead + 2)] {
            let r = conformance::planned_run("step", planned, RunPlan::default());
            store
                .begin_run(r.clone(), Duration::from_secs(5))
                .await
                .expect("begin");
            match store
                .assign_run(&r.schedule_id, 1, &node, terms)
                .await
                .expect("assign")
            {
                Assigned::Granted(run) => assert_eq!(run.fencing_token, expected),
                other => panic!("expected a grant, got {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn expired_nodes_are_swept() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open(&dir.path().join("store.redb"), conformance::options())
            .expect("open");
        let count = |store: &EmbeddedStore| -> (usize, usize) {
            let txn = store.inner.db.begin_read().expect("read");
            let nodes = txn.open_table(NODES).expect("nodes");
            let expiry = txn.open_table(NODE_EXPIRY).expect("node expiry");
            (
                nodes.iter().expect("iter").count(),
                expiry.iter().expect("iter").count(),
            )
        };
        // Refreshes replace the expiry key instead of adding one.
        let ttl = Duration::from_secs(30);
        for _ in 0..3 {
            store
                .upsert_node(conformance::node("live", "g", "i"), ttl)
                .await
                .expect("upsert");
        }
        assert_eq!(count(&store), (1, 1));

        // Nodes that expired a while ago, written as upsert_node would have.
        let past = now_ms() - 60_000;
        {
            let txn = store.inner.db.begin_write().expect("begin");
            {
                let mut nodes = txn.open_table(NODES).expect("nodes");
                let mut expiry = txn.open_table(NODE_EXPIRY).expect("node expiry");
                for i in 0..(SWEEP_BATCH + 5) {
                    let id = format!("gone-{i:03}");
                    let json =
                        serde_json::to_string(&conformance::node(&id, "g", "i")).expect("encode");
                    nodes
                        .insert(id.as_str(), (json.as_str(), past))
                        .expect("write");
                    expiry.insert((past, id.as_str()), ()).expect("write");
                }
            }
            txn.commit().expect("commit");
        }
        let total = SWEEP_BATCH + 6;
        // Listing only skips them…
        let ids = |nodes: Vec<NodeRecord>| nodes.into_iter().map(|n| n.node_id).collect::<Vec<_>>();
        assert_eq!(ids(store.list_nodes(None).await.expect("list")), ["live"]);
        assert_eq!(
            ids(store.list_nodes(Some("g")).await.expect("list")),
            ["live"]
        );
        assert_eq!(count(&store), (total, total));
        // …and an expired node cannot be removed, but each write sweeps up to SWEEP_BATCH.
        // gone-036 is beyond this sweep's batch: deleted as expired, not reported removed.
        assert!(!store.remove_node("gone-036", "i").await.expect("remove"));
        let left = total - SWEEP_BATCH - 1;
        assert_eq!(count(&store), (left, left));
        store
            .upsert_node(conformance::node("live", "g", "i"), ttl)
            .await
            .expect("upsert");
        assert_eq!(count(&store), (1, 1), "only the live node remains");
        assert_eq!(ids(store.list_nodes(None).await.expect("list")), ["live"]);
    }

    #[tokio::test]
    async fn expired_runs_are_swept() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open(
            &dir.path().join("store.redb"),
            conformance::short_retention_options(),
        )
        .expect("open");
        let t0 = store.now().await.expect("now");
        for i in 0..(SWEEP_BATCH as i64 + 5) {
            store
                .record_run(run("sweep", i, t0 - 10_000))
                .await
                .expect("record");
        }
        let count = |store: &EmbeddedStore| -> usize {
            let txn = store.inner.db.begin_read().expect("read");
            let runs = txn.open_table(RUNS).expect("runs");
            runs.iter().expect("iter").count()
        };
        // Each record swept up to SWEEP_BATCH of the already-expired ones before it.
        assert!(count(&store) <= 2, "left {}", count(&store));
        store
            .record_run(run("sweep", 1_000_000, 0))
            .await
            .expect("record");
        store
            .record_run(run("sweep", 1_000_001, 0))
            .await
            .expect("record");
        assert_eq!(count(&store), 2, "only the live runs remain");
        let txn = store.inner.db.begin_read().expect("read");
        let counts = txn.open_table(RUN_COUNTS).expect("counts");
        assert_eq!(
            counts.get("sweep").expect("get").map(|g| g.value()),
            Some(2)
        );
    }
}
