//! The audit log in redb: events by seq in one table, appended and trimmed in one step
//! of the shared write transaction.

use super::*;

#[async_trait]
impl AuditLog for EmbeddedStore {
    async fn append_audit(&self, mut event: AuditEvent, keep: usize) -> Result<()> {
        self.write(move |_, b| {
            let txn = b.txn();
            let mut table = txn.open_table(AUDIT).ctx("open audit log")?;
            let last = table.last().ctx("read audit log")?.map(|(k, _)| k.value());
            event.seq = last.unwrap_or(0) + 1;
            event.time_ms = now_ms();
            let json = encode("audit event", &event)?;
            table
                .insert(event.seq, json.as_str())
                .ctx("write audit event")?;
            let keep = u64::try_from(keep.max(1)).unwrap_or(u64::MAX);
            let cutoff = event.seq.saturating_sub(keep);
            loop {
                let first = table.first().ctx("read audit log")?.map(|(k, _)| k.value());
                match first {
                    Some(first) if first <= cutoff => {
                        table.remove(first).ctx("trim audit log")?;
                    }
                    _ => break,
                }
            }
            Ok(())
        })
        .await
    }

    async fn list_audit(&self, before: Option<u64>, limit: usize) -> Result<Vec<AuditEvent>> {
        self.blocking(move |inner| {
            let txn = read(&inner.db)?;
            let table = txn.open_table(AUDIT).ctx("open audit log")?;
            let mut out = Vec::new();
            for item in table
                .range(..before.unwrap_or(u64::MAX))
                .ctx("scan audit log")?
                .rev()
                .take(limit.max(1))
            {
                let (k, v) = item.ctx("scan audit log")?;
                out.push(decode("audit event", &k.value().to_string(), v.value())?);
            }
            Ok(out)
        })
        .await
    }
}
