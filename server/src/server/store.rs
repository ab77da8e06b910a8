//! Opening the store the configuration names: Redis, or the embedded file in a data
//! directory only its owner may read (it holds app secrets and every job's payload).

use std::sync::Arc;

use tracing::{info, warn};

use super::Error;
use crate::config::{Config, StoreConfig};
use crate::store::embedded::EmbeddedStore;
use crate::store::redis::RedisStore;
use crate::store::{Store, StoreMeta};

pub async fn open_store(config: &Config) -> Result<Arc<dyn Store>, Error> {
    Ok(match &config.store {
        StoreConfig::Redis { target, prefix } => {
            let store = RedisStore::connect_to(target, prefix, config.store_opts.clone()).await?;
            info!(prefix = %prefix, partitions = store.partitions(), "store: redis (multi-instance)");
            Arc::new(store)
        }
        StoreConfig::Embedded { path } => {
            if let Some(dir) = path.parent() {
                create_private_dir(dir).map_err(|e| {
                    crate::store::Error::Unavailable(format!(
                        "cannot create {}: {e}",
                        dir.display()
                    ))
                })?;
            }
            let store = EmbeddedStore::open(path, config.store_opts.clone())?;
            // The file holds app secrets and every job's payload: its owner only. (A file
            // this user may write but does not own cannot be changed: said, not fatal.)
            if let Err(e) = make_private(path, 0o600) {
                warn!(path = %path.display(), error = %e, "cannot make the store file private (0600)");
            }
            warn!(
                path = %path.display(),
                "store: embedded, SINGLE NODE ONLY: do not start a second instance on this data; use --redis-url for more"
            );
            Arc::new(store)
        }
    })
}

/// Creates the data directory (and its parents) readable by its owner only (0700 on
/// Unix); an existing directory keeps its mode.
fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Sets `path`'s mode (Unix; elsewhere nothing).
fn make_private(path: &std::path::Path, mode: u32) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
    }
    #[cfg(not(unix))]
    {
        let _ = (path, mode);
        Ok(())
    }
}
