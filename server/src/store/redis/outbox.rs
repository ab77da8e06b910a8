//! The webhook outbox and the circuit breakers in Redis: due deliveries, their claims
//! and outcomes under the delivery token, and the per-destination breakers.

use super::*;

#[async_trait]
impl Outbox for RedisStore {
    async fn due_deliveries(&self, partition: u32, limit: usize) -> Result<Vec<String>> {
        Ok(self.poll_due_deliveries(partition, limit).await?.ids)
    }

    async fn poll_due_deliveries(&self, partition: u32, limit: usize) -> Result<DueEntries> {
        if limit == 0 {
            return Ok(DueEntries::default());
        }
        self.due_entries(
            &self.inner.scripts.due_deliveries,
            "outbox_due",
            partition,
            limit,
        )
        .await
    }

    async fn claim_delivery(
        &self,
        schedule_id: &str,
        lease: Duration,
    ) -> Result<Option<WebhookDelivery>> {
        let Some((job_id, _)) = split_schedule_id(schedule_id) else {
            return Ok(None);
        };
        Ok(self
            .claim_in_partition(self.part(job_id), &[schedule_id], lease)
            .await?
            .pop())
    }

    async fn claim_deliveries(
        &self,
        schedule_ids: &[String],
        lease: Duration,
    ) -> Result<Vec<WebhookDelivery>> {
        let mut by_partition: std::collections::BTreeMap<u32, Vec<&str>> = Default::default();
        for sid in schedule_ids {
            if let Some((job_id, _)) = split_schedule_id(sid) {
                by_partition.entry(self.part(job_id)).or_default().push(sid);
            }
        }
        // One call per partition, sent together (pipelined on the shared connection).
        let claims = by_partition
            .iter()
            .map(|(p, sids)| self.claim_in_partition(*p, sids, lease));
        let claimed: Vec<WebhookDelivery> = futures::future::try_join_all(claims)
            .await?
            .into_iter()
            .flatten()
            .collect();
        // In the order asked (an entry asked twice: where it was first asked).
        let mut order: std::collections::HashMap<&str, usize> = Default::default();
        for (i, sid) in schedule_ids.iter().enumerate() {
            order.entry(sid.as_str()).or_insert(i);
        }
        let mut claimed = claimed;
        claimed.sort_by_key(|d| order.get(d.schedule_id.as_str()).copied());
        Ok(claimed)
    }

    async fn finish_delivery(
        &self,
        schedule_id: &str,
        token: u64,
        outcome: DeliveryOutcome,
    ) -> Result<Applied> {
        let result = DeliveryResult {
            schedule_id: schedule_id.to_owned(),
            token,
            outcome,
        };
        self.finish_deliveries(vec![result])
            .await?
            .pop()
            .ok_or_else(|| corrupt("finish_deliveries answered nothing"))
    }

