//! Runs and leases in Redis: recording and listing runs, the run state machine (one
//! Lua script per decision, sharing `lua/runlib.lua`), progress and logs.

use super::node_slots::{Reserved, reservation_hold};
use super::*;
use crate::store::{BeginOn, Finish, LogBatch, positions_by_job};

#[async_trait]
impl RunStore for RedisStore {
    async fn record_run(&self, run: RunRecord) -> Result<Recorded> {
        let p = self.part(&run.job_id);
        let mut inv = self.inner.scripts.record_run.prepare_invoke();
        self.declare_begin_keys(&mut inv, p, &run);
        inv.arg(self.pfx(p))
            .arg(self.run_nodes_arg())
            .arg(&run.job_id)
            .arg(&run.schedule_id)
            .arg(encode_run(&run)?)
            .arg(run.scheduled_at)
            .arg(ms(self.inner.opts.run_retention))
            .arg(self.inner.opts.max_runs_per_job.max(1));
        let mut c = self.conn().await?;
        let (created, record): (i64, Vec<u8>) =
            inv.invoke_declaring(&mut c).await.map_err(unavailable)?;
        Ok(Recorded {
            run: decode_run(&record)?,
            created: created == 1,
        })
    }

    async fn get_run(&self, schedule_id: &str) -> Result<Option<RunRecord>> {
        let Some((job_id, _)) = split_schedule_id(schedule_id) else {
            return Ok(None);
        };
        let p = self.part(job_id);
        let mut c = self.conn().await?;
        let record: Option<Vec<u8>> = c
            .get(self.key(p, &format!("run:{schedule_id}")))
            .await
            .map_err(unavailable)?;
        let Some(mut run) = record.as_deref().map(decode_run).transpose()? else {
            return Ok(None);
        };
        self.read_outcomes(p, std::slice::from_mut(&mut run))
            .await?;
        Ok(Some(run))
    }

    async fn list_runs(&self, job_id: &str, query: RunQuery) -> Result<Page<RunRecord>> {
        // Keyset paging. Cursor: "<scheduled_at>:<schedule_id>" of the last run handed
        // out; the next page starts strictly after it in (score desc, member desc)
        // order, so runs recorded meanwhile never repeat or shift a listing.
        let p = self.part(job_id);
        let index = self.key(p, &format!("runs:{job_id}"));
        let limit = query.limit.max(1);
        let min = query
            .from
            .map_or_else(|| "-inf".to_owned(), |f| f.to_string());
        let mut c = self.conn().await?;
        let (max, skip) = match query.cursor.as_deref().and_then(|c| c.split_once(':')) {
            Some((score, member)) => {
                let score = parse_i64(score)?;
                let ties: Vec<String> = c
                    .zrevrangebyscore(&index, score, score)
                    .await
                    .map_err(unavailable)?;
                let skip = ties.iter().filter(|m| m.as_str() >= member).count();
                (score.to_string(), skip)
            }
            None => (
                query
                    .to
                    .map_or_else(|| "+inf".to_owned(), |t| format!("({t}")),
                0,
            ),
        };
        let rows: Vec<(String, i64)> = redis::cmd("ZREVRANGEBYSCORE")
            .arg(&index)
            .arg(max)
            .arg(min)
            .arg("WITHSCORES")
            .arg("LIMIT")
            .arg(skip)
            .arg(limit)
            .query_async(&mut c)
            .await
            .map_err(unavailable)?;
        let next_cursor = match rows.last() {
            Some((member, score)) if rows.len() == limit => Some(format!("{score}:{member}")),
            _ => None,
        };
        if rows.is_empty() {
            return Ok(Page {
                items: Vec::new(),
                next_cursor,
            });
        }
        let keys: Vec<String> = rows
            .iter()
            .map(|(id, _)| self.key(p, &format!("run:{id}")))
            .collect();
        let records: Vec<Option<Vec<u8>>> = redis::cmd("MGET")
            .arg(&keys)
            .query_async(&mut c)
            .await
            .map_err(unavailable)?;
        // Records past their retention are gone while their index entry lingers
        // until record_run sweeps it: skip them.
        let mut items = records
            .iter()
            .flatten()
            .map(|r| decode_run(r))
            .collect::<Result<Vec<RunRecord>>>()?;
        self.read_outcomes(p, &mut items).await?;
        Ok(Page { items, next_cursor })
    }

