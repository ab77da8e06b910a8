//! How a job's webhooks go out: at most its `callback_max_in_flight` in flight to their
//! destination (else the server's bound), signed by the app the job names (its secrets
//! that sign now, two while a rotation overlaps), else by the server-wide
//! `--webhook-app-id` and `--webhook-secret`.
//!
//! What the jobs say (their bound and app) is kept per job until any job is created,
//! changed or deleted (the store's job-change counter, which every instance's writes
//! move, and which moves again after its subscription reconnects) and for at most
//! [`JOB_TERMS_FRESH`] (a safety net for a notice that never came), so a
//! steady flow of webhooks does not read its jobs from the store for every claim (at
//! 3 000 runs a second that was a job read per delivery). At most [`KEPT_MAX`] jobs are
//! kept. The apps' secrets are read for every claim, so a rotation signs the next
//! delivery.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sundial_sdk::webhook::Secret;
use tokio::sync::watch;
use tracing::warn;

use crate::store::{AppStore, JobStore, WebhookDelivery};

/// The longest a job's bound and app are used without reading the job again (longer
/// than most jobs' periods, so a job firing every few minutes is not read for each of
/// its webhooks).
pub const JOB_TERMS_FRESH: Duration = Duration::from_secs(300);

/// The most jobs whose terms are kept; past it they are all read again.
pub const KEPT_MAX: usize = 100_000;

/// How one job's webhooks go out.
#[derive(Debug)]
pub struct Sender {
    /// At most this many in flight to the destination.
    pub limit: u32,
    /// The `X-Sundial-App-Id` header.
    pub app_id: String,
    /// Every attempt is signed with each.
    pub secrets: Vec<Secret>,
}

/// What a job says of its webhooks: its bound (0: the server's) and app ('' or a job
/// that is gone: the server's).
#[derive(Debug, Clone, PartialEq, Eq)]
struct JobTerms {
    limit: u32,
    app_id: String,
}

/// The job terms read, by job id, as of one value of the job-change counter.
#[derive(Default)]
struct Known {
    change: u64,
    jobs: HashMap<String, (JobTerms, Instant)>,
    pruned: Option<Instant>,
}

/// The senders of claimed deliveries. See the module docs.
pub struct Senders {
    jobs: Arc<dyn JobStore>,
    apps: Arc<dyn AppStore>,
    changes: watch::Receiver<u64>,
    kept: Mutex<Known>,
    /// The server's bound per destination.
    default_limit: u32,
    app_id: String,
    secrets: Vec<Secret>,
}

impl Senders {
    pub fn new(
        jobs: Arc<dyn JobStore>,
        apps: Arc<dyn AppStore>,
        default_limit: u32,
        app_id: String,
        secrets: Vec<Secret>,
    ) -> Self {
        let changes = jobs.job_changes();
        Self {
            jobs,
            apps,
            changes,
            kept: Mutex::default(),
            default_limit,
            app_id,
            secrets,
        }
    }

    /// The sender of each claimed delivery's job, by job id: the jobs not kept read in
    /// one store call, each app once. A job that could not be read has no entry (the
    /// server's bound and secrets: [`of`](Self::of)).
    pub async fn for_claims(&self, claimed: &[WebhookDelivery]) -> HashMap<String, Arc<Sender>> {
        let wanted: BTreeSet<&str> = claimed.iter().map(|d| d.job_id.as_str()).collect();
        let (mut terms, missing) = self.kept_terms(&wanted);
        if !missing.is_empty() {
            terms.extend(self.read_terms(missing).await);
        }
        let mut apps: HashMap<String, Option<Vec<Secret>>> = HashMap::new();
        let mut senders = HashMap::with_capacity(terms.len());
        for (job_id, t) in terms {
            let limit = match t.limit {
                0 => self.default_limit,
                n => n,
            };
            let secrets = if t.app_id.is_empty() {
                None
            } else {
                if !apps.contains_key(&t.app_id) {
                    let secrets = self.app_secrets(&t.app_id).await;
                    apps.insert(t.app_id.clone(), secrets);
                }
                apps.get(&t.app_id).cloned().flatten()
            };
            let sender = match secrets {
                Some(secrets) => Sender {
                    limit,
                    app_id: t.app_id,
                    secrets,
                },
                None => self.server(limit),
            };
            senders.insert(job_id, Arc::new(sender));
        }
        senders
    }

