//! Nodes and inboxes in Redis: the executor node registry (TTL'd records under
//! `{nodes}`), per-instance inboxes, and the per-job round-robin counters.

use super::*;

/// One node's `rec` and `hb` fields, and how many runs are leased to it.
type NodeRow = ((Option<String>, Option<Millis>), u32);

#[async_trait]
impl NodeRegistry for RedisStore {
    async fn register_node(&self, node: NodeRecord, ttl: Duration) -> Result<Registered> {
        self.upsert_node(node, ttl, "register").await
    }

    async fn refresh_node(&self, node: NodeRecord, ttl: Duration) -> Result<Registered> {
        self.upsert_node(node, ttl, "refresh").await
    }

    async fn remove_node(
        &self,
        node: &NodeRecord,
        leases_within: Option<Duration>,
    ) -> Result<NodeRemoved> {
        let mut c = self.conn().await?;
        let nodes = self.nodes_prefix();
        let (removed, leased): (i64, Vec<String>) = {
            let reply: Vec<Value> = self
                .inner
                .scripts
                .remove_node
                .key(format!("{nodes}node:{}", node.node_id))
                .key(format!("{nodes}ids"))
                .key(format!("{nodes}busy:{}", node.node_id))
                .arg(&nodes)
                .arg(&node.node_id)
                .arg(&node.instance)
                .arg(&node.session)
                .invoke_async(&mut c)
                .await
                .map_err(unavailable)?;
            match reply.as_slice() {
                [flag] => (
                    redis::from_redis_value(flag.clone()).map_err(unavailable)?,
                    Vec::new(),
                ),
                [flag, runs] => (
                    redis::from_redis_value(flag.clone()).map_err(unavailable)?,
                    redis::from_redis_value(runs.clone()).map_err(unavailable)?,
                ),
                other => {
                    return Err(Error::Corrupt(format!(
                        "remove_node answered {} values",
                        other.len()
                    )));
                }
            }
        };
        let mut out = NodeRemoved {
            removed: removed == 1,
            leases_shortened: 0,
        };
        let Some(within) = leases_within.filter(|_| out.removed) else {
            return Ok(out);
        };
        // In a cluster the node's runs are counted in a slot of its own (node_slots),
        // and busy:<node> is empty.
        let leased = if self.inner.shared.is_cluster() {
            c.zrange(self.held_key(&node.node_id), 0, -1)
                .await
                .map_err(unavailable)?
        } else {
            leased
        };
        // In a cluster the partitions' scripts cannot see the node's registration:
        // it is looked at here (a node that registers again between this and a
        // partition's call has its leases shortened, and renews them at its next
        // heartbeat, well within `within`).
        if self.inner.shared.is_cluster() {
            let back: bool = c
                .exists(format!("{nodes}node:{}", node.node_id))
                .await
                .map_err(unavailable)?;
            if back {
                return Ok(out);
            }
        }
        let run_nodes = self.run_nodes_arg();
        // One script call per partition the leased runs live in.
        let mut by_part: std::collections::BTreeMap<u32, Vec<&str>> = Default::default();
        for sid in &leased {
            if let Some((job_id, _)) = split_schedule_id(sid) {
                by_part.entry(self.part(job_id)).or_default().push(sid);
            }
        }
        for (p, sids) in by_part {
            let mut inv = self.inner.scripts.shorten_leases.prepare_invoke();
            inv.key(self.key(p, "timers"));
            for sid in &sids {
                inv.key(self.key(p, &format!("run:{sid}")));
            }
            inv.arg(self.pfx(p))
                .arg(&run_nodes)
                .arg(&node.node_id)
                .arg(ms(within));
            for sid in sids {
                inv.arg(sid);
            }
            let n: u32 = inv.invoke_async(&mut c).await.map_err(unavailable)?;
            out.leases_shortened += n;
        }
        Ok(out)
    }

