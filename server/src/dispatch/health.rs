//! Node health: each node's rolling window of results (kept by the instance holding
//! its stream and published in its registry record), and the one rule that turns a
//! registry record into a health state — which decides whether routing gives the node
//! work, prefers others, or leaves it out.

use std::collections::VecDeque;
use std::time::Duration;

use crate::model::Millis;
use crate::store::NodeRecord;

/// The thresholds of [`classify`]; every one configurable (`--health-window`,
/// `--health-min-results`, `--slow-below`, `--drop-below`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HealthPolicy {
    /// Results older than this no longer count.
    pub window: Duration,
    /// Below this many results in the window a node is judged healthy: too few to say.
    pub min_results: u32,
    /// Success rate under which a node is SLOW: it gets work only when no healthy
    /// node can take it.
    pub slow_below: f64,
    /// Success rate under which a node is FAILING: it gets no work until its failures
    /// age out of the window.
    pub drop_below: f64,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(3600),
            min_results: 5,
            slow_below: 0.9,
            drop_below: 0.5,
        }
    }
}

/// What routing does with a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Healthy,
    /// Deprioritised: success rate under `slow_below`.
    Slow,
    /// Dropped from routing: success rate under `drop_below`.
    Failing,
    /// Connected but declared itself not ready.
    NotReady,
    /// Asked to drain: finishes what it holds, takes nothing new.
    Draining,
    /// Left a dispatch unanswered and sent nothing for `--silent-after` (frozen, cut
    /// off): no new work until it is heard from again.
    Unresponsive,
}

impl Health {
    /// Every health, in the order metrics list them.
    pub const ALL: [Health; 6] = [
        Health::Healthy,
        Health::Slow,
        Health::Failing,
        Health::NotReady,
        Health::Draining,
        Health::Unresponsive,
    ];

    /// The stable name (the `health` label of `sundial_executor_nodes`).
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => "HEALTHY",
            Health::Slow => "SLOW",
            Health::Failing => "FAILING",
            Health::NotReady => "NOT_READY",
            Health::Draining => "DRAINING",
            Health::Unresponsive => "UNRESPONSIVE",
        }
    }

    /// Whether routing may give the node new work at all.
    pub fn routable(self) -> bool {
        matches!(self, Health::Healthy | Health::Slow)
    }
}

/// Successes over results in the node's window; 1 when it has none.
pub fn success_rate(node: &NodeRecord) -> f64 {
    if node.recent_results == 0 {
        1.0
    } else {
        f64::from(node.recent_results.saturating_sub(node.recent_errors))
            / f64::from(node.recent_results)
    }
}

/// The node's health by its registry record. (A node that stopped heartbeating is not
/// in the registry at all: evicted.)
pub fn classify(node: &NodeRecord, policy: &HealthPolicy) -> Health {
    if node.draining {
        return Health::Draining;
    }
    if node.silent_since > 0 {
        return Health::Unresponsive;
    }
    if !node.ready {
        return Health::NotReady;
    }
    if node.recent_results < policy.min_results.max(1) {
        return Health::Healthy;
    }
    let rate = success_rate(node);
    if rate < policy.drop_below {
        Health::Failing
    } else if rate < policy.slow_below {
        Health::Slow
    } else {
        Health::Healthy
    }
}

/// A node's results over the health window, as the instance holding its stream saw
/// them (started afresh when the node reconnects), with their running totals so that
/// publishing them costs the same whatever the window holds.
#[derive(Debug, Default)]
pub struct ResultWindow {
    /// (finished at, succeeded, duration in ms if known), oldest first.
    recent: VecDeque<(Millis, bool, Option<u64>)>,
    /// Failures among `recent`.
    errors: u32,
    /// Sum and count of the known durations among `recent`.
    duration_sum: u64,
    durations: u64,
}

impl ResultWindow {
    /// At most this many results are kept, however long the window.
    const CAP: usize = 10_000;

    pub fn record(&mut self, now: Millis, ok: bool, duration_ms: Option<u64>) {
        if self.recent.len() == Self::CAP {
            self.forget_oldest();
        }
        self.recent.push_back((now, ok, duration_ms));
        if !ok {
            self.errors = self.errors.saturating_add(1);
        }
        if let Some(d) = duration_ms {
            self.duration_sum = self.duration_sum.saturating_add(d);
            self.durations += 1;
        }
    }

    fn forget_oldest(&mut self) {
        let Some((_, ok, d)) = self.recent.pop_front() else {
            return;
        };
        if !ok {
            self.errors = self.errors.saturating_sub(1);
        }
        if let Some(d) = d {
            self.duration_sum = self.duration_sum.saturating_sub(d);
            self.durations = self.durations.saturating_sub(1);
        }
    }

