//! How many webhook deliveries this instance has in flight to each destination
//! (`scheme://host:port`), and the bound on it, so that one slow or hanging receiver
//! holds at most that many requests and never the slots of the others, and at most
//! that many of this instance's deliveries ask the store for one of the destination's
//! shared slots at a time (`Outbox::admit_delivery`).
//!
//! A delivery takes a [`Slot`] of its destination before it is sent and gives it back
//! when the slot drops. One that finds the destination at its bound waits for a slot
//! for a while (a busy receiver is not a reason to delay by a whole retry, and a
//! delivery told no is deferred, which costs the store a write and the delivery a
//! second), in arrival order, but no more than `waiting` of them per destination, so
//! a hanging receiver holds only so many of the instance's claims: past that, and past
//! the wait, the caller is told no and defers the delivery. Each one deferred takes a
//! place in a queue behind the ones ahead of it (in flight, waiting, and deferred
//! before it), at the pace the destination has been answering
//! ([`InFlight::busy_delay`]), so a long queue for one receiver comes back about as
//! fast as it drains, not all at once again and again. The bound is the caller's
//! (a job's limit), so deliveries under different bounds count apart. A destination
//! with nothing in flight or waiting, and no store slot kept, has no entry, so the
//! map is as large as the set of destinations being posted to right now.
//!
//! It also keeps the store slots of a destination this instance holds between two of
//! its deliveries ([`Slot::keep`]): one admitted while nothing was counted on the
//! destination's breaker and answered 2xx need not be settled, so the next delivery to
//! the destination takes it without asking the store ([`Slot::kept`]); a sweep gives
//! back the ones left idle ([`InFlight::stale_idle`]): soon once the destination has
//! no delivery left here (the caller's linger, so that deliveries coming one at a time
//! find the slot the last one kept), else after a longer idle time. A delivery the
//! store refused a slot (the destination's window full across instances) waits for one
//! of those kept slots ([`Slot::wait_kept`]) ahead of the deliveries that come after
//! it: without that, the slots kept by finished deliveries went to the next ones to
//! take a place here, and the refused ones, asking the store again and again, found
//! its window full until their claim ran out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Deliveries in flight per destination and bound.
#[derive(Debug)]
pub struct InFlight {
    /// Deliveries that may wait for one destination (at least its bound).
    waiting: usize,
    /// By (destination, bound).
    destinations: Mutex<HashMap<(String, u32), Destination>>,
}

#[derive(Debug)]
struct Destination {
    permits: Arc<Semaphore>,
    /// Slots held and callers waiting for one.
    users: usize,
    /// Since when the destination has had users.
    since: Instant,
    /// How long a sent delivery held its slot from when it went out, on average
    /// (weighted to the latest): the destination's pace (what it waited for the
    /// store's slot before is the queue's, not the receiver's: counted, it made a
    /// window ramping up after an outage look like a receiver ten times slower, and
    /// the deliveries deferred behind it came back tens of seconds late); None until
    /// one was sent.
    hold: Option<Duration>,
    /// When the last delivery deferred for this destination should find a slot.
    queue_end: Instant,
    /// Store slots held with no delivery in them, newest last.
    idle: Vec<Kept>,
    /// Deliveries the store refused a slot, waiting for a kept one (`Slot::wait_kept`).
    refused: usize,
    /// Told when a slot is kept while some of them wait, or the store may have room.
    kept_ready: Arc<Notify>,
    /// When one of them may ask the store again (one at a time, `ask_gap` apart).
    next_ask: Instant,
}

/// A store slot this instance holds for a destination between two deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// Its holder in the store.
    pub holder: String,
    /// When the store last admitted it, clean.
    pub admitted: Instant,
    /// Since when it has had no delivery.
    idle_since: Instant,
}

impl Kept {
    pub fn new(holder: String, admitted: Instant) -> Self {
        Self {
            holder,
            admitted,
            idle_since: Instant::now(),
        }
    }
}

/// One delivery's place in its destination's bound, given back on drop.
#[derive(Debug)]
pub struct Slot {
    owner: Arc<InFlight>,
    key: (String, u32),
    /// The permit; None while waiting (a slot that never got one is dropped on the
    /// way out).
    permit: Option<OwnedSemaphorePermit>,
    /// When the delivery went out with it.
    sent: Option<Instant>,
}

