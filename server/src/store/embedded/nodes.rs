//! `NodeRegistry` and `Inboxes` in the embedded store: the executor node registry
//! (register at a hello, refresh at heartbeats, remove by the stream that registered
//! the node, list; expired nodes are invisible at once and swept lazily), and in
//! memory the per-instance inboxes and the round-robin counters (one process routes).

use super::*;

#[async_trait]
impl NodeRegistry for EmbeddedStore {
    async fn register_node(&self, node: NodeRecord, ttl: Duration) -> Result<Registered> {
        self.upsert_node(node, ttl, Upsert::Register).await
    }

    async fn refresh_node(&self, node: NodeRecord, ttl: Duration) -> Result<Registered> {
        self.upsert_node(node, ttl, Upsert::Refresh).await
    }

    async fn remove_node(
        &self,
        node: &NodeRecord,
        leases_within: Option<Duration>,
    ) -> Result<NodeRemoved> {
        let node = node.clone();
        self.write(move |_, b| {
            let txn = b.txn();
            let node = &node;
            let node_id = node.node_id.as_str();
            let now = now_ms();
            sweep_nodes(txn, now)?;
            let removed = {
                let mut nodes = txn.open_table(NODES).ctx("open nodes")?;
                let mut expiry = txn.open_table(NODE_EXPIRY).ctx("open node expiry")?;
                let current = nodes.get(node_id).ctx("read node")?.map(|g| {
                    let (json, expires_at) = g.value();
                    (json.to_owned(), expires_at)
                });
                let Some((json, expires_at)) = current else {
                    return Ok(NodeRemoved::default());
                };
                // Expired but not swept yet: it is gone as far as anyone can tell (in
                // redis its key would have expired), so it is deleted and not reported
                // removed.
                let removed = if expires_at <= now {
                    false
                } else {
                    let stored: NodeRecord = decode("node", node_id, &json)?;
                    if stored.instance != node.instance || stored.session != node.session {
                        return Ok(NodeRemoved::default());
                    }
                    true
                };
                nodes.remove(node_id).ctx("delete node")?;
                expiry
                    .remove((expires_at, node_id))
                    .ctx("delete node expiry")?;
                removed
            };
            let mut leases_shortened = 0;
            if let (true, Some(within)) = (removed, leases_within) {
                let t = b.runs()?;
                let by = t.now.saturating_add(duration_ms(within));
                for sid in t.node_run_ids(node_id)? {
                    let Some(mut run) = t.load(&sid)? else {
                        continue;
                    };
                    if held(run.state) && run.node_id == node_id && run.deadlines.lease_expires > by
                    {
                        run.deadlines.lease_expires = by;
                        t.save(&mut run)?;
                        leases_shortened += 1;
                    }
                }
            }
            Ok(NodeRemoved {
                removed,
                leases_shortened,
            })
        })
        .await
    }

