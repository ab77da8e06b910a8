//! Group commit: the embedded store's writes share write transactions, and so syncs.
//!
//! One writer thread owns the write side of the file. Every write is a step sent to it
//! on a channel; the writer takes the first step waiting, opens a write transaction,
//! applies it and every further step already waiting (up to [`MAX_BATCH`]), one after
//! another, then makes the batch durable once and only then answers each caller. So a
//! decision is never acknowledged (nor visible to a reader) before it is durable, and
//! while a batch is made durable the writes that arrive wait in the channel and go into
//! the next one together: under load, many decisions per sync; alone, a write commits
//! at once. A caller waits on its answer as a future: no thread is held per write.
//!
//! Durable means journaled ([`Durable::commit`]): the batch's redo record (every change
//! its steps made, `redo`) is appended to the journal and synced, a sequential write of
//! a few pages, and then the transaction commits without syncing the store file. The
//! file is synced at checkpoints: when the journal has grown past [`CHECKPOINT_BYTES`]
//! or aged past [`CHECKPOINT_AGE`], or after [`CHECKPOINT_IDLE`] without a write, and
//! when the store closes; then the journal starts over. Opening the store replays the
//! records the file's last sync does not hold (`recover`).
//!
//! A step refused by the rules (a stale token, a run in the wrong state) is an `Ok`
//! outcome that wrote nothing, so it never touches its neighbours. A step that fails
//! (`Err` or a panic: storage trouble, a corrupt record) may have written part of
//! itself, so the whole transaction is dropped (redb aborts it) and every caller of
//! that batch gets an error; none of its writes is applied or journaled, and each
//! caller may retry. Reads use read transactions and never wait for the writer.
//!
//! A step sees the transaction as a [`Batch`]: the tables the run path uses (the run
//! tables, jobs, the trigger queue) are opened once per batch and shared by its steps,
//! since redb opens a table once at a time in a transaction and opening one walks the
//! table tree (four opens of the run tables per run were a sixth of the server's CPU
//! under a burst). A step that opens other tables takes the bare transaction, which
//! closes the shared ones first. Either way its tables record its changes (`redo`).

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redb::{Durability, WriteTransaction};
use tokio::sync::oneshot;

use super::journal::Journal;
use super::redo::{Logged, Redo, Tx};
use super::run_tables::RunTables;
use super::{Ctx, Inner, JOBS, TRIGGERS, hold_journal_seq, now_us};
use crate::model::duration_us;
use crate::store::{CommitStats, Error, Result};

/// At most this many steps share one transaction, so a commit never waits on an
/// endless stream of newcomers.
pub const MAX_BATCH: usize = 512;

type Outcome = Box<dyn Any + Send>;
type Step = Box<dyn FnOnce(&Inner, &mut Batch<'_>) -> Result<Outcome> + Send>;

/// The write transaction of one batch as its steps see it, with the tables the run
/// path uses held open from the first step that asks for them until the commit (or
/// until a step takes the bare transaction).
pub struct Batch<'t> {
    txn: Tx<'t>,
    inner: &'t Inner,
    runs: Option<RunTables<'t>>,
    jobs: Option<Logged<'t, &'static str, &'static str>>,
    triggers: Option<Logged<'t, u64, &'static str>>,
}

impl<'t> Batch<'t> {
    fn new(txn: Tx<'t>, inner: &'t Inner) -> Self {
        Batch {
            txn,
            inner,
            runs: None,
            jobs: None,
            triggers: None,
        }
    }

    /// The bare transaction, for a step that opens its own tables: the shared ones are
    /// closed first (their writes stay in the transaction), so it may open any table.
    pub fn txn(&mut self) -> Tx<'t> {
        self.runs = None;
        self.jobs = None;
        self.triggers = None;
        self.txn
    }

    /// The run tables, with the store's clock read for this step.
    pub fn runs(&mut self) -> Result<&mut RunTables<'t>> {
        let tables = match self.runs.take() {
            Some(mut t) => {
                t.set_clock(now_us());
                t
            }
            None => RunTables::open(self.txn, self.inner)?,
        };
        Ok(self.runs.insert(tables))
    }

    /// The jobs table.
    pub fn jobs(&mut self) -> Result<&mut Logged<'t, &'static str, &'static str>> {
        let table = match self.jobs.take() {
            Some(t) => t,
            None => self.txn.open_table(JOBS).ctx("open jobs")?,
        };
        Ok(self.jobs.insert(table))
    }

    /// The trigger queue's table.
    pub fn triggers(&mut self) -> Result<&mut Logged<'t, u64, &'static str>> {
        let table = match self.triggers.take() {
            Some(t) => t,
            None => self.txn.open_table(TRIGGERS).ctx("open triggers")?,
        };
        Ok(self.triggers.insert(table))
    }
}

/// One write waiting for the writer: its step, and where its answer goes.
struct Job {
    step: Step,
    answer: oneshot::Sender<Result<Outcome>>,
}

