//! The bookkeeping of the runs this process holds. It owns three things:
//!
//! - which handlers are executing, each with its cancellation token and its *local*
//!   lease deadline on the monotonic clock. A lease that runs out without renewal
//!   cancels its handler whether or not a server can be reached (self-fencing), and so
//!   does a renewal that says the lease is gone;
//! - which results wait for the server's `ResultAck`: kept across reconnects, re-sent
//!   after every `Welcome`, dropped only when acknowledged (accepted or not);
//! - the admission rules: an unknown handler, a draining executor or a full
//!   concurrency limit refuses a dispatch, and a repeated dispatch is recognised.
//!
//! Nothing here touches the network or reads a clock: instants come in as arguments,
//! so every rule is unit-tested.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use sundial_proto::v1 as pb;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::handler::Outcome;

/// One dispatch, as the server names it: every message about the run echoes it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct RunKey {
    pub schedule_id: String,
    pub attempt: u32,
    pub shard_index: u32,
    pub fencing_token: u64,
}

impl From<&pb::RunRef> for RunKey {
    fn from(r: &pb::RunRef) -> Self {
        Self {
            schedule_id: r.schedule_id.clone(),
            attempt: r.attempt,
            shard_index: r.shard_index,
            fencing_token: r.fencing_token,
        }
    }
}

impl RunKey {
    pub fn to_proto(&self) -> pb::RunRef {
        pb::RunRef {
            schedule_id: self.schedule_id.clone(),
            attempt: self.attempt,
            fencing_token: self.fencing_token,
            shard_index: self.shard_index,
        }
    }
}

impl fmt::Display for RunKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (attempt {}, shard {}, token {})",
            self.schedule_id, self.attempt, self.shard_index, self.fencing_token
        )
    }
}

/// Why a dispatch is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    UnknownHandler,
    Draining,
    Busy,
}

/// What to do with a dispatch whose handler (if registered) is `H`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Admission<H> {
    /// Start this handler (and record it with [`RunTable::start`]).
    Start(H),
    /// The same dispatch again while its handler runs: confirm it, start nothing.
    AlreadyRunning,
    /// The same dispatch again after it finished: re-send the result that still waits
    /// for an acknowledgement.
    AlreadyFinished(Box<pb::Result>),
    Refuse(Refusal),
}

/// What a lease renewal did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// The local deadline moved.
    Renewed,
    /// The server says the lease is gone: the handler was cancelled just now.
    Revoked,
    /// Not an executing run, or one already cancelled for its lease: nothing changes.
    Ignored,
}

/// The runs this process holds; see the module docs.
#[derive(Debug)]
pub(crate) struct RunTable {
    /// At most this many executing handlers; 0 = unlimited.
    max_concurrency: u32,
    /// A fresh dispatch's lease lasts this long until its first renewal (the current
    /// server's `Welcome.lease_ttl_ms`).
    lease_ttl: Duration,
    executing: HashMap<RunKey, Executing>,
    /// Ordered so that re-sending after a reconnect is deterministic.
    awaiting_ack: BTreeMap<RunKey, pb::Result>,
}

#[derive(Debug)]
struct Executing {
    cancel: CancellationToken,
    /// When the lease runs out unless renewed, on the local monotonic clock.
    lease_deadline: Instant,
    /// The handler was cancelled because its lease is gone; no later renewal undoes
    /// that, and its deadline no longer matters.
    fenced: bool,
    started_at_ms: i64,
}

impl RunTable {
    pub fn new(max_concurrency: u32, lease_ttl: Duration) -> Self {
        Self {
            max_concurrency,
            lease_ttl,
            executing: HashMap::new(),
            awaiting_ack: BTreeMap::new(),
        }
    }

    /// At most this many executing handlers; 0 = unlimited.
    pub fn max_concurrency(&self) -> u32 {
        self.max_concurrency
    }

    /// The lease length that applies to dispatches from now on.
    pub fn set_lease_ttl(&mut self, ttl: Duration) {
        self.lease_ttl = ttl;
    }

