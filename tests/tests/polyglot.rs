//! The Python example executor (`sdk-examples/python/executor.py`, on stubs generated
//! from `proto/`) against a real server and Redis: it registers with its handlers, a
//! `echo` run succeeds on it with the payload as output, a `fail` run with one
//! retry ends FAILED at attempt 2 with its error code, it reconnects when its server
//! dies and another starts on the same address, and it exits 0 on SIGTERM. Then the
//! end-to-end scenario the Go and Java examples pass too, with the Python receiver.
//!
//! The Python comes from `SUNDIAL_TEST_PYTHON` (`scripts/test` sets up the venv and
//! exports it); when unset, the test runs the same setup script itself.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use sundial_proto::v1 as pb;
use sundial_proto::v1::node_service_client::NodeServiceClient;
use sundial_tests::{RedisServer, Sundial, SundialOptions, wait_for, workspace_root};

const NODE: &str = "py-node-1";

/// The venv python that has the example's requirements, with the stubs generated.
fn python() -> Result<PathBuf> {
    sundial_tests::foreign::built(
        "SUNDIAL_TEST_PYTHON",
        "sdk-examples/python/setup.sh",
        &["target/py-venv"],
        "python3 with venv and PyPI access",
    )
}

/// A running `executor.py`; killed on drop if still running.
struct PyExecutor {
    child: Child,
    /// One message per `PY_EXECUTOR_READY` line (one per Welcome).
    ready: std::sync::mpsc::Receiver<()>,
    stderr_log: PathBuf,
    _dir: tempfile::TempDir,
}

impl PyExecutor {
    fn start(server: &Sundial) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let stderr_log = dir.path().join("stderr.log");
        let script = workspace_root().join("sdk-examples/python/executor.py");
        let mut child = Command::new(python()?)
            .arg(script)
            .args(["--endpoints", &server.grpc.to_string()])
            .args(["--group", "py", "--node-id", NODE])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_log)?)
            .spawn()
            .context("spawning executor.py")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line == format!("PY_EXECUTOR_READY {NODE}") {
                    let _ = tx.send(());
                }
            }
        });
        let mut me = Self {
            child,
            ready: rx,
            stderr_log,
            _dir: dir,
        };
        if let Err(e) = me.welcomed(Duration::from_secs(30)) {
            let _ = me.child.kill();
            return Err(e);
        }
        Ok(me)
    }

    /// Waits for the next `PY_EXECUTOR_READY` line.
    fn welcomed(&self, timeout: Duration) -> Result<()> {
        if self.ready.recv_timeout(timeout).is_err() {
            bail!(
                "executor.py not welcomed within {timeout:?}; stderr:\n{}",
                self.stderr()
            );
        }
        Ok(())
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }

    /// SIGTERM, then the exit status (SIGKILL and an error after `timeout`).
    fn terminate(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                self.child.kill()?;
                bail!("executor.py still running {timeout:?} after SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for PyExecutor {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn job(id: &str, handler: &str, payload: &[u8], max_retries: i32) -> pb::JobSpec {
    pb::JobSpec {
        id: id.into(),
        cron: sundial_tests::MANUAL_ONLY.into(),
        target: Some(pb::job_spec::Target::Executor(pb::ExecutorTarget {
            group: "py".into(),
            handler: handler.into(),
        })),
        payload: payload.to_vec(),
        retry: Some(pb::RetryPolicy {
            max_retries,
            backoff_ms: 100,
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_executor_runs_jobs_over_generated_stubs() -> Result<()> {
    let redis = RedisServer::start()?;
    let mut server = Sundial::start(
        SundialOptions::redis(&redis)
            .arg("heartbeat-interval", "300ms")
            .arg("sweep-every", "50ms")
            .arg("route-retry", "200ms"),
    )?;
    let mut py = PyExecutor::start(&server)?;

    // Registered, healthy, with its handlers.
    let nodes = NodeServiceClient::new(server.channel().await?);
    let node = wait_for("the python node healthy", Duration::from_secs(10), || {
        let mut nodes = nodes.clone();
        async move {
            let all = nodes
                .list_nodes(pb::ListNodesRequest::default())
                .await?
                .into_inner()
                .nodes;
            Ok(all
                .into_iter()
                .find(|n| n.node_id == NODE && n.health == pb::NodeHealth::Healthy as i32))
        }
    })
    .await?;
    ensure!(node.group == "py", "{node:?}");
    ensure!(node.handlers == ["echo", "sleep", "fail"], "{node:?}");

    // echo: SUCCEEDED on the python node, the payload back as output.
    let payload = b"hello from rust";
    server
        .create_job(job("py-echo", "echo", payload, 0))
        .await?;
    let sid = server.trigger("py-echo").await?;
    let run = server.finished(&sid).await?;
    ensure!(
        run.state == pb::RunState::Succeeded as i32,
        "{run:?}\nexecutor stderr:\n{}",
        py.stderr()
    );
    ensure!(run.output == payload, "output {:?}", run.output);
    ensure!(run.node_id == NODE, "ran on {:?}", run.node_id);
    ensure!(run.attempt == 1, "{run:?}");
    ensure!(
        run.started_at_ms > 0 && run.finished_at_ms >= run.started_at_ms,
        "{run:?}"
    );

    // fail with one retry: FAILED at attempt 2 with the handler's error code.
    server.create_job(job("py-fail", "fail", b"", 1)).await?;
    let sid = server.trigger("py-fail").await?;
    let run = server.finished(&sid).await?;
    ensure!(
        run.state == pb::RunState::Failed as i32,
        "{run:?}\nexecutor stderr:\n{}",
        py.stderr()
    );
    ensure!(run.attempt == 2, "{run:?}");
    ensure!(run.error_code == "py_fail", "{run:?}");
    ensure!(run.node_id == NODE, "{run:?}");

    // The server dies; on the same address a new one starts: the executor reconnects
    // (with backoff) and takes work again.
    server.kill()?;
    let mut again = server.opts.clone();
    again.port = Some(server.grpc.port());
    let server = Sundial::start(again)?;
    py.welcomed(Duration::from_secs(30))?;
    let sid = server.trigger("py-echo").await?;
    let run = server.finished(&sid).await?;
    ensure!(
        run.state == pb::RunState::Succeeded as i32 && run.output == payload,
        "{run:?}\nexecutor stderr:\n{}",
        py.stderr()
    );
    ensure!(run.node_id == NODE, "{run:?}");

    // SIGTERM: a clean exit.
    let status = py.terminate(Duration::from_secs(15))?;
    ensure!(
        status.success(),
        "executor.py exited with {status}; stderr:\n{}",
        py.stderr()
    );
    Ok(())
}

/// The scenario every foreign-language example passes ([`sundial_tests::foreign`]):
/// two server instances on Redis, two Python executors, the Python receiver, jobs
/// through grpcurl, a SIGKILL mid-run, a cancel, a SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_executors_and_receiver_end_to_end() -> Result<()> {
    let py = python()?.display().to_string();
    let script = |name: &str| {
        workspace_root()
            .join("sdk-examples/python")
            .join(name)
            .display()
            .to_string()
    };
    sundial_tests::foreign::end_to_end(&sundial_tests::foreign::Example {
        language: "py",
        executor: vec![py.clone(), script("executor.py")],
        receiver: vec![py, script("receiver.py")],
    })
    .await
}
