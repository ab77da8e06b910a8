//! Server configuration: defaults, then an optional TOML file, then `SUNDIAL_*`
//! environment variables, then command-line flags; then `validate()`.
//!
//! Every interval is configurable (tests run the same code with short ones). Durations
//! are written the human way: `200ms`, `5s`, `7d`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;

use crate::auth::{
    AuthOptions, NamedToken, Secret, parse_executor_token, read_executor_tokens_file,
};
use crate::deliver::webhooks::WebhookOptions;
use crate::dispatch::DispatchOptions;
use crate::dispatch::executors::ExecutorOptions;
use crate::dispatch::health::HealthPolicy;
use crate::dispatch::sweeper::SweepOptions;
use crate::egress::IpNet;
use crate::schedule::scheduler::SchedulerOptions;
use crate::store::LeaseTerms;
use crate::store::StoreOptions;
use crate::tls::ServerTls;
use sundial_sdk::webhook::Secret as WebhookSecret;

mod bounds;
mod settings;

pub use settings::Settings;

use bounds::*;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("config file {path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("{field}: {reason}")]
    Invalid { field: &'static str, reason: String },
}

/// A duration written as `500ms`, `5s`, `2m`, `7d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl FromStr for HumanDuration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        humantime::parse_duration(s.trim())
            .map(HumanDuration)
            .map_err(|e| format!("{s:?} is not a duration like 500ms, 5s, 7d: {e}"))
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// A secret as given on the command line, in the environment or in the file: its
/// `Debug` never shows it, and it is parsed (into a webhook secret) by validation, whose
/// error names the field without echoing the value.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretText(pub String);

impl std::fmt::Debug for SecretText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl FromStr for SecretText {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(SecretText(s.to_owned()))
    }
}

impl<'de> Deserialize<'de> for SecretText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(SecretText)
    }
}

impl Settings {
    pub fn from_file(path: &std::path::Path) -> Result<Settings, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::File {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        toml::from_str(&text).map_err(|e| Error::File {
            path: path.to_owned(),
            reason: e.to_string(),
        })
    }
}

/// Which store backs this instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    Redis {
        /// Where the store is, with the certificates and credentials to reach it.
        target: crate::store::redis::Target,
        prefix: String,
    },
    Embedded {
        path: PathBuf,
    },
}

/// The validated configuration of one server instance.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub http_listen: Option<SocketAddr>,
    /// Serve the web console at `/` of the HTTP listener.
    pub console: bool,
    pub instance_id: String,
    pub store: StoreConfig,
    pub store_opts: StoreOptions,
    pub scheduler: SchedulerOptions,
    pub dispatch: DispatchOptions,
    pub executors: ExecutorOptions,
    pub sweep: SweepOptions,
    pub http_max_concurrency: u32,
    /// Threads of the server's runtime (`worker_threads`).
    pub worker_threads: usize,
    pub shutdown_grace: Duration,
    /// Allow list of the HTTP-target egress policy.
    pub http_target_allow: Vec<IpNet>,
    /// Allow list of the webhook egress policy.
    pub webhook_allow: Vec<IpNet>,
    /// Credentials; their `Debug` is redacted.
    pub auth: AuthOptions,
    /// TLS for both listeners; None = plaintext.
    pub tls: Option<ServerTls>,
    pub webhooks: WebhookOptions,
    /// Where alerts are POSTed too, if anywhere.
    pub alert_webhook: Option<url::Url>,
}

fn addr(field: &'static str, v: &str) -> Result<SocketAddr, Error> {
    v.parse().map_err(|e| Error::Invalid {
        field,
        reason: format!("{v:?} is not host:port: {e}"),
    })
}

/// A setting that has a declared default, so it is always set once the defaults are
/// under it.
fn given<T>(field: &'static str, v: Option<T>) -> Result<T, Error> {
    v.ok_or_else(|| Error::Invalid {
        field,
        reason: "has no value and no default".into(),
    })
}

fn allow_list(field: &'static str, v: Option<&str>) -> Result<Vec<IpNet>, Error> {
    crate::egress::parse_allow_list(v.unwrap_or("")).map_err(|e| Error::Invalid {
        field,
        reason: e.to_string(),
    })
}

impl Config {
    /// The configuration `s` gives, each setting it leaves unset at its declared
    /// default (`settings.rs`), checked against its range (`bounds.rs`) and against the
    /// others.
    pub fn from_settings(s: Settings) -> Result<Config, Error> {
        let s = s.over(Settings::defaults()?);
        let (listen, http_listen) = listeners(&s)?;
        let instance_id = instance_id(s.instance_id.clone())?;
        let sweep_every = SWEEP_EVERY.get(s.sweep_every)?;
        let leases = leases(&s)?;
        let health = health_policy(&s)?;
        let auth = auth_options(
            s.bearer_token.clone(),
            s.read_token.clone(),
            s.app_secret.clone(),
            s.executor_token.clone(),
            s.executor_tokens_file.clone(),
        )?;
        refuse_open_network(&s, &auth, listen, http_listen)?;
        Ok(Config {
            store: store_config(&s)?,
            store_opts: store_options(&s, &instance_id, &leases)?,
            scheduler: scheduler_options(&s)?,
            executors: executor_options(&s, &instance_id, &leases, health)?,
            dispatch: dispatch_options(&s, &instance_id, &leases, health)?,
            sweep: SweepOptions {
                every: sweep_every,
                ..SweepOptions::default()
            },
            // The webhook worker sweeps the outbox as often as the sweeper sweeps run
            // timers.
            webhooks: webhook_options(&s, sweep_every)?,
            http_max_concurrency: HTTP_MAX_CONCURRENCY.get(s.http_max_concurrency)?,
            worker_threads: WORKER_THREADS.check(s.worker_threads, default_worker_threads())?,
            listen,
            http_listen,
            console: given("console", s.console)?,
            instance_id,
            shutdown_grace: SHUTDOWN_GRACE.get(s.shutdown_grace)?,
            http_target_allow: allow_list("http_target_allow", s.http_target_allow.as_deref())?,
            webhook_allow: allow_list("webhook_allow", s.webhook_allow.as_deref())?,
            auth,
            tls: tls_options(s.tls_cert, s.tls_key, s.tls_client_ca)?,
            alert_webhook: alert_webhook(s.alert_webhook_url.as_deref())?,
        })
    }
}

/// The gRPC address, and the HTTP one unless it is "" or "off".
fn listeners(s: &Settings) -> Result<(SocketAddr, Option<SocketAddr>), Error> {
    let listen = addr("listen", &given("listen", s.listen.clone())?)?;
    let http_listen = match given("http_listen", s.http_listen.clone())?.as_str() {
        "" | "off" => None,
        v => Some(addr("http_listen", v)?),
    };
    Ok((listen, http_listen))
}

/// The instance's name as given (an id), else one made now.
fn instance_id(given: Option<String>) -> Result<String, Error> {
    match given {
        Some(id) if !crate::model::valid_job_id(&id) => Err(Error::Invalid {
            field: "instance_id",
            reason: "must match [A-Za-z0-9._-]{1,128}, not . or ..".into(),
        }),
        Some(id) => Ok(id),
        None => Ok(default_instance_id()),
    }
}

