//! `sundial job …`: one job at a time (create from a file, get, list, pause, resume,
//! trigger, delete), its next fire times (`next`), and `apply` (in `apply.rs`).

use std::path::PathBuf;

use clap::{Subcommand, ValueEnum};
use sundial_proto::v1 as pb;

use super::apply::{self, ApplyArgs};
use super::connect::{Server, ask};
use super::{ClientArgs, Exit, Failure, Output, Result, files, show};

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Create a job from a job file holding one spec (YAML, TOML or JSON).
    Create {
        /// The job file.
        #[arg(short, long)]
        file: PathBuf,
    },
    /// One job: its definition, state, next fire times and latest run.
    Get { job_id: String },
    /// Jobs by id: schedule, zone, state and next fire.
    List {
        /// Only jobs with this label (KEY=VALUE; repeat for several, all must match).
        #[arg(short = 'l', long = "selector", value_parser = label)]
        selector: Vec<(String, String)>,
        /// Only jobs in this state.
        #[arg(long, value_enum)]
        state: Option<JobState>,
        /// Only jobs whose id starts with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// At most this many jobs (0: all).
        #[arg(long, default_value_t = 0)]
        limit: usize,
    },
    /// Pause a job: no fires until it is resumed.
    Pause { job_id: String },
    /// Resume a paused job from its next fire after now (no catch-up).
    Resume { job_id: String },
    /// Run a job now; prints the run's schedule_id.
    Trigger {
        job_id: String,
        /// The same key never triggers twice (the first run's schedule_id is answered).
        #[arg(long)]
        idempotency_key: Option<String>,
        /// The payload for this run instead of the job's (as text).
        #[arg(long)]
        payload: Option<String>,
    },
    /// Delete a job (its runs stay readable until they age out).
    Delete { job_id: String },
    /// Make job files true: create the new, update the changed, leave the equal alone.
    Apply(ApplyArgs),
    /// The next fire times of a job in its zone, or of a cron line not saved yet.
    Next {
        /// The job (omit it to give --cron instead).
        #[arg(required_unless_present = "cron")]
        job_id: Option<String>,
        /// How many fire times (1 to 100).
        #[arg(short = 'n', long, default_value_t = 5)]
        count: i32,
        /// A cron line to preview instead of a saved job's.
        #[arg(long, conflicts_with = "job_id")]
        cron: Option<String>,
        /// The zone of --cron.
        #[arg(long, default_value = "UTC")]
        time_zone: String,
    },
}

/// `--state` of `job list`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum JobState {
    Active,
    Paused,
    Finished,
}

/// `KEY=VALUE`.
pub fn label(raw: &str) -> Result<(String, String), String> {
    match raw.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{raw:?} is not KEY=VALUE")),
    }
}

pub async fn run(client: &ClientArgs, command: JobCommand) -> Result<Exit> {
    let server = Server::connect(client).await?;
    let out = client.output;
    match command {
        JobCommand::Create { file } => create(&server, out, file).await,
        JobCommand::Get { job_id } => get(&server, out, &job_id).await,
        JobCommand::List {
            selector,
            state,
            prefix,
            limit,
        } => list(&server, out, selector, state, &prefix, limit).await,
        JobCommand::Pause { job_id } => {
            let req = pb::PauseJobRequest {
                job_id: job_id.clone(),
            };
            let answer = ask(
                format_args!("pause job {job_id:?}"),
                server.jobs().pause_job(req),
            )
            .await?;
            changed(out, "paused", answer.job)
        }
        JobCommand::Resume { job_id } => {
            let req = pb::ResumeJobRequest {
                job_id: job_id.clone(),
            };
            let answer = ask(
                format_args!("resume job {job_id:?}"),
                server.jobs().resume_job(req),
            )
            .await?;
            changed(out, "resumed", answer.job)
        }
        JobCommand::Trigger {
            job_id,
            idempotency_key,
            payload,
        } => trigger(&server, out, job_id, idempotency_key, payload).await,
        JobCommand::Delete { job_id } => {
            let req = pb::DeleteJobRequest {
                job_id: job_id.clone(),
            };
            let answer = ask(
                format_args!("delete job {job_id:?}"),
                server.jobs().delete_job(req),
            )
            .await?;
            match out {
                Output::Json => show::json(&answer)?,
                Output::Table => say!("deleted job {job_id}"),
            }
            Ok(Exit::Ok)
        }
        JobCommand::Apply(args) => apply::run(&server, out, args).await,
        JobCommand::Next {
            job_id,
            count,
            cron,
            time_zone,
        } => next(&server, out, job_id, count, cron, time_zone).await,
    }
}

