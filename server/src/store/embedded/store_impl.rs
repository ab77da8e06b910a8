//! The `Store` trait over [`Inner`]: every operation runs on the blocking pool as
//! one redb transaction; change notifications, inboxes and round-robin counters stay
//! in memory.

use super::*;

#[async_trait]
impl Store for EmbeddedStore {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    fn partitions(&self) -> u32 {
        self.inner.partitions
    }

    async fn now(&self) -> Result<Millis> {
        Ok(now_ms())
    }

    fn job_changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    async fn create_job(&self, job: JobRecord) -> Result<JobRecord> {
        let job = self.blocking(move |i| i.create_job(job)).await?;
        self.job_changed();
        Ok(job)
    }

    async fn update_job(&self, job: JobRecord, expected_version: u64) -> Result<JobRecord> {
        let job = self
            .blocking(move |i| i.update_job(job, expected_version))
            .await?;
        self.job_changed();
        Ok(job)
    }

    async fn apply_jobs(
        &self,
        partition: u32,
        writes: Vec<JobWrite>,
    ) -> Result<Vec<Result<JobRecord>>> {
        let out = self
            .blocking(move |i| i.apply_jobs(partition, writes))
            .await?;
        if out.iter().any(Result::is_ok) {
            self.job_changed();
        }
        Ok(out)
    }

    async fn delete_job(&self, job_id: &str) -> Result<()> {
        let job_id = job_id.to_owned();
        self.blocking(move |i| i.delete_job(&job_id)).await?;
        self.job_changed();
        Ok(())
    }

    async fn get_job(&self, job_id: &str) -> Result<Option<JobRecord>> {
        let job_id = job_id.to_owned();
        self.blocking(move |i| i.get_job(&job_id)).await
    }

    async fn get_jobs(&self, job_ids: &[String]) -> Result<Vec<JobRecord>> {
        let job_ids = job_ids.to_vec();
        self.blocking(move |i| i.get_jobs(&job_ids)).await
    }

    async fn list_jobs(&self, cursor: Option<&str>, limit: usize) -> Result<Page<JobRecord>> {
        let cursor = cursor.map(str::to_owned);
        self.blocking(move |i| i.list_jobs(cursor, limit)).await
    }

    async fn due_fires(&self, partition: u32, limit: usize) -> Result<DueBatch> {
        self.blocking(move |i| i.due_fires(partition, limit)).await
    }

    async fn claim_fires(&self, partition: u32, claims: Vec<FireClaim>) -> Result<ClaimOutcome> {
        let outcome = self
            .blocking(move |i| i.claim_fires(partition, claims))
            .await?;
        if outcome.results.contains(&ClaimResult::Claimed) {
            self.appended.notify_waiters();
        }
        Ok(outcome)
    }

    async fn enqueue_manual(
        &self,
        trigger: Trigger,
        idempotency_key: Option<&str>,
    ) -> Result<Enqueued> {
        let key = idempotency_key.map(str::to_owned);
        let enqueued = self
            .blocking(move |i| i.enqueue_manual(trigger, key))
            .await?;
        if !enqueued.duplicate {
            self.appended.notify_waiters();
        }
        Ok(enqueued)
    }