/// Redis when a URL is given, else the embedded store in the data directory.
fn store_config(s: &Settings) -> Result<StoreConfig, Error> {
    match s.redis_url.clone() {
        Some(url) if !url.is_empty() => Ok(StoreConfig::Redis {
            target: redis_target(s, &url)?,
            prefix: given("redis_prefix", s.redis_prefix.clone())?,
        }),
        _ => match redis_only_setting(s) {
            Some(field) => Err(Error::Invalid {
                field,
                reason: "applies to a redis_url only (the embedded store is in use)".into(),
            }),
            None => Ok(StoreConfig::Embedded {
                path: given("data_dir", s.data_dir.clone())?.join("sundial.redb"),
            }),
        },
    }
}

/// The first Redis connection setting given, when there is no Redis URL.
fn redis_only_setting(s: &Settings) -> Option<&'static str> {
    [
        ("redis_tls_ca", s.redis_tls_ca.is_some()),
        ("redis_tls_cert", s.redis_tls_cert.is_some()),
        ("redis_tls_key", s.redis_tls_key.is_some()),
        ("redis_sentinel_user", s.redis_sentinel_user.is_some()),
        (
            "redis_sentinel_password",
            s.redis_sentinel_password.is_some(),
        ),
    ]
    .into_iter()
    .find_map(|(field, set)| set.then_some(field))
}

/// `url` with the TLS files (read and checked) and the Sentinels' credentials.
fn redis_target(s: &Settings, url: &str) -> Result<crate::store::redis::Target, Error> {
    let target = crate::store::redis::Target::parse(url).map_err(|reason| Error::Invalid {
        field: "redis_url",
        reason,
    })?;
    with_sentinel_auth(s, with_redis_tls(s, target)?)
}

/// `target` trusting `redis_tls_ca` and presenting `redis_tls_cert`/`redis_tls_key`
/// (a TLS URL only; the files read and checked).
fn with_redis_tls(
    s: &Settings,
    mut target: crate::store::redis::Target,
) -> Result<crate::store::redis::Target, Error> {
    let file_error = |e: crate::tls::Error| Error::Invalid {
        field: e.field,
        reason: format!("{}: {}", e.path.display(), e.reason),
    };
    let tls_only = |field| Error::Invalid {
        field,
        reason: "applies to a TLS redis_url only (rediss://, rediss+cluster:// or \
                 rediss+sentinel://)"
            .into(),
    };
    if let Some(path) = &s.redis_tls_ca {
        if !target.is_tls() {
            return Err(tls_only("redis_tls_ca"));
        }
        let pem = crate::tls::load_trusted_ca("redis_tls_ca", path).map_err(file_error)?;
        target = target.with_tls_ca(pem);
    }
    match (&s.redis_tls_cert, &s.redis_tls_key) {
        (None, None) => Ok(target),
        (Some(_), _) if !target.is_tls() => Err(tls_only("redis_tls_cert")),
        (_, Some(_)) if !target.is_tls() => Err(tls_only("redis_tls_key")),
        (Some(cert), Some(key)) => {
            let identity = crate::tls::load_client_identity(cert, key).map_err(file_error)?;
            Ok(target.with_client_cert(identity.cert_pem, identity.key_pem.expose().to_vec()))
        }
        (Some(_), None) => Err(needs("redis_tls_cert", "redis_tls_key")),
        (None, Some(_)) => Err(needs("redis_tls_key", "redis_tls_cert")),
    }
}

/// `target` authenticating to its Sentinels as `redis_sentinel_user` with
/// `redis_sentinel_password` (a Sentinel URL only).
fn with_sentinel_auth(
    s: &Settings,
    target: crate::store::redis::Target,
) -> Result<crate::store::redis::Target, Error> {
    let sentinel_only = |field| Error::Invalid {
        field,
        reason: "applies to a Sentinel redis_url only (redis+sentinel:// or \
                 rediss+sentinel://)"
            .into(),
    };
    match (&s.redis_sentinel_user, &s.redis_sentinel_password) {
        (None, None) => Ok(target),
        (Some(_), _) if !target.is_sentinel() => Err(sentinel_only("redis_sentinel_user")),
        (_, Some(_)) if !target.is_sentinel() => Err(sentinel_only("redis_sentinel_password")),
        (Some(_), None) => Err(needs("redis_sentinel_user", "redis_sentinel_password")),
        (user, Some(password)) => Ok(target.with_sentinel_auth(user.clone(), password.0.clone())),
    }
}

/// `field` was given without `other`, which it needs.
fn needs(field: &'static str, other: &str) -> Error {
    Error::Invalid {
        field,
        reason: format!("needs {other} too"),
    }
}

fn store_options(s: &Settings, instance_id: &str, leases: &Leases) -> Result<StoreOptions, Error> {
    let defaults = StoreOptions::default();
    Ok(StoreOptions {
        partitions: PARTITIONS.get(s.partitions)?,
        run_retention: RUN_RETENTION.get(s.run_retention)?,
        max_runs_per_job: MAX_RUNS_PER_JOB.get(s.max_runs_per_job)?,
        idempotency_ttl: defaults.idempotency_ttl,
        instance_id: instance_id.to_owned(),
        partition_lease: PARTITION_LEASE.get(s.partition_lease)?,
        // A restart gives the leases that lapsed meanwhile one lease to be renewed.
        reopen_lease_grace: leases.ttl,
    })
}

fn scheduler_options(s: &Settings) -> Result<SchedulerOptions, Error> {
    let max_sleep = SCHEDULER_MAX_SLEEP.get(s.scheduler_max_sleep)?;
    Ok(SchedulerOptions {
        batch_size: SCHEDULER_BATCH.get(s.scheduler_batch)?,
        max_sleep,
        // Two of the loop's longest sleeps, so one pass at least a sleep ahead of a
        // fire reads its job.
        read_ahead: max_sleep * 2,
        misfire_threshold: MISFIRE_THRESHOLD.get(s.misfire_threshold)?,
        default_catch_up_limit: MISFIRE_CATCH_UP_LIMIT.get(s.misfire_catch_up_limit)?,
        parallel_partitions: SCHEDULER_PARALLEL_PARTITIONS.get(s.scheduler_parallel_partitions)?,
    })
}

/// How long a run's lease lasts and the windows inside it, each checked against the
/// others.
struct Leases {
    heartbeat_interval: Duration,
    missed_heartbeats: u32,
    ttl: Duration,
    confirm_within: Duration,
    silent_after: Duration,
    disconnect_grace: Duration,
}

