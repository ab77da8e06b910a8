//! One server instance: opens the store, starts its loops (scheduler, trigger consumer
//! and the instance's beat, the router's room, sweeper, inbox, HTTP targets, webhooks,
//! alerts, executor tokens), serves gRPC (services, health, reflection v1 + v1alpha)
//! and HTTP, and shuts all of it down in order.
//!
//! Every loop is started the same way, under one watched task set (`loops.rs`): a loop
//! that panics or returns early stops the instance with an error (non-zero exit).
//! Shutdown order: health goes NOT_SERVING (load balancers stop sending), the loops are
//! cancelled and awaited (a store operation in progress always completes), then the
//! gRPC and HTTP servers finish their in-flight requests.

mod credentials;
mod loops;
mod serve;
mod store;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::auth::{AdminGuard, Authenticator, StoreNonces};
use crate::config::Config;
use crate::deliver::alerts::{ALERT_QUEUE, Alert, AlertWebhook, Alerts};
use crate::deliver::webhooks::{Deliveries, WebhookStore};
use crate::dispatch::http_target::HttpTargets;
use crate::dispatch::links::Links;
use crate::dispatch::sweeper::Sweeper;
use crate::dispatch::{RouteStore, Router, TriggerConsumer};
use crate::egress::EgressPolicy;
use crate::metrics::Metrics;
use crate::schedule::scheduler::{Scheduler, SchedulerStats};
use crate::store::Store;
use crate::store::job_cache::JobCache;

pub use loops::{LoopFailure, Loops};
pub use serve::Bound;
pub use store::open_store;

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
    #[error("{0}")]
    Loop(#[from] LoopFailure),
}

/// Runs the instance until `shutdown` is cancelled, or until one of its loops fails
/// (then the answer is that failure, after the same orderly shutdown); `on_bound`
/// learns the real addresses once the listeners are bound.
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
    credentials::log_auth_mode(&auth);
    let listeners = serve::Listeners::bind(&config).await?;
    // Built before any loop starts, so that failing here leaves nothing running.
    let mut parts = Parts::build(&config, store, auth)?;
    let mut loops = Loops::new(CancellationToken::new());
    parts.start(&config, &mut loops);
    let guard = AdminGuard::new(
        parts.auth.clone(),
        Arc::new(StoreNonces(parts.store.clone())),
    );
    let mut served = serve::Served::start(&config, &parts, guard, listeners, loops.stop()).await?;
    on_bound(served.bound);

    let failure = tokio::select! {
        () = shutdown.cancelled() => None,
        failure = loops.first_failure() => Some(failure),
        failure = served.first_failure() => Some(failure),
    };
    info!("shutting down: health NOT_SERVING, stopping loops");
    served.not_serving().await;
    let loops_stopping = loops.stop_all(config.shutdown_grace).await;
    let servers_stopping = served.stop(config.shutdown_grace).await;
    info!("stopped");
    match failure.or(loops_stopping).or(servers_stopping) {
        Some(f) => Err(f.into()),
        None => Ok(()),
    }
}

/// What one instance runs, shared by its loops and its services.
struct Parts {
    store: Arc<dyn Store>,
    auth: Arc<Authenticator>,
    metrics: Arc<Metrics>,
    alerts: Arc<Alerts>,
    http_targets: Arc<HttpTargets>,
    deliveries: Arc<Deliveries>,
    /// The alert webhook's sender and its queue, when one is configured.
    alert_webhook: Option<(AlertWebhook, tokio::sync::mpsc::Receiver<Alert>)>,
    links: Arc<Links>,
    /// The job records the scheduler and the router share.
    job_cache: Arc<JobCache>,
    router: Arc<Router>,
    consumer: Arc<TriggerConsumer>,
}

