//! `RunStore`: run records and the run state machine (begin, assign, start, renew,
//! finish, fan out, expire, cancel), their timers, progress and logs.
//!
//! Guarantees: each transition is one atomic step that checks the run's state and
//! fencing token; a run has at most one unrevoked lease, and a revoked lease or a retried
//! attempt always gets a new token, so the old holder's result, progress and logs are
//! refused. A run's deadlines live in its record and score its partition's timer set,
//! which every instance sweeps (`due_runs` + `expire_run`): no in-memory timer is ever
//! the only record of a deadline. A node's leased runs are counted in the same steps,
//! so its concurrency window holds across instances.

use std::time::Duration;

use async_trait::async_trait;

use super::{Applied, DueEntries, Page, Result, StoreMeta, WebhookDelivery};
use crate::model::{Millis, RunRecord, RunState};

/// What one log line costs against a run's log bound beyond its message's bytes
/// (`append_logs`): at the server's 1 MiB, at most 16 384 lines are kept.
pub const LOG_LINE_COST: u64 = 64;

/// Outcome of `record_run`.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    pub run: RunRecord,
    /// False when the run already existed (a redelivered trigger): `run` is the stored one.
    pub created: bool,
}

/// A run reference as an executor holds it: the schedule_id and the fencing token of
/// its dispatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub schedule_id: String,
    pub token: u64,
}

/// Who reports about a run: the node its stream speaks for and the fencing token of
/// the dispatch it names. A report is applied only when both are the run's current
/// lease's, compared in the same atomic step: knowing a run's token is not enough.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub node_id: String,
    pub token: u64,
}

/// A report from a node that neither holds the run's lease nor held the one before it
/// is refused with this reason: what an executor stream counts as a foreign reference.
pub const NOT_THE_HOLDER: &str = "not the lease holder";
/// A report from the lease's node (or the previous lease's) under a token that is not
/// the current one: a late report about a revoked dispatch.
pub const STALE_TOKEN: &str = "stale fencing token";
/// A report about a run the store does not know (never recorded, or past retention).
pub const UNKNOWN_RUN: &str = "unknown run";

impl Holder {
    /// The holder of a run's current lease, as the store granted it.
    pub fn of(run: &RunRecord) -> Holder {
        Holder {
            node_id: run.node_id.clone(),
            token: run.fencing_token,
        }
    }

    /// Why `run` refuses a report from this holder, if it does. The node is compared
    /// first, so a stream that names another node's run learns nothing of its token.
    pub fn refusal(&self, run: &RunRecord) -> Option<&'static str> {
        if run.node_id != self.node_id {
            return Some(if run.last_node == self.node_id {
                STALE_TOKEN
            } else {
                NOT_THE_HOLDER
            });
        }
        (run.fencing_token != self.token).then_some(STALE_TOKEN)
    }
}

/// The node a run is assigned to, with its concurrency limit (0 = unlimited), which
/// the store enforces across all instances by counting the node's leased runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSlot {
    pub node_id: String,
    pub max_concurrency: u32,
}

/// The lease a dispatch is made under, and how soon it must be confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTerms {
    pub ttl: Duration,
    /// A dispatch not confirmed (Started, or listed by a heartbeat) within this is
    /// re-routed without spending an attempt.
    pub confirm_within: Duration,
}

/// Outcome of `begin_run`.
#[derive(Debug, Clone, PartialEq)]
pub struct Begun {
    /// The run as stored: WAITING (to route now, or queued behind a serial run), or
    /// SKIPPED. For a redelivered trigger: the run as it is now.
    pub run: RunRecord,
    /// False when the run already existed.
    pub created: bool,
    /// Runs revoked by the replace policy; each holder must be sent `Cancel`.
    pub revoked: Vec<Revocation>,
}

/// A lease taken away from a node: the node still holds `token` and must be told to
/// stop (`Cancel`). The run itself was already moved on by the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    pub schedule_id: String,
    pub node_id: String,
    pub token: u64,
    /// The attempt the revoked lease was for (the dispatch's `RunRef.attempt`).
    pub attempt: u32,
    pub reason: String,
}

