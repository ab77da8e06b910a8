//! The instance's two listeners and what they serve: gRPC (the services, health,
//! reflection v1 + v1alpha, behind the error and admin-auth layers) and HTTP (REST,
//! `/healthz`, `/metrics`), TLS on both when configured. Each server runs as a loop of
//! its own set, stopped after the instance's loops.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

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
use tonic_health::pb::health_server::{Health, HealthServer};
use tracing::{error, info};

use super::{Error, Loops, Parts};
use crate::api::destinations::Destinations;
use crate::api::grpc_auth::AdminAuthLayer;
use crate::api::queries::StatusSource;
use crate::api::rest::Services;
use crate::api::scrape::Scrape;
use crate::api::{AppApi, Audit, AuditApi, JobApi, RunApi};
use crate::auth::AdminGuard;
use crate::config::Config;
use crate::dispatch::executors::{ExecutorStore, Executors};
use crate::egress::EgressPolicy;
use crate::schedule::jobs::Jobs;
use crate::tls::TlsListener;

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

/// The bound listeners, TLS set up (before any loop starts: the files were checked
/// with the configuration; this only builds the acceptors).
pub struct Listeners {
    grpc: TcpListener,
    grpc_builder: tonic::transport::Server,
    http: Option<TcpListener>,
    https: Option<TlsListener>,
    bound: Bound,
}

impl Listeners {
    pub async fn bind(config: &Config) -> Result<Self, Error> {
        let bind_error = |addr| move |source| Error::Bind { addr, source };
        let grpc = TcpListener::bind(config.listen)
            .await
            .map_err(bind_error(config.listen))?;
        let grpc_addr = grpc.local_addr().map_err(bind_error(config.listen))?;
        let mut http = match config.http_listen {
            Some(addr) => Some(TcpListener::bind(addr).await.map_err(bind_error(addr))?),
            None => None,
        };
        let http_addr = http.as_ref().and_then(|l| l.local_addr().ok());
        let mut grpc_builder = tonic::transport::Server::builder();
        let mut https = None;
        if let Some(tls) = &config.tls {
            grpc_builder = grpc_builder.tls_config(tls.grpc())?;
            if let (Some(l), Some(addr)) = (http.take(), config.http_listen) {
                https = Some(tls.http_listener(l).map_err(bind_error(addr))?);
            }
        }
        Ok(Self {
            grpc,
            grpc_builder,
            http,
            https,
            bound: Bound {
                grpc: grpc_addr,
                http: http_addr,
            },
        })
    }
}

/// The servers, running.
pub struct Served {
    pub bound: Bound,
    health: tonic_health::server::HealthReporter,
    servers: Loops,
}

impl Served {
    /// Builds the services over `parts` and starts serving; executor streams and log
    /// follows end with `loops_stop` (with the loops, before the servers stop).
    pub async fn start(
        config: &Config,
        parts: &Parts,
        guard: AdminGuard,
        listeners: Listeners,
        loops_stop: CancellationToken,
    ) -> Result<Self, Error> {
        let (health, health_service) = tonic_health::server::health_reporter();
        set_health(&health, tonic_health::ServingStatus::Serving).await;
        let (services, executors) = services(config, parts, loops_stop);
        let mut servers = Loops::new(CancellationToken::new());
        let Listeners {
            grpc,
            grpc_builder,
            http,
            https,
            bound,
        } = listeners;
        let grpc = grpc_server(
            grpc_builder,
            grpc,
            &services,
            executors,
            &guard,
            health_service,
            servers.stop(),
        )?;
        servers.spawn("grpc_server", async move {
            if let Err(e) = grpc.await {
                error!(error = %e, "the gRPC server failed");
            }
        });
        let app = http_app(config, parts, &services, guard);
        let stop = servers.stop().cancelled_owned();
        match (http, https) {
            (Some(l), _) => {
                let l = l.tap_io(|tcp| {
                    let _ = tcp.set_nodelay(true);
                });
                servers.spawn("http_server", serve_http(l, app, stop));
            }
            (None, Some(l)) => servers.spawn("http_server", serve_http(l, app, stop)),
            (None, None) => {}
        }
        info!(
            instance = %config.instance_id,
            grpc = %bound.grpc,
            http = ?bound.http,
            tls = config.tls.is_some(),
            mutual_tls = config.tls.as_ref().is_some_and(|t| t.mutual()),
            "sundial serving"
        );
        Ok(Self {
            bound,
            health,
            servers,
        })
    }

    /// Waits until the gRPC or HTTP server ends before it was asked to (an error it
    /// logged), and says which; pending forever while both serve.
    pub async fn first_failure(&mut self) -> super::LoopFailure {
        self.servers.first_failure().await
    }