    async fn begin_run(&self, run: RunRecord, route_grace: Duration) -> Result<Begun> {
        let mut inv = self.begin_invocation(&self.inner.scripts.begin_run, &run, route_grace)?;
        let mut c = self.conn().await?;
        let r: Vec<Vec<u8>> = inv.invoke_declaring(&mut c).await.map_err(unavailable)?;
        let [created, record, hint, rest @ ..] = r.as_slice() else {
            return Err(corrupt(format!("begin_run answered {} fields", r.len())));
        };
        self.keep_index_hint(&run.job_id, text(hint)?);
        let begun = Begun {
            run: decode_run(record)?,
            created: created.as_slice() == b"1",
            revoked: revocations(rest)?,
        };
        self.release_revoked(&begun.revoked).await;
        Ok(begun)
    }

    async fn begin_and_assign(
        &self,
        run: RunRecord,
        route_grace: Duration,
        node: &NodeSlot,
        terms: LeaseTerms,
    ) -> Result<(Begun, Option<Assigned>)> {
        let reserved = self.reserve_for(node, &run.schedule_id, &terms).await?;
        let mut inv =
            self.begin_invocation(&self.inner.scripts.begin_and_assign, &run, route_grace)?;
        inv.arg(&node.node_id)
            .arg(lease_max(node, reserved))
            .arg(ms(terms.ttl))
            .arg(ms(terms.confirm_within));
        let mut c = self.conn().await?;
        let r: Vec<Vec<u8>> = inv.invoke_declaring(&mut c).await.map_err(unavailable)?;
        self.begun_and_assigned(&run.job_id, node, reserved, &r)
            .await
    }

    async fn begin_and_assign_many(
        &self,
        items: Vec<BeginOn>,
        terms: LeaseTerms,
    ) -> Result<Vec<(Begun, Option<Assigned>)>> {
        let mut out: Vec<Option<(Begun, Option<Assigned>)>> = vec![None; items.len()];
        let records = items
            .iter()
            .map(|i| encode_run(&i.run))
            .collect::<Result<Vec<_>>>()?;
        // In a cluster, each run's node slot reserved before its call (None on one Redis).
        let mut reserved: Vec<Option<Reserved>> = vec![None; items.len()];
        for round in positions_by_job(&items) {
            for &i in &round {
                let item = &items[i];
                reserved[i] = self
                    .reserve_for(&item.node, &item.run.schedule_id, &terms)
                    .await?;
            }
            let runs = round
                .iter()
                .map(|&i| (i, items[i].run.schedule_id.as_str()));
            let answers: Vec<(Vec<usize>, Vec<Vec<Vec<u8>>>)> = self
                .per_partition(
                    &self.inner.scripts.begin_and_assign_many,
                    runs,
                    1,
                    |idx| {
                        if !self.inner.declares {
                            return Vec::new();
                        }
                        let mut keys = Vec::new();
                        for &i in idx {
                            let run = &items[i].run;
                            keys.extend(Self::begin_keys(&run.job_id, &run.schedule_id));
                            keys.extend(self.index_hint_keys(&run.job_id));
                        }
                        keys.sort();
                        keys.dedup();
                        keys
                    },
                    |inv, idx| {
                        inv.arg(self.run_nodes_arg())
                            .arg(ms(terms.ttl))
                            .arg(ms(terms.confirm_within));
                        for &i in idx {
                            let BeginOn {
                                run,
                                route_grace,
                                node,
                            } = &items[i];
                            inv.arg(&run.job_id)
                                .arg(&run.schedule_id)
                                .arg(&records[i])
                                .arg(run.scheduled_at)
                                .arg(ms(self.inner.opts.run_retention))
                                .arg(self.inner.opts.max_runs_per_job)
                                .arg(ms(*route_grace))
                                .arg(&node.node_id)
                                .arg(lease_max(node, reserved[i]));
                        }
                    },
                )
                .await?;
            for (idx, replies) in answers {
                for (i, reply) in idx.into_iter().zip(replies) {
                    let item = &items[i];
                    out[i] = Some(
                        self.begun_and_assigned(&item.run.job_id, &item.node, reserved[i], &reply)
                            .await?,
                    );
                }
            }
        }
        out.into_iter()
            .map(|o| o.ok_or_else(|| corrupt("begin_and_assign_many: a run named no job")))
            .collect()
    }

