//! The webhook outbox and the circuit breakers: due deliveries, their claims and
//! outcomes (under the delivery token), and per destination the breaker state and the
//! slots that pace deliveries. A claim lives in memory (`Claims`), and so do the slots
//! (`Paces`): one process serves the file, and a claim or slot that died with it would
//! only have delayed the retry; outcomes and breakers are written through the writer.

use super::run_tables::RunTables;
use super::*;

#[async_trait]
impl Outbox for EmbeddedStore {
    async fn due_deliveries(&self, partition: u32, limit: usize) -> Result<Vec<String>> {
        let now = now_ms();
        let claimed: HashSet<String> = self
            .claims()
            .live
            .iter()
            .filter(|(_, (_, until))| *until > now)
            .map(|(sid, _)| sid.clone())
            .collect();
        self.blocking(move |inner| {
            due_in_partition_except(
                &inner.db,
                OUTBOX_DUE,
                partition,
                limit,
                &claimed,
                "scan webhook outbox",
            )
        })
        .await
    }

    async fn claim_delivery(
        &self,
        schedule_id: &str,
        lease: Duration,
    ) -> Result<Option<WebhookDelivery>> {
        Ok(self
            .claim_deliveries(&[schedule_id.to_owned()], lease)
            .await?
            .pop())
    }

    /// The claims are taken in memory first (no other claimer can take them
    /// meanwhile), then the entries are read, in one read transaction: a claim is the
    /// one thing about a delivery that needs no commit, since only this process
    /// delivers and none outlives it.
    async fn claim_deliveries(
        &self,
        schedule_ids: &[String],
        lease: Duration,
    ) -> Result<Vec<WebhookDelivery>> {
        let now = now_ms();
        let tokens: Vec<(&str, u64)> = {
            let mut claims = self.claims();
            let mut tokens = Vec::with_capacity(schedule_ids.len());
            for sid in schedule_ids {
                if claims
                    .live
                    .get(sid.as_str())
                    .is_some_and(|(_, until)| *until > now)
                {
                    continue;
                }
                // Tokens only grow: max(last + 1, the clock in µs), as fencing tokens do.
                let token = claims.last_token.saturating_add(1).max(now_us());
                claims.last_token = token;
                claims
                    .live
                    .insert(sid.clone(), (token, now.saturating_add(duration_ms(lease))));
                tokens.push((sid.as_str(), token));
            }
            tokens
        };
        let entries = self.point_read(|inner| {
            let txn = read(&inner.db)?;
            let outbox = txn.open_table(OUTBOX).ctx("open webhook outbox")?;
            tokens
                .iter()
                .map(|(sid, _)| load_outbox(&outbox, sid))
                .collect::<Result<Vec<_>>>()
        });
        let entries = match entries {
            Ok(entries) => entries,
            Err(e) => {
                for (sid, token) in &tokens {
                    self.release_claim(sid, *token);
                }
                return Err(e);
            }
        };
        let mut claimed = Vec::with_capacity(tokens.len());
        for ((sid, token), entry) in tokens.into_iter().zip(entries) {
            let Some(entry) = entry.filter(|e| e.due <= now) else {
                self.release_claim(sid, token);
                continue;
            };
            claimed.push(WebhookDelivery {
                schedule_id: sid.to_owned(),
                job_id: entry.job_id,
                url: entry.url,
                body: entry.body,
                attempts: entry.attempts,
                created_at: entry.created_at,
                token,
                now,
            });
        }
        Ok(claimed)
    }

    async fn finish_delivery(
        &self,
        schedule_id: &str,
        token: u64,
        outcome: DeliveryOutcome,
    ) -> Result<Applied> {
        let held = self
            .claims()
            .live
            .get(schedule_id)
            .is_some_and(|(t, _)| *t == token);
        if !held {
            return Ok(Applied::No("stale delivery token".to_owned()));
        }
        let sid = schedule_id.to_owned();
        let applied = self
            .write(move |_, b| apply_delivery_outcome(b.runs()?, &sid, outcome))
            .await;
        // Committed (or not): the claim is over either way; an entry left due comes
        // back through the next sweep.
        self.release_claim(schedule_id, token);
        applied
    }

