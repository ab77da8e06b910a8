//! What `sundial` shows of itself: `--help` naming every subcommand, a text log with
//! no terminal escape codes when stderr is a pipe (even with colours allowed), and
//! `--log-format json`, one JSON object per line with the span and event fields
//! (`job_id`, `schedule_id`) at the top level; a loop that panics is reported and
//! stops the server with a non-zero exit; and `worker_threads` sizes its runtime.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use sundial_tests::{
    Sundial, SundialOptions, TestExecutor, manual_job, metric_sample, sundial_bin,
};

const EXECUTOR: &str = env!("CARGO_BIN_EXE_test_executor");

#[test]
fn help_names_every_subcommand() -> Result<()> {
    let out = std::process::Command::new(sundial_bin()?)
        .arg("--help")
        .output()?;
    ensure!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout)?;
    for sub in ["serve", "job", "run", "node", "app"] {
        ensure!(
            text.lines().any(|l| l.trim_start().starts_with(sub)),
            "{sub} missing from:\n{text}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_piped_text_log_has_no_escape_codes() -> Result<()> {
    let data = tempfile::tempdir()?;
    // NO_COLOR empty means colours are allowed (no-color.org): only the pipe stops them.
    let mut server = Sundial::start(SundialOptions::embedded(data.path()).env("NO_COLOR", ""))?;
    server.create_job(manual_job("plain", "noop")).await?;
    server.stop()?;
    let log = server.stderr();
    ensure!(log.contains("job created"), "{log}");
    ensure!(
        !log.contains('\u{1b}'),
        "escape codes in a piped log:\n{log}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_lines_parse_and_carry_job_and_schedule_ids() -> Result<()> {
    let data = tempfile::tempdir()?;
    let mut server =
        Sundial::start(SundialOptions::embedded(data.path()).arg("log-format", "json"))?;
    let journal = data.path().join("journal");
    let _executor = TestExecutor::start(EXECUTOR, &[server.grpc_url()], "json-node", &journal)?;
    server.create_job(manual_job("shipped", "noop")).await?;
    let sid = server.trigger("shipped").await?;
    let run = server.finished(&sid).await?;
    ensure!(
        run.state == sundial_proto::v1::RunState::Succeeded as i32,
        "{run:?}"
    );
    server.stop()?;
    let log = server.stderr();
    let mut with_ids = 0;
    for line in log.lines() {
        let v: Value = serde_json::from_str(line).with_context(|| format!("not JSON: {line}"))?;
        ensure!(
            v["level"].is_string() && v["timestamp"].is_string() && v["message"].is_string(),
            "{line}"
        );
        if v["job_id"] == "shipped" && v["schedule_id"] == sid.as_str() {
            with_ids += 1;
        }
    }
    ensure!(
        with_ids > 0,
        "no line with job_id and schedule_id {sid}:\n{log}"
    );
    Ok(())
}

/// `--worker-threads N` runs the server on N threads (as its `/metrics` reads them
/// from the runtime); unset, on half the cores, at least one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_threads_sizes_the_runtime() -> Result<()> {
    let half = std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1));
    for (given, expected) in [(Some("3"), 3.0), (None, half as f64)] {
        let data = tempfile::tempdir()?;
        let mut opts = SundialOptions::embedded(data.path());
        if let Some(n) = given {
            opts = opts.arg("worker-threads", n);
        }
        let mut server = Sundial::start(opts)?;
        let http = server.http_url().context("the HTTP listener")?;
        let text = reqwest::get(format!("{http}/metrics"))
            .await?
            .text()
            .await?;
        server.stop()?;
        let seen = metric_sample(&text, "sundial_worker_threads");
        ensure!(
            seen == Some(expected),
            "--worker-threads {given:?}: {seen:?}, expected {expected}:\n{text}"
        );
    }
    Ok(())
}

/// The sweeper's loop panics (the `sweeper.panic` point, at its third sweep): the
/// server logs which loop failed and why, shuts down in order and exits non-zero,
/// instead of serving on without a sweeper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_that_panics_stops_the_server_with_an_error() -> Result<()> {
    let data = tempfile::tempdir()?;
    let mut server =
        Sundial::start(SundialOptions::embedded(data.path()).fault("sweeper.panic@3"))?;
    let status = server.wait_exit(Duration::from_secs(30)).await?;
    let log = server.stderr();
    ensure!(!status.success(), "exit {status:?}\n{log}");
    ensure!(
        log.contains("loop sweeper panicked: SUNDIAL_FAULT: panicking at sweeper.panic"),
        "{log}"
    );
    ensure!(log.contains("stopped"), "no orderly shutdown:\n{log}");
    Ok(())
}
