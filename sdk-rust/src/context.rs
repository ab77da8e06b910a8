//! What a handler receives and what it returns: [`RunContext`] (the dispatch, the
//! cancellation signal, log lines and progress) and [`HandlerError`].

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use sundial_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::handler::now_ms;
use crate::runs::RunKey;

/// A log line longer than this is cut (at a character boundary), so one line can
/// never make a message the server refuses.
const MAX_LINE_BYTES: usize = 8 * 1024;

/// The level of a line sent with [`RunContext::log`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    /// The name sent on the wire: `trace`, `debug`, `info`, `warn` or `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a handler hands to the executor loop while it runs.
#[derive(Debug)]
pub(crate) enum Note {
    Log(RunKey, pb::LogEntry),
    Progress(RunKey, pb::Progress),
}

/// Everything a handler knows about the run it executes. Cheap to clone.
///
/// ```no_run
/// use sundial_sdk::{HandlerError, LogLevel, RunContext};
///
/// async fn resize(ctx: RunContext) -> Result<Vec<u8>, HandlerError> {
///     let image = std::str::from_utf8(ctx.payload())?; // any std error converts
///     ctx.log(LogLevel::Info, format!("resizing {image}"));
///     for step in 1..=4u32 {
///         // Stop early when the server cancels the run or its lease is lost.
///         ctx.until_cancelled(tokio::time::sleep(std::time::Duration::from_secs(1)))
///             .await?;
///         ctx.progress(step * 25, format!("step {step} of 4"));
///     }
///     Ok(format!("{image} resized").into_bytes())
/// }
/// ```
#[derive(Clone)]
pub struct RunContext {
    inner: Arc<Inner>,
}

struct Inner {
    run: RunKey,
    job_id: String,
    handler: String,
    payload: Vec<u8>,
    route_key: String,
    shard_total: u32,
    deadline: Option<Instant>,
    scheduled_at_ms: i64,
    labels: HashMap<String, String>,
    cancel: CancellationToken,
    notes: mpsc::UnboundedSender<Note>,
}

