//! `RunStore` in the embedded store: recording and listing runs, the run state machine
//! (`begin_run`, `assign_run`, `mark_started`, `renew_leases`, `finish_run`,
//! `expire_run`, `cancel_run`, `fan_out`), progress and logs. Each write is one step
//! of the writer's shared transaction over the run tables (`run_tables::RunTables`,
//! opened once per batch); reads are read transactions on the blocking pool.

use super::run_tables::RunTables;
use super::*;
use crate::store::{Finish, LogBatch, routable_now};

#[async_trait]
impl RunStore for EmbeddedStore {
    async fn record_run(&self, mut run: RunRecord) -> Result<Recorded> {
        self.write(move |_, b| {
            let job = load_job_standing(&**b.jobs()?, &run.job_id)?;
            let t = b.runs()?;
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
                && let Some(reason) = job_skip_reason(job)
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
            t.insert_new(&mut run)?;
            Ok(Recorded { run, created: true })
        })
        .await
    }

    async fn get_run(&self, schedule_id: &str) -> Result<Option<RunRecord>> {
        self.point_read(|inner| {
            let txn = read(&inner.db)?;
            let now = now_ms();
            let runs = txn.open_table(RUNS).ctx("open runs")?;
            Ok(load_run(&runs, schedule_id)?.filter(|r| !inner.expired_run(r, now)))
        })
    }

    /// Newest scheduled_at first. The cursor is the index key of the last run returned,
    /// `"<scheduled_at>:<schedule_id>"`; the next page starts strictly below it, so runs
    /// inserted meanwhile with a newer key can neither be repeated nor shift the page.
    async fn list_runs(&self, job_id: &str, q: RunQuery) -> Result<Page<RunRecord>> {
        let job_id = job_id.to_owned();
        self.blocking(move |inner| {
            let job_id = job_id.as_str();
            let limit = page_limit(q.limit);
            let cursor = q.cursor.as_deref().map(parse_run_cursor).transpose()?;
            let txn = read(&inner.db)?;
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
                if inner.expired_run(&run, now) {
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
        })
        .await
    }

    async fn begin_run(&self, run: RunRecord, route_grace: Duration) -> Result<Begun> {
        self.write(move |_, b| {
            let job = load_job_standing(&**b.jobs()?, &run.job_id)?;
            begin(b.runs()?, job, run, route_grace)
        })
        .await
    }

    async fn begin_and_assign(
        &self,
        run: RunRecord,
        route_grace: Duration,
        node: &NodeSlot,
        terms: LeaseTerms,
    ) -> Result<(Begun, Option<Assigned>)> {
        let node = node.clone();
        self.write(move |_, b| {
            let job = load_job_standing(&**b.jobs()?, &run.job_id)?;
            begin_and_assign(b.runs()?, job, run, route_grace, &node, terms)
        })
        .await
    }

    async fn assign_run(
        &self,
        schedule_id: &str,
        attempt: u32,
        node: &NodeSlot,
        terms: LeaseTerms,
    ) -> Result<Assigned> {
        let (schedule_id, node) = (schedule_id.to_owned(), node.clone());
        self.write(move |_, b| assign(b.runs()?, &schedule_id, attempt, &node, terms))
            .await
    }

    async fn mark_started(&self, schedule_id: &str, holder: &Holder) -> Result<Transition> {
        let (schedule_id, holder) = (schedule_id.to_owned(), holder.clone());
        self.write(move |_, b| {
            let schedule_id = schedule_id.as_str();
            let t = b.runs()?;
            let Some(mut run) = t.load_held(schedule_id)? else {
                return Ok(refused(UNKNOWN_RUN, None));
            };
            if let Some(why) = holder.refusal(&run) {
                return Ok(refused(why, Some(run)));
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
                    t.save(&mut run)?;
                    Ok(applied(run, [], None))
                }
                other => Ok(refused(&format!("run is {other}"), Some(run))),
            }
        })
        .await
    }

