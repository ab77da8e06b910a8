//! The room queue: runs that found every eligible node at its window, kept in memory in
//! the order they began to wait for room, per executor group and handler, so that a
//! slot freed by a result is refilled at once, oldest run first, instead of at the
//! run's next timer (a sweep every `route_retry`, each a store call per waiting run).
//!
//! A hint, never the record: each queued run stays WAITING in the store with its
//! timer, which brings it back if this instance forgets it (the queue was full, the
//! instance restarted), and the store judges every assignment (a run another instance
//! routed meanwhile answers `NotWaiting` and is dropped).

use std::collections::{HashMap, HashSet, VecDeque};

use crate::model::RunRecord;

/// Runs one instance keeps waiting for room, over all groups: past this a run waits
/// for its timer instead (each entry holds its run record, about a kilobyte).
pub(super) const ROOM_CAPACITY: usize = 50_000;

/// Which runs a node can take: its group and one of its handlers.
type Key = (String, String);

/// A run's place in the room: the order in which runs began to wait. A run taken out
/// to be routed keeps it, and goes back to it if it finds no room after all (several
/// are routed at once, and may come back in any order).
pub(super) type Place = u64;

#[derive(Debug, Default)]
pub(super) struct Room {
    /// Per group and handler, the runs in the order they began to wait, each with its
    /// place (`Place`), ascending.
    queues: HashMap<Key, VecDeque<(Place, RunRecord)>>,
    /// The next run's place.
    next: Place,
    /// (schedule_id, attempt) of every queued run, so a run woken again by its timer
    /// while it waits here is not queued twice.
    queued: HashSet<(String, u32)>,
    /// How many attempts of each run are queued (one, but for an attempt that failed
    /// while its predecessor still waited here), and its job's timeout.
    runs: HashMap<String, (usize, i64)>,
    /// The queues a refill is routing from now, each with whether another refill was
    /// asked for meanwhile: one refill at a time per queue, so runs leave it in order
    /// (two at once could each pop a run, and the later one win the freed slot).
    refilling: HashMap<Key, bool>,
}

impl Room {
    /// Queues `run` behind the others waiting for a node of `group` serving `handler`.
    /// False when it is not queued: already waiting here (its place is kept), or the
    /// room is full.
    pub(super) fn push_back(&mut self, group: &str, handler: &str, run: RunRecord) -> bool {
        self.push(group, handler, run, None)
    }

    /// Puts back a run taken out to be routed (`pop`) that found no room after all, at
    /// its `place`, so it keeps its turn: ahead of every run that came after it.
    pub(super) fn put_back(
        &mut self,
        group: &str,
        handler: &str,
        run: RunRecord,
        place: Place,
    ) -> bool {
        self.push(group, handler, run, Some(place))
    }

    fn push(&mut self, group: &str, handler: &str, run: RunRecord, place: Option<Place>) -> bool {
        if self.queued.len() >= ROOM_CAPACITY {
            return false;
        }
        if !self.queued.insert((run.schedule_id.clone(), run.attempt)) {
            return false;
        }
        self.runs
            .entry(run.schedule_id.clone())
            .or_insert((0, run.plan.timeout_ms))
            .0 += 1;
        let queue = self
            .queues
            .entry((group.to_owned(), handler.to_owned()))
            .or_default();
        match place {
            Some(place) => {
                let at = queue.partition_point(|(p, _)| *p < place);
                queue.insert(at, (place, run));
            }
            None => {
                queue.push_back((self.next, run));
                self.next += 1;
            }
        }
        true
    }

    /// Whether the caller may refill the queue of `group` and `handler` now: false when
    /// a refill of it is under way, which is then asked to go round once more.
    pub(super) fn start_refill(&mut self, group: &str, handler: &str) -> bool {
        match self
            .refilling
            .get_mut(&(group.to_owned(), handler.to_owned()))
        {
            Some(again) => {
                *again = true;
                false
            }
            None => {
                self.refilling
                    .insert((group.to_owned(), handler.to_owned()), false);
                true
            }
        }
    }

    /// Ends a pass of the refill under way: true when another was asked for meanwhile
    /// (the caller goes round again), else the refill is over.
    pub(super) fn end_refill_pass(&mut self, group: &str, handler: &str) -> bool {
        let key = (group.to_owned(), handler.to_owned());
        match self.refilling.get_mut(&key) {
            Some(again) if *again => {
                *again = false;
                true
            }
            _ => {
                self.refilling.remove(&key);
                false
            }
        }
    }

    /// Forgets the refill of `group` and `handler` (one that stopped before its end).
    pub(super) fn drop_refill(&mut self, group: &str, handler: &str) {
        self.refilling
            .remove(&(group.to_owned(), handler.to_owned()));
    }

    /// The run that has waited longest for a node of `group` serving `handler`, with
    /// its place (to `put_back` it there).
    pub(super) fn pop(&mut self, group: &str, handler: &str) -> Option<(Place, RunRecord)> {
        let key = (group.to_owned(), handler.to_owned());
        let queue = self.queues.get_mut(&key)?;
        let entry = queue.pop_front();
        if queue.is_empty() {
            self.queues.remove(&key);
        }
        let (place, run) = entry?;
        self.queued.remove(&(run.schedule_id.clone(), run.attempt));
        if let Some((n, _)) = self.runs.get_mut(&run.schedule_id) {
            *n -= 1;
            if *n == 0 {
                self.runs.remove(&run.schedule_id);
            }
        }
        Some((place, run))
    }

