//! Store calls of many deliveries made as one: [`Coalescer`] sends each request at once
//! while fewer than its `concurrency` calls are under way, and otherwise gathers the
//! requests of concurrent callers until a call is done and sends the next with all of
//! them (group commit): at rest each request goes out alone, at once, and under load
//! each call carries a batch, with a few calls in flight so that no request waits for
//! more than one call ahead of its own.

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use tokio::sync::oneshot;

/// Makes one store call for a batch of requests; answers one reply per request, in
/// order (a shorter answer leaves the rest without a reply: their callers see `None`).
pub type Flush<T, R> = Arc<dyn Fn(Vec<T>) -> BoxFuture<'static, Vec<R>> + Send + Sync>;

/// A flush over `call`, a store call that answers all of a batch or fails: a failed
/// call is each request's error (its text).
pub fn fallible<T, R, E, F>(call: F) -> Flush<T, Result<R, String>>
where
    T: Send + 'static,
    R: Send + 'static,
    E: std::fmt::Display + 'static,
    F: Fn(Vec<T>) -> BoxFuture<'static, Result<Vec<R>, E>> + Send + Sync + 'static,
{
    Arc::new(move |batch: Vec<T>| {
        let n = batch.len();
        let answer = call(batch);
        Box::pin(async move {
            match answer.await {
                Ok(replies) => replies.into_iter().map(Ok).collect(),
                Err(e) => {
                    let e = e.to_string();
                    (0..n).map(|_| Err(e.clone())).collect()
                }
            }
        })
    })
}

/// Requests of type `T` answered with `R`, flushed in batches of at most `max`. See the
/// module docs.
pub struct Coalescer<T, R> {
    flush: Flush<T, R>,
    max: usize,
    concurrency: usize,
    state: Arc<Mutex<State<T, R>>>,
}

struct State<T, R> {
    queue: Vec<(T, oneshot::Sender<R>)>,
    /// Flushing tasks under way: each takes what is queued when its call is done.
    flushing: usize,
}

impl<T: Send + 'static, R: Send + 'static> Coalescer<T, R> {
    /// At most `max` requests a call, at most `concurrency` calls at once.
    pub fn new(max: usize, concurrency: usize, flush: Flush<T, R>) -> Self {
        Self {
            flush,
            max: max.max(1),
            concurrency: concurrency.max(1),
            state: Arc::new(Mutex::new(State {
                queue: Vec::new(),
                flushing: 0,
            })),
        }
    }

    /// Sends `request` with the next batch and waits for its reply; None when the
    /// batch's call gave none for it.
    ///
    /// The batches are flushed by a task of their own, which lives while requests
    /// keep coming and ends when none is queued: a caller that stops waiting cancels
    /// nothing but its own wait.
    pub async fn call(&self, request: T) -> Option<R> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut state = lock(&self.state);
            state.queue.push((request, tx));
            let start = state.flushing < self.concurrency;
            if start {
                state.flushing += 1;
            }
            start
        };
        if start {
            tokio::spawn(flush_all(self.state.clone(), self.flush.clone(), self.max));
        }
        rx.await.ok()
    }
}

/// Flushes what is queued, batch after batch, until nothing is.
async fn flush_all<T, R>(state: Arc<Mutex<State<T, R>>>, flush: Flush<T, R>, max: usize) {
    loop {
        let batch: Vec<(T, oneshot::Sender<R>)> = {
            let mut state = lock(&state);
            if state.queue.is_empty() {
                state.flushing -= 1;
                return;
            }
            let n = state.queue.len().min(max);
            state.queue.drain(..n).collect()
        };
        let (requests, replies): (Vec<T>, Vec<oneshot::Sender<R>>) = batch.into_iter().unzip();
        let answers = flush(requests).await;
        for (reply, answer) in replies.into_iter().zip(answers) {
            // The caller may have stopped waiting.
            let _ = reply.send(answer);
        }
    }
}

fn lock<T, R>(state: &Mutex<State<T, R>>) -> std::sync::MutexGuard<'_, State<T, R>> {
    // Each statement leaves the state consistent, so a panic elsewhere cannot leave it
    // half-updated.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A flush that records each batch's size and answers each request doubled, slowly
    /// enough that requests made meanwhile queue up.
    fn doubling(sizes: Arc<Mutex<Vec<usize>>>) -> Flush<u32, u32> {
        Arc::new(move |batch: Vec<u32>| {
            let sizes = sizes.clone();
            Box::pin(async move {
                sizes.lock().expect("sizes").push(batch.len());
                tokio::time::sleep(Duration::from_millis(20)).await;
                batch.into_iter().map(|n| n * 2).collect()
            })
        })
    }

    #[tokio::test]
    async fn concurrent_requests_share_a_call_and_each_gets_its_own_reply() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let c = Arc::new(Coalescer::new(64, 2, doubling(sizes.clone())));
        let calls = (0..100u32).map(|n| {
            let c = c.clone();
            tokio::spawn(async move { (n, c.call(n).await) })
        });
        for call in futures::future::join_all(calls).await {
            let (n, reply) = call.expect("task");
            assert_eq!(reply, Some(n * 2));
        }
        let sizes = sizes.lock().expect("sizes").clone();
        assert_eq!(sizes.iter().sum::<usize>(), 100);
        assert!(sizes.iter().all(|&s| s <= 64), "{sizes:?}");
        assert!(sizes.len() < 100, "batched: {sizes:?}");
    }

    #[tokio::test]
    async fn a_request_at_rest_goes_out_alone_and_the_flusher_ends() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let c = Coalescer::new(64, 2, doubling(sizes.clone()));
        assert_eq!(c.call(1).await, Some(2));
        assert_eq!(c.call(2).await, Some(4));
        assert_eq!(sizes.lock().expect("sizes").clone(), vec![1, 1]);
        assert_eq!(lock(&c.state).flushing, 0);
    }

    #[tokio::test]
    async fn a_failed_call_is_each_requests_error() {
        let c = Arc::new(Coalescer::<u32, Result<u32, String>>::new(
            8,
            1,
            fallible(|_batch: Vec<u32>| Box::pin(async { Err::<Vec<u32>, _>("down") })),
        ));
        let (a, b) = tokio::join!(c.call(1), c.call(2));
        assert_eq!((a, b), (Some(Err("down".into())), Some(Err("down".into()))));
    }

    #[tokio::test]
    async fn a_short_answer_leaves_the_rest_without_a_reply() {
        let c = Arc::new(Coalescer::<u32, u32>::new(
            8,
            1,
            Arc::new(|_batch: Vec<u32>| Box::pin(async { Vec::new() })),
        ));
        assert_eq!(c.call(1).await, None);
    }
}