async fn create(server: &Server, out: Output, file: PathBuf) -> Result<Exit> {
    let mut specs = files::load(std::slice::from_ref(&file))?;
    if specs.len() != 1 {
        return Err(Failure::usage(format!(
            "{}: holds {} job specs; create takes one (apply takes many)",
            file.display(),
            specs.len()
        )));
    }
    let spec = specs.remove(0).spec;
    let id = spec.id.clone();
    let req = pb::CreateJobRequest { spec: Some(spec) };
    let answer = ask(
        format_args!("{}: create job {id:?}", file.display()),
        server.jobs().create_job(req),
    )
    .await?;
    changed(out, "created", answer.job)
}

/// Prints a job a call changed: the job itself as JSON, or one line.
fn changed(out: Output, verb: &str, job: Option<pb::Job>) -> Result<Exit> {
    let job = job.unwrap_or_default();
    match out {
        Output::Json => show::json(&job)?,
        Output::Table => {
            let spec = job.spec.unwrap_or_default();
            say!(
                "{verb} job {} (version {}, next fire {})",
                spec.id,
                job.version,
                show::time_in(job.next_fire_time_ms, &spec.time_zone)
            );
        }
    }
    Ok(Exit::Ok)
}

async fn get(server: &Server, out: Output, job_id: &str) -> Result<Exit> {
    let req = pb::GetJobRequest {
        job_id: job_id.to_owned(),
    };
    let job = ask(
        format_args!("get job {job_id:?}"),
        server.jobs().get_job(req),
    )
    .await?
    .job
    .unwrap_or_default();
    if out == Output::Json {
        show::json(&job)?;
        return Ok(Exit::Ok);
    }
    let req = pb::GetJobStatusRequest {
        job_id: job_id.to_owned(),
        next_fires: 3,
    };
    let status = ask(
        format_args!("status of job {job_id:?}"),
        server.runs().get_job_status(req),
    )
    .await?;
    let spec = job.spec.clone().unwrap_or_default();
    let zone = spec.time_zone.as_str();
    let next: Vec<String> = status
        .next_fire_times_ms
        .iter()
        .map(|t| show::time_in(*t, zone))
        .collect();
    let latest = status.latest_run.map_or_else(String::new, |r| {
        format!(
            "{} {} ({})",
            r.schedule_id,
            show::short(r.state().as_str_name(), "RUN_STATE_"),
            show::time_in(r.scheduled_at_ms, zone)
        )
    });
    show::fields(&[
        ("id", spec.id.clone()),
        ("name", spec.name.clone()),
        (
            "state",
            show::short(job.state().as_str_name(), "JOB_STATE_"),
        ),
        ("version", job.version.to_string()),
        ("cron", spec.cron.clone()),
        ("time zone", spec.time_zone.clone()),
        ("next fires", next.join(", ")),
        ("target", target(&spec)),
        (
            "route",
            show::short(spec.route_strategy().as_str_name(), "ROUTE_STRATEGY_"),
        ),
        ("timeout", spec.timeout_ms.map_or_else(String::new, ms)),
        (
            "retries",
            spec.retry
                .as_ref()
                .map_or_else(String::new, |r| r.max_retries.to_string()),
        ),
        ("callback", spec.callback_url.clone()),
        ("labels", labels(&spec)),
        ("latest run", latest),
        ("created", show::time_in(job.created_at_ms, zone)),
        ("updated", show::time_in(job.updated_at_ms, zone)),
    ]);
    Ok(Exit::Ok)
}

fn ms(v: i64) -> String {
    humantime::format_duration(std::time::Duration::from_millis(v.max(0) as u64)).to_string()
}

/// Where a job runs: `group/handler`, or the URL of an HTTP target.
pub fn target(spec: &pb::JobSpec) -> String {
    match &spec.target {
        Some(pb::job_spec::Target::Executor(e)) => format!("{}/{}", e.group, e.handler),
        Some(pb::job_spec::Target::Http(h)) => h.url.clone(),
        None => "-".to_owned(),
    }
}

fn labels(spec: &pb::JobSpec) -> String {
    let mut pairs: Vec<String> = spec
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    pairs.sort();
    pairs.join(",")
}

