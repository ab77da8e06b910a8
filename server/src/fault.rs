//! Named crash points, so a fault test can stop a process exactly inside a failure
//! window instead of hoping a timed kill lands there.
//!
//! `SUNDIAL_FAULT=<point>` aborts the process the first time it reaches `<point>` (a
//! panic point panics instead, in the task that reached it);
//! `SUNDIAL_FAULT=<point>@<n>` aborts at the n-th time. The process dies with
//! `abort()`, as close to a SIGKILL as a process can do to itself: no destructors, no
//! graceful shutdown, no flushing of anything but the one stderr line that says why.
//! Unset, a crash point costs one relaxed atomic load.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Every crash point the server has, so tests can iterate over them and a typo in
/// `SUNDIAL_FAULT` is reported at start-up.
pub const POINTS: &[&str] = &[
    // The scheduler read due fires and computed next fires, but has not claimed them.
    "scheduler.before_claim",
    // The claim (next fire armed + triggers appended) committed; nothing else happened.
    "scheduler.after_claim",
    // Dispatch read a trigger but has not recorded its run.
    "dispatch.before_record",
    // The run is recorded but the trigger is not acknowledged.
    "dispatch.before_ack",
    // A result (an executor's, or an HTTP target's response) was committed by
    // finish_run (a final run has its webhook in the outbox); nothing else happened:
    // no acknowledgement, no follow-up, no delivery attempt by this instance.
    "run.after_finish",
    // The embedded store's group commit: a batch of writes applied in its transaction,
    // not committed; no caller answered.
    "embedded.before_commit",
    // The batch's redo record is in the journal and synced; its transaction is not
    // committed and no caller was answered (a restart replays it).
    "embedded.after_journal",
    // The batch committed (every write of it durable); no caller answered yet.
    "embedded.after_commit",
    // A panic point: the run sweeper's loop panics as it sweeps a partition (the
    // instance must report it and stop, not go on without a sweeper).
    "sweeper.panic",
];

struct Armed {
    point: String,
    at_hit: u64,
    hits: AtomicU64,
}

static ARMED: OnceLock<Option<Armed>> = OnceLock::new();

fn armed() -> &'static Option<Armed> {
    ARMED.get_or_init(|| parse(std::env::var("SUNDIAL_FAULT").ok().as_deref()))
}

fn parse(value: Option<&str>) -> Option<Armed> {
    let value = value?.trim();
    if value.is_empty() {
        return None;
    }
    let (point, at_hit) = match value.split_once('@') {
        Some((p, n)) => (p, n.parse().unwrap_or(1).max(1)),
        None => (value, 1),
    };
    Some(Armed {
        point: point.to_owned(),
        at_hit,
        hits: AtomicU64::new(0),
    })
}

/// Checks `SUNDIAL_FAULT` names a known point; returns it, for the start-up log.
pub fn validate_env() -> Result<Option<String>, String> {
    match armed() {
        None => Ok(None),
        Some(a) if POINTS.contains(&a.point.as_str()) => {
            Ok(Some(format!("{}@{}", a.point, a.at_hit)))
        }
        Some(a) => Err(format!(
            "SUNDIAL_FAULT: unknown crash point {:?}; known: {}",
            a.point,
            POINTS.join(", ")
        )),
    }
}

/// Which hit of `point` this is, when `SUNDIAL_FAULT` names it and this is the hit it
/// names (once per process).
fn reached(point: &'static str) -> Option<u64> {
    let a = armed().as_ref().filter(|a| a.point == point)?;
    let hit = a.hits.fetch_add(1, Ordering::Relaxed) + 1;
    (hit == a.at_hit).then_some(hit)
}

/// Aborts the process here if `SUNDIAL_FAULT` names this point (and this is the n-th hit).
pub fn crash_point(point: &'static str) {
    if let Some(hit) = reached(point) {
        eprintln!("SUNDIAL_FAULT: crashing at {point} (hit {hit})");
        std::process::abort();
    }
}

/// Panics here if `SUNDIAL_FAULT` names this point (and this is the n-th hit): a bug
/// in one loop, as the instance's loop watch must see it.
pub fn panic_point(point: &'static str) {
    if let Some(hit) = reached(point) {
        panic!("SUNDIAL_FAULT: panicking at {point} (hit {hit})");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_point_and_hit() {
        let a = parse(Some("scheduler.after_claim@3")).expect("armed");
        assert_eq!((a.point.as_str(), a.at_hit), ("scheduler.after_claim", 3));
        let a = parse(Some("dispatch.before_ack")).expect("armed");
        assert_eq!(a.at_hit, 1);
        assert!(parse(Some("")).is_none());
        assert!(parse(None).is_none());
    }
}
