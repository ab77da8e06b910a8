//! `sundial job apply -f FILE|DIR`: makes a folder of job files true through
//! `ApplyJobs` (1000 specs a call): new jobs created, changed ones updated, equal ones
//! left alone, so applying twice changes nothing. `--prune` with a label selector
//! deletes the jobs the selector matches that the files no longer name; `--dry-run`
//! changes nothing and says what would change, with the fire times before and after
//! for a changed schedule.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use clap::Args;
use serde::Serialize;
use serde_json::Value;
use sundial_proto::v1 as pb;

use super::connect::{Server, ask};
use super::files::{self, JobFile};
use super::jobs::{all_jobs, label};
use super::{Exit, Failure, Output, Result, show};

/// Most specs one ApplyJobs call takes.
const PER_CALL: usize = 1000;
/// Fire times shown before and after a changed schedule.
const FIRES_SHOWN: i32 = 3;

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// A job file or a folder of them (repeatable): YAML, TOML or JSON.
    #[arg(short, long = "file", required = true)]
    files: Vec<PathBuf>,
    /// Also delete the jobs --selector matches that the files no longer name.
    #[arg(long, requires = "selector")]
    prune: bool,
    /// The jobs --prune owns: KEY=VALUE, repeatable (every pair must match).
    #[arg(short = 'l', long = "selector", value_parser = label)]
    selector: Vec<(String, String)>,
    /// Change nothing: print what applying would do, with the next fire times before
    /// and after for a changed cron, zone or window.
    #[arg(long)]
    dry_run: bool,
}

/// What happened to one spec (or would, in a dry run).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Item {
    file: String,
    job_id: String,
    /// created, updated, unchanged, invalid, conflict, deleted.
    outcome: &'static str,
    #[serde(skip_serializing_if = "String::is_empty")]
    error: String,
    /// The spec fields an update changes (dry run only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    changed: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    fire_times_before_ms: Vec<i64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    fire_times_after_ms: Vec<i64>,
    #[serde(skip)]
    time_zone: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    dry_run: bool,
    items: Vec<Item>,
}

