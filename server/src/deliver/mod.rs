//! *How does the world learn* the result: the webhook delivery worker that empties the
//! store's outbox ([`webhooks`]) under per-destination bounds ([`in_flight`]), the
//! bound and signer of each job's webhooks ([`senders`]), its store calls made in
//! batches ([`batch`]), and alerts for the events an operator must hear
//! about ([`alerts`]).
//!
//! May import the foundation (`store`, `model`, `metrics`, `auth`, `egress`); never
//! `schedule`, `dispatch`, `api` or `server`.

pub mod alerts;
pub mod batch;
pub mod in_flight;
pub mod senders;
pub mod webhooks;

/// Tests only: what the deliver tests share.
#[cfg(test)]
mod test_support {
    /// A fresh embedded store of one partition, and the directory that holds it.
    pub(crate) fn test_store() -> (std::sync::Arc<dyn crate::store::Store>, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let opts = crate::store::StoreOptions {
            partitions: 1,
            ..crate::store::StoreOptions::default()
        };
        let store = crate::store::embedded::EmbeddedStore::open(&dir.path().join("s.redb"), opts)
            .expect("open");
        (std::sync::Arc::new(store), dir)
    }
}
