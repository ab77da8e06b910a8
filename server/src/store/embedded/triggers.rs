//! `TriggerQueue` in the embedded store: reading, reclaiming and acknowledging
//! triggers (the entries are in the `triggers` table, their delivery state in memory:
//! see [`QueueState`]). One process, so no instance beats and nothing to take over.

use super::*;

#[async_trait]
impl TriggerQueue for EmbeddedStore {
    async fn read_triggers(
        &self,
        _consumer: &str,
        max: usize,
        block: Duration,
    ) -> Result<Vec<Delivery>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        look_until_found(&self.appended, block, || {
            self.blocking(move |i| i.read_once(max))
        })
        .await
    }

    async fn reclaim_triggers(
        &self,
        _consumer: &str,
        min_idle: Duration,
        max: usize,
    ) -> Result<Vec<Delivery>> {
        self.blocking(move |inner| {
            let mut state = inner.queue_state();
            let txn = read(&inner.db)?;
            let now = now_ms();
            let min_idle = duration_ms(min_idle);
            let mut idle: Vec<u64> = state
                .delivered
                .iter()
                .filter(|(_, at)| now.saturating_sub(**at) >= min_idle)
                .map(|(seq, _)| *seq)
                .collect();
            idle.sort_unstable();
            let queue = txn.open_table(TRIGGERS).ctx("open triggers")?;
            let mut out = Vec::new();
            for seq in idle {
                if out.len() >= max {
                    break;
                }
                let entry_id = seq.to_string();
                let json = queue
                    .get(seq)
                    .ctx("read trigger")?
                    .map(|g| g.value().to_owned());
                match json {
                    Some(json) => {
                        let queued: QueuedTrigger = decode("trigger", &entry_id, &json)?;
                        state.delivered.insert(seq, now);
                        out.push(Delivery {
                            entry_id,
                            trigger: queued.trigger,
                        });
                    }
                    // Acked since it was delivered (the ack raced this scan): forget it.
                    None => {
                        state.delivered.remove(&seq);
                    }
                }
            }
            Ok(out)
        })
        .await
    }

    async fn beat_instance(&self, _instance: &str, _ttl: Duration) -> Result<Vec<String>> {
        // One process: no other instance can die holding triggers (this one's own
        // unacknowledged triggers are delivered again when it opens the store).
        Ok(Vec::new())
    }

    async fn take_over_triggers(
        &self,
        _dead: &str,
        _consumer: &str,
        _max: usize,
    ) -> Result<Vec<Delivery>> {
        Ok(Vec::new())
    }

    /// One writer step for all of them.
    async fn ack_triggers(&self, entry_ids: &[String]) -> Result<()> {
        let seqs = entry_ids
            .iter()
            .map(|id| parse_entry_id(id))
            .collect::<Result<Vec<u64>>>()?;
        let written = seqs.clone();
        self.write(move |_, b| {
            let triggers = b.triggers()?;
            for seq in &written {
                triggers.remove(*seq).ctx("delete trigger")?;
            }
            Ok(())
        })
        .await?;
        let mut queue = self.inner.queue_state();
        for seq in &seqs {
            queue.delivered.remove(seq);
        }
        Ok(())
    }

    /// A no-op by design: `ack_trigger` deletes the entry in the same transaction that
    /// acknowledges it, so no acknowledged entry is ever left to trim, and unacknowledged
    /// ones must stay until acked.
    async fn trim_triggers(&self, _older_than: Millis) -> Result<()> {
        Ok(())
    }
}

impl Inner {
    /// Delivers up to `max` never-delivered entries, in sequence order.
    pub(super) fn read_once(&self, max: usize) -> Result<Vec<Delivery>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        // The lock is held across the read so that two concurrent readers cannot both
        // take the same entries past the watermark.
        let mut state = self.queue_state();
        let txn = read(&self.db)?;
        let now = now_ms();
        let queue = txn.open_table(TRIGGERS).ctx("open triggers")?;
        let mut out = Vec::new();
        for item in queue.range(state.next_unread..).ctx("scan triggers")? {
            if out.len() >= max {
                break;
            }
            let (k, v) = item.ctx("scan triggers")?;
            let seq = k.value();
            let entry_id = seq.to_string();
            let queued: QueuedTrigger = decode("trigger", &entry_id, v.value())?;
            out.push((seq, entry_id, queued.trigger));
        }
        let mut deliveries = Vec::with_capacity(out.len());
        for (seq, entry_id, trigger) in out {
            state.delivered.insert(seq, now);
            state.next_unread = seq + 1;
            deliveries.push(Delivery { entry_id, trigger });
        }
        Ok(deliveries)
    }
}