/// Whether `begin_run` created the run WAITING to be routed at once (what
/// `begin_and_assign` assigns): not queued behind a serial run (no timer), not skipped,
/// not found already recorded.
pub fn routable_now(begun: &Begun) -> bool {
    begun.created && begun.run.state == RunState::Waiting && begun.run.deadlines.wake_at > 0
}

/// One run of a batch given to [`RunStore::begin_and_assign_many`]: begun with its
/// timer `route_grace` away, and leased to `node` when it is routable now.
#[derive(Debug, Clone)]
pub struct BeginOn {
    pub run: RunRecord,
    pub route_grace: Duration,
    pub node: NodeSlot,
}

/// `items` in rounds that each hold at most one of a job (`job_id` names an item's):
/// round k holds the k-th of every job with more than k, in the order given. A batch's
/// begins of different jobs are independent; one job's keep their order (the serial
/// policy and the job's index see them one after the other).
pub fn rounds_by_job<T>(
    items: impl IntoIterator<Item = T>,
    job_id: impl Fn(&T) -> String,
) -> Vec<Vec<T>> {
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut rounds: Vec<Vec<T>> = Vec::new();
    for item in items {
        let k = seen.entry(job_id(&item)).or_insert(0);
        if rounds.len() <= *k {
            rounds.push(Vec::new());
        }
        rounds[*k].push(item);
        *k += 1;
    }
    rounds
}

/// The positions of a batch's runs in [`rounds_by_job`]'s rounds.
pub fn positions_by_job(items: &[BeginOn]) -> Vec<Vec<usize>> {
    rounds_by_job(0..items.len(), |&i| items[i].run.job_id.clone())
}

/// `begin_and_assign`'s outcome once the assignment was tried: after a grant the begun
/// run is the granted record, as the call left it.
pub fn assigned_after(mut begun: Begun, assigned: Assigned) -> (Begun, Option<Assigned>) {
    if let Assigned::Granted(leased) = &assigned {
        begun.run = leased.clone();
    }
    (begun, Some(assigned))
}

/// Outcome of `assign_run`.
#[derive(Debug, Clone, PartialEq)]
pub enum Assigned {
    /// DISPATCHED to the node under a fresh fencing token; send it the dispatch.
    Granted(RunRecord),
    /// The node holds `max_concurrency` leased runs already.
    NodeFull,
    /// The run is no longer WAITING at that attempt (someone else routed or finished
    /// it), or it is gone.
    NotWaiting(Option<RunRecord>),
}

/// Outcome of `fan_out`.
#[derive(Debug, Clone, PartialEq)]
pub enum FannedOut {
    /// The parent (RUNNING) and its shards (WAITING, by index), to route now.
    Shards {
        parent: RunRecord,
        shards: Vec<RunRecord>,
    },
    /// The run is not WAITING at that attempt (or queued), or it is gone.
    NotWaiting(Option<RunRecord>),
}

/// Who finishes a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finisher {
    /// The executor holding the lease (a Result, or the server for an HTTP target).
    Holder(Holder),
    /// The dispatcher, for a WAITING run at this attempt that found no executor.
    Waiting { attempt: u32 },
}

/// The end of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// SUCCEEDED, FAILED or CANCELLED (by the executor). Only FAILED is retried
    /// while attempts remain. WAITING means the executor rejected the dispatch.
    pub state: RunState,
    pub output: Option<Vec<u8>>,
    pub error_code: String,
    pub error_message: String,
    /// Executor-reported times. Absent: `started_at` stays as recorded (by
    /// `mark_started`), `finished_at` is the store's now.
    pub started_at: Option<Millis>,
    pub finished_at: Option<Millis>,
}

/// One run's log lines in a batch given to [`RunStore::append_logs_many`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogBatch {
    pub schedule_id: String,
    pub holder: Holder,
    pub lines: Vec<LogLine>,
}

/// One result of a batch given to [`RunStore::finish_runs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish {
    pub schedule_id: String,
    pub by: Finisher,
    pub outcome: Outcome,
    /// The caller delivers the webhook this result makes due itself: the store claims
    /// its outbox entry for it in the same step, under this lease, and answers the
    /// claim in [`Transition::webhook`] (None: the delivery workers' sweep claims it).
    pub claim_webhook: Option<Duration>,
}

