//! The Go example (`sdk-examples/go`: package `sundial`, `cmd/executor`,
//! `cmd/receiver`, on stubs generated from `proto/`) end to end: the scenario of
//! [`sundial_tests::foreign`] (Redis, two server instances, two Go executors, the Go
//! receiver, jobs through grpcurl: a verified result stored once, a SIGKILLed holder's
//! run finishing as attempt 2 elsewhere, a cancelled handler, a clean SIGTERM).
//!
//! The binaries come from `SUNDIAL_TEST_GO_BIN` (`scripts/test` builds them with
//! `sdk-examples/go/build.sh`); when unset, the test runs that script itself.

use anyhow::Result;
use sundial_tests::foreign::{Example, built, end_to_end};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_executors_and_receiver_end_to_end() -> Result<()> {
    let bin = built(
        "SUNDIAL_TEST_GO_BIN",
        "sdk-examples/go/build.sh",
        &["target/go-bin"],
        "Go, protoc and the Go module proxy",
    )?;
    let path = |name: &str| bin.join(name).display().to_string();
    end_to_end(&Example {
        language: "go",
        executor: vec![path("executor")],
        receiver: vec![path("receiver")],
    })
    .await
}