    async fn renew_leases(
        &self,
        node_id: &str,
        held_runs: &[Held],
        ttl: Duration,
    ) -> Result<Vec<Option<i64>>> {
        let (node_id, held_runs) = (node_id.to_owned(), held_runs.to_vec());
        self.write(move |_, b| {
            let node_id = node_id.as_str();
            let held_runs = held_runs.as_slice();
            let t = b.runs()?;
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
                        t.save(&mut run)?;
                        out.push(Some(ttl));
                    }
                    None => out.push(None),
                }
            }
            Ok(out)
        })
        .await
    }

    async fn finish_run(
        &self,
        schedule_id: &str,
        by: Finisher,
        outcome: Outcome,
    ) -> Result<Transition> {
        let schedule_id = schedule_id.to_owned();
        self.write(move |_, b| finish(b.runs()?, &schedule_id, by, outcome))
            .await
    }

    /// Each webhook a result asked to claim (`Finish::claim_webhook`) is claimed once
    /// the step is committed, as `claim_deliveries` claims (claims live in memory
    /// here); one the sweep claimed first is left to it.
    async fn finish_runs(&self, results: Vec<Finish>) -> Result<Vec<Transition>> {
        let (mut out, written) = self
            .write(move |_, b| {
                let t = b.runs()?;
                let mut out = Vec::with_capacity(results.len());
                let mut written = Vec::new();
                for f in results {
                    let before = t.webhooks_written.len();
                    out.push(finish(t, &f.schedule_id, f.by, f.outcome)?);
                    if let (Some(lease), Some(sid)) =
                        (f.claim_webhook, t.webhooks_written.get(before))
                    {
                        written.push((out.len() - 1, sid.clone(), lease));
                    }
                }
                Ok((out, written))
            })
            .await?;
        // One claim call per lease asked for (a stream asks for one): each reads its
        // entries in one read transaction.
        let mut by_lease: HashMap<Duration, Vec<(usize, String)>> = HashMap::new();
        for (i, sid, lease) in written {
            by_lease.entry(lease).or_default().push((i, sid));
        }
        for (lease, asked) in by_lease {
            let sids: Vec<String> = asked.iter().map(|(_, sid)| sid.clone()).collect();
            // Not claimed (the sweep was first, or the read failed): the sweep delivers it.
            let Ok(claimed) = self.claim_deliveries(&sids, lease).await else {
                continue;
            };
            let mut claimed: HashMap<String, WebhookDelivery> = claimed
                .into_iter()
                .map(|d| (d.schedule_id.clone(), d))
                .collect();
            for (i, sid) in asked {
                out[i].webhook = claimed.remove(&sid);
            }
        }
        Ok(out)
    }

    async fn due_runs(&self, partition: u32, limit: usize) -> Result<Vec<String>> {
        self.blocking(move |inner| {
            due_in_partition(&inner.db, TIMER_INDEX, partition, limit, "scan run timers")
        })
        .await
    }

    async fn expire_run(&self, schedule_id: &str, route_grace: Duration) -> Result<Transition> {
        let schedule_id = schedule_id.to_owned();
        self.write(move |_, b| {
            let schedule_id = schedule_id.as_str();
            let t = b.runs()?;
            let Some(mut run) = t.load(schedule_id)? else {
                t.drop_timer(schedule_id)?;
                return Ok(refused(UNKNOWN_RUN, None));
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
                    t.save(&mut run)?;
                    return Ok(applied(run, rv, next));
                }
                if !confirmed && (passed(d.confirm_by) || d.lease_expires <= now) {
                    let rv = unconfirmed(t, &mut run)?;
                    t.save(&mut run)?;
                    return Ok(applied(run, rv, None));
                }
                if passed(d.lease_expires) {
                    let rv = t.revoke(&mut run, "lost")?;
                    run.error_code = "lost".to_owned();
                    run.error_message = "the executor stopped renewing its lease".to_owned();
                    let next = t.retry_or_final(&mut run, RunState::Failed, "lost", 0)?;
                    t.save(&mut run)?;
                    return Ok(applied(run, rv, next));
                }
            } else if run.state == RunState::Waiting && passed(d.wake_at) {
                run.deadlines.wake_at = now.saturating_add(duration_ms(route_grace));
                t.save(&mut run)?;
                return Ok(applied(run, [], None));
            }
            // Nothing due (the timer was early, e.g. after a renewal): re-score it.
            t.save(&mut run)?;
            Ok(refused("nothing due", Some(run)))
        })
        .await
    }

    async fn take_back_unconfirmed(
        &self,
        schedule_id: &str,
        holder: &Holder,
    ) -> Result<Transition> {
        let (schedule_id, holder) = (schedule_id.to_owned(), holder.clone());
        self.write(move |_, b| {
            let t = b.runs()?;
            let Some(mut run) = t.load_held(&schedule_id)? else {
                return Ok(refused(UNKNOWN_RUN, None));
            };
            if let Some(why) = holder.refusal(&run) {
                return Ok(refused(why, Some(run)));
            }
            if run.state != RunState::Dispatched {
                return Ok(refused(&format!("run is {}", run.state), Some(run)));
            }
            if run.deadlines.confirm_by == 0 {
                return Ok(refused("the dispatch is confirmed", Some(run)));
            }
            let rv = unconfirmed(t, &mut run)?;
            t.save(&mut run)?;
            Ok(applied(run, rv, None))
        })
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
        self.write(move |_, b| {
            let schedule_id = schedule_id.as_str();
            let t = b.runs()?;
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
                shard.history.clear();
                shard.created_at = now;
                shard.fencing_token = t.new_token(&run.job_id)?;
                shard.deadlines = Deadlines {
                    wake_at: now.saturating_add(duration_ms(route_grace)),
                    wait_until: now.saturating_add(run.plan.dispatch_wait_ms),
                    ..Deadlines::default()
                };
                t.save(&mut shard)?;
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
            t.save(&mut run)?;
            Ok(FannedOut::Shards {
                parent: run,
                shards: out,
            })
        })
        .await
    }

    async fn cancel_run(&self, schedule_id: &str, reason: &str) -> Result<Transition> {
        let (schedule_id, reason) = (schedule_id.to_owned(), reason.to_owned());
        self.write(move |_, b| {
            let schedule_id = schedule_id.as_str();
            let reason = reason.as_str();
            let t = b.runs()?;
            let Some(mut run) = t.load(schedule_id)? else {
                return Ok(refused(UNKNOWN_RUN, None));
            };
            if run.state.is_final() {
                let why = format!("run is already {}", run.state);
                return Ok(refused(&why, Some(run)));
            }
            let (revoked, next) = t.cancel_tree(&mut run, reason, true)?;
            t.save(&mut run)?;
            Ok(applied(run, revoked, next))
        })
        .await
    }

    async fn report_progress(
        &self,
        schedule_id: &str,
        holder: &Holder,
        percent: u32,
        message: &str,
    ) -> Result<Applied> {
        let (schedule_id, holder) = (schedule_id.to_owned(), holder.clone());
        let message = message.to_owned();
        self.write(move |_, b| {
            let schedule_id = schedule_id.as_str();
            let t = b.runs()?;
            let Some(mut run) = t.load_held(schedule_id)? else {
                return Ok(Applied::No(UNKNOWN_RUN.to_owned()));
            };
            if let Some(why) = holder.refusal(&run) {
                return Ok(Applied::No(why.to_owned()));
            }
            if !held(run.state) {
                return Ok(Applied::No(format!("run is {}", run.state)));
            }
            run.progress_percent = percent;
            run.progress_message = message;
            t.save(&mut run)?;
            Ok(Applied::Yes)
        })
        .await
    }

    async fn append_logs(
        &self,
        schedule_id: &str,
        holder: &Holder,
        lines: Vec<LogLine>,
        max_bytes: usize,
    ) -> Result<Applied> {
        // Nothing to store takes no write step (`append` answers it the same).
        if lines.is_empty() {
            return Ok(Applied::Yes);
        }
        let (schedule_id, holder) = (schedule_id.to_owned(), holder.clone());
        self.write(move |_, b| append(b.runs()?, &schedule_id, &holder, lines, max_bytes))
            .await
    }

    async fn append_logs_many(
        &self,
        batches: Vec<LogBatch>,
        max_bytes: usize,
    ) -> Result<Vec<Applied>> {
        if batches.iter().all(|b| b.lines.is_empty()) {
            return Ok(vec![Applied::Yes; batches.len()]);
        }
        self.write(move |_, b| {
            let t = b.runs()?;
            batches
                .into_iter()
                .map(|l| append(t, &l.schedule_id, &l.holder, l.lines, max_bytes))
                .collect()
        })
        .await
    }

    async fn read_logs(&self, schedule_id: &str, after: u64, limit: usize) -> Result<Vec<LogLine>> {
        let schedule_id = schedule_id.to_owned();
        self.blocking(move |inner| {
            let schedule_id = schedule_id.as_str();
            let txn = read(&inner.db)?;
            let now = now_ms();
            let runs = txn.open_table(RUNS).ctx("open runs")?;
            let logs = txn.open_table(LOGS).ctx("open run logs")?;
            let mut out = Vec::new();
            // Logs live as long as their run: a run past retention has none.
            if limit == 0
                || after == u64::MAX
                || load_run(&runs, schedule_id)?.is_none_or(|r| inner.expired_run(&r, now))
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
        })
        .await
    }
}

