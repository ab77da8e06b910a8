//! The Java example (`sdk-examples/java`: package `dev.sundial.executor`, the
//! example's `Main` and `Receiver`, on stubs generated from `proto/` by Maven) end to
//! end: the scenario of [`sundial_tests::foreign`] (Redis, two server instances, two
//! Java executors, the Java receiver, jobs through grpcurl: a verified result stored
//! once, a SIGKILLed holder's run finishing as attempt 2 elsewhere, an interrupted
//! handler, a clean SIGTERM).
//!
//! The jar comes from `SUNDIAL_TEST_JAVA_JAR` (`scripts/test` builds it with
//! `sdk-examples/java/build.sh`); when unset, the test runs that script itself.

use anyhow::Result;
use sundial_tests::foreign::{Example, built, end_to_end};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_executors_and_receiver_end_to_end() -> Result<()> {
    let jar = built(
        "SUNDIAL_TEST_JAVA_JAR",
        "sdk-examples/java/build.sh",
        &[],
        "a JDK 17, Maven and Maven Central",
    )?
    .display()
    .to_string();
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