impl InFlight {
    /// At most `waiting` (at least the bound) deliveries wait for one destination.
    pub fn new(waiting: usize) -> Arc<Self> {
        Arc::new(Self {
            waiting,
            destinations: Mutex::default(),
        })
    }

    /// A slot for one delivery to `destination` under `limit` (at least one): at once
    /// if fewer than `limit` under it are in flight; else after waiting up to `wait`
    /// for one, unless `waiting` (or `limit`, if more) callers already wait for it.
    /// None when there is none.
    pub async fn take(
        self: &Arc<Self>,
        destination: &str,
        limit: u32,
        wait: Duration,
    ) -> Option<Slot> {
        let limit = limit.max(1);
        let key = (destination.to_owned(), limit);
        let permits = {
            let mut destinations = self.destinations();
            let d = destinations
                .entry(key.clone())
                .or_insert_with(|| Destination {
                    permits: Arc::new(Semaphore::new(usize::try_from(limit).unwrap_or(1))),
                    users: 0,
                    since: Instant::now(),
                    hold: None,
                    queue_end: Instant::now(),
                    idle: Vec::new(),
                    refused: 0,
                    kept_ready: Arc::new(Notify::new()),
                    next_ask: Instant::now(),
                });
            let limit = usize::try_from(limit).unwrap_or(1);
            if d.users >= limit + self.waiting.max(limit) {
                return None;
            }
            d.users += 1;
            d.permits.clone()
        };
        let mut slot = Slot {
            owner: self.clone(),
            key,
            permit: None,
            sent: None,
        };
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => tokio::time::timeout(wait, permits.acquire_owned())
                .await
                .ok()?
                .ok()?,
        };
        slot.permit = Some(permit);
        Some(slot)
    }

    /// Deliveries in flight to `destination` under `limit` now.
    #[cfg(test)]
    fn count(&self, destination: &str, limit: u32) -> usize {
        self.destinations()
            .get(&(destination.to_owned(), limit))
            .map_or(0, |d| limit as usize - d.permits.available_permits())
    }

    /// How long a delivery deferred now for `destination` under `limit` should stay
    /// away: behind the ones in flight and waiting, and behind those deferred before
    /// it, one place per delivery at the pace of `limit` deliveries each holding its
    /// slot as long as sent ones have (while none was sent: as long as the
    /// destination has been in use). It takes that place. `min` at least (and when
    /// nothing is queued), `max` at most.
    pub fn busy_delay(
        &self,
        destination: &str,
        limit: u32,
        min: Duration,
        max: Duration,
    ) -> Duration {
        let limit = limit.max(1);
        let mut destinations = self.destinations();
        let Some(d) = destinations.get_mut(&(destination.to_owned(), limit)) else {
            return min;
        };
        let now = Instant::now();
        let per_delivery = d.hold.unwrap_or_else(|| d.since.elapsed()) / limit;
        let queued = u32::try_from(d.users).unwrap_or(u32::MAX);
        let start = (now + per_delivery.saturating_mul(queued).min(max)).max(d.queue_end);
        d.queue_end = start + per_delivery.min(max);
        (start - now).clamp(min, max)
    }

    /// Takes out the store slots kept idle for longer than `idle_for`, or for longer
    /// than `unused_for` where no delivery to their destination is left, to be given
    /// back: (destination, holder).
    pub fn stale_idle(&self, idle_for: Duration, unused_for: Duration) -> Vec<(String, String)> {
        let mut stale = Vec::new();
        self.destinations().retain(|(dest, _), d| {
            let idle_for = if d.users == 0 { unused_for } else { idle_for };
            d.idle.retain(|k| {
                let keep = k.idle_since.elapsed() < idle_for;
                if !keep {
                    stale.push((dest.clone(), k.holder.clone()));
                }
                keep
            });
            d.users > 0 || !d.idle.is_empty()
        });
        stale
    }

    fn destinations(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u32), Destination>> {
        // Each statement leaves the map consistent, so a panic elsewhere cannot leave
        // it half-updated.
        self.destinations.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Slot {
    /// The delivery goes out with this slot: how long it holds it from now counts
    /// toward the destination's pace.
    pub fn sending(&mut self) {
        self.sent = Some(Instant::now());
    }
}

impl Slot {
    /// A store slot of the destination kept by an earlier delivery (the newest), taken
    /// for this one; none while deliveries the store refused wait for one (they come
    /// first: [`wait_kept`](Self::wait_kept)).
    pub fn kept(&self) -> Option<Kept> {
        let mut destinations = self.owner.destinations();
        let d = destinations.get_mut(&self.key)?;
        if d.refused > 0 {
            return None;
        }
        d.idle.pop()
    }

    /// Whether deliveries the store refused a slot wait for a kept one (a delivery
    /// about to ask the store would most likely be refused too: it queues behind
    /// them with [`wait_kept`](Self::wait_kept)).
    pub fn refused_wait(&self) -> bool {
        self.owner
            .destinations()
            .get(&self.key)
            .is_some_and(|d| d.refused > 0)
    }

    /// For a delivery the store refused a slot: a store slot of the destination kept
    /// by an earlier delivery (ahead of the deliveries that ask for one with
    /// [`kept`](Self::kept)), or None when it is this one's turn to ask the store
    /// again (those waiting ask one at a time, `ask_gap` apart, sooner after the store
    /// admitted one: [`store_answered`](Self::store_answered)) or `wait` is over.
    pub async fn wait_kept(&self, wait: Duration, ask_gap: Duration) -> Option<Kept> {
        let ready = {
            let mut destinations = self.owner.destinations();
            let d = destinations.get_mut(&self.key)?;
            if let Some(k) = d.idle.pop() {
                return Some(k);
            }
            d.refused += 1;
            d.kept_ready.clone()
        };
        let _waiting = Refused(self);
        let deadline = Instant::now() + wait;
        loop {
            let turn = {
                let mut destinations = self.owner.destinations();
                let d = destinations.get_mut(&self.key)?;
                if let Some(k) = d.idle.pop() {
                    return Some(k);
                }
                let now = Instant::now();
                if d.next_ask <= now || deadline <= now {
                    d.next_ask = now + ask_gap;
                    return None;
                }
                d.next_ask.min(deadline)
            };
            let _ = tokio::time::timeout_at(turn.into(), ready.notified()).await;
        }
    }

    /// What the store answered a delivery of this destination that asked it for a
    /// slot: when it admitted one, it may have room for more, and the next delivery
    /// waiting (`wait_kept`) asks at once.
    pub fn store_answered(&self, admitted: bool) {
        if !admitted {
            return;
        }
        if let Some(d) = self.owner.destinations().get_mut(&self.key) {
            d.next_ask = Instant::now();
            if d.refused > 0 {
                d.kept_ready.notify_one();
            }
        }
    }

    /// Keeps a store slot of the destination for a later delivery (first for one the
    /// store refused, if one waits).
    pub fn keep(&self, kept: Kept) {
        if let Some(d) = self.owner.destinations().get_mut(&self.key) {
            d.idle.push(Kept {
                idle_since: Instant::now(),
                ..kept
            });
            if d.refused > 0 {
                d.kept_ready.notify_one();
            }
        }
    }

    /// One user fewer; a sent delivery's hold counts toward the pace.
    fn count_off(d: &mut Destination, sent: Option<Instant>) {
        d.users = d.users.saturating_sub(1);
        if let Some(sent) = sent {
            let held = sent.elapsed();
            d.hold = Some(d.hold.map_or(held, |h| (h * 4 + held) / 5));
        }
    }
}

/// A delivery of `Slot::wait_kept` counted among those waiting, until it drops.
struct Refused<'a>(&'a Slot);

