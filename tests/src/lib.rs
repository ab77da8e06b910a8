//! The test harness: real processes on free ports, torn down on drop.
//!
//! - [`RedisServer`]: a throwaway `redis-server` (no persistence) on a free port.
//! - [`Sundial`]: a `sundial serve` process, its ports read from its `SUNDIAL_READY`
//!   line, stopped with SIGTERM ([`Sundial::stop`]) or SIGKILL ([`Sundial::kill`]).
//! - gRPC clients over real sockets, and helpers that wait on conditions with a
//!   deadline instead of sleeping a fixed time.

pub mod cli;
pub mod failover;
pub mod foreign;
pub mod hooks;
pub mod raw;
pub mod rest;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use sundial_proto::v1 as pb;
use tonic::transport::Channel;

pub use pb::job_service_client::JobServiceClient;
pub use pb::run_service_client::RunServiceClient;

pub use sundial_server::store::redis::raw_connection as redis_connection;
pub use sundial_server::testing::{
    RedisCluster, RedisSentinel, RedisServer, free_port, key_slot, shared_redis_cluster_url,
    unique_prefix,
};

/// The value of the sample `name_and_labels` (e.g. `x_total{state="FAILED"}`) in a
/// Prometheus text exposition, if it has it.
pub fn metric_sample(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Polls `check` until it returns `Some`, or fails after `timeout` with `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) if Instant::now() >= deadline => {
                return Err(e.context(format!("waiting for {what}")));
            }
            Err(_) => {}
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `sundial` binary, built once per test process so it is never stale.
pub fn sundial_bin() -> Result<PathBuf> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(p) = std::env::var("SUNDIAL_BIN") {
            return Ok(PathBuf::from(p));
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args([
                "build",
                "--quiet",
                "-p",
                "sundial-server",
                "--bin",
                "sundial",
            ])
            .current_dir(workspace_root())
            .status()
            .map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("cargo build of sundial failed: {status}"));
        }
        let target = std::env::var("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| workspace_root().join("target"));
        Ok(target.join("debug").join("sundial"))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// How to start one `sundial serve` process.
#[derive(Clone, Debug, Default)]
pub struct SundialOptions {
    /// Redis URL; None = embedded store in `data_dir`.
    pub redis_url: Option<String>,
    pub redis_prefix: Option<String>,
    pub data_dir: Option<PathBuf>,
    /// `SUNDIAL_FAULT` for this process.
    pub fault: Option<String>,
    /// Extra `--flag value` pairs.
    pub args: Vec<(String, String)>,
    /// Extra environment variables (e.g. `SUNDIAL_*` settings kept out of argv).
    pub env: Vec<(String, String)>,
    /// Fixed gRPC port (for restarts on the same address); None = a free one.
    pub port: Option<u16>,
    /// The CA (PEM) the server's certificate chains to, when it serves TLS: the
    /// harness then dials `https://` trusting it.
    pub tls_ca: Option<Vec<u8>>,
    /// The `sundial` binary to run; None = [`sundial_bin`] (e.g. the benchmark's
    /// release build).
    pub bin: Option<PathBuf>,
}

impl SundialOptions {
    pub fn redis(redis: &RedisServer) -> Self {
        Self {
            redis_url: Some(redis.url()),
            ..Self::default()
        }
        .fast()
    }

    /// A Redis (or cluster) by URL, under a key prefix of its own, as tests sharing
    /// one cluster need.
    pub fn redis_url(url: &str, prefix: &str) -> Self {
        Self {
            redis_url: Some(url.to_owned()),
            redis_prefix: Some(prefix.to_owned()),
            ..Self::default()
        }
        .fast()
    }

    pub fn embedded(dir: &Path) -> Self {
        Self {
            data_dir: Some(dir.to_path_buf()),
            ..Self::default()
        }
        .fast()
    }

    /// Short intervals so fault tests finish quickly; the code paths are the same.
    pub fn fast(self) -> Self {
        self.arg("trigger-reclaim-idle", "1s")
            .arg("trigger-reclaim-every", "300ms")
            .arg("trigger-read-block", "200ms")
            .arg("shutdown-grace", "5s")
            .arg("dispatch-wait", "2s")
    }