/// What a run transition did, with the follow-up work it leaves to the caller.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub applied: Applied,
    /// The run after the call; None when there is no such run.
    pub run: Option<RunRecord>,
    /// Leases this call took away (several when a broadcast run's shards are
    /// cancelled with it); each node must be sent `Cancel`.
    pub revoked: Vec<Revocation>,
    /// A serial run this call released from the job's queue: it is WAITING and due to
    /// be routed now.
    pub next_serial: Option<String>,
    /// The webhook this call made due (the run's, or a broadcast shard's parent's),
    /// claimed for the caller when its [`Finish::claim_webhook`] asked for it: in
    /// flight under the claim's token until the lease runs out, as
    /// [`Outbox::claim_delivery`](super::Outbox::claim_delivery) would have left it.
    /// The caller delivers it and records the outcome with `finish_delivery`; if it
    /// does neither, the entry comes due again when the lease ends.
    pub webhook: Option<WebhookDelivery>,
}

/// One stored log line of a run.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogLine {
    /// Position in the run's log, from 1, never reused even after old lines are dropped.
    pub seq: u64,
    pub time_ms: Millis,
    pub level: String,
    pub message: String,
    pub attempt: u32,
}

/// Which runs to list for a job, newest (by scheduled time) first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunQuery {
    pub from: Option<Millis>,
    pub to: Option<Millis>,
    pub limit: usize,
    pub cursor: Option<String>,
}

/// Runs and the run state machine. See the module docs.
#[async_trait]
pub trait RunStore: StoreMeta {
    /// Records the run if its schedule_id has no run yet; otherwise returns the stored
    /// one. If the job is now paused or deleted, the run is recorded SKIPPED with reason
    /// "paused" / "deleted". Keeps the per-job index bounded and the record's TTL.
    async fn record_run(&self, run: RunRecord) -> Result<Recorded>;

    async fn get_run(&self, schedule_id: &str) -> Result<Option<RunRecord>>;

    /// Runs of a job, newest first.
    async fn list_runs(&self, job_id: &str, query: RunQuery) -> Result<Page<RunRecord>>;

    /// The cursor that continues a listing of a job's runs right after `run` (for a
    /// caller that stops before the end of a page). Both stores page by scheduled time,
    /// then schedule_id.
    fn run_cursor_after(&self, run: &RunRecord) -> String {
        format!("{}:{}", run.scheduled_at, run.schedule_id)
    }

    // ---- the run state machine (ARCHITECTURE.md, "Life of a run, as built")
    //
    // A run's timer lives in its partition's sorted set of deadlines, scored by the
    // earliest of `run.deadlines`; `due_runs` + `expire_run` are how every instance
    // sweeps it. A run leaving DISPATCHED/RUNNING always leaves its node's lease count.
    // A revoked lease always gets a new token, so the old holder's messages are stale.

    /// Records a trigger's run (`run` is `RunRecord::from_trigger` with its `plan`
    /// filled) and applies the overlap policy against the job's active runs (those not
    /// final) in the same step:
    /// - already recorded → returned unchanged, `created` false;
    /// - trigger says skip, or the job is paused/deleted → SKIPPED (as `record_run`);
    /// - allow, or no active run → WAITING, `wake_at` = now + `route_grace` (the
    ///   caller routes it at once; the timer only matters if the caller dies),
    ///   `wait_until` = now + plan.dispatch_wait_ms;
    /// - forbid with an active run → SKIPPED, reason "overlap";
    /// - serial with an active run → WAITING with no timer, reason "queued", appended
    ///   to the job's serial queue; SKIPPED "serial queue full" past plan.serial_limit;
    /// - replace → every active run is CANCELLED (reason "replaced"), each lease
    ///   revoked (listed in `revoked`), queued serial runs too; then as allow.
    ///
    /// The new run joins the job's active set unless SKIPPED.
    async fn begin_run(&self, run: RunRecord, route_grace: Duration) -> Result<Begun>;