    /// Health says NOT_SERVING, so load balancers stop sending.
    pub async fn not_serving(&self) {
        set_health(&self.health, tonic_health::ServingStatus::NotServing).await;
    }

    /// The servers finish their in-flight requests (up to `grace`) and stop; a panic
    /// while stopping is answered.
    pub async fn stop(self, grace: Duration) -> Option<super::LoopFailure> {
        self.servers.stop_all(grace).await
    }
}

/// One instance of each service for both edges (the REST routes call the gRPC
/// implementations), and the executor service.
fn services(
    config: &Config,
    parts: &Parts,
    loops_stop: CancellationToken,
) -> (Services, Executors) {
    let store = &parts.store;
    let jobs = Jobs::new(store.clone());
    let executors = Executors::new(
        ExecutorStore {
            runs: store.clone(),
            nodes: store.clone(),
        },
        config.executors.clone(),
        parts.links.clone(),
        parts.router.clone(),
        loops_stop.clone(),
        parts.auth.clone(),
    )
    .with_webhooks(parts.deliveries.clone());
    let services = Services {
        jobs: Arc::new(JobApi::new(
            jobs.clone(),
            Destinations {
                webhooks: Arc::new(EgressPolicy::webhooks(config.webhook_allow.clone())),
                targets: Arc::new(EgressPolicy::http_targets(config.http_target_allow.clone())),
                apps: store.clone(),
            },
        )),
        runs: Arc::new(RunApi::new(
            jobs,
            store.clone(),
            parts.router.clone(),
            loops_stop,
        )),
        nodes: Arc::new(executors.clone()),
        apps: Arc::new(AppApi::new(store.clone())),
        audit: Arc::new(AuditApi::new(store.clone())),
        recorder: Audit::new(store.clone(), config.instance_id.clone()),
    };
    (services, executors)
}

/// The gRPC server over `listener`, serving until `stop`.
fn grpc_server(
    builder: tonic::transport::Server,
    listener: TcpListener,
    services: &Services,
    executors: Executors,
    guard: &AdminGuard,
    health_service: HealthServer<impl Health>,
    stop: CancellationToken,
) -> Result<impl Future<Output = Result<(), tonic::transport::Error>> + Send + 'static, Error> {
    let reflection_v1 = reflection_builder()
        .build_v1()
        .map_err(|e| Error::Reflection(e.to_string()))?;
    let reflection_v1alpha = reflection_builder()
        .build_v1alpha()
        .map_err(|e| Error::Reflection(e.to_string()))?;
    // Nagle's algorithm would hold a response's last segment until the client's
    // delayed ACK (tens of ms for any unary answer over one segment).
    let incoming = TcpListenerStream::new(listener).inspect(|accepted| {
        if let Ok(stream) = accepted {
            let _ = stream.set_nodelay(true);
        }
    });
    Ok(builder
        .layer(crate::api::grpc_errors::layer())
        .layer(AdminAuthLayer::new(
            guard.clone(),
            services.recorder.clone(),
        ))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(JobServiceServer::from_arc(services.jobs.clone()))
        .add_service(RunServiceServer::from_arc(services.runs.clone()))
        .add_service(
            ExecutorServiceServer::new(executors).max_decoding_message_size(MAX_EXECUTOR_MESSAGE),
        )
        .add_service(NodeServiceServer::from_arc(services.nodes.clone()))
        .add_service(AppServiceServer::from_arc(services.apps.clone()))
        .add_service(AuditServiceServer::from_arc(services.audit.clone()))
        .serve_with_incoming_shutdown(incoming, stop.cancelled_owned()))
}

/// Serves `app` on `listener` (plain TCP or TLS) until `stop`.
async fn serve_http<L>(
    listener: L,
    app: axum::Router,
    stop: impl Future<Output = ()> + Send + 'static,
) where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
    {
        error!(error = %e, "the HTTP server failed");
    }
}

/// The HTTP routes: REST over the same services, the web console (unless turned
/// off), `/healthz`, `/metrics`.
fn http_app(
    config: &Config,
    parts: &Parts,
    services: &Services,
    guard: AdminGuard,
) -> axum::Router {
    let scrape = Scrape {
        metrics: parts.metrics.clone(),
        links: parts.links.clone(),
        store: parts.store.clone(),
        health: config.dispatch.health,
    };
    let console = if config.console {
        crate::api::console::router()
    } else {
        axum::Router::new()
    };
    crate::api::rest::router(
        StatusSource {
            jobs: Jobs::new(parts.store.clone()),
            runs: parts.store.clone(),
        },
        services,
        guard,
        scrape,
        console,
    )
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
