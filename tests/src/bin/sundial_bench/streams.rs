//! `executors`: what idle executor streams cost the server: N in-process Rust SDK
//! executors (one stream each), the server's resident memory before and after they all
//! appear in `ListNodes`.

use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;
use sundial_proto::v1 as pb;
use sundial_sdk::{CancellationToken, Executor};

use crate::cost::RedisCeiling;
use crate::rig::{Binaries, Rig, RigSpec, StoreKind};

#[derive(Debug, Clone, clap::Args)]
pub struct StreamsArgs {
    /// Executor streams to open.
    #[arg(long, default_value_t = 1000)]
    pub streams: usize,
    #[arg(long, value_enum, default_value_t = StoreKind::Redis)]
    pub store: StoreKind,
    /// Instead of executors, open this many bare gRPC connections, each making one
    /// `ListNodes` call and then idling: what the HTTP/2 connection alone costs, the
    /// floor under an executor stream's figure.
    #[arg(long)]
    pub bare: bool,
}

#[derive(Debug, Serialize)]
pub struct StreamsReport {
    pub scenario: &'static str,
    pub store: &'static str,
    /// Bare connections (`--bare`) rather than executor streams.
    pub bare: bool,
    pub streams: usize,
    pub nodes_listed: usize,
    pub server_rss_before_kib: u64,
    pub server_rss_after_kib: u64,
    pub kib_per_stream: f64,
    /// `redis-benchmark` on the same Redis, after the measurement (none on embedded).
    pub redis_ceiling: Option<RedisCeiling>,
}

impl crate::Report for StreamsReport {
    fn print(&self) {
        println!(
            "executors: {} idle {} ({} listed), store {}: server RSS {} KiB -> {} KiB, {:.1} KiB per {}",
            self.streams,
            if self.bare {
                "bare connections"
            } else {
                "streams"
            },
            self.nodes_listed,
            self.store,
            self.server_rss_before_kib,
            self.server_rss_after_kib,
            self.kib_per_stream,
            if self.bare { "connection" } else { "stream" },
        );
        RedisCeiling::print(self.redis_ceiling);
    }

    fn consistency(&self) -> Vec<String> {
        if self.nodes_listed == self.streams {
            Vec::new()
        } else {
            vec![format!(
                "executors: {} of {} nodes listed",
                self.nodes_listed, self.streams
            )]
        }
    }
}

pub async fn run(bins: &Binaries, args: &StreamsArgs) -> Result<StreamsReport> {
    let rig = Rig::start(&RigSpec {
        bins,
        store: args.store,
        instances: 1,
        executors: 0,
        server_args: Vec::new(),
        executor_args: Vec::new(),
    })?;
    let server = &rig.instances[0];
    let pid = server.pid();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = crate::registered::rss_kib(pid)?;
    let shutdown = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    let mut bare = Vec::new();
    let mut nodes = pb::node_service_client::NodeServiceClient::new(server.channel().await?);
    let listed = if args.bare {
        for _ in 0..args.streams {
            let mut client =
                pb::node_service_client::NodeServiceClient::new(server.channel().await?);
            client
                .list_nodes(pb::ListNodesRequest::default())
                .await
                .context("ListNodes on a bare connection")?;
            bare.push(client);
        }
        args.streams
    } else {
        for i in 0..args.streams {
            let executor = Executor::builder()
                .group("streams")
                .node_id(format!("stream-{i}"))
                .endpoint(server.grpc_url())
                .handler("noop", |_ctx| async { Ok(Vec::new()) })
                .build()?;
            tasks.spawn(executor.run(shutdown.clone()));
        }
        every_stream_listed(&nodes, args.streams).await?
    };
    // A heartbeat round, so the figure is of streams at rest.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let after = crate::registered::rss_kib(pid)?;
    let _ = nodes
        .list_nodes(pb::ListNodesRequest::default())
        .await
        .context("ListNodes")?;
    shutdown.cancel();
    while tasks.join_next().await.is_some() {}
    drop(bare);
    let redis_ceiling = RedisCeiling::of(&rig)?;
    Ok(StreamsReport {
        scenario: "executors",
        redis_ceiling,
        store: args.store.name(),
        bare: args.bare,
        streams: args.streams,
        nodes_listed: listed,
        server_rss_before_kib: before,
        server_rss_after_kib: after,
        kib_per_stream: after.saturating_sub(before) as f64 / args.streams.max(1) as f64,
    })
}

/// Waits until `ListNodes` lists `want` streams; how many it listed.
async fn every_stream_listed(
    nodes: &pb::node_service_client::NodeServiceClient<tonic::transport::Channel>,
    want: usize,
) -> Result<usize> {
    sundial_tests::wait_for(
        "every stream in ListNodes",
        Duration::from_secs(120),
        || {
            let mut nodes = nodes.clone();
            async move {
                let n = nodes
                    .list_nodes(pb::ListNodesRequest {
                        group: "streams".into(),
                    })
                    .await?
                    .into_inner()
                    .nodes
                    .len();
                Ok((n >= want).then_some(n))
            }
        },
    )
    .await
    .context("the streams did not all register")
}