    pub fn arg(mut self, flag: &str, value: &str) -> Self {
        self.args.retain(|(f, _)| f != flag);
        self.args.push((flag.to_owned(), value.to_owned()));
        self
    }

    /// Adds `--flag value` even if `flag` is already given (for repeatable flags).
    pub fn repeated_arg(mut self, flag: &str, value: &str) -> Self {
        self.args.push((flag.to_owned(), value.to_owned()));
        self
    }

    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.retain(|(n, _)| n != name);
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn fault(mut self, point: &str) -> Self {
        self.fault = Some(point.to_owned());
        self
    }

    /// The server serves TLS (give it `tls-cert` and `tls-key` with [`arg`](Self::arg))
    /// with a certificate `ca_pem` signed: clients dial `https://` and trust it.
    pub fn tls(mut self, ca_pem: &[u8]) -> Self {
        self.tls_ca = Some(ca_pem.to_vec());
        self
    }
}

/// A running `sundial serve` process. Killed (SIGKILL) on drop if still running.
pub struct Sundial {
    child: Child,
    pub grpc: SocketAddr,
    pub http: Option<SocketAddr>,
    pub opts: SundialOptions,
    stderr_log: PathBuf,
    stdout_log: PathBuf,
    _log_dir: tempfile::TempDir,
}

