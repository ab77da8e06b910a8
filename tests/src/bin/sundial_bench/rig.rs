//! What a scenario runs against: a throwaway Redis (no persistence), a throwaway Redis
//! Cluster (three masters, no replicas: the machine's cores serve only what is used) or
//! an embedded store, one or two `sundial serve` processes of the bench's own build
//! profile, and `test_executor` processes journalling every handler start and finish. Everything is
//! torn down when the rig drops.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use sundial_proto::v1 as pb;
use sundial_tests::{
    JobServiceClient, RedisCluster, RedisServer, Sundial, SundialOptions, TestExecutor,
    read_journals,
};
pub use sundial_tests::{now_ms, register};
use tonic::transport::Channel;

/// Where the jobs live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    Redis,
    /// A Redis Cluster of three masters.
    Cluster,
    Embedded,
}

impl StoreKind {
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Redis => "redis",
            StoreKind::Cluster => "cluster",
            StoreKind::Embedded => "embedded",
        }
    }
}

/// The `sundial` and `test_executor` binaries next to this one, built first (by the
/// cargo that runs the bench) so they are never stale.
pub struct Binaries {
    pub sundial: PathBuf,
    pub executor: PathBuf,
}

impl Binaries {
    /// `sundial` may be given (e.g. an older build, to compare); otherwise it and
    /// `test_executor` are built and taken from this binary's directory.
    pub fn build(sundial: Option<PathBuf>) -> Result<Self> {
        let me = std::env::current_exe().context("the bench's own path")?;
        let dir = me.parent().context("the bench's directory")?.to_path_buf();
        let release = dir.file_name().is_some_and(|n| n == "release");
        if let Ok(cargo) = std::env::var("CARGO") {
            let mut cmd = Command::new(cargo);
            cmd.args([
                "build",
                "--quiet",
                "-p",
                "sundial-server",
                "--bin",
                "sundial",
                "-p",
                "sundial-tests",
                "--bin",
                "test_executor",
            ])
            .current_dir(sundial_tests::workspace_root());
            if release {
                cmd.arg("--release");
            }
            let status = cmd.status().context("running cargo build")?;
            ensure!(
                status.success(),
                "cargo build of sundial and test_executor failed"
            );
        }
        let bins = Self {
            sundial: sundial.unwrap_or_else(|| dir.join("sundial")),
            executor: dir.join("test_executor"),
        };
        for b in [&bins.sundial, &bins.executor] {
            ensure!(
                b.exists(),
                "{} is missing: build it (cargo build -p sundial-server -p sundial-tests), or run the bench with cargo run",
                b.display()
            );
        }
        Ok(bins)
    }
}

/// The processes of one scenario.
pub struct Rig {
    /// Kept until the rig drops (the servers need it); see [`Rig::redis_url`].
    _redis: Option<RedisServer>,
    cluster: Option<RedisCluster>,
    pub instances: Vec<Sundial>,
    pub executors: Vec<TestExecutor>,
    /// The journals and the embedded store's file live here.
    _dir: tempfile::TempDir,
}

/// How to build a rig.
pub struct RigSpec<'a> {
    pub bins: &'a Binaries,
    pub store: StoreKind,
    pub instances: usize,
    pub executors: usize,
    /// Extra `--flag value` for every server.
    pub server_args: Vec<(String, String)>,
    /// Extra arguments for every executor (e.g. `--max-concurrency 8`).
    pub executor_args: Vec<String>,
}

