//! The instance's long-running parts, all started the same way and watched: each is a
//! named future that runs until the stop token is cancelled (`run(self, stop)`), inside
//! a span naming it. One that panics, or returns while it should still run, is logged
//! as an error and ends the instance ([`Loops::first_failure`]): a server whose
//! sweeper died would otherwise go on accepting work it can no longer finish.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use tokio::task::{Id, JoinError, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, error, info_span, warn};

/// Why a loop ended before it was asked to.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoopFailure {
    #[error("loop {name} panicked: {message}")]
    Panicked { name: &'static str, message: String },
    #[error("loop {name} returned while the server was running")]
    Returned { name: &'static str },
}

/// The set of running loops.
pub struct Loops {
    set: JoinSet<&'static str>,
    names: HashMap<Id, &'static str>,
    stop: CancellationToken,
}

impl Loops {
    /// Loops that run until `stop` is cancelled.
    pub fn new(stop: CancellationToken) -> Self {
        Self {
            set: JoinSet::new(),
            names: HashMap::new(),
            stop,
        }
    }

    /// The token every loop is given: cancelled when the loops are to stop.
    pub fn stop(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Starts `run` as the loop `name` (in a span `loop{name}`).
    pub fn spawn(&mut self, name: &'static str, run: impl Future<Output = ()> + Send + 'static) {
        let handle = self.set.spawn(
            async move {
                run.await;
                name
            }
            .instrument(info_span!("loop", name)),
        );
        self.names.insert(handle.id(), name);
    }

    /// Waits until a loop ends before the stop token is cancelled, and says why (it
    /// is also logged); pending forever while every loop runs.
    pub async fn first_failure(&mut self) -> LoopFailure {
        loop {
            let Some(ended) = self.set.join_next_with_id().await else {
                // No loop left to fail.
                return std::future::pending().await;
            };
            if let Some(failure) = self.judge(ended) {
                error!(error = %failure, "a loop of this instance failed: shutting down");
                return failure;
            }
        }
    }

    /// Cancels every loop and waits up to `grace` for all of them to end; a panic
    /// while stopping is logged and returned too.
    pub async fn stop_all(mut self, grace: Duration) -> Option<LoopFailure> {
        self.stop.cancel();
        let mut failure = None;
        let drained = tokio::time::timeout(grace, async {
            while let Some(ended) = self.set.join_next_with_id().await {
                if let Some(f) = self.judge(ended) {
                    error!(error = %f, "a loop failed while stopping");
                    failure.get_or_insert(f);
                }
            }
        })
        .await;
        if drained.is_err() {
            let left: Vec<&str> = self.names.values().copied().collect();
            warn!(loops = ?left, "loops did not stop within the shutdown grace period");
            self.set.abort_all();
        }
        failure
    }

    /// A loop's end: a failure if it panicked, or returned before the stop.
    fn judge(&mut self, ended: Result<(Id, &'static str), JoinError>) -> Option<LoopFailure> {
        match ended {
            Ok((id, name)) => {
                self.names.remove(&id);
                (!self.stop.is_cancelled()).then_some(LoopFailure::Returned { name })
            }
            Err(e) => {
                let name = self.names.remove(&e.id()).unwrap_or("unknown");
                if e.is_cancelled() {
                    return None;
                }
                Some(LoopFailure::Panicked {
                    name,
                    message: panic_message(e),
                })
            }
        }
    }
}

fn panic_message(e: JoinError) -> String {
    match e.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_owned()),
        Err(e) => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_or_an_early_return_is_a_failure_a_stop_is_not() {
        let mut loops = Loops::new(CancellationToken::new());
        let stop = loops.stop();
        loops.spawn("steady", async move { stop.cancelled().await });
        loops.spawn("broken", async { panic!("boom") });
        match loops.first_failure().await {
            LoopFailure::Panicked { name, message } => {
                assert_eq!((name, message.as_str()), ("broken", "boom"));
            }
            other => panic!("{other:?}"),
        }
        let stop = loops.stop();
        loops.spawn("quitter", async {});
        assert!(matches!(
            loops.first_failure().await,
            LoopFailure::Returned { name: "quitter" }
        ));
        loops.spawn("steady-2", async move { stop.cancelled().await });
        assert!(loops.stop_all(Duration::from_secs(5)).await.is_none());
    }

    #[tokio::test]
    async fn a_loop_that_ignores_the_stop_is_aborted_after_the_grace() {
        let mut loops = Loops::new(CancellationToken::new());
        loops.spawn("deaf", std::future::pending());
        assert!(loops.stop_all(Duration::from_millis(50)).await.is_none());
    }
}
