//! Test support shared by the server's own tests and the `sundial-tests` crate:
//! throwaway Redis servers on free ports. Compiled for tests and with the `testing`
//! feature only.

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

/// A throwaway Redis Cluster of cluster-enabled `redis-server`s on loopback ports (no
/// persistence; a 1 s node timeout, so a master's replica is promoted within a few
/// seconds of its death). Its nodes are shut down on drop, and by a watchdog shell
/// within a second of the test process exiting.
pub struct RedisCluster {
    ports: Vec<u16>,
}

impl RedisCluster {
    /// Starts `masters × (1 + replicas)` nodes, joins them with `redis-cli --cluster
    /// create` and waits until every node reports `cluster_state:ok`.
    pub fn start(masters: usize, replicas: usize) -> Result<Self> {
        let dir = tempfile::tempdir()?.keep();
        let count = masters * (1 + replicas);
        // The bus ports are chosen too (port + 10000 may be past 65535), all of them
        // distinct: each bound at once before any is released.
        let mut chosen = free_ports(2 * count)?;
        let buses = chosen.split_off(count);
        let ports = chosen;
        let mut script = String::new();
        for (&port, bus) in ports.iter().zip(buses) {
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
        let cluster = Self { ports };
        for &port in &cluster.ports {
            wait_redis_ready(&mut watchdog, port, Duration::from_secs(10))?;
        }
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(cluster.addresses())
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
        cluster.wait_ok(Duration::from_secs(30))?;
        Ok(cluster)
    }

    fn addresses(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect()
    }

    /// Each live node's own `redis://` URL.
    pub fn node_urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// The seed list of every node, as `--redis-url` takes it.
    pub fn url(&self) -> String {
        format!("redis+cluster://{}", self.addresses().join(","))
    }

    /// Waits until each live node reports `cluster_state:ok`.
    fn wait_ok(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        for &port in &self.ports {
            loop {
                let info = node_command(port, &["CLUSTER", "INFO"]).unwrap_or_default();
                if info.contains("cluster_state:ok") {
                    break;
                }
                if Instant::now() >= deadline {
                    bail!("the cluster is not ok on port {port} after {timeout:?}: {info}");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// The port of the master serving `slot`, as the live node at `ask` sees it.
    fn master_of(ask: u16, slot: u16) -> Result<Option<u16>> {
        let nodes = node_command(ask, &["CLUSTER", "NODES"])?;
        for line in nodes.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() < 9 || !f[2].contains("master") || f[2].contains("fail") {
                continue;
            }
            let serves = f[8..].iter().any(|range| match range.split_once('-') {
                Some((a, b)) => a.parse::<u16>().ok() <= Some(slot) && Some(slot) <= b.parse().ok(),
                None => range.parse::<u16>().ok() == Some(slot),
            });
            if serves {
                let port = node_port(f[1]).context("a CLUSTER NODES address without a port")?;
                return Ok(Some(port));
            }
        }
        Ok(None)
    }

    /// SIGKILLs the master serving the most of `slots` (no goodbye, no failover
    /// handshake: its replica is promoted once the others have not heard from it for
    /// the node timeout) and returns its port. With `lag`, its replica is stopped
    /// (SIGSTOP) for that long first, while the master goes on acknowledging writes,
    /// and resumed (SIGCONT) after the kill: the promoted replica lacks what the master
    /// acknowledged meanwhile, as a replica that lagged behind does after a failover.
    pub fn kill_busiest_master(&mut self, slots: &[u16], lag: Option<Duration>) -> Result<Killed> {
        let ask = self.ports[0];
        let mut count: std::collections::BTreeMap<u16, usize> = Default::default();
        for &slot in slots {
            if let Some(port) = Self::master_of(ask, slot)? {
                *count.entry(port).or_default() += 1;
            }
        }
        let (&victim, _) = count
            .iter()
            .max_by_key(|(_, n)| **n)
            .context("no master serves those slots")?;
        let replica = match lag {
            Some(lag) => {
                let port = Self::replica_of(ask, victim)?;
                let pid = pid_of(port)?;
                signal(&pid, "STOP")?;
                // The replication link closed by the master: what it sends from now on
                // does not wait in the stopped replica's socket buffer either.
                node_command(victim, &["CLIENT", "KILL", "TYPE", "replica"])?;
                std::thread::sleep(lag);
                Some((port, pid))
            }
            None => None,
        };
        let acknowledged = repl_offset(victim)?;
        signal(&pid_of(victim)?, "KILL")?;
        self.ports.retain(|&p| p != victim);
        let mut lost_bytes = 0;
        if let Some((port, pid)) = replica {
            signal(&pid, "CONT")?;
            // What it had received before the link closed, applied; nothing arrives
            // after (its master is dead and it is not promoted yet).
            std::thread::sleep(Duration::from_millis(300));
            lost_bytes = acknowledged.saturating_sub(repl_offset(port)?);
        }
        Ok(Killed {
            port: victim,
            lost_bytes,
        })
    }

    /// The port of a replica of the master at `master`.
    fn replica_of(ask: u16, master: u16) -> Result<u16> {
        let nodes = node_command(ask, &["CLUSTER", "NODES"])?;
        let id = nodes
            .lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .find(|f| f.len() > 1 && node_port(f[1]) == Some(master))
            .map(|f| f[0].to_owned())
            .context("the master is not in CLUSTER NODES")?;
        nodes
            .lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .find(|f| f.len() > 3 && f[2].contains("slave") && f[3] == id)
            .and_then(|f| node_port(f[1]))
            .context("the master has no replica")
    }

    /// Waits until every one of `slots` is served by a live master and every live node
    /// reports `cluster_state:ok`.
    pub fn wait_failover(&self, slots: &[u16], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let served = slots.iter().all(|&slot| {
                Self::master_of(self.ports[0], slot)
                    .ok()
                    .flatten()
                    .is_some_and(|p| self.ports.contains(&p))
            });
            if served {
                break;
            }
            if Instant::now() >= deadline {
                bail!("no replica took over within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.wait_ok(deadline.saturating_duration_since(Instant::now()))
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for &port in &self.ports {
            let _ = node_command(port, &["SHUTDOWN", "NOSAVE"]);
        }
    }
}

/// The port of a `CLUSTER NODES` address (`ip:port@bus`).
fn node_port(addr: &str) -> Option<u16> {
    addr.split(['@', ':']).nth(1).and_then(|p| p.parse().ok())
}

/// A master SIGKILLed by [`RedisCluster::kill_busiest_master`].
#[derive(Debug, Clone, Copy)]
pub struct Killed {
    pub port: u16,
    /// How far its replica was behind it when it died (replication stream bytes): the
    /// acknowledged writes the promoted replica lacks.
    pub lost_bytes: u64,
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
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
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