impl Drop for Refused<'_> {
    fn drop(&mut self) {
        if let Some(d) = self.0.owner.destinations().get_mut(&self.0.key) {
            d.refused = d.refused.saturating_sub(1);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // The permit goes back to its semaphore when the field drops, after this; a
        // semaphore no longer in the map then has no user left to wait on it. A
        // destination with store slots kept idle stays until they are given back
        // (`InFlight::stale_idle`).
        let mut destinations = self.owner.destinations();
        if let Some(d) = destinations.get_mut(&self.key) {
            Self::count_off(d, self.sent);
            if d.users == 0 && d.idle.is_empty() {
                destinations.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "http://a:80";

    #[tokio::test]
    async fn a_destination_gets_at_most_its_limit_and_others_are_not_held_by_it() {
        let slots = InFlight::new(0);
        let none = Duration::ZERO;
        let a1 = slots.take(A, 2, none).await.expect("first slot");
        let _a2 = slots.take(A, 2, none).await.expect("second slot");
        assert!(slots.take(A, 2, none).await.is_none(), "a third is refused");
        let _b = slots
            .take("http://b:80", 2, none)
            .await
            .expect("another destination has its own");
        drop(a1);
        assert_eq!(slots.count(A, 2), 1);
        assert!(
            slots.take(A, 2, none).await.is_some(),
            "a slot given back is free"
        );
    }

    #[tokio::test]
    async fn a_caller_waits_for_a_slot_given_back_but_only_so_many_wait() {
        let slots = InFlight::new(2);
        let held = slots.take(A, 1, Duration::ZERO).await.expect("first slot");
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let slots = slots.clone();
                tokio::spawn(
                    async move { slots.take(A, 1, Duration::from_secs(30)).await.is_some() },
                )
            })
            .collect();
        // Wait until both waiters are counted, then a third is refused at once.
        while slots.destinations()[&(A.to_owned(), 1)].users < 3 {
            tokio::task::yield_now().await;
        }
        assert!(slots.take(A, 1, Duration::from_secs(30)).await.is_none());
        drop(held);
        for waiter in waiters {
            assert!(
                waiter.await.expect("waiter"),
                "each waiter got the slot in turn"
            );
        }
    }

    #[tokio::test]
    async fn a_busy_destination_defers_by_its_queue_at_its_pace() {
        let (min, max) = (Duration::from_secs(1), Duration::from_secs(30));
        let none = Duration::ZERO;
        let slots = InFlight::new(8);
        assert_eq!(slots.busy_delay(A, 4, min, max), min, "nothing queued");
        // Four held and none sent back yet: the longer that lasts, the longer.
        let held = take_n(&slots, 4, 4).await;
        std::thread::sleep(Duration::from_millis(50));
        let waited = slots.busy_delay(A, 4, none, max);
        assert!(waited >= Duration::from_millis(50), "{waited:?}");
        let cap = Duration::from_millis(10);
        assert_eq!(slots.busy_delay(A, 4, none, cap), cap, "never above max");
        drop(held);
        assert_eq!(slots.busy_delay(A, 4, min, max), min, "the queue is gone");
        // Ten sent after waiting 200 ms for the store's slot (a window ramping up),
        // each holding its slot about 20 ms from then, at a limit of 10: the wait is
        // not the receiver's pace, so one place is about 2 ms, ten queued put the
        // first deferred about 20 ms back and each next one about 2 ms behind it.
        let mut sent = take_n(&slots, 10, 10).await;
        std::thread::sleep(Duration::from_millis(200));
        for s in &mut sent {
            s.sending();
        }
        std::thread::sleep(Duration::from_millis(20));
        // One stays, so the destination keeps its figures.
        let kept = sent.pop();
        drop(sent);
        let _queued = (kept, take_n(&slots, 10, 9).await);
        let first = slots.busy_delay(A, 10, none, max);
        assert!(
            first >= Duration::from_millis(16) && first <= Duration::from_millis(100),
            "{first:?}"
        );
        let delays: Vec<Duration> = (0..20)
            .map(|_| slots.busy_delay(A, 10, none, max))
            .collect();
        assert!(delays.windows(2).all(|w| w[1] > w[0]), "{delays:?}");
        let spread = delays[19] - delays[0];
        assert!(
            spread >= Duration::from_millis(30) && spread <= Duration::from_millis(200),
            "19 places of about 2 ms: {spread:?}"
        );
        assert!(slots.busy_delay(A, 10, min, max) >= min, "never below min");
    }

    async fn take_n(slots: &Arc<InFlight>, limit: u32, n: usize) -> Vec<Slot> {
        let mut held = Vec::new();
        for _ in 0..n {
            held.push(slots.take(A, limit, Duration::ZERO).await.expect("slot"));
        }
        held
    }

    /// A delivery the store refused waits for a kept slot and gets the next one kept,
    /// ahead of a delivery that comes after it; those waiting ask the store one at a
    /// time, `ask_gap` apart, or at once after the store admitted one.
    #[tokio::test]
    async fn refused_deliveries_get_kept_slots_first_and_ask_the_store_in_turn() {
        let slots = InFlight::new(4);
        let at = Instant::now();
        let gap = Duration::from_millis(300);
        let long = Duration::from_secs(30);
        let refused = slots.take(A, 4, Duration::ZERO).await.expect("slot");
        let sender = slots.take(A, 4, Duration::ZERO).await.expect("slot");
        // Nothing kept, and its turn to ask the store has come: None at once.
        assert_eq!(refused.wait_kept(long, gap).await, None);
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move {
                let s = slots.take(A, 4, Duration::ZERO).await.expect("slot");
                let got = s.wait_kept(long, gap).await;
                (got, s)
            }
        });
        let newcomer = slots.take(A, 4, Duration::ZERO).await.expect("slot");
        while !newcomer.refused_wait() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        sender.keep(Kept::new("h1".into(), at));
        assert_eq!(newcomer.kept(), None, "the waiting one comes first");
        let (got, waited) = waiting.await.expect("waiter");
        assert_eq!(got.map(|k| k.holder), Some("h1".to_owned()));
        assert!(!newcomer.refused_wait(), "no one waits now");
        // Two wait with nothing kept: they ask the store in turn, `gap` apart.
        let started = Instant::now();
        let (a, b) = tokio::join!(waited.wait_kept(long, gap), newcomer.wait_kept(long, gap));
        assert_eq!((a, b), (None, None));
        assert!(started.elapsed() >= gap / 2, "{:?}", started.elapsed());
        // After the store admitted one, the next asks at once.
        refused.store_answered(true);
        let started = Instant::now();
        assert_eq!(newcomer.wait_kept(long, gap).await, None);
        assert!(started.elapsed() < gap, "{:?}", started.elapsed());
        // The wait is bounded: before its turn comes, it ends.
        let started = Instant::now();
        assert_eq!(
            newcomer.wait_kept(Duration::from_millis(20), gap).await,
            None
        );
        let waited_for = started.elapsed();
        assert!(waited_for >= Duration::from_millis(20), "{waited_for:?}");
    }

    #[tokio::test]
    async fn kept_store_slots_go_to_the_next_delivery_and_back_once_idle() {
        let slots = InFlight::new(4);
        let at = Instant::now();
        let long = Duration::from_secs(60);
        let first = slots.take(A, 2, Duration::ZERO).await.expect("slot");
        assert_eq!(first.kept(), None, "nothing kept yet");
        let second = slots.take(A, 2, Duration::ZERO).await.expect("slot");
        first.keep(Kept::new("h1".into(), at));
        drop(first);
        let third = slots.take(A, 2, Duration::ZERO).await.expect("slot");
        let kept = third.kept().expect("the kept slot");
        assert_eq!((kept.holder.as_str(), kept.admitted), ("h1", at));
        third.keep(kept);
        drop(third);
        // While a delivery to the destination is under way, the kept slot goes back
        // once idle for the longer time only.
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            slots.stale_idle(long, Duration::from_millis(10)).is_empty(),
            "in use"
        );
        drop(second);
        // With none left, it stays for the next delivery while not idle long...
        assert!(slots.stale_idle(long, long).is_empty(), "not idle long");
        let fourth = slots.take(A, 2, Duration::ZERO).await.expect("slot");
        let kept = fourth.kept().expect("kept across the gap");
        fourth.keep(kept);
        drop(fourth);
        // ...and goes back once idle for the shorter time.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            slots.stale_idle(long, Duration::from_millis(10)),
            vec![(A.to_owned(), "h1".to_owned())]
        );
        assert!(slots.destinations().is_empty());
    }

    #[tokio::test]
    async fn a_wait_that_runs_out_is_refused_and_leaves_no_entry() {
        let slots = InFlight::new(0);
        let held = slots.take(A, 1, Duration::ZERO).await.expect("first slot");
        assert!(slots.take(A, 1, Duration::from_millis(20)).await.is_none());
        drop(held);
        assert!(slots.destinations().is_empty());
    }
}
