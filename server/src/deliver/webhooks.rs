//! Webhook delivery: the worker that empties the store's outbox.
//!
//! The outbox entry of a run is written by the store in the step that makes the run
//! final (see `store` and ARCHITECTURE.md "The webhook outbox"). Every instance runs one
//! [`Deliveries`] worker that sweeps every partition's due entries (like the run
//! sweeper), claims them (`claim_deliveries`: one store call for a sweep's entries,
//! each gets a delivery token and a lease; their jobs' bounds and signers from
//! [`Senders`], which reads only the jobs it does not keep), POSTs each
//! entry's body to its URL and records the outcome under that token
//! (`finish_delivery`). A worker whose lease ran out may still finish its request, but
//! its outcome is refused: the later claim owns the delivery.
//!
//! Most webhooks never wait for a sweep: the executor streams of an instance have the
//! store claim the webhook a result makes due for their instance's worker in the step
//! that applies the result (`Finish::claim_webhook`, while the worker has room for
//! more claims: [`Deliveries::claim_lease_for`]) and hand the claims over
//! ([`Deliveries::hand_over`]); from there a delivery goes as a swept one does. One
//! handed over to an instance that stops or dies comes due again when its claim's
//! lease ends. `sundial_webhook_claims_total{by}` counts both ways.
//!
//! Each attempt is signed afresh (`sundial_sdk::webhook::headers`: both header schemes,
//! a new timestamp and nonce, `webhook-id` = the schedule_id, the same body bytes).
//! 2xx is delivered; 410 Gone stops at once (CALLBACK_FAILED), and so does an egress
//! refusal (the host now resolves only to refused addresses: no retry gets past the
//! policy; an address literal the policy refuses is refused when the job is saved);
//! anything else, a redirect (never followed) or a timeout is a failed attempt,
//! retried on the retry schedule with ±20% jitter until the schedule is spent or the
//! delivery is older than its max age: then CALLBACK_FAILED and an alert (an error log
//! line `alert="callback_failed"`). The run's result is never touched.
//!
//! A circuit breaker per destination (`scheme://host:port`) lives in the store, shared
//! by every instance: while it is open a due delivery is deferred to the end of the
//! cool-down without spending an attempt (never past its max age); once the cool-down
//! is over one claimer sends a probe, whose outcome closes or re-opens it.
//!
//! Deliveries are paced per destination, across every instance: each holds one of its
//! destination's slots in the store while it is sent (`admit_delivery_clean` to
//! `settle_delivery`), at most `max_in_flight_per_destination` of them, fewer while
//! the destination ramps up after its breaker closed (from one slot, one more per
//! answer). One that finds no slot asks again while its claim lease leaves time, then
//! is deferred; waiting spends no attempt. A slot admitted while nothing was counted
//! on the destination's breaker, whose delivery was answered 2xx, is not settled (that
//! would only give it back): the instance keeps it for its next delivery to the
//! destination, which sends without asking the store, for [`KEEP_FRESH`] after the
//! store last admitted it (then it is asked for again under the same holder); a sweep
//! gives back those idle for [`KEEP_FRESH`], or for [`LINGER`] once the instance has
//! no delivery left to the destination (`InFlight`). So under load a slot turns over
//! in the time of a POST rather than a POST and two store round trips, also when the
//! deliveries come one at a time as their results do.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use sundial_sdk::webhook::{self, Secret};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::deliver::alerts::{AlertKind, Alerts};
use crate::deliver::batch::{Coalescer, fallible};
use crate::deliver::in_flight::{InFlight, Kept, Slot};
use crate::deliver::senders::{Sender, Senders};
use crate::egress::{self, EgressPolicy};
use crate::model::duration_ms;
use crate::store::{
    Admission, AppStore, Applied, BreakerState, CleanAdmission, DeliveryOutcome, DeliveryResult,
    DeliveryTerms, DueEntries, JobStore, Outbox, Pacer, SettleRequest, WebhookDelivery,
};

/// How the worker delivers. Every interval is configurable, so tests run the same code
/// with millisecond schedules.
#[derive(Debug, Clone)]
pub struct WebhookOptions {
    /// The `X-Sundial-App-Id` header.
    pub app_id: String,
    /// Every delivery is signed with each (two while rotating). `Debug` redacts them.
    pub secrets: Vec<Secret>,
    /// One attempt's limit, connect to last byte.
    pub timeout: Duration,
    /// Delay before each retry, in order; its length is the number of retries.
    pub retry_schedule: Vec<Duration>,
    /// A delivery this old (since its run became final) is given up.
    pub max_age: Duration,
    /// Consecutive failed attempts that open a destination's breaker.
    pub breaker_failures: u32,
    /// How long an open breaker defers deliveries before a probe.
    pub breaker_cooldown: Duration,
    /// How long a claim owns a delivery; a worker that takes longer (or dies) loses it
    /// to the next claimer.
    pub claim_lease: Duration,
    /// How often each partition's outbox is swept.
    pub every: Duration,
    /// Due entries read per partition and pass.
    pub batch: usize,
    /// Deliveries one instance has in flight at once.
    pub max_in_flight: usize,
    /// Deliveries in flight to one destination (`scheme://host:port`) at once, counted
    /// across every instance through the store (`Outbox::admit_delivery`; after the
    /// destination's breaker closes, its window ramps up from one to this). A delivery
    /// past it, or past `max_in_flight`, waits for a slot (no longer than what its
    /// claim lease leaves beyond the attempt's timeout, and no more of this instance's
    /// waiting for one destination than twice `max_in_flight`), else it is deferred
    /// ([`BUSY_DEFER`], or behind the queue for its destination, see
    /// `InFlight::busy_delay`), no attempt spent.
    pub max_in_flight_per_destination: u32,
}

/// How long a delivery is deferred when its destination or the instance had its bound
/// in flight for as long as it could wait (at least: one that found this instance's
/// queue for the destination full is deferred by as long as that queue takes to drain
/// at the destination's pace, at most [`BUSY_DEFER_MAX`]).
pub const BUSY_DEFER: Duration = Duration::from_secs(1);

/// The longest a delivery is deferred for a busy destination.
pub const BUSY_DEFER_MAX: Duration = Duration::from_secs(30);

/// While the store finds a destination's window full, this instance's deliveries
/// waiting for a slot there ask it again one at a time, this far apart (at once after
/// it admitted one); meanwhile they take the slots its other deliveries keep.
const ADMIT_ASK_GAP: Duration = Duration::from_millis(50);