    /// Dispatches a WAITING run at `attempt` to `node`: a fresh fencing token
    /// (max(job counter + 1, store time in µs)), state DISPATCHED, node_id set,
    /// `lease_expires` = now + ttl, `confirm_by` = now + confirm_within, `timeout_at` =
    /// now + plan.timeout_ms (if set), `wake_at`/`wait_until` cleared; the node's lease
    /// count grows by one unless it is at its max concurrency (`NodeFull`, nothing
    /// changes).
    async fn assign_run(
        &self,
        schedule_id: &str,
        attempt: u32,
        node: &NodeSlot,
        terms: LeaseTerms,
    ) -> Result<Assigned>;

    /// `begin_run`, then, when that created the run WAITING to be routed now (not
    /// queued, skipped or found already recorded), `assign_run` of it at its attempt to
    /// `node`: the assignment's outcome is `Some` exactly when it was tried, and a
    /// `NodeFull` leaves the run WAITING as `begin_run` left it. `Begun::run` is the run
    /// as the call left it: the granted record (DISPATCHED) after a grant. For a caller
    /// that knows the node before the run exists: a backend may make both decisions in
    /// one step (both backends do: one write and, on Redis, one script instead of two);
    /// this default makes the two calls, with the same outcomes.
    async fn begin_and_assign(
        &self,
        run: RunRecord,
        route_grace: Duration,
        node: &NodeSlot,
        terms: LeaseTerms,
    ) -> Result<(Begun, Option<Assigned>)> {
        let begun = self.begin_run(run, route_grace).await?;
        if !routable_now(&begun) {
            return Ok((begun, None));
        }
        let assigned = self
            .assign_run(&begun.run.schedule_id, begun.run.attempt, node, terms)
            .await?;
        Ok(assigned_after(begun, assigned))
    }

