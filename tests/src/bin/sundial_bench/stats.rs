//! Figures from samples and journals: percentiles, handler starts per run and per
//! executor.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use sundial_tests::JournalEntry;

/// min / p50 / p99 / max of a sample set, in its unit (ms here).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Spread {
    pub n: usize,
    pub min: i64,
    pub p50: i64,
    pub p99: i64,
    pub max: i64,
}

impl Spread {
    pub fn of(mut samples: Vec<i64>) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        let at = |q: f64| {
            let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
            samples[i]
        };
        Self {
            n: samples.len(),
            min: samples[0],
            p50: at(0.50),
            p99: at(0.99),
            max: samples[samples.len() - 1],
        }
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "p50 {} / p99 {} / max {} ms",
            self.p50, self.p99, self.max
        )
    }
}

/// The planned fire time (ms) a cron schedule_id names: `job_id@<ms>`.
pub fn planned_ms(schedule_id: &str) -> Option<i64> {
    schedule_id.rsplit_once('@')?.1.parse().ok()
}

/// What the journals say about handler starts.
#[derive(Debug, Default)]
pub struct Starts {
    /// The first start of each schedule_id: (unix ms, node).
    pub first: HashMap<String, (i64, String)>,
    /// Start lines beyond the first, over every executor.
    pub duplicates: usize,
    /// Schedule_ids started more than once.
    pub runs_started_twice: usize,
    /// Finish lines with SUCCEEDED.
    pub succeeded: usize,
}

impl Starts {
    pub fn of(entries: &[JournalEntry]) -> Self {
        let mut out = Starts::default();
        let mut count: HashMap<&str, usize> = HashMap::new();
        for e in entries {
            match e.event.as_str() {
                "start" => {
                    let n = count.entry(&e.schedule_id).or_default();
                    *n += 1;
                    if *n == 1 {
                        out.first
                            .insert(e.schedule_id.clone(), (e.unix_ms, e.node_id.clone()));
                    } else {
                        out.duplicates += 1;
                        if *n == 2 {
                            out.runs_started_twice += 1;
                        }
                    }
                }
                "finish" if e.status == "SUCCEEDED" => out.succeeded += 1,
                _ => {}
            }
        }
        out
    }

    /// First starts per node, for every node in `nodes` (0 for a node that ran none).
    pub fn per_node(&self, nodes: &[String]) -> BTreeMap<String, usize> {
        let mut out: BTreeMap<String, usize> = nodes.iter().map(|n| (n.clone(), 0)).collect();
        for (_, node) in self.first.values() {
            *out.entry(node.clone()).or_default() += 1;
        }
        out
    }
}

/// What must hold of a scenario's runs whatever the timing: all `expected` started,
/// none twice, none lost. One line per failure, each led by `lead`.
pub fn run_problems(
    lead: &str,
    expected: usize,
    started: usize,
    duplicates: usize,
    lost: f64,
) -> Vec<String> {
    let mut bad = Vec::new();
    if duplicates > 0 {
        bad.push(format!("{lead}{duplicates} duplicate handler starts"));
    }
    if started != expected {
        bad.push(format!("{lead}{started} of {expected} runs started"));
    }
    if lost > 0.0 {
        bad.push(format!("{lead}{lost} runs lost their lease"));
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_and_starts() {
        let s = Spread::of((1..=100).collect());
        assert_eq!((s.n, s.p50, s.p99, s.max), (100, 50, 99, 100));
        assert_eq!(Spread::of(vec![]).n, 0);
        assert_eq!(planned_ms("job-1@1700000000000"), Some(1_700_000_000_000));
        let e = |event: &str, sid: &str, node: &str| JournalEntry {
            event: event.into(),
            schedule_id: sid.into(),
            attempt: 1,
            token: 1,
            node_id: node.into(),
            unix_ms: 5,
            status: "SUCCEEDED".into(),
        };
        let st = Starts::of(&[
            e("start", "a@1", "n1"),
            e("start", "a@1", "n2"),
            e("start", "a@1", "n2"),
            e("start", "b@1", "n2"),
            e("finish", "b@1", "n2"),
        ]);
        assert_eq!(
            (st.duplicates, st.runs_started_twice, st.succeeded),
            (2, 1, 1)
        );
        let per = st.per_node(&["n1".into(), "n2".into(), "n3".into()]);
        assert_eq!(per.values().copied().collect::<Vec<_>>(), vec![1, 1, 0]);
    }

    #[test]
    fn run_problems_name_each_failure() {
        assert!(run_problems("x: ", 10, 10, 0, 0.0).is_empty());
        assert_eq!(
            run_problems("x: ", 10, 9, 2, 1.0),
            [
                "x: 2 duplicate handler starts",
                "x: 9 of 10 runs started",
                "x: 1 runs lost their lease"
            ]
        );
    }
}
