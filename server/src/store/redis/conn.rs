//! The store's connections: to one Redis (`redis://`, `rediss://`) or to a Redis
//! Cluster (`redis+cluster://h1:p1,h2:p2`, `rediss+cluster://…`, a seed list: the
//! client learns the rest of the cluster from any of them).
//!
//! Owns the URL forms, the shared connection every non-blocking command goes over
//! (`Shared`: redis-rs's `ConnectionManager`, or its async cluster connection, which
//! routes each command by its first key, follows MOVED/ASK and reconnects), the
//! connections the blocking commands take one at a time (`Blocking`) and the clients
//! the change subscription may use (`Target::subscribers`: in a cluster a `PUBLISH`
//! reaches every node, so any one of them will do).

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::{Manager, Pool, Runtime};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use tokio::sync::{Mutex, Semaphore};

use super::{Result, unavailable};

/// Connection and response timeouts: blocking stream reads and large claim batches
/// outlast redis-rs's default 500 ms response timeout; a dead server is still noticed
/// within seconds.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections the blocking commands may hold at once.
const BLOCKING_MAX: usize = 8;

/// Where the store is: one server, or the seed nodes of a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    Single(String),
    /// One `redis://` (or `rediss://`) URL per seed node, each with the credentials.
    Cluster(Vec<String>),
}

impl Target {
    /// Reads `--redis-url`: `redis://…` or `rediss://…` (one server), or
    /// `redis+cluster://[user:password@]host:port,host:port…` (and `rediss+cluster://`
    /// for TLS) for a cluster's seed nodes. The error names what is wrong.
    pub(crate) fn parse(url: &str) -> std::result::Result<Self, String> {
        if url.starts_with("redis://") || url.starts_with("rediss://") {
            return Ok(Self::Single(url.to_owned()));
        }
        let (scheme, rest) = if let Some(rest) = url.strip_prefix("redis+cluster://") {
            ("redis", rest)
        } else if let Some(rest) = url.strip_prefix("rediss+cluster://") {
            ("rediss", rest)
        } else {
            return Err(
                "must start with redis:// or rediss:// (one server), or redis+cluster:// or \
                 rediss+cluster:// (a cluster's seed nodes)"
                    .into(),
            );
        };
        let (userinfo, hosts) = match rest.rsplit_once('@') {
            Some((user, hosts)) => (format!("{user}@"), hosts),
            None => (String::new(), rest),
        };
        let hosts = hosts.trim_end_matches('/');
        if hosts.contains('/') || hosts.contains('?') {
            return Err("a cluster URL takes no database or options: host:port,host:port".into());
        }
        let mut seeds = Vec::new();
        for host in hosts.split(',') {
            let valid = host
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !valid {
                return Err(format!("cluster seed {host:?} is not host:port"));
            }
            seeds.push(format!("{scheme}://{userinfo}{host}"));
        }
        Ok(Self::Cluster(seeds))
    }

    /// The shared connection and the pool of blocking ones.
    pub(super) async fn connect(&self) -> Result<(Shared, Blocking)> {
        match self {
            Self::Single(url) => {
                let cfg = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT));
                let pool = Pool::builder(
                    Manager::new_with_config(url.as_str(), cfg).map_err(unavailable)?,
                )
                .max_size(BLOCKING_MAX)
                .runtime(Runtime::Tokio1)
                .wait_timeout(Some(Duration::from_secs(10)))
                .create_timeout(Some(CONNECT_TIMEOUT))
                .build()
                .map_err(unavailable)?;
                let client = redis::Client::open(url.as_str()).map_err(unavailable)?;
                let shared = ConnectionManager::new_with_config(
                    client,
                    ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(CONNECT_TIMEOUT))
                        .set_response_timeout(Some(RESPONSE_TIMEOUT))
                        // Reconnect attempts after a lost connection: 100 ms doubling to
                        // 2 s, so a restarted Redis is back in use within about 2 s.
                        .set_max_delay(Duration::from_secs(2))
                        .set_pipeline_buffer_size(1024),
                )
                .await
                .map_err(unavailable)?;
                Ok((Shared::Single(shared), Blocking::Single(pool)))
            }
            Self::Cluster(seeds) => {
                let client = ClusterClientBuilder::new(seeds.clone())
                    .connection_timeout(CONNECT_TIMEOUT)
                    .response_timeout(RESPONSE_TIMEOUT)
                    .build()
                    .map_err(unavailable)?;
                let shared = client.get_async_connection().await.map_err(unavailable)?;
                let blocking = Blocking::Cluster(Arc::new(ClusterPool {
                    client,
                    idle: Mutex::new(Vec::new()),
                    permits: Semaphore::new(BLOCKING_MAX),
                }));
                Ok((Shared::Cluster(shared), blocking))
            }
        }
    }

    /// Clients for the change subscription, tried in turn.
    pub(super) fn subscribers(&self) -> Result<Vec<redis::Client>> {
        let urls = match self {
            Self::Single(url) => std::slice::from_ref(url),
            Self::Cluster(seeds) => seeds.as_slice(),
        };
        urls.iter()
            .map(|u| redis::Client::open(u.as_str()).map_err(unavailable))
            .collect()
    }
}

