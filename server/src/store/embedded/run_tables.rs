//! `RunTables`: every table that describes runs, open together for one write
//! transaction, and the run machine's steps over them (what `begin_run`, `assign_run`,
//! `finish_run`, `expire_run`, `cancel_run` and `fan_out` share), with the helpers
//! those steps and the sweeps use.

use std::cell::RefCell;

use crate::model::RunMark;

use super::*;

/// Every table that describes runs, open together for one write transaction, with the
/// store's clock read once for it.
///
/// redb hands out one handle per table at a time, so the run operations share these
/// handles instead of each helper opening its own. It also keeps in one place the
/// answer to "what must go when a run record goes" (`delete`).
pub(super) struct RunTables<'t> {
    pub(super) now: Millis,
    pub(super) now_us: u64,
    pub(super) partitions: u32,
    pub(super) retention_ms: i64,
    pub(super) max_runs_per_job: u64,
    pub(super) runs: Logged<'t, &'static str, &'static str>,
    pub(super) by_job: Logged<'t, (&'static str, i64, &'static str), ()>,
    pub(super) by_created: Logged<'t, (i64, &'static str), ()>,
    pub(super) counts: Logged<'t, &'static str, u64>,
    /// (job_id, schedule_id): the job's runs that are not final, queued ones included.
    pub(super) active: Logged<'t, (&'static str, &'static str), ()>,
    /// (job_id, position) → schedule_id: the job's serial queue, popped from the front.
    pub(super) serial: Logged<'t, (&'static str, u64), &'static str>,
    /// (partition, due, schedule_id): each run's timer, at the key its stored record
    /// gives it (`timer_key`); the record is how a save finds the entry to move.
    pub(super) timer_index: Logged<'t, (u32, i64, &'static str), ()>,
    /// (node_id, schedule_id): the runs leased to a node, counted for max concurrency.
    /// Changed only through `take_slot` and `leave_node`, which keep `busy_counts`.
    node_runs: Logged<'t, (&'static str, &'static str), ()>,
    /// The nodes' lease counts this batch has counted (`busy`).
    busy_counts: HashMap<String, u64>,
    pub(super) tokens: Logged<'t, &'static str, u64>,
    pub(super) logs: Logged<'t, (&'static str, u64), &'static str>,
    /// schedule_id → (last seq, message bytes kept).
    pub(super) log_meta: Logged<'t, &'static str, (u64, u64)>,
    /// schedule_id → JSON `OutboxEntry`: webhooks written by `finalize`.
    pub(super) outbox: Logged<'t, &'static str, &'static str>,
    /// (partition, due, schedule_id): when each outbox entry is due.
    pub(super) outbox_due: Logged<'t, (u32, i64, &'static str), ()>,
    /// What this batch knows of each stored record it read or wrote, so that a save
    /// moves the run's timer and notes its history without decoding the record it
    /// replaces.
    stored: RefCell<HashMap<String, Stored>>,
    /// The schedule_ids whose outbox entry this batch wrote (`write_outbox`), in order.
    pub(super) webhooks_written: Vec<String>,
}

/// What a batch knows of a stored run record.
struct Stored {
    /// Where its timer sits (none while it has none, or once it is deleted).
    timer: Option<TimerKey>,
    /// What it was (`RunMark`), for its history; none once it is deleted.
    mark: Option<RunMark>,
}

/// Where a run's timer sits in the timer index: (partition, due).
pub(super) type TimerKey = (u32, i64);

/// The timer a run's record gives it: its earliest deadline while it is not final,
/// in its job's partition; none once it is final.
pub(super) fn timer_key(run: &RunRecord, partitions: u32) -> Option<TimerKey> {
    if run.state.is_final() {
        return None;
    }
    let due = run.deadlines.earliest()?;
    Some((partition_of(&run.job_id, partitions), due))
}