/// What the writer has done so far, counted as it goes (see [`CommitStats`]).
#[derive(Default)]
struct Counters {
    commits: AtomicU64,
    steps: AtomicU64,
    applying_us: AtomicU64,
    committing_us: AtomicU64,
    checkpoints: AtomicU64,
    checkpointing_us: AtomicU64,
}

impl Counters {
    /// One checkpoint made, in `took`.
    fn checkpointed(&self, took: Duration) {
        self.checkpointing_us
            .fetch_add(duration_us(took), Ordering::Relaxed);
        // Last, so a reader that sees the checkpoint sees its time too.
        self.checkpoints.fetch_add(1, Ordering::Release);
    }

    /// One batch committed: `steps` applied in `applying`, committed in `committing`.
    fn committed(&self, steps: usize, applying: Duration, committing: Duration) {
        self.steps
            .fetch_add(u64::try_from(steps).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.applying_us
            .fetch_add(duration_us(applying), Ordering::Relaxed);
        self.committing_us
            .fetch_add(duration_us(committing), Ordering::Relaxed);
        // Last, so a reader that sees the commit sees its steps and times too.
        self.commits.fetch_add(1, Ordering::Release);
    }
}

/// The writer thread and the channel to it. Dropping it lets the thread finish the
/// batch in hand and waits for it, so the file is closed when the store is.
pub struct Writer {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    /// Commits made, with their steps and times (the metrics' and benchmarks' figures).
    counters: Arc<Counters>,
}

impl Writer {
    /// Starts the writer thread over `inner`'s file.
    pub fn start(inner: Arc<Inner>, durable: Durable) -> std::io::Result<Writer> {
        let (jobs, queue) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        let counted = Arc::clone(&counters);
        let thread = std::thread::Builder::new()
            .name("sundial-embedded-writer".into())
            .spawn(move || run(&inner, &queue, &counted, durable))?;
        Ok(Writer {
            jobs: Some(jobs),
            thread: Some(thread),
            counters,
        })
    }