    /// Forgets results older than the window, then writes what is left into the node
    /// record (published with its next registry write).
    pub fn apply(&mut self, node: &mut NodeRecord, now: Millis, window: Duration) {
        let cutoff = now.saturating_sub(crate::model::duration_ms(window));
        while self.recent.front().is_some_and(|(at, _, _)| *at < cutoff) {
            self.forget_oldest();
        }
        node.mean_duration_ms = self.duration_sum.checked_div(self.durations).unwrap_or(0);
        node.recent_results = u32::try_from(self.recent.len()).unwrap_or(u32::MAX);
        node.recent_errors = self.errors;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(results: u32, errors: u32) -> NodeRecord {
        NodeRecord {
            node_id: "n".into(),
            group: "g".into(),
            handlers: vec!["h".into()],
            weight: 1,
            max_concurrency: 0,
            labels: Default::default(),
            instance: "i".into(),
            session: String::new(),
            ready: true,
            draining: false,
            silent_since: 0,
            active: 0,
            leased: 0,
            load: 0.0,
            mean_duration_ms: 0,
            recent_errors: errors,
            recent_results: results,
            connected_at: 0,
            last_heartbeat: 0,
        }
    }

    #[test]
    fn thresholds_decide_slow_and_failing_once_there_are_enough_results() {
        let p = HealthPolicy::default();
        assert_eq!(classify(&node(0, 0), &p), Health::Healthy);
        assert_eq!(classify(&node(4, 4), &p), Health::Healthy, "too few to say");
        assert_eq!(classify(&node(10, 0), &p), Health::Healthy);
        assert_eq!(
            classify(&node(10, 1), &p),
            Health::Healthy,
            "0.9 is not under 0.9"
        );
        assert_eq!(classify(&node(10, 2), &p), Health::Slow);
        assert_eq!(
            classify(&node(10, 5), &p),
            Health::Slow,
            "0.5 is not under 0.5"
        );
        assert_eq!(classify(&node(10, 6), &p), Health::Failing);
        assert_eq!(classify(&node(5, 5), &p), Health::Failing);
    }

    #[test]
    fn draining_and_not_ready_win_over_the_figures() {
        let p = HealthPolicy::default();
        let mut n = node(10, 0);
        n.ready = false;
        assert_eq!(classify(&n, &p), Health::NotReady);
        n.draining = true;
        assert_eq!(classify(&n, &p), Health::Draining);
        assert!(!Health::Draining.routable() && !Health::NotReady.routable());
        assert!(!Health::Failing.routable());
        assert!(Health::Slow.routable() && Health::Healthy.routable());
    }

    #[test]
    fn the_window_forgets_old_results() {
        let mut w = ResultWindow::default();
        let mut n = node(0, 0);
        let window = Duration::from_secs(60);
        for i in 0..5 {
            w.record(1_000 + i, false, Some(100));
        }
        w.record(50_000, true, Some(300));
        w.apply(&mut n, 60_000, window);
        assert_eq!((n.recent_results, n.recent_errors), (6, 5));
        assert_eq!(n.mean_duration_ms, (5 * 100 + 300) / 6);
        // 70 s later the five failures (at ~1 s) are out of the 60 s window.
        w.apply(&mut n, 62_000, window);
        assert_eq!((n.recent_results, n.recent_errors), (1, 0));
        assert_eq!(n.mean_duration_ms, 300);
        w.apply(&mut n, 200_000, window);
        assert_eq!((n.recent_results, n.mean_duration_ms), (0, 0));
        assert!((success_rate(&n) - 1.0).abs() < f64::EPSILON);
    }

    #[test]
    fn the_window_keeps_its_totals_past_its_cap() {
        let mut w = ResultWindow::default();
        let mut n = node(0, 0);
        // A failure without a duration, then a full window of successes: the failure
        // is pushed out, and the totals with it.
        w.record(1_000, false, None);
        w.record(1_000, false, Some(7_000));
        for _ in 0..ResultWindow::CAP - 1 {
            w.record(2_000, true, Some(10));
        }
        w.apply(&mut n, 3_000, Duration::from_secs(60));
        let cap = u32::try_from(ResultWindow::CAP).expect("cap");
        assert_eq!((n.recent_results, n.recent_errors), (cap, 1));
        assert_eq!(
            n.mean_duration_ms,
            (7_000 + 10 * (ResultWindow::CAP as u64 - 1)) / ResultWindow::CAP as u64
        );
        w.record(2_000, true, Some(10));
        w.apply(&mut n, 3_000, Duration::from_secs(60));
        assert_eq!(
            (n.recent_results, n.recent_errors, n.mean_duration_ms),
            (cap, 0, 10)
        );
    }
}