fn leases(s: &Settings) -> Result<Leases, Error> {
    let ed = ExecutorOptions::default();
    let heartbeat_interval = HEARTBEAT_INTERVAL.get(s.heartbeat_interval)?;
    let missed_heartbeats = MISSED_HEARTBEATS.get(s.missed_heartbeats)?;
    let ttl = LEASE_TTL.check(s.lease_ttl, heartbeat_interval * missed_heartbeats)?;
    let at_most = |field: &'static str, v: Duration, limit: Duration, what: &str| {
        if v > limit {
            Err(Error::Invalid {
                field,
                reason: format!("{v:?} must be at most {what} ({limit:?})"),
            })
        } else {
            Ok(v)
        }
    };
    if ttl <= heartbeat_interval {
        return Err(Error::Invalid {
            field: "lease_ttl",
            reason: format!(
                "{ttl:?} must be longer than the heartbeat interval ({heartbeat_interval:?})"
            ),
        });
    }
    let confirm_within =
        CONFIRM_WITHIN.check(s.confirm_within, (heartbeat_interval * 2).min(ttl))?;
    let confirm_within = at_most("confirm_within", confirm_within, ttl, "the lease")?;
    let silent_after = SILENT_AFTER.check(s.silent_after, ed.silent_after.min(confirm_within))?;
    let silent_after = at_most(
        "silent_after",
        silent_after,
        confirm_within,
        "confirm_within",
    )?;
    let disconnect_grace =
        DISCONNECT_GRACE.check(s.disconnect_grace, ed.disconnect_grace.min(ttl))?;
    let disconnect_grace = at_most("disconnect_grace", disconnect_grace, ttl, "the lease")?;
    Ok(Leases {
        heartbeat_interval,
        missed_heartbeats,
        ttl,
        confirm_within,
        silent_after,
        disconnect_grace,
    })
}

fn health_policy(s: &Settings) -> Result<HealthPolicy, Error> {
    let rate = |field: &'static str, v: Option<f64>| match given(field, v)? {
        r if (0.0..=1.0).contains(&r) => Ok(r),
        r => Err(Error::Invalid {
            field,
            reason: format!("{r} is not a rate between 0 and 1"),
        }),
    };
    let health = HealthPolicy {
        window: HEALTH_WINDOW.get(s.health_window)?,
        min_results: HEALTH_MIN_RESULTS.get(s.health_min_results)?,
        slow_below: rate("slow_below", s.slow_below)?,
        drop_below: rate("drop_below", s.drop_below)?,
        probe_every: HEALTH_PROBE_EVERY.get(s.health_probe_every)?,
    };
    if health.drop_below > health.slow_below {
        return Err(Error::Invalid {
            field: "drop_below",
            reason: format!(
                "{} is above slow_below ({}): a node must turn slow before it is dropped",
                health.drop_below, health.slow_below
            ),
        });
    }
    Ok(health)
}

fn executor_options(
    s: &Settings,
    instance_id: &str,
    leases: &Leases,
    health: HealthPolicy,
) -> Result<ExecutorOptions, Error> {
    Ok(ExecutorOptions {
        health,
        instance_id: instance_id.to_owned(),
        heartbeat_interval: leases.heartbeat_interval,
        missed_heartbeats: leases.missed_heartbeats,
        hello_timeout: ExecutorOptions::default().hello_timeout,
        lease_ttl: leases.ttl,
        disconnect_grace: leases.disconnect_grace,
        silent_after: leases.silent_after,
        max_log_bytes: MAX_LOG_BYTES.get(s.max_log_bytes)?,
    })
}

fn dispatch_options(
    s: &Settings,
    instance_id: &str,
    leases: &Leases,
    health: HealthPolicy,
) -> Result<DispatchOptions, Error> {
    let dd = DispatchOptions::default();
    Ok(DispatchOptions {
        consumer: instance_id.to_owned(),
        batch_size: dd.batch_size,
        read_block: TRIGGER_READ_BLOCK.get(s.trigger_read_block)?,
        reclaim_idle: TRIGGER_RECLAIM_IDLE.get(s.trigger_reclaim_idle)?,
        reclaim_every: TRIGGER_RECLAIM_EVERY.get(s.trigger_reclaim_every)?,
        instance_ttl: INSTANCE_TTL.get(s.instance_ttl)?,
        queue_retention: TRIGGER_RETENTION.get(s.trigger_retention)?,
        lease: LeaseTerms {
            ttl: leases.ttl,
            confirm_within: leases.confirm_within,
        },
        route_retry: ROUTE_RETRY.get(s.route_retry)?,
        dispatch_wait: DISPATCH_WAIT.get(s.dispatch_wait)?,
        serial_limit: SERIAL_LIMIT.get(s.serial_limit)?,
        node_refresh: dd.node_refresh,
        health,
    })
}

/// With admin authentication off, only loopback listeners, unless the operator said
/// `--insecure-listen-any`.
fn refuse_open_network(
    s: &Settings,
    auth: &AuthOptions,
    listen: SocketAddr,
    http_listen: Option<SocketAddr>,
) -> Result<(), Error> {
    let open =
        auth.bearer_tokens.is_empty() && auth.read_tokens.is_empty() && auth.app_secrets.is_empty();
    if !open || given("insecure_listen_any", s.insecure_listen_any)? {
        return Ok(());
    }
    for (field, addr) in [("listen", Some(listen)), ("http_listen", http_listen)] {
        if let Some(addr) = addr.filter(|a| !a.ip().is_loopback()) {
            return Err(Error::Invalid {
                field,
                reason: format!(
                    "{addr} is not a loopback address and admin authentication is off (no --bearer-token, --read-token or --app-secret): every admin call would be accepted from the network; configure credentials, or pass --insecure-listen-any to serve it anyway"
                ),
            });
        }
    }
    Ok(())
}

/// Both or neither of the certificate and the key; the files are read and checked
/// here, so that a bad one stops the server before it binds.
fn tls_options(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
) -> Result<Option<ServerTls>, Error> {
    let missing = |field: &'static str, other: &str| Error::Invalid {
        field,
        reason: format!("required with {other} (TLS needs both the certificate and its key)"),
    };
    match (cert, key) {
        (None, None) if client_ca.is_some() => Err(Error::Invalid {
            field: "tls_client_ca",
            reason: "needs tls_cert and tls_key (mutual TLS is on top of TLS)".into(),
        }),
        (None, None) => Ok(None),
        (Some(_), None) => Err(missing("tls_key", "tls_cert")),
        (None, Some(_)) => Err(missing("tls_cert", "tls_key")),
        (Some(cert), Some(key)) => ServerTls::load(&cert, &key, client_ca.as_deref())
            .map(Some)
            .map_err(|e| Error::Invalid {
                field: e.field,
                reason: format!("{}: {}", e.path.display(), e.reason),
            }),
    }
}

/// Bearer-style tokens, each `NAME=TOKEN` or a bare `TOKEN`: non-empty visible ASCII.
/// The name is what the audit log calls the caller; it must be an id
/// (`[A-Za-z0-9._-]`) followed by `=` and a token that does not start with `=` (so a
/// base64 token's padding is never taken for a name). A bare token is named by its
/// kind and place: `bearer-1`, `read-2`. Names are unique across both lists.
fn tokens(
    field: &'static str,
    kind: &str,
    given: Option<Vec<Secret>>,
) -> Result<Vec<NamedToken>, Error> {
    let mut out = Vec::new();
    for (i, t) in given.unwrap_or_default().into_iter().enumerate() {
        let invalid = |reason: &str| Error::Invalid {
            field,
            reason: format!("entry {}: {reason}", i + 1),
        };
        let bytes = t.expose();
        if bytes.is_empty() || bytes.iter().any(|b| !b.is_ascii_graphic()) {
            return Err(invalid("must be non-empty visible ASCII"));
        }
        let named = split_pair(&t).filter(|(name, token)| {
            crate::model::valid_job_id(name) && token.first().is_some_and(|b| *b != b'=')
        });
        out.push(match named {
            Some((name, token)) => NamedToken::new(name, token),
            None => NamedToken::new(format!("{kind}-{}", i + 1), bytes),
        });
    }
    Ok(out)
}

