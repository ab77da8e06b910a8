//! `JobStore` in the embedded store: job CRUD and listing, due fires and their claims,
//! manual triggers and their idempotency keys. Each operation is one redb transaction
//! on the blocking pool.

use super::*;

#[async_trait]
impl JobStore for EmbeddedStore {
    fn job_changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    async fn create_job(&self, job: JobRecord) -> Result<JobRecord> {
        let job = self
            .write(move |inner, b| inner.create_in(b.txn(), job))
            .await?;
        self.job_changed();
        Ok(job)
    }

    async fn update_job(&self, job: JobRecord, expected_version: u64) -> Result<JobRecord> {
        let job = self
            .write(move |inner, b| inner.update_in(b.txn(), job, expected_version))
            .await?;
        self.job_changed();
        Ok(job)
    }

    /// The writes of one partition in one transaction: each one's record, or the
    /// refusal it met (which leaves the others applied). A storage error aborts all.
    async fn apply_jobs(
        &self,
        partition: u32,
        writes: Vec<JobWrite>,
    ) -> Result<Vec<Result<JobRecord>>> {
        let partitions = self.inner.partitions;
        if let Some(w) = writes
            .iter()
            .find(|w| partition_of(w.job_id(), partitions) != partition)
        {
            return Err(Error::Corrupt(format!(
                "write for job {:?} sent to partition {partition}, but it lives in {}",
                w.job_id(),
                partition_of(w.job_id(), partitions)
            )));
        }
        let out = self
            .write(move |inner, b| {
                let txn = b.txn();
                let mut out = Vec::with_capacity(writes.len());
                for w in writes {
                    let r = match w {
                        JobWrite::Create(job) => inner.create_in(txn, job),
                        JobWrite::Update {
                            job,
                            expected_version,
                        } => inner.update_in(txn, job, expected_version),
                    };
                    match r {
                        Err(
                            e @ (Error::JobExists(_)
                            | Error::JobNotFound(_)
                            | Error::VersionConflict { .. }),
                        ) => out.push(Err(e)),
                        Err(e) => return Err(e),
                        Ok(job) => out.push(Ok(job)),
                    }
                }
                Ok(out)
            })
            .await?;
        if out.iter().any(Result::is_ok) {
            self.job_changed();
        }
        Ok(out)
    }

    async fn delete_job(&self, job_id: &str) -> Result<()> {
        let job_id = job_id.to_owned();
        self.write(move |inner, b| {
            let txn = b.txn();
            let job_id = job_id.as_str();
            let mut jobs = txn.open_table(JOBS).ctx("open jobs")?;
            if jobs.remove(job_id).ctx("delete job")?.is_none() {
                return Err(Error::JobNotFound(job_id.to_owned()));
            }
            drop(jobs);
            // Runs and the token counter stay: runs (in flight or not) until retention
            // ends, and the counter so that a job re-created under the same id keeps
            // growing tokens.
            set_pending(txn, inner.partitions, job_id, None)
        })
        .await?;
        self.job_changed();
        Ok(())
    }

    async fn get_job(&self, job_id: &str) -> Result<Option<JobRecord>> {
        self.point_read(|inner| {
            let txn = read(&inner.db)?;
            let jobs = txn.open_table(JOBS).ctx("open jobs")?;
            let pending = txn.open_table(PENDING).ctx("open pending")?;
            load_armed_job(&jobs, &pending, job_id)
        })
    }

    /// One read transaction for the lot, so the jobs are a consistent snapshot.
    async fn get_jobs(&self, job_ids: &[String]) -> Result<Vec<JobRecord>> {
        let job_ids = job_ids.to_vec();
        self.blocking(move |inner| {
            let job_ids = job_ids.as_slice();
            let txn = read(&inner.db)?;
            let jobs = txn.open_table(JOBS).ctx("open jobs")?;
            let pending = txn.open_table(PENDING).ctx("open pending")?;
            let mut out = Vec::with_capacity(job_ids.len());
            for id in job_ids {
                if let Some(job) = load_armed_job(&jobs, &pending, id)? {
                    out.push(job);
                }
            }
            Ok(out)
        })
        .await
    }

