//! What `GET /metrics` reads at scrape time: the instance's [`Metrics`], with the
//! gauges that are not counted as events but looked up when scraped (the executor
//! streams attached here, the runtime's threads, and the registry's nodes by health).

use std::sync::Arc;

use crate::dispatch::health::{self, Health, HealthPolicy};
use crate::dispatch::links::Links;
use crate::metrics::Metrics;
use crate::store::NodeRegistry;

/// What `GET /metrics` needs: the metrics, and where the scrape-time gauges come from.
#[derive(Clone)]
pub struct Scrape {
    pub metrics: Arc<Metrics>,
    pub links: Arc<Links>,
    pub store: Arc<dyn NodeRegistry>,
    pub health: HealthPolicy,
}

impl Scrape {
    /// Refreshes the gauges, then renders. A registry the store cannot read now leaves
    /// the node gauges as they were.
    pub async fn render(&self) -> String {
        self.metrics.set_executors_connected(self.links.attached());
        self.metrics
            .set_worker_threads(tokio::runtime::Handle::current().metrics().num_workers());
        if let Some(stats) = self.store.commit_stats() {
            self.metrics.set_commit_stats(&stats);
        }
        match self.store.list_nodes(None).await {
            Ok(nodes) => {
                let health: Vec<Health> = nodes
                    .iter()
                    .map(|n| health::classify(n, &nodes, &self.health))
                    .collect();
                let by_health: Vec<(&str, usize)> = Health::ALL
                    .iter()
                    .map(|h| (h.as_str(), health.iter().filter(|x| *x == h).count()))
                    .collect();
                self.metrics.set_executor_nodes(&by_health);
            }
            Err(e) => {
                tracing::debug!(error = %e, "metrics: reading the node registry failed");
            }
        }
        self.metrics.render()
    }
}
