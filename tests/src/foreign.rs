//! The end-to-end proof for an example executor and webhook receiver written in another
//! language (`sdk-examples/go`, `sdk-examples/java`), the same for each: Redis, two
//! server instances, two executors of the language in one group (each told both
//! endpoints), its webhook receiver, and every job call made with grpcurl as a user
//! would.
//!
//! - An `echo` run SUCCEEDED with the payload as output; the receiver verified both
//!   signature schemes and stored it once; GetRun shows CALLBACK_STATE_DONE.
//! - SIGKILL the executor holding a `sleep` run: the run finishes on the other as
//!   attempt 2, and the receiver gets exactly one result for it.
//! - CancelRun on a running `sleep`: the handler is cancelled (its "sleep cancelled"
//!   log line names the run) and the run ends CANCELLED.
//! - SIGTERM: the surviving executor exits 0.
//!
//! What each example must offer: an executor taking `--endpoints a,b --group G
//! --node-id N` with handlers `echo`, `sleep` (payload = milliseconds) and `fail`, which
//! logs a line with "sleep cancelled" and the schedule_id to stderr when a sleep is
//! cancelled; a receiver taking `--listen host:port --store file` and the secret in
//! `SUNDIAL_WEBHOOK_SECRET`, taking POST /webhook and answering GET /results with
//! `[{"webhook_id", "verified": ["standard", "classic"], "deliveries", "body"}]`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use base64::Engine as _;
use serde_json::{Value, json};

use crate::{RedisServer, Sundial, SundialOptions, free_port, wait_for};

const SECRET: &str = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

/// One language's example, as the scenario starts it.
pub struct Example {
    /// Short and lowercase: the group, and the prefix of node and job ids.
    pub language: &'static str,
    /// The executor's program and the arguments before the common flags.
    pub executor: Vec<String>,
    /// The receiver's program and the arguments before the common flags.
    pub receiver: Vec<String>,
}

/// What an example's set-up script built: the path in `env_var` when set (scripts/test
/// runs the script once and exports it), else the script run here (`script` relative
/// to the workspace, with `args`), whose last stdout line is the path. `needs` says
/// what the script needs when it fails. The script runs at most once per test process
/// (tests of one binary run in parallel, and a set-up script regenerates its stubs).
pub fn built(env_var: &str, script: &str, args: &[&str], needs: &str) -> Result<PathBuf> {
    static BUILT: std::sync::Mutex<BTreeMap<String, PathBuf>> =
        std::sync::Mutex::new(BTreeMap::new());
    if let Ok(p) = std::env::var(env_var) {
        return Ok(PathBuf::from(p));
    }
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.get(script) {
        return Ok(p.clone());
    }
    let root = crate::workspace_root();
    eprintln!(
        "{env_var} is unset: running {script} {} (scripts/test does this and exports it)",
        args.join(" ")
    );
    let out = Command::new(root.join(script))
        .args(args)
        .current_dir(&root)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {script}"))?;
    ensure!(
        out.status.success(),
        "{script} failed ({}): it needs {needs}; run scripts/test, or set {env_var}",
        out.status
    );
    let stdout = String::from_utf8(out.stdout)?;
    let line = stdout
        .lines()
        .last()
        .with_context(|| format!("{script} printed no path"))?;
    let path = PathBuf::from(line.trim());
    built.insert(script.to_owned(), path.clone());
    Ok(path)
}