/// Validates the credentials. Errors name the flag and the entry's position (or its
/// app id or group), never the secret.
fn auth_options(
    bearer: Option<Vec<Secret>>,
    read: Option<Vec<Secret>>,
    apps: Option<Vec<Secret>>,
    executors: Option<Vec<Secret>>,
    executors_file: Option<PathBuf>,
) -> Result<AuthOptions, Error> {
    let mut opts = AuthOptions {
        bearer_tokens: tokens("bearer_token", "bearer", bearer)?,
        read_tokens: tokens("read_token", "read", read)?,
        ..AuthOptions::default()
    };
    let mut names = std::collections::BTreeSet::new();
    for (field, t) in (opts.bearer_tokens.iter().map(|t| ("bearer_token", t)))
        .chain(opts.read_tokens.iter().map(|t| ("read_token", t)))
    {
        if !names.insert(t.name.as_str()) {
            return Err(Error::Invalid {
                field,
                reason: format!("the name {:?} is given to two tokens", t.name),
            });
        }
    }
    if let Some(i) = opts.read_tokens.iter().position(|r| {
        opts.bearer_tokens
            .iter()
            .any(|b| b.token.matches(r.token.expose()))
    }) {
        return Err(Error::Invalid {
            field: "read_token",
            reason: format!("entry {}: is also a bearer (admin) token", i + 1),
        });
    }
    for (i, entry) in apps.unwrap_or_default().into_iter().enumerate() {
        let invalid = |reason: String| Error::Invalid {
            field: "app_secret",
            reason,
        };
        let (app_id, secret) = split_pair(&entry)
            .ok_or_else(|| invalid(format!("entry {}: expected APP_ID=whsec_<base64>", i + 1)))?;
        if !crate::model::valid_job_id(app_id) {
            return Err(invalid(format!(
                "entry {}: the app id must match [A-Za-z0-9._-]{{1,128}}",
                i + 1
            )));
        }
        let key = crate::auth::decode_app_secret(secret).ok_or_else(|| {
            invalid(format!(
                "app {app_id:?}: the secret must be whsec_ and the base64 of at least 16 bytes"
            ))
        })?;
        opts.app_secrets
            .entry(app_id.to_owned())
            .or_default()
            .push(key);
    }
    for (i, entry) in executors.unwrap_or_default().into_iter().enumerate() {
        let (group, token) =
            parse_executor_token(entry.expose()).map_err(|why| Error::Invalid {
                field: "executor_token",
                reason: format!("entry {}: {why}", i + 1),
            })?;
        opts.executor_tokens.entry(group).or_default().push(token);
    }
    if let Some(path) = executors_file {
        opts.file_executor_tokens =
            read_executor_tokens_file(&path).map_err(|reason| Error::Invalid {
                field: "executor_tokens_file",
                reason,
            })?;
        opts.executor_tokens_file = Some(path);
    }
    Ok(opts)
}

/// `NAME=VALUE` split at the first `=`, with NAME as text.
fn split_pair(entry: &Secret) -> Option<(&str, &[u8])> {
    let bytes = entry.expose();
    let at = bytes.iter().position(|&b| b == b'=')?;
    let name = std::str::from_utf8(&bytes[..at]).ok()?;
    Some((name.trim(), &bytes[at + 1..]))
}

fn webhook_options(s: &Settings, every: Duration) -> Result<WebhookOptions, Error> {
    let wd = WebhookOptions::default();
    let (max_in_flight, max_in_flight_per_destination) = webhook_concurrency(s, &wd)?;
    let secrets = s
        .webhook_secret
        .iter()
        .flatten()
        .map(|t| t.0.trim())
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<WebhookSecret>().map_err(|e| Error::Invalid {
                field: "webhook_secret",
                reason: e.to_string(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let app_id = given("webhook_app_id", s.webhook_app_id.clone())?;
    if app_id.is_empty() || !app_id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::Invalid {
            field: "webhook_app_id",
            reason: "must be visible ASCII without spaces (it is a header value)".into(),
        });
    }
    let timeout = WEBHOOK_TIMEOUT.get(s.webhook_timeout)?;
    let retry_schedule = retry_schedule(&given(
        "webhook_retry_schedule",
        s.webhook_retry_schedule.clone(),
    )?)?;
    let breaker_failures = WEBHOOK_BREAKER_FAILURES.get(s.webhook_breaker_failures)?;
    Ok(WebhookOptions {
        app_id,
        secrets,
        timeout,
        retry_schedule,
        max_age: WEBHOOK_MAX_AGE.get(s.webhook_max_age)?,
        breaker_failures,
        breaker_cooldown: WEBHOOK_BREAKER_COOLDOWN.get(s.webhook_breaker_cooldown)?,
        claim_lease: WEBHOOK_CLAIM_LEASE
            .check(s.webhook_claim_lease, timeout + Duration::from_secs(10))?,
        every,
        batch: wd.batch,
        max_in_flight,
        max_in_flight_per_destination,
    })
}

/// The two webhook concurrency bounds, the per-destination one at most the instance's.
fn webhook_concurrency(s: &Settings, wd: &WebhookOptions) -> Result<(usize, u32), Error> {
    let instance = WEBHOOK_CONCURRENCY.get(s.webhook_concurrency.map(|n| n as usize))?;
    let destination = match s.webhook_destination_concurrency {
        None => (wd.max_in_flight_per_destination as usize).min(instance),
        v => WEBHOOK_DESTINATION_CONCURRENCY.check(v, 0)? as usize,
    };
    if destination > instance {
        return Err(Error::Invalid {
            field: "webhook_destination_concurrency",
            reason: format!(
                "{destination} is more than webhook_concurrency ({instance}): one destination can never have more in flight than the instance"
            ),
        });
    }
    // Both at most 10 000.
    Ok((instance, destination as u32))
}

/// `webhook_retry_schedule`: delays within [`RETRY_DELAY`], at most [`MAX_RETRY_DELAYS`].
fn retry_schedule(text: &str) -> Result<Vec<Duration>, Error> {
    let invalid = |reason| Error::Invalid {
        field: RETRY_DELAY.field,
        reason,
    };
    let delays = crate::deliver::webhooks::parse_retry_schedule(text).map_err(invalid)?;
    if delays.len() > MAX_RETRY_DELAYS {
        return Err(invalid(format!(
            "{} delays is more than {MAX_RETRY_DELAYS}",
            delays.len()
        )));
    }
    for d in &delays {
        RETRY_DELAY.check(Some(HumanDuration(*d)), *d)?;
    }
    Ok(delays)
}

fn alert_webhook(v: Option<&str>) -> Result<Option<url::Url>, Error> {
    let Some(v) = v.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let url = url::Url::parse(v).map_err(|e| Error::Invalid {
        field: "alert_webhook_url",
        reason: format!("{v:?} is not a URL: {e}"),
    })?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(Error::Invalid {
            field: "alert_webhook_url",
            reason: format!("{v:?} must be an http(s) URL with a host"),
        });
    }
    Ok(Some(url))
}

