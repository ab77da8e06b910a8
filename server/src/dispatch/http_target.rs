//! The built-in HTTP executor: jobs whose target is a URL are called by the server
//! itself, under the same lease, timeout, retries and state machine as any executor.
//!
//! It is one virtual node per instance (`http@<instance>`): the dispatcher leases runs
//! to it, it confirms them (`mark_started`), renews their leases on the heartbeat
//! interval from its in-flight list (exactly like an executor's heartbeat), and
//! finishes them with the response: 2xx → SUCCEEDED with the body as output, anything
//! else → FAILED (`http_<status>`, or `http_error` when no response came). If this
//! instance dies mid-request its leases run out and another instance retries the run.
//!
//! Every call goes through the HTTP-target [`EgressPolicy`]: a URL whose address is
//! refused (checked on the IP literal before the request, and on the resolved
//! addresses at connect time) is never connected to and the attempt FAILS with
//! `egress_refused`, under the job's retry policy like any other failure.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info_span, warn};

use crate::deliver::alerts::Alerts;
use crate::egress::{self, EgressPolicy};
use crate::model::{JobRecord, RunRecord, RunState, Target};
use crate::store::{Applied, Finisher, Held, Holder, Outcome, RunStore};

/// Response bodies beyond this are cut (the output is for status, not bulk data).
const MAX_OUTPUT_BYTES: usize = 64 * 1024;

pub struct HttpTargets {
    store: Arc<dyn RunStore>,
    node_id: String,
    max_concurrency: u32,
    lease_ttl: Duration,
    /// Checked on IP-literal URLs before each request; the client's resolver checks
    /// host names.
    egress: Arc<EgressPolicy>,
    /// Counts the run outcomes these calls apply (they do not pass through dispatch).
    alerts: Arc<Alerts>,
    client: reqwest::Client,
    in_flight: Mutex<HashMap<String, (u64, CancellationToken)>>,
    tasks: TaskTracker,
}