impl<'t> RunTables<'t> {
    pub(super) fn open(txn: Tx<'t>, inner: &Inner) -> Result<Self> {
        let mut t = RunTables {
            now: 0,
            now_us: 0,
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
            timer_index: txn.open_table(TIMER_INDEX).ctx("open run timer index")?,
            node_runs: txn.open_table(NODE_RUNS).ctx("open node runs")?,
            busy_counts: HashMap::new(),
            tokens: txn.open_table(TOKENS).ctx("open token counters")?,
            logs: txn.open_table(LOGS).ctx("open run logs")?,
            log_meta: txn.open_table(LOG_META).ctx("open run log meta")?,
            outbox: txn.open_table(OUTBOX).ctx("open webhook outbox")?,
            outbox_due: txn
                .open_table(OUTBOX_DUE)
                .ctx("open webhook outbox index")?,
            stored: RefCell::new(HashMap::new()),
            webhooks_written: Vec::new(),
        };
        t.set_clock(now_us());
        Ok(t)
    }

    /// Sets the clock the next step reads (the tables stay open across a batch's steps,
    /// each of which reads the clock when it begins).
    pub(super) fn set_clock(&mut self, now_us: u64) {
        self.now_us = now_us;
        self.now = i64::try_from(now_us / 1000).unwrap_or(i64::MAX);
    }

    pub(super) fn expired(&self, run: &RunRecord) -> bool {
        run.created_at.saturating_add(self.retention_ms) <= self.now
    }

    /// The run, unless it is missing or past its retention (gone as far as anyone can
    /// tell: in redis its key would have expired).
    pub(super) fn load(&self, schedule_id: &str) -> Result<Option<RunRecord>> {
        Ok(self.read(schedule_id)?.filter(|r| !self.expired(r)))
    }

    /// The stored record, past retention or not, its timer key and mark noted.
    fn read(&self, schedule_id: &str) -> Result<Option<RunRecord>> {
        let run = load_run(&*self.runs, schedule_id)?;
        if let Some(run) = &run {
            self.stored.borrow_mut().insert(
                schedule_id.to_owned(),
                Stored {
                    timer: timer_key(run, self.partitions),
                    mark: Some(run.mark()),
                },
            );
        }
        Ok(run)
    }

    /// The timer key of the stored record (none if there is no record).
    fn stored_timer(&self, schedule_id: &str) -> Result<Option<TimerKey>> {
        if let Some(s) = self.stored.borrow().get(schedule_id) {
            return Ok(s.timer);
        }
        Ok(self
            .read(schedule_id)?
            .and_then(|run| timer_key(&run, self.partitions)))
    }

    /// The run an executor's message names: shard 0 of a fanned-out broadcast run
    /// travels under the parent's schedule_id.
    pub(super) fn load_held(&self, schedule_id: &str) -> Result<Option<RunRecord>> {
        match self.load(schedule_id)? {
            Some(run) if run.is_fanned_out() => self.load(&RunRecord::shard_id(schedule_id, 0)),
            other => Ok(other),
        }
    }

    /// The stored run for a schedule_id about to be recorded: a record past retention
    /// is deleted on the spot so the new one takes its place.
    pub(super) fn existing(&mut self, schedule_id: &str) -> Result<Option<RunRecord>> {
        match self.read(schedule_id)? {
            Some(run) if self.expired(&run) => {
                self.delete(&run)?;
                Ok(None)
            }
            other => Ok(other),
        }
    }

    /// Writes the run back, its history noting what changed since the stored record
    /// (or that it is new), and moves its timer to where the new record puts it: the
    /// earliest deadline while it is not final, none once it is.
    pub(super) fn save(&mut self, run: &mut RunRecord) -> Result<()> {
        let old = self.stored_timer(&run.schedule_id)?;
        let before = self
            .stored
            .borrow()
            .get(&run.schedule_id)
            .and_then(|s| s.mark.clone());
        run.note_change(before.as_ref(), self.now);
        let run = &*run;
        let sid = run.schedule_id.as_str();
        let new = timer_key(run, self.partitions);
        let json = encode("run", run)?;
        self.runs.insert(sid, json.as_str()).ctx("write run")?;
        if old != new {
            if let Some((p, due)) = old {
                self.timer_index
                    .remove((p, due, sid))
                    .ctx("delete run timer index")?;
            }
            if let Some((p, due)) = new {
                self.timer_index
                    .insert((p, due, sid), ())
                    .ctx("write run timer index")?;
            }
        }
        self.stored.borrow_mut().insert(
            sid.to_owned(),
            Stored {
                timer: new,
                mark: Some(run.mark()),
            },
        );
        Ok(())
    }