    /// Applies `step` in the shared write transaction and returns its outcome once
    /// that transaction has committed.
    pub async fn write<T, F>(&self, step: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Inner, &mut Batch<'_>) -> Result<T> + Send + 'static,
    {
        let (answer, answered) = oneshot::channel();
        let job = Job {
            step: Box::new(move |inner, b| step(inner, b).map(|v| Box::new(v) as Outcome)),
            answer,
        };
        let stopped = || Error::Unavailable("the embedded store's writer has stopped".into());
        self.jobs
            .as_ref()
            .ok_or_else(stopped)?
            .send(job)
            .map_err(|_| stopped())?;
        let outcome = answered.await.map_err(|_| stopped())??;
        outcome
            .downcast::<T>()
            .map(|v| *v)
            .map_err(|_| Error::Corrupt("the writer answered with another type".into()))
    }

    /// Commits made so far, with the steps they applied and the time spent on each part.
    pub fn stats(&self) -> CommitStats {
        let c = &self.counters;
        let commits = c.commits.load(Ordering::Acquire);
        CommitStats {
            commits,
            steps: c.steps.load(Ordering::Relaxed),
            applying: Duration::from_micros(c.applying_us.load(Ordering::Relaxed)),
            committing: Duration::from_micros(c.committing_us.load(Ordering::Relaxed)),
            checkpoints: c.checkpoints.load(Ordering::Acquire),
            checkpointing: Duration::from_micros(c.checkpointing_us.load(Ordering::Relaxed)),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop after the batch in hand.
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The writer's loop: a batch per turn, until the channel closes; then a last
/// checkpoint, so a clean restart has nothing to replay.
fn run(inner: &Inner, queue: &mpsc::Receiver<Job>, counters: &Counters, mut durable: Durable) {
    loop {
        // With batches in the journal, a quiet spell is the moment to checkpoint.
        let next = if durable.journal.len() > 0 {
            queue.recv_timeout(CHECKPOINT_IDLE)
        } else {
            queue.recv().map_err(mpsc::RecvTimeoutError::from)
        };
        match next {
            Ok(first) => batch(inner, queue, counters, &mut durable, first),
            Err(mpsc::RecvTimeoutError::Timeout) => durable.checkpoint_alone(inner, counters),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    durable.checkpoint_alone(inner, counters);
}

/// One batch: the first write and every further one already waiting, applied in one
/// transaction, journaled, committed, answered.
fn batch(
    inner: &Inner,
    queue: &mpsc::Receiver<Job>,
    counters: &Counters,
    durable: &mut Durable,
    first: Job,
) {
    let started = Instant::now();
    let txn = match inner.db.begin_write().ctx("begin write transaction") {
        Ok(txn) => txn,
        Err(e) => {
            let _ = first.answer.send(Err(e));
            return;
        }
    };
    let redo = Redo::default();
    let mut applied: Vec<(oneshot::Sender<Result<Outcome>>, Outcome)> = Vec::new();
    let mut next = Some(first);
    let mut failed = None;
    let mut batch = Batch::new(Tx::new(&txn, &redo), inner);
    while let Some(job) = next.take() {
        match catch_unwind(AssertUnwindSafe(|| (job.step)(inner, &mut batch))) {
            Ok(Ok(outcome)) => applied.push((job.answer, outcome)),
            Ok(Err(e)) => {
                failed = Some((job.answer, e));
                break;
            }
            Err(_) => {
                failed = Some((job.answer, Error::Unavailable("a write panicked".into())));
                break;
            }
        }
        if applied.len() < MAX_BATCH {
            next = queue.try_recv().ok();
        }
    }
    // The shared tables close before the transaction commits or is dropped.
    drop(batch);
    if let Some((answer, e)) = failed {
        // Part of the failed step may be written: nothing of this batch may stay.
        drop(txn);
        let why = e.to_string();
        let _ = answer.send(Err(e));
        not_committed(applied, &why);
        return;
    }
    crate::fault::crash_point("embedded.before_commit");
    let applied_at = Instant::now();
    match durable.commit(txn, &redo.take(), counters) {
        Ok(()) => {
            counters.committed(applied.len(), applied_at - started, applied_at.elapsed());
            crate::fault::crash_point("embedded.after_commit");
            for (answer, outcome) in applied {
                let _ = answer.send(Ok(outcome));
            }
        }
        Err(e) => not_committed(applied, &e.to_string()),
    }
}

/// A checkpoint is made once the journal holds this much...
const CHECKPOINT_BYTES: u64 = 64 << 20;
/// ...or its oldest record is this old...
const CHECKPOINT_AGE: Duration = Duration::from_secs(60);
/// ...or no write came for this long (an idle writer syncs at no one's expense).
const CHECKPOINT_IDLE: Duration = Duration::from_secs(1);

/// What makes a batch durable: the journal, and the sequence of the batches in it.
pub struct Durable {
    journal: Journal,
    /// The last batch's sequence number (the store file keeps the last one it holds
    /// under [`super::META_JOURNAL_SEQ`]).
    seq: u64,
    /// When the journal took its first record since the last checkpoint.
    since: Option<Instant>,
}

impl Durable {
    pub fn new(journal: Journal, seq: u64) -> Self {
        Durable {
            journal,
            seq,
            since: None,
        }
    }

    /// Commits a batch's transaction: its redo record appended to the journal and
    /// synced first, then the transaction committed without syncing the store file,
    /// unless a checkpoint is due (then it is synced, and the journal starts over).
    fn commit(
        &mut self,
        mut txn: WriteTransaction,
        redo: &[u8],
        counters: &Counters,
    ) -> Result<()> {
        let seq = self.seq + 1;
        hold_journal_seq(&txn, seq)?;
        let since = *self.since.get_or_insert_with(Instant::now);
        let checkpoint =
            self.journal.len() >= CHECKPOINT_BYTES || since.elapsed() >= CHECKPOINT_AGE;
        if !checkpoint {
            txn.set_durability(Durability::None)
                .map_err(|e| Error::Unavailable(format!("a non-durable commit: {e}")))?;
        }
        self.journal
            .append(seq, redo)
            .map_err(|e| Error::Unavailable(format!("append to the journal: {e}")))?;
        crate::fault::crash_point("embedded.after_journal");
        let committing = Instant::now();
        if let Err(e) = txn.commit().ctx("commit") {
            // Nobody will be told this batch committed: the journal must not say so.
            if let Err(undo) = self.journal.undo_last() {
                tracing::error!(error = %undo, "a batch failed to commit and its journal record could not be taken back: stopping the store");
                std::process::abort();
            }
            return Err(e);
        }
        self.seq = seq;
        if checkpoint {
            // Emptied first, so whoever sees the checkpoint counted sees an empty journal.
            self.cleared();
            counters.checkpointed(committing.elapsed());
        }
        Ok(())
    }

    /// A checkpoint with no batch: an empty transaction committed durably syncs every
    /// non-durable commit before it, and the journal starts over.
    fn checkpoint_alone(&mut self, inner: &Inner, counters: &Counters) {
        if self.journal.len() == 0 {
            return;
        }
        let started = Instant::now();
        let synced = inner
            .db
            .begin_write()
            .ctx("begin checkpoint")
            .and_then(|txn| txn.commit().ctx("commit checkpoint"));
        match synced {
            Ok(()) => {
                self.cleared();
                counters.checkpointed(started.elapsed());
            }
            Err(e) => {
                tracing::warn!(error = %e, "checkpoint of the embedded store failed; the journal keeps every record")
            }
        }
    }

    /// The store file holds every journaled batch durably: the journal starts over.
    fn cleared(&mut self) {
        match self.journal.clear() {
            Ok(()) => self.since = None,
            // The records stay and are skipped on replay (their sequence is in the
            // file); the next checkpoint tries again.
            Err(e) => tracing::warn!(error = %e, "emptying the embedded store's journal failed"),
        }
    }
}

/// Answers every write of a batch that was not committed, saying why.
fn not_committed(applied: Vec<(oneshot::Sender<Result<Outcome>>, Outcome)>, why: &str) {
    for (answer, _) in applied {
        let _ = answer.send(Err(Error::Unavailable(format!(
            "the write's batch was not committed: {why}"
        ))));
    }
}