/// grpcurl from PATH, or where `go install` puts it; looked up once per test process.
pub fn grpcurl_bin() -> Result<PathBuf> {
    static BIN: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        if Command::new("grpcurl").arg("-version").output().is_ok() {
            return Ok(PathBuf::from("grpcurl"));
        }
        let gopath = Command::new("go")
            .args(["env", "GOPATH"])
            .output()
            .map_err(|e| format!("go env GOPATH: {e}"))?;
        let p = PathBuf::from(String::from_utf8_lossy(&gopath.stdout).trim()).join("bin/grpcurl");
        if !p.exists() {
            return Err("grpcurl is missing: scripts/test installs it (go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4)".to_owned());
        }
        Ok(p)
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// One grpcurl call against `server`, its JSON answer.
pub fn grpcurl(server: &Sundial, method: &str, body: &Value) -> Result<Value> {
    let out = Command::new(grpcurl_bin()?)
        .args(["-plaintext", "-d", &body.to_string()])
        .arg(server.grpc.to_string())
        .arg(method)
        .output()
        .with_context(|| format!("running grpcurl {method}"))?;
    ensure!(
        out.status.success(),
        "grpcurl {method} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// A process of the example; SIGKILLed on drop if still running.
struct Proc {
    child: Child,
    stderr_log: PathBuf,
    name: String,
}

impl Proc {
    fn start(
        command: &[String],
        args: &[&str],
        env: &[(&str, &str)],
        dir: &Path,
        name: &str,
    ) -> Result<Self> {
        let (program, fixed) = command.split_first().context("an empty command")?;
        let stderr_log = dir.join(format!("{name}.stderr"));
        let mut cmd = Command::new(program);
        cmd.args(fixed)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_log)?);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().with_context(|| format!("spawning {program}"))?;
        // Drain stdout (readiness lines) so the process never blocks on it.
        let stdout = child.stdout.take().context("no stdout")?;
        std::thread::spawn(
            move || for _ in BufReader::new(stdout).lines().map_while(Result::ok) {},
        );
        Ok(Self {
            child,
            stderr_log,
            name: name.to_owned(),
        })
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }

    fn signal(&self, sig: &str) -> Result<()> {
        let status = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()?;
        ensure!(status.success(), "kill -{sig} failed");
        Ok(())
    }

    async fn wait_exit(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        wait_for("the process to exit", timeout, || {
            let done = self.child.try_wait();
            async move { Ok(done?) }
        })
        .await
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spec(
    group: &str,
    id: &str,
    handler: &str,
    payload: &[u8],
    callback: &str,
    retries: i32,
) -> Value {
    json!({"spec": {
        "id": id,
        "cron": crate::MANUAL_ONLY,
        "executor": {"group": group, "handler": handler},
        "payload": base64::engine::general_purpose::STANDARD.encode(payload),
        "callback_url": callback,
        "retry": {"max_retries": retries, "backoff_ms": 100},
    }})
}

fn trigger(server: &Sundial, job_id: &str) -> Result<String> {
    let answer = grpcurl(
        server,
        "sundial.v1.JobService/TriggerJob",
        &json!({"job_id": job_id}),
    )?;
    Ok(answer["scheduleId"]
        .as_str()
        .context("TriggerJob answered no scheduleId")?
        .to_owned())
}

fn get_run(server: &Sundial, schedule_id: &str) -> Result<Value> {
    let answer = grpcurl(
        server,
        "sundial.v1.RunService/GetRun",
        &json!({"schedule_id": schedule_id}),
    )?;
    Ok(answer["run"].clone())
}

async fn run_in_state(server: &Sundial, schedule_id: &str, state: &str) -> Result<Value> {
    wait_for(
        &format!("{schedule_id} to be {state}"),
        Duration::from_secs(60),
        || async {
            let run = get_run(server, schedule_id)?;
            Ok((run["state"] == state).then_some(run))
        },
    )
    .await
}

/// The receiver's stored results (GET /results).
async fn stored(receiver: &str) -> Result<Vec<Value>> {
    let body = reqwest::get(format!("{receiver}/results"))
        .await?
        .text()
        .await?;
    Ok(serde_json::from_str(&body)?)
}

async fn stored_for(receiver: &str, schedule_id: &str) -> Result<Value> {
    wait_for(
        &format!("the receiver to store {schedule_id}"),
        Duration::from_secs(30),
        || async {
            Ok(stored(receiver)
                .await?
                .into_iter()
                .find(|r| r["webhook_id"] == schedule_id))
        },
    )
    .await
}

/// Runs the scenario of the module doc against one language's example.
pub async fn end_to_end(example: &Example) -> Result<()> {
    let lang = example.language;
    let dir = tempfile::tempdir()?;
    let redis = RedisServer::start()?;
    let opts = |instance: &str| {
        SundialOptions::redis(&redis)
            .arg("instance-id", instance)
            .arg("heartbeat-interval", "500ms")
            .arg("sweep-every", "50ms")
            .arg("webhook-secret", SECRET)
            .arg("webhook-allow", "127.0.0.0/8")
            .arg("webhook-retry-schedule", "200ms,500ms,1s")
    };
    let a = Sundial::start(opts("a"))?;
    let b = Sundial::start(opts("b"))?;

    let port = free_port()?;
    let receiver_url = format!("http://127.0.0.1:{port}");
    let results = dir.path().join("results.jsonl");
    let receiver = Proc::start(
        &example.receiver,
        &[
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--store",
            results.to_str().context("path")?,
        ],
        &[("SUNDIAL_WEBHOOK_SECRET", SECRET)],
        dir.path(),
        "receiver",
    )?;
    wait_for("the receiver", Duration::from_secs(60), || async {
        Ok(stored(&receiver_url).await.ok().map(|_| ()))
    })
    .await
    .with_context(|| format!("receiver log:\n{}", receiver.stderr()))?;
    let callback = format!("{receiver_url}/webhook");

    let endpoints = [
        format!("{},{}", a.grpc, b.grpc),
        format!("{},{}", b.grpc, a.grpc),
    ];
    let mut execs = Vec::new();
    for (i, endpoints) in endpoints.iter().enumerate() {
        let node = format!("{lang}-{}", i + 1);
        let args = [
            "--endpoints",
            endpoints,
            "--group",
            lang,
            "--node-id",
            &node,
        ];
        execs.push(Proc::start(
            &example.executor,
            &args,
            &[],
            dir.path(),
            &node,
        )?);
    }
    wait_for(
        &format!("both {lang} executors listed"),
        Duration::from_secs(60),
        || async {
            let nodes = grpcurl(&a, "sundial.v1.NodeService/ListNodes", &json!({}))?;
            let n = nodes["nodes"].as_array().map_or(0, |v| v.len());
            Ok((n == 2).then_some(()))
        },
    )
    .await
    .with_context(|| format!("executor log:\n{}", execs[0].stderr()))?;

    // 1. echo: SUCCEEDED with the payload, both schemes verified, stored once, DONE.
    let payload = format!("hello from {lang}");
    let job = format!("{lang}-echo");
    let echo = spec(lang, &job, "echo", payload.as_bytes(), &callback, 0);
    grpcurl(&a, "sundial.v1.JobService/CreateJob", &echo)?;
    let sid = trigger(&b, &job)?;
    let run = run_in_state(&a, &sid, "RUN_STATE_SUCCEEDED").await?;
    ensure!(
        run["output"] == base64::engine::general_purpose::STANDARD.encode(&payload),
        "output: {run}"
    );
    let kept = stored_for(&receiver_url, &sid).await?;
    ensure!(
        kept["verified"] == json!(["standard", "classic"]),
        "verified: {kept}"
    );
    ensure!(kept["deliveries"] == 1, "deliveries: {kept}");
    ensure!(kept["body"]["status"] == "SUCCEEDED", "body: {kept}");
    wait_for("CALLBACK_STATE_DONE", Duration::from_secs(20), || async {
        Ok((get_run(&a, &sid)?["callbackState"] == "CALLBACK_STATE_DONE").then_some(()))
    })
    .await?;

    // 2. SIGKILL the holder of a sleep run: attempt 2 on the other, one result.
    let job = format!("{lang}-sleep");
    let sleep = spec(lang, &job, "sleep", b"3000", &callback, 1);
    grpcurl(&a, "sundial.v1.JobService/CreateJob", &sleep)?;
    let sid = trigger(&a, &job)?;
    let running = run_in_state(&a, &sid, "RUN_STATE_RUNNING").await?;
    let holder = running["nodeId"].as_str().context("no nodeId")?.to_owned();
    let dead = execs
        .iter()
        .position(|e| e.name == holder)
        .with_context(|| format!("held by {holder}"))?;
    let alive = 1 - dead;
    execs[dead].signal("KILL")?;
    let run = run_in_state(&a, &sid, "RUN_STATE_SUCCEEDED").await?;
    ensure!(
        run["attempt"] == 2 && run["nodeId"] == execs[alive].name.as_str(),
        "after the kill: {run}"
    );
    let kept = stored_for(&receiver_url, &sid).await?;
    ensure!(kept["body"]["attempt"] == 2, "stored: {kept}");
    // Whatever could still arrive late would be a second result: give it a moment.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let for_run: Vec<Value> = stored(&receiver_url)
        .await?
        .into_iter()
        .filter(|r| r["webhook_id"] == sid.as_str())
        .collect();
    ensure!(
        for_run.len() == 1 && for_run[0]["deliveries"] == 1,
        "the receiver got {for_run:?}"
    );

    // 3. Cancel a running sleep: the handler is cancelled, the run ends CANCELLED.
    let job = format!("{lang}-long");
    let long = spec(lang, &job, "sleep", b"60000", &callback, 0);
    grpcurl(&a, "sundial.v1.JobService/CreateJob", &long)?;
    let sid = trigger(&a, &job)?;
    run_in_state(&a, &sid, "RUN_STATE_RUNNING").await?;
    grpcurl(
        &b,
        "sundial.v1.RunService/CancelRun",
        &json!({"schedule_id": sid}),
    )?;
    run_in_state(&a, &sid, "RUN_STATE_CANCELLED").await?;
    let survivor = &execs[alive];
    wait_for("the handler cancelled", Duration::from_secs(20), || async {
        let log = survivor.stderr();
        Ok(log
            .lines()
            .any(|l| l.contains("sleep cancelled") && l.contains(&sid))
            .then_some(()))
    })
    .await
    .with_context(|| format!("executor log:\n{}", survivor.stderr()))?;

    // 4. SIGTERM: drains and exits 0.
    execs[alive].signal("TERM")?;
    let status = execs[alive].wait_exit(Duration::from_secs(30)).await?;
    if !status.success() {
        bail!(
            "the {lang} executor exited {status}:\n{}",
            execs[alive].stderr()
        );
    }
    Ok(())
}
