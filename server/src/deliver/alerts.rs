//! Alerts: the kinds of event an operator must hear about, and [`Alerts::raise`], the
//! one way to raise one — an error-level log line with the stable fields `alert` (the
//! kind), `job_id`, `schedule_id` and `detail`, and `sundial_alerts_total{kind}`
//! (counted through the instance's [`Metrics`], which knows nothing of alerts).
//!
//! Each alert is raised by the instance that applied the event (a store transition or
//! a won claim), so one event raises one alert across the cluster. Who raises what:
//! `run_failed` and `run_lost` come from [`Alerts::record_transition`] (which also
//! counts the transition in the metrics),
//! `misfire` and `late_fire` from the scheduler, `callback_failed` from the webhook
//! delivery worker (when a delivery ends CALLBACK_FAILED).
//!
//! Log lines can be matched on `alert=` (e.g. `alert="run_failed"` in JSON logs, or
//! `alert=run_failed` in the default format).
//!
//! With `--alert-webhook-url`, every alert is also POSTed there by [`AlertWebhook`]
//! (JSON, signed like result webhooks). That path is best effort: a bounded queue
//! (an alert that finds it full is dropped, and says so in the log) and three attempts;
//! the log line and the counter are the record.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::Serialize;
use sundial_sdk::webhook::{self, Secret};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::egress::{self, EgressPolicy};
use crate::metrics::Metrics;
use crate::model::{RunState, split_schedule_id};
use crate::store::{Applied, Transition};

/// What an alert is about; [`AlertKind::as_str`] is the stable name in logs and in the
/// `kind` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlertKind {
    /// A run ended FAILED or TIMED_OUT (its attempts are spent).
    RunFailed,
    /// A run's executor stopped renewing its lease; the run was retried or failed.
    RunLost,
    /// A fire claimed later than the misfire threshold was skipped (policy SKIP).
    Misfire,
    /// A fire claimed later than the misfire threshold still ran (FIRE_ONCE,
    /// CATCH_UP).
    LateFire,
    /// A webhook delivery gave up: CALLBACK_FAILED.
    CallbackFailed,
}

impl AlertKind {
    pub const ALL: [AlertKind; 5] = [
        AlertKind::RunFailed,
        AlertKind::RunLost,
        AlertKind::Misfire,
        AlertKind::LateFire,
        AlertKind::CallbackFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AlertKind::RunFailed => "run_failed",
            AlertKind::RunLost => "run_lost",
            AlertKind::Misfire => "misfire",
            AlertKind::LateFire => "late_fire",
            AlertKind::CallbackFailed => "callback_failed",
        }
    }
}

impl std::fmt::Display for AlertKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The instance's alert handle, shared by `Arc` with every component that raises:
/// the metrics the alerts are counted in, and the alert webhook's queue once one is
/// configured.
pub struct Alerts {
    metrics: Arc<Metrics>,
    /// Where raised alerts also go (the alert webhook), when one is configured.
    webhook: OnceLock<mpsc::Sender<Alert>>,
}