/// Half the cores this process may use, at least one (`worker_threads` unset).
fn default_worker_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

fn default_instance_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| crate::model::valid_job_id(h))
        .unwrap_or_else(|| "sundial".into());
    let rand: u32 = rand::random();
    format!("{host}-{}-{rand:08x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The settings whose absence means "none" (credentials, files, Redis, allow
    /// lists) or a value made at start (the instance id, the threads from the cores):
    /// their help says so in words.
    const WITHOUT_DEFAULT: &[&str] = &[
        "instance_id",
        "worker_threads",
        "redis_url",
        "redis_tls_ca",
        "redis_tls_cert",
        "redis_tls_key",
        "redis_sentinel_user",
        "redis_sentinel_password",
        "http_target_allow",
        "webhook_allow",
        "bearer_token",
        "read_token",
        "app_secret",
        "executor_token",
        "executor_tokens_file",
        "tls_cert",
        "tls_key",
        "tls_client_ca",
        "webhook_secret",
        "alert_webhook_url",
    ];

    /// The value a help text gives as `[default: X]`.
    fn default_in(help: &str) -> Option<String> {
        let start = help.rfind("[default: ")? + "[default: ".len();
        let len = help[start..].find(']')?;
        Some(help[start..start + len].to_owned())
    }

    /// `serve --help` gives every setting's default as `[default: X]`, and X is the
    /// real one: the configuration with `--flag X` is the configuration without it.
    #[test]
    fn help_shows_every_default_and_it_is_the_real_one() {
        use clap::{Args as _, FromArgMatches as _};
        let cmd = Settings::with_defaults_in_help(Settings::augment_args(
            clap::Command::new("serve").no_binary_name(true),
        ));
        let config = |extra: &[&str]| -> String {
            let mut args = vec!["--instance-id", "fixed"];
            args.extend_from_slice(extra);
            let m = cmd.clone().try_get_matches_from(args).expect("parses");
            let s = Settings::from_arg_matches(&m).expect("settings");
            format!("{:?}", Config::from_settings(s).expect("valid"))
        };
        let defaults = config(&[]);
        let mut missing = Vec::new();
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            let help = arg
                .get_long_help()
                .or(arg.get_help())
                .map(|h| h.to_string())
                .unwrap_or_default();
            match default_in(&help) {
                Some(v) => {
                    let flag = format!("--{}", arg.get_long().expect("a long flag"));
                    assert_eq!(config(&[&flag, &v]), defaults, "{flag}: [default: {v}]");
                }
                None if WITHOUT_DEFAULT.contains(&id) => {}
                None => missing.push(id.to_owned()),
            }
        }
        assert!(
            missing.is_empty(),
            "no [default: ...] in the help of {missing:?}"
        );
    }

    /// The components' own `Default`s (what tests and benchmarks build in process) are
    /// the settings table's defaults, so an in-process scheduler or dispatcher runs as
    /// a served one does.
    #[test]
    fn component_defaults_are_the_declared_ones() {
        let cfg = Config::from_settings(Settings {
            instance_id: Some("sundial".into()),
            ..Settings::default()
        })
        .expect("valid");
        let same = |served: String, default: String| assert_eq!(served, default);
        same(
            format!("{:?}", cfg.scheduler),
            format!("{:?}", SchedulerOptions::default()),
        );
        same(
            format!("{:?}", cfg.dispatch),
            format!("{:?}", DispatchOptions::default()),
        );
        same(
            format!("{:?}", cfg.executors),
            format!("{:?}", ExecutorOptions::default()),
        );
        same(
            format!("{:?}", cfg.sweep),
            format!("{:?}", SweepOptions::default()),
        );
        same(
            format!("{:?}", cfg.webhooks),
            format!("{:?}", WebhookOptions::default()),
        );
        // A served store gives lapsed leases one lease to be renewed after a restart.
        let store = StoreOptions {
            reopen_lease_grace: Duration::ZERO,
            ..cfg.store_opts
        };
        assert_eq!(store, StoreOptions::default());
    }

    #[test]
    fn flags_win_over_file_and_defaults_fill_the_rest() {
        let file: Settings = toml::from_str(
            r#"
            listen = "127.0.0.1:1"
            misfire_threshold = "2s"
            partitions = 4
            "#,
        )
        .expect("valid toml");
        let flags = Settings {
            listen: Some("127.0.0.1:2".into()),
            ..Settings::default()
        };
        let cfg = Config::from_settings(flags.over(file)).expect("valid");
        assert_eq!(cfg.listen.port(), 2);
        assert_eq!(cfg.scheduler.misfire_threshold, Duration::from_secs(2));
        assert_eq!(cfg.store_opts.partitions, 4);
        assert_eq!(cfg.scheduler.max_sleep, Duration::from_secs(5));
        assert!(matches!(cfg.store, StoreConfig::Embedded { .. }));
        // The unresponsive window: two heartbeat intervals unless set, never past the
        // lease.
        assert_eq!(cfg.dispatch.lease.confirm_within, Duration::from_secs(10));
        let short_lease = Settings {
            lease_ttl: Some(HumanDuration(Duration::from_secs(6))),
            ..Settings::default()
        };
        let cfg = Config::from_settings(short_lease).expect("valid");
        assert_eq!(cfg.dispatch.lease.confirm_within, Duration::from_secs(6));
        let set = Settings {
            confirm_within: Some(HumanDuration(Duration::from_millis(800))),
            ..Settings::default()
        };
        let cfg = Config::from_settings(set).expect("valid");
        assert_eq!(
            cfg.dispatch.lease.confirm_within,
            Duration::from_millis(800)
        );
        assert_eq!(
            cfg.executors.silent_after,
            Duration::from_millis(800),
            "never past confirm_within"
        );
        // Silence: 1 s unless set; 0 turns it off.
        let cfg = Config::from_settings(Settings::default()).expect("valid");
        assert_eq!(cfg.executors.silent_after, Duration::from_secs(1));
        let file: Settings = toml::from_str(r#"silent_after = "0s""#).expect("valid toml");
        let cfg = Config::from_settings(file).expect("valid");
        assert_eq!(cfg.executors.silent_after, Duration::ZERO);
        // A disconnected executor's leases: 1 s unless set; 0 (at once) is allowed.
        let cfg = Config::from_settings(Settings::default()).expect("valid");
        assert_eq!(cfg.executors.disconnect_grace, Duration::from_secs(1));
        let file: Settings = toml::from_str(r#"disconnect_grace = "0s""#).expect("valid toml");
        let cfg = Config::from_settings(file).expect("valid");
        assert_eq!(cfg.executors.disconnect_grace, Duration::ZERO);
        let shorter_lease = Settings {
            heartbeat_interval: Some(HumanDuration(Duration::from_millis(300))),
            lease_ttl: Some(HumanDuration(Duration::from_millis(900))),
            ..Settings::default()
        };
        let cfg = Config::from_settings(shorter_lease).expect("valid");
        assert_eq!(
            cfg.executors.disconnect_grace,
            Duration::from_millis(900),
            "never past the lease"
        );
        // Webhook concurrency: 512 per instance, 64 per destination unless set; a
        // smaller instance bound caps the destination's default.
        let cfg = Config::from_settings(Settings::default()).expect("valid");
        assert_eq!(cfg.webhooks.max_in_flight, 512);
        assert_eq!(cfg.webhooks.max_in_flight_per_destination, 64);
        let small = Settings {
            webhook_concurrency: Some(16),
            ..Settings::default()
        };
        let cfg = Config::from_settings(small).expect("valid");
        assert_eq!(cfg.webhooks.max_in_flight_per_destination, 16);
    }

    #[test]
    fn a_non_loopback_listener_needs_credentials_or_the_loud_flag() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            settings: Settings,
        }
        use clap::Parser as _;
        let parse = |args: &[&str]| {
            let mut all = vec!["sundial"];
            all.extend_from_slice(args);
            Config::from_settings(Cli::try_parse_from(all).expect("parses").settings)
        };
        for (args, field) in [
            (&["--listen", "0.0.0.0:50051"][..], "listen"),
            (&["--http-listen", "[::]:8080"][..], "http_listen"),
        ] {
            let err = parse(args).expect_err("open on the network").to_string();
            assert!(
                err.starts_with(&format!("{field}: ")) && err.contains("--insecure-listen-any"),
                "{err}"
            );
        }
        parse(&["--listen", "0.0.0.0:50051", "--insecure-listen-any"]).expect("said so");
        parse(&["--listen", "0.0.0.0:50051", "--bearer-token", "tok"]).expect("credentials");
        parse(&["--listen", "[::1]:50051"]).expect("loopback");
        let file: Settings = toml::from_str(
            r#"listen = "0.0.0.0:1"
            insecure_listen_any = true"#,
        )
        .expect("valid toml");
        Config::from_settings(file).expect("said so in the file");
    }

    #[test]
    fn credentials_are_parsed_validated_and_never_shown() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            settings: Settings,
        }
        use clap::Parser as _;
        let key = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
        let cli = Cli::try_parse_from([
            "sundial",
            "--bearer-token",
            "tok-one",
            "--bearer-token",
            "tok-two,tok-three",
            "--app-secret",
            &format!("billing={key}"),
            "--executor-token",
            "payments=exec-secret",
            "--executor-token",
            "*=exec-wild",
        ])
        .expect("parses");
        let shown = format!("{:?}", cli.settings);
        let cfg = Config::from_settings(cli.settings).expect("valid");
        let shown = format!("{shown} {cfg:?}");
        for secret in [
            "tok-one",
            "tok-two",
            "tok-three",
            "MDEy",
            "0123456789",
            "exec-secret",
            "exec-wild",
        ] {
            assert!(!shown.contains(secret), "{secret} shown in {shown}");
        }
        assert_eq!(cfg.auth.bearer_tokens.len(), 3);
        assert_eq!(
            cfg.auth.app_secrets["billing"][0].expose(),
            b"0123456789abcdef0123456789abcdef"
        );
        assert_eq!(cfg.auth.executor_tokens["*"][0].expose(), b"exec-wild");

        let file: Settings = toml::from_str(r#"executor_token = ["g=t"]"#).expect("toml");
        assert_eq!(
            Config::from_settings(file)
                .expect("valid")
                .auth
                .executor_tokens["g"][0]
                .expose(),
            b"t"
        );

        let bad = |s: Settings, field: &str| {
            let e = Config::from_settings(s).expect_err(field).to_string();
            assert!(e.starts_with(field), "{e}");
            assert!(!e.contains("hunter2"), "the secret is not echoed: {e}");
        };
        let secrets = |v: &[&str]| Some(v.iter().map(|x| x.parse().expect("infallible")).collect());
        bad(
            Settings {
                app_secret: secrets(&["billing=hunter2"]),
                ..Default::default()
            },
            "app_secret",
        );
        bad(
            Settings {
                app_secret: secrets(&["hunter2"]),
                ..Default::default()
            },
            "app_secret",
        );
        bad(
            Settings {
                app_secret: secrets(&["bad id=whsec_hunter2"]),
                ..Default::default()
            },
            "app_secret",
        );
        bad(
            Settings {
                executor_token: secrets(&["hunter2"]),
                ..Default::default()
            },
            "executor_token",
        );
        bad(
            Settings {
                executor_token: secrets(&["g="]),
                ..Default::default()
            },
            "executor_token",
        );
        bad(
            Settings {
                executor_token: secrets(&["a b=hunter2"]),
                ..Default::default()
            },
            "executor_token",
        );
        bad(
            Settings {
                executor_tokens_file: Some("/nonexistent/sundial-executor-tokens".into()),
                ..Default::default()
            },
            "executor_tokens_file",
        );
        bad(
            Settings {
                read_token: secrets(&["hunter2 x"]),
                ..Default::default()
            },
            "read_token",
        );
        // A token cannot be both admin and read-only.
        bad(
            Settings {
                bearer_token: secrets(&["same-1"]),
                read_token: secrets(&["other-2", "same-1"]),
                ..Default::default()
            },
            "read_token",
        );
        bad(
            Settings {
                bearer_token: secrets(&["hunter2 x"]),
                ..Default::default()
            },
            "bearer_token",
        );
        // One name for two tokens.
        bad(
            Settings {
                bearer_token: secrets(&["ops=tok-1"]),
                read_token: secrets(&["ops=tok-2"]),
                ..Default::default()
            },
            "read_token",
        );
    }

    #[test]
    fn tokens_are_named_for_the_audit_log() {
        let secrets = |v: &[&str]| Some(v.iter().map(|x| x.parse().expect("infallible")).collect());
        let cfg = Config::from_settings(Settings {
            bearer_token: secrets(&["ops=tok-1", "tok-2", "YWJjZA==", "a b=c"]),
            read_token: secrets(&["dash=look-1", "look-2"]),
            ..Default::default()
        });
        let cfg = cfg.err().map(|e| e.to_string());
        // A space is not visible ASCII: the fourth entry is refused, naming its place.
        assert_eq!(
            cfg.as_deref(),
            Some("bearer_token: entry 4: must be non-empty visible ASCII")
        );
        let cfg = Config::from_settings(Settings {
            bearer_token: secrets(&["ops=tok-1", "tok-2", "YWJjZA=="]),
            read_token: secrets(&["dash=look-1", "look-2"]),
            ..Default::default()
        })
        .expect("config");
        let named = |tokens: &[NamedToken]| -> Vec<(String, Vec<u8>)> {
            tokens
                .iter()
                .map(|t| (t.name.clone(), t.token.expose().to_vec()))
                .collect()
        };
        assert_eq!(
            named(&cfg.auth.bearer_tokens),
            [
                ("ops".to_owned(), b"tok-1".to_vec()),
                ("bearer-2".to_owned(), b"tok-2".to_vec()),
                // Base64 padding is not a name.
                ("bearer-3".to_owned(), b"YWJjZA==".to_vec()),
            ]
        );
        assert_eq!(
            named(&cfg.auth.read_tokens),
            [
                ("dash".to_owned(), b"look-1".to_vec()),
                ("read-2".to_owned(), b"look-2".to_vec()),
            ]
        );
    }

    #[test]
    fn webhook_settings_parse_and_secrets_stay_hidden() {
        let a = WebhookSecret::generate().to_string();
        let b = WebhookSecret::generate().to_string();
        let cfg = Config::from_settings(Settings {
            webhook_secret: Some(vec![SecretText(a.clone()), SecretText(b.clone())]),
            webhook_retry_schedule: Some("50ms,100ms,200ms".into()),
            webhook_timeout: Some(HumanDuration(Duration::from_secs(2))),
            ..Default::default()
        })
        .expect("valid");
        let w = &cfg.webhooks;
        assert_eq!(w.secrets.len(), 2);
        assert_eq!(w.secrets[0].to_string(), a);
        assert_eq!(w.app_id, "sundial");
        assert_eq!(
            w.retry_schedule,
            [50, 100, 200].map(Duration::from_millis).to_vec()
        );
        assert_eq!(w.claim_lease, Duration::from_secs(12));
        assert_eq!(
            (w.max_age, w.breaker_failures, w.breaker_cooldown),
            (Duration::from_secs(86_400), 5, Duration::from_secs(30))
        );
        let shown = format!("{cfg:?}");
        assert!(
            !shown.contains(&a[6..]) && !shown.contains(&b[6..]),
            "{shown}"
        );
        let settings = Settings {
            webhook_secret: Some(vec![SecretText(a.clone())]),
            ..Default::default()
        };
        assert!(!format!("{settings:?}").contains(&a[6..]));
        // From the file, as a list.
        let file: Settings = toml::from_str(&format!(
            "webhook_secret = [\"{a}\"]\nwebhook_app_id = \"billing\""
        ))
        .expect("toml");
        let cfg = Config::from_settings(file).expect("valid");
        assert_eq!(cfg.webhooks.app_id, "billing");
        assert_eq!(cfg.webhooks.secrets.len(), 1);
    }

    #[test]
    fn bad_values_name_the_field() {
        let cases: Vec<(Settings, &str)> = vec![
            (
                Settings {
                    alert_webhook_url: Some("ftp://example.com/x".into()),
                    ..Default::default()
                },
                "alert_webhook_url",
            ),
            (
                Settings {
                    alert_webhook_url: Some("not a url".into()),
                    ..Default::default()
                },
                "alert_webhook_url",
            ),
            (
                Settings {
                    slow_below: Some(1.5),
                    ..Default::default()
                },
                "slow_below",
            ),
            (
                Settings {
                    slow_below: Some(0.4),
                    drop_below: Some(0.6),
                    ..Default::default()
                },
                "drop_below",
            ),
            (
                Settings {
                    listen: Some("nope".into()),
                    ..Default::default()
                },
                "listen",
            ),
            (
                Settings {
                    redis_url: Some("http://x".into()),
                    ..Default::default()
                },
                "redis_url",
            ),
            (
                Settings {
                    partitions: Some(0),
                    ..Default::default()
                },
                "partitions",
            ),
            (
                Settings {
                    scheduler_max_sleep: Some(HumanDuration(Duration::ZERO)),
                    ..Default::default()
                },
                "scheduler_max_sleep",
            ),
            (
                Settings {
                    http_target_allow: Some("127.0.0.1/32,10.0.0.0/99".into()),
                    ..Default::default()
                },
                "http_target_allow",
            ),
            (
                Settings {
                    webhook_allow: Some("localhost".into()),
                    ..Default::default()
                },
                "webhook_allow",
            ),
            (
                Settings {
                    webhook_secret: Some(vec![SecretText("whsec_!!not-base64".into())]),
                    ..Default::default()
                },
                "webhook_secret",
            ),
            (
                Settings {
                    webhook_retry_schedule: Some("1s,soon".into()),
                    ..Default::default()
                },
                "webhook_retry_schedule",
            ),
            (
                Settings {
                    webhook_app_id: Some("my app".into()),
                    ..Default::default()
                },
                "webhook_app_id",
            ),
            (
                Settings {
                    webhook_breaker_failures: Some(0),
                    ..Default::default()
                },
                "webhook_breaker_failures",
            ),
            (
                Settings {
                    webhook_timeout: Some(HumanDuration(Duration::ZERO)),
                    ..Default::default()
                },
                "webhook_timeout",
            ),
            (
                Settings {
                    webhook_concurrency: Some(0),
                    ..Default::default()
                },
                "webhook_concurrency",
            ),
            (
                Settings {
                    webhook_concurrency: Some(10_001),
                    ..Default::default()
                },
                "webhook_concurrency",
            ),
            (
                Settings {
                    webhook_concurrency: Some(8),
                    webhook_destination_concurrency: Some(9),
                    ..Default::default()
                },
                "webhook_destination_concurrency",
            ),
            (
                Settings {
                    confirm_within: Some(HumanDuration(Duration::from_secs(16))),
                    ..Default::default()
                },
                "confirm_within",
            ),
            (
                Settings {
                    confirm_within: Some(HumanDuration(Duration::ZERO)),
                    ..Default::default()
                },
                "confirm_within",
            ),
            (
                Settings {
                    disconnect_grace: Some(HumanDuration(Duration::from_secs(16))),
                    ..Default::default()
                },
                "disconnect_grace",
            ),
            (
                Settings {
                    silent_after: Some(HumanDuration(Duration::from_secs(11))),
                    ..Default::default()
                },
                "silent_after",
            ),
            (
                Settings {
                    instance_ttl: Some(HumanDuration(Duration::ZERO)),
                    ..Default::default()
                },
                "instance_ttl",
            ),
        ];
        for (s, field) in cases {
            let err = Config::from_settings(s).expect_err(field);
            assert!(
                err.to_string().starts_with(field),
                "{err} should name {field}"
            );
        }
        let err = Config::from_settings(Settings {
            http_target_allow: Some("127.0.0.1/32,10.0.0.0/99".into()),
            ..Default::default()
        })
        .expect_err("bad CIDR");
        assert!(
            err.to_string().contains("10.0.0.0/99"),
            "{err} names the entry"
        );
        assert!(
            toml::from_str::<Settings>("lisen = \"x\"").is_err(),
            "unknown keys are refused"
        );
        assert!("5 parsecs".parse::<HumanDuration>().is_err());
        // A bad secret is reported without echoing it.
        let err = Config::from_settings(Settings {
            webhook_secret: Some(vec![SecretText("whsec_c2VjcmV0LXZhbHVl".into())]),
            ..Default::default()
        })
        .expect_err("too short a key");
        assert!(
            !err.to_string().contains("c2VjcmV0LXZhbHVl"),
            "{err} echoes the secret"
        );
        assert_eq!(
            "200ms".parse::<HumanDuration>(),
            Ok(HumanDuration(Duration::from_millis(200)))
        );
    }
}

