//! The store's connections: to one Redis (`redis://`, `rediss://`), to a Redis
//! Cluster (`redis+cluster://h1:p1,h2:p2`, `rediss+cluster://…`, a seed list: the
//! client learns the rest of the cluster from any of them), or to the master a set of
//! Sentinels names (`redis+sentinel://h1:p1,h2:p2/master-name`, `rediss+sentinel://…`).
//!
//! Owns the URL forms and TLS trust (`Target`), the shared connection every
//! non-blocking command goes over (`Shared`: redis-rs's `ConnectionManager`, its async
//! cluster connection, which routes each command by its first key, follows MOVED/ASK
//! and reconnects, or a `SentinelConn`, which asks the Sentinels for the master again
//! after a connection to it fails or it turned replica), the connections the blocking
//! commands take one at a time (`Blocking`) and where the change subscription
//! subscribes (`Subscribers`: in a cluster a `PUBLISH` reaches every node, so any one
//! of them will do; under Sentinel, the master of the moment).

use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, ClientTlsConfig, Cmd, ErrorKind, IntoConnectionInfo, Pipeline,
    RedisFuture, ServerErrorKind, TlsCertificates, TlsMode, Value,
};
use tokio::sync::{Mutex, Semaphore};

use super::{Result, unavailable};

/// Connection and response timeouts: blocking stream reads and large claim batches
/// outlast redis-rs's default 500 ms response timeout; a dead server is still noticed
/// within seconds.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections the blocking commands may hold at once.
const BLOCKING_MAX: usize = 8;
/// After the Sentinels could not name a reachable master, how long callers are told
/// so before they are asked again (callers retry with their own backoff).
const SENTINEL_RETRY_GAP: Duration = Duration::from_millis(200);

/// Where the store is (one server, a cluster's seed nodes, or Sentinels and the name
/// of the master they watch), which certificate authority a TLS URL's servers must be
/// signed by, the certificate this client presents when they ask for one, and the
/// Sentinels' own credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    nodes: Nodes,
    /// PEM certificates of the authorities trusted for TLS (instead of the system's).
    tls_ca: Option<Vec<u8>>,
    /// The certificate chain and key presented for mutual TLS (PEM).
    client_cert: Option<Hidden<(Vec<u8>, Vec<u8>)>>,
    /// The user (if any) and password the Sentinels ask for.
    sentinel_auth: Option<Hidden<(Option<String>, String)>>,
}

/// A value `Debug` does not print (key material, passwords).
#[derive(Clone, PartialEq, Eq)]
struct Hidden<T>(T);

impl<T> std::fmt::Debug for Hidden<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Nodes {
    Single(String),
    /// One `redis://` (or `rediss://`) URL per seed node, each with the credentials.
    Cluster(Vec<String>),
    /// One `redis://` (or `rediss://`) URL per Sentinel, without credentials; the
    /// credentials (a URL of the first Sentinel's address that carries them) are the
    /// master's.
    Sentinel {
        sentinels: Vec<String>,
        credentials: String,
        master: String,
    },
}

impl Target {
    /// Reads `--redis-url`: `redis://…` or `rediss://…` (one server),
    /// `redis+cluster://[user:password@]host:port,host:port…` for a cluster's seed
    /// nodes, or `redis+sentinel://[user:password@]host:port,host:port…/master-name`
    /// for the Sentinels watching a master (`rediss+` for TLS: to the Sentinels and the
    /// master both). The error names what is wrong.
    pub fn parse(url: &str) -> std::result::Result<Self, String> {
        let nodes = if url.starts_with("redis://") || url.starts_with("rediss://") {
            Nodes::Single(url.to_owned())
        } else if let Some((scheme, rest)) = strip_scheme(url, "cluster") {
            let (userinfo, hosts) = split_userinfo(rest);
            let hosts = hosts.trim_end_matches('/');
            if hosts.contains('/') || hosts.contains('?') {
                return Err(
                    "a cluster URL takes no database or options: host:port,host:port".into(),
                );
            }
            let seeds = host_list(hosts, "cluster seed")?;
            Nodes::Cluster(
                seeds
                    .iter()
                    .map(|h| format!("{scheme}://{userinfo}{h}"))
                    .collect(),
            )
        } else if let Some((scheme, rest)) = strip_scheme(url, "sentinel") {
            let (userinfo, rest) = split_userinfo(rest);
            let Some((hosts, master)) = rest.split_once('/') else {
                return Err("a Sentinel URL ends with /master-name".into());
            };
            let master = master.trim_end_matches('/');
            if master.is_empty() || master.contains(['/', '?', ' ']) {
                return Err(format!(
                    "Sentinel master name {master:?} must be one non-empty path segment"
                ));
            }
            let sentinels = host_list(hosts, "sentinel")?;
            Nodes::Sentinel {
                credentials: format!("{scheme}://{userinfo}{}", sentinels[0]),
                sentinels: sentinels
                    .iter()
                    .map(|h| format!("{scheme}://{h}"))
                    .collect(),
                master: master.to_owned(),
            }
        } else {
            return Err(
                "must start with redis:// or rediss:// (one server), redis+cluster:// or \
                 rediss+cluster:// (a cluster's seed nodes), or redis+sentinel:// or \
                 rediss+sentinel:// (Sentinels and the master's name)"
                    .into(),
            );
        };
        Ok(Self {
            nodes,
            tls_ca: None,
            client_cert: None,
            sentinel_auth: None,
        })
    }

