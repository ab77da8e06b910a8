//! What a scenario's runs cost, over a window: Redis commands per run by name, script
//! calls per run, Redis CPU and the servers' CPU per run; with `--monitor`, the
//! commands split into the servers' round trips and the commands their scripts ran;
//! and `redis-benchmark` on the same Redis, so each figure can be read against the
//! machine.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use sundial_tests::TestExecutor;

use crate::rig::{Rig, info_field, redis_info};

/// What `redis-benchmark -q -t set,zadd -P 16` says of the rig's Redis before the
/// scenario: the ceiling of one Redis core on this machine.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RedisCeiling {
    pub set_per_s: f64,
    pub zadd_per_s: f64,
}

impl RedisCeiling {
    /// The report line, when there is a Redis to measure.
    pub fn print(ceiling: Option<Self>) {
        if let Some(c) = ceiling {
            println!(
                "  machine: redis-benchmark -P 16 SET {:.0}/s, ZADD {:.0}/s",
                c.set_per_s, c.zadd_per_s
            );
        }
    }

    /// `redis-benchmark` on the rig's Redis (none on the embedded store). Its keys stay,
    /// but are not the servers'.
    pub fn of(rig: &Rig) -> Result<Option<Self>> {
        rig.redis_port().map(Self::measure).transpose()
    }

    /// Runs `redis-benchmark` against the Redis on `port` (100,000 requests each).
    pub fn measure(port: u16) -> Result<Self> {
        let out = Command::new("redis-benchmark")
            .args(["-p", &port.to_string(), "-q", "-t", "set,zadd", "-P", "16"])
            .args(["-n", "100000"])
            .stderr(Stdio::null())
            .output()
            .context("running redis-benchmark (Debian's redis-tools, with redis-server)")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let rate = |name: &str| -> Result<f64> {
            // Progress lines end in '\r'; the result line is "SET: 806451.62 requests
            // per second, p50=…".
            text.split(['\r', '\n'])
                .find_map(|l| {
                    let rest = l.trim().strip_prefix(name)?.strip_prefix(": ")?;
                    rest.split_once(" requests per second")?.0.parse().ok()
                })
                .with_context(|| format!("redis-benchmark printed no {name} rate: {text}"))
        };
        Ok(Self {
            set_per_s: rate("SET")?,
            zadd_per_s: rate("ZADD")?,
        })
    }
}

/// The costs of the runs of one window, per run.
#[derive(Debug, Default, Serialize)]
pub struct Costs {
    /// Every command Redis ran (`INFO commandstats` counts those inside scripts too).
    pub redis_commands_per_run: Option<f64>,
    /// `fcall` (and `eval`/`evalsha`) calls: the round trips that carry the run machine.
    pub redis_script_calls_per_run: Option<f64>,
    /// With `--monitor`: the commands the servers sent (round trips, pipelined or not)…
    pub redis_round_trips_per_run: Option<f64>,
    /// …and the ones their scripts ran.
    pub redis_in_scripts_per_run: Option<f64>,
    /// Each Redis server's commands per run (a cluster: per master).
    pub redis_commands_per_run_by_node: Vec<f64>,
    /// Every command called at least once per twenty runs, per run, most called first.
    pub redis_top_commands_per_run: Vec<(String, f64)>,
    pub redis_cpu_us_per_run: Option<f64>,
    /// Redis's time inside one script call (`INFO commandstats` usec / calls of `fcall`,
    /// `evalsha` and `eval`), the commands it ran included.
    pub redis_us_per_script_call: Option<f64>,
    /// Redis CPU per run as pipelined SETs of `redis-benchmark` it could have run.
    pub redis_cpu_per_run_in_sets: Option<f64>,
    /// The servers' CPU (user + sys, all instances) per run.
    pub server_cpu_us_per_run: f64,
    /// The `test_executor` processes' CPU per run (the SDK's stream, the no-op handler
    /// and the journal line each start and finish writes).
    pub executor_cpu_us_per_run: f64,
    /// Redis, the servers and the executors together, per run: what the machine's
    /// cores are shared by (the benchmark's own reading of journals is not counted).
    pub all_cpu_us_per_run: f64,
    /// The embedded store's commits (journal syncs) per run, from `sundial_store_commits_total`.
    pub store_commits_per_run: Option<f64>,
    /// The embedded store's writer: writes applied per commit, µs applying one, ms
    /// committing one (`sundial_store_commit_steps_total`, `…_applying_seconds_total`,
    /// `…_committing_seconds_total`).
    pub store_steps_per_commit: Option<f64>,
    pub store_applying_us_per_step: Option<f64>,
    pub store_committing_ms_per_commit: Option<f64>,
    /// The embedded store's checkpoints in the window (its file synced, its journal
    /// emptied) and ms each (`sundial_store_checkpoints_total`,
    /// `…_checkpointing_seconds_total`).
    pub store_checkpoints: Option<f64>,
    pub store_checkpoint_ms_each: Option<f64>,
    /// Bytes the servers wrote to disk per run (`write_bytes` of `/proc/<pid>/io`, as
    /// their pages are dirtied): the embedded store's pages; on Redis, about none.
    pub server_bytes_written_per_run: Option<f64>,
    pub redis_ceiling: Option<RedisCeiling>,
}