/// The TLS settings as `Config::from_settings` checks them (the files are read there).
#[cfg(test)]
mod tls_tests {
    use super::{Config, Settings};

    fn err(s: Settings) -> String {
        Config::from_settings(s).expect_err("invalid").to_string()
    }

    #[test]
    fn a_redis_ca_file_needs_a_tls_url_and_holds_certificates() {
        let dir = tempfile::tempdir().expect("tempdir");
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not pem").expect("write");
        for url in [Some("redis://h:1"), Some("redis+sentinel://h:1/m")] {
            let e = err(Settings {
                redis_url: url.map(Into::into),
                redis_tls_ca: Some(junk.clone()),
                ..Default::default()
            });
            assert!(
                e.starts_with("redis_tls_ca: applies to a TLS"),
                "{url:?}: {e}"
            );
        }
        let e = err(Settings {
            redis_tls_ca: Some(junk.clone()),
            ..Default::default()
        });
        assert!(
            e.starts_with("redis_tls_ca: applies to a redis_url only"),
            "{e}"
        );
        let e = err(Settings {
            redis_url: Some("rediss+cluster://h:1".into()),
            redis_tls_ca: Some(junk.clone()),
            ..Default::default()
        });
        assert!(
            e.starts_with("redis_tls_ca:") && e.contains("junk.pem"),
            "{e}"
        );
        assert!(e.contains("no CERTIFICATE"), "{e}");
    }

