//! What the router tells the trigger consumer about runs about to begin: their jobs
//! (read ahead for a whole batch), the node each would go to first and how long its
//! timer waits, the node cache's bookkeeping around a begin-and-lease, and what is
//! left to do once a run is begun (cancels, the dispatch, or routing it).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tracing::debug;

use super::{Pick, Router, waits_in_room};
use crate::dispatch::{lock, routing};
use crate::model::{JobRecord, RunRecord, RunState, Target};
use crate::store::{Assigned, Begun, NodeRecord, NodeSlot};

/// Where a run about to begin would go first.
pub enum First {
    /// To this node of the snapshot, with this route key.
    Node(Arc<Vec<NodeRecord>>, usize, String),
    /// Into the room queue: every eligible node is at its window, or runs wait already.
    NoRoom,
    /// Anywhere else (no node, a broadcast, an HTTP target, a run that waits by its
    /// timer, a job that is gone): routed as any begun run.
    Other,
}

impl First {
    /// The node named, if any.
    pub fn node(&self) -> Option<&NodeRecord> {
        match self {
            First::Node(nodes, i, _) => Some(&nodes[*i]),
            First::NoRoom | First::Other => None,
        }
    }
}

impl Router {
    /// Reads the jobs (id, version) that the cache does not hold at that version in
    /// one store call per partition, instead of one call per run as each begins (a
    /// burst of jobs firing for the first time would read each job alone). A job not
    /// found, or a store error, is left to [`job`](Router::job), which reads it on its
    /// own.
    pub async fn prefetch_jobs<'a>(&self, wanted: impl Iterator<Item = (&'a str, u64)>) {
        let missing = self.store.job_cache.missing(wanted);
        if missing.is_empty() {
            return;
        }
        match self.store.jobs.get_jobs(&missing).await {
            Ok(found) => drop(self.store.job_cache.keep(found)),
            Err(e) => debug!(error = %e, "reading a batch's jobs failed; each run reads its own"),
        }
    }

    /// The round-robin turns of runs about to begin (job id, version), for the jobs
    /// whose strategy takes turns (round robin, weighted, busyover) and whose record
    /// the cache holds, drawn in one store call (`next_route_counters`: one round trip
    /// on Redis, where a pick would take one each), by job id. Not for a run that will
    /// queue in its nodes' room behind older runs ([`first_node`](Router::first_node)
    /// picks nothing for it: it draws its turn when taken out). A job left out, or a
    /// store error, draws its own turn when picked.
    pub async fn draw_turns<'a>(
        &self,
        runs: impl Iterator<Item = (&'a str, u64)>,
    ) -> HashMap<String, u64> {
        let ids: Vec<&str> = {
            let room = lock(&self.room);
            runs.filter(|&(id, version)| {
                self.store.job_cache.get(id, version).is_some_and(|job| {
                    let Target::Executor { group, handler } = &job.spec.target else {
                        return false;
                    };
                    let strategy = job.spec.route_strategy;
                    routing::takes_turns(strategy)
                        && (routing::keeps_affinity(strategy) || !room.waiting(group, handler))
                })
            })
            .map(|(id, _)| id)
            .collect()
        };
        if ids.is_empty() {
            return HashMap::new();
        }
        match self.store.nodes.next_route_counters(&ids).await {
            Ok(turns) => ids.into_iter().map(str::to_owned).zip(turns).collect(),
            Err(e) => {
                debug!(error = %e, "drawing a part's round-robin turns failed; each draws its own");
                HashMap::new()
            }
        }
    }

    /// The node routing would try first for a run of `job` about to begin, when it
    /// is an executor job routed to one node and some node can take it now; `turn`,
    /// the job's round-robin turn when [`draw_turns`](Router::draw_turns) drew it.
    pub async fn first_node(&self, run: &RunRecord, job: &JobRecord, turn: Option<u64>) -> First {
        let Target::Executor { group, handler } = &job.spec.target else {
            return First::Other;
        };
        let roomy = waits_in_room(run, job);
        if roomy && lock(&self.room).waiting(group, handler) {
            // Older runs wait for a slot on these nodes: this one goes behind them.
            return First::NoRoom;
        }
        match self.pick(run, job, group, handler, turn).await {
            Pick::Order {
                nodes,
                order,
                route_key,
            } => match order.first() {
                Some(&i) => First::Node(nodes, i, route_key),
                None if roomy => First::NoRoom,
                None => First::Other,
            },
            Pick::NoNode | Pick::Broadcast { .. } => First::Other,
        }
    }

    /// How long after it begins a run's timer first wakes it: a run that will wait in
    /// the room is routed from there when a slot frees, so its timer is only for an
    /// instance that dies meanwhile.
    pub fn begin_grace(&self, first: &First, run: &RunRecord) -> Duration {
        match first {
            First::NoRoom => self.room_grace(run.plan.timeout_ms),
            First::Node(..) | First::Other => self.opts.route_retry,
        }
    }

    /// The slot to ask the store for on `node` (least active must see the runs the
    /// begins beside this one are about to lease).
    pub fn asking(&self, node: &NodeRecord) -> NodeSlot {
        self.nodes.asking(node)
    }

    /// What the store answered when asked for a slot on `node` (None: it failed).
    pub fn answered(&self, node: &NodeRecord, assigned: Option<&Assigned>) {
        self.nodes.answered(node, assigned);
    }

    /// Counts a begun run in the metrics.
    pub fn count_begun(&self, begun: &Begun) {
        self.alerts.metrics().record_begun(begun);
    }

    /// What [`begun`](Router::begun) does, done now for the common run: leased to a
    /// node, no lease revoked, its dispatch sent without an await (each run's future
    /// going on would otherwise hold `begun`'s, some KiB, copied wherever it moves).
    /// The run back, for `begun`, in every other case.
    pub fn begun_at_once(
        &self,
        begun: Begun,
        assigned: Option<Assigned>,
        first: &First,
        job: Option<&JobRecord>,
    ) -> Option<(Begun, Option<Assigned>)> {
        if let (Some(Assigned::Granted(leased)), First::Node(nodes, i, route_key), Some(job)) =
            (&assigned, first, job)
            && begun.revoked.is_empty()
        {
            self.dispatch(leased, job, &nodes[*i], route_key);
            return None;
        }
        Some((begun, assigned))
    }

    /// What is left once a run is begun: cancels for the leases its begin revoked
    /// (the replace policy), then its dispatch when it was leased to the node named
    /// `first`, or routing when it waits to be routed now.
    pub async fn begun(
        &self,
        begun: Begun,
        assigned: Option<Assigned>,
        first: &First,
        job: Option<&JobRecord>,
    ) {
        for rv in &begun.revoked {
            self.send_cancel(rv).await;
        }
        match (assigned, first, job) {
            (Some(Assigned::Granted(leased)), First::Node(nodes, i, route_key), Some(job)) => {
                self.dispatch(&leased, job, &nodes[*i], route_key);
            }
            (Some(Assigned::NotWaiting(_)), _, _) => debug!("run no longer waiting"),
            // Not assigned here (no node named, or it was full), or a trigger seen
            // again whose run is still waiting: routed as any waiting run.
            _ if begun.run.state == RunState::Waiting && begun.run.deadlines.wake_at > 0 => {
                self.route(begun.run).await;
            }
            _ => {}
        }
    }
}
