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
//! Pure bookkeeping over `Instant`s: the session feeds it what it reads and sends, and
//! acts on [`Liveness::check`]'s verdict.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sundial_proto::v1 as pb;

use crate::dispatch::lock;

/// One attached stream's answers. Shared by the link that sends dispatches, the reader
/// that sees answers and the watch that checks them.
#[derive(Debug)]
pub struct Liveness {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    last_heard: Instant,
    /// Dispatches sent and not answered, by (schedule_id, shard): the lease they were
    /// sent under and when.
    unanswered: HashMap<(String, u32), (pb::RunRef, Instant)>,
    /// Since when the node has been silent, if it is.
    silent_since: Option<Instant>,
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
                unanswered: HashMap::new(),
                silent_since: None,
            }),
        }
    }

    /// A dispatch went down the stream.
    pub fn sent(&self, run: &pb::RunRef, now: Instant) {
        lock(&self.inner)
            .unanswered
            .insert(key(run), (run.clone(), now));
    }

    /// A message came from the node.
    pub fn heard(&self, now: Instant) {
        lock(&self.inner).last_heard = now;
    }

    /// The node answered about this run (`Started`, `Reject`, a `Result`, or a
    /// heartbeat listing it): whatever lease of it was sent is answered.
    pub fn answered(&self, run: &pb::RunRef) {
        let mut inner = lock(&self.inner);
        if let Some((sent, _)) = inner.unanswered.get(&key(run))
            && sent.fencing_token <= run.fencing_token
        {
            inner.unanswered.remove(&key(run));
        }
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
                    .unanswered
                    .values()
                    .any(|(_, at)| now.saturating_duration_since(*at) >= after);
                if !(quiet && overdue) {
                    return verdict;
                }
                inner.silent_since = Some(now);
                verdict.turned = Some(true);
            }
        }
        verdict.take_back = inner.unanswered.drain().map(|(_, (run, _))| run).collect();
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
        l.sent(&run("j@1", 5), t0);
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
        l.sent(&run("j@1", 5), t0);
        l.sent(&run("j@2", 6), t0 + Duration::from_millis(900));
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
        l.sent(&run("j@3", 7), t0 + Duration::from_millis(1100));
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
        l.sent(&run("j@1", 5), t0);
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
        l.sent(&run("j@1", 9), t0);
        // A late answer about an older lease of the run does not answer this one.
        l.answered(&run("j@1", 8));
        assert_eq!(l.check(t0 + AFTER, AFTER).take_back.len(), 1);
        let l = Liveness::new(t0);
        l.sent(&run("j@1", 9), t0);
        l.answered(&run("j@1", 9));
        assert_eq!(l.check(t0 + AFTER, AFTER), Verdict::default());
    }
}
