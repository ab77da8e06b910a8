//! One server instance: opens the store, starts the scheduler, dispatcher, sweeper and
//! webhook delivery loops, serves gRPC (services, health, reflection v1 + v1alpha) and
//! HTTP, and shuts all of it down in order.
//!
//! Shutdown order: health goes NOT_SERVING (load balancers stop sending), the loops are
//! cancelled and awaited (a store operation in progress always completes), then the
//! gRPC and HTTP servers finish their in-flight requests.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::serve::ListenerExt as _;
use futures::StreamExt as _;
use sundial_proto::v1::app_service_server::AppServiceServer;
use sundial_proto::v1::audit_service_server::AuditServiceServer;
use sundial_proto::v1::executor_service_server::ExecutorServiceServer;
use sundial_proto::v1::job_service_server::JobServiceServer;
use sundial_proto::v1::node_service_server::NodeServiceServer;
use sundial_proto::v1::run_service_server::RunServiceServer;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::api::destinations::Destinations;
use crate::api::grpc_auth::AdminAuthLayer;
use crate::api::queries::StatusSource;
use crate::api::scrape::Scrape;
use crate::api::{AppApi, Audit, AuditApi, JobApi, RunApi};
use crate::auth::{AdminGuard, Authenticator, StoreNonces};
use crate::config::{Config, StoreConfig};
use crate::deliver::alerts::Alerts;
use crate::deliver::webhooks::{self, Deliveries, WebhookStore};
use crate::dispatch;
use crate::dispatch::executors::{ExecutorStore, Executors};
use crate::dispatch::http_target::HttpTargets;
use crate::dispatch::links::Links;
use crate::dispatch::sweeper::{self, Sweeper};
use crate::dispatch::{DispatchStore, Dispatcher};
use crate::egress::EgressPolicy;
use crate::metrics::Metrics;
use crate::schedule::jobs::Jobs;
use crate::schedule::scheduler;
use crate::store::embedded::EmbeddedStore;
use crate::store::redis::RedisStore;
use crate::store::{Store, StoreMeta};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("store: {0}")]
    Store(#[from] crate::store::Error),
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("reflection: {0}")]
    Reflection(String),
    #[error("grpc server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("{0}")]
    Fault(String),
    #[error("http client: {0}")]
    HttpClient(reqwest::Error),
}

/// The fully-qualified names of the services this server registers with health.
const SERVICES: &[&str] = &[
    "sundial.v1.JobService",
    "sundial.v1.RunService",
    "sundial.v1.ExecutorService",
    "sundial.v1.NodeService",
    "sundial.v1.AppService",
    "sundial.v1.AuditService",
];

/// The largest executor message accepted: a 64 KiB payload's result or a batch of log
/// lines, with room to spare; anything larger ends that stream with RESOURCE_EXHAUSTED.
const MAX_EXECUTOR_MESSAGE: usize = 2 * 1024 * 1024;

/// Where a started server listens (the ports are real even when configured as 0).
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    pub grpc: SocketAddr,
    pub http: Option<SocketAddr>,
}

pub async fn open_store(config: &Config) -> Result<Arc<dyn Store>, Error> {
    Ok(match &config.store {
        StoreConfig::Redis { url, prefix } => {
            let store = RedisStore::connect(url, prefix, config.store_opts.clone()).await?;
            info!(prefix = %prefix, partitions = store.partitions(), "store: redis (multi-instance)");
            Arc::new(store)
        }
        StoreConfig::Embedded { path } => {
            if let Some(dir) = path.parent() {
                create_private_dir(dir).map_err(|e| {
                    crate::store::Error::Unavailable(format!(
                        "cannot create {}: {e}",
                        dir.display()
                    ))
                })?;
            }
            let store = EmbeddedStore::open(path, config.store_opts.clone())?;
            // The file holds app secrets and every job's payload: its owner only. (A file
            // this user may write but does not own cannot be changed: said, not fatal.)
            if let Err(e) = make_private(path, 0o600) {
                warn!(path = %path.display(), error = %e, "cannot make the store file private (0600)");
            }
            warn!(
                path = %path.display(),
                "store: embedded, SINGLE NODE ONLY: do not start a second instance on this data; use --redis-url for more"
            );
            Arc::new(store)
        }
    })
}