    /// Whether the URL asks for TLS.
    pub fn is_tls(&self) -> bool {
        let first = match &self.nodes {
            Nodes::Single(url) => url,
            Nodes::Cluster(seeds) => &seeds[0],
            Nodes::Sentinel { sentinels, .. } => &sentinels[0],
        };
        first.starts_with("rediss://")
    }

    /// Trusts the authorities in `pem` (instead of the system's) for TLS.
    pub fn with_tls_ca(mut self, pem: Vec<u8>) -> Self {
        self.tls_ca = Some(pem);
        self
    }

    /// Whether the URL names Sentinels (`redis+sentinel://`, `rediss+sentinel://`).
    pub fn is_sentinel(&self) -> bool {
        matches!(self.nodes, Nodes::Sentinel { .. })
    }

    /// Presents the certificate chain `cert_pem` with its private key `key_pem` to
    /// servers that ask for a client certificate (mutual TLS), Sentinels included.
    pub fn with_client_cert(mut self, cert_pem: Vec<u8>, key_pem: Vec<u8>) -> Self {
        self.client_cert = Some(Hidden((cert_pem, key_pem)));
        self
    }

    /// Authenticates to the Sentinels themselves (as `user` when given), whose
    /// `requirepass` or ACL differs from the master's credentials in the URL.
    pub fn with_sentinel_auth(mut self, user: Option<String>, password: String) -> Self {
        self.sentinel_auth = Some(Hidden((user, password)));
        self
    }