    async fn list_nodes(&self, group: Option<&str>) -> Result<Vec<NodeRecord>> {
        let prefix = self.nodes_prefix();
        let mut c = self.conn().await?;
        let mut ids: Vec<String> = c
            .smembers(format!("{prefix}ids"))
            .await
            .map_err(unavailable)?;
        ids.sort();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let cluster = self.inner.shared.is_cluster();
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.cmd("HMGET")
                .arg(format!("{prefix}node:{id}"))
                .arg("rec")
                .arg("hb");
            // A cluster counts in a slot of the node's own (node_slots): read below,
            // so that this pipeline stays in the {nodes} slot.
            if !cluster {
                pipe.cmd("SCARD").arg(format!("{prefix}busy:{id}"));
            }
        }
        let flat: Vec<Value> = pipe.query_async(&mut c).await.map_err(unavailable)?;
        let per_node = if cluster { 1 } else { 2 };
        if flat.len() != ids.len() * per_node {
            return Err(corrupt("list_nodes: an odd reply"));
        }
        let mut rows = flat
            .chunks(per_node)
            .map(|row| {
                let rec = redis::from_redis_value(row[0].clone()).map_err(unavailable)?;
                let leased = row
                    .get(1)
                    .map(|busy| redis::from_redis_value(busy.clone()).map_err(unavailable))
                    .transpose()?;
                Ok((rec, leased.unwrap_or(0)))
            })
            .collect::<Result<Vec<NodeRow>>>()?;
        if cluster {
            let counts = ids.iter().map(|id| {
                let mut c = c.clone();
                let key = self.held_key(id);
                async move { c.zcard::<_, u32>(key).await.map_err(unavailable) }
            });
            let counts = futures::future::try_join_all(counts).await?;
            for (row, n) in rows.iter_mut().zip(counts) {
                row.1 = n;
            }
        }
        let mut out = Vec::new();
        let mut gone = Vec::new();
        for (id, (row, leased)) in ids.iter().zip(rows) {
            match row {
                (Some(j), hb) => {
                    let mut node: NodeRecord = serde_json::from_str(&j).map_err(corrupt)?;
                    node.last_heartbeat = hb.unwrap_or(node.last_heartbeat);
                    node.leased = leased;
                    if group.is_none_or(|g| node.group == g) {
                        out.push(node);
                    }
                }
                (None, _) => gone.push(id.clone()),
            }
        }
        if !gone.is_empty() {
            // Expired records leave their id behind; forget it (a node that came
            // back meanwhile re-adds its id in the same script that writes it).
            let _: i64 = c
                .srem(format!("{prefix}ids"), &gone)
                .await
                .map_err(unavailable)?;
        }
        Ok(out)
    }

    async fn next_route_counter(&self, job_id: &str) -> Result<u64> {
        if let Some(n) = self.inner.route_counters.next_local(job_id) {
            return Ok(n);
        }
        let mut c = self.conn().await?;
        let n: i64 = c
            .hincr(self.rr_key(job_id), job_id, 1)
            .await
            .map_err(unavailable)?;
        Ok(turn_of(n))
    }

    async fn next_route_counters(&self, job_ids: &[&str]) -> Result<Vec<u64>> {
        let mut out = Vec::with_capacity(job_ids.len());
        let mut shared = Vec::new();
        for (i, job_id) in job_ids.iter().enumerate() {
            match self.inner.route_counters.next_local(job_id) {
                Some(n) => out.push(n),
                None => {
                    out.push(0);
                    shared.push(i);
                }
            }
        }
        if shared.is_empty() {
            return Ok(out);
        }
        if self.inner.shared.is_cluster() {
            // The counters live in their jobs' slots: one call each, side by side.
            let drawn = futures::future::try_join_all(
                shared.iter().map(|&i| self.next_route_counter(job_ids[i])),
            )
            .await?;
            for (&i, n) in shared.iter().zip(drawn) {
                out[i] = n;
            }
            return Ok(out);
        }
        let mut pipe = redis::pipe();
        for &i in &shared {
            let job_id = job_ids[i];
            pipe.hincr(self.rr_key(job_id), job_id, 1);
        }
        let mut c = self.conn().await?;
        let drawn: Vec<i64> = pipe.query_async(&mut c).await.map_err(unavailable)?;
        if drawn.len() != shared.len() {
            return Err(Error::Corrupt(format!(
                "{} round-robin counters answered for {}",
                drawn.len(),
                shared.len()
            )));
        }
        for (&i, n) in shared.iter().zip(drawn) {
            out[i] = turn_of(n);
        }
        Ok(out)
    }
}

