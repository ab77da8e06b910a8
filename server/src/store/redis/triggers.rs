//! `TriggerQueue` in Redis: the per-partition trigger streams with the consumer group
//! `dispatch` (read, reclaim, ack, trim by age) and the instance beats (a zset of beat
//! ends on the store clock) that let a live instance take a dead one's triggers.
//!
//! On one Redis a consumer reads every partition's stream in one blocking
//! `XREADGROUP`. A cluster refuses a command whose keys lie in several slots, so there
//! each partition's stream is read by a task of its own (`PartitionReaders`), on a
//! connection of its own, and `read_triggers` takes what they read.

use std::collections::{HashMap, VecDeque};
use std::sync::Weak;

use tokio::sync::{Mutex, mpsc};

use super::*;

#[async_trait]
impl TriggerQueue for RedisStore {
    async fn read_triggers(
        &self,
        consumer: &str,
        max: usize,
        block: Duration,
    ) -> Result<Vec<Delivery>> {
        if self.inner.shared.is_cluster() {
            return self.read_from_partition_readers(consumer, max, block).await;
        }
        // COUNT is per stream: each is asked for a share of `max`, so that one read
        // takes about `max` in all (an instance that read a whole burst at once, up to
        // `max` from every partition, left the other instances' executors only what
        // its routing ticks sent them); the streams that gave their whole share are
        // read again, without blocking, while the read is short of `max`.
        let mut parts: Vec<u32> = (0..self.inner.partitions).collect();
        let mut out = Vec::new();
        let mut block = Some(block);
        while !parts.is_empty() && out.len() < max.max(1) {
            let share = ((max.max(1) - out.len()) / parts.len()).max(1);
            let Some(read) = self.read_streams(consumer, &parts, share, block).await? else {
                break;
            };
            block = None;
            parts.clear();
            for (p, ids) in read {
                if ids.len() >= share {
                    parts.push(p);
                }
                out.extend(self.deliveries(p, ids));
            }
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
        let mut r: Vec<String> = self
            .inner
            .scripts
            .beat_instance
            .arg(self.instances_key())
            .arg(instance)
            .arg(ms(ttl))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        if r.is_empty() {
            return Err(corrupt("beat_instance answered nothing"));
        }
        let others: u64 = r.remove(0).parse().map_err(corrupt)?;
        self.inner.route_counters.beat(others);
        Ok(r)
    }

    fn others_alive(&self) -> bool {
        !self.inner.route_counters.alone()
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
            // The registered nodes are read first, so the script can declare each one's
            // key (none registers to a dead instance meanwhile).
            let nodes = self.nodes_prefix();
            let ids: Vec<String> = c
                .smembers(format!("{nodes}ids"))
                .await
                .map_err(unavailable)?;
            let mut inv = self.inner.scripts.forget_instance.prepare_invoke();
            inv.key(self.instances_key()).key(format!("{nodes}ids"));
            for id in &ids {
                inv.key(format!("{nodes}node:{id}"));
            }
            inv.arg(self.instances_key()).arg(&nodes).arg(dead);
            for id in &ids {
                inv.arg(id);
            }
            let _: i64 = inv.invoke_async(&mut c).await.map_err(unavailable)?;
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
                .key(self.key(p, "triggers"))
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

impl RedisStore {
    /// One `XREADGROUP` of the trigger streams of `parts`, up to `count` entries from
    /// each, blocking up to `block` when given: each stream's entries by partition
    /// (None when the consumer groups were lost and have been made again).
    async fn read_streams(
        &self,
        consumer: &str,
        parts: &[u32],
        count: usize,
        block: Option<Duration>,
    ) -> Result<Option<Vec<(u32, Vec<StreamId>)>>> {
        let keys: Vec<String> = parts.iter().map(|&p| self.key(p, "triggers")).collect();
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(GROUP)
            .arg(consumer)
            .arg("COUNT")
            .arg(count);
        if let Some(block) = block {
            cmd.arg("BLOCK").arg(ms(block));
        }
        cmd.arg("STREAMS").arg(&keys);
        for _ in &keys {
            cmd.arg(">");
        }
        let mut c = self.blocking_conn().await?;
        let reply: redis::RedisResult<Option<StreamReadReply>> = cmd.query_async(&mut c).await;
        let reply = match reply {
            Ok(r) => r,
            Err(e) if is_nogroup(&e) => {
                self.recover_groups().await?;
                return Ok(None);
            }
            Err(e) => return Err(unavailable(e)),
        };
        let mut out = Vec::new();
        for sk in reply.map(|r| r.keys).unwrap_or_default() {
            if let Some(i) = keys.iter().position(|k| *k == sk.key) {
                out.push((parts[i], sk.ids));
            }
        }
        Ok(Some(out))
    }
}

/// How long a partition reader's `XREADGROUP` blocks before it checks whether its
/// store is still in use.
const READER_BLOCK: Duration = Duration::from_secs(2);

/// A consumer's readers in a cluster: one task per partition reading its stream, and
/// what they read that `read_triggers` has not handed out yet.
pub(super) struct PartitionReaders {
    state: Mutex<ReadersState>,
}

struct ReadersState {
    rx: mpsc::Receiver<Vec<Delivery>>,
    ready: VecDeque<Delivery>,
}

/// The consumers' readers of a store, by consumer name.
pub(super) type Readers = std::sync::Mutex<HashMap<String, Arc<PartitionReaders>>>;

impl RedisStore {
    /// `read_triggers` in a cluster: what the consumer's partition readers read,
    /// waiting up to `block` when they have nothing yet. Each reader reads up to
    /// `max` entries at a time and holds one batch until it is taken, so a consumer
    /// holds at most about a batch per partition unacknowledged ahead of its work.
    async fn read_from_partition_readers(
        &self,
        consumer: &str,
        max: usize,
        block: Duration,
    ) -> Result<Vec<Delivery>> {
        let readers = self.partition_readers(consumer, max.max(1));
        let mut state = readers.state.lock().await;
        let ReadersState { rx, ready } = &mut *state;
        if ready.is_empty()
            && !block.is_zero()
            && let Ok(Some(batch)) = tokio::time::timeout(block, rx.recv()).await
        {
            ready.extend(batch);
        }
        while ready.len() < max {
            match rx.try_recv() {
                Ok(batch) => ready.extend(batch),
                Err(_) => break,
            }
        }
        let n = ready.len().min(max.max(1));
        Ok(ready.drain(..n).collect())
    }

    /// The consumer's readers, started at its first read.
    fn partition_readers(&self, consumer: &str, count: usize) -> Arc<PartitionReaders> {
        let mut readers = self
            .inner
            .readers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(r) = readers.get(consumer) {
            return r.clone();
        }
        let (tx, rx) = mpsc::channel(1);
        for p in 0..self.inner.partitions {
            tokio::spawn(read_partition(
                Arc::downgrade(&self.inner),
                p,
                consumer.to_owned(),
                count,
                tx.clone(),
            ));
        }
        let r = Arc::new(PartitionReaders {
            state: Mutex::new(ReadersState {
                rx,
                ready: VecDeque::new(),
            }),
        });
        readers.insert(consumer.to_owned(), r.clone());
        r
    }
}

/// One partition's reader: blocking reads of its stream on a connection of its own,
/// each batch handed on; ends when the store is dropped.
async fn read_partition(
    inner: Weak<Inner>,
    p: u32,
    consumer: String,
    count: usize,
    tx: mpsc::Sender<Vec<Delivery>>,
) {
    let mut conn = None;
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(store) = inner.upgrade().map(|inner| RedisStore { inner }) else {
            return;
        };
        let stop = store.inner.watcher.clone();
        if conn.is_none() {
            conn = store.inner.blocking.dedicated().await.ok();
        }
        let Some(c) = conn.as_mut() else {
            drop(store);
            if !back_off(&stop, &mut backoff).await {
                return;
            }
            continue;
        };
        let key = store.key(p, "triggers");
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(GROUP)
            .arg(&consumer)
            .arg("COUNT")
            .arg(count)
            .arg("BLOCK")
            .arg(ms(READER_BLOCK))
            .arg("STREAMS")
            .arg(&key)
            .arg(">");
        let reply: redis::RedisResult<Option<StreamReadReply>> = tokio::select! {
            () = stop.cancelled() => return,
            r = cmd.query_async(c) => r,
        };
        match reply {
            Ok(reply) => {
                backoff = Duration::from_millis(100);
                let ids = reply
                    .map(|r| r.keys)
                    .unwrap_or_default()
                    .into_iter()
                    .flat_map(|k| k.ids)
                    .collect::<Vec<_>>();
                let batch = store.deliveries(p, ids);
                drop(store);
                if !batch.is_empty() && tx.send(batch).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                if is_nogroup(&e) {
                    let _ = store.recover_groups().await;
                } else {
                    tracing::warn!(partition = p, error = %e, "reading triggers failed; retrying");
                    conn = None;
                }
                drop(store);
                if !back_off(&stop, &mut backoff).await {
                    return;
                }
            }
        }
    }
}