    /// As `finish_delivery` of each in turn: the first outcome under a claim's token
    /// ends the claim, so the same one again in the batch is stale.
    async fn finish_deliveries(&self, results: Vec<DeliveryResult>) -> Result<Vec<Applied>> {
        let held: Vec<bool> = {
            let claims = self.claims();
            let mut ended = HashSet::new();
            results
                .iter()
                .map(|r| {
                    claims
                        .live
                        .get(&r.schedule_id)
                        .is_some_and(|(t, _)| *t == r.token)
                        && ended.insert(r.schedule_id.as_str())
                })
                .collect()
        };
        let claimed: Vec<(String, u64)> = results
            .iter()
            .zip(&held)
            .filter(|(_, held)| **held)
            .map(|(r, _)| (r.schedule_id.clone(), r.token))
            .collect();
        let to_apply: Vec<(String, DeliveryOutcome)> = results
            .into_iter()
            .zip(&held)
            .filter(|(_, held)| **held)
            .map(|(r, _)| (r.schedule_id, r.outcome))
            .collect();
        // One writer step for all of them.
        let applied = if to_apply.is_empty() {
            Ok(Vec::new())
        } else {
            self.write(move |_, b| {
                let t = b.runs()?;
                to_apply
                    .into_iter()
                    .map(|(sid, outcome)| apply_delivery_outcome(t, &sid, outcome))
                    .collect::<Result<Vec<_>>>()
            })
            .await
        };
        // Committed (or not): the claims are over either way; an entry left due comes
        // back through the next sweep.
        for (sid, token) in &claimed {
            self.release_claim(sid, *token);
        }
        let mut applied = applied?.into_iter();
        Ok(held
            .into_iter()
            .map(|held| match held {
                true => applied
                    .next()
                    .unwrap_or_else(|| Applied::No("not recorded".to_owned())),
                false => Applied::No("stale delivery token".to_owned()),
            })
            .collect())
    }

    async fn admit_delivery(
        &self,
        destination: &str,
        holder: &str,
        terms: &DeliveryTerms,
    ) -> Result<Admission> {
        let limit = terms.limit.max(1);
        let lease_end = now_ms().saturating_add(duration_ms(terms.lease));
        // A destination that never failed (the common case) has no breaker record:
        // its slots are all there is to it, held in memory, without a turn of the
        // writer.
        if !self.has_breaker(destination)? {
            return Ok(take_slot(
                &self.paces,
                destination,
                holder,
                limit,
                lease_end,
                true,
            ));
        }
        let (destination, holder, probe) = (destination.to_owned(), holder.to_owned(), terms.probe);
        let paces = self.paces.clone();
        self.write(move |_, b| {
            let txn = b.txn();
            let now = now_ms();
            let mut table = txn.open_table(BREAKERS).ctx("open webhook breakers")?;
            let b = load_breaker(&table, &destination)?;
            if b.state == "closed" {
                let window = b.ramp.map_or(limit, |r| r.clamp(1, limit));
                return Ok(take_slot(
                    &paces,
                    &destination,
                    &holder,
                    window,
                    lease_end,
                    true,
                ));
            }
            if b.until > now {
                return Ok(if b.state == "half_open" {
                    // Another caller's probe holds the only slot.
                    Admission::Full { window: 1 }
                } else {
                    Admission::Open { until: b.until }
                });
            }
            // The cool-down is over: the probe goes alone.
            if let full @ Admission::Full { .. } =
                take_slot(&paces, &destination, &holder, 1, lease_end, false)
            {
                return Ok(full);
            }
            let b = Breaker {
                state: "half_open".to_owned(),
                until: now.saturating_add(duration_ms(probe)),
                ..b
            };
            let json = encode("breaker", &b)?;
            table
                .insert(destination.as_str(), json.as_str())
                .ctx("write breaker")?;
            Ok(Admission::Probe)
        })
        .await
    }

    /// Clean when the destination has no breaker record once admitted (a record that
    /// appears meanwhile is as if it came just after).
    async fn admit_delivery_clean(
        &self,
        destination: &str,
        holder: &str,
        terms: &DeliveryTerms,
    ) -> Result<CleanAdmission> {
        let admission = self.admit_delivery(destination, holder, terms).await?;
        let clean = admission == Admission::Go && !self.has_breaker(destination)?;
        Ok(CleanAdmission { admission, clean })
    }

    async fn end_waiting(&self, destination: &str, owner: &str) -> Result<()> {
        let mut paces = self.paces.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pace) = paces.get_mut(destination) {
            pace.waiting.remove(owner);
            if pace.slots.is_empty() && pace.waiting.is_empty() {
                paces.remove(destination);
            }
        }
        Ok(())
    }

    async fn settle_delivery(
        &self,
        destination: &str,
        holder: &str,
        answered: Option<bool>,
        terms: &DeliveryTerms,
    ) -> Result<Option<BreakerUpdate>> {
        give_back_slot(&self.paces, destination, holder);
        let Some(success) = answered else {
            return Ok(None);
        };
        // A success on a closed breaker with no failures counted and no ramp changes
        // nothing: no record, nothing to write.
        if success && !self.has_breaker(destination)? {
            return Ok(Some(BreakerUpdate {
                state: BreakerState::Closed,
                changed: false,
            }));
        }
        if !success {
            // Before the record can exist.
            self.tripped_destinations().insert(destination.to_owned());
        }
        let destination = destination.to_owned();
        let terms = *terms;
        self.write(move |_, b| {
            let txn = b.txn();
            let mut table = txn.open_table(BREAKERS).ctx("open webhook breakers")?;
            let old = load_breaker(&table, &destination)?;
            let (new, update) = settled(old, success, &terms, now_ms());
            match new {
                Some(b) => {
                    let json = encode("breaker", &b)?;
                    table
                        .insert(destination.as_str(), json.as_str())
                        .ctx("write breaker")?;
                }
                None => {
                    table.remove(destination.as_str()).ctx("delete breaker")?;
                }
            }
            Ok(Some(update))
        })
        .await
    }
}