    async fn finish_deliveries(&self, results: Vec<DeliveryResult>) -> Result<Vec<Applied>> {
        let n = results.len();
        let mut by_partition: std::collections::BTreeMap<u32, Vec<(usize, DeliveryResult)>> =
            Default::default();
        let mut out: Vec<Option<Applied>> = vec![None; n];
        for (i, r) in results.into_iter().enumerate() {
            match split_schedule_id(&r.schedule_id) {
                Some((job_id, _)) => by_partition
                    .entry(self.part(job_id))
                    .or_default()
                    .push((i, r)),
                None => out[i] = Some(Applied::No("unknown delivery".to_owned())),
            }
        }
        // One call per partition, sent together (pipelined on the shared connection).
        let calls = by_partition
            .into_iter()
            .map(|(p, results)| self.finish_in_partition(p, results));
        for (i, a) in futures::future::try_join_all(calls)
            .await?
            .into_iter()
            .flatten()
        {
            out[i] = Some(a);
        }
        Ok(out
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Applied::No("unknown delivery".to_owned())))
            .collect())
    }

    async fn admit_delivery(
        &self,
        destination: &str,
        holder: &str,
        terms: &DeliveryTerms,
    ) -> Result<Admission> {
        Ok(self
            .admit_delivery_clean(destination, holder, terms)
            .await?
            .admission)
    }

    async fn admit_delivery_clean(
        &self,
        destination: &str,
        holder: &str,
        terms: &DeliveryTerms,
    ) -> Result<CleanAdmission> {
        let b = self.breakers_prefix();
        let mut c = self.conn().await?;
        let (verdict, n): (String, String) = self
            .inner
            .scripts
            .admit_delivery
            .key(format!("{b}breaker:{destination}"))
            .key(format!("{b}pace:{destination}"))
            .key(format!("{b}wait:{destination}"))
            .arg(&b)
            .arg(destination)
            .arg(holder)
            .arg(terms.limit.max(1))
            .arg(ms(terms.lease).max(1))
            .arg(ms(terms.probe))
            .arg(ms(WAITING_MARK))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        Ok(CleanAdmission {
            admission: admission(&verdict, &n)?,
            clean: verdict == "go" && n == "1",
        })
    }

    async fn settle_deliveries(
        &self,
        requests: Vec<SettleRequest>,
    ) -> Result<Vec<Option<BreakerUpdate>>> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let b = self.breakers_prefix();
        let mut call = self.inner.scripts.settle_deliveries.prepare_invoke();
        call.arg(&b);
        for r in &requests {
            call.key(format!("{b}breaker:{}", r.destination))
                .key(format!("{b}pace:{}", r.destination));
            call.arg(&r.destination)
                .arg(&r.holder)
                .arg(answered_arg(r.answered))
                .arg(r.terms.threshold.max(1))
                .arg(ms(r.terms.cool_down))
                .arg(r.terms.limit.max(1));
        }
        let mut c = self.conn().await?;
        let rows: Vec<Vec<String>> = call.invoke_async(&mut c).await.map_err(unavailable)?;
        answered_for("settle_deliveries", rows.len(), requests.len())?;
        rows.into_iter().map(settled).collect()
    }

    async fn end_waiting(&self, destination: &str, owner: &str) -> Result<()> {
        let key = format!("{}wait:{destination}", self.breakers_prefix());
        let mut c = self.conn().await?;
        let _: i64 = c.zrem(key, owner).await.map_err(unavailable)?;
        Ok(())
    }

    async fn settle_delivery(
        &self,
        destination: &str,
        holder: &str,
        answered: Option<bool>,
        terms: &DeliveryTerms,
    ) -> Result<Option<BreakerUpdate>> {
        let request = SettleRequest {
            destination: destination.to_owned(),
            holder: holder.to_owned(),
            answered,
            terms: *terms,
        };
        self.settle_deliveries(vec![request])
            .await?
            .pop()
            .ok_or_else(|| corrupt("settle_deliveries answered nothing"))
    }
}

impl RedisStore {
    /// `claim_deliveries` of entries of partition `p`, in one call.
    async fn claim_in_partition(
        &self,
        p: u32,
        schedule_ids: &[&str],
        lease: Duration,
    ) -> Result<Vec<WebhookDelivery>> {
        let pfx = self.pfx(p);
        let mut call = self.inner.scripts.claim_deliveries.prepare_invoke();
        call.key(format!("{pfx}outbox_due"));
        for sid in schedule_ids {
            call.key(format!("{pfx}delivery:{sid}"))
                .key(format!("{pfx}outbox:{sid}"));
        }
        call.arg(&pfx).arg(ms(lease));
        for sid in schedule_ids {
            call.arg(*sid);
        }
        let mut c = self.conn().await?;
        let reply: Vec<Value> = call.invoke_async(&mut c).await.map_err(unavailable)?;
        // Its clock, then a row per entry.
        answered_for("claim_deliveries", reply.len(), schedule_ids.len() + 1)?;
        let mut rows = reply.into_iter();
        let now: String = rows
            .next()
            .map(redis::from_redis_value)
            .transpose()
            .map_err(corrupt)?
            .unwrap_or_default();
        let now = parse_i64(&now)?;
        let mut claimed = Vec::new();
        for (sid, row) in schedule_ids.iter().zip(rows) {
            let row: Vec<String> = redis::from_redis_value(row).map_err(corrupt)?;
            match row.as_slice() {
                [] => {}
                [job_id, url, body, attempts, created_at, token] => claimed.push(WebhookDelivery {
                    schedule_id: (*sid).to_owned(),
                    job_id: job_id.clone(),
                    url: url.clone(),
                    body: body.clone(),
                    attempts: attempts.parse().map_err(corrupt)?,
                    created_at: parse_i64(created_at)?,
                    token: token.parse().map_err(corrupt)?,
                    now,
                }),
                other => return Err(corrupt(format!("claim_deliveries answered {other:?}"))),
            }
        }
        Ok(claimed)
    }
}

