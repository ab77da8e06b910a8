//! The webhook outbox and the circuit breakers: due deliveries, their claims and
//! outcomes (under the delivery token), and the per-destination breaker state.

use super::*;

#[async_trait]
impl Outbox for EmbeddedStore {
    async fn due_deliveries(&self, partition: u32, limit: usize) -> Result<Vec<String>> {
        self.blocking(move |inner| {
            due_in_partition(
                &inner.db,
                OUTBOX_DUE,
                partition,
                limit,
                "scan webhook outbox",
            )
        })
        .await
    }

    async fn claim_delivery(
        &self,
        schedule_id: &str,
        lease: Duration,
    ) -> Result<Option<WebhookDelivery>> {
        let schedule_id = schedule_id.to_owned();
        self.write(move |_, b| {
            let schedule_id = schedule_id.as_str();
            let t = b.runs()?;
            let Some(mut entry) = t.load_outbox(schedule_id)? else {
                return Ok(None);
            };
            if entry.due > t.now {
                return Ok(None);
            }
            let old_due = entry.due;
            // Tokens only grow: max(last + 1, store time in µs), as fencing tokens do.
            entry.token = entry.token.saturating_add(1).max(t.now_us);
            entry.in_flight = true;
            entry.due = t.now.saturating_add(duration_ms(lease));
            t.put_outbox(schedule_id, &entry, Some(old_due))?;
            Ok(Some(WebhookDelivery {
                schedule_id: schedule_id.to_owned(),
                job_id: entry.job_id,
                url: entry.url,
                body: entry.body,
                attempts: entry.attempts,
                created_at: entry.created_at,
                token: entry.token,
                now: t.now,
            }))
        })
        .await
    }

    async fn finish_delivery(
        &self,
        schedule_id: &str,
        token: u64,
        outcome: DeliveryOutcome,
    ) -> Result<Applied> {
        let schedule_id = schedule_id.to_owned();
        self.write(move |_, b| {
            let schedule_id = schedule_id.as_str();
            let t = b.runs()?;
            let Some(mut entry) = t.load_outbox(schedule_id)? else {
                return Ok(Applied::No("unknown delivery".to_owned()));
            };
            if entry.token != token || !entry.in_flight {
                return Ok(Applied::No("stale delivery token".to_owned()));
            }
            let old_due = entry.due;
            let now = t.now;
            let (status, error) = match &outcome {
                DeliveryOutcome::Defer { until } => {
                    entry.in_flight = false;
                    entry.due = now.max(*until);
                    t.put_outbox(schedule_id, &entry, Some(old_due))?;
                    return Ok(Applied::Yes);
                }
                DeliveryOutcome::Delivered { status } => (*status, String::new()),
                DeliveryOutcome::Retry { status, error, .. }
                | DeliveryOutcome::Failed { status, error } => (*status, error.clone()),
                DeliveryOutcome::Gone => (410, crate::store::GONE_ERROR.to_owned()),
                DeliveryOutcome::Abandon { error } => (0, error.clone()),
            };
            if !matches!(outcome, DeliveryOutcome::Abandon { .. }) {
                entry.attempts = entry.attempts.saturating_add(1);
            }
            let mut run = t.load(schedule_id)?;
            if let Some(run) = run.as_mut() {
                run.callback_attempts = entry.attempts;
                run.callback_status = status;
                run.callback_error = error;
            }
            match outcome {
                DeliveryOutcome::Retry { after, .. } => {
                    entry.in_flight = false;
                    entry.due = now.saturating_add(duration_ms(after));
                    t.put_outbox(schedule_id, &entry, Some(old_due))?;
                }
                done => {
                    t.remove_outbox(schedule_id, &entry)?;
                    if let Some(run) = run.as_mut() {
                        run.callback_state = if matches!(done, DeliveryOutcome::Delivered { .. }) {
                            CallbackState::Done
                        } else {
                            CallbackState::Failed
                        };
                    }
                }
            }
            if let Some(run) = run {
                t.save(&run)?;
            }
            Ok(Applied::Yes)
        })
        .await
    }

