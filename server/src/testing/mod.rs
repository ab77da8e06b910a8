//! Test support shared by the server's own tests and the `sundial-tests` crate:
//! throwaway Redis servers on free ports (one, a cluster: `cluster`, a primary with a
//! replica watched by Sentinels: `sentinel`), with TLS from a throwaway CA (`pki`).
//! Compiled for tests and with the `testing` feature only.

mod cluster;
mod pki;
mod sentinel;

pub use cluster::RedisCluster;
pub use pki::TestPki;
pub use sentinel::RedisSentinel;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};

/// A port that was free a moment ago (bound to 0, then released).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `n` distinct ports that were free a moment ago (bound together, then released).
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
}

/// A throwaway Redis server on a free port, killed on drop.
pub struct RedisServer {
    child: Child,
    pub port: u16,
    persistent: bool,
    dir: tempfile::TempDir,
    /// Arguments beyond the port, persistence and directory (TLS).
    extra: Vec<String>,
    tls_port: Option<u16>,
}

impl RedisServer {
    /// A Redis without persistence: fast, and a restart loses everything.
    pub fn start() -> Result<Self> {
        Self::start_with(false, None)
    }

    /// A Redis with an append-only file fsynced at every write, so a SIGKILL and
    /// [`restart`](Self::restart) keep every acknowledged write.
    pub fn start_persistent() -> Result<Self> {
        Self::start_with(true, None)
    }

    /// A Redis without persistence that also serves TLS with `pki`'s server
    /// certificate, on the port of [`tls_url`](Self::tls_url).
    pub fn start_tls(pki: &TestPki) -> Result<Self> {
        Self::start_with(false, Some(pki.redis_args()))
    }

    /// [`start_tls`](Self::start_tls), its TLS port asking every client for a
    /// certificate `pki`'s CA signed (mutual TLS).
    pub fn start_mutual_tls(pki: &TestPki) -> Result<Self> {
        Self::start_with(false, Some(pki.redis_mutual_args()))
    }

