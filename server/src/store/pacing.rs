//! When a poller of per-partition due entries (the run sweeper, the webhook worker)
//! asks a partition again: at its next tick after the store's activity counter moved
//! (a write of this instance may have made something due sooner), else when the
//! partition said its next entry falls due, and at least every `IDLE_TICKS` ticks (5 s
//! at the default 200 ms: what another instance wrote, e.g. the lease of a run it
//! dispatched before it died, is seen within it). A store without an activity counter
//! is asked about every partition at every tick.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::DueEntries;

/// A partition with nothing due sooner is asked again after this many ticks.
pub const IDLE_TICKS: u32 = 25;

pub struct Pacer {
    /// When each partition is next asked.
    next: Vec<Instant>,
    tick: Duration,
    idle: Duration,
    activity: Option<watch::Receiver<u64>>,
}

impl Pacer {
    /// A pacer for a poller ticking every `tick`; every partition is asked at the
    /// first tick.
    pub fn new(partitions: u32, tick: Duration, activity: Option<watch::Receiver<u64>>) -> Self {
        Self {
            next: vec![Instant::now(); partitions as usize],
            tick,
            idle: tick * IDLE_TICKS,
            activity,
        }
    }

    /// Until `shutdown`: at every tick, `ask` each partition whose time has come (see
    /// the module docs) and note what it answered (None: asking failed).
    pub async fn run<F, Fut>(mut self, shutdown: &CancellationToken, mut ask: F)
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Option<DueEntries>>,
    {
        let mut tick = tokio::time::interval(self.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !shutdown.is_cancelled() {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            for p in self.to_ask(Instant::now()) {
                if shutdown.is_cancelled() {
                    break;
                }
                let due = ask(p).await;
                self.asked(p, due.as_ref(), Instant::now());
            }
        }
    }

    /// The partitions to ask at this tick: every one after activity (or without an
    /// activity counter), else those whose time has come.
    pub fn to_ask(&mut self, now: Instant) -> Vec<u32> {
        let active = match &mut self.activity {
            None => true,
            Some(rx) => {
                let moved = rx.has_changed().unwrap_or(true);
                rx.borrow_and_update();
                moved
            }
        };
        (0..self.next.len() as u32)
            .filter(|&p| active || self.next[p as usize] <= now)
            .collect()
    }

    /// Records what asking `partition` at `now` answered (None: the ask failed, asked
    /// again at the next tick).
    pub fn asked(&mut self, partition: u32, answer: Option<&DueEntries>, now: Instant) {
        let wait = match answer {
            Some(due) => due.next_in.unwrap_or(self.idle).min(self.idle),
            None => Duration::ZERO,
        };
        if let Some(next) = self.next.get_mut(partition as usize) {
            *next = now + wait;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn due(next_in: Option<Duration>) -> DueEntries {
        DueEntries {
            ids: Vec::new(),
            next_in,
        }
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn partitions_are_asked_when_due_when_active_and_at_least_every_idle() {
        let (tx, rx) = watch::channel(0u64);
        let mut pacer = Pacer::new(3, Duration::from_millis(200), Some(rx));
        let t0 = Instant::now();
        assert_eq!(pacer.to_ask(t0), vec![0, 1, 2], "all at first");
        pacer.asked(0, Some(&due(Some(S))), t0);
        pacer.asked(1, Some(&due(None)), t0);
        pacer.asked(2, Some(&due(Some(60 * S))), t0);
        assert!(
            pacer.to_ask(t0 + S / 5).is_empty(),
            "nothing due yet, no activity"
        );
        assert_eq!(
            pacer.to_ask(t0 + S),
            vec![0],
            "partition 0's entry falls due"
        );
        pacer.asked(0, Some(&due(None)), t0 + S);
        tx.send_modify(|n| *n += 1);
        assert_eq!(pacer.to_ask(t0 + S), vec![0, 1, 2], "activity: every one");
        for p in 0..3 {
            pacer.asked(p, Some(&due(None)), t0 + S);
        }
        assert!(
            pacer.to_ask(t0 + S).is_empty(),
            "the activity was seen once"
        );
        assert!(pacer.to_ask(t0 + 5 * S).is_empty(), "5 s after 0 and 2");
        assert_eq!(
            pacer.to_ask(t0 + 6 * S),
            vec![0, 1, 2],
            "idle: asked again after 25 ticks, however far the next entry"
        );
        pacer.asked(1, None, t0 + 6 * S);
        pacer.asked(0, Some(&due(Some(3 * S))), t0 + 6 * S);
        pacer.asked(2, Some(&due(Some(Duration::ZERO))), t0 + 6 * S);
        assert_eq!(
            pacer.to_ask(t0 + 6 * S + S / 5),
            vec![1, 2],
            "a failed ask is repeated, and one that left more due"
        );
    }

    #[test]
    fn without_an_activity_counter_every_partition_is_asked_at_every_tick() {
        let mut pacer = Pacer::new(2, Duration::from_millis(200), None);
        let t0 = Instant::now();
        pacer.asked(0, Some(&due(None)), t0);
        pacer.asked(1, Some(&due(Some(4 * S))), t0);
        assert_eq!(pacer.to_ask(t0), vec![0, 1]);
    }
}