/// Creates the data directory (and its parents) readable by its owner only (0700 on
/// Unix); an existing directory keeps its mode.
fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Sets `path`'s mode (Unix; elsewhere nothing).
fn make_private(path: &std::path::Path, mode: u32) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
    }
    #[cfg(not(unix))]
    {
        let _ = (path, mode);
        Ok(())
    }
}

/// Runs the instance until `shutdown` is cancelled; `on_bound` learns the real
/// addresses once the listeners are bound.
pub async fn run(
    config: Config,
    shutdown: CancellationToken,
    on_bound: impl FnOnce(Bound),
) -> Result<(), Error> {
    if let Some(point) = crate::fault::validate_env().map_err(Error::Fault)? {
        warn!(%point, "crash point armed (SUNDIAL_FAULT)");
    }
    let store = open_store(&config).await?;
    let auth = Arc::new(Authenticator::new(config.auth.clone()));
    log_auth_mode(&auth);
    let admin_guard = AdminGuard::new(auth.clone(), Arc::new(StoreNonces(store.clone())));
    let grpc_listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| Error::Bind {
            addr: config.listen,
            source,
        })?;
    let grpc_addr = grpc_listener.local_addr().map_err(|source| Error::Bind {
        addr: config.listen,
        source,
    })?;
    let mut http_listener = match config.http_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|source| Error::Bind { addr, source })?,
        ),
        None => None,
    };
    let http_addr = http_listener.as_ref().and_then(|l| l.local_addr().ok());
    // TLS is set up here, before any loop starts (the files were checked with the
    // configuration; this only builds the acceptors).
    let mut grpc_builder = tonic::transport::Server::builder();
    let mut https_listener = None;
    if let Some(tls) = &config.tls {
        grpc_builder = grpc_builder.tls_config(tls.grpc())?;
        if let (Some(l), Some(addr)) = (http_listener.take(), config.http_listen) {
            https_listener = Some(
                tls.http_listener(l)
                    .map_err(|source| Error::Bind { addr, source })?,
            );
        }
    }

    let metrics = Arc::new(Metrics::new());
    let alerts = Arc::new(Alerts::new(metrics.clone()));
    // Built before any loop starts, so that failing here leaves nothing running.
    let http_targets = Arc::new(
        HttpTargets::new(
            store.clone(),
            &config.instance_id,
            config.http_max_concurrency,
            config.executors.lease_ttl,
            Arc::new(EgressPolicy::http_targets(config.http_target_allow.clone())),
            alerts.clone(),
        )
        .map_err(Error::HttpClient)?,
    );
    let deliveries = Arc::new(
        Deliveries::new(
            WebhookStore {
                outbox: store.clone(),
                jobs: store.clone(),
                apps: store.clone(),
            },
            config.webhooks.clone(),
            Arc::new(EgressPolicy::webhooks(config.webhook_allow.clone())),
            alerts.clone(),
        )
        .map_err(Error::HttpClient)?,
    );

    let loops = CancellationToken::new();
    let (scheduler_task, _stats) = scheduler::spawn(
        store.clone(),
        config.scheduler.clone(),
        alerts.clone(),
        loops.clone(),
    );
    let links = Arc::new(Links::new(store.clone(), config.instance_id.clone()));
    let dispatcher = Arc::new(Dispatcher::new(
        DispatchStore {
            jobs: store.clone(),
            triggers: store.clone(),
            runs: store.clone(),
            nodes: store.clone(),
        },
        config.dispatch.clone(),
        links.clone(),
        http_targets.clone(),
        alerts.clone(),
    ));
    let dispatch_task = dispatch::spawn(dispatcher.clone(), loops.clone());
    let sweep_task = sweeper::spawn(
        Sweeper::new(store.clone(), dispatcher.clone(), config.sweep.clone()),
        loops.clone(),
    );
    let inbox_task = tokio::spawn(
        links
            .clone()
            .run_inbox(config.dispatch.read_block, loops.clone()),
    );
    let webhooks_task = webhooks::spawn(deliveries, loops.clone());
    let alerts_task = match &config.alert_webhook {
        Some(url) => {
            let (tx, rx) = tokio::sync::mpsc::channel(crate::deliver::alerts::ALERT_QUEUE);
            alerts.send_to(tx);
            let sender = crate::deliver::alerts::AlertWebhook::new(
                url.clone(),
                config.webhooks.app_id.clone(),
                config.webhooks.secrets.clone(),
                config.instance_id.clone(),
                Arc::new(EgressPolicy::webhooks(config.webhook_allow.clone())),
                config.webhooks.timeout,
            )
            .map_err(Error::HttpClient)?;
            Some(tokio::spawn(sender.run(rx, loops.clone())))
        }
        None => None,
    };
    // Listening for SIGHUP starts here, before the server says it is ready, so a
    // SIGHUP sent from then on never meets the default action (ending the process).
    let tokens_task = if auth.executor_tokens_file_configured() {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(hup) => Some(tokio::spawn(reload_executor_tokens_on_sighup(
                auth.clone(),
                hup,
                loops.clone(),
            ))),
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGHUP; the executor tokens file is read at start only");
                None
            }
        }
    } else {
        None
    };
    let http_targets_task = tokio::spawn(
        http_targets
            .clone()
            .run(config.executors.heartbeat_interval, loops.clone()),
    );

    let (health, health_service) = tonic_health::server::health_reporter();
    set_health(&health, tonic_health::ServingStatus::Serving).await;
    let reflection_v1 = reflection_builder()
        .build_v1()
        .map_err(|e| Error::Reflection(e.to_string()))?;
    let reflection_v1alpha = reflection_builder()
        .build_v1alpha()
        .map_err(|e| Error::Reflection(e.to_string()))?;

    let jobs = Jobs::new(store.clone());
    // Executor streams end (with GoAway) together with the loops, before the servers
    // stop taking requests.
    let executors = Executors::new(
        ExecutorStore {
            runs: store.clone(),
            nodes: store.clone(),
        },
        config.executors.clone(),
        links.clone(),
        dispatcher.clone(),
        loops.clone(),
        auth,
    );
    // One instance of each service for both edges: the REST routes call the gRPC
    // implementations.
    let services = crate::api::rest::Services {
        jobs: Arc::new(JobApi::new(
            jobs.clone(),
            Destinations {
                webhooks: Arc::new(EgressPolicy::webhooks(config.webhook_allow.clone())),
                targets: Arc::new(EgressPolicy::http_targets(config.http_target_allow.clone())),
                apps: store.clone(),
            },
        )),
        runs: Arc::new(RunApi::new(
            jobs.clone(),
            store.clone(),
            dispatcher.clone(),
            loops.clone(),
        )),
        nodes: Arc::new(executors.clone()),
        apps: Arc::new(AppApi::new(store.clone())),
        audit: Arc::new(AuditApi::new(store.clone())),
        recorder: Audit::new(store.clone(), config.instance_id.clone()),
    };
    let servers_stop = CancellationToken::new();
    let grpc = grpc_builder
        .layer(crate::api::grpc_errors::layer())
        .layer(AdminAuthLayer::new(
            admin_guard.clone(),
            services.recorder.clone(),
        ))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(JobServiceServer::from_arc(services.jobs.clone()))
        .add_service(RunServiceServer::from_arc(services.runs.clone()))
        .add_service(
            ExecutorServiceServer::new(executors.clone())
                .max_decoding_message_size(MAX_EXECUTOR_MESSAGE),
        )
        .add_service(NodeServiceServer::from_arc(services.nodes.clone()))
        .add_service(AppServiceServer::from_arc(services.apps.clone()))
        .add_service(AuditServiceServer::from_arc(services.audit.clone()))
        .serve_with_incoming_shutdown(
            // Nagle's algorithm would hold a response's last segment until the
            // client's delayed ACK (tens of ms for any unary answer over one segment).
            TcpListenerStream::new(grpc_listener).inspect(|accepted| {
                if let Ok(stream) = accepted {
                    let _ = stream.set_nodelay(true);
                }
            }),
            servers_stop.clone().cancelled_owned(),
        );
    let grpc_task = tokio::spawn(grpc);
    let scrape = Scrape {
        metrics: metrics.clone(),
        links: links.clone(),
        store: store.clone(),
        health: config.dispatch.health,
    };
    let app = crate::api::rest::router(
        StatusSource {
            jobs: jobs.clone(),
            runs: store.clone(),
        },
        &services,
        admin_guard,
        scrape,
    );
    let stop = servers_stop.clone().cancelled_owned();
    let http_task = match (http_listener, https_listener) {
        (Some(l), _) => Some(tokio::spawn(
            axum::serve(
                l.tap_io(|tcp| {
                    let _ = tcp.set_nodelay(true);
                }),
                app,
            )
            .with_graceful_shutdown(stop)
            .into_future(),
        )),
        (None, Some(l)) => Some(tokio::spawn(
            axum::serve(l, app)
                .with_graceful_shutdown(stop)
                .into_future(),
        )),
        (None, None) => None,
    };

    info!(
        instance = %config.instance_id,
        grpc = %grpc_addr,
        http = ?http_addr,
        tls = config.tls.is_some(),
        mutual_tls = config.tls.as_ref().is_some_and(|t| t.mutual()),
        "sundial serving"
    );
    on_bound(Bound {
        grpc: grpc_addr,
        http: http_addr,
    });

    shutdown.cancelled().await;
    info!("shutting down: health NOT_SERVING, stopping loops");
    set_health(&health, tonic_health::ServingStatus::NotServing).await;
    loops.cancel();
    let drained = tokio::time::timeout(config.shutdown_grace, async {
        let _ = scheduler_task.await;
        let _ = dispatch_task.await;
        let _ = sweep_task.await;
        let _ = inbox_task.await;
        let _ = http_targets_task.await;
        let _ = webhooks_task.await;
        if let Some(t) = alerts_task {
            let _ = t.await;
        }
        if let Some(t) = tokens_task {
            let _ = t.await;
        }
    })
    .await;
    if drained.is_err() {
        warn!("loops did not stop within the shutdown grace period");
    }
    servers_stop.cancel();
    match tokio::time::timeout(config.shutdown_grace, grpc_task).await {
        Ok(Ok(r)) => r?,
        Ok(Err(e)) => warn!(error = %e, "grpc server task failed"),
        Err(_) => warn!("grpc server did not stop within the shutdown grace period"),
    }
    if let Some(t) = http_task {
        let _ = tokio::time::timeout(config.shutdown_grace, t).await;
    }
    info!("stopped");
    Ok(())
}

