//! Whether an executor attached here still answers: the dispatches sent down its stream
//! and not yet answered, when anything was last heard from it, and the rule that calls
//! it silent.
//!
//! A live executor answers a `Dispatch` at once (`Started`, or `Reject`) and lists it in
//! every heartbeat from then on, so a dispatch is the probe: a node that has left one
//! unanswered for `silent_after` and sent nothing at all for as long is frozen, cut
//! off, or wedged. It is then silent: its unanswered dispatches are taken back (the
//! store takes back only ones still unconfirmed, so a `Started` that got there first
//! wins) and it gets no new work until it is heard from again. Runs it had started
//! keep their leases: a frozen process that thaws carries on under its tokens.
//!
//! The same ledger tells the node's health window which handler each result was for,
//! and which leases the node lost or let time out (the `Cancel`s sent down the stream).
//!
//! Pure bookkeeping over `Instant`s: the session feeds it what it reads and sends, and
//! acts on [`Liveness::check`]'s verdict.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sundial_proto::v1 as pb;

use crate::dispatch::health::Kind;
use crate::dispatch::lock;

/// One attached stream's ledger. Shared by the link that sends dispatches and cancels,
/// the reader that sees answers, and the session that checks them and keeps the
/// node's health window.
#[derive(Debug)]
pub struct Liveness {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    last_heard: Instant,
    /// Dispatches sent down the stream and not yet settled, by (schedule_id, shard).
    sent: HashMap<(String, u32), Sent>,
    /// Since when the node has been silent, if it is.
    silent_since: Option<Instant>,
    /// Ends of runs seen on the way out (a lease lost, an attempt timed out) for the
    /// node's health window, with the handler when known.
    noted: Vec<(Option<Arc<str>>, Kind)>,
}

#[derive(Debug)]
struct Sent {
    /// The lease it was sent under.
    run: pb::RunRef,
    handler: Arc<str>,
    at: Instant,
    /// The node said something about it (`Started`, `Reject`, a heartbeat listing it).
    answered: bool,
}

/// What a check found.
#[derive(Debug, Default, PartialEq)]
pub struct Verdict {
    /// Dispatches to take back: every unanswered one, once the node is silent.
    pub take_back: Vec<pb::RunRef>,
    /// The node turned silent (`Some(true)`) or was heard from again (`Some(false)`).
    pub turned: Option<bool>,
}

impl Liveness {
    pub fn new(now: Instant) -> Self {
        Self {
            inner: Mutex::new(Inner {
                last_heard: now,
                sent: HashMap::new(),
                silent_since: None,
                noted: Vec::new(),
            }),
        }
    }

    /// A dispatch for `handler` went down the stream.
    pub fn sent(&self, run: &pb::RunRef, handler: &str, now: Instant) {
        lock(&self.inner).sent.insert(
            key(run),
            Sent {
                run: run.clone(),
                handler: Arc::from(handler),
                at: now,
                answered: false,
            },
        );
    }

    /// A message came from the node.
    pub fn heard(&self, now: Instant) {
        lock(&self.inner).last_heard = now;
    }

    /// The node answered about this run (`Started`, `Reject`): whatever lease of it
    /// was sent is answered.
    pub fn answered(&self, run: &pb::RunRef) {
        if let Some(s) = lock(&self.inner).sent.get_mut(&key(run))
            && s.run.fencing_token <= run.fencing_token
        {
            s.answered = true;
        }
    }

    /// A heartbeat listed exactly these runs as held: each is answered, and an answered
    /// dispatch it no longer lists is settled (the executor let it go).
    pub fn listed(&self, in_flight: &[pb::RunRef]) {
        let mut inner = lock(&self.inner);
        let listed: std::collections::HashSet<(String, u32)> = in_flight.iter().map(key).collect();
        inner.sent.retain(|k, s| {
            if listed.contains(k) {
                s.answered = true;
                true
            } else {
                !s.answered
            }
        });
    }