    pub fn admit<H>(&self, key: &RunKey, handler: Option<H>, draining: bool) -> Admission<H> {
        if self.executing.contains_key(key) {
            return Admission::AlreadyRunning;
        }
        if let Some(result) = self.awaiting_ack.get(key) {
            return Admission::AlreadyFinished(Box::new(result.clone()));
        }
        let Some(handler) = handler else {
            return Admission::Refuse(Refusal::UnknownHandler);
        };
        if draining {
            return Admission::Refuse(Refusal::Draining);
        }
        let limit = usize::try_from(self.max_concurrency).unwrap_or(usize::MAX);
        if limit != 0 && self.executing.len() >= limit {
            return Admission::Refuse(Refusal::Busy);
        }
        Admission::Start(handler)
    }

    /// Records a handler that was just started; its lease counts from `now`.
    pub fn start(
        &mut self,
        key: RunKey,
        cancel: CancellationToken,
        now: Instant,
        started_at_ms: i64,
    ) {
        self.executing.insert(
            key,
            Executing {
                cancel,
                lease_deadline: now + self.lease_ttl,
                fenced: false,
                started_at_ms,
            },
        );
    }

    /// Applies one `LeaseStatus`: `remaining_ms` counts from `since` (when the
    /// heartbeat it answers was sent, so that the local deadline errs early).
    pub fn renew(&mut self, key: &RunKey, remaining_ms: i64, since: Instant) -> Renewal {
        let Some(run) = self.executing.get_mut(key).filter(|r| !r.fenced) else {
            return Renewal::Ignored;
        };
        match u64::try_from(remaining_ms) {
            Ok(ms) if ms > 0 => {
                run.lease_deadline = since + Duration::from_millis(ms);
                Renewal::Renewed
            }
            _ => {
                self.revoke(key);
                Renewal::Revoked
            }
        }
    }

    /// The server no longer leases this run to us: cancel its handler for good. False
    /// if it is not executing.
    pub fn revoke(&mut self, key: &RunKey) -> bool {
        let Some(run) = self.executing.get_mut(key) else {
            return false;
        };
        run.fenced = true;
        run.cancel.cancel();
        true
    }

    /// Cancels every handler whose lease ran out by `now` without renewal and returns
    /// them; each is returned once.
    pub fn expire_leases(&mut self, now: Instant) -> Vec<RunKey> {
        let mut expired: Vec<RunKey> = self
            .executing
            .iter_mut()
            .filter(|(_, r)| !r.fenced && r.lease_deadline <= now)
            .map(|(k, r)| {
                r.fenced = true;
                r.cancel.cancel();
                k.clone()
            })
            .collect();
        expired.sort();
        expired
    }

    /// The earliest lease deadline still to enforce.
    pub fn next_lease_deadline(&self) -> Option<Instant> {
        self.executing
            .values()
            .filter(|r| !r.fenced)
            .map(|r| r.lease_deadline)
            .min()
    }

    /// Cancels one executing handler (the server's `Cancel`, or a run the server no
    /// longer leases to us). False if it is not executing.
    pub fn cancel(&mut self, key: &RunKey) -> bool {
        match self.executing.get(key) {
            Some(run) => {
                run.cancel.cancel();
                true
            }
            None => false,
        }
    }

    pub fn cancel_all(&mut self) {
        for run in self.executing.values() {
            run.cancel.cancel();
        }
    }

    /// A run admitted but never started (the server withheld the go-ahead, or the
    /// stream broke before it): forgotten, with no result. False if it was not held.
    pub fn forget(&mut self, key: &RunKey) -> bool {
        self.executing.remove(key).is_some()
    }

    /// The handler returned: its result now waits for an acknowledgement. None if the
    /// run was not executing.
    pub fn finish(&mut self, key: &RunKey, outcome: Outcome) -> Option<pb::Result> {
        let run = self.executing.remove(key)?;
        let result = outcome.into_result(key.to_proto(), run.started_at_ms);
        self.awaiting_ack.insert(key.clone(), result.clone());
        Some(result)
    }

    /// The server acknowledged a result: forget it. False if none was waiting.
    pub fn acknowledge(&mut self, key: &RunKey) -> bool {
        self.awaiting_ack.remove(key).is_some()
    }

    /// Exactly the leases to renew: the runs admitted or executing, and those whose
    /// result waits for its acknowledgement (a result is accepted only while its lease
    /// is current, so it is kept alive until the server has settled it).
    pub fn in_flight(&self) -> Vec<pb::RunRef> {
        let mut keys: Vec<&RunKey> = self
            .executing
            .keys()
            .chain(self.awaiting_ack.keys())
            .collect();
        keys.sort();
        keys.dedup();
        keys.into_iter().map(RunKey::to_proto).collect()
    }

