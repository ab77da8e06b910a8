//! `JobStore` in Redis: job CRUD and listing (every write is one `apply_jobs` script
//! per partition), due fires and their claims (one script per partition batch), and
//! manual triggers with idempotency keys.

use super::*;

#[async_trait]
impl JobStore for RedisStore {
    fn job_changes(&self) -> watch::Receiver<u64> {
        self.inner.changes.clone()
    }

    /// One create: the one-write batch of [`RedisStore::apply_jobs`] (one script for
    /// every job write, so the pending member is armed in exactly one place).
    async fn create_job(&self, job: JobRecord) -> Result<JobRecord> {
        self.write_one(JobWrite::Create(job)).await
    }

    async fn update_job(&self, job: JobRecord, expected_version: u64) -> Result<JobRecord> {
        self.write_one(JobWrite::Update {
            job,
            expected_version,
        })
        .await
    }

    async fn apply_jobs(
        &self,
        partition: u32,
        writes: Vec<JobWrite>,
    ) -> Result<Vec<Result<JobRecord>>> {
        if let Some(w) = writes.iter().find(|w| self.part(w.job_id()) != partition) {
            return Err(Error::Corrupt(format!(
                "write for job {:?} sent to partition {partition}, but it lives in {}",
                w.job_id(),
                self.part(w.job_id())
            )));
        }
        if writes.is_empty() {
            return Ok(Vec::new());
        }
        let mut invocation = self.inner.scripts.apply_jobs.prepare_invoke();
        invocation
            .key(self.key(partition, "pending"))
            .key(self.key(partition, "jobs"));
        for w in &writes {
            invocation
                .key(self.key(partition, &format!("job:{}", w.job_id())))
                .key(self.key(partition, &format!("runs:{}", w.job_id())));
        }
        invocation.arg(self.pfx(partition)).arg(self.channel());
        // The records as they will be written, to answer with once the script says ok.
        let mut written = Vec::with_capacity(writes.len());
        for w in writes {
            let (kind, mut job, expected) = match w {
                JobWrite::Create(job) => ("c", job, None),
                JobWrite::Update {
                    job,
                    expected_version,
                } => ("u", job, Some(expected_version)),
            };
            job.version = expected.map_or(1, |v| v + 1);
            if job.paused {
                // A paused job has no pending member, whatever the record carried.
                job.next_fire = None;
            }
            let (due, jit) = arm_args(job.next_fire);
            invocation
                .arg(kind)
                .arg(&job.spec.id)
                .arg(expected.map(|v| v.to_string()).unwrap_or_default())
                .arg(encode_job(&job)?)
                .arg(if job.paused { "1" } else { "0" })
                .arg(due)
                .arg(jit);
            written.push((job, expected));
        }
        let mut c = self.conn().await?;
        let r: Vec<String> = invocation.invoke_async(&mut c).await.map_err(unavailable)?;
        if r.len() != written.len() * 2 {
            return Err(corrupt(format!(
                "apply_jobs answered {} fields for {} writes",
                r.len(),
                written.len()
            )));
        }
        Ok(written
            .into_iter()
            .zip(r.chunks(2))
            .map(|((job, expected), answer)| {
                let id = job.spec.id.clone();
                match answer[0].as_str() {
                    "ok" => Ok(job),
                    "exists" => Err(Error::JobExists(id)),
                    "notfound" => Err(Error::JobNotFound(id)),
                    "conflict" => Err(Error::VersionConflict {
                        job_id: id,
                        expected: expected.unwrap_or(0),
                        current: answer[1].parse().unwrap_or(0),
                    }),
                    other => Err(corrupt(format!("apply_jobs answered {other:?} for {id:?}"))),
                }
            })
            .collect())
    }

    async fn delete_job(&self, job_id: &str) -> Result<()> {
        let p = self.part(job_id);
        let mut c = self.conn().await?;
        let removed: i64 = self
            .inner
            .scripts
            .delete_job
            .key(self.key(p, &format!("job:{job_id}")))
            .key(self.key(p, "pending"))
            .key(self.key(p, "jobs"))
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
        // One call per partition, sent together (pipelined on the shared connection).
        let reads = by_partition.iter().map(|(p, ids)| self.read_jobs(*p, ids));
        let found = futures::future::try_join_all(reads).await?;
        Ok(found.into_iter().flatten().collect())
    }