impl Costs {
    pub fn print(&self) {
        RedisCeiling::print(self.redis_ceiling);
        if let (Some(cmds), Some(scripts), Some(cpu)) = (
            self.redis_commands_per_run,
            self.redis_script_calls_per_run,
            self.redis_cpu_us_per_run,
        ) {
            let sets = self
                .redis_cpu_per_run_in_sets
                .map_or(String::new(), |s| format!(" (= {s:.0} pipelined SETs)"));
            let inside = self
                .redis_us_per_script_call
                .map_or(String::new(), |us| format!(" ({us:.1} µs inside each)"));
            println!(
                "  Redis per run: {cmds:.1} commands, {scripts:.1} script calls{inside}, {cpu:.0} µs CPU{sets}"
            );
            if let (Some(trips), Some(inside)) = (
                self.redis_round_trips_per_run,
                self.redis_in_scripts_per_run,
            ) {
                println!(
                    "    by MONITOR: {trips:.1} sent by the servers, {inside:.1} run inside scripts"
                );
            }
            if self.redis_commands_per_run_by_node.len() > 1 {
                let each: Vec<String> = self
                    .redis_commands_per_run_by_node
                    .iter()
                    .map(|n| format!("{n:.1}"))
                    .collect();
                println!("    commands per run on each master: {}", each.join(" / "));
            }
            let top: Vec<String> = self
                .redis_top_commands_per_run
                .iter()
                .map(|(n, v)| format!("{n} {v:.1}"))
                .collect();
            println!("    by name: {}", top.join(", "));
        }
        println!(
            "  server CPU per run: {:.0} µs; executors' {:.0} µs; all processes' (Redis, servers, executors) {:.0} µs",
            self.server_cpu_us_per_run, self.executor_cpu_us_per_run, self.all_cpu_us_per_run
        );
        if let Some(commits) = self.store_commits_per_run {
            println!("  store commits (journal syncs) per run: {commits:.3}");
        }
        if let (Some(steps), Some(applying), Some(committing)) = (
            self.store_steps_per_commit,
            self.store_applying_us_per_step,
            self.store_committing_ms_per_commit,
        ) {
            println!(
                "  store writer: {steps:.1} writes per commit, {applying:.1} µs applying each, {committing:.2} ms committing each commit"
            );
        }
        if let Some(n) = self.store_checkpoints {
            let each = self
                .store_checkpoint_ms_each
                .map_or(String::new(), |ms| format!(", {ms:.1} ms each"));
            println!("  store checkpoints: {n:.0}{each}");
        }
        if let Some(bytes) = self.server_bytes_written_per_run {
            println!("  servers wrote {:.1} KiB to disk per run", bytes / 1024.0);
        }
    }
}

/// Readings at the start of a window.
pub struct CostProbe {
    /// Per Redis server (each master of a cluster): its URL, commands, CPU and script
    /// time at the start.
    redis: Vec<(String, BTreeMap<String, u64>, u64, ScriptTime)>,
    /// Where to read the store's commit totals, and what they were at the start.
    commits: Option<(Vec<String>, StoreTotals)>,
    pids: Vec<u32>,
    /// The servers' bytes written to disk at the start.
    written: Option<u64>,
    server_cpu: u64,
    executor_pids: Vec<u32>,
    executor_cpu: u64,
    monitor: Option<Monitor>,
    ceiling: Option<RedisCeiling>,
}