impl fmt::Debug for RunContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inner;
        f.debug_struct("RunContext")
            .field("schedule_id", &i.run.schedule_id)
            .field("attempt", &i.run.attempt)
            .field("fencing_token", &i.run.fencing_token)
            .field("shard_index", &i.run.shard_index)
            .field("job_id", &i.job_id)
            .field("handler", &i.handler)
            .field("payload_len", &i.payload.len())
            .field("cancelled", &i.cancel.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl RunContext {
    pub(crate) fn new(
        run: RunKey,
        dispatch: pb::Dispatch,
        deadline: Option<Instant>,
        cancel: CancellationToken,
        notes: mpsc::UnboundedSender<Note>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                run,
                job_id: dispatch.job_id,
                handler: dispatch.handler,
                payload: dispatch.payload,
                route_key: dispatch.route_key,
                shard_total: dispatch.shard_total,
                deadline,
                scheduled_at_ms: dispatch.scheduled_at_ms,
                labels: dispatch.labels,
                cancel,
                notes,
            }),
        }
    }

    /// The planned execution (`job_id` + schedule number): the same across retries,
    /// and the idempotency key for whatever the handler does downstream.
    pub fn schedule_id(&self) -> &str {
        &self.inner.run.schedule_id
    }

    /// 1 for the first execution of this schedule id, 2 for its first retry, …
    pub fn attempt(&self) -> u32 {
        self.inner.run.attempt
    }

    /// Grows at every lease grant of the job; pass it downstream so that a stale
    /// execution (one whose lease was lost) can be refused there.
    pub fn fencing_token(&self) -> u64 {
        self.inner.run.fencing_token
    }

    pub fn job_id(&self) -> &str {
        &self.inner.job_id
    }

    /// The handler name the run was dispatched to.
    pub fn handler(&self) -> &str {
        &self.inner.handler
    }

    pub fn payload(&self) -> &[u8] {
        &self.inner.payload
    }

    /// The trigger's route key (used by consistent-hash routing); may be empty.
    pub fn route_key(&self) -> &str {
        &self.inner.route_key
    }

    /// This shard's index for a broadcast run (0 otherwise).
    pub fn shard_index(&self) -> u32 {
        self.inner.run.shard_index
    }

    /// How many shards a broadcast run has (0 or 1 otherwise).
    pub fn shard_total(&self) -> u32 {
        self.inner.shard_total
    }

    /// When the server will time the run out, if the job has a timeout. Informational:
    /// at the timeout the server sends `Cancel`, which fires the cancellation signal.
    pub fn deadline(&self) -> Option<Instant> {
        self.inner.deadline
    }

    /// The planned fire time (epoch ms).
    pub fn scheduled_at_ms(&self) -> i64 {
        self.inner.scheduled_at_ms
    }

    /// The labels the dispatch carries.
    pub fn labels(&self) -> &HashMap<String, String> {
        &self.inner.labels
    }

    /// Whether the run was cancelled: by the server (`Cancel`, a timeout, a revoked
    /// lease), or by this executor because its lease ran out without renewal.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }

    /// Completes when the run is cancelled (see [`is_cancelled`](Self::is_cancelled)).
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.inner.cancel.cancelled()
    }

    /// The cancellation signal itself, e.g. to hand to other tasks.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.inner.cancel.clone()
    }

    /// Runs `work` unless the run is cancelled first; then the work is dropped and the
    /// answer is [`HandlerError::cancelled`], ready for `?`.
    pub async fn until_cancelled<F: Future>(&self, work: F) -> Result<F::Output, HandlerError> {
        self.inner
            .cancel
            .run_until_cancelled(work)
            .await
            .ok_or_else(|| HandlerError::cancelled("the run was cancelled"))
    }

    /// Sends a log line to the server, attached to this run. Lines are batched and
    /// always reach the stream before the run's result; very long lines are cut.
    pub fn log(&self, level: LogLevel, message: impl Into<String>) {
        let mut message = message.into();
        if message.len() > MAX_LINE_BYTES {
            let mut cut = MAX_LINE_BYTES;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push('…');
        }
        let line = pb::LogEntry {
            time_ms: now_ms(),
            level: level.as_str().to_owned(),
            message,
        };
        // The loop outlives every handler task it aborts; a send can only fail while
        // the executor itself is being torn down, and then the line has nowhere to go.
        let _ = self
            .inner
            .notes
            .send(Note::Log(self.inner.run.clone(), line));
    }

    /// [`log`](Self::log) at info level.
    pub fn info(&self, message: impl Into<String>) {
        self.log(LogLevel::Info, message);
    }

    /// [`log`](Self::log) at warn level.
    pub fn warn(&self, message: impl Into<String>) {
        self.log(LogLevel::Warn, message);
    }

    /// [`log`](Self::log) at error level.
    pub fn error(&self, message: impl Into<String>) {
        self.log(LogLevel::Error, message);
    }

    /// Reports progress (percent is capped at 100). Sent at once while connected,
    /// dropped otherwise: only the latest figure matters.
    pub fn progress(&self, percent: u32, message: impl Into<String>) {
        let progress = pb::Progress {
            run: Some(self.inner.run.to_proto()),
            percent: percent.min(100),
            message: message.into(),
        };
        let _ = self
            .inner
            .notes
            .send(Note::Progress(self.inner.run.clone(), progress));
    }
}

/// Why a handler did not succeed: a FAILED result with a code and a message, or a
/// CANCELLED one.
///
/// Any `std::error::Error` converts into it (code `"error"`, the message being the
/// error and its sources), so `?` works inside handlers; use [`HandlerError::new`] to
/// choose the code. It deliberately does not implement `std::error::Error` itself, as
/// that blanket conversion would otherwise conflict with the reflexive `From`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerError {
    pub(crate) cancelled: bool,
    pub(crate) code: String,
    pub(crate) message: String,
}

