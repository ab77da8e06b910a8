//! This instance's job records by version, shared by the parts that read jobs (the
//! scheduler and the router), so a job that fires for the first time is read from the
//! store once, not once by the scheduler to plan its fire and again by the router to
//! begin its run.
//!
//! A record is kept at the newest version read; asked for a version, the cache answers
//! only with a record at least that new (a trigger names the version it was planned
//! at), so an update is never hidden by an older copy. It is a cache of this instance
//! only: nothing is coordinated through it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::model::JobRecord;

/// Job records by id, each at the newest version this instance read.
#[derive(Default)]
pub struct JobCache {
    jobs: Mutex<HashMap<String, Arc<JobRecord>>>,
}

impl JobCache {
    /// The job as of at least `version`, if held.
    pub fn get(&self, job_id: &str, version: u64) -> Option<Arc<JobRecord>> {
        self.lock()
            .get(job_id)
            .filter(|j| j.version >= version)
            .cloned()
    }

    /// Of `wanted` (id, version), the ids held at no version that new, each once.
    pub fn missing<'a>(&self, wanted: impl Iterator<Item = (&'a str, u64)>) -> Vec<String> {
        let jobs = self.lock();
        let mut ids: Vec<String> = wanted
            .filter(|(id, version)| jobs.get(*id).is_none_or(|j| j.version < *version))
            .map(|(id, _)| id.to_owned())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Keeps these records, unless a newer version of one is held; returns them shared.
    pub fn keep(&self, found: Vec<JobRecord>) -> Vec<Arc<JobRecord>> {
        let mut jobs = self.lock();
        found
            .into_iter()
            .map(|job| {
                let job = Arc::new(job);
                match jobs.get(&job.spec.id) {
                    Some(held) if held.version >= job.version => {}
                    _ => {
                        jobs.insert(job.spec.id.clone(), job.clone());
                    }
                }
                job
            })
            .collect()
    }

    /// Forgets a job the store no longer has.
    pub fn forget(&self, job_id: &str) {
        self.lock().remove(job_id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<JobRecord>>> {
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::conformance::job;

    fn record(id: &str, version: u64) -> JobRecord {
        JobRecord {
            version,
            ..job(id, None)
        }
    }

    #[test]
    fn a_version_is_answered_only_by_a_record_at_least_that_new() {
        let cache = JobCache::default();
        assert!(cache.get("a", 1).is_none());
        cache.keep(vec![record("a", 2)]);
        assert_eq!(cache.get("a", 1).map(|j| j.version), Some(2));
        assert_eq!(cache.get("a", 2).map(|j| j.version), Some(2));
        assert!(cache.get("a", 3).is_none(), "an update is never hidden");
        // An older copy read later does not replace the newer one.
        let kept = cache.keep(vec![record("a", 1), record("b", 5)]);
        assert_eq!(kept.iter().map(|j| j.version).collect::<Vec<_>>(), [1, 5]);
        assert_eq!(cache.get("a", 0).map(|j| j.version), Some(2));
        cache.keep(vec![record("a", 3)]);
        assert_eq!(cache.get("a", 3).map(|j| j.version), Some(3));
        cache.forget("a");
        assert!(cache.get("a", 0).is_none());
    }

    #[test]
    fn missing_names_each_job_not_held_new_enough_once() {
        let cache = JobCache::default();
        cache.keep(vec![record("held", 4), record("old", 1)]);
        let wanted = [("held", 4), ("old", 2), ("new", 1), ("new", 1), ("held", 3)];
        assert_eq!(cache.missing(wanted.into_iter()), ["new", "old"]);
    }
}