    async fn assign_run(
        &self,
        schedule_id: &str,
        attempt: u32,
        node: &NodeSlot,
        terms: LeaseTerms,
    ) -> Result<Assigned> {
        let Some((job_id, _)) = split_schedule_id(schedule_id) else {
            return Ok(Assigned::NotWaiting(None));
        };
        let p = self.part(job_id);
        let reserved = self.reserve_for(node, schedule_id, &terms).await?;
        let mut c = self.conn().await?;
        let r: Vec<Vec<u8>> = self
            .inner
            .scripts
            .assign_run
            .prepare_invoke()
            .keys(self.inner.declares.then(|| {
                [
                    self.key(p, "timers"),
                    self.key(p, "tokens"),
                    self.key(p, &format!("run:{schedule_id}")),
                ]
            }))
            .arg(self.pfx(p))
            .arg(self.run_nodes_arg())
            .arg(schedule_id)
            .arg(attempt)
            .arg(&node.node_id)
            .arg(lease_max(node, reserved))
            .arg(ms(terms.ttl))
            .arg(ms(terms.confirm_within))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        let granted = matches!(r.first(), Some(ok) if ok.as_slice() == b"ok");
        if reserved == Some(Reserved::Ok) && !granted {
            self.release_slots([(node.node_id.as_str(), schedule_id)])
                .await;
        }
        match r.as_slice() {
            [ok, record] if ok.as_slice() == b"ok" => Ok(Assigned::Granted(decode_run(record)?)),
            [full] if full.as_slice() == b"full" => Ok(Assigned::NodeFull),
            [nw, record] if nw.as_slice() == b"not_waiting" => {
                Ok(Assigned::NotWaiting(if record.is_empty() {
                    None
                } else {
                    Some(decode_run(record)?)
                }))
            }
            _ => Err(corrupt(format!("assign_run answered {} fields", r.len()))),
        }
    }

    async fn fan_out(
        &self,
        schedule_id: &str,
        attempt: u32,
        shards: u32,
        route_grace: Duration,
    ) -> Result<FannedOut> {
        let Some((job_id, _)) = split_schedule_id(schedule_id) else {
            return Ok(FannedOut::NotWaiting(None));
        };
        let p = self.part(job_id);
        let mut inv = self.inner.scripts.fan_out.prepare_invoke();
        inv.key(self.key(p, "timers"))
            .key(self.key(p, "tokens"))
            .key(self.key(p, &format!("run:{schedule_id}")));
        for i in 0..shards {
            inv.key(self.key(p, &format!("run:{schedule_id}#{i}")));
        }
        let mut c = self.conn().await?;
        let r: Vec<Vec<u8>> = inv
            .arg(self.pfx(p))
            .arg(self.run_nodes_arg())
            .arg(schedule_id)
            .arg(attempt)
            .arg(shards)
            .arg(ms(route_grace))
            .arg(ms(self.inner.opts.run_retention))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        match r.as_slice() {
            [yes, _, parent, shards @ ..] if yes.as_slice() == b"yes" => Ok(FannedOut::Shards {
                parent: decode_run(parent)?,
                shards: shards
                    .iter()
                    .map(|s| decode_run(s))
                    .collect::<Result<_>>()?,
            }),
            [_, _, record] => Ok(FannedOut::NotWaiting(if record.is_empty() {
                None
            } else {
                Some(decode_run(record)?)
            })),
            _ => Err(corrupt(format!("fan_out answered {} fields", r.len()))),
        }
    }