/// `begin_run`'s step over the run tables, for the job as stored (None: deleted).
fn begin(
    t: &mut RunTables<'_>,
    job: Option<JobStanding>,
    run: RunRecord,
    route_grace: Duration,
) -> Result<Begun> {
    let mut begun = decide_begin(t, job, run, route_grace)?;
    if begun.created {
        t.insert_new(&mut begun.run)?;
    }
    Ok(begun)
}

/// `begin_and_assign`'s step over the run tables: `begin`, then `assign` when the new
/// run is routable now, the new record written once, already leased when the node has
/// room (its history then notes DISPATCHED alone, as the Redis scripts' does). The
/// node's room is judged before the job's run bound deletes its oldest runs, not after
/// (a bound that deletes a run still leased is a full job history, not a burst; the
/// run then waits for the node as any other); a new run the bound deletes at once is
/// not assigned.
fn begin_and_assign(
    t: &mut RunTables<'_>,
    job: Option<JobStanding>,
    run: RunRecord,
    route_grace: Duration,
    node: &NodeSlot,
    terms: LeaseTerms,
) -> Result<(Begun, Option<Assigned>)> {
    let mut begun = decide_begin(t, job, run, route_grace)?;
    if !routable_now(&begun) {
        if begun.created {
            t.insert_new(&mut begun.run)?;
        }
        return Ok((begun, None));
    }
    let granted = lease(t, &mut begun.run, node, terms)?;
    let kept = t.insert_new(&mut begun.run)?;
    let assigned = match (kept, granted) {
        // The job's run bound deleted it at once, its slot with it: as `assign` finds
        // a run deleted before it.
        (false, _) => Assigned::NotWaiting(None),
        (true, true) => Assigned::Granted(begun.run.clone()),
        (true, false) => Assigned::NodeFull,
    };
    Ok((begun, Some(assigned)))
}