    /// Results the server has not acknowledged yet, in a stable order.
    pub fn awaiting_ack(&self) -> impl Iterator<Item = &pb::Result> {
        self.awaiting_ack.values()
    }

    pub fn is_executing(&self, key: &RunKey) -> bool {
        self.executing.contains_key(key)
    }

    pub fn executing_count(&self) -> usize {
        self.executing.len()
    }

    pub fn awaiting_ack_count(&self) -> usize {
        self.awaiting_ack.len()
    }

    /// Nothing executes and nothing waits for an acknowledgement.
    pub fn is_idle(&self) -> bool {
        self.executing.is_empty() && self.awaiting_ack.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HandlerError;

    const TTL: Duration = Duration::from_secs(1);

    fn key(id: &str, token: u64) -> RunKey {
        RunKey {
            schedule_id: id.into(),
            attempt: 1,
            shard_index: 0,
            fencing_token: token,
        }
    }

    fn table(max: u32) -> RunTable {
        RunTable::new(max, TTL)
    }

    fn start(t: &mut RunTable, k: &RunKey, now: Instant) -> CancellationToken {
        let token = CancellationToken::new();
        t.start(k.clone(), token.clone(), now, 1_000);
        token
    }

    fn ok(output: &[u8]) -> Outcome {
        Outcome {
            result: Ok(output.to_vec()),
            finished_at_ms: 2_000,
        }
    }

    #[test]
    fn admission_rules_in_order() {
        let now = Instant::now();
        let mut t = table(2);
        let (a, b, c) = (key("a", 1), key("b", 1), key("c", 1));
        assert_eq!(
            t.admit(&a, None::<()>, false),
            Admission::Refuse(Refusal::UnknownHandler)
        );
        assert_eq!(
            t.admit(&a, Some(()), true),
            Admission::Refuse(Refusal::Draining)
        );
        assert_eq!(t.admit(&a, Some(()), false), Admission::Start(()));
        start(&mut t, &a, now);
        // A repeated dispatch is recognised even while draining.
        assert_eq!(t.admit(&a, Some(()), true), Admission::AlreadyRunning);
        start(&mut t, &b, now);
        assert_eq!(
            t.admit(&c, Some(()), false),
            Admission::Refuse(Refusal::Busy)
        );
        // A new token for the same schedule is a different lease.
        assert_eq!(
            t.admit(&key("a", 2), Some(()), false),
            Admission::Refuse(Refusal::Busy)
        );

        let result = t.finish(&a, ok(b"x"));
        assert_eq!(t.admit(&c, Some(()), false), Admission::Start(()));
        match t.admit(&a, Some(()), false) {
            Admission::AlreadyFinished(r) => assert_eq!(Some(*r), result),
            other => panic!("expected the finished result, got {other:?}"),
        }
    }

    #[test]
    fn zero_means_unlimited_concurrency() {
        let now = Instant::now();
        let mut t = table(0);
        for i in 0..1000 {
            let k = key(&format!("r{i}"), 1);
            assert_eq!(t.admit(&k, Some(()), false), Admission::Start(()));
            start(&mut t, &k, now);
        }
        assert_eq!(t.executing_count(), 1000);
    }

    #[test]
    fn the_concurrency_limit_counts_cancelled_but_still_running_handlers() {
        let now = Instant::now();
        let mut t = table(1);
        let a = key("a", 1);
        start(&mut t, &a, now);
        assert!(t.cancel(&a));
        assert_eq!(
            t.admit(&key("b", 1), Some(()), false),
            Admission::Refuse(Refusal::Busy)
        );
        t.finish(&a, ok(b""));
        assert_eq!(t.admit(&key("b", 1), Some(()), false), Admission::Start(()));
    }

    #[test]
    fn a_lease_not_renewed_in_time_cancels_its_handler_once() {
        let t0 = Instant::now();
        let mut t = table(0);
        let (a, b) = (key("a", 1), key("b", 1));
        let ta = start(&mut t, &a, t0);
        let tb = start(&mut t, &b, t0 + Duration::from_millis(500));
        assert_eq!(t.next_lease_deadline(), Some(t0 + TTL));

        assert!(
            t.expire_leases(t0 + TTL - Duration::from_millis(1))
                .is_empty()
        );
        assert_eq!(t.expire_leases(t0 + TTL), vec![a.clone()]);
        assert!(ta.is_cancelled() && !tb.is_cancelled());
        // Fenced runs are enforced once, and still listed: their handlers still run.
        assert!(t.expire_leases(t0 + TTL).is_empty());
        assert_eq!(
            t.next_lease_deadline(),
            Some(t0 + Duration::from_millis(1500))
        );
        assert_eq!(t.in_flight().len(), 2);
        // A late renewal does not revive a fenced run.
        assert_eq!(t.renew(&a, 5_000, t0 + TTL), Renewal::Ignored);
    }

    #[test]
    fn renewals_move_the_deadline_from_when_the_heartbeat_was_sent() {
        let t0 = Instant::now();
        let mut t = table(0);
        let a = key("a", 1);
        let token = start(&mut t, &a, t0);
        let sent = t0 + Duration::from_millis(800);
        assert_eq!(t.renew(&a, 1_000, sent), Renewal::Renewed);
        assert_eq!(t.next_lease_deadline(), Some(sent + TTL));
        assert!(
            t.expire_leases(t0 + Duration::from_millis(1_700))
                .is_empty()
        );
        assert!(!token.is_cancelled());
        assert_eq!(t.expire_leases(sent + TTL), vec![a]);
        assert!(token.is_cancelled());
    }

    #[test]
    fn a_renewal_saying_the_lease_is_gone_cancels_at_once() {
        let t0 = Instant::now();
        let mut t = table(0);
        let (a, b) = (key("a", 1), key("b", 1));
        let ta = start(&mut t, &a, t0);
        let tb = start(&mut t, &b, t0);
        assert_eq!(t.renew(&a, 0, t0), Renewal::Revoked);
        assert_eq!(t.renew(&b, -5, t0), Renewal::Revoked);
        assert!(ta.is_cancelled() && tb.is_cancelled());
        assert_eq!(t.next_lease_deadline(), None);
        assert_eq!(t.renew(&key("nobody", 1), 1_000, t0), Renewal::Ignored);

        let c = key("c", 1);
        let tc = start(&mut t, &c, t0);
        assert!(t.revoke(&c) && tc.is_cancelled());
        assert_eq!(t.next_lease_deadline(), None);
        assert!(!t.revoke(&key("nobody", 1)));
    }

    #[test]
    fn results_wait_for_their_acknowledgement() {
        let now = Instant::now();
        let mut t = table(0);
        let (a, b) = (key("a", 7), key("b", 8));
        start(&mut t, &a, now);
        start(&mut t, &b, now);
        assert_eq!(t.finish(&key("a", 6), ok(b"")), None);

        let ra = t.finish(&a, ok(b"out")).expect("a was executing");
        assert_eq!(ra.run, Some(a.to_proto()));
        assert_eq!(ra.status, pb::ResultStatus::Succeeded as i32);
        assert_eq!((ra.started_at_ms, ra.finished_at_ms), (1_000, 2_000));
        // Until its result is acknowledged, a run's lease is still renewed.
        assert_eq!(t.in_flight(), vec![a.to_proto(), b.to_proto()]);
        assert_eq!(t.executing_count(), 1);
        assert!(!t.is_idle());

        let failed = Outcome {
            result: Err(HandlerError::new("boom", "it broke")),
            finished_at_ms: 3_000,
        };
        let rb = t.finish(&b, failed).expect("b was executing");
        assert_eq!(t.awaiting_ack().cloned().collect::<Vec<_>>(), vec![ra, rb]);
        assert_eq!(t.in_flight(), vec![a.to_proto(), b.to_proto()]);

        assert!(t.acknowledge(&a));
        assert!(!t.acknowledge(&a));
        assert_eq!(t.in_flight(), vec![b.to_proto()]);
        assert!(t.acknowledge(&b));
        assert!(t.is_idle());
        assert!(t.in_flight().is_empty());
    }

    #[test]
    fn cancel_reaches_only_executing_handlers() {
        let now = Instant::now();
        let mut t = table(0);
        let (a, b) = (key("a", 1), key("b", 1));
        let ta = start(&mut t, &a, now);
        let tb = start(&mut t, &b, now);
        assert!(!t.cancel(&key("c", 1)));
        assert!(t.cancel(&a));
        assert!(ta.is_cancelled() && !tb.is_cancelled());
        t.cancel_all();
        assert!(tb.is_cancelled());
    }
}
