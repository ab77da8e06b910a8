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
        self.due_entries(&self.inner.scripts.due_deliveries, partition, limit)
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
        let mut c = self.conn().await?;
        let r: Vec<String> = self
            .inner
            .scripts
            .claim_delivery
            .arg(self.pfx(self.part(job_id)))
            .arg(schedule_id)
            .arg(ms(lease))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        match r.as_slice() {
            [] => Ok(None),
            [job_id, url, body, attempts, created_at, token, now] => Ok(Some(WebhookDelivery {
                schedule_id: schedule_id.to_owned(),
                job_id: job_id.clone(),
                url: url.clone(),
                body: body.clone(),
                attempts: attempts.parse().map_err(corrupt)?,
                created_at: parse_i64(created_at)?,
                token: token.parse().map_err(corrupt)?,
                now: parse_i64(now)?,
            })),
            other => Err(corrupt(format!("claim_delivery answered {other:?}"))),
        }
    }

    async fn finish_delivery(
        &self,
        schedule_id: &str,
        token: u64,
        outcome: DeliveryOutcome,
    ) -> Result<Applied> {
        let Some((job_id, _)) = split_schedule_id(schedule_id) else {
            return Ok(Applied::No("unknown delivery".to_owned()));
        };
        let (kind, status, error, at): (&str, u16, String, i64) = match outcome {
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
        };
        let mut c = self.conn().await?;
        let r: Vec<String> = self
            .inner
            .scripts
            .finish_delivery
            .arg(self.pfx(self.part(job_id)))
            .arg(schedule_id)
            .arg(token.to_string())
            .arg(kind)
            .arg(status)
            .arg(error)
            .arg(at)
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        match r.as_slice() {
            [yes, _] if yes == "yes" => Ok(Applied::Yes),
            [_, reason] => Ok(Applied::No(reason.clone())),
            other => Err(corrupt(format!("finish_delivery answered {other:?}"))),
        }
    }

    async fn admit_delivery(
        &self,
        destination: &str,
        holder: &str,
        terms: &DeliveryTerms,
    ) -> Result<Admission> {
        let mut c = self.conn().await?;
        let (verdict, n): (String, String) = self
            .inner
            .scripts
            .admit_delivery
            .arg(self.breakers_prefix())
            .arg(destination)
            .arg(holder)
            .arg(terms.limit.max(1))
            .arg(ms(terms.lease).max(1))
            .arg(ms(terms.probe))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        match verdict.as_str() {
            "go" => Ok(Admission::Go),
            "probe" => Ok(Admission::Probe),
            "open" => Ok(Admission::Open {
                until: parse_i64(&n)?,
            }),
            "full" => Ok(Admission::Full {
                window: n
                    .parse()
                    .map_err(|e| corrupt(format!("window {n:?}: {e}")))?,
            }),
            other => Err(corrupt(format!("admit_delivery answered {other:?}"))),
        }
    }

    async fn settle_delivery(
        &self,
        destination: &str,
        holder: &str,
        answered: Option<bool>,
        terms: &DeliveryTerms,
    ) -> Result<Option<BreakerUpdate>> {
        let mut c = self.conn().await?;
        let r: Vec<String> = self
            .inner
            .scripts
            .settle_delivery
            .arg(self.breakers_prefix())
            .arg(destination)
            .arg(holder)
            .arg(match answered {
                Some(true) => "1",
                Some(false) => "0",
                None => "",
            })
            .arg(terms.threshold.max(1))
            .arg(ms(terms.cool_down))
            .arg(terms.limit.max(1))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        match r.as_slice() {
            [] => Ok(None),
            [state, until, changed] => Ok(Some(BreakerUpdate {
                state: breaker(state, until)?,
                changed: changed == "1",
            })),
            other => Err(corrupt(format!("settle_delivery answered {other:?}"))),
        }
    }
}