    async fn mark_started(&self, schedule_id: &str, holder: &Holder) -> Result<Transition> {
        let script = &self.inner.scripts.mark_started;
        let [run, shard] = Self::held_keys(schedule_id);
        let keys = ["timers".to_owned(), run, shard];
        let args = [holder.node_id.clone(), holder.token.to_string()];
        self.run_transition(script, schedule_id, &keys, &args).await
    }

    async fn mark_started_many(&self, reports: &[(String, Holder)]) -> Result<Vec<Applied>> {
        let mut out = vec![Applied::No(UNKNOWN_RUN.to_owned()); reports.len()];
        let runs = reports.iter().map(|(sid, _)| sid.as_str()).enumerate();
        let answers: Vec<(Vec<usize>, Vec<String>)> = self
            .per_partition(
                &self.inner.scripts.mark_started_many,
                runs,
                2,
                |idx| {
                    if !self.inner.declares {
                        return Vec::new();
                    }
                    let mut keys = vec!["timers".to_owned()];
                    for &i in idx {
                        keys.extend(Self::held_keys(&reports[i].0));
                    }
                    keys
                },
                |inv, idx| {
                    for &i in idx {
                        let (schedule_id, holder) = &reports[i];
                        inv.arg(schedule_id)
                            .arg(&holder.node_id)
                            .arg(holder.token.to_string());
                    }
                },
            )
            .await?;
        for (idx, r) in answers {
            for (&i, answer) in idx.iter().zip(r.chunks(2)) {
                out[i] = match answer[0].as_str() {
                    "yes" => Applied::Yes,
                    "already" => Applied::Already,
                    _ => Applied::No(answer[1].clone()),
                };
            }
        }
        Ok(out)
    }

    async fn take_back_unconfirmed(
        &self,
        schedule_id: &str,
        holder: &Holder,
    ) -> Result<Transition> {
        let script = &self.inner.scripts.take_back_unconfirmed;
        let [run, shard] = Self::held_keys(schedule_id);
        let keys = ["timers".to_owned(), "tokens".to_owned(), run, shard];
        let args = [holder.node_id.clone(), holder.token.to_string()];
        self.run_transition(script, schedule_id, &keys, &args).await
    }

    async fn renew_leases(
        &self,
        node_id: &str,
        held: &[Held],
        ttl: Duration,
    ) -> Result<Vec<Option<i64>>> {
        let mut out = vec![None; held.len()];
        // One script call per partition the held runs live in.
        let by_part = self.positions_by_partition(held.iter().map(|h| h.schedule_id.as_str()));
        if self.inner.shared.is_cluster() {
            // The node's reservations first, so they outlast the leases renewed below.
            // A failure does not hold the renewals back (losing the leases would
            // re-run the runs): the reservations last two TTLs, several renewals.
            let sids: Vec<&str> = held.iter().map(|h| h.schedule_id.as_str()).collect();
            if let Err(e) = self.extend_slots(node_id, &sids, ttl * 2).await {
                tracing::warn!(node_id, error = %e, "extending node reservations failed");
            }
        }
        let mut c = self.conn().await?;
        for (p, idx) in by_part {
            let mut inv = self.inner.scripts.renew_leases.prepare_invoke();
            inv.key(self.key(p, "timers"));
            for &i in &idx {
                for key in Self::held_keys(&held[i].schedule_id) {
                    inv.key(self.key(p, &key));
                }
            }
            inv.arg(self.pfx(p)).arg(node_id).arg(ms(ttl));
            for &i in &idx {
                inv.arg(&held[i].schedule_id).arg(held[i].token.to_string());
            }
            let r: Vec<i64> = inv.invoke_async(&mut c).await.map_err(unavailable)?;
            for (&i, remaining) in idx.iter().zip(r) {
                out[i] = (remaining >= 0).then_some(remaining);
            }
        }
        Ok(out)
    }

    async fn finish_run(
        &self,
        schedule_id: &str,
        by: Finisher,
        outcome: Outcome,
    ) -> Result<Transition> {
        let (args, holder) = finish_args(by, outcome)?;
        let script = &self.inner.scripts.finish_run;
        let keys = self.run_keys(schedule_id);
        let t = self
            .run_transition(script, schedule_id, &keys, &args)
            .await?;
        self.release_finished([(holder.as_deref(), schedule_id, &t)])
            .await;
        Ok(t)
    }