impl Alerts {
    /// Alerts counted in `metrics`; every kind's series exists at 0 from the start.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        for kind in AlertKind::ALL {
            metrics.declare_alert(kind.as_str());
        }
        Self {
            metrics,
            webhook: OnceLock::new(),
        }
    }

    /// Alerts counted in a registry of their own (that nobody reads).
    pub fn unread() -> Self {
        Self::new(Arc::new(Metrics::new()))
    }

    /// The metrics the alerts are counted in; components that raise alerts record
    /// their other figures there too.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Sends every alert raised from now on to `queue` too (set once, at startup).
    pub fn send_to(&self, queue: mpsc::Sender<Alert>) {
        let _ = self.webhook.set(queue);
    }

    /// Raises an alert: logs it at error level, counts it, and queues it for the alert
    /// webhook if there is one.
    pub fn raise(&self, kind: AlertKind, job_id: &str, schedule_id: &str, detail: &str) {
        self.metrics.alert_raised(kind.as_str());
        tracing::error!(
            alert = kind.as_str(),
            %job_id,
            %schedule_id,
            %detail,
            "alert: {kind}"
        );
        if let Some(queue) = self.webhook.get() {
            let alert = Alert {
                alert: kind.as_str(),
                job_id: job_id.to_owned(),
                schedule_id: schedule_id.to_owned(),
                detail: detail.to_owned(),
                raised_at_ms: crate::model::now_ms(),
            };
            if queue.try_send(alert).is_err() {
                warn!(alert = kind.as_str(), %schedule_id, "the alert webhook's queue is full; this alert is only logged");
            }
        }
    }

    /// Counts what an applied transition did to its run ([`Metrics::record_transition`])
    /// and raises its run alert: `run_lost` for a lost lease (retried or not),
    /// otherwise `run_failed` for a final FAILED or TIMED_OUT. Does nothing unless the
    /// store applied it (`Applied::Yes`).
    pub fn record_transition(&self, t: &Transition) {
        self.metrics.record_transition(t);
        let Some(run) = t.run.as_ref().filter(|_| t.applied == Applied::Yes) else {
            return;
        };
        let (job_id, _) = split_schedule_id(&run.schedule_id).unwrap_or((&run.job_id, ""));
        if run.lost_its_lease() {
            let then = if run.state == RunState::Waiting {
                format!("retried as attempt {}", run.attempt)
            } else {
                "attempts spent: FAILED".to_owned()
            };
            self.raise(
                AlertKind::RunLost,
                job_id,
                &run.schedule_id,
                &format!(
                    "the executor {:?} stopped renewing its lease; {then}",
                    run.node_id
                ),
            );
        } else if matches!(run.state, RunState::Failed | RunState::TimedOut) {
            self.raise(
                AlertKind::RunFailed,
                job_id,
                &run.schedule_id,
                &format!(
                    "run {} after {} attempt(s): {} {}",
                    run.state, run.attempt, run.error_code, run.error_message
                ),
            );
        }
    }
}

/// One alert as the alert webhook POSTs it (plus `instance`, added by the sender).
#[derive(Debug, Clone, Serialize)]
pub struct Alert {
    pub alert: &'static str,
    pub job_id: String,
    pub schedule_id: String,
    pub detail: String,
    pub raised_at_ms: i64,
}

/// How many alerts may wait for the alert webhook.
pub const ALERT_QUEUE: usize = 1024;

/// Sends queued alerts to the alert webhook: JSON `{alert, job_id, schedule_id,
/// detail, raised_at_ms, instance}`, signed with the webhook secrets (both schemes;
/// `webhook-id` = `alert-<uuid>`), under the webhook egress policy, no redirects.
pub struct AlertWebhook {
    url: url::Url,
    app_id: String,
    secrets: Vec<Secret>,
    instance: String,
    egress: Arc<EgressPolicy>,
    client: reqwest::Client,
}

impl AlertWebhook {
    pub fn new(
        url: url::Url,
        app_id: String,
        secrets: Vec<Secret>,
        instance: String,
        egress: Arc<EgressPolicy>,
        timeout: Duration,
    ) -> Result<Self, reqwest::Error> {
        let client = egress::client_builder(egress.clone())
            .timeout(timeout)
            .user_agent(concat!("Sundial-Alert/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self {
            url,
            app_id,
            secrets,
            instance,
            egress,
            client,
        })
    }

    /// Sends what `queue` brings until `shutdown`.
    pub async fn run(self, mut queue: mpsc::Receiver<Alert>, shutdown: CancellationToken) {
        info!(url = %self.url, "alert webhook started");
        loop {
            let alert = tokio::select! {
                () = shutdown.cancelled() => break,
                a = queue.recv() => match a {
                    Some(a) => a,
                    None => break,
                },
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = self.send(&alert) => {}
            }
        }
        info!("alert webhook stopped");
    }