    async fn breaker_state(&self, destination: &str, probe: Duration) -> Result<BreakerState> {
        // A destination that never failed (the common case) has no breaker record: the
        // answer is Closed, read without a turn of the writer.
        if !self.has_breaker(destination).await? {
            return Ok(BreakerState::Closed);
        }
        let destination = destination.to_owned();
        self.write(move |_, b| {
            let txn = b.txn();
            let destination = destination.as_str();
            let now = now_ms();
            let mut table = txn.open_table(BREAKERS).ctx("open webhook breakers")?;
            let mut b: Breaker = match table.get(destination).ctx("read breaker")? {
                Some(g) => decode("breaker", destination, g.value())?,
                None => return Ok(BreakerState::Closed),
            };
            if b.state == "closed" {
                return Ok(BreakerState::Closed);
            }
            if b.until > now {
                // Open, or half open with another caller's probe under way.
                return Ok(BreakerState::Open { until: b.until });
            }
            b.state = "half_open".to_owned();
            b.until = now.saturating_add(duration_ms(probe));
            let json = encode("breaker", &b)?;
            table
                .insert(destination, json.as_str())
                .ctx("write breaker")?;
            Ok(BreakerState::HalfOpen)
        })
        .await
    }

    async fn record_breaker(
        &self,
        destination: &str,
        success: bool,
        threshold: u32,
        cool_down: Duration,
    ) -> Result<BreakerUpdate> {
        // A success on a closed breaker with no failures counted changes nothing: no
        // record, nothing to write.
        if success && !self.has_breaker(destination).await? {
            return Ok(BreakerUpdate {
                state: BreakerState::Closed,
                changed: false,
            });
        }
        let destination = destination.to_owned();
        self.write(move |_, b| {
            let txn = b.txn();
            let destination = destination.as_str();
            let now = now_ms();
            let mut table = txn.open_table(BREAKERS).ctx("open webhook breakers")?;
            let mut b: Breaker = match table.get(destination).ctx("read breaker")? {
                Some(g) => decode("breaker", destination, g.value())?,
                None => Breaker {
                    state: "closed".to_owned(),
                    ..Breaker::default()
                },
            };
            if success {
                table.remove(destination).ctx("delete breaker")?;
                return Ok(BreakerUpdate {
                    state: BreakerState::Closed,
                    changed: b.state != "closed",
                });
            }
            if b.state == "open" {
                return Ok(BreakerUpdate {
                    state: BreakerState::Open { until: b.until },
                    changed: false,
                });
            }
            b.failures = b.failures.saturating_add(1);
            let opens = b.state == "half_open" || b.failures >= threshold;
            if opens {
                b.state = "open".to_owned();
                b.until = now.saturating_add(duration_ms(cool_down));
            }
            let json = encode("breaker", &b)?;
            table
                .insert(destination, json.as_str())
                .ctx("write breaker")?;
            Ok(BreakerUpdate {
                state: if opens {
                    BreakerState::Open { until: b.until }
                } else {
                    BreakerState::Closed
                },
                changed: opens,
            })
        })
        .await
    }
}

impl EmbeddedStore {
    /// Whether the destination has a breaker record (it failed since its last
    /// success), by a read transaction. A record written after this read is a
    /// decision taken after the caller's: answering as if it came first is what the
    /// writer would have done had the caller's step been queued before it.
    async fn has_breaker(&self, destination: &str) -> Result<bool> {
        let destination = destination.to_owned();
        self.blocking(move |inner| {
            let txn = read(&inner.db)?;
            let table = txn.open_table(BREAKERS).ctx("open webhook breakers")?;
            Ok(table
                .get(destination.as_str())
                .ctx("read breaker")?
                .is_some())
        })
        .await
    }
}
