//! `sundial run …`: a job's runs (newest first), one run, cancelling one, and its log,
//! followed live with `--follow` until the run is final.

use clap::{Subcommand, ValueEnum};
use futures::StreamExt as _;
use sundial_proto::v1 as pb;

use super::connect::{Server, ask};
use super::{ClientArgs, Exit, Failure, Output, Result, show};

#[derive(Debug, Subcommand)]
pub enum RunCommand {
    /// A job's runs, newest first.
    List {
        job_id: String,
        /// Only runs in this state.
        #[arg(long, value_enum)]
        state: Option<RunState>,
        /// At most this many runs (0: all).
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// One run: state, attempt, node, times, result, webhook delivery.
    Get { schedule_id: String },
    /// Cancel a run: a waiting one ends at once, a running one is told to stop.
    Cancel {
        schedule_id: String,
        /// Why, kept on the run.
        #[arg(long, default_value = "cancelled by an operator")]
        reason: String,
    },
    /// A run's log lines, oldest first; --follow keeps printing until the run is final.
    Logs {
        schedule_id: String,
        /// Keep printing new lines as the run writes them, until it ends.
        #[arg(short, long)]
        follow: bool,
    },
}

/// `--state` of `run list`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RunState {
    Triggered,
    Waiting,
    Dispatched,
    Running,
    Succeeded,
    Failed,
    TimedOut,
    Cancelled,
    Skipped,
}

impl RunState {
    fn to_pb(self) -> pb::RunState {
        match self {
            Self::Triggered => pb::RunState::Triggered,
            Self::Waiting => pb::RunState::Waiting,
            Self::Dispatched => pb::RunState::Dispatched,
            Self::Running => pb::RunState::Running,
            Self::Succeeded => pb::RunState::Succeeded,
            Self::Failed => pb::RunState::Failed,
            Self::TimedOut => pb::RunState::TimedOut,
            Self::Cancelled => pb::RunState::Cancelled,
            Self::Skipped => pb::RunState::Skipped,
        }
    }
}

pub async fn run(client: &ClientArgs, command: RunCommand) -> Result<Exit> {
    let server = Server::connect(client).await?;
    let out = client.output;
    match command {
        RunCommand::List {
            job_id,
            state,
            limit,
        } => list(&server, out, job_id, state, limit).await,
        RunCommand::Get { schedule_id } => {
            let req = pb::GetRunRequest {
                schedule_id: schedule_id.clone(),
            };
            let what = format_args!("get run {schedule_id:?}");
            let run = ask(what, server.runs().get_run(req)).await?.run;
            print_run(&server, out, run.unwrap_or_default()).await
        }
        RunCommand::Cancel {
            schedule_id,
            reason,
        } => {
            let req = pb::CancelRunRequest {
                schedule_id: schedule_id.clone(),
                reason,
            };
            let what = format_args!("cancel run {schedule_id:?}");
            let run = ask(what, server.runs().cancel_run(req)).await?.run;
            print_run(&server, out, run.unwrap_or_default()).await
        }
        RunCommand::Logs {
            schedule_id,
            follow,
        } => logs(&server, out, schedule_id, follow).await,
    }
}

/// The zone of a job, to show its runs' times in; UTC when the job is gone.
async fn zone_of(server: &Server, job_id: &str) -> Result<String> {
    let req = pb::GetJobRequest {
        job_id: job_id.to_owned(),
    };
    match server.jobs().get_job(req).await {
        Ok(answer) => Ok(answer
            .into_inner()
            .job
            .and_then(|j| j.spec)
            .map_or_else(|| "UTC".to_owned(), |s| s.time_zone)),
        Err(s) if s.code() == tonic::Code::NotFound => Ok("UTC".to_owned()),
        Err(s) => Err(Failure::rpc(format!("get job {job_id:?}"), &s)),
    }
}