impl Rig {
    pub fn start(spec: &RigSpec<'_>) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        if spec.store == StoreKind::Embedded && spec.instances != 1 {
            bail!("the embedded store serves one instance; use --store redis for more");
        }
        let redis = match spec.store {
            StoreKind::Redis => Some(RedisServer::start()?),
            StoreKind::Cluster | StoreKind::Embedded => None,
        };
        let cluster = match spec.store {
            StoreKind::Cluster => Some(RedisCluster::start(3, 0)?),
            StoreKind::Redis | StoreKind::Embedded => None,
        };
        let url = redis
            .as_ref()
            .map(RedisServer::url)
            .or_else(|| cluster.as_ref().map(RedisCluster::url));
        let mut instances = Vec::new();
        for i in 0..spec.instances {
            // The production defaults: not the harness's shortened test intervals.
            let mut opts = SundialOptions {
                data_dir: url.is_none().then(|| dir.path().join("data")),
                redis_url: url.clone(),
                bin: Some(spec.bins.sundial.clone()),
                ..SundialOptions::default()
            };
            opts = opts
                .arg("instance-id", &format!("bench-{i}"))
                .env("RUST_LOG", "warn");
            for (flag, value) in &spec.server_args {
                opts = opts.arg(flag, value);
            }
            instances.push(Sundial::start(opts)?);
        }
        let endpoints: Vec<String> = instances.iter().map(Sundial::grpc_url).collect();
        let mut executors = Vec::new();
        let extra: Vec<&str> = spec.executor_args.iter().map(String::as_str).collect();
        for e in 0..spec.executors {
            // Executors are spread over the instances, as a load balancer would.
            let endpoint = endpoints[e % endpoints.len()].clone();
            let journal = dir.path().join(format!("exec-{e}.journal"));
            executors.push(TestExecutor::start_with(
                &spec.bins.executor.to_string_lossy(),
                &[endpoint],
                &format!("bench-exec-{e}"),
                &journal,
                &extra,
            )?);
        }
        Ok(Self {
            _redis: redis,
            cluster,
            instances,
            executors,
            _dir: dir,
        })
    }

    /// The Redis the servers share, for the scenarios that read its statistics.
    pub fn redis_url(&self) -> Option<String> {
        self._redis.as_ref().map(RedisServer::url)
    }

    /// The URL of each Redis server the store is on: the one Redis, or each master of
    /// the cluster (none for the embedded store).
    pub fn redis_nodes(&self) -> Vec<String> {
        match &self.cluster {
            Some(c) => c.node_urls(),
            None => self.redis_url().into_iter().collect(),
        }
    }

    pub fn redis_port(&self) -> Option<u16> {
        self._redis.as_ref().map(|r| r.port)
    }

    pub async fn jobs(&self) -> Result<JobServiceClient<Channel>> {
        self.instances[0].jobs().await
    }

    pub fn journals(&self) -> Vec<PathBuf> {
        self.executors.iter().map(|e| e.journal.clone()).collect()
    }

    /// Every journal line so far.
    pub fn journal(&self) -> Result<Vec<sundial_tests::JournalEntry>> {
        read_journals(&self.journals())
    }

    /// Every instance's `/metrics`, read once.
    pub async fn scrape(&self, client: &reqwest::Client) -> Result<Scraped> {
        let mut texts = Vec::with_capacity(self.instances.len());
        for s in &self.instances {
            let url = format!("{}/metrics", s.http_url().context("http is on")?);
            texts.push(client.get(url).send().await?.text().await?);
        }
        Ok(Scraped(texts))
    }
}

/// The `/metrics` texts of every instance at one moment.
pub struct Scraped(Vec<String>);

impl Scraped {
    /// The sum over instances of one sample (e.g.
    /// `sundial_runs_finished_total{state="SUCCEEDED"}`); 0 where it is absent.
    pub fn sum(&self, sample: &str) -> f64 {
        self.0
            .iter()
            .filter_map(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
                    .and_then(|v| v.trim().parse::<f64>().ok())
            })
            .sum()
    }
}

/// One section of Redis's `INFO`.
pub async fn redis_info(url: &str, section: &str) -> Result<String> {
    let client = redis::Client::open(url)?;
    let mut c = client.get_multiplexed_async_connection().await?;
    Ok(redis::cmd("INFO").arg(section).query_async(&mut c).await?)
}

/// A numeric `name:value` field of an `INFO` text.
pub fn info_field(info: &str, name: &str) -> Option<f64> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

/// A job for the `test_executor` processes (group `g`), handler `noop`.
pub fn noop_job(id: String, cron: &str) -> pb::JobSpec {
    pb::JobSpec {
        id,
        cron: cron.to_owned(),
        target: Some(pb::job_spec::Target::Executor(pb::ExecutorTarget {
            group: "g".into(),
            handler: "noop".into(),
        })),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_and_info_fields() {
        let scraped = Scraped(vec![
            "# HELP x\nsundial_runs_lost_total 2\nsundial_runs_finished_total{state=\"FAILED\"} 1\n"
                .into(),
            "sundial_runs_lost_total 3\n".into(),
        ]);
        assert_eq!(scraped.sum("sundial_runs_lost_total"), 5.0);
        assert_eq!(
            scraped.sum(r#"sundial_runs_finished_total{state="FAILED"}"#),
            1.0
        );
        assert_eq!(scraped.sum("absent"), 0.0);
        let info = "# CPU\r\nused_cpu_sys:1.5\r\nused_cpu_user:0.25\r\n";
        assert_eq!(info_field(info, "used_cpu_user"), Some(0.25));
        assert_eq!(info_field(info, "used_cpu"), None);
    }
}
