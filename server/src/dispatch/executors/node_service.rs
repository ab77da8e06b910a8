//! `NodeService`: the executors as operators see them (`ListNodes`, with each node's
//! health as routing judges it) and drained or undrained (`DrainNode`, `UndrainNode`),
//! told to the node wherever its stream is attached.

use tonic::{Request, Response, Status};
use tracing::info;

use sundial_proto::v1 as pb;
use sundial_proto::v1::node_service_server::NodeService;

use super::{Executors, Out, truncate_utf8};
use crate::dispatch::health::{self, Health, HealthPolicy};
use crate::model::valid_job_id;
use crate::store::NodeRecord;

/// A registry record as `ListNodes` shows it.
fn node_view(n: NodeRecord, nodes: &[NodeRecord], policy: &HealthPolicy) -> pb::Node {
    let judged = health::judge(&n, nodes, policy);
    let health = match judged.health {
        Health::Healthy => pb::NodeHealth::Healthy,
        Health::Slow => pb::NodeHealth::Slow,
        Health::Failing => pb::NodeHealth::Failing,
        Health::NotReady => pb::NodeHealth::NotReady,
        Health::Draining => pb::NodeHealth::Draining,
        Health::Unresponsive => pb::NodeHealth::Unresponsive,
    };
    pb::Node {
        health: health as i32,
        success_rate: health::success_rate(&n),
        node_id: n.node_id,
        group: n.group,
        handlers: n.handlers,
        weight: n.weight,
        max_concurrency: n.max_concurrency,
        active: n.active.max(n.leased),
        mean_duration_ms: i64::try_from(n.mean_duration_ms).unwrap_or(i64::MAX),
        server_instance: n.instance,
        last_heartbeat_ms: n.last_heartbeat,
        labels: n.labels.into_iter().collect(),
        health_reason: judged.reason,
    }
}

#[tonic::async_trait]
impl NodeService for Executors {
    async fn list_nodes(
        &self,
        req: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        let group = req.into_inner().group;
        if !group.is_empty() && !valid_job_id(&group) {
            return Err(Status::invalid_argument(
                "group: must match [A-Za-z0-9._-]{1,128}, not . or ..",
            ));
        }
        let nodes = self
            .store
            .nodes
            .list_nodes((!group.is_empty()).then_some(group.as_str()))
            .await?;
        Ok(Response::new(pb::ListNodesResponse {
            nodes: nodes
                .iter()
                .map(|n| node_view(n.clone(), &nodes, &self.opts.health))
                .collect(),
        }))
    }

    async fn drain_node(
        &self,
        req: Request<pb::DrainNodeRequest>,
    ) -> Result<Response<pb::DrainNodeResponse>, Status> {
        let req = req.into_inner();
        let node = self
            .tell_node(&req.node_id, req.reason, true, |reason| {
                Out::Drain(pb::Drain { reason })
            })
            .await?;
        Ok(Response::new(pb::DrainNodeResponse { node: Some(node) }))
    }

    async fn undrain_node(
        &self,
        req: Request<pb::UndrainNodeRequest>,
    ) -> Result<Response<pb::UndrainNodeResponse>, Status> {
        let req = req.into_inner();
        let node = self
            .tell_node(&req.node_id, req.reason, false, |reason| {
                Out::Undrain(pb::Undrain { reason })
            })
            .await?;
        Ok(Response::new(pb::UndrainNodeResponse { node: Some(node) }))
    }
}

impl Executors {
    /// Drains (`draining`) or undrains the connected node `node_id`: sends it the
    /// message `say(reason)` wherever its stream is attached, and answers the node as
    /// it is now to be seen.
    async fn tell_node(
        &self,
        node_id: &str,
        mut reason: String,
        draining: bool,
        say: impl FnOnce(String) -> Out,
    ) -> Result<pb::Node, Status> {
        if node_id.is_empty() || node_id.len() > 256 {
            return Err(Status::invalid_argument(
                "node_id: required, at most 256 bytes",
            ));
        }
        truncate_utf8(&mut reason, 256);
        let nodes = self.store.nodes.list_nodes(None).await?;
        let Some(mut node) = nodes.iter().find(|n| n.node_id == node_id).cloned() else {
            return Err(Status::not_found(format!(
                "node_id: no connected node {node_id:?}"
            )));
        };
        if draining {
            info!(node_id = %node.node_id, %reason, "draining node");
        } else {
            info!(node_id = %node.node_id, %reason, "undraining node");
        }
        self.links
            .deliver(&node.node_id, &node.instance, say(reason));
        node.draining = draining;
        Ok(node_view(node, &nodes, &self.opts.health))
    }
}