impl Default for WebhookOptions {
    fn default() -> Self {
        Self {
            app_id: "sundial".to_owned(),
            secrets: Vec::new(),
            timeout: Duration::from_secs(15),
            retry_schedule: [1, 5, 30, 120, 600]
                .into_iter()
                .map(Duration::from_secs)
                .collect(),
            max_age: Duration::from_secs(24 * 3600),
            breaker_failures: 5,
            breaker_cooldown: Duration::from_secs(30),
            claim_lease: Duration::from_secs(25),
            every: Duration::from_millis(200),
            batch: 256,
            max_in_flight: 512,
            max_in_flight_per_destination: 64,
        }
    }
}

/// Parses a retry schedule: comma-separated durations (`1s,5s,30s,2m,10m`), each > 0.
pub fn parse_retry_schedule(text: &str) -> Result<Vec<Duration>, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim) {
        let d = humantime::parse_duration(part)
            .map_err(|e| format!("{part:?} is not a duration like 50ms, 5s, 2m: {e}"))?;
        if d.is_zero() {
            return Err(format!("{part:?}: every delay must be > 0"));
        }
        out.push(d);
    }
    if out.is_empty() {
        return Err("needs at least one delay".to_owned());
    }
    Ok(out)
}

/// The breaker key of a URL: `scheme://host:port` (the port made explicit).
pub fn destination(url: &url::Url) -> String {
    format!(
        "{}://{}:{}",
        url.scheme(),
        url.host_str().unwrap_or(""),
        url.port_or_known_default().unwrap_or(0)
    )
}