/// What beginning makes of a run, nothing of it written yet (`created`: the caller
/// inserts it); an existing run is returned as stored.
fn decide_begin(
    t: &mut RunTables<'_>,
    job: Option<JobStanding>,
    mut run: RunRecord,
    route_grace: Duration,
) -> Result<Begun> {
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
        && let Some(reason) = job_skip_reason(job)
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
                    t.save(&mut old)?;
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
    Ok(Begun {
        run,
        created: true,
        revoked,
    })
}

/// `assign_run`'s step over the run tables.
fn assign(
    t: &mut RunTables<'_>,
    schedule_id: &str,
    attempt: u32,
    node: &NodeSlot,
    terms: LeaseTerms,
) -> Result<Assigned> {
    let Some(mut run) = t.load(schedule_id)? else {
        return Ok(Assigned::NotWaiting(None));
    };
    // wake_at 0 marks a run queued behind a serial run: not routable yet.
    if run.state != RunState::Waiting || run.attempt != attempt || run.deadlines.wake_at == 0 {
        return Ok(Assigned::NotWaiting(Some(run)));
    }
    if !lease(t, &mut run, node, terms)? {
        return Ok(Assigned::NodeFull);
    }
    t.save(&mut run)?;
    Ok(Assigned::Granted(run))
}

