//! A throwaway primary with one replica, watched by three Sentinels on loopback ports,
//! and the primary's failover.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use super::{
    Killed, TestPki, free_ports, kill_with_lag, node_command, node_command_at, spawn_watched,
    wait_ready,
};

/// The name the Sentinels know the primary by.
const MASTER_NAME: &str = "sundial";

/// A primary, its replica and three Sentinels (quorum 2, a primary is down after 1 s
/// unanswered), no persistence. Shut down on drop, and by a watchdog shell within a
/// second of the test process exiting.
pub struct RedisSentinel {
    /// The primary's port, then the replica's (plain; the harness's).
    nodes: Vec<u16>,
    /// The Sentinels' ports (plain; the harness's).
    sentinels: Vec<u16>,
    /// With [`start_secure`](Self::start_secure): how the set is secured.
    secure: Option<Secure>,
}

/// A set of [`RedisSentinel::start_secure`].
struct Secure {
    /// The Sentinels' TLS ports.
    tls_sentinels: Vec<u16>,
    /// The data nodes' password.
    password: String,
    /// The Sentinels' own password.
    sentinel_password: String,
}

impl RedisSentinel {
    /// Starts them and waits until every Sentinel sees the primary, its replica and
    /// the other two Sentinels.
    pub fn start() -> Result<Self> {
        Self::start_with(None)
    }

    /// [`start`](Self::start), with every node and Sentinel also serving TLS with
    /// `pki`'s certificate to clients that present one it signed (mutual TLS),
    /// replication and the Sentinels' links over TLS, the primary and replica asking
    /// for `password` and the Sentinels for `sentinel_password` ([`url`](Self::url)
    /// names the TLS ports and the data nodes' password).
    pub fn start_secure(pki: &TestPki, password: &str, sentinel_password: &str) -> Result<Self> {
        Self::start_with(Some((pki, password, sentinel_password)))
    }