    /// `--redis-tls-cert` and `--redis-tls-key`: both or neither, a TLS URL only, the
    /// key the certificate's; each refusal names the setting (and the file).
    #[test]
    fn a_redis_client_certificate_needs_its_key_and_a_tls_url() {
        let pki = crate::testing::TestPki::new().expect("CA");
        let dir = tempfile::tempdir().expect("tempdir");
        let cert = dir.path().join("client.pem");
        let key = dir.path().join("client.key");
        std::fs::write(&cert, &pki.client_cert_pem).expect("write");
        std::fs::write(&key, &pki.client_key_pem).expect("write");
        let with = |url: Option<&str>, c: Option<&std::path::Path>, k: Option<&std::path::Path>| {
            Config::from_settings(Settings {
                redis_url: url.map(Into::into),
                redis_tls_cert: c.map(Into::into),
                redis_tls_key: k.map(Into::into),
                ..Default::default()
            })
            .map_err(|e| e.to_string())
        };
        let tls = Some("rediss://h:1");
        let config = with(tls, Some(&cert), Some(&key)).expect("a certificate and its key");
        let crate::config::StoreConfig::Redis { target, .. } = config.store else {
            panic!("not the Redis store")
        };
        assert!(!format!("{target:?}").contains("PRIVATE KEY"), "{target:?}");

        let e = with(tls, Some(&cert), None).expect_err("no key");
        assert!(e.starts_with("redis_tls_cert: needs redis_tls_key"), "{e}");
        let e = with(tls, None, Some(&key)).expect_err("no certificate");
        assert!(e.starts_with("redis_tls_key: needs redis_tls_cert"), "{e}");
        let e = with(Some("redis://h:1"), Some(&cert), Some(&key)).expect_err("plain URL");
        assert!(e.starts_with("redis_tls_cert: applies to a TLS"), "{e}");
        let e = with(None, Some(&cert), Some(&key)).expect_err("embedded store");
        assert!(
            e.starts_with("redis_tls_cert: applies to a redis_url"),
            "{e}"
        );
        let other = pki.path("other.key");
        let e = with(tls, Some(&cert), Some(&other)).expect_err("another key");
        assert!(
            e.starts_with("redis_tls_key:")
                && e.contains("other.key")
                && e.contains("does not fit"),
            "{e}"
        );
        let e = with(tls, Some(&key), Some(&key)).expect_err("a key as the certificate");
        assert!(
            e.starts_with("redis_tls_cert:") && e.contains("no CERTIFICATE"),
            "{e}"
        );
    }

