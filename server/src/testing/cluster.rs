//! A throwaway Redis Cluster on loopback ports, and a master's failover in it.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{
    Killed, TestPki, free_ports, kill_with_lag, node_command, spawn_watched, wait_redis_ready,
};

/// A throwaway Redis Cluster of cluster-enabled `redis-server`s on loopback ports (no
/// persistence; with replicas a 1 s node timeout, so a master's replica is promoted
/// within a few seconds of its death, without them 15 s). Its nodes are shut down on drop, and by a watchdog shell
/// within a second of the test process exiting.
pub struct RedisCluster {
    ports: Vec<u16>,
    /// Each node's TLS port (beside its plain one, which the harness uses), when
    /// started with [`start_tls`](Self::start_tls).
    tls_ports: Vec<u16>,
}

impl RedisCluster {
    /// Starts `masters × (1 + replicas)` nodes, joins them with `redis-cli --cluster
    /// create` and waits until every node reports `cluster_state:ok`.
    pub fn start(masters: usize, replicas: usize) -> Result<Self> {
        Self::start_with(masters, replicas, None)
    }

    /// [`start`](Self::start), each node also serving TLS with `pki`'s server
    /// certificate, and the cluster bus and replication over TLS.
    pub fn start_tls(masters: usize, replicas: usize, pki: &TestPki) -> Result<Self> {
        Self::start_with(masters, replicas, Some(pki))
    }

    fn start_with(masters: usize, replicas: usize, pki: Option<&TestPki>) -> Result<Self> {
        let dir = tempfile::tempdir()?.keep();
        let count = masters * (1 + replicas);
        // The bus ports are chosen too (port + 10000 may be past 65535), all of them
        // distinct: each bound at once before any is released.
        let mut ports = free_ports(if pki.is_some() { 3 } else { 2 } * count)?;
        let mut buses = ports.split_off(count);
        // Empty without TLS.
        let tls_ports = buses.split_off(count);
        // A replica takes over within a second or two of its master's death (the
        // failover tests). Without replicas nothing can take over, and a node that
        // answers a ping late on a busy machine (the tests run in parallel on two
        // cores) would only be flagged failing (`fail?`) by the others, so their views
        // of the slots part for a while: a long timeout then.
        let node_timeout = if replicas == 0 { 15_000 } else { 1_000 };
        let mut script = String::new();
        for (i, (&port, bus)) in ports.iter().zip(buses).enumerate() {
            let node_dir = dir.join(port.to_string());
            std::fs::create_dir_all(&node_dir)?;
            let tls = match pki {
                Some(pki) => format!(
                    "--tls-port {} --tls-cluster yes --tls-replication yes {}",
                    tls_ports[i],
                    pki.redis_args().join(" ")
                ),
                None => String::new(),
            };
            script.push_str(&format!(
                "redis-server --port {port} --cluster-port {bus} --bind 127.0.0.1 --save '' \
                 --appendonly no --repl-diskless-sync-delay 0 --cluster-enabled yes \
                 --cluster-node-timeout {node_timeout} {tls} \
                 --dir {dir} >/dev/null 2>&1 & pids=\"$pids $!\"; ",
                dir = node_dir.display()
            ));
        }
        let mut watchdog = spawn_watched(&script, &dir, "the cluster's redis-servers")?;
        let cluster = Self { ports, tls_ports };
        for &port in &cluster.ports {
            wait_redis_ready(&mut watchdog, port, Duration::from_secs(10))?;
        }
        // redis-cli waits for the nodes to join without end: a bound.
        let mut create = Command::new("timeout");
        create.args(["60", "redis-cli"]);
        if let Some(pki) = pki {
            create.args(["--tls", "--cacert", &pki.arg("ca.pem")]);
        }
        let out = create
            .args(["--cluster", "create"])
            .args(addresses(if pki.is_some() {
                &cluster.tls_ports
            } else {
                &cluster.ports
            }))
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

    /// Each live node's own `redis://` URL.
    pub fn node_urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// The seed list of every node, as `--redis-url` takes it.
    pub fn url(&self) -> String {
        format!("redis+cluster://{}", addresses(&self.ports).join(","))
    }

    /// The seed list of every node's TLS port (`rediss+cluster://`).
    pub fn tls_url(&self) -> String {
        format!("rediss+cluster://{}", addresses(&self.tls_ports).join(","))
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
        let lag = match lag {
            Some(lag) => Some((Self::replica_of(ask, victim)?, lag)),
            None => None,
        };
        let killed = kill_with_lag(victim, lag)?;
        self.ports.retain(|&p| p != victim);
        Ok(killed)
    }

    /// Moves `slot` with its keys to another master as `redis-cli --cluster reshard`
    /// does (the target importing, the source migrating, `MIGRATE` of `batch` keys at a
    /// time with `pause` between, then the slot given to the target on every master),
    /// while clients go on: meanwhile they meet `ASK` for keys already moved and
    /// `TRYAGAIN` for a multi-key command whose keys are split. Returns the source's and
    /// the target's ports.
    pub fn move_slot(&self, slot: u16, batch: usize, pause: Duration) -> Result<(u16, u16)> {
        let ask = self.ports[0];
        let from = Self::master_of(ask, slot)?.context("no master serves the slot")?;
        let nodes = node_command(ask, &["CLUSTER", "NODES"])?;
        let masters: Vec<(String, u16)> = nodes
            .lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .filter(|f| f.len() > 2 && f[2].contains("master") && !f[2].contains("fail"))
            .filter_map(|f| Some((f[0].to_owned(), node_port(f[1])?)))
            .collect();
        let id_of = |port: u16| {
            masters
                .iter()
                .find(|(_, p)| *p == port)
                .map(|(id, _)| id.clone())
                .context("not a master")
        };
        let to = masters
            .iter()
            .map(|(_, p)| *p)
            .find(|&p| p != from)
            .context("no other master")?;
        let (from_id, to_id) = (id_of(from)?, id_of(to)?);
        let slot_arg = slot.to_string();
        node_command(
            to,
            &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &from_id],
        )?;
        node_command(
            from,
            &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &to_id],
        )?;
        let client = redis::Client::open(format!("redis://127.0.0.1:{from}"))?;
        let mut c = client.get_connection_with_timeout(Duration::from_secs(2))?;
        loop {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(batch)
                .query(&mut c)?;
            if keys.is_empty() {
                break;
            }
            redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(to)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys)
                .query::<()>(&mut c)?;
            std::thread::sleep(pause);
        }
        // The target first, then the source, then the rest (as redis-cli does).
        let mut order = vec![to, from];
        order.extend(
            masters
                .iter()
                .map(|(_, p)| *p)
                .filter(|p| *p != to && *p != from),
        );
        for &port in &order {
            node_command(port, &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id])?;
        }
        // Done once every master names the target.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !order
            .iter()
            .all(|&port| Self::master_of(port, slot).ok().flatten() == Some(to))
        {
            if Instant::now() >= deadline {
                bail!("the masters do not agree slot {slot} is on :{to} after 10 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok((from, to))
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

fn addresses(ports: &[u16]) -> Vec<String> {
    ports.iter().map(|p| format!("127.0.0.1:{p}")).collect()
}