    /// The job's sender among `senders`, else the server's (its job could not be read).
    pub fn of(&self, senders: &HashMap<String, Arc<Sender>>, job_id: &str) -> Arc<Sender> {
        senders
            .get(job_id)
            .cloned()
            .unwrap_or_else(|| Arc::new(self.server(self.default_limit)))
    }

    /// The server-wide signer, at `limit` in flight per destination.
    fn server(&self, limit: u32) -> Sender {
        Sender {
            limit,
            app_id: self.app_id.clone(),
            secrets: self.secrets.clone(),
        }
    }

    /// Of `wanted`, the terms kept and fresh, and the ids to read. Everything kept goes
    /// once the job-change counter moved.
    fn kept_terms(&self, wanted: &BTreeSet<&str>) -> (Vec<(String, JobTerms)>, Vec<String>) {
        let change = *self.changes.borrow();
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.change != change {
            kept.jobs.clear();
            kept.change = change;
        }
        if kept.pruned.is_none_or(|at| at.elapsed() >= JOB_TERMS_FRESH) {
            kept.jobs
                .retain(|_, (_, at)| at.elapsed() < JOB_TERMS_FRESH);
            kept.pruned = Some(Instant::now());
        }
        let (mut found, mut missing) = (Vec::new(), Vec::new());
        for id in wanted {
            match kept.jobs.get(*id) {
                Some((t, at)) if at.elapsed() < JOB_TERMS_FRESH => {
                    found.push(((*id).to_owned(), t.clone()));
                }
                _ => missing.push((*id).to_owned()),
            }
        }
        (found, missing)
    }

    /// Reads the jobs `ids` and keeps their terms (a job gone has the server's); none
    /// when they could not be read (logged).
    async fn read_terms(&self, ids: Vec<String>) -> Vec<(String, JobTerms)> {
        // The counter as it was before the read: a change meanwhile clears these.
        let change = *self.changes.borrow();
        let jobs = match self.jobs.get_jobs(&ids).await {
            Ok(jobs) => jobs,
            Err(e) => {
                warn!(error = %e, "reading the jobs of claimed webhooks failed; signing with the server's secrets, at the server's bound");
                return Vec::new();
            }
        };
        let mut terms: HashMap<String, JobTerms> = ids
            .into_iter()
            .map(|id| {
                let gone = JobTerms {
                    limit: 0,
                    app_id: String::new(),
                };
                (id, gone)
            })
            .collect();
        for job in jobs {
            terms.insert(
                job.spec.id,
                JobTerms {
                    limit: job.spec.callback_max_in_flight,
                    app_id: job.spec.app_id,
                },
            );
        }
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.jobs.len() + terms.len() > KEPT_MAX {
            kept.jobs.clear();
        }
        if kept.change == change && *self.changes.borrow() == change {
            let now = Instant::now();
            for (id, t) in &terms {
                kept.jobs.insert(id.clone(), (t.clone(), now));
            }
        }
        terms.into_iter().collect()
    }

