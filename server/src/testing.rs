//! Test support shared by the server's own tests and the `sundial-tests` crate:
//! throwaway Redis servers on free ports. Compiled for tests and with the `testing`
//! feature only.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

/// A port that was free a moment ago (bound to 0, then released).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A throwaway Redis server on a free port, killed on drop.
pub struct RedisServer {
    child: Child,
    pub port: u16,
    persistent: bool,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// A Redis without persistence: fast, and a restart loses everything.
    pub fn start() -> Result<Self> {
        Self::start_with(false)
    }

    /// A Redis with an append-only file fsynced at every write, so a SIGKILL and
    /// [`restart`](Self::restart) keep every acknowledged write.
    pub fn start_persistent() -> Result<Self> {
        Self::start_with(true)
    }

    fn start_with(persistent: bool) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let mut last_err = anyhow!("redis-server did not start");
        // A free port can be taken between the probe and redis's bind: try a few.
        for _ in 0..5 {
            let port = free_port()?;
            match spawn_redis(port, dir.path(), persistent) {
                Ok(child) => {
                    return Ok(RedisServer {
                        child,
                        port,
                        persistent,
                        dir,
                    });
                }
                Err(e) => last_err = e,
            }
        }
        Err(last_err)
    }

    /// SIGKILLs the server and starts it again on the same port and directory.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.child = spawn_redis(self.port, self.dir.path(), self.persistent)?;
        Ok(())
    }

    /// SIGKILL, no goodbye (the port stays unanswered until [`restart`](Self::restart)).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub async fn connection(&self) -> Result<redis::aio::MultiplexedConnection> {
        let client = redis::Client::open(self.url())?;
        Ok(client.get_multiplexed_async_connection().await?)
    }
}

fn spawn_redis(port: u16, dir: &std::path::Path, persistent: bool) -> Result<Child> {
    let mut cmd = Command::new("redis-server");
    cmd.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
    ]);
    if persistent {
        cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
    } else {
        cmd.args(["--appendonly", "no"]);
    }
    let mut child = cmd
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting redis-server (is it installed? scripts/test installs it)")?;
    if let Err(e) = wait_redis_ready(&mut child, port, Duration::from_secs(10)) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    Ok(child)
}

fn wait_redis_ready(child: &mut Child, port: u16, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            bail!("redis-server exited: {status}");
        }
        if let Ok(mut c) = client.get_connection()
            && redis::cmd("PING").query::<String>(&mut c).is_ok()
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("redis-server not ready on port {port}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One Redis shared by every test of this test binary (each test uses its own key
/// prefix). A watchdog shell kills it within a second of the test process exiting,
/// since statics are never dropped.
pub fn shared_redis_url() -> Result<String> {
    static URL: OnceLock<Result<String, String>> = OnceLock::new();
    URL.get_or_init(|| {
        let port = free_port().map_err(|e| e.to_string())?;
        let script = format!(
            "redis-server --port {port} --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 & r=$!; \
             trap 'kill $r 2>/dev/null' EXIT; \
             while kill -0 {parent} 2>/dev/null && kill -0 $r 2>/dev/null; do sleep 0.5; done",
            parent = std::process::id()
        );
        let mut child = Command::new("bash")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting redis-server: {e}"))?;
        wait_redis_ready(&mut child, port, Duration::from_secs(10)).map_err(|e| e.to_string())?;
        Ok(format!("redis://127.0.0.1:{port}"))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// One Redis Cluster (three masters, each with a replica, on loopback ports) shared by
/// every test of this test binary, as a `redis+cluster://` seed list of all six nodes.
/// A watchdog shell stops the nodes within a second of the test process exiting.
pub fn shared_redis_cluster_url() -> Result<String> {
    static URL: OnceLock<Result<String, String>> = OnceLock::new();
    URL.get_or_init(|| start_cluster(3, 1).map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow!(e))
}

/// Starts `masters × (1 + replicas)` cluster-enabled `redis-server`s (no persistence,
/// a short node timeout so a failover takes about a second) under a watchdog tied to
/// this process, joins them with `redis-cli --cluster create` and waits until every
/// node reports `cluster_state:ok`; returns the seed list URL.
fn start_cluster(masters: usize, replicas: usize) -> Result<String> {
    let dir = tempfile::tempdir()?.keep();
    let count = masters * (1 + replicas);
    let ports: Vec<u16> = (0..count).map(|_| free_port()).collect::<Result<_>>()?;
    let mut script = String::new();
    for &port in &ports {
        // The bus port is chosen too: port + 10000 may be past 65535.
        let bus = free_port()?;
        let node_dir = dir.join(port.to_string());
        std::fs::create_dir_all(&node_dir)?;
        script.push_str(&format!(
            "redis-server --port {port} --cluster-port {bus} --bind 127.0.0.1 --save '' \
             --appendonly no --cluster-enabled yes --cluster-node-timeout 1000 \
             --dir {dir} >/dev/null 2>&1 & pids=\"$pids $!\"; ",
            dir = node_dir.display()
        ));
    }
    script.push_str(&format!(
        "trap 'kill $pids 2>/dev/null; sleep 0.2; rm -rf {dir}' EXIT; \
         while kill -0 {parent} 2>/dev/null; do sleep 0.5; done",
        parent = std::process::id(),
        dir = dir.display()
    ));
    let mut watchdog = Command::new("bash")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .spawn()
        .context("starting the cluster's redis-servers")?;
    for &port in &ports {
        wait_redis_ready(&mut watchdog, port, Duration::from_secs(10))?;
    }
    let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let out = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&nodes)
        .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
        .stdin(Stdio::null())
        .output()
        .context("redis-cli --cluster create (scripts/test installs redis-tools)")?;
    if !out.status.success() {
        bail!(
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for &port in &ports {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
        let mut c = client.get_connection()?;
        loop {
            let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut c)?;
            if info.contains("cluster_state:ok") {
                break;
            }
            if Instant::now() >= deadline {
                bail!("the cluster is not ok on port {port} after 30 s: {info}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(format!("redis+cluster://{}", nodes.join(",")))
}

/// A connection to the Redis or the cluster at `url` (any form `--redis-url` takes),
/// for tests that look at the store's keys.
pub async fn redis_connection(url: &str) -> Result<impl redis::aio::ConnectionLike + Clone> {
    crate::store::redis::raw_connection(url)
        .await
        .map_err(|e| anyhow!("{e}"))
}

/// A key prefix no other test uses.
pub fn unique_prefix(name: &str) -> String {
    format!("t-{name}-{}", uuid::Uuid::now_v7().simple())
}