    async fn finish_runs(&self, results: Vec<Finish>) -> Result<Vec<Transition>> {
        let mut out: Vec<Transition> = results.iter().map(|_| unknown_run()).collect();
        let encoded = results
            .into_iter()
            .map(|f| {
                let (mut args, holder) = finish_args(f.by, f.outcome)?;
                args.push(
                    f.claim_webhook
                        .map(|d| ms(d).to_string())
                        .unwrap_or_default(),
                );
                Ok((f.schedule_id, (args, holder)))
            })
            .collect::<Result<Vec<_>>>()?;
        let runs = encoded.iter().map(|(sid, _)| sid.as_str()).enumerate();
        let answers: Vec<(Vec<usize>, Vec<Vec<Vec<u8>>>)> = self
            .per_partition(
                &self.inner.scripts.finish_runs,
                runs,
                1,
                |idx| {
                    // Each once: the partition's and a job's keys are every run's.
                    let mut seen = std::collections::HashSet::new();
                    idx.iter()
                        .flat_map(|&i| self.run_keys(&encoded[i].0))
                        .filter(|k| seen.insert(k.clone()))
                        .collect()
                },
                |inv, idx| {
                    inv.arg(self.run_nodes_arg());
                    for &i in idx {
                        let (sid, (args, _)) = &encoded[i];
                        inv.arg(sid).arg(args);
                    }
                },
            )
            .await?;
        for (idx, replies) in answers {
            for (i, reply) in idx.into_iter().zip(replies) {
                out[i] = transition(&reply)?;
            }
        }
        let revoked: Vec<_> = out.iter().flat_map(|t| t.revoked.iter().cloned()).collect();
        self.release_revoked(&revoked).await;
        let mut finished = Vec::with_capacity(out.len());
        for ((sid, (_, holder)), t) in encoded.iter().zip(&out) {
            finished.push((holder.as_deref(), sid.as_str(), t));
        }
        self.release_finished(finished).await;
        Ok(out)
    }

    async fn due_runs(&self, partition: u32, limit: usize) -> Result<Vec<String>> {
        Ok(self.poll_due_runs(partition, limit).await?.ids)
    }

    async fn poll_due_runs(&self, partition: u32, limit: usize) -> Result<DueEntries> {
        self.due_entries(&self.inner.scripts.due_runs, "timers", partition, limit)
            .await
    }

    async fn expire_run(&self, schedule_id: &str, route_grace: Duration) -> Result<Transition> {
        let script = &self.inner.scripts.expire_run;
        self.run_transition(
            script,
            schedule_id,
            &self.run_keys(schedule_id),
            &[ms(route_grace).to_string()],
        )
        .await
    }

    async fn cancel_run(&self, schedule_id: &str, reason: &str) -> Result<Transition> {
        let script = &self.inner.scripts.cancel_run;
        self.run_transition(
            script,
            schedule_id,
            &self.run_keys(schedule_id),
            &[reason.to_owned()],
        )
        .await
    }

    async fn report_progress(
        &self,
        schedule_id: &str,
        holder: &Holder,
        percent: u32,
        message: &str,
    ) -> Result<Applied> {
        let Some((job_id, _)) = split_schedule_id(schedule_id) else {
            return Ok(Applied::No(UNKNOWN_RUN.to_owned()));
        };
        let p = self.part(job_id);
        let mut c = self.conn().await?;
        let [run, shard] = Self::held_keys(schedule_id);
        let refused: String = self
            .inner
            .scripts
            .report_progress
            .key(self.key(p, "timers"))
            .key(self.key(p, &run))
            .key(self.key(p, &shard))
            .arg(self.pfx(p))
            .arg(schedule_id)
            .arg(&holder.node_id)
            .arg(holder.token.to_string())
            .arg(percent)
            .arg(message)
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        Ok(applied_unless(refused))
    }