impl HttpTargets {
    pub fn new(
        store: Arc<dyn RunStore>,
        instance: &str,
        max_concurrency: u32,
        lease_ttl: Duration,
        egress: Arc<EgressPolicy>,
        alerts: Arc<Alerts>,
    ) -> Result<Self, reqwest::Error> {
        // No fallback to a default client: it would bypass the egress policy.
        let client = egress::client_builder(egress.clone())
            .connect_timeout(Duration::from_secs(10))
            .build()?;
        Ok(Self {
            store,
            node_id: format!("http@{instance}"),
            max_concurrency,
            lease_ttl,
            egress,
            alerts,
            client,
            in_flight: Mutex::new(HashMap::new()),
            tasks: TaskTracker::new(),
        })
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    pub fn max_concurrency(&self) -> u32 {
        self.max_concurrency
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, CancellationToken)>> {
        crate::dispatch::lock(&self.in_flight)
    }

    /// Stops the request of a revoked lease.
    pub fn cancel(&self, schedule_id: &str, token: u64) {
        if let Some((t, cancel)) = self.map().get(schedule_id)
            && *t == token
        {
            cancel.cancel();
        }
    }

    /// Calls the job's URL for a run leased to this node.
    pub fn start(self: &Arc<Self>, run: RunRecord, job: Arc<JobRecord>) {
        let Target::Http { url, method } = job.spec.target.clone() else {
            return;
        };
        let cancel = CancellationToken::new();
        self.map()
            .insert(run.schedule_id.clone(), (run.fencing_token, cancel.clone()));
        let this = self.clone();
        let span = info_span!("http_target", job_id = %run.job_id, schedule_id = %run.schedule_id, attempt = run.attempt);
        self.tasks.spawn(
            async move {
                let outcome = this.call(&run, &job, &url, &method, &cancel).await;
                this.map().remove(&run.schedule_id);
                match this
                    .store
                    .finish_run(&run.schedule_id, Finisher::Holder(Holder::of(&run)), outcome)
                    .await
                {
                    Ok(t) => {
                        if t.applied == Applied::Yes {
                            crate::fault::crash_point("run.after_finish");
                        }
                        debug!(applied = ?t.applied, "http run finished");
                        this.alerts.record_transition(&t);
                    }
                    Err(e) => warn!(error = %e, "recording the http result failed; the lease will run out and the run is retried"),
                }
            }
            .instrument(span),
        );
    }

    async fn call(
        &self,
        run: &RunRecord,
        job: &JobRecord,
        url: &str,
        method: &str,
        cancel: &CancellationToken,
    ) -> Outcome {
        let started = crate::model::now_ms();
        if let Err(e) = self
            .store
            .mark_started(&run.schedule_id, &Holder::of(run))
            .await
        {
            warn!(error = %e, "confirming the http run failed");
        }
        let url = match url::Url::parse(url) {
            Ok(u) => u,
            Err(e) => {
                let message = format!("the target URL {url:?} does not parse: {e}");
                return outcome(RunState::Failed, None, "http_error", &message, started);
            }
        };
        if let Err(e) = self.egress.check_url(&url) {
            return egress_refused(&e, started);
        }
        let method =
            reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::POST);
        let body = run
            .payload_override
            .clone()
            .unwrap_or_else(|| job.spec.payload.clone());
        let mut req = self
            .client
            .request(method, url)
            .header("X-Sundial-Schedule-Id", &run.schedule_id)
            .header("X-Sundial-Attempt", run.attempt.to_string())
            .header("X-Sundial-Fencing-Token", run.fencing_token.to_string())
            .body(body);
        if run.plan.timeout_ms > 0 {
            req = req.timeout(Duration::from_millis(
                u64::try_from(run.plan.timeout_ms).unwrap_or(u64::MAX),
            ));
        }
        let result = tokio::select! {
            () = cancel.cancelled() => {
                return outcome(RunState::Cancelled, None, "cancelled", "the lease was revoked", started);
            }
            r = async {
                let resp = req.send().await?;
                let status = resp.status();
                let mut body = resp.bytes().await?.to_vec();
                body.truncate(MAX_OUTPUT_BYTES);
                Ok::<_, reqwest::Error>((status, body))
            } => r,
        };
        match result {
            Ok((status, body)) if status.is_success() => {
                outcome(RunState::Succeeded, Some(body), "", "", started)
            }
            Ok((status, body)) => outcome(
                RunState::Failed,
                Some(body),
                &format!("http_{}", status.as_u16()),
                &format!("the target answered {status}"),
                started,
            ),
            Err(e) => match egress::refusal(&e) {
                Some(refused) => egress_refused(refused, started),
                None if e.is_timeout() => outcome(
                    RunState::Failed,
                    None,
                    "http_timeout",
                    &e.to_string(),
                    started,
                ),
                None => outcome(
                    RunState::Failed,
                    None,
                    "http_error",
                    &e.to_string(),
                    started,
                ),
            },
        }
    }

    /// Renews the leases of in-flight requests every `every` (the heartbeat) until
    /// `shutdown`, then waits for the requests in flight.
    pub async fn run(self: Arc<Self>, every: Duration, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            let held: Vec<Held> = self
                .map()
                .iter()
                .map(|(sid, (token, _))| Held {
                    schedule_id: sid.clone(),
                    token: *token,
                })
                .collect();
            if held.is_empty() {
                continue;
            }
            match self
                .store
                .renew_leases(&self.node_id, &held, self.lease_ttl)
                .await
            {
                Ok(remaining) => {
                    for (h, r) in held.iter().zip(remaining) {
                        if r.is_none() {
                            self.cancel(&h.schedule_id, h.token);
                        }
                    }
                }
                Err(e) => warn!(error = %e, "renewing http leases failed"),
            }
        }
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// The attempt failed before any connection: the policy refused the address.
fn egress_refused(refusal: &egress::Error, started: i64) -> Outcome {
    warn!(error = %refusal, "http target refused by the egress policy");
    outcome(
        RunState::Failed,
        None,
        "egress_refused",
        &refusal.to_string(),
        started,
    )
}

fn outcome(
    state: RunState,
    output: Option<Vec<u8>>,
    code: &str,
    message: &str,
    started: i64,
) -> Outcome {
    Outcome {
        state,
        output,
        error_code: code.to_owned(),
        error_message: message.to_owned(),
        started_at: Some(started),
        finished_at: Some(crate::model::now_ms()),
    }
}