impl CostProbe {
    /// Starts a window now (and `MONITOR`, when `monitor`).
    pub async fn start(rig: &Rig, ceiling: Option<RedisCeiling>, monitor: bool) -> Result<Self> {
        let mut redis = Vec::new();
        for url in rig.redis_nodes() {
            let calls = commandstats(&url).await?;
            let cpu = redis_cpu_us(&url).await?;
            let scripts = script_time(&url).await?;
            redis.push((url, calls, cpu, scripts));
        }
        let monitor = match (monitor, rig.redis_port()) {
            (true, Some(port)) => Some(Monitor::start(port)?),
            _ => None,
        };
        let pids: Vec<u32> = rig
            .instances
            .iter()
            .map(sundial_tests::Sundial::pid)
            .collect();
        let server_cpu = processes_cpu_us(&pids)?;
        let executor_pids: Vec<u32> = rig.executors.iter().map(TestExecutor::pid).collect();
        let executor_cpu = processes_cpu_us(&executor_pids)?;
        let commits = match rig.redis_nodes().first() {
            Some(_) => None,
            None => {
                let urls = rig
                    .instances
                    .iter()
                    .map(|s| s.http_url().map(|u| format!("{u}/metrics")))
                    .collect::<Option<Vec<_>>>()
                    .context("http is on")?;
                // A server without the counter (an older build) reports no figure.
                store_totals(&urls).await?.map(|before| (urls, before))
            }
        };
        let written = bytes_written(&pids);
        Ok(Self {
            redis,
            commits,
            pids,
            written,
            server_cpu,
            executor_pids,
            executor_cpu,
            monitor,
            ceiling,
        })
    }

    /// Ends the window: the costs per run of `runs`.
    pub async fn finish(self, runs: usize) -> Result<Costs> {
        let per_run = |n: f64| n / runs.max(1) as f64;
        let server_cpu = processes_cpu_us(&self.pids)?.saturating_sub(self.server_cpu);
        let executor_cpu = processes_cpu_us(&self.executor_pids)?.saturating_sub(self.executor_cpu);
        let mut costs = Costs {
            server_cpu_us_per_run: per_run(server_cpu as f64),
            executor_cpu_us_per_run: per_run(executor_cpu as f64),
            all_cpu_us_per_run: per_run((server_cpu + executor_cpu) as f64),
            redis_ceiling: self.ceiling,
            ..Costs::default()
        };
        if let Some((urls, before)) = &self.commits
            && let Some(after) = store_totals(urls).await?
        {
            let commits = after.commits - before.commits;
            let steps = after.steps - before.steps;
            costs.store_commits_per_run = Some(per_run(commits));
            if commits > 0.0 && steps > 0.0 {
                costs.store_steps_per_commit = Some(steps / commits);
                costs.store_applying_us_per_step =
                    Some((after.applying_s - before.applying_s) * 1e6 / steps);
                costs.store_committing_ms_per_commit =
                    Some((after.committing_s - before.committing_s) * 1e3 / commits);
            }
            let checkpoints = after.checkpoints - before.checkpoints;
            costs.store_checkpoints = Some(checkpoints);
            if checkpoints > 0.0 {
                costs.store_checkpoint_ms_each =
                    Some((after.checkpointing_s - before.checkpointing_s) * 1e3 / checkpoints);
            }
        }
        if let (Some(before), Some(after)) = (self.written, bytes_written(&self.pids)) {
            costs.server_bytes_written_per_run = Some(per_run(after.saturating_sub(before) as f64));
        }
        if let Some(monitor) = self.monitor {
            let (trips, inside) = monitor.stop()?;
            costs.redis_round_trips_per_run = Some(per_run(trips as f64));
            costs.redis_in_scripts_per_run = Some(per_run(inside as f64));
        }
        if self.redis.is_empty() {
            return Ok(costs);
        }
        let mut delta: BTreeMap<String, u64> = BTreeMap::new();
        let (mut cpu_us, mut script_calls, mut script_usec) = (0, 0, 0);
        for (url, calls_before, cpu_before, scripts_before) in &self.redis {
            let node = calls_since(calls_before, &commandstats(url).await?);
            costs
                .redis_commands_per_run_by_node
                .push(per_run(node.values().map(|n| *n as f64).sum()));
            for (name, n) in node {
                *delta.entry(name).or_default() += n;
            }
            cpu_us += redis_cpu_us(url).await?.saturating_sub(*cpu_before);
            let scripts = script_time(url).await?;
            script_calls += scripts.calls.saturating_sub(scripts_before.calls);
            script_usec += scripts.usec.saturating_sub(scripts_before.usec);
        }
        let delta: Vec<(String, f64)> = delta
            .into_iter()
            .map(|(name, n)| (name, per_run(n as f64)))
            .collect();
        costs.redis_commands_per_run = Some(delta.iter().map(|(_, v)| v).sum());
        costs.redis_script_calls_per_run = Some(
            delta
                .iter()
                .filter(|(n, _)| n.starts_with("eval") || n.starts_with("fcall"))
                .map(|(_, v)| v)
                .sum(),
        );
        let mut sorted = delta;
        sorted.sort_by(|a, b| b.1.total_cmp(&a.1));
        sorted.retain(|(_, v)| *v >= 0.05);
        costs.redis_top_commands_per_run = sorted;
        let cpu = per_run(cpu_us as f64);
        costs.redis_cpu_us_per_run = Some(cpu);
        costs.all_cpu_us_per_run += cpu;
        costs.redis_us_per_script_call =
            (script_calls > 0).then(|| script_usec as f64 / script_calls as f64);
        costs.redis_cpu_per_run_in_sets = self.ceiling.map(|c| cpu * c.set_per_s / 1e6);
        Ok(costs)
    }
}

