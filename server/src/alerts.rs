//! Alerts: the kinds of event an operator must hear about, and [`raise`], the one way
//! to raise one — an error-level log line with the stable fields `alert` (the kind),
//! `job_id`, `schedule_id` and `detail`, and `sundial_alerts_total{kind}`.
//!
//! Each alert is raised by the instance that applied the event (a store transition or
//! a won claim), so one event raises one alert across the cluster. Who raises what:
//! `run_failed` and `run_lost` come from [`crate::metrics::Metrics::record_transition`],
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

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use sundial_sdk::webhook::{self, Secret};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::egress::{self, EgressPolicy};
use crate::metrics::Metrics;

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

/// Raises an alert: logs it at error level, counts it, and queues it for the alert
/// webhook if there is one.
pub fn raise(metrics: &Metrics, kind: AlertKind, job_id: &str, schedule_id: &str, detail: &str) {
    metrics.alert(kind);
    tracing::error!(
        alert = kind.as_str(),
        %job_id,
        %schedule_id,
        %detail,
        "alert: {kind}"
    );
    if let Some(sink) = metrics.alert_sink() {
        let alert = Alert {
            alert: kind.as_str(),
            job_id: job_id.to_owned(),
            schedule_id: schedule_id.to_owned(),
            detail: detail.to_owned(),
            raised_at_ms: crate::model::now_ms(),
        };
        if sink.try_send(alert).is_err() {
            warn!(alert = kind.as_str(), %schedule_id, "the alert webhook's queue is full; this alert is only logged");
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

    #[test]
    fn every_kind_has_a_distinct_name_and_is_counted() {
        let m = Metrics::new();
        for k in AlertKind::ALL {
            raise(&m, k, "job", "job@1", "test");
        }
        let text = m.render();
        for k in AlertKind::ALL {
            assert!(
                text.contains(&format!("sundial_alerts_total{{kind=\"{k}\"}} 1")),
                "{k}: {text}"
            );
        }
    }
}
