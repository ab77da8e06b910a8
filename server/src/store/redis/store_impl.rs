//! The `Store` trait over Redis: each operation is the `RedisStore` method of the same
//! name in the file of its concern (`jobs`, `runs`, `nodes`, `apps`, `outbox`).

use super::*;

#[async_trait]
impl Store for RedisStore {
    fn backend(&self) -> &'static str {
        "redis"
    }

    fn partitions(&self) -> u32 {
        self.inner.partitions
    }

    async fn now(&self) -> Result<Millis> {
        let mut c = self.conn().await?;
        let (s, us): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut c)
            .await
            .map_err(unavailable)?;
        Ok(s * 1000 + us / 1000)
    }

    fn job_changes(&self) -> watch::Receiver<u64> {
        self.inner.changes.clone()
    }

    async fn create_job(&self, job: JobRecord) -> Result<JobRecord> {
        RedisStore::create_job(self, job).await
    }

    async fn update_job(&self, job: JobRecord, expected_version: u64) -> Result<JobRecord> {
        RedisStore::update_job(self, job, expected_version).await
    }

    async fn apply_jobs(
        &self,
        partition: u32,
        writes: Vec<JobWrite>,
    ) -> Result<Vec<Result<JobRecord>>> {
        RedisStore::apply_jobs(self, partition, writes).await
    }

    async fn delete_job(&self, job_id: &str) -> Result<()> {
        RedisStore::delete_job(self, job_id).await
    }

    async fn get_job(&self, job_id: &str) -> Result<Option<JobRecord>> {
        RedisStore::get_job(self, job_id).await
    }

    async fn get_jobs(&self, job_ids: &[String]) -> Result<Vec<JobRecord>> {
        RedisStore::get_jobs(self, job_ids).await
    }

    async fn list_jobs(&self, cursor: Option<&str>, limit: usize) -> Result<Page<JobRecord>> {
        RedisStore::list_jobs(self, cursor, limit).await
    }

    async fn due_fires(&self, partition: u32, limit: usize) -> Result<DueBatch> {
        RedisStore::due_fires(self, partition, limit).await
    }

    async fn claim_fires(&self, partition: u32, claims: Vec<FireClaim>) -> Result<ClaimOutcome> {
        RedisStore::claim_fires(self, partition, claims).await
    }

    async fn enqueue_manual(
        &self,
        trigger: Trigger,
        idempotency_key: Option<&str>,
    ) -> Result<Enqueued> {
        RedisStore::enqueue_manual(self, trigger, idempotency_key).await
    }

    async fn read_triggers(
        &self,
        consumer: &str,
        max: usize,
        block: Duration,
    ) -> Result<Vec<Delivery>> {
        RedisStore::read_triggers(self, consumer, max, block).await
    }

    async fn reclaim_triggers(
        &self,
        consumer: &str,
        min_idle: Duration,
        max: usize,
    ) -> Result<Vec<Delivery>> {
        RedisStore::reclaim_triggers(self, consumer, min_idle, max).await
    }

    async fn beat_instance(&self, instance: &str, ttl: Duration) -> Result<Vec<String>> {
        RedisStore::beat_instance(self, instance, ttl).await
    }

    async fn take_over_triggers(
        &self,
        dead: &str,
        consumer: &str,
        max: usize,
    ) -> Result<Vec<Delivery>> {
        RedisStore::take_over_triggers(self, dead, consumer, max).await
    }

    async fn ack_trigger(&self, entry_id: &str) -> Result<()> {
        RedisStore::ack_trigger(self, entry_id).await
    }

    async fn trim_triggers(&self, older_than: Millis) -> Result<()> {
        RedisStore::trim_triggers(self, older_than).await
    }

    async fn record_run(&self, run: RunRecord) -> Result<Recorded> {
        RedisStore::record_run(self, run).await
    }

    async fn get_run(&self, schedule_id: &str) -> Result<Option<RunRecord>> {
        RedisStore::get_run(self, schedule_id).await
    }

    async fn list_runs(&self, job_id: &str, query: RunQuery) -> Result<Page<RunRecord>> {
        RedisStore::list_runs(self, job_id, query).await
    }

    async fn begin_run(&self, run: RunRecord, route_grace: Duration) -> Result<Begun> {
        RedisStore::begin_run(self, run, route_grace).await
    }

    async fn assign_run(
        &self,
        schedule_id: &str,
        attempt: u32,
        node: &NodeSlot,
        terms: LeaseTerms,
    ) -> Result<Assigned> {
        RedisStore::assign_run(self, schedule_id, attempt, node, terms).await
    }

    async fn fan_out(
        &self,
        schedule_id: &str,
        attempt: u32,
        shards: u32,
        route_grace: Duration,
    ) -> Result<FannedOut> {
        RedisStore::fan_out(self, schedule_id, attempt, shards, route_grace).await
    }

    async fn mark_started(&self, schedule_id: &str, token: u64) -> Result<Transition> {
        RedisStore::mark_started(self, schedule_id, token).await
    }

    async fn renew_leases(
        &self,
        node_id: &str,
        held: &[Held],
        ttl: Duration,
    ) -> Result<Vec<Option<i64>>> {
        RedisStore::renew_leases(self, node_id, held, ttl).await
    }

    async fn finish_run(
        &self,
        schedule_id: &str,
        by: Finisher,
        outcome: Outcome,
    ) -> Result<Transition> {
        RedisStore::finish_run(self, schedule_id, by, outcome).await
    }

    async fn due_runs(&self, partition: u32, limit: usize) -> Result<Vec<String>> {
        RedisStore::due_runs(self, partition, limit).await
    }

    async fn expire_run(&self, schedule_id: &str, route_grace: Duration) -> Result<Transition> {
        RedisStore::expire_run(self, schedule_id, route_grace).await
    }

    async fn cancel_run(&self, schedule_id: &str, reason: &str) -> Result<Transition> {
        RedisStore::cancel_run(self, schedule_id, reason).await
    }

    async fn report_progress(
        &self,
        schedule_id: &str,
        token: u64,
        percent: u32,
        message: &str,
    ) -> Result<bool> {
        RedisStore::report_progress(self, schedule_id, token, percent, message).await
    }

    async fn append_logs(
        &self,
        schedule_id: &str,
        token: u64,
        lines: Vec<LogLine>,
        max_bytes: usize,
    ) -> Result<bool> {
        RedisStore::append_logs(self, schedule_id, token, lines, max_bytes).await
    }

    async fn read_logs(&self, schedule_id: &str, after: u64, limit: usize) -> Result<Vec<LogLine>> {
        RedisStore::read_logs(self, schedule_id, after, limit).await
    }

    async fn push_inbox(&self, instance: &str, message: Vec<u8>) -> Result<()> {
        RedisStore::push_inbox(self, instance, message).await
    }

    async fn pop_inbox(&self, instance: &str, max: usize, block: Duration) -> Result<Vec<Vec<u8>>> {
        RedisStore::pop_inbox(self, instance, max, block).await
    }

    async fn upsert_node(&self, node: NodeRecord, ttl: Duration) -> Result<()> {
        RedisStore::upsert_node(self, node, ttl).await
    }

    async fn remove_node(
        &self,
        node: &NodeRecord,
        leases_within: Option<Duration>,
    ) -> Result<NodeRemoved> {
        RedisStore::remove_node(self, node, leases_within).await
    }

    async fn list_nodes(&self, group: Option<&str>) -> Result<Vec<NodeRecord>> {
        RedisStore::list_nodes(self, group).await
    }

    async fn next_route_counter(&self, job_id: &str) -> Result<u64> {
        RedisStore::next_route_counter(self, job_id).await
    }

    async fn create_app(&self, app: AppRecord) -> Result<AppRecord> {
        RedisStore::create_app(self, app).await
    }

    async fn get_app(&self, app_id: &str) -> Result<Option<AppRecord>> {
        RedisStore::get_app(self, app_id).await
    }

    async fn rotate_app_secret(
        &self,
        app_id: &str,
        secret: &str,
        overlap: Duration,
    ) -> Result<AppRecord> {
        RedisStore::rotate_app_secret(self, app_id, secret, overlap).await
    }

    async fn due_deliveries(&self, partition: u32, limit: usize) -> Result<Vec<String>> {
        RedisStore::due_deliveries(self, partition, limit).await
    }

    async fn claim_delivery(
        &self,
        schedule_id: &str,
        lease: Duration,
    ) -> Result<Option<WebhookDelivery>> {
        RedisStore::claim_delivery(self, schedule_id, lease).await
    }

    async fn finish_delivery(
        &self,
        schedule_id: &str,
        token: u64,
        outcome: DeliveryOutcome,
    ) -> Result<Applied> {
        RedisStore::finish_delivery(self, schedule_id, token, outcome).await
    }

    async fn breaker_state(&self, destination: &str, probe: Duration) -> Result<BreakerState> {
        RedisStore::breaker_state(self, destination, probe).await
    }

    async fn record_breaker(
        &self,
        destination: &str,
        success: bool,
        threshold: u32,
        cool_down: Duration,
    ) -> Result<BreakerUpdate> {
        RedisStore::record_breaker(self, destination, success, threshold, cool_down).await
    }

    async fn check_nonce(&self, app_id: &str, nonce: &str, ttl: Duration) -> Result<bool> {
        RedisStore::check_nonce(self, app_id, nonce, ttl).await
    }
}