/// Leases the WAITING run to the node (DISPATCHED under a fresh token, its deadlines
/// the lease's) and takes a slot of the node, unless the node holds its
/// `max_concurrency` already (false, nothing changed). The caller saves the run.
fn lease(
    t: &mut RunTables<'_>,
    run: &mut RunRecord,
    node: &NodeSlot,
    terms: LeaseTerms,
) -> Result<bool> {
    if node.max_concurrency > 0 && t.busy(&node.node_id)? >= u64::from(node.max_concurrency) {
        return Ok(false);
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
    t.take_slot(&node.node_id, &run.schedule_id)?;
    Ok(true)
}

/// Why a run of this job must be recorded SKIPPED rather than started, if it must.
fn job_skip_reason(job: Option<JobStanding>) -> Option<&'static str> {
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

/// A transition that was refused.
/// A dispatch nothing confirmed goes back to WAITING at the same attempt (reason
/// "unconfirmed"): it may never have reached its node, so the attempt is not spent.
/// The caller saves the run.
fn unconfirmed(t: &mut RunTables<'_>, run: &mut RunRecord) -> Result<Option<Revocation>> {
    let rv = t.revoke(run, "unconfirmed")?;
    let now = t.now;
    run.last_node = run.node_id.clone();
    run.state = RunState::Waiting;
    run.reason = "unconfirmed".to_owned();
    run.deadlines = Deadlines {
        wake_at: now,
        wait_until: now.saturating_add(run.plan.dispatch_wait_ms),
        ..Deadlines::default()
    };
    Ok(rv)
}

fn refused(reason: &str, run: Option<RunRecord>) -> Transition {
    Transition {
        applied: Applied::No(reason.to_owned()),
        run,
        revoked: Vec::new(),
        next_serial: None,
        webhook: None,
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
        webhook: None,
    }
}

/// `finish_run`'s decision in the batch's run tables.
fn finish(
    t: &mut RunTables<'_>,
    schedule_id: &str,
    by: Finisher,
    outcome: Outcome,
) -> Result<Transition> {
    let found = match by {
        Finisher::Holder(_) => t.load_held(schedule_id)?,
        Finisher::Waiting { .. } => t.load(schedule_id)?,
    };
    let Some(mut run) = found else {
        return Ok(refused(UNKNOWN_RUN, None));
    };
    match &by {
        Finisher::Holder(holder) => {
            if let Some(why) = holder.refusal(&run) {
                return Ok(refused(why, Some(run)));
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
            if run.state != RunState::Waiting || run.attempt != *attempt {
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
        if !matches!(by, Finisher::Holder(_)) {
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
        t.save(&mut run)?;
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
    t.save(&mut run)?;
    Ok(applied(run, [], next))
}

/// `append_logs`'s decision in the batch's run tables (no lines is vacuously stored,
/// whoever asks, as in redis).
fn append(
    t: &mut RunTables<'_>,
    schedule_id: &str,
    holder: &Holder,
    lines: Vec<LogLine>,
    max_bytes: usize,
) -> Result<Applied> {
    if lines.is_empty() {
        return Ok(Applied::Yes);
    }
    let Some(run) = t.load_held(schedule_id)? else {
        return Ok(Applied::No(UNKNOWN_RUN.to_owned()));
    };
    if let Some(why) = holder.refusal(&run) {
        return Ok(Applied::No(why.to_owned()));
    }
    if !held(run.state) {
        return Ok(Applied::No(format!("run is {}", run.state)));
    }
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
        bytes = bytes.saturating_add(line.message.len() as u64 + LOG_LINE_COST);
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
            bytes = bytes.saturating_sub(old.message.len() as u64 + LOG_LINE_COST);
            dropped.push(k.value().1);
        }
        for s in dropped {
            t.logs.remove((schedule_id, s)).ctx("delete run log line")?;
        }
    }
    t.log_meta
        .insert(schedule_id, (seq, bytes))
        .ctx("write run log meta")?;
    Ok(Applied::Yes)
}
