//! Every setting of `sundial serve`, declared once: its doc (the `--help` text), its
//! type, its `SUNDIAL_*` variable and its default. The table below generates
//! [`Settings`] (flags through clap, the TOML file through serde, each field optional
//! as given), [`Settings::over`] (the more specific source wins), [`Settings::defaults`]
//! and the `[default: X]` that `--help` shows ([`Settings::with_defaults_in_help`]).
//!
//! A `default` is applied under the file, the environment and the flags; a `derived`
//! one is only shown: [`Config::from_settings`](super::Config::from_settings) computes it
//! from other settings (the value shown is the one at the other defaults). Ranges are in
//! `bounds.rs`; how settings become each component's options is `from_settings`.

use std::path::PathBuf;

use super::{Error, HumanDuration, SecretText};
use crate::auth::Secret;
use crate::telemetry::LogFormat;

macro_rules! settings {
    (@parse $name:ident $ty:ty) => { None };
    (@parse $name:ident $ty:ty, $default:literal) => {
        Some(<$ty as std::str::FromStr>::from_str($default).map_err(|_| Error::Invalid {
            field: stringify!($name),
            reason: format!("the declared default {:?} does not parse", $default),
        })?)
    };
    ($(
        $(#[doc = $doc:literal])*
        $name:ident: $ty:ty, env $env:literal
        $(, default $default:literal)?
        $(, derived $derived:literal)?
        $(, arg($($extra:tt)*))?;
    )*) => {
        /// Settings as given, each optional: the same fields come from the TOML file and
        /// from flags / `SUNDIAL_*` variables, and the more specific source wins.
        #[derive(Debug, Clone, Default, clap::Args, serde::Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "snake_case")]
        pub struct Settings {
            $(
                $(#[doc = $doc])*
                #[arg(long, env = $env $(, $($extra)*)?)]
                pub $name: Option<$ty>,
            )*
        }

        impl Settings {
            /// `self` where set, else `lower`.
            pub fn over(self, lower: Settings) -> Settings {
                Settings {
                    $($name: self.$name.or(lower.$name),)*
                }
            }

            /// Every setting at its declared default; `None` where there is none (or
            /// it is derived from other settings).
            pub fn defaults() -> Result<Settings, Error> {
                Ok(Settings {
                    $($name: settings!(@parse $name $ty $(, $default)?),)*
                })
            }

            /// Each setting's default as `--help` shows it.
            pub const SHOWN_DEFAULTS: &'static [(&'static str, &'static str)] = &[
                $($((stringify!($name), $default),)? $((stringify!($name), $derived),)?)*
            ];
        }
    };
}

settings! {
    /// gRPC address (JobService, RunService, executors, health, reflection).
    listen: String, env "SUNDIAL_LISTEN", default "127.0.0.1:50051";
    /// HTTP address (REST API, the web console, `/healthz`, `/metrics`).
    http_listen: String, env "SUNDIAL_HTTP_LISTEN", default "127.0.0.1:8080";
    /// Serve the web console at `/` of the HTTP address (`--console false` turns it
    /// off; the REST API it calls stays).
    console: bool, env "SUNDIAL_CONSOLE", default "true",
        arg(num_args = 0..=1, default_missing_value = "true");
    /// Serve on a non-loopback address with admin authentication off (no
    /// --bearer-token, --read-token or --app-secret). Without it such a start is
    /// refused: every admin call would be accepted from the network.
    insecure_listen_any: bool, env "SUNDIAL_INSECURE_LISTEN_ANY", default "false",
        arg(num_args = 0..=1, default_missing_value = "true");
    /// How the log on stderr is written: `text` for people (colours only on a
    /// terminal, and not with NO_COLOR), `json` for log shippers (one object per line,
    /// job_id and schedule_id among its fields).
    log_format: LogFormat, env "SUNDIAL_LOG_FORMAT", default "text", arg(value_enum);
    /// Redis URL: redis://[user:password@]host:port for one server,
    /// redis+cluster://host:port,host:port for a Redis Cluster's seed nodes, or
    /// redis+sentinel://host:port,host:port/master-name for the Sentinels watching a
    /// master (the credentials are the master's); rediss:// (rediss+cluster://,
    /// rediss+sentinel://) for TLS. When absent, the embedded single-node store in
    /// --data-dir is used.
    redis_url: String, env "SUNDIAL_REDIS_URL";
    /// PEM file of the certificate authorities a TLS Redis URL's servers must be signed
    /// by, instead of the system's trusted ones.
    redis_tls_ca: PathBuf, env "SUNDIAL_REDIS_TLS_CA", arg(value_name = "PEM_FILE");
    /// PEM file of the certificate (chain) this instance presents to a TLS Redis URL's
    /// servers that ask for one (mutual TLS: `tls-auth-clients yes`); with
    /// --redis-tls-key.
    redis_tls_cert: PathBuf, env "SUNDIAL_REDIS_TLS_CERT", arg(value_name = "PEM_FILE");
    /// PEM file of the private key of --redis-tls-cert.
    redis_tls_key: PathBuf, env "SUNDIAL_REDIS_TLS_KEY", arg(value_name = "PEM_FILE");
    /// ACL user the Sentinels of a redis+sentinel:// URL ask for (with
    /// --redis-sentinel-password; the URL's credentials are the master's).
    redis_sentinel_user: String, env "SUNDIAL_REDIS_SENTINEL_USER";
    /// Password the Sentinels of a redis+sentinel:// URL ask for (their requirepass),
    /// when they ask for one.
    redis_sentinel_password: SecretText, env "SUNDIAL_REDIS_SENTINEL_PASSWORD";
    /// Prefix of every Redis key (several deployments can share one Redis).
    redis_prefix: String, env "SUNDIAL_REDIS_PREFIX", default "sundial";
    /// Directory of the embedded store.
    data_dir: PathBuf, env "SUNDIAL_DATA_DIR", default "sundial-data";
    /// This instance's name (made at start when not given: host-pid-random).
    instance_id: String, env "SUNDIAL_INSTANCE_ID";
    /// Partitions of a new store (an existing store keeps its own number).
    partitions: u32, env "SUNDIAL_PARTITIONS", default "16";
    /// Longest scheduler sleep between asking the store what is due (it is woken sooner by a
    /// due fire or a job change). While it sleeps it reads the jobs of the fires due within
    /// twice this, so their claims read none when due.
    scheduler_max_sleep: HumanDuration, env "SUNDIAL_SCHEDULER_MAX_SLEEP", default "5s";
    /// Fires claimed per store call.
    scheduler_batch: usize, env "SUNDIAL_SCHEDULER_BATCH", default "500";
    /// How long an instance keeps a partition to itself while claiming (0 = never).
    partition_lease: HumanDuration, env "SUNDIAL_PARTITION_LEASE", default "300ms";
    /// Partitions the scheduler claims concurrently.
    scheduler_parallel_partitions: usize, env "SUNDIAL_SCHEDULER_PARALLEL_PARTITIONS",
        default "4";
    /// A fire claimed later than this is a misfire.
    misfire_threshold: HumanDuration, env "SUNDIAL_MISFIRE_THRESHOLD", default "5s";
    /// Default catch-up limit for the CATCH_UP misfire policy.
    misfire_catch_up_limit: u32, env "SUNDIAL_MISFIRE_CATCH_UP_LIMIT", default "10";
    /// How long a dispatcher read waits for triggers.
    trigger_read_block: HumanDuration, env "SUNDIAL_TRIGGER_READ_BLOCK", default "500ms";
    /// Triggers unacknowledged this long (their instance died) are taken over.
    trigger_reclaim_idle: HumanDuration, env "SUNDIAL_TRIGGER_RECLAIM_IDLE", default "30s";
    /// How often to look for such triggers.
    trigger_reclaim_every: HumanDuration, env "SUNDIAL_TRIGGER_RECLAIM_EVERY", default "5s";
    /// Each instance beats in the store every third of this; one whose beat is this
    /// old is taken for dead and the triggers it read but never acknowledged are taken
    /// over at once (not after trigger_reclaim_idle).
    instance_ttl: HumanDuration, env "SUNDIAL_INSTANCE_TTL", default "3s";
    /// Acknowledged triggers are trimmed from the queue after this age.
    trigger_retention: HumanDuration, env "SUNDIAL_TRIGGER_RETENTION", default "1h";
    /// How long run records are kept.
    run_retention: HumanDuration, env "SUNDIAL_RUN_RETENTION", default "7d";
    /// At most this many runs are kept per job.
    max_runs_per_job: usize, env "SUNDIAL_MAX_RUNS_PER_JOB", default "10000";
    /// How often executors heartbeat.
    heartbeat_interval: HumanDuration, env "SUNDIAL_HEARTBEAT_INTERVAL", default "5s";
    /// An executor silent for this many heartbeat intervals is dropped.
    missed_heartbeats: u32, env "SUNDIAL_MISSED_HEARTBEATS", default "3";
    /// Lease of a dispatched run: missed_heartbeats × heartbeat_interval unless set.
    lease_ttl: HumanDuration, env "SUNDIAL_LEASE_TTL", derived "15s";
    /// The unresponsive window: a dispatch that neither its `Started` nor a heartbeat
    /// listing it confirms within this is taken back and routed again (same attempt).
    /// A live executor lists what it holds in every heartbeat, so only a node that
    /// sends nothing (frozen, cut off) or lost the dispatch hits it. Two heartbeat
    /// intervals unless set; at most the lease.
    confirm_within: HumanDuration, env "SUNDIAL_CONFIRM_WITHIN", derived "10s";
    /// An executor that leaves a dispatch unanswered and sends nothing at all for this
    /// long (frozen, cut off) is silent: the server takes its unanswered dispatches
    /// back and routes them elsewhere (same attempt), and gives it no new work until
    /// it is heard from again (ListNodes: UNRESPONSIVE). Runs it started keep their
    /// leases. A live executor answers a dispatch at once. At most
    /// confirm_within (the default too, if it is shorter); 0 = off.
    silent_after: HumanDuration, env "SUNDIAL_SILENT_AFTER", derived "1s";
    /// When an executor's stream ends from its side (the process died, or it closed
    /// the stream) while it holds runs, their leases end this much later unless it
    /// reconnects and lists them in its hello first: a dead executor's runs fail over
    /// in about this long instead of a lease TTL. At most the lease (the default too,
    /// if it is shorter); 0 = at once. A server shutting down keeps its executors' full
    /// leases.
    disconnect_grace: HumanDuration, env "SUNDIAL_DISCONNECT_GRACE", derived "1s";
    /// How long a run may wait for an eligible executor to connect before it fails
    /// ("no_executor"); a run waiting for a connected executor's free capacity is
    /// never failed for it. A server that has just started gives its executors this
    /// long to reconnect before it fails any run for want of one.
    dispatch_wait: HumanDuration, env "SUNDIAL_DISPATCH_WAIT", default "30s";
    /// How soon the timer of a run that found every executor busy routes it again. A
    /// run waiting in the room queue is routed as soon as a slot frees; on the embedded
    /// store its timer wakes it only every ten of these (the net if the process dies).
    route_retry: HumanDuration, env "SUNDIAL_ROUTE_RETRY", default "500ms";
    /// How often run deadlines (timeouts, retries, lease expiry) are swept.
    sweep_every: HumanDuration, env "SUNDIAL_SWEEP_EVERY", default "200ms";
    /// Longest queue of waiting runs per job under the serial overlap policy.
    serial_limit: u32, env "SUNDIAL_SERIAL_LIMIT", default "100";
    /// Executor log text kept per run, in bytes (the oldest lines fall out first).
    max_log_bytes: usize, env "SUNDIAL_MAX_LOG_BYTES", default "1048576";
    /// HTTP-target runs one instance calls at once.
    http_max_concurrency: u32, env "SUNDIAL_HTTP_MAX_CONCURRENCY", default "64";
    /// Threads that run the server's work (gRPC, REST, scheduling, dispatch,
    /// webhooks): half the machine's cores, at least one, unless set. The server's
    /// CPU per run is well under its store's (one Redis, or the embedded store's
    /// commit thread), so more threads add hand-offs between them, not throughput:
    /// on 2 cores shared with Redis and ten executors, one thread spent less of the
    /// server's CPU per run than two (BENCHMARKS.md).
    worker_threads: usize, env "SUNDIAL_WORKER_THREADS";
    /// How long graceful shutdown waits for in-flight work.
    shutdown_grace: HumanDuration, env "SUNDIAL_SHUTDOWN_GRACE", default "10s";
    /// A node's results older than this no longer count toward its health.
    health_window: HumanDuration, env "SUNDIAL_HEALTH_WINDOW", default "1h";
    /// Results a node needs in the window before it is judged; a handler's
    /// errors are judged against its peers only when they have this many results of it.
    health_min_results: u32, env "SUNDIAL_HEALTH_MIN_RESULTS", default "5";
    /// Share of a node's recent results that are not its own failures (its lost leases,
    /// and the errors beyond what its peers have on the same handlers) under which it is
    /// SLOW: work goes to other nodes first.
    slow_below: f64, env "SUNDIAL_SLOW_BELOW", default "0.9";
    /// The same share under which a node is FAILING: it gets no work but a
    /// probe run every --health-probe-every.
    drop_below: f64, env "SUNDIAL_DROP_BELOW", default "0.5";
    /// A FAILING node gets one run this often from each instance (a probe); three
    /// successes in a row and its failures are forgiven.
    health_probe_every: HumanDuration, env "SUNDIAL_HEALTH_PROBE_EVERY", default "5s";
    /// Addresses HTTP targets may reach beyond public and private ones, comma-separated
    /// CIDRs or addresses (e.g. `127.0.0.1/32,fd00:ec2::254`). Loopback, link-local and
    /// metadata addresses are reached only when listed here.
    http_target_allow: String, env "SUNDIAL_HTTP_TARGET_ALLOW";
    /// Addresses webhooks may reach beyond public ones, comma-separated CIDRs or
    /// addresses (e.g. `10.0.0.0/8`).
    webhook_allow: String, env "SUNDIAL_WEBHOOK_ALLOW";
    /// A token admin and status callers may present as `Authorization: Bearer <token>`,
    /// as `NAME=TOKEN` to name its caller in the audit log (unnamed: `bearer-1`, ...;
    /// repeatable; the variable takes a comma-separated list). With no bearer token
    /// and no app secret, admin authentication is OFF (dev mode).
    bearer_token: Vec<Secret>, env "SUNDIAL_BEARER_TOKENS",
        arg(value_name = "[NAME=]TOKEN", value_delimiter = ',', hide_env_values = true);
    /// A read-only token, presented like a bearer token and named like one (`NAME=TOKEN`;
    /// repeatable; the variable takes a comma-separated list): it may read jobs, runs, logs, nodes and apps, over gRPC
    /// and REST, and nothing else (PERMISSION_DENIED, 403). For dashboards.
    read_token: Vec<Secret>, env "SUNDIAL_READ_TOKENS",
        arg(value_name = "[NAME=]TOKEN", value_delimiter = ',', hide_env_values = true);
    /// An app that may sign requests, as `APP_ID=whsec_<base64 key>` (repeatable; two
    /// for one app while its secret rotates; the variable takes a comma-separated list).
    app_secret: Vec<Secret>, env "SUNDIAL_APP_SECRETS",
        arg(value_name = "APP_ID=SECRET", value_delimiter = ',', hide_env_values = true);
    /// The token executors of a group present in their hello, as `GROUP=TOKEN`, or
    /// `*=TOKEN` for groups without their own (repeatable; the variable takes a
    /// comma-separated list). With none, any executor may connect (dev mode).
    executor_token: Vec<Secret>, env "SUNDIAL_EXECUTOR_TOKENS",
        arg(value_name = "GROUP=TOKEN", value_delimiter = ',', hide_env_values = true);
    /// A file of executor tokens, one `GROUP=TOKEN` a line (`#` comments allowed), in
    /// force beside --executor-token and read again on SIGHUP: rotate a group's token
    /// by adding the new one, moving the executors, then removing the old one. With a
    /// file, executor tokens are always required, even while it is empty.
    executor_tokens_file: PathBuf, env "SUNDIAL_EXECUTOR_TOKENS_FILE", arg(value_name = "FILE");
    /// PEM certificate chain (leaf first): with --tls-key, gRPC and HTTP serve TLS only.
    tls_cert: PathBuf, env "SUNDIAL_TLS_CERT", arg(value_name = "PEM_FILE");
    /// PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1).
    tls_key: PathBuf, env "SUNDIAL_TLS_KEY", arg(value_name = "PEM_FILE");
    /// PEM CA certificates: gRPC callers must then present a client certificate they
    /// signed (mutual TLS; the HTTP listener does not ask for one).
    tls_client_ca: PathBuf, env "SUNDIAL_TLS_CLIENT_CA", arg(value_name = "PEM_FILE");
    /// Webhook signing secret, `whsec_<base64>`. Give it twice (or comma-separated)
    /// while rotating: every delivery is signed with each. Never logged.
    webhook_secret: Vec<SecretText>, env "SUNDIAL_WEBHOOK_SECRET",
        arg(value_delimiter = ',', hide_env_values = true);
    /// The `X-Sundial-App-Id` of webhooks.
    webhook_app_id: String, env "SUNDIAL_WEBHOOK_APP_ID", default "sundial";
    /// One webhook attempt's time limit.
    webhook_timeout: HumanDuration, env "SUNDIAL_WEBHOOK_TIMEOUT", default "15s";
    /// Delays before each webhook retry, comma-separated, ±20% jitter.
    webhook_retry_schedule: String, env "SUNDIAL_WEBHOOK_RETRY_SCHEDULE",
        default "1s,5s,30s,2m,10m";
    /// A webhook not delivered this long after its run ended is given up.
    webhook_max_age: HumanDuration, env "SUNDIAL_WEBHOOK_MAX_AGE", default "24h";
    /// Consecutive failed attempts that open a destination's circuit breaker.
    webhook_breaker_failures: u32, env "SUNDIAL_WEBHOOK_BREAKER_FAILURES", default "5";
    /// How long an open circuit breaker holds deliveries before a probe.
    webhook_breaker_cooldown: HumanDuration, env "SUNDIAL_WEBHOOK_BREAKER_COOLDOWN",
        default "30s";
    /// How long a delivery worker owns a claimed webhook before another may take it:
    /// the webhook timeout + 10s unless set.
    webhook_claim_lease: HumanDuration, env "SUNDIAL_WEBHOOK_CLAIM_LEASE", derived "25s";
    /// Webhook deliveries one instance has in flight at once (at most 10000).
    webhook_concurrency: u32, env "SUNDIAL_WEBHOOK_CONCURRENCY", default "512";
    /// Webhook deliveries in flight to one destination (`scheme://host:port`) at once,
    /// counted across every instance (at most the webhook concurrency); a
    /// delivery past it waits for a slot while its claim lease allows, else it is
    /// deferred a second, no attempt spent. After a destination's circuit breaker
    /// closes, its window starts at one and grows by one with each answered attempt.
    webhook_destination_concurrency: u32, env "SUNDIAL_WEBHOOK_DESTINATION_CONCURRENCY",
        derived "64";
    /// Every alert (failed, lost runs, misfires, late fires, failed callbacks) is also
    /// POSTed here, signed like webhooks (best effort; the log line is the record).
    alert_webhook_url: String, env "SUNDIAL_ALERT_WEBHOOK_URL";
}

impl Settings {
    /// `cmd` (the `serve` command, its flags from [`Settings`]) with each setting's
    /// default at the end of its help: `[default: 5s]`.
    pub fn with_defaults_in_help(mut cmd: clap::Command) -> clap::Command {
        for (name, default) in Self::SHOWN_DEFAULTS {
            cmd = cmd.mut_arg(*name, |arg| {
                let shown = |text: Option<&clap::builder::StyledStr>| {
                    let text = text.map(ToString::to_string).unwrap_or_default();
                    format!("{} [default: {default}]", text.trim_end())
                };
                let help = shown(arg.get_help());
                match arg.get_long_help() {
                    Some(long) => {
                        let long = shown(Some(long));
                        arg.help(help).long_help(long)
                    }
                    None => arg.help(help),
                }
            });
        }
        cmd
    }
}
