//! Apps and nonces in Redis: apps with their write-only secrets and rotation, and
//! nonces spent once within their TTL.

use super::*;

#[async_trait]
impl AppStore for RedisStore {
    async fn create_app(&self, app: AppRecord) -> Result<AppRecord> {
        let json = serde_json::to_string(&app).map_err(corrupt)?;
        let mut c = self.conn().await?;
        let stored: String = self
            .inner
            .scripts
            .create_app
            .arg(self.app_key(&app.app_id))
            .arg(json)
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        if stored.is_empty() {
            return Err(Error::AppExists(app.app_id));
        }
        serde_json::from_str(&stored).map_err(corrupt)
    }

    async fn get_app(&self, app_id: &str) -> Result<Option<AppRecord>> {
        let mut c = self.conn().await?;
        let j: Option<String> = c.get(self.app_key(app_id)).await.map_err(unavailable)?;
        j.map(|j| serde_json::from_str(&j).map_err(corrupt))
            .transpose()
    }

    async fn rotate_app_secret(
        &self,
        app_id: &str,
        secret: &str,
        overlap: Duration,
    ) -> Result<AppRecord> {
        let mut c = self.conn().await?;
        let stored: String = self
            .inner
            .scripts
            .rotate_app_secret
            .arg(self.app_key(app_id))
            .arg(secret)
            .arg(duration_ms(overlap))
            .invoke_async(&mut c)
            .await
            .map_err(unavailable)?;
        if stored.is_empty() {
            return Err(Error::AppNotFound(app_id.to_owned()));
        }
        serde_json::from_str(&stored).map_err(corrupt)
    }

    async fn check_nonce(&self, app_id: &str, nonce: &str, ttl: Duration) -> Result<bool> {
        let mut c = self.conn().await?;
        let key = format!("{}:{{n}}:nonce:{app_id}:{nonce}", self.inner.prefix);
        let r: Value = redis::cmd("SET")
            .arg(key)
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(ms(ttl))
            .query_async(&mut c)
            .await
            .map_err(unavailable)?;
        Ok(!matches!(r, Value::Nil))
    }
}