impl Parts {
    fn build(
        config: &Config,
        store: Arc<dyn Store>,
        auth: Arc<Authenticator>,
    ) -> Result<Self, Error> {
        let metrics = Arc::new(Metrics::new());
        let alerts = Arc::new(Alerts::new(metrics.clone()));
        let webhook_egress = Arc::new(EgressPolicy::webhooks(config.webhook_allow.clone()));
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
                webhook_egress.clone(),
                alerts.clone(),
            )
            .map_err(Error::HttpClient)?,
        );
        let alert_webhook = match &config.alert_webhook {
            Some(url) => {
                let (tx, rx) = tokio::sync::mpsc::channel(ALERT_QUEUE);
                alerts.send_to(tx);
                let sender = AlertWebhook::new(
                    url.clone(),
                    config.webhooks.app_id.clone(),
                    config.webhooks.secrets.clone(),
                    config.instance_id.clone(),
                    webhook_egress,
                    config.webhooks.timeout,
                )
                .map_err(Error::HttpClient)?;
                Some((sender, rx))
            }
            None => None,
        };
        let links = Arc::new(Links::new(
            store.clone(),
            config.instance_id.clone(),
            metrics.clone(),
        ));
        let job_cache = Arc::new(JobCache::default());
        let router = Arc::new(Router::new(
            RouteStore {
                jobs: store.clone(),
                job_cache: job_cache.clone(),
                runs: store.clone(),
                nodes: store.clone(),
            },
            config.dispatch.clone(),
            links.clone(),
            http_targets.clone(),
            alerts.clone(),
        ));
        let consumer = Arc::new(TriggerConsumer::new(
            store.clone(),
            store.clone(),
            router.clone(),
        ));
        Ok(Self {
            store,
            auth,
            metrics,
            alerts,
            http_targets,
            deliveries,
            alert_webhook,
            links,
            job_cache,
            router,
            consumer,
        })
    }

    /// Starts every loop of the instance, each until `loops`' stop.
    fn start(&mut self, config: &Config, loops: &mut Loops) {
        let stop = loops.stop();
        let scheduler = Scheduler::new(
            self.store.clone(),
            config.scheduler.clone(),
            SchedulerStats::default(),
        )
        .with_alerts(self.alerts.clone())
        .with_job_cache(self.job_cache.clone());
        loops.spawn("scheduler", scheduler.run(stop.clone()));
        loops.spawn("dispatcher", self.consumer.clone().run(stop.clone()));
        loops.spawn("room", self.router.clone().refill_room(stop.clone()));
        loops.spawn(
            "instance_beat",
            self.consumer.clone().keep_alive(stop.clone()),
        );
        let sweeper = Sweeper::new(
            self.store.clone(),
            self.router.clone(),
            config.sweep.clone(),
        );
        loops.spawn("sweeper", sweeper.run(stop.clone()));
        let inbox = self.links.clone();
        loops.spawn(
            "inbox",
            inbox.run_inbox(config.dispatch.read_block, stop.clone()),
        );
        loops.spawn("forwards", self.links.clone().run_forwards(stop.clone()));
        let targets = self.http_targets.clone();
        loops.spawn(
            "http_targets",
            targets.run(config.executors.heartbeat_interval, stop.clone()),
        );
        loops.spawn("webhooks", self.deliveries.clone().run(stop.clone()));
        if let Some((sender, queue)) = self.alert_webhook.take() {
            loops.spawn("alert_webhook", sender.run(queue, stop.clone()));
        }
        // Listening for SIGHUP starts here, before the server says it is ready, so a
        // SIGHUP sent from then on never meets the default action (ending the process).
        if self.auth.executor_tokens_file_configured() {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
                Ok(hup) => loops.spawn(
                    "executor_tokens",
                    credentials::reload_executor_tokens_on_sighup(self.auth.clone(), hup, stop),
                ),
                Err(e) => {
                    warn!(error = %e, "cannot listen for SIGHUP; the executor tokens file is read at start only");
                }
            }
        }
    }
}