    /// The trusted authorities and the client certificate, when either is given.
    fn certificates(&self) -> Option<TlsCertificates> {
        let client_tls = self
            .client_cert
            .as_ref()
            .map(|Hidden((cert, key))| ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            });
        (client_tls.is_some() || self.tls_ca.is_some()).then(|| TlsCertificates {
            client_tls,
            root_cert: self.tls_ca.clone(),
        })
    }

    /// A client of the one server at `url`, trusting the given authorities for TLS.
    fn client(&self, url: &str) -> Result<redis::Client> {
        match self.certificates() {
            Some(certs) => redis::Client::build_with_tls(url, certs),
            None => redis::Client::open(url),
        }
        .map_err(unavailable)
    }

    /// How new connections are made.
    fn opener(&self) -> Result<Opener> {
        Ok(match &self.nodes {
            Nodes::Single(url) => Opener::Single(Box::new(self.client(url)?)),
            Nodes::Cluster(seeds) => {
                let mut builder = ClusterClientBuilder::new(seeds.clone())
                    .connection_timeout(CONNECT_TIMEOUT)
                    .response_timeout(RESPONSE_TIMEOUT);
                if let Some(certs) = self.certificates() {
                    builder = builder.certs(certs);
                }
                Opener::Cluster(Box::new(builder.build().map_err(unavailable)?))
            }
            Nodes::Sentinel {
                sentinels,
                credentials,
                master,
            } => Opener::Sentinel(self.sentinel_client(sentinels, credentials, master)?),
        })
    }

    /// A client asking the Sentinels at `sentinels` for `master`, with the master's
    /// credentials from the URL `credentials`.
    fn sentinel_client(
        &self,
        sentinels: &[String],
        credentials: &str,
        master: &str,
    ) -> Result<Arc<Mutex<SentinelClient>>> {
        let addrs = sentinels
            .iter()
            .map(|u| {
                Ok(u.as_str()
                    .into_connection_info()
                    .map_err(unavailable)?
                    .addr()
                    .clone())
            })
            .collect::<Result<Vec<_>>>()?;
        let mut builder = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)
            .map_err(unavailable)?;
        let info = credentials.into_connection_info().map_err(unavailable)?;
        if let Some(user) = info.redis_settings().username() {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = info.redis_settings().password() {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some(Hidden((user, password))) = &self.sentinel_auth {
            if let Some(user) = user {
                builder = builder.set_client_to_sentinel_username(user);
            }
            builder = builder.set_client_to_sentinel_password(password);
        }
        if self.is_tls() {
            builder = builder
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(TlsMode::Secure);
            if let Some(certs) = self.certificates() {
                builder = builder
                    .set_client_to_redis_certificates(certs.clone())
                    .set_client_to_sentinel_certificates(certs);
            }
        }
        Ok(Arc::new(Mutex::new(builder.build().map_err(unavailable)?)))
    }

    /// The shared connection and the pool of blocking ones.
    pub(super) async fn connect(&self) -> Result<(Shared, Blocking)> {
        let opener = self.opener()?;
        let shared = match &opener {
            Opener::Single(client) => Shared::Single(
                ConnectionManager::new_with_config(
                    (**client).clone(),
                    ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(CONNECT_TIMEOUT))
                        .set_response_timeout(Some(RESPONSE_TIMEOUT))
                        // Reconnect attempts after a lost connection: 100 ms doubling to
                        // 2 s, so a restarted Redis is back in use within about 2 s.
                        .set_max_delay(Duration::from_secs(2))
                        .set_pipeline_buffer_size(1024),
                )
                .await
                .map_err(unavailable)?,
            ),
            _ => opener.open().await?,
        };
        let blocking = Blocking(Arc::new(Pool {
            opener,
            idle: std::sync::Mutex::new(Vec::new()),
            permits: Semaphore::new(BLOCKING_MAX),
        }));
        Ok((shared, blocking))
    }

    /// Where the change subscription subscribes, tried in turn.
    pub(super) fn subscribers(&self) -> Result<Subscribers> {
        Ok(match &self.nodes {
            Nodes::Single(url) => Subscribers::Nodes(vec![self.client(url)?], 0),
            Nodes::Cluster(seeds) => Subscribers::Nodes(
                seeds
                    .iter()
                    .map(|u| self.client(u))
                    .collect::<Result<Vec<_>>>()?,
                0,
            ),
            Nodes::Sentinel {
                sentinels,
                credentials,
                master,
            } => Subscribers::Master(self.sentinel_client(sentinels, credentials, master)?),
        })
    }
}

/// `url` without `redis+<kind>://` or `rediss+<kind>://`, and the plain scheme.
fn strip_scheme<'a>(url: &'a str, kind: &str) -> Option<(&'static str, &'a str)> {
    if let Some(rest) = url.strip_prefix(&format!("redis+{kind}://")) {
        return Some(("redis", rest));
    }
    url.strip_prefix(&format!("rediss+{kind}://"))
        .map(|rest| ("rediss", rest))
}

/// `user:password@` (empty when absent) and what follows it.
fn split_userinfo(rest: &str) -> (String, &str) {
    match rest.rsplit_once('@') {
        Some((user, hosts)) => (format!("{user}@"), hosts),
        None => (String::new(), rest),
    }
}

/// `host:port,host:port…`, each checked.
fn host_list<'a>(hosts: &'a str, what: &str) -> std::result::Result<Vec<&'a str>, String> {
    hosts
        .split(',')
        .map(|host| {
            let valid = host
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if valid {
                Ok(host)
            } else {
                Err(format!("{what} {host:?} is not host:port"))
            }
        })
        .collect()
}

/// A shared connection to the Redis, the cluster or the Sentinel-watched master at
/// `url` (any form `--redis-url` takes), for tests that look at the store's keys.
#[cfg(any(test, feature = "testing"))]
pub async fn raw_connection(url: &str) -> Result<impl ConnectionLike + Clone + use<>> {
    let target = Target::parse(url).map_err(unavailable)?;
    Ok(target.connect().await?.0)
}

/// How a new connection is made.
enum Opener {
    Single(Box<redis::Client>),
    Cluster(Box<ClusterClient>),
    Sentinel(Arc<Mutex<SentinelClient>>),
}