    /// The node reported the run's result: the handler it was dispatched for.
    pub fn finished(&self, run: &pb::RunRef) -> Option<Arc<str>> {
        lock(&self.inner).sent.remove(&key(run)).map(|s| s.handler)
    }

    /// A `Cancel` went down the stream: the run is settled here, and a lease lost
    /// ("lost", "unconfirmed") or an attempt timed out ("timeout") is noted for the
    /// node's health window.
    pub fn cancelled(&self, run: &pb::RunRef, reason: &str) {
        let mut inner = lock(&self.inner);
        let handler = inner.sent.remove(&key(run)).map(|s| s.handler);
        let kind = match reason {
            "lost" | "unconfirmed" => Kind::Fault,
            "timeout" => Kind::Error,
            _ => return,
        };
        inner.noted.push((handler, kind));
    }

    /// What was noted since the last call.
    pub fn take_noted(&self) -> Vec<(Option<Arc<str>>, Kind)> {
        std::mem::take(&mut lock(&self.inner).noted)
    }

    /// Whether the node is silent now.
    pub fn is_silent(&self) -> bool {
        lock(&self.inner).silent_since.is_some()
    }

    /// Applies the rule at `now`: a node with a dispatch unanswered for `after` that
    /// has sent nothing for `after` turns silent, and every unanswered dispatch is to
    /// be taken back (while it stays silent, each new one too, at the next check); a
    /// silent node heard from since it turned is answering again.
    pub fn check(&self, now: Instant, after: Duration) -> Verdict {
        let mut inner = lock(&self.inner);
        let mut verdict = Verdict::default();
        match inner.silent_since {
            Some(since) if inner.last_heard > since => {
                inner.silent_since = None;
                verdict.turned = Some(false);
                return verdict;
            }
            Some(_) => {}
            None => {
                let quiet = now.saturating_duration_since(inner.last_heard) >= after;
                let overdue = inner
                    .sent
                    .values()
                    .any(|s| !s.answered && now.saturating_duration_since(s.at) >= after);
                if !(quiet && overdue) {
                    return verdict;
                }
                inner.silent_since = Some(now);
                verdict.turned = Some(true);
            }
        }
        let unanswered: Vec<(String, u32)> = inner
            .sent
            .iter()
            .filter(|(_, s)| !s.answered)
            .map(|(k, _)| k.clone())
            .collect();
        verdict.take_back = unanswered
            .into_iter()
            .filter_map(|k| inner.sent.remove(&k).map(|s| s.run))
            .collect();
        verdict
    }
}