/// Reads the executor tokens file again at each SIGHUP, until `stop`: a rotation adds
/// the new token to the file, moves the executors, then removes the old one. A file
/// that cannot be read keeps the tokens in force. Never logs a token.
async fn reload_executor_tokens_on_sighup(
    auth: Arc<Authenticator>,
    mut hup: tokio::signal::unix::Signal,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            got = hup.recv() => if got.is_none() { return },
        }
        match auth.reload_executor_tokens() {
            Ok(tokens) => {
                info!(tokens, groups = ?auth.executor_groups(), "SIGHUP: executor tokens file read again")
            }
            Err(e) => {
                error!(error = %e, "SIGHUP: executor tokens file not read again; the tokens in force stay")
            }
        }
    }
}

/// Says once, at startup, which credentials are required: how many and for whom,
/// never which.
fn log_auth_mode(auth: &Authenticator) {
    if auth.admin_required() {
        let apps: Vec<&str> = auth.app_ids().collect();
        info!(
            bearer_tokens = auth.bearer_token_count(),
            read_tokens = auth.read_token_count(),
            apps = ?apps,
            "admin auth on: gRPC (but executors, health, reflection) and REST (but /healthz, /metrics) need a bearer token or an app signature; a read token may only read"
        );
    } else {
        warn!(
            "admin auth OFF (dev mode): no --bearer-token or --app-secret, so every gRPC admin/status call and REST request is accepted; keep both ports on loopback"
        );
    }
    if auth.executor_tokens_required() {
        let groups = auth.executor_groups();
        info!(groups = ?groups, "executor auth on: a hello needs its group's executor token");
    } else {
        warn!("executor auth OFF (dev mode): no --executor-token, so any executor may connect");
    }
}

/// Sets every service, and the server as a whole (""), to `status`.
async fn set_health(
    health: &tonic_health::server::HealthReporter,
    status: tonic_health::ServingStatus,
) {
    for s in SERVICES.iter().chain(&[""]) {
        health.set_service_status(*s, status).await;
    }
}

/// Reflection serves Sundial's descriptors and the health descriptors, so `grpcurl
/// list` and `describe` work with no .proto files at hand.
fn reflection_builder() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(sundial_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}