/// A shared connection to the Redis or the cluster at `url` (any form `--redis-url`
/// takes), for tests that look at the store's keys.
#[cfg(any(test, feature = "testing"))]
pub async fn raw_connection(url: &str) -> Result<impl ConnectionLike + Clone + use<>> {
    let target = Target::parse(url).map_err(unavailable)?;
    Ok(target.connect().await?.0)
}

/// The shared, multiplexed connection (a cheap handle: clones share it).
#[derive(Clone)]
pub enum Shared {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Shared {
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }
}

impl ConnectionLike for Shared {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// Where the blocking commands (`XREADGROUP … BLOCK`, `BRPOP`) take a connection of
/// their own, so they never stall the shared pipeline.
#[derive(Clone)]
pub(super) enum Blocking {
    Single(Pool),
    Cluster(Arc<ClusterPool>),
}

/// Cluster connections for blocking commands: at most `BLOCKING_MAX` out at once, a
/// returned one reused, one that failed dropped.
pub(super) struct ClusterPool {
    client: ClusterClient,
    idle: Mutex<Vec<ClusterConnection>>,
    permits: Semaphore,
}

impl Blocking {
    /// A connection of the caller's own for as long as it keeps it (a cluster's
    /// partition readers hold one each).
    pub(super) async fn dedicated(&self) -> Result<Shared> {
        match self {
            Self::Single(_) => Err(unavailable("dedicated connections are for a cluster")),
            Self::Cluster(pool) => Ok(Shared::Cluster(
                pool.client
                    .get_async_connection()
                    .await
                    .map_err(unavailable)?,
            )),
        }
    }

    pub(super) async fn get(&self) -> Result<BlockingConn> {
        match self {
            Self::Single(pool) => Ok(BlockingConn::Single(pool.get().await.map_err(unavailable)?)),
            Self::Cluster(pool) => {
                let permit = tokio::time::timeout(Duration::from_secs(10), pool.permits.acquire())
                    .await
                    .map_err(|_| unavailable("no blocking cluster connection free within 10 s"))?
                    .map_err(unavailable)?;
                permit.forget();
                let idle = pool.idle.lock().await.pop();
                let conn = match idle {
                    Some(c) => c,
                    None => match pool.client.get_async_connection().await {
                        Ok(c) => c,
                        Err(e) => {
                            pool.permits.add_permits(1);
                            return Err(unavailable(e));
                        }
                    },
                };
                Ok(BlockingConn::Cluster(Some(conn), pool.clone()))
            }
        }
    }
}

/// A connection held for one blocking command; a cluster one goes back to its pool
/// when dropped, unless a command on it failed.
pub(super) enum BlockingConn {
    Single(deadpool_redis::Connection),
    Cluster(Option<ClusterConnection>, Arc<ClusterPool>),
}

impl Drop for BlockingConn {
    fn drop(&mut self) {
        if let Self::Cluster(conn, pool) = self {
            // Never waits (a drop may happen outside the runtime): a connection that
            // cannot be put back at once is closed.
            if let (Some(c), Ok(mut idle)) = (conn.take(), pool.idle.try_lock()) {
                idle.push(c);
            }
            pool.permits.add_permits(1);
        }
    }
}

impl ConnectionLike for BlockingConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c, _) => Box::pin(async move {
                let Some(conn) = c.as_mut() else {
                    return Err(closed());
                };
                let r = conn.req_packed_command(cmd).await;
                if r.as_ref()
                    .is_err_and(|e| e.is_io_error() || e.is_connection_dropped())
                {
                    *c = None;
                }
                r
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c, _) => Box::pin(async move {
                let Some(conn) = c.as_mut() else {
                    return Err(closed());
                };
                conn.req_packed_commands(pipeline, offset, count).await
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(..) => 0,
        }
    }
}

fn closed() -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Io, "blocking connection closed"))
}

#[cfg(test)]
mod tests {
    use super::Target;

    #[test]
    fn urls_name_one_server_or_a_cluster_seed_list() {
        assert_eq!(
            Target::parse("redis://127.0.0.1:6379/0"),
            Ok(Target::Single("redis://127.0.0.1:6379/0".into()))
        );
        assert_eq!(
            Target::parse("redis+cluster://u:p@h1:7000,h2:7001/"),
            Ok(Target::Cluster(vec![
                "redis://u:p@h1:7000".into(),
                "redis://u:p@h2:7001".into()
            ]))
        );
        assert_eq!(
            Target::parse("rediss+cluster://h1:7000"),
            Ok(Target::Cluster(vec!["rediss://h1:7000".into()]))
        );
        for bad in [
            "http://h:1",
            "redis+cluster://",
            "redis+cluster://h1",
            "redis+cluster://h1:x",
            "redis+cluster://h1:7000/2",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad} accepted");
        }
    }
}