    fn start_with(secure: Option<(&TestPki, &str, &str)>) -> Result<Self> {
        let dir = tempfile::tempdir()?.keep();
        let mut nodes = free_ports(if secure.is_some() { 10 } else { 5 })?;
        let mut sentinels = nodes.split_off(2);
        let tls = sentinels.split_off(3);
        // What a node or Sentinel is reached at by the others: TLS ports when secure.
        let (node_tls, sentinel_tls) = match secure {
            Some(_) => (tls[..2].to_vec(), tls[2..].to_vec()),
            None => (nodes.clone(), sentinels.clone()),
        };
        let (primary, replica) = (node_tls[0], node_tls[1]);
        let mut script = String::new();
        for (i, &port) in nodes.iter().enumerate() {
            let mut extra = match secure {
                Some((pki, password, _)) => format!(
                    "--tls-port {} --tls-replication yes {} --requirepass {password} \
                     --masterauth {password}",
                    node_tls[i],
                    pki.redis_mutual_args().join(" ")
                ),
                None => String::new(),
            };
            if i == 1 {
                extra.push_str(&format!(" --replicaof 127.0.0.1 {primary}"));
            }
            script.push_str(&format!(
                "redis-server --port {port} --bind 127.0.0.1 --save '' --appendonly no \
                 --repl-diskless-sync-delay 0 --dir {dir} --dbfilename {port}.rdb {extra} \
                 >/dev/null 2>&1 & pids=\"$pids $!\"; ",
                dir = dir.display()
            ));
        }
        for (i, &port) in sentinels.iter().enumerate() {
            // Each Sentinel knows the replica and the other Sentinels from the start (by
            // themselves they learn of them within about ten seconds).
            let mut known = format!("sentinel known-replica {MASTER_NAME} 127.0.0.1 {replica}\n");
            for (&other, &reached) in sentinels.iter().zip(&sentinel_tls) {
                if other != port {
                    known.push_str(&format!(
                        "sentinel known-sentinel {MASTER_NAME} 127.0.0.1 {reached} {}\n",
                        sentinel_id(other)
                    ));
                }
            }
            if let Some((pki, password, sentinel_password)) = secure {
                // `requirepass` is also what a Sentinel presents to the other Sentinels.
                known.push_str(&format!(
                    "sentinel auth-pass {MASTER_NAME} {password}\n\
                     requirepass {sentinel_password}\ntls-port {}\n\
                     tls-replication yes\n{}\n",
                    sentinel_tls[i],
                    pki.redis_mutual_args()
                        .chunks(2)
                        .map(|kv| format!("{} {}", kv[0].trim_start_matches("--"), kv[1]))
                        .collect::<Vec<_>>()
                        .join("\n")
                ));
            }
            // A Sentinel rewrites its configuration file: one each.
            let conf = dir.join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\nsentinel myid {id}\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {primary} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                     sentinel failover-timeout {MASTER_NAME} 10000\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n{known}",
                    dir = dir.display(),
                    id = sentinel_id(port),
                ),
            )?;
            script.push_str(&format!(
                "redis-server {conf} --sentinel >/dev/null 2>&1 & pids=\"$pids $!\"; ",
                conf = conf.display()
            ));
        }
        let mut watchdog =
            spawn_watched(&script, &dir, "the primary, its replica and the Sentinels")?;
        let set = Self {
            nodes,
            sentinels,
            secure: secure.map(|(_, password, sentinel_password)| Secure {
                tls_sentinels: sentinel_tls,
                password: password.to_owned(),
                sentinel_password: sentinel_password.to_owned(),
            }),
        };
        for &port in &set.nodes {
            let client = redis::Client::open(set.node_url(port))?;
            wait_ready(&mut watchdog, &client, port, Duration::from_secs(10))?;
        }
        for &port in &set.sentinels {
            let client = redis::Client::open(set.sentinel_url(port))?;
            wait_ready(&mut watchdog, &client, port, Duration::from_secs(10))?;
        }
        set.wait_watched(Duration::from_secs(30))?;
        Ok(set)
    }

    /// The harness's URL of the data node at `port`.
    fn node_url(&self, port: u16) -> String {
        match &self.secure {
            Some(secure) => format!("redis://:{}@127.0.0.1:{port}", secure.password),
            None => format!("redis://127.0.0.1:{port}"),
        }
    }

    /// The harness's URL of the Sentinel at `port`.
    fn sentinel_url(&self, port: u16) -> String {
        match &self.secure {
            Some(secure) => format!("redis://:{}@127.0.0.1:{port}", secure.sentinel_password),
            None => format!("redis://127.0.0.1:{port}"),
        }
    }

    /// The Sentinels and the primary's name, as `--redis-url` takes them.
    pub fn url(&self) -> String {
        let (scheme, credentials, ports) = match &self.secure {
            Some(secure) => (
                "rediss",
                format!(":{}@", secure.password),
                &secure.tls_sentinels,
            ),
            None => ("redis", String::new(), &self.sentinels),
        };
        let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!(
            "{scheme}+sentinel://{credentials}{}/{MASTER_NAME}",
            hosts.join(",")
        )
    }

    /// The port of the primary the Sentinel at `sentinel` names.
    fn named_primary(&self, sentinel: u16) -> Result<u16> {
        let client = redis::Client::open(self.sentinel_url(sentinel))?;
        let mut c = client.get_connection_with_timeout(Duration::from_secs(2))?;
        let (_host, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(MASTER_NAME)
            .query(&mut c)?;
        Ok(port)
    }

    /// One `SENTINEL MASTER` field as the Sentinel at `sentinel` reports it.
    fn master_field(&self, sentinel: u16, field: &str) -> Result<String> {
        let client = redis::Client::open(self.sentinel_url(sentinel))?;
        let mut c = client.get_connection_with_timeout(Duration::from_secs(2))?;
        let fields: Vec<String> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(MASTER_NAME)
            .query(&mut c)?;
        fields
            .chunks(2)
            .find(|kv| kv[0] == field)
            .map(|kv| kv[1].clone())
            .with_context(|| format!("SENTINEL MASTER without {field}"))
    }

    /// Waits until each Sentinel sees the primary with its replica and two other
    /// Sentinels, and the replica's link to the primary is up.
    fn wait_watched(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let watched = self.sentinels.iter().all(|&s| {
                self.master_field(s, "num-slaves").is_ok_and(|n| n == "1")
                    && self
                        .master_field(s, "num-other-sentinels")
                        .is_ok_and(|n| n == "2")
            });
            let linked = node_command_at(&self.node_url(self.nodes[1]), &["INFO", "replication"])
                .is_ok_and(|i| i.contains("master_link_status:up"));
            if watched && linked {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "the Sentinels do not all watch the primary and its replica after {timeout:?}"
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILLs the primary; with `lag`, its replica falls that far behind first (see
    /// `kill_with_lag`).
    pub fn kill_primary(&mut self, lag: Option<Duration>) -> Result<Killed> {
        ensure!(
            self.secure.is_none(),
            "kill_primary is for a set started by start()"
        );
        let (primary, replica) = (self.nodes[0], self.nodes[1]);
        let killed = kill_with_lag(primary, lag.map(|lag| (replica, lag)))?;
        self.nodes.retain(|&p| p != primary);
        Ok(killed)
    }

    /// Waits until every Sentinel names the replica as the primary and it answers as
    /// one.
    pub fn wait_failover(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let promoted = self.nodes[0];
        loop {
            let named = self
                .sentinels
                .iter()
                .all(|&s| self.named_primary(s).is_ok_and(|p| p == promoted));
            let role = node_command(promoted, &["INFO", "replication"])
                .is_ok_and(|i| i.contains("role:master"));
            if named && role {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("the Sentinels promoted no replica within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The Sentinel at `port`'s run id (40 hex digits).
fn sentinel_id(port: u16) -> String {
    format!("{port:040x}")
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        for &port in &self.nodes {
            let _ = node_command_at(&self.node_url(port), &["SHUTDOWN", "NOSAVE"]);
        }
        for &port in &self.sentinels {
            let _ = node_command_at(&self.sentinel_url(port), &["SHUTDOWN", "NOSAVE"]);
        }
    }
}
