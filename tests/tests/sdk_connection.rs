//! The Rust SDK's connection against real servers: it registers and stays registered by
//! heartbeating, follows a go-away to the next endpoint, comes back after every server
//! was gone, and unregisters when shut down.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use sundial_proto::v1 as pb;
use sundial_sdk::Executor;
use sundial_tests::{RedisServer, Sundial, SundialOptions, free_port, wait_for};
use tokio_util::sync::CancellationToken;

fn server(redis: &RedisServer, name: &str, port: u16) -> Result<Sundial> {
    let mut opts = SundialOptions::redis(redis)
        .arg("heartbeat-interval", "300ms")
        .arg("instance-id", name);
    opts.port = Some(port);
    Sundial::start(opts)
}

/// The instance holding `node`'s stream, as `via` lists it (None: not registered).
async fn holder(via: &Sundial, node: &str) -> Result<Option<String>> {
    let nodes = pb::node_service_client::NodeServiceClient::new(via.channel().await?)
        .list_nodes(pb::ListNodesRequest::default())
        .await?
        .into_inner()
        .nodes;
    Ok(nodes
        .into_iter()
        .find(|n| n.node_id == node)
        .map(|n| n.server_instance))
}

async fn wait_holder(via: &Sundial, node: &str, want: Option<&str>) -> Result<()> {
    wait_for(
        &format!("{node} held by {want:?}"),
        Duration::from_secs(20),
        || async { Ok((holder(via, node).await?.as_deref() == want).then_some(())) },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_stays_connected_follows_go_away_and_reconnects() -> Result<()> {
    let redis = RedisServer::start()?;
    let (port_a, port_b) = (free_port()?, free_port()?);
    let mut a = server(&redis, "inst-a", port_a)?;
    let mut b = server(&redis, "inst-b", port_b)?;

    let executor = Executor::builder()
        .endpoint(format!("http://127.0.0.1:{port_a}"))
        .endpoint(format!("http://127.0.0.1:{port_b}"))
        .group("billing")
        .node_id("sdk-node")
        .handler("invoice", |_ctx| async { Ok(Vec::new()) })
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(400))
        .build()?;
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(executor.run(shutdown.clone()));

    wait_holder(&b, "sdk-node", Some("inst-a")).await?;
    // Several registration TTLs (3 × 300 ms) later it is still there: heartbeats work.
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(holder(&b, "sdk-node").await?.as_deref() == Some("inst-a"));

    // A draining server says go-away: the executor moves to the next endpoint.
    let stopped = tokio::task::spawn_blocking(move || {
        let status = a.stop();
        (a, status)
    });
    wait_holder(&b, "sdk-node", Some("inst-b")).await?;
    let (a, status) = stopped.await?;
    ensure!(status?.success());
    drop(a);

    // Every server gone for a while, then one comes back on its old address.
    b.kill()?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let a = server(&redis, "inst-a", port_a)?;
    wait_holder(&a, "sdk-node", Some("inst-a")).await?;

    // Shutting the executor down ends its stream, and the server unregisters it.
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .context("executor did not stop")???;
    wait_holder(&a, "sdk-node", None).await?;
    Ok(())
}

/// Ctrl-C of a server while it drains (an HTTP target's request keeps it draining for
/// 1.5 s): its executor is told to go away, every hello it sends meanwhile is refused
/// (none is welcomed only to be told to go away again: the reconnect storm), and the
/// SDK backs off between them (its default, 100 ms doubling): a few attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_server_refuses_hellos_and_the_sdk_backs_off() -> Result<()> {
    let (got, mut requests) = tokio::sync::mpsc::unbounded_channel::<()>();
    let app = axum::Router::new().route(
        "/slow",
        axum::routing::post(move || {
            let got = got.clone();
            async move {
                let _ = got.send(());
                tokio::time::sleep(Duration::from_millis(1500)).await;
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let target = format!("http://{}/slow", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = tempfile::tempdir()?;
    let port = free_port()?;
    let mut opts = SundialOptions::embedded(dir.path()).arg("http-target-allow", "127.0.0.1/32");
    opts.port = Some(port);
    let mut server = Sundial::start(opts)?;

    let executor = Executor::builder()
        .endpoint(format!("http://127.0.0.1:{port}"))
        .group("g")
        .node_id("drained")
        .handler("noop", |_ctx| async { Ok(Vec::new()) })
        .build()?;
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(executor.run(shutdown.clone()));
    wait_for(
        "the executor to register",
        Duration::from_secs(20),
        || async { Ok(holder(&server, "drained").await?.map(|_| ())) },
    )
    .await?;
    server
        .create_job(sundial_tests::manual_http_job("slow", &target))
        .await?;
    server.trigger("slow").await?;
    tokio::time::timeout(Duration::from_secs(20), requests.recv())
        .await
        .context("the target was never called")?;

    let status = server.stop()?;
    ensure!(status.success(), "the server exited with {status}");
    let log = server.stderr();
    let drain = &log[log
        .find("shutting down")
        .context("no shutdown line in the server's log")?..];
    let welcomed = drain.matches("executor connected").count();
    let refused = drain.matches("hello refused").count();
    ensure!(
        welcomed == 0 && (1..5).contains(&refused),
        "during the drain {welcomed} hellos were welcomed and {refused} refused:\n{drain}"
    );
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .context("executor did not stop")???;
    Ok(())
}