impl Sundial {
    pub fn start(opts: SundialOptions) -> Result<Self> {
        let log_dir = tempfile::tempdir()?;
        let stderr_log = log_dir.path().join("stderr.log");
        let stdout_log = log_dir.path().join("stdout.log");
        let bin = match &opts.bin {
            Some(b) => b.clone(),
            None => sundial_bin()?,
        };
        let mut cmd = Command::new(bin);
        // Port 0 unless the test needs a known one (to restart on it): the server binds
        // a free port itself and names it on its READY line. A port picked here and
        // bound later can be taken in between by any other process (seen: "cannot bind
        // 127.0.0.1:33191: Address already in use" under the full suite).
        let port = opts.port.unwrap_or(0);
        cmd.arg("serve")
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--http-listen")
            .arg("127.0.0.1:0");
        if let Some(url) = &opts.redis_url {
            cmd.arg("--redis-url").arg(url);
        }
        if let Some(prefix) = &opts.redis_prefix {
            cmd.arg("--redis-prefix").arg(prefix);
        }
        if let Some(dir) = &opts.data_dir {
            cmd.arg("--data-dir").arg(dir);
        }
        for (flag, value) in &opts.args {
            cmd.arg(format!("--{flag}")).arg(value);
        }
        cmd.env_remove("SUNDIAL_FAULT");
        if let Some(f) = &opts.fault {
            cmd.env("SUNDIAL_FAULT", f);
        }
        cmd.env(
            "RUST_LOG",
            std::env::var("SUNDIAL_TEST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .env("NO_COLOR", "1");
        // Last, so a test may override RUST_LOG too.
        for (name, value) in &opts.env {
            cmd.env(name, value);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_log)?);
        let mut child = cmd.spawn().context("spawning sundial")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        let mut stdout_copy = std::fs::File::create(&stdout_log)?;
        std::thread::spawn(move || {
            use std::io::Write as _;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = writeln!(stdout_copy, "{line}");
                if line.starts_with("SUNDIAL_READY") {
                    let _ = tx.send(line);
                }
            }
        });
        let line = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                let log = std::fs::read_to_string(&stderr_log).unwrap_or_default();
                bail!("sundial did not become ready; stderr:\n{log}");
            }
        };
        let mut grpc = None;
        let mut http = None;
        for part in line.split_whitespace() {
            if let Some(a) = part.strip_prefix("grpc=") {
                grpc = a.parse().ok();
            }
            if let Some(a) = part.strip_prefix("http=") {
                http = a.parse().ok();
            }
        }
        Ok(Sundial {
            child,
            grpc: grpc.context("READY line without grpc=")?,
            http,
            opts,
            stderr_log,
            stdout_log,
            _log_dir: log_dir,
        })
    }

    /// `https` when the server serves TLS ([`SundialOptions::tls`]), else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.opts.tls_ca.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// The gRPC endpoint URL, as executors dial it.
    pub fn grpc_url(&self) -> String {
        format!("{}://{}", self.scheme(), self.grpc)
    }

    /// The REST base URL, if HTTP is on.
    pub fn http_url(&self) -> Option<String> {
        self.http.map(|a| format!("{}://{a}", self.scheme()))
    }

    pub async fn channel(&self) -> Result<Channel> {
        let mut endpoint =
            Channel::from_shared(self.grpc_url())?.connect_timeout(Duration::from_secs(5));
        if let Some(ca) = &self.opts.tls_ca {
            endpoint = endpoint.tls_config(
                tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(ca)),
            )?;
        }
        Ok(endpoint.connect().await?)
    }

    pub async fn jobs(&self) -> Result<JobServiceClient<Channel>> {
        Ok(JobServiceClient::new(self.channel().await?))
    }

    pub async fn runs(&self) -> Result<RunServiceClient<Channel>> {
        Ok(RunServiceClient::new(self.channel().await?))
    }

    /// Triggers `job_id` now (no idempotency key): the new run's schedule_id.
    pub async fn trigger(&self, job_id: &str) -> Result<String> {
        Ok(self
            .jobs()
            .await?
            .trigger_job(pb::TriggerJobRequest {
                job_id: job_id.into(),
                ..Default::default()
            })
            .await?
            .into_inner()
            .schedule_id)
    }

    /// The run of `schedule_id`.
    pub async fn run(&self, schedule_id: &str) -> Result<pb::Run> {
        self.runs()
            .await?
            .get_run(pb::GetRunRequest {
                schedule_id: schedule_id.into(),
            })
            .await?
            .into_inner()
            .run
            .context("GetRun answered without a run")
    }

    /// Creates the job `spec` describes.
    pub async fn create_job(&self, spec: pb::JobSpec) -> Result<()> {
        self.jobs()
            .await?
            .create_job(pb::CreateJobRequest { spec: Some(spec) })
            .await?;
        Ok(())
    }

    /// Waits (up to 20 s) until the run of `schedule_id` is final and returns it.
    pub async fn finished(&self, schedule_id: &str) -> Result<pb::Run> {
        use pb::RunState as S;
        let is_final = |state: i32| {
            [
                S::Succeeded,
                S::Failed,
                S::TimedOut,
                S::Cancelled,
                S::Skipped,
            ]
            .iter()
            .any(|s| *s as i32 == state)
        };
        wait_for(
            &format!("{schedule_id} to finish"),
            Duration::from_secs(20),
            || async { Ok(Some(self.run(schedule_id).await?).filter(|r| is_final(r.state))) },
        )
        .await
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, no goodbye.
    pub fn kill(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// SIGTERM and wait for a graceful exit; returns the exit status.
    pub fn stop(&mut self) -> Result<std::process::ExitStatus> {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                self.child.kill()?;
                bail!("sundial did not stop within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the process has exited by itself (e.g. at a crash point).
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                bail!("sundial still running after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }

    /// Everything the process printed on stdout so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout_log).unwrap_or_default()
    }
}

impl Drop for Sundial {
    fn drop(&mut self) {
        if self.is_running() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A cron line that does not fire for decades: jobs with it run only when triggered.
pub const MANUAL_ONLY: &str = "0 0 0 1 1 ? 2099";

/// A job spec firing every second on an executor target (no executors are needed for
/// the scheduler tests: with none connected, runs fail with "no_executor").
pub fn every_second(id: &str) -> pb::JobSpec {
    pb::JobSpec {
        id: id.to_owned(),
        cron: "* * * * * *".to_owned(),
        target: Some(pb::job_spec::Target::Executor(pb::ExecutorTarget {
            group: "default".into(),
            handler: "noop".into(),
        })),
        ..Default::default()
    }
}

/// A job that runs only when triggered, on `handler` of group `g` (the group the test
/// executors join).
pub fn manual_job(id: &str, handler: &str) -> pb::JobSpec {
    pb::JobSpec {
        id: id.to_owned(),
        cron: MANUAL_ONLY.to_owned(),
        target: Some(pb::job_spec::Target::Executor(pb::ExecutorTarget {
            group: "g".into(),
            handler: handler.into(),
        })),
        ..Default::default()
    }
}

/// A job that runs only when triggered, through the server's HTTP executor: a POST to
/// `url`.
pub fn manual_http_job(id: &str, url: &str) -> pb::JobSpec {
    pb::JobSpec {
        id: id.to_owned(),
        cron: MANUAL_ONLY.to_owned(),
        target: Some(pb::job_spec::Target::Http(pb::HttpTarget {
            url: url.to_owned(),
            method: "POST".into(),
        })),
        ..Default::default()
    }
}

/// Whether a run has its final state (not TRIGGERED, WAITING, DISPATCHED or RUNNING).
pub fn is_final(run: &pb::Run) -> bool {
    !matches!(
        pb::RunState::try_from(run.state),
        Ok(pb::RunState::Triggered
            | pb::RunState::Dispatched
            | pb::RunState::Running
            | pb::RunState::Waiting)
    )
}

/// Unix ms now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Registers `specs` with `ApplyJobs`, 1,000 per call, `parallel` calls at once;
/// fails unless every one was created. Returns how long it took.
pub async fn register(
    jobs: &JobServiceClient<Channel>,
    specs: Vec<pb::JobSpec>,
    parallel: usize,
) -> Result<Duration> {
    use futures::StreamExt as _;
    let started = std::time::Instant::now();
    let chunks: Vec<Vec<pb::JobSpec>> = specs.chunks(1000).map(<[_]>::to_vec).collect();
    let mut calls = futures::stream::iter(chunks.into_iter().map(|specs| {
        let mut jobs = jobs.clone();
        async move {
            jobs.apply_jobs(pb::ApplyJobsRequest {
                specs,
                dry_run: false,
            })
            .await
        }
    }))
    .buffer_unordered(parallel.max(1));
    while let Some(r) = calls.next().await {
        let r = r.context("ApplyJobs")?.into_inner();
        if let Some(bad) = r
            .results
            .iter()
            .find(|x| x.outcome() != pb::ApplyOutcome::Created)
        {
            bail!(
                "ApplyJobs did not create {}: {:?} {}",
                bad.job_id,
                bad.outcome(),
                bad.error
            );
        }
    }
    Ok(started.elapsed())
}

/// Every job (all pages).
pub async fn all_jobs(jobs: &mut JobServiceClient<Channel>) -> Result<Vec<pb::Job>> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = jobs
            .list_jobs(pb::ListJobsRequest {
                page_size: 1000,
                page_token: token.clone(),
                ..Default::default()
            })
            .await?
            .into_inner();
        out.extend(page.jobs);
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        token = page.next_page_token;
    }
}

/// Every run of a job (all pages), as schedule_nos.
pub async fn all_runs(runs: &mut RunServiceClient<Channel>, job_id: &str) -> Result<Vec<pb::Run>> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = runs
            .list_runs(pb::ListRunsRequest {
                job_id: job_id.to_owned(),
                page_size: 1000,
                page_token: token.clone(),
                ..Default::default()
            })
            .await?
            .into_inner();
        out.extend(page.runs);
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        token = page.next_page_token;
    }
}

/// One trigger entry as it sits in the Redis streams: the queue, not the runs, is the
/// witness of how often a fire was claimed.
#[derive(Debug, Clone)]
pub struct QueuedTrigger {
    pub entry_ms: i64,
    pub schedule_id: String,
    pub job_id: String,
    pub scheduled_at: i64,
    /// Claim time by the store's clock (the entry's `at` field).
    pub triggered_at: i64,
    pub kind: String,
}

/// Reads every trigger ever appended (not yet trimmed) under `prefix`.
pub async fn queued_triggers(redis: &RedisServer, prefix: &str) -> Result<Vec<QueuedTrigger>> {
    queued_triggers_at(&redis.url(), prefix).await
}

/// [`queued_triggers`] of the Redis or cluster at `url`.
pub async fn queued_triggers_at(url: &str, prefix: &str) -> Result<Vec<QueuedTrigger>> {
    let mut c = redis_connection(url).await?;
    let partitions: u32 = redis::cmd("HGET")
        .arg(format!("{prefix}:meta"))
        .arg("partitions")
        .query_async(&mut c)
        .await?;
    let mut out = Vec::new();
    for p in 0..partitions {
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(format!("{prefix}:{{{p}}}:triggers"))
            .arg("-")
            .arg("+")
            .query_async(&mut c)
            .await?;
        for e in reply.ids {
            let json: String = e.get("t").context("entry without t")?;
            let v: serde_json::Value = serde_json::from_str(&json)?;
            let job_id = v["job_id"].as_str().unwrap_or_default().to_owned();
            let schedule_no = v["schedule_no"].as_str().unwrap_or_default();
            let entry_ms =
                e.id.split('-')
                    .next()
                    .and_then(|m| m.parse().ok())
                    .unwrap_or(0);
            let triggered_at: i64 = e.get("at").unwrap_or(entry_ms);
            out.push(QueuedTrigger {
                entry_ms,
                triggered_at,
                schedule_id: format!("{job_id}@{schedule_no}"),
                scheduled_at: v["scheduled_at"].as_i64().unwrap_or(0),
                kind: v["kind"].as_str().unwrap_or_default().to_owned(),
                job_id,
            });
        }
    }
    out.sort_by_key(|t| t.entry_ms);
    Ok(out)
}

/// Redis's clock in ms (the store's clock).
pub async fn redis_now(redis: &RedisServer) -> Result<i64> {
    redis_now_at(&redis.url()).await
}

/// [`redis_now`] of the Redis or cluster at `url` (a cluster: one master's clock).
pub async fn redis_now_at(url: &str) -> Result<i64> {
    let mut c = redis_connection(url).await?;
    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(&mut c).await?;
    Ok(s * 1000 + us / 1000)
}

/// A `test_executor` process (see `src/bin/test_executor.rs`): an SDK executor with
/// the handlers noop/echo/sleep/fail/flaky that journals every start and finish.
/// Killed (SIGKILL) on drop if still running.
pub struct TestExecutor {
    child: Child,
    pub node_id: String,
    pub journal: PathBuf,
}

impl TestExecutor {
    /// Starts it (`bin` is `env!("CARGO_BIN_EXE_test_executor")` in a test) and
    /// waits until a server welcomed it.
    pub fn start(bin: &str, endpoints: &[String], node_id: &str, journal: &Path) -> Result<Self> {
        Self::start_with(bin, endpoints, node_id, journal, &[])
    }

    /// As `start`, with extra command-line arguments (e.g. `--failing`).
    pub fn start_with(
        bin: &str,
        endpoints: &[String],
        node_id: &str,
        journal: &Path,
        extra: &[&str],
    ) -> Result<Self> {
        let mut cmd = Command::new(bin);
        cmd.args(extra);
        for e in endpoints {
            cmd.arg("--endpoint").arg(e);
        }
        cmd.args([
            "--group",
            "g",
            "--node-id",
            node_id,
            "--shutdown-grace-ms",
            "5000",
        ])
        .arg("--journal")
        .arg(journal)
        .env(
            "RUST_LOG",
            std::env::var("SUNDIAL_TEST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        let mut child = cmd.spawn().context("spawning test_executor")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("TEST_EXECUTOR_READY") {
                    let _ = tx.send(());
                }
            }
        });
        if rx.recv_timeout(Duration::from_secs(30)).is_err() {
            let _ = child.kill();
            bail!("test_executor {node_id} did not connect within 30 s");
        }
        Ok(Self {
            child,
            node_id: node_id.to_owned(),
            journal: journal.to_owned(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, sig: &str) -> Result<()> {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()?
            .success();
        ensure!(ok, "kill -{sig} failed");
        Ok(())
    }

    /// SIGKILL, no goodbye.
    pub fn kill(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for TestExecutor {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One line of a test executor's journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    pub event: String,
    pub schedule_id: String,
    pub attempt: u32,
    pub token: u64,
    pub node_id: String,
    pub unix_ms: i64,
    pub status: String,
}

/// Every whole line of the journals at `paths`, in file order per file.
pub fn read_journals(paths: &[PathBuf]) -> Result<Vec<JournalEntry>> {
    let mut out = Vec::new();
    for p in paths {
        let text = match std::fs::read_to_string(p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e.into()),
        };
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() < 6 {
                continue;
            }
            out.push(JournalEntry {
                event: f[0].to_owned(),
                schedule_id: f[1].to_owned(),
                attempt: f[2].parse()?,
                token: f[3].parse()?,
                node_id: f[4].to_owned(),
                unix_ms: f[5].parse()?,
                status: f.get(6).map(|s| (*s).to_owned()).unwrap_or_default(),
            });
        }
    }
    Ok(out)
}
