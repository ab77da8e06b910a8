//! A node's count of leased runs in a Redis Cluster (`lua/node_slots.lua`).
//!
//! On one Redis the run scripts count a node's runs themselves (`busy:<node>` in the
//! `{nodes}` slot, beside the run's partition): the lease and the count are one step.
//! A cluster refuses a script whose keys span two slots, so there the count is kept by
//! the calls around the run scripts, each in the node's own slot (`{held:<node>}`): a
//! run is reserved on its node before the partition's script leases it (refused when
//! the node is full), the reservation is extended before each lease renewal and
//! released once the run leaves the node. The store stays the judge of a node's window: every lease is
//! preceded by a reservation that outlasts it, so a node never holds more than its
//! window; a reservation left by an instance that died between two steps (or by a
//! run dropped from a full job index while held) lapses at its end, so a node can
//! look fuller than it is for up to twice a lease's TTL, never emptier.

use super::*;

/// What a reservation answers for one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reserved {
    Ok,
    /// The node holds its window.
    Full,
    /// The run is reserved on the node already (leased, or being leased by another
    /// call): this call leases nothing.
    Taken,
}

impl RedisStore {
    /// The `N` argument of the run scripts: the `{nodes}` prefix on one Redis, where
    /// they count a node's runs themselves; '' in a cluster, where this module does.
    pub(super) fn run_nodes_arg(&self) -> String {
        if self.inner.shared.is_cluster() {
            String::new()
        } else {
            self.nodes_prefix()
        }
    }

    /// A node's reservations in a cluster: a key with a hash tag of its own, so the
    /// nodes' counts spread over the masters.
    pub(super) fn held_key(&self, node_id: &str) -> String {
        format!("{}:{{held:{node_id}}}", self.inner.prefix)
    }

    /// Reserves `schedule_id` on `node` for `hold` (a cluster only).
    pub(super) async fn reserve_slot(
        &self,
        node: &NodeSlot,
        schedule_id: &str,
        hold: Duration,
    ) -> Result<Reserved> {
        let mut c = self.conn().await?;
        let r: Vec<String> = self
            .inner
            .scripts
            .node_slots
            .key(self.held_key(&node.node_id))
            .arg("reserve")
            .arg(node.max_concurrency)
            .arg(ms(hold))
            .arg(schedule_id)
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        match r.first().map(String::as_str) {
            Some("ok") => Ok(Reserved::Ok),
            Some("full") => Ok(Reserved::Full),
            Some("taken") => Ok(Reserved::Taken),
            other => Err(corrupt(format!("node_slots reserve answered {other:?}"))),
        }
    }

    /// Extends the reservations of `schedule_ids` on `node` to `hold` from now (a
    /// cluster only; before their leases are renewed). A broadcast's shard 0 answers to
    /// its parent's id, so for an id without a shard suffix its shard 0's reservation
    /// is extended too, when there is one.
    pub(super) async fn extend_slots(
        &self,
        node: &str,
        schedule_ids: &[&str],
        hold: Duration,
    ) -> Result<()> {
        if schedule_ids.is_empty() {
            return Ok(());
        }
        let mut inv = self.inner.scripts.node_slots.key(self.held_key(node));
        inv.arg("extend").arg(ms(hold));
        for sid in schedule_ids {
            inv.arg(*sid);
            if !sid.contains('#') {
                inv.arg(format!("{sid}#0"));
            }
        }
        let mut c = self.conn().await?;
        let _: i64 = inv.invoke_async(&mut c).await.map_err(unavailable)?;
        Ok(())
    }

    /// Releases the reservations of runs that left their nodes, as (node, schedule_id)
    /// (a cluster only; nothing to do elsewhere): one call per node, sent together.
    /// It follows a decision already made (a result applied, a lease revoked), so a
    /// failure is logged, not returned: the caller must still act on its decision, and
    /// a reservation not released lapses at its end.
    pub(super) async fn release_slots<'a>(
        &self,
        left: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) {
        if !self.inner.shared.is_cluster() {
            return;
        }
        if let Err(e) = self.try_release_slots(left).await {
            tracing::warn!(error = %e, "releasing node reservations failed; they lapse at their end");
        }
    }

    async fn try_release_slots<'a>(
        &self,
        left: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<()> {
        let mut by_node: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
        for (node, sid) in left {
            by_node.entry(node).or_default().push(sid);
        }
        let c = self.conn().await?;
        let calls = by_node.into_iter().map(|(node, sids)| {
            let mut c = c.clone();
            let mut inv = self.inner.scripts.node_slots.key(self.held_key(node));
            inv.arg("release");
            for sid in sids {
                inv.arg(sid);
            }
            async move {
                let _: i64 = inv.invoke_async(&mut c).await.map_err(unavailable)?;
                Ok::<_, Error>(())
            }
        });
        futures::future::try_join_all(calls).await?;
        Ok(())
    }

    /// Releases the nodes' reservations for the runs a holder's result (or rejection)
    /// took off them: each `(holder's node, schedule_id, transition)` applied (a
    /// broadcast shard's result may name its parent: the run answered is the shard).
    pub(super) async fn release_finished<'a>(
        &self,
        finished: impl IntoIterator<Item = (Option<&'a str>, &'a str, &'a Transition)>,
    ) {
        let left = finished.into_iter().filter_map(|(node, sid, t)| {
            let node = node.filter(|_| t.applied == Applied::Yes)?;
            let sid = t.run.as_ref().map_or(sid, |r| r.schedule_id.as_str());
            Some((node, sid))
        });
        self.release_slots(left).await;
    }

    /// Releases what a transition's revocations took off their nodes.
    pub(super) async fn release_revoked(&self, revoked: &[Revocation]) {
        self.release_slots(
            revoked
                .iter()
                .map(|r| (r.node_id.as_str(), r.schedule_id.as_str())),
        )
        .await;
    }
}

/// How long a reservation made for a lease of `terms` lasts: twice the longer of its
/// lease and its confirmation window, so it outlasts the lease even when the clocks of
/// the run's master and the node's master differ by up to a lease's TTL.
pub(super) fn reservation_hold(terms: &LeaseTerms) -> Duration {
    terms.ttl.max(terms.confirm_within) * 2
}