    /// Unexpired nodes in node id order (the table's key order).
    async fn list_nodes(&self, group: Option<&str>) -> Result<Vec<NodeRecord>> {
        let group = group.map(str::to_owned);
        self.blocking(move |inner| {
            let group = group.as_deref();
            let txn = read(&inner.db)?;
            let now = now_ms();
            let nodes = txn.open_table(NODES).ctx("open nodes")?;
            let node_runs = txn.open_table(NODE_RUNS).ctx("open node runs")?;
            let mut out = Vec::new();
            for item in nodes.iter().ctx("scan nodes")? {
                let (k, v) = item.ctx("scan nodes")?;
                let (json, expires_at) = v.value();
                if expires_at <= now {
                    continue;
                }
                let mut node: NodeRecord = decode("node", k.value(), json)?;
                if group.is_none_or(|g| node.group == g) {
                    let upper = successor(&node.node_id);
                    node.leased = node_runs
                        .range((node.node_id.as_str(), "")..(upper.as_str(), ""))
                        .ctx("scan node runs")?
                        .count()
                        .try_into()
                        .unwrap_or(u32::MAX);
                    out.push(node);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn next_route_counter(&self, job_id: &str) -> Result<u64> {
        Ok(self.route_counters.next(job_id))
    }
}

#[async_trait]
impl Inboxes for EmbeddedStore {
    async fn push_inbox(&self, instance: &str, messages: Vec<Vec<u8>>) -> Result<()> {
        if messages.is_empty() {
            return Ok(());
        }
        let now = Instant::now();
        {
            let mut inboxes = self.inboxes();
            // Forget inboxes nobody wrote to for a while (their instance is gone), as
            // redis lets the key expire.
            inboxes.retain(|_, inbox| inbox.expires > now);
            let inbox = inboxes.entry(instance.to_owned()).or_insert_with(|| Inbox {
                messages: VecDeque::new(),
                expires: now,
            });
            inbox.messages.extend(messages);
            inbox.expires = now + INBOX_TTL;
        }
        self.inbox_pushed.notify_waiters();
        Ok(())
    }

    async fn pop_inbox(&self, instance: &str, max: usize, block: Duration) -> Result<Vec<Vec<u8>>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        look_until_found(&self.inbox_pushed, block, || async {
            Ok(self.take_inbox(instance, max))
        })
        .await
    }
}

/// Which write of a node's registration: at its stream's hello, or a heartbeat's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Upsert {
    Register,
    Refresh,
}

impl EmbeddedStore {
    /// One write of a node's registration (see `NodeRegistry::register_node` and
    /// `refresh_node`): refused for another group's live registration, and for a
    /// refresh over another stream's.
    async fn upsert_node(
        &self,
        mut node: NodeRecord,
        ttl: Duration,
        mode: Upsert,
    ) -> Result<Registered> {
        self.write(move |_, b| {
            let txn = b.txn();
            let now = now_ms();
            sweep_nodes(txn, now)?;
            node.last_heartbeat = now;
            let json = encode("node", &node)?;
            let expires_at = now.saturating_add(duration_ms(ttl));
            let node_id = node.node_id.as_str();
            let mut nodes = txn.open_table(NODES).ctx("open nodes")?;
            let mut expiry = txn.open_table(NODE_EXPIRY).ctx("open node expiry")?;
            let old = match nodes.get(node_id).ctx("read node")? {
                Some(g) => {
                    let (json, at) = g.value();
                    Some((decode::<NodeRecord>("node", node_id, json)?, at))
                }
                None => None,
            };
            if let Some((cur, old_expiry)) = old {
                if old_expiry > now {
                    if cur.group != node.group {
                        return Ok(Registered::OtherGroup(cur.group));
                    }
                    if mode == Upsert::Refresh && cur.session != node.session {
                        return Ok(Registered::Superseded);
                    }
                }
                expiry
                    .remove((old_expiry, node_id))
                    .ctx("delete node expiry")?;
            }
            nodes
                .insert(node_id, (json.as_str(), expires_at))
                .ctx("write node")?;
            expiry
                .insert((expires_at, node_id), ())
                .ctx("write node expiry")?;
            Ok(Registered::Yes)
        })
        .await
    }
}

/// Deletes up to `SWEEP_BATCH` nodes whose expiry has passed, earliest first.
fn sweep_nodes(txn: Tx<'_>, now: Millis) -> Result<()> {
    let mut nodes = txn.open_table(NODES).ctx("open nodes")?;
    let mut expiry = txn.open_table(NODE_EXPIRY).ctx("open node expiry")?;
    let expired = due_keys(&*expiry, now, "scan node expiry")?;
    for (at, node_id) in expired {
        expiry
            .remove((at, node_id.as_str()))
            .ctx("delete node expiry")?;
        // Record and expiry key always change together; the check only guards against
        // deleting a record that a damaged index no longer describes.
        let stored_expiry = nodes
            .get(node_id.as_str())
            .ctx("read node")?
            .map(|g| g.value().1);
        if stored_expiry == Some(at) {
            nodes.remove(node_id.as_str()).ctx("delete node")?;
        }
    }
    Ok(())
}