pub async fn run(server: &Server, out: Output, args: ApplyArgs) -> Result<Exit> {
    let specs = files::load(&args.files)?;
    if specs.is_empty() {
        return Err(Failure::usage(format!(
            "-f {}: no job files (.yaml, .yml, .toml, .json) there",
            args.files
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let mut items = Vec::with_capacity(specs.len());
    for chunk in specs.chunks(PER_CALL) {
        items.extend(apply_chunk(server, chunk, args.dry_run).await?);
    }
    if args.prune {
        let named: HashSet<&str> = specs.iter().map(|f| f.spec.id.as_str()).collect();
        let owned = all_jobs(
            server,
            args.selector.iter().cloned().collect(),
            pb::JobState::Unspecified,
            "",
            0,
        )
        .await?;
        for job in owned {
            let id = job.spec.unwrap_or_default().id;
            if !named.contains(id.as_str()) {
                items.push(prune(server, id, args.dry_run).await?);
            }
        }
    }
    let report = Report {
        dry_run: args.dry_run,
        items,
    };
    match out {
        Output::Json => show::json(&report)?,
        Output::Table => print(&report),
    }
    let has = |o: &str| report.items.iter().any(|i| i.outcome == o);
    Ok(if has("invalid") {
        Exit::Usage
    } else if has("conflict") {
        Exit::Conflict
    } else {
        Exit::Ok
    })
}

/// One ApplyJobs call for up to 1000 specs; each answer tied to its file.
async fn apply_chunk(server: &Server, chunk: &[JobFile], dry_run: bool) -> Result<Vec<Item>> {
    let req = pb::ApplyJobsRequest {
        specs: chunk.iter().map(|f| f.spec.clone()).collect(),
        dry_run,
    };
    let answer = ask("apply jobs", server.jobs().apply_jobs(req)).await?;
    if answer.results.len() != chunk.len() {
        return Err(Failure::usage(format!(
            "apply jobs: {} answers for {} specs",
            answer.results.len(),
            chunk.len()
        )));
    }
    let mut items = Vec::with_capacity(chunk.len());
    for (file, result) in chunk.iter().zip(answer.results) {
        let mut item = Item {
            file: file.path.display().to_string(),
            job_id: file.spec.id.clone(),
            outcome: outcome(result.outcome()),
            error: item_error(&result.error),
            changed: Vec::new(),
            fire_times_before_ms: Vec::new(),
            fire_times_after_ms: Vec::new(),
            time_zone: file.spec.time_zone.clone(),
        };
        if dry_run && result.outcome() == pb::ApplyOutcome::Updated {
            explain_update(server, &mut item, result.job).await?;
        }
        items.push(item);
    }
    Ok(items)
}

fn outcome(o: pb::ApplyOutcome) -> &'static str {
    match o {
        pb::ApplyOutcome::Created => "created",
        pb::ApplyOutcome::Updated => "updated",
        pb::ApplyOutcome::Unchanged => "unchanged",
        pb::ApplyOutcome::Conflict => "conflict",
        pb::ApplyOutcome::Invalid | pb::ApplyOutcome::Unspecified => "invalid",
    }
}

/// The server names a bad field `specs[i].<field>`; the file and job are named beside
/// it, so the index goes.
fn item_error(raw: &str) -> String {
    match raw.strip_prefix("specs[").and_then(|r| r.split_once(']')) {
        Some((_, rest)) => rest.trim_start_matches(['.', ':', ' ']).to_owned(),
        None => raw.to_owned(),
    }
}

/// A dry run's update: which fields change and, for a changed schedule, the next fire
/// times before and after (from the server's cron code).
async fn explain_update(server: &Server, item: &mut Item, after: Option<pb::Job>) -> Result<()> {
    let req = pb::GetJobRequest {
        job_id: item.job_id.clone(),
    };
    let what = format_args!("{}: get job {:?}", item.file, item.job_id);
    let before = ask(what, server.jobs().get_job(req)).await?.job;
    let before = before.and_then(|j| j.spec).unwrap_or_default();
    let after = after.and_then(|j| j.spec).unwrap_or_default();
    item.changed = changed_fields(&before, &after);
    item.time_zone = after.time_zone.clone();
    let schedule = ["cron", "timeZone", "startTimeMs", "endTimeMs"];
    if item.changed.iter().any(|f| schedule.contains(&f.as_str())) {
        item.fire_times_before_ms = preview(server, &before).await?;
        item.fire_times_after_ms = preview(server, &after).await?;
    }
    Ok(())
}

/// The top-level spec fields (canonical JSON names) whose values differ.
fn changed_fields(before: &pb::JobSpec, after: &pb::JobSpec) -> Vec<String> {
    let as_map = |s: &pb::JobSpec| match serde_json::to_value(s) {
        Ok(Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    let (a, b) = (as_map(before), as_map(after));
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k) && *k != "paused")
        .cloned()
        .collect()
}

async fn preview(server: &Server, spec: &pb::JobSpec) -> Result<Vec<i64>> {
    let req = pb::PreviewFireTimesRequest {
        cron: spec.cron.clone(),
        time_zone: spec.time_zone.clone(),
        start_time_ms: spec.start_time_ms,
        end_time_ms: spec.end_time_ms,
        after_ms: 0,
        count: FIRES_SHOWN,
    };
    let what = format_args!("fire times of job {:?}", spec.id);
    Ok(ask(what, server.jobs().preview_fire_times(req))
        .await?
        .fire_times_ms)
}

/// Deletes a job the files no longer name (a dry run only says so).
async fn prune(server: &Server, job_id: String, dry_run: bool) -> Result<Item> {
    let item = Item {
        file: String::new(),
        job_id,
        outcome: "deleted",
        error: String::new(),
        changed: Vec::new(),
        fire_times_before_ms: Vec::new(),
        fire_times_after_ms: Vec::new(),
        time_zone: String::new(),
    };
    if !dry_run {
        let req = pb::DeleteJobRequest {
            job_id: item.job_id.clone(),
        };
        match server.jobs().delete_job(req).await {
            Ok(_) => {}
            // Gone meanwhile: what prune wanted.
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => return Err(Failure::rpc(format!("delete job {:?}", item.job_id), &s)),
        }
    }
    Ok(item)
}

fn print(report: &Report) {
    let would = if report.dry_run { "would be " } else { "" };
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for item in &report.items {
        *counts.entry(item.outcome).or_default() += 1;
        match item.outcome {
            "unchanged" => {}
            "invalid" | "conflict" => {
                say!(
                    "{}: job {:?}: {} ({})",
                    item.file,
                    item.job_id,
                    item.error,
                    item.outcome
                );
            }
            "deleted" => say!("job {} {would}deleted (no file names it)", item.job_id),
            verb => {
                let fields = if item.changed.is_empty() {
                    String::new()
                } else {
                    format!(": {}", item.changed.join(", "))
                };
                say!("job {} {would}{verb}{fields} ({})", item.job_id, item.file);
                print_fires("before", &item.fire_times_before_ms, &item.time_zone);
                print_fires("after ", &item.fire_times_after_ms, &item.time_zone);
            }
        }
    }
    let n = |o: &str| counts.get(o).copied().unwrap_or(0);
    let total = report.items.len() - n("deleted");
    if n("created") + n("updated") + n("deleted") + n("invalid") + n("conflict") == 0 {
        say!("no changes: {total} jobs unchanged");
        return;
    }
    say!(
        "{}{total} jobs: {} created, {} updated, {} unchanged, {} invalid, {} conflicts; {} deleted",
        if report.dry_run {
            "dry run, nothing written: "
        } else {
            ""
        },
        n("created"),
        n("updated"),
        n("unchanged"),
        n("invalid"),
        n("conflict"),
        n("deleted"),
    );
}

fn print_fires(label: &str, times: &[i64], zone: &str) {
    if times.is_empty() {
        return;
    }
    let shown: Vec<String> = times.iter().map(|t| show::time_in(*t, zone)).collect();
    say!("    next fires {label}: {}", shown.join(", "));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_errors_lose_the_request_index() {
        assert_eq!(item_error("specs[3].cron: bad"), "cron: bad");
        assert_eq!(item_error("specs[12]: no target"), "no target");
        assert_eq!(item_error("changed meanwhile"), "changed meanwhile");
    }

    #[test]
    fn changed_fields_name_what_differs() {
        let a = pb::JobSpec {
            id: "a".into(),
            cron: "* * * * *".into(),
            ..Default::default()
        };
        let mut b = a.clone();
        b.cron = "0 * * * *".into();
        b.labels.insert("team".into(), "x".into());
        b.paused = true;
        assert_eq!(changed_fields(&a, &b), ["cron", "labels"]);
    }
}