    /// Takes the run's timer out of the index (the stored record says where it is).
    pub(super) fn drop_timer(&mut self, schedule_id: &str) -> Result<()> {
        if let Some((p, due)) = self.stored_timer(schedule_id)? {
            self.timer_index
                .remove((p, due, schedule_id))
                .ctx("delete run timer index")?;
        }
        self.stored
            .borrow_mut()
            .entry(schedule_id.to_owned())
            .or_insert(Stored {
                timer: None,
                mark: None,
            })
            .timer = None;
        Ok(())
    }

    /// A fresh fencing token for a run of `job_id`: max(counter + 1, store time in µs).
    /// The clock keeps tokens growing even if the counter were lost; the counter keeps
    /// them growing if the clock stepped back.
    pub(super) fn new_token(&mut self, job_id: &str) -> Result<u64> {
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

    /// Visits the schedule_ids of the runs leased to the node.
    fn each_node_run(&self, node_id: &str, mut visit: impl FnMut(&str)) -> Result<()> {
        let upper = successor(node_id);
        for item in self
            .node_runs
            .range((node_id, "")..(upper.as_str(), ""))
            .ctx("scan node runs")?
        {
            visit(item.ctx("scan node runs")?.0.value().1);
        }
        Ok(())
    }

    /// How many runs are leased to the node: counted once per batch, then kept by
    /// `take_slot` and `leave_node` (a batch leases many runs to each node).
    pub(super) fn busy(&mut self, node_id: &str) -> Result<u64> {
        if let Some(&n) = self.busy_counts.get(node_id) {
            return Ok(n);
        }
        let mut n = 0;
        self.each_node_run(node_id, |_| n += 1)?;
        self.busy_counts.insert(node_id.to_owned(), n);
        Ok(n)
    }

    /// The run takes a slot of its node (it is leased to it).
    pub(super) fn take_slot(&mut self, node_id: &str, schedule_id: &str) -> Result<()> {
        let had = self
            .node_runs
            .insert((node_id, schedule_id), ())
            .ctx("write node run")?
            .is_some();
        if !had && let Some(n) = self.busy_counts.get_mut(node_id) {
            *n += 1;
        }
        Ok(())
    }

    /// The runs leased to any node, by schedule_id.
    pub(super) fn leased_ids(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for item in self.node_runs.iter().ctx("scan node runs")? {
            out.push(item.ctx("scan node runs")?.0.value().1.to_owned());
        }
        Ok(out)
    }

    /// The runs leased to the node, by schedule_id.
    pub(super) fn node_run_ids(&self, node_id: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        self.each_node_run(node_id, |sid| out.push(sid.to_owned()))?;
        Ok(out)
    }

    /// The run leaves DISPATCHED/RUNNING (the caller changes its state): its node's
    /// lease count drops.
    pub(super) fn leave_node(&mut self, run: &RunRecord) -> Result<()> {
        if held(run.state) && !run.node_id.is_empty() {
            let had = self
                .node_runs
                .remove((run.node_id.as_str(), run.schedule_id.as_str()))
                .ctx("delete node run")?
                .is_some();
            if had && let Some(n) = self.busy_counts.get_mut(run.node_id.as_str()) {
                *n = n.saturating_sub(1);
            }
        }
        Ok(())
    }

    /// Takes the lease away: a new token makes the holder's stale. None when the run
    /// held no lease.
    pub(super) fn revoke(
        &mut self,
        run: &mut RunRecord,
        reason: &str,
    ) -> Result<Option<Revocation>> {
        if !held(run.state) || run.node_id.is_empty() {
            return Ok(None);
        }
        let revocation = Revocation {
            schedule_id: run.schedule_id.clone(),
            node_id: run.node_id.clone(),
            token: run.fencing_token,
            attempt: run.attempt,
            reason: reason.to_owned(),
        };
        self.leave_node(run)?;
        run.fencing_token = self.new_token(&run.job_id)?;
        Ok(Some(revocation))
    }

    /// The schedule_ids of the job's runs that are not final (as indexed).
    pub(super) fn active_ids(&self, job_id: &str) -> Result<Vec<String>> {
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
    pub(super) fn queue(&self, job_id: &str) -> Result<Vec<(u64, String)>> {
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

    pub(super) fn enqueue(&mut self, job_id: &str, schedule_id: &str) -> Result<()> {
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

    pub(super) fn unqueue(&mut self, job_id: &str, schedule_id: &str) -> Result<()> {
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
    pub(super) fn pop_serial(&mut self, job_id: &str) -> Result<Option<String>> {
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
            self.save(&mut run)?;
            return Ok(Some(sid));
        }
        Ok(None)
    }

    /// Makes the run final (its lease already revoked or released): no deadlines, out
    /// of the active set and the serial queue. Returns the serial run this released,
    /// if `pop`. The caller saves the run.
    pub(super) fn finalize(
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
    pub(super) fn write_outbox(&mut self, run: &mut RunRecord) -> Result<()> {
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
            due: self.now,
        };
        self.put_outbox(&run.schedule_id, &entry, None)?;
        self.webhooks_written.push(run.schedule_id.clone());
        run.callback_state = CallbackState::Pending;
        Ok(())
    }

    /// Writes an outbox entry and moves its index key from `old_due` (if any).
    pub(super) fn put_outbox(
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

    pub(super) fn load_outbox(&self, schedule_id: &str) -> Result<Option<OutboxEntry>> {
        load_outbox(&*self.outbox, schedule_id)
    }

    pub(super) fn remove_outbox(&mut self, schedule_id: &str, entry: &OutboxEntry) -> Result<()> {
        let p = partition_of(&entry.job_id, self.partitions);
        self.outbox.remove(schedule_id).ctx("delete outbox entry")?;
        self.outbox_due
            .remove((p, entry.due, schedule_id))
            .ctx("delete outbox index")?;
        Ok(())
    }

    /// A shard became final: it counts on its parent, which ends with its last shard
    /// (SUCCEEDED only if every shard did). Returns the serial run the parent released.
    pub(super) fn count_shard(&mut self, shard: &RunRecord) -> Result<Option<String>> {
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
        self.save(&mut parent)?;
        Ok(next)
    }

    /// Cancels a run that is not final and, for a fanned-out broadcast run, each of its
    /// shards still going (the parent first, so they do not count on it). Returns the
    /// revocations and the serial run released (if `pop`). The caller saves `run`.
    pub(super) fn cancel_tree(
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
                self.save(&mut shard)?;
            }
        }
        Ok((revoked, next))
    }

    /// An attempt ended badly (its lease already revoked or released): WAITING at
    /// attempt + 1 after `delay`, with a new token, while attempts remain; otherwise
    /// final in `final_state`. Returns the serial run a final outcome released.
    pub(super) fn retry_or_final(
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
    /// False when the new run was among them (older than every run the job keeps).
    pub(super) fn insert_new(&mut self, run: &mut RunRecord) -> Result<bool> {
        self.save(run)?;
        let run = &*run;
        let sid = run.schedule_id.as_str();
        let job_id = run.job_id.as_str();
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
            return Ok(true);
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
        let kept = !oldest.iter().any(|old| old == sid);
        for old_sid in oldest {
            if let Some(old) = load_run(&*self.runs, &old_sid)? {
                self.delete(&old)?;
            }
        }
        Ok(kept)
    }

    /// Deletes a run record and everything that points at it or hangs off it: its
    /// indexes, its place in the active set and serial queue, its timer, its node slot
    /// and its logs.
    pub(super) fn delete(&mut self, run: &RunRecord) -> Result<()> {
        if run.is_fanned_out() {
            for i in 0..run.shard_total {
                if let Some(shard) =
                    load_run(&*self.runs, &RunRecord::shard_id(&run.schedule_id, i))?
                {
                    self.delete(&shard)?;
                }
            }
        }
        let sid = run.schedule_id.as_str();
        let job_id = run.job_id.as_str();
        // Before the record goes: it says where the timer is.
        self.drop_timer(sid)?;
        if let Some(s) = self.stored.borrow_mut().get_mut(sid) {
            s.mark = None;
        }
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
    pub(super) fn sweep(&mut self) -> Result<()> {
        let cutoff = self.now.saturating_sub(self.retention_ms);
        let expired = due_keys(&*self.by_created, cutoff, "scan runs-by-created")?;
        for (created_at, sid) in expired {
            match load_run(&*self.runs, &sid)? {
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