async fn list(
    server: &Server,
    out: Output,
    selector: Vec<(String, String)>,
    state: Option<JobState>,
    prefix: &str,
    limit: usize,
) -> Result<Exit> {
    let state = match state {
        None => pb::JobState::Unspecified,
        Some(JobState::Active) => pb::JobState::Active,
        Some(JobState::Paused) => pb::JobState::Paused,
        Some(JobState::Finished) => pb::JobState::Finished,
    };
    let jobs = all_jobs(server, selector.into_iter().collect(), state, prefix, limit).await?;
    if out == Output::Json {
        show::json(&jobs)?;
        return Ok(Exit::Ok);
    }
    show::table(
        &[
            "ID",
            "STATE",
            "CRON",
            "ZONE",
            "NEXT FIRE",
            "TARGET",
            "VERSION",
        ],
        jobs.iter().map(|job| {
            let spec = job.spec.clone().unwrap_or_default();
            vec![
                spec.id.clone(),
                show::short(job.state().as_str_name(), "JOB_STATE_"),
                spec.cron.clone(),
                spec.time_zone.clone(),
                show::time_in(job.next_fire_time_ms, &spec.time_zone),
                target(&spec),
                job.version.to_string(),
            ]
        }),
    );
    Ok(Exit::Ok)
}

/// Every job matching the selector, state and id prefix, a page of 1000 at a time (at
/// most `limit`; 0: all).
pub async fn all_jobs(
    server: &Server,
    label_selector: std::collections::HashMap<String, String>,
    state: pb::JobState,
    id_prefix: &str,
    limit: usize,
) -> Result<Vec<pb::Job>> {
    let mut jobs = Vec::new();
    let mut page_token = String::new();
    loop {
        let req = pb::ListJobsRequest {
            page_size: 1000,
            page_token,
            label_selector: label_selector.clone(),
            state: state as i32,
            id_prefix: id_prefix.to_owned(),
        };
        let page = ask("list jobs", server.jobs().list_jobs(req)).await?;
        jobs.extend(page.jobs);
        if limit > 0 && jobs.len() >= limit {
            jobs.truncate(limit);
            return Ok(jobs);
        }
        if page.next_page_token.is_empty() {
            return Ok(jobs);
        }
        page_token = page.next_page_token;
    }
}

async fn trigger(
    server: &Server,
    out: Output,
    job_id: String,
    idempotency_key: Option<String>,
    payload: Option<String>,
) -> Result<Exit> {
    let req = pb::TriggerJobRequest {
        job_id: job_id.clone(),
        idempotency_key: idempotency_key.unwrap_or_default(),
        override_payload: payload.is_some(),
        payload: payload.map(String::into_bytes).unwrap_or_default(),
        route_key: String::new(),
    };
    let answer = ask(
        format_args!("trigger job {job_id:?}"),
        server.jobs().trigger_job(req),
    )
    .await?;
    match out {
        Output::Json => show::json(&answer)?,
        Output::Table if answer.duplicate => say!(
            "{} (the idempotency key was used before: this is its first run)",
            answer.schedule_id
        ),
        Output::Table => say!("{}", answer.schedule_id),
    }
    Ok(Exit::Ok)
}

async fn next(
    server: &Server,
    out: Output,
    job_id: Option<String>,
    count: i32,
    cron: Option<String>,
    time_zone: String,
) -> Result<Exit> {
    let (zone, times) = match (job_id, cron) {
        (Some(job_id), _) => job_fires(server, &job_id, count).await?,
        (None, Some(cron)) => {
            let req = pb::PreviewFireTimesRequest {
                cron,
                time_zone: time_zone.clone(),
                count,
                ..Default::default()
            };
            let answer = ask("preview fire times", server.jobs().preview_fire_times(req)).await?;
            (time_zone, answer.fire_times_ms)
        }
        (None, None) => return Err(Failure::usage("give a job id or --cron")),
    };
    print_fires(out, &zone, &times)?;
    Ok(Exit::Ok)
}

/// A saved job's zone and its next `count` fire times, as the server's status gives them.
async fn job_fires(server: &Server, job_id: &str, count: i32) -> Result<(String, Vec<i64>)> {
    let req = pb::GetJobRequest {
        job_id: job_id.to_owned(),
    };
    let job = ask(
        format_args!("get job {job_id:?}"),
        server.jobs().get_job(req),
    )
    .await?;
    let zone = job.job.and_then(|j| j.spec).unwrap_or_default().time_zone;
    let req = pb::GetJobStatusRequest {
        job_id: job_id.to_owned(),
        next_fires: count,
    };
    let status = ask(
        format_args!("next fires of job {job_id:?}"),
        server.runs().get_job_status(req),
    )
    .await?;
    Ok((zone, status.next_fire_times_ms))
}

/// Fire times in the zone, each with its UTC instant; JSON: the zone and the epoch ms.
pub fn print_fires(out: Output, zone: &str, times: &[i64]) -> Result<()> {
    match out {
        Output::Json => show::json(&serde_json::json!({
            "timeZone": zone,
            "fireTimesMs": times,
        })),
        Output::Table => {
            for t in times {
                say!(
                    "{}  ({})",
                    show::time_in(*t, zone),
                    show::time_in(*t, "UTC")
                );
            }
            Ok(())
        }
    }
}
