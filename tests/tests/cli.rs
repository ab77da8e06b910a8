//! The `sundial` CLI as a process against a live server on the embedded store: a
//! folder of job files kept in sync by `job apply` (idempotent, one update, a prune, a
//! dry run that changes nothing), every subcommand's success and one failure each with
//! its exit code and message, `job next` across a DST change, `run logs --follow`
//! printing lines while the run writes them, and bearer tokens.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use sundial_proto::v1 as pb;
use sundial_tests::cli::{Cli, CliRun};
use sundial_tests::{Sundial, SundialOptions, TestExecutor, wait_for};
use tokio::io::{AsyncBufReadExt, BufReader};

const EXECUTOR: &str = env!("CARGO_BIN_EXE_test_executor");

/// Fails with the command's output unless it exited with `code`.
fn expect(run: &CliRun, code: i32, what: &str) -> Result<()> {
    ensure!(
        run.code == code,
        "{what}: exit {} (wanted {code})\nstdout: {}\nstderr: {}",
        run.code,
        run.stdout,
        run.stderr
    );
    Ok(())
}

/// A job file for job `i` of the synced folder, in one of the three formats.
fn write_job(dir: &Path, i: usize, cron: &str) -> Result<()> {
    let id = format!("sync-{i:03}");
    let (name, text) = match i % 3 {
        0 => (
            format!("{id}.yaml"),
            format!(
                "id: {id}\ncron: \"{cron}\"\ntime_zone: Europe/Berlin\n\
                 executor: {{group: g, handler: noop}}\nlabels: {{owner: git}}\n"
            ),
        ),
        1 => (
            format!("{id}.toml"),
            format!(
                "id = \"{id}\"\ncron = \"{cron}\"\nlabels = {{ owner = \"git\" }}\n\
                 [executor]\ngroup = \"g\"\nhandler = \"noop\"\n"
            ),
        ),
        _ => (
            format!("{id}.json"),
            format!(
                r#"{{"id": "{id}", "cron": "{cron}", "executor": {{"group": "g", "handler": "noop"}}, "labels": {{"owner": "git"}}}}"#
            ),
        ),
    };
    std::fs::write(dir.join(name), text)?;
    Ok(())
}