impl HandlerError {
    /// A failure with a machine-readable `code` (e.g. `"bad_payload"`) and a message.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            cancelled: false,
            code: code.into(),
            message: message.into(),
        }
    }

    /// The handler stopped because the run was cancelled: reported as CANCELLED, with
    /// code `"cancelled"`.
    pub fn cancelled(message: impl Into<String>) -> Self {
        Self {
            cancelled: true,
            code: "cancelled".into(),
            message: message.into(),
        }
    }

    pub fn code(&self) -> &str {
        &self.code
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// True for [`HandlerError::cancelled`].
    pub fn is_cancelled(&self) -> bool {
        self.cancelled
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl<E: std::error::Error> From<E> for HandlerError {
    fn from(e: E) -> Self {
        let mut message = e.to_string();
        let mut source = e.source();
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        Self::new("error", message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> (RunContext, mpsc::UnboundedReceiver<Note>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let run = RunKey {
            schedule_id: "job@1".into(),
            attempt: 2,
            shard_index: 1,
            fencing_token: 42,
        };
        let dispatch = pb::Dispatch {
            job_id: "job".into(),
            handler: "h".into(),
            payload: b"p".to_vec(),
            route_key: "rk".into(),
            shard_total: 3,
            ..Default::default()
        };
        let ctx = RunContext::new(run, dispatch, None, CancellationToken::new(), tx);
        (ctx, rx)
    }

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn any_std_error_converts_with_its_sources() {
        fn parse() -> Result<u32, HandlerError> {
            Ok("x".parse::<u32>()?)
        }
        let e = parse().expect_err("not a number");
        assert_eq!(e.code(), "error");
        assert!(!e.is_cancelled());
        let e = HandlerError::from(Outer(std::io::Error::other("inner")));
        assert_eq!(e.message(), "outer: inner");
        assert_eq!(HandlerError::new("boom", "m").to_string(), "boom: m");
        assert!(HandlerError::cancelled("c").is_cancelled());
    }

    #[test]
    fn the_context_reports_the_dispatch() {
        let (ctx, _rx) = context();
        assert_eq!(
            (ctx.schedule_id(), ctx.attempt(), ctx.fencing_token()),
            ("job@1", 2, 42)
        );
        assert_eq!((ctx.shard_index(), ctx.shard_total()), (1, 3));
        assert_eq!(
            (ctx.payload(), ctx.route_key(), ctx.job_id()),
            (&b"p"[..], "rk", "job")
        );
        assert_eq!(ctx.deadline(), None);
    }

    #[test]
    fn log_lines_carry_the_run_and_long_lines_are_cut() {
        let (ctx, mut rx) = context();
        ctx.log(LogLevel::Warn, "hello");
        ctx.info("é".repeat(MAX_LINE_BYTES));
        ctx.progress(250, "almost");
        let Ok(Note::Log(run, line)) = rx.try_recv() else {
            panic!("expected a log line")
        };
        assert_eq!((run.fencing_token, line.level.as_str()), (42, "warn"));
        assert_eq!(line.message, "hello");
        let Ok(Note::Log(_, line)) = rx.try_recv() else {
            panic!("expected a log line")
        };
        assert!(line.message.len() <= MAX_LINE_BYTES + '…'.len_utf8());
        assert!(line.message.ends_with('…'));
        let Ok(Note::Progress(_, p)) = rx.try_recv() else {
            panic!("expected progress")
        };
        assert_eq!(p.percent, 100);
    }

    #[tokio::test]
    async fn until_cancelled_stops_the_work() {
        let (ctx, _rx) = context();
        assert_eq!(ctx.until_cancelled(async { 5 }).await, Ok(5));
        ctx.cancellation_token().cancel();
        let e = ctx
            .until_cancelled(std::future::pending::<()>())
            .await
            .expect_err("cancelled");
        assert!(e.is_cancelled());
        assert!(ctx.is_cancelled());
    }
}