    async fn send(&self, alert: &Alert) {
        #[derive(Serialize)]
        struct Body<'a> {
            #[serde(flatten)]
            alert: &'a Alert,
            instance: &'a str,
        }
        let body = match serde_json::to_vec(&Body {
            alert,
            instance: &self.instance,
        }) {
            Ok(b) => b,
            Err(e) => {
                warn!(error = %e, "encoding an alert failed");
                return;
            }
        };
        if let Err(e) = self.egress.check_url(&self.url) {
            warn!(error = %e, "the alert webhook's address is refused by the egress policy");
            return;
        }
        let id = format!("alert-{}", uuid::Uuid::now_v7());
        let mut delay = Duration::from_secs(1);
        for attempt in 1..=3 {
            let timestamp = crate::auth::unix_now();
            let nonce = format!("{:032x}", rand::random::<u128>());
            let mut req = self
                .client
                .post(self.url.clone())
                .header(reqwest::header::CONTENT_TYPE, "application/json");
            for (name, value) in
                webhook::headers(&self.app_id, &self.secrets, &id, timestamp, &nonce, &body)
            {
                req = req.header(name, value);
            }
            match req.body(body.clone()).send().await {
                Ok(r) if r.status().is_success() => {
                    debug!(alert = alert.alert, attempt, "alert webhook delivered");
                    return;
                }
                Ok(r) => warn!(
                    alert = alert.alert,
                    attempt,
                    status = r.status().as_u16(),
                    "the alert webhook answered an error"
                ),
                Err(e) => {
                    warn!(alert = alert.alert, attempt, error = %e, "the alert webhook could not be reached")
                }
            }
            tokio::time::sleep(delay).await;
            delay *= 5;
        }
        warn!(alert = alert.alert, schedule_id = %alert.schedule_id, "alert webhook gave up after 3 attempts; the alert is in the log");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::tests::{applied, run, sample};
    use crate::store::Applied;

    #[test]
    fn every_kind_has_a_distinct_name_and_is_counted() {
        let a = Alerts::unread();
        for k in AlertKind::ALL {
            a.raise(k, "job", "job@1", "test");
        }
        let text = a.metrics().render();
        for k in AlertKind::ALL {
            assert!(
                text.contains(&format!("sundial_alerts_total{{kind=\"{k}\"}} 1")),
                "{k}: {text}"
            );
        }
    }

    #[test]
    fn run_alerts_come_from_applied_transitions_only_and_a_lost_run_once() {
        let a = Alerts::unread();
        let mut refused = applied(run(RunState::Failed, ""));
        refused.applied = Applied::No("stale fencing token".into());
        a.record_transition(&refused);
        let mut already = applied(run(RunState::Succeeded, ""));
        already.applied = Applied::Already;
        a.record_transition(&already);
        a.record_transition(&applied(run(RunState::Running, "")));
        a.record_transition(&applied(run(RunState::Waiting, "rejected: busy")));
        a.record_transition(&applied(run(RunState::Waiting, "unconfirmed")));
        let text = a.metrics().render();
        for kind in AlertKind::ALL {
            assert_eq!(
                sample(&text, &format!("sundial_alerts_total{{kind=\"{kind}\"}}")),
                Some(0.0),
                "{kind}: present from the start, and still 0"
            );
        }

        a.record_transition(&applied(run(RunState::Succeeded, "")));
        a.record_transition(&applied(run(RunState::Failed, "")));
        a.record_transition(&applied(run(RunState::Waiting, "retry: E1")));
        a.record_transition(&applied(run(RunState::Waiting, "retry: lost")));
        a.record_transition(&applied(run(RunState::Failed, "lost")));
        a.record_transition(&applied(run(RunState::TimedOut, "timeout")));
        let text = a.metrics().render();
        assert_eq!(
            sample(&text, r#"sundial_alerts_total{kind="run_lost"}"#),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, r#"sundial_alerts_total{kind="run_failed"}"#),
            Some(2.0),
            "the failure and the timeout; the lost run is alerted once, as lost"
        );
        assert_eq!(
            sample(&text, "sundial_runs_lost_total"),
            Some(2.0),
            "the transitions are counted in the metrics too"
        );
    }
}
