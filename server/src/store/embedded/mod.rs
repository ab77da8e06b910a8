//! The embedded backend: one durable redb file, single process, the same semantics as
//! the redis backend (and the same conformance suite).
//!
//! It owns the on-disk layout of an embedded store: the tables below, the meta record
//! (schema version, partition count, trigger sequence), and the in-memory delivery state
//! of the trigger queue. Every store operation is one step: a read transaction on the
//! blocking pool, or a step of the shared write transaction that the writer thread
//! applies (`commit`, group commit), so the atomicity the trait promises is redb's: the
//! steps of a write transaction apply one after another, and it commits durably (one
//! sync of the journal, `journal`, for every step in it) or not at all; a caller is
//! answered only once its step has committed. Opening the file first replays what the
//! journal holds and the file does not (`recover`).
//! A heartbeat's writes (lease renewals, the node's registry entry) ride the next
//! commit like every other write: a burst of run writes shares commits with them
//! instead of queueing ahead of them.
//!
//! One file per concern, each implementing the store trait of that concern for
//! `EmbeddedStore`: `jobs` (`JobStore`: jobs, fires, manual triggers), `triggers`
//! (`TriggerQueue`), `runs` (`RunStore`: runs, leases, the run state machine, progress
//! and logs) over `run_tables` (the run tables open together, and the steps the run
//! operations share), `nodes` (`NodeRegistry` and `Inboxes`), `outbox` (`Outbox`: the
//! webhook outbox and circuit breakers), `apps` (`AppStore`: apps and nonces). This
//! file holds the layout, opening the file, `StoreMeta` and the helpers they all use.
//!
//! Layout (all values that are domain records are JSON, so a field added to `model`
//! stays readable as long as it is `serde(default)`-able):
//!
//! | table | key → value | why |
//! |---|---|---|
//! | `meta` | name → u64 | schema version, partitions, next trigger sequence, last journaled batch held |
//! | `jobs` | job_id → JSON `JobRecord` | the jobs |
//! | `pending` | job_id → due | the pending member of a job (at most one): its armed fire's due time (`armed`) |
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
//! | `run_timer_index` | (partition, due, schedule_id) → () | `due_runs` per partition; the key is the run record's (`timer_key`), so a save finds the entry to move from the record it replaces |
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
//!   `append_logs` and `report_progress` need the token and the run DISPATCHED or
//!   RUNNING (a final run's log is never appended to).
//! - Serial means one at a time (pinned): the queue pops only when no run of the job
//!   outside the queue is still active, so cancelling a queued run releases nothing
//!   while another runs, and a queued run cannot be finished by `Finisher::Waiting`.
//! - A rejected dispatch (a WAITING outcome) keeps the run's error fields; any other
//!   outcome whose state is not final is refused (`Applied::No`).
//! - An executor node past its TTL (expires_at ≤ now) is invisible at once: not listed,
//!   and `remove_node` returns false for it (pinned). It is deleted lazily: each
//!   `register_node`, `refresh_node` and `remove_node` first deletes up to [`SWEEP_BATCH`] expired nodes.
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
    Admission, AppStore, Applied, Assigned, AuditEvent, AuditLog, Begun, BreakerState,
    BreakerUpdate, ClaimOutcome, ClaimResult, CleanAdmission, CommitStats, Delivery,
    DeliveryOutcome, DeliveryResult, DeliveryTerms, DueBatch, DueFire, Enqueued, Error, FannedOut,
    Finisher, FireClaim, Held, Holder, Inboxes, JobStore, JobWrite, LOG_LINE_COST, LeaseTerms,
    LogLine, NodeRecord, NodeRegistry, NodeRemoved, NodeSlot, Outbox, Outcome, Page, Recorded,
    Registered, Result, Revocation, RunQuery, RunStore, StoreMeta, StoreOptions, Transition,
    TriggerQueue, UNKNOWN_RUN, WebhookDelivery, partition_of,
};
use crate::model::{
    AppRecord, AppSecret, Arm, CallbackState, Deadlines, JobRecord, Millis, OverlapPolicy,
    RunRecord, RunState, Trigger, WebhookBody, duration_ms, duration_us,
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
/// Version of the file's layout (the embedded store's own; redis keeps
/// `SCHEMA_VERSION`). 1: the first; 2: a run's timer is found from its record, and
/// `run_timers` is gone (a version-1 file is migrated when opened); 3: run records leave
/// out the fields at their default (see `RunRecord`; older records, with every field,
/// are read as they are), so a build before it must not open the file; 4: the file is
/// synced only at checkpoints, the batches since then held by the journal beside it
/// (`journal`), which a build before it would not replay (a version-3 file opens as
/// version 4 unchanged); 5: a fire claim moves only the job's pending member, its
/// record's `next_fire` giving the fire's offset from its planned time (`armed`), which
/// a build before it would read as the armed fire itself (a version-4 file opens as
/// version 5 unchanged: its records and members agree).
pub const FILE_VERSION: u32 = 5;

/// Version 1's index from a run to its timer, deleted by the migration to version 2.
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
const AUDIT: TableDefinition<u64, &str> = TableDefinition::new("audit_log");
const OUTBOX: TableDefinition<&str, &str> = TableDefinition::new("webhook_outbox");
const OUTBOX_DUE: TableDefinition<(u32, i64, &str), ()> =
    TableDefinition::new("webhook_outbox_due");
const BREAKERS: TableDefinition<&str, &str> = TableDefinition::new("webhook_breakers");

const META_SCHEMA: &str = "schema_version";
const META_PARTITIONS: &str = "partitions";
/// The sequence number the next appended trigger gets. Persisted so entry ids never
/// repeat, even after every entry was acked and removed.
const META_TRIGGER_SEQ: &str = "trigger_seq";
/// The sequence number of the last journaled batch the file holds (see `journal`).
const META_JOURNAL_SEQ: &str = "journal_seq";

/// A queue entry as stored: the trigger and when it was appended (store clock).
#[derive(Debug, Serialize, Deserialize)]
struct QueuedTrigger {
    enqueued_at: Millis,
    trigger: Trigger,
}

/// A webhook waiting in the outbox: the redis scripts' JSON shape less the claim
/// (`token`, `in_flight`), which this store holds in memory (`Claims`); entries
/// written with those fields still read.
#[derive(Debug, Serialize, Deserialize)]
struct OutboxEntry {
    job_id: String,
    url: String,
    body: String,
    created_at: Millis,
    attempts: u32,
    /// When the next attempt is due.
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
    /// Closed and ramping up: the destination's window until it reaches the limit.
    #[serde(default)]
    ramp: Option<u32>,
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
    route_counters: crate::store::LocalCounters,
    /// Webhook delivery claims: in memory, as only this process delivers (see
    /// `outbox`); a claim need not outlive the process that would act on it.
    claims: Mutex<Claims>,
    /// Every destination that may have a breaker record: those with one when the store
    /// opened and every one that failed since (added before the failure is written).
    /// Any other has none, so its breaker is answered without reading the file. It
    /// never shrinks: a handful of destinations.
    tripped: Mutex<HashSet<String>>,
    /// The pacing slots held, per destination: in memory, as only this process
    /// delivers (see `outbox`).
    paces: Arc<Mutex<Paces>>,
    /// The writer thread every write goes through (group commit, see `commit`).
    writer: Writer,
}

/// The webhook deliveries in flight: schedule_id → (delivery token, lease end), and
/// the last token handed out (tokens only grow).
#[derive(Debug, Default)]
struct Claims {
    last_token: u64,
    live: HashMap<String, (u64, Millis)>,
}

/// Pacing per destination (`outbox`).
type Paces = HashMap<String, outbox::Pace>;

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

#[async_trait]
impl StoreMeta for EmbeddedStore {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    fn partitions(&self) -> u32 {
        self.inner.partitions
    }

    fn shared(&self) -> bool {
        false
    }

    async fn now(&self) -> Result<Millis> {
        Ok(now_ms())
    }

    fn commit_stats(&self) -> Option<CommitStats> {
        Some(self.writer.stats())
    }

    async fn check_indexes(&self) -> Result<()> {
        self.blocking(|inner| {
            let txn = read(&inner.db)?;
            check_run_timers(&txn, inner.partitions)
        })
        .await
    }
}

/// Every run timer in the index is the one its record gives (`timer_key`), and every
/// record that gives one has it.
fn check_run_timers(txn: &ReadTransaction, partitions: u32) -> Result<()> {
    let runs = txn.open_table(RUNS).ctx("open runs")?;
    let index = txn.open_table(TIMER_INDEX).ctx("open run timer index")?;
    let mut wanted = HashSet::new();
    for item in runs.iter().ctx("scan runs")? {
        let (k, v) = item.ctx("scan runs")?;
        let run: RunRecord = decode("run", k.value(), v.value())?;
        if let Some((p, due)) = run_tables::timer_key(&run, partitions) {
            wanted.insert((p, due, run.schedule_id));
        }
    }
    let mut found = HashSet::new();
    for item in index.iter().ctx("scan run timer index")? {
        let (k, _) = item.ctx("scan run timer index")?;
        let (p, due, sid) = k.value();
        found.insert((p, due, sid.to_owned()));
    }
    let stray: Vec<_> = found.difference(&wanted).take(5).collect();
    let missing: Vec<_> = wanted.difference(&found).take(5).collect();
    if stray.is_empty() && missing.is_empty() {
        return Ok(());
    }
    Err(Error::Corrupt(format!(
        "run timers out of step with the records: in the index but not given by a record {stray:?}; given by a record but not in the index {missing:?}"
    )))
}

impl EmbeddedStore {
    /// Opens (creating if missing) the store file at `path`. A new file records
    /// `FILE_VERSION` and `opts.partitions`; an existing one keeps its partition count,
    /// one of an older version is migrated, and one written by a newer version is
    /// refused with `Error::SchemaTooNew`.
    ///
    /// This is blocking I/O (it may fsync); call it at start-up or from a blocking task.
    pub fn open(path: &Path, opts: StoreOptions) -> Result<EmbeddedStore> {
        let db = Database::create(path)
            .map_err(|e| map_redb(&format!("open embedded store {}", path.display()), e.into()))?;
        let partitions = init_meta(&db, opts.partitions)?;
        let durable = recover(&db, path)?;
        // The remaining tables are created up front so that read transactions can always
        // open them (a read transaction cannot create a table).
        let txn = db.begin_write().ctx("begin schema transaction")?;
        create_tables(&txn)?;
        forget_nodes(&txn)?;
        txn.commit().ctx("commit schema transaction")?;
        let tripped = breaker_destinations(&db)?;

        let (changes, _) = watch::channel(0);
        let inner = Arc::new(Inner {
            db,
            partitions,
            run_retention_ms: duration_ms(opts.run_retention),
            // Zero would delete a run in the very operation that records it, breaking
            // `record_run`'s idempotency, so at least one run per job is kept.
            max_runs_per_job: u64::try_from(opts.max_runs_per_job.max(1)).unwrap_or(u64::MAX),
            idempotency_ttl_ms: duration_ms(opts.idempotency_ttl),
            queue: Mutex::new(QueueState::default()),
        });
        if !opts.reopen_lease_grace.is_zero() {
            let extended = extend_lapsed_leases(&inner, opts.reopen_lease_grace)?;
            if extended > 0 {
                tracing::info!(
                    leases = extended,
                    grace = ?opts.reopen_lease_grace,
                    "held runs whose lease lapsed while no server was up get a grace to be renewed"
                );
            }
        }
        let writer = Writer::start(Arc::clone(&inner), durable)
            .map_err(|e| Error::Unavailable(format!("start the embedded store's writer: {e}")))?;
        Ok(EmbeddedStore {
            inner,
            writer,
            changes,
            appended: Arc::new(Notify::new()),
            inboxes: Mutex::new(HashMap::new()),
            inbox_pushed: Notify::new(),
            route_counters: Default::default(),
            claims: Mutex::new(Claims::default()),
            tripped: Mutex::new(tripped),
            paces: Arc::default(),
        })
    }

    /// One step in the shared write transaction, answered once it has committed (see
    /// `commit`).
    async fn write<T, F>(&self, step: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Inner, &mut Batch<'_>) -> Result<T> + Send + 'static,
    {
        self.writer.write(step).await
    }

    /// A read of a few pages (one record by its key), done on the calling task: redb
    /// answers it from its page cache in microseconds, less than a hand-off to the
    /// blocking pool costs (two thread switches; the pool's wake-ups were 7 % of the
    /// server's samples at 3 000 runs/s when the webhook worker's two reads per run went
    /// through it). Scans, and anything else that may read many pages, use `blocking`.
    fn point_read<T>(&self, f: impl FnOnce(&Inner) -> Result<T>) -> Result<T> {
        f(&self.inner)
    }

    /// Runs `f` on the blocking pool: redb reads block on disk.
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

/// Looks with `look` until it finds something, waiting for `wake` between looks, for at
/// most `block` (a block too long to represent is as good as forever); one last look
/// once it has passed. What blocking reads (`read_triggers`, `pop_inbox`) share.
async fn look_until_found<T, F, Fut>(wake: &Notify, block: Duration, mut look: F) -> Result<Vec<T>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Vec<T>>>,
{
    let deadline = Instant::now().checked_add(block);
    loop {
        // Registered before looking, so a wake between the look and the wait still
        // counts.
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let got = look().await?;
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

/// Checks or writes the meta record, migrating a file of an older version; returns
/// the store's partition count.
fn init_meta(db: &Database, wanted_partitions: u32) -> Result<u32> {
    let txn = db.begin_write().ctx("begin meta transaction")?;
    let (partitions, found) = {
        let mut meta = txn.open_table(META).ctx("open meta table")?;
        let schema = meta
            .get(META_SCHEMA)
            .ctx("read schema version")?
            .map(|g| g.value());
        match schema {
            None => {
                let partitions = wanted_partitions.max(1);
                meta.insert(META_SCHEMA, u64::from(FILE_VERSION))
                    .ctx("write schema version")?;
                meta.insert(META_PARTITIONS, u64::from(partitions))
                    .ctx("write partitions")?;
                meta.insert(META_TRIGGER_SEQ, 1)
                    .ctx("write trigger sequence")?;
                (partitions, u64::from(FILE_VERSION))
            }
            Some(found) => {
                if found > u64::from(FILE_VERSION) {
                    return Err(Error::SchemaTooNew {
                        found: u32::try_from(found).unwrap_or(u32::MAX),
                        supported: FILE_VERSION,
                    });
                }
                let stored = meta
                    .get(META_PARTITIONS)
                    .ctx("read partitions")?
                    .map(|g| g.value())
                    .ok_or_else(|| Error::Corrupt("meta record has no partition count".into()))?;
                match u32::try_from(stored) {
                    Ok(p) if p > 0 => (p, found),
                    _ => {
                        return Err(Error::Corrupt(format!(
                            "meta record has an invalid partition count {stored}"
                        )));
                    }
                }
            }
        }
    };
    if found < 2 {
        migrate_run_timers(&txn, partitions)?;
    }
    if found < u64::from(FILE_VERSION) {
        txn.open_table(META)
            .ctx("open meta table")?
            .insert(META_SCHEMA, u64::from(FILE_VERSION))
            .ctx("write schema version")?;
    }
    txn.commit().ctx("commit meta transaction")?;
    Ok(partitions)
}

/// Brings the file up to the journal: the records of batches its durable state lacks
/// (a crash came before their checkpoint) are replayed in order and committed durably,
/// and the journal starts over. Returns the journal and the last batch's sequence.
fn recover(db: &Database, path: &Path) -> Result<Durable> {
    let journal_path = journal::Journal::path_for(path);
    let io = |e: std::io::Error| {
        Error::Unavailable(format!("open the journal {}: {e}", journal_path.display()))
    };
    let (mut journal, records) = journal::Journal::open(&journal_path).map_err(io)?;
    let txn = db.begin_write().ctx("begin journal replay")?;
    let mut seq = {
        let meta = txn.open_table(META).ctx("open meta")?;
        meta.get(META_JOURNAL_SEQ)
            .ctx("read journal sequence")?
            .map_or(0, |g| g.value())
    };
    let held = seq;
    let started = Instant::now();
    let (mut replayed, mut bytes) = (0, 0);
    for record in records.iter().filter(|r| r.seq > held) {
        redo::replay(&txn, &record.redo)?;
        seq = record.seq;
        replayed += 1;
        bytes += record.redo.len();
    }
    if replayed > 0 {
        hold_journal_seq(&txn, seq)?;
        txn.commit().ctx("commit journal replay")?;
        tracing::info!(
            batches = replayed,
            bytes,
            took_ms = started.elapsed().as_millis(),
            journal = %journal_path.display(),
            "replayed the journal's batches the store file did not hold yet"
        );
    }
    journal.clear().map_err(io)?;
    Ok(Durable::new(journal, seq))
}

/// Notes in `meta` that the transaction holds the journal's batches up to `seq`.
fn hold_journal_seq(txn: &WriteTransaction, seq: u64) -> Result<()> {
    txn.open_table(META)
        .ctx("open meta")?
        .insert(META_JOURNAL_SEQ, seq)
        .ctx("write journal sequence")?;
    Ok(())
}

/// Version 1 → 2: version 1 kept each run's timer key in `run_timers` beside the
/// index; version 2 reads it from the run record. An index entry the records do not
/// account for (its run gone, or its record saying another key) is removed, so that
/// none is left that no save would ever move; then `run_timers` is deleted.
fn migrate_run_timers(txn: &WriteTransaction, partitions: u32) -> Result<()> {
    {
        let runs = txn.open_table(RUNS).ctx("open runs")?;
        let mut index = txn.open_table(TIMER_INDEX).ctx("open run timer index")?;
        let mut stale = Vec::new();
        for item in index.iter().ctx("scan run timer index")? {
            let (k, _) = item.ctx("scan run timer index")?;
            let (p, due, sid) = k.value();
            let run = load_run(&runs, sid)?;
            if run.and_then(|r| run_tables::timer_key(&r, partitions)) != Some((p, due)) {
                stale.push((p, due, sid.to_owned()));
            }
        }
        for (p, due, sid) in stale {
            tracing::warn!(schedule_id = %sid, "migration: a run timer its record does not give, removed");
            index
                .remove((p, due, sid.as_str()))
                .ctx("delete run timer index")?;
        }
    }
    txn.delete_table(TIMERS).ctx("delete run timers")?;
    Ok(())
}

/// The destinations that have a breaker record.
fn breaker_destinations(db: &Database) -> Result<HashSet<String>> {
    let txn = read(db)?;
    let table = txn.open_table(BREAKERS).ctx("open webhook breakers")?;
    let mut out = HashSet::new();
    for item in table.iter().ctx("scan webhook breakers")? {
        let (k, _) = item.ctx("scan webhook breakers")?;
        out.insert(k.value().to_owned());
    }
    Ok(out)
}

/// Leases that lapsed, or would lapse at once, while no server was up to renew them:
/// each held run's lease ends `grace` after now at the earliest, so that its executor
/// can reconnect and renew it (a hello lists the runs it holds) or report its result,
/// instead of the first sweep declaring the run lost and throwing finished work away.
/// Returns how many leases it extended.
fn extend_lapsed_leases(inner: &Inner, grace: Duration) -> Result<usize> {
    let txn = inner.db.begin_write().ctx("begin lease grace")?;
    let extended = {
        let redo = Redo::default();
        let mut t = run_tables::RunTables::open(Tx::new(&txn, &redo), inner)?;
        let until = t.now.saturating_add(duration_ms(grace));
        let mut extended = 0;
        for sid in t.leased_ids()? {
            let Some(mut run) = t.load(&sid)? else {
                continue;
            };
            if held(run.state) && run.deadlines.lease_expires < until {
                run.deadlines.lease_expires = until;
                t.save(&mut run)?;
                extended += 1;
            }
        }
        extended
    };
    txn.commit().ctx("commit lease grace")?;
    Ok(extended)
}

/// The store serves one process, so every node registered in it had its stream on a
/// process that is gone: routing to those nodes would send dispatches nowhere (each
/// then waits out the unresponsive window). Their executors register again when they
/// reconnect; the runs they hold keep their leases until then (or their TTL).
fn forget_nodes(txn: &WriteTransaction) -> Result<()> {
    txn.open_table(NODES)
        .ctx("open nodes")?
        .retain(|_, _| false)
        .ctx("forget the previous process's nodes")?;
    txn.open_table(NODE_EXPIRY)
        .ctx("open node expiry")?
        .retain(|_, _| false)
        .ctx("forget the previous process's nodes")?;
    Ok(())
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
    txn.open_table(AUDIT).ctx("create audit log")?;
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
    txn: Tx<'_>,
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
        .map(duration_us)
        .unwrap_or(0)
}

fn now_ms() -> Millis {
    i64::try_from(now_us() / 1000).unwrap_or(i64::MAX)
}

fn page_limit(limit: usize) -> usize {
    if limit == 0 { DEFAULT_PAGE } else { limit }
}

// ---- transaction helpers

fn read(db: &Database) -> Result<ReadTransaction> {
    db.begin_read().ctx("begin read transaction")
}

/// The JSON record at `key` of a table of them, decoded; `what` names it in errors.
fn load<T: DeserializeOwned>(
    table: &impl ReadableTable<&'static str, &'static str>,
    what: &str,
    key: &str,
) -> Result<Option<T>> {
    match table
        .get(key)
        .map_err(|e| map_redb(&format!("read {what}"), e.into()))?
    {
        Some(g) => decode(what, key, g.value()).map(Some),
        None => Ok(None),
    }
}

fn load_job(
    jobs: &impl ReadableTable<&'static str, &'static str>,
    job_id: &str,
) -> Result<Option<JobRecord>> {
    load(jobs, "job", job_id)
}

/// What the run path needs of a job's record: a run's begin whether it is paused, a
/// fire's claim (and `due_fires`) also its version and recorded fire. Decoding only
/// this skips building the rest of the record (its spec, payload and all), which was a
/// twelfth of the writer's time under a burst.
#[derive(Clone, Copy, Deserialize)]
struct JobStanding {
    #[serde(default)]
    paused: bool,
    version: u64,
    next_fire: Option<Arm>,
}

/// The standing of the job as stored; None if it is not (deleted).
fn load_job_standing(
    jobs: &impl ReadableTable<&'static str, &'static str>,
    job_id: &str,
) -> Result<Option<JobStanding>> {
    load(jobs, "job", job_id)
}

/// The job with its armed fire as it stands (`armed`).
fn load_armed_job(
    jobs: &impl ReadableTable<&'static str, &'static str>,
    pending: &impl ReadableTable<&'static str, i64>,
    job_id: &str,
) -> Result<Option<JobRecord>> {
    load_job(jobs, job_id)?
        .map(|job| with_armed(pending, job))
        .transpose()
}

/// The job as its record decodes, with its armed fire as it stands (`armed`).
fn with_armed(
    pending: &impl ReadableTable<&'static str, i64>,
    mut job: JobRecord,
) -> Result<JobRecord> {
    let due = pending
        .get(job.spec.id.as_str())
        .ctx("read pending member")?
        .map(|g| g.value());
    job.next_fire = armed(job.next_fire, due);
    Ok(job)
}

/// A job's armed fire, from its record's `next_fire` (`recorded`) and its pending
/// member's due time. The record holds the fire written when the job was last created,
/// updated or re-armed; a fire claim moves only the member when the fire it arms keeps
/// the recorded offset from its planned time (the job's jitter, the same for every
/// fire of a definition; `claim_one`). So the member gives the due time and the record
/// the offset. None without a member (paused, or the schedule ended).
fn armed(recorded: Option<Arm>, pending_due: Option<Millis>) -> Option<Arm> {
    let (arm, due) = (recorded?, pending_due?);
    Some(Arm {
        planned: due.saturating_sub(jitter_of(arm)),
        due,
    })
}

/// How much later than planned an armed fire is due.
fn jitter_of(arm: Arm) -> i64 {
    arm.due.saturating_sub(arm.planned)
}

fn store_job(jobs: &mut Logged<'_, &'static str, &'static str>, job: &JobRecord) -> Result<()> {
    let json = encode("job", job)?;
    jobs.insert(job.spec.id.as_str(), json.as_str())
        .ctx("write job")?;
    Ok(())
}

fn load_run(
    runs: &impl ReadableTable<&'static str, &'static str>,
    schedule_id: &str,
) -> Result<Option<RunRecord>> {
    load(runs, "run", schedule_id)
}

fn load_outbox(
    outbox: &impl ReadableTable<&'static str, &'static str>,
    schedule_id: &str,
) -> Result<Option<OutboxEntry>> {
    load(outbox, "outbox entry", schedule_id)
}

/// Rewrites a job's pending member: removes the old one (and its index key), then arms
/// `due` if any. Both tables always change together, so they cannot disagree.
fn set_pending(txn: Tx<'_>, partitions: u32, job_id: &str, due: Option<Millis>) -> Result<()> {
    let mut pending = txn.open_table(PENDING).ctx("open pending")?;
    let mut index = txn.open_table(DUE_INDEX).ctx("open due index")?;
    write_pending(&mut pending, &mut index, partitions, job_id, due)
}

/// `set_pending` over tables its caller holds open.
fn write_pending(
    pending: &mut Logged<'_, &'static str, i64>,
    index: &mut Logged<'_, (u32, i64, &'static str), ()>,
    partitions: u32,
    job_id: &str,
    due: Option<Millis>,
) -> Result<()> {
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
fn append_triggers(txn: Tx<'_>, now: Millis, triggers: Vec<Trigger>) -> Result<()> {
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

mod apps;
mod audit;
mod commit;
mod jobs;
mod journal;
mod nodes;
mod outbox;
mod redo;
mod run_tables;
mod runs;
#[cfg(test)]
mod tests;
mod triggers;

use commit::{Batch, Durable, Writer};
use redo::{Logged, Redo, Tx};

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

/// Up to `limit` ids of a `(partition, time, id)` index whose time is due by now,
/// earliest first: run timers and webhook deliveries.
fn due_in_partition(
    db: &Database,
    table: TableDefinition<(u32, i64, &str), ()>,
    partition: u32,
    limit: usize,
    what: &str,
) -> Result<Vec<String>> {
    due_in_partition_except(db, table, partition, limit, &HashSet::new(), what)
}

/// As `due_in_partition`, passing over the ids in `skip`.
fn due_in_partition_except(
    db: &Database,
    table: TableDefinition<(u32, i64, &str), ()>,
    partition: u32,
    limit: usize,
    skip: &HashSet<String>,
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
        let id = k.value().2;
        if skip.contains(id) {
            continue;
        }
        out.push(id.to_owned());
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
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