impl RedisStore {
    /// `finish_deliveries` of outcomes of partition `p` (with their place in the
    /// caller's order), in one call.
    async fn finish_in_partition(
        &self,
        p: u32,
        results: Vec<(usize, DeliveryResult)>,
    ) -> Result<Vec<(usize, Applied)>> {
        let pfx = self.pfx(p);
        let mut call = self.inner.scripts.finish_deliveries.prepare_invoke();
        call.key(format!("{pfx}outbox_due"));
        call.arg(&pfx);
        let mut order = Vec::with_capacity(results.len());
        for (i, r) in results {
            let sid = &r.schedule_id;
            call.key(format!("{pfx}delivery:{sid}"))
                .key(format!("{pfx}outbox:{sid}"))
                .key(format!("{pfx}run:{sid}"));
            let (kind, status, error, at) = outcome_args(r.outcome);
            call.arg(sid)
                .arg(r.token.to_string())
                .arg(kind)
                .arg(status)
                .arg(error)
                .arg(at);
            order.push(i);
        }
        let mut c = self.conn().await?;
        let rows: Vec<Vec<String>> = call.invoke_async(&mut c).await.map_err(unavailable)?;
        answered_for("finish_deliveries", rows.len(), order.len())?;
        order
            .into_iter()
            .zip(rows)
            .map(|(i, r)| Ok((i, applied(r)?)))
            .collect()
    }
}

/// A delivery outcome as the scripts take it: kind, status, error, at (retry: the
/// delay in ms; defer: when it is due again).
fn outcome_args(outcome: DeliveryOutcome) -> (&'static str, u16, String, i64) {
    match outcome {
        DeliveryOutcome::Delivered { status } => ("delivered", status, String::new(), 0),
        DeliveryOutcome::Retry {
            after,
            status,
            error,
        } => ("retry", status, error, crate::model::duration_ms(after)),
        DeliveryOutcome::Failed { status, error } => ("failed", status, error, 0),
        DeliveryOutcome::Gone => ("gone", 410, GONE_ERROR.to_owned(), 0),
        DeliveryOutcome::Abandon { error } => ("abandon", 0, error, 0),
        DeliveryOutcome::Defer { until } => ("defer", 0, String::new(), until),
    }
}

/// A finish script's answer for one outcome: {applied, reason}.
fn applied(r: Vec<String>) -> Result<Applied> {
    match r.as_slice() {
        [yes, _] if yes == "yes" => Ok(Applied::Yes),
        [_, reason] => Ok(Applied::No(reason.clone())),
        other => Err(corrupt(format!("finish_delivery answered {other:?}"))),
    }
}

/// An admit script's answer for one delivery: {verdict, n}.
fn admission(verdict: &str, n: &str) -> Result<Admission> {
    match verdict {
        "go" => Ok(Admission::Go),
        "probe" => Ok(Admission::Probe),
        "open" => Ok(Admission::Open {
            until: parse_i64(n)?,
        }),
        "full" => Ok(Admission::Full {
            window: n
                .parse()
                .map_err(|e| corrupt(format!("window {n:?}: {e}")))?,
        }),
        other => Err(corrupt(format!("admit_delivery answered {other:?}"))),
    }
}

/// `answered` as the settle scripts take it.
fn answered_arg(answered: Option<bool>) -> &'static str {
    match answered {
        Some(true) => "1",
        Some(false) => "0",
        None => "",
    }
}

/// A settle script's answer for one delivery: {} or {state, until, changed}.
fn settled(r: Vec<String>) -> Result<Option<BreakerUpdate>> {
    match r.as_slice() {
        [] => Ok(None),
        [state, until, changed] => Ok(Some(BreakerUpdate {
            state: breaker(state, until)?,
            changed: changed == "1",
        })),
        other => Err(corrupt(format!("settle_delivery answered {other:?}"))),
    }
}

/// A batch script answered one row per item asked (`got` of `asked`), else its reply
/// is corrupt.
fn answered_for(script: &str, got: usize, asked: usize) -> Result<()> {
    if got == asked {
        Ok(())
    } else {
        Err(corrupt(format!(
            "{script} answered {got} rows for {asked} items"
        )))
    }
}