    /// `--redis-sentinel-user` and `--redis-sentinel-password`: a Sentinel URL only,
    /// a user with a password.
    #[test]
    fn sentinel_credentials_need_a_sentinel_url() {
        let with = |url: &str, user: Option<&str>, password: Option<&str>| {
            Config::from_settings(Settings {
                redis_url: Some(url.into()),
                redis_sentinel_user: user.map(Into::into),
                redis_sentinel_password: password.map(|p| super::SecretText(p.into())),
                ..Default::default()
            })
            .map_err(|e| e.to_string())
        };
        let sentinel = "redis+sentinel://:master-pw@h:26379/m";
        with(sentinel, None, Some("s3cret")).expect("a password");
        let config = with(sentinel, Some("watcher"), Some("s3cret")).expect("user and password");
        assert!(!format!("{config:?}").contains("s3cret"), "{config:?}");
        let e = with(sentinel, Some("watcher"), None).expect_err("a user alone");
        assert!(
            e.starts_with("redis_sentinel_user: needs redis_sentinel_password"),
            "{e}"
        );
        let e = with("redis://h:1", None, Some("s3cret")).expect_err("one server");
        assert!(
            e.starts_with("redis_sentinel_password: applies to a Sentinel"),
            "{e}"
        );
        let e = with("redis+cluster://h:1", Some("u"), Some("p")).expect_err("a cluster");
        assert!(
            e.starts_with("redis_sentinel_user: applies to a Sentinel"),
            "{e}"
        );
    }

    #[test]
    fn certificate_and_key_come_together_and_bad_files_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let junk = dir.path().join("junk.pem");
        std::fs::write(
            &junk,
            "-----BEGIN PRIVATE KEY-----\nhunter2!!\n-----END PRIVATE KEY-----\n",
        )
        .expect("write");
        let missing = dir.path().join("missing.pem");
        let e = err(Settings {
            tls_cert: Some(junk.clone()),
            ..Default::default()
        });
        assert!(e.starts_with("tls_key:"), "{e}");
        let e = err(Settings {
            tls_key: Some(junk.clone()),
            ..Default::default()
        });
        assert!(e.starts_with("tls_cert:"), "{e}");
        let e = err(Settings {
            tls_client_ca: Some(junk.clone()),
            ..Default::default()
        });
        assert!(e.starts_with("tls_client_ca:"), "{e}");

        let e = err(Settings {
            tls_cert: Some(missing.clone()),
            tls_key: Some(junk.clone()),
            ..Default::default()
        });
        assert!(e.starts_with("tls_cert:"), "{e}");
        assert!(e.contains("missing.pem"), "names the file: {e}");

        // A "certificate" file holding a broken key: refused without echoing it.
        let e = err(Settings {
            tls_cert: Some(junk.clone()),
            tls_key: Some(junk.clone()),
            ..Default::default()
        });
        assert!(e.starts_with("tls_cert:"), "{e}");
        assert!(e.contains("junk.pem"), "names the file: {e}");
        assert!(!e.contains("hunter2"), "no key material: {e}");
    }
}