    /// The secrets of app `app_id` that sign now; None (logged) when it has none
    /// usable, does not exist or could not be read: the server's secrets sign.
    async fn app_secrets(&self, app_id: &str) -> Option<Vec<Secret>> {
        match self.apps.get_app(app_id).await {
            Ok(Some(app)) => {
                let now = crate::model::now_ms();
                let secrets: Vec<Secret> = app
                    .active_secrets(now)
                    .filter_map(|s| s.parse().ok())
                    .collect();
                if !secrets.is_empty() {
                    return Some(secrets);
                }
                warn!(%app_id, "the job's app has no usable secret; signing with the server's secrets");
            }
            Ok(None) => {
                warn!(%app_id, "the job's app does not exist; signing with the server's secrets");
            }
            Err(e) => {
                warn!(%app_id, error = %e, "reading the job's app failed; signing with the server's secrets");
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deliver::test_support::test_store as store;
    use crate::model::{AppRecord, AppSecret};
    use crate::store::Store;
    use crate::store::conformance::job;

    fn senders(store: &Arc<dyn Store>) -> Senders {
        Senders::new(
            store.clone(),
            store.clone(),
            64,
            "server".to_owned(),
            vec![Secret::generate()],
        )
    }

    fn claimed(job_id: &str) -> WebhookDelivery {
        WebhookDelivery {
            schedule_id: format!("{job_id}:1"),
            job_id: job_id.to_owned(),
            url: "http://receiver.example/hook".to_owned(),
            body: "{}".to_owned(),
            attempts: 0,
            created_at: 0,
            token: 1,
            now: 0,
        }
    }

    /// (limit, app_id) of the sender of `job_id`'s claimed delivery.
    async fn sender(s: &Senders, job_id: &str) -> (u32, String) {
        let all = s.for_claims(&[claimed(job_id)]).await;
        let one = s.of(&all, job_id);
        (one.limit, one.app_id.clone())
    }

    fn kept(s: &Senders) -> usize {
        s.kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .jobs
            .len()
    }

    /// A job's bound and app are read once and kept; a change of any job (the store's
    /// counter moves) makes the next claim read them again, so an update, a new app
    /// and a delete are each seen by the next delivery.
    #[tokio::test]
    async fn a_jobs_terms_are_kept_until_a_job_changes() {
        let (store, _dir) = store();
        let mut j = job("w", None);
        j.spec.callback_max_in_flight = 3;
        let created = store.create_job(j).await.expect("create");
        let s = senders(&store);
        assert_eq!(sender(&s, "w").await, (3, "server".to_owned()));
        assert_eq!(kept(&s), 1, "kept after the first read");
        assert_eq!(sender(&s, "w").await, (3, "server".to_owned()));

        store
            .create_app(AppRecord {
                app_id: "billing".to_owned(),
                name: "Billing".to_owned(),
                secrets: vec![AppSecret {
                    secret: Secret::generate().to_string(),
                    not_after: 0,
                }],
                created_at: 0,
            })
            .await
            .expect("app");
        let mut changed = created.clone();
        changed.spec.callback_max_in_flight = 7;
        changed.spec.app_id = "billing".to_owned();
        store
            .update_job(changed, created.version)
            .await
            .expect("update");
        assert_eq!(sender(&s, "w").await, (7, "billing".to_owned()));

        store.delete_job("w").await.expect("delete");
        assert_eq!(
            sender(&s, "w").await,
            (64, "server".to_owned()),
            "a job gone: the server's bound and signer"
        );
        assert_eq!(kept(&s), 1, "the gone job's terms are kept too");
    }

    /// An app's secrets are read at every claim: a rotation signs the next delivery
    /// with both secrets at once, though the job's terms were kept.
    #[tokio::test]
    async fn an_apps_rotation_signs_the_next_claim() {
        let (store, _dir) = store();
        let first = Secret::generate();
        store
            .create_app(AppRecord {
                app_id: "billing".to_owned(),
                name: "Billing".to_owned(),
                secrets: vec![AppSecret {
                    secret: first.to_string(),
                    not_after: 0,
                }],
                created_at: 0,
            })
            .await
            .expect("app");
        let mut j = job("w", None);
        j.spec.app_id = "billing".to_owned();
        store.create_job(j).await.expect("create");
        let s = senders(&store);
        let all = s.for_claims(&[claimed("w")]).await;
        assert_eq!(s.of(&all, "w").secrets.len(), 1);
        let change = *s.changes.borrow();
        store
            .rotate_app_secret(
                "billing",
                &Secret::generate().to_string(),
                Duration::from_secs(60),
            )
            .await
            .expect("rotate");
        assert_eq!(*s.changes.borrow(), change, "a rotation is no job change");
        let all = s.for_claims(&[claimed("w")]).await;
        assert_eq!(
            s.of(&all, "w").secrets.len(),
            2,
            "both sign during the overlap"
        );
    }
}