    async fn list_jobs(
        &self,
        cursor: Option<&str>,
        prefix: &str,
        limit: usize,
    ) -> Result<Page<JobRecord>> {
        // Cursor: "<partition>:<last job id>" — jobs are listed partition by partition,
        // by id within one; a prefix is a lexical range of each partition's ids (ids
        // are ASCII below DEL, so every id that starts with it sorts before
        // prefix + DEL).
        let (mut p, mut after) = match cursor {
            None => (0, String::new()),
            Some(c) => match c
                .split_once(':')
                .and_then(|(p, id)| Some((p.parse::<u32>().ok()?, id)))
            {
                Some((p, id))
                    if p < self.inner.partitions
                        && (id.is_empty() || crate::model::valid_job_id(id)) =>
                {
                    (p, id.to_owned())
                }
                _ => return Err(Error::BadCursor(c.to_owned())),
            },
        };
        let limit = limit.max(1);
        let mut items = Vec::new();
        let mut c = self.conn().await?;
        let max = if prefix.is_empty() {
            "+".to_owned()
        } else {
            format!("({prefix}\u{7f}")
        };
        while p < self.inner.partitions && items.len() < limit {
            let min = if !after.is_empty() && after.as_str() >= prefix {
                format!("({after}")
            } else if !prefix.is_empty() {
                format!("[{prefix}")
            } else {
                "-".to_owned()
            };
            let want = limit - items.len();
            let ids: Vec<String> = redis::cmd("ZRANGEBYLEX")
                .arg(self.key(p, "jobs"))
                .arg(min)
                .arg(&max)
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

    fn job_cursor_after(&self, job_id: &str) -> String {
        format!("{}:{job_id}", self.part(job_id))
    }

    async fn due_fires(&self, partition: u32, limit: usize) -> Result<DueBatch> {
        let mut c = self.conn().await?;
        let (now, rows, next): (String, Vec<String>, Option<String>) = self
            .inner
            .scripts
            .due_fires
            .key(self.key(partition, "pending"))
            .key(self.key(partition, "claimer"))
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

    async fn upcoming_fires(
        &self,
        partition: u32,
        after: Millis,
        by: Millis,
        limit: usize,
    ) -> Result<Vec<DueFire>> {
        let mut c = self.conn().await?;
        let rows: Vec<(String, String)> = redis::cmd("ZRANGEBYSCORE")
            .arg(self.key(partition, "pending"))
            .arg(format!("({after}"))
            .arg(by)
            .arg("WITHSCORES")
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut c)
            .await
            .map_err(unavailable)?;
        rows.iter()
            .map(|(member, due)| {
                let (version, jit, job_id) = split_member(member)?;
                let due = parse_i64(due)?;
                Ok(DueFire {
                    job_id: job_id.to_owned(),
                    due,
                    planned: due - jit,
                    version,
                })
            })
            .collect()
    }

    async fn claim_fires(&self, partition: u32, claims: Vec<FireClaim>) -> Result<ClaimOutcome> {
        let mut inv = self.inner.scripts.claim_fires.prepare_invoke();
        inv.key(self.key(partition, "pending"))
            .key(self.key(partition, "triggers"));
        for claim in &claims {
            inv.key(self.key(partition, &format!("job:{}", claim.job_id)));
        }
        inv.arg(self.pfx(partition))
            .arg(self.channel())
            .arg(claims.len());
        for claim in &claims {
            debug_assert_eq!(self.part(&claim.job_id), partition);
            let next_due = claim.next.map(|a| a.due.to_string()).unwrap_or_default();
            inv.arg(&claim.job_id)
                .arg(claim.expected_due)
                .arg(claim.expected_version)
                .arg(claim.expected_due - claim.expected_planned)
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
        let mut inv = self
            .inner
            .scripts
            .enqueue_manual
            .key(self.key(p, &format!("job:{}", trigger.job_id)));
        inv.key(self.key(p, "triggers"));
        if let Some(k) = idempotency_key.filter(|k| !k.is_empty()) {
            inv.key(self.key(p, &format!("idem:{}:{k}", trigger.job_id)));
        }
        let r: Vec<String> = inv
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
}

impl RedisStore {
    async fn write_one(&self, write: JobWrite) -> Result<JobRecord> {
        let p = self.part(write.job_id());
        self.apply_jobs(p, vec![write])
            .await?
            .pop()
            .unwrap_or_else(|| Err(corrupt("apply_jobs answered no write")))
    }
}