fn key(run: &pb::RunRef) -> (String, u32) {
    (run.schedule_id.clone(), run.shard_index)
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(1);

    fn run(sid: &str, token: u64) -> pb::RunRef {
        pb::RunRef {
            schedule_id: sid.into(),
            attempt: 1,
            fencing_token: token,
            shard_index: 0,
        }
    }

    fn sids(v: &Verdict) -> Vec<String> {
        let mut s: Vec<String> = v.take_back.iter().map(|r| r.schedule_id.clone()).collect();
        s.sort();
        s
    }

    #[test]
    fn a_node_that_answers_is_never_silent() {
        let t0 = Instant::now();
        let l = Liveness::new(t0);
        l.sent(&run("j@1", 5), "h", t0);
        l.heard(t0 + Duration::from_millis(5));
        l.answered(&run("j@1", 5));
        assert_eq!(
            l.check(t0 + Duration::from_secs(30), AFTER),
            Verdict::default()
        );
        // Idle and quiet for long: nothing is asked of it, so nothing is overdue.
        assert!(!l.is_silent());
    }

    #[test]
    fn an_unanswered_dispatch_and_a_quiet_node_make_it_silent() {
        let t0 = Instant::now();
        let l = Liveness::new(t0);
        l.sent(&run("j@1", 5), "h", t0);
        l.sent(&run("j@2", 6), "h", t0 + Duration::from_millis(900));
        // Not yet: overdue needs the whole window.
        assert_eq!(
            l.check(t0 + Duration::from_millis(999), AFTER),
            Verdict::default()
        );
        let v = l.check(t0 + AFTER, AFTER);
        assert_eq!(v.turned, Some(true));
        assert_eq!(sids(&v), ["j@1", "j@2"], "every unanswered one goes");
        assert!(l.is_silent());
        // While silent, a new dispatch goes back at the next check; nothing turns.
        l.sent(&run("j@3", 7), "h", t0 + Duration::from_millis(1100));
        let v = l.check(t0 + Duration::from_millis(1200), AFTER);
        assert_eq!((v.turned, sids(&v)), (None, vec!["j@3".to_owned()]));
        // Heard from again: answering.
        l.heard(t0 + Duration::from_millis(1300));
        let v = l.check(t0 + Duration::from_millis(1400), AFTER);
        assert_eq!(
            v,
            Verdict {
                take_back: vec![],
                turned: Some(false)
            }
        );
        assert!(!l.is_silent());
    }

    #[test]
    fn a_node_heard_from_lately_is_not_silent_yet() {
        let t0 = Instant::now();
        let l = Liveness::new(t0);
        l.sent(&run("j@1", 5), "h", t0);
        // A heartbeat 0.5 s later (not listing it): the node talks, so it waits.
        l.heard(t0 + Duration::from_millis(500));
        assert_eq!(
            l.check(t0 + Duration::from_millis(1200), AFTER),
            Verdict::default()
        );
        let v = l.check(t0 + Duration::from_millis(1500), AFTER);
        assert_eq!(v.turned, Some(true));
    }

    #[test]
    fn an_answer_settles_only_its_own_lease_or_a_later_one() {
        let t0 = Instant::now();
        let l = Liveness::new(t0);
        l.sent(&run("j@1", 9), "h", t0);
        // A late answer about an older lease of the run does not answer this one.
        l.answered(&run("j@1", 8));
        assert_eq!(l.check(t0 + AFTER, AFTER).take_back.len(), 1);
        let l = Liveness::new(t0);
        l.sent(&run("j@1", 9), "h", t0);
        l.answered(&run("j@1", 9));
        assert_eq!(l.check(t0 + AFTER, AFTER), Verdict::default());
    }

    #[test]
    fn the_ledger_names_each_results_handler_and_the_leases_lost() {
        let t0 = Instant::now();
        let l = Liveness::new(t0);
        l.sent(&run("j@1", 5), "noop", t0);
        l.sent(&run("j@2", 6), "slow", t0);
        l.sent(&run("j@3", 7), "slow", t0);
        l.sent(&run("j@4", 8), "noop", t0);
        assert_eq!(l.finished(&run("j@1", 5)).as_deref(), Some("noop"));
        assert_eq!(l.finished(&run("j@1", 5)), None, "settled once");
        l.cancelled(&run("j@2", 6), "lost");
        l.cancelled(&run("j@3", 7), "timeout");
        l.cancelled(&run("j@4", 8), "cancelled by an operator");
        let noted: Vec<(Option<String>, Kind)> = l
            .take_noted()
            .into_iter()
            .map(|(h, k)| (h.map(|h| h.to_string()), k))
            .collect();
        assert_eq!(
            noted,
            [
                (Some("slow".to_owned()), Kind::Fault),
                (Some("slow".to_owned()), Kind::Error)
            ]
        );
        assert!(l.take_noted().is_empty());
        // A heartbeat settles the answered dispatches it no longer lists, and keeps the
        // ones not answered yet (still on their way).
        l.sent(&run("j@5", 9), "noop", t0);
        l.sent(&run("j@6", 10), "noop", t0);
        l.answered(&run("j@5", 9));
        l.listed(&[]);
        assert_eq!(l.finished(&run("j@5", 9)), None);
        assert_eq!(l.finished(&run("j@6", 10)).as_deref(), Some("noop"));
    }
}