/// A request error with its causes ("connection refused" is a cause, not the error),
/// without the URL, which may carry credentials and is known to whoever reads it.
fn causes(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// `base` ±20%, uniformly.
///
/// A base of a second or more never jitters below one second: two attempts then never
/// share a `webhook-timestamp` (whole seconds), so a receiver's replay cache keyed on
/// id and timestamp (the Standard Webhooks way) never takes a retry for a replay.
fn jittered(base: Duration) -> Duration {
    let floor = base.min(Duration::from_secs(1));
    base.mul_f64(rand::random_range(0.8..=1.2)).max(floor)
}

/// What one POST came to.
enum Attempt {
    /// The receiver answered (any status; redirects are not followed).
    Answered(u16),
    /// No answer: (error code, message) — `timeout`, `egress_refused`, `http_error`.
    NoAnswer(&'static str, String),
}

/// The store traits the delivery worker uses.
#[derive(Clone)]
pub struct WebhookStore {
    /// The deliveries it claims and finishes, and the shared breakers.
    pub outbox: Arc<dyn Outbox>,
    /// A delivery's job, for the app that signs it.
    pub jobs: Arc<dyn JobStore>,
    /// That app's secrets.
    pub apps: Arc<dyn AppStore>,
}

/// The delivery worker of one instance. See the module docs.
pub struct Deliveries {
    store: WebhookStore,
    alerts: Arc<Alerts>,
    opts: WebhookOptions,
    egress: Arc<EgressPolicy>,
    client: reqwest::Client,
    /// Deliveries in flight (`max_in_flight`).
    permits: Arc<Semaphore>,
    /// Deliveries claimed and not finished: four times `max_in_flight`, so that the
    /// ones waiting for a busy destination (at most half of them) never stop the sweep
    /// claiming for the others.
    claims: Arc<Semaphore>,
    /// The per-destination bound.
    in_flight: Arc<InFlight>,
    tasks: TaskTracker,
    /// Deliveries a task of this worker is claiming, so the next sweep does not start
    /// a second claim of the same one (the store would refuse it; this saves the call).
    claiming: Mutex<HashSet<String>>,
    /// The outcomes of concurrent deliveries, recorded together.
    outcomes: Coalescer<DeliveryResult, Result<Applied, String>>,
    /// This worker's store-slot holders: a random prefix and a counter.
    holders: (String, AtomicU64),
    /// How each job's webhooks go out.
    senders: Senders,
    /// The worker's shutdown, once it runs: deliveries handed over by the executor
    /// streams ([`Self::hand_over`]) stop with it.
    running: OnceLock<CancellationToken>,
}

/// A store slot a delivery sends with (see `Deliveries::store_slot`).
struct StoreSlot {
    holder: String,
    /// When the store last admitted it.
    admitted: Instant,
    /// Admitted while nothing was counted on the destination's breaker.
    clean: bool,
}

/// How long a store slot kept between deliveries is used without asking the store
/// again (which renews it and says again whether the breaker is clean), and how long
/// one kept idle stays this instance's before it is given back.
const KEEP_FRESH: Duration = Duration::from_secs(1);

/// How long a store slot kept for a destination stays this instance's after its last
/// delivery there ended: deliveries that come one at a time (handed over as their
/// results come in) take it without asking the store, where giving it back at once made
/// every other one ask (`admit_delivery`) and give back (`settle_deliveries`) again.
/// Short beside the pause between two asks of a delivery refused a slot ([`ADMIT_ASK_GAP`]).
const LINGER: Duration = Duration::from_millis(20);

/// Requests one batched store call carries at most.
const BATCH_MAX: usize = 256;

/// Batched store calls of one kind in flight at once.
const BATCH_CALLS: usize = 4;

/// The outcomes of concurrent deliveries, recorded together (`finish_deliveries`, see
/// `batch`). (Admitting to a destination and settling its slot sit inside each
/// delivery's slot time, so they go out alone: waiting for a batch there made each
/// slot turn over slower.)
fn outcome_batches(outbox: &Arc<dyn Outbox>) -> Coalescer<DeliveryResult, Result<Applied, String>> {
    let outbox = outbox.clone();
    Coalescer::new(
        BATCH_MAX,
        BATCH_CALLS,
        fallible(move |b| {
            let outbox = outbox.clone();
            Box::pin(async move { outbox.finish_deliveries(b).await })
        }),
    )
}

impl Deliveries {
    /// Builds the HTTP client under the webhook egress policy (no redirects, no proxies).
    pub fn new(
        store: WebhookStore,
        opts: WebhookOptions,
        egress: Arc<EgressPolicy>,
        alerts: Arc<Alerts>,
    ) -> Result<Self, reqwest::Error> {
        // No fallback to a default client: it would bypass the egress policy.
        let client = egress::client_builder(egress.clone())
            .timeout(opts.timeout)
            .user_agent(concat!("Sundial-Webhook/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self {
            permits: Arc::new(Semaphore::new(opts.max_in_flight.max(1))),
            claims: Arc::new(Semaphore::new(opts.max_in_flight.max(1) * 4)),
            // A burst for one destination waits here (not claimed and deferred again
            // and again), but a hanging one holds at most half of the claims.
            in_flight: InFlight::new(opts.max_in_flight.max(1) * 2),
            outcomes: outcome_batches(&store.outbox),
            holders: (format!("{:016x}", rand::random::<u64>()), AtomicU64::new(0)),
            senders: Senders::new(
                store.jobs.clone(),
                store.apps.clone(),
                opts.max_in_flight_per_destination,
                opts.app_id.clone(),
                opts.secrets.clone(),
            ),
            store,
            alerts,
            opts,
            egress,
            client,
            tasks: TaskTracker::new(),
            claiming: Mutex::new(HashSet::new()),
            running: OnceLock::new(),
        })
    }

    /// Sweeps the outbox until `shutdown`; then stops the requests in flight (their
    /// claims run out and another instance, or this one after a restart, retries) and
    /// gives back the destinations' slots it kept.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        if self.opts.secrets.is_empty() {
            warn!("no --webhook-secret: webhooks are sent unsigned");
        }
        info!(every = ?self.opts.every, schedule = ?self.opts.retry_schedule, "webhook delivery started");
        let _ = self.running.set(shutdown.clone());
        let pacer = Pacer::new(
            self.store.outbox.partitions(),
            self.opts.every,
            self.store.outbox.activity(),
        );
        tokio::join!(
            pacer.run(&shutdown, |p| self.sweep(p, &shutdown)),
            self.give_back_idle(&shutdown)
        );
        self.tasks.close();
        self.tasks.wait().await;
        self.give_back(self.in_flight.stale_idle(Duration::ZERO, Duration::ZERO))
            .await;
        info!("webhook delivery stopped");
    }

    /// Claims the partition's due deliveries, each sent by a task of its own; answers
    /// what the store said of them (None when it could not be asked).
    async fn sweep(
        self: &Arc<Self>,
        partition: u32,
        shutdown: &CancellationToken,
    ) -> Option<DueEntries> {
        let due = match self
            .store
            .outbox
            .poll_due_deliveries(partition, self.opts.batch)
            .await
        {
            Ok(d) => d,
            Err(e) => {
                warn!(partition, error = %e, "reading due webhooks failed");
                return None;
            }
        };
        let mut batch = Vec::with_capacity(due.ids.len());
        for schedule_id in &due.ids {
            let claim = tokio::select! {
                () = shutdown.cancelled() => return None,
                p = self.claims.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return None,
                },
            };
            if self.claiming().insert(schedule_id.clone()) {
                batch.push((schedule_id.clone(), claim));
            }
        }
        if !batch.is_empty() {
            // Claimed in a task of its own, so the sweep goes on to the next partition.
            let this = self.clone();
            let shutdown = shutdown.clone();
            self.tasks
                .spawn(async move { this.claim_and_deliver(batch, shutdown).await });
        }
        Some(due)
    }

    /// Claims the sweep's due deliveries in one store call (per partition) and has
    /// their senders (the jobs not kept read in one more); each claimed delivery is then
    /// sent by a task of its own,
    /// holding its claim permit until it is done.
    async fn claim_and_deliver(
        self: Arc<Self>,
        batch: Vec<(String, OwnedSemaphorePermit)>,
        shutdown: CancellationToken,
    ) {
        let ids: Vec<String> = batch.iter().map(|(sid, _)| sid.clone()).collect();
        let claimed = self
            .store
            .outbox
            .claim_deliveries(&ids, self.opts.claim_lease)
            .await;
        {
            let mut claiming = self.claiming();
            for sid in &ids {
                claiming.remove(sid);
            }
        }
        // The ones not claimed were claimed by another worker meanwhile, or are gone.
        let claimed = match claimed {
            Ok(claimed) => claimed,
            Err(e) => {
                warn!(deliveries = ids.len(), error = %e, "claiming webhooks failed; they stay due");
                return;
            }
        };
        let mut permits: HashMap<String, OwnedSemaphorePermit> = batch.into_iter().collect();
        let claimed = claimed
            .into_iter()
            .filter_map(|d| {
                let permit = permits.remove(&d.schedule_id)?;
                Some((d, permit))
            })
            .collect::<Vec<_>>();
        self.alerts
            .metrics()
            .webhook_claimed("sweep", claimed.len());
        self.deliver_claimed(claimed, shutdown).await;
    }

    /// The claim lease under which an executor stream may have the store claim the
    /// webhooks of `results` results for this worker (`Finish::claim_webhook`), so that
    /// they go out at once, with no sweep and no claim call: while the worker runs and
    /// has room for that many more claims; None otherwise (the sweep claims them).
    pub fn claim_lease_for(&self, results: usize) -> Option<Duration> {
        let running = self.running.get().is_some_and(|s| !s.is_cancelled());
        (running && self.claims.available_permits() >= results).then_some(self.opts.claim_lease)
    }

    /// Delivers the webhooks the store claimed for this worker as it applied their
    /// results (see [`Self::claim_lease_for`]), each holding a claim permit as a swept
    /// one does. Before the worker runs or once it stops, nothing: the claims run out
    /// and the deliveries come due again.
    pub fn hand_over(self: &Arc<Self>, claimed: Vec<WebhookDelivery>) {
        let Some(shutdown) = self.running.get().cloned() else {
            return;
        };
        if claimed.is_empty() || shutdown.is_cancelled() {
            return;
        }
        self.alerts
            .metrics()
            .webhook_claimed("result", claimed.len());
        let this = self.clone();
        self.tasks.spawn(async move {
            let mut batch = Vec::with_capacity(claimed.len());
            for d in claimed {
                // Room was asked for before the claims were made; a permit is waited
                // for only when concurrent streams took it meanwhile.
                let permit = tokio::select! {
                    () = shutdown.cancelled() => return,
                    p = this.claims.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => return,
                    },
                };
                batch.push((d, permit));
            }
            this.deliver_claimed(batch, shutdown).await;
        });
    }

    /// Has the senders of claimed deliveries (the jobs not kept read in one store
    /// call) and sends each by a task of its own, holding its claim permit until done.
    async fn deliver_claimed(
        self: &Arc<Self>,
        claimed: Vec<(WebhookDelivery, OwnedSemaphorePermit)>,
        shutdown: CancellationToken,
    ) {
        let deliveries: Vec<WebhookDelivery> = claimed.iter().map(|(d, _)| d.clone()).collect();
        let senders = self.senders.for_claims(&deliveries).await;
        for (d, permit) in claimed {
            let sender = self.senders.of(&senders, &d.job_id);
            let span = info_span!(
                "webhook",
                job_id = %d.job_id,
                schedule_id = %d.schedule_id,
                attempt = d.attempts + 1
            );
            let this = self.clone();
            let shutdown = shutdown.clone();
            self.tasks.spawn(
                async move {
                    this.deliver(d, &sender, &shutdown).await;
                    drop(permit);
                }
                .instrument(span),
            );
        }
    }

    fn claiming(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        // Each statement leaves the set consistent, so a panic elsewhere cannot leave
        // it half-updated.
        self.claiming.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One claimed delivery: the breaker, the attempt, the outcome.
    async fn deliver(&self, d: WebhookDelivery, sender: &Sender, shutdown: &CancellationToken) {
        let claimed_at = Instant::now();
        let deadline = d.created_at.saturating_add(duration_ms(self.opts.max_age));
        if d.now >= deadline {
            let error = format!("max_age: not delivered within {:?}", self.opts.max_age);
            self.finish(&d, DeliveryOutcome::Abandon { error }).await;
            return;
        }
        let url = match url::Url::parse(&d.url) {
            Ok(u) => u,
            Err(e) => {
                let error = format!("bad_url: {:?} does not parse: {e}", d.url);
                self.finish(&d, DeliveryOutcome::Abandon { error }).await;
                return;
            }
        };
        let dest = destination(&url);
        let limit = sender.limit;
        let busy = DeliveryOutcome::Defer {
            until: d.now.saturating_add(duration_ms(BUSY_DEFER)).min(deadline),
        };
        // This instance's own bound first, so at most `limit` of its deliveries ask
        // the store for one of the destination's slots at a time.
        let wait = self.wait_budget(claimed_at) / 2;
        let Some(mut local) = self.in_flight.take(&dest, limit, wait).await else {
            // Back when the ones queued ahead of it should be through.
            let delay = self
                .in_flight
                .busy_delay(&dest, limit, BUSY_DEFER, BUSY_DEFER_MAX);
            debug!(destination = %dest, ?delay, "destination at its in-flight bound: deferred");
            let until = d.now.saturating_add(duration_ms(delay)).min(deadline);
            self.finish_counted(&d, DeliveryOutcome::Defer { until }, "busy")
                .await;
            return;
        };
        let slot = match self.store_slot(&local, &dest, limit, claimed_at).await {
            Ok(slot) => slot,
            Err(Some(Admission::Open { until })) => {
                debug!(destination = %dest, until, "webhook circuit breaker open: deferred");
                let until = until.min(deadline);
                self.finish(&d, DeliveryOutcome::Defer { until }).await;
                return;
            }
            Err(Some(Admission::Full { window })) => {
                debug!(destination = %dest, window, "destination's window in flight: deferred");
                self.finish_counted(&d, busy, "busy").await;
                return;
            }
            // Logged; the claim runs out and the delivery is retried, no attempt spent.
            Err(_) => return,
        };
        let holder = slot.holder.as_str();
        let terms = self.terms(limit, claimed_at);
        let in_flight = match tokio::time::timeout(
            self.wait_budget(claimed_at),
            self.permits.acquire(),
        )
        .await
        {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return,
            Err(_) => {
                debug!("the instance had its bound in flight: deferred");
                self.settle(&dest, holder, None, &terms).await;
                self.finish_counted(&d, busy, "busy").await;
                return;
            }
        };
        local.sending();
        let attempt = tokio::select! {
            () = shutdown.cancelled() => {
                debug!("shutting down mid-delivery; the claim and the slot run out and the delivery is retried");
                return;
            }
            a = self.attempt(&d, &url, sender) => a,
        };
        // The receiver has answered (or not): the instance's slot is free while the
        // outcome is recorded. The destination's is kept for this instance's next
        // delivery there when nothing is counted on its breaker and this one was a
        // 2xx (settling would only give it back); else it is given back with the
        // breaker's count. Only then this instance's own slot goes (so the next of its
        // deliveries waiting for the destination never finds the store's count not yet
        // lowered); the store slots kept for the destination stay for the next
        // (`give_back_idle` gives them back when none comes).
        drop(in_flight);
        let answered = match &attempt {
            Attempt::Answered(status) => Some((200..300).contains(status) || *status == 410),
            // An egress refusal says nothing about the destination's health.
            Attempt::NoAnswer(code, _) => (*code != "egress_refused").then_some(false),
        };
        let delivered =
            matches!(attempt, Attempt::Answered(status) if (200..300).contains(&status));
        if slot.clean && delivered {
            local.keep(Kept::new(slot.holder.clone(), slot.admitted));
        } else {
            self.settle(&dest, holder, answered, &terms).await;
        }
        drop(local);
        let outcome = self.outcome(&d, attempt, claimed_at, deadline);
        self.finish(&d, outcome).await;
    }

    /// What an attempt comes to: delivered, gone, retried or failed.
    fn outcome(
        &self,
        d: &WebhookDelivery,
        attempt: Attempt,
        claimed_at: Instant,
        deadline: crate::model::Millis,
    ) -> DeliveryOutcome {
        let (status, error) = match attempt {
            Attempt::Answered(status) if (200..300).contains(&status) => {
                return DeliveryOutcome::Delivered { status };
            }
            // The receiver asked us to stop: it is reachable, and done with us.
            Attempt::Answered(410) => return DeliveryOutcome::Gone,
            Attempt::Answered(status) => (
                status,
                format!("http_{status}: the receiver answered {status}"),
            ),
            // No retry would get past the policy: the delivery fails at once (the
            // address its host resolves to now is one the policy refuses).
            Attempt::NoAnswer("egress_refused", message) => {
                let error = format!(
                    "egress_refused: {message} (the egress policy refuses it: not retried)"
                );
                return DeliveryOutcome::Failed { status: 0, error };
            }
            Attempt::NoAnswer(code, message) => (0, format!("{code}: {message}")),
        };
        let made = d.attempts + 1;
        let Some(&delay) = self
            .opts
            .retry_schedule
            .get(usize::try_from(d.attempts).unwrap_or(usize::MAX))
        else {
            return DeliveryOutcome::Failed {
                status,
                error: format!("{error} (attempt {made}; retries spent)"),
            };
        };
        let after = jittered(delay);
        let store_now = d.now.saturating_add(duration_ms(claimed_at.elapsed()));
        if store_now.saturating_add(duration_ms(after)) >= deadline {
            return DeliveryOutcome::Failed {
                status,
                error: format!(
                    "{error} (attempt {made}; the next would pass the max age of {:?})",
                    self.opts.max_age
                ),
            };
        }
        DeliveryOutcome::Retry {
            after,
            status,
            error,
        }
    }

    /// The store slot of `dest` a delivery holding `local` sends with: one this
    /// instance kept for the destination, admitted clean within [`KEEP_FRESH`] (no
    /// store call), else one the store admits now (a kept one admitted longer ago is
    /// asked for again under its holder, its lease renewed). While the store finds the
    /// destination's window full and the claim leaves time, it waits for a slot
    /// another delivery of this instance keeps (`Slot::wait_kept`: first in line for
    /// it) or its turn to ask the store again; while other deliveries do so, it queues
    /// behind them before it asks. Err with the admission that refused it (None: the
    /// store could not be asked, logged). The last of this instance's deliveries
    /// waiting so for the destination to stop ends its waiting mark in the store.
    async fn store_slot(
        &self,
        local: &Slot,
        dest: &str,
        limit: u32,
        claimed_at: Instant,
    ) -> Result<StoreSlot, Option<Admission>> {
        let mut waited = false;
        let slot = self
            .wait_store_slot(local, dest, limit, claimed_at, &mut waited)
            .await;
        if waited && !local.refused_wait() {
            self.end_waiting(dest).await;
        }
        slot
    }

    /// `store_slot`'s asking and waiting; `waited` is set once the store refused the
    /// delivery (marking this instance waiting) or it waits among those it refused.
    async fn wait_store_slot(
        &self,
        local: &Slot,
        dest: &str,
        limit: u32,
        claimed_at: Instant,
        waited: &mut bool,
    ) -> Result<StoreSlot, Option<Admission>> {
        let mut kept = local.kept();
        if kept.is_none() && local.refused_wait() {
            *waited = true;
            // Behind the deliveries the store refused, without asking it first.
            kept = local
                .wait_kept(self.wait_budget(claimed_at), ADMIT_ASK_GAP)
                .await;
        }
        loop {
            if let Some(k) = kept.as_ref().filter(|k| k.admitted.elapsed() < KEEP_FRESH) {
                return Ok(StoreSlot {
                    holder: k.holder.clone(),
                    admitted: k.admitted,
                    clean: true,
                });
            }
            let was_kept = kept.is_some();
            let holder = kept.map_or_else(|| self.new_holder(), |k| k.holder);
            let admitted = Instant::now();
            let admission = self.admit(dest, &holder, limit, claimed_at).await;
            let clean = match admission {
                Some(CleanAdmission {
                    admission: Admission::Go,
                    clean,
                }) => Some(clean),
                Some(CleanAdmission {
                    admission: Admission::Probe,
                    ..
                }) => {
                    info!(destination = %dest, "webhook circuit breaker half-open: this delivery is the probe");
                    Some(false)
                }
                _ => None,
            };
            local.store_answered(clean.is_some());
            if let Some(clean) = clean {
                return Ok(StoreSlot {
                    holder,
                    admitted,
                    clean,
                });
            }
            // Refused, this instance is marked waiting in the store.
            *waited |= matches!(
                admission,
                Some(CleanAdmission {
                    admission: Admission::Full { .. },
                    ..
                })
            );
            // A kept slot the store did not renew: whatever it still holds goes back.
            if was_kept {
                self.give_back(vec![(dest.to_owned(), holder)]).await;
            }
            match admission {
                Some(CleanAdmission {
                    admission: Admission::Full { .. },
                    ..
                }) if !self.wait_budget(claimed_at).is_zero() => {
                    kept = local
                        .wait_kept(self.wait_budget(claimed_at), ADMIT_ASK_GAP)
                        .await;
                }
                Some(CleanAdmission { admission, .. }) => return Err(Some(admission)),
                None => return Err(None),
            }
        }
    }

    /// Ends this instance's waiting mark for `dest` in the store (see
    /// `Outbox::end_waiting`); a failure leaves it to run out (logged).
    async fn end_waiting(&self, dest: &str) {
        if let Err(e) = self.store.outbox.end_waiting(dest, &self.holders.0).await {
            warn!(destination = %dest, error = %e, "ending this instance's waiting mark failed; it runs out by itself");
        }
    }

    /// A holder name for a store slot, unique across instances.
    fn new_holder(&self) -> String {
        let n = self.holders.1.fetch_add(1, Ordering::Relaxed);
        format!("{}#{n}", self.holders.0)
    }

    /// Gives store slots back (destination, holder), in one store call; a failure
    /// leaves them to run out with their lease (logged).
    async fn give_back(&self, slots: Vec<(String, String)>) {
        if slots.is_empty() {
            return;
        }
        let terms = self.terms(self.opts.max_in_flight_per_destination, Instant::now());
        let requests = slots
            .into_iter()
            .map(|(destination, holder)| SettleRequest {
                destination,
                holder,
                answered: None,
                terms,
            })
            .collect();
        if let Err(e) = self.store.outbox.settle_deliveries(requests).await {
            warn!(error = %e, "giving back the destinations' slots kept idle failed; they run out with their lease");
        }
    }

    /// Gives back, every half [`LINGER`] until `shutdown` and then all at once, the
    /// store slots kept idle for [`KEEP_FRESH`], or for [`LINGER`] where this instance
    /// has no delivery left to their destination.
    async fn give_back_idle(&self, shutdown: &CancellationToken) {
        let mut tick = tokio::time::interval(LINGER / 2);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            self.give_back(self.in_flight.stale_idle(KEEP_FRESH, LINGER))
                .await;
        }
    }

    /// The destination's admission for `holder`. None when the store could not be
    /// asked (logged).
    async fn admit(
        &self,
        dest: &str,
        holder: &str,
        limit: u32,
        claimed_at: Instant,
    ) -> Option<CleanAdmission> {
        let terms = self.terms(limit, claimed_at);
        match self
            .store
            .outbox
            .admit_delivery_clean(dest, holder, &terms)
            .await
        {
            Ok(admission) => Some(admission),
            Err(e) => {
                warn!(destination = %dest, error = %e, "admitting the webhook to its destination failed; the claim runs out and it is retried");
                None
            }
        }
    }

    /// The terms of a delivery claimed at `claimed_at`: its destination's slot lasts
    /// as long as the claim.
    fn terms(&self, limit: u32, claimed_at: Instant) -> DeliveryTerms {
        DeliveryTerms {
            limit,
            lease: self.opts.claim_lease.saturating_sub(claimed_at.elapsed()),
            // A probe that never reports (its instance died) is presumed lost after this.
            probe: self.opts.timeout + Duration::from_secs(5),
            threshold: self.opts.breaker_failures,
            cool_down: self.opts.breaker_cooldown,
        }
    }

    /// How much longer a delivery claimed at `claimed_at` may wait for a slot: its
    /// claim lease keeps the attempt's timeout and a second for the outcome.
    fn wait_budget(&self, claimed_at: Instant) -> Duration {
        self.opts
            .claim_lease
            .saturating_sub(self.opts.timeout + Duration::from_secs(1))
            .saturating_sub(claimed_at.elapsed())
    }

    /// POSTs the body once, signed afresh.
    async fn attempt(&self, d: &WebhookDelivery, url: &url::Url, sender: &Sender) -> Attempt {
        if let Err(e) = self.egress.check_url(url) {
            return Attempt::NoAnswer("egress_refused", e.to_string());
        }
        let timestamp = crate::auth::unix_now();
        let nonce = format!("{:032x}", rand::random::<u128>());
        let mut req = self
            .client
            .post(url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json");
        for (name, value) in webhook::headers(
            &sender.app_id,
            &sender.secrets,
            &d.schedule_id,
            timestamp,
            &nonce,
            d.body.as_bytes(),
        ) {
            req = req.header(name, value);
        }
        match req.body(d.body.clone()).send().await {
            Ok(resp) => Attempt::Answered(resp.status().as_u16()),
            Err(e) => match egress::refusal(&e) {
                Some(refused) => Attempt::NoAnswer("egress_refused", refused.to_string()),
                None if e.is_timeout() => Attempt::NoAnswer("timeout", causes(e)),
                None => Attempt::NoAnswer("http_error", causes(e)),
            },
        }
    }

    /// Gives back the destination's slot and counts the attempt on its breaker.
    async fn settle(
        &self,
        dest: &str,
        holder: &str,
        answered: Option<bool>,
        terms: &DeliveryTerms,
    ) {
        match self
            .store
            .outbox
            .settle_delivery(dest, holder, answered, terms)
            .await
        {
            Ok(Some(u)) if u.changed => match u.state {
                BreakerState::Open { until } => {
                    self.alerts.metrics().set_circuit(dest, true);
                    warn!(
                        destination = %dest,
                        until,
                        cooldown = ?self.opts.breaker_cooldown,
                        "webhook circuit breaker opened: deliveries to this destination wait"
                    );
                }
                _ => {
                    self.alerts.metrics().set_circuit(dest, false);
                    info!(destination = %dest, "webhook circuit breaker closed");
                }
            },
            Ok(_) => {}
            Err(e) => {
                warn!(destination = %dest, error = %e, "recording on the circuit breaker failed; the slot runs out with its lease")
            }
        }
    }

    /// Records the outcome under the claim's token and says what became of it.
    async fn finish(&self, d: &WebhookDelivery, outcome: DeliveryOutcome) {
        let counted = match &outcome {
            DeliveryOutcome::Delivered { .. } => "delivered",
            DeliveryOutcome::Retry { .. } => "retry",
            DeliveryOutcome::Failed { .. } => "failed",
            DeliveryOutcome::Gone => "gone",
            DeliveryOutcome::Abandon { .. } => "abandoned",
            DeliveryOutcome::Defer { .. } => "circuit_open",
        };
        self.finish_counted(d, outcome, counted).await;
    }

    /// `finish`, counted in `sundial_webhook_attempts_total` under `counted`.
    async fn finish_counted(
        &self,
        d: &WebhookDelivery,
        outcome: DeliveryOutcome,
        counted: &'static str,
    ) {
        let result = DeliveryResult {
            schedule_id: d.schedule_id.clone(),
            token: d.token,
            outcome: outcome.clone(),
        };
        let applied = match self
            .outcomes
            .call(result)
            .await
            .unwrap_or_else(|| Err("no answer".to_owned()))
        {
            Ok(a) => a,
            Err(e) => {
                warn!(error = %e, "recording the webhook outcome failed; the claim runs out and the delivery is retried");
                return;
            }
        };
        if let Applied::No(reason) = applied {
            warn!(%reason, token = d.token, "webhook outcome refused: a later claim owns this delivery");
            return;
        }
        let attempts = d.attempts + 1;
        self.alerts.metrics().webhook_attempt(counted);
        let alert = |detail: &str| {
            self.alerts
                .raise(AlertKind::CallbackFailed, &d.job_id, &d.schedule_id, detail);
        };
        match outcome {
            DeliveryOutcome::Delivered { status } => {
                info!(status, attempts, "webhook delivered");
            }
            DeliveryOutcome::Retry {
                after,
                status,
                error,
            } => {
                info!(status, %error, retry_in = ?after, "webhook attempt failed; retrying");
            }
            DeliveryOutcome::Defer { .. } => {}
            DeliveryOutcome::Gone => alert(&format!(
                "the receiver answered 410 Gone after {attempts} attempt(s); retries stopped (the run's result is kept)"
            )),
            DeliveryOutcome::Abandon { error } => alert(&format!(
                "given up after {} attempt(s): {error} (the run's result is kept)",
                d.attempts
            )),
            DeliveryOutcome::Failed { status, error } => alert(&format!(
                "not delivered after {attempts} attempt(s), last status {status}: {error} (the run's result is kept)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_keeps_second_scale_retries_a_second_apart() {
        for _ in 0..1000 {
            let d = jittered(Duration::from_secs(1));
            assert!(
                d >= Duration::from_secs(1) && d <= Duration::from_millis(1200),
                "{d:?}"
            );
            let d = jittered(Duration::from_secs(30));
            assert!(
                d >= Duration::from_secs(24) && d <= Duration::from_secs(36),
                "{d:?}"
            );
            let d = jittered(Duration::from_millis(100));
            assert!(
                d >= Duration::from_millis(80) && d <= Duration::from_millis(120),
                "{d:?}"
            );
        }
    }
    use crate::model::{CallbackState, RunRecord, RunState};
    use crate::store::conformance::{job, plan, planned_run};
    use crate::store::{Finisher, LeaseTerms, NodeSlot, Outcome, Store};

    /// A final run of job "w" whose webhook goes to `url`, in a fresh embedded store.
    async fn finished_run(url: &str) -> (Arc<dyn Store>, String, tempfile::TempDir) {
        let (store, dir) = crate::deliver::test_support::test_store();
        store.create_job(job("w", None)).await.expect("create");
        let mut p = plan(crate::model::OverlapPolicy::Allow);
        p.callback_url = Some(url.to_owned());
        let run: RunRecord = store
            .begin_run(planned_run("w", 1000, p), Duration::from_secs(30))
            .await
            .expect("begin")
            .run;
        let node = NodeSlot {
            node_id: "n".into(),
            max_concurrency: 0,
        };
        let terms = LeaseTerms {
            ttl: Duration::from_secs(60),
            confirm_within: Duration::from_secs(60),
        };
        let crate::store::Assigned::Granted(g) = store
            .assign_run(&run.schedule_id, 1, &node, terms)
            .await
            .expect("assign")
        else {
            panic!("not granted");
        };
        let outcome = Outcome {
            state: RunState::Succeeded,
            output: None,
            error_code: String::new(),
            error_message: String::new(),
            started_at: None,
            finished_at: None,
        };
        store
            .finish_run(
                &run.schedule_id,
                Finisher::Holder(crate::store::Holder::of(&g)),
                outcome,
            )
            .await
            .expect("finish");
        (store, run.schedule_id, dir)
    }

    fn deliveries(store: &Arc<dyn Store>, allow: &str, breaker_failures: u32) -> Deliveries {
        with_options(
            store,
            allow,
            WebhookOptions {
                breaker_failures,
                ..test_options()
            },
        )
    }

    fn test_options() -> WebhookOptions {
        WebhookOptions {
            secrets: vec![Secret::generate()],
            timeout: Duration::from_secs(5),
            retry_schedule: vec![Duration::from_millis(10)],
            ..WebhookOptions::default()
        }
    }

    fn with_options(store: &Arc<dyn Store>, allow: &str, opts: WebhookOptions) -> Deliveries {
        let allow = egress::parse_allow_list(allow).expect("allow list");
        Deliveries::new(
            WebhookStore {
                outbox: store.clone(),
                jobs: store.clone(),
                apps: store.clone(),
            },
            opts,
            Arc::new(EgressPolicy::webhooks(allow)),
            Arc::new(Alerts::unread()),
        )
        .expect("client")
    }

    /// Sends a claimed delivery as the worker's sweep would.
    async fn deliver(w: &Deliveries, d: WebhookDelivery) {
        let senders = w.senders.for_claims(std::slice::from_ref(&d)).await;
        let sender = w.senders.of(&senders, &d.job_id);
        w.deliver(d, &sender, &CancellationToken::new()).await;
    }

    /// Claims the run's delivery and makes one attempt; returns the run after it.
    async fn one_attempt(store: &Arc<dyn Store>, w: &Deliveries, sid: &str) -> RunRecord {
        let d = store
            .claim_delivery(sid, Duration::from_secs(30))
            .await
            .expect("claim")
            .expect("due");
        deliver(w, d).await;
        store.get_run(sid).await.expect("get").expect("run")
    }

    /// A destination's window of `limit` slots as another instance would ask for one.
    fn window(limit: u32) -> DeliveryTerms {
        DeliveryTerms {
            limit,
            lease: Duration::from_secs(30),
            probe: Duration::from_secs(5),
            threshold: 5,
            cool_down: Duration::from_secs(30),
        }
    }

    /// A receiver answering 200 to every POST on /hook: its URL and destination.
    async fn answering_200() -> (String, String) {
        let app = axum::Router::new().route("/hook", axum::routing::post(|| async { "ok" }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        let url = format!("http://{addr}/hook");
        let dest = destination(&url::Url::parse(&url).expect("url"));
        (url, dest)
    }

    /// A 2xx to a destination with nothing counted on its breaker keeps the store slot
    /// while this instance has another delivery for the destination, and the sweep
    /// gives it back once none is left (after the linger), so the destination's window
    /// is whole again for every instance.
    #[tokio::test]
    async fn a_kept_slot_goes_back_once_its_destination_has_no_delivery_left() {
        let (url, dest) = answering_200().await;
        let (store, sid, _dir) = finished_run(&url).await;
        let w = with_options(
            &store,
            "127.0.0.1/32",
            WebhookOptions {
                max_in_flight_per_destination: 2,
                ..test_options()
            },
        );
        let terms = window(2);
        let admit = |holder: &'static str| {
            let (store, dest) = (store.clone(), dest.clone());
            async move {
                store
                    .admit_delivery(&dest, holder, &terms)
                    .await
                    .expect("admit")
            }
        };
        let long = Duration::from_secs(60);
        // Another delivery to the destination is under way on this instance.
        let other = w
            .in_flight
            .take(&dest, 2, Duration::ZERO)
            .await
            .expect("a local slot");
        let r = one_attempt(&store, &w, &sid).await;
        assert_eq!(r.callback_state, CallbackState::Done);
        // The delivered one's store slot is still this instance's: one of two free.
        assert_eq!(admit("x").await, Admission::Go);
        assert_eq!(admit("y").await, Admission::Full { window: 2 }, "one kept");
        assert!(
            w.in_flight.stale_idle(long, Duration::ZERO).is_empty(),
            "kept while a delivery to the destination is under way"
        );
        // None left: the sweep gives it back once it lingered.
        drop(other);
        assert!(w.in_flight.stale_idle(long, long).is_empty(), "lingering");
        let kept = w.in_flight.stale_idle(long, Duration::ZERO);
        assert_eq!(kept.len(), 1, "{kept:?}");
        w.give_back(kept).await;
        assert_eq!(admit("y").await, Admission::Go, "the window is whole again");
    }

    /// With no other delivery to its destination, a delivered one keeps its slot for
    /// the linger only (for a next delivery that comes right after it), then the
    /// worker's sweep gives it back.
    #[tokio::test]
    async fn a_lone_delivery_keeps_its_slot_for_the_linger_only() {
        let (url, dest) = answering_200().await;
        let (store, sid, _dir) = finished_run(&url).await;
        let w = with_options(
            &store,
            "127.0.0.1/32",
            WebhookOptions {
                max_in_flight_per_destination: 1,
                ..test_options()
            },
        );
        let r = one_attempt(&store, &w, &sid).await;
        assert_eq!(r.callback_state, CallbackState::Done);
        let another = || async {
            store
                .admit_delivery(&dest, "another-instance", &window(1))
                .await
                .expect("admit")
        };
        assert_eq!(
            another().await,
            Admission::Full { window: 1 },
            "kept for a next delivery"
        );
        tokio::time::sleep(LINGER).await;
        w.give_back(w.in_flight.stale_idle(KEEP_FRESH, LINGER))
            .await;
        assert_eq!(another().await, Admission::Go);
        assert!(
            w.in_flight
                .stale_idle(Duration::ZERO, Duration::ZERO)
                .is_empty(),
            "nothing kept"
        );
    }

    #[tokio::test]
    async fn a_redirect_is_a_failed_attempt_and_never_followed() {
        let followed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = followed.clone();
        let app = axum::Router::new()
            .route(
                "/hook",
                axum::routing::post(|| async {
                    (
                        axum::http::StatusCode::FOUND,
                        [(axum::http::header::LOCATION, "/elsewhere")],
                    )
                }),
            )
            .route(
                "/elsewhere",
                axum::routing::any(move || {
                    seen.store(true, std::sync::atomic::Ordering::SeqCst);
                    async { "followed" }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        let (store, sid, _dir) = finished_run(&format!("http://{addr}/hook")).await;
        let w = deliveries(&store, "127.0.0.1/32", 5);
        let r = one_attempt(&store, &w, &sid).await;
        assert_eq!(
            (r.callback_state, r.callback_attempts, r.callback_status),
            (CallbackState::Pending, 1, 302)
        );
        assert!(
            r.callback_error.starts_with("http_302"),
            "{}",
            r.callback_error
        );
        assert!(!followed.load(std::sync::atomic::Ordering::SeqCst));
        // The schedule has one retry: the second failure gives up.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let r = one_attempt(&store, &w, &sid).await;
        assert_eq!(
            (r.callback_state, r.callback_attempts),
            (CallbackState::Failed, 2)
        );
        assert!(
            r.callback_error.contains("retries spent"),
            "{}",
            r.callback_error
        );
        assert_eq!(r.state, RunState::Succeeded);
    }

    #[tokio::test]
    async fn an_open_breaker_defers_without_an_attempt_but_not_past_the_max_age() {
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(|| async { axum::http::StatusCode::SERVICE_UNAVAILABLE }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        let (store, sid, _dir) = finished_run(&format!("http://{addr}/hook")).await;
        let w = with_options(
            &store,
            "127.0.0.1/32",
            WebhookOptions {
                breaker_failures: 1,
                breaker_cooldown: Duration::from_secs(60),
                max_age: Duration::from_millis(300),
                ..test_options()
            },
        );
        // The first failure opens the breaker for a minute.
        let r = one_attempt(&store, &w, &sid).await;
        assert_eq!((r.callback_attempts, r.callback_status), (1, 503));
        let dest = format!("http://{addr}");
        let terms = w.terms(1, Instant::now());
        assert!(matches!(
            store
                .admit_delivery(&dest, "check", &terms)
                .await
                .expect("breaker"),
            Admission::Open { .. }
        ));
        // The retry finds it open: deferred, no attempt spent, and only until the max
        // age (not the minute), when it is given up.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let r = one_attempt(&store, &w, &sid).await;
        assert_eq!(
            (r.callback_state, r.callback_attempts),
            (CallbackState::Pending, 1)
        );
        let due = || async {
            store
                .claim_delivery(&sid, Duration::from_secs(30))
                .await
                .expect("claim")
        };
        assert!(due().await.is_none(), "deferred");
        tokio::time::sleep(Duration::from_millis(350)).await;
        let d = due().await.expect("due at the max age");
        deliver(&w, d).await;
        let r = store.get_run(&sid).await.expect("get").expect("run");
        assert_eq!(
            (r.callback_state, r.callback_attempts),
            (CallbackState::Failed, 1),
            "giving up is not an attempt"
        );
        assert!(
            r.callback_error.starts_with("max_age"),
            "{}",
            r.callback_error
        );
    }

    #[tokio::test]
    async fn an_address_outside_the_policy_is_refused_and_not_held_against_it() {
        let (store, sid, _dir) = finished_run("http://127.0.0.1:9/hook").await;
        // Loopback is not allowed without the allow list.
        let w = deliveries(&store, "", 1);
        let r = one_attempt(&store, &w, &sid).await;
        assert_eq!((r.callback_attempts, r.callback_status), (1, 0));
        assert!(
            r.callback_error.starts_with("egress_refused")
                && r.callback_error.ends_with("not retried)"),
            "{}",
            r.callback_error
        );
        // No retry gets past the policy: failed at once, not after the schedule.
        assert_eq!(r.callback_state, CallbackState::Failed);
        // A refusal says nothing about the destination: its breaker (one failure opens
        // it here) stays closed.
        let terms = w.terms(1, Instant::now());
        assert_eq!(
            store
                .admit_delivery("http://127.0.0.1:9", "check", &terms)
                .await
                .expect("breaker"),
            Admission::Go
        );
    }

    #[test]
    fn retry_schedules_parse_and_name_the_bad_part() {
        assert_eq!(
            parse_retry_schedule("1s, 5s,30s,2m,10m").expect("valid"),
            WebhookOptions::default().retry_schedule
        );
        assert_eq!(
            parse_retry_schedule("50ms").expect("valid"),
            vec![Duration::from_millis(50)]
        );
        assert!(parse_retry_schedule("1s,,5s").is_err());
        assert!(parse_retry_schedule("").is_err());
        assert!(parse_retry_schedule("0s").expect_err("zero").contains("0s"));
        assert!(
            parse_retry_schedule("1s,soon")
                .expect_err("bad")
                .contains("soon")
        );
    }

    #[test]
    fn destinations_name_scheme_host_and_port() {
        let d = |u: &str| destination(&url::Url::parse(u).expect("url"));
        assert_eq!(d("https://hooks.example/a?b"), "https://hooks.example:443");
        assert_eq!(d("http://127.0.0.1:9000/x"), "http://127.0.0.1:9000");
        assert_eq!(d("http://[::1]/x"), "http://[::1]:80");
    }

    #[test]
    fn jitter_stays_within_a_fifth() {
        for _ in 0..1000 {
            let j = jittered(Duration::from_secs(10));
            assert!(
                j >= Duration::from_secs(8) && j <= Duration::from_secs(12),
                "{j:?}"
            );
        }
    }
}