    /// [`begin_and_assign`](Self::begin_and_assign) of each run of a batch (the
    /// triggers a dispatcher read together), all leased under `terms`, the outcomes in
    /// the order given. Runs of different jobs are independent; runs of one job are
    /// begun in the order given ([`positions_by_job`]). Redis makes one script call per
    /// partition and round; this default makes the calls of a round concurrently (the
    /// embedded store commits them together). An error fails the whole batch: a run
    /// begun by it anyway is found by its trigger's next delivery, as after a lost
    /// reply.
    async fn begin_and_assign_many(
        &self,
        items: Vec<BeginOn>,
        terms: LeaseTerms,
    ) -> Result<Vec<(Begun, Option<Assigned>)>> {
        let mut out: Vec<Option<(Begun, Option<Assigned>)>> = vec![None; items.len()];
        let rounds = positions_by_job(&items);
        // Each run moved into its call (every position is in one round), not cloned.
        let mut items: Vec<Option<BeginOn>> = items.into_iter().map(Some).collect();
        for round in rounds {
            let calls = round
                .iter()
                .filter_map(|&i| items[i].take())
                .map(|item| async move {
                    self.begin_and_assign(item.run, item.route_grace, &item.node, terms)
                        .await
                });
            let done = futures::future::try_join_all(calls).await?;
            for (&i, d) in round.iter().zip(done) {
                out[i] = Some(d);
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// The executor confirmed the dispatch: DISPATCHED → RUNNING with `started_at` (the
    /// store's now), `confirm_by` cleared. RUNNING with the same holder → `Already`.
    /// Anything else (another node's lease, a stale token, a final run) → `No` with
    /// the reason ([`Holder::refusal`], [`UNKNOWN_RUN`], or the state).
    async fn mark_started(&self, schedule_id: &str, holder: &Holder) -> Result<Transition>;

    /// [`mark_started`](Self::mark_started) of each `(schedule_id, holder)` report, the
    /// answers in the order given. A report refused (an unknown run, another node's
    /// lease, a stale token, a run no longer DISPATCHED) is answered `No` with its
    /// reason and changes nothing; the others are applied all the same. Redis makes
    /// one script call per partition; this default makes the calls concurrently (the
    /// embedded store commits them together).
    async fn mark_started_many(&self, reports: &[(String, Holder)]) -> Result<Vec<Applied>> {
        let calls = reports
            .iter()
            .map(|(schedule_id, holder)| self.mark_started(schedule_id, holder));
        let done = futures::future::try_join_all(calls).await?;
        Ok(done.into_iter().map(|t| t.applied).collect())
    }

    /// Takes back a dispatch its node never answered, because the node went silent
    /// (the instance holding its stream heard nothing from it for about a second after
    /// the dispatch): if `holder` holds the run's lease under its token and the run is
    /// DISPATCHED and not confirmed (no `Started` applied, no heartbeat listed it), it
    /// is revoked and goes back to WAITING at the same attempt, exactly as its
    /// `confirm_by` deadline passing would take it (`expire_run`: reason
    /// "unconfirmed", `last_node` = the node, `wake_at` = now, `wait_until` = now +
    /// dispatch_wait_ms), for the caller to route again. A confirmed dispatch, a
    /// RUNNING or final run, another lease → `No` with the reason: a `Started` the
    /// store applied first always wins, so a handler that got its go-ahead is never
    /// run a second time.
    async fn take_back_unconfirmed(&self, schedule_id: &str, holder: &Holder)
    -> Result<Transition>;

    /// Renews exactly the listed leases held by `node_id` (a heartbeat's in-flight
    /// list), each only if its token is current and the lease has not expired; a
    /// DISPATCHED run listed here counts as confirmed (`confirm_by` cleared). Returns,
    /// per entry in order, the lease's remaining time in ms, or None when it is gone.
    async fn renew_leases(
        &self,
        node_id: &str,
        held: &[Held],
        ttl: Duration,
    ) -> Result<Vec<Option<i64>>>;

    /// Ends the current attempt. With `Finisher::Holder`, only if the holder's node and
    /// token are the lease's ([`Holder::refusal`]) and the run DISPATCHED or RUNNING (a
    /// final run finished by that same holder → `Already`); with `Finisher::Waiting`, only if the run is WAITING at that attempt.
    /// FAILED with attempts left → WAITING at attempt + 1, `wake_at` = now +
    /// plan.backoff_after(attempt), `wait_until` = wake_at + dispatch_wait_ms,
    /// `last_node` = the node, error fields kept, a new token; WAITING (only with a
    /// token: the executor rejected the dispatch) → back to WAITING at the same
    /// attempt with a new token, `last_node` = the node, `wake_at` = now, `wait_until`
    /// = now + dispatch_wait_ms, reason "rejected: <error_message>"; otherwise the
    /// outcome is final: the
    /// run leaves the active set and the job's serial queue pops its next run (WAITING,
    /// `wake_at` = now), named in `next_serial`.
    async fn finish_run(
        &self,
        schedule_id: &str,
        by: Finisher,
        outcome: Outcome,
    ) -> Result<Transition>;

    /// [`finish_run`](Self::finish_run) of each result, the answers in the order
    /// given (a stream's results, one store decision per batch). A result refused (an
    /// unknown run, another node's lease, a stale token, a run no longer held) is
    /// answered with its refusal and changes nothing; the others are applied all the
    /// same. Redis makes one script call per partition, the embedded store one write
    /// step; this default makes the calls concurrently.
    async fn finish_runs(&self, results: Vec<Finish>) -> Result<Vec<Transition>> {
        let calls = results
            .into_iter()
            .map(|f| async move { self.finish_run(&f.schedule_id, f.by, f.outcome).await });
        futures::future::try_join_all(calls).await
    }

    /// Sharding broadcast: fans a WAITING run at `attempt` (not queued) out into
    /// `shards` sub-runs `{schedule_id}#{i}` (i from 0), each WAITING at attempt 1 with
    /// the parent's plan, payload and route key, `shard_index`/`shard_total` set,
    /// `wake_at` = now + `route_grace`, `wait_until` = now + dispatch_wait_ms, and its
    /// own token, timer and retries. The parent becomes RUNNING with no lease and no
    /// deadlines (`shard_total` = shards, `started_at` = now) and stays active for the
    /// overlap policy. Shards are not in the job's run list. When a shard becomes
    /// final, the same step counts it on the parent; when the last one does, the
    /// parent becomes SUCCEEDED if every shard did, else FAILED "shards_failed" with
    /// the failed shards named in its error message — and only then leaves the active
    /// set and pops the serial queue.
    ///
    /// Executor-facing calls (`mark_started`, `renew_leases`, `finish_run` by token,
    /// `report_progress`, `append_logs`) given a fanned-out parent's schedule_id act
    /// on its shard 0, because shard 0 travels under the parent's schedule_id.
    async fn fan_out(
        &self,
        schedule_id: &str,
        attempt: u32,
        shards: u32,
        route_grace: Duration,
    ) -> Result<FannedOut>;

    /// Runs of a partition whose timer is due by the store's clock, earliest first.
    async fn due_runs(&self, partition: u32, limit: usize) -> Result<Vec<String>>;

    /// `due_runs`, and how long until the partition's next timer falls due (see
    /// `DueEntries`; by default "look again at the next tick").
    async fn poll_due_runs(&self, partition: u32, limit: usize) -> Result<DueEntries> {
        Ok(DueEntries::unpaced(self.due_runs(partition, limit).await?))
    }

    /// Acts on whatever deadline of the run has passed (store clock), in this order:
    /// - final or missing → the timer is dropped, `Applied::No`;
    /// - DISPATCHED/RUNNING past `timeout_at` → revoked, TIMED_OUT, retried like a
    ///   FAILED outcome (reason "timeout");
    /// - DISPATCHED past `confirm_by`, or past `lease_expires` before it was confirmed →
    ///   revoked, back to WAITING at the same attempt, `wake_at` = now (reason
    ///   "unconfirmed");
    /// - RUNNING (or confirmed DISPATCHED) past `lease_expires` → revoked; WAITING at
    ///   attempt + 1 with `wake_at` = now and `last_node` set, or FAILED reason "lost"
    ///   when attempts are spent;
    /// - WAITING past `wake_at` → `wake_at` moves to now + `route_grace` and the run is
    ///   returned (`Applied::Yes`, state WAITING) for the caller to route;
    /// - otherwise the timer is re-scored to the earliest deadline, `Applied::No`.
    async fn expire_run(&self, schedule_id: &str, route_grace: Duration) -> Result<Transition>;

    /// Cancels a run that is not final: its lease (if any) is revoked, it leaves the
    /// active set and the serial queue, state CANCELLED with `reason`; the serial queue
    /// pops. A fanned-out broadcast run takes its unfinished shards with it (each
    /// revoked and CANCELLED; their revocations listed). A final run → `Applied::No`
    /// with the run.
    async fn cancel_run(&self, schedule_id: &str, reason: &str) -> Result<Transition>;

    /// Stores an executor's progress report if `holder` holds the run's lease and the
    /// run is DISPATCHED or RUNNING: `Yes`, or `No` with the reason.
    async fn report_progress(
        &self,
        schedule_id: &str,
        holder: &Holder,
        percent: u32,
        message: &str,
    ) -> Result<Applied>;

    /// Appends log lines (their `seq` is assigned here) if `holder` holds the run's
    /// lease and the run is DISPATCHED or RUNNING (a final run's log is never
    /// appended to: executors send a run's lines before its result), keeping at most
    /// `max_bytes` per run, each line counted as its message's bytes plus
    /// [`LOG_LINE_COST`] (so lines are bounded too, empty ones included; the oldest
    /// fall out first): `Yes`, or `No` with the reason. No lines is vacuously `Yes`.
    /// Logs live as long as the run record.
    async fn append_logs(
        &self,
        schedule_id: &str,
        holder: &Holder,
        lines: Vec<LogLine>,
        max_bytes: usize,
    ) -> Result<Applied>;

    /// [`append_logs`](Self::append_logs) of each run's lines, the answers in the order
    /// given (a stream's log messages, one store decision per batch). A refused one
    /// changes nothing; the others are appended all the same. Redis makes one script
    /// call per partition, the embedded store one write step; this default makes the
    /// calls concurrently.
    async fn append_logs_many(
        &self,
        batches: Vec<LogBatch>,
        max_bytes: usize,
    ) -> Result<Vec<Applied>> {
        let calls = batches.into_iter().map(|b| async move {
            self.append_logs(&b.schedule_id, &b.holder, b.lines, max_bytes)
                .await
        });
        futures::future::try_join_all(calls).await
    }

    /// Log lines with `seq > after`, oldest first, at most `limit`.
    async fn read_logs(&self, schedule_id: &str, after: u64, limit: usize) -> Result<Vec<LogLine>>;
}