    async fn read_triggers(
        &self,
        _consumer: &str,
        max: usize,
        block: Duration,
    ) -> Result<Vec<Delivery>> {
        // A block too long to represent is as good as forever.
        let deadline = Instant::now().checked_add(block);
        loop {
            // Registered before looking, so an append between the look and the wait
            // still wakes us.
            let notified = self.appended.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let got = self.blocking(move |i| i.read_once(max)).await?;
            if !got.is_empty() || max == 0 {
                return Ok(got);
            }
            match deadline {
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(got);
                    }
                    // Timing out just means nothing arrived; look once more and return.
                    let _ = tokio::time::timeout(deadline - now, notified).await;
                }
                None => notified.await,
            }
        }
    }

    async fn reclaim_triggers(
        &self,
        _consumer: &str,
        min_idle: Duration,
        max: usize,
    ) -> Result<Vec<Delivery>> {
        self.blocking(move |i| i.reclaim(min_idle, max)).await
    }

    async fn beat_instance(&self, _instance: &str, _ttl: Duration) -> Result<Vec<String>> {
        // One process: no other instance can die holding triggers (this one's own
        // unacknowledged triggers are delivered again when it opens the store).
        Ok(Vec::new())
    }

    async fn take_over_triggers(
        &self,
        _dead: &str,
        _consumer: &str,
        _max: usize,
    ) -> Result<Vec<Delivery>> {
        Ok(Vec::new())
    }

    async fn ack_trigger(&self, entry_id: &str) -> Result<()> {
        let seq = parse_entry_id(entry_id)?;
        self.blocking(move |i| i.ack(seq)).await
    }

    /// A no-op by design: `ack_trigger` deletes the entry in the same transaction that
    /// acknowledges it, so no acknowledged entry is ever left to trim, and unacknowledged
    /// ones must stay until acked.
    async fn trim_triggers(&self, _older_than: Millis) -> Result<()> {
        Ok(())
    }

    async fn record_run(&self, run: RunRecord) -> Result<Recorded> {
        self.blocking(move |i| i.record_run(run)).await
    }

    async fn get_run(&self, schedule_id: &str) -> Result<Option<RunRecord>> {
        let schedule_id = schedule_id.to_owned();
        self.blocking(move |i| i.get_run(&schedule_id)).await
    }

    async fn list_runs(&self, job_id: &str, query: RunQuery) -> Result<Page<RunRecord>> {
        let job_id = job_id.to_owned();
        self.blocking(move |i| i.list_runs(&job_id, query)).await
    }

    async fn begin_run(&self, run: RunRecord, route_grace: Duration) -> Result<Begun> {
        self.blocking(move |i| i.begin_run(run, route_grace)).await
    }

    async fn assign_run(
        &self,
        schedule_id: &str,
        attempt: u32,
        node: &NodeSlot,
        terms: LeaseTerms,
    ) -> Result<Assigned> {
        let (schedule_id, node) = (schedule_id.to_owned(), node.clone());
        self.blocking(move |i| i.assign_run(&schedule_id, attempt, &node, terms))
            .await
    }

    async fn mark_started(&self, schedule_id: &str, token: u64) -> Result<Transition> {
        let schedule_id = schedule_id.to_owned();
        self.blocking(move |i| i.mark_started(&schedule_id, token))
            .await
    }

    async fn renew_leases(
        &self,
        node_id: &str,
        held: &[Held],
        ttl: Duration,
    ) -> Result<Vec<Option<i64>>> {
        let (node_id, held) = (node_id.to_owned(), held.to_vec());
        self.blocking(move |i| i.renew_leases(&node_id, &held, ttl))
            .await
    }

    async fn finish_run(
        &self,
        schedule_id: &str,
        by: Finisher,
        outcome: Outcome,
    ) -> Result<Transition> {
        let schedule_id = schedule_id.to_owned();
        self.blocking(move |i| i.finish_run(&schedule_id, by, outcome))
            .await
    }

    async fn due_runs(&self, partition: u32, limit: usize) -> Result<Vec<String>> {
        self.blocking(move |i| i.due_runs(partition, limit)).await
    }

    async fn expire_run(&self, schedule_id: &str, route_grace: Duration) -> Result<Transition> {
        let schedule_id = schedule_id.to_owned();
        self.blocking(move |i| i.expire_run(&schedule_id, route_grace))
            .await
    }

    async fn fan_out(
        &self,
        schedule_id: &str,
        attempt: u32,
        shards: u32,
        route_grace: Duration,
    ) -> Result<FannedOut> {
        let schedule_id = schedule_id.to_owned();
        self.blocking(move |i| i.fan_out(&schedule_id, attempt, shards, route_grace))
            .await
    }

    async fn cancel_run(&self, schedule_id: &str, reason: &str) -> Result<Transition> {
        let (schedule_id, reason) = (schedule_id.to_owned(), reason.to_owned());
        self.blocking(move |i| i.cancel_run(&schedule_id, &reason))
            .await
    }

    async fn report_progress(
        &self,
        schedule_id: &str,
        token: u64,
        percent: u32,
        message: &str,
    ) -> Result<bool> {
        let (schedule_id, message) = (schedule_id.to_owned(), message.to_owned());
        self.blocking(move |i| i.report_progress(&schedule_id, token, percent, &message))
            .await
    }

    async fn append_logs(
        &self,
        schedule_id: &str,
        token: u64,
        lines: Vec<LogLine>,
        max_bytes: usize,
    ) -> Result<bool> {
        // Nothing to store is vacuously stored, whoever asks (as in redis).
        if lines.is_empty() {
            return Ok(true);
        }
        let schedule_id = schedule_id.to_owned();
        self.blocking(move |i| i.append_logs(&schedule_id, token, lines, max_bytes))
            .await
    }

    async fn read_logs(&self, schedule_id: &str, after: u64, limit: usize) -> Result<Vec<LogLine>> {
        let schedule_id = schedule_id.to_owned();
        self.blocking(move |i| i.read_logs(&schedule_id, after, limit))
            .await
    }

    async fn push_inbox(&self, instance: &str, message: Vec<u8>) -> Result<()> {
        let now = Instant::now();
        {
            let mut inboxes = self.inboxes();
            // Forget inboxes nobody wrote to for a while (their instance is gone), as
            // redis lets the key expire.
            inboxes.retain(|_, inbox| inbox.expires > now);
            let inbox = inboxes.entry(instance.to_owned()).or_insert_with(|| Inbox {
                messages: VecDeque::new(),
                expires: now,
            });
            inbox.messages.push_back(message);
            inbox.expires = now + INBOX_TTL;
        }
        self.inbox_pushed.notify_waiters();
        Ok(())
    }

    async fn pop_inbox(&self, instance: &str, max: usize, block: Duration) -> Result<Vec<Vec<u8>>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        // A block too long to represent is as good as forever.
        let deadline = Instant::now().checked_add(block);
        loop {
            // Registered before looking, so a push between the look and the wait still
            // wakes us.
            let notified = self.inbox_pushed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let got = self.take_inbox(instance, max);
            if !got.is_empty() {
                return Ok(got);
            }
            match deadline {
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(got);
                    }
                    // Timing out just means nothing arrived; look once more and return.
                    let _ = tokio::time::timeout(deadline - now, notified).await;
                }
                None => notified.await,
            }
        }
    }

    async fn upsert_node(&self, node: NodeRecord, ttl: Duration) -> Result<()> {
        self.blocking(move |i| i.upsert_node(node, ttl)).await
    }

    async fn remove_node(
        &self,
        node: &NodeRecord,
        leases_within: Option<Duration>,
    ) -> Result<NodeRemoved> {
        let node = node.clone();
        self.blocking(move |i| i.remove_node(&node, leases_within))
            .await
    }

    async fn list_nodes(&self, group: Option<&str>) -> Result<Vec<NodeRecord>> {
        let group = group.map(str::to_owned);
        self.blocking(move |i| i.list_nodes(group.as_deref())).await
    }

    async fn next_route_counter(&self, job_id: &str) -> Result<u64> {
        let mut counters = self
            .route_counters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let c = counters.entry(job_id.to_owned()).or_insert(0);
        let n = *c;
        *c = c.wrapping_add(1);
        Ok(n)
    }

    async fn create_app(&self, app: AppRecord) -> Result<AppRecord> {
        self.blocking(move |i| i.create_app(app)).await
    }

    async fn get_app(&self, app_id: &str) -> Result<Option<AppRecord>> {
        let app_id = app_id.to_owned();
        self.blocking(move |i| i.get_app(&app_id)).await
    }

    async fn rotate_app_secret(
        &self,
        app_id: &str,
        secret: &str,
        overlap: Duration,
    ) -> Result<AppRecord> {
        let (app_id, secret) = (app_id.to_owned(), secret.to_owned());
        self.blocking(move |i| i.rotate_app_secret(&app_id, &secret, overlap))
            .await
    }

    async fn check_nonce(&self, app_id: &str, nonce: &str, ttl: Duration) -> Result<bool> {
        let (app_id, nonce) = (app_id.to_owned(), nonce.to_owned());
        self.blocking(move |i| i.check_nonce(&app_id, &nonce, ttl))
            .await
    }

    async fn due_deliveries(&self, partition: u32, limit: usize) -> Result<Vec<String>> {
        self.blocking(move |i| i.due_deliveries(partition, limit))
            .await
    }

    async fn claim_delivery(
        &self,
        schedule_id: &str,
        lease: Duration,
    ) -> Result<Option<WebhookDelivery>> {
        let schedule_id = schedule_id.to_owned();
        self.blocking(move |i| i.claim_delivery(&schedule_id, lease))
            .await
    }

    async fn finish_delivery(
        &self,
        schedule_id: &str,
        token: u64,
        outcome: DeliveryOutcome,
    ) -> Result<Applied> {
        let schedule_id = schedule_id.to_owned();
        self.blocking(move |i| i.finish_delivery(&schedule_id, token, outcome))
            .await
    }

    async fn breaker_state(&self, destination: &str, probe: Duration) -> Result<BreakerState> {
        let destination = destination.to_owned();
        self.blocking(move |i| i.breaker_state(&destination, probe))
            .await
    }

    async fn record_breaker(
        &self,
        destination: &str,
        success: bool,
        threshold: u32,
        cool_down: Duration,
    ) -> Result<BreakerUpdate> {
        let destination = destination.to_owned();
        self.blocking(move |i| i.record_breaker(&destination, success, threshold, cool_down))
            .await
    }
}
