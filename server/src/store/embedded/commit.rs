//! Group commit: the embedded store's writes share write transactions, and so fsyncs.
//!
//! Every write (`Inner::write`) applies its step inside the one write transaction open
//! at the time, one step after another; the last step applied while no other write is
//! waiting (or the batch's bound) commits the transaction, with one fsync for the whole
//! batch, and only then is every caller of the batch answered. So a decision is never
//! acknowledged before it is durable, and while one batch commits the writes that
//! arrive wait and then go into the next one together: under load, many decisions per
//! fsync; alone, a write commits at once.
//!
//! A step refused by the rules (a stale token, a run in the wrong state) is an `Ok`
//! outcome that wrote nothing, so it never touches its neighbours. A step that fails
//! (`Err`: storage trouble, a corrupt record) may have written part of itself, so the
//! whole transaction is dropped (redb aborts it) and every caller of that batch gets an
//! error; none of its writes is applied, and each caller may retry. Reads use read
//! transactions and never wait for the writer.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use redb::{Database, WriteTransaction};

use super::Ctx;
use crate::store::{Error, Result};

/// At most this many steps share one transaction, so a commit never waits on an
/// endless stream of newcomers.
pub const MAX_BATCH: usize = 512;

/// How many failed batches are remembered for their callers to find.
const FAILED_KEPT: usize = 1024;

/// The shared write transaction and who is in it. See the module docs.
#[derive(Default)]
pub struct GroupCommit {
    batch: Mutex<Batch>,
    /// Wakes the steps waiting for a transaction to open or a batch to end.
    changed: Condvar,
    /// Commits made, for the benchmark's commits-per-run figure.
    commits: AtomicU64,
}

#[derive(Default)]
struct Batch {
    /// The transaction steps apply in; None between batches.
    txn: Option<WriteTransaction>,
    /// The number of the batch `txn` belongs to (from 1).
    open: u64,
    /// Steps applied in the open batch.
    applied: usize,
    /// Steps waiting for their turn to apply.
    queued: usize,
    /// A batch's transaction is being committed (a new one cannot begin meanwhile).
    committing: bool,
    /// Every batch up to this one has ended, committed or failed.
    ended: u64,
    /// The latest batches that failed, with why.
    failed: VecDeque<(u64, String)>,
}

impl GroupCommit {
    /// Applies `step` in the shared write transaction and returns its outcome once
    /// that transaction has committed. Blocking: call it from the blocking pool.
    pub fn write<T>(
        &self,
        db: &Database,
        step: impl FnOnce(&WriteTransaction) -> Result<T>,
    ) -> Result<T> {
        let mut batch = self.lock();
        batch.queued += 1;
        let opened = loop {
            if batch.txn.is_some() {
                break Ok(());
            }
            if !batch.committing {
                break db.begin_write().ctx("begin write transaction").map(|txn| {
                    batch.txn = Some(txn);
                    batch.open += 1;
                    batch.applied = 0;
                });
            }
            batch = self.wait(batch);
        };
        batch.queued -= 1;
        if let Err(e) = opened {
            // The others waiting may try in their turn.
            self.changed.notify_all();
            return Err(e);
        }
        let number = batch.open;
        let Some(txn) = batch.txn.as_ref() else {
            return Err(Error::Unavailable("no write transaction open".into()));
        };
        let outcome = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| step(txn))) {
            Ok(outcome) => outcome,
            Err(panic) => {
                // A step that panicked may have written part of itself.
                batch.txn = None;
                self.end(&mut batch, number, Some("a write panicked".into()));
                std::panic::resume_unwind(panic);
            }
        };
        let value = match outcome {
            Ok(value) => value,
            Err(e) => {
                // Part of the step may be written: nothing of this batch may stay.
                batch.txn = None;
                self.end(&mut batch, number, Some(e.to_string()));
                return Err(e);
            }
        };
        batch.applied += 1;
        if batch.queued == 0 || batch.applied >= MAX_BATCH {
            return self.commit(batch, number).map(|()| value);
        }
        while batch.ended < number {
            batch = self.wait(batch);
        }
        match batch.failed.iter().find(|(n, _)| *n == number) {
            Some((_, why)) => Err(Error::Unavailable(format!(
                "the write's batch was not committed: {why}"
            ))),
            None => Ok(value),
        }
    }

    /// Commits made so far.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Commits batch `number` (its transaction open in `batch`) outside the lock, so
    /// the writes arriving meanwhile can queue for the next one.
    fn commit(&self, mut batch: MutexGuard<'_, Batch>, number: u64) -> Result<()> {
        let Some(txn) = batch.txn.take() else {
            return Err(Error::Unavailable("no write transaction open".into()));
        };
        batch.committing = true;
        drop(batch);
        crate::fault::crash_point("embedded.before_commit");
        let committed = txn.commit().ctx("commit");
        if committed.is_ok() {
            self.commits.fetch_add(1, Ordering::Relaxed);
            crate::fault::crash_point("embedded.after_commit");
        }
        let mut batch = self.lock();
        batch.committing = false;
        let failed = committed.as_ref().err().map(ToString::to_string);
        self.end(&mut batch, number, failed);
        committed
    }

    /// Marks batch `number` ended (failed with `why`, if given) and wakes its waiters.
    fn end(&self, batch: &mut Batch, number: u64, why: Option<String>) {
        if let Some(why) = why {
            batch.failed.push_back((number, why));
            while batch.failed.len() > FAILED_KEPT {
                batch.failed.pop_front();
            }
        }
        batch.ended = batch.ended.max(number);
        self.changed.notify_all();
    }

    fn lock(&self) -> MutexGuard<'_, Batch> {
        // Every field is left consistent between statements, so a panic in a step
        // (which poisons the lock) leaves nothing half-updated.
        self.batch.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, batch: MutexGuard<'a, Batch>) -> MutexGuard<'a, Batch> {
        self.changed.wait(batch).unwrap_or_else(|e| e.into_inner())
    }
}
