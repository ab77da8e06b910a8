//! `AppStore`: the apps that sign requests and webhooks, with their write-only secrets
//! and rotation, and the nonces that protect signed requests from replay.

use std::time::Duration;

use async_trait::async_trait;

use super::{Result, StoreMeta};
use crate::model::AppRecord;

/// Apps, their secrets and inbound nonces. See the module docs.
#[async_trait]
pub trait AppStore: StoreMeta {
    /// Stores a new app (`created_at` and each secret's `not_after` as given, except
    /// that `created_at` 0 becomes the store's now). An existing id → `AppExists`.
    async fn create_app(&self, app: AppRecord) -> Result<AppRecord>;

    async fn get_app(&self, app_id: &str) -> Result<Option<AppRecord>>;

    /// Adds `secret` as the app's current secret; the secrets that signed until now
    /// keep signing for `overlap` more (store clock) and the ones already past their
    /// end are dropped, in one step. Unknown app → `AppNotFound`.
    async fn rotate_app_secret(
        &self,
        app_id: &str,
        secret: &str,
        overlap: Duration,
    ) -> Result<AppRecord>;

    // ---- inbound replay protection

    /// True if `nonce` was not seen for `app_id` within `ttl`; remembers it.
    async fn check_nonce(&self, app_id: &str, nonce: &str, ttl: Duration) -> Result<bool>;
}