/// `redis-cli monitor`, its lines counted by where each command came from: a script
/// (`[0 lua]`) or a client (`[0 127.0.0.1:5555]`).
struct Monitor {
    child: Child,
    counter: JoinHandle<(u64, u64)>,
}

impl Monitor {
    fn start(port: u16) -> Result<Self> {
        let mut child = Command::new("redis-cli")
            .args(["-p", &port.to_string(), "monitor"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("running redis-cli monitor")?;
        let mut lines = BufReader::new(child.stdout.take().context("monitor's stdout")?).lines();
        // Commands are shown from the "OK" on.
        match lines.next() {
            Some(Ok(l)) if l.trim() == "OK" => {}
            other => bail!("redis-cli monitor began with {other:?}"),
        }
        let counter = std::thread::spawn(move || {
            let (mut trips, mut inside) = (0, 0);
            for line in lines.map_while(std::io::Result::ok) {
                match source(&line) {
                    Some(Source::Script) => inside += 1,
                    Some(Source::Client) => trips += 1,
                    None => {}
                }
            }
            (trips, inside)
        });
        Ok(Self { child, counter })
    }

    /// Stops monitoring: (commands sent by clients, commands run inside scripts).
    fn stop(mut self) -> Result<(u64, u64)> {
        self.child.kill()?;
        self.child.wait()?;
        self.counter
            .join()
            .map_err(|_| anyhow::anyhow!("the monitor's counter panicked"))
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Source {
    Script,
    Client,
}

/// Where a `MONITOR` line's command came from: `1700000000.123456 [0 lua] "zadd" …`.
fn source(line: &str) -> Option<Source> {
    let (_, rest) = line.split_once(" [")?;
    let (origin, _) = rest.split_once(']')?;
    let (_, from) = origin.split_once(' ')?;
    Some(if from == "lua" {
        Source::Script
    } else {
        Source::Client
    })
}

/// The calls per command between two `commandstats` readings, commands not called
/// left out.
pub fn calls_since(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(name, n)| {
            let d = n.saturating_sub(before.get(name).copied().unwrap_or(0));
            (name.clone(), d)
        })
        .filter(|(_, d)| *d > 0)
        .collect()
}

/// Calls per command since Redis started (`INFO commandstats`).
pub async fn commandstats(url: &str) -> Result<BTreeMap<String, u64>> {
    let info = redis_info(url, "commandstats").await?;
    let mut out = BTreeMap::new();
    for line in info.lines() {
        let Some((name, fields)) = line
            .strip_prefix("cmdstat_")
            .and_then(|rest| rest.split_once(':'))
        else {
            continue;
        };
        let calls = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        out.insert(name.to_owned(), calls);
    }
    Ok(out)
}

/// Script calls and the time Redis spent in them, since it started.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScriptTime {
    pub calls: u64,
    pub usec: u64,
}

impl ScriptTime {
    /// What was spent between an `earlier` reading and this one.
    pub fn since(self, earlier: Self) -> Self {
        Self {
            calls: self.calls.saturating_sub(earlier.calls),
            usec: self.usec.saturating_sub(earlier.usec),
        }
    }

    pub fn add(&mut self, other: Self) {
        self.calls += other.calls;
        self.usec += other.usec;
    }
}

/// `INFO commandstats`' calls and usec of `fcall`, `evalsha` and `eval`, summed.
pub async fn script_time(url: &str) -> Result<ScriptTime> {
    let info = redis_info(url, "commandstats").await?;
    let mut total = ScriptTime::default();
    for line in info.lines() {
        let Some(fields) = ["cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"]
            .iter()
            .find_map(|p| line.strip_prefix(p))
        else {
            continue;
        };
        let field = |name: &str| -> u64 {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix(name))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        total.calls += field("calls=");
        total.usec += field("usec=");
    }
    Ok(total)
}

/// The embedded store's commit totals, summed over the instances.
#[derive(Debug, Clone, Copy, Default)]
struct StoreTotals {
    commits: f64,
    steps: f64,
    applying_s: f64,
    committing_s: f64,
    checkpoints: f64,
    checkpointing_s: f64,
}

/// The store's commit totals (`sundial_store_commits_total` and the writer's figures
/// beside it) summed over the instances' `/metrics`; None when no instance reports
/// commits (Redis, or an older build). A build without the writer's figures reads 0.
async fn store_totals(urls: &[String]) -> Result<Option<StoreTotals>> {
    let mut total: Option<StoreTotals> = None;
    for url in urls {
        let text = reqwest::get(url).await?.text().await?;
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse::<f64>().ok())
        };
        let Some(commits) = value("sundial_store_commits_total") else {
            continue;
        };
        let t = total.get_or_insert_default();
        t.commits += commits;
        t.steps += value("sundial_store_commit_steps_total").unwrap_or(0.0);
        t.applying_s += value("sundial_store_applying_seconds_total").unwrap_or(0.0);
        t.committing_s += value("sundial_store_committing_seconds_total").unwrap_or(0.0);
        t.checkpoints += value("sundial_store_checkpoints_total").unwrap_or(0.0);
        t.checkpointing_s += value("sundial_store_checkpointing_seconds_total").unwrap_or(0.0);
    }
    Ok(total)
}