/// The destination's breaker; no record is closed with nothing counted.
fn load_breaker(table: &Table<'_, &str, &str>, destination: &str) -> Result<Breaker> {
    Ok(
        load::<Breaker>(table, "breaker", destination)?.unwrap_or_else(|| Breaker {
            state: "closed".to_owned(),
            ..Breaker::default()
        }),
    )
}

/// A destination's pacing slots, and the owners refused one lately.
#[derive(Debug, Default)]
pub(super) struct Pace {
    /// Holder → the end of its slot's lease.
    slots: HashMap<String, Millis>,
    /// Owner → the end of its waiting mark.
    waiting: HashMap<String, Millis>,
}

impl Pace {
    /// Whether `owner` yields to another owner marked waiting that holds fewer than
    /// its share of `window` (the window over the owners holding or waiting, rounded
    /// up), `owner` holding at least its share besides `holder`.
    fn must_yield(&self, owner: &str, holder: &str, window: usize) -> bool {
        if self.waiting.keys().all(|w| w == owner) {
            return false;
        }
        let mut held: HashMap<&str, usize> = HashMap::new();
        held.insert(owner, 0);
        for w in self.waiting.keys() {
            held.entry(w.as_str()).or_default();
        }
        for h in self.slots.keys() {
            *held.entry(owner_of(h)).or_default() += usize::from(h != holder);
        }
        let share = window.div_ceil(held.len());
        held[owner] >= share
            && self
                .waiting
                .keys()
                .any(|w| w != owner && held[w.as_str()] < share)
    }
}

/// A holder's owner (an instance): its name up to its first `#`, else all of it.
fn owner_of(holder: &str) -> &str {
    holder.split_once('#').map_or(holder, |(owner, _)| owner)
}

/// A slot of `destination` for `holder` until `lease_end`, if fewer than `window` are
/// held by live holders (or `holder` has one already: its lease is renewed) and, when
/// `fair`, its owner need not yield to another one waiting (`Pace::must_yield`). An
/// owner refused is marked waiting, and a holder refused loses the slot it had.
fn take_slot(
    paces: &Mutex<Paces>,
    destination: &str,
    holder: &str,
    window: u32,
    lease_end: Millis,
    fair: bool,
) -> Admission {
    let now = now_ms();
    let mut paces = paces.lock().unwrap_or_else(|e| e.into_inner());
    let pace = paces.entry(destination.to_owned()).or_default();
    pace.slots.retain(|_, end| *end > now);
    pace.waiting.retain(|_, end| *end > now);
    let owner = owner_of(holder);
    let size = usize::try_from(window).unwrap_or(usize::MAX);
    let full = !pace.slots.contains_key(holder) && pace.slots.len() >= size;
    if full || (fair && pace.must_yield(owner, holder, size)) {
        pace.slots.remove(holder);
        pace.waiting.insert(
            owner.to_owned(),
            now.saturating_add(duration_ms(crate::store::WAITING_MARK)),
        );
        return Admission::Full { window };
    }
    pace.slots.insert(holder.to_owned(), lease_end);
    Admission::Go
}

fn give_back_slot(paces: &Mutex<Paces>, destination: &str, holder: &str) {
    let mut paces = paces.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(pace) = paces.get_mut(destination) {
        pace.slots.remove(holder);
        let now = now_ms();
        pace.waiting.retain(|_, end| *end > now);
        if pace.slots.is_empty() && pace.waiting.is_empty() {
            paces.remove(destination);
        }
    }
}