impl Opener {
    /// A connection of its own (not the shared one).
    async fn open(&self) -> Result<Shared> {
        Ok(match self {
            Self::Single(client) => Shared::Own(
                client
                    .get_multiplexed_async_connection_with_config(&connection_config())
                    .await
                    .map_err(unavailable)?,
            ),
            Self::Cluster(client) => {
                Shared::Cluster(client.get_async_connection().await.map_err(unavailable)?)
            }
            Self::Sentinel(sentinel) => {
                Shared::Sentinel(SentinelConn::connect(sentinel.clone()).await?)
            }
        })
    }
}

fn connection_config() -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
}

/// The shared, multiplexed connection (a cheap handle: clones share it).
#[derive(Clone)]
pub enum Shared {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(SentinelConn),
    /// A blocking command's own connection to one server.
    Own(MultiplexedConnection),
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
            Self::Sentinel(c) => c.req_packed_command(cmd),
            Self::Own(c) => c.req_packed_command(cmd),
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
            Self::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Own(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
            Self::Own(c) => c.get_db(),
            Self::Sentinel(_) => 0,
        }
    }
}

/// A connection to the master the Sentinels name. A command that fails because the
/// connection broke, timed out or reached a server that is now a replica
/// (`READONLY`) drops the connection, and the next command asks the Sentinels for the
/// master again (after a failover, the promoted replica). That command's own error is
/// returned as it is: the caller retries as it does when one Redis restarts.
#[derive(Clone)]
pub struct SentinelConn(Arc<SentinelState>);

struct SentinelState {
    sentinel: Arc<Mutex<SentinelClient>>,
    /// The connection in use and its generation (so a failure on an older one does
    /// not drop a newer one).
    current: std::sync::Mutex<Option<(u64, MultiplexedConnection)>>,
    /// Held while asking the Sentinels; the time of the last failed ask.
    resolving: Mutex<Option<Instant>>,
}

impl SentinelConn {
    async fn connect(sentinel: Arc<Mutex<SentinelClient>>) -> Result<Self> {
        let conn = Self(Arc::new(SentinelState {
            sentinel,
            current: std::sync::Mutex::new(None),
            resolving: Mutex::new(None),
        }));
        conn.connection().await.map_err(unavailable)?;
        Ok(conn)
    }

    /// The connection in use, or a new one to the master the Sentinels name now.
    async fn connection(&self) -> redis::RedisResult<(u64, MultiplexedConnection)> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let mut last_failure = self.0.resolving.lock().await;
        if let Some(c) = self.current() {
            return Ok(c);
        }
        if last_failure.is_some_and(|at| at.elapsed() < SENTINEL_RETRY_GAP) {
            return Err(redis::RedisError::from((
                ErrorKind::Io,
                "the Sentinels named no reachable master a moment ago",
            )));
        }
        let made = self
            .0
            .sentinel
            .lock()
            .await
            .get_async_connection_with_config(&connection_config())
            .await;
        match made {
            Ok(conn) => {
                *last_failure = None;
                let mut current = self
                    .0
                    .current
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let generation = current.as_ref().map_or(0, |(g, _)| g + 1);
                *current = Some((generation, conn.clone()));
                Ok((generation, conn))
            }
            Err(e) => {
                *last_failure = Some(Instant::now());
                Err(e)
            }
        }
    }

    fn current(&self) -> Option<(u64, MultiplexedConnection)> {
        self.0
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Drops connection `generation` when `e` says it is no longer the master's.
    fn check<T>(&self, generation: u64, r: &redis::RedisResult<T>) {
        let Err(e) = r else { return };
        let stale = e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_timeout()
            || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly);
        if stale {
            let mut current = self
                .0
                .current
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if current.as_ref().is_some_and(|(g, _)| *g == generation) {
                tracing::warn!(error = %e, "connection to the Redis master lost; asking the Sentinels again");
                *current = None;
            }
        }
    }
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut conn) = self.connection().await?;
            let r = conn.req_packed_command(cmd).await;
            self.check(generation, &r);
            r
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut conn) = self.connection().await?;
            let r = conn.req_packed_commands(pipeline, offset, count).await;
            self.check(generation, &r);
            r
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// Where the change subscription subscribes: the given nodes in turn, or the master
/// the Sentinels name at each (re)subscription.
pub(super) enum Subscribers {
    Nodes(Vec<redis::Client>, usize),
    Master(Arc<Mutex<SentinelClient>>),
}