    /// Jobs in job id order; the cursor is the last job id of the previous page.
    async fn list_jobs(
        &self,
        cursor: Option<&str>,
        prefix: &str,
        limit: usize,
    ) -> Result<Page<JobRecord>> {
        if let Some(c) = cursor.filter(|c| !crate::model::valid_job_id(c)) {
            return Err(Error::BadCursor(c.to_owned()));
        }
        let cursor = cursor.map(str::to_owned);
        let prefix = prefix.to_owned();
        self.blocking(move |inner| {
            let limit = page_limit(limit);
            let txn = read(&inner.db)?;
            let jobs = txn.open_table(JOBS).ctx("open jobs")?;
            let pending = txn.open_table(PENDING).ctx("open pending")?;
            // The table is ordered by id: the prefix's jobs are one range, from the
            // prefix itself (or after the cursor, when that is further on).
            let start = match cursor.as_deref() {
                Some(c) if c >= prefix.as_str() => Bound::Excluded(c),
                _ if !prefix.is_empty() => Bound::Included(prefix.as_str()),
                _ => Bound::Unbounded,
            };
            let mut items = Vec::new();
            let mut more = false;
            for item in jobs
                .range::<&str>((start, Bound::Unbounded))
                .ctx("scan jobs")?
            {
                let (k, v) = item.ctx("scan jobs")?;
                if !k.value().starts_with(prefix.as_str()) {
                    break;
                }
                if items.len() == limit {
                    more = true;
                    break;
                }
                let job = decode::<JobRecord>("job", k.value(), v.value())?;
                items.push(with_armed(&pending, job)?);
            }
            let next_cursor = if more {
                items.last().map(|j| j.spec.id.clone())
            } else {
                None
            };
            Ok(Page { items, next_cursor })
        })
        .await
    }

    fn job_cursor_after(&self, job_id: &str) -> String {
        job_id.to_owned()
    }

    async fn due_fires(&self, partition: u32, limit: usize) -> Result<DueBatch> {
        self.blocking(move |inner| {
            let now = now_ms();
            let (fires, next_due) = pending_between(inner, partition, i64::MIN, now, limit)?;
            Ok(DueBatch {
                now,
                fires,
                next_due,
            })
        })
        .await
    }

    async fn upcoming_fires(
        &self,
        partition: u32,
        after: Millis,
        by: Millis,
        limit: usize,
    ) -> Result<Vec<DueFire>> {
        let from = after.saturating_add(1);
        self.blocking(move |inner| Ok(pending_between(inner, partition, from, by, limit)?.0))
            .await
    }