    async fn append_logs(
        &self,
        schedule_id: &str,
        holder: &Holder,
        lines: Vec<LogLine>,
        max_bytes: usize,
    ) -> Result<Applied> {
        let Some((job_id, _)) = split_schedule_id(schedule_id) else {
            return Ok(Applied::No(UNKNOWN_RUN.to_owned()));
        };
        if lines.is_empty() {
            return Ok(Applied::Yes);
        }
        let p = self.part(job_id);
        let mut inv = self.inner.scripts.append_logs.prepare_invoke();
        for key in Self::held_keys(schedule_id)
            .iter()
            .chain(&Self::log_keys(schedule_id))
        {
            inv.key(self.key(p, key));
        }
        inv.arg(self.pfx(p))
            .arg(schedule_id)
            .arg(&holder.node_id)
            .arg(holder.token.to_string())
            .arg(max_bytes)
            .arg(LOG_LINE_COST);
        for l in &lines {
            inv.arg(serde_json::to_string(l).map_err(corrupt)?);
        }
        let mut c = self.conn().await?;
        let refused: String = inv.invoke_async(&mut c).await.map_err(unavailable)?;
        Ok(applied_unless(refused))
    }

    async fn append_logs_many(
        &self,
        batches: Vec<LogBatch>,
        max_bytes: usize,
    ) -> Result<Vec<Applied>> {
        // Nothing to store is vacuously stored, whoever asks (as `append_logs`); a run
        // in no call is unknown.
        let mut out: Vec<Applied> = batches
            .iter()
            .map(|b| {
                if b.lines.is_empty() {
                    Applied::Yes
                } else {
                    Applied::No(UNKNOWN_RUN.to_owned())
                }
            })
            .collect();
        let encoded = batches
            .iter()
            .map(|b| {
                b.lines
                    .iter()
                    .map(|l| serde_json::to_string(l).map_err(corrupt))
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        let runs = batches
            .iter()
            .enumerate()
            .filter(|(_, b)| !b.lines.is_empty())
            .map(|(i, b)| (i, b.schedule_id.as_str()));
        let answers: Vec<(Vec<usize>, Vec<String>)> = self
            .per_partition(
                &self.inner.scripts.append_logs_many,
                runs,
                1,
                |idx| {
                    let mut keys = Vec::new();
                    for &i in idx {
                        keys.extend(Self::held_keys(&batches[i].schedule_id));
                        keys.extend(Self::log_keys(&batches[i].schedule_id));
                    }
                    keys
                },
                |inv, idx| {
                    inv.arg(max_bytes).arg(LOG_LINE_COST);
                    for &i in idx {
                        let b = &batches[i];
                        inv.arg(&b.schedule_id)
                            .arg(&b.holder.node_id)
                            .arg(b.holder.token.to_string())
                            .arg(encoded[i].len())
                            .arg(&encoded[i]);
                    }
                },
            )
            .await?;
        for (idx, refusals) in answers {
            for (i, refused) in idx.into_iter().zip(refusals) {
                out[i] = applied_unless(refused);
            }
        }
        Ok(out)
    }

    async fn read_logs(&self, schedule_id: &str, after: u64, limit: usize) -> Result<Vec<LogLine>> {
        let Some((job_id, _)) = split_schedule_id(schedule_id) else {
            return Ok(Vec::new());
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        let key = self.key(self.part(job_id), &format!("logs:{schedule_id}"));
        let mut c = self.conn().await?;
        // Sequence numbers are contiguous within the list, so the first line's seq
        // says where `after` sits.
        let first: Option<String> = c.lindex(&key, 0).await.map_err(unavailable)?;
        let Some(first) = first else {
            return Ok(Vec::new());
        };
        let first: LogLine = serde_json::from_str(&first).map_err(corrupt)?;
        let start = isize::try_from(after.saturating_sub(first.seq.saturating_sub(1)))
            .unwrap_or(isize::MAX);
        let stop = start.saturating_add(isize::try_from(limit).unwrap_or(isize::MAX) - 1);
        let rows: Vec<String> = c.lrange(&key, start, stop).await.map_err(unavailable)?;
        rows.iter()
            .map(|j| serde_json::from_str(j).map_err(corrupt))
            .filter(|l: &Result<LogLine>| l.as_ref().map_or(true, |l| l.seq > after))
            .collect()
    }
}

/// The `max` a lease script is given: the node's window on one Redis (the script
/// counts); in a cluster 0 (no count: reserved) or -1 (not reserved: the node is full).
fn lease_max(node: &NodeSlot, reserved: Option<Reserved>) -> i64 {
    match reserved {
        None => i64::from(node.max_concurrency),
        Some(Reserved::Ok) => 0,
        Some(Reserved::Full | Reserved::Taken) => -1,
    }
}

/// A script's answer that is empty when it applied the report, else the reason.
fn applied_unless(refused: String) -> Applied {
    if refused.is_empty() {
        Applied::Yes
    } else {
        Applied::No(refused)
    }
}

impl RedisStore {
    /// In a cluster, the node's slot reserved for the run before a script leases it
    /// (`node_slots`); None on one Redis, where the script counts.
    async fn reserve_for(
        &self,
        node: &NodeSlot,
        schedule_id: &str,
        terms: &LeaseTerms,
    ) -> Result<Option<Reserved>> {
        if !self.inner.shared.is_cluster() {
            return Ok(None);
        }
        let hold = reservation_hold(terms);
        Ok(Some(self.reserve_slot(node, schedule_id, hold).await?))
    }

    /// What a `begin_and_assign` reply `r` (of either script) says for a run of
    /// `job_id` asked of `node`: the begun run and the assignment tried; the leases its
    /// begin revoked and, in a cluster, the node's slot reserved for a lease not
    /// granted are given back.
    async fn begun_and_assigned(
        &self,
        job_id: &str,
        node: &NodeSlot,
        reserved: Option<Reserved>,
        r: &[Vec<u8>],
    ) -> Result<(Begun, Option<Assigned>)> {
        let [created, record, leased, hint, rest @ ..] = r else {
            return Err(corrupt(format!(
                "begin_and_assign answered {} fields",
                r.len()
            )));
        };
        self.keep_index_hint(job_id, text(hint)?);
        let run = decode_run(record)?;
        let assigned = match text(leased)? {
            "" => None,
            "ok" => Some(Assigned::Granted(run.clone())),
            "full" => Some(Assigned::NodeFull),
            other => return Err(corrupt(format!("begin_and_assign leased {other:?}"))),
        };
        let begun = Begun {
            run,
            created: created.as_slice() == b"1",
            revoked: revocations(rest)?,
        };
        self.release_revoked(&begun.revoked).await;
        if reserved == Some(Reserved::Ok) && !matches!(assigned, Some(Assigned::Granted(_))) {
            self.release_slots([(node.node_id.as_str(), begun.run.schedule_id.as_str())])
                .await;
        }
        Ok((begun, assigned))
    }

    /// begin_run's arguments (see `lua/begin_run.lua`), which begin_and_assign's start
    /// with.
    /// The keys (under the partition's prefix) beginning run `sid` of job `job_id` may
    /// touch that the call can name: the run's record, the job's hash, its active
    /// runs, serial queue and index, the timers, the tokens and the outbox's due set.
    /// (The job's active runs a policy other than allow looks at, and the index's
    /// oldest entries, are asked for by the script: `Call::invoke_declaring`.)
    fn begin_keys(job_id: &str, sid: &str) -> [String; 8] {
        [
            format!("run:{sid}"),
            format!("job:{job_id}"),
            format!("active:{job_id}"),
            format!("serial:{job_id}"),
            format!("runs:{job_id}"),
            "timers".to_owned(),
            "tokens".to_owned(),
            "outbox_due".to_owned(),
        ]
    }

    /// The index entries the last begin of `job_id` named for the next one.
    fn index_hint(&self, job_id: &str) -> Vec<String> {
        let hints = self
            .inner
            .index_hints
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        hints.get(job_id).cloned().unwrap_or_default()
    }

    /// The keys (under the partition's prefix) of the index entries the last begin of
    /// `job_id` named for the next one (`index_hint`): their records, logs and
    /// webhook entries.
    fn index_hint_keys(&self, job_id: &str) -> Vec<String> {
        let mut keys = Vec::new();
        for sid in self.index_hint(job_id) {
            keys.extend([
                format!("run:{sid}"),
                format!("logs:{sid}"),
                format!("logmeta:{sid}"),
                format!("delivery:{sid}"),
            ]);
        }
        keys
    }

    /// Keeps what a begin of `job_id` named for the next one (space-separated
    /// schedule_ids; none: forgets the job's), for at most `INDEX_HINTS` jobs.
    fn keep_index_hint(&self, job_id: &str, hint: &str) {
        if !self.inner.declares {
            // Calls that declare nothing ask for nothing: no script names a hint.
            return;
        }
        let mut hints = self
            .inner
            .index_hints
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if hint.is_empty() {
            hints.remove(job_id);
            return;
        }
        if hints.len() >= INDEX_HINTS && !hints.contains_key(job_id) {
            hints.clear();
        }
        hints.insert(
            job_id.to_owned(),
            hint.split(' ').map(str::to_owned).collect(),
        );
    }

    /// How many calls were answered with keys to declare and made again (a round trip
    /// each; see `Call::invoke_declaring`) since the store connected.
    pub fn calls_asking_for_keys(&self) -> u64 {
        self.inner.scripts.library.asked()
    }

    /// Declares what beginning (or recording) `run` may touch that the call can name:
    /// [`Self::begin_keys`] and the job's index hint (nothing when calls declare nothing).
    fn declare_begin_keys(&self, inv: &mut Call<'_>, p: u32, run: &RunRecord) {
        if !self.inner.declares {
            return;
        }
        for key in Self::begin_keys(&run.job_id, &run.schedule_id) {
            inv.key(self.key(p, &key));
        }
        for key in self.index_hint_keys(&run.job_id) {
            inv.key(self.key(p, &key));
        }
    }

    fn begin_invocation<'a>(
        &self,
        script: &'a Function,
        run: &RunRecord,
        route_grace: Duration,
    ) -> Result<Call<'a>> {
        let p = self.part(&run.job_id);
        let mut inv = script.prepare_invoke();
        self.declare_begin_keys(&mut inv, p, run);
        inv.arg(self.pfx(p))
            .arg(self.run_nodes_arg())
            .arg(&run.job_id)
            .arg(&run.schedule_id)
            .arg(encode_run(run)?)
            .arg(run.scheduled_at)
            .arg(ms(self.inner.opts.run_retention))
            .arg(self.inner.opts.max_runs_per_job)
            .arg(ms(route_grace));
        Ok(inv)
    }
}

/// `finish_run`'s arguments after the schedule_id ('holder' | 'waiting', the token or
/// the attempt, the outcome, the holder's node or ''), and the holder's node.
fn finish_args(by: Finisher, outcome: Outcome) -> Result<(Vec<String>, Option<String>)> {
    let json = serde_json::to_string(&OutcomeJson::from(outcome)).map_err(corrupt)?;
    let (by, value, node) = match by {
        Finisher::Holder(h) => ("holder", h.token.to_string(), Some(h.node_id)),
        Finisher::Waiting { attempt } => ("waiting", attempt.to_string(), None),
    };
    let args = vec![by.to_owned(), value, json, node.clone().unwrap_or_default()];
    Ok((args, node))
}

impl RedisStore {
    /// Lays the webhook outcomes their outbox entries keep over the runs of partition `p`
    /// whose record says their webhook is pending (`overlay_outcome`): one pipelined
    /// read, none when no run waits on its webhook.
    async fn read_outcomes(&self, p: u32, runs: &mut [RunRecord]) -> Result<()> {
        let pending: Vec<usize> = (0..runs.len())
            .filter(|&i| runs[i].callback_state == CallbackState::Pending)
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for &i in &pending {
            pipe.cmd("HMGET")
                .arg(self.key(p, &format!("delivery:{}", runs[i].schedule_id)))
                .arg(&OUTCOME_FIELDS[..]);
        }
        let mut c = self.conn().await?;
        let outcomes: Vec<Vec<Option<Vec<u8>>>> =
            pipe.query_async(&mut c).await.map_err(unavailable)?;
        for (i, fields) in pending.into_iter().zip(outcomes) {
            overlay_outcome(&mut runs[i], &fields)?;
        }
        Ok(())
    }
}
