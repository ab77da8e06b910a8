//! The Java example (`sdk-examples/java`: package `dev.sundial.executor`, the
//! example's `Main` and `Receiver`, on stubs generated from `proto/` by Maven) end to
//! end: the scenario of [`sundial_tests::foreign`] (Redis, two server instances, two
//! Java executors, the Java receiver, jobs through grpcurl: a verified result stored
//! once, a SIGKILLed holder's run finishing as attempt 2 elsewhere, an interrupted
//! handler, a clean SIGTERM).
//!
//! The jar comes from `SUNDIAL_TEST_JAVA_JAR` (`scripts/test` builds it with
//! `sdk-examples/java/build.sh`); when unset, the test runs that script itself.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, ensure};
use sundial_tests::foreign::{Example, end_to_end};
use sundial_tests::workspace_root;

/// The shaded jar with the executor and the receiver.
fn java_jar() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("SUNDIAL_TEST_JAVA_JAR") {
        return Ok(PathBuf::from(p));
    }
    let root = workspace_root();
    eprintln!("SUNDIAL_TEST_JAVA_JAR is unset: running sdk-examples/java/build.sh");
    let out = Command::new(root.join("sdk-examples/java/build.sh"))
        .stderr(Stdio::inherit())
        .output()
        .context("running sdk-examples/java/build.sh")?;
    ensure!(
        out.status.success(),
        "sdk-examples/java/build.sh failed ({}): it needs a JDK 17, Maven and Maven Central",
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
async fn java_executors_and_receiver_end_to_end() -> Result<()> {
    let jar = java_jar()?.display().to_string();
    let java = |class: &str| {
        vec![
            "java".to_owned(),
            "-cp".to_owned(),
            jar.clone(),
            class.to_owned(),
        ]
    };
    end_to_end(&Example {
        language: "java",
        executor: java("dev.sundial.example.Main"),
        receiver: java("dev.sundial.example.Receiver"),
    })
    .await
}