/// The bytes these processes caused to be written to disk so far (`write_bytes` of
/// `/proc/<pid>/io`), or None where that cannot be read.
fn bytes_written(pids: &[u32]) -> Option<u64> {
    let mut total = 0;
    for pid in pids {
        let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
        total += io
            .lines()
            .find_map(|l| l.strip_prefix("write_bytes:"))
            .and_then(|v| v.trim().parse::<u64>().ok())?;
    }
    Some(total)
}

/// Redis's own CPU so far (`used_cpu_user` + `used_cpu_sys`), µs.
async fn redis_cpu_us(url: &str) -> Result<u64> {
    let info = redis_info(url, "cpu").await?;
    let field = |name| info_field(&info, name).unwrap_or(0.0);
    Ok(((field("used_cpu_user") + field("used_cpu_sys")) * 1e6) as u64)
}

/// The CPU (utime + stime) of these processes so far, µs, from `/proc/<pid>/stat`
/// (in clock ticks of 1/100 s, Linux's `USER_HZ`).
pub fn processes_cpu_us(pids: &[u32]) -> Result<u64> {
    let mut total = 0;
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // Fields after the command name (which is in parentheses and may hold spaces).
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the whole line: 12 and 13 here.
        let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
            + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
        total += ticks * 10_000;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_lines_by_source() {
        assert_eq!(
            source(r#"1700000000.123456 [0 lua] "zadd" "k" "1" "m""#),
            Some(Source::Script)
        );
        assert_eq!(
            source(r#"1700000000.123456 [0 127.0.0.1:5555] "evalsha" "ab" "0""#),
            Some(Source::Client)
        );
        assert_eq!(source("OK"), None);
    }
}