    async fn claim_fires(&self, partition: u32, claims: Vec<FireClaim>) -> Result<ClaimOutcome> {
        let outcome = self
            .write(move |inner, b| {
                let txn = b.txn();
            let now = now_ms();
            let mut results = Vec::with_capacity(claims.len());
            let mut appended = Vec::new();
            let mut fires = FireTables::open(txn)?;
            for claim in claims {
                let home = partition_of(&claim.job_id, inner.partitions);
                if home != partition {
                    // A caller bug (claims come from `due_fires` of one partition). The
                    // redis backend cannot touch another partition's slot in one script,
                    // so this one refuses too rather than silently working.
                    return Err(Error::Corrupt(format!(
                        "claim for job {:?} sent to partition {partition}, but it lives in {home}",
                        claim.job_id
                    )));
                }
                let result = inner.claim_one(&mut fires, &claim)?;
                if result == ClaimResult::Claimed {
                    appended.extend(claim.triggers);
                }
                results.push(result);
            }
            append_triggers(txn, now, appended)?;
            let next_due = earliest_due(&*fires.due_index, partition)?;
            Ok(ClaimOutcome {
                now,
                results,
                next_due,
            })
})
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
            .write(move |inner, b| {
                let txn = b.txn();
                let now = now_ms();
                {
                    let jobs = txn.open_table(JOBS).ctx("open jobs")?;
                    if jobs.get(trigger.job_id.as_str()).ctx("read job")?.is_none() {
                        return Err(Error::JobNotFound(trigger.job_id.clone()));
                    }
                }
                inner.sweep_idempotency(txn, now)?;
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
                    let expires_at = now.saturating_add(inner.idempotency_ttl_ms);
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
            .await?;
        if !enqueued.duplicate {
            self.appended.notify_waiters();
        }
        Ok(enqueued)
    }
}

impl Inner {
    /// Creates `job` inside `txn`: refused before anything is written if it exists.
    fn create_in(&self, txn: Tx<'_>, mut job: JobRecord) -> Result<JobRecord> {
        let now = now_ms();
        let jobs = txn.open_table(JOBS).ctx("open jobs")?;
        if jobs.get(job.spec.id.as_str()).ctx("read job")?.is_some() {
            return Err(Error::JobExists(job.spec.id.clone()));
        }
        job.version = 1;
        job.created_at = now;
        job.updated_at = now;
        self.store_armed(txn, jobs, job)
    }

    /// Replaces `job` inside `txn` if it is still at `expected_version`: refused before
    /// anything is written otherwise.
    fn update_in(
        &self,
        txn: Tx<'_>,
        mut job: JobRecord,
        expected_version: u64,
    ) -> Result<JobRecord> {
        let now = now_ms();
        let jobs = txn.open_table(JOBS).ctx("open jobs")?;
        let Some(stored) = load_job(&*jobs, &job.spec.id)? else {
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
        self.store_armed(txn, jobs, job)
    }

    /// Writes the record and makes its pending member match it (none while paused,
    /// whatever `next_fire` says): the last step of a create and of an update.
    fn store_armed(
        &self,
        txn: Tx<'_>,
        mut jobs: Logged<'_, &'static str, &'static str>,
        mut job: JobRecord,
    ) -> Result<JobRecord> {
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
    }

    /// One claim's compare-and-set, inside the batch's transaction.
    fn claim_one(&self, t: &mut FireTables<'_>, claim: &FireClaim) -> Result<ClaimResult> {
        let Some(job) = load_job_standing(&*t.jobs, &claim.job_id)? else {
            return Ok(ClaimResult::Gone);
        };
        if job.paused {
            return Ok(ClaimResult::Gone);
        }
        let pending_due = t
            .pending
            .get(claim.job_id.as_str())
            .ctx("read pending member")?
            .map(|g| g.value());
        // No member while enabled means the schedule ended or another claim consumed the
        // last fire: either way the claimer's view moved.
        if pending_due != Some(claim.expected_due) {
            return Ok(ClaimResult::Moved);
        }
        if job.version != claim.expected_version {
            return Ok(ClaimResult::VersionChanged);
        }
        // A claim advances the schedule but is not a job change: the version stays, so
        // claims computed from the same definition keep matching. It moves the pending
        // member; the record is rewritten only for a fire whose offset from its planned
        // time is not the one it holds (`armed`), which a claim computed from the
        // record's definition never arms.
        if let Some(next) = claim.next
            && job.next_fire.map(jitter_of) != Some(jitter_of(next))
        {
            let mut record = load_job(&*t.jobs, &claim.job_id)?
                .ok_or_else(|| Error::JobNotFound(claim.job_id.clone()))?;
            record.next_fire = Some(next);
            store_job(&mut t.jobs, &record)?;
        }
        write_pending(
            &mut t.pending,
            &mut t.due_index,
            self.partitions,
            &claim.job_id,
            claim.next.map(|a| a.due),
        )?;
        Ok(ClaimResult::Claimed)
    }

    /// Deletes up to `SWEEP_BATCH` idempotency keys past their expiry.
    pub(super) fn sweep_idempotency(&self, txn: Tx<'_>, now: Millis) -> Result<()> {
        sweep_pair_expiry(txn, IDEMPOTENCY_EXPIRY, IDEMPOTENCY, now, "idempotency")
    }
}

/// The tables a batch of fire claims reads and writes, open once for all of them.
struct FireTables<'t> {
    jobs: Logged<'t, &'static str, &'static str>,
    pending: Logged<'t, &'static str, i64>,
    due_index: Logged<'t, (u32, i64, &'static str), ()>,
}

impl<'t> FireTables<'t> {
    fn open(txn: Tx<'t>) -> Result<Self> {
        Ok(FireTables {
            jobs: txn.open_table(JOBS).ctx("open jobs")?,
            pending: txn.open_table(PENDING).ctx("open pending")?,
            due_index: txn.open_table(DUE_INDEX).ctx("open due index")?,
        })
    }
}

/// The pending fires of `partition` due from `from` to `by` (inclusive), earliest first,
/// at most `limit`, and the due time of the next one past them (None: there is none).
fn pending_between(
    inner: &Inner,
    partition: u32,
    from: Millis,
    by: Millis,
    limit: usize,
) -> Result<(Vec<DueFire>, Option<Millis>)> {
    let txn = read(&inner.db)?;
    let index = txn.open_table(DUE_INDEX).ctx("open due index")?;
    let jobs = txn.open_table(JOBS).ctx("open jobs")?;
    let mut due_members = Vec::new();
    let mut next_due = None;
    for item in index.range((partition, from, "")..).ctx("scan due index")? {
        let (k, _) = item.ctx("scan due index")?;
        let (p, due, job_id) = k.value();
        if p != partition {
            break;
        }
        if due > by || due_members.len() >= limit {
            next_due = Some(due);
            break;
        }
        due_members.push((job_id.to_owned(), due));
    }
    let mut fires = Vec::with_capacity(due_members.len());
    for (job_id, due) in due_members {
        match load_job_standing(&jobs, &job_id)? {
            Some(job) => fires.push(DueFire {
                job_id,
                due,
                planned: armed(job.next_fire, Some(due)).map_or(due, |a| a.planned),
                version: job.version,
            }),
            // Job and pending member change in one transaction, so this cannot happen
            // short of damage; skipping keeps the rest of the partition firing.
            None => tracing::warn!(job_id = %job_id, "pending fire without a job"),
        }
    }
    Ok((fires, next_due))
}