async fn job_version(server: &Sundial, id: &str) -> Result<Option<u64>> {
    match server
        .jobs()
        .await?
        .get_job(pb::GetJobRequest { job_id: id.into() })
        .await
    {
        Ok(answer) => Ok(answer.into_inner().job.map(|j| j.version)),
        Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
        Err(s) => Err(s.into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_keeps_a_folder_of_job_files_in_sync() -> Result<()> {
    let data = tempfile::tempdir()?;
    let server = Sundial::start(SundialOptions::embedded(data.path()))?;
    let cli = Cli::new(&server.grpc_url());
    let files = tempfile::tempdir()?;
    let jobs = files.path().join("jobs");
    std::fs::create_dir(&jobs)?;
    for i in 0..100 {
        write_job(&jobs, i, "0 0 12 * * ?")?;
    }
    let dir = jobs.display().to_string();

    let started = Instant::now();
    let first = cli.run(&["job", "apply", "-f", &dir]).await?;
    println!("job apply of 100 new files: {:?}", started.elapsed());
    expect(&first, 0, "first apply")?;
    ensure!(
        first
            .stdout
            .contains("100 jobs: 100 created, 0 updated, 0 unchanged"),
        "{}",
        first.stdout
    );
    let started = Instant::now();
    let again = cli.run(&["job", "apply", "-f", &dir]).await?;
    println!("job apply of 100 unchanged files: {:?}", started.elapsed());
    expect(&again, 0, "second apply")?;
    ensure!(
        again.stdout.trim() == "no changes: 100 jobs unchanged",
        "{}",
        again.stdout
    );

    // One file edited: a dry run names the field and the fire times before and after,
    // and writes nothing; then the apply updates that one job.
    write_job(&jobs, 9, "0 30 2 * * ?")?;
    let dry = cli.run(&["job", "apply", "-f", &dir, "--dry-run"]).await?;
    expect(&dry, 0, "dry run")?;
    ensure!(
        dry.stdout.contains("job sync-009 would be updated: cron")
            && dry.stdout.contains("next fires before: ")
            && dry.stdout.contains("next fires after : ")
            && dry.stdout.contains("02:30:00 CE"),
        "{}",
        dry.stdout
    );
    ensure!(
        job_version(&server, "sync-009").await? == Some(1),
        "dry run wrote"
    );
    let edit = cli.run(&["job", "apply", "-f", &dir]).await?;
    expect(&edit, 0, "apply of one edit")?;
    ensure!(
        edit.stdout.contains("job sync-009 updated (")
            && edit.stdout.contains("0 created, 1 updated, 99 unchanged"),
        "{}",
        edit.stdout
    );
    ensure!(job_version(&server, "sync-009").await? == Some(2));

    // A job the selector does not own is never pruned.
    let other = files.path().join("other.yaml");
    std::fs::write(
        &other,
        "id: other\ncron: '0 0 12 * * ?'\nexecutor: {group: g, handler: noop}\nlabels: {owner: hand}\n",
    )?;
    expect(
        &cli.run(&["job", "create", "-f", &other.display().to_string()])
            .await?,
        0,
        "create other",
    )?;

    // One file removed: --prune deletes its job (a dry run first, which does not).
    std::fs::remove_file(jobs.join("sync-042.yaml"))?;
    let dry = cli
        .run(&[
            "job",
            "apply",
            "-f",
            &dir,
            "--prune",
            "-l",
            "owner=git",
            "--dry-run",
        ])
        .await?;
    expect(&dry, 0, "prune dry run")?;
    ensure!(
        dry.stdout.contains("job sync-042 would be deleted"),
        "{}",
        dry.stdout
    );
    ensure!(
        job_version(&server, "sync-042").await?.is_some(),
        "dry run deleted"
    );
    let pruned = cli
        .run(&["job", "apply", "-f", &dir, "--prune", "-l", "owner=git"])
        .await?;
    expect(&pruned, 0, "prune")?;
    ensure!(
        pruned.stdout.contains("job sync-042 deleted")
            && pruned
                .stdout
                .contains("99 jobs: 0 created, 0 updated, 99 unchanged")
            && pruned.stdout.contains("1 deleted"),
        "{}",
        pruned.stdout
    );
    ensure!(job_version(&server, "sync-042").await?.is_none());
    ensure!(
        job_version(&server, "other").await? == Some(1),
        "other pruned"
    );
    let bare = cli.run(&["job", "apply", "-f", &dir, "--prune"]).await?;
    expect(&bare, 1, "--prune without a selector")?;
    ensure!(bare.stderr.contains("--selector"), "{}", bare.stderr);

    // A bad file: exit 1 naming the file, the job and the field; the rest applies.
    std::fs::write(
        jobs.join("sync-bad.yaml"),
        "id: sync-bad\ncron: '61 * * * *'\nexecutor: {group: g, handler: noop}\nlabels: {owner: git}\n",
    )?;
    let bad = cli.run(&["job", "apply", "-f", &dir]).await?;
    expect(&bad, 1, "apply with a bad cron")?;
    ensure!(
        bad.stdout
            .contains("sync-bad.yaml: job \"sync-bad\": cron: "),
        "{}",
        bad.stdout
    );
    ensure!(job_version(&server, "sync-bad").await?.is_none());
    std::fs::write(jobs.join("sync-typo.yaml"), "id: sync-typo\ncronn: x\n")?;
    let typo = cli.run(&["job", "apply", "-f", &dir]).await?;
    expect(&typo, 1, "apply with an unknown field")?;
    ensure!(
        typo.stderr
            .contains("sync-typo.yaml: job \"sync-typo\": cronn: unknown field"),
        "{}",
        typo.stderr
    );
    std::fs::remove_file(jobs.join("sync-typo.yaml"))?;
    std::fs::remove_file(jobs.join("sync-bad.yaml"))?;

    // -o json: one item per file, for scripts.
    let json = cli.run(&["job", "apply", "-f", &dir, "-o", "json"]).await?;
    expect(&json, 0, "apply -o json")?;
    let items = json.json()?["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter(|i| i["outcome"] == "unchanged")
        .count();
    ensure!(items == 99, "{items} unchanged items: {}", json.stdout);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subcommand_answers_and_fails_with_its_exit_code() -> Result<()> {
    let data = tempfile::tempdir()?;
    let server = Sundial::start(SundialOptions::embedded(data.path()))?;
    let journal = data.path().join("journal");
    let _executor = TestExecutor::start(EXECUTOR, &[server.grpc_url()], "cli-node", &journal)?;
    let cli = Cli::new(&server.grpc_url());
    let files = tempfile::tempdir()?;
    let file = files.path().join("echo.yaml");
    std::fs::write(
        &file,
        format!(
            "id: echo\ncron: '{}'\nexecutor: {{group: g, handler: echo}}\npayload: aGk=\n",
            sundial_tests::MANUAL_ONLY
        ),
    )?;
    let file = file.display().to_string();

    // job create / get / list
    let created = cli.run(&["job", "create", "-f", &file]).await?;
    expect(&created, 0, "job create")?;
    ensure!(created.stdout.starts_with("created job echo (version 1"));
    let twice = cli.run(&["job", "create", "-f", &file]).await?;
    expect(&twice, 3, "job create of an existing id")?;
    ensure!(
        twice.stderr.contains("create job \"echo\""),
        "{}",
        twice.stderr
    );
    let got = cli.run(&["job", "get", "echo"]).await?;
    expect(&got, 0, "job get")?;
    ensure!(got.stdout.contains("target:") && got.stdout.contains("g/echo"));
    let missing = cli.run(&["job", "get", "nope"]).await?;
    expect(&missing, 2, "job get of a missing job")?;
    ensure!(
        missing.stderr.contains("job \"nope\" not found"),
        "{}",
        missing.stderr
    );
    let listed = cli.run(&["job", "list", "-o", "json"]).await?;
    expect(&listed, 0, "job list")?;
    ensure!(
        listed.json()?[0]["spec"]["id"] == "echo",
        "{}",
        listed.stdout
    );
    let table = cli.run(&["job", "list"]).await?;
    ensure!(table.stdout.starts_with("ID") && table.stdout.contains("echo"));
    let by_prefix = cli
        .run(&["job", "list", "--prefix", "ec", "-o", "json"])
        .await?;
    expect(&by_prefix, 0, "job list --prefix ec")?;
    ensure!(
        by_prefix.json()?[0]["spec"]["id"] == "echo",
        "{}",
        by_prefix.stdout
    );
    let no_match = cli
        .run(&["job", "list", "--prefix", "zz", "-o", "json"])
        .await?;
    ensure!(
        no_match.json()?.as_array().is_some_and(Vec::is_empty),
        "{}",
        no_match.stdout
    );
    let asleep = cli.run(&["job", "list", "--state", "asleep"]).await?;
    expect(&asleep, 1, "job list --state asleep")?;
    ensure!(asleep.stderr.contains("'asleep'"), "{}", asleep.stderr);

    // job pause / resume
    expect(&cli.run(&["job", "pause", "echo"]).await?, 0, "pause")?;
    let paused = cli
        .run(&["job", "list", "--state", "paused", "-o", "json"])
        .await?;
    ensure!(paused.json()?.as_array().is_some_and(|a| a.len() == 1));
    expect(&cli.run(&["job", "resume", "echo"]).await?, 0, "resume")?;
    expect(&cli.run(&["job", "pause", "nope"]).await?, 2, "pause nope")?;
    expect(
        &cli.run(&["job", "resume", "nope"]).await?,
        2,
        "resume nope",
    )?;

    // job trigger, run get / list
    let trig = cli.run(&["job", "trigger", "echo"]).await?;
    expect(&trig, 0, "trigger")?;
    let sid = trig.stdout.trim().to_owned();
    ensure!(sid.starts_with("echo@manual-"), "{sid}");
    expect(
        &cli.run(&["job", "trigger", "nope"]).await?,
        2,
        "trigger nope",
    )?;
    let run = server.finished(&sid).await?;
    ensure!(run.state() == pb::RunState::Succeeded, "{run:?}");
    let shown = cli.run(&["run", "get", &sid]).await?;
    expect(&shown, 0, "run get")?;
    ensure!(
        shown.stdout.contains("succeeded") && shown.stdout.contains("output:      hi"),
        "{}",
        shown.stdout
    );
    // Its history: each step, the node it ran on.
    ensure!(
        shown.stdout.contains("history:")
            && shown.stdout.contains("DISPATCHED")
            && shown.stdout.contains("RUNNING")
            && shown.stdout.contains("SUCCEEDED"),
        "{}",
        shown.stdout
    );
    expect(
        &cli.run(&["run", "get", "echo@1"]).await?,
        2,
        "run get missing",
    )?;
    let runs = cli.run(&["run", "list", "echo"]).await?;
    expect(&runs, 0, "run list")?;
    ensure!(runs.stdout.contains(&sid) && runs.stdout.contains("cli-node"));
    let bad_id = cli.run(&["run", "list", "no such job"]).await?;
    expect(&bad_id, 1, "run list of a bad id")?;
    ensure!(bad_id.stderr.contains("job_id"), "{}", bad_id.stderr);

    // run logs --follow: lines while the run writes them, then the end.
    logs_follow(&server, &cli).await?;

    // run cancel: a running run ends cancelled; a final one cannot be.
    let sleeper = files.path().join("sleeper.json");
    std::fs::write(
        &sleeper,
        format!(
            r#"{{"id": "sleeper", "cron": "{}", "executor": {{"group": "g", "handler": "sleep"}}, "payload": "{}"}}"#,
            sundial_tests::MANUAL_ONLY,
            "NjAwMDA=" // "60000"
        ),
    )?;
    expect(
        &cli.run(&["job", "create", "-f", &sleeper.display().to_string()])
            .await?,
        0,
        "create sleeper",
    )?;
    let sleep_sid = cli.run(&["job", "trigger", "sleeper"]).await?.stdout;
    let sleep_sid = sleep_sid.trim();
    wait_for("the sleeper running", Duration::from_secs(30), || async {
        let r = server.run(sleep_sid).await?;
        Ok((r.state() == pb::RunState::Running).then_some(()))
    })
    .await?;
    let cancelled = cli.run(&["run", "cancel", sleep_sid]).await?;
    expect(&cancelled, 0, "run cancel")?;
    let run = server.finished(sleep_sid).await?;
    ensure!(run.state() == pb::RunState::Cancelled, "{run:?}");
    let again = cli.run(&["run", "cancel", &sid]).await?;
    expect(&again, 3, "cancel of a final run")?;

    // job next across Berlin's spring-forward gap: what GetJobStatus says, in CET/CEST.
    job_next_across_dst(&server, &cli, files.path()).await?;

    // node list / drain, app create / rotate
    let nodes = cli.run(&["node", "list"]).await?;
    expect(&nodes, 0, "node list")?;
    ensure!(nodes.stdout.contains("cli-node") && nodes.stdout.contains("healthy"));
    expect(&cli.run(&["node", "drain", "nope"]).await?, 2, "drain nope")?;
    let elsewhere = Cli::new("http://127.0.0.1:1")
        .run(&["node", "list"])
        .await?;
    expect(&elsewhere, 5, "node list of no server")?;
    let app = cli.run(&["app", "create", "billing"]).await?;
    expect(&app, 0, "app create")?;
    ensure!(app.stdout.contains("whsec_"), "{}", app.stdout);
    expect(
        &cli.run(&["app", "create", "billing"]).await?,
        3,
        "app twice",
    )?;
    let rotated = cli
        .run(&["app", "rotate", "billing", "--overlap", "1h", "-o", "json"])
        .await?;
    expect(&rotated, 0, "app rotate")?;
    ensure!(
        rotated.json()?["app"]["activeSecrets"] == 2,
        "{}",
        rotated.stdout
    );
    expect(
        &cli.run(&["app", "rotate", "nope"]).await?,
        2,
        "rotate nope",
    )?;
    let drained = cli.run(&["node", "drain", "cli-node"]).await?;
    expect(&drained, 0, "node drain")?;
    let undrained = cli.run(&["node", "undrain", "cli-node"]).await?;
    expect(&undrained, 0, "node undrain")?;
    ensure!(
        undrained.stdout.contains("takes work again"),
        "{}",
        undrained.stdout
    );
    expect(
        &cli.run(&["node", "undrain", "nope"]).await?,
        2,
        "undrain nope",
    )?;

    // job delete, and a server that is not there.
    expect(&cli.run(&["job", "delete", "echo"]).await?, 0, "delete")?;
    expect(
        &cli.run(&["job", "delete", "echo"]).await?,
        2,
        "delete again",
    )?;
    let away = Cli::new("http://127.0.0.1:1").run(&["job", "list"]).await?;
    expect(&away, 5, "no server")?;
    ensure!(
        away.stderr.contains("cannot reach the server"),
        "{}",
        away.stderr
    );
    let usage = cli.run(&["job", "frobnicate"]).await?;
    expect(&usage, 1, "unknown subcommand")?;
    Ok(())
}

/// `run logs --follow` of a run that writes `tick 1..10` 300 ms apart: the first line
/// is printed while the run is still running, and the command ends when the run does.
async fn logs_follow(server: &Sundial, cli: &Cli) -> Result<()> {
    server
        .create_job(pb::JobSpec {
            payload: b"10".to_vec(),
            ..sundial_tests::manual_job("ticker", "ticks")
        })
        .await?;
    let sid = server.trigger("ticker").await?;
    let mut follow = cli.spawn(&["run", "logs", &sid, "--follow"])?;
    let mut lines = BufReader::new(follow.stdout.take().context("stdout")?).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .context("no log line within 30 s")??
        .context("the command ended without a line")?;
    ensure!(first.ends_with("tick 1"), "{first}");
    let state = server.run(&sid).await?.state();
    ensure!(
        state == pb::RunState::Running,
        "the first line came after the run ended ({state:?})"
    );
    let mut rest = Vec::new();
    while let Some(line) = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .context("the follow did not end within 30 s of its last line")??
    {
        rest.push(line);
    }
    let status = tokio::time::timeout(Duration::from_secs(10), follow.wait()).await??;
    ensure!(status.success(), "{status:?}");
    ensure!(
        rest.len() == 9 && rest[8].ends_with("tick 10"),
        "after the first: {rest:?}"
    );
    ensure!(server.run(&sid).await?.state() == pb::RunState::Succeeded);
    let missing = cli.run(&["run", "logs", "ticker@1"]).await?;
    expect(&missing, 2, "logs of a missing run")?;
    Ok(())
}

async fn job_next_across_dst(server: &Sundial, cli: &Cli, dir: &Path) -> Result<()> {
    // From 2030-03-29 00:00 UTC: Berlin springs forward on 2030-03-31.
    let file = dir.join("berlin.toml");
    std::fs::write(
        &file,
        "id = \"berlin\"\ncron = \"0 30 2 * * ?\"\ntime_zone = \"Europe/Berlin\"\n\
         start_time_ms = 1900972800000\n[executor]\ngroup = \"g\"\nhandler = \"noop\"\n",
    )?;
    expect(
        &cli.run(&["job", "create", "-f", &file.display().to_string()])
            .await?,
        0,
        "create berlin",
    )?;
    let next = cli.run(&["job", "next", "berlin", "-n", "4"]).await?;
    expect(&next, 0, "job next")?;
    let lines: Vec<&str> = next.stdout.lines().collect();
    ensure!(
        lines.len() == 4
            && lines[0].starts_with("2030-03-29 02:30:00 CET")
            && lines[2].starts_with("2030-03-31 03:00:00 CEST")
            && lines[3].starts_with("2030-04-01 02:30:00 CEST"),
        "{}",
        next.stdout
    );
    let json = cli
        .run(&["job", "next", "berlin", "-n", "4", "-o", "json"])
        .await?
        .json()?;
    let status = server
        .runs()
        .await?
        .get_job_status(pb::GetJobStatusRequest {
            job_id: "berlin".into(),
            next_fires: 4,
        })
        .await?
        .into_inner()
        .next_fire_times_ms;
    let cli_times: Vec<i64> = json["fireTimesMs"]
        .as_array()
        .context("fireTimesMs")?
        .iter()
        .filter_map(serde_json::Value::as_i64)
        .collect();
    ensure!(
        cli_times == status,
        "cli {cli_times:?} vs status {status:?}"
    );
    let preview = cli
        .run(&[
            "job",
            "next",
            "--cron",
            "0 30 2 * * ?",
            "--time-zone",
            "Europe/Berlin",
        ])
        .await?;
    expect(&preview, 0, "job next --cron")?;
    ensure!(preview.stdout.lines().count() == 5, "{}", preview.stdout);
    let bad = cli.run(&["job", "next", "--cron", "61 * * * *"]).await?;
    expect(&bad, 1, "job next of a bad cron")?;
    ensure!(bad.stderr.contains("cron: "), "{}", bad.stderr);
    Ok(())
}

/// With credentials configured: no token is exit 4; `--token-file` and `SUNDIAL_TOKEN`
/// are sent as a bearer token; a read-only token may list and not pause (exit 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_tokens_from_a_file_or_the_environment() -> Result<()> {
    let data = tempfile::tempdir()?;
    let server = Sundial::start(
        SundialOptions::embedded(data.path())
            .arg("bearer-token", "admin-secret")
            .arg("read-token", "read-secret"),
    )?;
    let cli = Cli::new(&server.grpc_url());
    let none = cli.run(&["job", "list"]).await?;
    expect(&none, 4, "no token")?;
    ensure!(none.stderr.contains("Unauthenticated"), "{}", none.stderr);
    let token = data.path().join("token");
    std::fs::write(&token, "admin-secret\n")?;
    let token = token.display().to_string();
    expect(
        &cli.run(&["job", "list", "--token-file", &token]).await?,
        0,
        "--token-file",
    )?;
    let admin = cli.clone().env("SUNDIAL_TOKEN", "admin-secret");
    expect(&admin.run(&["node", "list"]).await?, 0, "SUNDIAL_TOKEN")?;
    let reader = cli.clone().env("SUNDIAL_TOKEN", "read-secret");
    expect(&reader.run(&["job", "list"]).await?, 0, "a reader lists")?;
    expect(
        &reader.run(&["job", "next", "--cron", "* * * * *"]).await?,
        0,
        "a reader previews",
    )?;
    let refused = reader.run(&["job", "pause", "x"]).await?;
    expect(&refused, 4, "a reader pauses")?;
    ensure!(refused.stderr.contains("read-only"), "{}", refused.stderr);
    let empty = data.path().join("empty");
    std::fs::write(&empty, "")?;
    let empty = cli
        .run(&["job", "list", "--token-file", &empty.display().to_string()])
        .await?;
    expect(&empty, 1, "an empty token file")?;
    ensure!(
        empty.stderr.contains("the token is empty"),
        "{}",
        empty.stderr
    );
    Ok(())
}