    /// `tls`: the `redis-server` arguments of its TLS port, if it has one.
    fn start_with(persistent: bool, tls: Option<Vec<String>>) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let mut last_err = anyhow!("redis-server did not start");
        // A free port can be taken between the probe and redis's bind: try a few.
        for _ in 0..5 {
            let ports = free_ports(2)?;
            let extra = match &tls {
                Some(args) => [
                    vec!["--tls-port".to_owned(), ports[1].to_string()],
                    args.clone(),
                ]
                .concat(),
                None => Vec::new(),
            };
            match spawn_redis(ports[0], dir.path(), persistent, &extra) {
                Ok(child) => {
                    return Ok(RedisServer {
                        child,
                        port: ports[0],
                        persistent,
                        dir,
                        extra,
                        tls_port: tls.as_ref().map(|_| ports[1]),
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
        self.child = spawn_redis(self.port, self.dir.path(), self.persistent, &self.extra)?;
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

    /// Its TLS port's URL (`rediss://`), when started with [`start_tls`](Self::start_tls).
    pub fn tls_url(&self) -> Option<String> {
        self.tls_port.map(|p| format!("rediss://127.0.0.1:{p}"))
    }

    pub async fn connection(&self) -> Result<redis::aio::MultiplexedConnection> {
        let client = redis::Client::open(self.url())?;
        Ok(client.get_multiplexed_async_connection().await?)
    }
}

fn spawn_redis(
    port: u16,
    dir: &std::path::Path,
    persistent: bool,
    extra: &[String],
) -> Result<Child> {
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
        .args(extra)
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
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    wait_ready(child, &client, port, timeout)
}

/// Waits until the server `child` started answers `PING` through `client`.
fn wait_ready(
    child: &mut Child,
    client: &redis::Client,
    port: u16,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
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
        let started = || -> Result<String> {
            let port = free_port()?;
            let dir = tempfile::tempdir()?.keep();
            let mut child = spawn_shared_redis(&format!("--port {port}"), &dir)?;
            wait_redis_ready(&mut child, port, Duration::from_secs(10))?;
            Ok(format!("redis://127.0.0.1:{port}"))
        };
        started().map_err(|e| format!("{e:#}"))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// A `redis-server` with `args` (its ports, TLS) and no persistence, in `dir`, under a
/// watchdog shell ([`spawn_watched`]).
fn spawn_shared_redis(args: &str, dir: &std::path::Path) -> Result<Child> {
    spawn_watched(
        &format!(
            "redis-server {args} --bind 127.0.0.1 --save '' --appendonly no --dir {dir} \
             >/dev/null 2>&1 & pids=\"$pids $!\"; ",
            dir = dir.display()
        ),
        dir,
        "redis-server",
    )
}

/// One Redis Cluster (three masters, each with a replica, on loopback ports) shared by
/// every test of this test binary, as a `redis+cluster://` seed list of all six nodes.
/// A watchdog shell stops the nodes within a second of the test process exiting.
pub fn shared_redis_cluster_url() -> Result<String> {
    static URL: OnceLock<Result<String, String>> = OnceLock::new();
    URL.get_or_init(|| {
        RedisCluster::start(3, 1)
            .map(|c| {
                let url = c.url();
                // Never shut down: the watchdog stops it with the test process.
                std::mem::forget(c);
                url
            })
            .map_err(|e| format!("{e:#}"))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// One Redis serving TLS only, with a certificate of a throwaway CA, shared by every
/// test of this test binary: its `rediss://` URL and the CA's PEM. A watchdog shell
/// kills it within a second of the test process exiting.
pub fn shared_redis_tls() -> Result<(String, String)> {
    static SERVER: OnceLock<Result<(String, String), String>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            let started = || -> Result<(String, String)> {
                let pki = TestPki::new()?;
                let port = free_port()?;
                let mut child = spawn_shared_redis(
                    &format!("--port 0 --tls-port {port} {}", pki.redis_args().join(" ")),
                    &pki.path(""),
                )?;
                let url = format!("rediss://127.0.0.1:{port}");
                let client = redis::Client::build_with_tls(
                    url.as_str(),
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(pki.ca_pem.clone().into_bytes()),
                    },
                )?;
                wait_ready(&mut child, &client, port, Duration::from_secs(10))?;
                let ca = pki.ca_pem.clone();
                // The certificate files stay for the server's life (the watchdog
                // removes them).
                std::mem::forget(pki);
                Ok((url, ca))
            };
            started().map_err(|e| format!("{e:#}"))
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

/// One primary with a replica behind three Sentinels ([`RedisSentinel`]) shared by
/// every test of this test binary, as a `redis+sentinel://` URL.
pub fn shared_redis_sentinel_url() -> Result<String> {
    static URL: OnceLock<Result<String, String>> = OnceLock::new();
    URL.get_or_init(|| {
        RedisSentinel::start()
            .map(|set| {
                let url = set.url();
                // Never shut down: the watchdog stops it with the test process.
                std::mem::forget(set);
                url
            })
            .map_err(|e| format!("{e:#}"))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// A master SIGKILLed by [`RedisCluster::kill_busiest_master`] or
/// [`RedisSentinel::kill_primary`].
#[derive(Debug, Clone, Copy)]
pub struct Killed {
    pub port: u16,
    /// How far its replica was behind it when it died (replication stream bytes): the
    /// acknowledged writes the promoted replica lacks.
    pub lost_bytes: u64,
}

/// Runs `script` (shell commands that start servers in the background, each adding its
/// pid to `$pids`) in a watchdog shell that kills them and removes `dir` within a second
/// of the test process exiting.
fn spawn_watched(script: &str, dir: &std::path::Path, what: &str) -> Result<Child> {
    let script = format!(
        "{script}trap 'kill $pids 2>/dev/null; sleep 0.2; rm -rf {dir}' EXIT; \
         while kill -0 {parent} 2>/dev/null; do sleep 0.5; done",
        parent = std::process::id(),
        dir = dir.display()
    );
    Command::new("bash")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {what}"))
}

/// SIGKILLs the Redis at `victim` (no goodbye: a failover has to notice it). With
/// `lag` (the port of its replica and a duration), the replica is stopped (SIGSTOP)
/// and its replication link cut (`CLIENT KILL TYPE replica`) for that long first,
/// while `victim` goes on acknowledging writes, and resumed (SIGCONT) after the kill:
/// once promoted, it lacks what `victim` acknowledged meanwhile, as a replica that
/// lagged behind does after a failover.
fn kill_with_lag(victim: u16, lag: Option<(u16, Duration)>) -> Result<Killed> {
    let replica = match lag {
        Some((port, lag)) => {
            let pid = pid_of(port)?;
            signal(&pid, "STOP")?;
            // What the master sends from now on does not wait in the stopped replica's
            // socket buffer either.
            node_command(victim, &["CLIENT", "KILL", "TYPE", "replica"])?;
            std::thread::sleep(lag);
            Some((port, pid))
        }
        None => None,
    };
    let acknowledged = repl_offset(victim)?;
    signal(&pid_of(victim)?, "KILL")?;
    let mut lost_bytes = 0;
    if let Some((port, pid)) = replica {
        signal(&pid, "CONT")?;
        // What it had received before the link closed, applied; nothing arrives after
        // (its master is dead and it is not promoted yet).
        std::thread::sleep(Duration::from_millis(300));
        lost_bytes = acknowledged.saturating_sub(repl_offset(port)?);
    }
    Ok(Killed {
        port: victim,
        lost_bytes,
    })
}

/// The node's replication offset (`master_repl_offset`: what it has written or
/// applied of its replication stream).
fn repl_offset(port: u16) -> Result<u64> {
    let info = node_command(port, &["INFO", "replication"])?;
    info.lines()
        .find_map(|l| l.strip_prefix("master_repl_offset:"))
        .context("INFO replication without master_repl_offset")?
        .trim()
        .parse()
        .context("master_repl_offset")
}

/// The process id of the `redis-server` at `port`.
fn pid_of(port: u16) -> Result<String> {
    let info = node_command(port, &["INFO", "server"])?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .context("INFO server without process_id")?
        .trim()
        .to_owned())
}

/// Sends `sig` (KILL, STOP, CONT) to process `pid`.
fn signal(pid: &str, sig: &str) -> Result<()> {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), pid])
        .status()?
        .success();
    ensure!(ok, "kill -{sig} {pid} failed");
    Ok(())
}

/// One command to the node at `port`, its reply as text.
fn node_command(port: u16, args: &[&str]) -> Result<String> {
    node_command_at(&format!("redis://127.0.0.1:{port}"), args)
}

/// One command to the server at `url`, its reply as text.
fn node_command_at(url: &str, args: &[&str]) -> Result<String> {
    let client = redis::Client::open(url)?;
    let mut c = client.get_connection_with_timeout(Duration::from_secs(2))?;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    Ok(cmd.query::<String>(&mut c)?)
}

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag (what is
/// between its first `{` and the next `}`, when that is not empty; else the whole key),
/// mod 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let tag = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&len| len > 0)
                .map(|len| &rest[..len])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &b in tag {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// A key prefix no other test uses.
pub fn unique_prefix(name: &str) -> String {
    format!("t-{name}-{}", uuid::Uuid::now_v7().simple())
}