async fn list(
    server: &Server,
    out: Output,
    job_id: String,
    state: Option<RunState>,
    limit: usize,
) -> Result<Exit> {
    let mut runs = Vec::new();
    let mut page_token = String::new();
    loop {
        let req = pb::ListRunsRequest {
            job_id: job_id.clone(),
            state: state.map_or(pb::RunState::Unspecified, RunState::to_pb) as i32,
            page_size: if limit == 0 {
                1000
            } else {
                limit.min(1000) as i32
            },
            page_token,
            ..Default::default()
        };
        let what = format_args!("list runs of job {job_id:?}");
        let page = ask(what, server.runs().list_runs(req)).await?;
        runs.extend(page.runs);
        if limit > 0 && runs.len() >= limit {
            runs.truncate(limit);
            break;
        }
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    if out == Output::Json {
        show::json(&runs)?;
        return Ok(Exit::Ok);
    }
    let zone = zone_of(server, &job_id).await?;
    show::table(
        &[
            "SCHEDULE ID",
            "STATE",
            "ATTEMPT",
            "NODE",
            "SCHEDULED",
            "DURATION",
            "CALLBACK",
        ],
        runs.iter().map(|r| {
            vec![
                r.schedule_id.clone(),
                show::short(r.state().as_str_name(), "RUN_STATE_"),
                r.attempt.to_string(),
                or_dash(&r.node_id),
                show::time_in(r.scheduled_at_ms, &zone),
                show::duration(r.started_at_ms, r.finished_at_ms),
                callback(r),
            ]
        }),
    );
    Ok(Exit::Ok)
}

fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".to_owned()
    } else {
        s.to_owned()
    }
}

fn callback(r: &pb::Run) -> String {
    match r.callback_state() {
        pb::CallbackState::Unspecified => "-".to_owned(),
        state => show::short(state.as_str_name(), "CALLBACK_STATE_"),
    }
}

async fn print_run(server: &Server, out: Output, run: pb::Run) -> Result<Exit> {
    if out == Output::Json {
        show::json(&run)?;
        return Ok(Exit::Ok);
    }
    let zone = zone_of(server, &run.job_id).await?;
    let error = if run.error_code.is_empty() && run.error_message.is_empty() {
        String::new()
    } else {
        format!("{} {}", run.error_code, run.error_message)
    };
    let webhook = match run.callback_state() {
        pb::CallbackState::Unspecified => String::new(),
        _ => format!(
            "{} after {} attempts (last status {}{})",
            callback(&run),
            run.callback_attempts,
            run.callback_status,
            if run.callback_error.is_empty() {
                String::new()
            } else {
                format!(", {}", run.callback_error)
            }
        ),
    };
    show::fields(&[
        ("schedule id", run.schedule_id.clone()),
        ("job", run.job_id.clone()),
        (
            "state",
            show::short(run.state().as_str_name(), "RUN_STATE_"),
        ),
        ("reason", run.reason.clone()),
        (
            "trigger",
            show::short(run.trigger_kind().as_str_name(), "TRIGGER_KIND_"),
        ),
        ("attempt", run.attempt.to_string()),
        ("node", run.node_id.clone()),
        ("scheduled", show::time_in(run.scheduled_at_ms, &zone)),
        ("triggered", show::time_in(run.triggered_at_ms, &zone)),
        ("started", show::time_in(run.started_at_ms, &zone)),
        ("finished", show::time_in(run.finished_at_ms, &zone)),
        (
            "duration",
            show::duration(run.started_at_ms, run.finished_at_ms),
        ),
        ("error", error),
        ("output", String::from_utf8_lossy(&run.output).into_owned()),
        ("webhook", webhook),
    ]);
    if !run.history.is_empty() {
        say!("history:");
        show::table(
            &["AT", "STEP", "ATTEMPT", "NODE", "WHY"],
            run.history.iter().map(|e| {
                vec![
                    show::precise_time_in(e.at_ms, &zone),
                    e.what.clone(),
                    e.attempt.to_string(),
                    e.node_id.clone(),
                    e.detail.clone(),
                ]
            }),
        );
    }
    Ok(Exit::Ok)
}

async fn logs(server: &Server, out: Output, schedule_id: String, follow: bool) -> Result<Exit> {
    let job_id = schedule_id
        .split_once('@')
        .map_or(schedule_id.as_str(), |(job, _)| job)
        .to_owned();
    let zone = match out {
        Output::Table => zone_of(server, &job_id).await?,
        Output::Json => String::new(),
    };
    let req = pb::GetRunLogsRequest {
        schedule_id: schedule_id.clone(),
        follow,
    };
    let what = format!("logs of run {schedule_id:?}");
    let mut lines = ask(&what, server.runs().get_run_logs(req)).await?;
    while let Some(line) = lines.next().await {
        let line = line.map_err(|s| Failure::rpc(&what, &s))?;
        match out {
            // One JSON object per line, as it comes (newline-delimited JSON).
            Output::Json => say!(
                "{}",
                serde_json::to_string(&line).map_err(|e| Failure::usage(e.to_string()))?
            ),
            Output::Table => say!(
                "{}  {:<5}  {}",
                show::precise_time_in(line.time_ms, &zone),
                line.level,
                line.message
            ),
        }
    }
    Ok(Exit::Ok)
}
