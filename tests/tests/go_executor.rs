//! The Go example (`sdk-examples/go`: package `sundial`, `cmd/executor`,
//! `cmd/receiver`, on stubs generated from `proto/`) end to end: the scenario of
//! [`sundial_tests::foreign`] (Redis, two server instances, two Go executors, the Go
//! receiver, jobs through grpcurl: a verified result stored once, a SIGKILLed holder's
//! run finishing as attempt 2 elsewhere, a cancelled handler, a clean SIGTERM).
//!
//! The binaries come from `SUNDIAL_TEST_GO_BIN` (`scripts/test` builds them with
//! `sdk-examples/go/build.sh`); when unset, the test runs that script itself.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, ensure};
use sundial_tests::foreign::{Example, end_to_end};
use sundial_tests::workspace_root;

/// The directory with the built `executor` and `receiver`.
fn go_bin() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("SUNDIAL_TEST_GO_BIN") {
        return Ok(PathBuf::from(p));
    }
    let root = workspace_root();
    eprintln!("SUNDIAL_TEST_GO_BIN is unset: running sdk-examples/go/build.sh target/go-bin");
    let out = Command::new(root.join("sdk-examples/go/build.sh"))
        .arg(root.join("target/go-bin"))
        .stderr(Stdio::inherit())
        .output()
        .context("running sdk-examples/go/build.sh")?;
    ensure!(
        out.status.success(),
        "sdk-examples/go/build.sh failed ({}): it needs Go, protoc and the Go module proxy",
        out.status
    );
    let stdout = String::from_utf8(out.stdout)?;
    Ok(PathBuf::from(
        stdout
            .lines()
            .last()
            .context("build.sh printed no path")?
            .trim(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_executors_and_receiver_end_to_end() -> Result<()> {
    let bin = go_bin()?;
    let path = |name: &str| bin.join(name).display().to_string();
    end_to_end(&Example {
        language: "go",
        executor: vec![path("executor")],
        receiver: vec![path("receiver")],
    })
    .await
}
