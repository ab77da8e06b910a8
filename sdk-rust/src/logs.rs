//! Log lines of runs on their way to the server. Lines are batched per run into
//! `LogLines` messages: a batch goes out when it holds `max_lines` lines or its oldest
//! line is `max_delay` old, and a run's whole batch is taken out before its `Result`,
//! so that the server sees a run's lines before its outcome. While no server can be
//! reached the lines wait, at most `cap` per run; beyond that they are dropped and
//! counted, and the count is reported as one more line.
//!
//! Lines are best-effort: unlike results, a line handed to a stream that then breaks is
//! not sent again. Nothing here touches the network or reads a clock.

use std::collections::HashMap;
use std::time::Duration;

use sundial_proto::v1 as pb;
use tokio::time::Instant;

use crate::runs::RunKey;

#[derive(Debug)]
pub(crate) struct LogBatcher {
    max_lines: usize,
    max_delay: Duration,
    cap: usize,
    runs: HashMap<RunKey, Batch>,
}

#[derive(Debug)]
struct Batch {
    lines: Vec<pb::LogEntry>,
    /// When the oldest waiting line arrived.
    since: Instant,
    /// Lines refused because `cap` were already waiting.
    dropped: u64,
}

impl LogBatcher {
    pub fn new(max_lines: usize, max_delay: Duration, cap: usize) -> Self {
        let max_lines = max_lines.max(1);
        Self {
            max_lines,
            max_delay,
            cap: cap.max(max_lines),
            runs: HashMap::new(),
        }
    }

    /// Adds a line to its run's batch.
    pub fn push(&mut self, key: &RunKey, line: pb::LogEntry, now: Instant) {
        let batch = self.runs.entry(key.clone()).or_insert_with(|| Batch {
            lines: Vec::new(),
            since: now,
            dropped: 0,
        });
        if batch.lines.len() >= self.cap {
            batch.dropped += 1;
        } else {
            batch.lines.push(line);
        }
    }

    /// The run's batch holds `max_lines` lines: it should go out now.
    pub fn is_full(&self, key: &RunKey) -> bool {
        self.runs
            .get(key)
            .is_some_and(|b| b.lines.len() >= self.max_lines)
    }

    /// When the oldest waiting batch is due.
    pub fn next_flush(&self) -> Option<Instant> {
        self.runs.values().map(|b| b.since + self.max_delay).min()
    }

    /// The batches that are due at `now` or full.
    pub fn take_due(&mut self, now: Instant) -> Vec<pb::LogLines> {
        let mut due: Vec<RunKey> = self
            .runs
            .iter()
            .filter(|(_, b)| b.since + self.max_delay <= now || b.lines.len() >= self.max_lines)
            .map(|(k, _)| k.clone())
            .collect();
        due.sort();
        due.iter().flat_map(|k| self.take(k)).collect()
    }

    /// Everything waiting for one run, as messages of at most `max_lines` lines.
    pub fn take(&mut self, key: &RunKey) -> Vec<pb::LogLines> {
        let Some(mut batch) = self.runs.remove(key) else {
            return Vec::new();
        };
        if batch.dropped > 0 {
            let time_ms = batch.lines.last().map_or(0, |l| l.time_ms);
            batch.lines.push(pb::LogEntry {
                time_ms,
                level: "warn".into(),
                message: format!(
                    "{} log lines dropped while the server could not be reached",
                    batch.dropped
                ),
            });
        }
        batch
            .lines
            .chunks(self.max_lines)
            .map(|lines| pb::LogLines {
                run: Some(key.to_proto()),
                lines: lines.to_vec(),
            })
            .collect()
    }

    /// Everything waiting, for every run.
    pub fn take_all(&mut self) -> Vec<pb::LogLines> {
        let mut keys: Vec<RunKey> = self.runs.keys().cloned().collect();
        keys.sort();
        keys.iter().flat_map(|k| self.take(k)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAY: Duration = Duration::from_millis(100);

    fn key(id: &str) -> RunKey {
        RunKey {
            schedule_id: id.into(),
            attempt: 1,
            shard_index: 0,
            fencing_token: 9,
        }
    }

    fn line(n: i64) -> pb::LogEntry {
        pb::LogEntry {
            time_ms: n,
            level: "info".into(),
            message: format!("line {n}"),
        }
    }

    fn count(msgs: &[pb::LogLines]) -> usize {
        msgs.iter().map(|m| m.lines.len()).sum()
    }

    #[test]
    fn a_batch_is_due_when_full_or_old() {
        let t0 = Instant::now();
        let mut b = LogBatcher::new(3, DELAY, 100);
        let (a, z) = (key("a"), key("z"));
        assert_eq!(b.next_flush(), None);
        b.push(&a, line(1), t0);
        b.push(&z, line(1), t0 + Duration::from_millis(50));
        b.push(&a, line(2), t0 + Duration::from_millis(60));
        assert!(!b.is_full(&a));
        // The deadline counts from the oldest waiting line.
        assert_eq!(b.next_flush(), Some(t0 + DELAY));
        assert!(b.take_due(t0 + Duration::from_millis(99)).is_empty());

        let due = b.take_due(t0 + DELAY);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].run, Some(a.to_proto()));
        assert_eq!(due[0].lines, vec![line(1), line(2)]);
        assert_eq!(b.next_flush(), Some(t0 + Duration::from_millis(150)));

        b.push(&z, line(2), t0 + DELAY);
        assert!(!b.is_full(&z));
        b.push(&z, line(3), t0 + DELAY);
        assert!(b.is_full(&z));
        let due = b.take_due(t0 + DELAY);
        assert_eq!(count(&due), 3);
        assert_eq!(b.next_flush(), None);
    }

    #[test]
    fn take_returns_one_runs_lines_in_order_in_bounded_messages() {
        let t0 = Instant::now();
        let mut b = LogBatcher::new(2, DELAY, 100);
        let (a, z) = (key("a"), key("z"));
        for n in 1..=5 {
            b.push(&a, line(n), t0);
        }
        b.push(&z, line(1), t0);
        let msgs = b.take(&a);
        assert_eq!(
            msgs.iter().map(|m| m.lines.len()).collect::<Vec<_>>(),
            vec![2, 2, 1]
        );
        let flat: Vec<_> = msgs.into_iter().flat_map(|m| m.lines).collect();
        assert_eq!(flat, (1..=5).map(line).collect::<Vec<_>>());
        assert!(b.take(&a).is_empty());
        assert_eq!(count(&b.take_all()), 1);
        assert!(b.take_all().is_empty());
    }

    #[test]
    fn lines_beyond_the_cap_are_dropped_and_counted() {
        let t0 = Instant::now();
        let mut b = LogBatcher::new(10, DELAY, 20);
        let a = key("a");
        for n in 0..25 {
            b.push(&a, line(n), t0);
        }
        let lines: Vec<_> = b.take(&a).into_iter().flat_map(|m| m.lines).collect();
        assert_eq!(lines.len(), 21);
        assert_eq!(lines[19], line(19));
        assert_eq!(lines[20].level, "warn");
        assert!(lines[20].message.starts_with("5 log lines dropped"));
    }
}
