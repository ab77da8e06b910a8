//! The audit log in Redis: a sorted set of events by seq under `{audit}` (one slot),
//! appended and trimmed by `append_audit.lua` in one step.

use super::*;

impl RedisStore {
    fn audit_keys(&self) -> (String, String) {
        let p = &self.inner.prefix;
        (
            format!("{p}:{{audit}}:events"),
            format!("{p}:{{audit}}:seq"),
        )
    }
}

#[async_trait]
impl AuditLog for RedisStore {
    async fn append_audit(&self, event: AuditEvent, keep: usize) -> Result<()> {
        let (events, seq) = self.audit_keys();
        let json = serde_json::to_string(&event).map_err(corrupt)?;
        let mut c = self.conn().await?;
        let _: u64 = self
            .inner
            .scripts
            .append_audit
            .key(events)
            .key(seq)
            .arg(json)
            .arg(keep.max(1))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn list_audit(&self, before: Option<u64>, limit: usize) -> Result<Vec<AuditEvent>> {
        let (events, _) = self.audit_keys();
        let max = before.map_or_else(|| "+inf".to_owned(), |b| format!("({b}"));
        let mut c = self.conn().await?;
        let rows: Vec<String> = redis::cmd("ZREVRANGEBYSCORE")
            .arg(events)
            .arg(max)
            .arg("-inf")
            .arg("LIMIT")
            .arg(0)
            .arg(limit.max(1))
            .query_async(&mut c)
            .await
            .map_err(unavailable)?;
        rows.iter()
            .map(|r| serde_json::from_str(r).map_err(corrupt))
            .collect()
    }
}
