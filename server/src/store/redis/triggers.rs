//! `TriggerQueue` in Redis: the per-partition trigger streams with the consumer group
//! `dispatch` (read, reclaim, ack, trim by age) and the instance beats (a zset of beat
//! ends on the store clock) that let a live instance take a dead one's triggers.

use super::*;

#[async_trait]
impl TriggerQueue for RedisStore {
    async fn read_triggers(
        &self,
        consumer: &str,
        max: usize,
        block: Duration,
    ) -> Result<Vec<Delivery>> {
        let keys: Vec<String> = (0..self.inner.partitions)
            .map(|p| self.key(p, "triggers"))
            .collect();
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(GROUP)
            .arg(consumer)
            .arg("COUNT")
            .arg(max.max(1))
            .arg("BLOCK")
            .arg(ms(block))
            .arg("STREAMS")
            .arg(&keys);
        for _ in &keys {
            cmd.arg(">");
        }
        let mut c = self.blocking_conn().await?;
        let reply: redis::RedisResult<Option<StreamReadReply>> = cmd.query_async(&mut c).await;
        let reply = match reply {
            Ok(r) => r,
            Err(e) if is_nogroup(&e) => {
                self.recover_groups().await?;
                return Ok(Vec::new());
            }
            Err(e) => return Err(unavailable(e)),
        };
        let mut out = Vec::new();
        for sk in reply.map(|r| r.keys).unwrap_or_default() {
            let Some(p) = keys.iter().position(|k| *k == sk.key) else {
                continue;
            };
            out.extend(self.deliveries(p as u32, sk.ids));
        }
        Ok(out)
    }

    async fn reclaim_triggers(
        &self,
        consumer: &str,
        min_idle: Duration,
        max: usize,
    ) -> Result<Vec<Delivery>> {
        let mut out = Vec::new();
        let mut c = self.conn().await?;
        for p in 0..self.inner.partitions {
            if out.len() >= max {
                break;
            }
            let reply: redis::RedisResult<StreamAutoClaimReply> = redis::cmd("XAUTOCLAIM")
                .arg(self.key(p, "triggers"))
                .arg(GROUP)
                .arg(consumer)
                .arg(u64::try_from(min_idle.as_millis()).unwrap_or(u64::MAX))
                .arg("0-0")
                .arg("COUNT")
                .arg(max - out.len())
                .query_async(&mut c)
                .await;
            match reply {
                Ok(r) => out.extend(self.deliveries(p, r.claimed)),
                Err(e) if is_nogroup(&e) => {
                    drop(c);
                    self.recover_groups().await?;
                    return Ok(out);
                }
                Err(e) => return Err(unavailable(e)),
            }
        }
        Ok(out)
    }

    async fn beat_instance(&self, instance: &str, ttl: Duration) -> Result<Vec<String>> {
        let mut c = self.conn().await?;
        self.inner
            .scripts
            .beat_instance
            .arg(self.instances_key())
            .arg(instance)
            .arg(ms(ttl))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)
    }

    /// `XPENDING` of the dead consumer, then `XCLAIM` of those entries, per partition.
    /// Runs only after an instance died, so its cost does not matter.
    async fn take_over_triggers(
        &self,
        dead: &str,
        consumer: &str,
        max: usize,
    ) -> Result<Vec<Delivery>> {
        let mut out = Vec::new();
        let mut c = self.conn().await?;
        let mut more = false;
        for p in 0..self.inner.partitions {
            let room = max.saturating_sub(out.len());
            if room == 0 {
                more = true;
                break;
            }
            let key = self.key(p, "triggers");
            let pending: redis::RedisResult<StreamPendingCountReply> = redis::cmd("XPENDING")
                .arg(&key)
                .arg(GROUP)
                .arg("-")
                .arg("+")
                .arg(room)
                .arg(dead)
                .query_async(&mut c)
                .await;
            let pending = match pending {
                Ok(r) => r,
                Err(e) if is_nogroup(&e) => continue,
                Err(e) => return Err(unavailable(e)),
            };
            if pending.ids.is_empty() {
                continue;
            }
            more |= pending.ids.len() == room;
            let mut claim = redis::cmd("XCLAIM");
            claim.arg(&key).arg(GROUP).arg(consumer).arg(0);
            for id in &pending.ids {
                claim.arg(&id.id);
            }
            let claimed: StreamClaimReply = claim.query_async(&mut c).await.map_err(unavailable)?;
            out.extend(self.deliveries(p, claimed.ids));
        }
        if !more {
            let _: i64 = self
                .inner
                .scripts
                .forget_instance
                .arg(self.instances_key())
                .arg(self.nodes_prefix())
                .arg(dead)
                .invoke_async(&mut c)
                .await
                .map_err(unavailable)?;
        }
        Ok(out)
    }

    /// One `XACK` per partition, sent together.
    async fn ack_triggers(&self, entry_ids: &[String]) -> Result<()> {
        let mut by_partition: std::collections::BTreeMap<u32, Vec<&str>> = Default::default();
        for entry_id in entry_ids {
            let (p, id) = split_entry(entry_id)?;
            by_partition.entry(p).or_default().push(id);
        }
        let c = self.conn().await?;
        let acks = by_partition.into_iter().map(|(p, ids)| {
            let mut c = c.clone();
            let key = self.key(p, "triggers");
            async move {
                let r: redis::RedisResult<i64> = c.xack(key, GROUP, &ids).await;
                match r {
                    Ok(_) => Ok(()),
                    // The group vanished with a Redis restart: nothing is pending any more.
                    Err(e) if is_nogroup(&e) => Ok(()),
                    Err(e) => Err(unavailable(e)),
                }
            }
        });
        futures::future::try_join_all(acks).await?;
        Ok(())
    }

    async fn trim_triggers(&self, older_than: Millis) -> Result<()> {
        let mut c = self.conn().await?;
        for p in 0..self.inner.partitions {
            let r: redis::RedisResult<i64> = self
                .inner
                .scripts
                .trim_triggers
                .arg(self.pfx(p))
                .arg(GROUP)
                .arg(older_than.max(0))
                .invoke_async(&mut c)
                .await;
            match r {
                Ok(_) => {}
                Err(e) if is_nogroup(&e) => {}
                Err(e) => return Err(unavailable(e)),
            }
        }
        Ok(())
    }
}
