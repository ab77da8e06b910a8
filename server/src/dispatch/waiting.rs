//! Which runs this instance saw wait for capacity, per executor group, oldest first:
//! the hint that lets a slot freed on one of this instance's streams go to a waiting
//! run at once, instead of at that run's next timer.
//!
//! A hint only: each run's WAITING record and its timer in the store stay the truth,
//! so a hint that is lost (another instance, a restart, the cap below) costs latency,
//! never a run, and a stale one (the run was routed or finished meanwhile) is skipped
//! when the store is asked.

use std::collections::{HashMap, HashSet, VecDeque};

/// Hints kept per group; runs beyond it are found by their timers alone.
pub const MAX_HINTS_PER_GROUP: usize = 200_000;

#[derive(Default)]
struct Queue {
    order: VecDeque<String>,
    members: HashSet<String>,
}

/// Waiting runs by group, each named once, in the order they were first seen waiting.
#[derive(Default)]
pub struct WaitingRuns {
    groups: HashMap<String, Queue>,
    cap: usize,
}

impl WaitingRuns {
    pub fn new(cap: usize) -> Self {
        Self {
            groups: HashMap::new(),
            cap,
        }
    }

    /// The run waits for a slot in `group`. A run already noted keeps its place; none
    /// is noted past the cap.
    pub fn note(&mut self, group: &str, schedule_id: &str) {
        let q = self.groups.entry(group.to_owned()).or_default();
        if q.order.len() >= self.cap || q.members.contains(schedule_id) {
            return;
        }
        q.members.insert(schedule_id.to_owned());
        q.order.push_back(schedule_id.to_owned());
    }

    /// The run that has waited longest in `group`, forgotten here (routing it notes it
    /// again if it still finds no slot).
    pub fn take(&mut self, group: &str) -> Option<String> {
        let q = self.groups.get_mut(group)?;
        let sid = q.order.pop_front()?;
        q.members.remove(&sid);
        if q.order.is_empty() {
            self.groups.remove(group);
        }
        Some(sid)
    }

    #[cfg(test)]
    fn len(&self, group: &str) -> usize {
        self.groups.get(group).map_or(0, |q| q.order.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oldest_first_each_once_per_group_and_capped() {
        let mut w = WaitingRuns::new(3);
        w.note("g", "a@1");
        w.note("g", "b@1");
        w.note("g", "a@1"); // already waiting: keeps its place
        w.note("h", "c@1");
        w.note("g", "d@1");
        w.note("g", "e@1"); // over the cap: left to its timer
        assert_eq!((w.len("g"), w.len("h")), (3, 1));
        assert_eq!(w.take("g").as_deref(), Some("a@1"));
        // Taken, then still waiting: noted again, at the back.
        w.note("g", "a@1");
        assert_eq!(w.take("g").as_deref(), Some("b@1"));
        assert_eq!(w.take("g").as_deref(), Some("d@1"));
        assert_eq!(w.take("g").as_deref(), Some("a@1"));
        assert_eq!(w.take("g"), None);
        assert_eq!(w.take("h").as_deref(), Some("c@1"));
        assert_eq!(w.take("nobody"), None);
    }
}
