//! Registered handlers and what one execution comes to: a handler is an async function
//! of a [`RunContext`]; its return value, or its panic, becomes an [`Outcome`] and then
//! the wire `Result` (SUCCEEDED, FAILED with the handler's code, FAILED `"panic"`,
//! CANCELLED).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use sundial_proto::v1 as pb;
use tokio::task::JoinError;

use crate::{HandlerError, RunContext};

/// What a handler returns: its output bytes, or why it did not succeed.
pub type HandlerResult = Result<Vec<u8>, HandlerError>;

type BoxedRun = Pin<Box<dyn Future<Output = HandlerResult> + Send + 'static>>;

/// One registered handler, type-erased so that handlers of different types live in one
/// map.
#[derive(Clone)]
pub(crate) struct Handler(Arc<dyn Fn(RunContext) -> BoxedRun + Send + Sync>);

impl Handler {
    pub fn new<F, Fut>(f: F) -> Self
    where
        F: Fn(RunContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        Self(Arc::new(move |ctx| Box::pin(f(ctx))))
    }

    pub fn call(&self, ctx: RunContext) -> BoxedRun {
        (self.0)(ctx)
    }
}

impl fmt::Debug for Handler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Handler")
    }
}

/// How one execution ended, before it is addressed to its run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Outcome {
    pub result: HandlerResult,
    pub finished_at_ms: i64,
}

impl Outcome {
    /// The handler returned just now.
    pub fn returned(result: HandlerResult) -> Self {
        Self {
            result,
            finished_at_ms: now_ms(),
        }
    }

    /// The handler's task did not return: it panicked (FAILED, code `"panic"`, with
    /// the panic message) or was aborted.
    pub fn from_join_error(e: JoinError) -> Self {
        let error = if e.is_panic() {
            let payload = e.into_panic();
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "the handler panicked".to_owned());
            HandlerError::new("panic", message)
        } else {
            HandlerError::cancelled("the handler task was aborted")
        };
        Self::returned(Err(error))
    }

    pub fn into_result(self, run: pb::RunRef, started_at_ms: i64) -> pb::Result {
        let (status, output, error_code, error_message) = match self.result {
            Ok(output) => (
                pb::ResultStatus::Succeeded,
                output,
                String::new(),
                String::new(),
            ),
            Err(e) => {
                let status = if e.cancelled {
                    pb::ResultStatus::Cancelled
                } else {
                    pb::ResultStatus::Failed
                };
                (status, Vec::new(), e.code, e.message)
            }
        };
        pb::Result {
            run: Some(run),
            status: status as i32,
            output,
            error_code,
            error_message,
            started_at_ms,
            finished_at_ms: self.finished_at_ms,
        }
    }
}

/// Wall-clock now, in epoch milliseconds (for timestamps on the wire only; deadlines
/// use the monotonic clock).
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> pb::RunRef {
        pb::RunRef {
            schedule_id: "s".into(),
            attempt: 1,
            fencing_token: 3,
            shard_index: 0,
        }
    }

    #[test]
    fn outcomes_map_to_statuses() {
        let ok = Outcome::returned(Ok(b"out".to_vec())).into_result(run(), 5);
        assert_eq!(ok.status, pb::ResultStatus::Succeeded as i32);
        assert_eq!((ok.output.as_slice(), ok.started_at_ms), (&b"out"[..], 5));
        assert!(ok.finished_at_ms >= 5);

        let failed = Outcome::returned(Err(HandlerError::new("boom", "m"))).into_result(run(), 0);
        assert_eq!(failed.status, pb::ResultStatus::Failed as i32);
        assert_eq!(
            (failed.error_code.as_str(), failed.error_message.as_str()),
            ("boom", "m")
        );

        let cancelled = Outcome::returned(Err(HandlerError::cancelled("c"))).into_result(run(), 0);
        assert_eq!(cancelled.status, pb::ResultStatus::Cancelled as i32);
        assert_eq!(cancelled.error_code, "cancelled");
    }

    #[tokio::test]
    async fn a_panic_becomes_a_failure_with_its_message() {
        let join = |f: fn() -> HandlerResult| async move {
            match tokio::spawn(async move { f() }).await {
                Ok(_) => panic!("expected a panic"),
                Err(e) => Outcome::from_join_error(e).into_result(run(), 0),
            }
        };
        let r = join(|| panic!("static message")).await;
        assert_eq!(r.status, pb::ResultStatus::Failed as i32);
        assert_eq!(
            (r.error_code.as_str(), r.error_message.as_str()),
            ("panic", "static message")
        );
        let r = join(|| panic!("formatted {}", 7)).await;
        assert_eq!(r.error_message, "formatted 7");
    }
}