#[async_trait]
impl Inboxes for RedisStore {
    async fn push_inbox(&self, instance: &str, messages: Vec<Vec<u8>>) -> Result<()> {
        if messages.is_empty() {
            return Ok(());
        }
        let key = format!("{}inbox:{instance}", self.nodes_prefix());
        let mut c = self.conn().await?;
        // LPUSH of several values pushes them one after the other: RPOP takes the
        // first given first.
        let _: () = redis::pipe()
            .lpush(&key, messages)
            .ignore()
            .pexpire(&key, 60_000)
            .ignore()
            .query_async(&mut c)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn pop_inbox(&self, instance: &str, max: usize, block: Duration) -> Result<Vec<Vec<u8>>> {
        let key = format!("{}inbox:{instance}", self.nodes_prefix());
        let Some(count) = std::num::NonZeroUsize::new(max) else {
            return Ok(Vec::new());
        };
        let mut c = self.conn().await?;
        let got: Option<Vec<Vec<u8>>> = c.rpop(&key, Some(count)).await.map_err(unavailable)?;
        if let Some(got) = got.filter(|g| !g.is_empty()) {
            return Ok(got);
        }
        if block.is_zero() {
            return Ok(Vec::new());
        }
        // BRPOP blocks its connection: never the shared one.
        let one: Option<(String, Vec<u8>)> = self
            .blocking_conn()
            .await?
            .brpop(&key, block.as_secs_f64())
            .await
            .map_err(unavailable)?;
        let Some((_, first)) = one else {
            return Ok(Vec::new());
        };
        let mut out = vec![first];
        if let Some(more) = std::num::NonZeroUsize::new(max - 1) {
            let rest: Option<Vec<Vec<u8>>> = c.rpop(&key, Some(more)).await.map_err(unavailable)?;
            out.extend(rest.unwrap_or_default());
        }
        Ok(out)
    }
}

impl RedisStore {
    /// One write of a node's registration, `mode` "register" or "refresh" (see
    /// `lua/upsert_node.lua`).
    async fn upsert_node(&self, node: NodeRecord, ttl: Duration, mode: &str) -> Result<Registered> {
        let mut c = self.conn().await?;
        let json = serde_json::to_string(&node).map_err(corrupt)?;
        let nodes = self.nodes_prefix();
        let r: Vec<String> = self
            .inner
            .scripts
            .upsert_node
            .key(format!("{nodes}node:{}", node.node_id))
            .key(format!("{nodes}ids"))
            .key(format!("{nodes}busy:{}", node.node_id))
            .arg(&nodes)
            .arg(&node.node_id)
            .arg(json)
            .arg(&node.instance)
            .arg(ms(ttl))
            .arg(&node.group)
            .arg(&node.session)
            .arg(mode)
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        match r.as_slice() {
            [yes] if yes == "yes" => Ok(Registered::Yes),
            [s] if s == "superseded" => Ok(Registered::Superseded),
            [o, group] if o == "other_group" => Ok(Registered::OtherGroup(group.clone())),
            other => Err(corrupt(format!("upsert_node answered {other:?}"))),
        }
    }
}

impl RedisStore {
    /// The hash of the shared round-robin counters of `job_id`'s partition.
    fn rr_key(&self, job_id: &str) -> String {
        format!("{}rr", self.pfx(self.part(job_id)))
    }
}

/// The turn a shared counter's `HINCRBY` answered `n` for (counted from 0).
fn turn_of(n: i64) -> u64 {
    u64::try_from(n.saturating_sub(1)).unwrap_or(0)
}

/// The round-robin counters of the jobs this instance routes while its last beat found
/// no other instance alive: in memory, as nothing shares them (a Redis round trip per
/// routed run fewer: `HINCRBY` of the partition's `rr` hash was about 5 % of Redis's time
/// per run in a 10k burst). The first beat that finds another instance alive drops them
/// and the shared counters take over, where the others left them.
#[derive(Default)]
pub(super) struct RouteCounters {
    /// Whether the last beat found no other instance alive (false until the first).
    alone: std::sync::atomic::AtomicBool,
    local: crate::store::LocalCounters,
}

impl RouteCounters {
    /// What the last beat found: `others` instances alive besides this one.
    pub(super) fn beat(&self, others: u64) {
        let alone = others == 0;
        let was = self.alone.swap(alone, std::sync::atomic::Ordering::Relaxed);
        if was && !alone {
            self.local.clear();
        }
    }

    /// Whether the last beat found no other instance alive (false until the first).
    pub(super) fn alone(&self) -> bool {
        self.alone.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The job's next value while this instance is alone; None when it is not.
    fn next_local(&self, job_id: &str) -> Option<u64> {
        self.alone
            .load(std::sync::atomic::Ordering::Relaxed)
            .then(|| self.local.next(job_id))
    }
}