/// The breaker after an attempt's result (None: no record, closed with nothing
/// counted) and what became of it. See `Outbox::settle_delivery`.
fn settled(
    mut b: Breaker,
    success: bool,
    terms: &DeliveryTerms,
    now: Millis,
) -> (Option<Breaker>, BreakerUpdate) {
    let was_closed = b.state == "closed";
    if success {
        let ramp = if was_closed {
            b.ramp.map(|r| r.saturating_add(1))
        } else {
            // Closed again: the window starts at one slot.
            Some(1)
        };
        let update = BreakerUpdate {
            state: BreakerState::Closed,
            changed: !was_closed,
        };
        let record = ramp.filter(|r| *r < terms.limit.max(1)).map(|r| Breaker {
            state: "closed".to_owned(),
            until: 0,
            failures: 0,
            ramp: Some(r),
        });
        return (record, update);
    }
    if b.state == "open" {
        let update = BreakerUpdate {
            state: BreakerState::Open { until: b.until },
            changed: false,
        };
        return (Some(b), update);
    }
    b.failures = b.failures.saturating_add(1);
    if b.state == "half_open" || b.failures >= terms.threshold.max(1) {
        b.state = "open".to_owned();
        b.until = now.saturating_add(duration_ms(terms.cool_down));
        b.ramp = None;
        let update = BreakerUpdate {
            state: BreakerState::Open { until: b.until },
            changed: true,
        };
        return (Some(b), update);
    }
    b.ramp = b.ramp.map(|r| (r / 2).max(1));
    let update = BreakerUpdate {
        state: BreakerState::Closed,
        changed: false,
    };
    (Some(b), update)
}

impl EmbeddedStore {
    /// Whether the destination has a breaker record (it failed since its last
    /// success): none if it never failed while this store was open and had none when
    /// it opened (`tripped`), else by a read transaction. A record written after this
    /// read is a decision taken after the caller's: answering as if it came first is
    /// what the writer would have done had the caller's step been queued before it.
    fn has_breaker(&self, destination: &str) -> Result<bool> {
        if !self.tripped_destinations().contains(destination) {
            return Ok(false);
        }
        self.point_read(|inner| {
            let txn = read(&inner.db)?;
            let table = txn.open_table(BREAKERS).ctx("open webhook breakers")?;
            Ok(table.get(destination).ctx("read breaker")?.is_some())
        })
    }
}

impl EmbeddedStore {
    fn claims(&self) -> std::sync::MutexGuard<'_, Claims> {
        // Each statement leaves the map consistent, so a panic elsewhere cannot leave
        // it half-updated.
        self.claims.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn tripped_destinations(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        // Inserts only: a panic elsewhere cannot leave the set half-updated.
        self.tripped.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the claim if it is still the one under `token`.
    fn release_claim(&self, schedule_id: &str, token: u64) {
        let mut claims = self.claims();
        if claims
            .live
            .get(schedule_id)
            .is_some_and(|(t, _)| *t == token)
        {
            claims.live.remove(schedule_id);
        }
    }
}

/// `finish_delivery`'s step, its claim checked by the caller: the attempt counted (but
/// for `Defer` and `Abandon`), the run's delivery record updated, the entry due again
/// or gone.
fn apply_delivery_outcome(
    t: &mut RunTables<'_>,
    schedule_id: &str,
    outcome: DeliveryOutcome,
) -> Result<Applied> {
    let Some(mut entry) = t.load_outbox(schedule_id)? else {
        return Ok(Applied::No("unknown delivery".to_owned()));
    };
    let old_due = entry.due;
    let now = t.now;
    let (status, error) = match &outcome {
        DeliveryOutcome::Defer { until } => {
            entry.due = now.max(*until);
            t.put_outbox(schedule_id, &entry, Some(old_due))?;
            return Ok(Applied::Yes);
        }
        DeliveryOutcome::Delivered { status } => (*status, String::new()),
        DeliveryOutcome::Retry { status, error, .. }
        | DeliveryOutcome::Failed { status, error } => (*status, error.clone()),
        DeliveryOutcome::Gone => (410, crate::store::GONE_ERROR.to_owned()),
        DeliveryOutcome::Abandon { error } => (0, error.clone()),
    };
    if !matches!(outcome, DeliveryOutcome::Abandon { .. }) {
        entry.attempts = entry.attempts.saturating_add(1);
    }
    let mut run = t.load(schedule_id)?;
    if let Some(run) = run.as_mut() {
        run.callback_attempts = entry.attempts;
        run.callback_status = status;
        run.callback_error = error;
    }
    match outcome {
        DeliveryOutcome::Retry { after, .. } => {
            entry.due = now.saturating_add(duration_ms(after));
            t.put_outbox(schedule_id, &entry, Some(old_due))?;
        }
        done => {
            t.remove_outbox(schedule_id, &entry)?;
            if let Some(run) = run.as_mut() {
                run.callback_state = if matches!(done, DeliveryOutcome::Delivered { .. }) {
                    CallbackState::Done
                } else {
                    CallbackState::Failed
                };
            }
        }
    }
    if let Some(mut run) = run {
        t.save(&mut run)?;
    }
    Ok(Applied::Yes)
}
