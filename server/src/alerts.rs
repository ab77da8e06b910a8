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

/// Raises an alert: logs it at error level and counts it.
pub fn raise(metrics: &Metrics, kind: AlertKind, job_id: &str, schedule_id: &str, detail: &str) {
    metrics.alert(kind);
    tracing::error!(
        alert = kind.as_str(),
        %job_id,
        %schedule_id,
        %detail,
        "alert: {kind}"
    );
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