    /// Whether runs wait here for a node of `group` serving `handler`: a newer run for
    /// such a node queues behind them rather than taking the next free slot first.
    pub(super) fn waiting(&self, group: &str, handler: &str) -> bool {
        // Asked at every begin, route and result: the common answer (nothing waits)
        // without building a key.
        !self.queues.is_empty()
            && self
                .queues
                .contains_key(&(group.to_owned(), handler.to_owned()))
    }

    /// Whether this attempt of the run waits here.
    pub(super) fn holds(&self, schedule_id: &str, attempt: u32) -> bool {
        self.queued.contains(&(schedule_id.to_owned(), attempt))
    }

    /// When some attempt of the run waits here: its job's timeout (`plan.timeout_ms`).
    pub(super) fn waits(&self, schedule_id: &str) -> Option<i64> {
        self.runs.get(schedule_id).map(|&(_, timeout)| timeout)
    }

    /// Every group and handler runs wait for.
    pub(super) fn keys(&self) -> Vec<(String, String)> {
        self.queues.keys().cloned().collect()
    }

    pub(super) fn len(&self) -> usize {
        self.queued.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Trigger, TriggerKind};

    fn run(job: &str, attempt: u32) -> RunRecord {
        let mut run = RunRecord::from_trigger(&Trigger {
            job_id: job.into(),
            schedule_no: "1".into(),
            kind: TriggerKind::Cron,
            scheduled_at: 1,
            triggered_at: 1,
            job_version: 1,
            payload_override: None,
            route_key_override: None,
            skip_reason: None,
        });
        run.attempt = attempt;
        run
    }

    #[test]
    fn one_refill_of_a_queue_at_a_time_and_a_refill_asked_for_meanwhile_is_not_lost() {
        let mut room = Room::default();
        assert!(room.start_refill("g", "h"));
        assert!(!room.start_refill("g", "h"), "one is under way");
        assert!(room.start_refill("g", "other"), "queues refill apart");
        assert!(
            room.end_refill_pass("g", "h"),
            "asked for again: one more pass"
        );
        assert!(!room.end_refill_pass("g", "h"), "nothing more asked: over");
        assert!(room.start_refill("g", "h"), "the next one may start");
        room.drop_refill("g", "h");
        assert!(
            room.start_refill("g", "h"),
            "a refill stopped halfway is forgotten"
        );
    }

    #[test]
    fn runs_leave_in_the_order_they_came_per_group_and_handler() {
        let mut room = Room::default();
        assert!(room.push_back("g", "h", run("a", 1)));
        assert!(room.push_back("g", "other", run("b", 1)));
        assert!(room.push_back("g", "h", run("c", 1)));
        assert!(room.waiting("g", "h") && room.waiting("g", "other"));
        assert!(!room.waiting("g2", "h"));
        assert_eq!(room.len(), 3);
        let (place, a) = room.pop("g", "h").expect("a");
        assert_eq!(a.job_id, "a");
        // One that found no room after all keeps its turn.
        assert!(room.put_back("g", "h", a, place));
        assert_eq!(room.pop("g", "h").map(|(_, r)| r.job_id), Some("a".into()));
        assert_eq!(room.pop("g", "h").map(|(_, r)| r.job_id), Some("c".into()));
        assert_eq!(room.pop("g", "h"), None);
        assert!(!room.waiting("g", "h"));
        assert_eq!(room.keys(), vec![("g".to_owned(), "other".to_owned())]);
    }

    #[test]
    fn runs_put_back_in_any_order_keep_their_places() {
        let mut room = Room::default();
        for job in ["a", "b", "c", "d"] {
            assert!(room.push_back("g", "h", run(job, 1)));
        }
        let taken: Vec<(Place, RunRecord)> = (0..3).filter_map(|_| room.pop("g", "h")).collect();
        assert!(room.push_back("g", "h", run("e", 1)));
        // Routed at once, the three come back in another order than they left.
        for i in [1, 2, 0] {
            let (place, run) = taken[i].clone();
            assert!(room.put_back("g", "h", run, place));
        }
        let order: Vec<String> = std::iter::from_fn(|| room.pop("g", "h"))
            .map(|(_, r)| r.job_id)
            .collect();
        assert_eq!(order, ["a", "b", "c", "d", "e"]);
    }

    #[test]
    fn a_run_waits_once_per_attempt() {
        let mut room = Room::default();
        assert!(room.push_back("g", "h", run("a", 1)));
        assert!(
            !room.push_back("g", "h", run("a", 1)),
            "woken again by its timer"
        );
        assert!(room.holds("a@1", 1));
        // A later attempt is another wait (the earlier one is dropped when routing
        // finds it no longer waiting).
        assert!(room.push_back("g", "h", run("a", 2)));
        assert_eq!(room.len(), 2);
        room.pop("g", "h");
        assert!(!room.holds("a@1", 1));
        assert!(room.holds("a@1", 2));
        assert_eq!(room.waits("a@1"), Some(0));
        room.pop("g", "h");
        assert_eq!(room.waits("a@1"), None);
        assert_eq!(room.len(), 0);
    }

    #[test]
    fn a_full_room_queues_nothing_more() {
        let mut room = Room::default();
        for i in 0..ROOM_CAPACITY {
            assert!(room.push_back("g", "h", run(&format!("j{i}"), 1)));
        }
        assert!(!room.push_back("g", "h", run("one-more", 1)));
        assert_eq!(room.len(), ROOM_CAPACITY);
        room.pop("g", "h");
        assert!(room.push_back("g", "h", run("one-more", 1)));
    }
}
