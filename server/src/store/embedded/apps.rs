//! Apps and nonces: inbound replay protection (a nonce is spent once within its TTL)
//! and the apps with their write-only secrets and rotation.

use super::*;

#[async_trait]
impl AppStore for EmbeddedStore {
    async fn create_app(&self, mut app: AppRecord) -> Result<AppRecord> {
        self.write(move |_, b| {
            let txn = b.txn();
            let mut apps = txn.open_table(APPS).ctx("open apps")?;
            if apps.get(app.app_id.as_str()).ctx("read app")?.is_some() {
                return Err(Error::AppExists(app.app_id.clone()));
            }
            if app.created_at == 0 {
                app.created_at = now_ms();
            }
            let json = encode("app", &app)?;
            apps.insert(app.app_id.as_str(), json.as_str())
                .ctx("write app")?;
            Ok(app.clone())
        })
        .await
    }

    async fn get_app(&self, app_id: &str) -> Result<Option<AppRecord>> {
        self.point_read(|inner| {
            let txn = read(&inner.db)?;
            let apps = txn.open_table(APPS).ctx("open apps")?;
            load(&apps, "app", app_id)
        })
    }

    async fn rotate_app_secret(
        &self,
        app_id: &str,
        secret: &str,
        overlap: Duration,
    ) -> Result<AppRecord> {
        let (app_id, secret) = (app_id.to_owned(), secret.to_owned());
        self.write(move |_, b| {
            let txn = b.txn();
            let app_id = app_id.as_str();
            let secret = secret.as_str();
            let mut apps = txn.open_table(APPS).ctx("open apps")?;
            let Some(mut app) = load::<AppRecord>(&*apps, "app", app_id)? else {
                return Err(Error::AppNotFound(app_id.to_owned()));
            };
            let now = now_ms();
            let until = now.saturating_add(duration_ms(overlap));
            app.secrets
                .retain(|s| s.not_after == 0 || s.not_after > now);
            for s in &mut app.secrets {
                if s.not_after == 0 || s.not_after > until {
                    s.not_after = until;
                }
            }
            app.secrets.push(AppSecret {
                secret: secret.to_owned(),
                not_after: 0,
            });
            let json = encode("app", &app)?;
            apps.insert(app_id, json.as_str()).ctx("write app")?;
            Ok(app)
        })
        .await
    }

    async fn check_nonce(&self, app_id: &str, nonce: &str, ttl: Duration) -> Result<bool> {
        let (app_id, nonce) = (app_id.to_owned(), nonce.to_owned());
        self.write(move |_, b| {
            let txn = b.txn();
            let app_id = app_id.as_str();
            let nonce = nonce.as_str();
            let now = now_ms();
            // Forget a few expired nonces so the table stays as small as the live window.
            sweep_pair_expiry(txn, NONCE_EXPIRY, NONCES, now, "nonce")?;
            let mut nonces = txn.open_table(NONCES).ctx("open nonces")?;
            let mut expiry = txn.open_table(NONCE_EXPIRY).ctx("open nonce expiry")?;
            let seen = nonces
                .get((app_id, nonce))
                .ctx("read nonce")?
                .map(|g| g.value());
            match seen {
                Some(expires_at) if expires_at > now => return Ok(false),
                Some(expires_at) => {
                    expiry
                        .remove((expires_at, app_id, nonce))
                        .ctx("delete nonce expiry")?;
                }
                None => {}
            }
            let expires_at = now.saturating_add(duration_ms(ttl));
            nonces
                .insert((app_id, nonce), expires_at)
                .ctx("write nonce")?;
            expiry
                .insert((expires_at, app_id, nonce), ())
                .ctx("write nonce expiry")?;
            Ok(true)
        })
        .await
    }
}
