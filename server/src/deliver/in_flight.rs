//! How many webhook deliveries this instance has in flight to each destination
//! (`scheme://host:port`), and the bound on it, so that one slow or hanging receiver
//! holds at most that many requests and never the slots of the others.
//!
//! A delivery takes a [`Slot`] of its destination before it is sent and gives it back
//! when the slot drops. One that finds the destination at its bound waits for a slot
//! for a while (a busy receiver is not a reason to delay by a whole retry), but no more
//! deliveries wait for one destination than it may have in flight: past that, and past
//! the wait, the caller is told no and defers the delivery. A destination with nothing
//! in flight or waiting has no entry, so the map is as large as the set of destinations
//! being posted to right now.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Deliveries in flight per destination, each at most `limit`.
#[derive(Debug)]
pub struct InFlight {
    limit: usize,
    destinations: Mutex<HashMap<String, Destination>>,
}

#[derive(Debug)]
struct Destination {
    permits: Arc<Semaphore>,
    /// Slots held and callers waiting for one.
    users: usize,
}

/// One delivery's place in its destination's bound, given back on drop.
#[derive(Debug)]
pub struct Slot {
    owner: Arc<InFlight>,
    destination: String,
    /// None while waiting (a slot that never got one is dropped on the way out).
    permit: Option<OwnedSemaphorePermit>,
}

impl InFlight {
    /// At most `limit` (at least one) deliveries in flight to any one destination.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit: limit.max(1),
            destinations: Mutex::new(HashMap::new()),
        })
    }

    /// A slot for one delivery to `destination`: at once if it has fewer than `limit`
    /// in flight; else after waiting up to `wait` for one, unless `limit` callers
    /// already wait for it. None when there is none.
    pub async fn take(self: &Arc<Self>, destination: &str, wait: Duration) -> Option<Slot> {
        let permits = {
            let mut destinations = self.destinations();
            let d = destinations
                .entry(destination.to_owned())
                .or_insert_with(|| Destination {
                    permits: Arc::new(Semaphore::new(self.limit)),
                    users: 0,
                });
            if d.users >= 2 * self.limit {
                return None;
            }
            d.users += 1;
            d.permits.clone()
        };
        let mut slot = Slot {
            owner: self.clone(),
            destination: destination.to_owned(),
            permit: None,
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

    /// Deliveries in flight to `destination` now.
    #[cfg(test)]
    fn count(&self, destination: &str) -> usize {
        self.destinations()
            .get(destination)
            .map_or(0, |d| self.limit - d.permits.available_permits())
    }

    fn destinations(&self) -> std::sync::MutexGuard<'_, HashMap<String, Destination>> {
        // Each statement leaves the map consistent, so a panic elsewhere cannot leave
        // it half-updated.
        self.destinations.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // The permit goes back to its semaphore when the field drops, after this; a
        // semaphore no longer in the map then has no user left to wait on it.
        let mut destinations = self.owner.destinations();
        if let Some(d) = destinations.get_mut(&self.destination) {
            d.users = d.users.saturating_sub(1);
            if d.users == 0 {
                destinations.remove(&self.destination);
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
        let slots = InFlight::new(2);
        let none = Duration::ZERO;
        let a1 = slots.take(A, none).await.expect("first slot");
        let _a2 = slots.take(A, none).await.expect("second slot");
        assert!(slots.take(A, none).await.is_none(), "a third is refused");
        let _b = slots
            .take("http://b:80", none)
            .await
            .expect("another destination has its own");
        drop(a1);
        assert_eq!(slots.count(A), 1);
        assert!(
            slots.take(A, none).await.is_some(),
            "a slot given back is free"
        );
    }

    #[tokio::test]
    async fn a_caller_waits_for_a_slot_given_back_but_only_limit_of_them_wait() {
        let slots = InFlight::new(1);
        let held = slots.take(A, Duration::ZERO).await.expect("first slot");
        let waiter = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.take(A, Duration::from_secs(30)).await.is_some() })
        };
        // Wait until the waiter is counted, then a second waiter is refused at once.
        while slots.destinations()[A].users < 2 {
            tokio::task::yield_now().await;
        }
        assert!(slots.take(A, Duration::from_secs(30)).await.is_none());
        drop(held);
        assert!(waiter.await.expect("waiter"), "the waiter got the slot");
    }

    #[tokio::test]
    async fn a_wait_that_runs_out_is_refused_and_leaves_no_entry() {
        let slots = InFlight::new(1);
        let held = slots.take(A, Duration::ZERO).await.expect("first slot");
        assert!(slots.take(A, Duration::from_millis(20)).await.is_none());
        drop(held);
        assert!(slots.destinations().is_empty());
    }
}