impl Subscribers {
    /// The client to subscribe through this time.
    pub(super) async fn next(&mut self) -> redis::RedisResult<redis::Client> {
        match self {
            Self::Nodes(clients, i) => {
                let client = clients[*i % clients.len()].clone();
                *i += 1;
                Ok(client)
            }
            Self::Master(sentinel) => sentinel.lock().await.async_get_client().await,
        }
    }
}

/// Where the blocking commands (`XREADGROUP … BLOCK`, `BRPOP`) take a connection of
/// their own, so they never stall the shared pipeline: at most `BLOCKING_MAX` out at
/// once, a returned one reused, one that failed dropped.
#[derive(Clone)]
pub(super) struct Blocking(Arc<Pool>);

pub(super) struct Pool {
    opener: Opener,
    idle: std::sync::Mutex<Vec<Shared>>,
    permits: Semaphore,
}

impl Blocking {
    /// A connection of the caller's own for as long as it keeps it (a cluster's
    /// partition readers hold one each).
    pub(super) async fn dedicated(&self) -> Result<Shared> {
        self.0.opener.open().await
    }

    pub(super) async fn get(&self) -> Result<BlockingConn> {
        let pool = &self.0;
        let permit = tokio::time::timeout(Duration::from_secs(10), pool.permits.acquire())
            .await
            .map_err(|_| unavailable("no blocking connection free within 10 s"))?
            .map_err(unavailable)?;
        permit.forget();
        let idle = pool
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let conn = match idle {
            Some(c) => c,
            None => match pool.opener.open().await {
                Ok(c) => c,
                Err(e) => {
                    pool.permits.add_permits(1);
                    return Err(e);
                }
            },
        };
        Ok(BlockingConn(Some(conn), self.0.clone()))
    }
}

/// A connection held for one blocking command; it goes back to its pool when
/// dropped, unless a command on it failed.
pub(super) struct BlockingConn(Option<Shared>, Arc<Pool>);

impl Drop for BlockingConn {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            self.1
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(c);
        }
        self.1.permits.add_permits(1);
    }
}

impl ConnectionLike for BlockingConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let Some(conn) = self.0.as_mut() else {
                return Err(closed());
            };
            let r = conn.req_packed_command(cmd).await;
            if r.as_ref().is_err_and(broken) {
                self.0 = None;
            }
            r
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let Some(conn) = self.0.as_mut() else {
                return Err(closed());
            };
            let r = conn.req_packed_commands(pipeline, offset, count).await;
            if r.as_ref().is_err_and(broken) {
                self.0 = None;
            }
            r
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// An error after which a connection is not reused.
fn broken(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_timeout()
}

fn closed() -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Io, "blocking connection closed"))
}

#[cfg(test)]
mod tests {
    use super::{Nodes, Target};

    fn nodes(url: &str) -> Nodes {
        Target::parse(url).expect("valid").nodes
    }

    #[test]
    fn urls_name_one_server_a_cluster_seed_list_or_sentinels() {
        assert_eq!(
            nodes("redis://127.0.0.1:6379/0"),
            Nodes::Single("redis://127.0.0.1:6379/0".into())
        );
        assert_eq!(
            nodes("redis+cluster://u:p@h1:7000,h2:7001/"),
            Nodes::Cluster(vec![
                "redis://u:p@h1:7000".into(),
                "redis://u:p@h2:7001".into()
            ])
        );
        assert_eq!(
            nodes("rediss+cluster://h1:7000"),
            Nodes::Cluster(vec!["rediss://h1:7000".into()])
        );
        assert_eq!(
            nodes("redis+sentinel://:secret@h1:26379,h2:26380/mymaster"),
            Nodes::Sentinel {
                sentinels: vec!["redis://h1:26379".into(), "redis://h2:26380".into()],
                credentials: "redis://:secret@h1:26379".into(),
                master: "mymaster".into(),
            }
        );
        assert!(
            Target::parse("rediss+sentinel://h1:26379/m")
                .expect("valid")
                .is_tls()
        );
        assert!(
            !Target::parse("redis+cluster://h1:1")
                .expect("valid")
                .is_tls()
        );
        for bad in [
            "http://h:1",
            "redis+cluster://",
            "redis+cluster://h1",
            "redis+cluster://h1:x",
            "redis+cluster://h1:7000/2",
            "redis+sentinel://h1:26379",
            "redis+sentinel://h1:26379/",
            "redis+sentinel://h1/m",
            "redis+sentinel://h1:1/m/x",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad} accepted");
        }
    }
}
